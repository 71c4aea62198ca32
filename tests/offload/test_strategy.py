"""OffloadStrategy: the trainer's hooks give PyG full-batch gradients."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.graphs.synthetic import power_law_graph
from leangnn.nn.models import build_model
from leangnn.offload import OffloadStrategy
from leangnn.plan.vertex import full_batch_vertex_bytes
from leangnn.strategy import FullBatch
from leangnn.train import Trainer, make_loss_fn


def test_train_step_and_predict_equal_full_batch():
    d = power_law_graph(300, avg_degree=6, in_channels=8, num_classes=4)
    d.x = d.x.double()
    d.node_mask = d.train_mask
    torch.manual_seed(0)
    model = build_model("sage", 8, 16, 4, 2).double()
    loss_fn = make_loss_fn("classification")
    ref = FullBatch()
    ref_loss = ref.train_step(model, d, loss_fn)
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    cfg = SimpleNamespace(device="cpu", device_budget="300KiB", num_parts=3,
                          cache="st")
    strat = OffloadStrategy.from_config(cfg)
    strat.setup(model, [d])
    loss = strat.train_step(model, d, loss_fn)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    for p, r in zip(model.parameters(), ref_grads):
        assert torch.allclose(p.grad, r, rtol=1e-10, atol=1e-14)
    model.eval()
    assert torch.allclose(strat.predict(model, d), ref.predict(model, d))
    s = strat.summary()["offload"]
    assert s["device_budget"] == 300 * 1024 and s["cache"] == "st"
    assert s["counters"]["vertex_layer_computations"] == 2 * 2 * 300
    # host memory is reported: at the turn of the epoch the store holds the
    # features and every layer's output and gradient
    vertex = full_batch_vertex_bytes(model, 300, resident_factor=0)
    assert s["counters"]["peak_host_bytes"] >= vertex
    assert len(strat._engines) == 1


def test_bad_config_raises():
    with pytest.raises(ValueError, match="device_budget"):
        OffloadStrategy(device_budget="a lot")
    with pytest.raises(ValueError, match="cache"):
        OffloadStrategy(cache="fifo")
    with pytest.raises(ValueError, match="num_parts"):
        OffloadStrategy(num_parts=0)


def test_trainer_runs_offload_and_records_counters(tmp_path):
    cfg = TrainConfig(dataset="csbm:600", strategy="offload", model="gcn",
                      num_layers=2, hidden_channels=16, epochs=2,
                      device_budget="2MiB", num_parts=3, out=str(tmp_path),
                      patience=0)
    summary = Trainer(cfg, progress=False).fit()
    saved = json.loads((tmp_path / "summary.json").read_text())
    off = saved["offload"]
    assert off["counters"]["vertex_layer_computations"] > 0
    (graph,) = off["graphs"].values()  # train/val/test share one engine
    assert graph["last_train_epoch"]["peak_device_bytes"] <= 2 << 20
    assert summary["metrics"]["test"]["loss"] > 0


def test_cli_retain_switch_keeps_graphs_and_off_switch_recomputes(tmp_path):
    """``--retain``: backward through the kept forward graphs (no vertex-layer
    recomputation); ``retain=False`` recomputes the same run; same losses."""
    import json

    from leangnn.cli import main

    common = dict(strategy="offload", model="gcn", num_layers=2, epochs=2,
                  dataset="iscas85/c432", test_dataset="iscas85/c880",
                  val_dataset="iscas85/c499", device_budget="256MiB")
    assert main(["train", "--strategy", "offload", "--model", "gcn", "--layers",
                 "2", "--epochs", "2", "--dataset", "iscas85/c432",
                 "--test-dataset", "iscas85/c880", "--val-dataset",
                 "iscas85/c499", "--device-budget", "256MiB", "--out",
                 str(tmp_path / "on"), "--quiet", "--retain"]) == 0
    # the off switch through the configuration (whatever the CLI's default)
    Trainer(TrainConfig(**common, retain=False, out=str(tmp_path / "off")),
            progress=False).fit()
    runs = {d: json.loads((tmp_path / d / "summary.json").read_text())
            for d in ("on", "off")}
    on, off = runs["on"]["offload"], runs["off"]["offload"]
    assert on["counters"]["vertex_layer_recomputations"] == 0
    assert off["counters"]["vertex_layer_recomputations"] > 0
    assert all(g["retain"] for g in on["graphs"].values())
    assert not any(g["retain"] for g in off["graphs"].values())
    lines = [[json.loads(x)["train_loss"] for x in
              (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
             for d in ("on", "off")]
    assert lines[0] == pytest.approx(lines[1], rel=1e-6)


def test_from_config_takes_the_engine_defaults_and_auto_resolves():
    """A config that leaves ``retain`` unset gets the engine's default
    (retention where the budget holds it); ``cache="auto"`` is ``none`` on a
    CPU device and the summary names what ran."""
    d = power_law_graph(200, avg_degree=6, in_channels=8, num_classes=4)
    d.node_mask = d.train_mask
    cfg = SimpleNamespace(device="cpu", device_budget="64MiB", num_parts=3,
                          cache="auto")
    strat = OffloadStrategy.from_config(cfg)
    assert strat.options.retain and strat.options.cache == "auto"
    assert not OffloadStrategy.from_config(
        SimpleNamespace(**vars(cfg), retain=False)).options.retain
    torch.manual_seed(0)
    model = build_model("gcn", 8, 16, 4, 2)
    strat.train_step(model, d, make_loss_fn("classification"))
    s = strat.summary()["offload"]
    assert s["cache"] == "auto" and s["cache_policies"] == ["none"]
    (g,) = s["graphs"].values()
    assert g["cache"] == "none" and g["retain"]
    assert s["counters"]["vertex_layer_recomputations"] == 0
