"""Task families (docs/theory.md §2): shapes, weights, seeding independent of the client count."""

import numpy as np
import pytest

from linattn_theory import in_context_regression_clients, make_clients, planted_kernel_clients
from linattn_theory.core.model import context_second_moment, features
from linattn_theory.core.clients import as_federated, stack_clients
from linattn_theory.data.families import FAMILIES, family_keys

#: the registered families that draw samples per client (every one but the digits data set):
#: the checks below hold for each, a family added by docs/howto/add-task-family.md included
SAMPLED_FAMILIES = [family for family in FAMILIES if "samples_per_client" in family_keys(family)]


def test_planted_kernel_shapes_and_targets():
    data = planted_kernel_clients(num_clients=3, samples_per_client=10, tokens=5, dim=4, heads=2,
                                  rank=2, outputs=3, noise=0.0, seed=1)
    assert len(data) == 3 and data.dims == (5, 4, 3)
    np.testing.assert_allclose(data.weights, [1 / 3] * 3)
    X, q, y = data[1]
    np.testing.assert_array_equal(q, X[:, -1])          # the query is the last token
    K, V = data.truth["kernel"], data.truth["value_maps"][1]
    phi = features(K, context_second_moment(X), q).reshape(10, -1)
    np.testing.assert_allclose(y, phi @ V.reshape(-1, 3), rtol=1e-12)


@pytest.mark.parametrize("family", SAMPLED_FAMILIES)
def test_client_data_do_not_depend_on_number_of_clients(family):
    few = make_clients(family, seed=3, num_clients=2, samples_per_client=8)
    many = make_clients(family, seed=3, num_clients=5, samples_per_client=8)
    for c in range(2):
        for a, b in zip(few[c], many[c]):
            np.testing.assert_array_equal(a, b)


def test_dirichlet_skew_keeps_first_samples_and_weights_follow_sizes():
    a = planted_kernel_clients(num_clients=4, samples_per_client=50, dirichlet_alpha=0.5, seed=2)
    b = planted_kernel_clients(num_clients=6, samples_per_client=50, dirichlet_alpha=0.5, seed=2)
    sizes = a.sizes
    assert sizes.min() >= 1 and sizes.sum() == 4 * 50 and len(set(sizes)) > 1
    np.testing.assert_allclose(a.weights, sizes / sizes.sum())
    k = min(a.sizes[0], b.sizes[0])
    np.testing.assert_array_equal(a[0].X[:k], b[0].X[:k])


def test_heterogeneity_zero_makes_clients_identically_distributed():
    data = planted_kernel_clients(num_clients=3, samples_per_client=4, zeta_value=0.0,
                                  zeta_covariate=0.0, seed=0)
    maps = data.truth["value_maps"]
    np.testing.assert_array_equal(maps[0], maps[2])
    np.testing.assert_array_equal(data.truth["token_variances"], 1.0)


def test_in_context_regression_layout():
    data = in_context_regression_clients(num_clients=2, samples_per_client=6, tokens=7, dim=3,
                                         noise=0.0, seed=0)
    X, q, y = data[0]
    assert X.shape == (6, 7, 4) and q.shape == (6, 4) and y.shape == (6, 1)
    assert np.all(q[:, -1] == 0)
    # context labels are w^T x: recover w per sample by least squares and predict the query
    for i in range(6):
        w, *_ = np.linalg.lstsq(X[i, :, :3], X[i, :, 3], rcond=None)
        assert q[i, :3] @ w == pytest.approx(y[i, 0], rel=1e-8, abs=1e-8)


