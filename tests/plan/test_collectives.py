"""What P ranks cost beyond their compute: the fit, the pricing, the command."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.data import GraphSplits, with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.plan.calibrate import main as calibrate_main
from leangnn.plan.calibration import Calibration, load_calibration
from leangnn.plan.collectives import (
    CollectiveCost,
    _fit,
    comm_key,
    measure_collectives,
    scale_comm,
)
from leangnn.plan.distributed import estimate_distributed


def test_fit_recovers_latency_and_bandwidth():
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
    lat, per_byte = _fit(sizes, [3e-4 + 2e-9 * s for s in sizes])
    assert lat == pytest.approx(3e-4, rel=1e-6)
    assert per_byte == pytest.approx(2e-9, rel=1e-6)
    # flat noise: all latency, never a negative bandwidth
    lat, per_byte = _fit(sizes, [1e-3, 0.9e-3, 1.1e-3, 1e-3])
    assert per_byte >= 0 and lat > 0


def test_cost_prices_an_epoch():
    cost = CollectiveCost("gloo", 2, [1e-3, 1e-9], [2e-3, 2e-9], corun=1.5)
    work = {"a2a_calls": 10, "a2a_bytes": 1e6, "ar_calls": 4, "ar_bytes": 1e5,
            "ops": 99}
    comm = 10e-3 + 1e-3 + 8e-3 + 2e-4
    assert cost.seconds(work) == pytest.approx(comm)
    assert cost.epoch_seconds(2.0, work) == pytest.approx(3.0 + comm)
    assert cost.epoch_seconds(None, work) is None
    assert CollectiveCost.from_dict(cost.to_dict()) == cost
    assert scale_comm({"a2a_calls": 2, "a2a_bytes": 10, "ops": 5}, 3, 1.5) == {
        "a2a_calls": 6, "a2a_bytes": 15}


def test_calibration_takes_the_nearest_measured_ranks():
    cal = Calibration("k", "default")
    assert cal.collective_cost("gloo", 2) is None
    for p in (2, 8):
        cal.collectives[comm_key("gloo", p)] = CollectiveCost(
            "gloo", p, [0, 0], [0, 0], corun=float(p)).to_dict()
    assert cal.collective_cost("gloo", 2).nproc == 2
    assert cal.collective_cost("gloo", 6).nproc == 8
    assert cal.collective_cost("gloo", 3).nproc == 2
    assert cal.collective_cost("nccl", 2) is None
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.collective_cost("gloo", 8).corun == 8.0
    # a damaged file's entries are left out, never a traceback at plan time
    cal.collectives = {"gloo:2": {"backend": "gloo", "nproc": 2,
                                  "all_to_all": [float("nan"), 1e-9],
                                  "all_reduce": [1e-3, 0.0]},
                       "gloo:3": {"backend": "gloo", "nproc": 3, "all_to_all": [1],
                                  "all_reduce": [1e-3, 0.0]},
                       "gloo:4": 5, "gloo:5": {"nproc": "x"}}
    assert cal.collective_cost("gloo", 2) is None
    with pytest.raises(ValueError, match="not a collective cost"):
        CollectiveCost.from_dict({"backend": "gloo", "nproc": 2, "corun": -1.0,
                                  "all_to_all": [0, 0], "all_reduce": [0, 0]})


@pytest.mark.parametrize("mode", ["graph", "data"])
def test_distributed_epoch_is_compute_times_corun_plus_collectives(mode):
    gs = [contextual_sbm(n, avg_degree=4.0, in_channels=8, seed=n)
          for n in (300, 500, 200)]
    train = [with_mask(g, g.train_mask) for g in gs]
    splits = GraphSplits(train, train[:1], train[:1], "classification",
                         int(gs[0].y.max()) + 1)
    cfg = TrainConfig(dataset="csbm:300", model="sage", num_layers=2, epochs=1)
    cal = replace(Calibration.default(), calibrated=True)
    plain = estimate_distributed(cfg, splits, 2, mode, calibration=cal)
    assert "not timed" in plain.note and "--collectives 2" in plain.note
    cost = CollectiveCost("gloo", 2, [1e-3, 1e-9], [2e-3, 2e-9], corun=1.25)
    cal.collectives[comm_key("gloo", 2)] = cost.to_dict()
    timed = estimate_distributed(cfg, splits, 2, mode, calibration=cal)
    assert timed.epoch_seconds == pytest.approx(
        1.25 * plain.epoch_seconds + cost.seconds(timed.work))
    assert "x1.25" in timed.note and "collectives" in timed.note
    if mode == "data":  # two steps of two graphs: gradients and loss each
        assert timed.work["ar_calls"] == 4
        assert timed.work["ar_bytes"] == 2 * (timed.model_bytes + 8)
    else:  # a step per training graph: the second layer's halo both ways
        # (the first layer's input halo moves once and is kept)
        assert timed.work["a2a_calls"] == 3 * 2
        assert timed.work["a2a_bytes"] > 0 and timed.work["ar_calls"] == 3 * 2


def test_measured_on_two_ranks_and_stored(tmp_path, monkeypatch, capsys):
    cost = measure_collectives(2, quick=True, nodes=2000)
    assert cost.backend == "gloo" and cost.nproc == 2 and cost.corun >= 1.0
    assert min(cost.all_to_all + cost.all_reduce) >= 0
    assert cost.all_to_all[0] + cost.all_to_all[1] > 0
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    assert calibrate_main(["--collectives", "2", "--quick"]) == 0
    assert "2 gloo ranks: compute x" in capsys.readouterr().out
    assert load_calibration("cpu").collective_cost("gloo", 2).nproc == 2
    with pytest.raises(SystemExit):
        calibrate_main(["--collectives", "1"])
    assert "at least 2 ranks, got 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--collectives 100000: more than 8 ranks"):
        measure_collectives(100000)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="one per rank needed"):
            measure_collectives(2, "cuda")
