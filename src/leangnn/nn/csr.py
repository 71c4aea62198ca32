"""CSR kernels for the group functions of a reversible stack: GCN, SAGE, GAT.

A reversible GSR stack (Luo et al., DAC 2026) of ``L`` layers and ``G``
groups calls ``2 L G`` narrow convs (``C / G`` channels) per training step on
one graph. PyG's message passing gathers an ``[E, C/G]`` tensor of source
features, scales it and scatters it back; on CPU those gathers and scatters
cost ~10x a sparse-dense product with the same adjacency in CSR form
(measured on ``epfl/multiplier``, 113k edges, 16 channels: 0.35 ms for
MKL's CSR ``spmm`` against several ms for the gather-mul-scatter), and they
do not shrink with the width. Here the adjacency is laid out in CSR (rows =
targets) and its transpose once per pass, and:

* :class:`~torch_geometric.nn.GCNConv` (Kipf and Welling, ICLR 2017) becomes
  ``A_hat @ lin(x) + bias`` with ``A_hat`` the ``D^{-1/2}(A + I)D^{-1/2}``
  weights ``gcn_norm`` computed (backward: ``A_hat^T @ grad``);
* :class:`~torch_geometric.nn.SAGEConv` (Hamilton et al., NeurIPS 2017)
  with mean aggregation becomes ``lin_l(A_mean @ x) + lin_r(x)``, ``A_mean``
  holding ``1 / in-degree``;
* :class:`~torch_geometric.nn.GATConv` (Velickovic et al., ICLR 2018)
  computes its attention logits, leaky ReLU and per-target softmax on the
  edges in CSR order with segment reductions (max on the detached logits, sum
  plus ``1e-16``, as PyG's ``softmax``), and aggregates by a CSR ``spmm``
  whose values are the attention weights; their gradient is the sampled
  product ``(grad @ x^T)`` on the graph's pattern (``sampled_addmm``).

The values equal PyG's to rounding (the sums run in another order), so a
stack using these kernels is compared with PyG's convs in float64 in the
tests; the reversible and the plain-autograd paths of the stack use the same
kernels, so they stay exactly comparable with each other. Attention dropout,
when used, draws its mask in CSR edge order (a different but equally
distributed mask than PyG's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

__all__ = ["CSRGraph", "csr_kernels", "spmm", "mean_sage_conv"]


_MAX_NODES = 3_037_000_499  # floor(sqrt(2**63 - 1))


class CSRGraph:
    r"""A graph's adjacency in CSR form (rows = targets) and its transpose.

    Entries are sorted by (target, source). ``perm`` maps CSR entry ``k`` to
    the input edge it came from; ``perm_t`` maps the transpose's entries to
    CSR entries (``values[perm_t]`` are the transpose's values).

    Args:
        edge_index (Tensor): ``[2, E]`` (source, target) pairs, flow
            ``source_to_target``.
        num_nodes (int): ``N``.

    Raises ``ValueError`` on duplicate edges (a CSR entry must be unique).
    """

    def __init__(self, edge_index: Tensor, num_nodes: int):
        src, dst = edge_index.long()  # CSR indices share one dtype
        n = num_nodes
        if n > _MAX_NODES:  # the sort key dst * n + src must fit in int64
            raise ValueError(f"CSRGraph: num_nodes={n} is above {_MAX_NODES}, "
                             "the most an int64 (target, source) key can hold")
        lo, hi = (int(v) for v in torch.aminmax(edge_index)) if src.numel() \
            else (0, -1)
        if lo < 0 or hi >= n:  # decoded from keys, it would be another edge
            raise ValueError(f"CSRGraph: edge_index has node indices {lo}..{hi}, "
                             f"outside 0..{n - 1} (num_nodes={n})")
        self.num_nodes = n
        # The indices are decoded from the sorted keys (one division each)
        # rather than gathered through the permutation: a random-access
        # gather of E int64 costs ~25 ns an entry on a CPU, the division ~2,
        # and a GSR step builds it at least once (2.7x faster on
        # 2.4M edges). Keys are unique, so any sort gives the one order.
        key, self.perm = torch.sort(dst * n + src)
        if key.numel() > 1 and bool((key[1:] == key[:-1]).any()):
            raise ValueError("CSRGraph: edge_index has duplicate edges")
        self.row, self.col = _decode(key, n)
        self.crow = _compressed(self.row, n)
        key, self.perm_t = torch.sort(self.col * n + self.row)
        col_of_t, self.col_t = _decode(key, n)
        self.crow_t = _compressed(col_of_t, n)
        self._interleaved: tuple[Tensor, Tensor] | None = None

    def interleaved(self) -> tuple[Tensor, Tensor]:
        """Per entry, the positions of its source's and its target's value in
        a flat ``[N, 2]`` tensor (``2 col``, ``2 row + 1``)."""
        if self._interleaved is None:
            self._interleaved = (2 * self.col, 2 * self.row + 1)
        return self._interleaved

    def matrix(self, values: Tensor) -> Tensor:
        """The sparse CSR ``[N, N]`` matrix with ``values`` (CSR order)."""
        return _csr(self.crow, self.col, values, self.num_nodes)

    def matrix_t(self, values: Tensor) -> Tensor:
        """Its transpose, from the same ``values`` (CSR order)."""
        return _csr(self.crow_t, self.col_t, values.index_select(0, self.perm_t),
                    self.num_nodes)


def _decode(key: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(key // n, key % n)`` of non-negative keys."""
    major = torch.div(key, n, rounding_mode="floor")
    return major, torch.sub(key, major, alpha=n)  # one kernel, no major * n


def _compressed(rows: Tensor, n: int) -> Tensor:
    crow = torch.zeros(n + 1, dtype=torch.long, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=n), 0, out=crow[1:])
    return crow


