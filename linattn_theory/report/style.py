"""The figures' matplotlib style without importing seaborn (1–3 s of SciPy imports a figure never uses).

:data:`PAPER_TICKS` is what ``seaborn.set_theme(context="paper", style="ticks",
palette="colorblind")`` (seaborn 0.13) sets, written out (``tests/test_figures.py`` checks it against
seaborn), except the default colour map: seaborn's ``"rocket"`` exists only once seaborn is imported,
and every figure that draws a colour map names its own. :data:`COLORBLIND` is seaborn's
``"colorblind"`` palette (Okabe–Ito).
"""

from __future__ import annotations

from cycler import cycler
from matplotlib.colors import to_rgb

__all__ = ["COLORBLIND", "PAPER_TICKS"]

#: seaborn's "colorblind" palette, in its order
COLORBLIND = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133",
              "#56b4e9")

#: the rcParams of seaborn's "paper" context, "ticks" style and "colorblind" palette (font scale 1)
PAPER_TICKS = {
    "axes.axisbelow": True, "axes.edgecolor": ".15", "axes.facecolor": "white", "axes.grid": False,
    "axes.labelcolor": ".15", "axes.labelsize": 9.600000000000001, "axes.linewidth": 1.0,
    "axes.spines.bottom": True, "axes.spines.left": True, "axes.spines.right": True, "axes.spines.top": True,
    "axes.titlesize": 9.600000000000001, "figure.facecolor": "white", "font.family": ["sans-serif"],
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans", "sans-serif"],
    "font.size": 9.600000000000001, "grid.color": ".8", "grid.linestyle": "-", "grid.linewidth": 0.8,
    "legend.fontsize": 8.8, "legend.title_fontsize": 9.600000000000001, "lines.linewidth": 1.2000000000000002,
    "lines.markersize": 4.800000000000001, "lines.solid_capstyle": "round", "patch.edgecolor": "w",
    "patch.force_edgecolor": True, "patch.linewidth": 0.8, "text.color": ".15", "xtick.bottom": True,
    "xtick.color": ".15", "xtick.direction": "out", "xtick.labelsize": 8.8, "xtick.major.size": 4.800000000000001,
    "xtick.major.width": 1.0, "xtick.minor.size": 3.2, "xtick.minor.width": 0.8, "xtick.top": False,
    "ytick.color": ".15", "ytick.direction": "out", "ytick.labelsize": 8.8, "ytick.left": True,
    "ytick.major.size": 4.800000000000001, "ytick.major.width": 1.0, "ytick.minor.size": 3.2,
    "ytick.minor.width": 0.8, "ytick.right": False,
    "axes.prop_cycle": cycler("color", [to_rgb(c) for c in COLORBLIND]),
}
