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
from scipy.stats import spearmanr

from linattn_theory.report import plotting
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.core.model import kernel
from linattn_theory.theory.static_heads import head_static_loss_change
from linattn_theory.report.sweep_analysis import runs_by_instance

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
    """Per ζ_V: Spearman's ρ between share and loss change, and how often the largest share is the cheapest head."""
    rows = []
    for level, sub in heads.groupby("zeta_value"):
        per_run = sub.groupby("run_id")
        picked = per_run.apply(lambda g: g["head"].iloc[int(np.argmax(g["share"].to_numpy()))]
                               == g["head"].iloc[int(np.argmin(g["loss_change"].to_numpy()))])
        rho = spearmanr(sub["share"], sub["loss_change"]).statistic if sub["share"].nunique() > 1 else np.nan
        rows.append({"zeta_value": level, "spearman": float(rho), "heads": len(sub),
                     "instances": int(per_run.ngroups), "largest_share_is_cheapest": int(picked.sum())})
    return pd.DataFrame(rows)


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the warm-ups, analyse every head, write static_heads.* and static_heads_summary.csv."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    heads = head_table(folder, results)
    summary = level_summary(heads)
    levels = sorted(heads["zeta_value"].unique())
    colors = dict(zip(levels, plotting.palette(len(levels))))
    markers = dict(zip(levels, "osD^v"))
    fig, (ax, ax_sum) = plotting.figure(2, height=2.6, quick=quick)
    for level in levels:
        sub = heads[heads["zeta_value"] == level]
        ax.plot(sub["share"], 100 * sub["relative_loss_change"], markers[level], color=colors[level],
                markersize=3, alpha=0.8, markerfacecolor="none", label=rf"$\zeta_V = {level:g}$")
    ax.set_xlabel(r"input-independent share $\omega_h$ of the head")
    ax.set_ylabel(r"loss change when static (% of $\Phi_\lambda$)")
    ax.set_title("one dot per head and instance")
    ax.set_yscale("symlog", linthresh=1.0)      # spans decades; a few changes are near or below 0
    ax.axhline(0, color="0.3", linewidth=0.8)
    x = np.arange(len(levels))
    ax_sum.bar(x, summary["spearman"], color=[colors[v] for v in levels], width=0.6)
    top = ax_sum.get_xaxis_transform()
    for i, r in enumerate(summary.itertuples()):
        ax_sum.text(i, 0.87, f"{r.largest_share_is_cheapest}/{r.instances}", transform=top, ha="center", va="top")
    ax_sum.text(0.5, 0.97, "largest share = cheapest head in (instances):", transform=ax_sum.transAxes,
                ha="center", va="top", color="0.3")
    ax_sum.axhline(0, color="0.3", linewidth=0.8)
    ax_sum.set_ylim(-1.1, 1.6)
    ax_sum.set_xticks(x, [f"{v:g}" for v in levels])
    ax_sum.set_xlabel(plotting.label(HUE))
    ax_sum.set_ylabel(r"Spearman $\rho$($\omega_h$, loss change)")
    ax_sum.set_title("does a large share mean a cheap static head?")
    plotting.legend_below(fig, ncols=len(levels))
    n = int(summary["instances"].max())
    fig.suptitle("; ".join(filter(None, [f"{n} instances per level, {heads['head'].nunique()} heads each, "
                                         "kernel after a FedAvg warm-up", plotting.dropped_text(dropped)])))
    paths = plotting.save_figure(fig, f"{NAME}_summary", out_dir, summary, formats=())
    return paths + plotting.save_figure(fig, NAME, out_dir, heads)


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
