"""The netlist reader against circuitgraph's own parser, and its error handling."""

from __future__ import annotations

import os
import random
import re

import numpy as np
import pytest

from leangnn.circuits import SUITES, NetlistError, catalog, parse_bench, parse_verilog
from leangnn.circuits.netlist import GATE_TYPES, read_netlist

BUNDLED = [c for c in catalog()]
SEQUENTIAL = {"s27", "s13207", "s38417", "s38584"}
_PIN = re.compile(r"\.(CK|D|Q|clk|d|q)$")


def _gates(path: str) -> int:
    with open(path) as f:
        text = f.read()
    if path.endswith(".bench"):
        return len(re.findall(r"=\s*[A-Za-z]+\(", text))
    return len(re.findall(r"^\s*(?:and|nand|or|nor|xor|xnor|not|buf|assign)\b", text,
                          re.M))


def _edges_by_name(net):
    ei = net.edge_index()
    return {(net.names[u], net.names[v]) for u, v in ei.T}


@pytest.mark.parametrize("info", BUNDLED, ids=[c.name for c in BUNDLED])
def test_every_bundled_netlist_parses(info):
    net = read_netlist(info.path)
    assert net.num_nodes > 0 and net.num_edges > 0
    assert net.outputs.size > 0 or net.flops
    assert (net.types >= 0).all() and (net.types < len(GATE_TYPES)).all()
    # CSR is consistent and every fanin points at a real node.
    assert net.fanin_ptr[-1] == net.fanin_idx.size
    assert net.fanin_idx.min() >= 0 and net.fanin_idx.max() < net.num_nodes


def _compare_combinational(info, cg):
    c = cg(info.path)
    ours = read_netlist(info.path)
    assert ours.num_nodes == len(c.graph.nodes)
    assert ours.num_edges == len(c.graph.edges)
    assert set(ours.names) == set(c.graph.nodes)
    assert _edges_by_name(ours) == set(c.graph.edges)
    for i in np.flatnonzero(ours.types == GATE_TYPES.index("input")):
        assert c.type(ours.names[i]) == "input"
    outs = {ours.names[i] for i in ours.outputs}
    assert outs == set(c.outputs())


_COMB = [c for c in BUNDLED if c.name.split("/")[1] not in SEQUENTIAL]
_SMALL = [c for c in _COMB if _gates(c.path) < 20_000]
_LARGE = [c for c in _COMB if _gates(c.path) >= 20_000]


@pytest.mark.parametrize("info", _SMALL, ids=[c.name for c in _SMALL])
def test_matches_circuitgraph_small(info, cg):
    _compare_combinational(info, cg)


@pytest.mark.slow
@pytest.mark.parametrize("info", _LARGE, ids=[c.name for c in _LARGE])
def test_matches_circuitgraph_large(info, cg):
    _compare_combinational(info, cg)


_SEQ = [c for c in BUNDLED if c.name.split("/")[1] in SEQUENTIAL]


@pytest.mark.parametrize("info", _SEQ, ids=[c.name for c in _SEQ])
def test_flipflop_mapping_matches_circuitgraph_blackboxes(info, cg):
    """Q pin -> pseudo primary input, D pin -> pseudo primary output."""
    c = cg(info.path)
    ours = read_netlist(info.path)
    g = c.graph
    pins = {v for v in g.nodes if c.type(v) in ("bb_input", "bb_output")}
    assert len(pins) == 3 * len(ours.flops)
    assert ours.num_nodes == len(g.nodes) - len(pins)
    cg_edges = {(u, v) for u, v in g.edges if u not in pins and v not in pins}
    assert _edges_by_name(ours) == cg_edges
    ppi = GATE_TYPES.index("ppi")
    for inst, d, q in ours.flops:
        (d_net,) = list(c.fanin(f"{inst}.D"))
        assert ours.names[d] == d_net
        q_nets = [v for v in c.fanout(f"{inst}.Q")]
        assert ours.names[q] in q_nets
        assert ours.types[q] == ppi
        assert ours.fanin_ptr[q + 1] == ours.fanin_ptr[q]
    assert {ours.names[i] for i in ours.pseudo_outputs} == {
        next(iter(c.fanin(f"{inst}.D"))) for inst, _, _ in ours.flops}


def test_b19_reads_in_a_few_seconds():
    import time

    info = next(c for c in BUNDLED if c.name == "itc99/b19")
    t = time.perf_counter()
    net = read_netlist(info.path)
    elapsed = time.perf_counter() - t
    # Not a timing assertion on our speed claim: a sanity bound 10x above what
    # a 2-core CI machine takes, so a quadratic regression cannot slip in.
    assert elapsed < 30, elapsed
    assert net.num_nodes > 100_000


def test_suites_cover_every_bundled_file(netlist_dir):
    files = {f for _, members in SUITES.items() for _, f in members}
    assert files == set(os.listdir(netlist_dir)) - {"__pycache__"}


