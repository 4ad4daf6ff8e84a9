"""The ensemble engine (linattn_theory.sim.ensemble): many instances as one array program.

Each result must equal the one-at-a-time run (simulate, warmup_sweep, centralized_optimum) — bit
for bit where the same engine runs both, to rounding across engines — and must not depend on
which instances share its ensemble, on the chunking or on the number of threads.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from linattn_theory import config_from_dict, simulate
from linattn_theory.core.fused import numba_available, set_threads
from linattn_theory.sim.ensemble import Member, run_ensemble, simulate_many
from linattn_theory.sim.engine import clients_from_config, prepare_run, run_schedule
from linattn_theory.sim.warmup_grid import warmup_sweep, warmup_sweep_many

needs_numba = pytest.mark.skipif(not numba_available(), reason="the fused engine needs numba")


def config(seed=3, engine="array_api", **federated):
    fed = {"strategy": "fedfrozen", "rounds": 6, "warmup_rounds": 3, "local_steps": 3,
           "learning_rate": 0.05, "ridge": 0.05}
    fed.update(federated)
    return config_from_dict({"seed": seed, "task": {"num_clients": 4, "samples_per_client": 24,
                                                    "tokens": 5, "dim": 4, "rank": 2, "outputs": 2,
                                                    "zeta_value": 1.0},
                             "model": {"heads": 2, "rank": 2, "engine": engine}, "federated": fed})


def cases(engine):
    """Runs of several shapes, strategies and per-instance settings, with one divergent run."""
    runs = [config(engine=engine, warmup_rounds=T0) for T0 in (0, 3, 6)]          # a shared warm-up
    runs += [config(seed=4, engine=engine, warmup_rounds=2, learning_rate=0.03, ridge=0.0),
             config(seed=5, engine=engine, strategy="fedavg", server_learning_rate=0.7),
             config(seed=6, engine=engine, strategy="fedavgm", server_momentum=0.5),
             config(seed=7, engine=engine, strategy="fedadam", server_learning_rate=0.01),
             config(seed=8, engine=engine, strategy="value_frozen"),
             config(seed=9, engine=engine, participation=0.5),
             config(seed=10, engine=engine, learning_rate=4.0)]                    # diverges
    if engine == "array_api":                                                     # corrections, minibatches
        runs += [config(seed=11, engine=engine, strategy="fedprox", prox_mu=0.3),
                 config(seed=12, engine=engine, strategy="fedfrozen_scaffold", warmup_rounds=2),
                 config(seed=13, engine=engine, strategy="scaffold", batch_size=8, participation=0.5)]
    return runs


def numeric(table):
    return table.drop(columns=["stage", "strategy"]).to_numpy(float)


def relative_difference(a, b):
    """Largest relative difference of two runs' tables and parameters (0 where equal)."""
    assert list(a.table.columns) == list(b.table.columns)
    assert list(a.table["stage"]) == list(b.table["stage"]) and list(a.table["strategy"]) == list(b.table["strategy"])
    pairs = [(numeric(a.table), numeric(b.table))]
    pairs += [(getattr(x, k), getattr(y, k)) for x, y in ((a.params, b.params), (a.warmup_params, b.warmup_params))
              for k in ("WQ", "WK", "WV")]
    worst = 0.0
    for u, v in pairs:
        u, v = np.asarray(u, float), np.asarray(v, float)
        with np.errstate(divide="ignore", invalid="ignore"):
            worst = max(worst, float(np.max(np.where(u == v, 0.0, np.abs(u - v) / np.abs(v)), initial=0.0)))
    return worst


def assert_identical(a, b):
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    for x, y in ((a.params, b.params), (a.warmup_params, b.warmup_params)):
        for k in ("WQ", "WK", "WV"):
            np.testing.assert_array_equal(getattr(x, k), getattr(y, k))
    assert a.divergence == b.divergence
    assert json.dumps(_untimed(a.metadata), default=str) == json.dumps(_untimed(b.metadata), default=str)


