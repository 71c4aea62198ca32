"""A PyG model seen as a sequence of message-passing layers, one chunk at a time.

Layer-wise execution (NeutronJittor, Fundamental Research 2026; also the
layer-wise inference of PyG's ``BasicGNN``) runs layer ``l`` of a GNN for a
*chunk* of target nodes ``T`` given the layer's input on ``S = T + halo``
(targets first) and the chunk's in-edges. :class:`LayerwiseModel` wraps a
:class:`torch_geometric.nn.models.basic_gnn.BasicGNN` (``GCN``, ``GraphSAGE``,
``GAT``, ``GIN``, ...) so that every layer can be called that way with results
identical to the full-graph forward:

* GCN normalisation is computed once on the *full* graph
  (:func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm`) and passed as edge
  weights with the conv's own normalisation switched off for the call, since
  a halo node's degree inside a chunk is not its degree in the graph;
* bipartite convs get ``(x_S, x_T)`` so only the targets are computed;
* the post-conv ops (activation, norm, dropout) must be node-wise; batch
  statistics (``BatchNorm`` in training, graph-mode ``LayerNorm``) are refused;
* a hub whose in-edges do not fit one job runs as edge pieces
  (:meth:`LayerwiseModel.piece`, :mod:`~leangnn.offload.partial`).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
from torch import Tensor
from torch_geometric.nn import (
    GATConv,
    GATv2Conv,
    GCNConv,
    GINConv,
    GraphConv,
    SAGEConv,
)
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models.basic_gnn import BasicGNN

from leangnn.offload.partial import piece_kernel

__all__ = ["LayerwiseModel", "SUPPORTED_CONVS", "uncompiled"]

#: convs whose output on a target depends only on its in-edges and their
#: sources (verified against full-graph PyG in tests/offload).
SUPPORTED_CONVS = (GCNConv, SAGEConv, GATConv, GATv2Conv, GraphConv, GINConv)
_NODEWISE_NORMS = (torch.nn.Identity, torch.nn.LayerNorm)


def _is_nodewise_norm(norm: torch.nn.Module, training: bool) -> bool:
    from torch_geometric.nn.norm import LayerNorm as PygLayerNorm

    if isinstance(norm, _NODEWISE_NORMS):
        return True
    if isinstance(norm, PygLayerNorm):
        return norm.mode == "node"
    if isinstance(norm, torch.nn.modules.batchnorm._BatchNorm) or (
            type(norm).__name__ == "BatchNorm"):
        return not training  # running statistics are node-wise at eval time
    return False


def _input_width(model: torch.nn.Module) -> int:
    """The feature width ``model``'s first conv takes: ``in_channels``, or
    for a lazily built model (PyG's ``in_channels=-1``) the input side of
    its first conv's first matrix once a forward has shaped it."""
    from torch.nn.parameter import is_lazy

    if model.in_channels > 0:
        return int(model.in_channels)
    params = list(model.convs[0].parameters())
    if any(is_lazy(p) for p in params):
        raise ValueError("offload: the model is lazily initialised "
                         f"(in_channels={model.in_channels}) and has not run yet; "
                         "run one forward first (PyG's recipe: with "
                         "torch.no_grad(): model(data.x, data.edge_index))")
    return next(int(p.size(1)) for p in params if p.dim() == 2)


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module ``torch.compile`` wrapped, else ``model``: offload runs the
    model's convs one layer and one chunk at a time, never its compiled
    forward, and trains the very same parameters."""
    inner = getattr(model, "_orig_mod", None)
    # (by name: importing torch._dynamo to test the class costs ~1 s)
    if type(model).__name__ == "OptimizedModule" and isinstance(inner,
                                                                 torch.nn.Module):
        return inner
    return model


class LayerwiseModel:
    """Adapter running a PyG ``BasicGNN`` one layer and one chunk at a time.

    Args:
        model (BasicGNN): e.g. ``torch_geometric.nn.models.GCN`` as built by
            :func:`leangnn.nn.models.build_model` (``"gcn"``, ``"sage"``,
            ``"gat"``), or one ``torch.compile`` wrapped (:func:`uncompiled`).
            Jumping knowledge (``jk``) is not supported.

    Shapes:
        :meth:`layer` maps ``x_S [|S|, widths[li]]`` and local edges
        ``[2, E_c]`` (sources in ``[0, |S|)``, targets in ``[0, |T|)``) to
        ``[|T|, widths[li + 1]]``.
    """

    def __init__(self, model: torch.nn.Module):
        model = uncompiled(model)
        if not isinstance(model, BasicGNN):
            raise ValueError(
                "offload supports PyG BasicGNN models (GCN, GraphSAGE, GAT, GIN, "
                f"as built by leangnn.nn.models.build_model), got "
                f"{type(model).__name__}")
        if getattr(model, "jk_mode", None) is not None or hasattr(model, "lin"):
            raise ValueError("offload does not support jumping knowledge (jk="
                             f"{model.jk_mode!r}); build the model with jk=None")
        for conv in model.convs:
            if not isinstance(conv, SUPPORTED_CONVS):
                raise ValueError(
                    f"offload: conv {type(conv).__name__} is not supported; "
                    f"expected one of {[c.__name__ for c in SUPPORTED_CONVS]}")
            # whether its aggregation combines across jobs, checked here: a
            # graph without hubs never builds the split form and an
            # order-dependent aggregation (LSTM) failed on the jobs' edges
            piece_kernel(conv)
        kinds = {type(c) for c in model.convs}
        if len(kinds) != 1:
            raise ValueError(f"offload needs one conv type per model, got {kinds}")
        self.model = model
        self.num_layers = len(model.convs)
        widths = [_input_width(model)]
        for _ in range(self.num_layers - 1):
            widths.append(model.hidden_channels)
        widths.append(model.out_channels)
        self.widths = widths
        conv = model.convs[0]
        self.is_gcn = isinstance(conv, GCNConv)
        self._bipartite = not self.is_gcn
        self._takes_size = "size" in inspect.signature(conv.forward).parameters
        self._takes_weight = "edge_weight" in inspect.signature(conv.forward).parameters
        self.partial = None  # hubs' edge-split jobs, built on first use

    def check(self, training: bool | None = None) -> None:
        """Raise when the model's norms are not node-wise in its current mode
        (``training``: in that mode instead, e.g. ``True`` for a plan of its
        training while the model sits in eval mode)."""
        m = self.model
        training = m.training if training is None else training
        for norm in m.norms or []:
            if not _is_nodewise_norm(norm, training):
                raise ValueError(
                    f"offload needs node-wise norms, got {type(norm).__name__}"
                    f"{' in training mode' if training else ''}: batch or graph "
                    "statistics are not computed chunk by chunk")

    @property
    def needs_rng(self) -> bool:
        """Whether a training forward draws random numbers (dropout)."""
        if not self.model.training:
            return False
        p = [self.model.dropout.p] + [float(getattr(c, "dropout", 0.0) or 0.0)
                                      for c in self.model.convs]
        return any(v > 0 for v in p)

    def topology(self, edge_index: Tensor, num_nodes: int,
                 edge_weight: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """The full-graph edges (and weights) every chunk is cut from."""
        conv = self.model.convs[0]
        if self.is_gcn and conv.normalize:
            ei, w = gcn_norm(edge_index, edge_weight, num_nodes, conv.improved,
                             conv.add_self_loops, conv.flow,
                             dtype=next(self.model.parameters()).dtype)
            return ei, w
        if edge_weight is not None and not self._takes_weight:
            raise ValueError(f"{type(conv).__name__} does not take edge_weight, "
                             "but the graph has one")
        return edge_index, edge_weight

    @contextmanager
    def _raw_gcn(self, conv):
        # The weights are already normalised on the full graph: switch the
        # conv's own (chunk-local, hence wrong) normalisation off.
        if self.is_gcn:
            prev = conv.normalize
            conv.normalize = False
            try:
                yield
            finally:
                conv.normalize = prev
        else:
            yield

    def layer(self, li: int, x: Tensor, edge_index: Tensor, num_targets: int,
              edge_weight: Tensor | None = None) -> Tensor:
        """Layer ``l`` (conv and node-wise post-ops) for the first
        ``num_targets`` rows of ``x``."""
        m = self.model
        conv = m.convs[li]
        kwargs = {}
        if edge_weight is not None:
            kwargs["edge_weight"] = edge_weight
        with self._raw_gcn(conv):
            if self._bipartite:
                if self._takes_size:
                    kwargs["size"] = (x.size(0), num_targets)
                h = conv((x, x[:num_targets]), edge_index, **kwargs)
            else:
                h = conv(x, edge_index, **kwargs)[:num_targets]
        return self.post(li, h)

    def post(self, li: int, h: Tensor) -> Tensor:
        """Layer ``l``'s node-wise ops after the conv (activation, norm,
        dropout; none after the last layer)."""
        m = self.model
        if li < self.num_layers - 1:
            if m.act is not None and m.act_first:
                h = m.act(h)
            h = m.norms[li](h)
            if m.act is not None and not m.act_first:
                h = m.act(h)
            h = m.dropout(h)
        return h

    def piece(self, li: int, backward: bool, piece, x: Tensor, edge_index: Tensor,
              edge_weight: Tensor | None = None,
              grad: Tensor | None = None) -> Tensor | None:
        """One edge-split job of a hub (:mod:`~leangnn.offload.partial`):
        forward returns the hub's row (owner) or ``[0, C]``; backward
        accumulates parameter gradients and returns the sources' gradient
        (``None`` for the first layer)."""
        if self.partial is None:
            from leangnn.offload.partial import PartialAggregator

            self.partial = PartialAggregator(self)
        if backward:
            return self.partial.backward(li, piece, x, edge_index, edge_weight, grad)
        return self.partial.forward(li, piece, x, edge_index, edge_weight)

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({type(self.model).__name__}, "
                f"widths={self.widths})")
