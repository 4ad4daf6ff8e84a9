"""numba kernels of the fused engine (:mod:`linattn_theory.core.fused`); imported only when it runs.

Each kernel trains (or evaluates) the work items ``lo..hi-1`` one after another — item ``j`` is
client ``part[j]`` of instance ``inst[j]`` of an ensemble (leading instance axis of the data, the
server parameters and the step sizes; one run is an ensemble of one) — all ``E`` local steps of a
client while its data sit in cache. The data are laid out samples-last ("structure of arrays"):
``St`` ``(I, m, d, d, N)`` holds ``Ŝ_i[b, a]`` of the client's ``N`` samples contiguously,
``qt`` ``(I, m, d, N)``, ``yt`` ``(I, m, p, N)``, ``w`` ``(I, m, N)``; so every inner loop runs over
the samples, contiguous and long, which LLVM vectorises without horizontal sums (about twice as
fast at the figures' size as one sample at a time). The closed forms are those of
:func:`linattn_theory.core.model.loss_and_grad_from_moments` (docs/theory.md §1), for all samples at once:

    k_h = K_h^T q,  φ_h = Ŝ k_h,  e = Σ_h (W_V^h)^T φ_h − y,  g_h = Ŝ W_V^h (w e),
    ∇_{W_V^h} = Σ_i w_i φ_h e^T,  ∇_{K_h} = Σ_i w_i q g_h^T,
    ∇_{W_Q^h} = ∇_{K_h} W_K^h,    ∇_{W_K^h} = (∇_{K_h})^T W_Q^h.

Padding samples (weight 0, ``Ŝ = 0``, ``q = y = 0``) contribute exact zeros. Temporaries have
the data's dtype (float32 stays float32); no BLAS is called (no thread pool inside a thread).
Kernels release the GIL: the caller runs chunks of work items on threads. Compiled code is
cached on disk (``cache=True``, in :func:`cache_folder`, outside the package): the first call per
dtype and per ``d ≤ 8`` (one more for all larger ``d``) compiles, later processes load it.

The kernels that read contexts take the dimension as their last argument, :func:`dimension`: up
to :data:`MAX_UNROLLED_DIM` a tuple of ``d`` zeros, whose length is a constant of the code
compiled for it, and the products ``K_h^T q`` and ``Ŝ v`` keep a sample's ``d`` partial sums in
registers, adding their terms in the written order (:func:`_queries`, :func:`_context`; no
reassociation): the same numbers as the row-by-row loops used above it, which load and store
each partial sum once per term (tests: bit for bit).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
try:
    from numba import njit as _numba_njit
    from numba.core import config as _numba_config
except ImportError:     # importable without numba (docs, introspection); the engine then never runs
    _numba_njit = None


def cache_folder() -> Path:
    """Where the compiled kernels are cached: ``$XDG_CACHE_HOME/linattn-theory/numba`` (``~/.cache``
    without it), outside the package, so that neither a source checkout nor a wheel built from it
    holds compiled code; ``NUMBA_CACHE_DIR``, when the user sets it, wins."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "linattn-theory" / "numba"


def njit(**options):
    """numba's ``njit`` whose on-disk cache (``cache=True``) is :func:`cache_folder`: numba picks a
    function's cache folder when it decorates it, from ``numba.config.CACHE_DIR`` (empty: next to
    the source), so the folder is set for the decoration only and the process's setting restored."""
    def decorate(fn):
        if _numba_njit is None:
            return fn
        previous = _numba_config.CACHE_DIR
        _numba_config.CACHE_DIR = previous or str(cache_folder())
        try:
            return _numba_njit(**options)(fn)
        finally:
            _numba_config.CACHE_DIR = previous
    return decorate

#: LLVM may fuse multiply-adds and reorder sums (vectorised reductions); NaN and inf keep their
#: IEEE meaning, so divergence is still detected.
FAST = {"contract", "reassoc"}

#: Sums kept in their written order (multiply-adds fused, as in :data:`FAST`'s row loops).
ORDERED = {"contract"}

