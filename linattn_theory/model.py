"""One multi-head linear-attention layer with closed-form gradients (docs/theory.md §1).

A sample is a context ``X ∈ R^{n×d}``, a query ``q ∈ R^d`` and a target ``y ∈ R^p``.
Head ``h`` owns ``W_Q^h, W_K^h ∈ R^{d×r}`` and ``W_V^h ∈ R^{d×p}``; its attention kernel
is ``K_h = W_Q^h (W_K^h)^T`` and the prediction is

    ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q,      Ŝ = X^T X / n.

The context enters only through ``Ŝ``, so the batched functions below take ``Ŝ``
(``context_second_moment``) and every function allows leading batch axes on the
parameters (one model per client) and on the data (``(..., N, ...)``).
All arithmetic goes through the inputs' array namespace (Array API standard).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ._array import array_namespace, moveaxis

__all__ = [
    "Params",
    "kernel",
    "context_second_moment",
    "features",
    "predict",
    "predict_from_moments",
    "loss_and_grad",
    "loss_and_grad_from_moments",
    "kernel_gradient_from_moments",
]

BLOCKS = ("WQ", "WK", "WV")


@dataclass(frozen=True)
class Params:
    """Parameters of one layer: ``WQ``, ``WK`` of shape ``(..., H, d, r)``, ``WV`` ``(..., H, d, p)``.

    Leading axes (``...``) stack several models, e.g. one per client.
    """

    WQ: object
    WK: object
    WV: object

    @classmethod
    def init(cls, d: int, r: int, p: int, heads: int = 1, scale: float = 1.0,
             seed: int | np.random.SeedSequence | None = 0, dtype=np.float64) -> "Params":
        """Gaussian initialisation, entries ``N(0, scale²/d)``, NumPy arrays of ``dtype``."""
        for name, value in (("d", d), ("r", r), ("p", p), ("heads", heads)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Params.init: {name}={value!r}; expected an integer >= 1")
        if not np.isfinite(scale) or scale < 0:
            raise ValueError(f"Params.init: scale={scale!r}; expected a finite number >= 0")
        rng = np.random.default_rng(seed)
        std = scale / np.sqrt(d)
        WQ = rng.normal(0.0, std, size=(heads, d, r)).astype(dtype)
        WK = rng.normal(0.0, std, size=(heads, d, r)).astype(dtype)
        WV = rng.normal(0.0, std, size=(heads, d, p)).astype(dtype)
        return cls(WQ, WK, WV)

    # -- small tree utilities ---------------------------------------------------------
    def map(self, fn, *others: "Params") -> "Params":
        """Apply ``fn`` block by block (``fn(self.WQ, other.WQ, ...)``)."""
        return Params(*(fn(getattr(self, b), *(getattr(o, b) for o in others)) for b in BLOCKS))

    def replace(self, **blocks) -> "Params":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(blocks)
        return Params(**values)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(heads, d, r, p)``."""
        H, d, r = self.WQ.shape[-3:]
        return H, d, r, self.WV.shape[-1]


def kernel(params: Params):
    """Attention kernels ``K_h = W_Q^h (W_K^h)^T``, shape ``(..., H, d, d)`` (docs/theory.md §1)."""
    xp = array_namespace(params.WQ, params.WK)
    return xp.matmul(params.WQ, xp.matrix_transpose(params.WK))


def context_second_moment(X):
    """``Ŝ = X^T X / n`` for contexts ``X`` of shape ``(..., n, d)``; returns ``(..., d, d)``."""
    xp = array_namespace(X)
    return xp.matmul(xp.matrix_transpose(X), X) / X.shape[-2]


def _heads_to_columns(xp, K):
    """``(..., H, d, e) -> (..., d, H·e)`` so that column ``h·e + b`` is ``K[h, :, b]``."""
    H, d, e = K.shape[-3:]
    return xp.reshape(moveaxis(xp, K, -3, -2), K.shape[:-3] + (d, H * e))


