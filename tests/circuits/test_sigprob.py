"""Cut signal probabilities against exhaustive enumeration, COP and the label."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from leangnn.circuits import GATE_TYPES, Netlist, read_netlist, signal_probability
from leangnn.circuits.cop import cop_signal_probability
from leangnn.circuits.dataset import resolve
from leangnn.circuits.netlist import TYPE_ID
from leangnn.circuits.sigprob import (
    cut_signal_probability,
    cut_signal_probability_arrays,
)

_GATES = ["buf", "not", "and", "nand", "or", "nor", "xor", "xnor"]


def _netlist(types: list[str], fanins: list[list[int]]) -> Netlist:
    ptr = np.zeros(len(types) + 1, dtype=np.int64)
    np.cumsum([len(f) for f in fanins], out=ptr[1:])
    idx = np.asarray([u for f in fanins for u in f], dtype=np.int64)
    return Netlist("t", [f"n{i}" for i in range(len(types))],
                   np.asarray([TYPE_ID[t] for t in types], dtype=np.int8), ptr, idx,
                   np.asarray([len(types) - 1], dtype=np.int64))


def _random_dag(rng: np.random.Generator, num_inputs: int, num_gates: int) -> Netlist:
    """Every gate reads random earlier nets: heavy reconvergence, repeated pins,
    constants and every gate type."""
    types = ["input"] * num_inputs + ["const0", "const1"]
    fanins: list[list[int]] = [[] for _ in types]
    for _ in range(num_gates):
        gate = str(rng.choice(_GATES))
        k = 1 if gate in ("buf", "not") else int(rng.integers(2, 5))
        fanins.append([int(u) for u in rng.integers(0, len(types), size=k)])
        types.append(gate)
    return _netlist(types, fanins)


def _random_tree(rng: np.random.Generator, num_leaves: int) -> Netlist:
    types, fanins, open_nets = [], [], []
    for _ in range(num_leaves):
        types.append(str(rng.choice(["input", "input", "input", "const1"])))
        fanins.append([])
        open_nets.append(len(types) - 1)
    while len(open_nets) > 1:
        gate = str(rng.choice(_GATES[2:]))
        k = min(int(rng.integers(2, 4)), len(open_nets))
        pick = set(rng.choice(len(open_nets), size=k, replace=False).tolist())
        types.append(gate)
        fanins.append([open_nets[i] for i in sorted(pick)])
        open_nets = [u for i, u in enumerate(open_nets) if i not in pick]
        if rng.random() < 0.3:  # an inverter chain link
            types.append("not")
            fanins.append([len(types) - 2])
        open_nets.append(len(types) - 1)
    return _netlist(types, fanins)


@pytest.mark.parametrize("seed", range(8))
def test_exact_when_the_inputs_fit_in_a_cut(seed):
    rng = np.random.default_rng(seed)
    net = _random_dag(rng, num_inputs=int(rng.integers(2, 9)), num_gates=60)
    exact = signal_probability(net, exhaustive=True)
    np.testing.assert_allclose(cut_signal_probability(net, k=8), exact,
                               rtol=0, atol=1e-12)
    # and COP is not: the circuit reconverges everywhere
    assert np.abs(cop_signal_probability(net) - exact).max() > 1e-3


def test_c17_is_exact():
    net = read_netlist(resolve("iscas85/c17")[0].path)
    np.testing.assert_allclose(cut_signal_probability(net, k=6),
                               signal_probability(net, exhaustive=True),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [2, 4, 8])
def test_equals_cop_on_trees(seed, k):
    net = _random_tree(np.random.default_rng(seed), num_leaves=4 + 2 * seed)
    assert np.bincount(net.fanin_idx, minlength=net.num_nodes).max() <= 1
    np.testing.assert_allclose(cut_signal_probability(net, k=k),
                               cop_signal_probability(net), rtol=0, atol=1e-12)


def _cone_reference(net: Netlist, max_sources: int) -> dict[int, float]:
    """Exact probability of every node whose fanin cone holds at most
    ``max_sources`` sources, by enumerating the cone with Python integers as
    bit vectors (networkx for the cone and its order)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(net.num_nodes))
    for v in range(net.num_nodes):
        for u in net.fanin_idx[net.fanin_ptr[v]:net.fanin_ptr[v + 1]]:
            g.add_edge(int(u), v)
    out = {}
    for v in range(net.num_nodes):
        cone = nx.ancestors(g, v) | {v}
        srcs = sorted(u for u in cone if GATE_TYPES[net.types[u]] in ("input", "ppi"))
        if len(srcs) > max_sources or GATE_TYPES[net.types[v]] in ("input", "ppi"):
            continue
        rows = 1 << len(srcs)
        full = (1 << rows) - 1
        val = {}
        for i, s in enumerate(srcs):
            val[s] = sum(1 << r for r in range(rows) if r >> i & 1)
        for w in nx.topological_sort(g.subgraph(cone)):
            if w in val:
                continue
            t = GATE_TYPES[net.types[w]]
            ins = [val[int(u)] for u in net.fanin_idx[net.fanin_ptr[w]:
                                                      net.fanin_ptr[w + 1]]]
            if t == "const1":
                x = full
            elif t == "const0" or not ins:
                x = 0
            elif t in ("buf", "not", "and", "nand"):
                x = full
                for y in ins:
                    x &= y
            elif t in ("or", "nor"):
                x = 0
                for y in ins:
                    x |= y
            else:
                x = 0
                for y in ins:
                    x ^= y
            val[w] = full ^ x if t in ("not", "nand", "nor", "xnor") else x
        out[v] = bin(val[v]).count("1") / rows
    return out


