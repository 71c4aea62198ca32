"""Reader for BLIF (Berkeley Logic Interchange Format) gate-level netlists.

BLIF (Berkeley, "BLIF: Berkeley Logic Interchange Format", SIS 1.2) is what
ABC, yosys and VPR write for technology-independent logic. The reader takes
one flat model: ``.model .inputs .outputs .names .latch .end``, with ``#``
comments and ``\\`` line continuation; ``.clock`` nets are primary inputs,
yosys' ``.conn a b`` is a buffer, and cell annotations (``.cname .attr
.param``) and SIS timing directives are skipped. Hierarchy and mapped cells
(``.subckt``, ``.gate``, ``.mlatch``), don't-care networks (``.exdc``) and
state machines (``.start_kiss``) raise :class:`NetlistError`: flatten or
re-map the design first (``yosys: flatten; techmap``, ``abc: strash``).

The graph follows :mod:`leangnn.circuits.netlist`: each ``.names`` cover
becomes gates whose output node is the cover's output net, and a ``.latch``
is cut like a flip-flop (its output a pseudo primary input, its input a
pseudo primary output). Covers that are exactly one gate become that gate:
constants, buffer, inverter, n-input and/nand/or/nor, and n-input xor/xnor
given as their full on-set (or off-set). Any other cover becomes its
sum of products: an ``and`` of the literals per cube (named ``<out>_c<k>``)
and an ``or`` of the cubes, ``nor`` for an off-set cover (output column 0);
complemented inputs read one ``not`` node per net, shared by all covers.
"""

from __future__ import annotations

import gc
from pathlib import Path

from .netlist import TYPE_ID, Netlist, NetlistError, _Builder, read_text

__all__ = ["read_blif", "parse_blif"]

_UNSUPPORTED = {
    ".subckt": "hierarchical BLIF (.subckt) is not supported; flatten the design",
    ".gate": "mapped cells (.gate) are not supported; re-map to .names covers",
    ".mlatch": "mapped latches (.mlatch) are not supported; use .latch",
    ".exdc": "external don't-care networks (.exdc) are not supported",
    ".start_kiss": "state machines (.start_kiss) are not supported",
    ".search": "file inclusion (.search) is not supported",
    ".blackbox": "black-box models (.blackbox) are not supported",
}
_IGNORED = {".cname", ".attr", ".param", ".area", ".delay", ".wire_load_slope",
            ".wire", ".input_arrival", ".output_required", ".input_drive",
            ".output_load", ".max_input_load", ".default_input_arrival",
            ".default_output_required", ".default_input_drive",
            ".default_output_load", ".default_max_input_load"}
_INVERT = {"and": "nand", "nand": "and", "or": "nor", "nor": "or", "xor": "xnor",
           "xnor": "xor", "buf": "not", "not": "buf", "const0": "const1",
           "const1": "const0"}
_LATCH_TYPES = {"fe", "re", "ah", "al", "as"}


def _logical_lines(text: str):
    """``(offset, tokens)`` per logical line: comments cut, ``\\`` lines joined."""
    offset, start, parts = 0, None, []
    for raw in text.split("\n"):
        line = raw.split("#", 1)[0].rstrip()
        here = offset
        offset += len(raw) + 1
        cont = line.endswith("\\")
        if cont:
            line = line[:-1]
        if start is None:
            start = here
        parts.append(line)
        if cont:
            continue
        toks = " ".join(parts).split()
        if toks:
            yield start, toks
        start, parts = None, []
    if parts:
        toks = " ".join(parts).split()
        if toks:
            yield start, toks


