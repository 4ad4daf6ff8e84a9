"""Figure 2 (headline): the final excess risk R(T0) against the warm-up length T0, over many instances.

Claim (docs/theory.md §6): with a budget of T rounds, R(T0) = F_λ(θ_T) − Φ*_λ trades the
kernel-profile bias (falls with T0) against the drift the heterogeneous local steps accumulate
(grows with T0), so it is U-shaped under heterogeneity, and the best warm-up moves earlier as the
heterogeneity ζ_V grows. Every statistic is over instances (a seed draws its own teacher, clients
and initialisation), paired within an instance:

- left: R(T0), median over instances with the interquartile range (IQR) as a band; dotted, the
  median of the bound U(T0) whose constants are fitted on each instance's own FedAvg run (an a
  posteriori fit, descriptive: not a prediction; linattn_theory.theory.bound);
- middle: the paired ratio R(T0) / R(T) (plain FedAvg = 1) of each instance, median and IQR; the
  bar at the top gives the per-instance best warm-up T0_best (median, IQR; ties to the smallest
  T0, linattn_theory.report.sweep_analysis.best_warmup);
- right: the gain 1 − R(T0_best)/R(T) of each instance (one dot each, the line is the median) and
  how many instances FedFrozen at its best T0 beats FedAvg in (tradeoff_gain.csv: per level, the
  share and the gain's median and quartiles).

Config: simulations/configs/tradeoff.toml. Run: python simulations/tradeoff.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linattn_theory.report.figures import config_path, script_main

NAME = "tradeoff"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"
INSTANCE = (HUE, "seed")



def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the figure, write tradeoff.png/.pdf/.csv; returns the paths."""
    import pandas as pd               # imported here: ``--help`` needs none of them
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    from linattn_theory.report import plotting
    from linattn_theory.report.figures import excess_risk_sweep
    from linattn_theory.report.sweep_analysis import gain_summary, paired_ratios

    table, best, left_out = excess_risk_sweep(CONFIG, out_dir, by=INSTANCE, bound=True, quick=quick,
                                              executor=executor, workers=workers, progress=progress)
    ratios = paired_ratios(table, INSTANCE)
    summary = gain_summary(best, HUE, left_out)
    fig, (ax, ax_rel, ax_gain) = plotting.figure(3, height=2.5, quick=quick)
    levels = sorted(table[HUE].unique())
    rows = []
    for i, level in enumerate(levels):
        style = plotting.heterogeneity_style(level)
        sub = table[table[HUE] == level]
        stats = plotting.instance_band(ax, sub, "T0", "excess_risk", color=style.color, label=style.label)
        fit = sub.groupby("T0")["U"].median()
        ax.plot(fit.index, fit.to_numpy(), ":", color=style.color, linewidth=1.1)
        rel = plotting.instance_band(ax_rel, ratios[ratios[HUE] == level], "T0", "ratio", color=style.color)
        s = summary[summary[HUE] == level].iloc[0]
        marked = {"median": s["best_T0_median"], "q25": s["best_T0_q25"], "q75": s["best_T0_q75"]}
        plotting.mark_best_T0(ax_rel, marked, color=style.color, row=i)
        inst = best[best[HUE] == level]
        gains = 100 * inst["gain"].to_numpy()
        ax_gain.plot(i + plotting.strip_offsets(gains), gains, "o", color=style.color, markersize=2.5, alpha=0.8)
        ax_gain.plot([i - 0.3, i + 0.3], [100 * s["gain_median"]] * 2, color=plotting.STATISTIC_COLOR, linewidth=1.2)
        ax_gain.text(i, 1.0, f"{int(s['beats'])}/{int(s['instances'])}", transform=blended_transform_factory(
            ax_gain.transData, ax_gain.transAxes), ha="center", va="bottom")
        labels = {"zeta_value": level, "best_T0": marked["median"], "best_T0_q25": marked["q25"],
                  "best_T0_q75": marked["q75"]}
        rows += [stats.assign(quantity="excess_risk", **labels),
                 plotting.curve_rows("T0", fit, int(stats["count"].max()), quantity="fitted_bound_U", **labels),
                 rel.assign(quantity="ratio_to_fedavg", **labels)]
    summary_rows = summary.rename(columns={HUE: "zeta_value"})
    plotting.log_scale(ax)
    plotting.log_scale(ax_rel)
    ax.set_xlabel(plotting.label("T0"))
    ax.set_ylabel(r"excess risk $R(T_0)$")
    ax.set_title(r"$R(T_0)$ per level")
    ax_rel.axhline(1.0, color=plotting.REFERENCE_COLOR, linewidth=0.8, linestyle="-")
    plotting.room_on_top(ax_rel, len(levels))
    ax_rel.set_xlabel(plotting.label("T0"))
    ax_rel.set_ylabel(r"$R(T_0)\,/\,R(T)$ per instance")
    ax_rel.set_title("paired, relative to FedAvg")
    ax_gain.set_xticks(range(len(levels)), [f"{level:g}" for level in levels])
    ax_gain.set_xlim(-0.6, len(levels) - 0.4)
    ax_gain.set_xlabel(plotting.label(HUE))
    ax_gain.set_ylabel(r"gain $1 - R(T_0^{\mathrm{best}})/R(T)$ (%)")
    ax_gain.set_title("beats FedAvg in", pad=10)
    extra = [Line2D([], [], linestyle=":", color=plotting.REFERENCE_COLOR,
                    label=r"$U(T_0)$: a posteriori fit (descriptive), median"),
             plotting.best_T0_handle(),
             Line2D([], [], marker="o", linestyle="none", color=plotting.REFERENCE_COLOR, markersize=2.5,
                    label="gain of one instance"),
             Line2D([], [], color=plotting.STATISTIC_COLOR, label="median gain")]
    handles, labels = ax.get_legend_handles_labels()
    plotting.legend_below(fig, handles + extra, labels + [h.get_label() for h in extra], ncols=4)
    fig.suptitle("; ".join(filter(None, ["bands: " + plotting.band_text(summary["instances"]) + " per level",
                                         plotting.left_out_text(len(left_out))])))
    gains = plotting.save_figure(fig, f"{NAME}_gain", out_dir, summary_rows, formats=())   # the right panel's summary
    return gains + plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
