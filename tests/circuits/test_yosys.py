"""Yosys's Verilog output (``write_verilog`` and ``-noexpr``) against plain gates.

The same circuits are written three ways: plain gate primitives (the
reference, the cells' functions written out from the truth tables of yosys's
``techlibs/common/simcells.v``), ``-noexpr`` cell instances, and the default
shape (``assign`` expressions, flip-flops as ``reg`` + ``always`` blocks as
``backends/verilog/verilog_backend.cc`` prints them, attributes). The three
Netlists must compute the same outputs and flop next states on random vectors,
evaluated here node by node (not by the package's simulator). A circuitgraph
netlist written as ``-noexpr`` cells must match circuitgraph's own parse, and
real yosys output (``data/make_yosys_fixtures.sh``) must match yosys's own
BLIF of the design and circuitgraph's parse of the netlist it synthesised.
"""

from __future__ import annotations

import os
import re
import zlib

import numpy as np
import pytest

from leangnn.circuits import NetlistError, parse_verilog, read_netlist
from leangnn.circuits.netlist import GATE_TYPES, TYPE_ID

# --------------------------------------------------------------------------- #
# An evaluator independent of leangnn.circuits.simulate
_REDUCE = {"and": np.logical_and.reduce, "or": np.logical_or.reduce,
           "xor": lambda x: np.logical_xor.reduce(x)}


_BASE = {"nand": "and", "nor": "or", "xnor": "xor"}
_SOURCES = (TYPE_ID["input"], TYPE_ID["ppi"])


def _vector(name: str, patterns: int, seed: int) -> np.ndarray:
    """Random values of source ``name``: the same in every netlist read."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return rng.integers(0, 2, patterns).astype(bool)


def _evaluate(net, sources: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every node's value, sources by name, gates in Kahn order."""
    n = net.num_nodes
    fanin = [net.fanin_idx[net.fanin_ptr[i]:net.fanin_ptr[i + 1]] for i in range(n)]
    fanout = [[] for _ in range(n)]
    for i, f in enumerate(fanin):
        for j in f:
            fanout[j].append(i)
    left = [len(f) for f in fanin]
    ready = [i for i in range(n) if left[i] == 0]
    val: list = [None] * n
    while ready:
        i = ready.pop()
        t = GATE_TYPES[net.types[i]]
        if t in ("input", "ppi"):
            val[i] = sources[net.names[i]]
        elif t in ("const0", "const1"):
            val[i] = np.full(len(next(iter(sources.values()))), t == "const1")
        else:
            x = np.stack([val[j] for j in fanin[i]])
            base = _BASE.get(t, t)
            v = x[0] if base in ("buf", "not") else _REDUCE[base](x)
            val[i] = ~v if t in ("not", "nand", "nor", "xnor") else v
        for k in fanout[i]:
            left[k] -= 1
            if left[k] == 0:
                ready.append(k)
    assert all(v is not None for v in val), "combinational loop"
    return val


def _behaviour(net, alias=None, patterns=4096, seed=7):
    """(outputs, flop next states, pseudo inputs) by name on random vectors.

    ``alias`` renames a pseudo input to the flop's Q net where yosys printed
    the register under the cell's name (``reg _13_; ... assign q13 = _13_``).
    """
    alias = alias or {}
    srcs = [net.names[i] for i in np.flatnonzero(np.isin(net.types, _SOURCES))]
    val = _evaluate(net, {n: _vector(alias.get(n, n), patterns, seed) for n in srcs})
    outs = {net.names[i]: val[i] for i in net.outputs}
    flops = {alias.get(net.names[q], net.names[q]): val[d] for _, d, q in net.flops}
    ppis = sorted(alias.get(net.names[i], net.names[i]) for i in net.pseudo_inputs)
    return outs, flops, ppis


