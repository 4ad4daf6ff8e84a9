"""Fuzzing `linattn simulate` with generated config files (docs/cli.md, "Exit status and checks").

Hypothesis writes configs that are valid or not (known and unknown keys, wrong types, extreme
numbers, non-finite floats, nested tables, lists) in several encodings. Each must either run
(exit 0, or 3 when it diverges) or exit 2 with one line that starts with the offending field
(or the file, for encoding and syntax errors, or the estimate that was refused) and leave no
output folder; it must never raise or print a traceback.
"""

import json
import math
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from linattn_theory.cli.commands import main
from linattn_theory.core.errors import ConfigError
from linattn_theory.sim.config import SECTIONS
from linattn_theory.sim.strategies import STRATEGIES

KNOWN = {name: [f.name for f in fields(cls)] for name, cls in SECTIONS.items()}
STRATEGY_NAMES = sorted(STRATEGIES)
CHOICES = ["planted_kernel", "in_context_regression", "fedavg", "fedfrozen", "scaffold", "fedadam",
           "float32", "float64", "numpy", "last", "fresh"]

names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8)
numbers = st.one_of(
    st.integers(-3, 60),
    st.integers(-2**63, 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 0.0, 0.5, 1.0, 1e308, -1e308, 5e-324, 10**12, 2**63 - 1]),
)
scalars = st.one_of(numbers, st.booleans(), st.sampled_from(CHOICES), names)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(names, scalars, max_size=2))


def section(name):
    keys = st.one_of(st.sampled_from(KNOWN[name]), names)
    return st.one_of(st.dictionaries(keys, values, max_size=5), scalars)


#: small valid values (a run takes well under a second), mutated below
small = st.floats(0.0, 2.0)
SMALL = {
    "task": {"family": st.sampled_from(["planted_kernel", "in_context_regression"]),
             "num_clients": st.integers(1, 4), "samples_per_client": st.integers(2, 24),
             "tokens": st.integers(1, 5), "dim": st.integers(1, 4), "noise": small,
             "zeta_covariate": small, "dirichlet_alpha": st.floats(1e-6, 5.0)},
    "model": {"heads": st.integers(1, 2), "rank": st.integers(1, 3), "init_scale": small,
              "dtype": st.sampled_from(["float64", "float32"])},
    "federated": {"strategy": st.sampled_from(STRATEGY_NAMES), "rounds": st.integers(1, 6),
                  "warmup_rounds": st.integers(0, 6), "local_steps": st.integers(1, 3),
                  "learning_rate": st.floats(1e-3, 0.5), "batch_size": st.integers(1, 8),
                  "participation": st.floats(0.1, 1.0), "ridge": small},
}


@st.composite
def mutated(draw):
    """A small valid-looking config with up to two keys replaced or added at random."""
    config = {name: draw(st.fixed_dictionaries({}, optional=keys)) for name, keys in SMALL.items()}
    config["seed"] = draw(st.integers(0, 3))
    for _ in range(draw(st.integers(0, 2))):
        where = draw(st.sampled_from([None, "task", "model", "federated"]))
        key = draw(st.one_of(st.sampled_from(KNOWN.get(where, ["seed"])), names))
        (config if where is None else config[where])[key] = draw(values)
    return config


configs = st.one_of(
    mutated(), mutated(),
    st.fixed_dictionaries({}, optional={"seed": values, "task": section("task"), "model": section("model"),
                                        "federated": section("federated"), "grid": values, "extra": values}))


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value)          # 1e+308, 5e-324, inf, -inf are TOML floats
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(config: dict) -> str:
    lines = [f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in config.items()
             if not isinstance(v, dict)]
    for name, table in config.items():
        if isinstance(table, dict):
            lines.append(f"[{json.dumps(name, ensure_ascii=False)}]")
            lines += [f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def encode(text: str, encoding: str) -> bytes:
    if encoding == "garbage":
        return bytes([0xff, 0xfe, 0x80]) + text.encode()
    return text.encode(encoding, errors="replace")


def as_read(name: str, encoding: str) -> str:
    """``name`` as the program reads it from a file written in ``encoding``.

    ``encode`` replaces what the encoding cannot hold by ``?`` (a non-Latin key in a Latin-1
    file); the program sees the decoded text, so its errors name ``?``, not the original key.
    """
    if encoding == "garbage":
        return name
    return name.encode(encoding, errors="replace").decode(encoding)


def field_names(config: dict, encoding: str = "utf-8") -> set[str]:
    """Every name an error about ``config`` (written in ``encoding``) may start with: top-level
    keys and ``section.key``, as the program decodes them."""
    found = {as_read(str(name), encoding) for name in config}
    for name, table in config.items():
        if isinstance(table, dict):
            found |= {as_read(f"{name}.{key}", encoding) for key in table}
    return found


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(config=configs, encoding=st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16",
                                                 "latin-1", "garbage"]))
