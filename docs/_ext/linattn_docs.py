"""What the linattn-theory site needs beyond the stock extensions (docs/conf.py).

- The gallery of the figure scripts: each script that ``linattn figures`` finds is copied into
  ``docs/_gallery_src/`` with its docstring as a titled header and its committed figure
  (``figures/NAME.png``) prepended; sphinx-gallery renders the copies without running them.
- ``markdown-from``: a directive that parses the Markdown returned by a function
  (``module:function``) into the page: the command line's checks and refused inputs, declared in
  ``docs/cli_checks.toml`` (:func:`cli_checks`).
- Python cross-references to an existing object by another path: a re-export
  (``linattn_theory.simulate``) links to the page of the module that defines it, and a name that
  exists in the code but has no page (a private helper) is shown as code; a name that exists
  nowhere stays unresolved, so that a stale reference fails the build.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import sys
import tomllib
import types
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

GALLERY_SOURCE = "docs/_gallery_src"
GALLERY_HEADER = """\
Gallery of the figure scripts
=============================

Each figure of the analysis is made by one script in ``simulations/`` from one sweep config in
``simulations/configs/``, and shows one claim of :doc:`/docs/theory`. The figures shown are the
committed ones (``figures/``); the scripts are not run when the site is built. ``linattn figures``
runs them all (:doc:`/docs/howto/reproduce-figures`), and :doc:`/figures/README` states what each
figure shows and the numbers it supports.
"""


def split_docstring(source: str, name: str) -> tuple[str, str]:
    """``(docstring, code after it)`` of a script."""
    body = ast.parse(source).body
    first = body[0] if body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        raise ExtensionError(f"simulations/{name}.py: a figure script must start with a docstring")
    return first.value.value, "".join(source.splitlines(keepends=True)[first.end_lineno:])


def gallery_example(name: str, source: str, image: str) -> str:
    """The sphinx-gallery example of one figure script: its docstring as a header titled by its
    first line, with the committed figure ``image`` (a path from the source root), then its code."""
    doc, code = split_docstring(source, name)
    title, _, body = doc.strip().partition("\n")
    title = title.strip()
    header = "\n".join([title, "=" * len(title), "", f".. image:: /{image}", f"   :alt: figures/{name}.png",
                        "", body.strip(), "", f"The script: ``simulations/{name}.py``."])
    return (f'r"""\n{header}\n"""\n'
            f'# sphinx_gallery_thumbnail_path = "{image}"\n{code}')


def stage_gallery(app, config) -> None:
    """Copy the figure scripts and their committed figures into ``docs/_gallery_src``."""
    from linattn_theory.report.figures import discover

    root = Path(app.srcdir)
    target = root / GALLERY_SOURCE
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    (target / "GALLERY_HEADER.rst").write_text(GALLERY_HEADER)
    for name, path in discover(root).items():
        figure = root / "figures" / f"{name}.png"
        if not figure.is_file():
            raise ExtensionError(f"figures/{name}.png is missing: run linattn figures --only {name}")
        shutil.copyfile(figure, target / f"{name}.png")
        example = gallery_example(name, path.read_text(encoding="utf-8"), f"{GALLERY_SOURCE}/{name}.png")
        (target / f"{name}.py").write_text(example, encoding="utf-8")


class MarkdownFrom(SphinxDirective):
    """``markdown-from`` ``module:function``: the Markdown the function returns, parsed into the page."""

    required_arguments = 1

    def run(self):
        module, _, function = self.arguments[0].partition(":")
        text = getattr(importlib.import_module(module), function)()
        container = nodes.container()
        self.state.nested_parse(StringList(text.splitlines(), source=self.arguments[0]),
                                self.content_offset, container)
        return container.children


CLI_CHECKS = Path(__file__).resolve().parents[1] / "cli_checks.toml"


def bad_inputs() -> list[tuple[str, str, str]]:
    """``(kind, example, outcome)`` of every bad input the command line refuses (``docs/cli_checks.toml``)."""
    table = tomllib.loads(CLI_CHECKS.read_text(encoding="utf-8"))
    return [(row["kind"], row["example"], row["outcome"]) for row in table["bad_input"]]


def cli_checks() -> str:
    """Markdown of ``docs/cli_checks.toml``: its section on exit statuses and checks, then the table."""
    table = tomllib.loads(CLI_CHECKS.read_text(encoding="utf-8"))
    rows = "\n".join(f"| {kind} | {example} | {outcome} |" for kind, example, outcome in bad_inputs())
    return (f"## {table['title']}\n\n{table['text'].strip()}\n\n| bad input | example | what happens |\n"
            f"|---|---|---|\n{rows}\n")


def locate(name: str):
    """The object a dotted name points to (the longest importable module, then attributes), or ``None``."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return None
        return obj
    return None


def canonical_name(obj) -> str | None:
    """Where ``obj`` is defined: ``module.qualname``, or a module's own name."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None


def resolve_code_reference(app, env, node, contnode):
    """``missing-reference``: resolve a Python reference to an object that exists (module docstring)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    domain = env.get_domain("py")
    found = domain.resolve_any_xref(env, node["refdoc"], app.builder, target, node, contnode)
    if len(found) == 1:          # a short name documented in exactly one module
        return found[0][1]
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [f"{module}.{cls}.{target}" if module and cls else None,
                  f"{module}.{target}" if module else None, target]
    head = target.split(".")[0]  # a name of one of the package's modules, used without its module
    candidates += [f"{name}.{target}" for name in sorted(sys.modules)
                   if name.startswith("linattn_theory") and hasattr(sys.modules[name], head)][:1]
    for name in filter(None, candidates):
        obj = locate(name)
        if obj is None:
            continue
        canonical = canonical_name(obj)
        if canonical and canonical != target:
            found = domain.resolve_any_xref(env, node["refdoc"], app.builder, canonical, node, contnode)
            if found:
                return found[0][1]
        return contnode
    return None


def skip_namedtuple_fields(app, what, name, obj, skip, options):
    """``autodoc-skip-member``: a NamedTuple's fields carry only "Alias for field number N"."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def setup(app):
    app.connect("config-inited", stage_gallery)
    app.connect("autodoc-skip-member", skip_namedtuple_fields)
    app.connect("missing-reference", resolve_code_reference)
    app.add_directive("markdown-from", MarkdownFrom)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
