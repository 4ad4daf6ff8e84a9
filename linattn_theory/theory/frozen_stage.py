"""The frozen stage in closed form: the affine round ``V ← M V + b``, its fixed point ``V_FA``,
the contraction rate and the value drift floor (docs/theory.md §5).
"""

from __future__ import annotations


import numpy as np

from ..core.moments import ValueMoments
from .host import check_kernel, check_ridge, host_moments, profile_from_moments, ridged, solve_symmetric, as_stacked
from ..core.frozen_map import frozen_client_map

__all__ = ["frozen_stage_map", "fedavg_fixed_point", "contraction_rate", "value_drift_floor", "affine_round",
           "fixed_point", "spectral_radius", "drift_floor_from_moments", "check_schedule", "sampling_pair_weights",
           "sampled_frozen_stage", "expected_frozen_objective"]


# --------------------------------------------------------------------------------------
# §5 the frozen stage
# --------------------------------------------------------------------------------------
def check_schedule(eta, E, server_learning_rate=1.0):
    """Refuse a step size ``η ≤ 0``, a non-integer ``E < 1`` or a server step ``η_s ≤ 0`` (a ``ValueError``).

    Parameters
    ----------
    eta : float
        Client step size ``η``.
    E : int
        Local steps per round.
    server_learning_rate : float, default 1.0
        Server step size ``η_s``.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.theory.frozen_stage import check_schedule
    >>> check_schedule(0.05, 5)
    >>> check_schedule(0.0, 5)
    Traceback (most recent call last):
    ...
    ValueError: eta = 0.0; expected a finite step size η > 0
    """
    if not np.isfinite(eta) or eta <= 0:
        raise ValueError(f"eta = {eta!r}; expected a finite step size η > 0")
    if isinstance(E, bool) or not isinstance(E, (int, np.integer)) or E < 1:
        raise ValueError(f"E = {E!r}; expected an integer number of local steps >= 1")
    if not np.isfinite(server_learning_rate) or server_learning_rate <= 0:
        raise ValueError(f"server_learning_rate = {server_learning_rate!r}; expected a number > 0")


def affine_round(moments: ValueMoments, eta: float, E: int, lam: float, server_learning_rate: float = 1.0):
    """``(M, b)``: ``M = Σ_c p_c (I − ηÃ_c)^E``, ``b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c`` (with server step).

    Parameters
    ----------
    moments : ValueMoments
        The clients' value moments at the frozen kernel (:func:`~linattn_theory.theory.host.host_moments`).
    eta : float
        Client step size ``η``.
    E : int
        Local steps per round.
    lam : float
        Ridge ``λ``.
    server_learning_rate : float, default 1.0
        Server step size ``η_s``.

    Returns
    -------
    M : numpy.ndarray, shape (H·d, H·d)
        The linear part of the round.
    b : numpy.ndarray, shape (H·d, p)
        Its constant part.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> moments = host_moments(K, as_stacked(clients))
    >>> from linattn_theory.theory.frozen_stage import affine_round
    >>> M, b = affine_round(moments, eta=0.05, E=5, lam=0.0)
    >>> M_ref, b_ref = lt.frozen_stage_map(K, clients, eta=0.05, E=5)
    >>> bool(np.allclose(M, M_ref) and np.allclose(b, b_ref))
    True
    """
    Mc, bc = frozen_client_map(moments, eta, E, lam)
    w = moments.weights
    n = Mc.shape[-1]
    M = np.sum(w[:, None, None] * Mc, axis=0)
    b = np.sum(w[:, None, None] * bc, axis=0)
    s = server_learning_rate
    return (1.0 - s) * np.eye(n) + s * M, s * b


def frozen_stage_map(K, clients, eta: float, E: int, lam: float = 0.0, server_learning_rate: float = 1.0):
    """The affine frozen-stage round ``V^{t+1} = M V^t + b`` on the stacked value block (docs/theory.md §5).

    ``M = Σ_c p_c (I − ηÃ_c)^E`` ``(Hd, Hd)``, ``b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c`` ``(Hd, p)``;
    with a server step size ``η_s``: ``M ← (1 − η_s) I + η_s M``, ``b ← η_s b``.

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        The frozen attention kernels.
    clients : FederatedDataset or StackedClients
        The clients (weights ``p_c``; full batches).
    eta : float
        Client step size ``η > 0``.
    E : int
        Local steps per round (``≥ 1``).
    lam : float, default 0.0
        Ridge ``λ ≥ 0`` on the value block.
    server_learning_rate : float, default 1.0
        Server step size ``η_s`` (``1``: plain averaging).

    Returns
    -------
    M : numpy.ndarray, shape (H·d, H·d)
        The linear part of the round.
    b : numpy.ndarray, shape (H·d, p)
        Its constant part.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> M, b = lt.frozen_stage_map(clients.truth["kernel"], clients, eta=0.05, E=5)
    >>> M.shape, b.shape
    ((4, 4), (4, 2))
    >>> V = lt.fedavg_fixed_point(clients.truth["kernel"], clients, eta=0.05, E=5)
    >>> bool(np.allclose(M @ V + b, V))                 # V_FA is the round's fixed point
    True
    """
    check_ridge(lam)
    check_schedule(eta, E, server_learning_rate)
    data = as_stacked(clients)
    return affine_round(host_moments(check_kernel(K, data), data), eta, E, lam, server_learning_rate)


