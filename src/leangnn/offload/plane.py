"""Data planes of the offload engine: real tensors, or counting only.

The engine's sweeps and :class:`~leangnn.offload.jobs.JobRunner` decide what
every job reads, caches and writes; a data plane carries it out. Both planes
have the same methods:

* :class:`DevicePlane` gathers rows from the host store (pinned on CUDA) and
  the cache pool onto the device, runs the layer, writes results back, and
  measures device bytes when ``strict``;
* :class:`CountingPlane` materialises nothing (a shape-only store, no pool):
  every data method returns ``None``, so an epoch on a graph too large for
  this host is replayed with the same decisions and counters as a real one
  (NeutronJittor's schedule, Fundamental Research 2026, is data-independent).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from leangnn.offload.budget import DeviceBudget
from leangnn.offload.cache import DeviceCache
from leangnn.offload.counters import OffloadCounters
from leangnn.offload.jobs import ArrayLayout, Job
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.schedule import Chunk
from leangnn.offload.store import HostStore, ShapeStore
from leangnn.profile import LiveBytesMeter

__all__ = ["CountingPlane", "DevicePlane", "compute_layer", "retain_layer",
           "rng_devices", "probe_code"]


@functools.lru_cache(maxsize=1)
def probe_code() -> str:
    """Fingerprint of the code a workspace probe runs (the layer functions
    and :class:`LayerwiseModel`): part of the key under which
    :class:`~leangnn.offload.workspace.WorkspaceModel` keeps its fits on disk,
    so that an edit of that code measures anew."""
    code = "".join(inspect.getsource(m) for m in (compute_layer, retain_layer,
                                                  LayerwiseModel))
    return hashlib.sha1(code.encode()).hexdigest()


def compute_layer(lw: LayerwiseModel, li: int, backward: bool, x: Tensor,
                  ei: Tensor, w: Tensor | None, nt: int,
                  g: Tensor | None) -> Tensor | None:
    """One job's compute: layer ``li`` forward, or recompute + backward
    (returns the input gradient, ``None`` for the first layer)."""
    ei = ei.long()
    if not backward:
        with torch.no_grad():
            return lw.layer(li, x, ei, nt, w)
    x = x.detach().requires_grad_(li > 0)
    with torch.enable_grad():
        out = lw.layer(li, x, ei, nt, w)
        torch.autograd.backward(out, g)
    return x.grad


def retain_layer(lw: LayerwiseModel, li: int, backward: bool, x: Tensor,
                 ei: Tensor, w: Tensor | None, nt: int,
                 g: Tensor | None) -> tuple[Tensor, Tensor]:
    """A retaining job's compute: layer ``li`` forward *with* its autograd
    graph (returns the input leaf and the output, whose graph stays alive
    until backpropagated); ``backward=True`` also backpropagates ``g`` (the
    workspace calibration's upper bound of the later backward)."""
    x = x.detach().requires_grad_(li > 0)
    with torch.enable_grad():
        out = lw.layer(li, x, ei.long(), nt, w)
        if backward:
            torch.autograd.backward(out, g)
    return x, out


def rng_devices(device: torch.device) -> list[int]:
    """CUDA devices whose RNG :func:`torch.random.fork_rng` must fork."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


class CountingPlane:
    """The data plane of counting mode: shapes only, every value ``None``.

    Args:
        layout (ArrayLayout): the engine's arrays.
        cache (DeviceCache): the cache (its pool is never allocated here).
    """

    materialises = False

    def __init__(self, layout: ArrayLayout, cache: DeviceCache,
                 store: ShapeStore | None = None):
        self.layout, self.cache = layout, cache
        self.store = store if store is not None else ShapeStore()

    # ------------------------------------------------------------- arrays
    def allocate(self, aid: int, rows: int, zero: bool | None = None) -> None:
        lay = self.layout
        self.store.allocate(lay.name(aid), rows, lay.width(aid), lay.dtype,
                            zero=lay.is_grad(aid) if zero is None else zero)

    def put(self, aid: int, tensor: Tensor) -> None:
        self.store.put(self.layout.name(aid), tensor)

    def free(self, aid: int) -> None:
        self.store.free(self.layout.name(aid))

    def clear(self, keep: int) -> None:
        """Free every array but ``keep`` (the features)."""
        name = self.layout.name(keep)
        for n in self.store.names():
            if n != name:
                self.store.free(n)

    def array(self, aid: int) -> Tensor | None:
        return self.store[self.layout.name(aid)]

    def pool_host_bytes(self) -> int:
        # a real epoch holds the pool from its first step on
        return self.cache.nbytes if self.cache.device.type == "cpu" else 0

    def host_bytes(self) -> int:
        """Host bytes a (real) epoch holds now: store arrays, cache metadata,
        and the cache pool when the device is the CPU."""
        return (self.store.array_bytes() + self.cache.meta_bytes()
                + self.pool_host_bytes())

    def require_data(self, what: str) -> None:
        raise RuntimeError(f"{what}: a counting engine (virtual=True) only counts; "
                           "use simulate()")

    # -------------------------------------------------------------- epoch
    def begin_epoch(self, seed: int) -> None:
        pass

    def end_epoch(self, counters: OffloadCounters) -> None:
        pass

    def output_grad(self, g_aid: int, out_aid: int, loss_fn, data,
                    rows: Tensor | None = None) -> Tensor | None:
        """Put ``d loss / d out`` into ``g_aid``; the loss (``None`` here)."""
        n = self.store.shapes[self.layout.name(out_aid)][0]
        self.allocate(g_aid, n, zero=False)
        return None

    def loss(self, out_aid: int, loss_fn, data) -> Tensor | None:
        return None

    def collect(self, dst: int, rows: Tensor, src: int) -> None:
        """``dst[rows] = src`` (the recompute baseline's output)."""

    # --------------------------------------------------------------- jobs
    def measured(self, counters: OffloadCounters, retained: int = 0):
        return nullcontext()

    def bookkeeping(self):
        return nullcontext()

    def assemble(self, aid: int, rows: Tensor, slots: Tensor, hit_pos: Tensor,
                 miss_pos: Tensor) -> Tensor | None:
        return None

    def gather(self, aid: int, rows: Tensor) -> Tensor | None:
        return None

    def grad_rows(self, aid: int, rows: Tensor, slots: Tensor, hit_pos: Tensor,
                  host_pos: Tensor) -> Tensor | None:
        return None

    def topology(self, ch: Chunk) -> tuple[Tensor | None, Tensor | None]:
        return None, None

    def compute(self, job: Job, x, ei, w, g, retain: bool = False) -> Tensor | None:
        return None

    def backprop(self, job: Job, g) -> Tensor | None:
        """A retaining job's backward: the input gradient (``None`` here)."""
        return None

    def drop_retained(self) -> None:
        """Forget every retained graph (end of epoch, or an error)."""

    def prefetch(self, ch: Chunk | None, headroom: int) -> None:
        """Start copying ``ch``'s topology to the device while the current job
        runs (CUDA only), when ``headroom`` device bytes hold it."""

    def take(self, t: Tensor | None, mask: Tensor) -> Tensor | None:
        return None

    def cache_rows(self, aid: int, slots: Tensor) -> Tensor | None:
        return None

    def write(self, aid: int, rows: Tensor, vals: Tensor | None) -> None:
        pass

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.store})"


