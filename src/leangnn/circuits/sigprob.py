r"""Cut signal probabilities: a reconvergence-aware analytic estimate.

COP (:mod:`leangnn.circuits.cop`) evaluates every gate on its fanins'
probabilities as if the fanins were independent, so it drifts wherever
reconvergent fanout correlates them. The cut estimate evaluates every node
exactly over a *cut* of its fanin cone: a set of at most ``k`` nets (the
leaves) that separates it from the sources. The node is a Boolean function
of its leaves (its local truth table, ``2**k`` rows), and its probability is

.. math:: P(v) = \sum_{a \in \{0,1\}^k} f_v(a) \prod_j p_j^{a_j} (1 - p_j)^{1 - a_j},

with the leaves treated as independent and their probabilities ``p_j`` taken
from the estimate itself, so it recurses in topological order like COP. This
is the cutting / supergate idea of probabilistic testability analysis
(Savir, Ditlow and Bardell, "Random pattern testability", IEEE TC 1984;
Seth, Pan and Agrawal, "PREDICT - probabilistic estimation of digital circuit
testability", FTCS 1985), with the cuts found as in k-feasible cut mapping
(Cong and Ding, FlowMap, 1994; Mishchenko et al., "Combinational and
sequential mapping with priority cuts", ICCAD 2007): the cut of a gate merges
its fanins' cuts, or takes a fanin itself as a leaf, choosing among these
the one that keeps the most shared leaves (captured reconvergence), then the
most leaves, then the most fanins merged; constants are never leaves.

It is analytic propagation over the structure, not simulation: no random
patterns, and a cut whose leaves are primary inputs gives the exact local
probability. Where all reconvergence of a node's cone fits inside its cut
the estimate is exact (every node whose cone has at most ``k`` sources); on
fanout-free circuits it equals COP. Larger ``k`` catches more reconvergence
at ``2**k`` rows per truth table, so by default ``k`` grows (up to 12) as far
as a budget of ``N * 2**k`` rows allows.

Vectorized per logic level (numpy): the cut candidates of all nodes of a level
are scored together, truth tables (packed 8 rows a byte) are remapped onto the
merged leaves with one gather, gates are evaluated by row-wise reductions,
and the probability is one contraction with the leaf weights; no per-node
Python.
"""

from __future__ import annotations

import functools

import numpy as np

from .netlist import TYPE_ID, Netlist

__all__ = ["cut_signal_probability", "cut_signal_probability_arrays"]

_INPUTS = (TYPE_ID["input"], TYPE_ID["ppi"])
# Per gate type: which reduction of the fanins (0 and, 1 or, 2 xor) and
# whether the output is inverted.
_KIND = np.zeros(len(TYPE_ID), dtype=np.int64)
_INV = np.zeros(len(TYPE_ID), dtype=bool)
for _name, (_kind, _inv) in {"buf": (0, False), "and": (0, False),
                             "not": (0, True), "nand": (0, True),
                             "or": (1, False), "nor": (1, True),
                             "xor": (2, False), "xnor": (2, True)}.items():
    _KIND[TYPE_ID[_name]], _INV[TYPE_ID[_name]] = _kind, _inv
# Work and memory of the default k grow as N * 2**k: larger cuts catch more
# reconvergence (MAE to the label on c7552: 0.018 at k=8, 0.011 at 10, 0.007
# at 12), so k is as large as this budget of truth-table rows allows.
_ROW_BUDGET = 1 << 25


