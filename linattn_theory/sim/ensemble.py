"""Many runs as one array program: the round engine with a leading instance axis (docs/theory.md §3).

:func:`simulate_many` runs instances of equal shapes — clients ``m``, samples ``N``, tokens ``n``,
dimensions ``d, r, p``, heads ``H``, local steps ``E``, rounds ``T``, attention, strategy,
minibatch size and participation — as one program whose arrays carry a leading instance axis,
as ``jax.vmap`` would: the server parameters are ``(I, 1, H, d, r)``, the clients' local models
``(I, k, H, d, r)``, the data ``(I, m, N, ...)``. Everything else is per instance: the seed (so
the data, the initialisation, the participation and minibatch draws), the step size ``η``, the
warm-up length ``T0``, the ridge ``λ``, the divergence threshold and the strategy's parameters.
Configs of different shapes form different ensembles.

Each round groups the instances by what they do in it (the blocks their schedule trains: a
FedFrozen instance past its ``T0`` trains ``W_V`` only, on features computed once at its frozen
kernel) and runs each group's local steps at once, on the Array-API path (any backend: NumPy,
CuPy, array-api-strict) or with the fused CPU kernels (:mod:`linattn_theory.core.fused`, one
thread per (instance, client) work item; wherever it applies and an instance's step is not tiny,
:data:`~linattn_theory.core.fused.MIN_ENSEMBLE_WORK`). Every instance's arithmetic is its own, so
a result does not depend on which instances share its ensemble, on the chunking (``max_bytes``)
or on the number of threads or workers (bit for bit on the CPU); it equals
:func:`~linattn_theory.sim.engine.simulate` of the same config to rounding (the engines sum in
other orders; bit for bit where both run the Array-API engine).

Nothing is synchronised with the host inside a round: the table's numbers stay on the device
until the run ends, and divergence — ``F_λ`` non-finite or above ``divergence_factor·F_λ(θ^0)``
— is detected per instance from them afterwards; a diverged instance reports its own round and a
stable step size (:func:`~linattn_theory.sim.engine.run_schedule`'s report) while the others go on.

FedFrozen runs of one instance that differ only in ``T0`` share their warm-up: one trajectory
(the largest ``T0``) runs in the first ensemble and keeps its state at every smaller ``T0``; the
other runs' frozen stages continue from those states in a second ensemble (the numbers are those
of separate runs, bit for bit). The online rule's run of such an instance (``fedfrozen_adaptive``
with ``T0 = T``) is the ``T0 = T`` run until its rule freezes the kernel: its rule observes that
run's states after the first ensemble, as it would in training, and its frozen rounds continue
from the state of the round it stopped in, in the second (:class:`_OnlineReplay`; the run alone,
bit for bit).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any

import numpy as np

from ..core.arrays import array_namespace, to_numpy
from ..core.backend import client_chunks, client_working_bytes, get_namespace
from ..core.clients import StackedClients, check_clients
from ..core.errors import SettingWarning
from ..core.io import timed_run
from ..core.model import BLOCKS, Params, flat as _flat, kernel
from .config import ONLINE_STRATEGY, RunConfig, warmup_family_key
from .engine import (RunResult, RunState, _client_losses, _divergence, _local_steps,
                     _minibatch_indices, _participants, _result, _row, _stage, _test_metrics,
                     _warn_small_clients, clients_from_config, prepare_run, run_metadata, select_engine)
from .strategies import Round, make_strategy
from .strategies.base import instance_rows as _instance_rows, weighted_sum

__all__ = ["simulate_many", "ensemble_key", "run_ensemble", "Member"]

#: federated settings that may differ between the instances of one ensemble (the engine's own:
#: step size, ridge, warm-up length, divergence threshold) — the strategy's parameters may differ
#: too, but split the rule groups of a round (:func:`_rule_key`)
ENGINE_SETTINGS = ("learning_rate", "ridge", "warmup_rounds", "divergence_factor")
#: on NumPy an ensemble holds at most this many bytes of stacked data (more instances form more
#: ensembles, one after the other); on a GPU half the free device memory
CPU_ENSEMBLE_BYTES = 1 << 30


# --------------------------------------------------------------------------------------------
# what an ensemble is
# --------------------------------------------------------------------------------------------
def ensemble_key(config: RunConfig, data: StackedClients) -> str:
    """The settings and shapes that instances of one ensemble share (as a string key).

    Shapes of the stacked data (``m``, padded ``N``, ``n`` for softmax attention, ``d``, ``p``),
    the model (heads, rank, dtype, backend, attention, temperature, engine) and the schedule's
    structure (strategy, rounds, local steps, minibatch size, participation).
    """
    model, fed = config.model, config.federated
    shapes = [tuple(data.S.shape), tuple(data.y.shape)]
    if data.attention == "softmax":
        shapes.append(tuple(data.X.shape))
    return json.dumps([shapes, model.heads, model.rank, model.dtype, model.backend, model.attention,
                       model.temperature, model.engine, fed.strategy, fed.rounds, fed.local_steps,
                       fed.batch_size, fed.participation])


def _rule_key(config: RunConfig) -> str:
    """Instances whose strategy rules are the same functions: every federated setting but the engine's."""
    fed = {k: v for k, v in dataclasses.asdict(config.federated).items() if k not in ENGINE_SETTINGS}
    return json.dumps(fed, sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True)
