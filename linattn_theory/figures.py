"""Regenerating the figures: discover the scripts of ``simulations/`` and run them.

A figure script ``simulations/NAME.py`` defines
``make(out_dir, quick=False, executor="processes", workers=None, progress=False) -> list[Path]``
and reads its sweep from ``simulations/configs/``; it is runnable on its own as
``python simulations/NAME.py [--quick] [--out figures]`` through :func:`script_main`.
Sweep results are cached under ``out_dir/_sweeps/<config>[-quick]/`` (keyed by each run's
config hash, so a second call only redraws).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from .config import ConfigError

__all__ = ["discover", "make_figures", "figure_sweep", "script_main", "config_path"]


def _defines_make(path: Path) -> bool:
    return "\ndef make(" in path.read_text()


def discover(root=".", only=None) -> dict[str, Path]:
    """``{name: path}`` of the figure scripts in ``root/simulations`` (files defining ``make``)."""
    folder = Path(root) / "simulations"
    if not folder.is_dir():
        raise ConfigError(f"--root {str(root)!r}: no simulations/ folder there")
    scripts = {p.stem: p for p in sorted(folder.glob("*.py"))
               if not p.name.startswith("_") and _defines_make(p)}
    if only:
        unknown = sorted(set(only) - set(scripts))
        if unknown:
            raise ConfigError(f"--only {unknown[0]!r}: no such figure script; expected one of "
                              f"{', '.join(scripts)}")
        scripts = {k: v for k, v in scripts.items() if k in set(only)}
    return scripts


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(f"linattn_figure_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_figures(scripts: dict[str, Path], out_dir, *, quick: bool = False,
                 executor: str = "processes", workers: int | None = None,
                 progress: bool = False) -> dict[str, tuple[list[Path], float]]:
    """Run each script's ``make``; ``{name: (written paths, seconds)}``."""
    made = {}
    for name, path in scripts.items():
        start = time.perf_counter()
        paths = _load(name, path).make(out_dir, quick=quick, executor=executor, workers=workers,
                                       progress=progress)
        made[name] = (list(paths), time.perf_counter() - start)
    return made


def config_path(script_file, name: str) -> Path:
    """``simulations/configs/NAME.toml`` next to a figure script."""
    return Path(script_file).resolve().parent / "configs" / f"{name}.toml"


def figure_sweep(config, out_dir, *, quick=False, executor="processes", workers=None,
                 progress=False, rounds=False):
    """Run (or reuse) a figure's sweep; returns ``(sweep, results, sweep_dir)``.

    ``results`` is :func:`linattn_theory.load_results` of the sweep folder
    ``out_dir/_sweeps/<config stem>[-quick]``; with ``rounds=True`` also the per-round table,
    as ``(summary, per_round)``.
    """
    from .results import load_results
    from .sweep import load_sweep, run_sweep

    sweep = load_sweep(config, quick=quick)
    folder = Path(out_dir) / "_sweeps" / (Path(config).stem + ("-quick" if quick else ""))
    run_sweep(sweep, folder, executor=executor, workers=workers, progress=progress)
    summary = load_results(folder)
    if rounds:
        return sweep, (summary, load_results(folder, rounds=True)), folder
    return sweep, summary, folder


