"""The AIGER reader against the Verilog netlists yosys read, pyaig, and the spec.

Fixtures in ``data/`` were written by yosys from circuitgraph's netlists
(``data/make_fixtures.sh``); pyaig (an independent AIGER implementation) reads
the binary files and writes the random AIGs.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
import pyaig
import pytest

from leangnn.circuits.aiger import parse_aiger, read_aiger
from leangnn.circuits.netlist import TYPE_ID, NetlistError, read_netlist
from leangnn.circuits.simulate import levelize, signal_probability

DATA = os.path.join(os.path.dirname(__file__), "data")
STRUCTURAL = ["ctrl", "dec", "int2float", "router", "cavlc", "priority_ckt", "s27",
              "s13207"]
SYNTH = ["int2float", "cavlc"]  # re-synthesised by ABC: only the function agrees
_FLOP_KEY = re.compile(r"(\S+)\.(?:Q|qi)\b")

# The half adder and toggle flip-flop of the AIGER 1.9 format description.
HALF_ADDER = b"aag 7 2 0 2 3\n2\n4\n6\n12\n6 13 15\n12 2 4\n14 3 5\n" \
    b"i0 x\ni1 y\no0 s\no1 c\nc\nhalf adder\n"
HALF_ADDER_BIN = b"aig 5 2 0 2 3\n10\n6\n\x02\x02\x03\x02\x01\x02" \
    b"i0 x\ni1 y\no0 s\no1 c\nc\nhalf adder\n"


def _fixture(name: str) -> str:
    return os.path.join(DATA, name)


def _source_key(net, i: int, flop_of: dict[int, str]) -> str:
    """A name for a source that is the same in the .v and the yosys output."""
    if net.types[i] == TYPE_ID["input"]:
        return net.names[i].lstrip("\\")
    if i in flop_of:  # a Verilog flop: its instance; yosys names latches inst.Q
        return flop_of[i]
    m = _FLOP_KEY.search(net.names[i])
    assert m, net.names[i]
    return m.group(1)


def _patterns(keys: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Exhaustive patterns when few sources, else random; one row per key."""
    keys = sorted(keys)
    if len(keys) <= 16:
        pos = np.arange(max(64, 1 << len(keys)))
        bits = ((pos[None, :] >> np.arange(len(keys))[:, None]) & 1).astype(np.uint8)
        rows = np.packbits(bits, axis=1, bitorder="little").view(np.uint64)
    else:
        rng = np.random.default_rng(seed)
        rows = rng.integers(0, 2**64 - 1, size=(len(keys), 256), dtype=np.uint64,
                            endpoint=True)
    return dict(zip(keys, rows))


def _probs(net, verilog: bool = False, keys=None):
    """Signal probabilities, with source/flop keys, under per-key patterns."""
    flop_of = {q: inst for inst, _, q in net.flops} if verilog else {}
    sources = np.flatnonzero(np.isin(net.types, (TYPE_ID["input"], TYPE_ID["ppi"])))
    skeys = [_source_key(net, int(i), flop_of) for i in sources]
    table = _patterns(keys if keys is not None else skeys)
    prob = signal_probability(net, patterns=np.stack([table[k] for k in skeys]))
    d_of = {(flop_of.get(q) if verilog else _FLOP_KEY.search(net.names[q]).group(1)): d
            for _, d, q in net.flops}
    return prob, skeys, d_of


def _outputs(net) -> dict[str, int]:
    return {net.names[o].lstrip("\\"): int(o) for o in net.outputs}


