"""Theory quantities for every run of a sweep: the glue between stored runs and :mod:`.theory`.

Runs are grouped by problem instance (the clients: task and seed, with the student's shape and
the ridge λ), so that the clients are built and ``Φ*_λ`` is computed once per instance, and by
schedule (the instance plus ``η``, ``E``, ``T``, …) for the bound ``U(T0)``. All mathematics is
in :mod:`linattn_theory.theory` and :mod:`linattn_theory.theory.bound`; nothing is recomputed here.
Results are memoised per process (``linattn figures`` draws figures 1–3 from one analysis), and
instances are analysed in parallel with ``workers`` processes (the same numbers for any count);
``Φ*_λ`` is also stored with the sweep (``<folder>/_optimum/<key>.json``, keyed by the instance
and the starting kernels), so that redrawing a figure does not solve for it again.

The statistics every figure uses are here too, so that one definition serves all of them
(docs/theory.md §6): :func:`best_warmup` (per instance, the best warm-up ``T0_best`` = the
smallest ``T0`` of the grid at which ``R(T0)`` is smallest), :func:`select_instances` (the one rule
that picks the instances of a figure set: an instance whose FedAvg run diverged is left out of all
of them), :func:`paired_ratios` (``R(T0)/R(T)`` of the same instance), :func:`gain_summary` (per
level: how often and by how much FedFrozen at its best ``T0`` beats FedAvg),
:func:`spearman_interval` (a rank correlation with a bootstrap interval over instances) and
:func:`fedavg_chaos` (per instance, whether its FedAvg run is chaotic, docs/theory.md §6) with
:func:`gain_intervals` (per level: the median gain with a bootstrap 95 % interval and the wins above
:data:`WIN_THRESHOLD`, with and without the chaotic instances).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..sim.config import RunConfig, config_from_dict
from ..data.families import clients_from_config
from ..core.model import kernel
from .results import load_run
from ..core.clients import StackedClients, stack_clients

__all__ = ["runs_by_instance", "frozen_stage_table", "excess_risk_table", "best_warmup", "select_instances",
           "paired_ratios", "gain_summary", "quartiles", "spearman_interval", "fedavg_chaos", "gain_intervals",
           "chaos_chunks", "WIN_THRESHOLD", "CHAOS_PARALLEL_STEPS"]

#: a win is a gain ``1 − R(T0_best)/R(T)`` above this: the threshold the phase diagram declares
#: (``simulations/configs/phase_diagram.toml``, docs/theory.md §6), so that a gain of 0.2 % is no win
WIN_THRESHOLD = 0.02

_MEMO: dict = {}


def _memo(kind: str, folder, results: pd.DataFrame, compute):
    key = (kind, str(Path(folder).resolve()), tuple(results["run_id"]))
    if key not in _MEMO:
        _MEMO[key] = compute()
    return _MEMO[key].copy()


def _instance_key(config: RunConfig) -> str:
    """The problem a run solves: its clients (task, seed), the student (shape, attention) and the ridge λ."""
    model = config.model
    return json.dumps([config.task.__dict__, config.seed, model.rank, model.heads,
                       config.federated.ridge, model.attention, model.temperature],
                      sort_keys=True, default=str)


def _cached_optimum(folder, config: RunConfig, clients, starts) -> float:
    """``Φ*_λ`` of ``config``'s instance from :func:`~linattn_theory.theory.profile.centralized_optimum`,
    stored in ``<folder>/_optimum/`` under the instance and the exact starting kernels ``starts``.
    """
    from ..core.io import write_json
    from ..theory.profile import centralized_optimum

    digest = hashlib.sha256(_instance_key(config).encode())
    for K in starts:
        digest.update(np.ascontiguousarray(K, dtype=np.float64).tobytes())
    path = Path(folder) / "_optimum" / f"{digest.hexdigest()[:24]}.json"
    if path.is_file():
        return float(json.loads(path.read_text())["objective"])
    optimum = centralized_optimum(clients, config.federated.ridge, rank=config.model.rank,
                                  heads=config.model.heads, seed=config.seed, initial_kernels=starts)
    write_json(path, {"instance": json.loads(_instance_key(config)), "objective": optimum.objective,
                      "best_start": optimum.best_start, "converged": optimum.converged})
    return float(optimum.objective)


def _schedule_key(config: RunConfig) -> str:
    """The instance and every federated setting except the warm-up length and the strategy."""
    fed = dict(config.federated.__dict__, warmup_rounds=None, strategy=None)
    return json.dumps([_instance_key(config), fed, config.model.__dict__], sort_keys=True, default=str)


def _instance_groups(folder, results: pd.DataFrame) -> list[list[str]]:
    """The run ids of a sweep grouped by problem instance, in order of first appearance."""
    groups: dict[str, list] = {}
    for rid in results["run_id"]:
        groups.setdefault(_instance_key(_run_config(folder, rid)), []).append(rid)
    return list(groups.values())


def _run_config(folder, run_id: str) -> RunConfig:
    """A stored run's configuration from its ``metadata.json`` alone (grouping needs no table or
    parameters; :func:`_load_instance` verifies every file); a record that does not read as one is
    loaded in full, which names what is wrong with it."""
    try:
        metadata = json.loads((Path(folder) / "runs" / run_id / "metadata.json").read_bytes())
        return config_from_dict(metadata["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return config_from_dict(load_run(folder, run_id).metadata["config"])


def _load_instance(folder, run_ids):
    runs = {}
    for rid in run_ids:
        run = load_run(folder, rid)
        runs[rid] = (config_from_dict(run.metadata["config"]), run)
    config = next(iter(runs.values()))[0]
    clients = clients_from_config(config)
    if config.model.attention != "linear":      # softmax: stacked with contexts and τ (docs/theory.md §9)
        clients = stack_clients(clients, attention=config.model.attention, temperature=config.model.temperature)
    return clients, runs


def runs_by_instance(folder, results: pd.DataFrame):
    """Group a sweep's runs by problem instance: yields ``(clients, {run_id: (RunConfig, RunResult)})``.

    The clients are built once per instance (same task, seed, student shape and ridge λ); for
    softmax attention they come stacked with their contexts and temperature, so that every
    theory function uses the softmax features (docs/theory.md §9).

    Parameters
    ----------
    folder : str or path-like
        The sweep folder.
    results : pandas.DataFrame
        Its runs (:func:`~linattn_theory.report.results.load_results`), or a subset of them.

    Yields
    ------
    clients : FederatedDataset or StackedClients
        The instance's clients.
    runs : dict of str to tuple of (RunConfig, RunResult)
        Its runs.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.toml").write_text(
    ...     '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n')
    >>> _ = lt.run_sweep(lt.load_sweep(folder / "sweep.toml"), folder / "out")
    >>> results = lt.load_results(folder / "out")
    >>> from linattn_theory.report.sweep_analysis import runs_by_instance
    >>> [len(runs) for clients, runs in runs_by_instance(folder / "out", results)]   # one instance, three T0
    [3]
    """
    for run_ids in _instance_groups(folder, results):
        yield _load_instance(folder, run_ids)


def _with_dropped(table: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``attrs["dropped"]``: the sweep's diverged runs, whose theory columns are NaN
    (a median over the table leaves them out): how many, of how many runs, their ids and why."""
    diverged = results["run_id"][results["diverged"].astype(bool).to_numpy()].tolist()
    table.attrs["dropped"] = {"count": len(diverged), "of": len(results), "run_id": diverged,
                              "why": "the run diverged: its theory columns are NaN"}
    return table


