"""Do the warm-up recommenders predict, and does the causal rule do no harm? (docs/theory.md §6, §8).

Everything that decides the score is declared in this file and was committed before any
evaluation score of the rule existed (docs/theory.md §8, "Pre-registration"):

* the **sets** (``SETS``): disjoint *design* and *evaluation* instances on the grids of
  ``FAMILIES`` and their ``VARIANTS`` — full batches (linear attention; softmax attention),
  minibatches of 16 with half the clients per round, Dirichlet(0.5) client sizes, and the
  in-context family at stronger task heterogeneity — with their seeds;
* the **candidate rules** (``CANDIDATES``: window, horizon, confidence, gain confidence and descent
  confidence of :class:`~linattn_theory.recommenders.online.OnlineRule`) and the **criterion**
  (:func:`choose_rule`) that picks one from the design table, which is computed on the design
  instances only. The evaluation instances played no part in designing or tuning anything.

Per instance the truth is ``R(T0)`` for every ``T0`` from one warm-up sweep against one centralised
optimum, and every recommender is scored by its regret ``R(T0_rec)/R(T0_best) − 1``:

* ``online`` (causal): the chosen rule, replayed on the stored FedAvg path exactly as it runs in
  training (:func:`~linattn_theory.recommenders.scoring.replay_online`), with the realised ``R`` of
  its decision (roll-backs under noise simulated);
* ``previous``: the rule before this design (round 2: ``w = 8``, ``h = 1``, ``z = 2``, ``z_g = 3``, no descent test);
* ``pilot``, ``transfer`` (design seeds of the same setting), ``a_posteriori`` (descriptive);
* baselines: FedAvg (``T0 = T``), fixed ``T0 = T/2``, the cross-seed oracle.

Records are cached as JSON (atomic writes) under ``--cache``: an interrupted run resumes, and a
second run only re-tabulates. A worker task scores 8 instances together (their warm-up sweeps as
ensembles, their centralised optima batched; a record is the same whichever instances share its
task). With full batches a record's FedAvg path — its pilot, a-posteriori bound and forecasts — is
its truth's FedAvg run itself, so the two cannot disagree (record format 3; before it, a second run
on another engine could end apart near the edge of stability, docs/theory.md §6, "Rounding near the
edge of stability"). The committed tables were computed from an empty cache with the code of their
commit, every record in format 3, so a rerun reproduces them bit for bit on the same libraries (format 4
adds each round's stability margin and changes no other field).
Results in ``<out>``: ``predictive_regret_scores.csv`` (a row per
instance and recommender), ``predictive_regret_design.csv`` (every candidate on every design
set), ``predictive_regret_summary.csv``, ``predictive_regret.md`` (the tables) and the figure
``predictive_regret.png`` (+ PDF and the plotted numbers).

Round 4 (issue 31; ``--round 4``, docs/theory.md §8, "Round 4") is declared below round 3's declaration:
held-out settings (``HELD_OUT``) and fresh seeds (``SETS_R4``), one candidate grid per information set
(``CANDIDATES_R4``, rules of :mod:`linattn_theory.recommenders.rules`), the criterion
(:func:`choose_rules_r4`) and the goals (``GOAL_R4``). It writes ``predictive_regret_r4_design.csv`` and
``predictive_regret_r4_choice.json`` (``--design-only`` stops there), then ``predictive_regret_r4_scores.csv``,
``predictive_regret_r4_summary.csv`` and ``predictive_regret_r4.md``, beside round 3's tables.

Round 5 (issue 31; ``--round 5``, docs/theory.md §8, "Round 5") is declared below round 4's: round 4's
evaluation sets become its design sets, fresh seeds and other held-out settings (``HELD_OUT_R5``,
``SETS_R5``) its evaluation, one candidate grid (``CANDIDATES_R5``: the value solve's forecast of
FedAvg's last round) chosen by round 4's criterion, round 4's chosen rules scored beside it
(``CARRIED_R5``); tables ``predictive_regret_r5*``.

Round 6 (issue 31; ``--round 6``, docs/theory.md §8, "Round 6") is declared below round 5's: round 5's
evaluation sets become its design sets, fresh seeds and other held-out settings (``HELD_OUT_R6``,
``SETS_R6``) its evaluation, one candidate (``CANDIDATES_R6``: the value solve after the ``T`` rounds),
round 5's choice and carried rules scored beside it (``CARRIED_R6``); tables ``predictive_regret_r6*``.

Round 7 (issue 31; ``--round 7``, docs/theory.md §8, "Round 7") is declared below round 6's: rounds 5's
and 6's evaluation sets become its design sets, fresh seeds and other held-out settings (``HELD_OUT_R7``,
``SETS_R7``) its evaluation, one candidate of information set (a) (``CANDIDATES_R7``: the recall rule
with the price of waiting one round more), round 6's choice and carried rules scored beside it
(``CARRIED_R7``); tables ``predictive_regret_r7*``.

Run:  python benchmarks/predictive_regret.py [--round 4|5|6|7] [--quick] [--design-only] [--workers 2] [--out figures] [--backend cupy]
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

from linattn_theory.core.io import atomic_write_text, write_json  # noqa: E402
from linattn_theory.recommenders.online import CHECKS, online_decision  # noqa: E402
from linattn_theory.recommenders.scoring import realised_risk, regret  # noqa: E402
from linattn_theory.sim.config import config_from_dict, config_hash  # noqa: E402

# ======================================================================================
# pre-registered: the sets, their seeds, the candidates and the criterion
# ======================================================================================
#: Base settings (the figures' instances) and the grid over heterogeneity, E and η per family.
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

#: The grid's variants. ``strong``: the in-context family at ζ_task ∈ {1.5, 2, 3}; the step sizes
#: keep the base grid's stability margin — the kernel's curvature grows like (1 + ζ_task²)², so
#: η = c/(1 + ζ_task²)² with c ∈ {0.02, 0.04}, which is the base grid's η ∈ {0.005, 0.01} at ζ_task = 1.
VARIANTS = {
    "linear": {"title": "full batches, linear attention"},
    "softmax": {"title": "full batches, softmax attention (τ = 1)", "model": {"attention": "softmax"}},
    "minibatch": {"title": "minibatches of b = 16, participation 0.5",
                  "federated": {"batch_size": 16, "participation": 0.5}},
    "skewed": {"title": "client sizes Dirichlet(α = 0.5)", "task": {"dirichlet_alpha": 0.5}},
    "strong": {"title": "in-context family, ζ_task ∈ {1.5, 2, 3}", "families": ("in_context_regression",),
               "levels": (1.5, 2.0, 3.0), "step_scale": (0.02, 0.04)},
}

#: name -> (variant, role, seeds). Round 3 (docs/theory.md §8, "How the rule was designed"): seeds
#: 2000–2004 were the evaluation seeds of the first rule (gain against cost only), 3000–3005 those
#: of the second (round 1, scored in commit bad236c) and 4000–4005 those of the third (round 2, scored
#: in commit 5d7bbc4); the failures that motivated each redesign were found on them, so they are
#: design instances now. The evaluation seeds 5000–5005 are new.
SETS = {
    "design": ("linear", "design", (1000, 1001, 1002)),
    "design_seen": ("linear", "design", (2000, 2001, 2002, 2003, 2004)),
    "design_minibatch": ("minibatch", "design", (1000, 1001)),
    "design_skewed": ("skewed", "design", (1000, 1001)),
    "design_strong": ("strong", "design", (1000, 1001, 1002)),
    "design_r1": ("linear", "design", (3000, 3001, 3002, 3003, 3004)),
    "design_r1_softmax": ("softmax", "design", (3000, 3001, 3002)),
    "design_r1_minibatch": ("minibatch", "design", (3000, 3001, 3002)),
    "design_r1_skewed": ("skewed", "design", (3000, 3001, 3002)),
    "design_r1_strong": ("strong", "design", (3000, 3001, 3002, 3003, 3004, 3005)),
    "design_r2": ("linear", "design", (4000, 4001, 4002, 4003, 4004)),
    "design_r2_softmax": ("softmax", "design", (4000, 4001, 4002)),
    "design_r2_minibatch": ("minibatch", "design", (4000, 4001, 4002)),
    "design_r2_skewed": ("skewed", "design", (4000, 4001, 4002)),
    "design_r2_strong": ("strong", "design", (4000, 4001, 4002, 4003, 4004, 4005)),
    "evaluation": ("linear", "evaluation", (5000, 5001, 5002, 5003, 5004)),
    "evaluation_softmax": ("softmax", "evaluation", (5000, 5001, 5002)),
    "evaluation_minibatch": ("minibatch", "evaluation", (5000, 5001, 5002)),
    "evaluation_skewed": ("skewed", "evaluation", (5000, 5001, 5002)),
    "evaluation_strong": ("strong", "evaluation", (5000, 5001, 5002, 5003, 5004, 5005)),
}
#: The transfer recommender reads the a-posteriori T0 of these design sets (same setting).
TRANSFER_FROM = {"linear": "design", "softmax": "design_r1_softmax", "minibatch": "design_minibatch",
                 "skewed": "design_skewed", "strong": "design_strong"}

#: Candidate rules of round 3: OnlineRule(window, horizon, confidence, gain_confidence,
#: descent_confidence) over this grid (``None``: no descent test, the rules of round 2). Round 2's
#: design table ranked horizon 2, window 4 and confidences 0 and 4 behind the others; round 3 adds the
#: descent test (docs/theory.md §8) on a doubling grid of its confidence, and keeps the grid small
#: enough to replay on every design instance.
CANDIDATES = {"window": (6, 8, 10), "horizon": (1,), "confidence": (2.0, 3.0), "gain_confidence": (2.0, 3.0),
              "descent_confidence": (None, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)}
#: The parameters of a rule, in the order of :class:`~linattn_theory.recommenders.online.OnlineRule`.
RULE_PARAMS = tuple(CANDIDATES)
#: A rule harms an instance when its regret exceeds FedAvg's by more than this (2 points).
HARM_MARGIN = 0.02
#: Admissible on the design sets: harm on at most this share of every design variant's instances
#: (half the evaluation goal of 2 %, a margin for sampling).
DESIGN_HARM_LIMIT = 0.01
#: Paired comparisons call regrets within this of each other a tie (0.1 point).
TIE = 1e-3
#: The goal on every evaluation set (issue 18): median regret, worst regret, share of instances harmed.
GOAL = {"median": 0.005, "max": 0.10, "harm_share": 0.02}
#: The rule before this design (round 2's: no descent test), scored next to the chosen one.
PREVIOUS = {"window": 8, "horizon": 1, "confidence": 2.0, "gain_confidence": 3.0, "descent_confidence": None,
            "checks": CHECKS}


def candidate_rules(grid=None) -> dict:
    """``{name: (window, horizon, confidence, gain_confidence, descent_confidence, checks)}``: the
    candidates of ``grid`` (default :data:`CANDIDATES`)."""
    grid = CANDIDATES if grid is None else grid
    return {rule_name(*values): (*values, CHECKS) for values in itertools.product(*grid.values())}


def rule_name(window, horizon, confidence, gain_confidence=0.0, descent_confidence=None, checks=CHECKS) -> str:
    """The rule's name in the tables (the rules before the descent test keep their earlier names)."""
    name = f"w={window} h={horizon} z={confidence:g} zg={gain_confidence:g}"
    if _given(descent_confidence):
        name += f" zd={descent_confidence:g}"
    return name if tuple(checks) == CHECKS else f"{name} [{'+'.join(checks)}]"


