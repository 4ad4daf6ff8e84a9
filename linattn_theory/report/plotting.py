"""One visual language for every figure: print sizes, colours by meaning, the theory's symbols, atomic PNG+PDF+CSV output.

Every figure script in ``simulations/`` draws with :func:`figure` (3.5 in or 7 in wide, text of at
least 7 pt; ``quick=True`` marks a smoke-test figure), labels axes with :data:`LABELS`, takes every
colour from a meaning, defined once here: a method from :data:`METHODS` (name, colour, marker; no
two methods of a panel of :data:`METHOD_PANELS` share a colour), a heterogeneity level from
:func:`heterogeneity_color` (one sequential map, the same shade for a ``ζ_V`` in every figure), an
attention type from :data:`ATTENTION`, instances and statistics from the neutral colours; puts its
legend under the axes (:func:`legend_below`), draws medians with interquartile bands over
instances (:func:`instance_band`; :func:`band_text` says so on the figure), marks the per-instance
best warm-up the same way everywhere (:func:`mark_best_T0`) and saves with :func:`save_figure`, which checks the print size
(:func:`check_print_ready`), writes fixed metadata (no date: a rerun gives the same bytes) and the
plotted numbers as a CSV next to the image (the tests check it is non-empty and finite). Diverged
runs are never plotted as NaN: :func:`drop_diverged` removes them and :func:`note_dropped` says so.
"""

from __future__ import annotations

import io as _io
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker

if "matplotlib.pyplot" not in sys.modules:    # a script draws off-screen; a notebook keeps its backend
    matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..core.io import atomic_write_bytes, atomic_write_text  # noqa: E402
from .style import COLORBLIND, PAPER_TICKS  # noqa: E402

__all__ = ["LABELS", "STRATEGY_NAMES", "label", "apply_style", "palette", "figure", "save_figure", "drop_diverged",
           "note_dropped", "dropped_text", "mark_x", "instance_band", "data_ticks", "stacked_bars", "log_scale",
           "symlog_scale", "curve_rows", "legend_below", "check_print_ready", "heatmap", "PALETTE_NAME",
           "COLUMN_WIDTH",
           "FULL_WIDTH", "MIN_FONT_SIZE", "QUICK_MARK", "Style", "METHODS", "METHOD_PANELS", "PANELS", "COLORS",
           "ATTENTION",
           "method_style", "heterogeneity_color", "heterogeneity_label", "heterogeneity_style", "SEED_MARKERS",
           "INSTANCE_COLOR", "REFERENCE_COLOR", "STATISTIC_COLOR", "mark_best_T0", "best_T0_handle",
           "BEST_T0_LABEL", "room_on_top", "strip_offsets", "band_text", "left_out_text"]

PALETTE_NAME = "colorblind"
#: figure widths in inches: one column and two columns of a paper (text at 7 pt or more at that size)
COLUMN_WIDTH, FULL_WIDTH = 3.5, 7.0
MIN_FONT_SIZE = 7.0
#: written across every quick-mode figure (small grids: a smoke test, not the result)
QUICK_MARK = "QUICK MODE: smoke test, not the result"
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


@dataclass(frozen=True)
class Style:
    """How one meaning is drawn in every figure: its legend name, colour, marker and line style.

    Parameters
    ----------
    label : str
        The legend name.
    color : str
        The colour.
    marker : str, default "o"
        The marker.
    linestyle : str, default "-"
        The line style.

    Examples
    --------
    >>> from linattn_theory.report.plotting import Style
    >>> style = Style("FedAvg", "#0173b2")
    >>> style.marker, style.linestyle, Style("x", "black", linestyle="--").linestyle
    ('o', '-', '--')
    """

    label: str
    color: str
    marker: str = "o"
    linestyle: str = "-"


#: the colour-blind-safe qualitative colours of the methods (seaborn's "colorblind", Okabe–Ito, and
#: Paul Tol's olive) and of the attention types (Tol's dark cyan and teal); the
#: purples and pinks of the colour map RdPu are left to the heterogeneity levels
BLUE, ORANGE, GREEN, VERMILLION, BROWN = "#0173b2", "#de8f05", "#029e73", "#d55e00", "#ca9161"
LIGHT_BLUE, TEAL, OLIVE, GREY = "#56b4e9", "#44aa99", "#999933", "#949494"
DARK_CYAN = "#225555"
#: neutral colours: single instances (seeds) and reference lines, and statistics over instances
INSTANCE_COLOR, REFERENCE_COLOR, STATISTIC_COLOR = "0.55", "0.35", "black"

#: the method colours by name, for the strategies' declarations (``style=(label, colour, marker)``)
COLORS = {"blue": BLUE, "orange": ORANGE, "green": GREEN, "vermillion": VERMILLION, "brown": BROWN,
          "light_blue": LIGHT_BLUE, "teal": TEAL, "olive": OLIVE, "grey": GREY, "dark_cyan": DARK_CYAN}


