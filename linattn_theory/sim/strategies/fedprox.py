"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020 (arXiv:1812.06127); docs/theory.md §3 and §5.

Each participant minimises ``F_{λ,c}(θ) + (μ/2)‖θ − θ^t‖²`` by ``E`` local gradient steps, i.e.
the local gradient gains the proximal term ``μ(θ_c − θ^t)``; the server averages as FedAvg.
``μ = 0`` is FedAvg, bit for bit (the term is an exact ``+0``).

Frozen stage (derivations/fedprox.py): with ``G_c = I − η(Ã_c + μI)`` and ``S_c = Σ_{j<E} G_c^j``
the round is ``V ← Σ_c p_c [(G_c^E + ημ S_c) V + η S_c B_c]``, whose fixed point is

    V_prox = (Σ_c p_c S_c Ã_c)^{-1} Σ_c p_c S_c B_c
           = (Σ_c p_c W_c)^{-1} Σ_c p_c W_c V*_c,   W_c = P_c (Ã_c + μI)^{-1} Ã_c,

``P_c = I − G_c^E``: a weighted mean of the clients' optima like FedAvg's ``V_FA`` (``μ = 0``),
equal to ``V*_λ`` only for ``E = 1``. The proximal term does not remove the drift floor.
"""

from __future__ import annotations

import numpy as np

from ...core.arrays import to_numpy
from .base import ClientRule, Strategy, declare, server_sgd, train_all

__all__ = ["NAME", "proximal", "strategy", "frozen_fixed_point"]

NAME = "fedprox"


def proximal(mu: float, stage: tuple[str, ...] | None = None) -> ClientRule:
    """Add ``μ(θ_c − θ^t)`` to every local gradient of the trained blocks: in every round, or
    (``stage``) only in the rounds that train exactly the blocks ``stage`` (FedFrozen's frozen
    stage: ``("WV",)``).

    Parameters
    ----------
    mu : float
        ``μ ≥ 0``.
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
    >>> from linattn_theory.sim.strategies.fedprox import proximal
    >>> rule = proximal(0.5)
    >>> {block: float(term[0, 0, 0, 0]) for block, term in rule.correction(rule.init(params, 3), rnd, anchor, local).items()}
    {'WQ': 0.5, 'WK': 0.5, 'WV': 0.5}
    >>> frozen_only = proximal(0.5, stage=("WV",))                 # this round trains every block: no term
    >>> frozen_only.correction(frozen_only.init(params, 3), rnd, anchor, local)
    {}
    """

    def correction(state, rnd, anchor, local):
        if stage is not None and tuple(rnd.blocks) != tuple(stage):
            return {}
        return {b: mu * (local[b] - anchor[b]) for b in rnd.blocks}

    return ClientRule(lambda params, num_clients: None, correction, lambda state, *args: state)


@declare(settings=("prox_mu",), style=("FedProx", "light_blue", "^"), panel="baselines")
def strategy(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedProx with ``μ = fed.prox_mu`` on every block in every round.

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
    >>> from linattn_theory.sim.strategies.fedprox import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]      # every block, every round
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV')]
    """
    return Strategy(NAME, train_all, proximal(fed.prox_mu), server_sgd(fed.server_learning_rate))


def frozen_fixed_point(K, clients, learning_rate: float, local_steps: int, ridge: float = 0.0,
                       mu: float = 0.0) -> np.ndarray:
    """FedProx's frozen-stage fixed point ``V_prox = (Σ_c p_c S_c Ã_c)^{-1} Σ_c p_c S_c B_c``.

    ``S_c = Σ_{j<E} (I − η(Ã_c + μI))^j`` (derivations/fedprox.py); ``μ = 0`` gives FedAvg's
    ``V_FA`` (docs/theory.md §5). Returns the stacked value block ``(H·d, p)`` (host array).

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        The frozen kernels.
    clients : FederatedDataset or StackedClients
        The clients.
    learning_rate : float
        ``η``.
    local_steps : int
        ``E``.
    ridge : float, default 0.0
        ``λ``.
    mu : float, default 0.0
        ``μ``.

    Returns
    -------
    numpy.ndarray, shape (H·d, p)
        ``V_prox``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.fedprox import frozen_fixed_point
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> bool(np.allclose(frozen_fixed_point(K, clients, 0.05, 5), lt.fedavg_fixed_point(K, clients, 0.05, 5)))
    True
    """
    from ...core.moments import value_moments

    moments = value_moments(K, clients)
    A, B, p = (to_numpy(a) for a in (moments.A, moments.B, moments.weights))
    identity = np.eye(A.shape[-1])
    lhs = np.zeros_like(A[0])
    rhs = np.zeros_like(B[0])
    for A_c, B_c, p_c in zip(A, B, p):
        A_reg = A_c + ridge * identity
        G = identity - learning_rate * (A_reg + mu * identity)
        S, power = np.zeros_like(G), identity
        for _ in range(local_steps):
            S, power = S + power, power @ G
        lhs += p_c * S @ A_reg
        rhs += p_c * S @ B_c
    return np.linalg.solve(lhs, rhs)
