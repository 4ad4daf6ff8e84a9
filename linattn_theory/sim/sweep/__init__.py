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

The package holds one concept per module: :mod:`.grid` (the sweep file expanded into runs),
:mod:`.executors` (where the runs are computed) and :mod:`.store` (the sweep folder on disk);
:func:`run_sweep` ties them together. Every name ``linattn_theory.sim.sweep`` exported before the
split (one module, ``sim/sweep.py``) is still importable from it (``Sweep``, ``load_sweep``,
``run_dir``, ``read_table``, ``sweep_lock``, ``EXECUTORS``, …).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import ConfigError
from ...core.io import run_status, write_json
# run_sweep's parts, and (noqa: F401) the names sim.sweep exported before the split
from .executors import EXECUTORS, check_executor, plan_tasks, run_tasks
from .grid import MAX_RUNS, Sweep, grid_size, load_sweep, sweep_from_dict, with_backend
from .store import (EXISTING, MANIFEST, SUMMARY, SUMMARY_COLUMNS, DivergedRun, divergence_report, finished_runs,
                    is_complete, read_table, run_dir, store_run, stored_divergences, summary_row, summary_table,
                    sweep_lock, sweep_manifest, write_summary)

#: its own names; those of the submodules it imports above stay importable from here (each
#: documented once, on its module's page)
__all__ = ["run_sweep", "SweepSummary", "SweepDiverged"]


@dataclass(frozen=True)
class SweepSummary:
    """What :func:`run_sweep` did: runs in the sweep, already finished before, computed now
    (``broken`` of them recomputed because their files did not match their hashes), diverged
    of those computed now; ``table``: the summary table it wrote (:func:`summary_table` of
    ``out``); ``divergences``: every diverged run of the sweep (:class:`DivergedRun`, grid order).

    Parameters
    ----------
    total, skipped, computed, diverged : int
        Runs in the sweep, already finished, computed now, diverged.
    seconds : float
        Wall time.
    out : pathlib.Path
        The sweep folder.
    broken : int, default 0
        Runs recomputed because their files did not match their hashes.
    table : pandas.DataFrame, optional
        The summary table written.
    divergences : tuple of DivergedRun, default ()
        Every diverged run of the sweep, in grid order.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2},
    ...                          "grid": {"federated.learning_rate": [0.05, 50.0]}})
    >>> summary = lt.run_sweep(sweep, pathlib.Path(tempfile.mkdtemp()) / "out")
    >>> summary.total, summary.computed, summary.diverged, summary.divergences[0].learning_rate
    (2, 2, 1, 50.0)
    >>> print(summary.divergence_report())
    1 of 2 runs diverged; the earliest: run ... with learning_rate η = 50; try η < ...
"""

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


class SweepDiverged(RuntimeError):
    """``run_sweep(..., fail_on_divergence=True)``: runs diverged (every run is stored, the summary
    written); ``summary`` is the :class:`SweepSummary`.

    Parameters
    ----------
    summary : SweepSummary
        What the sweep did; the message is its :meth:`~SweepSummary.divergence_report`.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep import SweepDiverged
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2},
    ...                          "grid": {"federated.learning_rate": [0.05, 50.0]}})
    >>> try:
    ...     lt.run_sweep(sweep, pathlib.Path(tempfile.mkdtemp()) / "out", fail_on_divergence=True)
    ... except SweepDiverged as err:
    ...     print(err.summary.total, err.summary.diverged)
    2 1
    """

    def __init__(self, summary: SweepSummary):
        self.summary = summary
        super().__init__(summary.divergence_report())


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

    Parameters
    ----------
    sweep : Sweep
        The runs (:func:`load_sweep`, :func:`sweep_from_dict`).
    out : str or path-like
        The sweep folder; run ``i`` is stored in ``out/runs/<config_hash>/``.
    executor : {"serial", "processes", "dask"}, default "serial"
        In-process, ``workers`` forked processes (each exiting as soon as the calling process is
        gone), or Dask (``scheduler``, or a local cluster of ``workers`` processes bound to
        127.0.0.1 whose scratch folder is removed afterwards).
    workers : int, optional
        Worker processes of ``"processes"`` or a local Dask cluster; default one per core.
    scheduler : str, optional
        Address of a running Dask scheduler (``"dask"``; checked first).
    progress : bool, default False
        Show a progress bar over the runs.
    existing : {"refuse", "add", "replace"}, default "refuse"
        When ``out`` holds a sweep with other runs: refuse (a :class:`ConfigError`), add this
        sweep's runs to it, or replace its manifest (runs stay on disk under their hashes).
    wait : bool, default False
        Wait for another sweep writing to ``out`` instead of refusing.
    fail_on_divergence : bool, default False
        Raise :class:`SweepDiverged` when any run of the sweep diverged (after every run is stored
        and the summary written; ``linattn sweep --fail-on-divergence`` exits 3).

    Returns
    -------
    SweepSummary
        How many runs the sweep has, were finished before, were computed now (``broken`` of them
        recomputed) and diverged, the seconds taken, and the summary table written.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.toml").write_text('[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 4]\\n')
    >>> sweep = lt.load_sweep(folder / "sweep.toml")
    >>> summary = lt.run_sweep(sweep, folder / "out")
    >>> summary.total, summary.computed, summary.diverged
    (2, 2, 0)
    >>> lt.run_sweep(sweep, folder / "out").skipped       # finished runs are not run again
    2
"""
    from tqdm.auto import tqdm

    from ..limits import check_output_folder, setting_notes, warn_settings

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
        write_json(out / MANIFEST, sweep_manifest(sweep, out, existing))
        (out / SUMMARY).unlink(missing_ok=True)
        status = {run_id: run_status(run_dir(out, run_id))[0] for run_id in ids}
        pending = [(run_id, c) for run_id, c in zip(ids, sweep.configs) if status[run_id] != "finished"]
        broken = sum(state == "broken" for state in status.values())
        skipped = len(ids) - len(pending)
        diverged = 0
        with tqdm(total=len(ids), initial=skipped, disable=not progress, desc="runs", unit="run") as bar:
            for finished in run_tasks(executor, plan_tasks(pending), workers, scheduler):
                for run_id, result in finished:
                    diverged += store_run(run_id, result, out)
                    bar.update()
        table = write_summary(out)
        divergences = stored_divergences(out, sweep, table)
    summary = SweepSummary(len(ids), skipped, len(pending), diverged, time.perf_counter() - start, out, broken,
                           table, divergences)
    if fail_on_divergence and divergences:
        raise SweepDiverged(summary)
    return summary
