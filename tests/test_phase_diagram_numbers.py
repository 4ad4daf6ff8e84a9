"""The phase diagram's committed statistics and every statement docs/theory.md §6 ("Where freezing
pays against tuned FedAvg") makes about them, recomputed from the per-instance rows
figures/phase_diagram.csv with plain pandas (not the code that wrote them)."""

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory.core.io import read_csv_exact   # every float as written, whatever the pandas

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
KEYS = ["role", "seed", "zeta_value", "local_steps", "step_scale"]


@pytest.fixture(scope="module")
def rows():
    return read_csv_exact(FIGURES / "phase_diagram.csv")


@pytest.fixture(scope="module")
def cells():
    return read_csv_exact(FIGURES / "phase_diagram_cells.csv", dtype={"column": str})


@pytest.fixture(scope="module")
def settings():
    return tomllib.loads((ROOT / "simulations" / "configs" / "phase_diagram.toml").read_text())


def _gain(rows, arm):
    """``1 − R_arm / R_tuned`` per (role, seed, ζ_V, E, c): −∞ for a diverged arm, NaN for a diverged tuned FedAvg."""
    a = rows[rows["arm"] == arm].set_index(KEYS)
    t = rows[rows["arm"] == "fedavg_tuned"].set_index(KEYS)
    R = np.where(a["diverged"], np.inf, a["excess_risk"])
    gain = pd.Series(np.where(t["diverged"], np.nan, 1 - R / t["excess_risk"].to_numpy()), index=a.index)
    flagged = a["diverged"] | t["diverged"] | a["chaotic"] | t["chaotic"]
    return pd.DataFrame({"gain": gain, "flagged": flagged, "diverged": a["diverged"]}).reset_index()


def _choose(design: pd.DataFrame) -> float:
    """A step of the design rows (columns seed, step_scale, R with ∞ for diverged): fewest diverged seeds,
    then least median of R(c)/min_c' R(c') over seeds, then the smaller step (report.tuning's rule)."""
    wide = design.pivot(index="seed", columns="step_scale", values="R")
    ratios = wide.div(wide.min(axis=1), axis=0)
    order = sorted(wide.columns, key=lambda c: (int(np.isinf(wide[c]).sum()), float(np.nanmedian(ratios[c])), c))
    return order[0]


def test_the_rows_are_the_declared_design(rows, settings):
    held = rows[rows["role"] == "heldout"]
    assert sorted(held["seed"].unique()) == settings["heldout_seeds"] and len(settings["heldout_seeds"]) >= 20
    assert sorted(rows[rows["role"] == "design"]["seed"].unique()) == settings["design_seeds"] == list(range(100, 105))
    assert sorted(rows["step_scale"].unique()) == settings["step_scales"] == [0.05, 0.15, 0.3, 0.45]
    assert sorted(rows["zeta_value"].unique()) == settings["zeta_value"] == [1.0, 2.0, 3.0]
    assert sorted(rows["local_steps"].unique()) == settings["local_steps"] == [2, 10]
    task, fed = settings["base"]["task"], settings["base"]["federated"]
    assert (task["samples_per_client"], task["tokens"], task["dim"], fed["rounds"]) == (64, 8, 6, 30)
    assert held.groupby(["zeta_value", "local_steps", "step_scale", "arm"]).size().eq(20).all()
    assert (rows["excess_risk"].isna() == rows["diverged"]).all()


def test_fedavg_is_tuned_on_the_design_seeds_only(rows):
    fedavg = rows[(rows["role"] == "design") & (rows["arm"] == "fedavg")]
    tuned = rows[rows["arm"] == "fedavg_tuned"].groupby(["zeta_value", "local_steps"])["step"].agg(["min", "max"])
    assert (tuned["min"] == tuned["max"]).all()                       # one tuned step per (ζ_V, E)
    for (zeta, E), design in fedavg.groupby(["zeta_value", "local_steps"]):
        design = design.assign(R=design["excess_risk"].where(~design["diverged"], np.inf))
        assert _choose(design) == tuned.loc[(zeta, E), "min"]


def test_cell_statistics_recomputed(rows, cells):
    for arm in ("fedfrozen_best", "value_solve_final", "fedavg", "fedfrozen_online"):
        g = _gain(rows, arm)
        held = g[g["role"] == "heldout"]
        for (zeta, E, c), part in held.groupby(["zeta_value", "local_steps", "step_scale"]):
            row = cells[(cells["arm"] == arm) & (cells["zeta_value"] == zeta) & (cells["local_steps"] == E)
                        & (cells["column"] == f"{c:g}")].iloc[0]
            valid = part.dropna(subset=["gain"])
            clean = valid[~valid["flagged"]]
            assert (row["instances"], row["wins"], row["diverged"]) == (len(valid), int((valid["gain"] > 0.02).sum()),
                                                                        int(valid["diverged"].sum()))
            assert (row["n_clean"], row["wins_clean"]) == (len(clean), int((clean["gain"] > 0.02).sum()))
            assert row["gain_median"] == pytest.approx(np.median(valid["gain"]), rel=1e-12)
            if len(clean):
                assert row["gain_median_clean"] == pytest.approx(np.median(clean["gain"]), rel=1e-12)
            assert row["gain_low"] <= row["gain_median"] <= row["gain_high"]


