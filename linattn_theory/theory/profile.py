"""The kernel-profile objective ``Φ_λ(K)``, its gradient and the centralised optimum ``Φ*_λ``
(docs/theory.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize
from threadpoolctl import threadpool_limits

from ..core.moments import ValueMoments
from ..core.clients import FederatedDataset, stack_clients
from ._shared import SEED_OPTIMUM, _check_kernel, _check_ridge, _host_moments, _kernel_gradient, _profile_from_moments, _stacked

__all__ = ["profile_objective", "profile_gradient", "CentralizedOptimum", "centralized_optimum", "population_value_moments"]



# --------------------------------------------------------------------------------------
# §4 the kernel-profile objective
# --------------------------------------------------------------------------------------
def profile_objective(K, clients, lam: float = 0.0):
    """Kernel-profile objective and its minimiser (docs/theory.md §4).

    ``Φ_λ(K) = min_V F_λ(K, V) = ½ y2 − ½ tr(B^T Ã^{-1} B)``, ``V*_λ(K) = Ã^{-1} B``, with
    ``Ã = A + λI`` (a minimum-norm pseudo-inverse when ``λ = 0`` and ``A`` is singular).
    Returns ``(Φ_λ(K), V*_λ(K))``: a float and the stacked value block ``(Hd, p)``.
    """
    _check_ridge(lam)
    data = _stacked(clients)
    K = _check_kernel(K, data)
    return _profile_from_moments(_host_moments(K, data), lam)


def profile_gradient(K, clients, lam: float = 0.0):
    """``∇_K Φ_λ(K) = ∇_K F(K, V*_λ(K))`` by the envelope theorem (docs/theory.md §4); ``(H, d, d)``."""
    _check_ridge(lam)
    data = _stacked(clients)
    K = _check_kernel(K, data)
    _, V = _profile_from_moments(_host_moments(K, data), lam)
    return _kernel_gradient(K, V, data)


# --------------------------------------------------------------------------------------
# §4 the centralised optimum Φ*_λ
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CentralizedOptimum:
    """The centralised minimiser of the kernel-profile objective (docs/theory.md §4).

    ``kernel`` ``K*`` ``(H, d, d)``, ``value`` ``V*_0(K*)`` ``(Hd, p)``, ``objective`` ``Φ*_λ``;
    ``starts`` has one row per start (label, initial and final objective, iterations,
    convergence flag and solver message); ``best_start`` names the winning start.
    """

    kernel: np.ndarray
    value: np.ndarray
    objective: float
    lam: float
    rank: int
    converged: bool
    factor_gradient_norm: float
    best_start: str
    starts: pd.DataFrame = field(repr=False)


def _factors(K, rank: int):
    """Rank-``r`` factors ``(W_Q, W_K)`` of each head's kernel (truncated SVD, split ``√σ``)."""
    U, s, Vt = np.linalg.svd(K)
    r = min(rank, K.shape[-1])
    root = np.sqrt(s[..., :r])
    WQ = np.zeros(K.shape[:-1] + (rank,))
    WK = np.zeros(K.shape[:-1] + (rank,))
    WQ[..., :r] = U[..., :r] * root[..., None, :]
    WK[..., :r] = np.swapaxes(Vt, -1, -2)[..., :r] * root[..., None, :]
    return WQ, WK


