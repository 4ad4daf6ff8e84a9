"""Real data as client families: any arrays of contexts, queries and targets, and the ``digits`` family.

:func:`split_clients` turns one pool of samples ``(X, q, y)`` (with class labels) into ``m``
clients, non-IID in two ways (docs/theory.md §2, §9):

- **label skew**: for each class ``k`` the shares of the clients are a draw
  ``π_k ~ Dirichlet(α_label · 1_m)`` (small ``α_label``: each client sees few classes; Hsu, Qi &
  Brown 2019); absent, every class is spread evenly;
- **size skew**: client weights ``s ~ Dirichlet(α · 1_m)`` multiply those shares (absent: equal),
  as ``dirichlet_alpha`` does for the synthetic families.

Class ``k``'s training samples are dealt out in proportion to ``π_{k,c} s_c`` (every client first
gets two samples of its own, so none is empty). A held-out test split (``test_fraction`` of each
class) is kept in ``truth`` (``test_X``, ``test_q``, ``test_y``, ``test_labels``); with
``fresh_samples=True`` the clients are built from the test split with the same shares, the
population of each client for :func:`~linattn_theory.theory.profile.population_value_moments`.

:func:`digits_clients` applies this to scikit-learn's bundled handwritten digits (an optional
extra: ``pip install "linattn-theory[digits]"``; no download): each 8×8 image is a context of
``n = 8`` row tokens (8 pixels in ``[0, 1]``) with a one-hot positional code appended
(``d = 16``), the query is the fixed token ``1/√d`` (the layer learns ``K^T q``), the target the
one-hot label (``p = 10``, squared loss). :func:`evaluate` gives the test loss and accuracy.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.arrays import array_namespace, to_numpy
from ..core.model import (Params, attention_features, context_second_moment, flat, kernel,
                          value_matrix)
from ..core.clients import ClientDataset, FederatedDataset
from ..core.errors import ConfigError
from ..core.seeds import seed_sequence

__all__ = ["split_clients", "digits_clients", "digit_contexts", "evaluate", "evaluate_history", "max_clients",
           "check_task", "SEED_SPLIT", "DIGITS_CLASS_COUNTS"]

#: SeedSequence purpose of the test split and the client split (apart from the task purposes 0–5)
SEED_SPLIT = 201
DIGITS_EXTRA = 'pip install "linattn-theory[digits]"  (or: pip install scikit-learn)'
#: images of each class 0–9 in scikit-learn's digits (tests/test_datasets.py checks them against
#: ``load_digits``), so that a configuration is checked without importing scikit-learn
DIGITS_CLASS_COUNTS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)
#: training samples every client receives before the rest is dealt out (so that none is empty)
FIRST_SAMPLES = 2


def _held_out(n: int, test_fraction: float) -> int:
    """Samples of a class of ``n`` held out for testing: ``round(test_fraction · n)``."""
    return int(round(test_fraction * n))


def max_clients(test_fraction: float = 0.25, class_counts=DIGITS_CLASS_COUNTS) -> int:
    """The most clients a pool with ``class_counts`` can give :data:`FIRST_SAMPLES` training samples each.

    Parameters
    ----------
    test_fraction : float, default 0.25
        The share of each class held out.
    class_counts : sequence of int, default DIGITS_CLASS_COUNTS
        Samples per class of the pool.

    Returns
    -------
    int
        That many clients (a configuration of the ``digits`` family with more is refused).

    Examples
    --------
    >>> from linattn_theory.data.digits import max_clients
    >>> max_clients(0.0, class_counts=[4, 6]), max_clients(0.5, class_counts=[4, 6])   # (10 // 2, (2 + 3) // 2)
    (5, 2)
    """
    return sum(n - _held_out(n, test_fraction) for n in class_counts) // FIRST_SAMPLES


def _check_positive(name, value):
    if value is not None and (not np.isfinite(value) or value <= 0):
        raise ValueError(f"{name} = {value!r}; expected a number > 0 or None")


def _test_split(labels, test_fraction, rng):
    """Indices ``(train, test)``: ``round(test_fraction · N_k)`` of each class held out."""
    train, test = [], []
    for k in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == k))
        cut = _held_out(len(idx), test_fraction)
        test.append(idx[:cut])
        train.append(idx[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _shares(classes, num_clients, label_alpha, dirichlet_alpha, rng):
    """``(K, m)`` shares of each class over the clients: ``π_{k,c} s_c`` normalised per class."""
    size = np.ones(num_clients) if dirichlet_alpha is None else rng.gamma(dirichlet_alpha, size=num_clients)
    if label_alpha is None:
        pi = np.ones((len(classes), num_clients))
    else:
        pi = rng.gamma(label_alpha, size=(len(classes), num_clients))
    shares = pi * size + 1e-300
    return shares / shares.sum(axis=1, keepdims=True)


def _deal(indices, labels, classes, shares, rng, first: int = FIRST_SAMPLES):
    """Client index lists: ``first`` samples each, then each class's rest in proportion to its shares."""
    m = shares.shape[1]
    pool = rng.permutation(indices)
    if len(pool) < first * m:
        raise ValueError(f"{len(pool)} samples cannot give {m} clients {first} samples each; "
                         f"use fewer clients")
    clients = [list(pool[first * c:first * (c + 1)]) for c in range(m)]
    rest = pool[first * m:]
    for k, share in zip(classes, shares):
        idx = rest[labels[rest] == k]
        cuts = np.round(np.cumsum(share)[:-1] * len(idx)).astype(int)
        for c, part in enumerate(np.split(idx, cuts)):
            clients[c].extend(part)
    return [np.sort(np.asarray(c, dtype=np.int64)) for c in clients]


