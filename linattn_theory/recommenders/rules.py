"""Freezing rules of round 4, one per information set (docs/theory.md §8, "Round 4: new signals and
named information sets").

Each rule's name and docstring say what it reads; each decides at round ``t`` from rounds ``≤ t``
only, through ``decide(forecasts, T)`` like :class:`~.online.OnlineRule`, so the regret benchmark
replays all of them on the same records (:func:`~.scoring.replay_online`) and realises each
decision by its ``outcome`` (:func:`~.scoring.realised_risk`):

* :class:`ValueMomentsRecallRule` — information set **(a) client value moments** (``Ã_c, B_c`` at
  every stored kernel, as :class:`~.online.OnlineRule`): stopping with recall on the exact offers
  ``J(s, T − t)``, optionally the stability margin and a no-harm test;
* :class:`ServerObservableRule` — information set **(b) what a server observes**: the global
  parameters and the clients' reported losses, no moment; it reads ``F_λ(θ_u)`` alone;
* :class:`ValueSolveRule` — information set **(c) = (a) plus the exact value solve**
  (strategy ``value_solve``, docs/theory.md §5); from round 5 with a forecast of FedAvg's last round
  (``profile_trend``), which may decline the solve; from round 6 optionally after the ``T`` rounds
  (``after_budget``), in the evaluation step in which every rule reads round ``T``.

:data:`RULES` registers them by name, with today's :class:`~.online.OnlineRule` as ``online``;
:data:`INFORMATION_SETS` says each one's information set in a sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .online import (OnlineDecision, OnlineRule, freeze_options, freeze_risk, profiles_and_floors, escape_round,
                     fedavg_forecast)
from .signals import (decomposition_forecast, lookahead_price, margin_crossing, offers, price_of_waiting, recall_margin,
                      second_difference_noise)

__all__ = ["INFORMATION_SETS", "RULES", "ValueMomentsRecallRule", "ServerObservableRule", "ValueSolveRule",
           "observed_losses", "last_round_forecast", "make_rule"]

#: The information sets of round 4 (docs/theory.md §8), one sentence each.
INFORMATION_SETS = {
    "value_moments": ("(a) client value moments: every client's Ã_c and B_c at every stored kernel, "
                      "(Hd)² + Hdp numbers per client and round, hence the exact J(s, k)"),
    "server_observable": ("(b) what a server observes: the global parameters and the clients' reported "
                          "losses (their weighted mean plus the ridge term is F_λ(θ_u)); no moment"),
    "value_moments_and_solve": ("(c) the client value moments of (a) and the option of the exact value "
                                "solve V*_λ(K) at a stored kernel (strategy value_solve)"),
}


def _check_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}.{name} = {value!r}; expected an integer >= 1")


def _check_number(owner: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value < 0:
        raise ValueError(f"{owner}.{name} = {value!r}; expected a finite number >= 0")


def _check_recall(rule) -> None:
    """A recall rule's ``window`` (an integer ≥ 1), ``fraction`` and ``confidence`` (finite, ≥ 0)."""
    _check_int(type(rule).__name__, "window", rule.window)
    for name in ("fraction", "confidence"):
        _check_number(type(rule).__name__, name, getattr(rule, name))


def _round_and_check(forecasts, T: int) -> int:
    t = len(forecasts) - 1
    if not 0 <= t <= T:
        raise ValueError(f"{len(forecasts)} forecasts for T = {T} rounds; expected 1..T+1")
    return t


def observed_losses(forecasts) -> np.ndarray:
    """``F_λ(θ_u)``, ``u = 0..t``: the training objective of the stored iterates, ``J(u, 0)`` (what a
    server observes as the clients' reported losses; nothing else of ``forecasts`` is read).

    Parameters
    ----------
    forecasts : sequence of FreezeForecast
        The stored rounds' forecasts ``0..t`` (or a record's table, which has ``column``).

    Returns
    -------
    numpy.ndarray, shape (t + 1,)
        ``J(u, 0) = F_λ(θ_u)``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]      # F_λ(θ_u), u = 0..9
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, L=L: L, profile=L / 2, drift_floor=0.0)
    ...              for u, L in enumerate(losses)]           # stand-ins: J(u, k) = F_λ(θ_u), Φ_λ(K_u) = F_λ / 2
    >>> from linattn_theory.recommenders.rules import observed_losses
    >>> observed_losses(forecasts)[:5].tolist()
    [5.0, 4.0, 3.0, 2.0, 1.0]
    """
    return np.asarray(freeze_options(forecasts, 0), dtype=float)


