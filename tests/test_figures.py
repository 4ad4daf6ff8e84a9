"""`linattn figures --quick` renders every figure from data; the figure scripts also run on their own."""

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from linattn_theory.report import plotting
from linattn_theory.cli.commands import main
from linattn_theory.report.figures import discover

ROOT = Path(__file__).resolve().parents[1]
#: the figures of issue 4 (docs/theory.md §4–6), by script name
EXPECTED = {"kernel_bias_drift", "tradeoff", "excess_risk_decomposition", "heatmaps",
            "loss_curves", "drift_scaling", "frozen_stage", "warmup_inexactness"}
#: every figure drawn in the shared style: issue 4's, the strategy comparison (issue 5), issue 11's
#: per-instance best warm-up and static heads, and issue 12's softmax figures (digits needs the
#: optional scikit-learn)
STYLED = (EXPECTED | {"strategies", "best_warmup", "static_heads", "softmax_static_heads", "tradeoff_attention",
                      "phase_diagram", "phase_diagram_arms"}
          | ({"digits", "digits_phase"} if find_spec("sklearn") else set()))
#: the CSV of the plotted numbers where NAME.csv is another table (strategies.csv: issue 5's summary)
PLOT_DATA = {"strategies": "strategies_plot", "phase_diagram": "phase_diagram_plot",
             "phase_diagram_arms": "phase_diagram_arms_plot", "digits_phase": "digits_phase_plot"}


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
            f"{name}: draw and save with linattn_theory.report.plotting (the shared style)"


@pytest.mark.slow
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
        assert image.text.get("Description") == plotting.QUICK_MARK, "a quick figure must say so"
    assert pixels.shape[0] > 300
    dpi = 300
    assert pixels.shape[1] in (plotting.COLUMN_WIDTH * dpi, plotting.FULL_WIDTH * dpi), \
        f"{name}: {pixels.shape[1] / dpi} in wide; print figures are 3.5 in or 7 in wide"
    assert plotting.QUICK_MARK.encode() in pdf.read_bytes() and b"CreationDate" not in pdf.read_bytes()
    assert pixels.std() > 10, "the image is (nearly) constant"
    coloured = np.mean(np.ptp(pixels, axis=2) > 40)       # pixels that are not grey: data in colour
    assert coloured > 0.002, f"{name}: almost no coloured pixels, so no data was drawn"
    data = pd.read_csv(csv)
    numeric = data.select_dtypes(include=[np.number])
    assert len(data) >= 2 and not numeric.empty
    assert np.isfinite(numeric.to_numpy(dtype=float)).all()
    assert (numeric.nunique() > 1).any(), f"{name}: the plotted data is constant"


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_figure_script_runs_on_its_own(tmp_path):
    env = {**os.environ, "PYTHONPATH": "", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(ROOT / "simulations" / "heatmaps.py"), "--quick", "--out",
                           str(tmp_path), "--executor", "serial", "--quiet"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "heatmaps.png").is_file() and (tmp_path / "heatmaps.csv").is_file()


#: cheap scripts, with and without sweeps, redrawn one at a time in the test's own process
RERUN = ("heatmaps", "kernel_bias_drift", "tradeoff", "warmup_inexactness")


@pytest.mark.slow
def test_figures_are_byte_identical_on_a_rerun_one_at_a_time(quick_figures, tmp_path):
    """Fixed metadata (no creation date): the same figure written again gives the same bytes — also
    when the set was made two scripts at a time in processes of their own (the fixture, ``--jobs``'
    default) and the rerun makes them one after the other in this process (``--jobs 1``)."""
    only = [arg for name in RERUN for arg in ("--only", name)]
    assert main(["figures", "--quick", *only, "--out", str(tmp_path), "--root", str(ROOT),
                 "--executor", "serial", "--jobs", "1", "--quiet"]) == 0
    written = sorted(path.name for path in tmp_path.iterdir() if path.is_file())
    assert {f"{name}.{ext}" for name in RERUN for ext in ("png", "pdf", "csv")} <= set(written)
    for name in written:
        assert (tmp_path / name).read_bytes() == (quick_figures / name).read_bytes(), name


