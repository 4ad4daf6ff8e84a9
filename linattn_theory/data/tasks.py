"""Heterogeneous clients: the planted-kernel and in-context-regression families (docs/theory.md §2).

Every random draw comes from a ``numpy.random.SeedSequence`` keyed by purpose and client
(``spawn_key=(purpose, client)``), so client ``c``'s data do not depend on how many other
clients exist or in which order they are built. (Only the Dirichlet size split depends on
``m``, through the normalisation; the first ``k`` samples of a client never do.)
"""

from __future__ import annotations

import numpy as np

from ..core.clients import ClientDataset, FederatedDataset
from ..core.model import flat, context_second_moment, features
from ..core.seeds import SEED_CLIENT, SEED_EVAL, SEED_TEACHER, seed_sequence


__all__ = ["planted_kernel_clients", "in_context_regression_clients", "client_sizes", "sample_stream"]


#: a Gamma(α) draw below this is redrawn from its lower tail in log space (no underflow)
_GAMMA_TINY = 1e-250


def _log_gamma(rng, alpha: float) -> float:
    """``log G`` of a draw ``G ~ Gamma(α)``, exact for every ``α > 0``.

    Small ``α`` puts most of the mass below the smallest float: a draw below ``c = 1e-250``
    is replaced by one from the law of ``G`` given ``G ≤ c``, which is ``c·U^{1/α}`` (the
    density is ``∝ x^{α−1}e^{−x}`` and ``e^{−x} = 1`` to 250 digits there), taken in logs.
    """
    g = rng.gamma(alpha)
    if g > _GAMMA_TINY:
        return float(np.log(g))
    return float(np.log(_GAMMA_TINY) + np.log1p(-rng.random()) / alpha)


def client_sizes(num_clients, samples_per_client, dirichlet_alpha, rngs, fresh=False):
    """Equal sizes, or sizes following Dirichlet(α) proportions with at least one sample each.

    The proportions ``π ~ Dirichlet(α)`` come from per-client Gamma(α) draws in log space
    (exact for every α, :func:`_log_gamma`); client ``c`` gets ``1 + ⌊π_c R⌋`` samples plus one
    more for the largest remainders, ``R = m(N − 1)``, so the total stays ``m·N``.
    ``fresh=True`` (evaluation samples) still makes the Gamma draws, so that every client's
    distribution is the training one, but gives every client ``samples_per_client`` samples.

    Parameters
    ----------
    num_clients : int
        ``m``.
    samples_per_client : int
        ``N``, the mean size.
    dirichlet_alpha : float or None
        ``α`` (``None``: equal sizes).
    rngs : sequence of numpy.random.Generator
        One stream per client.
    fresh : bool, default False
        Evaluation samples: ``N`` each.

    Returns
    -------
    list of int
        ``N_c``, summing to ``m·N``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.data.tasks import client_sizes
    >>> rngs = [np.random.default_rng(c) for c in range(4)]
    >>> client_sizes(4, 10, None, rngs), sum(client_sizes(4, 10, 0.5, rngs))
    ([10, 10, 10, 10], 40)
    """
    if dirichlet_alpha is None:
        return [samples_per_client] * num_clients
    log_g = np.array([_log_gamma(rng, dirichlet_alpha) for rng in rngs])
    if fresh:
        return [samples_per_client] * num_clients
    shares = np.exp(log_g - log_g.max())
    shares /= shares.sum()
    spare = num_clients * (samples_per_client - 1)
    raw = spare * shares
    sizes = np.floor(raw).astype(np.int64)
    left = spare - int(sizes.sum())
    sizes[np.argsort(-(raw - sizes), kind="stable")[:left]] += 1
    return [int(1 + s) for s in sizes]


def sample_stream(client_rng, seed, client, fresh):
    """Where client ``c``'s samples come from: its own stream ``client_rng`` (training) or, with
    ``fresh=True``, the evaluation stream ``(SEED_EVAL, c)``: new samples of the same client
    distribution, drawn after everything that defines the client came from ``client_rng``.

    Parameters
    ----------
    client_rng : numpy.random.Generator
        The client's own stream.
    seed : int
        The run's seed.
    client : int
        ``c``.
    fresh : bool
        Evaluation samples.

    Returns
    -------
    numpy.random.Generator
        ``client_rng``, or the evaluation stream.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.data.tasks import sample_stream
    >>> rng = np.random.default_rng(0)
    >>> sample_stream(rng, 0, 0, fresh=False) is rng, sample_stream(rng, 0, 0, fresh=True) is rng
    (True, False)
    """
    return np.random.default_rng(seed_sequence(seed, SEED_EVAL, client)) if fresh else client_rng


