"""Belady's MIN over the offload engine's trace: against exhaustive search,
against the engine's own counters, and as a bound on every policy."""

from __future__ import annotations

import pytest
import torch

from leangnn.graphs.synthetic import power_law_graph
from leangnn.nn.models import build_model
from leangnn.offload import OffloadEngine
from leangnn.offload.belady import (
    ACCUM,
    CONSUME,
    NEVER,
    PRODUCE,
    READ,
    Access,
    CacheTrace,
    brute_force,
    next_uses,
    record_trace,
    simulate,
)
from leangnn.plan.vertex import full_batch_vertex_bytes

ROW = 8


def _subset(gen, n, p=0.5):
    m = torch.rand(n, generator=gen) < p
    return torch.nonzero(m).flatten()


def _read_trace(seed, n=5, steps=7):
    gen = torch.Generator().manual_seed(seed)
    st = []
    for _ in range(steps):
        rows = _subset(gen, n)
        st.append([Access(READ, 0, rows)] if rows.numel() else [])
    return CacheTrace(st, {0: n}, {0: ROW})


def _dirty_trace(seed, n=3, steps=6):
    """Engine-like lifecycles: features read (array 0), a layer output
    produced then read (array 1), a gradient accumulated then consumed once
    (array 2)."""
    gen = torch.Generator().manual_seed(seed)
    st = [[] for _ in range(steps)]
    for t in range(steps):
        r = _subset(gen, n, 0.4)
        if r.numel():
            st[t].append(Access(READ, 0, r))
    st[0].append(Access(PRODUCE, 1, torch.arange(n)))
    for t in range(1, steps):
        r = _subset(gen, n, 0.5)
        if r.numel():
            st[t].append(Access(READ, 1, r))
    last = torch.full((n,), -1)
    for t in range(1, steps - 1):
        r = _subset(gen, n, 0.5)
        if r.numel():
            st[t].append(Access(ACCUM, 2, r))
            last[r] = t
    for t in range(2, steps):
        r = torch.nonzero((last >= 0) & (last < t)).flatten()
        r = r[torch.rand(r.numel(), generator=gen) < 0.6] if t < steps - 1 else r
        if r.numel():
            st[t].append(Access(CONSUME, 2, r))
            last[r] = steps  # consumed: no later access
    return CacheTrace(st, {0: n, 1: n, 2: n}, {0: ROW, 1: ROW, 2: ROW})


def test_next_uses_match_a_scan():
    tr = _dirty_trace(3)
    uses = next_uses(tr)
    for t, step in enumerate(tr.steps):
        for a, nu in zip(step, uses[t]):
            for r, got in zip(a.rows.tolist(), nu.tolist()):
                later = [t2 for t2 in range(t + 1, len(tr.steps))
                         if any(b.aid == a.aid and r in b.rows.tolist()
                                for b in tr.steps[t2])]
                assert got == (later[0] if later else NEVER)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slots", [1, 2, 3])
def test_min_is_the_optimum_on_read_traces(seed, slots):
    tr = _read_trace(seed)
    m = simulate(tr, slots)
    best = brute_force(tr, slots)
    assert m.traffic_bytes == best
    assert m.lower_bound_bytes == best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slots", [1, 2])
def test_min_brackets_the_optimum_with_dirty_rows(seed, slots):
    tr = _dirty_trace(seed)
    m = simulate(tr, slots)
    best = brute_force(tr, slots)
    assert m.lower_bound_bytes <= best <= m.traffic_bytes
    # the engine's policies write dead rows back: their optimum is no lower
    assert brute_force(tr, slots, writeback_dead=True) >= best


def test_no_cache_and_bad_arguments():
    tr = _dirty_trace(0)
    m = simulate(tr, 0)
    assert m.hits == 0 and m.traffic_bytes == brute_force(tr, 0)
    with pytest.raises(ValueError, match="policy"):
        simulate(tr, 2, policy="fifo")
    with pytest.raises(ValueError, match="num_slots"):
        simulate(tr, -1)


def _engines(seed, frac):
    d = power_law_graph(400, avg_degree=6, in_channels=8, num_classes=4, seed=seed)
    torch.manual_seed(seed)
    model = build_model("gcn", 8, 16, 4, 3)
    budget = int(frac * full_batch_vertex_bytes(model, d.num_nodes))
    out, ref = {}, None
    for pol in ("st", "lru", "degree", "none"):
        out[pol] = OffloadEngine(model, d, budget, 5, pol, virtual=True, like=ref)
        ref = ref or out[pol]
    return out


@pytest.mark.parametrize("seed,frac", [(0, 0.5), (1, 0.3)])
def test_min_bounds_every_engine_policy(seed, frac):
    engines = _engines(seed, frac)
    counts = {p: e.simulate() for p, e in engines.items()}
    tr = record_trace(engines["st"])
    assert len(tr.steps) == counts["st"].jobs
    assert tr.num_slots == engines["st"].cache.num_slots > 0
    uses = next_uses(tr)
    m = simulate(tr, uses=uses)
    # the cost model reproduces the engine: its LRU exactly, and no cache
    lru = simulate(tr, policy="lru", uses=uses)
    assert (lru.h2d_bytes, lru.d2h_bytes) == (counts["lru"].h2d_bytes,
                                              counts["lru"].d2h_bytes)
    assert lru.hits == counts["lru"].cache_hits
    none = simulate(record_trace(engines["none"]), 0)
    assert (none.h2d_bytes, none.d2h_bytes) == (counts["none"].h2d_bytes,
                                                counts["none"].d2h_bytes)
    for pol in ("st", "lru", "degree"):
        assert m.lower_bound_bytes <= counts[pol].traffic_bytes
        assert m.traffic_bytes <= counts[pol].traffic_bytes, pol
    # recording leaves the engine as it was: it still counts the same
    total = engines["st"].total.to_dict()
    record_trace(engines["st"])
    assert engines["st"].total.to_dict() == total
    assert engines["st"].simulate().traffic_bytes == counts["st"].traffic_bytes


def test_record_trace_refuses_the_recompute_baseline():
    d = power_law_graph(200, avg_degree=4, in_channels=8, num_classes=4)
    model = build_model("gcn", 8, 16, 4, 2)
    eng = OffloadEngine(model, d, "8MiB", 3, "lru", mode="recompute", virtual=True)
    with pytest.raises(ValueError, match="mode='exact'"):
        record_trace(eng)
    real = OffloadEngine(model, d, "8MiB", 3, "lru")
    with pytest.raises(ValueError, match="virtual=True"):
        record_trace(real)


def test_trace_of_a_retaining_engine_reproduces_its_counters():
    # backward through kept forward graphs reads no layer input
    d = power_law_graph(300, avg_degree=6, in_channels=8, num_classes=4, seed=3)
    torch.manual_seed(0)
    model = build_model("gcn", 8, 16, 4, 3)
    probe = OffloadEngine(model, d, "1MiB", 4, "lru", virtual=True, retain=True)
    eng = OffloadEngine(model, d, probe.whole_graph_budget, 4, "lru", virtual=True,
                        retain=True)
    assert eng.retain
    c = eng.simulate()
    tr = record_trace(eng)
    assert not any(a.op == READ for t, s in enumerate(tr.steps)
                   for a in s if tr.sweeps[t] >= 3)
    lru = simulate(tr, policy="lru")
    assert (lru.h2d_bytes, lru.d2h_bytes) == (c.h2d_bytes, c.d2h_bytes)
    assert simulate(tr).traffic_bytes <= c.traffic_bytes
