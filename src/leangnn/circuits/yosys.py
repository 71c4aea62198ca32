"""Yosys's Verilog output: its gate cells, its flip-flop ``always`` blocks, ``?:``.

Yosys writes a mapped design in two shapes; :func:`~leangnn.circuits.read_netlist`
reads both through the hooks of this module:

* ``write_verilog -noexpr``: every cell an instance with named ports and an
  escaped type, ``\\$_AND_ _05_ (.A(a), .B(b), .Y(y));``. :data:`CELLS` holds
  the combinational cells as gate trees; the flip-flops ``$_FF_``,
  ``$_DFF_*``, ``$_DFFE_*``, ``$_SDFF_*``, ``$_SDFFE_*``, ``$_SDFFCE_*``,
  ``$_DFFSR_*``, ``$_DFFSRE_*``, ``$_ALDFF_*`` and ``$_ALDFFE_*`` are read from
  the polarity letters of their names. Functions, priorities and port names
  are those of yosys's ``techlibs/common/simcells.v``.
* plain ``write_verilog``: logic as ``assign`` expressions (a mux as
  ``s ? b : a``) and every flip-flop as ``reg q;`` plus an ``always`` block,
  ``always @(posedge clk) q <= d;``, a reset as ``always @(posedge clk,
  posedge rst) if (rst) q <= 1'h0; else q <= d;``, an enable as ``if (en)
  q <= d;`` (``backends/verilog/verilog_backend.cc``, the builtin-FF case;
  ``always_ff`` with ``-sv``).

Both shapes connect buses as sigspecs, ``assign y = a;`` (4-bit ``a``) or
``assign w = { 4'h9, b };``, bit by bit, and name bits of flattened
instances' escaped buses, ``\\u1.t [0]``. Attributes ``(* ... *)`` are dropped.

A flip-flop is cut as every flip-flop of the reader is: its Q net becomes a
pseudo primary input (``ppi``) and its next state, a function of D, reset,
set, load and enable, is built from ``and``/``or``/``not`` gates whose output
is the flop's D net (the pseudo output). An enable holds the flop:
``next = en ? d : q``. An asynchronous reset, set or load is modelled as its
synchronous equivalent, ``next = rst ? 0 : d``: the graph has no notion of
time between clock edges, so the two differ only in when the value appears.
Clock nets are not read, as for the other flip-flop cells.

Refused, with the line that holds them: latches (``$_DLATCH*``, ``$_SR_*``,
``always @*``), tri-state buffers, coarse cells (``\\$dff #(...)``,
``$add``), an ``always`` block whose target is not a declared ``reg`` bit,
blocking assignments, ``begin``/``end``, multi-bit registers and bus
expressions other than connections.
"""

from __future__ import annotations

import re
import sys

import leangnn.circuits.netlist as _nl

__all__ = ["ALWAYS", "CELLS", "FLOP_FAMILIES", "strip_attributes", "join_else", "cell",
           "always", "declare_regs", "wire", "is_bus_assign", "bus_assign",
           "conditional"]


def _mux_tree(data: str, select: str):
    """``$_MUX4_`` .. ``$_MUX16_``: ``data`` pins by select value, ``select``
    least significant first (``$_MUX4_``: ``T ? (S ? D : C) : (S ? B : A)``)."""
    level: list = list(data)
    for s in select:
        level = [("mux", s, level[i + 1], level[i]) for i in range(0, len(level), 2)]
    return level[0]


