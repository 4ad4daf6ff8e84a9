"""Warm-up recommenders with named information sets (docs/theory.md §8).

A recommendation of the warm-up length ``T0`` is a *prediction* only if it is made from what is
known before ``T0`` is chosen. Each recommender here says what it used:

* ``online`` (causal, the default): runs with the training and decides at round ``t`` from rounds
  ``≤ t`` only. The frozen stage is an exact affine map (docs/theory.md §5), so the final
  objective of freezing the kernel of any stored round ``s`` now, with ``k = T − t`` frozen rounds
  left, is computable (:class:`FreezeForecast`); the rule (:class:`OnlineRule`) decides when more
  warm-up no longer pays and rolls back to the best stored kernel, the spent rounds counted.
* ``pilot``: constants of the bound ``U(T0)`` fitted on the first ``T_p ≤ T/4`` FedAvg rounds
  and on ``Φ*_λ`` (computable from the data alone); the bound extrapolates the rest.
* ``transfer``: the a-posteriori bound's ``T0`` on other seeds of the same family and setting,
  never on the instance judged.
* ``a_posteriori`` (descriptive): the bound fitted on the whole FedAvg path it then judges
  (:func:`linattn_theory.bound.estimate_bound`). It explains a curve; it predicts nothing.

All mathematics of the rules lives in small pure functions on per-round forecasts; the
federated loop that feeds them is :func:`run_online`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ._array import to_numpy
from .model import Params, _value_matrix, kernel
from .tasks import StackedClients
from .theory import _fixed_point, _frozen_map, _host_moments, _profile_from_moments, _ridge

__all__ = [
    "MODES",
    "FreezeForecast",
    "freeze_forecast",
    "OnlineRule",
    "OnlineDecision",
    "online_decision",
    "run_online",
    "Recommendation",
    "recommend",
]

#: The recommenders and their information sets (docs/theory.md §8).
MODES = ("online", "pilot", "transfer", "a_posteriori")

#: One sentence per mode: what it used (the ``information`` of a :class:`Recommendation`).
INFORMATION = {
    "online": ("causal: at each warm-up round t only rounds ≤ t, through the exact frozen-stage "
               "map at the stored kernels; the rounds spent before freezing are counted against T"),
    "pilot": ("pilot: the first T_p = {pilot_rounds} FedAvg rounds, θ^0 and Φ*_λ from the clients' "
              "data; the bound U(T0) extrapolates the rest of the path"),
    "transfer": ("transfer: the a-posteriori bound's T0 on seeds {seeds} of the same family and "
                 "setting; nothing measured on this instance"),
    "a_posteriori": ("a posteriori (descriptive, not a prediction): constants fitted on the whole "
                     "FedAvg path θ^0..θ^T that this recommendation is then judged on"),
}


# --------------------------------------------------------------------------------------
# the exact forecast of freezing a kernel (docs/theory.md §5, §8)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FreezeForecast:
    """What freezing the kernel ``K_s`` of round ``s`` (with value block ``V_s``) leads to.

    With ``k`` frozen rounds, ``V_T = V_FA + M^k (V_s − V_FA)`` exactly (docs/theory.md §5), and
    the final objective is ``F_λ(K_s, V_T) = Φ_λ(K_s) + ½‖V_T − V*_λ‖²_Ã``. ``M`` is symmetric;
    it is kept as its eigendecomposition ``M = Q diag(μ) Qᵀ``.
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

    def final_objective(self, frozen_rounds) -> np.ndarray | float:
        """``F_λ(K_s, V_T)`` after ``k = frozen_rounds`` frozen rounds (a number or an array of ``k``)."""
        k = np.asarray(frozen_rounds, dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):
            power = np.power(self.eigenvalues[None, :], k.reshape(-1)[:, None])      # (K, Hd)
            delta = self.offset[None] + np.einsum("ij,kj,jp->kip", self.basis, power, self.start)
            value = self.profile + 0.5 * np.einsum("kip,ij,kjp->k", delta, self.curvature, delta)
        value = np.where(np.isfinite(value), value, np.inf)
        return float(value[0]) if k.ndim == 0 else value.reshape(k.shape)


