"""Dry runs of level-by-level DAG models on a few of a circuit's levels.

A topological-order model (:class:`~leangnn.nn.dag.DAGNN`) runs a handful of
small ops per logic level and sweep: ~166,000 ops in one training step of
``epfl/priority`` (1,944 nodes), whose dry run took 16.6 s against a 0.8 s
real step. Its memory does not need them all: a sweep keeps ``O(N x C)``
buffers for the whole graph and frees each level's temporaries before the
next level (:func:`~leangnn.nn.levels.cell_sweep` saves nothing per level),
so a step's peak is the whole-graph tensors plus the largest level's
temporaries, and what the level before it returned, still referenced while
the next level runs: the sliced sweep pairs other levels, so its peak moves a
little either way (-0.65% to +0.27% on five circuits,
``benchmarks/plan_dag.py``).
Those are linear in the level's node and edge counts, so the level that
maximises them is one of the extreme points of the levels' ``(nodes, edges)``
cloud: :func:`key_levels` picks the level that maximises
each of a few positive mixes of the two, per sweep direction.

The dry run then traces the step over those levels only
(:func:`~leangnn.nn.levels.plan_in_use`), over those and a few narrow ones,
and over none, and extrapolates the work (each of ops, bytes written and
FLOPs as so much per level plus so much per node and edge swept) to every
level of every training graph (:func:`sweep_work`; the planner's epoch
work adds it to the rest of the step's).
The peak is the traced one; the per-level churn glibc's heap sees over all
levels is the ``dag`` family's calibrated heap factor.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable

import torch
from torch import Tensor
from torch_geometric.data import Data

from leangnn.nn.levels import (
    PLAN_CACHE_SIZE,
    EdgeIndexCache,
    LevelPlan,
    level_plan,
    plan_in_use,
    topological_levels,
)

__all__ = ["KEY_MIXES", "NARROW_LEVELS", "key_levels", "sliced_plan", "trace_levels",
           "sweep_work", "concrete_limit", "host_peak_bytes", "is_dag_model",
           "cached_plans_bytes", "PLAN_VIEW_BYTES"]

#: directions ``(cos t, sin t)`` in the (nodes, edges) plane, both scaled to
#: their largest level, whose maximising levels :func:`key_levels` keeps
KEY_MIXES = 6


def is_dag_model(model) -> bool:
    """Whether ``model`` sweeps a circuit's levels (a dry run of it goes
    through :func:`trace_levels`)."""
    from leangnn.nn.dag import DAGNN

    return isinstance(model, DAGNN)


def concrete_limit(data: Data) -> int:
    """The dry run's ``concrete_limit`` for a DAG model on ``data``: the
    model groups each level's nodes by gate type, read from the features, so
    those (and the one-hot read from them) keep their values, however large
    the circuit (``epfl/square``'s features passed the default limit)."""
    n, e = int(data.num_nodes), int(data.num_edges)
    x = data.get("x", None)
    return 4 * (n + e) + 4096 + 2 * (0 if x is None else int(x.numel()))


# edge_index -> host bytes its cut estimate peaked at when computed here
_HOST_PEAKS = EdgeIndexCache(64)
# edge_index -> its graph's depth (highest logic level)
_DEPTHS = EdgeIndexCache(256)

#: host bytes each view tensor of a level plan holds beside its index data:
#: its TensorImpl and Python object, glibc's chunk headers (measured: the 15
#: level plans of the default split, 5,397 views, 3.88 MiB of glibc's in-use
#: bytes for 1.03 MiB of indices: 554 B per view)
PLAN_VIEW_BYTES = 554


def _depth(data: Data) -> int:
    ei, n = data.edge_index, int(data.num_nodes)
    stamp = (ei._version, tuple(ei.shape), n)
    depth = _DEPTHS.get(ei, stamp)
    if depth is None:
        depth = int(topological_levels(ei, n).max()) if n else 0
        _DEPTHS.put(ei, stamp, depth)
    return depth


def cached_plans_bytes(graphs: list[Data], device="cpu") -> int:
    """Bytes of the level plans a DAG model keeps while it trains on
    ``graphs``.

    :func:`~leangnn.nn.levels.level_plan` caches each graph's plan for the
    run (up to its cache's size: the largest plans here): per graph the
    levels and degrees (``3 N``), the node order both sweeps share (``N``)
    and each sweep's edge gathers (``2 E``), ``int64``, viewed per level by
    ``3 + 6 (depth + 1)`` tensors. On CPU those views cost
    :data:`PLAN_VIEW_BYTES` each besides the data: 15 small circuits (the
    default split, 8.7k training nodes) keep 5,397 of them, 3.9 MiB of heap
    for 1.0 MiB of indices, most of the planner's 29% miss there before it
    counted them. On CUDA the data is on the
    device (9 storages per plan, each in 512-byte blocks) and the views on
    the host, outside the device's count.
    """
    cuda = torch.device(device).type == "cuda"
    sizes = []
    # one plan per edge_index tensor (a graph both trained and validated on)
    for g in {id(g.edge_index): g for g in graphs}.values():
        n, e = int(g.num_nodes), int(g.num_edges)
        if cuda:
            # level, in/out degree [N]; per sweep order [N], gathers [E] x 2
            sizes.append(sum(-(-b // 512) * 512 for b in
                             [8 * n] * 3 + [8 * n, 8 * e, 8 * e] * 2))
        else:
            # on CPU the tensors share numpy's buffers: both sweeps read the
            # one node order
            sizes.append(8 * (4 * n + 4 * e)
                         + PLAN_VIEW_BYTES * (3 + 6 * (_depth(g) + 1)))
    return sum(sorted(sizes, reverse=True)[:PLAN_CACHE_SIZE])


def host_peak_bytes(model, data: Data) -> int:
    """Host bytes the model's own precomputation on ``data`` peaks at:
    outside torch, so no dry run sees it; measured (``tracemalloc``, which
    numpy reports its buffers to) as it runs for real, once per graph.

    The DAG model's exact 8-leaf cut estimate (``cop_input`` with the
    ``cut`` estimator, the ``signal_prob`` default) peaked at 9-59 MiB of
    numpy arrays on seven circuits (``iscas89/s38417``: 59 MiB beside a
    29 MiB step), computed in the first step and cached for the run. 0 for
    other models, or when it was computed earlier in this process (then
    the run reuses it too).
    """
    if not (getattr(model, "cop_input", False) and
            getattr(model, "estimator", None) == "cut"):
        return 0
    ei = data.edge_index
    stamp = (ei._version, tuple(ei.shape))
    known = _HOST_PEAKS.get(ei, stamp)
    if known is not None:
        return known
    # the level plan is built before the estimate in a real step, and kept
    plan = level_plan(ei, int(data.num_nodes))
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    try:
        model.cut_estimate(data.x, ei, plan)
        peak = max(0, tracemalloc.get_traced_memory()[1] - before)
    finally:
        if not tracing:
            tracemalloc.stop()
    _HOST_PEAKS.put(ei, stamp, peak)
    return peak


def _sweep_sizes(plan: LevelPlan) -> list[tuple[int, int, int]]:
    """Per level, ascending: its nodes, fanin edges and fanout edges."""
    depth = len(plan.forward)
    # plan.reverse runs highest level first
    return [(plan.forward[i].size, int(plan.forward[i].src.numel()),
             int(plan.reverse[depth - 1 - i].src.numel()) if plan.reverse else 0)
            for i in range(depth)]


def key_levels(plan: LevelPlan, mixes: int = KEY_MIXES) -> list[int]:
    """Levels whose temporaries can be a sweep's largest, ascending.

    For each sweep direction (edges over fanins, over fanouts) and each of
    ``mixes`` weightings ``a x nodes + b x edges`` (``a, b >= 0``, from nodes
    alone to edges alone), the level that maximises it (the first on ties);
    and the lowest and highest levels.

    Args:
        plan (LevelPlan): the graph's plan.
        mixes (int, optional): weightings per direction. (default: ``6``)
    """
    return _key_levels(_sweep_sizes(plan), mixes)


def _key_levels(sizes: list[tuple[int, int, int]], mixes: int) -> list[int]:
    if not sizes:
        return []
    nodes, fan_in, fan_out = (list(c) for c in zip(*sizes))
    # and the first and last levels: a sweep's last level's temporaries
    # outlive its loop (in both directions and in backward), and are part
    # of the peak when what follows is larger
    keep: set[int] = {0, len(nodes) - 1}
    n_top = max(1, max(nodes))
    for edges in (fan_in, fan_out):
        e_top = max(1, max(edges))
        for k in range(max(2, mixes)):
            t = (math.pi / 2) * k / (max(2, mixes) - 1)
            a, b = math.cos(t) / n_top, math.sin(t) / e_top
            keep.add(max(range(len(nodes)), key=lambda i: a * nodes[i] + b * edges[i]))
    return sorted(keep)


def sliced_plan(plan: LevelPlan, levels: list[int]) -> LevelPlan:
    """``plan`` with its sweeps cut to ``levels`` (kept in sweep order); the
    whole graph's degrees and levels stay."""
    depth = len(plan.forward)
    keep = sorted(set(levels))
    rev = tuple(plan.reverse[depth - 1 - i] for i in reversed(keep)) \
        if plan.reverse else ()
    return LevelPlan(plan.num_nodes, plan.level, plan.in_degree, plan.out_degree,
                     tuple(plan.forward[i] for i in keep), rev)


def _units(sizes: list[tuple[int, int, int]], levels) -> int:
    """Nodes and edges the sweeps visit on ``levels`` (each node twice)."""
    return sum(2 * sizes[i][0] + sizes[i][1] + sizes[i][2] for i in levels)


def _narrowest(sizes: list[tuple[int, int, int]], skip: list[int],
               count: int) -> list[int]:
    rest = sorted((_units(sizes, [i]), i) for i in range(len(sizes))
                  if i not in set(skip))
    return [i for _, i in rest[:count]]


def _split(d_key: float, n_key: int, u_key: int, d_more: float, n_more: int,
           u_more: int) -> tuple[float, float]:
    """``(per level, per unit)`` with ``per level x n + per unit x u = d`` for
    the key levels and for the narrow ones added to them, both >= 0."""
    det = n_key * u_more - n_more * u_key
    if n_more and det:
        f = (d_key * u_more - d_more * u_key) / det
        u = (n_key * d_more - n_more * d_key) / det
        if f >= 0 and u >= 0:
            return f, u
    d, n, u = d_key + d_more, n_key + n_more, u_key + u_more
    if n_more and det:
        # one of the two came out negative: the best of either alone
        cands = [(0.0, max(0.0, d / max(1, u))), (max(0.0, d / max(1, n)), 0.0)]
        return min(cands, key=lambda c: abs(c[0] * n_key + c[1] * u_key - d_key)
                   + abs(c[0] * n_more + c[1] * u_more - d_more))
    return 0.0, max(0.0, d_key / max(1, u_key))


#: narrow levels traced besides the key ones, to tell a level's fixed work
#: (its share of the parameters' gradients: written per level whatever its
#: size) from the work per node and edge it sweeps
NARROW_LEVELS = 4


def trace_levels(run: Callable[[], object], data: Data):
    """``run()`` (a dry run of one training step on ``data``) over the
    :func:`key_levels` of ``data``, over those and a few narrow levels, and
    over no level.

    Returns:
        ``(trace, work)``: the trace of the key levels (its peak is the
        step's) and the work of the step: the levelless run's ``ops``,
        ``written`` and ``flops``, and under ``"sweep"`` (:func:`sweep_work`)
        each of them per level and per node and edge swept.
    """
    ei: Tensor = data.edge_index
    plan = level_plan(ei, int(data.num_nodes))
    sizes = _sweep_sizes(plan)
    key = _key_levels(sizes, KEY_MIXES)
    more = _narrowest(sizes, key, NARROW_LEVELS)
    traces = []
    for levels in (key, key + more, []):
        with plan_in_use(ei, sliced_plan(plan, levels)):
            traces.append(run())
    full, wider, bare = traces
    n_key, u_key = len(key), _units(sizes, key)
    n_more, u_more = len(more), _units(sizes, more)
    per = {}
    for k in ("ops", "written", "flops"):
        b, f, w = getattr(bare, k), getattr(full, k), getattr(wider, k)
        per[k] = _split(f - b, n_key, u_key, w - f, n_more, u_more)
    work = {"ops": bare.ops, "written": bare.written, "flops": bare.flops,
            "sparse_flops": bare.sparse_flops,
            "big_written": bare.big_written, "cold_written": bare.cold_written,
            "sweep": per}
    return max(full, wider, key=lambda t: t.peak_bytes), work


def sweep_work(sweep: dict, graphs: list[Data]) -> dict[str, float]:
    """The sweeps' ops, bytes written and FLOPs in an epoch over ``graphs``,
    from :func:`trace_levels`' ``work["sweep"]``: so much per level of each
    graph, so much per node and edge its sweeps visit (the rest of a step's
    work scales as any model's)."""
    levels = units = 0
    for g in graphs:
        n = int(g.num_nodes)
        levels += len(level_plan(g.edge_index, n).forward)
        units += 2 * (n + int(g.num_edges))
    return {k: per_level * levels + per_unit * units
            for k, (per_level, per_unit) in sweep.items()}
