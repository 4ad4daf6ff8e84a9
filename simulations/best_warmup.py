"""Figure 2b: per instance, the best warm-up T0_best and FedFrozen's gain against the heterogeneity.

Claim (docs/theory.md §6): the best warm-up moves earlier as the heterogeneity ζ_V grows, and
freezing pays more. This is shown instance by instance (a thin line per seed: each seed draws its
own teacher, clients and initialisation, and is run at every ζ_V), not only as a median: left,
T0_best = the smallest T0 of the grid minimising R(T0) (linattn_theory.report.sweep_analysis.best_warmup);
right, the gain 1 − R(T0_best)/R(T) over plain FedAvg. Thick black: the median over instances.
The title counts the instances whose best warm-up at the highest ζ_V is earlier than at the lowest.
Instances whose FedAvg run diverged have no gain and are left out (a note counts them). Chaotic
instances (docs/theory.md §6: a 1e-12 move of θ⁰ moves the end of their FedAvg run, whose warm-up
path every T0 shares, by more than 1e-5; linattn_theory.report.sweep_analysis.fedavg_chaos) are drawn
as open markers: their best T0 and gain hold only to their spread, not to their digits.
best_warmup.csv holds one row per (ζ_V, seed), with its chaos flag and amplification: every number
quoted about the headline comes from it. FedAvg here runs at the sweep's one step, not tuned (the
fair comparison is the phase diagram, figure 4b).

Config: simulations/configs/tradeoff.toml (the sweep of figure 2).
Run: python simulations/best_warmup.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from matplotlib.lines import Line2D

from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, excess_risk_sweep, script_main

NAME = "best_warmup"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"


def earlier_at_highest(best):
    """``(k, n)``: of ``n`` seeds, ``k`` have a strictly smaller best T0 at the highest ζ_V than at the lowest."""
    wide = best.pivot(index="seed", columns=HUE, values="best_T0")
    low, high = wide.columns.min(), wide.columns.max()
    both = wide[[low, high]].dropna()
    return int((both[high] < both[low]).sum()), int(len(both))


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the tradeoff sweep, draw best T0 and gain per instance, write best_warmup.*."""
    _, best, left_out = excess_risk_sweep(CONFIG, out_dir, by=(HUE, "seed"), quick=quick,
                                          executor=executor, workers=workers, progress=progress, chaos=True)
    fig, (ax_t0, ax_gain) = plotting.figure(2, height=2.5, quick=quick)
    seeds = sorted(best["seed"].unique())
    offsets = dict(zip(seeds, np.linspace(-0.04, 0.04, len(seeds)) if len(seeds) > 1 else [0.0]))
    for seed, sub in best.groupby("seed"):
        sub = sub.sort_values(HUE)
        x = sub[HUE] + offsets[seed]                # a small offset per seed, so that lines do not hide each other
        for ax, y in ((ax_t0, sub["best_T0"]), (ax_gain, 100 * sub["gain"])):
            ax.plot(x, y, "-", color=plotting.INSTANCE_COLOR, linewidth=0.6, alpha=0.7)
            colors = [plotting.heterogeneity_color(v) for v in sub[HUE]]
            calm = ~sub["chaotic"].to_numpy(dtype=bool)
            ax.scatter(x[calm], y[calm], c=[c for c, k in zip(colors, calm) if k], s=5, zorder=3)
            ax.scatter(x[~calm], y[~calm], facecolors="none", s=14, linewidths=0.8, zorder=3,   # chaotic: open
                       edgecolors=[c for c, k in zip(colors, calm) if not k])
    median = best.groupby(HUE)[["best_T0", "gain"]].median()
    for ax, y in ((ax_t0, median["best_T0"]), (ax_gain, 100 * median["gain"])):
        ax.plot(median.index, y, "-", color=plotting.STATISTIC_COLOR, linewidth=2)
        ax.scatter(median.index, y, c=[plotting.heterogeneity_color(v) for v in median.index], marker="D",
                   s=30, edgecolors=plotting.STATISTIC_COLOR, zorder=4)
    levels = sorted(best[HUE].unique())
    for ax in (ax_t0, ax_gain):
        ax.set_xticks(levels, [f"{v:g}" for v in levels])
        ax.set_xlabel(plotting.label(HUE))
    T = int(best["T"].max())
    ax_t0.axhline(T, color=plotting.REFERENCE_COLOR, linestyle=":", linewidth=0.8)
    ax_t0.set_ylabel(r"best warm-up $T_0^{\mathrm{best}}$")
    ax_gain.set_ylabel(r"gain $1 - R(T_0^{\mathrm{best}})/R(T)$ (%)")
    k, n = earlier_at_highest(best)
    ax_t0.set_title(rf"earlier at $\zeta_V = {levels[-1]:g}$ than at {levels[0]:g} in {k}/{n} instances")
    ax_gain.set_title("gain over FedAvg (same step, not tuned)")
    plotting.legend_below(fig, [Line2D([], [], color=plotting.INSTANCE_COLOR, marker="o", markersize=2,
                                       linewidth=0.6, label="one instance (seed)"),
                                Line2D([], [], color=plotting.STATISTIC_COLOR, marker="D", markersize=4,
                                       linewidth=2, label="median over instances"),
                                Line2D([], [], color=plotting.INSTANCE_COLOR, marker="o", markersize=4,
                                       markerfacecolor="none", linestyle="none",
                                       label=f"chaotic instance ({int(best['chaotic'].sum())})"),
                                Line2D([], [], color=plotting.REFERENCE_COLOR, linestyle=":", linewidth=0.8,
                                       label=rf"$T_0 = T = {T}$: plain FedAvg")], ncols=4)
    fig.suptitle("; ".join(filter(None, ["points coloured by the heterogeneity level",
                                         plotting.left_out_text(len(left_out))])))
    data = best.rename(columns={HUE: "zeta_value"})[["zeta_value", "seed", "best_T0", "R_best", "R_fedavg",
                                                     "gain", "T", "diverged_runs", "chaotic", "amplification"]]
    return plotting.save_figure(fig, NAME, out_dir, data)


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
