"""Which models run graph-parallel exactly, and GCN's global normalisation.

Graph parallelism (:mod:`leangnn.distributed.graph_parallel`) runs every
PyG ``MessagePassing`` layer of a model on a rank's local subgraph. That is
exact when a target's output depends only on the target, its in-edges and
their sources (the convs in :data:`SUPPORTED_CONVS`), when everything between
the convs is node-wise (no batch or graph statistics), and when GCN's
symmetric normalisation uses global degrees (:func:`local_gcn_norm`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor
from torch_geometric.nn import (
    GATConv,
    GATv2Conv,
    GCNConv,
    GINConv,
    GINEConv,
    GraphConv,
    SAGEConv,
    TransformerConv,
)
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.utils import add_remaining_self_loops, scatter

__all__ = ["SUPPORTED_CONVS", "message_passing_layers", "check_model", "takes_size",
           "local_gcn_norm"]

#: convs whose output on a target depends only on the target, its in-edges
#: and their sources (so running them on the local subgraph is exact).
SUPPORTED_CONVS = (GCNConv, SAGEConv, GATConv, GATv2Conv, GraphConv, GINConv,
                   GINEConv, TransformerConv)

def message_passing_layers(model: torch.nn.Module) -> list[MessagePassing]:
    """The outermost ``MessagePassing`` modules of ``model``, in module order."""
    out: list[MessagePassing] = []
    inner: set[int] = set()
    for m in model.modules():
        if isinstance(m, MessagePassing) and id(m) not in inner:
            out.append(m)
            inner.update(id(c) for c in m.modules())
    return out


def check_model(model: torch.nn.Module) -> None:
    """Raise ``ValueError`` when ``model`` cannot run graph-parallel exactly."""
    from torch_geometric.nn import norm as pyg_norm

    convs = message_passing_layers(model)
    if not convs:
        raise ValueError(f"graph parallel: {type(model).__name__} has no PyG "
                         "MessagePassing layer")
    for c in convs:
        if not isinstance(c, SUPPORTED_CONVS):
            raise ValueError(
                f"graph parallel: conv {type(c).__name__} is not supported; expected "
                f"one of {[k.__name__ for k in SUPPORTED_CONVS]}")
        if c.flow != "source_to_target":
            raise ValueError(f"graph parallel: {type(c).__name__} has flow="
                             f"{c.flow!r}; only 'source_to_target' is supported")
    graph_wide = tuple(getattr(pyg_norm, k) for k in (
        "GraphNorm", "InstanceNorm", "PairNorm", "MeanSubtractionNorm",
        "DiffGroupNorm", "GraphSizeNorm") if hasattr(pyg_norm, k))
    for m in model.modules():
        batch_stats = isinstance(m, torch.nn.modules.batchnorm._BatchNorm |
                                 pyg_norm.BatchNorm) and m.training
        graph_mode = isinstance(m, pyg_norm.LayerNorm) and m.mode != "node"
        if batch_stats or graph_mode or isinstance(m, graph_wide):
            raise ValueError(
                f"graph parallel: {type(m).__name__} normalises over many nodes "
                f"{'(training mode)' if batch_stats else ''}; only node-wise norms "
                "(LayerNorm) give exact results")


def takes_size(conv: MessagePassing) -> bool:
    """Whether ``conv.forward`` takes ``size`` (bipartite output size)."""
    return "size" in inspect.signature(conv.forward).parameters


def local_gcn_norm(edge_index: Tensor, edge_weight: Tensor | None, num_owned: int,
                   improved: bool, add_self_loops: bool, dtype: torch.dtype,
                   exchange: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    """GCN's symmetric normalisation of a rank's local edges with global degrees.

    The same result as :func:`torch_geometric.nn.conv.gcn_conv.gcn_norm` on the
    whole graph, restricted to the in-edges of the owned nodes: an owned
    node's degree is a sum over its in-edges, all local; a halo node's degree
    comes from its owner through ``exchange`` (one halo exchange).

    Args:
        edge_index (Tensor): ``[2, E_loc]`` local edges, targets owned
            (``< num_owned``), owned rows first in the local order.
        edge_weight (Tensor, optional): ``[E_loc]`` weights (default ones).
        num_owned (int): owned nodes.
        improved (bool): self-loop weight 2 instead of 1.
        add_self_loops (bool): add the missing self-loops of owned nodes.
        dtype (torch.dtype): dtype of the weights.
        exchange (callable): ``[n_own, 1] -> [n_halo, 1]`` halo exchange.

    Returns:
        The local edges (with self-loops) and their normalised weights.
    """
    w = (torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
         if edge_weight is None else edge_weight.to(dtype))
    if add_self_loops:
        # Self-loops for owned targets only: halo rows are never targets.
        edge_index, w = add_remaining_self_loops(edge_index, w,
                                                 2.0 if improved else 1.0, num_owned)
    deg_own = scatter(w, edge_index[1], 0, dim_size=num_owned, reduce="sum")
    with torch.no_grad():
        deg = torch.cat([deg_own, exchange(deg_own[:, None]).squeeze(1)])
    dinv = deg.pow(-0.5)
    dinv.masked_fill_(dinv == float("inf"), 0)
    return edge_index, dinv[edge_index[0]] * w * dinv[edge_index[1]]
