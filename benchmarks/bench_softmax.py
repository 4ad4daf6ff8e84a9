"""Benchmark a softmax-attention round against the linear one (docs/theory.md §9).

At the reference size (m = 32 clients, N_c = 256 samples, n = 32 tokens, d = r = 16, p = 4,
E = 10 local steps) it prints, for linear and softmax attention, the time of one warm-up round
(every block trains), client-steps per second, the memory of the stacked data (softmax keeps
the contexts ``X`` as well as ``Ŝ``) and the softmax/linear time ratio. The goal is a ratio
of at most 3 (softmax reads ``X``, ``n·d`` numbers per sample, and forms ``H·n`` scores).

Usage (from the repository root; single-threaded BLAS for comparable numbers)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_softmax.py

Timings are the best of ``--repeat`` runs, interleaved so that both see the same load.
"""

from __future__ import annotations

import argparse

from _common import REFERENCE, best_times, print_table, size_config, thread_note

from linattn_theory.core.backend import resolve_max_bytes
from linattn_theory.sim.engine import clients_from_config, prepare_run, run_schedule


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


if __name__ == "__main__":
    main()