#: Combinational yosys cells: output ``Y`` as a tree of gates over the input
#: pins. ``("mux", S, B, A)`` is ``S ? B : A``, ``"nmux"`` its complement.
CELLS = {
    "$_BUF_": ("buf", "A"),
    "$_NOT_": ("not", "A"),
    **{f"$_{g.upper()}_": (g, "A", "B")
       for g in ("and", "nand", "or", "nor", "xor", "xnor")},
    "$_ANDNOT_": ("and", "A", ("not", "B")),  # A & ~B
    "$_ORNOT_": ("or", "A", ("not", "B")),  # A | ~B
    "$_MUX_": ("mux", "S", "B", "A"),  # S ? B : A
    "$_NMUX_": ("nmux", "S", "B", "A"),  # S ? !B : !A
    "$_AOI3_": ("nor", ("and", "A", "B"), "C"),
    "$_OAI3_": ("nand", ("or", "A", "B"), "C"),
    "$_AOI4_": ("nor", ("and", "A", "B"), ("and", "C", "D")),
    "$_OAI4_": ("nand", ("or", "A", "B"), ("or", "C", "D")),
    "$_MUX4_": _mux_tree("ABCD", "ST"),
    "$_MUX8_": _mux_tree("ABCDEFGH", "STU"),
    "$_MUX16_": _mux_tree("ABCDEFGHIJKLMNOP", "STUV"),
}

#: Ports of each combinational cell, inputs first (as simcells.v names them).
_CELL_PINS = {k: tuple(sorted(set(re.findall(r"\b[A-Z]\b", repr(t))))) + ("Y",)
              for k, t in CELLS.items()}

_HOLD = None  # next-state leaf: the flop keeps its value (enable off)


def _if(pin: str, letter: str, then, other):
    """``if (pin is active) then else other``; ``letter`` is the polarity."""
    return ("if", pin, letter == "P", then, other)


def _reset(pin: str, letter: str, value: str, other):
    return _if(pin, letter, f"1'b{value}", other)


#: Flip-flop cells: name pattern (polarity letters in the order of the name)
#: -> (ports other than Q, next-state tree). Priorities as in simcells.v:
#: reset over set over enable; ``$_SDFFCE_``: enable over reset.
FLOP_FAMILIES = [
    (r"FF", "D", lambda: "D"),
    (r"DFF_[NP]", "CD", lambda: "D"),
    (r"DFF_[NP]([NP])([01])", "CRD", lambda r, v: _reset("R", r, v, "D")),
    (r"SDFF_[NP]([NP])([01])", "CRD", lambda r, v: _reset("R", r, v, "D")),
    (r"DFFE_[NP]([NP])", "CED", lambda e: _if("E", e, "D", _HOLD)),
    (r"(?:DFFE|SDFFE)_[NP]([NP])([01])([NP])", "CRED",
     lambda r, v, e: _reset("R", r, v, _if("E", e, "D", _HOLD))),
    (r"SDFFCE_[NP]([NP])([01])([NP])", "CRED",
     lambda r, v, e: _if("E", e, _reset("R", r, v, "D"), _HOLD)),
    (r"DFFSR_[NP]([NP])([NP])", "CSRD",
     lambda s, r: _reset("R", r, "0", _reset("S", s, "1", "D"))),
    (r"DFFSRE_[NP]([NP])([NP])([NP])", "CSRED",
     lambda s, r, e: _reset("R", r, "0", _reset("S", s, "1",
                                                _if("E", e, "D", _HOLD)))),
    (r"ALDFF_[NP]([NP])", ("C", "L", "AD", "D"), lambda ld: _if("L", ld, "AD", "D")),
    (r"ALDFFE_[NP]([NP])([NP])", ("C", "L", "AD", "E", "D"),
     lambda ld, e: _if("L", ld, "AD", _if("E", e, "D", _HOLD))),
]
_FLOPS = [(re.compile(rf"\$_{pat}_\Z"), tuple(pins), tree)
          for pat, pins, tree in FLOP_FAMILIES]


def _flop(kind: str):
    """(ports, next-state tree) of a flip-flop cell, or ``None``."""
    for pat, pins, tree in _FLOPS:
        m = pat.match(kind)
        if m:
            return pins, tree(*m.groups())
    return None


