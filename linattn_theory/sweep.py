"""Sweeps: a grid of runs, executed in parallel, resumable, keyed by the hash of each run's config.

A sweep file is a run configuration (the ``seed``, ``[task]``, ``[model]`` and ``[federated]``
sections of ``linattn simulate``) plus

- ``[grid]``: dotted keys mapped to lists of values, e.g. ``"federated.warmup_rounds" = [0, 5]``,
  ``"task.zeta_value" = [0.25, 1.0]``, ``seed = [0, 1, 2]``; the runs are the Cartesian product
  (first key slowest, last key fastest). Several ``[[grid]]`` tables give the union of their
  products (e.g. one-at-a-time variations around the base config);
- ``[quick]`` (optional): overrides applied with ``quick=True`` (``--quick``): a key of a grid
  gets a new list, any other dotted key a new base value;
- ``[figure]`` (optional): free-form settings read by the figure script that uses the sweep.

Every expanded configuration is validated before any run starts. Run ``i`` is stored in
``DIR/runs/<config_hash>/`` by :func:`linattn_theory.io.write_run` (each file atomic,
``metadata.json`` last), so a finished run is one whose ``metadata.json`` exists: rerunning a
sweep skips those, and a sweep killed at any instant and restarted completes with nothing lost.
Workers only compute; the calling process writes every file, so the executor (in-process, local
processes through joblib, or Dask) and the number of workers cannot change the results.
FedFrozen runs that differ only in the warm-up length ``T0`` form one task and share their
warm-up trajectory (:func:`~linattn_theory.warmup_sweep.warmup_sweep` with explicit frozen stages:
the same numbers as separate simulations, bit for bit, at about the cost of the longest run).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import ConfigError, RunConfig, config_from_dict, config_hash, read_toml
from .io import write_json, write_run

__all__ = ["Sweep", "SweepSummary", "load_sweep", "sweep_from_dict", "run_sweep", "run_dir",
           "is_complete", "EXECUTORS"]

EXECUTORS = ("serial", "processes", "dask")
MANIFEST = "sweep.json"
_SECTIONS = ("grid", "quick", "figure")


@dataclass(frozen=True)
class Sweep:
    """An expanded grid: the validated runs in grid order (duplicates removed), their grid points."""

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
        seen = set(self.run_ids)
        new_configs, new_points = list(self.configs), list(self.points)
        for config, point in zip(configs, points):
            if config_hash(config) not in seen:
                seen.add(config_hash(config))
                new_configs.append(config)
                new_points.append(dict(point))
        return Sweep(tuple(new_configs), tuple(new_points), self.grid, self.base, self.figure, self.source)


@dataclass(frozen=True)
class SweepSummary:
    """What :func:`run_sweep` did: runs in the sweep, already finished before, computed now, diverged."""

    total: int
    skipped: int
    computed: int
    diverged: int
    seconds: float
    out: Path


def _set_dotted(data: dict, key: str, value, where: str) -> None:
    """``data[a][b] = value`` for ``key = "a.b"``, creating tables as needed."""
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{where}: {key!r} is not a dotted key such as 'federated.local_steps'")
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}.{key}: {part!r} is a value, not a table")
    node[leaf] = value


def _table(data: dict, name: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table, got {value!r}")
    return value


def _flatten(data: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}} -> {"a.b": 1}`` (TOML's dotted keys inside ``[grid]`` arrive nested)."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
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
        grid = _flatten(table)
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{where}.{key} = {values!r}: expected a non-empty list of values")
        grids.append(grid)
    return grids


def _apply_quick(data: dict, base: dict, grids: list[dict]) -> None:
    """``[quick]``: a key of a grid gets a new list (in every grid that has it), any other key a new base value."""
    for key, value in _flatten(_table(data, "quick")).items():
        holders = [g for g in grids if key in g]
        if not holders:
            _set_dotted(base, key, value, "quick")
            continue
        if not isinstance(value, list) or not value:
            raise ConfigError(f"quick.{key} = {value!r}: {key} is a grid key; expected a non-empty list of values")
        for grid in holders:
            grid[key] = value


def sweep_from_dict(data: dict, *, quick: bool = False, source: str | None = None) -> Sweep:
    """Validate a sweep (as read from TOML) and expand its grid; raises :class:`ConfigError`.

    ``grid`` is a table (one Cartesian product) or an array of tables (the union of their
    products, e.g. one-at-a-time variations around the base config). Runs with the same full
    configuration are kept once, in order of first appearance.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"sweep: expected a table, got {type(data).__name__}")
    base = {k: copy.deepcopy(v) for k, v in data.items() if k not in _SECTIONS}
    grids = _grids(data)
    figure = _table(data, "figure")
    if quick:
        _apply_quick(data, base, grids)
    configs, points, seen = [], [], set()
    for grid in grids:
        for combo in itertools.product(*grid.values()):
            point = dict(zip(grid, combo))
            data_i = copy.deepcopy(base)
            for key, value in point.items():
                _set_dotted(data_i, key, value, "grid")
            try:
                config = config_from_dict(data_i)
            except ConfigError as err:
                where = ", ".join(f"{k}={v!r}" for k, v in point.items())
                raise ConfigError(f"{err} (in the run {where})" if point else str(err)) from None
            key = config_hash(config)
            if key not in seen:
                seen.add(key)
                configs.append(config)
                points.append(point)
    grid_out = grids[0] if len(grids) == 1 else grids
    return Sweep(tuple(configs), tuple(points), grid_out, base, figure, source)


