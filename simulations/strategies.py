"""Federated strategies compared at three heterogeneity levels (docs/theory.md §3 and §5).

Runs every strategy of ``simulations/configs/strategies.toml`` (FedAvg, FedFrozen, the random
kernel, value-frozen, FedProx, SCAFFOLD, FedAvgM, FedAdam, FedFrozen+FedProx, FedFrozen+SCAFFOLD,
the online rule, and the server's exact value solve in round ``T0`` or in the last round, whose
solve round costs ``(Hd)² + Hdp`` numbers per client, docs/theory.md §5)
and the static-attention arms of docs/theory.md §7 (``STATIC_ARMS``: uniform and decay patterns
fixed in advance, calibrated mean-score patterns after the warm-up, and SAF-style selection of
the most static head) on the planted-kernel family at three heterogeneity levels over several seeds, and writes

- ``figures/strategies.csv``: one row per (level, strategy): mean and standard deviation over
  seeds of the final excess risk, the cumulative kernel drift ``Γ(T)``, the final value drift
  and the rounds to reach the target loss (``strategies_runs.csv``: one row per run);
- ``figures/strategies.md``: the same as a Markdown table (mean ± standard deviation);
- ``figures/strategies.png`` / ``.pdf``: one column per family of methods (the federated
  baselines, FedFrozen and its combinations, fixed or frozen blocks; linattn_theory.report.plotting's
  METHOD_PANELS, so that no two methods of a column share a colour, FedAvg and FedFrozen drawn in
  every column as references), and per method and level the final excess risk, the value drift in
  the last round and the cumulative kernel drift ``Γ(T)`` (median over seeds, bars over the
  interquartile range), and the excess risk against round at the highest level (median), in the
  shared figure style; an instance (level, seed) in which any run diverged is left out for every
  strategy (a paired comparison) and named on the figure;
- ``figures/strategies_plot.csv``: the plotted numbers (median, quartiles and count over seeds, runs
  that diverged), like every figure's ``NAME.csv`` (``strategies.csv`` is the summary).

Definitions. For each (level, seed) the reference loss ``F_ref`` is the lower of (a) a
centralised reference: ``centralised_steps`` (400) steps of centralised gradient descent on ``F_λ`` (FedAvg with
``E = 1``, full batch and participation, which is exactly centralised GD) started at the planted
teacher kernel with its optimal value block ``V*_λ(K*)`` (docs/theory.md §4), and (b) the best
``F_λ(θ^t)`` any run of that level and seed reached; the final excess risk is
``F_λ(θ^T) − F_ref ≥ 0`` (diverged runs are counted, not averaged). Kernel drift is ``Γ(T) = Σ_t Σ_c p_c ‖K_c^{t,E} − K^{t+1}‖²``;
value drift is ``Σ_c p_c ‖W_{V,c} − W̄_V‖²`` in the last round. The target loss is
``F_ref + f (F_λ(θ^0) − F_ref)`` with ``f = target_fraction``; a run that never reaches it
counts as not reached (the table gives how many seeds reached it).

Claim shown (docs/theory.md §5, §7): in the frozen stage SCAFFOLD removes the value drift that
FedAvg, FedProx and the server optimisers keep (the value-drift panel); freezing the kernel stops
the kernel drift (the Γ panel); static attention patterns cost more than a learned, frozen kernel.

Run: ``python simulations/strategies.py [--quick] [--out figures] [--executor serial|processes] [--workers N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import config_from_dict  # noqa: E402
from linattn_theory.core.model import Params  # noqa: E402
from linattn_theory.sim.engine import clients_from_config, simulate  # noqa: E402
from linattn_theory.sim.ensemble import simulate_many  # noqa: E402
from linattn_theory.report import plotting  # noqa: E402
from linattn_theory.report.figures import analysis_workers  # noqa: E402
from linattn_theory.core.io import atomic_write_text  # noqa: E402
from linattn_theory.theory.static_heads import static_head_features, static_profile_objective  # noqa: E402
from linattn_theory.sim.strategies import STRATEGIES  # noqa: E402

CONFIG = Path(__file__).with_name("configs") / "strategies.toml"
CENTRALISED_STEPS = 400
NAME, PLOT_DATA = "strategies", "strategies_plot"
TOP_LEVEL = {"seeds", "strategies", "static", "target_fraction", "centralised_steps", "base", "levels",
             "overrides", "quick"}
#: static-attention arms (docs/theory.md §7), run in the same federation as the strategies:
#: name -> (pattern, heads made static (None: all; k: the k with the largest share ω_h at K_{T0}),
#: whether a FedAvg warm-up of T0 rounds comes first (False: fixed in advance, T0 = 0))
STATIC_ARMS = {"static_uniform": ("uniform", None, False), "static_decay": ("decay", None, False),
               "static_calibrated": ("mean", None, True), "static_saf": ("mean", 1, True)}


def load_settings(path=CONFIG, quick: bool = False) -> dict:
    """Read the sweep settings and validate every run's configuration before anything runs."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    raw = tomllib.loads(path.read_text())
    unknown = sorted(set(raw) - TOP_LEVEL)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key; allowed keys are {', '.join(sorted(TOP_LEVEL))}")
    seeds = raw.get("seeds", [0])
    steps = raw.get("centralised_steps", CENTRALISED_STEPS)
    updates = {}
    if quick:
        quick_settings = raw.get("quick", {})
        unknown = sorted(set(quick_settings) - {"seeds", "centralised_steps", "updates"})
        if unknown:
            raise ConfigError(f"quick.{unknown[0]}: unknown key; allowed keys are centralised_steps, "
                              "seeds, updates")
        seeds = quick_settings.get("seeds", seeds)
        steps = quick_settings.get("centralised_steps", steps)
        updates = quick_settings.get("updates", {})
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"centralised_steps = {steps!r}: expected an integer >= 1")
    strategies = raw.get("strategies", list(STRATEGIES))
    for name in strategies:
        if name not in STRATEGIES:
            raise ConfigError(f"strategies: {name!r} is not a strategy; expected names from "
                              f"{', '.join(map(repr, STRATEGIES))}")
    static = raw.get("static", [])
    for name in static:
        if name not in STATIC_ARMS:
            raise ConfigError(f"static: {name!r} is not a static arm; expected names from "
                              f"{', '.join(map(repr, STATIC_ARMS))}")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"seeds = {seeds!r}: expected a non-empty list of integers >= 0")
    fraction = raw.get("target_fraction", 0.05)
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(f"target_fraction = {fraction!r}: expected a number in (0, 1)")
    levels = raw.get("levels", {"default": {}})
    overrides = raw.get("overrides", {})
    base = config_from_dict(raw.get("base", {})).with_updates(updates)
    configs = {}
    for level, level_updates in levels.items():
        for name in strategies:
            for seed in seeds:
                config = base.with_updates({**level_updates, "federated.strategy": name, "seed": seed,
                                            **overrides.get(name, {})})
                configs[level, name, seed] = config
        for name in static:        # FedFrozen's schedule; the frozen stage sees the static features
            for seed in seeds:
                warmup = {} if STATIC_ARMS[name][2] else {"federated.warmup_rounds": 0}
                configs[level, name, seed] = base.with_updates({**level_updates, "federated.strategy": "fedfrozen",
                                                                "seed": seed, **warmup})
    strategies = strategies + list(static)
    return {"configs": configs, "levels": list(levels), "strategies": strategies, "seeds": seeds,
            "target_fraction": float(fraction), "level_updates": levels, "centralised_steps": steps}


