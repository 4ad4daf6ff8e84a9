"""Benchmark a sweep over every warm-up length against one plain FedAvg run.

At the reference size (m = 32, N_c = 256, n = 32, d = r = 16, p = 4, E = 10) and ``T`` rounds it
times ``warmup_sweep`` over all ``T0 ∈ {0..T}`` (one shared FedAvg trajectory, frozen stages in
moment space) and one plain FedAvg run of ``T`` rounds (``simulate``), and prints their ratio
(goal: at most 3) next to the cost of running the ``T + 1`` runs one by one (estimated from
the FedAvg run, which is the most expensive of them). With ``--check`` it also runs a few
``T0`` explicitly and prints the largest relative difference of their tables.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_warmup_sweep.py
"""

from __future__ import annotations

import argparse

from _common import REFERENCE, best_times, print_table, relative_difference, size_config, thread_note

from linattn_theory.sim.engine import clients_from_config, simulate
from linattn_theory.sim.warmup_grid import warmup_sweep


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="total rounds T")
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats (best is reported)")
    parser.add_argument("--check", action="store_true", help="compare a few T0 with explicit runs")
    args = parser.parse_args(argv)

    T = args.rounds
    config = size_config(REFERENCE, rounds=T)
    clients = clients_from_config(config)
    print(f"threads: {thread_note()}; best of {args.repeat}, interleaved, on a shared machine")
    print(f"size: {REFERENCE.describe()}, T = {T} rounds, full batches, full participation\n")

    (plain, plain_median), (sweep, sweep_median) = best_times(
        [lambda: simulate(config, clients), lambda: warmup_sweep(config, clients=clients)], args.repeat)
    print_table(["what", "runs", "time s (best / median)", "× one FedAvg run"],
                [["one FedAvg run (simulate)", 1, f"{plain:.2f} / {plain_median:.2f}", "1.00"],
                 ["warmup_sweep, every T0 in 0..T", T + 1, f"{sweep:.2f} / {sweep_median:.2f}",
                  f"{sweep / plain:.2f}"],
                 ["T + 1 explicit runs (estimate: ≤ (T+1) × FedAvg)", T + 1, f"≤ {(T + 1) * plain:.1f}",
                  f"≤ {T + 1}"]])
    if args.check:
        results = warmup_sweep(config, clients=clients)
        worst = max(relative_difference(simulate(config.with_updates(
            {"federated.strategy": "fedfrozen", "federated.warmup_rounds": T0}), clients).table,
            results[T0].table) for T0 in (0, T // 2, T))
        print(f"\nlargest relative table difference vs explicit runs at T0 = 0, {T // 2}, {T}: {worst:.1e}")


if __name__ == "__main__":
    main()
