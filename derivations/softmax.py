"""Claims (docs/theory.md §9): closed-form gradients of the softmax-attention loss and its small-logit limit.

With scores ``s_{h,i} = q^T K_h x_i / τ``, weights ``a_h = softmax(s_h)``, ``φ_h = X^T a_h``,
``ŷ = Σ_h (W_V^h)^T φ_h``, ``e = ŷ − y`` and ``ℓ = ½‖e‖²``:

    ∇_{W_V^h} ℓ = φ_h e^T,   δ_h = J_h (X W_V^h e),   J_h u = a_h ⊙ (u − a_h^T u),
    g_h = X^T δ_h / τ,       ∇_{K_h} ℓ = q g_h^T,
    ∇_{W_Q^h} ℓ = q (W_K^{hT} g_h)^T,   ∇_{W_K^h} ℓ = g_h (W_Q^{hT} q)^T.

The script differentiates ``ℓ`` entry by entry with sympy on small symbolic matrices (two heads,
``d = 2``, ``r = 1``, ``n = 2``; one head with ``r = 2``, ``p = 2``), asserts each difference
simplifies to zero, checks ``J u = (diag(a) − a a^T) u``, proves the small-logit expansion
``softmax(ε s) = 1/n + (ε/n)(s − s̄) + O(ε²)`` by a series in ``ε``, and compares the
package's ``loss_and_grad(..., attention="softmax")`` with the sympy gradients at random
numbers. Run: ``python derivations/softmax.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _claims import claim, finish, layer_symbols, package_claims, random_point  # noqa: E402  (also puts the repository root on sys.path)

from linattn_theory import Params, loss_and_grad  # noqa: E402


def softmax(s):
    z = s.applyfunc(sp.exp)
    return z / sum(z)


def is_zero(expr) -> bool:
    """``expr`` is identically zero: the numerator of its single fraction expands to 0."""
    numerator, _ = sp.fraction(sp.together(expr))
    return sp.expand(numerator) == 0


def derive(heads: int, d: int, r: int, p: int, n: int) -> None:
    tau = sp.Symbol("tau", positive=True)
    WQ, WK, WV, X, q, y, kernels = layer_symbols(heads, d, r, p, n)
    weights = [softmax(X * kernels[h].T * q / tau) for h in range(heads)]
    yhat = sp.zeros(p, 1)
    for h in range(heads):
        yhat += WV[h].T * X.T * weights[h]
    e = yhat - y
    loss = (e.T * e)[0, 0] / 2

    shape = f"H={heads}, d={d}, r={r}, p={p}, n={n}"
    for h in range(heads):
        a = weights[h]
        phi = X.T * a
        u = X * WV[h] * e
        delta = a.multiply_elementwise(u - (a.T * u)[0, 0] * sp.ones(n, 1))      # J u without J
        jacobian = sp.diag(*a) - a * a.T
        claim(f"J u = a ⊙ (u − aᵀu) for J = diag(a) − a aᵀ ({shape}, head {h})",
              all(is_zero(v) for v in (jacobian * u - delta)))
        g = X.T * delta / tau
        closed = {"W_V": (WV[h], phi * e.T), "W_K": (WK[h], g * (WQ[h].T * q).T),
                  "W_Q": (WQ[h], q * (WK[h].T * g).T)}
        for name, (W, formula) in closed.items():
            derived = sp.Matrix(W.shape[0], W.shape[1], lambda i, j: sp.diff(loss, W[i, j]))
            claim(f"∇_{{{name}^{h}}} ℓ equals the closed form ({shape})",
                  all(is_zero(v) for v in (derived - formula)))

    # numeric comparison with the package at a random point
    blocks = {"WQ": WQ, "WK": WK, "WV": WV}
    values, arrays, (Xv, qv, yv) = random_point(np.random.default_rng(1), blocks, X, q, y)
    values[tau] = 0.7
    loss_pkg, grads = loss_and_grad(Params(**arrays), Xv[None], qv[None], yv[None],
                                    attention="softmax", temperature=0.7)
    package_claims(f"({shape}) softmax ", loss, values, blocks, loss_pkg, grads)

def small_logit_limit(n: int) -> None:
    eps = sp.Symbol("epsilon")
    s = sp.Matrix(n, 1, lambda i, _: sp.Symbol(f"s_{i}", real=True))
    mean = sum(s) / n
    a = softmax(eps * s)
    first_order = [sp.series(a[i], eps, 0, 2).removeO() for i in range(n)]
    claim(f"softmax(ε s) = 1/n + (ε/n)(s − s̄) + O(ε²) (n={n})",
          all(is_zero(first_order[i] - (sp.Rational(1, n) + eps * (s[i] - mean) / n)) for i in range(n)))
    # so Σ_i a_i x_i = x̄ + (ε/n) Σ_i (s_i − s̄) x_i + O(ε²), the uniform head plus ε times
    # linear attention on centred scores; the O(ε²) coefficient is not zero in general
    second = [sp.series(a[i], eps, 0, 3).removeO() - first_order[i] for i in range(n)]
    claim(f"the ε² term does not vanish in general (n={n})", not all(is_zero(t) for t in second))


if __name__ == "__main__":
    derive(heads=2, d=2, r=1, p=1, n=2)
    derive(heads=1, d=2, r=2, p=2, n=2)
    small_logit_limit(3)
    finish()
