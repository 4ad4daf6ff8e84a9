"""Where a sweep's runs are computed: in this process, in local worker processes, or on Dask.

The pending runs are grouped into tasks (:func:`plan_tasks`: runs that share a warm-up or an
ensemble shape stay together), each computed by one worker as ensembles (:func:`compute_task`), and
:func:`run_tasks` yields each task's results as it finishes. Workers only compute (the caller
stores every run, :mod:`.store`), exit as soon as the calling process is gone and are stopped on
an error, Ctrl-C or SIGTERM; a local Dask cluster's scratch folder is removed afterwards.
"""

from __future__ import annotations

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
from pathlib import Path

from ...core.errors import ConfigError, SettingWarning
from ...core.io import timed_run
from ..config import RunConfig, config_from_dict, warmup_family_key

__all__ = ["EXECUTORS", "TASK_INSTANCES", "PARENT_CHECK_SECONDS", "check_executor", "plan_tasks", "compute_task",
           "in_processes", "process_map",
           "run_tasks"]


EXECUTORS = ("serial", "processes", "dask")

#: how often a worker checks that the sweep's process is still alive (seconds)
PARENT_CHECK_SECONDS = 0.2

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


def plan_tasks(pending: list[tuple[str, RunConfig]]) -> list[list[tuple[str, dict]]]:
    """Group the pending runs into tasks, each run by one worker as ensembles (:func:`compute_task`).

    FedFrozen runs that differ only in ``T0``, and the online rule's run of their instance, stay
    together (they share a warm-up, :func:`~linattn_theory.sim.config.warmup_family_key`); runs of one
    shape (:func:`_shape_key`) fill tasks of at most :data:`TASK_INSTANCES` instances, and at
    least one task per core is made where there are enough instances. The grouping changes how
    fast a sweep runs, never its numbers (an ensemble's results do not depend on its members).

    Parameters
    ----------
    pending : list of (str, RunConfig)
        The runs to compute, with their ids.

    Returns
    -------
    list of list of (str, dict)
        The tasks: each a list of ``(run id, config as a dict)``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import config_hash
    >>> from linattn_theory.sim.sweep.executors import compute_task, plan_tasks
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> pending = [(config_hash(c), c) for c in (config, config.with_updates({"seed": 1}))]
    >>> tasks = plan_tasks(pending)
    >>> sorted(run_id for task in tasks for run_id, _ in task) == sorted(run_id for run_id, _ in pending)
    True
    >>> [(run_id == pending[0][0], result.diverged) for run_id, result in compute_task(tasks[0])]
    [(True, False)]
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
def compute_task(task: list[tuple[str, dict]]) -> list:
    """Worker side: simulate one task (nothing is written here); returns ``[(run_id, RunResult)]``,
    each result's provenance recording when the task started and its wall time.

    The runs go through :func:`~linattn_theory.sim.ensemble.simulate_many`: runs of equal shapes
    as one array program, FedFrozen runs that differ only in ``T0`` sharing their warm-up; each
    result is bit-identical whatever the task holds (and equals ``simulate(config)`` to rounding).

    Parameters
    ----------
    task : list of (str, dict)
        ``(run id, config as a dict)`` pairs, as :func:`plan_tasks` makes them.

    Returns
    -------
    list of (str, RunResult)
        The results, in the task's order.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.executors import compute_task
    >>> config = lt.config_from_dict({"federated": {"rounds": 3, "warmup_rounds": 1}})
    >>> task = [("a", config.to_dict()), ("b", config.with_updates({"seed": 1}).to_dict())]
    >>> results = compute_task(task)
    >>> [run_id for run_id, _ in results], len(results[1][1].table)
    (['a', 'b'], 4)
    >>> alone = lt.simulate(config.with_updates({"seed": 1})).table["loss"]
    >>> bool(np.allclose(results[1][1].table["loss"], alone, rtol=1e-9))     # simulate's run, to rounding
    True

    :func:`plan_tasks` makes the tasks.
    """
    from ..ensemble import simulate_many
    configs = [config_from_dict(data) for _, data in task]
    with warnings.catch_warnings():                 # run_sweep said them once, before any run
        warnings.simplefilter("ignore", SettingWarning)
        results = simulate_many(configs)
    return [(run_id, result) for (run_id, _), result in zip(task, results)]


def check_executor(executor: str, workers: int | None, scheduler: str | None) -> None:
    """Refuse an unknown executor, a worker count below 1 or a scheduler for an executor other than
    ``dask`` (a ``ConfigError``); check that Dask imports when it is asked for.

    Parameters
    ----------
    executor : {"serial", "processes", "dask"}
        The executor.
    workers : int, optional
        The number of workers.
    scheduler : str, optional
        A Dask scheduler's address (``dask`` only).

    Returns
    -------
    None
        Raises :class:`~linattn_theory.core.errors.ConfigError` on a bad choice.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.executors import check_executor
    >>> check_executor("processes", 2, None)
    >>> check_executor("threads", None, None)
    Traceback (most recent call last):
    ...
    linattn_theory.core.errors.ConfigError: executor = 'threads': expected one of serial, processes, dask
    """
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
    BLAS and fused-engine threads to this worker's share of the cores, and exit as soon as the sweep's process
    is gone (killed by SIGKILL, say), so that no worker outlives its sweep."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import tqdm.auto
    import tqdm.std
    for cls in {tqdm.std.tqdm, tqdm.auto.tqdm}:     # a forked copy of a lock may be held: fresh ones
        cls.set_lock(tqdm.std.TqdmDefaultWriteLock())
    from threadpoolctl import threadpool_limits

    from ...core.fused import set_threads
    threadpool_limits(threads)
    set_threads(threads)                                 # the fused engine's threads, too

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


def _worker_pool(workers: int):
    """A pool of ``workers`` worker processes, forked where the platform can (spawned elsewhere), each
    started by :func:`_worker_init` with its share of the cores; they die with the process that made them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    threads = max(1, (os.cpu_count() or 1) // workers)
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_worker_init, initargs=(os.getpid(), threads))


