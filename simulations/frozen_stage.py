"""Figure 7: the frozen stage lands on the closed-form FedAvg fixed point at the predicted rate.

Claim (docs/theory.md §5): with the kernel frozen at K_{T0}, a round is the affine map
V ← M V + b, so V^t − V_FA = M^{t−T0} (V^{T0} − V_FA) with V_FA = (Σ_c p_c P_c)^{-1} Σ_c p_c P_c V*_c,
and ‖V^t − V_FA‖ ≤ ρ^{t−T0} ‖V^{T0} − V_FA‖ (ρ the spectral radius of the symmetric M). The
loss converges to F_λ(K_{T0}, V_FA) = Φ_λ(K_{T0}) + D(K_{T0}), above the profile objective by
the value drift floor. Left: the simulated distance to V_FA (markers) and the bound ρ^k (dashed)
against the frozen rounds k = T − T0; right: F_λ(θ_t) − Φ_λ(K_{T0}) over the rounds of the
longest run, converging to D(K_{T0}) (dotted). Shades of grey, light to dark, and the markers tell
the local steps E apart.

Config: simulations/configs/frozen_stage.toml. Run: python simulations/frozen_stage.py [--quick] [--out figures]
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
from linattn_theory.report.figures import config_path, figure_sweep, script_main
from linattn_theory.core.model import value_matrix, kernel
from linattn_theory.report.sweep_analysis import runs_by_instance
from linattn_theory.theory.frozen_stage import contraction_rate, fedavg_fixed_point, value_drift_floor
from linattn_theory.theory.profile import profile_objective

NAME = "frozen_stage"
CONFIG = config_path(__file__, "frozen_stage")


def local_steps_colors(steps):
    """Shades of grey, light to dark as E grows (E is neither a method nor a heterogeneity level)."""
    return [str(round(0.6 - 0.6 * i / max(len(steps) - 1, 1), 2)) for i in range(len(steps))]


def distances(folder, results) -> tuple[pd.DataFrame, dict]:
    """Per run: ``k = T − T0`` and ``‖V_T − V_FA‖_F / ‖V_FA‖_F``; per E: the longest run's theory.

    Every run of one E shares the warm-up, hence ``K_{T0}`` (checked bit for bit).
    """
    rows, longest, frozen_kernel = [], {}, {}
    for clients, runs in runs_by_instance(folder, results):
        for rid, (config, run) in runs.items():
            if run.diverged:
                continue
            fed = config.federated
            K = kernel(run.warmup_params)
            E = fed.local_steps
            if not np.array_equal(frozen_kernel.setdefault(E, K), K):
                raise AssertionError(f"E = {E}: runs froze different kernels; the warm-up is not shared")
            V_FA = fedavg_fixed_point(K, clients, fed.learning_rate, E, fed.ridge)
            V_T = value_matrix(np, run.params.WV)
            rows.append({"run_id": rid, "local_steps": E, "frozen_rounds": fed.rounds - fed.warmup_rounds,
                         "distance": float(np.linalg.norm(V_T - V_FA) / np.linalg.norm(V_FA))})
            if E not in longest or fed.rounds > longest[E]["rounds"]:
                longest[E] = {"rounds": fed.rounds, "T0": fed.warmup_rounds, "run": run,
                              "rho": contraction_rate(K, clients, fed.learning_rate, E, fed.ridge),
                              "profile": profile_objective(K, clients, fed.ridge)[0],
                              "drift_floor": value_drift_floor(K, clients, fed.learning_rate, E, fed.ridge)}
    return pd.DataFrame(rows).sort_values(["local_steps", "frozen_rounds"], ignore_index=True), longest


def make(out_dir="figures", quick=False, executor="processes", workers=None, progress=False):
    """Run (or reuse) the sweep, draw both panels, write frozen_stage.*; returns the paths."""
    _, results, folder = figure_sweep(CONFIG, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    results, dropped = plotting.drop_diverged(results)
    table, longest = distances(folder, results)
    fig, (ax, ax_loss) = plotting.figure(2, height=2.5, quick=quick)
    steps = sorted(longest)
    rows = []
    for E, color, marker in zip(steps, local_steps_colors(steps), "os^D"):
        sub = table[table["local_steps"] == E]
        info = longest[E]
        start = sub.loc[sub["frozen_rounds"].idxmin()]
        k = np.linspace(0, sub["frozen_rounds"].max(), 200)
        bound = start["distance"] * info["rho"] ** (k - start["frozen_rounds"])
        ax.plot(sub["frozen_rounds"], sub["distance"], marker, color=color, markersize=3.5,
                label=rf"$E = {E}$, $\rho = {info['rho']:.3f}$")
        ax.plot(k, bound, "--", color=color, linewidth=1.1)
        frozen = info["run"].table
        frozen = frozen[frozen["round"] >= info["T0"]]
        gap = frozen["loss_regularized"] - info["profile"]
        ax_loss.plot(frozen["round"], gap, color=color)
        ax_loss.axhline(info["drift_floor"], color=color, linestyle=":", linewidth=1.3)
        rows.append(sub.assign(rho=info["rho"], drift_floor=info["drift_floor"],
                               final_gap=float(gap.iloc[-1])))
    plotting.log_scale(ax)
    eps = float(np.finfo(np.float64).eps)
    ax.axhline(eps, color="0.5", linewidth=0.8, linestyle="-.")
    ax.text(0.02, eps * 3, "float64 precision", transform=ax.get_yaxis_transform(), ha="left",
            va="bottom", color="0.35")
    ax.set_ylim(bottom=eps / 30)
    ax.set_xlabel(r"frozen rounds $k = T - T_0$")
    ax.set_ylabel(r"$\|V_T - V_{FA}\|_F \,/\, \|V_{FA}\|_F$")
    ax.set_title(r"distance to the fixed point $V_{FA}(K_{T_0})$")
    plotting.log_scale(ax_loss)
    ax_loss.set_xlabel(plotting.label("round"))
    ax_loss.set_ylabel(r"$F_\lambda(\theta_t) - \Phi_\lambda(K_{T_0})$")
    ax_loss.set_title("loss above the profile objective")
    handles, _ = ax.get_legend_handles_labels()
    plotting.legend_below(fig, handles + [
        Line2D([], [], linestyle="--", color="0.4", label=r"bound $\rho^{k}$ (closed form)"),
        Line2D([], [], linestyle=":", color="0.4", label=r"drift floor $D(K_{T_0})$ (closed form)")], ncols=3)
    fig.suptitle(f"one instance (seed {int(results['seed'].iloc[0])}); the frozen kernel is shared by every run of one E")
    plotting.note_dropped(ax, dropped)
    return plotting.save_figure(fig, NAME, out_dir, pd.concat(rows, ignore_index=True))


if __name__ == "__main__":
    sys.exit(script_main(make, __doc__))
