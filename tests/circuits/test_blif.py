"""The BLIF reader against the Verilog netlists yosys read, and cover semantics.

Fixtures in ``data/`` were written by yosys from circuitgraph's netlists
(``data/make_fixtures.sh``); every cover is also checked minterm by minterm
against a direct evaluation of its rows.
"""

from __future__ import annotations

import os
import random
import re

import numpy as np
import pytest

from leangnn.circuits.blif import parse_blif, read_blif
from leangnn.circuits.netlist import GATE_TYPES, TYPE_ID, NetlistError, read_netlist
from leangnn.circuits.simulate import signal_probability

DATA = os.path.join(os.path.dirname(__file__), "data")
SEQUENTIAL = ["s27", "s13207"]
COMBINATIONAL = ["ctrl", "dec", "int2float", "router", "cavlc", "priority_ckt"]
# yosys folds an inverter of a nand/nor into one gate in these (s27, s13207,
# and cavlc's two 4-input nors), so there only the function is comparable.
EXACT_COUNTS = ["ctrl", "dec", "int2float", "router", "priority_ckt"]
_FLOP_KEY = re.compile(r"(\S+)\.(?:Q|qi)\b")
_YOSYS_CONST = {"tie_0": "$false", "tie_1": "$true"}


def _fixture(name: str) -> str:
    return os.path.join(DATA, name)


def _verilog(netlist_dir: str, circuit: str):
    return read_netlist(os.path.join(netlist_dir, f"{circuit}.v"))


def _key(net, i: int, flop_of: dict[int, str]) -> str:
    """A source name that is the same in the .v and in yosys' BLIF."""
    if net.types[i] == TYPE_ID["input"]:
        return net.names[i].lstrip("\\")
    if i in flop_of:  # a Verilog flop: its instance; yosys' latch is inst.Q/.qi
        return flop_of[i]
    return _FLOP_KEY.search(net.names[i]).group(1)


def _probs(net, verilog: bool = False):
    """Probabilities under patterns chosen per source name (exhaustive if few)."""
    flop_of = {q: inst for inst, _, q in net.flops} if verilog else {}
    sources = np.flatnonzero(np.isin(net.types, (TYPE_ID["input"], TYPE_ID["ppi"])))
    keys = [_key(net, int(i), flop_of) for i in sources]
    order = sorted(keys)
    if len(order) <= 16:
        pos = np.arange(max(64, 1 << len(order)))
        bits = ((pos[None, :] >> np.arange(len(order))[:, None]) & 1).astype(np.uint8)
        rows = np.packbits(bits, axis=1, bitorder="little").view(np.uint64)
    else:
        rows = np.random.default_rng(0).integers(0, 2**64 - 1, (len(order), 256),
                                                 dtype=np.uint64, endpoint=True)
    table = dict(zip(order, rows))
    prob = signal_probability(net, patterns=np.stack([table[k] for k in keys]))
    d_of = {_key(net, q, flop_of): d for _, d, q in net.flops}
    return prob, sorted(keys), d_of


def _by_name(net) -> dict[str, int]:
    return {n.lstrip("\\"): i for i, n in enumerate(net.names)}


def _count(net, gate: str) -> int:
    return int((net.types == TYPE_ID[gate]).sum())


@pytest.mark.parametrize("circuit", EXACT_COUNTS)
def test_structure_matches_verilog(circuit, netlist_dir):
    v, b = _verilog(netlist_dir, circuit), read_blif(_fixture(f"{circuit}.blif"))
    # yosys' techmap: a k-input and/or gate is k-1 two-input gates, and a
    # nand/nor is that followed by a not; constants are $true/$false/$undef.
    k = np.diff(v.fanin_ptr)
    fan = {g: int((k[v.types == TYPE_ID[g]] - 1).sum()) for g in ("and", "nand", "or",
                                                                  "nor")}
    assert _count(b, "and") == fan["and"] + fan["nand"]
    assert _count(b, "or") == fan["or"] + fan["nor"]
    assert _count(b, "not") == _count(v, "not") + _count(v, "nand") + _count(v, "nor")
    assert _count(b, "buf") == _count(v, "buf")
    assert _count(b, "const0") == 2 and _count(b, "const1") == 1
    assert b.num_edges == (2 * (_count(b, "and") + _count(b, "or"))
                           + _count(b, "not") + _count(b, "buf"))
    assert b.name == v.name
    assert sorted(b.names[i] for i in b.inputs) == sorted(
        v.names[i].lstrip("\\") for i in v.inputs)
    assert {b.names[i] for i in b.outputs} == {v.names[i].lstrip("\\")
                                               for i in v.outputs}


