"""Sweeps: validation before any run, resumption after SIGKILL, identical results on every executor."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from linattn_theory.core.io import read_csv_exact
import pytest

from linattn_theory import load_results, load_run, load_sweep, simulate, simulate_many
from linattn_theory.cli.commands import main
from linattn_theory.core.errors import ConfigError, RunIntegrityError
from linattn_theory.core.io import _jsonable
from linattn_theory.sim.sweep import run_sweep, sweep_from_dict

ROOT = Path(__file__).resolve().parents[1]

BASE = """
seed = 0
[task]
num_clients = 3
samples_per_client = 16
tokens = 4
dim = 3
rank = 2
outputs = 1
[model]
rank = 2
[federated]
rounds = {rounds}
warmup_rounds = 3
local_steps = 2
learning_rate = 0.02
"""

SMALL = BASE.format(rounds=6) + """
[grid]
"federated.warmup_rounds" = [0, 3, 6]
"task.zeta_value" = [0.5, 2.0]
seed = [0, 1]
"""


def write(tmp_path, text, name="sweep.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def assert_same_results(a: Path, b: Path):
    pd.testing.assert_frame_equal(load_results(a), load_results(b))
    pd.testing.assert_frame_equal(load_results(a, rounds=True), load_results(b, rounds=True))
    for run_id in load_results(a)["run_id"]:
        pa, pb = load_run(a, run_id), load_run(b, run_id)
        for block in ("WQ", "WK", "WV"):
            np.testing.assert_array_equal(getattr(pa.params, block), getattr(pb.params, block))
            np.testing.assert_array_equal(getattr(pa.warmup_params, block), getattr(pb.warmup_params, block))


def test_grid_expands_in_order_and_loads_one_row_per_run(tmp_path):
    sweep = load_sweep(write(tmp_path, SMALL))
    assert len(sweep) == 12
    assert [p["federated.warmup_rounds"] for p in sweep.points[:4]] == [0, 0, 0, 0]
    assert [p["seed"] for p in sweep.points[:4]] == [0, 1, 0, 1]     # last key fastest
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"),
                 "--executor", "serial", "--quiet"]) == 0
    results = load_results(tmp_path / "out")
    assert list(results["run_id"]) == sweep.run_ids
    assert list(results["T0"]) == [p["federated.warmup_rounds"] for p in sweep.points]
    assert (results["rounds_completed"] == 6).all() and not results["diverged"].any()
    assert np.isfinite(results["final_loss_regularized"]).all()
    rounds = load_results(tmp_path / "out", rounds=True)
    assert len(rounds) == 12 * 7 and set(rounds["run_id"]) == set(sweep.run_ids)
    # Γ(T0) of the summary is the last row of each run's table
    last = rounds.groupby("run_id")["cumulative_kernel_drift"].last()
    np.testing.assert_array_equal(results.set_index("run_id")["cumulative_kernel_drift"], last[results["run_id"]])


@pytest.mark.parametrize("config", sorted(p for p in (ROOT / "simulations" / "configs").glob("*.toml")
                                           if "[grid]" in p.read_text() or "[[grid]]" in p.read_text()),
                         ids=lambda p: p.stem)
def test_figure_sweep_configs_are_valid_full_and_quick(config):
    full, quick = load_sweep(config), load_sweep(config, quick=True)
    assert len(full) >= 1 and len(quick) >= 1
    assert len(quick) <= len(full)


def test_union_of_grids_quick_overrides_and_duplicates(tmp_path):
    data = {"federated": {"rounds": 10, "warmup_rounds": 5},
            "grid": [{"federated.local_steps": [1, 2]}, {"federated.local_steps": [2], "seed": [0, 1]}],
            "quick": {"federated.rounds": 6, "seed": [3]}}
    sweep = sweep_from_dict(data)
    assert [(c.federated.local_steps, c.seed) for c in sweep.configs] == [(1, 0), (2, 0), (2, 1)]
    quick = sweep_from_dict(data, quick=True)
    assert [(c.federated.local_steps, c.seed, c.federated.rounds) for c in quick.configs] == \
        [(1, 0, 6), (2, 0, 6), (2, 3, 6)]


@pytest.mark.parametrize("grid, message", [
    ('"federated.warmup_rounds" = 3', "expected a non-empty list"),
    ('"federated.warmup_rounds" = []', "expected a non-empty list"),
    ('"federated.warmup_steps" = [1, 2]', "federated.warmup_steps: unknown key"),
    ('"optimizer.lr" = [1]', "optimizer: unknown key"),
    ('"federated.warmup_rounds" = [0, 7]', "warmup_rounds = 7"),          # only one run is invalid
    ('"federated.learning_rate" = [0.1, -1.0]', "learning_rate = -1.0"),
    ('"task.zeta_value" = ["big"]', "expected a number"),
])
def test_bad_sweep_fails_before_any_run_with_exit_2(tmp_path, capsys, grid, message):
    path = write(tmp_path, BASE.format(rounds=6) + "[grid]\n" + grid + "\n")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--executor", "serial"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_bad_executor_options_fail_before_writing(tmp_path, capsys):
    path = write(tmp_path, SMALL)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--executor", "serial",
                 "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert main(["sweep", str(path), "--out", str(out), "--workers", "0"]) == 2
    (tmp_path / "file").write_text("x")
    assert main(["sweep", str(path), "--out", str(tmp_path / "file"), "--executor", "serial"]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ConfigError, match="executor"):
        run_sweep(load_sweep(path), out, executor="threads")
    assert not out.exists()


def test_shared_warmups_and_ensembles_equal_separate_runs(tmp_path):
    """A sweep runs its runs as ensembles (FedFrozen runs differing in T0 share a warm-up): each
    stored run is bit for bit the run alone (``simulate_many([config])``) and ``simulate(config)``
    to rounding (the ensemble's fused engine sums in another order than the Array-API one)."""
    sweep = load_sweep(write(tmp_path, SMALL))
    run_sweep(sweep, tmp_path / "out")
    for config, run_id in zip(sweep.configs, sweep.run_ids):
        stored, alone = load_run(tmp_path / "out", run_id), simulate_many([config])[0]
        pd.testing.assert_frame_equal(stored.table, alone.table, check_exact=True)
        for block in ("WQ", "WK", "WV"):
            np.testing.assert_array_equal(getattr(stored.params, block), getattr(alone.params, block))
            np.testing.assert_array_equal(getattr(stored.warmup_params, block),
                                          getattr(alone.warmup_params, block))
        recorded = json.loads(json.dumps(_jsonable(alone.metadata)))
        when = ("started", "wall_seconds", "computed_with")   # when and how long: per computation
        assert {k: v for k, v in stored.metadata["provenance"].items() if k not in when} == \
            {k: v for k, v in recorded["provenance"].items() if k not in when}
        other = ("run_id", "files", "provenance")
        assert {k: v for k, v in stored.metadata.items() if k not in other} == \
            {k: v for k, v in recorded.items() if k not in other}
        direct = simulate(config)
        assert list(stored.table["stage"]) == list(direct.table["stage"])
        numeric = [c for c in direct.table.columns if c not in ("stage", "strategy")]
        np.testing.assert_allclose(stored.table[numeric].to_numpy(float), direct.table[numeric].to_numpy(float),
                                   rtol=1e-12, atol=0)
        for block in ("WQ", "WK", "WV"):
            np.testing.assert_allclose(getattr(stored.params, block), getattr(direct.params, block),
                                       rtol=1e-12, atol=0)


def test_the_online_rules_runs_share_their_instances_task_and_are_the_runs_alone(tmp_path):
    """The online rule's run of an instance (fedfrozen_adaptive, T0 = T) lands in the task of that
    instance's FedFrozen runs, whose T0 = T run it follows until it freezes (one warm-up
    trajectory), and is stored as ``simulate(config)``, bit for bit (the Array-API engine on both
    sides)."""
    from linattn_theory.sim.sweep.executors import plan_tasks

    rule = {"federated.adaptive_confidence": 0.0, "federated.adaptive_gain_confidence": 0.0,
            "federated.adaptive_window": 2, "federated.adaptive_descent_confidence": float("inf")}
    sweep = load_sweep(write(tmp_path, SMALL), overrides={"model.engine": "array_api", "federated.rounds": 10,
                                                          "federated.warmup_rounds": [0, 3, 10]})
    online = [c.with_updates({"federated.strategy": "fedfrozen_adaptive", "federated.warmup_rounds": 10, **rule})
              for c in sweep.configs]
    sweep = sweep.with_runs(online)
    instance = {run_id: (c.seed, c.task.zeta_value) for run_id, c in zip(sweep.run_ids, sweep.configs)}
    tasks = plan_tasks(list(zip(sweep.run_ids, sweep.configs)))
    assert [len(task) for task in tasks] == [8, 8]        # 2 instances each: 3 T0 and the online run
    for task in tasks:
        assert len({instance[run_id] for run_id, _ in task}) == 2 and \
            sum(data["federated"]["strategy"] == "fedfrozen_adaptive" for _, data in task) == 2
    run_sweep(sweep, tmp_path / "out")
    outcomes = set()
    for config, run_id in zip(sweep.configs, sweep.run_ids):
        if config.federated.strategy == "fedfrozen_adaptive":
            stored, alone = load_run(tmp_path / "out", run_id), simulate(config)
            pd.testing.assert_frame_equal(stored.table, alone.table, check_exact=True)
            for block in ("WQ", "WK", "WV"):
                np.testing.assert_array_equal(getattr(stored.params, block), getattr(alone.params, block))
            outcomes.add((stored.metadata["kernel_round"], stored.metadata["stop_round"]))
    assert (4, 5) in outcomes and (10, 10) in outcomes            # a roll-back, and no freeze


def test_diverged_runs_are_recorded(tmp_path):
    data = {"task": {"num_clients": 3, "samples_per_client": 16, "tokens": 4, "dim": 3},
            "federated": {"rounds": 8, "warmup_rounds": 8, "learning_rate": 5.0},
            "grid": {"federated.learning_rate": [0.01, 5.0]}}
    run_sweep(sweep_from_dict(data), tmp_path / "out")
    results = load_results(tmp_path / "out").set_index("federated.learning_rate")
    assert not results.loc[0.01, "diverged"] and results.loc[0.01, "divergence_round"] == -1
    assert results.loc[5.0, "diverged"] and 1 <= results.loc[5.0, "divergence_round"] <= 8
    run = load_run(tmp_path / "out", results.loc[5.0, "run_id"])
    assert run.diverged and "learning_rate" in run.divergence.message


def test_the_summary_reads_each_runs_last_round_as_the_whole_table_gives_it(tmp_path):
    """summary_table parses only a run's header and last row (final_round): the same summary, bit for
    bit, as summary_row of every run's whole table, for a finished and a diverged run."""
    from linattn_theory.sim.sweep.store import finished_runs, read_table, summary_row, summary_table

    data = {"task": {"num_clients": 3, "samples_per_client": 16, "tokens": 4, "dim": 3},
            "federated": {"rounds": 8, "warmup_rounds": 8, "learning_rate": 5.0, "ridge": 0.05},
            "grid": {"federated.learning_rate": [0.01, 5.0]}}
    run_sweep(sweep_from_dict(data), tmp_path / "out")
    whole = pd.DataFrame([summary_row(metadata, read_table(files["rounds.csv"]), metadata.get("run_id", path.name))
                          for path, metadata, files in finished_runs(tmp_path / "out")])
    ours = summary_table(tmp_path / "out")
    pd.testing.assert_frame_equal(ours, whole, check_exact=True)
    assert ours["diverged"].tolist() == [False, True] and 0 < ours["final_loss"].iloc[0] < ours["final_loss_regularized"].iloc[0]
    assert ours["rounds_completed"].iloc[0] == 8 > ours["rounds_completed"].iloc[1]


@pytest.mark.slow
def test_sigkill_mid_sweep_then_rerun_equals_uninterrupted(tmp_path):
    text = BASE.format(rounds=150) + """
[grid]
"federated.warmup_rounds" = [0, 50, 100, 150]
seed = [0, 1, 2]
"""
    path = write(tmp_path, text)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "linattn_theory", "sweep", str(path), "--out",
                             str(killed), "--executor", "serial", "--quiet"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(list(killed.glob("runs/*/metadata.json"))) >= 3:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the sweep finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    finished_before = len(list(killed.glob("runs/*/metadata.json")))
    assert 3 <= finished_before < 12
    assert main(["sweep", str(path), "--out", str(killed), "--executor", "serial", "--quiet"]) == 0
    assert len(list(killed.glob("runs/*/metadata.json"))) == 12
    assert not list(killed.rglob("*.tmp")), "a temporary file survived the resumed sweep"
    run_sweep(load_sweep(path), clean)
    assert_same_results(killed, clean)


@pytest.mark.slow
def test_serial_processes_and_dask_give_identical_results(tmp_path):
    path = write(tmp_path, SMALL)
    for executor in ("serial", "processes", "dask"):
        args = ["sweep", str(path), "--out", str(tmp_path / executor), "--executor", executor, "--quiet"]
        assert main(args + ([] if executor == "serial" else ["--workers", "2"])) == 0
    assert_same_results(tmp_path / "serial", tmp_path / "processes")
    assert_same_results(tmp_path / "serial", tmp_path / "dask")


def test_rerun_skips_finished_runs(tmp_path, capsys):
    path = write(tmp_path, SMALL)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial", "--quiet"]) == 0
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("runs/*/rounds.csv")}
    capsys.readouterr()
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial", "--quiet"]) == 0
    assert "0 computed, 12 already finished" in capsys.readouterr().out
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("runs/*/rounds.csv")}


