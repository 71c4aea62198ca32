"""Level plans (a DAG cut into logic levels) and the sweeps that run over them.

A :class:`LevelPlan` is what a topological-order model (:class:`~leangnn.nn.dag.DAGNN`)
iterates over: for every logic level (longest distance from a source) the
nodes of that level and, contiguous and sorted by destination, the edges that
feed them (forward, over fanins) or that they feed (reverse, over fanouts).
It is built once per graph with array operations (one vectorised Kahn sweep
per level, no per-node Python) and cached on the ``edge_index`` tensor, so a
model called as ``model(x, edge_index)`` every epoch pays for it once.

A sweep visits the levels in order and writes each level's new node states
into one preallocated ``[N, C]`` buffer. Plain autograd would keep every
level's intermediates (or, with out-of-place writes, a copy of the buffer per
level: ``depth x N x C``); here the forward runs without a graph and the
backward walks the levels in reverse, so what is kept for backward is the
final buffers plus the inputs: ``O(N x C)`` whatever the depth.

* :func:`max_plus`: ``t_v = max_{u in N(v)} t_u + d_v``, the arrival-time
  recursion of static timing (TimingPredict, DAC 2022; PreRoutGNN, AAAI
  2024), with an exact backward through the recorded maxima (ties share the
  gradient equally), no recomputation;
* :func:`cell_sweep`: a learned per-level update ``cell.step`` (a GRU in
  :class:`~leangnn.nn.dag.DAGNN`), recomputed level by level in backward
  (per-level checkpointing).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor
from torch.autograd import Function

# index_reduce is the fastest segment max/prod on CPU (about 25% faster per
# level than scatter_reduce with an expanded index); its "beta" notice is
# noise for a caller that cannot act on it.
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta",
                        category=UserWarning)

__all__ = ["LevelPlan", "LevelStep", "level_plan", "topological_levels", "max_plus",
           "cell_sweep", "SweepCell", "EdgeIndexCache", "plan_in_use",
           "PLAN_CACHE_SIZE"]


@dataclass(frozen=True)
class LevelStep:
    """One level of a sweep: update ``nodes`` from the rows ``src`` of the state.

    Attributes:
        nodes: ``int64 [n]`` node ids of the level, ascending.
        src: ``int64 [e]`` the neighbour (fanin or fanout) each edge reads.
        loc: ``int64 [e]`` position in ``nodes`` of the node each edge feeds,
            ascending (edges are grouped by destination).
    """

    nodes: Tensor
    src: Tensor
    loc: Tensor

    @property
    def size(self) -> int:
        return int(self.nodes.numel())


@dataclass(frozen=True, eq=False)
class LevelPlan:
    """A DAG grouped by logic level, with the gather plans of both sweeps.

    Attributes:
        num_nodes: ``N``.
        level: ``int64 [N]`` logic level of every node (0 at nodes without fanin).
        in_degree, out_degree: ``int64 [N]`` fanin and fanout counts.
        forward: one :class:`LevelStep` per level, lowest first; edges over fanins.
        reverse: one :class:`LevelStep` per level, highest first; edges over
            fanouts (``src`` is the fanout node a state is read from).
    """

    num_nodes: int
    level: Tensor
    in_degree: Tensor
    out_degree: Tensor
    forward: tuple[LevelStep, ...]
    reverse: tuple[LevelStep, ...]

    @property
    def depth(self) -> int:
        """Highest level (number of levels minus one)."""
        return len(self.forward) - 1

    def to(self, device: torch.device | str) -> LevelPlan:
        def mv(s: LevelStep) -> LevelStep:
            return LevelStep(s.nodes.to(device), s.src.to(device), s.loc.to(device))

        return LevelPlan(self.num_nodes, self.level.to(device),
                         self.in_degree.to(device), self.out_degree.to(device),
                         tuple(mv(s) for s in self.forward),
                         tuple(mv(s) for s in self.reverse))

    def __repr__(self) -> str:
        return f"LevelPlan(num_nodes={self.num_nodes}, depth={self.depth})"


def _cycle_error(src: np.ndarray, dst: np.ndarray, n: int,
                 stuck: np.ndarray) -> ValueError:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    # Nodes left by Kahn's sweep lie on a cycle or downstream of one; the
    # ones on a cycle are those in a strongly connected component of size > 1
    # or with a self-loop.
    _, comp = connected_components(coo_matrix(
        (np.ones(src.size), (src, dst)), shape=(n, n)), connection="strong")
    size = np.bincount(comp)
    on_cycle = size[comp] > 1
    on_cycle[src[src == dst]] = True
    k = int(on_cycle.sum())
    first = np.flatnonzero(on_cycle)[:5].tolist()
    return ValueError(f"edge_index is not a DAG: {k} nodes lie on directed cycles "
                      f"(e.g. nodes {first}) and {stuck.size} of {n} nodes cannot "
                      "be levelized")


def topological_levels(edge_index: Tensor | np.ndarray, num_nodes: int) -> np.ndarray:
    """Longest distance from a source for every node, by a vectorised Kahn sweep.

    Raises:
        ValueError: if the graph has a directed cycle, naming how many nodes
            are on cycles.
    """
    ei = edge_index.detach().cpu().numpy() if isinstance(edge_index, Tensor) \
        else np.asarray(edge_index)
    src, dst = ei[0].astype(np.int64), ei[1].astype(np.int64)
    n = int(num_nodes)
    indeg = np.bincount(dst, minlength=n)
    by_src = np.argsort(src, kind="stable")
    fo_dst = dst[by_src]
    fo_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=fo_ptr[1:])
    level = np.full(n, -1, dtype=np.int64)
    remaining = indeg.copy()
    frontier = np.flatnonzero(indeg == 0)
    lvl = 0
    while frontier.size:
        level[frontier] = lvl
        counts = fo_ptr[frontier + 1] - fo_ptr[frontier]
        total = int(counts.sum())
        if total == 0:
            break
        starts = np.repeat(fo_ptr[frontier] - np.cumsum(counts) + counts, counts)
        targets = fo_dst[starts + np.arange(total)]
        uniq, cnt = np.unique(targets, return_counts=True)
        remaining[uniq] -= cnt
        frontier = uniq[remaining[uniq] == 0]
        lvl += 1
    stuck = np.flatnonzero(level < 0)
    if stuck.size:
        raise _cycle_error(src, dst, n, stuck)
    return level


def _steps(level: np.ndarray, node: np.ndarray, other: np.ndarray, depth: int,
           order: np.ndarray, pos: np.ndarray, ptr: np.ndarray,
           device) -> list[LevelStep]:
    """Steps whose edges feed ``node`` from ``other``, grouped by ``node``'s level."""
    perm = np.argsort(pos[node], kind="stable")
    node, other = node[perm], other[perm]
    loc = pos[node] - ptr[level[node]]
    eptr = np.zeros(depth + 2, dtype=np.int64)
    np.cumsum(np.bincount(level[node], minlength=depth + 1), out=eptr[1:])
    t = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)  # noqa: E731
    order_t, other_t, loc_t = t(order), t(other), t(loc)
    return [LevelStep(order_t[ptr[lv]:ptr[lv + 1]], other_t[eptr[lv]:eptr[lv + 1]],
                      loc_t[eptr[lv]:eptr[lv + 1]]) for lv in range(depth + 1)]


