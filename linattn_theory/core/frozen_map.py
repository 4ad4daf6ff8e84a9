"""The frozen stage's inner loop: each client's ``E`` local steps on the value block as an
affine map (docs/theory.md §5). The round engine, the warm-up grid and the theory use it.
"""

from __future__ import annotations

from .arrays import array_namespace
from .moments import ValueMoments

__all__ = ["frozen_client_map", "frozen_map"]


def frozen_client_map(moments: ValueMoments, eta: float, E: int, lam: float = 0.0):
    """Each client's ``E`` local steps on ``F_{λ,c}`` as an affine map ``V ↦ M_c V + b_c`` (docs/theory.md §5).

    ``M_c = (I − ηÃ_c)^E`` and ``b_c = Σ_{j<E} (I − ηÃ_c)^j η B_c`` with ``Ã_c = A_c + λI``:
    the local step ``V ← V − η(Ã_c V − B_c)`` applied ``E`` times from ``V = I`` and ``V = 0``.
    Array-API (runs on the moments' namespace); returns ``(M, b)`` of shapes ``(m, Hd, Hd)``
    and ``(m, Hd, p)``.

    Parameters
    ----------
    moments : ValueMoments
        The clients' moments at the frozen kernel.
    eta : float
        Client step size ``η``.
    E : int
        Local steps.
    lam : float, default 0.0
        Ridge ``λ``.

    Returns
    -------
    M : array, shape (m, H·d, H·d)
        Each client's linear part.
    b : array, shape (m, H·d, p)
        Each client's constant part.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import stack_clients
    >>> from linattn_theory.core.frozen_map import frozen_client_map
    >>> from linattn_theory.core.moments import value_moments
    >>> rng = np.random.default_rng(0)
    >>> data = stack_clients([(rng.normal(size=(8, 5, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 1)))])
    >>> moments = value_moments(rng.normal(size=(2, 3, 3)), data)               # H·d = 6, p = 1
    >>> M, b = frozen_client_map(moments, eta=0.01, E=3, lam=0.2)
    >>> V0 = rng.normal(size=(6, 1))
    >>> V = V0
    >>> for _ in range(3):                                                       # three local steps by hand
    ...     V = V - 0.01 * ((moments.A[0] + 0.2 * np.eye(6)) @ V - moments.B[0])
    >>> bool(np.allclose(M[0] @ V0 + b[0], V))
    True
    """
    return frozen_map(moments.A, moments.B, eta, E, lam)


def frozen_map(A, B, eta, E: int, lam=0.0):
    """:func:`frozen_client_map` of the moments ``A`` ``(..., Hd, Hd)`` and ``B`` ``(..., Hd, p)``:
    ``M = (I − η(A + λI))^E``, ``b = Σ_{j<E} (I − η(A + λI))^j η B`` (docs/theory.md §5), with ``η`` and
    ``λ`` numbers or arrays that broadcast against ``A`` (one per instance: shape ``(I, 1, 1, 1)``).

    Parameters
    ----------
    A : array, shape (..., H·d, H·d)
        Value moments ``A_c``.
    B : array, shape (..., H·d, p)
        Value moments ``B_c``.
    eta : float or array
        Client step size ``η``.
    E : int
        Local steps.
    lam : float or array, default 0.0
        Ridge ``λ``.

    Returns
    -------
    M : array, shape (..., H·d, H·d)
        The linear parts.
    b : array, shape (..., H·d, p)
        The constant parts.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.frozen_map import frozen_map
    >>> A, B = np.array([[[2.0]], [[4.0]]]), np.array([[[1.0]], [[1.0]]])     # two instances, one client each
    >>> M, b = frozen_map(A, B, np.array([0.25, 0.125])[:, None, None], E=2)
    >>> M.ravel().tolist(), b.ravel().tolist()                                # (1 − ηA)², (1 + (1 − ηA)) η B
    ([0.25, 0.25], [0.375, 0.1875])
    """
    xp = array_namespace(A, B)
    identity = xp.eye(A.shape[-1], dtype=A.dtype)
    step = identity - eta * (A + lam * identity)                 # (m, Hd, Hd)
    M = xp.broadcast_to(identity, A.shape)
    b = xp.zeros_like(B)
    for _ in range(E):
        b = xp.matmul(step, b) + eta * B
        M = xp.matmul(step, M)
    return M, b