def test_dask_missing_is_a_clear_error_before_writing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "dask", None)          # import dask.distributed now fails
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    out = tmp_path / "out"
    assert main(["sweep", str(write(tmp_path, SMALL)), "--out", str(out), "--executor", "dask"]) == 2
    assert "pip install 'linattn-theory[dask]'" in capsys.readouterr().err
    assert not out.exists()


def _break_runs(out: Path) -> dict[str, str]:
    """Damage three finished runs as a copy cut short or a bad disk would; ``{run_id: what}``."""
    ids = sorted(p.name for p in (out / "runs").iterdir())
    table = out / "runs" / ids[0] / "rounds.csv"
    lines = table.read_text().splitlines(keepends=True)
    table.write_text("".join(lines[:2]))                 # cut short: a header and round 0 remain
    (out / "runs" / ids[1] / "params.npz").write_bytes(b"garbage")
    (out / "runs" / ids[2] / "metadata.json").write_text("garbage")
    return {ids[0]: "rounds.csv does not match", ids[1]: "params.npz does not match",
            ids[2]: "metadata.json is not a run record"}


def test_broken_runs_are_named_never_loaded_as_finished_and_recomputed_on_resume(tmp_path, capsys):
    path = write(tmp_path, SMALL.replace("[0, 3, 6]", "[0, 6]").replace("[0.5, 2.0]", "[2.0]"))
    out, clean = tmp_path / "out", tmp_path / "clean"
    args = ["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet"]
    assert main(args) == 0
    run_sweep(load_sweep(path), clean)
    broken = _break_runs(out)
    first = next(run_id for run_id in load_sweep(path).run_ids if run_id in broken)   # in grid order
    with pytest.raises(RunIntegrityError, match=rf"runs/{first}: broken run: {broken[first]}.*"
                                                rf"\(2 more broken runs\)"):
        load_results(out)
    for run_id, what in broken.items():
        with pytest.raises(RunIntegrityError, match=rf"{run_id}: broken run: {what}"):
            load_run(out, run_id)
    capsys.readouterr()
    assert main(args) == 0
    assert "3 computed (3 of them recomputed because their files did not match" in capsys.readouterr().out
    assert_same_results(out, clean)


