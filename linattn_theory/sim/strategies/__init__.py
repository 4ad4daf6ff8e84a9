"""Federated strategies, one module each, all of the same shape (docs/theory.md §3).

Each module cites its paper and exposes ``strategy(fed, warmup_rounds) -> Strategy`` built from
a schedule (which blocks train in round ``t``), a client rule (gradient correction, client
state) and a server rule (the step on the weighted mean delta); see :mod:`.base`. Strategies
are chosen by name in configs (``federated.strategy``):

====================== ===================================================================
``fedavg``             FedAvg (McMahan et al. 2017): every block, every round
``fedfrozen``          FedFrozen: all blocks for ``t < T0``, then only ``W_V``
``random_kernel``      FedFrozen with ``T0 = 0``: the random initial kernel stays frozen
``value_frozen``       all blocks for ``t < T0``, then only ``W_Q, W_K``
``fedprox``            FedProx (Li et al. 2018), proximal weight ``μ``
``scaffold``           SCAFFOLD (Karimireddy et al. 2020), control variates
``fedavgm``            FedAvgM (Hsu et al. 2019): server momentum
``fedadam``            FedAdam (Reddi et al. 2020): server Adam
``fedfrozen_fedprox``  FedFrozen with FedProx in the frozen stage
``fedfrozen_scaffold`` FedFrozen with SCAFFOLD in the frozen stage
``fedfrozen_adaptive`` FedFrozen whose warm-up length a causal rule chooses during training
                       (:mod:`linattn_theory.recommenders.online`, docs/theory.md §8; registered
                       by the package, see :func:`register_strategy`)
====================== ===================================================================

The registry maps names to factories or to ``"module:attribute"`` references imported on first
use, so that a strategy defined in a higher layer (the online rule lives with the recommenders)
is registered without this package importing it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from ...core.lazy import attach

if TYPE_CHECKING:
    from .base import Strategy

#: the shared shape of a strategy (:mod:`.base`), imported on first use: registering a strategy
#: (which the package does at import) stays free of NumPy
__getattr__, __dir__, _base_names = attach(__name__, {
    ".base": ["ClientRule", "Control", "Freeze", "Round", "ServerRule", "Strategy"]})

__all__ = ["STRATEGIES", "make_strategy", "register_strategy", "effective_warmup_rounds", *_base_names]


class _Registry(Mapping):
    """Strategy factories by name; a ``"module:attribute"`` entry is imported when first used."""

    def __init__(self, entries: dict):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Callable:
        factory = self._entries[name]
        if isinstance(factory, str):
            module, _, attribute = factory.partition(":")
            factory = getattr(importlib.import_module(module, __name__), attribute)
            self._entries[name] = factory
        return factory

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


STRATEGIES = _Registry({
    "fedavg": ".fedavg:strategy",
    "fedfrozen": ".fedfrozen:strategy",
    "random_kernel": ".fedfrozen:random_kernel",
    "value_frozen": ".value_frozen:strategy",
    "fedprox": ".fedprox:strategy",
    "scaffold": ".scaffold:strategy",
    "fedavgm": ".fedavgm:strategy",
    "fedadam": ".fedadam:strategy",
    "fedfrozen_fedprox": ".fedfrozen:fedfrozen_fedprox",
    "fedfrozen_scaffold": ".fedfrozen:fedfrozen_scaffold",
})


def register_strategy(name: str, factory: "Callable | str") -> None:
    """Make ``federated.strategy = name`` run ``factory(fed, warmup_rounds) -> Strategy``.

    ``factory`` is a callable or an absolute ``"module:attribute"`` reference, imported on first
    use. Registering a name twice with another factory is an error.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"strategy name {name!r}: expected an identifier")
    known = STRATEGIES._entries.get(name)
    if known is not None and known != factory:
        raise ValueError(f"strategy {name!r} is registered already")
    STRATEGIES._entries[name] = factory


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
    if fed.strategy not in STRATEGIES:
        raise ValueError(f"federated.strategy = {fed.strategy!r}: expected one of "
                         f"{', '.join(map(repr, STRATEGIES))}")
    return STRATEGIES[fed.strategy](fed, warmup_rounds)
