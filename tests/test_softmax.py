"""Softmax attention (docs/theory.md §9): the layer, its closed-form gradients, the engine, the exact frozen stage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from linattn_theory import (Params, config_from_dict, decompose_excess_risk, kernel, loss_and_grad,
                            predict, simulate, stack_clients)
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import config_hash
from linattn_theory.sim.engine import clients_from_config, initial_params, prepare_run, run_schedule
from linattn_theory.core.model import loss_and_grad_from_contexts, softmax_weights
from linattn_theory.core.moments import value_moments
from linattn_theory.data.tasks import planted_kernel_clients
from linattn_theory.theory.profile import centralized_optimum, profile_objective
from linattn_theory.theory.frozen_stage import contraction_rate, fedavg_fixed_point, value_drift_floor
from linattn_theory.sim.warmup_grid import warmup_sweep
from tests._finite_differences import assert_gradients_match


def random_problem(seed, H, d, r, p, n, B, scale=1.0):
    rng = np.random.default_rng(seed)
    params = Params.init(d, r, p, heads=H, scale=scale, seed=seed)
    return params, rng.normal(size=(B, n, d)), rng.normal(size=(B, d)), rng.normal(size=(B, p))


def direct_softmax_prediction(params, X, q, tau):
    """ŷ = Σ_h (W_V^h)^T Σ_i a_{h,i} x_i, a_h = softmax_i(q^T K_h x_i / τ), written out with einsum."""
    scores = np.einsum("bc,hce,bie->bhi", q, kernel(params), X) / tau
    weights = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    return np.einsum("bhi,bie,hep->bp", weights, X, params.WV)


# --------------------------------------------------------------------------------------
# the layer and its gradients
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.3, 1.0, 4.0])
def test_softmax_prediction_matches_direct_sum(tau):
    params, X, q, y = random_problem(0, H=3, d=4, r=2, p=3, n=5, B=6)
    np.testing.assert_allclose(predict(params, X, q, "softmax", tau),
                               direct_softmax_prediction(params, X, q, tau), rtol=1e-12, atol=1e-13)
    loss, _ = loss_and_grad(params, X, q, y, attention="softmax", temperature=tau)
    expected = np.mean(0.5 * np.sum((direct_softmax_prediction(params, X, q, tau) - y) ** 2, axis=1))
    assert loss == pytest.approx(expected, rel=1e-13)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), H=st.integers(2, 3), d=st.integers(2, 4),
       r=st.integers(1, 4), p=st.integers(2, 3), n=st.integers(2, 5), B=st.integers(1, 3),
       tau=st.sampled_from([0.25, 1.0, 3.0]))
@example(seed=39916799, H=2, d=4, r=4, p=2, n=2, B=2, tau=0.25)   # gradients ~1e-4 beside a loss ~10
def test_softmax_gradients_equal_central_finite_differences(seed, H, d, r, p, n, B, tau):
    """The closed-form gradients equal fourth-order central differences within their error bound
    (tests/_finite_differences.py)."""
    if r == d:
        r = d + 1                                   # r ≠ d: the head width is not the token dimension
    params, X, q, y = random_problem(seed, H, d, r, p, n, B)
    loss, grads = loss_and_grad(params, X, q, y, attention="softmax", temperature=tau)
    assert_gradients_match(lambda P: loss_and_grad(P, X, q, y, "softmax", tau)[0], params, grads, loss)


def test_weighted_batched_gradients_equal_per_sample_sums():
    """Client axis and sample weights: Σ_i w_i ∇ℓ_i, with the blocks asked for only."""
    params, X, q, y = random_problem(3, H=2, d=3, r=2, p=2, n=4, B=5)
    w = np.array([0.1, 0.4, 0.0, 0.3, 0.2])
    loss, grads = loss_and_grad_from_contexts(params, X, q, y, w, attention="softmax", temperature=0.7)
    expected = [loss_and_grad(params, X[i:i + 1], q[i:i + 1], y[i:i + 1], "softmax", 0.7) for i in range(5)]
    assert loss == pytest.approx(sum(wi * e[0] for wi, e in zip(w, expected)), rel=1e-13)
    for b in ("WQ", "WK", "WV"):
        np.testing.assert_allclose(getattr(grads, b), sum(wi * getattr(e[1], b) for wi, e in zip(w, expected)),
                                   rtol=1e-12, atol=1e-14)
    _, only_value = loss_and_grad_from_contexts(params, X, q, y, w, blocks=("WV",), attention="softmax")
    assert only_value.WQ is None and only_value.WK is None


def test_large_scores_are_stable_and_reach_the_hard_maximum():
    """Max-subtracted: scores of order 10^5 overflow exp() but not the layer; a → one-hot at argmax."""
    params, X, q, _ = random_problem(4, H=2, d=3, r=3, p=2, n=6, B=4)
    tau = 1e-5
    with np.errstate(over="raise", invalid="raise"):
        out = predict(params, X, q, "softmax", tau)
    scores = np.einsum("bc,hce,bie->bhi", q, kernel(params), X)
    chosen = X[np.arange(4)[:, None], np.argmax(scores, axis=-1)]               # (B, H, d)
    np.testing.assert_allclose(out, np.einsum("bhe,hep->bp", chosen, params.WV), rtol=1e-10)


def test_small_logit_limit_is_an_epsilon_squared_law():
    """softmax(εs) = 1/n + (ε/n)(s − s̄) + O(ε²) (docs/theory.md §9): the layer with kernels εK equals
    uniform averaging plus ε times linear attention on centred contexts, up to a residual ∝ ε²."""
    params, X, q, _ = random_problem(5, H=2, d=4, r=3, p=2, n=6, B=5)
    tau = 0.8
    uniform = np.einsum("be,hep->bp", X.mean(axis=1), params.WV)
    centred = X - X.mean(axis=1, keepdims=True)
    # (1/n) Σ_i (s_i − s̄) W_V^T x_i = W_V^T Cov(X) K^T q: linear attention on the centred context
    linear_centred = predict(params, centred, q) / tau
    eps = np.logspace(-5, -2, 7)                                            # three decades
    residual = [np.abs(predict(params.replace(WQ=e * params.WQ), X, q, "softmax", tau)
                       - uniform - e * linear_centred).max() for e in eps]
    slope = np.polyfit(np.log(eps), np.log(residual), 1)[0]
    assert abs(slope - 2.0) <= 0.05, slope
    # and the first-order term is right: without it the residual would be ∝ ε
    first_order = [np.abs(predict(params.replace(WQ=e * params.WQ), X, q, "softmax", tau) - uniform).max()
                   for e in eps]
    assert abs(np.polyfit(np.log(eps), np.log(first_order), 1)[0] - 1.0) <= 0.05


def test_public_api_validates_attention():
    params, X, q, y = random_problem(6, H=1, d=3, r=2, p=2, n=4, B=2)
    with pytest.raises(ValueError, match="attention = 'sparse'"):
        predict(params, X, q, attention="sparse")
    with pytest.raises(ValueError, match="temperature = 0"):
        loss_and_grad(params, X, q, y, attention="softmax", temperature=0)
    np.testing.assert_array_equal(predict(params, X, q, "linear"), predict(params, X, q))


# --------------------------------------------------------------------------------------
# configuration and engine
# --------------------------------------------------------------------------------------
def test_config_keys_are_validated_and_linear_hashes_unchanged():
    linear = config_from_dict({})
    assert "attention" not in linear.to_dict()["model"]        # linear configs keep their hash
    assert config_hash(linear) == config_hash(config_from_dict({"model": {"attention": "linear"}}))
    soft = config_from_dict({"model": {"attention": "softmax", "temperature": 0.5}})
    assert soft.to_dict()["model"]["temperature"] == 0.5 and config_hash(soft) != config_hash(linear)
    assert config_from_dict(soft.to_dict()) == soft
    with pytest.raises(ConfigError, match="model.attention = 'soft'"):
        config_from_dict({"model": {"attention": "soft"}})
    with pytest.raises(ConfigError, match="model.temperature = -1"):
        config_from_dict({"model": {"attention": "softmax", "temperature": -1}})


def _config(attention="softmax", **federated):
    fed = {"rounds": 6, "warmup_rounds": 3, "local_steps": 2, "learning_rate": 0.1, "ridge": 0.05}
    fed.update(federated)
    return config_from_dict({"seed": 3, "task": {"num_clients": 4, "samples_per_client": 20, "tokens": 5,
                                                  "dim": 4, "outputs": 2, "dirichlet_alpha": 2.0,
                                                  "zeta_value": 1.0},
                             "model": {"heads": 2, "rank": 3, "attention": attention, "temperature": 0.7},
                             "federated": fed})


def test_softmax_round_equals_gradient_steps_from_the_public_api():
    """One FedAvg round (E = 2, η_s = 0.6): each client's two steps and the server average, by hand."""
    config = _config(rounds=1, warmup_rounds=1, server_learning_rate=0.6)
    clients = clients_from_config(config)
    result = simulate(config, clients)
    data = stack_clients(clients)
    theta = initial_params(config, 4, 2)
    eta, lam = 0.1, 0.05
    locals_ = []
    for X, q, y in clients:
        P = theta
        for _ in range(2):
            _, g = loss_and_grad(P, X, q, y, "softmax", 0.7)
            P = Params(P.WQ - eta * g.WQ, P.WK - eta * g.WK, P.WV - eta * (g.WV + lam * P.WV))
        locals_.append(P)
    p = np.asarray(data.weights)
    for b in ("WQ", "WK", "WV"):
        avg = sum(pc * getattr(P, b) for pc, P in zip(p, locals_))
        expected = getattr(theta, b) + 0.6 * (avg - getattr(theta, b))
        np.testing.assert_allclose(getattr(result.params, b), expected, rtol=1e-12, atol=1e-15)
    losses = [loss_and_grad(result.params, X, q, y, "softmax", 0.7)[0] for X, q, y in clients]
    assert result.table["loss"].iloc[-1] == pytest.approx(float(np.dot(p, losses)), rel=1e-12)


