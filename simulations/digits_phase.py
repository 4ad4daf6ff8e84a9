"""Digits, searched: where (if anywhere) freezing pays on real data against a tuned FedAvg.

Claim tested (docs/theory.md §6 "Digits, searched"; issue 30, item 7): on scikit-learn's handwritten
digits over 8 clients with Dirichlet(α) label skew, for linear and softmax attention, over step scale
c = η λ_max(θ⁰)/2 (the full model's curvature at θ⁰) × label skew α × local steps E, does FedFrozen
beat FedAvg whose step was chosen on design seeds from a declared grid? Per cell over the held-out
instances: the median gain 1 − F_λ(θ_T)/F_λ(θ_T; tuned FedAvg) of the final training objective (no
Φ*_λ is known on digits, so the floor is not subtracted: a gain in F understates one in excess risk)
and the wins above 2 % (its bootstrap 95 % interval in digits_phase_cells.csv), and beside it the
median change of the held-out test accuracy in percentage points. Columns c: FedFrozen at its best warm-up T0 for the
held-out run itself (an oracle over T0, T0 = T, plain FedAvg at c, included); "tuned": FedFrozen
at its (c, T0) chosen on the design seeds (no oracle). Boxed: median gain above 2 % AND accuracy
not lower; † cells with diverged runs; ‡ cells with chaotic instances (a compared run whose end moves
by more than 1e7 times a 1e-12 move of θ⁰, docs/theory.md §6 "Chaotic instances"; the statistics
without them in digits_phase_cells.csv, its columns ending in _without_chaotic).

Writes figures/digits_phase.png/.pdf; digits_phase.csv (one row per run: role, seed, attention, α,
E, c, η, T0, final F_λ, test accuracy, diverged, chaotic: every statistic recomputes from it),
digits_phase_optimum.csv (Φ*_λ of each held-out linear-attention instance, from which the cells'
gains in excess risk R = F_λ − Φ*_λ follow; softmax has no computed optimum),
digits_phase_cells.csv (the statistics per cell and the tuned choices) and digits_phase_plot.csv
(the drawn colour and marks). Needs scikit-learn (the digits extra; skipped with a message otherwise).

Config: simulations/configs/digits_phase.toml (pre-registered). Run: python simulations/digits_phase.py [--quick] [--out figures]
"""

import importlib.util
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
from linattn_theory.data.digits import DIGITS_EXTRA
from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, script_main

NAME = "digits_phase"
CONFIG = config_path(__file__, "digits_phase")
LIMIT = 0.3       # the colour scale's gain range, ± 30 %


def _text(row) -> str:
    if not np.isfinite(row.gain_median):
        return f"diverged\n{row.wins}/{row.instances}"
    mark = ("†" if row.diverged or row.tuned_diverged else "") + ("‡" if row.chaotic_instances else "")
    return (f"{100 * row.gain_median:+.0f}%{mark} {row.wins}/{row.instances}\n"
            f"{row.accuracy_change_median:+.1f} pp").replace("-inf", "−∞")


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run the declared instances, write the CSVs and draw the diagram; returns the written paths."""
    if importlib.util.find_spec("sklearn") is None:
        print(f"{NAME}: skipped, the digits family needs scikit-learn: {DIGITS_EXTRA}", file=sys.stderr)
        return []
    from linattn_theory.report.digits_phase import (digits_cells, linear_optima, load_digits_settings, run_digits,
                                                    tuned_choices)
    from linattn_theory.report.figures import analysis_workers

    settings = load_digits_settings(CONFIG, quick=quick)
    processes = analysis_workers(executor, workers)
    rows = run_digits(settings, progress=progress, workers=processes)
    choices = tuned_choices(rows, settings)
    optima = linear_optima(rows, settings, workers=processes)
    cells = digits_cells(rows, choices, settings, optima)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write_text(out / f"{NAME}.csv", rows.to_csv(index=False, float_format="%.17g")),
             atomic_write_text(out / f"{NAME}_optimum.csv", optima.to_csv(index=False, float_format="%.17g")),
             atomic_write_text(out / f"{NAME}_cells.csv", cells.to_csv(index=False, float_format="%.17g"))]
    threshold = settings["threshold"]
    drawn = cells.assign(colour=cells["gain_median"].clip(-LIMIT, LIMIT).fillna(0.0),
                         boxed=(cells["gain_median"] > threshold) & (cells["accuracy_change_median"] >= 0))
    drawn = drawn[["attention", "label_alpha", "local_steps", "column", "colour", "boxed", "wins", "instances",
                   "chaotic_instances"]]
    paths.append(atomic_write_text(out / f"{NAME}_plot.csv", drawn.to_csv(index=False, float_format="%.17g")))
    return paths + plotting.save_figure(draw(cells, drawn, settings, quick), NAME, out_dir, None)


def draw(cells, drawn, settings, quick=False):
    """Per E a heatmap: rows (attention, α), columns the step scales and "tuned"."""
    E_values = sorted(settings["local_steps"])
    fig, axes = plotting.figure(1, len(E_values), height=2.6, quick=quick)
    axes = np.atleast_1d(axes)
    order = [f"{c:g}" for c in settings["step_scales"]] + ["tuned"]
    for ax, E in zip(axes, E_values):
        part = cells[cells["local_steps"] == E].assign(row=lambda d: d["attention"] + ", α = " + d["label_alpha"].map("{:g}".format))
        boxes = drawn[drawn["local_steps"] == E].assign(row=part["row"].to_numpy())
        grid = part.pivot(index="row", columns="column", values="gain_median")[order]
        text = part.assign(_t=[_text(r) for r in part.itertuples()]).pivot(index="row", columns="column", values="_t")[order]
        plotting.heatmap(ax, grid.clip(-LIMIT, LIMIT).replace(-np.inf, -LIMIT), annot=text, fmt="", cmap="PiYG",
                    vmin=-LIMIT, vmax=LIMIT, cbar=False, linewidths=0.5, linecolor="white", annot_kws={"fontsize": 7})
        boxed = boxes.pivot(index="row", columns="column", values="boxed")[order]
        for i, row in enumerate(grid.index):
            for j, column in enumerate(order):
                if boxed.loc[row, column]:
                    ax.add_patch(Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, fill=False, lw=1.4, ec="black"))
        ax.set_xticklabels(order, rotation=0)
        ax.set_yticklabels(grid.index, rotation=0)
        ax.set_xlabel("step scale $c$ (best $T_0$, oracle) | tuned $(c, T_0)$")
        ax.set_ylabel("")
        ax.set_title(f"$E = {E}$")
    bar = fig.colorbar(axes[0].collections[0], ax=list(axes), shrink=0.7, pad=0.015, aspect=30,
                       format=PercentFormatter(1.0, decimals=0))
    bar.set_label(r"median gain in $F_\lambda(\theta_T)$ over tuned FedAvg")
    threshold = settings["threshold"]
    fig.suptitle(f"digits: FedFrozen against tuned FedAvg, {len(settings['heldout_seeds'])} held-out instances "
                 f"per cell: median gain in the final\ntraining objective, wins above {100 * threshold:g} % (intervals: "
                 f"digits_phase_cells.csv); median test-accuracy change\nin points; boxed: gain above "
                 f"{100 * threshold:g} % and accuracy not lower; † diverged runs; ‡ chaotic instances")
    return fig


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
