"""Static attention heads (docs/theory.md §7): patterns, the input-independent share, the hybrid
model's exact solution and its federated training, and the comparison with FedFrozen."""

from __future__ import annotations

import numpy as np
import pytest

from linattn_theory import Params, config_from_dict, kernel, planted_kernel_clients
from linattn_theory.sim.engine import simulate
from linattn_theory.core.model import flat, features, context_second_moment, predict
from linattn_theory.theory.static_heads import StaticHeads, attention_scores, compare_static_heads, decay_pattern, head_features, input_independent_share, mean_score_pattern, predict_static, select_static_heads, stack_contexts, static_patterns, static_profile_objective, uniform_pattern
from linattn_theory.core.clients import stack_clients


def small_clients(positional_strength=1.0, query="last", seed=0, **options):
    settings = dict(num_clients=3, samples_per_client=40, tokens=6, dim=4, heads=2, rank=2,
                    outputs=2, zeta_value=0.5, zeta_covariate=0.3, noise=0.1, dirichlet_alpha=1.5)
    settings.update(options)
    return planted_kernel_clients(positional_strength=positional_strength, query=query, seed=seed,
                                  **settings)


def pooled(clients):
    return tuple(np.concatenate([getattr(c, name) for c in clients]) for name in ("X", "q", "y"))


def random_params(H=2, d=4, r=2, p=2, seed=1):
    return Params.init(d, r, p, heads=H, scale=1.0, seed=seed)


# -- a uniform static head is a linear model on the context mean --------------------------------

def test_uniform_static_head_solution_is_least_squares_on_the_context_mean():
    clients = small_clients()
    params = random_params(H=1)
    static = StaticHeads((0,), static_patterns("uniform", kernel(params), *pooled(clients)[:2]))
    _, V = static_profile_objective(kernel(params), clients, ridge=0.0, static=static)
    X, _, y = pooled(clients)
    # p_c ∝ N_c with sample weights 1/N_c: the federated objective is the pooled mean
    W_lstsq, *_ = np.linalg.lstsq(X.mean(axis=1), y, rcond=None)
    assert np.linalg.norm(V - W_lstsq) / np.linalg.norm(W_lstsq) <= 1e-10


def test_trained_uniform_static_head_converges_to_least_squares():
    """FedAvg with E = 1 on the static head (full batch) is centralised GD on the context-mean model."""
    clients = small_clients()
    X, q, y = pooled(clients)
    xbar = X.mean(axis=1)
    W_lstsq, *_ = np.linalg.lstsq(xbar, y, rcond=None)
    curvature = np.linalg.eigvalsh(xbar.T @ xbar / len(y))
    eta = 1.8 / (curvature[-1] + curvature[0])
    config = config_from_dict({"seed": 0, "model": {"heads": 1, "rank": 2},
                               "task": {"num_clients": 3, "tokens": 6, "dim": 4, "outputs": 2},
                               "federated": {"strategy": "random_kernel", "rounds": 600,
                                             "local_steps": 1, "learning_rate": float(eta)}})
    X_all, q_all = stack_contexts(clients), stack_clients(clients).q
    static = StaticHeads((0,), np.tile(uniform_pattern(6), (1, 1)))

    def frozen_features(params):
        return flat(np, head_features(kernel(params), X_all, q_all, static), 2)

    result = simulate(config, clients, frozen_features=frozen_features)
    assert not result.diverged
    V = result.params.WV.reshape(4, 2)
    assert np.linalg.norm(V - W_lstsq) / np.linalg.norm(W_lstsq) <= 1e-10
    # the frozen kernel blocks were never touched
    assert np.array_equal(result.params.WQ, result.warmup_params.WQ)
    # the model the run trained predicts through the context mean
    np.testing.assert_allclose(predict_static(result.params, static, X, q), xbar @ V, rtol=1e-12, atol=1e-12)
    loss = 0.5 * np.mean(np.sum((xbar @ V - y) ** 2, axis=1))
    assert abs(result.table["loss"].iloc[-1] - loss) <= 1e-12 * loss


# -- features and patterns ------------------------------------------------------------------------

def test_head_features_without_static_heads_are_the_attention_features():
    clients = small_clients()
    X, q, _ = pooled(clients)
    K = kernel(random_params())
    phi = features(K, context_second_moment(X), q)
    assert np.array_equal(head_features(K, X, q, StaticHeads((), None)), phi)
    mixed = head_features(K, X, q, StaticHeads((1,), static_patterns("decay", K, X, q, gamma=0.3)))
    assert np.array_equal(mixed[:, 0], phi[:, 0])
    np.testing.assert_allclose(mixed[:, 1], np.einsum("i,nid->nd", decay_pattern(6, 0.3), X), rtol=1e-13)


