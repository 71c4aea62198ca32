"""Sparse graph structures shared by every strategy, and the edge-list check.

One home for the adjacency builders the rest of leangnn uses:

* :func:`check_edge_index`: validation of an ``edge_index`` against
  ``num_nodes`` with a one-line error naming the argument and the value;
* :func:`undirected_csr`: the binary symmetric adjacency without self-loops
  (importance scores, core bridges and anchors of DPR, METIS and the BFS
  order of partitioning), as a SciPy CSR matrix, with :func:`is_canonical`
  telling when an ``edge_index`` already *is* that matrix;
* :class:`DstCSR`: edges grouped by target, for gathering in-edges of node
  sets (halos, offload chunks, neighbour sampling);
* :func:`adj_t_of`, :func:`csr_tensor`, :func:`csr_tensor_from_scipy`:
  ``torch.sparse_csr`` adjacencies that PyG convs aggregate with, without an
  ``[E, C]`` message tensor.

Edges follow PyG's ``source_to_target`` flow: ``edge_index[0]`` sends to
``edge_index[1]``. The builders use SciPy's C++ kernels rather than PyG's
``to_undirected`` / ``coalesce``: those sort int64 keys in torch, which on
tens of millions of edges takes several times the memory and time of SciPy's
COO -> CSR conversion and ``A + A^T`` (int32 indices where they fit).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

__all__ = [
    "check_edge_index",
    "undirected_csr",
    "is_canonical",
    "DstCSR",
    "adj_t_of",
    "csr_tensor",
    "csr_tensor_from_scipy",
]

_INT32_MAX = 2**31 - 1


def check_edge_index(edge_index, num_nodes, name: str = "edge_index") -> None:
    """Raise a :class:`ValueError` unless ``edge_index`` is a valid edge list.

    Valid means: a ``[2, E]`` tensor (``E = 0`` is allowed) of an integer
    dtype whose entries lie in ``[0, num_nodes)``, with ``num_nodes`` a
    positive int. The message names ``name`` and the offending shape, dtype
    or node id (with its column).

    Args:
        edge_index (Tensor): ``[2, E]`` edges ``source -> target``.
        num_nodes (int): number of nodes ``N``.
        name (str, optional): the argument's name in the message.
            (default: ``"edge_index"``)
    """
    if not isinstance(edge_index, Tensor):
        raise ValueError(f"{name} must be a [2, E] torch.Tensor, "
                         f"got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"{name} must have shape [2, E], "
                         f"got shape {tuple(edge_index.shape)}")
    if edge_index.dtype == torch.bool or edge_index.is_floating_point() \
            or edge_index.is_complex():
        nan = (" (it contains NaN)" if edge_index.is_floating_point()
               and bool(torch.isnan(edge_index).any()) else "")
        raise ValueError(f"{name} must hold integer node ids, "
                         f"got dtype {edge_index.dtype}{nan}")
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) \
            or num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}")
    if edge_index.numel() == 0:
        return
    lo, hi = torch.aminmax(edge_index)
    if int(lo) < 0:
        col = int((edge_index < 0).nonzero()[0, 1])
        raise ValueError(f"{name}[:, {col}] holds the negative node id "
                         f"{int(edge_index[:, col].min())}")
    if int(hi) >= num_nodes:
        col = int((edge_index >= num_nodes).nonzero()[0, 1])
        raise ValueError(f"{name}[:, {col}] refers to node "
                         f"{int(edge_index[:, col].max())} but num_nodes={num_nodes}")


def _index_dtype(*sizes: int) -> type:
    # int32 indices halve the footprint of a large graph's CSR; SciPy and
    # torch's CSR kernels accept them.
    return np.int32 if max(sizes) < _INT32_MAX else np.int64


def undirected_csr(edge_index: Tensor, num_nodes: int, canonical: bool = False,
                   dtype=np.float32) -> sp.csr_matrix:
    """Binary symmetric adjacency without self-loops as a SciPy CSR matrix.

    Every edge counts in both directions, once, with value ``1``; self-loops
    are dropped; indices are sorted and int32 when they fit.

    Args:
        edge_index (Tensor): ``[2, E]``.
        num_nodes (int): ``N``.
        canonical (bool, optional): the caller guarantees that ``edge_index``
            already *is* that matrix in CSR order (sorted by row then column,
            symmetric, no duplicates or self-loops; see :func:`is_canonical`);
            the CSR is then built from it directly, with no sort and about a
            third of the working memory. (default: ``False``)
        dtype (numpy dtype, optional): value type; ``bool`` when only the
            structure matters (METIS, orderings) saves three bytes per entry.
            (default: ``numpy.float32``)

    Returns:
        ``scipy.sparse.csr_matrix [N, N]``.
    """
    check_edge_index(edge_index, num_nodes)
    ei = edge_index.cpu().numpy()
    idx_dtype = _index_dtype(num_nodes, 2 * ei.shape[1])
    if canonical:
        indptr = np.zeros(num_nodes + 1, dtype=idx_dtype)
        np.cumsum(np.bincount(ei[0], minlength=num_nodes), out=indptr[1:])
        return sp.csr_matrix((np.ones(ei.shape[1], dtype=dtype),
                              ei[1].astype(idx_dtype), indptr),
                             shape=(num_nodes, num_nodes))
    keep = ei[0] != ei[1]
    row, col = ei[0, keep].astype(idx_dtype), ei[1, keep].astype(idx_dtype)
    adj = sp.csr_matrix((np.ones(row.shape[0], dtype=dtype), (row, col)),
                        shape=(num_nodes, num_nodes))
    del row, col, keep
    adj = (adj + adj.T).tocsr()
    adj.data[:] = 1
    adj.sort_indices()
    return adj


def is_canonical(adj: sp.csr_matrix, edge_index: Tensor) -> bool:
    """Whether ``edge_index`` is exactly ``adj`` in CSR order (coalesced,
    symmetric, loop-free), so :func:`undirected_csr` may take its fast path."""
    ei = edge_index.cpu().numpy()
    if adj.nnz != ei.shape[1]:
        return False
    counts = np.diff(adj.indptr)
    return bool(np.array_equal(adj.indices, ei[1])
                and np.array_equal(np.repeat(np.arange(adj.shape[0]), counts), ei[0]))


class DstCSR:
    """Edges grouped by target node (CSR over ``edge_index[1]``).

    Gathering the in-edges of a node set is the primitive of halo expansion,
    of the offload engine's subgraph building and of neighbour sampling; it
    is written here with vectorised offsets because
    ``torch_geometric.utils.subgraph`` scans all ``E`` edges per call, which
    is too slow for hundreds of chunks on a 50M-edge graph.

    Args:
        edge_index (Tensor): ``[2, E]`` edges ``source -> target``.
        num_nodes (int): number of nodes ``N``.
        edge_weight (Tensor, optional): ``[E]`` weights, permuted along.

    Attributes:
        rowptr (Tensor): ``[N + 1]`` int64 offsets into ``col`` per target.
        col (Tensor): ``[E]`` sources, grouped by target (stable order).
        weight (Tensor or None): ``[E]`` weights in ``col``'s order.
    """

    def __init__(self, edge_index: Tensor, num_nodes: int,
                 edge_weight: Tensor | None = None):
        check_edge_index(edge_index, num_nodes)
        dst = edge_index[1]
        perm = torch.argsort(dst, stable=True)
        self.num_nodes = num_nodes
        # index_select, not x[perm]: ~4x faster on E int64 (csr.CSRGraph)
        self.col = edge_index[0].index_select(0, perm)
        self.weight = None if edge_weight is None else \
            edge_weight.index_select(0, perm)
        counts = torch.bincount(dst, minlength=num_nodes)
        self.rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=self.rowptr[1:])

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    def in_degree(self, nodes: Tensor | None = None) -> Tensor:
        if nodes is None:
            return self.rowptr[1:] - self.rowptr[:-1]
        return self.rowptr[nodes + 1] - self.rowptr[nodes]

    def edge_ids(self, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """Positions (into ``col``) of the in-edges of ``nodes``, and counts."""
        counts = self.in_degree(nodes)
        total = int(counts.sum())
        starts = self.rowptr[nodes]
        offsets = torch.cumsum(counts, 0) - counts
        ids = torch.repeat_interleave(starts - offsets, counts, output_size=total)
        ids += torch.arange(total)
        return ids, counts

    def in_neighbors(self, nodes: Tensor) -> Tensor:
        """Unique sources of the in-edges of ``nodes`` (sorted)."""
        ids, _ = self.edge_ids(nodes)
        return torch.unique(self.col[ids])

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_nodes={self.num_nodes}, "
                f"num_edges={self.num_edges})")


def csr_tensor(indptr, indices, values: Tensor, size) -> Tensor:
    """A ``torch.sparse_csr`` tensor from CSR arrays (NumPy or torch).

    Silences torch's "beta" warning; the arrays come from SciPy or from our
    own sorted construction, so the invariants hold.
    """
    indptr, indices = torch.as_tensor(indptr), torch.as_tensor(indices)
    if indptr.dtype != indices.dtype:
        indptr, indices = indptr.long(), indices.long()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(indptr, indices, values, size=tuple(size))


def csr_tensor_from_scipy(mat: sp.csr_matrix,
                          dtype: torch.dtype = torch.float32) -> Tensor:
    """A SciPy CSR matrix as ``torch.sparse_csr`` with int32 indices where they
    fit and ``dtype`` values (sorted indices expected)."""
    idx = _index_dtype(mat.shape[1], mat.nnz)
    return csr_tensor(torch.from_numpy(mat.indptr.astype(idx)),
                      torch.from_numpy(mat.indices.astype(idx)),
                      torch.from_numpy(mat.data).to(dtype), mat.shape)


def adj_t_of(edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None
             ) -> Tensor:
    """Transposed adjacency ``[N, N]`` (row = target) as ``torch.sparse_csr``.

    PyG convs given this instead of ``edge_index`` aggregate by sparse matrix
    products and never build the ``[E, C]`` message tensor. Duplicate edges
    are summed (weights added, or counted twice without weights). Indices are
    int32 when they fit (torch's CSR kernels accept them), a third less
    memory than PyG's ``to_torch_csr_tensor``, which also sorts in torch.

    Args:
        edge_index (Tensor): ``[2, E]``.
        num_nodes (int): ``N``.
        edge_weight (Tensor, optional): ``[E]`` weights. (default: ones)
    """
    check_edge_index(edge_index, num_nodes)
    src, dst = edge_index.cpu().numpy()
    val = (np.ones(src.shape[0], dtype=np.float32) if edge_weight is None
           else edge_weight.detach().cpu().numpy().astype(np.float32))
    m = sp.csr_matrix((val, (dst, src)), shape=(num_nodes, num_nodes))
    m.sum_duplicates()
    m.sort_indices()
    return csr_tensor_from_scipy(m)