def _levels(types: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    from .simulate import levelize

    n = types.size
    net = Netlist("graph", [""] * n, types, ptr, idx, np.zeros(0, dtype=np.int64))
    return levelize(net).level


def cut_signal_probability_arrays(types: np.ndarray, fanin_ptr: np.ndarray,
                                  fanin_idx: np.ndarray,
                                  level: np.ndarray | None = None,
                                  k: int | None = None,
                                  cuts: int = 1, input_probability: float = 0.5
                                  ) -> np.ndarray:
    """:func:`cut_signal_probability` on CSR arrays (a :class:`Netlist`'s fields).

    Args:
        types: ``int [N]`` indices into :data:`~leangnn.circuits.GATE_TYPES`.
        fanin_ptr, fanin_idx: CSR fanin lists.
        level (np.ndarray, optional): a topological levelling (every fanin on
            a lower level); computed when ``None``.
        k (int, optional): most leaves per cut, ``1..12``; ``None`` picks the
            largest ``k`` in ``8..12`` with ``N * 2**k <= 2**25`` truth-table
            rows (work and memory bounded: ``k = 8`` on ``itc99/b19``, ``12``
            on the ISCAS-85 circuits). (default: ``None``)
        cuts (int, optional): cuts kept per node for its fanouts to merge
            (the node's own probability uses the best). (default: ``1``)
        input_probability (float, optional): probability of a 1 at primary
            and pseudo-primary inputs. (default: ``0.5``)
    """
    if k is None:
        k = int(np.clip(np.floor(np.log2(_ROW_BUDGET / max(len(types), 1))),
                        8, 12))
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= 12:
        raise ValueError(f"k must be an int in [1, 12], got {k!r}")
    if not isinstance(cuts, (int, np.integer)) or not 1 <= cuts <= 8:
        raise ValueError(f"cuts must be an int in [1, 8], got {cuts!r}")
    if not 0.0 <= input_probability <= 1.0:
        raise ValueError(f"input_probability must be in [0, 1], got "
                         f"{input_probability!r}")
    types = np.asarray(types).astype(np.int64)
    ptr = np.asarray(fanin_ptr, dtype=np.int64)
    idx = np.asarray(fanin_idx, dtype=np.int64)
    n = types.size
    lv = _levels(types.astype(np.int8), ptr, idx) if level is None \
        else np.asarray(level, dtype=np.int64)
    k, c = int(k), int(cuts)
    rows = 1 << k
    a = np.arange(rows, dtype=np.int64)
    bits = ((a[None, :] >> np.arange(k)[:, None]) & 1).astype(bool)  # [k, rows]
    st = _State(n, c, k, rows, bits)
    deg = np.diff(ptr)
    # Sources are a leaf of their own; constants (and gates without fanin,
    # which evaluate to 0 as in the simulator) a function of no leaf.
    src = np.flatnonzero(np.isin(types, _INPUTS))
    st.leaves[src, 0, 0] = src
    st.size[src, 0] = 1
    st.table[src, 0] = st.pack(bits[0])
    st.prob[src] = input_probability
    const = np.flatnonzero((deg == 0) & ~np.isin(types, _INPUTS))
    one = const[types[const] == TYPE_ID["const1"]]
    st.table[one, 0] = st.pack(np.ones(rows, dtype=bool))
    st.prob[one] = 1.0
    st.has[np.concatenate([src, const]), 0] = True
    st.const[const] = True

    gates = np.flatnonzero((deg > 0) & ~np.isin(types, _INPUTS))
    order = gates[np.argsort(lv[gates], kind="stable")]
    bounds = np.flatnonzero(np.diff(lv[order])) + 1
    # A level's nodes are independent: wide levels go in chunks, so the
    # per-level row indices ([nodes, cuts, fanins, 2**k]) stay within ~32 MiB.
    chunk = max(64, (1 << 22) // (rows * c * max(int(deg.max(initial=1)), 1)))
    for nodes in np.split(order, bounds):
        for i in range(0, nodes.size, chunk):
            _level(nodes[i:i + chunk], types, ptr, idx, st)
    return st.prob


class _State:
    """Per node: ``cuts`` cuts (sorted leaves padded with ``n``, leaf count,
    whether the slot holds a cut, truth table over the leaves) and the
    probability."""

    def __init__(self, n, c, k, rows, bits):
        self.n, self.c, self.k, self.bits = n, c, k, bits
        self.leaves = np.full((n, c, k), n, dtype=np.int64)
        self.size = np.zeros((n, c), dtype=np.int64)
        self.has = np.zeros((n, c), dtype=bool)
        # truth tables packed 8 rows a byte: 2**k / 8 bytes per cut
        self.rows = rows
        self.table = np.zeros((n, c, max(rows // 8, 1)), dtype=np.uint8)
        self.prob = np.zeros(n)
        self.const = np.zeros(n, dtype=bool)

    def pack(self, t: np.ndarray) -> np.ndarray:
        return np.packbits(t, axis=-1, bitorder="little")

    def unpack(self, t: np.ndarray) -> np.ndarray:
        return np.unpackbits(t, axis=-1, count=self.rows,
                             bitorder="little").view(bool)


@functools.lru_cache(maxsize=64)
def _candidates(mm: int, c: int) -> np.ndarray:
    """``int [nc, mm]`` per candidate, what each fanin contributes: ``-1`` the
    fanin as a leaf, ``i`` its stored cut ``i``. Every choice for the first two
    fanins; the others all as leaves or all through their best cut."""
    free = min(mm, 2)
    heads = np.array(np.meshgrid(*[np.arange(-1, c)] * free, indexing="ij")
                     ).reshape(free, -1).T
    if mm == free:
        return heads
    return np.concatenate([np.concatenate(
        [heads, np.full((len(heads), mm - free), r)], 1) for r in (-1, 0)])


def _level(nodes, types, ptr, idx, st: _State):
    n, k, c, sentinel, bits = nodes.size, st.k, st.c, st.n, st.bits
    m = ptr[nodes + 1] - ptr[nodes]
    mm = int(m.max())
    j = np.arange(mm)
    valid = j[None, :] < m[:, None]  # [n, mm]
    fan = np.where(valid, idx[np.minimum(ptr[nodes][:, None] + j, idx.size - 1)], 0)
    opt = _candidates(mm, c)  # [nc, mm]
    nc = len(opt)
    # A constant is never a leaf: its cut is empty and its table constant (as
    # a leaf it would look like a shared leaf and win ties it should not).
    fc = st.const[fan][:, None, :]
    opt = np.where(fc, 0, opt[None])  # [n, nc, mm]
    oc, leaf = np.maximum(opt, 0), opt < 0
    stored = st.leaves[fan[:, None, :], oc]  # [n, nc, mm, k]
    trivial = np.full_like(stored, sentinel)
    trivial[..., 0] = fan[:, None, :]
    lv_ = np.where(leaf[..., None], trivial, stored)
    lv_ = np.where(valid[:, None, :, None], lv_, sentinel)
    usable = np.all(leaf | st.has[fan[:, None, :], oc] | ~valid[:, None],
                    axis=2)  # [n, nc]
    used = np.where(valid[:, None], np.where(leaf, 1, st.size[fan[:, None, :], oc]),
                    0).sum(2)
    u = lv_.reshape(n, nc, mm * k).copy()
    u.sort(axis=2)
    dup = np.zeros_like(u, dtype=bool)
    dup[..., 1:] = u[..., 1:] == u[..., :-1]
    u[dup] = sentinel
    u.sort(axis=2)
    cnt = (u < sentinel).sum(2)
    u = u[..., :k]
    # most shared leaves first (reconvergence captured), then most leaves,
    # then most fanins merged (an inverter's cut is its fanin's, not itself)
    merged = (~leaf & valid[:, None]).sum(2)
    key = np.where(usable & (cnt <= k),
                   ((used - cnt) * (k + 1) + cnt) * (mm + 1) + merged, -1)
    rank = np.argsort(-key, axis=1, kind="stable")
    key = np.take_along_axis(key, rank, 1)
    us = np.take_along_axis(u, rank[..., None], 1)
    same = np.all(us[:, :, None, :] == us[:, None, :, :], axis=3)
    dup = np.any(same & np.tri(nc, k=-1, dtype=bool)[None], axis=2)
    good = (key >= 0) & ~dup
    slot = np.cumsum(good, 1) - 1
    pick = np.zeros((n, c), dtype=np.int64)
    has = np.zeros((n, c), dtype=bool)
    for i in range(c):
        hit = good & (slot == i)
        has[:, i] = hit.any(1)
        pick[:, i] = rank[np.arange(n), hit.argmax(1)]

    ok = has[:, 0]
    if not ok.all():  # more fanins than k: COP on this gate, the gate a leaf
        bad = nodes[~ok]
        _cop_gates(bad, types, ptr, idx, st.prob)
        st.leaves[bad] = sentinel
        st.leaves[bad, 0, 0] = bad
        st.size[bad] = 0
        st.size[bad, 0] = 1
        st.has[bad] = False
        st.has[bad, 0] = True
        st.table[bad] = 0
        st.table[bad, 0] = st.pack(bits[0])
        if not ok.any():
            return
        nodes, fan, valid, pick, has = (nodes[ok], fan[ok], valid[ok], pick[ok],
                                        has[ok])
        lv_, u, cnt, opt = lv_[ok], u[ok], cnt[ok], opt[ok]
        n = nodes.size
    rn = np.arange(n)[:, None]
    cl = lv_[rn, pick]  # [n, c, mm, k] leaves each fanin brings
    cu = u[rn, pick]  # [n, c, k] the merged cut
    co = opt[rn, pick]  # [n, c, mm]
    # Where each brought leaf sits in the merged cut -> gather index per row.
    hit = cl[..., :, None] == cu[:, :, None, None, :]  # [n, c, mm, k, k]
    pos = np.where(hit.any(-1), hit.argmax(-1), -1)
    # The row index into a fanin's table, for every row of the merged cut:
    # separable in the row's low and high bits, so it is two small tables
    # (2**6 entries) combined with one broadcast, not a pass over 2**k rows
    # per leaf.
    kl = min(k, 6)
    kh = k - kl
    lo_bits, hi_bits = _bit_tables(kl), _bit_tables(kh)
    weight = (1 << np.arange(k, dtype=np.int32))
    in_lo = (pos >= 0) & (pos < kl)
    idx_lo = (lo_bits[np.minimum(np.maximum(pos, 0), kl - 1)]
              * (in_lo * weight)[..., None]).sum(-2, dtype=np.int32)
    if kh:
        idx_hi = (hi_bits[np.minimum(np.maximum(pos - kl, 0), kh - 1)]
                  * ((pos >= kl) * weight)[..., None]).sum(-2, dtype=np.int32)
    else:
        idx_hi = np.zeros(pos.shape[:3] + (1,), dtype=np.int32)
    gidx = (idx_hi[..., :, None] | idx_lo[..., None, :]).reshape(
        pos.shape[:3] + (st.rows,))
    src = np.where((co < 0)[..., None], bits[0],
                   st.unpack(st.table[fan[:, None, :], np.maximum(co, 0)]))
    vals = np.take_along_axis(src, gidx, axis=3)  # [n, c, mm, rows]
    vm = valid[:, None, :, None]
    t = types[nodes]
    all_ = np.all(vals | ~vm, axis=2)
    any_ = np.any(vals & vm, axis=2)
    par = np.bitwise_xor.reduce(vals & vm, axis=2)
    kind = _KIND[t][:, None, None]
    out = np.where(kind == 0, all_, np.where(kind == 1, any_, par))
    out ^= _INV[t][:, None, None]
    out &= has[..., None]
    # P(v) over the best cut: sum over rows of f(row) * prod of leaf
    # probabilities; the weights factor into low and high bits as well.
    best = cu[:, 0]
    lp = np.where(best < sentinel, st.prob[np.minimum(best, sentinel - 1)], 0.5)
    lo_b, hi_b = lo_bits.astype(bool), hi_bits.astype(bool)
    w_lo = np.where(lo_b, lp[:, :kl, None], 1.0 - lp[:, :kl, None]).prod(1)
    w_hi = np.where(hi_b, lp[:, kl:, None], 1.0 - lp[:, kl:, None]).prod(1) \
        if kh else np.ones((n, 1))
    f0 = out[:, 0].reshape(n, 1 << kh, 1 << kl).astype(np.float64)
    st.prob[nodes] = np.einsum("nhl,nh,nl->n", f0, w_hi, w_lo)
    st.leaves[nodes] = np.where(has[..., None], cu, sentinel)
    st.size[nodes] = np.where(has, cnt[rn, pick], 0)
    st.has[nodes] = has
    st.table[nodes] = st.pack(out)


@functools.lru_cache(maxsize=16)
def _bit_tables(b: int) -> np.ndarray:
    """``int32 [b, 2**b]``: bit ``p`` of every ``b``-bit row index."""
    rows = np.arange(1 << b, dtype=np.int32)
    return ((rows[None, :] >> np.arange(max(b, 0), dtype=np.int32)[:, None]) & 1)


def _cop_gates(nodes, types, ptr, idx, prob):
    from .cop import cop_parameters

    a, b, c, e = cop_parameters()
    for v in nodes:  # only gates with more than k fanins: rare
        t = types[v]
        ins = prob[idx[ptr[v]:ptr[v + 1]]]
        prob[v] = a[t] + b[t] * np.prod(c[t] + e[t] * ins)


def cut_signal_probability(net: Netlist, k: int | None = None, cuts: int = 1,
                           levels=None,
                           input_probability: float = 0.5) -> np.ndarray:
    """Probability that each node is 1, exact over a ``k``-leaf cut of its cone.

    Analytic (no simulation): see :mod:`leangnn.circuits.sigprob`.

    Args:
        net: the netlist; flip-flop outputs are inputs like primary inputs.
        k (int, optional): most leaves per cut; ``2**k`` truth-table rows per
            node; ``None``: as large as ``N * 2**k <= 2**25`` allows, within
            ``8..12``. (default: ``None``)
        cuts (int, optional): cuts kept per node for its fanouts to merge
            (priority cuts; more did not help on the bundled circuits).
            (default: ``1``)
        levels (Levels, optional): reuse a
            :func:`~leangnn.circuits.simulate.levelize` result.
        input_probability (float, optional): probability of a 1 at primary
            and pseudo-primary inputs. (default: ``0.5``)

    Returns:
        ``float64 [N]`` probabilities; exact where every reconvergence of a
        node's cone lies inside its cut (e.g. on fanout-free circuits, and on
        any circuit with at most ``k`` inputs).
    """
    level = None if levels is None else levels.level
    return cut_signal_probability_arrays(net.types, net.fanin_ptr, net.fanin_idx,
                                         level, k, cuts, input_probability)
