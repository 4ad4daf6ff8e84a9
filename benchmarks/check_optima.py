"""The centralised optima of the figures' and the regret benchmark's instances, solved twice: by the
reference path (each start one ``scipy.optimize.minimize(method="L-BFGS-B")`` call after another, the
path the thread-per-start solver before issue 34 reproduced bit for bit) and by today's
:func:`~linattn_theory.theory.profile.centralized_optima` (every start advanced in lock-step through
SciPy's own L-BFGS-B routine, one batch of evaluations per data set). Issue 34, item 1's acceptance:
the same optimum to 1e-10 relative or lower on every instance.

The instances are those the callers build: the script runs a caller with ``centralized_optima``
wrapped, so that every call it makes is solved both ways (the caller goes on with today's result).
Per call it prints the problems, the largest relative difference of the optima
``|Φ*_new − Φ*_ref| / |Φ*_ref|``, how many optima are lower / higher / equal bit for bit, whether every
kernel and every start's row are equal bit for bit, and the times side by side (same process, same
load; report ``uptime`` with them): the reference, today's solver and the thread-per-start solver of
commit ``--old`` (default 2b476d2, the last before issue 34; its ``theory/profile.py`` loaded from git,
``--old none`` skips it), whose optima are compared too. Exit status 1 when an optimum is higher than the
reference's by more than 1e-10 relative.

With ``--polish`` every reference optimum is also restarted from its own kernel, refactorised
(``K* = W_Q W_Kᵀ`` split afresh by its SVD, so ``W_Q`` and ``W_K`` are balanced), until the objective
stops falling (``centralized_optima``'s ``refine``): how much lower it gets says how far the committed
optimum is from the minimum it reached for (the reference's L-BFGS can stop on a line-search failure, or on a small factor gradient
at unbalanced factors). Nothing is written; the caller's tables are today's.

Callers:

* ``regret [--chunks 0,100,200]``: worker tasks of ``benchmarks/predictive_regret.py`` (8 instances
  each, their records written to a temporary folder, not to the cache);
* ``script PATH [ARGS...]``: a figure script, e.g. ``script simulations/digits_phase.py --quick --out /tmp/d``
  (then compare its ``*_optimum.csv`` with the committed one).

Usage (from the repository root)::

    python benchmarks/check_optima.py regret --chunks 0,100,200
    python benchmarks/check_optima.py script simulations/digits_phase.py --quick --out /tmp/digits
"""

from __future__ import annotations

import argparse
import importlib.util
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import linattn_theory.theory.profile as profile  # noqa: E402

#: issue 34's acceptance: an optimum no higher than the reference's by more than this, relative
RTOL = 1e-10


def compare(reference: list, new: list) -> dict:
    """Largest relative difference of the optima, counts lower / higher / bit-equal, and whether every
    kernel and every start's row agrees bit for bit."""
    ref = np.array([o.objective for o in reference])
    got = np.array([o.objective for o in new])
    relative = np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(float).tiny)
    return {"max_relative": float(relative.max(initial=0.0)), "lower": int(np.sum(got < ref)),
            "higher": int(np.sum(got > ref)), "equal": int(np.sum(got == ref)),
            "worse_than_rtol": int(np.sum((got - ref) > RTOL * np.abs(ref))),
            "identical": all(np.array_equal(a.kernel, b.kernel) and a.starts.equals(b.starts)
                             for a, b in zip(reference, new))}


