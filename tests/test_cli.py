"""Command line: `linattn simulate` writes a run; invalid configs exit 2 and write nothing."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from linattn_theory.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]

VALID = """
seed = 0
[task]
num_clients = 3
samples_per_client = 16
tokens = 4
dim = 3
rank = 2
[model]
rank = 2
[federated]
rounds = 4
warmup_rounds = 2
local_steps = 2
learning_rate = 0.05
"""


def write(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_simulate_writes_table_params_and_metadata(tmp_path):
    out = tmp_path / "out"
    assert main(["simulate", str(write(tmp_path, VALID)), "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "rounds.csv")
    assert list(table["round"]) == [0, 1, 2, 3, 4]
    assert list(table["stage"]) == ["init", "warmup", "warmup", "frozen", "frozen"]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["federated"]["warmup_rounds"] == 2 and meta["seed"] == 0
    assert meta["version"] and meta["git_revision"] and meta["diverged"] is False
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    for name in ("rounds.csv", "params.npz"):            # content hashes, written last
        data = (out / name).read_bytes()
        assert meta["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_runs_record_their_provenance(tmp_path):
    import platform
    import socket
    from datetime import datetime, timezone

    import numpy as np

    before = datetime.now(timezone.utc).replace(microsecond=0)
    out = tmp_path / "out"
    assert main(["simulate", str(write(tmp_path, VALID)), "--out", str(out), "--quiet"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    record = meta["provenance"]
    started = datetime.fromisoformat(record["started"])
    assert before <= started <= datetime.now(timezone.utc) and 0 < record["wall_seconds"] < 60
    assert record["host"] == socket.gethostname() and record["python"] == platform.python_version()
    assert record["libraries"]["numpy"] == np.__version__ and record["libraries"]["pandas"] == pd.__version__
    in_checkout = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if in_checkout.returncode == 0:                # a source checkout: its commit and modified flag
        modified = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                  capture_output=True, text=True).stdout.strip() != ""
        assert meta["git_revision"] == in_checkout.stdout.strip() and meta["git_dirty"] is modified


def test_console_entry_point_runs_as_module(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "linattn_theory", "simulate",
                           str(write(tmp_path, VALID)), "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "rounds.csv").exists()


INVALID = {
    "unknown key": (VALID.replace("rounds = 4", "rounds = 4\nlocal_epochs = 3"), "federated.local_epochs: unknown key"),
    "unknown section": ("[optimizer]\nlr = 1\n", "optimizer: unknown key"),
    "wrong type": (VALID.replace("rounds = 4", 'rounds = "four"'), "federated.rounds = 'four': expected an integer"),
    "float for int": (VALID.replace("tokens = 4", "tokens = 4.5"), "task.tokens = 4.5: expected an integer"),
    "negative learning rate": (VALID.replace("learning_rate = 0.05", "learning_rate = -0.1"),
                               "federated.learning_rate = -0.1: expected a value > 0"),
    "warm-up longer than run": (VALID.replace("warmup_rounds = 2", "warmup_rounds = 9"),
                                "federated.warmup_rounds = 9: expected a value <= federated.rounds = 4"),
    "rank below one": (VALID.replace("[model]\nrank = 2", "[model]\nrank = 0"), "model.rank = 0: expected a value >= 1"),
    "participation zero": (VALID + "participation = 0.0\n", "federated.participation = 0.0: expected a value > 0"),
    "participation above one": (VALID + "participation = 1.5\n", "federated.participation = 1.5: expected a value <= 1"),
    "fedadam with FedAvg's server step": (VALID + 'strategy = "fedadam"\n',
                                          "federated.server_learning_rate = 1.0: FedAdam"),
    "bad choice": (VALID + 'strategy = "fedsgd"\n', "federated.strategy = 'fedsgd': expected one of"),
    "key of other family": (VALID.replace("[task]", '[task]\nzeta_task = 1.0'), "task.zeta_task: does not apply"),
    "not TOML": ("seed = = 1", "not valid TOML"),
}


@pytest.mark.parametrize("kind", sorted(INVALID))
@pytest.mark.parametrize("existing", [False, True])
def test_invalid_config_exits_2_and_writes_nothing(tmp_path, capsys, kind, existing):
    text, message = INVALID[kind]
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "keep.txt").write_text("earlier results")
    before = sorted(os.listdir(out)) if existing else None
    code = main(["simulate", str(write(tmp_path, text)), "--out", str(out), "--quiet"])
    assert code == 2
    assert message in capsys.readouterr().err
    if existing:
        assert sorted(os.listdir(out)) == before and (out / "keep.txt").read_text() == "earlier results"
    else:
        assert not out.exists()


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["simulate", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_diverged_run_exits_3_and_records_round(tmp_path, capsys):
    text = VALID.replace("learning_rate = 0.05", "learning_rate = 8.0").replace("rounds = 4", "rounds = 12")
    out = tmp_path / "out"
    assert main(["simulate", str(write(tmp_path, text)), "--out", str(out), "--quiet"]) == 3
    err = capsys.readouterr().err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["diverged"] is True
    assert f"diverged at round {meta['divergence']['round']}" in err and "try η <" in err


def test_divergence_advice_is_a_step_below_the_one_that_diverged(tmp_path, capsys):
    # the quick-start config at η = 0.3 diverges in round 1 while the curvature bound says 0.327
    config = ROOT / "simulations" / "configs" / "quickstart.toml"
    out = tmp_path / "out"
    assert main(["simulate", str(config), "--out", str(out), "--quiet",
                 "--set", "federated.learning_rate=0.3"]) == 3
    err = capsys.readouterr().err
    advised = float(re.search(r"try η < ([0-9.e+-]+)", err).group(1))
    stable = json.loads((out / "metadata.json").read_text())["divergence"]["stable_learning_rate"]
    assert advised < 0.3 and stable < 0.3 and advised == pytest.approx(stable, rel=1e-2)
    assert "does not explain this divergence" in err


@pytest.mark.parametrize("name", ["quickstart", "fedavg_minibatch", "in_context_regression"])
def test_example_run_configs_are_valid(name):
    from linattn_theory import load_config
    load_config(ROOT / "simulations" / "configs" / f"{name}.toml")


def test_recorded_config_round_trips(tmp_path):
    from linattn_theory import RunConfig, config_from_dict
    out = tmp_path / "out"
    assert main(["simulate", str(write(tmp_path, VALID)), "--out", str(out), "--quiet"]) == 0
    recorded = json.loads((out / "metadata.json").read_text())["config"]
    assert recorded["federated"]["batch_size"] is None
    config = config_from_dict(recorded)
    assert isinstance(config, RunConfig) and config.to_dict() == recorded


def test_derive_runs_every_script_and_fails_on_any_failure(tmp_path, capsys):
    folder = tmp_path / "derivations"
    folder.mkdir()
    (folder / "_helpers.py").write_text("raise SystemExit(1)\n")          # not a derivation
    (folder / "holds.py").write_text("print('PASS: a claim')\n")
    (folder / "books.py").write_text("print('PASS: a claim'); print('BOOKKEEPING: a definition')\n")
    assert main(["derive", "--root", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2 derivations passed, 0 failed; claims: 2 hold, 0 fail; 1 bookkeeping" in out
    assert "PASS: derivations/books.py (1 claims hold, 0 fail, 1 bookkeeping)" in out
    # bookkeeping alone is no evidence: a script whose only statements hold by definition fails
    (folder / "only_books.py").write_text("print('BOOKKEEPING: a definition')\n")
    assert main(["derive", "--root", str(tmp_path), "--quiet", "--only", "only_books"]) == 1
    assert "FAIL: derivations/only_books.py (0 claims hold, 0 fail, 1 bookkeeping)" in capsys.readouterr().out
    (folder / "only_books.py").unlink()
    (folder / "breaks.py").write_text("print('FAIL: a claim'); raise SystemExit(1)\n")
    assert main(["derive", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: derivations/breaks.py" in out and "2 derivations passed, 1 failed" in out
    assert main(["derive", "--root", str(tmp_path), "--only", "nope"]) == 2


def test_results_get_the_usual_file_permissions(tmp_path):
    from linattn_theory.core.io import atomic_write_text
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "a" / "x.txt", "hello")
    finally:
        os.umask(old)
    assert path.read_text() == "hello" and (path.stat().st_mode & 0o777) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["x.txt"]


def test_print_config_resolves_set_overrides_and_writes_nothing(tmp_path, capsys):
    import tomllib

    from linattn_theory import config_from_dict, load_config
    from linattn_theory.sim.config import config_hash

    path = write(tmp_path, VALID)
    for command in (["simulate", "--out", str(tmp_path / "out")], ["recommend"]):
        code = main([command[0], str(path), *command[1:], "--set", "federated.rounds=7", "--set",
                     'federated.strategy="fedavg"', "--set", "task.noise=0.25", "--print-config"])
        assert code == 0
        printed = tomllib.loads(capsys.readouterr().out)
        (tmp_path / "printed.toml").write_text(VALID.replace("rounds = 4", "rounds = 7")
                                               .replace("[task]", "[task]\nnoise = 0.25")
                                               + 'strategy = "fedavg"\n')
        assert config_hash(config_from_dict(printed)) == config_hash(load_config(tmp_path / "printed.toml"))
    assert not (tmp_path / "out").exists()


def test_examples_copy_ships_the_figure_scripts_derivations_and_the_notebook(tmp_path, capsys):
    assert main(["examples", "--copy", str(tmp_path / "mine")]) == 0
    for name in ("simulations/configs/quickstart.toml", "derivations/gradients.py",
                 "notebooks/bias_drift_tradeoff.py", "notebooks/solutions.py", "notebooks/execute.py"):
        assert (tmp_path / "mine" / name).is_file(), name
    assert "bias_drift_tradeoff.py" in capsys.readouterr().out
    assert main(["examples", "--copy", str(tmp_path / "mine")]) == 2         # never over a copy
    assert "invalid argument: --copy" in capsys.readouterr().err
