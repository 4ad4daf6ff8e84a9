"""The warm-up as inexact descent on ``Φ_λ``: replayed rounds and the split of each round's
gap to the exact profile step (docs/theory.md §4).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from ..core.arrays import array_namespace, to_numpy
from ..core.model import Params, value_matrix, kernel, loss_and_grad_from_inputs
from ..core.clients import StackedClients
from .host import check_ridge, host_moments, kernel_gradient, profile_from_moments, as_stacked
from .frozen_stage import check_schedule

__all__ = ["local_steps", "replay_round", "warmup_inexactness"]


# --------------------------------------------------------------------------------------
# §4 the warm-up as inexact descent on Φ_λ
# --------------------------------------------------------------------------------------
def local_steps(params: Params, clients, eta: float, E: int, lam: float = 0.0, *,
                centralized: bool = False) -> Params:
    """``E`` full-batch gradient steps on every block (docs/theory.md §3).

    ``W ← W − η ∇_W F_{λ,c}`` on each client's own objective, all clients at once (returns
    parameters with a leading client axis ``(m, …)``), or, with ``centralized=True``, the same
    steps on the global ``F_λ = Σ_c p_c F_{λ,c}`` (returns unbatched parameters). The ridge
    ``λ`` acts on ``W_V`` only.

    Parameters
    ----------
    params : Params
        The starting parameters.
    clients : FederatedDataset or StackedClients
        The clients.
    eta : float
        Step size ``η``.
    E : int
        Steps.
    lam : float, default 0.0
        Ridge ``λ`` on ``W_V``.
    centralized : bool, default False
        Step on the global objective instead.

    Returns
    -------
    Params
        Every client's parameters ``(m, …)``, or the centralised ones.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> from linattn_theory.theory.inexactness import local_steps
    >>> stepped = local_steps(params, [(X, q, y)], eta=0.1, E=1)          # one client, one step
    >>> stepped.WV.shape, bool(np.allclose(stepped.WV[0], params.WV - 0.1 * lt.loss_and_grad(params, X, q, y)[1].WV))
    ((1, 1, 4, 1), True)
    """
    data = as_stacked(clients)
    xp = array_namespace(data.S)
    m = data.S.shape[0]
    params = params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))
    if not centralized:
        params = params.map(lambda a: xp.broadcast_to(a, (m,) + tuple(a.shape)))
    for _ in range(E):
        _, g = loss_and_grad_from_inputs(params, data.inputs, data.q, data.y, data.sample_weight,
                                         attention=data.attention, temperature=data.temperature)
        if centralized:
            g = g.map(lambda a: xp.sum(xp.reshape(data.weights, (-1,) + (1,) * (a.ndim - 1)) * a, axis=0))
        params = Params(params.WQ - eta * g.WQ, params.WK - eta * g.WK,
                        params.WV - eta * (g.WV + lam * params.WV))
    return params


def _server_step(params: Params, client_params: Params, weights, server_learning_rate: float) -> Params:
    """``θ + η_s (Σ_c p_c θ_c − θ)`` block by block, weights renormalised to sum to one."""
    xp = array_namespace(weights)
    w = weights / xp.sum(weights)

    def average(theta, theta_c):
        mean = xp.sum(xp.reshape(w, (-1,) + (1,) * (theta_c.ndim - 1)) * theta_c, axis=0)
        return theta + server_learning_rate * (mean - theta)
    return params.map(average, client_params)


def replay_round(params: Params, clients, eta: float, E: int, lam: float = 0.0,
                 server_learning_rate: float = 1.0):
    """One full-batch, full-participation warm-up round (docs/theory.md §3) from ``params``.

    Returns ``(θ^{t+1}, client_params)``: the server's new parameters and every client's model
    after its ``E`` local steps (leading client axis). Equals the simulator's round.

    Parameters
    ----------
    params : Params
        ``θ^t``.
    clients : FederatedDataset or StackedClients
        The clients.
    eta : float
        Client step size ``η``.
    E : int
        Local steps.
    lam : float, default 0.0
        Ridge ``λ``.
    server_learning_rate : float, default 1.0
        Server step size ``η_s``.

    Returns
    -------
    next_params : Params
        ``θ^{t+1}``.
    client_params : Params
        The clients' models ``(m, …)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> rng = np.random.default_rng(0)
    >>> params = lt.Params.init(d=4, r=2, p=1)
    >>> X, q, y = rng.normal(size=(8, 5, 4)), rng.normal(size=(8, 4)), rng.normal(size=(8, 1))
    >>> from linattn_theory.theory.inexactness import local_steps, replay_round
    >>> server, local = replay_round(params, [(X, q, y)], eta=0.1, E=2)
    >>> bool(np.allclose(server.WV, local.WV[0]))                     # one client, η_s = 1: its model
    True
    >>> bool(np.allclose(local.WQ, local_steps(params, [(X, q, y)], eta=0.1, E=2).WQ))
    True
    """
    check_ridge(lam)
    check_schedule(eta, E, server_learning_rate)
    data = as_stacked(clients)
    client_params = local_steps(params, data, eta, E, lam)
    return _server_step(params, client_params, data.weights, server_learning_rate), client_params


def _host_kernel(params: Params) -> np.ndarray:
    return np.asarray(to_numpy(kernel(params)), dtype=np.float64)


def _inexactness_row(params: Params, data: StackedClients, eta, E, lam, s):
    """One warm-up round's realised change of ``Φ_λ``, its first-order prediction and the split of the gap."""
    WQ, WK = (np.asarray(to_numpy(a), dtype=np.float64) for a in (params.WQ, params.WK))
    K = WQ @ np.swapaxes(WK, -1, -2)
    H, d, p = K.shape[0], K.shape[-1], params.WV.shape[-1]

    def profile(K):
        return profile_from_moments(host_moments(K, data), lam)

    phi, V_star = profile(K)
    G = kernel_gradient(K, V_star, data)
    dK_exact = -s * eta * E * (G @ WK @ np.swapaxes(WK, -1, -2) + WQ @ np.swapaxes(WQ, -1, -2) @ G)
    predicted = float(np.sum(G * dK_exact))
    # (a) exact step: centralised steps from V*_λ(K^t); (b) centralised steps from V^t
    xp = array_namespace(data.S)
    at_optimum = params.replace(WV=xp.reshape(xp.asarray(V_star, dtype=data.S.dtype), (H, d, p)))
    K_a = _host_kernel(_server_step(at_optimum, _lift(local_steps(at_optimum, data, eta, E, lam,
                                                                   centralized=True)), _one(xp, data), s))
    K_b = _host_kernel(_server_step(params, _lift(local_steps(params, data, eta, E, lam, centralized=True)),
                                    _one(xp, data), s))
    # (c) clients' local steps, each client's model put through the server step, products averaged
    new, client = replay_round(params, data, eta, E, lam, s)
    own = _server_step_per_client(params, client, s)
    w = np.asarray(to_numpy(data.weights), dtype=np.float64)
    K_prod = np.sum((w / w.sum())[:, None, None, None] * _host_kernel(own), axis=0)
    K_new = _host_kernel(new)
    phi_a, phi_b, phi_prod, phi_new = (profile(k)[0] for k in (K_a, K_b, K_prod, K_new))
    V = np.asarray(to_numpy(value_matrix(xp, params.WV)), dtype=np.float64)
    realised = phi_new - phi
    gap = realised - predicted
    value_lag, client_drift, factor_averaging = phi_b - phi_a, phi_prod - phi_b, phi_new - phi_prod
    row = {"profile_objective": phi, "value_distance": float(np.linalg.norm(V - V_star)),
           "gradient_norm": float(np.linalg.norm(G)), "realised_change": realised,
           "predicted_change": predicted, "gap": gap, "value_lag": value_lag, "client_drift": client_drift,
           "factor_averaging": factor_averaging,
           "remainder": gap - value_lag - client_drift - factor_averaging,
           "exact_step_change": phi_a - phi}
    return row, new


