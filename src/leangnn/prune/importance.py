"""Node importance scores that decide which nodes form the DPR core.

Decoupled Prune-and-Reconstruct keeps the most important nodes of a graph as
the training core. Importance is pluggable: the built-in scores are degree,
PageRank (Page et al., 1999; sparse power iteration in torch), the k-core
number (Seidman, 1983; exact level-synchronous peeling) and ``combined``, the
mean of their normalised ranks. Register your own with
:func:`register_importance` or pass any callable
``fn(edge_index, num_nodes) -> Tensor [N]`` to :func:`node_importance`.

Every score treats the graph as undirected (a circuit's fanin and fanout both
make a gate important), ignores self-loops and counts duplicate edges once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from ..graphs.sparse import check_edge_index, csr_tensor, undirected_csr

__all__ = [
    "IMPORTANCE",
    "register_importance",
    "node_importance",
    "degree_importance",
    "pagerank",
    "kcore_number",
    "combined_importance",
]

ImportanceFn = Callable[[Tensor, int], Tensor]

#: name -> ``fn(edge_index, num_nodes) -> Tensor [N]`` (larger is more important)
IMPORTANCE: dict[str, ImportanceFn] = {}


def register_importance(name: str) -> Callable[[ImportanceFn], ImportanceFn]:
    """Decorator that adds an importance function to :data:`IMPORTANCE`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"importance name must be a non-empty str, got {name!r}")

    def wrap(fn: ImportanceFn) -> ImportanceFn:
        IMPORTANCE[name] = fn
        return fn

    return wrap


def _adj(edge_index: Tensor, num_nodes: int, adj: sp.csr_matrix | None):
    if adj is None:
        return undirected_csr(edge_index, num_nodes)
    if adj.shape != (num_nodes, num_nodes):
        raise ValueError(f"adj must have shape ({num_nodes}, {num_nodes}), "
                         f"got {adj.shape}")
    return adj


@register_importance("degree")
def degree_importance(edge_index: Tensor, num_nodes: int,
                      adj: sp.csr_matrix | None = None) -> Tensor:
    """Number of distinct neighbours of every node (undirected), as float.

    ``adj`` (optional) is a precomputed
    :func:`~leangnn.graphs.sparse.undirected_csr`; every built-in score
    accepts it so :func:`~leangnn.prune.core.build_core` symmetrises a large
    graph once.
    """
    adj = _adj(edge_index, num_nodes, adj)
    return torch.from_numpy(np.diff(adj.indptr).astype(np.float32))


