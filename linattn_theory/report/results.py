"""Reading stored runs back: one pandas DataFrame per sweep (docs/theory.md §6 quantities per run).

A sweep folder (see :mod:`linattn_theory.sim.sweep`) holds ``sweep.json`` and ``runs/<id>/`` with
``rounds.csv``, ``params.npz`` and ``metadata.json``; a single ``linattn simulate`` output folder
is read the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..sim.engine import Divergence, RunResult
from ..core.model import Params
from ..sim.sweep import MANIFEST, _flatten

__all__ = ["load_results", "load_run", "SUMMARY_COLUMNS"]

SUMMARY_COLUMNS = ("run_id", "T0", "rounds_completed", "final_loss", "final_loss_regularized",
                   "cumulative_kernel_drift", "diverged", "divergence_round")


def _run_dirs(out: Path) -> list[Path]:
    """Finished runs of a sweep folder, in the sweep's grid order (or a single run folder)."""
    if (out / "metadata.json").is_file():
        return [out]
    manifest = out / MANIFEST
    if manifest.is_file():
        ids = json.loads(manifest.read_text())["runs"]
        dirs = [out / "runs" / i for i in ids]
    else:
        dirs = sorted((out / "runs").glob("*")) if (out / "runs").is_dir() else []
    return [d for d in dirs if (d / "metadata.json").is_file()]


#: integer columns of a run's table; every other numeric column is a float64 measurement
_INTEGER_COLUMNS = ("round", "participants")


def _read_table(path: Path) -> pd.DataFrame:
    """A run's ``rounds.csv`` with its dtypes restored (a column of zeros reads back as integers)."""
    table = pd.read_csv(path)
    cast = {c: "float64" for c in table.select_dtypes(include="number").columns if c not in _INTEGER_COLUMNS}
    return table.astype(cast)


def _summary(metadata: dict, table: pd.DataFrame, run_id: str) -> dict:
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


def load_results(out, *, rounds: bool = False) -> pd.DataFrame:
    """All finished runs under ``out`` as one DataFrame, in grid order.

    One row per run (``rounds=False``): ``run_id`` (the config hash), the flattened config
    (``seed``, ``task.zeta_value``, ``federated.warmup_rounds``, …), the effective warm-up ``T0``,
    ``rounds_completed``, ``final_loss`` (F at the last round), ``final_loss_regularized``
    (F_λ), the cumulative kernel drift Γ, ``diverged`` and ``divergence_round`` (−1 when the run
    did not diverge). With ``rounds=True``: one row per (run, round), the per-round table of
    every run joined with those columns. Unfinished runs are left out. A path that is neither a
    sweep folder nor a run folder raises :class:`FileNotFoundError`.
    """
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"{out}: no such folder (expected a sweep folder or a run folder)")
    if not any((out / name).exists() for name in ("metadata.json", MANIFEST, "runs")):
        raise FileNotFoundError(f"{out}: neither a sweep folder ({MANIFEST}, runs/) nor a run folder "
                                f"(metadata.json)")
    summaries, tables = [], []
    for path in _run_dirs(out):
        metadata = json.loads((path / "metadata.json").read_text())
        table = _read_table(path / "rounds.csv")
        run_id = metadata.get("run_id", path.name)
        summaries.append(_summary(metadata, table, run_id))
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


def load_run(out, run_id: str | None = None) -> RunResult:
    """One stored run as a :class:`~linattn_theory.sim.engine.RunResult` (table, final and round-T0 parameters).

    ``out`` is a run folder, or a sweep folder together with ``run_id``.
    """
    path = Path(out) if run_id is None else Path(out) / "runs" / run_id
    if not (path / "metadata.json").is_file():
        raise FileNotFoundError(f"{path}: no finished run here (metadata.json is missing)")
    metadata = json.loads((path / "metadata.json").read_text())
    table = _read_table(path / "rounds.csv")
    with np.load(path / "params.npz") as npz:
        final = Params(*(npz[f"final_{b}"] for b in ("WQ", "WK", "WV")))
        warmup = Params(*(npz[f"warmup_{b}"] for b in ("WQ", "WK", "WV")))
    div = metadata.get("divergence")
    divergence = None
    if div:
        divergence = Divergence(int(div["round"]), float(div["loss"]), float(div["stable_learning_rate"]),
                                div["message"])
    return RunResult(table, final, warmup, divergence, metadata)