def freeze_forecast(params: Params, data: StackedClients, fed, round_index: int = 0) -> FreezeForecast:
    """:class:`FreezeForecast` of freezing ``θ = params`` (its kernel and value block) under ``fed``.

    Uses the clients' value moments at ``K = kernel(params)``: ``Ã_c``, ``B_c`` (docs/theory.md
    §4), the frozen-stage map ``(M, b)`` with the server step and ``V_FA = (I − M)^{-1} b`` (§5).
    Exact for full batches and full participation; otherwise the forecast of the mean dynamics.
    """
    lam, eta, E, s = fed.ridge, fed.learning_rate, fed.local_steps, fed.server_learning_rate
    K = np.asarray(to_numpy(kernel(params)), dtype=np.float64)
    moments = _host_moments(K, data)
    profile, V_star = _profile_from_moments(moments, lam)
    M, b = _frozen_map(moments, eta, E, lam, s)
    V_FA = _fixed_point(M, b)
    A = _ridge(moments.weighted()[0], lam)
    mu, Q = np.linalg.eigh(0.5 * (M + M.T))
    V = _value_matrix(np, np.asarray(to_numpy(params.WV), dtype=np.float64))
    offset = V_FA - V_star
    return FreezeForecast(int(round_index), float(profile), float(0.5 * np.sum(offset * (A @ offset))),
                          float(np.max(np.abs(mu))), offset, Q.T @ (V - V_FA), Q, mu, A)


# --------------------------------------------------------------------------------------
# the causal freezing rule (docs/theory.md §8)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OnlineDecision:
    """The rule's verdict at round ``t``: continue the warm-up, or freeze the kernel of round
    ``kernel_round`` (``≤ t``: a roll-back when smaller) for the remaining ``T − t`` rounds.

    ``freeze_objective`` is the exact final objective of that choice, ``F_λ(K_s, V_T)``;
    ``gain`` the predicted decrease of ``R_freeze`` over the next ``horizon`` rounds and ``cost``
    the exact increase of the best stored option's final objective over the same rounds.
    """

    round: int
    stop: bool
    kernel_round: int
    freeze_objective: float
    gain: float
    cost: float
    reason: str