def load_sweep(path, *, quick: bool = False) -> Sweep:
    """Read and validate a sweep TOML file (see the module docstring)."""
    return sweep_from_dict(read_toml(path, "sweep file"), quick=quick, source=str(path))


def run_dir(out, config_or_id) -> Path:
    """``DIR/runs/<config_hash>``: where a run of the sweep stored in ``out`` lives."""
    key = config_or_id if isinstance(config_or_id, str) else config_hash(config_or_id)
    return Path(out) / "runs" / key


def is_complete(out, config_or_id) -> bool:
    """A run is finished when its ``metadata.json`` (written last, atomically) exists."""
    return (run_dir(out, config_or_id) / "metadata.json").is_file()


def _prefix_key(config: RunConfig) -> str | None:
    """Runs with the same key differ only in ``T0`` and share their warm-up (FedFrozen only)."""
    if config.federated.strategy != "fedfrozen":
        return None
    data = config.to_dict()
    data["federated"]["warmup_rounds"] = None
    return json.dumps(data, sort_keys=True)


def _tasks(pending: list[tuple[str, RunConfig]]) -> list[list[tuple[str, dict]]]:
    """Group the pending runs into tasks: FedFrozen runs that differ only in ``T0`` form one task."""
    groups: dict[str, list] = {}
    for run_id, config in pending:
        groups.setdefault(_prefix_key(config) or run_id, []).append((run_id, config.to_dict()))
    return list(groups.values())


def _compute(task: list[tuple[str, dict]]) -> list:
    """Worker side: simulate one task (nothing is written here); returns ``[(run_id, RunResult)]``.

    A task of several FedFrozen runs shares one warm-up trajectory
    (:func:`~linattn_theory.warmup_sweep.warmup_sweep` with explicit frozen stages, which gives
    the same numbers as :func:`~linattn_theory.federated.simulate` bit for bit).
    """
    import numpy as np

    from .federated import simulate
    configs = [config_from_dict(data) for _, data in task]
    with np.errstate(over="ignore", invalid="ignore"):      # divergence is detected and recorded
        if len(task) == 1:
            return [(task[0][0], simulate(configs[0]))]
        from .warmup_sweep import warmup_sweep
        results = warmup_sweep(configs[0], [c.federated.warmup_rounds for c in configs],
                               frozen_stage="explicit")
    return [(run_id, results[c.federated.warmup_rounds]) for (run_id, _), c in zip(task, configs)]


def _store(run_id: str, result, out: Path) -> bool:
    """Caller side: write one finished run; returns whether it diverged."""
    target = run_dir(out, run_id)
    for stale in target.glob(".*.tmp"):     # left by a writer killed mid-file
        stale.unlink(missing_ok=True)
    result.metadata["run_id"] = run_id
    write_run(result, target)
    return result.diverged


def _check_executor(executor: str, workers: int | None, scheduler: str | None) -> None:
    if executor not in EXECUTORS:
        raise ConfigError(f"executor = {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers = {workers!r}: expected a positive integer")
    if scheduler is not None and executor != "dask":
        raise ConfigError(f"scheduler = {scheduler!r} applies only to executor 'dask'")
    if executor == "dask":
        _dask()


def _dask():
    try:
        from dask import distributed
    except ImportError:
        raise ConfigError("executor 'dask' needs dask.distributed, an optional extra: "
                          "pip install 'linattn-theory[dask]'") from None
    return distributed


def _results(executor: str, tasks: list, workers: int | None, scheduler: str | None):
    """Yield ``[(run_id, RunResult)]`` for each task as it finishes (any order)."""
    if executor == "serial" or not tasks:
        yield from map(_compute, tasks)
        return
    workers = workers or os.cpu_count() or 1
    if executor == "processes":
        from joblib import Parallel, delayed
        parallel = Parallel(n_jobs=workers, return_as="generator_unordered")
        yield from parallel(delayed(_compute)(task) for task in tasks)
        return
    distributed = _dask()
    cluster = None
    if scheduler is None:
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(cluster if cluster is not None else scheduler)
    try:
        futures = [client.submit(_compute, task, pure=False) for task in tasks]
        for future in distributed.as_completed(futures):
            yield future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_sweep(sweep: Sweep, out, *, executor: str = "serial", workers: int | None = None,
              scheduler: str | None = None, progress: bool = False) -> SweepSummary:
    """Run every unfinished run of ``sweep`` and store it under ``out`` (see the module docstring).

    ``executor``: ``"serial"`` (in-process), ``"processes"`` (joblib, ``workers`` processes,
    default one per core) or ``"dask"`` (``scheduler`` address, or a local cluster of ``workers``
    processes bound to 127.0.0.1). Writes ``out/sweep.json`` (the grid and its run ids) first.
    """
    from tqdm.auto import tqdm

    _check_executor(executor, workers, scheduler)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out = {str(out)!r} exists and is not a folder")
    start = time.perf_counter()
    ids = sweep.run_ids
    write_json(out / MANIFEST, {"source": sweep.source, "grid": sweep.grid, "base": sweep.base,
                                "figure": sweep.figure, "runs": ids,
                                "points": [dict(p) for p in sweep.points]})
    pending = [(run_id, c) for run_id, c in zip(ids, sweep.configs) if not is_complete(out, run_id)]
    skipped = len(ids) - len(pending)
    diverged = 0
    with tqdm(total=len(ids), initial=skipped, disable=not progress, desc="runs", unit="run") as bar:
        for finished in _results(executor, _tasks(pending), workers, scheduler):
            for run_id, result in finished:
                diverged += _store(run_id, result, out)
                bar.update()
    return SweepSummary(len(ids), skipped, len(pending), diverged, time.perf_counter() - start, out)