def script_main(make, doc: str | None = None, argv=None) -> int:
    """The command line of one figure script: ``[--quick] [--out DIR] [--executor E] [--workers N]``."""
    from .sweep import EXECUTORS

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help="small grids (seconds, for tests)")
    parser.add_argument("--out", default="figures", help="output folder (default: figures)")
    parser.add_argument("--executor", choices=EXECUTORS, default="processes")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    try:
        paths = make(args.out, quick=args.quick, executor=args.executor, workers=args.workers,
                     progress=not args.quiet)
    except ConfigError as err:
        print(f"invalid configuration: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def _instance_key(config) -> str:
    """The problem a run solves: its clients (task, seed), the student's shape and the ridge λ."""
    import json
    return json.dumps([config.task.__dict__, config.seed, config.model.rank, config.model.heads,
                       config.federated.ridge], sort_keys=True, default=str)


def runs_by_instance(folder, results):
    """Group a sweep's runs by problem instance: yields ``(clients, {run_id: (RunConfig, RunResult)})``.

    The clients are built once per instance (same task, seed, student shape and ridge λ).
    """
    from .config import config_from_dict
    from .federated import clients_from_config
    from .results import load_run
    from .sweep import _drop_none

    groups: dict[str, dict] = {}
    for rid in results["run_id"]:
        run = load_run(folder, rid)
        config = config_from_dict(_drop_none(run.metadata["config"]))
        groups.setdefault(_instance_key(config), {})[rid] = (config, run)
    for runs in groups.values():
        config = next(iter(runs.values()))[0]
        yield clients_from_config(config), runs


def frozen_stage_table(folder, results):
    """Per run, the closed forms at its frozen kernel ``K_{T0}`` (docs/theory.md §4–5).

    Adds ``profile`` ``Φ_λ(K_{T0})``, ``drift_floor`` ``D(K_{T0})``, ``contraction_rate`` ``ρ(K_{T0})``
    and ``measured_drift_floor`` ``F_λ(θ_T) − Φ_λ(K_{T0})`` (equal to ``D`` once the frozen stage
    has converged). Diverged runs get NaN and must be dropped before plotting.
    """
    import pandas as pd

    from .model import kernel
    from .theory import contraction_rate, profile_objective, value_drift_floor

    rows = []
    final = results.set_index("run_id")["final_loss_regularized"]
    for clients, runs in runs_by_instance(folder, results):
        for rid, (config, run) in runs.items():
            if run.diverged:
                continue
            K, fed = kernel(run.warmup_params), config.federated
            profile = profile_objective(K, clients, fed.ridge)[0]
            rows.append({"run_id": rid, "profile": profile,
                         "drift_floor": value_drift_floor(K, clients, fed.learning_rate,
                                                          fed.local_steps, fed.ridge),
                         "contraction_rate": contraction_rate(K, clients, fed.learning_rate,
                                                              fed.local_steps, fed.ridge),
                         "measured_drift_floor": float(final[rid]) - profile})
    return results.merge(pd.DataFrame(rows, columns=["run_id", "profile", "drift_floor",
                                                     "contraction_rate", "measured_drift_floor"]),
                         on="run_id", how="left")


def excess_risk_table(folder, results):
    """Per run: ``Φ*_λ``, the excess risk ``R = F_λ(θ_T) − Φ*_λ`` and its three parts (docs/theory.md §6).

    ``bias = Φ_λ(K_{T0}) − Φ*_λ``, ``drift_floor = D(K_{T0})`` and ``unfinished`` (the rest), from
    :mod:`linattn_theory.theory`; ``Φ*_λ`` is computed once per problem instance (clients, student
    shape, λ), started also from the best kernel its runs reached, so that no run beats it.
    Diverged runs get no theory columns (NaN) and must be dropped before plotting.
    """
    import pandas as pd

    from .model import kernel
    from .theory import centralized_optimum, profile_objective, value_drift_floor

    rows = []
    final = results.set_index("run_id")["final_loss_regularized"]
    for clients, runs in runs_by_instance(folder, results):
        config = next(iter(runs.values()))[0]
        lam = config.federated.ridge
        ok = {rid: run for rid, (_, run) in runs.items() if not run.diverged}
        kernels = {rid: kernel(run.warmup_params) for rid, run in ok.items()}
        profile = {rid: profile_objective(K, clients, lam)[0] for rid, K in kernels.items()}
        finals = [kernel(run.params) for run in ok.values()]
        best = [kernels[min(profile, key=profile.get)]] if profile else []
        best += [min(finals, key=lambda K: profile_objective(K, clients, lam)[0])] if finals else []
        optimum = centralized_optimum(clients, lam, rank=config.model.rank, heads=config.model.heads,
                                      seed=config.seed, initial_kernels=best)
        for rid in runs:
            row = {"run_id": rid, "optimum": optimum.objective}
            if rid in kernels:
                fed = runs[rid][0].federated
                row["excess_risk"] = float(final[rid]) - optimum.objective
                row["bias"] = profile[rid] - optimum.objective
                row["drift_floor"] = value_drift_floor(kernels[rid], clients, fed.learning_rate,
                                                       fed.local_steps, lam)
                row["unfinished"] = row["excess_risk"] - row["bias"] - row["drift_floor"]
            rows.append(row)
    return results.merge(pd.DataFrame(rows), on="run_id", how="left")