def _offers(forecasts, T: int) -> np.ndarray:
    """``B_0..B_t`` (:func:`~.signals.offers`; a record's table gives them at once, the same numbers)."""
    if hasattr(forecasts, "offers"):
        return forecasts.offers(T)
    return offers([freeze_options(forecasts[:u + 1], T - u) for u in range(len(forecasts))])


def _value_part(forecasts, offer_values, T: int) -> float:
    """``B* − Φ_λ(K_{s**})``: the best offer ``B* = B_{u*}`` (``u* = argmin_u B_u``) less the profile of
    its kernel ``s** = argmin_{s ≤ u*} J(s, T − u*)``, the value block's part of it (``≥ 0``)."""
    u = int(np.argmin(offer_values))
    options = np.asarray(freeze_options(forecasts[:u + 1], T - u), dtype=float)
    s = int(np.argmin(np.where(np.isfinite(options), options, np.inf)))
    profile, _ = profiles_and_floors(forecasts[:u + 1])
    return float(offer_values[u] - profile[s])


def _loss_offset(forecasts) -> float:
    """What turns ``J(u, 0)`` into the loss the server observes: ``Φ*_λ`` for a record's forecasts
    (which store ``J − Φ*_λ``), 0 for a run's own."""
    if hasattr(forecasts, "optimum"):
        return float(forecasts.optimum)
    return float(getattr(forecasts[0], "optimum", 0.0)) if len(forecasts) else 0.0


def _margins(forecasts) -> list:
    if hasattr(forecasts, "stability_margins"):
        return forecasts.stability_margins
    return [f.stability_margin for f in forecasts]


def _best_iterate(losses, T: int, t: int, test: str, reason: str) -> OnlineDecision:
    """The decision at ``t = T``: end with the stored iterate of the smallest observed loss (``θ_T``:
    plain FedAvg)."""
    s = int(np.argmin(np.where(np.isfinite(losses), losses, np.inf)))
    nan = float("nan")
    return OnlineDecision(t, True, s, float(losses[s]), nan, nan, float(losses[-1]), nan, test, reason,
                          "iterate" if s < T else "freeze")


