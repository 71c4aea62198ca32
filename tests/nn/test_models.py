"""Models by name: shapes, the shared block, and ResGNN against a hand-written
plain-PyG reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from leangnn.nn import (
    GSRGNN,
    MODELS,
    GSRBlock,
    ResGNN,
    build_conv,
    build_model,
    get_model,
    model_arguments,
    register_model,
)


@pytest.fixture(scope="module")
def graph():
    gen = torch.Generator().manual_seed(0)
    n = 60
    x = torch.randn(n, 7, generator=gen)
    edge_index = torch.randint(0, n, (2, 240), generator=gen)
    return x, edge_index


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_builds_and_runs(graph, name):
    x, ei = graph
    if "dag" in MODELS[name].capabilities:
        ei = ei[:, ei[0] < ei[1]]  # propagates in topological order: a DAG
    model = build_model(name, 7, 16, 3, num_layers=4, conv="sage", dropout=0.1,
                        num_groups=4, sparsity=2)
    out = model(x, ei)
    assert out.shape == (60, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_build_model_errors():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        build_model("nope", 4, 8, 1, 2)
    with pytest.raises(ValueError, match="num_layers"):
        build_model("gsr", 4, 8, 1, 0)
    with pytest.raises(ValueError, match="num_groups"):
        build_model("res", 4, 8, 1, 2, num_groups=3)
    with pytest.raises(ValueError, match="unknown conv"):
        build_conv("mlp", 4, 4)
    # None means "model default" (how a CLI passes unset options)
    assert isinstance(build_model("gsr", 4, 8, 1, 2, sparsity=None, num_groups=None),
                      GSRGNN)


@pytest.mark.parametrize("conv,cls", [("sage", SAGEConv), ("gcn", GCNConv),
                                      ("gat", GATConv)])
def test_resgnn_matches_plain_pyg_reference(graph, conv, cls):
    """ResGNN with ReLU equals h + conv(relu(layer_norm(h))) written out by hand."""
    x, ei = graph
    torch.manual_seed(0)
    model = ResGNN(7, 16, 2, num_layers=3, conv=conv).eval()
    assert all(isinstance(b, GSRBlock) and isinstance(b.conv, cls)
               for b in model.blocks)
    h = model.encoder(x)
    for b in model.blocks:
        z = F.relu(F.layer_norm(h, (16,), b.norm.weight, b.norm.bias))
        h = h + b.conv(z, ei)
    ref = model.head(F.relu(model.out_norm(h)))
    torch.testing.assert_close(model(x, ei), ref, rtol=0, atol=0)


def test_resgnn_sparse_blocks_use_groups(graph):
    x, ei = graph
    model = ResGNN(7, 16, 1, num_layers=2, num_groups=4, sparsity=1).eval()
    block = model.blocks[0]
    assert block.act.k == 1 and block.act.group_size == 4
    z = block.act(block.norm(model.encoder(x)))
    # at most one survivor per group of 4 channels
    assert ((z != 0).view(60, 4, 4).sum(-1) <= 1).all()


def test_gsrgnn_disable_switch(graph):
    model = GSRGNN(7, 16, 1, 3, num_groups=2)
    assert not model.disable
    model.disable = True
    assert model.stack.disable
    assert "num_layers=3" in repr(model) and "k=relu" in repr(model)


def test_resgnn_dropout_is_active_only_in_training(graph):
    x, ei = graph
    torch.manual_seed(0)
    model = ResGNN(7, 16, 1, num_layers=2, dropout=0.5)
    model.train()
    a, b = model(x, ei), model(x, ei)
    assert not torch.equal(a, b)
    model.eval()
    torch.testing.assert_close(model(x, ei), model(x, ei), rtol=0, atol=0)


# --------------------------------------------------------------- registry
@pytest.fixture
def scratch_model():
    """Register models for one test and remove them afterwards."""
    added = []

    def register(name, target, **kw):
        added.append(name)
        return register_model(name, target, **kw)

    yield register
    for name in added:
        MODELS.pop(name, None)


class _Tiny(torch.nn.Module):
    """A registry test model that takes only ``dropout`` among the options."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers,
                 dropout=0.5):
        super().__init__()
        self.dropout = dropout
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.lin(x)


