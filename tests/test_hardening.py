"""Hardening: every bad input refused before any work (exit 2, one line, nothing written), one
error boundary per command, and no sweep worker outliving its sweep (docs/cli.md)."""

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory import Params, kernel, load_results, loss_and_grad, predict, simulate
from linattn_theory.cli.commands import main
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import config_from_dict, ignored_settings

ROOT = Path(__file__).resolve().parents[1]

VALID = """
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
rounds = 4
warmup_rounds = 2
local_steps = 2
learning_rate = 0.05
"""

SWEEP = VALID + """
[grid]
seed = [0, 1]
"""


def write(tmp_path, content, name="run.toml"):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def replace(old, new, text=VALID):
    assert old in text
    return text.replace(old, new)


# kind of docs/cli.md's table -> (command arguments given tmp_path, message expected on stderr)
def _cases():
    def simulate_text(text, *extra):
        return lambda tmp: ["simulate", str(write(tmp, text)), "--out", str(tmp / "out"), *extra]

    def sweep_text(text, *extra):
        return lambda tmp: ["sweep", str(write(tmp, text)), "--out", str(tmp / "out"), "--executor",
                            "serial", *extra]

    def out_file(tmp):
        (tmp / "a_file").write_text("x")
        return ["simulate", str(write(tmp, VALID)), "--out", str(tmp / "a_file" / "sub")]

    return {
        "missing config": (lambda tmp: ["simulate", str(tmp / "nope.toml"), "--out", str(tmp / "out")],
                           "does not exist"),
        "folder as config": (lambda tmp: ["simulate", str(tmp), "--out", str(tmp / "out")], "is a folder"),
        "binary config": (simulate_text(b"\x00\x01seed = 1\n"), "is a binary file"),
        "non-UTF-8 config": (simulate_text(VALID.replace("seed = 0", "# café\nseed = 0").encode("latin-1")),
                             "is not UTF-8 text"),
        "empty config": (simulate_text("# only a comment\n"), "is empty"),
        "invalid TOML": (simulate_text("seed = = 1"), "not valid TOML"),
        "unknown key": (simulate_text(replace("rounds = 4", "rounds = 4\nlocal_epochs = 3")),
                        "federated.local_epochs: unknown key"),
        "wrong type": (simulate_text(replace("seed = 0", "seed = true")), "seed = True: expected an integer"),
        "out of range": (simulate_text(replace("learning_rate = 0.05", "learning_rate = -0.1")),
                         "federated.learning_rate = -0.1: expected a value > 0"),
        "non-finite number": (simulate_text(replace("[model]", "noise = inf\n[model]")),
                              "task.noise = inf: expected a finite number"),
        "a step size and a step scale": (simulate_text(VALID + "step_scale = 0.5\n"),
                                         "federated.learning_rate = 0.05 and federated.step_scale = 0.5: "
                                         "give one of them"),
        "key of another task family": (simulate_text(replace("[task]", "[task]\nzeta_task = 1.0")),
                                       "task.zeta_task: does not apply"),
        "more clients than the data allow": (
            simulate_text('[task]\nfamily = "digits"\nnum_clients = 1000\n[federated]\nrounds = 2\n'
                          'warmup_rounds = 1\n'),
            "task.num_clients = 1000: expected a value <= 673 for family 'digits'"),
        "sweep file given to recommend": (lambda tmp: ["recommend", str(write(tmp, SWEEP))],
                                          "is a sweep file (it has a [grid] table); give one run's config"),
        "--quick without [quick]": (sweep_text(SWEEP, "--quick"), "has no [quick] table, so --quick would run"),
        "value listed twice in a grid": (sweep_text(VALID + "[grid]\nseed = [0, 0, 1]\n"),
                                         "grid.seed = [0, 0, 1]: the value 0 is listed more than once"),
        "bad --set": (simulate_text(VALID, "--set", "federated.roundz=3"), "federated.roundz: unknown key"),
        "batch larger than a client": (simulate_text(VALID + "batch_size = 17\n"),
                                       "federated.batch_size = 17: expected a value <= task.samples_per_client = 16"),
        "sweep file given to simulate": (simulate_text(SWEEP), "run it with `linattn sweep"),
        "bad --out": (out_file, "a_file' is a file, not a folder"),
        "too much memory": (simulate_text(replace("dim = 3", "dim = 1000000")),
                            "estimated memory"),
        "too long": (simulate_text(replace("local_steps = 2", "local_steps = 100000000")),
                     "estimated running time"),
        "huge grid": (sweep_text(VALID + '[grid]\nseed = [' + ", ".join(map(str, range(1000))) + ']\n'
                                 '"task.noise" = [' + ", ".join(f"{i / 1000}" for i in range(1000)) + ']\n'),
                      "grid: 1000000 runs, above the limit of 10000 runs"),
        "bad executor options": (lambda tmp: ["sweep", str(write(tmp, SWEEP)), "--out", str(tmp / "out"),
                                              "--workers", "0"], "workers = 0"),
        "bad flag value": (lambda tmp: ["figures", "--root", str(ROOT), "--only", "tradeof", "--out", str(tmp / "out")],
                           "invalid argument: --only 'tradeof': no such figure script (did you mean 'tradeoff'?)"),
        "unreachable Dask scheduler": (lambda tmp: ["sweep", str(write(tmp, SWEEP)), "--out", str(tmp / "out"),
                                                    "--executor", "dask", "--scheduler", "tcp://127.0.0.1:1"],
                                       "no Dask scheduler reachable"),
    }