def fixed_point(M, b):
    """``V_FA = (I − M)^{-1} b`` (the ``Σ_j`` form: valid when some ``Ã_c`` is singular).

    Parameters
    ----------
    M : array_like, shape (H·d, H·d)
        The round's linear part (:func:`affine_round`).
    b : array_like, shape (H·d, p)
        Its constant part.

    Returns
    -------
    numpy.ndarray, shape (H·d, p)
        ``V_FA``, the round's fixed point.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> moments = host_moments(K, as_stacked(clients))
    >>> from linattn_theory.theory.frozen_stage import affine_round, fixed_point
    >>> M, b = affine_round(moments, eta=0.05, E=5, lam=0.0)
    >>> V_FA = fixed_point(M, b)
    >>> bool(np.allclose(M @ V_FA + b, V_FA))
    True
    """
    return solve_symmetric(np.eye(M.shape[-1]) - M, b)


def fedavg_fixed_point(K, clients, eta: float, E: int, lam: float = 0.0):
    """``V_FA(K) = (Σ_c p_c P_c)^{-1} Σ_c p_c P_c V*_c``, ``P_c = I − (I − ηÃ_c)^E`` (docs/theory.md §5).

    Computed as ``(I − M)^{-1} b``, which needs no ``Ã_c^{-1}``; ``E = 1`` gives ``V*_λ(K)``.
    Returns the stacked value block ``(Hd, p)``.

    Parameters
    ----------
    K, clients, eta, E, lam
        Kernels ``(H, d, d)``, clients, step size, local steps and ridge, as in :func:`frozen_stage_map`.

    Returns
    -------
    numpy.ndarray, shape (H·d, p)
        ``V_FA(K)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> V_1 = lt.fedavg_fixed_point(K, clients, eta=0.05, E=1, lam=0.1)    # one local step: no drift
    >>> bool(np.allclose(V_1, lt.profile_objective(K, clients, lam=0.1)[1]))
    True
    """
    return fixed_point(*frozen_stage_map(K, clients, eta, E, lam))


def contraction_rate(K, clients, eta: float, E: int, lam: float = 0.0, server_learning_rate: float = 1.0) -> float:
    """``ρ(K)``, the spectral radius of ``M`` (docs/theory.md §5): ``‖V^t − V_FA‖`` shrinks like ``ρ^{t−T0}``.

    Parameters
    ----------
    K, clients, eta, E, lam
        Kernels ``(H, d, d)``, clients, step size, local steps and ridge, as in :func:`frozen_stage_map`.
    server_learning_rate : float, default 1.0
        Server step size ``η_s``.

    Returns
    -------
    float
        ``ρ(K)``; below 1 when the frozen stage converges.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> rho = lt.contraction_rate(clients.truth["kernel"], clients, eta=0.05, E=5)
    >>> bool(0 < rho < 1)
    True
    """
    return spectral_radius(frozen_stage_map(K, clients, eta, E, lam, server_learning_rate)[0])


def spectral_radius(M) -> float:
    """``max |μ|`` over the eigenvalues of the symmetric ``M``.

    Parameters
    ----------
    M : array_like, shape (n, n)
        Symmetric.

    Returns
    -------
    float
        The spectral radius.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.frozen_stage import spectral_radius
    >>> spectral_radius(np.diag([0.5, -0.9]))
    0.9
    """
    return float(np.max(np.abs(np.linalg.eigvalsh(M))))


