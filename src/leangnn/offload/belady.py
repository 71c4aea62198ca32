"""The offline optimum of the offload cache: Belady's MIN over the engine's trace.

The exact layer-wise schedule (NeutronJittor, Fundamental Research 2026) is
known before an epoch starts, so the best any cache could do at a budget is
computable offline. :func:`record_trace` records the access sequence a
counting engine generates (which rows of which array every job reads,
produces, accumulates or consumes, in order); :func:`simulate` replays it on
a cache of the engine's ``num_slots`` rows with Belady's MIN (Belady, IBM
Systems Journal 1966: evict the resident row whose next use is furthest in
the future, rows never used again first; an incoming row may bypass the
cache) or, to validate the cost model, with LRU.

Traffic is counted the way :class:`~leangnn.offload.jobs.JobRunner` counts it
(row bytes of the array, host<->device):

* ``READ`` (a job's sources): a miss costs one host->device row;
* ``PRODUCE`` (forward outputs): the row is created dirty on the device;
* ``ACCUM`` (backward input-gradient partial sums): a resident row absorbs
  the partial sum, a non-resident one gets a fresh dirty slot;
* ``CONSUME`` (a backward job reads its upstream gradient, which is then
  dead): host->device when the row is not resident *or* any partial sum of
  it went to the host before;
* a dirty row evicted or bypassed costs one device->host row, and marks
  partial sums as being on the host; MIN writes nothing back for a dirty row
  that is never used again (the engine's policies do, ``writeback_dead``);
* ``HOST_READ`` / ``HOST_WRITE``: the model output and its gradient, which
  never enter the cache (the same bytes for every policy).

With one row size for every cached array, MIN minimises the number of
*dropped gaps* (a row not kept between two consecutive uses); every dropped
gap costs any policy at least one row, so ``compulsory + dropped gaps * row``
is a lower bound on every policy's traffic (``lower_bound_bytes``; with mixed
row sizes the smallest size is used). MIN itself additionally pays one
write-back per dirty row it drops before its last use, so the true optimum
lies between the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

# the same k-smallest selection (ties to lower indices) the engine's cache uses
from .cache import _smallest

__all__ = ["READ", "PRODUCE", "ACCUM", "CONSUME", "HOST_READ", "HOST_WRITE",
           "OPS", "NEVER", "Access", "CacheTrace", "TraceCounters", "record_trace",
           "next_uses", "simulate", "brute_force"]

READ, PRODUCE, ACCUM, CONSUME, HOST_READ, HOST_WRITE = range(6)
OPS = ("read", "produce", "accum", "consume", "host_read", "host_write")
_CACHED = (READ, PRODUCE, ACCUM, CONSUME)
#: next use of a row that is never used again (next uses are stored as int32:
#: an epoch of the 2M-node graph has hundreds of millions of accesses)
NEVER = (1 << 31) - 1


@dataclass
class Access:
    """One access group of a step: ``rows`` of array ``aid`` under ``op``."""

    op: int
    aid: int
    rows: Tensor


@dataclass
class CacheTrace:
    """An epoch's cache accesses, one list of :class:`Access` per job (step).

    Args:
        steps (list): per job, its access groups (an array at most once).
        num_rows (dict): rows of each array id.
        row_bytes (dict): bytes a row of each array moves.
        num_slots (int): rows the engine's cache holds at its budget.
        sweeps (list, optional): the sweep of every step; an array is released
            (its rows leave the cache, unwritten) at the end of the sweep of
            its last access, as the engine does. (default: ``None``, every
            step its own sweep)
    """

    steps: list[list[Access]]
    num_rows: dict[int, int]
    row_bytes: dict[int, int]
    num_slots: int = 0
    sweeps: list[int] | None = None

    def release_steps(self) -> dict[int, list[int]]:
        """Arrays released after each step (the last step of the sweep of
        their last access)."""
        sweeps = self.sweeps or list(range(len(self.steps)))
        last_of_sweep = {k: t for t, k in enumerate(sweeps)}
        last = {}
        for t, step in enumerate(self.steps):
            for a in step:
                if a.op in _CACHED:
                    last[a.aid] = t
        out: dict[int, list[int]] = {}
        for aid, t in last.items():
            out.setdefault(last_of_sweep[sweeps[t]], []).append(aid)
        return out

    @property
    def num_accesses(self) -> int:
        return sum(a.rows.numel() for s in self.steps for a in s)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(steps={len(self.steps)}, "
                f"accesses={self.num_accesses}, num_slots={self.num_slots})")


@dataclass
class TraceCounters:
    """Traffic of one replay of a :class:`CacheTrace`."""

    policy: str
    num_slots: int
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    hits: int = 0
    misses: int = 0
    writebacks: int = 0
    dropped_gaps: int = 0
    compulsory_bytes: int = 0
    min_row_bytes: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def traffic_bytes(self) -> int:
        return self.h2d_bytes + self.d2h_bytes

    @property
    def lower_bound_bytes(self) -> int:
        """Bound on every policy's traffic (valid for MIN's replay only)."""
        return self.compulsory_bytes + self.dropped_gaps * self.min_row_bytes

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "policy", "num_slots", "h2d_bytes", "d2h_bytes", "hits", "misses",
            "writebacks", "dropped_gaps", "compulsory_bytes")}
        d["traffic_bytes"] = self.traffic_bytes
        if self.policy == "min":
            d["lower_bound_bytes"] = self.lower_bound_bytes
        return d


# ------------------------------------------------------------------ recording
class _Recorder:
    """Stands in for the engine's JobRunner: records every job, runs none."""

    def __init__(self, runner, layout):
        self.runner, self.layout = runner, layout
        self.steps: list[list[Access]] = []
        self.sweeps: list[int] = []
        # set by the engine per epoch: backward jobs through kept forward
        # graphs read no layer input
        self.retain, self.retained = False, 0

    def start(self, epoch) -> None:
        self.runner.start(epoch)

    def begin_sweep(self, active) -> None:
        pass

    def run(self, job, upcoming=None) -> None:
        reads = not (self.retain and job.backward)
        step = [Access(READ, job.src, job.src_rows)] if reads else []
        if not job.backward:
            step.append(Access(HOST_WRITE if job.dst_on_host else PRODUCE, job.dst,
                               job.dst_rows))
        else:
            step.append(Access(HOST_READ if job.dst_on_host else CONSUME, job.dst,
                               job.dst_rows))
            if job.grad_src is not None:
                step.append(Access(ACCUM, job.grad_src, job.src_rows))
        self.steps.append(step)
        self.sweeps.append(job.sweep)