def test_the_tuned_column_is_the_arms_own_design_choice(rows, cells):
    for arm in ("fedfrozen_best", "value_solve_final", "fedfrozen_online"):
        design = rows[(rows["role"] == "design") & (rows["arm"] == arm)]
        for (zeta, E), part in design.groupby(["zeta_value", "local_steps"]):
            c = _choose(part.assign(R=part["excess_risk"].where(~part["diverged"], np.inf)))
            tuned = cells[(cells["arm"] == arm) & (cells["zeta_value"] == zeta) & (cells["local_steps"] == E)
                          & (cells["column"] == "tuned")].iloc[0]
            same = cells[(cells["arm"] == arm) & (cells["zeta_value"] == zeta) & (cells["local_steps"] == E)
                         & (cells["column"] == f"{c:g}")].iloc[0]
            assert tuned["step_scale"] == c and tuned["gain_median"] == same["gain_median"]


def test_predictor_score_recomputed(rows):
    from scipy.stats import mannwhitneyu

    score = read_csv_exact(FIGURES / "phase_diagram_predictor.csv").set_index("subset")
    g = _gain(rows, "fedfrozen_best")
    info = rows[rows["arm"] == "fedfrozen_best"].set_index(KEYS)[["margin", "drift_share", "predicted_pays"]]
    g = g.join(info, on=KEYS)
    g = g[(g["role"] == "heldout") & g["gain"].notna()]
    # the predictor is the declared rule: pays iff c > 1/3 (the margin is 2 − 2c)
    np.testing.assert_allclose(g["margin"], 2 - 2 * g["step_scale"], rtol=1e-12)
    assert (g["predicted_pays"] == (g["step_scale"] > 1 / 3)).all()
    for subset, part in (("all", g), ("clean", g[~g["flagged"]])):
        label, pred = part["gain"].to_numpy() > 0.02, part["predicted_pays"].to_numpy()
        s = score.loc[subset]
        assert (s["instances"], s["positives"], s["true_positives"]) == (len(part), label.sum(), (pred & label).sum())
        assert s["accuracy"] == pytest.approx(np.mean(pred == label), rel=1e-12)
        for column, values in (("auc_step", 2 - part["margin"]), ("auc_drift_share", part["drift_share"])):
            u = mannwhitneyu(values[label], values[~label]).statistic
            assert s[column] == pytest.approx(u / (label.sum() * (~label).sum()), rel=1e-12)
    R = {arm: rows[rows["arm"] == arm].set_index(KEYS)["excess_risk"] for arm in ("fedfrozen_best", "fedfrozen_predicted")}
    idx = pd.MultiIndex.from_frame(g[KEYS])
    regret = R["fedfrozen_predicted"].reindex(idx).fillna(np.inf) / R["fedfrozen_best"].reindex(idx) - 1
    assert score.loc["all", "regret_median"] == pytest.approx(np.median(regret), rel=1e-12)
    assert (regret >= -1e-12).all()                                    # the best T0 is the best


def test_attribution_recomputed_and_exact(rows):
    from linattn_theory.report.figure_numbers import dominant_parts

    a = read_csv_exact(FIGURES / "phase_diagram_attribution.csv")
    g = _gain(rows, "fedfrozen_best")
    wins = g[(g["role"] == "heldout") & ~g["flagged"] & (g["gain"] > 0.02)]
    assert len(a) == len(wins)
    ok = a[~a["fedavg_diverged"]]
    # the exact decomposition: gap = step + late rise + value part, to rounding of R (docs/theory.md §6)
    scale = rows["excess_risk"].abs().max()
    np.testing.assert_allclose(ok["step"] + ok["late_rise"] + ok["value"], ok["gap"], atol=1e-9 * scale)
    split = ok.dropna(subset=["drift_floor"])
    np.testing.assert_allclose(split["drift_floor"] + split["unfinished"], split["value"], atol=1e-9 * scale)
    kinds = dominant_parts(a)
    independent = []
    for r in a.itertuples():
        parts = {"step": r.step, "late_rise": r.late_rise}
        parts.update({"drift_floor": r.drift_floor, "unfinished": r.unfinished} if np.isfinite(r.drift_floor)
                     else {"value": r.value})
        independent.append("FedAvg diverged" if r.fedavg_diverged else max(parts, key=parts.get))
    assert list(kinds) == independent