def _untimed(metadata: dict) -> dict:
    """Metadata without when and how long a computation took (``provenance``'s timing keys)."""
    when = ("started", "wall_seconds", "computed_with")
    provenance = {k: v for k, v in metadata.get("provenance", {}).items() if k not in when}
    return {**metadata, "provenance": provenance}


def test_each_result_is_simulate_bit_for_bit_on_the_array_api_engine():
    runs = cases("array_api")
    alone = [simulate(c) for c in runs]
    for c, many, one in zip(runs, simulate_many(runs), alone):
        assert_identical(many, one)
    assert alone[9].diverged and sum(r.diverged for r in alone) < len(runs) - 3


def test_instances_of_one_group_each_gather_their_own_participants():
    # several instances of one ensemble and rule group, each drawing its own participants (k < m):
    # every instance must gather its own participants' data and SCAFFOLD control variates
    # (strategies.base.take_rows, an (instance, client) gather), so each result is its run alone
    runs = [config(seed=s, strategy=strategy, participation=0.5) for strategy in ("fedfrozen", "scaffold")
            for s in (20, 21, 22)]
    for many, c in zip(simulate_many(runs), runs):
        assert_identical(many, simulate(c))
    assert len({tuple(simulate(c).table["participants"]) for c in runs}) == 1        # k = 2 of m = 4 each round


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_simulate_and_simulate_many_agree_bit_for_bit_with_a_ridge_in_every_dtype(dtype):
    # F_λ = F + ½λ‖W_V‖² is one function on both paths, in the run's dtype: in float32 the
    # engine once added the ridge in float64 on the host and the ensemble in float32 (6e-8 apart)
    runs = [config(seed=s, **{"ridge": r, "warmup_rounds": T0}).with_updates({"model.dtype": dtype})
            for s, r, T0 in ((3, 0.05, 3), (4, 0.3, 0), (5, 0.0, 6))]
    for many, one in zip(simulate_many(runs), [simulate(c) for c in runs]):
        assert many.params.WV.dtype == np.dtype(dtype)
        assert_identical(many, one)
        assert many.table["loss_regularized"].iloc[-1] > many.table["loss"].iloc[-1] or \
            many.metadata["config"]["federated"]["ridge"] == 0.0


def test_the_hooks_of_simulate_run_in_an_ensemble():
    # frozen-stage features (static heads) and a strategy object, per config, beside a plain run
    from linattn_theory.sim.strategies import make_strategy
    runs = [config(seed=s, warmup_rounds=2) for s in (3, 4, 5)]
    data, _ = prepare_run(runs[0])
    phi = np.random.default_rng(0).normal(size=(data.S.shape[0], data.S.shape[1], 2 * data.S.shape[-1]))
    value_frozen = make_strategy(dataclasses.replace(runs[2].federated, strategy="value_frozen"), 2)
    hooks = {"frozen_features": [lambda params: phi, None, None], "strategies": [None, None, value_frozen]}
    many = simulate_many(runs, **hooks)
    alone = [simulate(runs[0], frozen_features=lambda params: phi), simulate(runs[1]),
             simulate(runs[2], strategy=value_frozen)]
    for a, b in zip(many, alone):
        assert_identical(a, b)
    plain = simulate(runs[0])
    assert not np.array_equal(many[0].params.WV, plain.params.WV)                  # the features were used
    assert list(many[2].table["stage"])[3:] == ["value_frozen"] * 4 and many[2].metadata["strategy"] == "value_frozen"


@needs_numba
def test_the_fused_ensemble_equals_simulate_to_rounding():
    runs = cases("fused")
    many = simulate_many(runs)
    for c, a in zip(runs, many):
        b = simulate(c.with_updates({"model.engine": "array_api"}))
        assert a.metadata["engine"] == "fused"
        # the same closed forms summed in another order over 6 rounds of 3 steps: rounding only
        assert relative_difference(a, b) <= 1e-12, c.federated
        assert a.diverged == b.diverged
        assert (a.metadata["rounds_completed"], a.metadata["warmup_rounds"], a.metadata["seed"]) == \
            (b.metadata["rounds_completed"], b.metadata["warmup_rounds"], b.metadata["seed"])


