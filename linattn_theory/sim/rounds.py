"""The round loop: every run is an ensemble, one array program with a leading instance axis (docs/theory.md §3).

Round ``t``: the server sends ``θ^t``; each participating client runs ``E`` local gradient
steps with step ``η`` on its own ``F_{λ,c}`` (full batch or minibatches of size ``b``), plus the
strategy's gradient correction (FedProx, SCAFFOLD); the server takes the strategy's step on the
weighted mean delta ``Δ = Σ_c p̃_c θ_c − θ^t`` (``p̃_c`` the weights renormalised over the
participants; FedAvg: ``θ^t + η_s Δ``). The strategy's schedule says which blocks train in round
``t``: FedFrozen ("FedFrozen: Two-Stage Federated Optimization via Attention Kernel Freezing",
arXiv:2605.06446) updates every block for ``t < T0`` and only ``W_V`` afterwards (``W_Q``,
``W_K`` are never touched, so they stay bit-identical); FedAvg (McMahan et al. 2017) is
``T0 = T``. The strategies live in :mod:`linattn_theory.sim.strategies`, one module each.

:func:`run_ensemble` runs instances of equal shapes — clients ``m``, samples ``N``, tokens ``n``,
dimensions ``d, r, p``, heads ``H``, local steps ``E``, rounds ``T``, attention, strategy,
minibatch size and participation — as one program whose arrays carry a leading instance axis,
as ``jax.vmap`` would: the server parameters are ``(I, 1, H, d, r)``, the clients' local models
``(I, k, H, d, r)``, the data ``(I, m, N, ...)``. Everything else is per instance: the seed (so
the data, the initialisation, the participation and minibatch draws), the step size ``η``, the
warm-up length ``T0``, the ridge ``λ``, the divergence threshold and the strategy's parameters.
A run alone (:func:`~linattn_theory.sim.engine.run_schedule`, :func:`~linattn_theory.simulate`)
is an ensemble of one; many (:func:`~linattn_theory.sim.ensemble.simulate_many`) are planned
into ensembles of equal shapes.

Each round groups the instances by what they do in it (the blocks their schedule trains: a
FedFrozen instance past its ``T0`` trains ``W_V`` only, on features computed once at its frozen
kernel) and runs each group's local steps at once on one of three backends: the Array-API path
(any backend: NumPy, CuPy, array-api-strict), the fused CPU kernels
(:mod:`linattn_theory.core.fused`, one thread per (instance, client) work item;
:func:`select_engine`), or, for a frozen stage continued from its round-``T0`` state with full
batches, moment space (each client's local steps an affine map of ``W_V``, docs/theory.md §4–5;
:mod:`linattn_theory.sim.warmup_grid`). The rest of a round — participants and weights, the
strategy's client and server rules, drifts, ``F`` and ``F_λ``, best iterate and divergence,
table rows — is written once, for all three. Every instance's arithmetic is
its own, so a result does not depend on which instances share its ensemble, on the chunking
(``max_bytes``) or on the number of threads or workers (bit for bit on the CPU).

Nothing is synchronised with the host inside a round, but for the instances whose ``on_round``
hook or strategy :class:`~linattn_theory.sim.strategies.Control` sees every round's state: the
table's numbers stay on the device until the run ends, and divergence — ``F_λ`` non-finite or
above ``divergence_factor·F_λ(θ^0)`` — is detected per instance from them afterwards; a diverged
instance reports its own round and a stable step size while the others go on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..core import fused as _fused
from ..core.arrays import array_namespace, sq_norms, to_numpy
from ..core.backend import client_chunks, client_working_bytes
from ..core.clients import StackedClients
from ..core.curvature import hessian_curvature, stable_learning_rate
from ..core.errors import ConfigError
from ..core.frozen_map import frozen_client_map
from ..core.moments import ValueMoments, value_moments, value_objective
from ..core.model import (BLOCKS, Params, flat as _flat, kernel, loss_and_grad_from_inputs,
                          value_matrix as _value_matrix)
from ..core.seeds import SEED_MINIBATCH, SEED_PARTICIPATION, seed_sequence
from .config import RunConfig, section_settings
from .strategies import Round, Strategy, make_strategy
from .strategies.base import freeze_after, local_sgd, take_rows, weighted_sum

__all__ = ["run_ensemble", "Member", "RunResult", "RunState", "Divergence", "select_engine", "objective"]

@dataclass(frozen=True)
class Divergence:
    """A run stopped because ``F`` became non-finite or exceeded the threshold.

    Parameters
    ----------
    round : int
        The round at which it stopped.
    loss : float
        ``F`` there.
    stable_learning_rate : float
        The value block's stability limit at the initial kernel (:func:`stable_learning_rate`).
    message : str
        What happened and what to try.

    Examples
    --------
    >>> import warnings
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2, "learning_rate": 50.0}})
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     result = lt.simulate(config)
    >>> result.diverged, result.divergence.round, result.divergence.message.startswith("diverged at round 1")
    (True, 1, True)
    """

    round: int
    loss: float
    stable_learning_rate: float
    message: str

    @classmethod
    def deferred(cls, round: int, loss: float, advice: Callable[[], tuple[float, str]]) -> Divergence:
        """A divergence whose ``stable_learning_rate`` and ``message`` are ``advice()``, computed when
        first read (then kept; a pickled or compared report computes them first): the stable step
        costs a curvature power iteration, and most analyses read only that a run diverged."""
        report = object.__new__(cls)
        for name, value in (("round", round), ("loss", loss), ("_advice", advice)):
            object.__setattr__(report, name, value)
        return report

    def __getattr__(self, name: str):
        advice = self.__dict__.get("_advice")
        if advice is None or name not in ("stable_learning_rate", "message"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        step, message = advice()
        object.__setattr__(self, "stable_learning_rate", step)
        object.__setattr__(self, "message", message)
        del self.__dict__["_advice"]
        return getattr(self, name)

    def __getstate__(self) -> dict:
        self.message                                         # computed before it leaves the process
        return dict(self.__dict__)


class DivergenceFields(Mapping):
    """A run's ``metadata["divergence"]``: its :class:`Divergence`'s fields as a read-only mapping, each
    read from the report when asked for (a deferred report computes its stable step then)."""

    __slots__ = ("divergence",)
    FIELDS = ("round", "loss", "stable_learning_rate", "message")

    def __init__(self, divergence: Divergence):
        self.divergence = divergence

    def __getitem__(self, key: str):
        if key not in self.FIELDS:
            raise KeyError(key)
        return getattr(self.divergence, key)

    def __iter__(self):
        return iter(self.FIELDS)

    def __len__(self) -> int:
        return len(self.FIELDS)

    def __repr__(self) -> str:
        return repr(dict(self))


@dataclass
class RunResult:
    """The outcome of one run: the per-round table, the final and the round-``T0`` parameters.

    Parameters
    ----------
    table : pandas.DataFrame
        One row per round ``t = 0..T`` (``θ^t``): ``loss``, ``loss_regularized``, drift columns,
        participants, ``client_loss_c`` … (docs/cli.md, "What a run writes").
    params : Params
        The final parameters ``θ^T``.
    warmup_params : Params
        The parameters at round ``T0``, ``θ^{T0}`` (the frozen kernel's).
    divergence : Divergence, optional
        Where and why the run diverged (``None``: it did not; ``diverged`` says so).
    metadata : dict, optional
        The configuration, seed, version, provenance and the engine used.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> result = lt.simulate(lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}))
    >>> result.table["round"].tolist(), result.params.WV.shape, result.diverged
    ([0, 1, 2, 3, 4], (1, 6, 2), False)
    >>> bool((result.warmup_params.WQ == result.params.WQ).all())    # FedFrozen: W_Q frozen after T0
    True
    """

    table: pd.DataFrame
    params: Params
    warmup_params: Params
    divergence: Divergence | None = None
    metadata: dict = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.divergence is not None


class RunState(NamedTuple):
    """Everything the round loop carries into round ``round``; a run continues from it exactly.

    :func:`run_schedule` passes one to ``on_round`` after every round and continues from one
    given as ``prefix``. ``rows`` are the table rows ``0..round``; ``initial`` (``θ^0``),
    ``best`` (the iterate of least ``F_λ`` so far, ``best_loss``) feed the divergence report;
    ``warmup_params`` is ``θ^{T0}`` once reached (else ``None``); ``client_state`` and
    ``server_state`` are the strategy's (control variates, server momentum, ...).

    Parameters
    ----------
    round : int
        The round reached.
    params : Params
        ``θ^round``.
    rows : tuple of dict
        The table rows so far.
    initial : Params
        ``θ^0``.
    best : Params
        The iterate of least ``F_λ`` so far.
    best_loss : float
        Its ``F_λ``.
    warmup_params : Params or None
        ``θ^{T0}`` once reached.
    client_state, server_state : object
        The strategy's states.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> data, params = prepare_run(config)
    >>> states = []
    >>> run = lt.run_schedule(params, data, config.federated, warmup_rounds=2, seed=config.seed,
    ...                       on_round=states.append)
    >>> [state.round for state in states], states[1].warmup_params is None, states[2].warmup_params is None
    ([0, 1, 2, 3, 4], True, False)
    >>> later = lt.run_schedule(states[2].params, data, config.federated, warmup_rounds=2, seed=config.seed,
    ...                         prefix=states[2])                     # continues exactly
    >>> later.table["loss"].tolist() == run.table["loss"].tolist()
    True
    """

    round: int
    params: Params
    rows: tuple
    initial: Params
    best: Params
    best_loss: float
    warmup_params: Params | None
    client_state: Any
    server_state: Any


#: federated settings that may differ between the instances of one ensemble (the engine's own:
#: step size, ridge, warm-up length, divergence threshold) — the strategy's parameters may differ
#: too, but split the rule groups of a round (:func:`_rule_key`)
ENGINE_SETTINGS = ("learning_rate", "ridge", "warmup_rounds", "divergence_factor")


#: strategies whose server rule reads one run's own state: the value solve's server steps to the
#: ``V*`` its run's control computed from that run's clients, so every instance is a rule group of
#: its own (sharing the first instance's rule set every instance's ``V`` to the first's ``V*``)
RULES_PER_RUN = ("value_solve", "value_solve_final")


def _rule_key(member: "Member") -> str:
    """Instances whose strategy rules are the same functions: every federated setting but the
    engine's (a member's own :class:`~linattn_theory.sim.strategies.Strategy` object: its own group;
    each instance its own group for :data:`RULES_PER_RUN`)."""
    if member.config.federated.strategy in RULES_PER_RUN:
        return json.dumps(["per run", id(member)])
    fed = {k: v for k, v in section_settings(member.config.federated).items() if k not in ENGINE_SETTINGS}
    return json.dumps([fed, None if member.strategy is None else id(member.strategy)], sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True)
class Member:
    """One instance of an ensemble: its config, stacked clients and parameters at the start round.

    ``prefix``: continue from this :class:`~linattn_theory.sim.rounds.RunState` (``params`` must be
    ``prefix.params``; its strategy states in ensemble form, as :func:`run_ensemble` returns
    them); ``checkpoints``: rounds whose state :func:`run_ensemble` returns. The hooks of
    :func:`~linattn_theory.sim.engine.run_schedule`: ``strategy`` replaces the one the config
    names, ``T0`` its warm-up length, ``frozen_features(params) -> φ`` ``(m, N, H·d)`` the
    frozen stage's features, and ``on_round(state)`` sees the member's
    :class:`~linattn_theory.sim.rounds.RunState` after every round (as does the strategy's
    :class:`~linattn_theory.sim.strategies.Control`, which may freeze the kernel).

    Parameters
    ----------
    config : RunConfig
        The run.
    data : StackedClients
        Its stacked clients (:func:`~linattn_theory.sim.ensemble.prepare_run`).
    params : Params
        ``θ^start``: ``θ^0``, or ``prefix.params``.
    prefix : RunState, optional
        The state to continue from (default: start at round 0).
    checkpoints : tuple of int, default ()
        Rounds whose :class:`RunState` :func:`run_ensemble` returns.
    strategy : Strategy, optional
        Replaces the strategy ``config`` names.
    T0 : int, optional
        Warm-up length; default ``config.warmup_rounds``.
    frozen_features : callable, optional
        ``frozen_features(params) -> φ`` ``(m, N, H·d)``, the frozen stage's features.
    on_round : callable, optional
        ``on_round(state)``, called with the member's :class:`RunState` after every round.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.sim.rounds import Member
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> member = Member(config, *prepare_run(config), checkpoints=(2,))
    >>> member.start, member.warmup_rounds, member.make_strategy().name
    (0, 2, 'fedfrozen')
    """

    config: RunConfig
    data: StackedClients
    params: Params
    prefix: RunState | None = None
    checkpoints: tuple[int, ...] = ()
    strategy: Strategy | None = None
    T0: int | None = None
    frozen_features: Callable | None = None
    on_round: Callable | None = None

    @property
    def start(self) -> int:
        return 0 if self.prefix is None else self.prefix.round

    @property
    def warmup_rounds(self) -> int:
        return self.config.warmup_rounds if self.T0 is None else self.T0

    def make_strategy(self) -> Strategy:
        return make_strategy(self.config.federated, self.warmup_rounds) if self.strategy is None else self.strategy


def _why_not(xp, data, fed, strategy) -> str | None:
    """The reason the fused engine does not apply to this run, or ``None`` when it does."""
    from array_api_compat import is_numpy_namespace

    if not is_numpy_namespace(xp):
        return "it runs on NumPy arrays only (use the Array-API engine on other backends)"
    if np.dtype(data.S.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        return f"dtype {data.S.dtype} is not float32 or float64"
    if fed.batch_size is not None:
        return "it runs full-batch local steps only (federated.batch_size is set)"
    if strategy.client.correction is not local_sgd().correction:
        return (f"strategy {strategy.name!r} corrects the local gradients (FedProx, SCAFFOLD); "
                f"the fused engine runs plain local steps only")
    if not _fused.numba_available():
        return "numba is not installed (pip install numba)"
    return None


def select_engine(engine: str, xp, data, fed, strategy, *, instances: bool = False,
                  sources=None) -> "_fused.FusedEngine | None":
    """The :class:`FusedEngine` of a run, or ``None`` for the Array-API engine (see the module doc).

    ``engine="auto"`` takes the fused engine where it applies and one instance's local step is
    large enough: ``m·N·d²`` (its clients ``m``, padded samples ``N``, dimension ``d``: the
    multiply-adds of one product with every ``Ŝ``) at least
    :data:`~linattn_theory.core.fused.MIN_STEP_WORK` (``2¹⁴``): from there the fused engine took
    1.4–2.1× less time per instance than the Array-API engine, alone and in an ensemble of 8
    (``benchmarks/engine_threshold.py``, 40 rounds; 7–8 ms saved per run at ``2¹⁴``, 2–4 ms at
    ``2¹²``), and importing numba and loading its cached kernels, 0.36–0.48 s once per process, is
    repaid within a few dozen such runs (a figure or a sweep makes hundreds). One rule for every instance, alone or in an ensemble: a rule of the instance
    alone, so that its engine depends neither on the others in its ensemble nor on whether it has
    any (``simulate(config)`` and ``simulate_many([config, …])`` run the same engine). Softmax
    attention runs it only up to :data:`~linattn_theory.core.fused.MAX_SOFTMAX_CONTEXT` numbers per
    context (``n·d ≤ 256``: a tile of contexts fits the L1 cache; beyond, its kernels were slower).

    Parameters
    ----------
    engine : {"auto", "array_api", "fused"}
        The engine asked for (``model.engine``).
    xp : module
        The array namespace.
    data : StackedClients
        The clients.
    fed : FederatedConfig
        The schedule.
    strategy : Strategy
        The strategy.
    instances : bool, default False
        ``data`` is an ensemble's (a leading instance axis, :mod:`linattn_theory.sim.ensemble`).
    sources : array of int, optional
        Each instance's row of ``data`` when ``data`` holds an ensemble's distinct clients
        (:class:`~linattn_theory.core.fused.FusedEngine`).

    Returns
    -------
    FusedEngine or None
        The engine.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.sim.rounds import select_engine
    >>> from linattn_theory.sim.strategies import make_strategy
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> data, _ = prepare_run(config)
    >>> strategy = make_strategy(config.federated, 2)
    >>> select_engine("array_api", np, data, config.federated, strategy) is None
    True
    >>> small = lt.config_from_dict({"task": {"num_clients": 4, "samples_per_client": 64, "dim": 4}})
    >>> data, _ = prepare_run(small)
    >>> select_engine("auto", np, data, small.federated, strategy) is None     # m·N·d² = 4·64·16 < 2¹⁴
    True
    """
    if engine not in _fused.ENGINES:
        raise ConfigError(f"engine = {engine!r}: expected one of {', '.join(map(repr, _fused.ENGINES))}")
    if engine == "array_api":
        return None
    reason = _why_not(xp, data, fed, strategy)
    if engine == "fused" and reason is not None:
        raise ConfigError(f"engine = 'fused' does not apply: {reason}; use engine = 'auto' or 'array_api'")
    m, N, d = data.S.shape[-4], data.S.shape[-3], data.S.shape[-1]
    wide = getattr(data, "attention", "linear") == "softmax" and data.X.shape[-2] * d > _fused.MAX_SOFTMAX_CONTEXT
    if engine == "auto" and (reason is not None or m * N * d * d < _fused.MIN_STEP_WORK or wide):
        return None
    return _fused.FusedEngine(data, instances, sources)


def objective(xp, weights, losses, WV, ridge):
    """``F = Σ_c p_c F_c`` and ``F_λ = F + ½λ‖W_V‖²`` (docs/theory.md §1), in the run's dtype.

    ``weights`` and ``losses`` ``(..., m)``, ``WV`` with the same leading axes ``(...)`` and
    ``ridge`` ``λ`` an array of the run's dtype, ``()`` or ``(...)``: one run, an ensemble
    (leading instance axis) and the moment-space frozen stages compute the table's ``F`` and
    ``F_λ`` with this one function, so that they agree bit for bit in every dtype.

    Parameters
    ----------
    xp : module
        The array namespace.
    weights : array, shape (..., m)
        Client weights ``p_c``.
    losses : array, shape (..., m)
        Client losses ``F_c``.
    WV : array, shape (..., H, d, p)
        Value blocks, with the leading axes of ``losses``.
    ridge : array, shape () or (...)
        ``λ``, in the run's dtype.

    Returns
    -------
    F : array, shape (...)
        ``Σ_c p_c F_c``.
    F_reg : array, shape (...)
        ``F_λ = F + ½λ‖W_V‖²``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.rounds import objective
    >>> F, F_reg = objective(np, np.array([0.25, 0.75]), np.array([2.0, 4.0]), np.ones((1, 2, 1)), np.float64(0.5))
    >>> float(F), float(F_reg)                 # 0.25·2 + 0.75·4; + ½·0.5·2
    (3.5, 4.0)
    """
    F = xp.sum(weights * losses, axis=-1)
    WV = xp.reshape(WV, tuple(F.shape) + (-1,))
    return F, F + 0.5 * ridge * xp.sum(WV * WV, axis=-1)


# --------------------------------------------------------------------------------------------
# arrays with an instance axis
# --------------------------------------------------------------------------------------------
def _stack(xp, arrays):
    if len(arrays) == 1:                  # an ensemble of one: a view, not a copy
        return xp.reshape(xp.asarray(arrays[0]), (1,) + tuple(arrays[0].shape))
    return xp.stack([xp.asarray(a) for a in arrays], axis=0)


#: the arrays of :class:`~linattn_theory.core.clients.StackedClients` (``X``: softmax attention only)
_DATA_ARRAYS = ("S", "q", "y", "sample_weight", "weights", "X")


def _stack_data(xp, members) -> StackedClients:
    """The members' clients stacked on a leading instance axis (``sizes`` ``(I, m)`` on the host)."""
    first = members[0].data
    return dataclasses.replace(first, sizes=np.stack([np.asarray(mb.data.sizes) for mb in members]), **{
        f: None if getattr(first, f) is None else _stack(xp, [getattr(mb.data, f) for mb in members])
        for f in _DATA_ARRAYS})


