"""The bias–drift trade-off bound ``U(T0)`` and the warm-up length it recommends (docs/theory.md §6).

The final excess risk of FedFrozen with warm-up ``T0`` out of ``T`` rounds splits exactly as

    R(T0) = bias(K_{T0}) + D(K_{T0}) + [F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)].

``derivations/tradeoff.py`` bounds it, for ``T0 ≥ t_s``, by

    U(T0) = b_∞ + (b_s − b_∞) q^{T0 − t_s} + ( √D(K_{T0}) + τ ρ^{T−T0} √u(T0) )²,

and this module evaluates ``U`` on an instance. The modelling choices, each stated in the
derivation and checked here along the simulated path (:class:`AssumptionCheck`):

* **warm-up** (first term): inexact Polyak–Łojasiewicz descent of ``Φ_λ`` along the FedAvg
  path from a burn-in round ``t_s`` on, ``bias_{t+1} ≤ q bias_t + ε`` with
  ``q = 1 − 2μη_sηE(1 − Lη_sηE/2)`` (server step ``η_s``, PL constant ``μ`` and smoothness ``L`` of ``Φ_λ`` in the factors
  ``(W_Q, W_K)``, ``E`` local steps of size ``η``) and per-round inexactness ``ε`` (client
  drift, value lag, factor averaging); unrolled, ``bias(K_t) ≤ b_∞ + (b_s − b_∞) q^{t − t_s}``
  with floor ``b_∞ = ε/(1 − q)`` and ``b_s = bias(K_{t_s})``; before ``t_s`` (the first rounds
  start from a random value block, and the bias may even rise) the bias term is
  ``max_{t ≤ t_s} bias(K_t)``. The constants ``(t_s, q, b_∞)`` are fitted on the warm-up path
  (an a-posteriori bound, :func:`fit_inexact_pl`): for every burn-in and floor the smallest
  ``q`` for which the unrolled inequality holds at every round, and of these the triple whose
  bound certifies the smallest excess risk ``min_{T0} U(T0)``. The unrolled inequality
  therefore holds on the path by construction; the stepwise recursion, the PL inequality and
  the smoothness condition behind it are checked and reported separately.
* **frozen stage** (second term): exact closed forms at the warm-up kernel ``K_{T0}``
  (docs/theory.md §5): the value drift floor ``D``, the value lag at freezing
  ``u = ½‖V_{T0} − V_FA‖²_Ã`` and the ``Ã``-norm contraction ``τ ρ^{k} = ‖Ã^{½} M^{k} Ã^{-½}‖₂``
  after ``k = T − T0`` frozen rounds (``M`` symmetric, so ``τ ≤ √κ(Ã)``). With
  ``F_λ(K, V) − Φ_λ(K) = ½‖V − V*_λ‖²_Ã`` and the triangle inequality, ``D + unfinished ≤
  (√D + τρ^k √u)²``, and also ``≤ (c̄ √D + τρ^k √g)²`` with ``g = F_λ(θ_{T0}) − Φ_λ(K_{T0})`` and
  ``c̄ = ‖I − M^k‖_Ã`` (exact for plain FedAvg); ``U`` uses the smaller. This needs a
  full-batch, full-participation frozen stage (the affine map of §5).

``T0_theory`` is the exact minimiser of ``U`` over ``0..T``; :func:`closed_form_warmup` is the
closed-form minimiser of the two-term model (geometric bias, drift floor growing linearly at rate
``γ``, frozen-stage transient dropped) that sympy derives. The drift scaling law
``D ≈ η²(E−1)²/8 ‖Σ_c p_c (Ã_c − Ã) g_c‖²_{Ã⁻¹} ≤ η²(E−1)² σ_A² ζ² / (8 λ_min(Ã))`` is
:func:`drift_floor_leading_order`; its exponents are derived, not typed in
(:func:`linattn_theory.theory.scaling_laws.drift_exponents`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.arrays import to_numpy
from ..sim.config import RunConfig
from ..data.families import clients_from_config
from ..sim.engine import Divergence
from ..core.model import Params, value_matrix, kernel
from ..core.clients import StackedClients, stack_clients
from .profile import centralized_optimum, profile_objective
from .frozen_stage import drift_floor_from_moments, fixed_point, affine_round, spectral_radius
from .host import (as_stacked, check_kernel, host_moments, host_moments_and_features, kernel_gradient,
                   profile_from_moments)

__all__ = [
    "AssumptionCheck",
    "BoundConstants",
    "TradeoffBound",
    "WarmupPath",
    "path_from_states",
    "first_rounds",
    "gradient_dissimilarity",
    "drift_floor_leading_order",
    "frozen_stage_bound",
    "tradeoff_bound",
    "fit_inexact_pl",
    "closed_form_warmup",
    "path_terms",
    "path_optimum",
    "estimate_bound",
    "drift_growth_rate",
]


#: Relative size of the floor grid searched by :func:`fit_inexact_pl`.
FLOOR_GRID = 400


# --------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AssumptionCheck:
    """One assumption of the bound, checked along the simulated path.

    ``holds`` says whether it held; ``measured`` is the measured quantity and ``detail`` says
    what was compared with what. A violated assumption is reported, never dropped.

    Parameters
    ----------
    name : str
        The assumption, as docs/theory.md §6 states it.
    holds : bool
        Whether it held along the path.
    measured : float
        The measured quantity.
    detail : str, default ""
        What was compared with what.

    Examples
    --------
    >>> from linattn_theory.theory.bound import AssumptionCheck
    >>> check = AssumptionCheck("rho(K_t) < 1 along the path", holds=False, measured=1.02, detail="max rho = 1.02")
    >>> check.holds, check.measured, AssumptionCheck("L > 0", True, 3.0).detail
    (False, 1.02, '')
    """

    name: str
    holds: bool
    measured: float
    detail: str = ""


@dataclass(frozen=True)
class BoundConstants:
    """The instance's constants in ``U(T0)`` (symbols of docs/theory.md §6 and derivations/tradeoff.py).

    ``b0 = bias(K_0)``; ``burn_in`` ``t_s`` (the inexact-PL recursion is assumed from round ``t_s``
    on), ``b_start = bias(K_{t_s})``, ``burn_in_level = max_{t ≤ t_s} bias(K_t)``; ``b_floor = b_∞``,
    ``q = 1 − 2μη_sηE(1 − Lη_sηE/2)`` (``η_s`` the server step); ``mu`` (PL constant implied by ``q``), ``L`` (smoothness of ``Φ_λ``
    along the path from ``t_s`` on, secant estimate), ``epsilon = (1 − q) b_∞`` (per-round inexactness); ``zeta2`` (client dissimilarity ``Σ_c p_c ‖∇_V F_{λ,c}(K, V*_λ)‖²``),
    ``curvature_spread2`` (``σ_A² = Σ_c p_c ‖Ã_c − Ã‖₂²``), ``lambda_min`` (of ``Ã``), ``rho``,
    ``tau``, ``drift_floor`` at ``K_{T0_theory}``; ``rho_max``/``tau_max`` over the path;
    ``drift_growth`` ``γ`` (least-squares slope of ``D(K_t)`` in ``t``) and ``drift_floor_initial``
    ``D(K_0)``; ``optimum`` ``Φ*_λ``.

    Parameters
    ----------
    T, eta, local_steps, lam
        Rounds ``T``, client step size ``η``, local steps ``E`` and ridge ``λ`` of the instance.
    optimum : float
        ``Φ*_λ``.
    b0, burn_in, b_start, burn_in_level, b_floor, q
        The bias term's constants (above; :func:`fit_inexact_pl`).
    mu, L, epsilon
        PL constant, smoothness and per-round inexactness implied by them.
    zeta2, curvature_spread2, lambda_min
        Client dissimilarity, curvature spread and smallest eigenvalue of ``Ã`` at ``K_{T0_theory}``.
    rho, tau, drift_floor
        Contraction rate, transient factor and drift floor at ``K_{T0_theory}``.
    rho_max, tau_max
        Their largest values along the path.
    drift_growth, drift_floor_initial
        ``γ`` and ``D(K_0)``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> from linattn_theory.recommenders.scoring import fedavg_path      # the theory reads a path, runs none
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.theory.bound import BoundConstants, path_from_states
    >>> path = path_from_states(fedavg_path(config, clients)[1])
    >>> constants = lt.estimate_bound(config, clients, path=path, optimum=0.2).constants
    >>> isinstance(constants, BoundConstants), constants.T, constants.optimum
    (True, 4, 0.2)
    >>> bool(np.isclose(constants.epsilon, (1 - constants.q) * constants.b_floor))     # ε = (1 − q) b_∞
    True
    """

    T: int
    eta: float
    local_steps: int
    lam: float
    optimum: float
    b0: float
    burn_in: int
    b_start: float
    burn_in_level: float
    b_floor: float
    q: float
    mu: float
    L: float
    epsilon: float
    zeta2: float
    curvature_spread2: float
    lambda_min: float
    rho: float
    tau: float
    drift_floor: float
    rho_max: float
    tau_max: float
    drift_growth: float
    drift_floor_initial: float

    def as_dict(self) -> dict:
        """The constants as a plain ``{name: value}`` dictionary."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class TradeoffBound:
    """``U(T0)`` on ``0..T`` with its minimiser, constants and assumption checks.

    ``curve`` has one row per ``T0``: ``U``, ``bias_bound`` (first term), ``frozen_bound`` (second
    term) and the measured path quantities (``bias``, ``drift_floor``, ``contraction_rate``,
    ``value_lag``, ``tau``, …). ``T0_closed_form`` is the two-term model's closed-form minimiser
    (a real number, possibly outside ``[0, T]``).

    Parameters
    ----------
    T0_theory : int
        ``argmin_{T0} U(T0)`` over ``0..T``.
    T0_closed_form : float
        The two-term model's closed-form minimiser.
    curve : pandas.DataFrame
        ``U`` and its terms, one row per ``T0``.
    constants : BoundConstants
        The fitted constants of ``U`` (docs/theory.md §6).
    checks : tuple of AssumptionCheck
        Each assumption of the bound, checked along the path (``violated`` first to read).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 8, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.recommendation import warmup_path   # the theory reads a path
    >>> bound = lt.estimate_bound(config, path=warmup_path(config), restarts=2)
    >>> len(bound.U), bound.T0_theory == int(bound.U.argmin())
    (9, True)
    >>> [check.name for check in bound.checks if not check.holds] == [check.name for check in bound.violated]
    True
    """

    T0_theory: int
    T0_closed_form: float
    curve: pd.DataFrame
    constants: BoundConstants
    checks: tuple[AssumptionCheck, ...]

    @property
    def U(self) -> np.ndarray:
        """``U(T0)`` for ``T0 = 0..T``."""
        return self.curve["U"].to_numpy()

    @property
    def violated(self) -> list[AssumptionCheck]:
        """The checks that failed on the simulated path."""
        return [c for c in self.checks if not c.holds]


