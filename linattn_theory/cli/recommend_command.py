"""``linattn recommend``: the text report of a warm-up recommendation (docs/theory.md §6, §8).

Formatting only; the recommenders are :mod:`linattn_theory.recommenders` and the bound
:mod:`linattn_theory.theory.bound`. The report leads with what the recommendation knew (its information
set) and, for a bound, with the assumptions the path violated.
"""

from __future__ import annotations

import sys

import numpy as np

from ..core.errors import ConfigError
from ..sim.config import RunConfig, load_config

__all__ = ["format_recommendation", "recommend_main"]

_CONSTANTS = {"optimum": "Φ*_λ", "b0": "b_0 = bias(K_0)", "burn_in": "t_s (PL assumed from this round)",
              "b_start": "b_s = bias(K_t_s)", "burn_in_level": "max_{t ≤ t_s} bias(K_t)",
              "b_floor": "b_∞ (bias floor)", "q": "q = 1 − 2μη_sηE(1 − Lη_sηE/2)", "mu": "μ (PL constant)",
              "L": "L (smoothness, secant)", "epsilon": "ε (per-round inexactness)",
              "zeta2": "ζ² (client dissimilarity at T0_theory)", "curvature_spread2": "σ_A² (curvature spread)",
              "lambda_min": "λ_min(Ã)", "rho": "ρ(K_T0_theory)", "tau": "τ (Ã-norm transient)",
              "drift_floor": "D(K_T0_theory)", "rho_max": "max_t ρ(K_t)", "tau_max": "max_t τ",
              "drift_growth": "γ (drift-floor growth/round)", "drift_floor_initial": "D(K_0)"}


def _curve_lines(curve, T0: int, rows: int | None, columns) -> list[str]:
    picked = curve if rows is None else curve.iloc[np.unique(np.linspace(0, len(curve) - 1, rows).astype(int))]
    lines = ["  " + " ".join(f"{name:>12s}" for name in ("T0",) + tuple(columns))]
    for _, r in picked.iterrows():
        mark = "  <- recommended" if int(r["round"]) == T0 else ""
        lines.append(f"  {int(r['round']):12d} " + " ".join(f"{r[c]:12.6g}" for c in columns) + mark)
    return lines


