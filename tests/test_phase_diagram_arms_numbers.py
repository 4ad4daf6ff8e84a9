"""Every arm tuned and digits searched (issue 30, items 2 and 7): the committed statistics and what
docs/theory.md §6 says about them, recomputed from the per-instance rows (figures/phase_diagram_arms*.csv,
figures/digits_phase.csv) with plain pandas, not the code that wrote them."""

import itertools
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linattn_theory.core.io import read_csv_exact   # every float as written, whatever the pandas

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
CONFIGS = ROOT / "simulations" / "configs"


def _label(updates: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v:g}" for k, v in updates.items())


def _choose(R: pd.DataFrame) -> str:
    """The column of ``R`` (seeds × settings in grid order, ∞ for diverged) of fewest diverged seeds, then
    least median of R/min_row R, then the earlier one (report.tuning's declared rule)."""
    ratios = R.div(R.min(axis=1), axis=0)
    order = sorted(range(R.shape[1]), key=lambda j: (int(np.isinf(R.iloc[:, j]).sum()),
                                                     float(np.nanmedian(ratios.iloc[:, j])), j))
    return R.columns[order[0]]


# -- every arm tuned -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def arms():
    declared = tomllib.loads((CONFIGS / "phase_diagram_arms.toml").read_text())
    return (declared, read_csv_exact(FIGURES / "phase_diagram_arms.csv"),
            read_csv_exact(FIGURES / "phase_diagram_arms_design.csv"), read_csv_exact(FIGURES / "phase_diagram_arms_cells.csv"))


def test_every_arm_ran_its_declared_grid_and_holds_out_the_setting_its_design_seeds_chose(arms):
    declared, held, design, _ = arms
    assert sorted(design["seed"].unique()) == declared["design_seeds"]
    assert sorted(held["seed"].unique()) == declared["heldout_seeds"] and len(declared["heldout_seeds"]) >= 20
    for name, table in declared["arms"].items():
        grid = table["grid"]
        labels = [_label(dict(zip(grid, values))) for values in itertools.product(*grid.values())]
        for (zeta, E), part in design[design["arm"] == name].groupby(["zeta_value", "local_steps"]):
            assert list(part["setting"].drop_duplicates()) == labels
            R = part.assign(R=part["excess_risk"].where(~part["diverged"], np.inf)).pivot(
                index="seed", columns="setting", values="R")[labels]
            chosen = held[(held["arm"] == name) & (held["zeta_value"] == zeta) & (held["local_steps"] == E)]
            assert set(chosen["setting"]) == {_choose(R)}, (name, zeta, E)


def test_the_cells_statistics_follow_from_the_held_out_rows(arms):
    declared, held, _, cells = arms
    keys = ["seed", "zeta_value", "local_steps"]
    ref = held[held["arm"] == declared["reference"]].set_index(keys)
    for row in cells.itertuples():
        oracle = row.arm.endswith("_oracle")
        a = held[held["arm"] == (declared["reference"] if oracle else row.arm)].set_index(keys)
        a, t = a.xs((row.zeta_value, row.local_steps), level=(1, 2)), ref.xs((row.zeta_value, row.local_steps), level=(1, 2))
        R = np.where(a["diverged"], np.inf, a["oracle_best_iterate" if oracle else "excess_risk"])
        gain = pd.Series(1 - R / t["excess_risk"].to_numpy(), index=a.index)[~t["diverged"].to_numpy()]
        flagged = (a["diverged"] | t["diverged"] | a["chaotic"] | t["chaotic"])[gain.index]
        assert row.instances == len(gain) and row.flagged == int(flagged.sum())
        assert row.gain_median == pytest.approx(float(np.median(gain)), rel=1e-12, abs=1e-15)
        assert row.wins == int((gain > declared["threshold"]).sum())
        assert row.gain_median_clean == pytest.approx(float(np.median(gain[~flagged])), rel=1e-12, abs=1e-15)
        assert row.gain_low <= row.gain_median <= row.gain_high


