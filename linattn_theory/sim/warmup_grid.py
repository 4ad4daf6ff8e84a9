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

from ..core.arrays import array_namespace, sq_norms, to_numpy
from ..core.backend import get_namespace
from ..core.errors import ConfigError
from .config import RunConfig
from .ensemble import (EnsemblePlan, chunk_bytes, data_bytes, ensemble_bytes, ensemble_key, per_config,
                       prepare_run, run_metadata, run_planned)
from .rounds import (Member, RunResult, RunState, draw_participants, instance_setting, objective, report_divergence,
                     run_ensemble, run_result, table_row)
from ..core.model import Params, value_matrix as _value_matrix, kernel
from ..core.moments import value_moments, value_objective
from ..core.frozen_map import frozen_client_map

__all__ = ["warmup_sweep", "warmup_sweep_many", "warmup_sweeps_and_paths", "frozen_stage_from_moments", "frozen_stages_from_moments"]

FROZEN_STAGES = ("auto", "moments", "explicit")


@np.errstate(over="ignore", invalid="ignore")   # overflow is detected and reported as divergence
def frozen_stage_from_moments(prefix: RunState, data, fed, warmup_rounds: int,
                              seed: int) -> RunResult:
    """Rounds ``T0..T−1`` of a full-batch FedFrozen frozen stage, in moment space (docs/theory.md §5).

    ``prefix`` is the :class:`~linattn_theory.sim.rounds.RunState` of the run at round ``T0``
    (``prefix.params = θ^{T0}``, whose kernel is frozen). Each round draws the participants as
    the simulator does, maps every participant's value block through
    :func:`~linattn_theory.core.frozen_map.frozen_client_map` and applies the server step
    ``V ← V + η_s (Σ_c p̃_c V_c − V)``; the table's losses are ``F_c = value_objective(V)``.
    Equals :func:`~linattn_theory.sim.engine.run_schedule` continued from ``prefix`` up to
    rounding (the moment form ``½ tr(VᵀA_cV) − tr(VᵀB_c) + ½ y2_c`` loses about
    ``ε · y2_c / F_c`` in relative precision where the fit is nearly exact).
    (One stage of :func:`frozen_stages_from_moments`.)

    Parameters
    ----------
    prefix : RunState
        The run's state at round ``T0``.
    data : StackedClients
        Its stacked clients.
    fed : FederatedConfig
        The schedule (full batches).
    warmup_rounds : int
        ``T0``.
    seed : int
        The run's seed (participation draws).

    Returns
    -------
    RunResult
        The whole run, rounds ``0..T`` (the prefix's rows, then the frozen stage's).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.warmup_grid import frozen_stage_from_moments, warmup_sweeps_and_paths
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> sweeps, [(data, states)] = warmup_sweeps_and_paths([config])
    >>> run = frozen_stage_from_moments(states[3], data, config.federated, 3, config.seed)
    >>> final = sweeps[0][3].table["loss_regularized"].iloc[-1]
    >>> bool(abs(run.table["loss_regularized"].iloc[-1] - final) <= 1e-9 * final)
    True
    """
    return frozen_stages_from_moments([(prefix, data, fed, warmup_rounds, seed)])[0]


def frozen_stages_from_moments(stages) -> list[RunResult]:
    """Many moment-space frozen stages as array programs with a leading stage axis ``P``.

    ``stages`` are ``(prefix, data, fed, warmup_rounds, seed)`` tuples as
    :func:`frozen_stage_from_moments` takes them. Stages of equal shapes (``m``, ``H·d``, ``p``,
    dtype), local steps and participation run as one program; their instances' data may differ
    (the value moments ``A_c, B_c`` of the stages of one ``data`` are computed in one call, at
    their frozen kernels). Each stage runs its own rounds ``T0..T−1`` and reports its own
    divergence. Returns the results in the stages' order.

    Parameters
    ----------
    stages : iterable of tuple
        ``(prefix, data, fed, warmup_rounds, seed)``, each as :func:`frozen_stage_from_moments` takes it.

    Returns
    -------
    list of RunResult
        One per stage, in the stages' order.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.warmup_grid import frozen_stages_from_moments, warmup_sweeps_and_paths
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> _, [(data, states)] = warmup_sweeps_and_paths([config])
    >>> runs = frozen_stages_from_moments([(states[T0], data, config.federated, T0, config.seed) for T0 in (2, 4)])
    >>> [len(run.table) for run in runs]
    [7, 7]
    """
    groups: dict = {}
    for j, (prefix, data, fed, _, _) in enumerate(stages):
        key = (tuple(data.S.shape[:1]), tuple(prefix.params.WV.shape), str(data.S.dtype), fed.local_steps,
               fed.participation)
        groups.setdefault(key, []).append(j)
    results = [None] * len(stages)
    for js in groups.values():
        for j, result in zip(js, _frozen_stages([stages[j] for j in js])):
            results[j] = result
    return results


