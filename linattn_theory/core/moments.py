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
    """Per-client ``A_c`` ``(m, Hd, Hd)``, ``B_c`` ``(m, Hd, p)``, ``y2_c`` ``(m,)`` and weights ``p_c`` ``(m,)``."""

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
    """
    return value_moments_and_features(K, clients, lam, xp=xp)[0]


def value_moments_and_features(K, clients, lam: float = 0.0, *, xp=None) -> tuple[ValueMoments, object]:
    """``(value_moments(K, clients, lam), φ)``: also the features ``φ`` ``(..., m, N, H·d)`` the
    moments are built from, so that a kernel gradient at the same ``K`` need not compute them again
    (:func:`~linattn_theory.core.model.kernel_gradient_from_moments`'s ``phi``)."""
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
    """
    xp = array_namespace(V, moments.A)
    AV = xp.matmul(moments.A, V)
    quad = 0.5 * xp.sum(V * AV, axis=(-2, -1)) - xp.sum(V * moments.B, axis=(-2, -1))
    return quad + 0.5 * moments.y2 + 0.5 * lam * xp.sum(V * V, axis=(-2, -1))
