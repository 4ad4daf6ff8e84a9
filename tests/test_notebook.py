"""The teaching notebook: students' stubs are checked, solutions pass, wrong answers fail, nothing aborts.

The notebook is ``notebooks/bias_drift_tradeoff.py`` (Jupytext percent format) with its paired,
executed ``notebooks/bias_drift_tradeoff.ipynb``; ``notebooks/execute.py`` runs it headless in an
IPython shell. Three executions are checked: as shipped (every exercise ``UNANSWERED``, every
theorem holds, and the outputs equal the committed ``.ipynb``'s), with ``notebooks/solutions.py``
filled in (every exercise ``PASS``), and with the wrong answers of ``tests/notebook_wrong_answers.py``
and ``E = 5`` (every exercise ``FAIL``, and the notebook still runs to the end).
"""

import ast
import base64
import json
import os
import re
import subprocess
import sys
from io import BytesIO
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory.report.teaching import TheoremViolation, best_warmup, check_exercise, tendency, theorem

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "bias_drift_tradeoff.py"
PAIRED = NOTEBOOK.with_suffix(".ipynb")
EXECUTE = ROOT / "notebooks" / "execute.py"
SOLUTIONS = ROOT / "notebooks" / "solutions.py"
WRONG = ROOT / "tests" / "notebook_wrong_answers.py"

EXERCISES = ["1 scale symmetry", "2 value gradient", "3 server average", "4a profile by least squares",
             "4b bias ratio", "5a drift floor", "5b drift floor factor", "6 final value block",
             "7 best warm-up shift"]
#: the predictions asked as numbers: no figure may show the answer before their check
PREDICTIONS = ["4b bias ratio", "7 best warm-up shift"]
THEOREMS = ["FedAvg with E = 1 is gradient descent on F", "Φ_0 does not see the kernel's scale",
            "V_FA is the fixed point of the simulator's frozen round", "no drift floor with one local step",
            "no drift floor when the clients share their inputs", "R = bias + drift floor + unfinished, at every T0"]
TENDENCIES = ["drift grows with heterogeneity", "D ∝ η² at small η",
              "the best warm-up moves earlier as heterogeneity grows"]
STUBS = ["rescale", "value_gradient", "server_average", "profile_by_least_squares", "bias_ratio_after_T_rounds",
         "drift_floor", "drift_floor_factor_when_zeta_doubles", "final_value_block", "best_warmup_shift"]


