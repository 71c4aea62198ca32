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


@pytest.fixture(scope="module")
def hub_graph():
    d = power_law_graph(120, avg_degree=4, in_channels=4, seed=2)
    every = torch.arange(120)
    ei = torch.cat([d.edge_index, torch.stack([every, torch.zeros_like(every)])], 1)
    ei = torch.unique(ei, dim=1)
    csr = DstCSR(ei, 120)
    part = partition_graph(ei, 120, 3, cache=False)
    return ei, csr, part


def test_hub_pieces_cover_its_edges_once_and_fit(hub_graph):
    ei, csr, part = hub_graph
    with pytest.raises(BudgetError, match="node 0 with 120 in-edges") as e:
        ExactSchedule(csr, part, _fits(25))  # no layers given: no split
    assert e.value.in_degree == 120
    sched = ExactSchedule(csr, part, _fits(25), num_layers=2)
    pieces = [ch for ch in sched.chunks if ch.piece is not None]
    assert {ch.piece.node for ch in pieces} == {0}
    assert [ch.piece.index for ch in pieces] == list(range(len(pieces)))
    assert len(pieces) == pieces[0].piece.count == 5  # ceil(120 / 25)
    edges = []
    for ch in sched.chunks:
        assert ch.num_edges <= 25
        src, dst = ch.edge_index.long()
        if ch.piece is None:
            edges.append(torch.stack([ch.sources[src], ch.targets[dst]]))
            continue
        # the hub is source 0; only the last piece owns it as a target
        assert int(ch.sources[0]) == 0 and (dst == 0).all()
        assert ch.targets.tolist() == ([0] if ch.piece.owner else [])
        edges.append(torch.stack([ch.sources[src], torch.zeros_like(src)]))
    got = torch.cat(edges, 1)
    key = lambda e: torch.sort(e[0] * 120 + e[1])[0]  # noqa: E731
    assert torch.equal(key(got), key(ei))
    owner = [j for j, ch in enumerate(sched.chunks) if ch.piece is not None][-1]
    assert int(sched.owner_pos[0]) == owner


def test_hub_pieces_run_owner_last_forward_and_first_backward(hub_graph):
    _, csr, part = hub_graph
    sched = ExactSchedule(csr, part, _fits(25), num_layers=3)
    ids = [j for j, ch in enumerate(sched.chunks) if ch.piece is not None]
    owner = ids[-1]
    for k in range(6):
        order = sched.visit(k)
        assert sorted(order) == list(range(sched.num_chunks))
        at = [order.index(j) for j in ids]
        assert max(at) - min(at) == len(ids) - 1  # a hub's pieces run together
        if k < 3:
            assert order.index(owner) == max(at)
        else:
            assert order.index(owner) == min(at)
        steps = sched.step(k, torch.tensor(order))
        assert torch.equal(steps, k * sched.num_chunks + torch.arange(len(order)))


def test_next_use_with_pieces_is_in_the_future_and_exact_outside_hubs(hub_graph):
    _, csr, part = hub_graph
    sched = ExactSchedule(csr, part, _fits(25), num_layers=2)
    h1 = [(1, "S"), (2, "S")]
    for sweep in (1, 2):
        order = sched.visit(sweep)
        for c in order:
            rows = sched.chunks[c].sources
            got, _ = sched.next_use(h1, sweep, c, rows)
            want, _ = _brute_next(sched, h1, sweep, c, rows)
            now = sweep * sched.num_chunks + order.index(c)
            assert (got > now).all()
            if sched.chunks[c].piece is None:
                keep = rows != 0  # the hub row is read by every piece
                assert torch.equal(got[keep], want[keep])
