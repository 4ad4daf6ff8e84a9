"""The fused CPU engine: full-batch local steps near the memory floor, clients in parallel.

The Array-API engine of the round loop (:func:`~linattn_theory.sim.rounds.run_ensemble`) runs
each local step as batched products over all clients, streaming every sample's ``Ŝ`` from
memory twice per step. The fused engine runs a client's ``E`` local steps in one numba kernel
(:mod:`linattn_theory.core._fused_kernels`) while its data sit in cache, laid out samples last
so that every inner loop is a long vectorised loop over the samples (for ``8 < d ≤ 16`` in tiles
of 16 samples, whose products hold their partial sums in registers), and runs chunks of work
items — one client of one instance of an ensemble (:mod:`linattn_theory.sim.rounds`; a single
run is an ensemble of one) — on threads (the kernels release the GIL; a call too small to repay
waking a thread, below :data:`PARALLEL_WORK` multiply-adds, on the calling one). It computes the same
closed forms (docs/theory.md §1, §5) in another order of summation: results equal the
Array-API engine's to rounding (tests: ≤ 1e-12 relative in float64), and are bit-identical
whatever the number of threads and whatever else shares the ensemble (each work item is one
thread's work, on its own data).

It applies to NumPy arrays of float32 or float64, full batches, and client rules without a
gradient correction (FedAvg, FedFrozen, FedAvgM, FedAdam, value-frozen, random kernel), for linear
attention (on ``Ŝ``) and softmax attention (on the contexts ``X``, in tiles of samples:
:func:`~linattn_theory.core._fused_kernels.softmax_local_steps`, docs/theory.md §9; with
``engine="auto"`` up to ``n·d =`` :data:`MAX_SOFTMAX_CONTEXT`, ``benchmarks/bench_softmax.py``).
A frozen stage (``W_V`` alone, docs/theory.md §5) runs in moment space: the clients' value moments
``A_c = Σ_i w_i φ_i φ_i^T``, ``B_c = Σ_i w_i φ_i y_i^T`` are computed once per frozen kernel
(:meth:`FusedEngine.value_moments`), and with them each client's ``E`` local steps
``V ← V − η (A_c V − B_c + λ V)`` as one affine map ``V ↦ M_c V + b_c`` (:meth:`FusedEngine.frozen_maps`,
:func:`~linattn_theory.core.frozen_map.frozen_map`): a round then costs ``O((Hd)² p)`` per client,
whatever the number of samples and of local steps (equal to the explicit steps to rounding: tests 1e-13). The tiled and softmax kernels visit
each client's own tiles only (:func:`~linattn_theory.core._fused_kernels.tiles_used`: a client
padded to the largest of its stack skips its padding, bit for bit the same numbers), and compute a
query that all of a client's samples share once per local step
(:func:`~linattn_theory.core._fused_kernels.shared_queries`, the same numbers).
The round engine chooses it (:func:`linattn_theory.sim.rounds.select_engine`): ``engine="auto"``
uses it where it applies, numba is installed and a local step is large enough
(``m·N·d² ≥`` :data:`MIN_STEP_WORK`, one rule for a run alone and an instance of an ensemble);
``"fused"`` forces it (an error says why when it does not apply); ``"array_api"`` never uses
it (the reference, and the GPU path).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["ENGINES", "MIN_STEP_WORK", "MAX_SOFTMAX_CONTEXT", "FusedEngine", "numba_available",
           "default_threads", "set_threads"]

#: Engine names accepted by ``model.engine``, ``--engine`` and ``run_schedule(engine=...)``.
ENGINES = ("auto", "fused", "array_api")

#: ``engine="auto"`` takes the fused engine from this much work per local step of one instance,
#: ``m·N·d²`` (the multiply-adds of one product with every ``Ŝ``), whether the instance runs alone
#: or in an ensemble: one rule, so that ``simulate(config)`` and ``simulate_many([config, …])`` run
#: the same engine. Measured twice (benchmarks/engine_threshold.py, 40 rounds, min of 3, one process
#: on a shared 2-core machine; Array-API ÷ fused time per instance): at ``2¹⁴`` 1.41–1.53 alone and
#: 1.58–1.72 in an ensemble of 8 (7–8 ms saved per run), from ``2¹⁵`` to ``2¹⁹`` 1.02–2.08 and
#: 1.54–1.99, at ``2¹²`` 1.31–1.41 and 1.09–1.30 (2–4 ms saved). Importing numba and loading the
#: cached kernels costs 0.36–0.48 s once per process: from ``2¹⁴`` a few dozen runs repay it (a
#: figure or a sweep makes hundreds); below, a process would need hundreds of runs.
MIN_STEP_WORK = 2**14

#: ``engine="auto"`` runs softmax attention on the fused engine only up to this many numbers per
#: context, ``n·d``: a tile of :data:`~linattn_theory.core._fused_kernels.TILE` samples' contexts
#: (``16·n·d`` float64) then fits a 32 KiB L1 cache, which each local step reads four times per head.
#: Measured (``benchmarks/bench_softmax.py``, one thread, 8 clients of 128 samples, 10 rounds of
#: ``E = 10``; Array-API ÷ fused time, AMD EPYC with 32 KiB of L1 data cache per core): ``n·d = 128``
#: 1.76, ``256`` 1.08–1.28, ``384`` 0.71, ``512`` 0.65 (the reference size, ``n = 32``, ``d = 16``).
MAX_SOFTMAX_CONTEXT = 256

#: A call of the kernels with fewer multiply-adds than this (its work items together, an estimate:
#: :meth:`FusedEngine.sample_work`) runs on one thread. Waking a helper thread and waiting for it costs
#: about 0.1 ms on a 2-core virtual machine, the time of about a million multiply-adds (measured
#: 2026-12-06, Intel Xeon, 8 items of no work: 94 µs per call on two threads, 1.4 µs on one); a run of
#: the figures' size alone (about 3 M per call of its local steps) took 0.89 ms per round on two threads
#: and 0.73 on one, eight of them in one ensemble 0.34 and 0.50 (``docs/howto/gpu.md`` §5, Session 22).
#: Results do not depend on the threads (each work item is one thread's work), so this changes no number.
PARALLEL_WORK = 2**22

_threads: int | None = None
_pools: dict[int, ThreadPoolExecutor] = {}
_compiled: set = set()
_compile_lock = threading.Lock()


def numba_available() -> bool:
    """``True`` when numba is installed (checked without importing it).

    Returns
    -------
    bool
        Whether the fused engine can run.

    Examples
    --------
    >>> from linattn_theory.core.fused import ENGINES, numba_available
    >>> isinstance(numba_available(), bool), ENGINES          # "fused" runs only where numba is installed
    (True, ('auto', 'fused', 'array_api'))
    """
    return importlib.util.find_spec("numba") is not None


def default_threads() -> int:
    """Threads of the fused engine: :func:`set_threads`, else ``LINATTN_THREADS``, else
    ``OMP_NUM_THREADS`` (which joblib sets in its worker processes), else the usable cores
    (at most: a call below :data:`PARALLEL_WORK` multiply-adds runs on one).

    Returns
    -------
    int
        The thread count.

    Examples
    --------
    >>> from linattn_theory.core.fused import default_threads, set_threads
    >>> set_threads(3)
    >>> default_threads()
    3
    >>> set_threads(None)                                        # back to LINATTN_THREADS, OMP_NUM_THREADS or the cores
    >>> default_threads() >= 1
    True
    """
    if _threads is not None:
        return _threads
    for name in ("LINATTN_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_threads(threads: int | None) -> None:
    """Set the fused engine's thread count (``None``: back to :func:`default_threads`'s default).

    Parameters
    ----------
    threads : int or None
        Threads (``≥ 1``), or ``None``.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.core.fused import default_threads, set_threads
    >>> set_threads(2)
    >>> default_threads()
    2
    >>> set_threads(None)
    >>> set_threads(0)
    Traceback (most recent call last):
        ...
    ValueError: threads = 0; expected an integer >= 1 or None
    """
    global _threads
    if threads is not None and (isinstance(threads, bool) or int(threads) != threads or threads < 1):
        raise ValueError(f"threads = {threads!r}; expected an integer >= 1 or None")
    _threads = None if threads is None else int(threads)


if hasattr(os, "register_at_fork"):    # a forked child has none of the parent's pool threads
    os.register_at_fork(after_in_child=_pools.clear)


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _pools:
        _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="linattn-fused")
    return _pools[threads]


def _run_chunks(kernel, count: int, head: tuple, tail: tuple, work: float = float("inf")) -> None:
    """``kernel(*head, lo, hi, *tail)`` over chunks of ``range(count)``, on :func:`default_threads` threads,
    or on this one where the call's ``work`` (multiply-adds, an estimate) is below :data:`PARALLEL_WORK`.

    A few chunks per thread, each claimed by the next thread free (this one among them), balance the
    load on a shared machine.
    """
    start = 0
    key = (kernel.__name__, head[0].dtype.str, tuple(len(a) for a in tail if isinstance(a, tuple)))
    if key not in _compiled and count > 0:
        # the first call of a signature compiles it (or loads it from the disk cache) and binds
        # BLAS: make it on one client, on this thread, before other threads call the kernel
        with _compile_lock:
            kernel(*head, 0, 1, *tail)
            _compiled.add(key)
        start = 1
    threads = min(default_threads(), count - start) if work >= PARALLEL_WORK else 1
    if threads <= 1:
        kernel(*head, start, count, *tail)
        return
    pieces = min(count - start, 4 * threads)
    bounds = np.linspace(start, count, pieces + 1).round().astype(np.int64).tolist()
    waiting = queue.SimpleQueue()       # the pieces not yet claimed (thread-safe)
    for piece in range(pieces):
        waiting.put(piece)

    def claim_pieces():
        while True:
            try:
                piece = waiting.get_nowait()
            except queue.Empty:
                return
            kernel(*head, bounds[piece], bounds[piece + 1], *tail)

    helpers = [_pool(threads - 1).submit(claim_pieces) for _ in range(threads - 1)]
    try:
        claim_pieces()                  # this thread works too: one wake-up fewer
    finally:
        for future in helpers:
            future.result()


class FusedEngine:
    """Fused local training and client losses on stacked clients.

    ``data`` is one run's :class:`~linattn_theory.core.clients.StackedClients` or, with
    ``instances=True``, an ensemble's (every array with a leading instance axis,
    :mod:`linattn_theory.sim.rounds`); one run is handled as an ensemble of one (:meth:`train`
    and :meth:`losses` take the instance axis). With ``sources`` the leading axis holds the distinct
    clients of an ensemble whose instances share them, and instance ``i`` trains on row ``sources[i]``:
    the kernels' layout is made once per distinct data, not once per instance.

    Parameters
    ----------
    data : StackedClients
        The clients (NumPy, float64 or float32).
    instances : bool, default False
        ``data`` holds an ensemble (a leading instance axis).
    sources : array of int, shape (I,), optional
        Each instance's row of ``data`` (default: instance ``i``, row ``i``).
    """

    def __init__(self, data, instances: bool = False, sources=None):
        from . import _fused_kernels
        self.kernels = _fused_kernels
        self.data = data
        self.dtype = np.dtype(data.S.dtype)
        arrays = (data.S, data.q, data.y, data.sample_weight)
        if not instances:
            arrays = tuple(a[None] for a in arrays)
        S, q, y = (np.asarray(a) for a in arrays[:3])
        self.m, d = S.shape[1], S.shape[-1]
        self.samples, self.dim, self.tokens = S.shape[2], d, None     # tokens: n, for softmax attention
        self.sources = np.ascontiguousarray(np.arange(S.shape[0]) if sources is None else sources, dtype=np.int64)
        # the kernels' layout, a copy made once per engine (_fused_kernels): samples last, or
        # for MAX_UNROLLED_DIM < d <= MAX_TILED_DIM tiles of TILE samples (Ŝ as its upper triangle where symmetric)
        self.w = np.ascontiguousarray(arrays[3])
        if getattr(data, "attention", "linear") == "softmax":
            # softmax attention reads the contexts X (I, m, N, n, d), in tiles; its kernels' last
            # arguments are τ, (0,) * d and (0,) * n (compiled per d and n)
            X = np.asarray(data.X if instances else data.X[None])
            self.layout = _fused_kernels.softmax_tiles(X, q, y, self.w)
            self.y = np.ascontiguousarray(np.swapaxes(y, -1, -2))      # the frozen stage's, samples last
            self.steps_kernel = _fused_kernels.softmax_local_steps
            self.loss_kernel = _fused_kernels.softmax_client_losses
            self.trailing = (float(data.temperature), (0,) * d, (0,) * X.shape[-2])
            self.tokens = X.shape[-2]
        elif _fused_kernels.tiled(d):
            self.layout = _fused_kernels.tiles(S, q, y, self.w)
            self.y = np.ascontiguousarray(np.swapaxes(y, -1, -2))      # the frozen stage's, samples last
            self.steps_kernel, self.loss_kernel = _fused_kernels.tiled_local_steps, _fused_kernels.tiled_client_losses
            self.trailing = ((0,) * d,)                                # the kernels are compiled for d
        else:
            St, qt, self.y = _fused_kernels.samples_last(S, q, y)
            self.layout = (St, qt, self.y, self.w)
            self.steps_kernel, self.loss_kernel = _fused_kernels.local_steps, _fused_kernels.client_losses
            self.trailing = (_fused_kernels.dimension(d),)

    def sample_work(self, heads: int, outputs: int) -> int:
        """Multiply-adds of one sample's forward pass, ``H (2d² + dp)`` (``K_h^T q``, ``Ŝ k_h``, ``W_V^T φ``;
        softmax attention ``H (d² + 2nd + dp)``): a local step costs about twice this, a loss once
        (the estimate :func:`_run_chunks` weighs against :data:`PARALLEL_WORK`)."""
        d = self.dim
        context = 2 * d * d if self.tokens is None else d * d + 2 * self.tokens * d
        return heads * (context + d * outputs)

    def _cast(self, a):
        return np.ascontiguousarray(a, dtype=self.dtype)

    def value_moments(self, phi, first: int = 0):
        """The value moments ``(A, B)`` ``(I, m, Hd, Hd)``, ``(I, m, Hd, p)`` of every client of the
        instances ``first..first+I-1`` at their frozen features ``phi`` ``(I, m, N, Hd)``:
        ``A_c = Σ_i w_i φ_i φ_i^T``, ``B_c = Σ_i w_i φ_i y_i^T`` (:func:`train`'s ``moments``; docs/theory.md §4–5)."""
        phit = self._cast(np.swapaxes(np.asarray(phi), -1, -2))
        I, m, n = phit.shape[:3]
        p = self.y.shape[2]
        inst = np.repeat(np.arange(I, dtype=np.int64), m)
        clients = np.tile(np.arange(m, dtype=np.int64), I)
        rows = self.sources[first:first + I]
        A, B = np.empty((I * m, n, n), self.dtype), np.empty((I * m, n, p), self.dtype)
        _run_chunks(self.kernels.value_moment_sums, I * m, (phit, self.y[rows], self.w[rows], inst, clients), (A, B),
                    I * m * phit.shape[-1] * n * (n + p))
        return A.reshape(I, m, n, n), B.reshape(I, m, n, p)

    def frozen_maps(self, moments, steps: int, learning_rate, ridge):
        """Each client's ``E = steps`` local steps at a frozen kernel as the affine map ``V ↦ M_c V + b_c``
        (:func:`~linattn_theory.core.frozen_map.frozen_map`, docs/theory.md §5) of its value moments
        ``(A, B)`` (:meth:`value_moments`, ``(I, m, Hd, Hd)``, ``(I, m, Hd, p)``), with the step sizes
        ``learning_rate`` and ridges ``ridge`` of the ``I`` instances (numbers or ``(I,)``): :meth:`train`'s ``maps``."""
        from .frozen_map import frozen_map

        A, B = (self._cast(a) for a in moments)
        I = A.shape[0]
        eta, lam = (self._per_instance(v, I).reshape(I, 1, 1, 1) for v in (learning_rate, ridge))
        return frozen_map(A, B, eta, int(steps), lam)

    def _per_instance(self, value, count: int):
        return self._cast(np.broadcast_to(np.asarray(value, dtype=self.dtype).reshape(-1), (count,)))

    def train(self, server, blocks, participants, steps: int, learning_rate, ridge, maps=None,
              first: int = 0) -> dict:
        """``{b: θ_{i,c,b}}`` ``(I, k, ...)`` after ``E`` local steps of the participants ``(I, k)``
        of the instances ``first..first+I-1`` from their server parameters ``server`` (blocks
        ``(I, H, d, r)``), step sizes ``learning_rate`` and ridges ``ridge`` (numbers or ``(I,)``).

        With the kernel frozen (``blocks == ("WV",)``) ``maps`` are the clients' affine maps ``(M, b)``
        (:meth:`frozen_maps`, of these ``E``, ``η`` and ``λ``) and each participant's value block is
        ``M_c V + b_c``. Each (instance, client) is one thread's work, so results do not depend on the threads.
        """
        part = np.asarray(participants, dtype=np.int64)
        I, k = part.shape
        inst = np.repeat(np.arange(I, dtype=np.int64), k)
        part = np.ascontiguousarray(part.reshape(-1))
        WQ, WK, WV = (self._cast(getattr(server, b)) for b in ("WQ", "WK", "WV"))
        if maps is not None:
            _, H, d, p = WV.shape
            M, b = maps
            V = WV.reshape(I, H * d, p)
            out = np.matmul(M[inst, part], V[inst]) + b[inst, part]                  # (I·k, Hd, p)
            return {"WV": out.reshape((I, k) + WV.shape[1:])}
        eta, lam = self._per_instance(learning_rate, I), self._per_instance(ridge, I)
        outs = {b: np.empty((I * k,) + a.shape[1:], self.dtype) for b, a in (("WQ", WQ), ("WK", WK), ("WV", WV))}
        work = 2 * I * k * steps * self.samples * self.sample_work(WV.shape[1], WV.shape[3])
        _run_chunks(self.steps_kernel, I * k, self.layout + (inst, self.sources[first:first + I], part),
                    (WQ, WK, WV, "WQ" in blocks, "WK" in blocks, "WV" in blocks, steps, eta, lam,
                     outs["WQ"], outs["WK"], outs["WV"], *self.trailing), work)
        return {b: outs[b].reshape((I, k) + outs[b].shape[1:]) for b in blocks}

    def losses(self, server, first: int = 0) -> np.ndarray:
        """``F_c`` of every client of the instances ``first..first+I-1`` at their ``server``
        parameters (blocks ``(I, H, d, r)``), shape ``(I, m)``."""
        WQ, WK, WV = (self._cast(getattr(server, b)) for b in ("WQ", "WK", "WV"))
        I, m = WQ.shape[0], self.m
        inst = np.repeat(np.arange(I, dtype=np.int64), m)
        clients = np.tile(np.arange(m, dtype=np.int64), I)
        out = np.empty(I * m, self.dtype)
        _run_chunks(self.loss_kernel, I * m, self.layout + (inst, self.sources[first:first + I], clients),
                    (WQ, WK, WV, out, *self.trailing), I * m * self.samples * self.sample_work(WV.shape[1], WV.shape[3]))
        return out.reshape(I, m)
