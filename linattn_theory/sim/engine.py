"""The federated round engine: FedAvg, FedFrozen and the other strategies (docs/theory.md §3).

Round ``t``: the server sends ``θ^t``; each participating client runs ``E`` local gradient
steps with step ``η`` on its own ``F_{λ,c}`` (full batch or minibatches of size ``b``), plus the
strategy's gradient correction (FedProx, SCAFFOLD); the server takes the strategy's step on the
weighted mean delta ``Δ = Σ_c p̃_c θ_c − θ^t`` (``p̃_c`` the weights renormalised over the
participants; FedAvg: ``θ^t + η_s Δ``). The strategy's schedule says which blocks train in round
``t``: FedFrozen ("FedFrozen: Two-Stage Federated Optimization via Attention Kernel Freezing", arXiv:2605.06446) updates every block for ``t < T0``
and only ``W_V`` afterwards (``W_Q``, ``W_K`` are never touched, so they stay bit-identical);
FedAvg (McMahan et al. 2017) is ``T0 = T``. The strategies live in
:mod:`linattn_theory.sim.strategies`, one module each.

All clients' local steps run at once as batched array operations (leading client axis), or,
with the fused CPU engine (:mod:`linattn_theory.core.fused`), client by client in compiled kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..core.arrays import array_namespace, to_numpy
from ..core.backend import client_chunks, client_working_bytes, get_namespace, resolve_max_bytes
from .config import FederatedConfig, RunConfig
from ..core import fused as _fused
from ..core.errors import ConfigError
from ..core.io import provenance, timed_run
from ..core.model import (BLOCKS, Params, flat as _flat, value_matrix as _value_matrix, kernel, loss_and_grad_from_contexts, loss_and_grad_from_moments)
from .strategies import Round, Strategy, make_strategy
from .strategies.base import local_sgd, weighted_sum
from ..core.seeds import SEED_INIT, SEED_MINIBATCH, SEED_PARTICIPATION, seed_sequence
from ..core.clients import StackedClients, check_clients, stack_clients
from ..data.families import make_clients

__all__ = ["simulate", "run_schedule", "clients_from_config", "initial_params", "prepare_run",
           "run_metadata", "RunResult", "RunState", "Divergence", "value_curvature",
           "stable_learning_rate", "hessian_curvature", "select_engine"]


@dataclass(frozen=True)
class Divergence:
    """A run stopped because ``F`` became non-finite or exceeded the threshold."""

    round: int
    loss: float
    stable_learning_rate: float
    message: str


@dataclass
class RunResult:
    """The outcome of one run: the per-round table, the final and the round-``T0`` parameters."""

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


def clients_from_config(config: RunConfig):
    """The clients of ``config.task`` (docs/theory.md §2), seeded by ``config.seed``."""
    from .config import FAMILY_KEYS
    task = config.task
    options = {k: getattr(task, k) for k in FAMILY_KEYS[task.family]}
    return make_clients(task.family, seed=config.seed, **options)


def initial_params(config: RunConfig, d: int, p: int) -> Params:
    """``θ^0``: :meth:`Params.init` seeded from the run's ``SeedSequence`` (purpose ``init``)."""
    m = config.model
    return Params.init(d, m.rank, p, heads=m.heads, scale=m.init_scale,
                       seed=seed_sequence(config.seed, SEED_INIT), dtype=np.dtype(m.dtype))


def value_curvature(K, data: StackedClients, ridge: float = 0.0):
    """``λ_max(Ã_c)`` per client, ``Ã_c = Σ_i w_i φ_i φ_i^T + λ I`` (docs/theory.md §5); host array ``(m,)``."""
    xp = array_namespace(data.S)
    phi = _flat(xp, data.features(K), 2)
    A = xp.matmul(xp.matrix_transpose(phi), phi * data.sample_weight[..., None])
    return np.linalg.eigvalsh(to_numpy(A))[:, -1] + ridge


def stable_learning_rate(K, data: StackedClients, ridge: float = 0.0) -> float:
    """The value block's stability limit ``2 / max_c λ_max(Ã_c)`` (docs/theory.md §5)."""
    return float(2.0 / np.max(value_curvature(K, data, ridge)))


