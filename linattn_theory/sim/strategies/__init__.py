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
``value_solve``        FedAvg for ``t < T0``, the server's exact value solve ``V*_λ(K_{T0})`` from
                       the clients' value moments in round ``T0`` (Fed3R, Fanì et al. 2024), then
                       value-only FedAvg
``value_solve_final``  FedAvg for ``T − 1`` rounds, the exact value solve in the last round
``fedfrozen_adaptive`` FedFrozen whose warm-up length a causal rule chooses during training
                       (:mod:`linattn_theory.recommenders.online`, docs/theory.md §8; registered
                       by the package, see :func:`register_strategy`)
====================== ===================================================================

The registry maps names to factories or to ``"module:attribute"`` references imported on first
use, so that a strategy defined in a higher layer (the online rule lives with the recommenders)
is registered without this package importing it. Each factory carries what the rest of the
package needs to know of it (:class:`~.base.Declaration`, ``@declare(...)``): whether and when it
freezes, the settings it reads and checks, its style in the figures. Adding a strategy is its
module plus one line in :data:`STRATEGIES` (docs/howto/add-strategy.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core.lazy import Registry, attach

if TYPE_CHECKING:
    from .base import Declaration, Strategy

#: the shared shape of a strategy (:mod:`.base`), imported on first use: registering a strategy
#: (which the package does at import) stays free of NumPy
__getattr__, __dir__, _base_names = attach(__name__, {
    ".base": ["ClientRule", "Control", "Declaration", "Freeze", "Round", "ServerRule", "Strategy", "declare"]})

__all__ = ["STRATEGIES", "make_strategy", "register_strategy", "declaration", "strategy_settings",
           "effective_warmup_rounds", *_base_names]


#: strategy factories by name, ``factory(fed, warmup_rounds) -> Strategy``, each carrying its
#: :class:`~.base.Declaration` (``@declare(...)``); ``"module:attribute"`` entries are imported on first use
STRATEGIES = Registry({
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
    "value_solve": ".value_solve:strategy",
    "value_solve_final": ".value_solve:value_solve_final",
}, __name__, "strategy")


def register_strategy(name: str, factory: "Callable | str") -> None:
    """Make ``federated.strategy = name`` run ``factory(fed, warmup_rounds) -> Strategy``.

    ``factory`` is a callable or an absolute ``"module:attribute"`` reference, imported on first
    use. Registering a name twice with another factory is an error.

    Parameters
    ----------
    name : str
        The strategy's name (an identifier), the value of ``federated.strategy``.
    factory : callable or str
        ``factory(fed, warmup_rounds) -> Strategy``, or a ``"module:attribute"`` reference to one.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.sim.strategies import register_strategy
    >>> register_strategy("fedavg", "linattn_theory.sim.strategies.fedprox:strategy")
    Traceback (most recent call last):
    ...
    ValueError: strategy 'fedavg' is registered already

    docs/howto/add-strategy.md registers a strategy of its own.
    """
    STRATEGIES.register(name, factory)


def declaration(name: str) -> Declaration:
    """What strategy ``name`` declares of itself (:class:`~.base.Declaration`; imports its module).

    Parameters
    ----------
    name : str
        A registered strategy.

    Returns
    -------
    Declaration
        Its declaration (an empty one where it declares nothing).

    Examples
    --------
    >>> from linattn_theory.sim.strategies import declaration
    >>> declaration("fedprox").settings, declaration("fedfrozen").freezes
    (('prox_mu',), True)
    """
    from .base import Declaration
    return getattr(STRATEGIES[name], "declaration", None) or Declaration()


def strategy_settings() -> dict[str, tuple[str, ...]]:
    """``{setting: the strategies that read it}`` for every strategy-specific ``[federated]``
    setting, from the strategies' declarations (in registry order).

    Returns
    -------
    dict of str to tuple of str
        The strategies that read each setting, in registry order.

    Examples
    --------
    >>> from linattn_theory.sim.strategies import strategy_settings
    >>> strategy_settings()["prox_mu"]
    ('fedprox', 'fedfrozen_fedprox')
    """
    readers: dict[str, tuple[str, ...]] = {}
    for name in STRATEGIES:
        for setting in declaration(name).reads:
            readers[setting] = readers.get(setting, ()) + (name,)
    return readers


def effective_warmup_rounds(strategy: str, rounds: int, warmup_rounds: int) -> int:
    """The round ``T0`` at which ``strategy`` freezes a block: ``warmup_rounds`` for a strategy that
    declares ``freezes`` (the FedFrozen family), its fixed ``T0`` for one that declares it
    (``random_kernel``: 0; ``value_solve_final``: −1, the last round ``T − 1``), ``T = rounds`` (never) for the others (``fedfrozen_adaptive`` chooses its
    ``T0`` during the run: its metadata's ``kernel_round``).

    Parameters
    ----------
    strategy : str
        The strategy's name.
    rounds : int
        ``T``.
    warmup_rounds : int
        The configured ``T0`` (``federated.warmup_rounds``).

    Returns
    -------
    int
        The ``T0`` the strategy runs with.

    Examples
    --------
    >>> from linattn_theory.sim.strategies import effective_warmup_rounds
    >>> [effective_warmup_rounds(name, 20, 5) for name in ("fedfrozen", "fedavg", "random_kernel", "value_solve_final")]
    [5, 20, 0, 19]
    """
    declared = declaration(strategy) if strategy in STRATEGIES else None
    if declared is not None and declared.warmup_rounds is not None:     # a negative T0 counts from T
        fixed = declared.warmup_rounds
        return fixed if fixed >= 0 else rounds + fixed
    return warmup_rounds if declared is not None and declared.freezes else rounds


def make_strategy(fed, warmup_rounds: int) -> Strategy:
    """The :class:`Strategy` named by ``fed.strategy`` with the federated settings ``fed``.

    Parameters
    ----------
    fed : FederatedConfig
        The federated settings; ``fed.strategy`` names the strategy.
    warmup_rounds : int
        ``T0``.

    Returns
    -------
    Strategy
        The strategy (schedule, client rule, server rule).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies import make_strategy
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2, "strategy": "fedprox"}})
    >>> make_strategy(config.federated, 2).name
    'fedprox'
    """
    if fed.strategy not in STRATEGIES:
        raise ValueError(f"federated.strategy = {fed.strategy!r}: expected one of "
                         f"{', '.join(map(repr, STRATEGIES))}")
    return STRATEGIES[fed.strategy](fed, warmup_rounds)
