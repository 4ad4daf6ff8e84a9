"""Benchmark a softmax-attention round against the linear one (docs/theory.md §9).

At the reference size (m = 32 clients, N_c = 256 samples, n = 32 tokens, d = r = 16, p = 4,
E = 10 local steps) it prints, for linear and softmax attention, the time of one warm-up round
(every block trains), client-steps per second, the memory of the stacked data (softmax keeps
the contexts ``X`` as well as ``Ŝ``) and the softmax/linear time ratio. The goal is a ratio
of at most 3 (softmax reads ``X``, ``n·d`` numbers per sample, and forms ``H·n`` scores).

A second table times whole softmax runs (FedAvg, 40 rounds of ``E = 10``) on the fused engine's
softmax kernels (:func:`~linattn_theory.core._fused_kernels.softmax_local_steps`) and on the
Array-API engine, at sizes on both sides of the automatic choice's thresholds ``m·N·d² = 2¹⁴``
(:data:`~linattn_theory.core.fused.MIN_STEP_WORK`) and ``n·d = 256``
(:data:`~linattn_theory.core.fused.MAX_SOFTMAX_CONTEXT`) and at the digits figures' size (8 clients
of about 170 samples, ``n = 8``, ``d = 16``, two heads).

Usage (from the repository root; single-threaded BLAS for comparable numbers)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_softmax.py

Timings are the best of ``--repeat`` runs, interleaved so that both see the same load.
"""

from __future__ import annotations

import argparse

from _common import REFERENCE, best_times, print_table, size_config, thread_note

from linattn_theory.core import fused
from linattn_theory.core.backend import resolve_max_bytes
from linattn_theory.sim.config import config_from_dict
from linattn_theory.sim.engine import clients_from_config, prepare_run, run_schedule, simulate

#: (name, task) of the engine comparison: planted-kernel tasks around the threshold, then digits
ENGINE_SIZES = (("m·N·d² = 2¹², n·d = 32", {"num_clients": 4, "samples_per_client": 64, "dim": 4}),
                ("m·N·d² = 2¹⁴ (the threshold), n·d = 64", {"num_clients": 4, "samples_per_client": 64, "dim": 8}),
                ("m·N·d² = 2¹⁶, n·d = 64", {"num_clients": 8, "samples_per_client": 128, "dim": 8}),
                ("m·N·d² = 2¹⁸, n·d = 128", {"num_clients": 8, "samples_per_client": 128, "dim": 16}),
                ("n·d = 256 (MAX_SOFTMAX_CONTEXT)", {"num_clients": 8, "samples_per_client": 128, "dim": 16,
                                                     "tokens": 16}),
                ("n·d = 384", {"num_clients": 8, "samples_per_client": 128, "dim": 16, "tokens": 24}),
                ("n·d = 512 (n, d of the reference size)", {"num_clients": 8, "samples_per_client": 128, "dim": 16,
                                                            "tokens": 32}),
                ("digits (n = 8, d = 16, H = 2)", {"family": "digits", "num_clients": 8}))


def round_function(size, attention: str, clients):
    config = size_config(size).with_updates({"model.attention": attention})
    data, theta = prepare_run(config, clients)
    budget = resolve_max_bytes("auto", data, size.heads)
    stacked = sum(a.nbytes for a in (data.S, data.q, data.y, data.sample_weight)
                  if a is not None) + (0 if data.X is None else data.X.nbytes)

    def run():
        result = run_schedule(theta, data, config.federated, config.warmup_rounds, config.seed,
                              max_bytes=budget)
        assert not result.diverged
    return run, stacked


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (best is reported)")
    args = parser.parse_args(argv)
    size = REFERENCE
    clients = clients_from_config(size_config(size))
    functions = {a: round_function(size, a, clients) for a in ("linear", "softmax")}
    times = dict(zip(functions, best_times([f for f, _ in functions.values()], args.repeat)))
    print(f"one FedAvg round, {size.describe()} ({thread_note()})\n")
    rows = []
    for attention, (best, median) in times.items():
        steps = size.clients * size.local_steps / best
        rows.append([attention, f"{best * 1e3:.1f}", f"{median * 1e3:.1f}", f"{steps:,.0f}",
                     f"{functions[attention][1] / 2**20:.1f}"])
    print_table(["attention", "best ms", "median ms", "client-steps/s", "stacked data MiB"], rows)
    print(f"\nsoftmax / linear round time: {times['softmax'][0] / times['linear'][0]:.2f} (goal <= 3)")
    if fused.numba_available():
        engines(args.repeat)
    else:
        print("\nthe fused engine needs numba: its softmax comparison is skipped")


def engines(repeat: int) -> None:
    """The second table: whole softmax runs on the fused engine against the Array-API engine."""
    rows = []
    for name, task in ENGINE_SIZES:
        model = {"attention": "softmax"} | ({"heads": 2, "rank": 4} if task.get("family") == "digits" else {})
        base = config_from_dict({"task": task, "model": model, "federated": {
            "strategy": "fedavg", "rounds": 40, "local_steps": 10, "learning_rate": 0.05}})
        configs = {engine: base.with_updates({"model.engine": engine}) for engine in ("fused", "array_api")}
        for config in configs.values():                  # compile or load the kernels, build the data
            simulate(config.with_updates({"federated.rounds": 1}))
        (f_best, f_median), (a_best, a_median) = best_times([lambda c=c: simulate(c) for c in configs.values()],
                                                            repeat)
        rows.append([name, f"{f_best:.3f}", f"{f_median:.3f}", f"{a_best:.3f}", f"{a_median:.3f}",
                     f"{a_best / f_best:.2f}"])
    print(f"\nsoftmax runs, FedAvg, 40 rounds of E = 10, seconds (best and median of {repeat}, interleaved; "
          f"fused engine threads: {fused.default_threads()}):\n")
    print_table(["size", "fused best", "fused median", "Array-API best", "Array-API median", "Array-API / fused"],
                rows)


if __name__ == "__main__":
    main()