def hessian_curvature(params, data: StackedClients, ridge: float = 0.0,
                      iterations: int = 50, seed: int = 0) -> np.ndarray:
    """``λ_max(∇²F_{λ,c}(θ))`` per client for the full model, by power iteration (host array ``(m,)``).

    Hessian-vector products are central differences of the closed-form gradients,
    ``Hv ≈ (∇F(θ + εv) − ∇F(θ − εv)) / 2ε``, ``ε = 10⁻⁵ max(1, max|θ|)``; all clients are iterated at
    once. ``params`` may also be a sequence of points ``θ``: then all points and clients are iterated
    at once and the result is ``(points, m)``, each row what ``θ`` alone gives, bit for bit.
    """
    xp = array_namespace(data.S)
    single = isinstance(params, Params)
    points = [params] if single else list(params)
    m, count = data.S.shape[0], len(points)
    rng = np.random.default_rng(seed)

    def tile(a):                         # the clients' rows once per point: (count·m, ...)
        return a if count == 1 else xp.concat([a] * count, axis=0)

    stacked = Params(*(xp.concat([xp.broadcast_to(getattr(P, b), (m,) + tuple(getattr(P, b).shape))
                                  for P in points], axis=0) for b in BLOCKS))
    inputs, q, y, weight = (tile(a) for a in (data.inputs, data.q, data.y, data.sample_weight))

    def grad(P):
        _, g = _loss_and_grad(P, inputs, q, y, weight, attention=data.attention, temperature=data.temperature)
        return g.replace(WV=g.WV + ridge * P.WV)

    def norm(v):
        return xp.sqrt(sum(_sq_norm(xp, getattr(v, b)) for b in BLOCKS))

    def rows(c, a):                      # a per-row factor c as a column that broadcasts against a
        return xp.reshape(c, (-1,) + (1,) * (a.ndim - 1))

    def scale(v, c):
        return v.map(lambda a: a * rows(c, a))

    v = Params(*(tile(xp.asarray(rng.normal(size=(m,) + tuple(getattr(points[0], b).shape)),
                                 dtype=getattr(stacked, b).dtype)) for b in BLOCKS))
    v = scale(v, 1.0 / norm(v))
    sizes = [max(float(to_numpy(xp.max(xp.abs(getattr(P, b))))) for b in BLOCKS) for P in points]
    eps = xp.asarray(np.repeat([1e-5 * max(size, 1.0) for size in sizes], m), dtype=data.S.dtype)
    estimate = xp.zeros((count * m,), dtype=data.S.dtype)
    for _ in range(iterations):
        plus = grad(stacked.map(lambda a, u: a + rows(eps, u) * u, v))
        minus = grad(stacked.map(lambda a, u: a - rows(eps, u) * u, v))
        hv = plus.map(lambda a, b: (a - b) / rows(2 * eps, a), minus)
        estimate = norm(hv)
        v = scale(hv, 1.0 / xp.maximum(estimate, xp.asarray(1e-300, dtype=estimate.dtype)))
    estimate = to_numpy(estimate)
    return estimate if single else estimate.reshape(count, m)


def prepare_run(config: RunConfig, clients=None, params: Params | None = None):
    """``(data, θ^0)`` of ``config``: stacked clients and initial parameters on ``model.backend``."""
    xp = get_namespace(config.model.backend)
    clients = clients_from_config(config) if clients is None else clients
    data = stack_clients(clients, xp=xp, dtype=np.dtype(config.model.dtype),
                         attention=config.model.attention, temperature=config.model.temperature)
    d, p = data.q.shape[-1], data.y.shape[-1]
    if params is None:
        params = initial_params(config, d, p)
    else:
        from ..core.model import validate_params as _validate_params
        _validate_params(params, d, p)
    return data, params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))


def run_metadata(config: RunConfig) -> dict:
    """The metadata record of a run of ``config``: full config, seed, version, git revision and
    whether the tree was modified, and ``provenance`` (host, platform, library versions;
    :func:`~linattn_theory.core.io.provenance`)."""
    from .. import __version__

    record = provenance()
    top = {key: record.pop(key) for key in ("version", "git_revision", "git_dirty")}
    top["version"] = top["version"] or __version__          # a source tree that is not installed
    return {"config": config.to_dict(), "seed": config.seed, **top, "provenance": record}


