"""CSR kernels: equal to PyG's convs (float64), used by GSRStack, with off switch."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from leangnn.circuits import load_circuit
from leangnn.nn import GSRGNN, GSRStack, csr
from leangnn.nn.csr import CSRGraph, csr_kernels
from leangnn.nn.shared_graph import shared_graph

CONVS = {
    "gcn": lambda: GCNConv(8, 8),
    "gcn_improved": lambda: GCNConv(8, 8, improved=True),
    "gcn_t2s": lambda: GCNConv(8, 8, flow="target_to_source"),
    "sage": lambda: SAGEConv(8, 8),
    "sage_noroot": lambda: SAGEConv(8, 8, root_weight=False),
    "gat": lambda: GATConv(8, 8),
    "gat_heads_mean": lambda: GATConv(8, 8, heads=2, concat=False),
    "gat_heads_concat": lambda: GATConv(8, 4, heads=3, negative_slope=0.1),
    "gat_dropout_eval": lambda: GATConv(8, 8, dropout=0.5).eval(),
}


def _grads(conv, x, edge_index):
    out = conv(x, edge_index)
    return out, torch.autograd.grad(out.square().sum(), [x, *conv.parameters()])


@pytest.mark.parametrize("kind", list(CONVS))
def test_kernel_equals_pyg_conv_float64(graph, kind):
    edge_index, n = graph
    torch.manual_seed(0)
    conv = CONVS[kind]().double()
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    ref, ref_grads = _grads(conv, x, edge_index)
    with shared_graph([conv], edge_index, n, torch.float64) as shared, \
            csr_kernels([conv], shared, n, torch.float64,
                        looped=shared is not edge_index) as kernels:
        assert kernels[0] is not None
        out = kernels[0](x)
    grads = torch.autograd.grad(out.square().sum(), [x, *conv.parameters()])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_csr_graph_layout_and_transpose(graph):
    edge_index, n = graph
    g = CSRGraph(edge_index, n)
    values = torch.rand(edge_index.size(1), dtype=torch.float64)
    dense = torch.zeros(n, n, dtype=torch.float64)
    dense[edge_index[1], edge_index[0]] = values  # rows = targets
    v = values[g.perm]
    torch.testing.assert_close(g.matrix(v).to_dense(), dense, rtol=0, atol=0)
    torch.testing.assert_close(g.matrix_t(v).to_dense(), dense.t(), rtol=0, atol=0)
    src2, dst2 = g.interleaved()
    assert torch.equal(src2 // 2, edge_index[0, g.perm])
    assert torch.equal(dst2 // 2, edge_index[1, g.perm]) and bool((dst2 % 2).all())


@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
@pytest.mark.parametrize("num_edges", [0, 1, 500])
def test_csr_graph_indices_match_numpy_lexsort(dtype, num_edges):
    # the indices are decoded from sorted keys: checked against NumPy's
    # lexsort and plain gathers, on int32 input, empty and one-edge graphs
    import numpy as np

    n = 40
    gen = torch.Generator().manual_seed(num_edges)
    pairs = torch.randperm(n * n, generator=gen)[:num_edges]
    ei = torch.stack([pairs % n, pairs // n]).to(dtype)  # unique (src, dst)
    g = CSRGraph(ei, n)
    src, dst = ei.long().numpy()
    perm = np.lexsort((src, dst))  # by target, then source
    assert g.perm.tolist() == perm.tolist()
    assert g.row.tolist() == dst[perm].tolist()
    assert g.col.tolist() == src[perm].tolist()
    perm_t = np.lexsort((dst[perm], src[perm]))
    assert g.perm_t.tolist() == perm_t.tolist()
    assert g.col_t.tolist() == dst[perm][perm_t].tolist()
    for crow, rows in ((g.crow, dst), (g.crow_t, src)):
        assert crow.tolist() == [0, *np.cumsum(np.bincount(rows, minlength=n))]
    assert all(t.dtype == torch.long for t in
               (g.perm, g.row, g.col, g.crow, g.perm_t, g.col_t, g.crow_t))


@pytest.mark.parametrize("bad", [-1, 40])
def test_node_indices_out_of_range_are_refused_with_the_values(bad):
    ei = torch.tensor([[0, 1, bad], [1, 2, 3]])
    with pytest.raises(ValueError, match=f"{min(bad, 0)}..{max(bad, 3)}.*num_nodes=40"):
        CSRGraph(ei, 40)


def test_a_graph_too_large_for_int64_keys_is_refused_by_name():
    with pytest.raises(ValueError, match="num_nodes=3037000500"):
        CSRGraph(torch.tensor([[0], [1]]), 3_037_000_500)


def test_duplicate_edges_fall_back_to_pyg(graph):
    edge_index, n = graph
    with pytest.raises(ValueError, match="duplicate"):
        CSRGraph(torch.cat([edge_index, edge_index[:, :1]], 1), n)
    doubled = torch.cat([edge_index, edge_index[:, :5]], 1)
    convs = [SAGEConv(8, 8), GATConv(8, 8)]
    with shared_graph(convs[1:], doubled, n, torch.float32) as shared, \
            csr_kernels(convs, shared, n, torch.float32, looped=True) as kernels:
        assert kernels == [None, None]
    with csr_kernels(convs, "not a tensor", n, torch.float32) as kernels:
        assert kernels == [None, None]


def _stack_grads(model, data, dtype, seed=1):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(data.x.to(dtype), data.edge_index)
    (out.squeeze(-1) - data.y.to(dtype)).square().mean().backward()
    return out.detach(), model.stack.flat_weight.grad.clone()


@pytest.mark.parametrize("conv", ["gcn", "gat", "sage"])
def test_reversible_kernels_equal_plain_autograd_with_pyg_convs(conv):
    """The reference: the same model under plain autograd with PyG's convs
    (``disable=True, kernels=False``), float64, today's float64 tolerance."""
    data = load_circuit("iscas85/c880", task="arrival")
    torch.manual_seed(0)
    model = GSRGNN(data.num_features, 32, 1, num_layers=64, num_groups=4,
                   conv=conv, sparsity=5, dropout=0.1).double().train()
    out_fast, g_fast = _stack_grads(model, data, torch.float64)
    model.disable, model.stack.kernels = True, False
    out_ref, g_ref = _stack_grads(model, data, torch.float64)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-10, atol=0)
    assert ((g_fast - g_ref).norm() / g_ref.norm()).item() <= 1e-10


