"""The frozen stage: an affine map, its fixed point, and the value drift floor (docs/theory.md §5).

With the kernel frozen, client c's local gradient step on F_{λ,c} is V ← V − η(Ã_c V − B_c).

Claims
  1. E local steps from V give (I − ηÃ_c)^E V + Σ_{j<E} (I − ηÃ_c)^j η B_c, so after averaging
     V^{t+1} = M V^t + b with M = Σ_c p_c (I − ηÃ_c)^E, b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c.
  2. Σ_{j<E} (I − ηÃ)^j ηÃ = P := I − (I − ηÃ)^E, hence the fixed point
     V_FA = (I − M)⁻¹ b = (Σ_c p_c P_c)⁻¹ Σ_c p_c P_c V*_c with V*_c = Ã_c⁻¹ B_c.
  3. E = 1 ⇒ V_FA = V*_λ = Ã⁻¹ B (no drift), for any heterogeneity.
  4. Drift floor D = ½ tr((V_FA − V*)ᵀ Ã (V_FA − V*)) as a series in η (scalar clients, symbolic E):
     V_FA − V* = O(η), so the η⁰ and η¹ coefficients vanish and the η² coefficient is (E − 1)² · C with C independent
     of E; C = (Σp b · Σp a² − Σp a · Σp ab)² / (8 (Σp a)³), zero for identical curvatures.
  5. Matrix form of the leading order: V_FA − V* = η (E − 1)/2 · Ã⁻¹ Z + O(η²) with
     Z = Σ_c p_c Ã_c (Ã_c V* − B_c), so D = η² (E − 1)²/8 · tr(Zᵀ Ã⁻¹ Z) + O(η³)
     (exact series on rational 2×2 instances for E = 2, 3, 4).
  6. The package's fedavg_fixed_point / value_drift_floor match claims 2 and 5 on a random instance.

Run: python derivations/frozen_stage.py   (prints PASS/FAIL per claim, exits 1 on any failure)
"""

import numpy as np
import sympy as sp
from _claims import claim, finish


def symmetric(prefix):
    a, b, c = sp.symbols(f"{prefix}11 {prefix}12 {prefix}22", real=True)
    return sp.Matrix([[a, b], [b, c]])


eta, lam, p = sp.symbols("eta lambda p", positive=True)
I2 = sp.eye(2)

# ---------------------------------------------------------------------------- claim 1
A1, A2 = symmetric("a"), symmetric("c")
B1, B2 = sp.Matrix(sp.symbols("b1 b2", real=True)), sp.Matrix(sp.symbols("e1 e2", real=True))
V0 = sp.Matrix(sp.symbols("v1 v2", real=True))
ok = True
for E in range(1, 5):
    for A, B in ((A1, B1), (A2, B2)):
        At = A + lam * I2
        V = V0
        for _ in range(E):
            V = V - eta * (At * V - B)
        step = I2 - eta * At
        closed = step**E * V0 + sum((step**j * eta * B for j in range(E)), sp.zeros(2, 1))
        ok &= all(sp.expand(x) == 0 for x in V - closed)
claim("1  E local steps = (I − ηÃ_c)^E V + Σ_{j<E} (I − ηÃ_c)^j η B_c (2×2, E = 1..4)", ok)

# ---------------------------------------------------------------------------- claim 2
j, E_sym, a = sp.symbols("j E a", positive=True)
scalar = sp.simplify(sp.summation((1 - eta * a) ** j * eta * a, (j, 0, E_sym - 1)) - (1 - (1 - eta * a) ** E_sym))
ok = scalar == 0
for E in range(1, 5):
    step = I2 - eta * (A1 + lam * I2)
    telescoped = sum((step**k * eta * (A1 + lam * I2) for k in range(E)), sp.zeros(2, 2)) - (I2 - step**E)
    ok &= all(sp.expand(x) == 0 for x in telescoped)
claim("2a Σ_{j<E} (I − ηÃ)^j ηÃ = I − (I − ηÃ)^E (scalar: any E; 2×2: E = 1..4)", ok)
# fixed point of the averaged map equals the P-weighted combination of the clients' optima (E = 2, 2×2)
E = 2
steps = [I2 - eta * (A + lam * I2) for A in (A1, A2)]
weights = (p, 1 - p)
M = sum((w * s**E for w, s in zip(weights, steps)), sp.zeros(2, 2))
b = sum((w * sum((s**k * eta * B for k in range(E)), sp.zeros(2, 1)) for w, s, B in zip(weights, steps, (B1, B2))),
        sp.zeros(2, 1))
