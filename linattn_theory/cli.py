"""The ``linattn`` command line: thin wrappers over the package's functions.

Exit status: 0 success, 2 invalid input (nothing is written), 3 a run diverged (its table
is written and the message suggests a stable step size).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ConfigError, load_config

EXIT_OK, EXIT_INVALID, EXIT_DIVERGED = 0, 2, 3


def _simulate(args) -> int:
    from .federated import simulate
    from .io import write_run

    config = load_config(args.config)
    if args.backend is not None:
        config = config.with_updates({"model.backend": args.backend})
    if args.engine is not None:
        config = config.with_updates({"model.engine": args.engine})
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} exists and is not a folder")
    result = simulate(config, progress=not args.quiet)
    paths = write_run(result, out)
    last = result.table.iloc[-1]
    print(f"wrote {paths['table']} ({len(result.table) - 1} rounds, final loss F = {last['loss']:.6g})")
    if result.diverged:
        print(result.divergence.message, file=sys.stderr)
        return EXIT_DIVERGED
    return EXIT_OK


def _sweep(args) -> int:
    from .sweep import load_sweep, run_sweep

    sweep = load_sweep(args.config, quick=args.quick)
    if args.dry_run:
        for run_id, point in zip(sweep.run_ids, sweep.points):
            print(run_id, " ".join(f"{k}={v}" for k, v in point.items()))
        print(f"{len(sweep)} runs (nothing written)")
        return EXIT_OK
    summary = run_sweep(sweep, args.out, executor=args.executor, workers=args.workers,
                        scheduler=args.scheduler, progress=not args.quiet)
    print(f"{summary.total} runs in {summary.out}: {summary.computed} computed, {summary.skipped} "
          f"already finished, {summary.diverged} diverged ({summary.seconds:.1f} s)")
    return EXIT_OK


def _figures(args) -> int:
    from .figures import discover, make_figures

    scripts = discover(args.root, only=args.only)
    if args.list:
        for name, path in scripts.items():
            print(f"{name}\t{path}")
        return EXIT_OK
    made = make_figures(scripts, args.out, quick=args.quick, executor=args.executor,
                        workers=args.workers, progress=not args.quiet)
    for name, (paths, seconds) in made.items():
        print(f"{name}: {len(paths)} files in {seconds:.1f} s")
    total = sum(seconds for _, seconds in made.values())
    print(f"{len(made)} figure scripts, {total:.1f} s in all, written to {args.out}")
    return EXIT_OK

def _recommend(args) -> int:
    from .bound import recommend_main

    return recommend_main(args.config, measure=not args.no_measure)


def _derive(args) -> int:
    import subprocess

    folder = Path(args.root) / "derivations"
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not scripts:
        raise ConfigError(f"--root {args.root!r}: no derivation scripts in {folder}")
    if args.only:
        scripts = [p for p in scripts if p.stem in args.only]
        missing = set(args.only) - {p.stem for p in scripts}
        if missing:
            raise ConfigError(f"--only {sorted(missing)[0]!r}: no such derivation in {folder}")
    failed = []
    for script in scripts:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        if not args.quiet:
            print(proc.stdout, end="")
        status = "PASS" if proc.returncode == 0 else "FAIL"
        print(f"{status}: derivations/{script.name}")
        if proc.returncode != 0:
            failed.append(script.name)
            print(proc.stderr, end="", file=sys.stderr)
    print(f"{len(scripts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the source of docs/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="linattn",
        description="Federated training of linear attention: simulations, theory checks and figures.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("simulate", help="run one federated simulation from a TOML config",
                       description="Run one federated simulation (the strategy of federated.strategy: FedAvg, "
                                   "FedFrozen or a baseline) and write "
                                   "rounds.csv, params.npz and metadata.json to --out.")
    p.add_argument("config", help="TOML configuration file (see simulations/configs/)")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--backend", choices=("numpy", "cupy"), default=None,
                   help="array library, overriding model.backend of the config "
                        "(cupy needs a GPU and pip install 'linattn-theory[gpu]')")
    p.add_argument("--engine", choices=("auto", "fused", "array_api"), default=None,
                   help="local-step engine, overriding model.engine of the config: fused CPU "
                        "kernels (numba), the Array-API path, or auto (fused where it applies)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_simulate)

    p = sub.add_parser("sweep", help="run a grid of simulations in parallel (resumable)",
                       description="Run every configuration of a sweep file's [grid] (dotted keys -> "
                                   "lists) and store each run under DIR/runs/<config hash>/; "
                                   "finished runs are skipped, so an interrupted sweep resumes. "
                                   "Load the results with linattn_theory.load_results(DIR).")
    p.add_argument("config", help="sweep TOML: a run config plus a [grid] table")
    p.add_argument("--out", required=True, help="sweep folder (created if missing)")
    p.add_argument("--quick", action="store_true", help="apply the file's [quick] overrides")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs; write nothing")
    _executor_arguments(p)
    p.add_argument("--scheduler", default=None,
                   help="Dask scheduler address (executor dask; default: a local cluster on 127.0.0.1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_sweep)

    p = sub.add_parser("figures", help="regenerate the figures (simulations/*.py)",
                       description="Run every figure script of ROOT/simulations (or those named by "
                                   "--only) and write PNG, PDF and a CSV of the plotted data per figure.")
    p.add_argument("--out", default="figures", help="output folder (default: figures)")
    p.add_argument("--root", default=".", help="repository root holding simulations/ (default: .)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="only this figure script (repeatable)")
    p.add_argument("--quick", action="store_true", help="small grids: the whole set in under two minutes")
    p.add_argument("--list", action="store_true", help="list the figure scripts and exit")
    _executor_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_figures)

    p = sub.add_parser("recommend", help="recommend the warm-up length T0 from the trade-off bound",
                       description="Estimate the constants of the bound U(T0) on the excess risk "
                                   "(docs/theory.md §6) from the instance, print T0_theory, the curve "
                                   "U(T0) for T0 = 0..T, the constants, each assumption's check and "
                                   "the predicted (and measured) gain over plain FedAvg.")
    p.add_argument("config", help="TOML configuration file")
    p.add_argument("--no-measure", action="store_true",
                   help="skip the explicit FedFrozen runs that measure R(T0_theory) and R(T)")
    p.set_defaults(func=_recommend)

    p = sub.add_parser("derive", help="run the sympy derivations and report PASS/FAIL",
                       description="Run every script in derivations/ (each states a claim, derives it "
                                   "with sympy and checks it); exit 1 if any fails.")
    p.add_argument("--root", default=".", help="repository root holding derivations/ (default: .)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these derivations (file stems)")
    p.add_argument("--quiet", action="store_true", help="print only one line per derivation")
    p.set_defaults(func=_derive)
    return parser


def _executor_arguments(p) -> None:
    from .sweep import EXECUTORS
    p.add_argument("--executor", choices=EXECUTORS, default="processes",
                   help="serial (in-process), processes (joblib, default) or dask")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per core)")


def _version() -> str:
    from . import __version__
    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"linattn {args.command}: invalid configuration: {err}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
