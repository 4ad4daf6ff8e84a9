"""Figure 9: each head's static-ness criterion against the loss change when that head is made static.

Claim (docs/theory.md §7): the input-independent share ω_h = Var_i(E[s_h | i]) / Var[s_h] of a
head's scores says how much of its attention is a fixed positional pattern, so the heads with a
large ω_h are the ones that can be made static (their mean-score pattern, calibrated at the
kernel) at little cost, whatever the heterogeneity. For every head h of the kernel K_{T0} a
federated warm-up reaches (FedAvg, T0 rounds), the loss change is the closed form
Φ_λ(K; h static) − Φ_λ(K) (linattn_theory.theory.static_heads.head_static_loss_change: the best F_λ a value
block reaches with h static, minus that with h attending), relative to Φ_λ(K). Left: one dot per
(instance, head), colour the heterogeneity level ζ_V; right: per level, Spearman's rank
correlation between ω_h and the loss change over all heads and instances, and in how many
instances the selection rule (make static the head with the largest ω_h, SAF-style) picks the head
whose staticisation costs least.

Config: simulations/configs/static_heads.toml. Run: python simulations/static_heads.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.core.model import kernel
from linattn_theory.theory.static_heads import head_static_loss_change
from linattn_theory.report.sweep_analysis import runs_by_instance, spearman_interval

NAME = "static_heads"
CONFIG = config_path(__file__, "static_heads")
HUE = "task.zeta_value"


def head_table(folder, results) -> pd.DataFrame:
    """One row per (run, head): ζ_V, seed, the share ω_h and the (relative) loss change."""
    tables = []
    for clients, runs in runs_by_instance(folder, results):
        for rid, (config, run) in runs.items():
            if run.diverged:
                continue
            heads = head_static_loss_change(kernel(run.warmup_params), clients, config.federated.ridge)
            tables.append(heads.assign(run_id=rid, zeta_value=config.task.zeta_value, seed=config.seed))
    return pd.concat(tables, ignore_index=True)


def level_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """Per ζ_V: Spearman's ρ between share and loss change with its bootstrap interval over instances,
    and how often the largest share is the cheapest head."""
    rows = []
    for level, sub in heads.groupby("zeta_value"):
        per_run = sub.groupby("run_id")
        picked = per_run.apply(lambda g: g["head"].iloc[int(np.argmax(g["share"].to_numpy()))]
                               == g["head"].iloc[int(np.argmin(g["loss_change"].to_numpy()))])
        rho = spearman_interval(sub["share"], sub["loss_change"], sub["run_id"])
        rows.append({"zeta_value": level, "spearman": rho["rho"], "spearman_low": rho["low"],
                     "spearman_high": rho["high"], "heads": len(sub), "instances": int(per_run.ngroups),
                     "largest_share_is_cheapest": int(picked.sum())})
    return pd.DataFrame(rows)


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the warm-ups, analyse every head, write static_heads.* and static_heads_summary.csv."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    heads = head_table(folder, results)
    summary = level_summary(heads)
    levels = sorted(heads["zeta_value"].unique())
    colors = {level: plotting.heterogeneity_color(level) for level in levels}
    markers = dict(zip(levels, "osD^v"))
    fig, (ax, ax_sum) = plotting.figure(2, height=2.6, quick=quick)
    for level in levels:
        sub = heads[heads["zeta_value"] == level]
        ax.plot(sub["share"], 100 * sub["relative_loss_change"], markers[level], color=colors[level],
                markersize=3, alpha=0.8, markerfacecolor="none", label=plotting.heterogeneity_label(level))
    ax.set_xlabel(r"input-independent share $\omega_h$ of the head")
    ax.set_ylabel(r"loss change when static (% of $\Phi_\lambda$)")
    ax.set_title("one dot per head and instance")
    plotting.symlog_scale(ax, 1.0)      # spans decades; a few changes are near or below 0
    ax.axhline(0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
    x = np.arange(len(levels))
    for i, r in enumerate(summary.itertuples()):
        ax_sum.errorbar([i], [r.spearman], yerr=[[r.spearman - r.spearman_low], [r.spearman_high - r.spearman]],
                        fmt=markers[r.zeta_value], color=colors[r.zeta_value], markersize=5, capsize=3,
                        linewidth=1.2)
        ax_sum.text(i + 0.08, r.spearman, f"{r.spearman:+.2f}", ha="left", va="center")
    heads_per_model = int(heads.groupby("run_id").size().max())
    ax_sum.axhline(0, color=plotting.REFERENCE_COLOR, linewidth=0.8)
    ax_sum.set_ylim(-1.05, 1.05)
    ax_sum.set_xlim(-0.5, len(levels) - 0.5)
    ax_sum.set_xticks(x, [f"{r.zeta_value:g}\n{r.largest_share_is_cheapest}/{r.instances}" for r in summary.itertuples()])
    ax_sum.set_xlabel(plotting.label(HUE) + "\n" + rf"$k/n$: largest share = cheapest head (chance 1/{heads_per_model})")
    ax_sum.set_ylabel(r"Spearman $\rho$, 95 % interval")
    ax_sum.set_title(r"large share, cheap static head? $\rho(\omega_h$, loss change$)$")
    plotting.legend_below(fig, ncols=len(levels))
    n = int(summary["instances"].max())
    fig.suptitle("; ".join(filter(None, [f"{n} instances per level, {heads['head'].nunique()} heads each, "
                                         "kernel after a FedAvg warm-up", plotting.dropped_text(dropped)])))
    paths = plotting.save_figure(fig, f"{NAME}_summary", out_dir, summary, formats=())
    return paths + plotting.save_figure(fig, NAME, out_dir, heads)


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
