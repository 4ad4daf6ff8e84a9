"""The numbers the README and figures/README.md quote, recomputed from the committed figure CSVs.

Each quoted passage is a generated block between ``<!-- BEGIN quoted: NAME -->`` and
``<!-- END quoted: NAME -->`` in a Markdown file; :func:`blocks` writes every block from the CSVs
in ``figures/`` (``best_warmup.csv``: one row per instance of the headline sweep;
``heatmaps.csv`` and ``heatmaps_instances.csv``, ``drift_scaling.csv``, ``frozen_stage.csv``,
``static_heads_summary.csv``, ``softmax_static_heads_summary.csv``, ``tradeoff_attention.csv`` and
``tradeoff_attention_instances.csv``, ``digits.csv`` and ``digits_instances.csv``; the running
times from ``timings.csv``, which ``benchmarks/figure_times.py`` measures),
``tests/test_quoted_numbers.py`` checks that the files hold exactly these blocks, and
``python -m linattn_theory.report.figure_numbers`` rewrites them after the figures are regenerated.
Statistics follow docs/theory.md §6: per instance the best warm-up ``T0_best`` (smallest argmin)
and the gain ``1 − R(T0_best)/R(T)``; medians and interquartile ranges over instances. A gain over
FedAvg at the same step (not tuned) is always named so, with the median's bootstrap 95 % interval,
the wins above 2 % and the chaotic instances, with the statistics without them
(:func:`~linattn_theory.report.sweep_analysis.gain_intervals`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.io import read_csv_exact
from .sweep_analysis import gain_intervals

__all__ = ["headline_numbers", "figure_times", "dominant_parts", "blocks", "replace_blocks", "QUOTED_FILES", "main"]

#: the Markdown files (relative to the repository root) with quoted blocks
QUOTED_FILES = ("README.md", "figures/README.md", "docs/theory.md")
_BLOCK = re.compile(r"(<!-- BEGIN quoted: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END quoted: (?P=name) -->)", re.S)


def _quartiles(values) -> tuple[float, float, float]:
    q25, median, q75 = np.quantile(np.asarray(values, dtype=float), [0.25, 0.5, 0.75])
    return float(median), float(q25), float(q75)


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def headline_numbers(figures) -> pd.DataFrame:
    """Per ζ_V, from ``best_warmup.csv`` (instances whose FedAvg run did not diverge, with their chaos
    flags) and ``tradeoff_gain.csv`` (how many diverged): instances, diverged instances, the gain of
    FedAvg at its best warm-up over FedAvg at the same step (not tuned) as
    :func:`~linattn_theory.report.sweep_analysis.gain_intervals` gives it (median, bootstrap 95 %
    interval, wins above 2 %, chaotic instances, the same without them), the gain's quartiles and the
    best warm-up's median and quartiles.

    Parameters
    ----------
    figures : str or path-like
        The folder of the figures' CSVs.

    Returns
    -------
    pandas.DataFrame
        One row per ``ζ_V``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figure_numbers import headline_numbers
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "best_warmup.csv").write_text("zeta_value,seed,best_T0,gain,T,chaotic\\n"
    ...     "1,0,10,0.2,40,False\\n1,1,20,0.01,40,False\\n1,2,30,0.4,40,True\\n")
    >>> _ = (folder / "tradeoff_gain.csv").write_text("zeta_value,diverged_instances\\n1,1\\n")
    >>> row = headline_numbers(folder).iloc[0]                     # ζ_V = 1: gains 0.2, 0.01, 0.4 (chaotic)
    >>> int(row["instances"]), int(row["diverged"]), int(row["wins"]), int(row["chaotic_instances"])
    (3, 1, 2, 1)
    >>> float(row["gain_median"]), round(float(row["gain_median_unflagged"]), 12), float(row["best_T0_median"])
    (0.2, 0.105, 20.0)
    """
    best = read_csv_exact(Path(figures) / "best_warmup.csv")
    diverged = read_csv_exact(Path(figures) / "tradeoff_gain.csv").set_index("zeta_value")["diverged_instances"]
    intervals = gain_intervals(best, "zeta_value").set_index("zeta_value")
    rows = []
    for level, sub in best.groupby("zeta_value"):
        rows.append({"zeta_value": float(level), "diverged": int(diverged[level]), **intervals.loc[level].to_dict(),
                     **dict(zip(("gain_q25", "gain_q75"), _quartiles(sub["gain"])[1:])),
                     **dict(zip(("best_T0_median", "best_T0_q25", "best_T0_q75"), _quartiles(sub["best_T0"]))),
                     "T": int(sub["T"].max())})
    return pd.DataFrame(rows).astype({"instances": int, "wins": int, "chaotic_instances": int,
                                      "instances_unflagged": int, "wins_unflagged": int})


#: how every same-step comparison is named (FedAvg at the sweep's one step, not tuned)
SAME_STEP = "against FedAvg at the same step (not tuned; the fair comparison is the phase diagram, figure 4b)"


def _ci(median: float, low: float, high: float) -> str:
    """``13.4 % [3.1, 32.6]``: a median gain and its bootstrap 95 % interval, in per cent."""
    return f"{100 * median:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"


def _same_step(row, unit: str = "instances") -> str:
    """The gain statistics of a :func:`~linattn_theory.report.sweep_analysis.gain_intervals` row, with the
    chaotic instances counted and the statistics without them."""
    text = (f"median gain {_ci(row['gain_median'], row['gain_low'], row['gain_high'])}, wins above 2 % in "
            f"{int(row['wins'])} of {int(row['instances'])} {unit}")
    k = int(row["chaotic_instances"])
    if not k:
        return text + ", none chaotic"
    return (text + f"; {k} chaotic, without them {_ci(row['gain_median_unflagged'], row['gain_low_unflagged'], row['gain_high_unflagged'])}, "
            f"wins in {int(row['wins_unflagged'])} of {int(row['instances_unflagged'])}")


def _earlier(best: pd.DataFrame) -> tuple[int, int]:
    wide = best.pivot(index="seed", columns="zeta_value", values="best_T0")
    both = wide[[wide.columns.min(), wide.columns.max()]].dropna()
    return int((both.iloc[:, 1] < both.iloc[:, 0]).sum()), len(both)


def _headline(figures: Path) -> str:
    numbers = headline_numbers(figures)
    best = read_csv_exact(figures / "best_warmup.csv")
    k, n = _earlier(best)
    lines = ["| `ζ_V` | instances (diverged, left out) | gain: median [bootstrap 95 %] (IQR) | wins above 2 % | "
             "chaotic: without them, median [95 %], wins | best `T0`: median (IQR) |", "|---|---|---|---|---|---|"]
    for r in numbers.itertuples():
        unflagged = (f"{r.chaotic_instances}: {_ci(r.gain_median_unflagged, r.gain_low_unflagged, r.gain_high_unflagged)}, "
                     f"{r.wins_unflagged} of {r.instances_unflagged}" if r.chaotic_instances else "0")
        lines.append(f"| {r.zeta_value:g} | {r.instances + r.diverged} ({r.diverged}) | "
                     f"**{_ci(r.gain_median, r.gain_low, r.gain_high)}** ({_pct(r.gain_q25)} to {_pct(r.gain_q75)}) | "
                     f"**{r.wins} of {r.instances}** | {unflagged} | "
                     f"{r.best_T0_median:g} ({r.best_T0_q25:g} to {r.best_T0_q75:g}) of `T = {r.T}` |")
    return (f"FedFrozen at its best `T0`, {SAME_STEP}:\n\n" + "\n".join(lines)
            + "\n\nThe best warm-up is earlier at the highest level than at the lowest in "
            f"**{k} of {n}** instances run at both.\n")


def _heatmaps(figures: Path) -> str:
    cells = read_csv_exact(figures / "heatmaps.csv")
    instances = read_csv_exact(figures / "heatmaps_instances.csv")
    stats = gain_intervals(instances, ["zeta_value", "local_steps"])
    E_min = stats["local_steps"].min()
    single = stats[stats["local_steps"] == E_min]
    top = stats.loc[stats["gain_median"].idxmax()]
    cell = cells[(cells["task.zeta_value"] == top["zeta_value"]) & (cells["federated.local_steps"] == top["local_steps"])].iloc[0]
    return (f"FedFrozen at its best `T0`, {SAME_STEP}: with `E = {int(E_min)}` it wins (gain above 2 %) in "
            f"{int(single['wins'].sum())} of {int(single['instances'].sum())} instances (no client drift); "
            f"the median gain is largest at `ζ_V = {top['zeta_value']:g}`, `E = {int(top['local_steps'])}`: "
            f"**{_same_step(top)}** (median best `T0 = {cell['best_T0_median']:g}`). Chaotic instances: "
            f"{int(stats['chaotic_instances'].sum())} of {int(stats['instances'].sum())} (‡ in the figure), in "
            f"{int((stats['chaotic_instances'] > 0).sum())} of {len(stats)} cells.\n")


def _drift(figures: Path) -> str:
    data = read_csv_exact(figures / "drift_scaling.csv")
    slopes = data.groupby("variable", sort=False)["fitted_slope"].first()
    names = {"zeta": "ζ", "federated.learning_rate": "η", "local_steps_minus_one": "E − 1"}
    frozen = read_csv_exact(figures / "frozen_stage.csv")
    return ("The simulated drift floor equals the closed form `D(K_0)` to a relative difference of at most "
            f"**{data['relative_difference'].max():.1e}** (median {data['relative_difference'].median():.1e}); "
            "the fitted slopes are " + ", ".join(f"{slopes[v]:.2f} ({names.get(v, v)})" for v in slopes.index)
            + " against the derived 2. In the frozen-stage figure the distance to `V_FA` reaches "
            f"{frozen['distance'].min():.0e} (float64 precision).\n")


def _interval(rho: float, low: float, high: float) -> str:
    return f"{rho:+.2f} (95 % interval {low:+.2f} to {high:+.2f})"


def _static(figures: Path) -> str:
    summary = read_csv_exact(figures / "static_heads_summary.csv")
    parts = [f"`ζ_V = {r.zeta_value:g}`: Spearman {_interval(r.spearman, r.spearman_low, r.spearman_high)}, "
             f"cheapest head picked in {r.largest_share_is_cheapest} of {r.instances}" for r in summary.itertuples()]
    return ("Input-independent share against the loss change of making that head static: "
            + "; ".join(parts) + ".\n")


def _softmax_static(figures: Path) -> str:
    summary = read_csv_exact(figures / "softmax_static_heads_summary.csv")
    names = {"mean_kl": "mean KL", "pattern_variance": "pattern variance"}
    parts = []
    for level, sub in summary.groupby("zeta_value", sort=True):
        rhos = [f"{names[r.criterion]} {_interval(r.spearman, r.spearman_low, r.spearman_high)}"
                for r in sub.itertuples()]
        parts.append(f"`ζ_V = {level:g}`: " + ", ".join(rhos))
    n = int(summary["instances"].max())
    return (f"Spearman's ρ of each criterion with the relative loss change, per level over {n} instances: "
            + "; ".join(parts) + ".\n")


def _per_instance_summary(data: pd.DataFrame, group) -> pd.DataFrame:
    """One row per value of ``group``: the marked best warm-up and what else the figure repeats per row."""
    return data.groupby(group, sort=True).first().reset_index()


def _tradeoff_attention(figures: Path) -> str:
    instances = read_csv_exact(figures / "tradeoff_attention_instances.csv")
    stats = gain_intervals(instances, ["zeta_value", "attention"]).set_index(["zeta_value", "attention"])
    data = _per_instance_summary(read_csv_exact(figures / "tradeoff_attention.csv"), ["zeta_value", "attention"])
    parts = []
    for level, sub in data.groupby("zeta_value", sort=True):
        said = [f"{r.attention}: best `T0` {r.best_T0:g} ({r.best_T0_q25:g} to {r.best_T0_q75:g}), "
                f"{_same_step(stats.loc[(level, r.attention)])}" for r in sub.itertuples()]
        parts.append(f"`ζ_V = {level:g}`: " + "; ".join(said))
    return (f"FedFrozen at its best `T0`, {SAME_STEP}; per instance, median (IQR) or [bootstrap 95 % interval] "
            "over the instances: " + ". ".join(parts) + ".\n")


def _digits(figures: Path) -> str:
    data = read_csv_exact(figures / "digits.csv")
    accuracy = data[data["quantity"] == "test_accuracy"]
    T = int(accuracy["T0"].max())
    late = accuracy[accuracy["T0"] >= T // 2]
    fedavg = accuracy[accuracy["T0"] == T].set_index(["attention", "label_alpha"])["median"]
    cost = (late.join(fedavg.rename("fedavg"), on=["attention", "label_alpha"])
            .eval("fedavg - median").max())
    best = _per_instance_summary(data, ["attention", "label_alpha"])
    at_T = int((best["best_T0"] == T).sum())
    loss = data[data["quantity"] == "relative_loss_change_vs_fedavg_percent"]
    below = loss[loss["median"] < 0]
    lowest = loss.loc[loss["median"].idxmin()]
    stats = gain_intervals(read_csv_exact(figures / "digits_instances.csv"), ["attention", "label_alpha"])
    gains = "; ".join(f"{r['attention']}, `α = {r['label_alpha']:g}`: {_same_step(r)}" for _, r in stats.iterrows())
    return ("Against FedAvg at the same step (not tuned; the fair comparison is figure 4d, digits searched): "
            f"from `T0 = {T // 2}` on, freezing costs at most {100 * cost:.1f} accuracy points against FedAvg "
            f"(medians over instances); the median best warm-up is `T = {T}` (plain FedAvg) in {at_T} of "
            f"{len(best)} settings of attention and label skew; the median final training loss ends below "
            f"FedAvg's in {len(below)} of {len(loss[loss['T0'] < T])} (setting, `T0`) points, at most by "
            f"{-min(lowest['median'], 0):.2f} % ({lowest['attention']} attention, `α = {lowest['label_alpha']:g}`, "
            f"`T0 = {int(lowest['T0'])}`). FedFrozen at its best `T0`, its gain `1 − F(T0_best)/F(T)` in the final "
            f"training objective (no `Φ*_λ` on digits): {gains}.\n")


def _phase_caption(figures: Path) -> str:
    """README's headline caption: the phase diagram against tuned FedAvg (``phase_diagram_cells.csv``)."""
    cells = read_csv_exact(figures / "phase_diagram_cells.csv", dtype={"column": str})
    score = read_csv_exact(figures / "phase_diagram_predictor.csv").set_index("subset").loc["all"]
    tuned = cells[cells["column"] == "tuned"]
    edge = cells[cells["column"] != "tuned"]["step_scale"].max()
    E_low, E_high = sorted(cells["local_steps"].unique())[0], sorted(cells["local_steps"].unique())[-1]

    def gains(part):
        return f"{100 * part['gain_median'].min():+.0f} to {100 * part['gain_median'].max():+.0f} %"

    def wins(part):
        return f"{int(part['wins'].min())}–{int(part['wins'].max())} of {int(part['n'].max())}"
    frozen = tuned[tuned["arm"] == "fedfrozen_best"]
    low, high = frozen[frozen["local_steps"] == E_low], frozen[frozen["local_steps"] == E_high]
    at_edge = cells[(cells["arm"] == "fedfrozen_best") & (cells["column"] != "tuned")
                    & (cells["step_scale"] == edge) & (cells["local_steps"] == E_high)]
    solve, oracle = tuned[tuned["arm"] == "value_solve_final"], tuned[tuned["arm"] == "fedavg_tuned_oracle"]
    instances = int(cells["instances"].max())
    keys = ["zeta_value", "local_steps"]
    pairs = solve.merge(frozen, on=keys, suffixes=("_solve", "_frozen"))
    ahead = int((pairs["gain_median_solve"] > pairs["gain_median_frozen"]).sum())
    ahead = "in every cell" if ahead == len(pairs) else f"in {ahead} of {len(pairs)} cells"
    online = tuned[tuned["arm"] == "fedfrozen_online"]
    on_low, on_high = online[online["local_steps"] == E_low], online[online["local_steps"] == E_high]
    share = _online_share(cells)
    edge_online, edge_fedavg = (cells[(cells["arm"] == arm) & (cells["column"] == f"{edge:g}") & (cells["local_steps"] == E_high)]
                                for arm in ("fedfrozen_online", "fedavg"))
    return (f"*The headline figure (`simulations/phase_diagram.py`): where freezing pays against a **tuned** "
            f"FedAvg. Each cell is {instances} held-out instances (median gain `1 − R/R_tuned FedAvg`, bootstrap "
            f"95 % interval, wins above 2 %); every arm's step is `c` times the stable step at `θ⁰` and chosen per "
            f"cell on separate design seeds. FedFrozen at its best `T0` (its own tuned step) gains {gains(low)} at "
            f"`E = {E_low}` (wins in {wins(low)}) and {gains(high)} at `E = {E_high}` (wins in {wins(high)}); near "
            f"the stability edge (`c = {edge:g}`, `E = {E_high}`) it loses ({gains(at_edge)}). The causal online rule "
            f"(docs/theory.md §8), run for real on every instance with its own tuned step, realises {gains(on_low)} at "
            f"`E = {E_low}` (wins in {wins(on_low)}) and {gains(on_high)} at `E = {E_high}` (wins in {wins(on_high)}): "
            f"{100 * share.min():.0f}–{100 * share.max():.0f} % of the oracle's median gain in the {len(share)} cells "
            f"where that pays; at `c = {edge:g}`, `E = {E_high}` its run diverges on "
            f"{int(edge_online['diverged'].min())}–{int(edge_online['diverged'].max())} of {instances} instances (FedAvg at "
            f"that step on {int(edge_fedavg['diverged'].min())}–{int(edge_fedavg['diverged'].max())}). The server's exact "
            f"value solve after FedAvg, from the clients' value moments, gains {gains(solve)} (wins in "
            f"{wins(solve)}), more than freezing {ahead}; FedAvg's own best iterate (an oracle) "
            f"{gains(oracle)}. The a-priori predictor of docs/theory.md §6 (declared before scoring) is right on "
            f"{100 * score['accuracy']:.1f} % of the held-out pairs, against "
            f"{100 * (1 - score['positives'] / score['instances']):.1f} % for always answering “does not pay”.*\n")


