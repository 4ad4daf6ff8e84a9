"""Shared pieces of the benchmark scripts: problem sizes, configs, timing, the bandwidth floor.

Benchmarks print tables; they are not tests. Timings are the best of several repeats (the
least disturbed by other processes on the machine), with the median beside it.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from linattn_theory import config_from_dict  # noqa: E402


@dataclass(frozen=True)
class Size:
    """One problem size: ``m`` clients of ``N`` samples, ``n`` tokens of dimension ``d``."""

    name: str
    clients: int
    samples: int
    tokens: int
    dim: int
    rank: int
    outputs: int
    local_steps: int = 10
    heads: int = 1

    def describe(self) -> str:
        return (f"m={self.clients} N_c={self.samples} n={self.tokens} d={self.dim} r={self.rank} "
                f"p={self.outputs} H={self.heads} E={self.local_steps}")

    def context_numbers(self) -> int:
        """Numbers per context in its smaller form: ``n·d`` for ``X`` or ``d(d+1)/2`` for ``Ŝ``."""
        return min(self.tokens * self.dim, self.dim * (self.dim + 1) // 2)

    def step_bytes(self, itemsize: int = 8) -> int:
        """Bytes one local step of all clients must read: each sample's context once, ``q`` and ``y``."""
        per_sample = self.context_numbers() + self.dim + self.outputs
        return self.clients * self.samples * per_sample * itemsize


REFERENCE = Size("reference", clients=32, samples=256, tokens=32, dim=16, rank=16, outputs=4)
LARGER = (
    Size("4x samples", clients=64, samples=512, tokens=32, dim=16, rank=16, outputs=4),
    Size("d=r=32", clients=32, samples=256, tokens=64, dim=32, rank=32, outputs=8),
)


def size_config(size: Size, rounds: int = 1, *, backend: str = "numpy", seed: int = 0,
                learning_rate: float = 0.01, **federated):
    """A planted-kernel FedAvg config of ``size`` (teacher rank 4, default heterogeneity)."""
    fed = {"strategy": "fedavg", "rounds": rounds, "warmup_rounds": 0,
           "local_steps": size.local_steps, "learning_rate": learning_rate}
    fed.update(federated)
    return config_from_dict({
        "seed": seed,
        "task": {"family": "planted_kernel", "num_clients": size.clients,
                 "samples_per_client": size.samples, "tokens": size.tokens, "dim": size.dim,
                 "heads": size.heads, "rank": min(4, size.dim), "outputs": size.outputs},
        "model": {"heads": size.heads, "rank": size.rank, "backend": backend},
        "federated": fed})


def best_times(fns, repeat: int = 5, sync=None) -> list[tuple[float, float]]:
    """``(best, median)`` wall time of each function, timed in turn ``repeat`` times.

    Interleaving the functions exposes them to the same load on a shared machine, so their
    ratio is fairer than that of timings taken one after the other. ``sync()`` (a device
    synchronisation) runs before the clock is read.
    """
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, spent in zip(fns, times):
            start = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            spent.append(time.perf_counter() - start)
    return [(min(t), statistics.median(t)) for t in times]


def best_time(fn, repeat: int = 5, sync=None) -> tuple[float, float]:
    """``(best, median)`` wall time of ``fn()`` over ``repeat`` runs."""
    return best_times([fn], repeat, sync)[0]


def thread_note() -> str:
    import os
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in keys)


def print_table(headers, rows) -> None:
    """A plain Markdown table."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda row: "| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print(line(row))


def relative_difference(a, b) -> float:
    """Largest ``|a − b| / |b|`` (0 where equal) between two run tables, two ``Params`` or two arrays.

    Tables are compared on their numeric columns (their ``stage`` and ``strategy`` columns
    must be equal); ``Params`` block by block.
    """
    if hasattr(a, "columns"):
        labels = ("stage", "strategy")
        assert all(list(a[c]) == list(b[c]) for c in labels), "the tables' stages or strategies differ"
        numeric = [c for c in a.columns if c not in labels]
        a, b = a[numeric].to_numpy(float), b[numeric].to_numpy(float)
    elif hasattr(a, "WV"):
        return max(relative_difference(getattr(a, k), getattr(b, k)) for k in ("WQ", "WK", "WV"))
    a, b = np.asarray(a, float), np.asarray(b, float)
    scale = np.maximum(np.abs(b), np.finfo(float).tiny)
    return float(np.max(np.where(a == b, 0.0, np.abs(a - b) / scale), initial=0.0))


def copier(threads: int, nbytes: int = 1 << 28):
    """A function copying ``nbytes`` into a preallocated buffer on ``threads`` threads; and the bytes moved."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)                                     # touch every page before timing
    bounds = np.linspace(0, src.size, threads + 1).astype(int)
    halves = [(dst[lo:hi], src[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def copy():
        if threads == 1:
            np.copyto(dst, src)
            return
        workers = [threading.Thread(target=np.copyto, args=pair) for pair in halves]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    return copy, 2 * src.nbytes


def interleaved(fns: dict, repeat: int, cpu: dict | None = None) -> dict:
    """``{name: [seconds, ...]}``: every function timed once per pass, ``repeat`` passes.

    ``cpu``, when given, receives the process CPU time of each call (all threads): on a shared
    machine it moves less than the wall time, which includes waiting for a core.
    """
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            if cpu is not None:
                cpu.setdefault(name, []).append(time.process_time() - start_cpu)
    return times


def stats(seconds, scale: float = 1.0) -> str:
    """``median (min–max)`` of ``seconds × scale``."""
    values = [s * scale for s in seconds]
    return f"{statistics.median(values):.3g} ({min(values):.3g}–{max(values):.3g})"
