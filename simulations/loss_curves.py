"""Figure 5: the global loss round by round: FedAvg, FedFrozen, and the federated baselines.

Claim (docs/theory.md §3, §6): on heterogeneous clients, FedFrozen frozen at its best warm-up
ends below plain FedAvg, whose kernel keeps drifting; but a method that removes the value drift
altogether (SCAFFOLD, docs/theory.md §5) can end lower still. Curves: F_λ(θ_t) − Φ*_λ, one panel
per instance (seed: its own teacher, clients and initialisation). FedFrozen is drawn at the
instance's best warm-up T0_best (the smallest T0 of the grid 0, 4, …, T minimising the final
excess risk, linattn_theory.report.sweep_analysis.best_warmup: chosen after seeing the runs) and, dashed,
at T0_theory, the argmin of the bound fitted on the instance's own FedAvg run (an a posteriori fit,
descriptive); dotted, the strategy fedfrozen_adaptive, whose causal rule chose its warm-up during
the run (docs/theory.md §8; "online T0" in each panel). Each panel's title names the method with the lowest final excess risk; the figure title
counts the instances in which SCAFFOLD ends below FedFrozen at T0_best.

Config: simulations/configs/loss_curves.toml. Run: python simulations/loss_curves.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from linattn_theory.report import plotting
from linattn_theory.theory.bound import estimate_bound
from linattn_theory.sim.config import config_from_dict
from linattn_theory.report.figures import analysis_workers, config_path, figure_sweep, script_main
from linattn_theory.sim.sweep import load_sweep
from linattn_theory.report.sweep_analysis import best_warmup, excess_risk_table

NAME = "loss_curves"
CONFIG = config_path(__file__, "loss_curves")
WARMUP_STEP = 4


def with_fedfrozen(sweep):
    """The sweep plus, for every seed, FedFrozen at every ``T0`` of ``0, 4, …, T`` and at that seed's
    ``T0_theory`` (the argmin of the fitted bound); returns ``(sweep, {seed: T0_theory})``.

    FedFrozen's runs use the config's base settings (not a baseline's overrides).
    """
    base = config_from_dict(sweep.base)
    theory, runs, points = {}, [], []
    for seed in sorted({c.seed for c in sweep.configs}):
        config = base.with_updates({"seed": seed, "federated.strategy": "fedfrozen"})
        theory[seed] = estimate_bound(config).T0_theory
        T = config.federated.rounds
        for T0 in sorted(set(range(0, T + 1, WARMUP_STEP)) | {T, theory[seed]}):
            runs.append(config.with_updates({"federated.warmup_rounds": T0}))
            points.append({"seed": seed, "federated.strategy": "fedfrozen", "federated.warmup_rounds": T0})
    return sweep.with_runs(runs, points), theory


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
    baselines = [s for s in dict.fromkeys(results["federated.strategy"]) if s != "fedfrozen"]
    colors = dict(zip(baselines, plotting.palette(len(baselines))))
    seeds = sorted(theory)
    fig, axes = plotting.figure(len(seeds), height=2.6, sharey=True, quick=quick)
    axes = [axes] if len(seeds) == 1 else axes
    rows, wins = [], 0
    for ax, seed in zip(axes, seeds):
        curves = {}
        for strategy in baselines:
            curves[plotting.STRATEGY_NAMES.get(strategy, strategy)] = (
                ok[(ok["federated.strategy"] == strategy) & (ok["seed"] == seed)], strategy,
                {"color": colors[strategy], "linewidth": 1.6 if strategy == "fedavg" else 1.0}
                if strategy != "fedfrozen_adaptive" else     # the causal rule: on top, dotted
                {"color": colors[strategy], "linewidth": 1.6, "linestyle": ":", "zorder": 5})
        mine = ok[(ok["federated.strategy"] == "fedfrozen") & (ok["seed"] == seed)]
        curves[r"FedFrozen at its best $T_0$"] = (mine[mine["T0"] == best[seed]], "fedfrozen_best",
                                                  {"color": "black", "linewidth": 1.8})
        curves[r"FedFrozen at $T_0^{\mathrm{theory}}$ (a posteriori fit)"] = (
            mine[mine["T0"] == theory[seed]], "fedfrozen_theory",
            {"color": "black", "linewidth": 1.0, "linestyle": "--"})
        final = {}
        for name, (run, key, style) in curves.items():
            if run.empty:
                continue
            sub = rounds[rounds["run_id"] == run["run_id"].iloc[0]]
            ax.plot(sub["round"], sub["gap"], label=name, **style)
            final[key] = float(sub["gap"].iloc[-1])
            rows.append(sub[["run_id", "seed", "round", "gap"]].assign(curve=key))
        wins += final.get("scaffold", float("inf")) < final.get("fedfrozen_best", float("-inf"))
        ranking = sorted(final, key=final.get)
        names = {"fedfrozen_best": "FedFrozen (best)", "fedfrozen_theory": "FedFrozen (fit)"}
        ax.set_title(f"seed {seed}; lowest: " + names.get(ranking[0], plotting.STRATEGY_NAMES.get(ranking[0], ranking[0])))
        adaptive = ok[(ok["federated.strategy"] == "fedfrozen_adaptive") & (ok["seed"] == seed)]["T0"]
        online = f"online $T_0 = {int(adaptive.iloc[0])}$\n" if len(adaptive) else ""
        ax.text(0.02, 0.02, online + rf"best $T_0 = {best[seed]}$, $T_0^{{\mathrm{{theory}}}} = {theory[seed]}$",
                transform=ax.transAxes, ha="left", va="bottom")
        plotting.log_scale(ax)
        ax.set_xlabel(plotting.label("round"))
    axes[0].set_ylabel(plotting.label("loss_gap"))
    first = results.iloc[0]
    fig.suptitle(rf"$\zeta_V = {first['task.zeta_value']:g}$, $E = {first['federated.local_steps']}$, "
                 rf"$\eta = {first['federated.learning_rate']:g}$, $T = {first['federated.rounds']}$: "
                 f"SCAFFOLD ends below FedFrozen at its best $T_0$ in {wins}/{len(seeds)} instances")
    plotting.legend_below(fig, ncols=4)
    plotting.note_dropped(axes[-1], dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