class Member:
    """One instance of an ensemble: its config, stacked clients and parameters at the start round.

    ``prefix``: continue from this :class:`~linattn_theory.sim.engine.RunState` (``params`` must be
    ``prefix.params``; its strategy states in ensemble form, as :func:`run_ensemble` returns
    them); ``checkpoints``: rounds whose state :func:`run_ensemble` returns.
    """

    config: RunConfig
    data: StackedClients
    params: Params
    prefix: RunState | None = None
    checkpoints: tuple[int, ...] = ()

    @property
    def start(self) -> int:
        return 0 if self.prefix is None else self.prefix.round

    @property
    def warmup_rounds(self) -> int:
        return self.config.warmup_rounds


# --------------------------------------------------------------------------------------------
# arrays with an instance axis
# --------------------------------------------------------------------------------------------
def _stack(xp, arrays):
    return xp.stack([xp.asarray(a) for a in arrays], axis=0)


def _stack_data(xp, members) -> StackedClients:
    """The members' clients stacked on a leading instance axis (``sizes`` ``(I, m)`` on the host)."""
    first = members[0].data
    X = None if first.X is None else _stack(xp, [mb.data.X for mb in members])
    return StackedClients(*(_stack(xp, [getattr(mb.data, f) for mb in members])
                            for f in ("S", "q", "y", "sample_weight", "weights")),
                          np.stack([np.asarray(mb.data.sizes) for mb in members]), X,
                          first.attention, first.temperature)


def _slice_data(data: StackedClients, lo: int, hi: int) -> StackedClients:
    if lo == 0 and hi == data.S.shape[0]:
        return data
    cut = lambda a: None if a is None else a[lo:hi, ...]  # noqa: E731
    return StackedClients(cut(data.S), cut(data.q), cut(data.y), cut(data.sample_weight),
                          cut(data.weights), data.sizes[lo:hi], cut(data.X), data.attention,
                          data.temperature)


def _mask(xp, host_bool, ndim: int):
    """A host boolean ``(I,)`` as a device mask of ``ndim`` dimensions."""
    return xp.reshape(xp.asarray(np.asarray(host_bool)), (-1,) + (1,) * (ndim - 1))


def _where(xp, mask, new, old):
    """``new`` where ``mask`` (device bool ``(I,)``), else ``old``; for arrays and Params."""
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


def _per_instance(xp, values, dtype, ndim: int = 5):
    """One setting of every instance of a group: the number itself when all are equal, else a
    device array ``(I, 1, …)`` of ``ndim`` dimensions that broadcasts against the blocks
    ``(I, k, H, d, r)`` (the same arithmetic either way)."""
    if len(set(values)) == 1:
        return values[0]
    return xp.reshape(xp.asarray(np.asarray(values, dtype=np.float64), dtype=dtype), (-1,) + (1,) * (ndim - 1))


def _sq_norms(xp, a):
    """``‖a_{i,c}‖²`` over the trailing block axes of ``(I, k, ...)``; shape ``(I, k)``."""
    return xp.sum(xp.reshape(a * a, (a.shape[0], a.shape[1], -1)), axis=-1)


# --------------------------------------------------------------------------------------------
# one round of one group
# --------------------------------------------------------------------------------------------
def _select_clients(xp, a, part: np.ndarray, lo: int, hi: int):
    """Rows ``part[:, lo:hi]`` of ``a`` ``(I, m, ...)``: the participants of a chunk, per instance."""
    I, m = a.shape[0], a.shape[1]
    if part.shape[1] == m:
        return a if (lo, hi) == (0, m) else a[:, lo:hi, ...]
    flat = xp.reshape(a, (I * m,) + tuple(a.shape[2:]))
    rows = xp.take(flat, xp.asarray(_instance_rows(I, m, part[:, lo:hi])), axis=0)
    return xp.reshape(rows, (I, hi - lo) + tuple(a.shape[2:]))


def _take_samples(xp, a, idx: np.ndarray):
    """Samples ``idx`` ``(I, k, b)`` (flat into ``I·m·N``) of ``a`` ``(I, m, N, ...)``."""
    flat = xp.reshape(a, (a.shape[0] * a.shape[1] * a.shape[2],) + tuple(a.shape[3:]))
    rows = xp.take(flat, xp.asarray(idx.reshape(-1)), axis=0)
    return xp.reshape(rows, idx.shape + tuple(a.shape[3:]))


