"""The netlist reader against circuitgraph's own parser, and its error handling."""

from __future__ import annotations

import os
import random
import re

import numpy as np
import pytest

from leangnn.circuits import (
    SUITES,
    NetlistError,
    catalog,
    levelize,
    parse_bench,
    parse_verilog,
)
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


@pytest.mark.parametrize("text, line", [
    ("module m #(parameter W = 2) (a, y);\n input a; output y;\nendmodule\n", 1),
    ("// top\n\nmodule 3bad(a);\n input a;\nendmodule\n", 3),
])
def test_unreadable_module_header_names_its_line(text, line):
    """was "no 'module' found" at line 1, though the file has one"""
    with pytest.raises(NetlistError, match=rf"^h\.v:{line}: cannot parse the "
                       r"module header \(expected 'module NAME \(ports\);' or "
                       r"'module NAME;'\): 'module "):
        parse_verilog(text, "h.v")


def test_combinational_loop_is_named():
    text = ("module m(a, y);\n input a; output y;\n nand g1 (y, a, z);\n"
            " not g2 (z, y);\nendmodule\n")
    net = parse_verilog(text, "loop.v")
    with pytest.raises(NetlistError, match="combinational loop through nets"):
        levelize(net)


def test_file_errors(tmp_path):
    with pytest.raises(NetlistError, match="no such netlist file"):
        read_netlist(tmp_path / "missing.v")
    p = tmp_path / "x.edif"
    p.write_text("whatever")
    with pytest.raises(NetlistError, match="unsupported netlist extension"):
        read_netlist(p)
    p = tmp_path / "x.bench"
    p.write_text("INPUT(a)\ny = FROB(a)\n")
    with pytest.raises(NetlistError, match=r"x.bench:2: unknown gate type 'FROB'"):
        read_netlist(p)


# --------------------------------------------------------------------------- #
# Regressions from the hostile-input audit (issue 8). The broad fuzz lives in
# test_fuzz.py; these pin each case the audit named.
def _truth_table(net, node: str) -> list[int]:
    """``node``'s value for every source assignment, one simulation each."""
    from leangnn.circuits import signal_probability

    sources = [net.names[i] for i in np.flatnonzero(net.types == GATE_TYPES.index(
        "input"))]
    col = net.names.index(node)
    out = []
    for bits in range(1 << len(sources)):
        pats = np.array([[np.uint64(0xFFFF_FFFF_FFFF_FFFF) if bits >> k & 1 else 0]
                         for k in range(len(sources))], dtype=np.uint64)
        out.append(int(signal_probability(net, patterns=pats)[col]))
    return out


def _random_expr(rng: random.Random, names: list[str], depth: int) -> str:
    if depth == 0 or rng.random() < 0.15:
        return rng.choice(names)
    k = rng.randrange(4)
    if k == 0:
        return "~" + _random_expr(rng, names, depth - 1)
    if k == 1:
        return "(" + _random_expr(rng, names, depth - 1) + ")"
    ops = [rng.choice(["&", "|", "^"]) for _ in range(rng.randint(1, 3))]
    parts = [_random_expr(rng, names, depth - 1) for _ in range(len(ops) + 1)]
    return parts[0] + "".join(f" {o} {p}" for o, p in zip(ops, parts[1:]))


def test_expressions_evaluate_like_python():
    """The iterative parser keeps Verilog precedence (``~ & ^ |``, as Python's)."""
    rng = random.Random(8)
    names = ["a", "b", "c", "d"]
    for _ in range(40):
        expr = _random_expr(rng, names, depth=rng.randint(1, 12))
        text = (f"module m(a, b, c, d, y);\n input a, b, c, d; output y;\n"
                f" assign y = {expr};\nendmodule\n")
        net = parse_verilog(text, "e.v")
        sources = [net.names[i] for i in np.flatnonzero(net.types == 0)]
        want = []
        for bits in range(16):
            env = {n: bits >> sources.index(n) & 1 for n in names if n in sources}
            want.append(eval(expr, {}, env) & 1)  # noqa: S307 - our own text
        assert _truth_table(net, "y") == want, expr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("depth", [200, 5000])
