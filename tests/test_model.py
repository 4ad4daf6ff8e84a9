"""Model (docs/theory.md §1): predictions, closed-form gradients, input validation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn_theory import Params, kernel, loss_and_grad, predict
from tests._finite_differences import assert_gradients_match


def random_problem(seed, H, d, r, p, n, B):
    rng = np.random.default_rng(seed)
    params = Params.init(d, r, p, heads=H, scale=1.0, seed=seed)
    return params, rng.normal(size=(B, n, d)), rng.normal(size=(B, d)), rng.normal(size=(B, p))


def test_predict_matches_direct_sum_over_tokens():
    params, X, q, _ = random_problem(0, H=3, d=4, r=2, p=3, n=5, B=6)
    K = kernel(params)
    # ŷ = Σ_h (1/n) Σ_i s_h(q, x_i) (W_V^h)^T x_i with s_h(q, x) = q^T K_h x
    scores = np.einsum("bc,hce,bie->bhi", q, K, X)
    direct = np.einsum("bhi,hep,bie->bp", scores, params.WV, X) / X.shape[1]
    np.testing.assert_allclose(predict(params, X, q), direct, rtol=1e-12, atol=1e-13)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), H=st.integers(1, 3), d=st.integers(1, 4),
       r=st.integers(1, 4), p=st.integers(1, 3), n=st.integers(1, 4), B=st.integers(1, 4))
def test_gradients_equal_central_finite_differences(seed, H, d, r, p, n, B):
    """Closed-form gradients against fourth-order central differences within their error bound
    (tests/_finite_differences.py)."""
    params, X, q, y = random_problem(seed, H, d, r, p, n, B)
    loss, grads = loss_and_grad(params, X, q, y)
    assert_gradients_match(lambda P: loss_and_grad(P, X, q, y)[0], params, grads, loss)


def test_loss_is_batch_mean_of_half_squared_error():
    params, X, q, y = random_problem(1, H=2, d=3, r=2, p=2, n=4, B=5)
    loss, _ = loss_and_grad(params, X, q, y)
    expected = np.mean(0.5 * np.sum((predict(params, X, q) - y) ** 2, axis=1))
    assert loss == pytest.approx(expected, rel=1e-14)


def test_scale_symmetry_leaves_predictions_unchanged():
    params, X, q, _ = random_problem(2, H=2, d=3, r=3, p=2, n=4, B=3)
    c = 2.5
    scaled = Params(params.WQ * c, params.WK, params.WV / c)
    np.testing.assert_allclose(predict(scaled, X, q), predict(params, X, q), rtol=1e-12)


@pytest.mark.parametrize("bad, match", [
    (lambda X, q, y: (X[0], q, y), "expected \\(B, n, d\\)"),
    (lambda X, q, y: (X, q[:, :2], y), "q has shape"),
    (lambda X, q, y: (X, q, y[:2]), "y has shape"),
    (lambda X, q, y: (np.where(X > 1, np.nan, X), q, y), "X contains non-finite"),
    (lambda X, q, y: (X, q, np.full_like(y, np.inf)), "y contains non-finite"),
])
def test_public_api_rejects_bad_arrays(bad, match):
    params, X, q, y = random_problem(3, H=1, d=3, r=2, p=2, n=4, B=5)
    with pytest.raises(ValueError, match=match):
        loss_and_grad(params, *bad(X, q, y))


def test_params_dimension_mismatch_is_reported():
    params, X, q, y = random_problem(4, H=1, d=3, r=2, p=2, n=4, B=5)
    with pytest.raises(ValueError, match="token dimension"):
        predict(Params.init(4, 2, 2), X, q)
    with pytest.raises(ValueError, match="outputs"):
        loss_and_grad(Params.init(3, 2, 1), X, q, y)
    with pytest.raises(ValueError, match="r=0"):
        Params.init(3, 0, 2)


def test_float32_option_keeps_dtype():
    params = Params.init(3, 2, 2, dtype=np.float32)
    rng = np.random.default_rng(0)
    X, q = rng.normal(size=(2, 4, 3)).astype(np.float32), rng.normal(size=(2, 3)).astype(np.float32)
    assert predict(params, X, q).dtype == np.float32


def test_kernel_gradient_takes_the_features_of_the_moments_bit_for_bit():
    """``value_moments_and_features`` hands its features ``φ`` to ``kernel_gradient_from_moments``
    (``phi=``): the same numbers as the gradient computing them itself, and the moments are built
    from them (``A = Σ_i w_i φ_i φ_iᵀ``); softmax attention refuses them (its gradient needs the
    attention weights)."""
    from linattn_theory.core.clients import stack_clients
    from linattn_theory.core.model import kernel_gradient_from_inputs, kernel_gradient_from_moments
    from linattn_theory.core.moments import value_moments, value_moments_and_features
    from linattn_theory.data.tasks import planted_kernel_clients

    clients = planted_kernel_clients(num_clients=3, samples_per_client=20, tokens=6, dim=4, rank=2, seed=4)
    data = stack_clients(clients)
    rng = np.random.default_rng(0)
    K = rng.normal(size=(2, 4, 4))                                  # two heads
    moments, phi = value_moments_and_features(K, data)
    alone = value_moments(K, data)
    assert all(np.array_equal(getattr(moments, f), getattr(alone, f)) for f in ("A", "B", "y2", "weights"))
    assert np.allclose(moments.A, np.einsum("cni,cnj,cn->cij", phi, phi, data.sample_weight), rtol=1e-13, atol=0)
    params = Params(K, np.broadcast_to(np.eye(4), K.shape), rng.normal(size=(2, 4, data.y.shape[-1])))
    S, q, y, w = data.S, data.q, data.y, data.sample_weight
    own = kernel_gradient_from_moments(params, S, q, y, w)
    assert np.array_equal(kernel_gradient_from_moments(params, S, q, y, w, phi=phi), own)
    other = value_moments_and_features(K + 0.1, data)[1]            # features of another kernel: another gradient
    assert not np.allclose(kernel_gradient_from_moments(params, S, q, y, w, phi=other), own)
    X = rng.normal(size=(3, 20, 6, 4))                              # contexts (m, N, n, d)
    with pytest.raises(ValueError, match="softmax"):
        kernel_gradient_from_inputs(params, X, q, y, w, attention="softmax", phi=phi)
