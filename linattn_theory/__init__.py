"""linattn-theory: the theory of federated training of linear attention, made measurable.

See docs/theory.md for the mathematics, docs/concepts.md for the architecture and README.md for
the quick start. The package is layered; each subpackage imports only from those below it (an
import-linter contract in pyproject.toml enforces it):

    cli            the command line ``linattn``
    report         results on disk, sweep analysis, figures, quoted numbers, teaching helpers
    recommenders   warm-up recommenders (the causal online rule) and their regret
    theory         profile objective, frozen stage, decomposition, bound, scaling laws, static heads
    sim            configurations, strategies, the round engine, warm-up grids, sweeps
    data           task families: synthetic clients and the digits data set
    core           array backends, the model, client data, moments, fused kernels, file writes

The public names below are imported from their modules on first use (PEP 562), and so are the
subpackages (``linattn_theory.sim``, …), so that importing the package, and starting
``linattn``, stays fast.
"""

__version__ = "0.2.0"

from .core.lazy import attach
from .sim.strategies import register_strategy as _register_strategy

#: the layers, bottom to top (docs/concepts.md, "Architecture")
LAYERS = ("core", "data", "sim", "theory", "recommenders", "report", "cli")

__getattr__, __dir__, __all__ = attach(__name__, {
    ".core.backend": ["get_namespace"],
    ".core.errors": ["ConfigError", "RunIntegrityError"],
    ".core.clients": ["ClientDataset", "FederatedDataset", "stack_clients"],
    ".core.model": ["Params", "context_second_moment", "features", "kernel", "loss_and_grad",
                    "loss_and_grad_from_moments", "predict"],
    ".core.moments": ["ValueMoments", "value_moments", "value_objective"],
    ".core.curvature": ["stable_learning_rate"],
    ".data.tasks": ["in_context_regression_clients", "planted_kernel_clients"],
    ".data.digits": ["digits_clients", "split_clients"],
    ".data.families": ["make_clients"],
    ".sim.config": ["RunConfig", "config_from_dict", "load_config"],
    ".sim.rounds": ["RunResult"],
    ".sim.engine": ["run_schedule", "simulate"],
    ".sim.warmup_grid": ["warmup_sweep", "warmup_sweep_many"],
    ".sim.ensemble": ["simulate_many"],
    ".sim.sweep": ["load_sweep", "run_sweep"],
    ".theory.profile": ["CentralizedOptimum", "centralized_optima", "centralized_optimum",
                        "population_value_moments", "profile_gradient", "profile_objective"],
    ".theory.frozen_stage": ["contraction_rate", "fedavg_fixed_point", "frozen_stage_map",
                             "value_drift_floor"],
    ".theory.decomposition": ["decompose_excess_risk", "excess_risk_by_warmup"],
    ".theory.inexactness": ["warmup_inexactness"],
    ".theory.bound": ["TradeoffBound", "estimate_bound"],
    ".recommenders.online": ["OnlineRule", "run_online"],
    ".recommenders.recommendation": ["Recommendation", "recommend"],
    ".report.results": ["load_results", "load_run"],
    ".report.analysis": ["analyze_sweep"],
}, submodules=LAYERS)

# The composition root: strategies defined above the simulator register here, so that the
# round engine runs them through its hook without importing their layer.
_register_strategy("fedfrozen_adaptive", "linattn_theory.recommenders.online:adaptive_strategy")