def _build(edge_index: Tensor, num_nodes: int, level: Tensor | None) -> LevelPlan:
    device = edge_index.device
    ei = edge_index.detach().cpu().numpy().astype(np.int64, copy=False)
    n = int(num_nodes)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(ei.shape)}")
    src, dst = ei[0], ei[1]
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise ValueError(f"edge_index holds node ids outside [0, {n}): "
                         f"min {int(ei.min())}, max {int(ei.max())}")
    if level is None:
        lv = topological_levels(ei, n)
    else:
        lv = level.detach().cpu().numpy().astype(np.int64).reshape(-1)
        if lv.size != n:
            raise ValueError(f"level must have one entry per node ({n}), got "
                             f"{lv.size}")
        bad = np.flatnonzero(lv[src] >= lv[dst])
        if bad.size or (n and lv.min() < 0):
            raise ValueError(f"level is not a topological levelling: {bad.size} "
                             "edges do not go from a lower to a higher level")
    depth = int(lv.max()) if n else 0
    order = np.argsort(lv, kind="stable")
    ptr = np.zeros(depth + 2, dtype=np.int64)
    np.cumsum(np.bincount(lv, minlength=depth + 1), out=ptr[1:])
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    fwd = _steps(lv, dst, src, depth, order, pos, ptr, device)
    rev = _steps(lv, src, dst, depth, order, pos, ptr, device)
    t = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)  # noqa: E731
    return LevelPlan(n, t(lv), t(np.bincount(dst, minlength=n)),
                     t(np.bincount(src, minlength=n)), tuple(fwd),
                     tuple(reversed(rev)))


