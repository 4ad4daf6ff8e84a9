"""Run configuration: typed sections, read from TOML, validated before any work.

Every error names the field, the value and what is allowed, and is raised as
:class:`ConfigError` before anything is computed or written (the command line turns it into
exit status 2).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..core.errors import ConfigError
from ..data.families import FAMILIES, FAMILY_KEYS, family_check
from .strategies import STRATEGIES, declaration, effective_warmup_rounds, strategy_settings


__all__ = ["ConfigError", "TaskConfig", "ModelConfig", "FederatedConfig", "RunConfig",
           "load_config", "config_from_dict", "config_hash", "ignored_settings", "read_toml"]


def _spec(default, *, low=None, high=None, low_open=False, high_open=False, choices=None,
          doc="", allow_inf=False):
    meta = {"low": low, "high": high, "low_open": low_open, "high_open": high_open,
            "choices": choices, "doc": doc, "allow_inf": allow_inf}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TaskConfig:
    """The clients (docs/theory.md §2). Keys that do not apply to ``family`` are rejected.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import TaskConfig
    >>> TaskConfig().num_clients, lt.config_from_dict({"task": {"num_clients": 3}}).task == TaskConfig(num_clients=3)
    (8, True)
    """

    family: str = _spec("planted_kernel", choices=FAMILIES,
                        doc="task family (digits: scikit-learn's handwritten digits, docs/theory.md §9)")
    num_clients: int = _spec(8, low=1, doc="number of clients m")
    samples_per_client: int = _spec(128, low=2, doc="samples per client N (mean N_c when skewed)")
    tokens: int = _spec(8, low=1, doc="context length n")
    dim: int = _spec(6, low=1, doc="token dimension d (feature dimension for in-context regression)")
    heads: int = _spec(1, low=1, doc="teacher heads (planted kernel)")
    rank: int = _spec(3, low=1, doc="teacher kernel rank (planted kernel)")
    outputs: int = _spec(2, low=1, doc="output dimension p (planted kernel)")
    zeta_value: float = _spec(0.5, low=0.0, doc="concept heterogeneity ζ_V (planted kernel)")
    zeta_covariate: float = _spec(0.5, low=0.0, doc="covariate heterogeneity ζ_X")
    zeta_mean: float = _spec(0.0, low=0.0, doc="token-mean heterogeneity (planted kernel)")
    zeta_task: float = _spec(0.5, low=0.0, doc="task-mean heterogeneity (in-context regression)")
    noise: float = _spec(0.1, low=0.0, doc="label noise σ")
    dirichlet_alpha: float | None = _spec(None, low=0.0, low_open=True,
                                          doc="Dirichlet concentration α of client sizes (absent: equal)")
    query: str = _spec("last", choices=("last", "fresh"), doc="query token (planted kernel)")
    positional_strength: float = _spec(0.0, low=0.0, doc="position-dependent token means (planted kernel)")
    label_alpha: float | None = _spec(None, low=0.0, low_open=True,
                                      doc="Dirichlet concentration of each class over the clients (digits; absent: even)")
    test_fraction: float = _spec(0.25, low=0.0, high=1.0, low_open=True, high_open=True,
                                 doc="held-out test share of each class (digits)")



@dataclass(frozen=True)
class ModelConfig:
    """The student layer (docs/theory.md §1).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import ModelConfig
    >>> lt.config_from_dict({"model": {"heads": 2}}).model == ModelConfig(heads=2), ModelConfig().dtype
    (True, 'float64')
    """

    heads: int = _spec(1, low=1, doc="heads H")
    rank: int = _spec(3, low=1, doc="head width r")
    init_scale: float = _spec(0.5, low=0.0, doc="initial weights N(0, scale²/d)")
    dtype: str = _spec("float64", choices=("float64", "float32"), doc="floating-point type")
    backend: str = _spec("numpy", choices=("numpy", "cupy"), doc="array library")
    attention: str = _spec("linear", choices=("linear", "softmax"),
                           doc="attention: linear (docs/theory.md §1) or softmax (§9)")
    temperature: float = _spec(1.0, low=0.0, low_open=True,
                               doc="softmax temperature τ, scores q^T K x / τ (softmax attention only)")
    engine: str = _spec("auto", choices=("auto", "fused", "array_api"),
                        doc="local-step engine: fused CPU kernels (numba), the Array-API path, or auto "
                            "(fused where it applies and pays; linattn_theory.core.fused)")


#: the local step η and the curvature-relative step scale that sets it: one of them is given
STEP_KEYS = ("learning_rate", "step_scale")
#: settings of the step scale, recorded only with one (so that configs with η keep their hash)
STEP_SCALE_KEYS = ("step_curvature",)

#: model keys recorded only with softmax attention, so that linear configurations keep their hash
SOFTMAX_KEYS = ("attention", "temperature")


@dataclass(frozen=True)
class FederatedConfig:
    """The schedule (docs/theory.md §3).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import FederatedConfig
    >>> fed = FederatedConfig(rounds=20, warmup_rounds=5)
    >>> lt.config_from_dict({"federated": {"rounds": 20, "warmup_rounds": 5}}).federated == fed, fed.strategy
    (True, 'fedfrozen')
    """

    strategy: str = _spec("fedfrozen", choices=STRATEGIES,
                          doc="federated strategy (linattn_theory.sim.strategies; random_kernel = fedfrozen with T0 = 0)")
    rounds: int = _spec(40, low=1, doc="total rounds T")
    warmup_rounds: int = _spec(10, low=0, doc="warm-up rounds T0 (fedfrozen, value_frozen, fedfrozen_*, value_solve)")
    local_steps: int = _spec(5, low=1, doc="local steps E")
    learning_rate: float | None = _spec(0.05, low=0.0, low_open=True,
                                        doc="local step size η (excludes step_scale)")
    step_scale: float | None = _spec(None, low=0.0, low_open=True,
                                     doc="η = c × the stable step 2 / λ_max at θ⁰ of step_curvature "
                                         "(docs/theory.md §5; linattn_theory.sim.step_size); excludes learning_rate")
    step_curvature: str = _spec("value", choices=("value", "model"),
                                doc="step_scale's curvature at θ⁰: the value block's max_c λ_max(Ã_c) (exact) or "
                                    "the full model's max_c λ_max(∇²F_λ,c) (power iteration)")
    batch_size: int | None = _spec(None, low=1, doc="minibatch size b (absent: full batch)")
    participation: float = _spec(1.0, low=0.0, high=1.0, low_open=True,
                                 doc="fraction of clients per round")
    server_learning_rate: float = _spec(1.0, low=0.0, low_open=True, doc="server step on the mean delta")
    ridge: float = _spec(0.0, low=0.0, doc="value-block ridge λ")
    prox_mu: float = _spec(0.1, low=0.0, doc="FedProx proximal weight μ (fedprox, fedfrozen_fedprox)")
    adaptive_window: int = _spec(10, low=1, doc="fedfrozen_adaptive: rounds w of the trends the rule fits (docs/theory.md §8)")
    adaptive_horizon: int = _spec(1, low=1, doc="fedfrozen_adaptive: rounds h of warm-up whose gain and cost are compared")
    adaptive_confidence: float = _spec(2.0, low=0.0, doc="fedfrozen_adaptive: z, freeze only when the forecast "
                                                         "advantage over FedAvg exceeds z × its error")
    adaptive_gain_confidence: float = _spec(3.0, low=0.0, doc="fedfrozen_adaptive: z_g, keep training while the "
                                                              "gain exceeds the cost less z_g × the gain's standard error")
    adaptive_descent_confidence: float = _spec(8.0, low=0.0, allow_inf=True, doc="fedfrozen_adaptive: z_d, keep "
                                               "training while R_freeze still falls by more than z_d standard errors "
                                               "of its slope (inf: no descent test, the rule of rounds 1 and 2)")
    server_momentum: float = _spec(0.9, low=0.0, high=1.0, high_open=True,
                                   doc="FedAvgM server momentum β (fedavgm)")
    server_beta1: float = _spec(0.9, low=0.0, high=1.0, high_open=True,
                                doc="FedAdam first-moment decay β1 (fedadam)")
    server_beta2: float = _spec(0.99, low=0.0, high=1.0, high_open=True,
                                doc="FedAdam second-moment decay β2 (fedadam)")
    server_epsilon: float = _spec(1e-3, low=0.0, low_open=True,
                                  doc="FedAdam adaptivity τ (fedadam)")
    divergence_factor: float = _spec(1e4, low=1.0, low_open=True,
                                     doc="stop when F exceeds this times the initial loss")

    def __post_init__(self):
        # a step scale sets η per instance when the run starts (sim.step_size): no η before that
        if self.step_scale is not None:
            object.__setattr__(self, "learning_rate", None)
        # "no descent test" has one spelling, inf, which TOML and the recorded JSON can hold
        # (None would be dropped as absent and come back as the default)
        if self.adaptive_descent_confidence is None:
            object.__setattr__(self, "adaptive_descent_confidence", math.inf)


@dataclass(frozen=True)
class RunConfig:
    """A whole run: ``seed`` and the ``task``, ``model`` and ``federated`` sections.

    Build one with :func:`config_from_dict` or :func:`load_config` (validated); every field of
    every section is listed in docs/cli.md.

    Parameters
    ----------
    seed : int, default 0
        The root seed: the instance (teacher, clients, initialisation, minibatches).
    task : TaskConfig
        The task family and its sizes and heterogeneity.
    model : ModelConfig
        The layer: heads, rank, attention, initialisation, backend and dtype.
    federated : FederatedConfig
        The schedule: strategy, rounds, warm-up ``T0``, local steps, step sizes, participation.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"federated": {"rounds": 30, "warmup_rounds": 10}})
    >>> later = config.with_updates({"federated.warmup_rounds": 20, "seed": 4})
    >>> later.federated.warmup_rounds, later.seed, config.federated.warmup_rounds
    (20, 4, 10)
    >>> lt.config_from_dict(later.to_dict()) == later
    True
    """

    seed: int = _spec(0, low=0, doc="root seed")
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    federated: FederatedConfig = field(default_factory=FederatedConfig)

    def to_dict(self) -> dict:
        """Nested dictionary of every setting (task keys of the chosen family only)."""
        data = {"seed": self.seed, "task": section_settings(self.task), "model": section_settings(self.model),
                "federated": section_settings(self.federated)}
        keep = FAMILY_KEYS[self.task.family] | {"family"}
        data["task"] = {k: v for k, v in data["task"].items() if k in keep}
        if self.model.attention == "linear":
            data["model"] = {k: v for k, v in data["model"].items() if k not in SOFTMAX_KEYS}
        # η or the step scale that sets it, whichever is given (so that configs with η keep their hash)
        scaled = self.federated.step_scale is not None
        data["federated"] = {k: v for k, v in data["federated"].items()
                             if (k not in STEP_KEYS or v is not None) and (k not in STEP_SCALE_KEYS or scaled)}
        return data

    def with_updates(self, updates: dict) -> "RunConfig":
        """Return a validated copy with dotted keys replaced, e.g. ``{"federated.local_steps": 3}``.

        Setting one of ``federated.learning_rate`` and ``federated.step_scale`` replaces the other.
        """
        data = self.to_dict()
        given = [key for key in STEP_KEYS if updates.get(f"federated.{key}") is not None]
        if len(given) == 1:              # the other one goes, with the settings only a step scale has
            other, = set(STEP_KEYS) - set(given)
            for key in (other,) + (STEP_SCALE_KEYS if other == "step_scale" else ()):
                data["federated"].pop(key, None)
        return config_from_dict(_drop_none(apply_overrides(data, updates, "with_updates")))

    @property
    def warmup_rounds(self) -> int:
        """The effective ``T0``: ``T`` for strategies that never freeze (fedavg, fedprox, …), 0 for
        ``random_kernel`` (see :func:`linattn_theory.sim.strategies.effective_warmup_rounds`)."""
        fed = self.federated
        return effective_warmup_rounds(fed.strategy, fed.rounds, fed.warmup_rounds)


SECTIONS = {"task": TaskConfig, "model": ModelConfig, "federated": FederatedConfig}


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def section_settings(section) -> dict:
    """A section's settings by name, in field order: ``dataclasses.asdict`` of a section, whose every
    setting is a number, a string or ``None`` (nothing to copy), without its recursion (which was 6 % of
    the regret benchmark's time).

    Parameters
    ----------
    section : TaskConfig, ModelConfig or FederatedConfig
        The section.

    Returns
    -------
    dict
        ``{setting: value}``.

    Examples
    --------
    >>> import dataclasses
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import section_settings
    >>> fed = lt.config_from_dict({"federated": {"rounds": 20}}).federated
    >>> section_settings(fed) == dataclasses.asdict(fed), section_settings(fed)["rounds"]
    (True, 20)
    """
    return {name: getattr(section, name) for name in _field_names(type(section))}


def _drop_none(data: dict) -> dict:
    return {k: (_drop_none(v) if isinstance(v, dict) else v) for k, v in data.items() if v is not None}


@functools.lru_cache(maxsize=None)
def _expected_type(annotation):
    """The type of a field annotation such as ``float | None`` (``float``; memoised: the
    annotations are a few strings, and every config built reads each of them)."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"float": float, "int": int, "str": str, "None": None})
    types = [a for a in typing.get_args(annotation) if a is not type(None)]
    return types[0] if types else annotation


def _check_value(path: str, value, f):
    base = _expected_type(f.type)
    meta = f.metadata
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} = {value!r}: expected an integer")
    elif base is float:
        if meta.get("allow_inf") and value == "inf":   # a recorded config writes inf as a string
            value = math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path} = {value!r}: expected a number")
        if not math.isfinite(value) and not (meta.get("allow_inf") and value == math.inf):
            raise ConfigError(f"{path} = {value!r}: expected a finite number" +
                              (" or inf" if meta.get("allow_inf") else ""))
        value = float(value)
    elif base is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} = {value!r}: expected a string")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{path} = {value!r}: expected one of {', '.join(map(repr, meta['choices']))}")
    low, high = meta.get("low"), meta.get("high")
    if low is not None and (value < low or (meta["low_open"] and value == low)):
        op = ">" if meta["low_open"] else ">="
        raise ConfigError(f"{path} = {value!r}: expected a value {op} {low}")
    if high is not None and (value > high or (meta["high_open"] and value == high)):
        op = "<" if meta["high_open"] else "<="
        raise ConfigError(f"{path} = {value!r}: expected a value {op} {high}")
    return value


