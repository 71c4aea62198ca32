"""TrainConfig: defaults per strategy, sizes, round trip, named errors."""

from __future__ import annotations

import pytest

from leangnn.config import TrainConfig


def test_default_model_follows_strategy():
    assert TrainConfig().model == "res"
    assert TrainConfig(strategy="reversible").model == "gsr"
    assert TrainConfig(strategy="prune").model == "sage"
    assert TrainConfig(strategy="offload", model="gcn").model == "gcn"


def test_round_trip(tmp_path):
    cfg = TrainConfig(dataset="epfl", num_layers=64, sparsity=4, device_budget="1GiB")
    cfg.save(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == cfg
    with pytest.raises(ValueError, match=r"unknown config keys \['layerz'\]"):
        TrainConfig.from_dict({"layerz": 3})


@pytest.mark.parametrize("kw, msg", [
    ({"dropout": 1.0}, "dropout: expected a value in"),
    ({"lr": 0}, "lr: expected a positive learning rate"),
    ({"budget_ratio": 0.0}, "budget_ratio: expected a ratio in"),
    ({"task": "power"}, "task: expected arrival, signal_prob or critical"),
    ({"sparsity": 0}, "sparsity: expected an integer >= 1"),
    ({"hidden_channels": -4}, "hidden_channels: expected a positive integer"),
    ({"offload_mode": "fast"}, "offload_mode: expected exact or recompute"),
    ({"device_budget": "0GiB"}, "device_budget: cannot read '0GiB'"),
])
def test_errors_name_argument_and_value(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TrainConfig(**kw)
