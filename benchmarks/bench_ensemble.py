"""Benchmark the ensemble engine: many instances as one array program (linattn_theory.sim.ensemble).

One script, measured side by side (interleaved passes, medians and ranges):

1. **Instance-rounds per second** for 1, 8, 64 and 512 instances at the reference size
   (m = 32, N_c = 256, n = 32, d = r = 16, p = 4, E = 10) and at the figures' size
   (simulations/configs/tradeoff.toml: m = 8, N_c = 128, n = 16, d = 8, r = 3, p = 2, E = 10),
   FedAvg rounds (every block trains), float64, on the Array-API engine on NumPy, the fused CPU
   engine and, when CuPy sees a GPU, the Array-API engine on CuPy; with the share of the memory
   floor each reaches (the time to read every sample's context once per local step in its
   smaller form, ``d(d+1)/2`` numbers of ``Ŝ`` plus ``q`` and ``y``, at the copy bandwidth of the
   device: host ``np.copyto`` on the CPU engines, device-to-device on the GPU). Data are built
   and stacked before the clock starts; a pass runs ``--rounds`` rounds of
   :func:`~linattn_theory.sim.ensemble.run_ensemble`.
2. **Beside them**, when installed, a JAX ``jit`` + ``vmap`` and a PyTorch batched version of
   the same closed form (context second moments, E local steps, weighted average; optional
   imports, skipped with a message: never dependencies of the package), each peer's parameters
   after the rounds checked against the fused engine's (printed after the tables).
3. **The goals**: 48 figure-size runs through ``simulate_many`` against 48 calls of
   ``simulate`` (wall and process CPU time, data generation included on both sides), for 48
   different instances and for 48 runs of the figures' kind (a few instances × a ``T0`` grid,
   whose warm-ups ``simulate_many`` shares); and the fused engine's share of the memory floor
   at the reference size, one instance (``benchmarks/bench_round.py`` explains the floor).
4. **The fused kernel's products** (``--sections kernels``): one thread, CPU ms per local step of
   the sizes above and of ``d = 4`` and two heads, with the products compiled for ``d``
   (:func:`~linattn_theory.core._fused_kernels.dimension`; at the reference size the tiled
   kernels, :func:`~linattn_theory.core._fused_kernels.tiled_local_steps`) against the row loops
   (``dim = ()``).
5. **The fused engine's share of the compute floor** (``--sections compute``): at the reference
   size, one instance, on 1 and 2 threads, the multiply-adds of one FedAvg round,
   ``E·m·N·H(4d² + 3dp)`` (per sample and local step, every block trained: ``K_h^T q``, ``Ŝ k_h``,
   ``Ŝ u`` and ``Σ_i q g^T`` are ``d²`` each; ``W_V^T φ``, ``Σ_i φ e^T`` and ``W_V e`` are ``dp``
   each; the round's client losses are not counted), over the round's wall time (one
   ``round_step`` of the round loop, :mod:`linattn_theory.sim.rounds`), divided by the rate of a
   1024³ float64 matrix product (``np.dot``) timed in the same process, interleaved with it, at
   the same thread count (``threadpoolctl``); best of ``max(--repeat, 7)`` passes each (with one
   thread also the same ratio in the process's CPU time, which moves less on a shared machine).
   Then where the round goes: its local steps, its client losses and the rest, each timed in place,
   and the share the round would reach if its local steps were all of it (a ceiling for work on
   anything but the kernels of the local step).
6. **The regret benchmark's unit** (``--sections scoring``): 8 declared evaluation instances of
   ``benchmarks/predictive_regret.py`` scored together, as its workers do
   (:func:`~linattn_theory.recommenders.scoring.score_instances`), against 8 calls of
   :func:`~linattn_theory.recommenders.scoring.score_instance`, and where the time of the
   together-pass goes (the parts timed in place, nested parts inside their callers).

Usage (from the repository root)::

    python benchmarks/bench_ensemble.py [--quick] [--repeat 3] [--instances 1 8 64 512]

The machine may be shared with other jobs: every variant sees the same load (interleaved), CPU
time is printed next to wall time, and ranges show the spread. Without a GPU the CuPy rows say
so and are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import statistics
import time

import numpy as np
from _common import REFERENCE, Size, copier, interleaved, print_table, size_config, stats, thread_note

from linattn_theory.core import fused
from linattn_theory.core.backend import gpu_available
from linattn_theory.sim.engine import clients_from_config, prepare_run, simulate
from linattn_theory.sim.ensemble import Member, run_ensemble, simulate_many

FIGURES = Size("figures", clients=8, samples=128, tokens=16, dim=8, rank=3, outputs=2)
TEACHER_RANK = 3


def figure_config(seed: int, rounds: int, backend: str = "numpy", **federated):
    """A tradeoff.toml run (the figures' size) as a FedAvg config unless ``federated`` says otherwise."""
    config = size_config(FIGURES, rounds=rounds, backend=backend, seed=seed, learning_rate=0.02,
                         **federated)
    return config.with_updates({"task.zeta_value": 2.0, "task.zeta_covariate": 0.5, "task.noise": 0.1,
                                "task.rank": TEACHER_RANK})


def members(size: Size, count: int, rounds: int, backend: str) -> list[Member]:
    """``count`` instances (seeds ``0..count−1``) of ``size``, data on ``backend``, ready to run."""
    out = []
    for seed in range(count):
        config = (figure_config(seed, rounds, backend) if size is FIGURES
                  else size_config(size, rounds=rounds, backend=backend, seed=seed))
        data, theta0 = prepare_run(config, clients_from_config(config))
        out.append(Member(config, data, theta0))
    return out


def floor_seconds(size: Size, bandwidth: float) -> float:
    """The memory floor of one instance-round: ``E`` reads of every sample's context at ``bandwidth``."""
    return size.local_steps * size.step_bytes() / bandwidth


# ----------------------------------------------------------------------------------------------
# optional peers: the same closed form in JAX (jit + vmap) and PyTorch (batched)
# ----------------------------------------------------------------------------------------------
def jax_peer(batch, rounds: int, eta: float, steps: int):
    """``(run, device)``: FedAvg rounds of every instance with JAX ``jit`` + ``vmap``, or ``None``;
    ``run()`` returns the server blocks ``(W_Q, W_K, W_V)`` after the rounds."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    S, q, y, w, pw = (jnp.asarray(a) for a in batch[:5])
    WQ, WK, WV = batch[5]

    def loss(params, S, q, y, w):
        WQ, WK, WV = params
        K = jnp.einsum("hdr,her->hde", WQ, WK)
        phi = jnp.einsum("nab,hca,nc->nhb", S, K, q)
        e = jnp.einsum("nhb,hbp->np", phi, WV) - y
        return 0.5 * jnp.sum(w[:, None] * e * e)

    grad = jax.grad(loss)

    def client(params, S, q, y, w):
        def step(_, p):
            g = grad(p, S, q, y, w)
            return tuple(a - eta * b for a, b in zip(p, g))
        return jax.lax.fori_loop(0, steps, step, params)

    def instance(params, S, q, y, w, pw):
        def one_round(_, p):
            local = jax.vmap(client, in_axes=(None, 0, 0, 0, 0))(p, S, q, y, w)
            return tuple(jnp.einsum("c,c...->...", pw, a) for a in local)
        return jax.lax.fori_loop(0, rounds, one_round, params)

    run = jax.jit(jax.vmap(instance))
    params = tuple(jnp.asarray(a) for a in (WQ, WK, WV))
    run(params, S, q, y, w, pw)[0].block_until_ready()
    return (lambda: jax.block_until_ready(run(params, S, q, y, w, pw))), jax.devices()[0].platform


def torch_peer(batch, rounds: int, eta: float, steps: int):
    """``(run, device)``: FedAvg rounds of every instance with PyTorch batched autograd, or ``None``;
    ``run()`` returns the server blocks ``(W_Q, W_K, W_V)`` after the rounds."""
    try:
        import torch
    except ImportError:
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    S, q, y, w, pw = (torch.as_tensor(np.asarray(a), device=device) for a in batch[:5])
    server = [torch.as_tensor(np.asarray(a), device=device) for a in batch[5]]
    m = S.shape[1]

    def run():
        params = [a.clone() for a in server]                      # (I, H, d, r)
        for _ in range(rounds):
            local = [a[:, None].expand(-1, m, *a.shape[1:]).clone().requires_grad_(True) for a in params]
            for _ in range(steps):
                WQ, WK, WV = local
                K = torch.einsum("ichdr,icher->ichde", WQ, WK)
                phi = torch.einsum("icnab,ichga,icng->icnhb", S, K, q)
                e = torch.einsum("icnhb,ichbp->icnp", phi, WV) - y
                loss = 0.5 * (w[..., None] * e * e).sum()
                grads = torch.autograd.grad(loss, local)
                with torch.no_grad():
                    local = [(a - eta * g).requires_grad_(True) for a, g in zip(local, grads)]
            with torch.no_grad():
                params = [torch.einsum("ic,ic...->i...", pw, a) for a in local]
        if device == "cuda":
            torch.cuda.synchronize()
        return params

    run()
    return run, device


def peer_difference(blocks, results) -> float:
    """The largest difference between a peer's server blocks ``(W_Q, W_K, W_V)`` (instance axis first)
    and the project's results (:func:`~linattn_theory.sim.ensemble.run_ensemble`), relative to each
    block's largest entry: the peers must compute what the project computes for their times to compare."""
    worst = 0.0
    for name, peer in zip(("WQ", "WK", "WV"), blocks):
        ours = np.stack([np.asarray(getattr(result.params, name)) for result, _, _ in results])
        peer = np.asarray(peer.detach().cpu() if hasattr(peer, "detach") else peer)
        worst = max(worst, float(np.max(np.abs(peer - ours)) / np.max(np.abs(ours))))
    return worst


def peer_batch(batch_members):
    """The stacked data and server parameters of ``members`` as NumPy arrays (for the peers)."""
    stack = lambda f: np.stack([np.asarray(getattr(mb.data, f)) for mb in batch_members])  # noqa: E731
    S, q, y, w, pw = stack("S"), stack("q"), stack("y"), stack("sample_weight"), stack("weights")
    params = tuple(np.stack([np.asarray(getattr(mb.params, b)) for mb in batch_members]) for b in ("WQ", "WK", "WV"))
    return S, q, y, w, pw, params


# ----------------------------------------------------------------------------------------------
def throughput(args, bandwidth: dict) -> None:
    """Section 1 and 2: instance-rounds per second for each size, instance count and engine."""
    engines = [("NumPy (Array-API)", "numpy", "array_api"), ("fused CPU", "numpy", "fused")]
    if gpu_available():
        engines.append(("CuPy (Array-API)", "cupy", "array_api"))
    else:
        print("CuPy with a CUDA GPU is not available here: the CuPy rows are skipped.")
    agreement = []
    for size in (REFERENCE, FIGURES):
        rows = []
        for count in args.instances:
            if size is REFERENCE and count > args.max_reference:
                rows.append([count, "skipped (--max-reference)", "", "", "", ""])
                continue
            fns, built = {}, {}
            for label, backend, engine in engines:
                batch = built.setdefault(backend, members(size, count, args.rounds, backend))
                sync = None
                if backend == "cupy":
                    import cupy
                    sync = cupy.cuda.runtime.deviceSynchronize

                def run(batch=batch, engine=engine, sync=sync):
                    run_ensemble(batch, engine=engine)
                    if sync is not None:
                        sync()
                run()                                    # compile / warm the caches first
                fns[label] = run
            peers = {}
            if not args.no_peers:
                host = peer_batch(built["numpy"])
                fed = built["numpy"][0].config.federated
                for name, make in (("JAX jit+vmap", jax_peer), ("PyTorch batched", torch_peer)):
                    peer = make(host, args.rounds, fed.learning_rate, fed.local_steps)
                    if peer is not None:
                        fns[f"{name} ({peer[1]})"] = peer[0]
                        peers[f"{name} ({peer[1]})"] = peer[1]
            cpu: dict = {}
            times = interleaved(fns, args.repeat, cpu)
            if peers:
                ours = run_ensemble(built["numpy"], engine="fused")
                for label in peers:
                    agreement.append(f"{size.name}, {count} instances, {label}: "
                                     f"{peer_difference(fns[label](), ours):.1e}")
            for label, seconds in times.items():
                device = "gpu" if ("CuPy" in label or peers.get(label) in ("gpu", "cuda")) else "cpu"
                per = [s / (count * args.rounds) for s in seconds]
                share = [floor_seconds(size, bandwidth[device]) / p for p in per] if bandwidth.get(device) else None
                rows.append([count, label, stats([1 / p for p in per]),
                             stats([c / (count * args.rounds) for c in cpu[label]], 1e3) if device == "cpu" else "–",
                             stats(per, 1e3), stats(share) if share else "–"])
            del built
        print(f"\n{size.name} size ({size.describe()}), {args.rounds} FedAvg rounds per pass, "
              f"{args.repeat} interleaved passes, median (min–max):")
        print_table(["instances", "engine", "instance-rounds/s", "CPU ms per instance-round",
                     "wall ms per instance-round", "share of the memory floor"], rows)
    if args.no_peers:
        return
    if agreement:
        print("\nThe peers' server parameters after the rounds against the fused engine's (largest difference, "
              "relative to each block's largest entry; float64, the same data, step and rounds):\n  "
              + "\n  ".join(agreement))
    missing = [name for name, module in (("JAX", "jax"), ("PyTorch", "torch"))
               if __import__("importlib").util.find_spec(module) is None]
    if missing:
        print(f"\n{' and '.join(missing)} not installed: {'their peers were' if len(missing) > 1 else 'its peer was'} "
              f"skipped (optional; never a dependency of the package).")


def goals(args, bandwidth: dict) -> None:
    """Section 3: simulate_many against simulate at the figures' size, fused share at the reference."""
    rounds = 40
    distinct = [figure_config(seed, rounds, strategy="fedfrozen", warmup_rounds=2 * (seed % 21))
                for seed in range(48)]
    grid = [figure_config(seed, rounds, strategy="fedfrozen", warmup_rounds=T0)
            for seed in range(3) for T0 in range(0, rounds + 1, 2)][:48]
    simulate_many(distinct[:2])                                   # compile / load the kernels
    simulate(distinct[0])
    rows = []
    for name, configs in (("48 instances (seeds), T0 = 0..40", distinct),
                          ("48 runs of the figures' kind (T0 = 0, 2, …, 40 of seeds 0, 1, 2)", grid)):
        cpu: dict = {}
        times = interleaved({"simulate_many": lambda c=configs: simulate_many(c),
                             "48 × simulate": lambda c=configs: [simulate(x) for x in c]},
                            args.repeat, cpu)
        ratio_wall = statistics.median(times["48 × simulate"]) / statistics.median(times["simulate_many"])
        ratio_cpu = statistics.median(cpu["48 × simulate"]) / statistics.median(cpu["simulate_many"])
        rows.append([name, stats(times["simulate_many"]), stats(times["48 × simulate"]),
                     stats(cpu["simulate_many"]), stats(cpu["48 × simulate"]),
                     f"{ratio_wall:.1f}", f"{ratio_cpu:.1f}"])
    print(f"\nGoal: 48 figure-size runs (T = {rounds}) through simulate_many ≥ 5× faster than 48 "
          f"simulate calls (data generation included; {args.repeat} interleaved passes, s, median (min–max)):")
    print_table(["runs", "simulate_many wall", "48 × simulate wall", "simulate_many CPU",
                 "48 × simulate CPU", "speed-up (wall)", "speed-up (CPU)"], rows)

    config = size_config(REFERENCE, rounds=3)
    data, theta0 = prepare_run(config)
    one = [Member(config, data, theta0)]
    rows = []
    steps = 3 * REFERENCE.local_steps
    for threads in (1, 2):
        fused.set_threads(threads)
        try:
            run_ensemble(one, engine="fused")
            cpu = {}
            times = interleaved({"fused": lambda: run_ensemble(one, engine="fused")}, args.repeat, cpu)
        finally:
            fused.set_threads(None)
        per_step = [s / steps for s in times["fused"]]
        floor = REFERENCE.step_bytes() / bandwidth[f"cpu{threads}"]
        row = [threads, stats(per_step, 1e3), f"{floor * 1e3:.3f}", stats([floor / s for s in per_step])]
        if threads == 1:      # on a busy machine: the process's own CPU time against the copy's
            per_cpu = [c / steps for c in cpu["fused"]]
            floor_cpu = REFERENCE.step_bytes() / bandwidth["cpu1 (CPU time)"]
            row += [stats(per_cpu, 1e3), f"{floor_cpu * 1e3:.3f}", stats([floor_cpu / c for c in per_cpu])]
        else:
            row += ["–", "–", "–"]
        rows.append(row)
    print("\nGoal: the fused engine at ≥ 0.5 of the memory floor at the reference size (one instance, "
          "3 rounds incl. the table's loss evaluations; the floor at the same thread count; with 1 "
          "thread also in process CPU time, against the copy's CPU-time bandwidth):")
    print_table(["threads", "wall ms per local step", "floor ms (wall)", "share (wall)",
                 "CPU ms per local step", "floor ms (CPU)", "share (CPU)"], rows)


#: (name, Size) of the kernel comparison: the figures' size, two heads, d = 4 and the reference size
KERNEL_SIZES = (("figures", FIGURES),
                ("figures, two heads", Size("two heads", clients=8, samples=128, tokens=16, dim=8, rank=3,
                                            outputs=2, heads=2)),
                ("d = 4 (regret benchmark)", Size("d4", clients=8, samples=128, tokens=16, dim=4, rank=5,
                                                  outputs=1)),
                ("reference (d = 16: tiles)", REFERENCE))


def round_multiply_adds(size: Size) -> int:
    """Multiply-adds of one FedAvg round of ``size`` (every block trained): ``E·m·N·H(4d² + 3dp)``."""
    d, p = size.dim, size.outputs
    return size.local_steps * size.clients * size.samples * size.heads * (4 * d * d + 3 * d * p)


def compute(args) -> None:
    """Section 5: multiply-adds of a round per second against a 1024³ DGEMM's, same process and threads
    (the rounds' passes, then the DGEMM's)."""
    from threadpoolctl import threadpool_limits

    from linattn_theory.sim.rounds import _Ensemble

    size = REFERENCE
    config = size_config(size, rounds=1)
    data, theta0 = prepare_run(config)
    ensemble = _Ensemble([Member(config, data, theta0)], None, "fused")
    state, _ = ensemble.init()
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 1024, 1024))
    out = np.empty_like(a)
    madds = round_multiply_adds(size)
    repeat = max(args.repeat, 7)
    load = os.getloadavg()[0]
    rows, parts, dgemm_rates = [], {}, {}
    for threads in (1, 2):
        fused.set_threads(threads)
        try:
            with threadpool_limits(limits=threads, user_api="blas"):
                # the rounds first, then the DGEMMs, not interleaved: on this 2-core machine a round on
                # 2 threads right after a 2-thread DGEMM took 12.5 ms against 8.4 ms after a round (or
                # after streaming 24 MB), even the second round after it and with no BLAS thread
                # using CPU time; runs never interleave a large DGEMM with their rounds
                cpu: dict = {}
                ensemble.round_step(state, 0)                 # compile / load, warm the caches
                times = interleaved({"round": lambda: ensemble.round_step(state, 0)}, repeat, cpu)
                parts[threads] = round_parts(lambda: ensemble.round_step(state, 0), repeat)
                np.dot(a, b, out=out)
                times.update(interleaved({"dgemm": lambda: np.dot(a, b, out=out)}, repeat, cpu))
        finally:
            fused.set_threads(None)
        round_s, dgemm_s = min(times["round"]), min(times["dgemm"])
        rate, dgemm_rate = madds / round_s, 1024 ** 3 / dgemm_s
        dgemm_rates[threads] = dgemm_rate
        row = [threads, f"{round_s * 1e3:.2f}", f"{round_s / size.local_steps * 1e3:.3f}",
               f"{rate / 1e9:.2f}", f"{dgemm_rate / 1e9:.1f}", f"{rate / dgemm_rate:.3f}"]
        if threads == 1:      # on a busy machine: both in the process's CPU time (one thread each)
            row.append(f"{min(cpu['dgemm']) / 1024 ** 3 * madds / min(cpu['round']):.3f}")
        else:
            row.append("–")
        rows.append(row)
    print(f"\nThe fused engine against the in-run DGEMM rate, reference size ({size.describe()}), one "
          f"instance: {madds / 1e6:.1f} M multiply-adds per round; best of {repeat} passes of each; "
          f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after:")
    print_table(["threads", "ms per round", "ms per local step", "G multiply-adds/s",
                 "DGEMM 1024³ G multiply-adds/s", "share of DGEMM", "share in CPU time"], rows)
    print(f"\nWhere the round goes (the same rounds once more, each part timed in place; the parts of the "
          f"fastest of {repeat}): the local steps (FusedEngine.train, the kernels of all E steps), the "
          f"client losses at the new server parameters (FusedEngine.losses, one more pass over every Ŝ, "
          f"not counted in the multiply-adds) and the rest (aggregation, the round's Python); the last "
          f"column is the share of DGEMM the round would reach if the local steps were all of it:")
    print_table(["threads", "ms per round", "local steps ms", "client losses ms", "rest ms",
                 "share, local steps alone"],
                [[threads, f"{1e3 * total:.2f}", f"{1e3 * steps:.2f}", f"{1e3 * losses:.2f}",
                  f"{1e3 * (total - steps - losses):.2f}", f"{madds / steps / dgemm_rates[threads]:.3f}"]
                 for threads, (total, steps, losses) in parts.items()])


#: the parts of a fused round timed in place by the compute section
ROUND_PARTS = (("linattn_theory.core.fused", "FusedEngine.train", 0),
               ("linattn_theory.core.fused", "FusedEngine.losses", 0))


def round_parts(run_round, repeat: int) -> tuple[float, float, float]:
    """``(round, local steps, client losses)`` seconds of the fastest of ``repeat`` calls of
    ``run_round``, its :data:`ROUND_PARTS` timed in place (:func:`timed_parts`)."""
    best = None
    for _ in range(repeat):
        seconds: dict = {}
        with timed_parts(ROUND_PARTS, seconds):
            start = time.perf_counter()
            run_round()
            total = time.perf_counter() - start
        measured = (total, seconds.get("FusedEngine.train", 0.0), seconds.get("FusedEngine.losses", 0.0))
        if best is None or measured[0] < best[0]:
            best = measured
    return best


def kernels(args) -> None:
    """Section 4: the fused local steps with the products compiled for d against the row loops."""
    from linattn_theory.core import _fused_kernels as kernels_module

    rows = []
    for name, size in KERNEL_SIZES:
        rng = np.random.default_rng(0)
        m, N, d, H = size.clients, size.samples, size.dim, size.heads
        X = rng.normal(size=(1, m, N, size.tokens, d)) / np.sqrt(d)
        S = np.einsum("...ta,...tb->...ab", X, X) / size.tokens
        q, y = rng.normal(size=(1, m, N, d)), rng.normal(size=(1, m, N, size.outputs))
        St, qt, yt = kernels_module.samples_last(S, q, y)
        w = np.full((1, m, N), 1.0 / (m * N))
        tiles = kernels_module.tiles(S, q, y, w)
        WQ, WK = rng.normal(size=(2, 1, H, d, size.rank)) * 0.3
        WV = rng.normal(size=(1, H, d, size.outputs)) * 0.3
        inst, src, part = np.zeros(m, np.int64), np.zeros(1, np.int64), np.arange(m)   # one instance, one data row
        outs = [np.empty((m,) + a.shape[1:]) for a in (WQ, WK, WV)]

        def step(dim):
            kernel, data = ((kernels_module.tiled_local_steps, tiles) if dim and kernels_module.tiled(d)
                            else (kernels_module.local_steps, (St, qt, yt, w)))
            kernel(*data, inst, src, part, 0, m, WQ, WK, WV, True, True, True, size.local_steps, np.array([0.05]),
                   np.array([1e-3]), *outs, dim)

        compiled = (0,) * d if kernels_module.tiled(d) else kernels_module.dimension(d)
        variants = {"compiled for d": lambda: step(compiled), "row loops": lambda: step(())}
        for fn in variants.values():
            fn()                                          # compile / load
        cpu: dict = {}
        interleaved(variants, max(args.repeat, 5), cpu)
        per = {k: [c / size.local_steps for c in v] for k, v in cpu.items()}
        ratio = statistics.median(per["row loops"]) / statistics.median(per["compiled for d"])
        rows.append([name, size.describe(), stats(per["compiled for d"], 1e3), stats(per["row loops"], 1e3),
                     f"{ratio:.2f}"])
    print(f"\nThe fused local step (one thread, CPU ms per step of all clients, {max(args.repeat, 5)} interleaved "
          f"passes, median (min–max)); the products compiled for d up to d = {kernels_module.MAX_UNROLLED_DIM}, "
          f"the tiled kernels up to d = {kernels_module.MAX_TILED_DIM}:")
    print_table(["size", "", "compiled for d", "row loops", "speed-up"], rows)


#: the parts of a scoring pass timed in place (module, function), nested ones indented in the table
SCORING_PARTS = (("linattn_theory.recommenders.scoring", "_truths_and_paths", 0),
                 ("linattn_theory.sim.warmup_grid", "warmup_sweeps_and_paths", 1),
                 ("linattn_theory.theory.profile", "centralized_optima", 1),
                 ("linattn_theory.theory.profile", "_factor_objectives", 2),
                 ("linattn_theory.recommenders.scoring", "fedavg_path", 0),
                 ("linattn_theory.theory.bound", "estimate_bound", 0),
                 ("linattn_theory.recommenders.recommendation", "pilot_warmup", 0),
                 ("linattn_theory.recommenders.online", "freeze_forecast", 0))


@contextlib.contextmanager
def timed_parts(parts, seconds: dict):
    """Within the block, every call of ``module.function`` (or ``module.Class.method``) in ``parts``
    adds its wall time to ``seconds[function]`` (the functions are looked up by their module or class
    at call time, so patching the attribute reaches every caller; restored on exit)."""
    saved = []
    for module_name, name, _ in parts:
        module = importlib.import_module(module_name)
        for attribute in name.split(".")[:-1]:        # "Class.method": the method on its class
            module = getattr(module, attribute)
        original = getattr(module, name.rsplit(".", 1)[-1])

        @functools.wraps(original)
        def wrapper(*args, _original=original, _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - start
        setattr(module, name.rsplit(".", 1)[-1], wrapper)
        saved.append((module, name.rsplit(".", 1)[-1], original))
    try:
        yield seconds
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def scoring(args) -> None:
    """Section 6: the regret benchmark's unit, 8 instances scored together against one at a time."""
    import warnings

    from predictive_regret import instances

    from linattn_theory.recommenders.scoring import score_instance, score_instances
    from linattn_theory.sim.config import config_from_dict

    table = instances()
    chosen = table[table["set"] == "evaluation"].sample(n=8, random_state=args.scoring_sample)
    configs = [config_from_dict(d) for d in chosen["config"]]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        score_instances(configs)              # compile / load every kernel the 8 instances use
        cpu: dict = {}
        times = interleaved({"score_instances (8 together)": lambda: score_instances(configs),
                             "8 × score_instance": lambda: [score_instance(c) for c in configs]},
                            args.repeat, cpu)
        parts: dict = {}
        with timed_parts(SCORING_PARTS, parts):
            start = time.perf_counter()
            score_instances(configs)
            total = time.perf_counter() - start
    names = list(times)
    ratio = statistics.median(times[names[1]]) / statistics.median(times[names[0]])
    print(f"\nThe regret benchmark's unit: 8 evaluation instances ({', '.join(sorted(set(chosen['family'])))}; "
          f"E ∈ {sorted(set(chosen['local_steps']))}), {args.repeat} interleaved passes, s, median (min–max):")
    print_table(["scoring", "wall", "CPU"], [[n, stats(times[n]), stats(cpu[n])] for n in names])
    print(f"together / one at a time: {ratio:.2f}× (wall)")
    rows = [[("· " * depth) + name, f"{parts.get(name, 0.0):.2f}", f"{parts.get(name, 0.0) / total:.0%}"]
            for _, name, depth in SCORING_PARTS]
    print(f"\nWhere one together-pass goes ({total:.2f} s wall; a part marked · runs inside the part above it):")
    print_table(["part", "s", "share"], rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved passes (median and range)")
    parser.add_argument("--rounds", type=int, default=2, help="FedAvg rounds per timed pass")
    parser.add_argument("--instances", type=int, nargs="*", default=[1, 8, 64, 512])
    parser.add_argument("--max-reference", type=int, default=64,
                        help="largest instance count at the reference size (16 MB of data per instance)")
    parser.add_argument("--quick", action="store_true", help="1 and 8 instances, 2 passes, no goals section")
    parser.add_argument("--no-peers", action="store_true", help="skip the JAX and PyTorch peers")
    parser.add_argument("--sections", nargs="*", choices=("throughput", "goals", "kernels", "compute", "scoring"),
                        default=["throughput", "goals"],
                        help="which tables to print (default throughput and goals, the GPU check's; "
                             "kernels, compute and scoring are CPU measurements, asked for by name)")
    parser.add_argument("--scoring-sample", type=int, default=1,
                        help="random state of the 8 evaluation instances of the scoring section")
    args = parser.parse_args(argv)
    if args.quick:
        args.instances, args.repeat = [1, 8], 2
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (shared with other "
          f"jobs); fused engine threads: {fused.default_threads()}; BLAS: {thread_note()}; "
          f"{time.strftime('%Y-%m-%d')}")
    bandwidth = {}
    for threads in (1, 2):
        copy, nbytes = copier(threads)
        cpu = {}
        bandwidth[f"cpu{threads}"] = nbytes / statistics.median(interleaved({"copy": copy}, 5, cpu)["copy"])
        if threads == 1:
            bandwidth["cpu1 (CPU time)"] = nbytes / statistics.median(cpu["copy"])
    bandwidth["cpu"] = bandwidth[f"cpu{min(2, fused.default_threads())}"]
    if gpu_available():
        import cupy
        from gpu_check import device_bandwidth
        bandwidth["gpu"] = device_bandwidth(cupy)
    print("copy bandwidth (read + written): " + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bandwidth.items()))
    if "throughput" in args.sections:
        throughput(args, bandwidth)
    if "goals" in args.sections and not args.quick:
        goals(args, bandwidth)
    if "kernels" in args.sections:          # the kernel called directly: one thread
        kernels(args)
    if "compute" in args.sections:
        compute(args)
    if "scoring" in args.sections and not args.quick:
        scoring(args)


if __name__ == "__main__":
    main()