#: The largest ``d`` whose context products run sample-vector by sample-vector with the ``d``
#: terms of each sum in registers (:func:`_context`). Measured at the figures' size (``d = 8``)
#: 1.2–1.3× faster per local step (``benchmarks/bench_ensemble.py --sections kernels``); at
#: ``d = 16`` (the reference size) no faster than the row loops (docs/howto/gpu.md §5), which
#: larger ``d`` keep.
MAX_UNROLLED_DIM = 8


def dimension(d: int) -> tuple:
    """The kernels' ``dim`` argument for dimension ``d``: up to :data:`MAX_UNROLLED_DIM` a tuple of
    ``d`` zeros, whose type (and so the compiled code, one per ``d``, cached) carries ``d`` as a
    constant; above it the empty tuple (the row loops, one compiled code for every larger ``d``)."""
    return (0,) * int(d) if int(d) <= MAX_UNROLLED_DIM else ()


def samples_last(S, q, y):
    """``(St, qt, yt)``: the kernels' layout of stacked data ``S`` ``(..., N, d, d)``, ``q``, ``y``."""
    nd = S.ndim
    St = np.ascontiguousarray(np.moveaxis(S, nd - 3, nd - 1))
    qt = np.ascontiguousarray(np.swapaxes(q, -1, -2))
    yt = np.ascontiguousarray(np.swapaxes(y, -1, -2))
    return St, qt, yt


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _kernel_transposes(Q, Kf, KT, zero):
    """``KT[h] = K_h^T = W_K^h (W_Q^h)^T`` for every head."""
    H, d, r = Q.shape
    for h in range(H):
        for b in range(d):
            for a in range(d):
                s = zero
                for c in range(r):
                    s += Kf[h, b, c] * Q[h, a, c]
                KT[h, b, a] = s


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _mix(coef, rows, out):
    """``out[a] = Σ_t coef[a, t] rows[t]`` for every sample (rows ``(T, N)``, out ``(A, N)``)."""
    A, T = coef.shape
    N = rows.shape[1]
    for a in range(A):
        row = out[a]
        for i in range(N):
            row[i] = 0
        for t in range(T):
            c = coef[a, t]
            source = rows[t]
            for i in range(N):
                row[i] += c * source[i]


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _context_product(St, vectors, out):
    """``out_i = Ŝ_i v_i`` of every sample ``i`` (``St`` ``(d, d, N)``, vectors and out ``(d, N)``;
    ``Ŝ_i`` is symmetric, so row ``b`` of ``Ŝ_i v_i`` reads ``St[b, :]``)."""
    d, N = out.shape
    for b in range(d):
        row = out[b]
        for i in range(N):
            row[i] = 0
        for a in range(d):
            sr = St[b, a]
            va = vectors[a]
            for i in range(N):
                row[i] += sr[i] * va[i]


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _queries(KT, qt, out, zero, dim):
    """``out = K_h^T q`` for every sample (``KT`` ``(d, d)``, ``qt`` and ``out`` ``(d, N)``): with
    ``dim = dimension(d)`` non-empty, the ``d`` terms of each sample's sum added in registers, in
    order; with ``dim = ()`` the row loops of :func:`_mix`. The same numbers."""
    if len(dim) == 0:
        _mix(KT, qt, out)
        return
    d = len(dim)
    N = qt.shape[1]
    for a in range(d):
        for i in range(N):
            s = zero
            for t in range(d):
                s += KT[a, t] * qt[t, i]
            out[a, i] = s


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _context(St, vectors, out, zero, dim):
    """``out_i = Ŝ_i v_i`` for every sample: with ``dim = dimension(d)`` non-empty, each sample's
    ``d`` terms added in registers, in order (two rows ``b`` at a time, sharing the loads of ``v``);
    with ``dim = ()`` the row loops of :func:`_context_product`. The same numbers."""
    if len(dim) == 0:
        _context_product(St, vectors, out)
        return
    d = len(dim)
    N = out.shape[1]
    for b in range(0, d - 1, 2):
        for i in range(N):
            s0 = zero
            s1 = zero
            for a in range(d):
                v = vectors[a, i]
                s0 += St[b, a, i] * v
                s1 += St[b + 1, a, i] * v
            out[b, i] = s0
            out[b + 1, i] = s1
    if d % 2:
        b = d - 1
        for i in range(N):
            s = zero
            for a in range(d):
                s += St[b, a, i] * vectors[a, i]
            out[b, i] = s


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _sample_sums(left, right, out, zero):
    """``out[a, b] = Σ_i left[a, i] right[b, i]``, a sum over the samples."""
    A, N = left.shape
    B = right.shape[0]
    for a in range(A):
        la = left[a]
        for b in range(B):
            rb = right[b]
            s = zero
            for i in range(N):
                s += la[i] * rb[i]
            out[a, b] = s


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _product(left, right, out, zero, transpose_left=False):
    """``out = left @ right`` (or ``leftᵀ @ right``) for the small client-level matrices."""
    A, B = out.shape
    inner = right.shape[0]
    for a in range(A):
        for b in range(B):
            s = zero
            for c in range(inner):
                s += (left[c, a] if transpose_left else left[a, c]) * right[c, b]
            out[a, b] = s


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _descend(W, grad, step, ridge):
    """``W ← W − η (grad + λ W)`` in place (``W`` and ``grad`` 2-D, ``λ = 0`` for the kernel's factors)."""
    for a in range(W.shape[0]):
        for b in range(W.shape[1]):
            W[a, b] -= step * (grad[a, b] + ridge * W[a, b])


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _residuals(phi, V, yt, w, ew):
    """``e_w = w (Σ_h (W_V^h)^T φ_h − y)`` of every sample into ``ew`` ``(p, N)``; ``phi`` ``(n, N)``
    with ``V`` ``(n, p)`` (the heads stacked)."""
    _mix(V.T, phi, ew)
    for t in range(ew.shape[0]):
        row = ew[t]
        yr = yt[t]
        for i in range(row.shape[0]):
            row[i] = (row[i] - yr[i]) * w[i]


