"""Value-block moments of a fixed kernel (docs/theory.md §4).

For a fixed kernel the model is linear in the stacked value block ``V = (W_V^1; …; W_V^H)``:
``ŷ = V^T φ`` with ``φ = (φ_1; …; φ_H)``, ``φ_h = Ŝ K_h^T q``. Each client's objective is then

    F_c(K, V) = ½ tr(V^T A_c V) − tr(V^T B_c) + ½ y2_c,
    A_c = E_c[φ φ^T],  B_c = E_c[φ y^T],  y2_c = E_c‖y‖²,

with ``E_c`` the mean over the client's samples: exactly the empirical objective the
simulator optimises.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arrays import array_namespace
from .model import flat
from .clients import StackedClients, stack_clients

__all__ = ["ValueMoments", "value_moments", "value_moments_and_features", "value_objective"]


@dataclass(frozen=True)
class ValueMoments:
    """Per-client ``A_c`` ``(m, Hd, Hd)``, ``B_c`` ``(m, Hd, p)``, ``y2_c`` ``(m,)`` and weights ``p_c`` ``(m,)``.

    Parameters
    ----------
    A : array, shape (m, H·d, H·d)
        ``A_c = E_c[φφ^T]`` (unregularised).
    B : array, shape (m, H·d, p)
        ``B_c = E_c[φ y^T]``.
    y2 : array, shape (m,)
        ``y2_c = E_c‖y‖²``.
    weights : array, shape (m,)
        Client weights ``p_c``.
    lam : float, default 0.0
        Ridge ``λ`` (``A_tilde = A + λI``).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> moments = lt.value_moments(clients.truth["kernel"], clients, lam=0.1)
    >>> A, B, y2 = moments.weighted()             # Σ_c p_c (A_c, B_c, y2_c)
    >>> A.shape, B.shape, bool((moments.A_tilde - moments.A).trace(axis1=1, axis2=2).round(12).tolist() == [0.4] * 3)
    ((4, 4), (4, 2), True)
    """

    A: object
    B: object
    y2: object
    weights: object
    lam: float = 0.0

    @property
    def A_tilde(self):
        """``Ã_c = A_c + λ I`` (docs/theory.md §4), shape ``(m, Hd, Hd)``."""
        xp = array_namespace(self.A)
        return self.A + self.lam * xp.eye(self.A.shape[-1], dtype=self.A.dtype)

    def weighted(self):
        """The global moments ``(A, B, y2) = Σ_c p_c (A_c, B_c, y2_c)``."""
        xp = array_namespace(self.A)
        w = self.weights
        return (xp.sum(w[:, None, None] * self.A, axis=0), xp.sum(w[:, None, None] * self.B, axis=0),
                xp.sum(w * self.y2))


def value_moments(K, clients, lam: float = 0.0, *, xp=None) -> ValueMoments:
    """``A_c = E_c[φφ^T]``, ``B_c = E_c[φ y^T]``, ``y2_c = E_c‖y‖²`` for kernels ``K`` ``(H, d, d)``.

    ``clients`` is a :class:`~linattn_theory.core.clients.StackedClients`, a
    :class:`~linattn_theory.core.clients.FederatedDataset` or a list of ``(X, q, y)`` tuples. ``lam``
    is recorded on the result, whose ``A_tilde`` is ``Ã_c = A_c + λI``; ``A`` stays unregularised.
    The features are those of ``clients.attention`` (softmax: ``φ_h = X^T a_h``, docs/theory.md §9).

    Parameters
    ----------
    K : array, shape (H, d, d)
        Kernels.
    clients : StackedClients, FederatedDataset or sequence of (X, q, y)
        The clients.
    lam : float, default 0.0
        Ridge ``λ ≥ 0``, recorded on the result.
    xp : module, optional
        Array namespace of the result; default that of ``clients``.

    Returns
    -------
    ValueMoments
        The per-client moments and weights.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> moments = lt.value_moments(K, clients, lam=0.1)
    >>> moments.A.shape, moments.B.shape, moments.y2.shape
    ((3, 4, 4), (3, 4, 2), (3,))
    >>> V = lt.profile_objective(K, clients, lam=0.1)[1]      # the minimiser of Σ_c p_c F_{λ,c}
    >>> bool(np.isclose(moments.weights @ lt.value_objective(V, moments, 0.1), lt.profile_objective(K, clients, 0.1)[0]))
    True
    """
    return value_moments_and_features(K, clients, lam, xp=xp)[0]


def value_moments_and_features(K, clients, lam: float = 0.0, *, xp=None) -> tuple[ValueMoments, object]:
    """``(value_moments(K, clients, lam), φ)``: also the features ``φ`` ``(..., m, N, H·d)`` the
    moments are built from, so that a kernel gradient at the same ``K`` need not compute them again
    (:func:`~linattn_theory.core.model.kernel_gradient_from_moments`'s ``phi``).

    Parameters
    ----------
    K, clients, lam, xp
        As in :func:`value_moments`.

    Returns
    -------
    moments : ValueMoments
        :func:`value_moments`'s result.
    phi : array, shape (..., m, N, H·d)
        The features the moments are built from.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import stack_clients
    >>> from linattn_theory.core.moments import value_moments, value_moments_and_features
    >>> rng = np.random.default_rng(0)
    >>> data = stack_clients([(rng.normal(size=(8, 5, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 1)))])
    >>> K = rng.normal(size=(2, 3, 3))
    >>> moments, phi = value_moments_and_features(K, data)
    >>> phi.shape, bool(np.allclose(moments.A[0], phi[0].T @ phi[0] / 8))       # A_c = E_c[φφ^T]
    ((1, 8, 6), True)
    >>> bool(np.allclose(moments.A, value_moments(K, data).A))
    True
    """
    if not lam >= 0:
        raise ValueError(f"lam = {lam!r}; expected a number >= 0")
    data = clients if isinstance(clients, StackedClients) else stack_clients(clients, xp=xp)
    xp = array_namespace(data.S)
    phi = flat(xp, data.features(xp.asarray(K, dtype=data.S.dtype)), 2)   # (m, N, Hd)
    w = data.sample_weight[..., None]
    A = xp.matmul(xp.matrix_transpose(phi), phi * w)
    B = xp.matmul(xp.matrix_transpose(phi), data.y * w)
    y2 = xp.sum(data.y * data.y * w, axis=(-2, -1))
    return ValueMoments(A, B, y2, data.weights, float(lam)), phi


def value_objective(V, moments: ValueMoments, lam: float = 0.0):
    """``F_{λ,c}(V) = ½ tr(V^T A_c V) − tr(V^T B_c) + ½ y2_c + (λ/2)‖V‖²`` per client, shape ``(m,)``.

    ``V`` is the stacked value block ``(Hd, p)`` (or ``(m, Hd, p)``, one per client).

    Parameters
    ----------
    V : array, shape (H·d, p) or (m, H·d, p)
        The stacked value block(s).
    moments : ValueMoments
        The clients' moments at the frozen kernel (:func:`value_moments`).
    lam : float, default 0.0
        Ridge ``λ ≥ 0``.

    Returns
    -------
    array, shape (m,)
        ``F_{λ,c}(V)`` of every client; ``moments.weights @`` it is the global objective.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=2, samples_per_client=32, tokens=4, dim=3, rank=1)
    >>> moments = lt.value_moments(clients.truth["kernel"], clients)
    >>> bool(np.allclose(lt.value_objective(np.zeros((3, 2)), moments), moments.y2 / 2))   # F(0) = ½ E‖y‖²
    True
    """
    xp = array_namespace(V, moments.A)
    AV = xp.matmul(moments.A, V)
    quad = 0.5 * xp.sum(V * AV, axis=(-2, -1)) - xp.sum(V * moments.B, axis=(-2, -1))
    return quad + 0.5 * moments.y2 + 0.5 * lam * xp.sum(V * V, axis=(-2, -1))