def test_build_model_passes_only_what_the_constructor_names(scratch_model):
    scratch_model("tiny", _Tiny)
    every = dict(dropout=0.1, conv="gcn", num_groups=4, sparsity=2,
                 flat_parameters=False)
    assert model_arguments("tiny", **every) == {"dropout": 0.1}
    assert build_model("tiny", 3, 8, 2, 5, **every).dropout == 0.1
    # None means the model's own default
    assert build_model("tiny", 3, 8, 2, 5, dropout=None).dropout == 0.5
    assert model_arguments("res", **every) == {
        "dropout": 0.1, "conv": "gcn", "num_groups": 4, "sparsity": 2}
    assert model_arguments("gsr", **every) == every
    assert model_arguments("sage", **every) == {"dropout": 0.1}


def test_lazy_target_resolves_on_first_use(scratch_model):
    entry = scratch_model("lazy_res", "leangnn.nn.models:ResGNN",
                          description="the same ResGNN, named lazily")
    assert entry.target == "leangnn.nn.models:ResGNN"
    torch.manual_seed(0)
    a = build_model("lazy_res", 7, 16, 1, 2)
    torch.manual_seed(0)
    b = build_model("res", 7, 16, 1, 2)
    assert entry.target is ResGNN and type(a) is ResGNN
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    scratch_model("broken", "leangnn.nn.models")
    with pytest.raises(ValueError, match="expected 'package.module:attr'"):
        build_model("broken", 7, 16, 1, 2)


def test_register_model_capabilities_and_errors(scratch_model):
    e = scratch_model("tiny_rev", _Tiny, reversible=True, capabilities=("dag",))
    assert e.reversible and e.capabilities == {"reversible", "dag"}
    assert get_model("tiny_rev") is e and "tiny_rev" in MODELS
    assert MODELS["gsr"].reversible and not MODELS["res"].reversible
    assert {n for n, m in MODELS.items() if "layerwise" in m.capabilities} >= {
        "gcn", "sage", "gat", "gin"}
    with pytest.raises(ValueError, match="'tiny_rev' is already registered"):
        register_model("tiny_rev", _Tiny)
    scratch_model("tiny_rev", GSRGNN, reversible=True, replace=True)
    assert MODELS["tiny_rev"].target is GSRGNN
    with pytest.raises(ValueError, match="must be an identifier"):
        register_model("no way", _Tiny)
    with pytest.raises(ValueError, match="unknown model 'gone'"):
        get_model("gone")


@pytest.mark.parametrize("conv", ["gcn", "gat", "sage"])
def test_gsrgnn_kernels_switch(conv):
    """``GSRGNN(kernels=False)`` runs PyG's convs; the CSR kernels (default)
    agree with them to rounding in float64, outputs and gradients."""
    torch.manual_seed(0)
    x = torch.randn(40, 5, dtype=torch.float64)
    edge_index = torch.randint(0, 40, (2, 160))
    edge_index = edge_index[:, edge_index[0] != edge_index[1]].unique(dim=1)
    grads = {}
    for kernels in (True, False):
        torch.manual_seed(1)
        m = GSRGNN(5, 16, 2, 3, num_groups=2, conv=conv,
                   kernels=kernels).double()
        assert m.stack.kernels is kernels
        out = m(x, edge_index)
        out.square().sum().backward()
        grads[kernels] = (out.detach(), [p.grad.clone() for p in m.parameters()])
    (a, ga), (b, gb) = grads[True], grads[False]
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for p, q in zip(ga, gb):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-11)