def _assert_same(ref, other):
    (ro, rf, rp), (oo, of, op) = ref, other
    assert sorted(ro) == sorted(oo) and sorted(rf) == sorted(of) and rp == op
    for k in ro:
        assert np.array_equal(ro[k], oo[k]), f"output {k} differs"
    for k in rf:
        assert np.array_equal(rf[k], of[k]), f"next state of flop {k} differs"


# --------------------------------------------------------------------------- #
# One circuit, three ways
_PORTS = ("a, b, c, d, s, t, clk, rst, en, set_n, ld, ad, "
          + ", ".join(f"y{i}" for i in range(17)) + ", "
          + ", ".join(f"q{i}" for i in range(1, 14)))
_HEAD = (f"module top({_PORTS});\n"
         "  input a, b, c, d, s, t, clk, rst, en, set_n, ld, ad;\n"
         f"  output {', '.join(f'y{i}' for i in range(17))};\n"
         f"  output {', '.join(f'q{i}' for i in range(1, 14))};\n")

# Reference: gates written from simcells.v's truth tables, and each flop a
# plain `dff` whose D is its next state (async reset as sync, enable holds).
PLAIN = _HEAD + """
  buf (y0, a);  not (y1, a);
  and (y2, a, b);  nand (y3, a, b);  or (y4, a, b);  nor (y5, a, b);
  xor (y6, a, b);  xnor (y7, a, b);
  not (nb, b);  and (y8, a, nb);  or (y9, a, nb);        // ANDNOT, ORNOT
  not (ns, s);  and (m1, s, b);  and (m0, ns, a);
  or (y10, m1, m0);  nor (y11, m1, m0);                  // MUX, NMUX: S ? B : A
  and (ab, a, b);  or (aob, a, b);  and (cd, c, d);  or (cod, c, d);
  nor (y12, ab, c);  nand (y13, aob, c);                 // AOI3, OAI3
  nor (y14, ab, cd);  nand (y15, aob, cod);              // AOI4, OAI4
  not (nt, t);                                           // MUX4 as a decoder
  and (k0, nt, ns, a);  and (k1, nt, s, b);  and (k2, t, ns, c);  and (k3, t, s, d);
  or (y16, k0, k1, k2, k3);
  not (nrst, rst);  not (nen, en);
  dff f1 (.CK(clk), .D(a), .Q(q1));                      // $_DFF_P_
  and (n2, nrst, b);    dff f2 (.CK(clk), .D(n2), .Q(q2));   // $_DFF_PP0_
  or (n3, nrst, c);     dff f3 (.CK(clk), .D(n3), .Q(q3));   // $_DFF_PN1_
  and (e4a, nen, d);  and (e4b, en, q4);  or (n4, e4a, e4b);
  dff f4 (.CK(clk), .D(n4), .Q(q4));                     // $_DFFE_PN_
  and (e5a, nen, a);  and (e5b, en, q5);  or (e5, e5a, e5b);  or (n5, rst, e5);
  dff f5 (.CK(clk), .D(n5), .Q(q5));                     // $_SDFFE_PP1N_
  and (r6, rst, b);  and (e6a, en, r6);  and (e6b, nen, q6);  or (n6, e6a, e6b);
  dff f6 (.CK(clk), .D(n6), .Q(q6));                     // $_SDFFCE_PN0P_
  not (nset, set_n);  or (s7, nset, c);  and (n7, nrst, s7);
  dff f7 (.CK(clk), .D(n7), .Q(q7));                     // $_DFFSR_PNP_
  not (nld, ld);  and (l8a, ld, ad);  and (l8b, nld, d);  or (n8, l8a, l8b);
  dff f8 (.CK(clk), .D(n8), .Q(q8));                     // $_ALDFF_PP_
  xor (x9, a, b);  and (e9a, en, x9);  and (e9b, nen, q9);  or (e9, e9a, e9b);
  and (n9, nrst, e9);  dff f9 (.CK(clk), .D(n9), .Q(q9));    // $_DFFE_PP0P_
  dff f10 (.D(b), .Q(q10));                              // $_FF_
  and (e11a, en, d);  and (e11b, nen, q11);  or (e11, e11a, e11b);
  or (s11, s, e11);  and (n11, nrst, s11);
  dff f11 (.CK(clk), .D(n11), .Q(q11));                  // $_DFFSRE_PPPP_
  and (e12a, nen, c);  and (e12b, en, q12);  or (e12, e12a, e12b);
  and (l12a, ld, ad);  and (l12b, nld, e12);  or (n12, l12a, l12b);
  dff f12 (.CK(clk), .D(n12), .Q(q12));                  // $_ALDFFE_PPN_
  and (n13, rst, a);  dff f13 (.CK(clk), .D(n13), .Q(q13));  // $_SDFF_PN0_
endmodule
"""


