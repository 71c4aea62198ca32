"""Fast reader for gate-level netlists: structural Verilog and ISCAS ``.bench``.

The graph has one node per net (primary input, gate output, ``assign`` target,
constant tie) and directed edges fanin -> gate, the convention of DeepGate and
of circuitgraph. Flip-flops are cut: a flip-flop's Q net becomes a pseudo
primary input (type ``ppi``, no fanin) and its D net a pseudo primary output,
so a sequential netlist becomes its combinational core. Clock nets stay primary
inputs. ``assign`` expressions (``~ & | ^`` and parentheses) create one node
per operator occurrence, and ``assign y = x`` a ``buf``, as circuitgraph does.
Yosys's output is read too (:mod:`.yosys`): ``write_verilog -noexpr`` gate
cells (``\\$_AND_``, ``\\$_DFF_P_``, ...), and the default shape's ``?:``,
flip-flop ``always`` blocks, bus connections and ``(* ... *)`` attributes.

The reader works statement by statement with a handful of regular
expressions; it reads the 8.7 MB ITC-99 ``b19`` in about a second on one core,
about 9-12x faster than circuitgraph's parser (``benchmarks/circuits.py``), which
the tests use as the independent oracle.

Errors are :class:`NetlistError` with the file, line and offending text
(``FILE:LINE: message: 'text'``). Hostile input is bounded: expressions are
parsed without recursion, bus declarations may hold at most
:data:`MAX_BUS_BITS` nets, an unclosed ``/*`` or a bad number literal names its
line, and an empty netlist is refused when it is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GATE_TYPES",
    "FLOP_CELLS",
    "MAX_BUS_BITS",
    "NETLIST_SUFFIXES",
    "NetlistError",
    "Netlist",
    "read_netlist",
    "read_text",
    "parse_verilog",
    "parse_bench",
]

#: the reader of yosys's constructs, :mod:`.yosys`: it builds on this
#: module's lexer and expression builder, so it installs itself here when the
#: package is imported (``leangnn.circuits`` imports it) rather than being
#: imported by this module
_yosys: Any = None

#: Node types, in the order of the one-hot feature columns.
GATE_TYPES = ("input", "ppi", "const0", "const1", "buf", "not", "and", "nand",
              "or", "nor", "xor", "xnor")
TYPE_ID = {t: i for i, t in enumerate(GATE_TYPES)}
_PRIMITIVES = {"buf", "not", "and", "nand", "or", "nor", "xor", "xnor"}
_BENCH_GATES = {**{g.upper(): g for g in _PRIMITIVES}, "BUFF": "buf"}

#: Most nets all bus declarations (``input [N-1:0] a``) of one file may
#: declare; beyond it a file is taken as hostile or corrupt, not as a netlist.
MAX_BUS_BITS = 1 << 20

#: Flip-flop cells known by name: cell -> (D-like pins, Q-like pins). Cells
#: defined in the same file with ``always @(posedge ...)`` are recognised too.
FLOP_CELLS = {
    "ff": (("D", "d"), ("Q", "q")),
    "dff": (("D", "d"), ("Q", "q")),
    "flopd": (("D",), ("Q",)),
    "fflopd": (("D",), ("Q",)),
    "flopdrs": (("D",), ("Q",)),
    "fflopdrs": (("D",), ("Q",)),
    "GTECH_FD1": (("D",), ("Q", "QN")),
    "GTECH_FD2": (("D",), ("Q", "QN")),
    "GTECH_FD3": (("D",), ("Q", "QN")),
}


class NetlistError(ValueError):
    """A netlist that cannot be read, with the file, line and offending text."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 text: str | None = None):
        self.message, self.file, self.line, self.text = message, file, line, text
        where = f"{file or '<string>'}"
        if line is not None:
            where += f":{line}"
        snippet = ""
        if text:
            text = " ".join(text.split())
            snippet = f": {text[:120]!r}" + ("..." if len(text) > 120 else "")
        super().__init__(f"{where}: {message}{snippet}")


