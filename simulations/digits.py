"""Figure digits: does the warm-up trade-off show on real data, for linear and softmax attention?

Claim (docs/theory.md §9, §6): on scikit-learn's handwritten digits split over 8 clients by a
Dirichlet(α) label skew, FedFrozen with a warm-up of T0 rounds is compared with plain FedAvg
(T0 = T) on the same clients, seeds and budget of T rounds. One column per label skew (weak to
strong), colours: the attention. Top: held-out test accuracy against T0; bottom: the paired
relative change of the final training loss, F_λ(θ_T; T0) / F_λ(θ_T; FedAvg) − 1 of the same seed
(below zero: freezing at T0 beats FedAvg; the loss, not R, since no optimum Φ*_λ is known here).
Lines and bands: median and interquartile range over the instances (seeds), selected by the rule of
every figure (linattn_theory.report.sweep_analysis.select_instances). At the top of the bottom row:
diamonds, the per-instance best warm-up (the smallest T0 minimising the final training loss,
chosen after seeing every run); stars, the warm-up the causal online rule chose during training
(strategy fedfrozen_adaptive, docs/theory.md §8); each a median with the interquartile range as a bar.
FedAvg runs at the sweep's one step, not tuned: the fair comparison is digits_phase (figure 4d).
digits_instances.csv: one row per instance (attention, α, seed): the best T0, the final training loss
F_λ there and FedAvg's, the gain 1 − F_λ(T0_best)/F_λ(T) and whether its FedAvg run is chaotic
(docs/theory.md §6: linattn_theory.report.sweep_analysis.fedavg_chaos).

Config: simulations/configs/digits.toml. Run: python simulations/digits.py [--quick] [--out figures]
"""

import importlib.util
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
from linattn_theory.data.digits import DIGITS_EXTRA, evaluate
from linattn_theory.sim.config import ONLINE_STRATEGY
from linattn_theory.sim.engine import clients_from_config
from linattn_theory.sim.sweep import load_sweep
from linattn_theory.report.figures import analysis_workers, config_path, figure_sweep, script_main
from linattn_theory.report.sweep_analysis import (fedavg_chaos, paired_ratios, quartiles, runs_by_instance,
                                                  select_instances)

NAME = "digits"
CONFIG = config_path(__file__, "digits")
HUE = "label_alpha"
INSTANCE = ("attention", HUE, "seed")


def run_table(folder, results) -> pd.DataFrame:
    """Per run: attention, α, seed, T0, T, whether it diverged, the final training loss and the
    held-out test loss and accuracy (NaN for a diverged run)."""
    rows = []
    for _, runs in runs_by_instance(folder, results):
        config = next(iter(runs.values()))[0]
        truth = clients_from_config(config).truth
        test = (truth["test_X"], truth["test_q"], truth["test_y"])
        for rid, (config, run) in runs.items():
            model = config.model
            scores = ({"loss": np.nan, "accuracy": np.nan} if run.diverged
                      else evaluate(run.params, *test, model.attention, model.temperature))
            rows.append({"run_id": rid, "attention": model.attention, HUE: config.task.label_alpha,
                         "seed": config.seed, "T0": run.metadata["warmup_rounds"],
                         "federated.rounds": config.federated.rounds, "diverged": run.diverged,
                         "final_loss_regularized": (np.nan if run.diverged
                                                    else float(run.table["loss_regularized"].iloc[-1])),
                         "test_loss": scores["loss"], "test_accuracy": scores["accuracy"]})
    return pd.DataFrame(rows)


def with_online_runs(sweep):
    """The sweep with, per instance (attention, α, seed), the causal online rule's run (strategy
    ``fedfrozen_adaptive``, docs/theory.md §8): until it freezes, it is the instance's FedAvg run
    (``T0 = T``), whose trajectory it shares in the sweep (linattn_theory.sim.ensemble)."""
    online = [config.with_updates({"federated.strategy": ONLINE_STRATEGY,
                                   "federated.warmup_rounds": config.federated.rounds})
              for config in sweep.configs]
    return sweep.with_runs(online)