def _cell(kind, name, **pins):
    conn = ",\n".join(f"    .{p}({n})" for p, n in pins.items())
    return f"  \\{kind} {name} (\n{conn}\n  );\n"


NOEXPR = ("/* Generated by Yosys (write_verilog -noexpr) */\n" + _HEAD
          + "  wire _x9_;\n" + "".join([
              _cell("$_BUF_", "_00_", A="a", Y="y0"),
              _cell("$_NOT_", "_01_", A="a", Y="y1"),
              *(_cell(f"$_{g}_", f"_0{i}_", A="a", B="b", Y=f"y{i}") for i, g in
                enumerate(["AND", "NAND", "OR", "NOR", "XOR", "XNOR", "ANDNOT",
                           "ORNOT"], start=2)),
              _cell("$_MUX_", "_10_", A="a", B="b", S="s", Y="y10"),
              _cell("$_NMUX_", "_11_", A="a", B="b", S="s", Y="y11"),
              _cell("$_AOI3_", "_12_", A="a", B="b", C="c", Y="y12"),
              _cell("$_OAI3_", "_13_", A="a", B="b", C="c", Y="y13"),
              _cell("$_AOI4_", "_14_", A="a", B="b", C="c", D="d", Y="y14"),
              _cell("$_OAI4_", "_15_", A="a", B="b", C="c", D="d", Y="y15"),
              _cell("$_MUX4_", "_16_", A="a", B="b", C="c", D="d", S="s", T="t",
                    Y="y16"),
              _cell("$_DFF_P_", "f1", C="clk", D="a", Q="q1"),
              _cell("$_DFF_PP0_", "f2", C="clk", D="b", Q="q2", R="rst"),
              _cell("$_DFF_PN1_", "f3", C="clk", D="c", Q="q3", R="rst"),
              _cell("$_DFFE_PN_", "f4", C="clk", D="d", E="en", Q="q4"),
              _cell("$_SDFFE_PP1N_", "f5", C="clk", D="a", E="en", Q="q5", R="rst"),
              _cell("$_SDFFCE_PN0P_", "f6", C="clk", D="b", E="en", Q="q6", R="rst"),
              _cell("$_DFFSR_PNP_", "f7", C="clk", D="c", Q="q7", R="rst",
                    S="set_n"),
              _cell("$_ALDFF_PP_", "f8", AD="ad", C="clk", D="d", L="ld", Q="q8"),
              _cell("$_XOR_", "_17_", A="a", B="b", Y="_x9_"),
              _cell("$_DFFE_PP0P_", "f9", C="clk", D="_x9_", E="en", Q="q9",
                    R="rst"),
              _cell("$_FF_", "f10", D="b", Q="q10"),
              _cell("$_DFFSRE_PPPP_", "f11", C="clk", D="d", E="en", Q="q11",
                    R="rst", S="s"),
              _cell("$_ALDFFE_PPN_", "f12", AD="ad", C="clk", D="c", E="en",
                    L="ld", Q="q12"),
              _cell("$_SDFF_PN0_", "f13", C="clk", D="a", Q="q13", R="rst"),
          ]) + "endmodule\n")

