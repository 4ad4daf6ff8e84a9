"""`linattn figures --quick` renders every figure from data; the figure scripts also run on their own."""

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from linattn_theory.cli import main
from linattn_theory.figures import discover

ROOT = Path(__file__).resolve().parents[1]
#: the figures of issue 4 (docs/theory.md §4–6), by script name
EXPECTED = {"kernel_bias_drift", "tradeoff", "excess_risk_decomposition", "heatmaps",
            "loss_curves", "drift_scaling", "frozen_stage", "warmup_inexactness"}
#: every figure drawn in the shared style: issue 4's, the strategy comparison (issue 5), static softmax
#: heads and the digits data set (issue 12; digits needs the optional scikit-learn)
STYLED = EXPECTED | {"strategies", "static_heads", "tradeoff_attention"} | ({"digits"} if find_spec("sklearn") else set())
#: the CSV of the plotted numbers where NAME.csv is another table (strategies.csv: issue 5's summary)
PLOT_DATA = {"strategies": "strategies_plot"}


@pytest.fixture(scope="module")
def quick_figures(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    assert main(["figures", "--quick", "--out", str(out), "--root", str(ROOT), "--executor", "serial",
                 "--quiet"]) == 0
    return out


def test_every_issue_figure_has_a_script_and_a_config():
    scripts = discover(ROOT)
    assert STYLED <= set(scripts)
    for name in STYLED:
        source = scripts[name].read_text()
        assert "docs/theory.md §" in source, f"{name}: the docstring must cite the claim it shows"
        assert "simulations/configs/" in source
        assert "plotting.figure(" in source and "plotting.save_figure(" in source, \
            f"{name}: draw and save with linattn_theory.plotting (the shared style)"


@pytest.mark.parametrize("name", sorted(STYLED))
def test_quick_figure_is_a_valid_image_drawn_from_data(quick_figures, name):
    png, pdf = (quick_figures / f"{name}.{ext}" for ext in ("png", "pdf"))
    csv = quick_figures / f"{PLOT_DATA.get(name, name)}.csv"
    assert png.is_file() and pdf.is_file() and csv.is_file()
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 5_000
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=float)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 300
    assert pixels.std() > 10, "the image is (nearly) constant"
    coloured = np.mean(np.ptp(pixels, axis=2) > 40)       # pixels that are not grey: data in colour
    assert coloured > 0.002, f"{name}: almost no coloured pixels, so no data was drawn"
    data = pd.read_csv(csv)
    numeric = data.select_dtypes(include=[np.number])
    assert len(data) >= 2 and not numeric.empty
    assert np.isfinite(numeric.to_numpy(dtype=float)).all()
    assert (numeric.nunique() > 1).any(), f"{name}: the plotted data is constant"


def test_no_temporary_files_are_left(quick_figures):
    assert not [p for p in quick_figures.rglob("*") if p.name.endswith(".tmp")]


def test_figures_cli_lists_and_rejects_unknown_names(tmp_path, capsys):
    assert main(["figures", "--list", "--root", str(ROOT)]) == 0
    listed = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert EXPECTED <= listed
    assert main(["figures", "--only", "no_such_figure", "--root", str(ROOT), "--out", str(tmp_path / "f")]) == 2
    assert "no_such_figure" in capsys.readouterr().err
    assert main(["figures", "--root", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    assert not (tmp_path / "f").exists()


def test_a_figure_script_runs_on_its_own(tmp_path):
    env = {**os.environ, "PYTHONPATH": "", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(ROOT / "simulations" / "heatmaps.py"), "--quick", "--out",
                           str(tmp_path), "--executor", "serial", "--quiet"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "heatmaps.png").is_file() and (tmp_path / "heatmaps.csv").is_file()