def test_a_run_s_files_are_not_flushed_and_what_a_power_cut_leaves_is_recomputed(tmp_path, monkeypatch, capsys):
    """``write_run`` renames its files into place without ``fsync`` (13 % of a 5,040-run sweep's time),
    every other atomic write flushes; what a power cut may then leave, a run's files renamed in place but
    empty beside its ``metadata.json``, reads as broken and a resumed sweep recomputes it, to the same results."""
    from linattn_theory import config_from_dict
    from linattn_theory.core import io as core_io

    synced = []
    monkeypatch.setattr(core_io.os, "fsync", lambda fd: synced.append(fd))
    core_io.write_run(simulate(config_from_dict({"federated": {"rounds": 2, "warmup_rounds": 1}})), tmp_path / "run")
    assert synced == [] and core_io.run_status(tmp_path / "run")[0] == "finished"
    core_io.atomic_write_bytes(tmp_path / "other.bin", b"abc")
    assert len(synced) == 1
    path = write(tmp_path, SMALL.replace("[0, 3, 6]", "[0, 6]").replace("[0.5, 2.0]", "[2.0]"))
    out, clean = tmp_path / "out", tmp_path / "clean"
    args = ["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet"]
    assert main(args) == 0
    run_sweep(load_sweep(path), clean)
    cut = out / "runs" / load_sweep(path).run_ids[0]
    for name in ("rounds.csv", "params.npz"):            # renamed in place, the data never written
        (cut / name).write_bytes(b"")
    assert core_io.run_status(cut)[0] == "broken"
    capsys.readouterr()
    assert main(args) == 0
    assert "1 computed (1 of them recomputed because their files did not match" in capsys.readouterr().out
    assert_same_results(out, clean)


