"""Where freezing pays against tuned FedAvg: the phase diagram's instances, arms and statistics
(docs/theory.md §6 "Where freezing pays"; simulations/phase_diagram.py; issue 30, items 4 and 6).

An instance is ``(ζ_V, seed)``; its step scale ``c`` sets ``η = c · 2 / λ_max(θ⁰)`` with the full
model's curvature at ``θ⁰`` (:func:`stable_step`, ``federated.step_curvature = "model"`` of
:mod:`linattn_theory.sim.step_size`, computed once per instance). :func:`predictor_inputs` gives the
a-priori predictor (:mod:`linattn_theory.theory.phase_predictor`) what it may know at the start.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.model import kernel
from ..recommenders.scoring import best_warmup
from ..sim.config import RunConfig
from ..sim.engine import clients_from_config, hessian_curvature, prepare_run
from ..sim.sweep.executors import in_processes
from ..core.curvature import MODEL_ITERATIONS
from ..theory.bound import drift_floor_leading_order
from ..theory.decomposition import decompose_excess_risk
from ..theory.phase_predictor import (drift_share, edge_round, predict_best_warmup, predict_pays,
                                      stability_margin)
from ..theory.profile import profile_objective
from .tuning import choose_steps

__all__ = ["stable_step", "stable_steps", "predictor_inputs"]


def stable_step(config: RunConfig, clients=None) -> tuple[float, float]:
    """``(2/λ_max, λ_max)``, ``λ_max = max_c λ_max(∇²F_{λ,c}(θ⁰))`` of ``config``'s instance (the
    ``"model"`` curvature of :func:`~linattn_theory.sim.step_size.resolve_step_scale`, same iterations).

    Parameters
    ----------
    config : RunConfig
        The instance.
    clients : FederatedDataset, optional
        Its clients; default: built from ``config``.

    Returns
    -------
    step : float
        ``2 / λ_max``.
    curvature : float
        ``λ_max``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.phase_diagram import stable_step
    >>> step, curvature = stable_step(lt.config_from_dict({"federated": {"rounds": 20, "warmup_rounds": 2}}))
    >>> round(step * curvature, 12)
    2.0
    """
    data, theta0 = prepare_run(config, clients)
    curvature = float(np.max(hessian_curvature(theta0, data, config.federated.ridge, iterations=MODEL_ITERATIONS)))
    return 2.0 / curvature, curvature


def stable_steps(configs, clients) -> list[tuple[float, float]]:
    """:func:`stable_step` of many instances: those of equal shapes, attention, temperature and ridge
    iterated together (:func:`~linattn_theory.core.curvature.hessian_curvature` over their points and
    data), each the same numbers as alone, bit for bit.

    Parameters
    ----------
    configs : sequence of RunConfig
        The instances.
    clients : sequence of FederatedDataset
        Their clients.

    Returns
    -------
    list of tuple of (float, float)
        ``(2/λ_max, λ_max)`` per instance, in their order.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.phase_diagram import stable_step, stable_steps
    >>> from linattn_theory.sim.engine import clients_from_config
    >>> configs = [lt.config_from_dict({"seed": seed, "federated": {"rounds": 4, "warmup_rounds": 2}}) for seed in (0, 1)]
    >>> clients = [clients_from_config(config) for config in configs]
    >>> stable_steps(configs, clients) == [stable_step(c, cl) for c, cl in zip(configs, clients)]
    True
    """
    prepared = [prepare_run(config, inst_clients) for config, inst_clients in zip(configs, clients)]
    groups: dict = {}
    for i, (config, (data, _)) in enumerate(zip(configs, prepared)):
        key = (data.inputs.shape, data.q.shape, data.y.shape, str(data.S.dtype), data.attention, data.temperature,
               config.federated.ridge)
        groups.setdefault(key, []).append(i)
    steps: list = [None] * len(prepared)
    for members in groups.values():
        rows = hessian_curvature([prepared[i][1] for i in members], [prepared[i][0] for i in members],
                                 configs[members[0]].federated.ridge, iterations=MODEL_ITERATIONS)
        for i, row in zip(members, rows):
            curvature = float(np.max(row))
            steps[i] = (2.0 / curvature, curvature)
    return steps


def predictor_inputs(config: RunConfig, eta: float, curvature: float, clients=None, warmups=None) -> dict:
    """What the predictor knows at the start of ``config``'s run at step ``eta`` (docs/theory.md §6):
    the stability margin ``m = 2 − ηλ_max(θ⁰)``, the drift floor's leading order ``D₂(K⁰)`` (§5) at
    the initial kernel with ``η`` and ``E``, the profile ``Φ_λ(K⁰)``, their ratio, the edge round and
    the predictions (a) ``predicted_pays`` and (b) ``predicted_T0`` (on the grid ``warmups``).

    Parameters
    ----------
    config : RunConfig
        The instance (its ``T``, ``E`` and ``λ``).
    eta : float
        The step ``η``.
    curvature : float
        ``λ_max(θ⁰)`` (:func:`stable_step`).
    clients : FederatedDataset, optional
        Its clients; default: built from ``config``.
    warmups : sequence of int, optional
        The grid of ``T0`` for (b); default every round.

    Returns
    -------
    dict
        ``margin``, ``drift_leading_order``, ``profile_initial``, ``drift_share``, ``edge_round``,
        ``predicted_pays`` and ``predicted_T0``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.phase_diagram import predictor_inputs, stable_step
    >>> config = lt.config_from_dict({"federated": {"rounds": 20, "warmup_rounds": 2}})
    >>> step, curvature = stable_step(config)
    >>> inputs = predictor_inputs(config, 0.9 * step, curvature, warmups=[0, 5, 10, 20])
    >>> round(inputs["margin"], 12), inputs["predicted_pays"], inputs["predicted_T0"]
    (0.2, True, 0)
    """
    clients = clients_from_config(config) if clients is None else clients
    fed = config.federated
    _, theta0 = prepare_run(config, clients)
    K0 = np.asarray(kernel(theta0), dtype=np.float64)
    D2 = drift_floor_leading_order(K0, clients, eta, fed.local_steps, fed.ridge)["leading_order"]
    phi0 = float(profile_objective(K0, clients, fed.ridge)[0])
    m = stability_margin(eta, curvature)
    T = fed.rounds
    return {"margin": m, "drift_leading_order": float(D2), "profile_initial": phi0,
            "drift_share": drift_share(D2, phi0), "edge_round": edge_round(m, T),
            "predicted_pays": bool(predict_pays(m, T)), "predicted_T0": int(predict_best_warmup(m, T, warmups))}


# -- the diagram's settings, runs and rows ------------------------------------------------------

#: the keys of ``simulations/configs/phase_diagram.toml`` besides ``base`` and ``quick``
SETTINGS = ("step_scales", "fedavg_steps", "zeta_value", "local_steps", "design_seeds", "heldout_seeds",
            "threshold", "bootstrap_resamples", "bootstrap_seed")
#: the arms of the per-instance table: FedAvg at its tuned step and its oracle best iterate there;
#: at the cell's step c: plain FedAvg, FedFrozen at its best T0 (an oracle over T0) and at the
#: predicted T0, FedAvg to T then the server's exact value solve (value_solve_final), and the online
#: rule's realised run (fedfrozen_online: strategy ``fedfrozen_adaptive``, its default rule, docs/theory.md §8)
ARMS = ("fedavg_tuned", "fedavg_tuned_oracle", "fedavg", "fedfrozen_best", "fedfrozen_predicted",
        "value_solve_final", "fedfrozen_online")
#: the per-instance table's columns (figures/phase_diagram.csv)
ROW_COLUMNS = ["role", "seed", "zeta_value", "local_steps", "step_scale", "arm", "step", "learning_rate", "T0",
               "excess_risk", "diverged", "chaotic", "margin", "drift_share", "predicted_pays", "predicted_T0",
               "bias", "drift_floor", "unfinished", "contraction_rate"]


def load_settings(path, quick: bool = False, keys: tuple = SETTINGS) -> dict:
    """The declared settings of ``path`` (``phase_diagram.toml``), ``[quick]`` applied: the ``keys``
    (default :data:`SETTINGS`; another diagram's, e.g. digits') and ``base``, the :class:`RunConfig`
    every run starts from."""
    import tomllib
    from pathlib import Path

    from ..core.errors import ConfigError
    from ..sim.config import config_from_dict

    raw = tomllib.loads(Path(path).read_text())
    unknown = sorted(set(raw) - {*keys, "base", "quick"})
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key; allowed keys are {', '.join((*keys, 'base', 'quick'))}")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise ConfigError(f"{missing[0]}: missing; {Path(path).name} declares {', '.join(keys)}")
    settings = {k: raw[k] for k in keys}
    base = config_from_dict(raw["base"])
    if quick:
        extra = dict(raw.get("quick", {}))
        updates = extra.pop("base", {})
        settings.update(extra)
        base = base.with_updates(updates)
    shared = sorted(set(settings["design_seeds"]) & set(settings["heldout_seeds"]))
    if shared:
        raise ConfigError(f"seed {shared[0]} is both a design and a held-out seed")
    settings["base"] = base
    return settings


def _instance(base: RunConfig, zeta: float, seed: int) -> RunConfig:
    return base.with_updates({"task.zeta_value": zeta, "seed": seed})


def _excess(result, phi_star: float) -> float:
    return np.inf if result.diverged else float(result.table["loss_regularized"].iloc[-1]) - phi_star


def run_instances(settings: dict, progress: bool = False, workers: int = 1) -> list[dict]:
    """Every instance ``(ζ_V, seed)`` of the design and held-out seeds at every ``E`` and step scale:
    one record per (instance, E, c) with the warm-up sweep's ``R(T0)``, ``T0 = 0..T`` (``sweep`` keeps
    the runs of ``T0 = T`` and of the best ``T0``), FedAvg's path, the value solve after it, the chaos
    of FedAvg's path, the predictor's inputs and the online rule's realised run (:func:`online_runs`).
    The instances are shared among ``workers`` processes
    (:func:`~linattn_theory.sim.sweep.executors.in_processes`; an instance's records do not depend on
    the others, so the records are the same for any count)."""
    roles = [("design", s) for s in settings["design_seeds"]] + [("heldout", s) for s in settings["heldout_seeds"]]
    alone = progress and workers <= 1                  # one process: the runs' own progress bars
    entries = [(settings, zeta, role, seed, alone) for zeta in settings["zeta_value"] for role, seed in roles]
    parts = in_processes(_records_task, entries, workers, progress=progress, desc="phase diagram instances")
    return [record for part in parts for record in part]


def _records_task(chunk: list) -> list[list[dict]]:
    """Worker of :func:`run_instances`: the records of each instance ``(settings, ζ_V, role, seed, progress)`` of
    ``chunk``."""
    from ..sim.sensitivity import ensemble_sensitivities
    from ..sim.warmup_grid import warmup_sweeps_and_paths
    from ..theory.profile import centralized_optima

    settings, progress = chunk[0][0], chunk[0][-1]
    base = settings["base"]
    T = base.federated.rounds
    scales = sorted(set(settings["step_scales"]) | set(settings["fedavg_steps"]))
    found = [(zeta, role, seed, _instance(base, zeta, seed)) for _, zeta, role, seed, _ in chunk]
    found = [(*entry, clients_from_config(entry[-1])) for entry in found]
    steps = stable_steps([entry[3] for entry in found], [entry[4] for entry in found])
    instances = [(*entry, eta_stable, curvature) for entry, (eta_stable, curvature) in zip(found, steps)]
    points, configs, clients = [], [], []
    for k, (zeta, role, seed, config, inst_clients, eta_stable, curvature) in enumerate(instances):
        for E in settings["local_steps"]:
            for c in scales:
                points.append((k, E, c))
                configs.append(config.with_updates({"federated.local_steps": E, "federated.learning_rate": c * eta_stable,
                                                    "federated.strategy": "fedfrozen"}))
                clients.append(inst_clients)
    sweeps, paths = warmup_sweeps_and_paths(configs, None, clients, progress=progress)
    # chaos of each FedAvg path: the same run from θ⁰ ⊙ (1 + 1e-12 ξ) (sim.sensitivity)
    fedavg = [c.with_updates({"federated.warmup_rounds": T}) for c in configs]
    path_chaos = ensemble_sensitivities(fedavg, clients, [sweep[T] for sweep in sweeps], progress=progress)
    # Φ*_λ per instance, started from every final kernel its FedAvg paths reached (and the teacher)
    finals: dict = {}
    for (k, _, _), sweep in zip(points, sweeps):
        if not sweep[T].diverged:
            finals.setdefault(k, []).append(np.asarray(kernel(sweep[T].params)))
    problems = [dict(clients=inst[4], lam=inst[3].federated.ridge, rank=inst[3].model.rank, heads=inst[3].model.heads,
                     seed=inst[3].seed, initial_kernels=finals.get(k, [])) for k, inst in enumerate(instances)]
    optima = [o.objective for o in centralized_optima(problems)]
    online = online_runs(configs, clients, progress=progress)
    records = []
    for (k, E, c), config, sweep, path, chaos, (run, chaos_online) in zip(points, configs, sweeps, paths, path_chaos,
                                                                          online):
        zeta, role, seed, _, inst_clients, eta_stable, curvature = instances[k]
        phi_star = optima[k]
        eta = c * eta_stable
        fedavg_run = sweep[T]
        R = np.array([_excess(sweep[T0], phi_star) for T0 in range(T + 1)])
        F = fedavg_run.table["loss_regularized"].to_numpy()
        last = next((state for state in path[1] if state.round == T - 1), None)   # K_{T−1}: the solve's kernel
        solve = np.inf
        if last is not None:
            K_last = np.asarray(kernel(last.params), dtype=np.float64)
            if np.all(np.isfinite(K_last)):
                solve = float(profile_objective(K_last, inst_clients, config.federated.ridge)[0]) - phi_star
        kept = {T0: sweep[T0] for T0 in sorted({T, best_warmup(R)})}    # the runs instance_rows decomposes
        records.append({"zeta_value": zeta, "role": role, "seed": seed, "local_steps": E, "step_scale": c,
                        "learning_rate": eta, "config": config, "clients": inst_clients, "sweep": kept,
                        "R": R, "optimum": phi_star, "oracle": float(np.nanmin(F)) - phi_star,
                        "value_solve_final": solve, "chaotic": bool(chaos.chaotic),
                        "amplification": chaos.amplification, "online": _excess(run, phi_star),
                        "online_T0": int(run.metadata["kernel_round"]), "online_stop": int(run.metadata["stop_round"]),
                        "online_chaotic": bool(chaos_online.chaotic),
                        **predictor_inputs(config, eta, curvature, inst_clients, warmups=range(T + 1))})
    per = len(records) // len(chunk)                       # each instance's records, (E, c) in order
    return [records[k * per:(k + 1) * per] for k in range(len(chunk))]


def online_runs(configs, clients, progress: bool = False) -> list[tuple]:
    """The online rule's realised run of every config (docs/theory.md §8) and its chaos: per config
    ``(result, sensitivity)``, ``result`` the strategy ``fedfrozen_adaptive`` (its default rule, the
    config's ``adaptive_*`` settings) at the config's step, ``T0`` chosen by the rule during training
    (``result.metadata["kernel_round"]``; the kernel of that round is frozen from the round the rule
    decided in, ``"stop_round"``, on), ``sensitivity`` its :func:`~linattn_theory.sim.sensitivity.run_sensitivity`
    against the same run from ``θ⁰ ⊙ (1 + 10⁻¹² ξ)`` (a rounding-level move can flip the rule's
    decision: that run is chaotic). Both sets of runs as ensembles (:func:`~linattn_theory.sim.ensemble.simulate_many`)."""
    from ..sim.config import ONLINE_STRATEGY
    from ..sim.ensemble import simulate_many
    from ..sim.sensitivity import ensemble_sensitivities

    online = [c.with_updates({"federated.strategy": ONLINE_STRATEGY, "federated.warmup_rounds": c.federated.rounds})
              for c in configs]
    results = simulate_many(online, clients, progress=progress)
    return list(zip(results, ensemble_sensitivities(online, clients, results, progress=progress)))


def _cell(record) -> str:
    return f"{record['zeta_value']:g}|{record['local_steps']}"


def tuned_steps(records: list[dict], fedavg_steps) -> pd.DataFrame:
    """FedAvg's step per (ζ_V, E) chosen on the design seeds by :func:`~linattn_theory.report.tuning.choose_steps`
    (fewest diverged design seeds, then least median paired ratio ``R(c)/min_c' R(c')``) from its grid."""
    design = pd.DataFrame([{"seed": r["seed"], "cell": _cell(r), "arm": "fedavg", "step": r["step_scale"],
                            "excess_risk": r["R"][-1] if np.isfinite(r["R"][-1]) else np.nan,
                            "diverged": not np.isfinite(r["R"][-1])}
                           for r in records if r["role"] == "design" and r["step_scale"] in set(fedavg_steps)])
    return choose_steps(design, {"fedavg": list(fedavg_steps)})


def _decomposition(record, T0: int) -> dict:
    """bias, drift floor and unfinished part of ``R(T0)`` and the frozen map's contraction rate ``ρ(K_{T0})``
    (``theory.decomposition``; NaN when the run diverged)."""
    run = record["sweep"][T0]
    if run.diverged:
        return dict.fromkeys(("bias", "drift_floor", "unfinished", "contraction_rate"), np.nan)
    parts = decompose_excess_risk(run, record["clients"], optimum=record["optimum"])
    return {k: parts[k] for k in ("bias", "drift_floor", "unfinished", "contraction_rate")}


def instance_rows(records: list[dict], settings: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(rows, choices)``: the per-instance table (:data:`ROW_COLUMNS`, one row per (role, seed, ζ_V,
    E, c, arm); ``excess_risk`` NaN where the run diverged) and FedAvg's tuned step per (ζ_V, E)."""
    choices = tuned_steps(records, settings["fedavg_steps"])
    chosen = {r.cell: r.step for r in choices.itertuples()}
    by_key = {(r["role"], r["seed"], r["zeta_value"], r["local_steps"], r["step_scale"]): r for r in records}
    rows = []
    for r in records:
        if r["step_scale"] not in set(settings["step_scales"]):
            continue
        T = len(r["R"]) - 1
        tuned = by_key[(r["role"], r["seed"], r["zeta_value"], r["local_steps"], chosen[_cell(r)])]
        best = best_warmup(r["R"])
        common = {"role": r["role"], "seed": r["seed"], "zeta_value": r["zeta_value"], "local_steps": r["local_steps"],
                  "step_scale": r["step_scale"], "margin": r["margin"], "drift_share": r["drift_share"],
                  "predicted_pays": r["predicted_pays"], "predicted_T0": r["predicted_T0"]}
        nan_parts = dict.fromkeys(("bias", "drift_floor", "unfinished", "contraction_rate"), np.nan)
        arms = [("fedavg_tuned", tuned, T, tuned["R"][-1], nan_parts, tuned["chaotic"]),
                ("fedavg_tuned_oracle", tuned, T, tuned["oracle"], nan_parts, tuned["chaotic"]),
                ("fedavg", r, T, r["R"][-1], _decomposition(r, T) if r["role"] == "heldout" else nan_parts, r["chaotic"]),
                ("fedfrozen_best", r, best, r["R"][best],
                 _decomposition(r, best) if r["role"] == "heldout" else nan_parts, r["chaotic"]),
                ("fedfrozen_predicted", r, r["predicted_T0"], r["R"][r["predicted_T0"]], nan_parts, r["chaotic"]),
                ("value_solve_final", r, T - 1, r["value_solve_final"], nan_parts, r["chaotic"]),
                # the online rule's realised run: T0 its decided kernel round; chaotic if its own run or
                # its warm-up (FedAvg's path at c) is
                ("fedfrozen_online", r, r["online_T0"], r["online"], nan_parts, r["chaotic"] or r["online_chaotic"])]
        for arm, source, T0, risk, parts, chaotic in arms:
            finite = bool(np.isfinite(risk))
            rows.append({**common, "arm": arm, "step": source["step_scale"], "learning_rate": source["learning_rate"],
                         "T0": int(T0), "excess_risk": float(risk) if finite else np.nan, "diverged": not finite,
                         "chaotic": bool(chaotic), **parts})
    return pd.DataFrame(rows, columns=ROW_COLUMNS), choices


