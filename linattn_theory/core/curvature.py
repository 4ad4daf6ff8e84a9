"""The curvature of the clients' objectives: the value block's and the full model's (docs/theory.md §5).

``F_{λ,c}`` restricted to ``W_V`` at a fixed kernel is a quadratic with Hessian
``Ã_c = Σ_i w_i φ_i φ_iᵀ + λ I``, so local gradient descent on it is stable for
``η < 2 / λ_max(Ã_c)``; the full model's curvature ``λ_max(∇²F_{λ,c}(θ))`` is estimated by power
iteration. The simulator's divergence report and the theory's step-size checks use both.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .arrays import array_namespace, sq_norms, to_numpy
from .clients import StackedClients
from .model import BLOCKS, Params, flat as _flat, loss_and_grad_from_inputs

__all__ = ["value_curvature", "stable_learning_rate", "hessian_curvature", "model_curvature", "instance_digest",
           "MODEL_ITERATIONS", "MODEL_CURVATURE_MEMO"]


def value_curvature(K, data: StackedClients, ridge: float = 0.0):
    """``λ_max(Ã_c)`` per client, ``Ã_c = Σ_i w_i φ_i φ_i^T + λ I`` (docs/theory.md §5); host array ``(m,)``.

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Kernels.
    data : StackedClients
        The clients.
    ridge : float, default 0.0
        ``λ``.

    Returns
    -------
    numpy.ndarray, shape (m,)
        The largest eigenvalues.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.clients import stack_clients
    >>> rng = np.random.default_rng(0)
    >>> X, q, y = rng.normal(size=(8, 5, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 1))
    >>> data = stack_clients([(X, q, y)])                                # one client
    >>> from linattn_theory.core.curvature import value_curvature
    >>> K = rng.normal(size=(2, 3, 3))
    >>> phi = lt.features(K, lt.context_second_moment(X), q).reshape(8, -1)
    >>> bool(np.isclose(value_curvature(K, data)[0], np.linalg.eigvalsh(phi.T @ phi / 8)[-1]))   # Ã = E[φφ^T]
    True
    >>> bool(np.isclose(value_curvature(K, data, ridge=0.5)[0] - value_curvature(K, data)[0], 0.5))
    True
    """
    xp = array_namespace(data.S)
    phi = _flat(xp, data.features(K), 2)
    A = xp.matmul(xp.matrix_transpose(phi), phi * data.sample_weight[..., None])
    return np.linalg.eigvalsh(to_numpy(A))[:, -1] + ridge


def stable_learning_rate(K, data: StackedClients, ridge: float = 0.0) -> float:
    """The value block's stability limit ``2 / max_c λ_max(Ã_c)`` (docs/theory.md §5).

    Parameters
    ----------
    K : array, shape (H, d, d)
        The kernels (frozen, or the current ones).
    data : StackedClients
        The clients (:func:`~linattn_theory.core.clients.stack_clients`).
    ridge : float, default 0.0
        Ridge ``λ``.

    Returns
    -------
    float
        The largest client step size ``η`` for which every client's local value steps are stable.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> eta = lt.stable_learning_rate(clients.truth["kernel"], lt.stack_clients(clients))
    >>> bool(lt.contraction_rate(clients.truth["kernel"], clients, eta=0.9 * eta, E=1) < 1)
    True
    """
    return float(2.0 / np.max(value_curvature(K, data, ridge)))


def hessian_curvature(params, data: StackedClients, ridge: float = 0.0,
                      iterations: int = 50, seed: int = 0) -> np.ndarray:
    """``λ_max(∇²F_{λ,c}(θ))`` per client for the full model, by power iteration (host array ``(m,)``).

    Hessian-vector products are central differences of the closed-form gradients,
    ``Hv ≈ (∇F(θ + εv) − ∇F(θ − εv)) / 2ε``, ``ε = 10⁻⁵ max(1, max|θ|)``; all clients are iterated at
    once. ``params`` may also be a sequence of points ``θ``: then all points and clients are iterated
    at once and the result is ``(points, m)``, each row what ``θ`` alone gives, bit for bit; ``data``
    may then also be one data set per point (of equal shapes, attention and temperature: other
    instances), each row what its point on its data alone gives, bit for bit.

    Parameters
    ----------
    params : Params or sequence of Params
        The point(s) ``θ``.
    data : StackedClients or sequence of StackedClients
        The clients (or, with a sequence of points, the clients of each point).
    ridge : float, default 0.0
        ``λ``.
    iterations : int, default 50
        Power iterations.
    seed : int, default 0
        Seed of the starting vectors.

    Returns
    -------
    numpy.ndarray, shape (m,) or (points, m)
        The largest eigenvalues.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.clients import stack_clients
    >>> rng = np.random.default_rng(0)
    >>> X, q, y = rng.normal(size=(8, 5, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 1))
    >>> data = stack_clients([(X, q, y)])                                # one client
    >>> from linattn_theory.core.curvature import hessian_curvature, value_curvature
    >>> params, other = lt.Params.init(d=3, r=2, p=1, seed=0), lt.Params.init(d=3, r=2, p=1, seed=1)
    >>> full = hessian_curvature(params, data)
    >>> bool(full[0] >= 0.999 * value_curvature(lt.kernel(params), data)[0])   # Ã is a block of the Hessian
    True
    >>> bool(np.array_equal(hessian_curvature([params, other], data)[1], hessian_curvature(other, data)))
    True
    """
    single = isinstance(params, Params)
    points = [params] if single else list(params)
    datasets = [data] * len(points) if isinstance(data, StackedClients) else list(data)
    if len(datasets) != len(points):
        raise ValueError(f"{len(datasets)} data sets for {len(points)} points; expected one data set, or one per point")
    data = datasets[0]
    if any((d.inputs.shape, d.q.shape, d.y.shape, d.attention, d.temperature)
           != (data.inputs.shape, data.q.shape, data.y.shape, data.attention, data.temperature) for d in datasets):
        raise ValueError("the points' data sets differ in shape, attention or temperature; expected them equal")
    xp = array_namespace(data.S)
    m, count = data.S.shape[0], len(points)
    rng = np.random.default_rng(seed)

    def stacked_rows(name):              # the clients' rows of every point's data: (count·m, ...)
        arrays = [getattr(d, name) for d in datasets]
        return arrays[0] if count == 1 else xp.concat(arrays, axis=0)

    def tile(a):                         # ``a`` once per point: (count·m, ...)
        return a if count == 1 else xp.concat([a] * count, axis=0)

    stacked = Params(*(xp.concat([xp.broadcast_to(getattr(P, b), (m,) + tuple(getattr(P, b).shape))
                                  for P in points], axis=0) for b in BLOCKS))
    inputs, q, y, weight = (stacked_rows(name) for name in ("inputs", "q", "y", "sample_weight"))

    def grad(P):
        _, g = loss_and_grad_from_inputs(P, inputs, q, y, weight, attention=data.attention,
                                         temperature=data.temperature)
        return g.replace(WV=g.WV + ridge * P.WV)

    def norm(v):
        return xp.sqrt(sum(sq_norms(xp, getattr(v, b)) for b in BLOCKS))

    def rows(c, a):                      # a per-row factor c as a column that broadcasts against a
        return xp.reshape(c, (-1,) + (1,) * (a.ndim - 1))

    def scale(v, c):
        return v.map(lambda a: a * rows(c, a))

    v = Params(*(tile(xp.asarray(rng.normal(size=(m,) + tuple(getattr(points[0], b).shape)),
                                 dtype=getattr(stacked, b).dtype)) for b in BLOCKS))
    v = scale(v, 1.0 / norm(v))
    sizes = [max(float(to_numpy(xp.max(xp.abs(getattr(P, b))))) for b in BLOCKS) for P in points]
    eps = xp.asarray(np.repeat([1e-5 * max(size, 1.0) for size in sizes], m), dtype=data.S.dtype)
    estimate = xp.zeros((count * m,), dtype=data.S.dtype)
    for _ in range(iterations):
        plus = grad(stacked.map(lambda a, u: a + rows(eps, u) * u, v))
        minus = grad(stacked.map(lambda a, u: a - rows(eps, u) * u, v))
        hv = plus.map(lambda a, b: (a - b) / rows(2 * eps, a), minus)
        estimate = norm(hv)
        v = scale(hv, 1.0 / xp.maximum(estimate, xp.asarray(1e-300, dtype=estimate.dtype)))
    estimate = to_numpy(estimate)
    return estimate if single else estimate.reshape(count, m)


#: power-iteration steps of the full model's curvature (the step scale's ``step_curvature = "model"``)
MODEL_ITERATIONS = 200
#: the full model's curvatures remembered per process (:func:`model_curvature`), at most this many
MODEL_CURVATURE_MEMO = 4096

_MODEL_CURVATURE: dict = {}


def instance_digest(params, data, *numbers) -> str:
    """A digest of the bytes of ``θ⁰`` (``params``), of the stacked clients ``data`` (inputs, queries,
    targets, sample weights, attention, temperature) and of ``numbers``: equal exactly when every
    array (dtype, shape and each bit) and number is equal.

    Parameters
    ----------
    params : Params
        ``θ⁰``.
    data : StackedClients
        The stacked clients.
    *numbers
        Further settings (their ``repr`` is hashed).

    Returns
    -------
    str
        The hex digest.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.core.curvature import instance_digest
    >>> config = lt.config_from_dict({})
    >>> data, params = prepare_run(config)
    >>> instance_digest(params, data, 0.0) == instance_digest(*prepare_run(config)[::-1], 0.0)
    True
    >>> instance_digest(params, data, 0.0) == instance_digest(params.replace(WV=2 * params.WV), data, 0.0)
    False
    """
    digest = hashlib.blake2b(digest_size=20)
    for block in (params.WQ, params.WK, params.WV, data.inputs, data.q, data.y, data.sample_weight):
        array = np.ascontiguousarray(to_numpy(block))
        digest.update(repr((array.dtype.str, array.shape)).encode())
        digest.update(array.tobytes())
    digest.update(repr((data.attention, data.temperature, *numbers)).encode())
    return digest.hexdigest()


def model_curvature(params, data, ridge: float, curvature=None) -> float:
    """``max_c λ_max(∇²F_{λ,c}(θ⁰))`` by :func:`hessian_curvature` (:data:`MODEL_ITERATIONS` power
    iterations, docs/theory.md §5), computed once per instance and process: the runs of one instance
    (a cell's step scales, a ``T0`` grid, a tuned arm's candidates) share ``θ⁰`` and clients, so they
    share this number bit for bit (the power iteration is deterministic); remembered by
    :func:`instance_digest`.

    Parameters
    ----------
    params : Params
        ``θ⁰``.
    data : StackedClients
        The stacked clients.
    ridge : float
        ``λ``.
    curvature : callable, optional
        The power iteration (default :func:`hessian_curvature`, looked up when called).

    Returns
    -------
    float
        The largest curvature over the clients.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.curvature import hessian_curvature
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.core.curvature import model_curvature
    >>> data, params = prepare_run(lt.config_from_dict({}))
    >>> calls = []
    >>> def counted(*args, **kwargs):
    ...     calls.append(1)
    ...     return hessian_curvature(*args, **kwargs)
    >>> first = model_curvature(params, data, 0.0, counted)
    >>> first == model_curvature(params, data, 0.0, counted), len(calls)         # the second is remembered
    (True, 1)
    """
    curvature = hessian_curvature if curvature is None else curvature
    key = instance_digest(params, data, float(ridge), MODEL_ITERATIONS, getattr(curvature, "__module__", None),
                          getattr(curvature, "__qualname__", repr(curvature)))
    if key not in _MODEL_CURVATURE:
        if len(_MODEL_CURVATURE) >= MODEL_CURVATURE_MEMO:
            _MODEL_CURVATURE.clear()
        _MODEL_CURVATURE[key] = float(np.max(curvature(params, data, ridge, iterations=MODEL_ITERATIONS)))
    return _MODEL_CURVATURE[key]