@timed_run
def simulate(config: RunConfig, clients=None, *, progress: bool = False,
             params: Params | None = None, frozen_features=None,
             max_bytes: int | str | None = "auto", strategy: Strategy | None = None) -> RunResult:
    """Run ``config`` end to end: build the clients, initialise, run the schedule.

    ``frozen_features`` is passed to :func:`run_schedule` (features of the frozen stage).
    ``max_bytes`` bounds a round's working set (see :func:`run_schedule`; ``"auto"``:
    cache-sized chunks of clients on the CPU when the round does not fit in cache, one chunk
    on a GPU, :func:`~linattn_theory.core.backend.resolve_max_bytes`); results do not depend on it.
    ``strategy`` overrides the one ``config`` names (built by
    :func:`~linattn_theory.sim.strategies.make_strategy`), e.g. to keep its control's record.
    Given ``clients`` are checked first (:func:`~linattn_theory.core.clients.check_clients`:
    shapes, finite values; a ``ValueError`` names the client and the array), and settings to
    revisit are warned about (:func:`~linattn_theory.sim.limits.setting_notes`).
    """
    from .limits import setting_notes, warn_settings
    clients = clients_from_config(config) if clients is None else check_clients(clients)
    warn_settings(setting_notes(config, clients), stacklevel=4)   # past timed_run, at the caller
    data, params = prepare_run(config, clients, params)
    _warn_small_clients(config.federated.batch_size, data.sizes)
    if config.model.dtype == "float32":
        from .limits import float32_step_note
        note = float32_step_note(config, data, params)
        if note:
            import warnings
            warnings.warn(note, RuntimeWarning, stacklevel=3)
    max_bytes = resolve_max_bytes(max_bytes, data, config.model.heads, config.federated.batch_size)
    test, on_round = _test_metrics(clients, config)
    result = run_schedule(params, data, config.federated, config.warmup_rounds, config.seed,
                          progress=progress, strategy=strategy, frozen_features=frozen_features,
                          max_bytes=max_bytes, on_round=on_round, engine=config.model.engine)
    result.metadata.update(run_metadata(config))
    if test:
        for key in ("loss", "accuracy"):
            result.table[f"test_{key}"] = [test[t][key] for t in result.table["round"]]
        result.metadata["test"] = test[int(result.table["round"].iloc[-1])]
    return result


def _why_not(xp, data, fed, strategy) -> str | None:
    """The reason the fused engine does not apply to this run, or ``None`` when it does."""
    from array_api_compat import is_numpy_namespace

    if not is_numpy_namespace(xp):
        return "it runs on NumPy arrays only (use the Array-API engine on other backends)"
    if getattr(data, "attention", "linear") != "linear":
        return "it runs linear attention only (softmax needs the contexts X, docs/theory.md §9)"
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


def select_engine(engine: str, xp, data, fed, strategy, *, instances: bool = False) -> "_fused.FusedEngine | None":
    """The :class:`FusedEngine` of a run, or ``None`` for the Array-API engine (see the module doc).

    ``instances=True``: ``data`` is an ensemble's (leading instance axis,
    :mod:`linattn_theory.sim.ensemble`), and ``engine="auto"`` takes the fused engine where it
    applies and one instance's step has ``m·N·d² ≥`` :data:`~linattn_theory.core.fused.MIN_ENSEMBLE_WORK`
    (the ensemble repays loading the kernels): a rule of the instance alone, so that an
    instance's engine does not depend on the others in its ensemble.
    """
    if engine not in _fused.ENGINES:
        raise ConfigError(f"engine = {engine!r}: expected one of {', '.join(map(repr, _fused.ENGINES))}")
    if engine == "array_api":
        return None
    reason = _why_not(xp, data, fed, strategy)
    if engine == "fused":
        if reason is not None:
                raise ConfigError(f"engine = 'fused' does not apply: {reason}; use engine = 'auto' "
                              f"or 'array_api'")
        return _fused.FusedEngine(data, instances)
    m, N, d = data.S.shape[-4], data.S.shape[-3], data.S.shape[-1]
    least = _fused.MIN_ENSEMBLE_WORK if instances else _fused.MIN_STEP_WORK
    if reason is not None or m * N * d * d < least:
        return None
    return _fused.FusedEngine(data, instances)


