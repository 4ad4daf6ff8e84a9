"""Step sizes set by curvature: ``federated.step_scale = c`` (docs/theory.md §5).

With a step scale the local step of an instance is

    η = c · η_stable(θ⁰),    η_stable(θ⁰) = 2 / max_c λ_max(Ã_c(K⁰)),   Ã_c = A_c + λI,

the value block's stability limit at the initial kernel ``K⁰``: below it every client's local
value map ``(I − ηÃ_c)^E`` is bounded and the frozen stage contracts (§5), so instances of one
cell run at the same fraction ``c`` of that limit. The value block's curvature is used, not the
full model's (:func:`~linattn_theory.sim.engine.hessian_curvature`), because it is exact and
reproducible: the eigenvalues of ``m`` matrices ``(Hd × Hd)`` in closed form, where the full
Hessian is a power-iteration estimate with finite-difference products that converges to the
largest ``|λ|`` and, at ``θ⁰``, depends on the random initial ``W_V``. The value block is a
principal block of the full Hessian (``∂²F_c/∂V² = Ã_c ⊗ I_p``), so ``η_stable(θ⁰)`` is an upper
bound on the full model's stable step at ``θ⁰``, not the step at which the warm-up diverges: the
kernel's curvature grows as it is learned (docs/theory.md §5 gives the numbers).

The step is resolved when a run starts (:func:`~linattn_theory.sim.engine.simulate`,
:func:`~linattn_theory.sim.ensemble.simulate_many`): the run's recorded configuration holds the
resolved ``η`` (so that it reruns, and every analysis reads, exactly that step) and its metadata
``step_scale`` the scale ``c``, ``η`` and ``η_stable``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core._array import to_numpy
from ..core.model import kernel
from ..core.moments import value_moments
from .config import RunConfig

__all__ = ["CURVATURE", "resolve_step_scale"]

#: what ``η_stable`` is the stable step of (recorded in the metadata)
CURVATURE = "value block at θ⁰: 2 / max_c λ_max(Ã_c(K⁰)), docs/theory.md §5"


def resolve_step_scale(config: RunConfig, data, params) -> tuple[RunConfig, dict]:
    """``(config with η = c · 2 / max_c λ_max(Ã_c(K⁰)), metadata record)`` for ``step_scale = c``.

    ``data`` are the run's stacked clients and ``params`` its ``θ⁰`` (:func:`~linattn_theory.sim.engine.prepare_run`).
    A config without a step scale comes back unchanged with an empty record. The returned config
    holds ``learning_rate = η`` and no step scale; the record is
    ``{"step_scale": {"step_scale": c, "learning_rate": η, "stable_learning_rate": η_stable,
    "curvature": CURVATURE}}``, for the run's metadata.
    """
    fed = config.federated
    c = fed.step_scale
    if c is None:
        return config, {}
    # engine.stable_learning_rate's number; from the moments here, as the engine calls this module
    A_tilde = to_numpy(value_moments(kernel(params), data, fed.ridge).A_tilde)
    stable = float(2.0 / np.max(np.linalg.eigvalsh(A_tilde)[:, -1]))
    eta = c * stable
    resolved = dataclasses.replace(config, federated=dataclasses.replace(fed, step_scale=None, learning_rate=eta))
    return resolved, {"step_scale": {"step_scale": c, "learning_rate": eta, "stable_learning_rate": stable,
                                     "curvature": CURVATURE}}
