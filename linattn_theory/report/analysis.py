"""From a finished sweep to its analysis: ``R(T0)``, its parts and the best warm-up per instance.

:func:`analyze_sweep` (``linattn analyze SWEEP_DIR``) reads a sweep folder alone: its own
configuration (``sweep.json``: the grid; every run's ``metadata.json``: the run's full config),
rebuilds each instance's clients, and computes per run (docs/theory.md §6)

``R(T0) = F_λ(θ_T) − Φ*_λ = bias(K_{T0}) + D(K_{T0}) + [F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)]``

(:func:`~linattn_theory.report.sweep_analysis.excess_risk_table`: one ``Φ*_λ`` per instance),
and per instance the best warm-up ``T0_best = min argmin R(T0)`` and FedFrozen's gain over
FedAvg, ``1 − R(T0_best)/R(T)`` (:func:`~linattn_theory.report.sweep_analysis.best_warmup`). An
*instance* is one problem: runs whose configurations differ only in ``federated.warmup_rounds``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..core.errors import ArgumentError, ConfigError
from ..core.io import atomic_write_bytes, run_status
from ..sim.sweep import MANIFEST, run_dir, sweep_lock
from .results import load_results
from .sweep_analysis import best_warmup, excess_risk_table

__all__ = ["SweepAnalysis", "analyze_sweep", "analysis_summary", "instance_ids", "grid_columns", "RUNS_FILE",
           "INSTANCES_FILE", "PARTS"]

#: per run: ``R(T0)`` and its parts (written to the sweep folder, or ``out``)
RUNS_FILE = "excess_risk.csv"
#: per instance: the best warm-up and the gain over FedAvg
INSTANCES_FILE = "best_warmup.csv"
#: the parts of ``R(T0)`` (docs/theory.md §6); they add up to ``excess_risk`` (``identity_residual``: the rounding)
PARTS = ("bias", "drift_floor", "unfinished")
#: the warm-up length: the one setting that varies within an instance
_WARMUP = "federated.warmup_rounds"
_RUN_COLUMNS = ("instance", "run_id", "T0", "federated.rounds", "diverged", "divergence_round",
                "final_loss_regularized", "optimum", "excess_risk", *PARTS, "identity_residual")
_BOUND_COLUMNS = ("U", "bias_bound", "T0_theory", "assumptions_violated")


@dataclass(frozen=True)
class SweepAnalysis:
    """What :func:`analyze_sweep` found: ``runs`` (one row per run: its instance, grid point, ``T0``,
    ``R(T0)`` and its parts; NaN for a diverged run), ``instances`` (one row per instance: its grid
    point, ``best_T0``, ``R_best``, ``R_fedavg``, ``gain``, ``T``, ``diverged_runs``), the grid
    columns that tell instances apart, the diverged runs left out of every statistic
    (``dropped``: ``count``, ``of``, ``run_id``, ``why``) and the files written.

    Parameters
    ----------
    runs : pandas.DataFrame
        One row per run.
    instances : pandas.DataFrame
        One row per instance.
    grid_columns : tuple of str
        The grid columns that tell instances apart.
    dropped : dict
        The diverged runs left out: ``count``, ``of``, ``run_id``, ``why``.
    paths : dict, default {}
        The files written, by name.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.analysis import SweepAnalysis
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> sweep_toml = '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 4]\\n'
    >>> _ = (folder / "sweep.toml").write_text(sweep_toml)
    >>> _ = lt.run_sweep(lt.load_sweep(folder / "sweep.toml"), folder / "out")
    >>> found = lt.analyze_sweep(folder / "out", workers=1, write=False)
    >>> isinstance(found, SweepAnalysis), len(found.runs), len(found.instances), found.dropped["count"]
    (True, 2, 1, 0)

    :func:`analyze_sweep` makes it.
    """

    runs: pd.DataFrame
    instances: pd.DataFrame
    grid_columns: tuple[str, ...]
    dropped: dict
    paths: dict = field(default_factory=dict)


def _manifest(folder: Path) -> dict:
    """The sweep's ``sweep.json``; a folder that is not a finished sweep is refused."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ArgumentError(f"SWEEP_DIR {str(folder)!r}: no such folder")
    if not path.is_file():
        raise ArgumentError(f"SWEEP_DIR {str(folder)!r} is not a sweep folder (no {MANIFEST}; "
                            f"`linattn sweep CONFIG --out DIR` makes one)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        list(manifest["runs"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path}: not a sweep manifest") from None
    return manifest


