"""The a-priori predictor of the phase diagram (linattn_theory.theory.phase_predictor,
docs/theory.md §6 "Where freezing pays") on hand-made inputs, values worked out by hand."""

import math

import pytest

from linattn_theory.theory.phase_predictor import (CURVATURE_GROWTH, drift_share, edge_round, predict_best_warmup,
                                                   predict_pays, stability_margin)


def test_stability_margin_is_two_minus_eta_lambda():
    assert stability_margin(0.5, 2.0) == 1.0          # 2 − 0.5·2
    assert stability_margin(0.25, 10.0) == -0.5       # unstable at θ⁰
    with pytest.raises(ValueError, match="eta"):
        stability_margin(0.0, 1.0)


def test_drift_share_is_a_ratio():
    assert drift_share(0.3, 1.5) == pytest.approx(0.2, rel=1e-15)
    assert drift_share(0.0, 1.5) == 0.0               # E = 1: no drift floor
    with pytest.raises(ValueError, match="leading_order"):
        drift_share(-1.0, 1.0)


def test_edge_round_by_hand():
    # m = 1: ηλ = 1, the curvature must double: T ln 2 / ln 3 = 30 · 0.63093 = 18.928
    assert edge_round(1.0, 30) == pytest.approx(30 * math.log(2) / math.log(3), rel=1e-15)
    assert edge_round(1.0, 30) == pytest.approx(18.928, abs=5e-4)
    # ηλ = 2/g exactly: the edge is met in the last round; g = 2 and m = 1 likewise
    assert edge_round(2 - 2 / 3, 30) == pytest.approx(30, rel=1e-12)
    assert edge_round(1.0, 30, growth=2.0) == pytest.approx(30, rel=1e-15)
    assert edge_round(-0.5, 30) == 0.0                # unstable at θ⁰
    with pytest.raises(ValueError, match="growth"):
        edge_round(1.0, 30, growth=1.0)


def test_predicted_boundary_is_eta_lambda_above_two_over_g():
    assert CURVATURE_GROWTH == 3.0
    # c = ηλ/2: pays iff c > 1/3
    assert predict_pays(stability_margin(2 * 0.34, 1.0), 30)
    assert not predict_pays(stability_margin(2 * 0.32, 1.0), 30)
    assert not predict_pays(stability_margin(2 * 0.05, 1.0), 30)
    assert predict_pays(-1.0, 30)


def test_predicted_best_warmup_by_hand():
    assert predict_best_warmup(1.0, 30) == 18                      # ⌊18.93⌋
    assert predict_best_warmup(1.0, 30, grid=range(0, 31, 2)) == 18
    assert predict_best_warmup(1.0, 30, grid=[0, 10, 20, 30]) == 10
    assert predict_best_warmup(1.8, 30) == 30                      # no edge: plain FedAvg
    assert predict_best_warmup(-0.1, 30, grid=[2, 4, 30]) == 2     # unstable at θ⁰: the earliest freeze


def test_predictor_inputs_follow_the_drift_law():
    """D₂(K⁰) grows as η²(E − 1)² (§5, every order vanishing at E = 1); the margin and the
    predictions follow from η and the curvature as the pure functions say."""
    from linattn_theory.report.phase_diagram import predictor_inputs, stable_step
    from linattn_theory.sim.config import config_from_dict

    config = config_from_dict({"seed": 3, "task": {"family": "planted_kernel", "num_clients": 3, "samples_per_client": 8,
                                                  "tokens": 4, "dim": 3, "rank": 2, "outputs": 1, "zeta_value": 2.0},
                               "model": {"rank": 2}, "federated": {"rounds": 10, "local_steps": 3}})
    eta_stable, curvature = stable_step(config)
    assert eta_stable == pytest.approx(2 / curvature, rel=1e-15)
    small = predictor_inputs(config, 0.1 * eta_stable, curvature)
    double = predictor_inputs(config, 0.2 * eta_stable, curvature)
    assert double["drift_leading_order"] / small["drift_leading_order"] == pytest.approx(4.0, rel=1e-12)
    assert small["margin"] == pytest.approx(2 - 0.2, rel=1e-14) and not small["predicted_pays"]
    assert small["predicted_T0"] == 10
    E5 = predictor_inputs(config.with_updates({"federated.local_steps": 5}), 0.1 * eta_stable, curvature)
    assert E5["drift_leading_order"] / small["drift_leading_order"] == pytest.approx(4.0, rel=1e-12)   # (5−1)²/(3−1)²
    E1 = predictor_inputs(config.with_updates({"federated.local_steps": 1}), 0.1 * eta_stable, curvature)
    assert E1["drift_share"] == 0.0
    edge = predictor_inputs(config, 0.45 * eta_stable, curvature, warmups=[0, 2, 4, 6, 8, 10])
    assert edge["predicted_pays"] and edge["predicted_T0"] == 6   # 10 ln(1/0.45)/ln 3 = 7.27 → grid 6