def _local_training(xp, P: Params, rnd: Round, lo: int, hi: int, client_rule, client_state,
                    inputs: tuple, data: StackedClients, batches, eta, lam, batch_size) -> dict:
    """``E`` local steps from ``θ^t`` of the participants ``[:, lo:hi]`` of every instance of a group.

    The ensemble form of :func:`linattn_theory.sim.engine._local_training`: ``P`` blocks
    ``(I, 1, H, d, r)``, ``inputs`` ``(φ,)`` (kernel frozen) or ``(Ŝ, q)`` / ``(X, q)``.
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
    batch = tuple(_select_clients(xp, a, part, lo, hi) for a in inputs + (data.y, data.sample_weight))

    def minibatch(e):
        step = tuple(_take_samples(xp, a, batches[:, lo:hi, e, :]) for a in inputs + (data.y,))
        return step + (xp.full(tuple(step[0].shape[:3]), 1.0 / batch_size, dtype=step[0].dtype),)
    return _local_steps(xp, rnd, client_rule, client_state, anchor, broadcast, batch,
                        None if batches is None else minibatch, eta, lam, data)


# --------------------------------------------------------------------------------------------
# the ensemble round engine
# --------------------------------------------------------------------------------------------
class _Features:
    """The frozen-stage features ``φ`` ``(I, m, N, Hd)`` of instances whose kernel is frozen,
    computed once per instance at its frozen kernel (docs/theory.md §5), kept while it stays frozen.

    Array-API path: disjoint pieces ``(lo, hi, φ)`` merged when a group spans several; fused
    engine (NumPy): one buffer filled in place.
    """

    def __init__(self, xp, data: StackedClients, fused):
        self.xp, self.data, self.fused = xp, data, fused
        self.pieces: list[tuple[int, int, Any]] = []
        self.buffer = None
        self.filled = np.zeros(data.S.shape[0], dtype=bool)

    def _compute(self, P: Params, lo: int, hi: int):
        K = kernel(Params(*(getattr(P, b)[lo:hi, ...] for b in BLOCKS)))    # (hi-lo, 1, H, d, d)
        return _flat(self.xp, _slice_data(self.data, lo, hi).features(K), 2)

    def keep_only(self, frozen: np.ndarray) -> None:
        """Forget the features of instances whose kernel is not frozen (it moves, or they idle)."""
        if np.any(self.filled & ~frozen):
            self.filled &= frozen
            self.pieces = [(lo, hi, a) for lo, hi, a in self.pieces if frozen[lo:hi].all()]

    def get(self, P: Params, lo: int, hi: int):
        """``φ`` of the instances ``lo..hi-1`` (all frozen now), at their kernels in ``P``."""
        todo = np.flatnonzero(~self.filled[lo:hi]) + lo
        if self.fused is not None:
            if self.buffer is None:
                H, d = P.WV.shape[-3], P.WV.shape[-2]
                self.buffer = np.zeros(tuple(self.data.q.shape[:3]) + (H * d,), dtype=self.data.S.dtype)
            for a, b in _runs(todo):
                self.buffer[a:b] = self._compute(P, a, b)
            self.filled[lo:hi] = True
            return self.buffer[lo:hi]
        inside = sorted(e for e in self.pieces if lo <= e[0] and e[1] <= hi)
        if len(inside) == 1 and inside[0][:2] == (lo, hi):
            return inside[0][2]
        parts = [(a, b, self._compute(P, a, b)) for a, b in _runs(todo)]
        parts = sorted(inside + parts, key=lambda e: e[0])
        phi = parts[0][2] if len(parts) == 1 else self.xp.concat([e[2] for e in parts], axis=0)
        self.pieces = [e for e in self.pieces if e[1] <= lo or e[0] >= hi] + [(lo, hi, phi)]
        self.filled[lo:hi] = True
        return phi


def _runs(indices) -> list[tuple[int, int]]:
    """Maximal runs ``[(a, b)]`` of consecutive integers in sorted ``indices``."""
    out: list[list[int]] = []
    for i in map(int, indices):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return [(a, b) for a, b in out]


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
    return sorted(range(len(members)), key=lambda i: (_rule_key(members[i].config),
                                                      -members[i].warmup_rounds, -members[i].start))


class _Ensemble:
    """The state of an ensemble's run (device arrays with a leading instance axis) and its rounds."""

    def __init__(self, members: list[Member], max_bytes, engine, keep_history):
        self.members = members
        config = members[0].config
        self.fed, self.model = config.federated, config.model
        first = members[0].data
        self.xp = xp = array_namespace(first.S)
        self.dtype = first.S.dtype
        self.count = len(members)
        self.data = _stack_data(xp, members)
        self.m, self.Nmax = self.data.S.shape[1], self.data.S.shape[2]
        self.T0 = np.array([mb.warmup_rounds for mb in members])
        self.start = np.array([mb.start for mb in members])
        self.seeds = [mb.config.seed for mb in members]
        feds = [mb.config.federated for mb in members]
        self.feds = feds
        self.eta = np.array([f.learning_rate for f in feds])
        self.lam = np.array([f.ridge for f in feds])
        self.rule_keys = [_rule_key(mb.config) for mb in members]
        self.rules = {key: make_strategy(feds[self.rule_keys.index(key)], 0) for key in self.rule_keys}
        self.name = self.rules[self.rule_keys[0]].name
        cache: dict = {}
        self.schedules = [cache.setdefault((key, mb.warmup_rounds),
                                           make_strategy(mb.config.federated, mb.warmup_rounds).schedule)
                          for key, mb in zip(self.rule_keys, members)]
        choice = self.model.engine if engine is None else engine
        self.fused = select_engine(choice, xp, self.data, self.fed, self.rules[self.rule_keys[0]],
                                   instances=True)
        self.features = _Features(xp, self.data, self.fused)
        self.max_bytes = max_bytes
        self.working = client_working_bytes(first, self.model.heads, self.fed.batch_size)
        self.keep_history = keep_history

    # -- pieces of a round ----------------------------------------------------------------------
    def sub(self, tree, lo, hi):
        return _tree_map(lambda a: a[lo:hi, ...], tree)

    def host_server(self, P: Params) -> Params:
        """Server blocks ``(I, H, d, r)`` as NumPy arrays (the fused engine's input)."""
        return Params(*(np.asarray(getattr(P, b))[:, 0] for b in BLOCKS))

    def client_losses(self, P: Params, lo: int, hi: int, phi=None):
        """``F_c`` ``(hi-lo, m)`` of the instances ``lo..hi-1`` at their parameters ``P`` (that group's)."""
        if self.fused is not None and phi is None:
            return self.fused.losses(self.host_server(P), lo)
        return _client_losses(self.xp, P, _slice_data(self.data, lo, hi), phi)

    def objective(self, P: Params, losses, lo: int, hi: int):
        """``(F, F_λ)`` per instance: ``Σ_c p_c F_c`` and ``+ ½λ‖W_V‖²``."""
        xp = self.xp
        F = xp.sum(self.data.weights[lo:hi, ...] * losses, axis=-1)
        lam = xp.asarray(self.lam[lo:hi], dtype=self.dtype)
        WV = xp.reshape(P.WV, (hi - lo, -1))
        return F, F + 0.5 * lam * xp.sum(WV * WV, axis=-1)

    def round_of_group(self, t, lo, hi, key, blocks, P, client_state, server_state):
        """Round ``t`` of the instances ``lo..hi-1`` (one rule group, one phase)."""
        xp, m, fed = self.xp, self.m, self.fed
        rule = self.rules[key]
        Pg = self.sub(P, lo, hi)
        data = _slice_data(self.data, lo, hi)
        cs, ss = self.sub(client_state, lo, hi), self.sub(server_state, lo, hi)
        kernel_frozen = "WQ" not in blocks and "WK" not in blocks
        phi = self.features.get(P, lo, hi) if kernel_frozen else None
        part = np.stack([_participants(t, m, fed.participation, self.seeds[i]) for i in range(lo, hi)])
        k = part.shape[1]
        if k == m:
            cw = data.weights
        else:
            rows = xp.asarray(_instance_rows(hi - lo, m, part))
            cw = xp.reshape(xp.take(xp.reshape(data.weights, (-1,)), rows, axis=0), (hi - lo, k))
        pw = cw / xp.sum(cw, axis=1, keepdims=True)
        eta = _per_instance(xp, [float(x) for x in self.eta[lo:hi]], self.dtype)
        lam = _per_instance(xp, [float(x) for x in self.lam[lo:hi]], self.dtype)
        rnd = Round(t, blocks, part, m, cw, pw, fed.local_steps, eta)
        anchor = {b: getattr(Pg, b) for b in blocks}
        if self.fused is not None:
            local = self.fused.train(self.host_server(Pg), blocks, part, fed.local_steps,
                                     self.eta[lo:hi], self.lam[lo:hi], phi, lo)
        else:
            inputs = (phi,) if kernel_frozen else (data.inputs, data.q)
            batches = None
            if fed.batch_size is not None:
                batches = np.stack([_minibatch_indices(t, part[j], data.sizes[j], self.Nmax,
                                                       fed.local_steps, fed.batch_size, self.seeds[lo + j])
                                    + j * m * self.Nmax for j in range(hi - lo)])
            chunks = client_chunks(k, (hi - lo) * self.working, self.max_bytes)
            pieces = [_local_training(xp, Pg, rnd, a, b, rule.client, cs, inputs, data, batches, eta,
                                      lam, fed.batch_size) for a, b in chunks]
            local = pieces[0] if len(pieces) == 1 else {
                b: xp.concat([piece[b] for piece in pieces], axis=1) for b in blocks}
        cs = rule.client.update(cs, rnd, anchor, local)
        zero = xp.zeros((hi - lo,), dtype=self.dtype)
        delta, drift = {}, [zero, zero, zero]
        for j, b in enumerate(BLOCKS):
            if b in blocks:
                average = weighted_sum(pw, local[b])
                delta[b] = average - anchor[b]
                drift[j] = xp.sum(pw * _sq_norms(xp, local[b] - average), axis=-1)
        step, ss = rule.server.update(ss, rnd, delta)
        Pn = Pg.replace(**{b: anchor[b] + step[b] for b in blocks})
        kernel_drift = zero
        if not kernel_frozen:
            WQ_c, WK_c = (local[b] if b in local else getattr(Pg, b) for b in ("WQ", "WK"))
            K_c = xp.matmul(WQ_c, xp.matrix_transpose(WK_c))
            kernel_drift = xp.sum(pw * _sq_norms(xp, K_c - kernel(Pn)), axis=-1)
        losses = self.client_losses(Pn, lo, hi, phi)
        F, F_reg = self.objective(Pn, losses, lo, hi)
        return Pn, cs, ss, (F, F_reg, losses, kernel_drift, xp.stack(drift, axis=-1)), k


