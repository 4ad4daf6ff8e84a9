"""One multi-head linear-attention layer with closed-form gradients (docs/theory.md §1).

A sample is a context ``X ∈ R^{n×d}``, a query ``q ∈ R^d`` and a target ``y ∈ R^p``.
Head ``h`` owns ``W_Q^h, W_K^h ∈ R^{d×r}`` and ``W_V^h ∈ R^{d×p}``; its attention kernel
is ``K_h = W_Q^h (W_K^h)^T`` and the prediction is

    ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q,      Ŝ = X^T X / n.

The context enters only through ``Ŝ``, so the batched functions below take ``Ŝ``
(``context_second_moment``) and every function allows leading batch axes on the
parameters (one model per client) and on the data (``(..., N, ...)``).
All arithmetic goes through the inputs' array namespace (Array API standard).

Softmax attention (docs/theory.md §9) uses the same parameters with scores
``s_{h,i} = q^T K_h x_i / τ`` and weights ``a_h = softmax_i(s_{h,·})``:

    ŷ = Σ_h (W_V^h)^T X^T a_h = Σ_h (W_V^h)^T φ_h,      φ_h = X^T a_h.

It needs the contexts ``X`` themselves, so its batched functions take ``X`` where the linear
ones take ``Ŝ``; ``*_from_inputs`` dispatch on ``attention`` (``inputs`` = ``Ŝ`` or ``X``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .arrays import array_namespace, moveaxis

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
    "ATTENTIONS",
    "softmax_weights",
    "softmax_features",
    "attention_features",
    "predict_from_contexts",
    "loss_and_grad_from_contexts",
    "loss_and_grad_from_inputs",
    "kernel_gradient_from_inputs",
    "value_matrix",
    "flat",
    "heads_to_columns",
    "validate_params",
]

BLOCKS = ("WQ", "WK", "WV")
#: the attention of the layer: linear (docs/theory.md §1) or softmax (docs/theory.md §9)
ATTENTIONS = ("linear", "softmax")


@dataclass(frozen=True)
class Params:
    """Parameters of one layer: ``WQ``, ``WK`` of shape ``(..., H, d, r)``, ``WV`` ``(..., H, d, p)``.

    Leading axes (``...``) stack several models, e.g. one per client.

    Parameters
    ----------
    WQ, WK : array, shape (..., H, d, r)
        Query and key factors of the ``H`` heads (kernel ``K_h = W_Q^h (W_K^h)^T`` of rank ``≤ r``).
    WV : array, shape (..., H, d, p)
        Value blocks.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> params = lt.Params.init(d=6, r=3, p=2, heads=2, seed=0)
    >>> params.shape, params.WV.shape
    ((2, 6, 3, 2), (2, 6, 2))
    >>> doubled = params.map(lambda block: 2 * block)
    >>> bool((lt.kernel(doubled) == 4 * lt.kernel(params)).all())
    True
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
    """Attention kernels ``K_h = W_Q^h (W_K^h)^T``, shape ``(..., H, d, d)`` (docs/theory.md §1).

    Parameters
    ----------
    params : Params
        The layer (or a stack of layers).

    Returns
    -------
    array, shape (..., H, d, d)
        The kernels, in the namespace of ``params``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> lt.kernel(lt.Params.init(d=6, r=3, p=2, heads=2)).shape
    (2, 6, 6)
    """
    xp = array_namespace(params.WQ, params.WK)
    if params.WQ.ndim < 3 or tuple(params.WQ.shape[-3:]) != tuple(params.WK.shape[-3:]):
        raise ValueError(f"kernel: WQ {tuple(params.WQ.shape)} and WK {tuple(params.WK.shape)}; "
                         f"expected the same shape (..., H, d, r)")
    return xp.matmul(params.WQ, xp.matrix_transpose(params.WK))