def test_one_divergent_instance_is_reported_alone_and_the_others_go_on():
    runs = [config(seed=s, learning_rate=4.0 if s == 1 else 0.05) for s in range(3)]
    results = simulate_many(runs)
    assert [r.diverged for r in results] == [False, True, False]
    alone = simulate(runs[1])
    assert results[1].divergence == alone.divergence              # its round, F and stable step
    assert results[1].divergence.stable_learning_rate < 4.0
    assert [len(r.table) for r in results] == [7, alone.divergence.round + 1, 7]


@pytest.mark.parametrize("engine", ["array_api", pytest.param("fused", marks=needs_numba)])
def test_results_do_not_depend_on_the_grouping_chunking_or_threads(engine, monkeypatch):
    from linattn_theory.core import fused
    monkeypatch.setattr(fused, "PARALLEL_WORK", 0)           # these small calls would run on one thread
    runs = cases(engine)
    reference = simulate_many(runs)
    reordered = simulate_many(runs[::-1])[::-1]
    alone = [simulate_many([c])[0] for c in runs[::3]]
    small = simulate_many(runs, max_bytes=1)                      # one instance per ensemble
    set_threads(1)
    try:
        one_thread = simulate_many(runs)
    finally:
        set_threads(None)
    for other in (reordered, small, one_thread):
        for a, b in zip(reference, other):
            assert_identical(a, b)
    for a, b in zip(reference[::3], alone):
        assert_identical(a, b)


@pytest.mark.parametrize("learning_rate, resume", [(0.05, 3), (0.5, 2)])
def test_members_continue_from_a_prefix_exactly(learning_rate, resume):
    """run_ensemble's checkpoints: continuing from one gives the uninterrupted run, its
    divergence report included (which reads the best iterate carried in the state)."""
    c = config(warmup_rounds=4, learning_rate=learning_rate)
    data, theta0 = prepare_run(c, clients_from_config(c))
    [(full, states, _)] = run_ensemble([Member(c, data, theta0, checkpoints=(resume,))])
    [(rest, _, _)] = run_ensemble([Member(c, data, states[resume].params, prefix=states[resume])])
    assert_identical(rest, full)
    assert full.diverged == (learning_rate > 0.1) and (not full.diverged or full.divergence.round > resume)


def test_on_round_sees_each_members_rounds_from_its_own_prefix():
    """Members continuing from prefixes of different rounds: each one's on_round sees its prefix,
    then every later round's state, as run_schedule continued from that prefix shows them."""
    c = config(warmup_rounds=4)
    data, theta0 = prepare_run(c, clients_from_config(c))
    [(_, states, _)] = run_ensemble([Member(c, data, theta0, checkpoints=(1, 3))])
    seen = {1: [], 3: []}
    members = [Member(c, data, states[r].params, prefix=states[r], on_round=seen[r].append) for r in (1, 3)]
    run_ensemble(members)
    for r in (1, 3):
        alone = []
        run_schedule(states[r].params, data, c.federated, c.warmup_rounds, c.seed, prefix=states[r],
                     on_round=alone.append)
        assert [s.round for s in seen[r]] == [s.round for s in alone] == list(range(r, c.federated.rounds + 1))
        assert seen[r][0] is states[r] and all(np.array_equal(a.params.WV, b.params.WV) for a, b in zip(seen[r], alone))


