"""Scoring warm-up recommenders by their regret on one instance (docs/theory.md §8).

The truth of an instance is ``R(T0) = F_λ(θ_T) − Φ*_λ`` for every ``T0 ∈ {0..T}``, from one
:func:`~linattn_theory.sim.warmup_grid.warmup_sweep` against one centralised optimum ``Φ*_λ``. A
recommender's regret is ``R(T0_rec)/R(T0_best) − 1`` with ``T0_best = argmin_{T0} R(T0)`` (the
smallest such ``T0`` on ties, :func:`best_warmup`); for the online rule, which may roll back,
``R`` is the realised final excess risk of its own run (the rounds it spent counted).
``benchmarks/predictive_regret.py`` runs this over declared design and evaluation instances.
"""

from __future__ import annotations

import numpy as np

from ..core._array import to_numpy
from ..core.model import kernel

__all__ = ["best_warmup", "regret", "is_u_shaped", "instance_truth", "score_instance",
           "U_SHAPE_MARGIN"]

#: ``R(T0)`` is called U-shaped when both ends are this much worse than the best interior ``T0``.
U_SHAPE_MARGIN = 0.05


def best_warmup(excess_risk) -> int:
    """``T0_best = argmin_{T0} R(T0)``, the smallest on ties; non-finite ``R`` (diverged) never wins."""
    R = np.asarray(excess_risk, dtype=float)
    R = np.where(np.isfinite(R), R, np.inf)
    return int(np.argmin(R))


def regret(risk, excess_risk) -> float:
    """``risk / min_{T0} R(T0) − 1`` (``inf`` for a diverged recommendation)."""
    R = np.asarray(excess_risk, dtype=float)
    best = R[best_warmup(R)]
    return float(risk / best - 1.0) if np.isfinite(risk) else float("inf")


def is_u_shaped(excess_risk, margin: float = U_SHAPE_MARGIN) -> bool:
    """True when ``T0_best`` is interior and ``min(R(0), R(T)) ≥ (1 + margin) R(T0_best)``."""
    R = np.asarray(excess_risk, dtype=float)
    b = best_warmup(R)
    return bool(0 < b < len(R) - 1 and min(R[0], R[-1]) >= (1.0 + margin) * R[b])


def instance_truth(config, clients, restarts: int = 8) -> dict:
    """``R(T0)`` for ``T0 = 0..T`` (one warm-up sweep) and ``Φ*_λ`` of one instance.

    ``Φ*_λ`` is :func:`~linattn_theory.theory.profile.centralized_optimum` started from the teacher,
    ``restarts`` random kernels and the best kernel the sweep reached (so ``R ≥ 0`` on the sweep).
    Returns ``{"excess_risk": array, "optimum": float, "diverged": array of bool}``.
    """
    from ..theory.bound import config_stacked
    from ..theory.profile import centralized_optimum, profile_objective
    from ..sim.warmup_grid import warmup_sweep

    fed = config.federated
    runs = warmup_sweep(config.with_updates({"federated.strategy": "fedfrozen"}), None, clients)
    T = fed.rounds
    ok = [runs[T0] for T0 in range(T + 1) if not runs[T0].diverged]
    kernels = [np.asarray(to_numpy(kernel(r.warmup_params))) for r in ok]
    data = config_stacked(config, clients)
    starts = []
    if kernels:
        starts = [min(kernels, key=lambda K: profile_objective(K, data, fed.ridge)[0])]
    optimum = centralized_optimum(data, fed.ridge, rank=config.model.rank, heads=config.model.heads,
                                  restarts=restarts, seed=config.seed, initial_kernels=starts).objective
    final = np.array([np.inf if runs[T0].diverged else float(runs[T0].table["loss_regularized"].iloc[-1])
                      for T0 in range(T + 1)])
    return {"excess_risk": final - optimum, "optimum": float(optimum),
            "diverged": np.array([runs[T0].diverged for T0 in range(T + 1)])}


def score_instance(config, clients=None, *, pilot_rounds: int | None = None, restarts: int = 8,
                   keep_forecasts: bool = False) -> dict:
    """Truth and every recommender on one instance: the record ``benchmarks/predictive_regret.py`` stores.

    Returns a dict with ``excess_risk`` (the list ``R(0..T)``), ``optimum``, ``best_T0``,
    ``u_shaped`` and, per recommender, ``<mode>_T0`` and ``<mode>_risk`` (the realised ``R``); for
    the online rule also ``online_stop_round`` and ``online_predicted`` (its forecast ``R`` before
    the frozen stage ran). The transfer recommender reads other instances' records and is scored
    by the caller. With ``keep_forecasts``, ``freeze_objective[s][t − s] = J(s, T − t) − Φ*_λ`` for
    every stored round ``s ≤ t`` of the FedAvg path (docs/theory.md §8), so that candidate online
    rules can be replayed on the record.
    """
    from ..theory.bound import config_stacked, estimate_bound, warmup_path
    from ..sim.engine import clients_from_config
    from .recommendation import default_pilot_rounds, pilot_path, pilot_warmup
    from .online import freeze_forecast, run_online

    clients = clients_from_config(config) if clients is None else clients
    T = config.federated.rounds
    truth = instance_truth(config, clients, restarts)
    R, optimum = truth["excess_risk"], truth["optimum"]
    record = {"excess_risk": [float(r) for r in R], "optimum": optimum, "best_T0": best_warmup(R),
              "u_shaped": is_u_shaped(R), "fedavg_diverged": bool(truth["diverged"][-1])}
    if truth["diverged"][-1]:
        return record     # the FedAvg path diverges: no bound, no online rule on it
    online = run_online(config, clients)
    realised = (np.inf if online.result.diverged
                else float(online.result.table["loss_regularized"].iloc[-1]) - optimum)
    record.update(online_T0=online.kernel_round, online_stop_round=online.stop_round,
                  online_risk=realised, online_predicted=online.predicted_objective - optimum)
    Tp = default_pilot_rounds(T) if pilot_rounds is None else pilot_rounds
    record["pilot_T0"] = pilot_warmup(config, clients, pilot_path(config, clients, Tp), optimum)[0]
    path = warmup_path(config, clients)
    record["a_posteriori_T0"] = estimate_bound(config, clients, path=path, optimum=optimum).T0_theory
    for mode in ("pilot", "a_posteriori"):
        record[f"{mode}_risk"] = float(R[record[f"{mode}_T0"]])
    if keep_forecasts:
        data = config_stacked(config, clients)
        rows = []
        for s, params in enumerate(path.params):
            forecast = freeze_forecast(params, data, config.federated, s)
            rows.append([float(v) - optimum for v in forecast.final_objective(T - np.arange(s, T + 1))])
        record["freeze_objective"] = rows
    return record
