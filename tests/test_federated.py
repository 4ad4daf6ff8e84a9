"""Federated schedule (docs/theory.md §3): FedAvg ≡ centralised GD, determinism, frozen blocks, divergence."""

import numpy as np
import pytest

from linattn_theory import Params, RunConfig, kernel, loss_and_grad_from_moments, simulate
from linattn_theory.sim.engine import RunState, clients_from_config, initial_params, prepare_run, run_schedule
from linattn_theory.core.clients import stack_clients
from linattn_theory.core.errors import SettingWarning

SMALL = {"task.num_clients": 4, "task.samples_per_client": 24, "task.tokens": 5, "task.dim": 4,
         "task.rank": 2, "model.rank": 2, "federated.rounds": 6,
         "federated.warmup_rounds": 3}


def small_config(**updates):
    return RunConfig().with_updates({**SMALL, **updates})


def centralised_gradient_descent(config, steps):
    """θ ← θ − η ∇F(θ), F = Σ_c p_c F_c (plus the value ridge), written independently of the simulator."""
    clients = clients_from_config(config)
    data = stack_clients(clients)
    params = initial_params(config, data.q.shape[-1], data.y.shape[-1])
    eta, lam = config.federated.learning_rate, config.federated.ridge
    p = data.weights
    for _ in range(steps):
        grads = []
        for c in range(len(clients)):
            X, q, y = clients[c]
            S = X.transpose(0, 2, 1) @ X / X.shape[1]
            _, g = loss_and_grad_from_moments(params, S, q, y)
            grads.append(g)
        mean = Params(*(sum(p[c] * getattr(grads[c], b) for c in range(len(grads)))
                        for b in ("WQ", "WK", "WV")))
        params = Params(params.WQ - eta * mean.WQ, params.WK - eta * mean.WK,
                        params.WV - eta * (mean.WV + lam * params.WV))
    return params


@pytest.mark.parametrize("heads, ridge, skew", [(1, 0.0, None), (2, 0.05, 0.5)])
def test_fedavg_with_one_local_step_is_centralised_gradient_descent(heads, ridge, skew):
    updates = {"federated.strategy": "fedavg", "federated.local_steps": 1, "model.heads": heads,
               "federated.ridge": ridge}
    if skew is not None:
        updates["task.dirichlet_alpha"] = skew
    config = small_config(**updates)
    result = simulate(config)
    reference = centralised_gradient_descent(config, config.federated.rounds)
    for block in ("WQ", "WK", "WV"):
        a, b = getattr(result.params, block), getattr(reference, block)
        assert np.abs(a - b).max() <= 1e-12 * np.abs(b).max(), block


def test_same_config_gives_bit_identical_tables():
    config = small_config(**{"federated.batch_size": 8, "federated.participation": 0.5})
    first, second = simulate(config), simulate(config)
    assert first.table.equals(second.table)
    for block in ("WQ", "WK", "WV"):
        assert np.array_equal(getattr(first.params, block), getattr(second.params, block))


def test_seed_changes_results():
    a = simulate(small_config())
    b = simulate(small_config(seed=1))
    assert not a.table["loss"].equals(b.table["loss"])


@pytest.mark.parametrize("warmup", range(0, 7))
def test_frozen_stage_keeps_query_and_key_bit_identical(warmup):
    config = small_config(**{"federated.warmup_rounds": warmup})
    result = simulate(config)
    assert np.array_equal(result.params.WQ, result.warmup_params.WQ)
    assert np.array_equal(result.params.WK, result.warmup_params.WK)
    # the round-T0 parameters are those of plain training for T0 rounds
    prefix = simulate(config.with_updates({"federated.rounds": max(warmup, 1),
                                           "federated.strategy": "fedavg"})) if warmup else None
    if prefix is not None:
        assert np.array_equal(result.warmup_params.WQ, prefix.params.WQ)
    else:
        assert np.array_equal(result.warmup_params.WQ, initial_params(config, 4, 2).WQ)
    stages = result.table["stage"].tolist()
    assert stages == ["init"] + ["warmup"] * warmup + ["frozen"] * (6 - warmup)
    assert (result.table["drift_WQ"].iloc[warmup + 1:] == 0).all()
    if warmup < 6:
        assert not np.array_equal(result.params.WV, result.warmup_params.WV)


