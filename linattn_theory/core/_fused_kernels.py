"""numba kernels of the fused engine (:mod:`linattn_theory.core.fused`); imported only when it runs.

Each kernel trains (or evaluates) the clients ``part[lo:hi]`` one after another, all ``E`` local
steps of a client while its ``Ŝ`` sits in cache, one pass over each sample's ``Ŝ`` per step
(both products with ``Ŝ_i`` while it is in L1); the products that involve no ``Ŝ`` are
client-level matrix products (BLAS through ``np.dot``). The closed forms are those of
:func:`linattn_theory.core.model.loss_and_grad_from_moments` (docs/theory.md §1):

    k_h = K_h^T q,  φ_h = Ŝ k_h,  e = Σ_h (W_V^h)^T φ_h − y,  g_h = Ŝ W_V^h (w e),
    ∇_{W_V^h} = Σ_i w_i φ_h e^T,  ∇_{K_h} = Σ_i w_i q g_h^T,
    ∇_{W_Q^h} = ∇_{K_h} W_K^h,    ∇_{W_K^h} = (∇_{K_h})^T W_Q^h.

Inner loops are dot products of contiguous rows (``Ŝ_i`` is symmetric), which LLVM vectorises
when it may reassociate sums; temporaries have the data's dtype (float32 stays float32).
Kernels release the GIL: the caller runs chunks of clients on threads. Compiled code is
cached on disk (``cache=True``): the first call per dtype compiles, later processes load it.
"""

from __future__ import annotations

import numpy as np
try:
    from numba import njit
except ImportError:     # importable without numba (docs, introspection); the engine then never runs
    def njit(*args, **options):
        return args[0] if args and callable(args[0]) else (lambda fn: fn)

#: LLVM may fuse multiply-adds and reorder sums (vectorised reductions); NaN and inf keep their
#: IEEE meaning, so divergence is still detected.
FAST = {"contract", "reassoc"}


@njit(cache=True, nogil=True, fastmath=FAST)
def _sample_features(S, c, i, kq, phi, zero):
    """``φ_h = Ŝ_i k_h`` of sample ``(c, i)`` for every head into ``phi[:, i]`` (``kq`` ``(H, N, d)``)."""
    H, _, d = phi.shape
    for h in range(H):
        for b in range(d):               # row b of the symmetric Ŝ_i times k_h: a vectorised dot
            s = zero
            for a in range(d):
                s += S[c, i, b, a] * kq[h, i, a]
            phi[h, i, b] = s


@njit(cache=True, nogil=True, fastmath=FAST)
def _sample_residual(phi, VT, y, c, i, e, zero):
    """``e = Σ_h (W_V^h)^T φ_h − y_i`` into ``e`` ``(p,)``; ``VT[h]`` is ``(W_V^h)^T`` ``(p, d)``."""
    H, _, d = phi.shape
    p = e.shape[0]
    for t in range(p):
        s = zero
        for h in range(H):
            for a in range(d):
                s += VT[h, t, a] * phi[h, i, a]
        e[t] = s - y[c, i, t]


@njit(cache=True, nogil=True, fastmath=FAST)
def _query_kernels(Q, Kf, qc, K, kq):
    """``K_h = W_Q^h (W_K^h)^T`` into ``K`` and ``k_h = K_h^T q`` of every sample into ``kq`` ``(H, N, d)``."""
    for h in range(Q.shape[0]):
        K[h] = np.dot(Q[h], Kf[h].T)
        kq[h] = np.dot(qc, K[h])


