"""Static attention heads: attention patterns fixed in advance (docs/theory.md §7).

A static head replaces its scores ``s_h(q, x_i)/n = q^T K_h x_i / n`` by fixed weights ``a_i``
over positions, so it contributes ``(W_V^h)^T Σ_i a_i x_i``: its feature is ``ψ_h = X^T a``
instead of ``φ_h = Ŝ K_h^T q``, and its value projection keeps training. Patterns:

- uniform: ``a_i = 1/n`` (the head becomes a linear model on the context mean);
- mean score: ``a_i = E[s_h(q, x_i)]/n`` measured on calibration data (the head's average attention);
- decay: ``a_i ∝ exp(−γ (n − i))``, normalised to sum to one (recent tokens weigh more).

Which heads can be static? With positional structure in the tokens (position-dependent means),
part of each head's score variance is input-independent. By the law of total variance over
samples ``(q, X)`` and positions ``i``,

    Var[s_h] = Var_i(E[s_h | i]) + E_i[Var(s_h | i)],

and the **input-independent share** of head ``h`` is ``Var_i(E[s_h | i]) / Var[s_h]`` (invariant
to the kernel's scale). The selection rule makes the heads with the largest share static.
:func:`compare_static_heads` runs the comparison: full training (FedAvg), FedFrozen, and
FedFrozen whose selected heads are made static at ``T0`` (same warm-up, same budget).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.arrays import array_namespace, to_numpy
from ..core.model import flat, heads_to_columns, value_matrix, context_second_moment, features
from ..core.clients import as_federated, stack_clients

__all__ = ["attention_scores", "input_independent_share", "select_static_heads", "uniform_pattern",
           "mean_score_pattern", "decay_pattern", "static_patterns", "StaticHeads",
           "static_features", "head_features", "predict_static", "static_profile_objective",
           "stack_contexts", "compare_static_heads", "head_pattern_statistics", "static_head_features",
           "head_static_loss_change", "PATTERNS"]

PATTERNS = ("uniform", "mean", "decay")


def attention_scores(K, X, q):
    """``s_h(q, x_i) = q^T K_h x_i`` for kernels ``K`` ``(H, d, d)``, ``X`` ``(..., N, n, d)``, ``q``
    ``(..., N, d)``; returns ``(..., N, H, n)`` (docs/theory.md §1).

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Kernels.
    X : array_like, shape (..., N, n, d)
        Contexts.
    q : array_like, shape (..., N, d)
        Queries.

    Returns
    -------
    array, shape (..., N, H, n)
        The scores.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import attention_scores
    >>> K = np.stack([np.eye(2), 2 * np.eye(2)])                  # H = 2 heads in d = 2
    >>> X = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])     # N = 1 context of n = 3 tokens
    >>> attention_scores(K, X, np.array([[1.0, 2.0]])).tolist()  # q^T K_h x_i
    [[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]]]
    """
    xp = array_namespace(K, X, q)
    H, d = K.shape[-3], K.shape[-1]
    k = xp.matmul(q, heads_to_columns(xp, K))               # (..., N, H·d): (K_h^T q)
    k = xp.reshape(k, k.shape[:-1] + (H, d))
    return xp.matmul(k, xp.matrix_transpose(X))              # (..., N, H, n)


def input_independent_share(K, X, q):
    """Per head, ``Var_i(E[s_h | i]) / Var[s_h]`` over calibration samples ``(X, q)`` (N, n, d), (N, d).

    Positions are weighted equally; ``E`` and ``Var`` are means over the ``N`` samples. Returns a
    host array ``(H,)`` in ``[0, 1]`` (0 where a head's scores do not vary at all).

    Parameters
    ----------
    K, X, q
        Kernels and calibration samples, as in :func:`attention_scores`.

    Returns
    -------
    numpy.ndarray, shape (H,)
        ``ω_h``: 1 for a head whose scores depend on the position only.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import input_independent_share
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 4, 3)) + 5 * np.eye(4, 3)     # tokens with position-dependent means
    >>> q = np.ones((200, 3))
    >>> shares = input_independent_share(np.stack([np.eye(3), np.zeros((3, 3))]), X, q)
    >>> bool(0 < shares[0] < 1), float(shares[1])             # the zero kernel's scores do not vary
    (True, 0.0)
    """
    s = to_numpy(attention_scores(K, X, q))                  # (N, H, n)
    position_means = s.mean(axis=0)                          # (H, n): E[s_h | i]
    between = position_means.var(axis=1)                     # Var_i E[s_h | i]
    total = s.transpose(1, 0, 2).reshape(s.shape[1], -1).var(axis=1)
    return np.divide(between, total, out=np.zeros_like(total), where=total > 0)


def select_static_heads(shares, count: int | None = None, threshold: float | None = None) -> tuple[int, ...]:
    """The heads to make static: the ``count`` largest shares, or every head with share ``≥ threshold``.

    Parameters
    ----------
    shares : array_like, shape (H,)
        ``ω_h`` (:func:`input_independent_share`).
    count : int, optional
        How many heads.
    threshold : float, optional
        The least share (give ``count`` or ``threshold``).

    Returns
    -------
    tuple of int
        The heads, in increasing order.

    Examples
    --------
    >>> from linattn_theory.theory.static_heads import select_static_heads
    >>> select_static_heads([0.1, 0.9, 0.5], count=2), select_static_heads([0.1, 0.9, 0.5], threshold=0.6)
    ((1, 2), (1,))
    """
    shares = np.asarray(shares, dtype=float)
    H = shares.shape[0]
    if (count is None) == (threshold is None):
        raise ValueError("select_static_heads: give exactly one of count= and threshold=")
    if count is not None:
        if not isinstance(count, (int, np.integer)) or not 0 <= count <= H:
            raise ValueError(f"select_static_heads: count={count!r}; expected an integer in [0, {H}]")
        order = np.argsort(-shares, kind="stable")
        return tuple(sorted(int(h) for h in order[:count]))
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"select_static_heads: threshold={threshold!r}; expected a number in [0, 1]")
    return tuple(int(h) for h in np.flatnonzero(shares >= threshold))


# -- patterns ----------------------------------------------------------------------------------

def uniform_pattern(n: int) -> np.ndarray:
    """``a_i = 1/n``: attention to the context mean.

    Parameters
    ----------
    n : int
        Context length.

    Returns
    -------
    numpy.ndarray, shape (n,)
        The pattern.

    Examples
    --------
    >>> from linattn_theory.theory.static_heads import uniform_pattern
    >>> uniform_pattern(4).tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    return np.full(n, 1.0 / n)


