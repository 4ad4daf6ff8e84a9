"""Build hook: record the git revision of the checkout a wheel is built from.

Everything else is in pyproject.toml. ``pip install .`` from a git checkout writes
``linattn_theory/_revision.txt`` into the built package; run metadata reads it
(``git_revision``) when the package is not itself inside a checkout.
"""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithRevision(build_py):
    def run(self):
        super().run()
        try:
            proc = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                  cwd=Path(__file__).resolve().parent, timeout=10)
            revision = proc.stdout.strip() if proc.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            revision = ""
        if revision:
            target = Path(self.build_lib) / "linattn_theory" / "_revision.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(revision + "\n")


setup(cmdclass={"build_py": BuildWithRevision})