@dataclass
class Netlist:
    """A parsed netlist as flat arrays (CSR fanin lists).

    Attributes:
        name: module name (or file stem for ``.bench``).
        names: node names; node ``i`` is net ``names[i]``.
        types: ``int8 [N]`` index into :data:`GATE_TYPES`.
        fanin_ptr, fanin_idx: CSR fanin lists, node ``i`` reads
            ``fanin_idx[fanin_ptr[i]:fanin_ptr[i+1]]`` in pin order.
        outputs: indices of primary outputs.
        flops: ``(instance, d_node, q_node)`` per flip-flop.
        path: the file it came from, if any.
        lines: ``int64 [N]`` 1-based source line of the statement that drives
            node ``i`` (or first reads it), ``0`` where unknown; ``None`` when
            the netlist did not come from text. Errors found after parsing
            (a combinational loop in :func:`~leangnn.circuits.levelize`) use
            it to name the line.
    """

    name: str
    names: list[str]
    types: np.ndarray
    fanin_ptr: np.ndarray
    fanin_idx: np.ndarray
    outputs: np.ndarray
    flops: list[tuple[str, int, int]] = field(default_factory=list)
    path: str | None = None
    lines: np.ndarray | None = None

    def line_of(self, node: int) -> int | None:
        """Source line of ``node``'s driver, or ``None`` when unknown."""
        if self.lines is None or not 0 <= node < len(self.lines):
            return None
        return int(self.lines[node]) or None

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return int(self.fanin_idx.size)

    @property
    def inputs(self) -> np.ndarray:
        return np.flatnonzero(self.types == TYPE_ID["input"])

    @property
    def pseudo_inputs(self) -> np.ndarray:
        return np.flatnonzero(self.types == TYPE_ID["ppi"])

    @property
    def pseudo_outputs(self) -> np.ndarray:
        return np.asarray(sorted({d for _, d, _ in self.flops}), dtype=np.int64)

    def edge_index(self) -> np.ndarray:
        """``int64 [2, E]`` edges fanin -> gate."""
        dst = np.repeat(np.arange(self.num_nodes), np.diff(self.fanin_ptr))
        return np.stack([self.fanin_idx, dst])

    def __repr__(self) -> str:
        return (f"Netlist({self.name!r}, nodes={self.num_nodes}, "
                f"edges={self.num_edges}, flops={len(self.flops)})")


class _Builder:
    """Collects nets and drivers, then freezes them into a :class:`Netlist`."""

    def __init__(self, file: str | None, text: str, stmt_end: str = ";"):
        self.file, self.text = file, text
        self.stmt_end = stmt_end  # what ends a statement: the error snippet's end
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.types: list[int] = []
        self.fanins: list[tuple[int, ...] | None] = []
        self.where: list[int] = []  # text offset of the driver (or first use)
        self.outputs: list[tuple[str, int]] = []
        self.flops: list[tuple[str, int, int]] = []
        self.next_suffix: dict[str, int] = {}

    def line_of(self, offset: int) -> int:
        return self.text.count("\n", 0, offset) + 1

    def error(self, message: str, offset: int, snippet: str | None = None):
        if snippet is None:
            end = self.text.find(self.stmt_end, offset)
            snippet = self.text[offset:end if end >= 0 else offset + 80]
        return NetlistError(self.unhide(message), self.file, self.line_of(offset),
                            self.unhide(snippet))

    def unhide(self, text: str) -> str:
        """Text as the user wrote it (the Verilog reader renames escaped ids)."""
        return text

    def net(self, name: str, offset: int) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
            self.types.append(-1)
            self.fanins.append(None)
            self.where.append(offset)
        return i

    def drive(self, name: str, gate: str, fanin: tuple[int, ...], offset: int) -> int:
        i = self.net(name, offset)
        if self.types[i] != -1:
            raise self.error(
                f"net {name!r} has two drivers (first driven at line "
                f"{self.line_of(self.where[i])})", offset)
        self.types[i] = TYPE_ID[gate]
        self.fanins[i] = fanin
        self.where[i] = offset
        return i

    def fresh(self, base: str) -> str:
        # Same names as probing base, base_0, base_1, ... from 0 each time,
        # but resumed where the last probe for ``base`` stopped: nets are
        # never removed, so the skipped names are still taken, and thousands
        # of copies of one expression stay linear instead of quadratic.
        if base not in self.index:
            return base
        k = self.next_suffix.get(base, 0)
        while f"{base}_{k}" in self.index:
            k += 1
        self.next_suffix[base] = k + 1
        return f"{base}_{k}"

    def lines(self) -> np.ndarray:
        """1-based line of every node's ``where`` offset, vectorized."""
        where = np.asarray(self.where, dtype=np.int64)
        text = self.text
        if text.isascii():
            nl = np.flatnonzero(np.frombuffer(text.encode("ascii"), np.uint8) == 10)
        else:
            nl = np.fromiter((m.start() for m in re.finditer("\n", text)), np.int64)
        return np.searchsorted(nl, where, side="left").astype(np.int64) + 1

    def build(self, name: str) -> Netlist:
        if not self.names:
            raise NetlistError("no gates/nets: the netlist is empty", self.file)
        types = np.asarray(self.types, dtype=np.int8)
        undriven = np.flatnonzero(types == -1)
        if undriven.size:
            i = int(undriven[0])
            more = f" (and {undriven.size - 1} more)" if undriven.size > 1 else ""
            raise self.error(f"undriven net {self.names[i]!r}{more}: it is read but "
                             "no gate, assign, input or flip-flop drives it",
                             self.where[i])
        counts = np.fromiter((len(f) for f in self.fanins), np.int64, len(self.fanins))
        ptr = np.zeros(len(self.names) + 1, dtype=np.int64)
        np.cumsum(counts, out=ptr[1:])
        idx = np.fromiter((j for f in self.fanins for j in f), np.int64, int(ptr[-1]))
        outs = []
        for o, off in self.outputs:
            if o not in self.index:
                raise self.error(f"output {o!r} is declared but never driven", off)
            outs.append(self.index[o])
        outputs = np.asarray(sorted(set(outs)), dtype=np.int64)
        return Netlist(name, self.names, types, ptr, idx, outputs, self.flops,
                       self.file, self.lines())