def test_what_the_docs_say_about_every_arm_tuned(arms):
    """docs/theory.md §6 "Every arm tuned", in words."""
    declared, held, _, cells = arms
    c = cells.set_index(["arm", "local_steps"])
    # at E = 2 FedAdam and FedAvgM beat tuned FedAvg (intervals above 0) by more than tuned FedFrozen
    for arm in ("fedadam", "fedavgm"):
        assert c.loc[(arm, 2), "gain_low"] > 0
        assert c.loc[(arm, 2), "gain_median"] > c.loc[("fedfrozen", 2), "gain_median"]
    # ... and FedAdam beats FedFrozen on most held-out instances
    both = held[held["local_steps"] == 2].pivot_table(index="seed", columns="arm", values="excess_risk")
    assert (both["fedadam"] < both["fedfrozen"]).sum() > len(both) / 2
    # FedProx's tuned μ gains nothing; SCAFFOLD's median is positive at E = 2, negative at E = 10
    assert (c.loc["fedprox", "gain_median"] < declared["threshold"]).all()
    assert c.loc[("scaffold", 2), "gain_median"] > 0 > c.loc[("scaffold", 10), "gain_median"]
    # FedFrozen tuned without an oracle beats tuned FedAvg in both cells; the value solve by far more
    assert (c.loc["fedfrozen", "gain_low"] > 0).all()
    assert (c.loc["value_solve_final", "gain_median"] > 3 * c.loc["fedfrozen", "gain_median"]).all()
    # one instance, seed 19, has chaotic runs (FedAvg's at E = 10, FedProx's at both E); leaving it
    # out moves no median by 2 points
    chaotic = held[held["chaotic"]]
    assert set(chaotic["seed"]) == {19}
    assert set(chaotic[chaotic["arm"] == declared["reference"]]["local_steps"]) == {10}
    assert set(chaotic[chaotic["arm"] == "fedprox"]["local_steps"]) == {2, 10}
    assert ((cells["gain_median"] - cells["gain_median_clean"]).abs() < 0.02).all()
    # FedAdam's choice is a corner of its grid in both cells: the smallest client step, the largest server rate
    grid = declared["arms"]["fedadam"]["grid"]
    corner = _label({"federated.step_scale": min(grid["federated.step_scale"]),
                     "federated.server_learning_rate": max(grid["federated.server_learning_rate"])})
    assert (c.loc["fedadam", "setting"] == corner).all()


# -- digits, searched ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def digits():
    declared = tomllib.loads((CONFIGS / "digits_phase.toml").read_text())
    optima = read_csv_exact(FIGURES / "digits_phase_optimum.csv")
    runs = read_csv_exact(FIGURES / "digits_phase.csv").merge(optima, on=["attention", "label_alpha", "seed"], how="left")
    return declared, runs, read_csv_exact(FIGURES / "digits_phase_cells.csv", dtype={"column": str})


def test_the_digits_cells_follow_from_the_runs(digits):
    declared, runs, cells = digits
    T = declared["base"]["federated"]["rounds"]
    assert sorted(runs["step_scale"].unique()) == declared["step_scales"]
    assert sorted(runs["T0"].unique()) == declared["warmups"] and T in declared["warmups"]
    assert sorted(runs[runs["role"] == "heldout"]["seed"].unique()) == declared["heldout_seeds"]
    runs = runs.assign(F=runs["final_loss"].where(~runs["diverged"], np.inf))
    for (attention, alpha, E), group in runs.groupby(["attention", "label_alpha", "local_steps"]):
        design, held = group[group["role"] == "design"], group[group["role"] == "heldout"]
        fedavg = design[design["T0"] == T].pivot(index="seed", columns="step_scale", values="F")[declared["fedavg_steps"]]
        step = _choose(fedavg)
        frozen = design.assign(setting=list(zip(design["step_scale"], design["T0"]))).pivot(
            index="seed", columns="setting", values="F")[list(itertools.product(declared["step_scales"], declared["warmups"]))]
        own_c, own_T0 = _choose(frozen)
        ref = held[(held["step_scale"] == step) & (held["T0"] == T)].set_index("seed")
        mine = cells[(cells["attention"] == attention) & (cells["label_alpha"] == alpha) & (cells["local_steps"] == E)]
        assert (mine["tuned_fedavg_step"] == step).all()
        tuned = mine[mine["column"] == "tuned"].iloc[0]
        assert (tuned["step_scale"], tuned["T0"]) == (own_c, own_T0)
        for c in declared["step_scales"]:
            part = held[held["step_scale"] == c]
            best = part.sort_values(["F", "T0"]).groupby("seed").head(1).set_index("seed").reindex(ref.index)
            gain = 1 - best["F"] / ref["F"]
            row = mine[mine["column"] == f"{c:g}"].iloc[0]
            assert row["gain_median"] == pytest.approx(float(np.median(gain)), rel=1e-12, abs=1e-15)
            assert row["wins"] == int((gain > declared["threshold"]).sum())
            excess = 1 - (best["F"] - best["optimum"]) / (ref["F"] - ref["optimum"])
            if attention == "linear":
                assert row["excess_gain_median"] == pytest.approx(float(np.median(excess)), rel=1e-12, abs=1e-15)
                assert row["excess_wins"] == int((excess > declared["threshold"]).sum())
            else:
                assert np.isnan(row["excess_gain_median"])
            accuracy = 100 * (best["test_accuracy"] - ref["test_accuracy"])
            assert row["accuracy_change_median"] == pytest.approx(float(np.nanmedian(accuracy)) if accuracy.notna().any()
                                                                  else np.nan, abs=1e-12, nan_ok=True)


