"""The same code on a GPU: CuPy results equal NumPy's (float64, relative 1e-10), and the
ensemble engine's equal the one-at-a-time runs on the GPU (relative 1e-12).

Marked ``gpu`` and skipped unless CuPy imports and sees a CUDA device. On a GPU machine::

    python -m pytest -q -m gpu tests/test_gpu.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from linattn_theory import (Params, config_from_dict, loss_and_grad, simulate, simulate_many, stack_clients,
                            warmup_sweep_many)
from linattn_theory.core.arrays import to_numpy
from linattn_theory.core.backend import get_namespace, gpu_available
from linattn_theory.cli.commands import main
from linattn_theory.core.model import kernel
from linattn_theory.core.moments import value_moments
from linattn_theory.data.tasks import planted_kernel_clients
from linattn_theory.sim.warmup_grid import warmup_sweep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")]

RTOL = 1e-10   # float64 on both; cuBLAS and OpenBLAS sum in different orders


def _config(backend, **federated):
    fed = {"rounds": 6, "warmup_rounds": 3, "local_steps": 3, "learning_rate": 0.05, "ridge": 0.05}
    fed.update(federated)
    return config_from_dict({"seed": 7, "task": {"num_clients": 5, "samples_per_client": 40,
                                                  "dirichlet_alpha": 2.0},
                             "model": {"heads": 2, "backend": backend}, "federated": fed})


def _assert_tables_close(a, b, rtol=RTOL):
    """Equal labels (the ``stage`` and ``strategy`` columns), numbers equal to ``rtol``."""
    labels = [c for c in a.columns if not pd.api.types.is_numeric_dtype(a[c])]
    assert list(a.columns) == list(b.columns) and labels == ["stage", "strategy"]
    for c in labels:
        assert list(a[c]) == list(b[c])
    numeric = [c for c in a.columns if c not in labels]
    np.testing.assert_allclose(b[numeric].to_numpy(float), a[numeric].to_numpy(float),
                               rtol=rtol, atol=1e-14)


def _assert_runs_close(a, b, rtol=RTOL):
    _assert_tables_close(a.table, b.table, rtol)
    assert a.diverged == b.diverged
    for x, y in ((a.params, b.params), (a.warmup_params, b.warmup_params)):
        for block in ("WQ", "WK", "WV"):
            np.testing.assert_allclose(getattr(x, block), getattr(y, block), rtol=rtol, atol=1e-14)


def test_model_and_gradients_match_numpy():
    cp = get_namespace("cupy")
    clients = planted_kernel_clients(num_clients=2, samples_per_client=30, tokens=6, dim=5,
                                     heads=2, rank=2, outputs=3, seed=2)
    X, q, y = clients[0]
    params = Params.init(5, 3, 3, heads=2, seed=4)
    loss_g, grads_g = loss_and_grad(params.map(cp.asarray), *(cp.asarray(a) for a in (X, q, y)))
    loss_c, grads_c = loss_and_grad(params, X, q, y)
    np.testing.assert_allclose(float(to_numpy(loss_g)), float(loss_c), rtol=RTOL)
    for b in ("WQ", "WK", "WV"):
        assert type(getattr(grads_g, b)).__module__.startswith("cupy")
        np.testing.assert_allclose(to_numpy(getattr(grads_g, b)), getattr(grads_c, b), rtol=RTOL, atol=1e-14)
    K = kernel(params)
    mg = value_moments(cp.asarray(K), stack_clients(clients, xp=cp))
    mc = value_moments(K, stack_clients(clients))
    np.testing.assert_allclose(to_numpy(mg.A), mc.A, rtol=RTOL, atol=1e-14)


@pytest.mark.parametrize("federated", [{}, {"batch_size": 8, "participation": 0.6}],
                         ids=["full", "minibatch-partial"])
def test_simulate_matches_numpy(federated):
    gpu = simulate(_config("cupy", **federated))
    cpu = simulate(_config("numpy", **federated))
    assert not cpu.diverged
    _assert_tables_close(cpu.table, gpu.table)
    for b in ("WQ", "WK", "WV"):
        np.testing.assert_allclose(getattr(gpu.params, b), getattr(cpu.params, b), rtol=RTOL, atol=1e-14)


def test_warmup_sweep_matches_numpy():
    gpu = warmup_sweep(_config("cupy"))
    cpu = warmup_sweep(_config("numpy"))
    for T0 in cpu:
        _assert_tables_close(cpu[T0].table, gpu[T0].table)


def test_cli_backend_cupy(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("seed = 1\n[task]\nnum_clients = 3\nsamples_per_client = 16\n"
                   "[federated]\nrounds = 3\nwarmup_rounds = 1\n")
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "out"), "--quiet", "--backend", "cupy"]) == 0
    assert '"backend": "cupy"' in (tmp_path / "out" / "metadata.json").read_text()


def _ensemble_cases(backend):
    """Several strategies and per-instance settings, a shared warm-up and one divergent run."""
    runs = [_config(backend, warmup_rounds=T0) for T0 in (0, 3, 6)]
    runs += [_config(backend, strategy="fedavgm", server_momentum=0.5),
             _config(backend, strategy="scaffold", batch_size=8, participation=0.6),
             _config(backend, strategy="fedprox", learning_rate=0.03, ridge=0.0),
             _config(backend, learning_rate=4.0)]
    return [c.with_updates({"seed": 7 + i}) if i >= 3 else c for i, c in enumerate(runs)]


def test_simulate_many_on_the_gpu_equals_simulate():
    gpu = _ensemble_cases("cupy")
    many = simulate_many(gpu)
    assert many[-1].diverged and not any(r.diverged for r in many[:-1])
    for config, run, cpu_config in zip(gpu, many, _ensemble_cases("numpy")):
        assert run.metadata["engine"] == "array_api"
        _assert_runs_close(run, simulate(config), rtol=1e-12)     # cuBLAS batched vs one at a time
        _assert_runs_close(run, simulate(cpu_config.with_updates({"model.engine": "array_api"})))


def test_warmup_sweep_many_on_the_gpu_equals_numpy():
    configs = [_config("cupy").with_updates({"seed": s}) for s in (1, 2)]
    gpu = warmup_sweep_many(configs)
    cpu = warmup_sweep_many([c.with_updates({"model.backend": "numpy", "model.engine": "array_api"})
                             for c in configs])
    for a, b in zip(gpu, cpu):
        assert list(a) == list(b)
        for T0 in a:
            _assert_runs_close(a[T0], b[T0])


def test_cli_sweep_backend_cupy(tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text("seed = 1\n[task]\nnum_clients = 3\nsamples_per_client = 16\n"
                     "[federated]\nrounds = 3\nwarmup_rounds = 1\n[grid]\nseed = [1, 2]\n")
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--quiet", "--backend", "cupy"]) == 0
    stored = list((tmp_path / "out" / "runs").glob("*/metadata.json"))
    assert len(stored) == 2 and all('"backend": "cupy"' in p.read_text() for p in stored)
