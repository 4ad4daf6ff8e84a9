"""linattn-theory: the theory of federated training of linear attention, made measurable.

See docs/theory.md for the mathematics and README.md for the quick start.
"""

__version__ = "0.1.0"

from .backend import get_namespace
from .config import ConfigError, RunConfig, config_from_dict, load_config
from .federated import RunResult, run_schedule, simulate, stable_learning_rate
from .model import (Params, context_second_moment, features, kernel, loss_and_grad,
                    loss_and_grad_from_moments, predict)
from .moments import ValueMoments, value_moments, value_objective
from .theory import (CentralizedOptimum, centralized_optimum, contraction_rate, decompose_excess_risk,
                     excess_risk_by_warmup, fedavg_fixed_point, frozen_stage_map, population_value_moments,
                     profile_gradient, profile_objective, value_drift_floor, warmup_inexactness)
from .bound import TradeoffBound, estimate_bound
from .recommenders import OnlineRule, Recommendation, recommend, run_online
from .results import load_results, load_run
from .sweep import load_sweep, run_sweep
from .tasks import (ClientDataset, FederatedDataset, in_context_regression_clients, make_clients,
                    planted_kernel_clients, stack_clients)
from .warmup_sweep import warmup_sweep
from .datasets import digits_clients, split_clients

__all__ = [
    "CentralizedOptimum", "Recommendation", "TradeoffBound", "ValueMoments", "centralized_optimum",
    "contraction_rate", "decompose_excess_risk", "estimate_bound", "excess_risk_by_warmup",
    "fedavg_fixed_point", "frozen_stage_map", "population_value_moments", "profile_gradient",
    "profile_objective", "recommend", "run_online", "OnlineRule", "value_drift_floor", "value_moments", "value_objective",
    "warmup_inexactness",
    "ClientDataset", "ConfigError", "FederatedDataset", "Params", "RunConfig", "RunResult",
    "config_from_dict", "context_second_moment", "features", "get_namespace", "in_context_regression_clients",
    "kernel", "load_config", "loss_and_grad", "loss_and_grad_from_moments", "make_clients",
    "planted_kernel_clients", "predict", "run_schedule", "simulate", "stable_learning_rate",
    "stack_clients", "warmup_sweep",
    "load_results", "load_run", "load_sweep", "run_sweep",
    "digits_clients", "split_clients",
]