def _csr(crow: Tensor, col: Tensor, values: Tensor, n: int) -> Tensor:
    # lazily: leangnn.graphs.sparse imports SciPy, which leangnn.nn does not need
    from leangnn.graphs.sparse import csr_tensor

    return csr_tensor(crow, col, values, (n, n))


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, a_t):
        ctx.a_t = a_t
        return a @ x

    @staticmethod
    def backward(ctx, grad):
        return ctx.a_t @ grad.contiguous(), None, None


def spmm(a: Tensor, a_t: Tensor, x: Tensor) -> Tensor:
    """``a @ x`` for a constant sparse ``a`` whose transpose ``a_t`` is
    given (the backward is ``a_t @ grad``: no transpose per call)."""
    return _SpMM.apply(x, a, a_t)


class _AttnSpMM(torch.autograd.Function):
    """``out[i] = sum_k alpha[k] x[col_k]`` over CSR row ``i``; one head
    (``alpha [E]``, ``x [N, C]``) or several (``alpha [E, H]``,
    ``x [N, H, C]``), one product per head."""

    @staticmethod
    def forward(ctx, alpha, x, graph):
        ctx.graph = graph
        ctx.save_for_backward(alpha, x)
        if alpha.dim() == 1:
            return graph.matrix(alpha) @ x
        return torch.stack([graph.matrix(alpha[:, h].contiguous())
                            @ x[:, h].contiguous() for h in range(alpha.size(1))], 1)

    @staticmethod
    def backward(ctx, grad):
        alpha, x = ctx.saved_tensors
        graph = ctx.graph
        grad = grad.contiguous()
        one = alpha.dim() == 1
        heads = [(alpha, x, grad)] if one else [
            (alpha[:, h].contiguous(), x[:, h], grad[:, h])
            for h in range(alpha.size(1))]
        d_alpha = d_x = None
        if ctx.needs_input_grad[0]:
            # grad_alpha[k] = <grad[row_k], x[col_k]> on the graph's entries
            # only (a sampled product; beta=0 ignores the pattern's values)
            d_alpha = [torch.sparse.sampled_addmm(
                graph.matrix(a), g, xh.t(), beta=0.0).values() for a, xh, g in heads]
            d_alpha = d_alpha[0] if one else torch.stack(d_alpha, 1)
        if ctx.needs_input_grad[1]:
            d_x = [graph.matrix_t(a) @ g for a, _, g in heads]
            d_x = d_x[0] if one else torch.stack(d_x, 1)
        return d_alpha, d_x, None


