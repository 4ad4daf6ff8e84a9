"""The ``linattn`` command line: thin wrappers over the package's functions.

Every command checks all it can before any work (config, output folder, a memory and time
estimate, grid size) and has one error boundary: exit status 0 success, 2 invalid input
(nothing is written), a broken stored run (named) or a sweep folder another sweep is writing
to, 3 a run diverged (its table is written and the message suggests a stable step size; a
sweep only with ``--fail-on-divergence``), 1 any other failure (a one-line message; ``--debug``
shows the traceback), 130 interrupted by Ctrl-C and 143 stopped by SIGTERM (workers are stopped;
the message says what was kept). A flag's bad value is an "invalid argument", a bad setting an
"invalid configuration" (both exit 2).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import warnings
from pathlib import Path

from ..core.errors import ArgumentError, ConfigError, RunIntegrityError

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_DIVERGED = 0, 1, 2, 3


EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM (so cleanup code runs)."""


def _resource_limits(args, configs, workers: int = 1) -> None:
    from ..sim.limits import check_resources

    check_resources(configs, workers=workers, max_memory_gb=args.max_memory_gb,
                    max_hours=None if args.max_hours == 0 else args.max_hours)


def _warn(command: str, notes) -> None:
    for note in dict.fromkeys(notes):            # each distinct message once, in order
        print(f"linattn {command}: warning: {note}", file=sys.stderr)


