"""Theory functions: the kernel-profile objective, the frozen-stage closed forms, and the exact
bias–drift decomposition of the excess risk (docs/theory.md §4–6).

Every function is a pure function of a kernel ``K`` ``(H, d, d)`` (or parameters) and the
clients, which may be a :class:`~linattn_theory.tasks.FederatedDataset`, a plain list of
``(X, q, y)`` tuples (``p_c ∝ N_c``) or :class:`~linattn_theory.tasks.StackedClients`. The
moments ``A_c, B_c, y2_c`` come from :func:`linattn_theory.moments.value_moments`, i.e. from the
very empirical objective the simulator optimises; the small dense linear algebra on them
(``Hd × Hd`` matrices) runs on the host.

Symbols (docs/theory.md §4–5): ``Ã_c = A_c + λI``; ``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)``;
``Φ_λ(K) = min_V F_λ(K, V)``; ``V*_λ(K) = Ã^{-1} B``; the frozen-stage map
``V ← M V + b``; its fixed point ``V_FA``; the value drift floor ``D(K)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize

from ._array import array_namespace, to_numpy
from .model import Params, _value_matrix, kernel, kernel_gradient_from_moments, loss_and_grad_from_moments
from .moments import ValueMoments, value_moments, value_objective
from .tasks import FederatedDataset, StackedClients, stack_clients

__all__ = [
    "profile_objective",
    "profile_gradient",
    "CentralizedOptimum",
    "centralized_optimum",
    "frozen_stage_map",
    "fedavg_fixed_point",
    "contraction_rate",
    "value_drift_floor",
    "decompose_excess_risk",
    "excess_risk_by_warmup",
    "local_steps",
    "replay_round",
    "warmup_inexactness",
    "population_value_moments",
]

#: eigenvalues below this fraction of the largest are treated as zero (pseudo-inverse).
PSEUDO_INVERSE_RTOL = 1e-12


# --------------------------------------------------------------------------------------
# helpers: clients, moments, symmetric solves
# --------------------------------------------------------------------------------------
def _stacked(clients) -> StackedClients:
    """Clients in the stacked sufficient form (built once; pass it on to avoid rebuilding)."""
    return clients if isinstance(clients, StackedClients) else stack_clients(clients)


def _check_kernel(K, data: StackedClients, name: str = "K") -> np.ndarray:
    K = np.asarray(to_numpy(K), dtype=np.float64)
    d = data.q.shape[-1]
    if K.ndim == 2:
        K = K[None]
    if K.ndim != 3 or K.shape[-2:] != (d, d):
        raise ValueError(f"{name} has shape {K.shape}; expected (H, d, d) with d = {d}")
    if not np.all(np.isfinite(K)):
        raise ValueError(f"{name} contains non-finite values")
    return K


def _host_moments(K, data: StackedClients) -> ValueMoments:
    """Per-client value moments of kernel ``K`` as host float64 arrays."""
    mom = value_moments(K, data)
    return ValueMoments(*(np.asarray(to_numpy(a), dtype=np.float64)
                          for a in (mom.A, mom.B, mom.y2, mom.weights)))


def _solve_symmetric(A, B, rtol: float = PSEUDO_INVERSE_RTOL):
    """``A^+ B`` for symmetric ``A`` through its eigendecomposition (minimum-norm when singular)."""
    w, U = np.linalg.eigh(A)
    keep = np.abs(w) > rtol * np.max(np.abs(w), axis=-1, keepdims=True)
    inv = np.divide(1.0, w, out=np.zeros_like(w), where=keep)
    return U @ (inv[..., None] * (np.swapaxes(U, -1, -2) @ B))


def _ridge(A, lam: float):
    """``Ã = A + λI`` (works on one matrix or a stack)."""
    return A + lam * np.eye(A.shape[-1])


def _global_objective(V, moments: ValueMoments, lam: float) -> float:
    """``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)`` from the moments (docs/theory.md §4)."""
    return float(np.sum(moments.weights * value_objective(V, moments, lam)))


def _profile_from_moments(moments: ValueMoments, lam: float):
    """``(Φ_λ, V*_λ)`` with ``V* = Ã^{-1} B`` and ``Φ_λ = ½ y2 − ½ tr(B^T V*)``."""
    A, B, y2 = moments.weighted()
    V = _solve_symmetric(_ridge(A, lam), B)
    return float(0.5 * y2 - 0.5 * np.sum(B * V)), V


def _kernel_gradient(K, V, data: StackedClients):
    """``∇_K F(K, V) = Σ_c p_c Σ_i w_i q_i g_i^T`` for the stacked value block ``V`` ``(Hd, p)``.

    Uses :func:`~linattn_theory.model.kernel_gradient_from_moments` with ``W_Q = K``,
    ``W_K = I`` (so that ``W_Q W_K^T = K``).
    """
    xp = array_namespace(data.S)
    H, d = K.shape[0], K.shape[-1]
    p = V.shape[-1]
    eye = xp.broadcast_to(xp.eye(d, dtype=data.S.dtype), (H, d, d))
    params = Params(xp.asarray(K, dtype=data.S.dtype), eye,
                    xp.reshape(xp.asarray(V, dtype=data.S.dtype), (H, d, p)))
    G = kernel_gradient_from_moments(params, data.S, data.q, data.y, data.sample_weight)
    G = xp.sum(xp.reshape(data.weights, (-1, 1, 1, 1)) * G, axis=0)
    return np.asarray(to_numpy(G), dtype=np.float64)


# --------------------------------------------------------------------------------------
# §4 the kernel-profile objective
# --------------------------------------------------------------------------------------
def profile_objective(K, clients, lam: float = 0.0):
    """Kernel-profile objective and its minimiser (docs/theory.md §4).

    ``Φ_λ(K) = min_V F_λ(K, V) = ½ y2 − ½ tr(B^T Ã^{-1} B)``, ``V*_λ(K) = Ã^{-1} B``, with
    ``Ã = A + λI`` (a minimum-norm pseudo-inverse when ``λ = 0`` and ``A`` is singular).
    Returns ``(Φ_λ(K), V*_λ(K))``: a float and the stacked value block ``(Hd, p)``.
    """
    _check_ridge(lam)
    data = _stacked(clients)
    K = _check_kernel(K, data)
    return _profile_from_moments(_host_moments(K, data), lam)


def profile_gradient(K, clients, lam: float = 0.0):
    """``∇_K Φ_λ(K) = ∇_K F(K, V*_λ(K))`` by the envelope theorem (docs/theory.md §4); ``(H, d, d)``."""
    _check_ridge(lam)
    data = _stacked(clients)
    K = _check_kernel(K, data)
    _, V = _profile_from_moments(_host_moments(K, data), lam)
    return _kernel_gradient(K, V, data)


def _check_ridge(lam):
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam = {lam!r}; expected a finite ridge λ >= 0")


# --------------------------------------------------------------------------------------
# §4 the centralised optimum Φ*_λ
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CentralizedOptimum:
    """The centralised minimiser of the kernel-profile objective (docs/theory.md §4).

    ``kernel`` ``K*`` ``(H, d, d)``, ``value`` ``V*_0(K*)`` ``(Hd, p)``, ``objective`` ``Φ*_λ``;
    ``starts`` has one row per start (label, initial and final objective, iterations,
    convergence flag and solver message); ``best_start`` names the winning start.
    """

    kernel: np.ndarray
    value: np.ndarray
    objective: float
    lam: float
    rank: int
    converged: bool
    factor_gradient_norm: float
    best_start: str
    starts: pd.DataFrame = field(repr=False)


def _factors(K, rank: int):
    """Rank-``r`` factors ``(W_Q, W_K)`` of each head's kernel (truncated SVD, split ``√σ``)."""
    U, s, Vt = np.linalg.svd(K)
    r = min(rank, K.shape[-1])
    root = np.sqrt(s[..., :r])
    WQ = np.zeros(K.shape[:-1] + (rank,))
    WK = np.zeros(K.shape[:-1] + (rank,))
    WQ[..., :r] = U[..., :r] * root[..., None, :]
    WK[..., :r] = np.swapaxes(Vt, -1, -2)[..., :r] * root[..., None, :]
    return WQ, WK


