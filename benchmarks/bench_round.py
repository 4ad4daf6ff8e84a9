"""Benchmark one federated round: the fused and the Array-API engines against the memory floor.

At the reference size (m = 32 clients, N_c = 256 samples, n = 32 tokens, d = r = 16, p = 4,
E = 10 local steps, float64) one interleaved run times, in turn and ``--repeat`` times:

* the memory-bandwidth floor: ``np.copyto`` of a large array into a *preallocated* buffer
  (bytes read + written), on 1 and on 2 threads (each thread copies half);
* a warm-up round (every block trains) of the Array-API engine (``engine="array_api"``,
  ``simulate``'s default chunking) and of the fused engine (``engine="fused"``) on 1 and on
  2 threads (:func:`linattn_theory.core.fused.set_threads`): runs of ``T`` and ``2T`` rounds in the
  same pass, a round being their difference over ``T`` and the rest of the shorter run its per-run
  setup (the fused engine's tiled data layout for ``d = 9–16``, 10–30 ms here). Until
  2026-12-04 the table divided a 3-round run by 3, which charged a third of that setup to each
  round: fused on 2 threads read 23.7 ms per round where ``simulate`` spends 10.4 ms;
* when PyTorch is importable, a straightforward autograd round (attention written on ``X``,
  clients in a Python loop, as a user would first write it).

It prints medians and ranges (min–max) of each (wall time, and the process CPU time of all
threads, which moves less on a shared machine), client-steps per second, and the share of the
floor each engine reaches: the floor is the time to read each sample's context once per local
step in its smaller form (``d(d+1)/2`` numbers of the symmetric ``Ŝ``, plus ``q`` and ``y``) at
the copy bandwidth of the same thread count; share = floor time / measured step time. A second
table scales the number of clients (``--scaling``, default m = 32, 128, 512), a round timed the same
way (runs of 1 and 2 rounds), 3 passes.
Compilation of the fused kernels happens in a warm-up call before any timing (and is cached on
disk for later processes). Results of the two engines are compared (largest relative
difference of the round's parameters).

Usage (from the repository root)::

    python benchmarks/bench_round.py [--repeat 7] [--quick]

The machine may be shared with other jobs: timings are interleaved so that every variant sees
the same load, and ranges are printed so that the spread is visible.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

import numpy as np
from _common import (REFERENCE, copier, interleaved, print_table, relative_difference, size_config, stats,
                     thread_note)

from linattn_theory.core import fused
from linattn_theory.core.backend import resolve_max_bytes
from linattn_theory.sim.engine import clients_from_config, prepare_run, run_schedule
from linattn_theory.core.model import Params

ROUNDS = 3


def torch_round(theta: Params, clients, weights, fed):
    """One FedAvg round with PyTorch autograd, clients one after another (the reference).

    Returns the new server parameters as NumPy arrays.
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


def with_threads(threads: int, fn):
    def run():
        fused.set_threads(threads)
        try:
            return fn()
        finally:
            fused.set_threads(None)
    return run


