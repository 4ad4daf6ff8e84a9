"""Figure 6: the value drift floor against heterogeneity ζ, step size η and local steps E (log–log).

Claim (docs/theory.md §5–6): for small η the drift floor D(K) = F_λ(K, V_FA) − Φ_λ(K) grows
like η²(E−1)²ζ² (derivations/tradeoff.py), so on log–log axes it has slope 2 in η, in E − 1 and
in the client dissimilarity ζ (ζ² = Σ_c p_c ‖∇_V F_{λ,c}(K, V*_λ)‖², varied through the concept
heterogeneity ζ_V). Markers: D measured
by simulation (a frozen stage run to convergence from the initial kernel K_0: F_λ(θ_T) −
Φ_λ(K_0)); thin lines: the closed form D(K_0) of the same seed (three instances, told apart by
the marker, each drawn 4 % to the side of the next on the log x axis, so that seeds with nearly equal
D do not hide each other); dashed black: the derived slope, anchored at the data; each panel's title gives the
least-squares slope of the measured points, the figure's title the largest relative difference
between simulation and closed form (drift_scaling.csv: relative_difference).

Config: simulations/configs/drift_scaling.toml. Run: python simulations/drift_scaling.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from linattn_theory.report import plotting
from linattn_theory.theory.scaling_laws import drift_exponents
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.report.sweep_analysis import frozen_stage_table

NAME = "drift_scaling"
#: the seeds are drawn side by side, this factor apart on the log x axis (the CSV has the true x)
OFFSET = 1.04
CONFIG = config_path(__file__, "drift_scaling")
#: (grid key, x column, axis label key, exponent key of the derived law); ζ is the measured client
#: dissimilarity ζ(K_0) of docs/theory.md §6, varied through the concept heterogeneity ζ_V
PANELS = (("task.zeta_value", "zeta", "zeta", "zeta"),
          ("federated.learning_rate", "federated.learning_rate", "federated.learning_rate", "eta"),
          ("federated.local_steps", "local_steps_minus_one", "local_steps_minus_one",
           "local_steps_minus_one"))


def fitted_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def panel_rows(table: pd.DataFrame, base: dict, key: str) -> pd.DataFrame:
    """The one-at-a-time slice of ``key``: every other varied setting at its base value."""
    keep = np.ones(len(table), dtype=bool)
    for other, _, _, _ in PANELS:
        if other != key:
            keep &= np.isclose(table[other].astype(float), float(base[other]))
    return table[keep]


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the three log–log panels, write drift_scaling.*; returns the paths."""
    sweep, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                          workers=workers, progress=progress)
    table, dropped = plotting.drop_diverged(frozen_stage_table(folder, results))
    table = table.assign(local_steps_minus_one=table["federated.local_steps"] - 1)
    base = {"task.zeta_value": sweep.base["task"]["zeta_value"],      # the point the panels vary around
            "federated.learning_rate": sweep.base["federated"]["learning_rate"],
            "federated.local_steps": sweep.base["federated"]["local_steps"]}
    fig, axes = plotting.figure(3, height=2.4, quick=quick)
    seeds = sorted(table["seed"].unique())
    markers = dict(zip(seeds, plotting.SEED_MARKERS))
    shift = {seed: OFFSET ** (i - (len(seeds) - 1) / 2) for i, seed in enumerate(seeds)}   # drawn only
    rows = []
    for ax, (key, x, axis, exponent) in zip(axes, PANELS):
        data = panel_rows(table, base, key).sort_values(x)
        data = data[data["measured_drift_floor"] > 0]
        for seed, sub in data.groupby("seed"):
            ax.plot(sub[x] * shift[seed], sub["drift_floor"], "-", color=plotting.INSTANCE_COLOR, linewidth=0.9)
            ax.plot(sub[x] * shift[seed], sub["measured_drift_floor"], markers[seed], color=plotting.STATISTIC_COLOR,
                    markersize=4, markerfacecolor="none", markeredgewidth=0.9)
        slope = fitted_slope(data[x], data["measured_drift_floor"]) if data[x].nunique() > 1 else np.nan
        derived = drift_exponents()[exponent]          # read off the exact series (sympy), not typed in
        xs = np.array(sorted(data[x].unique()), dtype=float)
        if len(xs) > 1:
            x0, y0 = np.exp(np.mean(np.log(data[x]))), np.exp(np.mean(np.log(data["measured_drift_floor"])))
            ax.plot(xs, y0 * (xs / x0) ** derived, "--", color="black", linewidth=1.2)
        plotting.log_scale(ax, "x")
        plotting.log_scale(ax)
        if x != "zeta":          # ζ is measured per seed: no common grid of values
            plotting.data_ticks(ax, xs)
        ax.set_xlabel(plotting.label(axis))
        ax.set_ylabel(r"value drift floor $D(K_0)$")
        ax.set_title(f"fitted slope {slope:.2f} (derived {derived:g})")
        rows.append(data[["run_id", "seed", x, "measured_drift_floor", "drift_floor"]]
                    .rename(columns={x: "x"}).assign(variable=axis, fitted_slope=slope,
                                                     derived_slope=derived))
    data = pd.concat(rows, ignore_index=True)
    relative = (data["measured_drift_floor"] - data["drift_floor"]).abs() / data["drift_floor"]
    fig.suptitle(r"value drift floor $D \propto \eta^2 (E-1)^2 \zeta^2$: simulation vs closed form, "
                 f"largest relative difference {relative.max():.1e}")
    handles = [Line2D([], [], marker=markers[seed], linestyle="none", markerfacecolor="none",
                      color=plotting.STATISTIC_COLOR, label=f"seed {seed}: simulation") for seed in seeds]
    handles += [Line2D([], [], color=plotting.INSTANCE_COLOR, label=r"closed form $D(K_0)$ (same seed)"),
                Line2D([], [], linestyle="--", color="black", label="derived slope")]
    plotting.legend_below(fig, handles, ncols=len(handles))
    plotting.note_dropped(axes[0], dropped)
    return plotting.save_figure(fig, NAME, out_dir, data.assign(relative_difference=relative))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
