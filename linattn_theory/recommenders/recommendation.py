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
  (:func:`linattn_theory.theory.bound.estimate_bound`). It explains a curve; it predicts nothing.

All mathematics of the rules lives in small pure functions on per-round forecasts; the
federated loop that feeds them is :func:`run_online`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..core.arrays import to_numpy
from ..core.model import kernel
from .online import OnlineRule, run_online

__all__ = ["MODES", "INFORMATION", "Recommendation", "recommend", "default_pilot_rounds", "pilot_bound",
           "pilot_path", "pilot_warmup", "default_transfer_seeds", "warmup_path",
           "a_posteriori_bound"]

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
# pilot, transfer and a-posteriori recommenders (docs/theory.md §6, §8)
# --------------------------------------------------------------------------------------
def default_pilot_rounds(T: int) -> int:
    """``T_p = ⌊T/4⌋`` (at least 2 rounds, so that a trend exists; at most ``T``).

    Parameters
    ----------
    T : int
        Rounds.

    Returns
    -------
    int
        ``T_p``.

    Examples
    --------
    >>> from linattn_theory.recommenders.recommendation import default_pilot_rounds
    >>> default_pilot_rounds(40), default_pilot_rounds(5)
    (10, 2)
    """
    return min(T, max(2, T // 4))


def pilot_bound(terms: pd.DataFrame, T: int) -> pd.DataFrame:
    """``U(T0)`` for ``T0 = 0..T`` from the pilot rounds ``0..T_p`` of ``terms`` (:func:`~linattn_theory.theory.bound.path_terms`).

    The bias term is the inexact-PL curve fitted on the pilot's bias
    (:func:`~linattn_theory.theory.bound.fit_inexact_pl`) and extrapolated; the drift floor grows
    linearly at the pilot's least-squares rate ``γ`` beyond ``T_p``; the value lag ``u``, the
    contraction ``ρ`` and the transient ``τ`` stay at their round-``T_p`` values. Rounds
    ``≤ T_p`` use the measured terms. Returns columns ``round``, ``U``, ``bias_bound``,
    ``drift_floor``, ``frozen_bound``.

    Parameters
    ----------
    terms : pandas.DataFrame
        :func:`~linattn_theory.theory.bound.path_terms` of the pilot rounds.
    T : int
        Rounds of the run.

    Returns
    -------
    pandas.DataFrame
        ``U_pilot``, one row per ``T0 = 0..T``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> config = lt.config_from_dict({"federated": {"rounds": 8, "warmup_rounds": 8}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.recommenders.recommendation import pilot_bound, pilot_path
    >>> from linattn_theory.theory.bound import path_optimum, path_terms
    >>> pilot = pilot_path(config, clients, 3)                          # T_p = 3 of T = 8 rounds
    >>> optimum = path_optimum(config, clients, pilot, restarts=1).objective
    >>> terms = path_terms(pilot, clients, config, optimum)
    >>> curve = pilot_bound(terms, T=8)
    >>> curve["round"].tolist() == list(range(9)), bool(np.allclose(curve["drift_floor"][:4], terms["drift_floor"]))
    (True, True)
    """
    from ..theory.bound import drift_growth_rate, fit_inexact_pl, frozen_stage_bound, tradeoff_bound

    Tp = len(terms) - 1
    bias = terms["bias"].to_numpy()
    frozen_pilot = frozen_stage_bound(terms["drift_floor"].to_numpy(), terms["value_lag"].to_numpy(),
                                      terms["transient"].to_numpy())
    burn_in, b_floor, q = fit_inexact_pl(bias, frozen_pilot)
    level = float(np.max(bias[:burn_in + 1]))
    gamma = drift_growth_rate(terms["drift_floor"], burn_in)
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


def warmup_path(config, clients=None):
    """Run plain FedAvg for ``T = config.federated.rounds`` rounds and keep ``θ^t`` at every round:
    the :class:`~linattn_theory.theory.bound.WarmupPath` the bound ``U(T0)`` is fitted on.

    ``θ^t`` is the simulator's own state. With full batches and full participation a round does
    not depend on its index: one :func:`~linattn_theory.sim.engine.run_schedule` of ``T`` rounds
    gives every ``θ^t`` (:func:`~linattn_theory.theory.bound.path_from_states`), bit-identical to round ``t`` of
    :func:`~linattn_theory.simulate`. With minibatches or client sampling, or when the run diverges
    (to report the round), each round is one ``run_schedule`` call that re-draws from the streams
    of round 0 (the bound's full-batch assumption is then reported as violated).

    Parameters
    ----------
    config : RunConfig
        The instance.
    clients : FederatedDataset or StackedClients, optional
        Its clients; default: built from ``config``.

    Returns
    -------
    WarmupPath
        ``θ^0 … θ^T``, the run's table and its divergence (if any).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 32, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.recommendation import warmup_path
    >>> path = warmup_path(config)
    >>> len(path.params), path.divergence            # θ^0 … θ^4
    (5, None)
    """
    from ..sim.engine import clients_from_config, initial_params, run_schedule
    from ..theory.bound import config_stacked, path_from_states

    clients = clients_from_config(config) if clients is None else clients
    data = config_stacked(config, clients, np.dtype(config.model.dtype))
    params = initial_params(config, data.q.shape[-1], data.y.shape[-1])
    fed = config.federated
    if fed.batch_size is None and fed.participation >= 1.0:
        states = []
        whole = run_schedule(params, data, dataclasses.replace(fed, warmup_rounds=fed.rounds, strategy="fedavg"), fed.rounds,
                             config.seed, on_round=states.append, engine=config.model.engine)
        if not whole.diverged:
            return path_from_states(states)
    return _path_round_by_round(params, data, config)


def _path_round_by_round(params, data, config):
    """:func:`warmup_path` as ``T`` one-round runs from ``params``, each re-drawing from round 0's
    streams; a divergence is reported at its round."""
    from ..sim.engine import run_schedule
    from ..theory.bound import WarmupPath

    one = dataclasses.replace(config.federated, rounds=1, warmup_rounds=1, strategy="fedavg")
    states, tables, divergence = [params], [], None
    for t in range(config.federated.rounds):
        result = run_schedule(params, data, one, 1, config.seed, engine=config.model.engine)
        table = result.table.iloc[1:].copy()
        table["round"] = t + 1
        tables.append(table)
        if result.diverged:
            divergence = dataclasses.replace(result.divergence, round=t + 1)
            break
        params = result.params
        states.append(params)
    table = pd.concat(tables, ignore_index=True)
    gamma = np.cumsum(table["kernel_drift"].to_numpy())
    table["cumulative_kernel_drift"] = gamma
    return WarmupPath(tuple(states), table, divergence)


def a_posteriori_bound(config, clients=None, *, optimum=None, restarts: int = 8):
    """:func:`~linattn_theory.theory.bound.estimate_bound` on the instance's own FedAvg path of
    ``T`` rounds (:func:`warmup_path`, on the clients stacked once in float64).

    Parameters
    ----------
    config : RunConfig
        The instance.
    clients : FederatedDataset, optional
        Its clients; default: built from ``config``.
    optimum : float, optional
        ``Φ*_λ``; default: computed (:func:`~linattn_theory.theory.bound.estimate_bound`).
    restarts : int, default 8
        Restarts of the centralised optimum's search.

    Returns
    -------
    TradeoffBound
        The fitted bound ``U(T0)``, its minimiser ``T0_theory``, constants and assumption checks.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 32, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.recommendation import a_posteriori_bound
    >>> bound = a_posteriori_bound(config, restarts=1)
    >>> bound.curve["round"].tolist(), 0 <= bound.T0_theory <= 4
    ([0, 1, 2, 3, 4], True)
    """
    from ..sim.engine import clients_from_config
    from ..theory.bound import config_stacked, estimate_bound

    data = config_stacked(config, clients_from_config(config) if clients is None else clients)
    return estimate_bound(config, data, path=warmup_path(config, data), optimum=optimum, restarts=restarts)


def pilot_path(config, clients, pilot_rounds: int):
    """The pilot: the first ``T_p`` FedAvg rounds of the run (:func:`warmup_path`).

    Parameters
    ----------
    config, clients
        The instance (:class:`~linattn_theory.sim.config.RunConfig`) and its clients.
    pilot_rounds : int
        ``T_p``.

    Returns
    -------
    WarmupPath
        ``θ^0 … θ^{T_p}``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> config = lt.config_from_dict({"federated": {"rounds": 8, "warmup_rounds": 8}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.recommenders.recommendation import pilot_path, warmup_path
    >>> pilot = pilot_path(config, clients, 3)
    >>> len(pilot.params), len(pilot.table)                             # θ^0..θ^3, rounds 1..3
    (4, 3)
    >>> bool(np.array_equal(pilot.params[3].WV, warmup_path(config, clients).params[3].WV))   # the run's own rounds
    True
    """
    path = warmup_path(config.with_updates({"federated.rounds": pilot_rounds, "federated.warmup_rounds": 0}),
                       clients)
    if path.divergence is not None:
        raise ValueError(f"the pilot's FedAvg rounds diverged: {path.divergence.message}")
    return path


def pilot_warmup(config, clients, path, optimum: float, terms: pd.DataFrame | None = None) -> tuple[int, pd.DataFrame]:
    """``(T0, U_pilot)``: ``T0 = argmin_{T0 ≥ T_p} U_pilot(T0)`` from the pilot ``path`` (:func:`pilot_bound`).

    The pilot rounds are the run's own first rounds, so ``T0 < T_p`` is not offered. ``optimum``
    is ``Φ*_λ``, a property of the clients' data (docs/theory.md §8).

    Parameters
    ----------
    config, clients
        The instance and its clients, as in :func:`pilot_path`.
    path : WarmupPath
        The pilot (:func:`pilot_path`).
    optimum : float
        ``Φ*_λ``.
    terms : pandas.DataFrame, optional
        :func:`~linattn_theory.theory.bound.path_terms` of ``path`` against ``optimum``, when at hand
        (e.g. :func:`~linattn_theory.theory.bound.first_rounds` of a longer run's).

    Returns
    -------
    T0 : int
        The recommendation.
    U_pilot : pandas.DataFrame
        The extrapolated bound (:func:`pilot_bound`).

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> config = lt.config_from_dict({"federated": {"rounds": 8, "warmup_rounds": 8}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.recommenders.recommendation import pilot_path, pilot_warmup
    >>> from linattn_theory.theory.bound import path_optimum, path_terms
    >>> pilot = pilot_path(config, clients, 3)                          # T_p = 3 of T = 8 rounds
    >>> optimum = path_optimum(config, clients, pilot, restarts=1).objective
    >>> T0, curve = pilot_warmup(config, clients, pilot, optimum)
    >>> 3 <= T0 <= 8, len(curve)                                        # never before the pilot's end
    (True, 9)
    """
    from ..theory.bound import path_terms
    Tp = len(path.params) - 1
    if terms is None:
        terms = path_terms(path, clients, config, optimum)
    elif len(terms) != Tp + 1:
        raise ValueError(f"terms has {len(terms)} rows; expected one per pilot round ({Tp + 1})")
    curve = pilot_bound(terms, config.federated.rounds)
    return Tp + int(np.argmin(curve["U"].to_numpy()[Tp:])), curve


@dataclass(frozen=True)
class Recommendation:
    """A recommended warm-up ``T0_theory`` and what it was made from (docs/theory.md §8).

    ``mode`` names the information set and ``information`` says it in a sentence. ``curve`` is
    the bound the recommendation minimised (``pilot``, ``a_posteriori``) or the online rule's
    per-round decisions (``online``); ``stop_round`` is the round at which the online rule
    decided (the frozen stage then runs ``T − stop_round`` rounds); ``bound`` is the
    a-posteriori :class:`~linattn_theory.theory.bound.TradeoffBound` (``a_posteriori`` only), whose
    ``violated`` assumption checks are reported first. ``measured`` holds the simulated excess
    risks of the recommendation and of plain FedAvg (``R(T0_theory)``, ``R(T)``) when asked.

    Parameters
    ----------
    config : RunConfig
        The instance.
    mode : str
        ``"online"``, ``"pilot"``, ``"transfer"`` or ``"a_posteriori"``.
    T0_theory : int
        The recommended warm-up length.
    information : str
        The information set, in a sentence.
    curve : pandas.DataFrame, optional
        The bound minimised, or the online rule's decisions.
    stop_round : int, optional
        The round at which the online rule decided.
    bound : TradeoffBound, optional
        The a-posteriori bound.
    details : dict, optional
        What else the mode computed (pilot rounds, transfer seeds and their ``T0``, …).
    measured : pandas.DataFrame, optional
        ``R(T0_theory)`` and ``R(T)`` when measured.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 8, "warmup_rounds": 4}})
    >>> advice = lt.recommend(config, mode="pilot", pilot_rounds=2, restarts=2, measure=False)
    >>> advice.mode, 2 <= advice.T0_theory <= 8, advice.measured is None
    ('pilot', True, True)
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
    return a_posteriori_bound(config, clients, restarts=restarts)


def default_transfer_seeds(seed: int, count: int = 3) -> list[int]:
    """``count`` seeds after ``seed`` (never ``seed`` itself): the other instances a transfer uses.

    Parameters
    ----------
    seed : int
        The instance's own seed.
    count : int, default 3
        How many.

    Returns
    -------
    list of int
        The seeds.

    Examples
    --------
    >>> from linattn_theory.recommenders.recommendation import default_transfer_seeds
    >>> default_transfer_seeds(5)
    [6, 7, 8]
    """
    return [seed + i for i in range(1, count + 1)]


def _resolved(config, clients=None):
    """``config`` with its step scale, if any, resolved to its instance's ``η`` (:mod:`linattn_theory.sim.step_size`)."""
    from ..sim.engine import hessian_curvature, prepare_run
    from ..sim.step_size import resolve_step_scale

    if config.federated.step_scale is None:
        return config
    return resolve_step_scale(config, *prepare_run(config, clients), hessian_curvature)[0]


def recommend(config, clients=None, *, mode: str = "online", measure: bool = True,
              pilot_rounds: int | None = None, transfer_seeds=None, rule: OnlineRule | None = None,
              restarts: int = 8) -> Recommendation:
    """Recommend a warm-up length ``T0`` for ``config`` from the information set ``mode`` (docs/theory.md §8).

    * ``"online"`` (default, causal): :func:`run_online` with ``rule`` (default from the config's
      ``adaptive_window``/``adaptive_horizon``/``adaptive_confidence``); ``T0_theory`` is the frozen kernel's round and
      ``stop_round`` the round at which the rule decided.
    * ``"pilot"``: the first ``pilot_rounds`` (default ``⌊T/4⌋``) FedAvg rounds and ``Φ*_λ`` from the
      data; ``T0_theory = argmin_{T0 ≥ T_p} U_pilot(T0)`` (:func:`pilot_bound`); the pilot rounds
      are the run's own first rounds, so ``T0 < T_p`` is not offered.
    * ``"transfer"``: the median a-posteriori ``T0_theory`` over ``transfer_seeds`` (default the three
      seeds after ``config.seed``; the instance's own seed is refused).
    * ``"a_posteriori"`` (descriptive): ``argmin U`` of the bound fitted on the whole FedAvg path.

    With ``measure``, simulates the recommendation and plain FedAvg against one ``Φ*_λ``. A step scale
    (``federated.step_scale``) is resolved to the instance's ``η`` first, and to each transfer seed's own.

    Parameters
    ----------
    config : RunConfig
        The instance; its ``federated.warmup_rounds`` is not used.
    clients : FederatedDataset, optional
        Its clients; default those of ``config``.
    mode : {"online", "pilot", "transfer", "a_posteriori"}, default "online"
        The information set (above).
    measure : bool, default True
        Also simulate the recommendation and plain FedAvg and report their excess risks (``measured``).
    pilot_rounds : int, optional
        Pilot rounds ``T_p`` (``"pilot"``); default ``⌊T/4⌋``.
    transfer_seeds : iterable of int, optional
        The other instances' seeds (``"transfer"``); default the three after ``config.seed``.
    rule : OnlineRule, optional
        The online rule (``"online"``); default from the config.
    restarts : int, default 8
        Random starts of the centralised optimum ``Φ*_λ``.

    Returns
    -------
    Recommendation
        ``T0_theory``, the information it used, the curve or decisions it came from and, with
        ``measure``, the measured excess risks.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 12, "warmup_rounds": 4}})
    >>> advice = lt.recommend(config, measure=False)
    >>> advice.mode, 0 <= advice.T0_theory <= advice.stop_round <= 12
    ('online', True)
    >>> lt.recommend(config, mode="a_posteriori", restarts=2).measured["run"].tolist()
    ['recommended', 'fedavg']
    """
    from ..data.families import clients_from_config

    _check_mode(mode)
    T = config.federated.rounds
    clients = clients_from_config(config) if clients is None else clients
    scaled, config = config, _resolved(config, clients)
    if mode == "online":
        run = run_online(config, clients, rule)
        rec = Recommendation(config, mode, run.kernel_round, INFORMATION["online"],
                             curve=run.decisions, stop_round=run.stop_round,
                             details={"predicted_objective": run.predicted_objective, "run": run.result})
    elif mode == "pilot":
        from ..theory.bound import path_optimum
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
        fitted = {s: _a_posteriori_T0(_resolved(scaled.with_updates({"seed": s})), None, restarts).T0_theory
                  for s in seeds}
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
    from ..theory.bound import config_stacked
    from ..sim.engine import simulate
    from ..theory.profile import centralized_optimum

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