def test_a_broken_run_is_exit_2_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "out"
    first = ["sweep", str(write(tmp_path, SMALL, "a.toml")), "--out", str(out), "--executor", "serial", "--quiet"]
    other = write(tmp_path, SMALL.replace("seed = [0, 1]", "seed = [2]"), "b.toml")
    second = ["sweep", str(other), "--out", str(out), "--executor", "serial", "--quiet", "--add"]
    assert main(first) == 0 and main(second) == 0
    a_run = load_sweep(tmp_path / "a.toml").run_ids[0]            # a run of the first sweep only
    (out / "runs" / a_run / "rounds.csv").write_text("round,loss\n0,1.0\n")
    capsys.readouterr()
    assert main(second) == 2                 # its runs are all there; the folder's summary is not
    err = capsys.readouterr().err
    assert f"runs/{a_run}: broken run: rounds.csv does not match" in err and "Traceback" not in err


def test_a_sweep_that_ends_writes_its_summary_table(tmp_path):
    out = tmp_path / "out"
    sweep = load_sweep(write(tmp_path, SMALL))
    done = run_sweep(sweep, out)
    summary = read_csv_exact(out / "summary.csv")
    results = load_results(out)
    assert list(summary["run_id"]) == sweep.run_ids == list(results["run_id"])
    np.testing.assert_array_equal(summary["final_loss"], results["final_loss"])      # exact round trip
    assert list(summary.columns) == list(results.columns)
    pd.testing.assert_frame_equal(done.table, results, check_exact=True)        # what the sweep hands back
    rerun = run_sweep(load_sweep(write(tmp_path, SMALL.replace("seed = [0, 1]", "seed = [0]"))), out,
                      existing="replace")
    pd.testing.assert_frame_equal(rerun.table, load_results(out), check_exact=True)
    assert rerun.computed == 0 and len(rerun.table) == len(results) // 2


