"""Results on disk: every file is written atomically (temporary file in the same folder, then
rename), and a run's ``metadata.json``, written last, carries the content hash of each of its
files and where, when and with what the run was computed (:func:`provenance`).

A run folder is *finished* when its ``metadata.json`` exists and every file it lists has the
recorded SHA-256 (:func:`read_run`); a folder whose files do not match (cut short, edited,
overwritten with garbage) is *broken* and raises :class:`~linattn_theory.core.errors.RunIntegrityError`
naming it, so that it is recomputed (a sweep) or reported (``load_results``), never read as finished.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np

from .errors import RunIntegrityError

__all__ = ["atomic_write_bytes", "atomic_write_text", "write_json", "write_run", "read_run", "read_csv_exact",
           "table_csv_bytes", "run_status", "provenance", "timed_run", "RUN_FILES"]

#: the files of a run whose SHA-256 ``metadata.json`` records (``metadata["files"]``)
RUN_FILES = ("rounds.csv", "params.npz")
#: libraries whose versions a run records (those installed)
LIBRARIES = ("numpy", "scipy", "pandas", "numba", "array-api-compat", "cupy")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path, data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Written to a temporary file in the same folder, then renamed over ``path``: a process killed at any
    point leaves the old file or the new one. ``durable``: the new file is also flushed to the disk
    (``os.fsync``) before the rename, so that a power cut leaves one or the other too; without it a power
    cut may leave an empty or partial file (:func:`write_run` writes a run's files so: their SHA-256 in its
    ``metadata.json`` tells such a file, and a sweep recomputes that run).

    Parameters
    ----------
    path : str or path-like
        The file (its folder is created).
    data : bytes
        The content.
    durable : bool, default True
        Flush it to the disk before the rename.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.core.io import atomic_write_bytes
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "new" / "data.bin"
    >>> atomic_write_bytes(path, b"abc") == path, path.read_bytes()
    (True, b'abc')
    >>> [p.name for p in path.parent.iterdir()]                  # no temporary file left behind
    ['data.bin']
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path, text: str, durable: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, as :func:`atomic_write_bytes`.

    Parameters
    ----------
    path : str or path-like
        The file.
    text : str
        The content.
    durable : bool, default True
        As in :func:`atomic_write_bytes`.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.core.io import atomic_write_text
    >>> path = atomic_write_text(pathlib.Path(tempfile.mkdtemp()) / "note.txt", "ζ_V = 3")
    >>> path.read_bytes() == "ζ_V = 3".encode("utf-8")
    True
    """
    return atomic_write_bytes(path, text.encode(), durable)


def _jsonable(obj):
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    return obj


def write_json(path, data: dict, durable: bool = True) -> Path:
    """Write ``data`` as sorted, indented JSON atomically (non-finite floats as strings).

    Parameters
    ----------
    path : str or path-like
        The file.
    data : dict
        JSON values (NumPy scalars are converted; keys become strings).
    durable : bool, default True
        As in :func:`atomic_write_bytes`.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import json, pathlib, tempfile
    >>> import numpy as np
    >>> from linattn_theory.core.io import write_json
    >>> path = write_json(pathlib.Path(tempfile.mkdtemp()) / "a.json", {"b": np.float64(0.5), 1: float("inf")})
    >>> json.loads(path.read_text())                            # keys sorted and strings, inf as a string
    {'1': 'inf', 'b': 0.5}
    """
    return atomic_write_text(path, json.dumps(_jsonable(data), indent=2, sort_keys=True) + "\n", durable)


def read_csv_exact(source, **options):
    """``pandas.read_csv`` of a path or of bytes (``options`` passed on), every float read back bit for bit.

    Tables are written with ``%.17g`` (:func:`write_run`) and must read back exactly, whatever the
    pandas release: pandas 3's default parser does; before it the default (``"high"``) is an ulp off
    for about one value in three, and ``float_precision="round_trip"`` (deprecated by pandas 3) is exact.

    Parameters
    ----------
    source : str, Path or bytes
        The file, or its contents.
    **options
        Passed on to ``pandas.read_csv``.

    Returns
    -------
    pandas.DataFrame
        The table.

    Examples
    --------
    >>> from linattn_theory.core.io import read_csv_exact
    >>> read_csv_exact(b"x\\n0.1\\n0.30000000000000004\\n")["x"].tolist() == [0.1, 0.1 + 0.2]
    True
    """
    import pandas as pd

    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    return pd.read_csv(io.BytesIO(source) if isinstance(source, bytes) else source, **exact, **options)