def _positional_means(n, d, strength, rng):
    """Position-dependent token means ``strength · P_i`` (rows of a fixed random matrix)."""
    if strength == 0:
        return np.zeros((n, d))
    return strength * rng.normal(size=(n, d))


def planted_kernel_clients(num_clients=8, samples_per_client=256, tokens=16, dim=8, heads=1,
                           rank=4, outputs=2, zeta_value=0.5, zeta_covariate=0.5, zeta_mean=0.0,
                           noise=0.1, dirichlet_alpha=None, query="last",
                           positional_strength=0.0, seed=0, fresh_samples=False) -> FederatedDataset:
    """Planted-kernel family (docs/theory.md §2).

    Teacher kernels ``K*_h = W_Q* (W_K*)^T`` (entries of the factors ``N(0, 1/d)``), shared by all
    clients; value maps ``V*_c = V̄ + ζ_V Δ_c``; tokens ``x ~ N(μ_c, Σ_c)`` with
    ``Σ_c = diag(exp(ζ_X ε_c))`` and ``μ_c = ζ_μ ν_c`` (plus a position-dependent mean when
    ``positional_strength > 0``); the query is the last token (``query="last"``) or a fresh
    token (``"fresh"``); ``y = Σ_h (V*_{c,h})^T Ŝ K*_h^T q + σ ξ``.

    Parameters
    ----------
    num_clients : int, default 8
        Number of clients ``m``.
    samples_per_client : int, default 256
        Samples ``N`` per client (the mean size when ``dirichlet_alpha`` is set).
    tokens : int, default 16
        Context length ``n``.
    dim : int, default 8
        Token dimension ``d``.
    heads : int, default 1
        Teacher heads ``H``.
    rank : int, default 4
        Rank of each teacher kernel (the width of its factors).
    outputs : int, default 2
        Output dimension ``p``.
    zeta_value : float, default 0.5
        Heterogeneity ``ζ_V`` of the clients' value maps.
    zeta_covariate : float, default 0.5
        Heterogeneity ``ζ_X`` of the clients' token covariances.
    zeta_mean : float, default 0.0
        Heterogeneity ``ζ_μ`` of the clients' token means.
    noise : float, default 0.1
        Label noise ``σ``.
    dirichlet_alpha : float, optional
        Client sizes in Dirichlet(α) proportions (at least one sample each, ``m·N`` in all);
        default equal sizes.
    query : {"last", "fresh"}, default "last"
        The query: the context's last token, or a fresh token of the same client.
    positional_strength : float, default 0.0
        Scale of a position-dependent token mean (positional structure for softmax attention).
    seed : int, default 0
        The instance: teacher, clients and samples are drawn from it.
    fresh_samples : bool, default False
        Draw new samples of the same clients (an independent evaluation set: same teacher and
        client distributions, every client ``samples_per_client`` samples).

    Returns
    -------
    FederatedDataset
        The clients, weights ``p_c = N_c / Σ N_c`` and ``truth``: the teacher ``kernel``
        ``(H, d, d)``, ``value_mean``, ``value_maps`` and the clients' token statistics.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=4, samples_per_client=32, dim=6, seed=1)
    >>> X, q, y = clients.clients[0]
    >>> X.shape, q.shape, y.shape, clients.truth["kernel"].shape
    ((32, 16, 6), (32, 6), (32, 2), (1, 6, 6))
    >>> clients.weights.tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    d, n, p, H = dim, tokens, outputs, heads
    teacher = np.random.default_rng(seed_sequence(seed, SEED_TEACHER))
    std = 1.0 / np.sqrt(d)
    WQ = teacher.normal(0, std, size=(H, d, rank))
    WK = teacher.normal(0, std, size=(H, d, rank))
    K_star = WQ @ np.swapaxes(WK, -1, -2)
    V_bar = teacher.normal(0, std, size=(H, d, p))
    positions = _positional_means(n, d, positional_strength, teacher)
    rngs = [np.random.default_rng(seed_sequence(seed, SEED_CLIENT, c)) for c in range(num_clients)]
    sizes = client_sizes(num_clients, samples_per_client, dirichlet_alpha, rngs, fresh_samples)
    clients, value_maps, means, scales = [], [], [], []
    for c, (rng, N) in enumerate(zip(rngs, sizes)):
        V_c = V_bar + zeta_value * rng.normal(0, std, size=(H, d, p))
        scale = np.exp(0.5 * zeta_covariate * rng.normal(size=d))     # sqrt of diag(Σ_c)
        mu = zeta_mean * rng.normal(size=d)
        rng = sample_stream(rng, seed, c, fresh_samples)
        X = mu + positions + scale * rng.normal(size=(N, n, d))
        if query == "last":
            q = X[:, -1, :].copy()
        else:
            q = mu + positions[-1] + scale * rng.normal(size=(N, d))
        S = context_second_moment(X)
        phi = flat(np, features(K_star, S, q), 2)
        y = phi @ V_c.reshape(H * d, p) + noise * rng.normal(size=(N, p))
        clients.append(ClientDataset(X, q, y))
        value_maps.append(V_c)
        means.append(mu)
        scales.append(scale**2)
    sizes = np.array(sizes, dtype=float)
    truth = {"kernel": K_star, "value_mean": V_bar, "value_maps": np.array(value_maps),
             "token_means": np.array(means), "token_variances": np.array(scales),
             "positional_means": positions}
    return FederatedDataset(tuple(clients), sizes / sizes.sum(), "planted_kernel", truth)


def in_context_regression_clients(num_clients=8, samples_per_client=256, tokens=16, dim=4,
                                  zeta_covariate=0.5, zeta_task=0.5, noise=0.0,
                                  dirichlet_alpha=None, seed=0, fresh_samples=False) -> FederatedDataset:
    """In-context linear regression (docs/theory.md §2), token dimension ``dim + 1``, ``p = 1``.

    Tokens ``z_i = (x_i, y_i)`` with ``x_i ~ N(0, Λ_c)``, ``Λ_c = diag(exp(ζ_X ε_c))``,
    ``y_i = w^T x_i + σ ξ_i`` and a fresh task ``w ~ N(μ_c, I)``, ``μ_c = ζ_w ν_c``, per
    sample; query ``(x_q, 0)``, target ``y_q = w^T x_q``. ``Ŝ`` averages the context only.

    Parameters
    ----------
    num_clients, samples_per_client, tokens, dirichlet_alpha, seed, fresh_samples
        The clients and their samples, as in :func:`planted_kernel_clients` (defaults: 8
        clients of 256 samples, contexts of 16 tokens, equal sizes, seed 0).
    dim : int, default 4
        Dimension of the covariates ``x`` (tokens have ``dim + 1``).
    zeta_covariate : float, default 0.5
        Heterogeneity ``ζ_X`` of the clients' covariate spectra.
    zeta_task : float, default 0.5
        Heterogeneity ``ζ_w`` of the clients' task means.
    noise : float, default 0.0
        Noise ``σ`` of the context labels.

    Returns
    -------
    FederatedDataset
        The clients, weights and ``truth`` (``task_means``, ``spectra``).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.in_context_regression_clients(num_clients=3, samples_per_client=16, tokens=8, dim=4)
    >>> X, q, y = clients.clients[0]
    >>> X.shape, q.shape, y.shape
    ((16, 8, 5), (16, 5), (16, 1))
    """
    d, n = dim, tokens
    rngs = [np.random.default_rng(seed_sequence(seed, SEED_CLIENT, c)) for c in range(num_clients)]
    sizes = client_sizes(num_clients, samples_per_client, dirichlet_alpha, rngs, fresh_samples)
    clients, task_means, spectra = [], [], []
    for c, (rng, N) in enumerate(zip(rngs, sizes)):
        lam = np.exp(zeta_covariate * rng.normal(size=d))
        mu = zeta_task * rng.normal(size=d)
        rng = sample_stream(rng, seed, c, fresh_samples)
        w = mu + rng.normal(size=(N, d))
        x = np.sqrt(lam) * rng.normal(size=(N, n + 1, d))
        ys = np.einsum("bid,bd->bi", x, w)
        ctx_y = ys[:, :n] + noise * rng.normal(size=(N, n))
        X = np.concatenate([x[:, :n, :], ctx_y[..., None]], axis=-1)
        q = np.concatenate([x[:, n, :], np.zeros((N, 1))], axis=-1)
        clients.append(ClientDataset(X, q, ys[:, n:n + 1].copy()))
        task_means.append(mu)
        spectra.append(lam)
    sizes = np.array(sizes, dtype=float)
    truth = {"task_means": np.array(task_means), "spectra": np.array(spectra)}
    return FederatedDataset(tuple(clients), sizes / sizes.sum(), "in_context_regression", truth)
