"""Run the teaching notebook headless and write it as an ``.ipynb`` with its outputs.

    python notebooks/execute.py                  # bias_drift_tradeoff.py -> bias_drift_tradeoff.ipynb
    python notebooks/execute.py --solutions notebooks/solutions.py --out /tmp/solved.ipynb

Cells run in one IPython shell from the ``notebooks`` folder, as Jupyter runs them, and each
cell's printed output is echoed to stdout. ``--solutions MODULE.py`` fills in the exercises: after
a cell tagged ``exercise`` defines a stub, the stub is replaced by the function of the same name
from that module. ``--replace OLD NEW`` edits the source first (e.g. ``--replace "E = 0.04, 20"
"E = 0.04, 5"``; OLD must occur). A cell that raises stops the run with exit status 1.

The written notebook is deterministic: cell ids ``cell-<index>``, execution counts 1, 2, … in
order, no timings or run metadata, figures as PNG without a software or date stamp (with the
same library versions, re-running gives the same file).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "bias_drift_tradeoff.py"
FIGURE_KWARGS = "{'bbox_inches': 'tight', 'metadata': {'Software': None}}"


def load_solutions(path: Path) -> dict:
    """The functions named in the ``__all__`` of the module at ``path``."""
    spec = importlib.util.spec_from_file_location("notebook_solutions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in module.__all__}


def _outputs(captured, result, count: int, nbformat) -> list:
    outputs = []
    for name, text in (("stdout", captured.stdout), ("stderr", captured.stderr)):
        if text:
            outputs.append(nbformat.v4.new_output("stream", name=name, text=text))
    for rich in captured.outputs:
        outputs.append(nbformat.v4.new_output("display_data", data=rich.data, metadata=rich.metadata or {}))
    if result.result is not None:
        outputs.append(nbformat.v4.new_output("execute_result", data={"text/plain": repr(result.result)},
                                              execution_count=count))
    return outputs


def execute(source: Path, solutions: dict | None = None, replacements=(), echo: bool = True):
    """Execute the Jupytext notebook ``source``; return ``(notebook with outputs, error or None)``."""
    import jupytext
    import nbformat
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    text = source.read_text()
    for old, new in replacements:
        if old not in text:
            raise ValueError(f"--replace: {old!r} does not occur in {source}")
        text = text.replace(old, new)
    notebook = jupytext.reads(text, fmt="py:percent")
    os.chdir(source.parent)
    shell = InteractiveShell.instance(colors="NoColor")
    shell.displayhook.write_output_prompt = lambda: None      # results become execute_result outputs
    shell.displayhook.write_format_data = lambda *args, **kwargs: None
    shell.enable_gui = lambda gui=None: None                  # a plain shell has no GUI loop; inline needs none
    shell.enable_matplotlib("inline")
    shell.run_line_magic("config", f"InlineBackend.print_figure_kwargs = {FIGURE_KWARGS}")
    count, error = 0, None
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index}"                 # nbformat draws random ids; fixed ones keep the file stable
        if cell.cell_type != "code":
            continue
        count += 1
        with capture_output() as captured:
            result = shell.run_cell(cell.source, store_history=False)
        cell.execution_count = count
        cell.outputs = _outputs(captured, result, count, nbformat)
        if echo:
            sys.stdout.write(captured.stdout)
            sys.stderr.write(captured.stderr)
        failure = result.error_before_exec or result.error_in_exec
        if failure is not None:
            cell.outputs.append(nbformat.v4.new_output("error", ename=type(failure).__name__,
                                                       evalue=str(failure), traceback=[]))
            error = f"cell {count} raised {type(failure).__name__}: {failure}"
            break
        if solutions and "exercise" in cell.metadata.get("tags", []):
            for name, function in solutions.items():
                if name in shell.user_ns:
                    shell.user_ns[name] = function
    return notebook, error


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK, help="the Jupytext percent script")
    parser.add_argument("--out", type=Path, help="where to write the .ipynb (default: next to the script)")
    parser.add_argument("--solutions", type=Path, help="a module whose functions fill in the exercises")
    parser.add_argument("--replace", nargs=2, action="append", default=[], metavar=("OLD", "NEW"))
    args = parser.parse_args(argv)
    source = args.notebook.resolve()
    out = (args.out or source.with_suffix(".ipynb")).resolve()
    solutions = load_solutions(args.solutions.resolve()) if args.solutions else None
    notebook, error = execute(source, solutions, args.replace)

    import jupytext
    jupytext.write(notebook, out, fmt="ipynb")
    if error:
        print(f"execute.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