@dataclass(frozen=True)
class ValueMomentsRecallRule:
    """Information set (a), client value moments: **stopping with recall** on the exact offers.

    At round ``t`` the best option of freezing now, a roll-back allowed, is
    ``B_t = min_{s ≤ t} J(s, T − t)`` (exact, :class:`~.online.FreezeForecast`), and the price of
    having waited is ``W_t = B_t − min_{u ≤ t} B_u`` (:func:`~.signals.price_of_waiting`). After the
    escape from the saddle (:func:`~.online.escape_round`, window ``w``) the rule keeps training
    while ``W_t ≤ max(ε (B* − Φ_λ(K_{s**})), z σ_B)`` (:func:`~.signals.recall_margin`), with
    ``B* = min_u B_u`` and ``K_{s**}`` the kernel of that best offer, and freezes ``K_{s*}``,
    ``s* = argmin_s J(s, T − t)``, when the price leaves that margin. Its final objective is the
    best offer it ever had plus the price ``W_t`` it reports (``cost``; exact with full batches and
    full participation), and ``B* − Φ_λ(K_{s**})``, the value block's part of the best offer, is at
    most that offer's excess risk: a price within ``ε`` of it costs at most a share ``ε`` of the best
    offer's excess risk (plus the last round's step, and the noise margin ``z σ_B``). With ``stability`` it also freezes when the straight
    line through the value block's stability margins ``2 − η max_c λ_max(Ã_c(K_u))`` over the
    window reaches zero before round ``T`` (:func:`~.signals.margin_crossing`: FedAvg's local value
    steps are about to lose their stability). With ``no_harm = z_h`` a stop also needs
    ``B_t < F̂_T − z_h σ`` (FedAvg's end forecast by a straight line, ``forecast = "line"``,
    :func:`~.online.fedavg_forecast`, or term by term, ``"decomposition"``,
    :func:`~.signals.decomposition_forecast`). At ``t = T`` it ends with the stored iterate of the
    smallest training objective (recall; ``θ_T`` is plain FedAvg).

    Round 7's options (docs/theory.md §8, "Round 7"): ``lookahead`` compares the price of waiting
    one round more, ``min_{s ≤ t} J(s, T − t − 1) − min_u B_u`` (:func:`~.signals.lookahead_price`,
    exact from the stored kernels), instead of the price already paid; ``margin = "noisy"`` adds the
    noise margin ``z σ_B`` only where the run samples (minibatches or partial participation,
    ``forecasts.noisy``): with full batches the offers are exact, and ``σ_B`` would measure their
    curvature, not noise; ``no_harm_noise = "second_differences"`` takes the no-harm test's ``σ``
    from the second differences of ``F_λ(θ_u)`` over the window
    (:func:`~.signals.second_difference_noise`), so that a descent slowing down smoothly is not
    counted as forecast error in FedAvg's favour.

    Parameters
    ----------
    window : int, default 10
        ``w``.
    fraction : float, default 0.05
        ``ε``.
    confidence : float, default 2.0
        ``z``.
    stability : bool, default False
        Use the stability-margin signal.
    no_harm : float or None, default None
        ``z_h`` (``None``: no no-harm test).
    forecast : {"line", "decomposition"}, default "line"
        FedAvg's end forecast of the no-harm test.
    lookahead : bool, default False
        Compare the price of waiting one round more (round 7) instead of the price paid.
    margin : {"always", "noisy"}, default "always"
        Where the noise margin ``z σ_B`` applies (``"noisy"``: only where the run samples; the
        forecasts must say so, ``forecasts.noisy``).
    no_harm_noise : {"line", "second_differences"}, default "line"
        The no-harm test's ``σ``: the straight line's residuals, or second differences.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]      # F_λ(θ_u), u = 0..9
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, L=L: L, profile=L / 2, drift_floor=0.0)
    ...              for u, L in enumerate(losses)]           # stand-ins: J(u, k) = F_λ(θ_u) for every k
    >>> from linattn_theory.recommenders.rules import ValueMomentsRecallRule
    >>> rule = ValueMomentsRecallRule(window=2)
    >>> rule.decide(forecasts[:3], T=20).test                  # R_freeze fell at round 1: w = 2 more rounds
    'escape'
    >>> decision = rule.decide(forecasts, T=20)                # B_t = min_{s ≤ t} J(s, ·): waiting costs nothing
    >>> decision.stop, decision.kernel_round, decision.cost
    (False, 4, 0.0)
    """

    window: int = 10
    fraction: float = 0.05
    confidence: float = 2.0
    stability: bool = False
    no_harm: float | None = None
    forecast: str = "line"
    lookahead: bool = False
    margin: str = "always"
    no_harm_noise: str = "line"
    information_set = "value_moments"

    def __post_init__(self):
        _check_recall(self)
        _check_number(type(self).__name__, "no_harm", self.no_harm, optional=True)
        for name, allowed in (("forecast", ("line", "decomposition")), ("margin", ("always", "noisy")),
                              ("no_harm_noise", ("line", "second_differences"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ValueMomentsRecallRule.{name} = {getattr(self, name)!r}; expected one of "
                                 + ", ".join(map(repr, allowed)))
        if not isinstance(self.lookahead, (bool, np.bool_)):
            raise ValueError(f"ValueMomentsRecallRule.lookahead = {self.lookahead!r}; expected True or False")

    def _confidence(self, forecasts) -> float:
        """``z`` of the noise margin: always, or only where the run samples (``margin = "noisy"``)."""
        if self.margin == "always":
            return self.confidence
        noisy = getattr(forecasts, "noisy", None)
        if noisy is None:
            raise ValueError("ValueMomentsRecallRule(margin='noisy') needs forecasts that say whether the run "
                             "samples (forecasts.noisy: a record's StoredForecasts)")
        return self.confidence if noisy else 0.0

    def decide(self, forecasts, T: int) -> OnlineDecision:
        """The decision at round ``t = len(forecasts) − 1`` from the forecasts of rounds ``0..t``."""
        t = _round_and_check(forecasts, T)
        nan = float("nan")
        if t == T:
            return _best_iterate(observed_losses(forecasts), T, t, "budget",
                                 "warm-up budget spent: the stored iterate of the smallest training objective")
        now = freeze_options(forecasts, T - t)
        s = int(np.argmin(now))
        best = float(now[s])
        risk = freeze_risk(forecasts, T)
        w = self.window

        def go_on(test, reason, price=nan):
            return OnlineDecision(t, False, s, best, nan, price, nan, nan, test, reason)

        ready = escape_round(risk, w)
        if ready is None or t < ready:
            return go_on("escape", f"escaping the saddle: R_freeze has not yet fallen below R_freeze(0) {w} rounds ago")
        B = _offers(forecasts, T)
        price = (lookahead_price(freeze_options(forecasts, T - t - 1), B) if self.lookahead else
                 price_of_waiting(B))
        tolerated = recall_margin(B, _value_part(forecasts, B, T), self.fraction, w, self._confidence(forecasts))
        crossing = margin_crossing(_margins(forecasts), w) if self.stability else float("inf")
        if price <= tolerated and not crossing <= T:
            return go_on("recall", f"the price of waiting {price:.3g} is within its margin {tolerated:.3g}", price)
        test = "recall" if price > tolerated else "stability"
        error, forecast = 0.0, nan
        if self.no_harm is not None:
            objective = observed_losses(forecasts)
            forecast, error = fedavg_forecast(objective, T, w, self.no_harm)
            if self.no_harm_noise == "second_differences":
                error = self.no_harm * second_difference_noise(objective[-w - 1:])
            if self.forecast == "decomposition":
                profile, floor = profiles_and_floors(forecasts)
                forecast = decomposition_forecast(profile, floor, objective, T, w)
            if not best < forecast - error:
                return OnlineDecision(t, False, s, best, nan, price, forecast, error, "no_harm",
                                      f"freezing ({best:.4g}) does not beat FedAvg's forecast {forecast:.4g} "
                                      f"by more than {error:.3g}")
        why = (f"the price of waiting {price:.3g} left its margin {tolerated:.3g}" if test == "recall" else
               f"the value block's stability margin reaches 0 at round {crossing:.3g} ≤ T = {T}")
        return OnlineDecision(t, True, s, best, nan, price, forecast, error, test, f"freeze K_{s}: {why}")


@dataclass(frozen=True)
class ServerObservableRule:
    """Information set (b), what a server observes: the clients' reported losses (their weighted
    mean plus the ridge term of the global parameters is ``L_u = F_λ(θ_u)``); no moment, no forecast.

    Stopping with recall on the observed losses: after ``L`` has first fallen below ``L_0`` and ``w``
    more rounds have passed (the escape, :func:`~.online.escape_round` on ``L``), the rule stops when
    the loss has risen above its best so far by more than ``max(ε min_u L_u, z σ_L)`` (a share ``ε``
    of the best loss the server saw, or ``z`` residual standard deviations of the losses over the window)
    (:func:`~.signals.price_of_waiting` and :func:`~.signals.recall_margin` of the loss series: FedAvg's
    late rise, observed) and recalls the round ``s* = argmin_u L_u``: with ``outcome = "iterate"`` the
    run ends with ``θ_{s*}`` (its loss is observed, so the outcome is known), with ``"freeze"`` it
    freezes ``K_{s*}`` for the remaining rounds (an outcome the server cannot forecast). At ``t = T``
    it ends with the stored iterate of the smallest loss. It reads ``J(u, 0)`` and nothing else of
    the forecasts (:func:`observed_losses`).

    Parameters
    ----------
    window : int, default 10
        ``w``.
    fraction : float, default 0.01
        ``ε``.
    confidence : float, default 2.0
        ``z``.
    outcome : {"iterate", "freeze"}, default "iterate"
        What a stop before ``T`` does.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]      # F_λ(θ_u), u = 0..9
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, L=L: L, profile=L / 2, drift_floor=0.0)
    ...              for u, L in enumerate(losses)]           # stand-ins: J(u, k) = F_λ(θ_u), Φ_λ(K_u) = F_λ / 2
    >>> from linattn_theory.recommenders.rules import ServerObservableRule
    >>> decision = ServerObservableRule(window=2).decide(forecasts, T=20)
    >>> decision.stop, decision.kernel_round, decision.cost, decision.test     # 3.5 − 1.0 > 0.01 · 1.0
    (True, 4, 2.5, 'rise')
    """

    window: int = 10
    fraction: float = 0.01
    confidence: float = 2.0
    outcome: str = "iterate"
    information_set = "server_observable"

    def __post_init__(self):
        _check_recall(self)
        if self.outcome not in ("iterate", "freeze"):
            raise ValueError(f"ServerObservableRule.outcome = {self.outcome!r}; expected 'iterate' or 'freeze'")

    def decide(self, forecasts, T: int) -> OnlineDecision:
        """The decision at round ``t = len(forecasts) − 1`` from the losses of rounds ``0..t``."""
        t = _round_and_check(forecasts, T)
        L = observed_losses(forecasts)
        if t == T:
            return _best_iterate(L, T, t, "budget", "warm-up budget spent: the stored iterate of the smallest loss")
        nan = float("nan")
        s = int(np.argmin(np.where(np.isfinite(L), L, np.inf)))
        ready = escape_round(L, self.window)
        if ready is None or t < ready:
            return OnlineDecision(t, False, s, float(L[s]), nan, nan, nan, nan, "escape",
                                  f"escaping the saddle: the loss has not yet fallen below L_0 {self.window} rounds ago")
        rise = price_of_waiting(L)
        level = float(np.min(L[np.isfinite(L)])) + _loss_offset(forecasts)      # the best loss, as observed
        tolerated = recall_margin(L, level, self.fraction, self.window, self.confidence)
        if not rise > tolerated:
            return OnlineDecision(t, False, s, float(L[s]), nan, rise, nan, nan, "rise",
                                  f"the loss is {rise:.3g} above its best, within {tolerated:.3g}")
        return OnlineDecision(t, True, s, float(L[s]), nan, rise, nan, nan, "rise",
                              f"the loss rose {rise:.3g} above its best (round {s}), beyond {tolerated:.3g}",
                              self.outcome)


@dataclass(frozen=True)
class ValueSolveRule:
    """Information set (c): the client value moments of (a) and the option of the exact value solve
    (strategy ``value_solve``, docs/theory.md §5).

    After the solve at a kernel ``K_s`` the final objective is ``Φ_λ(K_s)``, and every frozen-stage
    option is worse or equal: ``J(s, k) = Φ_λ(K_s) + ½‖V_T − V*_λ(K_s)‖²_Ã ≥ Φ_λ(K_s)``. So with the
    solve at hand the best decision waits: FedAvg runs ``T − 1`` rounds, storing the kernels, and in
    round ``T − 1`` the rule recalls ``s* = argmin_{s ≤ T−1} Φ_λ(K_s)`` and solves the value block at
    ``K_{s*}`` (the solve is one of the ``T`` rounds). Its outcome, ``Φ_λ(K_{s*}) − Φ*_λ``, is exact
    under any noise (the solve uses every client's full data); it may beat every ``T0`` of
    FedFrozen (negative regret).

    The solve gives up FedAvg's last round, in which the kernel still moves. With ``profile_trend = κ
    > 0`` (round 5, docs/theory.md §8) the rule forecasts that round's objective as the exact objective
    of one frozen round at the last kernel less ``κ`` times the profile's last decrease,
    ``F̂_T = J(T−1, 1) − κ (Φ_λ(K_{T−2}) − Φ_λ(K_{T−1}))`` (:func:`last_round_forecast`;
    ``F_λ(θ_T) = Φ_λ(K_T) +`` the value gap, and the kernel's move lowers ``Φ_λ`` by about its last
    decrease), and declines the solve when ``F̂_T < Φ_λ(K_{s*})``: it trains the last round and ends, at
    ``t = T``, with the stored iterate of the smallest training objective (``θ_T`` or an earlier one:
    never worse than FedAvg). ``κ = 0`` is round 4's rule (``J(T−1, 1) ≥ Φ_λ(K_{T−1}) ≥ Φ_λ(K_{s*})``:
    it never declines).

    With ``after_budget`` (round 6, docs/theory.md §8, "Round 6") the solve is no training round: FedAvg
    runs all ``T`` rounds, and at ``t = T`` — the evaluation step in which every rule reads round ``T``
    (its ``F_λ(θ_T)``, and for (a) and (c) the moments at ``K_T``) — the rule solves at
    ``s* = argmin_{s ≤ T} Φ_λ(K_s)``. Its outcome ``Φ_λ(K_{s*}) ≤ Φ_λ(K_T) ≤ F_λ(θ_T)`` is never worse
    than FedAvg's, by construction; nothing is forecast, so ``κ`` must be 0.

    Parameters
    ----------
    profile_trend : float, default 0.0
        ``κ`` (``≥ 0``).
    after_budget : bool, default False
        Solve after the ``T`` rounds (round 6) instead of in round ``T``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]      # F_λ(θ_u), u = 0..9
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, L=L: L, profile=L / 2, drift_floor=0.0)
    ...              for u, L in enumerate(losses)]           # stand-ins: J(u, k) = F_λ(θ_u), Φ_λ(K_u) = F_λ / 2
    >>> from linattn_theory.recommenders.rules import ValueSolveRule
    >>> ValueSolveRule().decide(forecasts, T=20).stop          # t = 9 < T − 1: wait
    False
    >>> decision = ValueSolveRule().decide(forecasts, T=10)    # t = T − 1: solve at the least Φ_λ(K_s)
    >>> decision.stop, decision.kernel_round, decision.freeze_objective
    (True, 4, 0.5)
    >>> falling = [SimpleNamespace(round=u, final_objective=lambda k, L=L: L, profile=L - 0.1, drift_floor=0.0)
    ...            for u, L in enumerate([5.0, 3.0, 2.0, 1.0])]   # Φ_λ(K_u) = F_λ(θ_u) − 0.1, still falling by 1
    >>> rule = ValueSolveRule(profile_trend=0.5)                # F̂_T = 1.0 − 0.5 · 1.0 = 0.5 < Φ_λ(K_3) = 0.9
    >>> decision = rule.decide(falling, T=4)
    >>> decision.stop, decision.fedavg_forecast, decision.test
    (False, 0.5, 'end_forecast')
    >>> after = ValueSolveRule(after_budget=True)               # the solve after the T = 4 rounds
    >>> after.decide(falling, T=4).stop, after.decide(falling + falling[-1:], T=4).kernel_round
    (False, 3)
    """

    profile_trend: float = 0.0
    after_budget: bool = False
    information_set = "value_moments_and_solve"

    def __post_init__(self):
        _check_number(type(self).__name__, "profile_trend", self.profile_trend)
        if not isinstance(self.after_budget, (bool, np.bool_)):
            raise ValueError(f"ValueSolveRule.after_budget = {self.after_budget!r}; expected True or False")
        if self.after_budget and self.profile_trend != 0:
            raise ValueError("ValueSolveRule: after_budget forecasts nothing; profile_trend must be 0")

    def decide(self, forecasts, T: int) -> OnlineDecision:
        """The decision at round ``t = len(forecasts) − 1``: wait until ``t = T − 1``, then solve (or,
        when the forecast of FedAvg's last round beats the solve, train it and end at ``t = T`` with the
        stored iterate of the smallest training objective). With ``after_budget``: wait until ``t = T``,
        then solve at the smallest profile of rounds ``0..T``."""
        t = _round_and_check(forecasts, T)
        if self.after_budget:
            return self._after_budget(forecasts, T, t)
        if t == T:
            return _best_iterate(observed_losses(forecasts), T, t, "budget",
                                 "the solve declined: the stored iterate of the smallest training objective")
        profile, _ = profiles_and_floors(forecasts)
        profile = np.asarray(profile, dtype=float)
        s = int(np.argmin(np.where(np.isfinite(profile), profile, np.inf)))
        nan = float("nan")
        if t < T - 1:
            return OnlineDecision(t, False, s, float(profile[s]), nan, nan, nan, nan, "solve",
                                  "waiting: the solve in the last round beats every frozen stage")
        forecast = last_round_forecast(forecasts, profile, self.profile_trend)
        if forecast < profile[s]:
            return OnlineDecision(t, False, s, float(profile[s]), nan, nan, forecast, nan, "end_forecast",
                                  f"FedAvg's last round, forecast {forecast:.4g}, beats the solve at K_{s} "
                                  f"({profile[s]:.4g}): train it")
        return OnlineDecision(t, True, s, float(profile[s]), nan, nan, forecast, nan, "solve",
                              f"solve the value block at K_{s}, the smallest profile stored", "solve")

    @staticmethod
    def _after_budget(forecasts, T: int, t: int) -> OnlineDecision:
        profile = np.asarray(profiles_and_floors(forecasts)[0], dtype=float)
        s = int(np.argmin(np.where(np.isfinite(profile), profile, np.inf)))
        nan = float("nan")
        if t < T:
            return OnlineDecision(t, False, s, float(profile[s]), nan, nan, nan, nan, "solve",
                                  "waiting: FedAvg trains all T rounds, the solve comes after them")
        return OnlineDecision(t, True, s, float(profile[s]), nan, nan, nan, nan, "solve",
                              f"after the T rounds, solve the value block at K_{s}, the smallest profile stored",
                              "solve")


def last_round_forecast(forecasts, profile, profile_trend: float) -> float:
    """``F̂_{t+1} = J(t, 1) − κ (Φ_λ(K_{t−1}) − Φ_λ(K_t))``: FedAvg's objective after one more round,
    forecast as one frozen round at the last kernel (exact, :func:`~.online.freeze_options`) less ``κ``
    times the profile's last decrease (the kernel's move; docs/theory.md §8, "Round 5"). ``κ = 0`` or
    a single stored round: ``J(t, 1)``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, u=u: 4.0 - u - 0.5 * k, profile=3.0 - u,
    ...                              drift_floor=0.0) for u in range(3)]      # J(2, 1) = 1.5, Φ drops by 1
    >>> from linattn_theory.recommenders.rules import last_round_forecast
    >>> last_round_forecast(forecasts, [3.0, 2.0, 1.0], 2.0)                  # 1.5 − 2 · (2 − 1)
    -0.5
    """
    t = len(forecasts) - 1
    one_round = float(freeze_options(forecasts, 1)[t])
    if profile_trend == 0 or t < 1:
        return one_round
    return one_round - profile_trend * float(profile[t - 1] - profile[t])


#: Rules by name (the regret benchmark's registry): today's rule and the rules of round 4.
RULES = {"online": OnlineRule, "value_moments_recall": ValueMomentsRecallRule,
         "server_observable": ServerObservableRule, "value_solve": ValueSolveRule}


def make_rule(name: str, **params):
    """The rule ``RULES[name](**params)`` (a clear error for an unknown name).

    Parameters
    ----------
    name : str
        A key of :data:`RULES`.
    **params
        The rule's parameters.

    Returns
    -------
    object
        The rule (``decide(forecasts, T)``).

    Examples
    --------
    >>> from linattn_theory.recommenders.rules import make_rule
    >>> make_rule("server_observable", window=8).information_set
    'server_observable'
    """
    try:
        cls = RULES[name]
    except KeyError:
        raise ValueError(f"rule {name!r} is unknown; expected one of {sorted(RULES)}") from None
    return cls(**params)
