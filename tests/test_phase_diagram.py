"""The phase diagram's statistics (linattn_theory.report.phase_diagram, docs/theory.md §6 "Where
freezing pays") on hand-made tables, and its value solve against the strategy's own run."""

import numpy as np
import pandas as pd
import pytest

from linattn_theory.core.io import read_csv_exact   # every float as written, whatever the pandas
from linattn_theory.report.phase_diagram import (ROW_COLUMNS, attribution, auc, bootstrap_median, cell_summary, gains,
                                                 predictor_score)


def test_auc_is_the_mann_whitney_probability():
    assert auc([1, 2, 3, 4], [False, False, True, True]) == 1.0
    assert auc([4, 3, 2, 1], [False, False, True, True]) == 0.0
    assert auc([1, 1, 1, 1], [False, True, False, True]) == 0.5                  # ties count one half
    assert auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75       # 3 of the 4 pairs
    assert np.isnan(auc([1, 2], [True, True]))


def test_bootstrap_median_by_hand():
    assert bootstrap_median([0.2, 0.2, 0.2]) == (0.2, 0.2, 0.2)
    median, low, high = bootstrap_median([0.0, 0.1, 0.2, 0.3, 1.0], resamples=4000)
    assert median == 0.2 and 0.0 <= low <= 0.1 and 0.3 <= high <= 1.0
    median, low, high = bootstrap_median([-np.inf, -np.inf, 0.1])               # a diverged arm is a loss
    assert median == -np.inf and low == -np.inf and high == 0.1
    assert np.isnan(bootstrap_median([np.nan])[0])


def _rows():
    """Two held-out instances and one design instance of one cell (ζ_V = 1, E = 10, c = 0.45);
    tuned FedAvg's R = 1.0 on each, FedFrozen at its best T0 0.9 (seed 0: a win of 10 %) and 0.99
    (seed 1: 1 %, no win), the predictor says "pays" on both."""
    rows = []
    for role, seed, R_fa, R_ff, R_pred, R_fa_c, chaotic in [("heldout", 0, 1.0, 0.9, 0.95, 1.2, False),
                                                             ("heldout", 1, 1.0, 0.99, 1.1, 1.0, False),
                                                             ("design", 7, 1.0, 0.5, 0.5, 1.0, False)]:
        common = dict(role=role, seed=seed, zeta_value=1.0, local_steps=10, step_scale=0.45, margin=1.1,
                      drift_share=0.01 * (seed + 1), predicted_pays=True, predicted_T0=20, chaotic=chaotic)
        parts = {"fedavg": (0.7, 0.4, 0.1, 0.9), "fedfrozen_best": (0.6, 0.25, 0.05, 0.8)} if seed == 0 else {}
        for arm, step, T0, R in [("fedavg_tuned", 0.15, 30, R_fa), ("fedavg_tuned_oracle", 0.15, 30, R_fa),
                                 ("fedavg", 0.45, 30, R_fa_c), ("fedfrozen_best", 0.45, 12, R_ff),
                                 ("fedfrozen_predicted", 0.45, 20, R_pred), ("value_solve_final", 0.45, 29, np.nan)]:
            bias, D, unf, rho = parts.get(arm, (np.nan,) * 4)
            rows.append({**common, "arm": arm, "step": step, "learning_rate": step / 10, "T0": T0, "excess_risk": R,
                         "diverged": bool(np.isnan(R)), "bias": bias, "drift_floor": D, "unfinished": unf,
                         "contraction_rate": rho})
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def test_gains_flags_and_wins_of_a_hand_made_table():
    rows = _rows()
    g = gains(rows, "fedfrozen_best").set_index("seed")
    assert g.loc[0, "gain"] == pytest.approx(0.1, abs=1e-15) and g.loc[1, "gain"] == pytest.approx(0.01, abs=1e-15)
    v = gains(rows, "value_solve_final")
    assert (v["gain"] == -np.inf).all() and v["flagged"].all()                  # diverged: a loss, flagged
    settings = {"threshold": 0.02, "bootstrap_resamples": 100, "bootstrap_seed": 0}
    cells = cell_summary(rows, settings).set_index(["arm", "column"])
    ff = cells.loc[("fedfrozen_best", "0.45")]
    assert ff["instances"] == 2 and ff["wins"] == 1 and ff["gain_median"] == pytest.approx(0.055, abs=1e-15)
    vs = cells.loc[("value_solve_final", "0.45")]
    assert vs["diverged"] == 2 and vs["n_clean"] == 0 and vs["gain_median"] == -np.inf