def _same(a, b) -> None:
    assert a.name == b.name and a.names == b.names
    for f in ("types", "fanin_ptr", "fanin_idx", "outputs"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.flops == b.flops


@pytest.mark.parametrize("circuit", STRUCTURAL)
def test_ascii_and_binary_give_identical_netlists(circuit):
    ascii_, binary = _fixture(f"{circuit}.aag"), _fixture(f"{circuit}.aig")
    _same(read_aiger(ascii_), read_aiger(binary))


@pytest.mark.parametrize("circuit", STRUCTURAL)
def test_structure_matches_verilog(circuit, netlist_dir):
    v = read_netlist(os.path.join(netlist_dir, f"{circuit}.v"))
    a = read_aiger(_fixture(f"{circuit}.aig"))
    # yosys' aigmap makes each k-input and/nand/or/nor gate k-1 two-input ANDs
    # and folds every inverter into a literal.
    k = np.diff(v.fanin_ptr)
    gates = np.isin(v.types, [TYPE_ID[t] for t in ("and", "nand", "or", "nor")])
    assert (a.types == TYPE_ID["and"]).sum() == (k[gates] - 1).sum()
    ands = np.flatnonzero(a.types == TYPE_ID["and"])
    assert (np.diff(a.fanin_ptr)[ands] == 2).all()
    # yosys sorts the ports by name.
    assert sorted(a.names[i] for i in a.inputs) == sorted(v.names[i].lstrip("\\")
                                                          for i in v.inputs)
    assert len(a.flops) == len(v.flops) and len(a.pseudo_inputs) == len(v.flops)
    assert set(_outputs(a)) == set(_outputs(v))
    # Each inverted literal is exactly one shared `not` node.
    nots = np.flatnonzero(a.types == TYPE_ID["not"])
    srcs = a.fanin_idx[a.fanin_ptr[nots]]
    assert np.unique(srcs).size == nots.size
    levelize(a)  # acyclic


@pytest.mark.parametrize("circuit,file", [(c, f"{c}.aag") for c in STRUCTURAL]
                         + [(c, f"{c}_synth.aig") for c in SYNTH])
def test_signal_probability_matches_verilog(circuit, file, netlist_dir):
    v = read_netlist(os.path.join(netlist_dir, f"{circuit}.v"))
    a = read_aiger(_fixture(file))
    pv, kv, dv = _probs(v, verilog=True)
    pa, ka, da = _probs(a, keys=kv)
    assert sorted(kv) == sorted(ka)
    ov, oa = _outputs(v), _outputs(a)
    assert set(ov) == set(oa)
    # Same patterns per source name, so equal functions give equal counts.
    for name in ov:
        assert pa[oa[name]] == pv[ov[name]], name
    assert set(dv) == set(da)
    for key in dv:  # the next-state functions of the latches
        assert pa[da[key]] == pv[dv[key]], key


def _replay(aig, net) -> np.ndarray:
    """pyaig literal of every node, building our ANDs into pyaig's strashed AIG."""
    lit = np.full(net.num_nodes, -1, dtype=np.int64)
    lit[net.inputs] = list(aig.get_pis())
    lit[net.pseudo_inputs] = list(aig.get_latches())
    lv = levelize(net)
    for i in lv.order.tolist():
        fan = lit[net.fanin_idx[net.fanin_ptr[i]:net.fanin_ptr[i + 1]]].tolist()
        t = int(net.types[i])
        if t == TYPE_ID["const0"]:
            lit[i] = 0
        elif t == TYPE_ID["const1"]:
            lit[i] = 1
        elif t == TYPE_ID["not"]:
            lit[i] = fan[0] ^ 1
        elif t == TYPE_ID["buf"]:
            lit[i] = fan[0]
        elif t == TYPE_ID["and"]:
            lit[i] = aig.create_and(*fan)
        else:
            assert t in (TYPE_ID["input"], TYPE_ID["ppi"])
    return lit


def _check_against_pyaig(net, aig, header_ands: int) -> None:
    """Same inputs, latches, ANDs (up to pyaig's structural hashing), outputs."""
    n_ands = aig.n_ands()
    assert len(net.inputs) == aig.n_pis()
    assert len(net.flops) == aig.n_latches()
    ands = np.flatnonzero(net.types == TYPE_ID["and"])
    assert ands.size == header_ands  # we keep structurally equal duplicates
    lit = _replay(aig, net)
    # Every AND we read is one of pyaig's: replaying them into its strashed
    # AIG creates none, and they cover all of pyaig's ANDs.
    assert aig.n_ands() == n_ands
    assert len(set(lit[ands].tolist())) == n_ands
    assert all(aig.is_and(int(x)) for x in lit[ands])
    latches = list(aig.get_latches())
    for k, (_, d, q) in enumerate(net.flops):
        assert lit[q] == latches[k] and aig.get_next(latches[k]) == lit[d]
    pos = list(aig.get_pos())
    assert {int(lit[o]) for o in net.outputs} == {f for _, f, _ in pos}
    index = {n: i for i, n in enumerate(net.names)}
    for po, f, _ in pos:
        if aig.po_has_name(po):
            assert lit[index[aig.get_name_by_po(po).decode()]] == f


@pytest.mark.parametrize("file", [f"{c}.aig" for c in STRUCTURAL]
                         + [f"{c}_synth.aig" for c in SYNTH])
def test_matches_pyaig(file):
    aig = pyaig.read_aiger(_fixture(file))
    net = read_aiger(_fixture(file))
    with open(_fixture(file), "rb") as f:
        header = f.readline().split()
    _check_against_pyaig(net, aig, int(header[5]))


def _random_aig(seed: int, n_in=40, n_latch=12, n_and=3000):
    rng = np.random.default_rng(seed)
    aig = pyaig.AIG()
    lits = [aig.create_pi(name=f"in{k}" if k % 3 else None) for k in range(n_in)]
    latches = [aig.create_latch(name=f"reg{k}" if k % 2 else None,
                                init=int(rng.integers(3))) for k in range(n_latch)]
    lits += latches
    while aig.n_ands() < n_and:
        a, b = rng.choice(len(lits), 2)
        neg = rng.integers(2, size=2).tolist()
        f = aig.create_and(lits[a] ^ neg[0], lits[b] ^ neg[1])
        if aig.is_and(f) and f not in lits:
            lits.append(f)
    pick = lambda: lits[int(rng.integers(len(lits)))] ^ int(rng.integers(2))  # noqa: E731
    for latch in latches:
        aig.set_next(latch, pick())
    # Outputs include constants, inputs, latches, negations and repeats.
    specials = [0, 1, lits[0], lits[0] ^ 1, latches[0], lits[-1], lits[-1]]
    for k, f in enumerate(specials + [pick() for _ in range(20)]):
        aig.create_po(f, name=f"out{k}" if k % 4 else None)
    for k in range(3):
        aig.create_po(pick(), name=f"bad{k}", po_type=pyaig.AIG.BAD_STATES)
        aig.create_po(pick(), po_type=pyaig.AIG.CONSTRAINT)
        aig.create_po(pick(), po_type=pyaig.AIG.FAIRNESS)
    for size in (2, 3):
        aig.create_justice([aig.create_po(pick(), po_type=pyaig.AIG.JUSTICE)
                            for _ in range(size)])
    buf = io.BytesIO()
    pyaig.write_aiger(aig, buf)
    return buf.getvalue()


@pytest.mark.parametrize("seed", [0, 1])
def test_random_aigs_written_by_pyaig(seed):
    data = _random_aig(seed)
    net = parse_aiger(data, "rand.aig", "rand")
    aig = pyaig.read_aiger(io.BytesIO(data))
    assert data.startswith(b"aig ") and len(data.split(b"\n")[0].split()) == 10
    # pyaig writes strashed AIGs, so here the AND counts agree exactly.
    _check_against_pyaig(net, aig, aig.n_ands())
    assert {"in1", "reg1", "out1", "bad0"} <= set(net.names)
    assert net.names[net.inputs[0]] == "i0"  # unnamed: AIGER-style default


def test_half_adder_from_the_spec():
    for data in (HALF_ADDER, HALF_ADDER_BIN):
        net = parse_aiger(data, "ha", "ha")
        index = {n: i for i, n in enumerate(net.names)}
        assert set(_outputs(net)) == {"s", "c"}
        assert (net.types == TYPE_ID["and"]).sum() == 3
        for x in (0, 1):
            for y in (0, 1):
                rows = np.array([[x], [y]], dtype=np.uint64) * np.uint64(2**64 - 1)
                p = signal_probability(net, patterns=rows)
                assert p[index["s"]] == (x ^ y) and p[index["c"]] == (x & y)
    _same(parse_aiger(HALF_ADDER, "ha", "ha"), parse_aiger(HALF_ADDER, "ha", "ha"))


def test_aiger_19_sections_latches_and_gaps():
    # Variables out of order with a gap (5 unused), ANDs defined after use,
    # latch resets 0/1/self, and bad, constraint, justice and fairness lines.
    data = (b"aag 9 2 2 2 3 1 1 1 1\n4\n2\n"
            b"16 19 0\n18 16 18\n"  # latch 16: next = ~18; latch 18: next = 16
            b"8\n1\n"  # outputs: AND 8 and constant true
            b"9\n"  # bad: ~8
            b"3\n"  # constraint: ~x
            b"2\n16\n18\n"  # justice: 2 literals
            b"0\n"  # fairness: constant false
            b"8 12 17\n12 2 5\n14 4 3\n"
            b"i1 b\nl1 r\no0 y\nb0 p\nj0 fair\nc\nanything\n\x00\xff binary ok\n")
    net = parse_aiger(data, "x.aag", "x")
    names = net.names
    assert names[:4] == ["i0", "b", "l0", "r"]
    assert [names[q] for _, _, q in net.flops] == ["l0", "r"]
    d = {names[q]: names[d_] for _, d_, q in net.flops}
    assert d == {"l0": "not_r", "r": "l0"}
    assert names[net.fanin_idx[net.fanin_ptr[names.index("y")]]] == "n6"
    assert "n7" in names and (net.types == TYPE_ID["and"]).sum() == 3
    assert "tie_0" in names and "tie_1" in names
    outs = {names[o] for o in net.outputs}
    # o0 names its AND and b0 the inverter of it; unnamed outputs (o1, c0, f0)
    # flag the node they read; justice j0's literals are latches: buffered.
    assert outs == {"y", "tie_1", "p", "not_b", "fair[0]", "fair[1]", "tie_0"}
    assert net.types[names.index("p")] == TYPE_ID["not"]
    assert net.types[names.index("fair[1]")] == TYPE_ID["buf"]
    assert names[net.fanin_idx[net.fanin_ptr[names.index("fair[1]")]]] == "r"
    assert len(levelize(net).level) == net.num_nodes


def test_cycles_are_left_to_levelize():
    net = parse_aiger(b"aag 3 1 0 1 2\n2\n4\n4 2 6\n6 2 4\n", "loop.aag")
    with pytest.raises(NetlistError, match="loop"):
        levelize(net)


BAD = [
    (b"", 1, "empty"),
    (b"hello world\n", 1, "not an AIGER file"),
    (b"\x00\xff\xfe\x9c garbage", 1, "not an AIGER file"),
    (b"aag 1 2\n", 1, "bad AIGER header"),
    (b"aag 1 x 0 0 0\n", 1, "bad AIGER header"),
    (b"aag 99999999999 0 0 0 0\n", 1, "exceeds"),
    (b"aag 1 2 0 0 0\n2\n4\n", 1, "smaller than"),
    (b"aig 3 1 0 0 1\n", 1, "M = I + L + A"),
    (b"aig 2000000 2000000 0 0 0\n", 1, "truncated"),
    (b"aag 3 1 0 1 1\n2\n6\n", 4, "file ends early"),
    (HALF_ADDER[:HALF_ADDER.index(b"14 3 5")], 8, "file ends early"),
    (b"aag 1 1 0 0 0\n3\n", 2, "must be even"),
    (b"aag 1 1 0 0 0\n2 4\n", 2, "expected input 0 literal"),
    (b"aag 3 2 0 1 1\n2\n4\n6\n6 2 99\n", 5, "out of range"),
    (b"aag 3 2 0 1 1\n2\n4\n6\n6 2 99999999999999999999\n", 5, "out of range"),
    (b"aag 4 2 0 1 2\n2\n4\n6\n6 2 4\n\n8 6 2\n", 6, "AND gate 1"),
    (b"aag 3 2 0 1 1\n2\n4\n6\n6 2\n", 5, "AND gate 0"),
    (b"aag 3 2 0 1 1\n2\n4\n6\n6 2 -4\n", 5, "AND gate 0"),
    (b"aag 3 2 0 1 1\n2\n4\n6\n7 2 4\n", 5, "even"),
    (b"aag 4 2 0 1 1\n2\n4\n6\n6 2 8\n", 5, "variable 4"),
    (b"aag 4 2 0 1 0\n2\n4\n9\n", 4, "variable 4"),
    (b"aag 2 2 0 0 0\n2\n2\n", 3, "defined twice"),
    (b"aag 2 1 1 0 0\n2\n4 2 3\n", 3, "reset value"),
    (b"aag 1 1 0 0 0\n2\nx0 foo\n", 3, "bad symbol table line"),
    (b"aag 1 1 0 0 0\n2\ni5 foo\n", 3, "out of range"),
    (b"aag 1 1 0 0 0\n2\ni0 a\ni0 b\n", 4, "second symbol"),
    (b"aag 1 1 0 0 0\n2\ni0 \xff\n", 3, "UTF-8"),
    (HALF_ADDER_BIN[:HALF_ADDER_BIN.index(b"\x01")], 4, "2 of 3 AND gates"),
    (b"aig 2 1 0 0 1\n\x00\x01", 2, "lhs > rhs0"),
    (b"aig 2 1 0 0 1\n\x05\x00", 2, "lhs > rhs0"),
    (b"aig 2 1 0 0 1\n\xff\xff\xff\xff\xff\x01\x00", 2, "longer than 5 bytes"),
    (b"aig 2 1 0 1 1\n4\n\x02\x00i0 a\nq junk\n", 4, "bad symbol table line"),
    # the last text line without its newline, then the AND section: was a bare
    # numpy ValueError "offset must be ... no greater than buffer length"
    (b"aig 2 1 0 1 1\n4", 3, "0 of 1 AND gates present"),
    (b"aag 3 2 0 1 1\n2\n4\n6", 5, "file ends early: expected AND gate 0"),
]


@pytest.mark.parametrize("data,line,message", BAD)
def test_malformed_input_names_file_and_line(data, line, message):
    with pytest.raises(NetlistError) as info:
        parse_aiger(data, "bad.aig")
    err = info.value
    assert err.file == "bad.aig" and err.line == line, str(err)
    assert message in str(err) and str(err).startswith(f"bad.aig:{line}:")


def test_whitespace_variants_read_the_same():
    ref = parse_aiger(HALF_ADDER, "ha", "ha")
    for variant in (HALF_ADDER.replace(b"\n", b"\r\n"),
                    HALF_ADDER.replace(b"6 13 15", b"6\t13  15"),
                    HALF_ADDER.replace(b"12 2 4", b"12\x0b2 4"),  # line-by-line path
                    HALF_ADDER[:HALF_ADDER.index(b"i0")].rstrip(b"\n")):
        net = parse_aiger(variant, "ha", "ha")
        if b"i0" in variant:
            _same(ref, net)
        else:  # no symbol table, no final newline
            assert net.num_nodes == ref.num_nodes and net.num_edges == ref.num_edges


def test_read_aiger_files(tmp_path):
    with pytest.raises(NetlistError, match="no such AIGER file"):
        read_aiger(tmp_path / "missing.aag")
    p = tmp_path / "half.aag"
    p.write_bytes(HALF_ADDER.replace(b"\n", b"\r\n"))
    net = read_aiger(p)
    assert net.name == "half" and net.path == str(p)
    assert set(_outputs(net)) == {"s", "c"}
