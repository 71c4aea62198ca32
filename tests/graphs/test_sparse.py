"""Sparse builders against networkx / SciPy / PyG references, and edge checks."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric.utils import coalesce, degree, remove_self_loops, to_undirected

from leangnn.graphs.sparse import (
    DstCSR,
    adj_t_of,
    check_edge_index,
    csr_tensor_from_scipy,
    is_canonical,
    undirected_csr,
)


def _messy(n=60, e=400, seed=0):
    """Directed edges with duplicates, self-loops and isolated nodes."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(n - 5, (2, e), generator=g)  # the last 5 nodes: isolated
    ei = torch.cat([ei, ei[:, :30], torch.tensor([[3, 7, 7], [3, 7, 7]])], 1)
    return ei, n


def _nx_adj(ei, n):
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((u, v) for u, v in ei.t().tolist() if u != v)
    return nx.to_scipy_sparse_array(g, nodelist=range(n), format="csr")


def test_undirected_csr_matches_networkx():
    ei, n = _messy()
    adj = undirected_csr(ei, n)
    ref = _nx_adj(ei, n)
    assert adj.shape == (n, n) and adj.dtype == np.float32
    assert adj.indices.dtype == np.int32 and adj.has_sorted_indices
    assert np.array_equal(adj.toarray(), ref.toarray())  # binary, symmetric
    assert adj.diagonal().sum() == 0


def test_undirected_csr_is_pygs_undirected_coalesced_edge_index():
    ei, n = _messy(seed=1)
    ref, _ = remove_self_loops(to_undirected(ei, num_nodes=n))
    ref = coalesce(ref, num_nodes=n)
    adj = undirected_csr(ei, n)
    rows = np.repeat(np.arange(n), np.diff(adj.indptr))
    assert np.array_equal(rows, ref[0].numpy())
    assert np.array_equal(adj.indices, ref[1].numpy())
    # that edge_index is canonical: the fast path gives the same matrix
    assert is_canonical(adj, ref)
    fast = undirected_csr(ref, n, canonical=True)
    assert (fast != adj).nnz == 0 and np.array_equal(fast.indptr, adj.indptr)
    assert not is_canonical(adj, ei)  # directed, duplicated, looped
    assert not is_canonical(adj, ref.flip(0))  # right edges, wrong order


def test_undirected_csr_bool_has_the_same_structure():
    ei, n = _messy(seed=2)
    a, b = undirected_csr(ei, n), undirected_csr(ei, n, dtype=bool)
    assert b.dtype == np.bool_ and b.data.all()
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)


