"""Freeze signals of round 4, each a small pure function of a run's history (docs/theory.md §8,
"Round 4: new signals and named information sets").

* the value block's **stability margin** ``m_t = 2 − η max_c λ_max(Ã_c(K_t))`` (docs/theory.md §5)
  and the round at which its straight-line trend reaches zero (:func:`stability_margin`,
  :func:`margin_crossing`): the local value steps lose their stability as the learned kernel
  raises the curvature, which announces FedAvg's late rise before it happens;
* **stopping with recall** (:func:`offers`, :func:`price_of_waiting`, :func:`recall_margin`): the
  best option of freezing now, ``B_t = min_{s ≤ t} J(s, T − t)``, is exact, so the price of having
  waited, ``W_t = B_t − min_{u ≤ t} B_u ≥ 0``, is known exactly at every round;
* the same recall on the **observed losses** ``F_λ(θ_u)`` alone (:func:`price_of_waiting` of the loss
  series: its rise above its best so far), which a server sees without any moment;
* a **forecast of FedAvg's end** from the decomposition ``F_λ(θ_t) = Φ_λ(K_t) + D(K_t) + L_t`` with
  each term extrapolated along its own trend (:func:`decomposition_forecast`), in place of one
  straight line through ``F_λ``.

Every function reads differences of objectives only, so ``Φ*_λ`` cancels: a record's excess risks
(``J − Φ*_λ``) give the same verdicts as the objectives of a run in training.
"""

from __future__ import annotations

import numpy as np

__all__ = ["stability_margin", "margin_crossing", "offers", "price_of_waiting", "lookahead_price", "recall_margin",
           "second_difference_noise", "decomposition_forecast"]


def _slope_and_sigma(values) -> tuple[float, float]:
    """Least-squares slope of ``values`` against their index and the residual standard deviation
    ``σ = √(Σ r²/(n − 2))`` (0 for two points or fewer)."""
    y = np.asarray(values, dtype=float)
    if len(y) < 2:
        return 0.0, 0.0
    x = np.arange(len(y), dtype=float) - (len(y) - 1) / 2.0
    b = float(np.sum(x * (y - y.mean())) / np.sum(x * x))
    r = y - y.mean() - b * x
    return b, float(np.sqrt(np.sum(r * r) / (len(y) - 2))) if len(y) > 2 else 0.0


def stability_margin(curvatures, learning_rate: float) -> float:
    """``m = 2 − η max_c λ_max(Ã_c)``: the value block's distance from the instability of the local
    steps (docs/theory.md §5, "Stability"; positive: every client's local value steps are stable).

    Parameters
    ----------
    curvatures : array_like, shape (m,)
        ``λ_max(Ã_c)`` per client (:func:`~linattn_theory.core.curvature.value_curvature`, ridge included).
    learning_rate : float
        ``η``.

    Returns
    -------
    float
        ``m`` (``−∞`` when a curvature is not finite).

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import stability_margin
    >>> stability_margin([10.0, 40.0, 25.0], 0.02)
    1.2
    """
    top = float(np.max(np.asarray(curvatures, dtype=float)))
    return 2.0 - learning_rate * top if np.isfinite(top) else float("-inf")


def margin_crossing(margins, window: int) -> float:
    """The round at which the straight line through the stability margins ``m_u``, ``u = t − w..t``
    (``t = len(margins) − 1``, ``w = window``), reaches zero: ``t + m_t/(−b)`` for a falling margin
    (slope ``b < 0``), ``t`` when ``m_t ≤ 0`` already (or ``−∞``: a state that is no longer finite),
    ``+∞`` when the margin does not fall or is unknown (``NaN``: a record before format 4).

    Parameters
    ----------
    margins : sequence of float
        ``m_0..m_t``.
    window : int
        ``w``.

    Returns
    -------
    float
        The forecast round of the crossing.

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import margin_crossing
    >>> margin_crossing([1.0, 0.9, 0.8, 0.7], window=3)      # falls by 0.1 a round from 0.7 at t = 3
    10.0
    """
    m = np.asarray(margins, dtype=float)
    t = len(m) - 1
    if np.isnan(m[-1]):
        return float("inf")
    if m[-1] <= 0:
        return float(t)
    slope, _ = _slope_and_sigma(m[-window - 1:])
    return float(t + m[-1] / -slope) if slope < 0 else float("inf")


