"""CI installs the oldest versions the package declares (.ci/oldest.txt): the pins are the lower
bounds of pyproject.toml, one for every declared requirement of the test command's install."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lower_bounds() -> dict[str, str]:
    """``name -> lower bound`` of every requirement the ``[test]`` extra pulls in (with its extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements, pending, seen = list(project["dependencies"]), ["test"], set()
    while pending:
        extra = pending.pop()
        seen.add(extra)
        for requirement in extras[extra]:
            own = re.fullmatch(r"linattn-theory\[([\w,-]+)\]", requirement)
            if own:
                pending.extend(e for e in own.group(1).split(",") if e not in seen)
            else:
                requirements.append(requirement)
    bounds = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[\w,]+\])?>=([\w.]+)(;.*)?", requirement.replace(" ", ""))
        assert match, f"{requirement!r}: every requirement declares its lower bound as NAME>=VERSION"
        name, package_extras, version = match.group(1), match.group(2), match.group(3)
        bounds[_normalise(name)] = version
        if package_extras == "[distributed]":      # dask[distributed] installs distributed of its version
            bounds["distributed"] = version
    return bounds


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "oldest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[_normalise(name)] = version
    return pins


def test_the_oldest_pins_are_the_declared_lower_bounds():
    bounds, pins = _lower_bounds(), _pins()
    assert set(pins) == set(bounds), f"unpinned: {set(bounds) - set(pins)}; not declared: {set(pins) - set(bounds)}"
    for name, version in bounds.items():
        assert tuple(map(int, pins[name].split("."))) == tuple(map(int, version.split("."))) + (0,) * (
            pins[name].count(".") - version.count(".")), f"{name}: pinned {pins[name]}, declared >= {version}"


def test_ci_runs_the_readme_test_command_fresh_oldest_and_as_on_another_cpu():
    script = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    command = 'pip install ".[test]" && python -m pytest -q'
    assert command in readme
    runs = [line.strip() for line in script.splitlines() if not line.strip().startswith("#")]
    assert any(line == command or line.startswith(command + " ||") for line in runs), \
        "CI runs the README's test command itself, not a variant of it"
    assert "-m venv" in script and 'PIP_CONSTRAINT="$PWD/.ci/oldest.txt"' in script
    assert "NPY_DISABLE_CPU_FEATURES" in script and 'OPENBLAS_CORETYPE="$kernels"' in script
    another = [line.strip() for line in script[script.index('OPENBLAS_CORETYPE="$kernels"'):].splitlines()[:2]]
    assert another[1] == '"$work/newest/bin/python" -m pytest -q', "the other-CPU run runs every test"