def split_clients(X, q, y, labels, num_clients: int = 8, label_alpha: float | None = None,
                  dirichlet_alpha: float | None = None, test_fraction: float = 0.25, seed: int = 0,
                  fresh_samples: bool = False, family: str = "custom") -> FederatedDataset:
    """Split a pool ``X`` ``(N, n, d)``, ``q`` ``(N, d)``, ``y`` ``(N, p)`` with class ``labels`` ``(N,)`` into clients.

    Label skew ``label_alpha`` and size skew ``dirichlet_alpha`` as in the module docstring; a
    held-out test split of ``test_fraction`` per class goes to ``truth``. Client weights are
    ``p_c = N_c / Σ N_c``. ``fresh_samples=True`` splits the test samples instead (same shares).

    Parameters
    ----------
    X : array_like, shape (N, n, d)
        Contexts.
    q : array_like, shape (N, d)
        Queries.
    y : array_like, shape (N, p)
        Targets.
    labels : array_like, shape (N,)
        Class of each sample (what the label skew and the test split are by).
    num_clients : int, default 8
        Number of clients ``m``.
    label_alpha : float, optional
        Label skew: each class's shares over the clients are ``Dirichlet(α_label · 1_m)`` (small:
        each client sees few classes); default every class spread evenly.
    dirichlet_alpha : float, optional
        Size skew: client weights ``Dirichlet(α · 1_m)`` multiply those shares; default equal.
    test_fraction : float, default 0.25
        Share of each class held out as a test split (in ``truth``).
    seed : int, default 0
        Seed of the test split and of the shares.
    fresh_samples : bool, default False
        Build the clients from the test split, with the same shares (each client's population,
        for :func:`~linattn_theory.theory.profile.population_value_moments`).
    family : str, default "custom"
        The family name the dataset records.

    Returns
    -------
    FederatedDataset
        The clients (every one with at least two training samples), weights ``p_c`` and
        ``truth`` with the test split (``test_X``, ``test_q``, ``test_y``, ``test_labels``).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> X, q = rng.normal(size=(200, 4, 3)), rng.normal(size=(200, 3))
    >>> labels = np.arange(200) % 5
    >>> clients = lt.split_clients(X, q, np.eye(5)[labels], labels, num_clients=4, label_alpha=0.5)
    >>> len(clients.clients), sum(len(c.X) for c in clients.clients), len(clients.truth["test_y"])
    (4, 150, 50)
    """
    X, q, y, labels = (np.asarray(a) for a in (X, q, y, labels))
    N = X.shape[0]
    if X.ndim != 3 or q.shape != (N, X.shape[2]) or y.ndim != 2 or y.shape[0] != N or labels.shape != (N,):
        raise ValueError(f"shapes X{X.shape}, q{q.shape}, y{y.shape}, labels{labels.shape}; expected "
                         f"X (N, n, d), q (N, d), y (N, p), labels (N,)")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients = {num_clients!r}; expected an integer >= 1")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction = {test_fraction!r}; expected a number in (0, 1)")
    _check_positive("label_alpha", label_alpha)
    _check_positive("dirichlet_alpha", dirichlet_alpha)
    rng = np.random.default_rng(seed_sequence(seed, SEED_SPLIT))
    train, test = _test_split(labels, test_fraction, rng)
    classes = np.unique(labels)
    shares = _shares(classes, num_clients, label_alpha, dirichlet_alpha, rng)
    parts = _deal(train, labels, classes, shares, rng)
    counts = np.array([[np.sum(labels[i] == k) for k in classes] for i in parts])
    if fresh_samples:            # after the training split, which therefore stays the same
        parts = _deal(test, labels, classes, shares, rng)
    clients = tuple(ClientDataset(X[i], q[i], y[i]) for i in parts)
    sizes = np.array([len(i) for i in parts], dtype=float)
    truth = {"test_X": X[test], "test_q": q[test], "test_y": y[test], "test_labels": labels[test],
             "class_shares": shares, "classes": classes, "label_counts": counts}
    return FederatedDataset(clients, sizes / sizes.sum(), family, truth)


