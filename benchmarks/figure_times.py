"""Time every figure script from an empty sweep cache and record it in ``figures/timings.csv``.

    python benchmarks/figure_times.py            # the full set, as `linattn figures` makes it
    python benchmarks/figure_times.py --quick    # the quick set, as `linattn figures --quick`
    python benchmarks/figure_times.py --out figures   # time the full set while regenerating it


Runs the scripts that ``linattn figures`` finds, one after the other in its order (``--jobs 1``:
each script's seconds are its own; ``linattn figures`` runs two at a time by default), into a
temporary folder (so the sweep cache starts empty and the committed figures are not touched),
or into ``--out`` (whose sweep cache ``_sweeps/`` is removed first, so that the timing still
starts from an empty cache: one run then both regenerates the committed figures and times them),
with the executor and workers given (default: ``linattn figures``'s). Writes one row per script
to ``figures/timings.csv`` (replacing the rows of the same mode): seconds, runs stored in sweeps, and
the conditions (cores, workers, load average before and after, date, revision). The README and
``figures/README.md`` quote these rows through generated blocks: run
``python -m linattn_theory.report.figure_numbers`` afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import shutil
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linattn_theory.core.io import atomic_write_text  # noqa: E402
from linattn_theory.report.figures import discover, make_figures  # noqa: E402

COLUMNS = ["mode", "figure", "seconds", "sweep_runs", "executor", "workers", "cores", "nice",
           "load_before", "load_after", "date", "revision"]


def finished_runs(out: Path) -> int:
    """Runs stored in the sweep cache under ``out`` (each writes its ``metadata.json`` last)."""
    return sum(1 for _ in (out / "_sweeps").glob("*/runs/*/metadata.json"))


def git_revision(root: Path) -> str:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def time_figures(root: Path, quick: bool, executor: str, workers: int | None, out: Path | None = None
                 ) -> pd.DataFrame:
    revision = git_revision(root)
    rows = []
    with tempfile.TemporaryDirectory(prefix="linattn-figure-times-") as tmp:
        out = Path(tmp) if out is None else out
        shutil.rmtree(out / "_sweeps", ignore_errors=True)
        for name, path in discover(root).items():
            before, load_before = finished_runs(out), os.getloadavg()[0]
            (_, seconds), = make_figures({name: path}, out, quick=quick, executor=executor,
                                         workers=workers).values()
            rows.append({"mode": "quick" if quick else "full", "figure": name, "seconds": round(seconds, 1),
                         "sweep_runs": finished_runs(out) - before, "executor": executor,
                         "workers": workers or os.cpu_count(), "cores": os.cpu_count(), "nice": os.nice(0),
                         "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                         "date": datetime.date.today().isoformat(), "revision": revision})
            print(f"{name:28s} {seconds:8.1f} s  {rows[-1]['sweep_runs']:6d} runs in sweeps", flush=True)
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="time the quick set")
    parser.add_argument("--executor", default="processes", choices=("serial", "processes", "dask"))
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the figures here (default: a temporary folder); its _sweeps/ cache is "
                             "removed first")
    args = parser.parse_args(argv)
    table = time_figures(args.root, args.quick, args.executor, args.workers, args.out)
    target = args.root / "figures" / "timings.csv"
    if target.exists():
        kept = pd.read_csv(target)
        table = pd.concat([kept[kept["mode"] != table["mode"].iloc[0]], table], ignore_index=True)[COLUMNS]
        table["nice"] = table["nice"].astype(int)
    atomic_write_text(target, table.sort_values("mode", kind="stable").to_csv(index=False))
    print(f"{len(table)} rows in {target}; total {table.groupby('mode')['seconds'].sum().to_dict()} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
