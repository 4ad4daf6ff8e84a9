"""The theory's building blocks on the host (docs/theory.md §4–5): clients in stacked form, the
per-client value moments as host float64 arrays, ``Ã = A + λI`` and symmetric solves, ``(Φ_λ, V*_λ)``
from the moments, ``∇_K F`` and the argument checks the theory modules and the recommenders share.
"""

from __future__ import annotations


import numpy as np

from ..core.arrays import array_namespace, to_numpy
from ..core.model import Params, kernel_gradient_from_inputs
from ..core.moments import ValueMoments, value_moments_and_features, value_objective
from ..core.clients import StackedClients, stack_clients

__all__ = ["PSEUDO_INVERSE_RTOL", "SEED_OPTIMUM", "as_stacked", "attention_of", "check_kernel", "host_moments",
           "host_moments_and_features", "solve_symmetric", "ridged", "global_objective", "profile_from_moments",
           "kernel_gradient", "check_ridge"]

PSEUDO_INVERSE_RTOL = 1e-12
#: SeedSequence spawn key of the solver's random starts (apart from the task purposes 0–5).
SEED_OPTIMUM = 101


# --------------------------------------------------------------------------------------
# helpers: clients, moments, symmetric solves
# --------------------------------------------------------------------------------------
def as_stacked(clients, attention: str = "linear", temperature: float = 1.0) -> StackedClients:
    """Clients in the stacked sufficient form (built once; pass it on to avoid rebuilding).

    Stacked clients carry their attention (docs/theory.md §9); others are stacked for ``attention``.
    """
    if isinstance(clients, StackedClients):
        return clients
    return stack_clients(clients, attention=attention, temperature=temperature)


def attention_of(config: dict | None) -> tuple[str, float]:
    """``(attention, temperature)`` of a recorded configuration (linear when it names none)."""
    model = (config or {}).get("model", {}) or {}
    return model.get("attention") or "linear", float(model.get("temperature") or 1.0)


def check_kernel(K, data: StackedClients, name: str = "K") -> np.ndarray:
    """``K`` as a host float64 stack ``(H, d, d)`` (one ``(d, d)`` kernel gains the head axis); a
    ``ValueError`` names a wrong shape or a non-finite entry."""
    K = np.asarray(to_numpy(K), dtype=np.float64)
    d = data.q.shape[-1]
    if K.ndim == 2:
        K = K[None]
    if K.ndim != 3 or K.shape[-2:] != (d, d):
        raise ValueError(f"{name} has shape {K.shape}; expected (H, d, d) with d = {d}")
    if not np.all(np.isfinite(K)):
        raise ValueError(f"{name} contains non-finite values")
    return K


def host_moments(K, data: StackedClients) -> ValueMoments:
    """Per-client value moments of kernel ``K`` as host float64 arrays."""
    return host_moments_and_features(K, data)[0]


def host_moments_and_features(K, data: StackedClients):
    """``(host_moments(K, data), φ)``, with the features ``φ`` (data's namespace) they are built from."""
    mom, phi = value_moments_and_features(K, data)
    return ValueMoments(*(np.asarray(to_numpy(a), dtype=np.float64)
                          for a in (mom.A, mom.B, mom.y2, mom.weights))), phi


def solve_symmetric(A, B, rtol: float = PSEUDO_INVERSE_RTOL):
    """``A^+ B`` for symmetric ``A`` through its eigendecomposition (minimum-norm when singular)."""
    w, U = np.linalg.eigh(A)
    keep = np.abs(w) > rtol * np.max(np.abs(w), axis=-1, keepdims=True)
    inv = np.divide(1.0, w, out=np.zeros_like(w), where=keep)
    return U @ (inv[..., None] * (np.swapaxes(U, -1, -2) @ B))


def ridged(A, lam: float):
    """``Ã = A + λI`` (works on one matrix or a stack)."""
    return A + lam * np.eye(A.shape[-1])


def global_objective(V, moments: ValueMoments, lam: float) -> float:
    """``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)`` from the moments (docs/theory.md §4)."""
    return float(np.sum(moments.weights * value_objective(V, moments, lam)))


def profile_from_moments(moments: ValueMoments, lam: float):
    """``(Φ_λ, V*_λ)`` with ``V* = Ã^{-1} B`` and ``Φ_λ = ½ y2 − ½ tr(B^T V*)``."""
    A, B, y2 = moments.weighted()
    V = solve_symmetric(ridged(A, lam), B)
    return float(0.5 * y2 - 0.5 * np.sum(B * V)), V


def kernel_gradient(K, V, data: StackedClients, phi=None):
    """``∇_K F(K, V) = Σ_c p_c Σ_i w_i q_i g_i^T`` for the stacked value block ``V`` ``(Hd, p)``.

    Uses :func:`~linattn_theory.core.model.kernel_gradient_from_inputs` (the data's attention) with ``W_Q = K``,
    ``W_K = I`` (so that ``W_Q W_K^T = K``). ``K`` ``(H, d, d)`` and ``V``, or stacks of them
    ``(B, H, d, d)`` and ``(B, Hd, p)`` (then ``(B, H, d, d)``, each the same as alone). ``phi``: the
    features at ``K`` from :func:`host_moments_and_features` (used with linear attention, where they
    are the same numbers: ``K I^T = K`` exactly).
    """
    xp = array_namespace(data.S)
    H, d = K.shape[-3], K.shape[-1]
    p = V.shape[-1]
    lead = tuple(K.shape[:-3])
    client = (1,) if lead else ()              # a stack broadcasts against the clients' axis
    eye = xp.broadcast_to(xp.eye(d, dtype=data.S.dtype), lead + client + (H, d, d))
    params = Params(xp.reshape(xp.asarray(K, dtype=data.S.dtype), lead + client + (H, d, d)), eye,
                    xp.reshape(xp.asarray(V, dtype=data.S.dtype), lead + client + (H, d, p)))
    G = kernel_gradient_from_inputs(params, data.inputs, data.q, data.y, data.sample_weight,
                                    attention=data.attention, temperature=data.temperature,
                                    phi=phi if data.attention == "linear" else None)
    G = xp.sum(xp.reshape(data.weights, (-1, 1, 1, 1)) * G, axis=len(lead))
    return np.asarray(to_numpy(G), dtype=np.float64)


def check_ridge(lam):
    """Refuse a ridge ``λ`` that is negative or not finite (a ``ValueError`` naming it)."""
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam = {lam!r}; expected a finite ridge λ >= 0")
