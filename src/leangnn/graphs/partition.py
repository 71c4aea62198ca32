"""Graph partitioning for offloaded training: METIS, a BFS fallback, halo sets.

Partitioned, layer-wise execution (NeutronJittor, Fundamental Research 2026;
also Cluster-GCN, KDD 2019) needs a balanced split of the nodes with few cut
edges, and for every part the *halo*: the nodes outside it whose embeddings
its message passing reads. :func:`partition_graph` calls METIS through
``pymetis`` and falls back to a breadth-first (reverse Cuthill-McKee) order cut
into contiguous, equally sized pieces when ``pymetis`` is missing; results are
cached in memory and on disk, keyed by a hash of the graph and ``num_parts``.

In-process reuse (the planner's rows, the training of its pick) rests on
:class:`GraphStamp`, which tells the very same, unchanged graph from any other,
and on :func:`reuse_hashes`, inside which :func:`graph_hash` hashes an
unchanged edge tensor once. ``LEANGNN_PLAN_REUSE=0`` switches every such reuse
off (:func:`reuse_enabled`).

Edges follow PyG's ``source_to_target`` flow: ``edge_index[0]`` sends to
``edge_index[1]``; the halo of a part is its *in*-neighbourhood.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..utils import atomic_torch_save, cache_root
from .sparse import DstCSR, check_edge_index, undirected_csr

__all__ = [
    "Partition",
    "partition_graph",
    "metis_partition",
    "bfs_partition",
    "halo_sets",
    "graph_hash",
    "GraphStamp",
    "reuse_hashes",
    "reuse_enabled",
]

METHODS = ("auto", "metis", "bfs")
_MEMORY: dict[tuple, Tensor] = {}


@dataclass
class Partition:
    """A node partition: ``part[i]`` is the part of node ``i``.

    Attributes:
        part (Tensor): ``[N]`` int64 part ids in ``[0, num_parts)``.
        num_parts (int): number of parts.
        method (str): ``"metis"`` or ``"bfs"`` (what actually ran).
    """

    part: Tensor
    num_parts: int
    method: str

    @property
    def num_nodes(self) -> int:
        return self.part.numel()

    def sizes(self) -> Tensor:
        return torch.bincount(self.part, minlength=self.num_parts)

    def nodes(self) -> list[Tensor]:
        """Sorted node ids of every part."""
        order = torch.argsort(self.part, stable=True)
        return list(torch.split(order, self.sizes().tolist()))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_nodes={self.num_nodes}, "
                f"num_parts={self.num_parts}, method={self.method})")


#: environment variable that switches in-process reuse of graph structures
#: off (``0``, ``false``, ``no``, ``off``)
REUSE_ENV = "LEANGNN_PLAN_REUSE"


def reuse_enabled() -> bool:
    """Whether structures built for one configuration of a graph may serve
    another user of the same graph in this process (the planner's cores and
    partitions, the training of its pick; hashes within one plan). Read at
    every call: ``LEANGNN_PLAN_REUSE=0`` is the off switch (everything is
    built again, as without any cache; results are the same either way)."""
    return os.environ.get(REUSE_ENV, "1").strip().lower() not in (
        "0", "false", "no", "off")


def _tensor_sig(t: Tensor) -> tuple | None:
    # The version counter moves with every in-place torch op on the tensor
    # (or a view of it); the pointer, shape and dtype with any replacement.
    # An inference tensor has no version counter: it never matches (None).
    if t.is_inference():
        return None
    return (t._version, t.data_ptr(), tuple(t.shape), str(t.dtype), str(t.device))


class GraphStamp:
    """Who a graph is and whether it changed since, for in-process caches.

    Records every attribute of a ``Data``: each tensor by weak reference (the
    stamp keeps nothing alive) with its version counter, storage pointer,
    shape, dtype and device; any other value by value (by identity when it is
    not hashable). :meth:`matches` holds only for the very same tensor
    objects, unchanged since, and equal other attributes: another graph, a
    graph whose tensors were replaced, changed in place by torch (which moves
    the version counter), or freed never matches.

    Writes that bypass the version counter (through a NumPy view, ``.data``
    or ``set_``) are not seen: code doing that should switch reuse off
    (``LEANGNN_PLAN_REUSE=0``, :func:`reuse_enabled`). A graph with an
    inference tensor (made under ``torch.inference_mode``, which keeps no
    version counter) never matches.

    Args:
        data (Data): the graph.
    """

    def __init__(self, data):
        tensors, self._sig = self._read(data)
        self._refs = [weakref.ref(t) for t in tensors]

    @staticmethod
    def _read(data) -> tuple[list[Tensor], tuple]:
        tensors, sig = [], []
        for key, value in sorted(data.items(), key=lambda kv: kv[0]):
            if isinstance(value, Tensor):
                tensors.append(value)
                sig.append((key, "tensor", _tensor_sig(value)))
            else:
                try:
                    hash(value)
                    sig.append((key, "value", type(value).__name__, value))
                except TypeError:
                    sig.append((key, "object", id(value)))
        return tensors, tuple(sig)

    @property
    def alive(self) -> bool:
        """Whether every recorded tensor still exists."""
        return all(r() is not None for r in self._refs)

    def matches(self, data) -> bool:
        """``data`` is the stamped graph, unchanged."""
        tensors, sig = self._read(data)
        return (sig == self._sig and len(tensors) == len(self._refs)
                and all(s[2] is not None for s in sig if s[1] == "tensor")
                and all(r() is t for r, t in zip(self._refs, tensors)))


#: graph hashes of the current :func:`reuse_hashes` block (``None`` outside)
_HASHES: list | None = None
_HASH_DEPTH = 0


@contextmanager
def reuse_hashes() -> Iterator[None]:
    """Within the block, :func:`graph_hash` of the same, unchanged edge
    tensor is computed once (e.g. the offload rows of one plan, one
    partition each: 0.03 s a hash at 100k nodes and 1.6M edges). Blocks
    nest; the hashes are dropped when the outermost ends. Outside, and with
    :func:`reuse_enabled` off, every call hashes."""
    global _HASHES, _HASH_DEPTH
    if _HASH_DEPTH == 0:
        _HASHES = []
    _HASH_DEPTH += 1
    try:
        yield
    finally:
        _HASH_DEPTH -= 1
        if _HASH_DEPTH == 0:
            _HASHES = None


def graph_hash(edge_index: Tensor, num_nodes: int) -> str:
    """A content hash of a graph's edges (the partition cache key)."""
    sig = (_tensor_sig(edge_index), int(num_nodes))
    memo = _HASHES if (_HASHES is not None and sig[0] is not None
                       and reuse_enabled()) else None
    if memo is not None:
        for ref, s, digest in memo:
            if ref() is edge_index and s == sig:
                return digest
    h = hashlib.blake2b(digest_size=12)
    h.update(str((num_nodes, tuple(edge_index.shape))).encode())
    h.update(edge_index.contiguous().cpu().numpy().tobytes())
    digest = h.hexdigest()
    if memo is not None:
        memo[:] = [e for e in memo if e[0]() is not None][-7:]  # a few graphs
        memo.append((weakref.ref(edge_index), sig, digest))
    return digest


