"""Theory functions: the kernel-profile objective, the frozen-stage closed forms, and the exact
bias–drift decomposition of the excess risk (docs/theory.md §4–6).

Every function is a pure function of a kernel ``K`` ``(H, d, d)`` (or parameters) and the
clients, which may be a :class:`~linattn_theory.tasks.FederatedDataset`, a plain list of
``(X, q, y)`` tuples (``p_c ∝ N_c``) or :class:`~linattn_theory.tasks.StackedClients`. The
moments ``A_c, B_c, y2_c`` come from :func:`linattn_theory.moments.value_moments`, i.e. from the
very empirical objective the simulator optimises; the small dense linear algebra on them
(``Hd × Hd`` matrices) runs on the host.

Symbols (docs/theory.md §4–5): ``Ã_c = A_c + λI``; ``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)``;
``Φ_λ(K) = min_V F_λ(K, V)``; ``V*_λ(K) = Ã^{-1} B``; the frozen-stage map
``V ← M V + b``; its fixed point ``V_FA``; the value drift floor ``D(K)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize
from threadpoolctl import threadpool_limits

from ._array import array_namespace, to_numpy
from .model import Params, _value_matrix, kernel, kernel_gradient_from_inputs, loss_and_grad_from_inputs
from .moments import ValueMoments, value_moments, value_objective
from .tasks import FederatedDataset, StackedClients, stack_clients

__all__ = [
    "profile_objective",
    "profile_gradient",
    "CentralizedOptimum",
    "centralized_optimum",
    "frozen_client_map",
    "frozen_stage_map",
    "fedavg_fixed_point",
    "contraction_rate",
    "value_drift_floor",
    "decompose_excess_risk",
    "excess_risk_by_warmup",
    "local_steps",
    "replay_round",
    "warmup_inexactness",
    "population_value_moments",
]

#: eigenvalues below this fraction of the largest are treated as zero (pseudo-inverse).
PSEUDO_INVERSE_RTOL = 1e-12
#: SeedSequence spawn key of the solver's random starts (apart from the task purposes 0–5).
SEED_OPTIMUM = 101


# --------------------------------------------------------------------------------------
# helpers: clients, moments, symmetric solves
# --------------------------------------------------------------------------------------
def _stacked(clients, attention: str = "linear", temperature: float = 1.0) -> StackedClients:
    """Clients in the stacked sufficient form (built once; pass it on to avoid rebuilding).

    Stacked clients carry their attention (docs/theory.md §9); others are stacked for ``attention``.
    """
    if isinstance(clients, StackedClients):
        return clients
    return stack_clients(clients, attention=attention, temperature=temperature)


def _attention_of(config: dict | None) -> tuple[str, float]:
    """``(attention, temperature)`` of a recorded configuration (linear when it names none)."""
    model = (config or {}).get("model", {}) or {}
    return model.get("attention") or "linear", float(model.get("temperature") or 1.0)


def _check_kernel(K, data: StackedClients, name: str = "K") -> np.ndarray:
    K = np.asarray(to_numpy(K), dtype=np.float64)
    d = data.q.shape[-1]
    if K.ndim == 2:
        K = K[None]
    if K.ndim != 3 or K.shape[-2:] != (d, d):
        raise ValueError(f"{name} has shape {K.shape}; expected (H, d, d) with d = {d}")
    if not np.all(np.isfinite(K)):
        raise ValueError(f"{name} contains non-finite values")
    return K


def _host_moments(K, data: StackedClients) -> ValueMoments:
    """Per-client value moments of kernel ``K`` as host float64 arrays."""
    mom = value_moments(K, data)
    return ValueMoments(*(np.asarray(to_numpy(a), dtype=np.float64)
                          for a in (mom.A, mom.B, mom.y2, mom.weights)))


def _solve_symmetric(A, B, rtol: float = PSEUDO_INVERSE_RTOL):
    """``A^+ B`` for symmetric ``A`` through its eigendecomposition (minimum-norm when singular)."""
    w, U = np.linalg.eigh(A)
    keep = np.abs(w) > rtol * np.max(np.abs(w), axis=-1, keepdims=True)
    inv = np.divide(1.0, w, out=np.zeros_like(w), where=keep)
    return U @ (inv[..., None] * (np.swapaxes(U, -1, -2) @ B))


def _ridge(A, lam: float):
    """``Ã = A + λI`` (works on one matrix or a stack)."""
    return A + lam * np.eye(A.shape[-1])


def _global_objective(V, moments: ValueMoments, lam: float) -> float:
    """``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)`` from the moments (docs/theory.md §4)."""
    return float(np.sum(moments.weights * value_objective(V, moments, lam)))


def _profile_from_moments(moments: ValueMoments, lam: float):
    """``(Φ_λ, V*_λ)`` with ``V* = Ã^{-1} B`` and ``Φ_λ = ½ y2 − ½ tr(B^T V*)``."""
    A, B, y2 = moments.weighted()
    V = _solve_symmetric(_ridge(A, lam), B)
    return float(0.5 * y2 - 0.5 * np.sum(B * V)), V


def _kernel_gradient(K, V, data: StackedClients):
    """``∇_K F(K, V) = Σ_c p_c Σ_i w_i q_i g_i^T`` for the stacked value block ``V`` ``(Hd, p)``.

    Uses :func:`~linattn_theory.model.kernel_gradient_from_inputs` (the data's attention) with ``W_Q = K``,
    ``W_K = I`` (so that ``W_Q W_K^T = K``).
    """
    xp = array_namespace(data.S)
    H, d = K.shape[0], K.shape[-1]
    p = V.shape[-1]
    eye = xp.broadcast_to(xp.eye(d, dtype=data.S.dtype), (H, d, d))
    params = Params(xp.asarray(K, dtype=data.S.dtype), eye,
                    xp.reshape(xp.asarray(V, dtype=data.S.dtype), (H, d, p)))
    G = kernel_gradient_from_inputs(params, data.inputs, data.q, data.y, data.sample_weight,
                                    attention=data.attention, temperature=data.temperature)
    G = xp.sum(xp.reshape(data.weights, (-1, 1, 1, 1)) * G, axis=0)
    return np.asarray(to_numpy(G), dtype=np.float64)


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


def _check_ridge(lam):
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam = {lam!r}; expected a finite ridge λ >= 0")


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
# §5 the frozen stage
# --------------------------------------------------------------------------------------
def _check_schedule(eta, E, server_learning_rate=1.0):
    if not np.isfinite(eta) or eta <= 0:
        raise ValueError(f"eta = {eta!r}; expected a finite step size η > 0")
    if isinstance(E, bool) or not isinstance(E, (int, np.integer)) or E < 1:
        raise ValueError(f"E = {E!r}; expected an integer number of local steps >= 1")
    if not np.isfinite(server_learning_rate) or server_learning_rate <= 0:
        raise ValueError(f"server_learning_rate = {server_learning_rate!r}; expected a number > 0")


def frozen_client_map(moments: ValueMoments, eta: float, E: int, lam: float = 0.0):
    """Each client's ``E`` local steps on ``F_{λ,c}`` as an affine map ``V ↦ M_c V + b_c`` (docs/theory.md §5).

    ``M_c = (I − ηÃ_c)^E`` and ``b_c = Σ_{j<E} (I − ηÃ_c)^j η B_c`` with ``Ã_c = A_c + λI``:
    the local step ``V ← V − η(Ã_c V − B_c)`` applied ``E`` times from ``V = I`` and ``V = 0``.
    Array-API (runs on the moments' namespace); returns ``(M, b)`` of shapes ``(m, Hd, Hd)``
    and ``(m, Hd, p)``.
    """
    A, B = moments.A, moments.B
    xp = array_namespace(A, B)
    identity = xp.eye(A.shape[-1], dtype=A.dtype)
    step = identity - eta * (A + lam * identity)                 # (m, Hd, Hd)
    M = xp.broadcast_to(identity, A.shape)
    b = xp.zeros_like(B)
    for _ in range(E):
        b = xp.matmul(step, b) + eta * B
        M = xp.matmul(step, M)
    return M, b


def _frozen_map(moments: ValueMoments, eta: float, E: int, lam: float, server_learning_rate: float = 1.0):
    """``(M, b)``: ``M = Σ_c p_c (I − ηÃ_c)^E``, ``b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c`` (with server step)."""
    Mc, bc = frozen_client_map(moments, eta, E, lam)
    w = moments.weights
    n = Mc.shape[-1]
    M = np.sum(w[:, None, None] * Mc, axis=0)
    b = np.sum(w[:, None, None] * bc, axis=0)
    s = server_learning_rate
    return (1.0 - s) * np.eye(n) + s * M, s * b


def frozen_stage_map(K, clients, eta: float, E: int, lam: float = 0.0, server_learning_rate: float = 1.0):
    """The affine frozen-stage round ``V^{t+1} = M V^t + b`` on the stacked value block (docs/theory.md §5).

    ``M = Σ_c p_c (I − ηÃ_c)^E`` ``(Hd, Hd)``, ``b = Σ_c p_c Σ_{j<E} (I − ηÃ_c)^j η B_c`` ``(Hd, p)``;
    with a server step size ``η_s``: ``M ← (1 − η_s) I + η_s M``, ``b ← η_s b``.
    """
    _check_ridge(lam)
    _check_schedule(eta, E, server_learning_rate)
    data = _stacked(clients)
    return _frozen_map(_host_moments(_check_kernel(K, data), data), eta, E, lam, server_learning_rate)


def _fixed_point(M, b):
    """``V_FA = (I − M)^{-1} b`` (the ``Σ_j`` form: valid when some ``Ã_c`` is singular)."""
    return _solve_symmetric(np.eye(M.shape[-1]) - M, b)


def fedavg_fixed_point(K, clients, eta: float, E: int, lam: float = 0.0):
    """``V_FA(K) = (Σ_c p_c P_c)^{-1} Σ_c p_c P_c V*_c``, ``P_c = I − (I − ηÃ_c)^E`` (docs/theory.md §5).

    Computed as ``(I − M)^{-1} b``, which needs no ``Ã_c^{-1}``; ``E = 1`` gives ``V*_λ(K)``.
    Returns the stacked value block ``(Hd, p)``.
    """
    return _fixed_point(*frozen_stage_map(K, clients, eta, E, lam))


def contraction_rate(K, clients, eta: float, E: int, lam: float = 0.0, server_learning_rate: float = 1.0) -> float:
    """``ρ(K)``, the spectral radius of ``M`` (docs/theory.md §5): ``‖V^t − V_FA‖`` shrinks like ``ρ^{t−T0}``."""
    M, _ = frozen_stage_map(K, clients, eta, E, lam, server_learning_rate)
    return float(np.max(np.abs(np.linalg.eigvalsh(M))))


def _drift_floor(V_FA, V_star, moments: ValueMoments, lam: float) -> float:
    """``½ tr((V_FA − V*)^T Ã (V_FA − V*))``."""
    A, _, _ = moments.weighted()
    delta = V_FA - V_star
    return float(0.5 * np.sum(delta * (_ridge(A, lam) @ delta)))


def value_drift_floor(K, clients, eta: float, E: int, lam: float = 0.0) -> float:
    """``D(K) = F_λ(K, V_FA) − Φ_λ(K) = ½ tr((V_FA − V*_λ)^T Ã (V_FA − V*_λ))`` (docs/theory.md §5)."""
    _check_ridge(lam)
    _check_schedule(eta, E)
    data = _stacked(clients)
    moments = _host_moments(_check_kernel(K, data), data)
    _, V_star = _profile_from_moments(moments, lam)
    return _drift_floor(_fixed_point(*_frozen_map(moments, eta, E, lam)), V_star, moments, lam)


# --------------------------------------------------------------------------------------
# §6 the exact bias–drift decomposition of the excess risk
# --------------------------------------------------------------------------------------
def _run_setting(run, name: str, given):
    """A federated setting given explicitly, else read from the run's recorded configuration."""
    if given is not None:
        return given
    try:
        return run.metadata["config"]["federated"][name]
    except (AttributeError, KeyError, TypeError):
        raise ValueError(f"the run records no configuration; pass {name} explicitly") from None


def _run_clients(run, clients):
    if clients is not None:
        return clients
    from .config import config_from_dict
    from .federated import clients_from_config
    try:
        recorded = run.metadata["config"]    # drop unset options (None) as RunConfig.with_updates does
        recorded = {k: ({kk: vv for kk, vv in v.items() if vv is not None} if isinstance(v, dict) else v)
                    for k, v in recorded.items()}
        return clients_from_config(config_from_dict(recorded))
    except (AttributeError, KeyError, TypeError):
        raise ValueError("the run records no configuration; pass clients explicitly") from None


def _optimum_objective(optimum) -> float:
    return float(optimum.objective if isinstance(optimum, CentralizedOptimum) else optimum)


def decompose_excess_risk(run, clients=None, *, optimum=None, lam: float | None = None,
                          eta: float | None = None, local_steps: int | None = None,
                          server_learning_rate: float | None = None) -> dict:
    """Split a run's excess risk exactly (docs/theory.md §6).

    ``R(T0) = F_λ(θ_T) − Φ*_λ = bias(K_{T0}) + D(K_{T0}) + [F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)]``:
    kernel-profile bias ``Φ_λ(K_{T0}) − Φ*_λ``, value drift floor ``D(K_{T0})`` and the value
    stage's unfinished optimisation (which may be negative: ``V_FA`` is not a minimiser).
    ``R`` is measured from the simulator's last ``loss_regularized``, the three parts from the
    moments, so ``identity_residual = bias + drift_floor + unfinished − excess_risk`` checks the
    moments against the simulator.

    ``run`` is a :class:`~linattn_theory.federated.RunResult` (``K_{T0}`` from its
    ``warmup_params``, ``V_T`` from its final ``params``). ``clients``, ``lam``, ``eta``,
    ``local_steps`` and ``server_learning_rate`` default to those in the run's recorded
    configuration; ``optimum`` is ``Φ*_λ`` (a number or a :class:`CentralizedOptimum`;
    default: :func:`centralized_optimum` started from ``K_{T0}``). Returns a dict.
    """
    if getattr(run, "divergence", None) is not None:
        raise ValueError(f"the run diverged ({run.divergence.message}); its excess risk is undefined")
    lam = float(_run_setting(run, "ridge", lam))
    eta = float(_run_setting(run, "learning_rate", eta))
    E = int(_run_setting(run, "local_steps", local_steps))
    s = float(_run_setting(run, "server_learning_rate", server_learning_rate))
    _check_ridge(lam)
    _check_schedule(eta, E, s)
    clients = _run_clients(run, clients)
    data = _stacked(clients, *_attention_of((getattr(run, "metadata", None) or {}).get("config")))
    K = _check_kernel(kernel(run.warmup_params), data, "kernel(run.warmup_params)")
    if optimum is None:
        optimum = centralized_optimum(clients if data.attention == "linear" else data, lam, rank=run.warmup_params.WQ.shape[-1], heads=K.shape[0],
                                      initial_kernels=[K])
    phi_star = _optimum_objective(optimum)
    moments = _host_moments(K, data)
    phi, V_star = _profile_from_moments(moments, lam)
    M, b = _frozen_map(moments, eta, E, lam, s)
    V_FA = _fixed_point(M, b)
    V_T = _value_matrix(np, np.asarray(to_numpy(run.params.WV), dtype=np.float64))
    table = run.table
    F_T = _global_objective(V_T, moments, lam)
    measured = float(table["loss_regularized"].iloc[-1])
    T0 = int(run.metadata.get("warmup_rounds", -1)) if getattr(run, "metadata", None) else -1
    gamma = table.loc[table["round"] <= max(T0, 0), "cumulative_kernel_drift"].iloc[-1]
    parts = {"bias": phi - phi_star,
             "drift_floor": _drift_floor(V_FA, V_star, moments, lam),
             "unfinished": F_T - _global_objective(V_FA, moments, lam)}
    R = measured - phi_star
    return {"warmup_rounds": T0, "rounds": int(table["round"].iloc[-1]), "excess_risk": R, **parts,
            "identity_residual": parts["bias"] + parts["drift_floor"] + parts["unfinished"] - R,
            "profile_objective": phi, "optimum": phi_star, "loss_regularized": measured,
            "loss_regularized_moments": F_T, "contraction_rate": float(np.max(np.abs(np.linalg.eigvalsh(M)))),
            "cumulative_kernel_drift": float(gamma)}


def excess_risk_by_warmup(config, warmups, clients=None, *, optimum=None, restarts: int = 8,
                          progress: bool = False) -> pd.DataFrame:
    """:func:`decompose_excess_risk` for each warm-up length ``T0`` in ``warmups`` (docs/theory.md §6).

    Runs :func:`~linattn_theory.federated.simulate` with ``federated.strategy = "fedfrozen"`` and
    ``federated.warmup_rounds = T0``; ``Φ*_λ`` (unless given) is one :func:`centralized_optimum`
    started from the teacher, ``restarts`` random kernels and every ``K_{T0}`` the runs reached.
    One row per ``T0``: ``warmup_rounds, excess_risk, bias, drift_floor, unfinished,
    identity_residual, …``; a diverged run gives a row with ``diverged = True``, its round and
    message, and no decomposition.
    """
    from .federated import clients_from_config, simulate
    clients = clients_from_config(config) if clients is None else clients
    runs = {}
    for T0 in warmups:
        cfg = config.with_updates({"federated.strategy": "fedfrozen", "federated.warmup_rounds": int(T0)})
        runs[int(T0)] = simulate(cfg, clients, progress=progress)
    data = _stacked(clients, config.model.attention, config.model.temperature)
    if optimum is None:
        kernels = [to_numpy(kernel(r.warmup_params)) for r in runs.values() if not r.diverged]
        optimum = centralized_optimum(clients if data.attention == "linear" else data, config.federated.ridge, rank=config.model.rank,
                                      heads=config.model.heads, restarts=restarts, seed=config.seed,
                                      initial_kernels=kernels)
    rows = []
    for T0, run in runs.items():
        if run.diverged:
            rows.append({"warmup_rounds": T0, "diverged": True, "diverged_round": run.divergence.round,
                         "message": run.divergence.message})
            continue
        row = decompose_excess_risk(run, data, optimum=optimum)
        rows.append({**row, "warmup_rounds": T0, "diverged": False, "diverged_round": None, "message": ""})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------
# §4 the warm-up as inexact descent on Φ_λ
# --------------------------------------------------------------------------------------
def local_steps(params: Params, clients, eta: float, E: int, lam: float = 0.0, *,
                centralized: bool = False) -> Params:
    """``E`` full-batch gradient steps on every block (docs/theory.md §3).

    ``W ← W − η ∇_W F_{λ,c}`` on each client's own objective, all clients at once (returns
    parameters with a leading client axis ``(m, …)``), or, with ``centralized=True``, the same
    steps on the global ``F_λ = Σ_c p_c F_{λ,c}`` (returns unbatched parameters). The ridge
    ``λ`` acts on ``W_V`` only.
    """
    data = _stacked(clients)
    xp = array_namespace(data.S)
    m = data.S.shape[0]
    params = params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))
    if not centralized:
        params = params.map(lambda a: xp.broadcast_to(a, (m,) + tuple(a.shape)))
    for _ in range(E):
        _, g = loss_and_grad_from_inputs(params, data.inputs, data.q, data.y, data.sample_weight,
                                         attention=data.attention, temperature=data.temperature)
        if centralized:
            g = g.map(lambda a: xp.sum(xp.reshape(data.weights, (-1,) + (1,) * (a.ndim - 1)) * a, axis=0))
        params = Params(params.WQ - eta * g.WQ, params.WK - eta * g.WK,
                        params.WV - eta * (g.WV + lam * params.WV))
    return params