def test_scores_are_the_attention_scores_and_predict_through_them():
    clients = small_clients()
    X, q, _ = pooled(clients)
    params = random_params()
    s = attention_scores(kernel(params), X, q)                     # (N, H, n)
    direct = np.einsum("nd,hde,nie->nhi", q, kernel(params), X)
    np.testing.assert_allclose(s, direct, rtol=1e-12, atol=1e-14)
    # ŷ = Σ_h (W_V^h)^T Σ_i (s_{h,i}/n) x_i
    y_hat = np.einsum("nhi,nid,hdp->np", s / X.shape[1], X, params.WV)
    np.testing.assert_allclose(predict(params, X, q), y_hat, rtol=1e-11, atol=1e-13)


def test_mean_score_static_head_reproduces_the_head_on_fixed_contexts():
    """If the context and query do not vary, the scores are input-independent: share 1, and the
    mean-score pattern reproduces the attention head exactly."""
    rng = np.random.default_rng(4)
    X = np.broadcast_to(rng.normal(size=(1, 6, 4)), (10, 6, 4)).copy()
    q = X[:, -1, :].copy()
    params = random_params()
    K = kernel(params)
    np.testing.assert_allclose(input_independent_share(K, X, q), 1.0, rtol=1e-12)
    static = StaticHeads((0, 1), mean_score_pattern(K, X, q))
    np.testing.assert_allclose(predict_static(params, static, X, q), predict(params, X, q), rtol=1e-12)


def test_decay_and_uniform_patterns():
    a = decay_pattern(5, 0.7)
    assert abs(a.sum() - 1) < 1e-15 and np.all(np.diff(a) > 0)
    np.testing.assert_allclose(a[:-1] / a[1:], np.exp(-0.7))
    np.testing.assert_array_equal(decay_pattern(5, 0.0), uniform_pattern(5))
    with pytest.raises(ValueError, match="gamma=-1"):
        decay_pattern(5, -1)
    with pytest.raises(ValueError, match="static pattern 'banded' is unknown"):
        static_patterns("banded", np.zeros((1, 4, 4)), np.zeros((2, 5, 4)), np.zeros((2, 4)))


# -- the input-independent share and the selection rule ------------------------------------------

def test_share_is_a_variance_fraction_invariant_to_kernel_scale():
    X, q, _ = pooled(small_clients(positional_strength=1.5))
    K = kernel(random_params(H=3))
    share = input_independent_share(K, X, q)
    assert np.all(share <= 1)          # a variance component over the total (≥ 0 holds by construction)
    np.testing.assert_allclose(input_independent_share(7.0 * K, X, q), share, rtol=1e-12)
    # law of total variance, recomputed position by position
    s = attention_scores(K, X, q)
    within = np.mean([s[:, :, i].var(axis=0) for i in range(s.shape[2])], axis=0)
    total = s.transpose(1, 0, 2).reshape(3, -1).var(axis=1)
    np.testing.assert_allclose(share, 1 - within / total, rtol=1e-10)


def test_positional_structure_makes_scores_input_independent():
    K = kernel(random_params(H=3, seed=5))
    shares = []
    for strength in (0.0, 1.0, 3.0):
        X, q, _ = pooled(small_clients(positional_strength=strength, query="fresh",
                                       samples_per_client=200))
        shares.append(input_independent_share(K, X, q))
    # exchangeable positions: only sampling noise (N = 600 samples) is input-independent
    assert np.all(shares[0] < 0.03)
    assert np.all(shares[1] > shares[0]) and np.all(shares[2] > shares[1])


def test_select_static_heads():
    shares = np.array([0.2, 0.9, 0.5, 0.05])
    assert select_static_heads(shares, count=2) == (1, 2)
    assert select_static_heads(shares, count=0) == ()
    assert select_static_heads(shares, threshold=0.4) == (1, 2)
    with pytest.raises(ValueError, match="count=5"):
        select_static_heads(shares, count=5)
    with pytest.raises(ValueError, match="exactly one"):
        select_static_heads(shares)


# -- the comparison ---------------------------------------------------------------------------------

COMPARE = {"seed": 0, "task": {"num_clients": 3, "samples_per_client": 32, "tokens": 6, "dim": 4,
                               "heads": 2, "rank": 2, "outputs": 2, "zeta_value": 0.5,
                               "zeta_covariate": 0.3, "positional_strength": 1.0, "query": "fresh"},
           "model": {"heads": 3, "rank": 2},
           "federated": {"rounds": 12, "warmup_rounds": 4, "local_steps": 3, "learning_rate": 0.01,
                         "ridge": 0.01}}


