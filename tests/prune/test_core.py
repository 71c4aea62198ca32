"""Core selection: exact budgets, bridging connectivity, sparsifiers."""

import math

import networkx as nx
import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from leangnn.graphs.synthetic import contextual_sbm, power_law_graph
from leangnn.prune.core import (
    build_core,
    cap_in_degree,
    core_size,
    core_size_for_bytes,
    dspar_sparsify,
    select_core,
)


def _nx(edge_index, n):
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edge_index.t().tolist())
    return g


def _check_connectivity(data: Data, core) -> None:
    """Core nodes are connected in the core graph iff they were in the graph."""
    orig = {v: i for i, c in enumerate(nx.connected_components(
        _nx(data.edge_index, data.num_nodes))) for v in c}
    g = _nx(core.data.edge_index, core.num_core)
    cc = {v: i for i, c in enumerate(nx.connected_components(g)) for v in c}
    idx = core.index.tolist()
    pairs = {(orig[idx[p]], cc[p]) for p in range(core.num_core)}
    # a bijection between original components touching the core and core
    # components: none split (bridges work) and none merged (no false bridge)
    assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})


@pytest.mark.parametrize("n,r", [(10, 0.25), (10, 0.35), (7, 0.5), (1000, 0.3),
                                 (999, 0.1), (3, 0.01), (5, 1.0), (12345, 0.77)])
def test_core_size_round_half_up(n, r):
    expect = min(n, max(1, math.floor(r * n + 0.5)))
    assert core_size(n, r) == expect
    d = (contextual_sbm(n, num_classes=2, avg_degree=min(4.0, n - 1.0), seed=1)
         if n > 2 else None)
    if d is not None:
        c = build_core(d, r)
        assert c.num_core == expect == int(c.mask.sum()) == c.data.num_nodes
        assert c.data.x.shape[0] == expect


def test_core_size_documented_cases():
    assert core_size(10, 0.25) == 3  # half up (Python's round() gives 2)
    assert core_size(10, 0.05) == 1  # 0.5 -> 1
    assert core_size(10, 0.04) == 1  # clamped to one node
    assert core_size(1000, 0.3) == 300


def test_core_size_rejects_bad_ratio():
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="budget_ratio"):
            core_size(10, bad)
    with pytest.raises(ValueError, match="num_nodes"):
        core_size(0, 0.5)


def test_select_core_top_scores_ties_to_lower_index():
    score = torch.tensor([1.0, 5.0, 3.0, 5.0, 3.0, 0.0])
    assert select_core(score, 3).tolist() == [1, 2, 3]
    assert select_core(score, 4).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="num_core"):
        select_core(score, 7)


def test_core_slices_node_attributes_and_keeps_order():
    d = contextual_sbm(500, avg_degree=6, seed=0)
    d.node_mask = d.train_mask
    c = build_core(d, 0.3, importance="degree")
    assert torch.equal(c.data.x, d.x[c.index])
    assert torch.equal(c.data.y, d.y[c.index])
    assert torch.equal(c.data.node_mask, d.train_mask[c.index])
    assert bool((c.index[1:] > c.index[:-1]).all())
    deg = torch.bincount(d.edge_index[0], minlength=500).float()
    # the core holds the highest degrees
    assert deg[c.index].min() >= deg[~c.mask].max()


def test_r1_core_is_the_graph():
    d = contextual_sbm(300, avg_degree=5, seed=0)
    c = build_core(d, 1.0, edge_budget=1.0)
    assert c.data.edge_index is d.edge_index and c.data.x is d.x
    assert c.num_bridges == 0


