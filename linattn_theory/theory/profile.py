"""The kernel-profile objective ``Φ_λ(K)``, its gradient and the centralised optimum ``Φ*_λ``
(docs/theory.md §4).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize
from threadpoolctl import threadpool_limits

from ..core.arrays import to_numpy
from ..core.moments import ValueMoments, value_moments_and_features
from ..core.clients import FederatedDataset, stack_clients
from ..core.clients import StackedClients
from .host import (SEED_OPTIMUM, check_kernel, check_ridge, host_moments, host_moments_and_features,
                   kernel_gradient, profile_from_moments, solve_symmetric, as_stacked)

__all__ = ["profile_objective", "profile_gradient", "CentralizedOptimum", "centralized_optimum",
           "centralized_optima", "population_value_moments"]



# --------------------------------------------------------------------------------------
# §4 the kernel-profile objective
# --------------------------------------------------------------------------------------
def profile_objective(K, clients, lam: float = 0.0):
    """Kernel-profile objective and its minimiser (docs/theory.md §4).

    ``Φ_λ(K) = min_V F_λ(K, V) = ½ y2 − ½ tr(B^T Ã^{-1} B)``, ``V*_λ(K) = Ã^{-1} B``, with
    ``Ã = A + λI`` (a minimum-norm pseudo-inverse when ``λ = 0`` and ``A`` is singular).

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Attention kernels, one per head.
    clients : FederatedDataset or StackedClients
        The clients (a list of ``(X, q, y)`` tuples is accepted too).
    lam : float, default 0.0
        Ridge ``λ ≥ 0`` on the value block.

    Returns
    -------
    objective : float
        ``Φ_λ(K)``.
    value : numpy.ndarray, shape (H·d, p)
        ``V*_λ(K)``, the stacked value block.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]                  # the teacher's
    >>> phi, V = lt.profile_objective(K, clients, lam=1e-3)
    >>> V.shape
    (4, 2)
    >>> phi_2, _ = lt.profile_objective(2 * K, clients)  # λ = 0: a kernel counts only up to scale
    >>> bool(np.isclose(phi_2, lt.profile_objective(K, clients)[0]))
    True
    """
    check_ridge(lam)
    data = as_stacked(clients)
    K = check_kernel(K, data)
    return profile_from_moments(host_moments(K, data), lam)


def profile_gradient(K, clients, lam: float = 0.0):
    """``∇_K Φ_λ(K) = ∇_K F(K, V*_λ(K))`` by the envelope theorem (docs/theory.md §4); ``(H, d, d)``.

    Parameters
    ----------
    K, clients, lam
        Kernels ``(H, d, d)``, clients and ridge, as in :func:`profile_objective`.

    Returns
    -------
    numpy.ndarray, shape (H, d, d)
        The gradient.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> G = lt.profile_gradient(K, clients, lam=1e-3)
    >>> step = 1e-6 * G / np.linalg.norm(G)             # a directional derivative, by finite differences
    >>> change = lt.profile_objective(K + step, clients, 1e-3)[0] - lt.profile_objective(K - step, clients, 1e-3)[0]
    >>> bool(np.isclose(change / 2e-6, np.linalg.norm(G), rtol=1e-5))
    True
    """
    check_ridge(lam)
    data = as_stacked(clients)
    K = check_kernel(K, data)
    moments, phi = host_moments_and_features(K, data)
    _, V = profile_from_moments(moments, lam)
    return kernel_gradient(K, V, data, phi)


# --------------------------------------------------------------------------------------
# §4 the centralised optimum Φ*_λ
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CentralizedOptimum:
    """The centralised minimiser of the kernel-profile objective (docs/theory.md §4).

    ``kernel`` ``K*`` ``(H, d, d)``, ``value`` ``V*_0(K*)`` ``(Hd, p)``, ``objective`` ``Φ*_λ``;
    ``starts`` has one row per start (label, initial and final objective, iterations,
    convergence flag and solver message); ``best_start`` names the winning start.

    Parameters
    ----------
    kernel : numpy.ndarray, shape (H, d, d)
        ``K*``.
    value : numpy.ndarray, shape (H·d, p)
        ``V*_0(K*)``.
    objective : float
        ``Φ*_λ``.
    lam : float
        The ridge ``λ`` asked for.
    rank : int
        The rank per head optimised over.
    converged : bool
        Whether the winning start's L-BFGS converged.
    factor_gradient_norm : float
        The norm of the factors' gradient at the optimum.
    best_start : str
        The winning start (``"teacher"``, ``"random_3"``, ``"initial_kernel_0"``, …).
    starts : pandas.DataFrame
        One row per start.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> optimum = lt.centralized_optimum(clients, rank=2, restarts=2)
    >>> optimum.best_start in optimum.starts["start"].tolist(), bool(optimum.objective == optimum.starts["objective"].min())
    (True, True)
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
                        max_iterations: int = 1000, tolerance: float = 1e-10, refine: int = 0) -> CentralizedOptimum:
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

    The starts advance together, their objectives evaluated together (:func:`centralized_optima`);
    each follows the path it would follow alone.

    Parameters
    ----------
    clients : FederatedDataset or StackedClients
        The clients (their pooled objective is the centralised one).
    lam : float, default 0.0
        Ridge ``λ ≥ 0`` (``objective`` is the infimum over kernels, see above).
    rank : int, optional
        Rank ``r`` of each head's kernel; default ``d`` (full).
    heads : int, optional
        Heads ``H``; default those of ``initial_kernels``, else of the teacher, else one.
    restarts : int, default 8
        Random starts (besides the teacher and ``initial_kernels``).
    seed : int, default 0
        Seed of the random starts.
    initial_kernels : sequence of array_like, optional
        More starting kernels ``(H, d, d)`` (e.g. those simulations reached).
    max_iterations : int, default 1000
        L-BFGS iterations per start.
    tolerance : float, default 1e-10
        L-BFGS's tolerance on the relative change of the objective and on the gradient.
    refine : int, default 0
        Up to this many more starts, one after another, each from the best kernel so far split afresh
        into balanced factors (:func:`_factors`, ``√σ`` on both sides), while the objective falls
        (rows ``refined_1``, …). L-BFGS over the factors can stop on a line-search failure or on a
        small factor gradient at unbalanced factors short of the kernel's minimum; a start from the
        same kernel in balanced factors goes on (issue 34: up to 1e-6 relative lower on digits).

    Returns
    -------
    CentralizedOptimum
        ``kernel`` ``K*``, ``value``, ``objective`` ``Φ*_λ``, whether it converged, the winning
        start and a table of every start.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> optimum = lt.centralized_optimum(clients, rank=2, restarts=2)
    >>> optimum.kernel.shape, optimum.converged, len(optimum.starts)
    ((1, 4, 4), True, 3)
    >>> bool(optimum.objective <= lt.profile_objective(clients.truth["kernel"], clients)[0])
    True
    """
    return centralized_optima([dict(clients=clients, lam=lam, rank=rank, heads=heads, restarts=restarts,
                                    seed=seed, initial_kernels=initial_kernels,
                                    max_iterations=max_iterations, tolerance=tolerance, refine=refine)])[0]


@dataclass
class _Problem:
    """One centralised optimum to find: the data, the starts and the solver's settings."""

    data: StackedClients
    lam: float
    rank: int
    heads: int
    starts: list          # (label, K) of the given and teacher kernels
    inits: list           # (label, W_Q, W_K) of every start the solver runs
    max_iterations: int
    tolerance: float
    refine: int = 0

    @property
    def shape(self):
        return (self.heads, self.data.q.shape[-1], self.rank)