#: what a float64 value is written as (:func:`table_csv_bytes`): 17 significant digits, read back exactly
FLOAT_FORMAT = "%.17g"


def _inf_is_missing(pd) -> bool:
    """Whether pandas counts ±inf as missing (the option ``mode.use_inf_as_na`` of pandas 2, which
    warns when it is read; pandas 3 has no such option)."""
    return bool(pd.isna(np.inf))


def _field_kind(dtype, pd) -> str | None:
    """How ``DataFrame.to_csv`` writes a column of ``dtype``: ``"float"`` (float64: ``"%.17g" %
    value``, NaN an empty field), ``"integer"`` (integers and bools: the Python int or bool, which
    ``csv.writer`` writes with ``str``), ``"string"`` (strings as they are, a missing one an empty
    field); ``None`` for any other dtype (:func:`table_csv_bytes` leaves it to pandas)."""
    if isinstance(dtype, np.dtype):
        if dtype == np.float64:
            return "float"
        if dtype.kind in "iub":
            return "integer"
        return "string" if dtype == object else None
    return "string" if isinstance(dtype, pd.StringDtype) else None


def table_csv_bytes(table) -> bytes:
    """``table.to_csv(index=False, float_format="%.17g").encode()``, the same bytes in about half the time.

    A float64 column is written value by value as ``"%.17g" % value`` (NaN as an empty field), an
    integer or bool column with ``str``, a column of strings as it is (a missing string as an empty
    field), and Python's ``csv.writer`` with pandas' settings quotes them (a comma, a quote, a line
    break) and ends each line with ``os.linesep``, the header too. Any other table (a column of
    another dtype: categorical, datetime, float32, a nullable extension dtype, objects that are not
    strings; a column label that is not a string, as in a MultiIndex; no column) is left to pandas.

    Parameters
    ----------
    table : pandas.DataFrame
        The table (its index is not written).

    Returns
    -------
    bytes
        The CSV text, UTF-8.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from linattn_theory.core.io import table_csv_bytes
    >>> table = pd.DataFrame({"round": [0, 1], "stage": ["warm, up", 'say "hi" twice'], "loss": [0.1, np.nan],
    ...                       "kernel_drift": [-0.0, np.inf]})
    >>> table_csv_bytes(table)
    b'round,stage,loss,kernel_drift\\n0,"warm, up",0.10000000000000001,-0\\n1,"say ""hi"" twice",,inf\\n'
    >>> table_csv_bytes(table) == table.to_csv(index=False, float_format="%.17g").encode()
    True
    """
    import pandas as pd

    labels = table.columns
    kinds = [_field_kind(dtype, pd) for dtype in table.dtypes.tolist()]
    if (len(labels) == 0 or None in kinds or _inf_is_missing(pd)
            or not all(type(label) is str for label in labels)):      # (a MultiIndex's are tuples)
        return table.to_csv(index=False, float_format=FLOAT_FORMAT).encode()
    # every value as a Python object: a float64 as a float (the same double), an int64 as an int, a
    # bool as a bool, a string as a str, a missing string as None, NaN or pd.NA
    columns = table.to_numpy(dtype=object).T.tolist()
    for position, kind in enumerate(kinds):
        values = columns[position]
        if kind == "float":
            columns[position] = [FLOAT_FORMAT % value if value == value else "" for value in values]
        elif kind == "string":
            for row, value in enumerate(values):
                if type(value) is not str:
                    if value is None or value is pd.NA or (type(value) is float and value != value):
                        values[row] = ""
                    else:                          # an object that is not a string
                        return table.to_csv(index=False, float_format=FLOAT_FORMAT).encode()
    text = io.StringIO()                           # the writer pandas' to_csv makes, with its defaults
    writer = csv.writer(text, lineterminator=os.linesep, delimiter=",", quoting=csv.QUOTE_MINIMAL,
                        doublequote=True, escapechar=None, quotechar='"')
    writer.writerow(list(labels))
    writer.writerows(zip(*columns))
    return text.getvalue().encode()


