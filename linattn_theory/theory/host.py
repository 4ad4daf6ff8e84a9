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

    Parameters
    ----------
    clients : FederatedDataset, sequence of (X, q, y) or StackedClients
        The clients (stacked ones come back as they are).
    attention : {"linear", "softmax"}, default "linear"
        The layer that reads them.
    temperature : float, default 1.0
        Softmax temperature ``τ``.

    Returns
    -------
    StackedClients
        The clients, float64 NumPy.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> data.attention, data.S.shape                   # m = 3 clients, N = 64, d = 4
    ('linear', (3, 64, 4, 4))
    """
    if isinstance(clients, StackedClients):
        return clients
    return stack_clients(clients, attention=attention, temperature=temperature)


def attention_of(config: dict | None) -> tuple[str, float]:
    """``(attention, temperature)`` of a recorded configuration (linear when it names none).

    Parameters
    ----------
    config : dict or None
        A run's configuration as recorded (``RunConfig.to_dict()``, ``metadata["config"]``).

    Returns
    -------
    attention : str
        ``"linear"`` or ``"softmax"``.
    temperature : float
        ``τ``.

    Examples
    --------
    >>> from linattn_theory.theory.host import attention_of
    >>> attention_of(None), attention_of({"model": {"attention": "softmax", "temperature": 2.0}})
    (('linear', 1.0), ('softmax', 2.0))
    """
    model = (config or {}).get("model", {}) or {}
    return model.get("attention") or "linear", float(model.get("temperature") or 1.0)


def check_kernel(K, data: StackedClients, name: str = "K") -> np.ndarray:
    """``K`` as a host float64 stack ``(H, d, d)`` (one ``(d, d)`` kernel gains the head axis); a
    ``ValueError`` names a wrong shape or a non-finite entry.

    Parameters
    ----------
    K : array_like, shape (H, d, d) or (d, d)
        The kernel(s).
    data : StackedClients
        The clients (their ``d``).
    name : str, default "K"
        The name in the error message.

    Returns
    -------
    numpy.ndarray, shape (H, d, d)
        ``K``, float64.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> from linattn_theory.theory.host import check_kernel
    >>> check_kernel(K[0], data).shape
    (1, 4, 4)
    >>> check_kernel(np.ones((3, 3)), data)
    Traceback (most recent call last):
    ...
    ValueError: K has shape (1, 3, 3); expected (H, d, d) with d = 4
    """
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
    """Per-client value moments of kernel ``K`` as host float64 arrays.

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        The kernels.
    data : StackedClients
        The clients.

    Returns
    -------
    ValueMoments
        ``A`` ``(m, Hd, Hd)``, ``B`` ``(m, Hd, p)``, ``y2``, ``weights`` ``(m,)`` (docs/theory.md §4).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> moments = host_moments(K, data)
    >>> moments.A.shape, moments.B.shape, moments.weights.shape
    ((3, 4, 4), (3, 4, 2), (3,))
    """
    return host_moments_and_features(K, data)[0]


def host_moments_and_features(K, data: StackedClients):
    """``(host_moments(K, data), φ)``, with the features ``φ`` (data's namespace) they are built from.

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        The kernels.
    data : StackedClients
        The clients.

    Returns
    -------
    moments : ValueMoments
        As :func:`host_moments`.
    phi : array, shape (m, N, H·d)
        The features.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> from linattn_theory.theory.host import host_moments_and_features
    >>> moments, phi = host_moments_and_features(K, data)
    >>> phi.shape, bool(np.allclose(moments.A, host_moments(K, data).A))
    ((3, 64, 4), True)
    """
    mom, phi = value_moments_and_features(K, data)
    return ValueMoments(*(np.asarray(to_numpy(a), dtype=np.float64)
                          for a in (mom.A, mom.B, mom.y2, mom.weights))), phi


def solve_symmetric(A, B, rtol: float = PSEUDO_INVERSE_RTOL):
    """``A^+ B`` for symmetric ``A`` through its eigendecomposition (minimum-norm when singular).

    Parameters
    ----------
    A : array_like, shape (n, n)
        Symmetric.
    B : array_like, shape (n, k)
        Right-hand sides.
    rtol : float, default PSEUDO_INVERSE_RTOL
        Eigenvalues below ``rtol`` times the largest count as zero.

    Returns
    -------
    numpy.ndarray, shape (n, k)
        ``A^+ B``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.host import solve_symmetric
    >>> solve_symmetric(np.diag([2.0, 0.0]), np.array([[4.0], [1.0]])).tolist()      # the null direction: 0
    [[2.0], [0.0]]
    """
    w, U = np.linalg.eigh(A)
    keep = np.abs(w) > rtol * np.max(np.abs(w), axis=-1, keepdims=True)
    inv = np.divide(1.0, w, out=np.zeros_like(w), where=keep)
    return U @ (inv[..., None] * (np.swapaxes(U, -1, -2) @ B))


def ridged(A, lam: float):
    """``Ã = A + λI`` (works on one matrix or a stack).

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        The matrix or stack.
    lam : float
        ``λ``.

    Returns
    -------
    numpy.ndarray, shape (..., n, n)
        ``A + λI``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.host import ridged
    >>> ridged(np.eye(2), 0.5).tolist()
    [[1.5, 0.0], [0.0, 1.5]]
    """
    return A + lam * np.eye(A.shape[-1])


def global_objective(V, moments: ValueMoments, lam: float) -> float:
    """``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)`` from the moments (docs/theory.md §4).

    Parameters
    ----------
    V : array_like, shape (H·d, p)
        The stacked value block.
    moments : ValueMoments
        The clients' moments at ``K`` (:func:`host_moments`).
    lam : float
        ``λ``.

    Returns
    -------
    float
        ``F_λ(K, V)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> from linattn_theory.theory.host import global_objective, profile_from_moments
    >>> moments = host_moments(K, data)
    >>> profile, V_star = profile_from_moments(moments, 0.1)
    >>> bool(np.isclose(global_objective(V_star, moments, 0.1), profile))        # F_λ(K, V*_λ) = Φ_λ(K)
    True
    """
    return float(np.sum(moments.weights * value_objective(V, moments, lam)))


def profile_from_moments(moments: ValueMoments, lam: float):
    """``(Φ_λ, V*_λ)`` with ``V* = Ã^{-1} B`` and ``Φ_λ = ½ y2 − ½ tr(B^T V*)``.

    Parameters
    ----------
    moments : ValueMoments
        The clients' moments at ``K`` (:func:`host_moments`).
    lam : float
        ``λ``.

    Returns
    -------
    profile : float
        ``Φ_λ(K)``.
    V_star : numpy.ndarray, shape (H·d, p)
        ``V*_λ(K)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> from linattn_theory.theory.host import profile_from_moments
    >>> profile, V_star = profile_from_moments(host_moments(K, data), 0.1)
    >>> V_star.shape, bool(np.isclose(profile, lt.profile_objective(K, clients, lam=0.1)[0]))
    ((4, 2), True)
    """
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

    Parameters
    ----------
    K : array_like, shape (H, d, d) or (B, H, d, d)
        The kernels.
    V : array_like, shape (H·d, p) or (B, H·d, p)
        The stacked value blocks.
    data : StackedClients
        The clients.
    phi : array, optional
        The features at ``K`` (linear attention).

    Returns
    -------
    numpy.ndarray, shape (H, d, d) or (B, H, d, d)
        ``∇_K F(K, V)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K, data = clients.truth["kernel"], as_stacked(clients)
    >>> from linattn_theory.theory.host import kernel_gradient, profile_from_moments
    >>> _, V_star = profile_from_moments(host_moments(K, data), 0.0)
    >>> kernel_gradient(K, V_star, data).shape
    (1, 4, 4)
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
    """Refuse a ridge ``λ`` that is negative or not finite (a ``ValueError`` naming it).

    Parameters
    ----------
    lam : float
        ``λ``.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.theory.host import check_ridge
    >>> check_ridge(0.5)
    >>> check_ridge(-1)
    Traceback (most recent call last):
    ...
    ValueError: lam = -1; expected a finite ridge λ >= 0
    """
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam = {lam!r}; expected a finite ridge λ >= 0")
