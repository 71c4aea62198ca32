"""Memory measurement: saved-tensor accounting, RSS peaks, subprocess runs."""

from __future__ import annotations

import torch

from leangnn.profile import (
    MemoryMeter,
    SavedTensorsMeter,
    TransferCounter,
    measure_in_subprocess,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
)

MiB = 1 << 20


def test_saved_tensors_counts_what_backward_keeps():
    w = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(1024, 256)
    with SavedTensorsMeter() as m:
        h = x @ w          # only w needs a gradient: saves x (1 MiB), not w
        y = torch.relu(h)  # saves its output (1 MiB)
    expected = x.nbytes + y.nbytes
    assert m.bytes == expected
    y.sum().backward()
    with SavedTensorsMeter() as m2, torch.no_grad():
        torch.relu(x @ w)
    assert m2.bytes == 0


def test_saved_tensors_dedupes_shared_storage():
    x = torch.randn(1000, 100, requires_grad=True)
    with SavedTensorsMeter() as m:
        a = x.sin()
        b = x.cos()  # saves x again
    assert m.bytes == x.nbytes and m.count == 2
    del a, b


def test_cpu_meter_sees_an_allocation():
    meter = MemoryMeter("cpu").start()
    big = torch.ones(64 * MiB // 4)  # 64 MiB, touched
    report = meter.stop()
    assert report.peak_bytes >= 48 * MiB
    assert report.method in ("cpu_peak_rss", "cpu_peak_rss_since_start")
    del big


def test_rss_helpers():
    assert rss_bytes() > 0 and peak_rss_bytes() >= rss_bytes() // 2
    if reset_peak_rss():
        assert peak_rss_bytes() <= rss_bytes() + 8 * MiB


def _setup(n):
    return torch.zeros(n)  # loaded state, not counted


def _run(state):
    extra = torch.ones(state.numel() * 4)  # 4x the state, counted
    return {"sum": float(extra.sum())}


def test_measure_in_subprocess_excludes_setup():
    n = 16 * MiB // 4
    result, mem = measure_in_subprocess(_setup, _run, {"n": n})
    assert result["sum"] == 4 * n
    assert 56 * MiB <= mem["peak_bytes"] <= 160 * MiB
    assert mem["method"].startswith("cpu")


def test_transfer_counter():
    c = TransferCounter()
    t = torch.ones(10)
    c.to_device(t, torch.device("cpu"))
    c.to_host(t)
    assert c.to_dict() == {"h2d_bytes": 40, "d2h_bytes": 40, "h2d_calls": 1,
                           "d2h_calls": 1}