class _Blif:
    def __init__(self, text: str, file: str | None):
        self.b = _Builder(file, text, stmt_end="\n")  # error snippets: one line
        self.records: list[tuple] = []  # (directive, tokens, offset, rows)
        self.reserved: set[str] = set()  # every net named in the file
        self.nots: dict[int, int] = {}  # net -> its shared inverter node
        self.plans: dict[tuple, tuple] = {}  # cover rows -> (gate, terms)

    def error(self, message: str, offset: int, toks: list[str]):
        return self.b.error(message, offset, " ".join(toks))

    def read(self, text: str, default_name: str) -> Netlist:
        name = None
        current = None
        for offset, toks in _logical_lines(text):
            head = toks[0]
            if not head.startswith("."):
                if current is None:
                    raise self.error("cover row outside a .names block", offset, toks)
                current[3].append((offset, toks))
                continue
            current = None
            if head == ".model":
                if name is not None:
                    break  # a second model: only the first (top) one is read
                name = toks[1] if len(toks) > 1 else default_name
            elif head == ".end":
                if name is not None or self.records:
                    break
            elif head in _UNSUPPORTED:
                raise self.error(_UNSUPPORTED[head], offset, toks)
            elif head in _IGNORED:
                continue
            elif head in (".inputs", ".outputs", ".clock", ".names", ".latch",
                          ".conn"):
                rec = (head, toks[1:], offset, [])
                self.records.append(rec)
                self.reserved.update(toks[1:])
                if head == ".names":
                    current = rec
            else:
                raise self.error(f"unknown BLIF directive {head!r}", offset, toks)
        for head, args, offset, rows in self.records:
            getattr(self, head[1:])(args, offset, rows)
        return self.b.build(name or default_name)

    # ------------------------------------------------------------- directives
    def inputs(self, args, offset, _rows):
        for n in args:
            self.b.drive(n, "input", (), offset)

    def clock(self, args, offset, _rows):
        for n in args:
            i = self.b.index.get(n)
            if i is None or self.b.types[i] != TYPE_ID["input"]:
                self.b.drive(n, "input", (), offset)

    def outputs(self, args, offset, _rows):
        self.b.outputs.extend((n, offset) for n in args)

    def conn(self, args, offset, _rows):
        if len(args) != 2:
            raise self.error(".conn needs a source and a target net", offset,
                             [".conn", *args])
        self.b.drive(args[1], "buf", (self.b.net(args[0], offset),), offset)

    def latch(self, args, offset, _rows):
        toks = [".latch", *args]
        if not 2 <= len(args) <= 5:
            raise self.error(".latch needs 'input output [type control] [init]'",
                             offset, toks)
        if len(args) >= 4 and args[2] not in _LATCH_TYPES:
            raise self.error(f"unknown latch type {args[2]!r} (expected one of "
                             "fe, re, ah, al, as)", offset, toks)
        if len(args) in (3, 5) and args[-1] not in ("0", "1", "2", "3"):
            raise self.error(f"latch initial value {args[-1]!r} must be 0, 1, 2 "
                             "or 3", offset, toks)
        d = self.b.net(args[0], offset)
        q = self.b.drive(args[1], "ppi", (), offset)
        self.b.flops.append((args[1], d, q))

    def names(self, args, offset, rows):
        if not args:
            raise self.error(".names needs at least an output net", offset,
                             [".names"])
        # Files repeat a handful of covers, so each distinct one is analysed
        # once; this keeps a .names to a few dict lookups.
        key = (len(args), tuple(tuple(r) for _, r in rows))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self.plan(args, offset, rows)
        gate, terms = plan
        out = args[-1]
        ins = [self.b.net(n, offset) for n in args[:-1]]
        fanin = []
        for c, term in enumerate(terms):
            if term[0] is None:  # a literal
                fanin.append(self.literal(ins[term[1]], term[2], offset))
            else:  # an AND of the literals of one cube
                cube = tuple(self.literal(ins[j], p, offset) for j, p in term[1])
                fanin.append(self.b.drive(self.fresh(f"{out}_c{c}"), "and", cube,
                                          offset))
        i = self.b.drive(out, gate, tuple(fanin), offset)
        if gate == "not":
            self.nots.setdefault(fanin[0], i)

    def literal(self, net: int, positive: bool, offset: int) -> int:
        if positive:
            return net
        i = self.nots.get(net)
        if i is None:
            i = self.nots[net] = self.b.drive(
                self.fresh(f"not_{self.b.names[net]}"), "not", (net,), offset)
        return i

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.b.index or name in self.reserved:
            name, k = f"{base}_{k}", k + 1
        return name

    def plan(self, args, offset, rows):
        """Check a cover and turn it into ``(gate, terms)``.

        A term is ``(None, j, positive)`` for the literal of input ``j``, or
        ``("and", [(j, positive), ...])`` for a cube of several literals.
        """
        k = len(args) - 1
        cubes, bits = [], set()
        for row_off, row in rows:
            plane = "".join(row[:-1]) if k else ""
            if (len(plane) != k or len(row) < (2 if k else 1)
                    or row[-1] not in ("0", "1") or plane.strip("01-")):
                raise self.error(f"bad cover row for {k} input(s): expected "
                                 f"{k} of '0 1 -' and an output bit 0 or 1",
                                 row_off, row)
            cubes.append(plane)
            bits.add(row[-1])
        if len(bits) > 1:
            raise self.error(f"cover of {args[-1]!r} mixes on-set (1) and off-set "
                             "(0) rows", offset, [".names", *args])
        gate, terms = _cover(cubes)
        if bits == {"0"} and cubes:  # an off-set: the complement of the cover
            gate = _INVERT[gate]
        return gate, terms


