"""Theory quantities for every run of a sweep: the glue between stored runs and :mod:`.theory`.

Runs are grouped by problem instance (the clients: task and seed, with the student's shape and
the ridge λ), so that the clients are built and ``Φ*_λ`` is computed once per instance, and by
schedule (the instance plus ``η``, ``E``, ``T``, …) for the bound ``U(T0)``. All mathematics is
in :mod:`linattn_theory.theory` and :mod:`linattn_theory.bound`; nothing is recomputed here.
Results are memoised per process (``linattn figures`` draws figures 1–3 from one analysis), and
``Φ*_λ`` is also stored with the sweep (``<folder>/_optimum/<key>.json``, keyed by the instance
and the starting kernels), so that redrawing a figure does not solve for it again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from .config import RunConfig, config_from_dict
from .federated import clients_from_config
from .model import kernel
from .results import load_run
from .tasks import stack_clients

__all__ = ["runs_by_instance", "frozen_stage_table", "excess_risk_table"]

_MEMO: dict = {}


def _memo(kind: str, folder, results: pd.DataFrame, compute):
    key = (kind, str(Path(folder).resolve()), tuple(results["run_id"]))
    if key not in _MEMO:
        _MEMO[key] = compute()
    return _MEMO[key].copy()


def _instance_key(config: RunConfig) -> str:
    """The problem a run solves: its clients (task, seed), the student (shape, attention) and the ridge λ."""
    model = config.model
    return json.dumps([config.task.__dict__, config.seed, model.rank, model.heads,
                       config.federated.ridge, model.attention, model.temperature],
                      sort_keys=True, default=str)


def _cached_optimum(folder, config: RunConfig, clients, starts) -> float:
    """``Φ*_λ`` of ``config``'s instance from :func:`~linattn_theory.theory.centralized_optimum`,
    stored in ``<folder>/_optimum/`` under the instance and the exact starting kernels ``starts``.
    """
    from .io import write_json
    from .theory import centralized_optimum

    digest = hashlib.sha256(_instance_key(config).encode())
    for K in starts:
        digest.update(np.ascontiguousarray(K, dtype=np.float64).tobytes())
    path = Path(folder) / "_optimum" / f"{digest.hexdigest()[:24]}.json"
    if path.is_file():
        return float(json.loads(path.read_text())["objective"])
    optimum = centralized_optimum(clients, config.federated.ridge, rank=config.model.rank,
                                  heads=config.model.heads, seed=config.seed, initial_kernels=starts)
    write_json(path, {"instance": json.loads(_instance_key(config)), "objective": optimum.objective,
                      "best_start": optimum.best_start, "converged": optimum.converged})
    return float(optimum.objective)


def _schedule_key(config: RunConfig) -> str:
    """The instance and every federated setting except the warm-up length and the strategy."""
    fed = dict(config.federated.__dict__, warmup_rounds=None, strategy=None)
    return json.dumps([_instance_key(config), fed, config.model.__dict__], sort_keys=True, default=str)


def runs_by_instance(folder, results: pd.DataFrame):
    """Group a sweep's runs by problem instance: yields ``(clients, {run_id: (RunConfig, RunResult)})``.

    The clients are built once per instance (same task, seed, student shape and ridge λ); for
    softmax attention they come stacked with their contexts and temperature, so that every
    theory function uses the softmax features (docs/theory.md §9).
    """
    groups: dict[str, dict] = {}
    for rid in results["run_id"]:
        run = load_run(folder, rid)
        config = config_from_dict(run.metadata["config"])
        groups.setdefault(_instance_key(config), {})[rid] = (config, run)
    for runs in groups.values():
        config = next(iter(runs.values()))[0]
        clients = clients_from_config(config)
        if config.model.attention != "linear":
            clients = stack_clients(clients, attention=config.model.attention,
                                    temperature=config.model.temperature)
        yield clients, runs


def frozen_stage_table(folder, results: pd.DataFrame) -> pd.DataFrame:
    """Per run, the closed forms at its frozen kernel ``K_{T0}`` (docs/theory.md §4–6).

    Adds ``profile`` ``Φ_λ(K_{T0})``, ``drift_floor`` ``D(K_{T0})``, ``contraction_rate`` ``ρ(K_{T0})``,
    ``zeta`` (the client dissimilarity ``ζ(K_{T0})``, :func:`~linattn_theory.bound.gradient_dissimilarity`)
    and ``measured_drift_floor`` ``F_λ(θ_T) − Φ_λ(K_{T0})`` (equal to ``D`` once the frozen stage
    has converged). Diverged runs get NaN and must be dropped before plotting.
    """
    from .bound import gradient_dissimilarity
    from .theory import contraction_rate, profile_objective, value_drift_floor

    def compute():
        rows = []
        final = results.set_index("run_id")["final_loss_regularized"]
        for clients, runs in runs_by_instance(folder, results):
            for rid, (config, run) in runs.items():
                if run.diverged:
                    continue
                K, fed = kernel(run.warmup_params), config.federated
                profile = profile_objective(K, clients, fed.ridge)[0]
                schedule = (fed.learning_rate, fed.local_steps, fed.ridge)
                rows.append({"run_id": rid, "profile": profile,
                             "drift_floor": value_drift_floor(K, clients, *schedule),
                             "contraction_rate": contraction_rate(K, clients, *schedule),
                             "zeta": float(np.sqrt(gradient_dissimilarity(K, clients, fed.ridge))),
                             "measured_drift_floor": float(final[rid]) - profile})
        columns = ["run_id", "profile", "drift_floor", "contraction_rate", "zeta", "measured_drift_floor"]
        return results.merge(pd.DataFrame(rows, columns=columns), on="run_id", how="left")
    return _memo("frozen_stage", folder, results, compute)


def excess_risk_table(folder, results: pd.DataFrame, *, bound: bool = False) -> pd.DataFrame:
    """Per run, the exact decomposition of the excess risk and, with ``bound``, the bound ``U(T0)``.

    Columns added (docs/theory.md §6): ``optimum`` ``Φ*_λ`` (one
    :func:`~linattn_theory.theory.centralized_optimum` per instance, also started from the best
    kernel its runs reached), ``excess_risk`` ``R(T0) = F_λ(θ_T) − Φ*_λ``, ``bias``,
    ``drift_floor``, ``unfinished`` and ``identity_residual`` from
    :func:`~linattn_theory.theory.decompose_excess_risk`; with ``bound``, from one
    :func:`~linattn_theory.bound.estimate_bound` per schedule (against the same ``Φ*_λ``):
    ``T0_theory``, ``U`` and ``bias_bound`` at the run's ``T0``, and ``assumptions_violated``.
    Diverged runs get NaN.
    """
    table = _memo("excess_risk", folder, results, lambda: _decomposition(folder, results))
    if bound:
        table = table.merge(_memo("bound", folder, results, lambda: _bounds(folder, table)),
                            on="run_id", how="left")
    return table


def _decomposition(folder, results: pd.DataFrame) -> pd.DataFrame:
    from .theory import decompose_excess_risk, profile_objective

    rows = []
    for clients, runs in runs_by_instance(folder, results):
        config = next(iter(runs.values()))[0]
        lam = config.federated.ridge
        ok = [run for _, run in runs.values() if not run.diverged]
        kernels = [kernel(run.warmup_params) for run in ok] + [kernel(run.params) for run in ok]
        starts = [min(kernels, key=lambda K: profile_objective(K, clients, lam)[0])] if kernels else []
        optimum = _cached_optimum(folder, config, clients, starts)
        for rid, (_, run) in runs.items():
            row = {"run_id": rid, "optimum": optimum}
            if not run.diverged:
                parts = decompose_excess_risk(run, clients, optimum=optimum)
                row.update({k: parts[k] for k in ("excess_risk", "bias", "drift_floor", "unfinished",
                                                  "identity_residual")})
            rows.append(row)
    return results.merge(pd.DataFrame(rows), on="run_id", how="left")


def _bounds(folder, table: pd.DataFrame) -> pd.DataFrame:
    from .bound import estimate_bound

    optimum = table.set_index("run_id")["optimum"]
    rows = []
    for clients, runs in runs_by_instance(folder, table):
        bounds = {}
        for rid, (config, run) in runs.items():
            if run.diverged:
                continue
            key = _schedule_key(config)
            if key not in bounds:
                bounds[key] = estimate_bound(config, clients, optimum=float(optimum[rid]))
            b = bounds[key]
            curve = b.curve.set_index("round")
            T0 = run.metadata["warmup_rounds"]
            rows.append({"run_id": rid, "T0_theory": b.T0_theory, "U": float(curve.loc[T0, "U"]),
                         "bias_bound": float(curve.loc[T0, "bias_bound"]),
                         "assumptions_violated": len(b.violated)})
    return pd.DataFrame(rows, columns=["run_id", "T0_theory", "U", "bias_bound", "assumptions_violated"])