def _lift(params: Params) -> Params:
    """Give unbatched parameters a client axis of length one."""
    return params.map(lambda a: a[None])


def _one(xp, data):
    return xp.ones((1,), dtype=data.S.dtype)


def _server_step_per_client(params: Params, client_params: Params, s: float) -> Params:
    """``θ + η_s (θ_c − θ)`` for each client separately (the product each client's model induces)."""
    return params.map(lambda theta, theta_c: theta + s * (theta_c - theta), client_params)


def warmup_inexactness(config_or_params, clients=None, *, rounds: int | None = None,
                       lam: float | None = None, eta: float | None = None, local_steps: int | None = None,
                       server_learning_rate: float | None = None) -> pd.DataFrame:
    """Per warm-up round, the warm-up as inexact descent on ``Φ_λ`` (docs/theory.md §4).

    For each round ``t`` (full batch, full participation) with ``G = ∇_K Φ_λ(K^t)``:

    - ``realised_change = Φ_λ(K^{t+1}) − Φ_λ(K^t)``;
    - ``predicted_change = ⟨G, ΔK_exact⟩``, ``ΔK_exact = −η_s η E (G W_K W_K^T + W_Q W_Q^T G)``: the
      first-order kernel change of ``E`` centralised gradient steps on the factors with ``V`` at
      ``V*_λ(K^t)`` (the exact preconditioned profile step);
    - ``gap = realised_change − predicted_change``, split telescopically through the kernels
      ``K_a`` (centralised steps from ``(W_Q, W_K, V*_λ(K^t))``), ``K_b`` (centralised steps from
      ``θ^t``), ``K_prod = Σ_c p_c W_{Q,c} W_{K,c}^T`` (clients' local steps, products averaged;
      each client's factors first put through the server step) and ``K^{t+1}`` (factors
      averaged): ``value_lag = Φ(K_b) − Φ(K_a)``, ``client_drift = Φ(K_prod) − Φ(K_b)``,
      ``factor_averaging = Φ(K^{t+1}) − Φ(K_prod)`` and ``remainder`` = what is left, which
      equals ``Φ(K_a) − Φ(K^t) − predicted_change`` (the exact step's higher-order terms).

    ``config_or_params`` is a :class:`~linattn_theory.sim.config.RunConfig` (its initial parameters,
    clients, settings and ``T0`` rounds) or :class:`~linattn_theory.core.model.Params` (then pass
    ``clients``, ``rounds``, ``lam``, ``eta``, ``local_steps``). One row per round.

    Parameters
    ----------
    config_or_params : RunConfig or Params
        The instance, or the initial parameters ``θ^0`` (then pass the settings below).
    clients : FederatedDataset, optional
        The clients (default those of the config; needed with ``Params``).
    rounds : int, optional
        Warm-up rounds to analyse; default the config's ``T0``.
    lam, eta, local_steps, server_learning_rate : float or int, optional
        Ridge, client step size, local steps ``E`` and server step size; default the config's.

    Returns
    -------
    pandas.DataFrame
        One row per round: the columns above, with ``profile_objective``, ``gradient_norm`` and
        the distance of ``V^t`` to ``V*_λ(K^t)``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 8, "warmup_rounds": 4}})
    >>> table = lt.warmup_inexactness(config)
    >>> len(table)
    4
    >>> parts = table[["value_lag", "client_drift", "factor_averaging", "remainder"]].sum(axis=1)
    >>> bool((parts - table["gap"]).abs().max() < 1e-12)
    True
    """
    from ..sim.config import RunConfig
    if isinstance(config_or_params, RunConfig):
        from ..data.families import clients_from_config
        from ..sim.engine import initial_params
        config = config_or_params
        fed = config.federated
        if fed.batch_size is not None or fed.participation < 1.0:
            raise ValueError(f"warmup_inexactness replays full-batch, full-participation rounds; the config "
                             f"has batch_size = {fed.batch_size}, participation = {fed.participation}")
        clients = clients_from_config(config) if clients is None else clients
        data = as_stacked(clients)
        params = initial_params(config, data.q.shape[-1], data.y.shape[-1])
        rounds = config.warmup_rounds if rounds is None else rounds
        lam = fed.ridge if lam is None else lam
        eta = fed.learning_rate if eta is None else eta
        local_steps = fed.local_steps if local_steps is None else local_steps
        server_learning_rate = fed.server_learning_rate if server_learning_rate is None else server_learning_rate
    else:
        params = config_or_params
        missing = [n for n, v in (("clients", clients), ("rounds", rounds), ("lam", lam), ("eta", eta),
                                  ("local_steps", local_steps)) if v is None]
        if missing:
            raise ValueError(f"warmup_inexactness with Params needs {', '.join(missing)}")
        data = as_stacked(clients)
        server_learning_rate = 1.0 if server_learning_rate is None else server_learning_rate
    check_ridge(lam)
    check_schedule(eta, local_steps, server_learning_rate)
    xp = array_namespace(data.S)
    params = params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))
    rows = []
    for t in range(int(rounds)):
        if not all(np.all(np.isfinite(to_numpy(a))) for a in (params.WQ, params.WK, params.WV)):
            raise ValueError(f"warm-up diverged before round {t} with eta = {eta}; lower the step size")
        row, params = _inexactness_row(params, data, eta, local_steps, lam, server_learning_rate)
        rows.append({"round": t, **row})
    return pd.DataFrame(rows)