def _problem(clients, lam: float = 0.0, rank: int | None = None, heads: int | None = None,
             restarts: int = 8, seed: int = 0, initial_kernels=(), max_iterations: int = 1000,
             tolerance: float = 1e-10, refine: int = 0) -> _Problem:
    """The arguments of :func:`centralized_optimum`, checked, with the starts drawn."""
    check_ridge(lam)
    data = as_stacked(clients)
    d = data.q.shape[-1]
    starts = [("initial_kernel_%d" % i, check_kernel(K, data, f"initial_kernels[{i}]"))
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
    inits = [(label, *_factors(K, rank)) for label, K in starts]
    for i in range(restarts):
        inits.append((f"random_{i}", rng.normal(0, 1 / np.sqrt(d), shape),
                      rng.normal(0, 1 / np.sqrt(d), shape)))
    if not starts and not inits:
        raise ValueError("centralized_optimum: nothing to optimise (restarts = 0 and no initial kernels)")
    if isinstance(refine, bool) or not isinstance(refine, (int, np.integer)) or refine < 0:
        raise ValueError(f"refine = {refine!r}; expected an integer >= 0")
    return _Problem(data, float(lam), rank, heads, starts, inits, max_iterations, tolerance, int(refine))


def _profile_batch(K, data: StackedClients):
    """``(Φ_0(K_b), V*_0(K_b), φ)`` of a stack of kernels ``K`` ``(B, H, d, d)``: ``(B,)``,
    ``(B, Hd, p)`` and the features ``(B, m, N, Hd)`` they were computed from.

    The batched form of :func:`profile_from_moments` (per kernel the same arithmetic).
    """
    mom, features = value_moments_and_features(np.asarray(K)[:, None], data)   # A (B, m, n, n), B (B, m, n, p)
    A, B, y2, w = (np.asarray(to_numpy(a), dtype=np.float64) for a in (mom.A, mom.B, mom.y2, mom.weights))
    A = np.sum(w[:, None, None] * A, axis=1)
    B = np.sum(w[:, None, None] * B, axis=1)
    V = solve_symmetric(A, B)
    return 0.5 * np.sum(w * y2) - 0.5 * np.sum(B * V, axis=(-2, -1)), V, features


def _factor_objectives(problem: _Problem, xs: list) -> list:
    """``(Φ_0, ∇_{(W_Q, W_K)} Φ_0)`` at the factor vectors ``xs`` of one problem, in one batch."""
    shape, size = problem.shape, int(np.prod(problem.shape))
    X = np.stack(xs)
    WQ, WK = X[:, :size].reshape((-1,) + shape), X[:, size:].reshape((-1,) + shape)
    K = WQ @ np.swapaxes(WK, -1, -2)
    phi, V, features = _profile_batch(K, problem.data)
    G = kernel_gradient(K, V, problem.data, features)     # the features of Φ_0's moments serve ∇_K
    grads = np.concatenate([(G @ WK).reshape(len(xs), -1), (np.swapaxes(G, -1, -2) @ WQ).reshape(len(xs), -1)],
                           axis=1)
    return [(float(f), g) for f, g in zip(phi, grads)]


#: SciPy's ``L-BFGS-B`` settings of every start (those ``optimize.minimize(method="L-BFGS-B")`` runs with):
#: memory ``maxcor``, ``ftol`` (``factr = ftol / ε``), line-search steps ``maxls`` and evaluations ``maxfun``
LBFGSB_MEMORY, LBFGSB_FTOL, LBFGSB_MAXLS, LBFGSB_MAXFUN = 20, 1e-15, 20, 15000

_LBFGSB_STATUS = {4: "CONVERGENCE", 5: "STOP", 6: "WARNING", 7: "ERROR", 8: "ABNORMAL"}
_LBFGSB_TASK = {401: "NORM OF PROJECTED GRADIENT <= PGTOL", 402: "RELATIVE REDUCTION OF F <= FACTR*EPSMCH",
                502: "TOTAL NO. OF F,G EVALUATIONS EXCEEDS LIMIT", 504: "TOTAL NO. OF ITERATIONS REACHED LIMIT",
                601: "ROUNDING ERRORS PREVENT PROGRESS", 602: "STP = STPMAX", 603: "STP = STPMIN",
                604: "XTOL TEST SATISFIED"}


class _LbfgsbStart:
    """One start's L-BFGS-B, driven by reverse communication through SciPy's own routine
    (``scipy.optimize._lbfgsb.setulb``, the one ``optimize.minimize(method="L-BFGS-B")`` loops over).

    :meth:`advance` runs the routine until it asks for ``(f, ∇f)`` at ``x`` (``True``) or stops
    (``False``); :meth:`tell` hands the values back. The same calls with the same numbers as
    ``optimize.minimize`` makes, so the path and the result are SciPy's, bit for bit, without a
    thread per start.
    """

    def __init__(self, x0, f0: float, g0, max_iterations: int, tolerance: float):
        n, m = len(x0), LBFGSB_MEMORY
        self.x, self.f, self.g = np.array(x0, dtype=np.float64), np.array(0.0), np.zeros(n)
        self.f0 = f0
        self.cache = (self.x.copy(), f0, np.asarray(g0, dtype=np.float64))   # ScalarFunction's: x, f, g
        self.bounds = (np.zeros(n), np.zeros(n), np.zeros(n, np.int32))     # unbounded
        self.wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m)
        self.iwa = np.zeros(3 * n, np.int32)
        self.task, self.ln_task = np.zeros(2, np.int32), np.zeros(2, np.int32)
        self.lsave, self.isave, self.dsave = np.zeros(4, np.int32), np.zeros(44, np.int32), np.zeros(29)
        self.max_iterations, self.tolerance = max_iterations, tolerance
        self.iterations, self.evaluations = 0, 1

    def advance(self) -> bool:
        """Run the routine until it needs ``(f, ∇f)`` at a new :attr:`x` (``True``; at the point last
        evaluated the values are handed back at once, as SciPy's ``ScalarFunction`` does) or has
        stopped (``False``)."""
        from scipy.optimize import _lbfgsb
        while True:
            self.g = self.g.astype(np.float64)
            _lbfgsb.setulb(LBFGSB_MEMORY, self.x, *self.bounds, self.f, self.g,
                           LBFGSB_FTOL / np.finfo(float).eps, self.tolerance, self.wa, self.iwa, self.task,
                           self.lsave, self.isave, self.dsave, LBFGSB_MAXLS, self.ln_task)
            if self.task[0] == 3:                     # FG: the values at x
                if not np.array_equal(self.x, self.cache[0]):
                    return True
                self.f, self.g = self.cache[1:]
            elif self.task[0] == 1:                   # NEW_X: an iteration done
                self.iterations += 1
                if self.iterations >= self.max_iterations:
                    self.task[:] = (5, 504)
                elif self.evaluations > LBFGSB_MAXFUN:
                    self.task[:] = (5, 502)
            else:
                return False

    def tell(self, f: float, g) -> None:
        """The objective and gradient at :attr:`x` (asked for by :meth:`advance`)."""
        self.cache = (self.x.copy(), f, g)
        self.f, self.g = f, g
        self.evaluations += 1

    def result(self) -> optimize.OptimizeResult:
        """``optimize.minimize``'s result fields (``x``, ``fun``, ``jac``, ``nit``, ``success``, ``message``)."""
        status, task = int(self.task[0]), int(self.task[1])
        message = _LBFGSB_STATUS.get(status, str(status)) + ": " + _LBFGSB_TASK.get(task, "")
        return optimize.OptimizeResult(x=self.x, fun=self.f, jac=self.g, nit=self.iterations,
                                       nfev=self.evaluations, success=status == 4, message=message)


