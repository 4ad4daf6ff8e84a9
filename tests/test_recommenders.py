"""Recommenders with named information sets (docs/theory.md §8) and their regret score."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd
import pytest

from linattn_theory.cli.recommend_command import recommend_main
from linattn_theory.sim.config import config_from_dict
from linattn_theory.sim.engine import clients_from_config, prepare_run, run_schedule, simulate
from linattn_theory.recommenders.recommendation import MODES, recommend
from linattn_theory.recommenders.online import OnlineRule, freeze_forecast, online_decision, run_online
from linattn_theory.recommenders.scoring import best_warmup, is_u_shaped, regret

SMALL = {"seed": 3,
         "task": {"family": "planted_kernel", "num_clients": 3, "samples_per_client": 20, "tokens": 5,
                  "dim": 3, "rank": 2, "outputs": 2, "zeta_value": 2.0, "zeta_covariate": 0.5},
         "model": {"rank": 2},
         "federated": {"strategy": "fedfrozen", "rounds": 8, "warmup_rounds": 2, "local_steps": 4,
                       "learning_rate": 0.01, "ridge": 0.01}}


@pytest.fixture(scope="module")
def small():
    config = config_from_dict(SMALL)
    return config, clients_from_config(config)


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


def test_adaptive_run_realises_its_forecast_and_equals_fedfrozen(small):
    """The adaptive strategy's final loss is the rule's forecast; without roll-back it is the
    FedFrozen run of the same T0 bit for bit; ``simulate`` dispatches to it."""
    config, clients = small
    config = config.with_updates({"federated.rounds": 24, "federated.strategy": "fedfrozen_adaptive",
                                  "federated.adaptive_window": 2, "federated.adaptive_horizon": 1})
    online = run_online(config, clients)
    final = float(online.result.table["loss_regularized"].iloc[-1])
    assert final == pytest.approx(online.predicted_objective, rel=1e-10)
    assert len(online.result.table) == 25 and online.result.metadata["stop_round"] == online.stop_round
    assert online.decisions["stop"].tolist() == [False] * online.stop_round + [True]
    again = simulate(config, clients)
    assert again.table["loss_regularized"].iloc[-1] == final
    if online.kernel_round == online.stop_round:
        fixed = simulate(config.with_updates({"federated.strategy": "fedfrozen",
                                              "federated.warmup_rounds": online.kernel_round}), clients)
        assert fixed.table["loss_regularized"].iloc[-1] == final


def test_run_online_decides_from_the_past_only(small):
    """Each recorded decision is what the rule says on the forecasts of rounds ≤ t of the path."""
    config, clients = small
    config = config.with_updates({"federated.rounds": 24})
    rule = OnlineRule(window=2, horizon=1)
    online = run_online(config, clients, rule)
    data, theta = prepare_run(config, clients)
    states = []
    fed = config.federated
    run_schedule(theta, data, dataclasses.replace(fed, strategy="fedfrozen", warmup_rounds=24), 24,
                 config.seed, on_round=states.append)
    forecasts = [freeze_forecast(st.params, data, fed, st.round) for st in states]
    for t, row in online.decisions.iterrows():
        decision = online_decision(forecasts[:t + 1], 24, 2, 1)
        assert (decision.stop, decision.kernel_round) == (row["stop"], row["kernel_round"])


# ----------------------------------------------------------------- the rule on designed histories
class _Fake:
    """A forecast whose final objective is ``level + penalty(k)`` (a stand-in for FreezeForecast)."""

    def __init__(self, round_, level, slope=0.0):
        self.round, self.level, self.slope = round_, level, slope

    def final_objective(self, k):
        return self.level + self.slope / (1.0 + np.asarray(k, dtype=float))


def _decide(levels, T, **kw):
    return online_decision([_Fake(t, v, 0.01) for t, v in enumerate(levels)], T, **kw)


def test_rule_waits_out_the_saddle_plateau():
    """R_freeze flat then rising (the saddle, §8): a rule without the escape guard would stop."""
    plateau = [1.0, 1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06]
    decision = _decide(plateau, 40, window=3, horizon=2)
    assert not decision.stop and "saddle" in decision.reason


def test_rule_continues_in_descent_and_stops_when_it_turns():
    descent = [1.0 - 0.05 * t for t in range(12)]
    assert not _decide(descent, 40, window=3, horizon=2).stop
    turned = descent + [descent[-1] + 0.02 * i for i in range(1, 5)]
    decision = _decide(turned, 40, window=3, horizon=2)
    assert decision.stop and decision.kernel_round == 11          # rolled back to the best kernel


def test_rule_at_the_budget_is_fedavg_and_rejects_bad_settings():
    decision = _decide([1.0, 0.9, 0.8], 2)
    assert decision.stop and decision.kernel_round == 2
    with pytest.raises(ValueError, match="window"):
        OnlineRule(window=0)
    with pytest.raises(ValueError, match="forecasts"):
        _decide([1.0] * 5, 3)


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
    assert is_u_shaped([2.0, 1.0, 2.0]) and not is_u_shaped([2.0, 1.5, 1.0])
    assert not is_u_shaped([1.04, 1.0, 1.2])        # an end within 5 % of the best is not a clear U


def test_quoted_regret_table_is_the_committed_one():
    """docs/theory.md §8 quotes the evaluation table; it must be the one the committed scores give."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("predictive_regret", root / "benchmarks" / "predictive_regret.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    scores = pd.read_csv(root / "figures" / "predictive_regret_scores.csv")
    design = pd.read_csv(root / "figures" / "predictive_regret_design.csv")
    table = bench.report(scores, design)
    assert (root / "figures" / "predictive_regret.md").read_text() == table
    docs = (root / "docs" / "theory.md").read_text()
    assert table.strip() in docs
    # the declared sets: ≥ 60 evaluation instances, disjoint from the design seeds
    evaluation = scores[scores["set"] == "evaluation"].drop_duplicates(["setting", "seed"])
    assert len(evaluation) >= 60
    assert not set(evaluation["seed"]) & set(scores.loc[scores["set"] == "design", "seed"])


