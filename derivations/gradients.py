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
from _claims import claim, finish  # noqa: E402  (also puts the repository root on sys.path)

from linattn_theory import Params, loss_and_grad  # noqa: E402


def symbols(name, rows, cols):
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}", real=True))


def derive(heads: int, d: int, r: int, p: int, n: int) -> None:
    WQ = [symbols(f"Q{h}", d, r) for h in range(heads)]
    WK = [symbols(f"K{h}", d, r) for h in range(heads)]
    WV = [symbols(f"V{h}", d, p) for h in range(heads)]
    X = symbols("X", n, d)
    q = symbols("q", d, 1)
    y = symbols("y", p, 1)
    S = X.T * X / n
    kernels = [WQ[h] * WK[h].T for h in range(heads)]
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
    rng = np.random.default_rng(0)
    values = {}
    arrays = {}
    for key, mats in (("WQ", WQ), ("WK", WK), ("WV", WV)):
        arr = rng.normal(size=(heads,) + mats[0].shape)
        arrays[key] = arr
        for h, M in enumerate(mats):
            values.update({M[i, j]: arr[h, i, j] for i in range(M.shape[0]) for j in range(M.shape[1])})
    Xv, qv, yv = rng.normal(size=(n, d)), rng.normal(size=d), rng.normal(size=p)
    values.update({X[i, j]: Xv[i, j] for i in range(n) for j in range(d)})
    values.update({q[i, 0]: qv[i] for i in range(d)})
    values.update({y[i, 0]: yv[i] for i in range(p)})
    loss_pkg, grads = loss_and_grad(Params(**arrays), Xv[None], qv[None], yv[None])
    claim(f"package loss equals the sympy loss ({shape})",
          abs(float(loss.subs(values)) - float(loss_pkg)) <= 1e-12 * max(1.0, abs(float(loss_pkg))))
    for key, mats in (("WQ", WQ), ("WK", WK), ("WV", WV)):
        sym = np.array([[[float(sp.diff(loss, M[i, j]).subs(values)) for j in range(M.shape[1])]
                         for i in range(M.shape[0])] for M in mats])
        pkg = getattr(grads, key)
        claim(f"package ∇{key} equals the sympy gradient ({shape})",
              np.allclose(pkg, sym, rtol=1e-10, atol=1e-12))


if __name__ == "__main__":
    derive(heads=2, d=2, r=1, p=1, n=2)
    derive(heads=1, d=2, r=2, p=2, n=2)
    finish()
