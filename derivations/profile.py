"""The kernel-profile objective and its envelope gradient (docs/theory.md §4).

Claims
  1. For a fixed kernel, F_λ(V) = ½ tr(VᵀÃV) − tr(VᵀB) + ½ y2 (Ã = A + λI ≻ 0) is minimised at
     V* = Ã⁻¹B, and Φ_λ = min_V F_λ = ½ y2 − ½ tr(Bᵀ Ã⁻¹ B).
  2. Envelope theorem: if A, B, y2 depend on a kernel parameter t, then
     dΦ_λ/dt = ∂F_λ/∂t (t, V) at V = V*(t) (the V-dependence of V* does not contribute).
  3. For the attention model (φ = Ŝ Kᵀ q, ŷ = Vᵀ φ), the profile gradient is the model's closed-form
     kernel gradient at V*: ∇_K Φ_λ = mean_i q_i g_iᵀ with g_i = Ŝ_i V* e_i, e_i = V*ᵀ φ_i − y_i.
  4. The package's profile_objective / profile_gradient equal the sympy closed form and its
     symbolic derivative on a random numeric instance.

Run: python derivations/profile.py   (prints PASS/FAIL per claim, exits 1 on any failure)
"""

import numpy as np
import sympy as sp
from _claims import claim, finish


def is_zero_matrix(M) -> bool:
    return all(sp.simplify(sp.cancel(entry)) == 0 for entry in M)


# ---------------------------------------------------------------------------- claim 1
a11, a12, a22, lam, y2 = sp.symbols("a11 a12 a22 lambda y2", real=True)
A = sp.Matrix([[a11, a12], [a12, a22]])
B = sp.Matrix(2, 2, sp.symbols("b11 b12 b21 b22", real=True))
At = A + lam * sp.eye(2)
V = sp.Matrix(2, 2, sp.symbols("v11 v12 v21 v22", real=True))
F = sp.Rational(1, 2) * (V.T * At * V).trace() - (V.T * B).trace() + y2 / 2
stationary = sp.solve([sp.diff(F, v) for v in V], list(V), dict=True)[0]
V_star = V.subs(stationary)
closed_V = At.inv() * B
closed_Phi = y2 / 2 - sp.Rational(1, 2) * (B.T * At.inv() * B).trace()
claim("1a stationary point of F_λ is V* = Ã⁻¹B (Hd = 2, p = 2)", is_zero_matrix(V_star - closed_V))
claim("1b Φ_λ = F_λ(V*) = ½ y2 − ½ tr(Bᵀ Ã⁻¹ B)", sp.simplify(sp.cancel(F.subs(stationary) - closed_Phi)) == 0)
hessian = sp.hessian(F, list(V))
claim("1c Hessian of F_λ in row-major vec(V) is Ã ⊗ I_p (a minimum when Ã ≻ 0)",
      is_zero_matrix(hessian - sp.kronecker_product(At, sp.eye(2))))

# ---------------------------------------------------------------------------- claim 2
t = sp.symbols("t", real=True)
f = {name: sp.Function(name)(t) for name in ("p", "q", "r", "u1", "u2", "w")}
A_t = sp.Matrix([[f["p"], f["q"]], [f["q"], f["r"]]]) + lam * sp.eye(2)
B_t = sp.Matrix([f["u1"], f["u2"]])
y2_t = f["w"]
Phi_t = y2_t / 2 - sp.Rational(1, 2) * (B_t.T * A_t.inv() * B_t)[0, 0]
Vs = A_t.inv() * B_t
v = sp.Matrix(sp.symbols("v1 v2", real=True))
F_t = sp.Rational(1, 2) * (v.T * A_t * v)[0, 0] - (v.T * B_t)[0, 0] + y2_t / 2
partial_at_optimum = sp.diff(F_t, t).subs({v[0]: Vs[0], v[1]: Vs[1]})
claim("2  dΦ_λ/dt = ∂F_λ/∂t at V = V*(t) for smooth A(t), B(t), y2(t)",
      sp.simplify(sp.cancel(sp.diff(Phi_t, t) - partial_at_optimum)) == 0)