def _gcn_kernel(conv: GCNConv, a: Tensor, a_t: Tensor) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        out = spmm(a, a_t, conv.lin(x))
        return out if conv.bias is None else out + conv.bias
    return run


def _sage_kernel(conv: SAGEConv, a: Tensor, a_t: Tensor
                 ) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        out = conv.lin_l(spmm(a, a_t, x))
        return out + conv.lin_r(x) if conv.root_weight else out
    return run


def _segment(values: Tensor, reduce: str, graph: CSRGraph) -> Tensor:
    return torch.segment_reduce(values, reduce, offsets=graph.crow, axis=0)


def _gat_kernel(conv: GATConv, graph: CSRGraph) -> Callable[[Tensor], Tensor]:
    def run(x: Tensor) -> Tensor:
        heads, c = conv.heads, conv.out_channels
        if heads == 1:
            # [N, C] throughout; both attention terms by one [C, 2] product,
            # read by 1-d gathers of the flat [N, 2] result
            xs = conv.lin(x)
            att = torch.cat([conv.att_src, conv.att_dst]).view(2, c)
            a = (xs @ att.t()).view(-1)
            src2, dst2 = graph.interleaved()
            e = a.index_select(0, src2) + a.index_select(0, dst2)
        else:
            xs = conv.lin(x).view(-1, heads, c)
            a_src = (xs * conv.att_src).sum(-1)  # [N, H]
            a_dst = (xs * conv.att_dst).sum(-1)
            e = a_src.index_select(0, graph.col) + a_dst.index_select(0, graph.row)
        e = F.leaky_relu(e, conv.negative_slope)
        # PyG's softmax: shift by the (detached) per-target max, normalise by
        # the sum + 1e-16; every row has its self-loop, so no row is empty
        e_max = _segment(e.detach(), "max", graph)
        e = (e - e_max.index_select(0, graph.row)).exp()
        total = _segment(e, "sum", graph) + 1e-16
        alpha = e / total.index_select(0, graph.row)
        alpha = F.dropout(alpha, p=conv.dropout, training=conv.training)
        out = _AttnSpMM.apply(alpha, xs, graph)
        if heads > 1:
            out = out.reshape(-1, heads * c) if conv.concat else out.mean(dim=1)
        return out if conv.bias is None else out + conv.bias
    return run


def _gcn_usable(conv) -> bool:
    # the normalisation shared_graph placed in the conv's cache slot, with
    # the conv's own settings; cached=True convs keep their own cache
    return (isinstance(conv, GCNConv) and conv.normalize and not conv.cached
            and conv._cached_edge_index is not None)


def mean_sage_conv(conv) -> bool:
    """Whether ``conv`` is a PyG ``SAGEConv`` that aggregates its raw
    neighbours by their mean and then applies its two linear maps (no
    projection, no normalisation, ``in_channels`` given): the form the CSR
    kernels here and DPR's serving (:mod:`leangnn.prune.serve`) compute."""
    return (isinstance(conv, SAGEConv) and conv.aggr == "mean" and not conv.project
            and not conv.normalize and isinstance(conv.in_channels, int))


def _gat_usable(conv, looped: bool) -> bool:
    # the single-projection GAT on a graph with exactly one self-loop per node
    return (isinstance(conv, GATConv) and looped and not conv.add_self_loops
            and conv.lin is not None and conv.lin_edge is None
            and conv.res is None)


