"""The frozen stage under client sampling (docs/theory.md §5, "Client sampling"): the closed-form mean and
second moment of ``V`` against every subset enumerated, and against the simulator's own sampled runs."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from linattn_theory.core.frozen_map import frozen_client_map
from linattn_theory.core.model import kernel, value_matrix
from linattn_theory.sim.config import config_from_dict
from linattn_theory.sim.engine import prepare_run, run_schedule
from linattn_theory.theory.frozen_stage import (affine_round, expected_frozen_objective, sampled_frozen_stage,
                                                sampling_pair_weights)
from linattn_theory.theory.host import host_moments

TINY = {"seed": 5,
        "task": {"family": "planted_kernel", "num_clients": 5, "samples_per_client": 24, "tokens": 5, "dim": 3,
                 "rank": 2, "outputs": 2, "zeta_value": 2.0, "zeta_covariate": 0.5},
        "model": {"rank": 2},
        "federated": {"strategy": "fedfrozen", "rounds": 6, "warmup_rounds": 0, "local_steps": 4,
                      "learning_rate": 0.05, "ridge": 0.01}}


@pytest.fixture(scope="module")
def stage():
    config = config_from_dict(TINY)
    data, params = prepare_run(config)
    moments = host_moments(np.asarray(kernel(params)), data)
    V0 = value_matrix(np, np.asarray(params.WV, dtype=np.float64))
    return config, data, params, moments, V0


def test_pair_weights_count_the_pairs():
    """α + β = k/m (a client with itself) and β m(m − 1) = k(k − 1) (ordered distinct pairs), for all k."""
    for m in (1, 2, 5, 9):
        for k in range(1, m + 1):
            alpha, beta = sampling_pair_weights(m, k)
            assert alpha + beta == pytest.approx(k / m) and beta * m * (m - 1) == pytest.approx(k * (k - 1))
    with pytest.raises(ValueError, match="participants"):
        sampling_pair_weights(3, 4)


@pytest.mark.parametrize("k, server", [(1, 1.0), (2, 1.0), (3, 0.6), (5, 1.0)])
def test_one_round_equals_the_average_over_every_subset(stage, k, server):
    """From a random V (mean μ, second moment Σ = μμ^T + C), one round's E[V'] and E[V'V'^T] by the closed form
    equal the average over all C(5, k) subsets of the exact update of mean and second moment, to 1e-12."""
    config, _, _, moments, V0 = stage
    fed = config.federated
    rng = np.random.default_rng(0)
    Mc, bc = frozen_client_map(moments, fed.learning_rate, fed.local_steps, fed.ridge)
    n, p = bc.shape[1:]
    mu = rng.normal(size=(n, p))
    C = rng.normal(size=(n, n))
    second = mu @ mu.T + C @ C.T

    subsets = list(itertools.combinations(range(5), k))
    means, seconds = [], []
    for S in subsets:
        A = (1 - server) * np.eye(n) + server * Mc[list(S)].mean(axis=0)
        a = server * bc[list(S)].mean(axis=0)
        means.append(A @ mu + a)
        seconds.append(A @ second @ A.T + A @ mu @ a.T + a @ mu.T @ A.T + a @ a.T)
    mean_ref, second_ref = np.mean(means, axis=0), np.mean(seconds, axis=0)
    mean, second_cf = _one_round(moments, fed, mu, second, k, server)
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(second_cf, second_ref, rtol=1e-12, atol=1e-12)


def _one_round(moments, fed, mu, second, k, server):
    """sampled_frozen_stage's round from an arbitrary (μ, Σ): V0 = μ gives Σ_0 = μμ^T, so run one round from μ
    and add the part that the extra covariance C = Σ − μμ^T contributes, E[A_S C A_S^T], by enumeration-free
    linearity: one round from (μ, μμ^T + C) = one round from (μ, μμ^T) + E[A_S C A_S^T]; E[A_S C A_S^T] is the
    closed form's own second moment of a round from V0 = 0 with b = 0, i.e. of the linear part alone."""
    mean, second0 = sampled_frozen_stage(moments, fed.learning_rate, fed.local_steps, fed.ridge, mu, 1, k, server)
    C = second - mu @ mu.T
    w, U = np.linalg.eigh(C)                  # C = Σ_j w_j u_j u_j^T: E[A u u^T A^T] = the second moment from u
    extra = np.zeros_like(second)
    zero_b = dataclasses.replace(moments, B=np.zeros(moments.B.shape[:2] + (1,)))
    for wj, u in zip(w, U.T):
        _, sj = sampled_frozen_stage(zero_b, fed.learning_rate, fed.local_steps, fed.ridge, u[:, None], 1, k, server)
        extra += wj * sj
    return mean, second0 + extra


def test_everyone_taking_part_leaves_no_covariance(stage):
    """k = m: the mean is the full-participation map iterated and E[VV^T] = E[V]E[V]^T (to 1e-12)."""
    config, _, _, moments, V0 = stage
    fed = config.federated
    mean, second = sampled_frozen_stage(moments, fed.learning_rate, fed.local_steps, fed.ridge, V0, 6, 5)
    M, b = affine_round(moments, fed.learning_rate, fed.local_steps, fed.ridge)
    V = V0
    for _ in range(6):
        V = M @ V + b
    np.testing.assert_allclose(mean, V, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(second, mean @ mean.T, rtol=1e-10, atol=1e-13)


@pytest.mark.slow
def test_the_simulators_sampled_frozen_stage_averages_to_the_closed_form():
    """The simulator's frozen stage (the kernel of θ⁰ frozen, 20 rounds, 2 of 5 heterogeneous clients per
    round, ζ_V = 4, E = 10, η = 0.1) over 400 seeds: its mean final objective is the closed form's E[F_λ]
    within 4 standard errors of the mean (a sampling tolerance: the runs are independent draws), and the
    closed form's covariance term ½ tr(Ã Cov V) exceeds that tolerance, so the mean dynamics alone (what
    freeze_forecast predicts) fail the same test."""
    config = config_from_dict({**TINY, "task": {**TINY["task"], "zeta_value": 4.0},
                               "federated": {**TINY["federated"], "local_steps": 10, "learning_rate": 0.1,
                                             "rounds": 20, "participation": 0.4}})   # k = round(0.4 · 5) = 2
    data, params = prepare_run(config)
    moments = host_moments(np.asarray(kernel(params)), data)
    V0 = value_matrix(np, np.asarray(params.WV, dtype=np.float64))
    fed = config.federated
    finals = [float(run_schedule(params, data, fed, 0, seed).table["loss_regularized"].iloc[-1])
              for seed in range(400)]
    mean, second = sampled_frozen_stage(moments, fed.learning_rate, fed.local_steps, fed.ridge, V0, 20, 2)
    expected = expected_frozen_objective(moments, fed.ridge, mean, second)
    mean_only = expected_frozen_objective(moments, fed.ridge, mean, mean @ mean.T)
    error = np.std(finals, ddof=1) / np.sqrt(len(finals))
    assert abs(np.mean(finals) - expected) < 4 * error
    assert expected - mean_only > 4 * error


def test_unequal_weights_are_refused(stage):
    config, _, _, moments, V0 = stage
    skewed = dataclasses.replace(moments, weights=np.array([0.4, 0.15, 0.15, 0.15, 0.15]))
    with pytest.raises(ValueError, match="equal weights"):
        sampled_frozen_stage(skewed, 0.05, 4, 0.01, V0, 1, 2)
