"""The fake-tensor dry run against real training steps (plain autograd, the
live-bytes meter of leangnn.profile)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.nn import GCNConv

from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.estimate import default_loss
from leangnn.plan.fake import UnsupportedOpError, trace_step
from leangnn.profile import LiveBytesMeter
from leangnn.strategy import FullBatch


@pytest.fixture(scope="module")
def graph():
    g = contextual_sbm(400, avg_degree=8.0, in_channels=12, seed=1)
    return with_mask(g, g.train_mask)  # a masked loss: boolean indexing


def real_peak(model, data, loss_fn, clip_norm=1.0):
    """Live tensor bytes of one real Trainer step (excluding the loaded state)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loaded = [*model.parameters(), *(v for v in data.to_dict().values()
                                     if isinstance(v, torch.Tensor))]
    with LiveBytesMeter(exclude=loaded) as meter:
        opt.zero_grad(set_to_none=True)
        FullBatch("cpu").train_step(model, data, loss_fn)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        opt.step()
    return meter.peak


CASES = [
    ("res", dict(conv="sage")),
    ("res", dict(conv="gcn", dropout=0.2)),
    ("res", dict(conv="gat")),
    ("gsr", dict(conv="sage", num_groups=2)),
    ("gsr", dict(conv="gcn", num_groups=2, sparsity=2, dropout=0.1)),
    ("sage", {}),
    ("gcn", {}),
    ("gat", dict(dropout=0.3)),
]


@pytest.mark.parametrize("name,opts", CASES, ids=[f"{n}-{o.get('conv', '')}"
                                                  for n, o in CASES])
def test_fake_peak_matches_real_step(graph, name, opts):
    torch.manual_seed(0)
    depth = 2 if name == "gsr" else 3
    model = build_model(name, graph.num_features, 16, 8, depth, **opts)
    loss_fn = default_loss(graph)
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    trace = trace_step(model, graph, loss_fn)
    # the dry run draws no random numbers and leaves the model alone
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    real = real_peak(model, graph, loss_fn)
    assert trace.peak_bytes == pytest.approx(real, rel=0.02)
    assert set(trace.phases) == {"forward", "backward", "optimizer"}
    assert trace.ops > 0 and trace.flops > 0


def test_data_dependent_shapes_of_the_graph_are_followed():
    # GCNConv adds self loops through a boolean mask of the edges (nonzero):
    # the dry run needs the real edge index, and gets the same bytes.
    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=2)
    g.edge_index = torch.cat([g.edge_index, torch.arange(20).repeat(2, 1)], 1)
    conv = GCNConv(8, 32)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = conv, torch.nn.Linear(32, 8)

        def forward(self, x, edge_index):
            return self.head(self.conv(x, edge_index).relu())

    torch.manual_seed(0)
    model = Net()
    loss_fn = default_loss(g)
    assert trace_step(model, g, loss_fn).peak_bytes == pytest.approx(
        real_peak(model, g, loss_fn), rel=0.02)


class _FeatureMask(torch.nn.Module):
    """Selects nodes by a mask computed from features: a shape no dry run knows."""

    def __init__(self, c):
        super().__init__()
        self.lin = torch.nn.Linear(c, 8)

    def forward(self, x, edge_index):
        h = self.lin(x)
        return h[h[:, 0] > 0].sum(0, keepdim=True).expand_as(h)


def test_feature_dependent_shape_raises_clear_error(graph):
    with pytest.raises(UnsupportedOpError, match="value-dependent"):
        trace_step(_FeatureMask(graph.num_features), graph, default_loss(graph))