class EdgeIndexCache:
    """Values derived from a graph tensor (an ``edge_index``), kept while that
    tensor lives: an entry dies with its tensor (weak reference), is valid only
    for the same object under the same ``stamp`` (e.g. its ``_version``), and
    the least recently used go beyond ``size`` entries.

    Args:
        size (int, optional): most entries kept. (default: ``64``)
    """

    def __init__(self, size: int = 64):
        self.size = size
        self._entries: OrderedDict[int, tuple] = OrderedDict()

    def get(self, tensor: Tensor, stamp):
        """The value stored for ``tensor`` under ``stamp``, else ``None``."""
        ent = self._entries.get(id(tensor))
        if ent is None or ent[0]() is not tensor or ent[1] != stamp:
            return None
        self._entries.move_to_end(id(tensor))
        return ent[2]

    def put(self, tensor: Tensor, stamp, value) -> None:
        key, entries = id(tensor), self._entries
        entries[key] = (weakref.ref(tensor, lambda _, k=key: entries.pop(k, None)),
                        stamp, value)
        while len(entries) > self.size:
            entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


#: level plans :func:`level_plan` keeps (the most recently used graphs')
PLAN_CACHE_SIZE = 64
# edge_index -> plan
_CACHE = EdgeIndexCache(PLAN_CACHE_SIZE)
# id(edge_index) -> (edge_index, plan) set by plan_in_use
_IN_USE: dict[int, tuple[Tensor, LevelPlan]] = {}


@contextlib.contextmanager
def plan_in_use(edge_index: Tensor, plan: LevelPlan):
    """Within the block, :func:`level_plan` of this very ``edge_index``
    tensor returns ``plan`` (e.g. the planner's dry run of a few of the
    graph's levels: :mod:`leangnn.plan.dag`), whatever else it is given."""
    key = id(edge_index)
    before = _IN_USE.get(key)
    _IN_USE[key] = (edge_index, plan)
    try:
        yield plan
    finally:
        if before is None:
            _IN_USE.pop(key, None)
        else:
            _IN_USE[key] = before


def level_plan(edge_index: Tensor, num_nodes: int | None = None,
               level: Tensor | None = None, cache: bool = True) -> LevelPlan:
    """The :class:`LevelPlan` of the DAG ``edge_index`` (fanin -> gate edges).

    Args:
        edge_index (Tensor): ``[2, E]`` directed edges.
        num_nodes (int, optional): ``N`` (default: ``edge_index.max() + 1``).
        level (Tensor, optional): a precomputed topological levelling (e.g.
            ``data.level`` of a circuit); checked, not recomputed.
        cache (bool, optional): reuse the plan of the same ``edge_index``
            tensor (same object, unmodified). (default: ``True``)

    Raises:
        ValueError: if the graph is not a DAG (naming how many nodes lie on
            cycles) or ``level`` is not a topological levelling.
    """
    used = _IN_USE.get(id(edge_index))
    if used is not None and used[0] is edge_index:
        return used[1]
    if num_nodes is None:
        num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
    stamp = (edge_index._version, int(num_nodes), tuple(edge_index.shape),
             None if level is None else (id(level), level._version))
    plan = _CACHE.get(edge_index, stamp) if cache else None
    if plan is None:
        plan = _build(edge_index, num_nodes, level)
        if cache:
            _CACHE.put(edge_index, stamp, plan)
    return plan



