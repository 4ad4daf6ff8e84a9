"""Figure tradeoff_attention: the warm-up trade-off for linear and softmax attention on the same clients.

Claim (docs/theory.md §9, §6): for linear attention R(T0) = F_λ(θ_T) − Φ*_λ is U-shaped in the
warm-up length under heterogeneity (figure 2); whether the softmax layer shows the same trade-off
is an empirical question. The paired statistic needs no optimum: R(T0) − R(T) = F_λ(θ_T; T0) −
F_λ(θ_T; FedAvg) of the same seed (Φ*_λ cancels; below zero: freezing at T0 beats FedAvg). Left
linear, right softmax attention, on the same planted-kernel clients and schedule; colours: ζ_V;
mean over five seeds with a band from the smallest to the largest seed; stars: the best T0 of
the seed mean.

Config: simulations/configs/tradeoff_attention.toml. Run: python simulations/tradeoff_attention.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, figure_sweep, script_main

NAME = "tradeoff_attention"
CONFIG = config_path(__file__, "tradeoff_attention")
HUE = "task.zeta_value"
ATTENTION = "model.attention"


def paired_change(results: pd.DataFrame, keys) -> pd.DataFrame:
    """``R(T0) − R(T) = F_λ(θ_T; T0) − F_λ(θ_T; T)`` per run, against the FedAvg run (``T0 = T``) of the same ``keys``."""
    fedavg = results[results["T0"] == results["federated.rounds"]].set_index(keys)
    joined = results.join(fedavg["final_loss_regularized"].rename("fedavg_loss"), on=keys)
    return joined.assign(excess_risk_change=joined["final_loss_regularized"] - joined["fedavg_loss"])


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw both panels, write tradeoff_attention.*; returns the paths."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    results = results.assign(**{ATTENTION: results[ATTENTION].fillna("linear")})   # linear records none
    table = paired_change(results, [ATTENTION, HUE, "seed"]).dropna(subset=["excess_risk_change"])
    fig, axes = plotting.figure(2, quick=quick)
    levels = sorted(table[HUE].unique())
    rows = []
    for ax, attention in zip(axes, ("linear", "softmax")):
        for level, color in zip(levels, plotting.palette(len(levels))):
            mine = table[(table[ATTENTION] == attention) & (table[HUE] == level)]
            stats, best = plotting.seed_band_best(ax, mine, "T0", "excess_risk_change", color=color,
                                                  label=rf"$\zeta_V = {level:g}$")
            rows.append(stats.assign(attention=attention, zeta_value=level, best_T0=best["T0"]))
        ax.axhline(0.0, color="0.4", linewidth=1, linestyle=":")
        ax.set_title(f"{attention} attention")
        ax.set_xlabel(plotting.label("T0") + r"  ($T_0 = T$: FedAvg)")
        ax.set_ylabel(r"$R(T_0) - R(T)$, paired by seed")
    axes[0].legend(loc="upper right")
    plotting.note_dropped(axes[0], dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