def _server_step(params: Params, client_params: Params, weights, server_learning_rate: float) -> Params:
    """``θ + η_s (Σ_c p_c θ_c − θ)`` block by block, weights renormalised to sum to one."""
    xp = array_namespace(weights)
    w = weights / xp.sum(weights)

    def average(theta, theta_c):
        mean = xp.sum(xp.reshape(w, (-1,) + (1,) * (theta_c.ndim - 1)) * theta_c, axis=0)
        return theta + server_learning_rate * (mean - theta)
    return params.map(average, client_params)


def replay_round(params: Params, clients, eta: float, E: int, lam: float = 0.0,
                 server_learning_rate: float = 1.0):
    """One full-batch, full-participation warm-up round (docs/theory.md §3) from ``params``.

    Returns ``(θ^{t+1}, client_params)``: the server's new parameters and every client's model
    after its ``E`` local steps (leading client axis). Equals the simulator's round.
    """
    _check_ridge(lam)
    _check_schedule(eta, E, server_learning_rate)
    data = _stacked(clients)
    client_params = local_steps(params, data, eta, E, lam)
    return _server_step(params, client_params, data.weights, server_learning_rate), client_params


def _host_kernel(params: Params) -> np.ndarray:
    return np.asarray(to_numpy(kernel(params)), dtype=np.float64)


