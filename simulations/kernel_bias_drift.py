"""Figure 1: the kernel-profile bias of K_{T0} and the cumulative kernel drift Γ(T0) against T0.

Claim (docs/theory.md §4, §6): a longer warm-up buys a better kernel, the bias
Φ_λ(K_{T0}) − Φ*_λ falls (at first geometrically), while the heterogeneous local steps drift
apart: the cumulative kernel drift Γ(T0) = Σ_{t<T0} Σ_c p_c ‖K_c^{t,E} − K^{t+1}‖_F² grows with
T0, faster for more heterogeneous clients, and the bias stops falling. Lines: medians over
instances (seeds), bands: interquartile range; dashed: the bias term of the bound
(linattn_theory.theory.bound, docs/theory.md §6), max_{t≤t_s} bias(K_t) before the burn-in round t_s,
then b_∞ + (b_s − b_∞) q^{T0−t_s}, whose constants are fitted on each instance's own FedAvg path:
an a posteriori fit (descriptive, not a prediction), median over instances.

Config: simulations/configs/tradeoff.toml (the sweep of figure 2).
Run: python simulations/kernel_bias_drift.py [--quick] [--out figures]
"""

import sys
from pathlib import Path

try:
    import linattn_theory  # noqa: F401
except ImportError:  # a checkout without installing: the package is next to simulations/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linattn_theory.report.figures import config_path, script_main

NAME = "kernel_bias_drift"
CONFIG = config_path(__file__, "tradeoff")
HUE = "task.zeta_value"


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the tradeoff sweep, draw bias and Γ against T0, write kernel_bias_drift.*."""
    import pandas as pd               # imported here: ``--help`` needs none of them
    from matplotlib.lines import Line2D

    from linattn_theory.report import plotting
    from linattn_theory.report.figures import excess_risk_sweep

    table, best, left_out = excess_risk_sweep(CONFIG, out_dir, by=(HUE, "seed"), bound=True, quick=quick,
                                              executor=executor, workers=workers, progress=progress)
    fig, (ax_bias, ax_drift) = plotting.figure(2, height=2.5, quick=quick)
    levels = sorted(table[HUE].unique())
    rows = []
    for level in levels:
        sub = table[table[HUE] == level]
        color, name = plotting.heterogeneity_color(level), plotting.heterogeneity_label(level)
        bias = plotting.instance_band(ax_bias, sub, "T0", "bias", color=color, label=name)
        bound = sub.groupby("T0")["bias_bound"].median()
        ax_bias.plot(bound.index, bound.to_numpy(), "--", color=color, linewidth=1.2)
        drift = plotting.instance_band(ax_drift, sub, "T0", "cumulative_kernel_drift", color=color)
        rows += [bias.assign(quantity="bias", zeta_value=level),
                 plotting.curve_rows("T0", bound, sub["seed"].nunique(), quantity="bias_bound",
                                     zeta_value=level),
                 drift.assign(quantity="cumulative_kernel_drift", zeta_value=level)]
    plotting.log_scale(ax_bias)
    ax_bias.set_xlabel(plotting.label("T0"))
    ax_bias.set_ylabel(plotting.label("bias"))
    ax_bias.set_title("the kernel improves with the warm-up")
    handles, _ = ax_bias.get_legend_handles_labels()
    fit = Line2D([], [], linestyle="--", color=plotting.REFERENCE_COLOR,
                 label="bias term of $U(T_0)$: a posteriori fit (descriptive), median")
    plotting.legend_below(fig, handles + [fit], ncols=4)
    fig.suptitle("; ".join(filter(None, ["bands: " + plotting.band_text(best.groupby(HUE).size()) + " per level",
                                         plotting.left_out_text(len(left_out))])))
    ax_drift.set_xlabel(plotting.label("T0"))
    ax_drift.set_ylabel(plotting.label("cumulative_kernel_drift"))
    ax_drift.set_title("and accumulates client drift")
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
