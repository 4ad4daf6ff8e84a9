"""The server's exact value solve (linattn_theory.sim.strategies.value_solve; docs/theory.md §3, §5)."""

import numpy as np
import pytest

from linattn_theory import simulate
from linattn_theory.core.model import kernel
from linattn_theory.sim.config import config_from_dict
from linattn_theory.sim.engine import clients_from_config
from linattn_theory.sim.ensemble import simulate_many
from linattn_theory.theory.decomposition import decompose_excess_risk
from tests._by_hand import kernels, pooled_solution

#: heterogeneous clients (ζ_V = 2, unequal sizes) and E = 5 local steps: FedFrozen's frozen stage has a drift floor
BASE = {"task": {"num_clients": 4, "samples_per_client": 24, "tokens": 5, "dim": 4, "rank": 2,
                 "zeta_value": 2.0, "dirichlet_alpha": 2.0},
        "model": {"rank": 2, "heads": 2},
        "federated": {"rounds": 8, "warmup_rounds": 4, "local_steps": 5, "learning_rate": 0.05,
                      "ridge": 0.01}}


def config(strategy, seed=0, **federated):
    return config_from_dict({**BASE, "seed": seed,
                             "federated": {**BASE["federated"], "strategy": strategy, **federated}})


def test_after_the_solve_the_value_block_is_the_centralised_optimum():
    cfg = config("value_solve_final")
    run = simulate(cfg)
    assert cfg.warmup_rounds == 7 and run.metadata["warmup_rounds"] == 7
    clients = clients_from_config(cfg)
    K = kernels(run.warmup_params)
    V_star, phi = pooled_solution(clients, K, 0.01)
    V = np.asarray(run.params.WV).reshape(V_star.shape)
    assert np.linalg.norm(V - V_star) <= 1e-10 * np.linalg.norm(V_star)
    np.testing.assert_array_equal(kernel(run.params), kernel(run.warmup_params))   # the solve keeps K_{T0}
    # the table's last F_λ is the profile Φ_λ(K_{T−1}) (rounding of sums of m·N products: 1e-12 relative)
    assert abs(run.table["loss_regularized"].iloc[-1] - phi) <= 1e-12 * abs(phi)


def test_value_solve_lands_on_the_optimum_in_round_T0_then_continues_with_fedavg():
    run, frozen = simulate(config("value_solve")), simulate(config("fedfrozen"))
    T0 = 4
    _, phi = pooled_solution(clients_from_config(config("value_solve")), kernels(run.warmup_params), 0.01)
    F = run.table["loss_regularized"].to_numpy()
    assert abs(F[T0 + 1] - phi) <= 1e-12 * abs(phi)                 # the solve round's result
    np.testing.assert_array_equal(F[:T0 + 1], frozen.table["loss_regularized"].to_numpy()[:T0 + 1])
    assert (run.table["stage"].iloc[T0 + 1:] == "frozen").all()
    assert F[-1] > F[T0 + 1]          # the value-only FedAvg rounds after it drift back towards V_FA


def test_its_excess_risk_is_the_bias_alone_without_drift_floor():
    """R = bias + D + unfinished (docs/theory.md §6) with V_T = V*_λ: F_λ(K, V_T) = Φ_λ(K), so
    R = bias and the unfinished part is exactly −D. The measured F_λ (the simulator's sums over the
    samples) and Φ_λ (from the moments) agree to rounding: 1e-12 of F is far above ε·(m·N) ≈ 2e-14
    relative and far below the drift floor the same kernel has under FedAvg (asserted > 1e-6)."""
    run = simulate(config("value_solve_final"))
    parts = decompose_excess_risk(run)
    scale = parts["loss_regularized"]
    assert abs(parts["excess_risk"] - parts["bias"]) <= 1e-12 * scale
    assert parts["drift_floor"] > 1e-6 * scale          # FedAvg's fixed point at this kernel is off
    assert abs(parts["unfinished"] + parts["drift_floor"]) <= 1e-12 * scale
    fedavg = decompose_excess_risk(simulate(config("fedfrozen", warmup_rounds=7)), optimum=parts["optimum"])
    assert fedavg["bias"] == pytest.approx(parts["bias"], rel=1e-12)   # same warm-up, same kernel
    assert fedavg["excess_risk"] - parts["excess_risk"] > 0.5 * parts["drift_floor"]


def test_simulate_many_runs_it_as_simulate_does():
    configs = [config("value_solve"), config("value_solve_final", seed=1), config("fedfrozen"),
               config("value_solve", warmup_rounds=0), config("value_solve", seed=1),
               config("value_solve_final", seed=2)]      # other T0 (other rules), other instances
    many = simulate_many(configs)
    for cfg, result in zip(configs, many):
        alone = simulate(cfg)
        assert result.table.equals(alone.table), cfg.federated.strategy
        np.testing.assert_array_equal(result.params.WV, alone.params.WV)


def test_instances_of_one_ensemble_each_solve_at_their_own_kernel():
    """Equal client sizes (no Dirichlet split), so that the seeds share one ensemble: each instance's
    V must be its own V*_λ(K_{T0}), not the first instance's (as when one rule served the group).
    Tolerance 1e-12 relative: the ensemble's fused engine and simulate's adds in another order."""
    equal = {**BASE, "task": {k: v for k, v in BASE["task"].items() if k != "dirichlet_alpha"}}
    configs = [config_from_dict({**equal, "seed": seed, "federated": {**BASE["federated"], "strategy": strategy}})
               for strategy in ("value_solve_final", "value_solve") for seed in (0, 1, 2)]
    configs.append(configs[0].with_updates({"federated.learning_rate": 50.0, "seed": 3}))   # diverges before its solve
    for cfg, result in zip(configs, simulate_many(configs)):
        alone = simulate(cfg)
        assert result.diverged == alone.diverged == (cfg.seed == 3)
        np.testing.assert_allclose(result.table["loss_regularized"], alone.table["loss_regularized"], rtol=1e-12)
        np.testing.assert_allclose(result.params.WV, alone.params.WV, rtol=1e-10, atol=1e-12)


def test_value_solve_is_registered_with_its_warmup():
    assert config("value_solve").warmup_rounds == 4
    assert config("value_solve", warmup_rounds=8).warmup_rounds == 8      # T0 = T: never solves, FedAvg
    with pytest.raises(Exception, match="federated.warmup_rounds = 9: expected a value <= federated.rounds"):
        config("value_solve", warmup_rounds=9)
    fedavg = simulate(config("fedavg"))
    never = simulate(config("value_solve", warmup_rounds=8))
    np.testing.assert_array_equal(never.table["loss_regularized"], fedavg.table["loss_regularized"])