def old_solver(revision: str):
    """``centralized_optima`` of ``linattn_theory/theory/profile.py`` at git ``revision``, loaded as a
    module of the package (its relative imports resolve against today's package)."""
    source = subprocess.run(["git", "show", f"{revision}:linattn_theory/theory/profile.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("linattn_theory.theory._profile_" + revision, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "linattn_theory.theory"
    sys.modules[spec.name] = module                  # dataclasses look their module up
    exec(compile(source, f"{revision}:theory/profile.py", "exec"), module.__dict__)
    return module.centralized_optima


def timed(solve, problems, **options):
    """``(solve(problems, **options), seconds)``."""
    start = time.perf_counter()
    result = solve(problems, **options)
    return result, time.perf_counter() - start


def polished(solve, problem: dict, optimum, rounds: int = 5) -> float:
    """``Φ*`` of ``solve`` (``centralized_optima``) started from ``optimum``'s kernel alone (refactorised by
    its SVD, no random starts), with up to ``rounds`` more refinements while the objective falls."""
    return solve([dict(problem, initial_kernels=[optimum.kernel], restarts=0, refine=rounds)])[0].objective


class Checked:
    """``centralized_optima`` that solves each call by the reference, today's and the old solver and
    records the comparisons (the caller gets today's result)."""

    def __init__(self, solve, old=None, polish: bool = False):
        self.solve, self.old, self.polish, self.rows = solve, old, polish, []

    def __call__(self, problems, **options):
        problems = [dict(p) for p in problems]
        reference, t_ref = timed(self.solve, problems, lockstep=False)
        new, t_new = timed(self.solve, problems, **options)
        row = {"problems": len(problems), "reference_s": t_ref, "new_s": t_new, **compare(reference, new)}
        text = ""
        if self.old is not None:
            old, row["old_s"] = timed(self.old, problems)
            row["old_identical"] = compare(reference, old)["identical"] and row["identical"]
            text = f", old {row['old_s']:.2f} s ({row['old_s'] / max(t_new, 1e-12):.2f}x; identical: {row['old_identical']})"
        if self.polish:
            lower = np.array([(o.objective - polished(self.solve, p, o)) / abs(o.objective) for p, o in zip(problems, reference)])
            row["polish_max"], row["polish_lowered"] = float(lower.max(initial=0.0)), int(np.sum(lower > RTOL))
            text += (f"; polished: up to {row['polish_max']:.3g} relative lower, {row['polish_lowered']} of "
                     f"{len(problems)} lower by more than {RTOL:g}")
        self.rows.append(row)
        print(f"[check_optima] {row['problems']} problems: reference {t_ref:.2f} s, new {t_new:.2f} s{text}; "
              f"max relative difference {row['max_relative']:.3g}; "
              f"lower {row['lower']}, higher {row['higher']}, bit-equal {row['equal']}; "
              f"kernels and start tables identical: {row['identical']}", file=sys.stderr, flush=True)
        return new


def run_regret(chunks: list[int]) -> None:
    """The worker tasks ``chunks`` of the regret benchmark, records into a temporary folder."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import predictive_regret as pr
    table = pr.instances()
    with tempfile.TemporaryDirectory() as cache:
        todo = [(cfg, f"{cache}/{key}.json") for key, cfg in zip(table["key"], table["config"])]
        tasks = pr.task_chunks(todo)
        for i in chunks:
            pr._score([c for c, _ in tasks[i]], [p for _, p in tasks[i]])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="caller", required=True)
    regret = sub.add_parser("regret", help="worker tasks of benchmarks/predictive_regret.py")
    regret.add_argument("--chunks", default="0,100,200", help="task indices, comma-separated")
    script = sub.add_parser("script", help="a figure script and its arguments")
    script.add_argument("path")
    script.add_argument("args", nargs=argparse.REMAINDER)
    parser.add_argument("--old", default="2b476d2", help="git revision of the old solver ('none': skip it)")
    parser.add_argument("--polish", action="store_true", help="also restart each optimum from its own kernel")
    args = parser.parse_args(argv)
    checked = Checked(profile.centralized_optima, None if args.old == "none" else old_solver(args.old), args.polish)
    profile.centralized_optima = checked
    try:
        if args.caller == "regret":
            run_regret([int(c) for c in args.chunks.split(",")])
        else:
            sys.argv = [args.path, *args.args]
            try:
                runpy.run_path(args.path, run_name="__main__")
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    raise
    finally:
        profile.centralized_optima = checked.solve
    rows = checked.rows
    ref, new = sum(r["reference_s"] for r in rows), sum(r["new_s"] for r in rows)
    old = (f", old {sum(r['old_s'] for r in rows):.2f} s (identical: {all(r['old_identical'] for r in rows)})"
           if checked.old is not None else "")
    print(f"calls {len(rows)}, problems {sum(r['problems'] for r in rows)}: reference {ref:.2f} s, new {new:.2f} s"
          f"{old}; max relative difference {max((r['max_relative'] for r in rows), default=0):.3g}; "
          f"lower {sum(r['lower'] for r in rows)}, higher {sum(r['higher'] for r in rows)}, "
          f"bit-equal {sum(r['equal'] for r in rows)}; all kernels and start tables identical: "
          f"{all(r['identical'] for r in rows)}")
    if checked.polish:
        print(f"polished: up to {max((r['polish_max'] for r in rows), default=0):.3g} relative lower; "
              f"{sum(r['polish_lowered'] for r in rows)} optima lower by more than {RTOL:g}")
    return 1 if any(r["worse_than_rtol"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