@pytest.mark.parametrize("circuit", ["ctrl", "dec"])
def test_same_graph_by_net_name(circuit, netlist_dir):
    # These use only 2-input and/or, not and assign: yosys keeps every net.
    v, b = _verilog(netlist_dir, circuit), read_blif(_fixture(f"{circuit}.blif"))
    bi = _by_name(b)

    def fanin(net, i):
        return [net.names[j].lstrip("\\") for j in
                net.fanin_idx[net.fanin_ptr[i]:net.fanin_ptr[i + 1]]]

    for name, i in _by_name(v).items():
        j = bi[_YOSYS_CONST.get(name, name)]
        assert b.types[j] == v.types[i], name
        assert fanin(b, j) == [_YOSYS_CONST.get(n, n) for n in fanin(v, i)], name
    # Nothing else: only the constants yosys always writes may be extra.
    mapped = {_YOSYS_CONST.get(n, n) for n in _by_name(v)}
    assert set(bi) - mapped == {"$false", "$true", "$undef"} - mapped


@pytest.mark.parametrize("circuit,file",
                         [(c, f"{c}.blif") for c in COMBINATIONAL + SEQUENTIAL]
                         + [(c, f"{c}_sop.blif") for c in ("int2float", "cavlc")])
def test_signal_probability_matches_verilog(circuit, file, netlist_dir):
    v, b = _verilog(netlist_dir, circuit), read_blif(_fixture(file))
    pv, kv, dv = _probs(v, verilog=True)
    pb, kb, db = _probs(b)
    assert kv == kb
    vi, bi = _by_name(v), _by_name(b)
    outs = [v.names[o].lstrip("\\") for o in v.outputs]
    assert {b.names[o] for o in b.outputs} == set(outs)
    # Same patterns per source name: equal functions give equal counts. Where
    # yosys kept the nets (not the ABC-mapped _sop files) compare every one.
    common = set(vi) & set(bi) if "_sop" not in file else set(outs)
    assert len(common) >= len(outs)
    for name in common:
        assert pb[bi[name]] == pv[vi[name]], name
    assert set(dv) == set(db)
    for key in dv:
        assert pb[db[key]] == pv[dv[key]], key


def test_sop_fixture_has_multi_cube_covers():
    with open(_fixture("cavlc_sop.blif")) as f:
        text = f.read()
    net = parse_blif(text)
    assert _count(net, "or") > 100 and _count(net, "and") > 100
    assert any(n.endswith("_c1") for n in net.names)  # an AND per cube


def _eval_cover(ins, rows, x) -> int:
    if not rows:
        return 0
    hit = any(all(c == "-" or int(c) == x[n] for n, c in zip(ins, plane))
              for plane, _ in rows)
    return int(hit) if rows[0][1] == "1" else int(not hit)


def _check_covers(covers, inputs="abcd"):
    """Build one model from ``covers`` and compare every minterm."""
    lines = [".model t", ".inputs " + " ".join(inputs),
             ".outputs " + " ".join(out for out, _, _ in covers)]
    for out, ins, rows in covers:
        lines.append(".names " + " ".join([*ins, out]))
        lines += [f"{p} {o}".strip() for p, o in rows]
    net = parse_blif("\n".join(lines) + "\n.end\n", "t.blif")
    idx = {n: i for i, n in enumerate(net.names)}
    ones = np.uint64(2**64 - 1)
    for m in range(1 << len(inputs)):
        x = {n: (m >> j) & 1 for j, n in enumerate(inputs)}
        rows = np.array([[x[net.names[i]]] for i in net.inputs], dtype=np.uint64)
        p = signal_probability(net, patterns=rows * ones)
        for out, ins, cover in covers:
            assert p[idx[out]] == _eval_cover(ins, cover, x), (out, ins, cover, x)
    return net, idx


GATES = [  # (inputs, rows, the single gate it must become)
    ([], [], "const0"),
    ([], [("", "1")], "const1"),
    ([], [("", "0")], "const0"),
    (["a"], [("1", "1")], "buf"),
    (["a"], [("0", "1")], "not"),
    (["a"], [("1", "0")], "not"),
    (["a"], [("0", "0")], "buf"),
    (["a"], [("-", "1")], "const1"),
    (["a"], [("-", "0")], "const0"),
    (["a", "b"], [], "const0"),
    (["a", "b"], [("11", "1")], "and"),
    (["a", "b", "c"], [("111", "0")], "nand"),
    (["a", "b"], [("00", "1")], "nor"),
    (["a", "b"], [("00", "0")], "or"),
    (["a", "b", "c"], [("1--", "1"), ("-1-", "1"), ("--1", "1")], "or"),
    (["a", "b"], [("1-", "0"), ("-1", "0")], "nor"),
    (["a", "b"], [("0-", "1"), ("-0", "1")], "nand"),
    (["a", "b"], [("0-", "0"), ("-0", "0")], "and"),
    (["a", "b"], [("01", "1"), ("10", "1")], "xor"),
    (["a", "b"], [("00", "1"), ("11", "1")], "xnor"),
    (["a", "b"], [("01", "0"), ("10", "0")], "xnor"),
    (["a", "b", "c"], [("100", "1"), ("010", "1"), ("001", "1"), ("111", "1")],
     "xor"),
    (["a", "b"], [("10", "1")], "and"),  # a & ~b: with a shared not
    (["a", "b", "c"], [("1-1", "1"), ("01-", "1")], "or"),  # general SOP
    (["a", "b", "c"], [("1-1", "0"), ("01-", "0")], "nor"),
    (["d", "b"], [("1-", "1"), ("-0", "1")], "or"),
    (["a", "b", "c"], [("11-", "1"), ("1-1", "1"), ("-11", "1")], "or"),  # majority
]