def mean_score_pattern(K, X, q) -> np.ndarray:
    """``a_{h,i} = E[s_h(q, x_i)] / n`` on calibration data: each head's mean attention, ``(H, n)``.

    Parameters
    ----------
    K, X, q
        Kernels and calibration samples, as in :func:`attention_scores`.

    Returns
    -------
    numpy.ndarray, shape (H, n)
        The patterns.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import mean_score_pattern
    >>> X = np.array([[[3.0], [0.0]], [[1.0], [2.0]]])            # N = 2 samples, n = 2, d = 1
    >>> mean_score_pattern(np.ones((1, 1, 1)), X, np.ones((2, 1))).tolist()   # mean scores (2, 1), over n
    [[1.0, 0.5]]
    """
    s = to_numpy(attention_scores(K, X, q))
    return s.mean(axis=0) / X.shape[-2]


def decay_pattern(n: int, gamma: float) -> np.ndarray:
    """``a_i ∝ exp(−γ (n − i))``, ``i = 1..n``, normalised to ``Σ_i a_i = 1`` (``γ = 0``: uniform).

    Parameters
    ----------
    n : int
        Context length.
    gamma : float
        Decay rate ``γ ≥ 0`` towards the start of the context.

    Returns
    -------
    numpy.ndarray, shape (n,)
        The pattern.

    Examples
    --------
    >>> from linattn_theory.theory.static_heads import decay_pattern
    >>> a = decay_pattern(3, gamma=0.0)
    >>> a.tolist() == [1 / 3] * 3, bool(decay_pattern(3, gamma=1.0)[-1] > 1 / 3)
    (True, True)
    """
    if not np.isfinite(gamma) or gamma < 0:
        raise ValueError(f"decay_pattern: gamma={gamma!r}; expected a finite number >= 0")
    a = np.exp(-gamma * (n - np.arange(1, n + 1)))
    return a / a.sum()


