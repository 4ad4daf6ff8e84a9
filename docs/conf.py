"""Sphinx configuration of the linattn-theory documentation site.

Build the site from the repository root (``pip install ".[docs]"``; the test extra includes it):

    python -m sphinx -W --keep-going docs docs/_build/html

(``sphinx-build docs docs/_build/html`` and ``python -m sphinx -c docs . docs/_build/html`` build
the same site). The source folder is the repository root, whichever of ``docs`` or ``.`` the
command names (``docs/_ext``), restricted by ``include_patterns`` to ``docs/``, ``README.md`` and
``figures/README.md``, so that the pages link to each other by the same relative paths on GitHub
and on the site. The site loads nothing from a network: MathJax is copied into it from the
``sphinx-mathjax-offline`` package, and the diagrams are drawn at build time (``docs/_ext``).
What the build generates — the API pages (``docs/generated/``, autosummary) and the gallery of
the figure scripts (``docs/gallery/``, sphinx-gallery) — is not committed.
``tests/test_docs_site.py`` builds the site with warnings as errors and nitpicky references.
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import linattn_theory  # noqa: E402

project = "linattn-theory"
author = "the linattn-theory authors"
copyright = "the linattn-theory authors (MIT licence)"
release = version = linattn_theory.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinxarg.ext",
    "sphinx-mathjax-offline",        # MathJax 3 copied into the site (_static/mathjax)
    "sphinx_gallery.gen_gallery",
    "linattn_docs",
]

root_doc = "docs/index"
include_patterns = ["README.md", "figures/README.md", "docs/**"]
exclude_patterns = ["docs/_build", "docs/_ext", "docs/_templates", "docs/_gallery_src"]
templates_path = [str(DOCS / "_templates")]
nitpicky = True                     # a reference to a name the code does not have fails the build
# aliases in annotations (``np.ndarray``, ``pd.DataFrame``) and libraries without an inventory offline
nitpick_ignore_regex = [(r"py:.*", r"(np|pd|numpy|pandas|scipy|cupy|dask|distributed)\..*")]

# Markdown pages (MyST): $...$ and $$...$$ mathematics as on GitHub, rendered by the MathJax the
# site ships; ```mermaid blocks as diagrams drawn at build time (docs/_ext)
mathjax_path = "mathjax/tex-chtml.js"    # in _static: no network
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
myst_fence_as_directive = ["mermaid"]

# API reference: one page per module (docs/_templates/autosummary/module.rst) with the names of
# its __all__, generated from the docstrings (numpydoc) at every build
autosummary_generate = True
autosummary_ignore_module_all = False
autosummary_mock_imports = ["linattn_theory.__main__"]     # importing it would run the CLI
autosummary_context = {
    "layers": list(reversed(linattn_theory.LAYERS)),
    "public_api": sorted(set(linattn_theory.__all__) - set(linattn_theory.LAYERS)),
}
autodoc_default_options = {"members": True}   # a class's documented methods too
# the annotations in the signatures; the numpydoc Parameters sections describe the arguments (a
# list of the annotations alone would leave out the arguments without one). An annotated class
# re-exported by its package (``Params``: core.Params, core.model.Params) is one object: either
# page will do, so the "more than one target" warning (ref.python) is not an error
autodoc_typehints = "signature"
suppress_warnings = ["ref.python"]
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# the figure scripts as a gallery: shown with their committed figures, never run, in the order of
# figures/README.md (docs/_ext)
sphinx_gallery_conf = {
    "within_subsection_order": "linattn_docs.FigureOrder",
    "examples_dirs": ["docs/_gallery_src"],
    "gallery_dirs": ["docs/gallery"],
    "plot_gallery": "False",
    "download_all_examples": False,
    "write_computation_times": False,
    "show_signature": False,
    "show_memory": False,
    "copyfile_regex": "",
}

html_theme = "pydata_sphinx_theme"
html_title = f"linattn-theory {release}"
html_theme_options = {"show_toc_level": 2, "navigation_with_keys": False,
                      "footer_start": ["copyright"], "footer_end": ["sphinx-version"]}
html_extra_path = ["_root"]         # index.html at the top of the site: a link to docs/index.html
html_show_sourcelink = False
smartquotes = False                      # keep "--out" in help texts as typed