# --------------------------------------------------------------------------- #
# Verilog
_COMMENT_START = re.compile(r"//|/\*")
_ESCAPED = re.compile(r"\\(\S+)")
_IDENT = r"[A-Za-z_][\w$]*(?:\s*\[\s*\d+\s*\])?"
_MODULE = re.compile(r"\bmodule\s+(" + r"[A-Za-z_][\w$]*" + r")\s*(?:\(|;)")
_KEYWORD = re.compile(r"\s*([A-Za-z_][\w$]*)")
_ANSI_DIR = re.compile(r"\b(input|output|inout)\b")
_ANSI_KIND = re.compile(r"\b(?:wire|logic|reg|tri|signed|unsigned)\b")
# Each whitespace run has one way to match (no `\s*name?\s*`, no lazy
# `[^()]*?\s*`), so a failing match is linear, not quadratic in the run.
_INSTANCE = re.compile(r"\s*(?:([A-Za-z_][\w$]*)\s*)?\(((?:[^()]|\([^()]*\))*)\)"
                       r"\s*(,|$)")
_NAMED = re.compile(r"\.\s*([A-Za-z_][\w$]*)\s*\(([^()]*)\)")
_ALWAYS = re.compile(r"\balways\b")
_RANGE = re.compile(r"\[\s*(\d+)\s*:\s*(\d+)\s*\]")
_IDENT_RE = re.compile(_IDENT + r"\Z")
_CONST = re.compile(r"(\d*)'\s*([bBhHdDoO])\s*([0-9a-fA-FxXzZ_]+)\Z")
_DIGITS = {"b": set("01"), "o": set("01234567"), "d": set("0123456789"),
           "h": set("0123456789abcdef")}
_TOKEN = re.compile(r"\s*(?:(" + _IDENT + r")|(\d*'\s*[bBhHdDoO]\s*[0-9a-fA-FxXzZ_]+)"
                    r"|([~&|^()!]))")


def _strip_comments(text: str, file: str | None) -> str:
    # One linear scan with str.find: a non-greedy regex rescans to the end of
    # the text from every unclosed '/*', quadratic on a file full of them.
    # Every newline is kept so line numbers in errors stay right.
    out, pos = [], 0
    while (m := _COMMENT_START.search(text, pos)) is not None:
        out.append(text[pos:m.start()])
        if m.group(0) == "//":
            end = text.find("\n", m.end())
            end = len(text) if end < 0 else end
            out.append(" ")
        else:
            end = text.find("*/", m.end())
            if end < 0:
                raise NetlistError("unclosed block comment '/*'", file,
                                   text.count("\n", 0, m.start()) + 1,
                                   text[m.start():m.start() + 60])
            end += 2
            out.append("\n" * text.count("\n", m.start(), end) or " ")
        pos = end
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _ident(tok: str) -> str:
    return "".join(tok.split()) if " " in tok or "\n" in tok else tok