def _online_share(cells: pd.DataFrame, threshold: float = 0.02) -> pd.Series:
    """Per (ζ_V, E) where FedFrozen at its best ``T0`` (own tuned step) has a median gain over tuned
    FedAvg above ``threshold``: the online rule's realised median gain (own tuned step) over that
    oracle's, ``g_online / g_best`` (docs/theory.md §6, §8)."""
    tuned = cells[cells["column"] == "tuned"].set_index(["zeta_value", "local_steps"])
    best = tuned[tuned["arm"] == "fedfrozen_best"]["gain_median"]
    online = tuned[tuned["arm"] == "fedfrozen_online"]["gain_median"]
    paying = best[best > threshold]
    return (online.reindex(paying.index) / paying).rename("share")


def _caption(figures: Path) -> str:
    numbers = headline_numbers(figures)
    low, high = numbers.iloc[0], numbers.iloc[-1]
    return (f"*The trade-off figure (`simulations/tradeoff.py`), at one step for every arm (`η·E = 0.2`, near "
            "FedAvg's instability): the final "
            "excess risk `R(T0)` against the warm-up "
            f"length at {len(numbers)} heterogeneity levels over {int((numbers['instances'] + numbers['diverged']).max())} "
            "instances each "
            "(median, interquartile band), paired per instance against plain FedAvg (`R(T0)/R(T)`), and "
            "the per-instance gain at the best warm-up. At "
            f"`ζ_V = {high['zeta_value']:g}` FedFrozen at its best `T0`, {SAME_STEP}, "
            f"has a {_same_step(high)}; at `ζ_V = {low['zeta_value']:g}` a {_same_step(low)} (chaotic: a 1e-12 move "
            "of `θ⁰` moves the end of the instance's FedAvg run by more than 1e-5, open markers in figure 2b). "
            "The dotted bound `U(T0)` is fitted on each instance's own "
            "FedAvg run: an a posteriori fit, descriptive, not a prediction (docs/theory.md §6). Instances "
            f"that diverged ({int(numbers['diverged'].sum())} in all) are left out.*\n")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _conditions(rows: pd.DataFrame) -> str:
    """How a mode of ``timings.csv`` was measured: cores, workers, niceness, load, date, revision."""
    first = rows.iloc[0]
    load = pd.concat([rows["load_before"], rows["load_after"]])
    nice = f", at niceness {int(first['nice'])}" if int(first["nice"]) else ""
    return (f"{int(first['cores'])} cores, {first['executor']} with {int(first['workers'])} workers{nice}, "
            f"load average {load.min():.1f}–{load.max():.1f}, {first['date']}, revision "
            f"`{first['revision']}`")


