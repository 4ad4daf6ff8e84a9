"""What the linattn-theory site needs beyond the stock extensions (docs/conf.py).

- The source folder is the repository root, whichever of ``docs`` or ``.`` (with ``-c docs``)
  the command names: ``sphinx-build docs docs/_build/html`` builds the same site.
- The gallery of the figure scripts: each script that ``linattn figures`` finds is copied into
  ``docs/_gallery_src/`` with its docstring as a titled header and its committed figure
  (``figures/NAME.png``) prepended; sphinx-gallery renders the copies without running them, in
  the order of ``figures/README.md`` (the headline first), with the TeX of their titles rendered.
- ``mermaid``: a ```mermaid block of the Markdown pages (a chain of boxes, as GitHub shows it)
  drawn at build time by Matplotlib as an inline SVG, so that the site loads nothing from a network.
- The sections of a configuration (``TaskConfig``, ``ModelConfig``, ``FederatedConfig``) get a
  numpydoc Parameters section from their fields' own descriptions (``field_docs``, the source of
  docs/cli.md and ``--help`` too), so that the API page lists every key.
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
import html
import importlib
import io
import re
import shutil
import textwrap
import sys
import tomllib
import types
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)
DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent


def use_repository_root(app, config) -> None:
    """``config-inited``: build from the repository root when the command names ``docs`` as the
    source folder (``sphinx-build docs OUT``, with ``docs/conf.py`` found there); refuse, saying
    what to run, a source folder that is neither."""
    srcdir = Path(app.srcdir).resolve()
    if srcdir == DOCS:
        app.srcdir = type(app.srcdir)(ROOT)        # Sphinx's own path type (str in older releases)
    elif srcdir != ROOT:
        raise ExtensionError(f"the site's source folder is the repository root ({ROOT}), not {srcdir}: "
                             f"run `python -m sphinx docs docs/_build/html` from {ROOT}")

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


#: a symbol with a subscript in a title, as the scripts write it: ``K_{T0}``, ``Φ_λ``, ``ζ_V``,
#: ``T0_best`` (a base of one letter and at most one digit, so that ``tradeoff_attention`` is not one)
SUBSCRIPTED = re.compile(r"(?<![\w`])([A-Za-zΑ-Ωα-ω]\d?)_(\{[^}\s]+\}|[A-Za-zΑ-Ωα-ω0-9]+)(?!\w)")
GREEK = {"α": r"\alpha", "β": r"\beta", "γ": r"\gamma", "Γ": r"\Gamma", "δ": r"\delta", "Δ": r"\Delta",
         "ε": r"\varepsilon", "ζ": r"\zeta", "η": r"\eta", "θ": r"\theta", "λ": r"\lambda", "μ": r"\mu",
         "ρ": r"\rho", "σ": r"\sigma", "τ": r"\tau", "φ": r"\varphi", "Φ": r"\Phi", "ω": r"\omega"}


def tex_of_symbol(base: str, sub: str) -> str:
    r"""The TeX of a title's subscripted symbol: ``K_{T0}`` → ``K_{T_0}``, ``T0_best`` → ``T_{0,\mathrm{best}}``."""
    def tex(text):
        text = re.sub(r"([A-Za-z])(\d)", r"\1_\2", text)
        return "".join(GREEK.get(ch, ch) for ch in text)

    sub = sub.strip("{}")
    sub = tex(sub) if len(sub) == 1 or re.fullmatch(r"[A-Za-z]\d", sub) else (
        GREEK[sub] if sub in GREEK else rf"\mathrm{{{sub}}}")
    if base[-1].isdigit():
        return f"{tex(base[0])}_{{{base[1:]},{sub}}}"
    return f"{tex(base)}_{{{sub}}}" if len(sub) > 1 else f"{tex(base)}_{sub}"


def rendered_title(title: str) -> str:
    """A script's title in reStructuredText, its subscripted symbols as ``:math:`` roles."""
    return SUBSCRIPTED.sub(lambda m: f":math:`{tex_of_symbol(m.group(1), m.group(2))}`", title)


def thumbnail_title(title: str) -> tuple[str, str]:
    """``(as sphinx-gallery writes it, with the formulas delimited for MathJax)`` of a rendered title:
    the gallery's index shows the raw HTML of its titles, from which it strips the ``:math:`` roles."""
    roles = re.compile(r":math:`([^`]+)`")
    return roles.sub(r"\1", title), html.escape(roles.sub(r"\\(\1\\)", title), quote=False)


