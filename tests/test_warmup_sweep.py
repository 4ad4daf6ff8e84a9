"""Warm-up sweeps share their prefix and equal the explicit runs (docs/theory.md §3, §5)."""

from __future__ import annotations

import numpy as np
import pytest

import linattn_theory.core.model as model_module
from linattn_theory import config_from_dict, simulate, stack_clients
from linattn_theory.core.model import Params, kernel
from linattn_theory.core.moments import value_moments
from linattn_theory.data.tasks import planted_kernel_clients
from linattn_theory.core.frozen_map import frozen_client_map
from linattn_theory.sim.warmup_grid import warmup_sweep

RTOL = 1e-10   # moment-space frozen stage vs per-sample simulation: rounding only


def _config(**federated_settings):
    fed = {"rounds": 7, "warmup_rounds": 0, "local_steps": 3, "learning_rate": 0.05,
           "ridge": 0.05, "server_learning_rate": 0.8}
    fed.update(federated_settings)
    return config_from_dict({"seed": 4, "task": {"num_clients": 4, "samples_per_client": 30,
                                                  "dirichlet_alpha": 2.0, "zeta_value": 1.0},
                             "model": {"heads": 2}, "federated": fed})


def _assert_same_run(sweep_result, explicit, rtol):
    a, b = explicit.table, sweep_result.table
    assert list(a.columns) == list(b.columns)
    assert list(a["stage"]) == list(b["stage"]) and list(a["round"]) == list(b["round"])
    assert list(a["participants"]) == list(b["participants"])
    assert list(a["strategy"]) == list(b["strategy"])
    numeric = [c for c in a.columns if c not in ("stage", "round", "participants", "strategy")]
    np.testing.assert_allclose(b[numeric].to_numpy(float), a[numeric].to_numpy(float), rtol=rtol, atol=0)
    for block in ("WQ", "WK", "WV"):
        for which in ("params", "warmup_params"):
            np.testing.assert_allclose(getattr(getattr(sweep_result, which), block),
                                       getattr(getattr(explicit, which), block), rtol=rtol, atol=0)
    assert (sweep_result.divergence is None) == (explicit.divergence is None)
    if explicit.divergence is not None:
        assert sweep_result.divergence.round == explicit.divergence.round
        np.testing.assert_allclose([sweep_result.divergence.loss, sweep_result.divergence.stable_learning_rate],
                                   [explicit.divergence.loss, explicit.divergence.stable_learning_rate],
                                   rtol=rtol)
    # provenance records when each result was computed (simulate times itself)
    drop = lambda meta: {k: v for k, v in meta.items() if k not in ("divergence", "provenance")}  # noqa: E731
    assert drop(sweep_result.metadata) == drop(explicit.metadata)


@pytest.mark.parametrize("settings", [{}, {"participation": 0.5}], ids=["full", "partial"])
def test_full_batch_sweep_equals_explicit_runs_at_every_T0(settings):
    config = _config(**settings)
    sweep = warmup_sweep(config)
    assert sorted(sweep) == list(range(config.federated.rounds + 1))
    for T0, result in sweep.items():
        explicit = simulate(config.with_updates({"federated.strategy": "fedfrozen",
                                                 "federated.warmup_rounds": T0}))
        assert not explicit.diverged
        _assert_same_run(result, explicit, RTOL)
        # the frozen stage really froze the kernel at round T0
        np.testing.assert_array_equal(result.params.WQ, result.warmup_params.WQ)


def _count_warmup_gradients(monkeypatch):
    calls = []
    original = model_module.loss_and_grad_from_moments

    def counting(params, *args, blocks=model_module.BLOCKS, **kwargs):
        if "WQ" in blocks:
            calls.append(1)
        return original(params, *args, blocks=blocks, **kwargs)

    monkeypatch.setattr(model_module, "loss_and_grad_from_moments", counting)
    return calls


def test_minibatch_sweep_shares_the_prefix_and_is_bit_identical(monkeypatch):
    config = _config(batch_size=6, participation=0.75)
    T, E = config.federated.rounds, config.federated.local_steps
    warmups = [0, 2, 5, T]
    explicit = {T0: simulate(config.with_updates({"federated.warmup_rounds": T0}))
                for T0 in warmups}
    calls = _count_warmup_gradients(monkeypatch)
    sweep = warmup_sweep(config, warmups)
    # one warm-up trajectory of max(T0) rounds, not one per T0
    assert len(calls) == max(warmups) * E < sum(warmups) * E
    for T0 in warmups:
        _assert_same_run(sweep[T0], explicit[T0], rtol=0)


def test_full_batch_sweep_runs_one_trajectory(monkeypatch):
    config = _config()
    calls = _count_warmup_gradients(monkeypatch)
    warmup_sweep(config)
    assert len(calls) == config.federated.rounds * config.federated.local_steps


