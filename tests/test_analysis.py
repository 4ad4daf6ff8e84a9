"""`linattn analyze` / analyze_sweep: R(T0), its parts and the best T0 per instance of a finished sweep,
from the sweep folder alone (docs/howto/analyze-sweep.md, docs/theory.md §6)."""

import numpy as np
import pandas as pd
import pytest

from linattn_theory import analyze_sweep, load_config, load_run, load_sweep, run_sweep
from linattn_theory.cli.commands import main
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import config_from_dict
from linattn_theory.sim.engine import clients_from_config
from linattn_theory.theory.decomposition import decompose_excess_risk

SWEEP = """seed = 0
[task]
num_clients = 4
samples_per_client = 32
tokens = 8
dim = 5
zeta_value = 3.0
[federated]
rounds = 12
local_steps = 10
[grid]
"federated.warmup_rounds" = [0, 4, 8, 12]
seed = [0, 1]
"federated.learning_rate" = [0.02, 3.0]
"""


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("analyze")
    (folder / "sweep.toml").write_text(SWEEP)
    run_sweep(load_sweep(folder / "sweep.toml"), folder / "out")
    (folder / "sweep.toml").unlink()                  # the analysis needs the folder alone
    return folder / "out"


def test_analyze_writes_the_excess_risk_its_parts_and_the_best_warmup_per_instance(sweep_dir, capsys):
    assert main(["analyze", str(sweep_dir)]) == 0
    printed = capsys.readouterr().out
    runs = pd.read_csv(sweep_dir / "excess_risk.csv")
    best = pd.read_csv(sweep_dir / "best_warmup.csv")
    assert not (sweep_dir / ".sweep.lock").exists()
    assert len(runs) == 16 and len(best) == 4              # 2 seeds x 2 steps, 4 warm-up lengths each
    # an instance is the runs that differ only in the warm-up length
    for _, group in runs.groupby("instance"):
        assert sorted(group["T0"]) == [0, 4, 8, 12]
        assert group[["seed", "federated.learning_rate"]].nunique().tolist() == [1, 1]
    # every run's parts are decompose_excess_risk's on its own clients, against the instance's optimum
    for row in runs.itertuples():
        run = load_run(sweep_dir, row.run_id)
        assert row.diverged == run.diverged
        if run.diverged:
            assert np.isnan(row.excess_risk) and np.isnan(row.bias)
            continue
        config = config_from_dict(run.metadata["config"])
        direct = decompose_excess_risk(run, clients_from_config(config), optimum=row.optimum)
        assert row.excess_risk == pytest.approx(run.table["loss_regularized"].iloc[-1] - row.optimum, rel=1e-12)
        for part in ("excess_risk", "bias", "drift_floor", "unfinished"):
            assert getattr(row, part) == pytest.approx(direct[part], rel=1e-9, abs=1e-15)
        assert row.bias + row.drift_floor + row.unfinished == pytest.approx(row.excess_risk, rel=1e-9)
    # the best warm-up: the smallest T0 among the minimisers, a diverged run counting as R = inf
    for b in best.itertuples():
        mine = runs[runs["instance"] == b.instance].sort_values("T0")
        risk = mine["excess_risk"].where(~mine["diverged"], np.inf).fillna(np.inf).to_numpy()
        assert b.best_T0 == mine["T0"].to_numpy()[np.flatnonzero(risk == risk.min())[0]]
        fedavg = risk[mine["T0"].to_numpy() == 12][0]
        assert b.diverged_runs == int(mine["diverged"].sum())
        if np.isfinite(fedavg):
            assert b.gain == pytest.approx(1 - risk.min() / fedavg, rel=1e-12)
        else:
            assert np.isnan(b.gain)
    diverged = int(runs["diverged"].sum())
    assert 0 < diverged < 16
    assert (best["gain"] > 0).sum() >= 1                    # FedFrozen beats FedAvg somewhere: the gain is tested
    assert f"16 runs, 4 instances; {diverged} runs diverged and have no R(T0)" in printed
    assert f"wrote {sweep_dir / 'excess_risk.csv'}" in printed


def test_analyze_sweep_returns_the_tables_it_writes_and_names_the_dropped_runs(sweep_dir, tmp_path):
    analysis = analyze_sweep(sweep_dir, tmp_path / "elsewhere")
    written = pd.read_csv(tmp_path / "elsewhere" / "excess_risk.csv")
    pd.testing.assert_frame_equal(written, analysis.runs, check_dtype=False)
    assert analysis.grid_columns == ("federated.learning_rate", "seed")
    assert analysis.dropped["count"] == int(analysis.runs["diverged"].sum())
    assert sorted(analysis.dropped["run_id"]) == sorted(analysis.runs.loc[analysis.runs["diverged"], "run_id"])


def test_analyze_refuses_what_is_not_a_finished_sweep(sweep_dir, tmp_path, capsys):
    import shutil

    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "invalid argument: SWEEP_DIR" in err and "is not a sweep folder" in err
    partial = tmp_path / "partial"
    shutil.copytree(sweep_dir, partial, ignore=shutil.ignore_patterns("excess_risk.csv", "best_warmup.csv"))
    victim = sorted((partial / "runs").iterdir())[0]
    (victim / "metadata.json").unlink()
    assert main(["analyze", str(partial)]) == 2
    err = capsys.readouterr().err
    assert f"1 of 16 runs are not finished (the first: runs/{victim.name}); finish the sweep first: " \
           f"linattn sweep" in err
    assert not (partial / "excess_risk.csv").exists() and not (partial / "best_warmup.csv").exists()


def test_analyze_holds_the_folder_while_it_writes(sweep_dir, capsys):
    from linattn_theory.sim.sweep import sweep_lock

    with sweep_lock(sweep_dir):                           # a sweep writing there: no analysis meanwhile
        assert main(["analyze", str(sweep_dir), "--out", str(sweep_dir / "held")]) == 2
    assert "another sweep is writing to it" in capsys.readouterr().err
    assert not (sweep_dir / "held").exists()


def test_load_config_says_what_reads_a_sweep_file(tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    with pytest.raises(ConfigError, match=r"grid: .*sweep.toml is a sweep file .*load_sweep\(.*analyze_sweep"):
        load_config(tmp_path / "sweep.toml")
