"""FedProx in the frozen stage: the affine round map and its closed-form fixed point.

Claim (docs/theory.md §5, FedProx of Li et al. 2018). With the kernel frozen, client c's
regularised objective is F_{λ,c}(V) = ½ tr(VᵀÃ_c V) − tr(VᵀB_c) + const, Ã_c = A_c + λI.
FedProx's local step from the server's V^t is

    V ← V − η (Ã_c V − B_c + μ (V − V^t)).

With G_c = I − η(Ã_c + μI), S_c = Σ_{j<E} G_c^j and P_c = I − G_c^E:

1. after E local steps   V_c = G_c^E V^t + η S_c (B_c + μ V^t);
2. η S_c (Ã_c + μI) = P_c  (telescoping), so the averaged round V^{t+1} = Σ_c p_c V_c = M V^t + b
   has I − M = η Σ_c p_c S_c Ã_c and its fixed point is
       V_prox = (Σ_c p_c S_c Ã_c)^{-1} Σ_c p_c S_c B_c
              = (Σ_c p_c W_c)^{-1} Σ_c p_c W_c V*_c,  W_c = P_c (Ã_c + μI)^{-1} Ã_c,  V*_c = Ã_c^{-1}B_c;
3. μ = 0 gives FedAvg's V_FA (W_c = I − (I − ηÃ_c)^E);
4. E = 1 gives the centralised V*_λ = Ã^{-1}B for every μ (no drift);
5. to first order in η the drift V_prox − V*_λ does not depend on μ: the proximal term does not
   remove FedAvg's drift floor (checked for one-dimensional values, two clients);
6. iterating the local proximal steps on random instances converges to V_prox (float64).

Run: python derivations/fedprox.py   (prints PASS/FAIL per claim; exit status 1 on any failure)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _claims import claim as check, finish  # noqa: E402


def symmetric(name: str, n: int) -> sp.Matrix:
    return sp.Matrix(n, n, lambda i, j: sp.Symbol(f"{name}{min(i, j)}{max(i, j)}", real=True))


def column(name: str, n: int) -> sp.Matrix:
    return sp.Matrix(n, 1, lambda i, j: sp.Symbol(f"{name}{i}", real=True))


def geometric_sum(G: sp.Matrix, E: int) -> sp.Matrix:
    """S = Σ_{j<E} G^j."""
    S, power = sp.zeros(*G.shape), sp.eye(G.shape[0])
    for _ in range(E):
        S, power = S + power, power * G
    return S


def is_zero(M: sp.Matrix) -> bool:
    return all(sp.simplify(sp.expand(e)) == 0 for e in M)


eta, mu, p1 = sp.symbols("eta mu p1", positive=True)
n = 2
A = symmetric("a", n)           # Ã_c (λ included)
B = column("b", n)              # B_c (one output column; columns are independent)
V0 = column("v", n)             # V^t
I = sp.eye(n)
G = I - eta * (A + mu * I)

# 1. E local proximal steps, unrolled symbolically
ok = True
for E in range(1, 4):
    V = V0
    for _ in range(E):
        V = V - eta * (A * V - B + mu * (V - V0))
    closed = G**E * V0 + eta * geometric_sum(G, E) * (B + mu * V0)
    ok &= is_zero(V - closed)
check("E local steps: V_c = G^E V^t + η S (B + μ V^t), E = 1..3", ok)

# 2. telescoping identity η S (Ã + μI) = I − G^E, hence I − M = η Σ p_c S_c Ã_c
ok = True
for E in range(1, 5):
    S = geometric_sum(G, E)
    ok &= is_zero(eta * S * (A + mu * I) - (I - G**E))
    ok &= is_zero((I - (G**E + eta * mu * S)) - eta * S * A)
check("telescoping: η S_c (Ã_c + μI) = P_c and I − (G_c^E + ημ S_c) = η S_c Ã_c, E = 1..4", ok)

# 2'. the averaged round for two clients with non-commuting Ã_1, Ã_2 (E = 3): the fixed-point
#     equation (I − M) V = b is η (Σ p_c S_c Ã_c) V = η Σ p_c S_c B_c, hence V_prox
A2, B2 = symmetric("c", n), column("d", n)
E = 3
M, b = sp.zeros(n, n), sp.zeros(n, 1)
lhs, rhs = sp.zeros(n, n), sp.zeros(n, 1)
for p, Ac, Bc in ((p1, A, B), (1 - p1, A2, B2)):
    Gc = I - eta * (Ac + mu * I)
    Sc = geometric_sum(Gc, E)
    M += p * (Gc**E + eta * mu * Sc)
    b += p * eta * Sc * Bc
    lhs += p * Sc * Ac
    rhs += p * Sc * Bc
check("averaged round: I − M = η Σ p_c S_c Ã_c and b = η Σ p_c S_c B_c (two clients, E = 3), "
      "so V_prox = (Σ p_c S_c Ã_c)^{-1} Σ p_c S_c B_c",
      is_zero((I - M) - eta * lhs) and is_zero(b - eta * rhs))

# 3. μ = 0: W_c = S_c Ã_c η = I − (I − ηÃ_c)^E, FedAvg's P_c
ok = True
for E in range(1, 5):
    S0 = geometric_sum(I - eta * A, E)
    ok &= is_zero(eta * S0 * A - (I - (I - eta * A)**E))
check("μ = 0: η S_c Ã_c = I − (I − ηÃ_c)^E, so V_prox = V_FA", ok)

# 4. E = 1: S_c = I, so V_prox = (Σ p_c Ã_c)^{-1} Σ p_c B_c = V*_λ for every μ
check("E = 1: S_c = I, V_prox = Ã^{-1} B (no drift) for every μ",
      is_zero(geometric_sum(G, 1) - I))

# 5. first-order drift independent of μ (scalar values, two clients, E = 2..5)
a1, a2, b1, b2 = sp.symbols("a1 a2 b1 b2", positive=True)


def scalar_fixed_point(mu_value, E):
    weights, targets = [], []
    for p, a, bb in ((p1, a1, b1), (1 - p1, a2, b2)):
        S = sum((1 - eta * (a + mu_value))**j for j in range(E))
        weights.append(p * S * a)
        targets.append(p * S * bb)
    return sum(targets) / sum(weights)


ok = True
for E in range(2, 6):
    slopes = [sp.diff(scalar_fixed_point(m, E), eta).subs(eta, 0) for m in (mu, 0)]
    ok &= sp.cancel(slopes[0] - slopes[1]) == 0
    if E == 2:
        leading = sp.factor(slopes[1])
check("d V_prox/dη at η = 0 equals FedAvg's, E = 2..5 (the drift floor's leading term does not depend on μ)", ok)
print("      leading drift term for E = 2: dV/dη =", leading)

# 6. numerical: iterate the local proximal steps and land on the closed form
rng = np.random.default_rng(0)
ok = True
for trial in range(5):
    m_clients, d, p_out, E_num = 3, 3, 2, int(rng.integers(2, 6))
    mu_num, lam = float(rng.uniform(0.1, 2.0)), 0.1
    As = []
    for _ in range(m_clients):
        R = rng.normal(size=(d, d)) * rng.uniform(0.3, 1.5)
        As.append(R @ R.T / d + lam * np.eye(d))
    Bs = [rng.normal(size=(d, p_out)) for _ in range(m_clients)]
    pw = rng.dirichlet(np.ones(m_clients))
    eta_num = 1.0 / max(np.linalg.eigvalsh(a)[-1] + mu_num for a in As)
    V = np.zeros((d, p_out))
    for _ in range(3000):
        new = np.zeros_like(V)
        for p, Ac, Bc in zip(pw, As, Bs):
            Vc = V.copy()
            for _ in range(E_num):
                Vc = Vc - eta_num * (Ac @ Vc - Bc + mu_num * (Vc - V))
            new += p * Vc
        V = new
    lhs = np.zeros((d, d))
    rhs = np.zeros((d, p_out))
    W_sum = np.zeros((d, d))
    WV_sum = np.zeros((d, p_out))
    for p, Ac, Bc in zip(pw, As, Bs):
        Gc = np.eye(d) - eta_num * (Ac + mu_num * np.eye(d))
        Sc = sum(np.linalg.matrix_power(Gc, j) for j in range(E_num))
        lhs += p * Sc @ Ac
        rhs += p * Sc @ Bc
        Pc = np.eye(d) - np.linalg.matrix_power(Gc, E_num)
        Wc = Pc @ np.linalg.solve(Ac + mu_num * np.eye(d), Ac)
        W_sum += p * Wc
        WV_sum += p * Wc @ np.linalg.solve(Ac, Bc)
    V_prox = np.linalg.solve(lhs, rhs)
    V_weighted = np.linalg.solve(W_sum, WV_sum)
    err = np.linalg.norm(V - V_prox) / np.linalg.norm(V_prox)
    err_w = np.linalg.norm(V_weighted - V_prox) / np.linalg.norm(V_prox)
    ok &= err <= 1e-12 and err_w <= 1e-12
check("simulated proximal rounds land on V_prox (relative error ≤ 1e-12, 5 random instances)", ok)

finish()