@np.errstate(over="ignore", invalid="ignore")
def _frozen_stages(stages) -> list[RunResult]:
    """:func:`frozen_stages_from_moments` of compatible stages: one program."""
    from ..core.moments import ValueMoments
    from .strategies.base import instance_rows as _instance_rows, weighted_sum

    if not stages:
        return []
    for prefix, data, fed, T0, _ in stages:
        if fed.batch_size is not None:
            raise ValueError(f"batch_size = {fed.batch_size}: the moment-space frozen stage needs "
                             f"full batches (batch_size = None)")
        if prefix.round != T0:
            raise ValueError(f"prefix ends at round {prefix.round}; expected the round-T0 state, "
                             f"T0 = {T0}")
    first_data = stages[0][1]
    xp = array_namespace(first_data.S)
    dtype = first_data.S.dtype
    count = len(stages)
    H, d, _, p = stages[0][0].params.shape
    m = first_data.S.shape[0]
    E = stages[0][2].local_steps
    # value moments at the frozen kernels, one call per instance's data (docs/theory.md §4)
    by_data: dict[int, list[int]] = {}
    for j, stage in enumerate(stages):
        by_data.setdefault(id(stage[1]), []).append(j)
    parts = [None] * count
    for js in by_data.values():
        K = xp.stack([xp.reshape(kernel(stages[j][0].params), (1, H, d, d)) for j in js], axis=0)
        mo = value_moments(K, stages[js[0]][1])                    # A (W, m, n, n), B (W, m, n, p)
        for w, j in enumerate(js):
            parts[j] = (mo.A[w, ...], mo.B[w, ...], mo.y2, mo.weights)
    A, B, y2, weights = (xp.stack([part[q] for part in parts], axis=0) for q in range(4))
    feds = [stage[2] for stage in stages]
    eta = instance_setting(xp, [f.learning_rate for f in feds], dtype, 4)
    lam = instance_setting(xp, [f.ridge for f in feds], dtype, 4)
    server = instance_setting(xp, [f.server_learning_rate for f in feds], dtype, 4)
    moments = ValueMoments(A, B, y2, weights)
    M, b = frozen_client_map(moments, eta, E, lam)                 # (P, m, n, n), (P, m, n, p)
    T0 = np.array([stage[3] for stage in stages])
    T = np.array([f.rounds for f in feds])
    V = xp.stack([xp.reshape(_value_matrix(xp, stage[0].params.WV), (1, H * d, p)) for stage in stages], axis=0)
    lam_p = xp.asarray(np.array([f.ridge for f in feds]), dtype=dtype)
    F0_reg = np.array([float(stage[0].rows[0]["loss_regularized"]) for stage in stages])
    threshold = xp.asarray(np.array([f.divergence_factor for f in feds]) * np.maximum(F0_reg, 1e-12), dtype=dtype)
    best_loss = xp.asarray(np.array([stage[0].best_loss for stage in stages]), dtype=dtype)
    improved = xp.zeros((count,), dtype=xp.bool)
    V_best, V_start = V, V
    alive = xp.ones((count,), dtype=xp.bool)
    diverged_at = xp.full((count,), -1, dtype=xp.int64)
    records, counts = [], []

    def mask(host_or_device, ndim=4):
        a = xp.asarray(host_or_device) if isinstance(host_or_device, np.ndarray) else host_or_device
        return xp.reshape(a, (-1,) + (1,) * (ndim - 1))

    first = int(T0.min())
    for t in range(first, int(T.max())):
        active = (T0 <= t) & (t < T)
        part = np.stack([draw_participants(t, m, f.participation, stage[4]) for f, stage in zip(feds, stages)])
        k = part.shape[1]
        if k == m:
            pw, Mt, bt = weights, M, b
        else:
            rows = xp.asarray(_instance_rows(count, m, part))
            take = lambda a: xp.reshape(xp.take(xp.reshape(a, (count * m,) + tuple(a.shape[2:])), rows, axis=0),  # noqa: E731
                                        (count, k) + tuple(a.shape[2:]))
            pw, Mt, bt = take(weights), take(M), take(b)
        pw = pw / xp.sum(pw, axis=1, keepdims=True)
        V_c = xp.matmul(Mt, V) + bt                                    # (P, k, n, p)
        average = weighted_sum(pw, V_c)                                # (P, 1, n, p)
        drift = xp.sum(pw * sq_norms(xp, V_c - average, 2), axis=-1)
        running = alive & xp.asarray(active)
        V_previous = V
        V = xp.where(mask(running), V + server * (average - V), V)
        losses = value_objective(V, moments)                           # (P, m)
        F, F_reg = objective(xp, weights, losses, V, lam_p)
        records.append((F, F_reg, losses, drift))
        counts.append(k)
        better = running & (F_reg < best_loss)
        improved = improved | better
        V_best = xp.where(mask(better), V, V_best)
        best_loss = xp.where(better, F_reg, best_loss)
        V_start = xp.where(mask(running), V_previous, V_start)
        bad = running & (~xp.isfinite(F_reg) | (F_reg > threshold))
        diverged_at = xp.where(bad, xp.asarray(t + 1, dtype=xp.int64), diverged_at)
        alive = alive & ~bad
    host = lambda a: np.asarray(to_numpy(a))  # noqa: E731
    if records:
        F_h, Freg_h, L_h, D_h = (host(xp.stack([r[q] for r in records], axis=0)) for q in range(4))
    div, improved = host(diverged_at), host(improved)
    results = []
    for j, (prefix, data, fed, T0_j, _) in enumerate(stages):
        end = int(div[j]) if div[j] >= 0 else fed.rounds
        rows = list(prefix.rows)
        gamma = float(rows[-1]["cumulative_kernel_drift"])
        for t in range(T0_j, end):
            i = t - first
            rows.append(table_row(t + 1, "frozen", float(F_h[i, j]), float(Freg_h[i, j]), L_h[i, j], 0.0, gamma,
                                  {"WQ": 0.0, "WK": 0.0, "WV": float(D_h[i, j])}, counts[i], "fedfrozen"))
        with_value = lambda W: prefix.params.replace(WV=xp.reshape(W[j, 0, ...], (H, d, p)))  # noqa: E731
        current = with_value(V)
        divergence = None
        if div[j] >= 0:
            best = with_value(V_best) if improved[j] else prefix.best
            divergence = report_divergence(end, float(Freg_h[end - 1 - first, j]),
                                           [prefix.initial, best, with_value(V_start)], data, fed.ridge,
                                           fed.learning_rate, ("WV",))
        results.append(run_result(rows, current, prefix.params, divergence, T0_j, "fedfrozen"))
    return results


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
    diverges shares the trajectory's divergence. :func:`warmup_sweep_many` of the one config
    (``params``: its ``θ^0``), with a run alone's ``max_bytes`` as in
    :func:`~linattn_theory.sim.engine.simulate`.

    Parameters
    ----------
    config : RunConfig
        The instance; its strategy and ``warmup_rounds`` are replaced by each run's.
    warmups : iterable of int, optional
        The warm-up lengths ``T0`` (each in ``0..T``); default every one, ``0..T``.
    clients : FederatedDataset, optional
        The clients; default: those of ``config``.
    params : Params, optional
        Initial parameters; default: drawn from ``config``.
    frozen_stage : {"auto", "moments", "explicit"}, default "auto"
        How the frozen stages run: in moment space, explicitly, or the former where batches are full.
    max_bytes : int, str or None, default "auto"
        Chunks clients as in :func:`~linattn_theory.sim.engine.simulate`; results do not depend on it.
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    dict of int to RunResult
        ``{T0: RunResult}`` in the order of ``warmups``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> runs = lt.warmup_sweep(config, warmups=[0, 3, 6])
    >>> sorted(runs)
    [0, 3, 6]
    >>> final = {T0: run.table["loss_regularized"].iloc[-1] for T0, run in runs.items()}
    >>> alone = lt.simulate(config.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": 3}))
    >>> bool(abs(final[3] - alone.table["loss_regularized"].iloc[-1]) < 1e-9 * final[3])
    True
    """
    sweeps, _ = warmup_sweeps_and_paths([config], warmups, [clients], params=[params], frozen_stage=frozen_stage,
                                        max_bytes=max_bytes, progress=progress, alone=True)
    return sweeps[0]


def _sweep_configs(config: RunConfig, warmups, frozen_stage: str):
    """Checks of :func:`warmup_sweep`: ``(T0 values, use moments)``."""
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
    return _check_warmups(warmups, fed.rounds), use_moments


def warmup_sweep_many(configs, warmups=None, clients=None, *, frozen_stage: str = "auto",
                      max_bytes: int | str | None = "auto", progress: bool = False) -> list[dict[int, RunResult]]:
    """:func:`warmup_sweep` of many instances at once: ``[{T0: RunResult}]`` in the configs' order.

    The instances' FedAvg trajectories (each up to its largest ``T0``) run as ensembles
    (:mod:`linattn_theory.sim.ensemble`, one leading instance axis) and keep their state at
    every ``T0``; the frozen stages of all (instance, ``T0``) pairs then run as one moment-space
    program (:func:`frozen_stages_from_moments`) when batches are full, or explicitly as
    ensembles continuing from those states otherwise (``frozen_stage`` as in
    :func:`warmup_sweep`). Each result equals ``warmup_sweep(config)[T0]`` to rounding (the
    ensemble runs the fused CPU engine wherever it applies and pays). ``clients`` is ``None`` or one entry
    per config; ``max_bytes`` bounds an ensemble's data (:func:`~linattn_theory.sim.ensemble.simulate_many`).

    Parameters
    ----------
    configs : sequence of RunConfig
        The instances.
    warmups : iterable of int, optional
        The warm-up lengths ``T0``, the same for every instance; default ``0..T`` of each.
    clients : sequence of FederatedDataset or None, optional
        One entry per config (``None``: built from the config).
    frozen_stage : {"auto", "moments", "explicit"}, default "auto"
        As in :func:`warmup_sweep`.
    max_bytes : int, str or None, default "auto"
        Bound on an ensemble's data (:func:`~linattn_theory.sim.ensemble.simulate_many`).
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    list of dict of int to RunResult
        ``[{T0: RunResult}]`` in the configs' order.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> grids = lt.warmup_sweep_many([config, config.with_updates({"seed": 1})], warmups=[0, 6])
    >>> [sorted(grid) for grid in grids]
    [[0, 6], [0, 6]]
    """
    return warmup_sweeps_and_paths(configs, warmups, clients, frozen_stage=frozen_stage, max_bytes=max_bytes,
                                   progress=progress)[0]


def warmup_sweeps_and_paths(configs, warmups=None, clients=None, *, frozen_stage: str = "auto",
                            max_bytes: int | str | None = "auto", progress: bool = False, params=None,
                            alone: bool = False):
    """``(sweeps, paths)``: :func:`warmup_sweep_many`'s sweeps and, per config, the FedAvg trajectory
    that ran them, ``(data, states)`` — the stacked clients and the states after rounds ``0..T``
    (what :func:`~linattn_theory.sim.engine.run_schedule` passes to ``on_round``; up to the
    divergence round when it diverged) — when every ``T0 = 0..T`` is swept (the ``T0 = T`` run is
    the FedAvg trajectory, in moment space or explicitly), else ``None``. A consumer of the FedAvg
    path (the regret benchmark's record) reads it here instead of running it again. ``params``:
    ``None`` or one ``θ^0`` (or ``None``) per config; ``alone``: ``max_bytes`` bounds a run
    alone's round working set (:func:`~linattn_theory.sim.ensemble.run_planned`).

    Parameters
    ----------
    configs : sequence of RunConfig
        The instances.
    warmups : iterable of int, optional
        The warm-up lengths ``T0``, the same for every instance; default ``0..T`` of each.
    clients : sequence of FederatedDataset or None, optional
        One entry per config (``None``: built from the config).
    frozen_stage : {"auto", "moments", "explicit"}, default "auto"
        As in :func:`warmup_sweep`.
    max_bytes : int, str or None, default "auto"
        Bound on an ensemble's data (:func:`~linattn_theory.sim.ensemble.simulate_many`).
    progress : bool, default False
        Show a progress bar.
    params : sequence of Params or None, optional
        One ``θ^0`` (or ``None``: drawn from the config) per config.
    alone : bool, default False
        ``max_bytes`` as for a run alone (:func:`~linattn_theory.sim.engine.simulate`).

    Returns
    -------
    sweeps : list of dict of int to RunResult
        As :func:`warmup_sweep_many` returns them.
    paths : list of tuple or None
        Per config, ``(data, states)`` (states after rounds ``0..T``) when every ``T0`` was swept, else ``None``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.warmup_grid import warmup_sweeps_and_paths
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> sweeps, [(data, states)] = warmup_sweeps_and_paths([config])
    >>> sorted(sweeps[0]), [state.round for state in states]
    ([0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6])
    >>> warmup_sweeps_and_paths([config], warmups=[0, 6])[1]      # not every T0: no path
    [None]
    """
    configs = list(configs)
    clients = per_config(clients, len(configs), "clients")
    params = per_config(params, len(configs), "params")
    checked = [_sweep_configs(c, warmups, frozen_stage) for c in configs]
    run_configs = [[c.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": T0})
                    for T0 in T0s] for c, (T0s, _) in zip(configs, checked)]
    results: list[dict | None] = [None] * len(configs)
    paths: list[tuple | None] = [None] * len(configs)
    explicit = [i for i, (_, moments) in enumerate(checked) if not moments]
    if explicit:
        flat = [(i, rc) for i in explicit for rc in run_configs[i]]
        trajectories: dict = {}
        runs = run_planned([rc for _, rc in flat], [clients[i] for i, _ in flat], [params[i] for i, _ in flat],
                              max_bytes, progress, trajectories, alone)
        for j, ((i, rc), run) in enumerate(zip(flat, runs)):
            results[i] = results[i] or {}
            results[i][rc.federated.warmup_rounds] = run
            if j in trajectories and list(checked[i][0]) == list(range(configs[i].federated.rounds + 1)):
                paths[i] = trajectories[j]
    pending = [i for i, (_, moments) in enumerate(checked) if moments]
    if not pending:
        return results, paths
    plan = EnsemblePlan(None if alone else ensemble_bytes(max_bytes, get_namespace(configs[pending[0]].model.backend)))
    waves = []
    for i in pending:
        config, (T0s, _) = configs[i], checked[i]
        data, theta0 = prepare_run(config, clients[i], params[i])
        longest = T0s[-1]
        trajectory = config.with_updates({"federated.strategy": "fedfrozen", "federated.rounds": longest,
                                          "federated.warmup_rounds": longest})
        member = Member(trajectory, data, theta0, checkpoints=tuple(T0s))
        if plan.add(ensemble_key(trajectory, data), (i, member), 2 * data_bytes(data)):
            waves.append(plan.drain())
    waves.append(plan.drain())
    for buckets in waves:
        stages, owners = [], []
        for bucket in buckets:
            members = [member for _, member in bucket]
            first = members[0]
            chunk = chunk_bytes(first.data, first.config, len(members), max_bytes if alone else None)
            for (i, member), (trajectory, states, _) in zip(bucket, run_ensemble(
                    members, max_bytes=chunk, progress=progress)):
                results[i] = {}
                metadata = run_metadata(configs[i])
                if list(checked[i][0]) == list(range(configs[i].federated.rounds + 1)):
                    paths[i] = (member.data, [states[t] for t in sorted(states)])
                for T0, run_config in zip(checked[i][0], run_configs[i]):
                    T = run_config.federated.rounds
                    if T0 == T or (trajectory.diverged and T0 >= trajectory.divergence.round):
                        result = dataclasses.replace(trajectory, table=trajectory.table.copy(),
                                                     metadata=dict(trajectory.metadata, warmup_rounds=T0))
                        result.metadata.update(metadata, config=run_config.to_dict())
                        results[i][T0] = result
                    else:
                        stages.append((states[T0], member.data, run_config.federated, T0, run_config.seed))
                        owners.append((i, T0, run_config, trajectory.metadata["engine"], metadata))
        for (i, T0, run_config, engine, metadata), result in zip(owners, frozen_stages_from_moments(stages)):
            result.metadata["engine"] = engine
            result.metadata.update(metadata, config=run_config.to_dict())
            results[i][T0] = result
    return [dict(sorted(r.items())) for r in results], paths