# --------------------------------------------------------------------------------------
# the warm-up path
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WarmupPath:
    """The FedAvg trajectory ``θ^0 … θ^T`` (host arrays): every ``K_{T0}`` a warm-up can stop at.

    ``table`` is the simulator's per-round table of the whole run; ``divergence`` is set when the
    run stopped early (``params`` then ends at the last finite state). The theory reads a path, it
    runs none: :func:`~linattn_theory.recommenders.recommendation.warmup_path` simulates one.

    Parameters
    ----------
    params : tuple of Params
        ``θ^0 … θ^T`` (fewer when the run diverged).
    table : pandas.DataFrame
        The per-round table.
    divergence : Divergence, optional
        Where the run diverged.

    Examples
    --------
    >>> import pandas as pd
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.bound import WarmupPath
    >>> path = WarmupPath((lt.Params.init(d=4, r=2, p=1),), pd.DataFrame({"round": [0]}))
    >>> len(path.params), path.divergence is None
    (1, True)
    """

    params: tuple[Params, ...]
    table: pd.DataFrame
    divergence: Divergence | None = None


def path_from_states(states) -> WarmupPath:
    """The :class:`WarmupPath` of one FedAvg run from its states after rounds ``0..T`` (what
    :func:`~linattn_theory.sim.engine.run_schedule` passes to ``on_round``): with full batches and
    full participation the same ``θ^t`` and table, bit for bit, as ``T`` one-round runs
    (:func:`~linattn_theory.recommenders.recommendation.warmup_path` uses it there). A prefix of the states is the path of a pilot of that many rounds.

    Parameters
    ----------
    states : sequence of RunState
        The states after rounds ``0..T``, in order.

    Returns
    -------
    WarmupPath
        The trajectory.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> from linattn_theory.recommenders.scoring import fedavg_path      # the theory reads a path, runs none
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.theory.bound import path_from_states
    >>> path = path_from_states(fedavg_path(config, clients)[1])
    >>> len(path.params), len(path.table), path.table["strategy"].unique().tolist()     # θ^0..θ^4, rounds 1..4
    (5, 4, ['fedavg'])
    >>> fedavg = lt.simulate(config.with_updates({"federated.strategy": "fedavg"}), clients)
    >>> bool(np.array_equal(path.params[-1].WV, fedavg.params.WV))
    True
    """
    table = pd.DataFrame(states[-1].rows).iloc[1:].reset_index(drop=True)
    table["cumulative_kernel_drift"] = np.cumsum(table["kernel_drift"].to_numpy())
    table["strategy"] = "fedavg"          # a FedFrozen run still warming up is plain FedAvg
    return WarmupPath(tuple(state.params for state in states), table, None)