class _Verilog:
    def __init__(self, text: str, file: str | None):
        text = _strip_comments(text, file)
        if "(*" in text:  # yosys writes (* src = "..." *) on every statement
            text = _yosys.strip_attributes(text, file)
        self.bus_bits = 0
        self.regs: set[str] = set()  # declared ``reg`` bits: flip-flop targets
        self.buses: dict[str, tuple[int, int]] = {}  # bus -> (msb, lsb) index
        self.escaped: dict[str, str] = {}
        if "\\" in text:
            text = self._hide_escaped(text)
        self.b = _Builder(file, text)
        self.text = text
        if self.escaped:
            # An alias is the prefix plus digits, always followed by the
            # whitespace that ended the escaped identifier.
            alias = re.compile(re.escape(self.prefix) + r"\d+")
            self.b.unhide = lambda s: alias.sub(
                lambda m: self.escaped.get(m.group(0), m.group(0)), s)

    def _hide_escaped(self, text: str) -> str:
        # Escaped identifiers (\a[0] ) may hold any printable character; swap
        # each for a plain identifier so the statement regexes stay simple and
        # fast. Newlines are untouched, so line numbers survive.
        prefix = "_esc_"
        while prefix in text:
            prefix += "x"
        self.prefix = prefix
        table: dict[str, str] = {}

        def swap(m: re.Match) -> str:
            key = m.group(1)
            alias = table.get(key)
            if alias is None:
                alias = table[key] = f"{prefix}{len(table)}"
                self.escaped[alias] = "\\" + key
            return alias

        return _ESCAPED.sub(swap, text)

    def name(self, tok: str) -> str:
        tok = _ident(tok)
        got = self.escaped.get(tok)
        if got is None and self.escaped and tok.endswith("]"):
            base, _, sel = tok.partition("[")  # \a.b [0]: a bit of an escaped bus
            got = self.escaped.get(base)
            return tok if got is None else f"{got}[{sel}"
        return tok if got is None else got

    def parse(self, module: str | None = None) -> Netlist:
        text, b = self.text, self.b
        modules = list(_MODULE.finditer(text))
        if not modules:
            kw = re.search(r"\bmodule\b", text)
            if kw is not None:  # e.g. a parameter list `module m #(...)`
                raise b.error("cannot parse the module header (expected "
                              "'module NAME (ports);' or 'module NAME;')",
                              kw.start())
            raise NetlistError("no 'module' found", b.file, 1, b.unhide(text[:80]))
        flop_cells = dict(FLOP_CELLS)
        top = None
        bodies = []
        for k, m in enumerate(modules):
            end = modules[k + 1].start() if k + 1 < len(modules) else len(text)
            body = text[m.start():end]
            bodies.append(body)
            if _defines_flop(body):
                flop_cells.setdefault(m.group(1), (("D", "d"), ("Q", "q")))
            if top is None and (module is None or m.group(1) == module):
                top = m
        if top is None:
            raise NetlistError(f"module {module!r} not found", b.file, 1)
        self.modules = {m.group(1) for m in modules}
        if module is None and len(modules) > 1:
            # The top is the module no other one instantiates, wherever it
            # stands in the file (tools write submodules first, too); the
            # first module used to be read, silently, as the whole design.
            used = _instantiated(bodies, self.modules)
            top = next((m for m in modules if m.group(1) not in used), top)
        start = text.find(";", top.start()) + 1
        stop = text.find("endmodule", start)
        if start == 0 or stop < 0:
            raise b.error("module without ';' header or 'endmodule'", top.start())
        self.flop_cells = flop_cells
        if text[top.end() - 1] == "(":
            self.ansi_ports(text, top.end(), start - 1)
        offset = start
        stmts = text[start:stop].split(";")
        if "always" in text:  # an always block's `else` follows a ';'
            stmts = _yosys.join_else(stmts)
        for stmt in stmts:
            self.statement(stmt, offset)
            offset += len(stmt) + 1
        return b.build(top.group(1))

    def ansi_ports(self, text: str, begin: int, end: int) -> None:
        """Declare the ports of a Verilog-2001 header, ``module m(input a,
        output [1:0] y)``; a header of bare names (``module m(a, y)``) declares
        nothing. These used to be skipped, so every input read as undriven."""
        header = text[begin:end].rstrip()
        if not _ANSI_DIR.search(header):
            return
        if header.endswith(")"):
            header = header[:-1]
        direction, offset, reg = None, begin, False
        for item in header.split(","):
            here, offset = offset, offset + len(item) + 1
            m = _ANSI_DIR.match(item.strip())
            if m:
                direction, rest = m.group(1), item.strip()[m.end():]
                reg = re.search(r"\breg\b", rest) is not None  # output reg q
            else:
                rest = item
            if direction is None:
                raise self.b.error("port without a direction in a Verilog-2001 "
                                   "header (expected input or output first)", here,
                                   item)
            # net kinds and signs carry no structure: dropped, as wire is
            rest = _ANSI_KIND.sub(" ", rest)
            self.statement(f"{direction} {rest}", here + len(item) - len(item.lstrip()))
            if reg:  # the same bits again: not counted twice against the cap
                bits = self.bus_bits
                self.regs.update(self.decl_names(rest, here))
                self.bus_bits = bits

    def decl_names(self, rest: str, offset: int) -> list[str]:
        m = _RANGE.search(rest)
        rng = None
        if m:
            # Length first: int() of thousands of digits is slow or refused.
            if max(len(m.group(1)), len(m.group(2))) > 9:
                raise self.b.error(f"bus range {m.group(0)!r} is too wide "
                                   f"(at most {MAX_BUS_BITS} nets)", offset)
            hi, lo = int(m.group(1)), int(m.group(2))
            rng = range(min(hi, lo), max(hi, lo) + 1)
            rest = rest[:m.start()] + rest[m.end():]
        toks = [t.strip() for t in rest.split(",") if t.strip()]
        if rng is not None:
            self.bus_bits += len(rng) * len(toks)
            if self.bus_bits > MAX_BUS_BITS:
                raise self.b.error(
                    f"bus range {m.group(0)!r} brings the declared bus nets to "
                    f"{self.bus_bits}, more than the {MAX_BUS_BITS} this reader "
                    "accepts", offset)
        out = []
        for tok in toks:
            if not _IDENT_RE.match(tok):
                raise self.b.error(f"bad identifier {tok!r} in declaration", offset)
            name = self.name(tok)
            out.extend([f"{name}[{i}]" for i in rng] if rng else [name])
            if rng:
                self.buses[name] = (hi, lo)
        return out

    def statement(self, stmt: str, offset: int) -> None:
        b = self.b
        m = _KEYWORD.match(stmt)
        if m is None:
            if stmt.strip():
                raise b.error("cannot parse statement", offset, stmt)
            return
        kw = m.group(1)
        rest = stmt[m.end():]
        offset += len(stmt) - len(stmt.lstrip())
        if kw in _PRIMITIVES:
            self.primitive(kw, rest, stmt, offset)
        elif kw == "assign":
            self.assign(rest, stmt, offset)
        elif kw == "input":
            for n in self.decl_names(rest, offset):
                b.drive(n, "input", (), offset)
        elif kw == "output":
            b.outputs.extend((n, offset) for n in self.decl_names(rest, offset))
        elif kw in ("wire", "tri", "supply0", "supply1"):
            # declarations carry no structure; nets appear when used, but
            # `wire w = expr` drives w, and bus widths give `assign y = a` its bits
            if "=" in rest or "[" in rest:
                _yosys.wire(self, rest, stmt, offset)
        elif kw in self.flop_cells:
            self.flop(kw, rest, stmt, offset)
        elif kw == "reg":  # a flip-flop's Q when an always block drives it
            _yosys.declare_regs(self, rest, stmt, offset)
        elif kw in _yosys.ALWAYS:
            _yosys.always(self, kw, rest, stmt, offset)
        elif kw in ("initial", "module", "function", "task", "else", "begin"):
            raise b.error(f"behavioral construct {kw!r} is not supported in a "
                          "gate-level netlist", offset, stmt)
        elif self.name(kw).startswith("\\$"):  # a yosys cell: \$_AND_ g (...)
            _yosys.cell(self, self.name(kw)[1:], rest, stmt, offset)
        elif kw in self.modules:
            raise b.error(f"instance of module {kw!r}, defined in this file: "
                          "hierarchical netlists are not supported; flatten the "
                          "design first (yosys: flatten)", offset, stmt)
        else:
            raise b.error(f"unknown gate type {kw!r}", offset, stmt)

    def ports(self, rest: str, stmt: str, offset: int):
        pos = 0
        while pos < len(rest):
            m = _INSTANCE.match(rest, pos)
            if m is None:
                raise self.b.error("cannot parse instance ports", offset, stmt)
            yield m.group(1), m.group(2)
            pos = m.end()
            if not m.group(3):
                break

    def operand(self, tok: str, stmt: str, offset: int) -> int:
        tok = tok.strip()
        if _IDENT_RE.match(tok):
            return self.b.net(self.name(tok), offset)
        if _CONST.match(tok):
            return self.const(tok, offset)
        raise self.b.error(f"bad net {tok!r}", offset, stmt)

    def primitive(self, gate: str, rest: str, stmt: str, offset: int) -> None:
        for _inst, body in self.ports(rest, stmt, offset):
            pins = [p for p in body.split(",")]
            if any(p.strip().startswith(".") for p in pins):
                raise self.b.error(f"primitive {gate!r} cannot use named ports",
                                   offset, stmt)
            if len(pins) < 2 or (gate in ("buf", "not") and len(pins) != 2):
                want = "one input" if gate in ("buf", "not") else "inputs"
                raise self.b.error(f"{gate!r} needs an output and {want}, got "
                                   f"{len(pins)} pin(s)", offset, stmt)
            out = pins[0].strip()
            if not _IDENT_RE.match(out):
                raise self.b.error(f"bad output net {out!r}", offset, stmt)
            fanin = tuple(self.operand(p, stmt, offset) for p in pins[1:])
            self.b.drive(self.name(out), gate, fanin, offset)

    def flop(self, cell: str, rest: str, stmt: str, offset: int) -> None:
        d_pins, q_pins = self.flop_cells[cell]
        for inst, body in self.ports(rest, stmt, offset):
            conn = {pin: net.strip() for pin, net in _NAMED.findall(body)}
            if not conn:
                raise self.b.error(f"flip-flop {cell!r} needs named ports "
                                   "(.D(...), .Q(...))", offset, stmt)
            d = next((conn[p] for p in d_pins if conn.get(p)), None)
            qs = [conn[p] for p in q_pins if conn.get(p)]
            if d is None or not qs:
                raise self.b.error(f"flip-flop {inst or cell!r} has no D or Q "
                                   "connection", offset, stmt)
            d_node = self.operand(d, stmt, offset)
            for q in qs:
                q_node = self.b.drive(self.name(q), "ppi", (), offset)
                self.b.flops.append((inst or cell, d_node, q_node))

    def const(self, tok: str, offset: int) -> int:
        m = _CONST.match(_ident(tok))
        base = m.group(2).lower()
        digits = m.group(3).replace("_", "").lower()
        if "x" in digits or "z" in digits:
            raise self.b.error(f"constant {tok!r} is not 0 or 1", offset)
        if not digits or set(digits) - _DIGITS[base]:
            raise self.b.error(f"bad number literal {tok!r}: base {base!r} digits "
                               f"are {''.join(sorted(_DIGITS[base]))}", offset)
        # Only bit 0 drives the net, and bases 2, 8, 10 and 16 are all even,
        # so the last digit decides it (no int() of a huge literal).
        name = "tie_1" if int(digits[-1], 16) & 1 else "tie_0"
        i = self.b.net(name, offset)
        if self.b.types[i] == -1:
            self.b.drive(name, "const1" if name == "tie_1" else "const0", (), offset)
        return i

    def assign(self, rest: str, stmt: str, offset: int) -> None:
        rest = rest.strip()
        if rest.startswith("#"):  # an ignored delay: assign #1 q = d
            rest = re.sub(r"#\s*\d+", "", rest, count=1)
        for part in _split_top(rest):
            if "=" not in part:
                raise self.b.error("assign without '='", offset, stmt)
            lhs, rhs = part.split("=", 1)
            lhs = lhs.strip()
            if (self.buses or "{" in part) and _yosys.is_bus_assign(self, lhs, rhs):
                _yosys.bus_assign(self, lhs, rhs, stmt, offset)  # assign y = a[3:0]
                continue
            if not _IDENT_RE.match(lhs):
                raise self.b.error(f"bad assign target {lhs!r}", offset, stmt)
            self.expression(self.name(lhs), rhs, stmt, offset)

    def expression(self, target: str, rhs: str, stmt: str, offset: int) -> None:
        if "?" in rhs:  # yosys writes $_MUX_ as `s ? b : a`
            _yosys.conditional(self, rhs, stmt, offset, target)
            return
        _Expr(self, self.tokens(rhs, stmt, offset), target, stmt, offset).run()

    def tokens(self, rhs: str, stmt: str, offset: int) -> list[str]:
        """The tokens of an expression (nets, constants, operators)."""
        toks, pos = [], 0
        rhs = rhs.rstrip()
        while pos < len(rhs):
            m = _TOKEN.match(rhs, pos)
            if m is None:
                raise self.b.error(f"cannot parse expression {rhs.strip()!r}",
                                   offset, stmt)
            toks.append(m.group(1) or m.group(2) or m.group(3))
            pos = m.end()
        if not toks:
            raise self.b.error("empty assign expression", offset, stmt)
        return toks