@njit(cache=True, nogil=True, fastmath=FAST)
def local_steps(St, qt, yt, w, inst, part, lo, hi, WQ, WK, WV, train_q, train_k, train_v, steps, eta,
                lam, outQ, outK, outV, dim):
    """``E`` full-batch local steps of the work items ``lo..hi-1`` from their instance's server
    parameters ``(WQ, WK, WV)[inst[j]]`` (``(I, H, d, r)``), step ``eta[inst[j]]``, ridge ``lam[inst[j]]``.

    Writes item ``j``'s blocks to ``outQ[j]``, ``outK[j]``, ``outV[j]`` (untrained blocks stay
    at the server's values). ``dim``: :func:`dimension` of ``d``.
    """
    H, d, r = WQ.shape[1], WQ.shape[2], WQ.shape[3]
    p = WV.shape[3]
    N = St.shape[4]
    dt = St.dtype
    KT = np.empty((H, d, d), dt)
    kq = np.empty((d, N), dt)
    phi = np.empty((H, d, N), dt)
    ew = np.empty((p, N), dt)
    u = np.empty((d, N), dt)
    g = np.empty((d, N), dt)
    gK = np.empty((d, d), dt)
    gQ = np.empty((d, r), dt)
    gKf = np.empty((d, r), dt)
    gV = np.empty((H, d, p), dt)
    zero = np.zeros(1, dt)[0]                # a zero of the data's dtype
    train_kernel = train_q or train_k
    for j in range(lo, hi):
        s_, c = inst[j], part[j]
        Q, Kf, V = outQ[j], outK[j], outV[j]
        Q[...] = WQ[s_]
        Kf[...] = WK[s_]
        V[...] = WV[s_]
        Sc, qc, yc, wc = St[s_, c], qt[s_, c], yt[s_, c], w[s_, c]
        step, ridge = eta[s_], lam[s_]
        for _ in range(steps):
            _kernel_transposes(Q, Kf, KT, zero)
            for h in range(H):
                _queries(KT[h], qc, kq, zero, dim)        # k_h = K_h^T q
                _context(Sc, kq, phi[h], zero, dim)       # φ_h = Ŝ k_h
            _residuals(phi.reshape(H * d, N), V.reshape(H * d, p), yc, wc, ew)
            for h in range(H):
                if train_v:                      # ∇W_V = Σ_i φ_i e_w^T
                    _sample_sums(phi[h], ew, gV[h], zero)
                if not train_kernel:
                    continue
                _mix(V[h], ew, u)                # u = W_V^h e_w
                _context(Sc, u, g, zero, dim)    # g = Ŝ u
                _sample_sums(qc, g, gK, zero)    # ∇K = Σ_i q g^T
                _product(gK, Kf[h], gQ, zero)    # ∇W_Q = ∇K W_K, ∇W_K = ∇K^T W_Q (this step's factors)
                _product(gK, Q[h], gKf, zero, True)
                if train_q:
                    _descend(Q[h], gQ, step, zero)
                if train_k:
                    _descend(Kf[h], gKf, step, zero)
            if train_v:                          # plus the ridge
                for h in range(H):
                    _descend(V[h], gV[h], step, ridge)