def test_deep_parentheses_do_not_recurse(depth):
    import networkx as nx

    text = ("module m(a, b, y, z);\n input a, b; output y, z;\n"
            f" assign y = {'(' * depth}a & b{')' * depth};\n"
            f" assign z = {'(' * depth}a{' & b)' * depth};\nendmodule\n")
    net = parse_verilog(text, "deep.v")
    i = net.names.index("y")
    assert GATE_TYPES[net.types[i]] == "and"
    fanin = net.fanin_idx[net.fanin_ptr[i]:net.fanin_ptr[i + 1]]
    assert sorted(net.names[j] for j in fanin) == ["a", "b"]
    # z = (((a & b) & b) & b)...: a chain of `depth` and-gates, each closed by
    # its parentheses, so not merged into one wide gate.
    g = nx.DiGraph([tuple(map(net.names.__getitem__, e)) for e in net.edge_index().T])
    assert nx.dag_longest_path_length(g) == depth
    assert levelize(net).level[net.names.index("z")] == depth


@pytest.mark.timeout(120)
@pytest.mark.parametrize("count", [330, 1501])
def test_long_not_chains_do_not_recurse(count):
    text = ("module m(a, y);\n input a; output y;\n"
            f" assign y = {'~' * count}a;\nendmodule\n")
    net = parse_verilog(text, "nots.v")
    assert net.num_nodes == count + 1
    assert levelize(net).depth == count
    assert _truth_table(net, "y") == [count % 2, 1 - count % 2]


def test_huge_bus_ranges_are_refused_with_the_line():
    head = "module m(a, y);\n"
    for decl in ("input [1000000000:0] a;", "input [600000:0] a, b;",
                 "input [99999999999999999999999999:0] a;"):
        with pytest.raises(NetlistError, match="bus range") as e:
            parse_verilog(head + f"  {decl}\n  output y;\nendmodule\n", "bus.v")
        assert e.value.file == "bus.v" and e.value.line == 2
    net = parse_verilog(head + "  input [3:0] a; output y;\n assign y = a[2];\n"
                        "endmodule\n", "bus.v")
    assert {f"a[{i}]" for i in range(4)} <= set(net.names)


@pytest.mark.parametrize("copies", [9, 300])
def test_repeated_expressions_match_circuitgraph(tmp_path, cg, copies):
    """Many copies of one expression: circuitgraph's graph, in linear time.

    circuitgraph's names for the 10th and later copy of a derived net follow
    its own scheme, so beyond 9 copies the graphs are compared up to names
    (Weisfeiler-Lehman hash over gate types).
    """
    import warnings

    import networkx as nx

    body = "".join(f"  assign y{k} = ~(~a & b){' | ~a' * (k % 3 == 0)};\n"
                   for k in range(copies))
    outs = ", ".join(f"y{k}" for k in range(copies))
    p = tmp_path / "rep.v"
    p.write_text(f"module m(a, b, {outs});\n input a, b;\n output {outs};\n"
                 f"{body}endmodule\n")
    c = cg(str(p))
    ours = read_netlist(p)
    if copies < 10:
        assert set(ours.names) == set(c.graph.nodes)
        assert _edges_by_name(ours) == set(c.graph.edges)
    theirs = nx.DiGraph(c.graph.edges)
    nx.set_node_attributes(theirs, {v: c.type(v) for v in c.graph.nodes}, "t")
    mine = nx.DiGraph(_edges_by_name(ours))
    nx.set_node_attributes(mine, {v: GATE_TYPES[t] for v, t in zip(ours.names,
                                                                   ours.types)}, "t")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nx 3.5 changed digraph hashes
        assert nx.weisfeiler_lehman_graph_hash(mine, node_attr="t") == \
            nx.weisfeiler_lehman_graph_hash(theirs, node_attr="t")


@pytest.mark.timeout(120)
def test_twenty_thousand_reinverting_assigns():
    import networkx as nx

    n = 20_000
    chain = "".join(f" assign n{i + 1} = ~n{i};\n" for i in range(n))
    same = "".join(f" assign r{i} = ~~n0;\n" for i in range(n))
    net = parse_verilog(f"module m(n0, y);\n input n0; output y;\n{chain}{same}"
                        f" assign y = n{n};\nendmodule\n", "chain.v")
    # n0, n1..n20000, y, and per r-assign the net and one inner inverter.
    assert net.num_nodes == 1 + n + 1 + 2 * n
    lv = levelize(net)
    g = nx.DiGraph(net.edge_index().T.tolist())
    assert lv.depth == nx.dag_longest_path_length(g) == n + 1


def test_unclosed_block_comment_names_its_line(tmp_path):
    p = tmp_path / "open.v"
    p.write_text("module m(a, y);\n input a; output y;\n /* never closed\n"
                 + "/* x\n" * 36_000 + " assign y = a;\nendmodule\n")
    with pytest.raises(NetlistError, match="unclosed block comment") as e:
        read_netlist(p)
    assert e.value.file == str(p) and e.value.line == 3


