"""A sweep's grid: a sweep file expanded into its validated runs, in grid order.

A sweep file is a run configuration plus ``[grid]`` (dotted keys mapped to lists; the runs are
the Cartesian product, several ``[[grid]]`` tables the union of their products), an optional
``[quick]`` (overrides applied with ``quick=True``) and an optional ``[figure]`` (settings of the
figure script that uses it); see :mod:`linattn_theory.sim.sweep`.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field

from ...core.errors import ConfigError
from ..config import RunConfig, config_from_dict, config_hash, read_toml, set_dotted

__all__ = ["Sweep", "sweep_from_dict", "load_sweep", "with_backend", "grid_size", "flatten", "MAX_RUNS"]


#: largest grid expanded by default (``--max-runs``)
MAX_RUNS = 10_000
_SECTIONS = ("grid", "quick", "figure")


@dataclass(frozen=True)
class Sweep:
    """An expanded grid: the validated runs in grid order (duplicates removed), their grid points.

    Parameters
    ----------
    configs : tuple of RunConfig
        The runs, validated.
    points : tuple of dict
        Each run's grid point (``{dotted key: value}``).
    grid : dict or list of dict
        The grid(s) as written.
    base : dict
        The base configuration as written.
    figure : dict, optional
        The ``[figure]`` table.
    source : str, optional
        The file it was read from.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4}, "grid": {"federated.warmup_rounds": [0, 4]}})
    >>> len(sweep), [point["federated.warmup_rounds"] for point in sweep.points], len(sweep.run_ids[0])
    (2, [0, 4], 16)
"""

    configs: tuple[RunConfig, ...]
    points: tuple[dict, ...]
    grid: dict | list[dict]
    base: dict
    figure: dict = field(default_factory=dict)
    source: str | None = None

    @property
    def run_ids(self) -> list[str]:
        return [config_hash(c) for c in self.configs]

    def __len__(self) -> int:
        return len(self.configs)

    def with_runs(self, configs, points=None) -> "Sweep":
        """This sweep with more (validated) runs appended; runs already in it are kept once."""
        points = [{} for _ in configs] if points is None else list(points)
        runs = dict(zip(self.run_ids, zip(self.configs, self.points)))
        for config, point in zip(configs, points):
            runs.setdefault(config_hash(config), (config, dict(point)))
        return Sweep(*_unzip(runs), self.grid, self.base, self.figure, self.source)


def _table(data: dict, name: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table, got {value!r}")
    return value


def flatten(data: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}} -> {"a.b": 1}`` (TOML's dotted keys inside ``[grid]`` arrive nested).

    Parameters
    ----------
    data : dict
        Nested tables.
    prefix : str, default ""
        Prepended to every key (with a dot).

    Returns
    -------
    dict
        ``{dotted key: value}``.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.grid import flatten
    >>> flatten({"federated": {"rounds": 4, "warmup_rounds": 2}, "seed": 1})
    {'federated.rounds': 4, 'federated.warmup_rounds': 2, 'seed': 1}
    """
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _grids(data: dict) -> list[dict]:
    """The ``[grid]`` table, or each table of an array ``[[grid]]`` (their runs are united)."""
    raw = data.get("grid", {})
    tables = raw if isinstance(raw, list) else [raw]
    grids = []
    for i, table in enumerate(tables):
        where = f"grid[{i}]" if isinstance(raw, list) else "grid"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table of dotted keys -> lists, got {table!r}")
        grid = flatten(table)
        for key, values in grid.items():
            _check_values(f"{where}.{key}", values)
        grids.append(grid)
    return grids


def _check_values(where: str, values) -> None:
    """A grid's values of one key: a non-empty list, each value once."""
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where} = {values!r}: expected a non-empty list of values")
    for i, value in enumerate(values):
        if value in values[:i]:
            raise ConfigError(f"{where} = {values!r}: the value {value!r} is listed more than once; "
                              f"expected each value once")


def _apply_overrides(overrides: dict, base: dict, grids: list[dict], where: str) -> None:
    """``[quick]`` or ``--set``: a key of a grid gets a new list (in every grid that has it), any other
    key a new base value."""
    for key, value in overrides.items():
        holders = [g for g in grids if key in g]
        if not holders:
            set_dotted(base, key, value, where)
            continue
        label = f"{where}.{key}" if where == "quick" else f"{where} {key}"
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{label} = {value!r}: {key} is a grid key; expected a non-empty list of values")
        _check_values(label, value)
        for grid in holders:
            grid[key] = value


def grid_size(grids: list[dict]) -> int:
    """Runs of the grids before duplicates are removed: the sum of the products of list lengths.

    Parameters
    ----------
    grids : list of dict
        The grids, ``{dotted key: list of values}`` each.

    Returns
    -------
    int
        Their number of runs.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.grid import grid_size
    >>> grid_size([{"seed": [0, 1, 2], "federated.warmup_rounds": [0, 4]}, {"seed": [5]}])
    7
    """
    return sum(math.prod(len(values) for values in grid.values()) for grid in grids)