# --------------------------------------------------------------------------------------
# frozen-stage quantities at one kernel
# --------------------------------------------------------------------------------------
def _host(a) -> np.ndarray:
    return np.asarray(to_numpy(a), dtype=np.float64)


def config_stacked(config: RunConfig, clients, dtype=np.float64) -> StackedClients:
    """``clients`` stacked with the config's attention and temperature (docs/theory.md §9), once."""
    if isinstance(clients, StackedClients):
        return clients
    return stack_clients(clients, dtype=dtype, attention=config.model.attention,
                         temperature=config.model.temperature)


def _moments(K, data, lam):
    """Per-client ``Ã_c`` ``(m, Hd, Hd)``, ``B_c``, weights ``p_c`` and the global ``Ã`` (host arrays)."""
    return _client_moments(host_moments(K, data), lam)


def _client_moments(moments, lam):
    """:func:`_moments` from the clients' host moments."""
    A_c, w = moments.A + lam * np.eye(moments.A.shape[-1]), moments.weights
    return A_c, moments.B, w, np.sum(w[:, None, None] * A_c, axis=0)


def _client_gradients_at_optimum(K, data, lam):
    """``g_c = ∇_V F_{λ,c}(K, V*_λ) = Ã_c V* − B_c`` (``Σ_c p_c g_c = 0``) and the moments."""
    A_c, B_c, w, A = _moments(K, data, lam)
    _, V_star = profile_objective(K, data, lam)
    return A_c @ V_star - B_c, A_c, w, A


def gradient_dissimilarity(K, clients, lam: float = 0.0) -> float:
    """Client dissimilarity ``ζ²(K) = Σ_c p_c ‖∇_V F_{λ,c}(K, V*_λ(K))‖_F²`` at the value optimum (docs/theory.md §6).

    Parameters
    ----------
    K : array_like, shape (H, d, d)
        Kernels.
    clients : FederatedDataset or StackedClients
        The clients.
    lam : float, default 0.0
        Ridge ``λ``.

    Returns
    -------
    float
        ``ζ²(K)``; 0 when every client has the same value optimum.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.bound import gradient_dissimilarity
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> bool(gradient_dissimilarity(clients.truth["kernel"], clients, lam=0.1) > 0)
    True
    >>> one = lt.planted_kernel_clients(num_clients=1, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> bool(gradient_dissimilarity(one.truth["kernel"], one, lam=0.1) < 1e-20)     # V*_λ is its own optimum
    True
    """
    data = as_stacked(clients)
    g, _, w, _ = _client_gradients_at_optimum(K, data, lam)
    return float(np.sum(w * np.sum(g * g, axis=(-2, -1))))


def drift_floor_leading_order(K, clients, eta: float, E: int, lam: float = 0.0) -> dict:
    """Leading order of the value drift floor in ``η`` (docs/theory.md §6; derivations/tradeoff.py).

    ``V_FA − V*_λ = η(E−1)/2 · Ã⁻¹ Σ_c p_c (Ã_c − Ã) g_c + O(η²)``, hence

        D₂ = η²(E−1)²/8 · ‖Σ_c p_c (Ã_c − Ã) g_c‖²_{Ã⁻¹}  ≤  η²(E−1)² σ_A² ζ² / (8 λ_min(Ã)),

    with ``g_c`` the client gradients at ``V*_λ``, ``ζ² = Σ_c p_c ‖g_c‖²`` and
    ``σ_A² = Σ_c p_c ‖Ã_c − Ã‖₂²`` (Cauchy–Schwarz). Returns ``leading_order`` (``D₂``),
    ``upper`` (the right-hand bound), ``zeta2``, ``curvature_spread2`` and ``lambda_min``.

    Parameters
    ----------
    K, clients, eta, E, lam
        As in :func:`~linattn_theory.theory.frozen_stage.value_drift_floor`.

    Returns
    -------
    dict
        ``leading_order``, ``upper``, ``zeta2``, ``curvature_spread2``, ``lambda_min``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.theory.bound import drift_floor_leading_order
    >>> clients = lt.planted_kernel_clients(num_clients=3, samples_per_client=64, tokens=8, dim=4, rank=2)
    >>> K = clients.truth["kernel"]
    >>> small = drift_floor_leading_order(K, clients, eta=1e-3, E=5)
    >>> exact = lt.value_drift_floor(K, clients, eta=1e-3, E=5)
    >>> bool(abs(small["leading_order"] - exact) < 0.01 * exact), bool(exact <= small["upper"])
    (True, True)
    """
    data = as_stacked(clients)
    return _leading_order(*_client_gradients_at_optimum(K, data, lam), eta, E)


def _leading_order(g, A_c, w, A, eta: float, E: int) -> dict:
    """:func:`drift_floor_leading_order` from the client gradients ``g_c`` at ``V*_λ`` and the moments."""
    spread = A_c - A
    s = np.sum(w[:, None, None] * (spread @ g), axis=0)
    evals, U = np.linalg.eigh(A)
    coords = U.T @ s
    inv_norm = float(np.sum(coords * coords / evals[:, None]))
    scale = eta ** 2 * (E - 1) ** 2 / 8.0
    zeta2 = float(np.sum(w * np.sum(g * g, axis=(-2, -1))))
    sigma2 = float(np.sum(w * np.linalg.norm(spread, ord=2, axis=(-2, -1)) ** 2))
    return {"leading_order": scale * inv_norm, "upper": scale * sigma2 * zeta2 / evals[0],
            "zeta2": zeta2, "curvature_spread2": sigma2, "lambda_min": float(evals[0])}