@dataclass(frozen=True)
class OnlineRule:
    """Freeze when one more stretch of warm-up is predicted to buy less than it costs.

    At round ``t`` the rule knows the forecasts of every stored round ``s ≤ t``
    (:class:`FreezeForecast`), hence ``J(s, k) = F_λ(K_s, V_T)`` with ``k`` frozen rounds and
    ``R_freeze(t) + Φ*_λ = J(t, T − t)``. With ``h = horizon`` and ``w = window``:

    * **escape** (docs/theory.md §8): from a small initialisation the warm-up first sits near the
      saddle at ``K = 0``, where ``R_freeze`` is flat or rises. The rule never stops before
      ``R_freeze(t) < R_freeze(0)`` (the warm-up beats freezing the initial kernel) and ``w``
      further rounds have passed, so that the trend below is measured on the descent phase;
    * **gain** of ``h`` more rounds: ``−h ×`` the least-squares slope of ``R_freeze`` over rounds
      ``t − w .. t`` (a first-order model of the inexact descent of §4, which is locally a
      steady decrease);
    * **cost** of ``h`` more rounds, exact: ``min_s J(s, T − t − h) − min_s J(s, T − t)``, how much
      the best option available now degrades when ``h`` frozen rounds are given up;
    * continue while ``gain > cost``; otherwise freeze ``K_{s*}``, ``s* = argmin_s J(s, T − t)``
      (a roll-back when ``s* < t``; the rounds spent are counted). At ``t = T`` the warm-up is
      over and no roll-back remains (plain FedAvg).

    ``window = 5`` and ``horizon = 3`` were chosen on the design instances of
    ``benchmarks/predictive_regret.py`` and are scored there on disjoint evaluation instances.
    """

    window: int = 5
    horizon: int = 3

    def __post_init__(self):
        for name in ("window", "horizon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"OnlineRule.{name} = {value!r}; expected an integer >= 1")

    def decide(self, forecasts, T: int) -> OnlineDecision:
        """The decision at round ``t = len(forecasts) − 1`` from the forecasts of rounds ``0..t``."""
        return online_decision(forecasts, T, self.window, self.horizon)


def _options(forecasts, frozen_rounds: int) -> np.ndarray:
    """``J(s, k)`` for every stored round ``s`` and ``k = frozen_rounds``."""
    return np.array([f.final_objective(frozen_rounds) for f in forecasts])


def _trend(values) -> float:
    """Least-squares slope of ``values`` against their index."""
    y = np.asarray(values, dtype=float)
    x = np.arange(len(y), dtype=float) - (len(y) - 1) / 2.0
    return float(np.sum(x * (y - y.mean())) / np.sum(x * x))


def online_decision(forecasts, T: int, window: int = 5, horizon: int = 3) -> OnlineDecision:
    """:class:`OnlineRule`'s decision at round ``t = len(forecasts) − 1``, from rounds ``0..t`` only."""
    t = len(forecasts) - 1
    if not 0 <= t <= T:
        raise ValueError(f"{len(forecasts)} forecasts for T = {T} rounds; expected 1..T+1")
    if t == T:
        objective = forecasts[T].final_objective(0)
        return OnlineDecision(t, True, T, objective, 0.0, 0.0, "warm-up budget spent: plain FedAvg")
    now = _options(forecasts, T - t)
    s = int(np.argmin(now))
    risk = np.array([f.final_objective(T - f.round) for f in forecasts])   # R_freeze(0..t) + Φ*
    below = np.flatnonzero(risk < risk[0])
    if len(below) == 0 or t < below[0] + window:
        return OnlineDecision(t, False, s, float(now[s]), float("nan"), float("nan"),
                              "escaping the saddle: R_freeze has not yet fallen below R_freeze(0) "
                              f"for {window} rounds")
    h = min(horizon, T - t)
    gain = -h * _trend(risk[t - window:])
    cost = float(np.min(_options(forecasts, T - t - h)) - now[s])
    if gain > cost:
        return OnlineDecision(t, False, s, float(now[s]), gain, cost,
                              f"predicted gain {gain:.3g} of {h} more rounds exceeds their cost {cost:.3g}")
    return OnlineDecision(t, True, s, float(now[s]), gain, cost,
                          f"predicted gain {gain:.3g} of {h} more rounds does not exceed their cost {cost:.3g}")


@dataclass
class OnlineRun:
    """A FedFrozen run whose warm-up length was chosen online (:func:`run_online`).

    ``result`` is the simulator's :class:`~linattn_theory.federated.RunResult` (its table: warm-up
    rows up to ``stop_round``, then the frozen stage); ``kernel_round`` is the round whose kernel
    was frozen (``T0``), ``stop_round`` the round at which the rule decided (``≥ kernel_round``; the
    frozen stage runs ``T − stop_round`` rounds); ``predicted_objective`` the forecast
    ``F_λ(K_{T0}, V_T)``; ``decisions`` one row per warm-up round.
    """

    result: object
    kernel_round: int
    stop_round: int
    predicted_objective: float
    decisions: pd.DataFrame


def run_online(config, clients=None, rule: OnlineRule | None = None, *, params: Params | None = None,
               max_bytes="auto", progress: bool = False) -> OnlineRun:
    """Train FedAvg and freeze the kernel when ``rule`` says so (strategy ``fedfrozen_adaptive``).

    Every round ``t`` runs on the simulator (:func:`~linattn_theory.federated.run_schedule`,
    continued from the previous round's state) and adds the :class:`FreezeForecast` of ``θ^t``;
    the rule sees rounds ``0..t`` only. When it stops at round ``t`` with kernel round ``s``, the
    run continues from ``θ^s`` with the kernel frozen for the remaining ``T − t`` rounds (the
    table keeps the rows of the rounds spent). Full batches and full participation make the
    forecast exact; otherwise it is the forecast of the mean dynamics.
    """
    from tqdm.auto import tqdm

    from .backend import resolve_max_bytes
    from .federated import prepare_run, run_metadata, run_schedule

    rule = OnlineRule(config.federated.adaptive_window, config.federated.adaptive_horizon) \
        if rule is None else rule
    fed = config.federated
    T = fed.rounds
    data, theta0 = prepare_run(config, clients, params)
    max_bytes = resolve_max_bytes(max_bytes, data, config.model.heads, fed.batch_size)
    warm = dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=T)
    states: list = []
    forecasts: list[FreezeForecast] = []
    decisions = []
    keep = states.append
    engine = config.model.engine
    result = run_schedule(theta0, data, dataclasses.replace(warm, rounds=0), T, config.seed,
                          max_bytes=max_bytes, on_round=keep, engine=engine)
    bar = tqdm(total=T, disable=not progress, desc="adaptive warm-up", unit="round", leave=False)
    while True:
        state = states[-1]
        t = state.round
        forecasts.append(freeze_forecast(state.params, data, fed, t))
        decision = rule.decide(forecasts, T)
        decisions.append(dataclasses.asdict(decision))
        if decision.stop or result.diverged:
            break
        result = run_schedule(state.params, data, dataclasses.replace(warm, rounds=t + 1), T,
                              config.seed, max_bytes=max_bytes, prefix=state, on_round=keep, engine=engine)
        bar.update(1)
        if result.diverged:
            break
    bar.close()
    s = decision.kernel_round
    if result.diverged:
        s, t = states[-1].round, states[-1].round
    elif t < T:
        kept = states[next(i for i, st in enumerate(states) if st.round == s)].params
        frozen = dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=t)
        start = state._replace(params=kept, warmup_params=kept)
        result = run_schedule(kept, data, frozen, t, config.seed, max_bytes=max_bytes, prefix=start,
                              engine=engine)
    result.metadata.update(run_metadata(config))
    result.metadata.update(strategy="fedfrozen_adaptive", warmup_rounds=int(s), kernel_round=int(s),
                           stop_round=int(t), predicted_objective=float(decision.freeze_objective))
    result.table["strategy"] = "fedfrozen_adaptive"
    return OnlineRun(result, int(s), int(t), float(decision.freeze_objective), pd.DataFrame(decisions))


