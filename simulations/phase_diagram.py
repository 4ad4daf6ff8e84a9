"""Where freezing pays against a TUNED FedAvg: the phase diagram over step scale × heterogeneity × E.

Claim tested (docs/theory.md §6 "Where freezing pays"; issue 30, items 4 and 6): the headline's gain
of FedFrozen over FedAvg came at one step size. Here every instance runs at a step scale
c = η λ_max(θ⁰)/2 (the full model's curvature at θ⁰, docs/theory.md §5) from cautious to near the
edge, and each arm is compared with FedAvg whose step was chosen on design seeds from a declared grid
(linattn_theory.report.tuning.choose_steps), on held-out seeds that played no part in the choice. Per
cell (ζ_V, E, c), over the held-out instances: the median gain 1 − R_arm / R_tuned FedAvg with a
bootstrap 95 % interval and the wins above 2 %, for FedFrozen at its best T0 (an oracle over T0), the
online rule's realised run (fedfrozen_online: strategy fedfrozen_adaptive, its default causal rule,
docs/theory.md §8, run for real on every instance), the server's exact value solve after FedAvg
(value_solve_final, docs/theory.md §5) and, in its own column, FedAvg's best iterate at its tuned step
(an oracle: early stopping chosen after the fact); the column "tuned" gives FedFrozen, the online rule
and the value solve their own step chosen on the design seeds. Colour:
the median gain with every instance (a diverged arm counts as a loss); † cell with diverged runs, ‡
with chaotic FedAvg paths (linattn_theory.sim.sensitivity; for the online rule's run, also its own). Boxed: cells whose median gain without
the flagged instances exceeds 2 %; dashed: the boundary that the pre-registered a-priori predictor
(linattn_theory.theory.phase_predictor) draws, freezing predicted to pay to its right.

Writes figures/phase_diagram.png/.pdf; phase_diagram.csv (one row per instance, cell and arm: seed,
cell, arm, tuned step, risk, flags, the predictor's inputs and the decomposition's parts, so that
every statistic can be recomputed); phase_diagram_cells.csv (the statistics per cell, with and
without the flagged instances); phase_diagram_predictor.csv (the predictor's score on the held-out
instances); phase_diagram_attribution.csv (every win split into its parts, docs/theory.md §6);
phase_diagram_plot.csv (the drawn colour, clipped to ± 30 %, and marks of every cell).

Config: simulations/configs/phase_diagram.toml (pre-registered). Run: python simulations/phase_diagram.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from matplotlib.patches import Rectangle
from matplotlib.ticker import PercentFormatter

from linattn_theory.core.io import atomic_write_text
from linattn_theory.report import plotting
from linattn_theory.report.figures import analysis_workers, config_path, script_main
from linattn_theory.report.phase_diagram import (attribution, cell_summary, instance_rows, load_settings,
                                                 predictor_score, run_instances)

NAME = "phase_diagram"
CONFIG = config_path(__file__, "phase_diagram")
PANELS = {"fedfrozen_best": r"FedFrozen at its best $T_0$ (oracle)", "fedfrozen_online": "FedFrozen, the online rule's run",
          "value_solve_final": "FedAvg, then the value solve", "fedavg_tuned_oracle": "FedAvg's best iterate\n(oracle)"}
LIMIT = 0.3       # the colour scale's gain range, ± 30 %


def _text(row) -> str:
    if not np.isfinite(row.gain_median):
        return f"diverged\n{row.wins}/{row.instances}"
    marks = ("†" if row.diverged else "") + ("‡" if row.chaotic else "")
    return (f"{100 * row.gain_median:+.0f}%{marks}\n[{100 * row.gain_low:.0f},{100 * row.gain_high:.0f}]\n"
            f"{row.wins}/{row.instances}").replace("-inf", "−∞")


def _panel(ax, cells, rows, arm, E, threshold, first_column):
    part = cells[(cells["arm"] == arm) & (cells["local_steps"] == E)]
    order = [c for c in part["column"].drop_duplicates() if c != "tuned"] + ["tuned"]
    order = [c for c in order if c in set(part["column"])]
    grid = part.pivot(index="zeta_value", columns="column", values="gain_median")[order].sort_index(ascending=False)
    text = part.assign(_t=[_text(r) for r in part.itertuples()]).pivot(
        index="zeta_value", columns="column", values="_t")[order].sort_index(ascending=False)
    clean = part.pivot(index="zeta_value", columns="column", values="gain_median_clean")[order].sort_index(ascending=False)
    plotting.heatmap(ax, grid.clip(-LIMIT, LIMIT).replace(-np.inf, -LIMIT), annot=text, fmt="", cmap="PiYG", vmin=-LIMIT,
                vmax=LIMIT, cbar=False, linewidths=0.5, linecolor="white", annot_kws={"fontsize": 7})
    for i, zeta in enumerate(clean.index):                # measured: median gain without flags > 2 %
        for j, column in enumerate(order):
            if clean.loc[zeta, column] > threshold:
                ax.add_patch(Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, fill=False, lw=1.4, ec="black"))
    steps = [c for c in order if c != "tuned"]
    if len(steps) > 1:                                    # predicted: the columns where it says "pays"
        held = rows[(rows["role"] == "heldout") & (rows["arm"] == arm) & (rows["local_steps"] == E)]
        pays = held.groupby("step_scale")["predicted_pays"].mean().reindex([float(c) for c in steps]).to_numpy()
        edges = [j + 1 for j in range(len(steps) - 1) if (pays[j] >= 0.5) != (pays[j + 1] >= 0.5)]
        for x in edges:
            ax.axvline(x, color="black", ls="--", lw=1.2)
    ax.set_xticklabels(order, rotation=0)
    ax.set_yticklabels([f"{v:g}" for v in grid.index], rotation=0)
    ax.set_xlabel("step scale $c$" if arm != "fedavg_tuned_oracle" else "FedAvg's")
    ax.set_ylabel(plotting.label("task.zeta_value") if first_column else "")
    ax.set_title(f"{PANELS[arm]}, $E = {E}$")


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run the declared instances, write the CSVs and draw the diagram; returns the written paths."""
    settings = load_settings(CONFIG, quick=quick)
    records = run_instances(settings, progress=progress, workers=analysis_workers(executor, workers))
    rows, _ = instance_rows(records, settings)
    cells = cell_summary(rows, settings)
    threshold = settings["threshold"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write_text(out / f"{NAME}.csv", rows.to_csv(index=False, float_format="%.17g")),
             atomic_write_text(out / f"{NAME}_cells.csv", cells.to_csv(index=False, float_format="%.17g")),
             atomic_write_text(out / f"{NAME}_predictor.csv",
                               predictor_score(rows, threshold).to_csv(index=False, float_format="%.17g")),
             atomic_write_text(out / f"{NAME}_attribution.csv",
                               attribution(rows, threshold).to_csv(index=False, float_format="%.17g"))]
    drawn = cells.assign(colour=cells["gain_median"].clip(-LIMIT, LIMIT).fillna(0.0),
                         boxed=cells["gain_median_clean"] > threshold)
    drawn = drawn[["arm", "zeta_value", "local_steps", "column", "step_scale", "colour", "boxed", "wins", "instances"]]
    paths.append(atomic_write_text(out / f"{NAME}_plot.csv", drawn.to_csv(index=False, float_format="%.17g")))
    return paths + plotting.save_figure(draw(rows, cells, settings, quick), NAME, out_dir, None)