def offers(options_by_round) -> np.ndarray:
    """``B_u = min_{s ≤ u} J(s, T − u)`` for ``u = 0..t``: the best option of freezing at round ``u``
    (a roll-back allowed), from ``options_by_round[u] = J(0..u, T − u)``.

    Parameters
    ----------
    options_by_round : sequence of array_like
        Entry ``u``: the options ``J(s, T − u)`` of the stored rounds ``s ≤ u``.

    Returns
    -------
    numpy.ndarray, shape (t + 1,)
        ``B_0..B_t`` (non-finite options never win).

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import offers
    >>> offers([[3.0], [2.5, 4.0], [float("nan"), 3.0, 1.0]]).tolist()
    [3.0, 2.5, 1.0]
    """
    best = []
    for row in options_by_round:
        row = np.asarray(row, dtype=float)
        row = row[np.isfinite(row)]
        best.append(float(np.min(row)) if len(row) else float("inf"))
    return np.asarray(best)


def price_of_waiting(offer_values) -> float:
    """``W_t = B_t − min_{u ≤ t} B_u ≥ 0``: how much the best option available now is worse than the
    best option offered at any earlier round — the exact price of having waited (docs/theory.md §8).

    Parameters
    ----------
    offer_values : sequence of float
        ``B_0..B_t`` (:func:`offers`).

    Returns
    -------
    float
        ``W_t``.

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import price_of_waiting
    >>> price_of_waiting([5.0, 4.0, 3.5, 3.75])
    0.25
    """
    B = np.asarray(offer_values, dtype=float)
    return float(B[-1] - np.min(B))


def lookahead_price(next_options, offer_values) -> float:
    """``min_{s ≤ t} J(s, T − t − 1) − min_{u ≤ t} B_u``: the price of waiting one round more, bounded
    before it is paid (docs/theory.md §8, "Round 7"). Waiting makes the next offer
    ``B_{t+1} = min(min_{s ≤ t} J(s, T − t − 1), J(t + 1, T − t − 1))``; the next kernel only adds an
    option, so ``B_{t+1} − min_u B_u`` is at most this number, which the stored kernels give exactly.
    The price :func:`price_of_waiting` reports is the one already paid; this one can jump when the
    frozen rounds left run out (at ``t = T − 1`` the options are the stored iterates, ``J(s, 0)``).

    Parameters
    ----------
    next_options : sequence of float
        ``J(s, T − t − 1)``, ``s = 0..t`` (non-finite options never win).
    offer_values : sequence of float
        ``B_0..B_t`` (:func:`offers`).

    Returns
    -------
    float
        The bound on the next round's price of waiting.

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import lookahead_price, price_of_waiting
    >>> B = [5.0, 4.0, 3.0]                       # the offers so far: the price paid is 0
    >>> price_of_waiting(B), lookahead_price([4.5, 3.6, 3.25], B)    # one frozen round fewer costs 0.25
    (0.0, 0.25)
    """
    options = np.asarray(next_options, dtype=float)
    options = options[np.isfinite(options)]
    best_next = float(np.min(options)) if len(options) else float("inf")
    return best_next - float(np.min(np.asarray(offer_values, dtype=float)))


def second_difference_noise(values) -> float:
    """Round-to-round noise ``s`` of a series from its second differences: for ``y_u = g(u) + e_u``
    with ``g`` smooth (a trend and a slowly changing slope drop out) and ``e_u`` independent of
    variance ``s²``, ``Var(y_{u+1} − 2y_u + y_{u−1}) = 6 s²``, so ``s = √(mean((Δ²y)²)/6)``. Unlike the
    residuals of a straight line, a smooth but curved path (a descent slowing down) is not counted
    as noise (0 for fewer than four values or a non-finite one).

    Parameters
    ----------
    values : sequence of float
        ``y_u`` over a window.

    Returns
    -------
    float
        ``s``.

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import second_difference_noise
    >>> second_difference_noise([1.0, 4.0, 9.0, 16.0, 25.0])    # a parabola: Δ²y = 2 everywhere
    0.816496580927726
    >>> second_difference_noise([8.0, 4.0, 2.0, 1.0, 0.5])      # halving steps (a line's residual σ: 1.26)
    0.5400617248673217
    """
    y = np.asarray(values, dtype=float)
    if len(y) < 4 or not np.all(np.isfinite(y)):
        return 0.0
    d2 = np.diff(y, 2)
    return float(np.sqrt(np.mean(d2 * d2) / 6.0))