def test_predictor_score_and_attribution_of_a_hand_made_table():
    rows = _rows()
    score = predictor_score(rows, 0.02).set_index("subset").loc["all"]
    # held out only: seed 0 wins (TP), seed 1 does not (FP)
    assert (score["instances"], score["true_positives"], score["false_positives"]) == (2, 1, 1)
    assert score["accuracy"] == 0.5 and score["auc_drift_share"] == 0.0           # the loser has the larger share
    # regret R(T0_pred)/R(T0_best) − 1: 0.95/0.9 − 1 and 1.1/0.99 − 1
    assert score["regret_mean"] == pytest.approx(((0.95 / 0.9 - 1) + (1.1 / 0.99 - 1)) / 2, rel=1e-14)
    assert score["regret_median_fedavg"] == pytest.approx(((1.2 / 0.9 - 1) + (1.0 / 0.99 - 1)) / 2, rel=1e-14)
    (win,) = attribution(rows, 0.02).itertuples()
    assert win.seed == 0 and win.gap == pytest.approx(0.1, abs=1e-15)
    assert win.step == pytest.approx(-0.2, abs=1e-15)                           # tuning FedAvg helped
    assert (win.late_rise, win.drift_floor, win.unfinished) == pytest.approx((0.1, 0.15, 0.05), abs=1e-15)
    assert win.value == pytest.approx(0.2, abs=1e-15) and not win.fedavg_diverged
    # the gap is the sum of its parts: −0.2 + 0.1 + 0.2 (R(T) − R(T0*) = 1.2 − 0.9 = 0.3)
    assert win.step + win.late_rise + win.value == pytest.approx(win.gap, abs=1e-15)
    rows.loc[rows["arm"] == "fedavg", "contraction_rate"] = 1.2          # V_FA is no limit: no split
    (win,) = attribution(rows, 0.02).itertuples()
    assert np.isnan(win.drift_floor) and np.isnan(win.unfinished) and win.value == pytest.approx(0.2, abs=1e-15)


def test_value_solve_from_the_path_equals_the_strategy_run():
    """``value_solve_final``'s R, read off FedAvg's path as Φ_λ(K_{T−1}) − Φ*, equals the strategy's own run."""
    from linattn_theory.report.phase_diagram import _instance, run_instances
    from linattn_theory.sim.config import config_from_dict
    from linattn_theory.sim.engine import simulate

    base = config_from_dict({"task": {"family": "planted_kernel", "num_clients": 3, "samples_per_client": 8,
                                      "tokens": 4, "dim": 3, "rank": 2, "outputs": 1, "noise": 0.1},
                             "model": {"rank": 2}, "federated": {"rounds": 6, "warmup_rounds": 6, "local_steps": 3}})
    settings = {"base": base, "step_scales": [0.2], "fedavg_steps": [0.2], "zeta_value": [2.0], "local_steps": [3],
                "design_seeds": [5], "heldout_seeds": [6]}
    record = run_instances(settings)[1]
    assert record["seed"] == 6 and np.isfinite(record["value_solve_final"])
    run = simulate(_instance(base, 2.0, 6).with_updates({"federated.strategy": "value_solve_final", "federated.local_steps": 3,
                                                        "federated.learning_rate": record["learning_rate"]}))
    R = float(run.table["loss_regularized"].iloc[-1]) - record["optimum"]
    assert record["value_solve_final"] == pytest.approx(R, rel=1e-9)
    assert record["R"][-1] > record["value_solve_final"]                          # FedAvg pays its drift floor


def _tiny_settings():
    from linattn_theory.sim.config import config_from_dict

    base = config_from_dict({"task": {"family": "planted_kernel", "num_clients": 3, "samples_per_client": 8,
                                      "tokens": 4, "dim": 3, "rank": 2, "outputs": 1, "noise": 0.1},
                             "model": {"rank": 2}, "federated": {"rounds": 20, "warmup_rounds": 20, "local_steps": 3}})
    return {"base": base, "step_scales": [0.2, 0.4], "fedavg_steps": [0.2, 0.4], "zeta_value": [2.0], "local_steps": [3],
            "design_seeds": [6], "heldout_seeds": [5], "threshold": 0.02, "bootstrap_resamples": 10, "bootstrap_seed": 0}


