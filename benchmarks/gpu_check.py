"""GPU check: the same code on CuPy and NumPy, compared on the same seeds and timed.

One short script for a machine with a CUDA GPU (a few minutes on an H200):

1. agreement: runs of several configs (full batch, minibatches with partial participation,
   the reference size, a warm-up sweep) on ``backend = "cupy"`` and ``"numpy"`` from the same
   seeds; the largest relative difference of their tables and parameters must be ≤ 1e-10
   (float64 on both, different summation orders);
2. speed: warm-up rounds at several sizes on both backends (client-steps per second), the
   GPU's device-to-device copy bandwidth and the ratio of the measured step time to the floor
   that bandwidth gives (``benchmarks/bench_round.py`` explains the floor);
3. a printed table. Exit status 1 if an agreement check fails, 0 otherwise; without CuPy or a
   GPU it prints why and exits 0.

Usage (repository root; the package needs ``array-api-compat`` importable)::

    python benchmarks/gpu_check.py [--quick]
    python -m pytest -q -m gpu tests/test_gpu.py

On a lent GPU machine whose image lacks ``array-api-compat`` (a pure-Python package), copy it
into the ignored folder ``.whl/`` here, carry that folder, and put it on ``PYTHONPATH`` there::

    mkdir -p .whl && cp -r "$(python -c 'import array_api_compat, os; print(os.path.dirname(array_api_compat.__file__))')" .whl/
    # on the GPU machine (carry .whl):
    PYTHONPATH=.:.whl python3 benchmarks/gpu_check.py && PYTHONPATH=.:.whl python3 -m pytest -q -m gpu tests/test_gpu.py
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _common import (LARGER, REFERENCE, Size, best_time, best_times, print_table, relative_difference,
                     size_config)

from linattn_theory import config_from_dict
from linattn_theory.core.backend import gpu_available, resolve_max_bytes
from linattn_theory.sim.engine import clients_from_config, prepare_run, run_schedule, simulate
from linattn_theory.sim.warmup_grid import warmup_sweep

TOLERANCE = 1e-10
BIG = (Size("16x data", clients=128, samples=1024, tokens=32, dim=16, rank=16, outputs=4),
       Size("d=r=64", clients=32, samples=256, tokens=128, dim=64, rank=64, outputs=8))


def run_difference(gpu, cpu) -> float:
    return max(relative_difference(gpu.table, cpu.table), relative_difference(gpu.params, cpu.params))


def agreement_cases():
    small = {"seed": 7, "task": {"num_clients": 6, "samples_per_client": 64, "dirichlet_alpha": 2.0},
             "model": {"heads": 2}}

    def small_config(backend, **fed):
        base = {"rounds": 10, "warmup_rounds": 4, "local_steps": 4, "learning_rate": 0.05, "ridge": 0.05}
        return config_from_dict({**small, "model": {**small["model"], "backend": backend},
                                 "federated": {**base, **fed}})

    yield "FedFrozen, full batch, H=2", lambda b: simulate(small_config(b))
    yield "minibatch 8, participation 0.5", lambda b: simulate(small_config(b, batch_size=8, participation=0.5))
    yield "reference size, FedFrozen T=6", lambda b: simulate(
        size_config(REFERENCE, rounds=6, backend=b, strategy="fedfrozen", warmup_rounds=3))

    yield "warm-up sweep, every T0", lambda b: warmup_sweep(small_config(b))


def check_agreement() -> bool:
    rows, ok = [], True
    for name, run in agreement_cases():
        gpu, cpu = run("cupy"), run("numpy")
        if isinstance(cpu, dict):
            diff = max(run_difference(gpu[T0], cpu[T0]) for T0 in cpu)
        else:
            diff = run_difference(gpu, cpu)
        passed = diff <= TOLERANCE
        ok &= passed
        rows.append([name, f"{diff:.1e}", "PASS" if passed else "FAIL"])
    print(f"Agreement, CuPy vs NumPy on the same seeds (float64, tolerance {TOLERANCE:g}):")
    print_table(["case", "max rel. difference", "result"], rows)
    return ok


def device_bandwidth(cp, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    src = cp.ones(nbytes // 8)
    dst = cp.empty_like(src)
    sync = cp.cuda.runtime.deviceSynchronize
    cp.copyto(dst, src)
    best, _ = best_time(lambda: cp.copyto(dst, src), 10, sync)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * (nbytes // 8) * 8 / best


def time_rounds(size: Size, backend: str, rounds: int, repeat: int, sync=None) -> float:
    config = size_config(size, rounds=rounds, backend=backend)
    clients = clients_from_config(config)
    data, theta0 = prepare_run(config, clients)
    fed = config.federated
    budget = resolve_max_bytes("auto", data, size.heads)   # as simulate: CPU chunks, one on the GPU
    run = lambda: run_schedule(theta0, data, fed, fed.rounds, max_bytes=budget)  # noqa: E731
    result = run()              # warm-up: kernels compiled, handles created
    assert not result.diverged, f"{size.name} diverged on {backend}"
    best, _ = best_time(run, repeat, sync)
    return best / rounds


def check_speed(cp, quick: bool) -> None:
    sync = cp.cuda.runtime.deviceSynchronize
    bandwidth = device_bandwidth(cp)
    print(f"\nGPU device-to-device copy bandwidth (read + written): {bandwidth / 1e12:.2f} TB/s")
    sizes = (REFERENCE,) if quick else (REFERENCE, *LARGER, *BIG)
    rows = []
    for size in sizes:
        cpu = time_rounds(size, "numpy", 2, 2)
        gpu = time_rounds(size, "cupy", 3, 3, sync)
        steps = size.clients * size.local_steps
        floor = size.step_bytes() / bandwidth
        rows.append([size.name, size.describe(), f"{cpu * 1e3:.1f}", f"{gpu * 1e3:.2f}",
                     f"{steps / cpu:,.0f}", f"{steps / gpu:,.0f}", f"{cpu / gpu:.1f}",
                     f"{gpu / size.local_steps / floor:.0f}"])
        cp.get_default_memory_pool().free_all_blocks()
    print("\nWarm-up rounds (all blocks train), float64:")
    print_table(["size", "shape", "NumPy ms/round", "CuPy ms/round", "NumPy client-steps/s",
                 "CuPy client-steps/s", "speed-up", "GPU step / floor"], rows)

    config = size_config(REFERENCE, rounds=20, backend="cupy")
    clients = clients_from_config(config)
    simulate(config, clients)
    (plain, _), (sweep, _) = best_times([lambda: simulate(config, clients),
                                         lambda: warmup_sweep(config, clients=clients)], 2, sync)
    print(f"\nReference size on CuPy, T = 20: one FedAvg run {plain:.2f} s, sweep over all 21 T0 "
          f"{sweep:.2f} s ({sweep / plain:.2f}×)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="agreement and the reference size only")
    args = parser.parse_args(argv)
    if not gpu_available():
        print("gpu_check: CuPy with a CUDA GPU is not available here; nothing to check. "
              "On a GPU machine: pip install 'linattn-theory[gpu]', then rerun.")
        return 0
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"GPU: {name}, {props['totalGlobalMem'] / 2**30:.0f} GiB; CuPy {cp.__version__}; "
          f"NumPy {np.__version__}\n")
    start = time.perf_counter()
    ok = check_agreement()
    check_speed(cp, args.quick)
    print(f"\ngpu_check: {'PASS' if ok else 'FAIL'} in {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
