"""Recommenders with named information sets (docs/theory.md §8) and their regret score."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd
import pytest

from linattn_theory.cli.recommend_command import recommend_main
from linattn_theory.sim.config import config_from_dict
from linattn_theory.sim.engine import Divergence, clients_from_config, prepare_run, run_schedule, simulate
from linattn_theory.recommenders.recommendation import MODES, recommend
from linattn_theory.recommenders.online import (CHECKS, OnlineRule, drift_turn, fedavg_forecast, freeze_forecast,
                                                gain_error, online_decision, run_online, still_descending,
                                                _default_rule)
from linattn_theory.recommenders.scoring import (ScriptedRule, best_warmup, realised_risk, regret,
                                                 replay_online, score_instance, score_instances)

#: Clients of unequal size (Dirichlet α = 2: 12, 9 and 39 samples), so that the weights p_c matter.
SMALL = {"seed": 3,
         "task": {"family": "planted_kernel", "num_clients": 3, "samples_per_client": 20, "tokens": 5,
                  "dim": 3, "rank": 2, "outputs": 2, "zeta_value": 2.0, "zeta_covariate": 0.5,
                  "dirichlet_alpha": 2.0},
         "model": {"rank": 2},
         "federated": {"strategy": "fedfrozen", "rounds": 8, "warmup_rounds": 2, "local_steps": 4,
                       "learning_rate": 0.01, "ridge": 0.01}}


#: The same instance with a faster, more heterogeneous warm-up: R(T0) turns within 24 rounds, and
#: the rule freezes there (at round 16 with w = 2, h = 1, z = 0).
TURNING = {"federated.rounds": 24, "federated.learning_rate": 0.05, "federated.local_steps": 4,
           "task.zeta_value": 4.0, "model.init_scale": 1.5}


@pytest.fixture(scope="module")
def small():
    config = config_from_dict(SMALL)
    clients = clients_from_config(config)
    assert sorted(len(X) for X, _, _ in clients) == [9, 12, 39]      # the weights p_c are unequal
    return config, clients


# ----------------------------------------------------------------- the forecast vs the simulator
@pytest.mark.parametrize("server_learning_rate, attention", [(1.0, "linear"), (0.5, "linear"), (1.0, "softmax")])
def test_freeze_forecast_equals_simulated_frozen_stage(small, server_learning_rate, attention):
    """``F_λ(K_s, V_T)`` from the affine map (§5) equals an explicit frozen stage of k rounds.

    The simulator runs local gradient steps on the samples; the forecast uses only the value
    moments and ``M = Q diag(μ) Qᵀ``. Agreement to 1e-10 relative (float64 rounding over ≤ 12
    rounds of E = 4 steps) is far below the 1e-3 a wrong power of ``M`` or a dropped server step
    would leave. With softmax attention the features ``φ_h = Xᵀa_h`` of the frozen kernel are
    fixed too, and the same affine map holds (docs/theory.md §9).
    """
    config, clients = small
    config = config.with_updates({"federated.server_learning_rate": server_learning_rate,
                                  "model.attention": attention})
    fed = config.federated
    data, theta = prepare_run(config, clients)
    states = []
    run_schedule(theta, data, dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=3, rounds=3), 3,
                 config.seed, on_round=states.append)
    for s in (0, 3):
        forecast = freeze_forecast(states[s].params, data, fed, s)
        for k in (1, 5, 12):
            frozen = dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=0, rounds=k)
            run = run_schedule(states[s].params, data, frozen, 0, config.seed)
            simulated = float(run.table["loss_regularized"].iloc[-1])
            assert forecast.final_objective(k) == pytest.approx(simulated, rel=1e-10)
        assert forecast.final_objective(0) == pytest.approx(float(states[s].rows[-1]["loss_regularized"]),
                                                            rel=1e-10)
        ks = np.array([1, 5, 12])
        np.testing.assert_allclose(forecast.final_objective(ks), [forecast.final_objective(k) for k in ks],
                                   rtol=1e-13)


def test_freeze_forecast_reads_whole_numbers_of_rounds_from_one_table_bit_for_bit(small):
    """The rule asks each stored round for ``J(s, k)`` with ever smaller ``k``, round after round: a
    whole number ``k`` is read from a table of ``0..k`` computed once. Asked in any order — the
    largest first, as the rule does, or growing, which recomputes the table — it gives the numbers
    of the array call, bit for bit, so the live rule and its replay on a record's stored rows
    (``final_objective`` of an array) see the same numbers. Other ``k`` use the formula."""
    config, clients = small
    fed = config.federated
    data, theta = prepare_run(config, clients)
    states = []
    run_schedule(theta, data, dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=6, rounds=6), 6,
                 config.seed, on_round=states.append)
    ks = np.arange(0, 31)
    for state in (states[0], states[6]):
        def fresh():
            return freeze_forecast(state.params, data, fed, state.round)

        row = fresh().final_objective(ks).tolist()
        largest_first = fresh()
        assert [largest_first.final_objective(int(k)) for k in ks[::-1]][::-1] == row
        assert [largest_first.final_objective(k) for k in ks] == row            # read back, numpy integers too
        growing = fresh()
        assert [growing.final_objective(float(k)) for k in ks] == row
        assert all(isinstance(growing.final_objective(k), float) for k in (0, 7, 30, 2.5, -1))
        between = growing.final_objective(2.5)
        assert between == fresh().final_objective(np.array(2.5)) and between != row[2] and between != row[3]


@pytest.mark.parametrize("descent_confidence", [np.inf, 8.0])
def test_adaptive_run_realises_its_forecast_and_equals_fedfrozen(small, descent_confidence):
    """The adaptive strategy's final loss is the rule's forecast; without roll-back it is the
    FedFrozen run of the same T0 bit for bit; ``simulate`` dispatches to it. With the descent test
    off (``inf``, round 2's rule) the rule freezes at round 16; with it on, not earlier."""
    config, _ = small
    config = config.with_updates({**TURNING, "federated.strategy": "fedfrozen_adaptive",
                                  "federated.adaptive_window": 2, "federated.adaptive_horizon": 1,
                                  "federated.adaptive_confidence": 0.0,
                                  "federated.adaptive_descent_confidence": descent_confidence})
    clients = clients_from_config(config)
    online = run_online(config, clients)
    final = float(online.result.table["loss_regularized"].iloc[-1])
    if descent_confidence == np.inf:
        assert online.stop_round == online.kernel_round == 16          # the rule froze, without roll-back
    else:
        # the config's z_d reaches the rule: here its descent test holds the freeze back (to round 17)
        assert online.stop_round == online.kernel_round and 16 < online.stop_round < 24
    assert final == pytest.approx(online.predicted_objective, rel=1e-10)
    assert len(online.result.table) == 25 and online.result.metadata["stop_round"] == online.stop_round
    assert online.decisions["stop"].tolist() == [False] * online.stop_round + [True]
    again = simulate(config, clients)
    assert again.table["loss_regularized"].iloc[-1] == final
    fixed = simulate(config.with_updates({"federated.strategy": "fedfrozen",
                                          "federated.warmup_rounds": online.kernel_round}), clients)
    assert fixed.table["loss_regularized"].iloc[-1] == final


@pytest.mark.parametrize("stop_round, kernel_round", [(9, 4), (15, 2)])
def test_a_roll_back_realises_its_forecast(small, stop_round, kernel_round):
    """The roll-back branch: freezing the stored kernel of round ``s`` at round ``t > s`` runs the
    frozen stage from ``θ^s`` for ``T − t`` rounds; its final loss is the forecast ``J(s, T − t)``
    (and not ``J(s, T − s)``, the run that never spent the rounds ``s..t``)."""
    config, clients = small
    config = config.with_updates({"federated.rounds": 24})
    online = run_online(config, clients, ScriptedRule(stop_round, kernel_round))
    assert (online.stop_round, online.kernel_round) == (stop_round, kernel_round)
    final = float(online.result.table["loss_regularized"].iloc[-1])
    data, theta = prepare_run(config, clients)
    states = []
    run_schedule(theta, data, dataclasses.replace(config.federated, warmup_rounds=24), 24, config.seed,
                 on_round=states.append)
    forecast = freeze_forecast(states[kernel_round].params, data, config.federated, kernel_round)
    assert final == pytest.approx(forecast.final_objective(24 - stop_round), rel=1e-10)
    assert online.predicted_objective == pytest.approx(final, rel=1e-10)
    assert abs(forecast.final_objective(24 - kernel_round) - final) > 1e-6 * abs(final)
    assert len(online.result.table) == 25       # the spent rounds keep their rows


def test_run_online_decides_from_the_past_only(small):
    """Each recorded decision is what the rule says on the forecasts of rounds ≤ t of the path."""
    config, _ = small
    config = config.with_updates(TURNING)
    clients = clients_from_config(config)
    rule = OnlineRule(window=2, horizon=1, confidence=0.0)
    online = run_online(config, clients, rule)
    assert online.stop_round < 24
    data, theta = prepare_run(config, clients)
    states = []
    fed = config.federated
    run_schedule(theta, data, dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=24), 24,
                 config.seed, on_round=states.append)
    forecasts = [freeze_forecast(st.params, data, fed, st.round) for st in states]
    for t, row in online.decisions.iterrows():
        decision = online_decision(forecasts[:t + 1], 24, 2, 1, 0.0)
        assert (decision.stop, decision.kernel_round, decision.test) == (row["stop"], row["kernel_round"], row["test"])


