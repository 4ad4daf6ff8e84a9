"""Every shell command shown in README.md and docs/howto/*.md keeps working.

Commands run in a scratch copy of the repository, in quick mode where they take ``--quick``.
A command marked ``# needs: gpu`` or ``# needs: dask-cluster`` (or ``time``, a full-size run)
is checked through ``--help`` instead when it is a ``linattn`` or ``python`` script command.
``pip install`` is not run: its target must be this project and its extras must exist.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "howto").glob("*.md"))]


def documented_commands():
    """``(page, command, needs)`` for each line of each ```bash block (``&&`` chains split)."""
    for page in PAGES:
        inside = False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                inside = line.strip() == "```bash"
                continue
            if not inside or not line.strip() or line.lstrip().startswith("#"):
                continue
            needs = re.search(r"#\s*needs:\s*([\w-]+)", line)
            command = line.split("#", 1)[0].strip() if needs else line.strip()
            for part in command.split("&&"):
                yield page.relative_to(ROOT).as_posix(), part.strip(), needs.group(1) if needs else None


COMMANDS = list(documented_commands())
#: commands that run figure scripts, test suites, Dask clusters or generators (tests/README.md: slow)
SLOW = re.compile(r"^(linattn figures(?!.*--list)|python simulations/|python -m pytest|python benchmarks/|"
                  r"python -m linattn_theory\.cli\.docgen)|--executor dask")


def _marked(commands):
    """``pytest.param`` of each command, slow when it is slow or follows a slow one on its page
    (it may read what that one wrote)."""
    slow_pages = set()
    for page, command, needs in commands:
        if SLOW.search(command) and not needs:
            slow_pages.add(page)
        yield pytest.param(page, command, needs, marks=[pytest.mark.slow] if page in slow_pages else [])


def test_pages_show_commands():
    assert any(page == "README.md" for page, _, _ in COMMANDS)
    assert len({page for page, _, _ in COMMANDS}) >= 5


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the tracked tree, so that commands writing results or docs leave the repo alone."""
    target = tmp_path_factory.mktemp("repo")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    files = listed.stdout.split() if listed.returncode == 0 else []
    if not files:  # not a git checkout: copy the folders that matter
        for name in ("linattn_theory", "simulations", "derivations", "benchmarks", "docs", "tests"):
            shutil.copytree(ROOT / name, target / name)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, target / name)
        return target
    for name in files:
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def to_argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "linattn":
        return [sys.executable, "-m", "linattn_theory", *argv[1:]]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return argv


def check_pip_target(command: str):
    argv = shlex.split(command)
    assert argv[:2] == ["pip", "install"], command
    target = argv[-1]
    match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
    assert match, f"{command}: installs something other than this project"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in filter(None, (match.group(1) or "").split(",")):
        assert extra in extras, f"{command}: no extra {extra!r} in pyproject.toml"


@pytest.mark.parametrize("page, command, needs", list(_marked(COMMANDS)),
                         ids=[f"{p}: {c}" for p, c, _ in COMMANDS])
def test_documented_command_runs(scratch, page, command, needs):
    if command.startswith("pip install"):
        check_pip_target(command)
        return
    argv = to_argv(command)
    if argv[1:3] == ["-m", "pytest"]:
        if argv[3:] == ["-q"] or needs:
            # the whole suite (this test is part of it) is what CI runs: check that it does
            assert command in (ROOT / ".ci" / "run").read_text() or needs, command
            return
    if needs:
        if argv[0] != sys.executable or argv[1:2] == ["-c"]:
            pytest.skip(f"{command!r} needs {needs}")
        script = argv[:3] if argv[1] == "-m" else argv[:2]
        if argv[1] == "-m" and argv[2] == "linattn_theory":
            script = argv[:4]
        argv = [*script, "--help"]
    elif "--quick" not in argv and any(a in ("figures", "sweep") for a in argv[:4]) and "--list" not in argv:
        argv.append("--quick")
    if argv[0] == "rm":
        return  # cleaning a scratch folder
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "LINATTN_QUICK": "1"}
    proc = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"{page}: `{command}` failed\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