# --------------------------------------------------------------------------------------
# pilot, transfer and a-posteriori recommenders (docs/theory.md §6, §8)
# --------------------------------------------------------------------------------------
def default_pilot_rounds(T: int) -> int:
    """``T_p = ⌊T/4⌋`` (at least 2 rounds, so that a trend exists; at most ``T``)."""
    return min(T, max(2, T // 4))


def pilot_bound(terms: pd.DataFrame, T: int) -> pd.DataFrame:
    """``U(T0)`` for ``T0 = 0..T`` from the pilot rounds ``0..T_p`` of ``terms`` (:func:`~linattn_theory.bound.path_terms`).

    The bias term is the inexact-PL curve fitted on the pilot's bias
    (:func:`~linattn_theory.bound.fit_inexact_pl`) and extrapolated; the drift floor grows
    linearly at the pilot's least-squares rate ``γ`` beyond ``T_p``; the value lag ``u``, the
    contraction ``ρ`` and the transient ``τ`` stay at their round-``T_p`` values. Rounds
    ``≤ T_p`` use the measured terms. Returns columns ``round``, ``U``, ``bias_bound``,
    ``drift_floor``, ``frozen_bound``.
    """
    from .bound import _drift_growth, fit_inexact_pl, frozen_stage_bound, tradeoff_bound

    Tp = len(terms) - 1
    bias = terms["bias"].to_numpy()
    frozen_pilot = frozen_stage_bound(terms["drift_floor"].to_numpy(), terms["value_lag"].to_numpy(),
                                      terms["transient"].to_numpy())
    burn_in, b_floor, q = fit_inexact_pl(bias, frozen_pilot)
    level = float(np.max(bias[:burn_in + 1]))
    gamma = _drift_growth(terms["drift_floor"], burn_in)
    rounds = np.arange(T + 1)
    ahead = np.maximum(rounds - Tp, 0)
    last = terms.iloc[-1]
    pad = lambda column, extension: np.concatenate([terms[column].to_numpy(), extension])  # noqa: E731
    drift = pad("drift_floor", np.maximum(last["drift_floor"] + gamma * ahead[Tp + 1:], 0.0))
    lag = pad("value_lag", np.full(T - Tp, last["value_lag"]))
    rho = pad("contraction_rate", np.full(T - Tp, last["contraction_rate"]))
    tau = pad("tau", np.full(T - Tp, last["tau"]))
    U = tradeoff_bound(rounds, T, bias[burn_in], b_floor, q, drift, lag, rho, tau, burn_in, level)
    frozen = frozen_stage_bound(drift, lag, tau * np.power(rho, T - rounds))
    return pd.DataFrame({"round": rounds, "U": U, "bias_bound": U - frozen, "drift_floor": drift,
                         "frozen_bound": frozen})


def pilot_path(config, clients, pilot_rounds: int):
    """The pilot: the first ``T_p`` FedAvg rounds of the run (:func:`~linattn_theory.bound.warmup_path`)."""
    from .bound import warmup_path
    path = warmup_path(config.with_updates({"federated.rounds": pilot_rounds, "federated.warmup_rounds": 0}),
                       clients)
    if path.divergence is not None:
        raise ValueError(f"the pilot's FedAvg rounds diverged: {path.divergence.message}")
    return path


def pilot_warmup(config, clients, path, optimum: float) -> tuple[int, pd.DataFrame]:
    """``(T0, U_pilot)``: ``T0 = argmin_{T0 ≥ T_p} U_pilot(T0)`` from the pilot ``path`` (:func:`pilot_bound`).

    The pilot rounds are the run's own first rounds, so ``T0 < T_p`` is not offered. ``optimum``
    is ``Φ*_λ``, a property of the clients' data (docs/theory.md §8).
    """
    from .bound import path_terms
    Tp = len(path.params) - 1
    curve = pilot_bound(path_terms(path, clients, config, optimum), config.federated.rounds)
    return Tp + int(np.argmin(curve["U"].to_numpy()[Tp:])), curve


@dataclass(frozen=True)
class Recommendation:
    """A recommended warm-up ``T0_theory`` and what it was made from (docs/theory.md §8).

    ``mode`` names the information set and ``information`` says it in a sentence. ``curve`` is
    the bound the recommendation minimised (``pilot``, ``a_posteriori``) or the online rule's
    per-round decisions (``online``); ``stop_round`` is the round at which the online rule
    decided (the frozen stage then runs ``T − stop_round`` rounds); ``bound`` is the
    a-posteriori :class:`~linattn_theory.bound.TradeoffBound` (``a_posteriori`` only), whose
    ``violated`` assumption checks are reported first. ``measured`` holds the simulated excess
    risks of the recommendation and of plain FedAvg (``R(T0_theory)``, ``R(T)``) when asked.
    """

    config: object
    mode: str
    T0_theory: int
    information: str
    curve: pd.DataFrame | None = None
    stop_round: int | None = None
    bound: object | None = None
    details: dict = field(default_factory=dict)
    measured: pd.DataFrame | None = None

    @property
    def descriptive(self) -> bool:
        """True for the a-posteriori fit, which explains a path but predicts nothing."""
        return self.mode == "a_posteriori"

    @property
    def violated(self) -> list:
        """The assumption checks of the bound that failed (empty for modes without a bound)."""
        return [] if self.bound is None else self.bound.violated

    @property
    def measured_gain(self) -> float | None:
        """``R(T) − R(recommendation)`` from the simulations (``None`` if not measured or diverged)."""
        if self.measured is None or self.measured["diverged"].any():
            return None
        R = self.measured.set_index("run")["excess_risk"]
        return float(R.loc["fedavg"] - R.loc["recommended"])


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode = {mode!r}; expected one of {', '.join(map(repr, MODES))}")
    return mode


def _a_posteriori_T0(config, clients, restarts: int):
    from .bound import estimate_bound
    return estimate_bound(config, clients, restarts=restarts)


def default_transfer_seeds(seed: int, count: int = 3) -> list[int]:
    """``count`` seeds after ``seed`` (never ``seed`` itself): the other instances a transfer uses."""
    return [seed + i for i in range(1, count + 1)]


def recommend(config, clients=None, *, mode: str = "online", measure: bool = True,
              pilot_rounds: int | None = None, transfer_seeds=None, rule: OnlineRule | None = None,
              restarts: int = 8) -> Recommendation:
    """Recommend a warm-up length ``T0`` for ``config`` from the information set ``mode`` (docs/theory.md §8).

    * ``"online"`` (default, causal): :func:`run_online` with ``rule`` (default from the config's
      ``adaptive_window``/``adaptive_horizon``); ``T0_theory`` is the frozen kernel's round and
      ``stop_round`` the round at which the rule decided.
    * ``"pilot"``: the first ``pilot_rounds`` (default ``⌊T/4⌋``) FedAvg rounds and ``Φ*_λ`` from the
      data; ``T0_theory = argmin_{T0 ≥ T_p} U_pilot(T0)`` (:func:`pilot_bound`); the pilot rounds
      are the run's own first rounds, so ``T0 < T_p`` is not offered.
    * ``"transfer"``: the median a-posteriori ``T0_theory`` over ``transfer_seeds`` (default the three
      seeds after ``config.seed``; the instance's own seed is refused).
    * ``"a_posteriori"`` (descriptive): ``argmin U`` of the bound fitted on the whole FedAvg path.

    With ``measure``, simulates the recommendation and plain FedAvg against one ``Φ*_λ``.
    """
    from .federated import clients_from_config

    _check_mode(mode)
    T = config.federated.rounds
    clients = clients_from_config(config) if clients is None else clients
    if mode == "online":
        run = run_online(config, clients, rule)
        rec = Recommendation(config, mode, run.kernel_round, INFORMATION["online"],
                             curve=run.decisions, stop_round=run.stop_round,
                             details={"predicted_objective": run.predicted_objective, "run": run.result})
    elif mode == "pilot":
        from .bound import path_optimum
        Tp = default_pilot_rounds(T) if pilot_rounds is None else int(pilot_rounds)
        if not 1 <= Tp <= max(1, T // 4):
            raise ValueError(f"pilot_rounds = {pilot_rounds!r}; expected 1 <= T_p <= T/4 = {T // 4}")
        path = pilot_path(config, clients, Tp)
        optimum = path_optimum(config, clients, path, restarts=restarts).objective
        T0, curve = pilot_warmup(config, clients, path, optimum)
        rec = Recommendation(config, mode, T0, INFORMATION["pilot"].format(pilot_rounds=Tp), curve=curve,
                             details={"pilot_rounds": Tp, "optimum": optimum})
    elif mode == "transfer":
        seeds = default_transfer_seeds(config.seed) if transfer_seeds is None else [int(s) for s in transfer_seeds]
        if not seeds or config.seed in seeds:
            raise ValueError(f"transfer_seeds = {seeds}: expected other seeds than the instance's "
                             f"own seed {config.seed}")
        fitted = {s: _a_posteriori_T0(config.with_updates({"seed": s}), None, restarts).T0_theory for s in seeds}
        T0 = int(np.round(np.median(list(fitted.values()))))
        rec = Recommendation(config, mode, T0, INFORMATION["transfer"].format(seeds=seeds),
                             details={"transfer_seeds": seeds, "transfer_T0": fitted})
    else:
        bound = _a_posteriori_T0(config, clients, restarts)
        rec = Recommendation(config, mode, bound.T0_theory, INFORMATION["a_posteriori"], curve=bound.curve,
                             bound=bound)
    if measure:
        rec = dataclasses.replace(rec, measured=_measure(rec, clients, restarts))
    return rec


def _measure(rec: Recommendation, clients, restarts: int) -> pd.DataFrame:
    """Simulated ``R`` of the recommendation and of plain FedAvg, against one ``Φ*_λ``."""
    from .bound import config_stacked
    from .federated import simulate
    from .theory import centralized_optimum

    config = rec.config
    T = config.federated.rounds
    fedfrozen = lambda T0: config.with_updates({"federated.strategy": "fedfrozen",  # noqa: E731
                                                "federated.warmup_rounds": int(T0)})
    runs = {"recommended": rec.details["run"] if rec.mode == "online" else simulate(fedfrozen(rec.T0_theory), clients),
            "fedavg": simulate(fedfrozen(T), clients)}
    kernels = [np.asarray(to_numpy(kernel(r.warmup_params))) for r in runs.values() if not r.diverged]
    optimum = centralized_optimum(config_stacked(config, clients), config.federated.ridge,
                                  rank=config.model.rank, heads=config.model.heads, restarts=restarts,
                                  seed=config.seed, initial_kernels=kernels).objective
    rows = []
    for name, run in runs.items():
        T0 = rec.T0_theory if name == "recommended" else T
        row = {"run": name, "warmup_rounds": T0, "diverged": run.diverged, "optimum": optimum}
        row["excess_risk"] = (np.nan if run.diverged
                              else float(run.table["loss_regularized"].iloc[-1]) - optimum)
        row["message"] = run.divergence.message if run.diverged else ""
        rows.append(row)
    return pd.DataFrame(rows)