def test_table_reports_drift_and_client_losses():
    config = small_config(**{"federated.warmup_rounds": 3, "federated.local_steps": 4})
    table = simulate(config).table
    gamma = table["cumulative_kernel_drift"].to_numpy()
    assert gamma[3] > 0 and gamma[3] == gamma[-1]
    # the first round's kernel drift γ_0 = Σ_c p_c ‖K_c^{0,E} − K^1‖², from a replayed round
    from linattn_theory.theory.inexactness import replay_round
    clients = clients_from_config(config)
    fed = config.federated
    params = initial_params(config, clients[0][1].shape[-1], clients[0][2].shape[-1])
    new, local = replay_round(params, clients, fed.learning_rate, fed.local_steps, fed.ridge)
    spread = np.sum((kernel(local) - kernel(new)[None]) ** 2, axis=(1, 2, 3))
    assert table["kernel_drift"].iloc[1] == pytest.approx(float(np.sum(clients.weights * spread)), rel=1e-10)
    np.testing.assert_allclose(gamma[1:4], np.cumsum(table["kernel_drift"].to_numpy()[1:4]), rtol=1e-12)
    assert (table["drift_WV"].iloc[1:] > 0).all()
    losses = table[[f"client_loss_{c}" for c in range(4)]].to_numpy()
    weights = clients_from_config(config).weights
    np.testing.assert_allclose(losses @ weights, table["loss"], rtol=1e-12)


def test_one_local_step_has_no_client_drift_with_identical_clients():
    config = small_config(**{"task.zeta_value": 0.0, "task.zeta_covariate": 0.0,
                             "federated.local_steps": 1})
    table = simulate(config).table
    # one step from the same point: clients differ only through their own samples
    assert (table["drift_WV"].iloc[1:] > 0).all()
    config_e1 = small_config(**{"task.num_clients": 1, "federated.local_steps": 3})
    with pytest.warns(SettingWarning, match=r"one client \(m = 1\)"):   # allowed, but said
        table1 = simulate(config_e1).table
    assert (table1["drift_WV"] == 0).all() and (table1["kernel_drift"] == 0).all()


def test_loss_decreases_with_a_stable_step():
    table = simulate(small_config(**{"federated.rounds": 20})).table
    assert table["loss"].iloc[-1] < 0.9 * table["loss"].iloc[0]
    assert (table["loss"].iloc[1:] < table["loss"].iloc[0]).all()


def test_divergent_run_is_detected_with_round_and_stable_step():
    config = small_config(**{"federated.learning_rate": 5.0, "federated.rounds": 30})
    result = simulate(config)
    assert result.diverged
    div = result.divergence
    assert 1 <= div.round <= 30 and len(result.table) == div.round + 1
    assert 0 < div.stable_learning_rate < 5.0
    assert f"round {div.round}" in div.message and "η <" in div.message
    # the suggested step is stable for the frozen value stage
    safe = config.with_updates({"federated.learning_rate": 0.9 * div.stable_learning_rate,
                                "federated.warmup_rounds": 0})
    assert not simulate(safe).diverged


def test_a_divergence_reports_its_stable_step_when_read_the_same_as_at_once(monkeypatch):
    """A run alone on the host defers its divergence report's stable step (a curvature power
    iteration) until it is read; then, and once only, it computes exactly what the report made at
    once gives; a pickled report carries the computed numbers."""
    import pickle

    from linattn_theory.sim import rounds

    config = small_config(**{"federated.learning_rate": 5.0, "federated.rounds": 30})
    calls = []
    advice = rounds._divergence_advice
    monkeypatch.setattr(rounds, "_divergence_advice", lambda *args: calls.append(1) or advice(*args))
    result = simulate(config)
    deferred = result.divergence
    assert calls == [] and "_advice" in vars(deferred) and deferred.round >= 1
    step, message = result.metadata["divergence"]["stable_learning_rate"], deferred.message   # read: computed
    assert calls == [1] and deferred.stable_learning_rate == step and calls == [1] and 0 < step < 5.0
    assert dict(result.metadata["divergence"]) == {"round": deferred.round, "loss": deferred.loss,
                                                   "stable_learning_rate": step, "message": message}
    carried = pickle.loads(pickle.dumps(simulate(config).divergence))
    assert "_advice" not in vars(carried) and (carried.stable_learning_rate, carried.message) == (step, message)
    report = rounds.report_divergence
    monkeypatch.setattr(rounds, "report_divergence", lambda *args, **kwargs: report(*args))   # computed at once
    at_once = simulate(config).divergence
    assert "_advice" not in vars(at_once)
    assert (at_once.round, at_once.stable_learning_rate, at_once.message) == (deferred.round, step, message)


def test_float32_runs_in_float32():
    result = simulate(small_config(**{"model.dtype": "float32"}))
    assert result.params.WV.dtype == np.float32
    assert np.isfinite(result.table["loss"]).all()


