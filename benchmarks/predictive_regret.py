"""Do the warm-up recommenders predict? Regret on held-out instances (docs/theory.md §6, §8).

Two declared, disjoint sets of instances, fixed in this file:

* the **design** set (seeds ``DESIGN_SEEDS``): the online rule's window and horizon were chosen on
  it (docs/theory.md §8), and the transfer recommender reads it;
* the **evaluation** set (seeds ``EVALUATION_SEEDS``, same grid): played no part in designing or
  tuning anything; the scores quoted in the docs are computed on it.

The grid (``FAMILIES``): both task families, three heterogeneity levels, three values of ``E``,
two step sizes, ``T = 40`` rounds. Per instance the truth is ``R(T0)`` for every ``T0`` from one
warm-up sweep against one centralised optimum (:func:`linattn_theory.recommenders.scoring.instance_truth`);
each recommender is scored by its regret ``R(T0_rec)/R(T0_best) − 1``:

* ``online`` (causal): :func:`linattn_theory.recommenders.online.run_online`, realised ``R`` of its own
  run (roll-backs included);
* ``pilot``: the bound fitted on the first ``T/4`` rounds, extrapolated;
* ``transfer``: the median a-posteriori ``T0`` of the design seeds of the same setting;
* ``a_posteriori`` (descriptive, in-sample): the bound fitted on the whole path it is judged on;
* baselines: plain FedAvg (``T0 = T``), fixed ``T0 = T/2`` and the cross-seed oracle (the best
  ``T0`` of the next evaluation seed of the same setting).

Per-instance records are cached as JSON (atomic writes) under ``--cache``: an interrupted run
resumes, and a second run only re-tabulates. Results in ``<out>``: ``predictive_regret_scores.csv``
(a row per instance and recommender), ``predictive_regret_summary.csv``, ``predictive_regret_design.csv``
(candidate online rules on the design set), ``predictive_regret.md`` (the tables) and the figure
``predictive_regret.png`` (+ PDF, and ``predictive_regret.csv`` with its plotted numbers).

Run:  python benchmarks/predictive_regret.py [--quick] [--workers 2] [--out figures]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from linattn_theory.sim.config import config_from_dict, config_hash  # noqa: E402
from linattn_theory.core.io import atomic_write_text, write_json  # noqa: E402
from linattn_theory.recommenders.scoring import regret  # noqa: E402

DESIGN_SEEDS = (1000, 1001, 1002)
EVALUATION_SEEDS = (2000, 2001, 2002, 2003, 2004)
#: The same grid with softmax attention (docs/theory.md §9), evaluation only: does the rule,
#: designed on linear attention, transfer? (Its transfer recommender reads the linear design seeds.)
SOFTMAX_SEEDS = (2000, 2001, 2002)
SETS = {"evaluation": "Evaluation set (linear attention)",
        "evaluation_softmax": "Softmax evaluation set (the same grid with softmax attention, τ = 1)"}

#: Base settings (the figures' instances: simulations/configs/tradeoff.toml and
#: in_context_regression.toml) and the grid over heterogeneity, E and η per family.
FAMILIES = {
    "planted_kernel": {
        "task": {"family": "planted_kernel", "num_clients": 8, "samples_per_client": 128, "tokens": 16,
                 "dim": 8, "rank": 3, "outputs": 2, "zeta_covariate": 0.5, "noise": 0.1},
        "model": {"heads": 1, "rank": 3},
        "federated": {"rounds": 40},
        "heterogeneity": ("task.zeta_value", (1.0, 2.0, 3.0)),
        "local_steps": (2, 10, 20),
        "learning_rate": (0.01, 0.02),
    },
    "in_context_regression": {
        "task": {"family": "in_context_regression", "num_clients": 8, "samples_per_client": 128, "tokens": 16,
                 "dim": 4, "zeta_covariate": 0.5},
        "model": {"heads": 1, "rank": 5},
        "federated": {"rounds": 40, "ridge": 0.001},
        "heterogeneity": ("task.zeta_task", (0.25, 0.5, 1.0)),
        "local_steps": (5, 10, 20),
        "learning_rate": (0.005, 0.01),
    },
}

#: --quick: small instances, one setting per family, for the tests (a smoke test, not a score).
QUICK = {"task": {"samples_per_client": 32, "tokens": 8}, "federated": {"rounds": 12},
         "heterogeneity": -1, "local_steps": (10,), "learning_rate": 0, "design": (1000,),
         "evaluation": (2000, 2001), "softmax": (2000,)}

RECOMMENDERS = ("online", "pilot", "transfer", "a_posteriori")
BASELINES = ("fedavg", "half", "cross_seed_oracle")
LABELS = {"online": "online (causal)", "pilot": "pilot (T/4 rounds)", "transfer": "transfer (design seeds)",
          "a_posteriori": "a posteriori fit (descriptive)", "fedavg": "FedAvg (T0 = T)",
          "half": "fixed T0 = T/2", "cross_seed_oracle": "cross-seed oracle"}


def settings(quick: bool = False):
    """Every setting of the grid as ``(family, heterogeneity, E, η, config dict without seed)``."""
    for family, spec in FAMILIES.items():
        key, levels = spec["heterogeneity"]
        steps, rates = spec["local_steps"], spec["learning_rate"]
        task, fed = dict(spec["task"]), dict(spec["federated"])
        if quick:
            levels, steps, rates = (levels[QUICK["heterogeneity"]],), QUICK["local_steps"], (rates[QUICK["learning_rate"]],)
            task.update(QUICK["task"])
            fed.update(QUICK["federated"])
        for level, E, eta in itertools.product(levels, steps, rates):
            data = {"task": dict(task, **{key.split(".")[1]: level}), "model": dict(spec["model"]),
                    "federated": dict(fed, strategy="fedfrozen", warmup_rounds=0, local_steps=E,
                                      learning_rate=eta)}
            yield family, level, E, eta, data


def instances(quick: bool = False) -> pd.DataFrame:
    """The declared instances: one row per (set, setting, seed) with its config dict."""
    design = QUICK["design"] if quick else DESIGN_SEEDS
    evaluation = QUICK["evaluation"] if quick else EVALUATION_SEEDS
    softmax = QUICK["softmax"] if quick else SOFTMAX_SEEDS
    assert not set(design) & (set(evaluation) | set(softmax)), "design and evaluation seeds must be disjoint"
    rows = []
    for setting, (family, level, E, eta, data) in enumerate(settings(quick)):
        for name, seeds in (("design", design), ("evaluation", evaluation), ("evaluation_softmax", softmax)):
            for seed in seeds:
                model = dict(data["model"], attention="softmax") if name == "evaluation_softmax" else data["model"]
                config = config_from_dict({**data, "model": model, "seed": seed})
                rows.append({"set": name, "setting": setting, "family": family, "heterogeneity": level,
                             "local_steps": E, "learning_rate": eta, "seed": seed,
                             "key": config_hash(config), "config": config.to_dict()})
    return pd.DataFrame(rows)


def _cached(path: str, keep_forecasts: bool) -> bool:
    target = Path(path)
    return target.exists() and (not keep_forecasts or "freeze_objective" in json.loads(target.read_text()))


def _score(config_dict: dict, path: str, keep_forecasts: bool) -> str:
    """Worker: score one instance and write its record atomically (skipped when cached)."""
    import warnings

    from linattn_theory.recommenders.scoring import score_instance
    if not _cached(path, keep_forecasts):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            record = score_instance(config_from_dict(config_dict), keep_forecasts=keep_forecasts)
        write_json(Path(path), record)
    return path


def compute(table: pd.DataFrame, cache: Path, workers: int) -> dict:
    """Records of every instance (cached); returns ``{key: record}``."""
    from joblib import Parallel, delayed
    from tqdm.auto import tqdm

    cache.mkdir(parents=True, exist_ok=True)
    paths = {key: str(cache / f"{key}.json") for key in table["key"]}
    todo = [(cfg, paths[key], name == "design")
            for key, cfg, name in zip(table["key"], table["config"], table["set"])
            if not _cached(paths[key], name == "design")]
    if todo:
        jobs = (delayed(_score)(cfg, path, keep) for cfg, path, keep in todo)
        for _ in tqdm(Parallel(n_jobs=workers, return_as="generator")(jobs), total=len(todo),
                      desc="instances", unit="instance"):
            pass
    return {key: json.loads(Path(path).read_text()) for key, path in paths.items()}


def score_table(table: pd.DataFrame, records: dict) -> pd.DataFrame:
    """One row per instance and recommender/baseline: recommended and best ``T0``, regret."""
    rows = []
    design = table[table["set"] == "design"]
    for _, inst in table.iterrows():
        rec = records[inst["key"]]
        R = np.asarray(rec["excess_risk"], dtype=float)
        T = len(R) - 1
        base = {k: inst[k] for k in ("set", "setting", "family", "heterogeneity", "local_steps",
                                     "learning_rate", "seed")}
        base.update(best_T0=rec["best_T0"], u_shaped=rec["u_shaped"], fedavg_diverged=rec["fedavg_diverged"])
        if rec["fedavg_diverged"]:
            rows.append({**base, "recommender": "none", "T0": np.nan, "stop_round": np.nan, "regret": np.nan})
            continue
        same = design[(design["setting"] == inst["setting"]) & (design["seed"] != inst["seed"])]
        fitted = [records[k].get("a_posteriori_T0") for k in same["key"]]
        fitted = [t for t in fitted if t is not None]
        peers = table[(table["setting"] == inst["setting"]) & (table["set"] == inst["set"])]
        seeds = sorted(peers["seed"])
        other = seeds[(seeds.index(inst["seed"]) + 1) % len(seeds)]
        oracle = records[peers.loc[peers["seed"] == other, "key"].iloc[0]]["best_T0"]
        choices = {"online": (rec["online_T0"], rec["online_risk"]),
                   "pilot": (rec["pilot_T0"], R[rec["pilot_T0"]]),
                   "a_posteriori": (rec["a_posteriori_T0"], R[rec["a_posteriori_T0"]]),
                   "fedavg": (T, R[T]), "half": (T // 2, R[T // 2]),
                   "cross_seed_oracle": (oracle, R[oracle])}
        if fitted:
            t0 = int(np.round(np.median(fitted)))
            choices["transfer"] = (t0, R[t0])
        for name, (T0, risk) in choices.items():
            rows.append({**base, "recommender": name, "T0": int(T0),
                         "stop_round": rec["online_stop_round"] if name == "online" else int(T0),
                         "regret": regret(risk, R)})
    return pd.DataFrame(rows)


class _StoredForecast:
    """A :class:`~linattn_theory.recommenders.online.FreezeForecast` replayed from a stored record:
    ``rows[s][t − s] = J(s, T − t) − Φ*_λ`` for ``t ≥ s``."""

    def __init__(self, rows, s: int):
        self.round, self._row, self._T = s, np.asarray(rows[s], dtype=float), len(rows) - 1

    def final_objective(self, k):
        return self._row[self._T - np.asarray(k) - self.round]


def _patience_rule(forecasts, T: int, patience: int):
    """Stop after ``patience`` rounds without a new lowest ``R_freeze``; roll back to the best option."""
    t = len(forecasts) - 1
    risk = [f.final_objective(T - f.round) for f in forecasts]
    now = [f.final_objective(T - t) for f in forecasts]
    s = int(np.argmin(now)) if t < T else T
    return t == T or t - int(np.argmin(risk)) >= patience, s


def _trend_rule(forecasts, T: int, window: int):
    """Escape guard, then stop as soon as the ``window``-round trend of ``R_freeze`` is not falling."""
    from linattn_theory.recommenders.online import _trend
    t = len(forecasts) - 1
    risk = np.array([f.final_objective(T - f.round) for f in forecasts])
    now = [f.final_objective(T - t) for f in forecasts]
    s = int(np.argmin(now)) if t < T else T
    below = np.flatnonzero(risk < risk[0])
    if t == T:
        return True, s
    if len(below) == 0 or t < below[0] + window:
        return False, s
    return _trend(risk[t - window:]) >= 0, s


#: Candidate online rules compared on the design set (docs/theory.md §8, "How the rule was designed").
def design_candidates():
    from linattn_theory.recommenders.online import online_decision

    def gain_cost(w, h):
        return lambda fc, T: (lambda d: (d.stop, d.kernel_round))(online_decision(fc, T, w, h))
    candidates = {f"patience {p}": (lambda p: lambda fc, T: _patience_rule(fc, T, p))(p) for p in (1, 3, 5, 8)}
    candidates.update({f"trend w={w}": (lambda w: lambda fc, T: _trend_rule(fc, T, w))(w) for w in (3, 4, 5, 6)})
    candidates.update({f"gain vs cost w={w} h={h}": gain_cost(w, h) for w in (3, 4, 5, 6, 8) for h in (1, 2, 3)})
    return candidates


def design_table(table: pd.DataFrame, records: dict) -> pd.DataFrame:
    """Regret of every candidate rule on the design instances, replayed from the stored forecasts."""
    rows = []
    design = table[table["set"] == "design"]
    for name, rule in design_candidates().items():
        regrets = []
        for key in design["key"]:
            rec = records[key]
            if rec["fedavg_diverged"]:
                continue
            stored = rec["freeze_objective"]
            T = len(stored) - 1
            forecasts = []
            for t in range(T + 1):
                forecasts.append(_StoredForecast(stored, t))
                stop, s = rule(forecasts, T)
                if stop:
                    break
            regrets.append(regret(stored[s][t - s], rec["excess_risk"]))
        r = np.asarray(regrets)
        rows.append({"rule": name, "instances": len(r), "median": np.median(r), "mean": np.mean(r),
                     "p90": np.percentile(r, 90), "max": np.max(r)})
    return pd.DataFrame(rows)


def design_markdown(design: pd.DataFrame) -> str:
    lines = [f"Design set ({int(design['instances'].iloc[0])} instances): candidate online rules, regret in "
             f"percent (the chosen rule: gain vs cost, w = 5, h = 3).", "",
             "| rule | median | mean | 90th pct | max |", "|---|---|---|---|---|"]
    for _, r in design.iterrows():
        lines.append(f"| {r['rule']} | {100 * r['median']:.1f} | {100 * r['mean']:.1f} | {100 * r['p90']:.1f} | "
                     f"{100 * r['max']:.1f} |")
    return "\n".join(lines) + "\n"


def summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Per set, recommender and subset (all / U-shaped): count, median, mean, 90th percentile and
    max regret, the share with regret ≤ 5 %, and a bootstrap 95 % interval of the median."""
    rng = np.random.default_rng(0)
    rows = []
    valid = scores[scores["recommender"] != "none"]
    for (name, rec), group in valid.groupby(["set", "recommender"], sort=False):
        for subset, part in (("all", group), ("u_shaped", group[group["u_shaped"]])):
            r = part["regret"].to_numpy()
            if len(r) == 0:
                continue
            boot = np.median(rng.choice(r, size=(2000, len(r))), axis=1)
            order = dict(method="higher")     # order statistics: a diverged run (regret ∞) stays ∞
            rows.append({"set": name, "recommender": rec, "subset": subset, "instances": len(r),
                         "median": np.percentile(r, 50, **order), "median_low": np.percentile(boot, 2.5, **order),
                         "median_high": np.percentile(boot, 97.5, **order), "mean": np.mean(r),
                         "p90": np.percentile(r, 90, **order), "max": np.max(r),
                         "share_within_5pct": np.mean(r <= 0.05), "diverged": int(np.sum(~np.isfinite(r)))})
    table = pd.DataFrame(rows)
    order = {name: i for i, name in enumerate(RECOMMENDERS + BASELINES)}
    return table.sort_values(["set", "recommender", "subset"], key=lambda c: c.map(order) if c.name == "recommender"
                             else c, kind="stable").reset_index(drop=True)


