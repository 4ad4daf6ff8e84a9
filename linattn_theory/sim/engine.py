"""One run: :func:`simulate` (a config end to end) and :func:`run_schedule` (the rounds from given
parameters on stacked clients), an ensemble of one of :mod:`linattn_theory.sim.rounds`' round
loop (docs/theory.md §3), with its hooks: a strategy object, frozen-stage features, ``on_round``
and a strategy's :class:`~linattn_theory.sim.strategies.Control`.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..core.clients import StackedClients
from ..core.errors import SettingWarning
from ..core.curvature import hessian_curvature, stable_learning_rate, value_curvature
from ..core.io import timed_run
from ..core.model import Params
from ..data.families import clients_from_config
from .config import FederatedConfig, ModelConfig, RunConfig
from .ensemble import checked_inputs, initial_params, prepare_run, run_metadata, run_planned
from .rounds import Divergence, Member, RunResult, RunState, objective, run_ensemble, select_engine
from .strategies import Strategy, make_strategy

#: its own names; the names it imports (run preparation, the round loop's types, curvature, clients)
#: stay importable from here for older code, documented where they are defined
__all__ = ["simulate", "run_schedule"]


@timed_run
def simulate(config: RunConfig, clients=None, *, progress: bool = False,
             params: Params | None = None, frozen_features=None,
             max_bytes: int | str | None = "auto", strategy: Strategy | None = None) -> RunResult:
    """Run ``config`` end to end: build the clients, initialise, run the schedule.

    ``simulate_many([config])[0]`` (:func:`~linattn_theory.sim.ensemble.simulate_many`, an
    ensemble of one: the same ``engine="auto"`` rule, :func:`~linattn_theory.sim.rounds.select_engine`)
    with a run alone's ``max_bytes`` and the hooks of
    :func:`run_schedule`: ``frozen_features`` (features of the frozen stage) and ``strategy``
    (overrides the one ``config`` names, built by
    :func:`~linattn_theory.sim.strategies.make_strategy`, e.g. to keep its control's record).
    ``max_bytes`` bounds a round's working set (see :func:`run_schedule`; ``"auto"``:
    cache-sized chunks of clients on the CPU when the round does not fit in cache, one chunk
    on a GPU, :func:`~linattn_theory.core.backend.resolve_max_bytes`); results do not depend on it.
    Given ``clients`` are checked first (:func:`~linattn_theory.core.clients.check_clients`:
    shapes, finite values; a ``ValueError`` names the client and the array), and settings to
    revisit are warned about (:func:`~linattn_theory.sim.limits.setting_notes`). A
    ``federated.step_scale`` is resolved to ``η`` at ``θ^0`` (:mod:`linattn_theory.sim.step_size`).

    Parameters
    ----------
    config : RunConfig
        The run: task family and its sizes, model, federated schedule and seed
        (:func:`~linattn_theory.sim.config.config_from_dict`, :func:`~linattn_theory.sim.config.load_config`).
    clients : FederatedDataset, optional
        The clients to train on (e.g. your own data, :class:`~linattn_theory.core.clients.FederatedDataset`);
        default: those ``config.task`` describes, drawn from ``config.seed``.
    progress : bool, default False
        Show a progress bar over the rounds.
    params : Params, optional
        Initial parameters ``θ^0``; default: drawn from ``config`` (``model.init_scale``, ``seed``).
    frozen_features : callable, optional
        ``frozen_features(params) -> φ`` of shape ``(m, N, H·d)``: the features of the frozen stage
        instead of those of the frozen kernel (static heads; passed to :func:`run_schedule`).
    max_bytes : int, str or None, default "auto"
        Bound on a round's working set (see :func:`run_schedule`; ``"auto"``: cache-sized chunks
        of clients on the CPU when the round does not fit in cache, one chunk on a GPU,
        :func:`~linattn_theory.core.backend.resolve_max_bytes`); results do not depend on it.
    strategy : Strategy, optional
        Overrides the one ``config`` names (built by :func:`~linattn_theory.sim.strategies.make_strategy`),
        e.g. to keep its control's record.

    Returns
    -------
    RunResult
        The per-round table (row ``t`` describes ``θ^t``), the final parameters ``θ^T``, those
        of round ``T0`` (``warmup_params``), the divergence report (``None`` if none) and the
        metadata (configuration, provenance, engine).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 5, "warmup_rounds": 2}})
    >>> result = lt.simulate(config)
    >>> len(result.table), result.diverged
    (6, False)
    >>> bool(result.table["loss_regularized"].iloc[-1] < result.table["loss_regularized"].iloc[0])
    True
    """
    _, given = checked_inputs([config], None if clients is None else [clients], stacklevel=5)  # past timed_run
    with warnings.catch_warnings():                  # said once above, not again inside
        warnings.simplefilter("ignore", SettingWarning)
        [result] = run_planned([config], given or [None], [params], max_bytes, progress, alone=True,
                                  strategies=[strategy], frozen_features=[frozen_features])
    return result


@np.errstate(over="ignore", invalid="ignore")   # overflow is detected and reported as divergence
def run_schedule(params: Params, data: StackedClients, fed: FederatedConfig, warmup_rounds: int,
                 seed: int = 0, *, progress: bool = False, strategy: Strategy | None = None,
                 frozen_features=None, max_bytes: int | None = None, prefix: RunState | None = None,
                 on_round=None, engine: str = "auto") -> RunResult:
    """Run ``fed.rounds`` rounds of ``fed.strategy`` from ``params`` on stacked clients.

    ``warmup_rounds`` is ``T0``: the round at which FedFrozen-type strategies freeze blocks, and
    the round whose parameters are returned as ``warmup_params``. ``strategy`` overrides the one
    named in ``fed`` (any :class:`~linattn_theory.sim.strategies.Strategy`). While the kernel is
    frozen (only ``W_V`` trains) the model is linear in ``V`` with features ``φ`` computed once
    at the frozen kernel (docs/theory.md §5); ``frozen_features(params) -> φ`` of shape
    ``(m, N, H·d)`` replaces them (static heads, :mod:`linattn_theory.theory.static_heads`).

    ``max_bytes`` bounds the working set a round adds to the stacked data: the participants'
    local steps run in chunks of clients (:func:`~linattn_theory.core.backend.client_chunks`; ``None``:
    one chunk). Each chunk sees the client rule's state through a :class:`Round` restricted to
    its participants, and the rule's state update and the server step see all of them, so the
    results are identical for every budget (a client rule's correction must act on each
    participant separately, as every rule of :mod:`linattn_theory.sim.strategies` does).

    ``engine`` runs the local steps: ``"array_api"`` as batched Array-API products over the
    clients (the reference, any backend), ``"fused"`` with the fused CPU engine
    (:mod:`linattn_theory.core.fused`: NumPy, full batches, no gradient correction; equal to
    rounding), ``"auto"`` the fused engine where it applies and pays (then ``max_bytes`` is
    moot: it holds one client at a time). ``metadata["engine"]`` records the one used.

    A strategy with a :class:`~linattn_theory.sim.strategies.Control` decides its schedule during
    the run: ``control.observe(state, data)`` sees every round's :class:`RunState` (after
    ``on_round``) until it returns a :class:`~linattn_theory.sim.strategies.Freeze`; while rounds
    remain, the run then continues from the freeze's parameters with only ``W_V`` training, and
    ``warmup_params`` are those parameters; ``control.finish(result)`` adds to the metadata.

    ``on_round(state)`` is called with the :class:`RunState` of every round the run reaches
    (``θ^t`` and all the loop carries). ``prefix`` continues a run from such a state (then
    ``params`` must be ``prefix.params``): the rounds after ``prefix.round`` follow exactly as in
    the uninterrupted run, provided the strategy agrees with the earlier run's on the rounds
    before (shared warm-up prefixes, :mod:`linattn_theory.sim.warmup_grid`).

    Returns the per-round table (row ``t`` describes ``θ^t``; drift columns describe the round
    that produced it), the final parameters and those at round ``T0``.

    Parameters
    ----------
    params : Params
        Initial parameters ``θ^0`` (on the namespace of ``data``).
    data : StackedClients
        The clients.
    fed : FederatedConfig
        The federated schedule (``config.federated``): rounds, strategy, step sizes, batches.
    warmup_rounds : int
        ``T0``.
    seed : int, default 0
        Seed of the minibatches and of the participating clients.
    progress : bool, default False
        Show a progress bar over the rounds.
    strategy : Strategy, optional
        Overrides the one named in ``fed``.
    frozen_features : callable, optional
        ``frozen_features(params) -> φ`` ``(m, N, H·d)``, the frozen stage's features.
    max_bytes : int, optional
        Bound on a round's working set; ``None``: one chunk of clients.
    prefix : RunState, optional
        Continue a run from this state.
    on_round : callable, optional
        ``on_round(state)``, called with every round's :class:`RunState`.
    engine : {"auto", "array_api", "fused"}, default "auto"
        What runs the local steps.

    Returns
    -------
    RunResult
        The table, the final parameters, those at round ``T0``, the divergence report and the
        metadata.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.engine import prepare_run
    >>> config = lt.config_from_dict({"federated": {"rounds": 5, "warmup_rounds": 2}})
    >>> data, params = prepare_run(config)
    >>> run = lt.run_schedule(params, data, config.federated, warmup_rounds=2, seed=config.seed)
    >>> run.table["loss"].tolist() == lt.simulate(config).table["loss"].tolist()
    True
    """
    if prefix is not None:
        _check_prefix(prefix, params, fed.rounds, warmup_rounds)
    config = RunConfig(seed=seed, model=ModelConfig(heads=int(params.WV.shape[-3])), federated=fed)
    strategy = make_strategy(fed, warmup_rounds) if strategy is None else strategy
    member = Member(config, data, params, prefix=prefix, strategy=strategy, T0=warmup_rounds,
                    frozen_features=frozen_features, on_round=on_round)
    [(result, _, _)] = run_ensemble([member], max_bytes=max_bytes, engine=engine, progress=progress)
    return result


def _check_prefix(prefix: RunState, params: Params, rounds: int, warmup_rounds: int) -> RunState:
    """``prefix`` if a run of ``rounds`` rounds can continue from it with ``params``, else a ``ValueError``."""
    if not isinstance(prefix, RunState):
        raise ValueError(f"prefix is a {type(prefix).__name__}; expected the RunState that "
                         f"run_schedule passes to on_round")
    if params is not prefix.params:
        raise ValueError("prefix: params must be prefix.params (the run continues from its state)")
    if not 0 <= prefix.round <= rounds or len(prefix.rows) != prefix.round + 1:
        raise ValueError(f"prefix ends at round {prefix.round} with {len(prefix.rows)} table rows; "
                         f"expected a round in 0..fed.rounds = {rounds} and rows 0..round")
    if prefix.round > warmup_rounds and prefix.warmup_params is None:
        raise ValueError(f"prefix ends at round {prefix.round} > warmup_rounds = {warmup_rounds} "
                         f"but holds no round-T0 parameters (warmup_params)")
    return prefix