def _transient(M, A, k: int) -> tuple[float, float, float]:
    """``(‖M^k‖_Ã, ‖I − M^k‖_Ã, √κ(Ã))`` with ``‖X‖_Ã = ‖Ã^{½} X Ã^{-½}‖₂``, after ``k`` frozen rounds."""
    evals, U = np.linalg.eigh(A)
    root = (U * np.sqrt(evals)) @ U.T
    inv_root = (U / np.sqrt(evals)) @ U.T
    power = np.linalg.matrix_power(M, k)
    norm = float(np.linalg.norm(root @ power @ inv_root, ord=2))
    rest = float(np.linalg.norm(root @ (np.eye(len(M)) - power) @ inv_root, ord=2))
    return norm, rest, float(np.sqrt(evals[-1] / evals[0]))


def frozen_stage_bound(drift_floor, lag, contraction, gap=None, complement=None):
    """``D + unfinished ≤ (√D + c √u)²``, and ``≤ (c̄ √D + c √g)²``: the frozen-stage part of ``U``.

    derivations/tradeoff.py §A: with ``k = T − T0``, ``V_T − V* = (V_FA − V*) + M^k (V_{T0} − V_FA)
    = (I − M^k)(V_FA − V*) + M^k (V_{T0} − V*)``, and the triangle inequality in the ``Ã``-norm.
    ``drift_floor`` ``D(K_{T0})``, ``lag`` ``u = ½‖V_{T0} − V_FA‖²_Ã``, ``contraction``
    ``c = ‖M^k‖_Ã = τ ρ^k``; optionally ``gap`` ``g = ½‖V_{T0} − V*‖²_Ã = F_λ(θ_{T0}) − Φ_λ(K_{T0})`` and
    ``complement`` ``c̄ = ‖I − M^k‖_Ã``, in which case the smaller of the two bounds is returned.

    Parameters
    ----------
    drift_floor : float or array_like
        ``D(K_{T0})``.
    lag : float or array_like
        ``u``.
    contraction : float or array_like
        ``c = τ ρ^k``.
    gap : float or array_like, optional
        ``g``.
    complement : float or array_like, optional
        ``c̄``.

    Returns
    -------
    float or numpy.ndarray
        The bound (elementwise over arrays).

    Examples
    --------
    >>> from linattn_theory.theory.bound import frozen_stage_bound
    >>> float(frozen_stage_bound(drift_floor=4.0, lag=1.0, contraction=0.0))   # converged: D alone
    4.0
    """
    first = (np.sqrt(drift_floor) + np.asarray(contraction) * np.sqrt(lag)) ** 2
    if gap is None:
        return first
    second = (np.asarray(complement) * np.sqrt(drift_floor) + np.asarray(contraction) * np.sqrt(gap)) ** 2
    return np.minimum(first, second)


def tradeoff_bound(T0, T, b_start, b_floor, q, drift_floor, lag, rho, tau, burn_in=0, burn_in_level=None,
                   gap=None, complement=None):
    """``U(T0) = b_∞ + (b_s − b_∞) q^{T0 − t_s} + (√D + τ ρ^{T−T0} √u)²`` for ``T0 ≥ t_s`` (docs/theory.md §6).

    The expression derived in derivations/tradeoff.py (which checks this function against its
    sympy form). ``t_s = burn_in`` is the round from which the inexact-PL recursion holds and
    ``b_s = b_start = bias(K_{t_s})``; for ``T0 < t_s`` the bias term is ``burn_in_level``
    (``max_{t ≤ t_s} bias(K_t)``). ``drift_floor``, ``lag``, ``rho`` and ``tau`` may be arrays over ``T0``;
    with ``gap`` and ``complement`` the frozen-stage term is the smaller of the two bounds of
    :func:`frozen_stage_bound`.

    Parameters
    ----------
    T0 : int or array_like
        Warm-up lengths.
    T : int
        Rounds.
    b_start, b_floor, q
        ``b_s``, ``b_∞`` and the rate ``q`` of the bias term (:func:`fit_inexact_pl`).
    drift_floor, lag, rho, tau
        ``D``, ``u``, ``ρ`` and ``τ`` at ``K_{T0}`` (numbers or arrays over ``T0``).
    burn_in : int, default 0
        ``t_s``.
    burn_in_level : float, optional
        The bias bound before ``t_s``; default ``b_start``.
    gap, complement : float or array_like, optional
        For the second frozen-stage bound (:func:`frozen_stage_bound`).

    Returns
    -------
    float or numpy.ndarray
        ``U(T0)``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.bound import tradeoff_bound
    >>> U = tradeoff_bound(np.arange(5), T=4, b_start=1.0, b_floor=0.1, q=0.5, drift_floor=0.01, lag=1.0,
    ...                    rho=0.9, tau=0.2)
    >>> bool(np.isclose(U[4], 0.1 + 0.9 * 0.5 ** 4 + (0.01 ** 0.5 + 0.2) ** 2))   # T0 = T: ρ⁰ = 1
    True
    >>> int(np.argmin(U))
    4
    """
    T0 = np.asarray(T0, dtype=float)
    tail = b_floor + (b_start - b_floor) * np.power(q, np.maximum(T0 - burn_in, 0.0))
    bias_bound = tail if burn_in_level is None else np.where(T0 < burn_in, burn_in_level, tail)
    return bias_bound + frozen_stage_bound(drift_floor, lag, tau * np.power(rho, T - T0), gap, complement)


def closed_form_warmup(b_start: float, b_floor: float, q: float, drift_growth: float, burn_in: float = 0) -> float:
    """``T0* = t_s + ln(γ / ((b_s − b_∞) ln(1/q))) / ln q``: minimiser of the two-term model.

    The model ``b_∞ + (b_s − b_∞) q^{T0 − t_s} + D_0 + γ T0`` (geometric bias from the burn-in
    round ``t_s`` on, drift floor growing at ``γ`` per warm-up round, frozen-stage transient
    dropped) is convex; derivations/tradeoff.py derives this stationary point with sympy. It is
    interior iff ``(b_s − b_∞) q^{T − t_s} ln(1/q) < γ < (b_s − b_∞) ln(1/q)``; returns ``nan``
    when ``γ ≤ 0`` or ``q ∉ (0, 1)`` (no stationary point: the model says warm up to the end).

    Parameters
    ----------
    b_start, b_floor, q
        ``b_s``, ``b_∞``, ``q`` of the bias term.
    drift_growth : float
        ``γ``.
    burn_in : float, default 0
        ``t_s``.

    Returns
    -------
    float
        ``T0*`` (a real number, possibly outside ``[0, T]``), or ``nan``.

    Examples
    --------
    >>> import math
    >>> from linattn_theory.theory.bound import closed_form_warmup
    >>> T0 = closed_form_warmup(b_start=1.0, b_floor=0.0, q=0.5, drift_growth=0.01)
    >>> round(T0, 6) == round(math.log(0.01 / math.log(2)) / math.log(0.5), 6)
    True
    """
    if not (0.0 < q < 1.0) or drift_growth <= 0 or b_start <= b_floor:
        return float("nan")
    return float(burn_in + np.log(drift_growth / ((b_start - b_floor) * np.log(1.0 / q))) / np.log(q))


