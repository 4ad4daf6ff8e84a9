"""Every arm tuned: SCAFFOLD, FedAvgM, FedProx, FedAdam, FedFrozen and the value solve against tuned FedAvg.

Claim tested (docs/theory.md §6 "Every arm tuned"; issue 30, item 2): the phase diagram compares
FedFrozen with a tuned FedAvg; a referee asks whether the other baselines, tuned the same way, do as
well or better. At cells (ζ_V, E) of the phase diagram (its instances: the same seeds, clients and
θ⁰), every arm gets its step scale c AND its own hyper-parameter (FedAvgM's momentum β, FedProx's μ,
FedAdam's server rate, FedFrozen's warm-up T0: no oracle here) from the grid declared in the config
before any instance ran, chosen on design seeds (linattn_theory.report.tuning), then runs on held-out
seeds. Per cell and arm: the median gain 1 − R_arm / R_tuned FedAvg over the held-out instances with
its bootstrap 95 % interval (bar), the wins above 2 % and the chosen setting; open markers: the
median without the flagged instances († diverged, ‡ chaotic runs: sim.sensitivity, 1e-12 perturbation
of θ⁰); FedAvg's own best iterate (an oracle) is the last row.

Writes figures/phase_diagram_arms.png/.pdf; phase_diagram_arms.csv (one row per held-out seed,
cell and arm: the chosen setting, step, η, R, flags, the best iterate), phase_diagram_arms_design.csv
(every design run of every grid point), phase_diagram_arms_cells.csv (the statistics per cell and arm,
with and without the flagged instances, and the chosen settings) and phase_diagram_arms_plot.csv
(the drawn points).

Config: simulations/configs/phase_diagram_arms.toml (pre-registered; the instances of
phase_diagram.toml). Run: python simulations/phase_diagram_arms.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from matplotlib.ticker import PercentFormatter

from linattn_theory.core.io import atomic_write_text
from linattn_theory.report import plotting
from linattn_theory.report.arms import arm_summary, load_arms_settings, run_arms
from linattn_theory.report.figures import analysis_workers, config_path, script_main

NAME = "phase_diagram_arms"
CONFIG = config_path(__file__, "phase_diagram_arms")
BASE_CONFIG = config_path(__file__, "phase_diagram")
LABELS = {"scaffold": "SCAFFOLD", "fedavgm": "FedAvgM", "fedprox": "FedProx", "fedadam": "FedAdam",
          "fedfrozen": "FedFrozen ($c$, $T_0$ tuned)", "value_solve_final": "FedAvg, then the value solve",
          "fedavg_oracle": "FedAvg's best iterate (oracle)"}
LIMIT = 1.0       # gains below −100 % are drawn at the axis' edge
SHORT = {"step_scale": "$c$", "server_momentum": r"$\beta$", "prox_mu": r"$\mu$", "server_learning_rate": r"$\eta_s$",
         "warmup_rounds": "$T_0$"}


def _short(setting: str) -> str:
    """``"step_scale=0.15, prox_mu=1"`` as ``"c=0.15, μ=1"``."""
    for key, symbol in SHORT.items():
        setting = setting.replace(f"{key}=", f"{symbol}=")
    return setting


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Tune every arm on the design seeds, run the held-out seeds, write the CSVs and the figure."""
    settings = load_arms_settings(CONFIG, BASE_CONFIG, quick=quick)
    rows, design, choices = run_arms(settings, workers=analysis_workers(executor, workers))
    cells = arm_summary(rows, choices, settings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write_text(out / f"{NAME}{suffix}.csv", table.to_csv(index=False, float_format="%.17g"))
             for suffix, table in (("", rows), ("_design", design), ("_cells", cells))]
    drawn = cells.assign(point=cells["gain_median"].clip(-LIMIT, None), low=cells["gain_low"].clip(-LIMIT, None),
                         high=cells["gain_high"].clip(-LIMIT, None), clean=cells["gain_median_clean"].clip(-LIMIT, None))
    drawn = drawn[["zeta_value", "local_steps", "arm", "setting", "point", "low", "high", "clean", "wins", "instances",
                   "diverged", "chaotic"]]
    paths.append(atomic_write_text(out / f"{NAME}_plot.csv", drawn.to_csv(index=False, float_format="%.17g")))
    return paths + plotting.save_figure(draw(drawn, settings, quick), NAME, out_dir, None)


def draw(drawn, settings, quick=False):
    """One panel per cell, stacked (ζ_V outer, E inner) on one shared gain axis: per arm the median gain
    over tuned FedAvg and its interval, wins and the chosen setting."""
    cells = drawn[["zeta_value", "local_steps"]].drop_duplicates().sort_values(["zeta_value", "local_steps"])
    fig, axes = plotting.figure(1, len(cells), height=1.9, quick=quick, sharex=True)
    axes = np.atleast_1d(axes)
    threshold = settings["threshold"]
    arms = list(drawn["arm"].drop_duplicates())
    for ax, (zeta, E) in zip(axes, cells.itertuples(index=False)):
        part = drawn[(drawn["zeta_value"] == zeta) & (drawn["local_steps"] == E)].set_index("arm").reindex(arms)
        y = np.arange(len(arms))[::-1]
        ax.axvline(0.0, color=plotting.REFERENCE_COLOR, lw=0.8)
        ax.axvspan(-threshold, threshold, color=plotting.REFERENCE_COLOR, alpha=0.15, lw=0)
        ax.errorbar(part["point"], y, xerr=[part["point"] - part["low"], part["high"] - part["point"]], fmt="o",
                    color="black", ms=4, capsize=2, lw=1)
        ax.plot(part["clean"], y, "o", mfc="none", mec="tab:blue", ms=7)
        for yi, row in zip(y, part.itertuples()):
            marks = ("†" if row.diverged else "") + ("‡" if row.chaotic else "")
            ax.annotate(f"{row.wins}/{row.instances}{marks}  {_short(row.setting)}", (1.02, yi),
                        xycoords=("axes fraction", "data"), va="center", fontsize=7)
        ax.set_yticks(y, [LABELS.get(a, a) for a in arms])
        ax.tick_params(labelbottom=True)               # every panel keeps its gain scale
        ax.set_title(f"$\\zeta_V = {zeta:g}$, $E = {E}$")
    # one gain axis for every cell, so that the panels compare across ζ_V and E
    axes[0].set_xlim(-LIMIT, max(0.6, float(drawn["high"].max()) + 0.05))
    axes[0].xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    axes[-1].set_xlabel("gain over tuned FedAvg")
    fig.suptitle(f"every arm tuned on {len(settings['design_seeds'])} design seeds, "
                 f"{len(settings['heldout_seeds'])} held-out instances:\nmedian gain, bootstrap 95 % interval, "
                 f"wins above {100 * threshold:g} %, chosen setting; open: median without\nflagged instances "
                 f"(† diverged, ‡ chaotic); shaded: ±{100 * threshold:g} %")
    return fig


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
