"""Counters and the full-batch need."""

from __future__ import annotations

from leangnn.nn.models import build_model
from leangnn.offload.counters import OffloadCounters
from leangnn.plan.vertex import full_batch_vertex_bytes


def test_full_batch_vertex_bytes_counts_every_layer_and_its_gradient():
    model = build_model("sage", 10, 32, 3, 3)
    params = sum(p.numel() for p in model.parameters()) * 4
    # x (10) + h1, h2 (32 each) + out (3), and gradients of h1, h2, out
    want = 1000 * (10 + 32 + 32 + 3 + 32 + 32 + 3) * 4 + 4 * params
    assert full_batch_vertex_bytes(model, 1000) == want
    assert full_batch_vertex_bytes(model.double(), 1000) == 2 * want


def test_counters_dict_has_traffic():
    c = OffloadCounters(h2d_bytes=5, d2h_bytes=7, h2d_meta_bytes=100)
    assert c.traffic_bytes == 12 and c.to_dict()["traffic_bytes"] == 12
    assert c.to_dict()["h2d_meta_bytes"] == 100