def _toy_script(root, name: str, parameters: str, text: str) -> None:
    """``root/simulations/<name>.py``: a figure script whose ``make(out_dir, <parameters>)`` writes the
    expression ``text`` to ``<name>.txt`` (a leading comment line: :func:`discover` looks for ``def make``
    after one)."""
    (root / "simulations").mkdir(exist_ok=True)
    (root / "simulations" / f"{name}.py").write_text(
        f"# a toy figure\nimport os\nfrom pathlib import Path\n\n\ndef make(out_dir, {parameters}):\n"
        f"    path = Path(out_dir) / '{name}.txt'\n    path.parent.mkdir(parents=True, exist_ok=True)\n"
        f"    path.write_text({text})\n    return [path]\n")


def test_figure_scripts_side_by_side_keep_their_order_and_stop_at_a_failure(tmp_path):
    """``jobs=2``: the scripts run in processes of their own; the result is in the scripts' order,
    and a script's error reaches the caller with its message at once: the script running beside it
    (a minute's sleep before it writes) is stopped, not waited for."""
    from linattn_theory.report.figures import make_figures

    for name in ("b_second", "a_first"):
        _toy_script(tmp_path, name, "quick=False", "str(os.getpid())")
    made = make_figures(discover(tmp_path), tmp_path / "out", executor="serial", jobs=2)
    assert list(made) == ["a_first", "b_second"]
    pids = {(tmp_path / "out" / f"{name}.txt").read_text() for name in made}
    assert str(os.getpid()) not in pids                     # each ran in a worker process
    (tmp_path / "simulations" / "c_broken.py").write_text(
        "# broken\ndef make(out_dir, quick=False):\n    raise ValueError('the broken script')\n")
    _toy_script(tmp_path, "d_slow", "quick=False", "__import__('time').sleep(60) or 'finished'")
    scripts = {name: path for name, path in discover(tmp_path).items() if name in ("c_broken", "d_slow")}
    with pytest.raises(ValueError, match="the broken script"):
        make_figures(scripts, tmp_path / "out", executor="serial", jobs=2)
    assert not (tmp_path / "out" / "d_slow.txt").exists()       # stopped, not waited for
    with pytest.raises(Exception, match="jobs = 0"):
        make_figures(discover(tmp_path), tmp_path / "out", jobs=0)


@pytest.mark.parametrize("cores, expected", [(2, "serial 1"), (4, "processes 2"), (1, "serial 1")])
def test_figure_scripts_side_by_side_share_the_cores(tmp_path, monkeypatch, cores, expected):
    """Two scripts at a time with the default workers: each gets half the usable cores, and a share of
    one core runs its sweeps in its own process (no pool of one worker beside it)."""
    from linattn_theory.report.figures import make_figures
    from linattn_theory.sim import limits

    monkeypatch.setattr(limits, "usable_cores", lambda: cores)
    for name in ("one", "two"):
        _toy_script(tmp_path, name, "executor='processes', workers=None", "f'{executor} {workers}'")
    make_figures(discover(tmp_path), tmp_path / "out", jobs=2)
    assert {(tmp_path / "out" / f"{name}.txt").read_text() for name in ("one", "two")} == {expected}
    make_figures(discover(tmp_path), tmp_path / "out", jobs=2, workers=3)       # explicit workers are kept
    assert (tmp_path / "out" / "one.txt").read_text() == "processes 3"


