"""The base strategy is plain autograd: its gradients equal a hand-written step;
the strategy registry builds, lists and checks strategies by name."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch_geometric.data import Data

from leangnn.nn.models import build_model
from leangnn.strategy import (
    STRATEGIES,
    FullBatch,
    Strategy,
    build_strategy,
    forward_kwargs,
    get_strategy,
    node_mask,
    option_choices,
    register_strategy,
    takes_batch,
    uses_batch,
    uses_edge_attr,
)
from leangnn.train import make_loss_fn


def test_full_batch_step_equals_manual_autograd():
    torch.manual_seed(0)
    g = Data(x=torch.randn(30, 5, dtype=torch.float64),
             edge_index=torch.randint(30, (2, 90)),
             y=torch.randn(30, dtype=torch.float64))
    model = build_model("res", 5, 8, 1, 3).double()
    loss_fn = make_loss_fn("regression")
    loss = FullBatch().train_step(model, g, loss_fn)
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = torch.nn.functional.mse_loss(model(g.x, g.edge_index).view(-1), g.y)
    ref.backward()
    assert abs(loss - float(ref.detach())) < 1e-12
    for a, p in zip(ours, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-12, atol=0)
    assert node_mask(g) is None
    out = FullBatch().predict(model, g)
    assert out.shape == (30, 1) and not out.requires_grad


def _edge_graph():
    torch.manual_seed(0)
    return Data(x=torch.randn(40, 5, dtype=torch.float64),
                edge_index=torch.randint(40, (2, 160)),
                edge_attr=torch.randn(160, 3, dtype=torch.float64),
                y=torch.randn(40, dtype=torch.float64))


def test_full_batch_gives_edge_features_to_a_model_that_takes_them():
    """A PyG GAT with edge_dim sees data.edge_attr as a user's own call would
    give it (before, it trained without them, silently); GCN (which ignores
    them), a forward that names none and our deep models (**kwargs handed to
    convs) are called as before."""
    from torch_geometric.nn import GAT, GCN

    g = _edge_graph()
    gat = GAT(5, 8, 2, 1, edge_dim=3).double()
    assert uses_edge_attr(gat, g) and not uses_edge_attr(gat, Data(x=g.x))
    loss_fn = make_loss_fn("regression")
    loss = FullBatch().train_step(gat, g, loss_fn)
    ours = [p.grad.clone() for p in gat.parameters()]
    gat.zero_grad()
    out = gat(g.x, g.edge_index, edge_attr=g.edge_attr)
    ref = torch.nn.functional.mse_loss(out.view(-1), g.y)
    ref.backward()
    assert abs(loss - float(ref.detach())) < 1e-12
    for a, p in zip(ours, gat.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-12, atol=0)
    # without them the output differs: the edge features are used
    assert not torch.allclose(gat(g.x, g.edge_index), out)

    class Plain(torch.nn.Module):  # forward(x, edge_index) only
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 1).double()

        def forward(self, x, edge_index):
            return self.lin(x)

    for model in (GCN(5, 8, 2, 1).double(), Plain(),
                  build_model("res", 5, 8, 1, 2, conv="sage").double()):
        assert not uses_edge_attr(model, g)
        assert "edge_attr" not in forward_kwargs(model, g)
        FullBatch().train_step(model, g, loss_fn)  # no TypeError


def test_full_batch_gives_the_batch_vector_to_a_model_that_reads_it():
    """On several graphs (``data.batch``) a forward naming ``batch`` gets it,
    as a PyG loop over a ``DataLoader`` would pass it; a ``BasicGNN`` only
    where its norms read it (GraphNorm), and nothing on one graph."""
    from torch_geometric.nn import GCN, global_add_pool

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 1).double()

        def forward(self, x, edge_index, batch=None):
            return global_add_pool(self.lin(x), batch)

    g = _edge_graph()
    g.batch = (torch.arange(g.num_nodes) >= g.num_nodes // 2).long()
    model = Pooled()
    assert takes_batch(model) and uses_batch(model, g)
    assert forward_kwargs(model, g)["batch"] is g.batch
    assert not uses_batch(model, Data(x=g.x, edge_index=g.edge_index))
    out = FullBatch().forward(model, g)
    assert out.shape == (2, 1)  # one row per graph, not one pooled row
    torch.testing.assert_close(out, model(g.x, g.edge_index, g.batch))
    assert not takes_batch(GCN(5, 8, 2, 1)) and not takes_batch(
        GCN(5, 8, 2, 1, norm="batch_norm"))
    assert takes_batch(GCN(5, 8, 2, 1, norm="graph_norm"))


# --------------------------------------------------------------- registry
def test_build_strategy_by_name():
    from leangnn.config import TrainConfig
    from leangnn.offload import OffloadStrategy
    from leangnn.prune.dpr import DPRStrategy

    full = build_strategy(TrainConfig())
    rev = build_strategy(TrainConfig(strategy="reversible"))
    assert type(full) is FullBatch and type(rev) is FullBatch
    dpr = build_strategy(TrainConfig(strategy="prune", budget_ratio=0.5,
                                     num_anchors=3))
    assert isinstance(dpr, DPRStrategy)
    assert (dpr.config.budget_ratio, dpr.config.num_anchors) == (0.5, 3)
    off = build_strategy(TrainConfig(strategy="offload", device_budget="64MiB",
                                     num_parts=3, cache="lru"))
    assert isinstance(off, OffloadStrategy)
    assert (off.device_budget, off.num_parts, off.cache) == (64 << 20, 3, "lru")
    assert STRATEGIES["offload"].target is OffloadStrategy  # resolved once


def test_importing_config_and_registries_imports_no_strategy_package():
    code = ("import sys, leangnn.config, leangnn.strategy, leangnn.nn.models; "
            "print(sorted(m for m in sys.modules if m.startswith(("
            "'leangnn.offload', 'leangnn.prune'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


class _Echo(Strategy):
    name = "echo"

    @classmethod
    def from_config(cls, cfg):
        s = cls(cfg.device)
        s.seen = cfg
        return s


@pytest.fixture
def echo_strategy():
    entry = register_strategy("echo", _Echo, default_model="gat",
                              requires=("layerwise",),
                              choices={"cache": ("lru", "mine")})
    yield entry
    STRATEGIES.pop("echo")


def test_registered_strategy_reaches_config_cli_and_builder(echo_strategy, capsys):
    from leangnn.cli import build_parser, main
    from leangnn.config import ConfigError, TrainConfig

    cfg = TrainConfig(strategy="echo", cache="mine")
    assert cfg.model == "gat"  # its default model
    s = build_strategy(cfg)
    assert isinstance(s, _Echo) and s.seen is cfg
    assert option_choices("cache")[-1] == "mine"
    with pytest.raises(ConfigError, match="strategy 'echo' needs a layerwise model"):
        TrainConfig(strategy="echo", model="res")
    help_text = build_parser()._subparsers._group_actions[0].choices[
        "train"].format_help()
    assert "echo" in help_text and "mine" in help_text
    assert main(["train", "--strategy", "echo", "--model", "gsr"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leangnn: error: model: strategy 'echo' needs a "
                          "layerwise model")


def test_registered_strategy_disappears_with_its_entry(echo_strategy, capsys):
    from leangnn.cli import main
    from leangnn.config import ConfigError, TrainConfig

    STRATEGIES.pop("echo")
    with pytest.raises(ConfigError, match="strategy: expected full, reversible, "
                       "prune.*, got 'echo'"):
        TrainConfig(strategy="echo")
    assert main(["train", "--strategy", "echo"]) == 2
    assert "invalid choice: 'echo'" in capsys.readouterr().err
    STRATEGIES["echo"] = echo_strategy  # for the fixture's teardown


def test_register_strategy_errors(echo_strategy):
    with pytest.raises(ValueError, match="'echo' is already registered"):
        register_strategy("echo", _Echo, default_model="sage")
    with pytest.raises(ValueError, match="must be an identifier"):
        register_strategy("", _Echo, default_model="sage")
    with pytest.raises(ValueError, match="strategy: expected .*got 'nope'"):
        get_strategy("nope")


def test_a_model_whose_forward_takes_the_graph_is_called_with_it():
    """PyG's introduction writes ``forward(self, data)``; graph-level
    examples ``forward(self, batch)``: such a model gets the ``Data``."""
    from leangnn.strategy import call_model, takes_data

    class Intro(torch.nn.Module):
        def forward(self, data):
            return data.x * 2

    class Pooled(torch.nn.Module):
        def forward(self, batch, scale: float = 1.0):
            return batch.x * scale

    class Plain(torch.nn.Module):
        def forward(self, x, edge_index):
            return x + 1

    class Features(torch.nn.Module):  # one tensor in: the features
        def forward(self, x):
            return x

    class Star(torch.nn.Module):
        def forward(self, *args):
            return args[0]

    assert takes_data(Intro()) and takes_data(Pooled())
    assert not any(takes_data(m) for m in (Plain(), Features(), Star()))
    g = Data(x=torch.ones(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]))
    assert torch.equal(FullBatch().forward(Intro(), g), torch.full((3, 2), 2.0))
    assert torch.equal(FullBatch().forward(Plain(), g), torch.full((3, 2), 2.0))
    # DPR's core hands a sparse adjacency in place of edge_index
    adj = torch.eye(3).to_sparse_csr()
    seen = {}

    class Reads(torch.nn.Module):
        def forward(self, data):
            seen["adj"] = data.edge_index
            return data.x

    call_model(Reads(), g, g.x, adj)
    assert seen["adj"] is adj and g.edge_index.shape == (2, 2)  # g untouched