@np.errstate(over="ignore", invalid="ignore")   # overflow is detected and reported as divergence
def run_ensemble(members: list[Member], *, max_bytes: int | None = None, engine: str | None = None,
                 keep_history: bool = False, progress: bool = False) -> list[tuple]:
    """Run ``members`` (of one :func:`ensemble_key`) as one ensemble (see the module docstring).

    Returns, in the members' order, ``(RunResult, {round: RunState}, history)``: the result as
    :func:`~linattn_theory.sim.engine.run_schedule` returns it; the states at the member's
    ``checkpoints`` it reached (strategy states in ensemble form: instance axis of length 1);
    with ``keep_history``, the host parameters ``[θ^start, …, θ^end]`` (else ``None``). Members
    all start at round 0 or all continue from a ``prefix``. ``engine`` overrides ``model.engine``;
    ``max_bytes`` bounds the working set of a chunk of one round's local steps (``None``: one chunk).
    """
    if not members:
        return []
    if len({mb.prefix is None for mb in members}) > 1:
        raise ValueError("run_ensemble: members start all at round 0 or all from a prefix")
    order = _sorted_members(members)
    ens = _Ensemble([members[i] for i in order], max_bytes, engine, keep_history)
    xp, count, m, dtype, T = ens.xp, ens.count, ens.m, ens.dtype, ens.fed.rounds
    P = Params(*(_stack(xp, [xp.reshape(getattr(mb.params, b), (1,) + tuple(getattr(mb.params, b).shape))
                             for mb in ens.members]) for b in BLOCKS))          # (I, 1, H, d, r)
    if ens.members[0].prefix is None:
        losses0 = ens.client_losses(P, 0, count)
        F0, F0_reg = ens.objective(P, losses0, 0, count)
        initial = best = warm = P
        best_loss = F0_reg
        states = {"client": [], "server": []}
        for lo, hi, key in _groups(ens.rule_keys):
            Pg = ens.sub(P, lo, hi)
            states["client"].append((lo, hi, ens.rules[key].client.init(Pg, m)))
            states["server"].append((lo, hi, ens.rules[key].server.init(Pg)))
        client_state = _assemble(xp, states["client"], None, count)
        server_state = _assemble(xp, states["server"], None, count)
        factor = xp.asarray([f.divergence_factor for f in ens.feds], dtype=dtype)
        threshold = factor * xp.maximum(F0_reg, xp.asarray(1e-12, dtype=dtype))
        origin = (F0, F0_reg, losses0)
    else:
        prefixes = [mb.prefix for mb in ens.members]
        lift = lambda ps: Params(*(_stack(xp, [xp.reshape(getattr(p, b), (1,) + tuple(getattr(p, b).shape))  # noqa: E731
                                               for p in ps]) for b in BLOCKS))
        initial, best = lift([p.initial for p in prefixes]), lift([p.best for p in prefixes])
        warm = lift([p.params if p.warmup_params is None else p.warmup_params for p in prefixes])
        best_loss = xp.asarray(np.array([p.best_loss for p in prefixes]), dtype=dtype)
        client_state = _tree_map(lambda *a: xp.concat(a, axis=0), *[p.client_state for p in prefixes])
        server_state = _tree_map(lambda *a: xp.concat(a, axis=0), *[p.server_state for p in prefixes])
        F0_reg = np.array([float(p.rows[0]["loss_regularized"]) for p in prefixes])
        factor = np.array([f.divergence_factor for f in ens.feds])
        threshold = xp.asarray(factor * np.maximum(F0_reg, 1e-12), dtype=dtype)
        origin = None

    alive = xp.ones((count,), dtype=xp.bool)
    diverged_at = xp.full((count,), -1, dtype=xp.int64)
    final = last_start = P
    first = int(ens.start.min())
    wanted = {r for mb in ens.members for r in mb.checkpoints}
    saved = {}
    if first in wanted:
        saved[first] = (P, best, best_loss, warm, client_state, server_state)
    history = [P] if keep_history else None
    records, blocks_seen, participants = [], [], []
    rounds = range(first, T)
    if progress:
        from tqdm.auto import tqdm
        rounds = tqdm(rounds, desc=f"rounds of {count} runs", unit="round", leave=False)
    for t in rounds:
        active = ens.start <= t
        if np.any(active & (ens.T0 == t)):           # θ^{T0}, for the instances that reach it
            warm = _where(xp, alive & _mask(xp, active & (ens.T0 == t), 1), P, warm)
        blocks = [tuple(ens.schedules[i](t)) if active[i] else None for i in range(count)]
        ens.features.keep_only(np.array([b is not None and "WQ" not in b and "WK" not in b for b in blocks]))
        pieces: dict[str, list] = {"P": [], "client": [], "server": [], "row": []}
        ks = np.zeros(count, dtype=np.int64)
        for lo, hi, (key, group_blocks) in _groups([None if b is None else (ens.rule_keys[i], b)
                                                    for i, b in enumerate(blocks)]):
            Pn, cs, ss, row, k = ens.round_of_group(t, lo, hi, key, group_blocks, P, client_state,
                                                    server_state)
            for name, value in zip(("P", "client", "server", "row"), (Pn, cs, ss, row)):
                pieces[name].append((lo, hi, value))
            ks[lo:hi] = k
        idle = xp.zeros((count,), dtype=dtype)
        row = _assemble(xp, pieces["row"], (idle, idle, xp.zeros((count, m), dtype=dtype), idle,
                                            xp.zeros((count, 3), dtype=dtype)), count)
        start_params = P
        P = _assemble(xp, pieces["P"], P, count)
        client_state = _assemble(xp, pieces["client"], client_state, count)
        server_state = _assemble(xp, pieces["server"], server_state, count)
        records.append(row)
        blocks_seen.append(blocks)
        participants.append(ks)
        F_reg = row[1]
        running = alive & _mask(xp, active, 1)
        better = running & (F_reg < best_loss)
        best = _where(xp, better, P, best)
        best_loss = xp.where(better, F_reg, best_loss)
        last_start = _where(xp, running, start_params, last_start)
        final = _where(xp, running, P, final)
        bad = running & (~xp.isfinite(F_reg) | (F_reg > threshold))
        diverged_at = xp.where(bad, xp.asarray(t + 1, dtype=xp.int64), diverged_at)
        alive = alive & ~bad
        if t + 1 in wanted:
            saved[t + 1] = (P, best, best_loss, warm, client_state, server_state)
        if keep_history:
            history.append(P)
        if _all_diverged(xp, alive, t - first):
            break
    outcome = _Outcome(ens, records, blocks_seen, participants, first, origin, diverged_at, final,
                       warm, initial, best, last_start, saved, history)
    results = [outcome.member(i) for i in range(count)]
    back = [None] * count
    for position, i in enumerate(order):
        back[i] = results[position]
    return back


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

    def __init__(self, ens: _Ensemble, records, blocks_seen, participants, first, origin, diverged_at,
                 final, warm, initial, best, last_start, saved, history):
        xp = ens.xp
        self.ens, self.first = ens, first
        self.blocks, self.participants = blocks_seen, participants
        host = lambda a: np.asarray(to_numpy(a))  # noqa: E731
        if records:
            self.F, self.F_reg, self.losses, self.kernel_drift, self.drift = (
                host(xp.stack([r[j] for r in records], axis=0)) for j in range(5))
        self.origin = None if origin is None else tuple(host(a) for a in origin)
        self.diverged_at = host(diverged_at)
        self.final, self.warm, self.initial, self.best, self.last_start = final, warm, initial, best, last_start
        self.saved = saved
        self.history = None
        if history is not None:
            self.history = Params(*(host(xp.stack([getattr(P, b) for P in history], axis=0))
                                    for b in BLOCKS))          # (rounds, I, 1, H, d, r)

    def params(self, P: Params, i: int) -> Params:
        """Instance ``i``'s parameters ``(H, d, r)`` (on the device)."""
        return Params(*(getattr(P, b)[i, 0, ...] for b in BLOCKS))

    def rows(self, i: int, end: int) -> list:
        ens, mb = self.ens, self.ens.members[i]
        if mb.prefix is None:
            F0, F0_reg, losses0 = self.origin
            rows = [_row(0, "init", float(F0[i]), float(F0_reg[i]), losses0[i], 0.0, 0.0,
                         {b: 0.0 for b in BLOCKS}, ens.m, ens.name)]
        else:
            rows = list(mb.prefix.rows)
        gamma = float(rows[-1]["cumulative_kernel_drift"])
        for t in range(mb.start, end):
            j = t - self.first
            blocks = self.blocks[j][i]
            drift = {b: float(self.drift[j, i, q]) if b in blocks else 0.0 for q, b in enumerate(BLOCKS)}
            kernel_drift = 0.0
            if "WQ" in blocks or "WK" in blocks:
                kernel_drift = float(self.kernel_drift[j, i])
                gamma += kernel_drift
            rows.append(_row(t + 1, _stage(blocks), float(self.F[j, i]), float(self.F_reg[j, i]),
                             self.losses[j, i], kernel_drift, gamma, drift, int(self.participants[j][i]),
                             ens.name))
        return rows

    def member(self, i: int):
        ens, mb = self.ens, self.ens.members[i]
        T, T0 = ens.fed.rounds, mb.warmup_rounds
        diverged = self.diverged_at[i] >= 0
        end = int(self.diverged_at[i]) if diverged else T
        rows = self.rows(i, end)
        final = self.params(self.final, i)
        warm = self.params(self.warm, i) if T0 < end else final
        divergence = None
        if diverged:
            j = end - 1 - self.first
            points = [self.params(P, i) for P in (self.initial, self.best, self.last_start)]
            divergence = _divergence(end, float(self.F_reg[j, i]), points, mb.data, float(ens.lam[i]),
                                     float(ens.eta[i]), self.blocks[j][i])
        result = _result(rows, final, warm, divergence, T0, ens.name)
        result.metadata["engine"] = "array_api" if ens.fused is None else "fused"
        states = {}
        for r in mb.checkpoints:
            if r in self.saved and mb.start <= r <= end:
                P, best, best_loss, warm_r, cs, ss = self.saved[r]
                params = self.params(P, i)
                reached = self.params(warm_r, i) if r > T0 else params if r == T0 else None
                one = lambda a: a[i:i + 1, ...]  # noqa: E731
                states[r] = RunState(r, params, tuple(rows[:r + 1]), self.params(self.initial, i),
                                     self.params(best, i), float(to_numpy(best_loss)[i]), reached,
                                     _tree_map(one, cs), _tree_map(one, ss))
        history = None
        if self.history is not None:
            history = [Params(*(getattr(self.history, b)[j, i, 0] for b in BLOCKS))
                       for j in range(mb.start - self.first, end - self.first + 1)]
        return result, states, history


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


