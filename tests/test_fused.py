"""The fused CPU engine equals the Array-API engine, whatever the threads; the automatic choice;
the lazy package import; the centralised optimum stored with a sweep."""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory import config_from_dict, simulate
from linattn_theory.core import fused as fused_module
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import config_hash
from linattn_theory.sim.engine import prepare_run, run_schedule
from linattn_theory.core.model import loss_and_grad_from_moments

needs_numba = pytest.mark.skipif(not fused_module.numba_available(), reason="numba is not installed")

BASE = {"seed": 3,
        "task": {"family": "planted_kernel", "num_clients": 6, "samples_per_client": 40, "tokens": 5,
                 "dim": 5, "rank": 2, "outputs": 2, "dirichlet_alpha": 1.0},   # unequal sizes: padding
        "model": {"heads": 2, "rank": 3},
        "federated": {"strategy": "fedfrozen", "rounds": 6, "warmup_rounds": 3, "local_steps": 3,
                      "learning_rate": 0.05, "ridge": 0.01, "participation": 0.5}}


#: softmax attention at a temperature other than 1 (the kernels divide the scores by τ)
SOFTMAX = {"model.attention": "softmax", "model.temperature": 0.7}


def config(**updates):
    return config_from_dict(BASE).with_updates(updates)


def relative(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def compare(run, reference):
    """Largest relative difference of the tables' numeric columns and of the parameters."""
    numeric = [c for c in reference.table.columns if c not in ("stage", "strategy")]
    diffs = [relative(run.table[numeric].to_numpy(float), reference.table[numeric].to_numpy(float))]
    for params, ref in ((run.params, reference.params), (run.warmup_params, reference.warmup_params)):
        diffs += [relative(getattr(params, b), getattr(ref, b)) for b in ("WQ", "WK", "WV")]
    return max(diffs)


@needs_numba
@pytest.mark.parametrize("attention", ["linear", "softmax"])
@pytest.mark.parametrize("strategy", ["fedfrozen", "fedavg", "value_frozen", "fedavgm"])
def test_fused_engine_equals_the_array_api_engine_in_float64(strategy, attention):
    # the same closed forms summed in another order: rounding only (float64 eps 2.2e-16, a few
    # hundred operations per number over 6 rounds of 3 steps); softmax (the closed forms of
    # loss_and_grad_from_contexts, τ ≠ 1) on d = n = 5: a column left over by the blocks of four
    cfg = config(**{"federated.strategy": strategy}, **(SOFTMAX if attention == "softmax" else {}))
    fused = simulate(cfg.with_updates({"model.engine": "fused"}))
    reference = simulate(cfg.with_updates({"model.engine": "array_api"}))
    assert (fused.metadata["engine"], reference.metadata["engine"]) == ("fused", "array_api")
    assert not reference.diverged
    assert list(fused.table["stage"]) == list(reference.table["stage"])
    assert compare(fused, reference) <= 1e-12


@pytest.mark.slow       # compiles the float32 kernels: 10–15 s
@needs_numba
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_fused_engine_in_float32_stays_float32_and_agrees_to_its_precision(attention):
    cfg = config(**{"model.dtype": "float32", "federated.strategy": "fedavg"},
                 **(SOFTMAX if attention == "softmax" else {}))
    fused = simulate(cfg.with_updates({"model.engine": "fused"}))
    reference = simulate(cfg.with_updates({"model.engine": "array_api"}))
    assert fused.params.WQ.dtype == np.float32 and fused.params.WV.dtype == np.float32
    # float32 eps 1.2e-7; sums of 40 samples over 18 local steps: a few hundred eps at most
    assert compare(fused, reference) <= 1e-4


@needs_numba
@pytest.mark.parametrize("updates", [{"task.dim": 5}, pytest.param({"task.dim": 13}, marks=pytest.mark.slow),
                                     {"model.attention": "softmax", "model.temperature": 0.7}],
                         ids=["d=5", "d=13 (tiles)", "softmax"])
def test_fused_engine_is_bit_identical_whatever_the_number_of_threads(updates, monkeypatch):
    monkeypatch.setattr(fused_module, "PARALLEL_WORK", 0)     # these small calls would run on one thread
    cfg = config(**{"model.engine": "fused", "task.num_clients": 7, "federated.participation": 1.0, **updates})
    runs = []
    try:
        for threads in (1, 2, 3):
            fused_module.set_threads(threads)
            runs.append(simulate(cfg))
    finally:
        fused_module.set_threads(None)
    for run in runs[1:]:
        assert run.table.equals(runs[0].table)
        for b in ("WQ", "WK", "WV"):
            assert np.array_equal(getattr(run.params, b), getattr(runs[0].params, b))


@needs_numba
def test_fused_engine_handles_padded_clients_in_one_kernel_call():
    # one thread: every client after the first in one call, so a padded sample (weight 0) of a
    # smaller client follows real samples of a larger one and must not reuse their values
    cfg = config(**{"federated.participation": 1.0, "federated.strategy": "fedavg"})
    sizes = prepare_run(cfg)[0].sizes
    assert any(a > b for a, b in zip(sizes[1:-1], sizes[2:])), sizes   # a larger client, then a smaller
    try:
        fused_module.set_threads(1)
        fused = simulate(cfg.with_updates({"model.engine": "fused"}))
    finally:
        fused_module.set_threads(None)
    reference = simulate(cfg.with_updates({"model.engine": "array_api"}))
    assert compare(fused, reference) <= 1e-12


@needs_numba
def test_fused_frozen_stage_with_static_features_equals_the_array_api_engine():
    # frozen_features replaces the features of the frozen stage (static heads)
    cfg = config()
    data, theta0 = prepare_run(cfg)
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(data.S.shape[0], data.S.shape[1], 2 * 5))     # (m, N, H·d)
    runs = {engine: run_schedule(theta0, data, cfg.federated, cfg.warmup_rounds, cfg.seed,
                                 frozen_features=lambda params: phi, engine=engine)
            for engine in ("fused", "array_api")}
    assert compare(runs["fused"], runs["array_api"]) <= 1e-12


def test_engine_choice_auto_and_forced(monkeypatch):
    small = config()
    data, theta0 = prepare_run(small)
    run = lambda cfg, **kw: run_schedule(theta0, data, cfg.federated, cfg.warmup_rounds, **kw)  # noqa: E731
    # below MIN_STEP_WORK, auto keeps the Array-API engine (no numba import for small runs)
    work = data.S.shape[-4] * data.S.shape[-3] * data.S.shape[-1] ** 2
    monkeypatch.setattr(fused_module, "MIN_STEP_WORK", work + 1)
    assert run(small).metadata["engine"] == "array_api"
    # where the fused engine does not apply, auto falls back (at any size) and forcing it is a ConfigError
    monkeypatch.setattr(fused_module, "MIN_STEP_WORK", 1)
    for updates in ({"federated.batch_size": 4}, {"federated.strategy": "fedprox"},
                    {"federated.strategy": "scaffold"}):
        cfg = small.with_updates(updates)
        assert run(cfg).metadata["engine"] == "array_api"
        with pytest.raises(ConfigError, match="engine = 'fused' does not apply"):
            run(cfg, engine="fused")
    with pytest.raises(ConfigError, match="expected one of"):
        run(small, engine="numba")


