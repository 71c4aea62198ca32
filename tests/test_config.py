"""TrainConfig: defaults per strategy, sizes, round trip, named errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from leangnn.circuits import TASKS
from leangnn.config import (
    MAX_PARAMETERS,
    MODEL_OPTIONS,
    SIZE_DEFAULTS,
    ConfigError,
    TrainConfig,
)
from leangnn.nn.models import MODELS, build_model
from leangnn.strategy import STRATEGIES


def test_default_model_follows_strategy():
    # the best model for circuits by default; csbm graphs are not DAGs
    assert TrainConfig().model == "dag"
    assert TrainConfig(dataset="csbm:1000").model == "res"
    assert (TrainConfig().num_layers, TrainConfig().hidden_channels) == (2, 32)
    assert (TrainConfig(model="res").num_layers, TrainConfig(model="res").epochs) \
        == (8, 60)
    assert TrainConfig(strategy="reversible").model == "gsr"
    assert TrainConfig(strategy="prune").model == "sage"
    assert TrainConfig(strategy="offload", model="gcn").model == "gcn"
    for name, entry in STRATEGIES.items():
        assert TrainConfig(strategy=name).model == entry.default_model


def test_round_trip(tmp_path):
    cfg = TrainConfig(dataset="epfl", num_layers=64, sparsity=4, device_budget="1GiB")
    cfg.save(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == cfg
    with pytest.raises(ValueError, match=r"unknown config keys \['layerz'\]"):
        TrainConfig.from_dict({"layerz": 3})


def test_model_options_build_every_model():
    """model_options() carries every model option; build_model gives each model
    what its constructor takes, so the result equals a hand-written call."""
    cfg = TrainConfig(num_layers=3, hidden_channels=16, dropout=0.25, conv="gcn",
                      num_groups=2, sparsity=2, flat_parameters=False)
    assert set(cfg.model_options()) == set(MODEL_OPTIONS)
    torch.manual_seed(0)
    gsr = build_model("gsr", 5, 16, 1, 3, **cfg.model_options())
    torch.manual_seed(0)
    ref = MODELS["gsr"].resolve()(5, 16, 1, 3, conv="gcn", dropout=0.25,
                                   num_groups=2, sparsity=2, flat_parameters=False)
    assert repr(gsr) == repr(ref) and gsr.stack.k == 2
    for a, b in zip(gsr.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    sage = build_model("sage", 5, 16, 1, 3, **cfg.model_options())
    assert sage.dropout.p == 0.25 and sage.num_layers == 3


@pytest.mark.parametrize("kw, msg", [
    ({"dropout": 1.0}, "dropout: expected a value in"),
    ({"dropout": -0.1}, "dropout: expected a value in"),
    ({"lr": 0}, "lr: expected a positive learning rate"),
    ({"lr": math.inf}, "lr: expected a finite number, got inf"),
    # the optimizer casts its step to float32: beyond that, a bare overflow
    ({"lr": 1e308}, "lr: expected a learning rate up to 3.403e\\+38 \\(float32's "
                    "largest value\\), got 1e\\+308"),
    ({"weight_decay": math.inf}, "weight_decay: expected a finite number"),
    ({"weight_decay": -1.0}, "weight_decay: expected a value >= 0"),
    ({"clip_norm": -1.0}, "clip_norm: expected a norm >= 0"),
    ({"clip_norm": math.nan}, "clip_norm: expected a finite number, got nan"),
    ({"budget_ratio": 0.0}, "budget_ratio: expected a ratio in"),
    ({"task": "power"}, "task: expected signal_prob, arrival or critical"),
    ({"sparsity": 0}, "sparsity: expected an integer >= 1"),
    ({"hidden_channels": -4}, "hidden_channels: expected a positive integer"),
    ({"num_layers": True},
     "num_layers: expected an integer \\(or omitted\\), got True"),
    ({"num_layers": 8.0}, "num_layers: expected an integer \\(or omitted\\), got 8.0"),
    ({"epochs": "10"}, "epochs: expected an integer \\(or omitted\\), got '10'"),
    ({"lr": "0.1"}, "lr: expected a number \\(or omitted\\), got '0.1'"),
    ({"level_feature": 1}, "level_feature: expected true or false, got 1"),
    ({"seed": -1}, r"seed: expected an integer in \[0, 2\*\*32\)"),
    ({"patience": -1}, "patience: expected an integer >= 0"),
    ({"offload_mode": "fast"}, "offload_mode: expected exact or recompute"),
    ({"cache": "fifo"}, "cache: expected none, lru, degree, st or auto, got 'fifo'"),
    ({"device_budget": "0GiB"}, "device_budget: cannot read '0GiB'"),
    ({"device_budget": 2**30}, "device_budget: expected a string"),
    ({"device_budget": "99999999TiB"}, "device_budget: expected a size below"),
    ({"strategy": "magic"}, "strategy: expected full, reversible, prune.*, got "
     "'magic'"),
    ({"model": "mlp"}, "model: expected gsr, res, gcn, .*gat.*, got 'mlp'"),
    ({"conv": "gin"}, "conv: expected gcn, sage, gat or graph, got 'gin'"),
    ({"device": "tpu"}, "device: expected cpu, cuda or cuda:i, got 'tpu'"),
    ({"device": "meta"}, "device: expected cpu, cuda or cuda:i, got 'meta'"),
    ({"device": ""}, "device: expected cpu, cuda or cuda:i, got ''"),
    ({"device": "cuda:abc"}, "device: expected cpu, cuda or cuda:i, got 'cuda:abc'"),
    ({"device": "cuda:999"}, "device: 'cuda:999' requested but"),
    ({"dataset": ""}, "dataset: expected a non-empty value"),
    ({"out": " "}, "out: expected a non-empty value"),
    ({"dataset": "csbm:inf"}, "expected csbm:NUM_NODES, got 'csbm:inf'"),
    ({"dataset": "csbm:1e12"}, "expected csbm:NUM_NODES, got 'csbm:1e12'"),
    ({"dataset": "csbm:2.5"}, "expected csbm:NUM_NODES, got 'csbm:2.5'"),
    ({"dataset": "csbm:500", "test_dataset": "c17"}, "test_dataset: expected no "
     "value with dataset='csbm:500'"),
    ({"test_dataset": "csbm:500"}, "test_dataset: expected circuits"),
    ({"strategy": "reversible", "model": "res"},
     r"strategy 'reversible' needs a reversible model \(one of \['gsr'\]\)"),
    ({"strategy": "offload", "model": "gsr"},
     r"strategy 'offload' needs a layerwise model \(one of \['gat', 'gcn', "
     r"'gin', 'sage'\]\), got 'gsr'"),
    # was a bare TypeError (SparseCsr to numpy) in DPR's first training step
    ({"strategy": "prune", "model": "dag"}, r"^model: strategy 'prune' cannot "
     r"train 'dag' \(it propagates over a circuit's levels, which DPR's pruned "
     r"core does not keep\); choose another model \(default 'sage'\)$"),
    ({"strategy": "reversible", "num_groups": 1}, "model 'gsr': num_groups must "
     "be an int >= 2, got 1"),
    ({"model": "res", "hidden_channels": 10},
     "model 'res': num_groups must be a positive divisor"),
    ({"model": "gsr", "hidden_channels": 16, "sparsity": 5}, r"model 'gsr': "
     r"sparsity \(winners per group\) must be in \[1, 4\]"),
    ({"model": "res", "num_layers": 10**9},
     r"model 'res' would have ~8.\d+e\+12 parameters"),
    ({"model": "res", "hidden_channels": 10**9}, "hidden_channels=1000000000: "
     "model 'res' would "
     "have"),
])
def test_errors_name_argument_and_value(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        TrainConfig(**kw)


def test_choices_come_from_the_registries():
    from leangnn.nn.models import CONVS
    from leangnn.offload.cache import POLICIES
    from leangnn.offload.engine import MODES

    assert list(TASKS) == ["signal_prob", "arrival", "critical"]
    for task in TASKS:
        assert TrainConfig(task=task).task == task
    for conv in CONVS:
        assert TrainConfig(conv=conv).conv == conv
    for cache in POLICIES:
        assert TrainConfig(cache=cache).cache == cache
    for mode in MODES:
        assert TrainConfig(offload_mode=mode).offload_mode == mode


def test_numbers_are_normalised_and_bounds_are_inclusive():
    cfg = TrainConfig(lr=1, dropout=0, clip_norm=0, budget_ratio=1, seed=2**32 - 1)
    assert isinstance(cfg.lr, float) and cfg.lr == 1.0
    assert cfg.clip_norm == 0.0 and cfg.budget_ratio == 1.0
    assert TrainConfig(clip_norm=None).clip_norm is None
    assert TrainConfig(dataset="csbm:100").dataset == "csbm:100"
    assert TrainConfig(dataset="csbm:1e5").dataset == "csbm:1e5"


def test_parameter_limit_is_exact_at_the_boundary():
    """The meta-device count that the limit uses equals a real model's count."""
    from leangnn.plan.fits import parameter_count

    cfg = TrainConfig(num_layers=7, hidden_channels=16, model="gsr",
                      num_groups=2)
    real = build_model("gsr", 1, 16, 1, 7, **cfg.model_options())
    assert parameter_count(cfg, 1, 1) == sum(p.numel() for p in real.parameters())
    assert MAX_PARAMETERS >= 10**12


