"""Every arm tuned: SCAFFOLD, FedAvgM, FedProx, FedAdam, FedFrozen and the value solve against tuned
FedAvg at cells of the phase diagram (docs/theory.md §6 "Every arm tuned"; simulations/phase_diagram_arms.py;
issue 30, item 2).

Each arm's setting — its step scale ``c`` and its own hyper-parameter (FedAvgM's ``β``, FedProx's
``μ``, FedAdam's server rate, FedFrozen's ``T0``) — is chosen per cell on the design seeds from the
grid declared in ``simulations/configs/phase_diagram_arms.toml``
(:func:`~linattn_theory.report.tuning.tune_and_hold_out`), then run on the held-out seeds, whose
rows (with the chaos flag of :mod:`linattn_theory.sim.sensitivity`) give every statistic: per cell
and arm the gain ``1 − R_arm / R_ref`` over the reference arm (tuned FedAvg) of the same instance,
its median with a bootstrap 95 % interval and the wins above the threshold, with and without the
flagged (diverged or chaotic) instances, as in :func:`~linattn_theory.report.phase_diagram.cell_summary`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .phase_diagram import bootstrap_median
from .tuning import tune_and_hold_out

__all__ = ["load_arms_settings", "run_arms", "arm_gains", "arm_summary"]

#: the keys of ``phase_diagram_arms.toml`` besides ``arms`` and ``quick``
SETTINGS = ("zeta_value", "local_steps", "design_seeds", "heldout_seeds", "threshold", "bootstrap_resamples",
            "bootstrap_seed", "reference")
#: the held-out table's columns (figures/phase_diagram_arms.csv)
ROW_COLUMNS = ["seed", "zeta_value", "local_steps", "arm", "setting", "step", "learning_rate", "excess_risk",
               "diverged", "chaotic", "oracle_best_iterate"]


def _cell(zeta: float, E: int) -> str:
    return f"{zeta:g}|{E}"


def load_arms_settings(path, base_path, quick: bool = False) -> dict:
    """The declared settings of ``path`` (``phase_diagram_arms.toml``, ``[quick]`` applied; a quick arm's
    table replaces the arm's own) with ``base``: the phase diagram's instances (``base_path``'s
    ``[base]``, its ``[quick.base]`` with ``quick``), stepped by the full model's curvature at ``θ⁰``;
    ``arms``: name → fixed config updates, ``grids``: name → declared grid.

    Parameters
    ----------
    path : str or path-like
        ``phase_diagram_arms.toml``.
    base_path : str or path-like
        The phase diagram's settings (``phase_diagram.toml``), whose ``[base]`` gives the instances.
    quick : bool, default False
        Apply the ``[quick]`` tables.

    Returns
    -------
    dict
        The keys of :data:`SETTINGS`, ``base`` (a RunConfig), ``arms`` and ``grids``.

    Examples
    --------
    >>> from linattn_theory.report.arms import load_arms_settings
    >>> from linattn_theory.report.figures import find_root
    >>> configs = find_root() / "simulations" / "configs"
    >>> settings = load_arms_settings(configs / "phase_diagram_arms.toml", configs / "phase_diagram.toml", quick=True)
    >>> settings["reference"] in settings["arms"], set(settings["grids"]) == set(settings["arms"])
    (True, True)
    >>> settings["base"].federated.step_curvature                   # stepped by the full model's curvature
    'model'
    """
    import tomllib
    from pathlib import Path

    from ..core.errors import ConfigError
    from .phase_diagram import load_settings

    raw = tomllib.loads(Path(path).read_text())
    unknown = sorted(set(raw) - {*SETTINGS, "arms", "quick"})
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key; allowed keys are {', '.join((*SETTINGS, 'arms', 'quick'))}")
    missing = [k for k in (*SETTINGS, "arms") if k not in raw]
    if missing:
        raise ConfigError(f"{missing[0]}: missing; {Path(path).name} declares {', '.join((*SETTINGS, 'arms'))}")
    settings = {k: raw[k] for k in SETTINGS}
    arms = {name: dict(table) for name, table in raw["arms"].items()}
    if quick:
        extra = dict(raw.get("quick", {}))
        for name, table in extra.pop("arms", {}).items():
            arms[name].update(table)
        settings.update(extra)
    for name, table in arms.items():
        if "grid" not in table:
            raise ConfigError(f"arms.{name}: declares no grid; every arm is tuned on a declared grid")
    if settings["reference"] not in arms:
        raise ConfigError(f"reference = {settings['reference']!r}: not an arm ({', '.join(arms)})")
    shared = sorted(set(settings["design_seeds"]) & set(settings["heldout_seeds"]))
    if shared:
        raise ConfigError(f"seed {shared[0]} is both a design and a held-out seed")
    base = load_settings(base_path, quick=quick)["base"]
    settings["base"] = base.with_updates({"federated.step_scale": 1.0, "federated.step_curvature": "model"})
    settings["grids"] = {name: table.pop("grid") for name, table in arms.items()}
    settings["arms"] = arms
    return settings


def run_arms(settings: dict, workers: int = 1):
    """:func:`~linattn_theory.report.tuning.tune_and_hold_out` of the declared arms at the cells
    ``(ζ_V, E)`` with the chaos flag on the held-out runs; ``(heldout rows, design rows, choices)``
    with the columns ``zeta_value`` and ``local_steps`` of the cell.

    Parameters
    ----------
    settings : dict
        :func:`load_arms_settings`' result.
    workers : int, default 1
        Processes sharing the instances (:func:`~linattn_theory.report.tuning.tune_and_hold_out`).

    Returns
    -------
    heldout : pandas.DataFrame
        The held-out runs (:data:`ROW_COLUMNS`).
    design : pandas.DataFrame
        The design runs.
    choices : pandas.DataFrame
        The chosen setting per cell and arm.
    """
    cells = {_cell(z, E): {"task.zeta_value": z, "federated.local_steps": E}
             for z in settings["zeta_value"] for E in settings["local_steps"]}
    tuned = tune_and_hold_out(settings["base"], settings["arms"], settings["grids"], settings["design_seeds"],
                              settings["heldout_seeds"], cells=cells, sensitivity=True,
                              workers=workers)

    def split(table):
        parts = table["cell"].str.split("|", expand=True)
        return table.assign(zeta_value=parts[0].astype(float), local_steps=parts[1].astype(int)).drop(columns="cell")
    return split(tuned.heldout)[ROW_COLUMNS], split(tuned.design), split(tuned.choices)


def arm_gains(rows: pd.DataFrame, arm: str, reference: str = "fedavg", oracle: bool = False) -> pd.DataFrame:
    """Per held-out (seed, ζ_V, E): ``gain = 1 − R_arm / R_reference`` (``−∞`` where the arm diverged, NaN
    where the reference did), ``flagged``: either run diverged or is chaotic. ``oracle``: the arm's
    best iterate on its own path (``oracle_best_iterate``) instead of its last.

    Parameters
    ----------
    rows : pandas.DataFrame
        Held-out runs (:data:`ROW_COLUMNS`).
    arm : str
        The arm.
    reference : str, default "fedavg"
        The arm it is compared with.
    oracle : bool, default False
        Use the arm's best iterate.

    Returns
    -------
    pandas.DataFrame
        ``seed``, ``zeta_value``, ``local_steps``, ``gain``, ``flagged``, ``diverged``, ``chaotic``.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"seed": [0, 0, 1, 1], "zeta_value": 1.0, "local_steps": 5,
    ...                      "arm": ["fedavg", "fedprox", "fedavg", "fedprox"],
    ...                      "excess_risk": [0.4, 0.3, 0.5, np.nan], "diverged": [False, False, False, True],
    ...                      "chaotic": False, "oracle_best_iterate": [0.35, 0.2, 0.45, np.nan]})
    >>> from linattn_theory.report.arms import arm_gains
    >>> gains = arm_gains(rows, "fedprox")                          # 1 − 0.3 / 0.4; seed 1 diverged
    >>> [round(g, 12) for g in gains["gain"]], gains["flagged"].tolist()
    ([0.25, -inf], [False, True])
    >>> round(float(arm_gains(rows, "fedprox", oracle=True)["gain"][0]), 12)    # 1 − 0.2 / 0.4
    0.5
    """
    keys = ["seed", "zeta_value", "local_steps"]
    a = rows[rows["arm"] == arm].set_index(keys)
    t = rows[rows["arm"] == reference].set_index(keys)
    R_arm = a["oracle_best_iterate" if oracle else "excess_risk"].where(~a["diverged"], np.inf)
    with np.errstate(invalid="ignore"):
        gain = (1.0 - R_arm / t["excess_risk"]).where(~t["diverged"], np.nan)
    return pd.DataFrame({"gain": gain, "flagged": a["diverged"] | t["diverged"] | a["chaotic"] | t["chaotic"],
                         "diverged": a["diverged"], "chaotic": a["chaotic"] | t["chaotic"]}).reset_index()


def arm_summary(rows: pd.DataFrame, choices: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """Per (ζ_V, E, arm) over the held-out instances: the arm's chosen ``setting``, the gain over the
    reference (median, bootstrap 95 % interval, wins above the threshold) with every instance and
    without the flagged ones (``*_clean``); the reference's own best iterate (an oracle) as the arm
    ``<reference>_oracle``.

    Parameters
    ----------
    rows : pandas.DataFrame
        Held-out runs (:data:`ROW_COLUMNS`).
    choices : pandas.DataFrame
        The chosen ``setting`` per ``zeta_value``, ``local_steps`` and ``arm``.
    settings : dict
        ``reference``, ``threshold``, ``bootstrap_resamples``, ``bootstrap_seed``.

    Returns
    -------
    pandas.DataFrame
        One row per (ζ_V, E, arm).

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"seed": [0, 0, 1, 1], "zeta_value": 1.0, "local_steps": 5,
    ...                      "arm": ["fedavg", "fedprox", "fedavg", "fedprox"],
    ...                      "excess_risk": [0.4, 0.3, 0.5, np.nan], "diverged": [False, False, False, True],
    ...                      "chaotic": False, "oracle_best_iterate": [0.35, 0.2, 0.45, np.nan]})
    >>> from linattn_theory.report.arms import arm_summary
    >>> choices = pd.DataFrame({"zeta_value": 1.0, "local_steps": 5, "arm": ["fedavg", "fedprox"],
    ...                         "setting": ["step_scale=0.5", "step_scale=0.5, prox_mu=1"]})
    >>> settings = {"reference": "fedavg", "threshold": 0.0, "bootstrap_resamples": 100, "bootstrap_seed": 0}
    >>> summary = arm_summary(rows, choices, settings)
    >>> summary["arm"].tolist(), summary["n_clean"].tolist()        # seed 1's FedProx run diverged
    (['fedprox', 'fedavg_oracle'], [1, 2])
    >>> round(float(summary["gain_median_clean"][1]), 12)           # median of 1 − 0.35/0.4 and 1 − 0.45/0.5
    0.1125
    """
    reference, threshold = settings["reference"], settings["threshold"]
    resamples, seed = settings["bootstrap_resamples"], settings["bootstrap_seed"]
    chosen = choices.set_index(["zeta_value", "local_steps", "arm"])["setting"]
    arms = [a for a in rows["arm"].drop_duplicates() if a != reference] + [f"{reference}_oracle"]
    out = []
    for arm in arms:
        oracle = arm == f"{reference}_oracle"
        g = arm_gains(rows, reference if oracle else arm, reference, oracle=oracle)
        for (zeta, E), group in g.groupby(["zeta_value", "local_steps"], sort=True):
            valid = group[group["gain"].notna()]
            clean = valid[~valid["flagged"]]
            row = {"zeta_value": zeta, "local_steps": E, "arm": arm,
                   "setting": chosen[zeta, E, reference if oracle else arm],
                   "reference_setting": chosen[zeta, E, reference], "instances": len(valid),
                   "reference_diverged": int(group["gain"].isna().sum()), "diverged": int(valid["diverged"].sum()),
                   "chaotic": int(valid["chaotic"].sum()), "flagged": int(valid["flagged"].sum())}
            for suffix, part in (("", valid), ("_clean", clean)):
                median, low, high = bootstrap_median(part["gain"], resamples=resamples, seed=seed)
                row.update({f"gain_median{suffix}": median, f"gain_low{suffix}": low, f"gain_high{suffix}": high,
                            f"wins{suffix}": int((part["gain"] > threshold).sum()), f"n{suffix}": len(part)})
            out.append(row)
    return pd.DataFrame(out)