def context_second_moment(X):
    """``Ŝ = X^T X / n`` for contexts ``X`` of shape ``(..., n, d)``; returns ``(..., d, d)``.

    Parameters
    ----------
    X : array, shape (..., n, d)
        Contexts of ``n`` tokens.

    Returns
    -------
    array, shape (..., d, d)
        ``Ŝ``, symmetric positive semi-definite.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> X = np.arange(6.0).reshape(3, 2)           # three tokens in d = 2
    >>> S = lt.context_second_moment(X)
    >>> bool(np.allclose(S, [[(0 + 4 + 16) / 3, (0 + 6 + 20) / 3], [(0 + 6 + 20) / 3, (1 + 9 + 25) / 3]]))
    True
    """
    xp = array_namespace(X)
    return xp.matmul(xp.matrix_transpose(X), X) / X.shape[-2]


def heads_to_columns(xp, K):
    """``(..., H, d, e) -> (..., d, H·e)`` so that column ``h·e + b`` is ``K[h, :, b]``.

    Parameters
    ----------
    xp : module
        The array namespace.
    K : array, shape (..., H, d, e)
        Per-head blocks.

    Returns
    -------
    array, shape (..., d, H·e)
        The heads side by side.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.model import heads_to_columns
    >>> K = np.arange(12.0).reshape(2, 3, 2)
    >>> columns = heads_to_columns(np, K)
    >>> columns.shape, bool((columns[:, 1 * 2 + 1] == K[1, :, 1]).all())
    ((3, 4), True)
    """
    H, d, e = K.shape[-3:]
    return xp.reshape(moveaxis(xp, K, -3, -2), K.shape[:-3] + (d, H * e))


def features(K, S, q):
    """Per-head features ``φ_h = Ŝ K_h^T q``, shape ``(..., N, H, d)`` (docs/theory.md §4).

    Parameters
    ----------
    K : array, shape (..., H, d, d)
        Kernels.
    S : array, shape (..., N, d, d)
        Context second moments ``Ŝ`` (:func:`context_second_moment`).
    q : array, shape (..., N, d)
        Queries.

    Returns
    -------
    array, shape (..., N, H, d)
        ``φ_h``; the prediction is ``ŷ = Σ_h (W_V^h)^T φ_h``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> params, X, q = lt.Params.init(d=4, r=2, p=1), rng.normal(size=(5, 3, 4)), rng.normal(size=(5, 4))
    >>> phi = lt.features(lt.kernel(params), lt.context_second_moment(X), q)
    >>> phi.shape
    (5, 1, 4)
    >>> bool(np.allclose(np.einsum("nhd,hdp->np", phi, params.WV), lt.predict(params, X, q)))
    True
    """
    xp = array_namespace(K, S, q)
    H, d = K.shape[-3], K.shape[-1]
    k = xp.matmul(q, heads_to_columns(xp, K))          # (..., N, H·d): row h·d+b = (K_h^T q)_b
    k = xp.reshape(k, k.shape[:-1] + (H, d))
    return xp.matmul(k, S)                               # (k^T Ŝ)^T = Ŝ k, Ŝ symmetric


def flat(xp, a, tail: int):
    """Merge the last ``tail`` axes of ``a``.

    Parameters
    ----------
    xp : module
        The array namespace.
    a : array
        The array.
    tail : int
        How many trailing axes to merge.

    Returns
    -------
    array
        ``a`` reshaped.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.model import flat
    >>> flat(np, np.zeros((2, 3, 4)), 2).shape
    (2, 12)
    """
    n = 1
    for s in a.shape[-tail:]:
        n *= s
    return xp.reshape(a, a.shape[:-tail] + (n,))


def value_matrix(xp, WV):
    """Stack heads: ``V = (W_V^1; …; W_V^H)``, shape ``(..., H·d, p)``.

    Parameters
    ----------
    xp : module
        The array namespace.
    WV : array, shape (..., H, d, p)
        Value blocks.

    Returns
    -------
    array, shape (..., H·d, p)
        The stacked value block ``V``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import value_matrix
    >>> value_matrix(np, lt.Params.init(d=6, r=3, p=2, heads=2).WV).shape
    (12, 2)
    """
    H, d, p = WV.shape[-3:]
    return xp.reshape(WV, WV.shape[:-3] + (H * d, p))