# --------------------------------------------------------------------------------------
# constants along the path
# --------------------------------------------------------------------------------------
def _factor_gradient(params: Params, data, V_star, features=None):
    """``∇_{(W_Q, W_K)} Φ_λ = (G W_K, Gᵀ W_Q)`` with ``G = ∇_K F(K, V*_λ(K)) = ∇_K Φ_λ`` (envelope
    theorem, :func:`~linattn_theory.theory.profile.profile_gradient`), flattened; ``features``: those
    of ``K`` from :func:`_kernel_terms`, when at hand."""
    WQ, WK = _host(params.WQ), _host(params.WK)
    G = kernel_gradient(check_kernel(WQ @ np.swapaxes(WK, -1, -2), data), V_star, data, features)
    return np.concatenate([(G @ WK).ravel(), (np.swapaxes(G, -1, -2) @ WQ).ravel()])


def _kernel_terms(K, data, eta: float, E: int, lam: float, s: float) -> dict:
    """The frozen-stage quantities of :func:`path_terms` at one kernel, from one computation of the
    clients' moments: each equals its public function's value (``profile_objective``,
    ``frozen_stage_map`` with the server step, ``fedavg_fixed_point``, ``contraction_rate``,
    ``value_drift_floor``, ``drift_floor_leading_order``) bit for bit."""
    moments, features = host_moments_and_features(check_kernel(K, data), data)
    phi, V_star = profile_from_moments(moments, lam)
    M, _ = affine_round(moments, eta, E, lam, s)
    V_FA = fixed_point(*affine_round(moments, eta, E, lam))
    A_c, B_c, w, A = _client_moments(moments, lam)
    lead = _leading_order(A_c @ V_star - B_c, A_c, w, A, eta, E)
    return {"phi": phi, "V_star": V_star, "M": M, "V_FA": V_FA, "A_c": A_c, "A": A, "features": features,
            "rho": spectral_radius(M), "lead": lead,
            "drift_floor": drift_floor_from_moments(V_FA, V_star, moments, lam)}


def path_terms(path: WarmupPath, clients, config: RunConfig, optimum: float) -> pd.DataFrame:
    """Per round ``t`` of the warm-up path, every quantity of ``U`` and of its assumptions.

    Columns: ``round``, ``profile_objective`` ``Φ_λ(K_t)``, ``bias``, ``drift_floor`` ``D(K_t)``,
    ``value_lag`` ``u(t) = ½‖V_t − V_FA‖²_Ã``, ``value_gap`` ``g(t) = ½‖V_t − V*_λ‖²_Ã``,
    ``contraction_rate`` ``ρ(K_t)``, ``transient`` ``‖Ã^{½}M^{T−t}Ã^{-½}‖``, ``complement``
    ``‖Ã^{½}(I − M^{T−t})Ã^{-½}‖``,
    ``tau`` (= transient / ρ^{T−t}), ``sqrt_condition`` ``√κ(Ã)``, ``factor_gradient_sq``
    ``‖∇_{(W_Q,W_K)}Φ_λ‖²``, ``factor_step`` ``‖θ_{t+1} − θ_t‖`` and ``gradient_change``,
    ``zeta2``, ``curvature_spread2``, ``lambda_min``, ``drift_leading_order``, ``drift_upper``,
    ``curvature_max`` (``max_c λ_max(Ã_c)``).

    Parameters
    ----------
    path : WarmupPath
        The FedAvg path.
    clients : FederatedDataset or StackedClients
        Its clients.
    config : RunConfig
        The instance (step sizes, ridge, ``T``).
    optimum : float
        ``Φ*_λ``.

    Returns
    -------
    pandas.DataFrame
        One row per round of the path.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> from linattn_theory.recommenders.scoring import fedavg_path      # the theory reads a path, runs none
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.theory.bound import path_from_states, path_optimum, path_terms
    >>> path = path_from_states(fedavg_path(config, clients)[1])
    >>> optimum = path_optimum(config, clients, path, restarts=1).objective
    >>> terms = path_terms(path, clients, config, optimum)
    >>> terms["round"].tolist(), bool((terms["bias"] >= 0).all()), bool((terms["drift_floor"] >= 0).all())
    ([0, 1, 2, 3, 4], True, True)
    """
    fed = config.federated
    T, eta, E, lam, s = fed.rounds, fed.learning_rate, fed.local_steps, fed.ridge, fed.server_learning_rate
    data = config_stacked(config, clients)
    rows, grads = [], []
    for t, params in enumerate(path.params):
        K = _host(kernel(params))
        terms = _kernel_terms(K, data, eta, E, lam, s)
        phi, V_star, M, V_FA, A_c, A = (terms[n] for n in ("phi", "V_star", "M", "V_FA", "A_c", "A"))
        V = value_matrix(np, _host(params.WV))
        e, f = V - V_FA, V - V_star
        k = T - t
        transient, complement, sqrt_kappa = _transient(M, A, k)
        rho, lead = terms["rho"], terms["lead"]
        grads.append(_factor_gradient(params, data, V_star, terms["features"]))   # the same K: its features
        rows.append({"round": t, "profile_objective": phi, "bias": phi - optimum,
                     "drift_floor": terms["drift_floor"],
                     "value_lag": float(0.5 * np.sum(e * (A @ e))),
                     "value_gap": float(0.5 * np.sum(f * (A @ f))),
                     "contraction_rate": rho, "transient": transient, "complement": complement,
                     "tau": transient / rho ** k if rho ** k > 0 else sqrt_kappa, "sqrt_condition": sqrt_kappa,
                     "factor_gradient_sq": float(grads[-1] @ grads[-1]),
                     "zeta2": lead["zeta2"], "curvature_spread2": lead["curvature_spread2"],
                     "lambda_min": lead["lambda_min"], "drift_leading_order": lead["leading_order"],
                     "drift_upper": lead["upper"],
                     "curvature_max": float(np.max(np.linalg.eigvalsh(A_c)[:, -1]))})
    theta = [np.concatenate([_host(p.WQ).ravel(), _host(p.WK).ravel()]) for p in path.params]
    for t, row in enumerate(rows):
        if t + 1 < len(rows):
            row["factor_step"] = float(np.linalg.norm(theta[t + 1] - theta[t]))
            row["gradient_change"] = float(np.linalg.norm(grads[t + 1] - grads[t]))
        else:
            row["factor_step"] = row["gradient_change"] = np.nan
    return pd.DataFrame(rows)