def test_softmax_stacks_contexts_only_when_needed():
    clients = planted_kernel_clients(num_clients=2, samples_per_client=6, tokens=3, dim=2, seed=0)
    assert stack_clients(clients).X is None
    soft = stack_clients(clients, attention="softmax", temperature=2.0)
    assert soft.X.shape == (2, 6, 3, 2) and soft.inputs is soft.X and soft.temperature == 2.0


def test_minibatch_partial_softmax_runs_match_strict_namespace():
    xs = pytest.importorskip("array_api_strict")
    config = _config(batch_size=5, participation=0.5)
    clients = clients_from_config(config)
    theta = initial_params(config, 4, 2)
    fed = config.federated
    plain = run_schedule(theta, stack_clients(clients, attention="softmax", temperature=0.7), fed, 3, seed=3)
    strict = run_schedule(theta.map(xs.asarray), stack_clients(clients, xp=xs, attention="softmax",
                                                               temperature=0.7), fed, 3, seed=3)
    assert not plain.diverged and strict.table.equals(plain.table)
    for b in ("WQ", "WK", "WV"):
        np.testing.assert_array_equal(getattr(strict.params, b), getattr(plain.params, b))


# --------------------------------------------------------------------------------------
# the frozen stage is exact (docs/theory.md §5, §9)
# --------------------------------------------------------------------------------------
def test_softmax_value_moments_use_softmax_features():
    config = _config()
    clients = clients_from_config(config)
    data = stack_clients(clients, attention="softmax", temperature=0.7)
    K = kernel(Params.init(4, 3, 2, heads=2, seed=1))
    moments = value_moments(K, data)
    for c, (X, q, y) in enumerate(clients):
        a = softmax_weights(K, X, q, 0.7)                                    # (N, H, n)
        phi = np.einsum("bhi,bie->bhe", a, X).reshape(len(X), -1)
        np.testing.assert_allclose(moments.A[c], phi.T @ phi / len(X), rtol=1e-12)
        np.testing.assert_allclose(moments.B[c], phi.T @ y / len(X), rtol=1e-12)


