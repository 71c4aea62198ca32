"""HeapModel: the placement rules, the floor it gives a traced step, and its
off switch."""
from __future__ import annotations

import torch

from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.calibration import Calibration
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import Estimate, default_loss
from leangnn.plan.heapsim import HeapModel
from leangnn.plan.planner import estimate_row

MiB = 1 << 20


def test_a_freed_block_is_reused_by_one_of_its_size():
    h = HeapModel(pin=0)
    h.malloc(1, 8 * MiB)
    h.malloc(2, MiB)
    h.free(1)
    top = h.extent
    h.malloc(3, 8 * MiB)  # the hole at the bottom fits it exactly
    assert h.extent == top
    h.free(99)  # an unknown key is ignored
    assert "extent=" in repr(h)


def test_neighbours_coalesce_and_a_free_top_is_given_back():
    h = HeapModel(pin=0)
    for k in (1, 2, 3):
        h.malloc(k, 4 * MiB)
    h.free(1)
    h.free(2)
    top = h.extent
    h.malloc(4, 8 * MiB)  # two neighbouring holes make one of 8 MiB
    assert h.extent == top
    h.free(4)
    h.free(3)  # everything free: the top comes back down
    assert h.top == 0
    h.malloc(5, 4 * MiB)
    assert h.extent == top


def test_a_free_top_larger_than_the_trim_threshold_is_returned():
    h = HeapModel(trim_threshold=16 * MiB, top_pad=0, pin=0)
    h.malloc(1, MiB)
    h.malloc(2, 32 * MiB)
    assert h.extent > 33 * MiB
    h.free(2)
    assert h.extent < 2 * MiB


def test_a_kept_block_carved_from_a_fresh_hole_makes_the_next_transient_grow_the_heap():
    # the measured pattern: each layer's transient is freed, the next layer's
    # kept blocks are carved out of its hole, the next transient no longer
    # fits; with nothing pinned above it, a freed top block is given back
    layers, transient, kept = 8, 16 * MiB, MiB

    def run(h):
        key = 0
        for _ in range(layers):
            for _ in range(2):  # what the layer keeps for the backward
                key += 1
                h.malloc(key, kept)
            key += 1
            h.malloc(key, transient)  # its messages, freed within the layer
            h.free(key)
        return h.extent

    live = transient + 2 * layers * kept
    pinned = run(HeapModel())
    assert pinned >= layers // 2 * transient  # one transient per two layers
    assert run(HeapModel(pin=0)) < 1.2 * live  # only the top is reused


def _dense_graph():
    g = contextual_sbm(2000, avg_degree=40.0, in_channels=8, seed=1)
    return with_mask(g, g.train_mask)


def test_the_floor_of_a_deep_stack_on_a_dense_graph_and_its_off_switch():
    g = _dense_graph()
    torch.manual_seed(0)
    model = build_model("res", 8, 32, int(g.y.max()) + 1, 8, conv="sage")
    on = trace_step(model, g, default_loss(g), None, heap_model=True)
    off = trace_step(model, g, default_loss(g), None, heap_model=False)
    big, heap = on.heap_point()
    # E x 32 messages (8.3 MB) against N x 32 activations (0.26 MB): the
    # model's extent is several times the live high-water (measured: a real
    # step of this model peaks at 53-63 MiB above its loaded state)
    assert on.heap_floor > 3 * (big + heap)
    assert off.heap_floor == 0
    # the floor is all it changes
    on.heap_floor = 0
    assert on == off
    # no heap (CUDA's caching allocator): no floor
    cuda_like = trace_step(model, g, default_loss(g), None, heap_threshold=0)
    assert cuda_like.heap_floor == 0


def test_the_floor_raises_the_glibc_default_estimate_only():
    est = Estimate("full", {"model": "res"}, "cpu", step_bytes=20 * MiB,
                   big_bytes=2 * MiB, heap_bytes=14 * MiB, floor_bytes=70 * MiB)
    default = Calibration("t", "glibc-default", heap_scale=2.0, const=0.0,
                          calibrated=True)
    default.apply(est)
    assert est.run_bytes == 70 * MiB and est.floor_decided
    # the plan's row says where its need comes from
    row = estimate_row("full", est, default, "exact", {"strategy": "full"})
    assert "heap model" in row.detail
    est.floor_bytes = 10 * MiB  # below the factor's figure: the factor's
    default.apply(est)
    assert est.run_bytes == 2 * MiB + 2 * 14 * MiB and not est.floor_decided
    assert estimate_row("full", est, default, "exact", {}).detail == ""
    # above the factor's figure by a few KiB (a tiny graph, its need the
    # constant's): it still sets the need, but the row does not name it
    est.floor_bytes = 2 * MiB + 2 * 14 * MiB + 8 * 1024
    default.apply(est)
    assert est.run_bytes == est.floor_bytes and not est.floor_decided
    assert estimate_row("full", est, default, "exact", {}).detail == ""
    est.floor_bytes = round(1.06 * (2 * MiB + 2 * 14 * MiB))  # 6%, ~1.8 MiB
    default.apply(est)
    assert est.run_bytes == est.floor_bytes and est.floor_decided
    est.floor_bytes = 70 * MiB
    Calibration("t", "glibc-mmap", heap_scale=1.0, const=0.0,
                calibrated=True).apply(est)
    assert est.run_bytes == 16 * MiB and not est.floor_decided