def test_diverging_runs_match_explicit_runs():
    # a large random kernel: the frozen stage at T0 = 0 diverges in round 3, every warm-up in round 1
    config = config_from_dict({"seed": 1, "task": {"num_clients": 4, "samples_per_client": 30,
                                                    "dirichlet_alpha": 2.0},
                               "model": {"heads": 2, "init_scale": 1.5},
                               "federated": {"rounds": 5, "warmup_rounds": 0, "local_steps": 3,
                                             "learning_rate": 0.05}})
    with np.errstate(over="ignore", invalid="ignore"):
        sweep = warmup_sweep(config)
        rounds = {}
        for T0, result in sweep.items():
            explicit = simulate(config.with_updates({"federated.warmup_rounds": T0}))
            _assert_same_run(result, explicit, RTOL)
            rounds[T0] = result.divergence.round
    assert rounds[0] > 1 and all(rounds[T0] == 1 for T0 in rounds if T0 > 0)


def test_frozen_client_map_is_E_local_steps():
    clients = planted_kernel_clients(num_clients=3, samples_per_client=20, tokens=5, dim=4,
                                     heads=2, rank=2, outputs=2, seed=3)
    K = kernel(Params.init(4, 2, 2, heads=2, seed=1))
    moments = value_moments(K, stack_clients(clients))
    eta, E, lam = 0.07, 4, 0.2
    M, b = frozen_client_map(moments, eta, E, lam)
    n = moments.A.shape[-1]
    for c in range(3):
        step = np.eye(n) - eta * (moments.A[c] + lam * np.eye(n))
        np.testing.assert_allclose(M[c], np.linalg.matrix_power(step, E), rtol=1e-12, atol=1e-14)
        series = sum(np.linalg.matrix_power(step, j) for j in range(E)) @ (eta * moments.B[c])
        np.testing.assert_allclose(b[c], series, rtol=1e-12, atol=1e-14)


def test_bad_warmups_and_options():
    config = _config()
    with pytest.raises(ValueError, match=r"warmups contains 8"):
        warmup_sweep(config, [0, 8])
    with pytest.raises(ValueError, match=r"warmups contains -1"):
        warmup_sweep(config, [-1])
    with pytest.raises(ValueError, match="frozen_stage"):
        warmup_sweep(config, frozen_stage="fast")
    with pytest.raises(ValueError, match="full batches"):
        warmup_sweep(_config(batch_size=4), frozen_stage="moments")


def _frozen_stage(strategy, engine, T0=2):
    """The frozen stage of ``strategy`` (``T0 = 2``, kernel frozen after) run by the round loop's
    ``engine`` from the round-``T0`` state of the explicit run: ``(explicit run, continued run)``."""
    from linattn_theory.sim.ensemble import prepare_run
    from linattn_theory.sim.rounds import Member, run_ensemble
    config = _config(rounds=6, warmup_rounds=T0, participation=0.5)
    data, theta0 = prepare_run(config)
    [(explicit, states, _)] = run_ensemble([Member(config, data, theta0, checkpoints=(T0,), strategy=strategy)],
                                           engine="array_api")
    [(continued, _, _)] = run_ensemble([Member(config, data, states[T0].params, prefix=states[T0],
                                               strategy=strategy)], engine=engine)
    return explicit, continued


def test_the_moment_space_backend_takes_the_strategy_s_server_step():
    """The moment space is a backend of the round loop (sim/rounds.py), so its server step is the
    strategy's: FedFrozen with FedAvgM's server momentum in the frozen stage equals the explicit loop
    to rounding, and the momentum matters (FedAvg's server step gives other numbers)."""
    from linattn_theory.sim.strategies.base import Strategy, freeze_after, local_sgd, server_sgd
    from linattn_theory.sim.strategies.fedavgm import momentum
    with_momentum = Strategy("fedfrozen", freeze_after(2, ("WV",)), local_sgd(), momentum(0.8, 0.9))
    explicit, moments = _frozen_stage(with_momentum, "moments")
    assert moments.metadata["engine"] == "moments" and explicit.metadata["engine"] == "array_api"
    assert list(moments.table["stage"]) == list(explicit.table["stage"])
    numeric = [c for c in explicit.table.columns if c not in ("stage", "strategy")]
    np.testing.assert_allclose(moments.table[numeric].to_numpy(float), explicit.table[numeric].to_numpy(float),
                               rtol=RTOL, atol=0)
    np.testing.assert_allclose(moments.params.WV, explicit.params.WV, rtol=RTOL, atol=0)
    plain = Strategy("fedfrozen", freeze_after(2, ("WV",)), local_sgd(), server_sgd(0.8))
    _, without = _frozen_stage(plain, "moments")
    assert abs(without.table["loss"].iloc[-1] / moments.table["loss"].iloc[-1] - 1) > 1e-6


