"""What DPR keeps of every graph it validates on, counted for the planner.

DPR (Decoupled Prune-and-Reconstruct, :class:`~leangnn.prune.dpr.DPRStrategy`)
scores a validation graph by encoding its core and rebuilding every pruned
node from its anchors: personalised-PageRank weights to core nodes. The first
validation pass builds that graph's state (its core, where it is not a
training graph's; its anchors; the serving operands) and the strategy keeps it
for the run, so every later epoch's training step runs with it alive. A
one-step dry run sees none of it. Measured through ``leangnn train``: the
csbm:2000000 SAGE-2 run at ratio 0.3, whose validation graph is its training
graph, peaked 159 MiB above the estimate, about its 1.4M pruned nodes'
anchors; the default split's two validation circuits keep 1.0 MiB.

Counted exactly from the structures' sizes where they are known before the
run (a validation graph's own core is built here, as DPR builds it), and as an
upper bound where only the walk knows (``k`` anchors per pruned node, fewer
where the walk reaches fewer core nodes).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.data import Data

__all__ = ["anchor_bytes", "walk_entries_bound", "serve_graph_bytes",
           "state_bytes", "validation_kept_bytes"]

_INT32_MAX = 2**31 - 1


def anchor_bytes(num_pruned: int, num_core: int, num_anchors: int | None,
                 chunk_size: int, elem: int = 4, on_device: bool = False,
                 nnz: int | None = None) -> int:
    """Bytes of the anchors of ``num_pruned`` nodes (:class:`~leangnn.prune.
    decoder.Anchors`: a CSR ``[P, N_core]`` with at most ``num_anchors``
    entries a row, ``None``: every core node; the walk mass) and of their
    serving chunks.

    Args:
        num_pruned (int): ``P``, the pruned nodes.
        num_core (int): the core's nodes (the columns).
        num_anchors (int, optional): ``k``.
        chunk_size (int): rows per serving chunk.
        elem (int, optional): bytes of a weight. (default: ``4``)
        on_device (bool, optional): what a CUDA device holds: each chunk's
            weights, mass and output rows, copied there once (the anchors
            themselves stay on the host). ``False``: a CPU, where the chunks
            are views but for their rebased row pointers. (default: ``False``)
        nnz (int, optional): the anchors' entries where known (after the
            walk). (default: ``None``, the bound ``P x k``)
    """
    p = int(num_pruned)
    if p <= 0:
        return 0
    k = int(num_core) if num_anchors is None else min(int(num_anchors),
                                                      int(num_core))
    nnz = p * k if nnz is None else int(nnz)
    idx = 4 if max(nnz, int(num_core)) <= _INT32_MAX else 8
    chunks = math.ceil(p / max(1, int(chunk_size)))
    if on_device:
        return idx * (p + chunks) + (idx + elem) * nnz + elem * p + 8 * p
    # (the anchors' node ids are the pruned ids' own storage, which the
    # graph's state holds anyway)
    csr = idx * (p + 1) + (idx + elem) * nnz
    return csr + elem * p + idx * (p + chunks)


def walk_entries_bound(edge_index: Tensor, num_nodes: int, num_steps: int) -> int:
    """An upper bound on the anchor entries of every node of a graph: the
    walks of 1 to ``num_steps`` hops from all of them over the edges taken
    both ways (a walk of ``t`` hops reaches at most one node; a row keeps at
    most the nodes its walks reach). Bounds the anchors where ``k`` a row
    does not: ``k`` above what a few hops reach (``--anchors 100000``), or
    every core node (dense anchors). ``num_steps`` sparse products, O(E)
    each."""
    n = int(num_nodes)
    if n == 0 or edge_index.numel() == 0:
        return 0
    ei = edge_index.cpu()
    src, dst = torch.cat([ei[0], ei[1]]), torch.cat([ei[1], ei[0]])
    # (float64: walk counts outgrow int64 on dense graphs; a bound may round)
    v, total = torch.ones(n, dtype=torch.float64), 0.0
    for _ in range(max(1, int(num_steps))):
        v = torch.zeros(n, dtype=torch.float64).index_add_(0, src, v[dst])
        total += float(v.sum())
    return int(min(total, 2.0**62))


def serve_graph_bytes(model: torch.nn.Module, adj_t: Tensor | None,
                      reassociate: bool, elem: int = 4) -> int:
    """Bytes of the serving operands :class:`~leangnn.prune.serve.ServeGraph`
    builds once per graph for a servable encoder: SAGE's mean weights (new
    values, shared indices) or GCN's normalised adjacency with self-loops (a
    CSR of its own, int32 indices)."""
    from leangnn.prune.serve import _gcn_conv_ok, servable

    if not reassociate or adj_t is None or not servable(model):
        return 0
    n, nnz = int(adj_t.size(0)), int(adj_t._nnz())
    # (a servable model's convs are all one kind: a PyG BasicGNN's)
    if _gcn_conv_ok(model.convs[0]):
        return 4 * (n + 1) + (4 + elem) * (nnz + n)
    return elem * nnz  # mean weights


def state_bytes(obj, seen: set[int] | None = None) -> int:
    """Bytes of the distinct tensor storages reachable from ``obj`` (tensors,
    sparse ones' parts, ``Data``, serving operands, dataclasses, lists,
    tuples, dicts)."""
    from leangnn.profile import sparse_parts
    from leangnn.prune.serve import ServeGraph

    seen = set() if seen is None else seen
    total = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            for p in sparse_parts(x):
                s = p.untyped_storage()
                if s.data_ptr() not in seen and s.nbytes():
                    seen.add(s.data_ptr())
                    total += s.nbytes()
        elif isinstance(x, ServeGraph):
            stack += [x.adj_t, *x._ops.values()]
        elif isinstance(x, Data):
            stack += list(x.to_dict().values())
        elif isinstance(x, dict):
            stack += list(x.values())
        elif isinstance(x, (list, tuple)):
            stack += list(x)
        elif hasattr(x, "__dataclass_fields__"):
            stack += [getattr(x, f) for f in x.__dataclass_fields__]
    return total


def validation_kept_bytes(cfg, splits, model: torch.nn.Module, core: Data,
                          big: Data, device: torch.device | str = "cpu") -> int:
    """What DPR keeps for the run of the validation graphs of ``splits``
    after its first validation pass (on a CUDA ``device``: what the device
    keeps).

    Args:
        cfg (TrainConfig): the run (its DPR fields).
        splits (GraphSplits): the loaded graphs.
        model (Module): the encoder (whether it is served by reassociation).
        core (Data): the core of ``big``, built for the estimate.
        big (Data): the largest training graph.
        device (torch.device or str, optional): where DPR runs.
            (default: ``"cpu"``)

    Returns:
        int: bytes; a validation graph that is a training graph (by DPR's
        key: name and size, as csbm's are) adds its anchors and serving
        operands, another one its whole state too.
    """
    from leangnn.prune.dpr import DPRStrategy

    dev = torch.device(device)
    cuda = dev.type != "cpu"
    strategy = DPRStrategy.from_config(cfg)
    c = strategy.config
    trained = {strategy._key(g) for g in splits.train}
    total, done = 0, set()
    for g in splits.val:
        key = strategy._key(g)
        if key in done or int(g.num_nodes) == 0:
            continue
        done.add(key)
        if key == strategy._key(big):
            n_core, adj_t, own = int(core.num_nodes), core.get("adj_t", None), 0
        else:
            # its core as DPR builds it (seeded, the same selection), measured
            with torch.random.fork_rng(devices=[]):
                st = strategy._build(g)
            n_core, adj_t = st.core.num_core, st.train_data.get("adj_t", None)
            # (a CUDA device holds its core training graph alone)
            own = 0 if key in trained else state_bytes(
                st.train_data if cuda else
                [st.core.index, st.core.mask, st.train_data, st.pruned, st.rows])
        p = int(g.num_nodes) - n_core
        k = n_core if c.dense or c.num_anchors is None else min(c.num_anchors,
                                                                n_core)
        nnz = p * k
        if nnz > 2 * int(g.num_edges):
            # (the walk bound is at least its first hop's 2E: below that it
            # cannot be the smaller, and is not computed)
            nnz = min(nnz, walk_entries_bound(g.edge_index, g.num_nodes,
                                              c.num_steps))
        total += own + anchor_bytes(p, n_core, k, c.chunk_size, on_device=cuda,
                                    nnz=nnz)
        total += serve_graph_bytes(model, adj_t, c.serve_reassociate)
    return total