def _given(value) -> bool:
    """A set parameter (not ``None``, nor the ``NaN`` a CSV reads for it)."""
    return value is not None and not (isinstance(value, float) and np.isnan(value))


def rule_spec(chosen: dict, checks=CHECKS) -> tuple:
    """``(window, horizon, confidence, gain_confidence, descent_confidence, checks)`` of a rule given as a dict."""
    return (*(chosen[p] for p in RULE_PARAMS), tuple(checks))


def choose_rule(design: pd.DataFrame) -> dict:
    """The criterion that picks the rule from the design table (pre-registered).

    Over the candidates (rows with ``checks`` = all tests): admissible are those whose harm share
    (``harm / instances``) is at most :data:`DESIGN_HARM_LIMIT` on every design variant; among
    them the smallest mean over variants of the mean regret wins, ties broken by the smaller
    window, horizon, confidence, gain confidence and descent confidence (none last). If none is
    admissible, the smallest largest harm share wins (then the same order). Returns ``{"window",
    "horizon", "confidence", "gain_confidence", "descent_confidence", "admissible"}``.
    """
    full = design[design["checks"] == "+".join(CHECKS)]
    per = full.assign(share=full["harm"] / full["instances"]).groupby(list(RULE_PARAMS), dropna=False)
    table = pd.DataFrame({"worst_share": per["share"].max(), "mean_of_means": per["mean"].mean()}).reset_index()
    table["admissible"] = table["worst_share"] <= DESIGN_HARM_LIMIT
    pool = table[table["admissible"]] if table["admissible"].any() else table
    key = ["mean_of_means", *RULE_PARAMS] if table["admissible"].any() else \
        ["worst_share", "mean_of_means", *RULE_PARAMS]
    best = pool.sort_values(key, kind="stable").iloc[0]
    descent = best["descent_confidence"]
    return {"window": int(best["window"]), "horizon": int(best["horizon"]),
            "confidence": float(best["confidence"]), "gain_confidence": float(best["gain_confidence"]),
            "descent_confidence": float(descent) if _given(descent) else None,
            "admissible": int(table["admissible"].sum())}


#: --quick: small instances, one setting per family, for the tests (a smoke test, not a score).
QUICK = {"task": {"samples_per_client": 32, "tokens": 8}, "federated": {"rounds": 12}, "families": ("planted_kernel",),
         "restarts": 2,
         "local_steps": (10,), "sets": {"design": (1000,), "design_minibatch": (1000,),
                                        "evaluation": (5001, 5002), "evaluation_minibatch": (5001,)},
         "candidates": {"window": (2, 3), "horizon": (1,), "confidence": (0.0, 2.0), "gain_confidence": (0.0, 1.0),
                        "descent_confidence": (None, 1.0)}}

# ======================================================================================
# round 4 (issue 31), pre-registered before any record of its evaluation instances existed:
# held-out settings, fresh seeds, one candidate grid per information set, the criterion, the goals
# ======================================================================================
#: Settings the design never saw (docs/theory.md §8, "Round 4"). Each is a variant of the base grid of
#: ``FAMILIES``; ``by_family`` overrides a family's task, model, schedule or grid (``levels``,
#: ``local_steps``, ``learning_rate``; ``step_scale``: ``federated.step_scale`` values ``c`` in place of
#: the learning rates, η = c · 2/max_c λ_max(Ã_c(K⁰)) resolved per instance, docs/theory.md §5).
#: ``shape``: other d, m, N and T; ``step_scale``: the step set by curvature; ``skew``: client sizes
#: Dirichlet(0.2), a skew level left out of the design (which had 0.5 and equal sizes); ``levels``:
#: heterogeneity, E and η off the design grid; ``minibatch_sparse``: minibatches of 32 with a quarter
#: of the clients per round (the design had 16 and a half).
HELD_OUT = {
    "shape": {"title": "held out: d = 12 / 6, m = 16 clients of 64 samples, T = 60",
              "federated": {"rounds": 60},
              "task": {"num_clients": 16, "samples_per_client": 64},
              "by_family": {"planted_kernel": {"task": {"dim": 12}},
                            "in_context_regression": {"task": {"dim": 6}, "model": {"rank": 7}}}},
    "step_scale": {"title": "held out: η by federated.step_scale (planted c ∈ {0.004, 0.008}, in-context c ∈ {0.01, 0.03})",
                   "by_family": {"planted_kernel": {"step_scale": (0.004, 0.008)},
                                 "in_context_regression": {"step_scale": (0.01, 0.03)}}},
    "skew": {"title": "held out: client sizes Dirichlet(α = 0.2)", "task": {"dirichlet_alpha": 0.2}},
    "levels": {"title": "held out: ζ_V ∈ {1.5, 4}, E ∈ {5, 15}, η ∈ {0.015, 0.025}; ζ_task ∈ {0.75, 1.25}, E ∈ {8, 15}, η = 0.002",
               "by_family": {"planted_kernel": {"levels": (1.5, 4.0), "local_steps": (5, 15),
                                                "learning_rate": (0.015, 0.025)},
                             "in_context_regression": {"levels": (0.75, 1.25), "local_steps": (8, 15),
                                                       "learning_rate": (0.002,)}}},
    "minibatch_sparse": {"title": "held out: minibatches of b = 32, participation 0.25",
                         "federated": {"batch_size": 32, "participation": 0.25}},
}

#: Round 4's sets: name -> (variant, role, seeds). Design: every set of ``SETS`` (rounds 1–3; round 3's
#: evaluation seeds 5000–5005 were scored in commit cd8618b, so they are design instances now). Evaluation:
#: fresh seeds 6000–6005 on the design grid's variants (in distribution) and on the held-out settings
#: (out of distribution). No record of a seed ≥ 6000 existed when this was committed.
SETS_R4 = {
    **{name: (variant, "design", seeds) for name, (variant, _, seeds) in SETS.items()},
    "r4_evaluation": ("linear", "evaluation", (6000, 6001, 6002, 6003, 6004)),
    "r4_evaluation_softmax": ("softmax", "evaluation", (6000, 6001, 6002)),
    "r4_evaluation_minibatch": ("minibatch", "evaluation", (6000, 6001, 6002)),
    "r4_evaluation_skewed": ("skewed", "evaluation", (6000, 6001, 6002)),
    "r4_evaluation_strong": ("strong", "evaluation", (6000, 6001, 6002, 6003, 6004, 6005)),
    "r4_heldout_shape": ("shape", "evaluation", (6000, 6001, 6002)),
    "r4_heldout_step_scale": ("step_scale", "evaluation", (6000, 6001, 6002)),
    "r4_heldout_skew": ("skew", "evaluation", (6000, 6001, 6002)),
    "r4_heldout_levels": ("levels", "evaluation", (6000, 6001, 6002, 6003, 6004, 6005)),
    "r4_heldout_minibatch": ("minibatch_sparse", "evaluation", (6000, 6001, 6002)),
}

#: Candidates of round 4, per rule of :data:`linattn_theory.recommenders.rules.RULES` (the information set
#: is the rule's): stopping with recall on the exact offers, (a); on the observed losses, (b); the value
#: solve at the smallest stored profile, (c), which has no parameter. ``fraction`` is a share of the best
#: offer's value part for (a) (a bound on the relative regret against that offer) and of the best observed
#: loss for (b). ``forecast`` matters only with a no-harm test, so the candidates without one have the
#: straight line only.
CANDIDATES_R4 = {
    "value_moments_recall": {"window": (8, 10), "fraction": (0.02, 0.05, 0.1, 0.2), "confidence": (0.0, 2.0),
                             "stability": (False, True), "no_harm": (None, 2.0), "forecast": ("line", "decomposition")},
    "server_observable": {"window": (8, 10), "fraction": (0.005, 0.01, 0.02, 0.05), "confidence": (0.0, 2.0),
                          "outcome": ("iterate", "freeze")},
    "value_solve": {},
}
#: Round 3's chosen rule (information set (a)), scored beside round 4's on every set.
ROUND3_RULE = {"window": 10, "horizon": 1, "confidence": 2.0, "gain_confidence": 3.0, "descent_confidence": 8.0}
#: The goals of issue 31 on every evaluation set: median regret, worst regret, share of instances harmed
#: (regret above FedAvg's by more than ``HARM_MARGIN``), and the median share of FedAvg's gap captured on
#: the instances where FedAvg's regret exceeds ``gap``: ``(r_FedAvg − r_rule)/r_FedAvg``. For the
#: server-observable rule (b) what it reaches is reported, whatever it is.
GOAL_R4 = {"median": 0.005, "max": 0.15, "harm_share": 0.01, "captured": 0.80, "gap": 0.10}
#: Admissible on the design sets: harm on at most this share of every design variant's instances (half
#: the goal, a margin for sampling).
DESIGN_HARM_LIMIT_R4 = 0.005
#: --quick for round 4 (a smoke test, not a score): the quick design instances of ``QUICK`` and held-out
#: and fresh quick instances on seeds that are no evaluation seed of ``SETS_R4``.
QUICK_R4 = {"sets": {"design": (1000,), "design_minibatch": (1000,), "r4_evaluation": (6901,),
                     "r4_heldout_shape": (6901,), "r4_heldout_step_scale": (6901,), "r4_heldout_minibatch": (6901,)},
            "candidates": {"value_moments_recall": {"window": (2,), "fraction": (0.05,), "confidence": (0.0, 2.0),
                                                    "stability": (False, True), "no_harm": (None,),
                                                    "forecast": ("line",)},
                           "server_observable": {"window": (2,), "fraction": (0.05,), "confidence": (0.0,),
                                                 "outcome": ("iterate", "freeze")},
                           "value_solve": {}}}


# ======================================================================================
# round 5 (issue 31), pre-registered before any record of its evaluation instances existed:
# round 4's evaluation sets as design sets, fresh seeds, other held-out settings, one candidate grid
# ======================================================================================
#: Settings neither round 4's design nor its evaluation saw (docs/theory.md §8, "Round 5"): ``shape5``
#: other d, m, N and T; ``participation``: full batches with 30 % of the clients per round (the design
#: had participation only with minibatches); ``skew5``: client sizes Dirichlet(0.1); ``step_scale5``:
#: other step scales c; ``levels5``: heterogeneity and E off every earlier grid; ``minibatch_dense``:
#: minibatches of 8 with three quarters of the clients per round.
HELD_OUT_R5 = {
    "shape5": {"title": "held out: d = 10 / 5, m = 24 clients of 48 samples, T = 50",
               "federated": {"rounds": 50},
               "task": {"num_clients": 24, "samples_per_client": 48},
               "by_family": {"planted_kernel": {"task": {"dim": 10}},
                             "in_context_regression": {"task": {"dim": 5}, "model": {"rank": 6}}}},
    "participation": {"title": "held out: full batches, participation 0.3",
                      "federated": {"participation": 0.3}},
    "skew5": {"title": "held out: client sizes Dirichlet(α = 0.1)", "task": {"dirichlet_alpha": 0.1}},
    "step_scale5": {"title": "held out: η by federated.step_scale (planted c ∈ {0.006, 0.012}, in-context c ∈ {0.02, 0.05})",
                    "by_family": {"planted_kernel": {"step_scale": (0.006, 0.012)},
                                  "in_context_regression": {"step_scale": (0.02, 0.05)}}},
    "levels5": {"title": "held out: ζ_V ∈ {2.5, 5}, E ∈ {3, 25}, η ∈ {0.01, 0.015}; ζ_task ∈ {0.35, 1.75}, E ∈ {3, 25}, η = 0.003",
                "by_family": {"planted_kernel": {"levels": (2.5, 5.0), "local_steps": (3, 25),
                                                 "learning_rate": (0.01, 0.015)},
                              "in_context_regression": {"levels": (0.35, 1.75), "local_steps": (3, 25),
                                                        "learning_rate": (0.003,)}}},
    "minibatch_dense": {"title": "held out: minibatches of b = 8, participation 0.75",
                        "federated": {"batch_size": 8, "participation": 0.75}},
}