def features(K, S, q):
    """Per-head features ``φ_h = Ŝ K_h^T q``, shape ``(..., N, H, d)`` (docs/theory.md §4).

    ``K`` is ``(..., H, d, d)``, ``S`` is ``(..., N, d, d)`` (symmetric), ``q`` is ``(..., N, d)``.
    """
    xp = array_namespace(K, S, q)
    H, d = K.shape[-3], K.shape[-1]
    k = xp.matmul(q, _heads_to_columns(xp, K))          # (..., N, H·d): row h·d+b = (K_h^T q)_b
    k = xp.reshape(k, k.shape[:-1] + (H, d))
    return xp.matmul(k, S)                               # (k^T Ŝ)^T = Ŝ k, Ŝ symmetric


def _flat(xp, a, tail: int):
    """Merge the last ``tail`` axes of ``a``."""
    n = 1
    for s in a.shape[-tail:]:
        n *= s
    return xp.reshape(a, a.shape[:-tail] + (n,))


def _value_matrix(xp, WV):
    """Stack heads: ``V = (W_V^1; …; W_V^H)``, shape ``(..., H·d, p)``."""
    H, d, p = WV.shape[-3:]
    return xp.reshape(WV, WV.shape[:-3] + (H * d, p))


def predict_from_moments(params: Params, S, q):
    """``ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q = V^T φ``; ``S`` ``(..., N, d, d)``, ``q`` ``(..., N, d)`` → ``(..., N, p)``."""
    xp = array_namespace(S, q, params.WV)
    phi = _flat(xp, features(kernel(params), S, q), 2)
    return xp.matmul(phi, _value_matrix(xp, params.WV))


def _validate(X, q, y=None):
    xp = array_namespace(X, q)
    if X.ndim != 3:
        raise ValueError(f"X has shape {tuple(X.shape)}; expected (B, n, d)")
    B, n, d = X.shape
    if q.ndim != 2 or q.shape != (B, d):
        raise ValueError(f"q has shape {tuple(q.shape)}; expected (B, d) = ({B}, {d})")
    arrays = [("X", X), ("q", q)]
    if y is not None:
        if y.ndim != 2 or y.shape[0] != B:
            raise ValueError(f"y has shape {tuple(y.shape)}; expected (B, p) with B = {B}")
        arrays.append(("y", y))
    for name, a in arrays:
        if not bool(xp.all(xp.isfinite(a))):
            raise ValueError(f"{name} contains non-finite values")


def _validate_params(params: Params, d: int, p: int | None = None):
    H, dq, r = params.WQ.shape[-3:]
    if params.WQ.ndim != 3:
        raise ValueError(f"params.WQ has shape {tuple(params.WQ.shape)}; expected (H, d, r)")
    if tuple(params.WK.shape) != (H, dq, r):
        raise ValueError(f"params.WK has shape {tuple(params.WK.shape)}; expected {(H, dq, r)} like WQ")
    if params.WV.ndim != 3 or tuple(params.WV.shape[:2]) != (H, dq):
        raise ValueError(f"params.WV has shape {tuple(params.WV.shape)}; expected ({H}, {dq}, p)")
    if dq != d:
        raise ValueError(f"params have token dimension d={dq} but the data have d={d}")
    if p is not None and params.WV.shape[-1] != p:
        raise ValueError(f"params.WV has p={params.WV.shape[-1]} outputs but y has p={p}")


def predict(params: Params, X, q):
    """Predictions ``ŷ`` of shape ``(B, p)`` for contexts ``X`` ``(B, n, d)`` and queries ``q`` ``(B, d)``.

    ``ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q`` with ``Ŝ = X^T X / n`` (docs/theory.md §1).
    """
    _validate(X, q)
    _validate_params(params, X.shape[-1])
    return predict_from_moments(params, context_second_moment(X), q)


