"""Lazy public names (PEP 562), so that ``import linattn_theory`` and the command line start fast.

A package lists its public names by submodule; each is imported on first attribute access and
cached in the package's namespace. Subpackages are attributes too, imported on first use, as
SciPy and scikit-image (``lazy_loader``) do.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator, Mapping

__all__ = ["attach", "Registry"]


def attach(package: str, names: dict[str, list[str]], submodules: tuple[str, ...] = ()):
    """``(__getattr__, __dir__, __all__)`` for ``package``: ``names`` maps a relative module
    (``".engine"``) to the public names it defines; ``submodules`` are reachable as attributes.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    names : dict of str to list of str
        Relative module to the public names it defines.
    submodules : tuple of str, default ()
        Submodules reachable as attributes.

    Returns
    -------
    __getattr__ : callable
        The module-level ``__getattr__`` (imports on first use).
    __dir__ : callable
        The module-level ``__dir__``.
    public : list of str
        The public names (for ``__all__``).

    Examples
    --------
    >>> from linattn_theory.core.lazy import attach
    >>> getattr_, dir_, public = attach("json", {".decoder": ["JSONDecoder"]})
    >>> public, getattr_("JSONDecoder").__name__
    (['JSONDecoder'], 'JSONDecoder')
    """
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


class Registry(Mapping):
    """Objects by name, each given as itself or as a ``"module:attribute"`` reference imported on
    first use (relative to ``package``), so that registering one imports nothing: the strategies
    (:data:`linattn_theory.sim.strategies.STRATEGIES`) and the task families
    (:data:`linattn_theory.data.families.FAMILIES`) are registries.

    Parameters
    ----------
    entries : dict
        Name to object or ``"module:attribute"`` reference.
    package : str
        The package relative references are imported from.
    what : str
        What the entries are, for error messages.

    Examples
    --------
    >>> from linattn_theory.core.lazy import Registry
    >>> functions = Registry({"sqrt": "math:sqrt"}, "linattn_theory", "function")
    >>> "sqrt" in functions, functions["sqrt"](4.0)
    (True, 2.0)
    >>> functions.register("sqrt", "math:exp")
    Traceback (most recent call last):
    ...
    ValueError: function 'sqrt' is registered already
    """

    def __init__(self, entries: dict, package: str, what: str):
        self._entries, self._package, self._what = dict(entries), package, what

    def __getitem__(self, name: str):
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = getattr(importlib.import_module(module, self._package), attribute)
            self._entries[name] = entry
        return entry

    def __contains__(self, name) -> bool:        # imports nothing
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, name: str, entry: "Callable | str") -> None:
        """Add ``name`` (an identifier); registering a name twice with another entry is an error."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{self._what} name {name!r}: expected an identifier")
        known = self._entries.get(name)
        if known is not None and known != entry:
            raise ValueError(f"{self._what} {name!r} is registered already")
        self._entries[name] = entry