@pytest.mark.parametrize("frozen_stage", ["moments", "explicit"])
def test_warmup_sweep_many_equals_warmup_sweep(frozen_stage):
    runs = [config(seed=s, rounds=5, learning_rate=0.05 + 0.01 * s) for s in range(3)]
    runs.append(config(seed=9, rounds=5, learning_rate=4.0))                        # diverges
    many = warmup_sweep_many(runs, frozen_stage=frozen_stage)
    for c, sweep in zip(runs, many):
        one = warmup_sweep(c, frozen_stage=frozen_stage)
        assert list(sweep) == list(one) == list(range(6))
        for T0 in one:
            assert relative_difference(sweep[T0], one[T0]) <= 1e-12
            assert sweep[T0].divergence == one[T0].divergence
            assert sweep[T0].metadata["config"] == one[T0].metadata["config"]


@pytest.mark.parametrize("engine", ["array_api", pytest.param("fused", marks=needs_numba)])
def test_a_sweeps_fedavg_path_is_the_run_behind_its_fedavg_result(engine):
    """warmup_sweeps_and_paths hands out the FedAvg trajectory its sweep ran: the states after rounds
    0..T whose path (theory.bound.path_from_states) has the FedAvg result's table and final
    parameters bit for bit, up to the divergence when it diverged, whether the frozen stages run in
    moment space or explicitly (as under minibatches, where the path is the one a FedAvg run alone
    keeps); no path where the sweep is not every T0."""
    from linattn_theory.recommenders.scoring import fedavg_path
    from linattn_theory.sim.warmup_grid import warmup_sweeps_and_paths
    from linattn_theory.theory.bound import path_from_states

    runs = [config(seed=s, engine=engine, rounds=5, learning_rate=0.05 + 0.01 * s) for s in range(2)]
    runs.append(config(seed=9, engine=engine, rounds=5, learning_rate=4.0))         # diverges
    sweeps, paths = warmup_sweeps_and_paths(runs)
    assert [s.keys() for s in sweeps] == [s.keys() for s in warmup_sweep_many(runs)]
    for c, sweep, (data, states) in zip(runs, sweeps, paths):
        fedavg = sweep[5]
        last = fedavg.divergence.round if fedavg.diverged else 5
        assert [state.round for state in states] == list(range(last + 1))
        path = path_from_states(states)
        columns = ["loss", "loss_regularized", "kernel_drift"]
        pd.testing.assert_frame_equal(path.table[columns], fedavg.table[columns].iloc[1:last + 1].reset_index(drop=True),
                                      check_exact=True)
        if not fedavg.diverged:
            for b in ("WQ", "WK", "WV"):
                assert np.array_equal(getattr(states[-1].params, b), getattr(fedavg.params, b))
        assert data.S.shape[0] == c.task.num_clients
    assert paths[2] is not None and sweeps[2][5].diverged
    _, some = warmup_sweeps_and_paths(runs[:1], warmups=[0, 5])
    assert some == [None]

    def same_states(a, b):
        assert [x.round for x in a] == [y.round for y in b]
        for x, y in zip(a, b):
            for k in ("WQ", "WK", "WV"):
                np.testing.assert_array_equal(getattr(x.params, k), getattr(y.params, k))
    _, explicit = warmup_sweeps_and_paths(runs, frozen_stage="explicit")
    for (_, a), (_, b) in zip(explicit, paths):
        same_states(a, b)
    noisy = [c.with_updates({"federated.batch_size": 8, "federated.participation": 0.5, "model.engine": "array_api"})
             for c in runs[:2]]
    for c, (_, states) in zip(noisy, warmup_sweeps_and_paths(noisy)[1]):
        same_states(states, fedavg_path(c, clients_from_config(c))[1])


def test_the_array_api_ensemble_runs_on_array_api_strict():
    xs = pytest.importorskip("array_api_strict")
    from linattn_theory.core.clients import stack_clients
    runs = [config(seed=s, warmup_rounds=s, participation=0.75 if s else 1.0) for s in range(3)]

    def members(xp):
        out = []
        for c in runs:
            clients = clients_from_config(c)
            data, theta0 = prepare_run(c, clients)
            if xp is not None:
                data = stack_clients(clients, xp=xp)
                theta0 = theta0.map(xp.asarray)
            out.append(Member(c, data, theta0))
        return out

    strict = run_ensemble(members(xs), engine="array_api")
    plain = run_ensemble(members(None), engine="array_api")
    for (a, _, _), (b, _, _) in zip(strict, plain):
        assert relative_difference(a, b) <= 1e-12