@pytest.mark.parametrize("literal", ["4'dFF", "8'o9", "4'b_", "2'b12", "'hG"])
def test_bad_number_literals_name_file_and_line(literal):
    text = f"module m(a, y);\n input a; output y;\n assign y = {literal};\nendmodule\n"
    with pytest.raises(NetlistError) as e:
        parse_verilog(text, "lit.v")
    assert e.value.file == "lit.v" and e.value.line == 3
    assert literal in str(e.value)


@pytest.mark.parametrize("literal", ["1'b1", "1'b0", "4'hE", "4'hf", "4'd9", "8'o6",
                                     "2'b1_0", "3'd" + "7" * 5000])
def test_number_literals_drive_their_lowest_bit(literal):
    text = f"module m(a, y);\n input a; output y;\n assign y = {literal};\nendmodule\n"
    net = parse_verilog(text, "lit.v")
    digits = literal.split("'")[1]
    base = {"b": 2, "o": 8, "d": 10, "h": 16}[digits[0]]
    want = int(digits[1:].replace("_", "")[-1], base) & 1  # lowest digit's parity
    (tie,) = [n for n in net.names if n.startswith("tie_")]
    assert GATE_TYPES[net.types[net.names.index(tie)]] == f"const{want}"


def test_loop_error_names_file_and_a_line_on_the_loop(tmp_path):
    p = tmp_path / "loop.v"
    p.write_text("module m(a, y);\n input a; output y;\n buf g0 (w, a);\n"
                 " not g2 (z, y);\n nand g1 (y, w, z);\nendmodule\n")
    with pytest.raises(NetlistError, match="combinational loop") as e:
        levelize(read_netlist(p))
    assert e.value.file == str(p) and e.value.line == 4  # the loop gate written first
    q = tmp_path / "loop.bench"
    q.write_text("INPUT(a)\nOUTPUT(y)\n\ny = NAND(a, z)\nz = NOT(y)\n")
    with pytest.raises(NetlistError, match="combinational loop") as e:
        levelize(read_netlist(q))
    assert e.value.file == str(q) and e.value.line == 4  # the loop gate written first
    assert str(e.value).startswith(f"{q}:{e.value.line}: ")


def test_lines_record_each_driver(netlist_dir):
    path = os.path.join(netlist_dir, "c17.v")
    net = read_netlist(path)
    assert net.lines.shape == (net.num_nodes,)
    seen = 0
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            m = re.match(r"\s*(?:nand|and|or|nor|not|buf)\s+\w+\s*\(\s*(\w+)", line)
            if m:
                assert net.line_of(net.names.index(m.group(1))) == lineno
                seen += 1
    assert seen == 6


@pytest.mark.parametrize("name, text", [
    ("e.v", "module m();\nendmodule\n"),
    ("e.v", "// nothing\nmodule m(a);\n  wire w;\nendmodule\n"),
    ("e.bench", ""),
    ("e.bench", "# only a comment\n\n"),
])
def test_empty_netlists_are_refused_when_read(tmp_path, name, text):
    from leangnn.circuits import load_circuit
    from leangnn.circuits.dataset import CircuitInfo

    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(NetlistError, match="no gates/nets") as e:
        read_netlist(p)
    assert e.value.file == str(p)
    with pytest.raises(NetlistError, match="no gates/nets"):
        load_circuit(CircuitInfo("user/e", "user", str(p)), "critical", cache=False)


@pytest.mark.parametrize("suffix", [".v", ".bench"])
def test_non_utf8_bytes_name_file_and_line(tmp_path, suffix):
    p = tmp_path / f"bin{suffix}"
    p.write_bytes(b"INPUT(a)\nOUTPUT(y)\ny = NOT(a\xff)\n" if suffix == ".bench" else
                  b"module m(a, y);\n input a; output y;\n not g (y, a\xfe);\n"
                  b"endmodule\n")
    with pytest.raises(NetlistError, match="not a UTF-8 text file") as e:
        read_netlist(p)
    assert e.value.file == str(p) and e.value.line == 3


