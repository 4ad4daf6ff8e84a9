"""Tuned baselines: steps chosen on design seeds, scored on held-out seeds (linattn_theory.report.tuning)."""

import numpy as np
import pytest

from linattn_theory import simulate
from linattn_theory.report.tuning import choose_steps, tune_and_hold_out
from linattn_theory.sim.config import config_from_dict

BASE = config_from_dict({"task": {"num_clients": 3, "samples_per_client": 16, "tokens": 4, "dim": 3, "rank": 2,
                                  "outputs": 1, "zeta_value": 1.0},
                         "model": {"rank": 2},
                         "federated": {"rounds": 6, "warmup_rounds": 3, "local_steps": 3, "step_scale": 0.01,
                                       "ridge": 0.01}})
ARMS = {"fedavg": {"federated.strategy": "fedavg"}, "fedfrozen": {"federated.strategy": "fedfrozen"}}
#: 3.0 × the value block's limit at θ⁰ diverges on every seed (asserted): it must never be chosen
GRIDS = {"fedavg": [0.01, 0.04, 3.0], "fedfrozen": [3.0, 0.02, 0.08]}
CELLS = {"low": {"task.zeta_value": 0.5}, "high": {"task.zeta_value": 2.0}}


def fixed_optimum(config, clients, kernels):
    """A stand-in Φ*_λ (the choice compares runs of one instance, so it cancels in the ratios)."""
    return 0.01 * config.seed


@pytest.fixture(scope="module")
def tuned():
    return tune_and_hold_out(BASE, ARMS, GRIDS, design_seeds=[0, 1, 2], heldout_seeds=[3, 4], cells=CELLS,
                             optimum=fixed_optimum)


def test_the_choice_is_the_least_median_ratio_on_the_design_seeds(tuned):
    design = tuned.design
    assert set(design["seed"]) == {0, 1, 2} and len(design) == 2 * 2 * 3 * 3
    assert design.loc[design["step"] == 3.0, "diverged"].all()
    assert design.loc[design["step"] == 3.0, "excess_risk"].isna().all()
    row = design[design["step"] == 3.0].iloc[0]         # a diverged run's oracle: its path's best round
    config = BASE.with_updates({**CELLS[row.cell], **ARMS[row.arm], "federated.step_scale": 3.0,
                                "seed": int(row.seed)})
    F = simulate(config).table["loss_regularized"].to_numpy()
    assert row.oracle_best_iterate == pytest.approx(np.nanmin(F) - 0.01 * row.seed, rel=1e-10)
    assert np.nanmin(F) < F[-1]
    for cell in CELLS:
        for arm, steps in GRIDS.items():
            rows = design[(design["cell"] == cell) & (design["arm"] == arm)]
            R = {s: rows[rows["step"] == s].set_index("seed")["excess_risk"].fillna(np.inf) for s in steps}
            best = np.minimum.reduce([R[s] for s in steps])
            medians = {s: float(np.median(R[s] / best)) for s in steps}
            diverged = {s: int(np.isinf(R[s]).sum()) for s in steps}
            expected = min(steps, key=lambda s: (diverged[s], medians[s], steps.index(s)))
            chosen = tuned.choices.set_index(["cell", "arm"]).loc[(cell, arm)]
            assert chosen["step"] == expected and chosen["median_ratio"] == pytest.approx(medians[expected])
            assert expected != 3.0


def test_held_out_rows_run_the_chosen_step_and_their_risk_is_the_runs_own(tuned):
    heldout = tuned.heldout
    assert sorted(heldout.columns) == sorted(["seed", "cell", "arm", "step", "setting", "learning_rate", "excess_risk",
                                              "diverged", "oracle_best_iterate"])
    assert set(heldout["seed"]) == {3, 4} and len(heldout) == 2 * 2 * 2
    chosen = tuned.choices.set_index(["cell", "arm"])["step"]
    for row in heldout.itertuples():
        assert row.step == chosen[row.cell, row.arm]
        config = BASE.with_updates({**CELLS[row.cell], **ARMS[row.arm], "federated.step_scale": row.step,
                                    "seed": row.seed})
        run = simulate(config)
        assert row.learning_rate == run.metadata["step_scale"]["learning_rate"]
        F = run.table["loss_regularized"].to_numpy()          # the oracle: the path's best round, 0 included
        assert row.oracle_best_iterate == pytest.approx(np.nanmin(F) - 0.01 * row.seed, rel=1e-10)
        assert row.diverged == run.diverged
        if run.diverged:
            assert np.isnan(row.excess_risk)
            continue
        assert row.excess_risk == pytest.approx(run.table["loss_regularized"].iloc[-1] - 0.01 * row.seed,
                                                rel=1e-10)


def test_design_and_held_out_seeds_must_be_apart_and_every_arm_declared():
    with pytest.raises(ValueError, match="seed 2 is both a design and a held-out seed"):
        tune_and_hold_out(BASE, ARMS, GRIDS, design_seeds=[1, 2], heldout_seeds=[2, 3])
    with pytest.raises(ValueError, match="no steps declared for arm 'fedavg'"):
        tune_and_hold_out(BASE, ARMS, {"fedfrozen": [0.01]}, design_seeds=[1], heldout_seeds=[2])


def test_ties_go_to_the_earlier_step_and_diverged_seeds_count_as_infinite():
    import pandas as pd
    design = pd.DataFrame({"seed": [0, 0, 1, 1, 2, 2], "cell": "", "arm": "a", "step": [0.1, 0.2] * 3,
                           "excess_risk": [1.0, 1.0, 2.0, 2.0, np.nan, 3.0],
                           "diverged": [False, False, False, False, True, False]})
    assert choose_steps(design, {"a": [0.1, 0.2]})["step"].item() == 0.2   # seed 2: 0.1 diverged
    # (by the median of the ratios alone, (1, 1, ∞) against (1, 1, 1), it would be a tie: 0.1)
    design.loc[4, ["excess_risk", "diverged"]] = [3.0, False]
    assert choose_steps(design, {"a": [0.1, 0.2]})["step"].item() == 0.1   # a tie: the grid's first
    assert choose_steps(design, {"a": [0.2, 0.1]})["step"].item() == 0.2


def test_the_default_reference_is_the_centralised_optimum_below_every_kernel_reached():
    """Φ*_λ (centralized_optimum, started from the kernels the runs reached among others) is at most the
    profile Φ_λ(K_T) of each run's final kernel, computed from the raw clients (tests/_by_hand.py)."""
    from linattn_theory.sim.engine import clients_from_config
    from tests._by_hand import kernels, pooled_solution

    tuned = tune_and_hold_out(BASE, {"fedavg": ARMS["fedavg"]}, {"fedavg": [0.01, 0.04]}, [0], [1])
    for row in tuned.design.itertuples():
        config = BASE.with_updates({**ARMS["fedavg"], "federated.step_scale": row.step, "seed": row.seed})
        run, clients = simulate(config), clients_from_config(config)
        _, profile = pooled_solution(clients, kernels(run.params), 0.01)
        phi_star = run.table["loss_regularized"].iloc[-1] - row.excess_risk
        assert phi_star <= profile + 1e-12 and row.excess_risk > 0
