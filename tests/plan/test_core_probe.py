"""One real training step on a piece of DPR's core, as the prune rows run it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GCN

from leangnn.plan.core_probe import (
    PROBE_EDGES,
    known_on_csr,
    piece_of_core,
    probe_core,
)
from leangnn.plan.user_checks import LossFnError, checked_loss


def _core(n: int = 40, e: int = 200, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    row, col = torch.randint(0, n, (2, e), generator=g)
    adj = torch.sparse_coo_tensor(torch.stack([row, col]), torch.rand(e, generator=g),
                                  (n, n)).coalesce().to_sparse_csr()
    # DPR's core keeps int32 indices
    adj = torch.sparse_csr_tensor(adj.crow_indices().int(), adj.col_indices().int(),
                                  adj.values(), (n, n))
    return Data(adj_t=adj, x=torch.randn(n, 4, generator=g),
                y=torch.randint(0, 3, (n,), generator=g), num_nodes=n, name="core")


def test_the_piece_is_the_cores_first_edges_between_the_same_nodes():
    core = _core()
    piece = piece_of_core(core)
    adj, sub = core.adj_t, piece.adj_t
    m = min(PROBE_EDGES, adj.col_indices().numel())
    assert sub.col_indices().numel() == m
    assert sub.crow_indices().dtype == sub.col_indices().dtype == torch.int32
    # reference: the core's first m entries as (row, col, value) triples
    dense = adj.to_dense()
    crow = adj.crow_indices().long()
    rows = torch.repeat_interleave(torch.arange(adj.size(0)), crow.diff())[:m]
    cols = adj.col_indices()[:m].long()
    nodes = torch.unique(torch.cat([rows, cols]))
    assert piece.num_nodes == nodes.numel()
    kept = torch.zeros_like(dense).index_put_((rows, cols), torch.ones(m))
    assert torch.equal(sub.to_dense(), (dense * kept)[nodes][:, nodes])
    assert torch.equal(piece.x, core.x[nodes]) and torch.equal(piece.y, core.y[nodes])
    assert piece.name == "core"  # graph-level entries kept as they are


def test_a_model_that_trains_on_the_core_passes_and_keeps_its_weights():
    model = GCN(4, 8, 2, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert probe_core(model, _core(), lambda out, d: F.cross_entropy(out, d.y),
                      torch.device("cpu")) is None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


class _NoSparse(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, adj_t):
        if adj_t.layout != torch.strided:
            raise TypeError("index must be a dense int64 tensor\nsecond line")
        return self.lin(x)


def test_a_model_the_cores_layout_breaks_is_its_first_error_line():
    why = probe_core(_NoSparse(), _core(), lambda out, d: out.sum(),
                     torch.device("cpu"))
    assert why == "TypeError: index must be a dense int64 tensor"


def test_a_bad_loss_is_the_users_error_not_the_rows():
    with pytest.raises(LossFnError, match="one-element tensor"):
        probe_core(GCN(4, 8, 2, 3), _core(), checked_loss(lambda out, d: 0.0),
                   torch.device("cpu"))


def test_an_edge_list_core_gives_an_edge_list_piece_and_probes():
    from torch_geometric.utils import subgraph

    g = torch.Generator().manual_seed(1)
    n = 50
    ei = torch.randint(0, n, (2, 300), generator=g)
    core = Data(edge_index=ei, x=torch.randn(n, 4, generator=g),
                y=torch.randint(0, 3, (n,), generator=g), num_nodes=n)
    piece = piece_of_core(core)
    first = ei[:, :PROBE_EDGES]
    nodes = torch.unique(first)
    # reference: PyG's subgraph of those nodes, restricted to the first edges
    sub, _ = subgraph(nodes, first, relabel_nodes=True, num_nodes=n)
    assert piece.get("adj_t", None) is None and piece.num_nodes == nodes.numel()
    assert torch.equal(piece.edge_index, sub)
    assert torch.equal(piece.x, core.x[nodes]) and torch.equal(piece.y, core.y[nodes])
    assert probe_core(GCN(4, 8, 2, 3), core, lambda out, d: F.cross_entropy(out, d.y),
                      torch.device("cpu")) is None


class _LayoutDependent(torch.nn.Module):
    """Right outputs on either layout; on a CSR adjacency ``mode`` "nan"
    gives NaN gradients (0 x inf in the backward), "scaled" twice the output."""

    def __init__(self, mode: str):
        super().__init__()
        self.lin, self.mode = torch.nn.Linear(4, 3), mode

    def forward(self, x, adj):
        out = self.lin(x)
        if adj.layout == torch.strided:
            return out
        if self.mode == "nan":
            w = self.lin.weight
            return out + 0 * (w - w).sqrt().sum()
        return 2 * out


@pytest.mark.parametrize("mode, why", [
    ("nan", "the step on its CSR adjacency gives non-finite gradients (on the "
     "same edges as an edge list it does not)"),
    ("scaled", "the step on its CSR adjacency differs from the step on the same "
     "edges as an edge list (relative difference 1.0e+00)"),
])
def test_a_csr_step_that_runs_but_computes_otherwise_is_caught(mode, why):
    # (EdgeCNN's max over a CSR adjacency: right outputs, NaN gradients)
    assert probe_core(_LayoutDependent(mode), _core(), lambda out, d: out.sum(),
                      torch.device("cpu")) == why


def test_duplicates_and_self_loops_do_not_count_as_a_difference():
    """The core's CSR sums duplicate edges into one entry and GCN treats a
    CSR's self-loops its own way: no layout difference for the probe, which
    compares on the piece's entries without self-loops, each once."""
    from leangnn.graphs.sparse import adj_t_of

    g = torch.Generator().manual_seed(2)
    n = 30
    ei = torch.randint(0, n, (2, 120), generator=g)
    ei = torch.cat([ei, ei[:, :20], torch.arange(5).repeat(2, 1)], 1)
    core = Data(adj_t=adj_t_of(ei, n), x=torch.randn(n, 4, generator=g),
                y=torch.randint(0, 3, (n,), generator=g), num_nodes=n)
    assert int(core.adj_t.values().max()) >= 2  # duplicates were summed
    model = GCN(4, 8, 2, 3)
    assert probe_core(model, core, lambda out, d: F.cross_entropy(out, d.y),
                      torch.device("cpu")) is None