def _slice_data(data: StackedClients, lo: int, hi: int) -> StackedClients:
    if lo == 0 and hi == data.S.shape[0]:
        return data
    return dataclasses.replace(data, sizes=data.sizes[lo:hi], **{
        f: None if getattr(data, f) is None else getattr(data, f)[lo:hi, ...] for f in _DATA_ARRAYS})


def _take_data(xp, data: StackedClients, rows: np.ndarray) -> StackedClients:
    """The rows ``rows`` of stacked clients, a copy (what stacking those instances' clients gives)."""
    index = xp.asarray(rows)
    return dataclasses.replace(data, sizes=data.sizes[rows], **{
        f: None if getattr(data, f) is None else xp.take(getattr(data, f), index, axis=0) for f in _DATA_ARRAYS})


def _where(xp, mask, new, old):
    """``new`` where ``mask`` (device bool ``(I,)``), else ``old``; for arrays and Params (a NumPy
    mask that is all true or all false picks one side whole: the same values, no copies)."""
    if isinstance(mask, np.ndarray) and (mask.all() or not mask.any()):
        return new if mask.all() else old
    if isinstance(new, Params):
        return new.map(lambda a, b: _where(xp, mask, a, b), old)
    return xp.where(xp.reshape(mask, (-1,) + (1,) * (new.ndim - 1)), new, old)


