"""Results on disk: every file is written atomically (temporary file in the same folder, then rename)."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "write_json", "write_run"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, as :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode())


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    return obj


def write_json(path, data: dict) -> Path:
    """Write ``data`` as sorted, indented JSON atomically (non-finite floats as strings)."""
    return atomic_write_text(path, json.dumps(_jsonable(data), indent=2, sort_keys=True) + "\n")


def write_run(result, out_dir) -> dict[str, Path]:
    """Write a run's table (``rounds.csv``), parameters (``params.npz``) and ``metadata.json``.

    ``metadata.json`` is written last: its presence marks a complete run.
    """
    out = Path(out_dir)
    paths = {"table": out / "rounds.csv", "params": out / "params.npz", "metadata": out / "metadata.json"}
    atomic_write_text(paths["table"], result.table.to_csv(index=False, float_format="%.17g"))
    buf = io.BytesIO()
    np.savez(buf, **{f"final_{b}": getattr(result.params, b) for b in ("WQ", "WK", "WV")},
             **{f"warmup_{b}": getattr(result.warmup_params, b) for b in ("WQ", "WK", "WV")})
    atomic_write_bytes(paths["params"], buf.getvalue())
    write_json(paths["metadata"], result.metadata)
    return paths
