"""Packaging: the sdist holds the whole repository, a wheel built from it records the revision and
ships the example configs and figure scripts, and the README quick start runs from that wheel in
a folder unrelated to the checkout (nothing fetched: pip installs the wheel without dependencies
into a folder of its own, the test's environment supplies them)."""

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _git(*args) -> str | None:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(sdist, wheel)`` of ``python -m build`` (the wheel is built from the sdist)."""
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "deprecated" not in proc.stdout + proc.stderr          # e.g. a TOML-table licence
    return next(out.glob("*.tar.gz")), next(out.glob("*.whl"))


def test_the_sdist_holds_every_tracked_file_and_the_revision(built):
    tracked = _git("ls-files")
    if tracked is None:
        pytest.skip("not a git checkout")
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        prefix = tar.getnames()[0].split("/")[0]
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        recorded = tar.extractfile(f"{prefix}/linattn_theory/_revision.txt").read().decode().split()
    missing = sorted(set(tracked.splitlines()) - names)
    assert not missing, f"tracked files missing from the sdist (its tests would fail): {missing[:10]}"
    assert "LICENSE" in names and not [n for n in tracked.splitlines() if n.endswith(".whl")]
    assert recorded[0] == _git("rev-parse", "HEAD").strip()


def test_a_wheel_built_from_the_sdist_records_the_revision_licence_and_examples(built):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        revision = archive.read("linattn_theory/_revision.txt").decode().split()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    head = _git("rev-parse", "HEAD")
    if head is not None:
        assert revision[0] == head.strip()
    assert "License-Expression: MIT" in metadata.splitlines()
    compiled = [n for n in names if n.endswith((".nbi", ".nbc", ".pyc")) or "__pycache__" in n]
    assert not compiled, f"the wheel ships compiled caches: {compiled[:5]}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for example in ("simulations/configs/quickstart.toml", "simulations/tradeoff.py", "derivations/gradients.py",
                    "notebooks/bias_drift_tradeoff.py", "notebooks/solutions.py", "notebooks/execute.py",
                    "figures/best_warmup.csv"):
        assert f"linattn_theory/_examples/{example}" in names
    assert not [n for n in names if n.endswith(".ipynb")]        # 300 KB of outputs: execute.py makes it


def test_the_readme_quick_start_runs_from_the_wheel_in_an_unrelated_folder(built, tmp_path):
    _, wheel = built
    site, work = tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site), "MPLBACKEND": "Agg"}
    linattn = [str(site / "bin" / "linattn")] if (site / "bin" / "linattn").exists() else \
        [sys.executable, "-m", "linattn_theory"]

    def run(*args):
        proc = subprocess.run([*args], cwd=work, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    where = run(sys.executable, "-c", "import linattn_theory; print(linattn_theory.__file__)")
    assert Path(where.strip()).is_relative_to(site)          # the wheel, not the checkout
    run(*linattn, "figures", "--quick", "--only", "phase_diagram", "--out", "results", "--quiet")
    assert (work / "results" / "phase_diagram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    configs = run(*linattn, "examples").split()
    quickstart = next(Path(c) for c in configs if c.endswith("quickstart.toml"))
    assert quickstart.is_relative_to(site)
    run(*linattn, "simulate", str(quickstart), "--out", "run", "--quiet")
    assert (work / "run" / "metadata.json").is_file()
    failed = subprocess.run([*linattn, "simulate", "simulations/configs/quickstart.toml", "--out", "x"],
                            cwd=work, env=env, capture_output=True, text=True)
    assert failed.returncode == 2 and "`linattn examples --copy .`" in failed.stderr


def test_the_wheel_ships_the_walk_through_and_it_runs_from_a_copy_anywhere(built, tmp_path):
    """`linattn examples --copy DIR` gives a wheel user the notebook and its solutions; the copy runs as a
    script from an unrelated folder and reads the committed table the package ships."""
    import pandas as pd

    _, wheel = built
    site, work = tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}

    def run(*args):
        proc = subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    listed = run("-m", "linattn_theory", "examples")
    assert str(site / "linattn_theory" / "_examples" / "notebooks") in listed
    run("-m", "linattn_theory", "examples", "--copy", "mine")
    for name in ("bias_drift_tradeoff.py", "solutions.py", "execute.py"):
        assert (work / "mine" / "notebooks" / name).is_file(), name
    printed = run(str(work / "mine" / "notebooks" / "bias_drift_tradeoff.py"))
    measured = pd.read_csv(ROOT / "figures" / "best_warmup.csv")
    for zeta, sub in measured.groupby("zeta_value"):
        assert f"ζ_V = {zeta:g}: FedFrozen at its best T0, against FedAvg at the same step (not tuned), wins " \
               f"(gain above 2 %) in {int((sub['gain'] > 0.02).sum())} of {len(sub)} instances" in printed
