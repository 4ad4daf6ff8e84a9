"""Tuned baselines, declared before they are scored: each arm's step chosen on design seeds, then
scored on held-out seeds (docs/theory.md §6).

Every arm of a comparison (FedAvg, FedFrozen, SCAFFOLD, …: a name and its config updates) gets a
declared grid of steps, values of ``federated.step_scale`` (``η = c · 2 / max_c λ_max(Ã_c)`` at
``θ⁰``, :mod:`linattn_theory.sim.step_size`; or of another key, ``step_key``), or a grid of
settings, the product of declared values of several keys (the step and the arm's own
hyper-parameters, e.g. FedProx's ``μ``: :func:`grid_settings`; "step" below is then a setting). In
every cell (a set of config updates, e.g. a heterogeneity level) and for every arm:

1. **design**: every step of the arm's grid runs on the design seeds; the final excess risk of a run
   is ``R = F_λ(θ_T) − Φ*_λ`` of its instance (``∞`` when it diverged), and the arm's step is, among
   the steps that diverged on the fewest design seeds (a tuned step does not diverge where another
   would not), the one of least median, over the design seeds, of the paired ratio
   ``R(c) / min_c' R(c')`` (instances differ several-fold, so each is compared with itself, as in
   §6); ties go to the earlier step of the grid;
2. **held out**: the chosen step runs on the held-out seeds, which played no part in the choice.

Every row also carries the run's best iterate on its own path (``oracle_best_iterate``: the least
``F_λ(θ^t) − Φ*_λ`` over its rounds, an oracle: early stopping chosen after seeing the path).

With ``sensitivity`` the held-out runs are also run from ``θ⁰ ⊙ (1 + 10⁻¹² ξ)`` and flagged
``chaotic`` when their end moves by more than :data:`~linattn_theory.sim.sensitivity.CHAOS_AMPLIFICATION`
times that (:func:`~linattn_theory.sim.sensitivity.run_sensitivity`, docs/theory.md §6).

``Φ*_λ`` of an instance is :func:`~linattn_theory.theory.profile.centralized_optimum` started from the
teacher, random kernels and every final kernel the instance's runs reached (``optimum`` replaces it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..core.model import kernel
from ..sim.config import RunConfig
from ..sim.engine import clients_from_config
from ..sim.ensemble import simulate_many
from ..sim.sweep.executors import in_processes

__all__ = ["TunedComparison", "tune_and_hold_out", "choose_steps", "grid_settings", "setting_label"]

#: the per-instance columns of both tables (``chaotic`` too in ``heldout`` with ``sensitivity``)
COLUMNS = ["seed", "cell", "arm", "step", "setting", "learning_rate", "excess_risk", "diverged", "oracle_best_iterate"]


def grid_settings(grid, step_key: str = "federated.step_scale") -> list[dict]:
    """A declared grid as a list of config updates: a sequence of numbers is ``[{step_key: v}, …]``; a
    mapping ``{key: [values]}`` is the product of its lists, the first key outermost (every
    setting must set ``step_key``).

    Parameters
    ----------
    grid : sequence of float or mapping of str to sequence
        The steps, or the lists of values per dotted key.
    step_key : str, default "federated.step_scale"
        The key of the step, which every setting sets.

    Returns
    -------
    list of dict
        One config update per setting.

    Examples
    --------
    >>> from linattn_theory.report.tuning import grid_settings
    >>> grid_settings([0.1, 0.2])
    [{'federated.step_scale': 0.1}, {'federated.step_scale': 0.2}]
    >>> grid = {"federated.step_scale": [0.1, 0.2], "federated.prox_mu": [1.0]}
    >>> [tuple(setting.values()) for setting in grid_settings(grid)]       # the first key outermost
    [(0.1, 1.0), (0.2, 1.0)]
    """
    if isinstance(grid, Mapping):
        if step_key not in grid:
            raise ValueError(f"grid {dict(grid)!r}: declares no {step_key!r}; a grid of settings sets the step too")
        keys = list(grid)
        return [dict(zip(keys, values)) for values in itertools.product(*(list(grid[k]) for k in keys))]
    return [{step_key: v} for v in grid]


def setting_label(updates: Mapping) -> str:
    """``"step_scale=0.15, prox_mu=1"``: a setting's keys (their last part) and values, in order.

    Parameters
    ----------
    updates : mapping of str to float
        A setting (:func:`grid_settings`).

    Returns
    -------
    str
        Its label.

    Examples
    --------
    >>> from linattn_theory.report.tuning import setting_label
    >>> setting_label({"federated.step_scale": 0.15, "federated.prox_mu": 1.0})
    'step_scale=0.15, prox_mu=1'
    """
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={value:g}" for key, value in updates.items())


class TunedComparison(NamedTuple):
    """``heldout``: one row per (held-out seed, cell, arm) at the arm's chosen step; ``design``: one
    row per (design seed, cell, arm, step); ``choices``: the chosen ``step`` per (cell, arm) with the
    ``median_ratio`` that chose it and its ``diverged`` design seeds. Columns of the runs: :data:`COLUMNS` (``learning_rate``: the
    resolved ``η``; ``excess_risk``: ``NaN`` when the run diverged; ``oracle_best_iterate``: the least
    ``F_λ(θ^t) − Φ*_λ`` over the run's own rounds, early stopping chosen after the fact, an oracle).

    Parameters
    ----------
    heldout : pandas.DataFrame
        The held-out runs at the chosen steps (:data:`COLUMNS`).
    design : pandas.DataFrame
        The design runs, every step of every grid (:data:`COLUMNS`).
    choices : pandas.DataFrame
        ``cell``, ``arm``, the chosen ``step``, its ``median_ratio`` and ``diverged`` count.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.tuning import TunedComparison
    >>> choices = pd.DataFrame({"cell": ["c0"], "arm": ["fedavg"], "step": [0.05], "median_ratio": [1.0],
    ...                         "diverged": [0]})
    >>> comparison = TunedComparison(heldout=pd.DataFrame(), design=pd.DataFrame(), choices=choices)
    >>> comparison._fields, float(comparison.choices["step"].iloc[0])
    (('heldout', 'design', 'choices'), 0.05)

    :func:`tune_and_hold_out` makes it.
    """

    heldout: pd.DataFrame
    design: pd.DataFrame
    choices: pd.DataFrame


def _optimum(config: RunConfig, clients, kernels) -> float:
    from ..theory.profile import centralized_optimum
    return centralized_optimum(clients, config.federated.ridge, rank=config.model.rank, heads=config.model.heads,
                               seed=config.seed, initial_kernels=kernels).objective


def _chaotic(configs: list[RunConfig], results) -> list[bool]:
    """Per run: is it chaotic (:func:`~linattn_theory.sim.sensitivity.run_sensitivity` against one run
    from ``θ⁰ ⊙ (1 + 10⁻¹² ξ)``)?"""
    from ..sim.sensitivity import ensemble_sensitivities
    clients = [clients_from_config(c) for c in configs]
    return [bool(found.chaotic) for found in ensemble_sensitivities(configs, clients, results)]


def _run(points: list[tuple], configs: list[RunConfig], optimum: Callable, sensitivity: bool = False,
         workers: int = 1) -> pd.DataFrame:
    """Rows :data:`COLUMNS` of the runs ``configs`` at ``points`` ``(seed, cell, arm, step, setting)``;
    one ``Φ*_λ`` per instance (cell, seed), from every final kernel its runs reached; with
    ``sensitivity`` a column ``chaotic``. The instances are shared among ``workers`` processes
    (:func:`~linattn_theory.sim.sweep.executors.in_processes`: the same rows for any count)."""
    instances: dict = {}
    for i, (seed, cell, *_) in enumerate(points):
        instances.setdefault((cell, seed), []).append(i)
    items = [([points[i] for i in indices], [configs[i] for i in indices], optimum, sensitivity)
             for indices in instances.values()]
    rows, chaotic = [None] * len(points), [None] * len(points)
    for indices, part in zip(instances.values(), in_processes(_instance_rows, items, workers)):
        for i, (row, flag) in zip(indices, part):
            rows[i], chaotic[i] = row, flag
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table.assign(chaotic=chaotic) if sensitivity else table


def _instance_rows(chunk: list) -> list[list[tuple]]:
    """Worker of :func:`_run`: per instance ``(points, configs, optimum, sensitivity)`` of ``chunk``, its
    runs' ``(row, chaotic)`` (the runs of the whole chunk as one :func:`simulate_many`)."""
    configs = [config for _, group, _, _ in chunk for config in group]
    results = simulate_many(configs)
    flags = _chaotic(configs, results) if chunk[0][3] else [None] * len(configs)
    out, start = [], 0
    for points, group, optimum, _ in chunk:
        runs, found = results[start:start + len(group)], flags[start:start + len(group)]
        start += len(group)
        kernels = [np.asarray(kernel(result.params)) for result in runs if not result.diverged]
        phi_star = optimum(group[0], clients_from_config(group[0]), kernels)
        part = []
        for point, result, flag in zip(points, runs, found):
            F = result.table["loss_regularized"].to_numpy()
            part.append(((*point, float(result.metadata["config"]["federated"]["learning_rate"]),
                          np.nan if result.diverged else float(F[-1]) - phi_star, bool(result.diverged),
                          float(np.nanmin(F)) - phi_star), flag))
        out.append(part)
    return out


def choose_steps(design: pd.DataFrame, grids: Mapping, step_key: str = "federated.step_scale") -> pd.DataFrame:
    """Per (cell, arm) of ``design``: among the steps of ``grids[arm]`` that diverged on the fewest design
    seeds, the one of least median paired ratio ``R(c) / min_c' R(c')`` over them (diverged: ``R = ∞``;
    ties: the earlier step of the grid); with its ``median_ratio`` and ``diverged`` count. Where
    ``design`` has a column ``setting`` the grids are :func:`grid_settings`' and the choice is among
    settings (``setting``: its :func:`setting_label`, ``step``: its value of ``step_key``).

    Parameters
    ----------
    design : pandas.DataFrame
        The design runs: ``seed``, ``cell``, ``arm``, ``step``, ``excess_risk``, ``diverged``.
    grids : mapping of str to sequence
        Each arm's declared steps, or settings (:func:`grid_settings`), in order.
    step_key : str, default "federated.step_scale"
        The setting a step sets (the ``step`` of a setting is its value of this key).

    Returns
    -------
    pandas.DataFrame
        One row per (cell, arm): ``cell``, ``arm``, ``step``, ``median_ratio``, ``diverged``
        (and ``setting`` where the grids are settings).

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.tuning import choose_steps
    >>> design = pd.DataFrame({"seed": [0, 0, 1, 1], "cell": "", "arm": "fedavg", "step": [0.1, 0.5, 0.1, 0.5],
    ...                        "excess_risk": [2.0, 1.0, 3.0, 1.5], "diverged": False})
    >>> choose_steps(design, {"fedavg": [0.1, 0.5]})[["step", "median_ratio", "diverged"]].to_dict("records")
    [{'step': 0.5, 'median_ratio': 1.0, 'diverged': 0}]
    >>> design.loc[3, "diverged"] = True                  # the larger step diverged on seed 1
    >>> choose_steps(design, {"fedavg": [0.1, 0.5]})[["step", "median_ratio", "diverged"]].to_dict("records")
    [{'step': 0.1, 'median_ratio': 1.5, 'diverged': 0}]
    """
    rows = []
    by_setting = "setting" in design.columns
    for (cell, arm), group in design.groupby(["cell", "arm"], sort=False):
        risk = group.assign(R=group["excess_risk"].where(~group["diverged"], np.inf))
        if by_setting:
            settings = grid_settings(grids[arm], step_key)
            steps = [setting_label(u) for u in settings]
            step_of = {label: u[step_key] for label, u in zip(steps, settings)}
        else:
            steps = list(grids[arm])
        R = risk.pivot(index="seed", columns="setting" if by_setting else "step", values="R")[steps].to_numpy()
        best = R.min(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios = np.where(np.isinf(best), np.inf, R / np.where(best > 0, best, np.nan))
        medians = np.nanmedian(ratios, axis=0)       # a seed whose best R is not > 0 has no ratios
        diverged = np.isinf(R).sum(axis=0)
        k = min(range(len(steps)), key=lambda j: (diverged[j], medians[j], j))
        row = {"cell": cell, "arm": arm, "step": step_of[steps[k]] if by_setting else steps[k],
               "median_ratio": float(medians[k]), "diverged": int(diverged[k])}
        rows.append({**row, "setting": steps[k]} if by_setting else row)
    return pd.DataFrame(rows, columns=["cell", "arm", "step", "median_ratio", "diverged"]
                        + (["setting"] if by_setting else []))


def tune_and_hold_out(base: RunConfig, arms: Mapping[str, dict], grids: Mapping,
                      design_seeds: Sequence[int], heldout_seeds: Sequence[int], *,
                      cells: Mapping[str, dict] | None = None, step_key: str = "federated.step_scale",
                      optimum: Callable | None = None, sensitivity: bool = False,
                      workers: int = 1) -> TunedComparison:
    """Choose each arm's step on ``design_seeds`` and score it on ``heldout_seeds`` (module docstring).

    ``arms`` maps a name to its config updates (``{"federated.strategy": "fedavg"}``), ``grids`` a name
    to its declared steps (values of ``step_key``) or settings (a mapping of keys to values, their
    product: :func:`grid_settings`), ``cells`` a cell name to its updates (default: one cell ``""``).
    ``optimum(config, clients, kernels) -> Φ*_λ`` replaces the centralised optimum; ``sensitivity``
    flags the chaotic held-out runs (module docstring).

    Parameters
    ----------
    base : RunConfig
        The configuration every run starts from.
    arms : mapping of str to dict
        Each arm's config updates.
    grids : mapping of str to sequence
        Each arm's declared steps (values of ``step_key``) or settings (mappings of keys to values,
        their product: :func:`grid_settings`).
    design_seeds : sequence of int
        The seeds the steps are chosen on.
    heldout_seeds : sequence of int
        The seeds the chosen steps are scored on (disjoint from ``design_seeds``).
    cells : mapping of str to dict, optional
        Each cell's config updates; default one cell ``""`` of none.
    step_key : str, default "federated.step_scale"
        The setting the grids' values set.
    optimum : callable, optional
        ``optimum(config, clients, kernels) -> Φ*_λ``; default the centralised optimum.
    sensitivity : bool, default False
        Flag the chaotic held-out runs (:func:`~linattn_theory.sim.sensitivity.run_sensitivity`).
    workers : int, default 1
        Processes sharing the instances (``optimum`` is then pickled: a module-level function);
        the same tables for any count.

    Returns
    -------
    TunedComparison
        The held-out and design runs and the choices.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.tuning import tune_and_hold_out
    >>> base = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> out = tune_and_hold_out(base, {"fedavg": {"federated.strategy": "fedavg"}}, {"fedavg": [0.02, 0.05]},
    ...                         design_seeds=[0], heldout_seeds=[1])
    >>> len(out.design), out.heldout[["seed", "step", "diverged"]].values.tolist()
    (2, [[1, 0.05, False]])
    """
    cells = {"": {}} if cells is None else dict(cells)
    missing = sorted(set(arms) - set(grids))
    if missing:
        raise ValueError(f"grids: no steps declared for arm {missing[0]!r}; declare a grid for every arm")
    shared = sorted(set(design_seeds) & set(heldout_seeds))
    if shared:
        raise ValueError(f"seed {shared[0]} is both a design and a held-out seed; held-out seeds must "
                         f"play no part in the choice")
    if not design_seeds or not heldout_seeds:
        raise ValueError("expected at least one design seed and one held-out seed")
    optimum = _optimum if optimum is None else optimum

    settings = {arm: {setting_label(u): u for u in grid_settings(grids[arm], step_key)} for arm in arms}

    def config(cell, arm, label, seed):
        return base.with_updates({**cells[cell], **arms[arm], **settings[arm][label], "seed": seed})

    def point(seed, cell, arm, label):
        return (seed, cell, arm, settings[arm][label][step_key], label)

    points = [point(seed, cell, arm, label) for cell in cells for arm in arms for label in settings[arm]
              for seed in design_seeds]
    design = _run(points, [config(c, a, label, seed) for seed, c, a, _, label in points], optimum, workers=workers)
    choices = choose_steps(design, grids, step_key)
    chosen = {(r.cell, r.arm): r.setting for r in choices.itertuples()}
    points = [point(seed, cell, arm, chosen[cell, arm]) for cell in cells for arm in arms for seed in heldout_seeds]
    heldout = _run(points, [config(c, a, label, seed) for seed, c, a, _, label in points], optimum, sensitivity,
                   workers)
    return TunedComparison(heldout, design, choices)