def _execute(tmp_path, *args):
    """Run notebooks/execute.py; return (exit status, printed output, the executed notebook as JSON)."""
    out = tmp_path / "executed.ipynb"
    env = dict(os.environ, MPLBACKEND="Agg", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, str(EXECUTE), "--out", str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, json.loads(out.read_text())


def _reports(output: str, kind: str) -> dict[str, str]:
    """{name: status} of the lines ``KIND name: STATUS  detail``."""
    found = {}
    for line in output.splitlines():
        match = re.match(rf"{kind} (.+?): (PASS|FAIL|UNANSWERED|holds|does NOT hold)\b", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _assert_theorems_hold(output: str):
    assert _reports(output, "THEOREM") == {name: "holds" for name in THEOREMS}, output[-3000:]
    assert set(_reports(output, "TENDENCY")) == set(TENDENCIES), output[-3000:]


@pytest.fixture(scope="module")
def unanswered(tmp_path_factory):
    return _execute(tmp_path_factory.mktemp("unanswered"))


@pytest.mark.slow
def test_unanswered_notebook_runs_to_the_end(unanswered):
    status, output, _ = unanswered
    assert status == 0, output[-3000:]
    assert _reports(output, "EXERCISE") == {name: "UNANSWERED" for name in EXERCISES}, output[-3000:]
    _assert_theorems_hold(output)


def _outputs(notebook):
    """Per code cell: its text outputs, and the pixel shape of each figure."""
    from matplotlib import image

    cells = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        texts, figures = [], []
        for output in cell["outputs"]:
            if output["output_type"] == "stream":
                texts.append((output["name"], "".join(output["text"])))
            elif "image/png" in output.get("data", {}):
                pixels = image.imread(BytesIO(base64.b64decode(output["data"]["image/png"])))
                assert pixels[..., :3].std() > 0.05, "a blank figure"
                figures.append(pixels.shape)
            else:
                texts.append((output["output_type"], json.dumps(output.get("data"), sort_keys=True)))
        cells.append((cell["execution_count"], texts, figures))
    return cells


#: a printed number: an integer, a decimal or a mantissa with an exponent
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
#: below this a printed number is a rounding residue of float64 (ε = 2.2e-16 times the O(1)–O(100)
#: quantities it is the residue of); the notebook's theorems bound such residues themselves
_RESIDUE = 1e-12


def _last_digit(token: str) -> float:
    """The unit of a printed decimal's last digit: ``1.7e-16`` → 1e-17, ``0.4973`` → 1e-4."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _same_printout(ours: str, theirs: str) -> bool:
    """The same text with the same numbers: integers exactly, decimals to one unit of their last printed
    digit (a value on a rounding boundary may print either way), residues below :data:`_RESIDUE` as zero.

    The outputs are one execution of the same code; they differ only where NumPy's summation order
    differs by CPU (AVX2 or AVX-512 paths), which moves these well-conditioned results by ~1e-15
    relative, far below a printed digit but enough to change a printed rounding residue."""
    if _NUMBER.sub("#", ours) != _NUMBER.sub("#", theirs):
        return False
    for a, b in zip(_NUMBER.findall(ours), _NUMBER.findall(theirs), strict=True):
        if not any(c in a + b for c in ".eE"):
            if a != b:
                return False
            continue
        x, y = float(a), float(b)
        if max(abs(x), abs(y)) < _RESIDUE:
            continue
        if abs(x - y) > max(_last_digit(a), _last_digit(b)) * (1 + 1e-9):
            return False
    return True


def test_printouts_compare_as_numbers_to_their_printed_digits():
    assert _same_printout("moves it by 7.8e-16", "moves it by 5.6e-16")
    assert _same_printout("R = 0.4974 at T0 = 20", "R = 0.4973 at T0 = 20")
    assert not _same_printout("R = 0.4975 at T0 = 20", "R = 0.4973 at T0 = 20")
    assert not _same_printout("R = 0.4973 at T0 = 21", "R = 0.4973 at T0 = 20")
    assert not _same_printout("gain 1.3e-11", "gain 5.6e-16")
    assert not _same_printout("holds (3 rows)", "fails (3 rows)")
    assert not _same_printout("1.0 2.0", "1.0")


@pytest.mark.slow
def test_committed_ipynb_has_the_outputs_of_a_fresh_execution(unanswered):
    """Same code, same printed outputs, same figures (pixel sizes) as running the .py now."""
    _, output, fresh = unanswered
    committed = json.loads(PAIRED.read_text())
    assert [c["source"] for c in committed["cells"]] == [c["source"] for c in fresh["cells"]], \
        "the .ipynb is stale: run python notebooks/execute.py"
    ours, theirs = _outputs(fresh), _outputs(committed)
    assert sum(len(figures) for _, _, figures in ours) == 6
    assert [n for n, _, _ in theirs] == list(range(1, len(theirs) + 1)), "execution counts 1, 2, …"
    assert [(n, len(figures)) for n, _, figures in theirs] == [(n, len(figures)) for n, _, figures in ours]
    for (n, _, mine), (_, _, committed_figures) in zip(ours, theirs):
        for shape, committed_shape in zip(mine, committed_figures):
            # a tight bounding box follows the text's extents, which matplotlib releases measure a
            # pixel or two apart (3.8–3.10 against 3.11: 1051 against 1053 pixels): 1 % is that, and
            # far below what a missing panel, legend or colour bar changes (≥ 10 %)
            assert np.allclose(shape, committed_shape, rtol=0.01, atol=0), f"cell {n}: {shape} != {committed_shape}"
    for (n, mine, _), (_, committed_texts, _) in zip(ours, theirs):
        assert len(mine) == len(committed_texts), f"cell {n}: the committed outputs differ from a fresh execution"
        for (kind, text), (committed_kind, committed_text) in zip(mine, committed_texts):
            assert kind == committed_kind
            assert _same_printout(text, committed_text), \
                f"cell {n} differs from a fresh execution (run python notebooks/execute.py):\n{committed_text}\n{text}"
    assert set(committed["metadata"]) == {"jupytext", "kernelspec"}, "no run metadata in the committed notebook"


def _figure_dpi(output) -> float:
    from PIL import Image

    with Image.open(BytesIO(base64.b64decode(output["data"]["image/png"]))) as image:
        return float(image.info.get("dpi", (0, 0))[0])


@pytest.mark.slow
def test_figures_are_sharp_and_answers_come_after_the_predictions(unanswered):
    """Every figure is a PNG of at least 120 dpi (its text at least 8 pt: teaching.show checks it before
    display), and no figure appears between one exercise's check and a prediction's check: the figure
    that answers a prediction is shown by the check itself, after the student committed to a number."""
    _, _, fresh = unanswered
    figures = [(i, _figure_dpi(o)) for i, c in enumerate(fresh["cells"]) for o in c.get("outputs", [])
               if "image/png" in o.get("data", {})]
    assert len(figures) == 6 and min(dpi for _, dpi in figures) >= 120, figures
    checks = {}
    for i, cell in enumerate(fresh["cells"]):
        for output in cell.get("outputs", []):
            for name in EXERCISES:
                if f"EXERCISE {name}:" in "".join(output.get("text", "")):
                    checks[name] = i
    assert list(checks) == EXERCISES
    shown = [i for i, _ in figures]
    for name in PREDICTIONS:
        previous = max(i for other, i in checks.items() if i < checks[name])
        assert not [i for i in shown if previous < i < checks[name]], f"{name}: a figure answers it before its check"
        assert checks[name] in shown, f"{name}: its check shows the figure that answers it"


def test_the_notebook_links_the_headline_figure_and_reads_its_numbers():
    """The trade-off is described as the figures measure it: a link to the headline figure, and the
    per-level numbers printed from the committed per-instance table, not typed into the text."""
    text = NOTEBOOK.read_text()
    assert "](../figures/tradeoff.png)" in text and (ROOT / "figures" / "tradeoff.png").is_file()
    assert 'committed_table("best_warmup.csv")' in text and "../figures/best_warmup.csv" not in text


def test_the_committed_table_is_found_from_the_root_the_notebook_folder_and_anywhere_else(tmp_path):
    """The notebook reads figures/best_warmup.csv through committed_table: the same table from the
    repository root, from notebooks/, from an unrelated folder, and from a folder of one's own figure
    scripts without that table (then the package's copy or its checkout's)."""
    from linattn_theory.report.teaching import committed_table, committed_table_folders

    expected = pd.read_csv(ROOT / "figures" / "best_warmup.csv")
    own = tmp_path / "own"
    (own / "simulations").mkdir(parents=True)                   # figure scripts of one's own, no table
    for start in (ROOT, ROOT / "notebooks", tmp_path, own / "simulations"):
        pd.testing.assert_frame_equal(committed_table("best_warmup.csv", start=start), expected)
    assert committed_table_folders(own)[0] == own / "figures"
    other = tmp_path / "other_checkout"                          # another copy of the repository: its own table
    for folder in ("simulations", "figures", "notebooks"):
        (other / folder).mkdir(parents=True)
    expected.head(3).to_csv(other / "figures" / "best_warmup.csv", index=False)
    pd.testing.assert_frame_equal(committed_table("best_warmup.csv", start=other / "notebooks"), expected.head(3))
    with pytest.raises(FileNotFoundError, match=r"figures/nope.csv is in none of .*`linattn figures` makes it"):
        committed_table("nope.csv", start=tmp_path)


@pytest.mark.slow
def test_the_walk_through_runs_as_a_script_from_the_repository_root(tmp_path):
    """`python notebooks/bias_drift_tradeoff.py` from the root (it read ../figures/ relative to the
    working folder before): it runs to the end and prints the headline table's numbers."""
    env = dict(os.environ, MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "notebooks/bias_drift_tradeoff.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = pd.read_csv(ROOT / "figures" / "best_warmup.csv")
    for zeta, sub in measured.groupby("zeta_value"):
        assert f"ζ_V = {zeta:g}: FedFrozen at its best T0, against FedAvg at the same step (not tuned), wins " \
               f"(gain above 2 %) in {int((sub['gain'] > 0.02).sum())} of {len(sub)} instances" in proc.stdout
    _assert_theorems_hold(proc.stdout)


def test_exercise_4a_fails_without_the_weights_because_the_clients_differ_in_size():
    """Dropping the weights (every client's mean loss weighed 1/m) gives the right Φ_0 only when the
    clients hold as many samples: on the notebook's sizes (128, 64) the wrong answer is off, on equal
    sizes it would pass."""
    import importlib.util

    from linattn_theory import ClientDataset, FederatedDataset, planted_kernel_clients, profile_objective

    def load(path):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    right, wrong = load(SOLUTIONS).profile_by_least_squares, load(WRONG).profile_by_least_squares
    drawn = planted_kernel_clients(num_clients=2, samples_per_client=128, tokens=8, dim=6, rank=2, outputs=2,
                                   zeta_value=2.0, zeta_covariate=0.2, noise=0.1, seed=0)
    K = drawn.truth["kernel"][0] + 0.3 * np.eye(6)
    for sizes, weights_matter in (((128, 64), True), ((128, 128), False)):
        kept = tuple(ClientDataset(*(a[:N] for a in client)) for client, N in zip(drawn, sizes))
        clients = FederatedDataset(kept, np.array(sizes) / sum(sizes))
        truth = profile_objective(K, clients, 0.0)[0]
        assert right(K, clients) == pytest.approx(truth, rel=1e-10)
        assert (abs(wrong(K, clients) - truth) > 1e-6 * truth) == weights_matter, sizes
    assert re.search(r"SAMPLES = .*\(128, 64\)", NOTEBOOK.read_text()), "the notebook's clients differ in size"




@pytest.mark.slow
def test_solutions_pass_every_exercise(tmp_path):
    status, output, _ = _execute(tmp_path, "--solutions", str(SOLUTIONS))
    assert status == 0, output[-3000:]
    assert _reports(output, "EXERCISE") == {name: "PASS" for name in EXERCISES}, output[-3000:]
    assert _reports(output, "TENDENCY") == {name: "holds" for name in TENDENCIES}, output[-3000:]
    _assert_theorems_hold(output)


@pytest.mark.slow
def test_wrong_answers_fail_and_the_notebook_still_runs_with_E_5(tmp_path):
    """Each check can fail; an answer that raises is a FAIL; a student's E = 5 aborts nothing."""
    status, output, _ = _execute(tmp_path, "--solutions", str(WRONG), "--replace", "ETA, E = 0.04, 20",
                                 "ETA, E = 0.04, 5")
    assert status == 0, output[-3000:]
    assert _reports(output, "EXERCISE") == {name: "FAIL" for name in EXERCISES}, output[-3000:]
    assert "EXERCISE 1 scale symmetry: FAIL  your answer raised TypeError" in output
    assert "with E = 5" in output
    _assert_theorems_hold(output)


def _cells(path):
    import jupytext

    return jupytext.read(path).cells


def test_ipynb_is_in_sync_with_the_script():
    script, paired = _cells(NOTEBOOK), _cells(PAIRED)
    assert [(c.cell_type, c.source.strip()) for c in script] == [(c.cell_type, c.source.strip()) for c in paired], \
        "the .py and the .ipynb differ: run python notebooks/execute.py"


def test_every_exercise_is_a_stub_with_a_solution_and_a_wrong_answer():
    """Each cell tagged `exercise` defines one function whose body only raises NotImplementedError."""
    stubs = []
    for cell in _cells(NOTEBOOK):
        if "exercise" not in cell.metadata.get("tags", []):
            continue
        (function,) = ast.parse(cell.source).body
        body = [node for node in function.body if not isinstance(node, ast.Expr)]     # skip the docstring
        assert len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc.id == "NotImplementedError", \
            f"{function.name} is not a stub"
        stubs.append(function.name)
    assert stubs == STUBS
    for path in (SOLUTIONS, WRONG):
        module = ast.parse(path.read_text())
        defined = [node.name for node in module.body if isinstance(node, ast.FunctionDef)]
        assert defined == STUBS, path


def _display_math(text: str) -> list[str]:
    return [" ".join(block.split()) for block in re.findall(r"\$\$(.*?)\$\$", text, flags=re.S)]


def test_displayed_formulas_are_those_of_docs_theory():
    theory = set(_display_math((ROOT / "docs" / "theory.md").read_text()))
    markdown = "\n".join(c.source for c in _cells(NOTEBOOK) if c.cell_type == "markdown")
    formulas = _display_math(markdown)
    assert len(formulas) >= 12
    assert not [f for f in formulas if f not in theory], "a displayed formula is not copied from docs/theory.md"


def test_the_reading_time_estimate_holds():
    """The header's estimate: ≈ 2,300 words of text (14 minutes) and 7 exercises with 9 answers."""
    cells = _cells(NOTEBOOK)
    words = sum(len(c.source.split()) for c in cells if c.cell_type == "markdown")
    assert 2200 <= words <= 2400, f"{words} words: update the reading-time estimate in the header"
    assert "≈ 2,300 words" in cells[0].source and "7 exercises (9 answers)" in cells[0].source
    assert len({name.split()[0].rstrip("ab") for name in EXERCISES}) == 7 and len(EXERCISES) == 9


# --- linattn_theory.report.teaching ----------------------------------------------------------------------------
def _stub():
    raise NotImplementedError


def test_check_exercise_reports_and_never_raises(capsys):
    check_exercise("x", _stub, lambda r: (True, ""))
    check_exercise("x", lambda: 1 / 0, lambda r: (True, ""))
    check_exercise("x", lambda: 2.0, lambda r: (r == 2.0, "two"))
    check_exercise("x", lambda: 3.0, lambda r: (r == 2.0, "three"))
    check_exercise("x", lambda: "word", lambda r: (float(r) == 2.0, ""))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["UNANSWERED", "FAIL", "PASS", "FAIL", "FAIL"]
    assert "ZeroDivisionError" in lines[1] and "could not be checked (ValueError" in lines[4]


def test_theorem_raises_and_tendency_prints(capsys):
    theorem("identity", True, "(0)")
    tendency("trend", False, "(n)")
    assert capsys.readouterr().out.splitlines() == ["THEOREM identity: holds  (0)",
                                                    "TENDENCY trend: does NOT hold on these numbers  (n)"]
    with pytest.raises(TheoremViolation, match="identity is violated"):
        theorem("identity", False)


def test_best_warmup_is_the_earliest_argmin():
    assert best_warmup(pd.Series([3.0, 1.0, 2.0, 1.0], index=[0, 1, 2, 3])) == 1
    assert best_warmup(np.array([2.0, 2.0, 1.5])) == 2
    with pytest.raises(ValueError, match="diverged"):
        best_warmup([1.0, np.nan])


def test_show_refuses_figures_too_small_to_read():
    """teaching.show checks every notebook figure before display: at least 120 dpi, no text under 8 pt."""
    import matplotlib.pyplot as plt

    from linattn_theory.report.teaching import check_legible, notebook_style

    notebook_style()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend()
    check_legible(fig)                              # the notebook's style: accepted
    ax.legend(fontsize=6)
    with pytest.raises(ValueError, match="below 8 pt"):
        check_legible(fig)
    ax.legend()
    fig.set_dpi(80)
    with pytest.raises(ValueError, match="80 dpi"):
        check_legible(fig)
    plt.close(fig)


def test_the_teach_extra_installs_what_executing_the_notebook_needs():
    """Every distribution the notebook and notebooks/execute.py import is the package's own dependency,
    in the `teach` extra, or required by one of the extra's (e.g. nbformat by jupytext)."""
    import importlib.metadata as metadata
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = lambda text: Requirement(text).name.lower().replace("_", "-")          # noqa: E731
    teach = {name(r) for r in project["optional-dependencies"]["teach"]}
    covered = {name(r) for r in project["dependencies"]} | teach
    for dist in teach:
        covered |= {name(r) for r in metadata.requires(dist) or [] if "extra ==" not in r}
    modules = set()
    for path in (NOTEBOOK, EXECUTE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    owners = metadata.packages_distributions()
    third_party = {m for m in modules if m not in sys.stdlib_module_names and m != "linattn_theory"}
    needed = {name(owners[m][0]) for m in third_party}
    assert {"jupytext", "ipython"} <= needed                 # what execute.py runs the cells with
    assert needed <= covered, f"not installed by [teach]: {sorted(needed - covered)}"
