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
