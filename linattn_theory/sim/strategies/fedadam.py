"""FedAdam: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2 (docs/theory.md §3).

Clients run plain local gradient descent; the server treats ``Δ = Σ_c p̃_c θ_c − θ^t`` as a
pseudo-gradient (a descent direction) and, per coordinate,

    m ← β1 m + (1 − β1) Δ,    v ← β2 v + (1 − β2) Δ²,    θ^{t+1} = θ^t + η_s m / (√v + τ),

with ``m = 0`` and ``v = τ²`` initially and no bias correction, as in the paper. The step is
about ``η_s`` per coordinate, so ``η_s`` (``server_learning_rate``) is much smaller than FedAvg's 1.
"""

from __future__ import annotations

from ...core.arrays import array_namespace
from ...core.errors import ConfigError
from .base import ServerRule, Strategy, declare, local_sgd, train_all, zeros_like_blocks

__all__ = ["NAME", "MAX_SERVER_STEP", "adam", "check", "strategy"]

NAME = "fedadam"

#: FedAdam's server step is a per-coordinate step size (Reddi et al. 2020): FedAvg's default 1 diverges.
MAX_SERVER_STEP = 0.1


def adam(learning_rate: float, beta1: float, beta2: float, epsilon: float) -> ServerRule:
    """The FedAdam server rule; state ``(m, v)``, each ``{block: array}``.

    Parameters
    ----------
    learning_rate : float
        ``η_s``.
    beta1, beta2 : float
        The moments' decay rates.
    epsilon : float
        ``τ``, added to ``√v``.

    Returns
    -------
    ServerRule
        The rule.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.base import Round
    >>> rnd = Round(t=0, blocks=("WQ", "WK", "WV"), participants=np.array([0, 2]), num_clients=3,
    ...             client_weights=np.array([0.25, 0.25]), weights=np.array([0.5, 0.5]),
    ...             local_steps=1, learning_rate=0.1)
    >>> params = lt.Params.init(d=6, r=3, p=2)
    >>> delta = {block: np.ones_like(getattr(params, block)) for block in ("WQ", "WK", "WV")}   # Δ = 1
    >>> from linattn_theory.sim.strategies.fedadam import adam
    >>> rule = adam(learning_rate=0.01, beta1=0.9, beta2=0.99, epsilon=1e-3)
    >>> step, state = rule.update(rule.init(params), rnd, delta)
    >>> m, v = 0.1 * 1.0, 0.99 * 1e-3 ** 2 + 0.01 * 1.0                # v starts at τ²
    >>> bool(np.isclose(step["WV"][0, 0, 0], 0.01 * m / (np.sqrt(v) + 1e-3), rtol=1e-12, atol=0))   # η_s m / (√v + τ)
    True
    """

    def init(params):
        zeros = zeros_like_blocks(params)
        return zeros, {b: z + epsilon * epsilon for b, z in zeros.items()}

    def update(state, rnd, delta):
        m, v = dict(state[0]), dict(state[1])
        step = {}
        for b, d in delta.items():
            xp = array_namespace(d)
            m[b] = beta1 * m[b] + (1.0 - beta1) * d
            v[b] = beta2 * v[b] + (1.0 - beta2) * (d * d)
            step[b] = learning_rate * m[b] / (xp.sqrt(v[b]) + epsilon)
        return step, (m, v)

    return ServerRule(init, update)


def check(fed, given) -> None:
    """Refuse a server step ``η_s > MAX_SERVER_STEP`` (a ``ConfigError`` that says whether it is the default).

    Parameters
    ----------
    fed : FederatedConfig
        The federated settings.
    given : collection of str
        The keys the config's ``[federated]`` table sets.

    Returns
    -------
    None

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.fedadam import check
    >>> fed = lt.config_from_dict({}).federated                       # η_s = 1, the default
    >>> check(fed, given=set())
    Traceback (most recent call last):
    ...
    linattn_theory.core.errors.ConfigError: federated.strategy = 'fedadam' with the default federated.server_learning_rate = 1.0: ...
    """
    if fed.server_learning_rate > MAX_SERVER_STEP:
        default = "" if "server_learning_rate" in given else "federated.strategy = 'fedadam' with the default "
        raise ConfigError(default + f"federated.server_learning_rate = {fed.server_learning_rate!r}: FedAdam moves "
                          f"every coordinate by about this much per round; expected a value <= "
                          f"{MAX_SERVER_STEP} for strategy 'fedadam' (e.g. 0.01)")


@declare(settings=("server_beta1", "server_beta2", "server_epsilon"), check=check,
         style=("FedAdam", "brown", "P"), panel="baselines")
def strategy(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedAdam with ``η_s = fed.server_learning_rate``, ``β1, β2 = fed.server_beta1/2``, ``τ = fed.server_epsilon``.

    Parameters
    ----------
    fed : FederatedConfig
        The schedule and the strategy's settings (``config.federated``).
    warmup_rounds : int, optional
        Not used.

    Returns
    -------
    Strategy
        The strategy.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.fedadam import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]      # every block, every round
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV')]
    """
    return Strategy(NAME, train_all, local_sgd(),
                    adam(fed.server_learning_rate, fed.server_beta1, fed.server_beta2,
                         fed.server_epsilon))
