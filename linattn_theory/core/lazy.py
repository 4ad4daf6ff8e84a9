"""Lazy public names (PEP 562), so that ``import linattn_theory`` and the command line start fast.

A package lists its public names by submodule; each is imported on first attribute access and
cached in the package's namespace. Subpackages are attributes too, imported on first use, as
SciPy and scikit-image (``lazy_loader``) do.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["attach"]


def attach(package: str, names: dict[str, list[str]], submodules: tuple[str, ...] = ()):
    """``(__getattr__, __dir__, __all__)`` for ``package``: ``names`` maps a relative module
    (``".engine"``) to the public names it defines; ``submodules`` are reachable as attributes."""
    where = {name: module for module, listed in names.items() for name in listed}
    public = sorted(where) + list(submodules)

    def __getattr__(name: str):
        if name in where:
            value = getattr(importlib.import_module(where[name], package), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__, public