def test_validation_does_not_touch_the_rng():
    torch.manual_seed(123)
    expect = torch.rand(3)
    torch.manual_seed(123)
    TrainConfig(model="gsr", num_layers=64)
    torch.testing.assert_close(torch.rand(3), expect, rtol=0, atol=0)


@pytest.mark.parametrize("text, msg", [
    ("{", "not a JSON config"),
    ("[1, 2]", "expected a JSON object of config fields, got list"),
    ('{"num_layers": "8"}',
     "num_layers: expected an integer \\(or omitted\\), got '8'"),
    ('{"lr": "fast"}', "lr: expected a number \\(or omitted\\), got 'fast'"),
    ('{"layers": 8}', r"unknown config keys \['layers'\]"),
    ('{"dropout": 7}', "dropout: expected a value in"),
    ('{"lr": NaN}', "lr: expected a finite number, got nan"),
    ("\xff\xfe", "not a JSON config"),
])
def test_load_errors_name_the_file(tmp_path, text, msg):
    path = tmp_path / "config.json"
    path.write_text(text, encoding="latin-1")
    with pytest.raises(ConfigError, match=msg) as e:
        TrainConfig.load(path)
    assert str(e.value).startswith(f"{path}: ")


def test_load_round_trips_a_saved_run_with_nulls(tmp_path):
    cfg = TrainConfig(strategy="offload", clip_norm=None)
    cfg.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["clip_norm"] is None
    assert TrainConfig.load(tmp_path / "c.json") == cfg


