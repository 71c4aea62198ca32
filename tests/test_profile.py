"""Memory measurement: saved-tensor accounting, RSS peaks, subprocess runs."""

from __future__ import annotations

import sys

import pytest
import torch

from leangnn.profile import (
    LiveBytesMeter,
    MemoryMeter,
    PhaseMeter,
    SavedTensorsMeter,
    measure_in_subprocess,
    peak_rss_bytes,
    release_free_heap,
    reset_peak_rss,
    resident_growth,
    rss_bytes,
    run_with_peak_rss,
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


def test_phase_meter_puts_phases_on_one_scale():
    meter = PhaseMeter("cpu")
    with meter.phase("load"):
        held = torch.ones(64 * MiB // 4)  # 64 MiB, touched and kept
    with meter.phase("use"):
        _ = float(held.sum())              # allocates next to nothing
    del held
    with meter.phase("after"):
        pass
    rec = meter.records
    assert list(rec) == ["load", "use", "after"]
    # "use" starts and peaks on top of what "load" left behind
    assert rec["load"]["peak_mib"] >= 48 and rec["use"]["start_mib"] >= 48
    assert rec["use"]["peak_mib"] >= rec["use"]["start_mib"]
    assert rec["use"]["peak_mib"] - rec["use"]["start_mib"] < 16
    assert rec["after"]["start_mib"] < 16  # the 64 MiB went back to the OS
    assert meter.peak("load", "use", "nope") == max(rec["load"]["peak_mib"],
                                                     rec["use"]["peak_mib"])
    assert meter.abs_peak_mib >= meter.start_bytes / MiB + 48
    assert all(r["seconds"] >= 0 for r in rec.values())
    with pytest.raises(ValueError, match="no recorded phase"):
        meter.peak("nope")


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


def test_live_bytes_meter_counts_storages_once_and_releases_them():
    keep = torch.zeros(100)
    with LiveBytesMeter(exclude=[keep]) as m:
        a = torch.empty(1000)           # 4000 bytes
        v = a.view(10, 100).t()         # a view: no new storage
        keep.add_(1)                    # in place on an outside tensor: nothing
        b = torch.empty(500)            # +2000
        peak_two = m.live
        del a, v                        # storage freed
        after = m.live
        c = b * 2                       # +2000
        with m.paused():
            d = torch.empty(10_000)     # bookkeeping: not counted
    assert peak_two == 6000 and after == 2000
    assert m.peak == 6000 and m.live == 4000
    del b, c, d


def test_live_bytes_meter_records_the_row_blocks_alive_at_its_peak():
    with LiveBytesMeter(rows=300) as m:
        a = torch.empty(300, 8)         # 9600 bytes, 300 rows
        b = torch.empty(20, 300)        # 24000 bytes, 20 rows: not recorded
        c = torch.empty(300, 2)         # 2400 bytes, 300 rows: the peak
        del a, b
        d = torch.empty(300, 1)         # after the peak: not recorded
    assert m.peak == 9600 + 24000 + 2400
    assert sorted(m.peak_row_blocks) == [2400, 9600]
    with LiveBytesMeter() as off:       # without rows nothing is kept
        e = torch.empty(300, 8)
    assert off.peak_row_blocks == []
    del c, d, e


def test_live_bytes_meter_counts_sparse_tensors_by_their_parts():
    """A CSR tensor has no storage of its own: its index and value tensors are
    counted while it lives (they are fresh aliases on every access; a part
    may view a larger storage, which is what is resident)."""
    dense = torch.eye(50, dtype=torch.float64)
    with LiveBytesMeter(exclude=[dense]) as m:
        csr = dense.to_sparse_csr()
        parts = (csr.crow_indices(), csr.col_indices(), csr.values())
        want = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                    for p in parts}.values())
        assert want >= 51 * 8 + 50 * 8 + 50 * 8
        del parts
        held = m.live
        y = csr @ torch.ones(50, 2, dtype=torch.float64)  # +800 bytes
        with_y = m.live
        del csr
        after = m.live
    assert held == want and with_y == want + y.numel() * 8
    assert after == y.numel() * 8


def test_saved_tensors_meter_frees_activations_without_backward():
    import gc
    import weakref

    from leangnn.profile import SavedTensorsMeter

    x = torch.randn(1000, 100, requires_grad=True)
    with SavedTensorsMeter() as m:
        y = x.exp()  # exp saves its output
    ref = weakref.ref(y)
    del y
    gc.disable()  # freed by reference counting, not by the cycle collector
    try:
        assert ref() is None
    finally:
        gc.enable()
    assert m.bytes >= 1000 * 100 * 4


def test_saved_tensors_meter_gradients_unchanged_and_sparse_counted():
    from leangnn.profile import SavedTensorsMeter

    x = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 50, (2, 200))
    a = torch.sparse_coo_tensor(idx, torch.rand(200, dtype=torch.float64),
                                (50, 50)).coalesce()
    ref = torch.autograd.grad(torch.sparse.mm(a, x.exp()).sum(), x)[0]
    with SavedTensorsMeter() as m:
        out = torch.sparse.mm(a, x.exp()).sum()
    assert torch.equal(torch.autograd.grad(out, x)[0], ref)
    nnz = a._nnz()
    # exp's output (50 x 8) plus the sparse matrix's indices and values, not
    # its dense 50 x 50 size
    assert m.bytes <= 50 * 8 * 8 + nnz * (2 * 8 + 8) + 50 * 8 * 8


def test_release_free_heap_returns_interior_holes():
    # 64 KiB blocks come from the heap (below glibc's mmap threshold); freeing
    # every other one leaves holes between live blocks that the heap top
    # cannot give back, only malloc_trim's page release can.
    import sys

    if not sys.platform.startswith("linux"):
        assert release_free_heap() in (True, False)
        return
    blocks = [bytearray(64 * 1024) for _ in range(1600)]  # 100 MiB, touched
    del blocks[::2]
    before = rss_bytes()
    assert release_free_heap()
    after = rss_bytes()
    assert before - after >= 25 * MiB, (before / MiB, after / MiB)
    assert all(len(b) == 64 * 1024 and b[-1] == 0 for b in blocks)  # intact


def test_run_with_peak_rss_sees_the_child_peak():
    import sys

    code = ("b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
            "del b; print('done')")
    r = run_with_peak_rss([sys.executable, "-c", code], interval=0.01)
    assert r.returncode == 0 and r.stdout.strip() == "done"
    assert r.peak_bytes >= 300 * MiB
    assert r.sampled_peak_bytes <= r.peak_bytes + 4 * MiB
    assert r.max_bytes == max(r.peak_bytes, r.sampled_peak_bytes)
    bad = run_with_peak_rss([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert bad.returncode == 3
    with pytest.raises(TimeoutError):
        run_with_peak_rss([sys.executable, "-c", "import time; time.sleep(30)"],
                          timeout=0.5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_resident_growth_is_what_the_block_left_allocated():
    calls = []
    with resident_growth(lambda: calls.append(1)) as grown:
        kept = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, written
    assert calls == [1, 1]  # freed heap returned before and after
    assert grown["bytes"] >= 0.9 * kept.numel()
    with resident_growth() as gone:
        t = torch.ones(64 << 20, dtype=torch.uint8)
        del t
    assert gone["bytes"] < 0.25 * kept.numel()
