"""Node importance against networkx references."""

import networkx as nx
import pytest
import torch

from leangnn.graphs.sparse import undirected_csr
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.prune.importance import (
    IMPORTANCE,
    combined_importance,
    degree_importance,
    kcore_number,
    node_importance,
    pagerank,
    register_importance,
)


def _graph(n=600, deg=5.0, seed=0):
    d = contextual_sbm(n, avg_degree=deg, seed=seed)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(d.edge_index.t().tolist())
    return d, g


def _directed_with_dups():
    # Directed edges, a duplicate, a self-loop and an isolated node (5).
    ei = torch.tensor([[0, 1, 1, 2, 3, 3, 0], [1, 2, 2, 0, 4, 3, 2]])
    g = nx.Graph()
    g.add_nodes_from(range(6))
    g.add_edges_from((u, v) for u, v in ei.t().tolist() if u != v)
    return ei, g


def test_degree_matches_networkx_undirected_dedup():
    ei, g = _directed_with_dups()
    deg = degree_importance(ei, 6)
    assert deg.tolist() == [g.degree(i) for i in range(6)]


def test_pagerank_matches_networkx():
    d, g = _graph()
    ref = nx.pagerank(g, alpha=0.85, tol=1e-13, max_iter=1000)
    ours = pagerank(d.edge_index, d.num_nodes, tol=1e-13, max_iter=1000,
                    dtype=torch.float64)
    assert torch.allclose(ours, torch.tensor([ref[i] for i in range(d.num_nodes)],
                                             dtype=torch.float64), atol=1e-10)
    # float32 (the default) ranks the same nodes on top
    f32 = pagerank(d.edge_index, d.num_nodes)
    assert abs(float(f32.sum()) - 1.0) < 1e-4
    top = set(torch.topk(ours, 50).indices.tolist())
    assert len(top & set(torch.topk(f32.double(), 50).indices.tolist())) >= 48


def test_pagerank_dangling_nodes_match_networkx():
    ei, g = _directed_with_dups()
    ref = nx.pagerank(g, tol=1e-13, max_iter=1000)
    ours = pagerank(ei, 6, tol=1e-13, max_iter=1000, dtype=torch.float64)
    assert torch.allclose(ours, torch.tensor([ref[i] for i in range(6)],
                                             dtype=torch.float64), atol=1e-10)


@pytest.mark.parametrize("deg", [2.0, 6.0, 15.0])
def test_kcore_matches_networkx(deg):
    d, g = _graph(800, deg, seed=3)
    ref = nx.core_number(g)
    ours = kcore_number(d.edge_index, d.num_nodes)
    assert ours.tolist() == [float(ref[i]) for i in range(d.num_nodes)]


def test_kcore_directed_duplicates_selfloops():
    ei, g = _directed_with_dups()
    ref = nx.core_number(g)
    assert kcore_number(ei, 6).tolist() == [float(ref[i]) for i in range(6)]


def test_combined_is_mean_of_ranks():
    d, _ = _graph(300)
    c = combined_importance(d.edge_index, d.num_nodes)
    assert c.min() >= 0 and c.max() <= 1
    one = combined_importance(d.edge_index, d.num_nodes, {"degree": 1.0})
    deg = degree_importance(d.edge_index, d.num_nodes)
    # a rank transform is monotone: same order as the raw degree
    i, j = torch.triu_indices(300, 300, 1)
    assert bool(((deg[i] - deg[j]).sign() == (one[i] - one[j]).sign()).all())


def test_registry_callable_and_dict():
    d, _ = _graph(200)
    assert {"degree", "pagerank", "kcore", "combined"} <= set(IMPORTANCE)

    @register_importance("test_reverse_index")
    def rev(edge_index, num_nodes):
        return -torch.arange(num_nodes, dtype=torch.float)

    try:
        s = node_importance(d.edge_index, d.num_nodes, "test_reverse_index")
        assert s[0] == 0 and s[-1] == -(d.num_nodes - 1)
        s2 = node_importance(d.edge_index, d.num_nodes, rev)
        assert torch.equal(s, s2)
        s3 = node_importance(d.edge_index, d.num_nodes, {"degree": 2, "kcore": 1})
        assert s3.shape == (d.num_nodes,)
        adj = undirected_csr(d.edge_index, d.num_nodes)
        assert torch.equal(node_importance(d.edge_index, d.num_nodes, "degree",
                                           adj=adj),
                           degree_importance(d.edge_index, d.num_nodes))
    finally:
        IMPORTANCE.pop("test_reverse_index")


def test_bad_input_errors():
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="unknown importance"):
        node_importance(ei, 3, "nope")
    with pytest.raises(ValueError, match="num_nodes"):
        node_importance(ei, 2, "degree")
    with pytest.raises(ValueError, match="edge_index"):
        node_importance(torch.zeros(3, 2, dtype=torch.long), 3, "degree")
    with pytest.raises(ValueError, match="alpha"):
        pagerank(ei, 3, alpha=1.5)
    with pytest.raises(ValueError, match="returned 2 scores"):
        node_importance(ei, 3, lambda e, n: torch.zeros(2))