def figure_times(figures) -> pd.DataFrame:
    """``timings.csv`` (written by ``benchmarks/figure_times.py``): one row per figure script and mode
    (``full``, ``quick``), its seconds from an empty sweep cache and the runs it stored in sweeps.

    Parameters
    ----------
    figures : str or path-like
        The folder holding ``timings.csv``.

    Returns
    -------
    pandas.DataFrame
        The timings.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.report.figure_numbers import figure_times
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "timings.csv").write_text("mode,figure,seconds\\nfull,tradeoff,61.8\\nquick,tradeoff,2.5\\n")
    >>> figure_times(folder)["seconds"].tolist()
    [61.8, 2.5]
    """
    return read_csv_exact(Path(figures) / "timings.csv")


def _times(figures: Path) -> str:
    times = figure_times(figures)
    full, quick = (times[times["mode"] == mode] for mode in ("full", "quick"))
    return (f"Figures, each set from an empty sweep cache, its scripts one at a time: the full set "
            f"(`linattn figures --jobs 1`, {len(full)} scripts, {int(full['sweep_runs'].sum()):,} runs stored in "
            f"sweeps) takes **{_duration(full['seconds'].sum())}** ({_conditions(full)}); the quick set "
            f"(`linattn figures --quick --jobs 1`) takes **{_duration(quick['seconds'].sum())}** "
            f"({_conditions(quick)}). `linattn figures` runs two scripts at a time by default (`--jobs`), "
            f"so a set takes less than this sum; the files are the same bytes.\n")