def marginal_rounds(short: list, long: list, rounds: int = ROUNDS) -> list:
    """Per pass, the seconds of one round: ``(long − short) / rounds`` for runs of ``rounds`` and
    ``2·rounds`` rounds timed in the same pass, so that what a run does once (the fused engine's data
    layout, the first loss evaluation) is not spread over its few rounds."""
    return [(b - a) / rounds for a, b in zip(short, long)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="interleaved passes (median and range)")
    parser.add_argument("--quick", action="store_true", help="3 passes, no scaling table")
    parser.add_argument("--no-torch", action="store_true", help="skip the autograd reference")
    parser.add_argument("--scaling", type=int, nargs="*", default=[32, 128, 512],
                        help="numbers of clients for the scaling table (fused engine, default threads)")
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else args.repeat
    size = REFERENCE
    default_threads = fused.default_threads()
    print(f"machine: {os.cpu_count()} cores, shared with other jobs; fused engine default threads: "
          f"{default_threads}; BLAS: {thread_note()}")
    print(f"reference size: {size.describe()}, float64, warm-up rounds (every block trains), "
          f"{repeat} interleaved passes, median (min–max)\n")

    config = size_config(size, rounds=ROUNDS)
    data, theta0 = prepare_run(config)
    fed = config.federated
    budget = resolve_max_bytes("auto", data, size.heads)

    def engine_run(engine, rounds=ROUNDS):
        one = dataclasses.replace(fed, rounds=rounds)
        return lambda: run_schedule(theta0, data, one, rounds, max_bytes=budget, engine=engine)

    # compile (or load from the disk cache) before timing; compare the engines' results
    fused_result = with_threads(1, engine_run("fused"))()
    array_result = engine_run("array_api")()
    assert not array_result.diverged
    difference = relative_difference(fused_result.params, array_result.params)

    copies = {t: copier(t) for t in (1, 2)}
    engines = {"Array-API engine": (default_threads, lambda rounds: engine_run("array_api", rounds)),
               "fused engine, 1 thread": (1, lambda rounds: with_threads(1, engine_run("fused", rounds))),
               "fused engine, 2 threads": (2, lambda rounds: with_threads(2, engine_run("fused", rounds)))}
    fns = {"copy, 1 thread": copies[1][0], "copy, 2 threads": copies[2][0]}
    for name, (_, run) in engines.items():          # runs of T and 2T rounds: a round's time is their difference
        fns[name], fns[name + " (2T)"] = run(ROUNDS), run(2 * ROUNDS)
    torch_available = False
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(default_threads)
            torch_available = True
        except ImportError:
            pass
    if torch_available:
        clients = clients_from_config(config)
        one = dataclasses.replace(fed, rounds=1)
        torch_params = torch_round(theta0, clients, clients.weights, one)
        ours = run_schedule(theta0, data, one, 1, max_bytes=budget, engine="fused").params
        torch_difference = relative_difference(ours, torch_params)
        fns["PyTorch autograd, clients in a loop"] = lambda: torch_round(theta0, clients, clients.weights, one)
    cpu = {}
    times = interleaved(fns, repeat, cpu)

    bandwidth = {t: [copies[t][1] / s for s in times[f"copy, {t} thread" + ("s" if t > 1 else "")]]
                 for t in (1, 2)}
    print_table(["copy into a preallocated buffer", "ms", "GB/s (read + written), median (min–max)"],
                [[name, stats(times[name], 1e3),
                  stats(bandwidth[t], 1e-9)] for t, name in ((1, "copy, 1 thread"), (2, "copy, 2 threads"))])
    floor = {t: size.step_bytes() / statistics.median(bandwidth[t]) for t in (1, 2)}
    print(f"\nfloor of one local step: {size.step_bytes() / 1e6:.2f} MB read once "
          f"= {floor[1] * 1e3:.3f} ms at the 1-thread bandwidth, {floor[2] * 1e3:.3f} ms at the 2-thread one\n")

    rows = []
    client_steps = size.clients * size.local_steps
    rounds = {name: marginal_rounds(times[name], times[name + " (2T)"]) for name in engines}
    array_median = statistics.median(rounds["Array-API engine"])
    for name, (threads, _) in engines.items():
        per_round = rounds[name]
        setup = [t - ROUNDS * r for t, r in zip(times[name], per_round)]
        share = [floor[min(threads, 2)] / (r / size.local_steps) for r in per_round]
        rows.append([name, stats(per_round, 1e3), stats(marginal_rounds(cpu[name], cpu[name + " (2T)"]), 1e3),
                     stats(setup, 1e3), stats([client_steps / r for r in per_round]),
                     stats(share), f"{array_median / statistics.median(per_round):.2f}"])
    if torch_available:
        name = "PyTorch autograd, clients in a loop"
        per_round = times[name]
        share = [floor[min(default_threads, 2)] / (r / size.local_steps) for r in per_round]
        rows.append([name, stats(per_round, 1e3), stats(cpu[name], 1e3), "–",
                     stats([client_steps / r for r in per_round]),
                     stats(share), f"{array_median / statistics.median(per_round):.3f}"])
    print_table(["round", "ms per round", "CPU ms per round", "per-run setup ms", "client-steps/s",
                 "share of the floor", "speed-up vs Array-API"], rows)
    print(f"\n(a round's time is (time of {2 * ROUNDS} rounds − time of {ROUNDS}) / {ROUNDS}, paired by pass; "
          f"the per-run setup is the rest of a {ROUNDS}-round run: the fused engine lays the data out "
          f"in tiles once per run, for d = 9–16; "
          f"a round includes the loss evaluations of the run table; the Array-API engine uses "
          f"simulate's chunking, max_bytes={budget}; the share uses the floor at the same thread "
          f"count; fused vs Array-API parameters after {ROUNDS} rounds: max rel. difference "
          f"{difference:.1e})")
    fused_median = statistics.median(rounds["fused engine, 2 threads"])
    if torch_available:
        torch_median = statistics.median(times["PyTorch autograd, clients in a loop"])
        print(f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads): the fused engine on 2 "
              f"threads is {torch_median / fused_median:.0f}× faster; results equal to "
              f"{torch_difference:.1e}")
    else:
        print("PyTorch is not importable: the autograd reference was skipped.")

    if args.quick or not args.scaling:
        return
    print("\nScaling in clients (a round: a 2-round run's time minus a 1-round run's, paired by pass, "
          "after an untimed run; 3 interleaved passes; the Array-API engine with simulate's chunking):")
    runs, sizes = {}, {}
    for m in args.scaling:
        cfg = size_config(dataclasses.replace(size, name=f"m={m}", clients=m), rounds=2)
        d_m, t_m = prepare_run(cfg)
        sizes[m] = d_m.S.nbytes
        chunks = resolve_max_bytes("auto", d_m, size.heads)
        for engine in ("fused", "array_api"):
            for count in (1, 2):
                one = dataclasses.replace(cfg.federated, rounds=count)
                run = (lambda d_m=d_m, t_m=t_m, one=one, count=count, engine=engine, chunks=chunks:
                       run_schedule(t_m, d_m, one, count, max_bytes=chunks, engine=engine))
                if count == 1:
                    run()
                runs[(m, engine, count)] = run
    seconds = interleaved(runs, 3)
    rows = []
    for m in args.scaling:
        per_round = {e: marginal_rounds(seconds[(m, e, 1)], seconds[(m, e, 2)], 1) for e in ("fused", "array_api")}
        setup = {e: [t - r for t, r in zip(seconds[(m, e, 1)], per_round[e])] for e in per_round}
        per_step = {e: [s / (m * size.local_steps) for s in per_round[e]] for e in per_round}
        rows.append([m, f"{sizes[m] / 1e6:.0f}", stats(per_round["fused"], 1e3), stats(per_step["fused"], 1e6),
                     stats(setup["fused"], 1e3), stats(per_round["array_api"], 1e3),
                     stats(per_step["array_api"], 1e6)])
    print_table(["clients m", "Ŝ MB", "fused ms per round", "fused µs per client-step", "fused per-run setup ms",
                 "Array-API ms per round", "Array-API µs per client-step"], rows)


if __name__ == "__main__":
    main()