def test_softmax_frozen_stage_lands_on_the_fixed_point_at_the_predicted_rate():
    T0 = 3
    config = _config(rounds=T0 + 160, warmup_rounds=T0, learning_rate=0.3, local_steps=3, ridge=0.3)
    clients = clients_from_config(config)
    data = stack_clients(clients, attention="softmax", temperature=0.7)
    distances = []

    def record(state):
        if state.round >= T0:
            distances.append(state.params.WV.reshape(-1, 2).copy())

    sdata, theta = prepare_run(config, clients)
    result = run_schedule(theta, sdata, config.federated, T0, config.seed, on_round=record)
    assert not result.diverged
    K = kernel(result.warmup_params)
    np.testing.assert_array_equal(result.params.WQ, result.warmup_params.WQ)    # frozen bit for bit
    V_FA = fedavg_fixed_point(K, data, 0.3, 3, 0.3)
    rho = contraction_rate(K, data, 0.3, 3, 0.3)
    assert rho < 0.85          # ρ^160 < 1e-11: the stage has converged to rounding
    V_T = result.params.WV.reshape(-1, 2)
    assert np.abs(V_T - V_FA).max() <= 1e-10 * np.abs(V_FA).max()
    gaps = np.array([np.linalg.norm(V - V_FA) for V in distances[:40]])
    rates = gaps[1:] / gaps[:-1]
    assert np.all(rates <= rho + 1e-9)                 # M symmetric: ‖M^t e‖ ≤ ρ^t ‖e‖
    assert rates[-1] == pytest.approx(rho, rel=1e-3)   # and the slowest mode dominates
    # the linear fixed point of the same kernel is a different point: the features matter
    assert np.abs(fedavg_fixed_point(K, stack_clients(clients), 0.3, 3, 0.3) - V_FA).max() > 1e-3