def first_rounds(terms: pd.DataFrame, rounds: int) -> pd.DataFrame:
    """:func:`path_terms` of the path's first ``rounds + 1`` kernels (e.g. a pilot's ``0..T_p``) from
    those of the whole path, bit for bit: each row is computed from its round's state alone, except
    ``factor_step`` and ``gradient_change``, which the last round of the shorter path lacks (NaN).

    Parameters
    ----------
    terms : pandas.DataFrame
        :func:`path_terms` of the whole path (same instance and ``Φ*_λ``).
    rounds : int
        The last round kept, ``0 ≤ rounds < len(terms)``.

    Returns
    -------
    pandas.DataFrame
        The rows of rounds ``0..rounds``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> from linattn_theory.recommenders.scoring import fedavg_path
    >>> from linattn_theory.theory.bound import first_rounds, path_from_states, path_terms
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = clients_from_config(config)
    >>> states = fedavg_path(config, clients)[1]
    >>> whole = path_terms(path_from_states(states), clients, config, optimum=0.0)
    >>> first_rounds(whole, 2).equals(path_terms(path_from_states(states[:3]), clients, config, optimum=0.0))
    True
    """
    if not 0 <= rounds < len(terms):
        raise ValueError(f"rounds = {rounds}; expected 0 <= rounds < {len(terms)} (the path's rounds)")
    head = terms.iloc[:rounds + 1].copy()
    head.loc[head.index[-1], ["factor_step", "gradient_change"]] = np.nan
    return head


def fit_inexact_pl(bias, frozen_bound=None, grid: int = FLOOR_GRID) -> tuple[int, float, float]:
    """Constants ``(t_s, b_∞, q)`` of the unrolled inexact-PL bound ``bias_t ≤ b_∞ + (b_s − b_∞) q^{t − t_s}``.

    For every burn-in round ``t_s`` and every floor ``b_∞`` on a grid in ``[0, b_s)``
    (``b_s = bias_{t_s}``), the smallest admissible rate is
    ``q = max_{t > t_s} ((bias_t − b_∞)_+ / (b_s − b_∞))^{1/(t − t_s)}``, so every triple is a valid
    bound along the path (before ``t_s`` the bias is bounded by ``max_{t ≤ t_s} bias_t``). Of
    these, the triple minimising ``min_{T0} [bias bound + frozen_bound]`` (the smallest certified
    excess risk) is returned; without ``frozen_bound``, the one minimising
    ``Σ_t log(bias bound / bias_t)`` (tightest in relative terms).

    Parameters
    ----------
    bias : array_like
        ``bias(K_t)`` for ``t = 0..T``.
    frozen_bound : array_like, optional
        The frozen-stage part of ``U`` for every ``T0``.
    grid : int, default FLOOR_GRID
        Floors ``b_∞`` tried per burn-in round.

    Returns
    -------
    tuple of (int, float, float)
        ``(t_s, b_∞, q)``.

    Examples
    --------
    >>> import numpy as np
    >>> from linattn_theory.theory.bound import fit_inexact_pl
    >>> bias = 0.1 + 0.9 * 0.5 ** np.arange(12)          # an exact geometric descent to 0.1
    >>> t_s, floor, q = fit_inexact_pl(bias)
    >>> bound = floor + (bias[t_s] - floor) * q ** (np.arange(12) - t_s)
    >>> bool((bound >= bias - 1e-12)[t_s:].all())                # a valid bound from t_s on
    True
    """
    b = np.asarray(bias, dtype=float)
    n = len(b)
    if n < 2:
        return 0, float(max(b[0], 0.0)), 0.0
    frozen = None if frozen_bound is None else np.asarray(frozen_bound, dtype=float)
    best = (np.inf, 0, 0.0, 0.0)
    for s in range(n - 1):
        curves, floors, q = _pl_curves(b, s, grid)
        if frozen is None:
            score = np.sum(np.log(np.maximum(curves, 1e-300) / np.maximum(b, 1e-300)), axis=1)
        else:
            score = np.min(curves + frozen[None, :], axis=1)
        i = int(np.argmin(score))
        if score[i] < best[0]:
            best = (float(score[i]), s, float(floors[i]), float(q[i]))
    return best[1], best[2], best[3]