def teacher_params(clients, config, ridge: float):
    """The planted teacher kernel ``K*`` factored as ``W_Q W_K^T`` (truncated SVD at the model's
    rank) with its optimal value block ``V*_λ(K*)``; ``None`` when the model has other heads."""
    K = np.asarray(clients.truth["kernel"])
    H, r = config.model.heads, config.model.rank
    if K.shape[0] != H:
        return None
    U, s, Vt = np.linalg.svd(K)
    k = min(r, K.shape[-1])
    WQ = np.zeros((H, K.shape[-1], r))
    WK = np.zeros((H, K.shape[-1], r))
    WQ[..., :k] = U[..., :k] * np.sqrt(s[:, None, :k])
    WK[..., :k] = np.swapaxes(Vt, -1, -2)[..., :k] * np.sqrt(s[:, None, :k])
    K_model = WQ @ np.swapaxes(WK, -1, -2)
    _, V = static_profile_objective(K_model, clients, ridge)
    return Params(WQ, WK, V.reshape(H, K.shape[-1], -1))


def centralised_config(config, steps: int = CENTRALISED_STEPS):
    """The run of :func:`centralised_reference`: centralised gradient descent on ``F_λ`` (FedAvg with
    ``E = 1``, full batch and participation) for ``steps`` steps."""
    return config.with_updates({"federated.strategy": "fedavg", "federated.local_steps": 1,
                                "federated.rounds": steps, "federated.participation": 1.0,
                                "federated.batch_size": None})