def _strategy_styles() -> dict:
    """The style each registered strategy declares (``@declare(style=...)``, its module), by name."""
    from ..sim.strategies import STRATEGIES, declaration
    styles = {}
    for name in STRATEGIES:
        style = declaration(name).style
        if style:
            label, color, *rest = style
            styles[name] = Style(label, COLORS.get(color, color), *rest)
    return styles


#: Every method (a strategy of linattn_theory.sim.strategies, or a static arm of simulations/strategies.py)
#: has one name, colour and marker in every figure and the notebook; a strategy declares its own
#: (``style`` of its :class:`~linattn_theory.sim.strategies.base.Declaration`). A colour is shared only by
#: methods that never share a panel (:data:`METHOD_PANELS`): FedFrozen's combinations take the colour
#: of what they add (FedProx, SCAFFOLD), the static arms those of other methods. The
#: FedFrozen variants of one figure (``fedfrozen_best``, ``fedfrozen_theory``) are FedFrozen with
#: another warm-up: FedFrozen's colour and marker, another line style.
METHODS = {
    **_strategy_styles(),
    "fedfrozen_best": Style(r"FedFrozen at its best $T_0$", ORANGE, "s"),
    "fedfrozen_theory": Style(r"FedFrozen at $T_0^{\mathrm{theory}}$ (a posteriori fit)", ORANGE, "s", "--"),
    "static_uniform": Style("static: uniform", VERMILLION, "p"),
    "static_decay": Style("static: decay", BROWN, "h"),
    "static_calibrated": Style(r"static: calibrated at $T_0$", GREEN, "d"),
    "static_saf": Style(r"SAF: most static head at $T_0$", OLIVE, "8"),
    "centralised": Style("centralised gradient descent", STATISTIC_COLOR, "", "--"),
}
#: the panels of the strategies figure, ``{key: (title, methods drawn first, methods drawn last)}``;
#: between them the strategies that declare the panel (``panel=key``), in registry order
PANELS = {
    "baselines": ("FedAvg and federated baselines", ("fedavg",), ("fedfrozen",)),
    "fedfrozen": ("FedFrozen and its combinations", ("fedfrozen",), ("fedavg",)),
    "fixed": ("fixed or frozen blocks", (), ("static_uniform", "static_decay", "static_calibrated", "static_saf",
                                             "fedavg", "fedfrozen")),
}


def _method_panels() -> dict:
    from ..sim.strategies import STRATEGIES, declaration
    unknown = {name: declaration(name).panel for name in STRATEGIES}
    unknown = {name: panel for name, panel in unknown.items() if panel is not None and panel not in PANELS}
    if unknown:
        raise ValueError(f"strategies declare panels that do not exist: {unknown}; expected one of {sorted(PANELS)}")
    return {title: first + tuple(n for n in STRATEGIES if declaration(n).panel == key) + last
            for key, (title, first, last) in PANELS.items()}


#: the panels of the strategies figure: within one, no two methods share a colour
METHOD_PANELS = _method_panels()
#: Display names of the strategies, for legends and tables (the labels of :data:`METHODS`).
STRATEGY_NAMES = {name: style.label for name, style in METHODS.items()}

#: Attention types (docs/theory.md §9): one colour, marker and line style each.
ATTENTION = {"linear": Style("linear attention", DARK_CYAN, "o", "-"),
             "softmax": Style("softmax attention", TEAL, "^", "--")}

#: Heterogeneity levels: a sequential colour map, light for homogeneous clients, dark for the most
#: heterogeneous level of the figures (ζ_V = 3); a level has the same colour in every figure.
HETEROGENEITY_CMAP = "RdPu"
HETEROGENEITY_RANGE = (0.0, 3.0)           # ζ_V mapped to the colour map's positions 0.4 .. 0.95
_CMAP_SPAN = (0.4, 0.95)


def heterogeneity_color(zeta_value: float):
    """The colour of the concept-heterogeneity level ``ζ_V`` (the same in every figure; clipped to 0..3).

    Parameters
    ----------
    zeta_value : float
        ``ζ_V``.

    Returns
    -------
    str
        A hex colour.

    Examples
    --------
    >>> from linattn_theory.report.plotting import heterogeneity_color
    >>> heterogeneity_color(3.0) == heterogeneity_color(10.0)    # clipped to 0..3
    True
    >>> heterogeneity_color(0.0) != heterogeneity_color(3.0), len(heterogeneity_color(1.0))
    (True, 7)
    """
    low, high = HETEROGENEITY_RANGE
    share = (min(max(float(zeta_value), low), high) - low) / (high - low)
    position = _CMAP_SPAN[0] + share * (_CMAP_SPAN[1] - _CMAP_SPAN[0])
    return matplotlib.colors.to_hex(matplotlib.colormaps[HETEROGENEITY_CMAP](position))