@njit(cache=True, nogil=True, fastmath=FAST)
def frozen_steps(phit, yt, w, inst, part, lo, hi, V0, steps, eta, lam, outV):
    """``E`` local steps of the value block at a frozen kernel, ``ŷ = V^T φ`` (docs/theory.md §5).

    ``phit`` ``(I, m, Hd, N)`` are the frozen features (samples last), ``V0`` ``(I, Hd, p)`` the
    server's value matrices; writes item ``j``'s ``V`` to ``outV[j]`` ``(Hd, p)``.
    """
    n, N = phit.shape[2], phit.shape[3]
    p = V0.shape[2]
    dt = phit.dtype
    ew = np.empty((p, N), dt)
    gV = np.empty((n, p), dt)
    zero = np.zeros(1, dt)[0]
    for j in range(lo, hi):
        s_, c = inst[j], part[j]
        V = outV[j]
        V[...] = V0[s_]
        pc, yc, wc = phit[s_, c], yt[s_, c], w[s_, c]
        step, ridge = eta[s_], lam[s_]
        for _ in range(steps):
            _residuals(pc, V, yc, wc, ew)
            _sample_sums(pc, ew, gV, zero)
            _descend(V, gV, step, ridge)


@njit(cache=True, nogil=True, fastmath=FAST)
def client_losses(St, qt, yt, w, inst, clients, lo, hi, WQ, WK, WV, out, dim):
    """``F_c = Σ_i w_i ½‖ŷ_i − y_i‖²`` of client ``clients[j]`` of instance ``inst[j]`` at that
    instance's parameters (``(I, H, d, r)``), for ``j`` in ``lo..hi-1``, into ``out[j]``
    (``dim``: :func:`dimension` of ``d``)."""
    H, d = WQ.shape[1], WQ.shape[2]
    p = WV.shape[3]
    N = St.shape[4]
    dt = St.dtype
    KT = np.empty((H, d, d), dt)
    kq = np.empty((d, N), dt)
    phi = np.empty((H, d, N), dt)
    e = np.empty((p, N), dt)
    ones = np.ones(N, dt)
    zero = np.zeros(1, dt)[0]
    for j in range(lo, hi):
        s_, c = inst[j], clients[j]
        Sc, qc, yc, wc = St[s_, c], qt[s_, c], yt[s_, c], w[s_, c]
        _kernel_transposes(WQ[s_], WK[s_], KT, zero)
        for h in range(H):
            _queries(KT[h], qc, kq, zero, dim)
            _context(Sc, kq, phi[h], zero, dim)
        _residuals(phi.reshape(H * d, N), WV[s_].reshape(H * d, p), yc, ones, e)
        s = zero
        for t in range(p):
            row = e[t]
            for i in range(N):
                s += wc[i] * row[i] * row[i]
        out[j] = 0.5 * s
