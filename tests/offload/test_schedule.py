"""Schedules: chunk subgraphs, budget fit, visit order, next-use answers."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import k_hop_subgraph

from leangnn.graphs.partition import partition_graph
from leangnn.graphs.sparse import DstCSR
from leangnn.graphs.synthetic import power_law_graph
from leangnn.offload.cache import INF_STEP
from leangnn.offload.schedule import (
    BudgetError,
    ChunkBuilder,
    ExactSchedule,
    RecomputeSchedule,
    overlap_order,
)


@pytest.fixture(scope="module")
def graph():
    d = power_law_graph(200, avg_degree=5, in_channels=4, seed=1)
    csr = DstCSR(d.edge_index, d.num_nodes)
    part = partition_graph(d.edge_index, d.num_nodes, 4, cache=False)
    return d, csr, part


def _fits(max_edges):
    return lambda n_s, n_t, n_e: n_e <= max_edges


def test_chunks_reproduce_the_graph_and_fit(graph):
    d, csr, part = graph
    sched = ExactSchedule(csr, part, _fits(60))
    targets = torch.cat([c.targets for c in sched.chunks])
    assert torch.equal(torch.sort(targets)[0], torch.arange(d.num_nodes))
    edges = []
    for ch in sched.chunks:
        assert ch.edge_index.size(1) <= 60
        assert torch.equal(ch.sources[: ch.num_targets], ch.targets)
        assert ch.sources.unique().numel() == ch.sources.numel()
        src, dst = ch.edge_index.long()
        assert int(dst.max()) < ch.num_targets
        edges.append(torch.stack([ch.sources[src], ch.targets[dst]]))
        # sources are exactly the targets plus their in-neighbours
        want = torch.unique(torch.cat([ch.targets, csr.in_neighbors(ch.targets)]))
        assert torch.equal(torch.sort(ch.sources)[0], want)
    got = torch.cat(edges, 1)
    key = lambda e: torch.sort(e[0] * d.num_nodes + e[1])[0]  # noqa: E731
    assert torch.equal(key(got), key(d.edge_index))
    # chunks never straddle partitions, and follow the visiting order
    parts = [int(part.part[ch.targets].unique().item()) for ch in sched.chunks]
    assert parts == sched.chunk_part
    assert list(dict.fromkeys(parts)) == sched.part_order


def test_budget_error_names_the_budget(graph):
    _, csr, part = graph
    with pytest.raises(BudgetError, match="device_budget"):
        ExactSchedule(csr, part, _fits(0))


def _brute_next(sched, accesses, k, c, rows):
    """Next step reading each row and reads left, by scanning the epoch."""
    steps = []  # (step, set of rows read) for this array, in time order
    for k2, kind in accesses:
        for j, c2 in enumerate(sched.visit(k2)):
            ch = sched.chunks[c2]
            s = ch.sources if kind == "S" else ch.targets
            steps.append((k2 * sched.num_chunks + j, set(s.tolist())))
    now = k * sched.num_chunks + (sched.visit(k).index(c) if c is not None
                                  else sched.num_chunks - 1)
    nxt, rem = [], []
    for r in rows.tolist():
        later = [s for s, rs in steps if s > now and r in rs]
        nxt.append(later[0] if later else INF_STEP)
        rem.append(len(later))
    return torch.tensor(nxt), torch.tensor(rem)


def test_next_use_matches_brute_force(graph):
    _, csr, part = graph
    sched = ExactSchedule(csr, part, _fits(40))
    # a training epoch of 2 layers: H1 is read through S in sweeps 1 and 2,
    # a gradient array is accumulated in sweep 2 and read by owners in 3
    h1 = [(1, "S"), (2, "S")]
    g1 = [(2, "S"), (3, "T")]
    for acc, sweep in ((h1, 1), (h1, 2), (g1, 2)):
        for c in sched.visit(sweep)[::3]:
            rows = sched.chunks[c].sources
            got = sched.next_use(acc, sweep, c, rows)
            want = _brute_next(sched, acc, sweep, c, rows)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # rows produced in sweep 0 are next read in sweep 1
    rows = sched.chunks[0].targets
    got = sched.next_use(h1, 0, None, rows)
    want = _brute_next(sched, h1, 0, None, rows)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert (sched.next_use(h1, 2, None, rows)[0] == INF_STEP).all()


def test_overlap_order_follows_the_chain():
    # sets 0-3-1-2 overlap like a chain; the greedy path must walk it
    sets = [torch.tensor([0, 1, 2]), torch.tensor([4, 5, 6, 7]),
            torch.tensor([7, 8]), torch.tensor([2, 3, 4, 5])]
    assert overlap_order(sets, 9) in ([0, 3, 1, 2], [2, 1, 3, 0])
    assert overlap_order(sets[:2], 9) == [0, 1]


def test_recompute_sets_are_k_hop_neighbourhoods(graph):
    d, csr, part = graph
    sched = RecomputeSchedule(csr, part, 3, _fits(10**9))
    total = 0
    for p, nodes in enumerate(part.nodes()):
        plan = sched.plan(p)
        for li in range(3):
            want, _, _, _ = k_hop_subgraph(nodes, 2 - li, d.edge_index,
                                           num_nodes=d.num_nodes)
            assert torch.equal(plan.sets[li], want)
            total += want.numel()
            for ch, rows_in, rows_out in zip(plan.chunks[li], plan.input_rows[li],
                                             plan.output_rows[li]):
                assert torch.equal(plan.sets[li][rows_out], ch.targets)
                base = ch.sources if li == 0 else plan.sets[li - 1][rows_in]
                assert torch.equal(base, ch.sources)
    assert sched.vertex_layers() == total


def test_chunk_builder_cuts_by_edges(graph):
    _, csr, _ = graph
    b = ChunkBuilder(csr, _fits(10**9))
    chunks = b.split(torch.arange(200), max_edges=200)
    assert len(chunks) >= csr.num_edges // 200
    assert sum(c.num_targets for c in chunks) == 200