def online_warmups(results) -> pd.DataFrame:
    """Per instance (attention, α, seed): the warm-up ``kernel_round`` the causal online rule chose
    during training (its run's ``T0``), for the runs that did not diverge."""
    online = results[results["federated.strategy"] == ONLINE_STRATEGY]
    attention = online["model.attention"].fillna("linear")   # a linear run's record leaves the softmax keys out
    table = pd.DataFrame({"attention": attention, HUE: online[f"task.{HUE}"],
                          "seed": online["seed"], "kernel_round": online["T0"], "diverged": online["diverged"]})
    return table[~table["diverged"].astype(bool)].reset_index(drop=True)


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the panels, write digits.*; returns the paths.

    Without scikit-learn (the optional extra ``digits``) the figure is skipped with a message.
    """
    if importlib.util.find_spec("sklearn") is None:
        print(f"{NAME}: skipped, the digits family needs scikit-learn: {DIGITS_EXTRA}", file=sys.stderr)
        return []
    sweep = with_online_runs(load_sweep(CONFIG, quick=quick))
    _, results, folder = figure_sweep(sweep, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    grid = results[results["federated.strategy"] != ONLINE_STRATEGY]
    table = run_table(folder, grid)
    runs, best, left_out = select_instances(table, INSTANCE, risk="final_loss_regularized")
    best = best.merge(fedavg_chaos(folder, table, INSTANCE, workers=analysis_workers(executor, workers)),
                      on=list(INSTANCE), how="left", validate="one_to_one")
    change = paired_ratios(runs, INSTANCE, column="final_loss_regularized")
    change = change.assign(relative_change=100 * (change["ratio"] - 1))
    online = online_warmups(results)
    levels = sorted(runs[HUE].unique(), reverse=True)        # weak to strong label skew
    attentions = [a for a in plotting.ATTENTION if a in set(runs["attention"])]
    fig, axes = plotting.figure(len(levels), 2, height=2.5, sharex=True, sharey="row", quick=quick)
    axes = np.asarray(axes).reshape(2, len(levels))
    rows = []
    for column, level in enumerate(levels):
        ax_acc, ax_loss = axes[:, column]
        for row, attention in enumerate(attentions):
            style = plotting.ATTENTION[attention]
            line = {"color": style.color, "marker": style.marker, "linestyle": style.linestyle}
            mine = runs[(runs["attention"] == attention) & (runs[HUE] == level)]
            acc = plotting.instance_band(ax_acc, mine, "T0", "test_accuracy", label=style.label, **line)
            mine = change[(change["attention"] == attention) & (change[HUE] == level)]
            loss = plotting.instance_band(ax_loss, mine, "T0", "relative_change", **line)
            t0 = quartiles(best[(best["attention"] == attention) & (best[HUE] == level)]["best_T0"])
            plotting.mark_best_T0(ax_loss, t0, color=style.color, row=row)
            chosen = quartiles(online[(online["attention"] == attention) & (online[HUE] == level)]["kernel_round"])
            if chosen["count"]:
                plotting.mark_best_T0(ax_loss, chosen, color=style.color, row=len(attentions) + row, marker="*")
            labels = {"attention": attention, HUE: level, "best_T0": t0["median"], "best_T0_q25": t0["q25"],
                      "best_T0_q75": t0["q75"], "online_T0_median": chosen["median"],
                      "online_T0_q25": chosen["q25"], "online_T0_q75": chosen["q75"]}
            rows += [acc.assign(quantity="test_accuracy", **labels),
                     loss.assign(quantity="relative_loss_change_vs_fedavg_percent", **labels)]
        ax_acc.set_title(rf"label skew $\alpha = {level:g}$")
        ax_loss.axhline(0.0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
        ax_loss.set_xlabel(plotting.label("T0") + r" ($T_0 = T$: FedAvg)")
    # the row shares its y axis: +100 % at T0 = 0, a few % near T, linear within ±1 %, logarithmic beyond
    plotting.symlog_scale(axes[1, 0], 1.0)
    plotting.room_on_top(axes[1, 0], 2 * len(attentions))
    low, top = axes[1, 0].get_ylim()[0], max(float(change["relative_change"].max()), 1.0)
    axes[1, 0].set_yticks([v for v in (-10, -1, 0, 1, 10, 100, 1000) if low <= v <= top])   # none beside the marks
    axes[0, 0].set_ylabel("test accuracy")
    axes[1, 0].set_ylabel(r"$F_\lambda(\theta_T)$ vs FedAvg's (%)")
    counts = best.groupby(["attention", HUE]).size()
    fig.suptitle("; ".join(filter(None, ["bands: " + plotting.band_text(int(counts.min())), 
                                         plotting.left_out_text(len(left_out))])))
    handles = [Line2D([], [], marker=plotting.ATTENTION[a].marker, color=plotting.ATTENTION[a].color,
                      linestyle=plotting.ATTENTION[a].linestyle, markersize=3, label=plotting.ATTENTION[a].label)
               for a in attentions]
    handles += [plotting.best_T0_handle(),
                Line2D([], [], marker="*", color=plotting.REFERENCE_COLOR, markeredgecolor="black", markersize=6,
                       linewidth=2.5, label=r"online rule's $T_0$ per instance: median, IQR")]
    plotting.legend_below(fig, handles, ncols=2)
    instances = best.rename(columns={"R_best": "F_best", "R_fedavg": "F_fedavg"})[
        ["attention", HUE, "seed", "best_T0", "F_best", "F_fedavg", "gain", "T", "diverged_runs", "chaotic",
         "amplification"]]
    return (plotting.save_figure(fig, f"{NAME}_instances", out_dir, instances, formats=())    # the per-instance table
            + plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True)))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