CASES = _cases()
#: kinds of the table tested elsewhere in this file (not a plain "exit 2, nothing written")
OTHER_TESTS = {"UTF-8 BOM", "setting the strategy ignores", "folder of another sweep",
               "failure inside a run", "Ctrl-C / SIGTERM", "simulate into a sweep or run folder",
               "quick figures over the full-size ones", "sweep folder in use", "broken run on disk",
               "bad client data", "settings to revisit"}


def test_every_documented_bad_input_has_a_case():
    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "docs" / "cli_checks.toml").read_text())
    assert {row["kind"] for row in declared["bad_input"]} == set(CASES) | OTHER_TESTS


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, kind):
    if kind == "unreachable Dask scheduler":
        pytest.importorskip("dask.distributed")
    args, message = CASES[kind]
    argv = args(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert seconds < 30, f"refusing {kind!r} took {seconds:.1f} s"   # refused before any work


def test_utf8_bom_is_accepted(tmp_path):
    path = write(tmp_path, "\ufeff".encode() + VALID.encode())
    assert main(["simulate", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert (tmp_path / "out" / "metadata.json").is_file()


def test_empty_out_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, VALID)
    assert main(["simulate", "run.toml", "--out", ""]) == 2
    assert "expected a folder name" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["run.toml"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_out_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert main(["simulate", str(write(tmp_path, VALID)), "--out", str(locked / "out")]) == 2
    assert "is not writable" in capsys.readouterr().err


def test_ignored_setting_is_warned_about(tmp_path, capsys):
    text = replace("learning_rate = 0.05", 'learning_rate = 0.05\nstrategy = "fedavg"\nprox_mu = 0.5')
    assert main(["simulate", str(write(tmp_path, text)), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "warning: federated.prox_mu = 0.5 is ignored by strategy 'fedavg'" in err
    config = config_from_dict({"federated": {"strategy": "fedprox", "prox_mu": 0.5}})
    assert ignored_settings(config) == []


def test_batch_above_a_skewed_client_warns(recwarn):
    config = config_from_dict({"task": {"num_clients": 4, "samples_per_client": 8, "tokens": 3,
                                        "dim": 2, "dirichlet_alpha": 0.05},
                               "federated": {"rounds": 1, "warmup_rounds": 1, "batch_size": 4}})
    simulate(config)
    assert any("with replacement" in str(w.message) for w in recwarn.list)


def test_limits_can_be_raised(tmp_path, capsys):
    text = replace("local_steps = 2", "local_steps = 200")
    args = ["simulate", str(write(tmp_path, text)), "--out", str(tmp_path / "out"), "--quiet"]
    assert main(args + ["--max-hours", "1e-6"]) == 2
    assert "--max-hours" in capsys.readouterr().err
    assert main(args + ["--max-memory-gb", "1e-6"]) == 2
    assert "--max-memory-gb" in capsys.readouterr().err
    assert main(args + ["--max-hours", "0"]) == 0


def test_unexpected_failure_exits_1_with_one_line_and_debug_traceback(tmp_path, capsys, monkeypatch):
    import linattn_theory.sim.engine as federated

    def broken(*args, **kwargs):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(federated, "simulate", broken)
    args = ["simulate", str(write(tmp_path, VALID)), "--out", str(tmp_path / "out")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("linattn simulate: error: RuntimeError: a bug over two lines "
                           "(rerun with --debug for the traceback)")
    with pytest.raises(RuntimeError, match="a bug"):
        main(args + ["--debug"])
    assert not (tmp_path / "out").exists()


def test_ctrl_c_exits_130_saying_what_was_kept(tmp_path, capsys, monkeypatch):
    import linattn_theory.sim.engine as federated
    import linattn_theory.sim.sweep as sweep_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(federated, "simulate", interrupted)
    out = tmp_path / "out"
    assert main(["simulate", str(write(tmp_path, VALID)), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted; nothing was written to {out}" in err and "Traceback" not in err
    assert "resume" not in err                   # simulate cannot resume
    assert not out.exists()
    monkeypatch.undo()

    first = write(tmp_path, SWEEP, "sweep.toml")
    assert main(["sweep", str(first), "--out", str(out), "--executor", "serial", "--quiet"]) == 0
    assert len(pd.read_csv(out / "summary.csv")) == 2
    stored = []
    store = sweep_module.store_run

    def store_once(run_id, result, folder):       # Ctrl-C after the first run is written
        if stored:
            raise KeyboardInterrupt
        stored.append(run_id)
        return store(run_id, result, folder)

    monkeypatch.setattr(sweep_module, "store_run", store_once)
    args = ["sweep", str(write(tmp_path, SWEEP.replace("seed = [0, 1]", "seed = [2, 3]"), "more.toml")),
            "--out", str(out), "--executor", "serial", "--quiet", "--add"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert f"interrupted; 1 of 2 runs are finished in {out}; rerun the same command to resume" in err
    assert not (out / "summary.csv").exists()     # the old one no longer describes the folder
    monkeypatch.undo()
    assert main(args) == 0 and "1 computed" in capsys.readouterr().out
    assert len(pd.read_csv(out / "summary.csv")) == 4


def test_simulate_refuses_a_sweep_folder_and_an_existing_run_unless_overwrite(tmp_path, capsys):
    sweep_out = tmp_path / "sweep"
    assert main(["sweep", str(write(tmp_path, SWEEP, "sweep.toml")), "--out", str(sweep_out),
                 "--executor", "serial", "--quiet"]) == 0
    run_file = write(tmp_path, VALID)
    assert main(["simulate", str(run_file), "--out", str(sweep_out), "--overwrite"]) == 2
    assert "is a sweep folder" in capsys.readouterr().err
    assert not (sweep_out / "metadata.json").exists() and len(load_results(sweep_out)) == 2

    out = tmp_path / "run"
    assert main(["simulate", str(run_file), "--out", str(out), "--quiet"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["simulate", str(run_file), "--out", str(out), "--quiet", "--set", "seed=1"]) == 2
    assert "already holds a run (metadata.json, rounds.csv, params.npz)" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["simulate", str(run_file), "--out", str(out), "--quiet", "--set", "seed=1",
                 "--overwrite"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["seed"] == 1 and meta["overrides"] == ["seed=1"]
    assert (out / "rounds.csv").read_bytes() != before["rounds.csv"]


def test_quick_figures_never_replace_the_full_size_ones(tmp_path, capsys, monkeypatch):
    (tmp_path / "simulations").mkdir()
    (tmp_path / "simulations" / "tiny.py").write_text(
        "from pathlib import Path\n\n\ndef make(out_dir, quick=False):\n"
        "    path = Path(out_dir) / 'tiny.png'\n    path.parent.mkdir(parents=True, exist_ok=True)\n"
        "    path.write_text('quick' if quick else 'full')\n    return [path]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["figures", "--quiet"]) == 0
    committed = tmp_path / "figures" / "tiny.png"
    assert committed.read_text() == "full"
    assert main(["figures", "--quick", "--quiet"]) == 0
    assert (tmp_path / "results" / "figures-quick" / "tiny.png").read_text() == "quick"
    assert main(["figures", "--quick", "--quiet", "--out", "figures"]) == 2
    assert "the full-size figures there would be overwritten" in capsys.readouterr().err
    assert committed.read_text() == "full"
    assert main(["figures", "--quick", "--quiet", "--out", "figures", "--overwrite"]) == 0
    assert committed.read_text() == "quick"


def test_a_second_sweep_into_a_busy_folder_refuses_or_waits(tmp_path, capsys):
    import threading

    from linattn_theory.sim.sweep import sweep_lock

    out = tmp_path / "out"
    args = ["sweep", str(write(tmp_path, SWEEP, "sweep.toml")), "--out", str(out), "--executor", "serial",
            "--quiet"]
    with sweep_lock(out):                         # another writer holds the folder
        assert main(args) == 2
    err = capsys.readouterr().err
    assert f"another sweep is writing to it (pid {os.getpid()} on " in err and "--wait" in err
    assert not (out / "sweep.json").exists()

    held, release = threading.Event(), threading.Event()

    def writer():
        with sweep_lock(out):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    held.wait(30)
    threading.Timer(1.0, release.set).start()
    start = time.perf_counter()
    try:
        assert main(args + ["--wait"]) == 0
    finally:
        release.set()
        thread.join(30)
    assert time.perf_counter() - start >= 0.9     # it waited for the other writer to end
    captured = capsys.readouterr()
    assert f"waiting for the sweep writing to {out} to end (pid {os.getpid()}" in captured.err
    assert "2 computed" in captured.out and len(load_results(out)) == 2


def test_second_sweep_with_another_grid_is_refused_or_added(tmp_path, capsys):
    out = tmp_path / "out"
    first = ["sweep", str(write(tmp_path, SWEEP, "a.toml")), "--out", str(out), "--executor", "serial",
             "--quiet"]
    assert main(first) == 0
    other = write(tmp_path, SWEEP.replace("seed = [0, 1]", "seed = [1, 2, 3]"), "b.toml")
    second = ["sweep", str(other), "--out", str(out), "--executor", "serial", "--quiet"]
    manifest = (out / "sweep.json").read_text()
    assert main(second) == 2
    assert "holds another sweep" in capsys.readouterr().err
    assert (out / "sweep.json").read_text() == manifest and len(load_results(out)) == 2
    assert main(second + ["--add"]) == 0
    assert len(load_results(out)) == 4 and len(json.loads((out / "sweep.json").read_text())["runs"]) == 4
    assert main(first) == 2            # the folder now holds the union, not the first grid


def _pool_workers(psutil, parent):
    """The live forked workers of ``parent``: children running the parent's own command line in two looks
    0.2 s apart.

    A sweep also runs short-lived children of its own (``git rev-parse`` for the manifest) while
    its pool starts; counting every child made the check flaky (CI, 2026-12-02: a third, already
    terminated child), so only the forked copies of the parent count. A child forked to run a command
    shows the parent's command line too until it runs it (CI, 2026-12-05: again a third child, terminated
    by the time it was printed); a pool worker keeps it, so a child counts only when both looks see it."""
    def forked_copies():
        copies = {}
        for child in parent.children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and child.cmdline() == parent.cmdline():
                    copies[child.pid] = child
            except psutil.NoSuchProcess:
                pass
        return copies

    first = forked_copies()
    time.sleep(0.2)
    return [child for pid, child in sorted(forked_copies().items()) if pid in first]


def _sweep_children(tmp_path, sig):
    """Start a processes sweep, wait for its two workers, send ``sig``; the workers' pids."""
    psutil = pytest.importorskip("psutil")
    text = VALID.replace("rounds = 4", "rounds = 100000").replace("warmup_rounds = 2", "warmup_rounds = 0")
    path = write(tmp_path, text + "[grid]\nseed = [0, 1, 2, 3]\n")
    proc = subprocess.Popen([sys.executable, "-m", "linattn_theory", "sweep", str(path), "--out",
                             str(tmp_path / "out"), "--workers", "2", "--quiet"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    children = []
    while time.monotonic() < deadline and len(children) < 2 and proc.poll() is None:
        children = _pool_workers(psutil, parent)
        time.sleep(0.05)
    assert len(children) == 2, "the sweep did not start two workers"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [c for c in alive if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    return proc.returncode, err, alive


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_worker_outlives_a_killed_sweep(tmp_path, sig):
    code, err, alive = _sweep_children(tmp_path, sig)
    for child in alive:                 # do not leave them running when the check fails
        child.kill()
    assert alive == [], f"workers {[c.pid for c in alive]} outlived the sweep"
    if sig == signal.SIGTERM:
        assert code == 143 and "stopped by SIGTERM" in err and "Traceback" not in err
        assert "leaked" not in err


def test_figures_names_the_files_it_wrote(tmp_path, capsys):
    (tmp_path / "simulations").mkdir()
    (tmp_path / "simulations" / "tiny.py").write_text(
        "from pathlib import Path\n\n\ndef make(out_dir, quick=False):\n"
        "    path = Path(out_dir) / 'tiny.png'\n    path.parent.mkdir(parents=True, exist_ok=True)\n"
        "    path.write_bytes(b'png')\n    return [path]\n")
    out = tmp_path / "figs"
    assert main(["figures", "--root", str(tmp_path), "--out", str(out), "--quiet"]) == 0
    assert f"wrote {out / 'tiny.png'}" in capsys.readouterr().out


def test_revision_and_modified_flag_recorded_at_build_time_are_used_outside_a_checkout(tmp_path):
    import shutil
    package = tmp_path / "site" / "linattn_theory"
    shutil.copytree(ROOT / "linattn_theory", package,      # the package without a record (an sdist has one)
                    ignore=shutil.ignore_patterns("__pycache__", "_revision.txt"))
    code = ("from pathlib import Path; from linattn_theory.core.io import _git_state; print(*_git_state()); "
            "p = Path(__import__('linattn_theory').__file__).with_name('_revision.txt'); "
            "p.write_text('0123abcd\\n'); print(*_git_state()); "
            "p.write_text('0123abcd\\ndirty\\n'); print(*_git_state())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(package.parent)},
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["unknown None", "0123abcd False", "0123abcd True"]


def test_a_checkout_records_whether_tracked_files_were_modified(tmp_path):
    from linattn_theory.core.io import _git_state

    repo = tmp_path / "repo"
    package = (repo / "linattn_theory")
    package.mkdir(parents=True)
    (package / "model.py").write_text("a = 1\n")

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    revision = git("rev-parse", "HEAD")
    assert _git_state(package.resolve()) == (revision, False)
    (repo / "notes.txt").write_text("untracked files do not change the code that ran")
    assert _git_state(package.resolve()) == (revision, False)
    (package / "model.py").write_text("a = 2\n")
    assert _git_state(package.resolve()) == (revision, True)


# -- the Python API ---------------------------------------------------------------------------

def _batch(B=5, n=4, d=3, p=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(B, n, d))
    return X, X[:, -1, :].copy(), rng.normal(size=(B, p))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_parameters_are_refused(bad):
    params = Params.init(3, 2, 2)
    X, q, y = _batch()
    broken = params.replace(WV=np.where(np.arange(params.WV.size).reshape(params.WV.shape) == 1, bad, params.WV))
    with pytest.raises(ValueError, match="params.WV contains non-finite"):
        predict(broken, X, q)
    with pytest.raises(ValueError, match="params.WV contains non-finite"):
        loss_and_grad(broken, X, q, y)
    config = config_from_dict({"task": {"num_clients": 2, "samples_per_client": 4, "tokens": 4, "dim": 3},
                               "federated": {"rounds": 1, "warmup_rounds": 1}})
    with pytest.raises(ValueError, match="non-finite"):
        simulate(config, params=broken)


def test_malformed_parameters_and_batches_are_refused():
    params = Params.init(3, 2, 2)
    X, q, y = _batch()
    with pytest.raises(ValueError, match=r"params.WQ has shape \(3, 2\); expected \(H, d, r\)"):
        predict(params.replace(WQ=params.WQ[0]), X, q)
    with pytest.raises(ValueError, match="empty batch"):
        loss_and_grad(params, X[:0], q[:0], y[:0])
    with pytest.raises(ValueError, match="expected the same shape"):
        kernel(params.replace(WK=np.zeros((1, 4, 2))))


def test_load_results_on_a_wrong_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_results(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="neither a sweep folder"):
        load_results(tmp_path)
    with pytest.raises(ConfigError):
        config_from_dict({"federated": {"batch_size": 200}})


def test_float32_steps_below_the_parameters_resolution_are_warned_about():
    config = config_from_dict({"model": {"dtype": "float32"},
                               "task": {"num_clients": 4, "samples_per_client": 32, "tokens": 4, "dim": 3},
                               "federated": {"rounds": 5, "warmup_rounds": 2, "learning_rate": 1e-9}})
    with pytest.warns(RuntimeWarning, match="model.dtype = 'float32': the first local step with "
                                            "federated.learning_rate = 1e-09 changes 0% of the entries"):
        stalled = simulate(config)
    assert stalled.table["loss"].nunique() == 1           # the claim: nothing moved in 5 rounds
    with warnings.catch_warnings():
        warnings.simplefilter("error")                    # a usable step: no warning
        moving = simulate(config.with_updates({"federated.learning_rate": 0.05}))
    assert moving.table["loss"].iloc[-1] < moving.table["loss"].iloc[0]


def _clients(m=3, N=12, n=4, d=3, p=1, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(N, n, d)), rng.normal(size=(N, d)), rng.normal(size=(N, p))) for _ in range(m)]


def _with(clients, c, array, value):
    """``clients`` with client ``c``'s array (0: X, 1: q, 2: y) replaced by ``value``."""
    out = [list(client) for client in clients]
    out[c][array] = value
    return [tuple(client) for client in out]


def _nan_at(a, index, value=np.nan):
    a = a.copy()
    a[index] = value
    return a


BAD_CLIENTS = {
    "NaN in X": (lambda cs: _with(cs, 1, 0, _nan_at(cs[1][0], (0, 2, 1))),
                 "client 1: X holds 1 non-finite value (the first: X[0, 2, 1] = nan)"),
    "inf in y": (lambda cs: _with(cs, 2, 2, _nan_at(_nan_at(cs[2][2], (3, 0), np.inf), (5, 0), -np.inf)),
                 "client 2: y holds 2 non-finite values (the first: y[3, 0] = inf)"),
    "X without a token axis": (lambda cs: _with(cs, 0, 0, cs[0][0][:, 0, :]),
                               "client 0: X has shape (12, 3); expected (N, n, d)"),
    "q of another dimension": (lambda cs: _with(cs, 1, 1, cs[1][1][:, :2]),
                               "client 1: q has shape (12, 2); expected (N, d) = (12, 3)"),
    "X of another dimension": (lambda cs: _with(cs, 2, 0, cs[2][0][..., :2]),
                               "client 2: X has shape (12, 4, 2); expected (N, 4, 3) as the first client's"),
    "text in q": (lambda cs: _with(cs, 0, 1, cs[0][1].astype(str)), "client 0: q has dtype <U"),
}


@pytest.mark.parametrize("kind", sorted(BAD_CLIENTS))
def test_bad_client_data_is_refused_before_any_round_naming_the_client_and_the_array(kind, monkeypatch):
    from linattn_theory import simulate_many
    from linattn_theory.sim import engine

    def no_round(*args, **kwargs):
        raise AssertionError("a round ran on bad data")

    monkeypatch.setattr(engine, "run_schedule", no_round)
    config = config_from_dict({"model": {"rank": 2}, "federated": {"rounds": 3, "warmup_rounds": 1}})
    make, message = BAD_CLIENTS[kind]
    clients = make(_clients())
    for run in (lambda: simulate(config, clients), lambda: simulate_many([config, config], [clients, clients])):
        with pytest.raises(ValueError) as caught:
            run()
        assert str(caught.value).startswith(message), str(caught.value)


def test_bad_client_weights_are_refused():
    from linattn_theory.core.clients import FederatedDataset, check_clients

    clients = tuple(check_clients(_clients()).clients)
    assert check_clients(FederatedDataset(clients, np.array([0.5, 0.5, 0.0]))).weights[2] == 0
    for weights in ([0.5, 0.5, -0.1], [np.nan, 0.5, 0.5], [0.0, 0.0, 0.0], [0.5, 0.5]):
        with pytest.raises(ValueError, match=r"^clients: weights"):
            check_clients(FederatedDataset(clients, np.array(weights)))


def test_settings_to_revisit_are_warned_about_once(tmp_path, capsys, monkeypatch):
    from linattn_theory import simulate_many
    from linattn_theory.core.errors import SettingWarning
    from linattn_theory.sim import limits

    config = config_from_dict({"model": {"rank": 4}, "federated": {"rounds": 2, "warmup_rounds": 1}})
    with pytest.warns(SettingWarning) as caught:
        simulate(config, _clients(m=1))              # d = 3 from the data (task.dim is 6), m = 1
    assert [str(w.message)[:58] for w in caught] == [
        "model.rank = 4 is above the token dimension d = 3: each he", "the federation has one client (m = 1): "
        "no heterogeneity, s"]
    assert all(w.filename == __file__ for w in caught)     # pointing at the caller's line
    with pytest.warns(SettingWarning) as caught:
        simulate_many([config, config.with_updates({"seed": 1})], [_clients(m=1), _clients(m=1, seed=1)])
    assert len(caught) == 2 and all(w.filename == __file__ for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # d = 6 >= rank 3, m = 8: nothing to say
        assert not limits.setting_notes(config_from_dict({}))
    assert "d = 5" in limits.setting_notes(config_from_dict({"task": {"family": "in_context_regression",
                                                                      "dim": 4}, "model": {"rank": 6}}))[0]

    text = replace("[model]\nrank = 2", "[model]\nrank = 4") + "[grid]\nseed = [0, 1]\n"
    monkeypatch.setattr(limits, "usable_cores", lambda: 1)
    args = ["sweep", str(write(tmp_path, text)), "--out", str(tmp_path / "out"), "--quiet"]
    assert main(args + ["--executor", "processes", "--workers", "2"]) == 0
    err = capsys.readouterr().err
    assert err.count("linattn sweep: warning: model.rank = 4 is above the token dimension d = 3") == 1, err
    assert "linattn sweep: warning: --workers = 2 is above the 1 cores this process may use" in err
    args[-2] = str(tmp_path / "serial")
    assert main(args + ["--executor", "serial", "--workers", "2"]) == 0      # runs in this process: said once
    err = capsys.readouterr().err
    assert err.count("warning: model.rank = 4") == 1 and "--workers" not in err, err
