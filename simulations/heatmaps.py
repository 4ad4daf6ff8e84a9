"""Figure 4: where freezing pays, over heterogeneity ζ_V and local steps E, over many instances.

Claim (docs/theory.md §6): the drift a warm-up accumulates grows with the heterogeneity and the
number of local steps (leading order η²(E−1)²ζ²), so the best warm-up length T0 shrinks and
FedFrozen's gain over plain FedAvg grows as ζ and E grow; with E = 1 there is no client drift
and nothing to gain. Every cell summarises its instances (seeds) one by one, with the
definitions of the headline (linattn_theory.report.sweep_analysis): left, the median per-instance best
warm-up T0_best (the smallest T0 of the grid minimising R(T0)); middle, the median per-instance
gain 1 − R(T0_best)/R(T); right, in how many instances that gain is above 2 % (a win).
The warm-up grid is figure 2's (T0 = 0, 2, …, T), and the instances of a cell are selected by the
rule of every figure (linattn_theory.report.sweep_analysis.select_instances: an instance whose FedAvg
run diverged is left out), so the E = 10 column repeats figure 2's numbers. Cells with diverged
runs are marked † (a diverged run of a kept instance counts as R = ∞), cells with chaotic instances
‡ (docs/theory.md §6: a 1e-12 move of θ⁰ moves the end of the instance's FedAvg run by more than
1e-5; linattn_theory.report.sweep_analysis.fedavg_chaos). Each map has its colour bar. FedAvg runs at
the sweep's one step, not tuned: the fair comparison is the phase diagram (figure 4b).
heatmaps.csv: per cell, the statistics of the maps and the median gain with a bootstrap 95 %
interval and the wins above 2 %, with and without the chaotic instances
(linattn_theory.report.sweep_analysis.gain_intervals); heatmaps_instances.csv: one row per instance
(best T0, R, gain, chaos flag and amplification), from which they are computed.

Config: simulations/configs/heatmaps.toml. Run: python simulations/heatmaps.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
from matplotlib.ticker import PercentFormatter

from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, excess_risk_sweep, script_main
from linattn_theory.report.sweep_analysis import gain_intervals, gain_summary

NAME = "heatmaps"
CONFIG = config_path(__file__, "heatmaps")
ROW, COL = "task.zeta_value", "federated.local_steps"
#: the columns of a cell the maps draw or note (a cell with none of them defined is not data)
MAP_COLUMNS = ["instances", "diverged_instances", "beats", "share_beats", "gain_median", "gain_q25", "gain_q75",
               "best_T0_median", "best_T0_q25", "best_T0_q75", "diverged_runs", "best_T0"]


def cell_summary(best: pd.DataFrame, left_out: pd.DataFrame) -> pd.DataFrame:
    """Per (ζ_V, E) over its instances: the gain summary of the headline, the diverged runs (of the
    kept and the left-out instances), the marked best warm-up ``best_T0`` (the median), then the
    chaotic instances, the gain's bootstrap interval and the wins above 2 %, with and without them
    (:func:`~linattn_theory.report.sweep_analysis.gain_intervals`; ``best`` has ``chaotic``)."""
    cells = gain_summary(best, [ROW, COL], left_out)
    diverged = pd.concat([best, left_out]).groupby([ROW, COL])["diverged_runs"].sum().rename("diverged_runs")
    cells = cells.join(diverged, on=[ROW, COL]).assign(best_T0=lambda c: c["best_T0_median"])
    intervals = gain_intervals(best, [ROW, COL]).drop(columns=["instances", "gain_median"])
    return cells.merge(intervals, on=[ROW, COL], how="left", validate="one_to_one")


def _heatmap(ax, cells, value, title, text, cmap, vmin=None, vmax=None, bar="", percent=False):
    grid = cells.pivot(index=ROW, columns=COL, values=value).sort_index(ascending=False)
    marks = cells.pivot(index=ROW, columns=COL, values="diverged_runs").sort_index(ascending=False)
    labels = cells.assign(_text=text).pivot(index=ROW, columns=COL, values="_text").sort_index(ascending=False)
    chaos = cells.pivot(index=ROW, columns=COL, values="chaotic_instances").sort_index(ascending=False)
    flags = marks.map(lambda k: "†" if k else "") + chaos.map(lambda k: "‡" if k else "")
    labels = labels + flags.map(lambda f: "\n" + f if f else "")      # the marks below the number: legible
    plotting.heatmap(ax, grid, annot=labels, fmt="", cmap=cmap, cbar=True, vmin=vmin, vmax=vmax,
                linewidths=0.5, linecolor="white", annot_kws={"fontsize": 7},
                cbar_kws={"label": bar, "shrink": 0.9, "pad": 0.03})
    if percent:
        ax.collections[0].colorbar.ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_yticklabels([f"{v:g}" for v in grid.index], rotation=0)
    ax.set_xlabel(r"local steps $E$")
    ax.set_ylabel(plotting.label(ROW) if ax.get_subplotspec().is_first_col() else "")
    ax.set_title(title)


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the three heatmaps, write heatmaps.png/.pdf/.csv; returns the paths."""
    table, best, left_out = excess_risk_sweep(CONFIG, out_dir, by=(ROW, COL, "seed"), quick=quick,
                                              executor=executor, workers=workers, progress=progress, chaos=True)
    cells = cell_summary(best, left_out)
    fig, (ax_best, ax_gain, ax_share) = plotting.figure(3, height=2.3, quick=quick)
    T = int(best["T"].max())
    grid = sorted(table["T0"].unique())
    _heatmap(ax_best, cells, "best_T0_median", r"best warm-up $T_0^{\mathrm{best}}$ (median)",
             [f"{v:g}" for v in cells["best_T0_median"]], "cividis", 0, T, bar=r"$T_0$")
    _heatmap(ax_gain, cells, "gain_median", r"gain $1 - R(T_0^{\mathrm{best}})/R(T)$ (median)",
             [f"{100 * v:.0f}%" if np.isfinite(v) else "n/a" for v in cells["gain_median"]], "Greens", 0,
             max(0.05, float(cells["gain_median"].max())), bar="gain", percent=True)
    _heatmap(ax_share, cells.assign(share_wins=cells["wins"] / cells["instances"]), "share_wins",
             "wins: gain above 2 % (instances)", [f"{b}/{n}" for b, n in zip(cells["wins"], cells["instances"])],
             "Greens", 0, 1, bar="share of instances", percent=True)
    seeds = int((cells["instances"] + cells["diverged_instances"]).max())
    note = (f"{seeds} instance{'s' if seeds != 1 else ''} (seeds) per cell; warm-ups "
            f"$T_0 = {int(grid[0])}, {int(grid[1])}, …, {T}$")
    if int(cells["diverged_runs"].sum()):
        note += "; † cell with diverged runs: " + (plotting.left_out_text(len(left_out))
                                                   or "no instance left out")
    second = "gain over FedAvg at the same step, not tuned"
    if int(cells["chaotic_instances"].sum()):
        second = f"‡ cell with chaotic instances ({int(cells['chaotic_instances'].sum())} in all); " + second
    fig.suptitle(note + "\n" + second)
    instances = best.rename(columns={ROW: "zeta_value", COL: "local_steps"})[
        ["zeta_value", "local_steps", "seed", "best_T0", "R_best", "R_fedavg", "gain", "T", "diverged_runs", "chaotic",
         "amplification"]]
    return (plotting.save_figure(fig, f"{NAME}_instances", out_dir, instances, formats=())   # the per-instance table
            + plotting.save_figure(fig, NAME, out_dir, cells.dropna(subset=MAP_COLUMNS)))   # "n/a" cells are not data


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
