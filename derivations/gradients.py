"""Claim (docs/theory.md §1): the closed-form gradients of the linear-attention loss.

For ``ℓ = ½‖ŷ − y‖²`` with ``ŷ = Σ_h (W_V^h)^T Ŝ K_h^T q``, ``K_h = W_Q^h (W_K^h)^T``, and
``u = (W_Q^h)^T q``, ``φ_h = Ŝ K_h^T q``, ``e = ŷ − y``, ``g = Ŝ W_V^h e``:

    ∇_{W_V^h} ℓ = φ_h e^T,   ∇_{W_K^h} ℓ = g u^T,   ∇_{W_Q^h} ℓ = q (W_K^h)^T g)^T,   ∇_{K_h} ℓ = q g^T.

The script differentiates ``ℓ`` entry by entry with sympy on small symbolic matrices
(two heads, ``d = 2``, ``r = 1``; one head with ``r = 2``, ``p = 2``), asserts each
difference simplifies to zero, then evaluates both at random numbers and compares with
``linattn_theory.loss_and_grad``. Run: ``python derivations/gradients.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _claims import claim, finish, layer_symbols, package_claims, random_point, symbols  # noqa: E402  (also puts the repository root on sys.path)

from linattn_theory import Params, loss_and_grad  # noqa: E402


def derive(heads: int, d: int, r: int, p: int, n: int) -> None:
    WQ, WK, WV, X, q, y, kernels = layer_symbols(heads, d, r, p, n)
    S = X.T * X / n
    yhat = sp.zeros(p, 1)
    for h in range(heads):
        yhat += WV[h].T * S * kernels[h].T * q
    e = yhat - y
    loss = (e.T * e)[0, 0] / 2

    shape = f"H={heads}, d={d}, r={r}, p={p}, n={n}"
    for h in range(heads):
        u = WQ[h].T * q
        phi = S * kernels[h].T * q
        g = S * WV[h] * e
        closed = {"W_V": (WV[h], phi * e.T), "W_K": (WK[h], g * u.T),
                  "W_Q": (WQ[h], q * (WK[h].T * g).T)}
        for name, (W, formula) in closed.items():
            derived = sp.Matrix(W.shape[0], W.shape[1], lambda i, j: sp.diff(loss, W[i, j]))
            claim(f"∇_{{{name}^{h}}} ℓ equals the closed form ({shape})",
                  sp.expand(derived - formula) == sp.zeros(*W.shape))
        # kernel gradient: differentiate through an unfactored symbolic kernel
        Kfree = symbols(f"G{h}", d, d)
        yhat_K = yhat - WV[h].T * S * kernels[h].T * q + WV[h].T * S * Kfree.T * q
        eK = yhat_K - y
        loss_K = (eK.T * eK)[0, 0] / 2
        derived_K = sp.Matrix(d, d, lambda i, j: sp.diff(loss_K, Kfree[i, j])).subs(
            dict(zip(Kfree, kernels[h])))
        claim(f"∇_{{K_{h}}} ℓ = q g^T ({shape})", sp.expand(derived_K - q * g.T) == sp.zeros(d, d))

    # numeric comparison with the package at a random point
    blocks = {"WQ": WQ, "WK": WK, "WV": WV}
    values, arrays, (Xv, qv, yv) = random_point(np.random.default_rng(0), blocks, X, q, y)
    loss_pkg, grads = loss_and_grad(Params(**arrays), Xv[None], qv[None], yv[None])
    package_claims(f"({shape}) ", loss, values, blocks, loss_pkg, grads)

if __name__ == "__main__":
    derive(heads=2, d=2, r=1, p=1, n=2)
    derive(heads=1, d=2, r=2, p=2, n=2)
    finish()