def centralised_reference(config, clients, steps: int = CENTRALISED_STEPS) -> float:
    """The lowest ``F_λ`` of centralised gradient descent on ``F_λ`` (FedAvg with ``E = 1``, full
    batch and participation) started at the teacher kernel with its optimal value block, or
    ``Φ_λ(K*)`` alone when the model cannot hold the teacher."""
    params = teacher_params(clients, config, config.federated.ridge)
    if params is None:
        return static_profile_objective(clients.truth["kernel"], clients, config.federated.ridge)[0]
    result = simulate(centralised_config(config, steps), clients, params=params)
    return float(np.nanmin(result.table["loss_regularized"]))


def _static_features(name: str, clients):
    """The frozen stage's features of a static arm (``None`` for a strategy)."""
    if name not in STATIC_ARMS:
        return None
    pattern, count, _ = STATIC_ARMS[name]
    return static_head_features(clients, pattern, count=count)


def run_grid(settings: dict, progress: bool = True, workers: int = 1):
    """Run every configuration; return per-run results and per-round excess-risk curves.

    The (level, seed) groups are independent: ``workers`` processes run contiguous shares of them,
    each share's runs as ensembles (:func:`_run_groups`), and the tables are assembled in the groups'
    order. A run's numbers do not depend on the ensemble it runs in, so the tables do not depend on
    ``workers``."""
    groups = [(level, seed) for level in settings["levels"] for seed in settings["seeds"]]
    shares = [part for part in np.array_split(np.arange(len(groups)), max(1, min(workers, len(groups)))) if len(part)]
    shares = [[groups[i] for i in part] for part in shares]
    if len(shares) > 1:
        from joblib import Parallel, delayed
        done = [group for share in Parallel(n_jobs=len(shares))(delayed(_run_groups)(settings, share)
                                                                  for share in shares) for group in share]
    else:
        done = _run_groups(settings, groups)
    runs, curves = [], []
    for (level, seed), (group_runs, group_curves) in zip(groups, done):
        runs += group_runs
        curves += group_curves
        if progress:
            print(f"  {level:>8s} seed {seed}: {len(group_runs)} strategies", file=sys.stderr)
    return pd.DataFrame(runs), pd.concat(curves, ignore_index=True)


def _run_groups(settings: dict, groups: list) -> list:
    """:func:`_group_rows` of every (level, seed) of ``groups``: all their runs, the centralised
    references' included, in one :func:`~linattn_theory.sim.ensemble.simulate_many` call (runs of one
    strategy and shape form one ensemble; each result is its run alone's)."""
    configs, clients, features, params, where = [], [], [], [], []
    for level, seed in groups:
        group = {name: settings["configs"][level, name, seed] for name in settings["strategies"]}
        first = next(iter(group.values()))
        data = clients_from_config(first)
        for name, config in group.items():
            configs.append(config)
            clients.append(data)
            features.append(_static_features(name, data))
            params.append(None)
        teacher = teacher_params(data, first, first.federated.ridge)
        if teacher is not None:
            configs.append(centralised_config(first, settings["centralised_steps"]))
            clients.append(data)
            features.append(None)
            params.append(teacher)
        where.append((data, first, teacher is not None))
    with np.errstate(over="ignore", invalid="ignore"):     # divergence is recorded, not warned
        results = iter(simulate_many(configs, clients, params=params, frozen_features=features))
    done = []
    for (level, seed), (data, first, taught) in zip(groups, where):
        group_results = {name: next(results) for name in settings["strategies"]}
        centralised = (float(np.nanmin(next(results).table["loss_regularized"])) if taught
                       else centralised_reference(first, data))       # Φ_λ(K*): the model cannot hold K*
        done.append(_group_rows(settings, level, seed, group_results, centralised))
    return done


