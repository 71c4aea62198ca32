"""Hostile input: mutated real netlists parse and label, or raise NetlistError.

Small real netlists (circuitgraph's ISCAS c17, c432, c880, s27 as ``.v``, and
``.bench`` versions written by circuitgraph's own writer plus the classic
``s27.bench``) are mutated by seeded random edits: deletions, duplications,
swaps, truncations, garbage and non-UTF-8 bytes, renamed gate types, loops,
double drivers, empty files, huge identifiers and bus ranges, deep nesting,
unclosed comments, bad number literals, long whitespace runs and repeated
words. Every mutant must either load as a labelled graph or raise
:class:`NetlistError` naming the file (and a line inside it whenever the
problem sits on a line), within a generous 2 s bound that catches hangs and
quadratic blow-ups, not speed.
"""

from __future__ import annotations

import os
import random
import re
import time

import pytest
import torch

from leangnn.circuits import NetlistError, load_circuit
from leangnn.circuits.dataset import CircuitInfo

#: The classic ISCAS-89 s27 in .bench form (flip-flops as DFF).
S27_BENCH = """# s27
INPUT(G0)
INPUT(G1)
INPUT(G2)
INPUT(G3)
OUTPUT(G17)
G5 = DFF(G10)
G6 = DFF(G11)
G7 = DFF(G13)
G14 = NOT(G0)
G17 = NOT(G11)
G8 = AND(G14, G6)
G15 = OR(G12, G8)
G16 = OR(G3, G8)
G9 = NAND(G16, G15)
G10 = NOR(G14, G11)
G11 = NOR(G5, G9)
G12 = NOR(G1, G7)
G13 = NOR(G2, G12)
"""

HANG_BOUND_S = 2.0  # per mutant; a correctness bound against hangs, not speed
MUTANTS_PER_BASE = 50
BASES = ["c17.v", "c432.v", "c880.v", "s27.v", "c17.bench", "c432.bench", "s27.bench"]
#: Errors about the whole file rather than one line of it.
FILE_LEVEL = ("no gates/nets",)


def _bench_from_circuitgraph(path: str) -> str:
    import circuitgraph

    text = circuitgraph.io.circuit_to_bench(circuitgraph.from_file(path))
    # circuitgraph writes gates in set order; sort for a seed-stable text.
    return "\n".join(sorted(line for line in text.split("\n") if line)) + "\n"


@pytest.fixture(scope="module")
def bases(netlist_dir) -> dict[str, str]:
    out = {}
    for base in BASES:
        stem, ext = os.path.splitext(base)
        if base == "s27.bench":
            out[base] = S27_BENCH
        elif ext == ".bench":
            out[base] = _bench_from_circuitgraph(os.path.join(netlist_dir, f"{stem}.v"))
        else:
            with open(os.path.join(netlist_dir, base)) as f:
                out[base] = f.read()
    return out


# --------------------------------------------------------------------------- #
# Mutations work on text where each character stands for one byte (latin-1),
# so raw non-UTF-8 bytes can be inserted and lines can be cut mid-sequence.
_GATE_WORD = re.compile(r"\b(nand|nor|not|and|or|xor|xnor|buf|NAND|NOR|NOT|AND|OR|"
                        r"BUFF|DFF|dff|ff|input|output|INPUT|OUTPUT|assign|wire)\b")
# The helpers' own patterns must stay linear on the mutants they produce
# (long blank runs, repeated words): no two adjacent ways to match one run.
_DRIVEN_V = re.compile(r"\b(?:nand|nor|not|and|or|xor|xnor|buf)\s+(?:\w+\s*)?"
                       r"\(\s*(\w+)")
_DRIVEN_B = re.compile(r"^[ \t]*([^\s=()]+)[ \t]*=", re.M)


def _rand_line(text: str, rng: random.Random) -> tuple[list[str], int]:
    lines = text.split("\n")
    return lines, rng.randrange(len(lines))


def _driven(text: str, bench: bool) -> list[str]:
    return (_DRIVEN_B if bench else _DRIVEN_V).findall(text)


def _inputs(text: str, bench: bool) -> list[str]:
    if bench:
        return re.findall(r"INPUT\([ \t]*([^\s()]+)[ \t]*\)", text)
    m = re.search(r"\binput\b", text)
    end = text.find(";", m.end()) if m else -1
    return [t.strip() for t in text[m.end():end].split(",") if t.strip()] \
        if end >= 0 else []


def m_delete(t, rng, bench):
    i = rng.randrange(len(t) + 1)
    return t[:i] + t[i + rng.randint(1, 20):]


def m_duplicate(t, rng, bench):
    lines, i = _rand_line(t, rng)
    k = rng.randint(1, 4)
    return "\n".join(lines[:i + k] + lines[i:i + k] + lines[i + k:])


def m_swap(t, rng, bench):
    lines = t.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def m_truncate(t, rng, bench):
    return t[:rng.randrange(len(t) + 1)]


