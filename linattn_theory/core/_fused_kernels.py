"""numba kernels of the fused engine (:mod:`linattn_theory.core.fused`); imported only when it runs.

Each kernel trains (or evaluates) the work items ``lo..hi-1`` one after another — item ``j`` is
client ``part[j]`` of instance ``inst[j]`` of an ensemble (leading instance axis of the server
parameters and the step sizes; one run is an ensemble of one), whose data are row ``src[inst[j]]`` of
the data's leading axis (instances that share their clients share one row) — all ``E`` local steps of a
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
tile is register-blocked (output rows' partial sums held in registers over the tile's samples);
``Ŝ``, symmetric, is kept as its upper triangle, and ``Ŝ v`` is unrolled per ``d`` with all ``d`` sums
of a sample in registers, each element of ``Ŝ`` loaded once for two multiply-adds and every sum in
its written order (:func:`_tile_symmetric`: the numbers of the whole matrix's product, bit for bit);
a tile's ``Ŝ`` is read from the L2 cache once per local step (``φ_h = Ŝ k_h`` loads it into L1,
``g_h = Ŝ u`` reads it there), and the sums over the samples run in 4 × 4 blocks. The same closed
forms in another order of summation: equal to the row loops to rounding (tests: 1e-13). Larger
``d`` keep the row loops. Where a client's samples share one query (:func:`shared_queries`; ``digits``'
fixed ``1/√d``), the tiled and softmax kernels compute ``K_h^T q`` once per local step instead of once
per sample, the same sum (tests: bit for bit). Their ``u = W_V^h e_w`` (:func:`_tile_mix`) adds four
terms at a time to four rows' partial sums held in registers, in order: bit for bit the row loops that
add one term at a time, which load and store every partial sum once per term (3.8× slower at ``digits``'
``d = 16``, ``p = 10``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
try:
    import numba as _numba
    from numba import njit as _numba_njit
    from numba.core import config as _numba_config
except ImportError:     # importable without numba (docs, introspection); the engine then never runs
    _numba = _numba_njit = None


#: Index type of the tiled kernels: an unsigned index spares numba's wraparound of negative ones,
#: which would keep LLVM from seeing consecutive elements (it would gather them one by one).
_U = np.uint64


def cache_folder() -> Path:
    """Where the compiled kernels are cached: ``$XDG_CACHE_HOME/linattn-theory/numba/<numba version>``
    (``~/.cache`` without it), outside the package, so that neither a source checkout nor a wheel built
    from it holds compiled code; ``NUMBA_CACHE_DIR``, when the user sets it, wins. One folder per numba
    release: numba discards an index another release wrote, so two environments that shared one folder
    recompiled each other's kernels (38 s more of the full set's script time after a run under numba 0.62)."""
    version = getattr(_numba, "__version__", "none")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "linattn-theory" / "numba" / version


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
def local_steps(St, qt, yt, w, inst, src, part, lo, hi, WQ, WK, WV, train_q, train_k, train_v, steps, eta,
                lam, outQ, outK, outV, dim):
    """``E`` full-batch local steps of the work items ``lo..hi-1`` from their instance's server
    parameters ``(WQ, WK, WV)[inst[j]]`` (``(I, H, d, r)``), step ``eta[inst[j]]``, ridge ``lam[inst[j]]``,
    on client ``part[j]`` of data row ``src[inst[j]]``.

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
        r_ = src[s_]                             # the instance's data
        Sc, qc, yc, wc = St[r_, c], qt[r_, c], yt[r_, c], w[r_, c]
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
def value_moment_sums(phit, yt, w, inst, clients, lo, hi, A, B):
    """The value moments of the work items ``lo..hi-1`` at their frozen kernels (docs/theory.md §4–5):
    ``A[j] = Σ_i w_i φ_i φ_i^T`` ``(Hd, Hd)`` and ``B[j] = Σ_i w_i φ_i y_i^T`` ``(Hd, p)`` of client
    ``clients[j]`` of instance ``inst[j]``; ``phit`` ``(I, m, Hd, N)`` are the features samples last."""
    n, N = phit.shape[2], phit.shape[3]
    p = yt.shape[2]
    dt = phit.dtype
    wphi = np.empty((n, N), dt)
    wy = np.empty((p, N), dt)
    zero = np.zeros(1, dt)[0]
    for j in range(lo, hi):
        s_, c = inst[j], clients[j]
        pc, yc, wc = phit[s_, c], yt[s_, c], w[s_, c]
        for a in range(n):
            for i in range(N):
                wphi[a, i] = wc[i] * pc[a, i]
        for k in range(p):
            for i in range(N):
                wy[k, i] = wc[i] * yc[k, i]
        _sample_sums(pc, wphi, A[j], zero)
        _sample_sums(pc, wy, B[j], zero)


@njit(cache=True, nogil=True, fastmath=FAST)
def client_losses(St, qt, yt, w, inst, src, clients, lo, hi, WQ, WK, WV, out, dim):
    """``F_c = Σ_i w_i ½‖ŷ_i − y_i‖²`` of client ``clients[j]`` of instance ``inst[j]`` (data row
    ``src[inst[j]]``) at that instance's parameters (``(I, H, d, r)``), for ``j`` in ``lo..hi-1``, into ``out[j]``
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
        r_ = src[s_]                             # the instance's data
        Sc, qc, yc, wc = St[r_, c], qt[r_, c], yt[r_, c], w[r_, c]
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


def _tiled_rows(a, rows: int, T: int):
    """``a`` ``(..., N, rows)`` → ``(..., T * rows * TILE)``: ``T`` tiles of :data:`TILE` samples, the
    last padded with zeros, each tile's rows one after another (:func:`tiles`)."""
    lead, N = a.shape[:-2], a.shape[-2]
    padded = np.zeros(lead + (T * TILE, rows), a.dtype)
    padded[..., :N, :] = a
    blocks = padded.reshape(lead + (T, TILE, rows))
    return np.ascontiguousarray(np.moveaxis(blocks, -2, -1)).reshape(lead + (T * rows * TILE,))


