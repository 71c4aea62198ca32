"""Simulation and timing against independent references built on circuitgraph.

The references parse with circuitgraph, order with networkx and evaluate with
Python integers used as bit vectors (exact enumeration) or with
networkx longest paths (timing); nothing is shared with leangnn's code path
except the delay table.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from leangnn.circuits import (
    DelayModel,
    catalog,
    levelize,
    read_netlist,
    signal_probability,
    static_timing,
)

INFO = {c.name: c for c in catalog()}
SMALL_INPUTS = ["iscas85/c17", "iscas85g/c17g", "iscas89/s27", "epfl/ctrl", "epfl/dec",
                "epfl/int2float", "epfl/cavlc", "misc/c17_assign", "misc/mux_2",
                "misc/mux_4", "misc/switch"]


def _sources(c):
    """Primary inputs and flip-flop Q pins of circuitgraph's graph."""
    return sorted(v for v in c.graph.nodes if c.type(v) in ("input", "bb_output"))


def _eval(c, values: dict, mask: int) -> dict:
    """Evaluate every node with Python ints as bit vectors over ``mask`` bits."""
    for v in nx.topological_sort(c.graph):
        if v in values:
            continue
        t = c.type(v)
        ins = [values[u] for u in c.fanin(v)]
        if t in ("buf", "bb_input"):
            r = ins[0]
        elif t == "not":
            r = ~ins[0] & mask
        elif t in ("and", "nand"):
            r = mask
            for x in ins:
                r &= x
        elif t in ("or", "nor"):
            r = 0
            for x in ins:
                r |= x
        elif t in ("xor", "xnor"):
            r = 0
            for x in ins:
                r ^= x
        elif t == "0":
            r = 0
        elif t == "1":
            r = mask
        else:  # pragma: no cover - a type the reference does not know
            raise AssertionError(f"reference cannot evaluate {t}")
        if t in ("nand", "nor", "xnor"):
            r = ~r & mask
        values[v] = r
    return values


def _exhaustive_reference(c) -> dict:
    srcs = _sources(c)
    n = len(srcs)
    total = 1 << n
    mask = (1 << total) - 1
    values = {}
    for i, s in enumerate(srcs):
        # Bit j of source i's vector is bit i of pattern index j.
        block = ((1 << (1 << i)) - 1) << (1 << i)
        period = 1 << (i + 1)
        word = 0
        for start in range(0, total, period):
            word |= block << start
        values[s] = word & mask
    values = _eval(c, values, mask)
    return {v: bin(x).count("1") / total for v, x in values.items()}


@pytest.mark.parametrize("name", SMALL_INPUTS)
def test_signal_probability_exhaustive_is_exact(name, cg):
    info = INFO[name]
    net = read_netlist(info.path)
    ref = _exhaustive_reference(cg(info.path))
    ours = signal_probability(net)  # <= 16 sources: exhaustive by default
    for i, nm in enumerate(net.names):
        assert ours[i] == ref[nm], nm


@pytest.mark.parametrize("name", ["epfl/int2float", "epfl/cavlc", "epfl/ctrl"])
def test_signal_probability_sampled_within_001(name):
    net = read_netlist(INFO[name].path)
    exact = signal_probability(net, exhaustive=True)
    sampled = signal_probability(net, exhaustive=False, num_patterns=1 << 16, seed=3)
    assert np.abs(exact - sampled).max() <= 0.01
    sampled14 = signal_probability(net, exhaustive=False, num_patterns=1 << 14, seed=3)
    assert np.abs(exact - sampled14).mean() <= 0.01


@pytest.mark.parametrize("name", ["iscas85/c432", "iscas85/c499", "iscas85/c1908",
                                  "iscas89/s13207"])
