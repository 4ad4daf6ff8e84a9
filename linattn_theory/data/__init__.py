"""Task families: heterogeneous clients by name (docs/theory.md §2, §9).

The planted-kernel and in-context-regression families (:mod:`.tasks`), scikit-learn's digits
split over clients (:mod:`.digits`), and :func:`make_clients`, which builds either by name
(:func:`clients_from_config`: those of a run configuration's task).
Imports only :mod:`linattn_theory.core`.
"""
from ..core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".tasks": ["planted_kernel_clients", "in_context_regression_clients"],
    ".digits": ["split_clients", "digits_clients", "digit_contexts", "evaluate", "SEED_SPLIT"],
    ".families": ["FAMILIES", "FAMILY_KEYS", "family_keys", "family_check", "make_clients", "clients_from_config"],
}, submodules=("tasks", "digits", "families",))