# ----------------------------------------------------------------- the rule's arithmetic, by hand
class Hand:
    """A hand-made forecast of round ``s``: ``J(s, k) = A_s − c_s k`` (``c_s = 0.03 + 0.001 s``),
    profile ``Φ_λ(K_s)`` and drift floor ``D(K_s)`` given."""

    def __init__(self, s, A, profile, drift_floor):
        self.round, self.A, self.c = s, A, 0.03 + 0.001 * s
        self.profile, self.drift_floor = profile, drift_floor

    def final_objective(self, k):
        return self.A - self.c * np.asarray(k, dtype=float)


#: T = 20, w = 3, h = 2; rounds 0..8 of a warm-up that escaped (R_freeze(2) < R_freeze(0)) and flattens.
A = [5.0, 5.2, 4.9, 4.6, 4.3, 4.06, 4.04, 4.03, 4.02]
PROFILE = [3.0, 3.0, 2.9, 2.7, 2.5, 2.40, 2.39, 2.395, 2.40]
FLOOR = [0.1, 0.1, 0.1, 0.1, 0.1, 0.10, 0.11, 0.12, 0.13]


def hand(A=A, profile=PROFILE, floor=FLOOR, upto=8):
    return [Hand(s, A[s], profile[s], floor[s]) for s in range(upto + 1)]


def test_rule_arithmetic_on_a_hand_made_history():
    """Every number of the decision at round 8, computed by hand (exact fractions):

    R_freeze(u) = J(u, 20 − u) = A_u − c_u (20 − u): 4.4, 4.611, 4.324, ..., 3.535, 3.536, 3.549, 3.564
    (rounds 0..8); it first falls below R_freeze(0) at round 2, so the escape ends at round 2 + w = 5.
    gain = −h × slope(R_freeze(5..8)) = −2 × 0.01 = −0.02. cost = min_s J(s, 10) − min_s J(s, 12)
    = (4.02 − 0.038·10) − (4.02 − 0.038·12) = 0.076 (both minima at s = 8). FedAvg's forecast:
    slope(A_5..8) = −0.013, F̂ = 4.02 + 12 × (−0.013) = 3.864; residuals of that fit 0.003, −0.004,
    −0.001, 0.002, σ = √(3e-5/2) = 0.0038730. Freeze: 3.564 < 3.864 − σ.
    """
    d = online_decision(hand(), 20, window=3, horizon=2, confidence=1.0)
    assert d.stop and d.kernel_round == 8 and d.test == "no_harm"
    assert d.gain == pytest.approx(-0.02, abs=1e-12)
    assert d.cost == pytest.approx(0.076, abs=1e-12)
    assert d.freeze_objective == pytest.approx(3.564, abs=1e-12)
    assert d.fedavg_forecast == pytest.approx(3.864, abs=1e-12)
    assert d.forecast_error == pytest.approx(np.sqrt(3e-5 / 2), rel=1e-9)
    # the same forecast from the pure function, and z scales the error
    assert fedavg_forecast(A, 20, 3, 2.5) == pytest.approx((3.864, 2.5 * np.sqrt(3e-5 / 2)), rel=1e-9)
    # a rising FedAvg path (slope +0.1, an exact line: σ = 0) is forecast flat, never rising: the
    # forecast stays optimistic for FedAvg, so the no-harm test errs towards training on
    assert fedavg_forecast([1.0, 1.1, 1.2, 1.3], 10, 3, 2.0) == pytest.approx((1.3, 0.0), abs=1e-12)


