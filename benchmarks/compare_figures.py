"""Compare a regenerated figure folder with the committed one, table by table: how far the numbers
moved, which runs changed their divergence or chaos flag, which cell verdicts flipped.

    linattn figures --out /tmp/regenerated            # the full set (or --quick into another folder)
    python benchmarks/compare_figures.py /tmp/regenerated [--against figures]

Prints, for every CSV in both folders: rows, the largest relative difference |a − b| / max(|a|, |b|)
of its numeric columns (at most 2; and the column), the share of entries that moved by more than 1e-9 relative, and the count of
differing entries in its other columns (flags, settings, verdicts); for a per-run table with
``diverged`` and ``chaotic`` columns, the runs whose divergence flips and how many of them the
committed table flagged chaotic. A figure reproduces on another CPU where every difference sits in
the runs it flags chaotic (docs/theory.md §6, "Chaotic instances"); the rest is what to look at.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

#: relative differences below this are rounding (the committed figures' spot checks use it)
ROUNDING = 1e-9


def compare_tables(committed: pd.DataFrame, regenerated: pd.DataFrame) -> dict:
    """Differences of two tables of one shape and columns: ``max_relative``, its ``column``, the share
    of numeric entries ``moved`` beyond :data:`ROUNDING`, ``other`` (differing non-numeric entries) and,
    with ``diverged``/``chaotic`` columns, ``flips`` and ``flips_flagged`` (of them, flagged chaotic)."""
    numeric = [c for c in committed.columns if pd.api.types.is_float_dtype(committed[c])
               or pd.api.types.is_integer_dtype(committed[c]) and not pd.api.types.is_bool_dtype(committed[c])]
    worst, column, moved, entries = 0.0, None, 0, 0
    for name in numeric:
        a, b = committed[name].to_numpy(float), regenerated[name].to_numpy(float)
        both = np.isfinite(a) & np.isfinite(b)
        scale = np.maximum(np.abs(a[both]), np.abs(b[both]))     # symmetric: at most 2, 0 where both are 0
        relative = np.divide(np.abs(a[both] - b[both]), scale, out=np.zeros(scale.shape), where=scale > 0)
        unmatched = np.isfinite(a) != np.isfinite(b)
        moved += int(np.sum(relative > ROUNDING) + np.sum(unmatched))
        entries += a.size
        if relative.size and relative.max() > worst:
            worst, column = float(relative.max()), name
    other = sum(int((committed[c].astype(str) != regenerated[c].astype(str)).sum())
                for c in committed.columns if c not in numeric)
    result = {"max_relative": worst, "column": column, "moved": moved / max(entries, 1), "other": other}
    if {"diverged", "chaotic"} <= set(committed.columns) and pd.api.types.is_bool_dtype(committed["diverged"]):
        flips = committed["diverged"].astype(str) != regenerated["diverged"].astype(str)
        result["flips"] = int(flips.sum())
        result["flips_flagged"] = int((flips & committed["chaotic"].astype(str).eq("True")).sum())
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("regenerated", type=Path, help="a folder written by `linattn figures --out`")
    parser.add_argument("--against", type=Path, default=Path(__file__).resolve().parent.parent / "figures",
                        help="the committed figures (default: figures/)")
    args = parser.parse_args(argv)
    names = sorted(p.name for p in args.regenerated.glob("*.csv") if (args.against / p.name).is_file())
    if not names:
        parser.error(f"no CSV of {args.regenerated} is in {args.against}")
    print(f"{'table':38s} {'rows':>6s} {'max rel':>9s} {'(column)':24s} {'moved':>7s} {'other':>6s}  flips")
    for name in names:
        committed, regenerated = pd.read_csv(args.against / name), pd.read_csv(args.regenerated / name)
        if committed.shape != regenerated.shape or list(committed.columns) != list(regenerated.columns):
            print(f"{name:38s} shape {committed.shape} -> {regenerated.shape}: not compared row by row")
            continue
        d = compare_tables(committed, regenerated)
        flips = (f"{d['flips']} ({d['flips_flagged']} flagged chaotic)" if "flips" in d else "")
        print(f"{name:38s} {len(committed):6d} {d['max_relative']:9.2e} {str(d['column'] or ''):24.24s} "
              f"{d['moved']:7.1%} {d['other']:6d}  {flips}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
