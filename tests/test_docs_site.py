"""The documentation site builds offline with warnings as errors, and shows what it promises.

The site (docs/conf.py) is built once, by the command the README shows, in a scratch copy of the
repository, so that nothing it generates lands in the checkout. Sphinx runs nitpicky: a
reference in a docstring to a name the code does not have fails the build. The checks below
read the built pages: every public name and module documented, every command and option of the
command line, every figure script in the gallery with its committed figure, every displayed
formula of docs/theory.md rendered as mathematics, and nothing loaded from a network: the site
ships its MathJax, and every formula typesets in it (where Node.js is at hand to run it).
"""

from __future__ import annotations

import html
import html.parser
import importlib
import inspect
import json
import os
import pkgutil
import re
import shlex
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import linattn_theory

ROOT = Path(__file__).resolve().parents[1]
#: the command of the README's Documentation section (tests/test_documented_commands.py checks it)
BUILD_COMMAND = "python -m sphinx -W --keep-going docs docs/_build/html"

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
    assert 'href="docs/theory.html"' in readme and "_images/phase_diagram" in readme and "_images/tradeoff" in readme
    assert (site / "figures" / "README.html").is_file()


#: a URL that a browser fetches from a network: ``http(s)://…`` or protocol-relative ``//…``
NETWORK = re.compile(r"^\s*(https?:)?//", re.I)
#: the attributes by which a page loads something (a link ``<a href>`` is followed only when clicked)
LOADING = {"script": ("src",), "link": ("href",), "img": ("src", "srcset"), "source": ("src", "srcset"),
           "iframe": ("src",), "video": ("src", "poster"), "audio": ("src",), "embed": ("src",),
           "object": ("data",), "image": ("href", "xlink:href"), "use": ("href", "xlink:href")}
#: a load from inside a script or a style sheet: ``import … from "https://…"``, ``url(//…)``, ``@import "…"``
LOADING_IN_CODE = re.compile(r"""(?:\bfrom\s*|\bimport\s*\(\s*|url\(\s*|@import\s+(?:url\()?\s*)["']?((?:https?:)?//[^"')\s]+)""",
                             re.I)


class Loads(html.parser.HTMLParser):
    """What a page loads: ``(tag, URL)`` of its loading attributes, and the text of its inline scripts and styles."""

    def __init__(self):
        super().__init__()
        self.urls, self.code, self._in_code = [], [], False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in LOADING.get(tag, ()) and value:
                self.urls += [(tag, url.split()[0]) for url in value.split(",") if url.strip()]
            if name == "style" and value:
                self.code.append(value)
        self._in_code = tag in ("script", "style")

    def handle_endtag(self, tag):
        self._in_code = False

    def handle_data(self, data):
        if self._in_code:
            self.code.append(data)


def network_loads(page: Path) -> list[str]:
    """The URLs of a network that a page (with the style sheets it links) loads."""
    parser = Loads()
    parser.feed(page.read_text(encoding="utf-8"))
    found = [f"<{tag}> {url}" for tag, url in parser.urls if NETWORK.match(url)]
    found += [f"inline: {url}" for code in parser.code for url in LOADING_IN_CODE.findall(code)]
    for tag, url in parser.urls:
        sheet = (page.parent / url.split("?")[0]).resolve()
        if tag == "link" and sheet.suffix == ".css" and sheet.is_file():
            found += [f"{sheet.name}: {u}" for u in LOADING_IN_CODE.findall(sheet.read_text(encoding="utf-8"))]
    return found


