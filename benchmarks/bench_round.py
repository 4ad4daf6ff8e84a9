"""Benchmark one federated round: speed, memory, the memory-bandwidth floor, an autograd reference.

For the reference size (m = 32 clients, N_c = 256 samples, n = 32 tokens, d = r = 16, p = 4,
E = 10 local steps) and two larger sizes it prints:

* client-steps per second of the batched warm-up round (every block trains) and the peak
  memory one round adds to the stacked data (tracemalloc, which sees NumPy's allocations);
* the bytes one local step must read (each sample's context once in its smaller form,
  ``n·d`` numbers for ``X`` or ``d(d+1)/2`` for the symmetric ``Ŝ``, plus ``q`` and ``y``), the
  host's memory bandwidth measured by a large array copy (bytes read + written), the floor
  time these give, and the ratio of the measured step time to that floor;
* when PyTorch is importable, a straightforward autograd implementation of the same round
  (attention written on ``X``, clients in a Python loop, as a user would first write it):
  its time, the speed-up, and the largest relative difference of the two rounds' results.

Usage (from the repository root; single-threaded BLAS for comparable numbers)::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_round.py

Timings are the best of ``--repeat`` runs; on a shared machine they vary from run to run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tracemalloc

import numpy as np
from _common import (LARGER, REFERENCE, best_times, copy_bandwidth, print_table, relative_difference,
                     size_config, thread_note)

from linattn_theory.backend import resolve_max_bytes
from linattn_theory.federated import prepare_run, run_schedule
from linattn_theory.model import Params

ROUNDS = 3


def torch_round(theta: Params, clients, weights, fed):
    """One FedAvg round with PyTorch autograd, clients one after another (the reference).

    Returns the new server parameters as NumPy arrays and the time the round took.
    """
    import torch

    def predict(WQ, WK, WV, X, q):
        # s_h(q, x_i) = q^T W_Q^h (W_K^h)^T x_i,  ŷ = Σ_h (1/n) Σ_i s_h(q, x_i) (W_V^h)^T x_i
        query = torch.einsum("bd,hdr->bhr", q, WQ)
        keys = torch.einsum("bnd,hdr->bhnr", X, WK)
        scores = torch.einsum("bhnr,bhr->bhn", keys, query)
        values = torch.einsum("bnd,hdp->bhnp", X, WV)
        return torch.einsum("bhn,bhnp->bp", scores, values) / X.shape[1]

    server = [torch.from_numpy(np.asarray(a)) for a in (theta.WQ, theta.WK, theta.WV)]
    weights = np.asarray(weights) / np.sum(weights)
    average = [torch.zeros_like(a) for a in server]
    for (X, q, y), p_c in zip(clients, weights):
        X, q, y = (torch.from_numpy(a) for a in (X, q, y))
        params = [a.clone().requires_grad_(True) for a in server]
        for _ in range(fed.local_steps):
            error = predict(*params, X, q) - y
            loss = 0.5 * (error ** 2).sum(-1).mean() + 0.5 * fed.ridge * (params[2] ** 2).sum()
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                params = [(a - fed.learning_rate * g).requires_grad_(True) for a, g in zip(params, grads)]
        with torch.no_grad():
            for acc, a in zip(average, params):
                acc += float(p_c) * a
    new = [s + fed.server_learning_rate * (a - s) for s, a in zip(server, average)]
    return Params(*(a.numpy() for a in new))


def measure(size, repeat: int, bandwidth: float):
    config = size_config(size, rounds=ROUNDS)
    data, theta0 = prepare_run(config)
    fed = config.federated
    # simulate's default (max_bytes="auto"): on the CPU, a round too large for the cache trains
    # its clients in chunks of ~16 MiB, each chunk's data staying in cache for its E local steps
    budget = resolve_max_bytes("auto", data, size.heads)
    run = lambda: run_schedule(theta0, data, fed, fed.rounds, max_bytes=budget)  # noqa: E731
    run_one_chunk = lambda: run_schedule(theta0, data, fed, fed.rounds)  # noqa: E731
    assert not run().diverged
    (best, median), (one_chunk, _) = best_times([run, run_one_chunk], repeat)
    per_round = best / ROUNDS
    one_round = dataclasses.replace(fed, rounds=1)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    run_schedule(theta0, data, one_round, 1, max_bytes=budget)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    data_bytes = sum(a.nbytes for a in (data.S, data.q, data.y, data.sample_weight))
    step = per_round / size.local_steps
    floor = size.step_bytes() / bandwidth
    return {"size": size, "config": config, "data": data, "theta0": theta0, "round": per_round,
            "one_chunk": one_chunk / ROUNDS, "chunked": budget is not None,
            "median_round": median / ROUNDS, "client_steps": size.clients * size.local_steps / per_round,
            "peak": peak, "data_bytes": data_bytes, "step": step, "floor": floor}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats (best is reported)")
    parser.add_argument("--quick", action="store_true", help="reference size only, 2 repeats")
    parser.add_argument("--no-torch", action="store_true", help="skip the autograd reference")
    parser.add_argument("--torch-repeat", type=int, default=2, help="timed repeats of the reference")
    args = parser.parse_args(argv)
    sizes = (REFERENCE,) if args.quick else (REFERENCE, *LARGER)
    repeat = 2 if args.quick else args.repeat

    print(f"threads: {thread_note()}; machine: {os.cpu_count()} cores (shared: best of {repeat})")
    bandwidth = copy_bandwidth()
    print(f"memory bandwidth (large array copy, bytes read + written): {bandwidth / 1e9:.1f} GB/s\n")

    results = [measure(size, repeat, bandwidth) for size in sizes]
    print("Batched warm-up round (all blocks train), float64, NumPy:")
    print_table(
        ["size", "shape", "round ms (best / median)", "one chunk ms", "client-steps/s",
         "round peak MB", "data MB", "step MB read", "floor ms/step", "measured ms/step", "× floor"],
        [[r["size"].name, r["size"].describe(), f"{r['round'] * 1e3:.1f} / {r['median_round'] * 1e3:.1f}",
          f"{r['one_chunk'] * 1e3:.1f}" if r["chunked"] else "(same)",
          f"{r['client_steps']:,.0f}", f"{r['peak'] / 1e6:.1f}", f"{r['data_bytes'] / 1e6:.1f}",
          f"{r['size'].step_bytes() / 1e6:.2f}", f"{r['floor'] * 1e3:.3f}", f"{r['step'] * 1e3:.2f}",
          f"{r['step'] / r['floor']:.1f}"] for r in results])
    print("\nfloor = step MB read / bandwidth; a step reads each context in its smaller form once "
          "(here d(d+1)/2 numbers of Ŝ).\nRounds as simulate runs them (max_bytes='auto'): where a "
          "round's working set exceeds 32 MiB, clients train in chunks of ~16 MiB whose data stays in "
          "cache for their E steps; 'one chunk' trains all clients at once (max_bytes=None). Results "
          "are identical.")

    if args.no_torch:
        return
    try:
        import torch
    except ImportError:
        print("\nPyTorch is not importable: autograd reference skipped.")
        return
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    ref = results[0]
    config, data, theta0 = ref["config"], ref["data"], ref["theta0"]
    from linattn_theory.federated import clients_from_config
    clients = clients_from_config(config)
    fed = dataclasses.replace(config.federated, rounds=1)
    budget = resolve_max_bytes("auto", data, REFERENCE.heads)
    ours_params = run_schedule(theta0, data, fed, 1, max_bytes=budget).params
    reference_params = torch_round(theta0, clients, clients.weights, fed)
    three = dataclasses.replace(fed, rounds=3)
    (ours, _), (theirs, _) = best_times(
        [lambda: run_schedule(theta0, data, three, 3, max_bytes=budget),
         lambda: torch_round(theta0, clients, clients.weights, fed)], args.torch_repeat)
    ours /= 3
    print(f"\nAutograd reference at the reference size (torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s)), one round from the same θ0 on the same data:")
    print_table(["implementation", "round ms", "client-steps/s", "speed-up", "max rel. difference"],
                [["PyTorch autograd, clients in a loop", f"{theirs * 1e3:.1f}",
                  f"{REFERENCE.clients * REFERENCE.local_steps / theirs:,.0f}", "1.0", "-"],
                 ["linattn_theory (batched, closed form)", f"{ours * 1e3:.1f}",
                  f"{REFERENCE.clients * REFERENCE.local_steps / ours:,.0f}", f"{theirs / ours:.1f}",
                  f"{relative_difference(ours_params, reference_params):.1e}"]])
    print("(timed in turn, best of --torch-repeat; ours is a third of a 3-round run_schedule, "
          "including the table's loss evaluations, which the reference does not compute)")


if __name__ == "__main__":
    main()
