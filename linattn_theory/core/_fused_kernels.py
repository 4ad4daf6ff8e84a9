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
dtype and per ``d ≤ 16`` (one more for all larger ``d``) compiles, later processes load it.

The kernels that read contexts take the dimension as their last argument, :func:`dimension`: up
to :data:`MAX_UNROLLED_DIM` a tuple of ``d`` zeros, whose length is a constant of the code
compiled for it, and the products ``K_h^T q`` and ``Ŝ v`` keep a sample's ``d`` partial sums in
registers, adding their terms in the written order (:func:`_queries`, :func:`_context`; no
reassociation): the same numbers as the row-by-row loops used above it, which load and store
each partial sum once per term (tests: bit for bit).

From ``d = MAX_UNROLLED_DIM + 1`` to :data:`MAX_TILED_DIM` (the reference size, ``d = 16``) the
engine lays the data out in tiles of :data:`TILE` samples (:func:`tiles`) and runs
:func:`tiled_local_steps` and :func:`tiled_client_losses`, compiled per ``d``: each product of a
tile is register-blocked (four output rows' partial sums held in registers over the tile's
samples, one load of ``Ŝ`` per multiply-add, the loads of the vector shared by the four rows),
a tile's ``Ŝ`` is read from the L2 cache once per local step (``φ_h = Ŝ k_h`` loads it into L1,
``g_h = Ŝ u`` reads it there), and the sums over the samples run in 4 × 4 blocks. The same closed
forms in another order of summation: equal to the row loops to rounding (tests: 1e-13). Larger
``d`` keep the row loops.
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


#: Index type of the tiled kernels: an unsigned index spares numba's wraparound of negative ones,
#: which would keep LLVM from seeing consecutive elements (it would gather them one by one).
_U = np.uint64


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
#: ``d = 16`` (the reference size) no faster than the row loops (docs/howto/gpu.md §5): larger
#: ``d`` up to :data:`MAX_TILED_DIM` run the tiled kernels (:func:`tiled_local_steps`), larger
#: still the row loops.
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
def _work_item(j, inst, part, WQ, WK, WV, outQ, outK, outV, eta, lam):
    """Work item ``j``: ``(instance, client, Q, K, V, step, ridge)``, its blocks ``outQ[j]``,
    ``outK[j]``, ``outV[j]`` set to its instance's server parameters."""
    s_, c = inst[j], part[j]
    Q, Kf, V = outQ[j], outK[j], outV[j]
    Q[...] = WQ[s_]
    Kf[...] = WK[s_]
    V[...] = WV[s_]
    return s_, c, Q, Kf, V, eta[s_], lam[s_]


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _descend_kernel(Q, Kf, gQ, gKf, step, zero, train_q, train_k):
    """One head's kernel factors ``W_Q ← W_Q − η ∇W_Q``, ``W_K ← W_K − η ∇W_K`` (those that train)."""
    if train_q:
        _descend(Q, gQ, step, zero)
    if train_k:
        _descend(Kf, gKf, step, zero)


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
        s_, c, Q, Kf, V, step, ridge = _work_item(j, inst, part, WQ, WK, WV, outQ, outK, outV, eta, lam)
        Sc, qc, yc, wc = St[s_, c], qt[s_, c], yt[s_, c], w[s_, c]
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
                _descend_kernel(Q[h], Kf[h], gQ, gKf, step, zero, train_q, train_k)
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


# ----------------------------------------------------------------------------------------------
# d > MAX_UNROLLED_DIM: the data in tiles of TILE samples, every product register-blocked
# ----------------------------------------------------------------------------------------------
#: Samples per tile of the tiled kernels (four vectors of four float64 per row of a tile).
TILE = 16

#: The largest ``d`` the tiled kernels are compiled for (one code per ``d``, ``dim = (0,) * d``);
#: above it the row loops of :func:`local_steps` (``dim = ()``) are the generic path.
MAX_TILED_DIM = 16


