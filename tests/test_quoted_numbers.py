"""Every number README.md and figures/README.md quote about the figures is recomputed from the committed CSVs."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory.report.figure_numbers import QUOTED_FILES, _BLOCK, blocks, figure_times, headline_numbers
from linattn_theory.report.figures import discover

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
#: where each generated block must appear
EXPECTED_BLOCKS = {"README.md": {"headline-caption", "tradeoff-caption", "figure-times"},
                   "figures/README.md": {"headline", "heatmaps", "drift-scaling", "static-heads",
                                         "softmax-static-heads", "tradeoff-attention", "digits",
                                         "figure-times-table", "phase-diagram", "phase-diagram-arms",
                                         "digits-phase"},
                   "docs/theory.md": {"phase-diagram", "phase-diagram-arms", "digits-phase"}}


@pytest.mark.parametrize("name", QUOTED_FILES)
def test_quoted_blocks_equal_what_the_committed_csvs_give(name):
    text = (ROOT / name).read_text()
    found = {m.group("name"): m.group("body") for m in _BLOCK.finditer(text)}
    assert EXPECTED_BLOCKS[name] <= set(found), f"{name}: missing quoted blocks"
    generated = blocks(FIGURES)
    for block, body in found.items():
        assert body == generated[block], (f"{name}: block {block!r} is stale; run "
                                          "python -m linattn_theory.report.figure_numbers after regenerating figures")


def test_headline_summary_recomputed_independently_from_the_instances():
    """tradeoff_gain.csv (the headline's right panel) agrees with a plain recomputation from the
    per-instance table best_warmup.csv, and both agree with the quoted numbers."""
    best = pd.read_csv(FIGURES / "best_warmup.csv")
    plotted = pd.read_csv(FIGURES / "tradeoff_gain.csv").set_index("zeta_value")
    quoted = headline_numbers(FIGURES).set_index("zeta_value")
    for level, sub in best.groupby("zeta_value"):
        gain = np.sort(sub["gain"].to_numpy())
        assert plotted.loc[level, "instances"] == quoted.loc[level, "instances"] == len(gain)
        assert plotted.loc[level, "beats"] == quoted.loc[level, "beats"] == int(np.sum(gain > 0))
        assert plotted.loc[level, "gain_median"] == pytest.approx(np.median(gain), rel=1e-8)
        assert quoted.loc[level, "gain_median"] == pytest.approx(np.median(gain), rel=1e-8)
        assert quoted.loc[level, "best_T0_median"] == np.median(sub["best_T0"]) == plotted.loc[level, "best_T0_median"]
        assert plotted.loc[level, "best_T0_q25"] == np.quantile(sub["best_T0"], 0.25)
        assert (sub["gain"] >= 0).all() and (sub["best_T0"] <= sub["T"]).all()
    for level, row in plotted.iterrows():
        assert row["instances"] + row["diverged_instances"] >= 20, "the headline needs >= 20 instances per level"


def test_headline_ratios_are_paired_against_fedavg():
    """R(T)/R(T) = 1 in every instance, so the plotted median and quartiles of the ratio are 1 at T."""
    data = pd.read_csv(FIGURES / "tradeoff.csv")
    ratio = data[data["quantity"] == "ratio_to_fedavg"]
    at_T = ratio[ratio["T0"] == ratio["T0"].max()]
    np.testing.assert_allclose(at_T[["median", "q25", "q75"]].to_numpy(), 1.0, rtol=1e-12)


def test_quoted_percentages_parse_back_to_the_csv():
    """The gains quoted in figures/README.md, parsed from the text, are the CSV's medians."""
    text = (ROOT / "figures/README.md").read_text()
    block = text[text.index("<!-- BEGIN quoted: headline -->"):text.index("<!-- END quoted: headline -->")]
    quoted = [float(x) for x in re.findall(r"\| \*\*([0-9.]+) %\*\* \(", block)]
    numbers = headline_numbers(FIGURES)
    np.testing.assert_allclose(quoted, 100 * numbers["gain_median"].to_numpy(), atol=0.05)


@pytest.mark.parametrize("mode", ["full", "quick"])
def test_the_running_times_cover_every_figure_script(mode):
    """figures/timings.csv, which the quoted running times come from, has one row per figure script
    that `linattn figures` runs, in its order: a new, removed or renamed script makes it stale."""
    times = figure_times(FIGURES)
    rows = times[times["mode"] == mode]
    option = " --quick" if mode == "quick" else ""
    assert list(rows["figure"]) == list(discover(ROOT)), \
        f"figures/timings.csv ({mode}) is stale: run python benchmarks/figure_times.py{option}"
    assert (rows["seconds"] > 0).all() and (rows["sweep_runs"] >= 0).all()


# --- the same instances behind every best T0 (issue 21) ---------------------------------------------------
def _marked(name: str, group) -> pd.DataFrame:
    """The best warm-up a figure marks, one row per value of ``group`` (its CSV repeats it per plotted row)."""
    data = pd.read_csv(FIGURES / f"{name}.csv")
    marked = data.groupby(group)[["best_T0"]].nunique()
    assert (marked["best_T0"] == 1).all(), f"{name}.csv: one marked best T0 per {group}"
    return data.groupby(group).first()


def _quartiles_of(values):
    return tuple(np.quantile(np.asarray(values, dtype=float), [0.5, 0.25, 0.75]))


def test_every_marked_best_warmup_agrees_with_best_warmup_csv():
    """Every figure that marks a best T0 writes it in its CSV (its grouping column and ``best_T0``), and
    where its instances are figure 2's, the value is what best_warmup.csv (one row per instance) gives:
    figures 2 and 3 per ζ_V (median and quartiles), the heatmaps' E = 10 column, the loss curves per
    seed (ζ_V = 3) and the linear rows of tradeoff_attention (seeds 0–4)."""
    best = pd.read_csv(FIGURES / "best_warmup.csv")
    marking = {path.stem for path in FIGURES.glob("*.csv") if "best_T0" in pd.read_csv(path, nrows=1)
               and not path.stem.startswith("predictive_regret")}   # the benchmark's truth per instance
    assert marking == {"best_warmup", "tradeoff", "excess_risk_decomposition", "heatmaps", "loss_curves",
                       "tradeoff_attention", "digits"}, "a figure marks a best T0 that no test checks"
    for name in ("tradeoff", "excess_risk_decomposition"):
        marked = _marked(name, "zeta_value")
        for level, sub in best.groupby("zeta_value"):
            row = marked.loc[level]
            assert (row["best_T0"], row["best_T0_q25"], row["best_T0_q75"]) == _quartiles_of(sub["best_T0"]), name
    cells = pd.read_csv(FIGURES / "heatmaps.csv")
    column = cells[cells["federated.local_steps"] == 10].set_index("task.zeta_value")
    for level, sub in best.groupby("zeta_value"):
        assert column.loc[level, "best_T0"] == np.median(sub["best_T0"])
        assert (column.loc[level, "instances"], column.loc[level, "beats"]) == (len(sub), int((sub["gain"] > 0).sum()))
        assert column.loc[level, "gain_median"] == pytest.approx(np.median(sub["gain"]), rel=1e-9)
    curves = _marked("loss_curves", "seed")
    top = best[best["zeta_value"] == best["zeta_value"].max()].set_index("seed")
    for seed, row in curves.iterrows():
        assert row["best_T0"] == top.loc[seed, "best_T0"], f"loss_curves, seed {seed}"
    attention = _marked("tradeoff_attention", ["attention", "zeta_value"]).loc["linear"]
    for level, row in attention.iterrows():
        sub = best[(best["zeta_value"] == level) & (best["seed"] < 5)]
        assert (row["best_T0"], row["best_T0_q25"], row["best_T0_q75"]) == _quartiles_of(sub["best_T0"])
        assert row["gain_median"] == pytest.approx(np.median(sub["gain"]), rel=1e-9)
    digits = _marked("digits", ["attention", "label_alpha"])
    assert digits["best_T0"].between(0, 120).all()


def test_the_rewriting_command_has_a_help_and_refuses_extra_arguments(capsys):
    """``python -m linattn_theory.report.figure_numbers --help`` prints its usage (it used to take
    ``--help`` for the root folder and fail); two roots are an error, nothing written."""
    from linattn_theory.report.figure_numbers import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "root" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["a", "b"])
    assert done.value.code == 2