class DevicePlane(CountingPlane):
    """The data plane that moves real rows between host store, pool and device.

    Args:
        layout (ArrayLayout): the engine's arrays.
        cache (DeviceCache): the cache; its pool is allocated at the first
            epoch (outside any measured job).
        lw (LayerwiseModel): the model, layer by layer.
        device (torch.device): the device.
        budget (DeviceBudget): the budget ``strict`` asserts.
        num_nodes (int): nodes of the graph.
        strict (bool, optional): measure every job's device bytes (CPU:
            :class:`~leangnn.profile.LiveBytesMeter`; CUDA: allocator peak per
            epoch) and assert them under the budget. (default: ``False``)
    """

    materialises = True

    def __init__(self, layout: ArrayLayout, cache: DeviceCache, lw: LayerwiseModel,
                 device: torch.device, budget: DeviceBudget, num_nodes: int,
                 strict: bool = False):
        super().__init__(layout, cache, HostStore(pin=device.type == "cuda"))
        self.lw, self.device, self.budget = lw, device, budget
        self.num_nodes, self.strict = num_nodes, strict
        self.seed = 0
        self._meter: LiveBytesMeter | None = None
        # rng_key -> (input leaf, output) of retaining forward jobs
        self.saved: dict[tuple, tuple[Tensor, Tensor]] = {}
        # CUDA: a copy stream overlaps the next job's topology copy with this
        # job's compute; the schedule is static, so each chunk's topology is
        # pinned once and reused every epoch
        self._copy = (torch.cuda.Stream(device) if device.type == "cuda"
                      else None)
        self._pinned: dict[int, tuple[Tensor, Tensor | None]] = {}
        self._ahead: dict[int, tuple[Tensor, Tensor | None, object]] = {}

    def pool_host_bytes(self) -> int:
        pool = self.cache.pool
        return pool.nbytes if pool is not None and pool.device.type == "cpu" else 0

    def require_data(self, what: str) -> None:
        pass

    def _to_dev(self, t: Tensor) -> Tensor:
        return t.to(self.device, non_blocking=True)

    # -------------------------------------------------------------- epoch
    def begin_epoch(self, seed: int) -> None:
        self.seed = seed
        self.cache.allocate()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def end_epoch(self, counters: OffloadCounters) -> None:
        self._ahead.clear()
        if self.device.type != "cuda":
            return
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        counters.peak_device_bytes_measured = max(counters.peak_device_bytes_measured,
                                                  peak)
        if self.strict and peak > self.budget.total:
            raise AssertionError(f"CUDA peak {peak} exceeded the device budget "
                                 f"{self.budget.total}")

    def output_grad(self, g_aid: int, out_aid: int, loss_fn, data,
                    rows: Tensor | None = None) -> Tensor | None:
        out = self.array(out_aid)
        if rows is None:
            o = out.detach().requires_grad_()
            loss = loss_fn(o, data)
            (g,) = torch.autograd.grad(loss, o)
        else:
            # recompute baseline: a partition knows only its own outputs; for
            # a node-wise mean loss the gradient of a row depends on that row.
            o = torch.zeros(self.num_nodes, out.size(1), dtype=out.dtype)
            o[rows] = out
            o.requires_grad_()
            (g,) = torch.autograd.grad(loss_fn(o, data), o)
            g, loss = g[rows], None
        self.put(g_aid, g)
        return loss

    def loss(self, out_aid: int, loss_fn, data) -> Tensor:
        with torch.no_grad():
            return loss_fn(self.array(out_aid), data)

    def collect(self, dst: int, rows: Tensor, src: int) -> None:
        self.array(dst)[rows] = self.array(src)

    # --------------------------------------------------------------- jobs
    @contextmanager
    def measured(self, counters: OffloadCounters, retained: int = 0):
        if not self.strict or self.device.type == "cuda":
            yield
            return
        params = list(self.lw.model.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        pool = [self.cache.pool] if self.cache.pool is not None else []
        meter = LiveBytesMeter(exclude=params + grads + pool)
        self._meter = meter
        try:
            with meter:
                yield
        finally:
            self._meter = None
        # graphs retained by earlier jobs were allocated outside this meter:
        # they count with their accounted bytes
        used = self.budget.resident + self.cache.nbytes + retained + meter.peak
        counters.peak_device_bytes_measured = max(
            counters.peak_device_bytes_measured, used)
        if used > self.budget.total:
            raise AssertionError(f"measured device bytes exceeded the budget: "
                                 f"{used} > {self.budget.total}")

    def bookkeeping(self):
        return self._meter.paused() if self._meter is not None else nullcontext()

    @contextmanager
    def _rng(self, key):
        if not self.lw.needs_rng:
            yield
            return
        with torch.random.fork_rng(devices=rng_devices(self.device)):
            torch.manual_seed(hash((self.seed, key)) & 0x7FFF_FFFF_FFFF)
            yield

    def _pool_rows(self, aid: int, slots: Tensor) -> Tensor:
        """Pool rows at ``slots`` (at the array's width), one row per slot;
        a ``-1`` (not resident) reads slot 0, for the caller to overwrite.
        One gather into the block: no gather-then-scatter of the hits."""
        pool, w = self.cache.pool, self.layout.width(aid)
        src = pool if w == pool.size(1) else pool[:, :w]
        return src.index_select(0, self._to_dev(slots.clamp(min=0)))

    def assemble(self, aid: int, rows: Tensor, slots: Tensor, hit_pos: Tensor,
                 miss_pos: Tensor) -> Tensor:
        if not hit_pos.numel():
            # every row from the host: the gathered rows are the block (no
            # second copy into an assembled one)
            return self.gather(aid, rows)
        block = self._pool_rows(aid, slots)
        if miss_pos.numel():
            vals = self._to_dev(self.store.gather(self.layout.name(aid),
                                                  rows[miss_pos]))
            block.index_copy_(0, self._to_dev(miss_pos), vals)
        return block

    def gather(self, aid: int, rows: Tensor) -> Tensor:
        return self._to_dev(self.store.gather(self.layout.name(aid), rows))

    def grad_rows(self, aid: int, rows: Tensor, slots: Tensor, hit_pos: Tensor,
                  host_pos: Tensor) -> Tensor:
        if hit_pos.numel():
            vals = self._pool_rows(aid, slots)
            if hit_pos.numel() < rows.numel():
                with self.bookkeeping():
                    miss = torch.nonzero(slots < 0).flatten()
                vals.index_fill_(0, self._to_dev(miss), 0)
        else:
            vals = torch.zeros(rows.numel(), self.layout.width(aid),
                               dtype=self.layout.dtype, device=self.device)
        if host_pos.numel():
            vals.index_add_(0, self._to_dev(host_pos), self._to_dev(
                self.store.gather(self.layout.name(aid), rows[host_pos])))
        return vals

    def _pinned_topology(self, ch: Chunk) -> tuple[Tensor, Tensor | None]:
        hit = self._pinned.get(id(ch))
        if hit is None:
            w = None if ch.edge_weight is None else ch.edge_weight.pin_memory()
            hit = self._pinned[id(ch)] = (ch.edge_index.pin_memory(), w)
        return hit

    def prefetch(self, ch: Chunk | None, headroom: int) -> None:
        if (self._copy is None or ch is None or ch.edge_index is None
                or id(ch) in self._ahead):
            return
        nbytes = ch.edge_index.numel() * ch.edge_index.element_size() + (
            0 if ch.edge_weight is None
            else ch.edge_weight.numel() * ch.edge_weight.element_size())
        if nbytes > headroom:  # the budget has no room for it beside this job
            return
        ei_h, w_h = self._pinned_topology(ch)
        with torch.cuda.stream(self._copy):
            ei = ei_h.to(self.device, non_blocking=True)
            w = None if w_h is None else w_h.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._copy)
        self._ahead[id(ch)] = (ei, w, done)

    def topology(self, ch: Chunk) -> tuple[Tensor, Tensor | None]:
        ahead = self._ahead.pop(id(ch), None)
        if ahead is not None:
            ei, w, done = ahead
            cur = torch.cuda.current_stream(self.device)
            cur.wait_event(done)
            # allocated on the copy stream, used (and freed) on this one
            for t in (ei, w):
                if t is not None:
                    t.record_stream(cur)
            return ei, w
        if self._copy is not None and ch.edge_index is not None:
            ei_h, w_h = self._pinned_topology(ch)
            return self._to_dev(ei_h), None if w_h is None else self._to_dev(w_h)
        w = None if ch.edge_weight is None else self._to_dev(ch.edge_weight)
        return self._to_dev(ch.edge_index), w

    def compute(self, job: Job, x, ei, w, g, retain: bool = False) -> Tensor | None:
        with self._rng(job.rng_key):
            if retain and not job.backward:
                leaf, out = retain_layer(self.lw, job.layer, False, x, ei, w,
                                         job.chunk.num_targets, None)
                self.saved[job.rng_key] = (leaf, out)
                # what goes to the store and the cache must not join the graph
                return out.detach()
            if job.chunk.piece is not None:  # a hub's edge piece (offload.partial)
                return self.lw.piece(job.layer, job.backward, job.chunk.piece, x,
                                     ei.long(), w, g)
            return compute_layer(self.lw, job.layer, job.backward, x, ei, w,
                                 job.chunk.num_targets, g)

    def backprop(self, job: Job, g) -> Tensor | None:
        leaf, out = self.saved.pop(job.rng_key)
        torch.autograd.backward(out, g)
        del out
        return leaf.grad if job.layer > 0 else None

    def drop_retained(self) -> None:
        self.saved.clear()

    def take(self, t: Tensor | None, mask: Tensor) -> Tensor | None:
        return None if t is None else t[self._to_dev(mask)]

    def cache_rows(self, aid: int, slots: Tensor) -> Tensor:
        return self.cache.read(self._to_dev(slots))[:, : self.layout.width(aid)]

    def write(self, aid: int, rows: Tensor, vals: Tensor | None) -> None:
        if rows.numel() == 0:
            return
        name = self.layout.name(aid)
        if self.layout.is_grad(aid):
            self.store.accumulate(name, rows, vals)
        else:
            self.store.write(name, rows, vals)
