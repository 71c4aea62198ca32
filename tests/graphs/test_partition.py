"""Partitioning: METIS, the BFS fallback, caching, halos against PyG k_hop_subgraph."""

from __future__ import annotations

import sys

import pytest
import torch
from torch_geometric.utils import k_hop_subgraph

import leangnn.graphs.partition as P
from leangnn.graphs.partition import halo_sets, partition_graph
from leangnn.graphs.sparse import DstCSR
from leangnn.graphs.synthetic import power_law_graph


@pytest.fixture(scope="module")
def graph():
    return power_law_graph(500, avg_degree=6, in_channels=2, seed=3)


def _cut(edge_index, part):
    return int((part[edge_index[0]] != part[edge_index[1]]).sum())


@pytest.mark.parametrize("method", ["metis", "bfs"])
def test_partition_is_balanced_and_beats_random(graph, method, tmp_path):
    p = partition_graph(graph.edge_index, 500, 5, method, cache_dir=tmp_path)
    assert p.method == method and p.num_parts == 5
    sizes = p.sizes()
    assert int(sizes.sum()) == 500 and int(sizes.min()) > 0
    assert int(sizes.max()) <= 1.2 * 500 / 5
    rand = torch.randint(5, (500,), generator=torch.Generator().manual_seed(0))
    assert _cut(graph.edge_index, p.part) < _cut(graph.edge_index, rand)
    nodes = p.nodes()
    assert torch.equal(torch.sort(torch.cat(nodes))[0], torch.arange(500))


def test_single_part_and_bad_arguments(graph):
    p = partition_graph(graph.edge_index, 500, 1, cache=False)
    assert (p.part == 0).all()
    with pytest.raises(ValueError, match="num_parts"):
        partition_graph(graph.edge_index, 500, 0)
    with pytest.raises(ValueError, match="num_parts"):
        partition_graph(graph.edge_index, 500, 501)
    with pytest.raises(ValueError, match="method"):
        partition_graph(graph.edge_index, 500, 2, "spectral")
    with pytest.raises(ValueError, match="edge_index"):
        partition_graph(graph.edge_index[0], 500, 2)
    with pytest.raises(ValueError, match="num_nodes"):
        partition_graph(graph.edge_index, 10, 2)


def test_fallback_when_pymetis_is_missing(graph, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # import now fails
    with pytest.warns(UserWarning, match="pymetis"):
        p = partition_graph(graph.edge_index, 500, 4, cache_dir=tmp_path)
    assert p.method == "bfs" and int(p.sizes().min()) == 125
    with pytest.raises(ImportError):
        partition_graph(graph.edge_index, 500, 4, "metis", cache=False)


def test_cached_in_memory_and_on_disk(graph, monkeypatch, tmp_path):
    first = partition_graph(graph.edge_index, 500, 3, "metis", seed=7,
                            cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*-3-metis-7.pt"))) == 1

    def boom(*a, **k):
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(P, "metis_partition", boom)
    again = partition_graph(graph.edge_index, 500, 3, "metis", seed=7,
                            cache_dir=tmp_path)
    assert torch.equal(first.part, again.part)
    P._MEMORY.clear()  # now only the disk copy is left
    disk = partition_graph(graph.edge_index, 500, 3, "metis", seed=7,
                           cache_dir=tmp_path)
    assert torch.equal(first.part, disk.part)
    other = graph.edge_index.flip(0)[:, :-2]  # a different graph: new key
    with pytest.raises(AssertionError, match="recomputed"):
        partition_graph(other, 500, 3, "metis", seed=7, cache_dir=tmp_path)


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_halos_match_k_hop_subgraph(graph, hops):
    # a directed graph, so in- and out-neighbourhoods differ
    ei = graph.edge_index[:, graph.edge_index[0] < graph.edge_index[1]]
    part = partition_graph(ei, 500, 4, "bfs", cache=False)
    csr = DstCSR(ei, 500)
    for nodes, halo in zip(part.nodes(), halo_sets(csr, part, hops)):
        subset, _, _, _ = k_hop_subgraph(nodes, hops, ei, num_nodes=500)
        want = subset[~torch.isin(subset, nodes)]
        assert torch.equal(halo, want)



# ------------------------------------------------------------ in-process reuse
def test_graph_stamp_tells_the_same_unchanged_graph_from_any_other(graph):
    g = graph.clone()
    stamp = P.GraphStamp(g)
    assert stamp.matches(g) and stamp.alive
    assert not stamp.matches(graph)  # equal content, other tensors
    h = g.clone()
    h.edge_index = g.edge_index  # x replaced: another graph
    assert not stamp.matches(h)
    g.x[0, 0] += 1  # changed in place: the version counter moved
    assert not stamp.matches(g)
    g2 = graph.clone()
    s2 = P.GraphStamp(g2)
    g2.name = "other"  # a non-tensor attribute too
    assert not s2.matches(g2)
    g3 = graph.clone()
    s3 = P.GraphStamp(g3)
    g3.edge_index = g3.edge_index.clone()  # replaced by an equal tensor
    assert not s3.matches(g3)
    del g3
    assert not s3.alive  # a stamp keeps nothing alive
    with torch.inference_mode():  # no version counter: never the same
        g4 = graph.clone()
    assert not P.GraphStamp(g4).matches(g4)
    with P.reuse_hashes():
        assert P.graph_hash(g4.edge_index, 500) == P.graph_hash(graph.edge_index,
                                                                500)


def test_graph_hash_is_computed_once_per_block_and_never_stale(graph, monkeypatch):
    calls = []
    real = P.hashlib.blake2b

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(P.hashlib, "blake2b", counting)
    ei = graph.edge_index.clone()
    ref = P.graph_hash(ei, 500)
    assert P.graph_hash(ei, 500) == ref and len(calls) == 2  # no block: hashed
    with P.reuse_hashes():
        assert P.graph_hash(ei, 500) == ref
        with P.reuse_hashes():  # nested: the same memo
            assert P.graph_hash(ei, 500) == ref
        assert len(calls) == 3
        assert P.graph_hash(ei, 501) != ref and len(calls) == 4  # other N
        ei[0, 0] = ei[1, 0]  # changed in place: hashed again, a new hash
        changed = P.graph_hash(ei, 500)
        assert changed != ref and len(calls) == 5
        monkeypatch.setenv("LEANGNN_PLAN_REUSE", "0")  # the off switch
        assert P.graph_hash(ei, 500) == changed and len(calls) == 6
    assert P._HASHES is None  # dropped with the block
