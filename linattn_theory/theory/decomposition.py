"""The exact bias–drift decomposition of the excess risk (docs/theory.md §6).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from ..core.arrays import to_numpy
from ..core.model import value_matrix, kernel
from .profile import CentralizedOptimum, centralized_optimum
from .host import (as_stacked, attention_of, check_kernel, check_ridge, global_objective, host_moments,
                   profile_from_moments)
from .frozen_stage import check_schedule, drift_floor_from_moments, fixed_point, affine_round

__all__ = ["decompose_excess_risk", "excess_risk_by_warmup"]


# --------------------------------------------------------------------------------------
# §6 the exact bias–drift decomposition of the excess risk
# --------------------------------------------------------------------------------------
def _run_setting(run, name: str, given):
    """A federated setting given explicitly, else read from the run's recorded configuration."""
    if given is not None:
        return given
    try:
        return run.metadata["config"]["federated"][name]
    except (AttributeError, KeyError, TypeError):
        raise ValueError(f"the run records no configuration; pass {name} explicitly") from None


def _run_clients(run, clients):
    if clients is not None:
        return clients
    from ..sim.config import config_from_dict
    from ..data.families import clients_from_config
    try:
        recorded = run.metadata["config"]    # drop unset options (None) as RunConfig.with_updates does
        recorded = {k: ({kk: vv for kk, vv in v.items() if vv is not None} if isinstance(v, dict) else v)
                    for k, v in recorded.items()}
        return clients_from_config(config_from_dict(recorded))
    except (AttributeError, KeyError, TypeError):
        raise ValueError("the run records no configuration; pass clients explicitly") from None


def _optimum_objective(optimum) -> float:
    return float(optimum.objective if isinstance(optimum, CentralizedOptimum) else optimum)


def decompose_excess_risk(run, clients=None, *, optimum=None, lam: float | None = None,
                          eta: float | None = None, local_steps: int | None = None,
                          server_learning_rate: float | None = None) -> dict:
    """Split a run's excess risk exactly (docs/theory.md §6).

    ``R(T0) = F_λ(θ_T) − Φ*_λ = bias(K_{T0}) + D(K_{T0}) + [F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)]``:
    kernel-profile bias ``Φ_λ(K_{T0}) − Φ*_λ``, value drift floor ``D(K_{T0})`` and the value
    stage's unfinished optimisation (which may be negative: ``V_FA`` is not a minimiser).
    ``R`` is measured from the simulator's last ``loss_regularized``, the three parts from the
    moments, so ``identity_residual = bias + drift_floor + unfinished − excess_risk`` checks the
    moments against the simulator.

    Parameters
    ----------
    run : RunResult
        A FedFrozen run (:func:`~linattn_theory.sim.engine.simulate`); ``K_{T0}`` from its
        ``warmup_params``, ``V_T`` from its final ``params``.
    clients : FederatedDataset, optional
        The run's clients; default: rebuilt from its recorded configuration.
    optimum : float or CentralizedOptimum, optional
        ``Φ*_λ``; default :func:`centralized_optimum` started from ``K_{T0}``.
    lam, eta, local_steps, server_learning_rate : float or int, optional
        Ridge, client step size, local steps ``E`` and server step size; default those of the
        run's recorded configuration.

    Returns
    -------
    dict
        ``excess_risk``, ``bias``, ``drift_floor``, ``unfinished``, ``identity_residual``, the
        profile objective, ``Φ*_λ``, the contraction rate and the cumulative kernel drift, with
        the run's ``warmup_rounds`` and ``rounds``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 8, "warmup_rounds": 4}})
    >>> parts = lt.decompose_excess_risk(lt.simulate(config))
    >>> total = parts["bias"] + parts["drift_floor"] + parts["unfinished"]
    >>> bool(abs(total - parts["excess_risk"]) < 1e-9 * parts["excess_risk"])
    True
    """
    if getattr(run, "divergence", None) is not None:
        raise ValueError(f"the run diverged ({run.divergence.message}); its excess risk is undefined")
    lam = float(_run_setting(run, "ridge", lam))
    eta = float(_run_setting(run, "learning_rate", eta))
    E = int(_run_setting(run, "local_steps", local_steps))
    s = float(_run_setting(run, "server_learning_rate", server_learning_rate))
    check_ridge(lam)
    check_schedule(eta, E, s)
    clients = _run_clients(run, clients)
    data = as_stacked(clients, *attention_of((getattr(run, "metadata", None) or {}).get("config")))
    K = check_kernel(kernel(run.warmup_params), data, "kernel(run.warmup_params)")
    if optimum is None:
        optimum = centralized_optimum(clients if data.attention == "linear" else data, lam, rank=run.warmup_params.WQ.shape[-1], heads=K.shape[0],
                                      initial_kernels=[K])
    phi_star = _optimum_objective(optimum)
    moments = host_moments(K, data)
    phi, V_star = profile_from_moments(moments, lam)
    M, b = affine_round(moments, eta, E, lam, s)
    V_FA = fixed_point(M, b)
    V_T = value_matrix(np, np.asarray(to_numpy(run.params.WV), dtype=np.float64))
    table = run.table
    F_T = global_objective(V_T, moments, lam)
    measured = float(table["loss_regularized"].iloc[-1])
    T0 = int(run.metadata.get("warmup_rounds", -1)) if getattr(run, "metadata", None) else -1
    gamma = table.loc[table["round"] <= max(T0, 0), "cumulative_kernel_drift"].iloc[-1]
    parts = {"bias": phi - phi_star,
             "drift_floor": drift_floor_from_moments(V_FA, V_star, moments, lam),
             "unfinished": F_T - global_objective(V_FA, moments, lam)}
    R = measured - phi_star
    return {"warmup_rounds": T0, "rounds": int(table["round"].iloc[-1]), "excess_risk": R, **parts,
            "identity_residual": parts["bias"] + parts["drift_floor"] + parts["unfinished"] - R,
            "profile_objective": phi, "optimum": phi_star, "loss_regularized": measured,
            "loss_regularized_moments": F_T, "contraction_rate": float(np.max(np.abs(np.linalg.eigvalsh(M)))),
            "cumulative_kernel_drift": float(gamma)}