def drift_floor_from_moments(V_FA, V_star, moments: ValueMoments, lam: float) -> float:
    """``½ tr((V_FA − V*)^T Ã (V_FA − V*))``.

    Parameters
    ----------
    V_FA : array_like, shape (H·d, p)
        The frozen stage's fixed point.
    V_star : array_like, shape (H·d, p)
        ``V*_λ``.
    moments : ValueMoments
        The clients' moments at the kernel.
    lam : float
        ``λ``.

    Returns
    -------
    float
        The drift floor ``D(K)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> moments = host_moments(K, as_stacked(clients))
    >>> from linattn_theory.theory.frozen_stage import affine_round, drift_floor_from_moments, fixed_point
    >>> from linattn_theory.theory.host import profile_from_moments
    >>> V_FA = fixed_point(*affine_round(moments, eta=0.05, E=5, lam=0.0))
    >>> floor = drift_floor_from_moments(V_FA, profile_from_moments(moments, 0.0)[1], moments, 0.0)
    >>> bool(np.isclose(floor, lt.value_drift_floor(K, clients, eta=0.05, E=5), rtol=1e-9, atol=0))
    True
    """
    A, _, _ = moments.weighted()
    delta = V_FA - V_star
    return float(0.5 * np.sum(delta * (ridged(A, lam) @ delta)))


def value_drift_floor(K, clients, eta: float, E: int, lam: float = 0.0) -> float:
    """``D(K) = F_λ(K, V_FA) − Φ_λ(K) = ½ tr((V_FA − V*_λ)^T Ã (V_FA − V*_λ))`` (docs/theory.md §5).

    Parameters
    ----------
    K, clients, eta, E, lam
        Kernels ``(H, d, d)``, clients, step size, local steps and ridge, as in :func:`frozen_stage_map`.

    Returns
    -------
    float
        ``D(K) ≥ 0``: what the frozen stage's end stays above the profile objective.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> bool(lt.value_drift_floor(K, clients, eta=0.05, E=5) > 0)
    True
    >>> bool(lt.value_drift_floor(K, clients, eta=0.05, E=1) < 1e-20)   # no local drift with E = 1
    True
    """
    check_ridge(lam)
    check_schedule(eta, E)
    data = as_stacked(clients)
    moments = host_moments(check_kernel(K, data), data)
    _, V_star = profile_from_moments(moments, lam)
    return drift_floor_from_moments(fixed_point(*affine_round(moments, eta, E, lam)), V_star, moments, lam)


# --------------------------------------------------------------------------------------
# the frozen stage under client sampling: its mean and second moment (docs/theory.md §5)
# --------------------------------------------------------------------------------------
def sampling_pair_weights(m: int, k: int) -> tuple[float, float]:
    """``(α, β)`` of ``E[Σ_{c∈S} Σ_{c'∈S} X_c ⋆ Y_{c'}] = α Σ_c X_c ⋆ Y_c + β (Σ_c X_c) ⋆ (Σ_c Y_c)`` for ``S``
    a uniform draw of ``k`` of ``m`` clients without replacement and any bilinear ``⋆``: a client is in
    ``S`` with probability ``k/m``, a pair of distinct clients with ``k(k−1)/(m(m−1))``, so
    ``β = k(k−1)/(m(m−1))`` and ``α = k/m − β``.

    Examples
    --------
    >>> from linattn_theory.theory.frozen_stage import sampling_pair_weights
    >>> sampling_pair_weights(4, 4), sampling_pair_weights(4, 1)      # everyone: (ΣX)(ΣY); one: Σ X_c Y_c / m
    ((0.0, 1.0), (0.25, 0.0))
    """
    m, k = int(m), int(k)
    if not 1 <= k <= m:
        raise ValueError(f"{k} participants of {m} clients; expected 1 <= k <= m")
    beta = k * (k - 1) / (m * (m - 1)) if m > 1 else 0.0
    return k / m - beta, beta