def static_patterns(kind: str, K, X, q, gamma: float = 0.5) -> np.ndarray:
    """Patterns ``(H, n)`` of one ``kind`` (``uniform``, ``mean`` or ``decay``) for every head.

    Parameters
    ----------
    kind : {"uniform", "mean", "decay"}
        The pattern.
    K, X, q
        Kernels and calibration samples (``mean``; the shapes elsewhere).
    gamma : float, default 0.5
        ``γ`` of ``decay``.

    Returns
    -------
    numpy.ndarray, shape (H, n)
        One pattern per head.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import static_patterns
    >>> K, X, q = np.zeros((2, 3, 3)), np.zeros((5, 4, 3)), np.zeros((5, 3))
    >>> static_patterns("uniform", K, X, q).shape, static_patterns("decay", K, X, q, gamma=0.0)[1].tolist()
    ((2, 4), [0.25, 0.25, 0.25, 0.25])
    """
    H, n = K.shape[-3], X.shape[-2]
    if kind == "uniform":
        return np.tile(uniform_pattern(n), (H, 1))
    if kind == "mean":
        return mean_score_pattern(K, X, q)
    if kind == "decay":
        return np.tile(decay_pattern(n, gamma), (H, 1))
    raise ValueError(f"static pattern {kind!r} is unknown; expected one of {', '.join(PATTERNS)}")


@dataclass(frozen=True)
class StaticHeads:
    """Which heads are static and their patterns ``(H, n)`` (rows of dynamic heads are ignored).

    Parameters
    ----------
    heads : tuple of int
        The static heads.
    patterns : numpy.ndarray, shape (H, n)
        Their attention patterns.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import StaticHeads, uniform_pattern
    >>> static = StaticHeads(heads=(1,), patterns=np.tile(uniform_pattern(3), (2, 1)))
    >>> static.heads, static.patterns.shape
    ((1,), (2, 3))
    """

    heads: tuple[int, ...]
    patterns: np.ndarray


def static_features(X, patterns):
    """``ψ_h = Σ_i a_{h,i} x_i = X^T a_h`` for ``X`` ``(..., N, n, d)`` and patterns ``(H, n)``; ``(..., N, H, d)``.

    Parameters
    ----------
    X : array_like, shape (..., N, n, d)
        Contexts.
    patterns : array_like, shape (H, n)
        The heads' patterns.

    Returns
    -------
    array, shape (..., N, H, d)
        ``ψ_h``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import static_features
    >>> X = np.arange(6.0).reshape(1, 3, 2)                      # tokens (0, 1), (2, 3), (4, 5)
    >>> static_features(X, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]).tolist()
    [[[1.0, 2.0], [4.0, 5.0]]]
    """
    xp = array_namespace(X)
    return xp.matmul(xp.asarray(patterns, dtype=X.dtype), X)


