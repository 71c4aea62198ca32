"""The machine's speed now: a short timed probe that scales the time estimates.

Epoch-time estimates are the traced work of a configuration (ops, bytes
written, FLOPs) times per-op / per-byte / per-FLOP costs fitted by
:mod:`leangnn.plan.calibrate` on a few real runs. Those costs hold for the
machine *as it was* during calibration; on a shared machine the same epoch
takes up to 4x longer when other jobs load the cores (measured while
benchmarking the planner). The probe re-measures that factor at planning
time: one real training step of a small fixed workload (a 2-layer
GraphSAGE on a 4,000-node graph: per-node and per-edge work, the kernels
every candidate runs), timed, over what the calibrated costs predict for
its traced work. The factor multiplies every row's estimate alike, so it
changes no ranking; it makes the figures in the table (and in a planned
run's ``summary.json``) those of the machine now.

Costs ~0.1-0.5 s on a quiet machine (the probe's traced work is stored
beside the calibrations, per torch version); the factor is kept for
:data:`PROBE_TTL` seconds.
"""

from __future__ import annotations

import json
import time

import torch

__all__ = ["speed_factor", "probe_seconds", "PROBE_TTL"]

#: seconds a measured factor is reused (one plan, or a few in a row)
PROBE_TTL = 120.0
_CACHE: dict[str, tuple[float, float]] = {}
_WORK: dict[str, dict[str, float]] = {}
_GRAPH: list = []


def _probe(device: torch.device):
    from torch_geometric.nn import GraphSAGE

    from leangnn.graphs.synthetic import contextual_sbm

    with torch.random.fork_rng(devices=[]):
        if not _GRAPH:
            _GRAPH.append(contextual_sbm(4000, avg_degree=8.0, in_channels=32,
                                         seed=0))
        g = _GRAPH[0]
        torch.manual_seed(0)
        model = GraphSAGE(32, 64, 2, int(g.y.max()) + 1)
    return model, g


def _loss(out, data):
    return torch.nn.functional.cross_entropy(out, data.y)


def probe_seconds(device: torch.device | str = "cpu", repeats: int = 3) -> float:
    """Fastest of ``repeats`` real training steps of the probe (after one
    warm-up), in seconds."""
    dev = torch.device(device)
    model, g = _probe(dev)
    model.to(dev)
    g = g.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    best = float("inf")
    with torch.random.fork_rng(devices=[]):
        for i in range(repeats + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            _loss(model(g.x, g.edge_index), g).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i:
                best = min(best, time.perf_counter() - t)
    return best


def _probe_work(device: torch.device) -> dict[str, float]:
    from leangnn.utils import atomic_write_text, cache_root

    key = f"{device.type}-torch{torch.__version__}"
    path = cache_root("calibration") / "probe_work.json"
    if key not in _WORK:
        try:
            _WORK.update(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    if key not in _WORK:
        from leangnn.plan.fake import trace_step

        model, g = _probe(device)
        t = trace_step(model, g, _loss, device=device)
        _WORK[key] = {"ops": t.ops, "written": t.written, "flops": t.flops}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(_WORK, indent=1) + "\n")
    return _WORK[key]


def speed_factor(calibration, device: torch.device | str = "cpu") -> float:
    """Measured probe time over what ``calibration`` predicts for it (1.0 when
    it predicts nothing); cached for :data:`PROBE_TTL` seconds."""
    dev = torch.device(device)
    key = f"{dev}:{calibration.kind}"
    now = time.monotonic()
    if key in _CACHE and now - _CACHE[key][0] < PROBE_TTL:
        return _CACHE[key][1]
    predicted = calibration.seconds(_probe_work(dev), scaled=False)
    factor = 1.0
    if predicted and predicted > 0:
        factor = probe_seconds(dev) / predicted
    _CACHE[key] = (now, factor)
    return factor
