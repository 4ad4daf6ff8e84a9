"""The server's exact value solve: FedAvg, then one round in which the server solves the value block
in closed form from the clients' value moments (docs/theory.md §3 and §5).

The idea is that of Fed3R: Fanì, Camoriano, Caputo, Ciccone, "Accelerating Heterogeneous Federated
Learning with Closed-Form Classifiers", ICML 2024 (arXiv:2406.01116): a ridge-regression head solved
once from statistics the clients send, which heterogeneity does not bias. Here the head is the value
block: for a fixed kernel the model is linear in ``V`` (docs/theory.md §4) and

    V*_λ(K) = Ã⁻¹ B,    Ã = Σ_c p_c A_c + λI,    B = Σ_c p_c B_c,

the centralised optimum itself, so the solve has **no drift floor by construction**
(``F_λ(K, V*_λ) = Φ_λ(K)``; FedAvg's frozen stage stops at ``V_FA`` and pays ``D(K)``, §5).

``value_solve``: FedAvg (every block) for rounds ``t < T0``; in round ``T0`` every client sends its
value moments ``(A_c, B_c)`` at the kernel ``K_{T0}`` and the server sets ``V = V*_λ(K_{T0})`` (the
local steps the engine runs in that round are discarded); the kernel stays frozen and rounds
``T0+1 .. T−1`` are FedFrozen's value-only FedAvg rounds from ``V*`` (which drift back towards
``V_FA``). ``value_solve_final``: FedAvg for ``T − 1`` rounds, the solve in the last round
(``T0 = T − 1``): the final model is ``(K_{T−1}, V*_λ(K_{T−1}))`` and its excess risk is the
kernel-profile bias ``Φ_λ(K_{T−1}) − Φ*_λ`` alone. The solve is one of the ``T`` rounds, so every
arm communicates ``T`` times; it uses every client (whatever ``participation``) and their full data
(whatever ``batch_size``).

**Communication.** In the solve round each client sends ``A_c`` and ``B_c``: ``(Hd)² + Hdp``
numbers (``Hd(Hd+1)/2 + Hdp`` using the symmetry of ``A_c``), against ``2Hdr + Hdp`` for a FedAvg
round's model; the server sends ``V*`` back (``Hdp``).

The solve is made through the strategy's :class:`~.base.Control`, the hook that sees the stacked
clients: at the state of round ``T0`` it computes ``V*`` and the server rule of round ``T0`` steps
there; it never freezes a run itself, so :func:`~linattn_theory.sim.ensemble.simulate_many` runs
these strategies one by one (:func:`~linattn_theory.sim.engine.simulate`).
"""

from __future__ import annotations

import numpy as np

from ...core.arrays import array_namespace, to_numpy
from ...core.model import kernel
from ...core.moments import value_moments
from .base import Control, ServerRule, Strategy, declare, freeze_after, local_sgd, server_sgd

__all__ = ["NAME", "strategy", "value_solve_final", "solve_value_block"]

NAME = "value_solve"
FROZEN = ("WV",)


def solve_value_block(K, data, ridge: float) -> np.ndarray:
    """``V*_λ(K) = (Σ_c p_c A_c + λI)⁻¹ Σ_c p_c B_c`` from the clients' value moments (host array ``(H·d, p)``).

    Solved in float64; with ``λ = 0`` and a singular ``A`` the minimum-norm solution (docs/theory.md §4).

    Parameters
    ----------
    K : array, shape (H, d, d)
        The kernels.
    data : StackedClients
        The clients.
    ridge : float
        ``λ``.

    Returns
    -------
    numpy.ndarray, shape (H·d, p)
        ``V*_λ(K)``, float64.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.sim.strategies.value_solve import solve_value_block
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> data, params = prepare_run(config)
    >>> solve_value_block(lt.kernel(params), data, ridge=0.1).shape           # H·d = 6, p = 2
    (6, 2)
    """
    moments = value_moments(K, data, ridge)
    A, B, p = (np.asarray(to_numpy(a), dtype=np.float64) for a in (moments.A, moments.B, moments.weights))
    A_tilde = np.einsum("c,cij->ij", p, A) + ridge * np.eye(A.shape[-1])
    B_mean = np.einsum("c,cij->ij", p, B)
    try:
        return np.linalg.solve(A_tilde, B_mean)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(A_tilde, B_mean, rcond=None)[0]


def _solve_at(solve_round: int, fed) -> tuple[Control, ServerRule]:
    """The control that solves at the state of round ``solve_round`` and the server rule that steps there."""
    pending = {}
    fedavg = server_sgd(fed.server_learning_rate)

    def observe(state, data):
        if state.round == solve_round:
            WV = state.params.WV
            xp = array_namespace(WV)
            V = solve_value_block(kernel(state.params), data, fed.ridge)
            pending["WV"] = xp.asarray(V.reshape(tuple(WV.shape)), dtype=WV.dtype) - WV
        return None

    def update(state, rnd, delta):
        if rnd.t != solve_round or "WV" not in pending:    # no solve seen: a run that diverged before it
            return fedavg.update(state, rnd, delta)
        return {"WV": pending.pop("WV")}, state

    return Control(observe, lambda result: {}), ServerRule(fedavg.init, update)


@declare(freezes=True, style=(r"value solve at $T_0$, then FedAvg", "vermillion", "x"), panel="fedfrozen")
def strategy(fed, warmup_rounds: int) -> Strategy:
    """FedAvg for ``t < T0 = warmup_rounds``, the exact value solve in round ``T0``, then value-only FedAvg.

    Parameters
    ----------
    fed : FederatedConfig
        The schedule and the strategy's settings (``config.federated``).
    warmup_rounds : int
        ``T0``, the round of the solve.

    Returns
    -------
    Strategy
        The strategy.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.value_solve import strategy
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [strategy(fed, 2).schedule(t) for t in range(4)]      # the solve in round T0 = 2
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WV',), ('WV',)]
    """
    control, server = _solve_at(warmup_rounds, fed)
    return Strategy(NAME, freeze_after(warmup_rounds, FROZEN), local_sgd(), server, control)


@declare(warmup_rounds=-1, style=("FedAvg, value solve in the last round", "brown", "+"), panel="fedfrozen")
def value_solve_final(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedAvg for ``T − 1`` rounds, the exact value solve in the last round (``warmup_rounds`` is not used).

    Parameters
    ----------
    fed : FederatedConfig
        The schedule and the strategy's settings (``config.federated``).
    warmup_rounds : int, optional
        Not used (the solve is in round ``T − 1``).

    Returns
    -------
    Strategy
        The strategy.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.strategies.value_solve import value_solve_final
    >>> fed = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}).federated
    >>> [value_solve_final(fed, 2).schedule(t) for t in range(4)]
    [('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WQ', 'WK', 'WV'), ('WV',)]
    """
    return strategy(fed, fed.rounds - 1)._replace(name="value_solve_final")
