"""The benchmark scripts run (benchmarks/; their numbers are measurements, never asserted here).

Each script's smallest mode runs in a fresh process, as a user would start it. The test asserts the
checks a script makes of its own results and that it prints what its table promises. None of these
scripts was run by a test before: `bench_ensemble.py` once raised a TypeError for a release and
nothing noticed (stop 37's note). Timings are not asserted; speed goals live in the scripts' output.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(*args: str, timeout: float = 300) -> str:
    """``python benchmarks/ARGS`` from the repository root; its stdout and stderr (a failure shows both)."""
    env = dict(os.environ, MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def _largest(pattern: str, output: str) -> float:
    """The largest number matched by ``pattern`` (one group) in ``output``; fails when none is."""
    found = [float(v) for v in re.findall(pattern, output)]
    assert found, f"{pattern!r} not in the output:\n{output[-3000:]}"
    return max(found)


def test_bench_round_quick_agrees_with_the_array_api_engine():
    """bench_round.py --quick: the engines' table, and the fused parameters after 3 rounds within
    1e-12 of the Array-API engine's (the script's own check, docs/howto/gpu.md §5)."""
    output = _run("benchmarks/bench_round.py", "--quick", "--no-torch")
    assert "fused engine, 1 thread" in output and "Array-API engine" in output
    assert _largest(r"max rel\. difference ([0-9.eE+-]+)", output) < 1e-12


def test_bench_warmup_sweep_checks_its_frozen_stages_against_explicit_runs():
    """bench_warmup_sweep.py --check: the moment-space frozen stages equal explicit runs at three T0 to
    1e-12 relative (a frozen-stage map off by a step fails this)."""
    output = _run("benchmarks/bench_warmup_sweep.py", "--rounds", "4", "--repeat", "1", "--check")
    assert "warmup_sweep, every T0 in 0..T" in output
    assert _largest(r"largest relative table difference vs explicit runs at T0 = [0-9, ]+: ([0-9.eE+-]+)",
                    output) < 1e-12


def test_bench_softmax_and_engine_threshold_print_their_tables():
    """bench_softmax.py and engine_threshold.py run once: a row per attention and the ratio to the goal;
    a row per size with the alone and ensemble ratios."""
    softmax = _run("benchmarks/bench_softmax.py", "--repeat", "1")
    assert re.search(r"\|\s+linear \|", softmax) and re.search(r"\|\s+softmax \|", softmax)
    assert "softmax / linear round time" in softmax
    threshold = _run("benchmarks/engine_threshold.py", "--repeat", "1", "--rounds", "2")
    assert len(re.findall(r"m·N·d² = 2\^[0-9.]+ .*alone .* ensemble per instance", threshold)) >= 5


def test_bench_ensemble_quick_runs_every_engine():
    """bench_ensemble.py --quick --no-peers: the throughput table for 1 and 8 instances, both engines
    (the script that once broke unnoticed)."""
    output = _run("benchmarks/bench_ensemble.py", "--quick", "--no-peers")
    for instances in (1, 8):
        for engine in ("NumPy (Array-API)", "fused CPU"):
            assert re.search(rf"\|\s+{instances} \|\s+{re.escape(engine)} \|", output), (instances, engine)


def test_bench_ensemble_cpu_sections_run_and_print_their_tables():
    """bench_ensemble.py's CPU sections, asked for by name (``kernels``, ``compute``, ``scoring``): each
    prints its table. The ``kernels`` section calls the compiled kernels directly, so a change of their
    arguments breaks it and nothing else: session 19's ``src`` argument did, unnoticed until session 20.
    The shares of the DGEMM rate are measurements; only that they are shares (in (0, 1]) is asserted, and
    that the round's parts, timed in place, are positive and inside the round."""
    output = _run("benchmarks/bench_ensemble.py", "--sections", "kernels", "compute", "scoring", "--no-peers",
                  "--repeat", "1")
    for size in ("figures", "figures, two heads", "d = 4 (regret benchmark)", "reference (d = 16: tiles)"):
        assert re.search(rf"\|\s+{re.escape(size)} \|.*\|\s+[0-9.]+ \|$", output, re.M), size
    shares = [float(v) for v in re.findall(r"^\|\s+[12] \|(?:[^|]*\|){4}\s+([0-9.]+) \|\s+(?:[0-9.]+|–) \|$",
                                           output, re.M)]
    assert len(shares) == 2 and all(0 < s <= 1 for s in shares), shares
    # where the round goes: round, local steps, client losses, rest (ms) and the local steps' share alone
    parts = [[float(v) for v in row] for row in re.findall(
        r"^\|\s+[12] \|\s+([0-9.]+) \|\s+([0-9.]+) \|\s+([0-9.]+) \|\s+(-?[0-9.]+) \|\s+([0-9.]+) \|$", output, re.M)]
    assert len(parts) == 2, output[-3000:]
    for total, steps, losses, rest, alone in parts:
        assert steps > 0 and losses > 0 and rest >= 0 and steps + losses <= total + 0.01, (total, steps, losses, rest)
        assert 0 < alone <= 1, alone
    assert re.search(r"together / one at a time: [0-9.]+× \(wall\)", output)
    assert re.search(r"\|\s+· · _factor_objectives \|\s+[0-9.]+ \|", output)