def _per_instance(function, folder, results: pd.DataFrame, workers: int | None, *args) -> list:
    """``function(clients, runs, *args)`` for every instance, in ``workers`` processes; rows concatenated
    in instance order (so the result does not depend on ``workers``)."""
    from ..sim.sweep.executors import process_map

    groups = _instance_groups(folder, results)
    chunks = process_map(_instance_task, [(function, folder, g, args) for g in groups], workers)
    return [row for chunk in chunks for row in chunk]


def _instance_task(function, folder, run_ids, args):
    return function(*_load_instance(folder, run_ids), *args)


def frozen_stage_table(folder, results: pd.DataFrame) -> pd.DataFrame:
    """Per run, the closed forms at its frozen kernel ``K_{T0}`` (docs/theory.md §4–6).

    Adds ``profile`` ``Φ_λ(K_{T0})``, ``drift_floor`` ``D(K_{T0})``, ``contraction_rate`` ``ρ(K_{T0})``,
    ``zeta`` (the client dissimilarity ``ζ(K_{T0})``, :func:`~linattn_theory.theory.bound.gradient_dissimilarity`)
    and ``measured_drift_floor`` ``F_λ(θ_T) − Φ_λ(K_{T0})`` (equal to ``D`` once the frozen stage
    has converged). Diverged runs get NaN and must be dropped before plotting
    (``table.attrs["dropped"]`` names them).

    Parameters
    ----------
    folder, results
        The sweep folder and its runs, as in :func:`runs_by_instance`.

    Returns
    -------
    pandas.DataFrame
        ``results`` with the columns above.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.toml").write_text(
    ...     '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n')
    >>> _ = lt.run_sweep(lt.load_sweep(folder / "sweep.toml"), folder / "out")
    >>> results = lt.load_results(folder / "out")
    >>> from linattn_theory.report.sweep_analysis import frozen_stage_table
    >>> table = frozen_stage_table(folder / "out", results)
    >>> bool((table["drift_floor"] >= 0).all())
    True
    >>> bool((table["measured_drift_floor"] >= -1e-12).all())           # F_λ(θ_T) ≥ Φ_λ(K_{T0})
    True
    """
    from ..theory.bound import gradient_dissimilarity
    from ..theory.frozen_stage import contraction_rate, value_drift_floor
    from ..theory.profile import profile_objective

    def compute():
        rows = []
        final = results.set_index("run_id")["final_loss_regularized"]
        for clients, runs in runs_by_instance(folder, results):
            for rid, (config, run) in runs.items():
                if run.diverged:
                    continue
                K, fed = kernel(run.warmup_params), config.federated
                profile = profile_objective(K, clients, fed.ridge)[0]
                schedule = (fed.learning_rate, fed.local_steps, fed.ridge)
                rows.append({"run_id": rid, "profile": profile,
                             "drift_floor": value_drift_floor(K, clients, *schedule),
                             "contraction_rate": contraction_rate(K, clients, *schedule),
                             "zeta": float(np.sqrt(gradient_dissimilarity(K, clients, fed.ridge))),
                             "measured_drift_floor": float(final[rid]) - profile})
        columns = ["run_id", "profile", "drift_floor", "contraction_rate", "zeta", "measured_drift_floor"]
        return results.merge(pd.DataFrame(rows, columns=columns), on="run_id", how="left")
    return _with_dropped(_memo("frozen_stage", folder, results, compute), results)