def _instantiated(bodies: list[str], names: set[str]) -> set[str]:
    """The modules of ``names`` that a statement of another module's body
    (``bodies``: each module's text, header included) instantiates."""
    used: set[str] = set()
    for body in bodies:
        own = _MODULE.match(body)
        for stmt in body.split(";"):
            m = _KEYWORD.match(stmt)
            if m and m.group(1) in names and (own is None or
                                               m.group(1) != own.group(1)):
                used.add(m.group(1))
    return used


def _defines_flop(body: str) -> bool:
    """Whether a module body has ``reg`` and an ``always ... posedge`` statement."""
    if "posedge" not in body or "reg" not in body:
        return False
    # Statement by statement: a regex `always[^;]*posedge` rescans up to the
    # next ';' from every 'always', quadratic when there are thousands.
    for stmt in body.split(";"):
        m = _ALWAYS.search(stmt)
        if m and "posedge" in stmt[m.end():]:
            return True
    return False


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        depth += ch in "({"  # {a, b}: a concatenation's commas are inside
        depth -= ch in ")}"
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


_PRECEDENCE = {"|": 1, "^": 2, "&": 3}
_BINARY_GATE = {"|": "or", "^": "xor", "&": "and"}
#: Longest name an ``assign`` operator node derives from its operands; nested
#: expressions would otherwise grow names quadratically with the depth.
_MAX_DERIVED_NAME = 200