def _unknown(kind: str) -> str:
    if re.match(r"\$_(?:DLATCH|SR)", kind):
        return (f"yosys latch cell {kind!r} is not supported (only flip-flops are "
                "cut into pseudo inputs)")
    if kind == "$_TBUF_":
        return "yosys tri-state buffer '$_TBUF_' is not supported"
    if not kind.startswith("$_"):
        return (f"coarse-grained yosys cell {kind!r}: map the design to gate "
                "cells first (yosys: synth, or techmap; opt)")
    return (f"unknown yosys cell {kind!r} (read: the gate and flip-flop cells of "
            "yosys's simcells.v, e.g. $_AND_, $_MUX_, $_AOI3_, $_DFF_P_, "
            "$_SDFFE_PP0P_)")


# --------------------------------------------------------------------------- #
# Building gates
def _gate(v, gate: str, fanin: tuple[int, ...], out: str | None, offset: int) -> int:
    b = v.b
    if out is None:  # derived name, as the assign expression parser makes
        base = f"{gate}_" + "_".join(b.names[i] for i in fanin)
        out = b.fresh(base[:_nl._MAX_DERIVED_NAME])
    return b.drive(out, gate, fanin, offset)


def _not(v, node: int, offset: int) -> int:
    # One inverter per net: a reset read by a thousand flops is inverted once.
    cache = v.__dict__.setdefault("_yosys_not", {})
    if node not in cache:
        cache[node] = _gate(v, "not", (node,), None, offset)
    return cache[node]


def _mux(v, sel: int, one: int, zero: int, offset: int, out: str | None = None,
         invert: bool = False) -> int:
    """``sel ? one : zero`` (complemented if ``invert``) as and/or/not gates,
    folding a constant data input."""
    types, c0, c1 = v.b.types, _nl.TYPE_ID["const0"], _nl.TYPE_ID["const1"]
    if one == zero:
        if out is None and not invert:
            return one
        gate, fanin = "buf", (one,)
    elif types[one] == c1:
        gate, fanin = "or", (sel, zero)
    elif types[one] == c0:
        gate, fanin = "and", (_not(v, sel, offset), zero)
    elif types[zero] == c0:
        gate, fanin = "and", (sel, one)
    elif types[zero] == c1:
        gate, fanin = "or", (_not(v, sel, offset), one)
    else:
        gate, fanin = "or", (_gate(v, "and", (sel, one), None, offset),
                             _gate(v, "and", (_not(v, sel, offset), zero), None,
                                   offset))
    if invert:
        gate = {"buf": "not", "or": "nor", "and": "nand"}[gate]
    return _gate(v, gate, fanin, out, offset)


def _build(v, tree, leaf: dict, out: str | None, offset: int) -> int:
    """Gates of a :data:`CELLS` tree over ``leaf`` (pin -> node)."""
    if isinstance(tree, str):
        return leaf[tree]
    gate, *args = tree
    fanin = tuple(_build(v, a, leaf, None, offset) for a in args)
    if gate in ("mux", "nmux"):
        return _mux(v, *fanin, offset, out, invert=gate == "nmux")
    return _gate(v, gate, fanin, out, offset)


def _next_state(v, tree, leaf: dict, q: int, offset: int) -> int:
    """The node of a flop's next state: ``tree`` of ``("if", cond, active_high,
    then, else)`` over pins (``leaf``), nodes, constants and :data:`_HOLD`."""
    if tree is _HOLD:
        return q
    if isinstance(tree, int):
        return tree
    if isinstance(tree, str):
        return leaf[tree] if tree in leaf else v.const(tree, offset)
    _, cond, high, then, other = tree
    cond = leaf[cond] if isinstance(cond, str) else cond
    one = _next_state(v, then, leaf, q, offset)
    zero = _next_state(v, other, leaf, q, offset)
    return _mux(v, cond, one, zero, offset) if high else \
        _mux(v, cond, zero, one, offset)


