"""How chaotic a run is: how far its end moves when its start moves by rounding (docs/theory.md §6,
"Chaotic instances").

Two engines, two CPUs (NumPy's AVX2 or AVX-512 paths) or two releases add the same terms in other
orders, which perturbs a run by about one unit in the last place per operation. A well-conditioned
run carries such a perturbation to its end almost unchanged; near the edge of stability, or where
softmax attention sharpens, it grows round after round until the final risk moves by percents.
The measure: repeat the run from ``θ^0 ⊙ (1 + s ξ)``, ``ξ ~ N(0, 1)`` entrywise (``s = 10^{-12}``,
a stream of its own), and compare its end with the unperturbed one,

    amplification = max over repeats of  ‖θ^T' − θ^T‖ / (s ‖θ^T‖),

together with the same ratio for the final regularised objective ``F_λ(θ^T)``. A run whose
amplification exceeds :data:`CHAOS_AMPLIFICATION` is *chaotic*: its end moves by more than
``10^{-5}`` under the declared perturbation, so its numbers hold only to its measured spread, not to
their digits. Another CPU's rounding is not one perturbation of ``θ^0`` but one per operation and
round: it acts like a perturbation of about ``10^{-13}``–``10^{-12}`` (measured: a run of amplification
below ``10^7`` moved by ``2.9·10^{-7}`` between NumPy's AVX2 and AVX-512 paths), so an unflagged run
holds to ``10^{-5}`` on another CPU and to its digits only on the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.model import Params
from ..core.seeds import SEED_PERTURBATION, seed_sequence
from .config import RunConfig
from .engine import clients_from_config, initial_params, simulate

__all__ = ["PERTURBATION", "CHAOS_AMPLIFICATION", "Sensitivity", "perturbed_params", "perturbed_runs",
           "run_sensitivity", "ensemble_sensitivities"]

#: the relative size of the perturbation of ``θ^0``: a few hundred units in the last place of float64
PERTURBATION = 1e-12
#: above this a run is chaotic: a 1e-12 move of θ⁰ moves its end by more than 1e-5 (module docstring)
CHAOS_AMPLIFICATION = 1e7


@dataclass(frozen=True)
class Sensitivity:
    """How much a run's end moves per unit relative move of its start (largest over the repeats).

    ``parameter_amplification``: ``‖θ^T' − θ^T‖ / (s ‖θ^T‖)``; ``objective_amplification``:
    ``|F_λ' − F_λ| / (s |F_λ|)`` at the last round; ``spread``: the largest relative change of
    ``F_λ(θ^T)`` itself (what a table of the run may move by on another CPU, to first order);
    ``diverged``: a repeat (or the run) diverged, where the other did not.

    Parameters
    ----------
    parameter_amplification : float
        ``‖θ^T' − θ^T‖ / (s ‖θ^T‖)``.
    objective_amplification : float
        ``|F_λ' − F_λ| / (s |F_λ|)``.
    spread : float
        The largest relative change of ``F_λ(θ^T)``.
    diverged : bool
        A repeat or the run diverged where the other did not.

    Examples
    --------
    >>> from linattn_theory.sim.sensitivity import Sensitivity
    >>> calm = Sensitivity(parameter_amplification=3.0, objective_amplification=1.0, spread=1e-12, diverged=False)
    >>> calm.amplification, calm.chaotic
    (3.0, False)
    >>> Sensitivity(1e9, 1.0, 1e-3, False).chaotic          # above CHAOS_AMPLIFICATION
    True
    """

    parameter_amplification: float
    objective_amplification: float
    spread: float
    diverged: bool

    @property
    def amplification(self) -> float:
        return max(self.parameter_amplification, self.objective_amplification)

    @property
    def chaotic(self) -> bool:
        """Amplification above :data:`CHAOS_AMPLIFICATION`, or a divergence that a rounding decides."""
        return self.diverged or not self.amplification <= CHAOS_AMPLIFICATION


def perturbed_params(params: Params, scale: float, seed: int, repeat: int = 0) -> Params:
    """``θ ⊙ (1 + s ξ)`` with ``ξ ~ N(0, 1)`` from the stream ``(seed, SEED_PERTURBATION, repeat)``.

    Parameters
    ----------
    params : Params
        ``θ``.
    scale : float
        The relative size ``s``.
    seed : int
        The run's seed.
    repeat : int, default 0
        Which perturbation ``j`` (an independent stream each).

    Returns
    -------
    Params
        ``θ ⊙ (1 + s ξ)``, in the dtype of ``params``.

    Examples
    --------
    >>> import numpy as np
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sensitivity import perturbed_params
    >>> params = lt.Params.init(d=6, r=3, p=2, seed=0)
    >>> moved = perturbed_params(params, 1e-6, seed=0)
    >>> bool(np.max(np.abs(moved.WV / params.WV - 1)) < 1e-5), bool((moved.WV != params.WV).any())
    (True, True)
    """
    rng = np.random.default_rng(seed_sequence(seed, SEED_PERTURBATION, repeat))
    return params.map(lambda block: block * (1.0 + scale * rng.standard_normal(block.shape)).astype(block.dtype))


def _flat(params: Params) -> np.ndarray:
    return np.concatenate([np.asarray(getattr(params, b), dtype=np.float64).ravel() for b in ("WQ", "WK", "WV")])


def perturbed_runs(config: RunConfig, clients=None, *, scale: float = PERTURBATION, repeats: int = 2) -> list:
    """``config`` run ``repeats`` times from ``θ^0 ⊙ (1 + s ξ_j)``, ``j = 0 … repeats − 1`` (:class:`RunResult` each).

    Parameters
    ----------
    config : RunConfig
        The run.
    clients : FederatedDataset, optional
        Its clients; default: built from ``config``.
    scale : float, default PERTURBATION
        The relative size ``s`` (``1e-12``).
    repeats : int, default 2
        The number of perturbed runs.

    Returns
    -------
    list of RunResult
        The perturbed runs, ``j = 0 … repeats − 1``.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sensitivity import perturbed_runs
    >>> runs = perturbed_runs(lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}))
    >>> len(runs), [len(run.table) for run in runs]
    (2, [5, 5])
    """
    if not (scale > 0 and np.isfinite(scale)) or not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"perturbed_runs: scale={scale!r}, repeats={repeats!r}; expected scale > 0 and an "
                         "integer repeats >= 1")
    clients = clients_from_config(config) if clients is None else clients
    start = initial_params(config, np.shape(clients[0].q)[-1], np.shape(clients[0].y)[-1])
    return [simulate(config, clients, params=perturbed_params(start, scale, config.seed, j)) for j in range(repeats)]


def run_sensitivity(config: RunConfig, clients=None, *, scale: float = PERTURBATION, repeats: int = 2,
                    reference=None, runs=None) -> Sensitivity:
    """The :class:`Sensitivity` of ``config``: its end against the ends of :func:`perturbed_runs`.

    ``reference`` (the unperturbed run's result) and ``runs`` (the perturbed ones, made with the same
    ``scale``) are used when given, run otherwise.

    Parameters
    ----------
    config : RunConfig
        The run.
    clients : FederatedDataset, optional
        Its clients; default: built from ``config``.
    scale : float, default PERTURBATION
        The relative size ``s`` of the perturbations.
    repeats : int, default 2
        The number of perturbed runs.
    reference : RunResult, optional
        The unperturbed run, if already run.
    runs : list of RunResult, optional
        The perturbed runs (:func:`perturbed_runs` with ``scale``), if already run.

    Returns
    -------
    Sensitivity
        The largest amplifications over the repeats.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.sensitivity import run_sensitivity
    >>> found = run_sensitivity(lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2}}))
    >>> found.chaotic, found.diverged, bool(found.amplification < 100)
    (False, False, True)
    """
    clients = clients_from_config(config) if clients is None else clients
    runs = perturbed_runs(config, clients, scale=scale, repeats=repeats) if runs is None else runs
    base = simulate(config, clients) if reference is None else reference
    end, objective = _flat(base.params), float(base.table["loss_regularized"].iloc[-1])
    parameter, value, spread, diverged = 0.0, 0.0, 0.0, False
    for run in runs:
        if run.diverged or base.diverged:
            diverged = diverged or run.diverged != base.diverged
            continue
        change = abs(float(run.table["loss_regularized"].iloc[-1]) - objective) / abs(objective)
        spread = max(spread, change)
        value = max(value, change / scale)
        parameter = max(parameter, float(np.linalg.norm(_flat(run.params) - end) / (scale * np.linalg.norm(end))))
    return Sensitivity(parameter, value, spread, diverged)


def ensemble_sensitivities(configs, clients, references, *, scale: float = PERTURBATION,
                           progress: bool = False) -> list[Sensitivity]:
    """The :class:`Sensitivity` of each run ``references[i]`` of ``configs[i]`` on ``clients[i]`` against one
    repeat from ``θ^0 ⊙ (1 + s ξ_0)``, the repeats run together as one ensemble
    (:func:`~linattn_theory.sim.ensemble.simulate_many`): the numbers of
    ``run_sensitivity(config, clients, reference=run, runs=[repeat])`` one run at a time.

    Parameters
    ----------
    configs : list of RunConfig
        The runs.
    clients : list of FederatedDataset
        Their clients.
    references : list of RunResult
        The unperturbed runs.
    scale : float, default PERTURBATION
        The relative size ``s`` of the perturbation.
    progress : bool, default False
        Show a progress bar.

    Returns
    -------
    list of Sensitivity
        One per run.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.engine import clients_from_config
    >>> from linattn_theory.sim.sensitivity import ensemble_sensitivities, run_sensitivity
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 4}})
    >>> clients = clients_from_config(config)
    >>> run = lt.simulate(config, clients)
    >>> [found] = ensemble_sensitivities([config], [clients], [run])
    >>> found == run_sensitivity(config, clients, reference=run, repeats=1)
    True
    """
    from .ensemble import prepare_run, simulate_many

    starts = [perturbed_params(prepare_run(c, cl)[1], scale, c.seed) for c, cl in zip(configs, clients)]
    repeats = simulate_many(configs, clients, params=starts, progress=progress)
    return [run_sensitivity(c, cl, scale=scale, reference=r, runs=[a])
            for c, cl, r, a in zip(configs, clients, references, repeats)]