def head_features(K, X, q, static: StaticHeads):
    """Per-head features ``(..., N, H, d)``: ``ψ_h`` for the static heads, ``φ_h = Ŝ K_h^T q`` for the others.

    Parameters
    ----------
    K, X, q
        Kernels, contexts and queries, as in :func:`attention_scores`.
    static : StaticHeads
        Which heads are static, with their patterns.

    Returns
    -------
    array, shape (..., N, H, d)
        The features.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.model import context_second_moment, features
    >>> from linattn_theory.theory.static_heads import StaticHeads, head_features, uniform_pattern
    >>> rng = np.random.default_rng(0)
    >>> K, X, q = rng.normal(size=(2, 3, 3)), rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3))
    >>> phi = head_features(K, X, q, StaticHeads((0,), np.tile(uniform_pattern(5), (2, 1))))
    >>> phi.shape, bool(np.allclose(phi[:, 0], X.mean(axis=1)))    # head 0 static: the context mean
    ((4, 2, 3), True)
    >>> bool(np.allclose(phi[:, 1], features(K, context_second_moment(X), q)[:, 1]))
    True
    """
    xp = array_namespace(K, X, q)
    phi = features(K, context_second_moment(X), q)
    if not static.heads:
        return phi
    mask = np.zeros(K.shape[-3], dtype=bool)
    mask[list(static.heads)] = True
    mask = xp.reshape(xp.asarray(mask), (-1, 1))
    return xp.where(mask, static_features(X, static.patterns), phi)


def predict_static(params, static: StaticHeads, X, q):
    """``ŷ = Σ_{h static} (W_V^h)^T X^T a_h + Σ_{h dynamic} (W_V^h)^T Ŝ K_h^T q``, ``(N, p)``.

    Parameters
    ----------
    params : Params
        The layer (the static heads' ``W_Q``, ``W_K`` are not used).
    static : StaticHeads
        The static heads.
    X : array_like, shape (N, n, d)
        Contexts.
    q : array_like, shape (N, d)
        Queries.

    Returns
    -------
    array, shape (N, p)
        ``ŷ``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.model import predict_from_contexts
    >>> from linattn_theory.theory.static_heads import StaticHeads, predict_static
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=3, r=2, p=1, heads=2, seed=0)
    >>> X, q = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3))
    >>> y = predict_static(params, StaticHeads((), None), X, q)     # no static head: the layer itself
    >>> y.shape, bool(np.allclose(y, predict_from_contexts(params, X, q)))
    ((4, 1), True)
    """
    from ..core.model import kernel

    xp = array_namespace(X, q, params.WV)
    phi = flat(xp, head_features(kernel(params), X, q, static), 2)
    return xp.matmul(phi, value_matrix(xp, params.WV))


def stack_contexts(clients, xp=None, dtype=np.float64):
    """Contexts ``X`` of every client padded to a common ``N``: ``(m, N, n, d)`` (same layout as
    :func:`~linattn_theory.core.clients.stack_clients`; padding rows are zero and carry no weight).

    Parameters
    ----------
    clients : FederatedDataset or sequence of (X, q, y)
        The clients.
    xp : module, optional
        Array namespace; default NumPy.
    dtype : dtype, default numpy.float64
        Floating-point type.

    Returns
    -------
    array, shape (m, N, n, d)
        The padded contexts.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import stack_contexts
    >>> clients = [(np.ones((2, 4, 3)), np.ones((2, 3)), np.ones((2, 1))),
    ...            (np.ones((3, 4, 3)), np.ones((3, 3)), np.ones((3, 1)))]
    >>> X = stack_contexts(clients)
    >>> X.shape, float(X[0, 2].sum()), float(X[1, 2].sum())       # client 0's third row is padding
    ((2, 3, 4, 3), 0.0, 12.0)
    """
    data = as_federated(clients)
    n, d, _ = data.dims
    X = np.zeros((len(data), int(data.sizes.max()), n, d), dtype=dtype)
    for c, (Xc, _, _) in enumerate(data):
        X[c, :Xc.shape[0]] = Xc
    return X if xp is None or xp is np else xp.asarray(X)


