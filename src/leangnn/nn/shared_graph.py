"""Per-graph preprocessing of PyG convs, done once for all group functions.

A reversible GSR stack (Luo et al., DAC 2026) of ``L`` layers and ``G`` groups
calls ``2 L G`` convs per training step (one forward, one fused
inverse-and-recompute in the backward) on the same graph. Some PyG convs
preprocess ``edge_index`` on every call: :class:`~torch_geometric.nn.GCNConv`
runs :func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm` (self-loops, degrees,
``D^{-1/2} A D^{-1/2}`` edge weights) and :class:`~torch_geometric.nn.GATConv`
removes and re-adds self-loops. A plain residual stack does that ``L`` times
per step, a reversible one ``2 L G`` times, on edge-sized tensors that do not
shrink with the group width; on ``epfl/multiplier`` at 64 layers and 4 groups
it was a third of the reversible step's extra cost for GCN (measured).

:func:`shared_graph` computes that preprocessing once, with PyG's own
functions and the conv's own settings, and hands it to every conv for the
duration of a ``with`` block: GCN convs read it through their own
``_cached_edge_index`` slot (what ``GCNConv(cached=True)`` fills, cleared on
exit so nothing outlives the graph), GAT convs receive the looped
``edge_index`` with ``add_self_loops`` switched off for the block. The convs
thus compute exactly what they would have computed themselves (the same
functions on the same inputs), bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv
from torch_geometric.utils import add_self_loops, remove_self_loops

__all__ = ["shared_graph"]


def _gcn_sharable(conv: torch.nn.Module) -> bool:
    # cached=True convs keep their own (per-graph) cache; leave them alone
    return (isinstance(conv, GCNConv) and conv.normalize and not conv.cached
            and conv._cached_edge_index is None)


def _gat_sharable(conv: torch.nn.Module) -> bool:
    return isinstance(conv, GATConv) and conv.add_self_loops


@contextlib.contextmanager
def shared_graph(convs: Sequence[torch.nn.Module], edge_index, num_nodes: int,
                 dtype: torch.dtype, plain: bool = True) -> Iterator:
    """Within the block, ``convs`` reuse one preprocessing of ``edge_index``.

    Args:
        convs (sequence of Module): the convs that will be called on the graph.
        edge_index (Tensor or other): the graph; anything but a dense
            ``[2, E]`` index tensor is passed through untouched.
        num_nodes (int): ``N``.
        dtype (torch.dtype): the dtype the convs compute in (GCN's edge
            weights are made in it, as ``gcn_norm`` makes them from ``x``).
        plain (bool, optional): the convs are called as ``conv(x, edge_index)``
            only; with extra arguments (edge weights or attributes, which the
            preprocessing depends on and which may need gradients) nothing
            is shared. (default: ``True``)

    Yields:
        the ``edge_index`` to pass to every conv inside the block.
    """
    if not plain or not isinstance(edge_index, Tensor) \
            or edge_index.layout != torch.strided or edge_index.dim() != 2:
        yield edge_index
        return
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    gcn = [c for c in convs if _gcn_sharable(c)]
    gat = [c for c in convs if _gat_sharable(c)]
    # GCN convs with a filled cache ignore the edge_index they are given, so
    # looped edges may go to every conv as long as the others are GAT convs.
    looped = bool(gat) and len(gcn) + len(gat) == len(convs)
    norms: dict[tuple, tuple[Tensor, Tensor]] = {}
    try:
        for conv in gcn:
            key = (conv.improved, conv.add_self_loops, conv.flow)
            if key not in norms:
                norms[key] = gcn_norm(edge_index, None, num_nodes, *key, dtype)
            conv._cached_edge_index = norms[key]
        if looped:
            edge_index = add_self_loops(remove_self_loops(edge_index)[0],
                                        num_nodes=num_nodes)[0]
            for conv in gat:
                conv.add_self_loops = False
        yield edge_index
    finally:
        for conv in gcn:
            conv._cached_edge_index = None
        if looped:
            for conv in gat:
                conv.add_self_loops = True