@pytest.mark.parametrize("base", ["c17.v", "s27.v"])
def test_byte_order_mark_is_accepted(tmp_path, base, netlist_dir):
    with open(os.path.join(netlist_dir, base), "rb") as f:
        raw = f.read()
    bench = b"INPUT(a)\nINPUT(b)\nOUTPUT(y)\ny = NAND(a, b)\n"
    for suffix, body in ((".v", raw), (".bench", bench)):
        plain, bom = tmp_path / f"p{suffix}", tmp_path / f"b{suffix}"
        plain.write_bytes(body)
        bom.write_bytes(b"\xef\xbb\xbf" + body)
        x, y = read_netlist(plain), read_netlist(bom)
        assert x.names == y.names and np.array_equal(x.types, y.types)
        assert np.array_equal(x.fanin_idx, y.fanin_idx)
        assert np.array_equal(x.lines, y.lines)


@pytest.mark.parametrize("base", ["s27.v", "c432.v"])
def test_line_ends_cr_crlf_and_utf16(tmp_path, base, netlist_dir):
    """A file with lone-CR line ends (classic Mac OS) read as empty ("no
    'module' found": its first '//' comment ran to the end), a UTF-16 one as
    'invalid start byte'; CR and CRLF now read like LF, and UTF-16 is named."""
    from leangnn.circuits.blif import read_blif

    with open(os.path.join(netlist_dir, base), "rb") as f:
        raw = f.read()
    assert b"\r" not in raw and raw.lstrip().startswith(b"//")
    bench = b"# c\nINPUT(a)\nINPUT(b)\nOUTPUT(y)\ny = NAND(a, b)\n"
    blif = (b"# c\n.model m\n.inputs a b\n.outputs y\n.names a \\\n b y\n11 1\n"
            b".end\n")
    for suffix, body, read in ((".v", raw, read_netlist),
                               (".bench", bench, read_netlist),
                               (".blif", blif, read_blif)):
        want = read(_put(tmp_path / f"lf{suffix}", body))
        for name, end in (("cr", b"\r"), ("crlf", b"\r\n")):
            got = read(_put(tmp_path / f"{name}{suffix}", body.replace(b"\n", end)))
            assert got.names == want.names and np.array_equal(got.types, want.types)
            assert np.array_equal(got.fanin_idx, want.fanin_idx)
            assert np.array_equal(got.lines, want.lines)  # same line numbers
        for bom in ("utf-16", "utf-16-be"):
            p = _put(tmp_path / f"{bom}{suffix}", body.decode().encode(bom) if
                     bom == "utf-16" else b"\xfe\xff" + body.decode().encode(bom))
            with pytest.raises(NetlistError, match=rf"^{p}:1: not a UTF-8 text "
                               r"file but UTF-16 \(byte-order mark (FF FE|FE FF)\); "
                               "save it as UTF-8 or ASCII$"):
                read(p)


def _put(path, data: bytes):
    path.write_bytes(data)
    return path


_SUB = "module sub(a, b, y);\n input a, b; output y;\n and g1(y, a, b);\nendmodule\n"
_TOP = ("module top(x1, x2, x3, z);\n input x1, x2, x3; output z;\n wire w;\n"
        " {inst}\n or g2(z, w, x3);\nendmodule\n")


def test_the_top_module_is_the_one_nothing_instantiates():
    """A file with a submodule written first was read as that submodule alone,
    silently (predictions for the wrong circuit); the top is now the module
    no other one instantiates, and a hierarchical instance is one error
    naming its line, not 'unknown gate type'."""
    text = _SUB + _TOP.format(inst="sub u1(.a(x1), .b(x2), .y(w));")
    with pytest.raises(NetlistError, match=r"^h\.v:8: instance of module 'sub', "
                       "defined in this file: hierarchical netlists are not "
                       r"supported; flatten the design first \(yosys: flatten\): "
                       r"'sub u1\(\.a\(x1\), \.b\(x2\), \.y\(w\)\)'$"):
        parse_verilog(text, "h.v")
    # several modules that nothing instantiates: the first, as documented
    flat = _TOP.format(inst="and g1(w, x1, x2);") + _SUB
    net = parse_verilog(flat, "f.v")
    assert net.name == "top" and net.names == ["x1", "x2", "x3", "w", "z"]
    assert parse_verilog(flat, "f.v", "sub").name == "sub"  # asked for by name
    # a flip-flop cell defined in the file is a cell, not a submodule
    dff = ("module mydff(CK, D, Q);\n input CK, D; output Q; reg Q;\n"
           " always @(posedge CK) Q <= D;\nendmodule\n")
    seq = dff + ("module top(clk, a, y);\n input clk, a; output y;\n wire q;\n"
                 " mydff f0(.CK(clk), .D(a), .Q(q));\n not g(y, q);\nendmodule\n")
    net = parse_verilog(seq, "s.v")
    assert net.name == "top" and len(net.flops) == 1