def test_softmax_decomposition_identity_and_drift_floor():
    config = _config(rounds=12, warmup_rounds=4)
    run = simulate(config)
    data = stack_clients(clients_from_config(config), attention="softmax", temperature=0.7)
    K = kernel(run.warmup_params)
    optimum = centralized_optimum(data, 0.05, rank=3, heads=2, restarts=1, initial_kernels=[K],
                                  max_iterations=60)
    parts = decompose_excess_risk(run, optimum=optimum)   # clients and attention from the recorded config
    assert abs(parts["identity_residual"]) <= 1e-10 * max(1.0, abs(parts["excess_risk"]))
    assert parts["bias"] >= -1e-12 and parts["drift_floor"] >= 0
    assert parts["profile_objective"] == pytest.approx(profile_objective(K, data, 0.05)[0], rel=1e-12)
    assert parts["drift_floor"] == pytest.approx(value_drift_floor(K, data, 0.1, 2, 0.05), rel=1e-10)
    linear = stack_clients(clients_from_config(config))
    assert abs(profile_objective(K, linear, 0.05)[0] - parts["profile_objective"]) > 1e-4


@pytest.mark.parametrize("federated", [{}, {"batch_size": 6}], ids=["moments", "explicit"])
def test_warmup_sweep_shares_softmax_warmups(federated):
    config = _config(rounds=5, warmup_rounds=0, **federated)
    sweep = warmup_sweep(config, warmups=[0, 2, 5])
    rtol = 1e-10 if not federated else 0.0
    for T0, result in sweep.items():
        explicit = simulate(config.with_updates({"federated.strategy": "fedfrozen",
                                                 "federated.warmup_rounds": T0}))
        numeric = [c for c in explicit.table.columns if c not in ("stage", "strategy")]
        np.testing.assert_allclose(result.table[numeric].to_numpy(float),
                                   explicit.table[numeric].to_numpy(float), rtol=rtol, atol=1e-15)
        for b in ("WQ", "WK", "WV"):
            np.testing.assert_allclose(getattr(result.params, b), getattr(explicit.params, b),
                                       rtol=rtol, atol=1e-15)
        assert result.metadata["config"]["model"]["attention"] == "softmax"


