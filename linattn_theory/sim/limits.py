"""Checks made before any work: the output folder, a memory and time estimate of the runs, and
the settings that run but deserve a warning (rank above ``d``, one client, more workers than cores).

The estimates are deliberately rough (within a small factor on the configurations of
``simulations/configs/``): they exist to refuse, in a second, a configuration that would
exhaust the memory or run for days (``task.dim = 10**6``, ``federated.rounds = 10**12``),
with the estimate, the limit and the flag that raises it in the message.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ArgumentError, ConfigError
from .config import RunConfig

__all__ = ["check_output_folder", "RunEstimate", "estimate_run", "check_resources",
           "default_memory_limit", "float32_step_note", "token_dimension", "setting_notes",
           "warn_settings", "usable_cores", "workers_note", "DEFAULT_MAX_HOURS", "FLOP_RATE"]

#: default time limit of one command, in hours (``--max-hours``)
DEFAULT_MAX_HOURS = 24.0
#: floating-point operations per second assumed by the time estimate (batched small matrix
#: products on a CPU; measured 5e9 to 9e9 on two cores at d = 16..32)
FLOP_RATE = 5e9
#: fixed cost of one local step of one round (array-call overhead, measured 3e-4 to 7e-4 s)
STEP_OVERHEAD = 3e-4
#: bytes of one entry of the per-round table while it is built (Python dict of floats)
TABLE_ENTRY_BYTES = 100
#: client sizes under Dirichlet skew are drawn exactly up to this many clients (else bounded)
_EXACT_SIZES_UP_TO = 10_000


def check_output_folder(out, flag: str = "--out") -> Path:
    """``Path(out)`` if results can be written there: not empty, not a file, and the folder or
    its nearest existing parent a writable folder. Creates nothing; raises :class:`ConfigError`
    (an :class:`~linattn_theory.core.errors.ArgumentError` when ``flag`` is a command-line flag).

    Parameters
    ----------
    out : str or path-like
        The folder.
    flag : str, default "--out"
        The option that named it, for the message.

    Returns
    -------
    pathlib.Path
        ``Path(out)``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.sim.limits import check_output_folder
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> check_output_folder(folder / "out") == folder / "out"          # need not exist yet
    True
    >>> _ = (folder / "notes.txt").write_text("x")
    >>> check_output_folder(folder / "notes.txt")
    Traceback (most recent call last):
    ...
    linattn_theory.core.errors.ArgumentError: --out '...notes.txt' exists and is not a folder...
    """
    error = ArgumentError if flag.startswith("--") else ConfigError
    if out is None or str(out).strip() == "":
        raise error(f"{flag} {str(out or '')!r}: expected a folder name (use {flag} . for "
                          f"the current folder)")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise error(f"{flag} {str(path)!r} exists and is not a folder")
    parent = path
    while not parent.exists():
        if parent.is_symlink():
            raise error(f"{flag} {str(path)!r}: {str(parent)!r} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"{flag} {str(path)!r}: the folder {str(parent)!r} is not writable")
    return path


def default_memory_limit() -> float:
    """80% of this machine's physical memory, in bytes (``--max-memory-gb``).

    Returns
    -------
    float
        Bytes.

    Examples
    --------
    >>> from linattn_theory.sim.limits import default_memory_limit
    >>> default_memory_limit() > 0
    True
    """
    try:
        return 0.8 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):       # pragma: no cover - not POSIX
        return 16e9


@dataclass(frozen=True)
class RunEstimate:
    """Peak memory (bytes) and running time (seconds) of one run, estimated from its config.

    Parameters
    ----------
    bytes : float
        Peak memory.
    seconds : float
        Running time.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> from linattn_theory.sim.limits import estimate_run
    >>> estimate = estimate_run(config)
    >>> estimate.bytes > 8 * 128 * 8 * 6 * 8, estimate.seconds < 1      # at least the contexts m·N·n·d
    (True, True)
    """

    bytes: float
    seconds: float


def _largest_client(config: RunConfig) -> int:
    """``max_c N_c``: exact when the clients are few, else the equal-size lower bound."""
    task = config.task
    if task.dirichlet_alpha is None or task.num_clients > _EXACT_SIZES_UP_TO:
        return task.samples_per_client
    import numpy as np

    from ..core.seeds import SEED_CLIENT, seed_sequence
    from ..data.tasks import client_sizes
    rngs = [np.random.default_rng(seed_sequence(config.seed, SEED_CLIENT, c))
            for c in range(task.num_clients)]
    return max(client_sizes(task.num_clients, task.samples_per_client, task.dirichlet_alpha, rngs))


def estimate_run(config: RunConfig) -> RunEstimate:
    """Memory and time of ``config`` (docs/cli.md, "Checks before any work").

    Memory: the generated contexts ``m·N·n·d`` (float64), the stacked moments padded to the
    largest client, ``m·N_max·(d² + d + p + 1)``, the frozen-stage features ``m·N_max·H·d``,
    the parameters and per-client copies, and the table (``T·m`` entries). Time: ``E`` local
    steps per round of ``8Hd² + 4Hdp`` flops per sample over all clients while the kernel
    trains (``T0`` rounds) and ``4Hdp`` once it is frozen, at :data:`FLOP_RATE`.

    Parameters
    ----------
    config : RunConfig
        The run.

    Returns
    -------
    RunEstimate
        The estimate.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.limits import estimate_run
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> longer = config.with_updates({"federated.rounds": 40, "federated.warmup_rounds": 20})
    >>> short, long = estimate_run(config), estimate_run(longer)
    >>> long.seconds > short.seconds, long.bytes > short.bytes          # more rounds: more time and a longer table
    (True, True)
    """
    task, model, fed = config.task, config.model, config.federated
    m, N, n = task.num_clients, task.samples_per_client, task.tokens
    if task.family == "in_context_regression":
        d, p, teacher_heads = task.dim + 1, 1, 0
    else:
        d, p, teacher_heads = task.dim, task.outputs, task.heads
    H, r = model.heads, model.rank
    item = 4 if model.dtype == "float32" else 8
    n_max = _largest_client(config)
    total = m * N
    generated = 8.0 * total * (n * d + d + p) + 8.0 * teacher_heads * d * (d + 2 * task.rank + p) * (1 + m)
    stacked = item * float(m) * n_max * (d * d + d + p + 1 + H * d)
    params = item * 3.0 * H * d * max(r, p)
    batch = n_max if fed.batch_size is None else min(fed.batch_size, n_max)
    working = item * float(m) * batch * (4 * H * d + 2 * p) + 4 * params * m
    table = TABLE_ENTRY_BYTES * float(fed.rounds + 1) * (m + 12)
    memory = generated + stacked + working + table + 4 * params
    warm_rounds = min(config.warmup_rounds, fed.rounds)      # rounds that train the kernel
    warm_flops = float(m) * batch * (8.0 * H * d * d + 4.0 * H * d * p)
    frozen_flops = float(m) * batch * 4.0 * H * d * p
    flops = fed.local_steps * (warm_rounds * warm_flops + (fed.rounds - warm_rounds) * frozen_flops)
    seconds = flops / FLOP_RATE + fed.rounds * fed.local_steps * STEP_OVERHEAD
    seconds += 8.0 * total * n * d * d / FLOP_RATE                       # building the clients
    return RunEstimate(memory, seconds)


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.3g} h"
    days = seconds / 86400
    return f"{days:.3g} days" if days < 1e6 else f"{days / 365.25:.3g} years"


def check_resources(configs, *, workers: int = 1, max_memory_gb: float | None = None,
                    max_hours: float | None = DEFAULT_MAX_HOURS) -> list[RunEstimate]:
    """Refuse (:class:`ConfigError`) runs whose estimate exceeds the limits; returns the estimates.

    Memory: the largest run times the runs held at once (``workers``) against
    ``max_memory_gb`` (default :func:`default_memory_limit`); time: the sum over the runs
    divided by ``workers`` against ``max_hours`` (``None``: no time limit).

    Parameters
    ----------
    configs : iterable of RunConfig
        The runs.
    workers : int, default 1
        Runs at once.
    max_memory_gb : float, optional
        The memory limit, in GB.
    max_hours : float or None, default 24.0
        The time limit.

    Returns
    -------
    list of RunEstimate
        One per run.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> from linattn_theory.sim.limits import check_resources
    >>> len(check_resources([config]))
    1
    >>> check_resources([config.with_updates({"federated.rounds": 10**7})], max_hours=1.0)
    Traceback (most recent call last):
    ...
    linattn_theory.core.errors.ConfigError: estimated running time ... h exceeds the limit 1 h: ...
    """
    configs = list(configs)
    estimates = [estimate_run(c) for c in configs]
    if not estimates:
        return estimates
    workers = max(1, min(int(workers), len(configs)))
    limit = default_memory_limit() if max_memory_gb is None else max_memory_gb * 1e9
    where = max(range(len(configs)), key=lambda i: estimates[i].bytes)
    memory = estimates[where].bytes * workers
    if memory > limit:
        source = "" if max_memory_gb is not None else " (80% of this machine's memory)"
        at_once = f" ({workers} runs at once)" if workers > 1 else ""
        raise ConfigError(
            f"estimated memory {_gb(memory)}{at_once} exceeds the limit {_gb(limit)}{source}: "
            f"reduce task.num_clients, task.samples_per_client, task.dim, model.heads or "
            f"federated.rounds, or raise the limit with --max-memory-gb")
    seconds = sum(e.seconds for e in estimates) / workers
    if max_hours is not None and (not math.isfinite(seconds) or seconds > max_hours * 3600):
        raise ConfigError(
            f"estimated running time {_duration(seconds)} exceeds the limit {max_hours:g} h: "
            f"reduce federated.rounds, federated.local_steps or the task's size, or raise the "
            f"limit with --max-hours")
    return estimates


#: share of a block's entries the first float32 step must change for the run to be worth it
FLOAT32_MIN_CHANGED = 0.5


def float32_step_note(config: RunConfig, data, params) -> str | None:
    """A warning when float32 cannot resolve the steps: fewer than half the entries of a trained
    block change in the first local step ``θ − η∇F_c(θ^0)`` of some client, rounded to float32
    (a relative change below ``2⁻²⁴ ≈ 6e-8`` is lost), else ``None``.

    ``data`` and ``params`` are the run's stacked clients and initial parameters
    (:func:`~linattn_theory.sim.engine.prepare_run`); the blocks are those the first round trains.

    Parameters
    ----------
    config : RunConfig
        The run (its ``model.dtype``).
    data : StackedClients
        Its clients.
    params : Params
        Its initial parameters.

    Returns
    -------
    str or None
        The warning.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}})
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.sim.limits import float32_step_note
    >>> float32_step_note(config, *prepare_run(config)) is None
    True
    >>> tiny = config.with_updates({"model.dtype": "float32", "federated.learning_rate": 1e-9})
    >>> float32_step_note(tiny, *prepare_run(tiny)).startswith("model.dtype = 'float32'")
    True
    """
    import numpy as np

    from ..core.arrays import array_namespace, to_numpy
    from ..core.model import BLOCKS, loss_and_grad_from_inputs

    xp = array_namespace(data.S)
    m = data.S.shape[0]
    stacked = params.map(lambda a: xp.broadcast_to(a, (m,) + tuple(a.shape)))
    _, grad = loss_and_grad_from_inputs(stacked, data.inputs, data.q, data.y, data.sample_weight,
                                        attention=data.attention, temperature=data.temperature)
    eta = config.federated.learning_rate
    blocks = BLOCKS if config.warmup_rounds > 0 else ("WV",)
    worst = None
    for block in blocks:
        theta = to_numpy(getattr(stacked, block)).astype(np.float32)
        step = theta - (eta * to_numpy(getattr(grad, block))).astype(np.float32)
        moved = (step != theta).reshape(m, -1).mean(axis=1)
        if worst is None or moved.min() < worst[1]:
            worst = (block, float(moved.min()))
    block, share = worst
    if share >= FLOAT32_MIN_CHANGED:
        return None
    return (f"model.dtype = 'float32': the first local step with federated.learning_rate = {eta:g} "
            f"changes {share:.0%} of the entries of {block} on some client (float32 loses relative "
            f"changes below 6e-08), so training may stall; use model.dtype = 'float64' or a larger "
            f"learning rate")


def token_dimension(config: RunConfig) -> int:
    """The token dimension ``d`` of the clients ``config.task`` describes (in-context regression:
    ``dim + 1``, the target rides in the token; digits: 16).

    Parameters
    ----------
    config : RunConfig
        The run.

    Returns
    -------
    int
        ``d``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.limits import token_dimension
    >>> token_dimension(lt.config_from_dict({"task": {"dim": 6}}))
    6
    >>> token_dimension(lt.config_from_dict({"task": {"family": "in_context_regression", "dim": 6}}))
    7
    """
    task = config.task
    return {"in_context_regression": task.dim + 1, "digits": 16}.get(task.family, task.dim)


def setting_notes(config: RunConfig, clients=None) -> list[str]:
    """Settings of ``config`` that run but that a user should revisit (warnings, not errors):
    ``model.rank`` above the token dimension ``d`` and a federation of one client. ``d`` and the
    number of clients ``m`` are the data's when ``clients`` (a ``FederatedDataset``) is given.

    Parameters
    ----------
    config : RunConfig
        The run.
    clients : FederatedDataset, optional
        Its clients, when given rather than built from ``config``.

    Returns
    -------
    list of str
        The notes (empty when there is nothing to revisit).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.limits import setting_notes
    >>> setting_notes(lt.config_from_dict({}))
    []
    >>> [note[:30] for note in setting_notes(lt.config_from_dict({"task": {"num_clients": 1}, "model": {"rank": 8}}))]
    ['model.rank = 8 is above the to', 'the federation has one client ']
    """
    d = token_dimension(config) if clients is None else clients.dims[1]
    m = config.task.num_clients if clients is None else len(clients)
    notes = []
    if config.model.rank > d:
        notes.append(f"model.rank = {config.model.rank} is above the token dimension d = {d}: each head's "
                     f"kernel W_Q W_K^T is d×d, of rank at most d, so the extra columns add parameters "
                     f"but no expressiveness (model.rank = {d} is a full-rank kernel)")
    if m == 1:
        notes.append("the federation has one client (m = 1): no heterogeneity, so no kernel drift, and "
                     "FedAvg is plain local gradient descent; use task.num_clients >= 2 to study federation")
    return notes


def warn_settings(notes, stacklevel: int = 3) -> None:
    """Each distinct note once, as a :class:`~linattn_theory.core.errors.SettingWarning`.

    Parameters
    ----------
    notes : iterable of str
        The notes (:func:`setting_notes`, :func:`workers_note`).
    stacklevel : int, default 3
        The warnings' ``stacklevel``.

    Returns
    -------
    None

    Examples
    --------
    >>> import warnings
    >>> from linattn_theory.sim.limits import warn_settings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_settings(["check this", "check this", "and that"])
    >>> [str(w.message) for w in caught], caught[0].category.__name__
    (['check this', 'and that'], 'SettingWarning')
    """
    import warnings

    from ..core.errors import SettingWarning
    for note in dict.fromkeys(notes):
        warnings.warn(note, SettingWarning, stacklevel=stacklevel)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says, else all).

    Returns
    -------
    int
        The number of cores (at least 1).

    Examples
    --------
    >>> import os
    >>> from linattn_theory.sim.limits import usable_cores
    >>> 1 <= usable_cores() <= (os.cpu_count() or 1)
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):                    # pragma: no cover - not Linux
        return os.cpu_count() or 1


def workers_note(workers: int | None, what: str = "workers") -> str | None:
    """A warning when more worker processes are asked for than there are cores (they only
    contend for them: each run is no faster and memory grows with the workers), else ``None``.

    Parameters
    ----------
    workers : int or None
        The worker processes asked for (``None``: the default, one per core).
    what : str, default "workers"
        The setting's name in the note.

    Returns
    -------
    str or None
        The note, or ``None`` when ``workers`` fits the cores.

    Examples
    --------
    >>> from linattn_theory.sim.limits import usable_cores, workers_note
    >>> workers_note(None), workers_note(usable_cores())
    (None, None)
    >>> workers_note(usable_cores() + 1, "--workers").startswith("--workers = ")
    True
    """
    cores = usable_cores()
    if workers is None or workers <= cores:
        return None
    return (f"{what} = {workers} is above the {cores} cores this process may use: the extra workers "
            f"only contend for them and each holds its runs in memory; use {what} <= {cores}")
