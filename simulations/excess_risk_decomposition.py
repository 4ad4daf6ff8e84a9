"""Figure 3: the excess risk R(T0) and its three parts as lines on one log axis, median over instances.

Claim (docs/theory.md §6): R(T0) = F_λ(θ_T) − Φ*_λ = bias(K_{T0}) + D(K_{T0}) +
[F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)] exactly. The kernel-profile bias falls with the warm-up,
the value drift floor D grows with it (the federated kernel accumulates client drift) and so, in
the end, does the unfinished optimisation (fewer frozen rounds remain; it contracts like
ρ^{T−T0}). Lines: the median over instances of R(T0) and of each part (the identity holds per
run, see excess_risk_decomposition.csv's identity_residual; medians need not add up, so the
R(T0) line is a median, not the sum of the parts' medians); the unfinished part can be negative in
a run (V_FA is not a minimiser) and its median is drawn only where it is positive. The vertical
line and band: the per-instance best warm-up T0_best (median, interquartile range), over the
instances of figure 2 (linattn_theory.report.sweep_analysis.select_instances). One panel per
heterogeneity level, in its colour; the line style names the part.

Config: simulations/configs/tradeoff.toml (the sweep of figure 2).
Run: python simulations/excess_risk_decomposition.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linattn_theory.report.figures import config_path, script_main

NAME = "excess_risk_decomposition"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"
PARTS = {"excess_risk": r"$R(T_0)$: its median, not a sum",
         "bias": "kernel-profile bias", "drift_floor": r"value drift floor $D(K_{T_0})$",
         "unfinished": "unfinished optimisation"}
STYLE = {"excess_risk": {"linestyle": "-", "linewidth": 2.2, "marker": "o"},
         "bias": {"linestyle": "-", "linewidth": 1.0, "marker": ""},
         "drift_floor": {"linestyle": "--", "linewidth": 1.2, "marker": ""},
         "unfinished": {"linestyle": ":", "linewidth": 1.4, "marker": ""}}


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the tradeoff sweep, draw the parts of R(T0) as lines, write excess_risk_decomposition.*."""
    import pandas as pd               # imported here: ``--help`` needs none of them
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from linattn_theory.report import plotting
    from linattn_theory.report.figures import excess_risk_sweep
    from linattn_theory.report.sweep_analysis import quartiles

    table, best, left_out = excess_risk_sweep(CONFIG, out_dir, by=(HUE, "seed"), quick=quick,
                                              executor=executor, workers=workers, progress=progress)
    stats = (table.groupby([HUE, "T0"])[list(PARTS) + ["identity_residual"]].median().reset_index())
    levels = sorted(stats[HUE].unique())
    fig, axes = plotting.figure(len(levels), height=2.5, sharey=True, quick=quick)
    axes = [axes] if len(levels) == 1 else axes
    marked = []
    for ax, level in zip(axes, levels):
        color = plotting.heterogeneity_color(level)
        sub = stats[stats[HUE] == level].sort_values("T0")
        for part in PARTS:
            shown = sub[sub[part] > 0]
            ax.plot(shown["T0"], shown[part], color=color, markersize=2, **STYLE[part])
        t0 = quartiles(best.loc[best[HUE] == level, "best_T0"])
        marked.append({HUE: level, "best_T0": t0["median"], "best_T0_q25": t0["q25"], "best_T0_q75": t0["q75"]})
        ax.axvspan(t0["q25"], t0["q75"], color="0.88", linewidth=0, zorder=0)
        ax.axvline(t0["median"], color=plotting.REFERENCE_COLOR, linestyle="-.", linewidth=1.0)
        plotting.log_scale(ax)
        ax.set_title(rf"$\zeta_V = {level:g}$ ({t0['count']} instances)", color=color)
        ax.set_xlabel(plotting.label("T0"))
    axes[0].set_ylabel("median over instances")
    handles = [Line2D([], [], color=plotting.REFERENCE_COLOR, markersize=2, label=name, **STYLE[part])
               for part, name in PARTS.items()]
    handles.append(Patch(facecolor="0.88", edgecolor=plotting.REFERENCE_COLOR, linestyle="-.",
                         label=plotting.BEST_T0_LABEL))
    fig.suptitle("; ".join(filter(None, [r"the parts of $R(T_0)$, median over the instances of figure 2",
                                         plotting.left_out_text(len(left_out))])))
    plotting.legend_below(fig, handles, ncols=3)
    data = stats.merge(pd.DataFrame(marked), on=HUE).rename(columns={HUE: "zeta_value"})
    return plotting.save_figure(fig, NAME, out_dir, data)


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
