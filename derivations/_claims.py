"""Shared reporting for the derivation scripts in this folder (not a derivation itself).

``claim(name, ok)`` prints ``PASS: name`` or ``FAIL: name``; ``finish()`` prints the verdict and
exits with status 1 when any claim failed. Importing this module also puts the repository root
on ``sys.path`` so that a script run as ``python derivations/NAME.py`` can import the package.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAILURES: list[str] = []


def claim(name: str, ok: bool, detail: str = "") -> bool:
    """Report one claim; remember it when it fails."""
    print(f"{'PASS' if ok else 'FAIL'}: {name}{'  (' + detail + ')' if detail else ''}")
    if not ok:
        FAILURES.append(name)
    return bool(ok)


def finish() -> None:
    """Print the verdict; exit 1 if any claim failed."""
    if FAILURES:
        print(f"FAIL: {len(FAILURES)} claim(s) failed: {'; '.join(FAILURES)}")
        sys.exit(1)
    print("PASS: all claims hold")