# --------------------------------------------------------------------------------------
# static softmax heads: pattern variance, divergence, loss change (docs/theory.md §9, §7)
# --------------------------------------------------------------------------------------
def test_head_pattern_statistics():
    from linattn_theory.theory.static_heads import head_pattern_statistics

    clients = planted_kernel_clients(num_clients=3, samples_per_client=25, tokens=5, dim=4, heads=2,
                                     positional_strength=1.0, dirichlet_alpha=1.0, seed=7)
    params = Params.init(4, 2, 2, heads=3, scale=1.5, seed=2)
    params = params.replace(WQ=params.WQ * np.array([1.0, 0.0, 1.0])[:, None, None])   # head 1: K = 0
    tau = 0.6
    table = head_pattern_statistics(params, clients, tau)
    assert len(table) == 3 * (3 + 1)
    uniform = table[table["head"] == 1]        # a zero kernel attends uniformly: nothing to gain or lose
    assert np.abs(uniform[["pattern_variance", "mean_kl", "loss_change"]].to_numpy()).max() <= 1e-12
    moving = table[table["head"] != 1]
    assert (moving["pattern_variance"] > 1e-3).all() and (moving["mean_kl"] > 1e-3).all()

    p = np.asarray(clients.weights)
    K = kernel(params)
    means = [softmax_weights(K, X, q, tau).mean(axis=0) for X, q, _ in clients]    # (H, n) per client
    overall = sum(pc * a for pc, a in zip(p, means))
    for h in (0, 2):
        per_client = table[(table["head"] == h) & (table["client"] >= 0)].sort_values("client")
        across = table[(table["head"] == h) & (table["client"] == -1)].iloc[0]
        # law of total variance: E‖a − ā‖² = Σ_c p_c (E_c‖a − ā_c‖² + ‖ā_c − ā‖²)
        between = np.array([np.sum((a[h] - overall[h]) ** 2) for a in means])
        assert across["pattern_variance"] == pytest.approx(
            np.dot(p, per_client["pattern_variance"] + between), rel=1e-12)
        # compensation identity: E KL(a ‖ ā) = Σ_c p_c (E_c KL(a ‖ ā_c) + KL(ā_c ‖ ā))
        kl_between = np.array([np.sum(a[h] * np.log(a[h] / overall[h])) for a in means])
        assert across["mean_kl"] == pytest.approx(np.dot(p, per_client["mean_kl"] + kl_between), rel=1e-10)
        # loss change, recomputed: head h's weights replaced by the overall mean pattern
        change = 0.0
        for pc, (X, q, y) in zip(p, clients):
            a = softmax_weights(K, X, q, tau)
            a[:, h] = overall[h]
            replaced = np.einsum("bhi,bie,hep->bp", a, X, params.WV)
            base = predict(params, X, q, "softmax", tau)
            change += pc * np.mean(0.5 * np.sum((replaced - y) ** 2, 1) - 0.5 * np.sum((base - y) ** 2, 1))
        assert across["loss_change"] == pytest.approx(change, rel=1e-10)
    base = sum(pc * loss_and_grad(params, X, q, y, "softmax", tau)[0] for pc, (X, q, y) in zip(p, clients))
    assert table[table["client"] == -1]["loss"].to_numpy() == pytest.approx([base] * 3, rel=1e-12)


def test_every_strategy_trains_softmax_attention():
    """The strategies act on blocks, not on the attention: each runs, learns and freezes what it should."""
    from linattn_theory.sim.strategies import STRATEGIES

    for name in STRATEGIES:
        extra = {"fedadam": {"server_learning_rate": 0.01}, "fedavgm": {"server_momentum": 0.5}}.get(name, {})
        config = _config(strategy=name, rounds=6, warmup_rounds=3, batch_size=8, participation=0.75, **extra)
        run = simulate(config)
        assert not run.diverged, name
        assert run.table["loss"].iloc[-1] < run.table["loss"].iloc[0], name
        frozen = {"fedfrozen": "WQ", "fedfrozen_fedprox": "WQ", "fedfrozen_scaffold": "WQ",
                  "random_kernel": "WQ", "value_frozen": "WV", "value_solve": "WQ",
                  "value_solve_final": "WQ"}.get(name)
        if frozen:
            np.testing.assert_array_equal(getattr(run.params, frozen), getattr(run.warmup_params, frozen))


