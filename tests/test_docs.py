"""Docs cannot drift from the code: every public function has a docstring, the names and files the
pages mention exist, the index covers every section of the theory, and the files a run writes are
the ones docs/cli.md describes. (The site itself is built by tests/test_docs_site.py.)"""

import dataclasses
import functools
import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import linattn_theory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
from linattn_docs import locate  # noqa: E402

PAGES = [ROOT / "README.md", ROOT / "figures" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [page for page in PAGES if "_build" not in page.parts]


def public_objects():
    for info in pkgutil.walk_packages(linattn_theory.__path__, "linattn_theory."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{info.name}.{name}", obj


def test_every_public_function_has_a_docstring():
    missing = [name for name, obj in public_objects()
               if len((inspect.getdoc(obj) or "").strip()) < 20]
    assert not missing, f"public names without a docstring stating their contract: {missing}"


def _snippet_files() -> set[str]:
    """Files the how-tos create (``<!-- snippet: new PATH -->``): they do not exist before."""
    found = set()
    for page in (ROOT / "docs" / "howto").glob("*.md"):
        found |= set(re.findall(r"<!--\s*snippet:\s*new\s+(\S+)\s*-->", page.read_text()))
    return found


def _config_keys() -> set[str]:
    config = linattn_theory.config_from_dict({})
    return {f"{section}.{field.name}" for section in ("task", "model", "federated")
            for field in dataclasses.fields(getattr(config, section))}


def _exists(full: str) -> bool:
    """An importable module or attribute, or a field of a dataclass (``FederatedDataset.weights``)."""
    if locate(full) is not None:
        return True
    parent, _, last = full.rpartition(".")
    owner = locate(parent) if parent else None
    return inspect.isclass(owner) and last in getattr(owner, "__annotations__", {})


def resolves(name: str) -> bool:
    """A dotted name of the package: absolute (``linattn_theory.…``, ``lt.…``), relative to the
    package (``sim.engine.simulate``), or starting with a name some module of the package has
    (``Params.init``, ``RunConfig.with_updates``)."""
    name = re.sub(r"^lt\.", "linattn_theory.", name)
    if _exists(name) or _exists(f"linattn_theory.{name}"):
        return True
    head = name.split(".")[0]
    return any(head in vars(module) and _exists(f"{module.__name__}.{name}") for module in _modules())


@functools.cache
def _modules() -> tuple:
    return tuple(importlib.import_module(info.name)
                 for info in pkgutil.walk_packages(linattn_theory.__path__, "linattn_theory.")
                 if not info.name.endswith("__main__"))


def test_names_and_files_the_pages_mention_exist():
    """Every dotted name in backticks (a module, function, class or method of the package, or a
    config key) and every file path resolves in this checkout, so that the pages follow renames."""
    keys, new_files = _config_keys(), _snippet_files()
    new_modules = {path.removesuffix(".py").replace("/", ".") for path in new_files}
    stale = []
    for page in PAGES:
        text = page.read_text()
        for name in set(re.findall(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`", text)):
            if re.search(r"\.(py|toml|csv|md|png|pdf|npz|json|ipynb|txt)$", name) or name.split(".")[0] in ("np", "pd"):
                continue
            if name.split(".")[0] in ("task", "model", "federated"):
                ok = name in keys
            else:
                ok = resolves(name) or any(f"linattn_theory.{name}".startswith(m) for m in new_modules)
            if not ok:
                stale.append(f"{page.relative_to(ROOT)}: `{name}`")
        for path in set(re.findall(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|toml|md|ipynb))`", text)):
            if "/" not in path and not path.startswith("test_"):
                continue      # a bare file name, e.g. tradeoff.csv next to the figure it belongs to
            candidates = [ROOT / path, ROOT / "linattn_theory" / path, page.parent / path]
            if not any(c.exists() for c in candidates) and path not in new_files:
                stale.append(f"{page.relative_to(ROOT)}: `{path}`")
    assert not stale, "names or files the docs mention that the code does not have:\n" + "\n".join(sorted(stale))


def test_index_links_every_section_of_the_theory():
    theory = (ROOT / "docs" / "theory.md").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    sections = re.findall(r"^## (§\d+ .+)$", theory, flags=re.M)
    assert len(sections) >= 9
    missing = [s for s in sections if s not in index]
    assert not missing, f"docs/index.md does not list {missing}"


def _documented(table_heading: str) -> list[str]:
    """The code names in the first column of the table after ``table_heading`` in docs/cli.md."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index(table_heading):].split("\n\n")[1]
    names = []
    for row in table.splitlines()[2:]:
        names += re.findall(r"`([\w…]+)`", row.split("|")[1])
    return names


def test_the_files_a_run_writes_are_documented(tmp_path):
    """docs/cli.md, "What a run writes": every column of rounds.csv, array of params.npz and key of
    metadata.json of a run is in its tables, and every documented one exists in some run."""
    from linattn_theory.core.io import write_run

    config = linattn_theory.config_from_dict({"federated": {"rounds": 3, "warmup_rounds": 1}})
    write_run(linattn_theory.simulate(config), tmp_path)
    columns = pd.read_csv(tmp_path / "rounds.csv").columns
    documented = _documented("**`rounds.csv`**")
    per_client = [c for c in columns if re.fullmatch(r"client_loss_\d+", c)]
    assert per_client and "client_loss_0" in documented
    assert set(columns) - set(per_client) <= set(documented), set(columns) - set(per_client) - set(documented)
    optional = {"test_loss", "test_accuracy"}           # clients with a held-out split only
    assert set(documented) - {"client_loss_0", "client_loss_1", "…"} - optional <= set(columns)
    text = (ROOT / "docs" / "cli.md").read_text()
    arrays = set(np.load(tmp_path / "params.npz"))
    assert arrays == set(re.findall(r"`((?:final|warmup)_W[QKV])`", text[text.index("**`params.npz`**"):]))
    keys = set(json.loads((tmp_path / "metadata.json").read_text()))
    documented = set(_documented("**`metadata.json`**"))
    assert keys <= documented, f"metadata.json keys not in docs/cli.md: {keys - documented}"
    adaptive = linattn_theory.simulate(config.with_updates({"federated.strategy": "fedfrozen_adaptive"}))
    online = set(adaptive.metadata) - keys
    assert online and online <= documented, online - documented
    optional = {"run_id", "test"}          # a run of a sweep; clients with a held-out split
    scaled = linattn_theory.simulate(config.with_updates({"federated.step_scale": 0.01}))
    step = set(scaled.metadata) - keys            # a step set by curvature (federated.step_scale)
    assert step == {"step_scale"} and step <= documented, step
    assert documented - optional - online - step <= keys, documented - optional - online - step - keys


def test_the_architecture_diagram_is_the_layers_contract():
    """docs/concepts.md's diagram (drawn when the site is built, docs/_ext) shows the layers of the
    import-linter contract in pyproject.toml, top to bottom, and the site can draw it."""
    import tomllib

    from linattn_docs import parse_flowchart

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    diagrams = re.findall(r"```mermaid\n(.*?)```", (ROOT / "docs" / "concepts.md").read_text(), flags=re.S)
    direction, boxes = parse_flowchart(diagrams[0])
    assert direction == "TB"
    assert [name for name, _ in boxes] == [layer.removeprefix("linattn_theory.") for layer in layers]
    assert all(re.match(rf"<b>{name}</b> — ", label) for name, label in boxes)
    for diagram in diagrams[1:]:
        assert len(parse_flowchart(diagram)[1]) >= 2


def test_a_diagram_other_than_a_chain_of_boxes_is_refused():
    from sphinx.errors import ExtensionError

    from linattn_docs import parse_flowchart

    assert parse_flowchart('flowchart LR\n    a["x"] --> b\n    b --> c["z"]')[1] == [("a", "x"), ("b", "b"), ("c", "z")]
    for source in ['flowchart TB\n    a --> b\n    a --> c', 'sequenceDiagram\n    a->>b: hi',
                   'flowchart TB\n    a -.-> b']:
        with pytest.raises(ExtensionError, match="mermaid"):
            parse_flowchart(source)


def test_the_site_builds_from_the_docs_folder_or_says_what_to_run(tmp_path):
    """``sphinx-build docs OUT`` builds the site of the repository root (docs/conf.py's source
    folder); another source folder is refused with the command to run."""
    import types

    from sphinx.errors import ExtensionError

    from linattn_docs import use_repository_root

    for srcdir in (ROOT / "docs", ROOT):
        app = types.SimpleNamespace(srcdir=srcdir)
        use_repository_root(app, None)
        assert Path(app.srcdir) == ROOT
    with pytest.raises(ExtensionError, match=r"run `python -m sphinx docs docs/_build/html`"):
        use_repository_root(types.SimpleNamespace(srcdir=tmp_path), None)


def test_gallery_titles_render_their_symbols_and_follow_the_figures_order():
    from linattn_docs import figure_order, rendered_title, thumbnail_title

    assert rendered_title("bias of K_{T0} and drift Γ(T0) on Φ_λ, ζ_V; T0_best in tradeoff_attention") == (
        r"bias of :math:`K_{T_0}` and drift Γ(T0) on :math:`\Phi_{\lambda}`, :math:`\zeta_V`; "
        r":math:`T_{0,\mathrm{best}}` in tradeoff_attention")
    assert thumbnail_title(r"a :math:`K_{T_0}` & b") == (r"a K_{T_0} & b", r"a \(K_{T_0}\) &amp; b")
    order = figure_order((ROOT / "figures" / "README.md").read_text())
    table = [name for name in re.findall(r"^\| [\w–]+ \| `(\w+)\.png`", (ROOT / "figures" / "README.md").read_text(),
                                         flags=re.M) if (ROOT / "simulations" / f"{name}.py").is_file()]
    readme = (ROOT / "figures" / "README.md").read_text()
    headline = re.search(r"^\| [\w–]+ \| `(\w+)\.png` \(\*\*headline\*\*\)", readme, flags=re.M).group(1)
    assert order[0] == headline == "phase_diagram"
    assert len(table) >= 10
    assert order == [headline, *[n for n in table if n != headline]]


def test_a_configuration_section_lists_every_field_as_a_parameter():
    """The API page of TaskConfig / ModelConfig / FederatedConfig (docs/_ext) lists every key with
    its description from field_docs, the one source of docs/cli.md and ``--help`` too."""
    import dataclasses

    from numpydoc.docscrape import NumpyDocString

    from linattn_docs import config_section_parameters
    from linattn_theory.sim.config import SECTIONS, field_docs

    for cls in SECTIONS.values():
        lines = (cls.__doc__ or "").splitlines()
        config_section_parameters(None, "class", cls.__name__, cls, None, lines)
        parameters = {p.name: " ".join(p.desc) for p in NumpyDocString("\n".join(lines))["Parameters"]}
        assert list(parameters) == [f.name for f in dataclasses.fields(cls)]
        for name, text in field_docs(cls).items():
            assert parameters[name].replace("\\", "") == text
