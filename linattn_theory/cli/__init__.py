"""The command line ``linattn`` (:func:`main`): simulate, sweep, figures, recommend, derive, …
"""
from ..core.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    ".commands": ["main"],
}, submodules=("commands",))
