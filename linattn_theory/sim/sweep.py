"""Sweeps: a grid of runs, executed in parallel, resumable, keyed by the hash of each run's config.

A sweep file is a run configuration (the ``seed``, ``[task]``, ``[model]`` and ``[federated]``
sections of ``linattn simulate``) plus

- ``[grid]``: dotted keys mapped to lists of values, e.g. ``"federated.warmup_rounds" = [0, 5]``,
  ``"task.zeta_value" = [0.25, 1.0]``, ``seed = [0, 1, 2]``; the runs are the Cartesian product
  (first key slowest, last key fastest). Several ``[[grid]]`` tables give the union of their
  products (e.g. one-at-a-time variations around the base config);
- ``[quick]`` (optional): overrides applied with ``quick=True`` (``--quick``): a key of a grid
  gets a new list, any other dotted key a new base value (``overrides``, ``--set KEY=VALUE``,
  follow the same rule and come last);
- ``[figure]`` (optional): free-form settings read by the figure script that uses the sweep.

Every expanded configuration is validated before any run starts (a value listed twice in a grid
is refused). Run ``i`` is stored in ``DIR/runs/<config_hash>/`` by
:func:`linattn_theory.core.io.write_run` (each file atomic, ``metadata.json`` last, with the
SHA-256 of the other files), so a finished run is one whose ``metadata.json`` exists and whose
files match it: rerunning a sweep skips those and recomputes a broken one, and a sweep killed at
any instant and restarted completes with nothing lost. One sweep writes to a folder at a time
(``DIR/.sweep.lock``; a second one refuses, or waits with ``wait=True``), and a sweep that ends
writes ``DIR/summary.csv``, one row per finished run (:func:`summary_table`).
Workers only compute; the calling process writes every file, so the executor (in-process, local
worker processes, or Dask) and the number of workers cannot change the results. Local workers
exit as soon as the calling process is gone (even after SIGKILL), and are stopped on an error,
Ctrl-C or SIGTERM; a local Dask cluster's scratch folder is removed afterwards.
Each worker runs its runs as ensembles (:func:`~linattn_theory.sim.ensemble.simulate_many`: runs
of equal shapes as one array program; FedFrozen runs that differ only in the warm-up length
``T0`` share their warm-up trajectory, at about the cost of the longest run, and so does the
online rule's run of their instance with ``T0 = T``). A run's numbers do
not depend on which runs share its task or ensemble, so they are the same whatever the
executor, the number of workers or the point where an interrupted sweep resumed (and equal to
``simulate(config)`` to rounding).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ConfigError, RunIntegrityError, SettingWarning
from ..core.io import atomic_write_bytes, read_run, run_status, timed_run, write_json, write_run
from .config import RunConfig, config_from_dict, config_hash, read_toml, set_dotted, warmup_family_key

__all__ = ["Sweep", "SweepSummary", "DivergedRun", "SweepDiverged", "divergence_report", "load_sweep",
           "sweep_from_dict", "with_backend", "run_sweep", "run_dir", "is_complete", "grid_size", "summary_table",
           "summary_row", "finished_runs", "read_table", "sweep_lock", "check_executor", "EXECUTORS", "MAX_RUNS", "SUMMARY_COLUMNS"]

EXECUTORS = ("serial", "processes", "dask")
MANIFEST = "sweep.json"
#: one row per finished run, written when a sweep ends (:func:`summary_table`)
SUMMARY = "summary.csv"
#: the writer's lock of a sweep folder (:func:`sweep_lock`)
LOCK = ".sweep.lock"
#: largest grid expanded by default (``--max-runs``)
MAX_RUNS = 10_000
#: how a sweep treats a folder that holds another sweep (``sweep.json`` with other runs)
EXISTING = ("refuse", "add", "replace")
#: how often a worker checks that the sweep's process is still alive (seconds)
PARENT_CHECK_SECONDS = 0.2
_SECTIONS = ("grid", "quick", "figure")


@dataclass(frozen=True)
class Sweep:
    """An expanded grid: the validated runs in grid order (duplicates removed), their grid points."""

    configs: tuple[RunConfig, ...]
    points: tuple[dict, ...]
    grid: dict | list[dict]
    base: dict
    figure: dict = field(default_factory=dict)
    source: str | None = None

    @property
    def run_ids(self) -> list[str]:
        return [config_hash(c) for c in self.configs]

    def __len__(self) -> int:
        return len(self.configs)

    def with_runs(self, configs, points=None) -> "Sweep":
        """This sweep with more (validated) runs appended; runs already in it are kept once."""
        points = [{} for _ in configs] if points is None else list(points)
        seen = set(self.run_ids)
        new_configs, new_points = list(self.configs), list(self.points)
        for config, point in zip(configs, points):
            if config_hash(config) not in seen:
                seen.add(config_hash(config))
                new_configs.append(config)
                new_points.append(dict(point))
        return Sweep(tuple(new_configs), tuple(new_points), self.grid, self.base, self.figure, self.source)


@dataclass(frozen=True)
class SweepSummary:
    """What :func:`run_sweep` did: runs in the sweep, already finished before, computed now
    (``broken`` of them recomputed because their files did not match their hashes), diverged
    of those computed now; ``table``: the summary table it wrote (:func:`summary_table` of
    ``out``); ``divergences``: every diverged run of the sweep (:class:`DivergedRun`, grid order)."""

    total: int
    skipped: int
    computed: int
    diverged: int
    seconds: float
    out: Path
    broken: int = 0
    table: object = field(default=None, repr=False, compare=False)
    divergences: tuple = ()

    def divergence_report(self) -> str:
        """The sweep's divergences in one line (``""`` when none): how many, the worst (earliest) run
        with its grid point and round, and the suggested stable step (:func:`divergence_report`)."""
        return divergence_report(self.divergences, self.total)


@dataclass(frozen=True)
class DivergedRun:
    """A diverged run of a sweep (from its ``metadata.json``): its id and grid point, its seed and
    step ``η``, the round and ``F_λ`` at which it stopped, and the stable step its report suggests."""

    run_id: str
    point: dict
    seed: int
    learning_rate: float
    round: int
    loss: float
    stable_learning_rate: float


def worst_divergence(divergences) -> DivergedRun:
    """The earliest divergence (ties: the run furthest above its suggested stable step)."""
    return min(divergences, key=lambda d: (d.round, d.stable_learning_rate / d.learning_rate))


def divergence_report(divergences, total: int) -> str:
    """``"3 of 12 runs diverged; the earliest: run <id> (seed=1, ...) at round 2 with η = 5; try
    η < 0.21, the smallest stable step suggested for them (each run's metadata.json has its own)"``."""
    if not divergences:
        return ""
    worst = worst_divergence(divergences)
    point = {"seed": worst.seed, **worst.point}
    where = ", ".join(f"{k}={v}" for k, v in point.items())
    safe = min(d.stable_learning_rate for d in divergences)
    return (f"{len(divergences)} of {total} runs diverged; the earliest: run {worst.run_id} ({where}) at "
            f"round {worst.round} with learning_rate η = {worst.learning_rate:g}; try η < {safe:.3g}, the "
            f"smallest stable step suggested for them (each run's metadata.json has its own)")


class SweepDiverged(RuntimeError):
    """``run_sweep(..., fail_on_divergence=True)``: runs diverged (every run is stored, the summary
    written); ``summary`` is the :class:`SweepSummary`."""

    def __init__(self, summary: SweepSummary):
        self.summary = summary
        super().__init__(summary.divergence_report())


def _table(data: dict, name: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table, got {value!r}")
    return value


def _flatten(data: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}} -> {"a.b": 1}`` (TOML's dotted keys inside ``[grid]`` arrive nested)."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _grids(data: dict) -> list[dict]:
    """The ``[grid]`` table, or each table of an array ``[[grid]]`` (their runs are united)."""
    raw = data.get("grid", {})
    tables = raw if isinstance(raw, list) else [raw]
    grids = []
    for i, table in enumerate(tables):
        where = f"grid[{i}]" if isinstance(raw, list) else "grid"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table of dotted keys -> lists, got {table!r}")
        grid = _flatten(table)
        for key, values in grid.items():
            _check_values(f"{where}.{key}", values)
        grids.append(grid)
    return grids


def _check_values(where: str, values) -> None:
    """A grid's values of one key: a non-empty list, each value once."""
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where} = {values!r}: expected a non-empty list of values")
    for i, value in enumerate(values):
        if value in values[:i]:
            raise ConfigError(f"{where} = {values!r}: the value {value!r} is listed more than once; "
                              f"expected each value once")


def _apply_overrides(overrides: dict, base: dict, grids: list[dict], where: str) -> None:
    """``[quick]`` or ``--set``: a key of a grid gets a new list (in every grid that has it), any other
    key a new base value."""
    for key, value in overrides.items():
        holders = [g for g in grids if key in g]
        if not holders:
            set_dotted(base, key, value, where)
            continue
        label = f"{where}.{key}" if where == "quick" else f"{where} {key}"
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{label} = {value!r}: {key} is a grid key; expected a non-empty list of values")
        _check_values(label, value)
        for grid in holders:
            grid[key] = value


def grid_size(grids: list[dict]) -> int:
    """Runs of the grids before duplicates are removed: the sum of the products of list lengths."""
    return sum(math.prod(len(values) for values in grid.values()) for grid in grids)


def sweep_from_dict(data: dict, *, quick: bool = False, source: str | None = None,
                    max_runs: int | None = MAX_RUNS, overrides: dict | None = None) -> Sweep:
    """Validate a sweep (as read from TOML) and expand its grid; raises :class:`ConfigError`.

    ``grid`` is a table (one Cartesian product) or an array of tables (the union of their
    products, e.g. one-at-a-time variations around the base config); a value listed twice for
    one key is refused. Runs with the same full configuration are kept once, in order of first
    appearance. ``quick=True`` applies the ``[quick]`` table (refused when there is none), then
    ``overrides`` (dotted keys, :func:`~linattn_theory.sim.config.parse_overrides`) apply by the
    same rule. A grid of more than ``max_runs`` runs is refused from the list lengths alone,
    before anything is expanded.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"sweep: expected a table, got {type(data).__name__}")
    base = {k: copy.deepcopy(v) for k, v in data.items() if k not in _SECTIONS}
    grids = _grids(data)
    figure = _table(data, "figure")
    if quick:
        if "quick" not in data:
            raise ConfigError(f"quick: {source or 'the sweep'} has no [quick] table, so --quick would run "
                              f"the full grid; add one (e.g. [quick] seed = [0]) or leave --quick out")
        _apply_overrides(_flatten(_table(data, "quick")), base, grids, "quick")
    _apply_overrides(dict(overrides or {}), base, grids, "--set")
    size = grid_size(grids)
    if max_runs is not None and size > max_runs:
        raise ConfigError(f"grid: {size} runs, above the limit of {max_runs} runs; split the grid "
                          f"or raise the limit with --max-runs")
    configs, points, seen = [], [], set()
    for grid in grids:
        for combo in itertools.product(*grid.values()):
            point = dict(zip(grid, combo))
            data_i = copy.deepcopy(base)
            for key, value in point.items():
                set_dotted(data_i, key, value, "grid")
            try:
                config = config_from_dict(data_i)
            except ConfigError as err:
                where = ", ".join(f"{k}={v!r}" for k, v in point.items())
                raise ConfigError(f"{err} (in the run {where})" if point else str(err)) from None
            key = config_hash(config)
            if key not in seen:
                seen.add(key)
                configs.append(config)
                points.append(point)
    grid_out = grids[0] if len(grids) == 1 else grids
    return Sweep(tuple(configs), tuple(points), grid_out, base, figure, source)


def load_sweep(path, *, quick: bool = False, max_runs: int | None = MAX_RUNS,
               overrides: dict | None = None) -> Sweep:
    """Read and validate a sweep TOML file (see the module docstring and :func:`sweep_from_dict`)."""
    return sweep_from_dict(read_toml(path, "sweep file"), quick=quick, source=str(path),
                           max_runs=max_runs, overrides=overrides)


def with_backend(sweep: Sweep, backend: str) -> Sweep:
    """``sweep`` with ``model.backend = backend`` in its base config (``--backend``).

    Runs on another backend are other runs (their numbers differ by rounding), so they get
    other run ids; a grid that varies ``model.backend`` itself is refused.
    """
    grids = sweep.grid if isinstance(sweep.grid, list) else [sweep.grid]
    if any("model.backend" in grid for grid in grids):
        raise ConfigError(f"backend = {backend!r}: the sweep's grid varies model.backend already")
    data = copy.deepcopy(sweep.base)
    set_dotted(data, "model.backend", backend, "backend")
    data["grid"] = copy.deepcopy(sweep.grid)
    if sweep.figure:
        data["figure"] = copy.deepcopy(sweep.figure)
    return sweep_from_dict(data, source=sweep.source, max_runs=None)


def run_dir(out, config_or_id) -> Path:
    """``DIR/runs/<config_hash>``: where a run of the sweep stored in ``out`` lives."""
    key = config_or_id if isinstance(config_or_id, str) else config_hash(config_or_id)
    return Path(out) / "runs" / key


def is_complete(out, config_or_id) -> bool:
    """A run is finished when its ``metadata.json`` (written last, atomically) exists and its
    files match the hashes recorded there (:func:`~linattn_theory.core.io.read_run`)."""
    return run_status(run_dir(out, config_or_id))[0] == "finished"


#: a task (one worker's share of a sweep, stored when it finishes) holds at most this many
#: instances: runs, or FedFrozen runs of one instance that differ only in ``T0`` (which share
#: their warm-up and count once)
TASK_INSTANCES = 16


def _shape_key(config: RunConfig) -> str:
    """Runs that can share an ensemble (:func:`linattn_theory.sim.ensemble.ensemble_key`, from the
    config alone): everything but the seed and the per-instance numbers."""
    data = config.to_dict()
    data.pop("seed", None)
    task = data.get("task", {})
    for key in ("zeta_value", "zeta_covariate", "zeta_mean", "zeta_task", "noise", "positional_strength"):
        task.pop(key, None)
    for key in ("learning_rate", "ridge", "warmup_rounds", "divergence_factor", "server_learning_rate",
                "prox_mu", "server_momentum", "server_beta1", "server_beta2", "server_epsilon"):
        data.get("federated", {}).pop(key, None)
    return json.dumps(data, sort_keys=True)


def _tasks(pending: list[tuple[str, RunConfig]]) -> list[list[tuple[str, dict]]]:
    """Group the pending runs into tasks, each run by one worker as ensembles (:func:`_compute`).

    FedFrozen runs that differ only in ``T0``, and the online rule's run of their instance, stay
    together (they share a warm-up, :func:`~linattn_theory.sim.config.warmup_family_key`); runs of one
    shape (:func:`_shape_key`) fill tasks of at most :data:`TASK_INSTANCES` instances, and at
    least one task per core is made where there are enough instances. The grouping changes how
    fast a sweep runs, never its numbers (an ensemble's results do not depend on its members).
    """
    families: dict[str, list] = {}
    for run_id, config in pending:
        families.setdefault(warmup_family_key(config) or run_id, []).append((run_id, config))
    shapes: dict[str, list] = {}
    for family in families.values():
        shapes.setdefault(_shape_key(family[0][1]), []).append(family)
    total = sum(len(group) for group in shapes.values())
    size = max(1, min(TASK_INSTANCES, math.ceil(total / (os.cpu_count() or 1))))
    tasks = []
    for group in shapes.values():
        for lo in range(0, len(group), size):
            tasks.append([(run_id, config.to_dict()) for family in group[lo:lo + size]
                          for run_id, config in family])
    return tasks


@timed_run
def _compute(task: list[tuple[str, dict]]) -> list:
    """Worker side: simulate one task (nothing is written here); returns ``[(run_id, RunResult)]``,
    each result's provenance recording when the task started and its wall time.

    The runs go through :func:`~linattn_theory.sim.ensemble.simulate_many`: runs of equal shapes
    as one array program, FedFrozen runs that differ only in ``T0`` sharing their warm-up; each
    result is bit-identical whatever the task holds (and equals ``simulate(config)`` to rounding).
    """
    from .ensemble import simulate_many
    configs = [config_from_dict(data) for _, data in task]
    with warnings.catch_warnings():                 # run_sweep said them once, before any run
        warnings.simplefilter("ignore", SettingWarning)
        results = simulate_many(configs)
    return [(run_id, result) for (run_id, _), result in zip(task, results)]


def _store(run_id: str, result, out: Path) -> bool:
    """Caller side: write one finished run; returns whether it diverged."""
    target = run_dir(out, run_id)
    for stale in target.glob(".*.tmp"):     # left by a writer killed mid-file
        stale.unlink(missing_ok=True)
    result.metadata["run_id"] = run_id
    write_run(result, target)
    return result.diverged


def check_executor(executor: str, workers: int | None, scheduler: str | None) -> None:
    """Refuse an unknown executor, a worker count below 1 or a scheduler for an executor other than
    ``dask`` (a ``ConfigError``); check that Dask imports when it is asked for."""
    if executor not in EXECUTORS:
        raise ConfigError(f"executor = {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers = {workers!r}: expected a positive integer")
    if scheduler is not None and executor != "dask":
        raise ConfigError(f"scheduler = {scheduler!r} applies only to executor 'dask'")
    if executor == "dask":
        _dask()
        if scheduler is not None:
            _check_scheduler(scheduler)


def _check_scheduler(address: str, timeout: float = 5.0) -> None:
    """Refuse a Dask scheduler address that does not accept a TCP connection (before any work)."""
    import socket
    from urllib.parse import urlsplit

    text = address if "://" in address else f"tcp://{address}"
    parts = urlsplit(text)
    if parts.scheme not in ("tcp", "tls"):
        return                                  # inproc://, ucx://: left to Dask
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise ConfigError(f"scheduler = {address!r}: expected an address such as tcp://host:8786")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise ConfigError(f"scheduler = {address!r}: no Dask scheduler reachable there "
                          f"({err.strerror or err}); start one with `dask scheduler` or leave "
                          f"--scheduler out for a local cluster") from None


def _dask():
    try:
        from dask import distributed
    except ImportError:
        raise ConfigError("executor 'dask' needs dask.distributed, an optional extra: "
                          "pip install 'linattn-theory[dask]'") from None
    return distributed


def _worker_init(parent_pid: int, threads: int) -> None:
    """Worker process start: leave Ctrl-C to the sweep's process (it stops the workers), limit
    BLAS threads to this worker's share of the cores, and exit as soon as the sweep's process
    is gone (killed by SIGKILL, say), so that no worker outlives its sweep."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import tqdm.auto
    import tqdm.std
    for cls in {tqdm.std.tqdm, tqdm.auto.tqdm}:     # a forked copy of a lock may be held: fresh ones
        cls.set_lock(tqdm.std.TqdmDefaultWriteLock())
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(threads)
    except ImportError:                                  # pragma: no cover - comes with joblib
        pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="linattn-parent-watch", daemon=True).start()


def _stop_pool(pool, processes: list) -> None:
    """Stop a process pool now: cancel what has not started and terminate the workers."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    for process in processes:
        process.join(timeout=5)


def _process_results(tasks: list, workers: int):
    """``executor="processes"``: a pool of forked workers that die with the sweep."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    workers = min(workers, len(tasks))
    threads = max(1, (os.cpu_count() or 1) // workers)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_worker_init, initargs=(os.getpid(), threads))
    finished = False
    try:
        pending = {pool.submit(_compute, task) for task in tasks}
        processes = list(pool._processes.values())
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:                                   # an error, Ctrl-C or SIGTERM: stop the workers now
            _stop_pool(pool, list(pool._processes.values() if pool._processes else processes))


#: prefix of a local Dask cluster's scratch folder (in the system's temporary folder)
_DASK_SCRATCH = "linattn-dask-"


def _dask_scratch() -> Path:
    """A fresh scratch folder for a local Dask cluster; removes those of sweeps that were killed."""
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{_DASK_SCRATCH}*"):
        try:
            pid = int(old.name[len(_DASK_SCRATCH):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, OSError):
            pass
    return Path(tempfile.mkdtemp(prefix=f"{_DASK_SCRATCH}{os.getpid()}-"))


def _remove_scratch(folder: Path, seconds: float = 5.0) -> None:
    """Remove a Dask scratch folder; workers still shutting down may recreate lock files in it
    for a moment, so remove until it stays gone for 0.3 s (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        shutil.rmtree(folder, ignore_errors=True)
        time.sleep(0.3)
        if not folder.exists() or time.monotonic() > deadline:
            return


def _dask_results(tasks: list, workers: int, scheduler: str | None):
    distributed = _dask()
    cluster = scratch = None
    if scheduler is None:
        scratch = _dask_scratch()
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None,
                                           local_directory=str(scratch), silence_logs=logging.ERROR)
    try:
        try:
            client = distributed.Client(cluster if cluster is not None else scheduler, timeout=10)
        except (OSError, TimeoutError) as err:
            raise ConfigError(f"scheduler = {scheduler!r}: cannot connect ({err})") from None
        try:
            futures = [client.submit(_compute, task, pure=False) for task in tasks]
            for future in distributed.as_completed(futures):
                yield future.result()
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
        if scratch is not None:
            _remove_scratch(scratch)


def _results(executor: str, tasks: list, workers: int | None, scheduler: str | None):
    """Yield ``[(run_id, RunResult)]`` for each task as it finishes (any order)."""
    if executor == "serial" or not tasks:
        yield from map(_compute, tasks)
        return
    workers = workers or os.cpu_count() or 1
    if executor == "processes":
        yield from _process_results(tasks, workers)
        return
    yield from _dask_results(tasks, workers, scheduler)


def _manifest(sweep: Sweep, out: Path, existing: str) -> dict:
    """The ``sweep.json`` to write: this sweep's, or (``existing="add"``) the union with the
    sweep already in ``out``. A folder holding a sweep with other runs is refused by default."""
    manifest = {"source": sweep.source, "grid": sweep.grid, "base": sweep.base,
                "figure": sweep.figure, "runs": sweep.run_ids,
                "points": [dict(p) for p in sweep.points]}
    path = out / MANIFEST
    if existing == "replace" or not path.is_file():
        return manifest
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_runs, old_points = list(old["runs"]), list(old.get("points") or [{} for _ in old["runs"]])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"out = {str(out)!r}: {MANIFEST} there is not a sweep manifest; "
                          f"choose another folder") from None
    if set(old_runs) == set(manifest["runs"]):
        return manifest
    if existing == "refuse":
        finished = sum(is_complete(out, r) for r in old_runs)
        raise ConfigError(f"out = {str(out)!r} holds another sweep ({old.get('source')}: "
                          f"{len(old_runs)} runs, {finished} finished) with a different grid; "
                          f"choose another --out, or pass --add to add this sweep's runs to it")
    seen = set(old_runs)
    runs, points = old_runs, old_points
    for run_id, point in zip(manifest["runs"], manifest["points"]):
        if run_id not in seen:
            seen.add(run_id)
            runs.append(run_id)
            points.append(point)
    grids = old["grid"] if isinstance(old.get("grid"), list) else [old.get("grid")]
    new = sweep.grid if isinstance(sweep.grid, list) else [sweep.grid]
    return {**manifest, "source": old.get("source"), "grid": grids + new, "runs": runs, "points": points,
            "added": list(old.get("added", [])) + [sweep.source]}


def _lock_holder(path: Path) -> str:
    """Who holds a sweep folder's lock, as its lock file records it."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return (f"pid {info['pid']} on {info['host']}, since {info['started']}: "
                f"{info['command']}")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def sweep_lock(out, *, wait: bool = False):
    """Hold the writer's lock of the sweep folder ``out`` (created if missing) while the block runs.

    An exclusive ``flock`` on ``out/.sweep.lock``, which records the holder (pid, host, start,
    command); the system releases it when the holder ends, however it ends, and the file is
    removed when the block ends (also on an error or Ctrl-C; a process killed by SIGKILL leaves
    it behind, unlocked, for the next sweep to take). When another process holds it:
    ``wait=False`` raises :class:`ConfigError` naming the holder, ``wait=True`` says on stderr that
    it waits, and waits. Where ``fcntl`` is missing (Windows) nothing is locked.
    """
    import socket
    import sys
    from datetime import datetime, timezone

    try:
        import fcntl
    except ImportError:                                   # pragma: no cover - not POSIX
        yield
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                os.close(fd)
                raise ConfigError(f"out = {str(out)!r}: another sweep is writing to it ({holder}); "
                                  f"refusing to write at the same time: wait for it to end, or pass "
                                  f"--wait to start when it does") from None
            if not waited:
                print(f"waiting for the sweep writing to {out} to end ({holder})", file=sys.stderr, flush=True)
                waited = True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:                       # Ctrl-C while waiting
                os.close(fd)
                raise
        if _is_file_at(fd, path):
            break
        os.close(fd)                 # the holder removed the file it locked when it ended: lock the new one
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "command": " ".join(sys.argv) or "python"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)                     # removed while held: a finished folder has none
        os.close(fd)                                     # releases the lock


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


#: integer columns of a run's table; every other numeric column is a float64 measurement
_INTEGER_COLUMNS = ("round", "participants")
SUMMARY_COLUMNS = ("run_id", "T0", "rounds_completed", "final_loss", "final_loss_regularized",
                   "cumulative_kernel_drift", "diverged", "divergence_round")


def read_table(data: bytes):
    """A run's ``rounds.csv`` (its bytes) with its dtypes restored (a column of zeros reads back as integers)."""
    import io

    import pandas as pd

    table = pd.read_csv(io.BytesIO(data))
    cast = {c: "float64" for c in table.select_dtypes(include="number").columns
            if c not in _INTEGER_COLUMNS and table[c].dtype != "float64"}
    return table.astype(cast) if cast else table      # astype of every column costs more than the read


def _run_dirs(out: Path) -> list[Path]:
    """Run folders of a sweep folder, in the sweep's grid order (or a single run folder)."""
    sweep = (out / MANIFEST).is_file() or (out / "runs").is_dir()
    if (out / "metadata.json").is_file():
        if sweep:
            raise RunIntegrityError(out, f"it holds a single run (metadata.json) and a sweep ({MANIFEST}, "
                                         f"runs/); move the single run's files elsewhere")
        return [out]
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            ids = json.loads(manifest.read_text(encoding="utf-8"))["runs"]
        except (ValueError, KeyError, TypeError):
            raise RunIntegrityError(out, f"{MANIFEST} is not a sweep manifest") from None
        return [out / "runs" / i for i in ids]
    return sorted((out / "runs").glob("*")) if (out / "runs").is_dir() else []


def finished_runs(out) -> list[tuple[Path, dict, dict]]:
    """``(folder, metadata, {file: bytes})`` of every finished run under ``out`` (a sweep or run
    folder), unfinished ones left out; raises :class:`~linattn_theory.core.errors.RunIntegrityError`
    naming the first broken run (and how many there are)."""
    finished, broken = [], []
    for path in _run_dirs(Path(out)):
        if not (path / "metadata.json").is_file():
            continue
        try:
            finished.append((path, *read_run(path)))
        except RunIntegrityError as err:
            broken.append(err)
    if broken:
        more = f" ({len(broken) - 1} more broken runs)" if len(broken) > 1 else ""
        raise RunIntegrityError(broken[0].folder, f"{broken[0].reason}{more}; rerun the sweep to "
                                                  f"recompute it, or delete the folder")
    return finished


def summary_row(metadata: dict, table, run_id: str) -> dict:
    """One row of :func:`summary_table`: the run's last round and its flattened configuration."""
    last = table.iloc[-1]
    div = metadata.get("divergence") or {}
    row = {"run_id": run_id,
           "T0": int(metadata["warmup_rounds"]),
           "rounds_completed": int(last["round"]),
           "final_loss": float(last["loss"]),
           "final_loss_regularized": float(last["loss_regularized"]),
           "cumulative_kernel_drift": float(last["cumulative_kernel_drift"]),
           "diverged": bool(metadata.get("diverged", False)),
           "divergence_round": int(div["round"]) if div else -1}
    row.update(_flatten(metadata["config"]))
    return row


def summary_table(out, *, rounds: bool = False):
    """The finished runs under ``out`` as a DataFrame (see :func:`linattn_theory.report.results.load_results`)."""
    import pandas as pd

    summaries, tables = [], []
    for path, metadata, files in finished_runs(out):
        table = read_table(files["rounds.csv"])
        run_id = metadata.get("run_id", path.name)
        summaries.append(summary_row(metadata, table, run_id))
        if rounds:
            tables.append(table.assign(run_id=run_id))
    summary = pd.DataFrame(summaries, columns=None if summaries else list(SUMMARY_COLUMNS))
    if not rounds:
        return summary
    if not tables:
        return pd.DataFrame(columns=["run_id", "round"])
    long = pd.concat(tables, ignore_index=True)
    extra = [c for c in summary.columns if c not in long.columns or c == "run_id"]
    return summary[extra].merge(long, on="run_id", how="right", validate="one_to_many")


def _write_summary(out: Path):
    """``out/summary.csv``: :func:`summary_table` of the sweep folder, written atomically; returns the table."""
    table = summary_table(out)
    atomic_write_bytes(out / SUMMARY, table.to_csv(index=False).encode())
    return table


def _divergences(out: Path, sweep: Sweep, table) -> tuple[DivergedRun, ...]:
    """The diverged runs of ``sweep`` (computed now or before), in grid order, from the summary
    ``table`` and each diverged run's ``metadata.json``."""
    if not len(table):
        return ()
    diverged = set(table.loc[table["diverged"].astype(bool), "run_id"])
    found = []
    for run_id, point in zip(sweep.run_ids, sweep.points):
        if run_id in diverged:
            meta = json.loads((run_dir(out, run_id) / "metadata.json").read_text(encoding="utf-8"))
            div, config = meta["divergence"], meta["config"]
            found.append(DivergedRun(run_id, dict(point), int(config.get("seed", 0)),
                                     float(config["federated"]["learning_rate"]), int(div["round"]),
                                     float(div["loss"]), float(div["stable_learning_rate"])))
    return tuple(found)


def run_sweep(sweep: Sweep, out, *, executor: str = "serial", workers: int | None = None,
              scheduler: str | None = None, progress: bool = False,
              existing: str = "refuse", wait: bool = False,
              fail_on_divergence: bool = False) -> SweepSummary:
    """Run every unfinished run of ``sweep`` and store it under ``out`` (see the module docstring).

    ``executor``: ``"serial"`` (in-process), ``"processes"`` (``workers`` forked processes,
    default one per core, each exiting as soon as the calling process is gone) or ``"dask"``
    (``scheduler`` address, checked first, or a local cluster of ``workers`` processes bound to
    127.0.0.1 whose scratch folder is removed afterwards). Holds the folder's lock
    (:func:`sweep_lock`; ``wait``: wait for another sweep writing there instead of refusing),
    writes ``out/sweep.json`` (the grid and its run ids) first, recomputes runs whose files do not
    match their hashes, and writes ``out/summary.csv`` when every run is stored (an earlier one is
    removed at the start). ``existing``: when ``out`` holds a sweep with other runs,
    ``"refuse"`` (a :class:`ConfigError`), ``"add"`` this sweep's runs to it, or ``"replace"``
    its manifest (runs stay on disk under their hashes). A folder holding a single run
    (``metadata.json``) is refused.

    ``SweepSummary.divergences`` lists the sweep's diverged runs (computed now or before;
    :meth:`SweepSummary.divergence_report` says it in one line); ``fail_on_divergence=True``
    raises :class:`SweepDiverged` when there are any, after every run is stored and the summary written.
    """
    from tqdm.auto import tqdm

    from .limits import check_output_folder, setting_notes, warn_settings

    check_executor(executor, workers, scheduler)
    warn_settings((note for config in sweep.configs for note in setting_notes(config)), stacklevel=4)
    if existing not in EXISTING:
        raise ConfigError(f"existing = {existing!r}: expected one of {', '.join(EXISTING)}")
    out = check_output_folder(out, "out =")
    if (out / "metadata.json").is_file():
        raise ConfigError(f"out = {str(out)!r} holds a single run (metadata.json); choose another folder "
                          f"for the sweep")
    start = time.perf_counter()
    ids = sweep.run_ids
    with sweep_lock(out, wait=wait):
        write_json(out / MANIFEST, _manifest(sweep, out, existing))
        (out / SUMMARY).unlink(missing_ok=True)
        status = {run_id: run_status(run_dir(out, run_id))[0] for run_id in ids}
        pending = [(run_id, c) for run_id, c in zip(ids, sweep.configs) if status[run_id] != "finished"]
        broken = sum(state == "broken" for state in status.values())
        skipped = len(ids) - len(pending)
        diverged = 0
        with tqdm(total=len(ids), initial=skipped, disable=not progress, desc="runs", unit="run") as bar:
            for finished in _results(executor, _tasks(pending), workers, scheduler):
                for run_id, result in finished:
                    diverged += _store(run_id, result, out)
                    bar.update()
        table = _write_summary(out)
        divergences = _divergences(out, sweep, table)
    summary = SweepSummary(len(ids), skipped, len(pending), diverged, time.perf_counter() - start, out, broken,
                           table, divergences)
    if fail_on_divergence and divergences:
        raise SweepDiverged(summary)
    return summary