def _warn_small_clients(batch_size: int | None, sizes) -> None:
    """Warn when a minibatch is larger than some client's sample count (then drawn with replacement)."""
    if batch_size is None:
        return
    small = int(np.sum(np.asarray(sizes) < batch_size))
    if small:
        import warnings
        warnings.warn(f"federated.batch_size = {batch_size} exceeds the sample count of {small} "
                      f"client(s) (smallest N_c = {int(np.min(sizes))}); their minibatches are drawn "
                      f"with replacement", RuntimeWarning, stacklevel=3)


def _test_metrics(clients, config: RunConfig):
    """``(records, on_round)``: test loss and accuracy per round when the clients hold a test split.

    Clients with ``truth["test_X"]`` (real data, :mod:`linattn_theory.data.digits`) get the columns
    ``test_loss`` and ``test_accuracy``; otherwise ``({}, None)``.
    """
    truth = getattr(clients, "truth", None) or {}
    if "test_X" not in truth:
        return {}, None
    from ..data.digits import evaluate
    records = {}
    test = (truth["test_X"], truth["test_q"], truth["test_y"])
    model = config.model

    def on_round(state):
        with np.errstate(all="ignore"):
            records[state.round] = evaluate(state.params, *test, model.attention, model.temperature)
    return records, on_round


def _participants(t: int, m: int, fraction: float, seed: int) -> np.ndarray:
    """Clients of round ``t``: all, or ``max(1, round(fraction·m))`` drawn without replacement."""
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


def _take(xp, a, idx):
    """Rows ``idx`` (host integer array of any shape) of ``a`` flattened over its first two axes."""
    flat = xp.reshape(a, (a.shape[0] * a.shape[1],) + tuple(a.shape[2:]))
    rows = xp.take(flat, xp.asarray(idx.reshape(-1)), axis=0)
    return xp.reshape(rows, idx.shape + tuple(a.shape[2:]))


def _weighted_sum(xp, weights, a):
    """``Σ_c w_c a_c`` over the leading axis."""
    return weighted_sum(weights, a)


def _sq_norm(xp, a):
    """``‖a_c‖_F²`` per leading index."""
    return xp.sum(xp.reshape(a * a, (a.shape[0], -1)), axis=1)


def _client_losses(xp, params: Params, data: StackedClients, phi=None):
    """``F_c(θ)`` for every client (weighted sample means), shape ``(m,)``; an ensemble's
    ``(I, m)`` from parameters ``(I, 1, H, d, r)`` and data ``(I, m, ...)``."""
    if phi is None:
        loss, _ = _loss_and_grad(params, data.inputs, data.q, data.y, data.sample_weight, blocks=(),
                                 attention=data.attention, temperature=data.temperature)
        return loss
    e = xp.matmul(phi, _value_matrix(xp, params.WV)) - data.y
    return 0.5 * xp.sum(e * e * data.sample_weight[..., None], axis=(-2, -1))


