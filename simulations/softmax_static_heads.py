"""Figure softmax_static_heads: which softmax heads could be static, and what making them static costs.

Claim (docs/theory.md §9, §7): a softmax head whose attention pattern hardly varies with the input
(small mean KL divergence ``E KL(a_h ‖ ā_h)`` to its mean pattern ``ā_h``, small pattern variance
``E‖a_h − ā_h‖²``) can be replaced by that mean pattern at little loss — the selective-freezing
criteria of the static-heads question. For every head of FedAvg-trained softmax layers (four heads,
planted-kernel clients with positional structure, three concept-heterogeneity levels ζ_V, eight
seeds): left, the mean KL across clients against the loss change ``F(θ with head h static at ā_h)
− F(θ)`` relative to ``F(θ)`` (``W_V`` unchanged); middle, the same with the pattern variance.
Colours: the heterogeneity level. Large markers: one head of one trained model, its patterns
pooled across clients; small markers: the same measures within each client (its own mean
pattern). Right: per level and criterion, Spearman's rank correlation of criterion and loss change
across clients, with a 95 % bootstrap interval that resamples instances (seeds:
linattn_theory.report.sweep_analysis.spearman_interval); a negative ρ means the heads that vary least
cost most to make static.

Config: simulations/configs/softmax_static_heads.toml. Run: python simulations/softmax_static_heads.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd
from matplotlib.lines import Line2D

from linattn_theory.report import plotting
from linattn_theory.sim.engine import clients_from_config
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.theory.static_heads import head_pattern_statistics
from linattn_theory.report.sweep_analysis import runs_by_instance, spearman_interval

NAME = "softmax_static_heads"
CONFIG = config_path(__file__, "softmax_static_heads")
HUE = "zeta_value"
LINEAR_RANGE = 0.01    # the relative loss change is drawn on a symmetric log axis, linear within ±1 %


def head_table(folder, results) -> pd.DataFrame:
    """One row per (run, head, client) with the three measures at the run's final parameters."""
    rows = []
    for _, runs in runs_by_instance(folder, results):
        clients = clients_from_config(next(iter(runs.values()))[0])    # the samples themselves
        for rid, (config, run) in runs.items():
            if run.diverged:
                continue
            stats = head_pattern_statistics(run.params, clients, config.model.temperature)
            rows.append(stats.assign(run_id=rid, seed=config.seed, zeta_value=config.task.zeta_value))
    return pd.concat(rows, ignore_index=True)


#: the two selective-freezing criteria: column -> (axis label, marker of its ρ)
CRITERIA = {"mean_kl": (r"mean KL $E\,\mathrm{KL}(a_h \,\|\, \bar a_h)$", "o"),
            "pattern_variance": (r"pattern variance $E\|a_h - \bar a_h\|^2$", "s")}


def level_correlations(across: pd.DataFrame) -> pd.DataFrame:
    """Per ζ_V and criterion: Spearman's ρ with the loss change, and its bootstrap interval over instances."""
    rows = []
    for level, sub in across.groupby(HUE):
        for criterion in CRITERIA:
            rho = spearman_interval(sub[criterion], sub["relative_loss_change"], sub["run_id"])
            rows.append({HUE: level, "criterion": criterion, "spearman": rho["rho"], "spearman_low": rho["low"],
                         "spearman_high": rho["high"], "instances": rho["instances"], "heads": rho["pairs"]})
    return pd.DataFrame(rows)


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the three panels, write softmax_static_heads.* (and the
    per-level correlations, softmax_static_heads_summary.csv); returns the paths."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    table = head_table(folder, results)
    table["relative_loss_change"] = table["loss_change"] / table["loss"]
    fig, axes = plotting.figure(3, height=2.6, quick=quick)
    levels = sorted(table[HUE].unique())
    across = table[table["client"] == -1]
    within = table[table["client"] >= 0]
    for ax, (criterion, (xlabel, _)) in zip(axes, CRITERIA.items()):
        for level in levels:
            color = plotting.heterogeneity_color(level)
            mine = within[within[HUE] == level]
            ax.plot(mine[criterion], mine["relative_loss_change"], ".", color=color, markersize=2.5, alpha=0.35)
            mine = across[across[HUE] == level]
            ax.plot(mine[criterion], mine["relative_loss_change"], "o", color=color, markersize=5,
                    markeredgecolor="black", markeredgewidth=0.5)
        plotting.log_scale(ax, "x")
        plotting.symlog_scale(ax, LINEAR_RANGE)
        ax.axhline(0.0, color=plotting.REFERENCE_COLOR, linewidth=1, linestyle=":")
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(r"$\Delta F / F$, head made static at $\bar a_h$")
    axes[0].set_title("criterion 1: mean KL")
    axes[1].set_title("criterion 2: pattern variance")
    summary = level_correlations(across)
    ax_rho = axes[2]
    for i, level in enumerate(levels):
        color = plotting.heterogeneity_color(level)
        for j, (criterion, (_, marker)) in enumerate(CRITERIA.items()):
            r = summary[(summary[HUE] == level) & (summary["criterion"] == criterion)].iloc[0]
            x = i + (j - 0.5) * 0.3
            ax_rho.errorbar([x], [r["spearman"]], yerr=[[r["spearman"] - r["spearman_low"]],
                                                        [r["spearman_high"] - r["spearman"]]],
                            fmt=marker, color=color, markersize=4.5, capsize=2.5, linewidth=1.1)
    ax_rho.axhline(0.0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
    ax_rho.set_ylim(-1.05, 1.05)
    ax_rho.set_xlim(-0.6, len(levels) - 0.4)
    ax_rho.set_xticks(range(len(levels)), [f"{v:g}" for v in levels])
    ax_rho.set_xlabel(plotting.label("task.zeta_value"))
    ax_rho.set_ylabel(r"Spearman $\rho$, 95 % interval")
    ax_rho.set_title(r"$\rho$(criterion, $\Delta F/F$) per level")
    fig.suptitle(f"{int(summary['instances'].max())} instances (seeds) per level, "
                 f"{across['head'].nunique()} heads each, FedAvg-trained softmax attention")
    handles = [Line2D([], [], linestyle="none", marker="o", color=plotting.heterogeneity_color(level),
                      markeredgecolor="black", markeredgewidth=0.5, markersize=5,
                      label=plotting.heterogeneity_label(level)) for level in levels]
    handles += [Line2D([], [], linestyle="none", marker="o", color=plotting.INSTANCE_COLOR, markeredgecolor="black",
                       markeredgewidth=0.5, markersize=5, label="large: one head, pooled over clients"),
                Line2D([], [], linestyle="none", marker=".", color=plotting.INSTANCE_COLOR, markersize=4,
                       label="small: one head within one client")]
    handles += [Line2D([], [], linestyle="none", marker=marker, color=plotting.REFERENCE_COLOR, markersize=4.5,
                       label=rf"$\rho$ of criterion {k}") for k, (_, marker) in enumerate(CRITERIA.values(), 1)]
    plotting.legend_below(fig, handles, ncols=4)
    plotting.note_dropped(axes[0], dropped)
    columns = ["run_id", "seed", HUE, "head", "client", "mean_kl", "pattern_variance", "loss_change",
               "loss", "relative_loss_change"]
    paths = plotting.save_figure(fig, f"{NAME}_summary", out_dir, summary, formats=())
    return paths + plotting.save_figure(fig, NAME, out_dir, table[columns])


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