def _tree_map(fn, *trees):
    """``fn`` on the array leaves of equal-structured trees (dict, tuple, list, Params, None)."""
    first = trees[0]
    if first is None:
        return None
    if isinstance(first, Params):
        return Params(*(_tree_map(fn, *(getattr(t, b) for t in trees)) for b in BLOCKS))
    if isinstance(first, dict):
        return {k: _tree_map(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_tree_map(fn, *parts) for parts in zip(*trees))
    return fn(*trees)


def _assemble(xp, pieces, old, count: int):
    """The full ``(I, ...)`` tree from group ``pieces`` ``[(lo, hi, tree)]`` (sorted, disjoint);
    instances in no piece keep ``old`` (which may be ``None`` when the pieces cover everything)."""
    if len(pieces) == 1 and pieces[0][0] == 0 and pieces[0][1] == count:
        return pieces[0][2]
    parts, at = [], 0
    for lo, hi, tree in pieces:
        if lo > at:
            parts.append(_tree_map(lambda a: a[at:lo, ...], old))
        parts.append(tree)
        at = hi
    if at < count:
        parts.append(_tree_map(lambda a: a[at:count, ...], old))
    return _tree_map(lambda *a: xp.concat(a, axis=0), *parts)


def instance_setting(xp, values, dtype, ndim: int = 5):
    """One setting (``η``, ``λ``, the server's step) of every instance of a group: the number itself when all are equal, else a
    device array ``(I, 1, …)`` of ``ndim`` dimensions that broadcasts against the blocks
    ``(I, k, H, d, r)`` (the same arithmetic either way)."""
    if len(set(values)) == 1:
        return values[0]
    return xp.reshape(xp.asarray(np.asarray(values, dtype=np.float64), dtype=dtype), (-1,) + (1,) * (ndim - 1))


# --------------------------------------------------------------------------------------------
# one round of one group
# --------------------------------------------------------------------------------------------
def _select_clients(xp, a, part: np.ndarray, lo: int, hi: int):
    """Rows ``part[:, lo:hi]`` of ``a`` ``(I, m, ...)``: the participants of a chunk, per instance."""
    m = a.shape[1]
    if part.shape[1] == m:
        return a if (lo, hi) == (0, m) else a[:, lo:hi, ...]
    return take_rows(a, part[:, lo:hi])


def _take(xp, a, axes: int, idx: np.ndarray):
    """Entries ``idx`` (flat indices into the first ``axes`` axes of ``a``) of ``a``, shaped
    ``idx.shape + a.shape[axes:]`` (minibatch samples ``(I, k, b)`` of ``(I, m, N, ...)``)."""
    rest = tuple(a.shape[axes:])
    rows = xp.take(xp.reshape(a, (-1,) + rest), xp.asarray(idx.reshape(-1)), axis=0)
    return xp.reshape(rows, idx.shape + rest)


def _local_training(xp, P: Params, rnd: Round, lo: int, hi: int, client_rule, client_state,
                    inputs: tuple, data: StackedClients, batches, eta, lam, batch_size) -> dict:
    """``E`` local steps ``θ_c ← θ_c − η (∇F_{λ,c}(θ_c) + correction)`` from ``θ^t`` of the
    participants ``[:, lo:hi]`` of every instance of a group (docs/theory.md §3).

    ``P`` blocks ``(I, 1, H, d, r)``, ``inputs`` ``(φ,)`` (kernel frozen) or ``(Ŝ, q)`` / ``(X, q)``
    for all clients; ``batches`` the minibatches' flat sample indices ``(I, k, E, b)`` (``None``:
    full batches). Returns the trained blocks ``{b: θ_{c,b}}`` ``(I, hi−lo, ...)`` of the chunk;
    the client rule sees the chunk's ``Round``.
    """
    part = rnd.participants
    k = hi - lo
    if k < part.shape[1]:
        rnd = rnd._replace(participants=part[:, lo:hi], client_weights=rnd.client_weights[:, lo:hi],
                           weights=rnd.weights[:, lo:hi])
    I = P.WV.shape[0]
    anchor = {b: getattr(P, b) for b in rnd.blocks}
    broadcast = {b: xp.broadcast_to(getattr(P, b), (I, k) + tuple(getattr(P, b).shape[2:]))
                 for b in BLOCKS}
    local = {b: broadcast[b] for b in rnd.blocks}
    if batches is None:
        batch = tuple(_select_clients(xp, a, part, lo, hi) for a in inputs + (data.y, data.sample_weight))
    for e in range(rnd.local_steps):
        if batches is not None:
            step = tuple(_take(xp, a, 3, batches[:, lo:hi, e, :]) for a in inputs + (data.y,))
            batch = step + (xp.full(tuple(step[0].shape[:3]), 1.0 / batch_size, dtype=step[0].dtype),)
        grads = _local_gradients(xp, {**broadcast, **local}, rnd.blocks, batch, len(inputs) == 1,
                                 data.attention, data.temperature)
        correction = client_rule.correction(client_state, rnd, anchor, local)
        for b in rnd.blocks:
            g = grads[b] + lam * local[b] if b == "WV" else grads[b]
            if b in correction:
                g = g + correction[b]
            local[b] = local[b] - eta * g
    return local


def _local_gradients(xp, local: dict, blocks, batch, kernel_frozen: bool,
                     attention: str = "linear", temperature: float = 1.0) -> dict:
    """``∇F_c`` of the trained blocks for every participant (without ridge and corrections).

    With the kernel frozen ``batch = (φ, y, w)`` and the model is linear, ``ŷ = V^T φ``:
    ``∇_V = Σ_i w_i φ_i e_i^T``; otherwise ``batch = (Ŝ, q, y, w)`` and the closed-form gradients
    of :func:`~linattn_theory.core.model.loss_and_grad_from_moments` apply (softmax attention:
    ``batch = (X, q, y, w)``, :func:`~linattn_theory.core.model.loss_and_grad_from_contexts`).
    """
    if kernel_frozen:
        phi, y, w = batch
        WV = local["WV"]
        err = (xp.matmul(phi, _value_matrix(xp, WV)) - y) * w[..., None]
        return {"WV": xp.reshape(xp.matmul(xp.matrix_transpose(phi), err), WV.shape)}
    S, q, y, w = batch
    _, g = loss_and_grad_from_inputs(Params(local["WQ"], local["WK"], local["WV"]), S, q, y, w,
                                     blocks=blocks, attention=attention, temperature=temperature,
                                     with_loss=False)
    return {b: getattr(g, b) for b in blocks}


def draw_participants(t: int, m: int, fraction: float, seed: int) -> np.ndarray:
    """Clients of round ``t`` (the participation draw of the run's ``seed``): all, or ``max(1, round(fraction·m))`` drawn without replacement."""
    if fraction >= 1.0:
        return np.arange(m)
    k = max(1, int(round(fraction * m)))
    rng = np.random.default_rng(seed_sequence(seed, SEED_PARTICIPATION, t))
    return np.sort(rng.choice(m, size=k, replace=False))


def _minibatch_indices(t, clients, sizes, Nmax, steps, batch, seed) -> np.ndarray:
    """Flat sample indices ``(k, E, b)`` into the ``(m·Nmax)`` stacked samples, one stream per (round, client)."""
    out = np.empty((len(clients), steps, batch), dtype=np.int64)
    for i, c in enumerate(clients):
        rng = np.random.default_rng(seed_sequence(seed, SEED_MINIBATCH, t, c))
        N = int(sizes[c])
        if batch <= N:
            idx = np.argsort(rng.random((steps, N)), axis=1)[:, :batch]
        else:
            idx = rng.integers(0, N, size=(steps, batch))
        out[i] = c * Nmax + idx
    return out


def _client_losses(xp, params: Params, data: StackedClients, phi=None):
    """``F_c(θ)`` for every client (weighted sample means), shape ``(m,)``; an ensemble's
    ``(I, m)`` from parameters ``(I, 1, H, d, r)`` and data ``(I, m, ...)``."""
    if phi is None:
        loss, _ = loss_and_grad_from_inputs(params, data.inputs, data.q, data.y, data.sample_weight, blocks=(),
                                            attention=data.attention, temperature=data.temperature)
        return loss
    return _frozen_losses(xp, params, phi, data.y, data.sample_weight)


def _frozen_losses(xp, params: Params, phi, y, sample_weight):
    """:func:`_client_losses` at the frozen features ``φ``: ``½ Σ_i w_i ‖φ_i V − y_i‖²`` per client."""
    e = xp.matmul(phi, _value_matrix(xp, params.WV)) - y
    return 0.5 * xp.sum(e * e * sample_weight[..., None], axis=(-2, -1))


# --------------------------------------------------------------------------------------------
# the ensemble round engine
# --------------------------------------------------------------------------------------------
class _Features:
    """The frozen-stage features ``φ`` ``(I, m, N, Hd)`` of instances whose kernel is frozen,
    computed once per instance at its frozen kernel (docs/theory.md §5), kept while it stays frozen,
    in one buffer filled in place (in the run's dtype). An instance with a ``frozen_features`` hook
    (:class:`Member`) gets the hook's features at its parameters instead. With ``maps``
    (``maps(φ, first) -> (M, b)``, the fused backend's affine maps of a client's local steps, from its value
    moments: :meth:`~linattn_theory.core.fused.FusedEngine.frozen_maps`) the clients' maps are computed with
    the features, once per frozen kernel, and kept beside them.
    """

    def __init__(self, ens: "_Ensemble", hooks, maps=None):
        self.xp, self.ens, self.hooks = ens.xp, ens, hooks
        self.buffer = None
        self.filled = np.zeros(ens.count, dtype=bool)
        self.map_fn, self.maps = maps, None

    def _compute(self, P: Params, lo: int, hi: int):
        xp = self.xp
        if any(self.hooks[i] is not None for i in range(lo, hi)):
            parts = [xp.asarray(self.hooks[i](_instance(P, i)))[None, ...]
                     if self.hooks[i] is not None else self._compute(P, i, i + 1) for i in range(lo, hi)]
            return parts[0] if len(parts) == 1 else xp.concat(parts, axis=0)
        K = kernel(P.map(lambda a: a[lo:hi, ...]))                           # (hi-lo, 1, H, d, d)
        return _flat(xp, self.ens.data_of(lo, hi).features(K), 2)

    def keep_only(self, frozen: np.ndarray) -> None:
        """Forget the features of instances whose kernel is not frozen (it moves, or they idle)."""
        self.filled &= frozen

    def get(self, P: Params, lo: int, hi: int):
        """``φ`` of the instances ``lo..hi-1`` (all frozen now), at their kernels in ``P``."""
        if self.buffer is None:
            H, d = P.WV.shape[-3], P.WV.shape[-2]
            self.buffer = self.xp.zeros((self.ens.count, self.ens.m, self.ens.Nmax, H * d), dtype=self.ens.dtype)
        for a, b, _ in _groups([None if f else True for f in self.filled[lo:hi]]):     # not computed yet
            self.buffer[lo + a:lo + b, ...] = self._compute(P, lo + a, lo + b)
            if self.map_fn is not None:
                M, c = self.map_fn(self.buffer[lo + a:lo + b, ...], lo + a)
                if self.maps is None:
                    count = self.filled.shape[0]
                    self.maps = tuple(np.zeros((count,) + x.shape[1:], x.dtype) for x in (M, c))
                self.maps[0][lo + a:lo + b], self.maps[1][lo + a:lo + b] = M, c
        self.filled[lo:hi] = True
        return self.buffer[lo:hi, ...]


def _groups(keys: list) -> list[tuple[int, int, Any]]:
    """Maximal runs ``(lo, hi, key)`` of equal keys (``None``: an idle instance, in no group)."""
    out: list[list] = []
    for i, key in enumerate(keys):
        if key is None:
            continue
        if out and out[-1][1] == i and out[-1][2] == key:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1, key])
    return [tuple(g) for g in out]