@np.errstate(over="ignore", invalid="ignore")   # overflow is detected and reported as divergence
def run_schedule(params: Params, data: StackedClients, fed: FederatedConfig, warmup_rounds: int,
                 seed: int = 0, *, progress: bool = False, strategy: Strategy | None = None,
                 frozen_features=None, max_bytes: int | None = None, prefix: RunState | None = None,
                 on_round=None, engine: str = "auto") -> RunResult:
    """Run ``fed.rounds`` rounds of ``fed.strategy`` from ``params`` on stacked clients.

    ``warmup_rounds`` is ``T0``: the round at which FedFrozen-type strategies freeze blocks, and
    the round whose parameters are returned as ``warmup_params``. ``strategy`` overrides the one
    named in ``fed`` (any :class:`~linattn_theory.sim.strategies.Strategy`). While the kernel is
    frozen (only ``W_V`` trains) the model is linear in ``V`` with features ``φ`` computed once
    at the frozen kernel (docs/theory.md §5); ``frozen_features(params) -> φ`` of shape
    ``(m, N, H·d)`` replaces them (static heads, :mod:`linattn_theory.theory.static_heads`).

    ``max_bytes`` bounds the working set a round adds to the stacked data: the participants'
    local steps run in chunks of clients (:func:`~linattn_theory.core.backend.client_chunks`; ``None``:
    one chunk). Each chunk sees the client rule's state through a :class:`Round` restricted to
    its participants, and the rule's state update and the server step see all of them, so the
    results are identical for every budget (a client rule's correction must act on each
    participant separately, as every rule of :mod:`linattn_theory.sim.strategies` does).

    ``engine`` runs the local steps: ``"array_api"`` as batched Array-API products over the
    clients (the reference, any backend), ``"fused"`` with the fused CPU engine
    (:mod:`linattn_theory.core.fused`: NumPy, full batches, no gradient correction; equal to
    rounding), ``"auto"`` the fused engine where it applies and pays (then ``max_bytes`` is
    moot: it holds one client at a time). ``metadata["engine"]`` records the one used.

    A strategy with a :class:`~linattn_theory.sim.strategies.Control` decides its schedule during
    the run: ``control.observe(state, data)`` sees every round's :class:`RunState` (after
    ``on_round``) until it returns a :class:`~linattn_theory.sim.strategies.Freeze`; while rounds
    remain, the run then continues from the freeze's parameters with only ``W_V`` training, and
    ``warmup_params`` are those parameters; ``control.finish(result)`` adds to the metadata.

    ``on_round(state)`` is called with the :class:`RunState` of every round the run reaches
    (``θ^t`` and all the loop carries). ``prefix`` continues a run from such a state (then
    ``params`` must be ``prefix.params``): the rounds after ``prefix.round`` follow exactly as in
    the uninterrupted run, provided the strategy agrees with the earlier run's on the rounds
    before (shared warm-up prefixes, :mod:`linattn_theory.sim.warmup_grid`).

    Returns the per-round table (row ``t`` describes ``θ^t``; drift columns describe the round
    that produced it), the final parameters and those at round ``T0``.
    """
    xp = array_namespace(data.S)
    m, Nmax = data.S.shape[0], data.S.shape[1]
    H = params.WV.shape[-3]
    T, T0, E, eta, lam = fed.rounds, warmup_rounds, fed.local_steps, fed.learning_rate, fed.ridge
    strategy = make_strategy(fed, T0) if strategy is None else strategy
    fused = select_engine(engine, xp, data, fed, strategy)

    def global_loss(params, phi=None):
        if fused is not None and phi is None:
            losses = xp.asarray(fused.client_losses(params))
        else:
            losses = _client_losses(xp, params, data, phi)
        F = float(to_numpy(xp.sum(data.weights * losses)))
        return F, F + 0.5 * lam * float(to_numpy(xp.sum(params.WV * params.WV))), to_numpy(losses)

    if prefix is None:
        F0, F0_reg, losses0 = global_loss(params)
        rows = [_row(0, "init", F0, F0_reg, losses0, 0.0, 0.0, {b: 0.0 for b in BLOCKS}, m,
                     strategy.name)]
        state = RunState(0, params, tuple(rows), params, params, F0_reg,
                         params if T0 == 0 else None, strategy.client.init(params, m),
                         strategy.server.init(params))
    else:
        state = _check_prefix(prefix, params, T, T0)
        rows = list(state.rows)
    start_round = state.round
    warm_params = state.warmup_params if start_round > T0 else None   # else set at round T0
    initial, best, best_loss = state.initial, state.best, state.best_loss
    client_state, server_state = state.client_state, state.server_state
    F0_reg = float(rows[0]["loss_regularized"])
    gamma = float(rows[-1]["cumulative_kernel_drift"])
    working = client_working_bytes(data, H, fed.batch_size)
    phi_frozen = None
    divergence = None
    if on_round is not None:
        on_round(state)
    schedule, control = strategy.schedule, strategy.control
    if control is not None:
        params, warm_params, schedule, control = _observe(control, state, data, T, params,
                                                          warm_params, schedule)
    for t in _rounds(start_round, T, progress):
        if t == T0:
            warm_params = params
        blocks = schedule(t)
        kernel_frozen = "WQ" not in blocks and "WK" not in blocks
        if not kernel_frozen:
            phi_frozen = None          # the kernel moves: features are recomputed when it freezes
        elif phi_frozen is None:
            phi_frozen = (_flat(xp, data.features(kernel(params)), 2)   # (m, N, Hd)
                          if frozen_features is None else frozen_features(params))
        part = _participants(t, m, fed.participation, seed)
        client_weights = data.weights if len(part) == m else xp.take(data.weights, xp.asarray(part), axis=0)
        pw = client_weights / xp.sum(client_weights)
        batches = None
        if fed.batch_size is not None:
            batches = _minibatch_indices(t, part, data.sizes, Nmax, E, fed.batch_size, seed)
        k = len(part)
        rnd = Round(t, blocks, part, m, client_weights, pw, E, eta)

        # clients: E local steps from θ^t, all participants at once (in chunks within max_bytes)
        anchor = {b: getattr(params, b) for b in blocks}
        if fused is not None:
            local = fused.local_training(params, blocks, part, E, eta, lam,
                                         phi_frozen if kernel_frozen else None)
        else:
            inputs = (phi_frozen,) if kernel_frozen else (data.inputs, data.q)
            pieces = [_local_training(xp, params, rnd, lo, hi, strategy.client, client_state, inputs,
                                      data, batches, fed)
                      for lo, hi in client_chunks(k, working, max_bytes)]
            local = pieces[0] if len(pieces) == 1 else {
                b: xp.concat([piece[b] for piece in pieces], axis=0) for b in blocks}
        client_state = strategy.client.update(client_state, rnd, anchor, local)

        # server: Δ_b = Σ p̃_c θ_{c,b} − θ_b, θ_b ← θ_b + step_b; untrained blocks are left untouched
        delta, drift = {}, {b: 0.0 for b in BLOCKS}
        for b in blocks:
            average = _weighted_sum(xp, pw, local[b])
            delta[b] = average - anchor[b]
            drift[b] = float(to_numpy(xp.sum(pw * _sq_norm(xp, local[b] - average))))
        step, server_state = strategy.server.update(server_state, rnd, delta)
        start, params = params, params.replace(**{b: anchor[b] + step[b] for b in blocks})
        kernel_drift = 0.0
        if not kernel_frozen:
            WQ_c, WK_c = (local[b] if b in local else getattr(start, b) for b in ("WQ", "WK"))
            K_c = xp.matmul(WQ_c, xp.matrix_transpose(WK_c))
            kernel_drift = float(to_numpy(xp.sum(pw * _sq_norm(xp, K_c - kernel(params)))))
            gamma += kernel_drift
        F, F_reg, losses = global_loss(params, phi_frozen if kernel_frozen else None)
        if F_reg < best_loss:
            best, best_loss = params, F_reg
        rows.append(_row(t + 1, _stage(blocks), F, F_reg, losses, kernel_drift, gamma, drift, k,
                         strategy.name))
        if on_round is not None or control is not None:
            reached = warm_params if t + 1 > T0 else params if t + 1 == T0 else None
            state = RunState(t + 1, params, tuple(rows), initial, best, best_loss, reached,
                             client_state, server_state)
            if on_round is not None:
                on_round(state)
        if not np.isfinite(F_reg) or F_reg > fed.divergence_factor * max(F0_reg, 1e-12):
            divergence = _divergence(t + 1, F_reg, [initial, best, start], data, lam, eta, blocks)
            break
        if control is not None:
            params, warm_params, schedule, control = _observe(control, state, data, T, params,
                                                              warm_params, schedule)
    if warm_params is None:
        warm_params = params
    result = _result(rows, params, warm_params, divergence, T0, strategy.name)
    result.metadata["engine"] = "array_api" if fused is None else "fused"
    if strategy.control is not None:
        result.metadata.update(strategy.control.finish(result))
    return result