@pytest.mark.parametrize("cores, expected", [(1, {"1 1"}), (2, {"1 1"}), (4, {"2 1", "2 2"})])
def test_figure_scripts_side_by_side_limit_their_threads(tmp_path, monkeypatch, cores, expected):
    """Two scripts at a time: in its process, BLAS and the fused engine use the script's share of the
    cores (one of 1 or 2, two of 4; BLAS at most what it has here), not every core beside the other
    script; a sweep's worker processes keep to their own share."""
    from linattn_theory.report.figures import make_figures
    from linattn_theory.sim import limits
    from linattn_theory.sim.sweep import executors

    monkeypatch.setattr(limits, "usable_cores", lambda: cores)
    threads = ("f\"{__import__('linattn_theory.core.fused', fromlist=['_']).default_threads()} \""
               "f\"{max(i['num_threads'] for i in __import__('threadpoolctl').threadpool_info() "
               "if i['user_api'] == 'blas')}\"")
    for name in ("one", "two"):
        _toy_script(tmp_path, name, "quick=False", threads)
    make_figures(discover(tmp_path), tmp_path / "out", jobs=2)
    assert {(tmp_path / "out" / f"{name}.txt").read_text() for name in ("one", "two")} <= expected

    from threadpoolctl import threadpool_info, threadpool_limits

    from linattn_theory.core import fused
    before = fused._threads
    monkeypatch.setattr(executors.threading, "Thread", lambda **kwargs: type("T", (), {"start": lambda self: None})())
    monkeypatch.setattr(executors.signal, "signal", lambda *args: None)
    try:
        with threadpool_limits(limits=None):               # restores BLAS afterwards
            executors._worker_init(os.getpid(), 1)
            assert fused.default_threads() == 1
            assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
    finally:
        fused.set_threads(before)


def test_figure_scripts_side_by_side_share_a_sweep(tmp_path):
    """Two scripts reading one sweep, started together: the second waits for the first's sweep
    (no "another sweep is writing" refusal) and both see every run of it, computed once."""
    from linattn_theory.report.figures import make_figures

    (tmp_path / "simulations" / "configs").mkdir(parents=True)
    (tmp_path / "simulations" / "configs" / "shared.toml").write_text(
        '[federated]\nrounds = 30\n[grid]\n"federated.warmup_rounds" = [0, 10, 20, 30]\nseed = [0, 1, 2]\n')
    for name in ("first", "second"):
        (tmp_path / "simulations" / f"{name}.py").write_text(
            "# reads the shared sweep\nfrom pathlib import Path\n\n\ndef make(out_dir, quick=False):\n"
            "    from linattn_theory.report.figures import figure_sweep\n"
            "    config = Path(__file__).parent / 'configs' / 'shared.toml'\n"
            "    _, results, _ = figure_sweep(config, out_dir, executor='serial')\n"
            f"    path = Path(out_dir) / '{name}.csv'\n"
            "    results.sort_values('run_id').to_csv(path, index=False)\n    return [path]\n")
    out = tmp_path / "out"
    made = make_figures(discover(tmp_path), out, executor="serial", jobs=2)
    assert list(made) == ["first", "second"]
    first, second = (pd.read_csv(out / f"{name}.csv") for name in made)
    assert len(first) == 12 and first.equals(second)
    assert len(list((out / "_sweeps" / "shared" / "runs").iterdir())) == 12


def test_figure_jobs_default_and_the_gpu_backend(capsys, tmp_path):
    from linattn_theory.cli.commands import FIGURE_JOBS_DEFAULT, figure_jobs
    from linattn_theory.report.figures import recorded_seconds
    from linattn_theory.sim.limits import usable_cores

    quick, full = recorded_seconds(ROOT, quick=True), recorded_seconds(ROOT, quick=False)
    assert set(quick) == set(full) == set(discover(ROOT))       # the order's times: every script, per mode
    assert quick["digits_phase"] < full["digits_phase"] and recorded_seconds(tmp_path, quick=True) == {}

    assert figure_jobs(None, None) == max(1, min(FIGURE_JOBS_DEFAULT, usable_cores()))
    assert figure_jobs(3, "numpy") == 3
    assert figure_jobs(3, "cupy") == 1 and "--jobs 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["figures", "--jobs", "0", "--list"])
    assert refused.value.code == 2 and "--jobs: '0': expected a finite number >= 1" in capsys.readouterr().err