def _inexactness_row(params: Params, data: StackedClients, eta, E, lam, s):
    """One warm-up round's realised change of ``Φ_λ``, its first-order prediction and the split of the gap."""
    WQ, WK = (np.asarray(to_numpy(a), dtype=np.float64) for a in (params.WQ, params.WK))
    K = WQ @ np.swapaxes(WK, -1, -2)
    H, d, p = K.shape[0], K.shape[-1], params.WV.shape[-1]

    def profile(K):
        return _profile_from_moments(_host_moments(K, data), lam)

    phi, V_star = profile(K)
    G = _kernel_gradient(K, V_star, data)
    GT = np.swapaxes(G, -1, -2)
    dK_exact = -s * eta * E * (G @ WK @ np.swapaxes(WK, -1, -2) + WQ @ np.swapaxes(WQ, -1, -2) @ G)
    predicted = float(np.sum(G * dK_exact))
    # (a) exact step: centralised steps from V*_λ(K^t); (b) centralised steps from V^t
    xp = array_namespace(data.S)
    at_optimum = params.replace(WV=xp.reshape(xp.asarray(V_star, dtype=data.S.dtype), (H, d, p)))
    K_a = _host_kernel(_server_step(at_optimum, _lift(local_steps(at_optimum, data, eta, E, lam,
                                                                   centralized=True)), _one(xp, data), s))
    K_b = _host_kernel(_server_step(params, _lift(local_steps(params, data, eta, E, lam, centralized=True)),
                                    _one(xp, data), s))
    # (c) clients' local steps, each client's model put through the server step, products averaged
    new, client = replay_round(params, data, eta, E, lam, s)
    own = _server_step_per_client(params, client, s)
    w = np.asarray(to_numpy(data.weights), dtype=np.float64)
    K_prod = np.sum((w / w.sum())[:, None, None, None] * _host_kernel(own), axis=0)
    K_new = _host_kernel(new)
    phi_a, phi_b, phi_prod, phi_new = (profile(k)[0] for k in (K_a, K_b, K_prod, K_new))
    V = np.asarray(to_numpy(_value_matrix(xp, params.WV)), dtype=np.float64)
    realised = phi_new - phi
    gap = realised - predicted
    value_lag, client_drift, factor_averaging = phi_b - phi_a, phi_prod - phi_b, phi_new - phi_prod
    row = {"profile_objective": phi, "value_distance": float(np.linalg.norm(V - V_star)),
           "gradient_norm": float(np.linalg.norm(G)), "realised_change": realised,
           "predicted_change": predicted, "gap": gap, "value_lag": value_lag, "client_drift": client_drift,
           "factor_averaging": factor_averaging,
           "remainder": gap - value_lag - client_drift - factor_averaging,
           "exact_step_change": phi_a - phi}
    return row, new