# Default write_verilog: what dump_cell_expr prints for each gate cell (an
# attribute between the operands, as it places them), and the builtin-FF
# printer's always blocks; q13 shows the register named after its cell.
DEFAULT = """/* Generated by Yosys */
(* top =  1  *)
(* src = "top.v:1.1-40.10" *)
""" + _HEAD + """  (* src = "top.v:2.9-2.10" *)
  wire a;
  reg q1, q2, q3, q4, q5, q6, q7, q8, q9, q11, q12;
  reg q10 = 1'h0;
  wire _x9_;
  assign y0 = a;
  assign y1 = ~a;
  assign y2 = a & (* src = "top.v:5.13-5.18" *) b;
  assign y3 = ~(a & b);
  assign y4 = a | b;
  assign y5 = ~(a | b);
  assign y6 = a ^ b;
  assign y7 = ~(a ^ b);
  assign y8 = a & ~(b);
  assign y9 = a | ~(b);
  assign y10 = s ? (* src = "top.v:9.14-9.23" *) b : a;
  assign y11 = !(s ? b : a);
  assign y12 = ~((a & b) | c);
  assign y13 = ~((a | b) & c);
  assign y14 = ~((a & b) | (c & d));
  assign y15 = ~((a | b) & (c | d));
  assign y16 = t ? (s ? d : c) : (s ? b : a);
  (* src = "top.v:20.3-21.14" *)
  always @(posedge clk)
    q1 <= a;
  always @(posedge clk, posedge rst)
    if (rst) q2 <= 1'h0;
    else q2 <= b;
  always @(posedge clk, negedge rst)
    if (!rst) q3 <= 1'h1;
    else q3 <= c;
  always @(posedge clk)
    if (!en) q4 <= d;
  always @(posedge clk)
    if (rst) q5 <= 1'h1;
    else if (!en) q5 <= a;
  always @(posedge clk)
    if (en)
      if (!rst) q6 <= 1'h0;
      else q6 <= b;
  always @(posedge clk, negedge set_n, posedge rst)
    if (rst) q7 <= 1'b0;
    else if (!set_n) q7 <= 1'b1;
    else q7 <= c;
  always @(posedge clk, posedge ld)
    if (ld) q8 <= ad;
    else q8 <= d;
  assign _x9_ = a ^ b;
  always @(posedge clk, posedge rst)
    if (rst) q9 <= 1'h0;
    else if (en) q9 <= _x9_;
  \\$_FF_ f10 (
    .D(b),
    .Q(q10)
  );
  always @(posedge clk, posedge s, posedge rst)
    if (rst) q11 <= 1'b0;
    else if (s) q11 <= 1'b1;
    else if (en) q11 <= d;
  always @(posedge clk, posedge ld)
    if (ld) q12 <= ad;
    else if (!en) q12 <= c;
  reg _13_;
  always @(posedge clk)
    if (!rst) _13_ <= 1'h0;
    else _13_ <= a;
  assign q13 = _13_;
endmodule
"""


def test_three_shapes_compute_the_same():
    ref = parse_verilog(PLAIN, "plain.v")
    noexpr = parse_verilog(NOEXPR, "noexpr.v")
    default = parse_verilog(DEFAULT, "default.v")
    assert len(ref.flops) == len(noexpr.flops) == len(default.flops) == 13
    want = _behaviour(ref)
    _assert_same(want, _behaviour(noexpr))
    _assert_same(want, _behaviour(default, alias={"_13_": "q13"}))
    # the reference really depends on what is compared: a wrong polarity fails
    wrong = parse_verilog(NOEXPR.replace("$_SDFFCE_PN0P_", "$_SDFFCE_PP0P_"), "w.v")
    with pytest.raises(AssertionError, match="q6"):
        _assert_same(want, _behaviour(wrong))
    wrong = parse_verilog(DEFAULT.replace("if (!en) q4", "if (en) q4"), "w.v")
    with pytest.raises(AssertionError, match="q4"):
        _assert_same(want, _behaviour(wrong, alias={"_13_": "q13"}))