#: Round 5's sets: name -> (variant, role, seeds). Design: round 4's evaluation sets (scored in commit
#: a3e738e, so design instances now); round 5's candidates were chosen on them only. Evaluation: fresh
#: seeds 7000–7003 on the grid's variants (in distribution) and on :data:`HELD_OUT_R5` (out of
#: distribution). No record of a seed ≥ 7000 existed when this was committed.
SETS_R5 = {
    **{name: (variant, "design", seeds) for name, (variant, role, seeds) in SETS_R4.items() if role == "evaluation"},
    "r5_evaluation": ("linear", "evaluation", (7000, 7001, 7002)),
    "r5_evaluation_softmax": ("softmax", "evaluation", (7000, 7001)),
    "r5_evaluation_minibatch": ("minibatch", "evaluation", (7000, 7001, 7002)),
    "r5_heldout_shape": ("shape5", "evaluation", (7000, 7001)),
    "r5_heldout_participation": ("participation", "evaluation", (7000, 7001)),
    "r5_heldout_skew": ("skew5", "evaluation", (7000, 7001)),
    "r5_heldout_step_scale": ("step_scale5", "evaluation", (7000, 7001)),
    "r5_heldout_levels": ("levels5", "evaluation", (7000, 7001, 7002, 7003)),
    "r5_heldout_minibatch": ("minibatch_dense", "evaluation", (7000, 7001)),
}

#: Candidates of round 5: the value solve (information set (c)) with its forecast of FedAvg's last round,
#: ``profile_trend`` κ (:class:`~linattn_theory.recommenders.rules.ValueSolveRule`; κ = 0 is round 4's
#: rule). Round 4's (a) and (b) are not redesigned: they are scored again, unchanged (:data:`CARRIED_R5`).
CANDIDATES_R5 = {"value_solve": {"profile_trend": (0.0, 0.5, 1.0, 2.0, 4.0)}}
#: Scored beside round 5's choice on every evaluation set: round 4's chosen rules (its
#: ``predictive_regret_r4_choice.json``) and round 3's.
CARRIED_R5 = {
    "value_moments_recall(window=10, fraction=0.2, confidence=2.0, stability=False, no_harm=2.0, forecast=line)":
        ("value_moments_recall", {"window": 10, "fraction": 0.2, "confidence": 2.0, "stability": False,
                                  "no_harm": 2.0, "forecast": "line"}),
    "server_observable(window=10, fraction=0.05, confidence=2.0, outcome=freeze)":
        ("server_observable", {"window": 10, "fraction": 0.05, "confidence": 2.0, "outcome": "freeze"}),
    "value_solve": ("value_solve", {}),
}
#: --quick for round 5 (a smoke test, not a score), on seeds that are no evaluation seed of ``SETS_R5``.
QUICK_R5 = {"sets": {"r4_evaluation": (6901,), "r4_heldout_minibatch": (6901,), "r5_evaluation": (7901,),
                     "r5_heldout_shape": (7901,), "r5_heldout_participation": (7901,)},
            "candidates": {"value_solve": {"profile_trend": (0.0, 1.0)}}}


# ======================================================================================
# round 6 (issue 31), pre-registered before any record of its evaluation instances existed:
# round 5's evaluation sets as design sets, fresh seeds, other held-out settings, the solve after the budget
# ======================================================================================
#: Settings no instance of rounds 1–5 had (docs/theory.md §8, "Round 6"): ``participation6``: full batches
#: with half the clients per round; ``clients16``: 16 clients of 64 samples, a quarter of them per round;
#: ``shape6``: other d, m, N and a shorter T; ``long6``: T = 80; ``levels6``: heterogeneity and E off every
#: earlier grid; ``minibatch6``: minibatches of 4 with every client in every round.
HELD_OUT_R6 = {
    "participation6": {"title": "held out: full batches, participation 0.5", "federated": {"participation": 0.5}},
    "clients16": {"title": "held out: m = 16 clients of 64 samples, participation 0.25",
                  "task": {"num_clients": 16, "samples_per_client": 64}, "federated": {"participation": 0.25}},
    "shape6": {"title": "held out: d = 6 / 3, m = 12 clients of 96 samples, T = 30",
               "federated": {"rounds": 30},
               "task": {"num_clients": 12, "samples_per_client": 96},
               "by_family": {"planted_kernel": {"task": {"dim": 6}},
                             "in_context_regression": {"task": {"dim": 3}, "model": {"rank": 4}}}},
    "long6": {"title": "held out: T = 80 rounds", "federated": {"rounds": 80}},
    "levels6": {"title": "held out: ζ_V ∈ {0.5, 6}, E ∈ {4, 30}, η = 0.008; ζ_task ∈ {0.15, 0.6}, E ∈ {4, 30}, η = 0.004",
                "by_family": {"planted_kernel": {"levels": (0.5, 6.0), "local_steps": (4, 30),
                                                 "learning_rate": (0.008,)},
                              "in_context_regression": {"levels": (0.15, 0.6), "local_steps": (4, 30),
                                                        "learning_rate": (0.004,)}}},
    "minibatch6": {"title": "held out: minibatches of b = 4, full participation", "federated": {"batch_size": 4}},
}

#: Round 6's sets: name -> (variant, role, seeds). Design: round 5's evaluation sets (scored in commit
#: 3044311, so design instances now). Evaluation: fresh seeds 8000–8005 on the grid's variants (in
#: distribution) and on :data:`HELD_OUT_R6` (out of distribution). No record of a seed ≥ 8000 existed
#: when this was committed.
SETS_R6 = {
    **{name: (variant, "design", seeds) for name, (variant, role, seeds) in SETS_R5.items() if role == "evaluation"},
    "r6_evaluation": ("linear", "evaluation", (8000, 8001, 8002)),
    "r6_evaluation_softmax": ("softmax", "evaluation", (8000, 8001)),
    "r6_evaluation_minibatch": ("minibatch", "evaluation", (8000, 8001, 8002)),
    "r6_heldout_participation": ("participation6", "evaluation", (8000, 8001)),
    "r6_heldout_clients": ("clients16", "evaluation", (8000, 8001)),
    "r6_heldout_shape": ("shape6", "evaluation", (8000, 8001)),
    "r6_heldout_long": ("long6", "evaluation", (8000, 8001)),
    "r6_heldout_levels": ("levels6", "evaluation", (8000, 8001, 8002, 8003, 8004, 8005)),
    "r6_heldout_minibatch": ("minibatch6", "evaluation", (8000, 8001)),
}

#: Candidates of round 6: the value solve after the ``T`` rounds (information set (c),
#: :class:`~linattn_theory.recommenders.rules.ValueSolveRule` with ``after_budget``). Round 5's choice, round
#: 4's rules and round 3's are scored again, unchanged (:data:`CARRIED_R6`).
CANDIDATES_R6 = {"value_solve": {"after_budget": (True,)}}
#: Scored beside round 6's choice on every evaluation set: round 5's choice (its
#: ``predictive_regret_r5_choice.json``) and round 5's carried rules.
CARRIED_R6 = {"value_solve(profile_trend=1.0)": ("value_solve", {"profile_trend": 1.0}), **CARRIED_R5}
#: --quick for round 6 (a smoke test, not a score), on seeds that are no evaluation seed of ``SETS_R6``.
QUICK_R6 = {"sets": {"r5_evaluation": (7901,), "r5_heldout_participation": (7901,), "r6_evaluation": (8901,),
                     "r6_heldout_participation": (8901,), "r6_heldout_shape": (8901,)},
            "candidates": {"value_solve": {"after_budget": (True,)}}}


# ======================================================================================
# round 7 (issue 31), pre-registered before any record of its evaluation instances existed:
# rounds 5's and 6's evaluation sets as design sets, fresh seeds, other held-out settings, one (a) rule
# ======================================================================================
#: Settings no instance of rounds 1–6 had (docs/theory.md §8, "Round 7"): ``heads7``: two heads (every
#: earlier instance had one); ``tokens7``: contexts of n = 6 tokens (all had 16); ``participation7``: full
#: batches with three quarters of the clients per round; ``shape7``: other d, m, N and T; ``minibatch7``:
#: minibatches of 24 with 60 % of the clients per round; ``levels7``: heterogeneity, E and η off every
#: earlier grid.
HELD_OUT_R7 = {
    "heads7": {"title": "held out: H = 2 heads", "model": {"heads": 2}},
    "tokens7": {"title": "held out: contexts of n = 6 tokens", "task": {"tokens": 6}},
    "participation7": {"title": "held out: full batches, participation 0.75", "federated": {"participation": 0.75}},
    "shape7": {"title": "held out: d = 14 / 7, m = 6 clients of 200 samples, T = 45",
               "federated": {"rounds": 45},
               "task": {"num_clients": 6, "samples_per_client": 200},
               "by_family": {"planted_kernel": {"task": {"dim": 14}},
                             "in_context_regression": {"task": {"dim": 7}, "model": {"rank": 8}}}},
    "minibatch7": {"title": "held out: minibatches of b = 24, participation 0.6",
                   "federated": {"batch_size": 24, "participation": 0.6}},
    "levels7": {"title": "held out: ζ_V ∈ {0.75, 3.5}, E ∈ {7, 12}, η = 0.018; ζ_task ∈ {0.4, 0.8}, E ∈ {7, 12}, η = 0.007",
                "by_family": {"planted_kernel": {"levels": (0.75, 3.5), "local_steps": (7, 12),
                                                 "learning_rate": (0.018,)},
                              "in_context_regression": {"levels": (0.4, 0.8), "local_steps": (7, 12),
                                                        "learning_rate": (0.007,)}}},
}

#: Round 7's sets: name -> (variant, role, seeds). Design: round 5's and round 6's evaluation sets (scored
#: in commits 3044311 and 0507ab9, so design instances now; the candidate was found on them). Evaluation:
#: fresh seeds 9000–9005 on the grid's variants (in distribution) and on :data:`HELD_OUT_R7` (out of
#: distribution). No record of a seed ≥ 9000 existed when this was committed.
SETS_R7 = {
    **{name: (variant, "design", seeds) for name, (variant, role, seeds) in SETS_R5.items() if role == "evaluation"},
    **{name: (variant, "design", seeds) for name, (variant, role, seeds) in SETS_R6.items() if role == "evaluation"},
    "r7_evaluation": ("linear", "evaluation", (9000, 9001, 9002)),
    "r7_evaluation_softmax": ("softmax", "evaluation", (9000, 9001)),
    "r7_evaluation_minibatch": ("minibatch", "evaluation", (9000, 9001, 9002)),
    "r7_heldout_heads": ("heads7", "evaluation", (9000, 9001)),
    "r7_heldout_tokens": ("tokens7", "evaluation", (9000, 9001)),
    "r7_heldout_participation": ("participation7", "evaluation", (9000, 9001)),
    "r7_heldout_shape": ("shape7", "evaluation", (9000, 9001)),
    "r7_heldout_minibatch": ("minibatch7", "evaluation", (9000, 9001)),
    "r7_heldout_levels": ("levels7", "evaluation", (9000, 9001, 9002, 9003, 9004, 9005)),
}