def heterogeneity_label(zeta_value: float) -> str:
    """The legend name of a heterogeneity level: ``$\\zeta_V = 3$``.

    Parameters
    ----------
    zeta_value : float
        ``ζ_V``.

    Returns
    -------
    str
        The label (mathtext).

    Examples
    --------
    >>> from linattn_theory.report.plotting import heterogeneity_label
    >>> print(heterogeneity_label(3), heterogeneity_label(0.5))
    $\\zeta_V = 3$ $\\zeta_V = 0.5$
    """
    return rf"$\zeta_V = {float(zeta_value):g}$"


def heterogeneity_style(zeta_value: float) -> Style:
    """:class:`Style` of a heterogeneity level (its colour, name, circles and solid lines).

    Parameters
    ----------
    zeta_value : float
        ``ζ_V``.

    Returns
    -------
    Style
        Its style.

    Examples
    --------
    >>> from linattn_theory.report.plotting import heterogeneity_color, heterogeneity_label, heterogeneity_style
    >>> style = heterogeneity_style(1.0)
    >>> style.color == heterogeneity_color(1.0), style.label == heterogeneity_label(1.0), style.marker
    (True, True, 'o')
    """
    return Style(heterogeneity_label(zeta_value), heterogeneity_color(zeta_value))


def method_style(name: str) -> Style:
    """:class:`Style` of a method (strategy or static arm); raises ``KeyError`` naming the known ones.

    Parameters
    ----------
    name : str
        A strategy (``fedavg``, ``fedfrozen``, …) or static arm.

    Returns
    -------
    Style
        Its style.

    Examples
    --------
    >>> from linattn_theory.report.plotting import method_style
    >>> method_style("fedfrozen_best").color == method_style("fedfrozen_theory").color
    True
    >>> method_style("fedfrozen_best").linestyle, method_style("fedfrozen_theory").linestyle
    ('-', '--')
    """
    if name not in METHODS:
        raise KeyError(f"method {name!r} has no style; expected one of {', '.join(METHODS)}")
    return METHODS[name]


#: markers of single instances (seeds) drawn in a neutral colour, told apart by shape
SEED_MARKERS = "osD^v<>ph"


def label(key: str) -> str:
    """The axis label of a column (the key itself when it has none).

    Parameters
    ----------
    key : str
        A column (``task.zeta_value``, ``excess_risk``, …).

    Returns
    -------
    str
        Its label (mathtext where it names a symbol).

    Examples
    --------
    >>> from linattn_theory.report.plotting import label
    >>> label("T0"), label("no_such_column")
    ('warm-up length $T_0$', 'no_such_column')
    """
    return LABELS.get(key, key)


def apply_style() -> None:
    """Seaborn's ``ticks`` theme (:data:`~linattn_theory.report.style.PAPER_TICKS`, without importing
    seaborn), the colour-blind palette, print sizes (7–8 pt text); idempotent.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib
    >>> from linattn_theory.report.plotting import apply_style
    >>> apply_style()
    >>> matplotlib.rcParams["font.size"], matplotlib.rcParams["pdf.fonttype"]
    (8.0, 42)
    """
    matplotlib.rcParams.update(PAPER_TICKS)
    matplotlib.rcParams.update({"figure.dpi": 110, "savefig.dpi": 300, "axes.grid": True,
                                 "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
                                 "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "figure.titlesize": 8,
                                 "xtick.labelsize": 7, "ytick.labelsize": 7, "legend.fontsize": 7,
                                 "legend.title_fontsize": 7, "lines.linewidth": 1.2, "lines.markersize": 3.5,
                                 "legend.frameon": False, "figure.constrained_layout.use": True,
                                 "pdf.fonttype": 42, "svg.fonttype": "none"})


def palette(n: int):
    """``n`` colours of the colour-blind palette (cycled when ``n`` > 10), for categories that have no
    entry of their own; methods, heterogeneity levels and attention types take theirs from
    :data:`METHODS`, :func:`heterogeneity_color` and :data:`ATTENTION`.

    Parameters
    ----------
    n : int
        How many colours.

    Returns
    -------
    list
        ``n`` colours.

    Examples
    --------
    >>> from linattn_theory.report.plotting import palette
    >>> colors = palette(12)
    >>> len(colors), colors[10] == colors[0], colors[1] == colors[0]
    (12, True, False)
    """
    base = [matplotlib.colors.to_rgb(c) for c in COLORBLIND]
    return [base[i % len(base)] for i in range(n)]


