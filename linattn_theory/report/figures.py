"""Regenerating the figures: discover the scripts of ``simulations/`` and run them.

A figure script ``simulations/NAME.py`` defines
``make(out_dir, quick=False, executor="processes", workers=None, progress=False) -> list[Path]``
and reads its sweep from ``simulations/configs/``; it is runnable on its own as
``python simulations/NAME.py [--quick] [--out figures]`` through :func:`script_main`.
Sweep results are cached under ``out_dir/_sweeps/<config>[-quick]/`` (keyed by each run's
config hash, so a second call only redraws). A sweep runs its runs as ensembles, grouped by
themselves (:func:`linattn_theory.sim.ensemble.simulate_many`); with a ``backend`` (``linattn
figures --backend cupy``) every figure sweep runs on that array library.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path

from ..core.errors import ArgumentError, ConfigError

__all__ = ["find_root", "discover", "make_figures", "figure_sweep", "figure_backend", "script_main", "config_path",
           "analysis_workers", "excess_risk_sweep"]

#: the array backend of the figures' sweeps (``None``: each sweep's own), set by :func:`figure_backend`
_BACKEND: str | None = None


@contextlib.contextmanager
def figure_backend(backend: str | None):
    """Run the figure sweeps started inside the ``with`` block on ``backend`` (``None``: as configured)."""
    global _BACKEND
    previous, _BACKEND = _BACKEND, backend
    try:
        yield
    finally:
        _BACKEND = previous


def _defines_make(path: Path) -> bool:
    return "\ndef make(" in path.read_text()


def find_root(start=None) -> Path:
    """The folder holding ``simulations/``: ``start`` (default the working directory) or the nearest
    folder above it that has one, else the checkout above the installed package (an editable install,
    recognised by its ``simulations/`` and ``figures/`` folders).

    The working directory comes first, so figure scripts of one's own are never mistaken for the
    package's checkout (whose committed figures would then be overwritten). Raises
    :class:`ConfigError` when none is found.
    """
    here = Path.cwd() if start is None else Path(start)
    for folder in (here.resolve(), *here.resolve().parents):
        if (folder / "simulations").is_dir():
            return folder
    package = Path(sys.modules[__name__.split(".")[0]].__file__).resolve().parent
    if (package.parent / "simulations").is_dir() and (package.parent / "figures").is_dir():
        return package.parent
    raise ConfigError(f"no simulations/ folder in {str(here)!r} or above it: run from a checkout of "
                      "linattn-theory or pass --root")


def discover(root=None, only=None) -> dict[str, Path]:
    """``{name: path}`` of the figure scripts in ``root/simulations`` (files defining ``make``; ``root``
    defaults to :func:`find_root`)."""
    folder = Path(find_root() if root is None else root) / "simulations"
    if not folder.is_dir():
        raise ArgumentError(f"--root {str(root)!r}: no simulations/ folder there")
    scripts = {p.stem: p for p in sorted(folder.glob("*.py"))
               if not p.name.startswith("_") and _defines_make(p)}
    if only:
        unknown = sorted(set(only) - set(scripts))
        if unknown:
            raise ArgumentError(f"--only {unknown[0]!r}: no such figure script{did_you_mean(unknown[0], scripts)}; "
                                f"expected one of {', '.join(scripts)}")
        scripts = {k: v for k, v in scripts.items() if k in set(only)}
    return scripts


def did_you_mean(value: str, choices) -> str:
    """``" (did you mean 'tradeoff'?)"`` for the closest of ``choices``, or ``""``."""
    import difflib
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(f"linattn_figure_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_figures(scripts: dict[str, Path], out_dir, *, quick: bool = False,
                 executor: str = "processes", workers: int | None = None,
                 progress: bool = False, backend: str | None = None) -> dict[str, tuple[list[Path], float]]:
    """Run each script's ``make``; ``{name: (written paths, seconds)}``.

    Options a script's ``make`` does not take (e.g. ``executor`` for a script that runs no sweep)
    are not passed; ``make`` may return a list of paths or a ``{kind: path}`` dict. ``backend``
    runs every figure sweep on that array library (:func:`figure_backend`).
    """
    made = {}
    options = {"quick": quick, "executor": executor, "workers": workers, "progress": progress}
    with figure_backend(backend):
        for name, path in scripts.items():
            start = time.perf_counter()
            make = _load(name, path).make
            accepted = inspect.signature(make).parameters
            paths = make(out_dir, **{k: v for k, v in options.items() if k in accepted})
            paths = paths.values() if isinstance(paths, dict) else paths
            made[name] = ([Path(p) for p in paths], time.perf_counter() - start)
    return made


def analysis_workers(executor: str = "processes", workers: int | None = None) -> int:
    """Processes for a figure's per-instance analysis: one with ``executor="serial"``, else ``workers``
    (default one per core), as for the sweep itself."""
    return 1 if executor == "serial" else int(workers or os.cpu_count() or 1)


def config_path(script_file, name: str) -> Path:
    """``simulations/configs/NAME.toml`` next to a figure script."""
    return Path(script_file).resolve().parent / "configs" / f"{name}.toml"


def figure_sweep(config, out_dir, *, quick=False, executor="processes", workers=None,
                 progress=False, rounds=False):
    """Run (or reuse) a figure's sweep; returns ``(sweep, results, sweep_dir)``.

    ``config`` is a sweep TOML file or a :class:`~linattn_theory.sim.sweep.Sweep` read from one
    (then ``quick`` only names the folder). ``results`` is :func:`linattn_theory.load_results`
    of the sweep folder ``out_dir/_sweeps/<config stem>[-quick]``; with ``rounds=True`` also the
    per-round table, as ``(summary, per_round)``.
    """
    from .results import load_results
    from ..sim.sweep import Sweep, load_sweep, run_sweep, with_backend

    sweep = config if isinstance(config, Sweep) else load_sweep(config, quick=quick)
    if _BACKEND is not None:
        sweep = with_backend(sweep, _BACKEND)
    stem = Path(sweep.source).stem if sweep.source else "sweep"
    folder = Path(out_dir) / "_sweeps" / (stem + ("-quick" if quick else ""))
    summary = run_sweep(sweep, folder, executor=executor, workers=workers, progress=progress,
                        existing="replace").table          # load_results(folder), read once
    if rounds:
        return sweep, (summary, load_results(folder, rounds=True)), folder
    return sweep, summary, folder


def excess_risk_sweep(config, out_dir, *, by, bound=False, quick=False, executor="processes",
                      workers=None, progress=False):
    """Run (or reuse) a FedFrozen sweep over ``T0`` and analyse it: ``(table, best, left_out)``.

    The instances are those of :func:`~linattn_theory.report.sweep_analysis.select_instances` (the one rule
    of every figure: an instance whose FedAvg run diverged is left out). ``table``: their
    non-diverged runs with the excess-risk decomposition (and, with ``bound``, the fitted bound) of
    :func:`~linattn_theory.report.sweep_analysis.excess_risk_table`; ``best``: per instance (the columns
    ``by``), the best warm-up and the gain over FedAvg (a diverged run counts as ``R = ∞``);
    ``left_out``: the instances left out.
    """
    from .sweep_analysis import excess_risk_table, select_instances

    _, results, folder = figure_sweep(config, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    table = excess_risk_table(folder, results, bound=bound, workers=analysis_workers(executor, workers))
    return select_instances(table, by)


def script_main(make, doc: str | None = None, argv=None) -> int:
    """The command line of one figure script: ``[--quick] [--out DIR] [--executor E] [--workers N]
    [--backend B]``."""
    from ..sim.limits import workers_note
    from ..sim.sweep import EXECUTORS

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help="small grids (seconds, for tests)")
    parser.add_argument("--out", default="figures", help="output folder (default: figures)")
    parser.add_argument("--executor", choices=EXECUTORS, default="processes")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--backend", choices=("numpy", "cupy"), default=None,
                        help="array library of the figure's sweeps (cupy: a GPU, runs in this process)")
    args = parser.parse_args(argv)
    executor = "serial" if args.backend == "cupy" else args.executor
    note = workers_note(args.workers, "--workers") if executor != "serial" else None
    if note:
        print(f"warning: {note}", file=sys.stderr)
    try:
        with figure_backend(args.backend):
            paths = make(args.out, quick=args.quick, executor=executor, workers=args.workers,
                         progress=not args.quiet)
    except ConfigError as err:
        kind = "invalid argument" if isinstance(err, ArgumentError) else "invalid configuration"
        print(f"{kind}: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0