def test_centralized_optima_follow_each_start_s_sequential_path():
    """Batched over starts and problems, every L-BFGS start takes exactly its one-at-a-time path
    (with BLAS on one thread, as the solver runs it)."""
    from scipy import optimize
    from threadpoolctl import threadpool_limits

    from linattn_theory.theory.profile import _factor_objectives, _problem, centralized_optima
    problems = [dict(clients=clients_from_config(config(seed=s)), lam=0.05, rank=2, heads=2,
                     restarts=2, seed=s) for s in range(3)]
    optima = centralized_optima(problems)
    for spec, optimum in zip(problems, optima):
        problem = _problem(**spec)
        for (label, WQ, WK), row in zip(problem.inits, optimum.starts.to_dict("records")):
            with threadpool_limits(1, user_api="blas"):
                res = optimize.minimize(lambda x: _factor_objectives(problem, [x])[0],
                                        np.concatenate([WQ.ravel(), WK.ravel()]), jac=True,
                                        method="L-BFGS-B", options={"maxiter": 1000, "ftol": 1e-15,
                                                                    "gtol": 1e-10, "maxcor": 20})
            assert (row["start"], row["objective"], row["iterations"]) == (label, float(res.fun), int(res.nit))
        # the optimum is the best start: the least L-BFGS objective (or an unoptimised start, better still)
        starts = optimum.starts.set_index("start")["objective"]
        if not optimum.best_start.endswith("(as given)"):
            assert optimum.best_start == starts.idxmin()
        # its Φ_λ is re-evaluated at K = W_Q W_Kᵀ by the profile solve, another order of summation than
        # the factor objective L-BFGS minimised: equal to rounding amplified by the conditioning of the
        # value solve (7e-10 relative measured on an AVX-512 CPU, where the exact comparison this
        # replaces failed; 0 on the CPU it was written on), so within 1e-8 relative, never above that
        assert optimum.objective <= starts.min() * (1 + 1e-8)


def test_a_start_repeated_on_equal_data_runs_once_and_gives_the_result_alone(monkeypatch):
    """Problems that share their clients (equal contents, separate objects) and seed share their random
    starts: each distinct (data, start) runs one L-BFGS, and every optimum and table of starts equals
    the problem solved alone, bit for bit; other data (another seed) or another start is not shared."""
    import linattn_theory.theory.profile as profile
    shared = [clients_from_config(config(seed=s)) for s in (3, 3, 4)]          # 3 twice: equal data
    teacher = shared[0].truth["kernel"]
    problems = [dict(clients=shared[0], lam=0.05, rank=2, restarts=2, seed=3),
                dict(clients=shared[1], lam=0.0, rank=2, restarts=2, seed=3, initial_kernels=[teacher + 0.1]),
                dict(clients=shared[2], lam=0.05, rank=2, restarts=2, seed=3)]
    alone = [profile.centralized_optima([spec])[0] for spec in problems]
    runs = []
    lockstep = profile._lockstep
    monkeypatch.setattr(profile, "_lockstep", lambda problems, jobs, *rest: (runs.extend(jobs),
                                                                             lockstep(problems, jobs, *rest))[1])
    together = profile.centralized_optima(problems)
    # problem 0: teacher + 2 random; 1: the same teacher and randoms, and its own kernel (start 1); 2: other data
    assert sorted(runs) == [(0, 0), (0, 1), (0, 2), (1, 1), (2, 0), (2, 1), (2, 2)]
    for a, b in zip(together, alone):
        assert a.objective == b.objective and a.starts.equals(b.starts)
        np.testing.assert_array_equal(a.kernel, b.kernel)
    assert together[1].lam == 0.0 and together[0].lam == 0.05