def test_sampled_simulation_matches_reference_on_same_patterns(name, cg):
    """Large circuits: feed the reference the exact random words we simulate."""
    info = INFO[name]
    net = read_netlist(info.path)
    c = cg(info.path)
    words = 4
    rng = np.random.default_rng(11)
    sources = np.flatnonzero(np.isin(net.types, (0, 1)))
    pat = rng.integers(0, np.iinfo(np.uint64).max, size=(sources.size, words),
                       dtype=np.uint64, endpoint=True)
    ours = signal_probability(net, patterns=pat, chunk_words=3)  # 2 chunks
    mask = (1 << (64 * words)) - 1
    values = {}
    pins = {}
    for v in c.graph.nodes:  # circuitgraph's Q pin drives our ppi net
        if c.type(v) == "bb_output":
            for q in c.fanout(v):
                pins[q] = v
    for k, s in enumerate(sources):
        big = int.from_bytes(pat[k].tobytes(), "little")
        name_s = net.names[s]
        values[pins.get(name_s, name_s)] = big
    ref = _eval(c, values, mask)
    for i, nm in enumerate(net.names):
        assert ours[i] == bin(ref[nm]).count("1") / (64 * words), nm


def _nx_graph(c):
    g = nx.DiGraph()
    g.add_nodes_from(c.graph.nodes)
    g.add_edges_from(c.graph.edges)
    return g


def _ref_delays(c, model: DelayModel) -> dict:
    return {v: (model.intrinsic.get(c.type(v), 0.0) + model.fanout_coeff *
                len(c.fanout(v))) if c.type(v) in model.intrinsic else 0.0
            for v in c.graph.nodes}


@pytest.mark.parametrize("name", ["iscas85/c432", "iscas85/c880", "iscas85/c3540",
                                  "iscas85/c7552", "itc99-bench/b17_C", "epfl/router",
                                  "misc/c17_assign"])
def test_arrival_and_required_equal_networkx_longest_paths(name, cg):
    info = INFO[name]
    c = cg(info.path)
    model = DelayModel()
    delay = _ref_delays(c, model)
    g = _nx_graph(c)
    src = "__source__"
    g.add_edges_from((src, v) for v in list(g.nodes) if g.in_degree(v) == 0)
    dist = nx.single_source_bellman_ford_path_length(
        g, src, weight=lambda u, v, d: -delay[v])
    ref_arrival = {v: -d for v, d in dist.items() if v != src}

    net = read_netlist(info.path)
    t = static_timing(net, model)
    for i, nm in enumerate(net.names):
        assert t.arrival[i] == pytest.approx(ref_arrival[nm], rel=1e-12, abs=1e-9)

    # Required: period minus the longest path (in downstream delays) to a sink.
    period = max(ref_arrival[o] for o in c.outputs())
    assert t.period == pytest.approx(period, rel=1e-12)
    g.remove_node(src)
    rg = g.reverse()
    sink = "__sink__"
    rg.add_edges_from((sink, v) for v in list(g.nodes) if g.out_degree(v) == 0
                      or c.is_output(v))
    down = nx.single_source_bellman_ford_path_length(
        rg, sink, weight=lambda u, v, d: 0.0 if u == sink else -delay[u])
    for i, nm in enumerate(net.names):
        ref_req = period + down[nm]
        assert t.required[i] == pytest.approx(ref_req, rel=1e-12, abs=1e-9)
        assert t.slack[i] == pytest.approx(ref_req - ref_arrival[nm], abs=1e-9)


@pytest.mark.parametrize("name", ["iscas85/c1355", "epfl/priority"])
def test_levels_are_longest_unit_paths(name, cg):
    c = cg(INFO[name].path)
    ref = {}
    for v in nx.topological_sort(c.graph):
        ref[v] = max((ref[u] + 1 for u in c.fanin(v)), default=0)
    net = read_netlist(INFO[name].path)
    lv = levelize(net)
    assert {nm: int(lv.level[i]) for i, nm in enumerate(net.names)} == ref
    assert lv.depth == max(ref.values())