def _cover(cubes: list[str]) -> tuple[str, list]:
    """The on-set function of ``cubes`` as one gate over literal/cube terms."""
    if not cubes:
        return "const0", []
    lits = [[(j, c == "1") for j, c in enumerate(cube) if c != "-"]
            for cube in cubes]
    if any(not cl for cl in lits):  # a cube without literals is always 1
        return "const1", []
    if len(lits) == 1 or all(len(cl) == 1 for cl in lits):
        flat = [lt for cl in lits for lt in cl]
        single = len(lits) == 1  # one cube: AND of literals, else OR
        if len(flat) == 1:
            return ("buf" if flat[0][1] else "not"), [(None, flat[0][0], True)]
        if all(p for _, p in flat):
            return ("and" if single else "or"), [(None, j, True) for j, _ in flat]
        if not any(p for _, p in flat):
            # De Morgan: AND of complements is NOR, OR of complements NAND.
            return ("nor" if single else "nand"), [(None, j, True) for j, _ in flat]
        return ("and" if single else "or"), [(None, j, p) for j, p in flat]
    parity = _parity_gate(cubes)
    if parity is not None:
        return parity, [(None, j, True) for j in range(len(cubes[0]))]
    return "or", [(None, *cl[0]) if len(cl) == 1 else ("and", cl) for cl in lits]


def _parity_gate(cubes: list[str]) -> str | None:
    """``xor``/``xnor`` when the cubes are exactly the odd/even minterms."""
    k = len(cubes[0])
    if k < 2 or k > 16 or len(cubes) != 1 << (k - 1) or any("-" in c for c in cubes):
        return None
    if len(set(cubes)) != len(cubes):
        return None
    odd = {c.count("1") & 1 for c in cubes}
    if len(odd) != 1:
        return None
    return "xor" if odd.pop() else "xnor"


def parse_blif(text: str, file: str | None = None, name: str = "blif") -> Netlist:
    """Parse a flat BLIF model into a :class:`Netlist`.

    Args:
        text (str): the file contents.
        file (str, optional): file name used in error messages.
        name (str, optional): the netlist name when there is no ``.model``
            line. (default: ``"blif"``)

    Returns:
        A :class:`Netlist` named after its ``.model``.

    Raises:
        NetlistError: malformed or unsupported input, with the file and line.
    """
    if not text.strip():
        raise NetlistError("empty BLIF file", file, 1)
    # The reader allocates a few small containers per line; on large files the
    # cyclic garbage collector's passes over them cost as much as the parsing
    # itself, and nothing here makes cycles.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Blif(text, file).read(text, name)
    finally:
        if enabled:
            gc.enable()


def read_blif(path: str | Path) -> Netlist:
    """Read a ``.blif`` file (see :func:`parse_blif`).

    Args:
        path (str or Path): the file; its stem names a model without ``.model``.

    Returns:
        A :class:`Netlist`.
    """
    path = Path(path)
    return parse_blif(read_text(path), str(path), path.stem)