#: The candidate of round 7, information set (a) (:class:`~linattn_theory.recommenders.rules.ValueMomentsRecallRule`):
#: round 4's chosen rule with the price of waiting one round more (``lookahead``), the noise margin only where
#: the run samples (``margin = "noisy"``) and the no-harm test's σ from second differences. Found on the
#: design sets after looking at them (docs/theory.md §8, "Round 7"): its design score is a posteriori.
CANDIDATES_R7 = {"value_moments_recall": {"window": (10,), "fraction": (0.2,), "confidence": (2.0,),
                                          "stability": (False,), "no_harm": (2.0,), "forecast": ("line",),
                                          "lookahead": (True,), "margin": ("noisy",),
                                          "no_harm_noise": ("second_differences",)}}
#: Scored beside round 7's choice on every evaluation set: round 6's choice (its ``predictive_regret_r6_choice.json``)
#: and round 6's carried rules (round 4's (a) among them, unchanged).
CARRIED_R7 = {"value_solve(after_budget=True)": ("value_solve", {"after_budget": True}), **CARRIED_R6}
#: --quick for round 7 (a smoke test, not a score), on seeds that are no evaluation seed of ``SETS_R7``.
QUICK_R7 = {"sets": {"r5_evaluation": (7901,), "r6_heldout_participation": (8901,), "r7_evaluation": (9901,),
                     "r7_heldout_heads": (9901,), "r7_heldout_participation": (9901,)},
            "candidates": CANDIDATES_R7}

RECOMMENDERS = ("online", "previous", "pilot", "transfer", "a_posteriori")
BASELINES = ("fedavg", "half", "cross_seed_oracle")
LABELS = {"online": "online (causal)", "previous": "previous online rule", "pilot": "pilot (T/4 rounds)",
          "transfer": "transfer (design seeds)", "a_posteriori": "a posteriori fit (descriptive)",
          "fedavg": "FedAvg (T0 = T)", "half": "fixed T0 = T/2", "cross_seed_oracle": "cross-seed oracle"}
#: One colour per method (the figure's legend names them all).
COLORS = {"online": 0, "previous": 7, "fedavg": 3, "half": 2, "best": 1}


# ======================================================================================
# the instances and their records
# ======================================================================================
def settings(variant: str, quick: bool = False):
    """Every setting of ``variant`` (of :data:`VARIANTS`, :data:`HELD_OUT`, :data:`HELD_OUT_R5`, :data:`HELD_OUT_R6` or
    :data:`HELD_OUT_R7`) as ``(family, heterogeneity,
    E, η, config dict without seed)`` (``η`` is the step scale ``c`` where the variant sets one)."""
    spec_v = {**VARIANTS, **HELD_OUT, **HELD_OUT_R5, **HELD_OUT_R6, **HELD_OUT_R7}[variant]
    for family, spec in FAMILIES.items():
        if family not in spec_v.get("families", FAMILIES) or (quick and family not in QUICK["families"]):
            continue
        own = spec_v.get("by_family", {}).get(family, {})
        key, levels = spec["heterogeneity"]
        levels = own.get("levels", spec_v.get("levels", levels))
        steps = own.get("local_steps", spec["local_steps"])
        scaled = "step_scale" in own
        rates = range(2) if "step_scale" in spec_v else own.get("step_scale", own.get("learning_rate",
                                                                                     spec["learning_rate"]))
        task = {**spec["task"], **spec_v.get("task", {}), **own.get("task", {})}
        fed = {**spec["federated"], **spec_v.get("federated", {}), **own.get("federated", {})}
        model = {**spec["model"], **spec_v.get("model", {}), **own.get("model", {})}
        if quick:
            levels, steps, rates = levels[-1:], QUICK["local_steps"], list(rates)[:1]
            task.update(QUICK["task"])
            fed.update(QUICK["federated"])
        for level, E, eta in itertools.product(levels, steps, rates):
            if "step_scale" in spec_v:
                eta = float(spec_v["step_scale"][eta] / (1.0 + level ** 2) ** 2)
            data = {"task": dict(task, **{key.split(".")[1]: level}), "model": model,
                    "federated": dict(fed, strategy="fedfrozen", warmup_rounds=0, local_steps=E,
                                      **{"step_scale" if scaled else "learning_rate": eta})}
            yield family, level, E, eta, data


def instances(quick: bool = False, backend: str = "numpy", sets=None, quick_sets=None) -> pd.DataFrame:
    """The declared instances: one row per (set, setting, seed) with its config dict (on
    ``backend``: another backend's runs have their own keys, so their records are kept apart).
    ``sets`` (default :data:`SETS`) and ``quick_sets`` (default ``QUICK["sets"]``) name the sets."""
    sets = SETS if sets is None else sets
    quick_sets = QUICK["sets"] if quick_sets is None else quick_sets
    seeds = {name: (quick_sets.get(name, ()) if quick else spec[2]) for name, spec in sets.items()}
    design = {s for name, spec in sets.items() if spec[1] == "design" for s in seeds[name]}
    evaluation = {s for name, spec in sets.items() if spec[1] == "evaluation" for s in seeds[name]}
    assert not design & evaluation, "design and evaluation seeds must be disjoint"
    rows = []
    for name, (variant, role, _) in sets.items():
        for setting, (family, level, E, eta, data) in enumerate(settings(variant, quick)):
            for seed in seeds[name]:
                config = config_from_dict({**data, "seed": seed})
                if backend != "numpy":
                    config = config.with_updates({"model.backend": backend})
                rows.append({"set": name, "variant": variant, "role": role, "setting": setting,
                             "family": family, "heterogeneity": level, "local_steps": E,
                             "learning_rate": eta, "seed": seed, "key": config_hash(config),
                             "config": config.to_dict()})
    return pd.DataFrame(rows)


#: Version of the records below (records of another version are recomputed). 3: with full batches
#: a record's FedAvg path (pilot, bound, forecasts) is the truth's FedAvg run, not a second run of
#: the same config on the one-run engine (format 2), so the two agree bit for bit. 4: format 3 and the
#: value block's stability margin of every round (``stability_margin``, round 4's rules); no other
#: field changes, so round 3's tables come out of format-4 records unchanged.
RECORD_FORMAT = 4


def _cached(path: Path) -> bool:
    return path.exists() and json.loads(path.read_text()).get("format") == RECORD_FORMAT


def _score(config_dicts: list, paths: list, restarts: int = 8) -> list:
    """Worker: score a chunk of instances together and write each record atomically (those not
    cached): their truths as ensembles and batched optima
    (:func:`~linattn_theory.recommenders.scoring.score_instances`; a record does not depend on
    the chunk it was computed in)."""
    import warnings

    from linattn_theory.recommenders.scoring import score_instances
    todo = [(d, p) for d, p in zip(config_dicts, paths) if not _cached(Path(p))]
    if todo:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            records = score_instances([config_from_dict(d) for d, _ in todo], restarts=restarts)
        for (_, path), record in zip(todo, records):
            write_json(Path(path), {**record, "format": RECORD_FORMAT})
    return paths


#: Instances scored together by one worker task (their truths as one ensemble program).
CHUNK = 8


def task_chunks(todo: list) -> list:
    """``todo`` (``(config dict, path)`` pairs) in chunks of :data:`CHUNK`, the instances of one task
    (its ``task`` and ``seed``) next to each other: instances that share their clients share the random
    starts of their optimum, which :func:`~linattn_theory.theory.profile.centralized_optima` runs once
    per chunk."""
    groups: dict = {}
    for item in todo:
        groups.setdefault(json.dumps([item[0]["task"], item[0]["seed"]], sort_keys=True), []).append(item)
    ordered = [item for group in groups.values() for item in group]
    return [ordered[i:i + CHUNK] for i in range(0, len(ordered), CHUNK)]


def _parallel(jobs: list, workers: int, desc: str, unit: str = "instance") -> list:
    from joblib import Parallel, delayed
    from tqdm.auto import tqdm

    if not jobs:
        return []
    calls = (delayed(function)(*args) for function, *args in jobs)
    return list(tqdm(Parallel(n_jobs=workers, return_as="generator")(calls), total=len(jobs), desc=desc,
                     unit=unit))


def compute(table: pd.DataFrame, cache: Path, workers: int, restarts: int = 8) -> dict:
    """Records of every instance (cached); returns ``{key: record}``. ``restarts``: of the centralised
    optimum (:func:`~linattn_theory.recommenders.scoring.instance_truth`)."""
    cache.mkdir(parents=True, exist_ok=True)
    paths = {key: cache / f"{key}.json" for key in table["key"]}
    todo = [(cfg, str(paths[key])) for key, cfg in zip(table["key"], table["config"]) if not _cached(paths[key])]
    chunks = task_chunks(todo)
    _parallel([(_score, [c for c, _ in chunk], [p for _, p in chunk], restarts) for chunk in chunks], workers,
              f"instances, {CHUNK} per task", unit="task")
    return {key: json.loads(path.read_text()) for key, path in paths.items()}


# ======================================================================================
# rules on the records: decisions and their realised risk (cached per instance)
# ======================================================================================
class _Rule:
    """:func:`~linattn_theory.recommenders.online.online_decision` with some of its tests (the design
    table's ablations; with all tests it is :class:`OnlineRule`)."""

    def __init__(self, window, horizon, confidence, gain_confidence=0.0, descent_confidence=None, checks=CHECKS):
        self.args, self.checks = (int(window), int(horizon), float(confidence)), tuple(checks)
        self.gain_confidence = float(gain_confidence)
        self.descent_confidence = float(descent_confidence) if _given(descent_confidence) else None

    def decide(self, forecasts, T):
        return online_decision(forecasts, T, *self.args, gain_confidence=self.gain_confidence,
                               descent_confidence=self.descent_confidence, checks=self.checks)


def _rule_of(spec):
    """The rule of a spec: round 3's tuple ``(window, horizon, confidence, gain_confidence,
    descent_confidence, checks)`` (:class:`_Rule`), or round 4's ``(name, params)`` of
    :data:`linattn_theory.recommenders.rules.RULES`."""
    if isinstance(spec[0], str):
        from linattn_theory.recommenders.rules import make_rule
        return make_rule(spec[0], **spec[1])
    return _Rule(*spec)


def _outcomes(record_path: str, config_dict: dict, rules: dict, path: str) -> str:
    """Worker: decision and realised risk of every rule in ``rules`` on one instance (cached):
    ``{name: {"stop", "kernel", "risk", "predicted", "outcome"}}`` (``predicted``: the forecast of the
    decision, ``J(s*, T − t) − Φ*_λ`` for a freeze; ``outcome``: freeze, iterate or solve)."""
    import warnings

    from linattn_theory.recommenders.scoring import realised_risk, replay_online
    target = Path(path)
    done = _outcomes_of(target, Path(record_path))
    todo = {name: spec for name, spec in rules.items() if name not in done}
    if not todo:
        return path
    record = json.loads(Path(record_path).read_text())
    done[RECORD_DIGEST] = _digest(Path(record_path))
    config = config_from_dict(config_dict)
    realised = {}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for name, spec in todo.items():
            t, s, decision = replay_online(record, _rule_of(spec))
            outcome = decision.outcome
            if (t, s, outcome) not in realised:
                realised[(t, s, outcome)] = realised_risk(record, t, s, config, outcome=outcome)
            done[name] = {"stop": int(t), "kernel": int(s), "risk": realised[(t, s, outcome)],
                          "predicted": float(decision.freeze_objective), "outcome": outcome}
    write_json(target, done)
    return path