def _sorted_members(members: list[Member]) -> list[int]:
    """Instances of one rule group and one phase are contiguous: by rule group, then ``T0`` and
    the start round descending (a FedFrozen instance trains everything while ``t < T0``)."""
    return sorted(range(len(members)), key=lambda i: (_rule_key(members[i]),
                                                      -members[i].warmup_rounds, -members[i].start))


# --------------------------------------------------------------------------------------------
# backends: a group's local steps and client losses (the rest of a round is the loop's)
# --------------------------------------------------------------------------------------------
def _host_server(P: Params) -> Params:
    """Server blocks ``(I, H, d, r)`` as NumPy arrays (the fused engine's input)."""
    return Params(*(np.asarray(getattr(P, b))[:, 0] for b in BLOCKS))


class _ArrayAPI:
    """The Array-API backend: ``E`` local steps of a group's participants as array operations on
    any namespace (minibatches, gradient corrections, clients in chunks bounded by ``max_bytes``),
    on the features ``φ`` once the kernel is frozen (docs/theory.md §3, §5).

    A backend has ``name``, ``features`` (a :class:`_Features`, or ``None``: it needs none) and two
    methods: ``train(t, lo, hi, Pg, rnd, client_rule, client_state, phi, lam) -> {b: θ_{c,b}}``
    ``(hi−lo, k, ...)`` and ``losses(P, lo, hi, phi) -> F_c`` ``(hi−lo, m)``."""

    name = "array_api"

    def __init__(self, ens: "_Ensemble", maps=None):
        self.ens = ens
        self.features = _Features(ens, [mb.frozen_features for mb in ens.members], maps)

    def train(self, t, lo, hi, Pg, rnd: Round, client_rule, cs, phi, lam) -> dict:
        ens, fed, m = self.ens, self.ens.fed, self.ens.m
        data = _slice_data(ens.data, lo, hi)
        inputs = (data.inputs, data.q) if phi is None else (phi,)
        batches = None if fed.batch_size is None else np.stack([   # flat sample indices (hi−lo, k, E, b)
            _minibatch_indices(t, rnd.participants[j], data.sizes[j], ens.Nmax, fed.local_steps, fed.batch_size,
                               ens.seeds[lo + j]) + j * m * ens.Nmax for j in range(hi - lo)])
        chunks = client_chunks(rnd.participants.shape[1], (hi - lo) * ens.working, ens.max_bytes)
        pieces = [_local_training(ens.xp, Pg, rnd, a, b, client_rule, cs, inputs, data, batches, rnd.learning_rate,
                                  lam, fed.batch_size) for a, b in chunks]
        return pieces[0] if len(pieces) == 1 else {
            b: ens.xp.concat([piece[b] for piece in pieces], axis=1) for b in rnd.blocks}

    def losses(self, P: Params, lo: int, hi: int, phi=None):
        if phi is None:
            return _client_losses(self.ens.xp, P, _slice_data(self.ens.data, lo, hi))
        return _frozen_losses(self.ens.xp, P, phi, *self.ens.targets_of(lo, hi))