def static_profile_objective(K, clients, ridge: float = 0.0, static: StaticHeads | None = None):
    """``(Φ_λ, V*)`` of the hybrid model: ``Φ_λ = ½ y2 − ½ tr(B^T Ã^{-1} B)``, ``V* = Ã^{-1} B`` with
    ``Ã = Σ_c p_c A_c + λI``, ``A_c = E_c[φφ^T]``, ``B_c = E_c[φ y^T]``, ``y2 = Σ_c p_c E_c‖y‖²`` on the
    features of :func:`head_features` (docs/theory.md §4 with ``φ`` replaced); ``V*`` is ``(H·d, p)``.
    The best ``F_λ`` any value block reaches with these heads; ``static=None``: every head attends
    (the kernel-profile objective ``Φ_λ(K)`` itself).

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Kernels (of the dynamic heads).
    clients : FederatedDataset
        The clients.
    ridge : float, default 0.0
        Ridge ``λ``.
    static : StaticHeads, optional
        The static heads; default none.

    Returns
    -------
    objective : float
        ``Φ_λ``.
    value : numpy.ndarray, shape (H·d, p)
        ``V*``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.static_heads import static_profile_objective
    >>> clients = lt.planted_kernel_clients(num_clients=2, samples_per_client=32, tokens=4, dim=3, rank=1)
    >>> K = clients.truth["kernel"]
    >>> bool(np.isclose(static_profile_objective(K, clients, 0.1)[0], lt.profile_objective(K, clients, 0.1)[0]))
    True
    """
    data = as_federated(clients)
    static = StaticHeads((), None) if static is None else static
    A, B, y2 = 0.0, 0.0, 0.0
    for (X, q, y), p in zip(data, data.weights):
        phi = flat(np, head_features(np.asarray(K), X, q, static), 2)
        A = A + p * phi.T @ phi / len(y)
        B = B + p * phi.T @ y / len(y)
        y2 = y2 + p * np.sum(y * y) / len(y)
    V = np.linalg.solve(A + ridge * np.eye(A.shape[0]), B)
    return float(0.5 * y2 - 0.5 * np.sum(B * V)), V


def static_head_features(clients, kind: str, *, count: int | None = None, gamma: float = 0.5,
                         calibration=None):
    """``frozen_features(params)`` for :func:`~linattn_theory.sim.engine.simulate`: at the freeze,
    heads become static with pattern ``kind`` (``uniform``, ``mean`` or ``decay``).

    ``count=None``: every head becomes static; ``count=k``: the ``k`` heads with the largest
    input-independent share ``ω_h``, measured at the frozen kernel ``K_{T0}`` on ``calibration``
    contexts ``(X, q)`` (default: every client's training contexts), become static and the others
    keep ``K_{T0}`` (the selection rule of docs/theory.md §7). The mean pattern is also measured at
    ``K_{T0}``. Uses nothing but the frozen kernel and the training contexts.

    Parameters
    ----------
    clients : FederatedDataset
        The clients of the run.
    kind : {"uniform", "mean", "decay"}
        The static pattern.
    count : int, optional
        How many heads become static; default all.
    gamma : float, default 0.5
        ``γ`` of ``decay``.
    calibration : tuple of (X, q), optional
        Calibration contexts and queries; default every client's training contexts.

    Returns
    -------
    callable
        ``frozen_features(params) -> φ`` ``(m, N, H·d)``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import stack_contexts, static_head_features
    >>> clients = lt.planted_kernel_clients(num_clients=2, samples_per_client=8, tokens=4, dim=3, rank=1)
    >>> params = lt.Params.init(d=3, r=2, p=clients.dims[2], heads=2, seed=0)
    >>> phi = static_head_features(clients, "uniform")(params)    # every head static: the context mean
    >>> phi.shape, bool(np.allclose(phi[0, :, 3:], stack_contexts(clients)[0].mean(axis=1)))
    ((2, 8, 6), True)
    """
    from ..core.model import kernel

    clients = as_federated(clients)
    if calibration is None:
        calibration = (np.concatenate([c.X for c in clients]), np.concatenate([c.q for c in clients]))
    X_cal, q_cal = (np.asarray(a, dtype=np.float64) for a in calibration)
    X_all, q_all = stack_contexts(clients), stack_clients(clients).q

    def frozen_features(params):
        xp = array_namespace(params.WV)
        K = to_numpy(kernel(params))
        heads = (tuple(range(K.shape[0])) if count is None else
                 select_static_heads(input_independent_share(K, X_cal, q_cal), count=count))
        static = StaticHeads(heads, static_patterns(kind, K, X_cal, q_cal, gamma))
        X, q = (xp.asarray(a, dtype=params.WV.dtype) for a in (X_all, q_all))
        return flat(xp, head_features(xp.asarray(K, dtype=params.WV.dtype), X, q, static), 2)
    return frozen_features