def draw(rows, cells, settings, quick=False):
    """The figure: per E a row with FedFrozen at its best T0 beside the online rule's realised run (the
    same columns, side by side), then per E a row with the value solve beside FedAvg's oracle best
    iterate (a narrow panel: one column)."""
    threshold = settings["threshold"]
    E_values = sorted(settings["local_steps"])
    fig, axes = plotting.figure(2, 2 * len(E_values), height=2.3, quick=quick)
    axes = np.asarray(axes).reshape(2 * len(E_values), 2)
    arms = list(PANELS)
    for r, E in enumerate(E_values):
        for row, pair in ((r, arms[:2]), (len(E_values) + r, arms[2:])):
            for j, arm in enumerate(pair):
                _panel(axes[row, j], cells, rows, arm, E, threshold, j == 0)
    for ax in axes[len(E_values):, 1]:                     # the oracle's one column: a narrow box, on the left
        ax.set_box_aspect(2.4)
        ax.set_anchor("W")
    bar = fig.colorbar(axes[0, 0].collections[0], ax=list(axes[len(E_values):, 1]), shrink=0.8, aspect=25, panchor=False,
                       format=PercentFormatter(1.0, decimals=0))
    bar.set_label("median gain over tuned FedAvg")
    held = rows[rows["role"] == "heldout"]
    fig.suptitle(f"gain $1 - R/R_{{\\mathrm{{tuned\\ FedAvg}}}}$, {held['seed'].nunique()} held-out instances per cell: "
                 f"median, bootstrap 95 % interval, wins above {100 * threshold:g} %\n"
                 f"boxed: median without flagged instances above {100 * threshold:g} %; dashed: predicted boundary "
                 f"(pays to its right); † diverged, ‡ chaotic")
    return fig


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
