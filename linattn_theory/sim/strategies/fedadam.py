"""FedAdam: Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2 (docs/theory.md §3).

Clients run plain local gradient descent; the server treats ``Δ = Σ_c p̃_c θ_c − θ^t`` as a
pseudo-gradient (a descent direction) and, per coordinate,

    m ← β1 m + (1 − β1) Δ,    v ← β2 v + (1 − β2) Δ²,    θ^{t+1} = θ^t + η_s m / (√v + τ),

with ``m = 0`` and ``v = τ²`` initially and no bias correction, as in the paper. The step is
about ``η_s`` per coordinate, so ``η_s`` (``server_learning_rate``) is much smaller than FedAvg's 1.
"""

from __future__ import annotations

from ...core.arrays import array_namespace
from .base import ServerRule, Strategy, local_sgd, train_all, zeros_like_blocks

__all__ = ["NAME", "adam", "strategy"]

NAME = "fedadam"


def adam(learning_rate: float, beta1: float, beta2: float, epsilon: float) -> ServerRule:
    """The FedAdam server rule; state ``(m, v)``, each ``{block: array}``."""

    def init(params):
        zeros = zeros_like_blocks(params)
        return zeros, {b: z + epsilon * epsilon for b, z in zeros.items()}

    def update(state, rnd, delta):
        m, v = dict(state[0]), dict(state[1])
        step = {}
        for b, d in delta.items():
            xp = array_namespace(d)
            m[b] = beta1 * m[b] + (1.0 - beta1) * d
            v[b] = beta2 * v[b] + (1.0 - beta2) * (d * d)
            step[b] = learning_rate * m[b] / (xp.sqrt(v[b]) + epsilon)
        return step, (m, v)

    return ServerRule(init, update)


def strategy(fed, warmup_rounds: int | None = None) -> Strategy:
    """FedAdam with ``η_s = fed.server_learning_rate``, ``β1, β2 = fed.server_beta1/2``, ``τ = fed.server_epsilon``."""
    return Strategy(NAME, train_all, local_sgd(),
                    adam(fed.server_learning_rate, fed.server_beta1, fed.server_beta2,
                         fed.server_epsilon))
