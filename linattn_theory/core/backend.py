"""Array backends: one numeric code path, several array libraries (docs/theory.md, "Implementation notes").

Every numeric function of the package asks its inputs for their namespace
(``array_api_compat.array_namespace``) and uses only Array API standard functions, so the
same code runs on NumPy (CPU), CuPy (GPU) and ``array-api-strict`` (the standard's
reference implementation, which the tests use to prove that nothing NumPy-only slipped into
the shared path). This module turns a backend *name* (``model.backend`` in configs,
``--backend`` on the command line) into a namespace, and helps bound the memory one round
of the simulator uses (:func:`client_chunks`).
"""

from __future__ import annotations

import numpy as np

from .errors import ConfigError

__all__ = ["BACKENDS", "BackendUnavailableError", "get_namespace", "gpu_available",
           "client_chunks", "client_working_bytes", "resolve_max_bytes", "itemsize", "CPU_CHUNK_BYTES"]

#: Backend names accepted by :func:`get_namespace` (configs accept ``numpy`` and ``cupy``).
BACKENDS = ("numpy", "cupy", "array_api_strict")

#: Default round working set on the CPU: clients train in chunks of about this many bytes, so
#: that a chunk's data stays in cache for its ``E`` local steps (``benchmarks/bench_round.py``).
CPU_CHUNK_BYTES = 16 * 2**20

_GPU_HINT = "install the optional GPU extra: pip install 'linattn-theory[gpu]'"


class BackendUnavailableError(ConfigError):
    """The requested backend's library (or its device) is not available on this machine.

    A :class:`~linattn_theory.core.errors.ConfigError`, so the command line reports it like any
    other invalid setting (exit status 2, nothing written).

    Examples
    --------
    >>> from linattn_theory.core.errors import ConfigError
    >>> from linattn_theory.core.backend import BackendUnavailableError
    >>> issubclass(BackendUnavailableError, ConfigError)            # reported as an invalid setting (exit 2)
    True
    """


def gpu_available() -> bool:
    """``True`` when CuPy imports and sees at least one CUDA device.

    Returns
    -------
    bool
        Whether ``model.backend = "cupy"`` can run here.

    Examples
    --------
    >>> from linattn_theory.core.backend import gpu_available
    >>> isinstance(gpu_available(), bool)
    True
    """
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError, CUDARuntimeError (no driver), ...
        return False


def get_namespace(backend: str = "numpy"):
    """The Array API namespace of ``backend`` (``"numpy"``, ``"cupy"`` or ``"array_api_strict"``).

    ``numpy`` and ``cupy`` are wrapped by ``array_api_compat``; ``cupy`` needs CuPy and a
    CUDA GPU, and says how to install them (the ``[gpu]`` extra) when they are missing.

    Parameters
    ----------
    backend : {"numpy", "cupy", "array_api_strict"}, default "numpy"
        The array library (``model.backend`` of a config).

    Returns
    -------
    module
        The namespace: ``xp.asarray``, ``xp.matmul``, … of the Array API standard.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> xp = lt.get_namespace("numpy")
    >>> xp.matmul(xp.ones((2, 3)), xp.ones((3, 1))).tolist()
    [[3.0], [3.0]]
    """
    if backend == "numpy":
        import array_api_compat.numpy as xp
        return xp
    if backend == "cupy":
        try:
            import cupy
        except ImportError as err:
            raise BackendUnavailableError(
                f"backend = 'cupy': CuPy is not importable ({err}); {_GPU_HINT}, "
                f"or use backend = 'numpy'") from None
        try:
            devices = cupy.cuda.runtime.getDeviceCount()
        except Exception as err:  # CUDARuntimeError without a driver
            raise BackendUnavailableError(
                f"backend = 'cupy': CuPy found no usable CUDA device ({err}); "
                f"use backend = 'numpy' on machines without a GPU") from None
        if devices < 1:
            raise BackendUnavailableError("backend = 'cupy': CuPy sees no CUDA device; "
                                          "use backend = 'numpy' on machines without a GPU")
        import array_api_compat.cupy as xp
        return xp
    if backend == "array_api_strict":
        try:
            import array_api_strict as xp
        except ImportError:
            raise BackendUnavailableError(
                "backend = 'array_api_strict': the package is not installed; it comes with "
                "the test extra: pip install 'linattn-theory[test]'") from None
        return xp
    raise ConfigError(f"backend = {backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")


