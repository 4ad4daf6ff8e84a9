"""Array-namespace helpers: every numeric function asks its inputs for their namespace.

Numeric code in this package uses only the Array API standard through
``array_api_compat.array_namespace`` so that the same functions run on NumPy, CuPy and
``array-api-strict`` (docs/theory.md, "Implementation notes"). Moving results to the
host for tables and figures happens in :func:`to_numpy` alone.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import array_namespace, is_cupy_array, is_numpy_array, size

#: array_namespace and size (array-api-compat's own) are imported from here too, documented there
__all__ = ["to_numpy", "moveaxis", "sq_norms"]


def to_numpy(x) -> np.ndarray:
    """Return ``x`` as a host NumPy array (the one place results leave the device).

    NumPy arrays pass through; CuPy arrays are copied from the GPU; other standard arrays
    (``array-api-strict``, ...) go through DLPack, the standard's exchange protocol.

    Parameters
    ----------
    x : array
        An array of any standard namespace.

    Returns
    -------
    numpy.ndarray
        ``x`` on the host.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.arrays import to_numpy
    >>> x = np.arange(3.0)
    >>> to_numpy(x) is x                       # NumPy passes through
    True
    """
    if is_numpy_array(x):
        return x
    if is_cupy_array(x):
        return x.get()
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def moveaxis(xp, x, source: int, destination: int):
    """``xp.moveaxis`` through ``permute_dims`` (works on every standard namespace).

    Parameters
    ----------
    xp : module
        The array namespace.
    x : array
        The array.
    source, destination : int
        The axis to move and where it goes (negative counts from the end).

    Returns
    -------
    array
        ``x`` with its axes permuted.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.arrays import moveaxis
    >>> moveaxis(np, np.zeros((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    axes = list(range(x.ndim))
    src = source % x.ndim
    dst = destination % x.ndim
    axes.insert(dst, axes.pop(src))
    return xp.permute_dims(x, tuple(axes))


def sq_norms(xp, a, lead: int = 1):
    """``‖a_i‖_F²`` over the trailing axes of ``a`` for every index ``i`` of its ``lead`` leading
    axes (a run's clients ``(k, ...)``, an ensemble's ``(I, k, ...)``); shape ``a.shape[:lead]``.

    Parameters
    ----------
    xp : module
        The array namespace.
    a : array
        The array.
    lead : int, default 1
        The leading axes kept.

    Returns
    -------
    array, shape a.shape[:lead]
        The squared Frobenius norms.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.arrays import sq_norms
    >>> sq_norms(np, np.ones((2, 3, 4))).tolist(), sq_norms(np, np.ones((2, 3, 4)), lead=2).shape
    ([12.0, 12.0], (2, 3))
    """
    return xp.sum(xp.reshape(a * a, tuple(a.shape[:lead]) + (-1,)), axis=-1)
