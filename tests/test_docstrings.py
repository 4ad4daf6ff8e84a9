"""The public API's docstrings are numpydoc, as NumPy, SciPy and scikit-learn write them: every
argument described under Parameters, a Returns section and Examples, which run here as doctests."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import tempfile

import pytest

import linattn_theory as lt

numpydoc = pytest.importorskip("numpydoc.docscrape", reason="the docs extra is not installed")

#: the API a user meets first (``import linattn_theory as lt``; README.md, docs/api.md)
TOP_LEVEL = sorted(name for name in set(lt.__all__) - set(lt.LAYERS)
                   if inspect.isfunction(getattr(lt, name)) or inspect.isclass(getattr(lt, name)))


def sections(obj):
    return (numpydoc.ClassDoc if inspect.isclass(obj) else numpydoc.FunctionDoc)(obj)


def arguments(obj) -> list[str]:
    try:
        parameters = inspect.signature(obj).parameters.values()
    except ValueError:                  # an exception class: its one argument is the message
        return []
    return [p.name for p in parameters             # a private argument (``_table``) is not the API's
            if p.name != "self" and not p.name.startswith("_") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def undocumented(obj) -> list[str]:
    """The arguments of ``obj`` its Parameters section leaves out or leaves without a description."""
    described = {name.strip(): desc for entry in sections(obj)["Parameters"]
                 for name, desc in [(entry.name, entry.desc)] for name in name.split(",")}
    return [name for name in arguments(obj) if not "".join(described.get(name, [])).strip()]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_the_top_level_api_has_parameters_returns_and_examples(name):
    obj = getattr(lt, name)
    doc = sections(obj)
    assert not undocumented(obj), f"lt.{name}: arguments without a description: {undocumented(obj)}"
    if inspect.isfunction(obj):
        assert doc["Returns"] and all("".join(r.desc).strip() for r in doc["Returns"]), name
    assert any(">>>" in line for line in doc["Examples"]), f"lt.{name} has no Examples"


def public_objects():
    """Every function and class of a public module's ``__all__``, where it is defined."""
    for info in pkgutil.walk_packages(lt.__path__, "linattn_theory."):
        if info.name.endswith("__main__") or any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == info.name:
                yield f"{info.name}.{name}", obj


def test_a_parameters_section_describes_every_argument():
    """Wherever a public module has a Parameters section, it describes every argument (a partial
    one would hide the rest: the site shows only what the section lists)."""
    incomplete = {name: undocumented(obj) for name, obj in public_objects()
                  if sections(obj)["Parameters"] and undocumented(obj)}
    assert not incomplete


def test_the_check_sees_an_undescribed_argument():
    def f(a, b, *, c=1):
        """Add.

        Parameters
        ----------
        a : int
            First.
        b : int
        """

    assert undocumented(f) == ["b", "c"]


def examples() -> list[doctest.DocTest]:
    """The Examples of every public function and class (module ``__all__``s and the top level)."""
    finder = doctest.DocTestFinder(recurse=False)
    found = []
    for name, obj in public_objects():
        found += [test for test in finder.find(obj, name, globs={}) if test.examples]
    return found


@pytest.mark.slow
def test_the_examples_run(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # the examples' scratch folders
    tests = examples()
    names = {test.name for test in tests}
    assert all(f"{getattr(lt, name).__module__}.{name}" in names for name in TOP_LEVEL)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
