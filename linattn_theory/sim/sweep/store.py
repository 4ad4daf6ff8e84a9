"""A sweep folder on disk: each run under ``runs/<config hash>/``, the manifest, the writer's
lock, the summary table and the divergences read back from the stored runs.

A finished run is one whose ``metadata.json`` exists and whose files match the hashes it
records (:func:`linattn_theory.core.io.write_run`); one sweep writes to a folder at a time
(:func:`sweep_lock`); :func:`summary_table` is one row per finished run.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import ConfigError, RunIntegrityError
from ...core.io import atomic_write_bytes, read_csv_exact, read_run, run_status, write_run
from ..config import config_hash
from .grid import Sweep, flatten

__all__ = ["MANIFEST", "SUMMARY", "LOCK", "EXISTING", "SUMMARY_COLUMNS", "run_dir", "is_complete", "store_run",
           "sweep_manifest", "sweep_lock", "read_table", "FINAL_COLUMNS", "final_round", "finished_runs", "summary_row",
           "summary_table", "write_summary", "DivergedRun", "worst_divergence", "divergence_report", "stored_divergences"]


MANIFEST = "sweep.json"

#: one row per finished run, written when a sweep ends (:func:`summary_table`)
SUMMARY = "summary.csv"

#: the writer's lock of a sweep folder (:func:`sweep_lock`)
LOCK = ".sweep.lock"

#: how a sweep treats a folder that holds another sweep (``sweep.json`` with other runs)
EXISTING = ("refuse", "add", "replace")


@dataclass(frozen=True)
class DivergedRun:
    """A diverged run of a sweep (from its ``metadata.json``): its id and grid point, its seed and
    step ``η``, the round and ``F_λ`` at which it stopped, and the stable step its report suggests.

    Parameters
    ----------
    run_id : str
        The run's id (its config hash).
    point : dict
        Its grid point (dotted keys).
    seed : int
        Its seed.
    learning_rate : float
        Its step ``η``.
    round : int
        The round at which it stopped.
    loss : float
        ``F_λ`` there.
    stable_learning_rate : float
        The stable step its divergence report suggests.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.store import DivergedRun
    >>> run = DivergedRun("ab12", {"federated.learning_rate": 50.0}, seed=0, learning_rate=50.0, round=3,
    ...                   loss=1e9, stable_learning_rate=0.4)
    >>> run.point["federated.learning_rate"] == run.learning_rate, run.learning_rate > run.stable_learning_rate
    (True, True)

    :func:`stored_divergences` reads them from a sweep, :func:`divergence_report` says them.
    """

    run_id: str
    point: dict
    seed: int
    learning_rate: float
    round: int
    loss: float
    stable_learning_rate: float


def worst_divergence(divergences) -> DivergedRun:
    """The earliest divergence (ties: the run furthest above its suggested stable step).

    Parameters
    ----------
    divergences : iterable of DivergedRun
        The diverged runs (at least one).

    Returns
    -------
    DivergedRun
        The earliest.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.store import DivergedRun, worst_divergence
    >>> late = DivergedRun("b", {}, 0, 1.0, 7, 1e9, 0.3)
    >>> early = DivergedRun("a", {}, 1, 5.0, 2, 1e9, 0.21)
    >>> worst_divergence([late, early]).run_id
    'a'
    """
    return min(divergences, key=lambda d: (d.round, d.stable_learning_rate / d.learning_rate))


def divergence_report(divergences, total: int) -> str:
    """``"3 of 12 runs diverged; the earliest: run <id> (seed=1, ...) at round 2 with η = 5; try
    η < 0.21, the smallest stable step suggested for them (each run's metadata.json has its own)"``.

    Parameters
    ----------
    divergences : sequence of DivergedRun
        The diverged runs.
    total : int
        The sweep's number of runs.

    Returns
    -------
    str
        The report; ``""`` when nothing diverged.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.store import DivergedRun, divergence_report
    >>> runs = [DivergedRun("a", {"federated.learning_rate": 5.0}, 1, 5.0, 2, 1e9, 0.21),
    ...         DivergedRun("b", {"federated.learning_rate": 1.0}, 0, 1.0, 7, 1e9, 0.3)]
    >>> print(divergence_report(runs, 12))
    2 of 12 runs diverged; the earliest: run a (seed=1, federated.learning_rate=5.0) at round 2 with learning_rate η = 5; try η < 0.21, ...
    >>> divergence_report([], 12)
    ''
    """
    if not divergences:
        return ""
    worst = worst_divergence(divergences)
    point = {"seed": worst.seed, **worst.point}
    where = ", ".join(f"{k}={v}" for k, v in point.items())
    safe = min(d.stable_learning_rate for d in divergences)
    return (f"{len(divergences)} of {total} runs diverged; the earliest: run {worst.run_id} ({where}) at "
            f"round {worst.round} with learning_rate η = {worst.learning_rate:g}; try η < {safe:.3g}, the "
            f"smallest stable step suggested for them (each run's metadata.json has its own)")


def run_dir(out, config_or_id) -> Path:
    """``DIR/runs/<config_hash>``: where a run of the sweep stored in ``out`` lives.

    Parameters
    ----------
    out : str or Path
        The sweep folder ``DIR``.
    config_or_id : RunConfig or str
        The run, or its id (:func:`~linattn_theory.sim.config.config_hash`).

    Returns
    -------
    Path
        The run's folder (which need not exist).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import config_hash
    >>> from linattn_theory.sim.sweep.store import run_dir
    >>> config = lt.config_from_dict({"seed": 1})
    >>> run_dir("out", config) == run_dir("out", config_hash(config))
    True
    >>> run_dir("out", "0123abcd").as_posix()
    'out/runs/0123abcd'
    """
    key = config_or_id if isinstance(config_or_id, str) else config_hash(config_or_id)
    return Path(out) / "runs" / key


def is_complete(out, config_or_id) -> bool:
    """A run is finished when its ``metadata.json`` (written last, atomically) exists and its
    files match the hashes recorded there (:func:`~linattn_theory.core.io.read_run`).

    Parameters
    ----------
    out : str or Path
        The sweep folder.
    config_or_id : RunConfig or str
        The run, or its id.

    Returns
    -------
    bool
        Whether the run is finished and intact.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4}, "grid": {"federated.warmup_rounds": [0, 4]}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import is_complete
    >>> is_complete(out, sweep.configs[0])
    False
    >>> _ = lt.run_sweep(sweep, out)
    >>> is_complete(out, sweep.configs[0])
    True
    """
    return run_status(run_dir(out, config_or_id))[0] == "finished"


def store_run(run_id: str, result, out: Path) -> bool:
    """Caller side: write one finished run; returns whether it diverged.

    Parameters
    ----------
    run_id : str
        The run's id; its folder is :func:`run_dir` ``(out, run_id)``.
    result : RunResult
        The finished run (its metadata gets ``run_id``).
    out : Path
        The sweep folder.

    Returns
    -------
    bool
        Whether the run diverged.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import config_hash
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import is_complete, store_run
    >>> store_run(config_hash(config), lt.simulate(config), out), is_complete(out, config)   # (diverged, finished)
    (False, True)
    """
    target = run_dir(out, run_id)
    for stale in target.glob(".*.tmp"):     # left by a writer killed mid-file
        stale.unlink(missing_ok=True)
    result.metadata["run_id"] = run_id
    write_run(result, target)
    return result.diverged


def sweep_manifest(sweep: Sweep, out: Path, existing: str) -> dict:
    """The ``sweep.json`` to write: this sweep's, or (``existing="add"``) the union with the
    sweep already in ``out``. A folder holding a sweep with other runs is refused by default.

    Parameters
    ----------
    sweep : Sweep
        The sweep to write.
    out : Path
        Its folder.
    existing : {"refuse", "add", "replace"}
        What to do with another sweep already in ``out`` (:data:`EXISTING`).

    Returns
    -------
    dict
        The manifest: ``source``, ``grid``, ``base``, ``figure``, ``runs`` and ``points``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2},
    ...                          "grid": {"federated.learning_rate": [0.05, 50.0]}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import sweep_manifest
    >>> manifest = sweep_manifest(sweep, out, "refuse")
    >>> manifest["runs"] == sweep.run_ids, manifest["points"]
    (True, [{'federated.learning_rate': 0.05}, {'federated.learning_rate': 50.0}])
    """
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
    runs = dict(zip(old_runs, old_points))          # by run id: the old runs, then this sweep's new ones
    for run_id, point in zip(manifest["runs"], manifest["points"]):
        runs.setdefault(run_id, point)
    grids = old["grid"] if isinstance(old.get("grid"), list) else [old.get("grid")]
    new = sweep.grid if isinstance(sweep.grid, list) else [sweep.grid]
    return {**manifest, "source": old.get("source"), "grid": grids + new, "runs": list(runs),
            "points": list(runs.values()), "added": list(old.get("added", [])) + [sweep.source]}


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

    Parameters
    ----------
    out : str or Path
        The sweep folder.
    wait : bool, default False
        Wait for another holder rather than raise.

    Returns
    -------
    context manager
        Holds the lock inside its ``with`` block.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.sim.sweep.store import LOCK, sweep_lock
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> with sweep_lock(out):
    ...     print((out / LOCK).exists())
    True
    >>> (out / LOCK).exists()                    # removed when the block ends
    False
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
    """A run's ``rounds.csv`` (its bytes) with its dtypes restored (a column of zeros reads back as integers).

    Parameters
    ----------
    data : bytes
        The file's contents.

    Returns
    -------
    pandas.DataFrame
        The table: ``round`` and ``participants`` integers, every other numeric column float64.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.store import read_table
    >>> table = read_table(b"round,loss,kernel_drift\\n0,1.5,0\\n1,1.25,0\\n")
    >>> table.dtypes.astype(str).tolist()
    ['int64', 'float64', 'float64']
    """
    import numpy as np
    import pandas as pd

    table = read_csv_exact(data)
    dtypes = table.dtypes.tolist()
    if all(isinstance(dtype, (np.dtype, pd.StringDtype)) for dtype in dtypes):   # read_csv's: numeric is iufc
        cast = {c: "float64" for c, dtype in zip(table.columns.tolist(), dtypes) if isinstance(dtype, np.dtype)
                and dtype.kind in "iufc" and dtype != np.float64 and c not in _INTEGER_COLUMNS}
    else:                               # (select_dtypes and a Series per column took half the read)
        cast = {c: "float64" for c in table.select_dtypes(include="number").columns
                if c not in _INTEGER_COLUMNS and table[c].dtype != "float64"}
    return table.astype(cast) if cast else table      # astype of every column costs more than the read


#: the columns of a run's last round that :func:`summary_row` reads
FINAL_COLUMNS = ("round", "loss", "loss_regularized", "cumulative_kernel_drift")


def final_round(data: bytes) -> dict | None:
    """The last round of a run's ``rounds.csv`` (its bytes), the :data:`FINAL_COLUMNS` that
    :func:`summary_row` reads, from the header and the last line alone (``round`` an int, the others
    floats, an empty field NaN: the numbers :func:`read_table` gives, bit for bit, since both parse the
    same ``%.17g`` text exactly); ``None`` where the last line is not plain (a quoted field).

    Parameters
    ----------
    data : bytes
        A ``rounds.csv`` as written by :func:`~linattn_theory.core.io.write_run`.

    Returns
    -------
    dict or None
        ``{column: value}``.

    Examples
    --------
    >>> from linattn_theory.sim.sweep.store import final_round
    >>> final_round(b"round,stage,loss,loss_regularized,cumulative_kernel_drift\\n0,init,1.5,1.5,0\\n1,warmup,1.25,,0.5\\n")
    {'round': 1, 'loss': 1.25, 'loss_regularized': nan, 'cumulative_kernel_drift': 0.5}
    >>> final_round(b'round,stage,loss,loss_regularized,cumulative_kernel_drift\\n1,"a,b",1.25,1.25,0.5\\n') is None
    True
    """
    lines = data.splitlines()
    header, last = lines[0].decode().split(","), lines[-1].decode()
    values = last.split(",")
    if b'"' in lines[0] or '"' in last or len(values) != len(header) or not set(FINAL_COLUMNS) <= set(header):
        return None
    row = dict(zip(header, values))
    try:
        return {column: (int(row[column]) if column == "round" else float(row[column]) if row[column] else float("nan"))
                for column in FINAL_COLUMNS}
    except ValueError:
        return None


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
    naming the first broken run (and how many there are).

    Parameters
    ----------
    out : str or Path
        A sweep folder or a run folder.

    Returns
    -------
    list of tuple
        ``(folder, metadata, {file name: bytes})`` per finished run, in the sweep's grid order.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4}, "grid": {"federated.warmup_rounds": [0, 4]}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import finished_runs
    >>> _ = lt.run_sweep(sweep, out)
    >>> [(metadata["warmup_rounds"], sorted(files)) for _, metadata, files in finished_runs(out)]
    [(0, ['params.npz', 'rounds.csv']), (4, ['params.npz', 'rounds.csv'])]
    """
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
    """One row of :func:`summary_table`: the run's last round and its flattened configuration.

    Parameters
    ----------
    metadata : dict
        The run's ``metadata.json``.
    table : pandas.DataFrame or dict
        Its ``rounds.csv`` (:func:`read_table`), or its last round (:func:`final_round`).
    run_id : str
        Its id.

    Returns
    -------
    dict
        :data:`SUMMARY_COLUMNS`, then the configuration's dotted keys (and the step scale, where one set ``η``).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.store import summary_row
    >>> result = lt.simulate(lt.config_from_dict({"federated": {"rounds": 2, "warmup_rounds": 1}}))
    >>> row = summary_row(result.metadata, result.table, "demo")
    >>> row["run_id"], row["T0"], row["rounds_completed"], row["federated.rounds"], row["diverged"]
    ('demo', 1, 2, 2, False)
    >>> row["final_loss"] == float(result.table["loss"].iloc[-1])
    True

    :func:`summary_table` has one such row per run.
    """
    last = table.iloc[-1] if hasattr(table, "iloc") else table
    div = metadata.get("divergence") or {}
    row = {"run_id": run_id,
           "T0": int(metadata["warmup_rounds"]),
           "rounds_completed": int(last["round"]),
           "final_loss": float(last["loss"]),
           "final_loss_regularized": float(last["loss_regularized"]),
           "cumulative_kernel_drift": float(last["cumulative_kernel_drift"]),
           "diverged": bool(metadata.get("diverged", False)),
           "divergence_round": int(div["round"]) if div else -1}
    row.update(flatten(metadata["config"]))        # its η: the resolved one under a step scale
    if metadata.get("step_scale"):                  # and the scale c that set it (sim.step_size)
        row["federated.step_scale"] = metadata["step_scale"]["step_scale"]
        row["federated.step_curvature"] = metadata["step_scale"].get("step_curvature", "value")
    return row


