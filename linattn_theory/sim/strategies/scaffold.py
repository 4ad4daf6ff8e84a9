"""SCAFFOLD: Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (arXiv:1910.06378), Algorithm 1 with option II;
docs/theory.md §3 and §5.

The server holds a control variate ``c``, client ``c`` holds ``c_i`` (both zero at the start).
Local steps follow the corrected gradient ``∇F_{λ,c}(θ_c) − c_i + c``; afterwards

    c_i⁺ = c_i − c + (θ^t − θ_c) / (E η),        c ← c + Σ_{i ∈ S} p_i (c_i⁺ − c_i),

so ``c = Σ_c p_c c_c`` at every round (the paper's uniform ``1/N`` becomes the objective's
weights ``p_c``); the model is averaged as in FedAvg. On the frozen-stage quadratic with full
participation and full batch the fixed point is the centralised ``V*_λ(K) = Ã^{-1}B``: the
control variates remove the value drift floor of docs/theory.md §5.
"""

from __future__ import annotations

from .base import (ClientRule, Strategy, declare, scatter_clients, server_sgd, take_clients, train_all, weighted_sum, zeros_like_blocks)

__all__ = ["NAME", "control_variates", "strategy"]

NAME = "scaffold"


def control_variates(stage: tuple[str, ...] | None = None) -> ClientRule:
    """SCAFFOLD's client rule, in every round or (``stage``) only in the rounds that train exactly
    the blocks ``stage`` (the control variates stay zero before); state ``(c, c_i)`` as
    ``{block: array}`` dicts.

    Parameters
    ----------
    stage : tuple of str, optional
        The blocks of the rounds it acts in; default every round.

    Returns
    -------
    ClientRule
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
    >>> anchor = {block: np.zeros_like(getattr(params, block)) for block in ("WQ", "WK", "WV")}         # θ^t = 0
    >>> local = {block: np.ones((2,) + getattr(params, block).shape) for block in ("WQ", "WK", "WV")}  # θ_c = 1
    >>> from linattn_theory.sim.strategies.scaffold import control_variates
    >>> rule = control_variates()
    >>> correction = rule.correction(rule.init(params, 3), rnd, anchor, local)
    >>> {block: float(abs(term).max()) for block, term in correction.items()}     # c − c_i = 0 at the start
    {'WQ': 0.0, 'WK': 0.0, 'WV': 0.0}
    """

    def active(rnd):
        return stage is None or tuple(rnd.blocks) == tuple(stage)

    def init(params, num_clients):
        return zeros_like_blocks(params), zeros_like_blocks(params, num_clients)

    def correction(state, rnd, anchor, local):
        if not active(rnd):
            return {}
        server, clients = state
        return {b: server[b] - take_clients(clients[b], rnd) for b in rnd.blocks}

    def update(state, rnd, anchor, local):
        if not active(rnd):
            return state
        server, clients = dict(state[0]), dict(state[1])
        inverse_step = 1.0 / (rnd.local_steps * rnd.learning_rate)
        for b in rnd.blocks:
            old = take_clients(clients[b], rnd)
            new = old - server[b] + (anchor[b] - local[b]) * inverse_step
            server[b] = server[b] + weighted_sum(rnd.client_weights, new - old)
            clients[b] = scatter_clients(clients[b], new, rnd)
        return server, clients

    return ClientRule(init, correction, update)


@declare(style=("SCAFFOLD", "green", "D"), panel="baselines")
def strategy(fed, warmup_rounds: int | None = None) -> Strategy:
    """SCAFFOLD on every block in every round, server step ``η_g = fed.server_learning_rate``.

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
    >>> from linattn_theory.sim.strategies.scaffold import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]      # every block, every round
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV')]
    """
    return Strategy(NAME, train_all, control_variates(), server_sgd(fed.server_learning_rate))
