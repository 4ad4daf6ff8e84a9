"""linattn-theory: the theory of federated training of linear attention, made measurable.

See docs/theory.md for the mathematics and README.md for the quick start.
"""

__version__ = "0.1.0"

from .config import ConfigError, RunConfig, config_from_dict, load_config
from .federated import RunResult, run_schedule, simulate, stable_learning_rate
from .model import (Params, context_second_moment, features, kernel, loss_and_grad,
                    loss_and_grad_from_moments, predict)
from .results import load_results, load_run
from .sweep import load_sweep, run_sweep
from .tasks import (ClientDataset, FederatedDataset, in_context_regression_clients, make_clients,
                    planted_kernel_clients, stack_clients)

__all__ = [
    "ClientDataset", "ConfigError", "FederatedDataset", "Params", "RunConfig", "RunResult",
    "config_from_dict", "context_second_moment", "features", "in_context_regression_clients",
    "kernel", "load_config", "load_results", "load_run", "load_sweep", "loss_and_grad", "loss_and_grad_from_moments", "make_clients",
    "planted_kernel_clients", "predict", "run_schedule", "run_sweep", "simulate", "stable_learning_rate",
    "stack_clients",
]