def _observe(control, state: RunState, data, rounds: int, params, warm_params, schedule):
    """Ask a strategy's control about ``state``; on a :class:`Freeze` (while rounds remain) switch
    to the frozen stage from its parameters. Returns ``(params, warm_params, schedule, control)``,
    ``control`` ``None`` once it has frozen."""
    decision = control.observe(state, data)
    if decision is None:
        return params, warm_params, schedule, control
    if state.round >= rounds:
        return params, warm_params, schedule, None
    frozen = decision.params
    return frozen, frozen, _frozen_schedule, None


def _frozen_schedule(t: int) -> tuple[str, ...]:
    """After a control's freeze: only the value block trains (docs/theory.md §5)."""
    return ("WV",)


def _rounds(start: int, stop: int, progress: bool):
    """``range(start, stop)``, with a tqdm progress bar when asked (tqdm imported only then)."""
    if not progress:
        return range(start, stop)
    from tqdm.auto import tqdm
    return tqdm(range(start, stop), desc="rounds", unit="round", leave=False)


def _check_prefix(prefix: RunState, params: Params, rounds: int, warmup_rounds: int) -> RunState:
    """``prefix`` if a run of ``rounds`` rounds can continue from it with ``params``, else a ``ValueError``."""
    if not isinstance(prefix, RunState):
        raise ValueError(f"prefix is a {type(prefix).__name__}; expected the RunState that "
                         f"run_schedule passes to on_round")
    if params is not prefix.params:
        raise ValueError("prefix: params must be prefix.params (the run continues from its state)")
    if not 0 <= prefix.round <= rounds or len(prefix.rows) != prefix.round + 1:
        raise ValueError(f"prefix ends at round {prefix.round} with {len(prefix.rows)} table rows; "
                         f"expected a round in 0..fed.rounds = {rounds} and rows 0..round")
    if prefix.round > warmup_rounds and prefix.warmup_params is None:
        raise ValueError(f"prefix ends at round {prefix.round} > warmup_rounds = {warmup_rounds} "
                         f"but holds no round-T0 parameters (warmup_params)")
    return prefix