@contextlib.contextmanager
def csr_kernels(convs: Sequence[torch.nn.Module], edge_index, num_nodes: int,
                dtype: torch.dtype, looped: bool = False, cache: dict | None = None,
                ) -> Iterator[list[Callable[[Tensor], Tensor] | None]]:
    """Per conv, a CSR kernel computing ``conv(x, edge_index)``, or ``None``.

    Meant inside :func:`~leangnn.nn.shared_graph.shared_graph`: GCN convs
    are taken when their shared normalisation sits in their cache slot, GAT
    convs when ``looped`` (the graph already has its self-loops and the convs
    have ``add_self_loops`` off), SAGE convs with mean aggregation (and
    neither projection nor normalisation) always. Other convs (and graphs
    with duplicate edges, or given as anything but an index tensor) get
    ``None``.

    Args:
        convs (sequence of Module): the convs.
        edge_index (Tensor or other): the graph the convs are called on.
        num_nodes (int): ``N``.
        dtype (torch.dtype): the dtype the convs compute in.
        looped (bool, optional): ``edge_index`` carries GAT's self-loops.
            (default: ``False``)
        cache (dict, optional): where the layouts built here are kept: pass
            the same dict to another call on the same graph (a reversible
            step's backward after its forward) and it builds none again; it
            holds them as long as the caller holds it. (default: ``None``,
            built for this call alone)

    Yields:
        a list as long as ``convs``: ``kernel(x) -> out`` or ``None``.
    """
    kernels: list[Callable[[Tensor], Tensor] | None] = [None] * len(convs)
    # (``is_sparse`` is COO's alone: a CSR adjacency, DPR's core, was taken
    # for an edge index, unbound into its N rows and dropped, every call)
    if not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided:
        yield kernels
        return
    # built on first use, once per call of this function (= once per pass),
    # or once per ``cache`` the caller keeps; a kept layout must be of this
    # graph (the same preprocessing of the same edges gives the same one)
    if cache is None:
        cache = {}
    elif cache.get("key") != (tuple(edge_index.shape), num_nodes, dtype, looped):
        cache.clear()
        cache["key"] = (tuple(edge_index.shape), num_nodes, dtype, looped)

    def graph() -> CSRGraph | None:
        if "graph" not in cache:
            cache["graph"] = _graph_or_none(edge_index, num_nodes)
        return cache["graph"]

    # GCN layouts by the order their normalisation first appears in this
    # call: the convs sharing one share a layout, and a kept one is found by
    # the next pass, whose normalisations are new tensors of the same values
    norms: dict[int, int] = {}
    for i, conv in enumerate(convs):
        if _gcn_usable(conv):
            ei, w = conv._cached_edge_index
            key = ("gcn", norms.setdefault(id(w), len(norms)))
            if key not in cache:
                if conv.flow != "source_to_target":
                    ei = ei.flip(0)
                cache[key] = _matrices(
                    _graph_or_none(ei, num_nodes),
                    lambda g, w=w: w.index_select(0, g.perm).to(dtype))
            if cache[key] is not None:
                kernels[i] = _gcn_kernel(conv, *cache[key])
        elif mean_sage_conv(conv) and graph() is not None:
            if "mean" not in cache:
                cache["mean"] = _matrices(graph(), lambda g: _mean_weights(g, dtype))
            kernels[i] = _sage_kernel(conv, *cache["mean"])
        elif _gat_usable(conv, looped) and graph() is not None:
            kernels[i] = _gat_kernel(conv, graph())
    yield kernels


def _graph_or_none(edge_index: Tensor, num_nodes: int) -> CSRGraph | None:
    try:
        return CSRGraph(edge_index, num_nodes)
    except ValueError:  # duplicate edges: PyG's per-edge path handles them
        return None


def _mean_weights(graph: CSRGraph, dtype: torch.dtype) -> Tensor:
    deg = (graph.crow[1:] - graph.crow[:-1]).to(dtype)
    return deg.reciprocal().index_select(0, graph.row)


def _matrices(graph: CSRGraph | None, values: Callable[[CSRGraph], Tensor]
              ) -> tuple[Tensor, Tensor] | None:
    """``(A, A^T)`` with ``values(graph)`` (CSR order), or ``None``."""
    if graph is None:
        return None
    v = values(graph)
    return graph.matrix(v), graph.matrix_t(v)
