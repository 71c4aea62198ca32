"""Levelized, vectorized logic simulation and static timing on a :class:`Netlist`.

* :func:`levelize` assigns every node its logic level (longest path from a
  source) with a vectorized Kahn sweep and names the nets of a combinational
  loop if there is one.
* :func:`signal_probability` is bit-parallel simulation: 64 patterns per
  ``uint64`` word, every level evaluated with one gather + ``reduceat`` per
  gate type (no per-node Python loop). Circuits with at most 16 sources
  (primary + pseudo-primary inputs) are enumerated exhaustively, so the
  probabilities are exact; larger ones are sampled (default ``2**16``
  patterns, standard error below 0.002).
* :func:`static_timing` propagates arrival times forwards and required times
  backwards under a fanout-aware delay model,
  ``delay = intrinsic[type] + fanout_coeff * fanout``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .netlist import GATE_TYPES, TYPE_ID, Netlist, NetlistError

__all__ = [
    "Levels",
    "levelize",
    "signal_probability",
    "DelayModel",
    "Timing",
    "static_timing",
]

_SOURCES = (TYPE_ID["input"], TYPE_ID["ppi"], TYPE_ID["const0"], TYPE_ID["const1"])


@dataclass
class Levels:
    """Nodes grouped by logic level, with the gather plans the sweeps reuse.

    Attributes:
        level: ``int64 [N]`` longest distance from a source.
        order: nodes sorted by (level, type).
        ptr: ``order[ptr[l]:ptr[l+1]]`` are the nodes of level ``l``.
    """

    level: np.ndarray
    order: np.ndarray
    ptr: np.ndarray

    @property
    def depth(self) -> int:
        return int(self.level.max()) if self.level.size else 0


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each pair, vectorized."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - np.cumsum(counts) + counts, counts)
    return shift + np.arange(total)


def levelize(net: Netlist) -> Levels:
    """Logic levels by a vectorized Kahn sweep; raises on a combinational loop."""
    n = net.num_nodes
    indeg = np.diff(net.fanin_ptr).astype(np.int64)
    dst = np.repeat(np.arange(n), indeg)
    by_src = np.argsort(net.fanin_idx, kind="stable")
    fo_idx = dst[by_src]
    fo_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(net.fanin_idx, minlength=n), out=fo_ptr[1:])

    level = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    remaining = indeg.copy()
    lvl = 0
    while frontier.size:
        level[frontier] = lvl
        counts = fo_ptr[frontier + 1] - fo_ptr[frontier]
        targets = fo_idx[_ranges(fo_ptr[frontier], counts)]
        if targets.size == 0:
            break
        uniq, cnt = np.unique(targets, return_counts=True)
        remaining[uniq] -= cnt
        frontier = uniq[remaining[uniq] == 0]
        lvl += 1
    if (level < 0).any():
        raise _loop_error(net, np.flatnonzero(level < 0))
    order = np.lexsort((net.types, level))
    ptr = np.zeros(int(level.max()) + 2 if n else 1, dtype=np.int64)
    np.cumsum(np.bincount(level, minlength=ptr.size - 1), out=ptr[1:])
    return Levels(level, order, ptr)


def _loop_error(net: Netlist, stuck: np.ndarray) -> NetlistError:
    import networkx as nx

    keep = set(stuck.tolist())
    g = nx.DiGraph()
    for v in keep:
        for u in net.fanin_idx[net.fanin_ptr[v]:net.fanin_ptr[v + 1]]:
            if int(u) in keep:
                g.add_edge(int(u), v)
    try:
        cycle = [u for u, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:  # pragma: no cover - stuck nodes imply a cycle
        cycle = [int(v) for v in stuck[:5]]
    # Start the cycle at the gate written first in the file, so the line the
    # error names is a statement on the loop and the message reads from it.
    lines = [net.line_of(v) or float("inf") for v in cycle]
    k = lines.index(min(lines))
    cycle = cycle[k:] + cycle[:k]
    names = [net.names[v] for v in cycle]
    shown = " -> ".join(names[:8]) + (" -> ..." if len(names) > 8 else "")
    return NetlistError(f"combinational loop through nets {shown} -> {names[0]} "
                        f"({stuck.size} nets cannot be levelized)", net.path,
                        net.line_of(cycle[0]))


@dataclass
class _Segment:
    gate: int
    nodes: np.ndarray
    flat: np.ndarray
    offsets: np.ndarray


def _plan(net: Netlist, lv: Levels) -> list[list[_Segment]]:
    plan = []
    ptr, fi_ptr = lv.ptr, net.fanin_ptr
    for lvl in range(1, ptr.size - 1):
        nodes = lv.order[ptr[lvl]:ptr[lvl + 1]]
        types = net.types[nodes]
        cuts = np.flatnonzero(np.diff(types)) + 1
        segs = []
        for part in np.split(np.arange(nodes.size), cuts):
            v = nodes[part]
            counts = fi_ptr[v + 1] - fi_ptr[v]
            flat = net.fanin_idx[_ranges(fi_ptr[v], counts)]
            offsets = np.zeros(v.size, dtype=np.int64)
            np.cumsum(counts[:-1], out=offsets[1:])
            segs.append(_Segment(int(net.types[v[0]]), v, flat, offsets))
        plan.append(segs)
    return plan


_REDUCE = {
    "and": np.bitwise_and, "nand": np.bitwise_and,
    "or": np.bitwise_or, "nor": np.bitwise_or,
    "xor": np.bitwise_xor, "xnor": np.bitwise_xor,
}
_INVERTING = {TYPE_ID[t] for t in ("not", "nand", "nor", "xnor")}


def _exhaustive_words(num_sources: int, word0: int, words: int) -> np.ndarray:
    pos = np.arange(word0 * 64, (word0 + words) * 64, dtype=np.int64)
    bits = (pos[None, :] >> np.arange(num_sources)[:, None]) & 1
    packed = np.packbits(bits.astype(np.uint8), axis=1, bitorder="little")
    return packed.view(np.uint64).reshape(num_sources, words)


def signal_probability(net: Netlist, num_patterns: int = 1 << 16, seed: int = 0,
                       exhaustive: bool | None = None, levels: Levels | None = None,
                       chunk_words: int = 128,
                       patterns: np.ndarray | None = None) -> np.ndarray:
    """Probability that each node is 1 under uniform random source values.

    Args:
        net: the netlist; flip-flop outputs are sources like primary inputs.
        num_patterns (int, optional): random patterns when sampling, rounded
            up to a multiple of 64. (default: ``2**16``)
        seed (int, optional): seed of the pattern generator. (default: ``0``)
        exhaustive (bool, optional): enumerate all ``2**S`` source patterns;
            ``None`` does so when ``S <= 16``. (default: ``None``)
        levels (Levels, optional): reuse a :func:`levelize` result.
        chunk_words (int, optional): ``uint64`` words simulated at once per
            node; bounds memory at ``8 * N * chunk_words`` bytes. (default: ``128``)
        patterns (np.ndarray, optional): explicit source values, ``uint64
            [S, W]`` in the order of sources (primary and pseudo-primary
            inputs by node index); overrides ``exhaustive`` and sampling.

    Returns:
        ``float64 [N]`` probabilities (exact multiples of ``1 / patterns`` when
        exhaustive).
    """
    lv = levels or levelize(net)
    sources = np.flatnonzero(np.isin(net.types, (TYPE_ID["input"], TYPE_ID["ppi"])))
    s = sources.size
    if patterns is not None:
        patterns = np.asarray(patterns, dtype=np.uint64)
        if patterns.ndim != 2 or patterns.shape[0] != s:
            raise ValueError(f"patterns must have shape [{s}, W] (one row per "
                             f"source), got {tuple(patterns.shape)}")
        exhaustive = False
        total_words = patterns.shape[1]
    elif exhaustive or (exhaustive is None and s <= 16):
        exhaustive = True
        if s > 30:
            raise ValueError(f"exhaustive simulation of {s} sources is infeasible; "
                             "use exhaustive=False")
        total_words = max(1, (1 << s) // 64)
    else:
        if num_patterns < 1:
            raise ValueError(f"num_patterns must be >= 1, got {num_patterns}")
        total_words = -(-num_patterns // 64)
    rng = np.random.default_rng(seed)
    plan = _plan(net, lv)
    ones = np.zeros(net.num_nodes, dtype=np.int64)
    const1 = np.flatnonzero(net.types == TYPE_ID["const1"])
    for w0 in range(0, total_words, chunk_words):
        wc = min(chunk_words, total_words - w0)
        vals = np.zeros((net.num_nodes, wc), dtype=np.uint64)
        if patterns is not None:
            vals[sources] = patterns[:, w0:w0 + wc]
        elif exhaustive:
            vals[sources] = _exhaustive_words(s, w0, wc)
        else:
            vals[sources] = rng.integers(0, np.iinfo(np.uint64).max, size=(s, wc),
                                         dtype=np.uint64, endpoint=True)
        vals[const1] = np.uint64(np.iinfo(np.uint64).max)
        for segs in plan:
            for seg in segs:
                gathered = vals[seg.flat]
                name = GATE_TYPES[seg.gate]
                if name in ("buf", "not"):
                    out = gathered
                else:
                    out = _REDUCE[name].reduceat(gathered, seg.offsets, axis=0)
                if seg.gate in _INVERTING:
                    np.invert(out, out=out)
                vals[seg.nodes] = out
        ones += np.bitwise_count(vals).sum(axis=1, dtype=np.int64)
    return ones / float(total_words * 64)


@dataclass
class DelayModel:
    """Fanout-aware gate delay: ``intrinsic[type] + fanout_coeff * fanout``.

    Intrinsic delays are in units of an inverter, roughly following logical
    effort (NAND < NOR, XOR slowest); sources and constants have zero delay.
    """

    intrinsic: dict[str, float] = field(default_factory=lambda: {
        "buf": 1.2, "not": 1.0, "nand": 1.3, "nor": 1.6, "and": 1.8,
        "or": 2.0, "xor": 2.6, "xnor": 2.8,
    })
    fanout_coeff: float = 0.25

    def delays(self, net: Netlist) -> np.ndarray:
        table = np.zeros(len(GATE_TYPES))
        for name, d in self.intrinsic.items():
            table[TYPE_ID[name]] = d
        fanout = np.bincount(net.fanin_idx, minlength=net.num_nodes)
        gate = ~np.isin(net.types, _SOURCES)
        return np.where(gate, table[net.types] + self.fanout_coeff * fanout, 0.0)


@dataclass
class Timing:
    """Static timing result; all arrays ``float64 [N]``."""

    delay: np.ndarray
    arrival: np.ndarray
    required: np.ndarray
    slack: np.ndarray
    period: float


def static_timing(net: Netlist, model: DelayModel | None = None,
                  levels: Levels | None = None, period: float | None = None) -> Timing:
    """Arrival, required time and slack under ``model``.

    Arrival is ``delay(v) + max`` over fanins (0 at sources). Required time is
    ``period`` at primary and pseudo-primary outputs and at nodes that drive
    nothing, and ``min(required(w) - delay(w))`` over fanouts ``w`` elsewhere.
    ``period`` defaults to the latest output arrival (the critical path), so
    the worst slack is 0.
    """
    model = model or DelayModel()
    lv = levels or levelize(net)
    delay = model.delays(net)
    arrival = np.zeros(net.num_nodes)
    plan = _plan(net, lv)
    for segs in plan:
        for seg in segs:
            arrival[seg.nodes] = (np.maximum.reduceat(arrival[seg.flat], seg.offsets)
                                  + delay[seg.nodes])
    ends = np.union1d(net.outputs, net.pseudo_outputs)
    if period is None:
        period = float(arrival[ends].max()) if ends.size else float(arrival.max(
            initial=0.0))
    required = np.full(net.num_nodes, period)
    for segs in reversed(plan):
        for seg in segs:
            counts = np.diff(np.append(seg.offsets, seg.flat.size))
            push = np.repeat(required[seg.nodes] - delay[seg.nodes], counts)
            np.minimum.at(required, seg.flat, push)
    return Timing(delay, arrival, required, required - arrival, period)