def _build_section(cls, data, path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of keys, got {data!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown key; allowed keys are {', '.join(sorted(known))}")
    return cls(**{name: _check_value(f"{path}.{name}", value, known[name]) for name, value in data.items()})


def config_from_dict(data: dict) -> RunConfig:
    """Validate a nested dictionary (as read from TOML) and return a :class:`RunConfig`.

    Parameters
    ----------
    data : dict
        ``{"seed": …, "task": {…}, "model": {…}, "federated": {…}}``; every key optional (its
        default, docs/cli.md), an unknown key, a value of the wrong type or out of range refused.

    Returns
    -------
    RunConfig
        The validated configuration, every field filled in.

    Raises
    ------
    ConfigError
        Naming the key and the expected values.

    Examples
    --------
    >>> import linattn_theory as lt
    >>> config = lt.config_from_dict({"seed": 1, "federated": {"rounds": 20, "warmup_rounds": 5}})
    >>> config.federated.rounds, config.federated.warmup_rounds, config.task.family
    (20, 5, 'planted_kernel')
    >>> lt.config_from_dict({"federated": {"round": 20}})
    Traceback (most recent call last):
    ...
    linattn_theory.core.errors.ConfigError: federated.round: unknown key...
    """
    if not isinstance(data, dict):
        raise ConfigError(f"configuration: expected a table, got {type(data).__name__}")
    data = _drop_none(data)   # a recorded config (metadata.json) writes absent options as null
    allowed = {"seed", *SECTIONS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key; allowed top-level keys are {', '.join(sorted(allowed))}")
    seed_field = next(f for f in fields(RunConfig) if f.name == "seed")
    seed = _check_value("seed", data.get("seed", 0), seed_field)
    sections = {name: _build_section(cls, data.get(name, {}), name) for name, cls in SECTIONS.items()}
    task = sections["task"]
    extra = set(data.get("task", {})) - FAMILY_KEYS[task.family] - {"family"}
    if extra:
        raise ConfigError(f"task.{min(extra)}: does not apply to family {task.family!r}; "
                          f"its keys are {', '.join(sorted(FAMILY_KEYS[task.family]))}")
    check = family_check(task.family)
    if check is not None:                # the family's own checks (docs/howto/add-task-family.md)
        check(task)
    fed = sections["federated"]
    given = data.get("federated", {})
    unused = [key for key in STEP_SCALE_KEYS if key in given and "step_scale" not in given]
    if unused:
        raise ConfigError(f"federated.{unused[0]} = {given[unused[0]]!r}: applies only with federated.step_scale "
                          f"(the step set by curvature); set step_scale or leave {unused[0]} out")
    if "step_scale" in given and "learning_rate" in given:
        raise ConfigError(f"federated.learning_rate = {given['learning_rate']!r} and federated.step_scale = "
                          f"{given['step_scale']!r}: give one of them (step_scale sets η = c × the value "
                          f"block's stable step at θ⁰, docs/theory.md §5)")
    declared = declaration(fed.strategy)
    if declared.check is not None:       # the strategy's own checks (docs/howto/add-strategy.md)
        declared.check(fed, set(data.get("federated", {})))
    if fed.batch_size is not None and task.dirichlet_alpha is None and fed.batch_size > task.samples_per_client:
        raise ConfigError(f"federated.batch_size = {fed.batch_size}: expected a value <= "
                          f"task.samples_per_client = {task.samples_per_client} (a minibatch is drawn "
                          f"without replacement from one client's samples; leave batch_size out for "
                          f"full batches)")
    if fed.warmup_rounds > fed.rounds and declared.freezes:
        if "warmup_rounds" in data.get("federated", {}):
            raise ConfigError(f"federated.warmup_rounds = {fed.warmup_rounds}: expected a value <= "
                              f"federated.rounds = {fed.rounds}")
        raise ConfigError(f"federated.rounds = {fed.rounds}: expected a value >= federated.warmup_rounds "
                          f"= {fed.warmup_rounds} (its default); set federated.warmup_rounds too")
    return RunConfig(seed=seed, **sections)


#: the online rule's settings as every key held them before its redesign (docs/theory.md §8): a
#: strategy that ignores them keeps its earlier key (:func:`config_hash`)
_ADAPTIVE_KEY_DEFAULTS = {"adaptive_window": 5, "adaptive_horizon": 3}


#: the online rule's strategy: until its control freezes the kernel, a run of it with
#: ``warmup_rounds = rounds`` is the FedFrozen run with ``T0 = T`` (every block trains)
ONLINE_STRATEGY = "fedfrozen_adaptive"


def warmup_family_key(config: RunConfig) -> str | None:
    """A key shared by the runs of one instance whose warm-ups are one trajectory, else ``None``.

    Those are the FedFrozen runs that differ only in ``T0`` and the online rule's run
    (:data:`ONLINE_STRATEGY` with ``warmup_rounds = rounds``): each follows the ``T0 = T`` run
    until it freezes. Settings FedFrozen never reads (:func:`~linattn_theory.sim.strategies.strategy_settings`)
    are left out.
    """
    fed = config.federated
    online = fed.strategy == ONLINE_STRATEGY and fed.warmup_rounds == fed.rounds
    if fed.strategy != "fedfrozen" and not online:
        return None
    data = config.to_dict()
    data["federated"].update(strategy="fedfrozen", warmup_rounds=None)
    for name, users in strategy_settings().items():
        if "fedfrozen" not in users:
            del data["federated"][name]
    return json.dumps(data, sort_keys=True)


def ignored_settings(config: RunConfig) -> list[str]:
    """One message per federated setting that ``config`` moves off its default although its
    strategy never reads it (e.g. ``prox_mu`` with ``fedavg``); the command line prints them as
    warnings.

    Parameters
    ----------
    config : RunConfig
        The configuration.

    Returns
    -------
    list of str
        The messages (empty when every setting is read).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import ignored_settings
    >>> ignored_settings(lt.config_from_dict({"federated": {"strategy": "fedavg", "prox_mu": 0.5}}))
    ["federated.prox_mu = 0.5 is ignored by strategy 'fedavg' (only fedprox, fedfrozen_fedprox read it)"]
    >>> ignored_settings(lt.config_from_dict({}))
    []
    """
    fed = config.federated
    defaults = {f.name: f.default for f in fields(FederatedConfig)}
    notes = []
    for name, users in strategy_settings().items():
        value = getattr(fed, name)
        if fed.strategy not in users and value != defaults[name]:
            notes.append(f"federated.{name} = {value!r} is ignored by strategy {fed.strategy!r} "
                         f"(only {', '.join(users)} read it)")
    return notes


def read_toml(path, what: str = "config file") -> dict:
    """The table of a TOML file read as UTF-8 (a byte-order mark is accepted).

    A missing file, a folder, an unreadable, binary, non-UTF-8 or empty file and invalid TOML
    are each a :class:`ConfigError` naming the file.

    Parameters
    ----------
    path : str or path-like
        The file.
    what : str, default "config file"
        What it is, for the messages.

    Returns
    -------
    dict
        Its top-level table.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from linattn_theory.sim.config import read_toml
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.toml"
    >>> _ = path.write_text("seed = 3\\n[federated]\\nrounds = 20\\n")
    >>> read_toml(path)
    {'seed': 3, 'federated': {'rounds': 20}}
    >>> read_toml(path.parent / "missing.toml")
    Traceback (most recent call last):
    ...
    linattn_theory.core.errors.ConfigError: config file '...missing.toml' does not exist
    """
    path = Path(path)
    if str(path) == "":
        raise ConfigError(f"{what} '': expected the path of a TOML file")
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a folder; expected a TOML file")
    if not path.is_file():
        kind = "does not exist" if not path.exists() else "is not a regular file"
        raise ConfigError(f"{what} {str(path)!r} {kind}")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{what} {str(path)!r} cannot be read ({err.strerror or err})") from None
    if b"\0" in raw:
        raise ConfigError(f"{what} {str(path)!r} is a binary file (it holds NUL bytes); expected TOML text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte 0x{raw[err.start]:02x} at "
                          f"position {err.start}); save it as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    if not data:
        raise ConfigError(f"{what} {str(path)!r} is empty (no settings); see simulations/configs/ "
                          f"for examples")
    return data


def load_config(path, overrides: dict | None = None) -> RunConfig:
    """Read and validate a TOML configuration file, with dotted-key ``overrides`` applied
    (:func:`parse_overrides`). A sweep file (``[grid]``) is refused, saying what reads it.

    Parameters
    ----------
    path : str or path-like
        A TOML file with the sections of :func:`config_from_dict` (``simulations/configs/*.toml``).
    overrides : dict, optional
        ``{"section.key": value}`` applied over the file before validation (``--set KEY=VALUE``,
        :func:`parse_overrides`).

    Returns
    -------
    RunConfig
        The validated configuration.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> import linattn_theory as lt
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.toml"
    >>> _ = path.write_text("seed = 3\\n[federated]\\nrounds = 20\\nwarmup_rounds = 5\\n")
    >>> config = lt.load_config(path, {"federated.local_steps": 2})
    >>> config.seed, config.federated.rounds, config.federated.local_steps
    (3, 20, 2)
    """
    data = read_toml(path)
    sweep_keys = [k for k in ("grid", "quick", "figure") if k in data]
    if sweep_keys:
        raise ConfigError(f"{sweep_keys[0]}: {path} is a sweep file (it has a [{sweep_keys[0]}] table): "
                          f"load_sweep({str(path)!r}).configs are its runs' configs, and "
                          f"analyze_sweep(DIR) (`linattn analyze DIR`) reads a finished sweep's folder "
                          f"with the sweep's own config")
    return config_from_dict(apply_overrides(data, overrides or {}))


def set_dotted(data: dict, key: str, value, where: str) -> None:
    """``data[a][b] = value`` for ``key = "a.b"``, creating tables as needed.

    Parameters
    ----------
    data : dict
        A nested configuration, changed in place.
    key : str
        A dotted key.
    value : object
        The value.
    where : str
        Where the setting comes from, for the messages.

    Returns
    -------
    None

    Examples
    --------
    >>> from linattn_theory.sim.config import set_dotted
    >>> data = {"federated": {"rounds": 20}}
    >>> set_dotted(data, "federated.local_steps", 2, "--set")
    >>> data
    {'federated': {'rounds': 20, 'local_steps': 2}}
    """
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{where}: {key!r} is not a dotted key such as 'federated.local_steps'")
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where} {key}: {part!r} is a value, not a table")
    node[leaf] = value


def parse_overrides(texts) -> dict:
    """``["federated.rounds=20", "task.family=digits"]`` → ``{"federated.rounds": 20, "task.family": "digits"}``.

    Each value is read as a TOML value (a number, ``true``/``false``, a quoted string, a list
    such as ``[0, 1]``), and otherwise taken as a bare string; a later setting of a key wins.

    Parameters
    ----------
    texts : iterable of str
        ``KEY=VALUE`` settings (``--set``).

    Returns
    -------
    dict
        ``{dotted key: value}``.

    Examples
    --------
    >>> from linattn_theory.sim.config import parse_overrides
    >>> parse_overrides(["federated.rounds=20", "seed=[0, 1]", "task.family=digits"])
    {'federated.rounds': 20, 'seed': [0, 1], 'task.family': 'digits'}
    """
    overrides = {}
    for text in texts or ():
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, such as "
                              f"federated.rounds=20")
        try:
            overrides[key] = tomllib.loads(f"value = {value.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            overrides[key] = value.strip()
    return overrides


def apply_overrides(data: dict, overrides: dict, where: str = "--set") -> dict:
    """A copy of the nested ``data`` with the dotted-key ``overrides`` set.

    Parameters
    ----------
    data : dict
        A nested configuration.
    overrides : dict
        ``{dotted key: value}``.
    where : str, default "--set"
        Where they come from, for the messages.

    Returns
    -------
    dict
        The new configuration (``data`` is unchanged).

    Examples
    --------
    >>> from linattn_theory.sim.config import apply_overrides
    >>> apply_overrides({"federated": {"rounds": 20}}, {"federated.rounds": 30, "model.rank": 2})
    {'federated': {'rounds': 30}, 'model': {'rank': 2}}
    """
    import copy

    data = copy.deepcopy(data)
    for key, value in overrides.items():
        set_dotted(data, key, value, where)
    return data


def to_toml(data: dict) -> str:
    """``data`` (a config or sweep as nested dictionaries) as TOML text; absent options (``None``) left out.

    Parameters
    ----------
    data : dict
        Nested tables of TOML values.

    Returns
    -------
    str
        The TOML text.

    Examples
    --------
    >>> from linattn_theory.sim.config import to_toml
    >>> print(to_toml({"seed": 1, "federated": {"rounds": 20, "batch_size": None}}))
    seed = 1
    <BLANKLINE>
    [federated]
    rounds = 20
    <BLANKLINE>
    """
    import tomli_w

    return tomli_w.dumps(_drop_none(data))


def config_hash(config: RunConfig) -> str:
    """A stable 16-hex-digit key of the full configuration (for result files).

    ``model.engine = "auto"`` is left out, so that adding the option kept every earlier key; so
    are the online rule's settings for every strategy but ``fedfrozen_adaptive`` (which alone reads
    them), so that redesigning the rule kept the other strategies' keys.

    Parameters
    ----------
    config : RunConfig
        The configuration.

    Returns
    -------
    str
        The key (a run's folder name in a sweep).

    Examples
    --------
    >>> import linattn_theory as lt
    >>> from linattn_theory.sim.config import config_hash
    >>> config = lt.config_from_dict({"seed": 1})
    >>> len(config_hash(config)), config_hash(config) == config_hash(config.with_updates({}))
    (16, True)
    >>> config_hash(config) == config_hash(config.with_updates({"seed": 2}))
    False
    """
    data = config.to_dict()
    fed = data["federated"]
    if data["model"]["engine"] == "auto":   # the default engine leaves earlier runs' keys unchanged
        del data["model"]["engine"]
    if fed["strategy"] != ONLINE_STRATEGY:
        for key in ("adaptive_confidence", "adaptive_gain_confidence", "adaptive_descent_confidence"):
            del fed[key]
        fed.update(_ADAPTIVE_KEY_DEFAULTS)
    else:
        if fed["adaptive_gain_confidence"] == 0.0:   # the rule before z_g kept its keys
            del fed["adaptive_gain_confidence"]
        if fed["adaptive_descent_confidence"] == math.inf:   # and the rules before z_d theirs
            del fed["adaptive_descent_confidence"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def field_docs(cls) -> dict[str, str]:
    """``{name: description}`` of a section, for docs and ``--help``.

    Parameters
    ----------
    cls : type
        ``TaskConfig``, ``ModelConfig`` or ``FederatedConfig``.

    Returns
    -------
    dict of str to str
        The descriptions, in field order.

    Examples
    --------
    >>> from linattn_theory.sim.config import ModelConfig, field_docs
    >>> docs = field_docs(ModelConfig)
    >>> list(docs)[:3], docs["rank"]
    (['heads', 'rank', 'init_scale'], 'head width r')
    """
    return {f.name: f.metadata.get("doc", "") for f in fields(cls)}


__all__ += ["section_settings", "field_docs", "parse_overrides", "apply_overrides", "set_dotted", "to_toml"]