# --------------------------------------------------------------------------- #
# write_verilog -noexpr: cell instances
def cell(v, kind: str, rest: str, stmt: str, offset: int) -> None:
    """Read the instances of yosys cell ``kind`` (``$_AND_``, ``$_DFF_P_``)."""
    b = v.b
    if rest.lstrip().startswith("#"):
        raise b.error(f"coarse-grained yosys cell {kind!r} with parameters: map "
                      "the design to gate cells first (yosys: synth, or techmap; "
                      "opt)", offset, stmt)
    tree, flop = CELLS.get(kind), None
    if tree is not None:
        pins = _CELL_PINS[kind]
    else:
        flop = _flop(kind)
        if flop is None:
            raise b.error(_unknown(kind), offset, stmt)
        pins = flop[0] + ("Q",)
    for inst, body in v.ports(rest, stmt, offset):
        name = f"{inst or 'instance'} of yosys cell {kind!r}"
        conn = {pin: net.strip() for pin, net in _nl._NAMED.findall(body)}
        if not conn or _nl._NAMED.sub("", body).replace(",", "").strip():
            raise b.error(f"{name} needs named ports (.A(...), .Y(...))", offset, stmt)
        extra = sorted(set(conn) - set(pins))
        if extra:
            raise b.error(f"{name} has no port {extra[0]!r} (ports: "
                          f"{', '.join(pins)})", offset, stmt)
        missing = [p for p in pins if not conn.get(p)]
        if missing:
            raise b.error(f"{name} has no connection for port "
                          f"{', '.join(missing)}", offset, stmt)
        out = conn["Y" if flop is None else "Q"]
        if not _nl._IDENT_RE.match(out):
            raise b.error(f"{name}: bad output net {out!r}", offset, stmt)
        # The clock is not read: clock nets stay inputs, as for other flops.
        leaf = {p: v.operand(conn[p], stmt, offset) for p in pins[:-1]
                if flop is None or p != "C"}
        if flop is None:
            _build(v, tree, leaf, v.name(out), offset)
        else:
            q = b.drive(v.name(out), "ppi", (), offset)
            b.flops.append((inst or kind, _next_state(v, flop[1], leaf, q, offset),
                            q))


# --------------------------------------------------------------------------- #
# write_verilog: attributes, reg declarations, always blocks
#: Keywords of an always block (``write_verilog -sv`` prints ``always_ff``).
ALWAYS = ("always", "always_ff", "always_comb", "always_latch")


_ATTR = re.compile(r'\(\*(?:[^*"]|"(?:[^"\\\n]|\\.)*"|\*(?!\)))*\*\)')
_STAR_PAREN = re.compile(r"\s*\)")  # `@(*)` is not an attribute
_WORD = re.compile(r"\s*([A-Za-z_][\w$]*)")


def strip_attributes(text: str, file: str | None) -> str:
    """``text`` without Verilog attributes ``(* ... *)``, newlines kept."""
    out, pos = [], 0
    while (i := text.find("(*", pos)) >= 0:
        if _STAR_PAREN.match(text, i + 2):
            out.append(text[pos:i + 2])
            pos = i + 2
            continue
        m = _ATTR.match(text, i)
        if m is None:
            raise _nl.NetlistError("unclosed attribute '(*'", file,
                                   text.count("\n", 0, i) + 1, text[i:i + 60])
        out.append(text[pos:i])
        out.append("\n" * text.count("\n", i, m.end()) or " ")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def join_else(stmts: list[str]) -> list[str]:
    """``stmts`` (split at ``;``) with each ``else ...`` glued back onto the
    ``always`` block it continues."""
    out: list[list[str]] = []
    in_always = False
    for s in stmts:
        m = _WORD.match(s)
        word = m.group(1) if m else ""
        if word == "else" and in_always:
            out[-1].append(s)
            continue
        in_always = word in ALWAYS
        out.append([s])
    return [";".join(parts) for parts in out]


