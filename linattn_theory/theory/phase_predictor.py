"""The a-priori predictor of where freezing pays against tuned FedAvg (docs/theory.md §6, "Where
freezing pays"), declared before any instance of the phase diagram was scored (issue 30, item 6).

It knows only what is known when a run starts: the local step ``η``, the local steps ``E``, the
full model's curvature at ``θ⁰``, ``λ_max = max_c λ_max(∇²F_{λ,c}(θ⁰))`` (the step scale of
``simulations/configs/phase_diagram.toml`` is ``c = ηλ_max/2``), and the drift floor's leading order
at the initial kernel, ``D₂(K⁰) = η²(E−1)²/8 ‖𝒵‖²_{Ã⁻¹}`` (§5), relative to the profile ``Φ_λ(K⁰)``.

The declared reasoning (§5): the curvature grows as the kernel is learned (the full model's
``λ_max`` grew by a factor 2.1–4.9 over the 40 rounds of the headline's instances, §5), so a run
whose step is stable at ``θ⁰`` reaches the edge of stability ``ηλ_max(θ^t) = 2`` during training
when its stability margin ``m = 2 − ηλ_max(θ⁰)`` is small. Modelling the growth as geometric over
the ``T`` rounds, ``λ_max(θ^t) = λ_max(θ⁰) g^{t/T}`` with the declared factor
:data:`CURVATURE_GROWTH` ``g = 3`` (the geometric mean of 2.1 and 4.9, rounded), the run meets the
edge in round

    t_edge = T · ln(2 / (ηλ_max(θ⁰))) / ln g = T · ln(2 / (2 − m)) / ln g ,

and freezing pays — it stops the kernel before FedAvg's late rise, which a FedAvg tuned to a
smaller step avoids only by learning the kernel more slowly — exactly when ``t_edge < T``, i.e.
``ηλ_max(θ⁰) > 2/g``; the best warm-up is then ``T0 = t_edge`` (the last round before the edge),
otherwise ``T0 = T`` (plain FedAvg). The drift share ``D₂(K⁰)/Φ_λ(K⁰)`` is declared as a second,
continuous score (freezing cannot remove the drift floor, §5, but a large floor is where the kernel's
drift is large too); it is scored by its AUC only, with no threshold.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["CURVATURE_GROWTH", "GAIN_THRESHOLD", "stability_margin", "drift_share", "edge_round",
           "predict_pays", "predict_best_warmup"]

#: declared growth of the full model's ``λ_max`` over a run (§5: 2.1–4.9 on the headline's instances)
CURVATURE_GROWTH = 3.0
#: a gain counts as a win above this (issue 30): ``1 − R_frozen / R_tuned FedAvg > 0.02``
GAIN_THRESHOLD = 0.02


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} = {value!r}: expected a finite number > 0")
    return value


def stability_margin(eta: float, curvature: float) -> float:
    """``m = 2 − η λ_max(θ⁰)`` (§5): ``> 0`` where gradient descent on the full model is stable at ``θ⁰``.

    Parameters
    ----------
    eta : float
        The step ``η``.
    curvature : float
        ``λ_max(θ⁰)``, the largest Hessian eigenvalue of the clients' objectives at ``θ⁰``.

    Returns
    -------
    float
        The margin ``m``.

    Examples
    --------
    >>> from linattn_theory.theory.phase_predictor import stability_margin
    >>> stability_margin(0.5, 2.5)
    0.75
    """
    return 2.0 - _positive("eta", eta) * _positive("curvature", curvature)


def drift_share(leading_order: float, profile: float) -> float:
    """``D₂(K⁰) / Φ_λ(K⁰)``: the drift floor's leading order (§5) as a share of the profile at ``K⁰``.

    Parameters
    ----------
    leading_order : float
        ``D₂(K⁰)``.
    profile : float
        ``Φ_λ(K⁰)`` (``> 0``).

    Returns
    -------
    float
        Their ratio.

    Examples
    --------
    >>> from linattn_theory.theory.phase_predictor import drift_share
    >>> drift_share(0.02, 0.5)
    0.04
    """
    if not (float(leading_order) >= 0 and math.isfinite(float(leading_order))):
        raise ValueError(f"leading_order = {leading_order!r}: expected a finite number >= 0")
    return float(leading_order) / _positive("profile", profile)


def edge_round(margin: float, rounds: int, growth: float = CURVATURE_GROWTH) -> float:
    """``t_edge = T ln(2/(2 − m)) / ln g``: the round at which ``ηλ_max(θ^t) = 2`` if ``λ_max`` grows
    geometrically by ``g`` over ``T`` rounds (``0`` when the step is unstable at ``θ⁰``, ``m ≤ 0``).

    Parameters
    ----------
    margin : float
        The stability margin ``m`` (:func:`stability_margin`).
    rounds : int
        ``T``.
    growth : float, default CURVATURE_GROWTH
        ``g``, the growth of ``λ_max`` over the run.

    Returns
    -------
    float
        ``t_edge`` (may exceed ``T``: the run ends before the edge).

    Examples
    --------
    >>> from linattn_theory.theory.phase_predictor import edge_round
    >>> round(edge_round(0.5, 100, growth=2.0), 2)           # 100 · ln(2/1.5) / ln 2
    41.5
    >>> edge_round(-0.1, 100)
    0.0
    """
    growth = _positive("growth", growth)
    if growth <= 1:
        raise ValueError(f"growth = {growth!r}: expected a factor > 1")
    if not (isinstance(rounds, (int, np.integer)) and rounds >= 1):
        raise ValueError(f"rounds = {rounds!r}: expected an integer >= 1")
    if not (margin < 2 and math.isfinite(margin)):
        raise ValueError(f"margin = {margin!r}: expected a finite number < 2 (η λ_max > 0)")
    if margin <= 0:
        return 0.0
    return rounds * math.log(2.0 / (2.0 - margin)) / math.log(growth)


def predict_pays(margin: float, rounds: int, growth: float = CURVATURE_GROWTH) -> bool:
    """(a) FedFrozen at its best ``T0`` beats tuned FedAvg by more than :data:`GAIN_THRESHOLD`:
    the run meets the edge before its last round, ``t_edge < T`` (``⇔ ηλ_max(θ⁰) > 2/g``).

    Parameters
    ----------
    margin : float
        The stability margin ``m``.
    rounds : int
        ``T``.
    growth : float, default CURVATURE_GROWTH
        ``g``.

    Returns
    -------
    bool
        The prediction (a).

    Examples
    --------
    >>> from linattn_theory.theory.phase_predictor import predict_pays
    >>> predict_pays(0.5, 100, growth=2.0), predict_pays(1.5, 100, growth=2.0)     # ηλ_max = 1.5, 0.5 vs 2/g = 1
    (True, False)
    """
    return edge_round(margin, rounds, growth) < rounds


def predict_best_warmup(margin: float, rounds: int, grid=None, growth: float = CURVATURE_GROWTH) -> int:
    """(b) the best warm-up: ``T`` where :func:`predict_pays` says no, else ``⌊t_edge⌋``, the last
    round before the edge; with a ``grid`` of warm-ups, its largest value ``≤`` that round (or its
    smallest).

    Parameters
    ----------
    margin : float
        The stability margin ``m``.
    rounds : int
        ``T``.
    grid : sequence of int, optional
        The warm-ups allowed (default: every round ``0..T``).
    growth : float, default CURVATURE_GROWTH
        ``g``.

    Returns
    -------
    int
        The predicted best ``T0``.

    Examples
    --------
    >>> from linattn_theory.theory.phase_predictor import predict_best_warmup
    >>> predict_best_warmup(0.5, 100, growth=2.0), predict_best_warmup(1.5, 100, growth=2.0)
    (41, 100)
    >>> predict_best_warmup(0.5, 100, grid=[0, 10, 20, 40, 80], growth=2.0)
    40
    """
    T0 = rounds if not predict_pays(margin, rounds, growth) else int(math.floor(edge_round(margin, rounds, growth)))
    if grid is None:
        return T0
    grid = sorted(int(g) for g in grid)
    below = [g for g in grid if g <= T0]
    return below[-1] if below else grid[0]