class _Fused(_ArrayAPI):
    """The fused backend: local steps and (kernel training) client losses with the fused CPU kernels
    (:class:`~linattn_theory.core.fused.FusedEngine`, one thread per (instance, client)). A frozen
    stage's ``E`` local steps are each client's affine map ``V ↦ M_c V + b_c`` of its value moments,
    both computed once per frozen kernel (``O((Hd)² p)`` a round instead of ``O(E N Hd p)``); its
    losses stay explicit."""

    name = "fused"

    def __init__(self, ens: "_Ensemble", engine: "_fused.FusedEngine"):
        super().__init__(ens, self._frozen_maps)
        self.engine = engine

    def _frozen_maps(self, phi, first: int):
        """The affine maps ``(M_c, b_c)`` of the ``E`` local steps of the instances ``first..`` at their
        frozen features ``phi`` (:meth:`~linattn_theory.core.fused.FusedEngine.frozen_maps`)."""
        ens, count = self.ens, phi.shape[0]
        return self.engine.frozen_maps(self.engine.value_moments(phi, first), ens.fed.local_steps,
                                       ens.eta[first:first + count], ens.lam[first:first + count])

    def train(self, t, lo, hi, Pg, rnd: Round, client_rule, cs, phi, lam) -> dict:
        ens = self.ens
        maps = None if phi is None else tuple(a[lo:hi] for a in self.features.maps)
        return self.engine.train(_host_server(Pg), rnd.blocks, rnd.participants, rnd.local_steps, ens.eta[lo:hi],
                                 ens.lam[lo:hi], maps, lo)

    def losses(self, P: Params, lo: int, hi: int, phi=None):
        return super().losses(P, lo, hi, phi) if phi is not None else self.engine.losses(_host_server(P), lo)


class _Moments:
    """The moment-space backend of a frozen stage (docs/theory.md §4–5). With the kernel frozen the
    model is linear in the stacked value block ``V`` ``(Hd, p)`` and a client's loss is the quadratic
    ``F_c(V) = ½ tr(VᵀA_cV) − tr(VᵀB_c) + ½ y2_c`` of its value moments at the frozen kernel, so
    its ``E`` full-batch local steps are the affine map

        V ↦ M_c V + b_c,   M_c = (I − η Ã_c)^E,   b_c = Σ_{j<E} (I − η Ã_c)^j η B_c

    (:func:`~linattn_theory.core.frozen_map.frozen_client_map`): a round costs ``O(m (Hd)² p)``
    whatever the number of samples. The server step is the strategy's. For members that continue
    from a prefix and train ``W_V`` alone in every round, with full batches, plain local steps, no
    strategy control and no ``frozen_features`` hook; the moments are computed once, one call per
    distinct data at the members' kernels. Equals the explicit frozen stage up to rounding (the
    moment form loses about ``ε · y2_c / F_c`` in relative precision where the fit is nearly exact)."""

    name = "moments"
    features = None

    def __init__(self, ens: "_Ensemble"):
        reason = _moments_why_not(ens)
        if reason is not None:
            raise ConfigError(f"engine = 'moments' does not apply: {reason}")
        xp, members = ens.xp, ens.members
        H, d = members[0].params.WV.shape[:2]
        by_data: dict[int, list[int]] = {}
        for i, mb in enumerate(members):
            by_data.setdefault(id(mb.data), []).append(i)
        parts = [None] * ens.count
        for js in by_data.values():
            K = xp.stack([xp.reshape(kernel(members[j].params), (1, H, d, d)) for j in js], axis=0)
            mo = value_moments(K, members[js[0]].data)                     # A (W, m, Hd, Hd), B (W, m, Hd, p)
            for w, j in enumerate(js):
                parts[j] = (mo.A[w, ...], mo.B[w, ...], mo.y2, mo.weights)
        self.ens = ens
        self.moments = ValueMoments(*(xp.stack([part[q] for part in parts], axis=0) for q in range(4)))
        eta, lam = (instance_setting(xp, [float(x) for x in a], ens.dtype, 4) for a in (ens.eta, ens.lam))
        self.M, self.b = frozen_client_map(self.moments, eta, ens.fed.local_steps, lam)    # (I, m, Hd, Hd), (I, m, Hd, p)

    def train(self, t, lo, hi, Pg, rnd: Round, client_rule, cs, phi, lam) -> dict:
        if tuple(rnd.blocks) != ("WV",):
            raise ValueError(f"engine = 'moments': round {t} trains {rnd.blocks}; the moment space "
                             f"holds a frozen stage (W_V alone) only")
        xp, part, WV = self.ens.xp, rnd.participants, Pg.WV
        M, b = (_select_clients(xp, a[lo:hi, ...], part, 0, part.shape[1]) for a in (self.M, self.b))
        V_c = xp.matmul(M, _value_matrix(xp, WV)) + b                                       # (I, k, Hd, p)
        return {"WV": xp.reshape(V_c, tuple(V_c.shape[:2]) + tuple(WV.shape[2:]))}

    def losses(self, P: Params, lo: int, hi: int, phi=None):
        mo = self.moments
        return value_objective(_value_matrix(self.ens.xp, P.WV), ValueMoments(mo.A[lo:hi], mo.B[lo:hi], mo.y2[lo:hi],
                                                                            mo.weights[lo:hi]))


def _moments_why_not(ens: "_Ensemble") -> str | None:
    """The reason the moment-space backend does not apply to an ensemble, or ``None`` when it does."""
    if any(mb.prefix is None for mb in ens.members):
        return "it continues frozen stages from a prefix (Member.prefix, the state at round T0)"
    if ens.fed.batch_size is not None:
        return f"it runs full-batch local steps only (federated.batch_size = {ens.fed.batch_size})"
    if any(rule.client.correction is not local_sgd().correction for rule in ens.rules.values()):
        return "it runs plain local steps only (no FedProx or SCAFFOLD correction)"
    if any(c is not None for c in ens.controls) or any(mb.frozen_features is not None for mb in ens.members):
        return "it runs members without a strategy control or a frozen_features hook"
    return None


class LoopState(NamedTuple):
    """What the round loop carries from round to round, every array with a leading instance axis.

    ``params`` ``θ^t`` ``(I, 1, H, d, r)``; ``initial`` ``θ^0`` (or the prefix's); ``best`` and
    ``best_loss`` the iterate of least ``F_λ`` so far; ``warm`` ``θ^{T0}`` once reached; the
    strategies' ``client_state`` and ``server_state``; ``final`` each instance's last iterate and
    ``last_start`` the start of its last round (a divergence report reads them); ``alive`` ``(I,)``
    and ``diverged_at`` ``(I,)`` (the round, ``−1`` while it has not diverged).
    """

    params: Params
    initial: Params
    best: Params
    best_loss: Any
    warm: Params
    client_state: Any
    server_state: Any
    final: Params
    last_start: Params
    alive: Any
    diverged_at: Any


