"""The offload engine: exact full-graph training under a device byte budget.

NeutronJittor (Fundamental Research 2026) trains full-graph GNNs whose
activations exceed the device by running the model *layer by layer over
partitions*: layer ``l`` is computed for one chunk of target vertices at a
time from the layer input of the chunk and its halo, written to a host store,
and reused by every chunk that needs it, so each vertex embedding is computed
once per layer and epoch. Backward runs the same sweeps in reverse: each job
recomputes its layer from the stored input, backpropagates the upstream
gradient of its targets, accumulates parameter gradients and scatters input
gradients (including the halo's) into the host store. With one optimizer step
per epoch this is exactly the full-batch gradient.

The engine is composed of small parts: :class:`~leangnn.offload.options.
OffloadOptions` (every option), :class:`~leangnn.offload.budget.DeviceBudget`
(the split of the budget and each job's charge), a schedule
(:mod:`~leangnn.offload.schedule`), the :class:`~leangnn.offload.cache.
DeviceCache`, a :class:`~leangnn.offload.jobs.JobRunner` (per-job decisions
and counters) and a data plane (:mod:`~leangnn.offload.plane`: real tensors,
or counting only). This module owns the sweeps. On a machine without GPU the
"device" is the CPU: traffic and accounting are the same, times are not GPU
times.

``mode="recompute"`` runs the baseline it replaces in the same engine: each
partition computes all layers for its ``L``-hop in-neighbourhood, so shared
vertices are recomputed by every partition that needs them.

The planner's counting engines offer their graph structures (the edges
grouped by target with the conv's weights, the in-degrees, the partition) to
the engine that trains its pick (:func:`offer_graph`); an engine takes them
over only for the very same, unchanged graph
(:class:`~leangnn.graphs.partition.GraphStamp`) under the same conv
normalisation, and ``LEANGNN_PLAN_REUSE=0`` is the off switch.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import Tensor
from torch_geometric.data import Data

from leangnn.blas_workspace import ensure_blas_workspace
from leangnn.graphs.partition import (
    GraphStamp,
    Partition,
    partition_graph,
    reuse_enabled,
)
from leangnn.graphs.sparse import DstCSR
from leangnn.heap import heap_mode, heap_threshold
from leangnn.offload.budget import DeviceBudget
from leangnn.offload.cache import DeviceCache, resolve_policy
from leangnn.offload.counters import OffloadCounters
from leangnn.offload.jobs import ArrayLayout, CacheKeys, Epoch, Job, JobRunner
from leangnn.offload.layerwise import LayerwiseModel, uncompiled
from leangnn.offload.options import MODES, OffloadOptions
from leangnn.offload.plane import (
    CountingPlane,
    DevicePlane,
    compute_layer,
    probe_code,
    retain_layer,
    rng_devices,
)
from leangnn.offload.schedule import BudgetError, ExactSchedule, RecomputeSchedule
from leangnn.offload.workspace import WorkspaceModel
from leangnn.strategy import edge_attr_refusal

__all__ = ["OffloadEngine", "OffloadCounters", "OffloadOptions", "MODES",
           "offer_graph", "withdraw_offers"]

#: graphs whose structures were offered at once (:func:`offer_graph`)
OFFERS = 2
#: ``[stamp, topology key, csr, degree, {partition key: Partition}]``
_OFFERS: list[list] = []


def offer_graph(eng: OffloadEngine, data: Data) -> None:
    """Keep ``eng``'s graph structures (built for ``data``) for the next
    engine on the very same, unchanged graph under the same conv
    normalisation: its edges grouped by target, in-degrees and partition
    (the planner's offload rows, then the training of the pick). Bounded
    (:data:`OFFERS` graphs), checked by
    :class:`~leangnn.graphs.partition.GraphStamp`, taken by the first
    engine that trains (not counting) on that graph, dropped by
    :func:`withdraw_offers`; nothing is kept with reuse off."""
    if not reuse_enabled():
        return
    key = eng._topology_key()
    for entry in _OFFERS:
        if entry[1] == key and entry[2] is eng.csr and entry[0].matches(data):
            break
    else:
        _OFFERS[:] = [e for e in _OFFERS if e[0].alive][-(OFFERS - 1):]
        entry = [GraphStamp(data), key, eng.csr, eng.degree, {}]
        _OFFERS.append(entry)
    entry[4][eng._partition_key()] = eng.partition


def _offered(data: Data, key: tuple) -> list | None:
    if not _OFFERS or not reuse_enabled():
        return None
    return next((e for e in _OFFERS if e[1] == key and e[0].matches(data)), None)


def withdraw_offers(keep=None) -> None:
    """Drop the offered graph structures (:func:`offer_graph`): all, or all
    partitions but ``keep``'s part count (a configuration with
    ``num_parts``: the planner's offload pick), and those of graphs that no
    longer exist."""
    if keep is None:
        _OFFERS.clear()
        return
    _OFFERS[:] = [e for e in _OFFERS if e[0].alive]
    for e in _OFFERS:
        n = e[2].num_nodes
        e[4] = {k: p for k, p in e[4].items() if k[0] == min(keep.num_parts, n)}


def _upcoming(sched, order: list[int], i: int):
    """The chunk of the job after ``order[i]`` in its sweep (``None`` last)."""
    return sched.chunks[order[i + 1]] if i + 1 < len(order) else None


class OffloadEngine:
    """Exact layer-wise full-graph training with a budgeted device cache.

    Args:
        model (BasicGNN): a PyG ``GCN``/``GraphSAGE``/``GAT``/``GIN``; its
            parameters' device is the device (unless ``device`` is given).
        data (Data): the graph, ``x [N, F]`` and ``edge_index [2, E]``
            (optional ``edge_weight``), kept on the host.
        *args, **kwargs: the fields of :class:`OffloadOptions` in order
            (``device_budget, num_parts, cache, mode, device, ...``), e.g.
            ``OffloadEngine(model, data, "2GiB", 8, "st", strict=True)``.
            The defaults are what ``leangnn train --strategy offload`` runs:
            cache ``auto`` (``st`` on CUDA, ``none`` on a CPU "device";
            :attr:`policy` is the rule chosen) and ``retain`` (backward
            through the forward's graphs wherever the budget holds them).
        options (OffloadOptions, optional): all options at once (``kwargs``
            then override fields). (default: ``None``)
        like (OffloadEngine, optional): an engine on the same graph and model
            whose graph structures (and schedule, when the workspace matches)
            are reused, e.g. to compare cache policies. (default: ``None``)

    Raises:
        BudgetError: the budget does not hold the parameters, or one node's
            job (the message names the bytes needed).
    """

    def __init__(self, model: torch.nn.Module, data: Data, *args,
                 options: OffloadOptions | None = None,
                 like: OffloadEngine | None = None, **kwargs):
        if options is None:
            options = OffloadOptions(*args, **kwargs)
        elif args:
            raise TypeError("OffloadEngine: pass options= or positional options, "
                            "not both")
        elif kwargs:
            options = replace(options, **kwargs)
        self.options = o = options
        model = uncompiled(model)
        self.model, self.lw = model, LayerwiseModel(model)
        refusal = edge_attr_refusal(
            model, data, "offload", "the layer-wise engine runs its convs without "
            "them; train it full batch (or distributed without a device budget)")
        if refusal:
            raise ValueError(refusal)
        param = next(model.parameters())
        self.device = torch.device(o.device) if o.device is not None else param.device
        self.dtype = param.dtype
        #: the cache rule this engine runs (``options.cache`` with ``auto``
        #: resolved for the device)
        self.policy = resolve_policy(o.cache, self.device, o.mode == "exact")
        self.layout = ArrayLayout(tuple(self.lw.widths), self.dtype)
        self.N = n = int(data.num_nodes)
        if like is not None and (like.N, like.layout) != (n, self.layout):
            raise ValueError("like: the other engine runs a different graph or model")
        #: host bytes of the graph structures this engine took over from a
        #: planner's counting engine (:func:`offer_graph`) instead of building
        #: them: resident before its setup, so a setup's measured growth
        #: leaves them out
        self.taken_bytes = 0
        self._graph(data, like)
        self.slot_width = max(self.layout.widths[: self.L])
        # made before the workspace probes (else the first probe's job would
        # carry them) and held for the run: they count as resident
        blas = 0 if o.virtual else ensure_blas_workspace(self.device)
        self.ws = self._calibrate()
        self.split = DeviceBudget(o.device_budget,
                                  o.resident_factor * self.lw.param_bytes(),
                                  o.workspace_fraction, self.policy, self.ws,
                                  self.slot_width, fixed=blas)
        self.split.num_nodes = n
        # (not in the mmap mode: there the job's other blocks are mapped too,
        # no heap keeps a high-water, and the process follows the live bytes)
        self.split.heap_threshold = None if heap_mode() == "mmap" else \
            heap_threshold(self.device)
        self.sched = self._schedule(like)
        self.retain = self._plan_retention()
        # Rows of every cacheable array registered at once (h_0..h_{L-1} and
        # g_1..g_{L-1}): slots beyond that would never be used, however large
        # the budget. Retaining, no array outlives the sweep after the one
        # that wrote it (backward reads no h_l), so at most two arrays' rows
        # are resident at once: the cache gets only what can be used, and
        # the rest of its share stays free.
        arrays = min(2, 2 * self.L - 1) if self.retain else 2 * self.L - 1
        self.cache = DeviceCache(self.split.cache_share, self.slot_width, self.dtype,
                                 self.device, self.policy, max_slots=arrays * n)
        if o.virtual:
            self.plane = CountingPlane(self.layout, self.cache)
        else:
            self.plane = DevicePlane(self.layout, self.cache, self.lw, self.device,
                                     self.split, n, o.strict)
        self.plane.put(self.layout.h(0), data.x)
        self.runner = JobRunner(self.plane, self.cache, self.layout,
                                CacheKeys(self.policy, self.degree, self.sched,
                                          self.layout.num_arrays), self.split)
        self.counters = OffloadCounters()
        self.last_train = OffloadCounters()
        self.total = OffloadCounters()

    # ------------------------------------------------------------------ setup
    def _graph(self, data: Data, like: OffloadEngine | None) -> None:
        o, n = self.options, self.N
        if like is not None:
            # same graph and model: the edges grouped by target are the same
            # whatever the part count (the planner's rows differ only in it)
            self.csr, self.degree = like.csr, like.degree
            if like.partition.num_parts == o.num_parts:
                self.partition = like.partition
                return
        elif (offered := _offered(data, self._topology_key())) is not None:
            # the planner's counting engine of this graph built them already;
            # the engine that trains takes them (a plan's rows only share)
            self.csr, self.degree = offered[2], offered[3]
            part = offered[4].get(self._partition_key())
            if part is not None:
                self.partition = part
            if not o.virtual:
                _OFFERS.remove(offered)
                self.taken_bytes = self.topology_bytes(partition=part is not None)
            if part is not None:
                return
        else:
            ei, w = self.lw.topology(data.edge_index, n, data.get("edge_weight", None))
            self.csr = DstCSR(ei, n, w)
            del ei, w
            self.degree = torch.bincount(self.csr.col, minlength=n).long()
        self.partition = partition_graph(data.edge_index, n, o.num_parts,
                                         o.partition_method, o.seed,
                                         cache_dir=o.cache_dir)

    def topology_bytes(self, partition: bool = True) -> int:
        """Host bytes of the graph structures built once for this graph: the
        edges grouped by target (with GCN's weights), the in-degrees and,
        with ``partition``, the partition (the chunks' own topology aside)."""
        parts = (self.csr.col, self.csr.rowptr, self.csr.weight, self.degree,
                 self.partition.part if partition else None)
        return sum(t.untyped_storage().nbytes() for t in parts if t is not None)

    def _topology_key(self) -> tuple:
        """What the edges grouped by target depend on besides the graph: the
        conv (GCN's normalisation folds its options into the weights)."""
        conv = self.lw.model.convs[0]
        key: tuple = (type(conv).__qualname__, self.lw._takes_weight)
        if self.lw.is_gcn:
            key += (bool(conv.normalize), bool(conv.improved),
                    bool(conv.add_self_loops), conv.flow, str(self.dtype))
        return key

    def _partition_key(self) -> tuple:
        o = self.options
        return (o.num_parts, o.partition_method, o.seed,
                None if o.cache_dir is None else str(o.cache_dir))

    def _calibrate(self, retain: bool = False) -> WorkspaceModel:
        shadow = copy.deepcopy(self.model).train()
        lw = LayerwiseModel(shadow)
        layer = retain_layer if retain else compute_layer

        def run(li, backward, x, ei, w, nt, g):
            return layer(lw, li, backward, x, ei, w, nt, g)

        key = tuple(repr(m) for m in self.model.modules()) + (
            ("retain",) if retain else ()) + (probe_code(),)
        with torch.random.fork_rng(devices=rng_devices(self.device)):
            return WorkspaceModel(run, self.lw.widths, self.dtype,
                                  self.csr.weight is not None, self.device, key=key)

    def _plan_retention(self) -> bool:
        """Whether training epochs keep every forward job's graph (option
        ``retain``): only when all of them and the costliest job fit the
        workspace at once, and no job is a hub's edge piece."""
        o = self.options
        if not o.retain or o.mode != "exact":
            return False
        # Every retained graph saves its input block: the kept bytes are at
        # least every layer's input, once. Below that, no calibration needed.
        elem = self.layout.elem
        if self.N * elem * sum(self.layout.widths[: self.L]) > self.split.workspace:
            return False
        if self.split.retain_ws is None:
            self.split.retain_ws = self._calibrate(retain=True)
        chunks = self.sched.chunks
        if any(getattr(ch, "piece", None) is not None for ch in chunks):
            return False
        need = self.split.retain_need([ch.sizes for ch in chunks], self.L)
        return need <= self.split.workspace

    def _schedule(self, like: OffloadEngine | None):
        o, s = self.options, self.split
        topology = not o.virtual
        if (like is not None and like.options.mode == o.mode
                and like.split.workspace == s.workspace
                and like.partition is self.partition and like.options.order == o.order
                and (like.sched.topology or not topology)):
            return like.sched  # same chunks: only the cache differs
        try:
            if o.mode == "exact":
                return ExactSchedule(self.csr, self._plan_partition(), s.fits,
                                     o.order, s.ratio, topology=topology,
                                     num_layers=self.L)
            return RecomputeSchedule(self.csr, self.partition, self.L, s.fits,
                                     s.ratio, topology=topology)
        except BudgetError as e:
            raise s.too_small(e) from None

    def _whole_graph_sizes(self) -> tuple[int, int, int]:
        # a job whose targets are all nodes has all nodes as sources
        return (self.N, self.N, self.csr.num_edges)

    def _plan_partition(self) -> Partition:
        """The partition the exact schedule cuts: one part when one job holds
        the whole graph (the fewest jobs: per-job overhead and halo re-reads
        vanish), else the METIS parts."""
        if self.partition.num_parts > 1 and self.split.fits(
                *self._whole_graph_sizes()):
            return Partition(torch.zeros(self.N, dtype=torch.long), 1,
                             self.partition.method)
        return self.partition

    @property
    def whole_graph_budget(self) -> int:
        """Smallest device budget at which the exact schedule runs every layer
        as one job (the whole graph on the device, as full-batch training);
        with ``retain``, one at which those jobs also keep their graphs."""
        sizes = self._whole_graph_sizes()
        need = self.split.job_bytes(*sizes)
        if self.options.retain and self.options.mode == "exact":
            if self.split.retain_ws is None:
                self.split.retain_ws = self._calibrate(retain=True)
            need = max(need, self.split.retain_need([sizes], self.L))
        return self.split.min_budget(need)

    @property
    def L(self) -> int:
        return self.layout.num_layers

    @property
    def host(self):
        """The host store (:class:`~leangnn.offload.store.HostStore`, or the
        shape-only store of a counting engine)."""
        return self.plane.store

    @property
    def budget(self) -> int:
        """The device budget in bytes."""
        return self.split.total

    @property
    def num_chunks(self) -> int:
        """Jobs per sweep of the exact schedule (``-1`` for the baseline)."""
        if self.options.mode == "exact":
            return self.sched.num_chunks
        return -1

    # ---------------------------------------------------------------- epochs
    def _ensure_grads(self) -> None:
        # Gradients live on the device for the whole epoch (they are part of
        # the resident charge); allocating them up front keeps job peaks flat.
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def _run(self, train: bool, loss_fn=None, data=None, clone: bool = False):
        ep = Epoch()
        self.counters = ep.counters
        seed = int(torch.randint(0, 2**62, ()).item())
        self.runner.start(ep)
        self.plane.begin_epoch(seed)
        epoch = self._exact_epoch if self.options.mode == "exact" else (
            self._recompute_epoch)
        try:
            result = epoch(ep, train, loss_fn, data)
            if clone and result is not None:
                result = result.clone()
        except BudgetError as e:  # the baseline cuts its chunks on the fly
            raise self.split.too_small(e) from None
        finally:
            self._end_epoch(ep)
        return result

    def _end_epoch(self, ep: Epoch) -> None:
        self.plane.drop_retained()
        self.runner.retain, self.runner.retained = False, 0
        self.runner.kept = 0
        for aid in list(self.cache.slot_of):
            self.cache.unregister(aid)
        self.plane.clear(keep=self.layout.h(0))
        self.plane.end_epoch(ep.counters)
        self.total.merge(ep.counters)

    def _note_host(self, ep: Epoch) -> None:
        # host memory only grows when an array is allocated: sampling there
        # catches the peak
        c = ep.counters
        host = self.plane.host_bytes()
        c.peak_host_bytes = max(c.peak_host_bytes, host)
        pool = 0 if self.device.type == "cpu" else self.cache.nbytes
        c.peak_total_bytes = max(c.peak_total_bytes, host + pool + self.split.resident
                                 + getattr(self.runner, "kept", 0))

    def _alloc(self, ep: Epoch, aid: int, rows: int, cacheable: bool = True,
               zero: bool | None = None) -> None:
        self.plane.allocate(aid, rows, zero)
        if self.layout.is_grad(aid):
            ep.partial[aid] = torch.zeros(rows, dtype=torch.bool)
        if cacheable:
            self.cache.register(aid, rows)
        self._note_host(ep)

    def _release(self, ep: Epoch, aid: int) -> None:
        self.cache.unregister(aid)
        if aid != self.layout.h(0):
            self.plane.free(aid)
        ep.partial.pop(aid, None)

    def _exact_epoch(self, ep: Epoch, train: bool, loss_fn=None, data=None):
        A, L, s, run = self.layout, self.L, self.sched, self.runner.run
        # retaining, backward reads no layer input: h_l is done after sweep l
        retain = self.runner.retain = train and self.retain
        acc = {A.h(0): [(0, "S")]}
        for li in range(1, L):
            acc[A.h(li)] = [(li, "S")]
        if train:
            if not retain:
                acc[A.h(0)].append((2 * L - 1, "S"))
            for li in range(1, L):
                if not retain:
                    acc[A.h(li)].append((2 * L - 1 - li, "S"))
                acc[A.g(li)] = [(2 * L - 1 - li, "S"), (2 * L - li, "T")]
        ep.accesses = acc
        self.cache.register(A.h(0), self.N)
        for li in range(1, L):
            self._alloc(ep, A.h(li), self.N)
        self._alloc(ep, A.h(L), self.N, cacheable=False)
        for k in range(L):
            self.runner.begin_sweep({A.h(k), A.h(k + 1)})
            order = s.visit(k)
            for i, c in enumerate(order):
                ch = s.chunks[c]
                run(Job(k, k, ch, False, A.h(k), ch.sources, A.h(k + 1), ch.targets,
                        position=c, dst_on_host=k == L - 1, rng_key=(k, c)),
                    _upcoming(s, order, i))
            self._release_done(ep, k)
        if not train:
            return self.plane.array(A.h(L))
        loss = self.plane.output_grad(A.g(L), A.h(L), loss_fn, data)
        self._note_host(ep)
        for li in range(1, L):
            self._alloc(ep, A.g(li), self.N)
        for k in range(L, 2 * L):
            li = 2 * L - 1 - k
            self.runner.begin_sweep(({A.g(li + 1)} if retain else
                                     {A.h(li), A.g(li + 1)})
                                    | ({A.g(li)} if li else set()))
            order = s.visit(k)
            for i, c in enumerate(order):
                ch = s.chunks[c]
                run(Job(k, li, ch, True, A.h(li), ch.sources, A.g(li + 1),
                        ch.targets, position=c, dst_on_host=li == L - 1,
                        grad_src=A.g(li) if li else None, rng_key=(li, c)),
                    _upcoming(s, order, i))
            self._release_done(ep, k)
        return loss

    def _release_done(self, ep: Epoch, k: int) -> None:
        for aid, uses in ep.accesses.items():
            if uses[-1][0] == k:
                self._release(ep, aid)

    def _recompute_epoch(self, ep: Epoch, train: bool, loss_fn=None, data=None):
        A, L, s = self.layout, self.L, self.sched
        self._alloc(ep, A.out, self.N, cacheable=False, zero=True)
        self.cache.register(A.h(0), self.N)
        for p in s.part_order:
            plan = s.plan(p)
            for li in range(1, L):
                self._alloc(ep, A.h(li), plan.sets[li - 1].numel())
            self._alloc(ep, A.h(L), plan.sets[L - 1].numel(), cacheable=False)
            for li in range(L):
                self.runner.begin_sweep({A.h(li), A.h(li + 1)})
                self._sweep(plan, p, li, li, False)
            self.plane.collect(A.out, plan.sets[L - 1], A.h(L))
            if train:
                self.plane.output_grad(A.g(L), A.h(L), loss_fn, data, plan.sets[L - 1])
                self._note_host(ep)
                for li in range(1, L):
                    self._alloc(ep, A.g(li), plan.sets[li - 1].numel())
                for k in range(L, 2 * L):
                    li = 2 * L - 1 - k
                    self.runner.begin_sweep({A.h(li), A.g(li + 1)}
                                            | ({A.g(li)} if li else set()))
                    self._sweep(plan, p, k, li, True)
            for aid in [*range(1, L + 1), *(A.g(li) for li in range(1, L + 1))]:
                self._release(ep, aid)
            del plan
        if not train:
            return self.plane.array(A.out)
        return self.plane.loss(A.out, loss_fn, data)

    def _sweep(self, plan, p: int, k: int, li: int, backward: bool) -> None:
        A, L, chunks = self.layout, self.L, plan.chunks[li]
        order = range(len(chunks)) if k % 2 == 0 else range(len(chunks) - 1, -1, -1)
        for c in order:
            ch = chunks[c]
            self.runner.run(Job(
                k, li, ch, backward, A.h(li), plan.input_rows[li][c],
                A.g(li + 1) if backward else A.h(li + 1), plan.output_rows[li][c],
                dst_on_host=li == L - 1,
                grad_src=A.g(li) if backward and li else None, rng_key=(p, li, c)))

    # ------------------------------------------------------------ public API
    def train_step(self, loss_fn, data: Data) -> float:
        """One exact full-batch epoch: forward, ``loss_fn(out, data)`` on the
        host, backward; gradients are accumulated into the parameters'
        ``.grad`` (the caller steps the optimizer). Returns the loss."""
        self.plane.require_data("train_step")
        self.lw.check()
        self._ensure_grads()
        loss = self._run(True, loss_fn, data)
        self.last_train = self.counters
        return float(loss.detach())

    @torch.no_grad()
    def predict(self) -> Tensor:
        """Model output for every node (host tensor), layer by layer."""
        self.plane.require_data("predict")
        self.lw.check()
        return self._run(False, clone=True)

    def simulate(self, train: bool = True) -> OffloadCounters:
        """Replay one epoch's schedule and cache decisions without data (on a
        counting engine, ``virtual=True``); the counters equal those of a real
        epoch (tested)."""
        if train and self.plane.materialises:
            raise RuntimeError("simulate(train=True) needs a counting engine "
                               "(virtual=True); use train_step()")
        self._run(train)
        if train:
            self.last_train = self.counters
        return self.counters

    @property
    def host_bytes(self) -> int:
        """Host bytes the engine holds now (store, cache metadata, and the
        pool when the device is the CPU)."""
        return self.plane.host_bytes()

    def summary(self) -> dict:
        o = self.options
        return {"mode": o.mode, "cache": self.policy, "cache_option": o.cache,
                "device_budget": self.budget,
                "num_parts": self.partition.num_parts,
                "partition_method": self.partition.method,
                "num_chunks": self.num_chunks, "retain": self.retain,
                "cache_bytes": self.cache.nbytes,
                "cache_slots": self.cache.num_slots,
                "workspace_bytes": self.split.workspace,
                "resident_bytes": self.split.resident,
                "peak_device_bytes": self.total.peak_device_bytes,
                "peak_host_bytes": self.total.peak_host_bytes,
                "last_train_epoch": self.last_train.to_dict(),
                "total": self.total.to_dict()}

    def __repr__(self) -> str:
        o = self.options
        return (f"{self.__class__.__name__}(mode={o.mode}, cache={self.policy}, "
                f"budget={self.budget}, parts={self.partition.num_parts}"
                f"{', counting' if o.virtual else ''})")
