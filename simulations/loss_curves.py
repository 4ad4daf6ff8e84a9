"""Figure 5: the global loss round by round: FedAvg, FedFrozen at T0_theory, and the baselines.

Claim (docs/theory.md §3, §6): on heterogeneous clients, freezing the kernel at the warm-up the
bound recommends (T0_theory = argmin U(T0), computed per seed by linattn_theory.bound) ends
below plain FedAvg, whose kernel keeps drifting; the federated-optimisation baselines of the
config's [grid] are drawn for comparison. Curves: F_λ(θ_t) − Φ*_λ, one panel per seed (each
seed is its own instance: teacher, clients and initialisation); dotted: that seed's T0_theory.

Config: simulations/configs/loss_curves.toml. Run: python simulations/loss_curves.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from linattn_theory import plotting
from linattn_theory.bound import estimate_bound
from linattn_theory.config import config_from_dict
from linattn_theory.figures import config_path, figure_sweep, script_main
from linattn_theory.sweep import load_sweep
from linattn_theory.sweep_analysis import excess_risk_table

NAME = "loss_curves"
CONFIG = config_path(__file__, "loss_curves")


def with_fedfrozen_at_theory(sweep):
    """The sweep plus, for every seed, FedFrozen at that seed's ``T0_theory``; ``{seed: T0_theory}``.

    FedFrozen's runs use the config's base settings (not a baseline's overrides).
    """
    base = config_from_dict(sweep.base)
    theory, runs, points = {}, [], []
    for seed in sorted({c.seed for c in sweep.configs}):
        config = base.with_updates({"seed": seed, "federated.strategy": "fedfrozen"})
        theory[seed] = estimate_bound(config).T0_theory
        runs.append(config.with_updates({"federated.warmup_rounds": theory[seed]}))
        points.append({"seed": seed, "federated.strategy": "fedfrozen", "federated.warmup_rounds": theory[seed]})
    return sweep.with_runs(runs, points), theory


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Compute T0_theory, run (or reuse) the sweep, draw the loss curves, write loss_curves.*."""
    sweep, theory = with_fedfrozen_at_theory(load_sweep(CONFIG, quick=quick))
    _, (results, rounds), folder = figure_sweep(sweep, out_dir, quick=quick, executor=executor,
                                                workers=workers, progress=progress, rounds=True)
    optimum = excess_risk_table(folder, results).set_index("run_id")["optimum"]
    rounds = rounds.assign(gap=rounds["loss_regularized"] - rounds["run_id"].map(optimum))
    results, dropped = plotting.drop_diverged(results)
    rounds = rounds[rounds["run_id"].isin(results["run_id"])]
    strategies = list(dict.fromkeys(results["federated.strategy"]))   # config order, FedFrozen last
    colors = dict(zip(strategies, plotting.palette(len(strategies))), fedfrozen="black")
    # the two compared by the theory drawn on top, the baselines thinner and dashed
    styles = {s: {"linewidth": 1.3, "linestyle": "--", "zorder": 2} for s in strategies}
    styles.update(fedavg={"linewidth": 2.0, "zorder": 4}, fedfrozen={"linewidth": 2.2, "zorder": 5})
    seeds = sorted(theory)
    fig, axes = plotting.figure(len(seeds), width=4.4, height=3.8, sharey=True)
    axes = [axes] if len(seeds) == 1 else axes
    rows = []
    for ax, seed in zip(axes, seeds):
        for strategy in strategies:
            sub = rounds[(rounds["federated.strategy"] == strategy) & (rounds["seed"] == seed)]
            if sub.empty:
                continue
            name = plotting.STRATEGY_NAMES.get(strategy, strategy)
            if strategy == "fedfrozen":
                name += r" at $T_0^{\mathrm{theory}}$"
            ax.plot(sub["round"], sub["gap"], color=colors[strategy], label=name, **styles[strategy])
            rows.append(sub[["run_id", "seed", "round", "gap"]].assign(strategy=strategy))
        ax.axvline(theory[seed], color="0.35", linestyle=":", linewidth=1.2,
                   label=rf"$T_0^{{\mathrm{{theory}}}} = {theory[seed]}$")
        plotting.log_scale(ax)
        ax.set_xlabel(plotting.label("round"))
        ax.set_title(f"seed {seed}")
        ax.legend(fontsize="small")
    axes[0].set_ylabel(plotting.label("loss_gap"))
    first = results.iloc[0]
    fig.suptitle(rf"$\zeta_V = {first['task.zeta_value']:g}$, $E = {first['federated.local_steps']}$, "
                 rf"$\eta = {first['federated.learning_rate']:g}$, $T = {first['federated.rounds']}$")
    plotting.note_dropped(axes[-1], dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