def metis_partition(edge_index: Tensor, num_nodes: int, num_parts: int,
                    seed: int = 0) -> Tensor:
    """METIS k-way partition (``pymetis``) of the symmetrised graph.

    Raises:
        ImportError: when ``pymetis`` is not installed.
    """
    import pymetis

    a = undirected_csr(edge_index, num_nodes, dtype=bool)
    idx = pymetis.zero_copy_dtype()  # METIS's own index width: no extra copy
    adjacency = pymetis.CSRAdjacency(a.indptr.astype(idx), a.indices.astype(idx))
    del a
    res = pymetis.part_graph(num_parts, adjacency=adjacency,
                             options=pymetis.Options(seed=seed))
    part = torch.from_numpy(np.asarray(res.vertex_part, dtype=np.int64).copy())
    # METIS may leave a part empty on tiny or disconnected graphs; the engine
    # needs none empty, so refill empties from the largest parts.
    return _fill_empty(part, num_parts)


def bfs_partition(edge_index: Tensor, num_nodes: int, num_parts: int) -> Tensor:
    """Fallback: reverse Cuthill-McKee (BFS from low-degree nodes) order, cut
    into ``num_parts`` contiguous pieces of equal size.

    Neighbours land close together in a BFS order, so contiguous pieces keep
    much of the locality METIS finds, without its dependency.
    """
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    a = undirected_csr(edge_index, num_nodes, dtype=bool)
    order = torch.from_numpy(
        reverse_cuthill_mckee(a, symmetric_mode=True).astype(np.int64))
    part = torch.empty(num_nodes, dtype=torch.long)
    part[order] = torch.arange(num_nodes) * num_parts // num_nodes
    return part


