"""Every command and code snippet shown in README.md and docs/howto/*.md keeps working.

Each page is followed as a reader would follow it, in its own scratch copy of the repository:

1. the snippets that change the code, marked by an HTML comment on the line before the block
   (invisible on GitHub and on the site), are applied in page order:
   ``<!-- snippet: new PATH -->`` the block is the new file PATH; ``<!-- snippet: append PATH -->``
   the block is appended to PATH; ``<!-- snippet: patch PATH -->`` the block is a diff (context
   lines start with a space, removed ones with ``-``, added ones with ``+``) applied to PATH;
   ``<!-- snippet: excerpt PATH -->`` the block shows code of PATH, whose lines must appear there
   in order;
2. the page's other Python blocks run in order as one script, and each TOML block must be a
   valid configuration (both with the changed code);
3. each line of a ```bash block runs, in quick mode where the command takes ``--quick``.

A block or command marked ``needs: gpu`` (``<!-- snippet: needs gpu -->`` before a block,
``# needs: gpu`` after a command; also ``dask-cluster``, or ``time`` for a full-size run) is
checked through ``--help`` instead when it is a ``linattn`` or ``python`` script command, and
skipped otherwise. ``pip install`` is not run: its target must be this project and its extras
must exist. ``python -m pytest -q`` (the whole suite) must be what CI runs, and the command that
builds the documentation site must be the one ``tests/test_docs_site.py`` runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "howto").glob("*.md"))]
_FENCE = re.compile(r"^```(?P<info>\S*)\s*$")
_SNIPPET = re.compile(r"^<!--\s*snippet:\s*(?P<action>[\w-]+)(?:\s+(?P<arg>\S+))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, text, line, and the snippet action marked before it."""

    language: str
    text: str
    line: int
    action: str | None = None
    target: str | None = None


