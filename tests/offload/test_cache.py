"""DeviceCache: capacity, write-back, and the policies against simple references."""

from __future__ import annotations

import itertools
from collections import OrderedDict

import pytest
import torch

from leangnn.offload.cache import INF_STEP, Candidates, DeviceCache, st_keys


def _cache(slots, policy="lru", width=3):
    return DeviceCache(slots * width * 8, width, torch.float64, "cpu", policy)


def _random_steps(universe, steps, size, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randperm(universe, generator=gen)[:size] for _ in range(steps)]


def _no_writeback(aid, rows, slots):
    raise AssertionError("clean rows must never be written back")


def _drive(cache, steps, keys_of, aux=None):
    """Engine-style use of the cache: look up a job's rows, refresh the keys
    of hits, offer the misses. Returns hits per step and the resident sets."""
    hits, states = [], []
    for s, rows in enumerate(steps):
        slots = cache.lookup(0, rows)
        hit = slots >= 0
        hits.append(int(hit.sum()))
        keys = keys_of(s, rows)
        cache.set_keys(slots[hit], keys[hit])
        cache.insert([Candidates(0, rows[~hit], keys[~hit], False)], _no_writeback)
        assert cache.used <= cache.num_slots
        states.append(set(cache.row[cache.resident(0)].tolist()))
    return hits, states


def _lru_reference(steps, capacity):
    """Textbook LRU with batch lookups (a job needs all its rows at once)."""
    od, hits, states = OrderedDict(), [], []
    for rows in steps:
        rows = rows.tolist()
        hits.append(sum(r in od for r in rows))
        for r in rows:
            od.pop(r, None)
            od[r] = True
        while len(od) > capacity:
            od.popitem(last=False)
        states.append(set(od))
    return hits, states


@pytest.mark.parametrize("seed", range(4))
def test_lru_matches_reference(seed):
    steps = _random_steps(40, 30, 7, seed)
    cache = _cache(12)
    cache.register(0, 40)
    clock = itertools.count()
    hits, states = _drive(cache, steps, lambda s, rows: torch.tensor(
        [next(clock) for _ in range(rows.numel())]))
    ref_hits, ref_states = _lru_reference(steps, 12)
    assert hits == ref_hits
    assert states == ref_states


def _next_use(steps):
    """next_use[s][i]: next step after s that reads steps[s][i] (brute force)."""
    out = []
    for s, rows in enumerate(steps):
        nu = []
        for r in rows.tolist():
            later = [t for t in range(s + 1, len(steps)) if r in steps[t].tolist()]
            nu.append(later[0] if later else INF_STEP)
        out.append(torch.tensor(nu))
    return out


def _optimal_misses(steps, capacity):
    """Fewest misses of any cache of ``capacity`` rows (DP over cache states,
    bypass allowed): the offline optimum Belady's rule must reach."""
    best = {frozenset(): 0}
    for rows in steps:
        need = set(rows.tolist())
        nxt = {}
        for state, cost in best.items():
            c = cost + len(need - state)
            pool = sorted(state | need)
            for k in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, k):
                    key = frozenset(keep)
                    if nxt.get(key, 1 << 30) > c:
                        nxt[key] = c
        best = nxt
    return min(best.values())


@pytest.mark.parametrize("seed", range(6))
def test_st_is_belady_optimal(seed):
    steps = _random_steps(7, 8, 3, seed)
    capacity = 2 + seed % 2
    nu = _next_use(steps)
    zeros = torch.zeros(3, dtype=torch.long)
    cache = _cache(capacity, "st")
    cache.register(0, 7)
    hits, _ = _drive(cache, steps, lambda s, rows: st_keys(nu[s], zeros, zeros))
    misses = sum(r.numel() for r in steps) - sum(hits)
    assert misses == _optimal_misses(steps, capacity)
    # and LRU, which ignores the future, is never better
    lru = _cache(capacity)
    lru.register(0, 7)
    clock = itertools.count()
    lru_hits, _ = _drive(lru, steps, lambda s, rows: torch.tensor(
        [next(clock) for _ in range(rows.numel())]))
    assert sum(lru_hits) <= sum(hits)


def test_st_key_order_temporal_then_structural_then_degree():
    nu = torch.tensor([5, 5, 5, 9, INF_STEP])
    rem = torch.tensor([1, 3, 3, 50, 50])
    deg = torch.tensor([100, 1, 7, 1000, 1000])
    k = st_keys(nu, rem, deg)
    # sooner beats more remaining uses and higher degree; ties go to more
    # remaining uses, then to degree; never-used-again rows rank last
    assert k[0] > k[3] > k[4]
    assert k[1] > k[0] and k[2] > k[1]


