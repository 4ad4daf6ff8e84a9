"""Figure 8: the warm-up as inexact descent on Φ_λ, round by round, with the gap split by source.

Claim (docs/theory.md §4): while the value block tracks its optimum, a warm-up round moves the
kernel along a preconditioned descent direction of the kernel-profile objective Φ_λ; the round
realises less decrease than the exact step predicts, and the gap splits exactly into the value
block's lag behind V*_λ(K^t), the drift of heterogeneous local steps, the averaging of W_Q and
W_K separately (the average of products is not the product of averages) and higher-order terms.
Top: realised change Φ_λ(K^{t+1}) − Φ_λ(K^t) and the predicted change (first order, exact
profile step), in the colour of the heterogeneity level; bottom: the inexactness of the round,
realised − predicted (black; docs/theory.md §4's name for it, the table's column `gap`), stacked by
source in shades of grey; one column per heterogeneity level, one instance (seed 0) each, as the
title says. Computed
by linattn_theory.theory.inexactness.warmup_inexactness, which replays each full-batch round.

Config: simulations/configs/warmup_inexactness.toml.
Run: python simulations/warmup_inexactness.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linattn_theory.report.figures import config_path, script_main

NAME = "warmup_inexactness"
CONFIG = config_path(__file__, "warmup_inexactness")
SOURCES = {"value_lag": "value lag", "client_drift": "client drift",
           "factor_averaging": r"factor averaging ($\bar W_Q \bar W_K^\top$)", "remainder": "higher order"}
#: the sources in shades of grey (colour is the heterogeneity level's, in the top row)
SOURCE_COLORS = ("0.4", "0.6", "0.76", "0.89")


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Replay the warm-up of each config, draw both rows, write warmup_inexactness.*; returns the paths.

    (``executor``/``workers`` are accepted for a uniform interface; the replays are cheap and run here.)
    """
    import pandas as pd               # imported here: ``--help`` needs none of them
    from matplotlib.lines import Line2D

    from linattn_theory.report import plotting
    from linattn_theory.sim.sweep import load_sweep
    from linattn_theory.theory.inexactness import warmup_inexactness

    sweep = load_sweep(CONFIG, quick=quick)
    tables = [warmup_inexactness(c).assign(zeta_value=c.task.zeta_value, seed=c.seed) for c in sweep.configs]
    fig, axes = plotting.figure(len(tables), 2, height=2.1, sharex="col", quick=quick)
    axes = axes.reshape(2, len(tables)) if len(tables) > 1 else axes.reshape(2, 1)
    for column, table in enumerate(tables):
        top, bottom = axes[0, column], axes[1, column]
        level = table["zeta_value"].iloc[0]
        color = plotting.heterogeneity_color(level)
        top.plot(table["round"], table["realised_change"], "o-", markersize=3, color=color,
                 label=r"realised $\Phi_\lambda(K^{t+1}) - \Phi_\lambda(K^t)$")
        top.plot(table["round"], table["predicted_change"], "s--", markersize=3, color=color,
                 markerfacecolor="white", label=r"predicted: exact profile step, first order")
        top.axhline(0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
        top.set_title(plotting.heterogeneity_label(level), color=color)
        plotting.stacked_bars(bottom, table["round"], {SOURCES[k]: table[k] for k in SOURCES},
                              SOURCE_COLORS)
        bottom.plot(table["round"], table["gap"], "o-", color="black", markersize=2.5, linewidth=1,
                    label="inexactness = realised − predicted")
        bottom.axhline(0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
        bottom.set_xlabel(plotting.label("round"))
    axes[0, 0].set_ylabel(r"change of $\Phi_\lambda$ per round")
    axes[1, 0].set_ylabel("inexactness, by source")
    seeds = sorted({int(t["seed"].iloc[0]) for t in tables})
    fig.suptitle(f"one instance per column (seed {', '.join(map(str, seeds))}); full batch, every client")
    handles, labels = axes[1, 0].get_legend_handles_labels()
    changes = [Line2D([], [], marker="o", markersize=3, color=plotting.REFERENCE_COLOR,
                      label=r"realised $\Phi_\lambda(K^{t+1}) - \Phi_\lambda(K^t)$"),
               Line2D([], [], marker="s", markersize=3, linestyle="--", color=plotting.REFERENCE_COLOR,
                      markerfacecolor="white", label="predicted: exact profile step, first order")]
    plotting.legend_below(fig, changes + handles, ncols=3)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(tables, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
