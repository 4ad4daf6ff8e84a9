"""How chaotic a run is (linattn_theory.sim.sensitivity, docs/theory.md §6 "Chaotic instances")."""

import numpy as np
import pandas as pd
import pytest

from linattn_theory import Params, RunConfig
from linattn_theory.sim.engine import RunResult, clients_from_config, initial_params, simulate
from linattn_theory.sim.sensitivity import (CHAOS_AMPLIFICATION, PERTURBATION, Sensitivity, perturbed_params,
                                            perturbed_runs, run_sensitivity)

SMALL = {"task.num_clients": 4, "task.samples_per_client": 24, "task.tokens": 5, "task.dim": 4,
         "task.rank": 2, "model.rank": 2, "federated.rounds": 6, "federated.warmup_rounds": 3}


def _result(objective: float, params: Params) -> RunResult:
    return RunResult(pd.DataFrame({"loss_regularized": [9.0, objective]}), params, params)


def test_perturbed_params_move_every_entry_by_the_scale_reproducibly():
    start = Params.init(4, 2, 3, heads=2, seed=1)
    a, b, other = (perturbed_params(start, 1e-12, seed=5, repeat=r) for r in (0, 0, 1))
    for block in ("WQ", "WK", "WV"):
        ratio = getattr(a, block) / getattr(start, block) - 1
        assert 0 < np.abs(ratio).max() < 6e-12 and np.abs(ratio).mean() > 1e-13     # N(0, 1) times 1e-12
        np.testing.assert_array_equal(getattr(a, block), getattr(b, block))
        assert not np.array_equal(getattr(a, block), getattr(other, block))


def test_amplifications_are_the_measured_changes_per_unit_perturbation():
    """Hand-made ends: F_λ moves by 3e-12 relative and θ^T by 5e-12 relative (of ‖θ^T‖ = 2). The moves
    are stored to one ulp of 2 (4.4e-16), so the ratios are known to 4.4e-16 / 6e-12 < 1e-4."""
    end = Params(np.array([[[2.0]]]), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)))
    moved = Params(np.array([[[2.0 + 1e-11]]]), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)))
    s = run_sensitivity(None, clients=[None], reference=_result(2.0, end),
                        runs=[_result(2.0 * (1 + 3e-12), moved), _result(2.0, end)])
    assert s.objective_amplification == pytest.approx(3.0, rel=1e-4)
    assert s.parameter_amplification == pytest.approx(5.0, rel=1e-4)
    assert s.spread == pytest.approx(3e-12, rel=1e-4) and s.amplification == s.parameter_amplification
    assert not s.chaotic and not s.diverged
    assert Sensitivity(CHAOS_AMPLIFICATION * 1.01, 0.0, 0.0, False).chaotic
    assert Sensitivity(float("nan"), 0.0, 0.0, False).chaotic, "an amplification that is not a number is chaotic"
    assert Sensitivity(0.0, 0.0, 0.0, True).chaotic, "a divergence that a rounding decides is chaotic"


def test_a_small_stable_run_is_well_conditioned_and_repeats_are_its_own_starts_perturbed():
    config = RunConfig().with_updates(SMALL)
    clients = clients_from_config(config)
    runs = perturbed_runs(config, clients, repeats=2)
    start = initial_params(config, 4, clients[0].y.shape[-1])
    again = simulate(config, clients, params=perturbed_params(start, PERTURBATION, config.seed, 1))
    np.testing.assert_array_equal(runs[1].params.WV, again.params.WV)
    s = run_sensitivity(config, clients, runs=runs)
    assert 1e-2 < s.amplification < 1e3 and not s.chaotic      # a few rounds of a stable step: order one
    with pytest.raises(ValueError, match="repeats"):
        perturbed_runs(config, clients, repeats=0)