def test_rule_gain_error_is_the_slopes_standard_error_and_z_g_spares_it():
    """The gain's standard error at round 8, by hand: R_freeze(5..8) = 3.535, 3.536, 3.549, 3.564 has
    slope 0.01 and residuals 0.004, −0.005, −0.002, 0.003 about its line, so σ = √(54e-6/2) and
    se(gain) = h σ/√Σx² = 2 √(27e-6)/√5 = 0.0046476 (x = −1.5..1.5). The gain test keeps training
    while gain + z_g se > cost: −0.02 + z_g × 0.0046476 > 0.076 for z_g > 20.66 only."""
    risk = [a - (0.03 + 0.001 * s) * (20 - s) for s, a in enumerate(A)]
    assert gain_error(risk, 3, 2) == pytest.approx(2 * np.sqrt(27e-6 / 5), rel=1e-9)
    assert gain_error(risk, 3, 1) == pytest.approx(np.sqrt(27e-6 / 5), rel=1e-9)
    held = online_decision(hand(), 20, 3, 2, 1.0, gain_confidence=21.0)
    assert not held.stop and held.test == "gain"
    assert online_decision(hand(), 20, 3, 2, 1.0, gain_confidence=20.0).stop
    by_rule = OnlineRule(3, 2, 1.0, 21.0).decide(hand(), 20)
    assert (by_rule.stop, by_rule.test, by_rule.gain, by_rule.cost) == (False, "gain", held.gain, held.cost)


#: Rounds 5..8 of a slow descent: R_freeze = 3.604, 3.585, 3.578, 3.573 (slope −0.01 per round exactly,
#: the residuals 0.004, −0.005, −0.002, 0.003 of the gain-error test), A_u = R_freeze(u) + c_u (20 − u).
SLOW = A[:5] + [4.129, 4.089, 4.059, 4.029]


def test_rule_descent_test_keeps_training_while_r_freeze_still_falls():
    """By hand, at round 8 of ``SLOW`` (w = 3, h = 2): gain = −2 × (−0.01) = 0.02 with se(gain) =
    2 √(27e-6/5) = 0.0046476, and cost = J(8, 10) − J(8, 12) = 0.076 (both minima at s = 8). The gain
    test freezes (0.02 + 3 se = 0.034 ≤ 0.076: one more round is worth less than the frozen rounds it
    gives up), the drift test too (the profile did not rise), and so does the no-harm test
    (F̂ = 4.029 − 12 × 0.033 = 3.633, σ = √(15e-6); 3.573 < F̂ − σ). But R_freeze(8) already counts
    those frozen rounds and still falls: the descent test keeps training while
    0.02 > z_d × 0.0046476, i.e. for z_d < 4.3033, and is off without z_d."""
    base = online_decision(hand(A=SLOW), 20, 3, 2, 1.0)
    assert base.stop and base.kernel_round == 8 and base.test == "no_harm"
    assert base.gain == pytest.approx(0.02, abs=1e-12) and base.cost == pytest.approx(0.076, abs=1e-12)
    assert base.freeze_objective == pytest.approx(3.573, abs=1e-12)
    assert base.fedavg_forecast == pytest.approx(3.633, abs=1e-12)
    error = 2 * np.sqrt(27e-6 / 5)
    held = online_decision(hand(A=SLOW), 20, 3, 2, 1.0, descent_confidence=4.30)
    assert not held.stop and held.test == "descent"
    assert (held.gain, held.cost) == (base.gain, base.cost)
    assert online_decision(hand(A=SLOW), 20, 3, 2, 1.0, descent_confidence=4.31).stop
    assert still_descending(0.02, error, 4.30) and not still_descending(0.02, error, 4.31)
    assert not still_descending(0.02, error, None) and not still_descending(-0.02, error, 0.0)
    # the rule and the config carry z_d; the ablation without the descent test freezes
    assert not OnlineRule(3, 2, 1.0, 3.0, 4.30).decide(hand(A=SLOW), 20).stop
    assert online_decision(hand(A=SLOW), 20, 3, 2, 1.0, descent_confidence=4.30,
                           checks=("gain", "drift", "no_harm")).stop
    # on the flattening history of the other tests R_freeze rises (gain −0.02): no descent to wait for
    assert online_decision(hand(), 20, 3, 2, 1.0, descent_confidence=0.0).stop


def test_rule_escape_ends_exactly_w_rounds_after_the_first_fall():
    """R_freeze first falls below R_freeze(0) at round 2; with w = 3 rounds 3 and 4 still escape and
    round 5 does not (at round 5 the gain, 0.53 by hand, beats the cost 0.07: it continues there)."""
    for t in (3, 4):
        assert online_decision(hand(upto=t), 20, 3, 2, 1.0).test == "escape"
    d = online_decision(hand(upto=5), 20, 3, 2, 1.0)
    assert not d.stop and d.test == "gain"
    assert d.gain == pytest.approx(0.53, abs=1e-12) and d.cost == pytest.approx(0.07, abs=1e-12)


def test_rule_drift_test_keeps_training_when_the_profile_rises():
    """Over rounds 5..8 the drift floor rose by 0.03: a profile that rose by 0.05 (2.40 → 2.45) is a
    transient of the kernel, and the rule continues; one that did not rise lets it freeze."""
    rising = PROFILE[:8] + [2.45]
    d = online_decision(hand(profile=rising), 20, 3, 2, 1.0)
    assert not d.stop and d.test == "drift"
    assert online_decision(hand(profile=rising), 20, 3, 2, 1.0, checks=("gain", "no_harm")).stop
    # the window is exactly rounds t − w..t: over 5..8 this profile rose by 0.02 ≤ 0.03 (the floor's
    # rise), so the rule freezes; over 6..8 alone it rose by 0.05 > 0.02, which a window one round
    # short would read as a transient
    edge = PROFILE[:5] + [2.40, 2.37, 2.39, 2.42]
    assert drift_turn(edge, FLOOR, 3) and not drift_turn(edge, FLOOR, 2)
    assert online_decision(hand(profile=edge), 20, 3, 2, 1.0).stop


def test_rule_no_harm_threshold_is_z_sigma():
    """Freezing wins by F̂ − best = 3.864 − 3.564 = 0.3 = 77.46 σ: z = 75 freezes, z = 80 does not."""
    assert online_decision(hand(), 20, 3, 2, 75.0).stop
    d = online_decision(hand(), 20, 3, 2, 80.0)
    assert not d.stop and d.test == "no_harm" and d.forecast_error == pytest.approx(80 * np.sqrt(1.5e-5), rel=1e-9)


def test_rule_rolls_back_to_the_best_stored_kernel():
    """A_6 = 3.90 is the lowest: J(s, 12) = 3.64, 3.468, 3.506, 3.544 for s = 5..8, so the rule
    freezes K_6 at round 8 (F̂ = 4.00 − 12 × 0.013 = 3.844 and σ = 0.0813 leave the margin)."""
    rolled = A[:6] + [3.90, 3.95, 4.00]
    d = online_decision(hand(A=rolled), 20, 3, 2, 1.0, gain_confidence=0.0)   # the gain test as in round 1
    assert d.stop and d.kernel_round == 6 and d.freeze_objective == pytest.approx(3.468, abs=1e-12)
    assert d.fedavg_forecast == pytest.approx(3.844, abs=1e-12)
    assert d.cost == pytest.approx(0.072, abs=1e-12)