def _group_rows(settings: dict, level: str, seed: int, results: dict, centralised: float) -> tuple[list, list]:
    """Every strategy on one (level, seed), from its runs' ``results`` and the centralised
    reference: per-run rows and per-round excess-risk curves."""
    runs, curves = [], []
    config = settings["configs"][level, settings["strategies"][0], seed]
    best = min(float(np.nanmin(r.table["loss_regularized"])) for r in results.values())
    reference = min(centralised, best)
    for name, result in results.items():
        table = result.table
        F = table["loss_regularized"].to_numpy()
        target = reference + settings["target_fraction"] * (F[0] - reference)
        reached = np.flatnonzero(F <= target)
        runs.append({
            "level": level, "strategy": name, "seed": seed,
            "diverged": result.diverged,
            "excess_risk": np.nan if result.diverged else F[-1] - reference,
            "kernel_drift": float(table["cumulative_kernel_drift"].iloc[-1]),
            "value_drift": float(table["drift_WV"].iloc[-1]),
            "rounds_to_target": float(table["round"].iloc[reached[0]]) if reached.size else np.nan,
            "final_loss": F[-1], "reference": reference, "centralised_reference": centralised,
            # fedfrozen_adaptive chooses T0 during the run (docs/theory.md §8): its frozen
            # kernel's round, and the round at which its rule decided
            "warmup_rounds": result.metadata.get("kernel_round", config.warmup_rounds if name == "fedavg"
                                                 else settings["configs"][level, name, seed].warmup_rounds),
            "stop_round": result.metadata.get("stop_round", np.nan),
        })
        if not result.diverged:
            curves.append(pd.DataFrame({"level": level, "strategy": name, "seed": seed,
                                        "round": table["round"], "excess_risk": F - reference}))
    return runs, curves