def tiled(d: int) -> bool:
    """Whether dimension ``d`` runs the tiled kernels (:func:`tiles`): ``MAX_UNROLLED_DIM < d ≤ MAX_TILED_DIM``."""
    return MAX_UNROLLED_DIM < int(d) <= MAX_TILED_DIM


def tiles(S, q, y, w):
    """``(St, qt, yt, wt)``: the tiled kernels' layout of stacked data ``S`` ``(..., N, d, d)``,
    ``q`` ``(..., N, d)``, ``y`` ``(..., N, p)``, ``w`` ``(..., N)``.

    The ``N`` samples are cut into ``T = ⌈N / TILE⌉`` tiles of :data:`TILE` samples, the last one
    padded with samples of weight 0 and zero data (which contribute exact zeros); each client's
    data are one flat row: ``St[..., ((t d + b) d + a) TILE + i] = Ŝ_{t TILE + i}[b, a]``,
    ``qt[..., (t d + a) TILE + i]``, ``yt[..., (t p + k) TILE + i]``, ``wt[..., t TILE + i]``, so
    that the kernels index each tile with offsets known when they are compiled.
    """
    S, q, y, w = (np.asarray(a) for a in (S, q, y, w))
    lead, N, d = S.shape[:-3], S.shape[-3], S.shape[-1]
    p = y.shape[-1]
    T = -(-N // TILE)

    def tiled_rows(a, rows):                   # (..., N, rows) -> (..., T * rows * TILE)
        padded = np.zeros(lead + (T * TILE, rows), a.dtype)
        padded[..., :N, :] = a
        blocks = padded.reshape(lead + (T, TILE, rows))
        return np.ascontiguousarray(np.moveaxis(blocks, -2, -1)).reshape(lead + (T * rows * TILE,))

    return (tiled_rows(S.reshape(lead + (N, d * d)), d * d), tiled_rows(q, d), tiled_rows(y, p),
            tiled_rows(w[..., None], 1))


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_queries(KT, qb, qo, out, zero, dim):
    """``out[a TILE + i] = Σ_t KT[a, t] qb[qo + t TILE + i]`` (``k = K_h^T q`` of one tile), four
    rows ``a`` at a time sharing the loads of ``q``, each sum in registers, in order."""
    d = len(dim)
    for a in range(0, d - 3, 4):
        for i in range(TILE):
            s0 = zero
            s1 = zero
            s2 = zero
            s3 = zero
            for t in range(d):
                v = qb[_U(qo + t * TILE + i)]
                s0 += KT[a, t] * v
                s1 += KT[a + 1, t] * v
                s2 += KT[a + 2, t] * v
                s3 += KT[a + 3, t] * v
            out[_U(a * TILE + i)] = s0
            out[_U((a + 1) * TILE + i)] = s1
            out[_U((a + 2) * TILE + i)] = s2
            out[_U((a + 3) * TILE + i)] = s3
    for a in range(d - d % 4, d):
        for i in range(TILE):
            s = zero
            for t in range(d):
                s += KT[a, t] * qb[_U(qo + t * TILE + i)]
            out[_U(a * TILE + i)] = s


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_context(Sb, so, vec, out, oo, zero, dim):
    """``out[oo + b TILE + i] = Σ_a Ŝ_i[b, a] vec[a TILE + i]`` (``Ŝ v`` of one tile, ``Ŝ`` at
    ``Sb[so:]``): four rows ``b`` at a time, each multiply-add loading one element of ``Ŝ``, the
    loads of ``v`` shared by the four rows, each sum in registers, in order."""
    d = len(dim)
    for b in range(0, d - 3, 4):
        for i in range(TILE):
            s0 = zero
            s1 = zero
            s2 = zero
            s3 = zero
            for a in range(d):
                v = vec[_U(a * TILE + i)]
                s0 += Sb[_U(so + (b * d + a) * TILE + i)] * v
                s1 += Sb[_U(so + ((b + 1) * d + a) * TILE + i)] * v
                s2 += Sb[_U(so + ((b + 2) * d + a) * TILE + i)] * v
                s3 += Sb[_U(so + ((b + 3) * d + a) * TILE + i)] * v
            out[_U(oo + b * TILE + i)] = s0
            out[_U(oo + (b + 1) * TILE + i)] = s1
            out[_U(oo + (b + 2) * TILE + i)] = s2
            out[_U(oo + (b + 3) * TILE + i)] = s3
    for b in range(d - d % 4, d):
        for i in range(TILE):
            s = zero
            for a in range(d):
                s += Sb[_U(so + (b * d + a) * TILE + i)] * vec[_U(a * TILE + i)]
            out[_U(oo + b * TILE + i)] = s


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_residuals(VT, phib, po, yb, wb, to, eb, eo, zero, dim):
    """``e_w = w (Σ_h (W_V^h)^T φ_h − y)`` of one tile into ``eb[eo:]``: ``VT`` ``(p, H d)`` holds
    the stacked ``W_V^T``, the heads' features ``phib[po + (h d + a) TILE + i]``; four outputs at
    a time, each head's ``d`` terms in registers, the heads' partial sums through ``eb``."""
    d = len(dim)
    p = VT.shape[0]
    H = VT.shape[1] // d
    for k in range(0, p - 3, 4):
        for h in range(H):
            hb = po + h * d * TILE
            for i in range(TILE):
                if h == 0:
                    s0 = zero
                    s1 = zero
                    s2 = zero
                    s3 = zero
                else:
                    s0 = eb[_U(eo + k * TILE + i)]
                    s1 = eb[_U(eo + (k + 1) * TILE + i)]
                    s2 = eb[_U(eo + (k + 2) * TILE + i)]
                    s3 = eb[_U(eo + (k + 3) * TILE + i)]
                for a in range(d):
                    v = phib[_U(hb + a * TILE + i)]
                    s0 += VT[k, h * d + a] * v
                    s1 += VT[k + 1, h * d + a] * v
                    s2 += VT[k + 2, h * d + a] * v
                    s3 += VT[k + 3, h * d + a] * v
                eb[_U(eo + k * TILE + i)] = s0
                eb[_U(eo + (k + 1) * TILE + i)] = s1
                eb[_U(eo + (k + 2) * TILE + i)] = s2
                eb[_U(eo + (k + 3) * TILE + i)] = s3
    for k in range(p - p % 4, p):
        for h in range(H):
            hb = po + h * d * TILE
            for i in range(TILE):
                s = zero if h == 0 else eb[_U(eo + k * TILE + i)]
                for a in range(d):
                    s += VT[k, h * d + a] * phib[_U(hb + a * TILE + i)]
                eb[_U(eo + k * TILE + i)] = s
    for k in range(p):
        for i in range(TILE):
            e = eo + k * TILE + i
            eb[_U(e)] = (eb[_U(e)] - yb[_U(e)]) * wb[_U(to + i)]


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_mix(coef, src, so, out):
    """``out[a TILE + i] = Σ_t coef[a, t] src[so + t TILE + i]`` (``u = W_V^h e_w`` of one tile; row loops)."""
    A, T = coef.shape
    for a in range(A):
        for i in range(TILE):
            out[_U(a * TILE + i)] = 0
        for t in range(T):
            c = coef[a, t]
            for i in range(TILE):
                out[_U(a * TILE + i)] += c * src[_U(so + t * TILE + i)]


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_sums(left, ls, lo, right, rs, ro, T, out, zero):
    """``out[a, b] = Σ_t Σ_i left[t ls + lo + a TILE + i] right[t rs + ro + b TILE + i]``, a sum
    over the samples of ``T`` tiles (rows of tile ``t`` at ``t ls + lo`` and ``t rs + ro``): blocks
    of 4 × 4 sums in registers, eight loads for sixteen multiply-adds; the rows and columns left
    over one sum at a time."""
    A, B = out.shape
    A4, B4 = A - A % 4, B - B % 4
    for a in range(0, A4, 4):
        for b in range(0, B4, 4):
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
            s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
            for t in range(T):
                lb = t * ls + lo + a * TILE
                rb = t * rs + ro + b * TILE
                for i in range(TILE):
                    l0 = left[_U(lb + i)]
                    l1 = left[_U(lb + TILE + i)]
                    l2 = left[_U(lb + 2 * TILE + i)]
                    l3 = left[_U(lb + 3 * TILE + i)]
                    r0 = right[_U(rb + i)]
                    r1 = right[_U(rb + TILE + i)]
                    r2 = right[_U(rb + 2 * TILE + i)]
                    r3 = right[_U(rb + 3 * TILE + i)]
                    s00 += l0 * r0
                    s01 += l0 * r1
                    s02 += l0 * r2
                    s03 += l0 * r3
                    s10 += l1 * r0
                    s11 += l1 * r1
                    s12 += l1 * r2
                    s13 += l1 * r3
                    s20 += l2 * r0
                    s21 += l2 * r1
                    s22 += l2 * r2
                    s23 += l2 * r3
                    s30 += l3 * r0
                    s31 += l3 * r1
                    s32 += l3 * r2
                    s33 += l3 * r3
            out[a, b], out[a, b + 1], out[a, b + 2], out[a, b + 3] = s00, s01, s02, s03
            out[a + 1, b], out[a + 1, b + 1], out[a + 1, b + 2], out[a + 1, b + 3] = s10, s11, s12, s13
            out[a + 2, b], out[a + 2, b + 1], out[a + 2, b + 2], out[a + 2, b + 3] = s20, s21, s22, s23
            out[a + 3, b], out[a + 3, b + 1], out[a + 3, b + 2], out[a + 3, b + 3] = s30, s31, s32, s33
    for a in range(A):
        for b in range(B):
            if a < A4 and b < B4:
                continue
            s = zero
            for t in range(T):
                lb = t * ls + lo + a * TILE
                rb = t * rs + ro + b * TILE
                for i in range(TILE):
                    s += left[_U(lb + i)] * right[_U(rb + i)]
            out[a, b] = s


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _rows_product(left, right, out, zero, transpose_left=False):
    """``out = left @ right`` (or ``leftᵀ @ right``) for the small client-level matrices, row by
    row: ``out[a, :] = Σ_c left[a, c] right[c, :]``, a long contiguous inner loop."""
    A, B = out.shape
    for a in range(A):
        for b in range(B):
            out[a, b] = zero
        for c in range(right.shape[0]):
            x = left[c, a] if transpose_left else left[a, c]
            for b in range(B):
                out[a, b] += x * right[c, b]


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _tile_features(Sb, qb, t, KT, VT, yb, wb, kq, phib, eb, zero, dim):
    """Tile ``t``'s features ``φ_h = Ŝ K_h^T q`` of every head into ``phib`` and its weighted
    residuals ``w (Σ_h (W_V^h)^T φ_h − y)`` into ``eb`` (the first half of a local step)."""
    d = len(dim)
    H, p = KT.shape[0], VT.shape[0]
    for h in range(H):
        _tile_queries(KT[h], qb, t * d * TILE, kq, zero, dim)
        _tile_context(Sb, t * d * d * TILE, kq, phib, (t * H + h) * d * TILE, zero, dim)
    _tile_residuals(VT, phib, t * H * d * TILE, yb, wb, t * TILE, eb, t * p * TILE, zero, dim)


@njit(cache=True, nogil=True, fastmath=FAST)
def tiled_local_steps(St, qt, yt, w, inst, part, lo, hi, WQ, WK, WV, train_q, train_k, train_v, steps,
                      eta, lam, outQ, outK, outV, dim):
    """:func:`local_steps` on the tiled layout (:func:`tiles`), ``dim = (0,) * d``: the same
    closed forms, tile by tile: each tile's features, residuals and ``g_h = Ŝ W_V^h e_w`` while
    its ``Ŝ`` sits in the L1 cache, then the sums over the samples, ``∇W_V`` and ``∇K_h``."""
    H, d, r = WQ.shape[1], WQ.shape[2], WQ.shape[3]
    p = WV.shape[3]
    T = w.shape[2] // TILE
    dt = St.dtype
    KT = np.empty((H, d, d), dt)
    VT = np.empty((p, H * d), dt)
    QT = np.empty((r, d), dt)
    kq = np.empty(d * TILE, dt)
    u = np.empty(d * TILE, dt)
    phib = np.empty(T * H * d * TILE, dt)
    eb = np.empty(T * p * TILE, dt)
    gb = np.empty(T * H * d * TILE, dt)
    gK = np.empty((d, d), dt)
    gQ = np.empty((d, r), dt)
    gKf = np.empty((d, r), dt)
    gV = np.empty((H, d, p), dt)
    zero = np.zeros(1, dt)[0]
    train_kernel = train_q or train_k
    for j in range(lo, hi):
        s_, c, Q, Kf, V, step, ridge = _work_item(j, inst, part, WQ, WK, WV, outQ, outK, outV, eta, lam)
        Sb, qb, yb, wb = St[s_, c], qt[s_, c], yt[s_, c], w[s_, c]
        for _ in range(steps):
            for h in range(H):                           # K_h^T = W_K^h (W_Q^h)^T, and W_V^T
                QT[...] = Q[h].T
                _rows_product(Kf[h], QT, KT[h], zero)
                for a in range(d):
                    for k in range(p):
                        VT[k, h * d + a] = V[h, a, k]
            for t in range(T):
                _tile_features(Sb, qb, t, KT, VT, yb, wb, kq, phib, eb, zero, dim)
                if train_kernel:
                    for h in range(H):                   # g_h = Ŝ u, u = W_V^h e_w
                        _tile_mix(V[h], eb, t * p * TILE, u)
                        _tile_context(Sb, t * d * d * TILE, u, gb, (t * H + h) * d * TILE, zero, dim)
            for h in range(H):
                if train_v:                              # ∇W_V = Σ_i φ_i e_w^T
                    _tile_sums(phib, H * d * TILE, h * d * TILE, eb, p * TILE, 0, T, gV[h], zero)
                if not train_kernel:
                    continue
                _tile_sums(qb, d * TILE, 0, gb, H * d * TILE, h * d * TILE, T, gK, zero)   # ∇K = Σ_i q g^T
                _rows_product(gK, Kf[h], gQ, zero)
                _rows_product(gK, Q[h], gKf, zero, True)
                _descend_kernel(Q[h], Kf[h], gQ, gKf, step, zero, train_q, train_k)
            if train_v:
                for h in range(H):
                    _descend(V[h], gV[h], step, ridge)


@njit(cache=True, nogil=True, fastmath=FAST)
def tiled_client_losses(St, qt, yt, w, inst, clients, lo, hi, WQ, WK, WV, out, dim):
    """:func:`client_losses` on the tiled layout (:func:`tiles`), ``dim = (0,) * d``."""
    H, d = WQ.shape[1], WQ.shape[2]
    p = WV.shape[3]
    T = w.shape[2] // TILE
    dt = St.dtype
    KT = np.empty((H, d, d), dt)
    VT = np.empty((p, H * d), dt)
    kq = np.empty(d * TILE, dt)
    phib = np.empty(T * H * d * TILE, dt)
    e = np.empty(T * p * TILE, dt)
    ones = np.ones(T * TILE, dt)
    zero = np.zeros(1, dt)[0]
    for j in range(lo, hi):
        s_, c = inst[j], clients[j]
        Sb, qb, yb, wb = St[s_, c], qt[s_, c], yt[s_, c], w[s_, c]
        _kernel_transposes(WQ[s_], WK[s_], KT, zero)
        for h in range(H):
            for a in range(d):
                for k in range(p):
                    VT[k, h * d + a] = WV[s_, h, a, k]
        for t in range(T):
            _tile_features(Sb, qb, t, KT, VT, yb, ones, kq, phib, e, zero, dim)
        s = zero
        for t in range(T):
            for k in range(p):
                for i in range(TILE):
                    v = e[(t * p + k) * TILE + i]
                    s += wb[t * TILE + i] * v * v
        out[j] = 0.5 * s