def _lift(params: Params) -> Params:
    """Give unbatched parameters a client axis of length one."""
    return params.map(lambda a: a[None])


def _one(xp, data):
    return xp.ones((1,), dtype=data.S.dtype)


def _server_step_per_client(params: Params, client_params: Params, s: float) -> Params:
    """``θ + η_s (θ_c − θ)`` for each client separately (the product each client's model induces)."""
    return params.map(lambda theta, theta_c: theta + s * (theta_c - theta), client_params)


def warmup_inexactness(config_or_params, clients=None, *, rounds: int | None = None,
                       lam: float | None = None, eta: float | None = None, local_steps: int | None = None,
                       server_learning_rate: float | None = None) -> pd.DataFrame:
    """Per warm-up round, the warm-up as inexact descent on ``Φ_λ`` (docs/theory.md §4).

    For each round ``t`` (full batch, full participation) with ``G = ∇_K Φ_λ(K^t)``:

    - ``realised_change = Φ_λ(K^{t+1}) − Φ_λ(K^t)``;
    - ``predicted_change = ⟨G, ΔK_exact⟩``, ``ΔK_exact = −η_s η E (G W_K W_K^T + W_Q W_Q^T G)``: the
      first-order kernel change of ``E`` centralised gradient steps on the factors with ``V`` at
      ``V*_λ(K^t)`` (the exact preconditioned profile step);
    - ``gap = realised_change − predicted_change``, split telescopically through the kernels
      ``K_a`` (centralised steps from ``(W_Q, W_K, V*_λ(K^t))``), ``K_b`` (centralised steps from
      ``θ^t``), ``K_prod = Σ_c p_c W_{Q,c} W_{K,c}^T`` (clients' local steps, products averaged;
      each client's factors first put through the server step) and ``K^{t+1}`` (factors
      averaged): ``value_lag = Φ(K_b) − Φ(K_a)``, ``client_drift = Φ(K_prod) − Φ(K_b)``,
      ``factor_averaging = Φ(K^{t+1}) − Φ(K_prod)`` and ``remainder`` = what is left, which
      equals ``Φ(K_a) − Φ(K^t) − predicted_change`` (the exact step's higher-order terms).

    ``config_or_params`` is a :class:`~linattn_theory.config.RunConfig` (its initial parameters,
    clients, settings and ``T0`` rounds) or :class:`~linattn_theory.model.Params` (then pass
    ``clients``, ``rounds``, ``lam``, ``eta``, ``local_steps``). One row per round.
    """
    from .config import RunConfig
    if isinstance(config_or_params, RunConfig):
        from .federated import clients_from_config, initial_params
        config = config_or_params
        fed = config.federated
        if fed.batch_size is not None or fed.participation < 1.0:
            raise ValueError(f"warmup_inexactness replays full-batch, full-participation rounds; the config "
                             f"has batch_size = {fed.batch_size}, participation = {fed.participation}")
        clients = clients_from_config(config) if clients is None else clients
        data = _stacked(clients)
        params = initial_params(config, data.q.shape[-1], data.y.shape[-1])
        rounds = config.warmup_rounds if rounds is None else rounds
        lam = fed.ridge if lam is None else lam
        eta = fed.learning_rate if eta is None else eta
        local_steps = fed.local_steps if local_steps is None else local_steps
        server_learning_rate = fed.server_learning_rate if server_learning_rate is None else server_learning_rate
    else:
        params = config_or_params
        missing = [n for n, v in (("clients", clients), ("rounds", rounds), ("lam", lam), ("eta", eta),
                                  ("local_steps", local_steps)) if v is None]
        if missing:
            raise ValueError(f"warmup_inexactness with Params needs {', '.join(missing)}")
        data = _stacked(clients)
        server_learning_rate = 1.0 if server_learning_rate is None else server_learning_rate
    _check_ridge(lam)
    _check_schedule(eta, local_steps, server_learning_rate)
    xp = array_namespace(data.S)
    params = params.map(lambda a: xp.asarray(a, dtype=data.S.dtype))
    rows = []
    for t in range(int(rounds)):
        if not all(np.all(np.isfinite(to_numpy(a))) for a in (params.WQ, params.WK, params.WV)):
            raise ValueError(f"warm-up diverged before round {t} with eta = {eta}; lower the step size")
        row, params = _inexactness_row(params, data, eta, local_steps, lam, server_learning_rate)
        rows.append({"round": t, **row})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------
# population moments
# --------------------------------------------------------------------------------------
def population_value_moments(K, config, samples: int = 4096) -> ValueMoments:
    """Monte-Carlo estimate of the population moments ``E_{D_c}[φφ^T]``, ``E_{D_c}[φ y^T]``, ``E_{D_c}‖y‖²``.

    Fresh samples: the task of ``config`` is regenerated with ``samples`` samples per client drawn
    from the evaluation stream (``fresh_samples=True``), independent of the training
    samples, while the teacher and every client's distribution are unchanged (checked through
    ``truth``). Weights are the training ``p_c``. Returns host :class:`~linattn_theory.moments.ValueMoments`.
    """
    from .federated import clients_from_config
    from .tasks import make_clients
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