def client_chunks(num_clients: int, bytes_per_client: int, max_bytes: int | None):
    """Split ``range(num_clients)`` into consecutive chunks whose working set fits ``max_bytes``.

    Each chunk holds ``max(1, max_bytes // bytes_per_client)`` clients (at least one, so a
    budget below one client's working set still runs, one client at a time);
    ``max_bytes=None`` gives a single chunk. Returns a list of ``(start, stop)`` pairs.
    Clients train independently within a round, so chunking never changes a result.

    Parameters
    ----------
    num_clients : int
        Clients ``m``.
    bytes_per_client : int
        Working set of one client (:func:`client_working_bytes`).
    max_bytes : int or None
        The budget; ``None``: no bound.

    Returns
    -------
    list of tuple of int
        ``(start, stop)`` of each chunk, covering ``0..m`` in order.

    Examples
    --------
    >>> from linattn_theory.core.backend import client_chunks
    >>> client_chunks(5, bytes_per_client=100, max_bytes=250)
    [(0, 2), (2, 4), (4, 5)]
    >>> client_chunks(5, 100, None)
    [(0, 5)]
    """
    if max_bytes is None or num_clients == 0:
        return [(0, num_clients)]
    if max_bytes <= 0:
        raise ValueError(f"max_bytes = {max_bytes!r}: expected a positive number of bytes or None")
    size = max(1, int(max_bytes // max(1, int(bytes_per_client))))
    return [(lo, min(lo + size, num_clients)) for lo in range(0, num_clients, size)]


def resolve_max_bytes(max_bytes, data, heads: int, batch_size: int | None = None):
    """The chunk budget of a run on ``data``: ``max_bytes`` itself, or the policy ``"auto"``.

    ``"auto"``: on NumPy, all clients at once while their round working set fits twice
    :data:`CPU_CHUNK_BYTES` (it stays in cache anyway), else chunks of at most
    :data:`CPU_CHUNK_BYTES`, each of which keeps its data in cache for its ``E`` local steps;
    elsewhere (GPU) one chunk, the largest batches.

    Parameters
    ----------
    max_bytes : int, "auto" or None
        A budget in bytes, the policy, or no bound.
    data : StackedClients
        The clients.
    heads : int
        Heads ``H`` of the model.
    batch_size : int, optional
        Samples per local step; default all.

    Returns
    -------
    int or None
        The budget for :func:`client_chunks`.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import stack_clients
    >>> data = stack_clients([(np.ones((8, 4, 3)), np.ones((8, 3)), np.ones((8, 1)))])   # 8 samples, d = 3, p = 1
    >>> from linattn_theory.core.backend import resolve_max_bytes
    >>> resolve_max_bytes("auto", data, heads=1) is None, resolve_max_bytes(4096, data, heads=1)   # small: one chunk
    (True, 4096)
    """
    if not isinstance(max_bytes, str):
        return max_bytes
    if max_bytes != "auto":
        raise ValueError(f"max_bytes = {max_bytes!r}: expected a number of bytes, None or 'auto'")
    from array_api_compat import array_namespace, is_numpy_namespace
    if not is_numpy_namespace(array_namespace(data.S)):
        return None
    total = data.S.shape[0] * client_working_bytes(data, heads, batch_size)
    return None if total <= 2 * CPU_CHUNK_BYTES else CPU_CHUNK_BYTES


def itemsize(dtype) -> int:
    """Bytes per element of an array-library dtype (NumPy, CuPy, array-api-strict).

    Parameters
    ----------
    dtype : dtype
        The dtype.

    Returns
    -------
    int
        Its bytes per element.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.backend import itemsize
    >>> itemsize(np.float32), itemsize(np.float64)
    (4, 8)
    """
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 4 if "32" in str(dtype) else 8


def client_working_bytes(data, heads: int, batch_size: int | None = None) -> int:
    """Bytes one client adds to a round's working set (upper estimate).

    Per sample of a local step: its gathered ``Ŝ``, ``q``, ``y`` and weight (copied when
    only some clients take part or with minibatches) and the per-sample intermediates of
    :func:`~linattn_theory.core.model.loss_and_grad_from_moments` (``K^T q``, ``φ``, ``W_V e``,
    ``g`` of ``H·d`` numbers each, ``e`` twice). Softmax attention (docs/theory.md §9) adds the
    context ``X`` (``n·d``) and the scores, weights, ``X W_V e`` and ``J u`` (``H·n`` each).
    Used with :func:`client_chunks`.

    Parameters
    ----------
    data : StackedClients
        The clients.
    heads : int
        Heads ``H`` of the model.
    batch_size : int, optional
        Samples per local step; default all of a client's.

    Returns
    -------
    int
        Bytes.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import stack_clients
    >>> data = stack_clients([(np.ones((8, 4, 3)), np.ones((8, 3)), np.ones((8, 1)))])   # 8 samples, d = 3, p = 1
    >>> from linattn_theory.core.backend import client_working_bytes
    >>> client_working_bytes(data, heads=1)                  # 8 samples × (9 + 3 + 1 + 1 + 4·3 + 2) × 8 bytes
    1792
    >>> client_working_bytes(data, heads=1, batch_size=4)
    896
    """
    N = data.S.shape[1] if batch_size is None else batch_size
    d, p = data.S.shape[-1], data.y.shape[-1]
    per_sample = d * d + d + p + 1 + 4 * heads * d + 2 * p
    if getattr(data, "attention", "linear") == "softmax":
        n = data.X.shape[-2]
        per_sample += n * d + 4 * heads * n
    return itemsize(data.S.dtype) * N * per_sample
