"""Per-rank epoch records: traffic and memory of one rank."""

from __future__ import annotations

import torch

import leangnn.distributed.counters as counters
from leangnn.distributed.counters import EpochMeter
from leangnn.distributed.halo import HaloStats


def test_run_peak_is_the_peak_above_the_first_epochs_start(monkeypatch):
    now = {"rss": 100, "peak": 150}
    monkeypatch.setattr(counters, "rss_bytes", lambda: now["rss"])
    monkeypatch.setattr(counters, "peak_rss_bytes", lambda: now["peak"])
    meter = EpochMeter(0, 2, torch.device("cpu"))
    stats = [HaloStats()]
    meter.start(1, stats, 0)
    stats[0].add(0, 3, 24, 36, backward=False)
    r1 = meter.stop(stats, 40)
    # a later epoch starts higher (what the first left): the baseline stays
    now.update(rss=130, peak=190)
    meter.start(2, stats, 40)
    r2 = meter.stop(stats, 40)
    assert (r1.peak_bytes, r1.run_peak_bytes) == (150, 50)
    assert (r2.peak_bytes, r2.run_peak_bytes) == (190, 90)
    assert r1.peak_method == "cpu_peak_rss_process"
    assert (r1.halo_bytes_sent, r1.halo_bytes_received) == (24, 36)
    assert r1.allreduce_payload_bytes == 40 and r2.allreduce_payload_bytes == 0
    assert r1.halo_rows_per_layer == {0: 3} and r2.halo_rows_per_layer == {}
