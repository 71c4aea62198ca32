"""Serving kernels: bag products, reassociated SAGE, cached GCN vs torch / PyG (f64)."""

import warnings

import pytest
import torch
from torch_geometric.nn import GAT, GCN, GraphSAGE
from torch_geometric.utils import to_torch_csr_tensor

from leangnn.graphs.sparse import adj_t_of, csr_tensor
from leangnn.prune.serve import (
    ServeGraph,
    csr_rows,
    mean_adjacency,
    rows_mm,
    servable,
    serve_forward,
)


def _random_csr(m, n, density, index_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(m, n, generator=g, dtype=torch.float64)
    dense[torch.rand(m, n, generator=g) > density] = 0
    dense[1] = 0  # an empty row
    with warnings.catch_warnings():  # torch's "beta" notice
        warnings.simplefilter("ignore", UserWarning)
        s = dense.to_sparse_csr()
    return csr_tensor(s.crow_indices().to(index_dtype), s.col_indices().to(index_dtype),
                      s.values(), s.shape), dense


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_rows_mm_bag_and_csr_equal_the_dense_product(index_dtype):
    w, dense = _random_csr(40, 30, 0.2, index_dtype)
    x = torch.randn(30, 7, dtype=torch.float64)
    ref = dense @ x
    for kernel in ("bag", "csr"):
        torch.testing.assert_close(rows_mm(w, x, kernel), ref, rtol=0, atol=1e-12)
    # row slices (the decoder's chunks) and a non-contiguous right-hand side
    part = csr_rows(w, 5, 23)
    xt = torch.randn(7, 30, dtype=torch.float64).t()
    assert not xt.is_contiguous()
    torch.testing.assert_close(rows_mm(part, xt), dense[5:23] @ xt, rtol=0, atol=1e-12)
    assert rows_mm(w, x)[1].abs().sum() == 0  # the empty row
    with pytest.raises(ValueError, match="kernel"):
        rows_mm(w, x, "dense")


def test_mean_adjacency_is_torch_mean_reduction():
    w, _ = _random_csr(25, 25, 0.3, torch.int32, seed=1)  # weighted, one empty row
    x = torch.randn(25, 5, dtype=torch.float64)
    ref = torch.sparse.mm(w, x, "mean")
    torch.testing.assert_close(mean_adjacency(w) @ x, ref, rtol=0, atol=1e-12)
    a32 = mean_adjacency(w, torch.float32)
    assert a32.values().dtype == torch.float32
    assert a32.col_indices().data_ptr() == w.col_indices().data_ptr()  # shared


def _graph(n=60, e=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.unique(ei, dim=1)  # PyG's edge_index path sums duplicates too
    return ei, n


@pytest.mark.parametrize("kw", [
    dict(hidden_channels=32, num_layers=2, out_channels=4),  # 16 -> 32 -> 4
    dict(hidden_channels=8, num_layers=3, out_channels=12),  # narrowing, widening
    dict(hidden_channels=8, num_layers=1),
    dict(hidden_channels=16, num_layers=3, out_channels=5, jk="cat",
         norm="batch_norm", act_first=True),
    dict(hidden_channels=16, num_layers=2, jk="max", root_weight=False, bias=False),
])
def test_sage_forward_equals_pyg_in_float64(kw):
    _check_against_pyg(GraphSAGE, kw)


@pytest.mark.parametrize("kw", [
    dict(hidden_channels=32, num_layers=2, out_channels=4),
    # With improved=True PyG's sparse and edge_index paths disagree (its
    # gcn_norm builds the self-loops differently): DPR serves what
    # model(x, adj_t) computes, so that is the reference
    dict(hidden_channels=8, num_layers=3, out_channels=12, improved=True),
    dict(hidden_channels=16, num_layers=2, add_self_loops=False, jk="cat",
         norm="batch_norm"),
    dict(hidden_channels=16, num_layers=2, normalize=False, bias=False),
])
def test_gcn_forward_equals_pyg_in_float64(kw):
    _check_against_pyg(GCN, kw)


def _check_against_pyg(cls, kw):
    ei, n = _graph()
    torch.manual_seed(0)
    model = cls(16, dropout=0.5, **kw).double()
    for p in model.parameters():  # non-trivial weights and biases
        torch.nn.init.normal_(p)
    model.train()
    x = torch.randn(n, 16, dtype=torch.float64) * 0.5
    model(x, ei)  # updates batch-norm running stats away from the init
    model.eval()
    assert servable(model)
    adj = adj_t_of(ei, n).double()
    graph = ServeGraph(adj)
    with torch.no_grad():
        ref = model(x, adj)  # what DPR calls the encoder with
        if not kw.get("improved"):  # and PyG's gather-scatter agrees with it
            torch.testing.assert_close(model(x, ei), ref, rtol=0, atol=1e-9)
        for kernel in ("bag", "csr"):
            out = serve_forward(model, x, graph, kernel)
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-9)
    assert repr(graph).startswith("ServeGraph(num_nodes=60")


def test_only_mean_sage_and_gcn_models_are_served():
    assert not servable(GAT(8, 8, 2))
    assert not servable(GraphSAGE(8, 8, 2, aggr="max"))
    assert not servable(GraphSAGE(8, 8, 2, project=True))
    assert not servable(GraphSAGE(8, 8, 2, normalize=True))
    assert not servable(GCN(8, 8, 2, cached=True))
    assert not servable(torch.nn.Linear(3, 3))
    assert servable(GraphSAGE(8, 8, 2)) and servable(GCN(8, 8, 2))
    # a weighted sparse adjacency: PyG's mean on torch.sparse weights values
    ei, n = _graph(seed=3)
    w = torch.rand(ei.size(1), dtype=torch.float64)
    adj = to_torch_csr_tensor(ei.flip(0), w, size=(n, n))
    model = GraphSAGE(6, 8, 2, 3).double().eval()
    x = torch.randn(n, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(serve_forward(model, x, ServeGraph(adj)),
                                   model(x, adj), rtol=0, atol=1e-10)