def _data_bytes(data: StackedClients) -> int:
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
        free, _ = cupy.cuda.Device().mem_info
        return free // 2
    return None


def _local_chunk_bytes(xp, data: StackedClients, heads: int, batch_size, count: int) -> int | None:
    """A round's local-step chunk budget (:func:`~linattn_theory.core.backend.resolve_max_bytes`'s policy
    applied to the ensemble's round working set)."""
    from array_api_compat import is_numpy_namespace
    from ..core.backend import CPU_CHUNK_BYTES
    if not is_numpy_namespace(xp):
        return None
    total = count * data.S.shape[0] * client_working_bytes(data, heads, batch_size)
    return None if total <= 2 * CPU_CHUNK_BYTES else CPU_CHUNK_BYTES


class _Plan:
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


def simulate_many(configs, clients=None, *, params=None, max_bytes: int | str | None = "auto",
                  progress: bool = False) -> list[RunResult]:
    """Run every config, in ensembles of equal shapes; the results in the configs' order.

    Each result equals ``simulate(config)`` (:func:`~linattn_theory.sim.engine.simulate`) to
    rounding: the same table, parameters, divergence report and metadata (``metadata["engine"]``
    names the engine that ran it: in an ensemble the fused CPU engine wherever it applies and an
    instance's step is not tiny, :func:`~linattn_theory.sim.engine.select_engine`).
    ``clients`` and ``params`` are ``None`` or one entry per config (``None`` entries: built from
    the config, as :func:`simulate` does). ``max_bytes`` bounds the data of one ensemble (more
    instances form more ensembles, run one after another; ``"auto"``: 1 GiB on NumPy, half the
    free memory of a GPU; ``None``: no bound); results do not depend on it. FedFrozen runs that
    differ only in ``T0`` share their warm-up, and so does the online rule's run of their instance
    when its ``T0 = T`` run is among them (module docstring); other runs of a strategy that decides
    during the run (a per-round control) are run one by one by :func:`simulate`.
    Given clients are checked before any round, and settings to revisit warned about once each,
    as :func:`simulate` does.
    """
    configs, clients = _checked(configs, clients)
    with warnings.catch_warnings():                  # said once above, not again per run
        warnings.simplefilter("ignore", SettingWarning)
        return _simulate_many(configs, clients, params, max_bytes, progress)