#: The key of a rules file that names the record its outcomes were replayed on (its SHA-256).
RECORD_DIGEST = "_record_sha256"


def _digest(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _outcomes_of(rules_path: Path, record_path: Path) -> dict:
    """The cached outcomes of ``rules_path`` if they were replayed on the record now at
    ``record_path`` (a recomputed record, of a new format say, makes them stale: ``{}``)."""
    if not rules_path.exists():
        return {}
    done = json.loads(rules_path.read_text())
    return done if done.get(RECORD_DIGEST) == _digest(record_path) else {}


def rule_outcomes(table: pd.DataFrame, records: dict, cache: Path, rules: dict, workers: int) -> dict:
    """``{key: {rule name: outcome}}`` for the instances of ``table`` whose FedAvg path is scored."""
    rows = [(k, c) for k, c in zip(table["key"], table["config"]) if not records[k]["fedavg_diverged"]]
    paths = {k: cache / f"{k}.rules.json" for k, _ in rows}
    todo = []
    for key, cfg in rows:
        done = _outcomes_of(paths[key], cache / f"{key}.json")
        if any(name not in done for name in rules):
            todo.append((_outcomes, str(cache / f"{key}.json"), cfg, rules, str(paths[key])))
    _parallel(todo, workers, "rules")
    outcomes = {k: json.loads(paths[k].read_text()) for k, _ in rows}
    return {k: {name: o for name, o in done.items() if name != RECORD_DIGEST} for k, done in outcomes.items()}


def design_rules(quick: bool = False) -> dict:
    """``{name: (window, horizon, confidence, gain_confidence, descent_confidence, checks)}``: the
    candidates of :data:`CANDIDATES` and the previous rule."""
    rules = candidate_rules(QUICK["candidates"] if quick else None)
    rules[rule_name(**PREVIOUS)] = rule_spec(PREVIOUS, PREVIOUS["checks"])
    return rules


def ablations(chosen: dict) -> dict:
    """The chosen rule with each of its tests left out (what each test does, on the design sets)."""
    specs = (rule_spec(chosen, tuple(c for c in CHECKS if c != left)) for left in CHECKS)
    return {rule_name(*spec): spec for spec in specs}


def design_table(table: pd.DataFrame, records: dict, outcomes: dict, rules: dict) -> pd.DataFrame:
    """Per design variant and rule: instances, median, mean, 90th percentile and max regret, and
    harm (regret above FedAvg's by more than :data:`HARM_MARGIN`)."""
    design = table[(table["role"] == "design") & table["key"].isin(list(outcomes))]
    rows = []
    for name, (w, h, z, zg, zd, checks) in rules.items():
        for variant, part in design.groupby("variant", sort=False):
            r, harm = [], 0
            for key in part["key"]:
                R = np.asarray(records[key]["excess_risk"], dtype=float)
                value = regret(float(outcomes[key][name]["risk"]), R)
                r.append(value)
                harm += value - regret(R[-1], R) > HARM_MARGIN
            r = np.asarray(r)
            rows.append({"rule": name, "window": w, "horizon": h, "confidence": z, "gain_confidence": zg,
                         "descent_confidence": zd if _given(zd) else np.nan, "checks": "+".join(checks),
                         "variant": variant, "instances": len(r), "median": np.percentile(r, 50, method="higher"),
                         "mean": np.mean(r), "p90": np.percentile(r, 90, method="higher"), "max": np.max(r),
                         "harm": int(harm)})
    return pd.DataFrame(rows)


# ======================================================================================
# the scores
# ======================================================================================
def score_table(table: pd.DataFrame, records: dict, outcomes: dict, chosen: str) -> pd.DataFrame:
    """One row per evaluation instance and recommender/baseline: recommended and best ``T0``, regret;
    for the online rules also the round it decided, and the forecast and realised ``R``."""
    rows = []
    previous = rule_name(**PREVIOUS)
    for _, inst in table[table["role"] == "evaluation"].iterrows():
        rec = records[inst["key"]]
        R = np.asarray(rec["excess_risk"], dtype=float)
        T = len(R) - 1
        base = {k: inst[k] for k in ("set", "variant", "setting", "family", "heterogeneity", "local_steps",
                                     "learning_rate", "seed")}
        base.update(best_T0=rec["best_T0"], fedavg_diverged=rec["fedavg_diverged"])
        if rec["fedavg_diverged"]:
            rows.append({**base, "recommender": "none", "T0": np.nan, "stop_round": np.nan, "regret": np.nan})
            continue
        source = table[(table["set"] == TRANSFER_FROM[inst["variant"]]) & (table["setting"] == inst["setting"])]
        fitted = [records[k].get("a_posteriori_T0") for k in source["key"]]
        fitted = [t for t in fitted if t is not None]
        peers = table[(table["setting"] == inst["setting"]) & (table["set"] == inst["set"])]
        seeds = sorted(peers["seed"])
        other = seeds[(seeds.index(inst["seed"]) + 1) % len(seeds)]
        oracle = records[peers.loc[peers["seed"] == other, "key"].iloc[0]]["best_T0"]
        choices = {name: (out["kernel"], float(out["risk"]), out["stop"], float(out["predicted"]))
                   for name, out in (("online", outcomes[inst["key"]][chosen]),
                                     ("previous", outcomes[inst["key"]][previous]))}
        choices.update({"pilot": rec["pilot_T0"], "a_posteriori": rec["a_posteriori_T0"], "fedavg": T,
                        "half": T // 2, "cross_seed_oracle": oracle})
        if fitted:
            choices["transfer"] = int(np.round(np.median(fitted)))
        for name, choice in choices.items():
            T0, risk, stop, predicted = choice if isinstance(choice, tuple) else (choice, R[choice], choice, np.nan)
            rows.append({**base, "recommender": name, "T0": int(T0), "stop_round": int(stop),
                         "regret": regret(risk, R), "risk": float(risk), "predicted": float(predicted)})
    return pd.DataFrame(rows)


def _pct(v) -> str:
    """``v`` in percent with one decimal (``∞`` for a diverged run; never ``-0.0``; from a million
    percent on, two significant digits and the exponent: a frozen stage that blew up without overflowing)."""
    if not np.isfinite(v):
        return "∞"
    return f"{100 * v:.1e}" if abs(100 * v) >= 1e6 else f"{round(100 * v, 1) + 0.0:.1f}"


def paired(scores: pd.DataFrame, name: str, arm: str, other: str) -> dict:
    """Paired per instance of set ``name``: ``arm`` better / tied (within :data:`TIE`) / worse than
    ``other``, and harm (``arm`` worse by more than :data:`HARM_MARGIN`)."""
    part = scores[(scores["set"] == name) & (scores["recommender"].isin([arm, other]))]
    wide = part.pivot_table(index=["setting", "seed"], columns="recommender", values="regret").dropna()
    d = wide[arm].to_numpy() - wide[other].to_numpy()
    d = np.where(np.isnan(d), 0.0, d)      # both ∞ (both diverged) counts as tied
    return {"instances": len(d), "better": int(np.sum(d < -TIE)), "tied": int(np.sum(np.abs(d) <= TIE)),
            "worse": int(np.sum(d > TIE)), "harm": int(np.sum(d > HARM_MARGIN))}


def summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Per set and recommender, all scored instances: count, median with a bootstrap 95 % interval,
    mean, 90th percentile and max regret, share within 5 %, diverged recommendations, and harm
    against FedAvg (regret above FedAvg's by more than :data:`HARM_MARGIN`)."""
    rng = np.random.default_rng(0)
    rows = []
    valid = scores[scores["recommender"] != "none"]
    order = dict(method="higher")     # order statistics: a diverged run (regret ∞) stays ∞
    for (name, rec), group in valid.groupby(["set", "recommender"], sort=False):
        r = group["regret"].to_numpy()
        boot = np.median(rng.choice(r, size=(2000, len(r))), axis=1)
        rows.append({"set": name, "recommender": rec, "instances": len(r),
                     "median": np.percentile(r, 50, **order), "median_low": np.percentile(boot, 2.5, **order),
                     "median_high": np.percentile(boot, 97.5, **order), "mean": np.mean(r),
                     "p90": np.percentile(r, 90, **order), "max": np.max(r),
                     "share_within_5pct": np.mean(r <= 0.05), "diverged": int(np.sum(~np.isfinite(r))),
                     "harm": paired(scores, name, rec, "fedavg")["harm"] if rec != "fedavg" else 0})
    table = pd.DataFrame(rows)
    order = {name: i for i, name in enumerate(RECOMMENDERS + BASELINES)}
    return table.sort_values(["set", "recommender"], key=lambda c: c.map(order) if c.name == "recommender"
                             else c, kind="stable").reset_index(drop=True)


def set_title(name: str) -> str:
    variant, _, seeds = SETS[name]
    return f"Evaluation set `{name}` ({VARIANTS[variant]['title']}; seeds {seeds[0]}–{seeds[-1]})"


def markdown(summ: pd.DataFrame, scores: pd.DataFrame, name: str) -> str:
    """The tables of evaluation set ``name`` (regrets in percent)."""
    ev = summ[summ["set"] == name]
    inst = scores[scores["set"] == name].drop_duplicates(["setting", "seed"])
    scored = scores[(scores["set"] == name) & (scores["recommender"] != "none")]
    lines = [f"{set_title(name)}: {len(inst)} instances ({int(inst['fedavg_diverged'].sum())} with a diverging "
             f"FedAvg path, not scored). Regret R(T0_rec)/R(T0_best) − 1 in percent, every scored instance; "
             f"median with a bootstrap 95 % interval; harm: regret above FedAvg's by more than "
             f"{100 * HARM_MARGIN:g} points; a recommendation whose run diverges has regret ∞.", "",
             "| recommender | n | median [95 % CI] | mean | 90th pct | max | ≤ 5 % | diverged | harm |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, r in ev.iterrows():
        lines.append(f"| {LABELS[r['recommender']]} | {r['instances']} | "
                     f"{_pct(r['median'])} [{_pct(r['median_low'])}, {_pct(r['median_high'])}] | "
                     f"{_pct(r['mean'])} | {_pct(r['p90'])} | {_pct(r['max'])} | "
                     f"{100 * r['share_within_5pct']:.0f} % | {int(r['diverged'])} | "
                     f"{'–' if r['recommender'] == 'fedavg' else int(r['harm'])} |")
    online_rows = scored[(scored["recommender"] == "online") & np.isfinite(scored["regret"])]
    if len(online_rows):
        w = online_rows.loc[online_rows["regret"].idxmax()]
        fedavg_worst = scored[(scored["recommender"] == "fedavg") & (scored["setting"] == w["setting"])
                              & (scored["seed"] == w["seed"])]["regret"].iloc[0]
        lines += ["", f"The online rule's worst instance (the figure's top panel): {w['family']}, heterogeneity "
                      f"{w['heterogeneity']:g}, E = {int(w['local_steps'])}, η = {w['learning_rate']:.3g}, seed "
                      f"{int(w['seed'])}: it decided at round {int(w['stop_round'])} and froze the kernel of round "
                      f"{int(w['T0'])} (best T0 = {int(w['best_T0'])}), regret {_pct(w['regret'])} % against "
                      f"FedAvg's {_pct(fedavg_worst)} %."]
    lines += ["", f"Paired per instance (ties: regrets within {100 * TIE:g} point):", "",
              "| arm | against | instances | better | tied | worse | harm (> 2 points worse) |",
              "|---|---|---|---|---|---|---|"]
    for arm, other in (("online", "fedavg"), ("online", "half"), ("online", "previous"), ("previous", "fedavg")):
        p = paired(scores, name, arm, other)
        lines.append(f"| {LABELS[arm]} | {LABELS[other]} | {p['instances']} | {p['better']} | {p['tied']} | "
                     f"{p['worse']} | {p['harm']} |")
    lines += ["", "By setting (online rule; FedAvg's mean beside it):", "",
              "| setting | n | median | mean | max | harm | FedAvg mean |", "|---|---|---|---|---|---|---|"]
    online, fedavg = (scored[scored["recommender"] == r] for r in ("online", "fedavg"))
    for column, text in (("heterogeneity", "heterogeneity"), ("local_steps", "E"), ("learning_rate", "η")):
        for (family, value), part in online.groupby(["family", column]):
            base = fedavg[(fedavg["family"] == family) & (fedavg[column] == value)]
            d = part.set_index(["setting", "seed"])["regret"] - base.set_index(["setting", "seed"])["regret"]
            lines.append(f"| {family}, {text} = {value:g} | {len(part)} | {_pct(part['regret'].median())} | "
                         f"{_pct(part['regret'].mean())} | {_pct(part['regret'].max())} | "
                         f"{int((d > HARM_MARGIN).sum())} | {_pct(base['regret'].mean())} |")
    return "\n".join(lines) + "\n"


def forecast_errors(scores: pd.DataFrame) -> pd.DataFrame:
    """Per evaluation set: the online rule's forecast ``R`` of its decision against the realised one,
    ``(R_realised − R_forecast)/R_forecast``: median, 90th percentile of its size, max size."""
    rows = []
    online = scores[scores["recommender"] == "online"]
    for name, part in online.groupby("set", sort=False):
        e = ((part["risk"] - part["predicted"]) / part["predicted"]).to_numpy()
        e = e[np.isfinite(e)]
        rows.append({"set": name, "instances": len(e), "median": np.median(e),
                     "p90_abs": np.percentile(np.abs(e), 90), "max_abs": np.max(np.abs(e))})
    return pd.DataFrame(rows)


def design_markdown(design: pd.DataFrame, top: int = 8) -> str:
    """The criterion's verdict and the best ``top`` candidates, the previous rule and the chosen
    rule's ablations, per design variant (regret in percent; harm counts)."""
    chosen = choose_rule(design)
    name = rule_name(*rule_spec(chosen))
    variants = list(dict.fromkeys(design["variant"]))
    n = {v: int(design.loc[design["variant"] == v, "instances"].iloc[0]) for v in variants}
    full = design[design["checks"] == "+".join(CHECKS)]
    per = full.groupby("rule", sort=False)
    ranking = pd.DataFrame({"share": (full["harm"] / full["instances"]).groupby(full["rule"]).max(),
                            "mean": per["mean"].mean()})
    ranking = ranking.sort_values(["share", "mean"], kind="stable")
    shown = list(ranking.index[:top])
    shown += [r for r in [name, rule_name(**PREVIOUS)] +
              list(ablations(chosen)) if r not in shown]
    lines = [f"Design sets ({', '.join(f'{v}: {n[v]}' for v in variants)} scored instances): "
             f"{len(ranking)} candidate rules (window w, horizon h, confidence z, gain confidence zg, descent confidence zd), "
             f"the previous rule and "
             f"the chosen rule without each of its tests. Criterion (`choose_rule`, fixed before any "
             f"evaluation score): harm on at most {100 * DESIGN_HARM_LIMIT:g} % of every design variant's "
             f"instances, then the smallest mean over variants of the mean regret. Admissible: "
             f"{chosen['admissible']} of {len(ranking)}; chosen: **{name}**. Mean regret in percent / harm count "
             f"per variant; the {top} best candidates by largest harm share, then mean:", "",
             "| rule | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for rule in shown:
        cells = []
        for v in variants:
            row = design[(design["rule"] == rule) & (design["variant"] == v)].iloc[0]
            cells.append(f"{_pct(row['mean'])} / {int(row['harm'])}")
        lines.append(f"| {'**' + rule + '**' if rule == name else rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report(scores: pd.DataFrame, design: pd.DataFrame) -> str:
    """``predictive_regret.md``: the tables of every evaluation set, the forecast errors, the design table."""
    summ = summary(scores)
    names = [name for name in SETS if name in set(scores["set"])]
    parts = [markdown(summ, scores, name) for name in names]
    errors = forecast_errors(scores)
    lines = ["The online rule's forecast against its realised outcome, (R_realised − R_forecast)/R_forecast "
             "in percent (exact with full batches and full participation; the forecast of the mean "
             "dynamics otherwise):", "", "| set | n | median | 90th pct of size | max size |", "|---|---|---|---|---|"]
    for _, r in errors.iterrows():
        lines.append(f"| `{r['set']}` | {r['instances']} | {100 * r['median']:.2g} | {100 * r['p90_abs']:.2g} | "
                     f"{100 * r['max_abs']:.2g} |")
    return (goal_markdown(summ) + "\n" + "\n".join(parts) + "\n" + "\n".join(lines) + "\n\n"
            + design_markdown(design))


def goal_markdown(summ: pd.DataFrame) -> str:
    """The goal of issue 18 on every evaluation set: median and worst regret of the online rule and
    the share of instances it harms (regret above FedAvg's by more than 2 points), met or not."""
    online = summ[summ["recommender"] == "online"]
    lines = [f"The online rule against the goal on every evaluation set: median regret ≤ {100 * GOAL['median']:g} %, "
             f"worst ≤ {100 * GOAL['max']:g} %, harm (regret above FedAvg's by more than {100 * HARM_MARGIN:g} "
             f"points) on ≤ {100 * GOAL['harm_share']:g} % of the instances; FedAvg's median and worst beside it:", "",
             "| set | n | median | worst | harmed | FedAvg median | FedAvg worst | goal met |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in online.iterrows():
        fedavg = summ[(summ["set"] == r["set"]) & (summ["recommender"] == "fedavg")].iloc[0]
        met = {"median": r["median"] <= GOAL["median"], "worst": r["max"] <= GOAL["max"],
               "no harm": r["harm"] <= GOAL["harm_share"] * r["instances"]}
        verdict = "yes" if all(met.values()) else "no: " + ", ".join(k for k, v in met.items() if not v)
        lines.append(f"| `{r['set']}` | {r['instances']} | {_pct(r['median'])} % | {_pct(r['max'])} % | "
                     f"{int(r['harm'])} ({100 * r['harm'] / r['instances']:.1f} %) | {_pct(fedavg['median'])} % | "
                     f"{_pct(fedavg['max'])} % | {verdict} |")
    return "\n".join(lines) + "\n"


#: Regrets below this (in percent, 0 included) are drawn at it on the log regret axes.
REGRET_FLOOR = 0.01
#: Candidate ticks of a log axis of ``R(T0)/R(T0_best)``.
RATIO_TICKS = (1.0, 1.01, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def _plain(value: float) -> str:
    return f"{value:g}"


def ratio_axis(ax, top: float) -> None:
    """A log axis of ``R(T0)/R(T0_best)`` from 1 to ``top``, labelled in plain numbers at ticks of
    :data:`RATIO_TICKS` at least a sixth of the axis apart."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    top = max(float(top), 1.02)
    ax.set_yscale("log")
    ax.set_ylim(1.0 / top ** 0.04, top ** 1.04)
    ticks, gap = [], np.log10(top) / 6
    for t in (t for t in RATIO_TICKS if t <= top ** 1.04):
        if not ticks or np.log10(t / ticks[-1]) >= gap:
            ticks.append(t)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _plain(v)))
    ax.yaxis.set_minor_locator(NullLocator())


def regret_axis(ax, top: float) -> None:
    """A log axis of the regret in percent from :data:`REGRET_FLOOR` to ``top``, ticked at the decades
    in plain numbers; the floor's tick reads ``≤ 0.01`` (zero regrets are drawn there)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    top = max(float(top), 10 * REGRET_FLOOR)
    ax.set_yscale("log")
    ax.set_ylim(REGRET_FLOOR / 1.5, top * 1.5)
    ticks = [REGRET_FLOOR * 10 ** k for k in range(int(np.ceil(np.log10(top * 1.5 / REGRET_FLOOR))))]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: f"≤ {_plain(REGRET_FLOOR)}" if np.isclose(v, REGRET_FLOOR) else _plain(float(f"{v:.6g}"))))
    ax.yaxis.set_minor_locator(NullLocator())


def plot(scores: pd.DataFrame, records: dict, table: pd.DataFrame, out: Path, quick: bool) -> None:
    """Per evaluation set: the online rule's worst instance (``R(T0)/R(T0_best)`` with its stop, its
    frozen kernel, FedAvg and the best ``T0``), and the distribution of ``R_rec/R_best`` of the online
    rule, the previous rule, FedAvg and ``T0 = T/2``."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from linattn_theory.report import plotting

    names = [name for name in SETS if name in set(scores["set"])]
    colors = plotting.palette(10)
    color = {k: colors[i] for k, i in COLORS.items()}
    fig, axes = plotting.figure(len(names), 2, height=2.3, quick=quick, layout="constrained")
    axes = np.reshape(axes, (2, len(names)))
    plotted = []
    arms = ("online", "previous", "fedavg", "half")
    for j, name in enumerate(names):
        ev = scores[(scores["set"] == name) & (scores["recommender"] != "none")]
        online = ev[(ev["recommender"] == "online") & np.isfinite(ev["regret"])]
        ax = axes[0, j]
        if len(online):
            worst = online.loc[online["regret"].idxmax()]
            key = table.loc[(table["set"] == name) & (table["setting"] == worst["setting"])
                            & (table["seed"] == worst["seed"]), "key"].iloc[0]
            R = np.asarray(records[key]["excess_risk"], dtype=float)
            ratio = R / np.min(R[np.isfinite(R)])
            T = len(R) - 1
            ax.plot(np.arange(T + 1), ratio, color="0.3", lw=1.0, zorder=1)
            ax.axvline(worst["stop_round"], color=color["online"], ls="--", lw=0.9, zorder=1)
            # markers that may coincide (best T0 = T, the online T0 = T) stay distinguishable: a large
            # star under an open square under a small dot
            ax.plot([worst["best_T0"]], [1.0], marker="*", color=color["best"], ms=10, ls="none", zorder=2)
            ax.plot([T], [ratio[T]], marker="s", mfc="none", mec=color["fedavg"], mew=1.2, ms=7, ls="none",
                    zorder=3)
            ax.plot([worst["T0"]], [1 + worst["regret"]], marker="o", color=color["online"], ms=3.5, ls="none",
                    zorder=4)
            ratio_axis(ax, np.max(ratio[np.isfinite(ratio)]))
            fam = "planted" if worst["family"] == "planted_kernel" else "in-context"
            ax.set_title(f"{name.replace('evaluation', 'eval.').replace('_', ' ')}\nworst: {fam}\nhet. "
                         f"{worst['heterogeneity']:g}, E = {int(worst['local_steps'])}\nη = {worst['learning_rate']:.2g}\n"
                         f"seed {int(worst['seed'])}\nregret {_pct(worst['regret'])} %\nFedAvg "
                         f"{_pct(ratio[T] - 1)} %", fontsize=7)
            ax.set_xlabel("warm-up $T_0$")
            plotted.append(pd.DataFrame({"set": name, "panel": "worst", "x": np.arange(T + 1), "y": ratio}))
        if j == 0:
            ax.set_ylabel("$R(T_0)/R(T_0^{best})$")
        ax = axes[1, j]
        for i, arm in enumerate(arms):
            r = 100 * ev.loc[ev["recommender"] == arm, "regret"].to_numpy()
            r = np.maximum(r[np.isfinite(r)], REGRET_FLOOR)
            x = i + np.random.default_rng(i).uniform(-0.25, 0.25, len(r))
            ax.scatter(x, r, s=3, color=color[arm], alpha=0.5, linewidths=0)
            if len(r):
                ax.plot([i - 0.35, i + 0.35], [np.median(r)] * 2, color="black", lw=1.0)
            plotted.append(pd.DataFrame({"set": name, "panel": arm, "x": x, "y": r}))
        ax.set_xticks(range(len(arms)), ["online", "prev.", "FedAvg", "T/2"], rotation=90)
        ax.set_xlim(-0.6, len(arms) - 0.4)
        finite = ev["regret"].to_numpy()[np.isfinite(ev["regret"].to_numpy())]
        regret_axis(ax, 100 * (finite.max() if len(finite) else 0.0))
        if j == 0:
            ax.set_ylabel("regret (%) per instance")
    handles = [Line2D([], [], color="0.3", lw=1.0, label="$R(T_0)/R(T_0^{best})$ of the worst instance"),
               Line2D([], [], color=color["best"], marker="*", ms=8, ls="none", label="best $T_0$"),
               Line2D([], [], color=color["online"], ls="--", lw=0.9, label="round the online rule decided"),
               Line2D([], [], color=color["online"], marker="o", ls="none", label="online: frozen kernel's round, its $R$"),
               Line2D([], [], marker="s", mfc="none", mec=color["fedavg"], ls="none", label="FedAvg ($T_0 = T$)"),
               Line2D([], [], color=color["previous"], marker="o", ls="none", label="previous online rule"),
               Line2D([], [], color=color["half"], marker="o", ls="none", label="$T_0 = T/2$"),
               Line2D([], [], color="black", lw=1.0, label="median over the set's instances")]
    plotting.legend_below(fig, handles, [h.get_label() for h in handles], ncols=3)
    plotting.save_figure(fig, "predictive_regret", out, pd.concat(plotted, ignore_index=True) if plotted else None)


# ======================================================================================
# round 4 (issue 31): one rule per information set, chosen on the design sets, scored on fresh
# seeds and held-out settings (docs/theory.md §8, "Round 4")
# ======================================================================================
def rule_name_r4(kind: str, params: dict) -> str:
    """A round-4 rule's name in the tables: its registry name and its parameters."""
    return kind if not params else f"{kind}(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"


def candidate_rules_r4(grid=None) -> dict:
    """``{name: (kind, params)}``: the candidates of ``grid`` (default :data:`CANDIDATES_R4`; the
    decomposition forecast only with a no-harm test) and round 3's rule (``online``)."""
    grid = CANDIDATES_R4 if grid is None else grid
    rules = {}
    for kind, axes in grid.items():
        for values in itertools.product(*axes.values()):
            params = dict(zip(axes, values))
            if params.get("no_harm", 0.0) is None and params.get("forecast") == "decomposition":
                continue
            rules[rule_name_r4(kind, params)] = (kind, params)
    rules[rule_name_r4("online", ROUND3_RULE)] = ("online", dict(ROUND3_RULE))
    return rules


def information_set_of(kind: str) -> str:
    """The information set of a registered rule (:data:`~linattn_theory.recommenders.rules.RULES`)."""
    from linattn_theory.recommenders.rules import RULES
    return RULES[kind].information_set


def captured_share(rule_regret, fedavg_regret, gap: float = GOAL_R4["gap"]) -> np.ndarray:
    """``(r_FedAvg − r_rule)/r_FedAvg`` on the instances where FedAvg's regret exceeds ``gap``: the share
    of FedAvg's excess over the best warm-up that the rule recovers (1: all of it; 0: none; negative:
    worse than FedAvg; above 1: better than every FedFrozen ``T0``, the value solve)."""
    r, f = np.asarray(rule_regret, dtype=float), np.asarray(fedavg_regret, dtype=float)
    keep = f > gap
    return (f[keep] - r[keep]) / f[keep]


def _regret_rows(table: pd.DataFrame, records: dict, outcomes: dict, rules: dict) -> pd.DataFrame:
    """One row per scored instance of ``table`` and rule of ``rules``: regret, FedAvg's regret, harm."""
    rows = []
    for _, inst in table[table["key"].isin(list(outcomes))].iterrows():
        R = np.asarray(records[inst["key"]]["excess_risk"], dtype=float)
        fedavg = regret(R[-1], R)
        for name, (kind, _) in rules.items():
            out = outcomes[inst["key"]][name]
            r = regret(float(out["risk"]), R)
            rows.append({"set": inst["set"], "variant": inst["variant"], "setting": inst["setting"],
                         "family": inst["family"], "heterogeneity": inst["heterogeneity"],
                         "local_steps": inst["local_steps"], "learning_rate": inst["learning_rate"],
                         "seed": inst["seed"], "rule": name, "kind": kind,
                         "information_set": information_set_of(kind), "stop_round": out["stop"],
                         "T0": out["kernel"], "outcome": out.get("outcome", "freeze"), "regret": r,
                         "fedavg_regret": fedavg, "harm": bool(r - fedavg > HARM_MARGIN)})
    return pd.DataFrame(rows)


def _scores(group: pd.DataFrame) -> dict:
    r = group["regret"].to_numpy()
    captured = captured_share(r, group["fedavg_regret"].to_numpy())
    order = dict(method="higher")
    return {"instances": len(r), "median": np.percentile(r, 50, **order), "mean": np.mean(r),
            "max": np.max(r), "harm": int(group["harm"].sum()), "gap_instances": len(captured),
            "captured": float(np.median(captured)) if len(captured) else np.nan}


def design_table_r4(table: pd.DataFrame, records: dict, outcomes: dict, rules: dict) -> pd.DataFrame:
    """Per design variant and round-4 candidate: instances, median, mean and max regret, harm, and the
    median captured share of FedAvg's gap (:func:`captured_share`) with its instance count."""
    rows = _regret_rows(table[table["role"] == "design"], records, outcomes, rules)
    out = [{"rule": rule, "kind": part["kind"].iloc[0], "information_set": part["information_set"].iloc[0],
            "variant": variant, **_scores(part)}
           for (rule, variant), part in rows.groupby(["rule", "variant"], sort=False)]
    return pd.DataFrame(out)


def choose_rules_r4(design: pd.DataFrame) -> dict:
    """The criterion of round 4 (pre-registered), per information set: among its candidates (round 3's
    rule is a reference, not a candidate) admissible are those whose harm share is at most
    :data:`DESIGN_HARM_LIMIT_R4` on every design variant; among them the smallest mean over variants of
    the mean regret wins, ties broken by the name. If none is admissible, the smallest largest harm share
    wins (then the same order). Returns ``{information set: {"rule", "admissible", "candidates"}}``."""
    chosen = {}
    pool = design[design["kind"] != "online"]
    for info, part in pool.groupby("information_set", sort=True):
        per = part.assign(share=part["harm"] / part["instances"]).groupby("rule")
        ranking = pd.DataFrame({"worst_share": per["share"].max(), "mean_of_means": per["mean"].mean()})
        ranking["admissible"] = ranking["worst_share"] <= DESIGN_HARM_LIMIT_R4
        ranking = ranking.reset_index()
        ok = ranking[ranking["admissible"]]
        key = ["mean_of_means", "rule"] if len(ok) else ["worst_share", "mean_of_means", "rule"]
        best = (ok if len(ok) else ranking).sort_values(key, kind="stable").iloc[0]
        chosen[info] = {"rule": best["rule"], "admissible": int(ranking["admissible"].sum()),
                        "candidates": len(ranking)}
    return chosen


def goals_r4(scores: pd.DataFrame) -> pd.DataFrame:
    """Per evaluation set and arm: the scores of :func:`_scores` and, for each goal of :data:`GOAL_R4`,
    met or not."""
    rows = []
    for (name, rule), part in scores.groupby(["set", "rule"], sort=False):
        row = {"set": name, "rule": rule, "information_set": part["information_set"].iloc[0], **_scores(part)}
        row.update(median_met=row["median"] <= GOAL_R4["median"], max_met=row["max"] <= GOAL_R4["max"],
                   harm_met=row["harm"] <= GOAL_R4["harm_share"] * row["instances"],
                   captured_met=bool(row["gap_instances"] == 0 or row["captured"] >= GOAL_R4["captured"]))
        rows.append(row)
    return pd.DataFrame(rows)


def report_r4(goals: pd.DataFrame, chosen: dict, round_number: int = 4) -> str:
    """``predictive_regret_r4.md`` (``_r5`` for round 5): the choice per information set and the goals on
    every evaluation set."""
    lines = [f"Round {round_number} (issue 31): one rule per information set, chosen on the design sets by `choose_rules_r4`, "
             "scored on fresh seeds and held-out settings. Goals on every evaluation set: median ≤ "
             f"{100 * GOAL_R4['median']:g} %, worst ≤ {100 * GOAL_R4['max']:g} %, harm on ≤ "
             f"{100 * GOAL_R4['harm_share']:g} % of the instances, median captured share of FedAvg's gap ≥ "
             f"{100 * GOAL_R4['captured']:g} % where FedAvg's regret exceeds {100 * GOAL_R4['gap']:g} %.", ""]
    for info, c in chosen.items():
        lines.append(f"- {info}: **{c['rule']}** ({c['admissible']} of {c['candidates']} admissible)")
    lines += ["", "| set | rule | n | median | worst | harmed | gap n | captured | goals met |",
              "|---|---|---|---|---|---|---|---|---|"]
    for _, r in goals.iterrows():
        met = [g for g in ("median", "max", "harm", "captured") if not r[f"{g}_met"]]
        captured = "–" if not r["gap_instances"] else f"{100 * r['captured']:.0f} %"
        lines.append(f"| `{r['set']}` | {r['rule']} | {r['instances']} | {_pct(r['median'])} % | {_pct(r['max'])} % | "
                     f"{r['harm']} | {r['gap_instances']} | {captured} | {'yes' if not met else 'no: ' + ', '.join(met)} |")
    return "\n".join(lines) + "\n"


def rounds_declared() -> dict:
    """Rounds 4 to 7 as declared: their sets and quick sets, candidate grids (full and quick), the rules
    scored beside the choice on the evaluation sets, and the prefix of their tables."""
    round3 = {rule_name_r4("online", ROUND3_RULE): ("online", dict(ROUND3_RULE))}
    return {4: {"sets": SETS_R4, "quick": QUICK_R4, "candidates": CANDIDATES_R4, "carried": round3,
                "prefix": "predictive_regret_r4"},
            5: {"sets": SETS_R5, "quick": QUICK_R5, "candidates": CANDIDATES_R5, "carried": {**CARRIED_R5, **round3},
                "prefix": "predictive_regret_r5"},
            6: {"sets": SETS_R6, "quick": QUICK_R6, "candidates": CANDIDATES_R6, "carried": {**CARRIED_R6, **round3},
                "prefix": "predictive_regret_r6"},
            7: {"sets": SETS_R7, "quick": QUICK_R7, "candidates": CANDIDATES_R7, "carried": {**CARRIED_R7, **round3},
                "prefix": "predictive_regret_r7"}}


def main_round(args, out: Path, cache: Path) -> int:
    """Round 4, 5, 6 or 7 (``args.round``): records (format 4) of the design sets, every candidate replayed on
    them, the design table and the choice per information set (``--design-only`` stops here), then the
    evaluation sets scored once: the chosen rules, the round's carried rules (round 3's; for round 5 also
    round 4's choice; for round 6 also round 5's), FedAvg and the value solve in the last round (strategy
    ``value_solve_final``, a baseline of information set (c))."""
    start = time.perf_counter()
    declared = rounds_declared()[args.round]
    prefix = declared["prefix"]
    table = instances(args.quick, args.backend, sets=declared["sets"], quick_sets=declared["quick"]["sets"])
    out.mkdir(parents=True, exist_ok=True)
    restarts = QUICK["restarts"] if args.quick else 8
    design_part = table[table["role"] == "design"]
    records = compute(design_part, cache, args.workers, restarts)
    rules = candidate_rules_r4(declared["quick"]["candidates"] if args.quick else declared["candidates"])
    outcomes = rule_outcomes(design_part, records, cache, rules, args.workers)
    atomic_write_text(out / f"{prefix}_design.csv",
                      design_table_r4(table, records, outcomes, rules).to_csv(index=False, float_format="%.6g"))
    chosen = choose_rules_r4(pd.read_csv(out / f"{prefix}_design.csv"))
    write_json(out / f"{prefix}_choice.json", chosen)
    print(json.dumps(chosen, indent=1))
    if args.design_only:
        print(f"wrote {out / f'{prefix}_design.csv'}, {prefix}_choice.json ({time.perf_counter() - start:.0f} s)")
        return 0
    evaluation = table[table["role"] == "evaluation"]
    records.update(compute(evaluation, cache, args.workers, restarts))
    wanted = {c["rule"]: rules[c["rule"]] for c in chosen.values()}
    wanted.update(declared["carried"])
    outcomes.update(rule_outcomes(evaluation, records, cache, wanted, args.workers))
    scores = _regret_rows(evaluation, records, outcomes, wanted)
    baselines = []
    for _, inst in evaluation[evaluation["key"].isin(list(outcomes))].iterrows():
        record = records[inst["key"]]
        R = np.asarray(record["excess_risk"], dtype=float)
        T = len(R) - 1
        for name, risk, info in (("fedavg", R[-1], "none"),
                                 ("value_solve_final", realised_risk(record, T - 1, T - 1, outcome="solve"),
                                  "value_moments_and_solve")):
            r = regret(float(risk), R)
            baselines.append({**{k: inst[k] for k in ("set", "variant", "setting", "family", "heterogeneity",
                                                        "local_steps", "learning_rate", "seed")},
                              "rule": name, "kind": name, "information_set": info, "stop_round": T,
                              "T0": T if name == "fedavg" else T - 1, "outcome": name, "regret": r,
                              "fedavg_regret": regret(R[-1], R), "harm": bool(r - regret(R[-1], R) > HARM_MARGIN)})
    scores = pd.concat([scores, pd.DataFrame(baselines)], ignore_index=True)
    atomic_write_text(out / f"{prefix}_scores.csv", scores.to_csv(index=False, float_format="%.6g"))
    goals = goals_r4(pd.read_csv(out / f"{prefix}_scores.csv"))
    atomic_write_text(out / f"{prefix}_summary.csv", goals.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out / f"{prefix}.md", report_r4(goals, chosen, args.round))
    print(report_r4(goals, chosen, args.round))
    print(f"wrote {out / f'{prefix}_scores.csv'}, {prefix}_summary.csv, {prefix}.md "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


# ======================================================================================
# a posteriori (round 5): was the value solve's harm under client sampling the last round's luck?
# ======================================================================================
#: The set whose harms the redraws examine, and how many redraws per instance.
REDRAWN_SET, REDRAWS = "r5_heldout_participation", 40


def _redraw_row(config_dict: dict, record_path: str, draws: int) -> dict:
    """Worker: one instance's redraws of FedAvg's last round against round 4's value solve (at
    ``argmin_{s ≤ T−1} Φ_λ(K_s)``): its observed harm, the share of redraws it would harm by more than
    :data:`HARM_MARGIN` (the regrets of both against the instance's own ``R``), the redraws' median."""
    import warnings

    from linattn_theory.recommenders.scoring import last_round_redraws
    record = json.loads(Path(record_path).read_text())
    R = np.asarray(record["excess_risk"], dtype=float)
    T = len(R) - 1
    profile = np.asarray(record["profile"][:T], dtype=float)
    solve = float(profile[int(np.argmin(profile))])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        ends = last_round_redraws(config_from_dict(config_dict), draws=draws) - float(record["optimum"])
    harm = regret(solve, R) - np.asarray([regret(e, R) for e in ends])
    return {"solve_regret": regret(solve, R), "fedavg_regret": regret(R[-1], R),
            "harmed": bool(regret(solve, R) - regret(R[-1], R) > HARM_MARGIN),
            "redraw_median_regret": float(np.median([regret(e, R) for e in ends])),
            "harm_share": float(np.mean(harm > HARM_MARGIN)), "draws": int(draws)}


def redraws_table(table: pd.DataFrame, cache: Path, workers: int, draws: int = REDRAWS,
                  restarts: int = 8) -> pd.DataFrame:
    """Per scored instance of :data:`REDRAWN_SET` (its record cached by round 5, ``restarts`` as there):
    :func:`_redraw_row` (a posteriori, docs/theory.md §8, "Round 5")."""
    part = table[table["set"] == REDRAWN_SET]
    records = compute(part, cache, workers, restarts)
    keep = part[[not records[k]["fedavg_diverged"] for k in part["key"]]]
    jobs = [(_redraw_row, cfg, str(cache / f"{key}.json"), draws) for key, cfg in zip(keep["key"], keep["config"])]
    rows = _parallel(jobs, workers, "last-round redraws")
    columns = ["set", "setting", "family", "heterogeneity", "local_steps", "learning_rate", "seed"]
    return pd.concat([keep[columns].reset_index(drop=True), pd.DataFrame(rows)], axis=1)


# ======================================================================================
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small instances (smoke test; not a score)")
    parser.add_argument("--round", type=int, choices=(3, 4, 5, 6, 7), default=3,
                        help="3: round 3's tables (committed); 4: round 4's rules per information set, "
                             "scored on fresh seeds and held-out settings (issue 31); 5: the value solve's "
                             "forecast of FedAvg's last round, designed on round 4's evaluation sets; 6: the "
                             "solve after the T rounds, designed on round 5's evaluation sets; 7: the (a) rule "
                             "with a lookahead price, designed on rounds 5's and 6's evaluation sets")
    parser.add_argument("--design-only", action="store_true",
                        help="compute the design table and the criterion's choice only (no evaluation score)")
    parser.add_argument("--redraws", action="store_true",
                        help="with --round 5: a posteriori, FedAvg's last round redrawn on the participation set "
                             "(predictive_regret_r5_redraws.csv)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--no-figure", action="store_true", help="write the tables only")
    parser.add_argument("--out", default=None, help="output folder (default figures/, or results/ with --quick)")
    parser.add_argument("--cache", default=None, help="instance cache (default benchmarks/_cache/predictive_regret[_quick])")
    parser.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                        help="array library of the runs (cupy: one process drives the GPU, so --workers 1; "
                             "tables into results/predictive_regret-cupy unless --out)")
    args = parser.parse_args(argv)
    gpu = args.backend != "numpy"
    if gpu:
        from linattn_theory.core.backend import BackendUnavailableError, get_namespace
        try:
            get_namespace(args.backend)          # an unusable backend fails here, before any work
        except BackendUnavailableError as err:
            print(f"predictive_regret: {err}", file=sys.stderr)
            return 2
        args.workers = 1
    suffix = ("_quick" if args.quick else "") + (f"_{args.backend}" if gpu else "")
    out = Path(args.out) if args.out else ROOT / (
        f"results/predictive_regret-{args.backend}" if gpu else "results" if args.quick else "figures")
    cache = Path(args.cache) if args.cache else ROOT / "benchmarks" / "_cache" / f"predictive_regret{suffix}"
    if args.redraws:
        if args.round != 5:
            parser.error("--redraws examines round 5's participation set: pass --round 5")
        quick_sets = QUICK_R5["sets"]
        table = instances(args.quick, args.backend, sets=SETS_R5, quick_sets=quick_sets)
        redraws = redraws_table(table, cache, args.workers, 4 if args.quick else REDRAWS,
                                QUICK["restarts"] if args.quick else 8)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "predictive_regret_r5_redraws.csv", redraws.to_csv(index=False, float_format="%.6g"))
        print(f"wrote {out / 'predictive_regret_r5_redraws.csv'}: {len(redraws)} instances, harmed "
              f"{int(redraws['harmed'].sum())}, expected under redrawn last rounds {redraws['harm_share'].sum():.2f}")
        return 0
    if args.round in (4, 5, 6, 7):
        return main_round(args, out, cache)
    start = time.perf_counter()
    table = instances(args.quick, args.backend)
    out.mkdir(parents=True, exist_ok=True)
    design_part = table[table["role"] == "design"]
    restarts = QUICK["restarts"] if args.quick else 8
    records = compute(design_part, cache, args.workers, restarts)
    rules = design_rules(args.quick)
    outcomes = rule_outcomes(design_part, records, cache, rules, args.workers)
    chosen = choose_rule(design_table(table, records, outcomes, rules))
    rules.update(ablations(chosen))
    outcomes = rule_outcomes(design_part, records, cache, rules, args.workers)
    # everything downstream is computed from the CSVs as written, so the committed tables can be
    # regenerated from the committed CSVs exactly (tests/test_recommenders.py)
    atomic_write_text(out / "predictive_regret_design.csv",
                      design_table(table, records, outcomes, rules).to_csv(index=False, float_format="%.6g"))
    design = pd.read_csv(out / "predictive_regret_design.csv")
    assert choose_rule(design) == chosen, "the criterion must choose the same rule from the written table"
    print(design_markdown(design))
    if args.design_only:
        print(f"wrote {out / 'predictive_regret_design.csv'} ({time.perf_counter() - start:.0f} s)")
        return 0
    evaluation = table[table["role"] == "evaluation"]
    records.update(compute(evaluation, cache, args.workers, restarts))
    name = rule_name(*rule_spec(chosen))
    wanted = {name: rule_spec(chosen), rule_name(**PREVIOUS): rule_spec(PREVIOUS, PREVIOUS["checks"])}
    outcomes.update(rule_outcomes(evaluation, records, cache, wanted, args.workers))
    atomic_write_text(out / "predictive_regret_scores.csv",
                      score_table(table, records, outcomes, name).to_csv(index=False, float_format="%.6g"))
    scores = pd.read_csv(out / "predictive_regret_scores.csv")
    summ = summary(scores)
    atomic_write_text(out / "predictive_regret_summary.csv", summ.to_csv(index=False, float_format="%.6g"))
    atomic_write_text(out / "predictive_regret.md", report(scores, design))
    if not args.no_figure:
        plot(scores, records, table, out, args.quick)
    print(report(scores, design))
    print(f"wrote {out / 'predictive_regret_scores.csv'}, predictive_regret_summary.csv, predictive_regret_design.csv, "
          f"predictive_regret.md, predictive_regret.png/.pdf ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
