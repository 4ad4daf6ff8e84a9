"""The causal online rule: freeze the kernel when more warm-up no longer pays (docs/theory.md §8).

The frozen stage is an exact affine map (docs/theory.md §5), so the final objective of freezing
the kernel of any stored round ``s`` now, with ``k = T − t`` frozen rounds left, is computable
(:class:`FreezeForecast`); the rule (:class:`OnlineRule`) decides at round ``t`` from rounds
``≤ t`` only when more warm-up no longer pays and rolls back to the best stored kernel, the
spent rounds counted. All mathematics of the rule lives in small pure functions on per-round
forecasts; the federated loop that feeds them is :func:`run_online`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.arrays import to_numpy
from ..core.model import Params, value_matrix, kernel
from ..core.clients import StackedClients
from ..theory.frozen_stage import fixed_point, affine_round
from ..theory.host import host_moments, profile_from_moments, ridged
from ..sim.strategies.base import declare
from .signals import stability_margin


__all__ = ["FreezeForecast", "freeze_forecast", "OnlineRule", "OnlineDecision", "online_decision", "CHECKS",
           "escape_round", "gain_and_cost", "gain_error", "still_descending", "drift_turn", "fedavg_forecast",
           "freeze_options", "freeze_risk", "profiles_and_floors", "OnlineControl", "OnlineRun", "adaptive_strategy",
           "run_online"]


# --------------------------------------------------------------------------------------
# the exact forecast of freezing a kernel (docs/theory.md §5, §8)
# --------------------------------------------------------------------------------------
#: The largest number of frozen rounds a forecast tabulates (beyond it each ``k`` is computed alone).
_TABLE_ROUNDS = 10_000

@dataclass(frozen=True)
class FreezeForecast:
    """What freezing the kernel ``K_s`` of round ``s`` (with value block ``V_s``) leads to.

    With ``k`` frozen rounds, ``V_T = V_FA + M^k (V_s − V_FA)`` exactly (docs/theory.md §5), and
    the final objective is ``F_λ(K_s, V_T) = Φ_λ(K_s) + ½‖V_T − V*_λ‖²_Ã``. ``M`` is symmetric;
    it is kept as its eigendecomposition ``M = Q diag(μ) Qᵀ``.

    Parameters
    ----------
    round : int
        ``s``.
    profile : float
        ``Φ_λ(K_s)``.
    drift_floor : float
        ``D(K_s) = ½‖V_FA − V*_λ‖²_Ã``.
    contraction_rate : float
        ``ρ(K_s) = max |μ|``.
    offset : numpy.ndarray, shape (H·d, p)
        ``V_FA − V*_λ``.
    start : numpy.ndarray, shape (H·d, p)
        ``Qᵀ (V_s − V_FA)``.
    basis : numpy.ndarray, shape (H·d, H·d)
        ``Q``.
    eigenvalues : numpy.ndarray, shape (H·d,)
        ``μ``.
    curvature : numpy.ndarray, shape (H·d, H·d)
        ``Ã``.
    stability_margin : float, default NaN
        ``2 − η max_c λ_max(Ã_c(K_s))`` (docs/theory.md §5; :func:`~.signals.stability_margin`).

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.recommenders.online import FreezeForecast
    >>> forecast = FreezeForecast(round=3, profile=1.0, drift_floor=0.25, contraction_rate=0.5,
    ...                           offset=np.array([[0.5]]), start=np.array([[1.0]]), basis=np.eye(1),
    ...                           eigenvalues=np.array([0.5]), curvature=np.array([[2.0]]))
    >>> forecast.final_objective(0), forecast.final_objective(1)       # 1 + ½ · 2 · (0.5 + 0.5^k)²
    (3.25, 2.0)
    >>> forecast.final_objective(200) == forecast.profile + forecast.drift_floor   # k → ∞: Φ_λ + D
    True
    """

    round: int
    profile: float          # Φ_λ(K_s)
    drift_floor: float      # D(K_s) = ½‖V_FA − V*_λ‖²_Ã
    contraction_rate: float  # ρ(K_s) = max |μ|
    offset: np.ndarray = field(repr=False)     # V_FA − V*_λ, (Hd, p)
    start: np.ndarray = field(repr=False)      # Qᵀ (V_s − V_FA), (Hd, p)
    basis: np.ndarray = field(repr=False)      # Q, (Hd, Hd)
    eigenvalues: np.ndarray = field(repr=False)  # μ, (Hd,)
    curvature: np.ndarray = field(repr=False)  # Ã, (Hd, Hd)
    stability_margin: float = float("nan")     # 2 − η max_c λ_max(Ã_c)
    _table: list = field(default_factory=list, init=False, repr=False, compare=False)

    def final_objective(self, frozen_rounds) -> np.ndarray | float:
        """``F_λ(K_s, V_T)`` after ``k = frozen_rounds`` frozen rounds (a number or an array of ``k``).

        A whole number ``k`` is read from a table of ``k' = 0..k`` computed in one array call the
        first time (the rule asks every stored round for ever smaller ``k``, round after round):
        the same numbers as the array call of any ``k`` (each ``k`` is its own slice; test).
        """
        k = np.asarray(frozen_rounds, dtype=float)
        if k.ndim == 0 and 0 <= k <= _TABLE_ROUNDS and float(k).is_integer():
            n = int(k)
            if n >= len(self._table):
                self._table[:] = self._evaluate(np.arange(n + 1, dtype=float)).tolist()
            return self._table[n]
        return self._evaluate(k)

    def _evaluate(self, k: np.ndarray) -> np.ndarray | float:
        """``F_λ(K_s, V_T)`` of every ``k`` of the array ``k`` at once (a float when ``k`` is 0-d)."""
        with np.errstate(over="ignore", invalid="ignore"):
            power = np.power(self.eigenvalues[None, :], k.reshape(-1)[:, None])      # (K, Hd)
            # Q diag(μ^k) Qᵀ(V_s − V_FA) and ½ tr(Δᵀ Ã Δ) as one matrix product per k (BLAS)
            delta = self.offset[None] + self.basis @ (power[:, :, None] * self.start[None])   # (K, Hd, p)
            value = self.profile + 0.5 * np.sum(delta * (self.curvature @ delta), axis=(1, 2))
        value = np.where(np.isfinite(value), value, np.inf)
        return float(value[0]) if k.ndim == 0 else value.reshape(k.shape)


def freeze_forecast(params: Params, data: StackedClients, fed, round_index: int = 0) -> FreezeForecast:
    """:class:`FreezeForecast` of freezing ``θ = params`` (its kernel and value block) under ``fed``.

    Uses the clients' value moments at ``K = kernel(params)``: ``Ã_c``, ``B_c`` (docs/theory.md
    §4), the frozen-stage map ``(M, b)`` with the server step and ``V_FA = (I − M)^{-1} b`` (§5).
    Exact for full batches and full participation; otherwise the forecast of the mean dynamics.
    A state that is no longer finite, or whose moments overflow (a run on its way to diverge),
    forecasts ``+∞`` for every ``k``.

    Parameters
    ----------
    params : Params
        ``θ`` (host or device arrays).
    data : StackedClients
        The clients.
    fed : FederatedConfig
        Step sizes, local steps, ridge and server step.
    round_index : int, default 0
        The round ``s`` the forecast is of.

    Returns
    -------
    FreezeForecast
        Its ``final_objective(k)`` is ``F_λ(K_s, V_T)`` after ``k`` frozen rounds.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.recommenders.online import freeze_forecast
    >>> from linattn_theory.sim.engine import prepare_run
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 10, "warmup_rounds": 4}})
    >>> data, params = prepare_run(config)
    >>> warm = lt.simulate(config).warmup_params                   # θ^4, then 6 frozen rounds
    >>> forecast = freeze_forecast(warm, data, config.federated, round_index=4)
    >>> final = lt.simulate(config).table["loss_regularized"].iloc[-1]
    >>> bool(np.isclose(forecast.final_objective(6), final, rtol=1e-8))
    True
    """
    lam, eta, E, s = fed.ridge, fed.learning_rate, fed.local_steps, fed.server_learning_rate
    K = np.asarray(to_numpy(kernel(params)), dtype=np.float64)
    V = value_matrix(np, np.asarray(to_numpy(params.WV), dtype=np.float64))
    with np.errstate(all="ignore"):
        moments = host_moments(K, data)
    if not (np.all(np.isfinite(K)) and np.all(np.isfinite(V))
            and all(np.all(np.isfinite(np.asarray(m))) for m in moments.weighted())):
        return _unusable_forecast(round_index, V.shape)
    profile, V_star = profile_from_moments(moments, lam)
    with np.errstate(all="ignore"):
        M, b = affine_round(moments, eta, E, lam, s)
    if not (np.all(np.isfinite(M)) and np.all(np.isfinite(b))):
        return _unusable_forecast(round_index, V.shape)
    V_FA = fixed_point(M, b)
    A = ridged(moments.weighted()[0], lam)
    mu, Q = np.linalg.eigh(0.5 * (M + M.T))
    offset = V_FA - V_star
    margin = stability_margin(np.linalg.eigvalsh(moments.A)[:, -1] + lam, eta)
    return FreezeForecast(int(round_index), float(profile), float(0.5 * np.sum(offset * (A @ offset))),
                          float(np.max(np.abs(mu))), offset, Q.T @ (V - V_FA), Q, mu, A, margin)


def _unusable_forecast(round_index: int, shape) -> FreezeForecast:
    """The forecast of a state that is no longer finite: ``+∞`` for every number of frozen rounds."""
    zeros = np.zeros(shape)
    n = shape[0]
    return FreezeForecast(int(round_index), float("inf"), float("inf"), float("inf"), zeros, zeros,
                          np.eye(n), np.zeros(n), np.eye(n), float("-inf"))


# --------------------------------------------------------------------------------------
# the causal freezing rule (docs/theory.md §8)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OnlineDecision:
    """The rule's verdict at round ``t``: continue the warm-up, or freeze the kernel of round
    ``kernel_round`` (``≤ t``: a roll-back when smaller) for the remaining ``T − t`` rounds.

    ``freeze_objective`` is the forecast final objective of that choice, ``J(s*, T − t)``;
    ``gain`` the predicted decrease of ``R_freeze`` over the next ``horizon`` rounds and ``cost``
    the exact increase of the best stored option's final objective over the same rounds;
    ``fedavg_forecast`` the forecast final objective of training to the end (FedAvg) and
    ``forecast_error`` the error that forecast is allowed (``NaN`` where a step was not reached).
    ``test`` names the step that decided (``escape``, ``gain``, ``descent``, ``drift``, ``no_harm``,
    ``budget``).

    Parameters
    ----------
    round : int
        ``t``.
    stop : bool
        Freeze now.
    kernel_round : int
        ``s*``.
    freeze_objective, gain, cost, fedavg_forecast, forecast_error : float
        As above.
    test : str
        The deciding step.
    reason : str
        The verdict in a sentence.
    outcome : {"freeze", "iterate", "solve"}, default "freeze"
        What a stop does: freeze ``K_{s*}`` for the remaining rounds; end with the stored iterate
        ``θ_{s*}`` (no frozen rounds: its loss is observed); or solve the value block exactly at
        ``K_{s*}`` in the last round (``value_solve``, docs/theory.md §5). The rules of
        :mod:`.rules` use the last two; :func:`~.scoring.realised_risk` realises each.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import OnlineDecision
    >>> decision = OnlineDecision(round=5, stop=True, kernel_round=3, freeze_objective=0.8, gain=0.0, cost=0.1,
    ...                           fedavg_forecast=1.0, forecast_error=0.05, test="no_harm", reason="freeze")
    >>> decision.kernel_round < decision.round, decision.outcome      # a roll-back to round 3; a freeze
    (True, 'freeze')
    """

    round: int
    stop: bool
    kernel_round: int
    freeze_objective: float
    gain: float
    cost: float
    fedavg_forecast: float
    forecast_error: float
    test: str
    reason: str
    outcome: str = "freeze"


@dataclass(frozen=True)
class OnlineRule:
    """Freeze when more warm-up no longer pays, its turn is the drift's, and freezing beats FedAvg.

    At round ``t`` the rule knows the forecasts of every stored round ``s ≤ t``
    (:class:`FreezeForecast`), hence ``J(s, k) = F_λ(K_s, V_T)`` with ``k`` frozen rounds,
    ``R_freeze(t) + Φ*_λ = J(t, T − t)``, the training objective ``F_λ(θ_t) = J(t, 0)``, the
    profile ``Φ_λ(K_t)`` and the drift floor ``D(K_t)``. With ``w = window``, ``h = horizon``,
    ``z = confidence`` and ``z_g = gain_confidence`` it continues the warm-up unless all four tests
    below say freeze (docs/theory.md §8, "The online rule"):

    1. **escape**: ``R_freeze`` has fallen below ``R_freeze(0)`` at least ``w`` rounds ago (the warm-up
       has left the saddle at ``K = 0``, so the windows below lie in the descent);
    2. **gain ≤ cost**: ``gain = −h ×`` the least-squares slope of ``R_freeze`` over rounds ``t − w..t``;
       ``cost = min_s J(s, T − t − h) − min_s J(s, T − t)`` (exact): more warm-up no longer pays, with
       ``z_g = gain_confidence`` standard errors of the gain to spare (:func:`gain_error`):
       ``gain + z_g se(gain) ≤ cost`` (a noisy or oscillating ``R_freeze`` does not look flat);
    3. **descent ended** (when ``z_d = descent_confidence`` is set): ``gain ≤ z_d se(gain)`` — ``R_freeze``
       is no longer falling by more than ``z_d`` standard errors of its slope. ``R_freeze(t)`` is the
       final objective of freezing at ``t``, the frozen rounds given up already counted, so while it
       still falls one more round of warm-up is forecast to end lower (the gain test alone also
       charges those rounds as its cost, and freezes a slow descent early);
    4. **drift turn**: ``Φ_λ(K_t) − Φ_λ(K_{t−w}) ≤ max(0, D(K_t) − D(K_{t−w}))`` — what turned
       ``R_freeze`` is the drift the warm-up adds, not the federated kernel climbing ``Φ_λ`` (a
       transient of the inexact descent, after which it may fall again);
    5. **no harm**: ``min_s J(s, T − t) < F̂_T − z σ``, with ``F̂_T = F_λ(θ_t) + (T − t) min(0, b)``
       the straight-line forecast of plain FedAvg's final objective from the slope ``b`` of
       ``F_λ(θ_u)`` over ``u = t − w..t`` (optimistic for FedAvg while its descent slows down), and
       ``σ`` the residual standard deviation of that fit (minibatch and sampling noise, curvature):
       freeze only when the forecast advantage over FedAvg exceeds ``z`` times the forecast's
       own error.

    It then freezes ``K_{s*}``, ``s* = argmin_s J(s, T − t)`` (a roll-back when ``s* < t``; the rounds
    spent are counted). At ``t = T`` the warm-up is over: plain FedAvg. The defaults ``w = 10``, ``h = 1``, ``z = 2``, ``z_g = 3``,
    ``z_d = 8`` are what the pre-registered criterion of ``benchmarks/predictive_regret.py``
    (``choose_rule``) picked from the design table of round 3; they are scored there on fresh
    evaluation instances (``descent_confidence=None`` is round 2's rule).

    Parameters
    ----------
    window : int, default 10
        ``w``: rounds of the slope fits and of the escape and drift-turn tests.
    horizon : int, default 1
        ``h``: rounds of warm-up the gain test weighs.
    confidence : float, default 2.0
        ``z`` of the no-harm test.
    gain_confidence : float, default 3.0
        ``z_g`` of the gain test.
    descent_confidence : float or None, default 8.0
        ``z_d`` of the descent test (``None``: no descent test, round 2's rule).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 12}})
    >>> patient = lt.run_online(config, rule=lt.OnlineRule(window=4, confidence=3.0))
    >>> patient.kernel_round <= patient.stop_round <= 12
    True
    """

    window: int = 10
    horizon: int = 1
    confidence: float = 2.0
    gain_confidence: float = 3.0
    descent_confidence: float | None = 8.0
    #: What the rule reads (:data:`~.rules.INFORMATION_SETS`): the client value moments.
    information_set = "value_moments"

    def __post_init__(self):
        for name in ("window", "horizon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"OnlineRule.{name} = {value!r}; expected an integer >= 1")
        for name in ("confidence", "gain_confidence", "descent_confidence"):
            z = getattr(self, name)
            if z is None and name == "descent_confidence":
                continue
            if isinstance(z, bool) or not isinstance(z, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(z) or z < 0:
                raise ValueError(f"OnlineRule.{name} = {z!r}; expected a finite number >= 0")

    def decide(self, forecasts, T: int) -> OnlineDecision:
        """The decision at round ``t = len(forecasts) − 1`` from the forecasts of rounds ``0..t``."""
        return online_decision(forecasts, T, self.window, self.horizon, self.confidence,
                               gain_confidence=self.gain_confidence, descent_confidence=self.descent_confidence)


def freeze_options(forecasts, frozen_rounds: int) -> np.ndarray:
    """``J(s, k)`` for every stored round ``s`` and ``k = frozen_rounds`` (a whole column at once
    from a sequence that has ``column``, a record's table).

    Parameters
    ----------
    forecasts : sequence of FreezeForecast
        The stored rounds' forecasts (or a record's table).
    frozen_rounds : int
        ``k``, the rounds of the frozen stage.

    Returns
    -------
    numpy.ndarray, shape (t + 1,)
        ``J(s, k)``, ``s = 0..t``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, u=u: 3.0 - u + 0.1 * k,
    ...                              profile=1.0 / (u + 1), drift_floor=0.01 * u) for u in range(3)]
    >>> from linattn_theory.recommenders.online import freeze_options
    >>> freeze_options(forecasts, 10).tolist()                  # J(s, k) = 3 − s + 0.1 k here
    [4.0, 3.0, 2.0]
    """
    column = getattr(forecasts, "column", None)
    if column is not None:
        return column(frozen_rounds)
    return np.array([f.final_objective(frozen_rounds) for f in forecasts])


def freeze_risk(forecasts, T: int) -> np.ndarray:
    """``J(s, T − s)`` for every stored round ``s``: ``R_freeze(0..t) + Φ*``.

    Parameters
    ----------
    forecasts : sequence of FreezeForecast
        The stored rounds' forecasts (or a record's table).
    T : int
        The rounds of the run.

    Returns
    -------
    numpy.ndarray, shape (t + 1,)
        ``J(s, T − s)``, ``s = 0..t``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, u=u: 3.0 - u + 0.1 * k,
    ...                              profile=1.0 / (u + 1), drift_floor=0.01 * u) for u in range(3)]
    >>> from linattn_theory.recommenders.online import freeze_risk
    >>> freeze_risk(forecasts, 10).round(12).tolist()        # 3 − s + 0.1 (10 − s)
    [4.0, 2.9, 1.8]
    """
    diagonal = getattr(forecasts, "diagonal", None)
    if diagonal is not None:
        return diagonal(T)
    return np.array([f.final_objective(T - f.round) for f in forecasts])


def profiles_and_floors(forecasts) -> tuple[list, list]:
    """``Φ_λ(K_s)`` and ``D(K_s)`` of every stored round ``s``.

    Parameters
    ----------
    forecasts : sequence of FreezeForecast
        The stored rounds' forecasts (or a record's table).

    Returns
    -------
    profiles : list of float
        ``Φ_λ(K_s)``.
    drift_floors : list of float
        ``D(K_s)``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, u=u: 3.0 - u + 0.1 * k,
    ...                              profile=1.0 / (u + 1), drift_floor=0.01 * u) for u in range(3)]
    >>> from linattn_theory.recommenders.online import profiles_and_floors
    >>> profiles_and_floors(forecasts)
    ([1.0, 0.5, 0.3333333333333333], [0.0, 0.01, 0.02])
    """
    if hasattr(forecasts, "profiles"):
        return forecasts.profiles, forecasts.drift_floors
    return [f.profile for f in forecasts], [f.drift_floor for f in forecasts]


def _line_fit(values) -> tuple[float, float, float]:
    """``(b, σ, se)``: least-squares slope of ``values`` against their index, the residual standard
    deviation ``σ = √(Σ r²/(n − 2))`` (0 for two points) and the slope's standard error
    ``se = σ/√Σ(u − ū)²``."""
    y = np.asarray(values, dtype=float)
    x = np.arange(len(y), dtype=float) - (len(y) - 1) / 2.0
    sxx = np.sum(x * x)
    b = float(np.sum(x * (y - y.mean())) / sxx)
    r = y - y.mean() - b * x
    sigma = float(np.sqrt(np.sum(r * r) / (len(y) - 2))) if len(y) > 2 else 0.0
    return b, sigma, float(sigma / np.sqrt(sxx))


def escape_round(risk, window: int) -> int | None:
    """The first round ``t`` at which the escape test passes: ``R_freeze`` first fell below
    ``R_freeze(0)`` at round ``u`` and ``t = u + window`` (``None`` while it has not fallen).

    Parameters
    ----------
    risk : sequence of float
        ``R_freeze(0..t)``.
    window : int
        ``w``.

    Returns
    -------
    int or None
        The round.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import escape_round
    >>> escape_round([1.0, 1.2, 0.9, 0.8], window=2), escape_round([1.0, 1.1], window=2)
    (4, None)
    """
    below = np.flatnonzero(np.asarray(risk) < risk[0])
    return None if len(below) == 0 else int(below[0]) + window


def gain_and_cost(risk, now, later, window: int, horizon: int) -> tuple[float, float]:
    """``(gain, cost)`` of ``horizon`` more warm-up rounds at round ``t = len(risk) − 1``:
    ``gain = −horizon × slope(R_freeze(t − window..t))`` and ``cost = min(later) − min(now)`` with
    ``now = J(·, T − t)`` and ``later = J(·, T − t − horizon)`` over the stored rounds.

    Parameters
    ----------
    risk : sequence of float
        ``R_freeze(0..t)``.
    now, later : sequence of float
        ``J(s, T − t)`` and ``J(s, T − t − horizon)`` of the stored rounds ``s ≤ t``.
    window, horizon : int
        ``w`` and ``h``.

    Returns
    -------
    tuple of (float, float)
        ``(gain, cost)``.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import gain_and_cost
    >>> gain_and_cost([5.0, 4.0, 3.0, 2.0], now=[3.0, 2.5], later=[2.0, 2.2], window=3, horizon=2)
    (2.0, -0.5)
    """
    return _gain_cost_and_error(risk, now, later, window, horizon)[0]


def gain_error(risk, window: int, horizon: int) -> float:
    """The standard error of the gain: ``horizon × σ/√Σ(u − ū)²``, the least-squares slope's
    standard error over rounds ``t − window..t`` (``σ`` the fit's residual standard deviation).

    Parameters
    ----------
    risk : sequence of float
        ``R_freeze(0..t)``.
    window, horizon : int
        ``w`` and ``h``.

    Returns
    -------
    float
        ``se(gain)``.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import gain_error
    >>> gain_error([5.0, 4.0, 3.0, 2.0], window=3, horizon=2)        # on a straight line: no error
    0.0
    >>> round(gain_error([5.0, 4.0, 3.5, 2.0], window=3, horizon=2), 6)
    0.264575
    """
    return _gain_and_error(risk, window, horizon)[1]


def _gain_and_error(risk, window: int, horizon: int) -> tuple[float, float]:
    """``(gain, se(gain))`` from one least-squares fit of ``R_freeze(t − window..t)``."""
    slope, _, error = _line_fit(np.asarray(risk, dtype=float)[-window - 1:])
    return -horizon * slope, float(horizon * error)


def _gain_cost_and_error(risk, now, later, window: int, horizon: int):
    """``((gain, cost), se(gain))``: :func:`gain_and_cost` and :func:`gain_error` from one fit."""
    gain, error = _gain_and_error(risk, window, horizon)
    return (gain, float(np.min(later) - np.min(now))), error


def still_descending(gain: float, error: float, descent_confidence: float | None) -> bool:
    """True while ``R_freeze`` still falls significantly: ``gain > z_d · se(gain)`` (``z_d =
    descent_confidence``; ``None``: the test is off, never true).

    Parameters
    ----------
    gain, error : float
        The gain and its standard error.
    descent_confidence : float or None
        ``z_d``.

    Returns
    -------
    bool
        The verdict.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import still_descending
    >>> still_descending(2.0, 0.5, 2.0), still_descending(2.0, 1.5, 2.0), still_descending(2.0, 0.5, None)
    (True, False, False)
    """
    return descent_confidence is not None and bool(gain > descent_confidence * error)


def drift_turn(profile, drift_floor, window: int) -> bool:
    """True when ``Φ_λ(K_t) − Φ_λ(K_{t−w}) ≤ max(0, D(K_t) − D(K_{t−w}))`` (``w = window``): over
    the window the kernel's profile rose no more than the drift floor did.

    Parameters
    ----------
    profile, drift_floor : sequence of float
        ``Φ_λ(K_u)`` and ``D(K_u)`` for ``u = 0..t``.
    window : int
        ``w``.

    Returns
    -------
    bool
        The verdict.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import drift_turn
    >>> drift_turn([1.0, 1.0, 1.2], [0.0, 0.1, 0.3], window=2)     # Φ rose 0.2, D rose 0.3
    True
    >>> drift_turn([1.0, 1.0, 1.5], [0.0, 0.1, 0.3], window=2)
    False
    """
    return bool(profile[-1] - profile[-window - 1] <= max(0.0, drift_floor[-1] - drift_floor[-window - 1]))


def fedavg_forecast(objective, T: int, window: int, confidence: float) -> tuple[float, float]:
    """``(F̂_T, z σ)``: the straight-line forecast of plain FedAvg's final objective from
    ``F_λ(θ_u)``, ``u = t − w..t`` (``t = len(objective) − 1``, ``w = window``), decreases only,
    and ``confidence`` times the residual standard deviation of the fit.

    Parameters
    ----------
    objective : sequence of float
        ``F_λ(θ_u)``, ``u = 0..t``.
    T : int
        Rounds of the run.
    window : int
        ``w``.
    confidence : float
        ``z``.

    Returns
    -------
    tuple of (float, float)
        ``(F̂_T, z σ)``.

    Examples
    --------
    >>> from linattn_theory.recommenders.online import fedavg_forecast
    >>> fedavg_forecast([5.0, 4.0, 3.0, 2.0], T=10, window=3, confidence=2.0)    # the line 2 − (10 − 3)
    (-5.0, 0.0)
    >>> fedavg_forecast([1.0, 2.0, 3.0], T=10, window=2, confidence=2.0)         # a rise is not extrapolated
    (3.0, 0.0)
    """
    b, sigma, _ = _line_fit(np.asarray(objective)[-window - 1:])
    t = len(objective) - 1
    return float(objective[-1] + (T - t) * min(b, 0.0)), float(confidence * sigma)


#: The tests of :class:`OnlineRule` after the escape, in order (:func:`online_decision`).
CHECKS = ("gain", "descent", "drift", "no_harm")


def online_decision(forecasts, T: int, window: int = OnlineRule.window, horizon: int = OnlineRule.horizon,
                    confidence: float = OnlineRule.confidence, *, gain_confidence: float = OnlineRule.gain_confidence,
                    descent_confidence: float | None = OnlineRule.descent_confidence, checks=CHECKS) -> OnlineDecision:
    """:class:`OnlineRule`'s decision at round ``t = len(forecasts) − 1``, from rounds ``0..t`` only
    (its defaults are the rule's; ``gain_confidence`` is ``z_g`` of the gain test, ``descent_confidence``
    ``z_d`` of the descent test, ``None`` for none).

    ``forecasts[u]`` needs ``final_objective(k)``, ``profile`` and ``drift_floor`` (a
    :class:`FreezeForecast`, or a stored record's stand-in: :mod:`.scoring`); a sequence that has
    ``column(k)``, ``diagonal(T)``, ``profiles`` and ``drift_floors`` gives the same numbers for every
    stored round at once (a record's table, :class:`~linattn_theory.recommenders.scoring.StoredForecasts`). ``checks`` names the
    tests applied after the escape (default all of :data:`CHECKS`; fewer only to show what each
    test does, as the design table of ``benchmarks/predictive_regret.py`` does).

    Parameters
    ----------
    forecasts : sequence of FreezeForecast
        Rounds ``0..t``.
    T : int
        Rounds of the run.
    window, horizon, confidence
        ``w``, ``h``, ``z`` (:class:`OnlineRule`).
    gain_confidence, descent_confidence
        ``z_g``, ``z_d``.
    checks : tuple of str, default CHECKS
        The tests applied after the escape.

    Returns
    -------
    OnlineDecision
        The verdict.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from linattn_theory.recommenders.online import online_decision
    >>> forecasts = [SimpleNamespace(round=u, final_objective=lambda k, u=u: 3.0 - u + 0.1 * k,
    ...                              profile=1.0 / (u + 1), drift_floor=0.01 * u) for u in range(11)]
    >>> early = online_decision(forecasts[:3], T=10, window=4)       # round 2: still escaping the saddle
    >>> early.test, early.stop
    ('escape', False)
    >>> last = online_decision(forecasts, T=10)                        # round T: plain FedAvg
    >>> last.test, last.stop, last.kernel_round
    ('budget', True, 10)
    """
    t = len(forecasts) - 1
    if not 0 <= t <= T:
        raise ValueError(f"{len(forecasts)} forecasts for T = {T} rounds; expected 1..T+1")
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"checks = {tuple(checks)!r}: unknown {sorted(unknown)}; expected names from {CHECKS}")
    nan = float("nan")
    if t == T:
        objective = float(forecasts[T].final_objective(0))
        return OnlineDecision(t, True, T, objective, 0.0, 0.0, objective, 0.0, "budget",
                              "warm-up budget spent: plain FedAvg")
    now = freeze_options(forecasts, T - t)
    s = int(np.argmin(now))
    best = float(now[s])

    def go_on(test, reason, gain=nan, cost=nan, forecast=nan, error=nan):
        return OnlineDecision(t, False, s, best, gain, cost, forecast, error, test, reason)

    risk = freeze_risk(forecasts, T)                                        # R_freeze(0..t) + Φ*
    ready = escape_round(risk, window)
    if ready is None or t < ready:
        return go_on("escape", f"escaping the saddle: R_freeze has not yet fallen below R_freeze(0) "
                               f"{window} rounds ago")
    h = min(horizon, T - t)
    (gain, cost), error = _gain_cost_and_error(risk, now, freeze_options(forecasts, T - t - h), window, h)
    spare = gain_confidence * error
    if "gain" in checks and gain + spare > cost:
        return go_on("gain", f"predicted gain {gain:.3g} (+ {spare:.3g}, {gain_confidence:g} standard errors) of "
                             f"{h} more rounds exceeds their cost {cost:.3g}", gain, cost)
    if "descent" in checks and still_descending(gain, error, descent_confidence):
        return go_on("descent", f"R_freeze still falls: predicted gain {gain:.3g} of {h} more rounds exceeds "
                                f"{descent_confidence:g} standard errors ({error:.3g} each)", gain, cost)
    profile, floor = profiles_and_floors(forecasts)
    if "drift" in checks and not drift_turn(profile, floor, window):
        return go_on("drift", f"the kernel's profile rose by {profile[-1] - profile[-window - 1]:.3g} over "
                              f"{window} rounds, more than the drift floor: a transient, not the drift's turn",
                     gain, cost)
    objective = freeze_options(forecasts, 0)                                         # F_λ(θ_0..θ_t)
    forecast, error = fedavg_forecast(objective, T, window, confidence)
    if "no_harm" in checks and not best < forecast - error:
        return go_on("no_harm", f"freezing ({best:.4g}) does not beat FedAvg's forecast {forecast:.4g} "
                                f"by more than its error {error:.3g}", gain, cost, forecast, error)
    return OnlineDecision(t, True, s, best, gain, cost, forecast, error, "no_harm",
                          f"freeze: gain {gain:.3g} ≤ cost {cost:.3g}, a drift turn, and {best:.4g} beats "
                          f"FedAvg's forecast {forecast:.4g} by more than its error {error:.3g}")


@dataclass
class OnlineRun:
    """A FedFrozen run whose warm-up length was chosen online (:func:`run_online`).

    ``result`` is the simulator's :class:`~linattn_theory.sim.engine.RunResult` (its table: warm-up
    rows up to ``stop_round``, then the frozen stage); ``kernel_round`` is the round whose kernel
    was frozen (``T0``), ``stop_round`` the round at which the rule decided (``≥ kernel_round``; the
    frozen stage runs ``T − stop_round`` rounds); ``predicted_objective`` the forecast
    ``F_λ(K_{T0}, V_T)``; ``decisions`` one row per warm-up round.

    Parameters
    ----------
    result : RunResult
        The run.
    kernel_round : int
        ``T0``.
    stop_round : int
        The round of the decision.
    predicted_objective : float
        The forecast final objective.
    decisions : pandas.DataFrame
        One row per round the rule saw.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> from linattn_theory.recommenders.online import OnlineRun
    >>> run = lt.run_online(config, rule=lt.OnlineRule(window=2))
    >>> isinstance(run, OnlineRun), run.kernel_round <= run.stop_round <= 6
    (True, True)
    >>> len(run.decisions) == run.stop_round + 1                       # one row per round the rule saw
    True
    """

    result: object
    kernel_round: int
    stop_round: int
    predicted_objective: float
    decisions: pd.DataFrame


class OnlineControl:
    """The online rule as a strategy's per-round control (:class:`~linattn_theory.sim.strategies.Control`).

    ``observe`` stores ``θ^t``, adds the :class:`FreezeForecast` of round ``t`` and asks the rule,
    which sees rounds ``0..t`` only; when it stops, the run freezes the kernel of its
    ``kernel_round`` (a stored round: roll-back). A decision of another ``outcome`` (``iterate``,
    ``solve``: the rules of :mod:`.rules`) is refused with a ``ValueError``: those are scored on
    records (:func:`~.scoring.realised_risk`), not run here. ``finish`` records ``kernel_round`` (the ``T0``),
    ``stop_round`` and the forecast; ``decisions`` keeps one row per round observed.

    Parameters
    ----------
    rule : OnlineRule
        The rule.
    fed : FederatedConfig
        The run's schedule.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> from linattn_theory.recommenders.scoring import fedavg_path
    >>> from linattn_theory.recommenders.online import OnlineControl
    >>> control = OnlineControl(lt.OnlineRule(window=2), config.federated)
    >>> data, states = fedavg_path(config, None)
    >>> control.observe(states[0], data) is None, len(control.forecasts), control.decisions[0]["test"]
    (True, 1, 'escape')
    """

    def __init__(self, rule: OnlineRule, fed):
        self.rule, self.fed = rule, fed
        self.params: dict[int, Params] = {}
        self.forecasts: list[FreezeForecast] = []
        self.decisions: list[dict] = []
        self.decision: OnlineDecision | None = None
        self.stop_round: int | None = None

    def observe(self, state, data):
        from ..sim.strategies import Freeze

        t = state.round
        self.params[t] = state.params
        self.forecasts.append(freeze_forecast(state.params, data, self.fed, t))
        self.decision = self.rule.decide(self.forecasts, self.fed.rounds)
        self.decisions.append(dict(vars(self.decision)))      # asdict without its deep copies: every field is flat
        if not self.decision.stop:
            return None
        if self.decision.outcome != "freeze":
            raise ValueError(f"{type(self.rule).__name__} decided the outcome {self.decision.outcome!r} at round {t}: "
                             "the simulator realises freezes only; score this rule on a record with "
                             "recommenders.scoring.replay_online and realised_risk(..., outcome=...)")
        self.stop_round = t
        return Freeze(self.decision.kernel_round, self.params[self.decision.kernel_round])

    def finish(self, result) -> dict:
        s, t = self.decision.kernel_round, self.stop_round
        if t is None:     # the warm-up diverged before the rule stopped (or T was reached undecided)
            s = t = int(result.table["round"].iloc[-1])
        return {"warmup_rounds": int(s), "kernel_round": int(s), "stop_round": int(t),
                "predicted_objective": float(self.decision.freeze_objective)}


def _default_rule(fed) -> OnlineRule:
    descent = fed.adaptive_descent_confidence      # the config's inf is the rule's None: no descent test
    return OnlineRule(fed.adaptive_window, fed.adaptive_horizon, fed.adaptive_confidence,
                      fed.adaptive_gain_confidence, None if descent == np.inf else descent)


@declare(settings=("adaptive_window", "adaptive_horizon", "adaptive_confidence", "adaptive_gain_confidence",
                   "adaptive_descent_confidence"),
         style=(r"FedFrozen, online $T_0$", "olive", "*", ":"), panel="fedfrozen")
def adaptive_strategy(fed, warmup_rounds: int | None = None, *, control: OnlineControl | None = None):
    """The strategy ``fedfrozen_adaptive``: FedAvg rounds until the online rule freezes the kernel.

    FedFrozen's client and server rules with every block training, plus ``control`` (the round
    engine's hook; default: an :class:`OnlineControl` of ``OnlineRule(fed.adaptive_window,
    fed.adaptive_horizon, fed.adaptive_confidence, fed.adaptive_gain_confidence,
    fed.adaptive_descent_confidence)``). ``warmup_rounds`` is ignored: the rule chooses ``T0``. Registered
    by the package (``linattn_theory/__init__.py``).

    Parameters
    ----------
    fed : FederatedConfig
        The run's schedule.
    warmup_rounds : int, optional
        Ignored.
    control : OnlineControl, optional
        The control; default from ``fed``.

    Returns
    -------
    Strategy
        The strategy.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 6, "warmup_rounds": 6}})
    >>> from linattn_theory.recommenders.online import adaptive_strategy
    >>> adaptive_strategy(config.federated).name
    'fedfrozen_adaptive'
    """
    from ..sim.strategies import Control, Strategy
    from ..sim.strategies.base import freeze_after, local_sgd, server_sgd

    control = OnlineControl(_default_rule(fed), fed) if control is None else control
    return Strategy("fedfrozen_adaptive", freeze_after(fed.rounds, ("WV",)), local_sgd(),
                    server_sgd(fed.server_learning_rate), Control(control.observe, control.finish))


def run_online(config, clients=None, rule: OnlineRule | None = None, *, params: Params | None = None,
               max_bytes="auto", progress: bool = False) -> OnlineRun:
    """Train FedAvg and freeze the kernel when ``rule`` says so (strategy ``fedfrozen_adaptive``).

    Runs :func:`~linattn_theory.sim.engine.simulate` with :func:`adaptive_strategy`: after every
    round ``t`` the engine hands ``θ^t`` to the rule's control, which adds the
    :class:`FreezeForecast` of round ``t``; the rule sees rounds ``0..t`` only. When it stops at
    round ``t`` with kernel round ``s``, the run continues from ``θ^s`` with the kernel frozen for
    the remaining ``T − t`` rounds (the table keeps the rows of the rounds spent). Full batches and
    full participation make the forecast exact; otherwise it is the forecast of the mean dynamics.

    Parameters
    ----------
    config : RunConfig
        The instance; its strategy and ``warmup_rounds`` are not used.
    clients : FederatedDataset, optional
        Its clients; default those of ``config``.
    rule : OnlineRule, optional
        The rule; default from the config's ``adaptive_*`` settings.
    params : Params, optional
        Initial parameters; default drawn from ``config``.
    max_bytes : int, str or None, default "auto"
        As in :func:`~linattn_theory.sim.engine.simulate`.
    progress : bool, default False
        Show a progress bar over the rounds.

    Returns
    -------
    OnlineRun
        The run, the round whose kernel was frozen, the round the rule decided, its forecast and
        its decisions round by round.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 12, "warmup_rounds": 4}})
    >>> online = lt.run_online(config)
    >>> online.kernel_round <= online.stop_round <= 12, len(online.result.table)
    (True, 13)
    """
    from ..sim.engine import simulate

    fed = config.federated
    control = OnlineControl(_default_rule(fed) if rule is None else rule, fed)
    result = simulate(config, clients, params=params, max_bytes=max_bytes, progress=progress,
                      strategy=adaptive_strategy(fed, control=control))
    meta = result.metadata
    return OnlineRun(result, meta["kernel_round"], meta["stop_round"], meta["predicted_objective"],
                     pd.DataFrame(control.decisions))
