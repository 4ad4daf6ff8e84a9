"""One style for every figure: colour-blind-safe palette, the theory's symbols, atomic PNG+PDF+CSV output.

Every figure script in ``simulations/`` draws with :func:`figure`, labels axes with
:data:`LABELS`, and saves with :func:`save_figure`, which also writes the plotted numbers as a
CSV next to the image (the tests check it is non-empty and finite). Diverged runs are never
plotted as NaN: :func:`drop_diverged` removes them and :func:`note_dropped` says so on the axes.
"""

from __future__ import annotations

import io as _io
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from .io import atomic_write_bytes, atomic_write_text  # noqa: E402

__all__ = ["LABELS", "STRATEGY_NAMES", "label", "apply_style", "palette", "figure", "save_figure", "drop_diverged",
           "note_dropped", "mark_x", "seed_band", "data_ticks", "stacked_bars", "log_scale", "curve_rows", "PALETTE_NAME"]

PALETTE_NAME = "colorblind"

#: Axis and legend labels: the theory's symbols (docs/theory.md), keyed by result column.
LABELS = {
    "T0": r"warm-up length $T_0$",
    "federated.warmup_rounds": r"warm-up length $T_0$",
    "round": r"round $t$",
    "excess_risk": r"excess risk $R(T_0) = F_\lambda(\theta_T) - \Phi^*_\lambda$",
    "final_loss_regularized": r"final loss $F_\lambda(\theta_T)$",
    "final_loss": r"final loss $F(\theta_T)$",
    "loss_regularized": r"global loss $F_\lambda(\theta_t)$",
    "loss": r"global loss $F(\theta_t)$",
    "loss_gap": r"$F_\lambda(\theta_t) - \Phi^*_\lambda$",
    "profile": r"$\Phi_\lambda(K)$",
    "bias": r"kernel-profile bias $\Phi_\lambda(K_{T_0}) - \Phi^*_\lambda$",
    "drift_floor": r"value drift floor $D(K_{T_0})$",
    "unfinished": r"unfinished optimisation",
    "cumulative_kernel_drift": r"cumulative kernel drift $\Gamma(T_0)$",
    "kernel_drift": r"kernel drift per round",
    "drift_WV": r"value drift (client dispersion of $W_V$)",
    "bound": r"bound $U(T_0)$",
    "task.zeta_value": r"concept heterogeneity $\zeta_V$",
    "task.zeta_covariate": r"covariate heterogeneity $\zeta_X$",
    "zeta": r"client dissimilarity $\zeta$",
    "federated.learning_rate": r"step size $\eta$",
    "federated.local_steps": r"local steps $E$",
    "local_steps_minus_one": r"$E - 1$",
    "federated.strategy": "strategy",
    "rho": r"contraction rate $\rho$",
    "best_T0": r"best warm-up $T_0^{\mathrm{best}}$",
    "gain": r"gain over FedAvg",
    "seed": "seed",
}


#: Display names of the strategies (linattn_theory.strategies), for legends.
STRATEGY_NAMES = {
    "fedavg": "FedAvg", "fedfrozen": "FedFrozen", "random_kernel": "random kernel (T$_0$ = 0)",
    "value_frozen": "value frozen", "fedprox": "FedProx", "scaffold": "SCAFFOLD",
    "fedavgm": "FedAvgM", "fedadam": "FedAdam", "fedfrozen_fedprox": "FedFrozen + FedProx",
    "fedfrozen_scaffold": "FedFrozen + SCAFFOLD",
}


def label(key: str) -> str:
    """The axis label of a column (the key itself when it has none)."""
    return LABELS.get(key, key)


def apply_style() -> None:
    """Seaborn ``ticks`` theme, the colour-blind palette, readable fonts; idempotent."""
    sns.set_theme(context="paper", style="ticks", palette=PALETTE_NAME, font_scale=1.15,
                  rc={"figure.dpi": 110, "savefig.dpi": 160, "axes.grid": True,
                      "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
                      "legend.frameon": False, "figure.constrained_layout.use": True,
                      "pdf.fonttype": 42, "svg.fonttype": "none"})


def palette(n: int):
    """``n`` colours of the colour-blind palette (cycled when ``n`` > 10)."""
    base = sns.color_palette(PALETTE_NAME)
    return [base[i % len(base)] for i in range(n)]


def figure(ncols: int = 1, nrows: int = 1, *, width: float = 4.6, height: float = 3.5, **kwargs):
    """``(fig, axes)`` in the shared style; ``axes`` is a flat array when there is more than one."""
    apply_style()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), **kwargs)
    return fig, (np.ravel(axes) if nrows * ncols > 1 else axes)


def _check_data(name: str, data: pd.DataFrame) -> None:
    numeric = data.select_dtypes(include=[np.number, bool])
    if data.empty or numeric.empty:
        raise ValueError(f"figure {name!r}: the plotted data is empty")
    if not np.all(np.isfinite(numeric.to_numpy(dtype=float))):
        bad = [c for c in numeric if not np.all(np.isfinite(numeric[c].to_numpy(dtype=float)))]
        raise ValueError(f"figure {name!r}: non-finite plotted values in columns {bad}; "
                         "drop diverged runs (plotting.drop_diverged) instead of plotting NaN")