def test_rule_at_the_budget_is_fedavg_and_rejects_bad_settings():
    d = online_decision(hand(upto=2), 2)
    assert d.stop and d.kernel_round == 2 and d.test == "budget"
    with pytest.raises(ValueError, match="window"):
        OnlineRule(window=0)
    with pytest.raises(ValueError, match="confidence"):
        OnlineRule(confidence=-1.0)
    with pytest.raises(ValueError, match="gain_confidence"):
        OnlineRule(gain_confidence=float("nan"))
    with pytest.raises(ValueError, match="forecasts"):
        online_decision(hand(upto=5), 3)
    with pytest.raises(ValueError, match="checks"):
        online_decision(hand(), 20, checks=("gain", "patience"))
    with pytest.raises(ValueError, match="descent_confidence"):
        OnlineRule(descent_confidence=-1.0)
    assert CHECKS == ("gain", "descent", "drift", "no_harm")


def test_rule_defaults_are_the_configs():
    """``fedfrozen_adaptive`` runs the rule's defaults unless the config says otherwise."""
    fed = config_from_dict({}).federated
    rule = OnlineRule()
    assert (fed.adaptive_window, fed.adaptive_horizon, fed.adaptive_confidence, fed.adaptive_gain_confidence,
            fed.adaptive_descent_confidence) == (rule.window, rule.horizon, rule.confidence, rule.gain_confidence,
                                                 rule.descent_confidence)
    custom = config_from_dict({"federated": {"strategy": "fedfrozen_adaptive", "adaptive_descent_confidence": 1.5}})
    assert _default_rule(custom.federated).descent_confidence == 1.5


def _same_fields(a, b) -> bool:
    """Two dataclasses are equal field for field, a NaN equal to a NaN (bit for bit otherwise)."""
    def same(x, y):
        if isinstance(x, float) and isinstance(y, float) and np.isnan(x) and np.isnan(y):
            return True
        return x == y
    return all(same(x, y) for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True))


# ----------------------------------------------------------------- replayed on a record = run in training
def test_a_records_forecast_table_is_its_rounds_forecasts_and_the_rule_decides_the_same(small):
    """StoredForecasts hands the rule whole columns of the record's table J(s, k): each column, the
    diagonal R_freeze and the profiles are the numbers each round's StoredForecast gives, and every
    decision of several rules (every test deciding somewhere) at every round equals the decision
    on a plain list of the rounds' forecasts, field for field (the replays of the committed
    benchmark were checked the same way: 141,916 replays on 2,201 records, equal outcomes)."""
    from linattn_theory.recommenders.scoring import StoredForecast, StoredForecasts, stored_forecasts

    config, clients = small
    config = config.with_updates({"federated.rounds": 24, "federated.learning_rate": 0.1})
    record = score_instance(config, clients, restarts=1)
    table, T = stored_forecasts(record), 24
    plain = [StoredForecast(record, s) for s in range(len(table))]
    assert isinstance(table, StoredForecasts) and len(table) == T + 1
    for t in (0, 7, T):
        prefix = table[:t + 1]
        assert isinstance(prefix, StoredForecasts) and len(prefix) == t + 1
        for k in range(T - t + 1):
            assert prefix.column(k).tolist() == [f.final_objective(k) for f in plain[:t + 1]]
        assert prefix.diagonal(T).tolist() == [f.final_objective(T - f.round) for f in plain[:t + 1]]
        assert prefix.profiles == [f.profile for f in plain[:t + 1]]
        assert prefix.drift_floors == [f.drift_floor for f in plain[:t + 1]]
    assert table[3].round == 3 and table[-1].round == T and [f.round for f in table[2:8:3]] == [2, 5]
    tests = set()
    for rule in (OnlineRule(), OnlineRule(2, 1, 0.0, 0.0, None), OnlineRule(3, 2, 1.0, 0.0, None),
                 OnlineRule(4, 1, 0.0, 0.0, 0.5), OnlineRule(2, 1, 5.0, 0.0, None)):
        for t in range(T + 1):
            fast, slow = rule.decide(table[:t + 1], T), rule.decide(plain[:t + 1], T)
            assert _same_fields(fast, slow), (fast, slow)
            tests.add(fast.test)
    assert tests == {"escape", "gain", "descent", "drift", "no_harm", "budget"}


@pytest.mark.parametrize("federated", [{}, {"batch_size": 6, "participation": 0.5}])
def test_replayed_rule_is_the_run_and_its_realised_risk(small, federated):
    """On a stored record the rule takes the decisions it takes in training (full batch, and with
    minibatches and half the clients per round), and ``realised_risk`` is the run's final excess risk
    (a simulation for a roll-back under noise)."""
    config, clients = small
    config = config.with_updates({"federated.rounds": 24, **{f"federated.{k}": v for k, v in federated.items()}})
    record = score_instance(config, clients, restarts=1)
    assert record["noisy"] == bool(federated)
    for rule in (OnlineRule(2, 1, 0.0), OnlineRule(3, 1, 1.0), ScriptedRule(10, 5)):
        t, s, decision = replay_online(record, rule)
        run = run_online(config, clients, rule)
        assert (t, s) == (run.stop_round, run.kernel_round)
        final = float(run.result.table["loss_regularized"].iloc[-1]) - record["optimum"]
        assert realised_risk(record, t, s, config, clients) == pytest.approx(final, rel=1e-9)
        assert decision.freeze_objective == pytest.approx(run.predicted_objective - record["optimum"], rel=1e-9)


def test_a_record_reads_its_fedavg_path_from_the_truths_run(small, monkeypatch):
    """Nothing is run twice: the record's forecasts (with full batches also its pilot and bound) come
    from the FedAvg run of the truth's sweep (a second FedAvg run fails this test), and they are that
    run's: ``J(t, 0)`` is the sweep's ``F_λ(θ_t)``, the FedAvg result's loss at round ``t``, to
    rounding. Under minibatches the record is the one its own FedAvg run gives, field for field
    (both run the Array-API engine)."""
    import linattn_theory.recommenders.scoring as scoring
    from linattn_theory.sim.warmup_grid import warmup_sweep

    config, clients = small
    config = config.with_updates({"federated.rounds": 12})

    def refuse(*args, **kwargs):
        raise AssertionError("a second FedAvg run")

    monkeypatch.setattr(scoring, "fedavg_path", refuse)
    record = score_instance(config, clients, restarts=1)
    assert not record["fedavg_diverged"] and len(record["freeze_objective"]) == 13
    fedavg = warmup_sweep(config.with_updates({"federated.strategy": "fedfrozen"}), [12], clients)[12]
    objective = np.array([row[-1] for row in record["freeze_objective"]]) + record["optimum"]   # J(t, 0)
    np.testing.assert_allclose(objective, fedavg.table["loss_regularized"].to_numpy(), rtol=1e-10)
    noisy = config.with_updates({"federated.batch_size": 6, "federated.participation": 0.5})
    record = score_instance(noisy, clients, restarts=1)
    assert record["noisy"] and len(record["freeze_objective"]) == 13
    monkeypatch.undo()
    truth = {k: record[k] if k != "diverged" else np.zeros(13, dtype=bool) for k in ("excess_risk", "optimum", "diverged")}
    assert scoring._record(noisy, clients, truth, None, path=None) == record       # its own FedAvg run


