"""The simulator: configurations, strategies, the round engine and sweeps (docs/theory.md §3).

:mod:`.config` (validated run configurations), :mod:`.strategies` (one module per federated
strategy, a registry, and the per-round control hook), :mod:`.rounds` (the round loop, one array
program with a leading instance axis: ``run_ensemble``), :mod:`.engine` (one run: ``simulate``
and ``run_schedule``, an ensemble of one), :mod:`.ensemble` (many runs planned into ensembles:
``simulate_many``), :mod:`.warmup_grid` (every warm-up length sharing one FedAvg
prefix), :mod:`.sweep` (grids of runs on disk, resumable) and :mod:`.limits` (resource checks
before work). Imports :mod:`linattn_theory.data` and :mod:`linattn_theory.core`.
"""
from ..core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".config": ["TaskConfig", "ModelConfig", "FederatedConfig", "RunConfig", "load_config",
        "config_from_dict", "config_hash", "ignored_settings", "read_toml", "parse_overrides",
        "apply_overrides", "set_dotted", "to_toml"],
    ".engine": ["simulate", "run_schedule"],
    ".rounds": ["run_ensemble", "Member", "RunResult", "RunState", "Divergence", "select_engine", "objective"],
    ".ensemble": ["simulate_many", "ensemble_key", "initial_params", "prepare_run", "run_metadata",
        "checked_inputs"],
    ".warmup_grid": ["warmup_sweep", "warmup_sweep_many", "frozen_stage_from_moments",
        "frozen_stages_from_moments"],
    ".sweep": ["Sweep", "SweepSummary", "load_sweep", "sweep_from_dict", "run_sweep", "run_dir",
        "is_complete", "grid_size", "summary_table", "summary_row", "finished_runs", "read_table",
        "sweep_lock", "EXECUTORS", "MAX_RUNS", "SUMMARY_COLUMNS"],
    ".limits": ["check_output_folder", "RunEstimate", "estimate_run", "check_resources",
        "default_memory_limit", "DEFAULT_MAX_HOURS", "FLOP_RATE"],
}, submodules=("config", "rounds", "engine", "ensemble", "warmup_grid", "sweep", "limits", "strategies",))