def record_trace(engine, train: bool = True) -> CacheTrace:
    """The access sequence of one epoch of ``engine`` (exact mode).

    The engine's sweeps run with a recording stand-in for its job runner, so
    jobs, their order and their rows are exactly the engine's; no cache
    decision is taken and the engine's counters are left as they were.

    Args:
        engine (OffloadEngine): an exact-mode counting engine
            (``virtual=True``).
        train (bool, optional): a training epoch (else a prediction).
            (default: ``True``)
    """
    if engine.options.mode != "exact":
        raise ValueError(f"record_trace: needs mode='exact', got "
                         f"{engine.options.mode!r}")
    if engine.plane.materialises:
        raise ValueError("record_trace: needs a counting engine (virtual=True); "
                         "build one with like=<this engine> to share its schedule")
    # the epoch merges its (empty) counters into ``total`` in place
    saved = (engine.runner, engine.counters, engine.last_train,
             replace(engine.total))
    rec = _Recorder(engine.runner, engine.layout)
    # Until the engine offers a job hook, its runner is swapped from outside:
    # the sweeps call only start/begin_sweep/run on it.
    engine.runner = rec
    try:
        engine.simulate(train)
    finally:
        engine.runner, engine.counters, engine.last_train, engine.total = saved
    lay = engine.layout
    aids = {a.aid for s in rec.steps for a in s}
    return CacheTrace(rec.steps, {a: engine.N for a in aids},
                      {a: lay.row_bytes(a) for a in aids}, engine.cache.num_slots,
                      rec.sweeps)


# ------------------------------------------------------------------ next uses
def next_uses(trace: CacheTrace) -> list[list[Tensor | None]]:
    """For every access, the next step that touches the same row of the same
    array (:data:`NEVER` when none); ``None`` for host-only groups.

    Computed from the trace alone (a stable sort by row groups each row's
    accesses in step order), independently of the schedule's own next-use
    index that the ``st`` policy uses.
    """
    out: list[list[Tensor | None]] = [[None] * len(s) for s in trace.steps]
    per_aid: dict[int, list[tuple[int, int]]] = {}
    for t, step in enumerate(trace.steps):
        for i, a in enumerate(step):
            if a.op in _CACHED:
                per_aid.setdefault(a.aid, []).append((t, i))
    for refs in per_aid.values():
        sizes = torch.tensor([trace.steps[t][i].rows.numel() for t, i in refs])
        rows = torch.cat([trace.steps[t][i].rows for t, i in refs]).long()
        steps = torch.repeat_interleave(
            torch.tensor([t for t, _ in refs], dtype=torch.int32), sizes)
        perm = torch.argsort(rows, stable=True)
        r, s = rows[perm], steps[perm]
        nxt = torch.full_like(s, NEVER)
        same = r[1:] == r[:-1]
        nxt[:-1] = torch.where(same, s[1:], NEVER)
        del r, s, same
        res = torch.empty_like(nxt)
        res[perm] = nxt
        del perm, nxt
        for (t, i), part in zip(refs, torch.split(res, sizes.tolist())):
            out[t][i] = part
    return out


