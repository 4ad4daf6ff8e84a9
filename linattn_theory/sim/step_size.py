"""Step sizes set by curvature: ``federated.step_scale = c`` (docs/theory.md §5).

With a step scale the local step of an instance is ``η = c · η_stable(θ⁰)``, a fraction of the
stable step at its initial parameters, so that instances of one cell run at the same fraction ``c``
of it. ``federated.step_curvature`` says which curvature:

- ``"value"`` (the default): ``η_stable = 2 / max_c λ_max(Ã_c(K⁰))``, ``Ã_c = A_c + λI``, the value
  block's stability limit at the initial kernel ``K⁰``: below it every client's local value map
  ``(I − ηÃ_c)^E`` is bounded and the frozen stage contracts (§5). It is exact and reproducible (the
  eigenvalues of ``m`` matrices ``Hd × Hd``), hence the default. The value block is a principal block
  of the full Hessian (``∂²F_c/∂V² = Ã_c ⊗ I_p``), so this is an upper bound on the full model's
  stable step at ``θ⁰``, and at ``θ⁰`` it does not see the labels;
- ``"model"``: ``η_stable = 2 / max_c λ_max(∇²F_{λ,c}(θ⁰))``, the full model's, by power iteration
  with finite-difference Hessian products (:func:`~linattn_theory.sim.engine.hessian_curvature`, 200
  iterations: an estimate, converging to the largest ``|λ|``; at ``θ⁰`` it depends on the random
  initial ``W_V``). It is closer to where the warm-up loses stability (§5 gives the numbers).

Neither is the step at which a run diverges: the kernel's curvature grows as it is learned.

The step is resolved when a run starts (:func:`~linattn_theory.sim.engine.simulate`,
:func:`~linattn_theory.sim.ensemble.simulate_many`, the recommenders): the run's recorded
configuration holds the resolved ``η`` (so that it reruns, and every analysis reads, exactly that
step) and its metadata ``step_scale`` the scale ``c``, ``η``, ``η_stable`` and the curvature used.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core.arrays import to_numpy
from ..core.model import kernel
from ..core.moments import value_moments
from ..core.curvature import model_curvature
from .config import RunConfig

__all__ = ["CURVATURE", "resolve_step_scale"]

#: what ``η_stable`` is the stable step of, by ``federated.step_curvature`` (recorded in the metadata)
CURVATURE = {"value": "value block at θ⁰: 2 / max_c λ_max(Ã_c(K⁰)), docs/theory.md §5",
             "model": "full model at θ⁰: 2 / max_c λ_max(∇²F_λ,c(θ⁰)), power iteration, docs/theory.md §5"}
def resolve_step_scale(config: RunConfig, data, params, hessian_curvature=None) -> tuple[RunConfig, dict]:
    """``(config with η = c · η_stable(θ⁰), metadata record)`` for ``step_scale = c`` (module docstring).

    ``data`` are the run's stacked clients and ``params`` its ``θ⁰`` (:func:`~linattn_theory.sim.engine.prepare_run`);
    ``hessian_curvature`` is :func:`~linattn_theory.sim.engine.hessian_curvature`, needed for
    ``step_curvature = "model"`` (passed in: the engine calls this module). A config without a step
    scale comes back unchanged with an empty record. The returned config holds ``learning_rate = η``
    and no step scale; the record is ``{"step_scale": {"step_scale": c, "step_curvature": …, "learning_rate": η,
    "stable_learning_rate": η_stable, "curvature": CURVATURE[step_curvature]}}``, for the run's metadata.

    Parameters
    ----------
    config : RunConfig
        The run; ``federated.step_scale`` is ``c`` (or ``None``).
    data : StackedClients
        Its stacked clients.
    params : Params
        Its ``θ⁰``.
    hessian_curvature : callable, optional
        :func:`~linattn_theory.core.curvature.hessian_curvature`; needed for ``step_curvature = "model"``.

    Returns
    -------
    config : RunConfig
        ``config`` with ``learning_rate = η`` and no step scale.
    record : dict
        ``{"step_scale": {...}}`` for the run's metadata (``{}`` without a step scale).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.ensemble import prepare_run
    >>> from linattn_theory.sim.step_size import resolve_step_scale
    >>> config = lt.config_from_dict({"federated": {"rounds": 4, "warmup_rounds": 2, "step_scale": 0.5}})
    >>> resolved, record = resolve_step_scale(config, *prepare_run(config))
    >>> step = record["step_scale"]
    >>> resolved.federated.learning_rate == step["learning_rate"] == 0.5 * step["stable_learning_rate"]
    True
    >>> resolved.federated.step_scale is None
    True
    """
    fed = config.federated
    c = fed.step_scale
    if c is None:
        return config, {}
    if fed.step_curvature == "model":
        if hessian_curvature is None:
            raise ValueError("step_curvature = 'model': pass hessian_curvature (linattn_theory.sim.engine's)")
        curvature = model_curvature(params, data, fed.ridge, hessian_curvature)
    else:       # engine.value_curvature's number; from the moments here, as the engine calls this module
        A_tilde = to_numpy(value_moments(kernel(params), data, fed.ridge).A_tilde)
        curvature = float(np.max(np.linalg.eigvalsh(A_tilde)[:, -1]))
    stable = 2.0 / curvature
    eta = c * stable
    default = type(fed)().step_curvature
    resolved = dataclasses.replace(config, federated=dataclasses.replace(
        fed, step_scale=None, step_curvature=default, learning_rate=eta))
    return resolved, {"step_scale": {"step_scale": c, "step_curvature": fed.step_curvature, "learning_rate": eta,
                                     "stable_learning_rate": stable, "curvature": CURVATURE[fed.step_curvature]}}
