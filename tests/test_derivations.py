"""Every derivation script (``derivations/*.py``) runs, asserts its claims and reports PASS."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "derivations").glob("*.py") if not p.name.startswith("_"))


def test_there_are_derivations():
    assert {"profile.py", "frozen_stage.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_derivation_passes(script):
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    assert "PASS" in out.stdout, report
    assert "FAIL" not in out.stdout, report