def test_hessian_curvature_matches_dense_hessian():
    from linattn_theory.sim.engine import hessian_curvature
    config = small_config(**{"task.num_clients": 2, "task.dim": 3, "model.rank": 2, "task.outputs": 1})
    data = stack_clients(clients_from_config(config))
    params = initial_params(config, 3, 1)
    flat = np.concatenate([getattr(params, b).ravel() for b in ("WQ", "WK", "WV")])
    sizes = [getattr(params, b).size for b in ("WQ", "WK", "WV")]

    def unflatten(x):
        parts = np.split(x, np.cumsum(sizes)[:-1])
        return Params(*(p.reshape(getattr(params, b).shape) for p, b in zip(parts, ("WQ", "WK", "WV"))))

    def grad_c(x, c):
        _, g = loss_and_grad_from_moments(unflatten(x), data.S[c], data.q[c], data.y[c], data.sample_weight[c])
        return np.concatenate([g.WQ.ravel(), g.WK.ravel(), g.WV.ravel() + 0.1 * unflatten(x).WV.ravel()])

    eps = 1e-6
    dense = []
    for c in range(2):
        H = np.array([(grad_c(flat + eps * e, c) - grad_c(flat - eps * e, c)) / (2 * eps)
                      for e in np.eye(flat.size)])
        dense.append(np.abs(np.linalg.eigvalsh((H + H.T) / 2)).max())
    estimate = hessian_curvature(params, data, ridge=0.1, iterations=200)
    # power iteration converges to the largest |eigenvalue|; 200 iterations suffice here
    np.testing.assert_allclose(estimate, dense, rtol=1e-3)



@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_hessian_curvature_of_many_points_is_each_points_own(attention):
    """The divergence report iterates all its points at once: each row is bit for bit the
    curvature of its point alone, with the point's own difference step ε (here 10⁻⁵ and larger)."""
    from linattn_theory.sim.engine import hessian_curvature
    config = small_config(**{"task.num_clients": 3, "model.attention": attention})
    data, theta = prepare_run(config)
    rng = np.random.default_rng(5)
    points = [theta, theta.map(lambda a: 4.0 * a + 1.5), theta.map(lambda a: a + rng.normal(size=a.shape))]
    assert max(float(np.max(np.abs(points[1].WQ))), 1.0) > 1.0     # a point whose ε differs
    together = hessian_curvature(points, data, ridge=0.1, iterations=20)
    assert together.shape == (3, 3)
    for row, point in zip(together, points):
        assert np.array_equal(row, hessian_curvature(point, data, ridge=0.1, iterations=20))

def _states(config):
    """The run of ``config`` and the :class:`RunState` of every round, from ``on_round``."""
    data, theta0 = prepare_run(config)
    states = []
    result = run_schedule(theta0, data, config.federated, config.warmup_rounds, config.seed,
                          on_round=states.append)
    return data, result, states


@pytest.mark.parametrize("updates", [
    {"federated.strategy": "scaffold", "federated.participation": 0.5},
    {"federated.strategy": "fedavgm", "federated.batch_size": 5},
    {"federated.strategy": "fedfrozen_scaffold"},
    {"federated.learning_rate": 0.48, "federated.rounds": 30},     # diverges at round 3
], ids=["scaffold-partial", "fedavgm-minibatch", "fedfrozen_scaffold", "divergent"])
def test_run_continued_from_a_round_state_equals_the_uninterrupted_run(updates):
    config = small_config(**updates)
    data, whole, states = _states(config)
    assert [s.round for s in states] == list(range(len(whole.table)))
    for s in sorted({1, 4, len(states) - 2} & set(range(len(states) - 1))):   # rounds it continued from
        state = states[s]
        assert isinstance(state, RunState) and len(state.rows) == s + 1
        resumed = run_schedule(state.params, data, config.federated, config.warmup_rounds,
                               config.seed, prefix=state)
        assert resumed.table.equals(whole.table)
        for b in ("WQ", "WK", "WV"):
            np.testing.assert_array_equal(getattr(resumed.params, b), getattr(whole.params, b))
            np.testing.assert_array_equal(getattr(resumed.warmup_params, b),
                                          getattr(whole.warmup_params, b))
        assert resumed.divergence == whole.divergence
    if "federated.learning_rate" in updates:
        assert whole.diverged and whole.divergence.round == 3


def test_bad_prefix_is_rejected():
    config = small_config()
    data, _, states = _states(config)
    fed, T0 = config.federated, config.warmup_rounds
    with pytest.raises(ValueError, match="prefix.params"):
        run_schedule(states[0].params.map(np.copy), data, fed, T0, prefix=states[2])
    with pytest.raises(ValueError, match="expected the RunState"):
        run_schedule(states[2].params, data, fed, T0, prefix=states[2].rows)
    with pytest.raises(ValueError, match="rows 0..round"):
        run_schedule(states[2].params, data, fed, T0, prefix=states[2]._replace(rows=states[2].rows[:2]))
