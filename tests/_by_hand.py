"""The value block's moments from the raw clients, written apart from the package (docs/theory.md §1, §4).

Linear attention: ``φ_h = Ŝ K_hᵀ q`` with ``Ŝ = XᵀX / n``, stacked head-major; per client
``A_c = Σ_i φ_i φ_iᵀ / N_c`` and ``B_c = Σ_i φ_i y_iᵀ / N_c``, weights ``p_c = N_c / Σ N``.
"""

import numpy as np


def kernels(params) -> np.ndarray:
    """``K_h = W_Q^h W_K^hᵀ`` ``(H, d, d)``."""
    return np.einsum("hdr,her->hde", np.asarray(params.WQ), np.asarray(params.WK))


def value_moments_by_hand(clients, K) -> tuple[list, list, np.ndarray]:
    """``([A_c], [B_c], p)`` of the clients ``(X, q, y)`` at the kernels ``K``."""
    A, B, sizes = [], [], []
    for X, q, y in clients:
        S = np.einsum("sni,snj->sij", X, X) / X.shape[1]
        phi = np.concatenate([S @ (K[h].T @ q[..., None]) for h in range(K.shape[0])], axis=1)[..., 0]
        A.append(phi.T @ phi / X.shape[0])
        B.append(phi.T @ y / X.shape[0])
        sizes.append(X.shape[0])
    return A, B, np.asarray(sizes) / np.sum(sizes)


def pooled_solution(clients, K, lam):
    """``V*_λ(K)`` and ``Φ_λ(K)`` from the pooled normal equations ``(Σ p_c A_c + λI) V = Σ p_c B_c``
    built from the raw clients (tests/_by_hand.py), solved with numpy."""
    A, B, p = value_moments_by_hand(clients, K)
    A_tilde = sum(w * A_c for w, A_c in zip(p, A)) + lam * np.eye(len(A[0]))
    B_mean = sum(w * B_c for w, B_c in zip(p, B))
    V = np.linalg.solve(A_tilde, B_mean)
    y2 = sum(w * np.mean(np.sum(y * y, axis=1)) for w, (_, _, y) in zip(p, clients))
    return V, 0.5 * y2 - 0.5 * np.sum(B_mean * V)


def model_curvature_by_hand(params, data, ridge, eps=1e-6) -> np.ndarray:
    """``λ_max(∇²F_{λ,c})`` (largest ``|eigenvalue|``) per client of the full model: the dense Hessian by
    central differences of the closed-form gradients (checked against finite differences of the loss
    in tests/test_model.py), symmetrised, numpy's eigvalsh."""
    from linattn_theory.core.model import Params, loss_and_grad_from_moments

    blocks = ("WQ", "WK", "WV")
    shapes = [np.shape(getattr(params, b)) for b in blocks]
    flat = np.concatenate([np.ravel(getattr(params, b)) for b in blocks])

    def gradient(x, c):
        parts = np.split(x, np.cumsum([int(np.prod(s)) for s in shapes])[:-1])
        P = Params(*(p.reshape(s) for p, s in zip(parts, shapes)))
        _, g = loss_and_grad_from_moments(P, data.S[c], data.q[c], data.y[c], data.sample_weight[c])
        return np.concatenate([g.WQ.ravel(), g.WK.ravel(), g.WV.ravel() + ridge * P.WV.ravel()])

    largest = []
    for c in range(data.S.shape[0]):
        H = np.array([(gradient(flat + eps * e, c) - gradient(flat - eps * e, c)) / (2 * eps)
                      for e in np.eye(flat.size)])
        largest.append(np.abs(np.linalg.eigvalsh((H + H.T) / 2)).max())
    return np.array(largest)
