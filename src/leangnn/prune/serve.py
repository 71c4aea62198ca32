"""Exact serving kernels of DPR: ``embedding_bag`` row products, cached graph operands.

All-node serving of :class:`~leangnn.prune.dpr.DPRStrategy` spends much of
its time in sparse products (the encoder's aggregations on the core, the
anchor products of the decoder) and, through PyG, in graph-only work redone
on every call. Two changes cut both and compute the same function (equal up
to float rounding, tested in float64 against PyG):

* :func:`rows_mm`: ``W @ X`` for a CSR ``W`` as one
  :func:`torch.nn.functional.embedding_bag` call (``mode="sum"`` with the CSR
  values as ``per_sample_weights``, ``crow`` as the bag offsets). Its CPU
  kernel (FBGEMM) was 2.4x faster than ``torch.sparse.mm`` (MKL) on the
  100k-node CSBM core (740k entries, 64 columns, one thread: 5.8 ms against
  13.9 ms of CPU time) and 1.7x at 8 columns. ``kernel="csr"`` is the off
  switch.
* :func:`serve_forward`: PyG's :class:`~torch_geometric.nn.models.GraphSAGE`
  (Hamilton et al., NeurIPS 2017) with mean aggregation and
  :class:`~torch_geometric.nn.models.GCN` (Kipf and Welling, ICLR 2017),
  served layer by layer. SAGE aggregates at ``min(in, out)`` width:
  ``lin_l(mean_j x_j) = mean_j lin_l(x_j)`` (the bias after), so a
  64 -> 8 output layer aggregates 8 columns instead of 64. The mean weights
  ``1 / deg`` and GCN's normalisation are built once per graph
  (:class:`ServeGraph`), not in every conv of every call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..graphs.sparse import csr_tensor
from ..nn.csr import mean_sage_conv

__all__ = ["KERNELS", "rows_mm", "csr_rows", "anchor_chunks", "serve_pruned",
           "mean_adjacency", "ServeGraph", "servable", "serve_forward"]

#: ``bag``: :func:`~torch.nn.functional.embedding_bag`; ``csr``: ``torch.sparse``
KERNELS = ("bag", "csr")


def rows_mm(w: Tensor, x: Tensor, kernel: str = "bag") -> Tensor:
    """``w @ x`` for a ``torch.sparse_csr`` ``w [M, N]`` and a dense ``x [N, C]``.

    Args:
        w (Tensor): sparse CSR matrix whose ``crow_indices()`` start at 0.
        x (Tensor): dense matrix (same dtype as ``w``'s values).
        kernel (str, optional): ``"bag"`` (one ``embedding_bag`` call) or
            ``"csr"`` (``torch.sparse``). (default: ``"bag"``)

    Returns:
        ``[M, C]``.
    """
    if kernel == "csr":
        return w @ x
    if kernel != "bag":
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    # embedding_bag reads a non-contiguous table wrongly (torch 2.13, CPU), so
    # the table is made contiguous; rows without entries come out as zeros.
    return F.embedding_bag(w.col_indices(), x.contiguous(), w.crow_indices(),
                           mode="sum", per_sample_weights=w.values(),
                           include_last_offset=True)


def csr_rows(w: Tensor, a: int, b: int) -> Tensor:
    """Rows ``a:b`` of a ``torch.sparse_csr`` ``w`` as a CSR matrix whose
    ``crow_indices()`` start at 0 (views of ``w``'s index and value arrays)."""
    crow = w.crow_indices()
    lo, hi = int(crow[a]), int(crow[b])
    return csr_tensor(crow[a:b + 1] - lo, w.col_indices()[lo:hi], w.values()[lo:hi],
                      (b - a, w.size(1)))


def anchor_chunks(anchors, pruned: Tensor, chunk_size: int, device: torch.device,
                  cached: tuple | None = None) -> tuple[tuple, list]:
    """Graph-only operands of serving the pruned nodes, sliced and moved once.

    Args:
        anchors (Anchors): the pruned nodes' anchors (rows in ``pruned``'s
            order).
        pruned (Tensor): pruned node ids ``[P]``.
        chunk_size (int): rows per chunk.
        device (torch.device): where serving runs.
        cached (tuple, optional): an earlier return value, returned as it is
            when made from the same anchor tensors (by identity) and settings.

    Returns:
        ``(key, chunks)``; per chunk: anchor weights (CSR, on ``device``), the
        rows' node ids (where ``anchors.nodes`` lives), walk mass and output
        rows (on ``device``).
    """
    tensors = (anchors.weight, anchors.nodes, anchors.mass)
    if (cached is not None and cached[0][1:] == (chunk_size, device)
            and all(t is c for t, c in zip(tensors, cached[0][0]))):
        return cached
    n, chunks = pruned.numel(), []
    for a in range(0, n, chunk_size):
        b = min(n, a + chunk_size)
        chunks.append((csr_rows(anchors.weight, a, b).to(device), anchors.nodes[a:b],
                       anchors.mass[a:b].to(device), pruned[a:b].to(device)))
    return (tensors, chunk_size, device), chunks


def serve_pruned(out: Tensor, chunks: list, h: Tensor, xc: Tensor, x: Tensor,
                 decoder=None, fused: bool | None = None,
                 kernel: str = "bag") -> Tensor:
    """Write the pruned nodes' rows of ``out``: anchor averaging of the core's
    outputs ``h`` without ``decoder``, else the decoder on their anchors.

    Args:
        out (Tensor): all-node outputs ``[N, C]``, filled in place.
        chunks (list): :func:`anchor_chunks` of the pruned nodes.
        h (Tensor): encoder outputs on the core ``[N_core, C]``.
        xc (Tensor): the core's features ``[N_core, F]`` (on ``h``'s device).
        x (Tensor): all nodes' features ``[N, F]``.
        decoder (AnchorDecoder, optional): ``None``: ``W @ h`` per pruned row.
        fused (bool, optional): gather :meth:`~leangnn.prune.decoder.
            AnchorDecoder.project_core` rows; ``None`` fuses when that does
            not widen the gathered rows. (default: ``None``)
        kernel (str, optional): see :func:`rows_mm`. (default: ``"bag"``)

    Returns:
        ``out``.
    """
    if not chunks:
        return out
    dec = decoder
    if fused is None:
        # The sparse gather, not the dense products, bounds serving: fusing
        # saves (F + C + 1) x hidden per pruned node but gathers hidden + C
        # columns per anchor instead of F + C.
        fused = (dec is not None and dec.anchor_features
                 and dec.in_channels >= dec.hidden_channels)
    fused = fused and dec is not None
    # The rows every anchor product gathers from, once per call.
    if fused:
        table = dec.project_core(h, xc if dec.anchor_features else None)
    elif dec is not None and dec.anchor_features:
        table = torch.cat([h, xc.to(h.dtype)], 1)
    else:
        table = h
    c = h.size(1)
    for w, nodes, mass, dst in chunks:
        rows = rows_mm(w, table, kernel)
        if dec is None:
            rec = rows
        else:
            xi = x.index_select(0, nodes.to(x.device)).to(h.device)
            if fused:
                rec = dec.forward_anchored(xi, rows, mass)
            else:
                rec = dec(xi, rows[:, :c], rows[:, c:] if dec.anchor_features
                          else None, mass)
        out.index_copy_(0, dst, rec.to(out.dtype))
    return out


def mean_adjacency(adj_t: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``adj_t`` with every row divided by its entry count (CSR, same indices).

    ``torch.sparse.mm(adj_t, x, "mean")`` (PyG's mean aggregation on a sparse
    adjacency) divides each row's weighted sum by the row's entry count; this
    matrix times ``x`` is the same product, with the division done once.

    Args:
        adj_t (Tensor): ``torch.sparse_csr`` ``[N, N]`` (row = target).
        dtype (torch.dtype, optional): value type. (default: ``adj_t``'s)
    """
    crow, vals = adj_t.crow_indices(), adj_t.values()
    dtype = dtype or vals.dtype
    count = (crow[1:] - crow[:-1]).long()
    inv = count.clamp(min=1).to(dtype).reciprocal()
    vals = vals.to(dtype) * torch.repeat_interleave(inv, count,
                                                    output_size=vals.numel())
    return csr_tensor(crow, adj_t.col_indices(), vals, adj_t.shape)


class ServeGraph:
    """Graph-only operands of serving on one adjacency, built on first use.

    The mean weights of SAGE (:func:`mean_adjacency`) and the GCN
    normalisation ``D^{-1/2}(A + I)D^{-1/2}`` (PyG's own ``gcn_norm``, called
    once instead of in every conv of every call: 43 ms of a 115 ms GCN
    encoder on the 100k-node CSBM core, per layer) are kept per dtype and
    conv settings.

    Args:
        adj_t (Tensor): ``torch.sparse_csr`` ``[N, N]`` (row = target), the
            adjacency the model would be called with.
    """

    def __init__(self, adj_t: Tensor):
        self.adj_t = adj_t
        self._ops: dict = {}

    def mean(self, dtype: torch.dtype) -> Tensor:
        key = ("mean", dtype)
        if key not in self._ops:
            self._ops[key] = mean_adjacency(self.adj_t, dtype)
        return self._ops[key]

    def gcn(self, conv, dtype: torch.dtype) -> Tensor:
        key = ("gcn", conv.normalize, conv.improved, conv.add_self_loops, conv.flow,
               dtype)
        if key not in self._ops:
            adj = self.adj_t
            if conv.normalize:
                from torch_geometric.nn.conv.gcn_conv import gcn_norm

                adj = gcn_norm(adj, None, adj.size(0), conv.improved,
                               conv.add_self_loops, conv.flow, dtype)[0]
            adj = adj.to(dtype).to_sparse_csr()
            crow, col = adj.crow_indices(), adj.col_indices()
            # int32 indices, as the adjacency itself has: a third less memory
            if (crow.dtype == torch.int64
                    and max(int(crow[-1]), adj.size(1)) < 2**31 - 1):
                crow, col = crow.int(), col.int()
            self._ops[key] = csr_tensor(crow, col, adj.values(), adj.shape)
        return self._ops[key]

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_nodes={self.adj_t.size(0)}, "
                f"operands={len(self._ops)})")


def _sage_conv_ok(conv) -> bool:
    # a lazy conv (in_channels=-1) has no weights to project with yet
    return mean_sage_conv(conv) and conv.in_channels > 0


def _gcn_conv_ok(conv) -> bool:
    from torch_geometric.nn import GCNConv

    # cached convs would reuse whatever graph they saw first; PyG keeps that
    return isinstance(conv, GCNConv) and conv.aggr in ("add", "sum") and not conv.cached


def servable(model: torch.nn.Module) -> bool:
    """Whether :func:`serve_forward` computes ``model(x, adj_t)``: a PyG
    :class:`~torch_geometric.nn.models.basic_gnn.BasicGNN` (``GraphSAGE``,
    ``GCN``) whose convs are all mean-aggregating
    :class:`~torch_geometric.nn.SAGEConv` (no projection, no normalisation)
    or sum-aggregating, uncached :class:`~torch_geometric.nn.GCNConv`."""
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    return (isinstance(model, BasicGNN) and len(model.convs) > 0
            and all(_sage_conv_ok(c) or _gcn_conv_ok(c) for c in model.convs))


def _sage_layer(conv, x: Tensor, a_mean: Tensor, kernel: str) -> Tensor:
    wl, bias = conv.lin_l.weight, conv.lin_l.bias
    if conv.out_channels < conv.in_channels:
        # Project first: the aggregation then moves out_channels columns.
        out = rows_mm(a_mean, x @ wl.t(), kernel)
        if bias is not None:
            out += bias
    else:
        agg = rows_mm(a_mean, x, kernel)
        out = (agg @ wl.t() if bias is None else torch.addmm(bias, agg, wl.t()))
    if conv.root_weight:
        wr, br = conv.lin_r.weight, conv.lin_r.bias
        out.addmm_(x, wr.t())
        if br is not None:
            out += br
    return out


def _gcn_layer(conv, x: Tensor, a_hat: Tensor, kernel: str) -> Tensor:
    # PyG's order already projects first (out_channels-wide aggregation)
    out = rows_mm(a_hat, conv.lin(x), kernel)
    return out if conv.bias is None else out.add_(conv.bias)


def serve_forward(model: torch.nn.Module, x: Tensor, graph: ServeGraph,
                  kernel: str = "bag") -> Tensor:
    """``model(x, graph.adj_t)`` of a :func:`servable` model, reassociated.

    Follows :meth:`BasicGNN.forward <torch_geometric.nn.models.basic_gnn.
    BasicGNN.forward>` (activation, norm, dropout, jumping knowledge, final
    Linear) with every conv replaced by :func:`rows_mm` products on the
    graph's cached operands: SAGE aggregates at ``min(in, out)`` width, GCN
    uses its normalisation computed once. Meant for inference (no autograd
    graph is needed, though one is built if asked).

    Args:
        model (Module): a :func:`servable` model.
        x (Tensor): node features ``[N, F]``.
        graph (ServeGraph): the adjacency and its cached operands.
        kernel (str, optional): see :func:`rows_mm`. (default: ``"bag"``)

    Returns:
        ``[N, out_channels]``.
    """
    xs = []
    last = model.num_layers - 1
    # Every conv's output is a fresh tensor (and norms return fresh ones or
    # their input), so a ReLU may run in place.
    relu = isinstance(model.act, torch.nn.ReLU)
    for i, (conv, norm) in enumerate(zip(model.convs, model.norms)):
        if _sage_conv_ok(conv):
            x = _sage_layer(conv, x, graph.mean(x.dtype), kernel)
        else:
            x = _gcn_layer(conv, x, graph.gcn(conv, x.dtype), kernel)
        if i < last or model.jk_mode is not None:
            if model.act is not None and model.act_first:
                x = x.relu_() if relu else model.act(x)
            x = norm(x, None, None) if model.supports_norm_batch else norm(x)
            if model.act is not None and not model.act_first:
                x = x.relu_() if relu else model.act(x)
            x = model.dropout(x)
            if hasattr(model, "jk"):
                xs.append(x)
    x = model.jk(xs) if hasattr(model, "jk") else x
    return model.lin(x) if hasattr(model, "lin") else x