@needs_numba
def test_auto_uses_the_fused_engine_on_large_enough_steps(monkeypatch):
    monkeypatch.setattr(fused_module, "MIN_STEP_WORK", 1)
    cfg = config()
    data, theta0 = prepare_run(cfg)
    assert run_schedule(theta0, data, cfg.federated, cfg.warmup_rounds).metadata["engine"] == "fused"


@needs_numba
@pytest.mark.parametrize("task, expected", [
    ({"num_clients": 4, "samples_per_client": 64, "dim": 4}, "array_api"),    # m·N·d² = 2¹² < 2¹⁴
    ({"num_clients": 4, "samples_per_client": 64, "dim": 8}, "fused"),        # 2¹⁴, the threshold
    ({"num_clients": 8, "samples_per_client": 128, "dim": 8}, "fused"),       # 2¹⁶, the figures' size
])
def test_auto_is_one_rule_for_a_run_alone_and_in_an_ensemble(task, expected):
    """``engine="auto"`` decides from the instance's own step (``m·N·d² ≥ MIN_STEP_WORK``): a run
    alone (``simulate``, ``run_schedule``), an ensemble of one and an instance among others run
    the same engine, on both sides of the threshold."""
    from linattn_theory.sim.ensemble import simulate_many
    cfg = config_from_dict({"task": task, "federated": {"rounds": 2, "warmup_rounds": 1}})
    data, theta0 = prepare_run(cfg)
    m, N, d = data.S.shape[-4], data.S.shape[-3], data.S.shape[-1]
    assert (m * N * d * d >= fused_module.MIN_STEP_WORK) == (expected == "fused")
    engines = {"simulate": simulate(cfg).metadata["engine"],
               "run_schedule": run_schedule(theta0, data, cfg.federated, cfg.warmup_rounds).metadata["engine"],
               "ensemble of one": simulate_many([cfg])[0].metadata["engine"],
               "ensemble of three": simulate_many([cfg.with_updates({"seed": s}) for s in range(3)])[0]
               .metadata["engine"]}
    assert engines == dict.fromkeys(engines, expected)


def test_fused_engine_is_not_used_on_other_array_libraries():
    xp = pytest.importorskip("array_api_strict")
    cfg = config()
    data, _ = prepare_run(cfg)
    strict = type(data)(*(xp.asarray(a) for a in (data.S, data.q, data.y, data.sample_weight,
                                                      data.weights)), data.sizes)
    from linattn_theory.sim.engine import select_engine
    from linattn_theory.sim.strategies import make_strategy
    strategy = make_strategy(cfg.federated, cfg.warmup_rounds)
    assert select_engine("auto", xp, strict, cfg.federated, strategy) is None
    with pytest.raises(ConfigError, match="NumPy arrays only"):
        select_engine("fused", xp, strict, cfg.federated, strategy)


def test_default_engine_leaves_the_config_key_unchanged():
    # earlier runs' result keys were the hash of the config without model.engine, and (for every
    # strategy but fedfrozen_adaptive) with the online rule's settings as they were before its
    # redesign: window 5, horizon 3, no confidence
    cfg = config()
    assert cfg.federated.strategy != "fedfrozen_adaptive"
    data = cfg.to_dict()
    assert data["model"]["engine"] == "auto"
    del data["model"]["engine"]
    del data["federated"]["adaptive_confidence"]
    del data["federated"]["adaptive_gain_confidence"]
    del data["federated"]["adaptive_descent_confidence"]
    data["federated"].update(adaptive_window=5, adaptive_horizon=3)
    before = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert config_hash(cfg) == before
    assert config_hash(cfg.with_updates({"model.engine": "fused"})) != before


def test_the_online_rule_without_gain_or_descent_confidence_keeps_its_config_key():
    # fedfrozen_adaptive runs of the rule before z_g (gain confidence 0) and z_d (no descent test)
    # keep the key they had before the settings existed; any other z_g or z_d is another run
    cfg = config().with_updates({"federated.strategy": "fedfrozen_adaptive",
                                 "federated.adaptive_gain_confidence": 0.0})
    cfg = dataclasses.replace(cfg, federated=dataclasses.replace(cfg.federated, adaptive_descent_confidence=None))
    data = cfg.to_dict()
    del data["model"]["engine"]
    del data["federated"]["adaptive_gain_confidence"]
    del data["federated"]["adaptive_descent_confidence"]
    before = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert config_hash(cfg) == before
    assert config_hash(cfg.with_updates({"federated.adaptive_gain_confidence": 3.0})) != before
    assert config_hash(cfg.with_updates({"federated.adaptive_descent_confidence": 3.0})) != before
    # round 2's rule (z_g = 3, no descent test) keeps its key too
    round2 = dataclasses.replace(cfg, federated=dataclasses.replace(cfg.federated, adaptive_gain_confidence=3.0))
    data = round2.to_dict()
    del data["model"]["engine"]
    del data["federated"]["adaptive_descent_confidence"]
    assert config_hash(round2) == hashlib.sha256(
        json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]



def test_the_rule_without_descent_test_is_inf_and_survives_toml_and_the_recorded_json(tmp_path):
    """``adaptive_descent_confidence = inf`` (no descent test) is what a TOML file can say, and it
    comes back unchanged from the recorded config (metadata.json writes it as a string); ``None``
    set in code is the same rule (it would otherwise be dropped as absent and come back as 8);
    ``nan`` and ``-inf`` are refused."""
    import tomllib

    from linattn_theory.core.io import write_json
    from linattn_theory.sim.config import load_config

    path = tmp_path / "run.toml"
    path.write_text('[federated]\nstrategy = "fedfrozen_adaptive"\nadaptive_descent_confidence = inf\n')
    cfg = load_config(path)
    assert cfg.federated.adaptive_descent_confidence == np.inf
    write_json(tmp_path / "metadata.json", {"config": cfg.to_dict()})
    again = config_from_dict(json.loads((tmp_path / "metadata.json").read_text())["config"])
    assert again == cfg and config_hash(again) == config_hash(cfg)
    in_code = dataclasses.replace(cfg, federated=dataclasses.replace(cfg.federated, adaptive_descent_confidence=None))
    assert in_code == cfg and config_from_dict(in_code.to_dict()) == cfg
    assert config_hash(cfg) != config_hash(cfg.with_updates({"federated.adaptive_descent_confidence": 8.0}))
    for bad in ("nan", "-inf"):
        with pytest.raises(ConfigError, match="adaptive_descent_confidence"):
            config_from_dict({"federated": {"adaptive_descent_confidence": tomllib.loads(f"x = {bad}")["x"]}})

def test_local_steps_compute_no_loss():
    cfg = config()
    data, theta0 = prepare_run(cfg)
    full = loss_and_grad_from_moments(theta0, data.S, data.q, data.y, data.sample_weight)
    loss, grads = loss_and_grad_from_moments(theta0, data.S, data.q, data.y, data.sample_weight,
                                             with_loss=False)
    assert loss is None and full[0] is not None
    for b in ("WQ", "WK", "WV"):
        assert np.array_equal(getattr(grads, b), getattr(full[1], b))


