"""The two-stage federated schedule: FedAvg and FedFrozen (docs/theory.md §3).

Round ``t``: the server sends ``θ^t``; each participating client runs ``E`` local gradient
steps with step ``η`` on its own ``F_{λ,c}`` (full batch or minibatches of size ``b``); the
server moves to ``θ^t + η_s Σ_c p̃_c (θ_c − θ^t)`` with ``p̃_c`` the weights renormalised over
the participants. FedFrozen (Wang et al., FedFrozen, arXiv:2605.06446) updates every block
for ``t < T0`` and only ``W_V`` afterwards (``W_Q``, ``W_K`` are never touched, so they stay
bit-identical); FedAvg (McMahan et al. 2017) is ``T0 = T``.

All clients' local steps run at once as batched array operations (leading client axis).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np
import pandas as pd

from ._array import array_namespace, to_numpy
from .backend import client_chunks, client_working_bytes, get_namespace, resolve_max_bytes
from .config import FederatedConfig, RunConfig
from .model import BLOCKS, Params, _flat, _value_matrix, features, kernel, loss_and_grad_from_moments
from .tasks import (SEED_INIT, SEED_MINIBATCH, SEED_PARTICIPATION, StackedClients, make_clients,
                    seed_sequence, stack_clients)

__all__ = ["simulate", "run_schedule", "clients_from_config", "initial_params", "prepare_run",
           "run_metadata", "RunResult", "Divergence", "value_curvature", "stable_learning_rate"]


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
    phi = _flat(xp, features(K, data.S, data.q), 2)
    A = xp.matmul(xp.matrix_transpose(phi), phi * data.sample_weight[..., None])
    return np.linalg.eigvalsh(to_numpy(A))[:, -1] + ridge


def stable_learning_rate(K, data: StackedClients, ridge: float = 0.0) -> float:
    """The value block's stability limit ``2 / max_c λ_max(Ã_c)`` (docs/theory.md §5)."""
    return float(2.0 / np.max(value_curvature(K, data, ridge)))


def _git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version() -> str:
    try:
        return importlib_metadata.version("linattn-theory")
    except importlib_metadata.PackageNotFoundError:
        from . import __version__
        return __version__


def prepare_run(config: RunConfig, clients=None, params: Params | None = None):
    """``(data, θ^0)`` of ``config``: stacked clients and initial parameters on ``model.backend``."""
    xp = get_namespace(config.model.backend)
    clients = clients_from_config(config) if clients is None else clients
    data = stack_clients(clients, xp=xp, dtype=np.dtype(config.model.dtype))
    d, p = data.q.shape[-1], data.y.shape[-1]
    params = initial_params(config, d, p) if params is None else params
    return data, params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))


def run_metadata(config: RunConfig) -> dict:
    """The metadata record of a run of ``config``: full config, seed, version, git revision."""
    return {"config": config.to_dict(), "seed": config.seed, "version": _version(),
            "git_revision": _git_revision()}


def simulate(config: RunConfig, clients=None, *, progress: bool = False,
             params: Params | None = None, max_bytes: int | str | None = "auto") -> RunResult:
    """Run ``config`` end to end: build the clients, initialise, run the schedule.

    ``max_bytes`` bounds a round's working set (see :func:`run_schedule`; ``"auto"``:
    cache-sized chunks of clients on the CPU when the round does not fit in cache, one chunk
    on a GPU, :func:`~linattn_theory.backend.resolve_max_bytes`); results do not depend on it.
    """
    data, params = prepare_run(config, clients, params)
    max_bytes = resolve_max_bytes(max_bytes, data, config.model.heads, config.federated.batch_size)
    result = run_schedule(params, data, config.federated, config.warmup_rounds, config.seed,
                          progress=progress, max_bytes=max_bytes)
    result.metadata.update(run_metadata(config))
    return result


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
    return xp.sum(xp.reshape(weights, (-1,) + (1,) * (a.ndim - 1)) * a, axis=0)


def _sq_norm(xp, a):
    """``‖a_c‖_F²`` per leading index."""
    return xp.sum(xp.reshape(a * a, (a.shape[0], -1)), axis=1)


def _client_losses(xp, params: Params, data: StackedClients, phi=None):
    """``F_c(θ)`` for every client (weighted sample means), shape ``(m,)``."""
    if phi is None:
        loss, _ = loss_and_grad_from_moments(params, data.S, data.q, data.y, data.sample_weight, blocks=())
        return loss
    e = xp.matmul(phi, _value_matrix(xp, params.WV)) - data.y
    return 0.5 * xp.sum(e * e * data.sample_weight[..., None], axis=(-2, -1))