def _check_finished(folder: Path, manifest: dict) -> None:
    """Every run of the sweep is finished; else say how many are not and how to finish them."""
    status = {r: run_status(run_dir(folder, r))[0] for r in manifest["runs"]}
    unfinished = [r for r, state in status.items() if state != "finished"]
    if unfinished:
        source = manifest.get("source") or "SWEEP.toml"
        broken = sum(status[r] == "broken" for r in unfinished)
        why = f", {broken} of them broken (files that do not match their hashes)" if broken else ""
        raise ConfigError(f"SWEEP_DIR {str(folder)!r}: {len(unfinished)} of {len(manifest['runs'])} runs are "
                          f"not finished (the first: runs/{unfinished[0]}){why}; finish the sweep first: "
                          f"linattn sweep {source} --out {folder}")


def grid_columns(manifest: dict, results: pd.DataFrame) -> list[str]:
    """The grid's keys that tell instances apart: every key of the sweep's grid(s) but the warm-up
    length, in grid order, that is a column of ``results``.

    Parameters
    ----------
    manifest : dict
        The sweep's ``sweep.json``.
    results : pandas.DataFrame
        Its runs (:func:`~linattn_theory.report.results.load_results`).

    Returns
    -------
    list of str
        The keys.

    Examples
    --------
    >>> import pandas as pd
    >>> results = pd.DataFrame({"seed": [0, 0, 1, 1], "federated.warmup_rounds": [0, 4, 0, 4],
    ...                         "task.zeta_value": [0.5, 0.5, 0.5, 0.5]})
    >>> from linattn_theory.report.analysis import grid_columns
    >>> grid_columns({"grid": {"seed": [0, 1], "federated.warmup_rounds": [0, 4]}}, results)
    ['seed']
    """
    grids = manifest.get("grid") or {}
    keys = [k for grid in (grids if isinstance(grids, list) else [grids]) for k in (grid or {})]
    return [k for k in dict.fromkeys(keys) if k != _WARMUP and k in results.columns]


def instance_ids(results: pd.DataFrame) -> pd.Series:
    """Per run, its instance: ``0, 1, …`` in order of first appearance of the configuration without
    the warm-up length (the flattened config columns of :func:`~linattn_theory.report.results.load_results`).

    Parameters
    ----------
    results : pandas.DataFrame
        The runs, with their flattened config columns.

    Returns
    -------
    pandas.Series
        ``instance`` per run, on the index of ``results``.

    Examples
    --------
    >>> import pandas as pd
    >>> results = pd.DataFrame({"seed": [0, 0, 1, 1], "federated.warmup_rounds": [0, 4, 0, 4],
    ...                         "task.zeta_value": [0.5, 0.5, 0.5, 0.5]})
    >>> from linattn_theory.report.analysis import instance_ids
    >>> instance_ids(results).tolist()
    [0, 0, 1, 1]
    """
    config = [c for c in results.columns if ("." in c or c == "seed") and c != _WARMUP]
    ids = results.groupby(config, sort=False, dropna=False).ngroup() if config else 0
    return pd.Series(ids, index=results.index, name="instance")