def head_static_loss_change(K, clients, ridge: float = 0.0, *, kind: str = "mean", gamma: float = 0.5,
                            calibration=None) -> pd.DataFrame:
    """Per head ``h``: its input-independent share ``ω_h`` and the loss change when only ``h`` is made
    static, ``Δ_h = Φ_λ(K; h static) − Φ_λ(K)`` (:func:`static_profile_objective`, the best ``F_λ`` a value
    block reaches; docs/theory.md §7); the pattern ``kind`` is measured at ``K`` on ``calibration``
    (default: every client's training contexts). Columns ``head``, ``share``, ``loss_change``,
    ``relative_loss_change`` (``Δ_h / Φ_λ(K)``).

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Kernels.
    clients : FederatedDataset
        The clients.
    ridge : float, default 0.0
        Ridge ``λ``.
    kind, gamma, calibration
        The static pattern (default ``"mean"``), as in :func:`static_head_features`.

    Returns
    -------
    pandas.DataFrame
        One row per head.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> import numpy as np
    >>> from linattn_theory.theory.static_heads import head_static_loss_change, static_profile_objective
    >>> clients = lt.planted_kernel_clients(num_clients=2, samples_per_client=8, tokens=4, dim=3, rank=1)
    >>> K = clients.truth["kernel"]
    >>> table = head_static_loss_change(K, clients, 0.1)
    >>> table.columns.tolist()
    ['head', 'share', 'loss_change', 'relative_loss_change']
    >>> learned = static_profile_objective(K, clients, 0.1)[0]
    >>> bool(np.allclose(table["loss_change"], table["relative_loss_change"] * learned))
    True
    """
    clients = as_federated(clients)
    if calibration is None:
        calibration = (np.concatenate([c.X for c in clients]), np.concatenate([c.q for c in clients]))
    X_cal, q_cal = (np.asarray(a, dtype=np.float64) for a in calibration)
    K = np.asarray(K, dtype=np.float64)
    shares = input_independent_share(K, X_cal, q_cal)
    patterns = static_patterns(kind, K, X_cal, q_cal, gamma)
    learned, _ = static_profile_objective(K, clients, ridge)
    rows = []
    for h, share in enumerate(shares):
        static, _ = static_profile_objective(K, clients, ridge, StaticHeads((h,), patterns))
        rows.append({"head": h, "share": float(share), "loss_change": static - learned,
                     "relative_loss_change": (static - learned) / learned})
    return pd.DataFrame(rows)


# -- the comparison ----------------------------------------------------------------------------

