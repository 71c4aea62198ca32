"""One chunk job of the offload engine: what it reads, moves, counts and caches.

A job (NeutronJittor, Fundamental Research 2026) reads its layer input rows
(from the device cache or the host store), runs the layer (or recomputes it
and backpropagates), writes or accumulates its outputs, and offers rows to
the cache with the policy's keys. :class:`JobRunner` does the bookkeeping
every job shares (cache lookups, keys, admissions, traffic counters, the
budget charge) and hands every tensor operation to a *data plane*: the
:class:`~leangnn.offload.plane.DevicePlane` moves real rows, the
:class:`~leangnn.offload.plane.CountingPlane` moves none, so a counting
replay makes the very same decisions as a real epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from leangnn.offload.budget import DeviceBudget
from leangnn.offload.cache import Candidates, DeviceCache, st_keys
from leangnn.offload.counters import OffloadCounters
from leangnn.offload.schedule import Chunk

__all__ = ["ArrayLayout", "Job", "Epoch", "CacheKeys", "JobRunner"]


@dataclass(frozen=True)
class ArrayLayout:
    """Ids, names and widths of the engine's ``[rows, width]`` host arrays.

    For widths ``[w_0, ..., w_L]``: ``h_l`` (layer ``l``'s input, ``h_L`` the
    model output) has id ``l``; its gradient ``g_l`` has id ``L + 1 + l``;
    :attr:`out` (``2L + 2``) is the recompute baseline's assembled output.
    """

    widths: tuple[int, ...]
    dtype: torch.dtype

    @property
    def num_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def h(self, li: int) -> int:
        return li

    def g(self, li: int) -> int:
        return self.num_layers + 1 + li

    @property
    def out(self) -> int:
        return 2 * self.num_layers + 2

    @property
    def num_arrays(self) -> int:
        return 2 * self.num_layers + 3

    def is_grad(self, aid: int) -> bool:
        return self.num_layers < aid < self.out

    def width(self, aid: int) -> int:
        L = self.num_layers
        if aid <= L:
            return self.widths[aid]
        return self.widths[L] if aid == self.out else self.widths[aid - L - 1]

    def row_bytes(self, aid: int) -> int:
        return self.width(aid) * self.elem

    def name(self, aid: int) -> str:
        L = self.num_layers
        if aid <= L:
            return f"h{aid}"
        return "out" if aid == self.out else f"g{aid - L - 1}"


@dataclass
class Job:
    """One chunk job of a sweep.

    Attributes:
        sweep (int): the sweep ``k`` (forward sweeps ``0..L-1``, then backward).
        layer (int): the layer ``l`` it runs.
        chunk (Chunk): targets ``T``, sources ``S`` and local edges.
        backward (bool): recompute + backpropagate instead of forward.
        src (int): id of the input array ``h_l``.
        src_rows (Tensor): rows of ``src`` holding ``S`` (global ids, or
            positions in the recompute baseline's per-part arrays).
        dst (int): forward: array it writes (``h_{l+1}``); backward: the
            upstream gradient it reads (``g_{l+1}``).
        dst_rows (Tensor): rows of ``dst`` holding ``T``.
        position (int or None): the chunk's index in the exact schedule (for
            next-use keys); ``None`` in the recompute baseline.
        dst_on_host (bool): ``dst`` bypasses the cache (the model output and
            its gradient live on the host only).
        grad_src (int or None): backward: array accumulating the input
            gradient (``g_l``); ``None`` for the first layer.
        rng_key (tuple): names the job's dropout masks; forward and the
            backward recompute of a chunk share it.
    """

    sweep: int
    layer: int
    chunk: Chunk
    backward: bool
    src: int
    src_rows: Tensor
    dst: int
    dst_rows: Tensor
    position: int | None = None
    dst_on_host: bool = False
    grad_src: int | None = None
    rng_key: tuple = ()


@dataclass
class Epoch:
    """State of one epoch: its counters, the reads of each array (for the
    ``st`` keys: ``[(sweep, "S" | "T"), ...]``) and, per gradient array, the
    rows whose partial sums already went to the host."""

    counters: OffloadCounters = field(default_factory=OffloadCounters)
    accesses: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    partial: dict[int, Tensor] = field(default_factory=dict)


class CacheKeys:
    """Keep keys of the cache policies for the rows a job touches.

    Args:
        policy (str): ``none``, ``lru``, ``degree`` or ``st``.
        degree (Tensor): in-degree of every node (``degree``/``st`` tie-break).
        sched (ExactSchedule or RecomputeSchedule): answers next uses (``st``).
        num_arrays (int): array ids are below it.
    """

    #: host bytes the memo of ``st`` keys may hold
    memo_bytes = 128 << 20

    def __init__(self, policy: str, degree: Tensor, sched, num_arrays: int):
        self.policy, self.degree, self.sched = policy, degree, sched
        self.num_arrays = num_arrays
        self.clock = 0
        # The schedule is static, so a job's ``st`` keys depend only on
        # (array, sweep, chunk, that array's reads this epoch): computed once
        # and reused every epoch (up to memo_bytes). Entries hold the row
        # tensors they were made for, so an identity check cannot be fooled
        # by a reused id.
        self._memo: dict[tuple, tuple[Tensor, Tensor, Tensor]] = {}
        self._memo_used = 0

    def __call__(self, aid: int, rows: Tensor, gids: Tensor, sweep: int,
                 position: int | None, accesses) -> Tensor:
        if self.policy == "lru":
            keys = torch.arange(self.clock, self.clock + rows.numel())
            self.clock += rows.numel()
            return keys
        if self.policy == "degree":
            return self.degree[gids]
        acc = accesses[aid]
        memo_key = (aid, sweep, position, id(rows), id(gids), tuple(acc))
        hit = self._memo.get(memo_key)
        if hit is not None and hit[0] is rows and hit[1] is gids:
            return hit[2]
        nu, rem = self.sched.next_use(acc, sweep, position, rows)
        keys = st_keys(nu, rem, self.degree[gids])
        if self._memo_used + 8 * keys.numel() <= self.memo_bytes:
            self._memo[memo_key] = (rows, gids, keys)
            self._memo_used += 8 * keys.numel()
        return keys

    def begin_sweep(self, cache: DeviceCache, active: set[int]) -> None:
        """PaGraph's degree rule: rows of arrays the sweep does not touch lose."""
        if self.policy == "degree":
            act = torch.zeros(self.num_arrays, dtype=torch.bool)
            act[list(active)] = True
            cache.rekey(lambda owner, row, aux, key: torch.where(
                act[owner], aux, -1))