def test_every_linear_run_is_above_its_instances_optimum(digits):
    """Φ*_λ was started from the kernels of the instance's best runs: R = F − Φ*_λ ≥ 0 for every run."""
    _, runs, _ = digits
    linear = runs[(runs["role"] == "heldout") & (runs["attention"] == "linear") & ~runs["diverged"]]
    assert linear["optimum"].notna().all() and (linear["final_loss"] - linear["optimum"] > 0).all()


def test_what_the_docs_say_about_digits(digits):
    """docs/theory.md §6 "Digits, searched", in words."""
    declared, runs, cells = digits
    T, threshold = declared["base"]["federated"]["rounds"], declared["threshold"]
    steps = cells[cells["column"] != "tuned"]
    pays = steps[(steps["gain_median"] > threshold) & (steps["accuracy_change_median"] >= 0)]
    # softmax: nowhere (where its gain exceeds 2 %, its best T0 is T: FedAvg at another step)
    soft = steps[steps["attention"] == "softmax"]
    assert not (pays["attention"] == "softmax").any()
    assert (soft[soft["gain_median"] > threshold]["median_best_T0"] == T).all()
    # linear: at steps above tuned FedAvg's, up to 18 % in F and 18 points (α = 5, E = 2, c = 2.5)
    assert (pays["step_scale"] >= 1).all() and (pays["step_scale"] > pays["tuned_fedavg_step"]).all()
    top = pays.loc[pays["gain_median"].idxmax()]
    assert (top["label_alpha"], top["local_steps"], top["step_scale"]) == (5.0, 2, 2.5)
    assert round(100 * top["gain_median"]) == 18 and round(top["accuracy_change_median"]) == 18
    # oracle against oracle, per held-out instance: FedFrozen's best (c, T0) against FedAvg's best c
    held = runs[runs["role"] == "heldout"].assign(F=lambda d: d["final_loss"].where(~d["diverged"], np.inf))
    excess = {}
    for (attention, alpha, E), group in held.groupby(["attention", "label_alpha", "local_steps"]):
        frozen = group.loc[group.groupby("seed")["F"].idxmin()].set_index("seed")
        fedavg = group[group["T0"] == T]
        fedavg = fedavg.loc[fedavg.groupby("seed")["F"].idxmin()].set_index("seed")
        assert np.median(1 - frozen["F"] / fedavg["F"]) < threshold              # in F: below 2 % everywhere
        assert abs(np.median(100 * (frozen["test_accuracy"] - fedavg["test_accuracy"]))) < 1.0
        if attention == "linear":
            excess[alpha, E] = 1 - (frozen["F"] - frozen["optimum"]) / (fedavg["F"] - fedavg["optimum"])
    # in R (linear): E = 10 pays, 7 % at α = 5 and 4 % at α = 0.1, 4 of 6 instances above 2 % in each; not E = 2
    assert round(100 * np.median(excess[5.0, 10])) == 7 and round(100 * np.median(excess[0.1, 10])) == 4
    assert all((excess[a, 10] > threshold).sum() == 4 for a in (0.1, 5.0))
    assert all(np.median(excess[a, 2]) < threshold for a in (0.1, 5.0))
    from linattn_theory.report.phase_diagram import bootstrap_median   # the block's interval (its resampling)
    assert bootstrap_median(excess[5.0, 10])[1] > 0 and round(100 * bootstrap_median(excess[0.1, 10])[1]) == 0
    # tuned on the design seeds instead: FedFrozen pays in R at (α = 0.1, E = 10) only, one held-out run diverged
    tuned = cells[(cells["column"] == "tuned") & (cells["attention"] == "linear") & (cells["local_steps"] == 10)]
    tuned = tuned.set_index("label_alpha")
    assert tuned.loc[0.1, "excess_gain_median"] > threshold >= tuned.loc[5.0, "excess_gain_median"]
    assert tuned.loc[0.1, "diverged"] == 1