def compare_static_heads(config, clients=None, *, count: int = 1, patterns=PATTERNS,
                         gamma: float = 0.5, calibration=None) -> pd.DataFrame:
    """Static heads vs FedFrozen vs full training on one configuration (docs/theory.md §7).

    Runs FedAvg (``full``) and FedFrozen with ``T0 = config.warmup_rounds`` of ``config``
    (strategy ``fedfrozen``); measures each head's input-independent share at the warm-up kernel
    ``K_{T0}`` on ``calibration`` data (``(X, q)``; default: every client's training contexts);
    makes the ``count`` heads with the largest share static with each pattern in ``patterns``
    (``static_<pattern>`` rows: same warm-up, then the static heads' features ``X^T a`` and the
    other heads' frozen kernels, only ``W_V`` trains). One row per arm: final ``loss`` (F),
    ``loss_regularized`` (F_λ), ``profile_loss`` (the best ``F_λ`` any value block reaches with that
    arm's final heads, :func:`static_profile_objective`), the static heads, the shares and whether
    the run diverged.

    Parameters
    ----------
    config : RunConfig
        The instance (its ``warmup_rounds`` is the freeze).
    clients : FederatedDataset, optional
        Its clients; default those of ``config``.
    count : int, default 1
        How many heads become static.
    patterns : iterable of str, default ("uniform", "mean", "decay")
        The static patterns compared.
    gamma, calibration
        As in :func:`static_head_features`.

    Returns
    -------
    pandas.DataFrame
        One row per arm (``full``, ``fedfrozen``, ``static_<pattern>``).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.static_heads import compare_static_heads
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> table = compare_static_heads(config, patterns=("uniform",))
    >>> table["arm"].tolist()
    ['full', 'fedfrozen', 'static_uniform']
    >>> bool((table["profile_loss"] <= table["loss_regularized"] + 1e-12).all())   # Φ_λ: the best value block
    True
    """
    from ..data.families import clients_from_config
    from ..sim.engine import simulate
    from ..core.model import kernel

    if config.model.attention != "linear":
        raise ValueError(f"compare_static_heads runs linear-attention heads (docs/theory.md §7); "
                         f"model.attention = {config.model.attention!r}: for softmax heads measure "
                         f"them with head_pattern_statistics (docs/theory.md §9)")
    fedfrozen = config.with_updates({"federated.strategy": "fedfrozen"})
    clients = clients_from_config(config) if clients is None else as_federated(clients)
    runs = {"full": simulate(config.with_updates({"federated.strategy": "fedavg"}), clients),
            "fedfrozen": simulate(fedfrozen, clients)}
    K = kernel(runs["fedfrozen"].warmup_params)
    if calibration is None:
        calibration = (np.concatenate([c.X for c in clients]), np.concatenate([c.q for c in clients]))
    X_cal, q_cal = (np.asarray(a, dtype=np.float64) for a in calibration)
    shares = input_independent_share(K, X_cal, q_cal)
    heads = select_static_heads(shares, count=count)
    statics = {}
    for kind in patterns:
        statics[f"static_{kind}"] = StaticHeads(heads, static_patterns(kind, K, X_cal, q_cal, gamma))
        features = static_head_features(clients, kind, count=count, gamma=gamma, calibration=(X_cal, q_cal))
        runs[f"static_{kind}"] = simulate(fedfrozen, clients, frozen_features=features)
    lam = config.federated.ridge
    rows = []
    for arm, result in runs.items():
        last = result.table.iloc[-1]
        K_arm = kernel(result.params) if arm == "full" else K
        profile, _ = static_profile_objective(K_arm, clients, lam, statics.get(arm))
        row = {"arm": arm, "static_heads": ",".join(map(str, statics[arm].heads)) if arm in statics else "",
               "loss": float(last["loss"]), "loss_regularized": float(last["loss_regularized"]),
               "profile_loss": profile, "rounds": int(last["round"]), "diverged": result.diverged}
        row.update({f"share_head_{h}": float(s) for h, s in enumerate(shares)})
        rows.append(row)
    return pd.DataFrame(rows)


# -- softmax heads: how static is each head's attention pattern? (docs/theory.md §9) ------------