def test_dst_csr_gathers_in_edges():
    ei = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 1, 0, 1]])
    csr = DstCSR(ei, 4, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert csr.in_degree().tolist() == [1, 3, 1, 0]
    ids, counts = csr.edge_ids(torch.tensor([1, 3, 0]))
    assert counts.tolist() == [3, 0, 1]
    assert sorted(csr.col[ids[:3]].tolist()) == [0, 2, 3]
    assert sorted(csr.weight[ids[:3]].tolist()) == [1.0, 3.0, 5.0]
    assert csr.in_neighbors(torch.tensor([1, 0])).tolist() == [0, 2, 3]


def test_dst_csr_against_brute_force():
    ei, n = _messy(seed=3)
    w = torch.rand(ei.size(1), generator=torch.Generator().manual_seed(0))
    csr = DstCSR(ei, n, w)
    assert torch.equal(csr.in_degree(), degree(ei[1], n, dtype=torch.long))
    nodes = torch.tensor([4, 0, n - 1, 17, 4])
    ids, counts = csr.edge_ids(nodes)
    got = sorted(zip(csr.col[ids].tolist(), csr.weight[ids].tolist()))
    want = sorted((int(ei[0, e]), float(w[e])) for v in nodes.tolist()
                  for e in range(ei.size(1)) if int(ei[1, e]) == v)
    assert got == want and int(counts.sum()) == len(want)
    nbrs = csr.in_neighbors(nodes[:3])
    assert nbrs.tolist() == sorted({int(ei[0, e]) for e in range(ei.size(1))
                                    if int(ei[1, e]) in (4, 0, n - 1)})


def test_adj_t_of_is_the_transposed_dense_adjacency():
    ei, n = _messy(seed=4)
    w = torch.rand(ei.size(1), generator=torch.Generator().manual_seed(1))
    ref = torch.zeros(n, n, dtype=torch.float64)
    ref.index_put_((ei[1], ei[0]), w.double(), accumulate=True)  # duplicates add
    got = adj_t_of(ei, n, w)
    assert got.layout == torch.sparse_csr and got.crow_indices().dtype == torch.int32
    assert torch.allclose(got.to_dense().double(), ref, atol=1e-6)
    ones = torch.zeros(n, n).index_put_((ei[1], ei[0]), torch.ones(ei.size(1)),
                                        accumulate=True)
    assert torch.equal(adj_t_of(ei, n).to_dense(), ones)
    x = torch.randn(n, 3, dtype=torch.float64)
    assert torch.allclose(got.double() @ x, ref @ x)


def test_csr_tensor_from_scipy_round_trip():
    m = sp.random(30, 20, density=0.2, format="csr", random_state=0,
                  dtype=np.float64)
    t = csr_tensor_from_scipy(m)
    assert t.dtype == torch.float32 and t.col_indices().dtype == torch.int32
    assert np.allclose(t.to_dense().numpy(), m.toarray(), atol=1e-6)


def test_empty_graph():
    ei = torch.empty(2, 0, dtype=torch.long)
    check_edge_index(ei, 4)
    adj = undirected_csr(ei, 4)
    assert adj.shape == (4, 4) and adj.nnz == 0
    assert is_canonical(adj, ei)
    csr = DstCSR(ei, 4)
    assert csr.in_degree().tolist() == [0, 0, 0, 0]
    assert csr.in_neighbors(torch.tensor([0, 3])).numel() == 0
    assert torch.equal(adj_t_of(ei, 4).to_dense(), torch.zeros(4, 4))


@pytest.mark.parametrize("edge_index, num_nodes, message", [
    ([[0, 1], [1, 0]], 2, "edge_index must be a [2, E] torch.Tensor, got list"),
    (torch.tensor([0, 1, 2]), 3,
     "edge_index must have shape [2, E], got shape (3,)"),
    (torch.zeros(3, 4, dtype=torch.long), 3,
     "edge_index must have shape [2, E], got shape (3, 4)"),
    (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 2,
     "edge_index must hold integer node ids, got dtype torch.float32"),
    (torch.tensor([[0.0, float("nan")], [1.0, 0.0]]), 2,
     "edge_index must hold integer node ids, got dtype torch.float32 "
     "(it contains NaN)"),
    (torch.tensor([[True], [False]]), 2,
     "edge_index must hold integer node ids, got dtype torch.bool"),
    (torch.tensor([[0, 1, -3], [1, 0, 0]]), 2,
     "edge_index[:, 2] holds the negative node id -3"),
    (torch.tensor([[0, 1, 2], [1, 7, 0]]), 5,
     "edge_index[:, 1] refers to node 7 but num_nodes=5"),
    (torch.tensor([[0], [1]]), 0, "num_nodes must be a positive int, got 0"),
    (torch.tensor([[0], [1]]), 2.0, "num_nodes must be a positive int, got 2.0"),
    (torch.tensor([[0], [1]]), True, "num_nodes must be a positive int, got True"),
])
def test_check_edge_index_names_the_problem(edge_index, num_nodes, message):
    with pytest.raises(ValueError) as e:
        check_edge_index(edge_index, num_nodes)
    assert str(e.value) == message


def test_check_edge_index_names_the_argument_and_accepts_int32():
    check_edge_index(torch.tensor([[0, 1], [1, 0]], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="^core_edges\\[:, 0\\] refers to node 9"):
        check_edge_index(torch.tensor([[9], [0]]), 3, name="core_edges")


@pytest.mark.parametrize("build", [undirected_csr, DstCSR, adj_t_of])
def test_builders_check_their_input(build):
    with pytest.raises(ValueError, match="refers to node 3 but num_nodes=3"):
        build(torch.tensor([[0, 3], [1, 0]]), 3)
    with pytest.raises(ValueError, match="dtype torch.float32"):
        build(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 3)
