"""Figure digits: does the warm-up trade-off show on real data, for linear and softmax attention?

Claim (docs/theory.md §9, §6): on scikit-learn's handwritten digits split over 8 clients by a
Dirichlet(α) label skew, FedFrozen with a warm-up of T0 rounds is compared with plain FedAvg
(T0 = T) on the same clients, seeds and budget of T rounds. Top: held-out test accuracy against
T0 (mean over ten seeds, band from the smallest to the largest seed); bottom: the paired change
of the final training loss, F_λ(θ_T; T0) − F_λ(θ_T; FedAvg) of the same seed (below zero:
freezing at T0 beats FedAvg). Left linear, right softmax attention; colours: label skew α; stars:
the best T0 of the seed mean (chosen after seeing every run); dashed lines: the warm-up the causal
online rule chose during training (strategy fedfrozen_adaptive, docs/theory.md §8; median over
seeds).

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

from linattn_theory.report import plotting
from linattn_theory.data.digits import DIGITS_EXTRA, evaluate
from linattn_theory.sim.engine import clients_from_config
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.report.sweep_analysis import runs_by_instance

NAME = "digits"
CONFIG = config_path(__file__, "digits")
HUE = "label_alpha"


def run_table(folder, results) -> pd.DataFrame:
    """Per run: attention, α, seed, T0, final training loss and the held-out test loss and accuracy."""
    rows = []
    for _, runs in runs_by_instance(folder, results):
        config = next(iter(runs.values()))[0]
        truth = clients_from_config(config).truth
        test = (truth["test_X"], truth["test_q"], truth["test_y"])
        for rid, (config, run) in runs.items():
            if run.diverged:
                continue
            model = config.model
            scores = evaluate(run.params, *test, model.attention, model.temperature)
            rows.append({"run_id": rid, "attention": model.attention, HUE: config.task.label_alpha,
                         "seed": config.seed, "T0": run.metadata["warmup_rounds"],
                         "rounds": config.federated.rounds,
                         "final_loss_regularized": float(run.table["loss_regularized"].iloc[-1]),
                         "test_loss": scores["loss"], "test_accuracy": scores["accuracy"]})
    table = pd.DataFrame(rows)
    fedavg = table[table["T0"] == table["rounds"]].set_index(["attention", HUE, "seed"])
    joined = table.join(fedavg["final_loss_regularized"].rename("fedavg_loss"),
                        on=["attention", HUE, "seed"])
    return joined.assign(loss_change=joined["final_loss_regularized"] - joined["fedavg_loss"])


def _online_run(config_dict: dict, path: str) -> dict:
    """Worker: the causal rule's warm-up on one instance (strategy ``fedfrozen_adaptive``), cached."""
    import json
    from pathlib import Path

    from linattn_theory.sim.config import config_from_dict
    from linattn_theory.sim.engine import simulate
    from linattn_theory.core.io import write_json

    target = Path(path)
    if not target.is_file():
        with np.errstate(all="ignore"):
            run = simulate(config_from_dict(config_dict))
        write_json(target, {"kernel_round": int(run.metadata["kernel_round"]),
                            "stop_round": int(run.metadata["stop_round"]), "diverged": run.diverged})
    return json.loads(target.read_text())


def online_warmups(folder, results, workers=None) -> pd.DataFrame:
    """Per instance (attention, α, seed): the warm-up the causal online rule chose (docs/theory.md §8).

    Each instance runs once more with ``federated.strategy = "fedfrozen_adaptive"``; the results are
    cached in ``<sweep>/_online/`` (keyed by the config hash), so a redraw does not rerun them.
    """
    from pathlib import Path

    from joblib import Parallel, delayed

    from linattn_theory.sim.config import config_hash

    jobs, keys = [], []
    for _, runs in runs_by_instance(folder, results):
        config = next(iter(runs.values()))[0]
        online = config.with_updates({"federated.strategy": "fedfrozen_adaptive",
                                      "federated.warmup_rounds": config.federated.rounds})
        jobs.append((online.to_dict(), str(Path(folder) / "_online" / f"{config_hash(online)}.json")))
        keys.append({"attention": config.model.attention, HUE: config.task.label_alpha, "seed": config.seed})
    out = Parallel(n_jobs=workers or 1)(delayed(_online_run)(*job) for job in jobs)
    table = pd.DataFrame([{**k, **o} for k, o in zip(keys, out)])
    return table[~table["diverged"]]


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw the four panels, write digits.*; returns the paths.

    Without scikit-learn (the optional extra ``digits``) the figure is skipped with a message.
    """
    if importlib.util.find_spec("sklearn") is None:
        print(f"{NAME}: skipped, the digits family needs scikit-learn: {DIGITS_EXTRA}", file=sys.stderr)
        return []
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    table = run_table(folder, results).dropna(subset=["loss_change"])
    online = online_warmups(folder, results, workers)
    fig, axes = plotting.figure(2, 2, height=3.2, quick=quick)
    levels = sorted(table[HUE].unique())
    rows = []
    for column, attention in enumerate(("linear", "softmax")):
        ax_acc, ax_loss = axes[column], axes[2 + column]
        for level, color in zip(levels, plotting.palette(len(levels))):
            mine = table[(table["attention"] == attention) & (table[HUE] == level)]
            if mine.empty:
                continue
            name = rf"$\alpha = {level:g}$"
            acc, best = plotting.seed_band_best(ax_acc, mine, "T0", "test_accuracy", color=color,
                                                label=name, best="max")
            loss, best_loss = plotting.seed_band_best(ax_loss, mine, "T0", "loss_change", color=color,
                                                      label=name)
            chosen = online[(online["attention"] == attention) & (online[HUE] == level)]["kernel_round"]
            online_T0 = float(chosen.median()) if len(chosen) else float("nan")
            if np.isfinite(online_T0):       # the causal rule's choice (median over seeds), dashed
                for ax in (ax_acc, ax_loss):
                    ax.axvline(online_T0, color=color, linestyle="--", linewidth=0.9)
            labels = {"attention": attention, HUE: level, "online_T0_median": online_T0}
            rows += [acc.assign(quantity="test_accuracy", best_T0=best["T0"], **labels),
                     loss.assign(quantity="loss_change_vs_fedavg", best_T0=best_loss["T0"], **labels)]
        ax_acc.set_title(f"{attention} attention")
        ax_acc.set_ylabel("test accuracy")
        ax_loss.axhline(0.0, color="0.4", linewidth=1, linestyle=":")
        ax_loss.set_ylabel(r"$F_\lambda(\theta_T)$ $-$ FedAvg's")
        ax_loss.set_xlabel(plotting.label("T0") + r"  ($T_0 = T$: FedAvg)")
    axes[1].legend(loc="lower right", title="dashed: online rule's T$_0$\n(median over seeds)")
    plotting.note_dropped(axes[0], dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