@pytest.mark.parametrize("deg,r", [(1.2, 0.3), (2.0, 0.2), (3.0, 0.3), (2.0, 0.6)])
@pytest.mark.parametrize("bridge", ["component", "two_hop"])
def test_bridges_preserve_connectivity(deg, r, bridge):
    d = contextual_sbm(1500, avg_degree=deg, seed=7)
    c = build_core(d, r, bridge=bridge)
    _check_connectivity(d, c)
    if bridge == "component":
        # minimal: at most one bridge (both directions) per merged component
        induced = _nx(c.data.edge_index[:, :c.num_induced_edges], c.num_core)
        assert c.num_bridges <= 2 * (nx.number_connected_components(induced) - 1)


def test_without_bridges_connectivity_is_lost():
    d = contextual_sbm(1500, avg_degree=1.5, seed=7)
    c = build_core(d, 0.3, bridge="none")
    with pytest.raises(AssertionError):
        _check_connectivity(d, c)


def test_bridges_through_long_pruned_paths_directed():
    # Two directed chains 0->1->...->9 and 10->...->19, plus a lone node 20.
    src = list(range(9)) + list(range(10, 19))
    ei = torch.tensor([src, [s + 1 for s in src]])
    d = Data(x=torch.randn(21, 3), edge_index=ei, num_nodes=21)
    score = torch.zeros(21)
    score[[0, 9, 10, 19, 20]] = 1.0
    c = build_core(d, num_core=5, importance=lambda e, n: score)
    assert c.index.tolist() == [0, 9, 10, 19, 20]
    _check_connectivity(d, c)
    assert c.num_bridges == 4  # 0-9 and 10-19, both directions


def test_edge_budget_caps_edges_keeps_connectivity():
    d = contextual_sbm(2000, avg_degree=12, seed=2)
    full = build_core(d, 0.3)
    c = build_core(d, 0.3, edge_budget=0.1)
    budget = round(0.1 * d.num_edges)
    assert full.num_induced_edges > budget
    assert c.num_induced_edges <= budget
    # forest and bridges on top of the budget: at most 2 (N_core - 1) + bridges
    assert c.data.num_edges <= budget + 2 * (c.num_core - 1) + c.num_bridges
    _check_connectivity(d, c)


def test_cap_in_degree():
    d = contextual_sbm(800, avg_degree=10, seed=4)
    budget = d.num_edges // 3
    keep = cap_in_degree(d.edge_index, 800, budget, seed=1)
    assert int(keep.sum()) <= budget
    deg = torch.bincount(d.edge_index[1], minlength=800)
    kdeg = torch.bincount(d.edge_index[1, keep], minlength=800)
    cap = int(kdeg.max())
    assert torch.equal(kdeg, deg.clamp(max=cap))  # everyone keeps min(d, c)
    assert int(deg.clamp(max=cap + 1).sum()) > budget  # c is the largest cap
    assert cap_in_degree(d.edge_index, 800, 10**9).all()


def _cap_by_one_sort(edge_index, num_nodes, max_edges, seed):
    """The reference: every edge sorted by target + its uniform offset, the
    first c of every target kept (c from the same search)."""
    dst = edge_index[1]
    e = dst.numel()
    deg = torch.bincount(dst, minlength=num_nodes)
    cap = max(c for c in range(int(deg.max()) + 1)
              if int(deg.clamp(max=c).sum()) <= max_edges)
    rand = torch.rand(e, generator=torch.Generator().manual_seed(seed),
                      dtype=torch.float64)
    order = torch.argsort(dst.double() + rand)
    start = torch.cumsum(deg, 0) - deg
    rank = torch.arange(e) - start[dst[order]]
    mask = torch.zeros(e, dtype=torch.bool)
    mask[order[rank < cap]] = True
    return mask


@pytest.mark.parametrize("share", [0.05, 0.3, 0.7, 0.95])
def test_cap_in_degree_keeps_the_edges_of_one_global_sort(share):
    # sorting only the capped nodes' edges keeps the same edges (power-law
    # hubs and unsorted, duplicated targets included)
    for seed in range(3):
        d = power_law_graph(600, avg_degree=8, seed=seed)
        ei = d.edge_index[:, torch.randperm(d.num_edges,
                                            generator=torch.Generator()
                                            .manual_seed(seed))]
        budget = int(share * ei.size(1))
        assert torch.equal(cap_in_degree(ei, 600, budget, seed=seed),
                           _cap_by_one_sort(ei, 600, budget, seed))


