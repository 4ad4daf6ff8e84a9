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

__all__ = ["find_root", "discover", "make_figures", "make_figure", "cores_per_script", "longest_first",
           "recorded_seconds", "figure_sweep", "figure_backend", "script_main", "config_path", "analysis_workers",
           "excess_risk_sweep"]

#: the array backend of the figures' sweeps (``None``: each sweep's own), set by :func:`figure_backend`
_BACKEND: str | None = None


@contextlib.contextmanager
def figure_backend(backend: str | None):
    """Run the figure sweeps started inside the ``with`` block on ``backend`` (``None``: as configured).

    Parameters
    ----------
    backend : str or None
        ``"numpy"``, ``"cupy"``, ``"array_api_strict"`` or ``None``.

    Returns
    -------
    contextlib.AbstractContextManager
        The ``with`` block.

    Examples
    --------
    >>> from linattn_theory.report.figures import figure_backend
    >>> from linattn_theory.report import figures
    >>> with figure_backend("numpy"):
    ...     inside = figures._BACKEND
    >>> inside, figures._BACKEND                                  # restored on leaving the block
    ('numpy', None)
    """
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

    Parameters
    ----------
    start : str or path-like, optional
        Where to look first; default the working directory.

    Returns
    -------
    pathlib.Path
        The root.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figures import find_root
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "simulations").mkdir()
    >>> (root / "sub" / "deeper").mkdir(parents=True)
    >>> find_root(root / "sub" / "deeper") == root.resolve()     # the nearest folder above with simulations/
    True
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
    defaults to :func:`find_root`).

    Parameters
    ----------
    root : str or path-like, optional
        The folder holding ``simulations/``; default :func:`find_root`.
    only : iterable of str, optional
        Keep these scripts (an unknown name is refused).

    Returns
    -------
    dict of str to pathlib.Path
        The scripts, by name, in alphabetical order.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figures import discover
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "simulations").mkdir()
    >>> script = '# A figure\\ndef make(out_dir, quick=False):\\n    return [out_dir]\\n'
    >>> _ = (root / "simulations" / "demo.py").write_text(script)
    >>> _ = (root / "simulations" / "notes.py").write_text("x = 1\\n")            # no make: not a figure script
    >>> discover(root) == {"demo": root / "simulations" / "demo.py"}
    True
    """
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
                 progress: bool = False, backend: str | None = None,
                 jobs: int = 1) -> dict[str, tuple[list[Path], float]]:
    """Run each script's ``make``; ``{name: (written paths, seconds)}``.

    Options a script's ``make`` does not take (e.g. ``executor`` for a script that runs no sweep)
    are not passed; ``make`` may return a list of paths or a ``{kind: path}`` dict. ``backend``
    runs every figure sweep on that array library (:func:`figure_backend`). With ``jobs > 1`` the
    scripts run side by side in that many processes, the longest first (:func:`longest_first`):
    a script spends most of its time on one core (optima, analysis, drawing), so two of them
    keep two cores busy. The scripts then share the cores (:func:`cores_per_script`): with the
    default ``workers`` a script whose share is one core runs its sweeps in its own process.
    Each script's files are the same bytes either way (a script's numbers do not depend on the
    processes around it); its seconds are then measured beside the others.

    Parameters
    ----------
    scripts : dict of str to pathlib.Path
        The scripts (:func:`discover`).
    out_dir : str or path-like
        Where the figures go.
    quick : bool, default False
        Run the sweeps' ``[quick]`` grids.
    executor : {"serial", "processes", "dask"}, default "processes"
        How the sweeps run (:func:`~linattn_theory.sim.sweep.run_sweep`).
    workers : int, optional
        Their workers; default one per core.
    progress : bool, default False
        Show progress bars.
    backend : str, optional
        Array library of every figure sweep; default as configured.
    jobs : int, default 1
        Scripts run at once, each in a process of its own (``1``: one after the other, here).

    Returns
    -------
    dict of str to tuple of (list of pathlib.Path, float)
        Per script, in the order of ``scripts``, the files written and the seconds taken.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figures import discover, make_figures
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "simulations").mkdir()
    >>> script = '# A figure\\ndef make(out_dir, quick=False):\\n    return [out_dir]\\n'
    >>> _ = (root / "simulations" / "demo.py").write_text(script)
    >>> _ = (root / "simulations" / "notes.py").write_text("x = 1\\n")            # no make: not a figure script
    >>> made = make_figures(discover(root), root / "figures", executor="serial")   # demo's make takes no executor
    >>> list(made), made["demo"][0] == [root / "figures"]
    (['demo'], True)
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ArgumentError(f"jobs = {jobs!r}; expected an integer >= 1")
    jobs = min(jobs, len(scripts))
    if jobs <= 1:
        options = {"quick": quick, "executor": executor, "workers": workers, "progress": progress}
        return {name: make_figure(name, path, out_dir, options, backend) for name, path in scripts.items()}
    executor, workers = cores_per_script(executor, workers, jobs)
    options = {"quick": quick, "executor": executor, "workers": workers, "progress": False}
    return _make_side_by_side(scripts, out_dir, options, backend, jobs, progress)