def excess_risk_table(folder, results: pd.DataFrame, *, bound: bool = False,
                      workers: int | None = None) -> pd.DataFrame:
    """Per run, the exact decomposition of the excess risk and, with ``bound``, the fitted bound ``U(T0)``.

    Columns added (docs/theory.md §6): ``optimum`` ``Φ*_λ`` (one
    :func:`~linattn_theory.theory.profile.centralized_optimum` per instance, also started from the best
    kernel its runs reached), ``excess_risk`` ``R(T0) = F_λ(θ_T) − Φ*_λ``, ``bias``,
    ``drift_floor``, ``unfinished`` and ``identity_residual`` from
    :func:`~linattn_theory.theory.decomposition.decompose_excess_risk`; with ``bound``, from one
    :func:`~linattn_theory.recommenders.recommendation.a_posteriori_bound` per schedule (against the same ``Φ*_λ``):
    ``T0_theory``, ``U`` and ``bias_bound`` at the run's ``T0``, and ``assumptions_violated`` (NaN
    where the schedule's FedAvg path diverges). The bound's constants are fitted on the FedAvg run of the same instance: ``U`` and
    ``T0_theory`` are an a posteriori fit (descriptive), not a prediction. Diverged runs get NaN
    (``table.attrs["dropped"]`` says how many, which and why).
    Instances are analysed in ``workers`` processes (default: in this one).

    Parameters
    ----------
    folder, results
        The sweep folder and its runs, as in :func:`runs_by_instance`.
    bound : bool, default False
        Also fit the bound.
    workers : int, optional
        Processes; default this one.

    Returns
    -------
    pandas.DataFrame
        ``results`` with the columns above.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "sweep.toml").write_text(
    ...     '[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 2, 4]\\n')
    >>> _ = lt.run_sweep(lt.load_sweep(folder / "sweep.toml"), folder / "out")
    >>> results = lt.load_results(folder / "out")
    >>> from linattn_theory.report.sweep_analysis import excess_risk_table
    >>> table = excess_risk_table(folder / "out", results)
    >>> parts = table["bias"] + table["drift_floor"] + table["unfinished"]
    >>> bool(np.allclose(table["excess_risk"], parts, rtol=1e-10, atol=0)), table.attrs["dropped"]["count"]
    (True, 0)
    """
    both = []     # with bound: one pass over the instances gives both tables (each instance loaded once)

    def decomposition():
        if bound:
            both.extend(_per_instance(_decomposition_and_bounds, folder, results, workers, folder))
            rows = [row for rows, _ in both for row in rows]
        else:
            rows = _per_instance(_decomposition, folder, results, workers, folder)
        return results.merge(pd.DataFrame(rows), on="run_id", how="left")

    table = _memo("excess_risk", folder, results, decomposition)
    if bound:
        optimum = table.set_index("run_id")["optimum"].to_dict()
        columns = ["run_id", "T0_theory", "U", "bias_bound", "assumptions_violated"]
        bounds = _memo("bound", folder, results, lambda: pd.DataFrame(
            [row for _, rows in both for row in rows] if both else
            _per_instance(_bounds, folder, results, workers, optimum), columns=columns))
        table = table.merge(bounds, on="run_id", how="left")
    return _with_dropped(table, results)


def _decomposition_and_bounds(clients, runs, folder) -> list[tuple[list, list]]:
    """:func:`_decomposition` and :func:`_bounds` of one instance, loaded once (``[(rows, rows)]``)."""
    rows = _decomposition(clients, runs, folder)
    return [(rows, _bounds(clients, runs, {row["run_id"]: row["optimum"] for row in rows}))]