def sweep_from_dict(data: dict, *, quick: bool = False, source: str | None = None,
                    max_runs: int | None = MAX_RUNS, overrides: dict | None = None) -> Sweep:
    """Validate a sweep (as read from TOML) and expand its grid; raises :class:`ConfigError`.

    ``grid`` is a table (one Cartesian product) or an array of tables (the union of their
    products, e.g. one-at-a-time variations around the base config); a value listed twice for
    one key is refused. Runs with the same full configuration are kept once, in order of first
    appearance. ``quick=True`` applies the ``[quick]`` table (refused when there is none), then
    ``overrides`` (dotted keys, :func:`~linattn_theory.sim.config.parse_overrides`) apply by the
    same rule. A grid of more than ``max_runs`` runs is refused from the list lengths alone,
    before anything is expanded.

    Parameters
    ----------
    data : dict
        A sweep file's tables (a run configuration with ``grid``, optionally ``quick`` and ``figure``).
    quick, max_runs, overrides
        As in :func:`load_sweep`.
    source : str, optional
        Where ``data`` comes from, for the messages.

    Returns
    -------
    Sweep
        The validated sweep.

    Examples
    --------
    >>> from linattn_theory.sim.sweep import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2},
    ...                          "grid": [{"seed": [0, 1]}, {"seed": [1, 2]}]})
    >>> [config.seed for config in sweep.configs]                # the union, each run once
    [0, 1, 2]
"""
    if not isinstance(data, dict):
        raise ConfigError(f"sweep: expected a table, got {type(data).__name__}")
    base = {k: copy.deepcopy(v) for k, v in data.items() if k not in _SECTIONS}
    grids = _grids(data)
    figure = _table(data, "figure")
    if quick:
        if "quick" not in data:
            raise ConfigError(f"quick: {source or 'the sweep'} has no [quick] table, so --quick would run "
                              f"the full grid; add one (e.g. [quick] seed = [0]) or leave --quick out")
        _apply_overrides(flatten(_table(data, "quick")), base, grids, "quick")
    _apply_overrides(dict(overrides or {}), base, grids, "--set")
    size = grid_size(grids)
    if max_runs is not None and size > max_runs:
        raise ConfigError(f"grid: {size} runs, above the limit of {max_runs} runs; split the grid "
                          f"or raise the limit with --max-runs")
    runs = {}                          # by config hash: a run the grids name twice runs once
    for grid in grids:
        for combo in itertools.product(*grid.values()):
            point = dict(zip(grid, combo))
            data_i = copy.deepcopy(base)
            for key, value in point.items():
                set_dotted(data_i, key, value, "grid")
            try:
                config = config_from_dict(data_i)
            except ConfigError as err:
                where = ", ".join(f"{k}={v!r}" for k, v in point.items())
                raise ConfigError(f"{err} (in the run {where})" if point else str(err)) from None
            runs.setdefault(config_hash(config), (config, point))
    return Sweep(*_unzip(runs), grids[0] if len(grids) == 1 else grids, base, figure, source)


def _unzip(runs: dict) -> tuple[tuple, tuple]:
    """``(configs, points)`` of ``{run id: (config, point)}``, in its order."""
    return tuple(c for c, _ in runs.values()), tuple(p for _, p in runs.values())


def load_sweep(path, *, quick: bool = False, max_runs: int | None = MAX_RUNS,
               overrides: dict | None = None) -> Sweep:
    """Read and validate a sweep TOML file (see the module docstring and :func:`sweep_from_dict`).

    Parameters
    ----------
    path : str or path-like
        A sweep file: a run configuration plus ``[grid]`` (or ``[[grid]]``), optionally
        ``[quick]`` and ``[figure]`` (``simulations/configs/*.toml``).
    quick : bool, default False
        Apply the file's ``[quick]`` table (``--quick``; refused when it has none).
    max_runs : int or None, default MAX_RUNS
        Refuse a grid of more runs (``None``: no limit).
    overrides : dict, optional
        ``{"section.key": value}``, applied last (``--set``): a key of a grid gets a new list,
        any other key a new base value.

    Returns
    -------
    Sweep
        The validated sweep: its base configuration, grid and every run's :class:`RunConfig`.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "sweep.toml"
    >>> _ = path.write_text('[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\nseed = [0, 1]\\n')
    >>> sweep = lt.load_sweep(path)
    >>> [(c.federated.warmup_rounds, c.seed) for c in sweep.configs]
    [(0, 0), (0, 1), (2, 0), (2, 1), (4, 0), (4, 1)]
"""
    return sweep_from_dict(read_toml(path, "sweep file"), quick=quick, source=str(path),
                           max_runs=max_runs, overrides=overrides)


def with_backend(sweep: Sweep, backend: str) -> Sweep:
    """``sweep`` with ``model.backend = backend`` in its base config (``--backend``).

    Runs on another backend are other runs (their numbers differ by rounding), so they get
    other run ids; a grid that varies ``model.backend`` itself is refused.

    Parameters
    ----------
    sweep : Sweep
        The sweep.
    backend : {"numpy", "cupy"}
        The array library.

    Returns
    -------
    Sweep
        The sweep on ``backend`` (``sweep`` itself where nothing changes).

    Examples
    --------
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict, with_backend
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4}, "grid": {"federated.warmup_rounds": [0, 4]}})
    >>> [config.model.backend for config in with_backend(sweep, "numpy").configs]
    ['numpy', 'numpy']
    """
    grids = sweep.grid if isinstance(sweep.grid, list) else [sweep.grid]
    if any("model.backend" in grid for grid in grids):
        raise ConfigError(f"backend = {backend!r}: the sweep's grid varies model.backend already")
    data = copy.deepcopy(sweep.base)
    set_dotted(data, "model.backend", backend, "backend")
    data["grid"] = copy.deepcopy(sweep.grid)
    if sweep.figure:
        data["figure"] = copy.deepcopy(sweep.figure)
    return sweep_from_dict(data, source=sweep.source, max_runs=None)