def digit_contexts(images):
    """8×8 images (values 0..16) → contexts ``(N, 8, 16)``: each row's pixels in ``[0, 1]`` and a one-hot row code.

    Parameters
    ----------
    images : array_like, shape (N, 8, 8)
        Grey levels 0..16 (scikit-learn's ``load_digits().images``).

    Returns
    -------
    numpy.ndarray, shape (N, 8, 16)
        The contexts.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.data.digits import digit_contexts
    >>> X = digit_contexts(np.full((1, 8, 8), 16.0))
    >>> X.shape, X[0, 2].tolist()
    ((1, 8, 16), [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    """
    images = np.asarray(images, dtype=np.float64) / 16.0
    N, rows, cols = images.shape
    position = np.broadcast_to(np.eye(rows), (N, rows, rows))
    return np.concatenate([images, position], axis=-1)


@functools.cache
def _digit_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The contexts (:func:`digit_contexts`) and labels of scikit-learn's digits, read once per process
    (a sweep builds its clients many times; read-only arrays)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    X, labels = digit_contexts(data.images), np.array(data.target)
    X.flags.writeable = labels.flags.writeable = False
    return X, labels


def digits_clients(num_clients: int = 8, label_alpha: float | None = None,
                   dirichlet_alpha: float | None = None, test_fraction: float = 0.25, seed: int = 0,
                   fresh_samples: bool = False) -> FederatedDataset:
    """scikit-learn's handwritten digits (1,797 images) as a client family (docs/theory.md §9).

    Contexts of 8 row tokens plus a positional code (``n = 8``, ``d = 16``), the fixed query
    ``1/√d``, one-hot targets (``p = 10``); clients by :func:`split_clients`. Needs scikit-learn
    (the ``[digits]`` extra); nothing is downloaded.

    Parameters
    ----------
    num_clients, label_alpha, dirichlet_alpha, test_fraction, seed, fresh_samples
        The split into clients, as in :func:`split_clients` (defaults: 8 clients, no label or
        size skew, a quarter of each class held out, seed 0).

    Returns
    -------
    FederatedDataset
        As :func:`split_clients`, family ``"digits"``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.digits_clients(num_clients=4, label_alpha=0.1, seed=0)
    >>> clients.clients[0].X.shape[1:], clients.clients[0].y.shape[1]
    ((8, 16), 10)
    """
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        raise ImportError(f"task family 'digits' needs scikit-learn, an optional extra: {DIGITS_EXTRA}") from None
    X, labels = _digit_arrays()
    q = np.full((X.shape[0], X.shape[2]), 1.0 / np.sqrt(X.shape[2]))
    y = np.eye(10)[labels]
    return split_clients(X, q, y, labels, num_clients, label_alpha, dirichlet_alpha, test_fraction,
                         seed, fresh_samples, family="digits")


def check_task(task) -> None:
    """Refuse a ``[task]`` of the digits family with more clients than its training images allow
    (:func:`max_clients`), a :class:`~linattn_theory.core.errors.ConfigError` before any work.

    Parameters
    ----------
    task : TaskConfig
        The validated ``[task]`` section.

    Returns
    -------
    None

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.digits import check_task
    >>> check_task(lt.config_from_dict({"task": {"family": "digits", "num_clients": 4}}).task)
    """
    most = max_clients(task.test_fraction)
    if task.num_clients > most:
        raise ConfigError(f"task.num_clients = {task.num_clients}: expected a value <= {most} for "
                          f"family 'digits' (its training images at task.test_fraction = "
                          f"{task.test_fraction:g}, two or more per client)")


digits_clients.check = check_task      # the family's own config check (data.families.family_check)