@functools.cache
def lockstep_usable() -> bool:
    """Whether SciPy's L-BFGS-B routine drives as :class:`_LbfgsbStart` expects: its signature is SciPy's
    private one (``scipy.optimize._lbfgsb.setulb``), so a SciPy release may change it. Rosenbrock's function
    from ``(−1.2, 1)`` is solved both ways once per process; unless the two agree bit for bit (point,
    value, iterations) :func:`centralized_optima` takes the reference path (the same optima, slower) and
    says so once.

    Returns
    -------
    bool
        The lock-step solver is SciPy's ``optimize.minimize``, bit for bit, under this SciPy.

    Examples
    --------
    >>> from linattn_theory.theory.profile import lockstep_usable
    >>> lockstep_usable()
    True
    """
    def rosenbrock(x):
        return optimize.rosen(x), optimize.rosen_der(x)

    x0, iterations, tolerance = np.array([-1.2, 1.0]), 100, 1e-10
    reference = optimize.minimize(rosenbrock, x0, jac=True, method="L-BFGS-B",
                                  options={"maxiter": iterations, "ftol": LBFGSB_FTOL, "gtol": tolerance,
                                           "maxcor": LBFGSB_MEMORY, "maxls": LBFGSB_MAXLS, "maxfun": LBFGSB_MAXFUN})
    try:                                  # any failure of a private routine means: do not use it
        start = _LbfgsbStart(x0, *rosenbrock(x0), iterations, tolerance)
        while start.advance():
            start.tell(*rosenbrock(start.x))
        ours = start.result()
        usable = bool(np.array_equal(ours.x, reference.x) and ours.fun == reference.fun
                      and ours.nit == reference.nit)
    except Exception as error:            # noqa: BLE001 (a private API: its failure is the answer)
        usable, ours = False, error
    if not usable:
        warnings.warn(f"scipy {__import__('scipy').__version__}: its private L-BFGS-B routine does not drive as "
                      f"expected ({ours!r:.200}); centralised optima take the reference path (same optima, slower)",
                      RuntimeWarning, stacklevel=2)
    return usable