def run_schedule(params: Params, data: StackedClients, fed: FederatedConfig, warmup_rounds: int,
                 seed: int = 0, *, progress: bool = False, max_bytes: int | None = None,
                 prefix: pd.DataFrame | None = None, on_round=None) -> RunResult:
    """Run ``fed.rounds`` rounds from ``params`` on stacked clients; freeze ``W_Q, W_K`` at ``warmup_rounds``.

    Returns the per-round table (row ``t`` describes ``θ^t``; drift columns describe the round
    that produced it), the final parameters and those at round ``T0``.

    ``max_bytes`` bounds the working set a round adds to the stacked data: the participating
    clients train in chunks (:func:`~linattn_theory.backend.client_chunks`); clients are
    independent within a round, so the results are identical for every budget.
    ``prefix`` continues a run: it is the table (rows ``0..s``, ``s <= warmup_rounds``) of a
    run whose round-``s`` parameters are ``params``, and rounds ``s..T-1`` follow exactly as
    in the uninterrupted run (shared warm-up prefixes, :mod:`linattn_theory.warmup_sweep`).
    ``on_round(t, params)`` is called with ``θ^t`` for every round ``t`` the run reaches.
    """
    from tqdm.auto import tqdm

    xp = array_namespace(data.S)
    m, Nmax = data.S.shape[0], data.S.shape[1]
    T, T0, E, eta, lam = fed.rounds, warmup_rounds, fed.local_steps, fed.learning_rate, fed.ridge
    H, d, _, p = params.shape

    def global_loss(params, phi=None):
        losses = _client_losses(xp, params, data, phi)
        F = float(to_numpy(xp.sum(data.weights * losses)))
        return F, F + 0.5 * lam * float(to_numpy(xp.sum(params.WV * params.WV))), to_numpy(losses)

    if prefix is None:
        F0, F0_reg, losses0 = global_loss(params)
        rows = [_row(0, "init", F0, F0_reg, losses0, 0.0, 0.0, {b: 0.0 for b in BLOCKS}, m)]
    else:
        rows = prefix.to_dict("records")
        F0_reg = float(rows[0]["loss_regularized"])
        if int(rows[-1]["round"]) > T0:
            raise ValueError(f"prefix ends at round {rows[-1]['round']}; expected a round <= "
                             f"warmup_rounds = {T0} (the kernel must not be frozen yet)")
    start = int(rows[-1]["round"])
    gamma = float(rows[-1]["cumulative_kernel_drift"])
    warm_params = params if T0 == start else None
    phi_frozen = None
    divergence = None
    working = client_working_bytes(data, H, fed.batch_size)
    if on_round is not None:
        on_round(start, params)
    for t in tqdm(range(start, T), disable=not progress, desc="rounds", unit="round", leave=False):
        warm = t < T0
        if not warm and phi_frozen is None:
            warm_params = params
            phi_frozen = _flat(xp, features(kernel(params), data.S, data.q), 2)   # (m, N, Hd)
        part = _participants(t, m, fed.participation, seed)
        full = len(part) == m
        pw = data.weights if full else xp.take(data.weights, xp.asarray(part), axis=0)
        pw = pw / xp.sum(pw)
        batches = None
        if fed.batch_size is not None:
            batches = _minibatch_indices(t, part, data.sizes, Nmax, E, fed.batch_size, seed)

        def select(a, lo, hi):
            if full:
                return a if hi - lo == m else a[lo:hi, ...]
            return xp.take(a, xp.asarray(part[lo:hi]), axis=0)

        def local_training(lo, hi):
            """``E`` local steps of the participants ``part[lo:hi]``, all at once."""
            k = hi - lo
            chunk_batches = None if batches is None else batches[lo:hi]
            if warm:
                client = params.map(lambda a: xp.broadcast_to(a, (k,) + tuple(a.shape)))
                S, q, y, w = (select(a, lo, hi) for a in (data.S, data.q, data.y, data.sample_weight))
                for e in range(E):
                    if chunk_batches is not None:
                        S, q, y = (_take(xp, a, chunk_batches[:, e, :]) for a in (data.S, data.q, data.y))
                        w = xp.full(S.shape[:2], 1.0 / fed.batch_size, dtype=S.dtype)
                    _, g = loss_and_grad_from_moments(client, S, q, y, w)
                    client = Params(client.WQ - eta * g.WQ, client.WK - eta * g.WK,
                                    client.WV - eta * (g.WV + lam * client.WV))
                return client
            V = xp.broadcast_to(_value_matrix(xp, params.WV), (k, H * d, p))
            phi, y, w = (select(a, lo, hi) for a in (phi_frozen, data.y, data.sample_weight))
            for e in range(E):
                if chunk_batches is not None:
                    phi, y = (_take(xp, a, chunk_batches[:, e, :]) for a in (phi_frozen, data.y))
                    w = xp.full(phi.shape[:2], 1.0 / fed.batch_size, dtype=phi.dtype)
                err = (xp.matmul(phi, V) - y) * w[..., None]
                V = V - eta * (xp.matmul(xp.matrix_transpose(phi), err) + lam * V)
            return Params(None, None, xp.reshape(V, (k, H, d, p)))

        k = len(part)
        pieces = [local_training(lo, hi) for lo, hi in client_chunks(k, working, max_bytes)]
        client = pieces[0] if len(pieces) == 1 else Params(*(
            None if getattr(pieces[0], b) is None else xp.concat([getattr(c, b) for c in pieces], axis=0)
            for b in BLOCKS))

        # server: θ ← θ + η_s Σ p̃_c (θ_c − θ); frozen blocks are left untouched
        trained = BLOCKS if warm else ("WV",)
        new, drift = {}, {b: 0.0 for b in BLOCKS}
        for b in trained:
            theta, theta_c = getattr(params, b), getattr(client, b)
            average = _weighted_sum(xp, pw, theta_c)
            new[b] = theta + fed.server_learning_rate * (average - theta)
            drift[b] = float(to_numpy(xp.sum(pw * _sq_norm(xp, theta_c - average))))
        params = params.replace(**new)
        kernel_drift = 0.0
        if warm:
            K_c = xp.matmul(client.WQ, xp.matrix_transpose(client.WK))
            kernel_drift = float(to_numpy(xp.sum(pw * _sq_norm(xp, K_c - kernel(params)))))
            gamma += kernel_drift
        F, F_reg, losses = global_loss(params, None if warm else phi_frozen)
        rows.append(_row(t + 1, "warmup" if warm else "frozen", F, F_reg, losses, kernel_drift,
                         gamma, drift, k))
        if on_round is not None:
            on_round(t + 1, params)
        if not np.isfinite(F_reg) or F_reg > fed.divergence_factor * max(F0_reg, 1e-12):
            K_prev = kernel(warm_params if warm_params is not None and not warm else params)
            divergence = _divergence(t + 1, F_reg, K_prev, data, lam, eta, warm)
            break
    if warm_params is None:
        warm_params = params
    return _result(rows, params, warm_params, divergence, T0)


