"""The exponents of the value drift floor's scaling law, derived with sympy (docs/theory.md §5).

The exponents of ``D ∝ η^a (E−1)^b ζ^c`` are not typed in: :func:`drift_exponents` reads them
off the exact drift floor of the smallest heterogeneous instance, two equally weighted scalar
clients with curvatures ``a(1 ± α)`` and optima ``v ± δ`` (docs/theory.md §5):

* ``a``: the order of the first non-zero term of the Taylor series of ``D(η)`` at ``η = 0``
  (``E`` symbolic), from the series of the numerator and denominator of ``V_FA − V*``;
* ``b``: that leading coefficient, written in ``s = E − 1``, is a monomial ``C s^b``;
* ``c``: ``D`` and ``ζ`` are homogeneous in the client spread ``δ`` at fixed curvatures, of
  degrees ``k_D`` and ``k_ζ`` (from ``x ∂_x log f``); ``c = k_D / k_ζ``.

The simulations and tests compare measured log–log slopes with these numbers
(``derivations/tradeoff.py`` claim E3 checks them against the package's ``value_drift_floor``).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["drift_floor_two_clients", "drift_exponents"]


def drift_floor_two_clients():
    """Exact drift floor of two scalar clients, ``p_c = ½`` (docs/theory.md §5).

    ``V_FA − V* = N(η)/P(η)`` with ``N = Σ p_c P_c (v_c − V*)``, ``P = Σ p_c P_c``,
    ``P_c = 1 − (1 − η a_c)^E``, ``V* = Σ p_c a_c v_c / Ã``; ``D = ½ Ã (N/P)²``;
    ``ζ² = Σ_c p_c g_c²``, ``g_c = a_c (V* − v_c)``. Returns a dict of sympy expressions
    (``D``, ``N``, ``P``, ``A``, ``zeta``) and symbols (``a, alpha, v, delta, eta, E``).

    Returns
    -------
    dict
        The expressions and symbols.

    Examples
    --------
    >>> import sympy
    >>> from linattn_theory.theory.scaling_laws import drift_floor_two_clients
    >>> law = drift_floor_two_clients()
    >>> law["D"].subs(law["E"], 1).simplify()                 # one local step: no drift
    0
    """
    import sympy as sp

    a, al, v, de, eta = sp.symbols("a alpha v delta eta", positive=True)
    E = sp.symbols("E", positive=True, integer=True)
    p = sp.Rational(1, 2)
    a_c, v_c = [a * (1 + al), a * (1 - al)], [v + de, v - de]
    P_c = [1 - (1 - eta * x) ** E for x in a_c]
    A = sum(p * x for x in a_c)
    V_star = sum(p * x * y for x, y in zip(a_c, v_c)) / A
    N = sum(p * P * (y - V_star) for P, y in zip(P_c, v_c))
    P = sum(p * P for P in P_c)
    zeta = sp.sqrt(sum(p * (x * (V_star - y)) ** 2 for x, y in zip(a_c, v_c)))
    return {"D": sp.Rational(1, 2) * A * (N / P) ** 2, "N": N, "P": P, "A": A, "zeta": zeta,
            "a": a, "alpha": al, "v": v, "delta": de, "eta": eta, "E": E}


def _leading_term(expr, x, max_order: int):
    """``(k, c)``: the first non-zero Taylor term ``c x^k`` of ``expr`` at ``x = 0``, ``k ≤ max_order``."""
    import sympy as sp

    series = sp.expand(sp.series(expr, x, 0, max_order + 1).removeO())
    for k in range(max_order + 1):
        coefficient = sp.factor(sp.simplify(series.coeff(x, k)))
        if coefficient != 0:
            return k, coefficient
    raise ValueError(f"no non-zero term up to {x}^{max_order}")


def _homogeneity_degree(expr, x) -> float:
    """``k`` with ``f(s x) = s^k f(x)``, from ``x ∂_x log f`` (which must be free of every symbol)."""
    import sympy as sp

    degree = sp.simplify(x * sp.diff(expr, x) / expr)
    if degree.free_symbols:
        raise ValueError(f"not homogeneous in {x}: x ∂_x log f = {degree}")
    return float(degree)


@lru_cache(maxsize=1)
def drift_exponents(max_order: int = 4) -> dict:
    """Exponents of the drift floor's leading order in ``η``, ``E − 1`` and ``ζ`` (docs/theory.md §5).

    Returns ``{"eta": a, "local_steps_minus_one": b, "zeta": c}`` (floats) derived from the exact
    two-client drift floor: ``N`` and ``P`` both vanish at ``η = 0``, so with their leading Taylor
    terms ``n η^i`` and ``p η^j``, ``V_FA − V* = (n/p) η^{i−j} + …`` and ``D = ½Ã(n/p)² η^{2(i−j)} + …``;
    that coefficient must be a monomial in ``E − 1``. Raises otherwise.
    """
    import sympy as sp

    f = drift_floor_two_clients()
    eta, E = f["eta"], f["E"]
    (i, n), (j, p) = _leading_term(f["N"], eta, max_order), _leading_term(f["P"], eta, max_order)
    leading = sp.factor(f["A"] * (n / p) ** 2 / 2)
    s = sp.symbols("s", positive=True)
    in_s = sp.Poly(sp.expand(leading.subs(E, s + 1)), s)
    if len(in_s.terms()) != 1:
        raise ValueError(f"the leading coefficient is not a monomial in E − 1: {leading}")
    (power,), _ = in_s.terms()[0]
    zeta_exponent = _homogeneity_degree(f["D"], f["delta"]) / _homogeneity_degree(f["zeta"], f["delta"])
    return {"eta": float(2 * (i - j)), "local_steps_minus_one": float(power), "zeta": zeta_exponent}