class _Op:
    """An operator node of an ``assign`` expression while it is parsed."""

    __slots__ = ("gate", "args", "closed")

    def __init__(self, gate: str, args: list, closed: bool):
        self.gate, self.args, self.closed = gate, args, closed


class _Expr:
    """Operator-precedence parser for ``~ ! & ^ |`` and parentheses.

    Iterative (two stacks), so nesting depth is bounded by memory, not by
    Python's recursion limit. It builds the same trees as recursive descent
    over Verilog precedence (``~`` > ``&`` > ``^`` > ``|``): a run of one
    operator without parentheses becomes one n-ary gate (``a & b & c`` ->
    ``and(a, b, c)``), a parenthesised group stays a separate gate.
    """

    def __init__(self, v: _Verilog, toks: list[str], target: str, stmt: str, offset):
        self.v, self.toks = v, toks
        self.target, self.stmt, self.offset = target, stmt, offset

    def fail(self, why: str):
        return self.v.b.error(why, self.offset, self.stmt)

    def parse(self):
        out: list = []  # operands: node index or _Op
        ops: list[str] = []  # "(", "~" or a binary operator
        want_operand = True
        for tok in self.toks:
            if want_operand:
                if tok in ("~", "!"):
                    ops.append("~")
                elif tok == "(":
                    ops.append("(")
                elif tok in "&|^)":
                    raise self.fail(f"unexpected {tok!r} in expression")
                else:
                    out.append(self.v.operand(tok, self.stmt, self.offset))
                    self._unary(out, ops)
                    want_operand = False
            elif tok in _PRECEDENCE:
                while ops and ops[-1] in _PRECEDENCE and \
                        _PRECEDENCE[ops[-1]] >= _PRECEDENCE[tok]:
                    self._binary(out, ops)
                ops.append(tok)
                want_operand = True
            elif tok == ")":
                while ops and ops[-1] != "(":
                    self._binary(out, ops)
                if not ops:
                    raise self.fail("unexpected ')' in expression")
                ops.pop()
                if isinstance(out[-1], _Op):
                    out[-1].closed = True
                self._unary(out, ops)
            else:
                raise self.fail(f"unexpected {tok!r} in expression")
        if want_operand:
            raise self.fail("expression ends early")
        while ops:
            if ops[-1] == "(":
                raise self.fail("missing ')' in expression")
            self._binary(out, ops)
        return out[0]

    @staticmethod
    def _unary(out: list, ops: list[str]) -> None:
        while ops and ops[-1] == "~":
            ops.pop()
            out[-1] = _Op("not", [out[-1]], True)

    @staticmethod
    def _binary(out: list, ops: list[str]) -> None:
        gate = _BINARY_GATE[ops.pop()]
        right, left = out.pop(), out.pop()
        if isinstance(left, _Op) and not left.closed and left.gate == gate:
            left.args.append(right)  # one more operand of the same run
            out.append(left)
        else:
            out.append(_Op(gate, [left, right], False))

    def run(self) -> None:
        node = self.parse()
        b = self.v.b
        if isinstance(node, _Op):  # an operator: it is the target net
            fanin = tuple(self.materialise(f) for f in node.args)
            b.drive(self.target, node.gate, fanin, self.offset)
        else:  # a plain net or constant: the target is a buffer of it
            b.drive(self.target, "buf", (node,), self.offset)

    def make(self, gate: str, fanin: list[int]) -> int:
        b = self.v.b
        base = f"{gate}_" + "_".join(b.names[i] for i in fanin)
        if len(base) > _MAX_DERIVED_NAME:
            base = base[:_MAX_DERIVED_NAME]
        return b.drive(b.fresh(base), gate, tuple(fanin), self.offset)

    def materialise(self, node) -> int:
        """Create the nets of ``node``'s tree, operands first (post-order)."""
        if not isinstance(node, _Op):
            return node
        stack = [(node, [])]
        while True:
            op, done = stack[-1]
            if len(done) < len(op.args):
                child = op.args[len(done)]
                if isinstance(child, _Op):
                    stack.append((child, []))
                else:
                    done.append(child)
                continue
            idx = self.make(op.gate, done)
            stack.pop()
            if not stack:
                return idx
            stack[-1][1].append(idx)