class _Ensemble:
    """An ensemble's members, their strategies and stacked data, and its rounds:
    :meth:`init` and :meth:`round_step` on an explicit :class:`LoopState` (as Optax or FedJAX would)."""

    def __init__(self, members: list[Member], max_bytes, engine):
        self.members = members
        config = members[0].config
        self.fed, self.model = config.federated, config.model
        first = members[0].data
        self.xp = xp = array_namespace(first.S)
        self.dtype = first.S.dtype
        self.count = len(members)
        self.m, self.Nmax = first.S.shape[0], first.S.shape[1]
        self.weights = _stack(xp, [mb.data.weights for mb in members])                  # (I, m)
        distinct: dict[int, int] = {}                   # members that share their clients share one row
        self.sources = np.array([distinct.setdefault(id(mb.data), len(distinct)) for mb in members], dtype=np.int64)
        self.T0 = np.array([mb.warmup_rounds for mb in members])
        self.start = np.array([mb.start for mb in members])
        self.seeds = [mb.config.seed for mb in members]
        self.feds = feds = [mb.config.federated for mb in members]
        if any(f.learning_rate is None for f in feds):
            raise ConfigError("federated.step_scale: resolve it to a learning rate first "
                              "(linattn_theory.sim.step_size.resolve_step_scale; simulate does)")
        self.eta = np.array([f.learning_rate for f in feds])
        self.lam = np.array([f.ridge for f in feds])
        self.rule_keys = [_rule_key(mb) for mb in members]
        strategies = [mb.make_strategy() for mb in members]     # a control holds one run's state
        self.rules = {key: strategies[self.rule_keys.index(key)] for key in self.rule_keys}
        self.names = [strategy.name for strategy in strategies]
        self.schedules = [strategy.schedule for strategy in strategies]
        self.controls = [strategy.control for strategy in strategies]    # None once it froze
        self.finishers = list(self.controls)
        self.max_bytes = max_bytes
        self.working = client_working_bytes(first, self.model.heads, self.fed.batch_size)
        choice = self.model.engine if engine is None else engine
        if choice == "moments":
            self.backend = _Moments(self)
        else:
            fused = select_engine(choice, xp, self.distinct_data, self.fed, self.rules[self.rule_keys[0]],
                                  instances=True, sources=self.sources)
            self.backend = _ArrayAPI(self) if fused is None else _Fused(self, fused)

    @functools.cached_property
    def distinct_data(self) -> StackedClients:
        """The members' distinct clients stacked, in order of first use: instance ``i``'s are row
        ``sources[i]`` (the fused engine lays out each once, however many instances share them)."""
        firsts = np.unique(self.sources, return_index=True)[1]
        return _stack_data(self.xp, [self.members[j] for j in firsts])

    @functools.cached_property
    def data(self) -> StackedClients:
        """The members' clients stacked on the instance axis (the moment space never stacks them; the
        fused engine reads :attr:`distinct_data`)."""
        if self._stacked():
            return self.distinct_data
        return _take_data(self.xp, self.distinct_data, self.sources)

    def _stacked(self) -> bool:
        """Whether :attr:`data` is at hand (computed, or :attr:`distinct_data` itself: no client shared)."""
        return "data" in self.__dict__ or len(self.distinct_data.sizes) == self.count

    def data_of(self, lo: int, hi: int) -> StackedClients:
        """The clients of the instances ``lo..hi-1`` stacked: a slice of :attr:`data` where it is at hand,
        else theirs alone taken from :attr:`distinct_data` (the same arrays)."""
        if self._stacked():
            return _slice_data(self.data, lo, hi)
        return _take_data(self.xp, self.distinct_data, self.sources[lo:hi])

    @functools.cached_property
    def _targets(self) -> tuple:
        """``(y, sample_weight)`` of every instance, stacked once (a frozen stage's losses read them every round)."""
        if self._stacked():
            return self.data.y, self.data.sample_weight
        index = self.xp.asarray(self.sources)
        return tuple(self.xp.take(a, index, axis=0) for a in (self.distinct_data.y, self.distinct_data.sample_weight))

    def targets_of(self, lo: int, hi: int) -> tuple:
        """``(y, sample_weight)`` of the instances ``lo..hi-1`` (a frozen stage's losses need no more)."""
        return tuple(a[lo:hi, ...] for a in self._targets)

    # -- the loop's state: init and one round -----------------------------------------------------
    def init(self) -> tuple["LoopState", Any]:
        """The :class:`LoopState` at the start round (round 0, or each member's prefix) and
        ``origin``: round 0's ``(F, F_λ, F_c)`` on the device (``None`` from a prefix)."""
        xp, count, dtype = self.xp, self.count, self.dtype
        P = _lift(xp, [mb.params for mb in self.members])                          # (I, 1, H, d, r)
        if self.members[0].prefix is None:
            losses0 = self.backend.losses(P, 0, count)
            F0, F0_reg = self.objective(P, losses0, 0, count)
            initial = best = warm = P
            best_loss = F0_reg
            groups = [(lo, hi, self.rules[key], self.sub(P, lo, hi)) for lo, hi, key in _groups(self.rule_keys)]
            client_state = _assemble(xp, [(lo, hi, rule.client.init(Pg, self.m)) for lo, hi, rule, Pg in groups], None, count)
            server_state = _assemble(xp, [(lo, hi, rule.server.init(Pg)) for lo, hi, rule, Pg in groups], None, count)
            factor = xp.asarray([f.divergence_factor for f in self.feds], dtype=dtype)
            self.threshold = factor * xp.maximum(F0_reg, xp.asarray(1e-12, dtype=dtype))
            origin = (F0, F0_reg, losses0)
        else:
            prefixes = [mb.prefix for mb in self.members]
            initial, best = _lift(xp, [p.initial for p in prefixes]), _lift(xp, [p.best for p in prefixes])
            warm = _lift(xp, [p.params if p.warmup_params is None else p.warmup_params for p in prefixes])
            best_loss = xp.asarray(np.array([p.best_loss for p in prefixes]), dtype=dtype)
            client_state = _tree_map(lambda *a: xp.concat(a, axis=0), *[p.client_state for p in prefixes])
            server_state = _tree_map(lambda *a: xp.concat(a, axis=0), *[p.server_state for p in prefixes])
            F0_reg = np.array([float(p.rows[0]["loss_regularized"]) for p in prefixes])
            factor = np.array([f.divergence_factor for f in self.feds])
            self.threshold = xp.asarray(factor * np.maximum(F0_reg, 1e-12), dtype=dtype)
            origin = None
        state = LoopState(P, initial, best, best_loss, warm, client_state, server_state, P, P,
                          xp.ones((count,), dtype=xp.bool), xp.full((count,), -1, dtype=xp.int64))
        return state, origin

    def round_step(self, state: "LoopState", t: int) -> tuple["LoopState", tuple]:
        """Round ``t`` of every instance that runs it: ``(state after it, record)``, the record
        ``(row, blocks, participants, running, diverged)``: the table's ``(F, F_λ, F_c, kernel
        drift, block drifts)`` on the device, each instance's blocks (``None``: idle) and
        participant count, and which instances ran it and diverged in it."""
        xp, count, m, dtype = self.xp, self.count, self.m, self.dtype
        P, alive, warm = state.params, state.alive, state.warm
        active = self.start <= t
        if np.any(active & (self.T0 == t)):           # θ^{T0}, for the instances that reach it
            warm = _where(xp, alive & xp.asarray(active & (self.T0 == t)), P, warm)
        blocks = [tuple(self.schedules[i](t)) if active[i] else None for i in range(count)]
        if self.backend.features is not None:
            self.backend.features.keep_only(np.array([b is not None and "WQ" not in b and "WK" not in b
                                                      for b in blocks]))
        pieces: dict[str, list] = {"P": [], "client": [], "server": [], "row": []}
        ks = np.zeros(count, dtype=np.int64)
        for lo, hi, (key, group_blocks) in _groups([None if b is None else (self.rule_keys[i], b)
                                                    for i, b in enumerate(blocks)]):
            Pn, cs, ss, row, k = self.round_of_group(t, lo, hi, key, group_blocks, P, state.client_state,
                                                     state.server_state)
            for name, value in zip(("P", "client", "server", "row"), (Pn, cs, ss, row)):
                pieces[name].append((lo, hi, value))
            ks[lo:hi] = k
        idle = xp.zeros((count,), dtype=dtype)
        row = _assemble(xp, pieces["row"], (idle, idle, xp.zeros((count, m), dtype=dtype), idle,
                                            xp.zeros((count, 3), dtype=dtype)), count)
        P = _assemble(xp, pieces["P"], P, count)
        F_reg = row[1]
        running = alive & xp.asarray(active)
        better = running & (F_reg < state.best_loss)
        bad = running & (~xp.isfinite(F_reg) | (F_reg > self.threshold))
        state = LoopState(P, state.initial, _where(xp, better, P, state.best), xp.where(better, F_reg, state.best_loss),
                          warm, _assemble(xp, pieces["client"], state.client_state, count),
                          _assemble(xp, pieces["server"], state.server_state, count),
                          _where(xp, running, P, state.final), _where(xp, running, state.params, state.last_start),
                          alive & ~bad, xp.where(bad, xp.asarray(t + 1, dtype=xp.int64), state.diverged_at))
        return state, (row, blocks, ks, running, bad)

    # -- pieces of a round ----------------------------------------------------------------------
    def sub(self, tree, lo, hi):
        return _tree_map(lambda a: a[lo:hi, ...], tree)

    def objective(self, P: Params, losses, lo: int, hi: int):
        """``(F, F_λ)`` per instance: ``Σ_c p_c F_c`` and ``+ ½λ‖W_V‖²``."""
        return objective(self.xp, self.weights[lo:hi, ...], losses, P.WV,
                         self.xp.asarray(self.lam[lo:hi], dtype=self.dtype))

    def round_of_group(self, t, lo, hi, key, blocks, P, client_state, server_state):
        """Round ``t`` of the instances ``lo..hi-1`` (one rule group, one phase): participants and
        weights, the backend's local steps, the strategy's client and server rules, the table's numbers."""
        xp, m, fed = self.xp, self.m, self.fed
        rule = self.rules[key]
        Pg = self.sub(P, lo, hi)
        cs, ss = self.sub(client_state, lo, hi), self.sub(server_state, lo, hi)
        kernel_frozen = "WQ" not in blocks and "WK" not in blocks
        features = self.backend.features
        phi = features.get(P, lo, hi) if kernel_frozen and features is not None else None
        part = np.stack([draw_participants(t, m, fed.participation, self.seeds[i]) for i in range(lo, hi)])
        cw = _select_clients(xp, self.weights[lo:hi, ...], part, 0, part.shape[1])
        pw = cw / xp.sum(cw, axis=1, keepdims=True)
        eta = instance_setting(xp, [float(x) for x in self.eta[lo:hi]], self.dtype)
        lam = instance_setting(xp, [float(x) for x in self.lam[lo:hi]], self.dtype)
        rnd = Round(t, blocks, part, m, cw, pw, fed.local_steps, eta)
        anchor = {b: getattr(Pg, b) for b in blocks}
        local = self.backend.train(t, lo, hi, Pg, rnd, rule.client, cs, phi, lam)
        cs = rule.client.update(cs, rnd, anchor, local)
        zero = xp.zeros((hi - lo,), dtype=self.dtype)
        delta, drift = {}, [zero, zero, zero]
        for j, b in enumerate(BLOCKS):
            if b in blocks:
                average = weighted_sum(pw, local[b])
                delta[b] = average - anchor[b]
                drift[j] = xp.sum(pw * sq_norms(xp, local[b] - average, 2), axis=-1)
        step, ss = rule.server.update(ss, rnd, delta)
        Pn = Pg.replace(**{b: anchor[b] + step[b] for b in blocks})
        kernel_drift = zero
        if not kernel_frozen:
            WQ_c, WK_c = (local[b] if b in local else getattr(Pg, b) for b in ("WQ", "WK"))
            K_c = xp.matmul(WQ_c, xp.matrix_transpose(WK_c))
            kernel_drift = xp.sum(pw * sq_norms(xp, K_c - kernel(Pn), 2), axis=-1)
        losses = self.backend.losses(Pn, lo, hi, phi)
        F, F_reg = self.objective(Pn, losses, lo, hi)
        return Pn, cs, ss, (F, F_reg, losses, kernel_drift, xp.stack(drift, axis=-1)), part.shape[1]


