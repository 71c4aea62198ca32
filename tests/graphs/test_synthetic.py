"""Synthetic contextual SBM: size, symmetry, homophily, power-law tail, seeding."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import degree, is_undirected

from leangnn.graphs.synthetic import contextual_sbm


def test_shape_symmetry_and_determinism():
    g = contextual_sbm(5000, num_classes=5, avg_degree=20, in_channels=16, seed=1)
    assert g.x.shape == (5000, 16) and g.y.max() == 4
    assert is_undirected(g.edge_index, num_nodes=5000)
    assert not (g.edge_index[0] == g.edge_index[1]).any()
    assert 15 <= g.num_edges / 5000 <= 21
    same = (g.y[g.edge_index[0]] == g.y[g.edge_index[1]]).float().mean()
    assert 0.6 < same < 0.85  # homophily 0.7 plus chance agreement
    masks = g.train_mask.int() + g.val_mask.int() + g.test_mask.int()
    assert torch.equal(masks, torch.ones(5000, dtype=torch.int))
    h = contextual_sbm(5000, num_classes=5, avg_degree=20, in_channels=16, seed=1)
    assert torch.equal(g.edge_index, h.edge_index) and torch.equal(g.x, h.x)


def test_heavy_tailed_degrees():
    g = contextual_sbm(20000, avg_degree=10, seed=0)
    d = degree(g.edge_index[0], g.num_nodes)
    assert d.max() > 10 * d.mean()  # hubs exist, unlike an Erdos-Renyi graph


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="homophily must be in"):
        contextual_sbm(100, homophily=1.5)
    with pytest.raises(ValueError, match="num_nodes must be"):
        contextual_sbm(1)