def test_print_ready_check_rejects_wide_figures_and_small_text():
    fig, ax = plotting.figure(1, width="column")
    ax.plot([0, 1], [0, 1])
    plotting.check_print_ready(fig)                      # 3.5 in, 7-8 pt text: accepted
    ax.text(0.5, 0.5, "tiny", fontsize=6)
    with pytest.raises(ValueError, match="below 7 pt"):
        plotting.check_print_ready(fig)
    fig.set_size_inches(9, 3)
    with pytest.raises(ValueError, match="9.0 in wide"):
        plotting.check_print_ready(fig)
    with pytest.raises(ValueError, match="expected 'full' or 'column'"):
        plotting.figure(1, width="wide")


def test_a_saved_figure_is_rendered_once_per_format(tmp_path, monkeypatch):
    """The print-ready check lays the figure out without rendering it (matplotlib's layout passes run
    with drawing disabled): saving PNG and PDF renders the figure twice, once per format."""
    from matplotlib.backends.backend_mixed import MixedModeRenderer
    from matplotlib.figure import Figure
    renders = []
    draw = Figure.draw

    def counting(figure, renderer):
        inner = renderer._renderer if isinstance(renderer, MixedModeRenderer) else renderer   # the PDF's wraps one
        if "draw_path" not in vars(inner):          # matplotlib disables drawing by instance attributes
            renders.append(type(renderer).__name__)
        return draw(figure, renderer)
    monkeypatch.setattr(Figure, "draw", counting)
    fig, ax = plotting.figure(1, width="column")
    ax.plot([0, 1], [0, 1])
    paths = plotting.save_figure(fig, "once", tmp_path, pd.DataFrame({"x": [0, 1]}))
    assert len(renders) == 2 and {p.suffix for p in paths} == {".csv", ".png", ".pdf"}


@pytest.mark.slow
def test_heatmaps_are_drawn_as_seaborn_draws_them_without_rasterising_the_figure_per_panel(monkeypatch):
    """plotting.heatmap gives the bytes seaborn.heatmap gives (PNG and PDF of a figure of three panels
    with colour bars and tick labels), while rendering nothing before the save (seaborn renders the
    whole figure once per panel, for its tick-label overlap test)."""
    import io

    import seaborn as sns
    from matplotlib.backends.backend_mixed import MixedModeRenderer
    from matplotlib.figure import Figure

    grid = pd.DataFrame(np.arange(12.0).reshape(3, 4), index=["a", "bb", "ccc"], columns=[0.25, 0.5, 1.0, 2.0])

    def draw(heatmap):
        fig, axes = plotting.figure(3, height=2.0)
        for k, ax in enumerate(axes):
            heatmap(ax, grid * (k + 1))
        renders = len(calls)
        images = []
        for fmt in ("png", "pdf"):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, metadata={"Creator": "test", **({"CreationDate": None} if fmt == "pdf" else {})})
            images.append(buf.getvalue())
        plt.close(fig)
        return renders, images

    calls = []
    render = Figure.draw

    def counting(figure, renderer):          # a render: drawing not disabled (as the test above counts)
        inner = renderer._renderer if isinstance(renderer, MixedModeRenderer) else renderer
        if "draw_path" not in vars(inner):
            calls.append(type(renderer).__name__)
        return render(figure, renderer)
    monkeypatch.setattr(Figure, "draw", counting)
    ours = draw(lambda ax, data: plotting.heatmap(ax, data, annot=True, fmt="g", cbar=True))
    calls.clear()
    theirs = draw(lambda ax, data: sns.heatmap(data, ax=ax, annot=True, fmt="g", cbar=True))
    assert ours[0] == 0 and theirs[0] == 3
    assert ours[1] == theirs[1]