def test_compare_static_heads():
    config = config_from_dict(COMPARE)
    table = compare_static_heads(config, count=1)
    assert list(table["arm"]) == ["full", "fedfrozen", "static_uniform", "static_mean", "static_decay"]
    assert not table["diverged"].any() and np.all(np.isfinite(table["loss_regularized"]))
    shares = table.filter(like="share_head_").iloc[0].to_numpy()
    chosen = int(np.argmax(shares))
    assert set(table["static_heads"].iloc[2:]) == {str(chosen)}
    # FedFrozen's final loss is the same as that of a plain simulate call
    frozen = simulate(config.with_updates({"federated.strategy": "fedfrozen"}))
    assert table["loss"].iloc[1] == frozen.table["loss"].iloc[-1]
    # no run goes below the best loss its heads allow
    assert np.all(table["loss_regularized"] >= table["profile_loss"] - 1e-12)
    # zero static heads: the static arm is FedFrozen, bit for bit
    none = compare_static_heads(config, count=0, patterns=("uniform",))
    assert none["loss"].iloc[2] == none["loss"].iloc[1]


def test_profile_objective_is_the_loss_at_its_minimiser():
    """``Φ_λ = F_λ(V*)`` evaluated through the model, and ``V*`` is a stationary point."""
    clients = small_clients()
    params = random_params()
    lam = 0.05
    for static in (None, StaticHeads((1,), static_patterns("mean", kernel(params), *pooled(clients)[:2]))):
        phi_value, V = static_profile_objective(kernel(params), clients, lam, static)
        trained = params.replace(WV=V.reshape(params.WV.shape))
        F, gradient = 0.0, 0.0
        for (X, q, y), p in zip(clients, clients.weights):
            y_hat = predict(params.replace(WV=trained.WV), X, q) if static is None else \
                predict_static(trained, static, X, q)
            F += p * 0.5 * np.mean(np.sum((y_hat - y) ** 2, axis=1))
            phi = flat(np, head_features(kernel(params), X, q, static or StaticHeads((), None)), 2)
            gradient = gradient + p * phi.T @ (y_hat - y) / len(y)
        F += 0.5 * lam * np.sum(V * V)
        assert abs(F - phi_value) <= 1e-12 * abs(phi_value)
        assert np.max(np.abs(gradient + lam * V)) <= 1e-12


def test_head_static_loss_change_matches_least_squares_on_hand_built_features():
    """Φ_0 with one head static, recomputed by least squares on features built here from the
    definitions (ψ_h = X^T a_h with a_{h,i} = mean_N q^T K_h x_i / n; φ_g = Ŝ K_g^T q), equal
    client sizes so that the p_c-weighted objective is the pooled mean."""
    from linattn_theory.theory.static_heads import head_static_loss_change
    clients = small_clients(dirichlet_alpha=None, samples_per_client=30)
    X, q, y = pooled(clients)
    K = kernel(random_params(seed=5))
    n = X.shape[1]
    S = np.einsum("nia,nib->nab", X, X) / n
    phi = np.einsum("nab,hcb,nc->nha", S, K, q)                 # Ŝ K_h^T q, (N, H, d)
    scores = np.einsum("na,hab,nib->nhi", q, K, X)              # q^T K_h x_i
    table = head_static_loss_change(K, clients, ridge=0.0)

    def profile(features):
        F = features.reshape(len(y), -1)
        V = np.linalg.lstsq(F, y, rcond=None)[0]
        return 0.5 * np.mean(np.sum((y - F @ V) ** 2, axis=1))
    learned = profile(phi)
    for h in range(K.shape[0]):
        hybrid = phi.copy()
        hybrid[:, h] = np.einsum("nia,i->na", X, scores[:, h].mean(axis=0) / n)
        row = table.iloc[h]
        assert row["loss_change"] == pytest.approx(profile(hybrid) - learned, rel=1e-8, abs=1e-12)
        assert row["relative_loss_change"] == pytest.approx((profile(hybrid) - learned) / learned, rel=1e-8)
    np.testing.assert_allclose(table["share"], input_independent_share(K, X, q), rtol=1e-12)


def test_static_head_features_make_the_largest_share_head_static_at_the_freeze():
    """count=1: only the head with the largest ω_h at the frozen kernel gets the static feature
    X^T a_h (checked against features built from the definition); the other keeps φ = Ŝ K^T q."""
    from linattn_theory.theory.static_heads import static_head_features
    clients = small_clients(positional_strength=2.0)
    X, q, _ = pooled(clients)
    params = random_params(seed=3)
    K = kernel(params)
    target = int(np.argmax(input_independent_share(K, X, q)))
    phi = static_head_features(clients, "uniform", count=1)(params)       # (m, N, H·d)
    stacked = stack_clients(clients)
    X_all = stack_contexts(clients)
    d = K.shape[-1]
    for c in range(len(clients)):
        N = clients[c].X.shape[0]
        got = phi[c, :N].reshape(N, 2, d)
        np.testing.assert_allclose(got[:, target], clients[c].X.mean(axis=1), rtol=1e-12)
        other = 1 - target
        expected = np.einsum("nab,cb,nc->na", stacked.S[c, :N], K[other], stacked.q[c, :N])
        np.testing.assert_allclose(got[:, other], expected, rtol=1e-10, atol=1e-12)
    assert X_all.shape[1] >= max(c.X.shape[0] for c in clients)
