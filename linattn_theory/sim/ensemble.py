"""Many runs as few array programs: :func:`simulate_many` plans configs into ensembles (docs/theory.md §3).

Configs of equal shapes — clients ``m``, samples ``N``, tokens ``n``, dimensions ``d, r, p``,
heads ``H``, local steps ``E``, rounds ``T``, attention, strategy, minibatch size and
participation (:func:`ensemble_key`) — run as one ensemble of :mod:`linattn_theory.sim.rounds`'
round loop (a leading instance axis; everything else may differ per instance). ``engine="auto"``
decides per instance, by one rule for runs alone and in ensembles
(:func:`~linattn_theory.sim.rounds.select_engine`); each result equals
:func:`~linattn_theory.sim.engine.simulate` of the same config bit for bit where both run the
Array-API engine, to rounding across engines.

FedFrozen runs of one instance that differ only in ``T0`` share their warm-up: one trajectory
(the largest ``T0``) runs in the first ensemble and keeps its state at every smaller ``T0``; the
other runs' frozen stages continue from those states in a second ensemble (the numbers are those
of separate runs, bit for bit). The online rule's run of such an instance (``fedfrozen_adaptive``
with ``T0 = T``) is the ``T0 = T`` run until its rule freezes the kernel: its rule observes that
run's states after the first ensemble, as it would in training, and its frozen rounds continue
from the state of the round it stopped in, in the second (:class:`_OnlineReplay`; the run alone,
bit for bit). A warm-up sweep (:mod:`linattn_theory.sim.warmup_grid`) is such a family; with full
batches its trajectory stops at the largest ``T0`` and every frozen stage runs in moment space
(``run_planned(..., frozen_stage="auto")``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from typing import Any

import numpy as np

from ..core.arrays import array_namespace
from ..core.backend import client_working_bytes, get_namespace, resolve_max_bytes
from ..core.clients import StackedClients, check_clients, stack_clients
from ..core.errors import SettingWarning
from ..core.io import provenance, timed_run
from ..core.model import Params
from ..core.seeds import SEED_INIT, seed_sequence
from ..data.families import clients_from_config
from .config import ONLINE_STRATEGY, RunConfig, warmup_family_key
from .rounds import Member, RunResult, run_ensemble
from .strategies import make_strategy

__all__ = ["simulate_many", "checked_inputs", "ensemble_key", "initial_params", "prepare_run", "run_metadata"]
#: the planner's pieces that simulate (sim.engine) and the shared warm-ups (sim.warmup_grid) use
__all__ += ["run_planned", "run_grouped", "EnsemblePlan", "per_config", "data_bytes", "chunk_bytes", "ensemble_bytes"]

#: on NumPy an ensemble holds at most this many bytes of stacked data (more instances form more
#: ensembles, one after the other); on a GPU half the free device memory
CPU_ENSEMBLE_BYTES = 1 << 30


# --------------------------------------------------------------------------------------------
# what an ensemble is
# --------------------------------------------------------------------------------------------
def initial_params(config: RunConfig, d: int, p: int) -> Params:
    """``θ^0``: :meth:`Params.init` seeded from the run's ``SeedSequence`` (purpose ``init``).

    Parameters
    ----------
    config : RunConfig
        The run (its model and seed).
    d, p : int
        Token and output dimensions of the clients.

    Returns
    -------
    Params
        ``θ^0`` (NumPy, float64).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> from linattn_theory.sim.ensemble import initial_params
    >>> params = initial_params(config, d=6, p=2)
    >>> params.WQ.shape, bool((params.WQ == initial_params(config, d=6, p=2).WQ).all())     # (H, d, r); seeded
    ((1, 6, 3), True)
    """
    m = config.model
    return Params.init(d, m.rank, p, heads=m.heads, scale=m.init_scale,
                       seed=seed_sequence(config.seed, SEED_INIT), dtype=np.dtype(m.dtype))


def prepare_run(config: RunConfig, clients=None, params: Params | None = None):
    """``(data, θ^0)`` of ``config``: stacked clients and initial parameters on ``model.backend``.

    Parameters
    ----------
    config : RunConfig
        The run.
    clients : FederatedDataset, optional
        Its clients; default :func:`clients_from_config`.
    params : Params, optional
        ``θ^0``; default :func:`initial_params` (a given one is checked against the clients' shapes).

    Returns
    -------
    data : StackedClients
        The clients, on ``model.backend`` in ``model.dtype``.
    params : Params
        ``θ^0`` there.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> data, params = prepare_run(config)
    >>> data.S.shape, params.WV.shape                      # (m, N, d, d), (H, d, p)
    ((8, 128, 6, 6), (1, 6, 2))
    """
    xp = get_namespace(config.model.backend)
    clients = clients_from_config(config) if clients is None else clients
    data = stack_clients(clients, xp=xp, dtype=np.dtype(config.model.dtype),
                         attention=config.model.attention, temperature=config.model.temperature)
    d, p = data.q.shape[-1], data.y.shape[-1]
    if params is None:
        params = initial_params(config, d, p)
    else:
        from ..core.model import validate_params
        validate_params(params, d, p)
    return data, params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))


def run_metadata(config: RunConfig) -> dict:
    """The metadata record of a run of ``config``: full config, seed, version, git revision and
    whether the tree was modified, and ``provenance`` (host, platform, library versions;
    :func:`~linattn_theory.core.io.provenance`).

    Parameters
    ----------
    config : RunConfig
        The run.

    Returns
    -------
    dict
        The record.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> from linattn_theory.sim.ensemble import run_metadata
    >>> record = run_metadata(config)
    >>> sorted(record), record["config"] == config.to_dict()
    (['config', 'git_dirty', 'git_revision', 'provenance', 'seed', 'version'], True)
    """
    from .. import __version__

    record = provenance()
    top = {key: record.pop(key) for key in ("version", "git_revision", "git_dirty")}
    top["version"] = top["version"] or __version__          # a source tree that is not installed
    return {"config": config.to_dict(), "seed": config.seed, **top, "provenance": record}


def _warn_small_clients(batch_size: int | None, sizes) -> None:
    """Warn when a minibatch is larger than some client's sample count (then drawn with replacement)."""
    if batch_size is None:
        return
    small = int(np.sum(np.asarray(sizes) < batch_size))
    if small:
        warnings.warn(f"federated.batch_size = {batch_size} exceeds the sample count of {small} "
                      f"client(s) (smallest N_c = {int(np.min(sizes))}); their minibatches are drawn "
                      f"with replacement", RuntimeWarning, stacklevel=3)


def ensemble_key(config: RunConfig, data: StackedClients) -> str:
    """The settings and shapes that instances of one ensemble share (as a string key).

    Shapes of the stacked data (``m``, padded ``N``, ``n`` for softmax attention, ``d``, ``p``),
    the model (heads, rank, dtype, backend, attention, temperature, engine) and the schedule's
    structure (strategy, rounds, local steps, minibatch size, participation).

    Parameters
    ----------
    config : RunConfig
        The run.
    data : StackedClients
        Its stacked clients.

    Returns
    -------
    str
        A JSON string; runs of equal keys can run as one ensemble.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import ensemble_key, prepare_run
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> data, _ = prepare_run(config)
    >>> ensemble_key(config, data) == ensemble_key(config.with_updates({"seed": 3}), data)
    True
    >>> ensemble_key(config, data) == ensemble_key(config.with_updates({"federated.rounds": 5}), data)
    False
    """
    model, fed = config.model, config.federated
    shapes = [tuple(data.S.shape), tuple(data.y.shape)]
    if data.attention == "softmax":
        shapes.append(tuple(data.X.shape))
    return json.dumps([shapes, model.heads, model.rank, model.dtype, model.backend, model.attention,
                       model.temperature, model.engine, fed.strategy, fed.rounds, fed.local_steps,
                       fed.batch_size, fed.participation])


# --------------------------------------------------------------------------------------------
# simulate_many: plan the ensembles, share FedFrozen warm-ups, run
# --------------------------------------------------------------------------------------------
def _family_key(config: RunConfig, clients, params) -> str | None:
    """Runs with equal keys share their warm-up: FedFrozen runs that differ only in ``T0`` and the
    online rule's run of their instance (:func:`~linattn_theory.sim.config.warmup_family_key`)."""
    key = warmup_family_key(config)
    if key is None:
        return None
    return json.dumps([key, id(clients) if clients is not None else None,
                       id(params) if params is not None else None])


def _is_online(config: RunConfig) -> bool:
    return config.federated.strategy == ONLINE_STRATEGY


def data_bytes(data: StackedClients) -> int:
    """Bytes of one instance's stacked data (``Ŝ``, ``q``, ``y``, weights, and ``X`` for softmax)."""
    from ..core.backend import itemsize as _itemsize
    arrays = [data.S, data.q, data.y, data.sample_weight] + ([] if data.X is None else [data.X])
    return sum(int(np.prod(tuple(a.shape))) for a in arrays) * _itemsize(data.S.dtype)


def ensemble_bytes(max_bytes, xp) -> int | None:
    """The data budget of one ensemble: ``max_bytes``, or ``"auto"``: :data:`CPU_ENSEMBLE_BYTES` on
    NumPy, half the free device memory on CuPy, unbounded elsewhere."""
    if not isinstance(max_bytes, str):
        return max_bytes
    if max_bytes != "auto":
        raise ValueError(f"max_bytes = {max_bytes!r}: expected a number of bytes, None or 'auto'")
    from array_api_compat import is_cupy_namespace, is_numpy_namespace
    if is_numpy_namespace(xp):
        return CPU_ENSEMBLE_BYTES
    if is_cupy_namespace(xp):
        import cupy
        return cupy.cuda.Device().mem_info[0] // 2           # (free, total) bytes
    return None


def chunk_bytes(data: StackedClients, config: RunConfig, count: int, alone=None) -> int | None:
    """A round's local-step chunk budget: a run alone's ``max_bytes`` (``alone``) resolved by
    :func:`~linattn_theory.core.backend.resolve_max_bytes`, else its policy applied to the
    ensemble's round working set."""
    from array_api_compat import is_numpy_namespace
    from ..core.backend import CPU_CHUNK_BYTES
    heads, batch_size = config.model.heads, config.federated.batch_size
    if alone is not None:
        return resolve_max_bytes(alone, data, heads, batch_size)
    if not is_numpy_namespace(array_namespace(data.S)):
        return None
    total = count * data.S.shape[0] * client_working_bytes(data, heads, batch_size)
    return None if total <= 2 * CPU_CHUNK_BYTES else CPU_CHUNK_BYTES


class EnsemblePlan:
    """Runs waiting for an ensemble, bucketed by :func:`ensemble_key` within a data budget."""

    def __init__(self, budget):
        self.budget = budget
        self.buckets: dict[str, list] = {}
        self.bytes = 0

    def add(self, key, item, size) -> bool:
        """Queue ``item``; ``True`` when the queued data exceed the budget (time to run)."""
        self.buckets.setdefault(key, []).append(item)
        self.bytes += size
        return self.budget is not None and self.bytes >= self.budget

    def drain(self):
        buckets, self.buckets, self.bytes = self.buckets, {}, 0
        return list(buckets.values())


def simulate_many(configs, clients=None, *, params=None, frozen_features=None, strategies=None,
                  max_bytes: int | str | None = "auto", progress: bool = False) -> list[RunResult]:
    """Run every config, in ensembles of equal shapes; the results in the configs' order.

    Each result equals ``simulate(config)`` (:func:`~linattn_theory.sim.engine.simulate`) to
    rounding: the same table, parameters, divergence report and metadata (``metadata["engine"]``
    names the engine that ran it: in an ensemble the fused CPU engine wherever it applies and an
    instance's step is not tiny, :func:`~linattn_theory.sim.rounds.select_engine`).
    ``clients`` and ``params`` are ``None`` or one entry per config (``None`` entries: built from
    the config, as :func:`simulate` does), and so are :func:`simulate`'s hooks ``frozen_features``
    and ``strategies`` (a run with a hook is an instance of its own: it shares no warm-up).
    ``max_bytes`` bounds the data of one ensemble (more instances form more ensembles, run one
    after another; ``"auto"``: 1 GiB on NumPy, half the free memory of a GPU; ``None``: no
    bound); results do not depend on it. FedFrozen runs that
    differ only in ``T0`` share their warm-up, and so does the online rule's run of their instance
    when its ``T0 = T`` run is among them (module docstring); other runs of a strategy that decides
    during the run (a per-round control) run in ensembles too, their control deciding in the round
    loop (:func:`~linattn_theory.sim.rounds.run_ensemble`).

    Parameters
    ----------
    configs : sequence of RunConfig
        The runs, of any sizes and settings (runs of equal shapes form one ensemble).
    clients : sequence of FederatedDataset or None, optional
        One entry per config; ``None`` (or a ``None`` entry): built from the config, as
        :func:`simulate` does.
    params : sequence of Params or None, optional
        Initial parameters, one entry per config; ``None`` (entries): drawn from the config.
    frozen_features : sequence of callable or None, optional
        :func:`simulate`'s ``frozen_features``, one entry per config (``None``: the frozen kernel's).
    strategies : sequence of Strategy or None, optional
        :func:`simulate`'s ``strategy``, one entry per config (``None``: the one the config names).
    max_bytes : int, str or None, default "auto"
        Bound on the data of one ensemble (more instances form more ensembles, run one after
        another; ``"auto"``: 1 GiB on NumPy, half the free memory of a GPU; ``None``: no bound);
        results do not depend on it.
    progress : bool, default False
        Show a progress bar over the ensembles' rounds.

    Returns
    -------
    list of RunResult
        One per config, in the configs' order.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 5, "warmup_rounds": 2}})
    >>> results = lt.simulate_many([config.with_updates({"seed": seed}) for seed in range(3)])
    >>> [len(result.table) for result in results]
    [6, 6, 6]
    >>> alone = lt.simulate(config.with_updates({"seed": 1})).table["loss"]
    >>> bool(abs(results[1].table["loss"] - alone).max() < 1e-9 * alone.abs().max())
    True
    """
    configs, clients = checked_inputs(configs, clients)
    with warnings.catch_warnings():                  # said once above, not again per run
        warnings.simplefilter("ignore", SettingWarning)
        return run_planned(configs, clients, params, max_bytes, progress, strategies=strategies,
                              frozen_features=frozen_features)


def checked_inputs(configs, clients, stacklevel: int = 4):
    """``(configs, clients)`` with the given clients checked
    (:func:`~linattn_theory.core.clients.check_clients`: shapes and finite values, a ``ValueError``
    naming the client and the array) and the settings' warnings issued once
    (:func:`~linattn_theory.sim.limits.setting_notes`), before any round; shared by :func:`simulate_many`
    and :func:`~linattn_theory.sim.engine.simulate` (``stacklevel``: the warnings point at their caller).

    Parameters
    ----------
    configs : iterable of RunConfig
        The runs.
    clients : FederatedDataset, sequence or None
        ``None`` (built from each config), one dataset for all, or one entry (or ``None``) per config.
    stacklevel : int, default 4
        The warnings' ``stacklevel``.

    Returns
    -------
    configs : list of RunConfig
        The runs.
    clients : list of FederatedDataset or None, or None
        One checked dataset (or ``None``) per config; ``None`` where none was given.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import checked_inputs
    >>> config = lt.config_from_dict({"task": {"num_clients": 2, "dim": 2, "outputs": 1, "tokens": 3},
    ...                               "model": {"rank": 2}})
    >>> pairs = [(np.ones((4, 3, 2)), np.ones((4, 2)), np.ones((4, 1))) for _ in range(2)]
    >>> _, [clients] = checked_inputs([config], [pairs])
    >>> clients.weights.tolist()
    [0.5, 0.5]
    >>> pairs[1][0][0, 0, 0] = np.nan
    >>> checked_inputs([config], [pairs])
    Traceback (most recent call last):
    ...
    ValueError: client 1: X holds 1 non-finite value (the first: X[0, 0, 0] = nan); expected finite numbers: ...
    """
    from .limits import setting_notes, warn_settings
    configs = list(configs)
    if clients is not None:
        given, checked = per_config(clients, len(configs), "clients"), {}
        for c in given:                     # one object given for several configs stays one (shared warm-ups)
            if c is not None and id(c) not in checked:
                checked[id(c)] = check_clients(c)
        clients = [None if c is None else checked[id(c)] for c in given]
    given = clients or [None] * len(configs)
    warn_settings((note for config, c in zip(configs, given) if isinstance(config, RunConfig)
                   for note in setting_notes(config, c)), stacklevel=stacklevel)
    return configs, clients


@timed_run
def run_planned(configs, clients, params, max_bytes, progress: bool, trajectories: dict | None = None,
                alone: bool = False, strategies=None, frozen_features=None, frozen_stage: str = "explicit"):
    """Run configs planned into ensembles: :func:`simulate_many` without its input checks (which
    :func:`~linattn_theory.sim.engine.simulate` and :mod:`linattn_theory.sim.warmup_grid` make
    themselves); with a dict ``trajectories``, also ``trajectories[i] = (data, states)``
    for every config ``i`` whose run is a shared warm-up's trajectory, ``T0 = T`` (each copy of a
    config given twice): its stacked clients and its states after rounds ``0..T`` (up to its divergence round), as
    :func:`~linattn_theory.sim.engine.run_schedule` passes them to ``on_round``. ``alone``: runs
    alone (:func:`~linattn_theory.sim.engine.simulate`, :func:`~linattn_theory.sim.warmup_grid.warmup_sweep`),
    whose ``max_bytes`` bounds a round's working set (:func:`~linattn_theory.core.backend.resolve_max_bytes`)
    rather than an ensemble's data.
    ``strategies`` and ``frozen_features``: ``None`` or one hook per config (a
    :class:`~linattn_theory.sim.rounds.Member`'s; a run with one is a family of its own).
    ``frozen_stage``: ``"explicit"``, or ``"auto"``: the frozen stages of the shared warm-ups of
    full-batch runs in moment space (:func:`~linattn_theory.sim.warmup_grid.warmup_sweep`; equal
    to the explicit ones to rounding)."""
    from ..core.curvature import hessian_curvature
    from .step_size import resolve_step_scale
    configs = list(configs)
    count = len(configs)
    for i, config in enumerate(configs):
        if not isinstance(config, RunConfig):
            raise TypeError(f"configs[{i}] is a {type(config).__name__}; expected a RunConfig")
    clients = per_config(clients, count, "clients")
    params = per_config(params, count, "params")
    hooks = list(zip(per_config(strategies, count, "strategies"),
                     per_config(frozen_features, count, "frozen_features")))
    results: list[RunResult | None] = [None] * count
    families: dict = {}
    steps: dict = {}
    for i, config in enumerate(configs):
        key = _family_key(config, clients[i], params[i]) if hooks[i] == (None, None) else None
        families.setdefault(key if key is not None else ("run", i), []).append(i)
    for key, indices in list(families.items()):
        # the online rule's run shares the warm-up of the FedFrozen run with T0 = T (the trajectory
        # it follows until it freezes); without one in the family it is a run of its own, its
        # control deciding in the round loop
        if len(indices) > 1 and not any(configs[i].warmup_rounds == configs[i].federated.rounds
                                        and not _is_online(configs[i]) for i in indices):
            families[key] = [i for i in indices if not _is_online(configs[i])]
            families.update({("run", i): [i] for i in indices if _is_online(configs[i])})
            if not families[key]:
                del families[key]
    if not families:
        return results
    xp = get_namespace(configs[next(iter(families.values()))[0]].model.backend)
    plan = EnsemblePlan(None if alone else ensemble_bytes(max_bytes, xp))
    for key, indices in families.items():
        online = [i for i in indices if _is_online(configs[i])] if len(indices) > 1 else []
        runs = [i for i in indices if i not in online]
        config = configs[runs[0]]
        built = clients_from_config(config) if clients[runs[0]] is None else clients[runs[0]]
        data, theta0 = prepare_run(config, built, params[runs[0]])
        for i in indices:                   # federated.step_scale → η of this instance (sim.step_size)
            configs[i], steps[i] = resolve_step_scale(configs[i], data, theta0, hessian_curvature)
        config = configs[runs[0]]
        _warn_small_clients(config.federated.batch_size, data.sizes)
        _warn_float32_steps(config, data, theta0)
        warmups = sorted({configs[i].warmup_rounds for i in runs})
        family = _Family(runs, configs, data, theta0, built, warmups, online, trajectories, *hooks[runs[0]],
                         moments=frozen_stage != "explicit" and config.federated.batch_size is None)
        if plan.add(ensemble_key(family.trajectory(), data), family, 2 * data_bytes(data)):
            _run_wave(plan.drain(), results, progress, max_bytes if alone else None)
    _run_wave(plan.drain(), results, progress, max_bytes if alone else None)
    for i, record in steps.items():
        results[i].metadata.update(record)
    return results


def _warn_float32_steps(config: RunConfig, data, theta0) -> None:
    """Warn when float32 cannot resolve the run's first local steps
    (:func:`~linattn_theory.sim.limits.float32_step_note`)."""
    if config.model.dtype == "float32":
        from .limits import float32_step_note
        note = float32_step_note(config, data, theta0)
        if note:
            warnings.warn(note, RuntimeWarning, stacklevel=4)


def per_config(values, count: int, what: str) -> list:
    """``values`` as a list of one entry per config (``None``: ``count`` times ``None``); a
    ``ValueError`` naming ``what`` when the count differs."""
    if values is None:
        return [None] * count
    values = list(values)
    if len(values) != count:
        raise ValueError(f"{what}: {len(values)} entries for {count} configs; expected one per config or None")
    return values


def _has_test_split(clients) -> bool:
    """Clients with a held-out test split (the digits family): their runs record test metrics."""
    return "test_X" in (getattr(clients, "truth", None) or {})


@dataclasses.dataclass
class _Family:
    """Runs of one instance: one run, identical copies of it, or FedFrozen runs differing in ``T0``
    (``indices``, their ``T0`` values ``warmups``), and the online rule's runs that follow the
    ``T0 = T`` one until they freeze (``online``). The shared warm-up: the run of the largest ``T0``
    is the trajectory (the first ensemble), kept at every other ``T0``, whose frozen stage then
    continues from there (the second). ``moments``: frozen stages in moment space (full batches,
    :mod:`linattn_theory.sim.warmup_grid`), so the trajectory stops at the largest ``T0`` and
    serves only a ``T0 = T`` run; its runs record no test metrics (no history is kept there)."""

    indices: list[int]
    configs: list
    data: StackedClients
    theta0: Params
    clients: Any
    warmups: list[int]                 # the runs' T0 values, ascending
    online: list[int] = dataclasses.field(default_factory=list)  # the online rule's runs (T0 = T leads)
    trajectories: dict | None = None   # where to hand out a T0 = T lead's states (run_planned)
    strategy: Any = None               # a Member's hooks (a family of one run)
    frozen_features: Any = None
    moments: bool = False
    engine: str | None = None          # the trajectory's (what a moment-space stage reports)
    replays: dict = dataclasses.field(default_factory=dict)   # their _OnlineReplay, by index
    by_T0: dict = dataclasses.field(default_factory=dict)     # the results, by T0
    history: dict = dataclasses.field(default_factory=dict)   # θ^0, θ^1, … of each run (test metrics)

    def lead(self) -> RunConfig:
        """The run of the largest ``T0`` (the others' warm-up trajectory)."""
        return self.configs[self._lead]

    @functools.cached_property
    def _lead(self) -> int:
        """The index of :meth:`lead` (found once: the wave asks for it per run and ``T0``)."""
        return max(self.indices, key=lambda i: self.configs[i].warmup_rounds)

    def trajectory(self) -> RunConfig:
        """The first ensemble's run: the lead, stopped at its ``T0`` for moment-space stages."""
        lead = self.lead()
        if not self.moments:
            return lead
        return dataclasses.replace(lead, federated=dataclasses.replace(lead.federated, rounds=lead.warmup_rounds))

    def served(self) -> int | None:
        """The ``T0`` whose run the trajectory is (``None``: a trajectory stopped before ``T``)."""
        trajectory = self.trajectory()
        return trajectory.warmup_rounds if trajectory.federated.rounds == self.lead().federated.rounds else None

    def every_state(self) -> bool:
        """Whether the trajectory keeps its state after every round: for the online rule's runs, and
        when its states are asked for and it is plain FedAvg (``T0 = T``)."""
        return bool(self.online) or (self.trajectories is not None and self.served() == self.lead().federated.rounds)

    def member(self) -> Member:
        """The trajectory as a :class:`~linattn_theory.sim.rounds.Member`, kept at every stage's ``T0``."""
        T = self.trajectory().federated.rounds
        keep = range(T + 1) if self.every_state() else [T0 for T0 in self.warmups if T0 != self.served()]
        return Member(self.trajectory(), self.data, self.theta0, checkpoints=tuple(keep), strategy=self.strategy,
                      frozen_features=self.frozen_features)


def run_grouped(members: list[Member], key, **options) -> list[tuple]:
    """:func:`~linattn_theory.sim.rounds.run_ensemble` (``options``) of each group of ``members``
    with equal ``key(member)``; the outcomes in the members' order."""
    groups: dict = {}
    for j, member in enumerate(members):
        groups.setdefault(key(member), []).append(j)
    outcomes: list = [None] * len(members)
    for js in groups.values():
        for j, outcome in zip(js, run_ensemble([members[j] for j in js], **options)):
            outcomes[j] = outcome
    return outcomes


def _run_wave(buckets: list[list[_Family]], results: list, progress: bool, alone) -> None:
    """Run the families of each bucket: their trajectories as one ensemble, then the frozen stages
    of the shared warm-ups (grouped by their rounds ``T``, in moment space for ``moments``
    families); store each result at its configs' positions. ``alone``: ``None``, or the
    ``max_bytes`` of runs alone (:func:`run_planned`)."""
    for families in buckets:
        chunk = chunk_bytes(families[0].data, families[0].lead(), len(families), alone)
        keep = any(_has_test_split(f.clients) and not f.moments for f in families)
        outcomes = run_ensemble([f.member() for f in families], max_bytes=chunk, keep_history=keep,
                                progress=progress)
        second, owners = [], []
        for family, (result, states, history) in zip(families, outcomes):
            family.engine = result.metadata["engine"]
            if family.trajectories is not None and family.every_state():
                path = (family.data, [states[t] for t in sorted(states)])
                family.trajectories.update({i: path for i in family.indices
                                            if family.configs[i].warmup_rounds == family.served()})
            for T0 in family.warmups:
                config = next(family.configs[i] for i in family.indices if family.configs[i].warmup_rounds == T0)
                if T0 == family.served():
                    family.by_T0[T0], family.history[T0] = result, history
                elif result.diverged and T0 >= result.divergence.round:     # diverged in its warm-up
                    family.by_T0[T0] = _copy(result, warmup_rounds=T0)
                    family.history[T0] = history
                else:
                    second.append(Member(config, family.data, states[T0].params, prefix=states[T0]))
                    owners.append((family, T0))
            for i in family.online:          # the online rule's runs: its control replayed on the lead
                replay = family.replays[i] = _OnlineReplay(family.configs[i], family.data, result, states)
                family.by_T0[("online", i)], family.history[("online", i)] = result, history
                if replay.freeze is not None:
                    second.append(replay.continuation())
                    owners.append((family, ("online", i)))
        moments = families[0].moments        # one setting per bucket (it follows federated.batch_size)
        for (family, T0), (result, _, history) in zip(owners, run_grouped(
                second, lambda mb: mb.config.federated.rounds, engine="moments" if moments else None,
                max_bytes=chunk, keep_history=keep, progress=progress)):
            family.by_T0[T0] = result
            if moments:
                result.metadata["engine"] = family.engine
            if keep:                  # the shared warm-up's θ^0..θ^T0, then the run's own
                lead = family.served()
                if isinstance(T0, tuple):     # an online run: θ^0..θ^t, then its frozen rounds
                    t = family.replays[T0[1]].stop_round
                    family.history[T0] = family.history[lead][:t + 1] + history[1:]
                else:
                    family.history[T0] = family.history[lead][:T0] + history
        for family in families:
            tests = _test_scores(family) if keep else {}
            for i in family.online + family.indices:     # each result its own (copies of a config share one)
                config = family.configs[i]
                key = ("online", i) if i in family.online else config.warmup_rounds
                result = family.by_T0[key]
                if i in family.online:
                    result = family.replays[i].result(result)
                elif any(results[j] is result for j in family.indices if results[j] is not None):
                    result = _copy(result)
                result.metadata.update(run_metadata(config))
                _add_test_metrics(result, tests.get(key))
                results[i] = result


def _copy(result: RunResult, **metadata) -> RunResult:
    """``result`` with its own table and metadata (``metadata`` set there)."""
    return dataclasses.replace(result, table=result.table.copy(), metadata=dict(result.metadata, **metadata))


class _OnlineReplay:
    """The online rule's run (:data:`~linattn_theory.sim.config.ONLINE_STRATEGY`, ``T0 = T``) from the
    ``T0 = T`` run it follows until it freezes (docs/theory.md §8).

    Its control observes that run's states ``θ^0, θ^1, …`` as :func:`~linattn_theory.sim.engine.run_schedule`
    shows them in training (up to the round before a divergence); where it freezes at a round
    ``t < T``, the run continues from round ``t``'s state with the freeze's parameters and only
    ``W_V`` training (:meth:`continuation`, a FedFrozen member with ``T0 = t``). :meth:`result` is
    then the run :func:`~linattn_theory.sim.engine.simulate` makes alone.
    """

    def __init__(self, config: RunConfig, data: StackedClients, lead: RunResult, states: dict):
        self.config, self.data = config, data
        self.strategy = make_strategy(config.federated, config.warmup_rounds)
        T = config.federated.rounds
        self.freeze = self.stop_round = None
        for t in range(lead.divergence.round if lead.diverged else T + 1):
            decision = self.strategy.control.observe(states[t], data)
            if decision is not None:
                if t < T:              # a freeze at round T changes nothing (run_schedule's _observe)
                    self.freeze, self.stop_round = decision, t
                break
        self.state = None if self.stop_round is None else states[self.stop_round]

    def continuation(self) -> Member:
        """The frozen rounds ``t..T−1`` from round ``t``'s state, with ``θ^{kernel_round}``."""
        t, P = self.stop_round, self.freeze.params
        config = self.config.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": t})
        return Member(config, self.data, P, prefix=self.state._replace(params=P, warmup_params=P))

    def result(self, run: RunResult) -> RunResult:
        """The online run's result from the lead's (no freeze) or the continuation's ``run``."""
        result = _copy(run, warmup_rounds=self.config.warmup_rounds, strategy=self.strategy.name)
        result.table["strategy"] = self.strategy.name
        result.metadata.update(self.strategy.control.finish(result))
        return result


def _test_scores(family: "_Family") -> dict:
    """The test loss and accuracy of every round of each run of ``family`` whose clients have a test split
    (``truth["test_X"]``, :mod:`linattn_theory.data.digits`), from the runs' parameters ``θ^0, θ^1, …``:
    ``{run key: [{"loss", "accuracy"} per round]}``, every run scored in one call
    (:func:`~linattn_theory.data.digits.evaluate_history`: the test features once per distinct kernel, which the
    runs' shared warm-up and each frozen stage share; each run's numbers those of scoring it alone)."""
    if not _has_test_split(family.clients):
        return {}
    from ..data.digits import evaluate_history
    truth, model = family.clients.truth, family.lead().model      # one instance: one model
    keys = [key for key, history in family.history.items() if history is not None]
    every = [theta for key in keys for theta in family.history[key]]
    with np.errstate(all="ignore"):
        scores = evaluate_history(every, truth["test_X"], truth["test_q"], truth["test_y"], model.attention,
                                  model.temperature)
    ends = np.cumsum([len(family.history[key]) for key in keys])
    return {key: scores[end - len(family.history[key]):end] for key, end in zip(keys, ends)}


def _add_test_metrics(result: RunResult, test) -> None:
    """Test loss and accuracy per round (columns ``test_loss``, ``test_accuracy``; metadata ``test``,
    the last round's) from ``test``, the run's scores per round (:func:`_test_scores`; ``None``: none)."""
    if test is None:
        return
    for key in ("loss", "accuracy"):
        result.table[f"test_{key}"] = [test[t][key] for t in result.table["round"]]
    result.metadata["test"] = test[int(result.table["round"].iloc[-1])]
