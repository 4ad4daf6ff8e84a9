"""Scoring warm-up recommenders by their regret on one instance (docs/theory.md §8).

The truth of an instance is ``R(T0) = F_λ(θ_T) − Φ*_λ`` for every ``T0 ∈ {0..T}``, from one
:func:`~linattn_theory.sim.warmup_grid.warmup_sweep` against one centralised optimum ``Φ*_λ``. A
recommender's regret is ``R(T0_rec)/R(T0_best) − 1`` with ``T0_best = argmin_{T0} R(T0)`` (the
smallest such ``T0`` on ties, :func:`best_warmup`); for the online rule, which may roll back,
``R`` is the realised final excess risk of its own run (the rounds it spent counted).

:func:`score_instance` stores what any causal rule can be judged on: the truth, the pilot and
a-posteriori recommendations and, for every round ``s`` of the realised FedAvg path, the
forecasts ``J(s, k) − Φ*_λ``, ``Φ_λ(K_s) − Φ*_λ`` and ``D(K_s)``. :func:`replay_online` runs an
:class:`~linattn_theory.recommenders.online.OnlineRule` on such a record exactly as it runs in
training (:func:`~linattn_theory.recommenders.online.run_online`), and :func:`realised_risk` is
the final excess risk of its decision. ``benchmarks/predictive_regret.py`` runs this over
declared design and evaluation instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.arrays import to_numpy
from ..core.model import kernel

__all__ = ["best_warmup", "regret", "instance_truth", "instance_truths", "score_instance", "score_instances", "StoredForecast",
           "StoredForecasts", "stored_forecasts", "replay_online", "realised_risk", "ScriptedRule", "is_noisy", "fedavg_path",
           "last_round_redraws"]


def best_warmup(excess_risk) -> int:
    """``T0_best = argmin_{T0} R(T0)``, the smallest on ties; non-finite ``R`` (diverged) never wins.

    Parameters
    ----------
    excess_risk : array_like
        ``R(T0)`` for ``T0 = 0..T``.

    Returns
    -------
    int
        ``T0_best``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.recommenders.scoring import best_warmup, regret
    >>> R = [0.5, 0.2, np.nan, 0.2, 0.4]
    >>> best_warmup(R), round(regret(0.3, R), 12)
    (1, 0.5)
    """
    R = np.asarray(excess_risk, dtype=float)
    R = np.where(np.isfinite(R), R, np.inf)
    return int(np.argmin(R))


def regret(risk, excess_risk) -> float:
    """``risk / min_{T0} R(T0) − 1`` (``inf`` for a diverged recommendation).

    Parameters
    ----------
    risk : float
        The recommendation's excess risk.
    excess_risk : array_like
        ``R(T0)`` for ``T0 = 0..T``.

    Returns
    -------
    float
        The relative regret (0: the best warm-up).

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.recommenders.scoring import regret
    >>> R = [0.5, 0.2, 0.4]
    >>> round(regret(0.3, R), 12), regret(0.2, R), regret(np.inf, R)
    (0.5, 0.0, inf)
    """
    R = np.asarray(excess_risk, dtype=float)
    best = R[best_warmup(R)]
    return float(risk / best - 1.0) if np.isfinite(risk) else float("inf")


def instance_truth(config, clients, restarts: int = 8) -> dict:
    """``R(T0)`` for ``T0 = 0..T`` (one warm-up sweep) and ``Φ*_λ`` of one instance.

    ``Φ*_λ`` is :func:`~linattn_theory.theory.profile.centralized_optimum` started from the teacher,
    ``restarts`` random kernels and the best kernel the sweep reached (so ``R ≥ 0`` on the sweep).
    Returns ``{"excess_risk": array, "optimum": float, "diverged": array of bool}``; the one-instance
    case of :func:`instance_truths`.

    Parameters
    ----------
    config, clients
        The instance (:class:`~linattn_theory.sim.config.RunConfig`) and its clients.
    restarts : int, default 8
        Random starts of ``Φ*_λ``.

    Returns
    -------
    dict
        ``excess_risk``, ``optimum``, ``diverged``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import instance_truth
    >>> truth = instance_truth(config, None, restarts=1)
    >>> len(truth["excess_risk"]), bool((truth["excess_risk"] >= 0).all()), bool(truth["diverged"].any())
    (5, True, False)
    """
    return instance_truths([config], [clients], restarts)[0]


def instance_truths(configs, clients=None, restarts: int = 8) -> list[dict]:
    """:func:`instance_truth` of many instances at once: their warm-up sweeps as ensembles
    (:func:`~linattn_theory.sim.warmup_grid.warmup_sweep_many`) and their centralised optima as one
    batched program (:func:`~linattn_theory.theory.profile.centralized_optima`). A truth does not
    depend on which instances are computed with it (bit for bit on the CPU).

    Parameters
    ----------
    configs : sequence of RunConfig
        The instances.
    clients : sequence of FederatedDataset or None, optional
        One entry per config (``None``: built from it).
    restarts : int, default 8
        Random starts of each ``Φ*_λ``.

    Returns
    -------
    list of dict
        One truth per config, in order.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import instance_truth, instance_truths
    >>> truths = instance_truths([config, config.with_updates({"seed": 1})], restarts=1)
    >>> alone = instance_truth(config.with_updates({"seed": 1}), None, restarts=1)
    >>> len(truths), bool(np.array_equal(truths[1]["excess_risk"], alone["excess_risk"]))
    (2, True)
    """
    return _truths_and_paths(configs, clients, restarts)[0]


def _truths_and_paths(configs, clients, restarts: int):
    """``(truths, paths)``: :func:`instance_truths` and the FedAvg trajectory of each sweep
    (``(data, states)`` of :func:`~linattn_theory.sim.warmup_grid.warmup_sweeps_and_paths`)."""
    from ..theory.bound import config_stacked
    from ..theory.profile import centralized_optima, profile_objective
    from ..sim.warmup_grid import warmup_sweeps_and_paths

    from ..data.families import clients_from_config

    configs = list(configs)
    clients = [None] * len(configs) if clients is None else list(clients)
    clients = [clients_from_config(c) if m is None else m for c, m in zip(configs, clients)]
    sweeps, paths = warmup_sweeps_and_paths([c.with_updates({"federated.strategy": "fedfrozen"})
                                             for c in configs], None, clients)
    problems = []
    for config, members, runs in zip(configs, clients, sweeps):
        fed = config.federated
        kernels = [np.asarray(to_numpy(kernel(r.warmup_params))) for r in runs.values() if not r.diverged]
        data = config_stacked(config, members)
        starts = [min(kernels, key=lambda K: profile_objective(K, data, fed.ridge)[0])] if kernels else []
        problems.append(dict(clients=data, lam=fed.ridge, rank=config.model.rank, heads=config.model.heads,
                             restarts=restarts, seed=config.seed, initial_kernels=starts))
    truths = []
    for config, runs, optimum in zip(configs, sweeps, centralized_optima(problems)):
        T = config.federated.rounds
        final = np.array([np.inf if runs[T0].diverged else float(runs[T0].table["loss_regularized"].iloc[-1])
                          for T0 in range(T + 1)])
        truths.append({"excess_risk": final - optimum.objective, "optimum": float(optimum.objective),
                       "diverged": np.array([runs[T0].diverged for T0 in range(T + 1)])})
    return truths, paths


def is_noisy(fed) -> bool:
    """True with minibatches or partial participation: the frozen stage is then a noisy version of
    the affine map of docs/theory.md §5, and the forecasts forecast its mean.

    Parameters
    ----------
    fed : FederatedConfig
        The schedule.

    Returns
    -------
    bool
        The verdict.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import is_noisy
    >>> is_noisy(config.federated), is_noisy(config.with_updates({"federated.participation": 0.5}).federated)
    (False, True)
    """
    return fed.batch_size is not None or fed.participation < 1.0


def fedavg_path(config, clients, *, with_divergence: bool = False):
    """``(data, states)``: the stacked clients and the simulator's state after every round of plain
    FedAvg for ``T`` rounds (``states[t].params = θ^t``; fewer when the run diverges). Minibatches
    and participants are drawn per round, so ``θ^t`` is the state every run of ``config`` with a
    warm-up of at least ``t`` rounds reaches, the online rule's included. With ``with_divergence``
    also the run's :class:`~linattn_theory.sim.engine.Divergence` (``None`` when it did not diverge).

    Parameters
    ----------
    config, clients
        The instance (:class:`~linattn_theory.sim.config.RunConfig`) and its clients.
    with_divergence : bool, default False
        Also return the divergence report.

    Returns
    -------
    data : StackedClients
        The clients.
    states : list of RunState
        ``θ^0 … θ^T``.
    divergence : Divergence or None
        With ``with_divergence`` only.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import fedavg_path
    >>> data, states = fedavg_path(config, None)
    >>> [state.round for state in states]
    [0, 1, 2, 3, 4]
    >>> fedavg_path(config, None, with_divergence=True)[2] is None
    True
    """
    import dataclasses

    from ..sim.engine import prepare_run, run_schedule

    fed = config.federated
    data, theta0 = prepare_run(config, clients)
    states = []
    result = run_schedule(theta0, data, dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=fed.rounds),
                          fed.rounds, config.seed, on_round=states.append, engine=config.model.engine)
    return (data, states, result.divergence) if with_divergence else (data, states)


def last_round_redraws(config, clients=None, draws: int = 40, *, first_seed: int = 10_000) -> np.ndarray:
    """``F_λ(θ_T)`` of FedAvg's last round rerun ``draws`` times from the run's own ``θ^{T−1}`` with the
    draws (participants, minibatches) of seeds ``first_seed, first_seed + 1, …`` in place of the run's:
    the spread of FedAvg's outcome that the last round's sampling alone makes (an a-posteriori
    diagnostic, docs/theory.md §8, "Round 5"). With the run's own seed it is the run's own ``F_λ(θ_T)``;
    with full batches and full participation every redraw is.

    Parameters
    ----------
    config, clients
        The instance (:class:`~linattn_theory.sim.config.RunConfig`) and its clients.
    draws : int, default 40
        How many redraws.
    first_seed : int, default 10000
        The first redraw's seed.

    Returns
    -------
    numpy.ndarray, shape (draws,)
        ``F_λ(θ_T)`` of each redraw (``inf`` where one diverged).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.recommenders.scoring import last_round_redraws
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4, "participation": 0.5}})
    >>> own = last_round_redraws(config, draws=1, first_seed=config.seed)[0]
    >>> bool(own == lt.simulate(config).table["loss_regularized"].iloc[-1])
    True
    """
    import dataclasses

    from ..sim.engine import run_schedule

    T = config.federated.rounds
    data, states = fedavg_path(config, clients)
    if len(states) < T + 1:
        raise ValueError(f"the FedAvg path diverged before round {T}: nothing to redraw")
    fed = dataclasses.replace(config.federated, strategy="fedfrozen", warmup_rounds=T)
    ends = []
    for seed in range(first_seed, first_seed + int(draws)):
        run = run_schedule(states[T - 1].params, data, fed, T, seed, prefix=states[T - 1],
                           engine=config.model.engine)
        ends.append(float("inf") if run.diverged else float(run.table["loss_regularized"].iloc[-1]))
    return np.asarray(ends)


def score_instance(config, clients=None, *, pilot_rounds: int | None = None, restarts: int = 8) -> dict:
    """Truth, the pilot and a-posteriori recommendations and the FedAvg path's forecasts of one
    instance: the record ``benchmarks/predictive_regret.py`` stores (docs/theory.md §8).

    Returns a dict with ``excess_risk`` (the list ``R(0..T)``), ``optimum``, ``best_T0``,
    ``fedavg_diverged`` (also true, with ``fedavg_path_diverged_at`` its round, when the truth's
    FedAvg run ended finite and the record's own FedAvg run diverged: an instance at the edge of
    stability, not scored), ``noisy`` (:func:`is_noisy`), per recommender ``<mode>_T0`` and
    ``<mode>_risk`` (``pilot``, ``a_posteriori``; the transfer recommender reads other instances'
    records and is scored by the caller; ``None``, with ``bound_path_diverged_at`` its round, when
    under noise the bound's redrawn path diverged), and for every round ``s`` of the realised FedAvg path
    ``freeze_objective[s][t − s] = J(s, T − t) − Φ*_λ`` (``t = s..T``), ``profile[s] = Φ_λ(K_s) − Φ*_λ``
    ``drift_floor[s] = D(K_s)`` and ``stability_margin[s] = 2 − η max_c λ_max(Ã_c(K_s))`` (record
    format 4): what an online rule sees (:func:`replay_online`). Nothing in
    it depends on a rule.

    Parameters
    ----------
    config : RunConfig
        The instance.
    clients : FederatedDataset, optional
        Its clients; default those of ``config``.
    pilot_rounds : int, optional
        ``T_p`` of the pilot recommender; default ``⌊T/4⌋``.
    restarts : int, default 8
        Random starts of ``Φ*_λ``.

    Returns
    -------
    dict
        The record.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import score_instance
    >>> record = score_instance(config, restarts=1)
    >>> record["best_T0"] == int(np.argmin(record["excess_risk"])), record["noisy"], record["fedavg_diverged"]
    (True, False, False)
    >>> [len(row) for row in record["freeze_objective"]]     # J(s, T - t) for t = s..T
    [5, 4, 3, 2, 1]
    """
    return score_instances([config], None if clients is None else [clients], pilot_rounds=pilot_rounds,
                           restarts=restarts)[0]


def score_instances(configs, clients=None, *, pilot_rounds: int | None = None, restarts: int = 8) -> list[dict]:
    """:func:`score_instance` of many instances: their truths together (:func:`instance_truths`),
    the rest one instance at a time. A record's FedAvg path (its forecasts; with full batches also
    its pilot and bound) is the truth's FedAvg run itself, not a second run. A record does not
    depend on which instances are scored with it.

    Parameters
    ----------
    configs : sequence of RunConfig
        The instances.
    clients : sequence of FederatedDataset or None, optional
        One entry per config.
    pilot_rounds, restarts
        As in :func:`score_instance`.

    Returns
    -------
    list of dict
        One record per config, in order.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import score_instance, score_instances
    >>> records = score_instances([config, config.with_updates({"seed": 1})], restarts=1)
    >>> [len(record["profile"]) for record in records]
    [5, 5]
    >>> records[0]["excess_risk"] == score_instance(config, restarts=1)["excess_risk"]
    True
    """
    from ..data.families import clients_from_config

    configs = list(configs)
    clients = [clients_from_config(c) for c in configs] if clients is None else list(clients)
    configs = [_resolved(c, m) for c, m in zip(configs, clients)]
    truths, paths = _truths_and_paths(configs, clients, restarts)
    return [_record(config, members, truth, pilot_rounds, path)
            for config, members, truth, path in zip(configs, clients, truths, paths)]


def _resolved(config, clients):
    """``config`` with ``federated.step_scale``, if any, resolved to the instance's ``η``
    (:mod:`linattn_theory.sim.step_size`; the truth's sweep resolves it to the same ``η``)."""
    if config.federated.step_scale is None:
        return config
    from ..sim.engine import hessian_curvature, prepare_run
    from ..sim.step_size import resolve_step_scale
    return resolve_step_scale(config, *prepare_run(config, clients), hessian_curvature)[0]


def _record(config, clients, truth: dict, pilot_rounds: int | None, path=None) -> dict:
    """The record of :func:`score_instance` from the instance's ``truth`` and its sweep's FedAvg
    trajectory ``path = (data, states)`` (the run the truth's ``R(T)`` comes from; ``None``: the
    record runs its own, :func:`fedavg_path`)."""
    from ..theory.bound import estimate_bound, first_rounds, path_from_states, path_terms
    from .recommendation import default_pilot_rounds, pilot_path, pilot_warmup, warmup_path
    from .online import freeze_forecast

    T = config.federated.rounds
    R, optimum = truth["excess_risk"], truth["optimum"]
    record = {"excess_risk": [float(r) for r in R], "optimum": optimum, "best_T0": best_warmup(R),
              "fedavg_diverged": bool(truth["diverged"][-1]), "noisy": is_noisy(config.federated)}
    if truth["diverged"][-1]:
        return record     # the FedAvg path diverges: no bound, no online rule on it
    Tp = default_pilot_rounds(T) if pilot_rounds is None else pilot_rounds
    if path is not None:     # the truth's own FedAvg run: it ended finite, nothing is run again
        (data, states), divergence = path, None
    else:
        data, states, divergence = fedavg_path(config, clients, with_divergence=True)
    if divergence is not None:
        # the truth's FedAvg run (an ensemble) ended finite and this run of the same config did not:
        # an instance at the edge of stability, where another engine's rounding decides (docs/theory.md
        # §6); FedAvg's outcome is not determined, so the instance is counted as diverged, not scored
        record.update(fedavg_diverged=True, fedavg_path_diverged_at=int(divergence.round))
        return record
    if record["noisy"]:      # the bound's path re-draws each round from round 0's streams (warmup_path)
        path = warmup_path(config, clients)
        pilot = pilot_path(config, clients, Tp) if path.divergence is None else None     # its first Tp rounds
        terms = pilot_terms = None
    else:                    # one FedAvg run serves the pilot, the bound and the forecasts: its terms once
        pilot, path = path_from_states(states[:Tp + 1]), path_from_states(states)
        terms = path_terms(path, clients, config, optimum)
        pilot_terms = first_rounds(terms, Tp)
    if path.divergence is not None:
        # under noise the bound's path redraws every round from round 0's streams, another run than the
        # truth's FedAvg, and may diverge where that did not: the pilot and a-posteriori recommenders
        # then have no path (None); the rules read the truth's FedAvg path below and are scored as always
        record.update(bound_path_diverged_at=int(path.divergence.round), pilot_T0=None, a_posteriori_T0=None,
                      pilot_risk=None, a_posteriori_risk=None)
    else:
        record["pilot_T0"] = pilot_warmup(config, clients, pilot, optimum, pilot_terms)[0]
        record["a_posteriori_T0"] = estimate_bound(config, clients, path=path, optimum=optimum, terms=terms).T0_theory
        for mode in ("pilot", "a_posteriori"):
            record[f"{mode}_risk"] = float(R[record[f"{mode}_T0"]])
    rows, profile, floor, margin = [], [], [], []
    for state in states:
        s = state.round
        forecast = freeze_forecast(state.params, data, config.federated, s)
        rows.append([float(v) - optimum for v in forecast.final_objective(T - np.arange(s, T + 1))])
        profile.append(forecast.profile - optimum)
        floor.append(forecast.drift_floor)
        margin.append(forecast.stability_margin)
    record.update(freeze_objective=rows, profile=profile, drift_floor=floor, stability_margin=margin)
    return record


# --------------------------------------------------------------------------------------
# an online rule replayed on a record, and the realised risk of its decision
# --------------------------------------------------------------------------------------
class StoredForecast:
    """A :class:`~linattn_theory.recommenders.online.FreezeForecast` replayed from a record of
    :func:`score_instance`: ``final_objective(k) = J(s, k) − Φ*_λ`` for ``k = 0..T − s``,
    ``profile = Φ_λ(K_s) − Φ*_λ``, ``drift_floor = D(K_s)`` and ``stability_margin`` (NaN in a
    record before format 4; ``Φ*_λ`` cancels in every comparison the rule makes).

    Parameters
    ----------
    record : dict
        A record of :func:`score_instance`.
    s : int
        The round.

    Examples
    --------
    >>> from linattn_theory.recommenders.scoring import StoredForecast
    >>> record = {"excess_risk": [0.5, 0.2, 0.3], "optimum": 1.0, "noisy": False, "profile": [0.4, 0.15, 0.1],
    ...           "drift_floor": [0.01, 0.02, 0.03], "freeze_objective": [[0.5, 0.45, 0.6], [0.2, 0.25], [0.3]]}
    >>> forecast = StoredForecast(record, 0)                  # J(0, k) - Φ*_λ for k = 2, 1, 0
    >>> forecast.final_objective([2, 1, 0]).tolist(), forecast.profile, forecast.drift_floor
    ([0.5, 0.45, 0.6], 0.4, 0.01)
    """

    def __init__(self, record: dict, s: int):
        self.round = s
        row = np.asarray([float(v) for v in record["freeze_objective"][s]], dtype=float)
        self._row, self._T = row, s + len(row) - 1
        self.profile = float(record["profile"][s])
        self.drift_floor = float(record["drift_floor"][s])
        self.stability_margin = float(record.get("stability_margin", [np.nan] * (s + 1))[s])
        self.optimum = float(record["optimum"])         # Φ*_λ: J(s, 0) + Φ*_λ is the observed loss

    def final_objective(self, k):
        return self._row[self._T - np.asarray(k) - self.round]


def replay_online(record: dict, rule) -> tuple[int, int, object]:
    """``(stop_round, kernel_round, decision)`` of ``rule`` (``.decide(forecasts, T)``) on the
    FedAvg path of ``record``, deciding at each round from rounds ``≤ t`` as in training. A path
    that ends before the rule stops (it diverged) ends the warm-up at its last round.

    Parameters
    ----------
    record : dict
        A record of :func:`score_instance`.
    rule : OnlineRule
        Any object with ``decide(forecasts, T)``.

    Returns
    -------
    tuple of (int, int, OnlineDecision)
        ``(stop_round, kernel_round, decision)``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import ScriptedRule, replay_online, score_instance
    >>> record = score_instance(config, restarts=1)
    >>> stop_round, kernel_round, decision = replay_online(record, ScriptedRule(stop_round=2, kernel_round=1))
    >>> stop_round, kernel_round, decision.stop
    (2, 1, True)
    """
    T = len(record["excess_risk"]) - 1
    forecasts = stored_forecasts(record)
    decision = None
    for t in range(len(forecasts)):
        decision = rule.decide(forecasts[:t + 1], T)
        if decision.stop:
            return t, decision.kernel_round, decision
    return len(forecasts) - 1, len(forecasts) - 1, decision


class StoredForecasts(Sequence):
    """The :class:`StoredForecast` of every round ``s`` of a record's FedAvg path as one table
    ``J[s, k] = J(s, k) − Φ*_λ`` (``k = 0..T − s``), so that the rule reads a whole column at once
    (:func:`~linattn_theory.recommenders.online.online_decision` asks ``column(k)``, ``diagonal(T)``,
    ``profiles`` and ``drift_floors`` when a sequence has them): the same numbers as asking each
    round's :class:`StoredForecast`. ``[:t + 1]`` is the table of rounds ``0..t``; an index is a
    :class:`StoredForecast`.

    Parameters
    ----------
    record : dict
        A record of :func:`score_instance`.
    rounds : int, optional
        Rounds ``0..rounds − 1`` of the path; default all.

    Examples
    --------
    >>> from linattn_theory.recommenders.scoring import StoredForecasts
    >>> record = {"excess_risk": [0.5, 0.2, 0.3], "optimum": 1.0, "noisy": False, "profile": [0.4, 0.15, 0.1],
    ...           "drift_floor": [0.01, 0.02, 0.03], "freeze_objective": [[0.5, 0.45, 0.6], [0.2, 0.25], [0.3]]}
    >>> table = StoredForecasts(record)
    >>> len(table), len(table[:2]), table.column(0).tolist()
    (3, 2, [0.6, 0.25, 0.3])
    >>> table.diagonal(2).tolist() == record["excess_risk"]       # J(s, T - s): warm up for s rounds
    True
    """

    def __init__(self, record: dict, rounds: int | None = None, *, _table=None):
        self._record = record
        if _table is None:
            rows = record["freeze_objective"]
            T = len(record["excess_risk"]) - 1
            J = np.full((len(rows), T + 1), np.nan)
            for s, row in enumerate(rows):          # row[i] = J(s, T − s − i)
                values = np.asarray([float(v) for v in row], dtype=float)
                J[s, :len(values)] = values[::-1]
            margins = record.get("stability_margin", [np.nan] * len(rows))
            _table = (J, [float(v) for v in record["profile"]], [float(v) for v in record["drift_floor"]],
                      [float(v) for v in margins])
        self._table = _table
        self._n = len(_table[0]) if rounds is None else rounds

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if start == 0 and step == 1:
                return StoredForecasts(self._record, stop, _table=self._table)
            return [StoredForecast(self._record, s) for s in range(start, stop, step)]
        s = range(self._n)[index]
        return StoredForecast(self._record, s)

    def column(self, frozen_rounds: int) -> np.ndarray:
        """``J(s, k)`` for every stored round ``s`` and ``k = frozen_rounds``."""
        return self._table[0][:self._n, int(frozen_rounds)].copy()

    def diagonal(self, T: int) -> np.ndarray:
        """``J(s, T − s)`` for every stored round ``s``: ``R_freeze(0..t)`` (``+ Φ*``)."""
        s = np.arange(self._n)
        return self._table[0][s, T - s]

    def offers(self, T: int) -> np.ndarray:
        """``B_u = min_{s ≤ u} J(s, T − u)`` for every stored round ``u`` (:func:`~.signals.offers`),
        from the table at once."""
        u = np.arange(self._n)
        J = self._table[0][:self._n][:, T - u]                  # J[s, T − u], rows s, columns u
        J = np.where((u[:, None] <= u[None, :]) & np.isfinite(J), J, np.inf)
        return J.min(axis=0)

    @property
    def profiles(self) -> list[float]:
        return self._table[1][:self._n]

    @property
    def drift_floors(self) -> list[float]:
        return self._table[2][:self._n]

    @property
    def optimum(self) -> float:
        """``Φ*_λ`` of the record (``J(u, 0) + Φ*_λ`` is the loss a server observes at round ``u``)."""
        return float(self._record["optimum"])

    @property
    def stability_margins(self) -> list[float]:
        """``2 − η max_c λ_max(Ã_c(K_s))`` of the stored rounds (NaN in a record before format 4)."""
        return self._table[3][:self._n]

    @property
    def noisy(self) -> bool:
        """Whether the record's run samples (minibatches or partial participation, :func:`is_noisy`): a
        fact of its configuration, known before training."""
        return bool(self._record["noisy"])


def stored_forecasts(record: dict) -> StoredForecasts:
    """The forecasts of every round of the record's FedAvg path (:class:`StoredForecasts`, a sequence
    of :class:`StoredForecast`).

    Parameters
    ----------
    record : dict
        A record of :func:`score_instance`.

    Returns
    -------
    StoredForecasts
        The forecasts.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import score_instance, stored_forecasts
    >>> record = score_instance(config, restarts=1)
    >>> forecasts = stored_forecasts(record)       # J(s, T - s) - Φ*_λ, forecast at s, is R(s), simulated
    >>> len(forecasts), bool(np.allclose(forecasts.diagonal(4), record["excess_risk"], rtol=1e-12, atol=0))
    (5, True)
    """
    return StoredForecasts(record)


@dataclass(frozen=True)
class ScriptedRule:
    """A rule that freezes the kernel of round ``kernel_round`` at round ``stop_round`` (for
    :func:`realised_risk`: the simulator realises a decision taken elsewhere).

    Parameters
    ----------
    stop_round : int
        ``t``.
    kernel_round : int
        ``s ≤ t``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.scoring import ScriptedRule, score_instance, stored_forecasts
    >>> forecasts = stored_forecasts(score_instance(config, restarts=1))
    >>> rule = ScriptedRule(stop_round=2, kernel_round=1)
    >>> at_2 = rule.decide(forecasts[:3], 4)                  # forecasts of rounds 0..2
    >>> rule.decide(forecasts[:2], 4).stop, at_2.stop, at_2.kernel_round
    (False, True, 1)
    """

    stop_round: int
    kernel_round: int

    def decide(self, forecasts, T: int):
        from .online import OnlineDecision
        t = len(forecasts) - 1
        stop = t == min(self.stop_round, T)
        s = self.kernel_round if stop and t < T else t
        nan = float("nan")
        return OnlineDecision(t, stop, s, float(forecasts[s].final_objective(T - t)), nan, nan, nan, nan,
                              "scripted", "scripted")


def realised_risk(record: dict, stop_round: int, kernel_round: int, config=None, clients=None,
                  outcome: str = "freeze") -> float:
    """The final excess risk ``F_λ(θ_T) − Φ*_λ`` of freezing ``K_s`` (``s = kernel_round``) at round
    ``t = stop_round``, the rounds spent counted.

    ``s = t``: the warm-up sweep's ``R(t)`` (every run draws its minibatches and participants per
    round, so this is the run's own outcome). A roll-back ``s < t`` with full batches and full
    participation: the stored exact forecast ``J(s, T − t) − Φ*_λ``; otherwise the simulator's run
    of the decision (:class:`ScriptedRule`, needs ``config``). ``t = T`` (no frozen round left) and
    ``outcome = "iterate"`` (the run ends with the stored iterate ``θ_s``): ``J(s, 0) − Φ*_λ =
    F_λ(θ_s) − Φ*_λ``, the loss of the path's own iterate on the full data, exact under any noise.
    ``outcome = "solve"`` (the exact value solve at ``K_s`` in the last round, docs/theory.md §5):
    ``Φ_λ(K_s) − Φ*_λ``, exact under any noise (the solve uses every client's full data).

    Parameters
    ----------
    record : dict
        A record of :func:`score_instance`.
    stop_round : int
        ``t``.
    kernel_round : int
        ``s``.
    config : RunConfig, optional
        The instance (needed to simulate a noisy roll-back).
    clients : FederatedDataset, optional
        Its clients.
    outcome : {"freeze", "iterate", "solve"}, default "freeze"
        What the decision does (:class:`~linattn_theory.recommenders.online.OnlineDecision`).

    Returns
    -------
    float
        The excess risk.

    Examples
    --------
    >>> from linattn_theory.recommenders.scoring import realised_risk
    >>> record = {"excess_risk": [0.5, 0.2, 0.3], "optimum": 1.0, "noisy": False, "profile": [0.4, 0.15, 0.1],
    ...           "drift_floor": [0.01, 0.02, 0.03], "freeze_objective": [[0.5, 0.45, 0.6], [0.2, 0.25], [0.3]]}
    >>> realised_risk(record, 1, 1), realised_risk(record, 1, 0)      # R(1); J(0, 1) - Φ*_λ (a roll-back)
    (0.2, 0.45)
    >>> realised_risk(record, 1, 0, outcome="iterate"), realised_risk(record, 1, 0, outcome="solve")
    (0.6, 0.4)
    """
    s, t = int(kernel_round), int(stop_round)
    R = record["excess_risk"]
    T = len(R) - 1
    if outcome not in ("freeze", "iterate", "solve"):
        raise ValueError(f"outcome = {outcome!r}; expected 'freeze', 'iterate' or 'solve'")
    if outcome == "solve":
        return float(record["profile"][s])
    if s == t and (outcome == "freeze" or t == T):
        return float(R[t])
    if outcome == "iterate" or t == T:
        return float(record["freeze_objective"][s][T - s])
    if not record["noisy"]:
        return float(record["freeze_objective"][s][t - s])
    if config is None:
        raise ValueError("a roll-back under minibatches or partial participation is realised by a "
                         "simulation: pass the instance's config")
    from .online import run_online
    run = run_online(config, clients, ScriptedRule(t, s))
    if run.result.diverged:
        return float("inf")
    return float(run.result.table["loss_regularized"].iloc[-1]) - float(record["optimum"])
