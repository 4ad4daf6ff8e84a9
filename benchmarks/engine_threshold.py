"""Where the fused engine pays: the measurement behind ``engine="auto"``'s one threshold
(:data:`linattn_theory.core.fused.MIN_STEP_WORK`, :func:`linattn_theory.sim.rounds.select_engine`).

In one process, for local steps of ``m·N·d² = 2¹²…2¹⁹`` multiply-adds, it times a run alone
(``run_schedule``) and an ensemble of 8 instances (``simulate_many``, time per instance) on the
Array-API and on the fused engine, alternated (min of ``--repeat``), and prints the ratio
Array-API ÷ fused (above 1: the fused engine is faster). First it prints the one-time cost of
importing numba and loading the cached kernels: the first fused run of the process minus a warm
one. On a shared machine only the ratios mean something (every variant sees the same load).

Usage (from the repository root)::

    python benchmarks/engine_threshold.py [--repeat 3] [--rounds 40]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import linattn_theory as lt
from linattn_theory.sim.engine import prepare_run, run_schedule

SIZES = [(4, 64, 4), (8, 128, 4), (8, 128, 6), (8, 128, 8), (16, 128, 8), (16, 256, 8), (32, 256, 8)]


def config(m, N, d, engine, rounds, seed=1):
    return lt.config_from_dict({"task": {"num_clients": m, "samples_per_client": N, "dim": d},
                                "model": {"engine": engine}, "seed": seed,
                                "federated": {"rounds": rounds, "warmup_rounds": rounds // 2}})


def alone(m, N, d, engine, rounds):
    c = config(m, N, d, engine, rounds)
    data, theta0 = prepare_run(c)
    start = time.perf_counter()
    run_schedule(theta0, data, c.federated, c.warmup_rounds, c.seed, engine=engine)
    return time.perf_counter() - start


def ensemble(m, N, d, engine, rounds, instances=8):
    configs = [config(m, N, d, engine, rounds, seed) for seed in range(instances)]
    start = time.perf_counter()
    lt.simulate_many(configs)
    return (time.perf_counter() - start) / instances


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    T = args.rounds
    alone(8, 128, 6, "array_api", T)
    first, warm = alone(8, 128, 6, "fused", T), alone(8, 128, 6, "fused", T)
    print(f"load (numba import + cached kernels): {first - warm:.3f} s "
          f"(first fused run {first:.3f} s, warm {warm:.3f} s)")
    for m, N, d in SIZES:
        best = {(kind, engine): min(run(m, N, d, engine, T) for _ in range(args.repeat))
                for kind, run in (("alone", alone), ("ensemble", ensemble)) for engine in ("array_api", "fused")}
        ratio = {kind: best[kind, "array_api"] / best[kind, "fused"] for kind in ("alone", "ensemble")}
        print(f"m·N·d² = 2^{np.log2(m * N * d * d):.2f} (m={m}, N={N}, d={d}): "
              f"alone {1e3 * best['alone', 'array_api']:.1f} / {1e3 * best['alone', 'fused']:.1f} ms "
              f"= {ratio['alone']:.2f}; ensemble per instance {1e3 * best['ensemble', 'array_api']:.1f} / "
              f"{1e3 * best['ensemble', 'fused']:.1f} ms = {ratio['ensemble']:.2f}")


if __name__ == "__main__":
    main()
