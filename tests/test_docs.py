"""Docs cannot drift from the code: generated pages match, every public function has a docstring."""

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import linattn_theory
from linattn_theory.cli.docgen import api_reference, cli_reference

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page, generate", [("cli.md", cli_reference), ("api.md", api_reference)])
def test_generated_reference_is_up_to_date(page, generate):
    committed = (ROOT / "docs" / page).read_text()
    assert committed == generate(), f"docs/{page} is stale: run python -m linattn_theory.cli.docgen"


def public_objects():
    for info in pkgutil.walk_packages(linattn_theory.__path__, "linattn_theory."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{info.name}.{name}", obj


def test_every_public_function_has_a_docstring():
    missing = [name for name, obj in public_objects()
               if len((inspect.getdoc(obj) or "").strip()) < 20]
    assert not missing, f"public names without a docstring stating their contract: {missing}"