def _decomposition(clients, runs, folder) -> list[dict]:
    from ..theory.decomposition import decompose_excess_risk
    from ..theory.profile import profile_objective

    rows = []
    config = next(iter(runs.values()))[0]
    lam = config.federated.ridge
    # stacked once (softmax clients come stacked; linear ones as every theory function stacks them)
    data = clients if isinstance(clients, StackedClients) else stack_clients(clients)
    ok = [run for _, run in runs.values() if not run.diverged]
    kernels = [kernel(run.warmup_params) for run in ok] + [kernel(run.params) for run in ok]
    starts = [min(kernels, key=lambda K: profile_objective(K, data, lam)[0])] if kernels else []
    optimum = _cached_optimum(folder, config, clients, starts)
    for rid, (_, run) in runs.items():
        row = {"run_id": rid, "optimum": optimum}
        if not run.diverged:
            parts = decompose_excess_risk(run, data, optimum=optimum)
            row.update({k: parts[k] for k in ("excess_risk", "bias", "drift_floor", "unfinished",
                                              "identity_residual")})
        rows.append(row)
    return rows


def _bounds(clients, runs, optimum: dict) -> list[dict]:
    from ..recommenders.recommendation import a_posteriori_bound

    rows, bounds = [], {}
    for rid, (config, run) in runs.items():
        if run.diverged:
            continue
        key = _schedule_key(config)
        if key not in bounds:
            try:
                bounds[key] = a_posteriori_bound(config, clients, optimum=float(optimum[rid]))
            except ValueError:       # its FedAvg path diverged: no bound (the runs report their divergence)
                bounds[key] = None
        b = bounds[key]
        if b is None:
            continue
        curve = b.curve.set_index("round")
        T0 = run.metadata["warmup_rounds"]
        rows.append({"run_id": rid, "T0_theory": b.T0_theory, "U": float(curve.loc[T0, "U"]),
                     "bias_bound": float(curve.loc[T0, "bias_bound"]),
                     "assumptions_violated": len(b.violated)})
    return rows


# -- statistics over instances (docs/theory.md §6) ---------------------------------------------

def quartiles(values) -> dict:
    """``{"median", "q25", "q75", "count", "dropped"}`` of the finite ``values`` (NaN when there are
    none); ``dropped``: how many values were left out as non-finite (diverged runs' NaN).

    Parameters
    ----------
    values : array_like
        Numbers (non-finite ones ignored).

    Returns
    -------
    dict
        The statistics.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.report.sweep_analysis import quartiles
    >>> quartiles([1.0, 2.0, 3.0, np.nan, 5.0])
    {'median': 2.5, 'q25': 1.75, 'q75': 3.5, 'count': 4, 'dropped': 1}
    """
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    dropped = int(values.size - finite.size)
    if not finite.size:
        return {"median": np.nan, "q25": np.nan, "q75": np.nan, "count": 0, "dropped": dropped}
    q25, median, q75 = np.quantile(finite, [0.25, 0.5, 0.75])
    return {"median": float(median), "q25": float(q25), "q75": float(q75), "count": int(finite.size),
            "dropped": dropped}


def best_warmup(table: pd.DataFrame, by, risk: str = "excess_risk") -> pd.DataFrame:
    """Per instance (one row per value of the columns ``by``), the best warm-up and FedFrozen's gain.

    ``T0_best = min argmin_{T0} R(T0)`` over the instance's grid of ``T0`` (ties go to the smallest
    ``T0``; a diverged run counts as ``R = ∞``): the one definition of the best warm-up
    (docs/theory.md §6). Columns: ``by``, ``best_T0``, ``R_best = R(T0_best)``, ``R_fedavg = R(T)``
    (``T = federated.rounds``; NaN when that run diverged or is missing), ``gain = 1 − R_best/R_fedavg``
    (≥ 0; NaN without ``R_fedavg``), ``T`` and ``diverged_runs``. ``risk`` names the column of ``R``
    (the argmin is the same for any column that differs from ``R`` by a constant per instance, such
    as the final loss ``F_λ(θ_T) = R + Φ*_λ``; the gain is then relative to that column).

    Parameters
    ----------
    table : pandas.DataFrame
        Runs with ``T0`` (the effective warm-up), ``federated.rounds``, ``diverged`` and ``risk``
        (:func:`excess_risk_table`).
    by : list of str
        The columns that name an instance (e.g. ``["task.zeta_value", "seed"]``).
    risk : str, default "excess_risk"
        The column of ``R``.

    Returns
    -------
    pandas.DataFrame
        One row per instance.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.sweep_analysis import best_warmup
    >>> runs = pd.DataFrame({"seed": 0, "federated.rounds": 4, "diverged": False,
    ...                      "T0": [0, 2, 4], "excess_risk": [0.5, 0.2, 0.4]})
    >>> best = best_warmup(runs, by=["seed"])
    >>> int(best["best_T0"].iloc[0]), float(best["R_fedavg"].iloc[0]), float(best["gain"].iloc[0])
    (2, 0.4, 0.5)
    """
    from ..recommenders.scoring import best_warmup as argmin_smallest

    by = list(by)
    rows = []
    for key, group in table.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        group = group.sort_values("T0", kind="stable")
        values = group[risk].where(~group["diverged"].astype(bool), np.inf).fillna(np.inf)
        first = argmin_smallest(values.to_numpy())          # the smallest T0 among the minimisers
        best = group.iloc[first]
        T = int(group["federated.rounds"].max())
        fedavg = values[group["T0"].to_numpy() == T]
        R_fedavg = float(fedavg.iloc[0]) if len(fedavg) and np.isfinite(fedavg.iloc[0]) else np.nan
        R_best = float(values.iloc[first])
        rows.append({**dict(zip(by, key)), "best_T0": int(best["T0"]), "R_best": R_best,
                     "R_fedavg": R_fedavg, "gain": 1.0 - R_best / R_fedavg if np.isfinite(R_fedavg) else np.nan,
                     "T": T, "diverged_runs": int(group["diverged"].astype(bool).sum())})
    return pd.DataFrame(rows)