def _file_record(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def write_run(result, out_dir) -> dict[str, Path]:
    """Write a run's table (``rounds.csv``), parameters (``params.npz``) and ``metadata.json``.

    An earlier ``metadata.json`` there is removed first and the new one is written last, with the
    SHA-256 and size of the other files (``metadata["files"]``): a run killed while it is written
    is unfinished, and a file changed afterwards no longer matches (:func:`read_run`). Each file is
    written atomically but not flushed to the disk (:func:`atomic_write_bytes` with ``durable=False``:
    a sweep of 5,040 small runs spent 13 % of its time in ``fsync``): after a power cut a file that
    did not reach the disk reads as unfinished or broken, and a sweep recomputes the run.

    Parameters
    ----------
    result : RunResult
        The run (:func:`~linattn_theory.sim.engine.simulate`).
    out_dir : str or path-like
        The run folder (created).

    Returns
    -------
    dict of str to pathlib.Path
        The files written: ``table``, ``params``, ``metadata``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.io import run_status, write_run
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> paths = write_run(lt.simulate(lt.config_from_dict({"federated": {"rounds": 2, "warmup_rounds": 1}})), folder)
    >>> sorted(path.name for path in paths.values()), run_status(folder)[0]
    (['metadata.json', 'params.npz', 'rounds.csv'], 'finished')
    """
    out = Path(out_dir)
    paths = {"table": out / "rounds.csv", "params": out / "params.npz", "metadata": out / "metadata.json"}
    paths["metadata"].unlink(missing_ok=True)
    table = table_csv_bytes(result.table)
    buf = io.BytesIO()
    np.savez(buf, **{f"final_{b}": getattr(result.params, b) for b in ("WQ", "WK", "WV")},
             **{f"warmup_{b}": getattr(result.warmup_params, b) for b in ("WQ", "WK", "WV")})
    params = buf.getvalue()
    atomic_write_bytes(paths["table"], table, durable=False)
    atomic_write_bytes(paths["params"], params, durable=False)
    files = {"rounds.csv": _file_record(table), "params.npz": _file_record(params)}
    write_json(paths["metadata"], {**result.metadata, "files": files}, durable=False)
    return paths


def read_run(folder) -> tuple[dict, dict[str, bytes]]:
    """``(metadata, {file name: bytes})`` of the finished run in ``folder``, its files checked.

    Raises :class:`FileNotFoundError` when ``folder`` holds no ``metadata.json`` (an unfinished
    run) and :class:`~linattn_theory.core.errors.RunIntegrityError`, naming the folder and the
    file, when ``metadata.json`` is not a run record or a file is missing, or differs from the
    SHA-256 recorded for it (cut short, edited, replaced).

    Parameters
    ----------
    folder : str or path-like
        A run folder (:func:`write_run`).

    Returns
    -------
    metadata : dict
        The run's ``metadata.json``.
    files : dict of str to bytes
        The content of every file it lists, checked.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.core.io import read_run, write_run
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_run(lt.simulate(lt.config_from_dict({"federated": {"rounds": 2, "warmup_rounds": 1}})), folder)
    >>> metadata, files = read_run(folder)
    >>> sorted(files), metadata["files"]["rounds.csv"]["bytes"] == len(files["rounds.csv"])
    (['params.npz', 'rounds.csv'], True)
    >>> read_run(pathlib.Path(tempfile.mkdtemp()))
    Traceback (most recent call last):
        ...
    FileNotFoundError: ...: no finished run here (metadata.json is missing)
    """
    folder = Path(folder)
    path = folder / "metadata.json"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder}: no finished run here (metadata.json is missing)") from None
    try:
        metadata = json.loads(text)
        files = metadata["files"]
        expected = {name: (files[name]["sha256"], files[name]["bytes"]) for name in RUN_FILES}
    except (ValueError, TypeError, KeyError):
        raise RunIntegrityError(folder, "metadata.json is not a run record with the hashes of its "
                                        "files (garbled, or written before they were recorded)") from None
    contents = {}
    for name, (sha256, size) in expected.items():
        try:
            data = (folder / name).read_bytes()
        except FileNotFoundError:
            raise RunIntegrityError(folder, f"{name} is missing") from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise RunIntegrityError(folder, f"{name} does not match the hash metadata.json records "
                                            f"for it ({len(data)} bytes, {size} written)")
        contents[name] = data
    return metadata, contents