def declare_regs(v, rest: str, stmt: str, offset: int) -> None:
    """``reg q;``, ``reg [3:0] q = 4'h0;``: remember the bits an ``always``
    block may drive (the initial value carries no structure)."""
    rest = re.sub(r"\b(?:signed|unsigned)\b", " ", rest)
    names = ",".join(p.split("=", 1)[0] for p in _nl._split_top(rest))
    v.regs.update(v.decl_names(names, offset))


def wire(v, rest: str, stmt: str, offset: int) -> None:
    """``wire [3:0] x;`` records the bus's bits (so ``assign y = x`` can
    connect them); ``wire w = expr;`` (yosys: a constant reset net) drives w."""
    rest = re.sub(r"\b(?:signed|unsigned)\b", " ", rest).strip()
    m = _nl._RANGE.match(rest)
    if m:
        rng = _range(v, m.group(1), m.group(2), stmt, offset)
        rest = rest[m.end():]
        for item in _nl._split_top(rest):
            name = item.split("=", 1)[0].strip()
            if not _nl._IDENT_RE.match(name):
                raise v.b.error(f"bad identifier {name!r} in declaration", offset,
                                stmt)
            v.buses[v.name(name)] = rng
    if "=" in rest:
        v.assign(rest, stmt, offset)


def _range(v, hi: str, lo: str, stmt: str, offset: int) -> tuple[int, int]:
    # Length first: int() of thousands of digits is slow or refused.
    if max(len(hi), len(lo)) > 9:
        raise v.b.error(f"bus range [{hi}:{lo}] is too wide (at most "
                        f"{_nl.MAX_BUS_BITS} nets)", offset, stmt)
    return int(hi), int(lo)


_SELECT = re.compile(r"([A-Za-z_][\w$]*)\s*\[\s*(\d+)\s*(?::\s*(\d+)\s*)?\]\Z")
_SIZED = re.compile(r"(\d+)\s*'\s*([bBhHdDoO])\s*([0-9a-fA-FxXzZ_]+)\Z")
_DIGIT_BITS = {"b": 1, "o": 3, "h": 4}


def is_bus_assign(v, lhs: str, rhs: str) -> bool:
    """Whether ``assign lhs = rhs`` connects buses (``assign y = a;`` with
    ``a`` declared ``[3:0]``, part selects, ``{...}``), as yosys writes a
    module's connections."""
    if "{" in lhs or "{" in rhs or ":" in lhs or v.name(lhs) in v.buses:
        return True
    r = rhs.strip()
    m = _SELECT.match(r)
    if m:
        return m.group(3) is not None
    return _nl._IDENT_RE.match(r) is not None and v.name(r) in v.buses


def bus_assign(v, lhs: str, rhs: str, stmt: str, offset: int) -> None:
    """Connect bus ``lhs`` bit by bit to ``rhs``, each bit a ``buf`` as
    ``assign y = x`` is; both sides are yosys sigspecs (names, bit and part
    selects, sized constants, ``{...}`` concatenations)."""
    try:
        left = _sigspec(v, lhs, stmt, offset)
        right = _sigspec(v, rhs, stmt, offset)
    except RecursionError:
        raise v.b.error("concatenation nested too deeply", offset, stmt) from None
    if len(left) != len(right):
        raise v.b.error(f"assign connects {len(right)} bits to {len(left)}",
                        offset, stmt)
    for dst, src in zip(left, right):
        if not _nl._IDENT_RE.match(dst):
            raise v.b.error(f"bad assign target {dst!r}", offset, stmt)
        v.b.drive(v.name(dst), "buf", (v.operand(src, stmt, offset),), offset)


def _bits(v, width: int, stmt: str, offset: int) -> None:
    # Expanded bits count against the cap declared buses have, so that a
    # huge declared range cannot expand into billions of nets.
    v.bus_bits += width
    if v.bus_bits > _nl.MAX_BUS_BITS:
        raise v.b.error(f"bus connections bring the bus nets to {v.bus_bits}, more "
                        f"than the {_nl.MAX_BUS_BITS} this reader accepts", offset,
                        stmt)