@contextlib.contextmanager
def one_intraop_thread():
    """Within the block, CPU ops run on one intra-op thread (see
    :func:`_one_intraop_thread`); the caller's thread count is restored."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _one_intraop_thread(fn):
    """Run a level sweep on one CPU intra-op thread.

    Every level is a handful of gathers and scatters over a slice of nodes:
    OpenMP's fork/join per op costs more than the op itself, and on a busy
    machine far more (measured: forward + backward on c7552 took 0.08 s on one
    thread, 0.45-3.2 s on two with the other core loaded). CUDA kernels are
    unaffected; the caller's thread count is restored.
    """

    @functools.wraps(fn)
    def run(ctx, *args):
        with one_intraop_thread():
            return fn(ctx, *args)

    return run


class _MaxPlus(Function):
    @staticmethod
    @_one_intraop_thread
    def forward(ctx, d: Tensor, steps: tuple[LevelStep, ...]) -> Tensor:
        t = torch.zeros_like(d)
        best = torch.zeros_like(d)
        for st in steps:
            if st.src.numel() == 0:
                # No neighbours on this level: t = d (the caller zeroes d
                # where a node has no neighbours and should start at 0).
                t.index_copy_(0, st.nodes, d.index_select(0, st.nodes))
                continue
            m = d.new_zeros(st.size, d.size(1)).index_reduce_(
                0, st.loc, t.index_select(0, st.src), "amax", include_self=False)
            best.index_copy_(0, st.nodes, m)
            t.index_copy_(0, st.nodes, m + d.index_select(0, st.nodes))
        ctx.steps = steps
        ctx.save_for_backward(t, best)
        return t

    @staticmethod
    @_one_intraop_thread
    def backward(ctx, grad: Tensor):
        t, best = ctx.saved_tensors
        g = grad.clone()
        for st in reversed(ctx.steps):
            if st.src.numel() == 0:
                continue
            gn = g.index_select(0, st.nodes)
            hit = (t.index_select(0, st.src) == best.index_select(0, st.nodes)
                   .index_select(0, st.loc)).to(g.dtype)
            count = g.new_zeros(gn.shape).index_add_(0, st.loc, hit)
            share = gn / count.clamp_min(1.0)
            g.index_add_(0, st.src, hit * share.index_select(0, st.loc))
        return g, None


def max_plus(d: Tensor, steps: tuple[LevelStep, ...]) -> Tensor:
    """Longest-path recursion ``t_v = max_{u} t_u + d_v`` over a level sweep.

    Args:
        d (Tensor): ``[N, K]`` per-node increments (gate delays), ``K`` channels.
        steps: :attr:`LevelPlan.forward` (``u`` ranges over fanins) or
            :attr:`LevelPlan.reverse` (over fanouts).

    Nodes without neighbours get ``t_v = 0 + d_v``; differentiable in ``d``.
    """
    return _MaxPlus.apply(d, steps)


class SweepCell(Protocol):
    """What :func:`cell_sweep` needs from a per-level update.

    A cell may also define ``step_backward(gathered, node_inputs, loc, size,
    params, grads) -> (grad_gathered, grad_node_inputs, grad_params)`` and set
    ``manual_backward = True``; the sweep then calls it instead of recomputing
    each level under autograd.
    """

    def state_shapes(self) -> list[int]:
        """Widths of the state buffers the cell writes."""

    def step(self, gathered: list[Tensor], node_inputs: list[Tensor], loc: Tensor,
             size: int, params: list[Tensor]) -> list[Tensor]:
        """New states of one level's ``size`` nodes.

        ``gathered[i]`` is state ``i`` of each edge's neighbour (already final),
        ``loc`` each edge's destination in ``0..size-1``, ``node_inputs`` the
        per-node inputs restricted to the level.
        """


class _CellSweep(Function):
    @staticmethod
    @_one_intraop_thread
    def forward(ctx, cell, steps, num_node_inputs: int, *tensors: Tensor):
        node_inputs = tensors[:num_node_inputs]
        params = list(tensors[num_node_inputs:])
        ref = node_inputs[0]
        n = ref.size(0)
        states = [ref.new_zeros(n, w) for w in cell.state_shapes()]
        for st in steps:
            gathered = [s.index_select(0, st.src) for s in states]
            ins = [t.index_select(0, st.nodes) for t in node_inputs]
            for s, o in zip(states, cell.step(gathered, ins, st.loc, st.size, params)):
                s.index_copy_(0, st.nodes, o)
        ctx.cell, ctx.steps, ctx.k = cell, steps, num_node_inputs
        ctx.save_for_backward(*states, *tensors)
        return tuple(states)

    @staticmethod
    @_one_intraop_thread
    def backward(ctx, *grads: Tensor):
        saved = ctx.saved_tensors
        ns = len(grads)
        states, tensors = saved[:ns], saved[ns:]
        k = ctx.k
        node_inputs, params = tensors[:k], tensors[k:]
        need = ctx.needs_input_grad[3:]
        g_states = [torch.zeros_like(s) if g is None else g.clone()
                    for s, g in zip(states, grads)]
        g_in = [torch.zeros_like(t) if need[i] else None
                for i, t in enumerate(node_inputs)]
        leaves = [p.detach().requires_grad_(bool(need[k + i]))
                  for i, p in enumerate(params)]
        g_par = [torch.zeros_like(p) if need[k + i] else None
                 for i, p in enumerate(params)]
        want_par = [i for i, p in enumerate(leaves) if p.requires_grad]
        want_in = [i for i, g in enumerate(g_in) if g is not None]
        manual = getattr(ctx.cell, "manual_backward", False)
        for st in reversed(ctx.steps):
            if manual:
                gathered = [s.index_select(0, st.src) for s in states]
                ins = [t.index_select(0, st.nodes) for t in node_inputs]
                go = [g.index_select(0, st.nodes) for g in g_states]
                r_gath, r_in, r_par = ctx.cell.step_backward(
                    gathered, ins, st.loc, st.size, params, go)
                for g, r in zip(g_states, r_gath):
                    if r is not None:
                        g.index_add_(0, st.src, r)
                for g, r in zip(g_in, r_in):
                    if g is not None and r is not None:
                        g.index_add_(0, st.nodes, r)
                for g, r in zip(g_par, r_par):
                    if g is not None and r is not None:
                        g.add_(r)
                continue
            with torch.enable_grad():
                gathered = [s.index_select(0, st.src).requires_grad_()
                            for s in states]
                ins = [t.index_select(0, st.nodes).requires_grad_(g_in[i] is not None)
                       for i, t in enumerate(node_inputs)]
                outs = ctx.cell.step(gathered, ins, st.loc, st.size, leaves)
            go = [g.index_select(0, st.nodes) for g in g_states]
            pairs = [(o, g) for o, g in zip(outs, go) if o.requires_grad]
            if not pairs:
                continue
            wrt = gathered + [ins[i] for i in want_in] + [leaves[i] for i in want_par]
            res = torch.autograd.grad([o for o, _ in pairs], wrt,
                                      [g for _, g in pairs], allow_unused=True)
            for i, r in enumerate(res[:ns]):
                if r is not None:
                    g_states[i].index_add_(0, st.src, r)
            for i, r in zip(want_in, res[ns:ns + len(want_in)]):
                if r is not None:
                    g_in[i].index_add_(0, st.nodes, r)
            for i, r in zip(want_par, res[ns + len(want_in):]):
                if r is not None:
                    g_par[i].add_(r)
        return (None, None, None, *g_in, *g_par)


def cell_sweep(cell: SweepCell, steps: tuple[LevelStep, ...],
               node_inputs: list[Tensor], params: list[Tensor]) -> tuple[Tensor, ...]:
    """Run ``cell`` level by level over ``steps``; returns the state buffers.

    Args:
        cell (SweepCell): the per-level update.
        steps: :attr:`LevelPlan.forward` or :attr:`LevelPlan.reverse`.
        node_inputs (list[Tensor]): ``[N, *]`` per-node inputs (the first one
            fixes ``N``, dtype and device of the states).
        params (list[Tensor]): the parameters ``cell.step`` uses; gradients
            are returned for them.

    Saved for backward: the states and the inputs, nothing per level.
    """
    return _CellSweep.apply(cell, steps, len(node_inputs), *node_inputs, *params)