def test_online_arm_is_the_online_rules_realised_run():
    """The row ``fedfrozen_online`` of every (instance, c) is a separately run ``simulate`` of the strategy
    ``fedfrozen_adaptive`` at that step, bit for bit: its R (``F_λ(θ_T) − Φ*``), its T0 (the rule's kernel
    round) and its flags; the cells carry the arm, its tuned column at its own design choice. On this
    instance the rule freezes once (seed 5, c = 0.4: kernel round 17, decided in round 18, so its R is
    not the sweep's R(17)) and one run diverges (seed 6, c = 0.4) as the rule's run alone does."""
    from linattn_theory.report.phase_diagram import _instance, instance_rows, run_instances
    from linattn_theory.sim.engine import simulate

    settings = _tiny_settings()
    records = run_instances(settings)
    rows, _ = instance_rows(records, settings)
    online = rows[rows["arm"] == "fedfrozen_online"]
    assert len(online) == len(records) == 4 and list(rows.columns) == ROW_COLUMNS
    frozen = diverged = 0
    for record in records:
        config = _instance(settings["base"], 2.0, record["seed"]).with_updates(
            {"federated.strategy": "fedfrozen_adaptive", "federated.local_steps": 3,
             "federated.learning_rate": record["learning_rate"]})
        run = simulate(config)
        row = online[(online["seed"] == record["seed"]) & (online["step_scale"] == record["step_scale"])].iloc[0]
        assert row["T0"] == run.metadata["kernel_round"] and row["learning_rate"] == record["learning_rate"]
        assert row["chaotic"] == (record["chaotic"] or record["online_chaotic"])
        assert row["diverged"] == run.diverged
        if run.diverged:
            diverged += 1
            assert np.isnan(row["excess_risk"])
            continue
        assert row["excess_risk"] == float(run.table["loss_regularized"].iloc[-1]) - record["optimum"]   # bit for bit
        best = rows[(rows["arm"] == "fedfrozen_best") & (rows["seed"] == record["seed"])
                    & (rows["step_scale"] == record["step_scale"])].iloc[0]
        assert row["excess_risk"] >= best["excess_risk"] * (1 - 1e-9)         # the oracle over T0 bounds it
        if row["T0"] < 20:
            frozen += 1
            assert run.metadata["stop_round"] > row["T0"]                     # decided a round after its kernel
            assert row["excess_risk"] != record["R"][int(row["T0"])]          # the realised run, not R(T0)
    assert (frozen, diverged) == (1, 1)
    cells = cell_summary(rows, settings)
    arm = cells[cells["arm"] == "fedfrozen_online"].set_index("column")
    assert set(arm.index) == {"0.2", "0.4", "tuned"} and (arm["instances"] == 1).all()
    assert arm.loc["tuned", "gain_median"] == arm.loc[f"{arm.loc['tuned', 'step_scale']:g}", "gain_median"]