def test_duplicate_grid_values_are_refused_but_grids_may_share_runs():
    data = {"federated": {"rounds": 4, "warmup_rounds": 2}, "grid": {"seed": [0, 1, 0]}}
    with pytest.raises(ConfigError, match=r"grid.seed = \[0, 1, 0\]: the value 0 is listed more than once"):
        sweep_from_dict(data)
    data["grid"] = {"seed": [0, 1]}
    with pytest.raises(ConfigError, match=r"--set seed = \[2, 2\]: the value 2 is listed more than once"):
        sweep_from_dict(data, overrides={"seed": [2, 2]})
    data["quick"] = {"seed": [1, 1]}
    with pytest.raises(ConfigError, match=r"quick.seed = \[1, 1\]: the value 1 is listed more than once"):
        sweep_from_dict(data, quick=True)


def test_set_overrides_and_print_config_resolve_the_sweep(tmp_path, capsys):
    import tomllib

    path = write(tmp_path, SMALL + "[quick]\nseed = [5]\n")
    overrides = ["federated.local_steps=3", "task.zeta_value=[0.25]"]
    args = ["sweep", str(path), "--quick", "--print-config"] + [a for o in overrides for a in ("--set", o)]
    assert main(args) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["federated"]["local_steps"] == 3 and "quick" not in printed
    assert printed["grid"]["seed"] == [5] and printed["grid"]["task.zeta_value"] == [0.25]
    expected = load_sweep(path, quick=True, overrides={"federated.local_steps": 3, "task.zeta_value": [0.25]})
    assert sweep_from_dict(printed).run_ids == expected.run_ids and len(expected) == 3
    assert all(c.federated.local_steps == 3 and c.task.zeta_value == 0.25 for c in expected.configs)
    assert not (tmp_path / "out").exists()
    assert main(["sweep", str(path), "--print-config"]) == 0          # without --quick: [quick] kept
    assert tomllib.loads(capsys.readouterr().out)["quick"] == {"seed": [5]}
    assert main(["sweep", str(path), "--set", "task.zeta_value=0.3", "--dry-run"]) == 2
    assert "task.zeta_value is a grid key; expected a non-empty list" in capsys.readouterr().err


def test_runs_are_grouped_by_instance_from_their_metadata_and_still_verified(tmp_path):
    """``runs_by_instance`` groups runs by problem instance reading only ``metadata.json``, yet a
    run whose metadata is garbled, or whose table was edited, still raises RunIntegrityError."""
    from linattn_theory.report import sweep_analysis

    path = tmp_path / "sweep.toml"
    path.write_text("seed = 0\n[task]\nnum_clients = 3\nsamples_per_client = 12\ntokens = 4\ndim = 3\n"
                    "rank = 2\noutputs = 1\n[model]\nrank = 2\n[federated]\nrounds = 3\nlocal_steps = 2\n"
                    "learning_rate = 0.02\n[grid]\nseed = [0, 1]\n\"federated.warmup_rounds\" = [0, 3]\n")
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out)
    results = load_results(out)
    groups = [list(runs) for _, runs in sweep_analysis.runs_by_instance(out, results)]
    seeds = [[int(results.set_index("run_id").loc[rid, "seed"]) for rid in group] for group in groups]
    assert seeds == [[0, 0], [1, 1]]                             # two instances, two T0 each
    rid = groups[1][0]
    table = out / "runs" / rid / "rounds.csv"
    table.write_bytes(table.read_bytes().replace(b"0.", b"1.", 1))
    with pytest.raises(RunIntegrityError, match=rid):
        list(sweep_analysis.runs_by_instance(out, results))
    (out / "runs" / rid / "metadata.json").write_text("{garbled")
    with pytest.raises(RunIntegrityError, match=rid):
        list(sweep_analysis.runs_by_instance(out, results))


def test_read_table_restores_float_columns_and_keeps_integer_ones():
    """A run's table reads back with every measurement float64 (a column of zeros included) and the
    round and participant counts as integers, whether or not a column needed the cast."""
    from linattn_theory.sim.sweep import read_table

    csv = b"round,participants,loss,kernel_drift,stage\n0,4,1.5,0,warmup\n1,4,1.25,0,warmup\n"
    table = read_table(csv)
    assert table["loss"].dtype == table["kernel_drift"].dtype == np.float64
    assert table["round"].dtype.kind == table["participants"].dtype.kind == "i"
    assert table["kernel_drift"].tolist() == [0.0, 0.0] and table["loss"].tolist() == [1.5, 1.25]
    assert read_table(b"round,loss\n0,1.5\n")["loss"].dtype == np.float64   # nothing to cast