def loss_and_grad_from_moments(params: Params, S, q, y, sample_weight=None,
                               blocks=BLOCKS, with_loss: bool = True):
    """Weighted loss ``Σ_i w_i ½‖ŷ_i − y_i‖²`` and its closed-form gradients (docs/theory.md §1).

    Shapes: ``S`` ``(..., N, d, d)``, ``q`` ``(..., N, d)``, ``y`` ``(..., N, p)``, ``sample_weight``
    ``(..., N)`` (default ``1/N``, the batch mean). With ``φ_h = Ŝ K_h^T q``, ``e = ŷ − y`` and
    ``g_h = Ŝ W_V^h e``:

        ∇_{W_V^h} = Σ_i w_i φ_h e^T,   ∇_{K_h} = Σ_i w_i q g_h^T,
        ∇_{W_Q^h} = ∇_{K_h} W_K^h,     ∇_{W_K^h} = (∇_{K_h})^T W_Q^h.

    Returns ``(loss, grads)`` with ``loss`` of shape ``(...)`` and ``grads`` a :class:`Params`;
    blocks not listed in ``blocks`` are returned as ``None`` and not computed, and so is the
    loss with ``with_loss=False`` (local steps need only the gradients).
    """
    xp = array_namespace(S, q, y, params.WV)
    H, d, p = params.WV.shape[-3:]
    N = S.shape[-3]
    if sample_weight is None:
        sample_weight = xp.full(S.shape[:-2], 1.0 / N, dtype=S.dtype)
    V = _value_matrix(xp, params.WV)                                 # (..., Hd, p)
    phi = _flat(xp, features(kernel(params), S, q), 2)               # (..., N, Hd)
    e = xp.matmul(phi, V) - y                                        # (..., N, p)
    ew = e * sample_weight[..., None]
    loss = 0.5 * xp.sum(ew * e, axis=(-2, -1)) if with_loss else None
    gWV = gWQ = gWK = None
    if "WV" in blocks:
        gV = xp.matmul(xp.matrix_transpose(phi), ew)                 # (..., Hd, p)
        gWV = xp.reshape(gV, gV.shape[:-2] + (H, d, p))
    if "WQ" in blocks or "WK" in blocks:
        gK = _kernel_gradient(xp, S, q, ew, params.WV)
        if "WQ" in blocks:
            gWQ = xp.matmul(gK, params.WK)
        if "WK" in blocks:
            gWK = xp.matmul(xp.matrix_transpose(gK), params.WQ)
    return loss, Params(gWQ, gWK, gWV)


def _kernel_gradient(xp, S, q, ew, WV):
    """``∇_{K_h} = Σ_i q_i g_{h,i}^T`` with ``g_h = Ŝ W_V^h e_w``; returns ``(..., H, d, d)``."""
    H, d, p = WV.shape[-3:]
    # V^T (..., p, Hd) as a C-ordered copy: BLAS multiplies it about twice as fast as a transposed view
    VT = xp.reshape(moveaxis(xp, WV, -1, -3), WV.shape[:-3] + (p, H * d), copy=True)
    u = xp.matmul(ew, VT)                                            # (..., N, Hd) = W_V^h e
    u = xp.reshape(u, u.shape[:-1] + (H, d))
    g = _flat(xp, xp.matmul(u, S), 2)                                # (..., N, Hd), Ŝ symmetric
    gK = xp.matmul(xp.matrix_transpose(q), g)                        # (..., d, Hd)
    gK = xp.reshape(gK, gK.shape[:-1] + (H, d))                      # (..., d, H, d)
    return moveaxis(xp, gK, -2, -3)                                  # (..., H, d, d)


def kernel_gradient_from_moments(params: Params, S, q, y, sample_weight=None):
    """Gradient with respect to the kernels, ``∇_{K_h} ℓ = Σ_i w_i q g_h^T``, shape ``(..., H, d, d)``."""
    xp = array_namespace(S, q, y, params.WV)
    H, d, _ = params.WV.shape[-3:]
    N = S.shape[-3]
    if sample_weight is None:
        sample_weight = xp.full(S.shape[:-2], 1.0 / N, dtype=S.dtype)
    V = _value_matrix(xp, params.WV)
    phi = _flat(xp, features(kernel(params), S, q), 2)
    ew = (xp.matmul(phi, V) - y) * sample_weight[..., None]
    return _kernel_gradient(xp, S, q, ew, params.WV)


def loss_and_grad(params: Params, X, q, y):
    """Batch-mean loss ``(1/B) Σ_i ½‖ŷ_i − y_i‖²`` and closed-form gradients (docs/theory.md §1).

    ``X`` ``(B, n, d)``, ``q`` ``(B, d)``, ``y`` ``(B, p)``; returns ``(loss, grads)`` with ``grads``
    a :class:`Params` of the same shapes as ``params``.
    """
    _validate(X, q, y)
    _validate_params(params, X.shape[-1], y.shape[-1])
    return loss_and_grad_from_moments(params, context_second_moment(X), q, y)