def test_systemverilog_always_ff():
    """``write_verilog -sv`` prints ``always_ff``; ``always_comb`` is refused."""
    sv = DEFAULT.replace("always @(", "always_ff @(")
    assert sv.count("always_ff") == 12
    _assert_same(_behaviour(parse_verilog(PLAIN, "plain.v")),
                 _behaviour(parse_verilog(sv, "sv.v"), alias={"_13_": "q13"}))
    with pytest.raises(NetlistError, match=r"^c\.v:5: .*'always_comb' is "
                       "combinational"):
        parse_verilog(_M.format("  always_comb q = a;"), "c.v")


def test_cells_become_single_gates_where_they_are_gates():
    net = parse_verilog(NOEXPR, "noexpr.v")
    t = {n: GATE_TYPES[k] for n, k in zip(net.names, net.types)}
    assert [t[f"y{i}"] for i in range(8)] == ["buf", "not", "and", "nand", "or",
                                              "nor", "xor", "xnor"]
    assert t["y12"] == "nor" and t["y15"] == "nand"  # AOI/OAI: two levels
    assert {t[f"q{i}"] for i in range(1, 14)} == {"ppi"}
    assert "clk" in net.names and t["clk"] == "input"
    # the clock is not read, as for other flip-flop cells
    clk = net.names.index("clk")
    assert clk not in set(net.fanin_idx.tolist())


@pytest.mark.parametrize("kind, data, select", [
    ("$_MUX4_", "ABCD", "ST"), ("$_MUX8_", "ABCDEFGH", "STU"),
    ("$_MUX16_", "ABCDEFGHIJKLMNOP", "STUV")])
def test_wide_muxes_pick_the_input_their_selects_number(kind, data, select):
    """simcells.v's truth tables: S is the least significant select bit."""
    pins = data + select
    text = (f"module m({', '.join(pins)}, y);\n input {', '.join(pins)};\n output y;\n"
            + _cell(kind, "u", **{p: p for p in pins}, Y="y") + "endmodule\n")
    net = parse_verilog(text, "mux.v")
    val = _evaluate(net, {p: _vector(p, 4096, 3) for p in pins})
    index = sum(_vector(s, 4096, 3).astype(int) << k for k, s in enumerate(select))
    want = np.choose(index, [_vector(p, 4096, 3) for p in data])
    assert np.array_equal(val[net.names.index("y")], want)


def test_async_reset_reads_as_its_synchronous_equivalent():
    sync = "  always @(posedge clk)\n    if (rst) q <= 1'h0;\n    else q <= d;\n"
    text = ("module m(clk, rst, d, q);\n  input clk, rst, d;\n  output q;\n"
            "  reg q;\n{}endmodule\n")
    a = parse_verilog(text.format(sync.replace("(posedge clk)",
                                               "(posedge clk, posedge rst)")), "a.v")
    s = parse_verilog(text.format(sync), "s.v")
    assert a.names == s.names and np.array_equal(a.types, s.types)
    _assert_same(_behaviour(s), _behaviour(a))


def test_ansi_output_reg_and_simcells_style_conditions():
    text = ("module m(input clk, input r, input d, output reg q, output reg [1:0] w);\n"
            "  always @(negedge clk or negedge r)\n    if (r == 0) q <= 1'b1;\n"
            "    else q <= d;\n  always @(posedge clk) w[1] <= ~d;\n"
            "  always @(posedge clk) w[0] <= q ? d : 1'b0;\nendmodule\n")
    net = parse_verilog(text, "ansi.v")
    ref = parse_verilog(
        "module m(clk, r, d, q, w0, w1);\n input clk, r, d; output q, w0, w1;\n"
        " not (nr, r); or (n, nr, d); dff f (.D(n), .Q(q));\n"
        " not (nd, d); dff g (.D(nd), .Q(w1));\n"
        " and (x, q, d); dff h (.D(x), .Q(w0));\nendmodule\n", "ref.v")
    alias = {"w[0]": "w0", "w[1]": "w1"}
    got = _behaviour(net, alias)
    got = ({alias.get(k, k): v for k, v in got[0].items()}, got[1], got[2])
    _assert_same(_behaviour(ref), got)