@np.errstate(over="ignore", invalid="ignore")   # overflow is detected and reported as divergence
def run_ensemble(members: list[Member], *, max_bytes: int | None = None, engine: str | None = None,
                 keep_history: bool = False, progress: bool = False) -> list[tuple]:
    """Run ``members`` (of one :func:`ensemble_key`) as one ensemble (see the module docstring).

    Returns, in the members' order, ``(RunResult, {round: RunState}, history)``: the result as
    :func:`~linattn_theory.sim.engine.run_schedule` returns it; the states at the member's
    ``checkpoints`` it reached (strategy states in ensemble form: instance axis of length 1);
    with ``keep_history``, the host parameters ``[θ^start, …, θ^end]`` (else ``None``). Members
    all start at round 0 or all continue from a ``prefix``. ``engine`` overrides ``model.engine``
    (``"auto"``: :func:`select_engine`'s rule, the same for every instance);
    ``max_bytes`` bounds the working set of a chunk of one round's local steps (``None``: one chunk).
    A member's ``on_round`` and its strategy's control see its state after every round (a host
    synchronisation per round for those members only).

    Parameters
    ----------
    members : list of Member
        The instances, all of one :func:`~linattn_theory.sim.ensemble.ensemble_key`.
    max_bytes : int, optional
        Bound on the working set of a chunk of one round's local steps (default: one chunk).
    engine : {"auto", "array_api", "fused", "moments"}, optional
        Overrides ``model.engine``; ``"moments"``: the moment-space backend of a frozen stage
        (members continuing from a prefix with the kernel frozen, :mod:`linattn_theory.sim.warmup_grid`).
    keep_history : bool, default False
        Also return every round's host parameters.
    progress : bool, default False
        Show a progress bar over the rounds (tqdm).

    Returns
    -------
    list of tuple
        Per member, in the members' order, ``(RunResult, {round: RunState}, history)``; ``history``
        is ``None`` without ``keep_history``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.sim.rounds import Member, run_ensemble
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> members = [Member(c, *prepare_run(c), checkpoints=(2,))
    ...            for c in (config, config.with_updates({"seed": 1}))]
    >>> out = run_ensemble(members)
    >>> [(len(result.table), sorted(states), history) for result, states, history in out]
    [(5, [2], None), (5, [2], None)]
    >>> alone = lt.simulate(config.with_updates({"seed": 1})).table["loss"]
    >>> bool(abs(out[1][0].table["loss"] - alone).max() < 1e-9 * alone.abs().max())
    True
    """
    if not members:
        return []
    if len({mb.prefix is None for mb in members}) > 1:
        raise ValueError("run_ensemble: members start all at round 0 or all from a prefix")
    order = _sorted_members(members)
    ens = _Ensemble([members[i] for i in order], max_bytes, engine)
    state, origin = ens.init()
    first, count = int(ens.start.min()), ens.count
    wanted = {r for mb in ens.members for r in mb.checkpoints}
    saved, history, records = {}, [] if keep_history else None, []

    def keep(r: int, state: LoopState) -> None:
        if r in wanted:
            saved[r] = state
        if keep_history:
            history.append(state.params)

    keep(first, state)
    hooks = _Hooks(ens, origin)
    if hooks.watched:
        state = hooks.observe(first, state, np.ones(count, dtype=bool), np.zeros(count, dtype=bool))
    rounds = range(first, ens.fed.rounds)
    if progress:
        from tqdm.auto import tqdm
        rounds = tqdm(rounds, desc="rounds" if count == 1 else f"rounds of {count} runs", unit="round", leave=False)
    for t in rounds:
        state, record = ens.round_step(state, t)
        records.append(record)
        keep(t + 1, state)
        if hooks.watched:              # the hooks see θ^{t+1}; a freeze sets the next round's start
            row, blocks, ks, running, bad = record
            hooks.record(t, row, blocks, ks)
            state = hooks.observe(t + 1, state, np.asarray(to_numpy(running)), np.asarray(to_numpy(bad)))
        if _all_diverged(ens.xp, state.alive, t - first):
            break
    outcome = _Outcome(ens, records, first, origin, state, saved, history, hooks.frozen)
    return [outcome.member(int(position)) for position in np.argsort(order)]      # in the members' order


def _lift(xp, points) -> Params:
    """One :class:`Params` per instance, stacked as ``(I, 1, H, d, r)``."""
    return Params(*(_stack(xp, [xp.reshape(getattr(p, b), (1,) + tuple(getattr(p, b).shape)) for p in points])
                    for b in BLOCKS))


def _instance(P: Params, i: int) -> Params:
    """Instance ``i``'s parameters ``(H, d, r)`` of ensemble parameters ``(I, 1, H, d, r)`` (on the device)."""
    return Params(*(getattr(P, b)[i, 0, ...] for b in BLOCKS))


#: the schedule after a control's freeze: only the value block trains (docs/theory.md §5)
_FROZEN_SCHEDULE = freeze_after(0, ("WV",))


class _Hooks:
    """The members whose ``on_round`` or strategy control sees their state after every round: their
    table rows kept on the host as the rounds go, their :class:`RunState` built, a control's
    :class:`~linattn_theory.sim.strategies.Freeze` applied (the run goes on from its parameters
    with only ``W_V`` training; ``θ^{T0}`` are those parameters)."""

    def __init__(self, ens: "_Ensemble", origin):
        self.ens = ens
        self.watched = [i for i, mb in enumerate(ens.members)
                        if mb.on_round is not None or ens.controls[i] is not None]
        self.frozen = np.zeros(ens.count, dtype=bool)
        host = None if origin is None or not self.watched else tuple(np.asarray(to_numpy(a)) for a in origin)
        self.rows = {i: _first_rows(ens, i, host) for i in self.watched}

    def record(self, t: int, row, blocks, ks) -> None:
        """Round ``t``'s table row of every watched instance that ran it."""
        for i in self.watched:
            if blocks[i] is not None and len(self.rows[i]) == t + 1:
                _append_row(self.rows[i], t, blocks[i], [np.asarray(to_numpy(a[i, ...])) for a in row], int(ks[i]),
                            self.ens.names[i])

    def observe(self, r: int, loop: "LoopState", running: np.ndarray, bad: np.ndarray) -> "LoopState":
        """``on_round`` and the control of every watched instance that ran round ``r − 1`` (round
        ``r``: its state after it); the control only where it did not diverge. Returns the loop's
        state with the freezes applied."""
        ens, xp = self.ens, self.ens.xp
        for i in self.watched:
            mb, control = ens.members[i], ens.controls[i]
            if not (running[i] or r == mb.start) or len(self.rows[i]) != r + 1:
                continue                      # idle (not started, or diverged) in round r − 1
            state = mb.prefix if mb.prefix is not None and r == mb.start else \
                _run_state(i, r, mb.warmup_rounds, self.rows[i], loop)
            if mb.on_round is not None:
                mb.on_round(state)
            if control is None or bad[i]:
                continue
            decision = control.observe(state, mb.data)
            if decision is None:
                continue
            ens.controls[i] = None
            if r < ens.fed.rounds:            # a freeze at round T changes nothing
                mask = xp.asarray(np.arange(ens.count) == i)
                frozen = _lift(xp, [decision.params] * ens.count)
                loop = loop._replace(params=_where(xp, mask, frozen, loop.params),
                                     warm=_where(xp, mask, frozen, loop.warm))
                ens.schedules[i], self.frozen[i] = _FROZEN_SCHEDULE, True
        return loop


def _first_rows(ens: "_Ensemble", i: int, origin) -> list:
    """Instance ``i``'s table rows before its first round: round 0's, or its prefix's."""
    mb = ens.members[i]
    if mb.prefix is not None:
        return list(mb.prefix.rows)
    F0, F0_reg, losses0 = origin
    return [table_row(0, "init", float(F0[i]), float(F0_reg[i]), losses0[i], 0.0, 0.0, {b: 0.0 for b in BLOCKS},
                      ens.m, ens.names[i])]