def _checked(configs, clients):
    """``(configs, clients)`` with the given clients checked
    (:func:`~linattn_theory.core.clients.check_clients`) and the settings' warnings issued once."""
    from .limits import setting_notes, warn_settings
    configs = list(configs)
    if clients is not None:
        given, checked = _per_config(clients, len(configs), "clients"), {}
        for c in given:                     # one object given for several configs stays one (shared warm-ups)
            if c is not None and id(c) not in checked:
                checked[id(c)] = check_clients(c)
        clients = [None if c is None else checked[id(c)] for c in given]
    given = clients or [None] * len(configs)
    warn_settings((note for config, c in zip(configs, given) if isinstance(config, RunConfig)
                   for note in setting_notes(config, c)), stacklevel=4)
    return configs, clients


@timed_run
def _simulate_many(configs, clients, params, max_bytes, progress: bool, trajectories: dict | None = None):
    """:func:`simulate_many`; with a dict ``trajectories``, also ``trajectories[i] = (data, states)``
    for every config ``i`` that leads a shared warm-up and whose ``T0 = T``: its stacked clients and
    its states after rounds ``0..T`` (up to its divergence round), as
    :func:`~linattn_theory.sim.engine.run_schedule` passes them to ``on_round``."""
    from .engine import simulate
    configs = list(configs)
    count = len(configs)
    for i, config in enumerate(configs):
        if not isinstance(config, RunConfig):
            raise TypeError(f"configs[{i}] is a {type(config).__name__}; expected a RunConfig")
    clients = _per_config(clients, count, "clients")
    params = _per_config(params, count, "params")
    results: list[RunResult | None] = [None] * count
    families: dict = {}
    for i, config in enumerate(configs):
        key = _family_key(config, clients[i], params[i])
        if key is None and _decides_during_the_run(config):
            results[i] = simulate(config, clients[i], params=params[i], max_bytes=max_bytes)
            continue
        families.setdefault(key if key is not None else ("run", i), []).append(i)
    for key, indices in list(families.items()):
        # the online rule's run shares the warm-up of the FedFrozen run with T0 = T (the trajectory
        # it follows until it freezes); without one in the family it runs alone
        if not any(configs[i].warmup_rounds == configs[i].federated.rounds and not _is_online(configs[i])
                   for i in indices):
            for i in indices:
                if _is_online(configs[i]):
                    results[i] = simulate(configs[i], clients[i], params=params[i], max_bytes=max_bytes)
            families[key] = [i for i in indices if results[i] is None]
            if not families[key]:
                del families[key]
    first = next((i for i in range(count) if results[i] is None), None)
    if first is None:
        return results
    xp = get_namespace(configs[first].model.backend)
    plan = _Plan(ensemble_bytes(max_bytes, xp))
    for indices in families.values():
        runs = [i for i in indices if not _is_online(configs[i])]
        config = configs[runs[0]]
        built = clients_from_config(config) if clients[runs[0]] is None else clients[runs[0]]
        data, theta0 = prepare_run(config, built, params[runs[0]])
        _warn_small_clients(config.federated.batch_size, data.sizes)
        warmups = sorted({configs[i].warmup_rounds for i in runs})
        family = _Family(runs, configs, data, theta0, built, warmups if len(warmups) > 1 else None,
                         [i for i in indices if _is_online(configs[i])], trajectories)
        if plan.add(ensemble_key(config, data), family, 2 * _data_bytes(data)):
            _run_wave(plan.drain(), results, progress)
    _run_wave(plan.drain(), results, progress)
    return results