def _pattern_measures(a, X, y, WV, mean, yhat):
    """For samples of one group: ``E‖a_h − ā_h‖²``, ``E KL(a_h ‖ ā_h)``, each head's loss change and ``F``.

    ``a`` ``(N, H, n)`` the weights, ``mean`` ``(H, n)`` the pattern ``ā``, ``yhat`` ``(N, p)``; the loss
    change replaces head ``h``'s feature ``X^T a_h`` by ``X^T ā_h`` with ``W_V`` unchanged.
    """
    from scipy.special import xlogy

    variance = np.mean(np.sum((a - mean) ** 2, axis=-1), axis=0)
    kl = np.mean(np.sum(xlogy(a, a) - xlogy(a, mean), axis=-1), axis=0)
    base = 0.5 * np.sum((yhat - y) ** 2, axis=-1)
    change = []
    for h in range(a.shape[1]):
        shift = np.einsum("bi,bid->bd", mean[h] - a[:, h], X) @ WV[h]    # W_V^hT X^T (ā_h − a_h)
        change.append(np.mean(0.5 * np.sum((yhat + shift - y) ** 2, axis=-1) - base))
    return variance, kl, np.array(change), np.full(a.shape[1], np.mean(base))


def head_pattern_statistics(params, clients, temperature: float = 1.0) -> pd.DataFrame:
    """How static is each softmax head's attention, per client and across clients (docs/theory.md §9, §7).

    For head ``h`` with weights ``a_h = softmax(X K_h^T q / τ)`` and a group of samples (one client,
    or all clients with weights ``p_c``): the mean pattern ``ā_h = E[a_h]``, the pattern variance
    ``E‖a_h − ā_h‖²``, the mean divergence ``E KL(a_h ‖ ā_h)`` and the loss change
    ``F(θ with head h static at ā_h) − F(θ)`` (its feature ``X^T a_h`` replaced by ``X^T ā_h``,
    ``W_V`` unchanged). One row per head and group: ``head``, ``client`` (``-1`` for all clients),
    ``pattern_variance``, ``mean_kl``, ``loss_change`` and ``loss`` (the group's ``F(θ)``).

    Parameters
    ----------
    params : Params
        A softmax-attention layer.
    clients : FederatedDataset
        The clients.
    temperature : float, default 1.0
        Softmax temperature ``τ``.

    Returns
    -------
    pandas.DataFrame
        One row per head and group.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.static_heads import head_pattern_statistics
    >>> clients = lt.planted_kernel_clients(num_clients=2, samples_per_client=8, tokens=4, dim=3, rank=1)
    >>> params = lt.Params.init(d=3, r=2, p=clients.dims[2], heads=2, seed=0)
    >>> table = head_pattern_statistics(params, clients)
    >>> len(table), sorted(set(table["client"]))                  # 2 heads x (2 clients and all)
    (6, [-1, 0, 1])
    >>> bool((table["pattern_variance"] >= 0).all() and (table["mean_kl"] >= -1e-12).all())
    True
    """
    from ..core.model import kernel, predict_from_contexts, softmax_weights

    data = as_federated(clients)
    host = params.map(lambda b: np.asarray(to_numpy(b), dtype=np.float64))
    K, WV = kernel(host), host.WV
    rows, groups = [], []
    for c, (X, q, y) in enumerate(data):
        a = softmax_weights(K, X, q, temperature)
        yhat = predict_from_contexts(host, X, q, "softmax", temperature)
        groups.append((a, X, y, yhat))
        for h, values in enumerate(zip(*_pattern_measures(a, X, y, WV, a.mean(axis=0), yhat))):
            rows.append({"head": h, "client": c, **dict(zip(_MEASURES, map(float, values)))})
    overall = sum(p * a.mean(axis=0) for p, (a, *_) in zip(data.weights, groups))
    total = np.zeros((len(_MEASURES), K.shape[0]))
    for p, (a, X, y, yhat) in zip(data.weights, groups):
        total += p * np.array(_pattern_measures(a, X, y, WV, overall, yhat))
    for h in range(K.shape[0]):
        rows.append({"head": h, "client": -1, **dict(zip(_MEASURES, map(float, total[:, h])))})
    return pd.DataFrame(rows)


_MEASURES = ("pattern_variance", "mean_kl", "loss_change", "loss")
