"""Figure softmax_static_heads: which softmax heads could be static, and what making them static costs.

Claim (docs/theory.md §9, §7): a softmax head whose attention pattern hardly varies with the input
(small mean KL divergence ``E KL(a_h ‖ ā_h)`` to its mean pattern ``ā_h``, small pattern variance
``E‖a_h − ā_h‖²``) can be replaced by that mean pattern at little loss — the selective-freezing
criteria of the static-heads question. For every head of FedAvg-trained softmax layers (four heads,
planted-kernel clients with positional structure, three concept-heterogeneity levels ζ_V, four
seeds): left, the mean KL across clients against the loss change ``F(θ with head h static at ā_h)
− F(θ)`` relative to ``F(θ)`` (``W_V`` unchanged); right, the same with the pattern variance.
Colours: heterogeneity. Small markers: the same measures within each client (its own mean
pattern). The titles give the rank correlation of criterion and loss change across clients.

Config: simulations/configs/softmax_static_heads.toml. Run: python simulations/softmax_static_heads.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from linattn_theory.report import plotting
from linattn_theory.sim.engine import clients_from_config
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.theory.static_heads import head_pattern_statistics
from linattn_theory.report.sweep_analysis import runs_by_instance

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


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw both panels, write softmax_static_heads.*; returns the paths."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    table = head_table(folder, results)
    table["relative_loss_change"] = table["loss_change"] / table["loss"]
    fig, axes = plotting.figure(2, quick=quick)
    levels = sorted(table[HUE].unique())
    across = table[table["client"] == -1]
    within = table[table["client"] >= 0]
    for ax, criterion in zip(axes, ("mean_kl", "pattern_variance")):
        for level, color in zip(levels, plotting.palette(len(levels))):
            mine = within[within[HUE] == level]
            ax.plot(mine[criterion], mine["relative_loss_change"], ".", color=color, markersize=2.5,
                    alpha=0.35)
            mine = across[across[HUE] == level]
            ax.plot(mine[criterion], mine["relative_loss_change"], "o", color=color, markersize=6,
                    markeredgecolor="black", markeredgewidth=0.5, label=rf"$\zeta_V = {level:g}$")
        rho = spearmanr(across[criterion], across["relative_loss_change"]).statistic
        plotting.log_scale(ax, "x")
        ax.set_yscale("symlog", linthresh=LINEAR_RANGE)
        ax.axhline(0.0, color="0.4", linewidth=1, linestyle=":")
        ax.set_ylabel(r"$\Delta F / F$, head made static at $\bar a_h$")
        ax.set_title(f"Spearman ρ = {rho:.2f} across clients", fontsize="medium")
    axes[0].set_xlabel(r"mean KL $E\,\mathrm{KL}(a_h \,\|\, \bar a_h)$")
    axes[1].set_xlabel(r"pattern variance $E\|a_h - \bar a_h\|^2$")
    axes[0].legend(loc="upper left")
    plotting.note_dropped(axes[0], dropped)
    columns = ["run_id", "seed", HUE, "head", "client", "mean_kl", "pattern_variance", "loss_change",
               "loss", "relative_loss_change"]
    return plotting.save_figure(fig, NAME, out_dir, table[columns])


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