# --------------------------------------------------------------------------- #
# A circuitgraph netlist written as -noexpr cells
_PLAIN_ID = re.compile(r"[A-Za-z_][\w$]*\Z")


def _esc(name: str) -> str:
    return name if _PLAIN_ID.match(name) else f"\\{name} "


def _ours(name: str) -> str:
    return name if _PLAIN_ID.match(name) else f"\\{name}"


def _write_noexpr(c) -> str:
    """circuitgraph Circuit -> yosys -noexpr style: two-input cells, n-ary
    gates as chains, flip-flop blackboxes as $_DFF_P_."""
    lines, k = [], 0

    def emit(kind, **pins):
        nonlocal k
        k += 1
        conn = ", ".join(f".{p}({_esc(n)})" for p, n in pins.items())
        lines.append(f"  \\{kind} _{k}_ ({conn});")

    ins = sorted(c.inputs())
    outs = sorted(c.outputs())
    for n in sorted(c.nodes()):
        t, fi = c.type(n), sorted(c.fanin(n))
        if t in ("input", "bb_input", "bb_output"):
            continue
        if t in ("0", "1"):
            lines.append(f"  assign {_esc(n)} = 1'h{t};")
        elif t in ("buf", "not"):
            emit(f"$_{t.upper()}_", A=fi[0], Y=n)
        elif len(fi) == 1:
            emit("$_NOT_" if t in ("nand", "nor", "xnor") else "$_BUF_", A=fi[0], Y=n)
        else:
            base = _BASE.get(t, t)
            acc = fi[0]
            for j, x in enumerate(fi[1:], start=1):
                last = j == len(fi) - 1
                y = n if last else f"{n}$chain{j}"
                emit(f"$_{(t if last else base).upper()}_", A=acc, B=x, Y=y)
                acc = y
    for bb in sorted(c.blackboxes):
        d = next(iter(c.fanin(f"{bb}.D")))
        clk = next(iter(c.fanin(f"{bb}.CK")))
        emit("$_DFF_P_", C=clk, D=d, Q=f"{bb}.Q")
        lines[-1] = lines[-1].replace(f"_{k}_ (", f"{_esc(bb)} (")
    ports = ", ".join(_esc(p) for p in ins + outs)
    head = [f"module {c.name}({ports});"]
    head += [f"  input {_esc(i)};" for i in ins]
    head += [f"  output {_esc(o)};" for o in outs]
    return "\n".join(head + lines + ["endmodule", ""])


def _cg_behaviour(c, patterns=4096, seed=7):
    import networkx as nx

    srcs = [n for n in c.nodes() if c.type(n) in ("input", "bb_output")]
    bits = {s: _vector(_ours(s), patterns, seed) for s in srcs}
    val = {}
    for n in nx.topological_sort(c.graph):
        t = c.type(n)
        x = [val[f] for f in c.fanin(n)]
        if t in ("input", "bb_output"):
            val[n] = bits[n]
        elif t in ("0", "1"):
            val[n] = np.full(patterns, t == "1")
        elif t in ("buf", "bb_input"):
            val[n] = x[0]
        elif t == "not":
            val[n] = ~x[0]
        else:
            base = _BASE.get(t, t)
            v = _REDUCE[base](np.stack(x))
            val[n] = ~v if base != t else v
    outs = {_ours(o): val[o] for o in c.outputs()}
    flops = {_ours(f"{bb}.Q"): val[f"{bb}.D"] for bb in c.blackboxes}
    return outs, flops, sorted(flops)