def run_status(folder) -> tuple[str, str]:
    """``("finished" | "unfinished" | "broken", detail)`` of a run folder (see :func:`read_run`).

    Parameters
    ----------
    folder : str or path-like
        A run folder.

    Returns
    -------
    status : {"finished", "unfinished", "broken"}
        What :func:`read_run` would find.
    detail : str
        Why (empty when finished).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.core.io import run_status, write_run
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_run(lt.simulate(lt.config_from_dict({"federated": {"rounds": 2, "warmup_rounds": 1}})), folder)
    >>> run_status(folder), run_status(pathlib.Path(tempfile.mkdtemp()))
    (('finished', ''), ('unfinished', ''))
    >>> _ = (folder / "rounds.csv").write_text("edited")         # no longer the recorded SHA-256
    >>> run_status(folder)[0]
    'broken'
    """
    try:
        read_run(folder)
    except FileNotFoundError:
        return "unfinished", ""
    except RunIntegrityError as err:
        return "broken", err.reason
    return "finished", ""


def _git_state(package: Path | None = None) -> tuple[str, bool | None]:
    """``(revision, modified)`` of the code that runs: the git checkout holding this package
    (source or editable install; ``modified``: a tracked file differs from the commit), else the
    record written when the package was built (``_revision.txt``: the revision, then ``dirty``
    when the tree it was built from was modified), else ``("unknown", None)``."""
    package = Path(__file__).resolve().parents[1] if package is None else package   # linattn_theory/
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, cwd=package, timeout=5)
        lines = out.stdout.split()
        if out.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() / package.name == package:
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, cwd=lines[0], timeout=10)
            return lines[1], (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        pass
    recorded = package / "_revision.txt"
    if recorded.is_file():
        words = recorded.read_text(encoding="utf-8").split()
        if words:
            return words[0], "dirty" in words[1:]
    return "unknown", None


def _git_revision() -> str:
    """The git commit of the code that runs (see :func:`_git_state`), or ``"unknown"``."""
    return _git_state()[0]


def _version(distribution: str) -> str | None:
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _provenance() -> tuple:
    revision, modified = _git_state()
    versions = {name: _version(name) for name in LIBRARIES}
    return (("version", _version("linattn-theory")), ("git_revision", revision),
            ("git_dirty", modified), ("host", socket.gethostname()), ("platform", platform.platform()),
            ("python", platform.python_version()),
            ("libraries", {k: v for k, v in versions.items() if v is not None}))


def provenance() -> dict:
    """What a run was computed with: ``version`` (of the installed linattn-theory; ``None`` when
    it is not installed), ``git_revision`` and ``git_dirty`` (tracked files modified; ``None``
    when unknown), ``host``, ``platform``, ``python`` and ``libraries`` (installed versions).
    Read once per process.

    Returns
    -------
    dict
        The record (a copy: the caller may change it).

    Examples
    --------
    >>> import platform
    >>> import numpy as np
    >>> from linattn_theory.core.io import provenance
    >>> record = provenance()
    >>> sorted(record)
    ['git_dirty', 'git_revision', 'host', 'libraries', 'platform', 'python', 'version']
    >>> record["python"] == platform.python_version(), record["libraries"]["numpy"] == np.__version__
    (True, True)
    """
    return {key: (dict(value) if isinstance(value, dict) else value) for key, value in _provenance()}


def timed_run(run):
    """Decorate a function that returns a run result, or a list of results or of ``(run_id,
    result)`` computed together: record in each ``metadata["provenance"]`` when the call
    ``started`` (UTC, ISO 8601), its ``wall_seconds`` and, for several results, how many shared
    that time (``computed_with``).

    Parameters
    ----------
    run : callable
        The function to time.

    Returns
    -------
    callable
        The function, recording its time in its results' metadata.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from linattn_theory.core.io import timed_run
    >>> @timed_run
    ... def run():
    ...     return [SimpleNamespace(metadata={}), SimpleNamespace(metadata={})]
    >>> results = run()
    >>> sorted(results[0].metadata["provenance"]), results[1].metadata["provenance"]["computed_with"]
    (['computed_with', 'started', 'wall_seconds'], 2)
    """
    @functools.wraps(run)
    def timed(*args, **kwargs):
        started, start = datetime.now(timezone.utc), time.perf_counter()
        returned = run(*args, **kwargs)
        results = ([item[1] if isinstance(item, tuple) else item for item in returned]
                   if isinstance(returned, list) else [returned])
        stamp = {"started": started.isoformat(timespec="seconds"),
                 "wall_seconds": round(time.perf_counter() - start, 6)}
        if len(results) > 1:
            stamp["computed_with"] = len(results)
        for result in results:
            result.metadata.setdefault("provenance", {}).update(stamp)
        return returned
    return timed
