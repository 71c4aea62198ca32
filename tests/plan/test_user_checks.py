"""The checks of what a user hands leangnn.plan and leangnn.fit."""

from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import GCN

from leangnn.plan.user_checks import (
    STRATEGIES,
    LossFnError,
    check_args,
    check_dtypes,
    checked_loss,
    error_line,
    num_classes,
)


@pytest.fixture
def graph():
    return Data(x=torch.randn(5, 3), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]),
                y=torch.tensor([0, 1, 2, 0, 1]))


def _args(graph, **kw):
    args = dict(model=GCN(3, 8, 2, 3), data=graph, device="cpu", strategies=None,
                epochs=1, clip_norm=1.0)
    args.update(kw)
    return args


def test_good_arguments_pass(graph):
    check_args(**_args(graph))
    check_args(**_args(graph, strategies=STRATEGIES, epochs=None, clip_norm=None))
    check_args(**_args(graph, lr=0.01))
    check_args(**_args(graph, lr=0))  # a frozen-weights check run trains nothing
    # a lazy model's parameters are trainable before its first forward
    from torch_geometric.nn import GraphSAGE
    check_args(**_args(graph, model=GraphSAGE(-1, 8, 2, 3)))


@pytest.mark.parametrize("kw, expect", [
    (dict(model="gcn"), r"^model: expected a torch.nn.Module, got str$"),
    (dict(data=[1]), r"^data: expected one torch_geometric.data.Data graph, got "
                     r"list$"),
    (dict(strategies="full"), r"^strategies: expected a tuple of names"),
    (dict(strategies=("full", "fast")), r"^strategies: unknown \['fast'\]"),
    (dict(epochs=0), r"^epochs: expected a positive int, got 0$"),
    (dict(epochs=True), r"^epochs: expected a positive int, got True$"),
    (dict(epochs=2.0), r"^epochs: expected a positive int, got 2.0$"),
    (dict(clip_norm=math.nan), r"^clip_norm: expected a finite number >= 0 or "
                               r"None \(no clipping\), got nan$"),
    (dict(clip_norm=-1), r"^clip_norm: .* got -1$"),
    (dict(device="meta"), r"^device: expected cpu, cuda or cuda:i, got 'meta'$"),
    (dict(lr=-1.0), r"^lr: expected a finite number >= 0, got -1.0$"),
    (dict(lr=math.inf), r"^lr: expected a finite number >= 0, got inf$"),
    (dict(lr="0.01"), r"^lr: expected a finite number >= 0, got '0.01'$"),
    (dict(model=GCN(3, 8, 2, 3).requires_grad_(False)),
     r"^model: GCN has no trainable parameters \(none with requires_grad=True\)"),
])
def test_bad_arguments_are_one_line_naming_them(graph, kw, expect):
    with pytest.raises(ValueError, match=expect):
        check_args(**_args(graph, **kw))


def test_adj_t_without_edge_index_and_meta_parameters_are_refused(graph):
    sparse = Data(x=graph.x, adj_t=torch.eye(5).to_sparse_csr())
    with pytest.raises(ValueError, match=r"^data: has adj_t but no edge_index"):
        check_args(**_args(graph, data=sparse))
    with torch.device("meta"):
        meta = GCN(3, 8, 2, 3)
    with pytest.raises(ValueError, match=r"^model: its parameters are on the meta"):
        check_args(**_args(graph, model=meta))


def test_checked_loss_refuses_what_backward_cannot_take():
    assert checked_loss(None) is None
    loss = torch.tensor(2.0, requires_grad=True)
    assert checked_loss(lambda out, data: loss)(None, None) is loss
    with pytest.raises(LossFnError, match=r"one-element tensor .* got float$"):
        checked_loss(lambda out, data: 1.0)(None, None)
    with pytest.raises(LossFnError, match=r"got a tensor of shape \[2\]$"):
        checked_loss(lambda out, data: torch.ones(2))(None, None)
    assert issubclass(LossFnError, ValueError)


def test_num_classes_only_for_the_default_loss_of_class_ids(graph):
    model = GCN(3, 8, 2, 3)
    assert num_classes(model, graph, None) == 3
    assert num_classes(model, graph, lambda out, data: out.sum()) is None
    regression = Data(x=graph.x, edge_index=graph.edge_index, y=torch.randn(5))
    assert num_classes(model, regression, None) is None
    model.out_channels = True  # not a class count
    assert num_classes(model, graph, None) is None


def test_check_dtypes_names_both_types(graph):
    model = GCN(3, 8, 2, 3)
    check_dtypes(model, graph)
    graph.x = graph.x.double()
    with pytest.raises(ValueError, match=r"^data: x is float64, the model's "
                       r"parameters are float32; .*data.x.to\(torch.float32\)"):
        check_dtypes(model, graph)
    graph.x = torch.ones(5, 3, dtype=torch.long)  # ids, embedded by the model
    check_dtypes(model, graph)


def test_error_line_is_the_type_and_the_first_line():
    assert error_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert error_line(RuntimeError()) == "RuntimeError"
