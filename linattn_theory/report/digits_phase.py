"""Digits, searched: where (if anywhere) freezing pays on real data against tuned FedAvg
(docs/theory.md §6 "Digits, searched"; simulations/digits_phase.py; issue 30, item 7).

An instance is ``(attention, α, seed)`` of the digits family (scikit-learn's handwritten digits over
clients with Dirichlet(α) label skew, :mod:`linattn_theory.data.digits`); its step scale ``c`` sets
``η = c · 2 / λ_max(θ⁰)``, the full model's curvature at ``θ⁰`` computed once per instance
(:func:`~linattn_theory.report.phase_diagram.stable_step`). Every run sweeps the declared warm-ups
``T0`` (``T0 = T``: FedAvg). No ``Φ*_λ`` is known here, so a run is scored by its final training
objective ``F_λ(θ_T)`` and, beside it, its held-out test accuracy. Every run is also swept again from
``θ⁰ ⊙ (1 + 10⁻¹² ξ)`` and flagged ``chaotic`` when its end moves by more than
:data:`~linattn_theory.sim.sensitivity.CHAOS_AMPLIFICATION` times that (:func:`sweep_chaos`,
docs/theory.md §6 "Chaotic instances"); the cells give their statistics with and without the
instances whose compared runs are chaotic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..data.digits import evaluate
from ..sim.engine import clients_from_config
from ..sim.sweep.executors import in_processes
from .phase_diagram import bootstrap_median, load_settings, stable_steps
from .tuning import choose_steps

__all__ = ["load_digits_settings", "run_digits", "sweep_chaos", "tuned_choices", "digits_cells", "linear_optima",
           "chaos_statistics"]

#: the keys of ``digits_phase.toml`` besides ``base`` and ``quick``
SETTINGS = ("step_scales", "fedavg_steps", "label_alpha", "local_steps", "attention", "warmups", "design_seeds",
            "heldout_seeds", "threshold", "bootstrap_resamples", "bootstrap_seed")
#: the per-run table's columns (figures/digits_phase.csv)
ROW_COLUMNS = ["role", "seed", "attention", "label_alpha", "local_steps", "step_scale", "learning_rate", "T0",
               "final_loss", "test_accuracy", "diverged", "chaotic"]
KEYS = ["attention", "label_alpha", "local_steps"]


def load_digits_settings(path, quick: bool = False) -> dict:
    """The declared settings of ``path`` (``digits_phase.toml``, ``[quick]`` applied) with ``base``
    (:func:`~linattn_theory.report.phase_diagram.load_settings` with :data:`SETTINGS`).

    Parameters
    ----------
    path : str or path-like
        ``digits_phase.toml``.
    quick : bool, default False
        Apply its ``[quick]`` table.

    Returns
    -------
    dict
        The keys of :data:`SETTINGS` and ``base`` (a RunConfig).

    Examples
    --------
    >>> from linattn_theory.report.digits_phase import load_digits_settings
    >>> from linattn_theory.report.figures import find_root
    >>> settings = load_digits_settings(find_root() / "simulations" / "configs" / "digits_phase.toml", quick=True)
    >>> settings["base"].task.family, settings["base"].federated.rounds in settings["warmups"]   # T0 = T: FedAvg
    ('digits', True)
    """
    from ..core.errors import ConfigError

    settings = load_settings(path, quick=quick, keys=SETTINGS)
    T = settings["base"].federated.rounds
    if T not in settings["warmups"]:
        raise ConfigError(f"warmups {settings['warmups']}: must hold T = {T} (FedAvg)")
    return settings


def sweep_chaos(configs: list, clients: list, sweeps: list, warmups) -> list[dict]:
    """Per config, ``{T0: chaotic}``: its warm-up sweep ``sweeps[i]`` (``T0 → RunResult``) run again from
    ``θ⁰ ⊙ (1 + s ξ_0)`` (``s = 10⁻¹²``, the start and stream of
    :func:`~linattn_theory.sim.sensitivity.ensemble_sensitivities`) and each ``T0``'s end compared with the
    unperturbed one by :func:`~linattn_theory.sim.sensitivity.run_sensitivity`: chaotic when
    ``max(‖θ^T' − θ^T‖ / (s ‖θ^T‖), |F_λ' − F_λ| / (s |F_λ|)) > CHAOS_AMPLIFICATION`` or when exactly one of
    the two diverged (docs/theory.md §6 "Chaotic instances").

    Parameters
    ----------
    configs : list of RunConfig
        The instances (any ``warmup_rounds``: the sweep sets it).
    clients : list of FederatedDataset
        Their clients.
    sweeps : list of dict of int to RunResult
        The unperturbed sweeps (:func:`~linattn_theory.sim.warmup_grid.warmup_sweeps_and_paths`).
    warmups : iterable of int
        The swept ``T0``.

    Returns
    -------
    list of dict of int to bool
        Per config, whether its run at each ``T0`` is chaotic.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.engine import clients_from_config
    >>> from linattn_theory.sim.warmup_grid import warmup_sweeps_and_paths
    >>> from linattn_theory.report.digits_phase import sweep_chaos
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = [clients_from_config(config)]
    >>> sweeps = warmup_sweeps_and_paths([config], [0, 2, 4], clients)[0]
    >>> sweep_chaos([config], clients, sweeps, [0, 2, 4])           # a small step: calm
    [{0: False, 2: False, 4: False}]
    """
    from ..sim.ensemble import prepare_run
    from ..sim.sensitivity import PERTURBATION, perturbed_params, run_sensitivity
    from ..sim.warmup_grid import warmup_sweeps_and_paths

    warmups = list(warmups)
    starts = [perturbed_params(prepare_run(c, cl)[1], PERTURBATION, c.seed) for c, cl in zip(configs, clients)]
    repeats = warmup_sweeps_and_paths(configs, warmups, clients, params=starts)[0]
    return [{T0: bool(run_sensitivity(c, cl, reference=sweep[T0], runs=[repeat[T0]]).chaotic) for T0 in warmups}
            for c, cl, sweep, repeat in zip(configs, clients, sweeps, repeats)]


def run_digits(settings: dict, progress: bool = False, workers: int = 1) -> pd.DataFrame:
    """Every instance at every ``E``, step scale and warm-up: one row (:data:`ROW_COLUMNS`) per run, its
    final ``F_λ`` and test accuracy (NaN when it diverged) and whether it is chaotic (:func:`sweep_chaos`).
    The instances — their stable steps, runs, chaos flags and test scores — are shared among ``workers``
    processes (:func:`in_processes`; the same rows whatever their number).

    Parameters
    ----------
    settings : dict
        :func:`load_digits_settings`' result.
    progress : bool, default False
        Show a progress bar.
    workers : int, default 1
        Processes.

    Returns
    -------
    pandas.DataFrame
        One row per run (:data:`ROW_COLUMNS`).
    """
    roles = [("design", s) for s in settings["design_seeds"]] + [("heldout", s) for s in settings["heldout_seeds"]]
    alone = progress and workers <= 1                  # one process: the runs' own progress bar
    items = [(settings, role, seed, attention, alpha, alone) for attention in settings["attention"]
             for alpha in settings["label_alpha"] for role, seed in roles]
    parts = in_processes(_instances_task, items, workers, progress, "digits instances")
    return pd.DataFrame([row for part in parts for row in part], columns=ROW_COLUMNS)


def _instances_task(chunk: list) -> list[list[tuple]]:
    """Worker of :func:`run_digits`: the rows of each instance ``(settings, role, seed, attention, α,
    progress)`` of ``chunk``, one instance after another (:func:`_instance_rows`; a worker's memory then
    holds one instance's runs at a time)."""
    return [_instance_rows(*item) for item in chunk]


def _instance_rows(settings: dict, role: str, seed: int, attention: str, alpha: float, progress: bool) -> list[tuple]:
    """One instance's rows (:data:`ROW_COLUMNS`): its stable step
    (:func:`~linattn_theory.report.phase_diagram.stable_steps`), its runs at every ``E``, step scale and
    warm-up (one ensemble), their chaos flags (:func:`sweep_chaos`) and test accuracies."""
    from ..sim.warmup_grid import warmup_sweeps_and_paths

    config = settings["base"].with_updates({"model.attention": attention, "task.label_alpha": alpha, "seed": seed})
    inst_clients = clients_from_config(config)
    [(eta_stable, _)] = stable_steps([config], [inst_clients])
    scales = sorted(set(settings["step_scales"]) | set(settings["fedavg_steps"]))
    points, configs = [], []
    for E in settings["local_steps"]:
        for c in scales:
            points.append((role, seed, attention, alpha, E, c, c * eta_stable))
            configs.append(config.with_updates({"federated.local_steps": E, "federated.learning_rate": c * eta_stable}))
    clients = [inst_clients] * len(configs)
    warmups = settings["warmups"]
    sweeps = warmup_sweeps_and_paths(configs, warmups, clients, progress=progress)[0]
    chaos = sweep_chaos(configs, clients, sweeps, warmups)
    truth = inst_clients.truth
    rows = []
    for point, run_config, sweep, chaotic in zip(points, configs, sweeps, chaos):
        for T0 in warmups:
            run = sweep[T0]
            scores = ({"accuracy": np.nan} if run.diverged else
                      evaluate(run.params, truth["test_X"], truth["test_q"], truth["test_y"],
                               run_config.model.attention, run_config.model.temperature))
            loss = np.nan if run.diverged else float(run.table["loss_regularized"].iloc[-1])
            rows.append((*point, T0, loss, float(scores["accuracy"]), bool(run.diverged), chaotic[T0]))
    return rows


#: Φ*_λ of a held-out linear instance: L-BFGS from the kernels of its runs of least F_λ and random starts
OPTIMUM_STARTS, OPTIMUM_RESTARTS = 3, 2


def _optima_task(chunk: list) -> list:
    """Worker: ``Φ*_λ`` of each ``(config, runs)`` of ``chunk`` (:func:`linear_optima`)."""
    from ..core.model import kernel
    from ..sim.ensemble import simulate_many
    from ..theory.profile import centralized_optima

    problems = []
    for config, runs in chunk:
        clients = clients_from_config(config)
        kernels = [np.asarray(kernel(run.params)) for run in simulate_many(runs, [clients] * len(runs))]
        problems.append(dict(clients=clients, lam=config.federated.ridge, rank=config.model.rank,
                             heads=config.model.heads, restarts=OPTIMUM_RESTARTS, seed=int(config.seed),
                             initial_kernels=kernels))
    return [o.objective for o in centralized_optima(problems)]


def linear_optima(rows: pd.DataFrame, settings: dict, workers: int = 1) -> pd.DataFrame:
    """``Φ*_λ`` of every held-out linear-attention instance (docs/theory.md §4): the centralised optimum
    (:func:`~linattn_theory.theory.profile.centralized_optima`) started from the final kernels of its
    :data:`OPTIMUM_STARTS` runs of least ``F_λ`` (run again from ``rows``: their ``E``, ``η`` and ``T0``)
    and :data:`OPTIMUM_RESTARTS` random kernels, so that ``Φ*_λ ≤ Φ_λ(K) ≤ F_λ`` of each of them and
    ``R = F_λ − Φ*_λ ≥ 0`` for every run of the instance. One row per instance: attention, α, seed, optimum.

    Parameters
    ----------
    rows : pandas.DataFrame
        The runs (:func:`run_digits`).
    settings : dict
        :func:`load_digits_settings`' result.
    workers : int, default 1
        Processes (:func:`in_processes`: each optimum equals the one computed alone, bit for bit).

    Returns
    -------
    pandas.DataFrame
        ``attention``, ``label_alpha``, ``seed``, ``optimum``.
    """
    base = settings["base"]
    held = rows[(rows["role"] == "heldout") & (rows["attention"] == "linear") & ~rows["diverged"]]
    keys, work = [], []
    for (alpha, seed), group in held.groupby(["label_alpha", "seed"], sort=True):
        config = base.with_updates({"model.attention": "linear", "task.label_alpha": alpha, "seed": int(seed)})
        best = group.nsmallest(OPTIMUM_STARTS, "final_loss")
        runs = [config.with_updates({"federated.local_steps": int(r.local_steps), "federated.learning_rate": r.learning_rate,
                                     "federated.warmup_rounds": int(r.T0)}) for r in best.itertuples()]
        keys.append(("linear", alpha, seed))
        work.append((config, runs))
    optima = in_processes(_optima_task, work, workers)
    return pd.DataFrame([(*k, o) for k, o in zip(keys, optima)], columns=["attention", "label_alpha", "seed", "optimum"])


def _cell(frame: pd.DataFrame) -> pd.Series:
    return frame["attention"] + "|" + frame["label_alpha"].map("{:g}".format) + "|" + frame["local_steps"].astype(str)


def tuned_choices(rows: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """Per (attention, α, E), chosen on the design seeds by :func:`~linattn_theory.report.tuning.choose_steps`
    on ``F_λ``: FedAvg's step scale (``T0 = T``, from ``fedavg_steps``) and FedFrozen's ``(c, T0)`` (from
    ``step_scales`` × ``warmups``; no oracle).

    Parameters
    ----------
    rows : pandas.DataFrame
        The runs (:func:`run_digits`).
    settings : dict
        :func:`load_digits_settings`' result.

    Returns
    -------
    pandas.DataFrame
        The choices of :func:`~linattn_theory.report.tuning.choose_steps` per arm, with the columns of
        :data:`KEYS` and the chosen ``T0`` (``T`` for FedAvg) in place of ``cell`` and ``setting``.
    """
    T = settings["base"].federated.rounds
    design = rows[rows["role"] == "design"].assign(cell=_cell, excess_risk=lambda d: d["final_loss"])
    fedavg = design[(design["T0"] == T) & design["step_scale"].isin(settings["fedavg_steps"])].assign(
        arm="fedavg", step=lambda d: d["step_scale"])
    frozen = design[design["step_scale"].isin(settings["step_scales"])].assign(
        arm="fedfrozen", step=lambda d: d["step_scale"],
        setting=lambda d: "step_scale=" + d["step_scale"].map("{:g}".format) + ", warmup_rounds=" + d["T0"].astype(str))
    grid = {"federated.step_scale": settings["step_scales"], "federated.warmup_rounds": settings["warmups"]}
    choices = pd.concat([choose_steps(fedavg, {"fedavg": settings["fedavg_steps"]}),
                         choose_steps(frozen, {"fedfrozen": grid})], ignore_index=True)
    parts = choices["cell"].str.split("|", expand=True)
    choices = choices.assign(attention=parts[0], label_alpha=parts[1].astype(float), local_steps=parts[2].astype(int))
    T0 = choices["setting"].str.extract(r"warmup_rounds=(\d+)")[0]
    return choices.assign(T0=T0.fillna(T).astype(int)).drop(columns=["cell", "setting"])


def chaos_statistics(gain: pd.Series, accuracy: pd.Series, chaotic: pd.Series, settings: dict) -> dict:
    """A cell's statistics with its chaotic instances counted and left out (docs/theory.md §6 "Chaotic
    instances"): ``chaotic_instances``, the instances of a gain (``gain`` not NaN) that are ``chaotic``
    (the held-out arm's run or tuned FedAvg's is chaotic), and over the others alone
    ``instances_without_chaotic``, the median gain ``1 − F_arm / F_tuned`` with its bootstrap 95 %
    interval (``gain_median_without_chaotic``, ``gain_low_…``, ``gain_high_…``;
    :func:`~linattn_theory.report.phase_diagram.bootstrap_median` with the settings' resamples and seed),
    ``wins_without_chaotic`` (gain above the threshold) and ``accuracy_change_median_without_chaotic``.

    Parameters
    ----------
    gain, accuracy : pandas.Series
        Per instance: the gain (NaN where tuned FedAvg diverged) and the accuracy change in points.
    chaotic : pandas.Series of bool
        Per instance, on the same index: is one of the two compared runs chaotic?
    settings : dict
        ``threshold``, ``bootstrap_resamples`` and ``bootstrap_seed``.

    Returns
    -------
    dict
        The columns above.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.digits_phase import chaos_statistics
    >>> gain, accuracy = pd.Series([0.0, 0.01, 0.3, 0.5]), pd.Series([1.0, 0.0, 2.0, -4.0])
    >>> found = chaos_statistics(gain, accuracy, pd.Series([False, False, False, True]),
    ...                          {"threshold": 0.02, "bootstrap_resamples": 200, "bootstrap_seed": 0})
    >>> found["chaotic_instances"], found["instances_without_chaotic"], found["wins_without_chaotic"]
    (1, 3, 1)
    >>> found["gain_median_without_chaotic"], found["accuracy_change_median_without_chaotic"]
    (0.01, 1.0)
    """
    from .phase_diagram import bootstrap_median

    chaotic = chaotic.astype(bool)
    calm = gain[~chaotic]
    median, low, high = bootstrap_median(calm, resamples=settings["bootstrap_resamples"], seed=settings["bootstrap_seed"])
    accuracy = accuracy[~chaotic]
    return {"chaotic_instances": int((chaotic & gain.notna()).sum()), "instances_without_chaotic": int(calm.notna().sum()),
            "gain_median_without_chaotic": median, "gain_low_without_chaotic": low, "gain_high_without_chaotic": high,
            "wins_without_chaotic": int((calm > settings["threshold"]).sum()),
            "accuracy_change_median_without_chaotic":
                float(np.nanmedian(accuracy)) if accuracy.notna().any() else np.nan}


def digits_cells(rows: pd.DataFrame, choices: pd.DataFrame, settings: dict, optima: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (attention, α, E, column) over the held-out instances, against tuned FedAvg of the same
    instance: the gain ``1 − F_arm / F_tuned`` (median, bootstrap 95 % interval, wins above the
    threshold; a diverged arm ``−∞``) and the accuracy difference ``acc_arm − acc_tuned`` (median,
    percentage points). Columns: a step scale ``c`` (FedFrozen at its best ``T0`` on the held-out run's
    own ``F_λ``, an oracle over the warm-ups, ``T0 = T`` included) and ``"tuned"`` (FedFrozen at its
    ``(c, T0)`` chosen on the design seeds). Where ``optima`` (:func:`linear_optima`) holds the instance's
    ``Φ*_λ``, the same gain in excess risk ``R = F_λ − Φ*_λ`` (``excess_gain_*``, ``excess_wins``; NaN elsewhere).
    An instance is chaotic in a column when its compared FedFrozen run or its tuned FedAvg run is
    (``chaotic`` of the runs); :func:`chaos_statistics` counts them and gives the statistics without them.
    ``design_chaotic_runs``: the cell's design runs (every ``c`` and ``T0``, on which both arms' steps
    were chosen) that are chaotic; where it is not zero the tuned choices themselves may move.

    Parameters
    ----------
    rows : pandas.DataFrame
        The runs (:func:`run_digits`).
    choices : pandas.DataFrame
        :func:`tuned_choices`' result.
    settings : dict
        :func:`load_digits_settings`' result.
    optima : pandas.DataFrame, optional
        :func:`linear_optima`' result.

    Returns
    -------
    pandas.DataFrame
        One row per (attention, α, E, column).
    """
    T = settings["base"].federated.rounds
    held = rows[rows["role"] == "heldout"]
    if optima is not None:
        held = held.merge(optima, on=["attention", "label_alpha", "seed"], how="left")
    else:
        held = held.assign(optimum=np.nan)
    pick = choices.set_index(["arm", *KEYS])
    out = []
    design = rows[rows["role"] == "design"].groupby(KEYS)["chaotic"].sum()
    for (attention, alpha, E), group in held.groupby(KEYS, sort=True):
        ref = pick.loc[("fedavg", attention, alpha, E)]
        tuned = group[(group["step_scale"] == ref["step"]) & (group["T0"] == T)].set_index("seed")
        F_ref = tuned["final_loss"].where(~tuned["diverged"])
        R_ref = F_ref - tuned["optimum"]
        own = pick.loc[("fedfrozen", attention, alpha, E)]
        columns = [(f"{c:g}", c, None) for c in settings["step_scales"]] + [("tuned", own["step"], int(own["T0"]))]
        for column, c, T0 in columns:
            runs = group[group["step_scale"] == c]
            F = runs.assign(F=runs["final_loss"].where(~runs["diverged"], np.inf))
            if T0 is None:       # the oracle over T0: the least F of the held-out run's own warm-ups
                best = F.loc[F.sort_values(["F", "T0"]).groupby("seed", sort=False).head(1).index]
            else:
                best = F[F["T0"] == T0]
            best = best.set_index("seed").reindex(F_ref.index)
            with np.errstate(invalid="ignore"):
                gain = 1.0 - best["F"] / F_ref
                excess = (1.0 - (best["F"] - best["optimum"]) / R_ref)
            accuracy = 100 * (best["test_accuracy"] - tuned["test_accuracy"])
            chaotic = best["chaotic"].eq(True) | tuned["chaotic"].eq(True)
            median, low, high = bootstrap_median(gain, resamples=settings["bootstrap_resamples"],
                                                 seed=settings["bootstrap_seed"])
            R_median, R_low, R_high = bootstrap_median(excess, resamples=settings["bootstrap_resamples"],
                                                       seed=settings["bootstrap_seed"])
            out.append({"attention": attention, "label_alpha": alpha, "local_steps": E, "column": column,
                        "step_scale": c, "T0": T0 if T0 is not None else np.nan, "tuned_fedavg_step": ref["step"],
                        "median_best_T0": float(best["T0"].median()), "instances": int(gain.notna().sum()),
                        "diverged": int(np.isinf(best["F"]).sum()), "tuned_diverged": int(F_ref.isna().sum()),
                        "gain_median": median, "gain_low": low, "gain_high": high,
                        "wins": int((gain > settings["threshold"]).sum()),
                        "accuracy_change_median": float(np.nanmedian(accuracy)) if accuracy.notna().any() else np.nan,
                        "accuracy_wins": int((accuracy > 0).sum()), "excess_gain_median": R_median,
                        "excess_gain_low": R_low, "excess_gain_high": R_high,
                        "excess_wins": int((excess > settings["threshold"]).sum()),
                        **chaos_statistics(gain, accuracy, chaotic, settings),
                        "design_chaotic_runs": int(design.get((attention, alpha, E), 0))})
    return pd.DataFrame(out)