@pytest.mark.slow
def test_committed_rows_of_seed_0_are_regenerated():
    """Seed 0 at ζ_V = 1 (every E and c) run again from the committed config: every unflagged row of
    FedAvg, FedFrozen (best and predicted T0), the value solve and the online rule's realised run agrees
    with figures/phase_diagram.csv to 1e-9 relative (its T0 exactly); the chaotic ones (a 1e-12 move of
    θ⁰ moves their end by more than 1e-9, docs/theory.md §6) are flagged again, and are compared only
    for that (the online row's flag also covers its own run's chaos)."""
    from pathlib import Path

    from linattn_theory.report.phase_diagram import load_settings, run_instances

    root = Path(__file__).resolve().parents[1]
    settings = load_settings(root / "simulations" / "configs" / "phase_diagram.toml")
    settings.update(zeta_value=[1.0], design_seeds=[], heldout_seeds=[0])
    committed = read_csv_exact(root / "figures" / "phase_diagram.csv")
    committed = committed[(committed["role"] == "heldout") & (committed["seed"] == 0) & (committed["zeta_value"] == 1.0)]
    chaotic = online = 0
    for record in run_instances(settings):
        rows = committed[(committed["local_steps"] == record["local_steps"])
                         & (committed["step_scale"] == record["step_scale"])].set_index("arm")
        assert bool(rows.loc["fedavg", "chaotic"]) == record["chaotic"]
        assert bool(rows.loc["fedfrozen_online", "chaotic"]) == (record["chaotic"] or record["online_chaotic"])
        if not rows.loc["fedfrozen_online", "chaotic"]:
            online += 1
            assert rows.loc["fedfrozen_online", "T0"] == record["online_T0"], record["local_steps"]
            assert record["online"] == pytest.approx(rows.loc["fedfrozen_online", "excess_risk"], rel=1e-9)
        assert record["margin"] == pytest.approx(rows.loc["fedavg", "margin"], rel=1e-9)
        assert record["drift_share"] == pytest.approx(rows.loc["fedavg", "drift_share"], rel=1e-9)
        if record["chaotic"]:
            chaotic += 1
            continue
        R = record["R"]
        best = int(np.argmin(np.where(np.isfinite(R), R, np.inf)))
        assert rows.loc["fedfrozen_best", "T0"] == best
        for arm, value in (("fedavg", R[-1]), ("fedfrozen_best", R[best]),
                           ("fedfrozen_predicted", R[record["predicted_T0"]]),
                           ("value_solve_final", record["value_solve_final"])):
            assert value == pytest.approx(rows.loc[arm, "excess_risk"], rel=1e-9), (record["local_steps"], arm)
    assert chaotic == 2, "seed 0 at ζ_V = 1 has two chaotic cells (E = 10, c = 0.3 and 0.45): both kinds are checked"
    assert online == 6, "the online rule's run is unflagged in the other six cells: compared there"


def test_online_arm_carries_its_own_chaos_flag(monkeypatch):
    """A row of the online arm is flagged chaotic when the online run is, even where FedAvg's path is
    not (a rounding-level move can flip the rule's decision): with the online runs' sensitivity marked
    chaotic (and nothing else), every online row is flagged and no other arm's row is. (Dropping the
    online run's own flag, keeping only the path's, fails this test; on the committed table it flags
    5 online rows FedAvg's path does not.)"""
    import dataclasses

    import linattn_theory.sim.sensitivity as sensitivity
    from linattn_theory.report.phase_diagram import instance_rows, run_instances

    real = sensitivity.run_sensitivity

    def online_only(config, *args, **kwargs):
        found = real(config, *args, **kwargs)
        if config.federated.strategy != "fedfrozen_adaptive":
            return found
        return dataclasses.replace(found, parameter_amplification=10 * sensitivity.CHAOS_AMPLIFICATION)

    monkeypatch.setattr(sensitivity, "run_sensitivity", online_only)
    settings = _tiny_settings()
    rows, _ = instance_rows(run_instances(settings), settings)
    assert rows.loc[rows["arm"] == "fedfrozen_online", "chaotic"].all()
    assert not rows.loc[rows["arm"] != "fedfrozen_online", "chaotic"].any()


def test_stable_steps_of_many_instances_are_each_one_alone():
    """``stable_steps`` iterates instances of equal shapes together (two shapes here, so two groups, in a
    mixed order): each instance's step is what ``stable_step`` gives it alone, bit for bit; data sets of
    different shapes for one power iteration are refused."""
    import linattn_theory as lt
    from linattn_theory.core.curvature import hessian_curvature
    from linattn_theory.report.phase_diagram import stable_step, stable_steps
    from linattn_theory.sim.engine import clients_from_config, prepare_run

    configs = [lt.config_from_dict({"seed": seed, "task": {"zeta_value": zeta, "dim": dim},
                                    "federated": {"rounds": 4, "warmup_rounds": 2}})
               for seed, zeta, dim in [(0, 1.0, 4), (1, 3.0, 6), (2, 2.0, 4), (3, 1.0, 6)]]
    clients = [clients_from_config(config) for config in configs]
    steps = stable_steps(configs, clients)
    assert steps == [stable_step(config, data) for config, data in zip(configs, clients)]
    assert len(set(steps)) == 4
    (small, theta), (large, other) = prepare_run(configs[0], clients[0]), prepare_run(configs[1], clients[1])
    with pytest.raises(ValueError, match="differ in shape"):
        hessian_curvature([theta, other], [small, large])
    with pytest.raises(ValueError, match="2 data sets for 1 points"):
        hessian_curvature([theta], [small, small])
