"""FedFrozen: Two-Stage Federated Optimization via Attention Kernel Freezing (arXiv:2605.06446); docs/theory.md §3 and §5.

Two stages on FedAvg: every block trains for ``t < T0`` (the warm-up); from round ``T0`` on the
query/key block is frozen at its round-``T0`` value (the kernel ``K_{T0}``) and only ``W_V``
trains, a quadratic problem in ``W_V`` (docs/theory.md §5).

- ``random_kernel``: ``T0 = 0``, the kernel frozen at initialisation (a random kernel, as in work
  on random attention); the configured ``warmup_rounds`` is ignored.
- ``fedfrozen_fedprox`` / ``fedfrozen_scaffold``: the frozen stage runs FedProx (proximal term
  ``μ(θ_c − θ^t)``) or SCAFFOLD (control variates, zero at round ``T0``) instead of FedAvg; the
  warm-up is plain FedAvg.
"""

from __future__ import annotations

from . import fedprox, scaffold
from .base import Strategy, declare, freeze_after, local_sgd, server_sgd

__all__ = ["NAME", "strategy", "random_kernel", "fedfrozen_fedprox", "fedfrozen_scaffold"]

NAME = "fedfrozen"
FROZEN = ("WV",)


@declare(freezes=True, style=("FedFrozen", "orange", "s"))
def strategy(fed, warmup_rounds: int) -> Strategy:
    """FedFrozen with warm-up ``T0 = warmup_rounds`` (``T0 = T``: FedAvg).

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
    >>> from linattn_theory.sim.strategies.fedfrozen import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WV',), ('WV',)]
    """
    return Strategy(NAME, freeze_after(warmup_rounds, FROZEN), local_sgd(),
                    server_sgd(fed.server_learning_rate))


@declare(warmup_rounds=0, style=(r"random kernel ($T_0$ = 0)", "grey", "X"), panel="fixed")
def random_kernel(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedFrozen with ``T0 = 0``: only ``W_V`` ever trains, on the random initial kernel.

    Parameters
    ----------
    fed : FederatedConfig
        The schedule and the strategy's settings (``config.federated``).
    warmup_rounds : int, optional
        Not used (``T0 = 0``).

    Returns
    -------
    Strategy
        The strategy.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.fedfrozen import random_kernel
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [random_kernel(fed, 2).schedule(t) for t in range(4)]
    [('WV',), ('WV',), ('WV',), ('WV',)]
    """
    return strategy(fed, 0)._replace(name="random_kernel")


@declare(freezes=True, settings=("prox_mu",), style=("FedFrozen + FedProx", "light_blue", "<"),
         panel="fedfrozen")
def fedfrozen_fedprox(fed, warmup_rounds: int) -> Strategy:
    """FedFrozen whose frozen stage (``t ≥ T0``) adds FedProx's ``μ(θ_c − θ^t)``, ``μ = fed.prox_mu``.

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
    >>> from linattn_theory.sim.strategies.fedfrozen import fedfrozen_fedprox
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [fedfrozen_fedprox(fed, 2).schedule(t) for t in range(4)]
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WV',), ('WV',)]
    """
    return Strategy("fedfrozen_fedprox", freeze_after(warmup_rounds, FROZEN),
                    fedprox.proximal(fed.prox_mu, stage=FROZEN),
                    server_sgd(fed.server_learning_rate))


@declare(freezes=True, style=("FedFrozen + SCAFFOLD", "green", ">"), panel="fedfrozen")
def fedfrozen_scaffold(fed, warmup_rounds: int) -> Strategy:
    """FedFrozen whose frozen stage (``t ≥ T0``) runs SCAFFOLD on ``W_V``.

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
    >>> from linattn_theory.sim.strategies.fedfrozen import fedfrozen_scaffold
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [fedfrozen_scaffold(fed, 2).schedule(t) for t in range(4)]
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WV',), ('WV',)]
    """
    return Strategy("fedfrozen_scaffold", freeze_after(warmup_rounds, FROZEN),
                    scaffold.control_variates(stage=FROZEN),
                    server_sgd(fed.server_learning_rate))