@register_importance("pagerank")
def pagerank(edge_index: Tensor, num_nodes: int, alpha: float = 0.85,
             tol: float = 1e-6, max_iter: int = 100,
             dtype: torch.dtype = torch.float32,
             adj: sp.csr_matrix | None = None) -> Tensor:
    r"""PageRank by sparse power iteration in torch (Page et al., 1999).

    :math:`p \leftarrow \alpha A D^{-1} p + (1-\alpha)/N +
    \alpha\,(\text{dangling mass})/N` on the undirected graph (``A`` is
    symmetric, so no transpose is needed), one ``torch.sparse_csr`` matvec per
    iteration, until the L1 change drops below ``tol``.

    Args:
        edge_index (Tensor): ``[2, E]``.
        num_nodes (int): ``N``.
        alpha (float, optional): damping factor. (default: ``0.85``)
        tol (float, optional): L1 convergence tolerance. (default: ``1e-6``)
        max_iter (int, optional): iteration cap. (default: ``100``)
        dtype (torch.dtype, optional): float32 shares the adjacency's arrays
            (no copy of the matrix); float64 for tight tolerances.
            (default: ``torch.float32``)
        adj (scipy.sparse.csr_matrix, optional): precomputed
            :func:`~leangnn.graphs.sparse.undirected_csr`.
            (default: ``None``)

    Returns:
        ``Tensor [N]`` summing to one.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"pagerank: alpha must be in (0, 1), got {alpha!r}")
    adj = _adj(edge_index, num_nodes, adj)
    values = torch.from_numpy(adj.data)  # all ones; shared when dtypes agree
    mat = csr_tensor(adj.indptr, adj.indices, values.to(dtype), adj.shape)
    deg = torch.from_numpy(np.diff(adj.indptr)).to(dtype)
    inv = torch.where(deg > 0, 1.0 / deg.clamp_min(1.0), torch.zeros_like(deg))
    dangling = deg == 0
    p = torch.full((num_nodes,), 1.0 / num_nodes, dtype=dtype)
    for _ in range(max_iter):
        new = (mat @ (p * inv).unsqueeze(1)).squeeze(1)
        new.mul_(alpha).add_((1.0 - alpha + alpha * float(p[dangling].sum()))
                             / num_nodes)
        err = float((new - p).abs().sum())
        p = new
        if err < tol:
            break
    return p


@register_importance("kcore")
def kcore_number(edge_index: Tensor, num_nodes: int,
                 adj: sp.csr_matrix | None = None) -> Tensor:
    """Exact k-core number of every node (Seidman, 1983), as float.

    Level-synchronous peeling: at level ``k`` every node of remaining degree
    ``<= k`` is removed at once (core number ``k``) until none is left, then
    ``k`` jumps to the smallest remaining degree. Each round touches only the
    removed nodes' edges, so the total edge work is ``O(E)``; this replaces
    :func:`networkx.core_number`, whose Python loop is far too slow at a
    million nodes (and is the reference in the tests).
    """
    adj = _adj(edge_index, num_nodes, adj)
    indptr, indices = adj.indptr, adj.indices
    deg = np.diff(indptr).astype(np.int64)
    core = np.zeros(num_nodes, dtype=np.int64)
    alive = np.ones(num_nodes, dtype=bool)
    remaining = num_nodes
    k = 0
    while remaining:
        k = max(k, int(deg[alive].min()))
        while True:
            peel = np.flatnonzero(alive & (deg <= k))
            if peel.size == 0:
                break
            core[peel] = k
            alive[peel] = False
            remaining -= peel.size
            starts, ends = indptr[peel], indptr[peel + 1]
            lens = ends - starts
            offs = np.repeat(starts - np.cumsum(lens) + lens, lens)
            nbrs = indices[offs + np.arange(lens.sum())]
            nbrs = nbrs[alive[nbrs]]
            if nbrs.size < 4096:  # a bincount over all N would dominate
                np.subtract.at(deg, nbrs, 1)
            else:
                deg -= np.bincount(nbrs, minlength=num_nodes)
    return torch.from_numpy(core.astype(np.float32))


def _rank01(score: Tensor) -> Tensor:
    # Average ranks for ties so equal scores contribute equally.
    from scipy.stats import rankdata

    r = rankdata(score.double().numpy(), method="average")
    return torch.from_numpy((r - 1.0) / max(len(r) - 1, 1))


def combined_importance(edge_index: Tensor, num_nodes: int,
                        weights: dict[str, float] | None = None,
                        adj: sp.csr_matrix | None = None) -> Tensor:
    """Weighted mean of normalised ranks (0 = least, 1 = most important).

    Args:
        weights (dict, optional): importance name -> weight.
            (default: ``{"degree": 1, "pagerank": 1, "kcore": 1}``)
    """
    weights = weights or {"degree": 1.0, "pagerank": 1.0, "kcore": 1.0}
    total = float(sum(weights.values()))
    if total <= 0:
        raise ValueError(f"combined_importance: weights must sum to > 0, "
                         f"got {weights!r}")
    adj = _adj(edge_index, num_nodes, adj)
    out = torch.zeros(num_nodes, dtype=torch.float64)
    for name, w in weights.items():
        out += w * _rank01(node_importance(edge_index, num_nodes, name, adj=adj))
    return out / total


register_importance("combined")(combined_importance)


def node_importance(edge_index: Tensor, num_nodes: int,
                    method: str | ImportanceFn | dict[str, float] = "pagerank",
                    adj: sp.csr_matrix | None = None) -> Tensor:
    """Importance of every node: a registered name, a callable, or weights.

    Args:
        edge_index (Tensor): ``[2, E]``.
        num_nodes (int): ``N``.
        method (str, callable or dict, optional): a key of :data:`IMPORTANCE`,
            a function ``fn(edge_index, num_nodes) -> Tensor [N]``, or a dict
            ``{name: weight}`` for :func:`combined_importance`.
            (default: ``"pagerank"``)
        adj (scipy.sparse.csr_matrix, optional): precomputed
            :func:`~leangnn.graphs.sparse.undirected_csr`, handed to functions
            that take ``adj``.

    Returns:
        ``Tensor [N]``; larger means more important.
    """
    check_edge_index(edge_index, num_nodes)
    if isinstance(method, dict):
        return combined_importance(edge_index, num_nodes, method, adj=adj)
    if isinstance(method, str):
        if method not in IMPORTANCE:
            raise ValueError(f"unknown importance {method!r}; expected one of "
                             f"{sorted(IMPORTANCE)}, a callable or a weight dict")
        method = IMPORTANCE[method]
    if callable(method):
        kwargs = {}
        if adj is not None and "adj" in inspect.signature(method).parameters:
            kwargs["adj"] = adj
        score = method(edge_index, num_nodes, **kwargs)
    else:
        raise ValueError(f"unknown importance {method!r}; expected one of "
                         f"{sorted(IMPORTANCE)}, a callable or a weight dict")
    score = torch.as_tensor(score).reshape(-1)
    if score.numel() != num_nodes:
        raise ValueError(f"importance {method!r} returned {score.numel()} scores "
                         f"for {num_nodes} nodes")
    return score