def code_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the ``<!-- snippet: ... -->`` comment before it."""
    blocks, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i] != "```":
            body.append(lines[i])
            i += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marked = _SNIPPET.match(previous)
        blocks.append(Block(fence.group("info"), "\n".join(body) + "\n", start + 1,
                            marked.group("action") if marked else None,
                            marked.group("arg") if marked else None))
        i += 1
    return blocks


def commands(blocks: list[Block]):
    """``(command, needs)`` for each line of each ```bash block (``&&`` chains split)."""
    for block in blocks:
        if block.language != "bash":
            continue
        for line in block.text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            needs = re.search(r"#\s*needs:\s*([\w-]+)", line)
            command = line.split("#", 1)[0].strip() if needs else line.strip()
            for part in command.split("&&"):
                yield part.strip(), needs.group(1) if needs else None


def apply_patch(text: str, diff: str, name: str) -> str:
    """``text`` with the diff applied: the lines of its context and removed lines, found as whole
    lines exactly once in ``text``, become its context and added lines."""
    lines = [line for line in diff.splitlines() if not line.startswith("@@")]
    old = [line[1:] for line in lines if line[:1] in (" ", "-", "")]
    new = [line[1:] for line in lines if line[:1] in (" ", "+", "")]
    source = text.splitlines()
    found = [i for i in range(len(source) - len(old) + 1) if source[i:i + len(old)] == old]
    assert len(found) == 1, f"{name}: the patch's lines are not found exactly once:\n" + "\n".join(old)
    i = found[0]
    return "\n".join(source[:i] + new + source[i + len(old):]) + ("\n" if text.endswith("\n") else "")


def assert_excerpt(text: str, excerpt: str, name: str):
    """Every line of ``excerpt`` (without trailing comments) appears in ``text``, in order."""
    source = [line.strip() for line in text.splitlines()]
    position = 0
    for line in excerpt.splitlines():
        code = re.sub(r"\s+#.*$", "", line).strip()
        if not code:
            continue
        matches = [i for i in range(position, len(source)) if source[i].split("  #")[0].strip() == code]
        assert matches, f"{name}: the excerpt's line {code!r} is not in the file (in this order)"
        position = matches[0] + 1


def copy_repository(target: Path) -> Path:
    """A copy of the tracked tree, so that commands writing results or code leave the repo alone."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    files = listed.stdout.split() if listed.returncode == 0 else []
    if not files:  # not a git checkout: copy the folders that matter
        skip = shutil.ignore_patterns("__pycache__", "_build", "_sweeps", "generated", "gallery", "_gallery_src")
        for name in ("linattn_theory", "simulations", "derivations", "benchmarks", "docs", "tests",
                     "figures", "notebooks", ".ci"):
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, target / name, ignore=skip)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, target / name)
        return target
    for name in files:
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device
        return False


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


def run(argv: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "LINATTN_QUICK": "1",
           "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"{what} failed\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def run_command(command: str, needs: str | None, cwd: Path, page: str):
    if command.startswith("pip install"):
        check_pip_target(command)
        return
    argv = to_argv(command)
    if argv[1:3] == ["-m", "pytest"] and (argv[3:] == ["-q"] or needs):
        # the whole suite (this test is part of it) is what CI runs: check that it does
        assert command in (ROOT / ".ci" / "run").read_text() or needs, command
        return
    if argv[1:3] == ["-m", "sphinx"]:
        from test_docs_site import BUILD_COMMAND
        assert command == BUILD_COMMAND, f"{page}: builds the site otherwise than the test does"
        return
    if needs and not (needs == "gpu" and gpu_available()):
        if argv[0] != sys.executable or argv[1:2] == ["-c"]:
            return  # a shell command for a cluster or a GPU: nothing to run here
        script = argv[:3] if argv[1] == "-m" else argv[:2]
        if argv[1] == "-m" and argv[2] == "linattn_theory":
            script = argv[:4]
        argv = [*script, "--help"]
    elif "--quick" not in argv and any(a in ("figures", "sweep") for a in argv[:4]) and "--list" not in argv:
        argv.append("--quick")
    if argv[0] == "rm":
        return  # cleaning a scratch folder
    run(argv, cwd, f"{page}: `{command}`")


def apply_snippet(block: Block, scratch: Path, where: str):
    """Apply one marked block to the copy ``scratch`` (module docstring, step 1)."""
    path = scratch / block.target
    if block.action == "new":
        assert not path.exists(), f"{where}: {block.target} exists already"
        path.write_text(block.text)
    elif block.action == "append":
        path.write_text(path.read_text() + "\n\n" + block.text)
    elif block.action == "patch":
        path.write_text(apply_patch(path.read_text(), block.text, where))
    elif block.action == "excerpt":
        assert_excerpt(path.read_text(), block.text, where)
    else:
        raise AssertionError(f"{where}: unknown snippet action {block.action!r}")


def walk_through(page: Path, scratch: Path):
    """Apply the page's snippets, run its Python and TOML blocks, then its commands (module docstring)."""
    name = page.relative_to(ROOT).as_posix()
    blocks = code_blocks(page)
    gpu = gpu_available()
    script = []
    for block in blocks:
        where = f"{name}:{block.line}"
        if block.action == "needs":
            if block.target == "gpu" and gpu:
                pass
            else:
                continue
        elif block.action is not None:
            apply_snippet(block, scratch, where)
            continue
        if block.language == "python":
            script.append(f"# {where}\n{block.text}")
        elif block.language == "toml":
            script.append(f"# {where}\nimport tomllib as _tomllib\nfrom linattn_theory import config_from_dict as _check\n"
                          f"_check(_tomllib.loads({block.text!r}))\n")
    if script:
        (scratch / "_page_snippets.py").write_text("\n".join(script))
        run([sys.executable, "_page_snippets.py"], scratch, f"{name}: its Python and TOML blocks")
    for command, needs in commands(blocks):
        run_command(command, needs, scratch, name)


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


PARAMS = [pytest.param(page, id=_page_id(page)) for page in PAGES]


def test_pages_show_commands_and_snippets():
    shown = {_page_id(page): code_blocks(page) for page in PAGES}
    assert list(commands(shown["README.md"]))
    assert sum(1 for blocks in shown.values() if list(commands(blocks))) >= 5
    assert any(block.action == "patch" for blocks in shown.values() for block in blocks)


@pytest.mark.slow       # 5-60 s a page: commands and tests run in subprocesses
@pytest.mark.parametrize("page", PARAMS)
def test_page_walk_through(page, tmp_path):
    walk_through(page, copy_repository(tmp_path))


#: what the extension how-tos add, and the checks every strategy or family gets that must run on it
EXTENSIONS = {"add-strategy.md": "fedyogi", "add-task-family.md": "kernel_shift"}
GENERIC_CHECKS = {
    "tests/test_figures.py": ["test_every_method_has_one_style_and_no_panel_repeats_a_colour"],
    "tests/test_strategies.py": ["test_every_strategy_declares_what_it_does[fedyogi]",
                                 "test_every_strategy_is_deterministic_and_freezes_exactly[fedyogi]",
                                 "test_every_strategy_runs_unchanged_under_array_api_strict[fedyogi]"],
    "tests/test_tasks.py": ["test_client_data_do_not_depend_on_number_of_clients[kernel_shift]",
                            "test_fresh_samples_share_the_clients_but_not_the_draws[kernel_shift]",
                            "test_every_family_names_its_keys_by_its_factory_and_takes_seed_and_fresh_samples"],
    "tests/test_theory.py": ["test_population_moments_of_every_family_agree_with_an_independent_draw[kernel_shift]"],
}


@pytest.mark.slow       # about 20 s: one pytest run in a copy of the repository
def test_the_howtos_additions_pass_the_checks_every_strategy_and_family_gets(tmp_path):
    """The how-tos' toy strategy (FedYogi) and toy task family (kernel shift), written into a copy of
    the repository from the pages' own code blocks and nothing else, are registered by those blocks
    and pass the checks every strategy and family gets: the figures' style and panel check, the
    strategies' declaration, determinism, freezing and Array-API checks, the families' seeding, keys
    and fresh-sample checks, and the theory's population moments (which need ``fresh_samples``)."""
    scratch = copy_repository(tmp_path)
    for page, name in EXTENSIONS.items():
        blocks = [b for b in code_blocks(ROOT / "docs" / "howto" / page) if b.action in ("new", "append", "patch")]
        assert any(b.action == "new" for b in blocks), page
        for block in blocks:
            apply_snippet(block, scratch, f"{page}:{block.line}")
    names = [f"{path}::{test}" for path, tests in GENERIC_CHECKS.items() for test in tests]
    proc = run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rA", *names],
               scratch, "the checks every strategy and family gets, on the how-tos' additions")
    passed = set(re.findall(r"^PASSED (\S+)", proc.stdout, re.M))
    assert passed == set(names), sorted(set(names) - passed)


def test_patch_and_excerpt_checks_catch_drift():
    """The helpers that follow the pages fail when the code moved away from what a page shows."""
    text = "a = 1\nb = 2\nc = 3\n"
    assert apply_patch(text, " a = 1\n-b = 2\n+b = 20\n", "t") == "a = 1\nb = 20\nc = 3\n"
    with pytest.raises(AssertionError, match="not found exactly once"):
        apply_patch(text, " a = 1\n-b = 3\n+b = 30\n", "t")
    with pytest.raises(AssertionError, match="not found exactly once"):     # whole lines only
        apply_patch("a = 1\nb = 2  # two\n", " a = 1\n-b = 2\n+b = 20\n", "t")
    assert_excerpt(text, "a = 1   # one\nc = 3\n", "t")
    with pytest.raises(AssertionError, match="not in the file"):
        assert_excerpt(text, "c = 3\na = 1\n", "t")