P = [I2 - s**E for s in steps]
V_star_c = [(A + lam * I2).inv() * B for A, B in ((A1, B1), (A2, B2))]
claim("2b (I − M)⁻¹ b = (Σ p_c P_c)⁻¹ Σ p_c P_c V*_c (I − M = Σ p_c P_c and b = Σ p_c P_c V*_c; E = 2, 2×2)",
      all(sp.simplify(x) == 0 for x in (I2 - M) - sum((w * Pc for w, Pc in zip(weights, P)), sp.zeros(2, 2)))
      and all(sp.simplify(sp.cancel(x)) == 0
              for x in b - sum((w * Pc * Vc for w, Pc, Vc in zip(weights, P, V_star_c)), sp.zeros(2, 1))))

# ---------------------------------------------------------------------------- claim 3
M1 = sum((w * s for w, s in zip(weights, steps)), sp.zeros(2, 2))
b1 = sum((w * eta * B for w, B in zip(weights, (B1, B2))), sp.zeros(2, 1))
A_bar = sum((w * (A + lam * I2) for w, A in zip(weights, (A1, A2))), sp.zeros(2, 2))
V_FA1 = (I2 - M1).inv() * b1
claim("3  E = 1 ⇒ V_FA = Ã⁻¹ B (two heterogeneous 2×2 clients)",
      all(sp.simplify(sp.cancel(x)) == 0 for x in V_FA1 - A_bar.inv() * b1 / eta))

# ---------------------------------------------------------------------------- claim 4
a1, a2, b1s, b2s = sp.symbols("a_1 a_2 b_1 b_2", positive=True)
E = sp.symbols("E", positive=True, integer=True)
pw = (p, 1 - p)
P_s = [1 - (1 - eta * ac) ** E for ac in (a1, a2)]
mean = lambda xs: sum(w * x for w, x in zip(pw, xs))  # noqa: E731
v_star = mean((b1s, b2s)) / mean((a1, a2))
v_fa = mean([Pc * bc / ac for Pc, bc, ac in zip(P_s, (b1s, b2s), (a1, a2))]) / mean(P_s)
D = mean((a1, a2)) * (v_fa - v_star) ** 2 / 2
# (1 − ηa)^E = 1 − Eηa + E(E−1)/2 η²a² + O(η³), so P_c/η = E a_c − E(E−1)/2 η a_c² + O(η²)
binomial = 1 - E * eta * a + E * (E - 1) / 2 * eta**2 * a**2
claim("4a binomial series (1 − ηa)^E = 1 − Eηa + E(E−1)/2 η²a² + O(η³) (symbolic E)",
      sp.simplify(sp.series((1 - eta * a) ** E, eta, 0, 3).removeO() - binomial) == 0)
P_over_eta = [sp.expand((1 - binomial.subs(a, ac)) / eta) for ac in (a1, a2)]
numerator = mean([Pc * bc / ac for Pc, bc, ac in zip(P_over_eta, (b1s, b2s), (a1, a2))])
denominator = mean(P_over_eta)
# v_FA − v* = (numerator − v* denominator) / denominator, exact up to O(η²) in the numerator
gap = sp.expand(numerator - v_star * denominator)
g0, g1 = sp.simplify(gap.coeff(eta, 0)), sp.simplify(gap.coeff(eta, 1))
claim("4b v_FA − v* = O(η): its η⁰ term vanishes, so D = ½ ā (v_FA − v*)² has no η⁰ or η¹ term", g0 == 0)
c2 = mean((a1, a2)) / 2 * (g1 / denominator.subs(eta, 0)) ** 2
C = (mean((b1s, b2s)) * mean((a1**2, a2**2)) - mean((a1, a2)) * mean((a1 * b1s, a2 * b2s))) ** 2 \
    / (8 * mean((a1, a2)) ** 3)
claim("4c η² coefficient of D = (E − 1)² · C, C = (Σpb Σpa² − Σpa Σpab)² / (8 (Σpa)³), C free of E",
      sp.simplify(sp.factor(c2 - (E - 1) ** 2 * C)) == 0 and E not in C.free_symbols)
claim("4d C = 0 for identical curvatures (a_1 = a_2): no drift without curvature heterogeneity",
      sp.simplify(C.subs(a2, a1)) == 0)

# ---------------------------------------------------------------------------- claim 5
rng = np.random.default_rng(0)


def rational_spd():
    R = sp.Matrix(2, 2, [sp.Rational(int(x), 4) for x in rng.integers(-4, 5, size=4)])
    return R * R.T + sp.Rational(1, 2) * I2


