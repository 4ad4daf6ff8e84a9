"""Client data: one client's samples, a federated data set with client weights ``p_c``, and the
stacked, padded sufficient form every computation reads (docs/theory.md §1–2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .model import ATTENTIONS, attention_features, context_second_moment

__all__ = ["ClientDataset", "FederatedDataset", "StackedClients", "as_federated", "check_clients",
           "stack_clients"]


class ClientDataset(NamedTuple):
    """One client's samples: contexts ``X`` ``(N, n, d)``, queries ``q`` ``(N, d)``, targets ``y`` ``(N, p)``.

    Parameters
    ----------
    X : numpy.ndarray, shape (N, n, d)
        Contexts of ``n`` tokens.
    q : numpy.ndarray, shape (N, d)
        Queries.
    y : numpy.ndarray, shape (N, p)
        Targets.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> X, q, y = clients[0]                  # a client unpacks as (X, q, y)
    >>> X.shape, q.shape, y.shape
    ((64, 8, 4), (64, 4), (64, 2))
    """

    X: np.ndarray
    q: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class FederatedDataset(Sequence):
    """``m`` client datasets with weights ``p_c = N_c / Σ N_c``; iterates as ``(X, q, y)`` tuples.

    ``truth`` holds what generated the data (teacher kernels, value maps, …) for analysis.

    Parameters
    ----------
    clients : tuple of ClientDataset
        The ``m`` clients' samples (the same ``n``, ``d``, ``p``; any sizes ``N_c``).
    weights : numpy.ndarray, shape (m,)
        Client weights ``p_c`` (summing to 1).
    family : str, default "custom"
        The task family that made them.
    truth : dict, optional
        What generated the data.

    Examples
    --------
    Your own data, two clients of 40 and 60 samples:

    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> own = [lt.ClientDataset(rng.normal(size=(N, 8, 4)), rng.normal(size=(N, 4)), rng.normal(size=(N, 1)))
    ...        for N in (40, 60)]
    >>> clients = lt.FederatedDataset(tuple(own), np.array([0.4, 0.6]))
    >>> len(clients), clients.dims, clients.sizes.tolist()
    (2, (8, 4, 1), [40, 60])
    >>> config = lt.config_from_dict({"task": {"dim": 4, "tokens": 8, "outputs": 1},
    ...                               "federated": {"rounds": 3, "warmup_rounds": 1}})
    >>> len(lt.simulate(config, clients).table)
    4
    """

    clients: tuple[ClientDataset, ...]
    weights: np.ndarray
    family: str = "custom"
    truth: dict = field(default_factory=dict)

    def __getitem__(self, c):
        return self.clients[c]

    def __len__(self) -> int:
        return len(self.clients)

    @property
    def sizes(self) -> np.ndarray:
        return np.array([c.X.shape[0] for c in self.clients])

    @property
    def dims(self) -> tuple[int, int, int]:
        """``(n, d, p)``: tokens per context, token dimension, output dimension."""
        X, _, y = self.clients[0]
        return X.shape[1], X.shape[2], y.shape[1]


def as_federated(clients) -> FederatedDataset:
    """Accept a :class:`FederatedDataset` or a plain sequence of ``(X, q, y)`` tuples (``p_c ∝ N_c``).

    A tuple's arrays must have the shapes ``X (N, n, d)``, ``q (N, d)``, ``y (N, p)`` with the
    first client's ``n, d, p``; otherwise a ``ValueError`` names the client and the array.

    Parameters
    ----------
    clients : FederatedDataset or sequence of (X, q, y)
        The clients.

    Returns
    -------
    FederatedDataset
        ``clients`` itself, or the tuples with weights ``p_c = N_c / Σ N_c``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import as_federated
    >>> pairs = [(np.ones((N, 3, 2)), np.ones((N, 2)), np.ones((N, 1))) for N in (1, 3)]
    >>> as_federated(pairs).weights.tolist()
    [0.25, 0.75]
    """
    if isinstance(clients, FederatedDataset):
        return clients
    items = []
    for c, client in enumerate(clients):
        arrays = tuple(client)
        if len(arrays) != 3:
            raise ValueError(f"client {c}: {len(arrays)} arrays; expected a tuple (X, q, y)")
        items.append(ClientDataset(*(np.asarray(a) for a in arrays)))
    if not items:
        raise ValueError("clients is empty; expected at least one (X, q, y) tuple")
    _check_shapes(items)
    sizes = np.array([c.X.shape[0] for c in items], dtype=float)
    return FederatedDataset(tuple(items), sizes / sizes.sum())


def _shape_problem(X, q, y, dims) -> str | None:
    """Why ``X (N, n, d)``, ``q (N, d)``, ``y (N, p)`` do not fit (``dims = (n, d, p)``, ``None``:
    any), else ``None``."""
    if X.ndim != 3:
        hint = (": a sample's context is a sequence of tokens; for one token per sample use "
                "X[:, None, :]" if X.ndim == 2 else "")
        return f"X has shape {X.shape}; expected (N, n, d): N contexts of n tokens of dimension d{hint}"
    N, n, d = X.shape
    if N < 1:
        return f"X has shape {X.shape}; expected at least one sample"
    if dims is not None and (n, d) != dims[:2]:
        return f"X has shape {X.shape}; expected (N, {dims[0]}, {dims[1]}) as the first client's"
    if q.shape != (N, d):
        return f"q has shape {q.shape}; expected (N, d) = ({N}, {d}), one query token per context of X"
    p = dims[2] if dims is not None else (y.shape[1] if y.ndim == 2 else None)
    if y.ndim != 2 or y.shape != (N, p):
        return f"y has shape {y.shape}; expected (N, p) = ({N}, {p if p is not None else 'p'}), one target per context"
    return None


def _check_shapes(items) -> None:
    dims = None
    for c, (X, q, y) in enumerate(items):
        problem = _shape_problem(X, q, y, dims)
        if problem:
            raise ValueError(f"client {c}: {problem}")
        dims = dims or (X.shape[1], X.shape[2], y.shape[1])


def _value_problem(name: str, a: np.ndarray) -> str | None:
    """Why array ``name`` does not hold finite real numbers (its first bad entry), else ``None``."""
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        return f"{name} has dtype {a.dtype}; expected real numbers"
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"{name}[{', '.join(map(str, first))}] = {a[first]}"
    return (f"{name} holds {int(bad.sum())} non-finite value{'s' if bad.sum() > 1 else ''} (the first: {where}); "
            f"expected finite numbers: drop or impute those samples")


def check_clients(clients) -> FederatedDataset:
    """The clients as :func:`as_federated` reads them, checked before any round.

    Every client's ``X (N, n, d)``, ``q (N, d)``, ``y (N, p)`` (docs/theory.md §1–2) have the
    first client's ``n, d, p`` and ``N ≥ 1``, and hold finite real numbers; the weights ``p_c``
    are finite, ``≥ 0`` and not all 0. Raises ``ValueError`` naming the client and the array
    (a NaN in the data would otherwise surface as a diverged run blaming the step size).

    Parameters
    ----------
    clients : FederatedDataset or sequence of (X, q, y)
        The clients.

    Returns
    -------
    FederatedDataset
        The clients (:func:`as_federated`), checked.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import check_clients
    >>> pairs = [(np.ones((4, 3, 2)), np.ones((4, 2)), np.ones((4, 1))) for _ in range(2)]
    >>> len(check_clients(pairs))
    2
    >>> check_clients([pairs[0], (np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 1)))])
    Traceback (most recent call last):
    ...
    ValueError: client 1: ...
    """
    data = as_federated(clients)
    _check_shapes(data.clients)
    for c, client in enumerate(data.clients):
        for name, a in zip(("X", "q", "y"), client):
            problem = _value_problem(name, np.asarray(a))
            if problem:
                raise ValueError(f"client {c}: {problem}")
    weights = np.asarray(data.weights)
    problem = _value_problem("weights", weights)
    if problem is None and (weights.shape != (len(data),) or (weights < 0).any() or not weights.sum() > 0):
        problem = f"weights = {weights}; expected {len(data)} numbers p_c >= 0, not all 0"
    if problem:
        raise ValueError(f"clients: {problem}")
    return data


@dataclass(frozen=True)
class StackedClients:
    """All clients padded to a common ``N`` (padding has weight 0), in the sufficient form.

    ``S`` ``(m, N, d, d)`` holds ``Ŝ`` per sample, ``q`` ``(m, N, d)``, ``y`` ``(m, N, p)``,
    ``sample_weight`` ``(m, N)`` (``1/N_c`` on real samples, 0 on padding), ``weights`` ``(m,)``
    the client weights ``p_c`` and ``sizes`` ``(m,)`` the ``N_c`` (host array).

    ``attention`` says which layer reads the data (docs/theory.md §9): softmax attention needs
    the contexts themselves, ``X`` ``(m, N, n, d)`` (kept only then; ``None`` for linear
    attention), with scores divided by ``temperature``. ``inputs`` is what the model reads:
    ``Ŝ`` (linear) or ``X`` (softmax).

    Parameters
    ----------
    S : array, shape (m, N, d, d)
        ``Ŝ`` of every (padded) sample.
    q : array, shape (m, N, d)
        Queries.
    y : array, shape (m, N, p)
        Targets.
    sample_weight : array, shape (m, N)
        ``1/N_c`` on a client's samples, 0 on padding.
    weights : array, shape (m,)
        Client weights ``p_c``.
    sizes : numpy.ndarray, shape (m,)
        ``N_c`` (host).
    X : array, shape (m, N, n, d), optional
        Contexts (softmax attention only).
    attention : {"linear", "softmax"}, default "linear"
        The layer that reads the data.
    temperature : float, default 1.0
        Softmax temperature.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core.clients import StackedClients, stack_clients
    >>> data = stack_clients([(np.ones((2, 4, 3)), np.ones((2, 3)), np.ones((2, 1))),      # N_c = 2 and 3
    ...                       (np.ones((3, 4, 3)), np.ones((3, 3)), np.ones((3, 1)))])
    >>> isinstance(data, StackedClients), data.S.shape, data.sizes.tolist()
    (True, (2, 3, 3, 3), [2, 3])
    >>> data.sample_weight[0].tolist(), data.X is None                   # 1/N_c, then padding; linear attention
    ([0.5, 0.5, 0.0], True)
    """

    S: object
    q: object
    y: object
    sample_weight: object
    weights: object
    sizes: np.ndarray
    X: object = None
    attention: str = "linear"
    temperature: float = 1.0

    @property
    def inputs(self):
        """``Ŝ`` for linear attention, ``X`` for softmax attention."""
        return self.X if self.attention == "softmax" else self.S

    def features(self, K):
        """``φ_h`` of kernels ``K`` ``(..., H, d, d)`` on every sample, shape ``(m, N, H, d)``."""
        return attention_features(K, self.inputs, self.q, self.attention, self.temperature)


def stack_clients(clients, xp=None, dtype=np.float64, attention: str = "linear",
                  temperature: float = 1.0) -> StackedClients:
    """Pad and stack clients into :class:`StackedClients` in namespace ``xp`` (default NumPy).

    ``attention = "softmax"`` also keeps the padded contexts ``X`` (docs/theory.md §9).

    Parameters
    ----------
    clients : FederatedDataset or sequence of (X, q, y)
        The clients (a plain sequence gets weights ``p_c ∝ N_c``).
    xp : module, optional
        Array API namespace (:func:`~linattn_theory.core.backend.get_namespace`); default NumPy.
    dtype : dtype, default numpy.float64
        Floating-point type of the arrays.
    attention : {"linear", "softmax"}, default "linear"
        The layer that reads the data.
    temperature : float, default 1.0
        Softmax temperature ``τ > 0``.

    Returns
    -------
    StackedClients
        The padded arrays: ``S`` ``(m, N, d, d)``, ``q``, ``y``, ``sample_weight``, ``weights``, ``sizes``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=20, tokens=4, dim=3,
    ...                                     dirichlet_alpha=1.0)
    >>> data = lt.stack_clients(clients)
    >>> data.S.shape[0], data.S.shape[1] == int(max(data.sizes)), data.sample_weight.sum(axis=1).round(12).tolist()
    (3, True, [1.0, 1.0, 1.0])
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention = {attention!r}; expected one of {', '.join(map(repr, ATTENTIONS))}")
    if not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature = {temperature!r}; expected a finite number > 0")
    data = as_federated(clients)
    m = len(data)
    n, d, p = data.dims
    Nmax = int(data.sizes.max())
    S = np.zeros((m, Nmax, d, d), dtype=dtype)
    q = np.zeros((m, Nmax, d), dtype=dtype)
    y = np.zeros((m, Nmax, p), dtype=dtype)
    w = np.zeros((m, Nmax), dtype=dtype)
    for c, (Xc, qc, yc) in enumerate(data):
        N = Xc.shape[0]
        S[c, :N] = context_second_moment(np.asarray(Xc, dtype=np.float64))
        q[c, :N], y[c, :N], w[c, :N] = qc, yc, 1.0 / N
    weights = np.asarray(data.weights, dtype=dtype)
    X = None
    if attention == "softmax":
        n = data.dims[0]
        X = np.zeros((m, Nmax, n, d), dtype=dtype)
        for c, (Xc, _, _) in enumerate(data):
            X[c, :Xc.shape[0]] = Xc
    if xp is not None and xp is not np:
        S, q, y, w, weights = (xp.asarray(a) for a in (S, q, y, w, weights))
        X = None if X is None else xp.asarray(X)
    return StackedClients(S, q, y, w, weights, data.sizes, X, attention, float(temperature))