def _append_row(rows: list, t: int, blocks, values, participants: int, name: str) -> None:
    """Append round ``t``'s table row (``θ^{t+1}``) from one instance's host ``(F, F_λ, F_c, kernel
    drift, block drifts)`` to ``rows``; its cumulative kernel drift continues the last row's."""
    F, F_reg, losses, kernel_drift, drift = values
    drift = {b: float(drift[q]) if b in blocks else 0.0 for q, b in enumerate(BLOCKS)}
    gamma, moved = float(rows[-1]["cumulative_kernel_drift"]), 0.0
    if "WQ" in blocks or "WK" in blocks:
        moved = float(kernel_drift)
        gamma += moved
    rows.append(table_row(t + 1, _stage(blocks), float(F), float(F_reg), losses, moved, gamma, drift, participants,
                          name))


#: how often (rounds) a GPU ensemble asks whether every instance diverged (a host synchronisation)
SYNC_ROUNDS = 16


def _all_diverged(xp, alive, done: int) -> bool:
    """Whether no instance is left to run; on NumPy every round (free), elsewhere every ``SYNC_ROUNDS``."""
    from array_api_compat import is_numpy_namespace
    if not is_numpy_namespace(xp) and (done + 1) % SYNC_ROUNDS:
        return False
    return not bool(xp.any(alive))


class _Outcome:
    """An ensemble's run gathered on the host once, and cut into per-instance results."""

    def __init__(self, ens: _Ensemble, records, first, origin, loop: LoopState, saved, history, frozen):
        xp = ens.xp
        self.ens, self.first, self.loop = ens, first, loop
        self.blocks, self.participants = [r[1] for r in records], [r[2] for r in records]
        host = lambda a: np.asarray(to_numpy(a))  # noqa: E731
        if records:
            self.records = [host(xp.stack([r[0][j] for r in records], axis=0)) for j in range(5)]
        self.origin = None if origin is None else tuple(host(a) for a in origin)
        self.diverged_at = host(loop.diverged_at)
        self.saved, self.frozen = saved, frozen
        self.history = None if history is None else history[0].map(   # (rounds, I, 1, H, d, r)
            lambda *a: host(xp.stack(a, axis=0)), *history[1:])

    def member(self, i: int):
        ens, mb = self.ens, self.ens.members[i]
        T, T0 = ens.fed.rounds, mb.warmup_rounds
        diverged = self.diverged_at[i] >= 0
        end = int(self.diverged_at[i]) if diverged else T
        rows = _first_rows(ens, i, self.origin)
        for j in range(mb.start - self.first, end - self.first):
            _append_row(rows, j + self.first, self.blocks[j][i], [a[j, i] for a in self.records],
                        int(self.participants[j][i]), ens.names[i])
        final = _instance(self.loop.final, i)
        warm = _instance(self.loop.warm, i) if T0 < end or self.frozen[i] else final
        divergence = None
        if diverged:
            j = end - 1 - self.first
            points = [_instance(P, i) for P in (self.loop.initial, self.loop.best, self.loop.last_start)]
            divergence = report_divergence(end, float(self.records[1][j, i]), points, mb.data,
                                           float(ens.lam[i]), float(ens.eta[i]), self.blocks[j][i],
                                           deferred=isinstance(mb.data.q, np.ndarray))
        result = run_result(rows, final, warm, divergence, T0, ens.names[i])
        result.metadata["engine"] = ens.backend.name
        if ens.finishers[i] is not None:
            result.metadata.update(ens.finishers[i].finish(result))
        states = {r: _run_state(i, r, T0, rows[:r + 1], self.saved[r]) for r in mb.checkpoints
                  if r in self.saved and mb.start <= r <= end}
        history = None if self.history is None else [self.history.map(lambda a: a[j, i, 0])
                                                     for j in range(mb.start - self.first, end - self.first + 1)]
        return result, states, history


def _run_state(i: int, r: int, T0: int, rows, loop: LoopState) -> RunState:
    """Instance ``i``'s :class:`RunState` at round ``r`` from the loop's state (the strategies'
    states in ensemble form: an instance axis of length 1)."""
    params = _instance(loop.params, i)
    reached = _instance(loop.warm, i) if r > T0 else params if r == T0 else None
    one = lambda a: a[i:i + 1, ...]  # noqa: E731
    return RunState(r, params, tuple(rows), _instance(loop.initial, i), _instance(loop.best, i),
                    float(to_numpy(loop.best_loss)[i]), reached, _tree_map(one, loop.client_state),
                    _tree_map(one, loop.server_state))


def run_result(rows, params, warm_params, divergence, warmup_rounds, strategy) -> RunResult:
    """The :class:`RunResult` of a finished run: table from ``rows``, parameters moved to the host."""
    table = pd.DataFrame(rows)
    host = lambda P: P.map(lambda a: to_numpy(a))  # noqa: E731
    meta = {"diverged": divergence is not None,
            "divergence": None if divergence is None else DivergenceFields(divergence),
            "rounds_completed": int(table["round"].iloc[-1]), "warmup_rounds": warmup_rounds,
            "strategy": strategy}
    return RunResult(table, host(params), host(warm_params), divergence, meta)


def _stage(blocks) -> str:
    """Row label of a round: ``warmup`` (every block trains), ``frozen`` (only ``W_V``), ``value_frozen``."""
    if tuple(blocks) == BLOCKS:
        return "warmup"
    return "frozen" if tuple(blocks) == ("WV",) else "value_frozen"


def report_divergence(t, F, points: list[Params], data, lam, eta, blocks, *, deferred: bool = False) -> Divergence:
    """Report a divergence at round ``t`` with a stable step: the smallest ``2/λ_max`` over ``points``.

    ``points`` are finite iterates of the run (the start, the best so far, the last finite
    one): in the factorised model the curvature grows as the kernel is learned, so the step
    must be stable where the run was heading, not only where it started. ``deferred``: the step and
    the message are computed when first read (:meth:`Divergence.deferred`; host arrays only: the
    report keeps copies of ``points`` and a reference to ``data``), the same numbers.
    """
    if deferred:
        points = [P.map(np.array) for P in points]          # copies: the report outlives the ensemble's arrays
        return Divergence.deferred(t, float(F), functools.partial(_divergence_advice, t, F, points, data, lam,
                                                                  eta, blocks))
    return Divergence(t, float(F), *_divergence_advice(t, F, points, data, lam, eta, blocks))


@np.errstate(over="ignore", invalid="ignore")
def _divergence_advice(t, F, points: list[Params], data, lam, eta, blocks) -> tuple[float, str]:
    """:func:`report_divergence`'s ``(stable step, message)``."""
    points = [P for P in points if all(np.all(np.isfinite(to_numpy(getattr(P, b)))) for b in BLOCKS)]
    kernel_trains = "WQ" in blocks or "WK" in blocks
    safe, where = float("nan"), "2/λ_max(Ã_c), the value block's curvature (docs/theory.md §5)"
    try:                    # the curvature itself may overflow at a runaway kernel
        safe = min(stable_learning_rate(kernel(P), data, lam) for P in points)
        if kernel_trains:
            curvature = max(float(np.max(row)) for row in hessian_curvature(points, data, lam))
            if 2.0 / curvature < safe:
                safe, where = 2.0 / curvature, "2/λ_max(∇²F_c), the full model's curvature at that round"
    except (np.linalg.LinAlgError, ValueError):
        pass
    where += ", largest over the clients and the run's finite iterates"
    if not safe < eta:          # the bound does not explain this divergence (or is unknown): below η
        bound = f"the curvature bound {safe:.3g} is not below η" if np.isfinite(safe) else \
            "the curvature could not be computed"
        safe, where = eta / 2, f"half the step that diverged: {bound}, so it does not explain this divergence"
    stage = _stage(blocks)
    stage = {"warmup": "warm-up", "frozen": "frozen stage"}.get(stage, stage.replace("_", " ") + " stage")
    msg = (f"diverged at round {t} ({stage}): F = {F:.3g} with learning_rate η = {eta:g}; "
           f"try η < {safe:.3g} ({where})")
    if kernel_trains:
        msg += ("; below the value-block bound the frozen stage is guaranteed stable, while the "
                "warm-up's curvature can grow as the kernel is learned: if it still diverges, halve η")
    return safe, msg


def table_row(t, stage, F, F_reg, losses, kernel_drift, gamma, drift, participants, strategy):
    """One row of a run's table: round ``t``, its ``stage``, ``F(θ^t)`` and ``F_λ(θ^t)``
    (docs/theory.md §3), the kernel drift ``‖K^t − K^{t−1}‖_F`` and its running sum ``gamma``,
    the blocks' drifts ``drift``, the number of ``participants``, the strategy's name, and one
    ``client_loss_c`` column per client loss ``F_c(θ^t)`` in ``losses``."""
    row = {"round": t, "stage": stage, "loss": F, "loss_regularized": F_reg,
           "kernel_drift": kernel_drift, "cumulative_kernel_drift": gamma,
           "drift_WQ": drift["WQ"], "drift_WK": drift["WK"], "drift_WV": drift["WV"],
           "participants": participants, "strategy": strategy}
    row.update({f"client_loss_{c}": float(v) for c, v in enumerate(losses)})
    return row
