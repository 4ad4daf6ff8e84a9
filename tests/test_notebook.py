"""The teaching notebook runs end to end (quick settings), its exercises pass, and .ipynb = .py.

The notebook is ``notebooks/bias_drift_tradeoff.py`` (Jupytext percent format) with its paired
``notebooks/bias_drift_tradeoff.ipynb``. Each exercise cell computes its answer, checks it with
``assert`` and prints ``EXERCISE <name>: PASS``; the tests below demand every exercise by name,
so one that silently disappears fails the test as surely as one that fails its check.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "bias_drift_tradeoff.py"
PAIRED = NOTEBOOK.with_suffix(".ipynb")

EXERCISES = [
    "scale_symmetry", "value_gradient", "fedavg_e1_is_gd", "drift_grows_with_zeta",
    "profile_is_best_value_loss", "profile_scale_invariant", "envelope_gradient",
    "drift_costs_kernel_quality",
    "no_drift_with_one_local_step", "drift_quadruples_with_zeta", "drift_scales_as_eta_squared",
    "no_drift_with_identical_inputs", "bound_above_excess_risk", "recommended_warmup_regret",
    "best_warmup_earlier_with_more_heterogeneity",
    "no_drift_train_to_the_end",
]


def _environment(tmp_path):
    env = dict(os.environ, LINATTN_QUICK="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               LINATTN_NOTEBOOK_FIGURES=str(tmp_path / "figures"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _exercise_results(output: str) -> dict[str, str]:
    results = {}
    for line in output.splitlines():
        if line.startswith("EXERCISE "):
            name, _, rest = line[len("EXERCISE "):].partition(":")
            results[name.strip()] = rest.split()[0]
    return results


def _assert_all_exercises_pass(output: str):
    results = _exercise_results(output)
    missing = [name for name in EXERCISES if name not in results]
    failed = {name: status for name, status in results.items() if status != "PASS"}
    assert not missing, f"exercises that did not report: {missing}\n{output[-3000:]}"
    assert not failed, f"exercises that failed: {failed}\n{output[-3000:]}"
    assert set(results) == set(EXERCISES), f"unexpected exercises {set(results) - set(EXERCISES)}: update EXERCISES"


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("notebook")
    proc = subprocess.run([sys.executable, str(NOTEBOOK)], cwd=ROOT, env=_environment(tmp_path),
                          capture_output=True, text=True, timeout=300)
    return proc, tmp_path


def test_script_runs_end_to_end_and_every_exercise_passes(script_run):
    proc, _ = script_run
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    _assert_all_exercises_pass(output)
    assert "quick mode: True" in output


def test_script_draws_every_figure(script_run):
    """Each section's figure is drawn (saved as PNG when LINATTN_NOTEBOOK_FIGURES is set)."""
    from matplotlib import image

    _, tmp_path = script_run
    expected = {"1_model", "2_gradients", "3_client_drift", "4_profile_bias", "5_frozen_stage",
                "6_tradeoff", "6_bound", "6_heterogeneity"}
    written = {p.stem: p for p in (tmp_path / "figures").glob("*.png")}
    assert expected <= set(written), f"missing figures: {expected - set(written)}"
    for name in expected:
        pixels = image.imread(written[name])
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100, name
        assert pixels[..., :3].std() > 0.05, f"{name} looks blank"


def _cells(path):
    import jupytext

    notebook = jupytext.read(path)
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_ipynb_is_in_sync_with_the_script():
    script, paired = _cells(NOTEBOOK), _cells(PAIRED)
    assert len(script) == len(paired), "cell count differs: run jupytext --to ipynb " + str(NOTEBOOK)
    for i, (a, b) in enumerate(zip(script, paired)):
        assert a == b, f"cell {i} differs between .py and .ipynb: run jupytext --to ipynb {NOTEBOOK}"
    assert sum(kind == "code" for kind, _ in script) >= 10


def test_runs_as_a_notebook(tmp_path):
    """The .ipynb's cells run in an IPython shell from the notebooks folder, as Jupyter would run them."""
    runner = (
        "import sys, jupytext\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "for cell in jupytext.read(sys.argv[1]).cells:\n"
        "    if cell.cell_type == 'code':\n"
        "        shell.run_cell(cell.source).raise_error()\n"
    )
    pytest.importorskip("IPython")
    proc = subprocess.run([sys.executable, "-c", runner, str(PAIRED)], cwd=PAIRED.parent,
                          env=_environment(tmp_path), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    _assert_all_exercises_pass(output)