class JobRunner:
    """Runs jobs: cache decisions and counters here, tensors on ``plane``.

    Args:
        plane (DevicePlane or CountingPlane): the data plane.
        cache (DeviceCache): the device cache.
        layout (ArrayLayout): the array ids.
        keys (CacheKeys): the policy's keys.
        budget (DeviceBudget): charges every job.
    """

    def __init__(self, plane, cache: DeviceCache, layout: ArrayLayout,
                 keys: CacheKeys, budget: DeviceBudget):
        self.plane, self.cache, self.layout = plane, cache, layout
        self.keys, self.budget = keys, budget
        self.epoch = Epoch()
        #: this epoch keeps forward graphs (set by the engine per epoch), and
        #: the accounted bytes of those still alive
        self.retain, self.retained = False, 0
        #: the expected (unmargined) bytes of those graphs, for estimates
        self.kept = 0

    def start(self, epoch: Epoch) -> None:
        self.epoch = epoch

    def begin_sweep(self, active: set[int]) -> None:
        self.keys.begin_sweep(self.cache, active)

    def run(self, job: Job, upcoming: Chunk | None = None) -> None:
        """Forward job (writes ``dst`` rows) or backward job (reads the
        upstream gradient ``dst`` rows, accumulates into ``grad_src``);
        ``upcoming`` (the next job's chunk) has its topology copied while
        this job runs, where the device and the budget allow."""
        if self.retain and job.backward:
            self._run_retained_backward(job)
            return
        cache, plane, c = self.cache, self.plane, self.epoch.counters
        ch, degree = job.chunk, self.keys.degree
        retaining = self.retain
        need = self.budget.charge(job.layer, job.backward, ch.sizes, cache.nbytes, c,
                                  self.retained, retaining, plane.host_bytes(),
                                  self.kept)
        plane.prefetch(upcoming, self.budget.total - need)
        caching = cache.num_slots > 0
        with plane.measured(c, self.retained):
            with plane.bookkeeping():
                slots = cache.lookup(job.src, job.src_rows)
                hit = slots >= 0
                hit_pos = torch.nonzero(hit).flatten()
                miss_pos = torch.nonzero(~hit).flatten()
            c.cache_hits += hit_pos.numel()
            c.cache_misses += miss_pos.numel()
            c.h2d_bytes += miss_pos.numel() * self.layout.row_bytes(job.src)
            c.h2d_meta_bytes += 8 * hit_pos.numel()
            x = plane.assemble(job.src, job.src_rows, slots, hit_pos, miss_pos)
            g_up = self._read_grad(job) if job.backward else None
            n_e = ch.num_edges
            c.h2d_meta_bytes += n_e * 8 + (n_e * self.layout.elem if ch.weighted
                                           else 0)
            ei, w = plane.topology(ch)
            out = plane.compute(job, x, ei, w, g_up, retaining)
            del g_up, ei, w
            if retaining:
                self.retained += self.budget.retained_bytes(job.layer, *ch.sizes)
                self.kept += self.budget.kept_expected(job.layer, *ch.sizes)
            if job.backward:
                c.vertex_layer_recomputations += ch.num_targets
            else:
                c.vertex_layer_computations += ch.num_targets
            groups = []
            with plane.bookkeeping():
                if caching:
                    # positions, not masks: a bool mask index is a nonzero()
                    # per use, and with no hit the block is the candidates
                    keys = self.keys(job.src, job.src_rows, ch.sources, job.sweep,
                                     job.position, self.epoch.accesses)
                    cache.set_keys(slots[hit_pos], keys[hit_pos])
                    all_miss = hit_pos.numel() == 0
                    groups.append(Candidates(
                        job.src, job.src_rows if all_miss else job.src_rows[miss_pos],
                        keys if all_miss else keys[miss_pos], False,
                        x if all_miss else plane.take(x, miss_pos),
                        degree[ch.sources if all_miss else ch.sources[miss_pos]]))
            del x
            if job.backward and job.grad_src is not None:
                self._accumulate(job, out, groups)
            elif not job.backward:
                if job.dst_on_host or not caching:
                    self._write_host(job.dst, job.dst_rows, out)
                else:
                    with plane.bookkeeping():
                        keys = self.keys(job.dst, job.dst_rows, ch.targets, job.sweep,
                                         None, self.epoch.accesses)
                    groups.append(Candidates(job.dst, job.dst_rows, keys, True, out,
                                             degree[ch.targets]))
            self._offer(groups)

    def _run_retained_backward(self, job: Job) -> None:
        """Backward through the graph the job's forward kept: no input rows
        are read and nothing is recomputed; the upstream gradient comes in and
        the input gradient goes out as in a recomputing job."""
        c, ch = self.epoch.counters, job.chunk
        self.budget.charge(job.layer, True, ch.sizes, self.cache.nbytes, c,
                           self.retained, host=self.plane.host_bytes(),
                           kept=self.kept, through_kept=True)
        with self.plane.measured(c, self.retained):
            g_up = self._read_grad(job)
            gx = self.plane.backprop(job, g_up)
            del g_up
            self.retained -= self.budget.retained_bytes(job.layer, *ch.sizes)
            self.kept -= self.budget.kept_expected(job.layer, *ch.sizes)
            groups = []
            if job.grad_src is not None:
                self._accumulate(job, gx, groups)
            del gx
            self._offer(groups)

    # -------------------------------------------------------------- helpers
    def _offer(self, groups: list) -> None:
        """Offer a job's candidates to the cache; dirty rows of the last group
        that lose go to the host."""
        if not groups:
            return
        masks = self.cache.insert(groups, self._writeback)
        last = groups[-1]
        if last.dirty:
            m = ~masks[-1]
            self._write_host(last.aid, last.rows[m],
                             self.plane.take(last.values, m))

    def _write_host(self, aid: int, rows: Tensor, vals: Tensor | None) -> None:
        self.epoch.counters.d2h_bytes += rows.numel() * self.layout.row_bytes(aid)
        partial = self.epoch.partial.get(aid)
        if partial is not None:
            partial[rows] = True
        self.plane.write(aid, rows, vals)

    def _writeback(self, aid: int, rows: Tensor, slots: Tensor) -> None:
        self.epoch.counters.writebacks += rows.numel()
        self._write_host(aid, rows, self.plane.cache_rows(aid, slots))

    def _accumulate(self, job: Job, gx: Tensor | None, groups: list) -> None:
        cache, plane = self.cache, self.plane
        aid, rows, gids = job.grad_src, job.src_rows, job.chunk.sources
        if cache.num_slots == 0:
            self._write_host(aid, rows, gx)
            return
        with plane.bookkeeping():
            slots = cache.lookup(aid, rows)
            res = slots >= 0
            res_pos = torch.nonzero(res).flatten()
            keys = self.keys(aid, rows, gids, job.sweep, job.position,
                             self.epoch.accesses)
            cache.set_keys(slots[res_pos], keys[res_pos])
        if not res_pos.numel():  # nothing resident: every row is a candidate
            groups.append(Candidates(aid, rows, keys, True, gx,
                                     self.keys.degree[gids]))
            return
        cache.add_(slots[res_pos], plane.take(gx, res_pos))
        with plane.bookkeeping():
            miss_pos = torch.nonzero(~res).flatten()
        groups.append(Candidates(aid, rows[miss_pos], keys[miss_pos], True,
                                 plane.take(gx, miss_pos),
                                 self.keys.degree[gids[miss_pos]]))

    def _read_grad(self, job: Job) -> Tensor | None:
        c, plane = self.epoch.counters, self.plane
        aid, rows = job.dst, job.dst_rows
        row_bytes = self.layout.row_bytes(aid)
        if job.dst_on_host or self.cache.num_slots == 0:
            c.cache_misses += rows.numel()
            c.h2d_bytes += rows.numel() * row_bytes
            return plane.gather(aid, rows)
        with plane.bookkeeping():
            slots = self.cache.lookup(aid, rows)
            hit = slots >= 0
            from_host = ~hit | self.epoch.partial[aid][rows]
            hit_pos = torch.nonzero(hit).flatten()
            host_pos = torch.nonzero(from_host).flatten()
        c.cache_hits += hit_pos.numel()
        c.cache_misses += rows.numel() - hit_pos.numel()
        c.h2d_bytes += host_pos.numel() * row_bytes
        vals = plane.grad_rows(aid, rows, slots, hit_pos, host_pos)
        with plane.bookkeeping():
            self.cache.drop(aid, rows)
        return vals

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({type(self.plane).__name__}, "
                f"policy={self.keys.policy})")