@pytest.mark.slow
def test_chaos_repeats_shared_among_processes_store_the_numbers_of_one(tmp_path, monkeypatch):
    """fedavg_chaos with its repeats split among two worker processes (chaos_chunks, round-robin) stores,
    run by run, exactly the records it stores running them all in this process."""
    import json
    import shutil

    from linattn_theory.report import sweep_analysis
    from linattn_theory.report.figures import figure_sweep
    from linattn_theory.sim.config import config_from_dict
    (tmp_path / "demo.toml").write_text('[federated]\nrounds = 6\n[grid]\n'
                                        '"federated.warmup_rounds" = [0, 6]\nseed = [0, 1, 2]\n')
    _, results, folder = figure_sweep(tmp_path / "demo.toml", tmp_path, executor="serial")
    serial = sweep_analysis.fedavg_chaos(folder, results, ["seed"])
    stored = {p.name: json.loads(p.read_text()) for p in (folder / "_chaos").glob("*.json")}
    assert len(stored) == 3 and len({r["amplification"] for r in stored.values()}) == 3   # a mix-up would show
    shutil.rmtree(folder / "_chaos")
    monkeypatch.setattr(sweep_analysis, "CHAOS_PARALLEL_STEPS", 0)
    fedavg = results[results["T0"] == results["federated.rounds"]]
    configs = [config_from_dict({})] * 3
    assert [len(c) for c in sweep_analysis.chaos_chunks(list(fedavg["run_id"]), configs, 2)] == [2, 1]
    shared = sweep_analysis.fedavg_chaos(folder, results, ["seed"], workers=2)
    pd.testing.assert_frame_equal(shared, serial, check_exact=True)
    assert {p.name: json.loads(p.read_text()) for p in (folder / "_chaos").glob("*.json")} == stored
    with pytest.raises(ValueError, match="2 run ids for 1 configs"):
        sweep_analysis.chaos_chunks(["a", "b"], [None], 2)

@pytest.mark.slow
def test_the_style_is_seaborn_s_theme_without_importing_seaborn():
    """``style.PAPER_TICKS`` is every rcParam ``seaborn.set_theme`` sets with the figures' options (but the
    default colour map, which no figure uses; ``apply_style`` puts the print sizes on top of it, as
    ``set_theme(rc=…)`` did), and importing the plotting module does not import seaborn."""
    import matplotlib as mpl
    import seaborn as sns

    from linattn_theory.report.style import PAPER_TICKS
    with mpl.rc_context():
        mpl.rcdefaults()
        sns.set_theme(context="paper", style="ticks", palette="colorblind")
        theirs = dict(mpl.rcParams)
        mpl.rcdefaults()
        mpl.rcParams.update(PAPER_TICKS)
        ours = dict(mpl.rcParams)
    differ = sorted(k for k in theirs if k != "image.cmap" and ours[k] != theirs[k])
    assert not differ, differ
    assert plotting.palette(12) == [tuple(c) for c in sns.color_palette("colorblind")] + \
        [tuple(c) for c in sns.color_palette("colorblind")[:2]]
    code = "import sys, linattn_theory.report.plotting; print('seaborn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False"


def test_best_warmup_is_the_smallest_argmin_and_divergence_counts_as_infinite():
    from linattn_theory.report.sweep_analysis import best_warmup, gain_summary, paired_ratios, quartiles
    table = pd.DataFrame({"seed": [0] * 4 + [1] * 4, "T0": [0, 2, 4, 6] * 2, "federated.rounds": 6,
                          "excess_risk": [3.0, 1.0, 1.0, 2.0, np.nan, 5.0, 4.0, 4.0],
                          "diverged": [False] * 4 + [True, False, False, False]})
    best = best_warmup(table, ["seed"]).set_index("seed")
    assert best.loc[0, "best_T0"] == 2 and best.loc[0, "gain"] == pytest.approx(0.5)    # tie 2/4: smallest
    assert best.loc[1, "best_T0"] == 4 and best.loc[1, "gain"] == 0.0                   # tie 4/6 = T
    assert best.loc[1, "diverged_runs"] == 1
    summary = gain_summary(best.reset_index().assign(level=1), "level").iloc[0]
    assert (summary["instances"], summary["beats"]) == (2, 1)
    ratios = paired_ratios(table, ["seed"])
    assert ratios.loc[ratios["seed"] == 0, "ratio"].tolist() == [1.5, 0.5, 0.5, 1.0]
    assert len(ratios[ratios["seed"] == 1]) == 3                                         # the diverged run is left out
    assert ratios.attrs["dropped"]["count"] == 1 and ratios.attrs["dropped"]["diverged"] == 1
    no_fedavg = paired_ratios(table.assign(diverged=[False] * 3 + [True] + [False] * 4), ["seed"])
    assert (no_fedavg.attrs["dropped"]["count"], no_fedavg.attrs["dropped"]["no_fedavg"]) == (4, 3)   # all of seed 0
    assert quartiles([1.0, np.nan, 3.0, np.inf, 2.0]) == {"median": 2.0, "q25": 1.5, "q75": 2.5, "count": 3,
                                                          "dropped": 2}