def test_a_gradient_of_rounding_alone_does_not_count_as_a_difference():
    """GATConv's ``att_dst`` gets no gradient where every score of a target
    sits on one side of the LeakyReLU (the softmax is then blind to it): its
    ~1e-10 of rounding differed 4x between the two layouts and sent GAT
    models to the edge list for some draws of their weights. Such a tensor is
    measured on the step's scale; a real difference still counts."""
    from torch_geometric.nn import GATConv

    from leangnn.graphs.sparse import adj_t_of
    from leangnn.plan.core_probe import PROBE_RTOL, _difference

    big, tiny = torch.tensor([0.2, -0.1]), torch.tensor([2.6e-10])
    want = [torch.tensor([2.2]), big, tiny]
    assert _difference([want[0], big, tiny + 9.7e-10], want) < PROBE_RTOL
    assert _difference([want[0], big * 1.01, tiny], want) == pytest.approx(0.01,
                                                                          rel=1e-4)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.out = GATConv(4, 8), torch.nn.Linear(8, 3)

        def forward(self, x, adj):
            return self.out(self.conv(x, adj).relu())

    torch.manual_seed(3)
    net = Net()
    with torch.no_grad():  # every score positive: att_dst's gradient is 0
        net.conv.lin.weight.abs_()
        net.conv.att_src.abs_().add_(1.0)
        net.conv.att_dst.abs_().add_(1.0)
    g = torch.Generator().manual_seed(4)
    n = 60
    core = Data(adj_t=adj_t_of(torch.randint(0, n, (2, 300), generator=g), n),
                x=torch.rand(n, 4, generator=g), num_nodes=n,
                y=torch.randint(0, 3, (n,), generator=g))
    assert probe_core(net, core, lambda out, d: F.cross_entropy(out, d.y),
                      torch.device("cpu")) is None


@pytest.mark.parametrize("conv", ["sage", "gcn", "gat"])
def test_our_deep_models_pass_the_probe_so_it_may_skip_them(conv):
    """DPRStrategy.setup and the plan's prune rows skip the probe for our
    GSRGNN and ResGNN (its copy of a 128 x 64 GSR took 9.2 s and +395 MiB):
    on the CSR they compute what the edge list does, checked here by the
    probe itself; a subclass (its forward may differ) is probed."""
    from leangnn.nn.models import GSRGNN, ResGNN

    torch.manual_seed(0)
    loss = lambda out, d: F.cross_entropy(out, d.y)  # noqa: E731
    for model in (GSRGNN(4, 8, 3, 2, num_groups=2, conv=conv),
                  ResGNN(4, 8, 3, 2, conv=conv)):
        assert known_on_csr(model)
        assert probe_core(model, _core(), loss, torch.device("cpu")) is None

    class Mine(ResGNN):
        pass

    assert not known_on_csr(Mine(4, 8, 3, 2)) and not known_on_csr(GCN(4, 8, 2, 3))
