"""Step sizes set by curvature, ``federated.step_scale`` (docs/theory.md §5; linattn_theory.sim.step_size)."""

import json
import tomllib

import numpy as np
import pytest

from linattn_theory import RunConfig, simulate
from linattn_theory.cli.commands import main
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import config_from_dict, config_hash
from linattn_theory.sim.engine import clients_from_config, initial_params, run_schedule
from linattn_theory.sim.ensemble import simulate_many
from tests._by_hand import kernels, value_moments_by_hand

SMALL = {"task": {"num_clients": 3, "samples_per_client": 20, "tokens": 5, "dim": 4, "rank": 2,
                  "outputs": 2},
         "model": {"rank": 2, "heads": 2},
         "federated": {"rounds": 4, "warmup_rounds": 2, "local_steps": 3, "ridge": 0.05}}


def scaled(c=0.05, seed=0, **federated):
    return config_from_dict({**SMALL, "seed": seed, "federated": {**SMALL["federated"], "step_scale": c,
                                                                     **federated}})


def stable_step_by_hand(config) -> float:
    """``2 / max_c λ_max(Ã_c)`` at ``K⁰``, ``Ã_c = A_c + λI`` from the raw clients (tests/_by_hand.py),
    numpy's eigvalsh; no package moments."""
    clients = clients_from_config(config)
    X0, q0, y0 = clients[0]
    theta = initial_params(config, X0.shape[-1], y0.shape[-1])
    A, _, _ = value_moments_by_hand(clients, kernels(theta))
    lam = config.federated.ridge
    return 2.0 / max(np.linalg.eigvalsh(A_c + lam * np.eye(len(A_c)))[-1] for A_c in A)


def test_step_scale_sets_eta_to_c_times_the_value_blocks_stable_step():
    config = scaled(0.05)
    run = simulate(config)
    record = run.metadata["step_scale"]
    expected = 0.05 * stable_step_by_hand(config)
    assert abs(record["learning_rate"] - expected) <= 1e-12 * expected
    assert record["step_scale"] == 0.05
    assert abs(record["stable_learning_rate"] - expected / 0.05) <= 1e-12 * expected / 0.05
    # the run used that step: it equals the run with the resolved η given explicitly, bit for bit
    explicit = simulate(config.with_updates({"federated.learning_rate": record["learning_rate"]}))
    assert explicit.table.equals(run.table)
    assert run.metadata["config"]["federated"]["learning_rate"] == record["learning_rate"]
    assert "step_scale" not in run.metadata["config"]["federated"]


def test_same_scale_gives_each_instance_its_own_step():
    a, b = scaled(0.05, seed=0), scaled(0.05, seed=1)
    eta = [simulate(c).metadata["step_scale"]["learning_rate"] for c in (a, b)]
    by_hand = [0.05 * stable_step_by_hand(c) for c in (a, b)]
    assert abs(by_hand[0] / by_hand[1] - 1) > 0.05          # instances of different curvature ...
    assert np.allclose(eta, by_hand, rtol=1e-12, atol=0)   # ... get different steps


def test_simulate_many_resolves_each_instance_as_simulate_does():
    configs = [scaled(0.05, seed=0), scaled(0.05, seed=0, warmup_rounds=1), scaled(0.1, seed=1),
               scaled(0.05, seed=0, strategy="fedavg")]
    many = simulate_many(configs)
    for config, result in zip(configs, many):
        alone = simulate(config)
        assert result.metadata["step_scale"] == alone.metadata["step_scale"]
        assert result.metadata["config"] == alone.metadata["config"]
        np.testing.assert_allclose(result.table["loss_regularized"], alone.table["loss_regularized"],
                                   rtol=1e-10)


