"""FedAvg: McMahan, Moore, Ramage, Hampson, Agüera y Arcas, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017 (docs/theory.md §3).

Every block trains in every round: each participant runs ``E`` steps
``θ_c ← θ_c − η ∇F_{λ,c}(θ_c)`` from ``θ^t`` and the server moves to
``θ^{t+1} = θ^t + η_s Σ_c p̃_c (θ_c − θ^t)`` (``η_s = 1``: the weighted average).
"""

from __future__ import annotations

from .base import Strategy, declare, local_sgd, server_sgd, train_all

__all__ = ["NAME", "strategy"]

NAME = "fedavg"


@declare(style=("FedAvg", "blue", "o"))
def strategy(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedAvg with the server step ``fed.server_learning_rate`` (``warmup_rounds`` is not used).

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
    >>> from linattn_theory.sim.strategies.fedavg import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]      # every block, every round
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV')]
    """
    return Strategy(NAME, train_all, local_sgd(), server_sgd(fed.server_learning_rate))
