"""Wrong answers to the notebook's exercises: each check must report FAIL (tests/test_notebook.py).

Typical slips: a factor or a transpose wrong, the weights ignored (the clients weighed equally,
which is right only when they hold as many samples), an off-by-one, a wrong prediction; ``rescale``
raises, to show that an answer that crashes is a FAIL, not an abort.
"""

import numpy as np

from linattn_theory import context_second_moment

__all__ = ["rescale", "value_gradient", "server_average", "profile_by_least_squares",
           "bias_ratio_after_T_rounds", "drift_floor", "drift_floor_factor_when_zeta_doubles",
           "final_value_block", "best_warmup_shift"]


def rescale(params, c):
    """Crashes (a typo in a block name)."""
    return params.replace(WQ=c * params.WQ, Wv=params.WV / c)


def value_gradient(params, X, q, y):
    """φ e^T summed, not averaged, over the samples."""
    K = params.WQ[0] @ params.WK[0].T
    phi = context_second_moment(X) @ (q @ K)[..., None]
    e = phi[..., 0] @ params.WV[0] - y
    return np.sum(phi * e[:, None, :], axis=0)


def server_average(client_models, weights):
    """The unweighted mean."""
    return client_models.map(lambda block: np.mean(block, axis=0))


def profile_by_least_squares(K, clients):
    """The weights dropped: every client's mean loss counts the same (rows scaled by √(1/(m N_c)),
    not √(p_c/N_c)); right only for clients of equal size."""
    rows, targets = [], []
    for X, q, y in clients:
        scale = np.sqrt(1.0 / (len(clients) * len(y)))
        rows.append(scale * (context_second_moment(X) @ (q @ K)[..., None])[..., 0])
        targets.append(scale * y)
    Phi, Y = np.vstack(rows), np.vstack(targets)
    V = np.linalg.lstsq(Phi, Y, rcond=None)[0]
    return 0.5 * np.sum((Phi @ V - Y) ** 2)


def bias_ratio_after_T_rounds():
    """Client drift must make FedAvg's kernel worse: twice the bias."""
    return 2.0


def drift_floor(V_FA, V_star, A_tilde):
    """Without the ½."""
    gap = V_FA - V_star
    return np.trace(gap.T @ A_tilde @ gap)


def drift_floor_factor_when_zeta_doubles():
    """Linear instead of quadratic."""
    return 2.0


def final_value_block(V_T0, M, V_FA, k):
    """One frozen round short."""
    return V_FA + np.linalg.matrix_power(M, k - 1) @ (V_T0 - V_FA)


def best_warmup_shift():
    """More heterogeneity, a longer warm-up (the wrong sign)."""
    return 10.0