def evaluate(params: Params, X, q, y, attention: str = "linear", temperature: float = 1.0) -> dict:
    """Mean loss ``½‖ŷ − y‖²`` and accuracy (``argmax ŷ = argmax y``) on samples ``(X, q, y)``.

    Parameters
    ----------
    params : Params
        The trained layer.
    X : array_like, shape (N, n, d)
        Contexts.
    q : array_like, shape (N, d)
        Queries.
    y : array_like, shape (N, p)
        One-hot targets.
    attention : {"linear", "softmax"}, default "linear"
        The attention.
    temperature : float, default 1.0
        Softmax temperature ``τ``.

    Returns
    -------
    dict
        ``{"loss": float, "accuracy": float}``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.digits import evaluate
    >>> clients = lt.digits_clients(num_clients=4)
    >>> test = clients.truth
    >>> scores = evaluate(lt.Params.init(d=16, r=4, p=10), test["test_X"], test["test_q"], test["test_y"])
    >>> sorted(scores), 0 <= scores["accuracy"] <= 1
    (['accuracy', 'loss'], True)
    """
    return evaluate_history([params], X, q, y, attention, temperature)[0]


def evaluate_history(history, X, q, y, attention: str = "linear", temperature: float = 1.0,
                     chunk: int = 64) -> list[dict]:
    """:func:`evaluate` of every parameter set of ``history`` (a run's ``θ^0, θ^1, …``, or several runs'):
    the test features ``φ(K)`` once per distinct kernel ``(W_Q, W_K)``, ``chunk`` kernels at a time
    (a frozen stage's rounds share one, and runs that share a warm-up share its rounds'), the test
    contexts' ``Ŝ`` once per call, then ``chunk`` predictions ``ŷ = φ(K) W_V`` at a time: each
    parameter set's numbers are those of computing its features alone (each product is its own; test).

    Parameters
    ----------
    history : sequence of Params
        The parameter sets (equal shapes).
    X, q, y, attention, temperature
        As in :func:`evaluate`.
    chunk : int, default 64
        Kernels per feature computation and parameter sets per prediction (bounds the memory to
        ``2 · chunk · N · H d`` numbers).

    Returns
    -------
    list of dict
        ``{"loss": float, "accuracy": float}`` per parameter set.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.digits import evaluate, evaluate_history
    >>> test = lt.digits_clients(num_clients=4).truth
    >>> thetas = [lt.Params.init(d=16, r=4, p=10, seed=s) for s in range(3)]
    >>> scores = evaluate_history(thetas, test["test_X"], test["test_q"], test["test_y"])
    >>> one = evaluate(thetas[2], test["test_X"], test["test_q"], test["test_y"])
    >>> len(scores), bool(np.isclose(scores[2]["loss"], one["loss"], rtol=1e-12))
    (3, True)
    """
    history = list(history)
    if not history:
        return []
    xp = array_namespace(history[0].WV)
    X, q, y = (xp.asarray(a, dtype=history[0].WV.dtype) for a in (X, q, y))
    y = to_numpy(y)
    labels = np.argmax(y, axis=-1)
    inputs = X if attention == "softmax" else context_second_moment(X)
    firsts, which = _distinct_kernels(history)
    scores: list = [None] * len(history)
    for start in range(0, len(firsts), chunk):
        count = len(firsts[start:start + chunk])
        stacked = _stacked(xp, [history[i] for i in firsts[start:start + chunk]])
        phi = flat(xp, attention_features(kernel(stacked), inputs[None], q[None], attention, temperature), 2)
        members = np.flatnonzero((which >= start) & (which < start + count))
        for lo in range(0, len(members), chunk):
            part = members[lo:lo + chunk]
            own = xp.take(phi, xp.asarray(which[part] - start), axis=0)                 # (chunk, N, Hd)
            V = value_matrix(xp, _stacked(xp, [history[i] for i in part]).WV)
            yhat = to_numpy(xp.matmul(own, V))                                          # (chunk, N, p)
            loss = np.mean(0.5 * np.sum((yhat - y) ** 2, axis=-1), axis=-1)
            accuracy = np.mean(np.argmax(yhat, axis=-1) == labels, axis=-1)
            for i, a, b in zip(part, loss, accuracy):
                scores[i] = {"loss": float(a), "accuracy": float(b)}
    return scores


def _distinct_kernels(history) -> tuple[list[int], np.ndarray]:
    """``(firsts, which)``: the first parameter set of each distinct ``(W_Q, W_K)`` of ``history``, in
    order, and the index into ``firsts`` of every parameter set's (equal bytes: the same kernel)."""
    slots: dict = {}
    firsts, which = [], np.empty(len(history), dtype=np.int64)
    for i, theta in enumerate(history):
        key = (to_numpy(theta.WQ).tobytes(), to_numpy(theta.WK).tobytes())
        if key not in slots:
            slots[key] = len(firsts)
            firsts.append(i)
        which[i] = slots[key]
    return firsts, which


def _stacked(xp, thetas) -> Params:
    """Parameter sets stacked on a new leading axis."""
    return Params(*(xp.stack([getattr(theta, b) for theta in thetas]) for b in ("WQ", "WK", "WV")))