def centralized_optimum(clients, lam: float = 0.0, rank: int | None = None, heads: int | None = None,
                        restarts: int = 8, seed: int = 0, initial_kernels=(),
                        max_iterations: int = 1000, tolerance: float = 1e-10) -> CentralizedOptimum:
    """``Φ*_λ = min_K Φ_λ(K)`` over kernels of rank ``≤ r`` per head (docs/theory.md §4).

    L-BFGS (``scipy.optimize``) over the factors ``K_h = W_Q^h (W_K^h)^T`` with the envelope
    gradient ``∇_{W_Q} = ∇_KΦ W_K``, ``∇_{W_K} = (∇_KΦ)^T W_Q``, from ``restarts`` random starts,
    the planted teacher kernel (``clients.truth["kernel"]`` when it has the right shape) and
    every kernel in ``initial_kernels`` (e.g. those simulations reached). The unoptimised
    starting kernels are candidates too, so the result is never worse than any of them.

    Scale symmetry: ``Φ_λ(cK)`` decreases in ``c > 0`` towards ``Φ_0(K)`` (the ridge on ``V``
    costs ``λ‖V‖²/c²`` for the same predictions), so for ``λ > 0`` the infimum over kernels is
    ``min_K Φ_0(K)`` and is not attained. The solver therefore minimises ``Φ_0`` for every
    ``λ``; ``objective`` is ``inf_K Φ_λ(K) = min_K Φ_0(K)`` and ``value`` is ``V*_0(K*)``.
    ``bias(K) = Φ_λ(K) − objective ≥ 0`` for every kernel ``K``.
    """
    _check_ridge(lam)
    data = _stacked(clients)
    d = data.q.shape[-1]
    starts = [("initial_kernel_%d" % i, _check_kernel(K, data, f"initial_kernels[{i}]"))
              for i, K in enumerate(initial_kernels)]
    truth = getattr(clients, "truth", {}) if isinstance(clients, FederatedDataset) else {}
    if heads is None:   # from the supplied kernels, else the teacher, else one head
        heads = starts[0][1].shape[0] if starts else np.shape(truth["kernel"])[0] if "kernel" in truth else 1
    rank = d if rank is None else int(rank)
    if rank < 1 or heads < 1:
        raise ValueError(f"rank = {rank}, heads = {heads}; expected integers >= 1")
    for label, K in starts:
        if K.shape[0] != heads:
            raise ValueError(f"{label} has {K.shape[0]} heads; expected heads = {heads}")
    if "kernel" in truth and np.shape(truth["kernel"]) == (heads, d, d):
        starts.insert(0, ("teacher", np.asarray(truth["kernel"], dtype=np.float64)))
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(SEED_OPTIMUM,)))
    shape = (heads, d, rank)
    size = heads * d * rank

    def objective(x):
        WQ, WK = x[:size].reshape(shape), x[size:].reshape(shape)
        K = WQ @ np.swapaxes(WK, -1, -2)
        phi, V = _profile_from_moments(_host_moments(K, data), 0.0)
        G = _kernel_gradient(K, V, data)
        return phi, np.concatenate([(G @ WK).ravel(), (np.swapaxes(G, -1, -2) @ WQ).ravel()])

    candidates, rows = [], []
    for label, K in starts:   # the unoptimised starts themselves
        candidates.append((profile_objective(K, data, 0.0)[0], label + " (as given)", K, np.nan))
    inits = [(label, *_factors(K, rank)) for label, K in starts]
    for i in range(restarts):
        inits.append((f"random_{i}", rng.normal(0, 1 / np.sqrt(d), shape),
                      rng.normal(0, 1 / np.sqrt(d), shape)))
    for label, WQ, WK in inits:
        x0 = np.concatenate([WQ.ravel(), WK.ravel()])
        f0 = objective(x0)[0]
        with threadpool_limits(1, user_api="blas"):   # tiny BLAS calls: threads only spin (10× slower under load)
            res = optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                                    options={"maxiter": max_iterations, "ftol": 1e-15, "gtol": tolerance,
                                             "maxcor": 20})
        WQ, WK = res.x[:size].reshape(shape), res.x[size:].reshape(shape)
        K = WQ @ np.swapaxes(WK, -1, -2)
        gnorm = float(np.linalg.norm(res.jac))
        rows.append({"start": label, "initial_objective": f0, "objective": float(res.fun),
                     "iterations": int(res.nit), "converged": bool(res.success),
                     "factor_gradient_norm": gnorm, "message": str(res.message)})
        candidates.append((float(res.fun), label, K, gnorm))
    if not candidates:
        raise ValueError("centralized_optimum: nothing to optimise (restarts = 0 and no initial kernels)")
    best = min(candidates, key=lambda c: c[0])
    table = pd.DataFrame(rows)
    converged = any(row["converged"] for row in rows if row["start"] == best[1])
    phi, V = profile_objective(best[2], data, 0.0)
    return CentralizedOptimum(best[2], V, phi, float(lam), rank, converged, float(best[3]), best[1], table)


# --------------------------------------------------------------------------------------
# population moments
# --------------------------------------------------------------------------------------
def population_value_moments(K, config, samples: int = 4096) -> ValueMoments:
    """Monte-Carlo estimate of the population moments ``E_{D_c}[φφ^T]``, ``E_{D_c}[φ y^T]``, ``E_{D_c}‖y‖²``.

    Fresh samples: the task of ``config`` is regenerated with ``samples`` samples per client drawn
    from the evaluation stream (``fresh_samples=True``), independent of the training
    samples, while the teacher and every client's distribution are unchanged (checked through
    ``truth``). Weights are the training ``p_c``. Returns host :class:`~linattn_theory.core.moments.ValueMoments`.
    """
    from ..sim.engine import clients_from_config
    from ..data.families import make_clients
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ValueError(f"samples = {samples!r}; expected an integer >= 1")
    train = clients_from_config(config)
    options = {k: v for k, v in config.to_dict()["task"].items() if k != "family"}
    options["samples_per_client"] = int(samples)
    fresh = make_clients(config.task.family, seed=config.seed, fresh_samples=True, **options)
    for key, value in train.truth.items():
        if not np.array_equal(value, fresh.truth[key]):
            raise RuntimeError(f"regenerating the task changed truth[{key!r}]; cannot draw fresh samples")
    data = stack_clients(FederatedDataset(fresh.clients, train.weights, train.family, train.truth))
    return _host_moments(_check_kernel(K, data), data)