def centralized_optima(problems, *, lockstep: bool = True) -> list[CentralizedOptimum]:
    """:func:`centralized_optimum` of many problems (dicts of its keyword arguments) at once.

    Every start of every problem runs SciPy's L-BFGS-B in lock-step with the others, in this
    thread (:class:`_LbfgsbStart`, reverse communication); the objective and gradient evaluations
    all starts ask for are computed together, one array program per problem (a leading axis of
    kernels, :func:`_profile_batch`). Each start follows exactly its sequential path (that of
    ``optimize.minimize(method="L-BFGS-B")`` alone), so every optimum equals the one-at-a-time
    result, bit for bit; a start repeated on equal data (problems that share their clients and
    seed share their random starts) runs once.

    Parameters
    ----------
    problems : iterable of dict
        Keyword arguments of :func:`centralized_optimum`, one dict per problem.
    lockstep : bool, default True
        ``False``: the reference path instead, each start one ``optimize.minimize(method="L-BFGS-B")``
        call after another (same results, bit for bit; slower). Taken also where
        :func:`lockstep_usable` finds SciPy's private routine changed.

    Returns
    -------
    list of CentralizedOptimum
        In the problems' order.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> problems = [dict(clients=lt.planted_kernel_clients(num_clients=2, samples_per_client=32, tokens=4,
    ...                                                    dim=3, rank=1, seed=seed), rank=1, restarts=1)
    ...             for seed in (0, 1)]
    >>> together = lt.centralized_optima(problems)
    >>> [o.objective for o in together] == [lt.centralized_optimum(**p).objective for p in problems]
    True
    """
    problems = [_problem(**dict(problem)) for problem in problems]
    lockstep = lockstep and lockstep_usable()
    digests = _data_digests(problems)
    jobs, same = _distinct_starts(problems, digests)
    with threadpool_limits(1, user_api="blas"):   # tiny BLAS calls: threads only spin (10× slower under load)
        outcomes = (_lockstep if lockstep else _one_by_one)(problems, jobs, digests)
    outcomes.update({job: outcomes[first] for job, first in same.items()})
    optima = [_optimum(problem, [outcomes[(i, j)] for j in range(len(problem.inits))])
              for i, problem in enumerate(problems)]
    return _refined(problems, optima, digests, lockstep)