def figure_order(readme: str) -> list[str]:
    """The figure scripts in the order of ``figures/README.md``: its headline first (the figure of
    its first image), then as its table names the scripts (``simulations/NAME.py``)."""
    headline = re.findall(r"!\[[^\]]*\]\(([\w-]+)\.png\)", readme)[:1]
    named = re.findall(r"`simulations/([\w-]+)\.py`", readme)
    return list(dict.fromkeys([*headline, *named]))


class FigureOrder:
    """sphinx-gallery's ``within_subsection_order``: the figure scripts in :func:`figure_order`,
    any script ``figures/README.md`` does not name after them by name."""

    def __init__(self, src_dir):
        self.order = figure_order((ROOT / "figures" / "README.md").read_text(encoding="utf-8"))

    def __call__(self, filename) -> tuple[int, str]:
        name = Path(filename).stem
        return (self.order.index(name) if name in self.order else len(self.order), name)

    def __repr__(self):        # sphinx-gallery records the order in its configuration
        return "FigureOrder"


def gallery_example(name: str, source: str, image: str) -> str:
    """The sphinx-gallery example of one figure script: its docstring as a header titled by its
    first line (:func:`rendered_title`), with the committed figure ``image`` (a path from the source
    root), then its code."""
    doc, code = split_docstring(source, name)
    title, _, body = doc.strip().partition("\n")
    title = rendered_title(title.strip())
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
    THUMBNAIL_TITLES.clear()
    for name, path in discover(root).items():
        figure = root / "figures" / f"{name}.png"
        if not figure.is_file():
            raise ExtensionError(f"figures/{name}.png is missing: run linattn figures --only {name}")
        shutil.copyfile(figure, target / f"{name}.png")
        example = gallery_example(name, path.read_text(encoding="utf-8"), f"{GALLERY_SOURCE}/{name}.png")
        (target / f"{name}.py").write_text(example, encoding="utf-8")
        stripped, delimited = thumbnail_title(example.split("\n")[1])
        THUMBNAIL_TITLES[stripped] = delimited


#: ``{title as sphinx-gallery writes it: title with its formulas delimited}`` (:func:`stage_gallery`)
THUMBNAIL_TITLES: dict[str, str] = {}


def render_thumbnail_titles(app, docname, source) -> None:
    """``source-read`` of the gallery's index: its thumbnails' titles with their formulas delimited."""
    if docname == "docs/gallery/index":
        for stripped, delimited in THUMBNAIL_TITLES.items():
            source[0] = source[0].replace(f'title">{stripped}</div>', f'title">{delimited}</div>')


def load_mathjax_on_gallery_pages(app, pagename, templatename, context, doctree) -> None:
    """``html-page-context``: every page of the gallery loads MathJax, for the titles with formulas
    in its thumbnails, navigation and links to the previous and next page."""
    if pagename.startswith("docs/gallery/"):
        context["has_maths_elements"] = True


def parse_flowchart(source: str) -> tuple[str, list[tuple[str, str]]]:
    """``(direction, [(node, label), …] in the order of the chain)`` of a Mermaid flowchart that is
    one chain of boxes (``flowchart TB``, ``a["label"] --> b["label"] --> …``), the only kind the
    site's pages draw; anything else is refused, naming the line."""
    lines = [line.strip() for line in source.strip().splitlines() if line.strip()]
    head = re.fullmatch(r"(?:flowchart|graph)\s+(TB|TD|LR)", lines[0]) if lines else None
    if head is None:
        raise ExtensionError(f"mermaid: the diagram must start with `flowchart TB` or `flowchart LR`: {source[:60]!r}")
    labels: dict[str, str] = {}
    edges = []
    for line in lines[1:]:
        nodes = []
        for part in line.split("-->"):
            match = re.fullmatch(r'\s*(\w+)\s*(?:\["(.*)"\])?\s*', part)
            if match is None:
                raise ExtensionError(f"mermaid: only boxes `id[\"label\"]` joined by `-->` are drawn: {line!r}")
            name, label = match.groups()
            if label is not None:
                labels[name] = label
            nodes.append(name)
        edges += zip(nodes, nodes[1:])
    chain = list(dict.fromkeys(name for edge in edges for name in edge)) or list(labels)
    if edges != list(zip(chain, chain[1:])):
        raise ExtensionError(f"mermaid: the diagram is not one chain of boxes: {edges}")
    return head.group(1).replace("TD", "TB"), [(name, labels.get(name, name)) for name in chain]