def _pl_curves(b, s: int, grid: int):
    """Bias bounds of every floor on the grid for burn-in ``s``: ``(curves (g, n), floors (g,), q (g,))``."""
    n = len(b)
    b_s, tail = b[s], b[s + 1:]
    lags = np.arange(1, n - s, dtype=float)
    low = min(max(float(np.min(tail)), 0.0), b_s)
    floors = np.unique(np.concatenate([low * np.linspace(0.0, 1.0, grid // 2, endpoint=False),
                                       low + (b_s - low) * np.linspace(0.0, 1.0, grid // 2, endpoint=False)]))
    floors = floors[floors < b_s] if b_s > 0 else np.zeros(1)
    ratio = np.clip((tail[None, :] - floors[:, None]) / (b_s - floors[:, None]), 0.0, None)
    q = np.max(ratio ** (1.0 / lags[None, :]), axis=1)
    ahead = np.arange(n, dtype=float) - s
    curves = floors[:, None] + (b_s - floors[:, None]) * q[:, None] ** np.maximum(ahead, 0.0)[None, :]
    curves[:, :s] = np.max(b[:s + 1])
    return curves, floors, q


def drift_growth_rate(drift_floor, burn_in: int = 0) -> float:
    """``γ``: least-squares slope of ``D(K_t)`` against ``t`` over the rounds ``t ≥ t_s``.

    Parameters
    ----------
    drift_floor : sequence of float
        ``D(K_t)``, ``t = 0..T``.
    burn_in : int, default 0
        ``t_s``.

    Returns
    -------
    float
        The slope ``γ``.

    Examples
    --------
    >>> from linattn_theory.theory.bound import drift_growth_rate
    >>> round(drift_growth_rate([1.0, 3.0, 5.0, 7.0]), 12), round(drift_growth_rate([9.0, 0.0, 1.0, 2.0], burn_in=1), 12)
    (2.0, 1.0)
    """
    D = np.asarray(drift_floor, dtype=float)[burn_in:]
    if len(D) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(D), dtype=float), D, 1)[0])


def path_optimum(config: RunConfig, clients, path: WarmupPath, *, restarts: int = 8):
    """``Φ*_λ`` by :func:`~linattn_theory.theory.profile.centralized_optimum`, also started from the path's
    best and last kernels (so ``Φ*_λ ≤ Φ_λ(K_t)`` on the whole path).

    Parameters
    ----------
    config : RunConfig
        The instance.
    clients : FederatedDataset or StackedClients
        Its clients.
    path : WarmupPath
        The FedAvg path.
    restarts : int, default 8
        Random starts.

    Returns
    -------
    CentralizedOptimum
        The optimum.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> from linattn_theory.recommenders.scoring import fedavg_path      # the theory reads a path, runs none
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = clients_from_config(config)
    >>> from linattn_theory.theory.bound import path_from_states, path_optimum
    >>> path = path_from_states(fedavg_path(config, clients)[1])
    >>> optimum = path_optimum(config, clients, path, restarts=1)
    >>> lam = config.federated.ridge
    >>> profiles = [lt.profile_objective(lt.kernel(params), clients, lam)[0] for params in path.params]
    >>> bool(optimum.objective <= min(profiles))                     # Φ*_λ ≤ Φ_λ(K_t) on the whole path
    True
    """
    fed = config.federated
    data = config_stacked(config, clients)
    phis = [profile_objective(_host(kernel(p)), data, fed.ridge)[0] for p in path.params]
    starts = [_host(kernel(path.params[int(np.argmin(phis))])), _host(kernel(path.params[-1]))]
    return centralized_optimum(data, fed.ridge, rank=config.model.rank, heads=config.model.heads,
                               restarts=restarts, seed=config.seed, initial_kernels=starts)


def estimate_bound(config: RunConfig, clients=None, *, path: WarmupPath,
                   optimum=None, restarts: int = 8, terms: pd.DataFrame | None = None) -> TradeoffBound:
    """Estimate the constants of ``U`` on an instance and evaluate ``U(T0)`` for ``T0 = 0..T``.

    ``path``, one FedAvg run of ``T`` rounds, gives every warm-up kernel: the theory takes the
    simulated path, it runs none (:func:`linattn_theory.recommenders.recommendation.warmup_path`
    runs it, :func:`path_from_states` reads it from a run's states); ``Φ*_λ`` is
    :func:`~linattn_theory.theory.profile.centralized_optimum` (also started from the path's best and
    last kernels, so ``bias ≥ 0`` along the path) unless ``optimum`` (a number or a
    ``CentralizedOptimum``) is given. Every assumption is checked along the path.

    Parameters
    ----------
    config : RunConfig
        The instance (``T``, step sizes, ridge).
    clients : FederatedDataset, optional
        Its clients; default those of ``config``.
    path : WarmupPath, optional
        A FedAvg path already computed (:func:`warmup_path`); default: run one.
    optimum : float or CentralizedOptimum, optional
        ``Φ*_λ``; default computed as above.
    restarts : int, default 8
        Random starts of the centralised optimum.
    terms : pandas.DataFrame, optional
        :func:`path_terms` of ``path`` against ``optimum``, when at hand (then ``optimum`` is required).

    Returns
    -------
    TradeoffBound
        ``curve`` (``U(T0)`` and its terms for ``T0 = 0..T``), its minimiser ``T0_theory``, the
        fitted constants and the assumption checks.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"task": {"num_clients": 3, "samples_per_client": 64, "dim": 4, "rank": 2},
    ...                               "federated": {"rounds": 8, "warmup_rounds": 4}})
    >>> from linattn_theory.recommenders.recommendation import warmup_path   # the theory reads a path
    >>> bound = lt.estimate_bound(config, path=warmup_path(config), restarts=2)
    >>> len(bound.curve), 0 <= bound.T0_theory <= 8
    (9, True)
    >>> bool(bound.curve["U"].min() == bound.curve.loc[bound.curve["round"] == bound.T0_theory, "U"].iloc[0])
    True
    """
    clients = config_stacked(config, clients_from_config(config) if clients is None else clients)
    fed = config.federated
    T = fed.rounds
    if path.divergence is not None:
        raise ValueError(f"the FedAvg warm-up path diverged: {path.divergence.message}")
    if optimum is None:
        if terms is not None:
            raise ValueError("terms: pass the optimum they were computed against too")
        optimum = path_optimum(config, clients, path, restarts=restarts)
    phi_star = float(getattr(optimum, "objective", optimum))
    if terms is None:
        terms = path_terms(path, clients, config, phi_star)
    elif len(terms) != len(path.params):
        raise ValueError(f"terms has {len(terms)} rows; expected one per round of the path ({len(path.params)})")
    frozen = frozen_stage_bound(terms["drift_floor"], terms["value_lag"], terms["transient"],
                                terms["value_gap"], terms["complement"])
    bias = terms["bias"].to_numpy()
    burn_in, b_floor, q = fit_inexact_pl(bias, frozen)
    level = float(np.max(bias[:burn_in + 1]))
    t = terms["round"].to_numpy()
    U = tradeoff_bound(t, T, bias[burn_in], b_floor, q, terms["drift_floor"], terms["value_lag"],
                       terms["contraction_rate"], terms["tau"], burn_in, level, terms["value_gap"],
                       terms["complement"])
    curve = terms.copy()
    curve.insert(1, "U", U)
    curve.insert(2, "bias_bound", U - frozen)
    curve.insert(3, "frozen_bound", frozen)
    T0_theory = int(np.argmin(U))
    constants = _constants(curve, config, phi_star, burn_in, b_floor, q, T0_theory)
    T0_closed = closed_form_warmup(constants.b_start, b_floor, q, constants.drift_growth, burn_in)
    checks = _assumption_checks(curve, config, constants, T0_closed)
    return TradeoffBound(T0_theory, T0_closed, curve, constants, tuple(checks))


def _constants(curve: pd.DataFrame, config, phi_star, burn_in, b_floor, q, T0) -> BoundConstants:
    fed = config.federated
    eta, E = fed.learning_rate, fed.local_steps
    steps = curve["factor_step"].to_numpy()[burn_in:-1]
    changes = curve["gradient_change"].to_numpy()[burn_in:-1]
    moved = steps > 0
    L = float(np.max(changes[moved] / steps[moved])) if np.any(moved) else float("nan")
    step = eta * E * fed.server_learning_rate
    descent = 2.0 * step * (1.0 - L * step / 2.0)
    mu = (1.0 - q) / descent if descent > 0 else float("nan")
    row = curve.iloc[T0]
    return BoundConstants(
        T=fed.rounds, eta=eta, local_steps=E, lam=fed.ridge, optimum=phi_star,
        b0=float(curve["bias"].iloc[0]), burn_in=int(burn_in), b_start=float(curve["bias"].iloc[burn_in]),
        burn_in_level=float(curve["bias"].iloc[:burn_in + 1].max()), b_floor=b_floor, q=q, mu=float(mu), L=L,
        epsilon=(1.0 - q) * b_floor, zeta2=float(row["zeta2"]),
        curvature_spread2=float(row["curvature_spread2"]), lambda_min=float(row["lambda_min"]),
        rho=float(row["contraction_rate"]), tau=float(row["tau"]), drift_floor=float(row["drift_floor"]),
        rho_max=float(curve["contraction_rate"].max()), tau_max=float(curve["tau"].max()),
        drift_growth=drift_growth_rate(curve["drift_floor"], burn_in),
        drift_floor_initial=float(curve["drift_floor"].iloc[0]))


def _assumption_checks(curve: pd.DataFrame, config: RunConfig, c: BoundConstants,
                       T0_closed: float) -> list[AssumptionCheck]:
    """Every assumption of derivations/tradeoff.py, measured along the path (warm-up ones from ``t_s`` on)."""
    fed = config.federated
    bias = curve["bias"].to_numpy()
    s = c.burn_in
    tail, ahead = bias[s:], np.arange(len(bias) - s, dtype=float)
    tol = 1e-12 * max(1.0, abs(c.optimum))
    since = f"rounds t ≥ t_s = {s}"
    checks = [AssumptionCheck(
        "(F) full-batch, full-participation frozen stage (the affine map of docs/theory.md §5 is exact)",
        fed.batch_size is None and fed.participation >= 1.0, float(fed.participation),
        f"batch_size = {fed.batch_size}, participation = {fed.participation}")]
    checks.append(AssumptionCheck("Φ*_λ lower-bounds Φ_λ on the path (bias(K_t) ≥ 0)",
                                  bool(np.min(bias) >= -tol), float(np.min(bias)), "min_t bias(K_t)"))
    rho = curve["contraction_rate"].to_numpy()
    checks.append(AssumptionCheck("(F) stable frozen stage: ρ(K_t) < 1 on the path", bool(np.max(rho) < 1.0),
                                  float(np.max(rho)), "max_t ρ(K_t)"))
    unrolled = c.b_floor + (c.b_start - c.b_floor) * c.q ** ahead - tail
    checks.append(AssumptionCheck(
        "(PL+I) unrolled: bias(K_t) ≤ b_∞ + (b_s − b_∞) q^{t − t_s} for t ≥ t_s, with q < 1",
        bool(np.min(unrolled) >= -tol and c.q < 1.0), float(np.min(unrolled)),
        f"min slack over {since}; q = {c.q:.4g}, b_∞ = {c.b_floor:.4g}"))
    stepwise = c.q * tail[:-1] + c.epsilon - tail[1:]
    share = float(np.mean(stepwise >= -tol)) if len(stepwise) else 1.0
    checks.append(AssumptionCheck(
        "(PL+I) stepwise: bias_{t+1} ≤ q bias_t + ε at every round", share == 1.0, share,
        f"share of {since}; ε = (1 − q) b_∞ = {c.epsilon:.3g}"))
    LEeta = c.L * c.eta * c.local_steps * fed.server_learning_rate
    checks.append(AssumptionCheck("(S) smoothness along the path: L E η < 2 (descent lemma)",
                                  bool(np.isfinite(LEeta) and LEeta < 2.0), float(LEeta),
                                  f"L = {c.L:.4g}, secant estimate over {since}"))
    positive = tail > tol
    name = "(PL) ‖∇_{(W_Q,W_K)} Φ_λ‖² ≥ 2μ bias at every round"
    if np.isfinite(c.mu) and np.any(positive):
        ratio = curve["factor_gradient_sq"].to_numpy()[s:][positive] / (2.0 * tail[positive])
        share = float(np.mean(ratio >= c.mu))
        checks.append(AssumptionCheck(name, share == 1.0, share,
                                      f"share of {since}; μ = {c.mu:.4g} implied by q, min ratio = {np.min(ratio):.4g}"))
    else:
        checks.append(AssumptionCheck(name, False, float("nan"), "μ undefined (q ≥ 1 or L E η ≥ 2)"))
    transient_ratio = (curve["tau"] / curve["sqrt_condition"]).to_numpy()
    checks.append(AssumptionCheck("(F) frozen-stage transient: τ ≤ √κ(Ã) (M symmetric)",
                                  bool(np.max(transient_ratio) <= 1.0 + 1e-9), float(np.max(transient_ratio)),
                                  "max_t τ/√κ"))
    row = curve.iloc[int(np.argmin(curve["U"].to_numpy()))]
    ratio = row["drift_leading_order"] / row["drift_floor"] if row["drift_floor"] > 0 else float("nan")
    checks.append(AssumptionCheck(
        "small-step regime of the drift law: D ≈ D₂ = η²(E−1)²/8 ‖Σ p_c (Ã_c − Ã) g_c‖²_{Ã⁻¹} within 2×",
        bool(np.isfinite(ratio) and 0.5 <= ratio <= 2.0), float(ratio), "D₂/D at K_{T0_theory}"))
    span = (c.b_start - c.b_floor) * np.log(1.0 / c.q) if 0 < c.q < 1 else float("nan")
    interior = bool(np.isfinite(span) and span * c.q ** (c.T - s) < c.drift_growth < span)
    checks.append(AssumptionCheck(
        "(G) interior minimiser of the two-term model: (b_s − b_∞) q^{T−t_s} ln(1/q) < γ < (b_s − b_∞) ln(1/q)",
        interior, float(c.drift_growth), f"γ; closed form T0* = {T0_closed:.4g}"))
    return checks