def test_no_page_loads_anything_from_a_network(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 40
    loads = {str(page.relative_to(site)): network_loads(page) for page in pages}
    assert not {page: urls for page, urls in loads.items() if urls}, "pages that need a network"
    assert network_loads(site / "docs" / "index.html") == []
    # the check sees what it must see: the CDN MathJax and Mermaid the site once loaded
    probe = site / "probe.html"
    probe.write_text('<script defer src="https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js"></script>'
                     '<script type="module">import mermaid from "https://cdn.jsdelivr.net/npm/mermaid@11/x.mjs";</script>'
                     '<link rel="stylesheet" href="//fonts.example.org/a.css"><style>@import url(https://x.org/b.css)</style>')
    assert len(network_loads(probe)) == 4
    probe.unlink()


def mathjax_of(page: Path) -> Path:
    """The MathJax a page loads (a file of the site)."""
    parser = Loads()
    parser.feed(page.read_text(encoding="utf-8"))
    scripts = [url for tag, url in parser.urls if tag == "script" and "mathjax" in url.lower()]
    assert len(scripts) == 1, f"{page.name} loads {len(scripts)} MathJax scripts: {scripts}"
    src = scripts[0]
    assert not NETWORK.match(src), src
    return (page.parent / src).resolve()


def test_the_theory_page_loads_the_mathjax_the_site_ships(site):
    page = site / "docs" / "theory.html"
    script = mathjax_of(page)
    assert script.is_file() and script.is_relative_to(site / "_static")
    assert re.search(r'VERSION="3\.\d+\.\d+"', script.read_text(encoding="utf-8"))   # MathJax 3: \(…\) and \[…\]
    mathjax = script.parent
    assert len(list((mathjax / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))) >= 20
    assert (mathjax / "input" / "tex" / "extensions" / "boldsymbol.js").is_file()   # TeX packages load on demand
    markup = page.read_text(encoding="utf-8")
    toc = markup[markup.index('id="pst-page-toc-nav"'):]
    assert re.search(r'<span class="math notranslate nohighlight">\\\(.+?\\\)</span>', toc), \
        "the page's table of contents has no formula MathJax would set"
    for other in site.rglob("*.html"):            # formulas anywhere (navigation too): MathJax there
        if 'class="math notranslate nohighlight"' in other.read_text(encoding="utf-8"):
            assert mathjax_of(other) == script, f"{other.relative_to(site)} shows formulas without MathJax"


def formulas(page: Path) -> list[tuple[str, bool]]:
    """``(TeX, displayed)`` of every formula of a page, as MathJax finds them: ``\\(…\\)``, ``\\[…\\]``
    and the environments of the amsmath blocks, in the page's text."""
    text = html.unescape(text_of_html(page.read_text(encoding="utf-8")))
    found = [(m, False) for m in re.findall(r"\\\((.+?)\\\)", text, flags=re.S)]
    found += [(m, True) for m in re.findall(r"\\\[(.+?)\\\]", text, flags=re.S)]
    outside = re.sub(r"\\\[.+?\\\]|\\\(.+?\\\)", "", text, flags=re.S)
    found += [(m.group(0), True) for m in re.finditer(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", outside, flags=re.S)]
    return found


TYPESET = r"""
const [dir, file] = process.argv.slice(2);
global.MathJax = {loader: {paths: {mathjax: dir}, load: ['input/tex', 'adaptors/liteDOM'], require: require},
                  startup: {typeset: false}};
require(dir + '/startup.js');
MathJax.startup.promise.then(async () => {
  const bad = [];
  for (const [tex, display] of JSON.parse(require('fs').readFileSync(file, 'utf8'))) {
    try {
      const mml = await MathJax.tex2mmlPromise(tex, {display});
      if (/<merror|mathcolor="red"/.test(mml)) bad.push(tex);
    } catch (err) { bad.push(tex + ' (' + err.message + ')'); }
  }
  console.log(JSON.stringify(bad));
});
"""


def test_every_formula_typesets_in_the_mathjax_the_site_ships(site, tmp_path):
    """Every formula of the theory page (its table of contents too) and of the gallery's titles set
    by the page's own MathJax, with the TeX packages of its ``tex-chtml`` component: no TeX error,
    no undefined macro (MathJax shows those in red)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the formulas are not typeset here")
    page = site / "docs" / "theory.html"
    found = formulas(page) + formulas(site / "docs" / "gallery" / "index.html")
    assert len(found) >= len(re.findall(r'class="math notranslate nohighlight', page.read_text(encoding="utf-8")))
    found.append((r"\notamacro{x} + \frac{1}{", True))            # the check sees a TeX error
    (tmp_path / "typeset.js").write_text(TYPESET)
    (tmp_path / "formulas.json").write_text(json.dumps(found))
    proc = subprocess.run([node, str(tmp_path / "typeset.js"), str(mathjax_of(page).parent), str(tmp_path / "formulas.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert bad == [found[-1][0] + bad[-1][len(found[-1][0]):]], f"formulas MathJax cannot set: {bad[:-1]}"


def test_the_diagrams_are_drawn_into_the_page(site):
    """docs/concepts.md's ```mermaid blocks are SVG drawings in the page, the layers' in the order
    of the import-linter contract; no Mermaid is left for a script to draw."""
    markup = (site / "docs" / "concepts.html").read_text(encoding="utf-8")
    labels = [html.unescape(label) for label in re.findall(r'<svg role="img" aria-label="([^"]+)"', markup)]
    assert len(labels) == 2 and "mermaid" not in markup.lower()
    assert [part.split()[0] for part in labels[0].split(" → ")] == list(reversed(linattn_theory.LAYERS))
    assert labels[1].startswith("round 0 → warm-up")


def test_the_gallery_follows_the_figures_order_with_its_titles_rendered(site):
    readme = (ROOT / "figures" / "README.md").read_text()
    table = [name for name in re.findall(r"^\| [\w–]+ \| `(\w+)\.png`", readme, flags=re.M)
             if (ROOT / "simulations" / f"{name}.py").is_file()]
    index = (site / "docs" / "gallery" / "index.html").read_text(encoding="utf-8")
    shown = list(dict.fromkeys(re.findall(r'<p><a class="reference internal" href="(\w+)\.html">', index)))
    assert shown == ["phase_diagram", *[name for name in table if name != "phase_diagram"]]   # the headline first
    titles = re.findall(r'<div class="sphx-glr-thumbnail-title">(.*?)</div>', index)
    titles += [re.search(r"<h1>(.*?)<a class=\"headerlink\"", (site / "docs" / "gallery" / f"{name}.html")
                         .read_text(encoding="utf-8")).group(1) for name in shown]
    assert len(titles) == 2 * len(shown)
    for title in titles:
        plain = re.sub(r"\\\(.*?\\\)", "", text_of_html(title))
        assert not re.search(r"[{}\\^]|(?<![\w])\w\d?_\w", plain), f"raw TeX in a gallery title: {title}"
    assert any("\\(K_{T_0}\\)" in title for title in titles)