def analyze_sweep(folder, out=None, *, bound: bool = False, workers: int | None = None,
                  write: bool = True) -> SweepAnalysis:
    """``R(T0)``, its parts and the best ``T0`` per instance of the finished sweep in ``folder``.

    Reads only the folder (the sweep's own grid and each run's recorded config; docs/theory.md §6):
    per run, ``excess_risk`` ``R(T0) = F_λ(θ_T) − Φ*_λ`` and its parts ``bias``, ``drift_floor``,
    ``unfinished`` (they add up to ``R(T0)``; ``identity_residual`` is the rounding), with
    ``bound`` also the a posteriori bound ``U(T0)`` (descriptive, fitted on the instance's FedAvg
    run); per instance, ``best_T0`` (the smallest minimiser of ``R(T0)`` on the grid, a diverged
    run counting as ``R = ∞``), ``R_best``, ``R_fedavg = R(T)`` and ``gain = 1 − R_best/R_fedavg``.
    A diverged run has no ``R(T0)``: its row holds NaN and ``dropped`` names it. With ``write``,
    the tables go to ``out`` (default: the sweep folder) as :data:`RUNS_FILE` and
    :data:`INSTANCES_FILE`, while the folder's lock is held (no sweep writes meanwhile).
    ``workers`` processes analyse the instances (the same numbers for any count). A folder that is
    not a sweep, or holds unfinished runs, is refused (:class:`ConfigError`).

    Parameters
    ----------
    folder : str or path-like
        A finished sweep's folder (:func:`~linattn_theory.sim.sweep.run_sweep`, ``linattn sweep``).
    out : str or path-like, optional
        Where the tables are written; default ``folder``.
    bound : bool, default False
        Also the a posteriori bound ``U(T0)`` per run (descriptive).
    workers : int, optional
        Processes that analyse the instances; default one per core.
    write : bool, default True
        Write :data:`RUNS_FILE` and :data:`INSTANCES_FILE`.

    Returns
    -------
    SweepAnalysis
        The per-run and per-instance tables, the grid columns, what was dropped and the paths written.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.toml").write_text(
    ...     '[task]\\nnum_clients = 3\\nsamples_per_client = 32\\ndim = 4\\nrank = 2\\n'
    ...     '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n')
    >>> _ = lt.run_sweep(lt.load_sweep(folder / "sweep.toml"), folder / "out")
    >>> found = lt.analyze_sweep(folder / "out", workers=1, write=False)
    >>> len(found.runs), len(found.instances), int(found.instances["T"].iloc[0])
    (3, 1, 4)
    """
    folder = Path(folder)
    manifest = _manifest(folder)
    with sweep_lock(folder) if write else contextlib.nullcontext():
        _check_finished(folder, manifest)
        results = load_results(folder)
        table = excess_risk_table(folder, results, bound=bound, workers=workers)
        dropped = dict(table.attrs.get("dropped", {}))
        table = table.assign(instance=instance_ids(table))
        grid = grid_columns(manifest, table)
        columns = ["instance", *grid, *_RUN_COLUMNS[1:], *(_BOUND_COLUMNS if bound else ())]
        runs = table[list(dict.fromkeys(columns))].sort_values(["instance", "T0"], kind="stable")
        best = best_warmup(table, ["instance"])
        described = table.groupby("instance", sort=True)[grid].first().reset_index() if grid else None
        instances = best if described is None else described.merge(best, on="instance")
        paths = {}
        if write:
            target = folder if out is None else Path(out)
            target.mkdir(parents=True, exist_ok=True)
            for name, frame in ((RUNS_FILE, runs), (INSTANCES_FILE, instances)):
                atomic_write_bytes(target / name, frame.to_csv(index=False).encode())
                paths[name] = target / name
    return SweepAnalysis(runs.reset_index(drop=True), instances, tuple(grid), dropped, paths)



def analysis_summary(analysis: SweepAnalysis) -> str:
    """Lines that say what :func:`analyze_sweep` found: runs, instances and the diverged runs left
    out; the best ``T0`` over instances (median, quartiles); how often FedFrozen at its best ``T0``
    beats FedAvg (instances whose FedAvg run diverged have no gain and are counted apart).

    Parameters
    ----------
    analysis : SweepAnalysis
        What :func:`analyze_sweep` returned.

    Returns
    -------
    str
        The lines, joined by newlines.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.analysis import analysis_summary
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.toml").write_text(
    ...     '[task]\\nnum_clients = 3\\nsamples_per_client = 32\\ndim = 4\\nrank = 2\\n'
    ...     '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n')
    >>> _ = lt.run_sweep(lt.load_sweep(folder / "sweep.toml"), folder / "out")
    >>> print(analysis_summary(lt.analyze_sweep(folder / "out", workers=1, write=False)))
    3 runs, 1 instances
    best T0 per instance: median ... of T = 4; FedFrozen at its best T0 beats FedAvg in ... of 1 instances ...
    """
    from .sweep_analysis import quartiles

    runs, instances, dropped = analysis.runs, analysis.instances, analysis.dropped
    lines = [f"{len(runs)} runs, {len(instances)} instances"
             + (f"; {dropped['count']} runs diverged and have no R(T0) (NaN; left out of every statistic)"
                if dropped.get("count") else "")]
    gain = instances["gain"].dropna()
    t0 = quartiles(instances.loc[instances["gain"].notna(), "best_T0"])
    if len(gain):
        lines.append(f"best T0 per instance: median {t0['median']:g} (quartiles {t0['q25']:g}–{t0['q75']:g}) of "
                     f"T = {int(instances['T'].max())}; FedFrozen at its best T0 beats FedAvg in "
                     f"{int((gain > 0).sum())} of {len(gain)} instances (median gain {100 * gain.median():.1f} %)")
    lost = len(instances) - len(gain)
    if lost:
        lines.append(f"{lost} instance{'s' if lost != 1 else ''} without R(T) (FedAvg, T0 = T, diverged or not "
                     f"in the grid): no gain")
    return "\n".join(lines)