def _fill_empty(part: Tensor, num_parts: int) -> Tensor:
    sizes = torch.bincount(part, minlength=num_parts)
    for p in torch.nonzero(sizes == 0).flatten().tolist():
        big = int(torch.argmax(sizes))
        members = torch.nonzero(part == big).flatten()
        moved = members[: members.numel() // 2]
        part[moved] = p
        sizes[big] -= moved.numel()
        sizes[p] = moved.numel()
    return part


def _cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return cache_root("partitions")


def partition_graph(edge_index: Tensor, num_nodes: int, num_parts: int,
                    method: str = "auto", seed: int = 0, cache: bool = True,
                    cache_dir: str | os.PathLike | None = None) -> Partition:
    """Partition a graph into ``num_parts`` balanced parts with few cut edges.

    Args:
        edge_index (Tensor): ``[2, E]`` edges (directed edges are symmetrised).
        num_nodes (int): number of nodes ``N``.
        num_parts (int): number of parts, ``1 <= num_parts <= N``.
        method (str, optional): ``"metis"`` (requires ``pymetis``), ``"bfs"``
            (reverse Cuthill-McKee order cut into contiguous pieces) or
            ``"auto"`` (METIS when available, else BFS with a warning).
            (default: ``"auto"``)
        seed (int, optional): METIS seed. (default: ``0``)
        cache (bool, optional): reuse results from memory and from disk.
            (default: ``True``)
        cache_dir (str, optional): on-disk cache folder. (default:
            ``$LEANGNN_CACHE/partitions`` or ``~/.cache/leangnn/partitions``)

    Returns:
        :class:`Partition` with ``part [N]``.
    """
    check_edge_index(edge_index, num_nodes)
    if not isinstance(num_parts, int) or not 1 <= num_parts <= num_nodes:
        raise ValueError(f"num_parts must be an int in [1, num_nodes={num_nodes}], "
                         f"got {num_parts!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "auto":
        try:
            import pymetis  # noqa: F401
            method = "metis"
        except ImportError:
            warnings.warn("pymetis is not installed; partitioning with the BFS "
                          "(reverse Cuthill-McKee) fallback", stacklevel=2)
            method = "bfs"
    if num_parts == 1:
        return Partition(torch.zeros(num_nodes, dtype=torch.long), 1, method)

    key = (graph_hash(edge_index, num_nodes), num_parts, method, seed)
    path = _cache_dir(cache_dir) / f"{key[0]}-{num_parts}-{method}-{seed}.pt"
    if cache and key in _MEMORY:
        return Partition(_MEMORY[key].clone(), num_parts, method)
    if cache and path.exists():
        try:
            part = torch.load(path, weights_only=True)
        except Exception as e:  # a damaged cache entry only costs a recomputation
            warnings.warn(f"ignoring unreadable partition cache {path}: {e}",
                          stacklevel=2)
            part = None
        if (isinstance(part, Tensor) and part.dtype == torch.long
                and part.numel() == num_nodes and num_nodes > 0
                and int(part.min()) >= 0 and int(part.max()) < num_parts):
            _MEMORY[key] = part
            return Partition(part.clone(), num_parts, method)
    if method == "metis":
        part = metis_partition(edge_index, num_nodes, num_parts, seed)
    else:
        part = bfs_partition(edge_index, num_nodes, num_parts)
    if cache:
        _MEMORY[key] = part
        try:
            atomic_torch_save(part, path)
        except OSError as e:  # a read-only cache only costs a recomputation
            warnings.warn(f"could not write partition cache {path}: {e}",
                          stacklevel=2)
    return Partition(part.clone(), num_parts, method)


def halo_sets(csr: DstCSR, partition: Partition, num_hops: int = 1) -> list[Tensor]:
    """The ``num_hops``-hop in-neighbourhood of every part, outside the part.

    Args:
        csr (DstCSR): the graph's edges grouped by target.
        partition (Partition): the node partition.
        num_hops (int, optional): hops ``L``; a part needs its ``L``-hop halo
            to compute ``L`` layers without communication. (default: ``1``)

    Returns:
        One sorted int64 tensor of halo nodes per part.
    """
    if not isinstance(num_hops, int) or num_hops < 0:
        raise ValueError(f"num_hops must be an int >= 0, got {num_hops!r}")
    seen = torch.zeros(csr.num_nodes, dtype=torch.bool)
    out = []
    for nodes in partition.nodes():
        seen.zero_()
        seen[nodes] = True
        frontier, halo = nodes, []
        for _ in range(num_hops):
            nbrs = csr.in_neighbors(frontier)
            frontier = nbrs[~seen[nbrs]]
            seen[frontier] = True
            halo.append(frontier)
        out.append(torch.sort(torch.cat(halo))[0] if halo
                   else nodes.new_empty(0))
    return out
