"""Reporting: results on disk, sweep analysis, figures and quoted numbers.

:mod:`.results` (reading runs and sweeps), :mod:`.analysis` (a finished sweep's ``R(T0)``, its parts and
best ``T0``: ``linattn analyze``), :mod:`.sweep_analysis` (tables behind the figures),
:mod:`.plotting` (the shared visual language), :mod:`.tuning` (tuned baselines: steps chosen on
design seeds, scored on held-out seeds), :mod:`.figures` (running the figure scripts of
``simulations/``), :mod:`.figure_numbers` (numbers quoted in README and figures/README, generated)
and :mod:`.teaching` (the notebook's helpers).
"""
from ..core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".results": ["load_results", "load_run", "SUMMARY_COLUMNS"],
    ".analysis": ["SweepAnalysis", "analyze_sweep", "analysis_summary", "instance_ids", "grid_columns",
        "RUNS_FILE", "INSTANCES_FILE", "PARTS"],
    ".sweep_analysis": ["runs_by_instance", "frozen_stage_table", "excess_risk_table", "best_warmup",
        "select_instances", "paired_ratios", "gain_summary", "quartiles", "spearman_interval"],
    ".plotting": ["LABELS", "STRATEGY_NAMES", "label", "apply_style", "palette", "figure", "save_figure",
        "drop_diverged", "note_dropped", "dropped_text", "mark_x", "instance_band", "data_ticks",
        "stacked_bars", "log_scale", "curve_rows", "legend_below", "check_print_ready",
        "PALETTE_NAME", "COLUMN_WIDTH", "FULL_WIDTH", "MIN_FONT_SIZE", "QUICK_MARK", "symlog_scale", "Style",
        "METHODS", "METHOD_PANELS", "ATTENTION", "method_style", "heterogeneity_color", "heterogeneity_label",
        "heterogeneity_style", "SEED_MARKERS", "INSTANCE_COLOR", "REFERENCE_COLOR", "STATISTIC_COLOR",
        "mark_best_T0", "best_T0_handle", "BEST_T0_LABEL", "room_on_top", "strip_offsets", "band_text",
        "left_out_text"],
    ".figures": ["find_root", "discover", "make_figures", "figure_sweep", "script_main", "config_path",
        "analysis_workers", "excess_risk_sweep"],
    ".tuning": ["tune_and_hold_out", "choose_steps", "TunedComparison", "grid_settings", "setting_label"],
    ".figure_numbers": ["headline_numbers", "blocks", "replace_blocks", "QUOTED_FILES", "main"],
    ".teaching": ["PASS", "FAIL", "UNANSWERED", "TheoremViolation", "check_exercise", "theorem", "tendency",
        "excess_risk_curve", "notebook_style", "show", "check_legible", "committed_table", "committed_table_folders",
        "NOTEBOOK_DPI", "NOTEBOOK_MIN_FONT_SIZE"],
}, submodules=("results", "analysis", "sweep_analysis", "plotting", "figures", "figure_numbers", "teaching", "tuning",))