def _times_table(figures: Path) -> str:
    times = figure_times(figures)
    wide = times.pivot(index="figure", columns="mode", values="seconds")
    runs = times[times["mode"] == "full"].set_index("figure")["sweep_runs"]
    lines = ["| figure | seconds (full) | runs stored in sweeps (full) | seconds (`--quick`) |", "|---|---|---|---|"]
    for name in times.drop_duplicates("figure")["figure"]:
        lines.append(f"| {name} | {wide.loc[name, 'full']:.1f} | {int(runs[name]):,} | {wide.loc[name, 'quick']:.1f} |")
    lines.append(f"| **all {len(wide)}** | **{wide['full'].sum():.1f} ({_duration(wide['full'].sum())})** | "
                 f"**{int(runs.sum()):,}** | **{wide['quick'].sum():.1f}** |")
    return "\n".join(lines) + "\n"


def _gain(row) -> str:
    """``+14 % [6, 27], 17/20`` of a row of ``phase_diagram_cells.csv``."""
    if not np.isfinite(row["gain_median"]):
        return f"diverged ({int(row['wins'])}/{int(row['instances'])} wins)"
    low = "−∞" if not np.isfinite(row["gain_low"]) else f"{100 * row['gain_low']:.0f}"
    return (f"{100 * row['gain_median']:+.0f} % [{low}, {100 * row['gain_high']:.0f}], "
            f"{int(row['wins'])}/{int(row['instances'])}")


