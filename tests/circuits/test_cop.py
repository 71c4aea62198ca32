"""COP signal probabilities against exhaustive simulation and a per-node reference."""

from __future__ import annotations

import numpy as np
import pytest

from leangnn.circuits import GATE_TYPES, Netlist, read_netlist, signal_probability
from leangnn.circuits.cop import cop_parameters, cop_signal_probability
from leangnn.circuits.dataset import resolve
from leangnn.circuits.netlist import TYPE_ID

_GATES = ["buf", "not", "and", "nand", "or", "nor", "xor", "xnor"]


def _netlist(types: list[str], fanins: list[list[int]], outputs: list[int]) -> Netlist:
    ptr = np.zeros(len(types) + 1, dtype=np.int64)
    np.cumsum([len(f) for f in fanins], out=ptr[1:])
    idx = np.asarray([u for f in fanins for u in f], dtype=np.int64)
    return Netlist("t", [f"n{i}" for i in range(len(types))],
                   np.asarray([TYPE_ID[t] for t in types], dtype=np.int8), ptr, idx,
                   np.asarray(outputs, dtype=np.int64))


def _random_tree(rng: np.random.Generator, num_leaves: int) -> Netlist:
    """A fanout-free circuit: every net but the root drives exactly one gate."""
    types, fanins = [], []
    open_nets = []
    for _ in range(num_leaves):
        kind = rng.choice(["input", "input", "input", "const0", "const1"])
        types.append(str(kind))
        fanins.append([])
        open_nets.append(len(types) - 1)
    while len(open_nets) > 1 or types[open_nets[0]] in ("input", "const0", "const1"):
        gate = str(rng.choice(_GATES))
        k = 1 if gate in ("buf", "not") else int(rng.integers(2, 4))
        k = min(k, len(open_nets))
        if k == 1 and gate not in ("buf", "not"):
            gate = str(rng.choice(["buf", "not"]))
        pick = rng.choice(len(open_nets), size=k, replace=False)
        ins = [open_nets[i] for i in pick]
        open_nets = [n for i, n in enumerate(open_nets) if i not in set(pick)]
        types.append(gate)
        fanins.append(ins)
        open_nets.append(len(types) - 1)
    return _netlist(types, fanins, [len(types) - 1])


@pytest.mark.parametrize("seed", range(12))
def test_cop_is_exact_on_trees(seed):
    net = _random_tree(np.random.default_rng(seed), num_leaves=3 + seed)
    fanout = np.bincount(net.fanin_idx, minlength=net.num_nodes)
    assert fanout.max() <= 1  # no reconvergence by construction
    exact = signal_probability(net, exhaustive=True)
    np.testing.assert_allclose(cop_signal_probability(net), exact, rtol=0, atol=1e-12)


def test_cop_breaks_under_reconvergence():
    # y = a AND (NOT a) is always 0; COP treats the fanins as independent: 1/4
    net = _netlist(["input", "not", "and"], [[], [0], [0, 1]], [2])
    assert signal_probability(net, exhaustive=True)[2] == 0.0
    assert cop_signal_probability(net)[2] == pytest.approx(0.25)


def _reference(net: Netlist) -> np.ndarray:
    """Per-node COP in networkx topological order (slow and obviously right)."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(range(net.num_nodes))
    for v in range(net.num_nodes):
        for u in net.fanin_idx[net.fanin_ptr[v]:net.fanin_ptr[v + 1]]:
            g.add_edge(int(u), v)
    p = np.zeros(net.num_nodes)
    for v in nx.topological_sort(g):
        t = GATE_TYPES[net.types[v]]
        ins = [p[u] for u in net.fanin_idx[net.fanin_ptr[v]:net.fanin_ptr[v + 1]]]
        if t in ("input", "ppi"):
            p[v] = 0.5
        elif t == "const1":
            p[v] = 1.0
        elif t == "const0" or not ins:
            p[v] = 0.0
        elif t in ("buf", "and"):
            p[v] = np.prod(ins)
        elif t in ("not", "nand"):
            p[v] = 1 - np.prod(ins)
        elif t == "or":
            p[v] = 1 - np.prod([1 - q for q in ins])
        elif t == "nor":
            p[v] = np.prod([1 - q for q in ins])
        else:
            s = np.prod([1 - 2 * q for q in ins])
            p[v] = (1 - s) / 2 if t == "xor" else (1 + s) / 2
    return p


@pytest.mark.parametrize("name", ["iscas85/c432", "iscas85/c880", "iscas89/s27"])
def test_cop_matches_per_node_reference(name):
    net = read_netlist(resolve(name)[0].path)
    np.testing.assert_allclose(cop_signal_probability(net), _reference(net),
                               rtol=0, atol=1e-12)


def test_cop_parameters_reproduce_each_gate():
    a, b, c, e = cop_parameters()
    rng = np.random.default_rng(0)
    ps = rng.random(3)
    for gate in _GATES:
        t = TYPE_ID[gate]
        ins = ps[:1] if gate in ("buf", "not") else ps
        types = ["input"] * len(ins) + [gate]
        net = _netlist(types, [[]] * len(ins) + [list(range(len(ins)))], [len(ins)])
        # COP of the gate with these input probabilities, through the parameters
        want = cop_signal_probability(net, input_probability=0.5)[-1]
        got = a[t] + b[t] * np.prod(c[t] + e[t] * np.full(len(ins), 0.5))
        assert got == pytest.approx(want)
        # and with unequal inputs, against the gate's formula in _reference
        net_p = _reference_with_inputs(gate, ins)
        assert a[t] + b[t] * np.prod(c[t] + e[t] * ins) == pytest.approx(net_p)
    for src, value in (("input", 0.5), ("ppi", 0.5), ("const0", 0.0), ("const1", 1.0)):
        assert a[TYPE_ID[src]] + b[TYPE_ID[src]] == value


def _reference_with_inputs(gate: str, ins: np.ndarray) -> float:
    if gate in ("buf", "and"):
        return float(np.prod(ins))
    if gate in ("not", "nand"):
        return float(1 - np.prod(ins))
    if gate == "or":
        return float(1 - np.prod(1 - ins))
    if gate == "nor":
        return float(np.prod(1 - ins))
    s = float(np.prod(1 - 2 * ins))
    return (1 - s) / 2 if gate == "xor" else (1 + s) / 2


def test_input_probability_is_checked():
    net = _netlist(["input"], [[]], [0])
    with pytest.raises(ValueError, match="input_probability"):
        cop_signal_probability(net, input_probability=1.5)