# ---------------------------------------------------------------------------- claim 3
k = sp.symbols("k11 k12 k21 k22", real=True)
K = sp.Matrix(2, 2, k)
samples = [  # (Ŝ, q, y) with small exact numbers; Ŝ symmetric positive definite
    (sp.Matrix([[2, 1], [1, 1]]), sp.Matrix([1, 0]), sp.Matrix([1])),
    (sp.Matrix([[1, 0], [0, 3]]), sp.Matrix([1, 2]), sp.Matrix([-1])),
    (sp.Matrix([[3, 1], [1, 2]]), sp.Matrix([0, 1]), sp.Matrix([2])),
]
lam3 = sp.Rational(1, 10)
phis = [S * K.T * q for S, q, _ in samples]
A3 = sum((p * p.T for p in phis), sp.zeros(2, 2)) / len(samples)
B3 = sum((p * y.T for p, (_, _, y) in zip(phis, samples)), sp.zeros(2, 1)) / len(samples)
y23 = sum((y.T * y)[0, 0] for _, _, y in samples) / sp.Integer(len(samples))
At3 = A3 + lam3 * sp.eye(2)
# Ã⁻¹ = adj(Ã)/det(Ã): Φ = ½ y2 − ½ n(K)/det(K) with the polynomial n = Bᵀ adj(Ã) B, so
# det² ∂Φ/∂k = −½ (∂n/∂k · det − n · ∂det/∂k); the closed form with V* = adj(Ã) B / det has
# det² · mean_i q_i (Ŝ_i V* e_i)ᵀ = mean_i q_i (Ŝ_i adj(Ã) B ê_i)ᵀ, ê_i = (adj(Ã)B)ᵀ φ_i − y_i det.
# Both sides are polynomials in K: compare them expanded.
adj, det = At3.adjugate(), At3.det()
numerator = (B3.T * adj * B3)[0, 0]
lhs = sp.Matrix(2, 2, [-(sp.diff(numerator, kk) * det - numerator * sp.diff(det, kk)) / 2 for kk in k])
rhs = sp.zeros(2, 2)
for phi, (S, q, y) in zip(phis, samples):
    e_hat = (adj * B3).T * phi - y * det
    rhs += q * (S * adj * B3 * e_hat).T / len(samples)
claim("3  ∇_K Φ_λ = mean_i q_i (Ŝ_i V* e_i)ᵀ, the model's kernel gradient at V* (d = 2, 3 samples)",
      all(sp.expand(a - b) == 0 for a, b in zip(lhs, rhs)))

# ---------------------------------------------------------------------------- claim 4
from linattn_theory.core.model import context_second_moment  # noqa: E402
from linattn_theory.theory.profile import profile_gradient, profile_objective  # noqa: E402

rng = np.random.default_rng(4)
d, n, p, N, lam4 = 2, 3, 2, 5, 0.3
clients = []
for c in range(2):
    X = rng.normal(size=(N + c, n, d))
    clients.append((X, X[:, -1, :].copy(), rng.normal(size=(N + c, p))))
K_num = rng.normal(size=(1, d, d))
S_all = np.concatenate([context_second_moment(X) for X, _, _ in clients])
q_all = np.concatenate([q for _, q, _ in clients])
y_all = np.concatenate([y for _, _, y in clients])            # Σ_c p_c mean_c = mean over all (p_c ∝ N_c)
t = sp.symbols("t", real=True)


def closed_form_along(direction):
    """Φ_λ(K + t·direction) from the closed form of claim 1, as a sympy function of t."""
    phi0 = np.einsum("nab,cb,nc->na", S_all, K_num[0], q_all)        # Ŝ Kᵀ q
    phi1 = np.einsum("nab,cb,nc->na", S_all, direction, q_all)
    A_t = sp.Matrix(phi0.T @ phi0) + t * sp.Matrix(phi0.T @ phi1 + phi1.T @ phi0) + t**2 * sp.Matrix(phi1.T @ phi1)
    B_t = sp.Matrix(phi0.T @ y_all) + t * sp.Matrix(phi1.T @ y_all)
    count = len(y_all)
    At_t = A_t / count + lam4 * sp.eye(d)
    return float(np.sum(y_all**2)) / count / 2 - (B_t.T * At_t.inv() * B_t).trace() / (2 * count**2)


value_sym = float(closed_form_along(np.zeros((d, d))).subs(t, 0))
grad_sym = np.zeros((d, d))
for i in range(d):
    for j in range(d):
        unit = np.zeros((d, d))
        unit[i, j] = 1.0
        grad_sym[i, j] = float(sp.diff(closed_form_along(unit), t).subs(t, 0))
value_pkg, _ = profile_objective(K_num, clients, lam4)
grad_pkg = profile_gradient(K_num, clients, lam4)[0]
err_v = abs(value_pkg - value_sym) / abs(value_sym)
err_g = np.abs(grad_pkg - grad_sym).max() / np.abs(grad_sym).max()
claim("4  package profile_objective = sympy closed form on a random instance", err_v < 1e-10, f"rel err {err_v:.1e}")
claim("4  package profile_gradient = sympy derivative of the closed form", err_g < 1e-10, f"rel err {err_g:.1e}")

finish()
