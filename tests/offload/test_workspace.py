"""LiveBytesMeter and the calibrated job-bytes model."""

from __future__ import annotations

import torch

from leangnn.nn.models import build_model
from leangnn.offload.engine import OffloadEngine
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.workspace import LiveBytesMeter, WorkspaceModel, _probe_graph


def test_meter_counts_storages_once_and_releases_them():
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
    assert peak_two == 6000 and after == 2000
    assert m.peak == 6000 and m.live == 4000
    del b, c


def test_model_covers_measured_jobs_of_unseen_sizes():
    torch.manual_seed(0)
    model = build_model("gat", 8, 16, 4, 3)
    lw = LayerwiseModel(model)

    def run(li, backward, x, ei, w, nt, g):
        return OffloadEngine._compute(lw, li, backward, x, ei, w, nt, g)

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
