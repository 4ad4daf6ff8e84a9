"""Generate ``docs/cli.md`` from the argument parser and ``docs/api.md`` from the docstrings.

Run ``python -m linattn_theory.cli.docgen`` after changing the command line or the public API;
a test fails when the committed pages differ from what this module generates.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

__all__ = ["cli_reference", "api_reference", "write_docs"]


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def cli_reference() -> str:
    """The Markdown command-line reference: every subcommand's ``--help``."""
    import os

    from .commands import build_parser

    os.environ["COLUMNS"] = "100"   # argparse wraps help text to the terminal width
    parser = build_parser()
    parts = ["# Command-line reference", "",
             "Generated from the parser by `python -m linattn_theory.cli.docgen`; do not edit by hand.", "",
             "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subparsers(parser).items():
        parts += [f"## `linattn {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    from .commands import checks_reference
    parts += [checks_reference()]
    return "\n".join(parts)


def api_reference() -> str:
    """The Markdown API page: the layers (subpackages), then the signature and docstring of every
    public function and class in ``linattn_theory.__all__``."""
    import linattn_theory as pkg

    parts = ["# API reference", "",
             "Generated from the docstrings by `python -m linattn_theory.cli.docgen`; do not edit by hand.", "",
             "## Layers", "", "Bottom to top; each imports only from those below it "
             "([architecture](concepts.md#architecture)).", "", "| subpackage | holds |", "| --- | --- |"]
    for layer in pkg.LAYERS:
        summary = (inspect.getdoc(getattr(pkg, layer)) or "").splitlines()[0]
        parts.append(f"| `linattn_theory.{layer}` | {summary} |")
    parts.append("")
    for name in sorted(set(pkg.__all__) - set(pkg.LAYERS)):
        obj = getattr(pkg, name)
        try:
            signature = f"{name}{inspect.signature(obj)}"
        except (TypeError, ValueError):
            signature = name
        kind = "class" if inspect.isclass(obj) else "function"
        doc = inspect.getdoc(obj) or ""
        parts += [f"## `{name}`", "", f"*{kind}* `{signature}`", "", doc, ""]
    return "\n".join(parts)


def write_docs(root: Path) -> list[Path]:
    """Write ``docs/cli.md`` and ``docs/api.md`` under ``root``."""
    from ..core.io import atomic_write_text

    pages = {root / "docs" / "cli.md": cli_reference(), root / "docs" / "api.md": api_reference()}
    for path, text in pages.items():
        atomic_write_text(path, text)
    return list(pages)


if __name__ == "__main__":
    for path in write_docs(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()):
        print(f"wrote {path}")