def cores_per_script(executor: str, workers: int | None, jobs: int) -> tuple[str, int | None]:
    """The ``(executor, workers)`` of each of ``jobs`` scripts run side by side: with the default
    ``workers`` and local worker processes, the usable cores divided among the scripts, and a share
    of one core runs in the script's own process (``"serial"``: a pool of one worker only adds a
    process and its imports, and a pool per script would put more processes than cores to work).
    Explicit ``workers`` and other executors are kept.

    Parameters
    ----------
    executor : str
        The sweeps' executor.
    workers : int, optional
        Their workers; ``None`` for one per core.
    jobs : int
        Scripts at once.

    Returns
    -------
    tuple of (str, int or None)
        Each script's executor and workers.

    Examples
    --------
    >>> from unittest import mock
    >>> from linattn_theory.report.figures import cores_per_script
    >>> with mock.patch("linattn_theory.sim.limits.usable_cores", return_value=8):
    ...     cores_per_script("processes", None, 2), cores_per_script("processes", None, 8)
    (('processes', 4), ('serial', 1))
    >>> cores_per_script("processes", 3, 2), cores_per_script("dask", None, 2)
    (('processes', 3), ('dask', None))
    """
    from ..sim import limits

    if executor != "processes" or workers is not None:
        return executor, workers
    share = max(1, limits.usable_cores() // jobs)
    return ("serial" if share == 1 else executor), share


def make_figure(name: str, path: Path, out_dir, options: dict, backend: str | None = None
                ) -> tuple[list[Path], float]:
    """Run one script's ``make`` with the ``options`` it takes; ``(written paths, seconds)``.

    Parameters
    ----------
    name : str
        The script's name.
    path : pathlib.Path
        The script.
    out_dir : str or path-like
        Where its figure goes.
    options : dict
        ``quick``, ``executor``, ``workers``, ``progress`` (those ``make`` does not take are dropped).
    backend : str, optional
        Array library of its sweeps (:func:`figure_backend`).

    Returns
    -------
    tuple of (list of pathlib.Path, float)
        The files written and the seconds taken.
    """
    start = time.perf_counter()
    with figure_backend(backend):
        make = _load(name, path).make
        accepted = inspect.signature(make).parameters
        paths = make(out_dir, **{k: v for k, v in options.items() if k in accepted})
    paths = paths.values() if isinstance(paths, dict) else paths
    return [Path(p) for p in paths], time.perf_counter() - start


def longest_first(scripts: dict[str, Path], seconds: dict[str, float]) -> list[str]:
    """The scripts' names, the longest first by ``seconds`` (scripts not timed first of all, in
    their order): longest-processing-time order, so that no long script starts last.

    Parameters
    ----------
    scripts : dict of str to pathlib.Path
        The scripts.
    seconds : dict of str to float
        Known times (e.g. ``figures/timings.csv``).

    Returns
    -------
    list of str
        Their names in the order to start them.

    Examples
    --------
    >>> from linattn_theory.report.figures import longest_first
    >>> longest_first({"a": None, "b": None, "c": None, "new": None}, {"a": 1.0, "b": 9.0, "c": 3.0})
    ['new', 'b', 'c', 'a']
    """
    return sorted(scripts, key=lambda name: (name in seconds, -seconds.get(name, 0.0)))


def recorded_seconds(root, quick: bool) -> dict[str, float]:
    """Each script's seconds in ``root/figures/timings.csv`` for the mode (the table
    :func:`~linattn_theory.report.figure_numbers.figure_times` reads; ``{}`` when none is recorded)."""
    from ..core.io import read_csv_exact

    path = Path(root) / "figures" / "timings.csv"
    if not path.is_file():
        return {}
    times = read_csv_exact(path)
    times = times[times["mode"] == ("quick" if quick else "full")]
    return dict(zip(times["figure"], times["seconds"].astype(float)))


def _make_side_by_side(scripts: dict[str, Path], out_dir, options: dict, backend, jobs: int,
                       progress: bool) -> dict[str, tuple[list[Path], float]]:
    """:func:`make_figures` with ``jobs`` scripts at once, each in a fresh (spawned) process: the
    first failure stops the others (their finished files and sweep runs are kept) and is raised."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    roots = {path.resolve().parent.parent for path in scripts.values()}
    seconds = recorded_seconds(roots.pop(), options["quick"]) if len(roots) == 1 else {}
    order = longest_first(scripts, seconds)
    bar = _progress_bar(len(order), progress)
    from ..sim import limits

    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_limit_threads,
                               initargs=(max(1, limits.usable_cores() // jobs),))
    try:
        futures = {pool.submit(_make_figure_and_release, name, scripts[name], out_dir, options, backend): name
                   for name in order}
        made, pending = {}, set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                made[futures[future]] = future.result()     # a script's error is raised here
                bar.update(1)
    except BaseException:
        for process in list((pool._processes or {}).values()):   # stop the other scripts now
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
    return {name: made[name] for name in scripts}


def _limit_threads(threads: int) -> None:
    """Start of a script's process: BLAS and the fused engine use ``threads`` (its share of the cores),
    not every core beside the other scripts (their numbers do not depend on it,
    :mod:`linattn_theory.core.fused`; a sweep's worker processes set their own, ``_worker_init``)."""
    from threadpoolctl import threadpool_limits

    from ..core.fused import set_threads
    threadpool_limits(threads)
    set_threads(threads)


def _make_figure_and_release(name: str, path: Path, out_dir, options: dict, backend) -> tuple[list[Path], float]:
    """:func:`make_figure` in a worker process, then stop the joblib (loky) workers its analysis
    started: loky keeps them for 300 s of idleness, and the worker could not exit before they do."""
    made = make_figure(name, path, out_dir, options, backend)
    if "joblib.externals.loky" in sys.modules:
        from joblib.externals.loky import get_reusable_executor
        get_reusable_executor().shutdown(wait=True)
    return made


def _progress_bar(total: int, shown: bool):
    """A bar over the figure scripts (tqdm), or a stand-in that shows nothing."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="figure scripts", unit="script", disable=not shown)


def analysis_workers(executor: str = "processes", workers: int | None = None) -> int:
    """Processes for a figure's per-instance analysis: one with ``executor="serial"``, else ``workers``
    (default one per core), as for the sweep itself.

    Parameters
    ----------
    executor : str, default "processes"
        The figure's executor.
    workers : int, optional
        Its workers.

    Returns
    -------
    int
        Processes (``≥ 1``).

    Examples
    --------
    >>> from linattn_theory.report.figures import analysis_workers
    >>> analysis_workers("serial", 8), analysis_workers("processes", 3)
    (1, 3)
    """
    return 1 if executor == "serial" else int(workers or os.cpu_count() or 1)


def config_path(script_file, name: str) -> Path:
    """``simulations/configs/NAME.toml`` next to a figure script.

    Parameters
    ----------
    script_file : str or path-like
        The script (its ``__file__``).
    name : str
        The config's stem.

    Returns
    -------
    pathlib.Path
        The config file.

    Examples
    --------
    >>> from linattn_theory.report.figures import config_path
    >>> config_path("/repo/simulations/tradeoff.py", "tradeoff").parts[-3:]
    ('simulations', 'configs', 'tradeoff.toml')
    """
    return Path(script_file).resolve().parent / "configs" / f"{name}.toml"


def figure_sweep(config, out_dir, *, quick=False, executor="processes", workers=None,
                 progress=False, rounds=False):
    """Run (or reuse) a figure's sweep; returns ``(sweep, results, sweep_dir)``.

    ``config`` is a sweep TOML file or a :class:`~linattn_theory.sim.sweep.Sweep` read from one
    (then ``quick`` only names the folder). Figure scripts share sweeps and may run side by side
    (``make_figures(jobs=2)``): a script whose sweep another one is writing waits for it, then
    reuses it. ``results`` is :func:`linattn_theory.load_results` of the sweep folder ``out_dir/_sweeps/<config stem>[-quick]``; with ``rounds=True`` also the
    per-round table, as ``(summary, per_round)``.

    Parameters
    ----------
    config : str, path-like or Sweep
        The sweep file (or the sweep read from it).
    out_dir : str or path-like
        The figures' folder (the sweep goes to ``out_dir/_sweeps/``).
    quick : bool, default False
        Run the ``[quick]`` grid.
    executor, workers, progress
        As in :func:`~linattn_theory.sim.sweep.run_sweep`.
    rounds : bool, default False
        Also read the per-round table.

    Returns
    -------
    sweep : Sweep
        The sweep.
    results : pandas.DataFrame or tuple of pandas.DataFrame
        Its runs (with ``rounds``: ``(summary, per_round)``).
    sweep_dir : pathlib.Path
        Its folder.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figures import figure_sweep
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> sweep_toml = '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n'
    >>> _ = (folder / "demo.toml").write_text(sweep_toml)
    >>> sweep, results, sweep_dir = figure_sweep(folder / "demo.toml", folder, executor="serial")
    >>> len(sweep), sorted(results["T0"]), sweep_dir.relative_to(folder).as_posix()
    (3, [0, 2, 4], '_sweeps/demo')
    """
    from .results import load_results
    from ..sim.sweep import Sweep, load_sweep, run_sweep, with_backend

    sweep = config if isinstance(config, Sweep) else load_sweep(config, quick=quick)
    if _BACKEND is not None:
        sweep = with_backend(sweep, _BACKEND)
    stem = Path(sweep.source).stem if sweep.source else "sweep"
    folder = Path(out_dir) / "_sweeps" / (stem + ("-quick" if quick else ""))
    summary = run_sweep(sweep, folder, executor=executor, workers=workers, progress=progress,
                        existing="replace", wait=True).table   # load_results(folder), read once
    if rounds:
        return sweep, (summary, load_results(folder, rounds=True)), folder
    return sweep, summary, folder


def excess_risk_sweep(config, out_dir, *, by, bound=False, quick=False, executor="processes",
                      workers=None, progress=False, chaos=False):
    """Run (or reuse) a FedFrozen sweep over ``T0`` and analyse it: ``(table, best, left_out)``.

    The instances are those of :func:`~linattn_theory.report.sweep_analysis.select_instances` (the one rule
    of every figure: an instance whose FedAvg run diverged is left out). ``table``: their
    non-diverged runs with the excess-risk decomposition (and, with ``bound``, the fitted bound) of
    :func:`~linattn_theory.report.sweep_analysis.excess_risk_table`; ``best``: per instance (the columns
    ``by``), the best warm-up and the gain over FedAvg (a diverged run counts as ``R = ∞``);
    ``left_out``: the instances left out. With ``chaos``, ``best`` also has ``chaotic`` and
    ``amplification``: how chaotic each instance's FedAvg run is
    (:func:`~linattn_theory.report.sweep_analysis.fedavg_chaos`, docs/theory.md §6).

    Parameters
    ----------
    config, out_dir, quick, executor, workers, progress
        As in :func:`figure_sweep`.
    by : list of str
        The columns that name an instance.
    bound : bool, default False
        Also fit the bound (:func:`~linattn_theory.report.sweep_analysis.excess_risk_table`).
    chaos : bool, default False
        Also measure each kept instance's chaos (one more FedAvg run per instance, stored with the sweep).

    Returns
    -------
    table : pandas.DataFrame
        The kept instances' non-diverged runs, decomposed.
    best : pandas.DataFrame
        Per instance, the best warm-up and the gain.
    left_out : pandas.DataFrame
        The instances left out.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figures import excess_risk_sweep
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> sweep_toml = '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n'
    >>> _ = (folder / "demo.toml").write_text(sweep_toml)
    >>> table, best, left_out = excess_risk_sweep(folder / "demo.toml", folder, by=["seed"], executor="serial")
    >>> len(table), len(best), len(left_out)
    (3, 1, 0)
    >>> int(best["best_T0"].iloc[0]) == int(table.loc[table["excess_risk"].idxmin(), "T0"])
    True
    """
    from .sweep_analysis import excess_risk_table, fedavg_chaos, select_instances

    _, results, folder = figure_sweep(config, out_dir, quick=quick, executor=executor,
                                      workers=workers, progress=progress)
    processes = analysis_workers(executor, workers)
    table = excess_risk_table(folder, results, bound=bound, workers=processes)
    runs, best, left_out = select_instances(table, by)
    if chaos:
        best = best.merge(fedavg_chaos(folder, table, by, workers=processes), on=list(by), how="left",
                          validate="one_to_one")
    return runs, best, left_out


def script_main(make, doc: str | None = None, argv=None) -> int:
    """The command line of one figure script: ``[--quick] [--out DIR] [--executor E] [--workers N]
    [--backend B]``.

    Parameters
    ----------
    make : callable
        The script's ``make(out_dir, *, quick, …)``.
    doc : str, optional
        The script's docstring (the ``--help`` text).
    argv : list of str, optional
        The arguments; default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status.

    Examples
    --------
    >>> from linattn_theory.report.figures import script_main
    >>> def make(out_dir, quick=False, executor="processes", workers=None, progress=False):
    ...     return [f"{out_dir}/demo.png (quick={quick}, executor={executor})"]
    >>> script_main(make, argv=["--quick", "--out", "figs", "--executor", "serial"])
    figs/demo.png (quick=True, executor=serial)
    0
    """
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
