"""Edge-split jobs for hubs: partial aggregation combined exactly across jobs.

A hub with ``10^5``-``10^6`` in-edges does not fit one job of the offload
engine (NeutronJittor, Fundamental Research 2026), however few targets the
job has. Its in-edges are therefore split into *pieces*, each a job of its
own (targets: none, sources: the hub and the piece's neighbours), and the
conv is written as ``out_v = update(A_v, x_v)`` with an aggregate state
``A_v`` that pieces compute in part and that combines exactly:

* sum / mean (GCN, SAGE, GraphConv, GIN): partial sums (mean divides by the
  in-degree once, as PyG's scatter mean does);
* max / min (SAGE ``aggr="max"`` or ``"min"``): elementwise extrema and, per
  channel, the number of inputs equal to it, so the gradient splits evenly
  among ties across pieces exactly as ``scatter_reduce("amax")`` (``"amin"``)
  does;
* attention (GAT, GATv2): online softmax (Milakov & Gimelshein, 2018): a
  running maximum ``M``, ``S = sum exp(e - M)`` and ``O = sum exp(e - M) x'``,
  rescaled when ``M`` grows; ``out = O / (S + 1e-16)`` as PyG's softmax.

Forward visits a hub's pieces in order; the last (the *owner*, whose target
is the hub) combines, applies the update and the layer's node-wise post-ops.
Backward visits the owner first: it recomputes the update from the stored
state with autograd and keeps ``dL/dA``; every piece then backpropagates
``<dL/dA, A_i>``, where ``A_i`` is its part of the state *linearised* at the
stored reference (fixed ``M`` for attention, fixed tie mask and count for
max and min), which is exactly its share of the full-batch gradient.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import (
    GATConv,
    GATv2Conv,
    GCNConv,
    GINConv,
    GraphConv,
    SAGEConv,
)

__all__ = ["Piece", "PartialAggregator", "piece_kernel"]


@dataclass(frozen=True)
class Piece:
    """Where an edge-split job sits in its hub's group of jobs.

    Attributes:
        node (int): the hub's global id (row 0 of every piece's sources).
        index (int): this piece's index in ``[0, count)``.
        count (int): pieces of the hub; the last one owns the target.
        in_degree (int): the hub's in-edges in the graph the conv sees.
    """

    node: int
    index: int
    count: int
    in_degree: int

    @property
    def owner(self) -> bool:
        return self.index == self.count - 1


#: the extremum aggregations and how two pieces' extrema combine
_EXTREMA = {"max": torch.maximum, "min": torch.minimum}


def _aggr_name(conv) -> str:
    aggr = getattr(conv, "aggr", None)
    if isinstance(aggr, str):
        return {"add": "sum"}.get(aggr, aggr)
    name = type(getattr(conv, "aggr_module", None)).__name__
    return {"SumAggregation": "sum", "MeanAggregation": "mean",
            "MaxAggregation": "max", "MinAggregation": "min"}.get(name, name)


class _Kernel(ABC):
    """One conv as messages, an aggregate state and an update (each conv
    kind says how its aggregate becomes the node's output)."""

    reduce = "sum"  # "sum", "mean", "max", "min" or "softmax"

    def __init__(self, conv):
        self.conv = conv

    def messages(self, x: Tensor, src: Tensor, w: Tensor | None) -> Tensor:
        m = x.index_select(0, src)
        return m if w is None else m * w.view(-1, 1)

    @abstractmethod
    def update(self, agg: Tensor, x_v: Tensor) -> Tensor:
        """The node's output from its combined aggregate and its own row."""


class _GCN(_Kernel):
    def update(self, agg, x_v):
        # the conv's lin has no bias: projecting after the weighted sum is the
        # same linear map, on one row instead of every source of the piece
        out = self.conv.lin(agg)
        return out if self.conv.bias is None else out + self.conv.bias


class _SAGE(_Kernel):
    def __init__(self, conv):
        super().__init__(conv)
        self.reduce = _aggr_name(conv)
        if self.reduce not in ("sum", "mean", "max", "min"):
            raise ValueError(
                f"offload: {type(conv).__name__} aggr={self.reduce!r} is not "
                "supported: offload splits a node's in-edges across jobs and "
                "combines only 'sum', 'mean', 'max' and 'min' exactly; build the "
                "conv with one of them")

    def messages(self, x, src, w):
        m = x.index_select(0, src)
        if self.conv.project and hasattr(self.conv, "lin"):
            m = self.conv.lin(m).relu()
        return m

    def update(self, agg, x_v):
        c = self.conv
        out = c.lin_l(agg)
        if c.root_weight:
            out = out + c.lin_r(x_v)
        return F.normalize(out, p=2.0, dim=-1) if c.normalize else out


class _GraphConv(_SAGE):
    def messages(self, x, src, w):
        return _Kernel.messages(self, x, src, w)

    def update(self, agg, x_v):
        return self.conv.lin_rel(agg) + self.conv.lin_root(x_v)


class _GIN(_SAGE):
    def messages(self, x, src, w):
        return x.index_select(0, src)

    def update(self, agg, x_v):
        return self.conv.nn(agg + (1 + self.conv.eps) * x_v)


class _GAT(_Kernel):
    reduce = "softmax"

    def __init__(self, conv):
        super().__init__(conv)
        if conv.edge_dim is not None:
            raise ValueError("offload: GAT with edge_dim cannot be split across "
                             "jobs (edge features are not carried by chunks)")
        if getattr(conv, "res", None) is not None:
            raise ValueError("offload: GAT with residual=True cannot be split "
                             "across jobs")
        self.v2 = isinstance(conv, GATv2Conv)

    def _proj(self, x: Tensor, dst: bool) -> Tensor:
        c, H, C = self.conv, self.conv.heads, self.conv.out_channels
        if self.v2:
            lin = c.lin_r if dst else c.lin_l
            if c.share_weights:
                lin = c.lin_l
        else:
            lin = c.lin if c.lin is not None else (c.lin_dst if dst else c.lin_src)
        return lin(x).view(-1, H, C)

    def scores(self, x: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
        """Logits ``[E, H]`` of the edges ``src -> 0`` and values ``[E, H, C]``."""
        c = self.conv
        if c.training and c.dropout > 0:
            raise ValueError("offload: GAT attention dropout cannot be split "
                             "across jobs in training; use dropout=0 in the conv")
        xs = self._proj(x.index_select(0, src), dst=False)
        xd = self._proj(x[:1], dst=True)
        if self.v2:
            e = (F.leaky_relu(xs + xd, c.negative_slope) * c.att).sum(-1)
        else:
            e = (xs * c.att_src).sum(-1) + (xd * c.att_dst).sum(-1)
            e = F.leaky_relu(e, c.negative_slope)
        return e, xs

    def update(self, agg, x_v):
        o, s = agg
        c = self.conv
        out = o / (s + 1e-16).unsqueeze(-1)
        out = out.reshape(1, -1) if c.concat else out.mean(dim=0, keepdim=True)
        return out if c.bias is None else out + c.bias


def piece_kernel(conv) -> _Kernel:
    """The split form of ``conv``.

    Raises:
        ValueError: the conv (or its configuration) cannot be split.
    """
    for kind, cls in ((GCNConv, _GCN), (GATConv, _GAT), (GATv2Conv, _GAT),
                      (SAGEConv, _SAGE), (GraphConv, _GraphConv), (GINConv, _GIN)):
        if isinstance(conv, kind):
            if cls in (_GCN, _GAT) and _aggr_name(conv) != "sum":
                # their kernels sum (GAT: softmax-weighted) whatever aggr says
                raise ValueError(f"offload: {kind.__name__} aggr="
                                 f"{_aggr_name(conv)!r} is not supported; "
                                 "build it with the default aggr='add'")
            return cls(conv)
    raise ValueError(f"offload: {type(conv).__name__} cannot be split across jobs")


def _sources(kernel: _Kernel, ei: Tensor, piece: Piece) -> Tensor:
    """Local sources of the piece's edges (all into source 0, the hub)."""
    src = ei[0].long()
    if kernel.reduce == "softmax" and kernel.conv.add_self_loops:
        # the conv drops the graph's self-loops and adds one per target:
        # the owner piece carries it (attention convs take no edge weights)
        src = src[src != 0]
        if piece.owner:
            src = torch.cat([src, src.new_zeros(1)])
    return src


class PartialAggregator:
    """Runs a hub's pieces for a :class:`~leangnn.offload.layerwise.
    LayerwiseModel`, holding each hub's aggregate state between its jobs.

    Args:
        lw (LayerwiseModel): the model, layer by layer.
    """

    def __init__(self, lw):
        self.lw = lw
        self.kernels = [None] * lw.num_layers
        self.state: dict[tuple[int, int], list[Tensor]] = {}
        self.grad: dict[tuple[int, int], list[Tensor | None]] = {}

    def kernel(self, li: int) -> _Kernel:
        if self.kernels[li] is None:
            self.kernels[li] = piece_kernel(self.lw.model.convs[li])
        return self.kernels[li]

    # --------------------------------------------------------------- states
    def _partial(self, k: _Kernel, x: Tensor, src: Tensor, w) -> list[Tensor]:
        """This piece's forward state (combined with :meth:`_combine`)."""
        if k.reduce == "softmax":
            e, xs = k.scores(x, src)
            m = e.max(0).values  # [H]
            p = (e - m).exp()
            return [m, p.sum(0), (p.unsqueeze(-1) * xs).sum(0)]
        msg = k.messages(x, src, w)
        if k.reduce in _EXTREMA:
            m = msg.amax(0) if k.reduce == "max" else msg.amin(0)
            return [m, (msg == m).sum(0).to(msg.dtype)]
        return [msg.sum(0)]

    @staticmethod
    def _combine(reduce: str, a: list[Tensor], b: list[Tensor]) -> list[Tensor]:
        if reduce == "softmax":
            m = torch.maximum(a[0], b[0])
            sa, sb = (a[0] - m).exp(), (b[0] - m).exp()
            return [m, a[1] * sa + b[1] * sb,
                    a[2] * sa.unsqueeze(-1) + b[2] * sb.unsqueeze(-1)]
        if reduce in _EXTREMA:
            m = _EXTREMA[reduce](a[0], b[0])
            return [m, a[1] * (a[0] == m) + b[1] * (b[0] == m)]
        return [a[0] + b[0]]

    def _linear(self, k: _Kernel, x: Tensor, src: Tensor, w,
                ref: list[Tensor]) -> list[Tensor]:
        """This piece's share of the state, linearised at the combined
        reference ``ref``: the full state's gradient is the sum of these."""
        if k.reduce == "softmax":
            e, xs = k.scores(x, src)
            p = (e - ref[0]).exp()
            return [(p.unsqueeze(-1) * xs).sum(0), p.sum(0)]  # O_i, S_i
        msg = k.messages(x, src, w)
        if k.reduce in _EXTREMA:
            tie = (msg == ref[0]).to(msg.dtype) / ref[1]
            return [(msg * tie).sum(0)]
        return [msg.sum(0)]

    @staticmethod
    def _value(k: _Kernel, state: list[Tensor]) -> list[Tensor]:
        """The combined state in :meth:`_linear`'s layout."""
        if k.reduce == "softmax":
            return [state[2], state[1]]
        return [state[0]]

    def _update(self, k: _Kernel, li: int, agg: list[Tensor], x_v: Tensor,
                piece: Piece) -> Tensor:
        if k.reduce == "softmax":
            h = k.update((agg[0], agg[1]), x_v)
        else:
            a = agg[0]
            if k.reduce == "mean":
                a = a / max(piece.in_degree, 1)
            h = k.update(a.unsqueeze(0), x_v)
        return self.lw.post(li, h)

    # ----------------------------------------------------------------- jobs
    def forward(self, li: int, piece: Piece, x: Tensor, ei: Tensor,
                w: Tensor | None) -> Tensor:
        """A piece's forward: combine its partial state; the owner returns
        the hub's output row ``[1, C]``, the others ``[0, C]``."""
        k, key = self.kernel(li), (li, piece.node)
        src = _sources(k, ei, piece)
        with torch.no_grad():
            part = self._partial(k, x, src, w)
            if piece.index > 0:
                part = self._combine(k.reduce, self.state[key], part)
            self.state[key] = part
            if not piece.owner:
                return x.new_empty(0, self.lw.widths[li + 1])
            return self._update(k, li, self._value(k, part), x[:1], piece)

    def backward(self, li: int, piece: Piece, x: Tensor, ei: Tensor,
                 w: Tensor | None, g: Tensor) -> Tensor | None:
        """A piece's backward: accumulates parameter gradients and returns
        the gradient of its sources (``None`` for the first layer). The owner,
        visited first, also backpropagates the update from ``g [1, C]``."""
        k, key = self.kernel(li), (li, piece.node)
        state = self.state[key]
        src = _sources(k, ei, piece)
        x = x.detach().requires_grad_(li > 0)
        with torch.enable_grad():
            part = self._linear(k, x, src, w, state)
            if piece.owner:
                # value: exactly the forward's state; gradient: through this
                # piece's share, and kept for the other pieces
                agg = [v + (p - p.detach()) for v, p in
                       zip(self._value(k, state), part)]
                for a in agg:
                    if a.requires_grad:
                        a.retain_grad()
                out = self._update(k, li, agg, x[:1], piece)
                torch.autograd.backward(out, g)
                self.grad[key] = [a.grad if a.requires_grad else None for a in agg]
            else:
                pairs = [(p, gp) for p, gp in zip(part, self.grad[key])
                         if p.requires_grad and gp is not None]
                if pairs:
                    torch.autograd.backward([p for p, _ in pairs],
                                            [gp for _, gp in pairs])
        if piece.index == 0:  # the last piece of the backward sweep
            self.state.pop(key, None)
            self.grad.pop(key, None)
        if li == 0:
            return None
        return x.grad if x.grad is not None else torch.zeros_like(x)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(open={len(self.state)})"