# --- one visual language (issue 21) ---------------------------------------------------------------------
def _load_script(name):
    from linattn_theory.report.figures import _load
    return _load(name, ROOT / "simulations" / f"{name}.py")


def _rgb(color):
    from matplotlib.colors import to_rgb
    return np.array(to_rgb(color))


def test_every_method_has_one_style_and_no_panel_repeats_a_colour():
    """Colour by meaning: each strategy and static arm has its own entry (name, colour, marker); within a
    panel of the strategies figure no two methods share a colour; markers tell every method apart."""
    from linattn_theory.sim.strategies import STRATEGIES
    arms = _load_script("strategies").STATIC_ARMS
    methods = set(STRATEGIES) | set(arms)
    assert methods <= set(plotting.METHODS), methods - set(plotting.METHODS)
    paneled = {name for members in plotting.METHOD_PANELS.values() for name in members}
    assert methods == paneled, "every method is drawn in a panel of the strategies figure, and only methods"
    for title, members in plotting.METHOD_PANELS.items():
        colours = [plotting.METHODS[name].color for name in members]
        assert len(set(colours)) == len(colours), f"{title}: two methods share a colour"
    markers = [plotting.METHODS[name].marker for name in methods]
    assert len(set(markers)) == len(markers), "two methods share a marker"
    assert plotting.STRATEGY_NAMES == {name: style.label for name, style in plotting.METHODS.items()}


def test_heterogeneity_levels_have_fixed_colours_apart_from_the_methods():
    """ζ_V maps to one colour whatever the figure, darker as the clients grow more heterogeneous, and
    no level looks like a method or an attention type (the smallest RGB distance is a third of the cube's
    side)."""
    levels = [0.0, 0.25, 0.5, 1.0, 2.0, 3.0]
    colours = [plotting.heterogeneity_color(z) for z in levels]
    assert colours == [plotting.heterogeneity_color(z) for z in levels]
    lightness = [float(_rgb(c) @ [0.299, 0.587, 0.114]) for c in colours]
    assert all(np.diff(lightness) < 0), lightness
    others = [s.color for s in plotting.METHODS.values()] + [s.color for s in plotting.ATTENTION.values()]
    nearest = min(np.linalg.norm(_rgb(a) - _rgb(b)) for a in colours for b in others)
    assert nearest > 0.3, nearest
    attention = [_rgb(s.color) for s in plotting.ATTENTION.values()]
    assert np.linalg.norm(attention[0] - attention[1]) > 0.3
    assert plotting.heterogeneity_label(3.0) == r"$\zeta_V = 3$"


def test_no_figure_colours_by_position():
    """The figure scripts and the notebook take every colour from a meaning (plotting's tables), never
    the n-th colour of a palette or matplotlib's colour cycle ('C0')."""
    import re
    sources = [*sorted((ROOT / "simulations").glob("*.py")), ROOT / "notebooks" / "bias_drift_tradeoff.py"]
    for path in sources:
        text = path.read_text()
        assert "palette(" not in text and not re.search(r"""color=f?["']C\{?\d?""", text), path.name


@pytest.mark.slow
def test_figures_command_finds_the_checkout_from_any_folder(tmp_path, monkeypatch, capsys):
    """`linattn figures` without --root works from a subfolder of the checkout and, through the installed
    package, from outside it; the default output folder is the checkout's figures/."""
    from linattn_theory.report.figures import find_root
    monkeypatch.chdir(ROOT / "docs")
    assert find_root() == ROOT
    assert main(["figures", "--list"]) == 0
    assert "tradeoff\t" in capsys.readouterr().out
    assert main(["figures", "--quick", "--only", "warmup_inexactness", "--out", str(tmp_path / "f"),
                 "--executor", "serial", "--quiet"]) == 0
    assert (tmp_path / "f" / "warmup_inexactness.png").is_file()
    monkeypatch.chdir(tmp_path)
    assert find_root() == ROOT          # the editable install's checkout
    assert main(["figures", "--list"]) == 0