def summarise(runs: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """Mean and standard deviation over seeds per (level, strategy); diverged runs are counted apart."""
    rows = []
    for level in settings["levels"]:
        zeta = settings["level_updates"].get(level, {})
        for name in settings["strategies"]:
            group = runs[(runs["level"] == level) & (runs["strategy"] == name)]
            ok = group[~group["diverged"]]
            row = {"level": level, "zeta_value": zeta.get("task.zeta_value"),
                   "zeta_covariate": zeta.get("task.zeta_covariate"), "strategy": name,
                   "runs": len(group), "diverged": int(group["diverged"].sum())}
            for column in ("excess_risk", "kernel_drift", "value_drift", "rounds_to_target"):
                values = ok[column].dropna()
                row[f"{column}_mean"] = float(values.mean()) if len(values) else np.nan
                row[f"{column}_std"] = float(values.std(ddof=0)) if len(values) else np.nan
            row["reached_target"] = int(ok["rounds_to_target"].notna().sum())
            row["T0_median"] = float(ok["warmup_rounds"].median()) if len(ok) else np.nan
            row["stop_round_median"] = float(ok["stop_round"].median()) if ok["stop_round"].notna().any() else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def _pm(mean, std, digits=2, fixed=False) -> str:
    if not np.isfinite(mean):
        return "—"
    if fixed:
        return f"{mean:.1f} ± {std:.1f}"
    return f"{mean:.{digits}e} ± {std:.1e}"


def markdown_table(summary: pd.DataFrame, settings: dict) -> str:
    """The summary as a Markdown table (mean ± standard deviation over seeds)."""
    lines = [
        "# Federated strategies compared",
        "",
        f"Planted-kernel clients, {len(settings['seeds'])} seeds per cell; mean ± standard deviation "
        "over seeds. Excess risk: final F_λ minus the reference of the same level and seed, the lower "
        f"of centralised gradient descent on F_λ started at the teacher kernel "
        f"({settings['centralised_steps']} steps) and the "
        "best F_λ any run reached. Γ: cumulative kernel drift; value drift: Σ_c p_c "
        "‖W_V,c − W̄_V‖² in the last round. Rounds to target: first round with F_λ below "
        f"reference + {settings['target_fraction']:g} × initial excess (reached: seeds that got there).",
        "",
        "T0: the warm-up length (median over seeds); fedfrozen_adaptive chooses it during the run, "
        "and the round at which its rule decided follows in brackets (docs/theory.md §8). value_solve and "
        "value_solve_final: in round T0 (T − 1 for the latter) every client sends its value moments "
        "(A_c, B_c), (Hd)² + Hdp numbers (a FedAvg round: 2Hdr + Hdp), and the server sets "
        "V = V*_λ(K_T0), the centralised optimum of the value block (Fed3R, Fanì et al. 2024; "
        "docs/theory.md §5); value_solve then trains W_V with FedAvg. The value drift of value_solve_final "
        "is that of the local steps the engine runs in the solve round and discards.",
        "",
        "| level | strategy | T0 | excess risk | kernel drift Γ | value drift | rounds to target (reached) |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in summary.iterrows():
        excess = _pm(r["excess_risk_mean"], r["excess_risk_std"])
        if r["diverged"]:
            excess += f" ({r['diverged']} diverged)"
        rounds = _pm(r["rounds_to_target_mean"], r["rounds_to_target_std"], fixed=True)
        T0 = "—" if not np.isfinite(r["T0_median"]) else f"{r['T0_median']:g}"
        if np.isfinite(r.get("stop_round_median", np.nan)):
            T0 += f" [{r['stop_round_median']:g}]"
        lines.append(f"| {r['level']} | {r['strategy']} | {T0} | {excess} | "
                     f"{_pm(r['kernel_drift_mean'], r['kernel_drift_std'])} | "
                     f"{_pm(r['value_drift_mean'], r['value_drift_std'])} | "
                     f"{rounds} ({r['reached_target']}/{r['runs'] - r['diverged']}) |")
    return "\n".join(lines) + "\n"


#: the panels of the figure: run-table column -> (panel title, y label)
PANELS = {"excess_risk": ("final excess risk", r"$F_\lambda(\theta_T) - F_{\mathrm{ref}}$"),
          "value_drift": ("last-round value drift", r"$\sum_c p_c \|W_{V,c} - \bar W_V\|^2$"),
          "kernel_drift": ("cumulative kernel drift", r"$\Gamma(T)$")}


#: the statistics of every plotted cell: median and interquartile range over seeds
QUARTILES = {"median": "median", "q25": lambda v: v.quantile(0.25), "q75": lambda v: v.quantile(0.75),
             "count": "count"}


def paired_instances(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs of complete instances, the diverged runs)``: an instance (level, seed) with a diverged
    run is left out for every strategy, so that all strategies are compared on the same instances."""
    bad = runs.loc[runs["diverged"].astype(bool), ["level", "seed"]].drop_duplicates()
    keep = ~runs.set_index(["level", "seed"]).index.isin(list(map(tuple, bad.to_numpy())))
    return runs[keep], runs[runs["diverged"].astype(bool)]


def comparison_data(runs: pd.DataFrame, curves: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """The plotted numbers, over the complete instances (:func:`paired_instances`): per (level,
    strategy) the final excess risk, value drift and kernel drift (``panel`` = the column, at the
    final round), and per (strategy, round) at the last level the excess risk (``panel = "curve"``);
    columns median, q25, q75 (the interquartile range), count (seeds) and diverged (runs of that
    cell that diverged)."""
    ok, _ = paired_instances(runs)
    diverged = runs.groupby(["level", "strategy"])["diverged"].sum()
    last_round = curves.groupby(["level", "strategy"])["round"].max()      # the round of F_λ(θ_T)
    tables = []
    for column in PANELS:
        final = ok.groupby(["level", "strategy"])[column].agg(**QUARTILES).reset_index()
        keys = list(zip(final["level"], final["strategy"]))
        tables.append(final.assign(panel=column, round=[last_round[key] for key in keys],
                                   diverged=[int(diverged[key]) for key in keys]))
    last = settings["levels"][-1]
    kept = ok[ok["level"] == last]["seed"].unique()
    chosen = curves[(curves["level"] == last) & curves["seed"].isin(kept)]
    curve = chosen.groupby(["strategy", "round"])["excess_risk"].agg(**QUARTILES).reset_index()
    curve = curve.assign(panel="curve", level=last,
                         diverged=[int(diverged.get((last, name), 0)) for name in curve["strategy"]])
    order = {name: i for i, name in enumerate(settings["strategies"])}
    levels = {level: i for i, level in enumerate(settings["levels"])}
    table = pd.concat(tables + [curve], ignore_index=True)
    table = table.assign(_panel=table["panel"].map({**{c: i for i, c in enumerate(PANELS)}, "curve": len(PANELS)}),
                         _level=table["level"].map(levels), _strategy=table["strategy"].map(order))
    table = table.sort_values(["_panel", "_level", "_strategy", "round"])
    columns = ["panel", "level", "strategy", "round", *QUARTILES, "diverged"]
    return table[columns].reset_index(drop=True)


def _dots(ax, data, names, levels, floor):
    """Per level, one marker per method (median over instances; bars: interquartile range)."""
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        rows = data[data["strategy"] == name]
        if rows.empty:
            continue
        style = plotting.method_style(name)
        x = rows["level"].map(levels.index).to_numpy() - 0.4 + (j + 0.5) * width
        median, low, high = (np.maximum(rows[c].to_numpy(), floor) for c in ("median", "q25", "q75"))
        ax.errorbar(x, median, yerr=[median - low, high - median], fmt=style.marker, color=style.color,
                    markersize=3.5, capsize=1.5, linewidth=0.9, label=style.label)
    for boundary in np.arange(0.5, len(levels) - 1):
        ax.axvline(boundary, color="0.8", linewidth=0.8)
    plotting.log_scale(ax)
    ax.set_xticks(range(len(levels)), levels)
    ax.tick_params(axis="x", which="both", length=0)
    ax.grid(False, axis="x")
    ax.axhline(floor, color="0.6", linewidth=0.6, linestyle=":")


def plot_comparison(runs: pd.DataFrame, curves: pd.DataFrame, settings: dict, quick: bool = False):
    """``(figure, plotted data)``: one column per family of methods (plotting.METHOD_PANELS: no colour
    twice in a column; FedAvg and FedFrozen are every column's references), and per method and
    heterogeneity level the final excess risk, value drift and kernel drift (median over instances,
    bars over the interquartile range), and the excess risk against round at the last level (median).
    Instances with a diverged run are left out for every strategy and counted in a note."""
    levels = settings["levels"]
    data = comparison_data(runs, curves, settings)
    families = {title: [m for m in members if m in settings["strategies"]]
                for title, members in plotting.METHOD_PANELS.items()}
    families = {title: members for title, members in families.items() if members}
    rows = list(PANELS) + ["curve"]
    fig, axes = plotting.figure(len(families), len(rows), height=1.75, sharey="row", quick=quick)
    axes = np.asarray(axes).reshape(len(rows), len(families))
    floors = {c: 0.3 * data.loc[(data["panel"] == c) & (data["q25"] > 0), "q25"].min() for c in PANELS}
    floors["curve"] = 1e-12           # the reference is the best loss reached: a median of 0 is floored
    warmup = runs.loc[runs["strategy"] == "fedfrozen", "warmup_rounds"]
    for column, (title, names) in enumerate(families.items()):
        for row, panel in enumerate(rows):
            ax = axes[row, column]
            if panel != "curve":
                _dots(ax, data[data["panel"] == panel], names, levels, floors[panel])
            else:
                curve = data[data["panel"] == "curve"]
                for name in names:
                    points = curve[curve["strategy"] == name]
                    if points.empty:
                        continue
                    style = plotting.method_style(name)
                    ax.plot(points["round"], np.maximum(points["median"].to_numpy(), floors["curve"]),
                            color=style.color, marker=style.marker, markevery=max(1, len(points) // 8),
                            markersize=3, linewidth=1.0)
                if not warmup.empty:
                    ax.axvline(float(warmup.iloc[0]), color=plotting.REFERENCE_COLOR, linestyle=":", linewidth=1.0)
                plotting.log_scale(ax)
                ax.set_xlabel(plotting.label("round"))
            if column == 0:
                ax.set_ylabel("\n".join(PANELS[panel]) if panel in PANELS else
                              f"excess risk, level {levels[-1]}\n" + r"$F_\lambda(\theta_t) - F_{\mathrm{ref}}$")
            if row == 0:
                ax.set_title(title)
    axes[len(PANELS) - 1, len(families) // 2].set_xlabel("heterogeneity level")
    handles, seen = [], set()
    for names in families.values():
        for name in names:
            if name not in seen:
                seen.add(name)
                style = plotting.method_style(name)
                handles.append(Line2D([], [], linestyle="none", marker=style.marker, color=style.color,
                                      markersize=3.5, label=style.label))
    plotting.legend_below(fig, handles, ncols=4)
    _, bad = paired_instances(runs)
    n = len(settings["seeds"])
    note = (f"{plotting.band_text(n, 'instances (seeds)')} per level\ndotted: exactly 0 (at the "
            "bottom of a panel), FedFrozen's warm-up (bottom row)\nvalue solve: the clients' value "
            "moments, $(Hd)^2 + Hdp$ numbers each, in one round; the server sets $V = V^*_\\lambda(K)$")
    if len(bad):
        note += "\nleft out for every strategy (a run diverged): " + ", ".join(
            f"{r.level} seed {r.seed} ({plotting.STRATEGY_NAMES.get(r.strategy, r.strategy)})"
            for r in bad.itertuples())
    fig.suptitle(note)
    return fig, data


def _level_label(level: str, settings: dict, sep: str = "\n", join: str = "\n") -> str:
    updates = settings["level_updates"].get(level, {})
    parts = [f"${symbol} = {updates[key]:g}$" for key, symbol in
             (("task.zeta_value", r"\zeta_V"), ("task.zeta_covariate", r"\zeta_X")) if key in updates]
    return level + sep + join.join(parts) if parts else level


def make(out_dir="figures", quick: bool = False, config=CONFIG, progress: bool = False,
         executor: str = "processes", workers: int | None = None) -> dict[str, Path]:
    """Run the comparison and write the CSV tables, the Markdown table and the figure to ``out_dir``
    (``executor="serial"``: in this process; else ``workers`` processes, default one per core)."""
    settings = load_settings(config, quick=quick)
    runs, curves = run_grid(settings, progress=progress, workers=analysis_workers(executor, workers))
    summary = summarise(runs, settings)
    out = Path(out_dir)
    paths = {"csv": out / "strategies.csv", "runs": out / "strategies_runs.csv",
             "markdown": out / "strategies.md", "png": out / "strategies.png",
             "pdf": out / "strategies.pdf", "plot_data": out / f"{PLOT_DATA}.csv"}
    atomic_write_text(paths["csv"], summary.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(paths["runs"], runs.to_csv(index=False, float_format="%.10g"))
    atomic_write_text(paths["markdown"], markdown_table(summary, settings))
    fig, data = plot_comparison(runs, curves, settings, quick=quick)
    # strategies.csv is the summary table, so the plotted numbers go to strategies_plot.csv
    paths["plot_data"], = plotting.save_figure(fig, PLOT_DATA, out, data, formats=())
    paths["png"], paths["pdf"] = plotting.save_figure(fig, NAME, out)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer seeds and rounds (seconds)")
    parser.add_argument("--out", default=str(ROOT / "figures"), help="output folder")
    parser.add_argument("--config", default=str(CONFIG), help="sweep settings (TOML)")
    parser.add_argument("--executor", choices=("serial", "processes"), default="processes",
                        help="serial: in this process; processes: the (level, seed) groups in parallel")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        paths = make(args.out, quick=args.quick, config=args.config, progress=True, executor=args.executor,
                     workers=args.workers)
    except ConfigError as err:
        print(f"strategies: invalid configuration: {err}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in paths.values())} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