def _refined(problems: list[_Problem], optima: list, digests: list[bytes], lockstep: bool) -> list:
    """``optima`` after each problem's ``refine`` rounds: a start from the best kernel so far in balanced
    factors (:func:`_factors`), all problems' together, while the objective falls."""
    falling = {i for i, problem in enumerate(problems) if problem.refine > 0}
    for k in range(1, max((p.refine for p in problems), default=0) + 1):
        falling = {i for i in falling if problems[i].refine >= k}
        if not falling:
            break
        again = {i: dataclasses.replace(problems[i], starts=[], inits=[(f"refined_{k}",
                                        *_factors(optima[i].kernel, problems[i].rank))]) for i in sorted(falling)}
        jobs = [(i, 0) for i in again]
        with threadpool_limits(1, user_api="blas"):
            outcomes = (_lockstep if lockstep else _one_by_one)(
                [again.get(i, problem) for i, problem in enumerate(problems)], jobs, digests)
        for i in sorted(falling):
            better, optima[i] = _merged(optima[i], _optimum(again[i], [outcomes[(i, 0)]]))
            if not better:
                falling.discard(i)
    return optima


def _merged(optimum: CentralizedOptimum, refined: CentralizedOptimum):
    """``(lower, merged)``: ``refined``'s row appended to ``optimum``'s table, and its kernel taken when its
    objective is lower (``lower``)."""
    starts = pd.concat([optimum.starts, refined.starts], ignore_index=True)
    lower = refined.objective < optimum.objective
    return lower, dataclasses.replace(refined if lower else optimum, starts=starts)