def test_recognised_gates_and_their_functions():
    covers = [(f"y{k}", ins, rows) for k, (ins, rows, _) in enumerate(GATES)]
    net, idx = _check_covers(covers)
    for k, (_, _, gate) in enumerate(GATES):
        assert GATE_TYPES[net.types[idx[f"y{k}"]]] == gate, GATES[k]
    # ~b is one shared inverter for every cover that reads it.
    b = idx["b"]
    nots = [i for i in range(net.num_nodes) if net.types[i] == TYPE_ID["not"]
            and net.fanin_idx[net.fanin_ptr[i]] == b]
    assert len(nots) == 1


def test_random_covers_match_their_rows():
    rng = random.Random(7)
    covers = []
    for k in range(300):
        n_in = rng.randint(0, 4)
        ins = rng.sample("abcd", n_in)
        bit = rng.choice("01")
        rows = [("".join(rng.choice("01--") for _ in ins), bit)
                for _ in range(rng.randint(0, 6))]
        covers.append((f"y{k}", ins, rows))
    _check_covers(covers)


def test_syntax_features():
    text = """# a header comment
.model top   # trailing comment
.inputs a b \\
  c
.outputs y q z w
.clock clk
.names a b \\
   t  # a continued .names
11 1
.latch t q re clk 0
.latch y s
.conn q w
.cname some_cell
.names q c y
1- 1
-1 1
.names z
.attr src "x.v:1"
.end
.model other
.names foo bar
1 1
.end
"""
    net = parse_blif(text, "t.blif", "fallback")
    idx = {n: i for i, n in enumerate(net.names)}
    assert net.name == "top" and "foo" not in idx
    assert sorted(net.names[i] for i in net.inputs) == ["a", "b", "c", "clk"]
    assert {net.names[i] for i in net.outputs} == {"y", "q", "z", "w"}
    assert [(i, net.names[d], net.names[q]) for i, d, q in net.flops] == [
        ("q", "t", "q"), ("s", "y", "s")]
    assert GATE_TYPES[net.types[idx["t"]]] == "and"
    assert GATE_TYPES[net.types[idx["w"]]] == "buf"
    assert GATE_TYPES[net.types[idx["z"]]] == "const0"
    assert GATE_TYPES[net.types[idx["y"]]] == "or"
    assert parse_blif(".inputs a\n.outputs a\n", name="anon").name == "anon"


BAD = [
    ("", 1, "empty BLIF file"),
    (".model m\n.inputs a\n.subckt adder a=a\n", 3, "hierarchical BLIF"),
    (".model m\n.inputs a\n.gate NAND2 A=a B=a Y=y\n", 3, "mapped cells (.gate)"),
    (".model m\n11 1\n", 2, "cover row outside"),
    (".model m\n.inputs a b\n.names a b y\n1 1\n", 4, "bad cover row"),
    (".model m\n.inputs a b\n.names a b y\n1x 1\n", 4, "bad cover row"),
    (".model m\n.inputs a b\n.names a b y\n11 2\n", 4, "bad cover row"),
    (".model m\n.inputs a b\n.names a b y\n11 1\n00 0\n", 3, "mixes on-set"),
    (".model m\n.frobnicate x\n", 2, "unknown BLIF directive '.frobnicate'"),
    (".model m\n.names\n", 2, "at least an output"),
    (".model m\n.inputs a\n.outputs y\n# c\n.names a z \\\n y\n11 1\n", 5,
     "undriven net 'z'"),
    (".model m\n.inputs a\n.names a\n1\n", 3, "two drivers"),
    (".model m\n.latch a\n", 2, ".latch needs"),
    (".model m\n.inputs a\n.latch a q xx clk\n", 3, "unknown latch type"),
    (".model m\n.inputs a\n.latch a q 7\n", 3, "initial value"),
    (".model m\n.conn a\n", 2, ".conn needs"),
    (".model m\n.inputs a\n.outputs y\n.end\n", 3, "declared but never driven"),
]


@pytest.mark.parametrize("text,line,message", BAD)
def test_malformed_input_names_file_and_line(text, line, message):
    with pytest.raises(NetlistError) as info:
        parse_blif(text, "bad.blif")
    err = info.value
    assert err.file == "bad.blif" and err.line == line, str(err)
    assert message in str(err) and str(err).startswith(f"bad.blif:{line}:")


def test_read_blif_files(tmp_path):
    with pytest.raises(NetlistError, match="no such netlist file"):
        read_blif(tmp_path / "missing.blif")
    p = tmp_path / "bin.blif"
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(NetlistError, match="not a UTF-8 text file"):
        read_blif(p)
    p = tmp_path / "inv.blif"
    p.write_text(".inputs a\n.outputs y\n.names a y\n0 1\n")
    net = read_blif(p)
    assert net.name == "inv" and net.path == str(p)