def dominant_parts(attribution: pd.DataFrame) -> pd.Series:
    """Per win of ``phase_diagram_attribution.csv``, its largest part: ``"FedAvg diverged"``, or the
    largest of ``step``, ``late_rise``, ``drift_floor``, ``unfinished`` (``value`` where the drift floor
    and the unfinished part are not split, a frozen map with ``ρ ≥ 1``).

    Parameters
    ----------
    attribution : pandas.DataFrame
        The wins' parts: ``fedavg_diverged``, ``step``, ``late_rise``, ``drift_floor``, ``unfinished``, ``value``.

    Returns
    -------
    pandas.Series
        Each win's largest part.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.figure_numbers import dominant_parts
    >>> wins = pd.DataFrame({"fedavg_diverged": [True, False, False], "step": [0.0, 0.1, 0.5],
    ...                      "late_rise": [0.0, 0.3, 0.1], "drift_floor": [0.0, 0.2, float("nan")],
    ...                      "unfinished": [0.0, 0.0, float("nan")], "value": [0.0, 0.0, 0.2]})
    >>> dominant_parts(wins).tolist()
    ['FedAvg diverged', 'late_rise', 'step']
    """
    def largest(row):
        if row["fedavg_diverged"]:
            return "FedAvg diverged"
        parts = ["step", "late_rise"] + (["drift_floor", "unfinished"] if np.isfinite(row["drift_floor"]) else ["value"])
        return max(parts, key=lambda k: row[k])
    return attribution.apply(largest, axis=1)