@pytest.mark.parametrize("name", ["iscas85/c880", "iscas85/c6288", "epfl/router"])
def test_exact_on_every_cone_that_fits(name):
    # windows of real circuits: every node whose cone has <= k sources
    net = read_netlist(resolve(name)[0].path)
    ref = _cone_reference(net, max_sources=8)
    assert len(ref) >= 20
    est = cut_signal_probability(net, k=8)
    nodes = np.fromiter(ref, dtype=np.int64)
    np.testing.assert_allclose(est[nodes], np.fromiter(ref.values(), dtype=float),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["iscas85/c432", "iscas85/c7552", "epfl/max"])
def test_closer_to_the_label_than_cop(name):
    # reported in the benchmark; a loose check here that it is not a regression
    from leangnn.circuits import load_circuit

    data = load_circuit(name, "signal_prob")
    net = read_netlist(resolve(name)[0].path)
    y = data.y.double().numpy()
    cut = np.abs(cut_signal_probability(net, k=8) - y).mean()
    cop = np.abs(cop_signal_probability(net) - y).mean()
    assert cut < cop


def test_arrays_entry_matches_and_levels_are_optional():
    net = read_netlist(resolve("iscas85/c432")[0].path)
    a = cut_signal_probability(net)
    b = cut_signal_probability_arrays(net.types, net.fanin_ptr, net.fanin_idx, k=12)
    np.testing.assert_array_equal(a, b)  # the default k of a small circuit: 12
    c = cut_signal_probability(net, cuts=3)  # more cuts per node: still valid
    assert ((c >= 0) & (c <= 1)).all()


def test_input_probability_and_bad_arguments():
    net = _netlist(["input", "input", "and", "not", "or"],
                   [[], [], [0, 1], [2], [2, 3]])
    p = cut_signal_probability(net, input_probability=0.3)
    assert p[2] == pytest.approx(0.09)
    assert p[4] == pytest.approx(1.0)  # x | not x, exact through the cut
    with pytest.raises(ValueError, match="k must be"):
        cut_signal_probability(net, k=0)
    with pytest.raises(ValueError, match="cuts must be"):
        cut_signal_probability(net, cuts=0)
    with pytest.raises(ValueError, match="input_probability"):
        cut_signal_probability(net, input_probability=2.0)


def test_wide_gates_fall_back_to_cop():
    # a gate with more distinct fanins than k leaves: COP on that gate
    net = _netlist(["input"] * 5 + ["and"], [[]] * 5 + [[0, 1, 2, 3, 4]])
    np.testing.assert_allclose(cut_signal_probability(net, k=3),
                               cop_signal_probability(net), rtol=0, atol=1e-12)