def _process_results(tasks: list, workers: int):
    """``executor="processes"``: a pool of forked workers that die with the sweep."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pool = _worker_pool(min(workers, len(tasks)))
    processes = []                              # the workers, once started (a Ctrl-C may come before)
    try:
        pending = {pool.submit(compute_task, task) for task in tasks}
        processes = list(pool._processes.values())
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
    except BaseException:                       # an error, Ctrl-C or SIGTERM: stop the workers now
        _stop_pool(pool, list(pool._processes.values() if pool._processes else processes))
        raise
    pool.shutdown(wait=True)


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
            futures = [client.submit(compute_task, task, pure=False) for task in tasks]
            for future in distributed.as_completed(futures):
                yield future.result()
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
        if scratch is not None:
            _remove_scratch(scratch)


def run_tasks(executor: str, tasks: list, workers: int | None, scheduler: str | None):
    """Yield ``[(run_id, RunResult)]`` for each task as it finishes (any order).

    Parameters
    ----------
    executor : {"serial", "processes", "dask"}
        Where the tasks run.
    tasks : list
        The tasks (:func:`plan_tasks`).
    workers : int, optional
        The number of workers (default: the machine's cores).
    scheduler : str, optional
        A Dask scheduler's address.

    Yields
    ------
    list of (str, RunResult)
        One task's results (:func:`compute_task`).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import config_hash
    >>> from linattn_theory.sim.sweep.executors import plan_tasks, run_tasks
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> tasks = plan_tasks([(config_hash(config), config)])
    >>> [[result.diverged for _, result in done] for done in run_tasks("serial", tasks, None, None)]
    [[False]]
    """
    if executor == "serial" or not tasks:
        yield from map(compute_task, tasks)
        return
    workers = workers or os.cpu_count() or 1
    if executor == "processes":
        yield from _process_results(tasks, workers)
        return
    yield from _dask_results(tasks, workers, scheduler)


def in_processes(task, items: list, workers: int = 1, progress: bool = False, desc: str = "") -> list:
    """``task(chunk)`` over round-robin chunks of ``items``, one result per item in ``items``' order:
    ``4·workers`` chunks on ``workers`` processes (:func:`process_map`; one process: one chunk, here). ``task``
    returns one result per item of its chunk; a result must not depend on what else is in the chunk
    (an instance's run is bit-identical whatever shares its ensemble), so any split gives the same.

    Parameters
    ----------
    task : callable
        ``list -> list``, module level (it is pickled).
    items : list
        The work.
    workers : int, default 1
        Processes.
    progress : bool, default False
        A progress bar over the chunks.
    desc : str, default ""
        Its label.

    Returns
    -------
    list
        ``task``'s results, in ``items``' order.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.executors import in_processes
    >>> in_processes(lambda chunk: [x * x for x in chunk], [1, 2, 3])
    [1, 4, 9]
    """
    count = 4 * workers if workers > 1 else 1
    chunks = [list(range(len(items)))[k::count] for k in range(count)]
    chunks = [c for c in chunks if c]
    parts = process_map(task, [([items[i] for i in c],) for c in chunks], workers, progress=progress, desc=desc)
    out = [None] * len(items)
    for chunk, part in zip(chunks, parts):
        for i, result in zip(chunk, part):
            out[i] = result
    return out


def process_map(function, calls: list, workers: int | None = 1, progress: bool = False, desc: str = "") -> list:
    """``[function(*args) for args in calls]``, the calls shared among ``workers`` worker processes
    (:func:`_worker_pool`: forked, so they start at once with what this process has imported and compiled;
    each with its share of the cores); in this process when ``workers`` is ``None`` or 1, or for one call.
    A worker's error stops the others and is raised here.

    Parameters
    ----------
    function : callable
        Module level (it is pickled).
    calls : list of tuple
        The arguments of each call.
    workers : int, optional
        Processes (default: this one).
    progress : bool, default False
        A progress bar over the calls (shown with two or more).
    desc : str, default ""
        Its label.

    Returns
    -------
    list
        The results, in ``calls``' order.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.executors import process_map
    >>> process_map(pow, [(2, 3), (3, 2)])
    [8, 9]
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(calls), desc=desc, disable=not progress or len(calls) < 2)
    if workers is None or workers <= 1 or len(calls) <= 1:
        out = []
        for args in calls:
            out.append(function(*args))
            bar.update(1)
        bar.close()
        return out
    pool = _worker_pool(min(int(workers), len(calls)))
    processes = []                              # the workers, once started (a Ctrl-C may come before)
    try:
        futures = [pool.submit(function, *args) for args in calls]
        processes = list(pool._processes.values())
        out = []
        for future in futures:
            out.append(future.result())
            bar.update(1)
    except BaseException:                       # an error, Ctrl-C or SIGTERM: stop the workers now
        _stop_pool(pool, list(pool._processes.values() if pool._processes else processes))
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)
    return out
