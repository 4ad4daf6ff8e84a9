"""Helpers of the teaching notebook (``notebooks/bias_drift_tradeoff.py``).

Three kinds of statements appear in the notebook, and each has its own reporter:

- an **exercise** checks the student's own answer against an independent computation and
  prints ``EXERCISE <name>: PASS``, ``FAIL`` or ``UNANSWERED``; it never stops the notebook
  (:func:`check_exercise`);
- a **theorem** is an exact identity of docs/theory.md; when the numbers violate it, something
  is wrong with the code, and :func:`theorem` raises :class:`TheoremViolation`;
- a **tendency** is what the theory leads one to expect in the typical case, not an identity;
  :func:`tendency` prints whether it holds on the numbers at hand.

:func:`excess_risk_curve` is the one computation of the notebook that is not a single package
call: the exact decomposition of ``R(T0)`` (docs/theory.md §6) for every warm-up length, from
one shared FedAvg trajectory (:func:`~linattn_theory.sim.warmup_grid.warmup_sweep`).
:func:`committed_table` reads a table behind the committed figures wherever the notebook runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.io import read_csv_exact

__all__ = ["PASS", "FAIL", "UNANSWERED", "TheoremViolation", "check_exercise", "theorem", "tendency",
           "excess_risk_curve", "best_warmup", "notebook_style", "show", "check_legible", "committed_table",
           "committed_table_folders", "NOTEBOOK_DPI", "NOTEBOOK_MIN_FONT_SIZE"]

#: the notebook's figures: pixels per inch and the smallest text (legends included), in points
NOTEBOOK_DPI, NOTEBOOK_MIN_FONT_SIZE = 150, 8.0

PASS, FAIL, UNANSWERED = "PASS", "FAIL", "UNANSWERED"


class TheoremViolation(AssertionError):
    """An exact identity of docs/theory.md does not hold on the numbers: a bug, not a surprise.

    Examples
    --------
    >>> from linattn_theory.report.teaching import TheoremViolation, theorem
    >>> issubclass(TheoremViolation, AssertionError)
    True
    >>> try:
    ...     theorem("R = bias + D + unfinished", False, "1.0 != 0.9")
    ... except TheoremViolation as error:
    ...     print(error)
    THEOREM R = bias + D + unfinished is violated: 1.0 != 0.9
    """


def check_exercise(name: str, answer, verify) -> None:
    """Run the student's answer and check it; print ``EXERCISE <name>: PASS``, ``FAIL`` or ``UNANSWERED``.

    ``answer()`` calls the student's function (no arguments; a ``lambda`` closes over them). A
    ``NotImplementedError`` means "not answered yet"; any other exception, in the answer or in
    ``verify(result) -> (passed, detail)``, is a ``FAIL`` that names the error. Never raises, so an
    unanswered or wrong exercise does not stop the rest of the notebook.

    Parameters
    ----------
    name : str
        The exercise.
    answer : callable
        ``answer()`` returns the student's result.
    verify : callable
        ``verify(result) -> (passed, detail)``.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.report.teaching import check_exercise
    >>> check_exercise("square", lambda: 3 ** 2, lambda r: (r == 9, f"got {r}"))
    EXERCISE square: PASS  got 9
    """
    try:
        result = answer()
    except NotImplementedError:
        print(f"EXERCISE {name}: {UNANSWERED}  (replace `raise NotImplementedError` by your answer, "
              f"run that cell, then this one)")
        return
    except Exception as error:        # the student's code failed: report it, keep going
        print(f"EXERCISE {name}: {FAIL}  your answer raised {type(error).__name__}: {error}")
        return
    try:
        passed, detail = verify(result)
    except Exception as error:        # e.g. a wrong shape or type: report it, keep going
        print(f"EXERCISE {name}: {FAIL}  your answer could not be checked ({type(error).__name__}: {error})")
        return
    print(f"EXERCISE {name}: {PASS if passed else FAIL}  {detail}")


def theorem(name: str, holds: bool, detail: str = "") -> None:
    """Print ``THEOREM <name>: holds`` or raise :class:`TheoremViolation` (an exact identity failed).

    Parameters
    ----------
    name : str
        The identity.
    holds : bool
        Whether it holds on these numbers.
    detail : str, default ""
        The numbers compared.

    Returns
    -------
    None

    Raises
    ------
    TheoremViolation
        When it does not hold.

    Examples
    --------
    >>> from linattn_theory.report.teaching import theorem
    >>> theorem("R(T0) >= 0", True, "min R = 0.12")
    THEOREM R(T0) >= 0: holds  min R = 0.12
    """
    if not holds:
        raise TheoremViolation(f"THEOREM {name} is violated: {detail}")
    print(f"THEOREM {name}: holds  {detail}")


def tendency(name: str, holds: bool, detail: str = "") -> None:
    """Print whether a tendency of the theory holds on these numbers (never raises).

    Parameters
    ----------
    name, holds, detail
        As in :func:`theorem`.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.report.teaching import tendency
    >>> tendency("a longer warm-up lowers the bias", False, "bias 0.3 -> 0.4")      # printed, never raised
    TENDENCY a longer warm-up lowers the bias: does NOT hold on these numbers  bias 0.3 -> 0.4
    """
    verdict = "holds" if holds else "does NOT hold"
    print(f"TENDENCY {name}: {verdict} on these numbers  {detail}")


def notebook_style() -> None:
    """The figures' style (:func:`~linattn_theory.report.plotting.apply_style`: the same colours for the
    same methods and heterogeneity levels) at screen size: :data:`NOTEBOOK_DPI` dpi, 8–9 pt text.

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib
    >>> from linattn_theory.report.teaching import NOTEBOOK_DPI, notebook_style
    >>> with matplotlib.rc_context():                           # the settings are restored after the block
    ...     notebook_style()
    ...     print(matplotlib.rcParams["figure.dpi"] == NOTEBOOK_DPI, matplotlib.rcParams["legend.fontsize"])
    True 8.0
    """
    import matplotlib.pyplot as plt

    from .plotting import apply_style

    apply_style()
    plt.rcParams.update({"figure.dpi": NOTEBOOK_DPI, "font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9,
                         "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8,
                         "legend.title_fontsize": 8, "legend.frameon": True, "legend.framealpha": 0.85})


def check_legible(fig) -> None:
    """Raise ``ValueError`` unless ``fig`` is drawn at :data:`NOTEBOOK_DPI` or more and all its visible
    text (legends included) is at least :data:`NOTEBOOK_MIN_FONT_SIZE` points.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure to check.

    Returns
    -------
    None

    Raises
    ------
    ValueError
        Naming the resolution or the text that is too small.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.teaching import check_legible
    >>> fig, ax = plt.subplots(dpi=150)
    >>> ax.tick_params(labelsize=9)
    >>> check_legible(fig)                                       # 150 dpi, no text under 8 pt: no error
    >>> _ = ax.set_xlabel("T0", fontsize=6)
    >>> check_legible(fig)
    Traceback (most recent call last):
        ...
    ValueError: text below 8 pt: [('T0', 6.0)]
    >>> plt.close(fig)
    """
    import matplotlib.text

    if fig.dpi < 120:
        raise ValueError(f"figure at {fig.dpi:g} dpi: the notebook's figures need at least 120 dpi")
    fig.canvas.draw()
    small = sorted({(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
                    if t.get_visible() and t.get_text().strip() and t.get_fontsize() < NOTEBOOK_MIN_FONT_SIZE})
    if small:
        raise ValueError(f"text below {NOTEBOOK_MIN_FONT_SIZE:g} pt: {small[:3]}")


def show(fig) -> None:
    """Check that ``fig`` is legible (:func:`check_legible`), display it in Jupyter (a plain script just
    closes it).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        A figure drawn in the notebook's style (:func:`notebook_style`).

    Returns
    -------
    None

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from linattn_theory.report.teaching import show
    >>> fig, ax = plt.subplots(dpi=150)
    >>> ax.tick_params(labelsize=9)
    >>> show(fig)                                                # checked, then closed (Agg: nothing shown)
    >>> plt.fignum_exists(fig.number)
    False
    """
    import matplotlib.pyplot as plt

    check_legible(fig)
    if plt.get_backend().lower() != "agg":
        plt.show()
    plt.close(fig)


def excess_risk_curve(config, clients, optimum=None, *, restarts: int = 2) -> pd.DataFrame:
    """``R(T0)`` and its exact parts for every ``T0 = 0..T`` (docs/theory.md §6).

    ``R(T0) = bias(K_{T0}) + D(K_{T0}) + [F_λ(K_{T0}, V_T) − F_λ(K_{T0}, V_FA)]``, one row per warm-up
    length (index ``T0``; columns ``excess_risk``, ``bias``, ``drift_floor``, ``unfinished``,
    ``identity_residual``, ``profile_objective``, ``optimum``). The runs are the simulator's
    FedFrozen runs of ``config`` sharing one FedAvg trajectory
    (:func:`~linattn_theory.sim.warmup_grid.warmup_sweep`; ``T0 = T`` is FedAvg), each split by
    :func:`~linattn_theory.theory.decomposition.decompose_excess_risk` against ``optimum`` (``Φ*_λ``: a number or a
    ``CentralizedOptimum``; ``None``: one :func:`~linattn_theory.theory.profile.centralized_optimum` with
    ``restarts`` random starts, also started from FedAvg's last kernel and from the warm-up kernel
    of lowest ``Φ_λ``). ``R`` is the simulator's measured loss and the parts come from the moments,
    so ``identity_residual`` checks one against the other. Raises ``ValueError`` if the FedAvg
    trajectory diverged (its excess risk is undefined).

    Parameters
    ----------
    config : RunConfig
        The instance.
    clients : FederatedDataset
        Its clients.
    optimum : float or CentralizedOptimum, optional
        ``Φ*_λ``.
    restarts : int, default 2
        Random starts of the optimum.

    Returns
    -------
    pandas.DataFrame
        One row per ``T0``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.data.families import clients_from_config
    >>> from linattn_theory.report.teaching import excess_risk_curve
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> curve = excess_risk_curve(config, clients_from_config(config), restarts=1)
    >>> curve.index.tolist()
    [0, 1, 2, 3, 4]
    >>> parts = curve["bias"] + curve["drift_floor"] + curve["unfinished"]      # R = bias + D + unfinished
    >>> bool(np.allclose(curve["excess_risk"], parts, rtol=1e-12, atol=0))
    True
    """
    from ..core.model import kernel
    from ..core.clients import stack_clients
    from ..theory.profile import centralized_optimum, profile_objective
    from ..theory.decomposition import decompose_excess_risk
    from ..sim.warmup_grid import warmup_sweep

    fed = config.federated
    runs = warmup_sweep(config.with_updates({"federated.strategy": "fedfrozen"}), clients=clients)
    diverged = [T0 for T0, run in runs.items() if run.diverged]
    if diverged:
        raise ValueError(f"the warm-up diverged (T0 = {diverged[0]}..): R(T0) is undefined; use a smaller step")
    data = stack_clients(clients)
    if optimum is None:
        kernels = [np.asarray(kernel(run.warmup_params)) for run in runs.values()]
        best = min(kernels, key=lambda K: profile_objective(K, data, fed.ridge)[0])
        optimum = centralized_optimum(data, fed.ridge, rank=config.model.rank, heads=config.model.heads,
                                      restarts=restarts, seed=config.seed, initial_kernels=[kernels[-1], best])
    rows = [decompose_excess_risk(run, data, optimum=optimum) for run in runs.values()]
    columns = ["warmup_rounds", "excess_risk", "bias", "drift_floor", "unfinished", "identity_residual",
               "profile_objective", "optimum"]
    return pd.DataFrame(rows)[columns].rename(columns={"warmup_rounds": "T0"}).set_index("T0")


def best_warmup(excess_risk) -> int:
    """The best warm-up length: ``argmin_{T0} R(T0)``, the smallest such ``T0`` on ties (docs/theory.md §6).

    ``excess_risk`` is a Series indexed by ``T0`` (or an array indexed ``0..T``).

    Parameters
    ----------
    excess_risk : pandas.Series or array_like
        ``R(T0)``.

    Returns
    -------
    int
        ``T0_best``.

    Examples
    --------
    >>> import pandas as pd
    >>> from linattn_theory.report.teaching import best_warmup
    >>> best_warmup(pd.Series([0.4, 0.1, 0.1], index=[10, 20, 30]))
    20
    """
    series = pd.Series(np.asarray(excess_risk, dtype=float)) if not isinstance(excess_risk, pd.Series) \
        else excess_risk.astype(float)
    if not np.all(np.isfinite(series.to_numpy())):
        raise ValueError("R(T0) is not finite for every T0: a run diverged")
    from ..recommenders.scoring import best_warmup as argmin_smallest  # the one definition (docs/theory.md §8)
    return int(series.index[argmin_smallest(series.to_numpy())])


def committed_table_folders(start=None) -> list:
    """Where :func:`committed_table` looks, in order: ``figures/`` of the checkout around ``start``
    (default: the working folder; the repository root, ``notebooks/`` or any folder inside it), the
    copy the package ships (``linattn_theory/_examples/figures``: a wheel, or a notebook copied
    elsewhere), and ``figures/`` next to the package (a source or editable install).

    Parameters
    ----------
    start : str or Path, optional
        Where to look for a checkout; default the working folder.

    Returns
    -------
    list of Path
        The folders, in the order searched.

    Examples
    --------
    >>> from linattn_theory.report.teaching import committed_table_folders
    >>> all(folder.name == "figures" for folder in committed_table_folders())
    True
    """
    from pathlib import Path

    here = (Path.cwd() if start is None else Path(start)).resolve()
    package = Path(__file__).resolve().parents[1]
    checkouts = [folder / "figures" for folder in (here, *here.parents) if (folder / "simulations").is_dir()]
    return [*checkouts, package / "_examples" / "figures", package.parent / "figures"]


def committed_table(name: str, start=None) -> pd.DataFrame:
    """The committed table ``figures/<name>`` (e.g. ``best_warmup.csv``, one row per instance of the
    headline figure), from the first of :func:`committed_table_folders` that holds it, so that the
    notebook reads the same numbers from the repository root, from ``notebooks/`` and from a copy
    anywhere else. Raises ``FileNotFoundError`` naming the folders searched and how to remake it.

    Parameters
    ----------
    name : str
        The file's name in ``figures/``.
    start : str or Path, optional
        Where to look for a checkout; default the working folder.

    Returns
    -------
    pandas.DataFrame
        The table.

    Examples
    --------
    >>> from linattn_theory.report.teaching import committed_table
    >>> "best_T0" in committed_table("best_warmup.csv").columns
    True
    """
    folders = committed_table_folders(start)
    for folder in folders:
        if (folder / name).is_file():
            return read_csv_exact(folder / name)
    raise FileNotFoundError(f"figures/{name} is in none of {', '.join(map(str, dict.fromkeys(folders)))}; "
                            f"`linattn figures` makes it (the figure script that writes it: "
                            f"`linattn figures --list`)")