def parse_verilog(text: str, file: str | None = None,
                  module: str | None = None) -> Netlist:
    """Parse structural Verilog; the top is ``module``, else the first module
    that no other module of the text instantiates. An instance of another
    module of the text (a hierarchical netlist) raises :class:`NetlistError`
    unless that module is a flip-flop cell."""
    return _Verilog(_strip_bom(text), file).parse(module)


def _strip_bom(text: str) -> str:
    # Editors on Windows save UTF-8 with a byte-order mark; it is not content.
    return text[1:] if text.startswith("\ufeff") else text


# --------------------------------------------------------------------------- #
# ISCAS .bench
_BENCH_IO = re.compile(r"(INPUT|OUTPUT)\s*\(\s*([^\s()]+)\s*\)\Z", re.I)
_BENCH_GATE = re.compile(r"([^\s=()]+)\s*=\s*([A-Za-z]+)\s*\(([^()]*)\)\Z")


def parse_bench(text: str, file: str | None = None, name: str = "bench") -> Netlist:
    """Parse ISCAS ``.bench`` (``INPUT(a)``, ``y = NAND(a, b)``, ``q = DFF(d)``)."""
    text = _strip_bom(text)
    b = _Builder(file, text, stmt_end="\n")  # one statement per line
    offset = 0
    pending_flops = []
    for raw in text.split("\n"):
        line = raw.split("#", 1)[0].strip()
        here = offset + (len(raw) - len(raw.lstrip()))
        offset += len(raw) + 1
        if not line:
            continue
        m = _BENCH_IO.match(line)
        if m:
            if m.group(1).upper() == "INPUT":
                b.drive(m.group(2), "input", (), here)
            else:
                b.outputs.append((m.group(2), here))
            continue
        m = _BENCH_GATE.match(line)
        if m is None:
            raise b.error("cannot parse line", here, line)
        out, gate, args = m.group(1), m.group(2).upper(), m.group(3)
        pins = [p.strip() for p in args.split(",")]
        if not all(pins):
            raise b.error("empty pin in gate", here, line)
        if gate == "DFF":
            if len(pins) != 1:
                raise b.error("DFF takes one input", here, line)
            q = b.drive(out, "ppi", (), here)
            pending_flops.append((f"{out}_dff", pins[0], q, here))
            continue
        if gate not in _BENCH_GATES:
            raise b.error(f"unknown gate type {m.group(2)!r}", here, line)
        g = _BENCH_GATES[gate]
        if g in ("buf", "not") and len(pins) != 1:
            raise b.error(f"{gate} takes one input, got {len(pins)}", here, line)
        b.drive(out, g, tuple(b.net(p, here) for p in pins), here)
    for inst, d, q, here in pending_flops:
        b.flops.append((inst, b.net(d, here), q))
    return b.build(name)