def figure(ncols: int = 1, nrows: int = 1, *, width: str = "full", height: float = 2.4,
           quick: bool = False, **kwargs):
    """``(fig, axes)`` in the shared style; ``axes`` is a flat array when there is more than one.

    ``width`` is ``"full"`` (two-column paper width, 7 in) or ``"column"`` (3.5 in); ``height`` is
    per row, in inches. With ``quick`` the figure carries :data:`QUICK_MARK` across it (and in the
    PDF's keywords), so that a smoke-test figure is never mistaken for the result.

    Parameters
    ----------
    ncols, nrows : int, default 1
        The grid of axes.
    width : {"full", "column"}, default "full"
        The figure's width.
    height : float, default 2.4
        Inches per row.
    quick : bool, default False
        Mark it as a quick (smoke-test) figure.
    **kwargs
        Passed to :func:`matplotlib.pyplot.subplots`.

    Returns
    -------
    fig : matplotlib.figure.Figure
        The figure.
    axes : matplotlib.axes.Axes or numpy.ndarray
        Its axes.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import figure
    >>> fig, axes = figure(2, width="column")
    >>> axes.shape, [float(v) for v in fig.get_size_inches()]
    ((2,), [3.5, 2.4])
    >>> plt.close(fig)
    """
    widths = {"full": FULL_WIDTH, "column": COLUMN_WIDTH}
    if width not in widths:
        raise ValueError(f"figure width {width!r}: expected 'full' or 'column'")
    apply_style()
    fig, axes = plt.subplots(nrows, ncols, figsize=(widths[width], height * nrows), **kwargs)
    fig.linattn_quick = bool(quick)
    if quick:
        fig.text(0.5, 0.5, QUICK_MARK, transform=fig.transFigure, ha="center", va="center",
                 rotation=20, fontsize=16, color="tab:red", alpha=0.35, zorder=100)
    return fig, (np.ravel(axes) if nrows * ncols > 1 else axes)


def legend_below(fig, handles=None, labels=None, ncols: int | None = None, **kwargs):
    """One legend for the whole figure, under the axes (never on the data).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    handles, labels : list, optional
        The entries; default those of the first axes.
    ncols : int, optional
        Columns; default as many as fit.
    **kwargs
        Passed to :meth:`matplotlib.figure.Figure.legend`.

    Returns
    -------
    matplotlib.legend.Legend
        The legend.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import figure, legend_below
    >>> fig, axes = figure(2)
    >>> _ = axes[0].plot([0, 1], label="a")
    >>> _ = axes[1].plot([0, 1], label="a"), axes[1].plot([1, 0], label="b")
    >>> [text.get_text() for text in legend_below(fig).get_texts()]   # "a" once
    ['a', 'b']
    >>> plt.close(fig)
    """
    if handles is None:
        handles, labels = [], []
        for ax in fig.axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels and not lab.startswith("_"):
                    handles.append(h)
                    labels.append(lab)
    elif labels is None:
        labels = [h.get_label() for h in handles]
    ncols = ncols or min(len(handles), 4)
    return fig.legend(handles, labels, loc="outside lower center", ncols=ncols, **kwargs)