@njit(cache=True, nogil=True, fastmath=FAST)
def local_steps(S, q, y, w, part, lo, hi, WQ, WK, WV, train_q, train_k, train_v, steps, eta, lam,
                outQ, outK, outV):
    """``E`` full-batch local steps of the clients ``part[lo:hi]`` from ``(WQ, WK, WV)``.

    Writes client ``part[j]``'s blocks to ``outQ[j]``, ``outK[j]``, ``outV[j]`` (untrained
    blocks stay at the server's values). ``w`` are the sample weights; samples of weight 0
    (the padding) contribute exactly 0 and are skipped.
    """
    H, d, r = WQ.shape
    p = WV.shape[2]
    N = S.shape[1]
    dt = S.dtype
    K = np.empty((H, d, d), dt)
    kq = np.empty((H, N, d), dt)
    phi = np.zeros((H, N, d), dt)
    g = np.zeros((H, N, d), dt)
    ew = np.zeros((N, p), dt)
    e = np.empty(p, dt)
    u = np.empty(d, dt)
    VT = np.empty((H, p, d), dt)
    zero = np.zeros(1, dt)[0]                        # a zero of the data's dtype
    train_kernel = train_q or train_k
    for j in range(lo, hi):
        c = part[j]
        Q, Kf, V = outQ[j], outK[j], outV[j]
        Q[...] = WQ
        Kf[...] = WK
        V[...] = WV
        qc = q[c]
        for _ in range(steps):
            _query_kernels(Q, Kf, qc, K, kq)
            for h in range(H):
                VT[h] = V[h].T
            for i in range(N):
                wi = w[c, i]
                if wi == 0:                          # padding: no contribution
                    ew[i] = 0
                    phi[:, i] = 0
                    g[:, i] = 0
                    continue
                _sample_features(S, c, i, kq, phi, zero)
                _sample_residual(phi, VT, y, c, i, e, zero)
                for t in range(p):
                    ew[i, t] = e[t] * wi
                if train_kernel:
                    for h in range(H):
                        for a in range(d):           # u = W_V^h e_w
                            u[a] = 0
                        for t in range(p):
                            et = ew[i, t]
                            for a in range(d):
                                u[a] += et * VT[h, t, a]
                        for b in range(d):           # g_h = Ŝ u while Ŝ_i is in L1
                            s = zero
                            for a in range(d):
                                s += S[c, i, b, a] * u[a]
                            g[h, i, b] = s
            for h in range(H):
                if train_kernel:                     # ∇K = Σ_i q_i g_i^T, ∇W_Q = ∇K W_K, ∇W_K = ∇K^T W_Q
                    gK = np.dot(qc.T, g[h])
                    gQ = np.dot(gK, Kf[h])
                    gKf = np.dot(gK.T, Q[h])
                    if train_q:
                        Q[h] -= eta * gQ
                    if train_k:
                        Kf[h] -= eta * gKf
                if train_v:                          # ∇W_V = Σ_i φ_i e_w^T, plus the ridge
                    gV = np.dot(phi[h].T, ew)
                    V[h] -= eta * (gV + lam * V[h])


@njit(cache=True, nogil=True, fastmath=FAST)
def frozen_steps(phi, y, w, part, lo, hi, V0, steps, eta, lam, outV):
    """``E`` local steps of the value block at a frozen kernel, ``ŷ = V^T φ`` (docs/theory.md §5).

    ``phi`` ``(m, N, Hd)`` are the frozen features, ``V0`` ``(Hd, p)`` the server's value
    matrix; writes client ``part[j]``'s ``V`` to ``outV[j]`` ``(Hd, p)``.
    """
    N, n = phi.shape[1], phi.shape[2]
    p = V0.shape[1]
    dt = phi.dtype
    gV = np.empty((n, p), dt)
    e = np.empty(p, dt)
    for j in range(lo, hi):
        c = part[j]
        V = outV[j]
        V[...] = V0
        for _ in range(steps):
            gV[...] = 0
            for i in range(N):
                wi = w[c, i]
                if wi == 0:
                    continue
                for t in range(p):
                    e[t] = 0
                for a in range(n):
                    fa = phi[c, i, a]
                    for t in range(p):
                        e[t] += fa * V[a, t]
                for t in range(p):
                    e[t] = (e[t] - y[c, i, t]) * wi
                for a in range(n):
                    fa = phi[c, i, a]
                    for t in range(p):
                        gV[a, t] += fa * e[t]
            for a in range(n):
                for t in range(p):
                    V[a, t] -= eta * (gV[a, t] + lam * V[a, t])


@njit(cache=True, nogil=True, fastmath=FAST)
def client_losses(S, q, y, w, clients, lo, hi, WQ, WK, WV, out):
    """``F_c = Σ_i w_i ½‖ŷ_i − y_i‖²`` of the clients ``clients[lo:hi]`` into ``out[j]``."""
    H, d, _ = WQ.shape
    p = WV.shape[2]
    N = S.shape[1]
    dt = S.dtype
    K = np.empty((H, d, d), dt)
    kq = np.empty((H, N, d), dt)
    phi = np.empty((H, N, d), dt)
    e = np.empty(p, dt)
    acc = np.empty(1, dt)
    VT = np.empty((H, p, d), dt)
    zero = np.zeros(1, dt)[0]
    for h in range(H):
        VT[h] = WV[h].T
    for j in range(lo, hi):
        c = clients[j]
        _query_kernels(WQ, WK, q[c], K, kq)
        acc[0] = 0
        for i in range(N):
            wi = w[c, i]
            if wi == 0:
                continue
            _sample_features(S, c, i, kq, phi, zero)
            _sample_residual(phi, VT, y, c, i, e, zero)
            for t in range(p):
                acc[0] += wi * e[t] * e[t]
        out[j] = 0.5 * acc[0]
