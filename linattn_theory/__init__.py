"""linattn-theory: the theory of federated training of linear attention, made measurable.

See docs/theory.md for the mathematics and README.md for the quick start. The public names
below are imported from their submodules on first use, so that importing the package (and
starting ``linattn``) stays fast.
"""

__version__ = "0.1.0"

import importlib
import sys
import types

#: Public names by submodule; each is imported on first use (PEP 562), so that ``import
#: linattn_theory`` does not import pandas, scipy or matplotlib.
_LAZY = {name: module for module, names in {
    "backend": "get_namespace",
    "config": "ConfigError RunConfig config_from_dict load_config",
    "federated": "RunResult run_schedule simulate stable_learning_rate",
    "model": "Params context_second_moment features kernel loss_and_grad loss_and_grad_from_moments predict",
    "moments": "ValueMoments value_moments value_objective",
    "theory": "CentralizedOptimum centralized_optimum contraction_rate decompose_excess_risk "
              "excess_risk_by_warmup fedavg_fixed_point frozen_stage_map population_value_moments "
              "profile_gradient profile_objective value_drift_floor warmup_inexactness",
    "bound": "TradeoffBound estimate_bound",
    "recommenders": "OnlineRule Recommendation recommend run_online",
    "datasets": "digits_clients split_clients",
    "results": "load_results load_run",
    "sweep": "load_sweep run_sweep",
    "tasks": "ClientDataset FederatedDataset in_context_regression_clients make_clients "
             "planted_kernel_clients stack_clients",
    "warmup_sweep": "warmup_sweep",
}.items() for name in names.split()}

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


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


class _Package(types.ModuleType):
    """Keeps ``linattn_theory.warmup_sweep`` the function when its submodule is first imported."""

    def __setattr__(self, name, value):
        if name == "warmup_sweep" and isinstance(value, types.ModuleType):
            value = value.warmup_sweep
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