def _local_training(xp, params: Params, rnd: Round, lo: int, hi: int, client_rule, client_state,
                    inputs: tuple, data: StackedClients, batches, fed: FederatedConfig) -> dict:
    """``E`` local steps from ``θ^t`` of the participants ``rnd.participants[lo:hi]``, all at once.

    ``inputs`` are ``(φ,)`` with the kernel frozen, else ``(Ŝ, q)``, for all clients; returns the
    trained blocks ``{b: θ_{c,b}}`` of the chunk. The client rule sees the chunk's ``Round``.
    """
    part, m = rnd.participants, rnd.num_clients
    k = hi - lo
    if k < len(part):
        rnd = rnd._replace(participants=part[lo:hi], client_weights=rnd.client_weights[lo:hi],
                           weights=rnd.weights[lo:hi])

    def select(a):
        if len(part) == m:
            return a if k == m else a[lo:hi, ...]
        return xp.take(a, xp.asarray(part[lo:hi]), axis=0)

    anchor = {b: getattr(params, b) for b in rnd.blocks}
    broadcast = {b: xp.broadcast_to(getattr(params, b), (k,) + tuple(getattr(params, b).shape))
                 for b in BLOCKS}
    batch = tuple(select(a) for a in inputs + (data.y, data.sample_weight))

    def minibatch(e):
        step = tuple(_take(xp, a, batches[lo:hi, e, :]) for a in inputs + (data.y,))
        return step + (xp.full(step[0].shape[:2], 1.0 / fed.batch_size, dtype=step[0].dtype),)
    return _local_steps(xp, rnd, client_rule, client_state, anchor, broadcast, batch,
                        None if batches is None else minibatch, rnd.learning_rate, fed.ridge, data)