def markdown(summ: pd.DataFrame, scores: pd.DataFrame, name: str = "evaluation") -> str:
    """The table of evaluation set ``name`` as Markdown (regrets in percent)."""
    ev = summ[summ["set"] == name]
    inst = scores[(scores["set"] == name)].drop_duplicates(["setting", "seed"])
    lines = [f"{SETS[name]}: {len(inst)} instances ({int(inst['fedavg_diverged'].sum())} with a diverging "
             f"FedAvg path, not scored), {int(inst['u_shaped'].sum())} with a U-shaped R(T0) "
             f"(both ends ≥ 5 % above the best T0). Regret R(T0_rec)/R(T0_best) − 1 in percent; "
             f"median with a bootstrap 95 % interval; a recommended T0 whose run diverges has regret ∞ "
             f"(counted under 'diverged').", "",
             "| recommender | subset | n | median [95 % CI] | mean | 90th pct | max | ≤ 5 % | diverged |",
             "|---|---|---|---|---|---|---|---|---|"]
    pct = lambda v: "∞" if not np.isfinite(v) else f"{100 * v:.1f}"  # noqa: E731
    for _, r in ev.iterrows():
        lines.append(f"| {LABELS[r['recommender']]} | {r['subset'].replace('_', '-')} | {r['instances']} | "
                     f"{pct(r['median'])} [{pct(r['median_low'])}, {pct(r['median_high'])}] | "
                     f"{pct(r['mean'])} | {pct(r['p90'])} | {pct(r['max'])} | "
                     f"{100 * r['share_within_5pct']:.0f} % | {int(r['diverged'])} |")
    scored = scores[(scores["set"] == name) & (scores["recommender"] != "none")]
    paired = scored.pivot_table(index=["setting", "seed"], columns="recommender", values="regret")
    lines += ["", "Paired, per instance of this set: the online rule against each other choice "
              "(better / tied within 1e-9 / worse regret):", "",
              "| against | instances | online better | tied | online worse | better on U-shaped |",
              "|---|---|---|---|---|---|"]
    shaped = scored.drop_duplicates(["setting", "seed"]).set_index(["setting", "seed"])["u_shaped"]
    for other in [r for r in RECOMMENDERS + BASELINES if r != "online" and r in paired]:
        both = paired[["online", other]].dropna()
        d = both["online"].to_numpy() - both[other].to_numpy()
        d = np.where(np.isnan(d), 0.0, d)      # both ∞ (both diverged) counts as tied
        u = shaped.loc[both.index].to_numpy()
        lines.append(f"| {LABELS[other]} | {len(both)} | {int(np.sum(d < -1e-9))} | {int(np.sum(np.abs(d) <= 1e-9))} | "
                     f"{int(np.sum(d > 1e-9))} | {int(np.sum((d < -1e-9) & u))} of {int(u.sum())} |")
    lines += ["", "U-shaped R(T0) in this set (instances with both ends ≥ 5 % above the best T0, "
              "of all scored instances; both step sizes):", "",
              "| family | heterogeneity | " + " | ".join(f"E = {E}" for E in sorted(inst["local_steps"].unique())) + " |",
              "|---|---|" + "---|" * inst["local_steps"].nunique()]
    for (family, level), part in inst.groupby(["family", "heterogeneity"]):
        cells = []
        for E in sorted(inst["local_steps"].unique()):
            sub = part[(part["local_steps"] == E) & ~part["fedavg_diverged"]]
            cells.append(f"{int(sub['u_shaped'].sum())}/{len(sub)}" if len(sub) else "–")
        lines.append(f"| {family} | {level:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report(scores: pd.DataFrame, design: pd.DataFrame) -> str:
    """``predictive_regret.md``: the evaluation table, the U-shape counts and the design table."""
    summ = summary(scores)
    parts = [markdown(summ, scores, name) for name in SETS if name in set(scores["set"])]
    return "\n".join(parts) + "\n" + design_markdown(design)


def plot(scores: pd.DataFrame, records: dict, table: pd.DataFrame, out: Path, quick: bool) -> None:
    """Recommended vs best ``T0`` (y = x) per recommender, the regret distributions, and the
    online rule's worst evaluation instance (``R(T0)`` with its stop and the best ``T0``)."""
    import matplotlib.pyplot as plt

    from linattn_theory.report import plotting

    ev = scores[(scores["set"] == "evaluation") & (scores["recommender"] != "none")]
    diverged = ev[~np.isfinite(ev["regret"])]
    ev = ev[np.isfinite(ev["regret"])]
    plotting.apply_style()
    with plt.rc_context({"font.size": 7, "axes.titlesize": 7, "axes.labelsize": 7, "xtick.labelsize": 7,
                         "ytick.labelsize": 7, "legend.fontsize": 7}):
        fig, axes = plt.subplots(2, 3, figsize=(7.0, 4.8), layout="constrained")
        axes = axes.ravel()
        colors = plotting.palette(3)
        T = int(ev["T0"].max()) if len(ev) else 1
        for ax, rec in zip(axes[:4], RECOMMENDERS):
            part = ev[ev["recommender"] == rec]
            for u, color, text in ((False, colors[1], "not U-shaped"), (True, colors[0], "U-shaped")):
                sub = part[part["u_shaped"] == u]
                jitter = np.random.default_rng(1).uniform(-0.3, 0.3, len(sub))
                ax.scatter(sub["best_T0"] + jitter, sub["T0"], s=6, color=color, alpha=0.7, label=text,
                           linewidths=0)
            ax.plot([0, T], [0, T], color="0.5", lw=0.8, ls="--")
            ax.set(xlabel="best $T_0$ (truth)", ylabel="recommended $T_0$", title=LABELS[rec],
                   xlim=(-1, T + 1), ylim=(-1, T + 1))
        axes[0].legend(loc="upper left", frameon=False, handletextpad=0.1)
        ax = axes[4]
        order = list(RECOMMENDERS) + list(BASELINES)
        data = [100 * ev.loc[ev["recommender"] == r, "regret"].to_numpy() for r in order]
        ax.boxplot(data, orientation="horizontal", whis=(0, 100), widths=0.6, flierprops={"markersize": 2})
        ax.set_yticks(range(1, len(order) + 1), [LABELS[r].replace(" (", "\n(") for r in order])
        ax.invert_yaxis()
        ax.set_xscale("symlog", linthresh=1.0)
        top = max(1.0, float(np.nanmax(np.concatenate([d for d in data if len(d)] or [np.ones(1)]))))
        ticks = [0.0] + [10.0 ** k for k in range(0, int(np.ceil(np.log10(top))) + 1, 2)]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_xlim(0, ticks[-1])
        ax.axvline(5, color="0.5", lw=0.8, ls=":")
        title = "regret, evaluation set\n(box: IQR; whiskers: min–max)"
        if len(diverged):
            title += f"\n{len(diverged)} diverged recommendations not drawn"
        ax.set(xlabel="regret (%)", title=title)
        ax = axes[5]
        online = ev[ev["recommender"] == "online"]
        worst = online.loc[online["regret"].idxmax()] if len(online) else None
        if worst is not None:
            key = table.loc[(table["setting"] == worst["setting"]) & (table["seed"] == worst["seed"]), "key"].iloc[0]
            R = np.asarray(records[key]["excess_risk"], dtype=float)
            ax.plot(np.arange(len(R)), R / R.min(), color=colors[2], lw=1.2, label="truth")
            ax.axvline(worst["best_T0"], color="0.3", ls=":", lw=0.9, label=f"best $T_0$ = {int(worst['best_T0'])}")
            ax.axvline(worst["stop_round"], color=colors[0], ls="--", lw=0.9,
                       label=f"online stop = {int(worst['stop_round'])}, froze $K_{{{int(worst['T0'])}}}$")
            ax.set_yscale("log")
            ax.set(xlabel="warm-up length $T_0$", ylabel="$R(T_0)/R(T_0^{best})$",
                   title=f"online's worst case, regret {100 * worst['regret']:.0f} %\n"
                         f"{worst['family'].replace('_', ' ')}, het. {worst['heterogeneity']:g},\n"
                         f"E = {int(worst['local_steps'])}, η = {worst['learning_rate']:g}, seed {int(worst['seed'])}")
            ax.legend(loc="lower left", frameon=False)
        if quick:
            fig.text(0.5, 0.5, "QUICK (smoke test)", fontsize=24, color="red", alpha=0.25, ha="center",
                     va="center", rotation=20)
    plot_data = ev[["recommender", "family", "heterogeneity", "local_steps", "learning_rate", "seed",
                    "best_T0", "T0", "stop_round", "regret", "u_shaped"]]
    plotting.save_figure(fig, "predictive_regret", out, plot_data.reset_index(drop=True))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small instances (smoke test; not a score)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", default=None, help="output folder (default figures/, or results/ with --quick)")
    parser.add_argument("--cache", default=None, help="instance cache (default benchmarks/_cache/predictive_regret[_quick])")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else ROOT / ("results" if args.quick else "figures")
    cache = Path(args.cache) if args.cache else ROOT / "benchmarks" / "_cache" / (
        "predictive_regret_quick" if args.quick else "predictive_regret")
    start = time.perf_counter()
    table = instances(args.quick)
    records = compute(table, cache, args.workers)
    out.mkdir(parents=True, exist_ok=True)
    # everything downstream is computed from the CSVs as written, so the committed tables can be
    # regenerated from the committed CSVs exactly (tests/test_recommenders.py)
    atomic_write_text(out / "predictive_regret_scores.csv",
                      score_table(table, records).to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out / "predictive_regret_design.csv",
                      design_table(table, records).to_csv(index=False, float_format="%.6g"))
    scores = pd.read_csv(out / "predictive_regret_scores.csv")
    design = pd.read_csv(out / "predictive_regret_design.csv")
    summ = summary(scores)
    atomic_write_text(out / "predictive_regret_summary.csv", summ.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out / "predictive_regret.md", report(scores, design))
    plot(scores, records, table, out, args.quick)
    print(report(scores, design))
    print(f"wrote {out / 'predictive_regret_scores.csv'}, predictive_regret_summary.csv, predictive_regret_design.csv, predictive_regret.md, "
          f"predictive_regret.png/.pdf ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