def sampled_frozen_stage(moments: ValueMoments, eta: float, E: int, lam: float, V0, rounds: int, participants: int,
                         server_learning_rate: float = 1.0):
    """``(E[V_k], E[V_k V_k^T])`` after ``k = rounds`` frozen rounds from ``V0`` when each round
    ``participants`` of the ``m`` equally weighted clients, drawn uniformly without replacement and
    independently across rounds, run their ``E`` full-batch local steps (docs/theory.md §5, "Client
    sampling").

    A round is the random affine map ``V ← A_S V + a_S`` with ``A_S = (1 − η_s) I + η_s G_S``,
    ``G_S = (1/k) Σ_{c∈S} M_c``, ``a_S = (η_s/k) Σ_{c∈S} b_c`` (``M_c``, ``b_c``: a client's local map,
    :func:`~linattn_theory.core.frozen_map.frozen_client_map`), independent of ``V``; so the mean follows
    the full-participation map (:func:`affine_round`) and the second moment ``Σ = E[V V^T]`` the exact
    linear recursion ``Σ' = E[A_S Σ A_S^T] + E[A_S μ a_S^T] + E[a_S μ^T A_S^T] + E[a_S a_S^T]``, each term
    by :func:`sampling_pair_weights`. With ``participants = m`` the covariance ``Σ − μμ^T`` stays 0.

    Parameters
    ----------
    moments : ValueMoments
        The clients' moments at the frozen kernel (equal weights ``p_c = 1/m``).
    eta, E, lam, server_learning_rate
        ``η``, ``E``, ``λ``, ``η_s``.
    V0 : array_like, shape (H·d, p)
        The value block when the stage starts.
    rounds : int
        Frozen rounds.
    participants : int
        ``k``, the clients per round (the simulator's ``max(1, round(participation·m))``).

    Returns
    -------
    mean : numpy.ndarray, shape (H·d, p)
    second : numpy.ndarray, shape (H·d, H·d)
        ``E[V_k]`` and ``E[V_k V_k^T]``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments
    >>> from linattn_theory.theory.frozen_stage import affine_round, sampled_frozen_stage
    >>> clients = lt.planted_kernel_clients(num_clients=4, samples_per_client=32, tokens=8, dim=3, rank=2)
    >>> moments = host_moments(clients.truth["kernel"], as_stacked(clients))
    >>> V0 = np.zeros(moments.B.shape[1:])                         # (H·d, p)
    >>> mean, second = sampled_frozen_stage(moments, 0.05, 5, 0.0, V0, rounds=3, participants=2)
    >>> M, b = affine_round(moments, 0.05, 5, 0.0)
    >>> bool(np.allclose(mean, M @ (M @ (M @ V0 + b) + b) + b))      # the mean: full participation's map
    True
    >>> bool(np.linalg.eigvalsh(second - mean @ mean.T).min() > -1e-12)   # a covariance
    True
    """
    weights = np.asarray(moments.weights, dtype=float)
    m = weights.shape[0]
    if not np.allclose(weights, weights[0], rtol=1e-12, atol=0):
        raise ValueError("sampled_frozen_stage: the clients' weights differ; the renormalised weights of a "
                         "sampled round then depend on the draw (equal weights only)")
    alpha, beta = sampling_pair_weights(m, participants)
    Mc, bc = frozen_client_map(moments, eta, E, lam)
    k, s = int(participants), float(server_learning_rate)
    SM, Sb = Mc.sum(axis=0), bc.sum(axis=0)
    G, g = SM / m, Sb / m                                       # E[G_S], E[g_S]
    I = np.eye(Mc.shape[-1])

    def pairs(X, left, right):
        """E[(Σ_{c∈S} left_c) X (Σ_{c'∈S} right_c')^T] / k² (left, right stacked per client)."""
        own = np.einsum("cij,jk,clk->il", left, X, right)
        return (alpha * own + beta * left.sum(axis=0) @ X @ right.sum(axis=0).T) / k ** 2

    mu = np.asarray(V0, dtype=float)
    second = mu @ mu.T
    for _ in range(int(rounds)):
        AXA = (1 - s) ** 2 * second + s * (1 - s) * (G @ second + second @ G.T) + s ** 2 * pairs(second, Mc, Mc)
        AMa = s * (1 - s) * mu @ g.T + s ** 2 * pairs(mu, Mc, bc)
        aa = s ** 2 * pairs(np.eye(bc.shape[-1]), bc, bc)
        second = AXA + AMa + AMa.T + aa
        mu = ((1 - s) * I + s * G) @ mu + s * g
    return mu, second


def expected_frozen_objective(moments: ValueMoments, lam: float, mean, second) -> float:
    """``E[F_λ(K, V)] = Φ_λ(K) + ½ tr(Ã (Σ − μV*^T − V*μ^T + V*V*^T))`` for ``E[V] = μ``, ``E[V V^T] = Σ``
    (``F_λ`` is quadratic in ``V``: its mean is the objective of the mean plus ``½ tr(Ã Cov V)``).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.host import as_stacked, host_moments, profile_from_moments
    >>> from linattn_theory.theory.frozen_stage import expected_frozen_objective
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=32, tokens=8, dim=3, rank=2)
    >>> moments = host_moments(clients.truth["kernel"], as_stacked(clients))
    >>> profile, V_star = profile_from_moments(moments, 0.0)
    >>> bool(np.isclose(expected_frozen_objective(moments, 0.0, V_star, V_star @ V_star.T), profile))
    True
    """
    profile, V_star = profile_from_moments(moments, lam)
    A = ridged(moments.weighted()[0], lam)
    mu, second = np.asarray(mean, dtype=float), np.asarray(second, dtype=float)
    centred = second - mu @ V_star.T - V_star @ mu.T + V_star @ V_star.T
    return float(profile + 0.5 * np.trace(A @ centred))