def test_static_heads_figure_numbers_match_committed_data():
    """figures/README.md quotes the per-level rank correlations of figures/softmax_static_heads.csv
    (recomputed here with scipy), each inside its bootstrap interval."""
    from pathlib import Path

    import pandas as pd
    from scipy.stats import spearmanr

    root = Path(__file__).resolve().parents[1]
    table = pd.read_csv(root / "figures" / "softmax_static_heads.csv")
    summary = pd.read_csv(root / "figures" / "softmax_static_heads_summary.csv")
    across = table[table["client"] == -1]
    np.testing.assert_allclose(across["relative_loss_change"], across["loss_change"] / across["loss"],
                               rtol=1e-8)
    readme = (root / "figures" / "README.md").read_text()
    for (level, criterion), sub in across.melt(id_vars=["zeta_value", "relative_loss_change", "run_id"],
                                               value_vars=["mean_kl", "pattern_variance"],
                                               var_name="criterion").groupby(["zeta_value", "criterion"]):
        rho = spearmanr(sub["value"], sub["relative_loss_change"]).statistic
        name = {"mean_kl": "mean KL", "pattern_variance": "pattern variance"}[criterion]
        row = summary[(summary["zeta_value"] == level) & (summary["criterion"] == criterion)].iloc[0]
        assert row["spearman"] == pytest.approx(rho, abs=1e-9)           # the CSV keeps 10 digits
        assert row["spearman_low"] <= rho <= row["spearman_high"] and row["instances"] == sub["run_id"].nunique()
        assert f"{name} {rho:+.2f} (95 % interval" in readme


def test_sweep_analysis_reads_softmax_runs_with_softmax_features(tmp_path):
    from linattn_theory.report.results import load_results
    from linattn_theory.sim.sweep import load_sweep, run_sweep
    from linattn_theory.report.sweep_analysis import frozen_stage_table

    (tmp_path / "s.toml").write_text(
        'seed = 1\n[task]\nnum_clients = 3\nsamples_per_client = 12\ntokens = 4\ndim = 3\n'
        '[model]\nheads = 2\nrank = 2\ntemperature = 0.5\n'
        '[federated]\nrounds = 4\nwarmup_rounds = 2\nlearning_rate = 0.05\n'
        '[grid]\n"model.attention" = ["linear", "softmax"]\n')
    folder = tmp_path / "out"
    run_sweep(load_sweep(tmp_path / "s.toml"), folder, executor="serial")
    table = frozen_stage_table(folder, load_results(folder))
    assert len(table) == 2
    from linattn_theory.report.results import load_run
    for _, row in table.iterrows():
        run = load_run(folder, row["run_id"])
        config = config_from_dict(run.metadata["config"])
        data = stack_clients(clients_from_config(config), attention=config.model.attention,
                             temperature=config.model.temperature)
        assert row["profile"] == pytest.approx(profile_objective(kernel(run.warmup_params), data)[0], rel=1e-12)


def test_static_head_comparison_refuses_softmax_configs():
    from linattn_theory.theory.static_heads import compare_static_heads
    with pytest.raises(ValueError, match="head_pattern_statistics"):
        compare_static_heads(_config())


def test_tradeoff_attention_numbers_match_committed_data():
    """figures/README.md's statements about tradeoff_attention.png, recomputed from its CSV: the paired
    ratio R(T0)/R(T) is 1 at T0 = T; at ζ_V = 3 its median dips below 1 inside the grid for both
    attentions (the trade-off carries over) and the marked best warm-ups are interior; at ζ_V = 1 the
    median gain is 0."""
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).resolve().parents[1]
    table = pd.read_csv(root / "figures" / "tradeoff_attention.csv")
    readme = (root / "figures" / "README.md").read_text()
    assert (table["count"] == table["instances"]).all() and (table["instances"] >= 4).all()
    at_T = table[table["T0"] == table["T0"].max()]
    np.testing.assert_allclose(at_T[["median", "q25", "q75"]].to_numpy(), 1.0, rtol=1e-12)
    marked = table.groupby(["attention", "zeta_value"]).first()
    for attention in ("linear", "softmax"):
        curve = table[(table["attention"] == attention) & (table["zeta_value"] == 3.0)].set_index("T0")["median"]
        assert curve.min() < 1 and 0 < curve.idxmin() < 40
        row = marked.loc[(attention, 3.0)]
        assert 0 < row["best_T0"] < 40
        assert f"{attention}: best `T0` {row['best_T0']:g} ({row['best_T0_q25']:g} to {row['best_T0_q75']:g})" in readme
        assert marked.loc[(attention, 1.0), "gain_median"] == 0.0