@pytest.mark.parametrize("conv,fn", [("gcn", "_SpMM"), ("sage", "_SpMM"),
                                     ("gat", "_AttnSpMM")])
@pytest.mark.parametrize("kernels", [True, False])
def test_stack_uses_kernels_and_off_switch(graph, conv, fn, kernels):
    edge_index, n = graph
    L, G = 3, 2
    torch.manual_seed(0)
    stack = GSRStack(8, L, G, conv=conv, kernels=kernels).train()
    pyg_calls = []
    for block in stack.blocks:
        block.conv.register_forward_hook(lambda *a: pyg_calls.append(1))
    x = torch.randn(n, 8, requires_grad=True)
    cls = getattr(csr, fn)
    with mock.patch.object(cls, "apply", side_effect=cls.apply) as kernel_calls:
        stack(x, edge_index).square().sum().backward()
    # one call per group function in the forward, one in the fused backward
    assert kernel_calls.call_count == (2 * L * G if kernels else 0)
    assert len(pyg_calls) == (0 if kernels else 2 * L * G)
    assert stack._kernels is None  # nothing outlives the pass


@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_a_csr_adjacency_goes_to_the_convs_untouched(graph, conv):
    """DPR's core reaches a GSR model as a sparse CSR adjacency, which is no
    edge index (``is_sparse`` is false for it: it was unbound into its N rows
    and dropped, every call). It passes through, builds no CSRGraph, and the
    stack computes what it computes on the same edges as an edge index."""
    from torch_geometric.utils import remove_self_loops

    from leangnn.graphs.sparse import adj_t_of

    # (GCN normalises a CSR's own self-loops otherwise: a known difference)
    edge_index, n = remove_self_loops(graph[0])[0], graph[1]
    adj_t = adj_t_of(edge_index, n)  # as DPR lays out its core
    convs = [CONVS[conv]()]
    with shared_graph(convs, adj_t, n, torch.float32) as shared, \
            mock.patch.object(csr, "CSRGraph", side_effect=AssertionError), \
            csr_kernels(convs, shared, n, torch.float32) as kernels:
        assert shared is adj_t and kernels == [None]
        if conv == "gcn":
            assert convs[0]._cached_edge_index is None
    torch.manual_seed(0)
    stack = GSRStack(8, 3, 2, conv=conv).double().train()
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    grads = []
    for adj in (edge_index, adj_t.to(torch.float64)):
        with mock.patch.object(csr, "CSRGraph", wraps=CSRGraph) as built:
            out = stack(x, adj)
            grads.append((out, *torch.autograd.grad(out.square().sum(), [x])))
        assert built.called == (adj is edge_index)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
