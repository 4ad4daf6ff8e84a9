"""Build hooks: record the git revision, and ship the example configs, figure scripts and derivations.

Everything else is in pyproject.toml.

- ``sdist`` writes ``linattn_theory/_revision.txt`` (the checkout's commit, then ``dirty`` when
  tracked files were modified) into the tree it packs, so that a wheel built from the sdist
  records the revision too;
- ``build_py`` writes the same file into the built package (from git when building in a
  checkout, else from the sdist's copy), and copies ``simulations/`` (figure scripts and their
  configs), ``derivations/``, ``notebooks/`` (the walk-through, its solutions and ``execute.py``,
  which makes the executed ``.ipynb``: that one is not shipped) and
  ``figures/best_warmup.csv`` (the table the walk-through reads) into ``linattn_theory/_examples/``,
  where ``linattn figures``, ``linattn derive`` and ``linattn examples`` find them after a wheel
  install, from any folder.

Run metadata reads the revision (``git_revision``, ``git_dirty``) when the package is not
itself inside a checkout.
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
REVISION = Path("linattn_theory") / "_revision.txt"
EXAMPLES = ("simulations", "derivations", "notebooks")
#: single files shipped with the examples: the committed table the notebook reads (report.teaching.committed_table)
EXAMPLE_FILES = ("figures/best_warmup.csv",)


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def revision_record() -> str:
    """``"<commit>\\n"`` or ``"<commit>\\ndirty\\n"`` of this checkout; else the sdist's record; else ""."""
    top = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "HEAD")
    if top and commit and Path(top.strip()).resolve() == HERE:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return commit.strip() + "\n" + ("dirty\n" if status and status.strip() else "")
    recorded = HERE / REVISION
    return recorded.read_text(encoding="utf-8") if recorded.is_file() else ""


class BuildWithRevisionAndExamples(build_py):
    def run(self):
        super().run()
        package = Path(self.build_lib) / "linattn_theory"
        record = revision_record()
        if record:
            package.mkdir(parents=True, exist_ok=True)
            (package / REVISION.name).write_text(record, encoding="utf-8")
        for name in EXAMPLES:
            if (HERE / name).is_dir():
                target = package / "_examples" / name
                shutil.rmtree(target, ignore_errors=True)
                # the executed .ipynb (300 KB of outputs, as much as the rest of the wheel) stays out:
                # notebooks/execute.py makes it from the .py (pip install 'linattn-theory[teach]')
                shutil.copytree(HERE / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.ipynb"))
        for name in EXAMPLE_FILES:
            if (HERE / name).is_file():
                target = package / "_examples" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(HERE / name, target)


class SdistWithRevision(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        record = revision_record()
        if record:
            target = Path(base_dir) / REVISION
            target.unlink(missing_ok=True)          # never write through a hard link to the checkout
            target.write_text(record, encoding="utf-8")


setup(cmdclass={"build_py": BuildWithRevisionAndExamples, "sdist": SdistWithRevision})