# -- statistics over instances ------------------------------------------------------------------

def bootstrap_median(values, *, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """``(median, low, high)``: the median of ``values`` (``−∞`` allowed: a diverged arm) and the
    percentile interval of ``level`` of the medians of ``resamples`` resamples with replacement
    (a fixed ``seed``; quantiles without interpolation, so that ``−∞`` stays ``−∞``); NaN when empty."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not values.size:
        return np.nan, np.nan, np.nan
    rng = np.random.default_rng(seed)
    draws = np.median(values[rng.integers(values.size, size=(resamples, values.size))], axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(draws, [tail, 1 - tail], method="inverted_cdf")
    return float(np.median(values)), float(low), float(high)


def gains(rows: pd.DataFrame, arm: str) -> pd.DataFrame:
    """Per (role, seed, ζ_V, E, c): ``gain = 1 − R_arm / R_tuned FedAvg`` (``−∞`` where the arm
    diverged, NaN where tuned FedAvg did) and ``flagged``: either run diverged or is chaotic."""
    keys = ["role", "seed", "zeta_value", "local_steps", "step_scale"]
    a = rows[rows["arm"] == arm].set_index(keys)
    t = rows[rows["arm"] == "fedavg_tuned"].set_index(keys)
    R_arm = a["excess_risk"].where(~a["diverged"], np.inf)
    with np.errstate(invalid="ignore"):
        gain = (1.0 - R_arm / t["excess_risk"]).where(~t["diverged"], np.nan)
    flagged = a["diverged"] | t["diverged"] | a["chaotic"] | t["chaotic"]
    return pd.DataFrame({"gain": gain, "flagged": flagged, "diverged": a["diverged"], "chaotic": a["chaotic"] | t["chaotic"],
                         "tuned_step": t["step"], "predicted_pays": a["predicted_pays"]}).reset_index()


def _summary(g: pd.DataFrame, threshold: float, resamples: int, seed: int) -> dict:
    valid = g[g["gain"].notna()]
    clean = valid[~valid["flagged"]]
    out = {"instances": len(valid), "tuned_diverged": int(g["gain"].isna().sum()),
           "diverged": int(valid["diverged"].sum()), "chaotic": int(valid["chaotic"].sum()),
           "flagged": int(valid["flagged"].sum())}
    for suffix, part in (("", valid), ("_clean", clean)):
        median, low, high = bootstrap_median(part["gain"], resamples=resamples, seed=seed)
        out.update({f"gain_median{suffix}": median, f"gain_low{suffix}": low, f"gain_high{suffix}": high,
                    f"wins{suffix}": int((part["gain"] > threshold).sum()), f"n{suffix}": len(part)})
    return out


def tuned_arm_steps(rows: pd.DataFrame, arm: str) -> dict:
    """The arm's own step per (ζ_V, E), chosen on the design seeds like FedAvg's (``choose_steps`` over
    the cell steps of the table): the diagram's "tuned" column compares tuned with tuned."""
    design = rows[(rows["role"] == "design") & (rows["arm"] == arm)].assign(
        cell=lambda d: d["zeta_value"].map("{:g}".format) + "|" + d["local_steps"].astype(str),
        step=lambda d: d["step_scale"])
    steps = sorted(design["step_scale"].unique())
    choices = choose_steps(design, {arm: steps})
    return {cell: step for cell, step in zip(choices["cell"], choices["step"])}


def cell_summary(rows: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """Per (arm, ζ_V, E, column) over the held-out instances: the gain over tuned FedAvg (median, bootstrap
    95 % interval, wins above the threshold), with and without the flagged (diverged or chaotic)
    instances (``*_clean``). ``column`` is a step scale ``c`` (the arm at that step: FedFrozen at its
    best T0, the value solve after FedAvg, plain FedAvg, the online rule's realised run) or ``"tuned"``
    (FedFrozen's, the value solve's and the online rule's own step chosen on the design seeds,
    ``step_scale`` then that step; FedAvg's oracle best iterate at FedAvg's tuned step)."""
    threshold, resamples, seed = settings["threshold"], settings["bootstrap_resamples"], settings["bootstrap_seed"]
    columns = {"fedfrozen_best": (True, True), "value_solve_final": (True, True), "fedavg": (True, False),
               "fedavg_tuned_oracle": (False, True), "fedfrozen_online": (True, True)}
    out = []
    present = set(rows["arm"])
    for arm, (per_step, tuned_column) in columns.items():
        if arm not in present:        # a table without that arm (e.g. written before the online rule's)
            continue
        g = gains(rows, arm)
        held = g[g["role"] == "heldout"]
        tuned = tuned_arm_steps(rows, arm) if arm != "fedavg_tuned_oracle" else {}
        for (zeta, E), group in held.groupby(["zeta_value", "local_steps"], sort=True):
            fedavg_step = float(group["tuned_step"].iloc[0])
            for c, part in group.groupby("step_scale", sort=True) if per_step else ():
                out.append({"arm": arm, "zeta_value": zeta, "local_steps": E, "column": f"{c:g}", "step_scale": c,
                            "tuned_fedavg_step": fedavg_step, **_summary(part, threshold, resamples, seed)})
            if tuned_column:
                c = tuned.get(f"{zeta:g}|{E}", fedavg_step)
                out.append({"arm": arm, "zeta_value": zeta, "local_steps": E, "column": "tuned", "step_scale": c,
                            "tuned_fedavg_step": fedavg_step,
                            **_summary(group[group["step_scale"] == c], threshold, resamples, seed)})
    return pd.DataFrame(out)


def auc(score, label) -> float:
    """The area under the ROC curve of ``score`` for the boolean ``label``: the probability that a
    positive scores above a negative, ties counting one half (Mann–Whitney); NaN without both classes."""
    score, label = np.asarray(score, dtype=float), np.asarray(label, dtype=bool)
    pos, neg = score[label], score[~label]
    if not pos.size or not neg.size:
        return np.nan
    above = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(above / (pos.size * neg.size))


def predictor_score(rows: pd.DataFrame, threshold: float, role: str = "heldout") -> pd.DataFrame:
    """The pre-registered predictor's score on the ``role`` instances (every (instance, cell) whose tuned
    FedAvg did not diverge), all of them and the unflagged ones: (a) accuracy, balanced accuracy and
    the confusion counts of ``predicted_pays`` against ``gain > threshold`` of FedFrozen at its best T0,
    and the AUC of the two declared scores ``2 − m`` (``= 2c``) and ``D₂(K⁰)/Φ_λ(K⁰)``; (b) the regret
    ``R(T0_pred)/R(T0_best) − 1`` of the predicted warm-up (median, mean), beside that of ``T0 = T``
    (plain FedAvg at the cell's step)."""
    g = gains(rows, "fedfrozen_best")
    keys = ["role", "seed", "zeta_value", "local_steps", "step_scale"]
    risk = {arm: rows[rows["arm"] == arm].set_index(keys)["excess_risk"] for arm in
            ("fedfrozen_best", "fedfrozen_predicted", "fedavg")}
    inputs = rows[rows["arm"] == "fedfrozen_best"].set_index(keys)[["margin", "drift_share"]]
    g = g.join(inputs, on=keys)
    g = g[(g["role"] == role) & g["gain"].notna()]
    out = []
    for subset, part in (("all", g), ("clean", g[~g["flagged"]])):
        label = (part["gain"] > threshold).to_numpy()
        pred = part["predicted_pays"].to_numpy(dtype=bool)
        tp, fp = int((pred & label).sum()), int((pred & ~label).sum())
        fn, tn = int((~pred & label).sum()), int((~pred & ~label).sum())
        recall = tp / (tp + fn) if tp + fn else np.nan
        specificity = tn / (tn + fp) if tn + fp else np.nan
        idx = pd.MultiIndex.from_frame(part[keys])
        best = risk["fedfrozen_best"].reindex(idx).to_numpy()
        regret = {name: risk[arm].reindex(idx).fillna(np.inf).to_numpy() / best - 1.0
                  for name, arm in (("predicted", "fedfrozen_predicted"), ("fedavg", "fedavg"))}
        out.append({"subset": subset, "instances": len(part), "positives": int(label.sum()),
                    "predicted_positives": int(pred.sum()), "true_positives": tp, "false_positives": fp,
                    "false_negatives": fn, "true_negatives": tn, "accuracy": float((pred == label).mean()),
                    "balanced_accuracy": float(np.nanmean([recall, specificity])),
                    "auc_step": auc(2.0 - part["margin"], label), "auc_drift_share": auc(part["drift_share"], label),
                    "regret_median": float(np.median(regret["predicted"])),
                    "regret_mean": float(np.mean(regret["predicted"])),
                    "regret_median_fedavg": float(np.median(regret["fedavg"])),
                    "regret_mean_fedavg": float(np.mean(regret["fedavg"]))})
    return pd.DataFrame(out)


def attribution(rows: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per win (held-out, unflagged, FedFrozen at its best T0 more than ``threshold`` below tuned FedAvg):
    ``gap = R_tuned − R(T0*)`` split exactly (docs/theory.md §6) as ``step = R_tuned − R(T)`` (FedAvg at
    its tuned step against FedAvg at the cell's step: what tuning already buys, ``< 0`` when it helps)
    plus ``R(T) − R(T0*) = late_rise + value``: ``late_rise`` the rise of the kernel-profile bias from
    ``K_{T0*}`` to FedAvg's ``K_T`` (its kernel getting worse late), ``value`` that of the value block's
    excess ``D + unfinished``, split into ``drift_floor`` and ``unfinished`` where both frozen maps
    contract (``ρ < 1``; NaN otherwise: ``V_FA`` is then no limit). Where FedAvg at the cell's step
    diverged (``fedavg_diverged``: freezing kept the run finite) only ``gap`` is defined."""
    keys = ["role", "seed", "zeta_value", "local_steps", "step_scale"]
    g = gains(rows, "fedfrozen_best")
    wins = g[(g["role"] == "heldout") & ~g["flagged"] & (g["gain"] > threshold)].set_index(keys)
    by = {arm: rows[rows["arm"] == arm].set_index(keys).reindex(wins.index)
          for arm in ("fedavg_tuned", "fedavg", "fedfrozen_best")}
    fa, ff = by["fedavg"], by["fedfrozen_best"]
    contracting = (fa["contraction_rate"] < 1) & (ff["contraction_rate"] < 1)
    drift = (fa["drift_floor"] - ff["drift_floor"]).where(contracting)
    out = pd.DataFrame({"gain": wins["gain"], "T0_best": ff["T0"], "fedavg_diverged": fa["diverged"],
                        "gap": by["fedavg_tuned"]["excess_risk"] - ff["excess_risk"],
                        "step": by["fedavg_tuned"]["excess_risk"] - fa["excess_risk"],
                        "late_rise": fa["bias"] - ff["bias"],
                        "value": (fa["drift_floor"] + fa["unfinished"]) - (ff["drift_floor"] + ff["unfinished"]),
                        "drift_floor": drift, "unfinished": (fa["unfinished"] - ff["unfinished"]).where(contracting),
                        "contraction_fedavg": fa["contraction_rate"], "contraction_frozen": ff["contraction_rate"]})
    return out.reset_index()
