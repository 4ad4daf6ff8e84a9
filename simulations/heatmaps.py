"""Figure 4: where freezing pays, over heterogeneity ζ_V and local steps E.

Claim (docs/theory.md §6): the drift a warm-up accumulates grows with the heterogeneity and the
number of local steps (leading order η²(E−1)²ζ²), so the best warm-up length T0 shrinks and
FedFrozen's gain over plain FedAvg grows as ζ and E grow; with E = 1 there is no client drift
and nothing to gain. Left: the best T0 (argmin over the T0 grid of the seed-mean excess risk
R(T0)); right: the gain 1 − R(T0_best)/R(T), the share of FedAvg's excess risk that freezing
at the best T0 removes. Cells where some runs diverged are marked †.

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
import seaborn as sns

from linattn_theory import plotting
from linattn_theory.figures import config_path, figure_sweep, script_main
from linattn_theory.sweep_analysis import excess_risk_table

NAME = "heatmaps"
CONFIG = config_path(__file__, "heatmaps")
ROW, COL = "task.zeta_value", "federated.local_steps"


def cell_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per (ζ_V, E): best T0, R at the best T0 and at T (seed means), gain, diverged runs."""
    rows = []
    for (zeta, E), cell in table.groupby([ROW, COL]):
        T = int(cell["federated.rounds"].max())
        ok = cell[~cell["diverged"]]
        mean = ok.groupby("T0")["excess_risk"].mean()
        complete = ok.groupby("T0")["seed"].nunique() == cell["seed"].nunique()
        mean = mean[complete]            # compare T0s only over the same seeds
        row = {ROW: zeta, COL: E, "diverged_runs": int(cell["diverged"].sum()),
               "best_T0": np.nan, "R_best": np.nan, "R_fedavg": np.nan, "gain": np.nan}
        if len(mean):
            row.update(best_T0=float(mean.idxmin()), R_best=float(mean.min()))
        if T in mean.index:
            row.update(R_fedavg=float(mean.loc[T]), gain=1.0 - float(mean.min()) / float(mean.loc[T]))
        rows.append(row)
    return pd.DataFrame(rows)


def _heatmap(ax, cells, value, title, fmt, cmap, unit):
    grid = cells.pivot(index=ROW, columns=COL, values=value).sort_index(ascending=False)
    marks = cells.pivot(index=ROW, columns=COL, values="diverged_runs").sort_index(ascending=False)
    text = grid.map(lambda v: "n/a" if not np.isfinite(v) else format(v, fmt))
    text = text + marks.map(lambda k: " †" if k else "")
    sns.heatmap(grid, ax=ax, annot=text, fmt="", cmap=cmap, cbar_kws={"label": unit},
                linewidths=0.5, linecolor="white")
    ax.set_xlabel(plotting.label(COL))
    ax.set_ylabel(plotting.label(ROW))
    ax.set_title(title)


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw both heatmaps, write heatmaps.png/.pdf/.csv; returns the paths."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    cells = cell_summary(excess_risk_table(folder, results))
    fig, (ax_best, ax_gain) = plotting.figure(2, width=4.9, height=3.9)
    _heatmap(ax_best, cells, "best_T0", r"best warm-up $T_0^{\mathrm{best}}$", ".0f", "mako",
             r"$T_0$ (rounds)")
    _heatmap(ax_gain, cells.assign(gain=100 * cells["gain"]), "gain",
             r"gain over FedAvg $1 - R(T_0^{\mathrm{best}})/R(T)$", ".0f", "rocket_r", "%")
    dropped = int(cells["diverged_runs"].sum())
    if dropped:
        fig.text(0.5, -0.02, f"† cell with diverged runs ({dropped} in all), left out of its seed means",
                 ha="center", fontsize="small", color="0.35")
    return plotting.save_figure(fig, NAME, out_dir, cells.dropna())   # "n/a" cells are not data


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