def _local_steps(xp, rnd: Round, client_rule, client_state, anchor: dict, broadcast: dict, batch: tuple,
                 minibatch, eta, lam, data: StackedClients) -> dict:
    """``E`` local steps ``θ_c ← θ_c − η (∇F_{λ,c}(θ_c) + correction)`` of a chunk of clients (docs/theory.md §3).

    ``broadcast`` holds ``θ^t`` per client (every block), ``anchor`` the trained blocks of ``θ^t``,
    ``batch`` the chunk's ``(φ, y, w)`` (kernel frozen) or ``(Ŝ, q, y, w)`` / ``(X, q, y, w)``;
    ``minibatch(e)``, when given, returns step ``e``'s batch instead. One run's clients (leading
    client axis) or an ensemble's (instance and client axes, :mod:`linattn_theory.sim.ensemble`).
    """
    blocks = rnd.blocks
    local = {b: broadcast[b] for b in blocks}
    kernel_frozen = len(batch) == 3
    for e in range(rnd.local_steps):
        if minibatch is not None:
            batch = minibatch(e)
        grads = _local_gradients(xp, {**broadcast, **local}, blocks, batch, kernel_frozen,
                                 data.attention, data.temperature)
        correction = client_rule.correction(client_state, rnd, anchor, local)
        for b in blocks:
            g = grads[b] + lam * local[b] if b == "WV" else grads[b]
            if b in correction:
                g = g + correction[b]
            local[b] = local[b] - eta * g
    return local


def _result(rows, params, warm_params, divergence, warmup_rounds, strategy) -> RunResult:
    """The :class:`RunResult` of a finished run: table from ``rows``, parameters moved to the host."""
    table = pd.DataFrame(rows)
    host = lambda P: P.map(lambda a: to_numpy(a))  # noqa: E731
    meta = {"diverged": divergence is not None,
            "divergence": None if divergence is None else divergence.__dict__,
            "rounds_completed": int(table["round"].iloc[-1]), "warmup_rounds": warmup_rounds,
            "strategy": strategy}
    return RunResult(table, host(params), host(warm_params), divergence, meta)


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
    _, g = _loss_and_grad(Params(local["WQ"], local["WK"], local["WV"]), S, q, y, w,
                          blocks=blocks, attention=attention, temperature=temperature,
                          with_loss=False)
    return {b: getattr(g, b) for b in blocks}


def _loss_and_grad(params: Params, inputs, q, y, sample_weight, blocks=BLOCKS, *,
                   attention: str = "linear", temperature: float = 1.0, with_loss: bool = True):
    """The model's loss and gradients on ``inputs``: ``Ŝ`` (linear attention) or ``X`` (softmax, docs/theory.md §9).

    (:func:`~linattn_theory.core.model.loss_and_grad_from_inputs` with the linear path looked up in this
    module, so that it stays the one call the engine makes, as before softmax attention existed.)
    """
    if attention == "softmax":
        return loss_and_grad_from_contexts(params, inputs, q, y, sample_weight, blocks,
                                           attention=attention, temperature=temperature)
    return loss_and_grad_from_moments(params, inputs, q, y, sample_weight, blocks=blocks, with_loss=with_loss)


def _stage(blocks) -> str:
    """Row label of a round: ``warmup`` (every block trains), ``frozen`` (only ``W_V``), ``value_frozen``."""
    if tuple(blocks) == BLOCKS:
        return "warmup"
    return "frozen" if tuple(blocks) == ("WV",) else "value_frozen"


@np.errstate(over="ignore", invalid="ignore")
def _divergence(t, F, points: list[Params], data, lam, eta, blocks) -> Divergence:
    """Report a divergence at round ``t`` with a stable step: the smallest ``2/λ_max`` over ``points``.

    ``points`` are finite iterates of the run (the start, the best so far, the last finite
    one): in the factorised model the curvature grows as the kernel is learned, so the step
    must be stable where the run was heading, not only where it started.
    """
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
    return Divergence(t, float(F), safe, msg)


def _row(t, stage, F, F_reg, losses, kernel_drift, gamma, drift, participants, strategy):
    row = {"round": t, "stage": stage, "loss": F, "loss_regularized": F_reg,
           "kernel_drift": kernel_drift, "cumulative_kernel_drift": gamma,
           "drift_WQ": drift["WQ"], "drift_WK": drift["WK"], "drift_WV": drift["WV"],
           "participants": participants, "strategy": strategy}
    row.update({f"client_loss_{c}": float(v) for c, v in enumerate(losses)})
    return row