@pytest.mark.parametrize("fmt, text, expect", [
    ("bench", "INPUT(a)\nINPUT(a)\nOUTPUT(a)\n",
     "t.bench:2: net 'a' has two drivers (first driven at line 1): 'INPUT(a)'"),
    ("blif", ".model m\n.inputs a\n.outputs y\n.names a y\n1 1\n.names a y\n0 1\n"
     ".end\n", "t.blif:6: net 'y' has two drivers (first driven at line 4): "
     "'.names a y'"),
    ("blif", ".model m\n.inputs a\n.outputs y\n.names a y\n1 1\n.names q z\n1 1\n"
     ".end\n", "t.blif:6: undriven net 'q': it is read but no gate, assign, input "
     "or flip-flop drives it: '.names q z'"),
])
def test_line_formats_quote_the_offending_line_only(fmt, text, expect):
    """The snippet of a .bench / BLIF error ran on over the next lines (to the
    next ';', which these formats do not have): 'INPUT(a) OUTPUT(a)',
    '.names a y 0 1 .end'."""
    from leangnn.circuits.blif import parse_blif

    with pytest.raises(NetlistError) as e:
        (parse_bench if fmt == "bench" else parse_blif)(text, f"t.{fmt}")
    assert str(e.value) == expect


def _to_ansi(text: str) -> str:
    """The netlist with its input/output statements moved into a Verilog-2001
    header, as ``module m(input a, b, output y);``."""
    decls = re.findall(r"^\s*((?:input|output)\s[^;]*);", text, re.M)
    body = re.sub(r"^\s*(?:input|output)\s[^;]*;", "", text, flags=re.M)
    return re.sub(r"module\s+(\w+)\s*\([^)]*\)\s*;",
                  lambda m: f"module {m.group(1)}(\n  " + ",\n  ".join(decls) + ");",
                  body, count=1)


@pytest.mark.parametrize("base", ["c432.v", "s27.v"])
def test_verilog_2001_port_declarations(base, netlist_dir):
    """`module m(input a, output y)` (Verilog-2001 / SystemVerilog headers, what
    most tools and people write) read every input as undriven: 'undriven net
    'a' (and 1 more)'. The same circuit, both header styles: same graph."""
    text = open(os.path.join(netlist_dir, base)).read()
    ansi = _to_ansi(text)
    assert "input" in ansi.split(";")[0] and ansi.count("input") == 1
    want, got = parse_verilog(text, "a.v"), parse_verilog(ansi, "b.v")
    assert got.names == want.names and np.array_equal(got.types, want.types)
    assert np.array_equal(got.fanin_ptr, want.fanin_ptr)
    assert np.array_equal(got.fanin_idx, want.fanin_idx)
    assert np.array_equal(got.outputs, want.outputs) and got.flops == want.flops


def test_verilog_2001_header_kinds_buses_and_errors():
    sv = ("module top(\n  input wire [1:0] a,\n  input logic b, c,\n"
          "  output reg [1:0] y,\n  output z\n);\n  and g0(y[0], a[0], b);\n"
          "  or g1(y[1], a[1], c);\n  xor g2(z, y[0], y[1]);\nendmodule\n")
    plain = ("module top(a, b, c, y, z);\n  input [1:0] a;\n  input b, c;\n"
             "  output [1:0] y;\n  output z;\n  and g0(y[0], a[0], b);\n"
             "  or g1(y[1], a[1], c);\n  xor g2(z, y[0], y[1]);\nendmodule\n")
    got, want = parse_verilog(sv, "s.sv"), parse_verilog(plain, "p.v")
    assert got.names == want.names == ["a[0]", "a[1]", "b", "c", "y[0]", "y[1]", "z"]
    assert np.array_equal(got.fanin_idx, want.fanin_idx)
    assert np.array_equal(got.outputs, want.outputs)
    with pytest.raises(NetlistError, match=r"^h\.v:1: port without a direction in a "
                       r"Verilog-2001 header \(expected input or output first\): "
                       "'a'$"):
        parse_verilog("module m(a, input b, output y);\n buf g(y, b);\nendmodule\n",
                      "h.v")
    with pytest.raises(NetlistError, match=r"^h\.v:2: bad identifier '3x'"):
        parse_verilog("module m(input b,\n output 3x);\n buf g(y, b);\nendmodule\n",
                      "h.v")