def recall_margin(offer_values, scale: float, fraction: float, window: int, confidence: float) -> float:
    """The price of waiting a recall rule tolerates: ``max(ε · scale, z σ_B)``, ``ε = fraction`` of a
    scale the rule names, and ``z = confidence`` times the residual standard deviation ``σ_B`` of the
    straight line through the offers ``B_u``, ``u = t − w..t`` (their round-to-round noise under
    minibatches and client sampling).

    The exact recall rule (:class:`~.rules.ValueMomentsRecallRule`) takes as scale the value part of
    its best offer, ``B* − Φ_λ(K_{s*})`` (which is at most that offer's excess risk, the bias being
    ``≥ 0``), so a price within ``ε · scale`` costs at most a share ``ε`` of the best offer's excess
    risk; the server's rule takes its best observed loss.

    Parameters
    ----------
    offer_values : sequence of float
        ``B_0..B_t``.
    scale : float
        The scale of ``ε``.
    fraction, window, confidence
        ``ε``, ``w``, ``z``.

    Returns
    -------
    float
        The tolerated price.

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import recall_margin
    >>> recall_margin([5.0, 4.0, 3.0, 3.0], scale=2.0, fraction=0.1, window=3, confidence=0.0)
    0.2
    """
    B = np.asarray(offer_values, dtype=float)
    _, sigma = _slope_and_sigma(B[-window - 1:])
    return float(max(fraction * scale, confidence * sigma))


def decomposition_forecast(profile, drift_floor, objective, T: int, window: int) -> float:
    """FedAvg's final objective forecast term by term from ``F_λ(θ_t) = Φ_λ(K_t) + D(K_t) + L_t``
    (``L_t`` the rest: the value block's lag behind ``V_FA(K_t)``; docs/theory.md §4, §6). The profile
    falls as an inexact linearly convergent descent (§4): its steps ``Δ_u = Φ_u − Φ_{u−1}`` shrink by
    the ratio ``q = Σ Δ_u Δ_{u−1} / Σ Δ²_{u−1}`` (least squares over the last ``w`` steps), so the
    remaining fall is ``Δ_t (q + q² + … + q^{T−t})`` (``(T − t) Δ_t`` when ``q ≥ 1``, none while
    ``Δ_t ≥ 0`` or ``q < 0``); the drift floor grows along its least-squares slope over
    ``u = t − w..t`` (increases only); the lag is held:
    ``F̂_T = Φ_t + ΔΦ_rest + D_t + (T − t) max(0, b_D) + L_t``.

    Parameters
    ----------
    profile, drift_floor, objective : sequence of float
        ``Φ_λ(K_u)``, ``D(K_u)`` and ``F_λ(θ_u)`` for ``u = 0..t`` (``Φ*_λ`` may be subtracted from
        the profile and the objective alike).
    T : int
        Rounds of the run.
    window : int
        ``w`` (at least 2 rounds of steps are used).

    Returns
    -------
    float
        ``F̂_T``.

    Examples
    --------
    >>> from linattn_theory.recommenders.signals import decomposition_forecast
    >>> round(decomposition_forecast([4.0, 3.0, 2.5], [0.1, 0.2, 0.3], [5.0, 3.6, 3.0], T=4, window=2), 12)
    2.825
    """
    phi, D, F = (np.asarray(v, dtype=float) for v in (profile, drift_floor, objective))
    t, k = len(F) - 1, T - (len(F) - 1)
    steps = np.diff(phi)[-max(window, 2):]
    rest = 0.0
    if len(steps) >= 2 and steps[-1] < 0:
        prev, now = steps[:-1], steps[1:]
        q = float(np.sum(now * prev) / np.sum(prev * prev))
        if q >= 1.0:
            rest = k * steps[-1]
        elif q >= 0.0:
            rest = steps[-1] * q * (1.0 - q ** k) / (1.0 - q) if q > 0 else 0.0
    b_D, _ = _slope_and_sigma(D[-window - 1:])
    lag = F[-1] - phi[-1] - D[-1]
    return float(phi[-1] + rest + D[-1] + k * max(0.0, b_D) + lag)
