"""Will a run fit? A quick memory estimate, checked before anything is allocated.

A configuration whose model or activations cannot fit must fail with one line
naming the estimate, not with an allocator traceback minutes into a run, a
swapping machine, or an out-of-memory kill. The estimate is deliberately a
*lower* bound (every coefficient below is at or under what was measured), so
a run is refused only when it surely cannot fit; the planner makes the finer
estimates.

Measured on CPU (``SavedTensorsMeter``, 2k nodes, 16k edges, 32 channels,
4 vs 8 layers): plain autograd saves 2.1-3.5 x ``N C`` floats per layer for
SAGE/GCN convs (13-14 x for GAT), the GSR stack ~5.4 x ``N C`` floats in all,
independent of depth; every layer of ``res``/``gsr`` costs 25-42 KiB of Python
module objects; ``contextual_sbm`` peaks at ~2.7 KB per node while generating.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from leangnn.utils import format_bytes

__all__ = ["FitEstimate", "parameter_count", "estimate", "available_bytes",
           "free_to_process",
           "check_fits", "check_graph_fits", "CSBM_BYTES_PER_NODE",
           "PROBE_IN_CHANNELS", "PROBE_OUT_CHANNELS"]

#: lower bounds of the measured costs (see the module docstring)
ACTIVATION_FLOATS_PER_LAYER = 2      # x N x C, plain autograd, per layer
REVERSIBLE_ACTIVATION_FLOATS = 4     # x N x C, whole reversible stack
OPTIMIZER_COPIES = 4                 # parameter, gradient, two Adam moments
MODULE_BYTES_PER_LAYER = 16 << 10    # Python objects of one layer's modules
CSBM_BYTES_PER_NODE = 2048           # peak while generating a csbm graph
#: input/output widths a model is counted with before the data is loaded: as
#: wide as any bundled dataset's (circuits ~16 features, csbm 64; 8 classes),
#: so models that check their input columns (e.g. gate types) accept them;
#: the difference to the real widths is one encoder/head row per channel.
PROBE_IN_CHANNELS, PROBE_OUT_CHANNELS = 64, 8


@dataclass
class FitEstimate:
    """Estimated bytes of a run (lower bounds).

    Attributes:
        device (str): where the model trains.
        parameters (int): number of model parameters.
        parameter_bytes (int): parameters, gradients and Adam moments.
        activation_bytes (int): what one training step keeps on the device.
        graph_bytes (int): graph data copied to a CUDA device for a step.
        host_bytes (int): host-only memory: module objects, offload's
            host store, and the graph itself when it is not loaded yet.
    """

    device: str
    parameters: int
    parameter_bytes: int
    activation_bytes: int
    graph_bytes: int
    host_bytes: int

    @property
    def device_bytes(self) -> int:
        """Bytes needed on the training device (all of them on CPU)."""
        dev = self.parameter_bytes + self.activation_bytes + self.graph_bytes
        return dev + self.host_bytes if _is_cpu(self.device) else dev

    def describe(self) -> str:
        parts = [("parameters and optimizer state", self.parameter_bytes),
                 ("activations", self.activation_bytes),
                 ("graph", self.graph_bytes),
                 ("model objects and host store", self.host_bytes)]
        return ", ".join(f"{what} {format_bytes(n)}" for what, n in parts if n)


def _is_cpu(device: str) -> bool:
    return torch.device(device).type == "cpu"


#: parameter counts by model entry, sizes and options: every configuration
#: made (each plan row's, each ``replace``) validates by counting, and a
#: count builds two models (a tenth of a small row's estimate, measured)
_COUNTS: dict[tuple, tuple[object, int]] = {}
_COUNTS_MAX = 4096


def _count(cfg, num_layers: int, in_channels: int, out_channels: int) -> int:
    from leangnn.nn.models import build_model, get_model

    opts = cfg.model_options()
    # keyed by the registry entry's identity (kept alive beside the count, so
    # no later entry takes its id): a model registered again under the same
    # name is counted anew
    entry = get_model(cfg.model)
    try:
        key = (cfg.model, id(entry), cfg.hidden_channels, num_layers, in_channels,
               out_channels, tuple(sorted(opts.items())))
        hit = _COUNTS.get(key)
    except TypeError:  # an unhashable option: counted every time
        key, hit = None, None
    if hit is not None:
        return hit[1]
    # Built on the meta device: shapes only, no memory and no RNG draws.
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = build_model(cfg.model, in_channels, cfg.hidden_channels,
                            out_channels, num_layers, **opts)
    n = sum(p.numel() for p in model.parameters())
    if key is not None and len(_COUNTS) < _COUNTS_MAX:
        _COUNTS[key] = (entry, n)
    return n


def parameter_count(cfg, in_channels: int = PROBE_IN_CHANNELS,
                    out_channels: int = PROBE_OUT_CHANNELS) -> int:
    """Parameters of ``cfg``'s model, without building its ``num_layers`` layers.

    Counts models of 1-3 layers on the meta device and extrapolates linearly
    from the third layer on (exact for models whose hidden layers repeat, as
    every registered model's do; the first and last layers of the shallow
    baselines differ, hence three).
    """
    n = cfg.num_layers
    if n <= 3:
        return _count(cfg, n, in_channels, out_channels)
    p2, p3 = (_count(cfg, k, in_channels, out_channels) for k in (2, 3))
    return p3 + (n - 3) * (p3 - p2)


def _csbm_defaults() -> tuple[float, int, int]:
    from leangnn.graphs.synthetic import contextual_sbm

    ps = inspect.signature(contextual_sbm).parameters
    return (float(ps["avg_degree"].default), int(ps["in_channels"].default),
            int(ps["num_classes"].default))


def estimate(cfg, num_nodes: int | None = None, num_edges: int | None = None,
             in_channels: int = PROBE_IN_CHANNELS,
             out_channels: int = PROBE_OUT_CHANNELS,
             loaded: bool = True) -> FitEstimate:
    """Lower-bound memory estimate of training ``cfg`` on a graph of
    ``num_nodes`` nodes and ``num_edges`` edges (``None``: parameters only).

    ``loaded=False`` adds the graph's own host memory (once loaded, it is
    already out of what :func:`available_bytes` reports)."""
    from leangnn.nn.models import get_model

    params = parameter_count(cfg, in_channels, out_channels)
    pbytes = params * 4 * OPTIMIZER_COPIES
    layers, c = cfg.num_layers, cfg.hidden_channels
    host = layers * MODULE_BYTES_PER_LAYER
    act = graph = 0
    if num_nodes:
        n, e = num_nodes, num_edges or 0
        if cfg.strategy == "prune":
            n, e = math.ceil(n * cfg.budget_ratio), math.ceil(e * cfg.budget_ratio)
        if cfg.strategy == "offload":
            # Layer-wise execution keeps one embedding per node and layer in
            # the host store; the device side is bounded by device_budget.
            host += layers * n * c * 4
        elif get_model(cfg.model).reversible:
            act = REVERSIBLE_ACTIVATION_FLOATS * n * c * 4
        else:
            # L - 1: the first and last layers of the shallow baselines are
            # narrower (input / output width), so only the hidden ones count.
            act = (layers - 1) * ACTIVATION_FLOATS_PER_LAYER * n * c * 4
        data = num_nodes * in_channels * 4 + (num_edges or 0) * 16
        if not _is_cpu(cfg.device):
            graph = data
        if not loaded:
            host += data
    return FitEstimate(cfg.device, params, pbytes, act, graph, host)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def _host_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``, capped by a cgroup memory limit."""
    avail = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max",
                          "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim, use = _read_int(limit), _read_int(usage)
        # cgroup v1 reports "no limit" as a huge number; ignore those
        if lim is not None and use is not None and lim < (1 << 60):
            avail.append(max(0, lim - use))
    if not avail and hasattr(os, "sysconf"):
        try:
            avail.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    return min(avail) if avail else None


