"""Real data as client families (docs/theory.md §9): label and size skew, the test split, ``digits``."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from linattn_theory import Params, config_from_dict, predict, simulate
from linattn_theory.core.errors import ConfigError
from linattn_theory.data.digits import (DIGITS_CLASS_COUNTS, digit_contexts, digits_clients, evaluate, evaluate_history,
                                        max_clients, split_clients)


def pool(N=600, classes=6, n=3, d=2, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=N)
    X = rng.normal(size=(N, n, d)) + labels[:, None, None]
    return X, X[:, -1, :].copy(), np.eye(classes)[labels], labels


def total_variation_to_global(counts):
    """Per client, ½ Σ_k |share of class k at the client − its share overall|."""
    counts = np.asarray(counts, float)
    own = counts / counts.sum(axis=1, keepdims=True)
    overall = counts.sum(axis=0) / counts.sum()
    return 0.5 * np.abs(own - overall).sum(axis=1)


def test_split_is_a_partition_with_a_stratified_test_split():
    X, q, y, labels = pool()
    data = split_clients(X, q, y, labels, num_clients=5, label_alpha=0.5, dirichlet_alpha=1.0,
                         test_fraction=0.2, seed=1)
    train = np.concatenate([c.X for c in data])
    assert len(train) + len(data.truth["test_X"]) == len(X)
    # every sample exactly once: match rows of X
    rows = {tuple(r.ravel()) for r in np.concatenate([train, data.truth["test_X"]])}
    assert len(rows) == len(X)
    for k in range(6):
        assert np.sum(data.truth["test_labels"] == k) == round(0.2 * np.sum(labels == k))
    assert min(data.sizes) >= 2
    np.testing.assert_allclose(data.weights, data.sizes / data.sizes.sum())
    np.testing.assert_array_equal(data.truth["label_counts"].sum(axis=1), data.sizes)


def test_label_and_size_skew_do_what_they_say():
    X, q, y, labels = pool(N=3000)
    even = split_clients(X, q, y, labels, num_clients=6, seed=2)
    skewed = split_clients(X, q, y, labels, num_clients=6, label_alpha=0.1, seed=2)
    sized = split_clients(X, q, y, labels, num_clients=6, dirichlet_alpha=0.3, seed=2)
    # no label skew: every client's label shares are the overall ones up to rounding of the deal
    assert total_variation_to_global(even.truth["label_counts"]).max() < 0.05
    assert total_variation_to_global(skewed.truth["label_counts"]).mean() > 0.4
    assert even.sizes.max() / even.sizes.min() < 1.1
    assert sized.sizes.max() / sized.sizes.min() > 3
    assert total_variation_to_global(sized.truth["label_counts"]).max() < 0.2


def test_split_is_reproducible_and_fresh_samples_use_the_test_split():
    X, q, y, labels = pool()
    a = split_clients(X, q, y, labels, num_clients=4, label_alpha=1.0, seed=3)
    b = split_clients(X, q, y, labels, num_clients=4, label_alpha=1.0, seed=3)
    c = split_clients(X, q, y, labels, num_clients=4, label_alpha=1.0, seed=4)
    assert all(np.array_equal(u.X, v.X) for u, v in zip(a, b))
    assert not all(np.array_equal(u.X, v.X) for u, v in zip(a, c))
    fresh = split_clients(X, q, y, labels, num_clients=4, label_alpha=1.0, seed=3, fresh_samples=True)
    for key, value in a.truth.items():
        np.testing.assert_array_equal(fresh.truth[key], value)
    test_rows = {tuple(r.ravel()) for r in a.truth["test_X"]}
    assert all(tuple(r.ravel()) in test_rows for c in fresh for r in c.X)


@pytest.mark.parametrize("kwargs, match", [
    ({"label_alpha": 0.0}, "label_alpha"), ({"test_fraction": 1.0}, "test_fraction"),
    ({"num_clients": 400}, "fewer clients"),
])
def test_split_rejects_bad_settings(kwargs, match):
    X, q, y, labels = pool()
    with pytest.raises(ValueError, match=match):
        split_clients(X, q, y, labels, **kwargs)


def test_evaluate_counts_argmax_hits():
    params = Params.init(2, 2, 3, seed=0)
    X, q, _, _ = pool(N=50, classes=3)
    yhat = predict(params, X, q)
    y = np.eye(3)[np.argmax(yhat, axis=1)]
    y[:10] = np.roll(y[:10], 1, axis=1)                  # 10 of 50 wrong
    result = evaluate(params, X, q, y)
    assert result["accuracy"] == pytest.approx(0.8)
    assert result["loss"] == pytest.approx(np.mean(0.5 * np.sum((yhat - y) ** 2, axis=1)))


def test_digits_missing_scikit_learn_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"linattn-theory\[digits\]"):
        digits_clients()


def test_digit_contexts_are_rows_plus_position():
    images = np.arange(2 * 64).reshape(2, 8, 8) % 17
    X = digit_contexts(images)
    assert X.shape == (2, 8, 16)
    np.testing.assert_array_equal(X[..., :8], images / 16.0)
    np.testing.assert_array_equal(X[1, :, 8:], np.eye(8))


@pytest.mark.slow
def test_digits_family_trains_and_reports_test_accuracy():
    pytest.importorskip("sklearn")
    data = digits_clients(num_clients=4, label_alpha=0.5, seed=0)
    assert data.dims == (8, 16, 10) and data.family == "digits"
    assert sum(data.sizes) + len(data.truth["test_X"]) == 1797
    with pytest.raises(ConfigError, match="does not apply to family 'digits'"):
        config_from_dict({"task": {"family": "digits", "zeta_value": 1.0}})
    config = config_from_dict({"task": {"family": "digits", "num_clients": 4, "label_alpha": 0.5},
                               "model": {"heads": 2, "rank": 4},
                               "federated": {"strategy": "fedavg", "rounds": 25, "local_steps": 5,
                                             "learning_rate": 0.5}})
    run = simulate(config)
    assert not run.diverged
    table = run.table
    assert table["test_accuracy"].iloc[0] <= 0.2                          # chance level at θ^0
    assert table["test_accuracy"].iloc[-1] > 0.5                          # learned: far above chance
    again = evaluate(run.params, data.truth["test_X"], data.truth["test_q"], data.truth["test_y"])
    assert run.metadata["test"] == again
    assert table["test_loss"].iloc[-1] == pytest.approx(again["loss"], rel=1e-12)


def test_own_data_howto_runs():
    """docs/howto/own-data.md: its Python blocks run in order and its TOML block is a valid configuration."""
    import re
    import tomllib
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "own-data.md").read_text()
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(block, "own-data.md", "exec"), namespace)
    assert "test_accuracy" in namespace["run"].table and namespace["V_FA"].shape == (3, 3)
    (toml_block,) = re.findall(r"```toml\n(.*?)```", text, re.S)
    config = config_from_dict(tomllib.loads(toml_block))
    assert config.task.family == "digits" and config.model.attention == "softmax"


def test_digits_figure_is_skipped_without_scikit_learn(monkeypatch, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    from linattn_theory.report.figures import _load

    script = Path(__file__).resolve().parents[1] / "simulations" / "digits.py"
    module = _load("digits", script)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))
    assert module.make(tmp_path / "out", quick=True) == []
    assert "linattn-theory[digits]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_digits_figure_numbers_match_committed_data():
    """figures/README.md's statements about digits.png, recomputed from figures/digits.csv (medians
    over the instances of each attention and label skew)."""
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).resolve().parents[1]
    table = pd.read_csv(root / "figures" / "digits.csv")
    readme = (root / "figures" / "README.md").read_text()
    accuracy = table[table["quantity"] == "test_accuracy"].pivot_table(
        index="T0", columns=["attention", "label_alpha"], values="median")
    assert accuracy.index.max() == 120 and (table["count"] >= 9).all()          # ten seeds, T = 120
    gap = (accuracy.loc[120] - accuracy.loc[accuracy.index >= 60]).max().max()
    assert f"costs at most {100 * gap:.1f} accuracy points" in readme
    loss = table[table["quantity"] == "relative_loss_change_vs_fedavg_percent"]
    assert (loss.loc[loss["T0"] == 120, ["median", "q25", "q75"]].to_numpy() == 0).all()    # paired: FedAvg is 0
    below = loss[loss["median"] < 0]
    best = below.loc[below["median"].idxmin()]
    assert (f"ends below FedAvg's in {len(below)} of {int((loss['T0'] < 120).sum())}" in readme
            and f"at most by {-best['median']:.2f} %" in readme)
    marked = table.groupby(["attention", "label_alpha"])["best_T0"].first()
    assert f"is `T = 120` (plain FedAvg) in {int((marked == 120).sum())} of {len(marked)} settings" in readme


@pytest.mark.parametrize("test_fraction", [0.25, 0.5])
def test_the_most_digits_clients_a_config_allows_is_what_the_split_can_deal(test_fraction):
    datasets = pytest.importorskip("sklearn.datasets")
    assert tuple(np.bincount(datasets.load_digits().target)) == DIGITS_CLASS_COUNTS
    most = max_clients(test_fraction)
    assert most == (673 if test_fraction == 0.25 else 449)
    task = {"family": "digits", "test_fraction": test_fraction}
    config_from_dict({"task": {**task, "num_clients": most}})
    clients = digits_clients(most, test_fraction=test_fraction)
    assert len(clients.clients) == most and min(len(c.y) for c in clients.clients) >= 2
    with pytest.raises(ConfigError, match=rf"task.num_clients = {most + 1}: expected a value <= {most}"):
        config_from_dict({"task": {**task, "num_clients": most + 1}})
    with pytest.raises(ValueError, match="samples cannot give"):
        digits_clients(most + 1, test_fraction=test_fraction)


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_a_runs_test_scores_in_chunks_are_its_rounds_scored_one_by_one(attention):
    """``evaluate_history`` (every round's test loss and accuracy, rounds stacked in chunks, the test
    contexts' ``Ŝ`` once per chunk) equals each round's scores from ``predict`` (one round at a time,
    ``Ŝ`` recomputed), also across a chunk boundary and for a non-finite round (NaN loss)."""
    rng = np.random.default_rng(4)
    N, n, d, p = 40, 6, 5, 3
    X, q = rng.normal(size=(N, n, d)), rng.normal(size=(N, d))
    y = np.eye(p)[rng.integers(0, p, size=N)]
    history = [Params.init(d=d, r=2, p=p, heads=2, seed=s) for s in range(5)]
    history[3] = history[3].replace(WV=np.full_like(history[3].WV, np.inf))
    with np.errstate(all="ignore"):
        scores = evaluate_history(history, X, q, y, attention, 0.8, chunk=2)
        assert len(scores) == len(history)
        for theta, score in zip(history, scores):
            if not np.all(np.isfinite(theta.WV)):       # predict refuses it; its loss is NaN
                assert np.isnan(score["loss"])
                continue
            yhat = predict(theta, X, q, attention, 0.8)
            loss = np.mean(0.5 * np.sum((yhat - y) ** 2, axis=-1))
            assert score["loss"] == pytest.approx(loss, rel=1e-12)
            assert score["accuracy"] == np.mean(np.argmax(yhat, axis=-1) == np.argmax(y, axis=-1))
    assert len({s["accuracy"] for s in scores}) > 1


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_a_history_s_shared_kernels_are_featurised_once_with_each_round_s_own_numbers(attention):
    """``evaluate_history`` computes the test features once per distinct kernel ``(W_Q, W_K)`` (a frozen
    stage's rounds share theirs; runs scored together share their warm-up's): every parameter set's scores
    are bit for bit those of scoring it alone, whatever the chunks, and a set that shares its kernel but
    not its ``W_V`` gets its own (features computed for every set, counted: once per kernel)."""
    from linattn_theory.data import digits as digits_module

    rng = np.random.default_rng(5)
    N, n, d, p = 30, 6, 5, 3
    X, q = rng.normal(size=(N, n, d)), rng.normal(size=(N, d))
    y = np.eye(p)[rng.integers(0, p, size=N)]
    warm = [Params.init(d=d, r=2, p=p, heads=2, seed=s) for s in range(4)]
    frozen = [warm[2].replace(WV=warm[2].WV * (1 + 0.1 * k)) for k in range(1, 6)]    # K of round 2, own W_V
    history = warm + frozen + warm[:3] + [warm[1].replace(WQ=warm[1].WQ.copy())]      # equal bytes, new arrays
    alone = [evaluate_history([theta], X, q, y, attention, 0.8)[0] for theta in history]
    calls = []
    features = digits_module.attention_features

    def counted(K, *args, **kwargs):
        calls.append(K.shape[0])
        return features(K, *args, **kwargs)

    for chunk in (1, 2, 3, 64):
        calls.clear()
        digits_module.attention_features = counted
        try:
            scores = evaluate_history(history, X, q, y, attention, 0.8, chunk=chunk)
        finally:
            digits_module.attention_features = features
        assert scores == alone                       # bit for bit, every round its own
        assert sum(calls) == len(warm)               # the 4 distinct kernels, once each
    assert len({s["loss"] for s in alone[4:9]}) == 5   # the frozen rounds' own W_V