def test_the_moment_space_backend_refuses_what_it_cannot_run():
    from linattn_theory.core.errors import ConfigError
    from linattn_theory.sim.ensemble import prepare_run
    from linattn_theory.sim.rounds import Member, run_ensemble
    from linattn_theory.sim.strategies.base import Strategy, freeze_after, local_sgd, server_sgd
    config = _config(rounds=4, warmup_rounds=2)
    with pytest.raises(ConfigError, match="engine = 'moments' does not apply: it continues frozen stages"):
        run_ensemble([Member(config, *prepare_run(config))], engine="moments")
    with pytest.raises(ValueError, match=r"round 1 trains \('WQ', 'WK', 'WV'\); the moment space holds a frozen"):
        _frozen_stage(Strategy("fedfrozen", freeze_after(2, ("WV",)), local_sgd(), server_sgd(1.0)), "moments", T0=1)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_moment_space_stage_is_the_same_bits_alone_and_in_an_ensemble(dtype):
    """Each instance's arithmetic is its own on the moment-space backend too: the frozen stage of
    one ``T0`` run alone equals, bit for bit, the same stage run beside the other ``T0``'s (their
    value moments computed in one call at their own kernels)."""
    from linattn_theory.sim.warmup_grid import (frozen_stage_from_moments, frozen_stages_from_moments,
                                                warmup_sweeps_and_paths)
    config = _config(rounds=5, warmup_rounds=5, participation=0.5).with_updates({"model.dtype": dtype})
    _, [(data, states)] = warmup_sweeps_and_paths([config])
    together = frozen_stages_from_moments([(states[T0], data, config.federated, T0, config.seed) for T0 in range(5)])
    for T0 in range(5):
        alone = frozen_stage_from_moments(states[T0], data, config.federated, T0, config.seed)
        numeric = [c for c in alone.table.columns if c not in ("stage", "strategy")]
        assert len(alone.table) == 6
        assert np.array_equal(alone.table[numeric].to_numpy(float), together[T0].table[numeric].to_numpy(float))
        assert np.array_equal(alone.params.WV, together[T0].params.WV)


def _assert_identical(a, b):
    """Two runs of the same bits: tables, parameters, divergence and (untimed) metadata."""
    import pandas as pd
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    for block in ("WQ", "WK", "WV"):
        for which in ("params", "warmup_params"):
            assert np.array_equal(getattr(getattr(a, which), block), getattr(getattr(b, which), block))
    assert a.divergence == b.divergence
    untimed = lambda meta: {k: v for k, v in meta.items() if k != "provenance"}  # noqa: E731
    assert untimed(a.metadata) == untimed(b.metadata)


@pytest.mark.parametrize("warmups", [[0], [3], [2, 5], [7]])
def test_a_sweep_of_some_T0_runs_the_full_sweeps_runs_bit_for_bit(warmups):
    """The shared warm-up runs up to the largest ``T0`` swept and the frozen stages (moment space)
    continue from it: each run is the full sweep's, bit for bit, also for ``T0 = 0`` alone (a
    trajectory of no rounds) and ``T0 = T`` alone (the trajectory is the run)."""
    config = _config(rounds=7, warmup_rounds=7, participation=0.5)
    full, some = warmup_sweep(config), warmup_sweep(config, warmups=warmups)
    assert sorted(some) == warmups
    for T0 in warmups:
        _assert_identical(some[T0], full[T0])
        assert some[T0].metadata["engine"] == simulate(config).metadata["engine"]   # the trajectory's


@pytest.mark.parametrize("frozen_stage", ["auto", "explicit"])
def test_each_copy_of_a_swept_config_gets_the_fedavg_path(frozen_stage):
    """A config given twice shares one warm-up, and each copy gets its FedAvg path."""
    from linattn_theory.sim.warmup_grid import warmup_sweeps_and_paths
    config = _config(rounds=4, warmup_rounds=4)
    sweeps, paths = warmup_sweeps_and_paths([config, config], frozen_stage=frozen_stage)
    for sweep, path in zip(sweeps, paths):
        assert path is not None and [state.round for state in path[1]] == list(range(5))
        _assert_identical(sweep[2], sweeps[0][2])


def test_a_step_scale_sweep_resolves_its_step_as_simulate_does():
    """``federated.step_scale`` sets each run's ``η`` before the shared warm-up, for moment-space
    frozen stages as for explicit ones: each run equals ``simulate`` (to rounding) with its record."""
    config = _config(rounds=5, warmup_rounds=5).with_updates({"federated.step_scale": 0.05})
    sweep = warmup_sweep(config, warmups=[0, 2, 5])
    for T0, run in sweep.items():
        alone = simulate(config.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": T0}))
        assert not alone.diverged and run.metadata["step_scale"] == alone.metadata["step_scale"]
        _assert_same_run(run, alone, RTOL)
