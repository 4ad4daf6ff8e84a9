"""Figure 5: the global loss round by round: FedAvg, FedFrozen, and the federated baselines.

Claim (docs/theory.md §3, §6): on heterogeneous clients, FedFrozen frozen at its best warm-up
ends below plain FedAvg, whose kernel keeps drifting; but a method that removes the value drift
altogether (SCAFFOLD, docs/theory.md §5) can end lower still. Curves: F_λ(θ_t) − Φ*_λ, one column
per instance (seed: its own teacher, clients and initialisation; the instances ζ_V = 3, seeds 0–2 of
figure 2). Top row: FedAvg and the federated baselines. Bottom row: FedFrozen, drawn at the
instance's best warm-up T0_best (the smallest T0 of figure 2's grid 0, 2, …, T minimising the final
excess risk, linattn_theory.report.sweep_analysis.best_warmup: chosen after seeing the runs, and the same
runs as figure 2), dashed at T0_theory, the argmin of the bound fitted on the instance's own FedAvg
run (an a posteriori fit, descriptive), and dotted with the strategy fedfrozen_adaptive, whose
causal rule chose its warm-up during the run (docs/theory.md §8); a marker shows where each one
froze, and FedAvg is drawn under them as a wide line. FedFrozen variants with the same T0 are
the same run and coincide by construction (the panel lists every T0). Each column's title names
the method with the lowest final excess risk; the figure title counts the instances in which
SCAFFOLD ends below FedFrozen at T0_best.

Config: simulations/configs/loss_curves.toml. Run: python simulations/loss_curves.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from linattn_theory.report import plotting
from linattn_theory.recommenders.recommendation import a_posteriori_bound
from linattn_theory.sim.config import config_from_dict
from linattn_theory.report.figures import analysis_workers, config_path, figure_sweep, script_main
from linattn_theory.sim.sweep import load_sweep
from linattn_theory.report.sweep_analysis import best_warmup, excess_risk_table

NAME = "loss_curves"
CONFIG = config_path(__file__, "loss_curves")
WARMUP_STEP = 2        # figure 2's grid of T0, so that T0_best is figure 2's


def with_fedfrozen(sweep):
    """The sweep plus, for every seed, FedFrozen at every ``T0`` of ``0, 2, …, T`` and at that seed's
    ``T0_theory`` (the argmin of the fitted bound); returns ``(sweep, {seed: T0_theory})``.

    FedFrozen's runs use the config's base settings (not a baseline's overrides).
    """
    base = config_from_dict(sweep.base)
    theory, runs, points = {}, [], []
    for seed in sorted({c.seed for c in sweep.configs}):
        config = base.with_updates({"seed": seed, "federated.strategy": "fedfrozen"})
        theory[seed] = a_posteriori_bound(config).T0_theory
        T = config.federated.rounds
        for T0 in sorted(set(range(0, T + 1, WARMUP_STEP)) | {T, theory[seed]}):
            runs.append(config.with_updates({"federated.warmup_rounds": T0}))
            points.append({"seed": seed, "federated.strategy": "fedfrozen", "federated.warmup_rounds": T0})
    return sweep.with_runs(runs, points), theory


#: the two rows of the figure: the federated baselines, and FedFrozen's warm-ups (FedAvg under both)
ROWS = {"FedAvg and federated baselines": ("fedprox", "scaffold", "fedavgm", "fedadam"),
        "FedFrozen: best, fitted and online warm-up": ("fedfrozen_best", "fedfrozen_theory", "fedfrozen_adaptive")}
#: the rank names of the FedFrozen variants in the titles
SHORT = {"fedfrozen_best": "FedFrozen (best)", "fedfrozen_theory": "FedFrozen (fit)"}


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the loss curves, write loss_curves.*."""
    sweep, theory = with_fedfrozen(load_sweep(CONFIG, quick=quick))
    _, (results, rounds), folder = figure_sweep(sweep, out_dir, quick=quick, executor=executor,
                                                workers=workers, progress=progress, rounds=True)
    table = excess_risk_table(folder, results, workers=analysis_workers(executor, workers))
    rounds = rounds.assign(gap=rounds["loss_regularized"] - rounds["run_id"].map(table.set_index("run_id")["optimum"]))
    frozen = table[table["federated.strategy"] == "fedfrozen"]
    best = best_warmup(frozen[frozen["T0"] % WARMUP_STEP == 0].assign(T0=lambda t: t["T0"].astype(int)),
                       ["seed"]).set_index("seed")["best_T0"]
    ok, dropped = plotting.drop_diverged(table)
    seeds = sorted(theory)
    fig, axes = plotting.figure(len(seeds), 2, height=2.1, sharex=True, sharey=True, quick=quick)
    axes = np.asarray(axes).reshape(2, len(seeds))
    rows, wins = [], 0
    for column, seed in enumerate(seeds):
        mine = ok[ok["seed"] == seed]
        runs = {name: mine[mine["federated.strategy"] == name] for name in dict.fromkeys(mine["federated.strategy"])}
        frozen_runs = runs.pop("fedfrozen")
        runs["fedfrozen_best"] = frozen_runs[frozen_runs["T0"] == best[seed]]
        runs["fedfrozen_theory"] = frozen_runs[frozen_runs["T0"] == theory[seed]]
        warmups = {key: int(run["T0"].iloc[0]) for key, run in runs.items()
                   if key.startswith("fedfrozen") and len(run)}
        curves = {key: rounds[rounds["run_id"] == run["run_id"].iloc[0]] for key, run in runs.items() if len(run)}
        final = {key: float(curve["gap"].iloc[-1]) for key, curve in curves.items()}
        for row, (title, names) in enumerate(ROWS.items()):
            ax = axes[row, column]
            if "fedavg" in curves:      # the reference of both rows: wide, under the others
                fedavg = plotting.method_style("fedavg")
                ax.plot(curves["fedavg"]["round"], curves["fedavg"]["gap"], color=fedavg.color, linewidth=3.0,
                        label=fedavg.label, solid_capstyle="butt")
            for key in names:
                if key not in curves:
                    continue
                style, curve = plotting.method_style(key), curves[key]
                ax.plot(curve["round"], curve["gap"], color=style.color, linestyle=style.linestyle,
                        linewidth=1.6 if style.linestyle == ":" else 1.2, label=style.label, zorder=3)
                if key in warmups:      # where it froze
                    at = curve[curve["round"] == warmups[key]]
                    ax.plot(at["round"], at["gap"], linestyle="none", marker=style.marker, color=style.color,
                            markeredgecolor="black", markeredgewidth=0.5, markersize=5, zorder=4)
            plotting.log_scale(ax)
            if column == 0:
                ax.set_ylabel(plotting.label("loss_gap"))
            if row == 1:
                ax.set_xlabel(plotting.label("round"))
        wins += final.get("scaffold", float("inf")) < final.get("fedfrozen_best", float("-inf"))
        lowest = min(final, key=final.get)
        axes[0, column].set_title(f"seed {seed}; lowest: " + SHORT.get(lowest, plotting.STRATEGY_NAMES.get(lowest, lowest)))
        axes[1, column].text(0.03, 0.03, "\n".join([rf"best $T_0 = {best[seed]}$",
                                                    rf"$T_0^{{\mathrm{{theory}}}} = {theory[seed]}$"]
                                                   + ([rf"online $T_0 = {warmups['fedfrozen_adaptive']}$"]
                                                      if "fedfrozen_adaptive" in warmups else [])),
                             transform=axes[1, column].transAxes, ha="left", va="bottom")
        for key, curve in curves.items():
            rows.append(curve[["run_id", "seed", "round", "gap"]].assign(
                curve=key, T0=int(runs[key]["T0"].iloc[0]), best_T0=best[seed], T0_theory=theory[seed]))
    first = results.iloc[0]
    fig.suptitle(rf"$\zeta_V = {first['task.zeta_value']:g}$, $E = {first['federated.local_steps']}$, "
                 rf"$\eta = {first['federated.learning_rate']:g}$, $T = {first['federated.rounds']}$: "
                 f"SCAFFOLD ends below FedFrozen at its best $T_0$ in {wins}/{len(seeds)} instances")
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    handles.append(Line2D([], [], linestyle="none", marker="s", color="0.7", markeredgecolor="black",
                          markeredgewidth=0.5, markersize=5, label=r"marker: the round it froze ($T_0$)"))
    plotting.legend_below(fig, handles, ncols=4)
    plotting.note_dropped(axes[0, -1], dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
