"""The shape every federated strategy shares (docs/theory.md §3).

A strategy is three plain ingredients on explicit state, in the style of FedJAX algorithms
and Optax transformations:

- ``schedule(t) -> blocks``: the blocks (``"WQ"``, ``"WK"``, ``"WV"``) trained in round ``t``;
  the others are not touched, so they stay bit-identical;
- a :class:`ClientRule`: ``init(params, num_clients) -> state``, ``correction(state, round,
  anchor, local) -> {block: term}`` added to every local gradient (FedProx, SCAFFOLD), and
  ``update(state, round, anchor, local) -> state`` after the local steps (control variates);
- a :class:`ServerRule`: ``init(params) -> state`` and ``update(state, round, delta) ->
  (step, state)`` on the weighted mean delta ``Δ_b = Σ_c p̃_c θ_{c,b} − θ_b``; the server sets
  ``θ_b ← θ_b + step_b`` (FedAvg: ``step = η_s Δ``; FedAvgM, FedAdam: a server optimiser);
- optionally a :class:`Control`, the hook through which a strategy decides its schedule during
  the run: the engine calls ``observe(state, data)`` with every round's state and freezes the
  query/key block when it returns a :class:`Freeze` (the causal online rule, docs/theory.md §8,
  is such a strategy; it is defined with the recommenders, which the engine never imports).

The round engine (:func:`linattn_theory.sim.engine.run_schedule`) owns everything else: the
batched local steps of all participants, the frozen stage's precomputed features, the
measurements. ``anchor`` maps each trained block to ``θ^t_b`` (one model), ``local`` maps it to the
participants' current models ``θ_{c,b}`` (leading client axis); every term a rule returns has the
shape of ``local``. A strategy module exposes ``strategy(fed, warmup_rounds) -> Strategy``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...core.arrays import array_namespace
from ...core.model import BLOCKS, Params

__all__ = ["Round", "ClientRule", "ServerRule", "Strategy", "Control", "Freeze", "train_all", "freeze_after",
           "local_sgd", "server_sgd", "zeros_like_blocks", "scatter_clients", "take_clients",
           "weighted_sum", "instance_rows", "take_rows", "Declaration", "declare"]


class Round(NamedTuple):
    """What a strategy sees of round ``t``.

    ``participants`` are host indices of the clients of this round, ``client_weights`` their
    ``p_c`` (as in the objective) and ``weights`` the same renormalised to sum to one (``p̃_c``).

    Parameters
    ----------
    t : int
        The round.
    blocks : tuple of str
        The blocks it trains.
    participants : numpy.ndarray
        The clients taking part.
    num_clients : int
        All clients ``m``.
    client_weights, weights : array
        ``p_c`` and ``p̃_c`` of the participants.
    local_steps : int
        ``E``.
    learning_rate : float
        ``η``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import Round
    >>> rnd = Round(t=0, blocks=("WQ", "WK", "WV"), participants=np.array([0, 2]), num_clients=3,
    ...             client_weights=np.array([0.25, 0.25]), weights=np.array([0.5, 0.5]),
    ...             local_steps=1, learning_rate=0.1)              # clients 0 and 2 of m = 3
    >>> rnd.participants.tolist(), float(rnd.weights.sum())
    ([0, 2], 1.0)
    """

    t: int
    blocks: tuple[str, ...]
    participants: np.ndarray
    num_clients: int
    client_weights: Any
    weights: Any
    local_steps: int
    learning_rate: float


class ClientRule(NamedTuple):
    """Client side: a gradient correction during the local steps and a state update after them.

    Parameters
    ----------
    init : callable
        ``init(params, num_clients) -> state``.
    correction : callable
        ``correction(state, rnd, anchor, local) -> {block: term}``, at every local step: terms
        added to the gradients (``anchor``: the round's broadcast blocks, ``local``: the
        clients' current ones).
    update : callable
        ``update(state, rnd, anchor, local) -> state``, after the local steps.

    Examples
    --------
    >>> from linattn_theory.sim.strategies.base import ClientRule, local_sgd
    >>> isinstance(local_sgd(), ClientRule), ClientRule._fields
    (True, ('init', 'correction', 'update'))
    """

    init: Callable[[Params, int], Any]
    correction: Callable[[Any, Round, dict, dict], dict]
    update: Callable[[Any, Round, dict, dict], Any]


class ServerRule(NamedTuple):
    """Server side: the step ``θ_b ← θ_b + step_b`` taken from the weighted mean delta ``Δ_b``.

    Parameters
    ----------
    init : callable
        ``init(params) -> state``.
    update : callable
        ``update(state, rnd, delta) -> (step, state)``.

    Examples
    --------
    >>> from linattn_theory.sim.strategies.base import ServerRule, server_sgd
    >>> isinstance(server_sgd(), ServerRule), ServerRule._fields
    (True, ('init', 'update'))
    """

    init: Callable[[Params], Any]
    update: Callable[[Any, Round, dict], tuple[dict, Any]]


class Freeze(NamedTuple):
    """A control decision: freeze the query/key block now, at the kernel of round ``kernel_round``.

    The run continues from ``params`` (``θ^{kernel_round}``, a stored earlier state when the rule
    rolls back) with only ``W_V`` training; the rounds already spent stay counted against ``T``.

    Parameters
    ----------
    kernel_round : int
        The round whose kernel is frozen.
    params : Params
        ``θ^{kernel_round}``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.base import Freeze
    >>> decision = Freeze(kernel_round=3, params=lt.Params.init(d=6, r=3, p=2))
    >>> decision.kernel_round
    3
    """

    kernel_round: int
    params: Params


class Control(NamedTuple):
    """A strategy's per-round hook (docs/theory.md §8): the schedule is decided during the run.

    ``observe(state, data) -> Freeze | None`` sees the :class:`~linattn_theory.sim.engine.RunState`
    of every round the run reaches (round 0 included) and the stacked clients, until it returns a
    :class:`Freeze` (applied while rounds remain); ``finish(result) -> dict`` is merged into the
    run's metadata at the end.

    Parameters
    ----------
    observe : callable
        ``observe(state, data) -> Freeze | None``.
    finish : callable
        ``finish(result) -> dict``.

    Examples
    --------
    >>> from linattn_theory.sim.strategies.base import Control, Freeze
    >>> def observe(state, data):                      # freeze at round 3's kernel once it is reached
    ...     return Freeze(3, state.params) if state.round == 3 else None
    >>> control = Control(observe, finish=lambda result: {"kernel_round": 3})
    >>> control.finish(None)
    {'kernel_round': 3}
    """

    observe: Callable[[Any, Any], "Freeze | None"]
    finish: Callable[[Any], dict]


class Strategy(NamedTuple):
    """A federated strategy: which blocks train when, the client rule, the server rule and an
    optional per-round :class:`Control` (then ``schedule`` is followed until it freezes).

    Parameters
    ----------
    name : str
        Its name (``federated.strategy``).
    schedule : callable
        ``schedule(t) -> blocks`` trained in round ``t``.
    client : ClientRule
        The client side.
    server : ServerRule
        The server side.
    control : Control, optional
        The per-round hook.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies import make_strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> strategy = make_strategy(fed, 2)
    >>> strategy.name, strategy.schedule(1), strategy.schedule(2), strategy.control
    ('fedfrozen', ('WQ', 'WK', 'WV'), ('WV',), None)
    """

    name: str
    schedule: Callable[[int], tuple[str, ...]]
    client: ClientRule
    server: ServerRule
    control: Control | None = None


@dataclass(frozen=True)
class Declaration:
    """What the rest of the package needs to know of a strategy, declared next to its factory
    (:func:`declare`), so that adding a strategy is one module plus one registry line.

    ``freezes``: its schedule changes at the configured warm-up ``T0 = federated.warmup_rounds``
    (it reads that setting); ``warmup_rounds``: a ``T0`` fixed whatever the config
    (``random_kernel``: 0; a negative one counts from ``T``: ``value_solve_final``'s −1); neither: it never freezes (``T0 = T``). ``settings``: the further
    ``[federated]`` settings only some strategies read (``prox_mu``, ``server_momentum``, …; a
    config moving one off its default for a strategy that ignores it gets a warning).
    ``check(fed, given)``: raises :class:`~linattn_theory.core.errors.ConfigError` for settings it
    cannot run with (``given``: the keys the config's ``[federated]`` table sets). ``style``:
    ``(label, colour, marker[, line style])`` in every figure (a colour of
    :data:`linattn_theory.report.plotting.COLORS` or any Matplotlib colour); ``panel``: the
    panel of the strategies figure it is drawn in (a key of
    :data:`linattn_theory.report.plotting.PANELS`; ``None``: a reference drawn in every panel).

    Parameters
    ----------
    freezes : bool, default False
        Its schedule changes at ``T0 = federated.warmup_rounds``.
    warmup_rounds : int, optional
        A fixed ``T0`` (negative: counted from ``T``).
    settings : tuple of str, default ()
        The strategy-specific ``[federated]`` settings it reads.
    check : callable, optional
        ``check(fed, given)``, raising ``ConfigError`` for settings it cannot run with.
    style : tuple of str, default ()
        ``(label, colour, marker[, line style])`` in the figures.
    panel : str, optional
        Its panel of the strategies figure (``None``: every panel).

    Examples
    --------
    >>> from linattn_theory.sim.strategies import declaration
    >>> declared = declaration("fedfrozen_fedprox")
    >>> declared.freezes, declared.reads
    (True, ('warmup_rounds', 'prox_mu'))
    """

    freezes: bool = False
    warmup_rounds: int | None = None
    settings: tuple[str, ...] = ()
    check: Callable | None = None
    style: tuple[str, ...] = ()
    panel: str | None = None

    @property
    def reads(self) -> tuple[str, ...]:
        """The strategy-specific ``[federated]`` settings it reads (``warmup_rounds`` first if it freezes)."""
        return ("warmup_rounds",) * self.freezes + tuple(self.settings)


def declare(**declared) -> Callable:
    """Decorate a strategy factory with its :class:`Declaration` (``factory.declaration``).

    Parameters
    ----------
    **declared
        The :class:`Declaration`'s fields.

    Returns
    -------
    callable
        The decorator; it returns the factory with ``factory.declaration`` set.

    Examples
    --------
    >>> from linattn_theory.sim.strategies.base import declare
    >>> @declare(settings=("prox_mu",), style=("mine", "black", "o"))
    ... def mine(fed, warmup_rounds=None):
    ...     ...
    >>> mine.declaration.reads, mine.declaration.freezes
    (('prox_mu',), False)
    """
    declaration = Declaration(**declared)

    def attach(factory):
        factory.declaration = declaration
        return factory

    return attach


# -- schedules ----------------------------------------------------------------------------

def train_all(t: int) -> tuple[str, ...]:
    """Every block trains in every round (FedAvg and the optimisers built on it).

    Parameters
    ----------
    t : int
        The round.

    Returns
    -------
    tuple of str
        ``("WQ", "WK", "WV")``.

    Examples
    --------
    >>> from linattn_theory.sim.strategies.base import train_all
    >>> train_all(5)
    ('WQ', 'WK', 'WV')
    """
    return BLOCKS


def freeze_after(warmup_rounds: int, keep: tuple[str, ...]) -> Callable[[int], tuple[str, ...]]:
    """All blocks for ``t < T0``, then only ``keep`` (FedFrozen: ``keep = ("WV",)``).

    Parameters
    ----------
    warmup_rounds : int
        ``T0``.
    keep : tuple of str
        The blocks that train after it.

    Returns
    -------
    callable
        ``schedule(t) -> blocks``.

    Examples
    --------
    >>> from linattn_theory.sim.strategies.base import freeze_after
    >>> schedule = freeze_after(2, keep=("WV",))
    >>> [schedule(t) for t in range(4)]
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WV',), ('WV',)]
    """
    keep = tuple(b for b in BLOCKS if b in keep)

    def schedule(t: int) -> tuple[str, ...]:
        return BLOCKS if t < warmup_rounds else keep

    return schedule


# -- the plain rules (FedAvg) ---------------------------------------------------------------

def _no_state(*args):
    return None


def _no_correction(state, rnd: Round, anchor: dict, local: dict) -> dict:
    return {}


def _keep_state(state, rnd: Round, anchor: dict, local: dict):
    return state


def local_sgd() -> ClientRule:
    """Plain local gradient descent ``θ_c ← θ_c − η ∇F_{λ,c}(θ_c)``: no correction, no state.

    Returns
    -------
    ClientRule
        The rule.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.base import local_sgd
    >>> rule = local_sgd()
    >>> rule.init(lt.Params.init(d=6, r=3, p=2), 3), rule.correction(None, None, {}, {})
    (None, {})
    """
    return ClientRule(_no_state, _no_correction, _keep_state)


def server_sgd(learning_rate: float = 1.0) -> ServerRule:
    """FedAvg's server: ``θ ← θ + η_s Δ`` (``η_s = 1``: the weighted average of the client models).

    Parameters
    ----------
    learning_rate : float, default 1.0
        ``η_s``.

    Returns
    -------
    ServerRule
        The rule.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import Round
    >>> rnd = Round(t=0, blocks=("WQ", "WK", "WV"), participants=np.array([0, 2]), num_clients=3,
    ...             client_weights=np.array([0.25, 0.25]), weights=np.array([0.5, 0.5]),
    ...             local_steps=1, learning_rate=0.1)              # clients 0 and 2 of m = 3
    >>> from linattn_theory.sim.strategies.base import server_sgd
    >>> rule = server_sgd(0.5)
    >>> step, state = rule.update(rule.init(None), rnd, {"WV": np.ones((1, 6, 2))})
    >>> float(step["WV"][0, 0, 0]), state                  # η_s Δ
    (0.5, None)
    """

    def update(state, rnd: Round, delta: dict):
        return {b: learning_rate * d for b, d in delta.items()}, state

    return ServerRule(_no_state, update)


# -- helpers for stateful rules ---------------------------------------------------------------
#
# A rule sees one run (``rnd.participants`` of shape ``(k,)``: ``local`` blocks ``(k, H, d, r)``,
# ``anchor`` and server-side state ``(H, d, r)``) or an ensemble of runs
# (:func:`linattn_theory.sim.ensemble.simulate_many`: ``rnd.participants`` of shape ``(I, k)``,
# ``local`` ``(I, k, H, d, r)``, ``anchor`` and server-side state ``(I, 1, H, d, r)``, per-instance
# settings as arrays ``(I, 1, 1, 1, 1)``). Elementwise arithmetic broadcasts in both; these
# helpers do the rest, so a rule written with them runs either way.

def _client_axis(rnd_or_weights) -> int:
    """The client axis: 0 for one run, 1 for an ensemble (participants or weights of ndim 2)."""
    a = rnd_or_weights.participants if isinstance(rnd_or_weights, Round) else rnd_or_weights
    return len(a.shape) - 1


def zeros_like_blocks(params: Params, clients: int | None = None) -> dict:
    """``{block: 0}`` shaped like each block of ``params``; with ``clients``, one per client
    (``(clients, H, d, r)`` for one run, ``(I, clients, H, d, r)`` for an ensemble's ``(I, 1, H, d, r)``).

    Parameters
    ----------
    params : Params
        The shapes.
    clients : int, optional
        A leading client axis of that size.

    Returns
    -------
    dict of str to array
        The zeros.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.base import zeros_like_blocks
    >>> params = lt.Params.init(d=6, r=3, p=2)
    >>> zeros_like_blocks(params)["WQ"].shape, zeros_like_blocks(params, clients=4)["WV"].shape
    ((1, 6, 3), (4, 1, 6, 2))
    """
    xp = array_namespace(params.WV)

    def shape(a):
        if clients is None:
            return tuple(a.shape)
        return tuple(a.shape[:-4]) + (clients,) + tuple(a.shape[-3:])

    return {b: xp.zeros(shape(getattr(params, b)), dtype=params.WV.dtype) for b in BLOCKS}


def instance_rows(num_instances: int, num_clients: int, index) -> np.ndarray:
    """Flat row numbers ``i·m + index[i, j]`` of an ensemble's per-instance client indices.

    Parameters
    ----------
    num_instances : int
        The ensemble's instances.
    num_clients : int
        ``m``, the clients of each.
    index : array of int, shape (num_instances, k)
        Each instance's client indices.

    Returns
    -------
    numpy.ndarray, shape (num_instances · k,)
        The rows in the flattened ``(instance, client)`` axis.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import instance_rows
    >>> instance_rows(2, 3, np.array([[0, 2], [1, 2]])).tolist()
    [0, 2, 4, 5]
    """
    return (np.arange(num_instances)[:, None] * num_clients + index).reshape(-1)


def scatter_clients(full, part_values, rnd: Round):
    """Return ``full`` (client axis: all clients) with the participants' rows set to ``part_values``.

    Array-API clean (no item assignment): a gather through each client's position among the
    participants, then a masked select.

    Parameters
    ----------
    full : array
        Values of all clients (client axis first, after an ensemble's instance axis).
    part_values : array
        Values of the participants.
    rnd : Round
        The round (its participants).

    Returns
    -------
    array
        The updated values.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import Round
    >>> rnd = Round(t=0, blocks=("WQ", "WK", "WV"), participants=np.array([0, 2]), num_clients=3,
    ...             client_weights=np.array([0.25, 0.25]), weights=np.array([0.5, 0.5]),
    ...             local_steps=1, learning_rate=0.1)              # clients 0 and 2 of m = 3
    >>> from linattn_theory.sim.strategies.base import scatter_clients
    >>> scatter_clients(np.array([[1.0], [2.0], [3.0]]), np.array([[10.0], [30.0]]), rnd).tolist()
    [[10.0], [2.0], [30.0]]
    """
    part = np.asarray(rnd.participants)
    k, m = part.shape[-1], rnd.num_clients
    if k == m:
        return part_values
    xp = array_namespace(full, part_values)
    lead = part.shape[:-1]                       # () for one run, (I,) for an ensemble
    position = np.zeros(lead + (m,), dtype=np.int64)
    mask = np.zeros(lead + (m,), dtype=bool)
    np.put_along_axis(position, part, np.broadcast_to(np.arange(k), part.shape), axis=-1)
    np.put_along_axis(mask, part, True, axis=-1)
    gathered = take_rows(part_values, position)
    mask = xp.reshape(xp.asarray(mask), mask.shape + (1,) * (full.ndim - mask.ndim))
    return xp.where(mask, gathered, full)


def weighted_sum(weights, a):
    """``Σ_c w_c a_c`` over the client axis: ``weights`` ``(k,)`` and ``a`` ``(k, ...)`` give ``(...)``;
    an ensemble's ``(I, k)`` and ``(I, k, ...)`` give ``(I, 1, ...)`` (the client axis kept).

    Parameters
    ----------
    weights : array, shape (k,) or (I, k)
        The weights.
    a : array, shape (k, ...) or (I, k, ...)
        The values.

    Returns
    -------
    array
        The sum.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import weighted_sum
    >>> weighted_sum(np.array([0.5, 0.5]), np.array([[1.0], [3.0]])).tolist()
    [2.0]
    >>> weighted_sum(np.array([[0.5, 0.5]]), np.array([[[1.0], [3.0]]])).shape    # an ensemble: (I, 1, ...)
    (1, 1, 1)
    """
    xp = array_namespace(weights, a)
    axis = _client_axis(weights)
    w = xp.reshape(weights, tuple(weights.shape) + (1,) * (a.ndim - weights.ndim))
    return xp.sum(w * a, axis=axis, keepdims=axis > 0)


def take_clients(full, rnd: Round):
    """The participants' rows of ``full`` (client axis: all clients).

    Parameters
    ----------
    full : array
        Values of all clients.
    rnd : Round
        The round.

    Returns
    -------
    array
        The participants' values.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import Round
    >>> rnd = Round(t=0, blocks=("WQ", "WK", "WV"), participants=np.array([0, 2]), num_clients=3,
    ...             client_weights=np.array([0.25, 0.25]), weights=np.array([0.5, 0.5]),
    ...             local_steps=1, learning_rate=0.1)              # clients 0 and 2 of m = 3
    >>> from linattn_theory.sim.strategies.base import take_clients
    >>> take_clients(np.array([[1.0], [2.0], [3.0]]), rnd).tolist()
    [[1.0], [3.0]]
    """
    part = np.asarray(rnd.participants)
    return full if part.shape[-1] == rnd.num_clients else take_rows(full, part)


def take_rows(full, index):
    """Rows ``index`` of the client axis of ``full``: ``full[index[j]]`` for one run (``index``
    ``(k,)``, ``full`` ``(m, ...)``), ``full[i, index[i, j]]`` for an ensemble (``index`` ``(I, k)``,
    ``full`` ``(I, m, ...)``); a gather, as the Array API has it (:func:`instance_rows`).

    Parameters
    ----------
    full : array, shape (m, ...) or (I, m, ...)
        Values of all clients.
    index : array of int, shape (k,) or (I, k)
        The rows (host integers).

    Returns
    -------
    array, shape (k, ...) or (I, k, ...)
        The rows.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.sim.strategies.base import take_rows
    >>> take_rows(np.array([[1.0], [2.0], [3.0]]), np.array([2, 0])).tolist()
    [[3.0], [1.0]]
    >>> take_rows(np.arange(6.0).reshape(2, 3), np.array([[0, 2], [1, 1]])).tolist()    # an ensemble
    [[0.0, 2.0], [4.0, 4.0]]
    """
    xp = array_namespace(full)
    index = np.asarray(index)
    if index.ndim == 1:
        return xp.take(full, xp.asarray(index), axis=0)
    I, m = full.shape[0], full.shape[1]
    flat = xp.reshape(full, (I * m,) + tuple(full.shape[2:]))
    rows = xp.take(flat, xp.asarray(instance_rows(I, m, index)), axis=0)
    return xp.reshape(rows, index.shape + tuple(full.shape[2:]))