def test_a_records_pilot_and_bound_read_one_table_of_path_terms(small, monkeypatch):
    """With full batches a record computes the path terms of its FedAvg run once (issue 34, item 1):
    the pilot's are the first ``T_p + 1`` rounds of them (:func:`first_rounds`), equal bit for bit to
    the pilot path's own, and the pilot's ``T0`` and the a-posteriori bound's are those computed from
    separate tables; a table of another length is refused."""
    import linattn_theory.theory.bound as bound
    from linattn_theory.recommenders.recommendation import default_pilot_rounds, pilot_warmup
    from linattn_theory.recommenders.scoring import fedavg_path

    config, clients = small
    config = config.with_updates({"federated.rounds": 12})
    calls = []
    path_terms = bound.path_terms
    monkeypatch.setattr(bound, "path_terms", lambda path, *rest: (calls.append(len(path.params)),
                                                                  path_terms(path, *rest))[1])
    record = score_instance(config, clients, restarts=1)
    assert calls == [13]                                     # one table, the whole run's
    monkeypatch.undo()
    Tp, optimum = default_pilot_rounds(12), record["optimum"]
    states = fedavg_path(config, clients)[1]
    path, pilot = bound.path_from_states(states), bound.path_from_states(states[:Tp + 1])
    whole, own = path_terms(path, clients, config, optimum), path_terms(pilot, clients, config, optimum)
    assert bound.first_rounds(whole, Tp).equals(own) and not whole.iloc[:Tp + 1].equals(own)
    assert record["pilot_T0"] == pilot_warmup(config, clients, pilot, optimum)[0]
    assert record["a_posteriori_T0"] == bound.estimate_bound(config, clients, path=path, optimum=optimum).T0_theory
    with_terms = bound.estimate_bound(config, clients, path=path, optimum=optimum, terms=whole)
    assert with_terms.curve.equals(bound.estimate_bound(config, clients, path=path, optimum=optimum).curve)
    with pytest.raises(ValueError, match="one per round of the path"):
        bound.estimate_bound(config, clients, path=path, optimum=optimum, terms=own)
    with pytest.raises(ValueError, match="one per pilot round"):
        pilot_warmup(config, clients, pilot, optimum, whole)
    with pytest.raises(ValueError, match="0 <= rounds < 13"):
        bound.first_rounds(whole, 13)


def test_a_record_whose_fedavg_path_diverges_where_its_truth_did_not_is_counted_as_diverged(small, monkeypatch):
    """Near the edge of stability the truth's FedAvg run (an ensemble) can end finite while the
    record's own FedAvg run of the same config diverges (another engine's rounding; seen on an
    evaluation instance of round 3): the record says FedAvg diverged and where, and is not scored.
    A record runs its own FedAvg path only when it is not handed its truth's (``path=None``)."""
    import linattn_theory.recommenders.scoring as scoring

    config, clients = small
    config = config.with_updates({"federated.rounds": 12, "federated.batch_size": 6, "federated.participation": 0.5})
    honest = score_instance(config, clients, restarts=1)
    assert not honest["fedavg_diverged"] and "fedavg_path_diverged_at" not in honest
    truth = {"excess_risk": np.array(honest["excess_risk"]), "optimum": honest["optimum"],
             "diverged": np.zeros(13, dtype=bool)}
    assert scoring._record(config, clients, truth, None) == honest
    real = scoring.fedavg_path

    def diverging(config, clients, *, with_divergence=False):
        data, states, _ = real(config, clients, with_divergence=True)
        cut = Divergence(7, float("inf"), 0.01, "diverged at round 7 (stand-in)")
        return (data, states[:8], cut) if with_divergence else (data, states[:8])

    monkeypatch.setattr(scoring, "fedavg_path", diverging)
    record = scoring._record(config, clients, truth, None)
    assert record["fedavg_diverged"] and record["fedavg_path_diverged_at"] == 7
    assert record["excess_risk"] == honest["excess_risk"] and "freeze_objective" not in record


@pytest.mark.slow
def test_records_scored_together_are_the_records_scored_alone(small):
    """The benchmark scores instances in chunks (their truths as one ensemble, their optima as one
    batched program): each record is the one-instance record, bit for bit, whoever shares its chunk —
    here a second seed and an instance of another shape (minibatches)."""
    config, _ = small
    configs = [config.with_updates({"federated.rounds": 12}), config.with_updates({"federated.rounds": 12, "seed": 5}),
               config.with_updates({"federated.rounds": 12, "federated.batch_size": 6})]
    together = score_instances(configs, restarts=1)
    assert together == [score_instance(c, restarts=1) for c in configs]
    assert score_instances(configs[::-1], restarts=1) == together[::-1]


# ----------------------------------------------------------------- the recommenders
@pytest.mark.parametrize("mode", MODES)
def test_recommend_names_its_information_set(small, mode):
    config, clients = small
    kwargs = {"transfer_seeds": [4]} if mode == "transfer" else {}
    rec = recommend(config, clients if mode != "transfer" else None, mode=mode, measure=(mode == "online"),
                    restarts=1, **kwargs)
    T = config.federated.rounds
    assert rec.mode == mode and 0 <= rec.T0_theory <= T
    assert rec.descriptive == (mode == "a_posteriori")
    word = {"online": "causal", "pilot": "pilot", "transfer": "transfer", "a_posteriori": "a posteriori"}[mode]
    assert rec.information.startswith(word)
    if mode == "pilot":
        assert rec.T0_theory >= rec.details["pilot_rounds"]
    if mode == "online":
        m = rec.measured.set_index("run")
        assert m.loc["recommended", "excess_risk"] == pytest.approx(
            rec.details["predicted_objective"] - m.loc["recommended", "optimum"], rel=1e-9)


def test_recommend_refuses_leaking_information(small):
    config, clients = small
    with pytest.raises(ValueError, match="own seed"):
        recommend(config, mode="transfer", transfer_seeds=[config.seed], measure=False)
    with pytest.raises(ValueError, match="T/4"):
        recommend(config, clients, mode="pilot", pilot_rounds=3, measure=False)
    with pytest.raises(ValueError, match="mode"):
        recommend(config, clients, mode="oracle")