def _phase_diagram(figures: Path) -> str:
    cells = read_csv_exact(figures / "phase_diagram_cells.csv", dtype={"column": str})
    score = read_csv_exact(figures / "phase_diagram_predictor.csv").set_index("subset")
    attribution = read_csv_exact(figures / "phase_diagram_attribution.csv")
    edge = f"{cells[cells['column'] != 'tuned']['step_scale'].max():g}"
    pick = {(r.arm, r.zeta_value, r.local_steps, r.column): r._asdict() for r in cells.itertuples(index=False)}
    lines = ["| `E` | `ζ_V` | tuned FedAvg's `c` | FedFrozen, best `T0`, own tuned `c` | FedFrozen, best `T0`, "
             f"`c = {edge}` | FedFrozen, online rule's run, own tuned `c` | FedFrozen, online rule's run, `c = {edge}` | "
             "value solve after FedAvg, own tuned `c` | FedAvg's best iterate (oracle) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (E, zeta), _ in cells.groupby(["local_steps", "zeta_value"], sort=True):
        ff, fe = pick[("fedfrozen_best", zeta, E, "tuned")], pick[("fedfrozen_best", zeta, E, edge)]
        on, oe = pick[("fedfrozen_online", zeta, E, "tuned")], pick[("fedfrozen_online", zeta, E, edge)]
        vs, orc = pick[("value_solve_final", zeta, E, "tuned")], pick[("fedavg_tuned_oracle", zeta, E, "tuned")]
        lines.append(f"| {E} | {zeta:g} | {ff['tuned_fedavg_step']:g} | {_gain(ff)} (`c = {ff['step_scale']:g}`) | "
                     f"{_gain(fe)} | {_gain(on)} (`c = {on['step_scale']:g}`) | {_gain(oe)} | "
                     f"{_gain(vs)} (`c = {vs['step_scale']:g}`) | {_gain(orc)} |")
    def span(arm, column, E, zetas=None):
        part = cells[(cells["arm"] == arm) & (cells["column"] == column) & (cells["local_steps"] == E)]
        values = 100 * part[part["zeta_value"].isin(zetas if zetas else part["zeta_value"])]["gain_median"]
        return f"{values.min():+.0f} to {values.max():+.0f} %"
    E_low, E_high = sorted(cells["local_steps"].unique())[0], sorted(cells["local_steps"].unique())[-1]
    tuned = cells[cells["column"] == "tuned"]
    online_share = _online_share(cells)
    lines.append("\nMedian gains over tuned FedAvg: FedFrozen (own tuned step) " +
                 f"{span('fedfrozen_best', 'tuned', E_low)} at `E = {E_low}`, {span('fedfrozen_best', 'tuned', E_high)} "
                 f"at `E = {E_high}`; FedFrozen at `c = {edge}`, `E = {E_high}`: {span('fedfrozen_best', edge, E_high)}; "
                 f"the online rule's realised run (own tuned step) {span('fedfrozen_online', 'tuned', E_low)} at "
                 f"`E = {E_low}`, {span('fedfrozen_online', 'tuned', E_high)} at `E = {E_high}` "
                 f"({100 * online_share.min():.0f}–{100 * online_share.max():.0f} % of the best `T0`'s median gain in the "
                 f"{len(online_share)} cells where that exceeds 2 %); "
                 f"the value solve (own tuned step): {100 * tuned[tuned['arm'] == 'value_solve_final']['gain_median'].min():+.0f} "
                 f"to {100 * tuned[tuned['arm'] == 'value_solve_final']['gain_median'].max():+.0f} %; FedAvg's best iterate: "
                 f"{100 * tuned[tuned['arm'] == 'fedavg_tuned_oracle']['gain_median'].min():+.0f} to "
                 f"{100 * tuned[tuned['arm'] == 'fedavg_tuned_oracle']['gain_median'].max():+.0f} %.")
    all_, clean = score.loc["all"], score.loc["clean"]
    base = 1 - all_["positives"] / all_["instances"]
    kinds = dominant_parts(attribution)
    names = {"unfinished": "the unfinished value optimisation", "step": "the step (FedAvg at the cell's step is "
             "worse than at its tuned one)", "drift_floor": "the drift floor", "late_rise": "FedAvg's late rise",
             "value": "the value block (drift floor and unfinished part not separable, `ρ ≥ 1`)",
             "FedAvg diverged": "FedAvg diverging at the cell's step"}
    counts = "; ".join(f"{names[k]} in **{n}**" for k, n in kinds.value_counts().items())
    by_E = attribution.assign(kind=kinds).groupby("local_steps")["kind"].agg(lambda k: (k == "unfinished").sum())
    late = attribution.loc[~attribution["fedavg_diverged"], "late_rise"] / attribution.loc[~attribution["fedavg_diverged"], "gap"]
    return ("\n".join(lines) + "\n\n"
            f"Cells: median gain over tuned FedAvg [bootstrap 95 % interval], wins above 2 % out of the held-out "
            f"instances. The a-priori predictor (pays iff `c > 1/3`) is right on **{100 * all_['accuracy']:.1f} %** "
            f"of the {int(all_['instances'])} held-out (instance, cell) pairs ({100 * clean['accuracy']:.1f} % of the "
            f"{int(clean['instances'])} unflagged), against {100 * base:.1f} % for always answering “does not pay”; "
            f"balanced accuracy {all_['balanced_accuracy']:.2f}, AUC {all_['auc_step']:.2f} for `2 − m = 2c` and "
            f"{all_['auc_drift_share']:.2f} for `D₂(K⁰)/Φ_λ(K⁰)`; it predicts {int(all_['predicted_positives'])} wins "
            f"where {int(all_['positives'])} occur ({int(all_['true_positives'])} of them right). Its best `T0` has a "
            f"median regret of **{100 * all_['regret_median']:.1f} %** against {100 * all_['regret_median_fedavg']:.1f} % "
            f"for `T0 = T`. Of the {len(attribution)} unflagged wins of FedFrozen at its best `T0`, the largest part "
            f"of the gap `R_tuned − R(T0*)` is {counts} (unfinished: " +
            ", ".join(f"{int(n)} at `E = {E}`" for E, n in by_E.items()) +
            f"); the kernel-profile bias of FedAvg's `K_T` is below that of `K_{{T0*}}` in "
            f"**{int((late < 0).sum())} of {len(late)}** (median share of the gap {100 * late.median():.0f} %).\n")


ARM_NAMES = {"scaffold": "SCAFFOLD", "fedavgm": "FedAvgM", "fedprox": "FedProx", "fedadam": "FedAdam",
             "fedfrozen": "FedFrozen, `(c, T0)` tuned", "value_solve_final": "FedAvg, then the value solve",
             "fedavg_oracle": "FedAvg's best iterate (oracle)"}


def _marks(row) -> str:
    return ("†" if row["diverged"] else "") + ("‡" if row["chaotic"] else "")


def _phase_diagram_arms(figures: Path) -> str:
    """Every arm tuned (``phase_diagram_arms_cells.csv``): per ``ζ_V`` and arm, at each ``E``, its chosen
    setting and its gain over tuned FedAvg (a cell not run: ``–``)."""
    cells = read_csv_exact(figures / "phase_diagram_arms_cells.csv")
    zetas = sorted(cells["zeta_value"].unique())
    steps = sorted(cells["local_steps"].unique())
    head = " | ".join(f"`E = {E}`: setting | gain" for E in steps)
    lines = [f"| `ζ_V` | arm | {head} |", "|---|---|" + "---|---|" * len(steps)]
    pick = {(r["arm"], r["zeta_value"], r["local_steps"]): r for _, r in cells.iterrows()}

    def entry(arm, z, E):
        row = pick.get((arm, z, E))
        return "– | –" if row is None else f"`{row['setting']}` | {_gain(row)}{_marks(row)}"
    for z in zetas:
        for arm in cells["arm"].drop_duplicates():
            lines.append(f"| {z:g} | {ARM_NAMES.get(arm, arm)} | " + " | ".join(entry(arm, z, E) for E in steps) + " |")
    first = cells["arm"].iloc[0]
    reference = "; ".join(f"`ζ_V = {z:g}`: " + ", ".join(f"`{pick[first, z, E]['reference_setting']}` at `E = {E}`"
                                                         for E in steps if (first, z, E) in pick) for z in zetas)
    return ("\n".join(lines) + f"\n\nGain over tuned FedAvg ({reference}) on the held-out instances: median "
            f"[bootstrap 95 % interval], wins above 2 %; † the arm diverged on some instances, ‡ some of its or "
            f"FedAvg's runs are chaotic (the statistics without them: `phase_diagram_arms_cells.csv`).\n")


def _gain_ci(median, low=None, high=None, wins=None, n=None) -> str:
    """``+5 % [−1, 9], 4/6`` (NaN: ``–``)."""
    if not np.isfinite(median):
        return "–"
    text = f"{100 * median:+.0f} %"
    if low is not None:
        lo = "−∞" if not np.isfinite(low) else f"{100 * low:.0f}"
        text += f" [{lo}, {100 * high:.0f}]"
    return text + (f", {int(wins)}/{int(n)}" if wins is not None else "")


def _digits_phase(figures: Path) -> str:
    """Digits searched (``digits_phase_cells.csv``, ``digits_phase.csv``, ``digits_phase_optimum.csv``): per
    (attention, α, E) the tuned steps, FedFrozen with its own tuned ``(c, T0)``, its best oracle column, and
    oracle against oracle; gains in ``F_λ`` and, for linear attention, in excess risk; the held-out runs that
    are chaotic, ‡ where a compared run is, and the verdicts without those instances (docs/theory.md §6
    "Chaotic instances")."""
    cells = read_csv_exact(figures / "digits_phase_cells.csv", dtype={"column": str})
    runs = read_csv_exact(figures / "digits_phase.csv")
    optima = read_csv_exact(figures / "digits_phase_optimum.csv")
    oracle = digits_oracle_gains(runs, optima).set_index(["attention", "label_alpha", "local_steps"])
    lines = ["| attention | `α` | `E` | tuned FedAvg's `c` | FedFrozen, own tuned `(c, T0)`: gain in `F` ; in `R` | "
             "FedFrozen at its best `T0` (oracle), best `c`: in `F` ; in `R` ; accuracy | oracle against oracle: in `F` ; "
             "in `R` ; accuracy | chaotic held-out runs |", "|---|---|---|---|---|---|---|---|"]
    steps = cells[cells["column"] != "tuned"]
    held = runs[runs["role"] == "heldout"]
    chaotic = held.groupby(["attention", "label_alpha", "local_steps"])["chaotic"].agg(["sum", "size"])

    def mark(row) -> str:
        return "‡" if row["chaotic_instances"] else ""
    for (attention, alpha, E), group in cells.groupby(["attention", "label_alpha", "local_steps"], sort=True):
        tuned = group[group["column"] == "tuned"].iloc[0]
        best = group[group["column"] != "tuned"].loc[lambda d: d["gain_median"].idxmax()]
        o = oracle.loc[(attention, alpha, E)]
        lines.append(
            f"| {attention} | {alpha:g} | {E} | {tuned['tuned_fedavg_step']:g} | `c = {tuned['step_scale']:g}`, "
            f"`T0 = {int(tuned['T0'])}`: {_gain(tuned)}{mark(tuned)} ; {_gain_ci(tuned['excess_gain_median'])} | "
            f"`c = {best['column']}`: {_gain(best)}{mark(best)} ; {_gain_ci(best['excess_gain_median'])} ; "
            f"{best['accuracy_change_median']:+.1f} pp | {_gain_ci(o['gain_median'], wins=o['wins'], n=o['instances'])} ; "
            f"{_gain_ci(o['excess_gain_median'], o['excess_gain_low'], o['excess_gain_high'], o['excess_wins'], o['instances'])} ; "
            f"{o['accuracy_change_median']:+.1f} pp | {int(chaotic.loc[(attention, alpha, E), 'sum'])} of "
            f"{int(chaotic.loc[(attention, alpha, E), 'size'])} |")
    pays = steps[(steps["gain_median"] > 0.02) & (steps["accuracy_change_median"] >= 0)]
    tuned = cells[cells["column"] == "tuned"]
    own = tuned[(tuned["gain_median"] > 0.02) & (tuned["accuracy_change_median"] >= 0)]
    calm_pays = steps[(steps["gain_median_without_chaotic"] > 0.02) & (steps["accuracy_change_median_without_chaotic"] >= 0)]
    calm_own = tuned[(tuned["gain_median_without_chaotic"] > 0.02) & (tuned["accuracy_change_median_without_chaotic"] >= 0)]
    flagged = cells[cells["chaotic_instances"] > 0]
    design = runs[runs["role"] == "design"]
    unsure = tuned[tuned["design_chaotic_runs"] > 0]
    unsure_text = "; ".join(f"{r.attention}, `α = {r.label_alpha:g}`, `E = {r.local_steps}`" for r in unsure.itertuples()) or "none"
    linear = oracle[oracle.index.get_level_values("attention") == "linear"]
    pays_R = linear[linear["excess_gain_low"] > 0]
    spread = optima.groupby("seed")["optimum"].agg(lambda v: v.max() - v.min())
    return ("\n".join(lines) + f"\n\nGains over tuned FedAvg: median [bootstrap 95 % interval], wins above 2 % of "
            f"the held-out instances; `F` the final training objective, `R = F − Φ*_λ` for linear attention "
            f"(`Φ*_λ` per instance in `digits_phase_optimum.csv`; both label skews of a seed pool the same samples, "
            f"and their two estimates of its optimum differ by at most {spread.max():.1e}); accuracy: median change in points. "
            f"Of the {len(steps)} (cell, `c`) pairs, FedFrozen at its best `T0` (an oracle) has a median gain in `F` "
            f"above 2 % with a test accuracy not lower in **{len(pays)}**, all linear; with its own `(c, T0)` tuned on "
            f"the design seeds, in **{len(own)} of {len(tuned)}** cells. Oracle against oracle (FedFrozen at its "
            f"best `(c, T0)`, FedAvg at its best `c`, both chosen on each held-out instance), the median gain in `F` "
            f"is {100 * oracle['gain_median'].min():+.1f} to {100 * oracle['gain_median'].max():+.1f} %, and in `R` "
            f"(linear) its interval lies above zero in **{len(pays_R)}** of {len(linear)} cells. Chaotic "
            f"(docs/theory.md §6 \"Chaotic instances\": a 1e-12 move of `θ⁰` moves the end by more than 1e7 times that): "
            f"{int(held['chaotic'].sum())} of the {len(held)} held-out runs; ‡ marks a column in which FedFrozen's "
            f"compared run or tuned FedAvg's is chaotic for some instance, {int(flagged['chaotic_instances'].sum())} of "
            f"{int(cells['instances'].sum())} (column, instance) comparisons in {len(flagged)} of {len(cells)} columns "
            f"of {flagged[['attention', 'label_alpha', 'local_steps']].drop_duplicates().shape[0]} cells. Without those "
            f"instances (`digits_phase_cells.csv`, columns `*_without_chaotic`) FedFrozen at its best `T0` pays in "
            f"**{len(calm_pays)}** (cell, `c`) pairs and with its own tuned `(c, T0)` in **{len(calm_own)} of "
            f"{len(tuned)}** cells. The steps were chosen on design runs of which {int(design['chaotic'].sum())} of "
            f"{len(design)} are chaotic, in {len(unsure)} cells ({unsure_text}): there the tuned choices may move too "
            f"(`design_chaotic_runs`).\n")


def digits_oracle_gains(runs: pd.DataFrame, optima: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (attention, α, E) of ``digits_phase.csv``'s held-out runs, oracle against oracle: the gain
    ``1 − min_{c,T0} F / min_c F(T0 = T)`` of FedFrozen at its best ``(c, T0)`` over FedAvg at its best
    ``c``, each chosen on the held-out instance itself (median, wins above 2 %), the same gain in excess
    risk ``R = F − Φ*_λ`` where ``optima`` gives ``Φ*_λ`` (median with a bootstrap 95 % interval, wins)
    and the median change of the test accuracy between the two chosen runs (points)."""
    from .phase_diagram import bootstrap_median

    held = runs[runs["role"] == "heldout"].assign(F=lambda d: d["final_loss"].where(~d["diverged"], np.inf))
    held = held.merge(optima, on=["attention", "label_alpha", "seed"], how="left") if optima is not None \
        else held.assign(optimum=np.nan)
    T = int(runs["T0"].max())
    out = []
    for (attention, alpha, E), group in held.groupby(["attention", "label_alpha", "local_steps"], sort=True):
        frozen = group.sort_values(["F", "T0", "step_scale"]).groupby("seed").head(1).set_index("seed")
        fedavg = group[group["T0"] == T].sort_values(["F", "step_scale"]).groupby("seed").head(1).set_index("seed")
        frozen = frozen.reindex(fedavg.index)
        gain = 1.0 - frozen["F"] / fedavg["F"]
        excess = 1.0 - (frozen["F"] - frozen["optimum"]) / (fedavg["F"] - fedavg["optimum"])
        median, low, high = bootstrap_median(excess)
        out.append({"attention": attention, "label_alpha": alpha, "local_steps": E, "instances": len(gain),
                    "gain_median": float(np.median(gain)), "wins": int((gain > 0.02).sum()),
                    "excess_gain_median": median, "excess_gain_low": low, "excess_gain_high": high,
                    "excess_wins": int((excess > 0.02).sum()),
                    "accuracy_change_median": float(np.median(100 * (frozen["test_accuracy"] - fedavg["test_accuracy"])))})
    return pd.DataFrame(out)


_MAKERS = {"headline-caption": _phase_caption, "tradeoff-caption": _caption, "headline": _headline, "heatmaps": _heatmaps,
           "drift-scaling": _drift, "static-heads": _static, "softmax-static-heads": _softmax_static,
           "tradeoff-attention": _tradeoff_attention, "digits": _digits, "figure-times": _times,
           "figure-times-table": _times_table, "phase-diagram": _phase_diagram,
           "phase-diagram-arms": _phase_diagram_arms, "digits-phase": _digits_phase}


def blocks(figures="figures") -> dict[str, str]:
    """``{block name: Markdown}`` of every quoted block, from the CSVs in ``figures``.

    Parameters
    ----------
    figures : str or path-like, default "figures"
        The folder of the figures' CSVs.

    Returns
    -------
    dict of str to str
        The blocks' Markdown, by name.

    Examples
    --------
    >>> from linattn_theory.report.figures import find_root
    >>> from linattn_theory.report.figure_numbers import QUOTED_FILES, blocks
    >>> generated = blocks(find_root() / "figures")                 # the committed figures' CSVs
    >>> pages = "".join((find_root() / name).read_text() for name in QUOTED_FILES)
    >>> len(generated), all(f"<!-- BEGIN quoted: {name} -->" in pages for name in generated)
    (14, True)
    """
    figures = Path(figures)
    return {name: make(figures) for name, make in _MAKERS.items()}


def replace_blocks(text: str, generated: dict[str, str]) -> str:
    """``text`` with the body of every quoted block it has replaced by ``generated[name]``.

    Parameters
    ----------
    text : str
        A page with ``<!-- BEGIN quoted: NAME -->`` … ``<!-- END quoted: NAME -->`` blocks.
    generated : dict of str to str
        The new bodies (:func:`blocks`).

    Returns
    -------
    str
        The page.

    Examples
    --------
    >>> from linattn_theory.report.figure_numbers import replace_blocks
    >>> page = "intro\\n<!-- BEGIN quoted: demo -->\\nold\\n<!-- END quoted: demo -->\\n"
    >>> replace_blocks(page, {"demo": "new\\n"}).splitlines()
    ['intro', '<!-- BEGIN quoted: demo -->', 'new', '<!-- END quoted: demo -->']
    """
    return _BLOCK.sub(lambda m: m.group(1) + generated[m.group("name")] + m.group(4), text)


def main(argv=None) -> int:
    """Rewrite the quoted blocks of :data:`QUOTED_FILES` under the root (default: the checkout around
    the working directory, :func:`~linattn_theory.report.figures.find_root`).

    Parameters
    ----------
    argv : list of str, optional
        ``[ROOT]``, the checkout to rewrite; default the command line's.

    Returns
    -------
    int
        0 once every file is rewritten.

    Examples
    --------
    >>> import pathlib, shutil, tempfile
    >>> from linattn_theory.report.figures import find_root
    >>> from linattn_theory.report.figure_numbers import QUOTED_FILES, main
    >>> root = pathlib.Path(tempfile.mkdtemp())                      # a copy of the figures' CSVs
    >>> _ = shutil.copytree(find_root() / "figures", root / "figures", ignore=shutil.ignore_patterns("*.p*", "_*"))
    >>> (root / "docs").mkdir()
    >>> stale = "<!-- BEGIN quoted: figure-times -->\\nstale\\n<!-- END quoted: figure-times -->\\n"
    >>> for name in QUOTED_FILES:
    ...     _ = (root / name).write_text(stale)
    >>> main([str(root)])
    0
    >>> "stale" in (root / "README.md").read_text()
    False
    """
    import argparse

    from .figures import find_root

    parser = argparse.ArgumentParser(prog="python -m linattn_theory.report.figure_numbers",
                                     description="Rewrite the quoted blocks of " + ", ".join(QUOTED_FILES)
                                     + " from the committed figure CSVs (docs/theory.md §6).")
    parser.add_argument("root", nargs="?", default=None,
                        help="repository root holding figures/ and the quoted files (default: this checkout)")
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])
    root = Path(args.root) if args.root else find_root()
    generated = blocks(root / "figures")
    from ..core.io import atomic_write_text
    for name in QUOTED_FILES:
        path = root / name
        atomic_write_text(path, replace_blocks(path.read_text(), generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