def available_bytes(device: str | torch.device) -> int | None:
    """Free memory of ``device`` now: host ``MemAvailable`` (cgroup-capped) for
    CPU, :func:`torch.cuda.mem_get_info` for CUDA; ``None`` when unknown."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return _host_available()
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(dev)[0])
    return None


def free_to_process(device: torch.device | str = "cpu") -> int | None:
    """What this process could hold on ``device`` now: the device's free
    memory (:func:`available_bytes`) plus what the
    process holds there already (its resident set on a CPU, the caching
    allocator's reserve on CUDA), so that the figure does not shrink as a
    plan loads graphs and builds cores; ``None`` when unknown."""
    from leangnn.profile import rss_bytes

    dev = torch.device(device)
    have = available_bytes(dev)
    if have is None:
        return None
    if dev.type == "cpu":
        return have + rss_bytes()
    if dev.type == "cuda":
        return have + torch.cuda.memory_reserved(dev)
    return have


def _refuse(cfg, what: str, need: int, have: int, detail: str) -> None:
    raise ValueError(
        f"num_layers={cfg.num_layers}, hidden_channels={cfg.hidden_channels}, "
        f"model={cfg.model}: this run needs ~{format_bytes(need)} of {what} memory "
        f"(estimate: {detail}), only {format_bytes(have)} available; use fewer or "
        "narrower layers, a smaller graph or a memory strategy "
        "(--strategy reversible, prune or offload)")


def check_graph_fits(num_nodes: int) -> None:
    """Refuse generating a ``csbm`` graph of ``num_nodes`` nodes that cannot
    fit in host memory."""
    need, have = num_nodes * CSBM_BYTES_PER_NODE, _host_available()
    if have is not None and need > have:
        raise ValueError(f"dataset: csbm:{num_nodes} needs ~{format_bytes(need)} "
                         f"of host memory to generate (estimate), only "
                         f"{format_bytes(have)} available")


def check_fits(cfg, splits=None) -> None:
    """Raise ``ValueError`` with the estimate when ``cfg`` surely cannot fit.

    Args:
        cfg (TrainConfig): the run.
        splits (GraphSplits, optional): the loaded graphs; the largest
            training graph sizes the activations. Without them only the
            parameters count, plus the graph of a ``csbm:N`` dataset (whose
            size the spec gives, and which is generated first).
    """
    if splits is not None:
        g = max(splits.train, key=lambda d: int(d.num_nodes))
        est = estimate(cfg, int(g.num_nodes), int(g.num_edges),
                       splits.in_channels, splits.out_channels)
    elif cfg.dataset and cfg.dataset.startswith("csbm:"):
        from leangnn.graphs.synthetic import csbm_nodes

        n = csbm_nodes(cfg.dataset)
        check_graph_fits(n)
        degree, features, classes = _csbm_defaults()
        est = estimate(cfg, n, int(n * degree), features, classes, loaded=False)
    else:
        est = estimate(cfg)
    have = available_bytes(cfg.device)
    if have is not None and est.device_bytes > have:
        _refuse(cfg, str(cfg.device), est.device_bytes, have, est.describe())
    if not _is_cpu(cfg.device):
        host = _host_available()
        if host is not None and est.host_bytes > host:
            _refuse(cfg, "host", est.host_bytes, host,
                    f"model objects / host store {format_bytes(est.host_bytes)}")