def select_instances(table: pd.DataFrame, by, risk: str = "excess_risk"):
    """The one rule that selects the instances of a figure set: ``(runs, best, left_out)``.

    An instance (a value of the columns ``by``) whose plain FedAvg run (``T0 = T``) diverged or is
    missing has no ``R(T)`` to compare with, so it is left out of every figure of the set: its runs,
    its best warm-up, its gain. In the instances kept, a run that diverged at another ``T0`` counts
    as ``R = ∞`` for the best warm-up (:func:`best_warmup`) and is not drawn. ``runs``: the
    non-diverged runs of the kept instances; ``best``: :func:`best_warmup` of the kept instances;
    ``left_out``: the best-warm-up rows of the instances left out (``diverged_runs`` says how many of
    their runs diverged).

    Parameters
    ----------
    table, by, risk
        As in :func:`best_warmup`.

    Returns
    -------
    runs : pandas.DataFrame
        The runs drawn.
    best : pandas.DataFrame
        The kept instances' best warm-ups.
    left_out : pandas.DataFrame
        The instances left out.

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "T0": [0, 2, 4, 0, 2, 4], "federated.rounds": 4,
    ...                       "excess_risk": [2.0, 1.0, 4.0, 3.0, 6.0, float("nan")],
    ...                       "diverged": [False, False, False, False, False, True]})   # seed 1: FedAvg diverged
    >>> from linattn_theory.report.sweep_analysis import select_instances
    >>> runs, best, left_out = select_instances(table, ["seed"])
    >>> len(runs), best[["seed", "best_T0", "gain"]].values.tolist(), left_out["seed"].tolist()
    (3, [[0.0, 2.0, 0.75]], [1])
    """
    by = list(by)
    best = best_warmup(table, by, risk)
    kept = best["R_fedavg"].notna().to_numpy()
    keys = pd.MultiIndex.from_frame(best.loc[kept, by])
    inside = pd.MultiIndex.from_frame(table[by]).isin(keys)
    runs = table[inside & ~table["diverged"].astype(bool).to_numpy()]
    return runs, best[kept].reset_index(drop=True), best[~kept].reset_index(drop=True)


def paired_ratios(table: pd.DataFrame, by, column: str = "excess_risk") -> pd.DataFrame:
    """The non-diverged runs with ``ratio = R(T0) / R(T)``, ``R(T)`` plain FedAvg's excess risk on the
    same instance (the columns ``by``); instances whose FedAvg run diverged are left out. ``column``
    names ``R`` (e.g. the final loss, for data without a known optimum). ``attrs["dropped"]``: the
    runs left out (diverged, or of an instance without a FedAvg run), how many of how many, and why.

    Parameters
    ----------
    table : pandas.DataFrame
        Runs (:func:`excess_risk_table`).
    by : list of str
        The columns that name an instance.
    column : str, default "excess_risk"
        The column of ``R``.

    Returns
    -------
    pandas.DataFrame
        The runs with ``ratio``.

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "T0": [0, 2, 4, 0, 2, 4], "federated.rounds": 4,
    ...                       "excess_risk": [2.0, 1.0, 4.0, 3.0, 6.0, float("nan")],
    ...                       "diverged": [False, False, False, False, False, True]})   # seed 1: FedAvg diverged
    >>> from linattn_theory.report.sweep_analysis import paired_ratios
    >>> ratios = paired_ratios(table, ["seed"])
    >>> ratios["ratio"].tolist(), ratios.attrs["dropped"]["count"]                   # R(T0) / R(T) of seed 0
    ([0.5, 0.25, 1.0], 3)
    """
    by = list(by)
    ok = table[~table["diverged"].astype(bool)]
    fedavg = (ok[ok["T0"] == ok["federated.rounds"]].set_index(by)[column].rename("R_fedavg"))
    joined = ok.join(fedavg, on=by, how="inner")
    out = joined.assign(ratio=joined[column] / joined["R_fedavg"])
    diverged = int(table["diverged"].astype(bool).sum())
    out.attrs["dropped"] = {"count": len(table) - len(out), "of": len(table), "diverged": diverged,
                            "no_fedavg": len(ok) - len(out),
                            "why": "the run diverged, or its instance's FedAvg run (T0 = T) diverged or is missing"}
    return out


