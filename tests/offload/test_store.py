"""HostStore: named host arrays, row gathers, writes and accumulation."""

from __future__ import annotations

import torch

from leangnn.offload.store import HostStore, ShapeStore, is_all_rows


def test_gather_write_accumulate_free():
    s = HostStore()
    x = torch.arange(12.0).view(4, 3)
    s.put("h0", x)
    assert torch.equal(s.gather("h0", torch.tensor([2, 0])), x[[2, 0]])
    s.allocate("g1", 4, 3, torch.float32, zero=True)
    s.accumulate("g1", torch.tensor([1, 3]), torch.ones(2, 3))
    s.accumulate("g1", torch.tensor([1]), torch.ones(1, 3))
    assert s["g1"][:, 0].tolist() == [0.0, 2.0, 0.0, 1.0]
    s.allocate("h1", 4, 2, torch.float32)
    s.write("h1", torch.tensor([0, 1, 2, 3]), torch.eye(4)[:, :2])
    assert torch.equal(s["h1"], torch.eye(4)[:, :2])
    assert s.nbytes() == (12 + 12 + 8) * 4
    s.free("h1")
    assert "h1" not in s and "g1" in s


def test_virtual_store_records_shapes_only():
    s = ShapeStore()
    assert s.allocate("h1", 10**9, 64, torch.float32) is None
    assert s.shapes["h1"] == (10**9, 64) and s.nbytes() == 0


def test_gather_of_every_row_in_order_is_the_array_itself():
    s = HostStore()
    x = torch.arange(12.0).view(4, 3)
    s.put("h0", x)
    every = s.gather("h0", torch.arange(4))
    assert every.data_ptr() == x.data_ptr() and torch.equal(every, x)
    # a permutation or a subset is a copy, as before
    for rows in (torch.tensor([1, 0, 2, 3]), torch.tensor([0, 1, 2])):
        got = s.gather("h0", rows)
        assert torch.equal(got, x[rows]) and got.data_ptr() != x.data_ptr()
    assert not is_all_rows(torch.tensor([0, 2, 2, 3]), 4)
    assert not is_all_rows(torch.arange(0), 0)


def test_whole_array_write_and_accumulate_equal_the_indexed_ones():
    """Every row in order: the written array equals ``index_copy_``'s (a fresh
    host tensor of the array's layout is taken over, no copy), and the
    accumulation equals ``index_add_``'s; any other rows index as before."""
    gen = torch.Generator().manual_seed(0)
    vals = torch.randn(5, 3, generator=gen)
    ref = torch.zeros(5, 3).index_copy_(0, torch.arange(5), vals)
    s = HostStore()
    s.allocate("h1", 5, 3, torch.float32)
    s.write("h1", torch.arange(5), vals)
    assert torch.equal(s["h1"], ref) and s["h1"].data_ptr() == vals.data_ptr()
    # a non-contiguous or differently typed tensor is copied into the array
    s.allocate("h2", 5, 3, torch.float64)
    keep = s["h2"]
    s.write("h2", torch.arange(5), vals)
    assert s["h2"] is keep and torch.equal(s["h2"], ref.double())
    s.allocate("h3", 5, 3, torch.float32)
    keep, strided = s["h3"], vals.t().contiguous().t()
    assert not strided.is_contiguous()
    s.write("h3", torch.arange(5), strided)
    assert s["h3"] is keep and torch.equal(s["h3"], ref)
    # a permutation is an indexed write
    s.write("h1", torch.tensor([4, 3, 2, 1, 0]), ref)
    assert torch.equal(s["h1"], ref.flip(0))
    s.allocate("g1", 5, 3, torch.float32, zero=True)
    ref_g = torch.zeros(5, 3)
    for rows in (torch.arange(5), torch.tensor([1, 3]), torch.arange(5)):
        v = torch.randn(rows.numel(), 3, generator=gen)
        s.accumulate("g1", rows, v)
        ref_g.index_add_(0, rows, v)
    assert torch.allclose(s["g1"], ref_g, rtol=0, atol=1e-6)