def test_select_instances_leaves_out_the_instances_whose_fedavg_diverged():
    """The one rule of every figure set: instance 1's FedAvg run (T0 = T = 4) diverged, so none of its
    runs, best warm-up or gain is used; instance 2 keeps its runs, and its diverged T0 = 2 counts as ∞."""
    from linattn_theory.report.sweep_analysis import gain_summary, select_instances
    table = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 1, 2, 2, 2], "T0": [0, 2, 4] * 3, "federated.rounds": 4,
                          "level": 1, "excess_risk": [3.0, 1.0, 2.0, 0.5, 0.7, np.nan, 2.0, np.nan, 1.5],
                          "diverged": [False] * 5 + [True, False, True, False]})
    runs, best, left_out = select_instances(table, ["level", "seed"])
    assert sorted(set(runs["seed"])) == [0, 2] and not runs["diverged"].any() and len(runs) == 5
    assert best["seed"].tolist() == [0, 2] and best["best_T0"].tolist() == [2, 4]
    assert best.loc[1, "diverged_runs"] == 1 and best.loc[1, "gain"] == 0.0
    assert left_out["seed"].tolist() == [1]
    summary = gain_summary(best, "level", left_out).iloc[0]
    assert (summary["instances"], summary["diverged_instances"], summary["beats"]) == (2, 1, 1)


def test_spearman_interval_resamples_instances_not_pairs():
    """ρ is scipy's Spearman; the interval contains it and is the same on a rerun; resampling whole
    instances (not pairs) makes the interval collapse when every instance holds the same pairs."""
    from scipy.stats import spearmanr

    from linattn_theory.report.sweep_analysis import spearman_interval
    rng = np.random.default_rng(3)
    x = rng.normal(size=60)
    y = x + rng.normal(size=60)
    many = spearman_interval(x, y, np.arange(60))
    assert many["rho"] == pytest.approx(spearmanr(x, y).statistic, rel=1e-12)
    assert many["low"] < many["rho"] < many["high"] and (many["instances"], many["pairs"]) == (60, 60)
    assert spearman_interval(x, y, np.arange(60)) == many                  # a fixed seed: the same interval
    same = spearman_interval(np.tile(x[:6], 5), np.tile(y[:6], 5), np.repeat(np.arange(5), 6))
    assert same["low"] == pytest.approx(same["rho"]) and same["high"] == pytest.approx(same["rho"])



def test_spearman_interval_is_the_one_resample_at_a_time_bootstrap_bit_for_bit():
    """Resamples of one length are ranked in one call; the interval is the bootstrap written one
    resample at a time (rankdata per resample, the same draws), bit for bit, with ties, a constant
    resample and instances of unequal sizes (the one-at-a-time path) alike (ranking along the
    wrong axis or another draw order fails this)."""
    from scipy.stats import rankdata

    from linattn_theory.report.sweep_analysis import spearman_interval

    def by_definition(x, y, instances, resamples, seed, level=0.95):
        groups = pd.factorize(np.asarray(instances))[0]
        members = [np.flatnonzero(groups == g) for g in range(groups.max() + 1)]
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(resamples):
            index = np.concatenate([members[g] for g in rng.integers(len(members), size=len(members))])
            a, b = rankdata(x[index]), rankdata(y[index])
            if np.ptp(a) == 0 or np.ptp(b) == 0:
                draws.append(np.nan)
                continue
            a, b = a - a.mean(), b - b.mean()
            draws.append(float(a @ b / np.sqrt((a @ a) * (b @ b))))
        return [float(v) for v in np.nanquantile(draws, [(1 - level) / 2, (1 + level) / 2])]

    rng = np.random.default_rng(11)
    for sizes in ([4] * 12, [3] * 7, [2, 3, 4, 2, 5, 3]):
        instances = np.repeat(np.arange(len(sizes)), sizes)
        x = np.round(rng.normal(size=len(instances)), 1)                  # ties
        y = x + rng.normal(size=len(instances))
        y[:sizes[0]] = 0.0                                                # a resample of instance 0 alone is constant in y
        found = spearman_interval(x, y, instances, resamples=300, seed=5)
        assert [found["low"], found["high"]] == by_definition(x, y, instances, 300, 5)