def gain_summary(best: pd.DataFrame, level, left_out: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per value of ``level`` (a column, or a list of columns), over the instances of :func:`best_warmup`: ``instances``, ``beats``
    (how many have ``R(T0_best) < R(T)``, i.e. FedFrozen at its best warm-up beats FedAvg),
    ``share_beats``, the gain's median and quartiles (``gain_median``, ``gain_q25``, ``gain_q75``)
    and the best warm-up's (``best_T0_median``, ``best_T0_q25``, ``best_T0_q75``); instances whose
    FedAvg run diverged (a NaN gain in ``best``, or a row of ``left_out``, :func:`select_instances`)
    are left out of both and counted in ``diverged_instances``.

    Parameters
    ----------
    best : pandas.DataFrame
        :func:`best_warmup`'s table.
    level : str or list of str
        The column(s) to group by (e.g. ``"task.zeta_value"``).
    left_out : pandas.DataFrame, optional
        :func:`select_instances`' left-out instances.

    Returns
    -------
    pandas.DataFrame
        One row per level.

    Examples
    --------
    >>> import pandas as pd
    >>> table = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1], "T0": [0, 2, 4, 0, 2, 4], "federated.rounds": 4,
    ...                       "excess_risk": [2.0, 1.0, 4.0, 3.0, 6.0, float("nan")],
    ...                       "diverged": [False, False, False, False, False, True]})   # seed 1: FedAvg diverged
    >>> from linattn_theory.report.sweep_analysis import gain_summary, select_instances
    >>> _, best, _ = select_instances(table, ["seed"])
    >>> summary = gain_summary(best.assign(zeta=0.5), "zeta")
    >>> summary[["instances", "beats", "gain_median", "best_T0_median"]].values.tolist()
    [[1.0, 1.0, 0.75, 2.0]]
    """
    columns = [level] if isinstance(level, str) else list(level)
    lost = (left_out.groupby(columns).size() if left_out is not None and len(left_out)
            else pd.Series(dtype=int))
    rows = []
    for value, group in best.groupby(columns, sort=True):
        gain = group["gain"].to_numpy(dtype=float)
        valid = np.isfinite(gain)
        g, t = quartiles(gain), quartiles(group["best_T0"].to_numpy(dtype=float)[valid])
        extra = int(lost.get(value if len(columns) > 1 else value[0], 0)) if len(lost) else 0
        rows.append({**dict(zip(columns, value)), "instances": int(valid.sum()),
                     "diverged_instances": int((~valid).sum()) + extra, "beats": int((gain[valid] > 0).sum()),
                     "share_beats": float((gain[valid] > 0).mean()) if valid.any() else np.nan,
                     "gain_median": g["median"], "gain_q25": g["q25"], "gain_q75": g["q75"],
                     "best_T0_median": t["median"], "best_T0_q25": t["q25"], "best_T0_q75": t["q75"]})
    return pd.DataFrame(rows)


def fedavg_chaos(folder, table: pd.DataFrame, by, workers: int | None = None) -> pd.DataFrame:
    """Per instance (a value of the columns ``by``) whose plain FedAvg run (``T0 = T``) did not diverge:
    how chaotic that run is (docs/theory.md §6 "Chaotic instances"), measured as the phase diagram
    measures it (:func:`linattn_theory.report.phase_diagram.run_instances`): the run repeated from
    ``θ⁰ ⊙ (1 + s ξ)``, ``s = 10⁻¹²`` (:func:`~linattn_theory.sim.sensitivity.perturbed_params`, all
    repeats in one :func:`~linattn_theory.sim.ensemble.simulate_many`), against the stored run
    (:func:`~linattn_theory.sim.sensitivity.run_sensitivity`). Every ``T0`` of an instance shares that
    run's warm-up path, so its flag is the instance's. Columns: ``by``, ``chaotic`` (amplification above
    :data:`~linattn_theory.sim.sensitivity.CHAOS_AMPLIFICATION`, or the repeat diverged where the run did
    not) and ``amplification``. Each measurement is stored with the sweep
    (``<folder>/_chaos/<run_id>.json``), so that redrawing a figure does not repeat it. The repeats
    still to run are shared among ``workers`` processes (:func:`chaos_chunks`; an ensemble's results do
    not depend on its members, so the numbers are the same for any count).

    Parameters
    ----------
    folder : str or path-like
        The sweep folder.
    table : pandas.DataFrame
        Its runs (:func:`excess_risk_table` or :func:`~linattn_theory.report.results.load_results`):
        ``run_id``, ``T0``, ``federated.rounds``, ``diverged`` and the columns ``by``.
    by : list of str
        The columns that name an instance.
    workers : int, optional
        Processes for the repeats still to run (default: this one).

    Returns
    -------
    pandas.DataFrame
        One row per instance with a finite FedAvg run.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figures import figure_sweep
    >>> from linattn_theory.report.sweep_analysis import fedavg_chaos
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "demo.toml").write_text('[federated]\\nrounds = 4\\n[grid]\\n"federated.warmup_rounds" = [0, 4]\\n')
    >>> _, results, sweep_dir = figure_sweep(folder / "demo.toml", folder, executor="serial")
    >>> chaos = fedavg_chaos(sweep_dir, results, ["seed"])
    >>> chaos["chaotic"].tolist(), bool(chaos["amplification"].iloc[0] < 100)   # 4 rounds at a small step: calm
    ([False], True)
    """
    from ..core.io import write_json

    by = list(by)
    fedavg = table[(table["T0"] == table["federated.rounds"]) & ~table["diverged"].astype(bool)]
    store = Path(folder) / "_chaos"
    found, todo = {}, []
    for rid in fedavg["run_id"]:
        path = store / f"{rid}.json"
        if path.is_file():
            found[rid] = json.loads(path.read_text())
        else:
            todo.append(rid)
    from ..sim.sweep.executors import process_map

    chunks = chaos_chunks(todo, [_run_config(folder, rid) for rid in todo], workers)
    measured = process_map(_chaos_task, [(folder, chunk) for chunk in chunks], len(chunks))
    for chunk, records in zip(chunks, measured):
        for rid, record in zip(chunk, records):
            found[rid] = record
            write_json(store / f"{rid}.json", record)
    rows = [{**dict(zip(by, key)), "chaotic": bool(found[rid]["chaotic"]),
             "amplification": float(found[rid]["amplification"])}
            for rid, key in zip(fedavg["run_id"], fedavg[by].itertuples(index=False, name=None))]
    return pd.DataFrame(rows, columns=[*by, "chaotic", "amplification"])


#: local steps (``rounds × local_steps`` summed over the repeats) below which :func:`fedavg_chaos` runs its
#: repeats in this process: starting worker processes costs about a second, a quick figure's repeats less
CHAOS_PARALLEL_STEPS = 20_000


def chaos_chunks(run_ids: list, configs: list, workers: int | None = None) -> list[list]:
    """The repeats of :func:`fedavg_chaos` still to run, shared among at most ``workers`` processes:
    round-robin over ``run_ids`` (neighbours in a sweep are alike in cost), one chunk when ``workers``
    is ``None`` or 1, or when their local steps ``Σ rounds × local_steps`` stay under
    :data:`CHAOS_PARALLEL_STEPS` (worker start-up would cost more than it saves); no empty chunk.

    Parameters
    ----------
    run_ids : list of str
        The runs whose repeats are to run.
    configs : list of RunConfig
        Their configurations (for the work they hold).
    workers : int, optional
        The processes available.

    Returns
    -------
    list of list of str
        The run ids of each process, every id once.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.report.sweep_analysis import chaos_chunks
    >>> long = lt.config_from_dict({"federated": {"rounds": 1000, "local_steps": 10}})
    >>> chaos_chunks(["a", "b", "c"], [long] * 3, workers=2)
    [['a', 'c'], ['b']]
    >>> chaos_chunks(["a", "b", "c"], [lt.config_from_dict({})] * 3, workers=2)     # little work: one process
    [['a', 'b', 'c']]
    >>> chaos_chunks([], [], workers=2)
    []
    """
    if len(run_ids) != len(configs):
        raise ValueError(f"chaos_chunks: {len(run_ids)} run ids for {len(configs)} configs; expected one each")
    if not run_ids:
        return []
    steps = sum(c.federated.rounds * c.federated.local_steps for c in configs)
    count = 1 if workers is None or steps < CHAOS_PARALLEL_STEPS else max(1, min(int(workers), len(run_ids)))
    return [list(run_ids[i::count]) for i in range(count)]


def _chaos_task(folder, run_ids: list) -> list[dict]:
    """Worker side of :func:`fedavg_chaos`: the stored records of the runs ``run_ids`` (chaotic,
    amplification, perturbation), their repeats run as one
    :func:`~linattn_theory.sim.sensitivity.ensemble_sensitivities`."""
    from ..sim.sensitivity import PERTURBATION, ensemble_sensitivities

    configs = [_run_config(folder, rid) for rid in run_ids]
    clients = [clients_from_config(config) for config in configs]
    references = [load_run(folder, rid) for rid in run_ids]
    return [{"chaotic": bool(chaos.chaotic), "amplification": float(chaos.amplification),
             "perturbation": PERTURBATION}
            for chaos in ensemble_sensitivities(configs, clients, references)]


def gain_intervals(best: pd.DataFrame, level, threshold: float = WIN_THRESHOLD) -> pd.DataFrame:
    """Per value of ``level`` over the instances of :func:`best_warmup` with a finite gain (FedAvg at the
    same step did not diverge): ``instances``, the median gain with the bootstrap 95 % interval of
    :func:`~linattn_theory.report.phase_diagram.bootstrap_median` (``gain_median``, ``gain_low``,
    ``gain_high``), ``wins``: instances with ``gain > threshold``, ``chaotic_instances`` (the column
    ``chaotic`` of :func:`fedavg_chaos`), and the same statistics over the unflagged instances alone
    (suffix ``_unflagged``); the statistics of docs/theory.md §6 "Where freezing pays", here against
    FedAvg at the sweep's one step.

    Parameters
    ----------
    best : pandas.DataFrame
        :func:`best_warmup`'s table with ``chaotic``.
    level : str or list of str
        The column(s) to group by.
    threshold : float, default WIN_THRESHOLD
        A win is a gain above it.

    Returns
    -------
    pandas.DataFrame
        One row per level.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.sweep_analysis import gain_intervals
    >>> best = pd.DataFrame({"zeta": 1.0, "gain": [0.0, 0.01, 0.3, 0.5], "chaotic": [False, False, False, True]})
    >>> row = gain_intervals(best, "zeta").iloc[0]        # the 1 % gain is no win; without the chaotic 0.5
    >>> int(row["wins"]), float(row["gain_median"]), int(row["chaotic_instances"]), float(row["gain_median_unflagged"])
    (2, 0.155, 1, 0.01)
    """
    from .phase_diagram import bootstrap_median

    columns = [level] if isinstance(level, str) else list(level)
    rows = []
    for value, group in best.groupby(columns, sort=True):
        group = group[np.isfinite(group["gain"].to_numpy(dtype=float))]
        chaotic = group["chaotic"].to_numpy(dtype=bool)
        row = {**dict(zip(columns, value)), "chaotic_instances": int(chaotic.sum())}
        for suffix, part in (("", group), ("_unflagged", group[~chaotic])):
            median, low, high = bootstrap_median(part["gain"])
            row.update({f"instances{suffix}": len(part), f"wins{suffix}": int((part["gain"] > threshold).sum()),
                        f"gain_median{suffix}": median, f"gain_low{suffix}": low, f"gain_high{suffix}": high})
        rows.append(row)
    return pd.DataFrame(rows)


def spearman_interval(x, y, instances, *, level: float = 0.95, resamples: int = 2000,
                      seed: int = 0) -> dict:
    """Spearman's rank correlation of ``x`` and ``y`` with a bootstrap interval over instances.

    The pairs of one instance (e.g. the heads of one trained model) are not independent, so the
    bootstrap resamples whole instances (the values of ``instances``) with replacement and takes the
    percentile interval of ``level`` (2000 resamples, a fixed ``seed``: the same interval on a
    rerun). Returns ``{"rho", "low", "high", "instances", "pairs"}`` (NaN where ``x`` or ``y`` is
    constant).

    Parameters
    ----------
    x, y : array_like
        The paired values.
    instances : array_like
        The instance of each pair.
    level : float, default 0.95
        Coverage of the interval.
    resamples : int, default 2000
        Bootstrap resamples.
    seed : int, default 0
        Seed of the bootstrap.

    Returns
    -------
    dict
        ``rho``, ``low``, ``high``, ``instances``, ``pairs``.

    Examples
    --------
    >>> from linattn_theory.report.sweep_analysis import spearman_interval
    >>> found = spearman_interval([1, 2, 3, 4, 5, 6], [1, 3, 2, 4, 6, 5], instances=[0, 0, 1, 1, 2, 2], resamples=200)
    >>> round(found["rho"], 4), found["instances"], found["pairs"], found["low"] <= found["rho"] <= found["high"]
    (0.8857, 3, 6, True)
    """
    from scipy.stats import rankdata

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    groups = pd.factorize(np.asarray(instances))[0]
    members = [np.flatnonzero(groups == g) for g in range(groups.max() + 1)]

    def correlation(a, b):   # Spearman's ρ: Pearson's correlation of the (average) ranks a, b
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            return np.nan
        a, b = a - a.mean(), b - b.mean()
        return float(a @ b / np.sqrt((a @ a) * (b @ b)))

    def rho(index):
        return correlation(rankdata(x[index]), rankdata(y[index]))
    rng = np.random.default_rng(seed)
    indices = [np.concatenate([members[g] for g in rng.integers(len(members), size=len(members))])
               for _ in range(resamples)]
    if len({len(index) for index in indices}) == 1:     # resamples of one length: ranked in one call each
        index = np.stack(indices)
        ranks = zip(rankdata(x[index], axis=1), rankdata(y[index], axis=1))
        draws = [correlation(a, b) for a, b in ranks]
    else:
        draws = [rho(index) for index in indices]
    tail = (1 - level) / 2
    low, high = np.nanquantile(draws, [tail, 1 - tail]) if np.isfinite(draws).any() else (np.nan, np.nan)
    return {"rho": rho(np.arange(len(x))), "low": float(low), "high": float(high),
            "instances": len(members), "pairs": len(x)}
