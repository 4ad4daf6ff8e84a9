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

from ..core.errors import ConfigError
from ..core.model import Params
from .config import RunConfig
from .ensemble import per_config, run_grouped, run_planned
from .rounds import Member, RunResult, RunState

__all__ = ["warmup_sweep", "warmup_sweep_many", "warmup_sweeps_and_paths", "frozen_stage_from_moments", "frozen_stages_from_moments"]

FROZEN_STAGES = ("auto", "moments", "explicit")


def frozen_stage_from_moments(prefix: RunState, data, fed, warmup_rounds: int,
                              seed: int) -> RunResult:
    """Rounds ``T0..T−1`` of a full-batch FedFrozen frozen stage, in moment space (docs/theory.md §5).

    ``prefix`` is the :class:`~linattn_theory.sim.rounds.RunState` of the run at round ``T0``
    (``prefix.params = θ^{T0}``, whose kernel is frozen), continued by the round loop with its
    moment-space backend (:func:`~linattn_theory.sim.rounds.run_ensemble`, ``engine="moments"``):
    each participant's value block goes through
    :func:`~linattn_theory.core.frozen_map.frozen_client_map`, then FedAvg's server step
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
    """Many moment-space frozen stages, as ensembles of the round loop (its moment-space backend).

    ``stages`` are ``(prefix, data, fed, warmup_rounds, seed)`` tuples as
    :func:`frozen_stage_from_moments` takes them. Stages of equal shapes (``m``, ``H·d``, ``p``,
    dtype), rounds, local steps and participation run as one ensemble; their instances' data may differ
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
    members = []
    for prefix, data, fed, T0, seed in stages:
        if prefix.round != T0:
            raise ValueError(f"prefix ends at round {prefix.round}; expected the round-T0 state, T0 = {T0}")
        fed = dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=T0)
        members.append(Member(RunConfig(seed=seed, federated=fed), data, prefix.params, prefix=prefix))

    def key(mb: Member):          # one ensemble per shapes and schedule, on the moment-space backend
        fed = mb.config.federated
        return (mb.data.S.shape[0], tuple(mb.params.WV.shape), str(mb.data.S.dtype), fed.rounds, fed.local_steps,
                fed.participation)
    return [result for result, _, _ in run_grouped(members, key, engine="moments")]


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
    """Checks of :func:`warmup_sweep`; its ``T0`` values."""
    fed = config.federated
    if fed.strategy not in ("fedavg", "fedfrozen"):
        raise ConfigError(f"federated.strategy = {fed.strategy!r}: a warm-up sweep shares "
                          f"FedAvg prefixes; expected 'fedavg' or 'fedfrozen'")
    if frozen_stage not in FROZEN_STAGES:
        raise ValueError(f"frozen_stage = {frozen_stage!r}: expected one of {FROZEN_STAGES}")
    if frozen_stage == "moments" and fed.batch_size is not None:
        raise ValueError(f"frozen_stage = 'moments' needs full batches; federated.batch_size = "
                         f"{fed.batch_size}")
    return _check_warmups(warmups, fed.rounds)


def warmup_sweep_many(configs, warmups=None, clients=None, *, frozen_stage: str = "auto",
                      max_bytes: int | str | None = "auto", progress: bool = False) -> list[dict[int, RunResult]]:
    """:func:`warmup_sweep` of many instances at once: ``[{T0: RunResult}]`` in the configs' order.

    The instances' FedAvg trajectories run as ensembles (:func:`~linattn_theory.sim.ensemble.run_planned`,
    one leading instance axis) and keep their state at every ``T0``; the frozen stages of all
    (instance, ``T0``) pairs then continue from those states as ensembles of the round loop, in
    moment space when batches are full (each trajectory then stops at its largest ``T0``) and
    explicitly otherwise (``frozen_stage`` as in :func:`warmup_sweep`). Each result equals ``warmup_sweep(config)[T0]`` to rounding (the
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
    checked = [_sweep_configs(c, warmups, frozen_stage) for c in configs]
    flat = [(i, c.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": T0}))
            for i, (c, T0s) in enumerate(zip(configs, checked)) for T0 in T0s]
    clients, params = (per_config(a, len(configs), what) for a, what in ((clients, "clients"), (params, "params")))
    full = [T0s == list(range(c.federated.rounds + 1)) for c, T0s in zip(configs, checked)]
    trajectories: dict | None = {} if any(full) else None       # kept only where a path is handed out
    runs = run_planned([rc for _, rc in flat], [clients[i] for i, _ in flat], [params[i] for i, _ in flat],
                       max_bytes, progress, trajectories, alone, frozen_stage=frozen_stage)
    results: list[dict] = [{} for _ in configs]
    paths: list[tuple | None] = [None] * len(configs)
    for j, ((i, rc), run) in enumerate(zip(flat, runs)):
        results[i][rc.federated.warmup_rounds] = run
        if full[i] and j in trajectories:
            paths[i] = trajectories[j]
    return results, paths