# --------------------------------------------------------------------------- #
# Features of the Verilog subset
def test_escaped_identifiers_multiline_and_constants():
    text = r"""
    // comment with ; and (
    module top(\a[0] , \b.x , y, z, w);
      input \a[0] , \b.x ;
      output y, z, w;
      /* block
         comment */
      nand g1 (y,
               \a[0] , \b.x );
      assign z = 1'b1;
      assign w = ~(\a[0]  & y) | \b.x ;
    endmodule
    """
    net = parse_verilog(text, "t.v")
    names = set(net.names)
    assert {"\\a[0]", "\\b.x", "y", "z", "w", "tie_1"} <= names
    t = {n: GATE_TYPES[k] for n, k in zip(net.names, net.types)}
    assert t["y"] == "nand" and t["z"] == "buf" and t["tie_1"] == "const1"
    assert t["w"] == "or"


def test_bench_with_dff():
    text = "INPUT(a)\nINPUT(b)\nOUTPUT(y)\nq = DFF(y)\ny = NAND(a, q)  # c\n"
    net = parse_bench(text, "t.bench")
    assert len(net.flops) == 1
    _, d, q = net.flops[0]
    assert net.names[d] == "y" and net.names[q] == "q"
    assert GATE_TYPES[net.types[q]] == "ppi"


# --------------------------------------------------------------------------- #
# Errors name the file, the line and the offending text
@pytest.mark.parametrize("body, message, line", [
    ("  nand g1 (y, a, b);\n  frob g2 (z, y);", "unknown gate type 'frob'", 4),
    ("  nand g1 (y, a, q);", "undriven net 'q'", 3),
    ("  nand g1 (y, a, b);\n  not g2 (y, a);", "two drivers", 4),
    ("  nand g1 (y, a b);", "bad net", 3),
    ("  not g1 (y, a, b);", "needs an output and one input", 3),
    ("  assign y = a & ;", "expression", 3),
    ("  always @(posedge a) y <= b;", "behavioral", 3),
])
def test_errors_name_file_line_and_text(body, message, line):
    text = f"module m(a, b, y);\n  input a, b; output y;\n{body}\nendmodule\n"
    with pytest.raises(NetlistError) as e:
        parse_verilog(text, "bad.v")
    assert message in str(e.value)
    assert e.value.file == "bad.v" and e.value.line == line
    assert str(e.value).startswith(f"bad.v:{line}: ")


def test_combinational_loop_is_named():
    from leangnn.circuits import levelize

    text = ("module m(a, y);\n input a; output y;\n nand g1 (y, a, z);\n"
            " not g2 (z, y);\nendmodule\n")
    net = parse_verilog(text, "loop.v")
    with pytest.raises(NetlistError, match="combinational loop through nets"):
        levelize(net)


def test_file_errors(tmp_path):
    with pytest.raises(NetlistError, match="no such netlist file"):
        read_netlist(tmp_path / "missing.v")
    p = tmp_path / "x.blif"
    p.write_text("whatever")
    with pytest.raises(NetlistError, match="unsupported netlist extension"):
        read_netlist(p)
    p = tmp_path / "x.bench"
    p.write_text("INPUT(a)\ny = FROB(a)\n")
    with pytest.raises(NetlistError, match=r"x.bench:2: unknown gate type 'FROB'"):
        read_netlist(p)


# --------------------------------------------------------------------------- #
def _mutate(text: str, rng: random.Random) -> str:
    ops = ["delete", "duplicate", "swap", "insert", "truncate", "rename", "semicolon"]
    op = rng.choice(ops)
    lines = text.split("\n")
    if op == "delete":
        i = rng.randrange(len(text))
        return text[:i] + text[i + rng.randint(1, 5):]
    if op == "duplicate":
        i = rng.randrange(len(lines))
        return "\n".join(lines[:i] + [lines[i]] + lines[i:])
    if op == "swap":
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    if op == "insert":
        i = rng.randrange(len(text))
        return text[:i] + rng.choice(list("();,=\\~&|^'.[]#`\"x0")) + text[i:]
    if op == "truncate":
        return text[: rng.randrange(len(text))]
    if op == "rename":
        return re.sub(r"\b(nand|nor|not|and|or|NAND|NOT|AND)\b",
                      lambda m: rng.choice([m.group(0), "frob", "nand", "dff"]), text,
                      count=rng.randint(1, 3))
    return text.replace(";", "", 1) if rng.random() < 0.5 else text.replace(",", "", 1)


@pytest.mark.parametrize("base", ["c17.v", "c432.v", "s27.v", "adder.v", "b17_C.bench"])
def test_fuzz_mutated_netlists_parse_or_raise_netlist_error(base, netlist_dir,
                                                            tmp_path):
    from leangnn.circuits import levelize

    with open(os.path.join(netlist_dir, base)) as f:
        text = f.read()
    rng = random.Random(base)
    outcomes = {"parsed": 0, "error": 0}
    for k in range(60):  # 5 bases x 60 = 300 mutated netlists
        mutated = text
        for _ in range(rng.randint(1, 3)):
            mutated = _mutate(mutated, rng)
        path = tmp_path / f"m{k}{os.path.splitext(base)[1]}"
        path.write_text(mutated)
        try:
            levelize(read_netlist(path))
            outcomes["parsed"] += 1
        except NetlistError as e:
            assert str(path) in str(e)
            outcomes["error"] += 1
    assert outcomes["error"] > 0 and sum(outcomes.values()) == 60