def m_garbage(t, rng, bench):
    i = rng.randrange(len(t) + 1)
    junk = "".join(rng.choice("();,=\\~&|^'.[]#`\"x0:/*!@$ \t\n\r\x00\x7f")
                   for _ in range(rng.randint(1, 12)))
    return t[:i] + junk + t[i:]


def m_non_utf8(t, rng, bench):
    i = rng.randrange(len(t) + 1)
    junk = rng.choice(["\xff", "\xfe\xff", "\xc3\x28", "\xe2\x82", "\x80\x80\x80",
                       "".join(chr(rng.randrange(128, 256)) for _ in range(5))])
    return t[:i] + junk + t[i:]


def m_rename_gate(t, rng, bench):
    repl = ["frob", "nand", "NOR", "dff", "DFF", "always", "module", "reg", "BUFF",
            "xnor", "", "input", "OUTPUT", "endmodule"]
    return _GATE_WORD.sub(lambda m: rng.choice([m.group(0)] + repl), t,
                          count=rng.randint(1, 3))


def m_loop(t, rng, bench):
    """Make a gate read its own output or a random other gate's output."""
    driven = _driven(t, bench)
    if not driven:
        return t
    out = rng.choice(driven)
    victim = rng.choice([out] + driven)
    if bench:
        pat = re.compile(rf"^([ \t]*{re.escape(out)}[ \t]*=[ \t]*\w+[ \t]*\()[ \t]*"
                         r"([^,()\s]+)", re.M)
    else:
        pat = re.compile(rf"(\(\s*{re.escape(out)}\s*,\s*)([^,()\s]+)")
    return pat.sub(lambda m: m.group(1) + victim, t, count=1)


def m_double_driver(t, rng, bench):
    driven = _driven(t, bench)
    if len(driven) < 2:
        return t
    a, b = rng.sample(driven, 2)
    if bench:
        return re.sub(rf"^([ \t]*){re.escape(a)}([ \t]*=)", rf"\g<1>{b}\g<2>", t,
                      count=1, flags=re.M)
    return re.sub(rf"(\(\s*){re.escape(a)}(\s*,)", rf"\g<1>{b}\g<2>", t, count=1)


def m_empty(t, rng, bench):
    return rng.choice(["", " \n\n\t", "# only a comment\n" if bench else
                       "// only a comment\n", "\ufeff" if bench else "module m();"
                       "\nendmodule\n", "\n" * 50])


def m_huge_identifier(t, rng, bench):
    names = _driven(t, bench) + _inputs(t, bench)
    if not names:
        return t
    victim = rng.choice(names)
    big = "n" + "x" * rng.randint(2_000, 40_000)
    count = rng.choice([0, 1])  # 0: every occurrence
    return re.sub(rf"(?<![\w\\]){re.escape(victim)}(?![\w\[])", big, t, count=count)


def m_huge_bus(t, rng, bench):
    width = rng.choice(["1048576", "1000000000", "99999999999999999999999",
                        "2000", "4294967295", "-1", "3:1:0"])
    if bench:
        line = f"INPUT(big[{width}])"
    else:
        line = f"  {rng.choice(['input', 'output', 'wire'])} [{width}:0] big;"
    lines, i = _rand_line(t, rng)
    return "\n".join(lines[:i] + [line] + lines[i:])


def m_deep_nesting(t, rng, bench):
    ins = _inputs(t, bench) or ["a"]
    a = rng.choice(ins)
    depth = rng.randint(150, 1000)
    kind = rng.choice(["paren", "not", "mixed", "unbalanced"])
    if kind == "paren":
        expr = "(" * depth + a + ")" * depth
    elif kind == "not":
        expr = "~" * depth + a
    elif kind == "mixed":
        expr = a
        for _ in range(depth):
            expr = rng.choice(["(~{})", "({} & {a})", "~({} | {a})", "({} ^ {a})",
                               "{} & {a}"]).format(expr, a=a)
    else:
        expr = "(" * depth + a + ")" * (depth - rng.randint(1, 3))
    if bench:
        line = f"deep = AND({expr}, {a})" if kind != "not" else f"deep = NOT({expr})"
    else:
        line = f"  assign deep = {expr};"
    lines, i = _rand_line(t, rng)
    return "\n".join(lines[:i] + [line] + lines[i:])


def m_comment(t, rng, bench):
    i = rng.randrange(len(t) + 1)
    return t[:i] + rng.choice(["/*", "/* x\n", "*/", "//", "#", "/*/", "\n/*" * 200]) \
        + t[i:]


def m_literal(t, rng, bench):
    lit = rng.choice(["4'dFF", "8'o9", "4'b_", "1'b1", "1'b0", "4'hx", "'b1", "8'hFF",
                      "3'd" + "9" * 5000, "2'b12", "1'bz"])
    line = f"  assign lit = {lit};" if not bench else f"lit = BUFF({lit})"
    lines, i = _rand_line(t, rng)
    return "\n".join(lines[:i] + [line] + lines[i:])