# ----------------------------------------------------------------- simulation
def simulate(trace: CacheTrace, num_slots: int | None = None, policy: str = "min",
             writeback_dead: bool | None = None,
             uses: list[list[Tensor | None]] | None = None) -> TraceCounters:
    """Replay ``trace`` on a cache of ``num_slots`` rows.

    Args:
        trace (CacheTrace): the accesses.
        num_slots (int, optional): cache rows (default: the trace's).
        policy (str, optional): ``"min"`` (Belady) or ``"lru"`` (the engine's
            LRU, to validate the cost model). (default: ``"min"``)
        writeback_dead (bool, optional): write back dirty rows that are never
            used again (the engine's policies do). (default: ``False`` for
            MIN, ``True`` for LRU)
        uses (list, optional): :func:`next_uses` of the trace, if computed.

    Returns:
        TraceCounters: traffic, hits, and MIN's dropped gaps.
    """
    if policy not in ("min", "lru"):
        raise ValueError(f"simulate: policy must be 'min' or 'lru', got {policy!r}")
    k = trace.num_slots if num_slots is None else int(num_slots)
    if k < 0:
        raise ValueError(f"simulate: num_slots must be >= 0, got {k}")
    if writeback_dead is None:
        writeback_dead = policy == "lru"
    if uses is None:
        uses = next_uses(trace)
    rb = trace.row_bytes
    cached_rb = [rb[a.aid] for s in trace.steps for a in s if a.op in _CACHED]
    c = TraceCounters(policy, k, min_row_bytes=min(cached_rb, default=0))
    slot_of = {a: torch.full((n,), -1, dtype=torch.long)
               for a, n in trace.num_rows.items()}
    flushed = {a: torch.zeros(n, dtype=torch.bool) for a, n in trace.num_rows.items()}
    seen = {a: torch.zeros(n, dtype=torch.bool) for a, n in trace.num_rows.items()}
    owner = torch.full((k,), -1, dtype=torch.long)
    srow = torch.zeros(k, dtype=torch.long)
    skey = torch.zeros(k, dtype=torch.long)
    sdirty = torch.zeros(k, dtype=torch.bool)
    snext = torch.zeros(k, dtype=torch.long)
    used, clock = 0, 0
    releases = trace.release_steps()

    def keep_keys(nu: Tensor, dirty: Tensor) -> Tensor:
        nonlocal clock
        if policy == "lru":
            keys = torch.arange(clock, clock + nu.numel())
            clock += nu.numel()
            return keys
        # furthest next use loses; on a tie the clean row goes (it costs no
        # write-back)
        return (NEVER - nu) * 2 + dirty.long()

    def drop(aid: int, rows: Tensor, nu: Tensor, dirty: Tensor) -> None:
        # rows leave the cache (evicted or bypassed): dirty ones go to the host
        live = nu < NEVER
        c.dropped_gaps += int(live.sum())
        wb = dirty & (live | writeback_dead)
        n = int(wb.sum())
        c.d2h_bytes += n * rb[aid]
        c.writebacks += n
        flushed[aid][rows[wb]] = True

    def free(slots: Tensor) -> None:
        nonlocal used
        if slots.numel() == 0:
            return
        for a in torch.unique(owner[slots]).tolist():
            m = owner[slots] == a
            slot_of[a][srow[slots[m]]] = -1
        owner[slots] = -1
        used -= slots.numel()

    def admit(cands: list, n_in: int) -> None:
        nonlocal used
        admitted = torch.ones(n_in, dtype=torch.bool)
        if n_in > k - used:
            occ = torch.nonzero(owner >= 0).flatten()
            allkeys = torch.cat([*(x[3] for x in cands), skey[occ]])
            reject = _smallest(allkeys, n_in - (k - used))
            admitted[reject[reject < n_in]] = False
            victims = occ[reject[reject >= n_in] - n_in]
            for aid in torch.unique(owner[victims]).tolist():
                v = victims[owner[victims] == aid]
                drop(aid, srow[v], snext[v], sdirty[v])
            free(victims)
        free_slots = torch.nonzero(owner < 0).flatten()
        off = pos = 0
        for aid, rows, nu, keys, dirty in cands:
            m = admitted[off: off + rows.numel()]
            off += rows.numel()
            if (~m).any():
                drop(aid, rows[~m], nu[~m], dirty[~m])
            nk = int(m.sum())
            if nk == 0:
                continue
            s = free_slots[pos: pos + nk]
            pos += nk
            slot_of[aid][rows[m]] = s
            owner[s], srow[s], skey[s] = aid, rows[m], keys[m]
            snext[s], sdirty[s] = nu[m], dirty[m]
            used += nk

    for t, step in enumerate(trace.steps):
        cands: list[tuple[int, Tensor, Tensor, Tensor, Tensor]] = []
        for a, nu in zip(step, uses[t]):
            rows, aid, n = a.rows.long(), a.aid, a.rows.numel()
            if nu is not None:
                nu = nu.long()
            if a.op == HOST_READ:
                c.h2d_bytes += n * rb[aid]
                c.compulsory_bytes += n * rb[aid]
                c.misses += n
                continue
            if a.op == HOST_WRITE:
                c.d2h_bytes += n * rb[aid]
                c.compulsory_bytes += n * rb[aid]
                continue
            slots = slot_of[aid][rows]
            hit = slots >= 0
            nh = int(hit.sum())
            miss = ~hit
            if a.op == READ:
                c.hits += nh
                c.misses += n - nh
                c.h2d_bytes += (n - nh) * rb[aid]
                first = miss & ~seen[aid][rows]
                c.compulsory_bytes += int(first.sum()) * rb[aid]
                dirty = torch.zeros(n - nh, dtype=torch.bool)
            elif a.op == CONSUME:
                c.hits += nh
                c.misses += n - nh
                host = miss | flushed[aid][rows]
                c.h2d_bytes += int(host.sum()) * rb[aid]
                free(slots[hit])
                seen[aid][rows] = True
                continue
            else:  # PRODUCE, ACCUM: (partial) values made on the device
                dirty = torch.ones(n - nh, dtype=torch.bool)
            seen[aid][rows] = True
            hs = slots[hit]
            # keys of all the group's rows at once, in row order (the LRU clock
            # then runs exactly as the engine's)
            dirty_all = torch.full((n,), a.op != READ, dtype=torch.bool)
            dirty_all[hit] |= sdirty[hs]
            keys = keep_keys(nu, dirty_all)
            snext[hs], skey[hs], sdirty[hs] = nu[hit], keys[hit], dirty_all[hit]
            cands.append((aid, rows[miss], nu[miss], keys[miss], dirty))
        n_in = sum(x[1].numel() for x in cands)
        if n_in:
            admit(cands, n_in)
        for aid in releases.get(t, ()):
            s = slot_of[aid]
            free(s[s >= 0])

    return c