def predict_from_moments(params: Params, S, q):
    """``ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q = V^T φ``; ``S`` ``(..., N, d, d)``, ``q`` ``(..., N, d)`` → ``(..., N, p)``.

    Parameters
    ----------
    params : Params
        The layer.
    S : array, shape (..., N, d, d)
        Context second moments ``Ŝ``.
    q : array, shape (..., N, d)
        Queries.

    Returns
    -------
    array, shape (..., N, p)
        ``ŷ``, equal to :func:`predict` on the contexts ``Ŝ`` comes from.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import predict_from_moments
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> y_hat = predict_from_moments(params, lt.context_second_moment(X), q)
    >>> y_hat.shape, bool(np.allclose(y_hat, lt.predict(params, X, q)))
    ((8, 1), True)
    """
    xp = array_namespace(S, q, params.WV)
    phi = flat(xp, features(kernel(params), S, q), 2)
    return xp.matmul(phi, value_matrix(xp, params.WV))


def _validate(X, q, y=None):
    xp = array_namespace(X, q)
    if X.ndim != 3:
        raise ValueError(f"X has shape {tuple(X.shape)}; expected (B, n, d)")
    B, n, d = X.shape
    if B == 0 or n == 0 or d == 0:
        raise ValueError(f"X has shape {tuple(X.shape)}; expected at least one sample, token and "
                         f"dimension (an empty batch has no mean loss)")
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


def validate_params(params: Params, d: int, p: int | None = None):
    """Check that ``params`` fit data of token dimension ``d`` (and ``p`` outputs) and are finite;
    a ``TypeError`` or ``ValueError`` names the first block that does not.

    Parameters
    ----------
    params : Params
        The layer.
    d : int
        The data's token dimension.
    p : int, optional
        The data's output dimension (not checked when ``None``).

    Returns
    -------
    None

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import validate_params
    >>> params = lt.Params.init(d=6, r=3, p=2)
    >>> validate_params(params, 6, 2)
    >>> validate_params(params, 5)
    Traceback (most recent call last):
    ...
    ValueError: params have token dimension d=6 but the data have d=5
    """
    if not isinstance(params, Params):
        raise TypeError(f"params is a {type(params).__name__}; expected a Params")
    if params.WQ.ndim != 3:
        raise ValueError(f"params.WQ has shape {tuple(params.WQ.shape)}; expected (H, d, r)")
    H, dq, r = params.WQ.shape
    if tuple(params.WK.shape) != (H, dq, r):
        raise ValueError(f"params.WK has shape {tuple(params.WK.shape)}; expected {(H, dq, r)} like WQ")
    if params.WV.ndim != 3 or tuple(params.WV.shape[:2]) != (H, dq):
        raise ValueError(f"params.WV has shape {tuple(params.WV.shape)}; expected ({H}, {dq}, p)")
    if dq != d:
        raise ValueError(f"params have token dimension d={dq} but the data have d={d}")
    if p is not None and params.WV.shape[-1] != p:
        raise ValueError(f"params.WV has p={params.WV.shape[-1]} outputs but y has p={p}")
    for block in BLOCKS:
        a = getattr(params, block)
        xp = array_namespace(a)
        if not bool(xp.all(xp.isfinite(a))):
            raise ValueError(f"params.{block} contains non-finite values (NaN or inf)")


def _check_attention(attention, temperature):
    if attention not in ATTENTIONS:
        raise ValueError(f"attention = {attention!r}; expected one of {', '.join(map(repr, ATTENTIONS))}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating)) \
            or not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature = {temperature!r}; expected a finite number > 0")


