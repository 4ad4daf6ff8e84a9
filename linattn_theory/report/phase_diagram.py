"""Where freezing pays against tuned FedAvg: the phase diagram's instances, arms and statistics
(docs/theory.md §6 "Where freezing pays"; simulations/phase_diagram.py; issue 30, items 4 and 6).

An instance is ``(ζ_V, seed)``; its step scale ``c`` sets ``η = c · 2 / λ_max(θ⁰)`` with the full
model's curvature at ``θ⁰`` (:func:`stable_step`, ``federated.step_curvature = "model"`` of
:mod:`linattn_theory.sim.step_size`, computed once per instance). :func:`predictor_inputs` gives the
a-priori predictor (:mod:`linattn_theory.theory.phase_predictor`) what it may know at the start.
"""

from __future__ import annotations

import numpy as np

from ..core.model import kernel
from ..sim.config import RunConfig
from ..sim.engine import clients_from_config, hessian_curvature, prepare_run
from ..sim.step_size import MODEL_ITERATIONS
from ..theory.bound import drift_floor_leading_order
from ..theory.phase_predictor import (drift_share, edge_round, predict_best_warmup, predict_pays,
                                      stability_margin)
from ..theory.profile import profile_objective

__all__ = ["stable_step", "predictor_inputs"]


def stable_step(config: RunConfig, clients=None) -> tuple[float, float]:
    """``(2/λ_max, λ_max)``, ``λ_max = max_c λ_max(∇²F_{λ,c}(θ⁰))`` of ``config``'s instance (the
    ``"model"`` curvature of :func:`~linattn_theory.sim.step_size.resolve_step_scale`, same iterations)."""
    data, theta0 = prepare_run(config, clients)
    curvature = float(np.max(hessian_curvature(theta0, data, config.federated.ridge, iterations=MODEL_ITERATIONS)))
    return 2.0 / curvature, curvature


def predictor_inputs(config: RunConfig, eta: float, curvature: float, clients=None, warmups=None) -> dict:
    """What the predictor knows at the start of ``config``'s run at step ``eta`` (docs/theory.md §6):
    the stability margin ``m = 2 − ηλ_max(θ⁰)``, the drift floor's leading order ``D₂(K⁰)`` (§5) at
    the initial kernel with ``η`` and ``E``, the profile ``Φ_λ(K⁰)``, their ratio, the edge round and
    the predictions (a) ``predicted_pays`` and (b) ``predicted_T0`` (on the grid ``warmups``)."""
    clients = clients_from_config(config) if clients is None else clients
    fed = config.federated
    _, theta0 = prepare_run(config, clients)
    K0 = np.asarray(kernel(theta0), dtype=np.float64)
    D2 = drift_floor_leading_order(K0, clients, eta, fed.local_steps, fed.ridge)["leading_order"]
    phi0 = float(profile_objective(K0, clients, fed.ridge)[0])
    m = stability_margin(eta, curvature)
    T = fed.rounds
    return {"margin": m, "drift_leading_order": float(D2), "profile_initial": phi0,
            "drift_share": drift_share(D2, phi0), "edge_round": edge_round(m, T),
            "predicted_pays": bool(predict_pays(m, T)), "predicted_T0": int(predict_best_warmup(m, T, warmups))}