def read_text(path: str | Path) -> str:
    """A netlist file's text (UTF-8, optional byte-order mark; CRLF and lone
    CR line ends read as LF).

    Raises:
        NetlistError: naming the file, and the line of the first byte that is
            not UTF-8, when the file is missing, unreadable or not text.
    """
    path = Path(path)
    if not path.is_file():
        raise NetlistError("no such netlist file", str(path))
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise NetlistError(f"cannot read file ({e.strerror or e})", str(path)) from e
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise NetlistError("not a UTF-8 text file but UTF-16 (byte-order mark "
                           f"{raw[0]:02X} {raw[1]:02X}); save it as UTF-8 or ASCII",
                           str(path), 1)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        head = raw[:e.start]
        line = head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1
        raise NetlistError(f"not a UTF-8 text file ({e.reason}: byte "
                           f"{raw[e.start]:#04x} at offset {e.start})", str(path),
                           line) from e
    if "\r" in text:
        # Lines ended by a lone CR (classic Mac OS): without this the first
        # '//' comment ran to the end of the file, which then read as empty.
        # CRLF becomes LF, so line numbers stay those of the file.
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


#: File suffixes :func:`read_netlist` reads, and the reader of each that lives
#: in its own module (imported on first use).
NETLIST_SUFFIXES = (".v", ".vg", ".sv", ".bench", ".aag", ".aig", ".blif")
_OTHER_READERS = {".aag": ("aiger", "read_aiger"), ".aig": ("aiger", "read_aiger"),
                  ".blif": ("blif", "read_blif")}


def read_netlist(path: str | Path, module: str | None = None) -> Netlist:
    """Read a netlist file, its format chosen by the suffix.

    ``.v`` / ``.vg`` / ``.sv``: structural Verilog (``module`` picks the top,
    default the first); ``.bench``: ISCAS bench; ``.aag`` / ``.aig``: AIGER;
    ``.blif``: BLIF.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in NETLIST_SUFFIXES:
        if not path.is_file():
            raise NetlistError("no such netlist file", str(path))
        raise NetlistError(f"unsupported netlist extension {path.suffix!r} "
                           f"(expected one of {', '.join(NETLIST_SUFFIXES)})",
                           str(path))
    if suffix in _OTHER_READERS:
        import importlib

        mod, fn = _OTHER_READERS[suffix]
        return getattr(importlib.import_module(f".{mod}", __package__), fn)(path)
    text = read_text(path)
    if suffix == ".bench":
        return parse_bench(text, str(path), path.stem)
    return parse_verilog(text, str(path), module)