def tiles_used(w):
    """Tiles of :data:`TILE` samples each client's kernels visit, ``⌈(i_c + 1) / TILE⌉`` with ``i_c``
    its last sample of nonzero weight (``0`` for a client without any), shape ``w.shape[:-1]``.

    The samples past ``i_c`` are the padding of a client smaller than the largest of its stack
    (:class:`~linattn_theory.core.clients.StackedClients`; or weight-0 samples): their terms in every
    sum are exact zeros, so skipping them leaves the results bit for bit as they are and spares their
    work (a label-skewed split pads its clients to the largest one's size: ``digits`` at
    ``α = 0.1``, twice the samples there are).

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core._fused_kernels import tiles_used
    >>> tiles_used(np.array([[1.0] * 40, [1.0] * 16 + [0.0] * 24, [0.0] * 40])).tolist()
    [3, 1, 0]
    """
    w = np.asarray(w)
    nonzero = w != 0
    last = w.shape[-1] - np.argmax(nonzero[..., ::-1], axis=-1)
    return np.ascontiguousarray(np.where(nonzero.any(axis=-1), -(-last // TILE), 0), dtype=np.int64)


def shared_queries(q, w):
    """``(q0, shared)``: each client's query ``q0`` ``(..., d)`` and whether all its samples of nonzero
    weight ask it, ``shared`` ``(...)`` (``q`` ``(..., N, d)``, ``w`` ``(..., N)``).

    Where they do (``digits``: the fixed query ``1/√d``), ``k_h = K_h^T q`` is one vector per client and
    step, computed once instead of once per sample (:func:`_shared_query_tiles`: the same sum, so the same
    numbers). A sample of weight 0 adds nothing to the gradients whatever its query (its residual
    ``e_w`` is 0, and so is its ``g_h``), nor to the loss. A client without samples of nonzero weight
    shares the zero query. (``∇K_h = Σ_i q g_h^T`` keeps its sum over the samples: ``q (Σ_i g_h)^T``
    would be 4 % faster at ``digits``' size, but not the same numbers.)

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core._fused_kernels import shared_queries
    >>> q = np.array([[[0.5, 0.5], [0.5, 0.5], [0.0, 0.0]], [[0.5, 0.5], [1.0, 0.5], [0.5, 0.5]]])
    >>> q0, shared = shared_queries(q, np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    >>> q0.tolist(), shared.tolist()
    ([[0.5, 0.5], [0.5, 0.5]], [True, False])
    """
    q, w = np.asarray(q), np.asarray(w)
    nonzero = w != 0
    first = np.argmax(nonzero, axis=-1)
    q0 = np.take_along_axis(q, first[..., None, None], axis=-2)[..., 0, :]
    q0 = np.where(nonzero.any(axis=-1)[..., None], q0, 0).astype(q.dtype)
    shared = np.all((q == q0[..., None, :]).all(axis=-1) | ~nonzero, axis=-1)
    return np.ascontiguousarray(q0), np.ascontiguousarray(shared)


def symmetric_rows(S):
    """Whether every ``Ŝ`` of ``S`` ``(..., d, d)`` equals its transpose bit for bit (``X^T X / n`` does:
    the products of ``Ŝ[a, b]`` and ``Ŝ[b, a]`` are the same, added in the same order)."""
    return bool(np.array_equal(S, np.swapaxes(S, -1, -2)))


def tiles(S, q, y, w):
    """``(St, qt, yt, wt, used, q0, shared, symmetric)``: the tiled kernels' layout of stacked data ``S``
    ``(..., N, d, d)``, ``q`` ``(..., N, d)``, ``y`` ``(..., N, p)``, ``w`` ``(..., N)``, each client's tiles
    (:func:`tiles_used`), its shared query, if any (:func:`shared_queries`), and whether ``St`` holds only
    the upper triangles (:func:`symmetric_rows`).

    The ``N`` samples are cut into ``T = ⌈N / TILE⌉`` tiles of :data:`TILE` samples, the last one
    padded with samples of weight 0 and zero data (which contribute exact zeros); each client's
    data are one flat row: ``qt[..., (t d + a) TILE + i]``, ``yt[..., (t p + k) TILE + i]``,
    ``wt[..., t TILE + i]``, so that the kernels index each tile with offsets known when they are
    compiled. Where every ``Ŝ`` is symmetric (``X^T X / n`` is, bit for bit), ``St`` holds its upper
    triangle row by row, ``St[..., (t D + k(b, a)) TILE + i] = Ŝ_{t TILE + i}[b, a]`` for ``a ≥ b``
    (``D = d (d + 1) / 2``, ``k`` counting the pairs ``(b, a)`` in that order; :func:`_tile_symmetric`):
    about half the data, each element loaded once for two multiply-adds. Otherwise the whole of
    each ``Ŝ``, ``St[..., ((t d + b) d + a) TILE + i]`` (:func:`_tile_context`).

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.core._fused_kernels import TILE, tiles
    >>> X = np.random.default_rng(0).normal(size=(1, 2, 20, 5, 9))        # 2 clients of 20 samples, d = 9
    >>> S = np.swapaxes(X, -1, -2) @ X / 5
    >>> layout = tiles(S, X[..., 0, :], X[..., 0, :2], np.ones((1, 2, 20)))
    >>> layout[0].shape == (1, 2, 2 * 45 * TILE), layout[-1]              # two tiles of 45 = 9 · 10 / 2
    (True, True)
    >>> tiles(S + np.triu(np.full((9, 9), 1e-9), 1), X[..., 0, :], X[..., 0, :2], np.ones((1, 2, 20)))[-1]
    False
    """
    S, q, y, w = (np.asarray(a) for a in (S, q, y, w))
    lead, N, d = S.shape[:-3], S.shape[-3], S.shape[-1]
    T = -(-N // TILE)
    symmetric = symmetric_rows(S)
    if symmetric:
        upper = np.triu_indices(d)
        St = _tiled_rows(S[..., upper[0], upper[1]], len(upper[0]), T)
    else:
        St = _tiled_rows(S.reshape(lead + (N, d * d)), d * d, T)
    return ((St, _tiled_rows(q, d, T), _tiled_rows(y, y.shape[-1], T), _tiled_rows(w[..., None], 1, T),
             tiles_used(w)) + shared_queries(q, w) + (symmetric,))


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
def _queries_of_tiles(KT, qb, q0, shared, t, kq, zero, dim):
    """``kq[h] = K_h^T q`` of tile ``t``'s samples for every head (``kq`` ``(H, d TILE)``): per sample
    (:func:`_tile_queries`), or, where the client's samples share the query ``q0`` (:func:`shared_queries`),
    nothing: :func:`_shared_query_tiles` filled ``kq`` for the whole step."""
    if shared:
        return
    for h in range(KT.shape[0]):
        _tile_queries(KT[h], qb, t * len(dim) * TILE, kq[h], zero, dim)


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _shared_query_tiles(KT, q0, shared, kq, zero):
    """Where a client's samples share the query ``q0``: ``kq[h, a TILE + i] = Σ_t KT[h, a, t] q0[t]`` for
    every sample ``i`` of a tile, the sum of :func:`_tile_queries` in its order (the same numbers), once per step."""
    if not shared:
        return
    H, d = KT.shape[0], KT.shape[1]
    for h in range(H):
        for a in range(d):
            s = zero
            for t in range(d):
                s += KT[h, a, t] * q0[t]
            for i in range(TILE):
                kq[h, a * TILE + i] = s


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_rows(Mb, mo, vec, out, oo, zero, rows, cols):
    """``out[oo + b TILE + i] = Σ_a M_i[b, a] vec[a TILE + i]`` (``M v`` of one tile, ``M`` ``(R, C)``
    at ``Mb[mo:]``, ``R = len(rows)``, ``C = len(cols)``): four rows ``b`` at a time, each
    multiply-add loading one element of ``M``, the loads of ``v`` shared by the four rows, each
    sum in registers, in order."""
    R, C = len(rows), len(cols)
    for b in range(0, R - 3, 4):
        for i in range(TILE):
            s0 = zero
            s1 = zero
            s2 = zero
            s3 = zero
            for a in range(C):
                v = vec[_U(a * TILE + i)]
                s0 += Mb[_U(mo + (b * C + a) * TILE + i)] * v
                s1 += Mb[_U(mo + ((b + 1) * C + a) * TILE + i)] * v
                s2 += Mb[_U(mo + ((b + 2) * C + a) * TILE + i)] * v
                s3 += Mb[_U(mo + ((b + 3) * C + a) * TILE + i)] * v
            out[_U(oo + b * TILE + i)] = s0
            out[_U(oo + (b + 1) * TILE + i)] = s1
            out[_U(oo + (b + 2) * TILE + i)] = s2
            out[_U(oo + (b + 3) * TILE + i)] = s3
    for b in range(R - R % 4, R):
        for i in range(TILE):
            s = zero
            for a in range(C):
                s += Mb[_U(mo + (b * C + a) * TILE + i)] * vec[_U(a * TILE + i)]
            out[_U(oo + b * TILE + i)] = s


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_context(Sb, so, vec, out, oo, zero, dim):
    """``out[oo + b TILE + i] = Σ_a Ŝ_i[b, a] vec[a TILE + i]`` (``Ŝ v`` of one tile, ``Ŝ`` at
    ``Sb[so:]``): :func:`_tile_rows` with ``M = Ŝ``."""
    _tile_rows(Sb, so, vec, out, oo, zero, dim, dim)


def _tile_symmetric(Pb, po, vec, out, oo, zero, dim):
    """``out[oo + b TILE + i] = Σ_a Ŝ_i[b, a] vec[a TILE + i]`` (``Ŝ v`` of one tile) from its upper
    triangle ``Pb[po + k TILE + i]``, ``k`` counting the pairs ``(b, a ≥ b)`` row by row (:func:`tiles`).

    Each element serves ``Ŝ[b, a] v_a`` and ``Ŝ[a, b] v_b``: half the loads of :func:`_tile_context`.
    The triangle taken row by row, every output's terms still arrive in the order ``a = 0, …, d − 1``
    (row ``b`` gives output ``a > b`` its term ``b``, then output ``b`` its terms ``b, …, d − 1``): for a
    symmetric ``Ŝ``, the numbers of :func:`_tile_context`, bit for bit (tests). This body is the
    reference; numba compiles, per ``d``, the same loops unrolled (:func:`_symmetric_tile_product`), each
    sample's ``d`` partial sums and ``d`` vector elements in registers, the samples in vector lanes."""
    d = len(dim)
    for i in range(TILE):
        sums = [zero] * d
        k = po + i
        for b in range(d):
            for a in range(b, d):
                m = Pb[k]
                sums[b] += m * vec[a * TILE + i]
                if a != b:
                    sums[a] += m * vec[b * TILE + i]
                k += TILE
        for b in range(d):
            out[oo + b * TILE + i] = sums[b]


def _symmetric_tile_source(d: int) -> str:
    """The source of :func:`_tile_symmetric` for dimension ``d`` with its loops over ``b`` and ``a``
    unrolled: the partial sums ``s0 … s{d-1}`` and vector elements ``v0 … v{d-1}`` named, every index
    a constant plus the sample's (unsigned: :data:`_U`)."""
    lines = ["def product(Pb, po, vec, out, oo, zero, dim):",
             "    for i in range(TILE):",
             "        ip, iv, io = _U(po + i), _U(i), _U(oo + i)"]
    lines += [f"        v{a} = vec[iv + _U({a * TILE})]" for a in range(d)]
    lines += [f"        s{a} = zero" for a in range(d)]
    k = 0
    for b in range(d):
        for a in range(b, d):
            lines.append(f"        m = Pb[ip + _U({k * TILE})]")
            lines.append(f"        s{b} += m * v{a}")
            if a != b:
                lines.append(f"        s{a} += m * v{b}")
            k += 1
    lines += [f"        out[io + _U({b * TILE})] = s{b}" for b in range(d)]
    return "\n".join(lines) + "\n"


def _symmetric_tile_product(d: int):
    """:func:`_tile_symmetric` for dimension ``d``, compiled from :func:`_symmetric_tile_source`."""
    namespace = {"TILE": TILE, "_U": _U}
    exec(compile(_symmetric_tile_source(d), f"<_tile_symmetric, d = {d}>", "exec"), namespace)
    return namespace["product"]


if _numba is not None:
    from numba.extending import overload as _overload

    @_overload(_tile_symmetric, jit_options={"fastmath": ORDERED, "nogil": True})
    def _tile_symmetric_for_d(Pb, po, vec, out, oo, zero, dim):
        """numba's :func:`_tile_symmetric`: the unrolled code of ``d = len(dim)``."""
        return _symmetric_tile_product(dim.count)


@njit(cache=True, nogil=True, fastmath=ORDERED, inline="always")
def _tile_contexts(Sb, symmetric, t, vecs, out, zero, dim):
    """``Ŝ v_h`` of tile ``t`` for every head ``h`` (``vecs`` ``(H, d TILE)``) into ``out[(t H + h) d TILE:]``:
    from the upper triangle where the layout holds it (:func:`tiles`; :func:`_tile_symmetric`, head by
    head), else from the whole ``Ŝ`` (:func:`_tile_context`, head by head)."""
    d = len(dim)
    H = vecs.shape[0]
    if symmetric:
        D = d * (d + 1) // 2
        for h in range(H):
            _tile_symmetric(Sb, t * D * TILE, vecs[h], out, (t * H + h) * d * TILE, zero, dim)
    else:
        for h in range(H):
            _tile_context(Sb, t * d * d * TILE, vecs[h], out, (t * H + h) * d * TILE, zero, dim)


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


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_mix(coef, src, so, out, zero):
    """``out[a TILE + i] = Σ_t coef[a, t] src[so + t TILE + i]`` (``u = W_V^h e_w`` of one tile, ``coef``
    ``(A, P)``): four rows ``a`` at a time sharing the loads of ``src``, the terms four at a time added in
    registers to the rows' partial sums (one load and store of each per four terms), in order (the sums of
    row loops that add one term at a time, bit for bit)."""
    A, P = coef.shape
    P4 = P - P % 4
    for a0 in range(0, A, 4):
        rows = min(4, A - a0)
        if rows < 4:                                   # rows left over: one at a time
            for a in range(a0, A):
                for i in range(TILE):
                    s = zero
                    for t in range(P):
                        s += coef[a, t] * src[_U(so + t * TILE + i)]
                    out[_U(a * TILE + i)] = s
            continue
        for i in range(TILE):
            out[_U(a0 * TILE + i)] = zero
            out[_U((a0 + 1) * TILE + i)] = zero
            out[_U((a0 + 2) * TILE + i)] = zero
            out[_U((a0 + 3) * TILE + i)] = zero
        for t in range(0, P4, 4):
            c00, c01, c02, c03 = coef[a0, t], coef[a0, t + 1], coef[a0, t + 2], coef[a0, t + 3]
            c10, c11, c12, c13 = coef[a0 + 1, t], coef[a0 + 1, t + 1], coef[a0 + 1, t + 2], coef[a0 + 1, t + 3]
            c20, c21, c22, c23 = coef[a0 + 2, t], coef[a0 + 2, t + 1], coef[a0 + 2, t + 2], coef[a0 + 2, t + 3]
            c30, c31, c32, c33 = coef[a0 + 3, t], coef[a0 + 3, t + 1], coef[a0 + 3, t + 2], coef[a0 + 3, t + 3]
            for i in range(TILE):
                v0 = src[_U(so + t * TILE + i)]
                v1 = src[_U(so + (t + 1) * TILE + i)]
                v2 = src[_U(so + (t + 2) * TILE + i)]
                v3 = src[_U(so + (t + 3) * TILE + i)]
                s0 = out[_U(a0 * TILE + i)]
                s1 = out[_U((a0 + 1) * TILE + i)]
                s2 = out[_U((a0 + 2) * TILE + i)]
                s3 = out[_U((a0 + 3) * TILE + i)]
                s0 += c00 * v0
                s1 += c10 * v0
                s2 += c20 * v0
                s3 += c30 * v0
                s0 += c01 * v1
                s1 += c11 * v1
                s2 += c21 * v1
                s3 += c31 * v1
                s0 += c02 * v2
                s1 += c12 * v2
                s2 += c22 * v2
                s3 += c32 * v2
                s0 += c03 * v3
                s1 += c13 * v3
                s2 += c23 * v3
                s3 += c33 * v3
                out[_U(a0 * TILE + i)] = s0
                out[_U((a0 + 1) * TILE + i)] = s1
                out[_U((a0 + 2) * TILE + i)] = s2
                out[_U((a0 + 3) * TILE + i)] = s3
        for t in range(P4, P):
            c0, c1, c2, c3 = coef[a0, t], coef[a0 + 1, t], coef[a0 + 2, t], coef[a0 + 3, t]
            for i in range(TILE):
                v = src[_U(so + t * TILE + i)]
                out[_U(a0 * TILE + i)] += c0 * v
                out[_U((a0 + 1) * TILE + i)] += c1 * v
                out[_U((a0 + 2) * TILE + i)] += c2 * v
                out[_U((a0 + 3) * TILE + i)] += c3 * v


@njit(cache=True, nogil=True, inline="always")
def _outside_blocks(k, rest, A, B, A4, B4):
    """``(a, b)`` of the ``k``-th of the ``rest`` sums of an ``A × B`` :func:`_tile_sums` outside its
    4 × 4 blocks (the first ``A4`` rows' columns from ``B4``, then the rows from ``A4``); ``k ≥ rest``
    repeats the last (a chain that pads a group of four, not stored)."""
    k = min(k, rest - 1)
    C = B - B4
    if k < A4 * C:
        return k // C, B4 + k % C
    k -= A4 * C
    return A4 + k // B, k % B


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_sums(left, ls, lo, right, rs, ro, T, out, zero):
    """``out[a, b] = Σ_t Σ_i left[t ls + lo + a TILE + i] right[t rs + ro + b TILE + i]``, a sum
    over the samples of ``T`` tiles (rows of tile ``t`` at ``t ls + lo`` and ``t rs + ro``): blocks
    of 4 × 4 sums in registers, eight loads for sixteen multiply-adds; the sums outside the blocks
    (rows and columns left over) four at a time, as four independent chains in one loop over the
    tiles, each the same sum as computed alone (tests: bit for bit), but not waiting on the last one's
    (one at a time, ``Σ_i φ_h e_w^T`` at ``p = 10`` took 2.4× as long)."""
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
    rest = A * B - A4 * B4                  # the sums outside the blocks, four at a time (independent
    for k in range(0, rest, 4):             # chains in one loop: each the same sum as alone)
        a0, b0 = _outside_blocks(k, rest, A, B, A4, B4)
        a1, b1 = _outside_blocks(k + 1, rest, A, B, A4, B4)
        a2, b2 = _outside_blocks(k + 2, rest, A, B, A4, B4)
        a3, b3 = _outside_blocks(k + 3, rest, A, B, A4, B4)
        s0 = s1 = s2 = s3 = zero
        for t in range(T):
            lt, rt = t * ls + lo, t * rs + ro
            for i in range(TILE):
                s0 += left[_U(lt + a0 * TILE + i)] * right[_U(rt + b0 * TILE + i)]
            for i in range(TILE):
                s1 += left[_U(lt + a1 * TILE + i)] * right[_U(rt + b1 * TILE + i)]
            for i in range(TILE):
                s2 += left[_U(lt + a2 * TILE + i)] * right[_U(rt + b2 * TILE + i)]
            for i in range(TILE):
                s3 += left[_U(lt + a3 * TILE + i)] * right[_U(rt + b3 * TILE + i)]
        out[a0, b0] = s0
        if k + 1 < rest:
            out[a1, b1] = s1
        if k + 2 < rest:
            out[a2, b2] = s2
        if k + 3 < rest:
            out[a3, b3] = s3


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
def _tile_features(Sb, symmetric, qb, q0, shared, t, KT, VT, yb, wb, kq, phib, eb, zero, dim):
    """Tile ``t``'s features ``φ_h = Ŝ K_h^T q`` of every head into ``phib`` and its weighted
    residuals ``w (Σ_h (W_V^h)^T φ_h − y)`` into ``eb`` (the first half of a local step)."""
    H, p = KT.shape[0], VT.shape[0]
    _queries_of_tiles(KT, qb, q0, shared, t, kq, zero, dim)
    _tile_contexts(Sb, symmetric, t, kq, phib, zero, dim)
    _tile_residuals(VT, phib, t * H * len(dim) * TILE, yb, wb, t * TILE, eb, t * p * TILE, zero, dim)


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _tile_buffers(T, H, d, r, p, dt):
    """A tiled local step's buffers: features ``φ`` and ``g`` of every tile and head, residuals ``e_w``,
    and the gradients ``∇K``, ``∇W_Q``, ``∇W_K``, ``∇W_V``."""
    return (np.empty(T * H * d * TILE, dt), np.empty(T * p * TILE, dt), np.empty(T * H * d * TILE, dt),
            np.empty((d, d), dt), np.empty((d, r), dt), np.empty((d, r), dt), np.empty((H, d, p), dt))


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _value_transpose(V, VT):
    """``VT[k, h d + a] = V[h, a, k]``: the heads' ``W_V^T`` stacked, ``(p, H d)``."""
    H, d, p = V.shape
    for h in range(H):
        for a in range(d):
            for k in range(p):
                VT[k, h * d + a] = V[h, a, k]


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _tile_sums_and_descent(phib, eb, qb, gb, T, Q, Kf, V, gV, gK, gQ, gKf, step, ridge, zero, train_q, train_k,
                           train_v):
    """The end of a tiled local step, every tile's ``φ_h``, ``e_w`` and ``g_h`` at hand: ``∇W_V^h = Σ_i φ_h e_w^T``,
    ``∇K_h = Σ_i q g_h^T``, ``∇W_Q^h = ∇K_h W_K^h``, ``∇W_K^h = ∇K_h^T W_Q^h`` (this step's factors), and the
    descent of the blocks that train (``W_V`` with its ridge)."""
    H, d, p = V.shape
    for h in range(H):
        if train_v:
            _tile_sums(phib, H * d * TILE, h * d * TILE, eb, p * TILE, 0, T, gV[h], zero)
        if not (train_q or train_k):
            continue
        _tile_sums(qb, d * TILE, 0, gb, H * d * TILE, h * d * TILE, T, gK, zero)
        _rows_product(gK, Kf[h], gQ, zero)
        _rows_product(gK, Q[h], gKf, zero, True)
        _descend_kernel(Q[h], Kf[h], gQ, gKf, step, zero, train_q, train_k)
    if train_v:
        for h in range(H):
            _descend(V[h], gV[h], step, ridge)


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _tile_loss(e, wb, T, p, zero):
    """``½ Σ_i w_i ‖e_i‖²`` over the ``T`` tiles' residuals ``e[(t p + k) TILE + i]``."""
    s = zero
    for t in range(T):
        for k in range(p):
            for i in range(TILE):
                x = e[(t * p + k) * TILE + i]
                s += wb[t * TILE + i] * x * x
    return 0.5 * s


@njit(cache=True, nogil=True, fastmath=FAST)
def tiled_local_steps(St, qt, yt, w, used, q0, shared, symmetric, inst, src, part, lo, hi, WQ, WK, WV, train_q,
                      train_k, train_v, steps, eta, lam, outQ, outK, outV, dim):
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
    kq = np.empty((H, d * TILE), dt)
    u = np.empty((H, d * TILE), dt)
    phib, eb, gb, gK, gQ, gKf, gV = _tile_buffers(T, H, d, r, p, dt)
    zero = np.zeros(1, dt)[0]
    train_kernel = train_q or train_k
    for j in range(lo, hi):
        s_, c, Q, Kf, V, step, ridge = _work_item(j, inst, part, WQ, WK, WV, outQ, outK, outV, eta, lam)
        r_ = src[s_]                             # the instance's data
        Sb, qb, yb, wb, Tc, qc, sh = St[r_, c], qt[r_, c], yt[r_, c], w[r_, c], used[r_, c], q0[r_, c], shared[r_, c]
        for _ in range(steps):
            for h in range(H):                           # K_h^T = W_K^h (W_Q^h)^T, and W_V^T
                QT[...] = Q[h].T
                _rows_product(Kf[h], QT, KT[h], zero)
            _value_transpose(V, VT)
            _shared_query_tiles(KT, qc, sh, kq, zero)
            for t in range(Tc):
                _tile_features(Sb, symmetric, qb, qc, sh, t, KT, VT, yb, wb, kq, phib, eb, zero, dim)
                if train_kernel:                         # u_h = W_V^h e_w, then g_h = Ŝ u_h
                    for h in range(H):
                        _tile_mix(V[h], eb, t * p * TILE, u[h], zero)
                    _tile_contexts(Sb, symmetric, t, u, gb, zero, dim)
            _tile_sums_and_descent(phib, eb, qb, gb, Tc, Q, Kf, V, gV, gK, gQ, gKf, step, ridge, zero, train_q,
                                   train_k, train_v)


@njit(cache=True, nogil=True, fastmath=FAST)
def tiled_client_losses(St, qt, yt, w, used, q0, shared, symmetric, inst, src, clients, lo, hi, WQ, WK, WV, out, dim):
    """:func:`client_losses` on the tiled layout (:func:`tiles`), ``dim = (0,) * d``."""
    H, d = WQ.shape[1], WQ.shape[2]
    p = WV.shape[3]
    T = w.shape[2] // TILE
    dt = St.dtype
    KT = np.empty((H, d, d), dt)
    VT = np.empty((p, H * d), dt)
    kq = np.empty((H, d * TILE), dt)
    phib = np.empty(T * H * d * TILE, dt)
    e = np.empty(T * p * TILE, dt)
    ones = np.ones(T * TILE, dt)
    zero = np.zeros(1, dt)[0]
    for j in range(lo, hi):
        s_, c = inst[j], clients[j]
        r_ = src[s_]                             # the instance's data
        Sb, qb, yb, wb, Tc, qc, sh = St[r_, c], qt[r_, c], yt[r_, c], w[r_, c], used[r_, c], q0[r_, c], shared[r_, c]
        _kernel_transposes(WQ[s_], WK[s_], KT, zero)
        _value_transpose(WV[s_], VT)
        _shared_query_tiles(KT, qc, sh, kq, zero)
        for t in range(Tc):
            _tile_features(Sb, symmetric, qb, qc, sh, t, KT, VT, yb, ones, kq, phib, e, zero, dim)
        out[j] = _tile_loss(e, wb, Tc, p, zero)


# ----------------------------------------------------------------------------------------------
# softmax attention (docs/theory.md §9): the contexts X in tiles, every product register-blocked
# ----------------------------------------------------------------------------------------------
def softmax_tiles(X, q, y, w):
    """``(Xt, qt, yt, wt, used, q0, shared)``: the softmax kernels' layout of contexts ``X`` ``(..., N, n, d)`` (and
    ``q``, ``y``, ``w``, ``used``, ``q0``, ``shared`` as in :func:`tiles`): ``Xt[..., ((t n + j) d + b) TILE + i] = X_{t TILE + i}[j, b]``."""
    X, q, y, w = (np.asarray(a) for a in (X, q, y, w))
    lead, N, n, d = X.shape[:-3], X.shape[-3], X.shape[-2], X.shape[-1]
    T = -(-N // TILE)
    return (_tiled_rows(X.reshape(lead + (N, n * d)), n * d, T), _tiled_rows(q, d, T),
            _tiled_rows(y, y.shape[-1], T), _tiled_rows(w[..., None], 1, T), tiles_used(w)) + shared_queries(q, w)


@njit(cache=True, nogil=True, fastmath=ORDERED)
def _tile_tokens(Xb, xo, coef, co, out, oo, zero, dim, tokens):
    """``out[oo + b TILE + i] = Σ_j coef[co + j TILE + i] X_i[j, b]`` (``X^T c`` of one tile, ``X`` at
    ``Xb[xo:]``): four columns ``b`` at a time sharing the loads of ``c``, each sum in registers."""
    d, n = len(dim), len(tokens)
    for b in range(0, d - 3, 4):
        for i in range(TILE):
            s0 = zero
            s1 = zero
            s2 = zero
            s3 = zero
            for j in range(n):
                c = coef[_U(co + j * TILE + i)]
                base = xo + (j * d + b) * TILE + i
                s0 += Xb[_U(base)] * c
                s1 += Xb[_U(base + TILE)] * c
                s2 += Xb[_U(base + 2 * TILE)] * c
                s3 += Xb[_U(base + 3 * TILE)] * c
            out[_U(oo + b * TILE + i)] = s0
            out[_U(oo + (b + 1) * TILE + i)] = s1
            out[_U(oo + (b + 2) * TILE + i)] = s2
            out[_U(oo + (b + 3) * TILE + i)] = s3
    for b in range(d - d % 4, d):
        for i in range(TILE):
            s = zero
            for j in range(n):
                s += Xb[_U(xo + (j * d + b) * TILE + i)] * coef[_U(co + j * TILE + i)]
            out[_U(oo + b * TILE + i)] = s


@njit(cache=True, nogil=True, fastmath=FAST)
def _tile_softmax(Ab, ao, temperature, top, total, tokens):
    """The scores ``Ab[ao + j TILE + i]`` of one tile → ``softmax_j(score / τ)`` in place. The largest
    score is subtracted before ``exp``; a NaN or infinite score makes the sample's weights NaN
    (divergence is detected)."""
    n = len(tokens)
    for j in range(n):
        for i in range(TILE):
            Ab[_U(ao + j * TILE + i)] = Ab[_U(ao + j * TILE + i)] / temperature
    for i in range(TILE):
        top[i] = Ab[_U(ao + i)]
    for j in range(1, n):
        for i in range(TILE):
            x = Ab[_U(ao + j * TILE + i)]
            if x > top[i]:
                top[i] = x
    for i in range(TILE):
        total[i] = 0
    for j in range(n):
        for i in range(TILE):
            z = np.exp(Ab[_U(ao + j * TILE + i)] - top[i])
            Ab[_U(ao + j * TILE + i)] = z
            total[i] += z
    for j in range(n):
        for i in range(TILE):
            Ab[_U(ao + j * TILE + i)] = Ab[_U(ao + j * TILE + i)] / total[i]


@njit(cache=True, nogil=True, fastmath=FAST, inline="always")
def _tile_softmax_features(Xb, qb, q0, shared, t, KT, temperature, kq, Ab, phib, top, total, zero, dim, tokens):
    """Tile ``t``'s weights ``a_h = softmax(X K_h^T q / τ)`` into ``Ab`` and features ``φ_h = X^T a_h``
    into ``phib``, every head (:func:`~linattn_theory.core.model.softmax_weights`)."""
    d, n = len(dim), len(tokens)
    H = KT.shape[0]
    xo = t * n * d * TILE
    _queries_of_tiles(KT, qb, q0, shared, t, kq, zero, dim)            # k_h = K_h^T q
    for h in range(H):
        ao = (t * H + h) * n * TILE
        _tile_rows(Xb, xo, kq[h], Ab, ao, zero, tokens, dim)            # scores X k_h
        _tile_softmax(Ab, ao, temperature, top, total, tokens)
        _tile_tokens(Xb, xo, Ab, ao, phib, (t * H + h) * d * TILE, zero, dim, tokens)


@njit(cache=True, nogil=True, fastmath=FAST)
def softmax_local_steps(Xt, qt, yt, w, used, q0, shared, inst, src, part, lo, hi, WQ, WK, WV, train_q, train_k, train_v,
                        steps, eta, lam, outQ, outK, outV, temperature, dim, tokens):
    """:func:`local_steps` of softmax attention (docs/theory.md §9) on the tiled contexts
    (:func:`softmax_tiles`), ``dim = (0,) * d``, ``tokens = (0,) * n`` (compiled per ``(d, n)``):
    with the weights ``a_h`` and features ``φ_h`` of :func:`_tile_softmax_features` and
    ``e_w = w (Σ_h (W_V^h)^T φ_h − y)``, ``∇W_V^h = Σ_i φ_h e_w^T``; ``v_h = W_V^h e_w``,
    ``u = X v_h``, ``δ = a_h ⊙ (u − a_h^T u)``, ``g_h = X^T δ / τ``, ``∇K_h = Σ_i q g_h^T``,
    ``∇W_Q^h = ∇K_h W_K^h``, ``∇W_K^h = ∇K_h^T W_Q^h``
    (:func:`~linattn_theory.core.model.loss_and_grad_from_contexts`). Padding (weight 0, ``X = 0``,
    ``q = y = 0``) contributes exact zeros."""
    H, d, r = WQ.shape[1], WQ.shape[2], WQ.shape[3]
    p = WV.shape[3]
    n = len(tokens)
    T = w.shape[2] // TILE
    dt = Xt.dtype
    KT = np.empty((H, d, d), dt)
    VT = np.empty((p, H * d), dt)
    kq = np.empty((H, d * TILE), dt)
    v = np.empty(d * TILE, dt)
    u = np.empty(n * TILE, dt)
    top = np.empty(TILE, dt)
    total = np.empty(TILE, dt)
    Ab = np.empty(T * H * n * TILE, dt)
    phib, eb, gb, gK, gQ, gKf, gV = _tile_buffers(T, H, d, r, p, dt)
    zero = np.zeros(1, dt)[0]
    train_kernel = train_q or train_k
    for j in range(lo, hi):
        s_, c, Q, Kf, V, step, ridge = _work_item(j, inst, part, WQ, WK, WV, outQ, outK, outV, eta, lam)
        r_ = src[s_]                             # the instance's data
        Xb, qb, yb, wb, Tc, qc, sh = Xt[r_, c], qt[r_, c], yt[r_, c], w[r_, c], used[r_, c], q0[r_, c], shared[r_, c]
        for _ in range(steps):
            _kernel_transposes(Q, Kf, KT, zero)
            _value_transpose(V, VT)
            _shared_query_tiles(KT, qc, sh, kq, zero)
            for t in range(Tc):
                _tile_softmax_features(Xb, qb, qc, sh, t, KT, temperature, kq, Ab, phib, top, total, zero, dim,
                                       tokens)
                _tile_residuals(VT, phib, t * H * d * TILE, yb, wb, t * TILE, eb, t * p * TILE, zero, dim)
                if not train_kernel:
                    continue
                xo = t * n * d * TILE
                for h in range(H):
                    ao = (t * H + h) * n * TILE
                    _tile_mix(V[h], eb, t * p * TILE, v, zero)        # v = W_V^h e_w
                    _tile_rows(Xb, xo, v, u, 0, zero, tokens, dim)    # u = X v
                    for i in range(TILE):                             # δ = a ⊙ (u − a^T u)
                        total[i] = 0
                    for jj in range(n):
                        for i in range(TILE):
                            total[i] += Ab[_U(ao + jj * TILE + i)] * u[_U(jj * TILE + i)]
                    for jj in range(n):
                        for i in range(TILE):
                            u[_U(jj * TILE + i)] = Ab[_U(ao + jj * TILE + i)] * (u[_U(jj * TILE + i)] - total[i])
                    go = (t * H + h) * d * TILE
                    _tile_tokens(Xb, xo, u, 0, gb, go, zero, dim, tokens)   # g = X^T δ / τ
                    for i in range(d * TILE):
                        gb[_U(go + i)] = gb[_U(go + i)] / temperature
            _tile_sums_and_descent(phib, eb, qb, gb, Tc, Q, Kf, V, gV, gK, gQ, gKf, step, ridge, zero, train_q,
                                   train_k, train_v)


@njit(cache=True, nogil=True, fastmath=FAST)
def softmax_client_losses(Xt, qt, yt, w, used, q0, shared, inst, src, clients, lo, hi, WQ, WK, WV, out, temperature, dim,
                          tokens):
    """``F_c = Σ_i w_i ½‖ŷ_i − y_i‖²`` of softmax attention (:func:`client_losses`' contract, the
    data as in :func:`softmax_local_steps`)."""
    H, d = WQ.shape[1], WQ.shape[2]
    p = WV.shape[3]
    n = len(tokens)
    T = w.shape[2] // TILE
    dt = Xt.dtype
    KT = np.empty((H, d, d), dt)
    VT = np.empty((p, H * d), dt)
    kq = np.empty((H, d * TILE), dt)
    top = np.empty(TILE, dt)
    total = np.empty(TILE, dt)
    Ab = np.empty(T * H * n * TILE, dt)
    phib = np.empty(T * H * d * TILE, dt)
    e = np.empty(T * p * TILE, dt)
    ones = np.ones(T * TILE, dt)
    zero = np.zeros(1, dt)[0]
    for j in range(lo, hi):
        s_, c = inst[j], clients[j]
        r_ = src[s_]                             # the instance's data
        Xb, qb, yb, wb, Tc, qc, sh = Xt[r_, c], qt[r_, c], yt[r_, c], w[r_, c], used[r_, c], q0[r_, c], shared[r_, c]
        _kernel_transposes(WQ[s_], WK[s_], KT, zero)
        _value_transpose(WV[s_], VT)
        _shared_query_tiles(KT, qc, sh, kq, zero)
        for t in range(Tc):
            _tile_softmax_features(Xb, qb, qc, sh, t, KT, temperature, kq, Ab, phib, top, total, zero, dim, tokens)
            _tile_residuals(VT, phib, t * H * d * TILE, yb, ones, t * TILE, e, t * p * TILE, zero, dim)
        out[j] = _tile_loss(e, wb, Tc, p, zero)