def centralized_optimum(clients, lam: float = 0.0, rank: int | None = None, heads: int | None = None,
                        restarts: int = 4, seed: int = 0, initial_kernels=(),
                        max_iterations: int = 1000, tolerance: float = 1e-10) -> CentralizedOptimum:
    """``Φ*_λ = min_K Φ_λ(K)`` over kernels of rank ``≤ r`` per head (docs/theory.md §4).

    L-BFGS (``scipy.optimize``) over the factors ``K_h = W_Q^h (W_K^h)^T`` with the envelope
    gradient ``∇_{W_Q} = ∇_KΦ W_K``, ``∇_{W_K} = (∇_KΦ)^T W_Q``, from ``restarts`` random starts,
    the planted teacher kernel (``clients.truth["kernel"]`` when it has the right shape) and
    every kernel in ``initial_kernels`` (e.g. those simulations reached). The unoptimised
    starting kernels are candidates too, so the result is never worse than any of them.

    Scale symmetry: ``Φ_λ(cK)`` decreases in ``c > 0`` towards ``Φ_0(K)`` (the ridge on ``V``
    costs ``λ‖V‖²/c²`` for the same predictions), so for ``λ > 0`` the infimum over kernels is
    ``min_K Φ_0(K)`` and is not attained. The solver therefore minimises ``Φ_0`` for every
    ``λ``; ``objective`` is ``inf_K Φ_λ(K) = min_K Φ_0(K)`` and ``value`` is ``V*_0(K*)``.
    ``bias(K) = Φ_λ(K) − objective ≥ 0`` for every kernel ``K``.
    """
    _check_ridge(lam)
    data = _stacked(clients)
    d = data.q.shape[-1]
    starts = [("initial_kernel_%d" % i, _check_kernel(K, data, f"initial_kernels[{i}]"))
              for i, K in enumerate(initial_kernels)]
    truth = getattr(clients, "truth", {}) if isinstance(clients, FederatedDataset) else {}
    if heads is None:
        heads = starts[0][1].shape[0] if starts else np.shape(truth.get("kernel", np.zeros((1,))))[0]
    rank = d if rank is None else int(rank)
    if rank < 1 or heads < 1:
        raise ValueError(f"rank = {rank}, heads = {heads}; expected integers >= 1")
    for label, K in starts:
        if K.shape[0] != heads:
            raise ValueError(f"{label} has {K.shape[0]} heads; expected heads = {heads}")
    if "kernel" in truth and np.shape(truth["kernel"]) == (heads, d, d):
        starts.insert(0, ("teacher", np.asarray(truth["kernel"], dtype=np.float64)))
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(101,)))
    shape = (heads, d, rank)
    size = heads * d * rank

    def objective(x):
        WQ, WK = x[:size].reshape(shape), x[size:].reshape(shape)
        K = WQ @ np.swapaxes(WK, -1, -2)
        phi, V = _profile_from_moments(_host_moments(K, data), 0.0)
        G = _kernel_gradient(K, V, data)
        return phi, np.concatenate([(G @ WK).ravel(), (np.swapaxes(G, -1, -2) @ WQ).ravel()])

    candidates, rows = [], []
    for label, K in starts:   # the unoptimised starts themselves
        candidates.append((profile_objective(K, data, 0.0)[0], label + " (as given)", K, np.nan))
    inits = [(label, *_factors(K, rank)) for label, K in starts]
    for i in range(restarts):
        inits.append((f"random_{i}", rng.normal(0, 1 / np.sqrt(d), shape),
                      rng.normal(0, 1 / np.sqrt(d), shape)))
    for label, WQ, WK in inits:
        x0 = np.concatenate([WQ.ravel(), WK.ravel()])
        f0 = objective(x0)[0]
        res = optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                                options={"maxiter": max_iterations, "ftol": 1e-15, "gtol": tolerance,
                                         "maxcor": 20})
        WQ, WK = res.x[:size].reshape(shape), res.x[size:].reshape(shape)
        K = WQ @ np.swapaxes(WK, -1, -2)
        gnorm = float(np.linalg.norm(res.jac))
        rows.append({"start": label, "initial_objective": f0, "objective": float(res.fun),
                     "iterations": int(res.nit), "converged": bool(res.success),
                     "factor_gradient_norm": gnorm, "message": str(res.message)})
        candidates.append((float(res.fun), label, K, gnorm))
    if not candidates:
        raise ValueError("centralized_optimum: nothing to optimise (restarts = 0 and no initial kernels)")
    best = min(candidates, key=lambda c: c[0])
    table = pd.DataFrame(rows)
    converged = bool(table.loc[table["start"] == best[1], "converged"].all()) if best[1] in set(table["start"]) \
        else False
    phi, V = profile_objective(best[2], data, 0.0)
    return CentralizedOptimum(best[2], V, phi, float(lam), rank, converged, float(best[3]), best[1], table)