@pytest.mark.parametrize("csv", [
    b"round,participants,loss,kernel_drift,stage,strategy\n0,4,1.5,0,init,fedfrozen\n1,4,1.25,0,warmup,fedfrozen\n",
    b"round,loss,flag,empty,words\n0,inf,True,,a\n1,-inf,False,,\n",          # bools, an empty column, a missing word
    b"round,big,negative,mixed\n0,18446744073709551615,-3,1\n1,1,-4,x\n",     # an unsigned, a word among numbers
    b"c,round\n1+2j,0.5\n", b"a\n\n", b"round,loss\n0,1e308\n"])
def test_read_table_casts_the_columns_select_dtypes_names(csv):
    """``read_table`` picks the numeric columns from read_csv's dtypes (NumPy's kinds ``iufc``; ``str`` and
    object are not numeric) instead of ``select_dtypes``, which with a Series per column took half the read:
    the same table, dtypes included, as casting every column ``select_dtypes(include="number")`` names."""
    from linattn_theory.core.io import read_csv_exact
    from linattn_theory.sim.sweep import read_table
    from linattn_theory.sim.sweep.store import _INTEGER_COLUMNS

    table = read_csv_exact(csv)
    cast = {c: "float64" for c in table.select_dtypes(include="number").columns
            if c not in _INTEGER_COLUMNS and table[c].dtype != "float64"}
    pd.testing.assert_frame_equal(read_table(csv), table.astype(cast) if cast else table, check_exact=True)


def test_read_table_reads_back_every_written_float_bit_for_bit():
    """A run's table is written with %.17g (core.io.write_run) and must read back exactly, whatever the
    pandas release (pandas 2's default parser is an ulp off for about a third of such values)."""
    from linattn_theory.sim.sweep import read_table

    values = np.random.default_rng(0).standard_normal((50, 4)) * np.logspace(-300, 300, 4)
    table = pd.DataFrame(values, columns=list("abcd")).assign(round=np.arange(50))
    back = read_table(table.to_csv(index=False, float_format="%.17g").encode())
    np.testing.assert_array_equal(back[list("abcd")].to_numpy(), values)


def _pandas_csv(table) -> bytes:
    return table.to_csv(index=False, float_format="%.17g").encode()


def _own_data_run(config):
    from linattn_theory import split_clients

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=60)
    X = rng.normal(size=(60, 4, 3)) + labels[:, None, None] * np.array([1.0, -1.0, 0.5])
    q = np.full((60, 3), 1 / np.sqrt(3))
    clients = split_clients(X, q, np.eye(3)[labels], labels, num_clients=3, test_fraction=0.25, seed=0)
    return simulate(config.with_updates({"model.heads": 1, "model.rank": 2}), clients)


_SMALL_TASK = {"num_clients": 3, "samples_per_client": 16, "tokens": 4, "dim": 3}
_ADAPTIVE_RULE = {"adaptive_confidence": 0.0, "adaptive_gain_confidence": 0.0, "adaptive_window": 2,
                  "adaptive_descent_confidence": float("inf")}


@pytest.mark.parametrize("data, run, diverged", [
    ({"federated": {"rounds": 8, "warmup_rounds": 3}}, simulate, False),
    ({"task": _SMALL_TASK, "federated": {"rounds": 8, "warmup_rounds": 8, "learning_rate": 5.0}}, simulate, True),
    ({"task": _SMALL_TASK, "federated": {"rounds": 10, "warmup_rounds": 10, "learning_rate": 0.02, "local_steps": 2,
                                         "strategy": "fedfrozen_adaptive", **_ADAPTIVE_RULE}}, simulate, False),
    ({"federated": {"strategy": "fedavg", "rounds": 4, "learning_rate": 0.2}}, _own_data_run, False),
], ids=["fedfrozen", "diverged", "fedfrozen_adaptive", "own_data_test_split"])
def test_a_runs_rounds_csv_is_the_bytes_pandas_writes(tmp_path, data, run, diverged):
    """write_run's rounds.csv (core.io.table_csv_bytes) is, byte for byte, pandas' ``to_csv(index=False,
    float_format="%.17g")`` of real run tables: 8 clients, a diverged run (NaN losses), the online rule
    and clients with a held-out split (test_loss, test_accuracy columns); and the fast path wrote it."""
    from linattn_theory import config_from_dict
    from linattn_theory.core.io import table_csv_bytes, write_run

    result = run(config_from_dict(data))
    expected = _pandas_csv(result.table)
    assert table_csv_bytes(result.table) == expected
    assert result.diverged == diverged == result.table.isna().any().any()
    assert ({"test_loss", "test_accuracy"} <= set(result.table.columns)) == (run is _own_data_run)
    write_run(result, tmp_path)
    assert (tmp_path / "rounds.csv").read_bytes() == expected
    with pytest.MonkeyPatch.context() as patch:               # the fast path, not pandas, wrote it
        patch.setattr(pd.DataFrame, "to_csv", lambda *args, **kwargs: pytest.fail("fell back to pandas"))
        assert table_csv_bytes(result.table) == expected


