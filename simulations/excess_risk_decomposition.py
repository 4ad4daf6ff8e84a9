"""Figure 3: the excess risk R(T0) and its three parts as lines on one log axis, median over instances.

Claim (docs/theory.md §6): R(T0) = F_λ(θ_T) − Φ*_λ = bias(K_{T0}) + D(K_{T0}) +
[F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)] exactly. The kernel-profile bias falls with the warm-up,
the value drift floor D grows with it (the federated kernel accumulates client drift) and so, in
the end, does the unfinished optimisation (fewer frozen rounds remain; it contracts like
ρ^{T−T0}). Lines: the median over instances of each part and of their sum R(T0) (medians do not
add up exactly; the identity holds per run, see excess_risk_decomposition.csv's
identity_residual); the unfinished part can be negative in a run (V_FA is not a minimiser) and
its median is drawn only where it is positive. The vertical line and band: the per-instance best
warm-up T0_best (median, interquartile range). One panel per heterogeneity level.

Config: simulations/configs/tradeoff.toml (the sweep of figure 2).
Run: python simulations/excess_risk_decomposition.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, excess_risk_sweep, script_main
from linattn_theory.report.sweep_analysis import quartiles

NAME = "excess_risk_decomposition"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"
PARTS = {"excess_risk": r"$R(T_0)$ (sum)", "bias": "kernel-profile bias",
         "drift_floor": r"value drift floor $D(K_{T_0})$", "unfinished": "unfinished optimisation"}
STYLE = {"excess_risk": {"color": "black", "linewidth": 1.8}, "bias": {"linestyle": "-"},
         "drift_floor": {"linestyle": "--"}, "unfinished": {"linestyle": "-."}}


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the tradeoff sweep, draw the parts of R(T0) as lines, write excess_risk_decomposition.*."""
    table, best, dropped = excess_risk_sweep(CONFIG, out_dir, by=(HUE, "seed"), quick=quick,
                                             executor=executor, workers=workers, progress=progress)
    stats = (table.groupby([HUE, "T0"])[list(PARTS) + ["identity_residual"]].median().reset_index())
    levels = sorted(stats[HUE].unique())
    fig, axes = plotting.figure(len(levels), height=2.5, sharey=True, quick=quick)
    axes = [axes] if len(levels) == 1 else axes
    colors = dict(zip(list(PARTS)[1:], plotting.palette(len(PARTS))[1:]))
    for ax, level in zip(axes, levels):
        sub = stats[stats[HUE] == level].sort_values("T0")
        for part, name in PARTS.items():
            shown = sub[sub[part] > 0]
            ax.plot(shown["T0"], shown[part], marker="o", markersize=2, label=name,
                    **{"color": colors.get(part), **STYLE[part]})
        t0 = quartiles(best.loc[best[HUE] == level, "best_T0"])
        ax.axvspan(t0["q25"], t0["q75"], color="0.85", linewidth=0, zorder=0)
        ax.axvline(t0["median"], color="0.3", linestyle=":", linewidth=1.2,
                   label=r"best $T_0$ per instance: median, IQR")
        plotting.log_scale(ax)
        ax.set_title(rf"$\zeta_V = {level:g}$")
        ax.set_xlabel(plotting.label("T0"))
    axes[0].set_ylabel("median over instances")
    n = int(best.groupby(HUE)["seed"].nunique().max())
    fig.suptitle("; ".join(filter(None, [rf"the parts of $R(T_0)$, median over {n} instances per level",
                                         plotting.dropped_text(dropped)])))
    plotting.legend_below(fig, ncols=3)
    return plotting.save_figure(fig, NAME, out_dir, stats.rename(columns={HUE: "zeta_value"}))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