def test_quoted_worst_case_is_the_committed_one():
    """docs/theory.md §8 names the online rule's worst evaluation instance; the scores must agree."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scores = pd.read_csv(root / "figures" / "predictive_regret_scores.csv")
    online = scores[(scores["set"] == "evaluation") & (scores["recommender"] == "online")]
    worst = online.loc[online["regret"].idxmax()]
    assert worst["family"] == "in_context_regression" and worst["local_steps"] == 20
    assert worst["learning_rate"] == 0.01 and int(worst["stop_round"]) == 13
    assert worst["heterogeneity"] == online["heterogeneity"][online["family"] == worst["family"]].max()
    assert 0.25 < worst["regret"] and float(np.median(online["regret"])) < 0.0005   # "0.0 %"
    docs = (root / "docs" / "theory.md").read_text()
    assert "freezes at round 13" in docs and "$E = 20$, $\\eta = 0.01$" in docs


@pytest.mark.slow
def test_regret_benchmark_quick_is_resumable_and_worker_independent(tmp_path):
    """The benchmark's quick mode: cached records are reused, and 1 or 2 workers give the same bytes."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("predictive_regret", root / "benchmarks" / "predictive_regret.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = {}
    for workers, cache in ((1, "a"), (2, "b")):
        target = tmp_path / f"out{workers}"
        assert bench.main(["--quick", "--workers", str(workers), "--out", str(target),
                           "--cache", str(tmp_path / cache)]) == 0
        out[workers] = (target / "predictive_regret_scores.csv").read_bytes()
    assert out[1] == out[2]
    records = sorted((tmp_path / "a").glob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in records]
    assert bench.main(["--quick", "--workers", "1", "--out", str(tmp_path / "again"),
                       "--cache", str(tmp_path / "a")]) == 0
    assert [p.stat().st_mtime_ns for p in records] == stamps                # nothing recomputed
    assert (tmp_path / "again" / "predictive_regret_scores.csv").read_bytes() == out[1]
    scores = pd.read_csv(tmp_path / "again" / "predictive_regret_scores.csv")
    assert set(scores["recommender"]) >= {"online", "pilot", "a_posteriori", "fedavg", "half"}
    assert (tmp_path / "again" / "predictive_regret.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quoted_softmax_transfer_claims_hold_on_the_committed_scores():
    """docs/theory.md §8: on softmax attention the online rule beats FedAvg on every U-shaped
    instance, keeps most instances within 5 %, and its single worst case is in-context, E = 20."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scores = pd.read_csv(root / "figures" / "predictive_regret_scores.csv")
    soft = scores[scores["set"] == "evaluation_softmax"]
    paired = soft.pivot_table(index=["setting", "seed"], columns="recommender", values="regret")
    shaped = soft.drop_duplicates(["setting", "seed"]).set_index(["setting", "seed"])["u_shaped"]
    u = paired[shaped.loc[paired.index].to_numpy()]
    assert len(u) > 0 and (u["online"] < u["fedavg"]).all()
    online = soft[soft["recommender"] == "online"]
    assert (online["regret"] <= 0.05).mean() > 0.5
    worst = online.loc[online["regret"].idxmax()]
    assert worst["family"] == "in_context_regression" and worst["local_steps"] == 20
    assert worst["T0"] < worst["best_T0"] == 40
    linear = scores[(scores["set"] == "evaluation") & (scores["recommender"] == "online")]
    assert worst["regret"] > linear["regret"].max()


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
    """docs/theory.md §8 describes the design/evaluation grid; it must be the one the benchmark declares."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("predictive_regret", root / "benchmarks" / "predictive_regret.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    docs = (root / "docs" / "theory.md").read_text()
    seeds = lambda s: f"{s[0]}–{s[-1]}"  # noqa: E731
    for declared in (bench.DESIGN_SEEDS, bench.EVALUATION_SEEDS, bench.SOFTMAX_SEEDS):
        assert list(declared) == list(range(declared[0], declared[-1] + 1))
        assert f"seeds {seeds(declared)}" in docs
    symbols = {"task.zeta_value": r"\zeta_V", "task.zeta_task": r"\zeta_{\text{task}}"}
    for spec in bench.FAMILIES.values():
        key, levels = spec["heterogeneity"]
        for symbol, values in ((symbols[key], levels), ("E", spec["local_steps"]), (r"\eta", spec["learning_rate"])):
            listed = ", ".join(f"{v:g}" for v in values)
            assert f"{symbol} \\in \\{{{listed}\\}}" in " ".join(docs.split()), (symbol, listed)
        assert f"$T = {spec['federated']['rounds']}$" in docs
        task = spec["task"]
        assert f"$m = {task['num_clients']}$ clients of {task['samples_per_client']}" in docs