def examples_root() -> Path:
    """The folder holding ``simulations/`` (figure scripts, ``configs/``) and ``derivations/``: the
    checkout of a source or editable install, else the copy a wheel ships in ``linattn_theory/_examples``."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_examples"
    return shipped if shipped.is_dir() else package.parent


def _root(root: str | None, folder: str) -> Path:
    """``--root``: as given, else the current folder when it holds ``folder``, else :func:`examples_root`."""
    if root is not None:
        return Path(root)
    return Path(".") if Path(folder).is_dir() else examples_root()


def _figures_root(root: str | None) -> tuple[Path, bool]:
    """``(root, checkout)`` of the figure scripts: ``--root`` as given, else the checkout around the
    working directory (:func:`~linattn_theory.report.figures.find_root`), else the examples shipped
    with the package (then ``checkout`` is false: figures are not written into the package)."""
    from ..report.figures import find_root

    if root is not None:
        return Path(root), True
    try:
        return find_root(), True
    except ConfigError:
        return examples_root(), False


def _read_file(path, what: str = "config file") -> dict:
    """The TOML file ``path``; a path missing here but shipped as an example says where that is."""
    from ..sim.config import read_toml

    try:
        return read_toml(path, what)
    except ConfigError as err:
        shipped = examples_root() / str(path)
        if not Path(path).is_absolute() and not Path(path).exists() and shipped.is_file():
            raise ConfigError(f"{err}; the package ships it as {shipped} (`linattn examples --copy .` "
                              f"copies the examples here)") from None
        raise


def _run_config(args):
    """The run config of ``simulate`` and ``recommend``: the file (not a sweep file), ``--set`` applied."""
    from ..sim.config import apply_overrides, config_from_dict, parse_overrides

    data = _read_file(args.config)
    sweep_keys = sorted({"grid", "quick", "figure"} & set(data))
    if sweep_keys:
        hint = (f"run it with `linattn sweep {args.config} --out DIR`" if args.command == "simulate" else
                "give one run's config (a file without [grid], e.g. simulations/configs/quickstart.toml)")
        raise ConfigError(f"{sweep_keys[0]}: {args.config} is a sweep file (it has a [{sweep_keys[0]}] "
                          f"table); {hint}")
    return config_from_dict(apply_overrides(data, parse_overrides(args.set)))


def _print_config(data: dict) -> int:
    from ..sim.config import to_toml

    print(to_toml(data), end="")
    return EXIT_OK


def _check_run_folder(out: Path, overwrite: bool) -> None:
    """``simulate --out``: never a sweep folder; a folder holding a run only with ``--overwrite``."""
    if (out / "sweep.json").is_file() or (out / "runs").is_dir():
        raise ArgumentError(f"--out {str(out)!r} is a sweep folder (sweep.json, runs/); a run written there "
                            f"would hide the sweep from load_results: choose another folder")
    held = [name for name in ("metadata.json", "rounds.csv", "params.npz") if (out / name).exists()]
    if held and not overwrite:
        raise ArgumentError(f"--out {str(out)!r} already holds a run ({', '.join(held)}); choose another "
                            f"folder, or pass --overwrite to replace it")


def _simulate(args) -> int:
    from ..sim.config import ignored_settings
    from ..sim.limits import check_output_folder

    config = _run_config(args)
    if args.backend is not None:
        config = config.with_updates({"model.backend": args.backend})
    if args.engine is not None:
        config = config.with_updates({"model.engine": args.engine})
    if args.print_config:
        return _print_config(config.to_dict())
    if args.out is None:
        raise ArgumentError("--out: expected the folder to write the run to (--out DIR)")
    out = check_output_folder(args.out)
    _check_run_folder(out, args.overwrite)
    _resource_limits(args, [config])
    if config.model.backend != "numpy":
        from ..core.backend import get_namespace
        get_namespace(config.model.backend)          # an unusable backend fails here, before any work
    _warn("simulate", ignored_settings(config))

    from ..core.io import write_run
    from ..sim.engine import simulate

    args.kept = lambda: (f"nothing was written to {out} (a run is written when it ends)"
                         + ("; the run already there is unchanged" if (out / "metadata.json").exists() else ""))
    result = simulate(config, progress=not args.quiet)
    if args.set:
        result.metadata["overrides"] = list(args.set)
    paths = write_run(result, out)
    last = result.table.iloc[-1]
    print(f"wrote {paths['table']} ({len(result.table) - 1} rounds, final loss F = {last['loss']:.6g})")
    if result.diverged:
        print(result.divergence.message, file=sys.stderr)
        return EXIT_DIVERGED
    return EXIT_OK


def _sweep_document(sweep, args) -> dict:
    """The resolved sweep file (``--quick`` and ``--set`` applied) for ``--print-config``."""
    document = {**sweep.base, "grid": sweep.grid}
    if sweep.figure:
        document["figure"] = sweep.figure
    quick = _read_file(args.config, "sweep file").get("quick")
    if quick and not args.quick:
        document["quick"] = quick
    return document


def _sweep(args) -> int:
    import os

    from ..sim.config import ignored_settings, parse_overrides
    from ..sim.limits import check_output_folder
    from ..sim.sweep import SweepDiverged, check_executor, load_sweep, run_dir, run_sweep, with_backend

    _read_file(args.config, "sweep file")                # a missing example: say where it ships
    sweep = load_sweep(args.config, quick=args.quick, max_runs=args.max_runs or None,
                       overrides=parse_overrides(args.set))
    if args.backend is not None:
        sweep = with_backend(sweep, args.backend)
        args.executor = _backend_executor(args.backend, args.executor)
    if args.print_config:
        return _print_config(_sweep_document(sweep, args))
    if args.dry_run:
        for run_id, point in zip(sweep.run_ids, sweep.points):
            print(run_id, " ".join(f"{k}={v}" for k, v in point.items()))
        print(f"{len(sweep)} runs (nothing written)")
        return EXIT_OK
    if args.out is None:
        raise ArgumentError("--out: expected the sweep folder (--out DIR)")
    out = check_output_folder(args.out)
    check_executor(args.executor, args.workers, args.scheduler)
    workers = 1 if args.executor == "serial" else (args.workers or os.cpu_count() or 1)
    pending = [c for i, c in zip(sweep.run_ids, sweep.configs) if not (run_dir(out, i) / "metadata.json").is_file()]
    _resource_limits(args, pending, workers)
    _warn("sweep", [note for c in sweep.configs for note in ignored_settings(c)] + _workers_notes(args))

    def kept():
        from ..core.io import run_status
        finished = sum(run_status(run_dir(out, i))[0] == "finished" for i in sweep.run_ids)
        return f"{finished} of {len(sweep)} runs are finished in {out}; rerun the same command to resume"

    args.kept = kept
    try:
        summary = run_sweep(sweep, out, executor=args.executor, workers=args.workers,
                            scheduler=args.scheduler, progress=not args.quiet,
                            existing="add" if args.add else "refuse", wait=args.wait,
                            fail_on_divergence=args.fail_on_divergence)
    except SweepDiverged as err:
        summary = err.summary
    broken = (f" ({summary.broken} of them recomputed because their files did not match the hashes "
              f"recorded for them)" if summary.broken else "")
    diverged = f"; {summary.divergence_report()}" if summary.divergences else ", none diverged"
    print(f"{summary.total} runs in {summary.out}: {summary.computed} computed{broken}, {summary.skipped} "
          f"already finished ({summary.seconds:.1f} s){diverged}; summary: {summary.out / 'summary.csv'}")
    if summary.divergences and args.fail_on_divergence:
        print(f"linattn sweep: {len(summary.divergences)} runs diverged (--fail-on-divergence)", file=sys.stderr)
        return EXIT_DIVERGED
    return EXIT_OK


#: where ``linattn figures --quick`` writes by default (never over the full-size figures)
QUICK_FIGURES = "results/figures-quick"


def _workers_notes(args) -> list[str]:
    """``--workers`` above the usable cores (with an executor that starts local workers): a warning."""
    from ..sim.limits import workers_note

    local = args.executor != "serial" and getattr(args, "scheduler", None) is None
    note = workers_note(args.workers, "--workers") if local else None
    return [note] if note else []


def _backend_executor(backend: str, executor: str) -> str:
    """The executor of runs on ``backend``: checked first (an unusable backend fails before any
    work); on a GPU one process drives the device, so local worker processes become ``serial``."""
    if backend == "numpy":
        return executor
    from ..core.backend import get_namespace
    get_namespace(backend)
    if executor == "processes":
        print(f"--backend {backend}: one process drives the GPU; running the runs in this process "
              f"(executor serial)", file=sys.stderr)
        return "serial"
    return executor


def _figures(args) -> int:
    from ..report.figures import discover, make_figures
    from ..sim.limits import check_output_folder

    start = time.perf_counter()

    root, checkout = _figures_root(args.root)
    scripts = discover(root, only=args.only)
    if args.list:
        for name, path in scripts.items():
            print(f"{name}\t{path}")
        return EXIT_OK
    out = args.out or (QUICK_FIGURES if args.quick else str(root / "figures") if checkout else "figures")
    check_output_folder(out)
    if args.quick and not args.overwrite and Path(out).resolve() == (root / "figures").resolve():
        raise ArgumentError(f"--out {out!r}: the full-size figures there would be overwritten by quick ones; "
                            f"choose another folder (the default for --quick is {QUICK_FIGURES}), or pass "
                            f"--overwrite")
    if args.backend is not None:
        args.executor = _backend_executor(args.backend, args.executor)
    jobs = figure_jobs(args.jobs, args.backend)
    _warn("figures", _workers_notes(args))
    args.kept = lambda: f"the figures written so far and the finished sweep runs are kept in {out}; rerun to resume"
    made = make_figures(scripts, out, quick=args.quick, executor=args.executor,
                        workers=args.workers, progress=not args.quiet, backend=args.backend, jobs=jobs)
    for name, (paths, seconds) in made.items():
        print(f"{name} ({seconds:.1f} s):")
        for path in paths:
            print(f"  wrote {path}")
    files = sum(len(paths) for paths, _ in made.values())
    print(f"{len(made)} figure scripts, {files} files, {time.perf_counter() - start:.1f} s in all"
          f"{f' ({jobs} at a time)' if jobs > 1 and len(made) > 1 else ''}, written to {out}")
    return EXIT_OK


#: ``linattn figures --jobs``' default: two scripts at a time (each spends most of its time on one
#: core: optima, analysis, drawing; with the cores shared, the quick set took 0.54 of its one-at-a-time wall
#: time on 2 cores, 2026-12-04)
FIGURE_JOBS_DEFAULT = 2


def figure_jobs(jobs: int | None, backend: str | None) -> int:
    """Figure scripts run at once: ``--jobs``, else :data:`FIGURE_JOBS_DEFAULT` capped at the usable
    cores; one on a GPU backend (one process drives the device)."""
    from ..sim.limits import usable_cores

    if backend not in (None, "numpy"):
        if jobs not in (None, 1):
            print(f"--backend {backend}: one process drives the GPU; running one figure script at a time "
                  f"(--jobs 1)", file=sys.stderr)
        return 1
    return jobs if jobs is not None else max(1, min(FIGURE_JOBS_DEFAULT, usable_cores()))


def _analyze(args) -> int:
    import pandas as pd

    from ..report.analysis import analysis_summary, analyze_sweep

    args.kept = lambda: f"the tables of {args.sweep_dir} are written when the analysis ends; nothing was written"
    analysis = analyze_sweep(args.sweep_dir, args.out, bound=args.bound, workers=args.workers)
    if len(analysis.instances) <= MAX_INSTANCES_SHOWN and not args.quiet:
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(analysis.instances.to_string(index=False))
    print(analysis_summary(analysis))
    for path in analysis.paths.values():
        print(f"wrote {path}")
    return EXIT_OK


#: ``linattn analyze`` prints the per-instance table up to this many instances
MAX_INSTANCES_SHOWN = 20


def _recommend(args) -> int:
    from .recommend_command import recommend_main

    config = _run_config(args)
    if args.print_config:
        return _print_config(config.to_dict())
    return recommend_main(config, mode=args.mode, measure=not args.no_measure,
                          pilot_rounds=args.pilot_rounds, transfer_seeds=args.transfer_seeds)


def _examples(args) -> int:
    import shutil

    root = examples_root()
    if args.copy is None:
        for path in sorted((root / "simulations" / "configs").glob("*.toml")):
            print(path)
        print(f"figure scripts: {root / 'simulations'}; derivations: {root / 'derivations'}; "
              f"the walk-through notebook and its solutions: {root / 'notebooks'}; "
              f"`linattn examples --copy DIR` copies them to DIR")
        return EXIT_OK
    target = Path(args.copy)
    taken = [name for name in EXAMPLE_FOLDERS if (target / name).exists()]
    if taken:
        raise ArgumentError(f"--copy {args.copy!r}: {target / taken[0]} exists; choose another folder")
    for name in EXAMPLE_FOLDERS:
        shutil.copytree(root / name, target / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        print(f"copied {root / name} to {target / name}")
    print(f"run the walk-through with `python {target / 'notebooks' / 'bias_drift_tradeoff.py'}`, or execute it "
          f"into a notebook with `python {target / 'notebooks' / 'execute.py'}` (pip install "
          f"'linattn-theory[teach]')")
    return EXIT_OK


#: what ``linattn examples --copy DIR`` copies: figure scripts and configs, derivations, the walk-through
EXAMPLE_FOLDERS = ("simulations", "derivations", "notebooks")


def _derive(args) -> int:
    import subprocess

    from ..report.figures import did_you_mean

    folder = _root(args.root, "derivations") / "derivations"
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not scripts:
        raise ArgumentError(f"--root {str(folder.parent)!r}: no derivation scripts in {folder}")
    if args.only:
        missing = sorted(set(args.only) - {p.stem for p in scripts})
        if missing:
            raise ArgumentError(f"--only {missing[0]!r}: no such derivation in {folder}"
                                f"{did_you_mean(missing[0], [p.stem for p in scripts])}")
        scripts = [p for p in scripts if p.stem in args.only]
    failed = []
    totals = dict.fromkeys(CLAIM_KINDS, 0)
    for script in scripts:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        if not args.quiet:
            print(proc.stdout, end="")
        counts = count_claims(proc.stdout)
        totals = {kind: totals[kind] + counts[kind] for kind in CLAIM_KINDS}
        ok = proc.returncode == 0 and counts["PASS"] > 0 and counts["FAIL"] == 0   # bookkeeping alone is no evidence
        print(f"{'PASS' if ok else 'FAIL'}: derivations/{script.name} ({counts['PASS']} claims hold, "
              f"{counts['FAIL']} fail, {counts['BOOKKEEPING']} bookkeeping)")
        if not ok:
            failed.append(script.name)
            print(proc.stderr, end="", file=sys.stderr)
    print(f"{len(scripts) - len(failed)} derivations passed, {len(failed)} failed; claims: {totals['PASS']} hold, "
          f"{totals['FAIL']} fail; {totals['BOOKKEEPING']} bookkeeping statements (hold by definition, "
          "not counted)")
    return 1 if failed else EXIT_OK


#: line prefixes of derivations/_claims.py: evidence (PASS/FAIL) and bookkeeping (not counted)
CLAIM_KINDS = ("PASS", "FAIL", "BOOKKEEPING")


def count_claims(stdout: str) -> dict:
    """Count the ``PASS:``, ``FAIL:`` and ``BOOKKEEPING:`` lines a derivation script printed."""
    counts = dict.fromkeys(CLAIM_KINDS, 0)
    for line in stdout.splitlines():
        kind = line.split(":", 1)[0]
        if kind in counts and ":" in line:
            counts[kind] += 1
    return counts


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the source of docs/cli.md).

    Returns
    -------
    argparse.ArgumentParser
        The ``linattn`` parser with its subcommands.

    Examples
    --------
    >>> from linattn_theory.cli.commands import build_parser
    >>> args = build_parser().parse_args(["simulate", "run.toml"])
    >>> args.command, args.config
    ('simulate', 'run.toml')
    """
    parser = argparse.ArgumentParser(
        prog="linattn",
        description="Federated training of linear attention: simulations, theory checks and figures.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="on an unexpected error, print the full traceback")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("simulate", help="run one federated simulation from a TOML config",
                       description="Run one federated simulation (the strategy of federated.strategy: FedAvg, "
                                   "FedFrozen or a baseline) and write "
                                   "rounds.csv, params.npz and metadata.json to --out.")
    p.add_argument("config", help="TOML configuration file (see simulations/configs/; `linattn examples`)")
    p.add_argument("--out", default=None, help="output folder (created if missing; required unless --print-config)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (default: refuse); a sweep folder is always refused")
    _config_arguments(p)
    p.add_argument("--backend", choices=("numpy", "cupy"), default=None,
                   help="array library, overriding model.backend of the config "
                        "(cupy needs a GPU and pip install 'linattn-theory[gpu]')")
    _limit_arguments(p)
    p.add_argument("--engine", choices=("auto", "fused", "array_api"), default=None,
                   help="local-step engine, overriding model.engine of the config: fused CPU "
                        "kernels (numba), the Array-API path, or auto (fused where it applies)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _debug_argument(p)
    p.set_defaults(func=_simulate)

    p = sub.add_parser("sweep", help="run a grid of simulations in parallel (resumable)",
                       description="Run every configuration of a sweep file's [grid] (dotted keys -> "
                                   "lists) and store each run under DIR/runs/<config hash>/; "
                                   "finished runs are skipped, so an interrupted sweep resumes. "
                                   "Load the results with linattn_theory.load_results(DIR).")
    p.add_argument("config", help="sweep TOML: a run config plus a [grid] table")
    p.add_argument("--out", default=None,
                   help="sweep folder (created if missing; required unless --dry-run or --print-config)")
    p.add_argument("--quick", action="store_true",
                   help="apply the file's [quick] overrides (refused when it has none)")
    _config_arguments(p, grid=True)
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs; write nothing")
    _executor_arguments(p)
    p.add_argument("--scheduler", default=None,
                   help="Dask scheduler address (executor dask; default: a local cluster on 127.0.0.1)")
    p.add_argument("--add", action="store_true",
                   help="--out holds a sweep with another grid: add this sweep's runs to it "
                        "(default: refuse)")
    p.add_argument("--wait", action="store_true",
                   help="another sweep is writing to --out: wait for it to end, then resume "
                        "(default: refuse, naming it)")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 3 when a run of the sweep diverged (every run is still stored and the "
                        "summary written; default: exit 0, the closing line names the divergences)")
    p.add_argument("--max-runs", type=_non_negative(int), default=MAX_RUNS_DEFAULT, metavar="N",
                   help=f"refuse grids of more than N runs (default {MAX_RUNS_DEFAULT}; 0: no limit)")
    _backend_argument(p, "of every run of the sweep (other run ids: the numbers differ by rounding)")
    _limit_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _debug_argument(p)
    p.set_defaults(func=_sweep)

    p = sub.add_parser("figures", help="regenerate the figures (simulations/*.py)",
                       description="Run every figure script of ROOT/simulations (or those named by "
                                   "--only) and write PNG, PDF and a CSV of the plotted data per figure.")
    p.add_argument("--out", default=None,
                   help=f"output folder (default: ROOT/figures, or {QUICK_FIGURES} with --quick)")
    p.add_argument("--root", default=None,
                   help="repository root holding simulations/ (default: the checkout around the working "
                        "directory, else the examples shipped with the package)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="only this figure script (repeatable)")
    p.add_argument("--quick", action="store_true", help="small grids: the whole set in under two minutes")
    p.add_argument("--list", action="store_true", help="list the figure scripts and exit")
    p.add_argument("--overwrite", action="store_true",
                   help="with --quick, allow --out to be the folder of the full-size figures")
    _executor_arguments(p)
    p.add_argument("--jobs", type=_non_negative(int, 1), default=None, metavar="N",
                   help=f"figure scripts run at once, each in a process of its own (default "
                        f"{FIGURE_JOBS_DEFAULT}, at most one per core; 1 on a GPU backend); without --workers "
                        f"the scripts share the cores; the files are the same bytes whatever N")
    _backend_argument(p, "of the figures' sweeps (cached apart from the NumPy runs)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _debug_argument(p)
    p.set_defaults(func=_figures)

    p = sub.add_parser("recommend", help="recommend the warm-up length T0 (causal by default)",
                       description="Recommend a warm-up length T0 from a named information set "
                                   "(docs/theory.md §8): online (default; a causal rule that runs with "
                                   "the training and freezes when more warm-up no longer pays), pilot "
                                   "(the bound U(T0) fitted on the first T/4 rounds), transfer (the "
                                   "bound's T0 on other seeds) or a_posteriori (the bound fitted on the "
                                   "whole path it is judged on: descriptive, not a prediction). Prints "
                                   "what the recommendation used, violated assumptions first, and the "
                                   "measured excess risk against plain FedAvg.")
    p.add_argument("config", help="TOML configuration file of one run (not a sweep file)")
    _config_arguments(p)
    p.add_argument("--mode", choices=("online", "pilot", "transfer", "a_posteriori"), default="online",
                   help="information set of the recommendation (default: online)")
    p.add_argument("--pilot-rounds", type=int, default=None, metavar="T_P",
                   help="pilot rounds (mode pilot; default T/4, at most T/4)")
    p.add_argument("--transfer-seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="seeds of the same setting to transfer from (mode transfer; default the three "
                        "seeds after the config's seed; never the config's own seed)")
    p.add_argument("--no-measure", action="store_true",
                   help="skip the explicit runs that measure R(recommended) and R(T)")
    _debug_argument(p)
    p.set_defaults(func=_recommend)

    p = sub.add_parser("analyze", help="R(T0), its parts and the best T0 per instance of a finished sweep",
                       description="Analyse a finished sweep folder from its own configuration (sweep.json "
                                   "and each run's metadata.json; docs/theory.md §6): per run the excess risk "
                                   "R(T0) = F_λ(θ_T) − Φ*_λ and its parts bias, drift_floor, unfinished "
                                   "(excess_risk.csv), per instance the best T0 and the gain over FedAvg "
                                   "(best_warmup.csv). An instance is the runs that differ only in "
                                   "federated.warmup_rounds; a diverged run has no R(T0) (NaN, counted).")
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a finished sweep folder (linattn sweep ... --out SWEEP_DIR)")
    p.add_argument("--out", default=None, help="folder for the two tables (default: SWEEP_DIR)")
    p.add_argument("--bound", action="store_true",
                   help="also the a posteriori bound U(T0) per run (fitted on the instance's FedAvg run)")
    p.add_argument("--workers", type=_non_negative(int, 1), default=None,
                   help="processes analysing the instances (default: this one; the same numbers for any count)")
    p.add_argument("--quiet", action="store_true", help="print the summary only, not the per-instance table")
    _debug_argument(p)
    p.set_defaults(func=_analyze)

    p = sub.add_parser("derive", help="run the sympy derivations and report PASS/FAIL",
                       description="Run every script in derivations/ (each states claims, derives them "
                                   "with sympy and checks them) and count the claims. Statements that "
                                   "hold by definition are printed as BOOKKEEPING and never counted as "
                                   "PASS; a script fails if a claim fails or if it has no claim that "
                                   "could fail. Exit 1 if any script fails.")
    p.add_argument("--root", default=None,
                   help="folder holding derivations/ (default: the current folder if it has one, else "
                        "the copy shipped with the package)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these derivations (file stems)")
    p.add_argument("--quiet", action="store_true", help="print only one line per derivation")
    _debug_argument(p)
    p.set_defaults(func=_derive)

    p = sub.add_parser("examples", help="list the example configs (or copy them, the figure scripts and the notebook)",
                       description="Print the path of every example config, and where the figure scripts "
                                   "(simulations/), derivations (derivations/) and the walk-through notebook "
                                   "with its solutions (notebooks/) are: the checkout, or the copy shipped "
                                   "with an installed wheel. --copy DIR copies the three folders to DIR.")
    p.add_argument("--copy", default=None, metavar="DIR",
                   help="copy simulations/, derivations/ and notebooks/ to DIR")
    _debug_argument(p)
    p.set_defaults(func=_examples)
    return parser


def _config_arguments(p, grid: bool = False) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting of the config, e.g. --set federated.rounds=20 (a TOML value; "
                        "repeatable)" + ("; a grid key takes a list, e.g. --set seed=[0,1]" if grid else ""))
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved configuration as TOML and exit (nothing is run or written)")


def _backend_argument(p, what: str) -> None:
    p.add_argument("--backend", choices=("numpy", "cupy"), default=None,
                   help=f"array library {what}, overriding model.backend (cupy needs a GPU and "
                        f"pip install 'linattn-theory[gpu]'; its runs go in this process)")


def _executor_arguments(p) -> None:
    from ..sim.sweep import EXECUTORS
    p.add_argument("--executor", choices=EXECUTORS, default="processes",
                   help="serial (in-process), processes (forked workers, default) or dask")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per core)")


MAX_RUNS_DEFAULT = 10_000


def _non_negative(kind, low: float = 0):
    """An argparse type: a finite number of ``kind`` that is at least ``low``."""
    def parse(text: str):
        import math
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}")
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= {low:g}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _limit_arguments(p) -> None:
    from ..sim.limits import DEFAULT_MAX_HOURS
    p.add_argument("--max-memory-gb", type=_non_negative(float), default=None, metavar="GB",
                   help="refuse runs whose estimated memory exceeds GB (default: 80%% of this "
                        "machine's memory)")
    p.add_argument("--max-hours", type=_non_negative(float), default=DEFAULT_MAX_HOURS, metavar="H",
                   help=f"refuse runs whose estimated time exceeds H hours (default {DEFAULT_MAX_HOURS:g}; "
                        f"0: no limit)")


def _debug_argument(p) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="on an unexpected error, print the full traceback")


def _version() -> str:
    from .. import __version__
    return __version__


def _on_sigterm(signum, frame):
    raise Terminated()


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _kept(args) -> str:
    """What an interrupted command kept on disk (each command sets ``args.kept`` once it may write)."""
    kept = getattr(args, "kept", None)
    try:
        return kept() if kept else "nothing was written"
    except Exception:  # noqa: BLE001 - the message must not fail
        return "see the output folder"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (see the module docstring).

    Parameters
    ----------
    argv : list of str, optional
        The command and its arguments (``["simulate", "run.toml", "--out", "results/run"]``);
        default the command line's.

    Returns
    -------
    int
        The exit status.

    Examples
    --------
    >>> from linattn_theory.cli.commands import main
    >>> main(["simulate", "no-such-file.toml"]) != 0      # an error message on stderr, no traceback
    True
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    name = f"linattn {args.command}"
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:                  # not the main thread: SIGTERM keeps its default action
        pass
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, *_, **__: print(f"{name}: warning: {message}",
                                                                   file=sys.stderr)
            return args.func(args)
    except ArgumentError as err:
        print(f"{name}: invalid argument: {err}", file=sys.stderr)
        return EXIT_INVALID
    except ConfigError as err:
        print(f"{name}: invalid configuration: {err}", file=sys.stderr)
        return EXIT_INVALID
    except RunIntegrityError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print(f"{name}: interrupted; {_kept(args)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"{name}: stopped by SIGTERM; {_kept(args)}", file=sys.stderr)
        return EXIT_TERMINATED
    except MemoryError:
        if args.debug:
            raise
        print(f"{name}: out of memory; reduce the task's size (see --max-memory-gb)", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:  # noqa: BLE001 - the boundary: one line, the traceback with --debug
        if args.debug:
            raise
        print(f"{name}: error: {type(err).__name__}: {_one_line(err)} (rerun with --debug for the "
              f"traceback)", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