def test_importing_the_package_imports_no_heavy_library():
    code = ("import sys, linattn_theory; "
            "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib', 'numba', 'seaborn', 'sympy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    import linattn_theory
    from linattn_theory.sim.warmup_grid import warmup_sweep
    assert linattn_theory.warmup_sweep is warmup_sweep          # the function, not its module
    assert linattn_theory.simulate is simulate


def test_centralized_optimum_is_stored_with_the_sweep_and_reused(tmp_path):
    from linattn_theory import load_results, load_sweep, run_sweep
    from linattn_theory.report import sweep_analysis

    path = tmp_path / "sweep.toml"
    path.write_text("seed = 0\n[task]\nnum_clients = 3\nsamples_per_client = 16\ntokens = 4\ndim = 3\n"
                    "rank = 2\noutputs = 1\n[model]\nrank = 2\n[federated]\nrounds = 4\nlocal_steps = 2\n"
                    "learning_rate = 0.02\n[grid]\n\"federated.warmup_rounds\" = [0, 2, 4]\n")
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out)
    results = load_results(out)
    sweep_analysis._MEMO.clear()
    first = sweep_analysis.excess_risk_table(out, results)
    stored = list((out / "_optimum").glob("*.json"))
    assert len(stored) == 1                                     # one instance
    record = json.loads(stored[0].read_text())
    assert record["objective"] == first["optimum"].iloc[0]
    # Φ* lower-bounds the loss of every model (docs/theory.md §4), in particular every run's
    _, runs = next(sweep_analysis.runs_by_instance(out, results))
    assert record["objective"] <= min(float(run.table["loss_regularized"].iloc[-1])
                                      for _, run in runs.values())
    # each run's decomposition is decompose_excess_risk's on the instance's own clients, and its
    # parts add up to the simulator's excess risk (docs/theory.md §6)
    from linattn_theory.sim.engine import clients_from_config
    from linattn_theory.theory.decomposition import decompose_excess_risk
    rows = first.set_index("run_id")
    for rid, (config, run) in runs.items():
        direct = decompose_excess_risk(run, clients_from_config(config), optimum=record["objective"])
        for part in ("excess_risk", "bias", "drift_floor", "unfinished"):
            assert rows.loc[rid, part] == pytest.approx(direct[part], rel=1e-12, abs=1e-15)
        assert abs(rows.loc[rid, "identity_residual"]) <= 1e-10 * rows.loc[rid, "excess_risk"]
    # a later analysis (a fresh process: no memo) reads it instead of solving again
    record["objective"] = first["optimum"].iloc[0] * 0.5
    stored[0].write_text(json.dumps(record))
    sweep_analysis._MEMO.clear()
    again = sweep_analysis.excess_risk_table(out, results)
    assert np.allclose(again["optimum"], first["optimum"] * 0.5)
    assert np.allclose(again["excess_risk"], first["excess_risk"] + first["optimum"] * 0.5)



def test_bounded_excess_risk_table_loads_each_instance_once_and_equals_two_passes(tmp_path, monkeypatch):
    """``excess_risk_table(bound=True)`` takes the decomposition and the bounds of an instance from one
    load of its runs: the same tables as the two passes (decomposition, then bounds with its optima),
    with half the instance loads."""
    from linattn_theory import load_results, load_sweep, run_sweep
    from linattn_theory.report import sweep_analysis

    path = tmp_path / "sweep.toml"
    path.write_text("seed = 0\n[task]\nnum_clients = 3\nsamples_per_client = 16\ntokens = 4\ndim = 3\n"
                    "rank = 2\noutputs = 1\nzeta_value = 2.0\n[model]\nrank = 2\n[federated]\nrounds = 6\n"
                    "local_steps = 3\nlearning_rate = 0.05\n[grid]\n\"federated.warmup_rounds\" = [0, 2, 4, 6]\n"
                    "seed = [0, 1]\n")
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out)
    results = load_results(out)
    loads = []
    real = sweep_analysis._load_instance
    monkeypatch.setattr(sweep_analysis, "_load_instance", lambda *a: loads.append(1) or real(*a))
    sweep_analysis._MEMO.clear()
    one_pass = sweep_analysis.excess_risk_table(out, results, bound=True)
    assert len(loads) == 2                                      # two instances, each loaded once
    sweep_analysis._MEMO.clear()
    sweep_analysis.excess_risk_table(out, results)              # the decomposition alone, memoised ...
    two_passes = sweep_analysis.excess_risk_table(out, results, bound=True)   # ... then the bounds
    assert len(loads) == 2 + 2 + 2
    assert one_pass["U"].notna().any() and one_pass["T0_theory"].notna().any()
    pd.testing.assert_frame_equal(one_pass, two_passes)

def test_kernel_calls_cover_every_item_once_on_threads_and_small_ones_run_on_this_thread():
    """``_run_chunks``: below ``PARALLEL_WORK`` multiply-adds one call on this thread does every item (after
    the first, run alone: it compiles the kernel); at or above it the items are split into pieces that two
    threads claim, this one among them, each item once (a helper's wake-up costs more than it saves on
    small calls)."""
    import threading
    import time

    calls, both = [], threading.Event()

    def record(x, lo, hi):
        calls.append((lo, hi, threading.get_ident()))
        if x[0]:                           # threaded: a piece waits (at most 10 s) until a second thread has
            if len({thread for _, _, thread in calls}) == 2:      # claimed one, however slow its wake-up
                both.set()
            if not both.wait(timeout=10):
                both.set()                 # no second thread came: the last assertion fails, once

    record.__name__ = f"record_{os.getpid()}_{time.monotonic_ns()}"   # a new kernel: its first call runs alone
    x, me = np.zeros(1), threading.get_ident()
    try:
        fused_module.set_threads(2)
        fused_module._run_chunks(record, 9, (x,), (), fused_module.PARALLEL_WORK - 1)
        assert calls == [(0, 1, me), (1, 9, me)]
        calls.clear()
        x[0] = 1
        fused_module._run_chunks(record, 9, (x,), (), fused_module.PARALLEL_WORK)
    finally:
        fused_module.set_threads(None)
    pieces = sorted((lo, hi) for lo, hi, _ in calls)              # compiled by now: from item 0, 4 pieces per thread
    assert len(pieces) == 8 and pieces[0][0] == 0 and pieces[-1][1] == 9
    assert all(hi > lo and hi == next_lo for (lo, hi), (next_lo, _) in zip(pieces, pieces[1:]))
    assert len({thread for _, _, thread in calls}) == 2 and me in {thread for _, _, thread in calls}


@needs_numba
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_kernel_calls_weigh_the_multiply_adds_of_their_steps_and_losses(attention, monkeypatch):
    """The work each kernel call hands ``_run_chunks`` (against ``PARALLEL_WORK``): a sample's forward
    pass ``H (2d² + dp)`` (softmax ``H (d² + 2nd + dp)``), twice per local step of every participant, once
    per client loss, over the padded ``N`` samples (a step count, head or participant left out fails)."""
    cfg = config(**{"model.engine": "fused", "federated.strategy": "fedavg", "federated.participation": 1.0},
                 **(SOFTMAX if attention == "softmax" else {}))
    data = prepare_run(cfg)[0]
    m, N, d = np.asarray(data.S).shape[-4:-1]
    H, p, E, n = cfg.model.heads, cfg.task.outputs, cfg.federated.local_steps, cfg.task.tokens
    forward = H * ((2 * d * d if attention == "linear" else d * d + 2 * n * d) + d * p)
    seen = []
    run_chunks = fused_module._run_chunks
    monkeypatch.setattr(fused_module, "_run_chunks",
                        lambda kernel, count, head, tail, work=float("inf"): (seen.append((kernel.__name__, count, work)),
                                                                            run_chunks(kernel, count, head, tail, work)))
    simulate(cfg)
    steps = {(c, w) for name, c, w in seen if "local_steps" in name}
    losses = {(c, w) for name, c, w in seen if "losses" in name}
    assert steps == {(m, 2 * m * E * N * forward)} and losses == {(m, m * N * forward)}, (seen[:4], m, N)


