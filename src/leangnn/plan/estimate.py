"""Estimated peak memory and epoch time of one training configuration.

The estimator of the planner (the question Betty answers for one aggregator
with a formula, answered here for any PyG model by a dry run). Per strategy:

* ``full`` / ``reversible``: one training step (forward, loss, backward,
  clipping, Adam) of the model on the largest training graph under fake
  tensors (:func:`~leangnn.plan.dryrun.trace_step`). A deep registered model is
  traced at two small depths and every phase's peak extrapolated linearly in
  depth (exact for models whose hidden layers repeat; tested), so the dry run
  costs the same at 256 layers as at 8.
* ``prune``: the core of the largest training graph is selected for real (the
  importance and core selection are cheap), then the step is traced on it.
* ``offload``: the engine's own accounting, replayed by a counting engine
  (``virtual=True``): the device peak it charges (with the safety margin on
  each job's workspace taken back out), the host store it holds.

With several training graphs, Adam's moments (allocated in the first step)
are live under every later step's activations, and on CPU the heap keeps what
the small graphs' steps left there (:func:`_epoch_heap`).

The rows of one plan (:func:`plan_scope`) share what depends on the graph
alone (its hash, its symmetric adjacency, node importance), and what a row
builds for training (DPR's core, the offload engine's graph grouped by target
and partitioned) is offered to the run that trains the pick, which takes it
over instead of building it again (:meth:`~leangnn.prune.dpr.DPRStrategy.
offer`, :func:`~leangnn.offload.engine.offer_graph`): only for the very same,
unchanged graph and configuration, at most a few, withdrawn by
:func:`forget` but for the pick's. ``LEANGNN_PLAN_REUSE=0`` switches all of
it off (:func:`~leangnn.graphs.partition.reuse_enabled`).

Bytes are tensor bytes; :mod:`leangnn.plan.calibration` adds the allocator's
overhead measured on this machine (CPU resident memory, CUDA's caching
allocator) and turns the traced work into seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from leangnn.heap import heap_threshold
from leangnn.plan.collectives import scale_comm
from leangnn.plan.dag import (
    cached_plans_bytes,
    concrete_limit,
    host_peak_bytes,
    is_dag_model,
    sweep_work,
    trace_levels,
)
from leangnn.plan.dpr_state import validation_kept_bytes
from leangnn.plan.dryrun import trace_step
from leangnn.plan.fake import (
    COLD_BYTES,
    MAX_OPS,
    StepTrace,
    TooManyOpsError,
    UnsupportedOpError,
    tensor_bytes,
)
from leangnn.strategy import call_model

__all__ = ["Estimate", "depth_points", "fallback_depths", "op_limit",
           "estimate_model", "estimate_config", "default_loss", "largest_graph",
           "core_of", "offload_step",
           "forget", "withdraw", "plan_scope", "planning", "EXTRAPOLATE_ABOVE",
           "chunked_work", "job_edge_bytes", "engine_setup_bytes",
           "offload_estimate", "host_floor_bytes"]

#: registered models deeper than this are traced at :func:`depth_points`
EXTRAPOLATE_ABOVE = 8


@dataclass
class Estimate:
    """Estimated memory and time of training one configuration.

    Attributes:
        strategy (str): ``full``, ``reversible``, ``prune`` or ``offload``.
        knobs (dict): the strategy's settings (depth, groups, core ratio, ...).
        device (str): the training device.
        step_bytes (int): tensor bytes one training step adds above the loaded
            state (gradients, optimizer moments, activations, temporaries;
            the graph too where a step copies it to a CUDA device).
        model_bytes (int): parameters and buffers on the device.
        graph_bytes (int): graph tensors resident on the device before the
            step (the training graph on CPU, DPR's core).
        overhead_bytes (int): calibrated allocator overhead on top.
        host_bytes (int): host memory the step adds outside the device
            (offload's host store on a CUDA run; the features are loaded).
        epoch_seconds (float, optional): estimated training epoch time.
        method (str): how it was estimated (``fake``, ``fake+extrapolated``,
            ``offload-accounting``, ``analytic``).
        note (str): what the reader should know (fallbacks, assumptions).
        estimate_seconds (float): what the estimate itself took.
        work (dict): traced work of one epoch (:data:`WORK_KEYS`).
        phases (dict): per-phase peak bytes of the step.
        big_bytes, heap_bytes (int): on CPU, the step's bytes in blocks of
            their own pages and the C heap's high-water at the moment that
            counts (see :class:`~leangnn.plan.fake.FakeTracker`); the
            calibration turns them into resident memory.
        floor_bytes (int): on CPU, the least resident bytes of the step under
            glibc's heap (:class:`~leangnn.plan.heapsim.HeapModel`): the
            calibrated heap factor's figure is raised to it where it is
            lower (deep stacks with large transient blocks);
            ``floor_decided`` says that it did, by at least 5% and 1 MiB
            (:data:`~leangnn.plan.calibration.FLOOR_DETAIL_SHARE`).
        heap_edge_share (float): on CPU, the share of the heap's
            high-water in edge-sized tensors (``E x C`` messages).
        setup_bytes (int): host bytes the strategy's setup keeps before the
            first step (offload: every training graph's engine topology,
            :func:`engine_setup_bytes`); on CPU part of the need.
        setup_overhead_bytes (int): what the setup keeps beyond that
            accounting, set by the calibration
            (:attr:`~leangnn.plan.calibration.Calibration.setup_const`).
        later (tuple, optional): ``(step, big, heap)`` bytes of epochs after
            the first (Adam's moments and every graph's heap already there);
            ``later_run_bytes`` with the overhead. The figures above are the
            first epoch's, what ``leangnn train --epochs 1`` reports.
        precompute_bytes (int): host bytes the model's own precomputation
            outside torch peaks at in the first step (the DAG model's cut
            estimate: :func:`~leangnn.plan.dag.host_peak_bytes`); the run
            needs the larger of it and the step.
        ranks (list of dict): a distributed row's every rank (part sizes,
            ``run_bytes``, ``peak_bytes``, ``epoch_seconds``); the figures
            above are its largest rank's (:mod:`leangnn.plan.distributed`).
    """

    strategy: str
    knobs: dict[str, Any]
    device: str
    step_bytes: int
    model_bytes: int = 0
    graph_bytes: int = 0
    overhead_bytes: int = 0
    host_bytes: int = 0
    epoch_seconds: float | None = None
    method: str = "fake"
    note: str = ""
    estimate_seconds: float = 0.0
    work: dict[str, float] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    big_bytes: int = 0
    heap_bytes: int = 0
    floor_bytes: int = 0
    floor_decided: bool = False
    heap_edge_share: float = 0.0
    later: tuple[int, int, int] | None = None
    later_run_bytes: int | None = None
    precompute_bytes: int = 0
    setup_bytes: int = 0
    setup_overhead_bytes: int = 0
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_bytes(self) -> int:
        """What the Trainer's meter reports: the step's peak above the loaded
        state, allocator overhead included."""
        return self.step_bytes + self.overhead_bytes

    @property
    def costliest_run_bytes(self) -> int:
        """:attr:`run_bytes` of the costlier of the first and later epochs."""
        return max(self.run_bytes, self.later_run_bytes or 0)

    @property
    def counted_setup_bytes(self) -> int:
        """The part of the setup's bytes (``setup_bytes`` and
        ``setup_overhead_bytes``) the need counts: all of it on a CPU, none
        on CUDA (host memory, checked apart)."""
        if torch.device(self.device).type != "cpu":
            return 0
        return self.setup_bytes + self.setup_overhead_bytes

    @property
    def fixed_bytes(self) -> int:
        """What the need counts beside the run: the model and the resident
        graph, and on CPU offload's host store and what its setup keeps
        (``setup_bytes``; all loaded before the Trainer's meter starts, so
        not in ``memory.peak_bytes``)."""
        host = self.host_bytes if torch.device(self.device).type == "cpu" else 0
        return self.model_bytes + self.graph_bytes + host + self.counted_setup_bytes

    @property
    def peak_bytes(self) -> int:
        """Device bytes the run needs in all (model, resident graph, the
        step of its costliest epoch, overhead); on CPU the host store of
        offload counts too."""
        return self.fixed_bytes + self.costliest_run_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_bytes"], d["peak_bytes"] = self.run_bytes, self.peak_bytes
        return d


# ------------------------------------------------------------------ helpers
def default_loss(data: Data) -> Callable[[Tensor, Data], Tensor]:
    """Cross-entropy for integer labels, MSE otherwise, on ``node_mask``.

    Raises:
        ValueError: ``data`` has no ``y`` (pass a ``loss_fn`` of your own).
    """
    import torch.nn.functional as F

    if data.get("y", None) is None:
        raise ValueError("data: has no targets (data.y is None); the default loss "
                         "(cross-entropy or MSE on data.y) needs them: set data.y "
                         "or pass loss_fn(out, data)")
    classify = not data.y.is_floating_point()
    if classify and data.y.dim() > 1 and data.y[:1].numel() != 1:
        # (cross-entropy would read the flattened y as N * C class ids and
        # fail on a batch-size mismatch)
        raise ValueError(f"data: y has shape {list(data.y.shape)}, integer, not "
                         "one class id per node; the default loss takes class "
                         "ids [N] (one-hot labels: data.y = data.y.argmax(1); "
                         "multi-label targets: data.y = data.y.float()) or "
                         "loss_fn(out, data)")

    def loss_fn(out: Tensor, d: Data) -> Tensor:
        if not isinstance(out, Tensor):
            # (indexing a tuple with the mask fails with a bare TypeError)
            raise ValueError(f"default loss: the model returned a "
                             f"{type(out).__name__}, not one [N, C] tensor of node "
                             "outputs; pass loss_fn(out, data) reading it")
        y, mask = d.y, d.get("node_mask", None)
        if mask is not None:
            out, y = out[mask], y[mask]
        if classify:
            return F.cross_entropy(out, y.reshape(-1))
        if out.numel() != y.numel():
            # (MSE's reshape would fail with two bare element counts)
            raise ValueError(f"default loss: MSE of the model's output "
                             f"{list(out.shape)} against float y {list(y.shape)} "
                             "needs as many outputs as targets; for class ids make "
                             "y an integer tensor (data.y = data.y.long()), or "
                             "pass loss_fn(out, data)")
        return F.mse_loss(out.reshape(-1), y.reshape(-1).to(out.dtype))

    return loss_fn


def largest_graph(graphs: list[Data]) -> Data:
    """The training graph whose step needs the most (most nodes + edges)."""
    return max(graphs, key=lambda g: int(g.num_nodes) + int(g.num_edges))


#: the traced work the time estimate prices (:class:`~leangnn.plan.fake.
#: StepTrace`): ops, bytes of new storages, of those of 1 MiB or more (past
#: the core's caches), of those at or above the heap threshold (fresh pages:
#: faulted in as written) and FLOPs
WORK_KEYS = ("ops", "written", "cold_written", "big_written", "flops",
             "sparse_flops")


def depth_points(num_layers: int) -> tuple[int, ...]:
    """Depths a registered model is traced at: itself when shallow, else two
    (2 and 4) to extrapolate from.

    Every registered model repeats its hidden layer (the shallow PyG models
    from their second layer on), so each phase's peak is affine in depth from
    there; tests check the extrapolation against a direct dry run.
    """
    if num_layers <= EXTRAPOLATE_ABOVE:
        return (num_layers,)
    return (2, 4)


def op_limit(num_layers: int, depth: int) -> int:
    """The op limit of a dry run at ``depth`` of a ``num_layers`` stack.

    :data:`~leangnn.plan.fake.MAX_OPS` bounds a trace as long as the real
    step it stands for (a traced op costs several real small ones: a DAG
    model's level sweeps). A shallow trace that extrapolates a deep stack
    stands for a step ``num_layers / depth`` times its length, so it may run
    up to a quarter of that step's ops: GSR-128 with 64 groups (3,000 ops a
    layer) had stopped at its 4-layer trace, 1.7 s in, and its plan held
    only a lower bound; now traced in 1.7 s, against a 60 s epoch measured
    (its need 13.0 MiB estimated, 15.1 measured, default circuits).
    """
    return max(MAX_OPS, MAX_OPS * num_layers // (4 * max(1, depth)))


def fallback_depths(num_layers: int, gsr: bool = False) -> list[tuple[int, int]]:
    """The depth pairs a stack over the op limit at its own depth (a shallow
    stack of many-op layers: GSR's GAT group functions, many groups) is
    extrapolated from instead, in the order tried: 2 and 4, its hidden
    layers repeating; for GSR then 1 and 2 (it repeats from its first layer
    on: 1 and 2 give the 7-layer trace to the byte; 64 groups pass the limit
    at 4 layers already). Only pairs below ``num_layers``."""
    pairs = [(2, 4)] + ([(1, 2)] if gsr else [])
    return [p for p in pairs if num_layers > p[1]]


def _linear(points: list[tuple[int, float]], x: int) -> float:
    (x0, y0), (x1, y1) = points
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _combine(traces: dict[int, StepTrace], num_layers: int, model_bytes: dict
             ) -> dict[str, Any]:
    """Step peak, phase peaks, work, model bytes and the heap point at
    ``num_layers``, extrapolated linearly from the traced depths."""
    depths = sorted(traces)
    if len(depths) == 1:
        (t,) = traces.values()
        return {"peak": t.peak_bytes,
                "phases": {k: v["peak"] for k, v in t.phases.items()},
                "work": {**{k: getattr(t, k) for k in WORK_KEYS},
                         "cold_blocks": sorted(t.cold_blocks.items())},
                "model_bytes": model_bytes[depths[0]], "heap": t.heap_point(),
                "floor": t.heap_floor, "edge_share": t.heap_edge_share}

    def at(values: list) -> float:
        return _linear(list(zip(depths, values)), num_layers)

    phases = {name: max(0, round(at([traces[d].phases[name]["peak"]
                                     for d in depths])))
              for name in traces[depths[0]].phases}
    points = [traces[d].heap_point() for d in depths]
    return {"peak": max(phases.values()) if phases else 0, "phases": phases,
            "work": {**{k: max(0.0, at([getattr(traces[d], k) for d in depths]))
                        for k in WORK_KEYS},
                     "cold_blocks": _extrapolate_blocks(
                         [traces[d].cold_blocks for d in depths], depths, num_layers)},
            "model_bytes": round(at([model_bytes[d] for d in depths])),
            "heap": (max(0, round(at([p[0] for p in points]))),
                     max(0, round(at([p[1] for p in points])))),
            "floor": max(0, round(at([traces[d].heap_floor for d in depths]))),
            "edge_share": min(1.0, max(0.0, at([traces[d].heap_edge_share
                                                for d in depths])))}


def _extrapolate_blocks(blocks: list[dict[int, int]], depths: list[int],
                        num_layers: int) -> list[list[float]]:
    """``[bytes, count]`` of each size of new storage at ``num_layers``, the
    counts extrapolated linearly from the traced depths."""
    sizes = sorted(set().union(*blocks))
    out = [[s, _linear([(d, b.get(s, 0)) for d, b in zip(depths, blocks)],
                       num_layers)] for s in sizes]
    return [[s, c] for s, c in out if c > 0]


def chunked_work(work: dict[str, Any], chunks: int,
                 heap_threshold: int) -> dict[str, Any]:
    """``work`` of a full-batch step done in ``chunks`` jobs (offload): the
    same bytes, ops and FLOPs, but each of its large storages is ``chunks``
    storages a chunk in size, so fewer of them are past the core's caches
    (``cold_written``) or fresh pages of their own (``big_written``).

    Why: priced as the full-batch step, an offloaded epoch on a CPU paid for
    faulting in pages its chunk-sized blocks never take (csbm:8000, SAGE-3:
    estimated 0.25-0.27 s, measured 0.12-0.15 s, beside full batch's
    0.18 s). Work without ``cold_blocks`` (older traces) is returned as is.
    """
    blocks = work.get("cold_blocks")
    if not blocks or chunks <= 1:
        return dict(work)
    out = dict(work)
    for key, limit in (("cold_written", COLD_BYTES), ("big_written", heap_threshold)):
        if key == "big_written" and not limit:
            continue  # no heap (CUDA): every block is "fresh" in any size
        whole = sum(s * c for s, c in blocks if s >= limit)
        split = sum(s * c for s, c in blocks if s / chunks >= limit)
        out[key] = max(0.0, work.get(key, 0) - whole + split)
    return out


def job_edge_bytes(eng, num_edges: int) -> int:
    """Edge-sized bytes of an offload engine's typical job that its heap
    holds: per layer and phase, the workspace model's per-edge coefficient
    times the edges of one chunk (``E / chunks``), less the blocks glibc maps
    apart (:meth:`~leangnn.offload.workspace.WorkspaceModel.mapped_bytes`:
    they leave no hole in the heap), the largest; 0 for one chunk, where
    every job is the whole layer and the next one reuses its blocks as they
    were (measured: s38417, GCN-2 in one chunk, 1.35x its accounting, as
    circuits in many)."""
    chunks = int(eng.num_chunks)
    ws = eng.ws
    fits = getattr(ws, "fits", None)
    if chunks <= 1 or not fits:
        return 0
    n_e = int(num_edges) / chunks
    threshold = eng.split.heap_threshold
    return round(max(max(0.0, float(f.coef[2])) * n_e
                     - ws.mapped_bytes(layer, backward, round(n_e), threshold)
                     for (layer, backward), f in fits.items()))


def engine_setup_bytes(eng, floor: bool = False) -> int:
    """Host bytes an offload engine keeps from its setup: the edges grouped
    by target (with GCN's weights), the degrees, the partition and every
    chunk's topology (local edges as int32, weights, source and target ids),
    counted from a counting engine's schedule. With ``floor``, what any
    device budget and part count keeps: the halo's source ids left out (each
    edge and target is in one chunk whatever the cut).

    Why: they are built before the Trainer's meter starts, so neither the
    step's accounting nor ``memory.peak_bytes`` has them, yet they stay
    resident. Measured (csbm:100000, GCN-2, 8 parts): the real engine's
    distinct storages 70.2 MiB, this count 70.2 MiB; its setup grew the
    process by 74.9 MiB.
    """
    n = eng.topology_bytes()
    weight = torch.empty((), dtype=eng.dtype).element_size()
    for c in getattr(getattr(eng, "sched", None), "chunks", None) or ():
        n += c.num_edges * (8 + (weight if c.weighted else 0)) + 8 * (
            (0 if floor else c.sources.numel()) + c.targets.numel())
    return n


def _model_bytes(model: torch.nn.Module) -> int:
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _resident_graph_bytes(data: Data, device: torch.device) -> int:
    # On CPU the graph is loaded before a run's meter starts; a CUDA step
    # copies it to the device inside the step (traced there).
    if device.type != "cpu":
        return 0
    return sum(tensor_bytes(v) for v in data.to_dict().values()
               if isinstance(v, Tensor))


def _finish(est: Estimate, calibration, t0: float) -> Estimate:
    if calibration is not None:
        calibration.apply(est)
    est.estimate_seconds = time.perf_counter() - t0
    return est


# ------------------------------------------------------------- user models
def estimate_model(model: torch.nn.Module, data: Data, loss_fn: Callable | None = None,
                   device: torch.device | str = "cpu", strategy: str = "full",
                   step: Callable | None = None, lr: float = 1e-3,
                   clip_norm: float | None = 1.0, calibration=None,
                   knobs: dict | None = None) -> Estimate:
    """Estimate training ``model`` on ``data`` full-batch (any PyG model).

    Args:
        model (Module): the model (not modified; its parameters are copied as
            fake tensors).
        data (Data): the graph (``x``, ``edge_index``, ``y``, optional
            ``node_mask``/``edge_weight``).
        loss_fn (callable, optional): ``loss_fn(out, data)``; default
            :func:`default_loss`.
        device (str, optional): the training device. (default: ``"cpu"``)
        strategy (str, optional): the row's name. (default: ``"full"``)
        step (callable, optional): ``step(model, data, loss_fn)`` doing
            forward, loss and backward (e.g. a strategy's ``train_step``).
        lr, clip_norm: the Trainer's Adam learning rate and clipping.
        calibration (Calibration, optional): adds allocator overhead and time.
        knobs (dict, optional): settings to show in the row.
    """
    t0 = time.perf_counter()
    dev = torch.device(device)
    if step is None and data.get("adj_t", None) is not None and \
            data.get("edge_index", None) is None:
        step = _adj_step  # e.g. DPR's core, trained through its adjacency
    loss_fn = loss_fn or default_loss(data)

    def traced(m: torch.nn.Module, max_ops: int = MAX_OPS):
        return _dry_run(m, data, partial(
            trace_step, m, data, loss_fn, step, lr=lr, clip_norm=clip_norm,
            device=dev, round_to=512 if dev.type == "cuda" else 1, max_ops=max_ops))

    method = "fake"
    try:
        trace, sweeps, host = traced(model)
        c = _combine({0: trace}, 0, {0: _model_bytes(model)})
    except TooManyOpsError:
        tries = _twin_depths(model)
        if not tries:
            raise
        # our deep models repeat their layer: two shallow twins extrapolate
        # the step, as for a configuration's (GSR at 64 layers x 32 groups:
        # 110,000 ops)
        for i, depths in enumerate(tries):
            traces, sizes = {}, {}
            try:
                for depth in depths:
                    twin = model.with_depth(depth)
                    traces[depth] = traced(twin, op_limit(model.num_layers,
                                                          depth))[0]
                    sizes[depth] = _model_bytes(twin)
                break
            except TooManyOpsError:
                if i == len(tries) - 1:
                    raise
        c, sweeps, host = _combine(traces, model.num_layers, sizes), None, 0
        method = "fake+extrapolated"
    est = Estimate(strategy, dict(knobs or {}), str(dev), c["peak"], c["model_bytes"],
                   _resident_graph_bytes(data, dev),
                   work=_scale_work(sweeps or c["work"], data, [data]),
                   phases=c["phases"], big_bytes=c["heap"][0],
                   heap_bytes=c["heap"][1], floor_bytes=c["floor"],
                   heap_edge_share=c["edge_share"], precompute_bytes=host,
                   method=method)
    return _finish(est, calibration, t0)


def _twin_depths(model: torch.nn.Module) -> list[tuple[int, int]]:
    """:func:`fallback_depths` of one of our deep models (its very class: a
    subclass's forward may differ), whose shallow twins
    (``model.with_depth``) extrapolate its step; none for another model."""
    from leangnn.nn.models import GSRGNN, ResGNN

    # (a model pickled whole by an older leangnn has no options to rebuild)
    if type(model) not in (GSRGNN, ResGNN) or not hasattr(model, "_options"):
        return []
    return fallback_depths(model.num_layers, type(model) is GSRGNN)


# ------------------------------------------------------------ configurations
def _build(cfg, in_channels: int, out_channels: int, num_layers: int,
           meta: bool = False):
    """``cfg``'s model (``meta``: on the meta device, shapes only)."""
    from leangnn.nn.models import build_model

    where = torch.device("meta") if meta else nullcontext()
    with torch.random.fork_rng(devices=[]), where:
        return build_model(cfg.model, in_channels, cfg.hidden_channels, out_channels,
                           num_layers, **cfg.model_options())


def _meta_traced(cfg, device: torch.device) -> bool:
    """Whether ``cfg``'s dry run can start from a model built on the meta
    device: a CPU step (the meta backend) of a model whose precomputation
    does not run for real (a DAG model's does, :func:`host_peak_bytes`)."""
    from leangnn.nn.models import get_model

    return device.type == "cpu" and "dag" not in get_model(cfg.model).capabilities


def _knobs(cfg) -> dict[str, Any]:
    k: dict[str, Any] = {"model": cfg.model, "num_layers": cfg.num_layers,
                         "hidden_channels": cfg.hidden_channels}
    if cfg.model in ("res", "gsr"):
        k["conv"] = cfg.conv
    if cfg.model == "gsr" or cfg.strategy == "reversible":
        k["num_groups"] = cfg.num_groups
    if cfg.strategy == "prune":
        k["budget_ratio"] = cfg.budget_ratio
    if cfg.strategy == "offload":
        k.update(device_budget=cfg.device_budget, num_parts=cfg.num_parts,
                 cache=cfg.cache)
    return k


def _dry_run(model: torch.nn.Module, data: Data, run: Callable
             ) -> tuple[StepTrace, dict | None, int]:
    """``run(**trace_step options)``'s trace of ``model``'s step on ``data``;
    for a DAG model on a few key levels (:mod:`leangnn.plan.dag`), with the
    sweeps' work (else ``None``) and its precomputation's host bytes."""
    if not is_dag_model(model) or data.get("edge_index", None) is None:
        return run(), None, 0
    host = host_peak_bytes(model, data)
    trace, sweeps = trace_levels(lambda: run(concrete_limit=concrete_limit(data)),
                                 data)
    return trace, sweeps, host


def _scale_work(work: dict[str, float], big: Data, graphs: list[Data]) -> dict:
    """Work of an epoch over ``graphs`` from the traced step on ``big``: ops
    (and collectives) repeat per graph, bytes and FLOPs scale with the
    graph's size; a DAG
    model's sweeps add theirs by each graph's levels
    (:func:`~leangnn.plan.dag.sweep_work`)."""
    size = int(big.num_nodes) + int(big.num_edges)
    share = sum(int(g.num_nodes) + int(g.num_edges) for g in graphs) / max(1, size)
    out = {"ops": work["ops"] * len(graphs), "written": work["written"] * share,
           "flops": work["flops"] * share,
           **{k: work.get(k, 0) * share
              for k in ("cold_written", "big_written", "sparse_flops")},
           # each graph's blocks are smaller than the largest's: counted as the
           # totals are (bytes by share), their sizes kept
           "cold_blocks": [[b, c * share] for b, c in work.get("cold_blocks", ())],
           # a planned rank's collectives: a step per graph, payloads by size
           **scale_comm(work, len(graphs), share)}
    for k, v in (sweep_work(work["sweep"], graphs) if "sweep" in work else {}).items():
        out[k] += v
    return {**out, "graphs": len(graphs)}


def _trace_config(cfg, data: Data, in_channels: int, out_channels: int, loss_fn,
                  device: torch.device, step: Callable | None = None):
    """The step's trace at ``cfg``'s depth (extrapolated for deep models);
    ``step(model, data, loss_fn)`` replaces the full-batch step (a planned
    rank's, :mod:`leangnn.plan.distributed`)."""
    tries = [depth_points(cfg.num_layers)]
    # (the DAG model's ops grow with the circuit's levels, not its depth)
    if cfg.model != "dag":
        tries += [d for d in fallback_depths(cfg.num_layers, cfg.model == "gsr")
                  if d not in tries]
    for i, depths in enumerate(tries):
        try:
            return _trace_depths(cfg, data, in_channels, out_channels, loss_fn,
                                 device, depths, step)
        except TooManyOpsError:
            if i == len(tries) - 1:
                raise


def _trace_depths(cfg, data: Data, in_channels: int, out_channels: int, loss_fn,
                  device: torch.device, depths: tuple[int, ...],
                  step: Callable | None = None):
    traces, model_bytes = {}, {}
    if step is None and data.get("adj_t", None) is not None and \
            data.get("edge_index", None) is None:
        step = _adj_step
    sweeps, host = None, 0
    # built on the meta device and traced as built: a real model's
    # initialisation and its copy to meta tensors cost a quarter of a small
    # model's estimate (measured), and its values are never read
    meta = _meta_traced(cfg, device)
    for depth in depths:
        model = _build(cfg, in_channels, out_channels, depth, meta=meta)
        model_bytes[depth] = _model_bytes(model)
        traces[depth], swept, pre = _dry_run(model, data, partial(
            trace_step, model, data, loss_fn, step, lr=cfg.lr,
            weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm, device=device,
            round_to=512 if device.type == "cuda" else 1, own_model=meta,
            max_ops=op_limit(cfg.num_layers, depth)))
        sweeps, host = swept or sweeps, max(host, pre)
        del model
    c = _combine(traces, cfg.num_layers, model_bytes)
    if sweeps is not None:
        c["work"] = sweeps
    c["host_peak"] = host
    c["dag"] = sweeps is not None  # a level-sweeping model (its plans are kept)
    return c, len(traces) > 1




def estimate_config(cfg, splits, device: torch.device | str | None = None,
                    calibration=None, loss_fn: Callable | None = None) -> Estimate:
    """Estimate training ``cfg`` (a :class:`~leangnn.config.TrainConfig`) on
    the training graphs of ``splits`` (a :class:`~leangnn.data.GraphSplits`).

    Falls back to the analytic lower bound of :mod:`leangnn.plan.fits` (and
    says so in ``note``) when the model runs an op a dry run cannot follow.
    """
    t0 = time.perf_counter()
    dev = torch.device(device or cfg.device)
    big = largest_graph(splits.train)
    loss_fn = loss_fn or default_loss(big)
    knobs = _knobs(cfg)
    if cfg.strategy == "offload":
        return _finish(_offload(cfg, splits, big, dev, knobs, loss_fn), calibration,
                       t0)
    data, note, graph_bytes = big, "", _resident_graph_bytes(big, dev)
    if cfg.strategy == "prune":
        data, note = _core_graph(cfg, big, dev)
        # the full graph stays loaded on the host, the core joins it
        graph_bytes = _resident_graph_bytes(data, dev)
        knobs["core_nodes"] = int(data.num_nodes)
    try:
        c, extrapolated = _trace_config(cfg, data, splits.in_channels,
                                        splits.out_channels, loss_fn, dev)
    except UnsupportedOpError as e:
        return _finish(_analytic(cfg, splits, data, dev, knobs, str(e)), calibration,
                       t0)
    # The Trainer's first epoch visits the graphs in a seeded order: what
    # came before the largest graph is still there during its step (Adam's
    # moments, heap the small graphs' steps left behind). Later epochs have
    # both from the start (``later_*``).
    train = splits.train
    before = before_largest(cfg, train, big)
    traced: dict[int, int] = {}
    first_fig = _with_history(c, cfg, splits, before, bool(before), loss_fn, dev,
                              traced, big=data)
    if c.get("dag"):
        # the level plans of the graphs stepped on so far, kept by the model
        first_fig = _plus_kept(first_fig, cached_plans_bytes(before + [big], dev))
    # DPR trains every training graph's core: the traced core's work scales
    # with the graphs as the largest one's core does with it (each core is
    # the same share of its graph)
    scale_from = big if cfg.strategy == "prune" else data
    if cfg.strategy == "full" and data is big:
        # the offload rows of the same model time their epoch on this work
        _remember_full_work(cfg, big, splits, dev,
                            _scale_work(c["work"], big, splits.train))
    est = Estimate(cfg.strategy, knobs, str(dev), first_fig[0], c["model_bytes"],
                   graph_bytes, method="fake+extrapolated" if extrapolated else "fake",
                   note=note, work=_scale_work(c["work"], scale_from, train),
                   phases=c["phases"], big_bytes=first_fig[1], heap_bytes=first_fig[2],
                   # bytes kept beside the traced step (plans, moments) sit
                   # on top of the floor as they do on the big blocks
                   floor_bytes=c["floor"] and c["floor"] + first_fig[1] - c["heap"][0],
                   heap_edge_share=c["edge_share"], precompute_bytes=c["host_peak"])
    if cfg.epochs > 1:
        est.later = _with_history(c, cfg, splits, [g for g in train if g is not big],
                                  True, loss_fn, dev, traced, best_state=True,
                                  big=data)
        if c.get("dag"):  # every training and validation graph's plan by now
            est.later = _plus_kept(est.later,
                                   cached_plans_bytes(train + list(splits.val), dev))
        if cfg.strategy == "prune" and splits.val:
            # DPR's state of each validation graph (anchors, serving operands,
            # its own core), built by the first validation pass and kept
            model = _build(cfg, splits.in_channels, splits.out_channels,
                           cfg.num_layers)
            est.later = _plus_kept(est.later, validation_kept_bytes(
                cfg, splits, model, data, big, dev))
    return _finish(est, calibration, t0)


def _plus_kept(fig: tuple[int, int, int], kept: int) -> tuple[int, int, int]:
    """``(step, big, heap)`` with ``kept`` bytes more alive through the step:
    resident one to one (allocated once and kept, no churn to fragment)."""
    step, big, heap = fig
    return step + kept, big + kept, heap


def before_largest(cfg, train: list[Data], big: Data) -> list[Data]:
    """The training graphs the Trainer's first epoch visits before ``big``
    (its seeded order)."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(
        cfg.seed * 100003)).tolist()
    first = next((k for k, i in enumerate(order) if train[i] is big), 0)
    return [train[i] for i in order[:first]]


def _with_history(c: dict, cfg, splits, before: list[Data], moments: bool,
                  loss_fn, device: torch.device, traced: dict,
                  best_state: bool = False, big: Data | None = None
                  ) -> tuple[int, int, int]:
    """(step, big, heap) bytes of the largest graph's step after ``before``
    graphs' steps (and with Adam's moments alive when ``moments``; the
    Trainer's copy of the best weights so far too when ``best_state``)."""
    peak, (big_b, heap_b) = c["peak"], c["heap"]
    if cfg.strategy != "prune":
        heap_b = max(heap_b, _epoch_heap(cfg, splits, before, loss_fn, device,
                                         traced, big))
    if moments:
        # the trace, one step from a fresh optimizer, allocates them after
        # the backward; here they exist before the step's activations do
        extra = (3 if best_state else 2) * c["model_bytes"]
        peak = max([peak] + [v + extra for k, v in c["phases"].items()
                             if k != "optimizer"])
        big_b += extra
    return peak, big_b, heap_b


def _epoch_heap(cfg, splits, before: list[Data], loss_fn, device: torch.device,
                traced: dict, big: Data | None = None) -> int:
    """Heap high-water the steps on ``before`` leave behind.

    glibc keeps freed heap resident, so the small blocks of every graph's
    step (all of a small graph's activations can be below the mmap
    threshold) stay under a later, larger graph's step: measured 35 MiB above
    the tensors on the 13 small circuits of the default split.
    """
    threshold = heap_threshold(device)
    if device.type != "cpu" or not threshold or not before:
        return 0
    # A graph whose every activation is below the threshold puts its whole
    # step on the heap: the largest such graph, and the smallest above it
    # (its per-node statistics), bound what the others leave there.
    row = cfg.hidden_channels * 4
    others = sorted({(int(g.num_nodes), int(g.num_edges)): g for g in before}.items())
    below = [g for (n, _), g in others if n * row < threshold]
    above = [g for (n, _), g in others if n * row >= threshold]
    if big is not None and int(big.num_nodes) * row < threshold:
        # the largest graph's own step is all heap too, and its high-water
        # (already traced) bounds that of any graph no larger in nodes and
        # edges: no dry run of those needed
        nb, eb = int(big.num_nodes), int(big.num_edges)
        below = [g for g in below if int(g.num_nodes) > nb or int(g.num_edges) > eb]
    heap = 0
    for g in below[-1:] + above[:1]:
        if id(g) not in traced:
            t, _ = _trace_config(cfg, g, splits.in_channels, splits.out_channels,
                                 loss_fn, device)
            traced[id(g)] = t["heap"][1]
        heap = max(heap, traced[id(g)])
    return heap


#: traced full-batch work of recent offload rows' models (one per plan; the
#: full row's trace fills it when it comes first, as in the planner), each
#: with the stamp of its graph
_FULL_WORK: dict[tuple, tuple] = {}

#: the last offload row's counting engine (with the stamp of its graph),
#: whose graph structures the next row on the same graph and model reuses
#: (:func:`forget`)
_LIKE: dict[tuple, Any] = {}


def _work_key(cfg, big: Data, splits, device: torch.device) -> tuple:
    return (id(big), big.edge_index.data_ptr(), int(big.num_nodes), str(device),
            json.dumps(cfg.model_options(), sort_keys=True, default=str),
            cfg.model, cfg.num_layers, cfg.hidden_channels, len(splits.train))


def _remember_full_work(cfg, big: Data, splits, device: torch.device,
                        work: dict) -> None:
    from leangnn.graphs.partition import GraphStamp

    key = _work_key(cfg, big, splits, device)
    if _full_work(key, big) is None:
        _FULL_WORK.pop(key, None)
        if len(_FULL_WORK) >= 8:
            _FULL_WORK.pop(next(iter(_FULL_WORK)))
        _FULL_WORK[key] = (GraphStamp(big), work)


def _full_work(key: tuple, big: Data) -> dict | None:
    """The remembered work under ``key`` if it is of ``big`` as it is now (an
    id and a pointer may come back for another graph once one is freed)."""
    hit = _FULL_WORK.get(key)
    return hit[1] if hit is not None and hit[0].matches(big) else None


#: open :func:`plan_scope` blocks
_PLANNING = 0


@contextmanager
def plan_scope() -> Iterator[None]:
    """The rows of one plan are estimated inside: they share the graph's
    symmetric adjacency (prune rows) and its hash (offload rows, one
    partition each), and what they build for training (DPR's core, the
    offload engine's graph structures) is offered to the run that trains
    the pick. Call :func:`forget` (with the pick's configuration) after;
    a block that raises forgets everything itself (nothing of a failed plan
    is kept). Outside, an estimate offers nothing and keeps no adjacency."""
    from leangnn.graphs.partition import reuse_hashes

    global _PLANNING
    _PLANNING += 1
    try:
        with reuse_hashes():
            yield
    except BaseException:
        forget()
        raise
    finally:
        _PLANNING -= 1


def planning() -> bool:
    """Whether a :func:`plan_scope` block is open (its rows offer what they
    build for training)."""
    return _PLANNING > 0


def forget(keep=None) -> None:
    """Drop what one plan's rows share (the last counting engine, which
    holds the graph grouped by target; the symmetric adjacency of the prune
    rows' graph): call when a plan is done. What the plan built for the
    training of a row (DPR's core, the offload engine's graph structures;
    see :meth:`~leangnn.prune.dpr.DPRStrategy.offer`) is withdrawn too, all
    but ``keep``'s (a :class:`~leangnn.config.TrainConfig`: the pick's
    configuration, which ``--strategy auto`` trains next)."""
    from leangnn.offload.engine import withdraw_offers as withdraw_graphs
    from leangnn.prune.dpr import withdraw_offers

    _LIKE.clear()
    for entry in _GRAPHS:
        entry[1] = None  # the adjacency; the scores (N floats) stay
    strategy = getattr(keep, "strategy", None)
    withdraw_offers(_dpr_config(keep) if strategy == "prune" else None)
    withdraw_graphs(keep if strategy == "offload" else None)


def withdraw(cfg) -> None:
    """Drop what the row of ``cfg`` (a ``TrainConfig``) offered for training
    when it cannot be the pick (it does not fit): DPR's core, not kept
    beside the next rows' while they are built."""
    from leangnn.prune.dpr import withdraw_offers

    if getattr(cfg, "strategy", None) == "prune":
        withdraw_offers(drop=_dpr_config(cfg))


#: per recent graph: ``[stamp, symmetric adjacency or None, {importance
#: method: scores}]``. The rows of one plan (core ratios) select cores of
#: the same graph: PageRank and the adjacency are the costly shared parts.
_GRAPHS: list[list] = []


def _graph_entry(data: Data) -> list:
    from leangnn.graphs.partition import GraphStamp, reuse_enabled

    if reuse_enabled():
        for entry in _GRAPHS:
            if entry[0].matches(data):
                return entry
    _GRAPHS[:] = [e for e in _GRAPHS if e[0].alive][-3:]
    entry = [GraphStamp(data), None, {}]
    if reuse_enabled():
        _GRAPHS.append(entry)
    return entry


def _dpr_config(cfg):
    """The :class:`~leangnn.prune.dpr.DPRConfig` a ``TrainConfig`` trains
    (as :meth:`~leangnn.prune.dpr.DPRStrategy.from_config` reads it)."""
    from leangnn.prune.dpr import DPRStrategy

    return DPRStrategy.from_config(cfg).config


def core_of(data: Data, planned: bool | None = None, **dpr) -> Data:
    """DPR's core training graph of ``data`` (``dpr``: fields of
    :class:`~leangnn.prune.dpr.DPRConfig`), selected on the CPU; node
    importance is computed once per graph and method.

    Args:
        data (Data): the graph.
        planned (bool, optional): a row of a plan: the graph's symmetric
            adjacency is kept for the plan's other rows (until
            :func:`forget`), and the core is offered to the training of the
            pick (:meth:`~leangnn.prune.dpr.DPRStrategy.offer`).
            (default: ``None``, i.e. inside a :func:`plan_scope` block)
        **dpr: :class:`~leangnn.prune.dpr.DPRConfig` fields.
    """
    from leangnn.graphs.sparse import undirected_csr
    from leangnn.prune.dpr import DPRStrategy
    from leangnn.prune.importance import node_importance

    if planned is None:
        planned = planning()
    strategy = DPRStrategy(device="cpu", **dpr)
    method = strategy.config.importance
    entry = _graph_entry(data)
    adj = entry[1]
    if adj is None:
        adj = undirected_csr(data.edge_index.cpu(), int(data.num_nodes))
        if planned:
            entry[1] = adj
    score = None
    if isinstance(method, str):
        score = entry[2].get(method)
        if score is None:
            score = entry[2][method] = node_importance(
                data.edge_index.cpu(), int(data.num_nodes), method, adj=adj)
    with torch.random.fork_rng(devices=[]):
        st = (strategy.offer if planned else strategy._build)(data, score=score,
                                                              adj=adj)
    return st.train_data


def _adj_step(model: torch.nn.Module, data: Data, loss_fn) -> float:
    """DPR's training step on a core laid out as a CSR adjacency: PyG's convs
    aggregate by sparse-dense products (no ``[E, C]`` messages)."""
    out = call_model(model, data, data.x, data.adj_t)
    loss = loss_fn(out, data)
    loss.backward()
    return 0.0


def _core_graph(cfg, data: Data, device: torch.device) -> tuple[Data, str]:
    from dataclasses import fields

    from leangnn.prune.dpr import DPRConfig

    dpr = {f.name: getattr(cfg, f.name) for f in fields(DPRConfig)
           if getattr(cfg, f.name, None) is not None}
    core = core_of(data, **dpr)
    return core, (f"core of {int(data.num_nodes)} nodes: {int(core.num_nodes)} "
                  f"nodes, {int(core.num_edges)} edges")


def _analytic(cfg, splits, data: Data, device: torch.device, knobs: dict,
              why: str) -> Estimate:
    from leangnn.plan.fits import estimate as lower_bound

    fe = lower_bound(cfg, int(data.num_nodes), int(data.num_edges),
                     splits.in_channels, splits.out_channels)
    step = fe.activation_bytes + fe.parameter_bytes * 3 // 4
    return Estimate(cfg.strategy, knobs, str(device), step, fe.parameter_bytes // 4,
                    _resident_graph_bytes(data, device), method="analytic",
                    note=f"dry run failed ({why}); analytic lower bound")


def offload_step(eng, counters, x_bytes: int, params: int, device: torch.device
                 ) -> tuple[int, int, int]:
    """``(step, device, host)`` bytes of an offloaded training step from a
    counting engine's epoch: what the step adds above the loaded state (the
    features and parameters) on a CPU "device" (one memory), on the device
    alone, and in the host store alone.

    The accounting charges each job its calibrated workspace times a safety
    margin plus the engine's buffers as an upper bound (it must never exceed
    the budget); the device figure takes the margin back out. On a CPU the
    step is the highest *simultaneous* host + device bytes
    (``peak_total_bytes``: the job's expected bytes, no margin): the sum of
    the two separate peaks, which come at different jobs, over-counted by
    up to 1.5x (s38417, GCN-3: 24.1 MiB estimated, 16.4 MiB live).
    """
    resident, pool_dev = eng.split.resident, eng.cache.nbytes
    job = max(0, counters.peak_device_bytes - resident - pool_dev)
    device_step = max(0, resident - params + pool_dev + round(job / eng.ws.margin))
    # on a CPU "device" the host figure holds the cache pool too
    pool = eng.cache.nbytes if device.type == "cpu" else 0
    host = max(0, counters.peak_host_bytes - x_bytes - pool)
    # (with the blocks glibc maps apart over the heap's high-water)
    total = max(counters.peak_total_bytes, counters.peak_resident_bytes)
    step = max(0, total - x_bytes - params)
    return step, device_step, host


def _offload(cfg, splits, big: Data, device: torch.device, knobs: dict,
             loss_fn) -> Estimate:
    from leangnn.graphs.partition import GraphStamp
    from leangnn.offload import OffloadEngine, OffloadOptions
    from leangnn.offload.engine import offer_graph
    from leangnn.offload.strategy import DEFAULT_BUDGET

    model = _build(cfg, splits.in_channels, splits.out_channels, cfg.num_layers)
    budget = cfg.device_budget or DEFAULT_BUDGET
    opts = OffloadOptions(budget, min(cfg.num_parts, int(big.num_nodes)), cfg.cache,
                          cfg.offload_mode, device=device, virtual=True)
    key = _work_key(cfg, big, splits, device)
    hit = _LIKE.get(key)
    # (another graph may sit where a freed one was: same id and pointer)
    like = hit[1] if hit is not None and hit[0].matches(big) else None
    with torch.random.fork_rng(devices=[]):
        eng = OffloadEngine(model, big, options=opts, like=like)
        counters = eng.simulate(train=True)
    # the next row of the same plan (another part count or budget) reuses the
    # graph grouped by target (and the partition, at the same part count);
    # the training of the pick, if it is this row, reuses both
    _LIKE.clear()
    _LIKE[key] = (GraphStamp(big), eng)
    if _PLANNING:
        offer_graph(eng, big)
    # The compute of an offloaded epoch is that of full-batch training plus
    # the recomputation and the per-job work; time is fitted on both.
    if _full_work(key, big) is None:  # the same for every part count and budget
        try:
            full, _ = _trace_config(cfg, big, splits.in_channels,
                                    splits.out_channels, loss_fn, device)
            work = _scale_work(full["work"], big, splits.train)
        except UnsupportedOpError:
            work = {}
        _remember_full_work(cfg, big, splits, device, work)
    knobs["chunks"] = eng.num_chunks
    est = offload_estimate(eng, counters, big, splits.train, _model_bytes(model),
                           _full_work(key, big), knobs, device)
    if device.type == "cpu":
        est.note = "CPU device: host store and device pool share memory"
    return est


def host_floor_bytes(eng, host: int) -> int:
    """The part of an offload row's host figure ``host`` (``offload_step``)
    that no device budget or part count changes: the store's arrays and the
    per-array row maps (``n`` rows each, whatever the pool), without the
    per-slot metadata, which grows with the pool."""
    return max(0, int(host) - eng.cache.slot_meta_bytes())


def offload_estimate(eng, counters, data: Data, graphs: list[Data], params: int,
                     full_work: dict, knobs: dict, device: torch.device) -> Estimate:
    """The estimate of an offload row from a counting engine ``eng`` and its
    epoch's ``counters`` on ``data``, the largest of the training ``graphs``
    (each gets an engine of its own), with a model of ``params`` bytes whose
    full-batch epoch does ``full_work``."""
    step, device_step, host = offload_step(eng, counters,
                                           data.x.untyped_storage().nbytes(),
                                           params, device)
    # every training graph gets an engine at setup: theirs scaled from this
    # one's by size, as the epoch's work is
    size = int(data.num_nodes) + int(data.num_edges)
    scale = sum(int(g.num_nodes) + int(g.num_edges) for g in graphs) / max(1, size)
    setup = round(engine_setup_bytes(eng) * scale)
    work = chunked_work(full_work, eng.num_chunks, heap_threshold(device))
    work.update(jobs=counters.jobs * len(graphs),
                traffic=counters.traffic_bytes,
                computations=counters.vertex_layer_computations
                + counters.vertex_layer_recomputations,
                device_bytes=device_step, host_bytes=host,
                edge_job_bytes=job_edge_bytes(eng, int(data.num_edges)),
                # (the part of the step in blocks mapped apart: no heap factor)
                mapped_bytes=counters.peak_resident_mapped_bytes,
                # (what every row of a smaller device budget needs at least:
                # the planner's skip, :func:`~leangnn.plan.planner.offload_floor`)
                host_floor_bytes=host_floor_bytes(eng, host),
                setup_floor_bytes=round(engine_setup_bytes(eng, floor=True) * scale))
    if device.type == "cpu":
        # one memory: the host store and the "device" pool add up
        return Estimate("offload", knobs, str(device), step, params,
                        _resident_graph_bytes(data, device),
                        method="offload-accounting", work=work, setup_bytes=setup)
    return Estimate("offload", knobs, str(device), device_step, params, 0,
                    host_bytes=host + setup, method="offload-accounting", work=work,
                    setup_bytes=setup)