ok = True
for E_val in (2, 3, 4):
    A_c = [rational_spd() for _ in range(3)]
    B_c = [sp.Matrix([sp.Rational(int(x), 3) for x in rng.integers(-3, 4, size=2)]) for _ in range(3)]
    w_c = [sp.Rational(1, 2), sp.Rational(1, 3), sp.Rational(1, 6)]
    A_bar = sum((w * A for w, A in zip(w_c, A_c)), sp.zeros(2, 2))
    B_bar = sum((w * B for w, B in zip(w_c, B_c)), sp.zeros(2, 1))
    V_st = A_bar.inv() * B_bar
    P_c = [I2 - (I2 - eta * A) ** E_val for A in A_c]
    P_bar = sum((w * Pc for w, Pc in zip(w_c, P_c)), sp.zeros(2, 2))
    delta = P_bar.inv() * sum((w * Pc * (A.inv() * B - V_st) for w, Pc, A, B in zip(w_c, P_c, A_c, B_c)),
                              sp.zeros(2, 1))
    Z = sum((w * A * (A * V_st - B) for w, A, B in zip(w_c, A_c, B_c)), sp.zeros(2, 1))
    first = [sp.limit(x / eta, eta, 0) for x in delta]
    ok &= all(sp.simplify(f - g) == 0 for f, g in zip(first, sp.Rational(E_val - 1, 2) * A_bar.inv() * Z))
    D_c = (delta.T * A_bar * delta)[0, 0] / 2
    lead = sp.series(D_c, eta, 0, 3).removeO()
    ok &= sp.simplify(lead - eta**2 * sp.Rational((E_val - 1) ** 2, 8) * (Z.T * A_bar.inv() * Z)[0, 0]) == 0
claim("5  V_FA − V* = η(E−1)/2 Ã⁻¹Z + O(η²), D = η²(E−1)²/8 tr(ZᵀÃ⁻¹Z) + O(η³) (exact, E = 2, 3, 4)", ok)

# ---------------------------------------------------------------------------- claim 6
from linattn_theory.core.model import Params, kernel  # noqa: E402
from linattn_theory.data.tasks import planted_kernel_clients
from linattn_theory.core.clients import stack_clients  # noqa: E402
from linattn_theory.theory.host import host_moments
from linattn_theory.theory.frozen_stage import fedavg_fixed_point, value_drift_floor
from linattn_theory.theory.profile import profile_objective  # noqa: E402

# (a) scalar value block (d = 1, H = 1, p = 1): the closed form of claim 2 with general E
scalar_clients = planted_kernel_clients(num_clients=2, samples_per_client=30, tokens=3, dim=1, rank=1, outputs=1,
                                        zeta_value=1.0, zeta_covariate=1.0, seed=2)
K1 = np.array([[[0.7]]])
moments = host_moments(K1, stack_clients(scalar_clients))
lam_v, eta_v, E_v = 0.1, 0.2, 5
subs = {a1: moments.A[0, 0, 0] + lam_v, a2: moments.A[1, 0, 0] + lam_v, b1s: moments.B[0, 0, 0],
        b2s: moments.B[1, 0, 0], p: moments.weights[0], eta: eta_v, E: E_v}
v_fa_sym = float(v_fa.subs(subs))
v_fa_pkg = float(fedavg_fixed_point(K1, scalar_clients, eta_v, E_v, lam_v)[0, 0])
err = abs(v_fa_pkg - v_fa_sym) / abs(v_fa_sym)
claim("6a package fedavg_fixed_point = closed form of claim 2 (d = 1, E = 5)", err < 1e-12, f"rel err {err:.1e}")
D_sym = float(D.subs(subs))
D_pkg = value_drift_floor(K1, scalar_clients, eta_v, E_v, lam_v)
err = abs(D_pkg - D_sym) / abs(D_sym)
claim("6b package value_drift_floor = ½ ā (v_FA − v*)² (d = 1, E = 5)", err < 1e-9, f"rel err {err:.1e}")

# (b) matrix leading order on a multi-head instance: D(η)/η² → (E−1)²/8 tr(ZᵀÃ⁻¹Z), error O(η)
clients = planted_kernel_clients(num_clients=3, samples_per_client=40, tokens=4, dim=3, heads=2, rank=2,
                                 outputs=2, zeta_value=1.0, zeta_covariate=1.0, seed=3)
K = kernel(Params.init(3, 2, 2, heads=2, seed=5))
lam_v, E_v = 0.1, 3
moments = host_moments(K, stack_clients(clients))
A_c = moments.A + lam_v * np.eye(moments.A.shape[-1])
A_bar = np.sum(moments.weights[:, None, None] * A_c, axis=0)
_, V_st = profile_objective(K, clients, lam_v)
Z = np.sum(moments.weights[:, None, None] * (A_c @ (A_c @ V_st - moments.B)), axis=0)
leading = (E_v - 1) ** 2 / 8 * np.sum(Z * np.linalg.solve(A_bar, Z))
errors = [abs(value_drift_floor(K, clients, h, E_v, lam_v) / h**2 / leading - 1) for h in (1e-4, 5e-5)]
claim("6c package D(η)/η² → (E−1)²/8 tr(ZᵀÃ⁻¹Z) with an O(η) error",
      errors[0] < 1e-2 and 1.6 < errors[0] / errors[1] < 2.4,
      f"rel err {errors[0]:.1e} at η = 1e-4, {errors[1]:.1e} at η = 5e-5")

finish()