def test_thread_count_settings(monkeypatch):
    monkeypatch.delenv("LINATTN_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert fused_module.default_threads() == 3
    monkeypatch.setenv("LINATTN_THREADS", "5")
    assert fused_module.default_threads() == 5
    try:
        fused_module.set_threads(2)
        assert fused_module.default_threads() == 2
    finally:
        fused_module.set_threads(None)
    with pytest.raises(ValueError, match="threads"):
        fused_module.set_threads(0)


@needs_numba
@pytest.mark.slow          # compiles the kernels for d = 3 (8-14 s on the two-core machine)
@pytest.mark.parametrize("d, heads", [(3, 2), (8, 1)])
def test_unrolled_context_products_are_the_row_loops_bit_for_bit(d, heads):
    """Up to ``MAX_UNROLLED_DIM`` the kernels keep each sample's ``d`` partial sums of ``K_h^T q``
    and ``Ŝ v`` in registers (``dim = dimension(d)``); the row loops (``dim = ()``, every larger
    ``d``) add the same terms in the same order through memory: equal bit for bit, for the local
    steps (every block trained, several work items of two instances) and the client losses. An
    odd ``d`` takes the unpaired last row."""
    from linattn_theory.core import _fused_kernels as kernels

    assert 0 < d <= kernels.MAX_UNROLLED_DIM and kernels.dimension(d) == (0,) * d
    assert kernels.dimension(kernels.MAX_UNROLLED_DIM + 1) == ()
    rng = np.random.default_rng(d)
    I, m, N, r, p = 2, 3, 37, 2, 2
    X = rng.normal(size=(I, m, N, 5, d))
    S = np.einsum("...ta,...tb->...ab", X, X) / 5
    St, qt, yt = kernels.samples_last(S, rng.normal(size=(I, m, N, d)), rng.normal(size=(I, m, N, p)))
    w = rng.uniform(size=(I, m, N)) / N
    WQ, WK = rng.normal(size=(2, I, heads, d, r)) * 0.5
    WV = rng.normal(size=(I, heads, d, p)) * 0.5
    inst, part = np.repeat(np.arange(I), m), np.tile(np.arange(m), I)
    eta, lam = np.array([0.3, 0.2]), np.array([1e-3, 0.0])

    def train(dim):
        outs = [np.empty((I * m,) + a.shape[1:]) for a in (WQ, WK, WV)]
        kernels.local_steps(St, qt, yt, w, inst, np.arange(I), part, 0, I * m, WQ, WK, WV, True, True, True, 4, eta, lam,
                            *outs, dim)
        return outs

    def losses(dim):
        out = np.empty(I * m)
        kernels.client_losses(St, qt, yt, w, inst, np.arange(I), part, 0, I * m, WQ, WK, WV, out, dim)
        return out

    unrolled, rows = train(kernels.dimension(d)), train(())
    assert all(np.array_equal(a, b) for a, b in zip(unrolled, rows))
    assert not np.array_equal(unrolled[0], np.repeat(WQ, m, axis=0))            # the steps moved W_Q
    assert np.array_equal(losses(kernels.dimension(d)), losses(()))


def _tiled_problem(d, heads, N=37, p=3, I=2, m=3, r=2, seed=0):
    """Random data of ``I`` instances of ``m`` clients, ``N`` samples (not a multiple of the tile:
    the last tile has a tail), ``p`` outputs, and their parameters."""
    rng = np.random.default_rng(seed + d)
    X = rng.normal(size=(I, m, N, 5, d))
    S = np.einsum("...ta,...tb->...ab", X, X) / 5
    q, y = rng.normal(size=(I, m, N, d)), rng.normal(size=(I, m, N, p))
    w = rng.uniform(size=(I, m, N)) / N
    WQ, WK = rng.normal(size=(2, I, heads, d, r)) * 0.5
    WV = rng.normal(size=(I, heads, d, p)) * 0.5
    return S, q, y, w, WQ, WK, WV


@needs_numba
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_tiled_kernels_skip_a_clients_padding_bit_for_bit(attention):
    """Clients of 37, 9 and 20 samples stacked to ``N = 37`` (the rest weight 0 and zero data, as
    ``stack_clients`` pads them): each client's kernels visit ``⌈N_c / TILE⌉`` tiles (``tiles_used``),
    with results bit for bit those of visiting every tile and those of the client stacked alone
    without padding; a count one tile short changes them (its last samples matter)."""
    from linattn_theory.core import _fused_kernels as kernels

    d, heads, p, n, tau = (12, 2, 5, 5, 1.0) if attention == "linear" else (5, 2, 3, 5, 0.7)
    S, q, y, w, WQ, WK, WV = _tiled_problem(d, heads, p=p, I=1)
    X = np.random.default_rng(3).normal(size=S.shape[:3] + (n, d))
    sizes = [37, 9, 20]
    for c, size in enumerate(sizes):
        for a in (S, q, y, w, X):
            a[0, c, size:] = 0.0
    m = len(sizes)
    if attention == "linear":
        layout, steps_kernel, loss_kernel, trailing = (kernels.tiles, kernels.tiled_local_steps,
                                                       kernels.tiled_client_losses, ((0,) * d,))
        inputs = S
    else:
        layout, steps_kernel, loss_kernel, trailing = (kernels.softmax_tiles, kernels.softmax_local_steps,
                                                       kernels.softmax_client_losses, (tau, (0,) * d, (0,) * n))
        inputs = X
    eta, lam = np.array([0.2]), np.array([1e-3])

    def run(data, clients):
        count = len(clients)
        inst = np.zeros(count, np.int64)
        outs = [np.empty((count,) + a.shape[1:]) for a in (WQ, WK, WV)]
        steps_kernel(*data, inst, np.arange(1), clients, 0, count, WQ, WK, WV, True, True, True, 3, eta, lam, *outs, *trailing)
        losses = np.empty(count)
        loss_kernel(*data, inst, np.arange(1), clients, 0, count, WQ, WK, WV, losses, *trailing)
        return outs + [losses]

    data = layout(inputs, q, y, w)
    assert data[4].tolist() == [[3, 1, 2]]
    every = data[:4] + (np.full_like(data[4], 3),) + data[5:]
    clients = np.arange(m, dtype=np.int64)
    ours, full = run(data, clients), run(every, clients)
    for a, b in zip(ours, full):
        assert np.array_equal(a, b)
    for c, size in enumerate(sizes):
        alone = layout(*(a[:, c:c + 1, :size] for a in (inputs, q, y, w)))
        for a, b in zip(run(alone, np.zeros(1, np.int64)), ours):
            assert np.array_equal(a[0], b[c]), c
    short = data[:4] + (data[4] - np.array([[1, 0, 0]]),) + data[5:]              # client 0 one tile short
    assert not np.array_equal(run(short, clients)[2][0], ours[2][0])


@needs_numba
def test_frozen_maps_are_the_explicit_frozen_steps():
    """A frozen stage's ``E`` local steps in moment space (``value_moment_sums``, then
    ``FusedEngine.frozen_maps`` and ``train(..., maps)``: ``V ↦ M_c V + b_c``) equal ``E`` explicit steps
    ``V ← V − η (Σ_i w_i φ_i (V^T φ_i − y_i) + λ V)`` on the samples (NumPy), per instance (its own ``η``,
    ``λ`` and server ``V``) and participant, to 1e-13 relative."""
    from linattn_theory.core import _fused_kernels as kernels
    from linattn_theory.core.model import Params

    rng = np.random.default_rng(7)
    I, m, N, H, d, p, E = 2, 3, 29, 2, 3, 4, 5
    Hd = H * d
    phi, y = rng.normal(size=(I, m, N, Hd)), rng.normal(size=(I, m, N, p))
    w = rng.uniform(size=(I, m, N)) / N
    WV = rng.normal(size=(I, H, d, p))
    V0 = WV.reshape(I, Hd, p)
    eta, lam = np.array([0.3, 0.1]), np.array([0.05, 0.0])
    phit, yt = (np.ascontiguousarray(np.swapaxes(a, -1, -2)) for a in (phi, y))
    inst, clients = np.repeat(np.arange(I), m), np.tile(np.arange(m), I)
    A, B = np.empty((I * m, Hd, Hd)), np.empty((I * m, Hd, p))
    kernels.value_moment_sums(phit, yt, w, inst, clients, 0, I * m, A, B)
    engine = fused_module.FusedEngine(prepare_run(config_from_dict({}))[0])
    maps = engine.frozen_maps((A.reshape(I, m, Hd, Hd), B.reshape(I, m, Hd, p)), E, eta, lam)
    part = np.array([[2, 0], [1, 2]])
    zeros = np.zeros((I, H, d, 1))
    out = engine.train(Params(zeros, zeros, WV), ("WV",), part, E, eta, lam, maps)["WV"]
    assert out.shape == (I, 2, H, d, p)
    for s in range(I):
        for j, c in enumerate(part[s]):
            V = V0[s].copy()
            for _ in range(E):
                grad = phi[s, c].T @ (w[s, c][:, None] * (phi[s, c] @ V - y[s, c]))
                V = V - eta[s] * (grad + lam[s] * V)
            assert relative(out[s, j].reshape(Hd, p), V) <= 1e-13, (s, j)
            assert relative(out[s, j].reshape(Hd, p), V0[s]) > 1e-2          # the steps moved V


@needs_numba
@pytest.mark.parametrize("rows, terms", [(16, 10), (6, 7), (3, 2), (4, 4)])
def test_tile_mix_is_the_one_term_at_a_time_sum_bit_for_bit(rows, terms):
    """``_tile_mix`` (``u = W_V^h e_w`` of a tile: four rows and four terms at a time, the partial sums in
    registers) adds the terms in their order, so it equals the row loops that add one term at a time
    (multiply-adds fused, as the kernels compile them) bit for bit — with rows and terms left over by the
    blocks of four — and NumPy's product to rounding."""
    from numba import njit

    from linattn_theory.core import _fused_kernels as kernels

    L = kernels.TILE

    @njit(fastmath={"contract"})
    def one_term_at_a_time(coef, src, so, out):
        for a in range(coef.shape[0]):
            for i in range(L):
                out[a * L + i] = 0.0
            for t in range(coef.shape[1]):
                for i in range(L):
                    out[a * L + i] += coef[a, t] * src[so + t * L + i]

    rng = np.random.default_rng(rows * terms)
    coef, src = rng.normal(size=(rows, terms)), rng.normal(size=(3 * terms * L))
    so = terms * L                                                 # the second of three tiles
    ours, reference = np.empty(rows * L), np.empty(rows * L)
    kernels._tile_mix(coef, src, so, ours, 0.0)
    one_term_at_a_time(coef, src, so, reference)
    assert np.array_equal(ours, reference)
    expected = (coef @ src[so:so + terms * L].reshape(terms, L)).reshape(-1)
    assert relative(ours, expected) <= 1e-14


@needs_numba
@pytest.mark.slow          # compiles the product unrolled for four d (3-6 s each)
@pytest.mark.parametrize("d", [9, 12, 13, 16])
def test_context_product_from_the_upper_triangle_is_the_whole_context_s_bit_for_bit(d):
    """Where every ``Ŝ`` is symmetric (``X^T X / n``), ``tiles`` keeps its upper triangle (``d (d + 1) / 2``
    elements per sample) and ``_tile_symmetric`` (each element loaded once for two multiply-adds, the code
    unrolled per ``d``) gives the numbers of ``_tile_context`` on the whole ``Ŝ``, bit for bit, writing
    nothing outside its output; its pure-Python reference and NumPy agree to rounding. An ``Ŝ`` that
    is not symmetric to the last bit keeps the whole matrix."""
    from numba import njit

    from linattn_theory.core import _fused_kernels as kernels

    L, dim, D = kernels.TILE, (0,) * d, d * (d + 1) // 2
    rng = np.random.default_rng(d)
    X = rng.normal(size=(1, 1, 3 * L, 5, d))
    S = np.swapaxes(X, -1, -2) @ X / 5                                # three tiles of symmetric contexts
    q, y, w = X[..., 0, :], X[..., 0, :2], np.ones((1, 1, 3 * L))
    packed, whole = kernels.tiles(S, q, y, w), kernels.tiles(S + np.triu(np.full((d, d), 1e-9), 1), q, y, w)
    assert packed[-1] and not whole[-1]
    assert packed[0].shape == (1, 1, 3 * D * L) and whole[0].shape == (1, 1, 3 * d * d * L)
    Sb = np.ascontiguousarray(np.moveaxis(S[0, 0].reshape(3, L, d, d), 1, -1)).reshape(-1)   # the whole Ŝ, tiled

    @njit(fastmath=kernels.ORDERED)
    def compiled(Pb, po, vec, out, oo, dim):
        kernels._tile_symmetric(Pb, po, vec, out, oo, 0.0, dim)

    vec = rng.normal(size=d * L)
    oo = 7                                                              # the second tile, into an offset output
    ours, alone, reference = (np.full(oo + d * L + 5, np.nan) for _ in range(3))
    compiled(packed[0][0, 0], D * L, vec, ours, oo, dim)
    kernels._tile_context(Sb, d * d * L, vec, alone, oo, 0.0, dim)
    assert np.array_equal(ours, alone, equal_nan=True)
    assert np.isnan(ours[:oo]).all() and np.isnan(ours[oo + d * L:]).all()
    kernels._tile_symmetric(packed[0][0, 0], D * L, vec, reference, oo, 0.0, dim)     # pure Python
    expected = np.einsum("iba,ai->bi", S[0, 0, L:2 * L], vec.reshape(d, L)).reshape(-1)
    assert relative(reference[oo:oo + d * L], expected) <= 1e-14
    assert relative(ours[oo:oo + d * L], expected) <= 1e-14


@needs_numba
@pytest.mark.slow          # runs the tiled kernels for d = 12 and 16 (compiled by the test above them)
@pytest.mark.parametrize("d, heads, p", [(12, 2, 5), (16, 1, 3)])
def test_tiled_kernels_on_the_upper_triangle_are_those_on_the_whole_context_bit_for_bit(d, heads, p):
    """The tiled local steps and client losses read the upper triangle of a symmetric ``Ŝ`` (the layout
    ``tiles`` makes of ``X^T X / n``): the parameters and losses of the layout that holds the whole ``Ŝ``,
    bit for bit. An ``Ŝ`` off symmetry by one part in 10⁹ keeps the whole matrix and the row loops'
    numbers to rounding (the triangle alone would be another problem's)."""
    from linattn_theory.core import _fused_kernels as kernels

    S, q, y, w, WQ, WK, WV = _tiled_problem(d, heads, p=p)
    I, m, N = w.shape
    T = -(-N // kernels.TILE)
    packed = kernels.tiles(S, q, y, w)
    assert packed[-1]
    whole = (kernels._tiled_rows(S.reshape(I, m, N, d * d), d * d, T),) + packed[1:-1] + (False,)
    inst, part = np.repeat(np.arange(I), m), np.tile(np.arange(m), I)
    eta, lam = np.array([0.3, 0.2]), np.array([1e-3, 0.0])

    def run(steps, losses, data, dim):
        outs = [np.empty((I * m,) + a.shape[1:]) for a in (WQ, WK, WV)]
        steps(*data, inst, np.arange(I), part, 0, I * m, WQ, WK, WV, True, True, True, 3, eta, lam, *outs, dim)
        out = np.empty(I * m)
        losses(*data, inst, np.arange(I), part, 0, I * m, WQ, WK, WV, out, dim)
        return outs + [out]

    tiled = (kernels.tiled_local_steps, kernels.tiled_client_losses)
    for a, b in zip(run(*tiled, packed, (0,) * d), run(*tiled, whole, (0,) * d)):
        assert np.array_equal(a, b)
    off = S + np.triu(np.full((d, d), 1e-9), 1)
    layout = kernels.tiles(off, q, y, w)
    assert not layout[-1]
    rows = kernels.samples_last(off, q, y) + (w,)
    for a, b in zip(run(*tiled, layout, (0,) * d), run(kernels.local_steps, kernels.client_losses, rows, ())):
        assert relative(a, b) <= 1e-13


@needs_numba
@pytest.mark.parametrize("rows, columns, tiles", [(16, 10, 18), (6, 7, 2), (5, 3, 7), (1, 1, 3), (16, 16, 4)])
def test_tile_sums_outside_the_blocks_are_each_the_sum_alone_bit_for_bit(rows, columns, tiles):
    """``_tile_sums``' sums over the samples outside its 4 × 4 blocks (``Σ_i φ_h e_w^T`` with ``p = 10``: two
    columns) run four at a time as independent chains in one loop: each equals the sum of the loop they
    replaced, one sum after another (compiled with the kernels' flags), bit for bit; all equal NumPy's
    to rounding."""
    from numba import njit

    from linattn_theory.core import _fused_kernels as kernels

    L = kernels.TILE

    U = kernels._U

    @njit(fastmath=kernels.FAST)
    def one_at_a_time(left, ls, lo, right, rs, ro, T, out):      # the loop the chains replaced
        A, B = out.shape
        for a in range(A):
            for b in range(B):
                if a < A - A % 4 and b < B - B % 4:
                    continue
                s = 0.0
                for t in range(T):
                    lb = t * ls + lo + a * L
                    rb = t * rs + ro + b * L
                    for i in range(L):
                        s += left[U(lb + i)] * right[U(rb + i)]
                out[a, b] = s

    rng = np.random.default_rng(rows * columns + tiles)
    left, right = rng.normal(size=tiles * rows * L * 2), rng.normal(size=tiles * columns * L * 3)
    ls, lo, rs, ro = 2 * rows * L, rows * L, 3 * columns * L, columns * L      # each tile's second and third blocks
    out = np.empty((rows, columns))
    kernels._tile_sums(left, ls, lo, right, rs, ro, tiles, out, 0.0)
    reference = np.full((rows, columns), np.nan)
    one_at_a_time(left, ls, lo, right, rs, ro, tiles, reference)
    outside = ~np.isnan(reference)
    assert outside.sum() == rows * columns - (rows - rows % 4) * (columns - columns % 4)
    assert np.array_equal(out[outside], reference[outside])
    lt = left.reshape(tiles, 2, rows, L)[:, 1]
    rt = right.reshape(tiles, 3, columns, L)[:, 1]
    assert relative(out, np.einsum("tai,tbi->ab", lt, rt)) <= 1e-13


@needs_numba
@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_a_shared_query_is_computed_once_with_the_same_numbers(attention):
    """Where a client's samples of nonzero weight ask one query (``digits``' fixed ``1/√d``),
    ``shared_queries`` says so and the kernels compute ``k_h = K_h^T q`` once per step: bit for bit the
    per-sample path (the same layout with every flag off), for a client whose padding asks 0 and whose
    sample of weight 0 asks another query; a client with two queries keeps the per-sample path, and a
    flag set where the queries differ changes the results (the path is taken, and only where it holds)."""
    from linattn_theory.core import _fused_kernels as kernels

    d, heads, p, n, tau = (12, 2, 5, 5, 1.0) if attention == "linear" else (5, 2, 3, 5, 0.7)
    S, q, y, w, WQ, WK, WV = _tiled_problem(d, heads, p=p, I=1)
    X = np.random.default_rng(4).normal(size=S.shape[:3] + (n, d))
    q[0, :2] = np.random.default_rng(5).normal(size=d)          # clients 0 and 1 share a query, 2 does not
    for a in (S, X, q, y, w):                                    # client 0 padded after 30 samples
        a[0, 0, 30:] = 0.0
    w[0, 1, 7] = 0.0
    q[0, 1, 7] = 9.0                                             # a sample of weight 0 asks another query
    if attention == "linear":
        layout, steps_kernel, loss_kernel, trailing = (kernels.tiles(S, q, y, w), kernels.tiled_local_steps,
                                                       kernels.tiled_client_losses, ((0,) * d,))
    else:
        layout, steps_kernel, loss_kernel, trailing = (kernels.softmax_tiles(X, q, y, w), kernels.softmax_local_steps,
                                                       kernels.softmax_client_losses, (tau, (0,) * d, (0,) * n))
    q0, shared = layout[5:7]
    assert shared.tolist() == [[True, True, False]]
    assert np.array_equal(q0[0, :2], q[0, :2, 0])
    m = 3
    clients, inst = np.arange(m, dtype=np.int64), np.zeros(m, np.int64)
    eta, lam = np.array([0.2]), np.array([1e-3])

    def run(flags):
        data = layout[:6] + (flags,) + layout[7:]
        outs = [np.empty((m,) + a.shape[1:]) for a in (WQ, WK, WV)]
        steps_kernel(*data, inst, np.arange(1), clients, 0, m, WQ, WK, WV, True, True, True, 3, eta, lam, *outs, *trailing)
        losses = np.empty(m)
        loss_kernel(*data, inst, np.arange(1), clients, 0, m, WQ, WK, WV, losses, *trailing)
        return outs + [losses]

    once, per_sample = run(shared), run(np.zeros_like(shared))
    for a, b in zip(once, per_sample):
        assert np.array_equal(a, b)
    assert not np.array_equal(once[0], np.repeat(WQ, m, axis=0))                  # the steps moved W_Q
    wrong = run(np.ones_like(shared))                                              # client 2 as if it shared q0
    assert np.array_equal(wrong[0][:2], once[0][:2]) and not np.array_equal(wrong[0][2], once[0][2])


@needs_numba
@pytest.mark.slow          # compiles the tiled kernels for d = 12 and 16 (10-20 s each the first time)
@pytest.mark.parametrize("d, heads, p", [(12, 2, 5), (16, 1, 3)])
def test_tiled_kernels_equal_the_row_loops_and_numpy(d, heads, p):
    """Above ``MAX_UNROLLED_DIM`` the kernels run on tiles of ``TILE`` samples with register-blocked
    products (``tiled_local_steps``, ``tiled_client_losses``): the same closed forms as the row
    loops (``local_steps`` with ``dim = ()``, samples last) in another order of summation, so equal
    to rounding; the product ``Ŝ v`` of every tile equals NumPy's ``einsum``; a last tile cut short
    (``N`` not a multiple of ``TILE``) must be padded, not dropped."""
    from linattn_theory.core import _fused_kernels as kernels

    assert kernels.tiled(d) and not kernels.tiled(kernels.MAX_UNROLLED_DIM)
    assert not kernels.tiled(kernels.MAX_TILED_DIM + 1)
    S, q, y, w, WQ, WK, WV = _tiled_problem(d, heads, p=p)      # p = 5: four outputs at a time, one left
    I, m, N = w.shape
    assert N % kernels.TILE != 0
    tiles = kernels.tiles(S, q, y, w)
    rows = kernels.samples_last(S, q, y) + (w,)
    inst, part = np.repeat(np.arange(I), m), np.tile(np.arange(m), I)
    eta, lam = np.array([0.3, 0.2]), np.array([1e-3, 0.0])

    def train(kernel, data, dim):
        outs = [np.empty((I * m,) + a.shape[1:]) for a in (WQ, WK, WV)]
        kernel(*data, inst, np.arange(I), part, 0, I * m, WQ, WK, WV, True, True, True, 4, eta, lam, *outs, dim)
        return outs

    def losses(kernel, data, dim):
        out = np.empty(I * m)
        kernel(*data, inst, np.arange(I), part, 0, I * m, WQ, WK, WV, out, dim)
        return out

    tiled_params = train(kernels.tiled_local_steps, tiles, (0,) * d)
    row_params = train(kernels.local_steps, rows, ())
    for a, b in zip(tiled_params, row_params):
        assert relative(a, b) <= 1e-13
    assert relative(tiled_params[0], np.repeat(WQ, m, axis=0)) > 1e-3          # the steps moved W_Q
    assert relative(losses(kernels.tiled_client_losses, tiles, (0,) * d),
                    losses(kernels.client_losses, rows, ())) <= 1e-13

    # one product Ŝ v per tile, against einsum (the last tile's padding gives exact zeros)
    T, L = -(-N // kernels.TILE), kernels.TILE
    St = tiles[0][0, 1]
    rng = np.random.default_rng(1)
    v = rng.normal(size=(T, d, L))
    out = np.empty(T * d * L)
    assert tiles[-1]                                                   # the upper triangles (Ŝ symmetric)
    for t in range(T):
        kernels._tile_contexts(St, True, t, v[t].reshape(1, -1), out, 0.0, (0,) * d)
    padded = np.zeros((T * L, d, d))
    padded[:N] = S[0, 1]
    expected = np.einsum("tiba,tai->tbi", padded.reshape(T, L, d, d), v)
    assert relative(out.reshape(T, d, L), expected) <= 1e-13
    assert np.all(out.reshape(T, d, L)[-1][:, N % L:] == 0)


@needs_numba
@pytest.mark.slow          # compiles the tiled kernels for d = 13
def test_tiled_fused_engine_equals_the_array_api_engine():
    # d = 13 (rows left over by the blocks of four): the fused engine on tiles (every block
    # trained, then the frozen stage) against the Array-API engine; 40 samples per client on
    # average, unequal sizes (padding within a client and a tail in the last tile)
    cfg = config(**{"task.dim": 13, "model.heads": 1, "federated.strategy": "fedfrozen",
                    "federated.learning_rate": 0.02})
    fused = simulate(cfg.with_updates({"model.engine": "fused"}))
    reference = simulate(cfg.with_updates({"model.engine": "array_api"}))
    assert fused.metadata["engine"] == "fused" and not reference.diverged
    assert compare(fused, reference) <= 1e-12


@pytest.mark.slow
def test_compiled_kernels_are_cached_outside_the_package(tmp_path):
    """numba's disk cache goes to the user's cache folder (here ``XDG_CACHE_HOME``), never next to the
    sources: a checkout stays clean and a wheel built from it ships no compiled code."""
    pytest.importorskip("numba")
    package = Path(fused_module.__file__).parent
    code = ("import numpy as np; from linattn_theory import config_from_dict, simulate; "
            "simulate(config_from_dict({'model': {'engine': 'fused'}, 'federated': {'rounds': 1, 'warmup_rounds': 1}}))")
    before = set(package.rglob("*.nb[ic]"))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(package.parents[1])}
    env.pop("NUMBA_CACHE_DIR", None)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    assert set(package.rglob("*.nb[ic]")) == before, "numba wrote its cache into the package"
    import numba
    folder = tmp_path / "linattn-theory" / "numba" / numba.__version__      # one folder per numba release
    assert list(folder.rglob("*.nbi")), "no kernel was cached in the cache folder of this numba release"
    assert {p.name for p in folder.parent.iterdir()} == {numba.__version__}


# --------------------------------------------------------------------------------------------
# softmax attention (docs/theory.md §9): the tiled softmax kernels
# --------------------------------------------------------------------------------------------
@needs_numba
def test_softmax_kernels_take_the_closed_form_steps_and_losses():
    """One instance's clients, ``N`` not a multiple of the tile, ``n = d = 5`` (a row left over by the blocks of four): the
    kernels' ``E = 2`` local steps equal two steps ``θ ← θ − η (∇F_c + λ W_V)`` of
    ``loss_and_grad_from_contexts`` (NumPy), blocks trained alone or together, and their losses
    equal its losses, also where the scores overflow ``exp``; a padded sample (the tail of the last
    tile) contributes nothing."""
    from linattn_theory.core import _fused_kernels as kernels
    from linattn_theory.core.model import Params, loss_and_grad_from_contexts

    rng = np.random.default_rng(5)
    m, N, n, d, p, H, r, tau = 3, 21, 5, 5, 3, 2, 2, 0.6
    assert N % kernels.TILE != 0
    X, q, y = rng.normal(size=(1, m, N, n, d)), rng.normal(size=(1, m, N, d)), rng.normal(size=(1, m, N, p))
    w = np.full((1, m, N), 1.0 / N)
    WQ, WK, WV = rng.normal(size=(1, H, d, r)), rng.normal(size=(1, H, d, r)), rng.normal(size=(1, H, d, p))
    data = kernels.softmax_tiles(X, q, y, w)
    inst, part = np.zeros(m, np.int64), np.arange(m)
    eta, lam, steps = np.array([0.05]), np.array([0.01]), 2
    trailing = (tau, (0,) * d, (0,) * n)
    for blocks in (("WQ", "WK", "WV"), ("WV",), ("WQ",)):
        outs = [np.empty((m,) + a.shape[1:]) for a in (WQ, WK, WV)]
        kernels.softmax_local_steps(*data, inst, np.arange(1), part, 0, m, WQ, WK, WV, "WQ" in blocks, "WK" in blocks,
                                    "WV" in blocks, steps, eta, lam, *outs, *trailing)
        for c in range(m):
            theta = Params(WQ[0], WK[0], WV[0])
            for _ in range(steps):
                _, g = loss_and_grad_from_contexts(theta, X[0, c], q[0, c], y[0, c], w[0, c], blocks,
                                                   attention="softmax", temperature=tau)
                theta = theta.replace(**{b: getattr(theta, b) - eta[0] * (getattr(g, b) + (lam[0] * theta.WV if b == "WV" else 0))
                                         for b in blocks})
            for b, out in zip(("WQ", "WK", "WV"), outs):
                assert relative(out[c], getattr(theta, b)) <= 1e-13, (blocks, b)
    losses = np.empty(m)
    kernels.softmax_client_losses(*data, inst, np.arange(1), np.arange(m), 0, m, WQ, WK, WV, losses, *trailing)
    expected = [float(loss_and_grad_from_contexts(Params(WQ[0], WK[0], WV[0]), X[0, c], q[0, c], y[0, c], w[0, c],
                                                  (), attention="softmax", temperature=tau)[0]) for c in range(m)]
    assert relative(losses, expected) <= 1e-13
    # scores of order 10⁴ (exp overflows): the largest score subtracted, the weights stay finite
    big = 300.0 * X
    kernels.softmax_client_losses(*kernels.softmax_tiles(big, q, y, w), inst, np.arange(1), np.arange(m), 0, m, WQ, WK, WV, losses,
                                  *trailing)
    expected = [float(loss_and_grad_from_contexts(Params(WQ[0], WK[0], WV[0]), big[0, c], q[0, c], y[0, c], w[0, c],
                                                  (), attention="softmax", temperature=tau)[0]) for c in range(m)]
    assert np.all(np.isfinite(expected)) and relative(losses, expected) <= 1e-13


@needs_numba
def test_fused_softmax_engine_detects_divergence_in_the_same_round():
    # a step far beyond the stable one: both engines report the divergence in the same round, at the
    # same objective (to rounding), and stop there
    cfg = config(**SOFTMAX, **{"federated.strategy": "fedavg", "federated.learning_rate": 40.0,
                               "federated.participation": 1.0})
    fused = simulate(cfg.with_updates({"model.engine": "fused"}))
    reference = simulate(cfg.with_updates({"model.engine": "array_api"}))
    assert reference.diverged and fused.diverged
    assert fused.divergence.round == reference.divergence.round
    assert fused.divergence.loss == pytest.approx(reference.divergence.loss, rel=1e-10)
    assert len(fused.table) == len(reference.table)
    # an infinite or NaN score (a kernel gone to inf) makes the loss NaN, as NumPy's softmax does,
    # instead of a finite number that divergence detection could miss
    from linattn_theory.core import _fused_kernels as kernels
    data, theta = prepare_run(cfg)
    layout = kernels.softmax_tiles(data.X[None], data.q[None], data.y[None], data.sample_weight[None])
    m, d, n = data.X.shape[0], data.X.shape[-1], data.X.shape[-2]
    for bad in (np.inf, np.nan):
        WQ = np.array(theta.WQ)[None].copy()
        WQ[0, 0, 0, 0] = bad
        out = np.empty(m)
        kernels.softmax_client_losses(*layout, np.zeros(m, np.int64), np.arange(1), np.arange(m), 0, m, WQ, np.array(theta.WK)[None],
                                      np.array(theta.WV)[None], out, 0.7, (0,) * d, (0,) * n)
        assert np.isnan(out).all(), bad


@needs_numba
@pytest.mark.parametrize("tokens, expected", [(8, "fused"), (17, "array_api")])     # n·d = 128, 272 at d = 16
def test_auto_runs_softmax_on_the_fused_engine_up_to_its_context_size(tokens, expected):
    """``engine="auto"`` takes the softmax kernels where a tile of contexts fits the L1 cache
    (``n·d ≤ MAX_SOFTMAX_CONTEXT``); beyond, where they were slower, the Array-API engine."""
    cfg = config_from_dict({"task": {"num_clients": 4, "samples_per_client": 64, "dim": 16, "tokens": tokens},
                            "model": {"attention": "softmax"}, "federated": {"rounds": 1, "warmup_rounds": 1}})
    assert 4 * 64 * 16 ** 2 >= fused_module.MIN_STEP_WORK
    assert (tokens * 16 <= fused_module.MAX_SOFTMAX_CONTEXT) == (expected == "fused")
    assert simulate(cfg).metadata["engine"] == expected
    from linattn_theory.sim.engine import select_engine
    from linattn_theory.sim.strategies import make_strategy
    data, _ = prepare_run(cfg)                                  # forcing it still takes the fused engine
    assert select_engine("fused", np, data, cfg.federated, make_strategy(cfg.federated, 1)) is not None


@needs_numba
@pytest.mark.parametrize("engine", ["fused", "array_api"])
@pytest.mark.parametrize("case", [{}, {"task.dim": 12}, SOFTMAX], ids=["rows", "tiled", "softmax"])
def test_members_that_share_their_clients_are_laid_out_once_with_the_same_numbers(case, engine, monkeypatch):
    """An ensemble's members that share their clients (one data object: a figure's warm-ups of one seed)
    share one row of the fused engine's layout (``FusedEngine(sources=…)``: each instance's row), and a
    frozen stage's features and losses take their clients alone: every table and parameter is bit for bit
    that of each member run alone on its own copy of the clients (frozen from round 0, from round 2, and
    never), and the fused layout holds the two seeds' clients, not six copies."""
    import copy

    from linattn_theory.sim.ensemble import Member, run_ensemble

    seeds, warmups, equal = (3, 4), (0, 2, 6), {"task.dirichlet_alpha": None}     # one ensemble: equal sizes
    prepared = {s: prepare_run(config(**case, **equal, seed=s)) for s in seeds}
    configs = [(s, config(**case, **equal, seed=s, **{"federated.warmup_rounds": T0})) for s in seeds for T0 in warmups]
    alone = [run_ensemble([Member(c, copy.deepcopy(prepared[s][0]), prepared[s][1])], engine=engine)[0]
             for s, c in configs]
    rows = []
    init = fused_module.FusedEngine.__init__

    def counted(self, data, *args, **kwargs):
        rows.append(data.S.shape[0])
        init(self, data, *args, **kwargs)

    monkeypatch.setattr(fused_module.FusedEngine, "__init__", counted)
    shared = run_ensemble([Member(c, prepared[s][0], prepared[s][1]) for s, c in configs], engine=engine)
    assert rows == ([len(seeds)] if engine == "fused" else [])
    for (a, _, _), (b, _, _) in zip(shared, alone):
        pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
        for block in ("WQ", "WK", "WV"):
            np.testing.assert_array_equal(getattr(a.params, block), getattr(b.params, block))
            np.testing.assert_array_equal(getattr(a.warmup_params, block), getattr(b.warmup_params, block))
    assert shared[0][0].table["loss"].iloc[-1] != shared[3][0].table["loss"].iloc[-1]     # two seeds' own clients
