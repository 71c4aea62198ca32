"""shared_graph: convs computing on a shared preprocessing equal PyG's own calls."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv
from torch_geometric.nn.conv import gcn_conv

from leangnn.nn import GSRStack
from leangnn.nn.shared_graph import shared_graph


def _convs(kind, n, dtype):
    torch.manual_seed(0)
    make = {"gcn": lambda: GCNConv(8, 8), "gcn_improved": lambda: GCNConv(
        8, 8, improved=True), "gat": lambda: GATConv(8, 8, heads=2, concat=False),
        "sage": lambda: SAGEConv(8, 8)}
    kinds = kind.split("+")
    return [make[kinds[i % len(kinds)]]().to(dtype) for i in range(n)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["gcn", "gat", "gcn+gcn_improved", "gcn+gat",
                                  "gcn+sage", "sage"])
def test_outputs_bit_equal_to_per_call_preprocessing(graph, kind, dtype):
    edge_index, n = graph
    convs = _convs(kind, 4, dtype)
    x = torch.randn(n, 8, dtype=dtype)
    ref = [c(x, edge_index) for c in convs]
    with shared_graph(convs, edge_index, n, dtype) as shared:
        got = [c(x, shared) for c in convs]
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    # state restored: the convs preprocess on their own again
    for c in convs:
        if isinstance(c, GCNConv):
            assert c._cached_edge_index is None
        if isinstance(c, GATConv):
            assert c.add_self_loops


def test_state_restored_when_the_block_raises(graph):
    edge_index, n = graph
    convs = _convs("gcn+gat", 2, torch.float32)
    with pytest.raises(RuntimeError, match="boom"):
        with shared_graph(convs, edge_index, n, torch.float32):
            assert convs[0]._cached_edge_index is not None
            assert not convs[1].add_self_loops
            raise RuntimeError("boom")
    assert convs[0]._cached_edge_index is None and convs[1].add_self_loops


def test_extra_arguments_and_cached_convs_are_left_alone(graph):
    edge_index, n = graph
    convs = _convs("gcn+gat", 2, torch.float32)
    with shared_graph(convs, edge_index, n, torch.float32, plain=False) as shared:
        assert shared is edge_index
        assert convs[0]._cached_edge_index is None and convs[1].add_self_loops
    cached = GCNConv(8, 8, cached=True)
    with shared_graph([cached], edge_index, n, torch.float32):
        assert cached._cached_edge_index is None


@pytest.mark.parametrize("share,expected", [(True, 2), (False, 2 * 3 * 2)])
def test_stack_normalises_once_per_pass(graph, share, expected):
    """A training step of a GCN stack normalises the graph once in the forward
    and once in the backward, not once per group function call."""
    edge_index, n = graph
    torch.manual_seed(0)
    stack = GSRStack(8, 3, 2, conv="gcn", share_graph=share).double().train()
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    real = gcn_conv.gcn_norm
    with mock.patch.object(gcn_conv, "gcn_norm", side_effect=real) as counted:
        stack(x, edge_index).square().sum().backward()
    assert counted.call_count == expected