def test_dirty_rows_are_written_back_before_their_slot_is_reused():
    cache = _cache(2, "lru")
    cache.register(0, 10)
    cache.register(1, 10)
    vals = torch.arange(6, dtype=torch.float64).view(2, 3)
    cache.insert([Candidates(1, torch.tensor([4, 7]), torch.tensor([0, 1]), True,
                             vals)], _no_writeback)
    written = {}

    def wb(aid, rows, slots):
        written[aid] = (rows.clone(), cache.read(slots).clone())

    masks = cache.insert([Candidates(0, torch.tensor([1]), torch.tensor([5]), False,
                                     torch.full((1, 3), 9.0, dtype=torch.float64))], wb)
    assert masks[0].tolist() == [True]
    rows, data = written[1]
    assert rows.tolist() == [4] and torch.equal(data, vals[:1])  # the LRU row
    s = cache.lookup(1, torch.tensor([4, 7]))
    assert s[0] == -1 and s[1] >= 0
    assert torch.equal(cache.read(s[1:]), vals[1:])
    assert torch.equal(cache.read(cache.lookup(0, torch.tensor([1]))),
                       torch.full((1, 3), 9.0, dtype=torch.float64))


def test_low_keys_bypass_and_ties_do_not_churn():
    cache = _cache(2, "st")
    cache.register(0, 10)
    cache.insert([Candidates(0, torch.tensor([0, 1]), torch.tensor([5, 5]), False)],
                 _no_writeback)
    m = cache.insert([Candidates(0, torch.tensor([2, 3]), torch.tensor([5, 1]),
                                 False)], _no_writeback)
    assert m[0].tolist() == [False, False]  # equal or lower keys stay out
    m = cache.insert([Candidates(0, torch.tensor([4]), torch.tensor([6]), False)],
                     _no_writeback)
    assert m[0].tolist() == [True] and cache.used == 2


def test_accumulate_drop_and_narrow_rows():
    cache = _cache(4, "st", width=3)
    cache.register(2, 5)
    cache.insert([Candidates(2, torch.tensor([3]), torch.tensor([1]), True,
                             torch.ones(1, 2, dtype=torch.float64))], _no_writeback)
    s = cache.lookup(2, torch.tensor([3]))
    cache.add_(s, torch.full((1, 2), 2.0, dtype=torch.float64))
    assert cache.read(s)[0, :2].tolist() == [3.0, 3.0]
    cache.drop(2, torch.tensor([3]))
    assert cache.used == 0 and int(cache.lookup(2, torch.tensor([3]))) == -1


def test_none_has_no_slots_and_virtual_has_no_pool():
    none = _cache(100, "none")
    none.register(0, 5)
    m = none.insert([Candidates(0, torch.tensor([1]), torch.tensor([1]), True)],
                    _no_writeback)
    assert none.num_slots == 0 and none.nbytes == 0 and m[0].tolist() == [False]
    v = _cache(3, "lru")  # never given values: no pool
    assert v.pool is None and v.num_slots == 3
    with pytest.raises(ValueError, match="policy"):
        _cache(3, "fifo")
    with pytest.raises(ValueError, match="capacity_bytes"):
        DeviceCache(-1, 3, torch.float32, "cpu")


def test_memoised_st_keys_replay_the_same_epochs_as_fresh_keys():
    """``st`` keys memoised across epochs (static schedule) make the same cache
    decisions as keys computed afresh every epoch, train and eval mixed."""
    from leangnn.graphs.synthetic import power_law_graph
    from leangnn.nn.models import build_model
    from leangnn.offload import OffloadEngine
    from leangnn.plan.vertex import full_batch_vertex_bytes

    data = power_law_graph(300, avg_degree=6, in_channels=8, num_classes=4, seed=1)
    torch.manual_seed(0)
    model = build_model("sage", 8, 16, 4, 3)
    budget = full_batch_vertex_bytes(model, data.num_nodes) // 3
    memo = OffloadEngine(model, data, budget, 4, "st", virtual=True)
    fresh = OffloadEngine(model, data, budget, 4, "st", virtual=True)
    fresh.runner.keys.memo_bytes = 0
    for train in (True, False, True, True):
        a, b = memo.simulate(train).to_dict(), fresh.simulate(train).to_dict()
        assert a == b
    assert memo.runner.keys._memo_used > 0 and fresh.runner.keys._memo_used == 0


def test_auto_policy_resolves_by_device_and_mode():
    """``auto``: ``none`` on a CPU "device" (one memory), ``st`` on CUDA
    (``lru`` for the recompute baseline, which has no next uses); every
    other policy stays as asked; an unknown one is refused."""
    from leangnn.offload.cache import POLICIES, RULES, resolve_policy

    assert "auto" in POLICIES and "auto" not in RULES
    assert resolve_policy("auto", "cpu") == "none"
    assert resolve_policy("auto", torch.device("cpu"), exact=False) == "none"
    assert resolve_policy("auto", "cuda") == "st"
    assert resolve_policy("auto", torch.device("cuda", 1)) == "st"
    assert resolve_policy("auto", "cuda", exact=False) == "lru"
    for rule in RULES:
        assert resolve_policy(rule, "cpu") == rule == resolve_policy(rule, "cuda")
    with pytest.raises(ValueError, match="fifo"):
        resolve_policy("fifo", "cpu")
    # the pool is allocated on first use only: a CUDA cache is built here too
    assert DeviceCache(1 << 16, 8, torch.float32, "cuda", "auto").policy == "st"
    cpu = DeviceCache(1 << 16, 8, torch.float32, "cpu", "auto")
    assert cpu.policy == "none" and cpu.num_slots == 0