def m_separator(t, rng, bench):
    sep = rng.choice([";", ",", "(", ")", "="])
    idx = [m.start() for m in re.finditer(re.escape(sep), t)]
    if not idx:
        return t
    i = rng.choice(idx)
    return t[:i] + t[i + 1:]


def m_line_endings(t, rng, bench):
    return rng.choice([t.replace("\n", "\r\n"), "\ufeff" + t, t.replace("\n", "\r"),
                       t.replace(" ", "\t")])


def m_whitespace_run(t, rng, bench):
    """A long run of blanks: regexes with two ways to match it go quadratic."""
    i = rng.randrange(len(t) + 1)
    return t[:i] + rng.choice(" \t\n") * rng.randint(30_000, 60_000) + t[i:]


def m_repeat_token(t, rng, bench):
    """One word repeated thousands of times, e.g. 'always always ...'."""
    words = re.findall(r"[A-Za-z_]\w*", t) + ["always", "posedge", "assign", "module"]
    i = rng.randrange(len(t) + 1)
    sep = rng.choice([" ", ", ", "\n", " & ", "("])
    return t[:i] + sep.join([rng.choice(words)] * rng.randint(5_000, 20_000)) + t[i:]


MUTATIONS = [m_delete, m_duplicate, m_swap, m_truncate, m_garbage, m_non_utf8,
             m_rename_gate, m_loop, m_double_driver, m_empty, m_huge_identifier,
             m_huge_bus, m_deep_nesting, m_comment, m_literal, m_separator,
             m_line_endings, m_whitespace_run, m_repeat_token]


def _encode(text: str) -> bytes:
    # Characters below 256 are the bytes themselves; a BOM or other wide
    # character inserted on purpose is written as UTF-8.
    return b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8")
                    for c in text) if not text.isascii() else text.encode()


def _check_labels(data, path) -> None:
    n = data.num_nodes
    assert n > 0, path
    assert data.x.shape[0] == n and torch.isfinite(data.x).all(), path
    assert data.y.shape[0] == n, path
    if data.y.is_floating_point():
        assert torch.isfinite(data.y).all() and data.y.min() >= 0, path
        # Probabilities, or arrival over the latest output arrival; a dangling
        # gate deeper than every output may arrive later than that.
        assert (data.y[data.is_output] <= 1 + 1e-6).all(), path
    else:
        assert set(data.y.unique().tolist()) <= {0, 1, 2, 3}, path
    ei = data.edge_index
    assert ei.numel() == 0 or (ei.min() >= 0 and ei.max() < n), path


@pytest.mark.parametrize("base", BASES)
def test_mutated_netlists_load_or_raise_netlist_error(base, bases, tmp_path):
    text = bases[base]
    bench = base.endswith(".bench")
    tasks = ["signal_prob", "arrival", "critical"]
    outcomes = {"parsed": 0, "error": 0}
    used = set()
    for k in range(MUTANTS_PER_BASE):
        rng = random.Random(f"{base}/{k}")  # each mutant reproducible alone
        ops = [rng.choice(MUTATIONS) for _ in range(rng.randint(1, 3))]
        mutated = text.encode().decode("latin-1")
        for op in ops:
            mutated = op(mutated, rng, bench)
        used.update(op.__name__ for op in ops)
        raw = _encode(mutated)
        path = tmp_path / f"m{k}{os.path.splitext(base)[1]}"
        path.write_bytes(raw)
        what = f"{base} mutant {k} ({[op.__name__ for op in ops]})"
        info = CircuitInfo(f"user/m{k}", "user", str(path))
        # CPU time of this process, not wall time: a hang or a quadratic
        # blow-up burns CPU, while a busy shared machine only stretches wall.
        start = time.process_time()
        try:
            data = load_circuit(info, tasks[k % 3], num_patterns=256, cache=False)
        except NetlistError as e:
            outcomes["error"] += 1
            assert e.file == str(path), what
            assert str(e).startswith(str(path)), what
            if e.line is None:
                assert any(s in e.message for s in FILE_LEVEL), f"{what}: {e}"
            else:
                # lines as editors count them: LF, CRLF or a lone CR ends one
                num_lines = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n") \
                    .count(b"\n") + 1
                assert 1 <= e.line <= num_lines, f"{what}: {e}"
                assert str(e).startswith(f"{path}:{e.line}: "), what
        else:
            outcomes["parsed"] += 1
            _check_labels(data, what)
        elapsed = time.process_time() - start
        assert elapsed < HANG_BOUND_S, f"{what} took {elapsed:.2f} s of CPU"
    assert sum(outcomes.values()) == MUTANTS_PER_BASE
    assert outcomes["error"] > 0 and outcomes["parsed"] > 0, outcomes
    assert len(used) >= len(MUTATIONS) // 2, used
