"""Figure tradeoff_attention: the warm-up trade-off for linear and softmax attention on the same clients.

Claim (docs/theory.md §9, §6): for linear attention R(T0) = F_λ(θ_T) − Φ*_λ is U-shaped in the
warm-up length under heterogeneity (figure 2); whether the softmax layer shows the same trade-off
is an empirical question. The statistics are figure 2's, for each attention: per instance (seed) the
paired ratio R(T0)/R(T) against the FedAvg run of the same instance (Φ*_λ computed for each
attention by linattn_theory.theory.profile.centralized_optimum on the softmax features where the layer is
softmax), its median and interquartile range over instances, the per-instance best warm-up
(diamond: median, bar: IQR) and the gain 1 − R(T0_best)/R(T) (right: one dot per instance, the line
the median). One panel per heterogeneity level, colours: the attention. The instances are selected
by the rule of every figure (linattn_theory.report.sweep_analysis.select_instances), and the linear runs
are figure 2's runs of the same seeds. FedAvg runs at the sweep's one step, not tuned (the fair
comparison is the phase diagram, figure 4b). tradeoff_attention_instances.csv: one row per instance
(best T0, R, gain, and whether its FedAvg run is chaotic, docs/theory.md §6:
linattn_theory.report.sweep_analysis.fedavg_chaos); chaotic instances are open dots in the gain panel.

Config: simulations/configs/tradeoff_attention.toml. Run: python simulations/tradeoff_attention.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linattn_theory.report.figures import config_path, script_main

NAME = "tradeoff_attention"
CONFIG = config_path(__file__, "tradeoff_attention")
HUE = "task.zeta_value"
ATTENTION = "model.attention"
INSTANCE = (ATTENTION, HUE, "seed")



def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the panels, write tradeoff_attention.*; returns the paths."""
    import pandas as pd               # imported here: ``--help`` needs none of them
    from matplotlib.lines import Line2D

    from linattn_theory.report import plotting
    from linattn_theory.report.figures import analysis_workers, figure_sweep
    from linattn_theory.report.sweep_analysis import (excess_risk_table, fedavg_chaos, gain_summary, paired_ratios,
                                                      select_instances)

    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    processes = analysis_workers(executor, workers)
    table = excess_risk_table(folder, results, workers=processes)
    table = table.assign(**{ATTENTION: table[ATTENTION].fillna("linear")})      # linear records none
    runs, best, left_out = select_instances(table, INSTANCE)
    best = best.merge(fedavg_chaos(folder, table, INSTANCE, workers=processes), on=list(INSTANCE), how="left",
                      validate="one_to_one")
    ratios = paired_ratios(runs, INSTANCE)
    summary = gain_summary(best, [ATTENTION, HUE], left_out)
    levels = sorted(table[HUE].unique())
    attentions = [a for a in plotting.ATTENTION if a in set(table[ATTENTION])]
    fig, axes = plotting.figure(len(levels) + 1, height=2.6, quick=quick)
    ax_gain, rows = axes[-1], []
    for ax, level in zip(axes, levels):
        for row, attention in enumerate(attentions):
            style = plotting.ATTENTION[attention]
            mine = ratios[(ratios[ATTENTION] == attention) & (ratios[HUE] == level)]
            stats = plotting.instance_band(ax, mine, "T0", "ratio", color=style.color, label=style.label,
                                           marker=style.marker, linestyle=style.linestyle)
            s = summary[(summary[ATTENTION] == attention) & (summary[HUE] == level)].iloc[0]
            marked = {"median": s["best_T0_median"], "q25": s["best_T0_q25"], "q75": s["best_T0_q75"]}
            plotting.mark_best_T0(ax, marked, color=style.color, row=row)
            rows.append(stats.assign(attention=attention, zeta_value=level, best_T0=marked["median"],
                                     best_T0_q25=marked["q25"], best_T0_q75=marked["q75"],
                                     gain_median=s["gain_median"], beats=s["beats"], instances=s["instances"]))
        ax.axhline(1.0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
        plotting.log_scale(ax)
        plotting.room_on_top(ax, len(attentions))
        ax.set_title(plotting.heterogeneity_label(level), color=plotting.heterogeneity_color(level))
        ax.set_xlabel(plotting.label("T0"))
    axes[0].set_ylabel(r"$R(T_0)\,/\,R(T)$ per instance")
    width = 0.35
    for i, level in enumerate(levels):
        for j, attention in enumerate(attentions):
            style, x = plotting.ATTENTION[attention], i + (j - (len(attentions) - 1) / 2) * width
            mine = best[(best[ATTENTION] == attention) & (best[HUE] == level)]
            gains, calm = 100 * mine["gain"].to_numpy(), ~mine["chaotic"].to_numpy(dtype=bool)
            s = summary[(summary[ATTENTION] == attention) & (summary[HUE] == level)].iloc[0]
            xs = x + plotting.strip_offsets(gains, 0.25)
            ax_gain.plot(xs[calm], gains[calm], style.marker, color=style.color, markersize=2.5, alpha=0.8)
            ax_gain.plot(xs[~calm], gains[~calm], style.marker, color=style.color, markersize=3.5,
                         markerfacecolor="none", alpha=0.8)                      # chaotic: open
            ax_gain.plot([x - 0.15, x + 0.15], [100 * s["gain_median"]] * 2, color=plotting.STATISTIC_COLOR,
                         linewidth=1.2)
    ax_gain.set_xticks(range(len(levels)), [f"{v:g}" for v in levels])
    ax_gain.set_xlim(-0.6, len(levels) - 0.4)
    ax_gain.set_xlabel(plotting.label(HUE))
    ax_gain.set_ylabel(r"gain $1 - R(T_0^{\mathrm{best}})/R(T)$ (%)")
    ax_gain.set_title("gain over FedAvg, not tuned")
    counts = summary.groupby(ATTENTION)["instances"].min()
    fig.suptitle("; ".join(filter(None, ["bands: " + plotting.band_text(int(counts.min())) + " per level",
                                         plotting.left_out_text(len(left_out))])))
    handles = [Line2D([], [], marker=plotting.ATTENTION[a].marker, color=plotting.ATTENTION[a].color,
                      linestyle=plotting.ATTENTION[a].linestyle, markersize=3, label=plotting.ATTENTION[a].label)
               for a in attentions]
    handles += [plotting.best_T0_handle(),
                Line2D([], [], color=plotting.STATISTIC_COLOR, label="median gain (dot: instance; open: chaotic)")]
    plotting.legend_below(fig, handles, ncols=4)
    instances = best.rename(columns={ATTENTION: "attention", HUE: "zeta_value"})[
        ["attention", "zeta_value", "seed", "best_T0", "R_best", "R_fedavg", "gain", "T", "diverged_runs", "chaotic",
         "amplification"]]
    return (plotting.save_figure(fig, f"{NAME}_instances", out_dir, instances, formats=())    # the per-instance table
            + plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True)))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