def test_dspar_is_unbiased():
    d = contextual_sbm(60, avg_degree=6, seed=5)
    n = 60
    dense = torch.zeros(n, n)
    runs = 300
    for s in range(runs):
        ei, w = dspar_sparsify(d.edge_index, n, 0.5, seed=s)
        assert ei.size(1) == w.numel() and bool((w > 0).all())
        dense.index_put_((ei[0], ei[1]), w, accumulate=True)
    dense /= runs
    a = torch.zeros(n, n)
    a[d.edge_index[0], d.edge_index[1]] = 1.0
    assert bool((dense[a == 0] == 0).all())
    # E[w_e] = 1 on every edge: the average over runs is close to one
    err = (dense[a == 1] - 1.0).abs().mean()
    assert err < 0.15, err
    # and the probabilities favour edges between low-degree nodes
    ei, _ = dspar_sparsify(d.edge_index, n, 0.2, seed=0)
    deg = torch.bincount(d.edge_index[0], minlength=n).double()
    kept = (1 / deg[ei[0]] + 1 / deg[ei[1]]).mean()
    assert kept > (1 / deg[d.edge_index[0]] + 1 / deg[d.edge_index[1]]).mean()


def test_sparsify_keeps_connectivity():
    d = contextual_sbm(1000, avg_degree=8, seed=3)
    c = build_core(d, 0.4, sparsify=0.2)
    assert c.data.edge_weight.numel() == c.data.num_edges
    _check_connectivity(d, c)


def test_byte_budget():
    d = contextual_sbm(1000, avg_degree=8, seed=3)
    row = d.x[:1].numel() * 4 + 8 + 16.0 * d.num_edges / 1000
    n = core_size_for_bytes(d, int(300 * row) + 1)
    assert n == 300
    c = build_core(d, budget_bytes=int(300 * row) + 1)
    assert c.num_core == 300
    with pytest.raises(ValueError, match="budget_bytes"):
        core_size_for_bytes(d, 0)


def test_bad_arguments():
    d = contextual_sbm(100, avg_degree=4, seed=0)
    with pytest.raises(ValueError, match="bridge"):
        build_core(d, 0.3, bridge="weird")
    with pytest.raises(ValueError, match="edge_budget"):
        build_core(d, 0.3, edge_budget=2.0)
    with pytest.raises(ValueError, match="keep_ratio"):
        dspar_sparsify(d.edge_index, 100, 0.0)
    assert np.isfinite(build_core(d, 0.3).score.numpy()).all()


def test_bridges_with_many_components_no_label_overflow():
    # 100k disjoint paths a - m - b with a, b in the core and m pruned:
    # 200k core components x 100k pruned ones, pair keys beyond int32.
    k = 100_000
    a = torch.arange(k) * 3
    src = torch.cat([a, a + 1, a + 1, a + 2])
    dst = torch.cat([a + 1, a, a + 2, a + 1])
    d = Data(x=torch.zeros(3 * k, 1), edge_index=torch.stack([src, dst]),
             num_nodes=3 * k)
    score = torch.ones(3 * k)
    score[a + 1] = 0.0
    c = build_core(d, num_core=2 * k, importance=lambda e, n: score)
    assert c.num_bridges == 2 * k and c.num_induced_edges == 0
    from scipy.sparse.csgraph import connected_components

    from leangnn.graphs.sparse import undirected_csr

    ncomp, lab = connected_components(undirected_csr(c.data.edge_index, 2 * k),
                                      directed=False)
    assert ncomp == k
    assert bool((lab[0::2] == lab[1::2]).all())  # a_i and b_i joined
