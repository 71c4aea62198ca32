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
    get_strategy,
    node_mask,
    option_choices,
    register_strategy,
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
