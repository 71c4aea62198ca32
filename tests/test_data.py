"""Resolving a config into train/val/test graphs."""

from __future__ import annotations

import pytest
import torch

from leangnn.circuits import catalog
from leangnn.config import TrainConfig
from leangnn.data import check_datasets, csbm_nodes, load_graphs, with_mask


def test_default_split_by_circuit():
    s = load_graphs(TrainConfig(), progress=False)
    names = [{g.name for g in part} for part in (s.train, s.val, s.test)]
    assert not names[0] & names[2] and not names[0] & names[1]
    assert s.task_type == "regression" and s.out_channels == 1


def test_validation_held_out_deterministically():
    cfg = TrainConfig(dataset="iscas85", test_dataset="epfl/ctrl", seed=3)
    a = load_graphs(cfg, progress=False)
    b = load_graphs(cfg, progress=False)
    assert [g.name for g in a.val] == [g.name for g in b.val]
    assert len(a.val) == 2 and len(a.train) == 9
    assert not {g.name for g in a.val} & {g.name for g in a.train}


def test_classification_task_and_masks():
    s = load_graphs(TrainConfig(dataset="c17,c432", test_dataset="epfl/ctrl",
                                task="critical"), progress=False)
    assert s.task_type == "classification" and s.out_channels == 4
    g = s.train[0]
    m = with_mask(g, torch.zeros(g.num_nodes, dtype=torch.bool))
    assert m.node_mask.sum() == 0 and g.get("node_mask") is None
    assert m.x is g.x  # shallow: no copy of the features


def test_synthetic_spec():
    s = load_graphs(TrainConfig(dataset="csbm:300"), progress=False)
    assert s.task_type == "classification"
    g = s.train[0]
    assert torch.equal(s.train[0].node_mask, g.train_mask)
    assert torch.equal(s.test[0].node_mask, g.test_mask)
    with pytest.raises(ValueError, match="expected csbm:NUM_NODES, got 'csbm:many'"):
        load_graphs(TrainConfig(dataset="csbm:many"), progress=False)


def test_check_datasets_resolves_without_loading(monkeypatch):
    import leangnn.data

    def no_load(*a, **k):
        raise AssertionError("loaded")

    monkeypatch.setattr(leangnn.data, "load_suite", no_load)
    got = check_datasets(TrainConfig(dataset="iscas85", test_dataset="epfl/ctrl"))
    assert [i.name for i in got["train"]] == [c.name for c in catalog()
                                              if c.suite == "iscas85"]
    assert got["val"] == [] and [i.name for i in got["test"]] == ["epfl/ctrl"]
    default = check_datasets(TrainConfig())
    assert all(default[k] for k in ("train", "val", "test"))
    assert check_datasets(TrainConfig(dataset="csbm:300")) is None
    with pytest.raises(ValueError, match=r"test_dataset: circuits \['iscas85/c17'\] "
                       "are also in the training set"):
        check_datasets(TrainConfig(dataset="iscas85", test_dataset="c17"))
    with pytest.raises(ValueError, match="val_dataset: unknown circuit or suite"):
        check_datasets(TrainConfig(dataset="c17", val_dataset="nope"))


@pytest.mark.parametrize("spec, n", [("csbm:100", 100), ("csbm:1e5", 100_000),
                                     ("csbm: 2500 ", 2500),
                                     ("csbm:1000000000", 10**9)])
def test_csbm_nodes(spec, n):
    assert csbm_nodes(spec) == n


@pytest.mark.parametrize("spec", ["csbm:99", "csbm:1000000001", "csbm:inf",
                                  "csbm:nan", "csbm:-5", "csbm:2.5", "csbm:",
                                  "csbm", "sbm:100", "csbm:1e12"])
def test_csbm_nodes_rejects(spec):
    with pytest.raises(ValueError, match=f"expected csbm:NUM_NODES, got {spec!r}"):
        csbm_nodes(spec)


def test_synthetic_graph_too_large_is_refused_before_generating(monkeypatch):
    import leangnn.graphs.synthetic
    import leangnn.plan.fits

    def no_generation(*a, **k):
        raise AssertionError("generated")

    monkeypatch.setattr(leangnn.plan.fits, "_host_available", lambda: 1 << 20)
    monkeypatch.setattr(leangnn.graphs.synthetic, "contextual_sbm", no_generation)
    with pytest.raises(ValueError, match=r"dataset: csbm:1000 needs ~2.0 MiB of host "
                       r"memory to generate \(estimate\), only 1.0 MiB available"):
        load_graphs(TrainConfig(dataset="csbm:1000"), progress=False)
