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

Between jobs a :class:`~leangnn.offload.cache.DeviceCache` keeps rows on the
device; the engine charges the pool, the parameters (with gradients and two
Adam moments) and each job's calibrated workspace against ``device_budget``
and asserts the sum never exceeds it. On a machine without GPU the "device"
is the CPU: traffic and accounting are the same, times are not GPU times.

``mode="recompute"`` runs the baseline it replaces in the same engine: each
partition computes all layers for its ``L``-hop in-neighbourhood, so shared
vertices are recomputed by every partition that needs them.
"""

from __future__ import annotations

import copy
from dataclasses import asdict

import torch
from torch import Tensor
from torch_geometric.data import Data

from leangnn.graphs.partition import DstCSR, partition_graph
from leangnn.offload.cache import DeviceCache
from leangnn.offload.counters import OffloadCounters, full_batch_vertex_bytes
from leangnn.offload.jobs import JobRunner
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.schedule import ExactSchedule, RecomputeSchedule
from leangnn.offload.store import HostStore
from leangnn.offload.workspace import LiveBytesMeter, WorkspaceModel
from leangnn.utils import parse_bytes

__all__ = ["OffloadEngine", "OffloadCounters", "MODES", "full_batch_vertex_bytes"]

MODES = ("exact", "recompute")


class OffloadEngine(JobRunner):
    """Exact layer-wise full-graph training with a budgeted device cache.

    Args:
        model (BasicGNN): a PyG ``GCN``/``GraphSAGE``/``GAT``/``GIN``; its
            parameters' device is the device (unless ``device`` is given).
        data (Data): the graph, ``x [N, F]`` and ``edge_index [2, E]``
            (optional ``edge_weight``), kept on the host.
        device_budget (int or str): device bytes for everything the engine
            puts there (e.g. ``"2GiB"``).
        num_parts (int, optional): METIS parts. (default: ``8``)
        cache (str, optional): ``"none"``, ``"lru"``, ``"degree"`` or
            ``"st"``. (default: ``"st"``)
        mode (str, optional): ``"exact"`` or ``"recompute"`` (the baseline).
            (default: ``"exact"``)
        device (torch.device or str, optional): the device. (default: the
            model's)
        workspace_fraction (float, optional): share of the budget left after
            the parameters that jobs may use; the rest is the cache (``none``
            gives jobs all of it). (default: ``0.5``)
        partition_method (str, optional): see
            :func:`~leangnn.graphs.partition.partition_graph`. (default: ``"auto"``)
        order (str, optional): ``"overlap"`` or ``"natural"`` part order.
            (default: ``"overlap"``)
        strict (bool, optional): also *measure* every job's device bytes
            (live-bytes meter on CPU, allocator peak on CUDA) and assert them
            under the budget. Slow; for tests. (default: ``False``)
        virtual (bool, optional): count traffic and computations without
            materialising any data (for graphs too large for this host).
            (default: ``False``)
        resident_factor (int, optional): parameter copies charged on the
            device (weights, gradients, two Adam moments). (default: ``4``)
        seed (int, optional): METIS seed. (default: ``0``)
        cache_dir (str, optional): partition cache folder.
        like (OffloadEngine, optional): an engine on the same graph and model
            whose graph structures (and schedule, when the workspace matches)
            are reused, e.g. to compare cache policies. (default: ``None``)
    """

    def __init__(self, model: torch.nn.Module, data: Data,
                 device_budget: int | str, num_parts: int = 8, cache: str = "st",
                 mode: str = "exact", device: torch.device | str | None = None,
                 workspace_fraction: float = 0.5, partition_method: str = "auto",
                 order: str = "overlap", strict: bool = False, virtual: bool = False,
                 resident_factor: int = 4, seed: int = 0, cache_dir=None,
                 like: OffloadEngine | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "recompute" and cache == "st":
            raise ValueError("cache='st' needs the exact schedule's next-use "
                             "information; use none|lru|degree with mode='recompute'")
        if not 0.0 < workspace_fraction < 1.0:
            raise ValueError(f"workspace_fraction must be in (0, 1), got "
                             f"{workspace_fraction!r}")
        self.model, self.lw = model, LayerwiseModel(model)
        self.budget = parse_bytes(device_budget, "device_budget")
        self.mode, self.policy, self.order = mode, cache, order
        self.strict, self.virtual = strict, virtual
        param = next(model.parameters())
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = param.dtype
        self.elem = param.element_size()
        self.L = self.lw.num_layers
        self.N = n = int(data.num_nodes)
        self.widths = self.lw.widths
        if like is not None and (like.N, like.widths, like.dtype) != (n, self.widths,
                                                                       self.dtype):
            raise ValueError("like: the other engine runs a different graph or model")
        if like is not None and like.partition.num_parts == num_parts:
            # same graph and partition: reuse the graph-level structures
            self.csr, self.degree = like.csr, like.degree
            self.partition = like.partition
        else:
            ei, w = self.lw.topology(data.edge_index, n, data.get("edge_weight", None))
            self.csr = DstCSR(ei, n, w)
            del ei, w
            self.degree = torch.bincount(self.csr.col, minlength=n).long()
            self.partition = partition_graph(data.edge_index, n, num_parts,
                                             partition_method, seed,
                                             cache_dir=cache_dir)
        self.resident = resident_factor * self.lw.param_bytes()
        free = self.budget - self.resident
        if free <= 0:
            raise ValueError(f"device_budget={self.budget} bytes does not even hold "
                             f"the parameters ({self.resident} bytes with gradients "
                             "and optimizer state)")
        self.ws_limit = free if cache == "none" else int(workspace_fraction * free)
        self.slot_width = max(self.widths[: self.L])
        self.ws = self._calibrate()
        fits = self._fits
        if (like is not None and like.mode == mode and like.ws_limit == self.ws_limit
                and like.partition is self.partition and like.order == order
                and like.sched is not None and (virtual or not like.virtual)):
            self.sched = like.sched  # same chunks: only the cache differs
        elif mode == "exact":
            self.sched = ExactSchedule(self.csr, self.partition, fits, order,
                                       self._ratio, topology=not virtual)
        else:
            self.sched = RecomputeSchedule(self.csr, self.partition, self.L, fits,
                                           self._ratio, topology=not virtual)
        self.cache = DeviceCache(free - self.ws_limit, self.slot_width, self.dtype,
                                 self.device, cache, virtual)
        self.host = HostStore(pin=self.device.type == "cuda", virtual=virtual)
        self.host.put("h0", data.x if not virtual else torch.empty(0))
        self.host.shapes["h0"] = (n, self.widths[0])
        self.counters = OffloadCounters()
        self.last_train = OffloadCounters()
        self.total = OffloadCounters()
        self._clock = 0
        self._meter: LiveBytesMeter | None = None
        self._rng_key = 0

    # ------------------------------------------------------------------ setup
    def _calibrate(self) -> WorkspaceModel:
        shadow = copy.deepcopy(self.model).train()
        lw = LayerwiseModel(shadow)

        def run(li, backward, x, ei, w, nt, g):
            return self._compute(lw, li, backward, x, ei, w, nt, g)

        with torch.random.fork_rng(devices=self._rng_devices()):
            return WorkspaceModel(run, self.widths, self.dtype,
                                  self.csr.weight is not None, self.device,
                                  key=tuple(repr(m) for m in self.model.modules()))

    def _job_bytes(self, n_s: int, n_t: int, n_e: int) -> int:
        return self.ws.max_bytes(n_s, n_t, n_e, self.slot_width)

    def _fits(self, n_s: int, n_t: int, n_e: int) -> bool:
        return self._job_bytes(n_s, n_t, n_e) <= self.ws_limit

    def _ratio(self, n_s: int, n_t: int, n_e: int) -> float:
        return self._job_bytes(n_s, n_t, n_e) / self.ws_limit

    def _rng_devices(self):
        if self.device.type != "cuda":
            return []
        return [self.device.index if self.device.index is not None
                else torch.cuda.current_device()]

    # ---------------------------------------------------------------- epochs
    def _ensure_grads(self) -> None:
        # Gradients live on the device for the whole epoch (they are part of
        # the resident charge); allocating them up front keeps job peaks flat.
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)

    def _begin_epoch(self) -> None:
        self.counters = OffloadCounters()
        self._rng_key = int(torch.randint(0, 2**62, ()).item())
        self._partial: dict[int, Tensor] = {}
        if self.device.type == "cuda" and not self.virtual:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def _end_epoch(self) -> None:
        for aid in list(self.cache.slot_of):
            self.cache.unregister(aid)
        for name in list(self.host.shapes):
            if name != "h0":
                self.host.free(name)
        c = self.counters
        if self.device.type == "cuda" and not self.virtual:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            c.peak_device_bytes_measured = max(c.peak_device_bytes_measured, peak)
            if self.strict and peak > self.budget:
                raise AssertionError(f"CUDA peak {peak} exceeded the device budget "
                                     f"{self.budget}")
        for f, v in asdict(c).items():
            if f.startswith("peak"):
                setattr(self.total, f, max(getattr(self.total, f), v))
            else:
                setattr(self.total, f, getattr(self.total, f) + v)

    def _alloc(self, aid: int, rows: int, cacheable: bool = True) -> None:
        name, w = self._name(aid), self._width(aid)
        self.host.allocate(name, rows, w, self.dtype, zero=self._is_grad(aid))
        if self._is_grad(aid):
            self._partial[aid] = torch.zeros(rows, dtype=torch.bool)
        if cacheable:
            self.cache.register(aid, rows)

    def _release(self, aid: int) -> None:
        self.cache.unregister(aid)
        if aid != 0:
            self.host.free(self._name(aid))
        self._partial.pop(aid, None)

    def _output_grad(self, out: Tensor, loss_fn, data: Data, rows=None):
        """Loss and ``d loss / d out`` (on the host, for all or some rows)."""
        if rows is None:
            o = out.detach().requires_grad_()
            loss = loss_fn(o, data)
            (g,) = torch.autograd.grad(loss, o)
            return loss, g
        # recompute baseline: a partition knows only its own outputs; for a
        # node-wise mean loss the gradient of a row depends on that row only.
        o = torch.zeros(self.N, out.size(1), dtype=out.dtype)
        o[rows] = out
        o.requires_grad_()
        (g,) = torch.autograd.grad(loss_fn(o, data), o)
        return None, g[rows]

    def _exact_epoch(self, train: bool, loss_fn=None, data=None):
        L, s = self.L, self.sched
        H, G = (lambda li: li), (lambda li: L + 1 + li)
        acc = {H(0): [(0, "S")]}
        for li in range(1, L):
            acc[H(li)] = [(li, "S")]
        if train:
            acc[H(0)].append((2 * L - 1, "S"))
            for li in range(1, L):
                acc[H(li)].append((2 * L - 1 - li, "S"))
                acc[G(li)] = [(2 * L - 1 - li, "S"), (2 * L - li, "T")]
        self._acc = acc
        self.cache.register(H(0), self.N)
        for li in range(1, L):
            self._alloc(H(li), self.N)
        self._alloc(H(L), self.N, cacheable=False)
        for k in range(L):
            self._begin_sweep({H(k), H(k + 1)})
            for c in s.visit(k):
                ch = s.chunks[c]
                self._job(k, k, ch, False, H(k), ch.sources, ch.sources, H(k + 1),
                          ch.targets, ch.targets, c, k == L - 1, None, (k, c))
            self._release_done(acc, k, train)
        out = self.host[self._name(H(L))]
        if not train:
            return out
        loss = None
        if self.virtual:
            self.host.allocate(self._name(G(L)), self.N, self.widths[L], self.dtype)
        else:
            loss, g = self._output_grad(out, loss_fn, data)
            self.host.put(self._name(G(L)), g)
        for li in range(1, L):
            self._alloc(G(li), self.N)
        for k in range(L, 2 * L):
            li = 2 * L - 1 - k
            self._begin_sweep({H(li), G(li + 1)} | ({G(li)} if li else set()))
            for c in s.visit(k):
                ch = s.chunks[c]
                self._job(k, li, ch, True, H(li), ch.sources, ch.sources, G(li + 1),
                          ch.targets, ch.targets, c, li == L - 1,
                          G(li) if li else None, (li, c))
            self._release_done(acc, k, train)
        return loss

    def _release_done(self, acc, k: int, train: bool) -> None:
        for aid, uses in acc.items():
            if uses[-1][0] == k:
                self._release(aid)

    def _recompute_epoch(self, train: bool, loss_fn=None, data=None):
        L, s = self.L, self.sched
        H, G = (lambda li: li), (lambda li: L + 1 + li)
        out_all = None if self.virtual else torch.zeros(
            self.N, self.widths[L], dtype=self.dtype)
        self.cache.register(H(0), self.N)
        for p in s.part_order:
            plan = s.plan(p)
            for li in range(1, L):
                self._alloc(H(li), plan.sets[li - 1].numel())
            self._alloc(H(L), plan.sets[L - 1].numel(), cacheable=False)
            for li in range(L):
                self._begin_sweep({H(li), H(li + 1)})
                self._sweep(plan, p, li, li, False)
            out_p = self.host[self._name(H(L))]
            if out_all is not None:
                out_all[plan.sets[L - 1]] = out_p
            if train:
                if self.virtual:
                    self.host.allocate(self._name(G(L)), plan.sets[L - 1].numel(),
                                       self.widths[L], self.dtype)
                else:
                    _, g = self._output_grad(out_p, loss_fn, data, plan.sets[L - 1])
                    self.host.put(self._name(G(L)), g)
                for li in range(1, L):
                    self._alloc(G(li), plan.sets[li - 1].numel())
                for k in range(L, 2 * L):
                    li = 2 * L - 1 - k
                    self._begin_sweep({H(li), G(li + 1)} | ({G(li)} if li else set()))
                    self._sweep(plan, p, k, li, True)
            for aid in [*range(1, L + 1), *(G(li) for li in range(1, L + 1))]:
                self._release(aid)
            del plan
        if not train:
            return out_all
        if self.virtual:
            return None
        loss, _ = self._output_grad(out_all, loss_fn, data)
        return loss

    def _sweep(self, plan, p: int, k: int, li: int, backward: bool) -> None:
        L, chunks = self.L, plan.chunks[li]
        order = range(len(chunks)) if k % 2 == 0 else range(len(chunks) - 1, -1, -1)
        for c in order:
            ch = chunks[c]
            if backward:
                self._job(k, li, ch, True, li, plan.input_rows[li][c], ch.sources,
                          L + 2 + li, plan.output_rows[li][c], ch.targets, None,
                          li == L - 1, L + 1 + li if li else None, (p, li, c))
            else:
                self._job(k, li, ch, False, li, plan.input_rows[li][c], ch.sources,
                          li + 1, plan.output_rows[li][c], ch.targets, None,
                          li == L - 1, None, (p, li, c))

    # ------------------------------------------------------------ public API
    def train_step(self, loss_fn, data: Data) -> float:
        """One exact full-batch epoch: forward, ``loss_fn(out, data)`` on the
        host, backward; gradients are accumulated into the parameters'
        ``.grad`` (the caller steps the optimizer). Returns the loss."""
        if self.virtual:
            raise RuntimeError("a virtual engine only counts; use simulate()")
        self.lw.check()
        self._ensure_grads()
        self._begin_epoch()
        epoch = self._exact_epoch if self.mode == "exact" else self._recompute_epoch
        try:
            loss = epoch(True, loss_fn, data)
        finally:
            self._end_epoch()
        self.last_train = self.counters
        return float(loss.detach())

    @torch.no_grad()
    def predict(self) -> Tensor:
        """Model output for every node (host tensor), layer by layer."""
        if self.virtual:
            raise RuntimeError("a virtual engine only counts; use simulate()")
        self.lw.check()
        self._begin_epoch()
        epoch = self._exact_epoch if self.mode == "exact" else self._recompute_epoch
        try:
            out = epoch(False)
            out = out.clone()
        finally:
            self._end_epoch()
        return out

    def simulate(self, train: bool = True) -> OffloadCounters:
        """Replay one epoch's schedule and cache decisions without data; the
        counters equal those of a real epoch (tested)."""
        self._begin_epoch()
        epoch = self._exact_epoch if self.mode == "exact" else self._recompute_epoch
        try:
            epoch(train)
        finally:
            self._end_epoch()
        if train:
            self.last_train = self.counters
        return self.counters

    @property
    def num_chunks(self) -> int:
        if self.mode == "exact":
            return self.sched.num_chunks
        return -1

    def summary(self) -> dict:
        return {"mode": self.mode, "cache": self.policy, "device_budget": self.budget,
                "num_parts": self.partition.num_parts,
                "partition_method": self.partition.method,
                "num_chunks": self.num_chunks, "cache_bytes": self.cache.nbytes,
                "workspace_bytes": self.ws_limit, "resident_bytes": self.resident,
                "last_train_epoch": self.last_train.to_dict(),
                "total": self.total.to_dict()}

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(mode={self.mode}, cache={self.policy}, "
                f"budget={self.budget}, parts={self.partition.num_parts})")



def __getattr__(name: str):
    # ``leangnn.train`` imports the strategy from here; it lives in its own
    # module (which imports this one), so resolve it lazily.
    if name == "OffloadStrategy":
        from leangnn.offload.strategy import OffloadStrategy

        return OffloadStrategy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
