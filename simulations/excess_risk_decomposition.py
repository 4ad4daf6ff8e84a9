"""Figure 3: the excess risk R(T0) split exactly into kernel bias, value drift floor and unfinished optimisation.

Claim (docs/theory.md §6): R(T0) = F_λ(θ_T) − Φ*_λ = bias(K_{T0}) + D(K_{T0}) +
[F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)]. The bias falls with the warm-up, the drift floor grows
with it (the federated kernel accumulates client drift), and the unfinished optimisation grows
as fewer frozen rounds remain (it contracts like ρ^{T−T0}); it may be negative, since V_FA is
not a minimiser. Bars: the three parts (seed means, negative parts below zero); black line: the
measured R(T0), which the bars add up to. One panel per heterogeneity level.

Config: simulations/configs/tradeoff.toml (the sweep of figure 2).
Run: python simulations/excess_risk_decomposition.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from linattn_theory import plotting
from linattn_theory.figures import config_path, figure_sweep, script_main
from linattn_theory.sweep_analysis import excess_risk_table

NAME = "excess_risk_decomposition"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"
PARTS = ("bias", "drift_floor", "unfinished")


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the tradeoff sweep, draw the stacked decomposition, write excess_risk_decomposition.*."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    table, dropped = plotting.drop_diverged(excess_risk_table(folder, results))
    means = table.groupby([HUE, "T0"])[["excess_risk", *PARTS]].mean().reset_index()
    levels = sorted(means[HUE].unique())
    fig, axes = plotting.figure(len(levels), width=4.2, height=3.6, sharey=False)
    axes = [axes] if len(levels) == 1 else axes
    colors = plotting.palette(len(PARTS) + 1)[1:]
    for ax, level in zip(axes, levels):
        sub = means[means[HUE] == level].sort_values("T0")
        step = sub["T0"].diff().min() if len(sub) > 1 else 1.0
        plotting.stacked_bars(ax, sub["T0"], {plotting.label(p): sub[p] for p in PARTS}, colors,
                              width=0.8 * step)
        ax.plot(sub["T0"], sub["excess_risk"], "o-", color="black", markersize=3,
                label=r"measured $R(T_0)$")
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set_title(rf"$\zeta_V = {level:g}$")
        ax.set_xlabel(plotting.label("T0"))
    axes[0].set_ylabel(plotting.label("excess_risk"))
    axes[0].legend(loc="upper right", fontsize="small")
    plotting.note_dropped(axes[-1], dropped)
    return plotting.save_figure(fig, NAME, out_dir, means)


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