def test_load_applies_overrides_before_validating(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TrainConfig().to_dict(), "device": "cuda:99"}))
    with pytest.raises(ConfigError, match="device: 'cuda:99' requested"):
        TrainConfig.load(path)
    assert TrainConfig.load(path, device="cpu").device == "cpu"
    assert TrainConfig.read(path)["device"] == "cuda:99"


def test_numpy_scalars_count_as_python_numbers():
    import numpy as np

    cfg = TrainConfig(num_layers=np.int64(3), lr=np.float32(0.5),
                      level_feature=np.bool_(True), dropout=np.int32(0))
    assert (cfg.num_layers, cfg.lr, cfg.level_feature, cfg.dropout) == (3, 0.5,
                                                                       True, 0.0)
    assert [type(v) for v in (cfg.num_layers, cfg.lr, cfg.level_feature,
                              cfg.dropout)] == [int, float, bool, float]
    with pytest.raises(ConfigError, match="num_layers: expected an integer"):
        TrainConfig(num_layers=np.float64(3.0))
    with pytest.raises(ConfigError, match="lr: expected a finite number"):
        TrainConfig(lr=np.float64("inf"))


def test_auto_strategy_and_memory_budget():
    """``auto`` plans the generic deep model by default; the budget is a
    positive size; what the planner sets cannot be preset; a resolved run
    keeps its budget and round-trips."""
    from leangnn.config import AUTO_MODEL, PLANNED_FIELDS

    cfg = TrainConfig(strategy="auto", memory_budget="4GiB")
    assert (cfg.model, cfg.memory_budget) == (AUTO_MODEL, "4GiB")
    assert (cfg.num_layers, cfg.hidden_channels) == (
        TrainConfig(model=AUTO_MODEL).num_layers,
        TrainConfig(model=AUTO_MODEL).hidden_channels)
    assert TrainConfig(strategy="auto", model="sage").model == "sage"
    assert TrainConfig(strategy="auto").memory_budget is None
    for bad, msg in (("4 parsecs", "memory_budget: cannot read '4 parsecs'"),
                     ("-1GiB", "memory_budget: cannot read '-1GiB'"),
                     ("nan", "memory_budget: cannot read 'nan'"),
                     ("99999999TiB", "memory_budget: expected a size below"),
                     (4.0, "memory_budget: expected a string")):
        with pytest.raises(ConfigError, match=msg):
            TrainConfig(strategy="auto", memory_budget=bad)
    # planned from a dry run of a few of its levels (leangnn.plan.dag)
    assert TrainConfig(strategy="auto", model="dag").model == "dag"
    with pytest.raises(ConfigError, match="device_budget: strategy 'auto' sets it"):
        TrainConfig(strategy="auto", device_budget="1GiB")
    resolved = TrainConfig(strategy="offload", model="sage", device_budget="4GiB",
                           num_parts=16, memory_budget="4GiB")
    assert TrainConfig.from_dict(resolved.to_dict()) == resolved
    assert set(PLANNED_FIELDS) <= set(resolved.to_dict())


def test_model_defaults_per_task():
    """A model's per-task defaults win over its own, explicit values over both."""
    from leangnn.nn.models import MODELS

    tuned = MODELS["dag"].defaults["tasks"]["critical"]
    cfg = TrainConfig(task="critical")
    assert cfg.model == "dag"
    assert (cfg.hidden_channels, cfg.lr) == (tuned["hidden_channels"], tuned["lr"])
    assert cfg.num_layers == MODELS["dag"].defaults["num_layers"]
    arrival = TrainConfig(task="arrival")
    assert arrival.hidden_channels == MODELS["dag"].defaults["hidden_channels"]
    assert arrival.lr == SIZE_DEFAULTS["lr"]
    assert TrainConfig(task="critical", hidden_channels=16, lr=0.01).lr == 0.01
    assert TrainConfig(task="critical", model="res").lr == SIZE_DEFAULTS["lr"]