def _awkward_table():
    """Every kind of value a run table's dtypes can hold that a CSV writer may get wrong."""
    floats = [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-300, 5e-324, 1.7976931348623157e308, 0.1, -1 / 3, 1e16]
    rows = len(floats)
    strings = ["plain", "a,comma", 'a "quote"', "a\nnewline", "a\rreturn", "", " space ", "ζ_V", None, "nan",
               '"', ","]
    return pd.DataFrame({"round": np.arange(rows) - 3, "stage": strings, "loss": floats,
                         "loss_regularized": floats[::-1], "participants": np.arange(rows, dtype=np.uint8),
                         "diverged": np.arange(rows) % 3 == 0, "objects": pd.Series(strings, dtype=object),
                         'a "label", quoted': np.linspace(-1, 1, rows)},
                        index=np.arange(rows)[::-1] * 7)       # an index other than 0, 1, …: not written


def test_table_csv_bytes_writes_awkward_values_as_pandas_does():
    """table_csv_bytes equals pandas on NaN (both signs), ±inf, -0.0, subnormals, the largest double,
    strings with a comma, a quote, a newline or a return, empty and missing strings (str and object
    dtype), a quoted column label, int, uint8 and bool columns, a shuffled index; a table of no rows
    and a one-column table of empty strings (csv.writer quotes a row that is one empty field) too;
    and all of them on the fast path."""
    from linattn_theory.core.io import table_csv_bytes

    table = _awkward_table()
    tables = [table, table.iloc[:0], table.iloc[:, :1], pd.DataFrame({"stage": ["", "a"]}),
              pd.DataFrame({"loss": [np.nan, 1.0]})]
    expected = [_pandas_csv(t) for t in tables]
    assert b'"a,comma"' in expected[0] and b'"a ""quote"""' in expected[0] and b',-0,' in expected[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pd.DataFrame, "to_csv", lambda *args, **kwargs: pytest.fail("fell back to pandas"))
        for t, want in zip(tables, expected):
            assert table_csv_bytes(t) == want


def test_table_csv_bytes_leaves_other_dtypes_to_pandas():
    """A column of a dtype table_csv_bytes does not write itself (categorical, datetime, float32,
    nullable Int64 and Float64, objects that are not strings: NaT, which pandas writes as a missing
    value, and a float), column labels that are not strings
    or a MultiIndex, a table of no columns, and pandas 2 counting ±inf as missing: the bytes are
    still pandas'."""
    from linattn_theory.core.io import table_csv_bytes

    base = pd.DataFrame({"round": [0, 1, 2], "loss": [0.1, np.nan, -0.0]})
    tables = [base.assign(stage=pd.Categorical(["warmup", "frozen", "warmup"])),
              base.assign(when=pd.to_datetime(["2024-01-01", None, "2024-01-03"])),
              base.assign(loss=base["loss"].astype(np.float32)),
              base.assign(round=pd.array([0, None, 2], dtype="Int64")),
              base.assign(loss=pd.array([0.1, None, 1 / 3], dtype="Float64")),
              base.assign(mixed=pd.Series([pd.NaT, "a,b", 2.5], dtype=object)),
              base.set_axis([0, 1], axis=1),
              base.set_axis(pd.MultiIndex.from_tuples([("a", "round"), ("a", "loss")]), axis=1),
              pd.DataFrame(index=range(3))]
    for table in tables:
        assert table_csv_bytes(table) == _pandas_csv(table)
    if int(pd.__version__.split(".")[0]) < 3:                 # pandas 2's option: ±inf written as missing
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)              # the option is deprecated
            with pd.option_context("mode.use_inf_as_na", True):
                table = base.assign(loss=[np.inf, -np.inf, 1.0])
                assert table_csv_bytes(table) == _pandas_csv(table) == b"round,loss\n0,\n1,\n2,1\n"