def summary_table(out, *, rounds: bool = False):
    """The finished runs under ``out`` as a DataFrame (see :func:`linattn_theory.report.results.load_results`).

    Parameters
    ----------
    out : str or Path
        A sweep folder or a run folder.
    rounds : bool, default False
        One row per round of every run (with the run's configuration columns) instead of one per run.

    Returns
    -------
    pandas.DataFrame
        One :func:`summary_row` per finished run (or, with ``rounds``, the runs' tables joined).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4}, "grid": {"federated.warmup_rounds": [0, 4]}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import summary_table
    >>> _ = lt.run_sweep(sweep, out)
    >>> summary_table(out)[["T0", "rounds_completed", "diverged"]].values.tolist()
    [[0, 4, False], [4, 4, False]]
    >>> len(summary_table(out, rounds=True))          # rounds 0..4 of both runs
    10
    """
    import pandas as pd

    summaries, tables = [], []
    for path, metadata, files in finished_runs(out):
        table = None if rounds else final_round(files["rounds.csv"])
        table = read_table(files["rounds.csv"]) if table is None else table
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


def write_summary(out: Path):
    """``out/summary.csv``: :func:`summary_table` of the sweep folder, written atomically; returns the table.

    Parameters
    ----------
    out : Path
        The sweep folder.

    Returns
    -------
    pandas.DataFrame
        The table written.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import config_hash
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import SUMMARY, store_run, write_summary
    >>> _ = store_run(config_hash(config), lt.simulate(config), out)
    >>> len(write_summary(out)), (out / SUMMARY).is_file()
    (1, True)
    """
    table = summary_table(out)
    atomic_write_bytes(out / SUMMARY, table.to_csv(index=False).encode())
    return table


def stored_divergences(out: Path, sweep: Sweep, table) -> tuple[DivergedRun, ...]:
    """The diverged runs of ``sweep`` (computed now or before), in grid order, from the summary
    ``table`` and each diverged run's ``metadata.json``.

    Parameters
    ----------
    out : Path
        The sweep folder.
    sweep : Sweep
        The sweep.
    table : pandas.DataFrame
        Its summary (:func:`summary_table`).

    Returns
    -------
    tuple of DivergedRun
        The diverged runs, in grid order.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sweep.grid import sweep_from_dict
    >>> sweep = sweep_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2},
    ...                          "grid": {"federated.learning_rate": [0.05, 50.0]}})
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> from linattn_theory.sim.sweep.store import stored_divergences, summary_table
    >>> _ = lt.run_sweep(sweep, out)
    >>> [(run.learning_rate, run.round) for run in stored_divergences(out, sweep, summary_table(out))]
    [(50.0, 1)]
    """
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
