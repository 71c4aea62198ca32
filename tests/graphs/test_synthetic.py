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


def test_rmat_edge_count_skew_and_determinism():
    from leangnn.graphs.synthetic import rmat_edges, rmat_graph

    raw = rmat_edges(12, 16 * 4096, seed=3)
    assert raw.shape == (2, 16 * 4096) and int(raw.max()) < 4096
    assert torch.equal(raw, rmat_edges(12, 16 * 4096, seed=3))
    assert not torch.equal(raw, rmat_edges(12, 16 * 4096, seed=4))
    # without relabelling, the bit probabilities are visible: a source's top
    # bit is 1 with probability c + d = 0.24
    plain = rmat_edges(12, 16 * 4096, permute=False, seed=3)
    top = (plain[0] >> 11).float().mean()
    assert abs(float(top) - 0.24) < 0.01
    d = rmat_graph(12, in_channels=4, seed=3)
    ei = d.edge_index
    assert is_undirected(ei, num_nodes=d.num_nodes)
    assert not (ei[0] == ei[1]).any()
    assert torch.unique(ei[0] * d.num_nodes + ei[1]).numel() == ei.size(1)
    assert 0.5 * 2 * 16 * 4096 < ei.size(1) <= 2 * 16 * 4096
    deg = degree(ei[1], d.num_nodes)
    # heavy skew: the top 1% of nodes hold far more than 1% of the edges,
    # and the largest hub is hundreds of times the mean
    top = torch.sort(deg, descending=True)[0][: d.num_nodes // 100].sum()
    assert float(top / deg.sum()) > 0.15
    assert float(deg.max() / deg.mean()) > 50
    # a uniform-probability R-MAT (a = b = c = d) has no such hubs
    flat = rmat_graph(12, a=0.25, b=0.25, c=0.25, in_channels=4, seed=3)
    fdeg = degree(flat.edge_index[1], flat.num_nodes)
    assert float(fdeg.max() / fdeg.mean()) < 3
    # noise and directed/duplicate options
    noisy = rmat_edges(12, 1000, noise=0.1, seed=3)
    assert noisy.shape == (2, 1000) and not torch.equal(noisy, rmat_edges(12, 1000,
                                                                           seed=3))
    raw_g = rmat_graph(10, undirected=False, dedup=False, self_loops=True,
                       in_channels=4)
    assert raw_g.edge_index.size(1) == 16 * 1024
    assert d.x.shape == (4096, 4) and d.y.shape == (4096,)


def test_rmat_bad_arguments_are_named():
    from leangnn.graphs.synthetic import rmat_edges, rmat_graph

    with pytest.raises(ValueError, match="rmat: a, b, c"):
        rmat_edges(10, 100, a=0.9, b=0.2)
    with pytest.raises(ValueError, match="rmat: scale"):
        rmat_edges(0, 100)
    with pytest.raises(ValueError, match="rmat: noise"):
        rmat_edges(10, 100, noise=1.5)
    with pytest.raises(ValueError, match="rmat: edge_factor"):
        rmat_graph(10, edge_factor=0)