@pytest.mark.parametrize("circuit", ["s27", "c432", "c499", "c880"])
def test_circuitgraph_netlist_as_noexpr_cells(circuit, netlist_dir, cg, tmp_path):
    c = cg(os.path.join(netlist_dir, f"{circuit}.v"))
    path = tmp_path / f"{circuit}.v"
    path.write_text(_write_noexpr(c))
    net = read_netlist(path)
    assert len(net.flops) == len(c.blackboxes)
    _assert_same(_cg_behaviour(c), _behaviour(net))


# --------------------------------------------------------------------------- #
# Real yosys 0.23 output (data/make_yosys_fixtures.sh)
DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.mark.parametrize("shape", ["yosys_ffs.v", "yosys_ffs_noexpr.v"])
def test_real_yosys_flops_match_its_own_blif(shape):
    """``synth`` of a design with every flip-flop kind, against yosys's BLIF of
    the same design with async controls made sync and the flops unmapped to
    plain D flip-flops and gates (``dffunmap``), read by the BLIF reader."""
    path = os.path.join(DATA, shape)
    text = open(path).read()
    for kind in ("posedge rst", "if (en)", "else if (", "posedge ld") \
            if shape == "yosys_ffs.v" else \
            ("$_DFF_PP0_", "$_SDFFE_PP0P_", "$_SDFFCE_PP1P_", "$_DFFSR_PPN_",
             "$_ALDFF_PP_", "$_DFF_N_", "$_MUX_", "$_ANDNOT_"):
        assert kind in text  # the shapes the test is about are there
    net = read_netlist(path)
    assert len(net.flops) == 27
    _assert_same(_behaviour(read_netlist(os.path.join(DATA, "yosys_ffs_sync.blif"))),
                 _behaviour(net))


@pytest.mark.parametrize("shape", ["yosys_bus.v", "yosys_bus_noexpr.v"])
def test_real_yosys_bus_connections_match_its_own_blif(shape):
    """``assign y = a;`` of 4-bit buses, ``{ 4'h9, b }`` and a flattened
    instance's escaped bus bits ``\\u1.t [0]``, against yosys's BLIF."""
    path = os.path.join(DATA, shape)
    text = open(path).read()
    assert "assign y = a;" in text and "\\u1.t [0]" in text
    net = read_netlist(path)
    _assert_same(_behaviour(read_netlist(os.path.join(DATA, "yosys_bus.blif"))),
                 _behaviour(net))


@pytest.mark.parametrize("shape", ["yosys_c432.v", "yosys_c432_noexpr.v"])
def test_real_yosys_synthesis_matches_circuitgraph(shape, netlist_dir, cg):
    ref = _cg_behaviour(cg(os.path.join(netlist_dir, "c432.v")))
    _assert_same(ref, _behaviour(read_netlist(os.path.join(DATA, shape))))


# --------------------------------------------------------------------------- #
# Hostile input: one NetlistError naming the file and the line
_M = ("module m(clk, a, b, y);\n  input clk, a, b;\n  output y;\n  reg q, r;\n{}\n"
      "endmodule\n")