@pytest.mark.skipif(all(importlib.util.find_spec(m) is None for m in ("jax", "torch")),
                    reason="neither JAX nor PyTorch is installed (the peers are optional, never dependencies)")
def test_bench_ensemble_peers_compute_what_the_engine_computes():
    """The JAX and PyTorch peers of bench_ensemble.py's throughput table (run where installed) end with
    the fused engine's server parameters to 1e-12: their times compare the same work. The PyTorch peer
    had named two axes alike in an einsum and had never run (found 2026-12-06, the first run with it)."""
    output = _run("benchmarks/bench_ensemble.py", "--sections", "throughput", "--instances", "1",
                  "--repeat", "1", "--rounds", "2", timeout=900)
    installed = [name for name, module in (("JAX jit+vmap", "jax"), ("PyTorch batched", "torch"))
                 if importlib.util.find_spec(module) is not None]
    for name in installed:
        found = re.findall(rf"^  \w+, 1 instances, {re.escape(name)} \(\w+\): ([0-9.eE+-]+)$", output, re.M)
        assert len(found) == 2 and max(float(v) for v in found) < 1e-12, (name, found, output[-3000:])


def test_check_optima_finds_todays_optima_equal_to_the_reference_solvers():
    """check_optima.py on one regret-benchmark task (8 instances): today's lock-step optima equal the
    reference path's (one ``scipy.optimize.minimize`` after another) bit for bit; the script exits 1 when
    an optimum is higher by more than 1e-10."""
    output = _run("benchmarks/check_optima.py", "--old", "none", "regret", "--chunks", "0")
    assert re.search(r"problems 8: .* higher 0, bit-equal 8; all kernels and start tables identical: True", output)


def test_compare_figures_reports_what_moved_and_which_runs_flipped(tmp_path):
    """compare_figures.py on copies of two committed tables, one moved on purpose: one entry of
    best_warmup.csv 1e-6 higher, one finite run of phase_diagram.csv marked diverged (its numbers NaN).
    The first table shows that difference and nothing else. The second shows one divergence flip, and
    the flip is counted as flagged chaotic or not as the committed table flags that run."""
    import pandas as pd

    best = pd.read_csv(ROOT / "figures" / "best_warmup.csv")
    best.loc[3, "R_best"] *= 1 + 1e-6
    best.to_csv(tmp_path / "best_warmup.csv", index=False)
    runs = pd.read_csv(ROOT / "figures" / "phase_diagram.csv")
    finite = runs.index[~runs["diverged"].astype(bool)][0]
    runs.loc[finite, "diverged"] = True
    runs.loc[finite, [c for c in runs.columns if pd.api.types.is_float_dtype(runs[c])]] = float("nan")
    runs.to_csv(tmp_path / "phase_diagram.csv", index=False)
    output = _run("benchmarks/compare_figures.py", str(tmp_path), "--against", "figures")
    rows = {line.split()[0]: line for line in output.splitlines() if line.split() and line.split()[0].endswith(".csv")}
    assert set(rows) == {"best_warmup.csv", "phase_diagram.csv"}, output
    assert re.search(r"\b1\.00e-06 R_best\b", rows["best_warmup.csv"]), rows["best_warmup.csv"]
    flagged = int(bool(runs.loc[finite, "chaotic"])) if "chaotic" in runs.columns else 0
    assert re.search(rf"\b1 \({flagged} flagged chaotic\)", rows["phase_diagram.csv"]), rows["phase_diagram.csv"]


def test_gpu_check_without_a_gpu_says_so_and_succeeds():
    """gpu_check.py --quick on a machine without CuPy and a GPU: exit 0, and it says there is nothing to check."""
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: the check would run on the GPU (tests/test_gpu.py)")
    except ImportError:
        pass
    assert "not available here; nothing to check" in _run("benchmarks/gpu_check.py", "--quick")
