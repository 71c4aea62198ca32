"""The calibrated heap family of a user's model (``calibrated_as``)."""

from __future__ import annotations

import torch
import torch_geometric.nn as pyg
from torch_geometric.nn import GAT, GCN, PNA, GraphSAGE

from leangnn.nn.models import build_model
from leangnn.plan.families import CONV_FAMILIES, calibrated_as


class _Wrap(torch.nn.Module):
    def __init__(self, *inner):
        super().__init__()
        self.inner = torch.nn.ModuleList(inner)
        self.head = torch.nn.Linear(8, 2)


def test_registered_classes_their_wrappers_and_conv_stacks_have_a_family():
    assert calibrated_as(GCN(4, 8, 2, 2)) == {"model": "GCN", "family": "gcn"}
    assert calibrated_as(build_model("res", 4, 8, 2, 3, conv="gat")) == {
        "model": "ResGNN", "family": "res", "conv": "gat"}
    # a wrapper, nested or not, of one family and knobs: its family
    assert calibrated_as(_Wrap(_Wrap(GraphSAGE(4, 8, 2, 8)), GraphSAGE(4, 8, 3, 8))) \
        == {"model": "_Wrap", "family": "sage"}
    assert calibrated_as(_Wrap(build_model("gsr", 4, 8, 8, 4, num_groups=4))) == {
        "model": "_Wrap", "family": "gsr", "conv": "sage", "num_groups": 4}
    # a stack of one family's convs (GATConv and GATv2Conv are both gat)
    stack = pyg.Sequential("x, edge_index", [
        (pyg.GATConv(4, 8), "x, edge_index -> x"),
        (pyg.GATv2Conv(8, 8), "x, edge_index -> x")])
    assert calibrated_as(stack) == {"model": "Sequential", "family": "gat"}
    assert set(CONV_FAMILIES.values()) == {"gcn", "sage", "gat", "gin"}


def test_mixed_or_unknown_insides_keep_the_largest_factor():
    deg = torch.tensor([0, 2, 3])
    for model in (
            _Wrap(GCN(4, 8, 2, 8), GAT(4, 8, 2, 8)),  # two families
            _Wrap(build_model("res", 4, 8, 8, 2, conv="gcn"),
                  build_model("res", 4, 8, 8, 2, conv="sage")),  # two knobs
            PNA(4, 8, 2, 2, aggregators=["mean"], scalers=["identity"], deg=deg),
            _Wrap(pyg.SAGEConv(4, 8), pyg.TransformerConv(8, 8)),
            _Wrap(torch.nn.Linear(4, 8))):  # no message passing at all
        assert calibrated_as(model) == {"model": type(model).__name__}

    class MyConv(pyg.SAGEConv):  # a subclass may pass other messages
        pass

    assert calibrated_as(_Wrap(MyConv(4, 8))) == {"model": "_Wrap"}