# --------------------------------------------------------------------------------------
# §5 the frozen stage
# --------------------------------------------------------------------------------------
def _check_schedule(eta, E, server_learning_rate=1.0):
    if not np.isfinite(eta) or eta <= 0:
        raise ValueError(f"eta = {eta!r}; expected a finite step size η > 0")
    if isinstance(E, bool) or not isinstance(E, (int, np.integer)) or E < 1:
        raise ValueError(f"E = {E!r}; expected an integer number of local steps >= 1")
    if not np.isfinite(server_learning_rate) or server_learning_rate <= 0:
        raise ValueError(f"server_learning_rate = {server_learning_rate!r}; expected a number > 0")


def _frozen_map(moments: ValueMoments, eta: float, E: int, lam: float, server_learning_rate: float = 1.0):
    """``(M, b)``: ``M = Σ_c p_c (I − ηÃ_c)^E``, ``b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c`` (with server step)."""
    A, B, w = moments.A, moments.B, moments.weights
    n = A.shape[-1]
    step = np.eye(n) - eta * _ridge(A, lam)                      # (m, Hd, Hd)
    Mc = np.broadcast_to(np.eye(n), A.shape).copy()
    bc = np.zeros_like(B)
    for _ in range(E):                                           # E local steps from V = 0 and V = I
        bc = step @ bc + eta * B
        Mc = step @ Mc
    M = np.sum(w[:, None, None] * Mc, axis=0)
    b = np.sum(w[:, None, None] * bc, axis=0)
    s = server_learning_rate
    return (1.0 - s) * np.eye(n) + s * M, s * b