def predict(params: Params, X, q, attention: str = "linear", temperature: float = 1.0):
    """Predictions ``ŷ`` of shape ``(B, p)`` for contexts ``X`` ``(B, n, d)`` and queries ``q`` ``(B, d)``.

    Linear attention: ``ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q`` with ``Ŝ = X^T X / n`` (docs/theory.md §1);
    softmax: ``ŷ = Σ_h (W_V^h)^T X^T softmax(X K_h^T q / τ)`` (docs/theory.md §9).

    Parameters
    ----------
    params : Params
        The layer.
    X : array, shape (B, n, d)
        Contexts.
    q : array, shape (B, d)
        Queries.
    attention : {"linear", "softmax"}, default "linear"
        The attention.
    temperature : float, default 1.0
        Softmax temperature ``τ > 0``.

    Returns
    -------
    array, shape (B, p)
        ``ŷ``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> params, X, q = lt.Params.init(d=4, r=2, p=3), rng.normal(size=(5, 6, 4)), rng.normal(size=(5, 4))
    >>> lt.predict(params, X, q).shape, lt.predict(params, X, q, attention="softmax").shape
    ((5, 3), (5, 3))
    """
    _check_attention(attention, temperature)
    _validate(X, q)
    validate_params(params, X.shape[-1])
    if attention == "softmax":
        return predict_from_contexts(params, X, q, attention, temperature)
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

    Parameters
    ----------
    params : Params
        The layer (or one per client, on the leading axes).
    S : array, shape (..., N, d, d)
        Context second moments ``Ŝ``.
    q : array, shape (..., N, d)
        Queries.
    y : array, shape (..., N, p)
        Targets.
    sample_weight : array, shape (..., N), optional
        Weights ``w_i``; default ``1/N``.
    blocks : tuple of str, default ("WQ", "WK", "WV")
        The blocks whose gradients to compute.
    with_loss : bool, default True
        Compute the loss too.

    Returns
    -------
    loss : array, shape (...)
        The weighted loss (``None`` with ``with_loss=False``).
    grads : Params
        The gradients of ``blocks`` (the others ``None``).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> loss, grads = lt.loss_and_grad_from_moments(params, lt.context_second_moment(X), q, y, blocks=("WV",))
    >>> grads.WQ is None, bool(np.allclose(grads.WV, lt.loss_and_grad(params, X, q, y)[1].WV))
    (True, True)
    """
    xp = array_namespace(S, q, y, params.WV)
    H, d, p = params.WV.shape[-3:]
    N = S.shape[-3]
    if sample_weight is None:
        sample_weight = xp.full(S.shape[:-2], 1.0 / N, dtype=S.dtype)
    V = value_matrix(xp, params.WV)                                 # (..., Hd, p)
    phi = flat(xp, features(kernel(params), S, q), 2)               # (..., N, Hd)
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


def _value_backprop(xp, ew, WV):
    """``W_V^h e_w`` per sample and head, shape ``(..., N, H, d)``."""
    H, d, p = WV.shape[-3:]
    # V^T (..., p, Hd) as a C-ordered copy: BLAS multiplies it about twice as fast as a transposed view
    VT = xp.reshape(moveaxis(xp, WV, -1, -3), WV.shape[:-3] + (p, H * d), copy=True)
    u = xp.matmul(ew, VT)                                            # (..., N, Hd) = W_V^h e
    return xp.reshape(u, u.shape[:-1] + (H, d))


def _query_outer(xp, q, g, H, d):
    """``Σ_i q_i g_{h,i}^T`` for ``g`` ``(..., N, H·d)``; returns ``(..., H, d, d)``."""
    gK = xp.matmul(xp.matrix_transpose(q), g)                        # (..., d, Hd)
    gK = xp.reshape(gK, gK.shape[:-1] + (H, d))                      # (..., d, H, d)
    return moveaxis(xp, gK, -2, -3)                                  # (..., H, d, d)


def _kernel_gradient(xp, S, q, ew, WV):
    """``∇_{K_h} = Σ_i q_i g_{h,i}^T`` with ``g_h = Ŝ W_V^h e_w``; returns ``(..., H, d, d)``."""
    H, d, p = WV.shape[-3:]
    u = _value_backprop(xp, ew, WV)
    g = flat(xp, xp.matmul(u, S), 2)                                # (..., N, Hd), Ŝ symmetric
    return _query_outer(xp, q, g, H, d)


def kernel_gradient_from_moments(params: Params, S, q, y, sample_weight=None, *, phi=None):
    """Gradient with respect to the kernels, ``∇_{K_h} ℓ = Σ_i w_i q g_h^T``, shape ``(..., H, d, d)``.

    ``phi``: the features ``φ`` ``(..., N, H·d)`` at the kernel ``W_Q W_K^T`` of ``params`` when
    they are at hand (:func:`~linattn_theory.core.moments.value_moments_and_features`); else
    computed here.

    Parameters
    ----------
    params : Params
        The layer.
    S, q, y, sample_weight
        As in :func:`loss_and_grad_from_moments`.
    phi : array, shape (..., N, H·d), optional
        The features at the kernel of ``params``.

    Returns
    -------
    array, shape (..., H, d, d)
        ``∇_{K_h} ℓ``; ``∇_{W_Q^h} = ∇_{K_h} W_K^h`` (:func:`loss_and_grad_from_moments`).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import kernel_gradient_from_moments
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> gK = kernel_gradient_from_moments(params, lt.context_second_moment(X), q, y)
    >>> gK.shape, bool(np.allclose(gK @ params.WK, lt.loss_and_grad(params, X, q, y)[1].WQ))   # ∇_{W_Q} = ∇_K W_K
    ((1, 4, 4), True)
    """
    xp = array_namespace(S, q, y, params.WV)
    H, d, _ = params.WV.shape[-3:]
    N = S.shape[-3]
    if sample_weight is None:
        sample_weight = xp.full(S.shape[:-2], 1.0 / N, dtype=S.dtype)
    V = value_matrix(xp, params.WV)
    if phi is None:
        phi = flat(xp, features(kernel(params), S, q), 2)
    ew = (xp.matmul(phi, V) - y) * sample_weight[..., None]
    return _kernel_gradient(xp, S, q, ew, params.WV)


def loss_and_grad(params: Params, X, q, y, attention: str = "linear", temperature: float = 1.0):
    """Batch-mean loss ``(1/B) Σ_i ½‖ŷ_i − y_i‖²`` and closed-form gradients (docs/theory.md §1, §9).

    Parameters
    ----------
    params : Params
        The layer.
    X : array, shape (B, n, d)
        Contexts.
    q : array, shape (B, d)
        Queries.
    y : array, shape (B, p)
        Targets.
    attention : {"linear", "softmax"}, default "linear"
        The attention.
    temperature : float, default 1.0
        Softmax temperature ``τ > 0``.

    Returns
    -------
    loss : float
        The batch-mean loss.
    grads : Params
        Its gradients with respect to ``WQ``, ``WK``, ``WV``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> loss, grads = lt.loss_and_grad(params, X, q, y)
    >>> step = np.zeros_like(params.WV)
    >>> step[0, 1, 0] = 1e-6                        # the gradient against a central difference
    >>> up = lt.loss_and_grad(params.replace(WV=params.WV + step), X, q, y)[0]
    >>> down = lt.loss_and_grad(params.replace(WV=params.WV - step), X, q, y)[0]
    >>> bool(np.isclose((up - down) / 2e-6, grads.WV[0, 1, 0], rtol=1e-6))
    True
    """
    _check_attention(attention, temperature)
    _validate(X, q, y)
    validate_params(params, X.shape[-1], y.shape[-1])
    if attention == "softmax":
        return loss_and_grad_from_contexts(params, X, q, y, attention=attention, temperature=temperature)
    return loss_and_grad_from_moments(params, context_second_moment(X), q, y)


# --------------------------------------------------------------------------------------
# softmax attention (docs/theory.md §9)
# --------------------------------------------------------------------------------------
def softmax_weights(K, X, q, temperature: float = 1.0):
    """``a_h = softmax_i(q^T K_h x_i / τ)``, shape ``(..., N, H, n)`` (docs/theory.md §9). The largest score of
    each row is subtracted before ``exp`` (the weights are unchanged, nothing overflows).

    Parameters
    ----------
    K : array, shape (..., H, d, d)
        Kernels.
    X : array, shape (..., N, n, d)
        Contexts.
    q : array, shape (..., N, d)
        Queries.
    temperature : float, default 1.0
        ``τ > 0``.

    Returns
    -------
    array, shape (..., N, H, n)
        The attention weights (each row sums to 1).

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.model import softmax_weights
    >>> rng = np.random.default_rng(0)
    >>> a = softmax_weights(rng.normal(size=(2, 3, 3)), rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3)))
    >>> a.shape, bool(np.allclose(a.sum(axis=-1), 1))
    ((4, 2, 5), True)
    """
    xp = array_namespace(K, X, q)
    H, d = K.shape[-3], K.shape[-1]
    k = xp.matmul(q, heads_to_columns(xp, K))                      # (..., N, H·d): K_h^T q
    k = xp.reshape(k, k.shape[:-1] + (H, d))
    s = xp.matmul(k, xp.matrix_transpose(X)) / temperature          # (..., N, H, n)
    z = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    return z / xp.sum(z, axis=-1, keepdims=True)


def softmax_features(K, X, q, temperature: float = 1.0):
    """Per-head softmax features ``φ_h = X^T a_h``, shape ``(..., N, H, d)`` (docs/theory.md §9).

    Parameters
    ----------
    K, X, q, temperature
        As in :func:`softmax_weights`.

    Returns
    -------
    array, shape (..., N, H, d)
        ``φ_h``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import softmax_features
    >>> rng = np.random.default_rng(0)
    >>> X, q = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3))
    >>> phi = softmax_features(np.zeros((2, 3, 3)), X, q)         # zero kernels: uniform weights
    >>> phi.shape, bool(np.allclose(phi, X.mean(axis=1)[:, None, :]))
    ((4, 2, 3), True)
    """
    xp = array_namespace(K, X, q)
    return xp.matmul(softmax_weights(K, X, q, temperature), X)


def attention_features(K, inputs, q, attention: str = "linear", temperature: float = 1.0):
    """``φ_h`` of either attention, shape ``(..., N, H, d)``: ``inputs`` is ``Ŝ`` (linear) or ``X`` (softmax).

    Parameters
    ----------
    K : array, shape (..., H, d, d)
        Kernels.
    inputs : array
        ``Ŝ`` ``(..., N, d, d)`` (linear) or ``X`` ``(..., N, n, d)`` (softmax).
    q : array, shape (..., N, d)
        Queries.
    attention : {"linear", "softmax"}, default "linear"
        The attention.
    temperature : float, default 1.0
        Softmax temperature ``τ``.

    Returns
    -------
    array, shape (..., N, H, d)
        ``φ_h`` (:func:`features` or :func:`softmax_features`).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import attention_features, features, softmax_features
    >>> rng = np.random.default_rng(0)
    >>> K, X, q = rng.normal(size=(2, 3, 3)), rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3))
    >>> S = lt.context_second_moment(X)
    >>> bool(np.allclose(attention_features(K, S, q), features(K, S, q)))
    True
    >>> bool(np.allclose(attention_features(K, X, q, "softmax"), softmax_features(K, X, q)))
    True
    """
    if attention == "softmax":
        return softmax_features(K, inputs, q, temperature)
    return features(K, inputs, q)


def predict_from_contexts(params: Params, X, q, attention: str = "linear", temperature: float = 1.0):
    """``ŷ = V^T φ`` from contexts ``X`` ``(..., N, n, d)`` and queries ``(..., N, d)`` → ``(..., N, p)``.

    Parameters
    ----------
    params : Params
        The layer.
    X : array, shape (..., N, n, d)
        Contexts.
    q : array, shape (..., N, d)
        Queries.
    attention : {"linear", "softmax"}, default "linear"
        The attention.
    temperature : float, default 1.0
        Softmax temperature ``τ``.

    Returns
    -------
    array, shape (..., N, p)
        ``ŷ``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import predict_from_contexts
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q = rng.normal(size=(2, 8, 5, 4)), rng.normal(size=(2, 8, 4))     # two clients of 8 samples
    >>> y_hat = predict_from_contexts(params, X, q)
    >>> y_hat.shape, bool(np.allclose(y_hat[1], lt.predict(params, X[1], q[1])))
    ((2, 8, 1), True)
    >>> softmax = predict_from_contexts(params, X[0], q[0], "softmax")
    >>> bool(np.allclose(softmax, lt.predict(params, X[0], q[0], "softmax")))
    True
    """
    xp = array_namespace(X, q, params.WV)
    inputs = X if attention == "softmax" else context_second_moment(X)
    phi = flat(xp, attention_features(kernel(params), inputs, q, attention, temperature), 2)
    return xp.matmul(phi, value_matrix(xp, params.WV))


def _softmax_loss_and_grad(params: Params, X, q, y, sample_weight, blocks, temperature,
                           kernel_only: bool = False):
    """Loss, value gradient and kernel gradient of softmax attention (docs/theory.md §9).

    With ``a_h`` the weights, ``φ_h = X^T a_h``, ``e = ŷ − y`` and ``v_h = W_V^h e``:
    ``∇_{W_V^h} = Σ_i w_i φ_h e^T``; ``∂ℓ/∂s_h = J X v_h`` with ``J u = a ⊙ (u − a^T u)`` (the
    Jacobian ``diag(a) − a a^T`` is never formed); ``g_h = X^T (∂ℓ/∂s_h) / τ`` and
    ``∇_{K_h} = Σ_i w_i q g_h^T``. Returns ``(loss, gV or None, gK or None)``.
    """
    xp = array_namespace(X, q, y, params.WV)
    H, d, p = params.WV.shape[-3:]
    N = X.shape[-3]
    if sample_weight is None:
        sample_weight = xp.full(X.shape[:-2], 1.0 / N, dtype=X.dtype)
    a = softmax_weights(kernel(params), X, q, temperature)            # (..., N, H, n)
    phi = flat(xp, xp.matmul(a, X), 2)                              # (..., N, Hd)
    e = xp.matmul(phi, value_matrix(xp, params.WV)) - y             # (..., N, p)
    ew = e * sample_weight[..., None]
    loss = 0.5 * xp.sum(ew * e, axis=(-2, -1))
    gV = gK = None
    if "WV" in blocks and not kernel_only:
        gV = xp.matmul(xp.matrix_transpose(phi), ew)                 # (..., Hd, p)
        gV = xp.reshape(gV, gV.shape[:-2] + (H, d, p))
    if kernel_only or "WQ" in blocks or "WK" in blocks:
        v = _value_backprop(xp, ew, params.WV)                       # (..., N, H, d)
        u = xp.matmul(v, xp.matrix_transpose(X))                     # (..., N, H, n) = X v_h
        delta = a * (u - xp.sum(a * u, axis=-1, keepdims=True))       # J u
        g = flat(xp, xp.matmul(delta, X), 2) / temperature          # (..., N, Hd)
        gK = _query_outer(xp, q, g, H, d)
    return loss, gV, gK


def loss_and_grad_from_contexts(params: Params, X, q, y, sample_weight=None, blocks=BLOCKS, *,
                                attention: str = "linear", temperature: float = 1.0):
    """Weighted loss ``Σ_i w_i ½‖ŷ_i − y_i‖²`` and closed-form gradients from contexts ``X`` ``(..., N, n, d)``.

    Softmax attention (docs/theory.md §9): ``∇_{W_V^h} = Σ_i w_i φ_h e^T``,
    ``∇_{K_h} = Σ_i w_i q g_h^T`` with ``g_h = X^T J (X W_V^h e) / τ``, ``J u = a ⊙ (u − a^T u)``,
    and ``∇_{W_Q^h} = ∇_{K_h} W_K^h``, ``∇_{W_K^h} = (∇_{K_h})^T W_Q^h``. Linear attention: the
    same as :func:`loss_and_grad_from_moments` on ``Ŝ = X^T X / n``. Shapes and ``blocks`` as there.

    Parameters
    ----------
    params : Params
        The layer.
    X : array, shape (..., N, n, d)
        Contexts.
    q, y, sample_weight, blocks
        As in :func:`loss_and_grad_from_moments`.
    attention : {"linear", "softmax"}, default "linear"
        The attention.
    temperature : float, default 1.0
        Softmax temperature ``τ``.

    Returns
    -------
    loss : array, shape (...)
        The weighted loss.
    grads : Params
        The gradients of ``blocks``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import loss_and_grad_from_contexts
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> loss, grads = loss_and_grad_from_contexts(params, X, q, y, attention="softmax")
    >>> mean_loss, mean_grads = lt.loss_and_grad(params, X, q, y, "softmax")     # default weights 1/N
    >>> bool(np.isclose(loss, mean_loss)), bool(np.allclose(grads.WQ, mean_grads.WQ))
    (True, True)
    >>> w = np.zeros(8)
    >>> w[0] = 1.0                                               # all weight on the first sample
    >>> first = loss_and_grad_from_contexts(params, X, q, y, w)[0]
    >>> bool(np.isclose(first, 0.5 * np.sum((lt.predict(params, X[:1], q[:1]) - y[:1]) ** 2)))
    True
    """
    if attention != "softmax":
        return loss_and_grad_from_moments(params, context_second_moment(X), q, y, sample_weight, blocks)
    xp = array_namespace(X, q, y, params.WV)
    loss, gWV, gK = _softmax_loss_and_grad(params, X, q, y, sample_weight, blocks, temperature)
    gWQ = gWK = None
    if gK is not None:
        if "WQ" in blocks:
            gWQ = xp.matmul(gK, params.WK)
        if "WK" in blocks:
            gWK = xp.matmul(xp.matrix_transpose(gK), params.WQ)
    return loss, Params(gWQ, gWK, gWV)


def loss_and_grad_from_inputs(params: Params, inputs, q, y, sample_weight=None, blocks=BLOCKS, *,
                              attention: str = "linear", temperature: float = 1.0, with_loss: bool = True):
    """:func:`loss_and_grad_from_moments` (``inputs = Ŝ``) or its softmax form (``inputs = X``).

    Parameters
    ----------
    params : Params
        The layer.
    inputs : array
        ``Ŝ`` ``(..., N, d, d)`` (linear) or ``X`` ``(..., N, n, d)`` (softmax).
    q, y, sample_weight, blocks, attention, temperature
        As in :func:`loss_and_grad_from_contexts`.
    with_loss : bool, default True
        ``False`` skips the linear path's loss (local steps need only the gradients; ``loss`` is then ``None``).

    Returns
    -------
    loss, grads
        As :func:`loss_and_grad_from_contexts`.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import loss_and_grad_from_inputs
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> loss, grads = loss_and_grad_from_inputs(params, lt.context_second_moment(X), q, y, with_loss=False)
    >>> loss is None, bool(np.allclose(grads.WV, lt.loss_and_grad(params, X, q, y)[1].WV))
    (True, True)
    >>> loss, grads = loss_and_grad_from_inputs(params, X, q, y, attention="softmax")    # inputs = X
    >>> bool(np.isclose(loss, lt.loss_and_grad(params, X, q, y, "softmax")[0]))
    True
    """
    if attention == "softmax":
        return loss_and_grad_from_contexts(params, inputs, q, y, sample_weight, blocks,
                                           attention=attention, temperature=temperature)
    return loss_and_grad_from_moments(params, inputs, q, y, sample_weight, blocks=blocks, with_loss=with_loss)


def kernel_gradient_from_inputs(params: Params, inputs, q, y, sample_weight=None, *,
                                attention: str = "linear", temperature: float = 1.0, phi=None):
    """``∇_{K_h} ℓ`` ``(..., H, d, d)`` of either attention; ``inputs`` is ``Ŝ`` (linear) or ``X`` (softmax).

    ``phi`` (linear attention only): the features at the kernel, when at hand
    (:func:`kernel_gradient_from_moments`).

    Parameters
    ----------
    params, inputs, q, y, sample_weight, attention, temperature
        As in :func:`loss_and_grad_from_inputs`.
    phi : array, optional
        Linear attention's features at the kernel.

    Returns
    -------
    array, shape (..., H, d, d)
        ``∇_{K_h} ℓ``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import kernel_gradient_from_inputs
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> gK = kernel_gradient_from_inputs(params, X, q, y, attention="softmax")
    >>> gK.shape, bool(np.allclose(gK @ params.WK, lt.loss_and_grad(params, X, q, y, "softmax")[1].WQ))
    ((1, 4, 4), True)
    """
    if attention == "softmax":
        if phi is not None:
            raise ValueError("phi: softmax attention's kernel gradient needs its attention weights, "
                             "not only the features; pass phi = None")
        return _softmax_loss_and_grad(params, inputs, q, y, sample_weight, (), temperature,
                                      kernel_only=True)[2]
    return kernel_gradient_from_moments(params, inputs, q, y, sample_weight, phi=phi)
