"""Every number README.md and figures/README.md quote about the figures is recomputed from the committed CSVs."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory.report.figure_numbers import QUOTED_FILES, _BLOCK, blocks, figure_times, headline_numbers
from linattn_theory.report.figures import discover
from linattn_theory.sim.sensitivity import CHAOS_AMPLIFICATION

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
    per-instance table best_warmup.csv, and both agree with the quoted numbers: the median gain, its
    bootstrap interval (resampled here with NumPy alone), the wins above 2 % and the chaotic instances."""
    best = pd.read_csv(FIGURES / "best_warmup.csv")
    plotted = pd.read_csv(FIGURES / "tradeoff_gain.csv").set_index("zeta_value")
    quoted = headline_numbers(FIGURES).set_index("zeta_value")
    for level, sub in best.groupby("zeta_value"):
        gain = np.sort(sub["gain"].to_numpy())
        assert plotted.loc[level, "instances"] == quoted.loc[level, "instances"] == len(gain)
        assert plotted.loc[level, "beats"] == int(np.sum(gain > 0))
        assert quoted.loc[level, "wins"] == int(np.sum(gain > 0.02))
        listed = sub["gain"].to_numpy()                       # resampled in the table's order, as the figure does
        draws = np.median(listed[np.random.default_rng(0).integers(len(listed), size=(2000, len(listed)))], axis=1)
        assert (quoted.loc[level, "gain_low"], quoted.loc[level, "gain_high"]) == tuple(
            np.quantile(draws, [0.025, 0.975], method="inverted_cdf"))
        calm = sub.loc[~sub["chaotic"], "gain"]
        assert quoted.loc[level, "chaotic_instances"] == int(sub["chaotic"].sum()) == len(sub) - len(calm)
        assert quoted.loc[level, "gain_median_unflagged"] == pytest.approx(np.median(calm), rel=1e-12)
        assert quoted.loc[level, "wins_unflagged"] == int(np.sum(calm > 0.02))
        assert plotted.loc[level, "gain_median"] == pytest.approx(np.median(gain), rel=1e-8)
        assert quoted.loc[level, "gain_median"] == pytest.approx(np.median(gain), rel=1e-8)
        assert quoted.loc[level, "best_T0_median"] == np.median(sub["best_T0"]) == plotted.loc[level, "best_T0_median"]
        assert plotted.loc[level, "best_T0_q25"] == np.quantile(sub["best_T0"], 0.25)
        assert (sub["gain"] >= 0).all() and (sub["best_T0"] <= sub["T"]).all()
    for level, row in plotted.iterrows():
        assert row["instances"] + row["diverged_instances"] >= 20, "the headline needs >= 20 instances per level"
    assert best["chaotic"].any(), "the headline sweep has chaotic instances (docs/theory.md §6)"


@pytest.mark.parametrize("name", ["best_warmup", "heatmaps_instances", "tradeoff_attention_instances",
                                  "digits_instances"])
def test_chaos_flags_are_separated_from_the_unflagged_by_three_decades(name):
    """docs/theory.md §6 "Chaotic instances": in the per-instance tables of the same-step figures every
    flagged instance's amplification exceeds every unflagged one's by more than 1e3, and the flag is
    the amplification above CHAOS_AMPLIFICATION (no repeat diverged)."""
    data = pd.read_csv(FIGURES / f"{name}.csv")
    assert (data["chaotic"] == (data["amplification"] > CHAOS_AMPLIFICATION)).all()
    flagged, calm = data.loc[data["chaotic"], "amplification"], data.loc[~data["chaotic"], "amplification"]
    assert calm.max() < CHAOS_AMPLIFICATION
    if len(flagged):
        assert flagged.min() > 1e3 * calm.max()


def test_same_step_gains_are_named_as_such_with_an_interval_and_the_threshold():
    """Every quoted gain over FedAvg at the same step says so, and carries an interval, wins above 2 %
    and its chaotic instances; no block counts a win as any gain above zero ("beats FedAvg in")."""
    generated = blocks(FIGURES)
    for name in ("tradeoff-caption", "headline", "heatmaps", "tradeoff-attention", "digits"):
        text = generated[name]
        assert "FedAvg at the same step (not tuned; the fair comparison is" in text, name
        assert "beats FedAvg in" not in text and "wins above 2 %" in text and "chaotic" in text, name
        assert re.search(r"[0-9.]+ % \[-?[0-9.]+, -?[0-9.]+\]", text), name


