"""Federated strategies, one module each, all of the same shape (docs/theory.md §3).

Each module cites its paper and exposes ``strategy(fed, warmup_rounds) -> Strategy`` built from
a schedule (which blocks train in round ``t``), a client rule (gradient correction, client
state) and a server rule (the step on the weighted mean delta); see :mod:`.base`. Strategies
are chosen by name in configs (``federated.strategy``):

==================== ===================================================================
``fedavg``           FedAvg (McMahan et al. 2017): every block, every round
``fedfrozen``        FedFrozen: all blocks for ``t < T0``, then only ``W_V``
``random_kernel``    FedFrozen with ``T0 = 0``: the random initial kernel stays frozen
``value_frozen``     all blocks for ``t < T0``, then only ``W_Q, W_K``
``fedprox``          FedProx (Li et al. 2018), proximal weight ``μ``
``scaffold``         SCAFFOLD (Karimireddy et al. 2020), control variates
``fedavgm``          FedAvgM (Hsu et al. 2019): server momentum
``fedadam``          FedAdam (Reddi et al. 2020): server Adam
``fedfrozen_fedprox``   FedFrozen with FedProx in the frozen stage
``fedfrozen_scaffold``  FedFrozen with SCAFFOLD in the frozen stage
``fedfrozen_adaptive``  FedFrozen whose warm-up length a causal rule chooses during training
                        (:func:`linattn_theory.recommenders.run_online`, docs/theory.md §8)
==================== ===================================================================
"""

from __future__ import annotations

from . import fedadam, fedavg, fedavgm, fedfrozen, fedprox, scaffold, value_frozen
from .base import ClientRule, Round, ServerRule, Strategy

__all__ = ["STRATEGIES", "Strategy", "ClientRule", "ServerRule", "Round", "make_strategy",
           "effective_warmup_rounds"]

STRATEGIES = {
    "fedavg": fedavg.strategy,
    "fedfrozen": fedfrozen.strategy,
    "random_kernel": fedfrozen.random_kernel,
    "value_frozen": value_frozen.strategy,
    "fedprox": fedprox.strategy,
    "scaffold": scaffold.strategy,
    "fedavgm": fedavgm.strategy,
    "fedadam": fedadam.strategy,
    "fedfrozen_fedprox": fedfrozen.fedfrozen_fedprox,
    "fedfrozen_scaffold": fedfrozen.fedfrozen_scaffold,
    "fedfrozen_adaptive": fedfrozen.adaptive,
}

# strategies whose schedule changes at the configured warm-up length T0
_WARMUP_STRATEGIES = ("fedfrozen", "value_frozen", "fedfrozen_fedprox", "fedfrozen_scaffold")


def effective_warmup_rounds(strategy: str, rounds: int, warmup_rounds: int) -> int:
    """The round ``T0`` at which ``strategy`` freezes a block: ``warmup_rounds`` for the
    FedFrozen family, ``0`` for ``random_kernel``, ``T = rounds`` (never) for the others
    (``fedfrozen_adaptive`` chooses its ``T0`` during the run: its metadata's ``kernel_round``)."""
    if strategy == "random_kernel":
        return 0
    return warmup_rounds if strategy in _WARMUP_STRATEGIES else rounds


def make_strategy(fed, warmup_rounds: int) -> Strategy:
    """The :class:`Strategy` named by ``fed.strategy`` with the federated settings ``fed``."""
    try:
        factory = STRATEGIES[fed.strategy]
    except KeyError:
        raise ValueError(f"federated.strategy = {fed.strategy!r}: expected one of "
                         f"{', '.join(map(repr, STRATEGIES))}") from None
    return factory(fed, warmup_rounds)