@pytest.mark.parametrize("body, message", [
    ("  \\$_FOO_ g (.A(a), .Y(y));", "unknown yosys cell '$_FOO_'"),
    ("  \\$_AND_ g (.A(a), .Y(y));", "g of yosys cell '$_AND_' has no connection "
     "for port B"),
    ("  \\$_AND_ g (.A(a), .B(b), .Z(y));", "has no port 'Z'"),
    ("  \\$_AND_ g (y, a, b);", "needs named ports"),
    ("  \\$_DFF_PP0_ g (.C(clk), .D(a), .Q(y));", "no connection for port R"),
    ("  \\$_DLATCH_P_ g (.E(a), .D(b), .Q(y));", "latch cell"),
    ("  \\$dff #(.WIDTH(1)) g (.CLK(clk), .D(a), .Q(y));", "coarse-grained"),
    ("  \\$_TBUF_ g (.A(a), .E(b), .Y(y));", "tri-state"),
    ("  always @(posedge clk) q = a;", "blocking assignment"),
    ("  always @* q = a & b;", "'always @*' is combinational"),
    ("  always @(a or b) q <= a;", "'a' in the sensitivity list is not"),
    ("  always @(posedge clk) begin q <= a;", "begin/end"),
    ("  always @(posedge clk) y <= a;", "'y' is not declared 'reg'"),
    ("  always @(posedge clk) if (a) q <= b; else r <= a;", "assigns both"),
    ("  always @(posedge clk) if a q <= b;", "expected '(' after 'if'"),
    ("  always @(posedge clk) if (a q <= b;", "missing ')'"),
    ("  always @(posedge clk) q <= a; y <= b;", "unknown gate type 'y'"),
    ("  always @(posedge clk) q <= a & ;", "expression"),
    ("  assign y = a ? b;", "'?' without ':'"),
    ("  assign y = (a ? b : q;", "missing ')'"),
    ("  (* src = \"x.v:1 \n  assign y = a;", "unclosed attribute"),
    ("  wire [1:0] w;\n  assign w = {a, b, a};", "connects 3 bits to 2"),
    ("  wire [1:0] w;\n  assign w = 2'bx1;", "is not a 0/1 number"),
    ("  wire [1:0] w;\n  assign w = a & b;", "cannot read 'a & b' as a connection"),
    ("  wire [999999:0] w, v;\n  assign w = v;", "more than the"),
    ("  wire [9999999999:0] w;", "too wide"),
    ("  assign {y, q} = {a, 1'b0, b};", "connects 3 bits to 2"),
])
def test_errors_name_file_and_line(body, message):
    with pytest.raises(NetlistError) as e:
        parse_verilog(_M.format(body), "bad.v")
    assert message in str(e.value)
    line = 5 + body.count("\n") - ("unclosed attribute" in message)
    assert str(e.value).startswith(f"bad.v:{line}: ")


def test_multi_bit_register_is_refused_by_name():
    text = ("module m(clk, d, q);\n input clk; input [1:0] d; output [1:0] q;\n"
            " reg [1:0] q;\n always @(posedge clk)\n  q <= d;\nendmodule\n")
    with pytest.raises(NetlistError, match=r"^bad\.v:5: .*'q' is a multi-bit "
                       "register"):
        parse_verilog(text, "bad.v")


def test_deep_nesting_is_an_error_not_a_crash():
    deep_if = "  always @(posedge clk) " + "if (a) " * 5000 + "q <= b;"
    chain = "  assign y = " + "a ? b : " * 5000 + "b;"
    parens = "  assign y = " + "(" * 5000 + "a ? b : a" + ")" * 5000 + ";"
    for body in (deep_if, chain, parens):
        try:
            net = parse_verilog(_M.format(body), "deep.v")
        except NetlistError as e:
            assert str(e).startswith("deep.v:5: ") and "nested too deeply" in str(e)
        else:
            assert net.num_nodes > 0


@pytest.mark.parametrize("name", ["noexpr", "default", "yosys_ffs.v"])
def test_truncated_files_are_netlist_errors(name):
    """Every cut of a yosys file (a partial write) is one NetlistError naming
    the file, never another exception."""
    text = {"noexpr": NOEXPR, "default": DEFAULT}.get(name)
    if text is None:
        with open(os.path.join(DATA, name)) as f:
            text = f.read()
    for cut in range(0, len(text) - 1, 5):
        with pytest.raises(NetlistError) as e:
            parse_verilog(text[:cut], "cut.v")
        assert str(e.value).startswith("cut.v")
        # cut inside a statement, module closed: parsed, or one NetlistError
        try:
            parse_verilog(text[:cut] + "\nendmodule\n", "cut.v")
        except NetlistError as e:
            assert str(e).startswith("cut.v")