def label_lines(label: str) -> tuple[str, list[str]]:
    """``(bold head, plain lines)`` of a Mermaid label: ``<b>head</b> — text`` or ``line<br/>line``."""
    match = re.match(r"<b>(.*?)</b>\s*(?:—\s*)?(.*)", label)
    head, rest = match.groups() if match else ("", label)
    return head, [line.strip() for line in re.split(r"<br\s*/?>", rest) if line.strip()]


def flowchart_figure(direction: str, boxes: list[tuple[str, str]]):
    """A Matplotlib figure of a chain of boxes (:func:`parse_flowchart`): top to bottom (``TB``),
    one wide box per line, or left to right (``LR``)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    vertical = direction == "TB"
    n = len(boxes)
    width, height = (10.0, 0.6 * n) if vertical else (2.5 * n, 1.2)
    fig = Figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    step = height / n if vertical else width / n
    gap = 0.18 if vertical else 0.36
    for i, (_, label) in enumerate(boxes):
        head, lines = label_lines(label)
        text = "\n".join(textwrap.fill(line, 150 if vertical else 28) for line in lines)
        if vertical:
            x, y, w, h = 0.05, height - (i + 1) * step + gap / 2, width - 0.1, step - gap
        else:
            x, y, w, h = i * step + gap / 2, 0.1, step - gap, height - 0.2
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                    facecolor="#eef3fb", edgecolor="#3a5a8c"))
        cx, cy = x + w / 2, y + h / 2
        if head:
            ax.text(cx, cy + 0.08, head, ha="center", va="center", fontsize=9, weight="bold")
            ax.text(cx, cy - 0.1, text, ha="center", va="center", fontsize=7.5)
        else:
            ax.text(cx, cy, text, ha="center", va="center", fontsize=8.5, linespacing=1.3)
        if i + 1 < n:
            start, end = ((cx, y), (cx, y - gap)) if vertical else ((x + w, cy), (x + w + gap, cy))
            ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "-|>", "color": "#3a5a8c"})
    return fig


def draw_flowchart(direction: str, boxes: list[tuple[str, str]]) -> str:
    """An inline SVG of :func:`flowchart_figure`, its text as paths, labelled by the boxes' text."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "linattn", "svg.fonttype": "path"}):
        flowchart_figure(direction, boxes).savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    label = " → ".join(html.escape(" ".join(filter(None, [head, *lines])), quote=True)
                       for head, lines in (label_lines(text) for _, text in boxes))
    return svg[svg.index("<svg"):].replace(
        "<svg ", f'<svg role="img" aria-label="{label}" style="max-width: 100%; height: auto" ', 1)


class Mermaid(SphinxDirective):
    """``mermaid``: a ```mermaid block of the Markdown pages, drawn at build time (:func:`draw_flowchart`)."""

    has_content = True
    optional_arguments = 1
    final_argument_whitespace = True

    def run(self):
        direction, boxes = parse_flowchart("\n".join(self.content))
        figure = nodes.container(classes=["diagram"])
        figure += nodes.raw("", draw_flowchart(direction, boxes), format="html")
        return [figure]


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


def config_section_parameters(app, what, name, obj, options, lines) -> None:
    """``autodoc-process-docstring`` (before numpydoc): a Parameters section for a configuration
    section, one entry per field with its type, default and description."""
    from linattn_theory.sim.config import SECTIONS, field_docs

    if what != "class" or obj not in SECTIONS.values() or "Parameters" in lines:
        return
    import dataclasses

    lines += ["", "Parameters", "----------"]
    for field in dataclasses.fields(obj):
        default = "" if field.default is dataclasses.MISSING else f", default {field.default!r}"
        text = re.sub(r"([\\`*_|])", r"\\\1", field_docs(obj)[field.name])   # plain text, not markup
        lines += [f"{field.name} : {field.type}{default}", f"    {text}"]


def skip_namedtuple_fields(app, what, name, obj, skip, options):
    """``autodoc-skip-member``: a NamedTuple's fields carry only "Alias for field number N"."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def setup(app):
    app.connect("config-inited", use_repository_root, priority=400)
    app.connect("config-inited", stage_gallery)
    app.connect("source-read", render_thumbnail_titles)
    app.connect("html-page-context", load_mathjax_on_gallery_pages, priority=400)
    app.add_directive("mermaid", Mermaid)
    app.connect("autodoc-skip-member", skip_namedtuple_fields)
    app.connect("autodoc-process-docstring", config_section_parameters, priority=400)
    app.connect("missing-reference", resolve_code_reference)
    app.add_directive("markdown-from", MarkdownFrom)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
