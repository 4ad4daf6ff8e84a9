"""Freezing the other way round: the value block frozen after the warm-up (docs/theory.md §3).

The ablation of FedFrozen (arXiv:2605.06446): every block trains for ``t < T0``;
from round ``T0`` on ``W_V`` stays at its round-``T0`` value and only ``W_Q, W_K`` (the kernel)
keep training with FedAvg.
"""

from __future__ import annotations

from .base import Strategy, declare, freeze_after, local_sgd, server_sgd

__all__ = ["NAME", "strategy"]

NAME = "value_frozen"


@declare(freezes=True, style=("value frozen", "light_blue", "H"), panel="fixed")
def strategy(fed, warmup_rounds: int) -> Strategy:
    """All blocks for ``t < T0``, then only ``W_Q, W_K``.

    Parameters
    ----------
    fed : FederatedConfig
        The schedule and the strategy's settings (``config.federated``).
    warmup_rounds : int
        ``T0``.

    Returns
    -------
    Strategy
        The strategy.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.value_frozen import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK'), ('WQ', 'WK')]
    """
    return Strategy(NAME, freeze_after(warmup_rounds, ("WQ", "WK")), local_sgd(),
                    server_sgd(fed.server_learning_rate))
