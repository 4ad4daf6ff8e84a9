"""Warm-up recommenders with named information sets, and their scores (docs/theory.md §8).

:mod:`.online` (the causal rule, run as the strategy ``fedfrozen_adaptive`` through the
engine's control hook), :mod:`.signals` and :mod:`.rules` (round 4's freeze signals and one rule
per information set), :mod:`.recommendation` (``recommend`` with modes online, pilot, transfer
and a posteriori) and :mod:`.scoring` (regret against the best warm-up length).
"""
from ..core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".online": ["FreezeForecast", "freeze_forecast", "OnlineRule", "OnlineDecision", "online_decision",
        "OnlineRun", "run_online"],
    ".recommendation": ["MODES", "INFORMATION", "Recommendation", "recommend", "default_pilot_rounds",
        "pilot_bound", "pilot_path", "pilot_warmup", "default_transfer_seeds", "warmup_path",
        "a_posteriori_bound"],
    ".signals": ["stability_margin", "margin_crossing", "offers", "price_of_waiting", "recall_margin",
        "decomposition_forecast"],
    ".rules": ["INFORMATION_SETS", "RULES", "ValueMomentsRecallRule", "ServerObservableRule", "ValueSolveRule",
        "observed_losses", "make_rule"],
    ".scoring": ["best_warmup", "regret", "instance_truth", "instance_truths", "score_instance", "score_instances", "StoredForecast", "StoredForecasts",
        "replay_online", "realised_risk", "ScriptedRule", "is_noisy"],
}, submodules=("online", "recommendation", "rules", "scoring", "signals",))
