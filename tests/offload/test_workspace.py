"""The calibrated job-bytes model against measured jobs."""

from __future__ import annotations

import numpy as np
import torch

from leangnn.nn.models import build_model
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.plane import compute_layer
from leangnn.offload.workspace import WorkspaceModel, _probe_graph
from leangnn.profile import LiveBytesMeter


def test_model_covers_measured_jobs_of_unseen_sizes():
    torch.manual_seed(0)
    model = build_model("gat", 8, 16, 4, 3)
    lw = LayerwiseModel(model)

    def run(li, backward, x, ei, w, nt, g):
        return compute_layer(lw, li, backward, x, ei, w, nt, g)

    ws = WorkspaceModel(run, lw.widths, torch.float32, False, torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    for n_s, n_t, n_e in ((700, 90, 3000), (2500, 1200, 5000), (300, 300, 300)):
        for li in range(3):
            for backward in (False, True):
                x = torch.randn(n_s, lw.widths[li])
                g = torch.randn(n_t, lw.widths[li + 1]) if backward else None
                ei = _probe_graph(n_s, n_t, n_e, gen)
                with LiveBytesMeter(exclude=[x, g, ei]) as m:
                    run(li, backward, x, ei, None, n_t, g)
                assert m.peak <= ws.conv_bytes(li, backward, n_s, n_t, n_e)


def test_cpu_calibration_is_kept_on_disk_and_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    torch.manual_seed(0)
    lw = LayerwiseModel(build_model("sage", 8, 16, 4, 2))

    def run(li, backward, x, ei, w, nt, g):
        return compute_layer(lw, li, backward, x, ei, w, nt, g)

    calls = []

    def counted(*a):
        calls.append(a)
        return run(*a)

    key = ("disk-test",)
    ws = WorkspaceModel(counted, lw.widths, torch.float32, False,
                        torch.device("cpu"), key=key)
    assert calls and list((tmp_path / "workspace").glob("*.json"))
    WorkspaceModel._CACHE.clear()  # a fresh process: only the disk remains
    n = len(calls)
    again = WorkspaceModel(counted, lw.widths, torch.float32, False,
                           torch.device("cpu"), key=key)
    assert len(calls) == n  # nothing measured
    for k, f in ws.fits.items():
        np.testing.assert_array_equal(again.fits[k].coef, f.coef)
        assert again.fits[k].const == f.const
    for k, f in ws.kept_fits.items():
        np.testing.assert_array_equal(again.kept_fits[k].coef, f.coef)
    assert again.edge_blocks == ws.edge_blocks and ws.edge_blocks


def test_edge_blocks_are_the_layers_messages_and_mapped_past_a_threshold():
    torch.manual_seed(0)
    lw = LayerwiseModel(build_model("sage", 24, 16, 4, 2))

    def run(li, backward, x, ei, w, nt, g):
        return compute_layer(lw, li, backward, x, ei, w, nt, g)

    ws = WorkspaceModel(run, lw.widths, torch.float32, False, torch.device("cpu"))
    # SAGEConv's message is x_j = x[src]: an E x in_channels float block
    for li, width in ((0, 24), (1, 16)):
        for backward in (False, True):
            assert width * 4 in ws.edge_blocks[li, backward]
    first = ws.edge_blocks[0, True]
    n_e = 100_000
    big = max(first) * n_e
    assert ws.mapped_bytes(0, True, n_e, big + 1) == 0
    assert ws.mapped_bytes(0, True, n_e, big) == sum(
        b * n_e for b in first if b * n_e >= big)
    assert ws.mapped_bytes(0, True, n_e, 1) == round(sum(first) * n_e)
    assert ws.mapped_bytes(0, True, n_e, None) == 0  # no heap: nothing mapped
