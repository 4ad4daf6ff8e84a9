"""Reading stored runs back: one pandas DataFrame per sweep (docs/theory.md §6 quantities per run).

A sweep folder (see :mod:`linattn_theory.sim.sweep`) holds ``sweep.json`` and ``runs/<id>/`` with
``rounds.csv``, ``params.npz`` and ``metadata.json``; a single ``linattn simulate`` output folder
is read the same way. Every run read is checked against the content hashes its
``metadata.json`` records (:func:`~linattn_theory.core.io.read_run`): a broken run raises
:class:`~linattn_theory.core.errors.RunIntegrityError` naming its folder, never loads as finished.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.io import read_run
from ..core.model import Params
from ..sim.engine import Divergence, RunResult
from ..sim.sweep import MANIFEST, SUMMARY_COLUMNS, read_table, summary_table

__all__ = ["load_results", "load_run", "SUMMARY_COLUMNS"]


def load_results(out, *, rounds: bool = False) -> pd.DataFrame:
    """All finished runs under ``out`` as one DataFrame, in grid order.

    One row per run (``rounds=False``): ``run_id`` (the config hash), the flattened config
    (``seed``, ``task.zeta_value``, ``federated.warmup_rounds``, …), the effective warm-up ``T0``,
    ``rounds_completed``, ``final_loss`` (F at the last round), ``final_loss_regularized``
    (F_λ), the cumulative kernel drift Γ, ``diverged`` and ``divergence_round`` (−1 when the run
    did not diverge). With ``rounds=True``: one row per (run, round), the per-round table of
    every run joined with those columns. Unfinished runs (no ``metadata.json``) are left out; a
    broken run (its files do not match their recorded hashes) raises
    :class:`~linattn_theory.core.errors.RunIntegrityError` naming its folder. A path that is
    neither a sweep folder nor a run folder raises :class:`FileNotFoundError`.

    Parameters
    ----------
    out : str or path-like
        A sweep folder (:func:`~linattn_theory.sim.sweep.run_sweep`, ``linattn sweep``) or a run
        folder (``linattn simulate --out``).
    rounds : bool, default False
        One row per (run, round) instead of one per run.

    Returns
    -------
    pandas.DataFrame
        The runs' summary (or per-round) table, in grid order.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.io import write_run
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> _ = write_run(lt.simulate(config), folder)
    >>> lt.load_results(folder)[["federated.warmup_rounds", "rounds_completed", "diverged"]].values.tolist()
    [[2, 4, False]]
    >>> len(lt.load_results(folder, rounds=True))    # rounds 0..4
    5
    """
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"{out}: no such folder (expected a sweep folder or a run folder)")
    if not any((out / name).exists() for name in ("metadata.json", MANIFEST, "runs")):
        raise FileNotFoundError(f"{out}: neither a sweep folder ({MANIFEST}, runs/) nor a run folder "
                                f"(metadata.json)")
    return summary_table(out, rounds=rounds)


def load_run(out, run_id: str | None = None) -> RunResult:
    """One stored run as a :class:`~linattn_theory.sim.engine.RunResult` (table, final and round-T0 parameters).

    Parameters
    ----------
    out : str or path-like
        A run folder, or a sweep folder together with ``run_id``.
    run_id : str, optional
        The run's id in a sweep folder (its config hash: the ``run_id`` column of :func:`load_results`).

    Returns
    -------
    RunResult
        The stored table, parameters, divergence report and metadata.

    Raises
    ------
    FileNotFoundError
        For an unfinished run.
    RunIntegrityError
        For a broken one (its files do not match their recorded hashes).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.core.io import write_run
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> result = lt.simulate(config)
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = write_run(result, folder)
    >>> stored = lt.load_run(folder)
    >>> stored.table["loss"].tolist() == result.table["loss"].tolist()
    True
    """
    path = Path(out) if run_id is None else Path(out) / "runs" / run_id
    metadata, files = read_run(path)
    table = read_table(files["rounds.csv"])
    with np.load(io.BytesIO(files["params.npz"])) as npz:
        final = Params(*(npz[f"final_{b}"] for b in ("WQ", "WK", "WV")))
        warmup = Params(*(npz[f"warmup_{b}"] for b in ("WQ", "WK", "WV")))
    div = metadata.get("divergence")
    divergence = None
    if div:
        divergence = Divergence(int(div["round"]), float(div["loss"]), float(div["stable_learning_rate"]),
                                div["message"])
    return RunResult(table, final, warmup, divergence, metadata)
