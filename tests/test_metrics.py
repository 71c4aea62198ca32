"""Metrics against scipy/numpy float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as st
import torch

from leangnn.metrics import (
    accuracy,
    classification_metrics,
    compute_metrics,
    kendall,
    mae,
    pearson,
    r2,
    spearman,
)


def test_against_references():
    rng = np.random.default_rng(0)
    t = rng.normal(size=500)
    p = t + rng.normal(scale=0.5, size=500)
    p[::7] = p[0]  # ties for the rank statistics
    pt, tt = torch.tensor(p, dtype=torch.float32), torch.tensor(t)
    assert pearson(pt, tt) == pytest.approx(st.pearsonr(p.astype(np.float32), t)[0],
                                            rel=1e-6)
    assert spearman(pt, tt) == pytest.approx(
        st.spearmanr(p.astype(np.float32), t)[0], rel=1e-9)
    assert kendall(pt, tt) == pytest.approx(
        st.kendalltau(p.astype(np.float32), t)[0], rel=1e-9)
    assert mae(p, t) == pytest.approx(np.abs(p - t).mean())
    ss = ((t - p) ** 2).sum() / ((t - t.mean()) ** 2).sum()
    assert r2(p, t) == pytest.approx(1 - ss)


def test_degenerate_inputs_give_zero_not_nan():
    c = torch.ones(10)
    assert pearson(c, torch.arange(10.0)) == 0.0
    assert spearman(c, torch.arange(10.0)) == 0.0
    assert r2(torch.arange(3.0), torch.ones(3)) == 0.0


def test_classification():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    y = torch.tensor([0, 1, 1])
    assert accuracy(logits, y) == pytest.approx(2 / 3)
    m = classification_metrics(logits, y)
    assert m["accuracy"] == pytest.approx(2 / 3) and "pearson" in m
    with pytest.raises(ValueError, match="task_type"):
        compute_metrics(logits, y, "ranking")


def test_no_nodes_give_none():
    empty = torch.empty(0)
    for fn in (pearson, spearman, kendall, mae, r2, accuracy):
        assert fn(empty, empty) is None
    reg = compute_metrics(empty, empty, "regression")
    assert set(reg) == {"pearson", "spearman", "kendall", "mae", "r2"}
    assert all(v is None for v in reg.values())
    cls = compute_metrics(torch.empty(0, 3), torch.empty(0, dtype=torch.long),
                          "classification")
    assert set(cls) == set(reg) | {"accuracy"} and all(v is None for v in cls.values())
    # one node is degenerate but not empty: numbers, as before
    assert pearson(torch.ones(1), torch.ones(1)) == 0.0 and mae([1.0], [3.0]) == 2.0
