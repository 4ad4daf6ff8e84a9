"""Figure 2 (headline): the final excess risk R(T0) against the warm-up length T0.

Claim (docs/theory.md §6): with a budget of T rounds, R(T0) = F_λ(θ_T) − Φ*_λ trades the
kernel-profile bias (falls with T0) against the drift the heterogeneous local steps accumulate
(grows with T0), so it is U-shaped under heterogeneity, and the best warm-up moves earlier as the
heterogeneity ζ grows. Left: R(T0) (mean over seeds, band from the smallest to the largest
seed); right: R(T0) / R(T), the excess risk relative to plain FedAvg (T0 = T) of the same seed.
Stars mark the empirical best T0 of the seed-mean curve; dotted lines the bound U(T0) ≥ R(T0)
and dashed lines the warm-up it recommends, T0_theory = argmin U(T0) (linattn_theory.bound;
seed mean and median).

Config: simulations/configs/tradeoff.toml. Run: python simulations/tradeoff.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd
from matplotlib.lines import Line2D

from linattn_theory import plotting
from linattn_theory.figures import config_path, figure_sweep, script_main
from linattn_theory.sweep_analysis import excess_risk_table

NAME = "tradeoff"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"


def relative_to_fedavg(table: pd.DataFrame) -> pd.DataFrame:
    """``R(T0) / R(T)`` per (heterogeneity, seed): the excess risk relative to plain FedAvg."""
    T = table["federated.rounds"].max()
    fedavg = table[table["T0"] == T].set_index([HUE, "seed"])["excess_risk"].rename("fedavg")
    joined = table.join(fedavg, on=[HUE, "seed"])
    return joined.assign(relative=joined["excess_risk"] / joined["fedavg"]).dropna(subset=["relative"])


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the figure, write tradeoff.png/.pdf/.csv; returns the paths."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    table, dropped = plotting.drop_diverged(excess_risk_table(folder, results, bound=True))
    relative = relative_to_fedavg(table)
    fig, (ax, ax_rel) = plotting.figure(2)
    levels = sorted(table[HUE].unique())
    rows = []
    for level, color in zip(levels, plotting.palette(len(levels))):
        name = rf"$\zeta_V = {level:g}$"
        stats = plotting.seed_band(ax, table[table[HUE] == level], "T0", "excess_risk",
                                   color=color, label=name)
        bound = table[table[HUE] == level].groupby("T0")["U"].mean()
        ax.plot(bound.index, bound.to_numpy(), ":", color=color, linewidth=1.3)
        best = stats.loc[stats["mean"].idxmin()]
        ax.plot(best["T0"], best["mean"], marker="*", markersize=13, color=color,
                markeredgecolor="black", linestyle="none")
        rel = plotting.seed_band(ax_rel, relative[relative[HUE] == level], "T0", "relative",
                                 color=color, label=name)
        rel_best = rel.loc[rel["mean"].idxmin()]
        ax_rel.plot(rel_best["T0"], rel_best["mean"], marker="*", markersize=13, color=color,
                    markeredgecolor="black", linestyle="none")
        theory = float(table.loc[table[HUE] == level, "T0_theory"].median())
        for a in (ax, ax_rel):
            a.axvline(theory, color=color, linestyle="--", linewidth=1.2)
        labels = {"zeta_value": level, "best_T0": best["T0"], "T0_theory": theory}
        rows += [stats.assign(quantity="excess_risk", **labels),
                 plotting.curve_rows("T0", bound, int(stats["count"].max()), quantity="bound_U", **labels),
                 rel.assign(quantity="relative_to_fedavg", **dict(labels, best_T0=rel_best["T0"]))]
    plotting.log_scale(ax)
    ax.set_xlabel(plotting.label("T0"))
    ax.set_ylabel(plotting.label("excess_risk"))
    ax.set_title(r"excess risk after $T$ rounds")
    ax_rel.axhline(1.0, color="0.4", linewidth=1, linestyle=":")
    ax_rel.set_xlabel(plotting.label("T0"))
    ax_rel.set_ylabel(r"$R(T_0)\,/\,R(T)$  (FedAvg $= 1$)")
    ax_rel.set_title("relative to plain FedAvg")
    star = Line2D([], [], marker="*", markersize=11, color="0.5", markeredgecolor="black",
                  linestyle="none", label=r"best $T_0$ (seed mean)")
    dotted = Line2D([], [], linestyle=":", color="0.4", label=r"bound $U(T_0)$ (seed mean)")
    dashed = Line2D([], [], linestyle="--", color="0.4", label=r"$T_0^{\mathrm{theory}} = \arg\min\, U(T_0)$")
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + [star, dotted, dashed], loc="upper right", fontsize="small")
    plotting.note_dropped(ax, dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