def _result(rows, params, warm_params, divergence, warmup_rounds) -> RunResult:
    """The :class:`RunResult` of a finished run: table from ``rows``, parameters moved to the host."""
    table = pd.DataFrame(rows)
    host = lambda P: P.map(lambda a: to_numpy(a))  # noqa: E731
    meta = {"diverged": divergence is not None,
            "divergence": None if divergence is None else divergence.__dict__,
            "rounds_completed": int(table["round"].iloc[-1]), "warmup_rounds": warmup_rounds}
    return RunResult(table, host(params), host(warm_params), divergence, meta)


def _divergence(t, F, K, data, lam, eta, warm) -> Divergence:
    K_host_ok = bool(np.all(np.isfinite(to_numpy(K))))
    safe = stable_learning_rate(K, data, lam) if K_host_ok else float("nan")
    stage = "warm-up" if warm else "frozen stage"
    msg = (f"diverged at round {t} ({stage}): F = {F:.3g} with learning_rate η = {eta:g}; "
           f"a stable step for the value block needs η < 2/λ_max(Ã_c) = {safe:.3g} "
           f"(largest value-block curvature over the clients, docs/theory.md §5)")
    return Divergence(t, float(F), safe, msg)


def _row(t, stage, F, F_reg, losses, kernel_drift, gamma, drift, participants):
    row = {"round": t, "stage": stage, "loss": F, "loss_regularized": F_reg,
           "kernel_drift": kernel_drift, "cumulative_kernel_drift": gamma,
           "drift_WQ": drift["WQ"], "drift_WK": drift["WK"], "drift_WV": drift["WV"],
           "participants": participants}
    row.update({f"client_loss_{c}": float(v) for c, v in enumerate(losses)})
    return row