def test_the_words_of_docs_theory_section_6(rows, cells):
    """Each statement of the "In words" paragraph, as an inequality on the committed numbers."""
    from linattn_theory.report.figure_numbers import dominant_parts

    tuned = cells[cells["column"] == "tuned"].set_index(["arm", "local_steps", "zeta_value"])["gain_median"]
    ff = tuned.loc["fedfrozen_best"]
    assert (ff.loc[2] > 0.02).all()                                            # pays at E = 2, every ζ_V
    assert (ff.loc[10].loc[[2.0, 3.0]] > 0.02).all() and ff.loc[(10, 1.0)] <= 0.02   # E = 10: ζ_V ≥ 2, not 1
    steps = sorted(rows["step_scale"].unique())
    fedavg_steps = rows[(rows["arm"] == "fedavg_tuned") & (rows["local_steps"] == 2)]["step"]
    assert (fedavg_steps >= steps[-2]).all()                                   # at or next to the grid's largest
    edge = cells[(cells["arm"] == "fedfrozen_best") & (cells["column"] == f"{steps[-1]:g}") & (cells["local_steps"] == 10)]
    assert (edge["gain_median"] < 0).all()                                     # near the edge freezing loses
    a = read_csv_exact(FIGURES / "phase_diagram_attribution.csv")
    ok = a[~a["fedavg_diverged"]]
    assert (ok["late_rise"] < 0).mean() > 0.5                                  # FedAvg's kernel usually better
    kinds = dominant_parts(a).value_counts()
    assert kinds.index[0] == "unfinished" and 0.4 <= kinds.iloc[0] / kinds.sum() <= 0.6   # most frequent, about half
    vs = tuned.loc["value_solve_final"]
    assert (vs > 0.02).all() and (vs > ff).all()                               # the value solve, everywhere, more
    assert (tuned.loc["fedavg_tuned_oracle"] <= 0.05).all()                    # hardly any late rise to stop
    score = read_csv_exact(FIGURES / "phase_diagram_predictor.csv").set_index("subset").loc["all"]
    base = 1 - score["positives"] / score["instances"]
    assert base < score["accuracy"] < base + 0.05                              # barely better than "no"


def test_the_words_about_the_online_rule(rows, cells):
    """docs/theory.md §6 on the online rule's realised run (fedfrozen_online), each statement an inequality
    on the committed rows: it captures part of the oracle's gain, waits, and does not rescue the edge."""
    tuned = cells[cells["column"] == "tuned"].set_index(["arm", "local_steps", "zeta_value"])
    best, online = tuned.loc["fedfrozen_best"], tuned.loc["fedfrozen_online"]
    pays = best.index[best["gain_median"] > 0.02]
    assert (online["gain_median"] > 0).all()                                   # positive in every cell
    assert (online.loc[pays, "gain_median"] < best.loc[pays, "gain_median"]).all()   # below the oracle where it pays
    share = online.loc[pays, "gain_median"] / best.loc[pays, "gain_median"]
    half = [(2, 1.0), (2, 2.0), (10, 2.0), (10, 3.0)]
    assert share.loc[half].round(2).between(0.45, 0.68).all() and share.loc[(2, 3.0)] < 0.1   # 45–68 %; almost none
    assert online.loc[(2, 3.0), "step_scale"] == 0.3                           # its design seeds chose c = 0.3 there
    at_edge = cells[(cells["arm"] == "fedfrozen_online") & (cells["local_steps"] == 2) & (cells["zeta_value"] == 3)
                    & (cells["column"] == "0.45")].iloc[0]
    assert round(at_edge["gain_median"], 2) == 0.10                            # "about 10 %" at c = 0.45
    assert (online["gain_low"] <= 0).sum() == len(online) - 1                  # intervals reach 0 in all cells but one
    assert (online.loc[pays, "wins"].min(), online.loc[pays, "wins"].max()) == (9, 15)
    assert (best.loc[pays, "wins"].min(), best.loc[pays, "wins"].max()) == (15, 19)
    held = rows[rows["role"] == "heldout"]
    for (E, zeta), row in online.iterrows():
        at = held[(held["local_steps"] == E) & (held["zeta_value"] == zeta) & (held["step_scale"] == row["step_scale"])]
        decided, oracle = at[at["arm"] == "fedfrozen_online"]["T0"], at[at["arm"] == "fedfrozen_best"]["T0"]
        assert 6 <= (decided == 30).sum() <= 10                                # never freezes on 6–10 of 20
        assert np.median(decided) > np.median(oracle)                          # decides later than the best T0
    same = [row["step_scale"] == held[(held["arm"] == "fedavg_tuned") & (held["local_steps"] == E)
                                      & (held["zeta_value"] == z)]["step"].iloc[0] for (E, z), row in online.iterrows()]
    assert sum(same) > len(same) / 2                                           # mostly FedAvg's own tuned step
    edge = held[(held["local_steps"] == 10) & (held["step_scale"] == 0.45)]
    counts = {arm: edge[edge["arm"] == arm].groupby("zeta_value")["diverged"].sum()
              for arm in ("fedfrozen_online", "fedavg", "fedfrozen_best")}
    assert (counts["fedfrozen_online"].min(), counts["fedfrozen_online"].max()) == (11, 16)
    assert (counts["fedavg"].min(), counts["fedavg"].max()) == (12, 16) and counts["fedfrozen_best"].sum() == 0