def _sigspec(v, text: str, stmt: str, offset: int) -> list[str]:
    """The bit tokens of a sigspec, most significant first."""
    text = text.strip()
    if text.startswith("{"):
        if not text.endswith("}"):
            raise v.b.error(f"bad concatenation {text[:40]!r}", offset, stmt)
        out: list[str] = []
        for item in _nl._split_top(text[1:-1]):
            out.extend(_sigspec(v, item, stmt, offset))
        return out
    m = _SIZED.match(text)
    if m:
        return _constant(v, m, stmt, offset)
    m = _SELECT.match(text)
    if m and m.group(3) is None:
        return [text]
    if m:
        hi, lo = _range(v, m.group(2), m.group(3), stmt, offset)
        base = m.group(1)
    elif _nl._IDENT_RE.match(text):
        if v.name(text) not in v.buses:
            return [text]
        (hi, lo), base = v.buses[v.name(text)], text
    else:
        raise v.b.error(f"cannot read {text!r} as a connection (names, bit and "
                        "part selects, constants, {...}); map the design to gate "
                        "cells first (yosys: synth, or techmap; opt)", offset, stmt)
    _bits(v, abs(hi - lo) + 1, stmt, offset)
    step = -1 if hi >= lo else 1
    return [f"{base}[{k}]" for k in range(hi, lo + step, step)]


def _constant(v, m: re.Match, stmt: str, offset: int) -> list[str]:
    width = int(m.group(1)) if len(m.group(1)) <= 9 else _nl.MAX_BUS_BITS + 1
    _bits(v, width, stmt, offset)
    base, digits = m.group(2).lower(), m.group(3).replace("_", "").lower()
    if "x" in digits or "z" in digits or not digits or \
            set(digits) - _nl._DIGITS[base] or (base == "d" and len(digits) > 30):
        raise v.b.error(f"constant {m.group(0)!r} is not a 0/1 number", offset, stmt)
    if base == "d":
        bits = format(int(digits), "b")
    else:
        k = _DIGIT_BITS[base]
        bits = "".join(format(int(d, 16), f"0{k}b") for d in digits)
    bits = bits[-width:].rjust(width, "0")
    return [f"1'b{b}" for b in bits]


_SENS = re.compile(r"\s*@\s*\(([^()]*)\)")
_STAR = re.compile(r"\s*@\s*(?:\*|\(\s*\*\s*\))")
_EDGE = re.compile(r"(?:posedge|negedge)\s+\S+\Z")


def always(v, kw: str, rest: str, stmt: str, offset: int) -> None:
    """A flip-flop ``always`` block as yosys prints it (``rest`` follows the
    keyword ``kw``; ``stmt`` holds the block, its ``else`` parts joined)."""
    block = _Block(v, stmt, offset)
    if kw in ("always_comb", "always_latch"):
        raise block.refuse(f"'{kw}' is combinational logic or a latch")
    if _STAR.match(rest):
        raise block.refuse("'always @*' is combinational logic or a latch")
    m = _SENS.match(rest)
    if m is None:
        raise block.refuse("expected a sensitivity list '@(posedge clk)'")
    for item in re.split(r",|\bor\b", m.group(1)):
        if not _EDGE.match(item.strip()):
            raise block.refuse(f"{item.strip()!r} in the sensitivity list is not "
                               "a clock or reset edge (posedge x, negedge x)")
    block.text, block.base = rest[m.end():], offset + len(kw) + m.end()
    try:
        tree = block.statement()
        block.finish()
        q = v.b.drive(block.target, "ppi", (), offset)
        d = _next_state(v, tree, {}, q, offset)
    except RecursionError:
        raise block.refuse("if/else nested too deeply") from None
    v.b.flops.append((block.target, d, q))