def test_per_instance_tables_agree_where_their_instances_are_figure_2s():
    """The heatmaps' E = 10 column and tradeoff_attention's linear seeds 0–4 are figure 2's runs: their
    per-instance rows (gain, best T0, chaos flag) are best_warmup.csv's, and heatmaps.csv's intervals
    are gain_intervals of heatmaps_instances.csv."""
    from linattn_theory.report.sweep_analysis import gain_intervals

    best = pd.read_csv(FIGURES / "best_warmup.csv")
    columns = ["best_T0", "R_best", "R_fedavg", "gain", "chaotic"]
    heat = pd.read_csv(FIGURES / "heatmaps_instances.csv")
    ten = heat[heat["local_steps"] == 10].merge(best, on=["zeta_value", "seed"], suffixes=("", "_fig2"))
    assert len(ten) == len(best)
    attention = pd.read_csv(FIGURES / "tradeoff_attention_instances.csv")
    linear = attention[attention["attention"] == "linear"].merge(best, on=["zeta_value", "seed"], suffixes=("", "_fig2"))
    assert len(linear) == len(attention) // 2 > 0
    for joined in (ten, linear):
        for column in columns:
            assert (joined[column] == joined[f"{column}_fig2"]).all(), column
    cells = pd.read_csv(FIGURES / "heatmaps.csv").rename(columns={"task.zeta_value": "zeta_value",
                                                                  "federated.local_steps": "local_steps"})
    ours = gain_intervals(heat, ["zeta_value", "local_steps"]).merge(cells, on=["zeta_value", "local_steps"],
                                                                    suffixes=("", "_csv"))
    assert len(ours) == len(cells)
    for column in ("gain_median", "gain_low", "gain_high", "gain_median_unflagged"):
        np.testing.assert_allclose(ours[column], ours[f"{column}_csv"], rtol=1e-8, err_msg=column)
    for column in ("instances", "wins", "chaotic_instances", "wins_unflagged"):
        assert (ours[column] == ours[f"{column}_csv"]).all(), column


def test_headline_ratios_are_paired_against_fedavg():
    """R(T)/R(T) = 1 in every instance, so the plotted median and quartiles of the ratio are 1 at T."""
    data = pd.read_csv(FIGURES / "tradeoff.csv")
    ratio = data[data["quantity"] == "ratio_to_fedavg"]
    at_T = ratio[ratio["T0"] == ratio["T0"].max()]
    np.testing.assert_allclose(at_T[["median", "q25", "q75"]].to_numpy(), 1.0, rtol=1e-12)


def test_quoted_percentages_parse_back_to_the_csv():
    """The gains quoted in figures/README.md, parsed from the text, are the CSV's medians and intervals."""
    text = (ROOT / "figures/README.md").read_text()
    block = text[text.index("<!-- BEGIN quoted: headline -->"):text.index("<!-- END quoted: headline -->")]
    quoted = np.array(re.findall(r"\| \*\*([0-9.]+) % \[([0-9.-]+), ([0-9.-]+)\]\*\* \(", block), dtype=float)
    numbers = headline_numbers(FIGURES)
    np.testing.assert_allclose(quoted, 100 * numbers[["gain_median", "gain_low", "gain_high"]].to_numpy(), atol=0.05)


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
                       "tradeoff_attention", "digits", "heatmaps_instances", "tradeoff_attention_instances",
                       "digits_instances"}, "a figure marks a best T0 that no test checks"
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
    per_instance = pd.read_csv(FIGURES / "digits_instances.csv")
    for (attention, alpha), sub in per_instance.groupby(["attention", "label_alpha"]):
        row = digits.loc[(attention, alpha)]
        assert (row["best_T0"], row["best_T0_q25"], row["best_T0_q75"]) == _quartiles_of(sub["best_T0"])
    # heatmaps_instances and tradeoff_attention_instances: test_per_instance_tables_agree_where_their_instances_are_figure_2s


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
