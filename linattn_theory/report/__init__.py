"""Reporting: results on disk, sweep analysis, figures and quoted numbers.

:mod:`.results` (reading runs and sweeps), :mod:`.sweep_analysis` (tables behind the figures),
:mod:`.plotting` (the shared visual language), :mod:`.figures` (running the figure scripts of
``simulations/``), :mod:`.figure_numbers` (numbers quoted in README and figures/README, generated)
and :mod:`.teaching` (the notebook's helpers).
"""
from ..core._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".results": ["load_results", "load_run", "SUMMARY_COLUMNS"],
    ".sweep_analysis": ["runs_by_instance", "frozen_stage_table", "excess_risk_table", "best_warmup",
        "paired_ratios", "gain_summary", "quartiles"],
    ".plotting": ["LABELS", "STRATEGY_NAMES", "label", "apply_style", "palette", "figure", "save_figure",
        "drop_diverged", "note_dropped", "dropped_text", "mark_x", "instance_band", "data_ticks",
        "stacked_bars", "log_scale", "curve_rows", "legend_below", "check_print_ready",
        "PALETTE_NAME", "COLUMN_WIDTH", "FULL_WIDTH", "MIN_FONT_SIZE", "QUICK_MARK"],
    ".figures": ["discover", "make_figures", "figure_sweep", "script_main", "config_path",
        "analysis_workers", "excess_risk_sweep"],
    ".figure_numbers": ["headline_numbers", "blocks", "replace_blocks", "QUOTED_FILES", "main"],
    ".teaching": ["PASS", "FAIL", "UNANSWERED", "TheoremViolation", "check_exercise", "theorem", "tendency",
        "excess_risk_curve"],
}, submodules=("results", "sweep_analysis", "plotting", "figures", "figure_numbers", "teaching",))