def _decides_during_the_run(config: RunConfig) -> bool:
    """A strategy with a per-round :class:`~linattn_theory.sim.strategies.Control` (the online
    rule): its schedule depends on host decisions every round, so it runs alone (:func:`simulate`)."""
    return make_strategy(config.federated, config.warmup_rounds).control is not None


def _per_config(values, count: int, what: str) -> list:
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
    (``indices``), and the online rule's runs that follow the ``T0 = T`` one until they freeze
    (``online``)."""

    indices: list[int]
    configs: list
    data: StackedClients
    theta0: Params
    clients: Any
    warmups: list[int] | None          # shared warm-up: the T0 values (largest first runs)
    online: list[int] = dataclasses.field(default_factory=list)  # the online rule's runs (T0 = T leads)
    trajectories: dict | None = None   # where to hand out a T0 = T lead's states (_simulate_many)
    replays: dict = dataclasses.field(default_factory=dict)   # their _OnlineReplay, by index
    by_T0: dict = dataclasses.field(default_factory=dict)     # the results, by T0
    history: dict = dataclasses.field(default_factory=dict)   # θ^0, θ^1, … of each run (test metrics)

    def lead(self) -> RunConfig:
        """The run of the first ensemble: the largest ``T0`` (the others' warm-up trajectory)."""
        return self.configs[self.lead_index()]

    def lead_index(self) -> int:
        return max(self.indices, key=lambda i: self.configs[i].warmup_rounds)

    def every_state(self) -> bool:
        """Whether the lead keeps its state after every round: for the online rule's runs, and
        when its trajectory is asked for and is plain FedAvg (``T0 = T``)."""
        lead = self.lead()
        return bool(self.online) or (self.trajectories is not None
                                     and lead.warmup_rounds == lead.federated.rounds)


def _run_wave(buckets: list[list[_Family]], results: list, progress: bool) -> None:
    """Run the families of each bucket: their leading runs as one ensemble, then the frozen stages
    of the shared warm-ups as a second; store each result at its configs' positions."""
    for families in buckets:
        members = [Member(f.lead(), f.data, f.theta0,
                          checkpoints=tuple(range(f.lead().federated.rounds + 1)) if f.every_state()
                          else tuple(f.warmups[:-1]) if f.warmups else ()) for f in families]
        xp = array_namespace(families[0].data.S)
        model, fed = families[0].lead().model, families[0].lead().federated
        chunk = _local_chunk_bytes(xp, families[0].data, model.heads, fed.batch_size, len(members))
        keep = any(_has_test_split(f.clients) for f in families)
        outcomes = run_ensemble(members, max_bytes=chunk, keep_history=keep, progress=progress)
        second, owners = [], []
        for family, (result, states, history) in zip(families, outcomes):
            lead = family.lead().warmup_rounds
            family.by_T0[lead], family.history[lead] = result, history
            if family.trajectories is not None and family.every_state():
                family.trajectories[family.lead_index()] = (family.data, [states[t] for t in sorted(states)])
            for T0 in (family.warmups or [])[:-1]:
                config = next(family.configs[i] for i in family.indices
                              if family.configs[i].warmup_rounds == T0)
                if result.diverged and T0 >= result.divergence.round:     # diverged in its warm-up
                    family.by_T0[T0] = dataclasses.replace(result, table=result.table.copy(),
                                                           metadata=dict(result.metadata, warmup_rounds=T0))
                    family.history[T0] = history
                else:
                    state = states[T0]
                    second.append(Member(config, family.data, state.params, prefix=state))
                    owners.append((family, T0))
            for i in family.online:          # the online rule's runs: its control replayed on the lead
                replay = family.replays[i] = _OnlineReplay(family.configs[i], family.data, result, states)
                family.by_T0[("online", i)], family.history[("online", i)] = result, history
                if replay.freeze is not None:
                    second.append(replay.continuation())
                    owners.append((family, ("online", i)))
        if second:
            for (family, T0), (result, _, history) in zip(owners, run_ensemble(
                    second, max_bytes=chunk, keep_history=keep, progress=progress)):
                family.by_T0[T0] = result
                if keep:                  # the shared warm-up's θ^0..θ^T0, then the run's own
                    lead = family.lead().warmup_rounds
                    if isinstance(T0, tuple):     # an online run: θ^0..θ^t, then its frozen rounds
                        t = family.replays[T0[1]].stop_round
                        family.history[T0] = family.history[lead][:t + 1] + history[1:]
                    else:
                        family.history[T0] = family.history[lead][:T0] + history
        for family in families:
            for i in family.online:
                config = family.configs[i]
                result = family.replays[i].result(family.by_T0[("online", i)])
                result.metadata.update(run_metadata(config))
                _add_test_metrics(result, family.clients, config, family.history.get(("online", i)))
                results[i] = result
            for i in family.indices:
                config = family.configs[i]
                result = family.by_T0[config.warmup_rounds]
                if any(results[j] is result for j in family.indices if results[j] is not None):
                    result = dataclasses.replace(result, table=result.table.copy(),
                                                 metadata=dict(result.metadata))
                result.metadata.update(run_metadata(config))
                _add_test_metrics(result, family.clients, config, family.history.get(config.warmup_rounds))
                results[i] = result


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
        table = run.table.copy()
        table["strategy"] = self.strategy.name
        result = dataclasses.replace(run, table=table, metadata=dict(
            run.metadata, warmup_rounds=self.config.warmup_rounds, strategy=self.strategy.name))
        result.metadata.update(self.strategy.control.finish(result))
        return result


def _add_test_metrics(result: RunResult, clients, config: RunConfig, history) -> None:
    """Test loss and accuracy per round (clients with a test split, as :func:`simulate` adds them)."""
    test, on_round = _test_metrics(clients, config)
    if on_round is None or history is None:
        return
    for t, theta in enumerate(history):
        on_round(RunState(t, theta, (), None, None, 0.0, None, None, None))
    for key in ("loss", "accuracy"):
        result.table[f"test_{key}"] = [test[t][key] for t in result.table["round"]]
    result.metadata["test"] = test[int(result.table["round"].iloc[-1])]
