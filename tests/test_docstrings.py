"""The public API's docstrings are numpydoc (tests/README.md): every argument described under
Parameters, a Returns section and Examples, which run here as doctests."""

from __future__ import annotations

import doctest
import inspect
import tempfile

import pytest

import linattn_theory as lt

numpydoc = pytest.importorskip("numpydoc.docscrape", reason="the docs extra is not installed")

#: the API a user meets first (README.md, docs/api.md): numpydoc sections complete
FIRST_MET = ["simulate", "simulate_many", "warmup_sweep", "warmup_sweep_many", "config_from_dict", "load_config",
             "make_clients", "planted_kernel_clients", "in_context_regression_clients", "digits_clients", "split_clients",
             "load_sweep", "run_sweep", "load_results", "load_run"]


def sections(obj):
    return (numpydoc.ClassDoc if inspect.isclass(obj) else numpydoc.FunctionDoc)(obj)


def arguments(obj) -> list[str]:
    parameters = inspect.signature(obj).parameters.values()
    return [p.name for p in parameters
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def undocumented(obj) -> list[str]:
    """The arguments of ``obj`` its Parameters section leaves out or leaves without a description."""
    described = {name.strip(): desc for entry in sections(obj)["Parameters"]
                 for name, desc in [(entry.name, entry.desc)] for name in name.split(",")}
    return [name for name in arguments(obj) if not "".join(described.get(name, [])).strip()]


@pytest.mark.parametrize("name", FIRST_MET)
def test_the_first_met_api_has_parameters_returns_and_examples(name):
    obj = getattr(lt, name)
    doc = sections(obj)
    assert not undocumented(obj), f"lt.{name}: arguments without a description: {undocumented(obj)}"
    assert doc["Returns"] and all("".join(r.desc).strip() for r in doc["Returns"]), name
    assert any(">>>" in line for line in doc["Examples"]), f"lt.{name} has no Examples"


def test_a_parameters_section_describes_every_argument():
    """Wherever the public API has a Parameters section, it describes every argument (a partial
    one would hide the rest: the site shows only what the section lists)."""
    incomplete = {}
    for name in sorted(set(lt.__all__) - set(lt.LAYERS)):
        obj = getattr(lt, name)
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and sections(obj)["Parameters"]:
            if undocumented(obj):
                incomplete[name] = undocumented(obj)
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
    finder = doctest.DocTestFinder(recurse=False)
    found = []
    for name in sorted(set(lt.__all__) - set(lt.LAYERS)):
        obj = getattr(lt, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            found += [test for test in finder.find(obj, f"lt.{name}", globs={}) if test.examples]
    return found


@pytest.mark.slow
def test_the_examples_run(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # the examples' scratch folders
    tests = examples()
    assert {test.name for test in tests} >= {f"lt.{name}" for name in FIRST_MET}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
