"""Shared test settings; the marker and warning policy is tests/README.md."""

import os

from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")

#: an unmarked test slower than this (call plus setup, seconds) belongs to the ``slow`` marker
SLOW_SECONDS = 3.0
_seconds: dict[str, float] = {}
_slow: set[str] = set()


def pytest_runtest_logreport(report):
    # reports carry their test's markers, also when a pytest-xdist worker sends them
    if report.when in ("setup", "call"):
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
        if "slow" in report.keywords:
            _slow.add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    unmarked = sorted(((s, n) for n, s in _seconds.items() if s > SLOW_SECONDS and n not in _slow), reverse=True)
    if unmarked:
        terminalreporter.write_sep("-", f"unmarked tests slower than {SLOW_SECONDS:g} s (mark them slow: "
                                        "tests/README.md)")
        for seconds, nodeid in unmarked:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


# Property tests draw the same examples on every run ("ci", the default): a test that fails for
# one random draw in a hundred is a failing test, and CI must say so every time or never. Run
# HYPOTHESIS_PROFILE=explore python -m pytest ... to draw fresh examples when looking for bugs.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