def test_the_strategies_comparison_does_not_depend_on_its_workers():
    """strategies.py runs its (level, seed) groups in worker processes: the tables are assembled in
    the groups' order and equal the serial ones exactly (here 2 levels × 2 seeds, 4 strategies, 6 rounds)."""
    strategies = _load_script("strategies")
    settings = strategies.load_settings(strategies.CONFIG, quick=True)
    settings["levels"], settings["seeds"] = settings["levels"][:2], [0, 1]
    settings["strategies"] = ["fedavg", "fedfrozen", "fedfrozen_adaptive", "static_saf"]
    settings["centralised_steps"] = 20
    settings["configs"] = {key: config.with_updates({"federated.rounds": 6, "federated.warmup_rounds": 3})
                           for key, config in settings["configs"].items()}
    serial, parallel = (strategies.run_grid(settings, progress=False, workers=w) for w in (1, 2))
    for a, b in zip(serial, parallel):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert len(serial[0]) == 16 and serial[0]["seed"].tolist()[:4] == [0] * 4


def test_the_strategies_comparison_runs_each_run_as_it_runs_alone():
    """strategies.py runs a share of (level, seed) groups as ensembles (one ``simulate_many`` call):
    every run's final loss, drift and the centralised reference equal, bit for bit, those of the run
    alone (``simulate``, a static arm with its frozen features; ``centralised_reference``)."""
    strategies = _load_script("strategies")
    settings = strategies.load_settings(strategies.CONFIG, quick=True)
    settings["levels"], settings["seeds"] = settings["levels"][:2], [0, 1]
    settings["strategies"] = ["fedavg", "fedfrozen", "fedfrozen_adaptive", "static_saf", "static_uniform"]
    settings["centralised_steps"] = 15
    settings["configs"] = {key: config.with_updates({"federated.rounds": 6, "federated.warmup_rounds": 3})
                           for key, config in settings["configs"].items()}
    runs, _ = strategies.run_grid(settings, progress=False)
    for level in settings["levels"]:
        for seed in settings["seeds"]:
            clients = strategies.clients_from_config(settings["configs"][level, "fedavg", seed])
            centralised = strategies.centralised_reference(settings["configs"][level, "fedavg", seed], clients, 15)
            for name in settings["strategies"]:
                alone = strategies.simulate(settings["configs"][level, name, seed], clients,
                                            frozen_features=strategies._static_features(name, clients)).table
                row = runs[(runs["level"] == level) & (runs["seed"] == seed) & (runs["strategy"] == name)].iloc[0]
                assert row["final_loss"] == alone["loss_regularized"].iloc[-1], (level, seed, name)
                assert row["value_drift"] == alone["drift_WV"].iloc[-1], (level, seed, name)
                assert row["centralised_reference"] == centralised


@pytest.mark.slow
def test_loading_a_figure_script_imports_no_seaborn_and_leaves_matplotlib_headless():
    """Every figure script imports seaborn (which imports pyplot, and scipy.stats: about a second) only
    where it draws, so that pyplot is first imported by report.plotting, which chooses the off-screen
    backend before it: loading every script, in a fresh process with a display backend asked for,
    leaves matplotlib on Agg and seaborn unimported."""
    code = ("import importlib.util, sys, pathlib\n"
            "for path in sorted(pathlib.Path('simulations').glob('*.py')):\n"
            "    spec = importlib.util.spec_from_file_location('figure_' + path.stem, path)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "import matplotlib\n"
            "print(matplotlib.get_backend(), 'seaborn' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "TkAgg"})
    assert out.stdout.split("\n")[-2].strip() == "Agg False", out.stdout + out.stderr