def save_figure(fig, name: str, out_dir, data: pd.DataFrame | None = None,
                formats=("png", "pdf")) -> list[Path]:
    """Write ``out_dir/name.png`` and ``.pdf`` atomically, plus ``name.csv`` of the plotted ``data``.

    ``data`` must be non-empty and finite (a figure is drawn from data, never a placeholder).
    Closes ``fig``; returns the written paths.
    """
    out = Path(out_dir)
    paths = []
    if data is not None:
        _check_data(name, data)
        paths.append(atomic_write_text(out / f"{name}.csv",
                                       data.to_csv(index=False, float_format="%.10g")))
    for fmt in formats:
        buf = _io.BytesIO()
        fig.savefig(buf, format=fmt, metadata={"Creator": "linattn-theory"} if fmt == "png" else None)
        paths.append(atomic_write_bytes(out / f"{name}.{fmt}", buf.getvalue()))
    plt.close(fig)
    return paths


def drop_diverged(results: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``(results without diverged runs, how many were dropped)``."""
    if "diverged" not in results:
        return results, 0
    keep = ~results["diverged"].astype(bool)
    return results[keep], int((~keep).sum())


def note_dropped(ax, dropped: int, what: str = "diverged run") -> None:
    """Say on the axes that ``dropped`` runs are not shown (nothing when 0)."""
    if dropped:
        noun = what if dropped == 1 else f"{what}s"
        ax.text(0.99, 0.01, f"{dropped} {noun} not shown", transform=ax.transAxes,
                ha="right", va="bottom", fontsize="small", color="0.35")


def mark_x(ax, x: float, text: str, color, linestyle: str = "--") -> None:
    """A vertical marker at ``x`` with its legend entry ``text``."""
    ax.axvline(x, color=color, linestyle=linestyle, linewidth=1.2, label=text)


def _plain(value: float, _=None) -> str:
    return f"{value:g}"


def log_scale(ax, axis: str = "y") -> None:
    """A log axis labelled in plain numbers (``0.3``, ``2``, ``1e-05``).

    Minor ticks are labelled where few decades are shown: all of them within about one decade,
    those at 2 and 5 within three, none beyond.
    """
    from matplotlib.ticker import FuncFormatter
    getattr(ax, f"set_{axis}scale")("log")
    target = ax.xaxis if axis == "x" else ax.yaxis

    def minor(value, _=None):
        low, high = sorted(target.get_view_interval())
        decades = np.log10(high / low) if low > 0 else np.inf
        mantissa = round(value / 10 ** np.floor(np.log10(value) + 1e-12), 6)
        if decades <= 1.2 or (decades <= 3 and mantissa in (2, 5)):
            return _plain(float(f"{value:.6g}"))
        return ""
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(FuncFormatter(minor))


def data_ticks(ax, values, axis: str = "x") -> None:
    """Ticks of a log axis at the data values, labelled as plain numbers (``0.005``, not ``5×10⁻³``)."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator
    values = sorted(set(float(v) for v in values))
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(values))
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())


def stacked_bars(ax, x, parts: dict, colors, width: float = 0.8) -> None:
    """Bars of ``parts`` (``{label: values}``) stacked at ``x``: positive values upwards from 0,
    negative ones downwards, so that a signed decomposition reads off exactly."""
    x = np.asarray(x, dtype=float)
    up, down = np.zeros(len(x)), np.zeros(len(x))
    for (name, values), color in zip(parts.items(), colors):
        values = np.asarray(values, dtype=float)
        bottom = np.where(values >= 0, up, down)
        ax.bar(x, values, width=width, bottom=bottom, color=color, label=name, linewidth=0)
        up = up + np.clip(values, 0, None)
        down = down + np.clip(values, None, 0)


def curve_rows(x: str, series: pd.Series, count: int, **labels) -> pd.DataFrame:
    """A plotted line (``series`` indexed by ``x``) in :func:`seed_band`'s table format, for the CSV."""
    values = series.to_numpy(dtype=float)
    return pd.DataFrame({x: series.index, "mean": values, "min": values, "max": values,
                         "count": count, **labels})


def seed_band(ax, data: pd.DataFrame, x: str, y: str, *, color, label: str | None = None,
              marker: str = "o") -> pd.DataFrame:
    """Mean of ``y`` over seeds against ``x`` with a band from the smallest to the largest seed.

    Returns the plotted summary (``x``, mean, min, max, count) for the figure's CSV.
    """
    stats = data.groupby(x)[y].agg(["mean", "min", "max", "count"]).reset_index()
    ax.plot(stats[x], stats["mean"], marker=marker, markersize=3.5, color=color, label=label)
    if (stats["count"] > 1).any():
        ax.fill_between(stats[x], stats["min"], stats["max"], color=color, alpha=0.2, linewidth=0)
    return stats


def seed_band_best(ax, data: pd.DataFrame, x: str, y: str, *, color, label: str | None = None,
                   best: str = "min") -> tuple[pd.DataFrame, pd.Series]:
    """:func:`seed_band` plus a star at the best point of the seed mean (``best``: ``"min"`` or ``"max"``).

    Returns ``(stats, best row)``.
    """
    stats = seed_band(ax, data, x, y, color=color, label=label)
    row = stats.loc[stats["mean"].idxmin() if best == "min" else stats["mean"].idxmax()]
    ax.plot(row[x], row["mean"], marker="*", markersize=12, color=color, markeredgecolor="black",
            linestyle="none")
    return stats, row
