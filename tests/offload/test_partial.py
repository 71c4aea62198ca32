"""Edge-split hub jobs: exact against PyG full batch for every policy."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphConv
from torch_geometric.nn.models import GAT, GIN, GraphSAGE
from torch_geometric.nn.models.basic_gnn import BasicGNN
from torch_geometric.utils import coalesce

from leangnn.graphs.synthetic import power_law_graph
from leangnn.nn.models import build_model
from leangnn.offload import BudgetError, OffloadEngine
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.partial import Piece, piece_kernel
from leangnn.plan.vertex import full_batch_vertex_bytes

POLICIES = ("none", "lru", "degree", "st")


class _GraphConvNet(BasicGNN):
    supports_edge_weight = True
    supports_edge_attr = False

    def init_conv(self, in_channels, out_channels, **kwargs):
        return GraphConv(in_channels, out_channels, **kwargs)


def _graph(n=160, dtype=torch.float64, seed=0):
    """A power-law graph plus two hubs: node 0 hears every node (a self-loop
    included), node 5 every other node."""
    d = power_law_graph(n, avg_degree=5, in_channels=8, num_classes=4, seed=seed)
    d.x = d.x.to(dtype)
    every = torch.arange(n)
    half = torch.arange(0, n, 2)
    hubs = torch.cat([torch.stack([every, torch.zeros_like(every)]),
                      torch.stack([half, torch.full_like(half, 5)])], 1)
    d.edge_index = coalesce(torch.cat([d.edge_index, hubs], 1), num_nodes=n)
    return d


def _model(name, dtype=torch.float64):
    torch.manual_seed(0)
    if name in ("sage-max", "sage-min"):
        m = GraphSAGE(8, 16, 2, out_channels=4, aggr=name.split("-")[1])
    elif name == "gatv2":
        m = GAT(8, 16, 2, out_channels=4, v2=True, heads=2)
    elif name == "gin":
        m = GIN(8, 16, 2, out_channels=4)
    elif name == "graphconv":
        m = _GraphConvNet(8, 16, 2, out_channels=4)
    else:
        m = build_model(name, 8, 16, 4, 2, dropout=0.0)
    return m.to(dtype)


def loss_fn(out, data):
    return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _reference(model, data):
    out = model(data.x, data.edge_index)
    loss = loss_fn(out, data)
    return float(loss.detach()), torch.autograd.grad(loss, list(model.parameters()))


def _check(eng, model, data, ref_loss, ref_grads, tol):
    model.zero_grad(set_to_none=True)
    loss = eng.train_step(loss_fn, data)
    assert abs(loss - ref_loss) <= tol * abs(ref_loss)
    for p, r in zip(model.parameters(), ref_grads):
        err = (p.grad - r).abs().max() / r.abs().max().clamp_min(1e-30)
        assert err <= tol, f"relative gradient error {float(err):.3e} > {tol}"
    model.zero_grad(set_to_none=True)


def _tight(model, data, policy, frac=0.8):
    # cached policies give jobs half of what is left: the same workspace
    if policy != "none":
        frac *= 2
    return OffloadEngine(model, data, int(frac * full_batch_vertex_bytes(
        model, data.num_nodes)), 3, policy)


@pytest.mark.parametrize("name", ["gcn", "sage-max", "sage-min", "gat", *(
    pytest.param(n, marks=pytest.mark.slow) for n in ("sage", "gatv2", "gin",
                                                      "graphconv"))])
def test_split_hubs_are_exact_in_float64_for_every_policy(name):
    data, model = _graph(), _model(name)
    ref = _reference(model, data)
    for policy in POLICIES:
        eng = _tight(model, data, policy)
        pieces = [ch.piece for ch in eng.sched.chunks if ch.piece is not None]
        assert {p.node for p in pieces} >= {0, 5}  # the hubs really were split
        _check(eng, model, data, *ref, 1e-10)
        c = eng.counters
        assert c.vertex_layer_computations == 2 * data.num_nodes
        assert c.peak_device_bytes <= eng.budget


@pytest.mark.parametrize("name", ["gcn", "sage-max", "gat"])
def test_split_hubs_are_exact_in_float32(name):
    data, model = _graph(dtype=torch.float32), _model(name, torch.float32)
    ref = _reference(model, data)
    for policy in ("st", "none"):
        _check(_tight(model, data, policy), model, data, *ref, 1e-5)


@pytest.mark.parametrize("name", ["sage-max", "sage-min"])
def test_extremum_ties_across_pieces_split_the_gradient_like_pyg(name):
    # integer features: many exact ties inside and across pieces
    data, model = _graph(), _model(name)
    data.x = torch.randint(0, 3, data.x.shape).to(data.x.dtype)
    _check(_tight(model, data, "lru"), model, data, *_reference(model, data), 1e-10)


def test_strict_measured_bytes_of_pieces_stay_under_budget():
    data, model = _graph(), _model("gat")
    budget = int(1.6 * full_batch_vertex_bytes(model, data.num_nodes))
    eng = OffloadEngine(model, data, budget, 3, "st", strict=True)
    assert eng.sched.num_pieces > 0
    _check(eng, model, data, *_reference(model, data), 1e-10)
    assert 0 < eng.counters.peak_device_bytes_measured <= budget


def test_counting_replay_with_pieces_counts_the_same():
    data, model = _graph(), _model("sage")
    budget = int(1.6 * full_batch_vertex_bytes(model, data.num_nodes))
    real = OffloadEngine(model, data, budget, 3, "st")
    assert real.sched.num_pieces > 0
    _check(real, model, data, *_reference(model, data), 1e-10)
    virt = OffloadEngine(model, data, budget, 3, "st", virtual=True)
    assert virt.simulate().to_dict() == real.counters.to_dict()


def test_predict_with_pieces_matches_full_forward():
    data, model = _graph(), _model("gat")
    model.eval()
    out = _tight(model, data, "degree").predict()
    assert torch.allclose(out, model(data.x, data.edge_index), rtol=1e-10,
                          atol=1e-12)


@pytest.mark.parametrize("policy", ["none", "st"])
def test_budget_below_one_edge_names_node_in_degree_and_minimum(policy):
    data, model = _graph(40), _model("gcn")
    resident = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    with pytest.raises(BudgetError) as e:
        OffloadEngine(model, data, resident + 2048, 3, policy)
    msg = str(e.value)
    assert "\n" not in msg
    m = re.search(r"node (\d+) with (\d+) in-edges.*at least (\d+) bytes", msg)
    node, deg, need = (int(g) for g in m.groups())
    # GCN's normalisation adds a self-loop to every node
    assert deg == int((data.edge_index[1] == node).sum()) + 1
    with pytest.raises(BudgetError):
        OffloadEngine(model, data, need - 1, 3, policy)
    eng = OffloadEngine(model, data, need, 3, policy)
    assert eng.sched.num_pieces > 0
    _check(eng, model, data, *_reference(model, data), 1e-10)


def test_kernel_refuses_what_it_cannot_split():
    sage = GraphSAGE(4, 4, 1, aggr="std").convs[0]
    with pytest.raises(ValueError, match="aggr='std'"):
        piece_kernel(sage)
    with pytest.raises(ValueError, match="cannot be split"):
        piece_kernel(torch.nn.Linear(2, 2))
    lw = LayerwiseModel(build_model("gat", 4, 8, 2, 2, dropout=0.5).train())
    x, ei = torch.randn(3, 4), torch.tensor([[1, 2], [0, 0]])
    with pytest.raises(ValueError, match="attention dropout"):
        lw.piece(0, False, Piece(0, 0, 2, 2), x, ei)


@pytest.mark.parametrize("name", ["gcn", "sage", "sage-max", "gat", "gatv2", "gin",
                                  "graphconv"])
def test_pieces_of_one_layer_equal_the_pyg_conv(name):
    """Layer level: a hub's 3 pieces against the PyG conv on all its edges
    (the model's second layer, so the input gradient is returned too)."""
    model = _model(name).train()
    lw = LayerwiseModel(model)
    gen = torch.Generator().manual_seed(1)
    n = 40
    x = torch.randn(n, 16, generator=gen, dtype=torch.float64)
    src = torch.cat([torch.arange(n), torch.arange(1, n, 3)])  # self-loop, repeats
    ei, w = lw.topology(torch.stack([src, torch.zeros_like(src)]), n)
    keep = ei[1] == 0
    ei, w = ei[:, keep], None if w is None else w[keep]
    if name == "graphconv":
        w = torch.rand(ei.size(1), generator=gen, dtype=torch.float64)
    g = torch.randn(1, 4, generator=gen, dtype=torch.float64)
    params = list(model.convs[1].parameters())
    xr = x.clone().requires_grad_()
    ref = lw.layer(1, xr, ei, 1, w)
    want = torch.autograd.grad(ref, [xr, *params], g)
    cuts = [0, 7, 20, ei.size(1)]
    pieces = [Piece(0, i, 3, ei.size(1)) for i in range(3)]

    def part(i):
        s = slice(cuts[i], cuts[i + 1])
        return ei[:, s], None if w is None else w[s]

    for i in range(3):
        out = lw.piece(1, False, pieces[i], x, *part(i))
        assert out.shape == ((1, 4) if i == 2 else (0, 4))
    assert torch.allclose(out, ref.detach(), rtol=1e-12, atol=1e-12)
    model.zero_grad(set_to_none=True)
    gx = torch.zeros_like(x)
    for i in (2, 1, 0):  # backward: the owner first
        gx += lw.piece(1, True, pieces[i], x, *part(i), grad=g)
    assert want[0].abs().sum() > 0
    assert torch.allclose(gx, want[0], rtol=1e-10, atol=1e-12)
    for p, r in zip(params, want[1:]):
        assert torch.allclose(p.grad, r, rtol=1e-10, atol=1e-12)
    assert not lw.partial.state  # a hub's state is dropped after its backward
