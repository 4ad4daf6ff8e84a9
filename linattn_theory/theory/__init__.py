"""The theory in closed form, checked against the simulator (docs/theory.md §4–7, §9).

Every function is a pure function of a kernel ``K`` ``(H, d, d)`` (or parameters) and the
clients, which may be a :class:`~linattn_theory.core.clients.FederatedDataset`, a plain list of
``(X, q, y)`` tuples (``p_c ∝ N_c``) or :class:`~linattn_theory.core.clients.StackedClients`. The
moments ``A_c, B_c, y2_c`` come from :func:`linattn_theory.core.moments.value_moments`, i.e. from
the very empirical objective the simulator optimises; the small dense linear algebra on them
(``Hd × Hd`` matrices) runs on the host.

Symbols (docs/theory.md §4–5): ``Ã_c = A_c + λI``; ``F_λ(K, V) = Σ_c p_c F_{λ,c}(K, V)``;
``Φ_λ(K) = min_V F_λ(K, V)``; ``V*_λ(K) = Ã^{-1} B``; the frozen-stage map ``V ← M V + b``; its
fixed point ``V_FA``; the value drift floor ``D(K)``.

:mod:`.profile` (``Φ_λ``, its gradient, ``Φ*_λ``), :mod:`.frozen_stage` (§5),
:mod:`.decomposition` (§6), :mod:`.inexactness` (the warm-up as inexact descent, §4),
:mod:`.bound` (the trade-off bound ``U(T0)``, §6–7), :mod:`.scaling_laws` (§7),
:mod:`.static_heads` (§9). Functions that need a simulated path take it as an argument
(:func:`linattn_theory.recommenders.recommendation.warmup_path`, a layer up, runs the FedAvg path).
"""
from ..core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".profile": ["profile_objective", "profile_gradient", "CentralizedOptimum", "centralized_optimum",
        "centralized_optima", "population_value_moments"],
    ".frozen_stage": ["frozen_stage_map", "fedavg_fixed_point", "contraction_rate", "value_drift_floor"],
    ".decomposition": ["decompose_excess_risk", "excess_risk_by_warmup"],
    ".inexactness": ["local_steps", "replay_round", "warmup_inexactness"],
    ".bound": ["AssumptionCheck", "BoundConstants", "TradeoffBound", "WarmupPath", "path_from_states", "first_rounds",
        "gradient_dissimilarity", "drift_floor_leading_order", "frozen_stage_bound",
        "tradeoff_bound", "fit_inexact_pl", "closed_form_warmup", "path_terms", "path_optimum",
        "estimate_bound"],
    ".scaling_laws": ["drift_floor_two_clients", "drift_exponents"],
    ".static_heads": ["attention_scores", "input_independent_share", "select_static_heads", "uniform_pattern",
        "mean_score_pattern", "decay_pattern", "static_patterns", "StaticHeads", "static_features",
        "head_features", "predict_static", "static_profile_objective", "stack_contexts",
        "compare_static_heads", "head_pattern_statistics", "static_head_features",
        "head_static_loss_change", "PATTERNS"],
    "..core.frozen_map": ["frozen_client_map"],
}, submodules=("profile", "frozen_stage", "decomposition", "inexactness", "bound", "scaling_laws", "static_heads",))