def test_metadata_json_records_the_scale_and_the_resolved_step(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("seed = 0\n[task]\nnum_clients = 3\nsamples_per_client = 20\ntokens = 5\ndim = 4\n"
                    "rank = 2\n[model]\nrank = 2\n[federated]\nrounds = 3\nwarmup_rounds = 1\n"
                    "step_scale = 0.02\n")
    assert main(["simulate", str(path), "--out", str(tmp_path / "out")]) == 0
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    config = config_from_dict(tomllib.loads(path.read_text()))
    expected = 0.02 * stable_step_by_hand(config)
    assert metadata["step_scale"]["step_scale"] == 0.02
    assert abs(metadata["step_scale"]["learning_rate"] - expected) <= 1e-12 * expected
    assert metadata["config"]["federated"]["learning_rate"] == metadata["step_scale"]["learning_rate"]


def test_step_scale_excludes_a_learning_rate_and_keeps_other_configs_keys(capsys, tmp_path):
    with pytest.raises(ConfigError, match="federated.learning_rate = 0.05 and federated.step_scale = 0.5: give one"):
        config_from_dict({"federated": {"learning_rate": 0.05, "step_scale": 0.5}})
    with pytest.raises(ConfigError, match="federated.step_scale = 0.0: expected a value > 0"):
        config_from_dict({"federated": {"step_scale": 0}})
    # setting one of the two replaces the other
    config = RunConfig().with_updates({"federated.step_scale": 0.5})
    assert (config.federated.step_scale, config.federated.learning_rate) == (0.5, None)
    back = config.with_updates({"federated.learning_rate": 0.01})
    assert (back.federated.step_scale, back.federated.learning_rate) == (None, 0.01)
    # a config without a step scale keeps its dictionary, and so its hash and printed form
    assert "step_scale" not in RunConfig().to_dict()["federated"]
    assert config_hash(back) == config_hash(RunConfig().with_updates({"federated.learning_rate": 0.01}))
    assert config_hash(config) != config_hash(RunConfig())
    # --print-config shows the scale, not an η
    path = tmp_path / "run.toml"
    path.write_text("[federated]\nstep_scale = 0.5\n")
    assert main(["simulate", str(path), "--print-config"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)["federated"]
    assert printed["step_scale"] == 0.5 and "learning_rate" not in printed


def test_an_unresolved_step_scale_is_refused_by_the_round_engine():
    from linattn_theory.sim.engine import prepare_run
    config = scaled(0.05)
    data, theta = prepare_run(config)
    with pytest.raises(ConfigError, match="resolve it to a learning rate first"):
        run_schedule(theta, data, config.federated, config.warmup_rounds)


def test_a_sweep_over_step_scales_tabulates_each_runs_scale_and_step(tmp_path):
    from linattn_theory.report.results import load_results
    from linattn_theory.sim.sweep import run_sweep, sweep_from_dict

    sweep = sweep_from_dict({**SMALL, "grid": {"federated.step_scale": [0.02, 0.04], "seed": [0, 1]}})
    table = run_sweep(sweep, tmp_path / "out").table
    assert table.equals(load_results(tmp_path / "out"))
    for _, row in table.iterrows():
        config = scaled(row["federated.step_scale"], seed=int(row["seed"]))
        expected = row["federated.step_scale"] * stable_step_by_hand(config)
        assert abs(row["federated.learning_rate"] - expected) <= 1e-12 * expected
    assert sorted(table["federated.step_scale"]) == [0.02, 0.02, 0.04, 0.04]
    assert (table["federated.step_curvature"] == "value").all()


def test_the_recommenders_resolve_the_scale_per_instance(monkeypatch):
    """``recommend`` runs its instance at ``η = c · 2/λ_max`` of that instance, and a transfer seed at its own."""
    from types import SimpleNamespace

    from linattn_theory.recommenders import recommendation

    config = scaled(0.02)
    rec = recommendation.recommend(config, mode="online", measure=False)
    expected = 0.02 * stable_step_by_hand(config)
    assert abs(rec.config.federated.learning_rate - expected) <= 1e-12 * expected
    seen = {}

    def fitted(cfg, clients, restarts):
        seen[cfg.seed] = cfg.federated.learning_rate
        return SimpleNamespace(T0_theory=1)

    monkeypatch.setattr(recommendation, "_a_posteriori_T0", fitted)
    recommendation.recommend(config, mode="transfer", measure=False, transfer_seeds=[1, 2])
    for seed in (1, 2):
        own = 0.02 * stable_step_by_hand(scaled(0.02, seed=seed))
        assert abs(seen[seed] - own) <= 1e-12 * own


def test_the_full_models_curvature_sets_the_step_when_asked():
    """``step_curvature = "model"``: η = c · 2 / max_c λ_max(∇²F_{λ,c}(θ⁰)) against a dense finite-difference
    Hessian (tests/_by_hand.py) to 1e-8: the differences' rounding ε·|∇F|/10⁻⁶ ≈ 2e-10 relative, the
    power iteration converged on this instance (measured 8e-11 apart)."""
    from linattn_theory.sim.engine import prepare_run
    from tests._by_hand import model_curvature_by_hand

    config = scaled(0.5, step_curvature="model")
    assert config.to_dict()["federated"]["step_curvature"] == "model"
    run = simulate(config)
    data, theta = prepare_run(config)
    expected = 0.5 * 2.0 / model_curvature_by_hand(theta, data, config.federated.ridge).max()
    record = run.metadata["step_scale"]
    assert record["learning_rate"] == pytest.approx(expected, rel=1e-8)
    assert record["curvature"].startswith("full model")
    assert record["learning_rate"] < 0.5 * stable_step_by_hand(scaled(0.5))     # a principal block: smaller step
    assert simulate_many([config])[0].metadata["step_scale"] == record
    with pytest.raises(ConfigError, match="federated.step_curvature = 'model': applies only with federated.step_scale"):
        config_from_dict({"federated": {"step_curvature": "model"}})
    back = config.with_updates({"federated.learning_rate": 0.01})
    assert back.federated.step_scale is None and "step_curvature" not in back.to_dict()["federated"]
    assert "step_curvature" not in RunConfig().to_dict()["federated"]
    assert scaled(0.5).federated.step_curvature == "value"


def test_the_full_models_curvature_is_computed_once_per_instance(monkeypatch):
    """The power iteration runs once per instance (θ⁰ and clients) and process: a cell's step scales share
    it, bit for bit what a fresh iteration gives; another seed (other clients and θ⁰) or another ridge
    is iterated anew."""
    from linattn_theory.core import curvature

    calls = []
    iterate = curvature.hessian_curvature

    def counted(*args, **kwargs):
        calls.append(1)
        return iterate(*args, **kwargs)
    monkeypatch.setattr(curvature, "hessian_curvature", counted)
    monkeypatch.setattr(curvature, "_MODEL_CURVATURE", {})
    runs = simulate_many([scaled(c, step_curvature="model") for c in (0.1, 0.2, 0.4)])
    stable = {run.metadata["step_scale"]["stable_learning_rate"] for run in runs}
    assert len(calls) == 1 and len(stable) == 1
    monkeypatch.setattr(curvature, "_MODEL_CURVATURE", {})
    assert simulate_many([scaled(0.3, step_curvature="model")])[0].metadata["step_scale"][
        "stable_learning_rate"] == stable.pop() and len(calls) == 2
    simulate_many([scaled(0.1, seed=1, step_curvature="model")])
    simulate_many([scaled(0.1, step_curvature="model", ridge=0.1)])
    assert len(calls) == 4
