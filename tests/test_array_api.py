"""One code path, several array libraries: the shared numeric path under ``array-api-strict``.

``array-api-strict`` implements the Array API standard and nothing else, so running the model,
its gradients and federated rounds on it proves that no NumPy-only call slipped into the shared
path; it wraps NumPy, so the results must equal the NumPy run exactly. Also: backend selection,
``--backend`` on the command line, and client chunking under a memory budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from linattn_theory import Params, loss_and_grad, predict, stack_clients
from linattn_theory.core.arrays import to_numpy
from linattn_theory.core.backend import CPU_CHUNK_BYTES, BackendUnavailableError, client_chunks, client_working_bytes, get_namespace, gpu_available, resolve_max_bytes
from linattn_theory.cli.commands import main
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import FederatedConfig, config_from_dict
from linattn_theory.sim.engine import clients_from_config, run_schedule, simulate
from linattn_theory.core.model import kernel, kernel_gradient_from_moments, loss_and_grad_from_moments
from linattn_theory.core.moments import value_moments, value_objective
from linattn_theory.data.tasks import planted_kernel_clients

xs = pytest.importorskip("array_api_strict")


def _is_strict(a) -> bool:
    return type(a).__module__.startswith("array_api_strict")


def _strict(params: Params) -> Params:
    return params.map(xs.asarray)


@pytest.fixture(scope="module")
def clients():
    # skewed sizes (padding with weight 0), H = 2 heads, r != d, p > 1
    return planted_kernel_clients(num_clients=4, samples_per_client=24, tokens=6, dim=5, heads=2,
                                  rank=2, outputs=3, dirichlet_alpha=1.0, seed=11)


@pytest.fixture(scope="module")
def params():
    return Params.init(5, 3, 3, heads=2, scale=0.8, seed=5)


def test_get_namespace_names():
    assert get_namespace("numpy").__name__ == "array_api_compat.numpy"
    assert get_namespace("array_api_strict") is xs
    with pytest.raises(ConfigError, match=r"backend = 'torch'.*'numpy'"):
        get_namespace("torch")


@pytest.mark.skipif(gpu_available(), reason="CuPy and a GPU are present")
def test_cupy_missing_names_the_gpu_extra():
    with pytest.raises(BackendUnavailableError, match=r"linattn-theory\[gpu\]|no usable CUDA|no CUDA"):
        get_namespace("cupy")


def test_to_numpy_on_strict_arrays():
    a = xs.reshape(xs.arange(6, dtype=xs.float64), (2, 3))
    host = to_numpy(a)
    assert isinstance(host, np.ndarray)
    np.testing.assert_array_equal(host, np.arange(6.0).reshape(2, 3))
    assert float(to_numpy(xs.sum(a))) == 15.0


def test_model_and_gradients_equal_numpy(clients, params):
    X, q, y = clients[0]
    Xs, qs, ys = (xs.asarray(a) for a in (X, q, y))
    ps = _strict(params)

    out = predict(ps, Xs, qs)
    assert _is_strict(out)
    np.testing.assert_array_equal(to_numpy(out), predict(params, X, q))

    loss_s, grads_s = loss_and_grad(ps, Xs, qs, ys)
    loss_n, grads_n = loss_and_grad(params, X, q, y)
    assert _is_strict(loss_s) and all(_is_strict(getattr(grads_s, b)) for b in ("WQ", "WK", "WV"))
    assert float(to_numpy(loss_s)) == float(loss_n)
    for b in ("WQ", "WK", "WV"):
        np.testing.assert_array_equal(to_numpy(getattr(grads_s, b)), getattr(grads_n, b))

    # the batched hot path with a client axis, sample weights and the kernel gradient
    dn, ds = stack_clients(clients), stack_clients(clients, xp=xs)
    many = params.map(lambda a: np.stack([a, 1.1 * a, 0.9 * a, -a]))
    loss_s, grads_s = loss_and_grad_from_moments(_strict(many), ds.S, ds.q, ds.y, ds.sample_weight)
    loss_n, grads_n = loss_and_grad_from_moments(many, dn.S, dn.q, dn.y, dn.sample_weight)
    np.testing.assert_array_equal(to_numpy(loss_s), loss_n)
    for b in ("WQ", "WK", "WV"):
        np.testing.assert_array_equal(to_numpy(getattr(grads_s, b)), getattr(grads_n, b))
    gK_s = kernel_gradient_from_moments(_strict(many), ds.S, ds.q, ds.y, ds.sample_weight)
    np.testing.assert_array_equal(to_numpy(gK_s),
                                  kernel_gradient_from_moments(many, dn.S, dn.q, dn.y, dn.sample_weight))


def test_value_moments_equal_numpy(clients, params):
    K = kernel(params)
    mn = value_moments(K, stack_clients(clients))
    ms = value_moments(xs.asarray(K), stack_clients(clients, xp=xs))
    for name in ("A", "B", "y2"):
        assert _is_strict(getattr(ms, name))
        np.testing.assert_array_equal(to_numpy(getattr(ms, name)), getattr(mn, name))
    V = np.reshape(params.WV, (-1, params.WV.shape[-1]))
    np.testing.assert_array_equal(to_numpy(value_objective(xs.asarray(V), ms, 0.3)),
                                  value_objective(V, mn, 0.3))


@pytest.mark.parametrize("fed", [
    FederatedConfig(rounds=4, warmup_rounds=2, local_steps=2, learning_rate=0.01),
    FederatedConfig(rounds=4, warmup_rounds=1, local_steps=2, learning_rate=0.01, batch_size=5,
                    participation=0.6, ridge=0.1, server_learning_rate=0.7),
], ids=["full-batch", "minibatch-partial"])
def test_federated_rounds_equal_numpy(clients, params, fed):
    seen = []

    def record(state):
        seen.append(all(_is_strict(getattr(state.params, b)) for b in ("WQ", "WK", "WV")))

    strict = run_schedule(_strict(params), stack_clients(clients, xp=xs), fed, fed.warmup_rounds,
                          seed=3, on_round=record)
    plain = run_schedule(params, stack_clients(clients), fed, fed.warmup_rounds, seed=3)
    assert seen and all(seen), "the strict run left the array-api-strict namespace"
    assert not plain.diverged and len(seen) == fed.rounds + 1
    assert strict.table.equals(plain.table)
    for b in ("WQ", "WK", "WV"):
        np.testing.assert_array_equal(getattr(strict.params, b), getattr(plain.params, b))
        np.testing.assert_array_equal(getattr(strict.warmup_params, b), getattr(plain.warmup_params, b))


def test_client_chunks():
    small = stack_clients(planted_kernel_clients(num_clients=2, samples_per_client=8, seed=0))
    per_client = client_working_bytes(small, 1)
    big = dataclasses.replace(small, S=np.broadcast_to(small.S[:1], (1 + 2 * CPU_CHUNK_BYTES // per_client,)
                                                       + small.S.shape[1:]))
    assert resolve_max_bytes("auto", small, 1) is None                  # fits in cache: one chunk
    assert resolve_max_bytes("auto", big, 1) == CPU_CHUNK_BYTES        # does not: cache-sized chunks
    strict = stack_clients(planted_kernel_clients(num_clients=2, samples_per_client=8, seed=0), xp=xs)
    assert resolve_max_bytes("auto", strict, 1) is None and resolve_max_bytes(123, strict, 1) == 123
    with pytest.raises(ValueError, match="max_bytes = 'all'"):
        resolve_max_bytes("all", small, 1)
    assert client_chunks(5, 100, None) == [(0, 5)]
    assert client_chunks(5, 100, 250) == [(0, 2), (2, 4), (4, 5)]
    assert client_chunks(3, 100, 10) == [(0, 1), (1, 2), (2, 3)]   # at least one client per chunk
    with pytest.raises(ValueError, match="max_bytes"):
        client_chunks(3, 100, 0)


@pytest.mark.parametrize("federated", [
    {"rounds": 4, "warmup_rounds": 2, "local_steps": 2},
    {"rounds": 4, "warmup_rounds": 2, "local_steps": 2, "batch_size": 6, "participation": 0.7},
    # per-client state (control variates) indexed per chunk, with and without partial participation
    {"rounds": 4, "warmup_rounds": 4, "local_steps": 2, "strategy": "scaffold", "participation": 0.7},
    {"rounds": 4, "warmup_rounds": 1, "local_steps": 2, "strategy": "fedfrozen_scaffold",
     "batch_size": 6},
    {"rounds": 4, "warmup_rounds": 4, "local_steps": 2, "strategy": "fedprox", "participation": 0.7},
    {"rounds": 4, "warmup_rounds": 4, "local_steps": 2, "strategy": "fedadam", "server_learning_rate": 0.01},
], ids=["full", "minibatch-partial", "scaffold-partial", "fedfrozen_scaffold-minibatch",
        "fedprox-partial", "fedadam"])
def test_chunked_clients_give_identical_results(federated):
    config = config_from_dict({"seed": 2, "task": {"num_clients": 5, "samples_per_client": 30,
                                                    "dirichlet_alpha": 2.0},
                               "model": {"heads": 2}, "federated": federated})
    whole = simulate(config, max_bytes=None)
    per_client = client_working_bytes(stack_clients(clients_from_config(config)), 2,
                                      federated.get("batch_size"))
    for budget in (1, 2.5 * per_client):     # one client per chunk; two per chunk
        chunked = simulate(config, max_bytes=budget)
        assert chunked.table.equals(whole.table)
        for b in ("WQ", "WK", "WV"):
            np.testing.assert_array_equal(getattr(chunked.params, b), getattr(whole.params, b))


def test_cli_backend_option(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('seed = 1\n[task]\nnum_clients = 2\nsamples_per_client = 8\n'
                   '[model]\nbackend = "cupy"\n[federated]\nrounds = 2\nwarmup_rounds = 1\n')
    out = tmp_path / "out"
    # --backend overrides the config's cupy
    assert main(["simulate", str(cfg), "--out", str(out), "--quiet", "--backend", "numpy"]) == 0
    assert '"backend": "numpy"' in (out / "metadata.json").read_text()
    if not gpu_available():
        missing = tmp_path / "missing"
        assert main(["simulate", str(cfg), "--out", str(missing), "--quiet"]) == 2
        assert not missing.exists()


def test_simulate_reports_unavailable_backend_before_work():
    config = config_from_dict({"model": {"backend": "cupy"}})
    if gpu_available():
        pytest.skip("CuPy and a GPU are present")
    with pytest.raises(BackendUnavailableError):
        simulate(config)
