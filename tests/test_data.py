"""Resolving a config into train/val/test graphs."""

from __future__ import annotations

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.data import load_graphs, with_mask


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