def format_recommendation(rec, curve_rows: int | None = None) -> str:
    """A plain-text report of a :class:`~linattn_theory.recommenders.recommendation.Recommendation`.

    Parameters
    ----------
    rec : Recommendation
        The recommendation (:func:`~linattn_theory.recommenders.recommendation.recommend`).
    curve_rows : int, optional
        Show that many evenly spaced rows of its curve; default all.

    Returns
    -------
    str
        The report.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 8, "warmup_rounds": 8}})
    >>> from linattn_theory.cli.recommend_command import format_recommendation
    >>> from linattn_theory.recommenders.recommendation import recommend
    >>> rec = recommend(config, mode="online", measure=False)
    >>> report = format_recommendation(rec)
    >>> report.splitlines()[0] == f"recommended warm-up  T0 = {rec.T0_theory}   (mode: online)"
    True
    """
    cfg, T = rec.config, rec.config.federated.rounds
    fed = cfg.federated
    lines = []
    if rec.violated:
        lines.append(f"WARNING: {len(rec.violated)} assumption(s) of the bound violated on this path:")
        lines += [f"  [VIOLATED] {c.name}: {c.measured:.4g} ({c.detail})" for c in rec.violated]
    if rec.descriptive:
        lines.append("A POSTERIORI FIT (descriptive): fitted on the whole path it is judged on; it explains "
                     "the curve and predicts nothing. Use --mode online for a prediction.")
    lines += [f"recommended warm-up  T0 = {rec.T0_theory}   (mode: {rec.mode})",
              f"information: {rec.information}",
              f"instance: {cfg.task.family}, {cfg.task.num_clients} clients, T = {T} rounds, "
              f"E = {fed.local_steps}, η = {fed.learning_rate:g}, λ = {fed.ridge:g}, seed = {cfg.seed}"]
    if rec.mode == "online":
        rollback = rec.stop_round - rec.T0_theory
        lines.append(f"the rule stopped the warm-up at round {rec.stop_round} and froze the kernel of round "
                     f"{rec.T0_theory}" + (f" (a roll-back of {rollback} rounds; {T - rec.stop_round} frozen "
                                           f"rounds remain)" if rollback else
                                           f" ({T - rec.stop_round} frozen rounds)"))
        lines.append(f"forecast final objective F_λ(K_T0, V_T) = {rec.details['predicted_objective']:.6g} "
                     f"(exact frozen-stage map, docs/theory.md §5)")
        last = rec.curve.iloc[-1]
        lines.append(f"reason: {last['reason']}")
    elif rec.mode == "pilot":
        lines.append(f"pilot: {rec.details['pilot_rounds']} rounds; Φ*_λ = {rec.details['optimum']:.6g}")
        lines.append("pilot bound (extrapolated beyond the pilot):")
        lines += _curve_lines(rec.curve, rec.T0_theory, curve_rows, ("U", "bias_bound", "frozen_bound"))
    elif rec.mode == "transfer":
        per_seed = ", ".join(f"seed {s}: {t}" for s, t in rec.details["transfer_T0"].items())
        lines.append(f"a-posteriori T0 of the transfer seeds: {per_seed}; recommended: their median")
    else:
        b, c = rec.bound, rec.bound.constants
        lines.append(f"closed form of the two-term model: {b.T0_closed_form:.1f}")
        lines.append("constants (fitted on the whole path):")
        lines += [f"  {label:<44s} {getattr(c, key):.6g}" for key, label in _CONSTANTS.items()]
        lines.append("assumptions (checked along the simulated FedAvg path):")
        lines += [f"  [{'ok ' if ch.holds else 'VIOLATED'}] {ch.name}: {ch.measured:.4g} ({ch.detail})"
                  for ch in b.checks]
        lines.append("bound curve (a posteriori):")
        lines += _curve_lines(b.curve, rec.T0_theory, curve_rows, ("U", "bias_bound", "frozen_bound"))
    if rec.measured is not None:
        m = rec.measured.set_index("run")
        if m["diverged"].any():
            lines.append("measured: a run diverged: " + "; ".join(m.loc[m["diverged"], "message"]))
        else:
            lines.append(f"measured  R(recommended) = {m.loc['recommended', 'excess_risk']:.6g}, R(T) = "
                         f"{m.loc['fedavg', 'excess_risk']:.6g} (plain FedAvg), gain = {rec.measured_gain:.6g}")
    return "\n".join(lines)


def recommend_main(config_path_or_config, out=None, *, mode: str = "online", measure: bool = True,
                   pilot_rounds: int | None = None, transfer_seeds=None) -> int:
    """Entry point for ``linattn recommend CONFIG.toml [--mode ...]``: print the report.

    Returns the exit status: 0 on success, 2 for invalid input (message on stderr, nothing printed
    to ``out``), 3 when a FedAvg path the recommender needs diverges.

    Parameters
    ----------
    config_path_or_config : str, path-like or RunConfig
        The configuration (a TOML file or a config).
    out : file-like, optional
        Where the report goes; default standard output.
    mode, measure, pilot_rounds, transfer_seeds
        As in :func:`~linattn_theory.recommenders.recommendation.recommend`.

    Returns
    -------
    int
        The exit status.

    Examples
    --------
    >>> import io
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 8, "warmup_rounds": 8}})
    >>> from linattn_theory.cli.recommend_command import recommend_main
    >>> out = io.StringIO()
    >>> recommend_main(config, out, mode="online", measure=False)
    0
    >>> out.getvalue().startswith("recommended warm-up  T0 = ")
    True
    """
    from ..recommenders.recommendation import recommend

    out = sys.stdout if out is None else out
    try:
        config = (config_path_or_config if isinstance(config_path_or_config, RunConfig)
                  else load_config(config_path_or_config))
    except ConfigError as err:
        print(f"linattn recommend: invalid configuration: {err}", file=sys.stderr)
        return 2
    try:
        rec = recommend(config, mode=mode, measure=measure, pilot_rounds=pilot_rounds,
                        transfer_seeds=transfer_seeds)
    except ValueError as err:
        print(f"linattn recommend: {err}", file=sys.stderr)
        return 3 if "diverged" in str(err) else 2
    print(format_recommendation(rec), file=out)
    return 0
