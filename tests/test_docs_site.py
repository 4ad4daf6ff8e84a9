"""The documentation site builds offline with warnings as errors, and shows what it promises.

The site (docs/conf.py) is built once, by the command the README shows, in a scratch copy of the
repository, so that nothing it generates lands in the checkout. Sphinx runs nitpicky: a
reference in a docstring to a name the code does not have fails the build. The checks below
read the built pages: every public name and module documented, every command and option of the
command line, every figure script in the gallery with its committed figure, and every displayed
formula of docs/theory.md rendered as mathematics.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import pkgutil
import re
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import linattn_theory

ROOT = Path(__file__).resolve().parents[1]
#: the command of the README's Documentation section (tests/test_documented_commands.py checks it)
BUILD_COMMAND = "python -m sphinx -W --keep-going -c docs . docs/_build/html"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("sphinx", reason="the docs extra is not installed (pip install '.[docs]')")
    from test_documented_commands import copy_repository

    scratch = copy_repository(tmp_path_factory.mktemp("repo"))
    argv = [sys.executable, *shlex.split(BUILD_COMMAND)[1:]]
    env = {**os.environ, "PYTHONPATH": str(scratch), "MPLBACKEND": "Agg"}
    proc = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"the site does not build cleanly:\n{proc.stderr[-6000:]}"
    return scratch / "docs" / "_build" / "html"


def inventory(site: Path) -> dict[str, str]:
    """``{name: "domain:role"}`` of every object the site documents (its ``objects.inv``)."""
    data = (site / "objects.inv").read_bytes()
    body = zlib.decompress(data.split(b"\n", 4)[4]).decode()
    entries = {}
    for line in body.splitlines():
        match = re.match(r"(.+?)\s+(\S+:\S+)\s+-?\d+\s", line)
        if match:
            entries[match.group(1)] = match.group(2)
    return entries


def text_of(page: Path) -> str:
    """The visible text of a page, tags removed and white space collapsed."""
    return " ".join(html.unescape(text_of_html(page.read_text(encoding="utf-8"))).split())


def text_of_html(markup: str) -> str:
    return re.sub(r"<(script|style)[^>]*>.*?</\1>|<[^>]+>", " ", markup, flags=re.S)


def public_modules():
    for info in pkgutil.walk_packages(linattn_theory.__path__, "linattn_theory."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            yield info.name


def test_every_public_name_and_module_has_its_page(site):
    documented = inventory(site)
    missing = [name for name in ["linattn_theory", *public_modules()] if documented.get(name) != "py:module"]
    assert not missing, f"modules without a page: {missing}"
    for name in sorted(set(linattn_theory.__all__) - set(linattn_theory.LAYERS)):
        obj = getattr(linattn_theory, name)
        where = f"{obj.__module__}.{obj.__qualname__}"
        assert where in documented, f"lt.{name} ({where}) is not documented"
    for module in public_modules():
        for name in getattr(importlib.import_module(module), "__all__", []):
            obj = getattr(importlib.import_module(module), name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module:
                assert f"{module}.{name}" in documented, f"{module}.{name} is not documented"


def test_the_command_line_page_has_every_command_option_and_refused_input(site):
    import tomllib

    from linattn_theory.cli.commands import build_parser

    page = text_of(site / "docs" / "cli.html")
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, sub in subparsers.choices.items():
        assert f"linattn {name}" in page, name
        for action in sub._actions:
            for option in action.option_strings:
                assert option in page, f"linattn {name} {option}"
    for row in tomllib.loads((ROOT / "docs" / "cli_checks.toml").read_text())["bad_input"]:
        kind = row["kind"]
        assert re.sub(r"`", "", kind).split()[0] in page, kind
    assert "cumulative_kernel_drift" in page


def test_the_gallery_shows_every_figure_script_with_its_figure(site):
    from linattn_theory.report.figures import discover

    scripts = discover(ROOT)
    assert len(scripts) >= 10
    for name in scripts:
        page = site / "docs" / "gallery" / f"{name}.html"
        assert page.is_file(), f"no gallery page for simulations/{name}.py"
        images = re.findall(r'<img[^>]+alt="figures/' + name + r'\.png"[^>]+src="([^"]+)"', page.read_text())
        assert images and (page.parent / images[0]).is_file(), f"{name}: the committed figure is not shown"
    index = (site / "docs" / "gallery" / "index.html").read_text()
    assert all(f"{name}.html" in index for name in scripts)


def test_every_displayed_formula_of_the_theory_is_rendered(site):
    source = (ROOT / "docs" / "theory.md").read_text()
    markup = (site / "docs" / "theory.html").read_text(encoding="utf-8")
    displayed = re.findall(r'<div class="math notranslate nohighlight">', markup)
    assert len(displayed) == len(re.findall(r"\$\$(.*?)\$\$", source, flags=re.S)) >= 40
    outside = re.sub(r'<(span|div) class="math notranslate nohighlight">.*?</\1>', "", markup, flags=re.S)
    assert "$" not in text_of_html(outside), "a formula of docs/theory.md is not rendered as mathematics"


def test_the_site_includes_the_readmes_and_links_the_index(site):
    assert (site / "index.html").is_file() and "docs/index.html" in (site / "index.html").read_text()
    readme = (site / "README.html").read_text(encoding="utf-8")
    assert 'href="docs/theory.html"' in readme and "_images/tradeoff" in readme
    assert (site / "figures" / "README.html").is_file()