def _evaluate(problems: list[_Problem], points: dict, batch_of: dict) -> dict:
    """``{job: (Φ_0, ∇Φ_0)}`` at ``points`` ``{(problem, start): x}``: one batch (:func:`_factor_objectives`)
    per group of problems that share their data and factor shape (``batch_of[problem]`` names its group's
    first problem; a kernel's values do not depend on the batch it is computed in)."""
    by_batch: dict = {}
    for (i, j), x in points.items():
        by_batch.setdefault(batch_of[i], []).append(((i, j), x))
    values = {}
    for first, items in by_batch.items():
        values.update(zip([job for job, _ in items], _factor_objectives(problems[first], [x for _, x in items])))
    return values


def _lockstep(problems: list[_Problem], jobs: list, digests: list[bytes]) -> dict:
    """``{(problem, start): (f0, result)}``: every start of ``jobs`` by L-BFGS-B, all advanced together;
    each round evaluates the points every running start asks for in one batch per data set (:func:`_evaluate`)."""
    batch_of = _shared_batches(problems, digests)
    initial = {(i, j): np.concatenate([problems[i].inits[j][1].ravel(), problems[i].inits[j][2].ravel()])
               for i, j in jobs}
    starts = {job: _LbfgsbStart(initial[job], *value, problems[job[0]].max_iterations, problems[job[0]].tolerance)
              for job, value in _evaluate(problems, initial, batch_of).items()}
    running = [job for job in jobs if starts[job].advance()]
    while running:
        for job, (f, g) in _evaluate(problems, {job: starts[job].x for job in running}, batch_of).items():
            starts[job].tell(f, g)
        running = [job for job in running if starts[job].advance()]
    return {job: (starts[job].f0, starts[job].result()) for job in jobs}


def _shared_batches(problems: list[_Problem], digests: list[bytes]) -> dict:
    """``{problem: the first problem with equal data (its :func:`_data_digests` entry) and factor shape}``."""
    first: dict = {}
    for i, (problem, data) in enumerate(zip(problems, digests)):
        first.setdefault((data, problem.shape), i)
    return {i: first[(data, problem.shape)] for i, (problem, data) in enumerate(zip(problems, digests))}


def _one_by_one(problems: list[_Problem], jobs: list, digests=None) -> dict:
    """:func:`_lockstep`'s result by the reference path: each start one ``optimize.minimize`` call."""
    outcomes = {}
    for i, j in jobs:
        problem, (_, WQ, WK) = problems[i], problems[i].inits[j]
        x0 = np.concatenate([WQ.ravel(), WK.ravel()])
        f0 = _factor_objectives(problem, [x0])[0][0]
        res = optimize.minimize(lambda x: _factor_objectives(problem, [x])[0], x0, jac=True, method="L-BFGS-B",
                                options={"maxiter": problem.max_iterations, "ftol": LBFGSB_FTOL, "gtol": problem.tolerance,
                                         "maxcor": LBFGSB_MEMORY, "maxls": LBFGSB_MAXLS, "maxfun": LBFGSB_MAXFUN})
        outcomes[(i, j)] = (f0, res)
    return outcomes


def _data_digest(data: StackedClients) -> bytes:
    """A digest of the stacked clients' contents (equal data, equal digest)."""
    digest = hashlib.sha256(repr((data.attention, float(data.temperature))).encode())
    for array in (data.S, data.q, data.y, data.sample_weight, data.weights, data.X):
        if array is not None:
            array = np.ascontiguousarray(to_numpy(array), dtype=np.float64)
            digest.update(repr(array.shape).encode())
            digest.update(array.tobytes())
    return digest.digest()