def excess_risk_by_warmup(config, warmups, clients=None, *, optimum=None, restarts: int = 8,
                          progress: bool = False) -> pd.DataFrame:
    """:func:`decompose_excess_risk` for each warm-up length ``T0`` in ``warmups`` (docs/theory.md §6).

    Runs :func:`~linattn_theory.sim.engine.simulate` with ``federated.strategy = "fedfrozen"`` and
    ``federated.warmup_rounds = T0``; ``Φ*_λ`` (unless given) is one :func:`centralized_optimum`
    started from the teacher, ``restarts`` random kernels and every ``K_{T0}`` the runs reached.
    One row per ``T0``: ``warmup_rounds, excess_risk, bias, drift_floor, unfinished,
    identity_residual, …``; a diverged run gives a row with ``diverged = True``, its round and
    message, and no decomposition (NaN, which a median leaves out): a ``RuntimeWarning`` names
    them, and ``table.attrs["dropped"]`` says how many and why.

    Parameters
    ----------
    config : RunConfig
        The instance.
    warmups : iterable of int
        The warm-up lengths ``T0`` (each in ``0..T``).
    clients : FederatedDataset, optional
        The clients; default those of ``config``.
    optimum : float or CentralizedOptimum, optional
        ``Φ*_λ``; default computed as above.
    restarts : int, default 8
        Random starts of :func:`centralized_optimum`.
    progress : bool, default False
        Show the runs' progress bars.

    Returns
    -------
    pandas.DataFrame
        One row per ``T0``, in the order of ``warmups``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 8, "warmup_rounds": 4}})
    >>> table = lt.excess_risk_by_warmup(config, [0, 4, 8], restarts=2)
    >>> table["warmup_rounds"].tolist(), bool(table["identity_residual"].abs().max() < 1e-9)
    ([0, 4, 8], True)
    """
    from ..data.families import clients_from_config
    from ..sim.engine import simulate
    clients = clients_from_config(config) if clients is None else clients
    runs = {}
    for T0 in warmups:
        cfg = config.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": int(T0)})
        runs[int(T0)] = simulate(cfg, clients, progress=progress)
    data = as_stacked(clients, config.model.attention, config.model.temperature)
    if optimum is None:
        kernels = [to_numpy(kernel(r.warmup_params)) for r in runs.values() if not r.diverged]
        optimum = centralized_optimum(clients if data.attention == "linear" else data, config.federated.ridge, rank=config.model.rank,
                                      heads=config.model.heads, restarts=restarts, seed=config.seed,
                                      initial_kernels=kernels)
    rows = []
    for T0, run in runs.items():
        if run.diverged:
            rows.append({"warmup_rounds": T0, "diverged": True, "diverged_round": run.divergence.round,
                         "message": run.divergence.message})
            continue
        row = decompose_excess_risk(run, data, optimum=optimum)
        rows.append({**row, "warmup_rounds": T0, "diverged": False, "diverged_round": None, "message": ""})
    table = pd.DataFrame(rows)
    diverged = {T0: run.divergence for T0, run in runs.items() if run.diverged}
    table.attrs["dropped"] = {"count": len(diverged), "of": len(runs), "warmup_rounds": sorted(diverged),
                              "why": "the run diverged: no excess risk (NaN)"}
    if diverged:
        import warnings
        which = ", ".join(f"T0 = {T0} at round {d.round}" for T0, d in diverged.items())
        safe = min(d.stable_learning_rate for d in diverged.values())
        warnings.warn(f"excess_risk_by_warmup: {len(diverged)} of {len(runs)} runs diverged ({which}): their "
                      f"rows have diverged = True and no excess risk (NaN), so a median over the rows "
                      f"leaves them out; try learning_rate < {safe:.3g}", RuntimeWarning, stacklevel=2)
    return table
