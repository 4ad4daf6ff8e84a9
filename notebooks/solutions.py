"""Solutions to the exercises of ``bias_drift_tradeoff.py`` (try them yourself first).

Each function has the name and signature of an exercise stub in the notebook and depends on its
arguments only. ``python notebooks/execute.py --solutions notebooks/solutions.py`` runs the
notebook with these answers in place of the stubs (the tests do this and expect every exercise to
pass). The predictions are those for the notebook's settings (``E = 20``, ``ζ_V`` from 0.5 to 2,
clients of 128 and 64 samples).
"""

import numpy as np

from linattn_theory import context_second_moment

__all__ = ["rescale", "value_gradient", "server_average", "profile_by_least_squares",
           "bias_ratio_after_T_rounds", "drift_floor", "drift_floor_factor_when_zeta_doubles",
           "final_value_block", "best_warmup_shift"]


def rescale(params, c):
    """Parameters with kernel c·K and value matrix W_V / c."""
    return params.replace(WQ=c * params.WQ, WV=params.WV / c)


def value_gradient(params, X, q, y):
    """∇_{W_V} of the batch loss: the mean over samples of φ e^T, shape (d, p), for one head."""
    K = params.WQ[0] @ params.WK[0].T
    phi = context_second_moment(X) @ (q @ K)[..., None]         # φ = Ŝ K^T q, shape (N, d, 1)
    e = phi[..., 0] @ params.WV[0] - y                           # e = ŷ − y, shape (N, p)
    return np.mean(phi * e[:, None, :], axis=0)


def server_average(client_models, weights):
    """Σ_c p_c θ_c^{t,E} block by block; client_models is a Params with a leading client axis."""
    return client_models.map(lambda block: np.tensordot(weights, block, axes=1))


def profile_by_least_squares(K, clients):
    """Φ_0(K) for a one-head kernel K of shape (d, d), by weighted least squares."""
    rows, targets = [], []
    for p_c, (X_c, q_c, y_c) in zip(clients.weights, clients):
        phi_c = (context_second_moment(X_c) @ (q_c @ K)[..., None])[..., 0]
        scale = np.sqrt(p_c / len(y_c))
        rows.append(scale * phi_c)
        targets.append(scale * y_c)
    Phi, Y = np.vstack(rows), np.vstack(targets)
    V = np.linalg.lstsq(Phi, Y, rcond=None)[0]
    return 0.5 * np.sum((Phi @ V - Y) ** 2)


def bias_ratio_after_T_rounds():
    """bias(FedAvg's K_T) / bias(centralised GD's K_T): a number."""
    # a surprise: gradient descent stalls on a plateau after about T/4 rounds (its bias hardly moves
    # from round 20 to 80), while FedAvg's drifting local steps keep moving the kernel; client drift
    # does not make FedAvg's kernel worse here, it costs through the value block (the floor D, §5)
    return 0.45


def drift_floor(V_FA, V_star, A_tilde):
    """D = ½ tr((V_FA − V*)^T Ã (V_FA − V*))."""
    gap = V_FA - V_star
    return 0.5 * np.trace(gap.T @ A_tilde @ gap)


def drift_floor_factor_when_zeta_doubles():
    """D(ζ_V = 4) / D(ζ_V = 2) at the teacher kernel: a number."""
    return 4.0              # D ∝ ζ² at a fixed kernel


def final_value_block(V_T0, M, V_FA, k):
    """V_T after k frozen rounds, from the affine map's closed form."""
    return V_FA + np.linalg.matrix_power(M, k) @ (V_T0 - V_FA)


def best_warmup_shift():
    """Median over the seeds of T0_best(zeta_high) − T0_best(zeta_low), in rounds: a number."""
    # at ζ_V = 0.5 the best warm-up is about T = 80 (printed); section 6 found 50 at ζ_V = 2 (seed 0)
    return -30.0
