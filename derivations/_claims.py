"""Shared reporting for the derivation scripts in this folder (not a derivation itself).

``claim(name, ok)`` prints ``PASS: name`` or ``FAIL: name``: a statement derived with sympy (or
checked against the package) that could come out false. ``bookkeeping(name, ok)`` prints
``BOOKKEEPING: name`` for a statement that holds by definition (an identity that restates how a
quantity was defined, a textbook inequality); it is shown so that the derivation reads in full but
is never counted as evidence (docs/theory.md §6, "What is checked") — if it does *not* hold,
the script has a typo and it prints ``FAIL``. ``note(text)`` prints ``NOTE: text``.
``finish()`` prints the tally and exits with status 1 when any claim failed.
No claim is wrapped in ``try``/``except``: an exception ends the script with a non-zero status.
Importing this module also puts the repository root on ``sys.path`` so that a script run as
``python derivations/NAME.py`` can import the package.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FAILURES: list[str] = []
COUNTS = {"claims": 0, "failed": 0, "bookkeeping": 0}


def _detail(detail: str) -> str:
    return f"  ({detail})" if detail else ""


def claim(name: str, ok: bool, detail: str = "") -> bool:
    """Report one claim (counted as evidence); remember it when it fails."""
    COUNTS["claims"] += 1
    print(f"{'PASS' if ok else 'FAIL'}: {name}{_detail(detail)}")
    if not ok:
        FAILURES.append(name)
        COUNTS["failed"] += 1
    return bool(ok)


def bookkeeping(name: str, ok: bool, detail: str = "") -> bool:
    """Report a statement that holds by definition: printed, not counted; a false one is a FAIL."""
    COUNTS["bookkeeping"] += 1
    if ok:
        print(f"BOOKKEEPING: {name}{_detail(detail)}")
    else:
        print(f"FAIL: {name} (bookkeeping identity does not hold){_detail(detail)}")
        FAILURES.append(name)
    return bool(ok)


def note(text: str) -> None:
    """Print a remark that is neither a claim nor bookkeeping."""
    print(f"NOTE: {text}")


def finish() -> None:
    """Print the tally; exit 1 if any claim failed."""
    passed = COUNTS["claims"] - COUNTS["failed"]
    tally = f"{passed} of {COUNTS['claims']} claims hold; {COUNTS['bookkeeping']} bookkeeping (not counted)"
    if FAILURES:
        print(f"VERDICT: {len(FAILURES)} claim(s) failed: {'; '.join(FAILURES)}  [{tally}]")
        sys.exit(1)
    print(f"VERDICT: all claims hold  [{tally}]")