# ---------------------------------------------------------------- brute force
def brute_force(trace: CacheTrace, num_slots: int | None = None,
                writeback_dead: bool = False) -> int:
    """Least traffic over *every* sequence of eviction/bypass choices.

    Exhaustive (memoised over cache states) with the same cost rules as
    :func:`simulate`, written over Python sets; for tiny traces only.
    """
    from functools import cache

    k = trace.num_slots if num_slots is None else int(num_slots)
    steps = [[(a.op, a.aid, tuple(a.rows.tolist())) for a in s] for s in trace.steps]
    if sum(len(r) for s in steps for _, _, r in s) > 200:
        raise ValueError("brute_force: trace too large for exhaustive search")
    rb = trace.row_bytes

    def later_use(t: int, item) -> bool:
        return any(op in _CACHED and (aid, r) == item
                   for s in steps[t + 1:] for op, aid, rows in s for r in rows)

    @cache
    def best(t: int, resident: frozenset, flushed: frozenset) -> int:
        if t == len(steps):
            return 0
        res = dict(resident)
        fl = set(flushed)
        cost = 0
        pool = {}
        for op, aid, rows in steps[t]:
            for r in rows:
                item = (aid, r)
                if op == HOST_READ or op == HOST_WRITE:
                    cost += rb[aid]
                elif op == READ:
                    if item in res:
                        pool[item] = res.pop(item)
                    else:
                        cost += rb[aid]
                        pool[item] = False
                elif op == CONSUME:
                    if item not in res or item in fl:
                        cost += rb[aid]
                    res.pop(item, None)
                else:
                    res.pop(item, None)
                    pool[item] = True
        pool.update(res)
        items = sorted(pool)
        options = []
        for mask in range(1 << len(items)):
            if bin(mask).count("1") > k:
                continue
            keep, extra, fl2 = {}, 0, set(fl)
            for j, it in enumerate(items):
                if mask >> j & 1:
                    keep[it] = pool[it]
                elif pool[it] and (writeback_dead or later_use(t, it)):
                    extra += rb[it[0]]
                    fl2.add(it)
            options.append(extra + best(t + 1, frozenset(keep.items()),
                                        frozenset(fl2)))
        return cost + min(options)

    return best(0, frozenset(), frozenset())
