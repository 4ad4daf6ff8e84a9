"""Sweeps over the warm-up length ``T0`` that share their work (docs/theory.md §3, §5, §6).

Runs that differ only in ``T0`` agree up to round ``T0``: each is plain FedAvg until then. One
full-training trajectory, with the parameters saved at every requested ``T0``, therefore serves
all of them; only the frozen stages differ. With full batches a frozen stage needs nothing but
the value moments of the frozen kernel (docs/theory.md §4–5): each client's ``E`` local steps
are the affine map

    V ↦ M_c V + b_c,   M_c = (I − η Ã_c)^E,   b_c = Σ_{j<E} (I − η Ã_c)^j η B_c,

so a frozen round costs ``O(m (Hd)² p)`` whatever the number of samples, and a sweep over
every ``T0 ∈ {0..T}`` costs about one training run instead of ``T + 1``. Minibatch runs keep
the shared prefix and run their frozen stage explicitly. Every result equals the explicit
:func:`~linattn_theory.sim.engine.simulate` run of the same ``T0`` (bit for bit on the explicit
path, to rounding on the moment path).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core._array import array_namespace, to_numpy
from ..core.backend import resolve_max_bytes
from ..core.errors import ConfigError
from .config import RunConfig
from .engine import (RunResult, RunState, _divergence, _participants, _result, _row, _sq_norm, _weighted_sum, prepare_run, run_metadata, run_schedule)
from ..core.model import Params, _value_matrix, kernel
from ..core.moments import value_moments, value_objective
from ..core.frozen_map import frozen_client_map

__all__ = ["warmup_sweep", "frozen_stage_from_moments"]

FROZEN_STAGES = ("auto", "moments", "explicit")


@np.errstate(over="ignore", invalid="ignore")   # overflow is detected and reported as divergence
def frozen_stage_from_moments(prefix: RunState, data, fed, warmup_rounds: int,
                              seed: int) -> RunResult:
    """Rounds ``T0..T−1`` of a full-batch FedFrozen frozen stage, in moment space (docs/theory.md §5).

    ``prefix`` is the :class:`~linattn_theory.sim.engine.RunState` of the run at round ``T0``
    (``prefix.params = θ^{T0}``, whose kernel is frozen). Each round draws the participants as
    the simulator does, maps every participant's value block through
    :func:`~linattn_theory.core.frozen_map.frozen_client_map` and applies the server step
    ``V ← V + η_s (Σ_c p̃_c V_c − V)``; the table's losses are ``F_c = value_objective(V)``.
    Equals :func:`~linattn_theory.sim.engine.run_schedule` continued from ``prefix`` up to
    rounding (the moment form ``½ tr(VᵀA_cV) − tr(VᵀB_c) + ½ y2_c`` loses about
    ``ε · y2_c / F_c`` in relative precision where the fit is nearly exact).
    """
    if fed.batch_size is not None:
        raise ValueError(f"batch_size = {fed.batch_size}: the moment-space frozen stage needs "
                         f"full batches (batch_size = None)")
    xp = array_namespace(data.S)
    T, E, eta, lam = fed.rounds, fed.local_steps, fed.learning_rate, fed.ridge
    if prefix.round != warmup_rounds:
        raise ValueError(f"prefix ends at round {prefix.round}; expected the round-T0 state, "
                         f"T0 = {warmup_rounds}")
    params = prefix.params
    H, d, _, p = params.shape
    m = data.S.shape[0]
    K = kernel(params)
    moments = value_moments(K, data)
    M, b = frozen_client_map(moments, eta, E, lam)
    rows = list(prefix.rows)
    F0_reg = float(rows[0]["loss_regularized"])
    gamma = float(rows[-1]["cumulative_kernel_drift"])
    best, best_loss = prefix.best, prefix.best_loss
    current = params
    V = _value_matrix(xp, params.WV)
    divergence = None
    for t in range(warmup_rounds, T):
        part = _participants(t, m, fed.participation, seed)
        if len(part) == m:
            pw, Mt, bt = data.weights, M, b
        else:
            index = xp.asarray(part)
            pw, Mt, bt = (xp.take(a, index, axis=0) for a in (data.weights, M, b))
        pw = pw / xp.sum(pw)
        V_c = xp.matmul(Mt, V) + bt                                   # (k, Hd, p)
        average = _weighted_sum(xp, pw, V_c)
        drift = float(to_numpy(xp.sum(pw * _sq_norm(xp, V_c - average))))
        V = V + fed.server_learning_rate * (average - V)
        start, current = current, params.replace(WV=xp.reshape(V, (H, d, p)))
        losses = value_objective(V, moments)
        F = float(to_numpy(xp.sum(data.weights * losses)))
        F_reg = F + 0.5 * lam * float(to_numpy(xp.sum(V * V)))
        if F_reg < best_loss:
            best, best_loss = current, F_reg
        rows.append(_row(t + 1, "frozen", F, F_reg, to_numpy(losses), 0.0, gamma,
                         {"WQ": 0.0, "WK": 0.0, "WV": drift}, len(part), "fedfrozen"))
        if not np.isfinite(F_reg) or F_reg > fed.divergence_factor * max(F0_reg, 1e-12):
            divergence = _divergence(t + 1, F_reg, [prefix.initial, best, start], data, lam, eta,
                                     ("WV",))
            break
    return _result(rows, current, params, divergence, warmup_rounds, "fedfrozen")


def _check_warmups(warmups, T: int) -> list[int]:
    if warmups is None:
        return list(range(T + 1))
    values = sorted(set(warmups))
    if not values:
        raise ValueError("warmups is empty; expected warm-up lengths T0 in 0..T")
    for T0 in values:
        if isinstance(T0, bool) or not isinstance(T0, (int, np.integer)) or not 0 <= T0 <= T:
            raise ValueError(f"warmups contains {T0!r}; expected integers T0 with 0 <= T0 <= "
                             f"federated.rounds = {T}")
    return [int(T0) for T0 in values]


def warmup_sweep(config: RunConfig, warmups=None, clients=None, *, params: Params | None = None,
                 frozen_stage: str = "auto", max_bytes: int | str | None = "auto",
                 progress: bool = False) -> dict[int, RunResult]:
    """FedFrozen runs of ``config`` for every warm-up length in ``warmups`` (default ``0..T``), sharing work.

    Returns ``{T0: RunResult}``, each equal to ``simulate(config)`` with
    ``federated.strategy = "fedfrozen"`` and ``federated.warmup_rounds = T0`` (``T0 = T`` is plain
    FedAvg): one FedAvg trajectory up to ``max(warmups)`` rounds provides every run's warm-up
    (its table rows and ``θ^{T0}``); the frozen stages run in moment space
    (:func:`frozen_stage_from_moments`) when batches are full and explicitly otherwise
    (``frozen_stage = "auto"``; ``"moments"`` or ``"explicit"`` force one). A run whose warm-up
    diverges shares the trajectory's divergence. ``max_bytes`` chunks clients as in
    :func:`~linattn_theory.sim.engine.simulate`.
    """
    fed = config.federated
    if fed.strategy not in ("fedavg", "fedfrozen"):
        raise ConfigError(f"federated.strategy = {fed.strategy!r}: a warm-up sweep shares "
                          f"FedAvg prefixes; expected 'fedavg' or 'fedfrozen'")
    if frozen_stage not in FROZEN_STAGES:
        raise ValueError(f"frozen_stage = {frozen_stage!r}: expected one of {FROZEN_STAGES}")
    if frozen_stage == "moments" and fed.batch_size is not None:
        raise ValueError(f"frozen_stage = 'moments' needs full batches; federated.batch_size = "
                         f"{fed.batch_size}")
    use_moments = frozen_stage == "moments" or (frozen_stage == "auto" and fed.batch_size is None)
    T = fed.rounds
    warmups = _check_warmups(warmups, T)
    data, theta0 = prepare_run(config, clients, params)
    max_bytes = resolve_max_bytes(max_bytes, data, config.model.heads, fed.batch_size)

    checkpoints = {}

    def keep(state):
        if state.round in warmups:
            checkpoints[state.round] = state

    longest = warmups[-1]
    warmup = dataclasses.replace(fed, strategy="fedfrozen", rounds=longest, warmup_rounds=longest)
    trajectory = run_schedule(theta0, data, warmup, longest, config.seed, progress=progress,
                              max_bytes=max_bytes, on_round=keep, engine=config.model.engine)
    metadata = run_metadata(config)
    results = {}
    for T0 in warmups:
        run_config = config.with_updates({"federated.strategy": "fedfrozen",
                                          "federated.warmup_rounds": T0})
        if T0 == T or (trajectory.diverged and T0 >= trajectory.divergence.round):
            # plain FedAvg, or a warm-up that diverges by round T0: the trajectory itself
            result = dataclasses.replace(trajectory, table=trajectory.table.copy(),
                                         metadata=dict(trajectory.metadata, warmup_rounds=T0))
        else:
            frozen = run_config.federated
            if use_moments:
                result = frozen_stage_from_moments(checkpoints[T0], data, frozen, T0, config.seed)
            else:
                result = run_schedule(checkpoints[T0].params, data, frozen, T0, config.seed,
                                      max_bytes=max_bytes, prefix=checkpoints[T0],
                                      engine=config.model.engine)
        result.metadata.setdefault("engine", trajectory.metadata["engine"])   # the warm-up's engine
        result.metadata.update(metadata, config=run_config.to_dict())
        results[T0] = result
    return results