def _data_digests(problems: list[_Problem]) -> list[bytes]:
    """:func:`_data_digest` of every problem's data (once per data object)."""
    digests: dict = {}
    for problem in problems:
        if id(problem.data) not in digests:
            digests[id(problem.data)] = _data_digest(problem.data)
    return [digests[id(problem.data)] for problem in problems]


def _distinct_starts(problems: list[_Problem], digests: list[bytes]):
    """``(jobs, same)``: the starts ``(problem, start)`` to run, one per distinct (data, starting
    point, solver settings), and ``{start: the job it repeats}`` for the others (``digests``: the
    problems' :func:`_data_digests`).

    Instances that share their clients and seed (e.g. one task at several step sizes) share their
    random starts; a start is a deterministic function of its data and starting point (its path
    does not depend on the batch it runs in), so a repeat's result is the first run's, bit for bit.
    """
    jobs, same, seen = [], {}, {}
    for i, (problem, data) in enumerate(zip(problems, digests)):
        for j, (_, WQ, WK) in enumerate(problem.inits):
            key = (data, problem.shape, WQ.tobytes(), WK.tobytes(), problem.max_iterations, problem.tolerance)
            if key in seen:
                same[(i, j)] = seen[key]
            else:
                seen[key] = (i, j)
                jobs.append((i, j))
    return jobs, same


def _optimum(problem: _Problem, solved: list) -> CentralizedOptimum:
    """The :class:`CentralizedOptimum` of a problem from its starts' L-BFGS results."""
    shape, size = problem.shape, int(np.prod(problem.shape))
    candidates, rows = [], []
    for label, K in problem.starts:   # the unoptimised starts themselves
        candidates.append((profile_objective(K, problem.data, 0.0)[0], label + " (as given)", K, np.nan))
    for (label, _, _), (f0, res) in zip(problem.inits, solved):
        WQ, WK = res.x[:size].reshape(shape), res.x[size:].reshape(shape)
        K = WQ @ np.swapaxes(WK, -1, -2)
        gnorm = float(np.linalg.norm(res.jac))
        rows.append({"start": label, "initial_objective": f0, "objective": float(res.fun),
                     "iterations": int(res.nit), "converged": bool(res.success),
                     "factor_gradient_norm": gnorm, "message": str(res.message)})
        candidates.append((float(res.fun), label, K, gnorm))
    best = min(candidates, key=lambda c: c[0])
    table = pd.DataFrame(rows)
    converged = any(row["converged"] for row in rows if row["start"] == best[1])
    phi, V = profile_objective(best[2], problem.data, 0.0)
    return CentralizedOptimum(best[2], V, phi, problem.lam, problem.rank, converged, float(best[3]),
                              best[1], table)


def population_value_moments(K, config, samples: int = 4096) -> ValueMoments:
    """Monte-Carlo estimate of the population moments ``E_{D_c}[φφ^T]``, ``E_{D_c}[φ y^T]``, ``E_{D_c}‖y‖²``.

    Fresh samples: the task of ``config`` is regenerated with ``samples`` samples per client drawn
    from the evaluation stream (``fresh_samples=True``), independent of the training
    samples, while the teacher and every client's distribution are unchanged (checked through
    ``truth``). Weights are the training ``p_c``. Returns host :class:`~linattn_theory.core.moments.ValueMoments`.

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Attention kernels.
    config : RunConfig
        The instance (its ``task`` and ``seed``).
    samples : int, default 4096
        Fresh samples per client.

    Returns
    -------
    ValueMoments
        The estimated moments, on the host.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "dim": 4, "rank": 2}})
    >>> K = lt.sim.engine.clients_from_config(config).truth["kernel"]
    >>> moments = lt.population_value_moments(K, config, samples=1000)
    >>> moments.A.shape, moments.B.shape, moments.weights.tolist()
    ((3, 4, 4), (3, 4, 2), [0.333..., 0.333..., 0.333...])
    """
    from ..data.families import clients_from_config
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
    return host_moments(check_kernel(K, data), data)