def test_plain_tuples_are_accepted_and_stacked_with_padding():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(N, 3, 2)), rng.normal(size=(N, 2)), rng.normal(size=(N, 1)))
               for N in (3, 5)]
    data = as_federated(clients)
    np.testing.assert_allclose(data.weights, [3 / 8, 5 / 8])
    stacked = stack_clients(clients)
    assert stacked.S.shape == (2, 5, 2, 2)
    np.testing.assert_allclose(stacked.sample_weight.sum(axis=1), 1.0)
    assert np.all(stacked.sample_weight[0, 3:] == 0)
    with pytest.raises(ValueError, match="client 1"):
        as_federated([clients[0], (clients[1][0], clients[1][1][:, :1], clients[1][2])])


def test_unknown_family_is_rejected():
    with pytest.raises(ValueError, match="unknown"):
        make_clients("vision")


def test_every_family_names_its_keys_by_its_factory_and_takes_seed_and_fresh_samples():
    """A family's ``[task]`` keys are its factory's keyword arguments but ``seed`` and
    ``fresh_samples``; a factory without ``fresh_samples`` is refused with a message naming it."""
    from linattn_theory.data import families
    from linattn_theory.sim.config import TaskConfig
    import dataclasses
    fields = {f.name for f in dataclasses.fields(TaskConfig)} - {"family"}
    for family in FAMILIES:
        assert family_keys(family) <= fields, family
    assert family_keys("in_context_regression") == {"num_clients", "samples_per_client", "tokens", "dim",
                                                    "zeta_covariate", "zeta_task", "noise", "dirichlet_alpha"}

    def no_fresh(num_clients=2, seed=0):
        """A factory that cannot draw fresh samples."""

    families.FAMILIES.register("no_fresh", no_fresh)
    try:
        with pytest.raises(TypeError, match="'no_fresh': its factory takes no fresh_samples"):
            family_keys("no_fresh")
    finally:
        del families.FAMILIES._entries["no_fresh"]


@pytest.mark.parametrize("family", SAMPLED_FAMILIES)
def test_fresh_samples_share_the_clients_but_not_the_draws(family):
    skew = {"dirichlet_alpha": 0.7} if "dirichlet_alpha" in family_keys(family) else {}
    train = make_clients(family, seed=4, num_clients=3, samples_per_client=6, **skew)
    fresh = make_clients(family, seed=4, num_clients=3, samples_per_client=50, fresh_samples=True, **skew)
    for key in train.truth:
        np.testing.assert_array_equal(train.truth[key], fresh.truth[key])
    assert list(fresh.sizes) == [50, 50, 50]
    for c in range(3):
        assert not np.isin(train[c].X, fresh[c].X).any()


@pytest.mark.parametrize("alpha", [1e-4, 0.01, 0.5, 20.0])
def test_dirichlet_sizes_follow_the_distribution_for_every_alpha(alpha):
    """Client 0's share of the samples beyond the one each client is guaranteed is the first
    coordinate of a Dirichlet(α, …, α) vector, i.e. Beta(α, (m − 1)α): over 400 seeds, the
    frequency of a share above 1/2 (binomial test) and, for α ≥ 0.5, the whole law
    (Kolmogorov–Smirnov; the rounding error 1/R = 1e-4 is far under the KS tolerance)."""
    from scipy import stats

    from linattn_theory.core.seeds import SEED_CLIENT, seed_sequence
    from linattn_theory.data.tasks import client_sizes
    m, N = 4, 2501
    spare = m * (N - 1)
    shares = []
    for seed in range(400):
        rngs = [np.random.default_rng(seed_sequence(seed, SEED_CLIENT, c)) for c in range(m)]
        sizes = client_sizes(m, N, alpha, rngs)
        assert min(sizes) >= 1 and sum(sizes) == m * N
        shares.append((sizes[0] - 1) / spare)
    share = stats.beta(alpha, (m - 1) * alpha)
    dominant = sum(s > 0.5 for s in shares)      # for α → 0 one client takes nearly everything
    assert stats.binomtest(dominant, len(shares), share.sf(0.5)).pvalue > 1e-3
    if alpha >= 0.5:                             # for small α the share is 0 or 1 to within 1/R
        assert stats.kstest(shares, share.cdf).pvalue > 1e-3