def test_table_csv_bytes_writes_any_floats_strings_and_integers_as_pandas_does():
    """Property: for any float64 values (NaN, ±inf, subnormals), any strings or missing strings, any
    int64 and bool values, table_csv_bytes gives pandas' bytes."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from linattn_theory.core.io import table_csv_bytes

    row = st.tuples(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(allow_nan=True, allow_infinity=True, width=64, allow_subnormal=True),
                    st.none() | st.text(alphabet=st.sampled_from('ab ,"\n\r\tζ'), max_size=6), st.booleans())

    @settings(max_examples=60, deadline=None)
    @given(rows=st.lists(row, max_size=8))
    def check(rows):
        table = pd.DataFrame(rows, columns=["round", "loss", "kernel_drift", "stage", "diverged"])
        if rows:
            table = table.astype({"round": np.int64, "loss": np.float64, "kernel_drift": np.float64,
                                  "diverged": bool})
        assert table_csv_bytes(table) == _pandas_csv(table)

    check()


def test_the_lock_file_is_removed_when_a_sweep_ends_however_it_ends(tmp_path, monkeypatch):
    from linattn_theory.sim import sweep as sweep_module

    sweep = load_sweep(write(tmp_path, SMALL.replace("[0, 3, 6]", "[0]").replace("[0.5, 2.0]", "[2.0]")))
    run_sweep(sweep, tmp_path / "done")
    assert (tmp_path / "done" / "summary.csv").is_file() and not (tmp_path / "done" / ".sweep.lock").exists()

    def interrupted(*args, **kwargs):
        assert (tmp_path / "stopped" / ".sweep.lock").is_file()      # held while the runs compute
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "run_tasks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, tmp_path / "stopped")
    assert (tmp_path / "stopped" / "sweep.json").is_file() and not (tmp_path / "stopped" / ".sweep.lock").exists()


def test_a_waiting_writer_never_shares_the_lock_with_a_newcomer(tmp_path):
    """The holder removes the file it locked when it ends; a writer that waited on that file must
    not hold it while a newcomer locks the new file at the same path."""
    import threading

    from linattn_theory.sim.sweep import sweep_lock

    out = tmp_path / "out"
    held, release, waiter_has_it = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with sweep_lock(out):
            held.set()
            release.wait(30)

    def waiter():
        with sweep_lock(out, wait=True):
            waiter_has_it.set()
            time.sleep(1.0)

    first = threading.Thread(target=holder)
    first.start()
    held.wait(30)
    second = threading.Thread(target=waiter)
    second.start()
    time.sleep(0.3)                              # the waiter blocks on the holder's file
    release.set()
    first.join(30)
    assert waiter_has_it.wait(30)
    with pytest.raises(ConfigError, match="another sweep is writing to it"):
        with sweep_lock(out):                    # the newcomer finds the waiter holding the folder
            pass
    second.join(30)
    assert not (out / ".sweep.lock").exists()


DIVERGING = {"task": {"num_clients": 3, "samples_per_client": 16, "tokens": 4, "dim": 3},
             "federated": {"rounds": 8, "warmup_rounds": 8, "learning_rate": 5.0},
             "grid": {"federated.learning_rate": [0.01, 5.0, 50.0], "seed": [0, 1]}}


def test_a_sweeps_divergences_are_named_in_its_closing_line_and_may_be_an_error(tmp_path, capsys):
    from linattn_theory.sim.config import config_from_dict
    from linattn_theory.sim.sweep import SweepDiverged

    path = tmp_path / "diverging.toml"
    path.write_text('[task]\nnum_clients = 3\nsamples_per_client = 16\ntokens = 4\ndim = 3\n'
                    '[federated]\nrounds = 8\nwarmup_rounds = 8\n'
                    '[grid]\n"federated.learning_rate" = [0.01, 5.0, 50.0]\nseed = [0, 1]\n')
    out = tmp_path / "out"
    args = ["sweep", str(path), "--out", str(out), "--executor", "serial", "--quiet"]
    assert main(args) == 0
    line = capsys.readouterr().out
    results = load_results(out)
    diverged = results[results["diverged"]]
    assert len(diverged) == 4                                  # η = 5 and 50, both seeds
    metas = {r: json.loads((out / "runs" / r / "metadata.json").read_text()) for r in diverged["run_id"]}
    earliest = min(metas, key=lambda r: (metas[r]["divergence"]["round"],
                                         metas[r]["divergence"]["stable_learning_rate"]
                                         / metas[r]["config"]["federated"]["learning_rate"]))
    meta = metas[earliest]
    safe = min(m["divergence"]["stable_learning_rate"] for m in metas.values())
    assert (f"4 of 6 runs diverged; the earliest: run {earliest} (seed={meta['config']['seed']}, "
            f"federated.learning_rate={meta['config']['federated']['learning_rate']}) at round "
            f"{meta['divergence']['round']} with learning_rate") in line
    assert f"try η < {safe:.3g}" in line
    assert main(args + ["--fail-on-divergence"]) == 3         # already finished: still diverged
    assert "4 of 6 runs diverged" in capsys.readouterr().out

    sweep = sweep_from_dict(DIVERGING)
    with pytest.raises(SweepDiverged, match="4 of 6 runs diverged") as caught:
        run_sweep(sweep, tmp_path / "api", fail_on_divergence=True)
    summary = caught.value.summary
    assert summary.computed == 6 and (tmp_path / "api" / "summary.csv").is_file()
    assert {d.run_id for d in summary.divergences} == set(diverged["run_id"])
    assert all(d.learning_rate == config_from_dict(metas[d.run_id]["config"]).federated.learning_rate
               for d in summary.divergences)
    quiet = run_sweep(sweep_from_dict({**DIVERGING, "grid": {"federated.learning_rate": [0.01]}}), tmp_path / "ok",
                      fail_on_divergence=True)
    assert quiet.divergences == () and quiet.divergence_report() == ""