def test_recommend_command_labels_the_fit_descriptive(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(_toml(SMALL))
    out = io.StringIO()
    assert recommend_main(path, out=out, mode="a_posteriori", measure=False) == 0
    report = out.getvalue()
    assert "A POSTERIORI FIT (descriptive)" in report and "mode: a_posteriori" in report
    out = io.StringIO()
    assert recommend_main(path, out=out, measure=False) == 0
    assert "mode: online" in out.getvalue() and "descriptive" not in out.getvalue()
    bad = tmp_path / "bad.toml"
    bad.write_text(_toml(SMALL).replace("rounds = 8", "rounds = 8\nwarmup_round = 2"))
    out = io.StringIO()
    assert recommend_main(bad, out=out) == 2 and out.getvalue() == ""


def _toml(data: dict) -> str:
    lines = [f"seed = {data['seed']}"]
    for section in ("task", "model", "federated"):
        lines.append(f"[{section}]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in data[section].items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- regret
def test_regret_helpers():
    R = np.array([3.0, 1.0, 1.0, 2.0, np.inf])
    assert best_warmup(R) == 1
    assert regret(2.0, R) == pytest.approx(1.0)
    assert regret(np.inf, R) == np.inf


def _benchmark():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("predictive_regret", root / "benchmarks" / "predictive_regret.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench, root


def test_quoted_regret_tables_are_the_committed_ones():
    """docs/theory.md §8 quotes the tables (the goal, every evaluation set, the forecast errors, the
    design table); they must be the ones the committed scores and design table give."""
    bench, root = _benchmark()
    scores = pd.read_csv(root / "figures" / "predictive_regret_scores.csv")
    design = pd.read_csv(root / "figures" / "predictive_regret_design.csv")
    table = bench.report(scores, design)
    assert (root / "figures" / "predictive_regret.md").read_text() == table
    docs = (root / "docs" / "theory.md").read_text()
    assert table.strip() in docs
    # every declared evaluation set is scored, on ≥ 90 instances, with seeds disjoint from the design's
    evaluation = [name for name, spec in bench.SETS.items() if spec[1] == "evaluation"]
    assert sorted(set(scores["set"])) == sorted(evaluation)
    assert (scores.drop_duplicates(["set", "setting", "seed"]).groupby("set").size() >= 90).all()
    design_seeds = {s for spec in bench.SETS.values() if spec[1] == "design" for s in spec[2]}
    assert not set(scores["seed"]) & design_seeds


def test_the_rule_is_the_criterions_choice_on_the_committed_design_table():
    """The defaults of OnlineRule and of the config are what the pre-registered criterion picks from
    the committed design table (and the table covers every candidate on every design variant)."""
    bench, root = _benchmark()
    design = pd.read_csv(root / "figures" / "predictive_regret_design.csv")
    chosen = bench.choose_rule(design)
    rule, fed = OnlineRule(), config_from_dict({}).federated
    expected = tuple(chosen[p] for p in bench.RULE_PARAMS)
    assert (rule.window, rule.horizon, rule.confidence, rule.gain_confidence, rule.descent_confidence) == expected
    assert (fed.adaptive_window, fed.adaptive_horizon, fed.adaptive_confidence,
            fed.adaptive_gain_confidence, fed.adaptive_descent_confidence) == expected
    docs = " ".join((root / "docs" / "theory.md").read_text().split())
    w, h, z, zg, zd = expected
    assert f"It chose $w = {w}$, $h = {h}$, $z = {z:g}$, $z_g = {zg:g}$, $z_d = {zd:g}$." in docs
    full = design[design["checks"] == "+".join(CHECKS)]
    assert len(full) == len(bench.candidate_rules()) * design["variant"].nunique()
    assert set(design["variant"]) == {spec[0] for spec in bench.SETS.values() if spec[1] == "design"}
    # none admissible: the fallback's smallest largest harm share, as the docs quote it
    share = full.assign(share=full["harm"] / full["instances"]).groupby("rule")["share"].max()
    fewest = full[full["rule"] == share.idxmin()].assign(share=lambda d: d["harm"] / d["instances"])
    worst = fewest.loc[fewest["share"].idxmax()]
    assert chosen["admissible"] == 0 and "In round 3 no candidate was admissible" in docs
    assert (f"(the fewest: {worst['harm']} of the {worst['instances']} {worst['variant']} instances, "
            f"{100 * worst['share']:.1f} %)") in docs


def test_the_reading_of_the_score_in_the_docs_follows_from_the_committed_scores():
    """docs/theory.md §8, "Reading the score", recomputed from figures/predictive_regret_scores.csv:
    the median goal met on every evaluation set (the rule's median FedAvg's or lower); no harm on
    every set, with the counts quoted; round 2's rule harming the strong instances quoted (early
    freezes of a slow descent, each trained to the end by round 3); the two instances round 3 harms
    of the kinds quoted; the worst case above 10 % everywhere, each set's worst instance a run to the
    end with FedAvg's regret; the freeze counts, mean regrets and shares better than T/2 as quoted;
    the pilot's worst case at least 42 %; the lowest design worst case as quoted."""
    bench, root = _benchmark()
    scores = pd.read_csv(root / "figures" / "predictive_regret_scores.csv")
    docs = " ".join((root / "docs" / "theory.md").read_text().split())
    T = 40
    half_shares, pilot_worst, means, harmed_rows = [], [], {}, {}
    for name in sorted(set(scores["set"])):
        d = scores[(scores["set"] == name) & ~scores["fedavg_diverged"]]
        frame = {r: d[d["recommender"] == r].set_index(["setting", "seed"])
                 for r in ("online", "previous", "fedavg", "half", "pilot")}
        arm = {r: f["regret"] for r, f in frame.items()}
        harmed = {r: arm[r][arm[r] - arm["fedavg"] > bench.HARM_MARGIN] for r in ("online", "previous")}
        n, k = len(arm["online"]), len(harmed["online"])
        assert arm["online"].median() <= bench.GOAL["median"], name
        assert arm["online"].median() <= arm["fedavg"].median(), name
        assert k / n <= bench.GOAL["harm_share"], name
        worse = arm["online"] > arm["fedavg"] + bench.TIE       # worse than FedAvg only where harmed
        assert set(arm["online"][worse].index) == set(harmed["online"].index), name
        if k:
            assert f"{k} of {n}" in docs and f"({100 * k / n:.1f} %)" in docs, name
        harmed_rows[name] = frame["online"].loc[harmed["online"].index].assign(
            previous_harmed=[i in harmed["previous"].index for i in harmed["online"].index],
            previous_stop=frame["previous"].loc[harmed["online"].index, "stop_round"].to_numpy())
        if name == "evaluation_strong":
            assert k == 0 and f"harms {len(harmed['previous'])} of {n} strong instances " \
                              f"({100 * len(harmed['previous']) / n:.1f} %)" in docs
            early = frame["previous"].loc[harmed["previous"].index]
            assert early["stop_round"].between(9, 20).all() and (early["learning_rate"] <= 0.0016).all()
            assert (early["best_T0"] >= 39).all() and (frame["online"].loc[early.index, "stop_round"] == T).all()
        elif name not in ("evaluation", "evaluation_minibatch"):
            assert k == 0, name
        worst = arm["online"].idxmax()
        assert arm["online"][worst] > bench.GOAL["max"], name
        assert frame["online"].loc[worst, "stop_round"] == T and arm["online"][worst] == pytest.approx(arm["fedavg"][worst])
        half_shares.append((arm["online"] < arm["half"] - bench.TIE).mean())
        pilot_worst.append(arm["pilot"].max())
        means[name] = {r: 100 * arm[r].mean() for r in ("online", "previous", "fedavg")}
        if name == "evaluation":
            frozen = {r: int((frame[r]["stop_round"] < T).sum()) for r in ("online", "previous")}
            assert f"froze before the end on {frozen['online']} of the {n} linear instances, round 2's rule on " \
                   f"{frozen['previous']}" in docs
    # the two harmed instances: a roll-back harmed by round 2 too (linear), an own-kernel freeze (minibatch)
    linear, minibatch = harmed_rows["evaluation"], harmed_rows["evaluation_minibatch"]
    assert len(linear) == len(minibatch) == 1
    row = linear.iloc[0]
    assert row["T0"] < row["stop_round"] and row["previous_harmed"]
    assert f"decided at round {row['stop_round']:.0f}, froze the kernel of round {row['T0']:.0f}, best " \
           f"$T_0 = {row['best_T0']}$; regret {100 * row['regret']:.1f} %" in docs
    row = minibatch.iloc[0]
    assert row["T0"] == row["stop_round"] and row["previous_stop"] == T and not row["previous_harmed"]
    assert f"a freeze at round {row['stop_round']:.0f} where the best $T_0$ is {row['best_T0']} " \
           f"(regret {100 * row['regret']:.1f} %" in docs
    # the edge-of-stability instance: scored since record format 3 (its record reads the truth's FedAvg run)
    strong = scores[scores["set"] == "evaluation_strong"]
    assert not strong["fedavg_diverged"].any()
    edge = strong[(strong["seed"] == 5002) & (strong["heterogeneity"] == 1.5) & (strong["local_steps"] == 20)
                  & (strong["learning_rate"].round(4) == 0.0038)].set_index("recommender")
    online = edge.loc["online"]
    assert f"the rule decided at round {online['stop_round']:.0f} and rolled back to the kernel of round " \
           f"{online['T0']:.0f} (best $T_0 = {online['best_T0']}$), regret {100 * online['regret']:.1f} % against " \
           f"FedAvg's {100 * edge.loc['fedavg', 'regret']:.1f} %" in docs and online["T0"] < online["stop_round"]
    higher = sorted(n for n, m in means.items() if round(m["online"], 1) > round(m["previous"], 1))
    assert higher == ["evaluation", "evaluation_minibatch"] and "mean regret is higher on two sets" in docs
    for name, label in (("evaluation", "linear"), ("evaluation_minibatch", "minibatch")):
        assert f"{label} {means[name]['online']:.1f} % against {means[name]['previous']:.1f} %" in docs
    assert f"strong: {means['evaluation_strong']['online']:.1f} % against {means['evaluation_strong']['previous']:.1f} %" in docs
    assert all(m["online"] < m["fedavg"] for m in means.values())
    design = pd.read_csv(root / "figures" / "predictive_regret_design.csv")
    full = design[design["checks"] == "+".join(CHECKS)]
    lowest = full.groupby("variant")["max"].min()
    assert (lowest > bench.GOAL["max"]).all()
    assert f"(the lowest: {100 * lowest.min():.1f} % on the skewed sizes)" in docs and lowest.idxmin() == "skewed"
    assert f"better on {100 * min(half_shares):.0f}–{100 * max(half_shares):.0f} % of the instances" in docs
    assert np.isfinite(pilot_worst).all() and min(pilot_worst) >= 0.42 and "at least 42 % on every set" in docs


def test_each_test_of_the_rule_prevents_harm_on_the_design_sets():
    """docs/theory.md §8: leaving out any one of the four tests (gain, descent, drift, no harm) harms
    more design instances of some variant than the chosen rule does; the previous rule (round 2's,
    without the descent test) harms more on the strong set, where the descent test was aimed."""
    bench, root = _benchmark()
    design = pd.read_csv(root / "figures" / "predictive_regret_design.csv")
    chosen = bench.choose_rule(design)
    harm = design.pivot_table(index="rule", columns="variant", values="harm")
    full = harm.loc[bench.rule_name(*bench.rule_spec(chosen))]
    for left in CHECKS:
        ablated = harm.loc[bench.rule_name(*bench.rule_spec(chosen, tuple(c for c in CHECKS if c != left)))]
        assert (ablated > full).any(), left
    previous = harm.loc[bench.rule_name(**bench.PREVIOUS)]
    assert previous["strong"] > full["strong"]
    without_descent = harm.loc[bench.rule_name(*bench.rule_spec(chosen, ("gain", "drift", "no_harm")))]
    assert without_descent["strong"] > full["strong"]


def test_choose_rule_applies_the_declared_criterion():
    """On a hand-made design table: an inadmissible rule with the lowest mean loses to admissible
    ones; among those the lower mean of means wins; ties go to the smaller window."""
    bench, _ = _benchmark()
    candidates = [((4, 1, 0.0, 0.0, None), (0.001, 0.001), (2, 0)),  # harms 2 of 100: out
                  ((5, 1, 1.0, 2.0, 3.0), (0.010, 0.030), (1, 0)),   # admissible, mean 0.02
                  ((6, 1, 2.0, 0.0, None), (0.020, 0.020), (0, 0)),  # admissible, mean 0.02
                  ((8, 1, 2.0, 0.0, 2.0), (0.030, 0.020), (0, 0))]   # admissible, 0.025

    def table(candidates):
        rows = []
        for (w, h, z, zg, zd), means, harms in candidates:
            for variant, mean, harm in zip(("linear", "minibatch"), means, harms):
                rows.append({"rule": bench.rule_name(w, h, z, zg, zd), "window": w, "horizon": h, "confidence": z,
                             "gain_confidence": zg, "descent_confidence": np.nan if zd is None else zd,
                             "checks": "+".join(CHECKS), "variant": variant, "instances": 100, "mean": mean,
                             "harm": harm})
        return pd.DataFrame(rows)

    chosen = bench.choose_rule(table(candidates))
    assert (chosen["window"], chosen["confidence"], chosen["gain_confidence"], chosen["descent_confidence"],
            chosen["admissible"]) == (5, 1.0, 2.0, 3.0, 3)
    # a rule without the descent test (NaN in the table) is a candidate like the others, and chosen as None
    chosen = bench.choose_rule(table(candidates[:1] + candidates[2:]))
    assert (chosen["window"], chosen["descent_confidence"], chosen["admissible"]) == (6, None, 2)
    # none admissible: the smallest largest harm share wins
    worse = [(spec, means, (harm + 2, 0)) for spec, means, (harm, _) in candidates]
    chosen = bench.choose_rule(table(worse))
    assert (chosen["window"], chosen["admissible"]) == (6, 0)


@pytest.mark.slow
def test_regret_benchmark_quick_is_resumable_and_worker_independent(tmp_path):
    """The benchmark's quick mode: cached records are reused, and 1 or 2 workers give the same bytes."""
    bench, _ = _benchmark()
    out = {}
    for workers, cache in ((1, "a"), (2, "b")):
        target = tmp_path / f"out{workers}"
        assert bench.main(["--quick", "--no-figure", "--workers", str(workers), "--out", str(target),
                           "--cache", str(tmp_path / cache)]) == 0
        out[workers] = [(target / f"predictive_regret_{n}.csv").read_bytes() for n in ("scores", "design")]
    assert out[1] == out[2]
    records = sorted((tmp_path / "a").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in records]
    assert bench.main(["--quick", "--workers", "1", "--out", str(tmp_path / "again"),
                       "--cache", str(tmp_path / "a")]) == 0
    assert [p.stat().st_mtime_ns for p in records] == stamps                # nothing recomputed
    assert (tmp_path / "again" / "predictive_regret_scores.csv").read_bytes() == out[1][0]
    scores = pd.read_csv(tmp_path / "again" / "predictive_regret_scores.csv")
    assert set(scores["recommender"]) >= {"online", "previous", "pilot", "a_posteriori", "fedavg", "half"}
    assert set(scores["set"]) == {"evaluation", "evaluation_minibatch"}
    assert (tmp_path / "again" / "predictive_regret.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a record of another format is recomputed, and the rules replayed on it with it (not the stale ones)
    import json
    first = next(p for p in records if not p.name.endswith(".rules.json")
                 and not json.loads(p.read_text())["fedavg_diverged"])
    rules = first.with_name(first.name.replace(".json", ".rules.json"))
    old = json.loads(first.read_text())
    first.write_text(json.dumps({**old, "format": bench.RECORD_FORMAT - 1}))
    stale = {**json.loads(rules.read_text()), bench.RECORD_DIGEST: "stale"}
    stale = {k: ({**v, "risk": -1.0} if isinstance(v, dict) else v) for k, v in stale.items()}
    rules.write_text(json.dumps(stale))
    assert bench.main(["--quick", "--no-figure", "--workers", "1", "--out", str(tmp_path / "again"),
                       "--cache", str(tmp_path / "a")]) == 0
    assert json.loads(first.read_text()) == old
    assert json.loads(rules.read_text())[bench.RECORD_DIGEST] == bench._digest(first)
    assert (tmp_path / "again" / "predictive_regret_scores.csv").read_bytes() == out[1][0]


def test_regret_benchmark_refuses_an_unusable_backend_before_any_work(tmp_path, capsys):
    """``--backend cupy`` without CuPy or a GPU: exit 2 naming the backend, nothing written; the
    instances on another backend have other keys (their records are kept apart)."""
    import importlib.util

    bench, _ = _benchmark()
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: tests/test_gpu.py covers the GPU")
    assert bench.main(["--quick", "--backend", "cupy", "--out", str(tmp_path / "out"),
                       "--cache", str(tmp_path / "cache")]) == 2
    assert "cupy" in capsys.readouterr().err.lower()
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
    numpy, cupy = bench.instances(True), bench.instances(True, "cupy")
    assert len(numpy) == len(cupy) and not set(numpy["key"]) & set(cupy["key"])
    assert {c["model"]["backend"] for c in cupy["config"]} == {"cupy"}


def test_adaptive_run_uses_the_configured_engine(small):
    """``model.engine`` reaches every round of the adaptive run (as in ``simulate``), and the fused
    engine gives the same run as the Array-API one (docs/theory.md §8; linattn_theory.core.fused)."""
    pytest.importorskip("numba")
    config, clients = small
    config = config.with_updates({"federated.rounds": 12, "federated.strategy": "fedfrozen_adaptive",
                                  "federated.adaptive_window": 2, "federated.adaptive_horizon": 1})
    runs = {engine: simulate(config.with_updates({"model.engine": engine}), clients)
            for engine in ("fused", "array_api")}
    assert {e: r.metadata["engine"] for e, r in runs.items()} == {"fused": "fused", "array_api": "array_api"}
    assert runs["fused"].metadata["stop_round"] == runs["array_api"].metadata["stop_round"]
    np.testing.assert_allclose(runs["fused"].table["loss_regularized"], runs["array_api"].table["loss_regularized"],
                               rtol=1e-12)


def test_docs_state_the_declared_benchmark_grid():
    """docs/theory.md §8 describes the sets, seeds, candidates and criterion; they must be the ones the
    benchmark declares."""
    bench, root = _benchmark()
    docs = " ".join((root / "docs" / "theory.md").read_text().split())
    for name, (variant, role, seeds) in bench.SETS.items():
        assert list(seeds) == list(range(seeds[0], seeds[-1] + 1))
        assert f"`{name}` ({variant}, seeds {seeds[0]}–{seeds[-1]})" in docs, name
    symbols = {"task.zeta_value": r"\zeta_V", "task.zeta_task": r"\zeta_{\text{task}}"}
    for spec in bench.FAMILIES.values():
        key, levels = spec["heterogeneity"]
        for symbol, values in ((symbols[key], levels), ("E", spec["local_steps"]), (r"\eta", spec["learning_rate"])):
            listed = ", ".join(f"{v:g}" for v in values)
            assert f"{symbol} \\in \\{{{listed}\\}}" in docs, (symbol, listed)
        assert f"$T = {spec['federated']['rounds']}$" in docs
        task = spec["task"]
        assert f"$m = {task['num_clients']}$ clients of {task['samples_per_client']}" in docs
    for name, values in bench.CANDIDATES.items():
        assert f"{name} ∈ {{{', '.join('none' if v is None else f'{v:g}' for v in values)}}}" in docs, name
    assert f"{100 * bench.DESIGN_HARM_LIMIT:g} %" in docs and f"{100 * bench.HARM_MARGIN:g} points" in docs