@example(config={"task": {"ключ": 1}}, encoding="latin-1")   # read as "task.????": the error names that
def test_generated_configs_run_or_exit_2_naming_the_field(tmp_path_factory, capsys, config, encoding):
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "config.toml"
    path.write_bytes(encode(toml_text(config), encoding))
    out = folder / "out"
    code = main(["simulate", str(path), "--out", str(out), "--quiet", "--max-hours", "0.0005",
                 "--max-memory-gb", "0.5"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code in (0, 2, 3), err
    if code != 2:
        assert (out / "metadata.json").is_file()
        return
    assert not out.exists(), "a refused config wrote results"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("linattn simulate: invalid configuration: "), err
    detail = lines[0].removeprefix("linattn simulate: invalid configuration: ")
    starts = [f"config file {str(path)!r}", f"{path}: not valid TOML", "estimated "]
    starts += [f"{name}{sep}" for name in field_names(config, encoding) for sep in (" =", ":", " ")]
    assert any(detail.startswith(s) for s in starts), f"{detail!r} names no field of {config!r}"


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1", "garbage"])
def test_odd_encodings_are_refused_naming_the_file(tmp_path, capsys, encoding):
    path = tmp_path / "config.toml"
    path.write_bytes(encode('[task]\nfamily = "planted_kernel"  # é\n', encoding))
    assert main(["simulate", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"config file {str(path)!r} is" in err and not (tmp_path / "out").exists()


#: the annotations a section's setting may have: a scalar, or a scalar or ``None`` (RunConfig.to_dict
#: reads the settings without copying them, which is what ``dataclasses.asdict`` gives only for these)
SCALAR_ANNOTATIONS = {"int", "float", "str", "bool", "int | None", "float | None", "str | None"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(family=st.sampled_from(["planted_kernel", "in_context_regression", "digits"]),
       attention=st.sampled_from(["linear", "softmax"]), strategy=st.sampled_from(STRATEGY_NAMES),
       scaled=st.booleans(), seed=st.integers(0, 2**31), rounds=st.integers(1, 50))
def test_to_dict_is_the_dataclass_record_with_the_documented_keys_left_out(family, attention, strategy, scaled,
                                                                           seed, rounds):
    """``RunConfig.to_dict`` against its definition written with ``dataclasses.asdict``: the chosen
    family's task keys, the softmax keys only with softmax attention, η or the step scale (with its
    curvature), in the same key order; and every setting is a scalar, so that the record shares nothing
    with the config (a setting left out, an order changed or a list-valued setting fails this)."""
    from dataclasses import asdict

    from linattn_theory.data.families import FAMILY_KEYS
    from linattn_theory.sim.config import SOFTMAX_KEYS, STEP_KEYS, STEP_SCALE_KEYS, config_from_dict

    for cls in SECTIONS.values():
        for f in fields(cls):
            assert f.type in SCALAR_ANNOTATIONS, (cls.__name__, f.name, f.type)
    federated = {"strategy": strategy, "rounds": rounds, "warmup_rounds": min(rounds, 3)}
    federated.update({"step_scale": 0.3, "step_curvature": "model"} if scaled else {"learning_rate": 0.02})
    model = {"attention": attention, "temperature": 0.5} if attention == "softmax" else {}
    try:
        config = config_from_dict({"seed": seed, "task": {"family": family}, "federated": federated, "model": model})
    except ConfigError:              # a strategy that refuses these settings (FedAdam's server step)
        assume(False)
    expected = asdict(config)
    keep = FAMILY_KEYS[family] | {"family"}
    expected["task"] = {k: v for k, v in expected["task"].items() if k in keep}
    if attention == "linear":
        expected["model"] = {k: v for k, v in expected["model"].items() if k not in SOFTMAX_KEYS}
    expected["federated"] = {k: v for k, v in expected["federated"].items()
                             if (k not in STEP_KEYS or v is not None) and (k not in STEP_SCALE_KEYS or scaled)}
    record = config.to_dict()
    assert json.dumps(record) == json.dumps(expected)          # the same keys in the same order
    assert config_from_dict(record) == config
