"""Shared reporting for the derivation scripts: each claim prints PASS or FAIL."""

from __future__ import annotations

import sys

_failures: list[str] = []


def check(claim: str, holds: bool) -> bool:
    """Print ``PASS``/``FAIL`` for one claim and remember failures."""
    print(f"{'PASS' if holds else 'FAIL'}: {claim}")
    if not holds:
        _failures.append(claim)
    return holds


def finish() -> None:
    """Exit non-zero when any claim failed."""
    if _failures:
        print(f"{len(_failures)} claim(s) FAILED")
        sys.exit(1)
    print("all claims PASS")