def frozen_stage_map(K, clients, eta: float, E: int, lam: float = 0.0, server_learning_rate: float = 1.0):
    """The affine frozen-stage round ``V^{t+1} = M V^t + b`` on the stacked value block (docs/theory.md §5).

    ``M = Σ_c p_c (I − ηÃ_c)^E`` ``(Hd, Hd)``, ``b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c`` ``(Hd, p)``;
    with a server step size ``η_s``: ``M ← (1 − η_s) I + η_s M``, ``b ← η_s b``.
    """
    _check_ridge(lam)
    _check_schedule(eta, E, server_learning_rate)
    data = _stacked(clients)
    return _frozen_map(_host_moments(_check_kernel(K, data), data), eta, E, lam, server_learning_rate)


def _fixed_point(M, b):
    """``V_FA = (I − M)^{-1} b`` (the ``Σ_j`` form: valid when some ``Ã_c`` is singular)."""
    return _solve_symmetric(np.eye(M.shape[-1]) - M, b)


def fedavg_fixed_point(K, clients, eta: float, E: int, lam: float = 0.0):
    """``V_FA(K) = (Σ_c p_c P_c)^{-1} Σ_c p_c P_c V*_c``, ``P_c = I − (I − ηÃ_c)^E`` (docs/theory.md §5).

    Computed as ``(I − M)^{-1} b``, which needs no ``Ã_c^{-1}``; ``E = 1`` gives ``V*_λ(K)``.
    Returns the stacked value block ``(Hd, p)``.
    """
    return _fixed_point(*frozen_stage_map(K, clients, eta, E, lam))


def contraction_rate(K, clients, eta: float, E: int, lam: float = 0.0, server_learning_rate: float = 1.0) -> float:
    """``ρ(K)``, the spectral radius of ``M`` (docs/theory.md §5): ``‖V^t − V_FA‖`` shrinks like ``ρ^{t−T0}``."""
    M, _ = frozen_stage_map(K, clients, eta, E, lam, server_learning_rate)
    return float(np.max(np.abs(np.linalg.eigvalsh(M))))


def _drift_floor(V_FA, V_star, moments: ValueMoments, lam: float) -> float:
    """``½ tr((V_FA − V*)^T Ã (V_FA − V*))``."""
    A, _, _ = moments.weighted()
    delta = V_FA - V_star
    return float(0.5 * np.sum(delta * (_ridge(A, lam) @ delta)))


def value_drift_floor(K, clients, eta: float, E: int, lam: float = 0.0) -> float:
    """``D(K) = F_λ(K, V_FA) − Φ_λ(K) = ½ tr((V_FA − V*_λ)^T Ã (V_FA − V*_λ))`` (docs/theory.md §5)."""
    _check_ridge(lam)
    _check_schedule(eta, E)
    data = _stacked(clients)
    moments = _host_moments(_check_kernel(K, data), data)
    _, V_star = _profile_from_moments(moments, lam)
    return _drift_floor(_fixed_point(*_frozen_map(moments, eta, E, lam)), V_star, moments, lam)
