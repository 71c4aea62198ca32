"""A real training step of a user's model on a piece of DPR's core.

The dry run's fake tensors accept what the core's real layout breaks: an
aggregation that scatters (PNA, TransformerConv, SAGEConv's ``std``) reads
the core's CSR int32 indices as its index and fails at the first step of
:func:`leangnn.fit`. :func:`probe_core` runs one step on a few of the core's
edges, at a cost independent of the graph's size, so that the plan's prune
rows say so instead.
"""

from __future__ import annotations

import copy

import torch
from torch_geometric.data import Data

from leangnn.plan.user_checks import LossFnError, error_line

__all__ = ["PROBE_EDGES", "piece_of_core", "probe_core"]

#: edges of DPR's core a prune row's probe trains on for real
PROBE_EDGES = 64


def piece_of_core(core: Data, edges: int = PROBE_EDGES) -> Data:
    """A few edges of DPR's core (its first ``edges`` entries and their end
    nodes) as a graph of the same layout: a CSR ``adj_t`` with the core's
    index dtype, or an ``edge_index`` for a core kept as an edge list, and
    the node tensors of those nodes."""
    if core.get("adj_t", None) is None:
        return _piece_of_edges(core, edges)
    adj = core.adj_t
    crow, col, val = adj.crow_indices(), adj.col_indices(), adj.values()
    m = min(edges, col.numel())
    row = torch.searchsorted(crow, torch.arange(m, dtype=crow.dtype,
                                                device=crow.device), right=True) - 1
    n = int(core.num_nodes)
    nodes = torch.unique(torch.cat([row.long(), col[:m].long()])) if m else \
        torch.arange(min(n, 2), device=crow.device)
    k = nodes.numel()
    new_row = torch.searchsorted(nodes, row.long())
    counts = torch.bincount(new_row, minlength=k)
    new_crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(crow.dtype)
    new_col = torch.searchsorted(nodes, col[:m].long()).to(col.dtype)
    piece = Data(adj_t=torch.sparse_csr_tensor(new_crow, new_col, val[:m], (k, k)),
                 num_nodes=k)
    return _with_nodes(piece, core, nodes, "adj_t")


def _piece_of_edges(core: Data, edges: int) -> Data:
    n = int(core.num_nodes)
    ei = core.edge_index[:, :edges]
    nodes = torch.unique(ei.reshape(-1)) if ei.numel() else \
        torch.arange(min(n, 2), device=ei.device)
    piece = Data(edge_index=torch.searchsorted(nodes, ei.contiguous()),
                 num_nodes=nodes.numel())
    return _with_nodes(piece, core, nodes, "edge_index")


def _with_nodes(piece: Data, core: Data, nodes: torch.Tensor, layout: str) -> Data:
    """``piece`` with ``core``'s node tensors at ``nodes`` and its other
    entries as they are (``layout``: the core's edges, in the piece already)."""
    n = int(core.num_nodes)
    for key, value in core.items():
        if key in (layout, "num_nodes"):
            continue
        node_level = isinstance(value, torch.Tensor) and value.dim() and \
            value.size(0) == n
        piece[key] = value[nodes.to(value.device)] if node_level else value
    return piece


def probe_core(model: torch.nn.Module, core: Data, loss_fn, device: torch.device
                ) -> str | None:
    """``None`` when a real training step of ``model`` runs on a piece of DPR's
    core, else the error's first line.

    The dry run's fake tensors accept what the core's real layout breaks: an
    aggregation that scatters (PNA, TransformerConv, SAGEConv's ``std``)
    reads the CSR's int32 indices as its index and fails at the first step
    of :func:`fit`. A few of the core's edges, on a copy of the model, say
    so at a cost independent of the graph's size.
    """
    twin = copy.deepcopy(model).to(device)  # the user's weights and stats stay
    twin.train()
    piece = piece_of_core(core).to(device)
    try:
        # dropout draws: the caller's random streams stay where they were
        with torch.random.fork_rng(devices=[device] if device.type == "cuda"
                                   else []):
            adj = piece.adj_t if piece.get("adj_t", None) is not None \
                else piece.edge_index
            loss = loss_fn(twin(piece.x, adj), piece)
            loss.backward()
    except LossFnError:
        raise
    except Exception as e:  # whatever the model raises here, fit would too
        return error_line(e)
    return None