#: an online rule that stops early: on the tiny instances below it rolls back (seeds 4, 5), freezes
#: its last kernel (7), never stops (3) and sees its warm-up diverge first (10, 9)
EAGER_RULE = dict(adaptive_confidence=0.0, adaptive_gain_confidence=0.0, adaptive_window=2,
                  adaptive_descent_confidence=float("inf"))


@pytest.mark.parametrize("engine", ["array_api", pytest.param("fused", marks=needs_numba)])
def test_the_online_rules_run_follows_its_instances_fedavg_run_and_equals_simulate(engine, monkeypatch):
    """The online rule's run (fedfrozen_adaptive, T0 = T) shares the FedAvg trajectory of its
    instance's FedFrozen runs (T0 = T among them): its control replayed on that run's states, the
    frozen rounds after a freeze continued from them. Each result is the run alone, bit for bit;
    an online run with no T0 = T run beside it runs in an ensemble of its own, its control deciding in
    the round loop (simulate is never called back)."""
    import linattn_theory.sim.engine as engine_module

    def online(seed, **federated):
        return config(seed=seed, engine=engine, strategy="fedfrozen_adaptive", rounds=12, warmup_rounds=12,
                      **{**EAGER_RULE, **federated})

    runs, alone = [], []
    for seed, rate in ((4, 0.05), (5, 0.05), (7, 0.05), (3, 0.05), (10, 0.05), (9, 0.2)):
        runs += [config(seed=seed, engine=engine, rounds=12, warmup_rounds=T0, learning_rate=rate)
                 for T0 in (0, 5, 12)] + [online(seed, learning_rate=rate)]
    runs.append(online(8, learning_rate=0.2))                            # no FedFrozen run beside it
    runs.append(online(6).with_updates({"federated.warmup_rounds": 6}))  # T0 < T: its own run
    expected = [simulate(c) for c in runs]
    outcomes = {(r.metadata["kernel_round"], r.metadata["stop_round"], r.diverged)
                for c, r in zip(runs, expected) if c.federated.strategy == "fedfrozen_adaptive"}
    assert {(4, 5, False), (2, 4, False), (6, 6, False), (12, 12, False), (1, 1, True)} <= outcomes

    original = engine_module.simulate

    def counted(config, *args, **kwargs):
        alone.append(config)
        return original(config, *args, **kwargs)
    monkeypatch.setattr(engine_module, "simulate", counted)
    for many, one in zip(simulate_many(runs), expected):
        assert_identical(many, one)
    assert alone == []


def test_test_split_metrics_follow_each_run():
    """Real data with a test split (digits): test loss and accuracy per round, also for the runs
    whose warm-up a shared trajectory ran, and with softmax attention (the Array-API engine)."""
    pytest.importorskip("sklearn")
    base = {"seed": 1, "task": {"family": "digits", "num_clients": 3, "label_alpha": 0.5},
            "model": {"heads": 1, "rank": 2, "engine": "array_api"},
            "federated": {"strategy": "fedfrozen", "rounds": 4, "local_steps": 2, "learning_rate": 0.25}}
    runs = [config_from_dict({**base, "federated": {**base["federated"], "warmup_rounds": T0}}) for T0 in (1, 4)]
    runs.append(runs[0].with_updates({"model.attention": "softmax"}))
    fedavg = runs[1].with_updates({"seed": 5, "task.label_alpha": 5.0, "federated.rounds": 12,
                                   "federated.warmup_rounds": 12, "federated.learning_rate": 2.0})
    online = {"federated.strategy": "fedfrozen_adaptive", "federated.adaptive_window": 1,
              **{f"federated.{k}": v for k, v in EAGER_RULE.items() if k != "adaptive_window"}}
    runs += [fedavg, fedavg.with_updates(online)]          # the online run rolls back from round 11 to 10
    for many, one in zip(simulate_many(runs), [simulate(c) for c in runs]):
        assert "test_accuracy" in one.table
        assert_identical(many, one)
    assert (one.metadata["kernel_round"], one.metadata["stop_round"]) == (10, 11)