class _Block:
    """Recursive descent over an always block's body: ``if (c) s [else s]``
    and ``q <= expr``, into a next-state tree for :func:`_next_state`."""

    def __init__(self, v, stmt: str, offset: int):
        self.v, self.stmt, self.offset = v, stmt, offset
        self.text, self.base, self.pos = "", offset, 0
        self.target: str | None = None

    def refuse(self, why: str, at: int | None = None):
        return self.v.b.error(
            f"behavioral 'always' block is not a flip-flop this reader supports: "
            f"{why} (it reads the flip-flops yosys's write_verilog prints: "
            "always @(posedge clk ...) with if/else and q <= d)",
            self.offset if at is None else at, self.stmt)

    def here(self) -> int:
        return self.base + self.pos

    def word(self) -> str:
        m = _WORD.match(self.text, self.pos)
        return m.group(1) if m else ""

    def skip(self, word: str) -> None:
        self.pos = _WORD.match(self.text, self.pos).end()

    def statement(self):
        word = self.word()
        if word == "begin":
            raise self.refuse("begin/end blocks", self.here())
        if word != "if":
            return self.assignment()
        self.skip(word)
        cond, high = self.condition()
        then = self.statement()
        other = _HOLD
        if self.word() == "else":
            self.skip("else")
            other = self.statement()
        return ("if", cond, high, then, other)

    def condition(self) -> tuple[int, bool]:
        text = self.text
        start = len(text) - len(text[self.pos:].lstrip())
        at = self.base + start
        if text[start:start + 1] != "(":
            raise self.refuse("expected '(' after 'if'", at)
        depth, end = 0, start
        while end < len(text):
            depth += text[end] == "("
            depth -= text[end] == ")"
            if depth == 0:
                break
            end += 1
        if depth:
            raise self.refuse("missing ')' in an if condition", at)
        self.pos = end + 1
        cond, high = text[start + 1:end].strip(), True
        for op in ("==", "!="):  # if (R == 0), as simcells.v writes it
            left, _, right = cond.partition(op)
            right = right.strip().rstrip("_")
            if right in ("0", "1") or (_nl._CONST.match(right) and
                                       right[-1] in "0123456789abcdefABCDEF"):
                # bit 0 of the constant: bases 2, 8, 10, 16 are even
                high = bool(int(right[-1], 16) & 1) == (op == "==")
                cond = left.strip()
                break
        while cond[:1] in ("!", "~") and _nl._IDENT_RE.match(cond[1:].strip()):
            high, cond = not high, cond[1:].strip()  # if (!rst): no inverter
        return node_of(self.v, cond, self.stmt, at), high

    def assignment(self) -> int:
        text = self.text
        self.pos = len(text) - len(text[self.pos:].lstrip())  # errors: its line
        at = self.here()
        end = text.find(";", self.pos)
        end = len(text) if end < 0 else end
        chunk = text[self.pos:end]
        self.pos = min(end + 1, len(text))
        if "<=" not in chunk:
            if "=" in chunk:
                raise self.refuse("a blocking assignment '='", at)
            raise self.refuse(f"cannot parse {chunk.strip()!r}", at)
        lhs, rhs = chunk.split("<=", 1)
        lhs = lhs.strip()
        if not _nl._IDENT_RE.match(lhs):
            raise self.refuse(f"bad assignment target {lhs!r}", at)
        name = self.v.name(lhs)
        if name not in self.v.regs:
            if any(r.startswith(name + "[") for r in self.v.regs):
                raise self.refuse(f"{name!r} is a multi-bit register; map the "
                                  "design to gate cells first (yosys: synth, or "
                                  "techmap; opt)", at)
            raise self.refuse(f"{name!r} is not declared 'reg'", at)
        if self.target not in (None, name):
            raise self.refuse(f"it assigns both {self.target!r} and {name!r}", at)
        self.target = name
        return node_of(self.v, rhs, self.stmt, at)

    def finish(self) -> None:
        rest = self.text[self.pos:]
        if rest.strip():
            raise self.refuse(f"unexpected {rest.strip()[:30]!r} after the block's "
                              "statement (one register per block)", self.here())
        if self.target is None:
            raise self.refuse("it assigns nothing")