def check_print_ready(fig, name: str = "figure") -> None:
    """Raise unless ``fig`` is 3.5 in or 7 in wide and every visible text is at least 7 pt.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    name : str, default "figure"
        Its name in the error.

    Raises
    ------
    ValueError
        Naming the width or the text that is too small.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import check_print_ready, figure
    >>> fig, ax = figure(width="column")
    >>> check_print_ready(fig)                    # 3.5 in wide, no text under 7 pt: no error
    >>> fig.set_size_inches(5, 2)
    >>> check_print_ready(fig, "demo")
    Traceback (most recent call last):
        ...
    ValueError: figure 'demo': 5.0 in wide; expected 3.5 in (one column) or 7.0 in (two columns)
    >>> plt.close(fig)
    """
    width = round(float(fig.get_size_inches()[0]), 3)
    if width not in (COLUMN_WIDTH, FULL_WIDTH):
        raise ValueError(f"figure {name!r}: {width} in wide; expected {COLUMN_WIDTH} in (one column) "
                         f"or {FULL_WIDTH} in (two columns)")
    fig.draw_without_rendering()    # lays out the tick labels (no rasterisation: saving draws once per format)
    small = sorted({(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
                    if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_FONT_SIZE - 1e-9})
    if small:
        raise ValueError(f"figure {name!r}: text below {MIN_FONT_SIZE:g} pt: {small[:3]}")


def _check_data(name: str, data: pd.DataFrame) -> None:
    numeric = data.select_dtypes(include=[np.number, bool])
    if data.empty or numeric.empty:
        raise ValueError(f"figure {name!r}: the plotted data is empty")
    if not np.all(np.isfinite(numeric.to_numpy(dtype=float))):
        bad = [c for c in numeric if not np.all(np.isfinite(numeric[c].to_numpy(dtype=float)))]
        raise ValueError(f"figure {name!r}: non-finite plotted values in columns {bad}; "
                         "drop diverged runs (plotting.drop_diverged) instead of plotting NaN")


def _metadata(fmt: str, name: str, quick: bool) -> dict:
    """Fixed file metadata: no creation date, so that a rerun writes the same bytes."""
    info = {"Title": name, "Creator": "linattn-theory"}
    if quick:
        info["Keywords" if fmt == "pdf" else "Description"] = QUICK_MARK
    if fmt == "pdf":
        info["CreationDate"] = None
    return info


def save_figure(fig, name: str, out_dir, data: pd.DataFrame | None = None,
                formats=("png", "pdf")) -> list[Path]:
    """Write ``out_dir/name.png`` and ``.pdf`` atomically, plus ``name.csv`` of the plotted ``data``.

    ``data`` must be non-empty and finite (a figure is drawn from data, never a placeholder); the
    figure must be print-ready (:func:`check_print_ready`). The files carry fixed metadata (no
    date), so the same figure gives the same bytes. Closes ``fig``; returns the written paths.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    name : str
        The files' stem.
    out_dir : str or path-like
        Their folder.
    data : pandas.DataFrame, optional
        The plotted numbers (``name.csv``).
    formats : tuple of str, default ("png", "pdf")
        The image formats.

    Returns
    -------
    list of pathlib.Path
        The files written.

    Examples
    --------
    >>> import tempfile
    >>> import pandas as pd
    >>> from linattn_theory.report.plotting import figure, save_figure
    >>> fig, ax = figure(width="column")
    >>> _ = ax.plot([0, 1], [1, 2])
    >>> data = pd.DataFrame({"x": [0, 1], "y": [1, 2]})
    >>> [path.name for path in save_figure(fig, "demo", tempfile.mkdtemp(), data, formats=("png",))]
    ['demo.csv', 'demo.png']
    """
    out = Path(out_dir)
    paths = []
    if data is not None:
        _check_data(name, data)
        paths.append(atomic_write_text(out / f"{name}.csv",
                                       data.to_csv(index=False, float_format="%.10g")))
    if formats:
        check_print_ready(fig, name)
    quick = getattr(fig, "linattn_quick", False)
    for fmt in formats:
        buf = _io.BytesIO()
        fig.savefig(buf, format=fmt, metadata=_metadata(fmt, name, quick))
        paths.append(atomic_write_bytes(out / f"{name}.{fmt}", buf.getvalue()))
    if formats:
        plt.close(fig)
    return paths


def drop_diverged(results: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``(results without diverged runs, how many were dropped)``.

    Parameters
    ----------
    results : pandas.DataFrame
        Runs with a ``diverged`` column.

    Returns
    -------
    kept : pandas.DataFrame
        The runs that did not diverge.
    dropped : int
        How many did.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.plotting import drop_diverged
    >>> runs = pd.DataFrame({"loss": [0.1, 9.0, 0.2], "diverged": [False, True, False]})
    >>> kept, dropped = drop_diverged(runs)
    >>> kept["loss"].tolist(), dropped
    ([0.1, 0.2], 1)
    """
    if "diverged" not in results:
        return results, 0
    keep = ~results["diverged"].astype(bool)
    return results[keep], int((~keep).sum())


def dropped_text(dropped: int, what: str = "diverged run") -> str:
    """``"N diverged runs not shown"`` (``""`` when 0).

    Parameters
    ----------
    dropped : int
        How many.
    what : str, default "diverged run"
        What was dropped (singular).

    Returns
    -------
    str
        The note.

    Examples
    --------
    >>> from linattn_theory.report.plotting import dropped_text
    >>> dropped_text(2), dropped_text(1), dropped_text(0)
    ('2 diverged runs not shown', '1 diverged run not shown', '')
    """
    if not dropped:
        return ""
    return f"{dropped} {what if dropped == 1 else what + 's'} not shown"


def note_dropped(ax, dropped: int, what: str = "diverged run") -> None:
    """Say on the axes that ``dropped`` runs are not shown (nothing when 0).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    dropped : int
        How many.
    what : str, default "diverged run"
        What was dropped (singular).

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import note_dropped
    >>> fig, ax = plt.subplots()
    >>> note_dropped(ax, 2)
    >>> note_dropped(ax, 0)                       # says nothing
    >>> [text.get_text() for text in ax.texts]
    ['2 diverged runs not shown']
    >>> plt.close(fig)
    """
    if dropped:
        ax.text(0.99, 0.01, dropped_text(dropped, what), transform=ax.transAxes,
                ha="right", va="bottom", color="0.35")


def mark_x(ax, x: float, text: str, color, linestyle: str = "--") -> None:
    """A vertical marker at ``x`` with its legend entry ``text``.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    x : float
        Where.
    text : str
        Its legend entry.
    color : color
        Its colour.
    linestyle : str, default "--"
        Its line style.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import mark_x
    >>> fig, ax = plt.subplots()
    >>> mark_x(ax, 3.0, "chosen $T_0$", "black")
    >>> line, = ax.lines
    >>> [float(x) for x in line.get_xdata()], line.get_label(), line.get_linestyle()
    ([3.0, 3.0], 'chosen $T_0$', '--')
    >>> plt.close(fig)
    """
    ax.axvline(x, color=color, linestyle=linestyle, linewidth=1.2, label=text)


def _plain(value: float, _=None) -> str:
    return f"{value:g}"


def log_scale(ax, axis: str = "y") -> None:
    """A log axis labelled in plain numbers (``0.3``, ``2``, ``1e-05``).

    Minor ticks are labelled where few decades are shown: those at 2, 3 and 5 within about one
    decade, at 2 and 5 within two, none beyond (labels must not collide at print size).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    axis : {"x", "y"}, default "y"
        The axis.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import log_scale
    >>> fig, ax = plt.subplots()
    >>> log_scale(ax)
    >>> ax.get_yscale(), ax.yaxis.get_major_formatter()(1e-05), ax.yaxis.get_major_formatter()(0.3)
    ('log', '1e-05', '0.3')
    >>> plt.close(fig)
    """
    from matplotlib.ticker import FuncFormatter
    getattr(ax, f"set_{axis}scale")("log")
    target = ax.xaxis if axis == "x" else ax.yaxis

    def minor(value, _=None):
        low, high = sorted(target.get_view_interval())
        decades = np.log10(high / low) if low > 0 else np.inf
        mantissa = round(value / 10 ** np.floor(np.log10(value) + 1e-12), 6)
        if (decades <= 1.2 and mantissa in (2, 3, 5)) or (decades <= 2.2 and mantissa in (2, 5)):
            return _plain(float(f"{value:.6g}"))
        return ""
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(FuncFormatter(minor))


def symlog_scale(ax, linthresh: float, axis: str = "y") -> None:
    """A symmetric log axis (linear within ``±linthresh``) labelled in plain numbers (``-0.1``, ``0``, ``10``).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    linthresh : float
        The linear range's half-width.
    axis : {"x", "y"}, default "y"
        The axis.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import symlog_scale
    >>> fig, ax = plt.subplots()
    >>> symlog_scale(ax, 0.1, axis="x")
    >>> ax.get_xscale(), ax.xaxis.get_major_formatter()(-0.1), ax.xaxis.get_major_formatter()(10.0)
    ('symlog', '-0.1', '10')
    >>> plt.close(fig)
    """
    getattr(ax, f"set_{axis}scale")("symlog", linthresh=linthresh)
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain))


def data_ticks(ax, values, axis: str = "x") -> None:
    """Ticks of a log axis at the data values, labelled as plain numbers (``0.005``, not ``5×10⁻³``).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    values : array_like
        The data values.
    axis : {"x", "y"}, default "x"
        The axis.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import data_ticks
    >>> fig, ax = plt.subplots()
    >>> ax.set_xscale("log")
    >>> data_ticks(ax, [0.05, 0.005, 0.05])
    >>> [float(v) for v in ax.xaxis.get_major_locator()()], ax.xaxis.get_major_formatter()(0.005)
    ([0.005, 0.05], '0.005')
    >>> plt.close(fig)
    """
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator
    values = sorted(set(float(v) for v in values))
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(values))
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())


def stacked_bars(ax, x, parts: dict, colors, width: float = 0.8) -> None:
    """Bars of ``parts`` (``{label: values}``) stacked at ``x``: positive values upwards from 0,
    negative ones downwards, so that a signed decomposition reads off exactly.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    x : array_like
        Bar positions.
    parts : dict of str to array_like
        The signed parts.
    colors : sequence
        One colour per part.
    width : float, default 0.8
        Bar width.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import stacked_bars
    >>> fig, ax = plt.subplots()
    >>> stacked_bars(ax, [0, 1], {"a": [1.0, -1.0], "b": [2.0, -0.5]}, ["C0", "C1"])
    >>> [float(bar.get_y() + bar.get_height()) for bar in ax.patches]   # each bar's far end
    [1.0, -1.0, 3.0, -1.5]
    >>> plt.close(fig)
    """
    x = np.asarray(x, dtype=float)
    up, down = np.zeros(len(x)), np.zeros(len(x))
    for (name, values), color in zip(parts.items(), colors):
        values = np.asarray(values, dtype=float)
        bottom = np.where(values >= 0, up, down)
        ax.bar(x, values, width=width, bottom=bottom, color=color, label=name, linewidth=0)
        up = up + np.clip(values, 0, None)
        down = down + np.clip(values, None, 0)


def curve_rows(x: str, series: pd.Series, count: int, **labels) -> pd.DataFrame:
    """A plotted line (``series`` indexed by ``x``) in :func:`instance_band`'s table format, for the CSV.

    Parameters
    ----------
    x : str
        The name of the index's column.
    series : pandas.Series
        The line, indexed by ``x``.
    count : int
        Instances behind it.
    **labels
        Constant columns (e.g. ``method="fedavg"``).

    Returns
    -------
    pandas.DataFrame
        The rows.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.plotting import curve_rows
    >>> rows = curve_rows("T0", pd.Series([0.3, 0.2], index=[0, 5]), 20, method="fedavg")
    >>> rows.columns.tolist()
    ['T0', 'median', 'q25', 'q75', 'count', 'method']
    >>> rows["T0"].tolist(), rows["q25"].tolist() == rows["median"].tolist()
    ([0, 5], True)
    """
    values = series.to_numpy(dtype=float)
    return pd.DataFrame({x: series.index, "median": values, "q25": values, "q75": values,
                         "count": count, **labels})


def heatmap(ax, data, **kwargs):
    """``seaborn.heatmap(data, ax=ax, **kwargs)``, its tick-label overlap test laid out without rendering.

    seaborn lays the whole figure out to see whether the new panel's tick labels overlap, by rendering
    it (``fig.canvas.draw()``: every panel drawn so far rasterised again, once per heatmap); here that
    pass is :meth:`~matplotlib.figure.Figure.draw_without_rendering`, which places the same labels at
    the same size (the same renderer class and dpi) and draws no pixel. seaborn is imported here, where
    a figure draws with it (its import costs about a second, and it imports pyplot after this module
    chose the off-screen backend).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The panel.
    data : pandas.DataFrame
        The grid.
    **kwargs
        Passed to :func:`seaborn.heatmap`.

    Returns
    -------
    matplotlib.axes.Axes
        ``ax``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import pandas as pd
    >>> from linattn_theory.report.plotting import figure, heatmap
    >>> fig, ax = figure(width="column")
    >>> heatmap(ax, pd.DataFrame([[0.0, 1.0], [2.0, 3.0]]), annot=True) is ax
    True
    >>> plt.close(fig)
    """
    import seaborn as sns
    from seaborn import matrix

    drawn = getattr(matrix, "_draw_figure", None)
    if drawn is not None:
        matrix._draw_figure = lambda fig: fig.draw_without_rendering()
    try:
        return sns.heatmap(data, ax=ax, **kwargs)
    finally:
        if drawn is not None:
            matrix._draw_figure = drawn


def instance_band(ax, data: pd.DataFrame, x: str, y: str, *, color, label: str | None = None,
                  marker: str = "o", linestyle: str = "-") -> pd.DataFrame:
    """Median of ``y`` over instances against ``x``, with a band over the interquartile range.

    Returns the plotted summary (``x``, median, q25, q75, count) for the figure's CSV.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    data : pandas.DataFrame
        One row per (instance, ``x``).
    x, y : str
        The columns.
    color : color
        The line's and band's colour.
    label : str, optional
        The legend entry.
    marker : str, default "o"
        The median's marker.
    linestyle : str, default "-"
        The median's line style.

    Returns
    -------
    pandas.DataFrame
        The plotted summary.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import pandas as pd
    >>> from linattn_theory.report.plotting import instance_band
    >>> data = pd.DataFrame({"T0": [0, 0, 0, 5, 5, 5], "loss": [1.0, 2.0, 3.0, 0.5, 1.5, 2.5]})
    >>> fig, ax = plt.subplots()
    >>> stats = instance_band(ax, data, "T0", "loss", color="black")
    >>> stats["median"].tolist(), stats["q25"].tolist(), stats["count"].tolist(), len(ax.lines)
    ([2.0, 1.5], [1.5, 1.0], [3, 3], 1)
    >>> plt.close(fig)
    """
    grouped = data.groupby(x)[y]
    stats = pd.DataFrame({"median": grouped.median(), "q25": grouped.quantile(0.25),
                          "q75": grouped.quantile(0.75), "count": grouped.count()}).reset_index()
    ax.plot(stats[x], stats["median"], marker=marker, markersize=2.5, color=color, label=label,
            linestyle=linestyle)
    if (stats["count"] > 1).any():
        ax.fill_between(stats[x], stats["q25"], stats["q75"], color=color, alpha=0.2, linewidth=0)
    return stats


def strip_offsets(values, width: float = 0.5) -> np.ndarray:
    """Deterministic horizontal offsets in ``[−width/2, width/2]`` for ``len(values)`` dots, by rank
    (a strip plot of one dot per instance that hides none).

    Parameters
    ----------
    values : array_like
        The dots' values.
    width : float, default 0.5
        The strip's width.

    Returns
    -------
    numpy.ndarray
        One offset per value.

    Examples
    --------
    >>> from linattn_theory.report.plotting import strip_offsets
    >>> strip_offsets([3.0, 1.0, 2.0]).tolist()           # by rank: 2, 0, 1
    [0.25, -0.25, 0.0]
    """
    n = len(values)
    if n < 2:
        return np.zeros(n)
    ranks = np.argsort(np.argsort(np.asarray(values), kind="stable"), kind="stable")
    return (ranks / (n - 1) - 0.5) * width


#: the legend name of :func:`mark_best_T0`, the same in every figure
BEST_T0_LABEL = r"best $T_0$ per instance: median, IQR"


def mark_best_T0(ax, quartiles: dict, *, color, row: int = 0, marker: str = "D") -> None:
    """The per-instance best warm-up over instances, at the top of ``ax``: a diamond at the median and a
    bar over the interquartile range (``quartiles``: ``median``, ``q25``, ``q75``, as
    :func:`~linattn_theory.report.sweep_analysis.quartiles` gives them); ``row`` stacks several levels.
    Another ``marker`` marks another per-instance warm-up the same way (e.g. the online rule's).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    quartiles : dict
        ``median``, ``q25``, ``q75`` of the best warm-up over instances.
    color : color
        The level's colour.
    row : int, default 0
        The row (0 at the top).
    marker : str, default "D"
        The median's marker.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import mark_best_T0
    >>> fig, ax = plt.subplots()
    >>> mark_best_T0(ax, {"median": 10, "q25": 5, "q75": 20}, color="black")
    >>> [[float(x) for x in line.get_xdata()] for line in ax.lines]   # the IQR bar, the median
    [[5.0, 20.0], [10.0]]
    >>> plt.close(fig)
    """
    from matplotlib.transforms import blended_transform_factory

    top = blended_transform_factory(ax.transData, ax.transAxes)
    y = 0.96 - 0.065 * row
    ax.plot([quartiles["q25"], quartiles["q75"]], [y, y], color=color, linewidth=2.5, transform=top,
            solid_capstyle="butt")
    ax.plot([quartiles["median"]], [y], marker=marker, color=color, markeredgecolor="black",
            markersize=6 if marker == "*" else 4, transform=top)


def best_T0_handle(color=REFERENCE_COLOR):
    """The legend entry of :func:`mark_best_T0`.

    Parameters
    ----------
    color : color, default "0.35"
        The entry's colour.

    Returns
    -------
    matplotlib.lines.Line2D
        The handle.

    Examples
    --------
    >>> from linattn_theory.report.plotting import BEST_T0_LABEL, best_T0_handle
    >>> handle = best_T0_handle()
    >>> handle.get_label() == BEST_T0_LABEL, handle.get_marker()
    (True, 'D')
    """
    from matplotlib.lines import Line2D

    return Line2D([], [], marker="D", color=color, markeredgecolor="black", markersize=4, linewidth=2.5,
                  label=BEST_T0_LABEL)


def room_on_top(ax, rows: int) -> None:
    """Raise the top of ``ax``'s y range so that ``rows`` rows of :func:`mark_best_T0` sit above the data
    (on a linear, log or symmetric-log axis alike: the room is made in the axis's own scale).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes.
    rows : int
        Rows of markers.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.plotting import room_on_top
    >>> fig, ax = plt.subplots()
    >>> _ = ax.set_ylim(0, 1)
    >>> room_on_top(ax, 1)
    >>> round(float(ax.get_ylim()[1]), 4)                # 1 / (0.92 - 0.065)
    1.1696
    >>> plt.close(fig)
    """
    fraction = 0.92 - 0.065 * rows
    scale = ax.yaxis.get_transform()
    low, high = scale.transform(np.array([ax.get_ylim()]).T)[:, 0]
    top = scale.inverted().transform(np.array([[low + (high - low) / fraction]]))[0, 0]
    ax.set_ylim(ax.get_ylim()[0], top)


def band_text(count, what: str = "instances") -> str:
    """How every band of the figures reads: ``"median and interquartile range over 20 instances"``
    (``count`` a number, or one per level: ``"over 19, 18, 18 instances"``).

    Parameters
    ----------
    count : int or sequence of int
        Instances (per level).
    what : str, default "instances"
        What the band is over.

    Returns
    -------
    str
        The phrase.

    Examples
    --------
    >>> from linattn_theory.report.plotting import band_text
    >>> band_text(20), band_text([19, 18])
    ('median and interquartile range over 20 instances', 'median and interquartile range over 19, 18 instances')
    """
    counts = [int(c) for c in np.atleast_1d(count)]
    said = str(counts[0]) if len(set(counts)) == 1 else ", ".join(map(str, counts))
    return f"median and interquartile range over {said} {what}"


def left_out_text(left_out: int) -> str:
    """``"N instances left out (their FedAvg run diverged)"`` (``""`` when 0): the rule of
    :func:`~linattn_theory.report.sweep_analysis.select_instances`, said on the figure.

    Parameters
    ----------
    left_out : int
        Instances left out.

    Returns
    -------
    str
        The note.

    Examples
    --------
    >>> from linattn_theory.report.plotting import left_out_text
    >>> left_out_text(2), left_out_text(1), left_out_text(0)
    ('2 instances left out (FedAvg diverged)', '1 instance left out (FedAvg diverged)', '')
    """
    if not left_out:
        return ""
    return f"{left_out} instance{'s' if left_out != 1 else ''} left out (FedAvg diverged)"
