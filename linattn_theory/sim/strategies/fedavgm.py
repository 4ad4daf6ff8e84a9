"""FedAvgM: server momentum on the averaged delta. Hsu, Qi, Brown, "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", arXiv:1909.06335 (2019);
also Reddi et al. 2020 (docs/theory.md §3).

Clients run plain local gradient descent; the server keeps a momentum buffer ``m`` and with
``Δ = Σ_c p̃_c θ_c − θ^t``:

    m ← β m + Δ,      θ^{t+1} = θ^t + η_s m.

``β = 0, η_s = 1`` is FedAvg, bit for bit (``0·m + Δ = Δ`` exactly).
"""

from __future__ import annotations

from .base import ServerRule, Strategy, declare, local_sgd, train_all, zeros_like_blocks

__all__ = ["NAME", "momentum", "strategy"]

NAME = "fedavgm"


def momentum(learning_rate: float, beta: float) -> ServerRule:
    """The heavy-ball server rule ``m ← β m + Δ``, ``step = η_s m``; state ``{block: m}``.

    Parameters
    ----------
    learning_rate : float
        ``η_s``.
    beta : float
        ``β``.

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
    >>> from linattn_theory.sim.strategies.fedavgm import momentum
    >>> rule = momentum(learning_rate=1.0, beta=0.9)
    >>> first, state = rule.update(rule.init(params), rnd, delta)
    >>> second, state = rule.update(state, rnd, delta)
    >>> float(first["WV"][0, 0, 0]), float(second["WV"][0, 0, 0])      # m = 1, then 0.9 + 1
    (1.0, 1.9)
    """

    def update(state, rnd, delta):
        state = dict(state)
        for b, d in delta.items():
            state[b] = beta * state[b] + d
        return {b: learning_rate * state[b] for b in delta}, state

    return ServerRule(lambda params: zeros_like_blocks(params), update)


@declare(settings=("server_momentum",), style=("FedAvgM", "vermillion", "v"), panel="baselines")
def strategy(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedAvgM with ``β = fed.server_momentum`` and ``η_s = fed.server_learning_rate``.

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
    >>> from linattn_theory.sim.strategies.fedavgm import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]      # every block, every round
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV')]
    """
    return Strategy(NAME, train_all, local_sgd(),
                    momentum(fed.server_learning_rate, fed.server_momentum))