# --------------------------------------------------------------------------- #
# Expressions with ?:
class _Subs:
    """The reader as :class:`_Expr` sees it, with placeholder operands: the
    nets already built for parenthesised ``(s ? b : a)`` groups."""

    def __init__(self, v, subs: dict[str, int]):
        self.v, self.b, self.subs = v, v.b, subs

    def operand(self, tok: str, stmt: str, offset: int) -> int:
        i = self.subs.get(tok.strip())
        return self.v.operand(tok, stmt, offset) if i is None else i


def node_of(v, text: str, stmt: str, offset: int) -> int:
    """The node of expression ``text`` (an operand, or new gates)."""
    if "?" in text:
        return conditional(v, text, stmt, offset)
    return _expr(v, text, stmt, offset, None, None)


def _expr(v, text, stmt, offset, target, subs) -> int:
    e = _nl._Expr(_Subs(v, subs) if subs else v, v.tokens(text, stmt, offset),
                  target, stmt, offset)
    if target is None:
        return e.materialise(e.parse())
    e.run()
    return v.b.index[target]


def conditional(v, rhs: str, stmt: str, offset: int, target: str | None = None):
    """An expression with ``?:``, driving ``target`` (or a new net): returns
    its node. ``s ? b : a`` is ``(s & b) | (~s & a)``."""
    prefix = "_ysq"
    while prefix in rhs:
        prefix += "x"
    subs: dict[str, int] = {}
    # One pass, innermost first: a parenthesised group holding a '?' becomes
    # a placeholder for the net built for it; the rest stays text for _Expr.
    stack: list[list[str]] = [[]]
    has_q = [False]
    for part in re.split(r"([()?])", rhs):
        if part == "(":
            stack.append([])
            has_q.append(False)
        elif part == ")":
            if len(stack) == 1:
                raise v.b.error("unbalanced ')' in expression", offset, stmt)
            inner = "".join(stack.pop())
            if has_q.pop():
                name = f"{prefix}{len(subs)}"
                subs[name] = _chain(v, inner, stmt, offset, None, subs)
                stack[-1].append(f" {name} ")
            else:
                stack[-1].append(f"({inner})")
        else:
            has_q[-1] |= part == "?"
            stack[-1].append(part)
    if len(stack) > 1:
        raise v.b.error("missing ')' in expression", offset, stmt)
    return _chain(v, "".join(stack[0]), stmt, offset, target, subs)


def _chain(v, text, stmt, offset, target, subs) -> int:
    """``c ? t : e`` with every ``?`` outside parentheses, right-associative
    (``a ? b : c ? d : e`` is ``a ? b : (c ? d : e)``), without recursion."""
    parts = re.split(r"([?:])", text)
    frames: list[list] = []  # [condition, then-node or None]
    cur = parts[0]
    for op, nxt in zip(parts[1::2], parts[2::2]):
        if op == "?":
            frames.append([_expr(v, cur, stmt, offset, None, subs), None])
        else:
            val = _expr(v, cur, stmt, offset, None, subs)
            while frames and frames[-1][1] is not None:  # a finished a ? b : c
                sel, one = frames.pop()
                val = _mux(v, sel, one, val, offset)
            if not frames:
                raise v.b.error("':' without '?' in expression", offset, stmt)
            frames[-1][1] = val
        cur = nxt
    if not frames:
        return _expr(v, cur, stmt, offset, target, subs)
    val = _expr(v, cur, stmt, offset, None, subs)
    while frames:
        sel, one = frames.pop()
        if one is None:
            raise v.b.error("'?' without ':' in expression", offset, stmt)
        val = _mux(v, sel, one, val, offset, target if not frames else None)
    return val


_nl._yosys = sys.modules[__name__]  # the Verilog reader's hooks (see .netlist)
