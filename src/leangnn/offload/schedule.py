"""Schedules of offloaded training: chunk jobs, their order, and next uses.

Two schedules run in the same engine:

* :class:`ExactSchedule` (NeutronJittor, Fundamental Research 2026): every
  layer sweeps over the same chunks; a chunk computes layer ``l`` for its
  targets ``T`` from the layer input on ``S = T + 1-hop halo``, so each vertex
  embedding is computed once per layer and epoch and every chunk that needs it
  reads it. Partitions are visited in an order that maximises the overlap of
  consecutive halos, and successive sweeps alternate direction so the rows a
  sweep touched last are the ones the next sweep needs first. Because the
  whole epoch is known in advance, the schedule answers "when is this row
  read next?", the temporal half of the ``st`` cache policy.
* :class:`RecomputeSchedule`, the baseline it replaces (subgraph-wise
  execution as in DGL/Cluster-GCN with full ``L``-hop halos): each partition
  computes all ``L`` layers for its ``L``-hop in-neighbourhood, so vertices
  shared between partitions are recomputed in every one of them.

Chunks are cut so each job fits the device workspace (a ``fits(|S|, |T|,
|E|)`` test supplied by the engine). A node whose in-edges alone do not fit
(a hub) is split into edge pieces, one job each, whose partial aggregates
combine exactly (:mod:`~leangnn.offload.partial`); a hub's pieces are
consecutive chunks, visited in order by forward sweeps (the owner of the
target last) and in reverse by backward sweeps (the owner first), whatever
the sweep's direction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from leangnn.graphs.partition import Partition
from leangnn.graphs.sparse import DstCSR
from leangnn.offload.cache import INF_STEP
from leangnn.offload.partial import Piece

__all__ = ["Chunk", "ChunkBuilder", "overlap_order", "ExactSchedule",
           "RecomputeSchedule", "BudgetError"]

Fits = Callable[[int, int, int], bool]


class BudgetError(ValueError):
    """The device budget cannot hold the parameters or a one-node job.

    ``node`` and ``sizes`` (``|S|, |T|, |E|``) name the job that did not fit,
    when one did not; ``in_degree`` is that node's in-edges (the smallest
    job, one in-edge, is ``sizes`` when even that does not fit).
    """

    def __init__(self, message: str, node: int | None = None,
                 sizes: tuple[int, int, int] | None = None,
                 in_degree: int | None = None):
        super().__init__(message)
        self.node, self.sizes = node, sizes
        self.in_degree = in_degree if in_degree is not None or sizes is None \
            else sizes[2]


@dataclass
class Chunk:
    """One job's subgraph: ``targets`` ``T`` and ``sources`` ``S`` (``T``
    first, then the halo; global ids), local edges ``[2, E_c]`` (int32) from
    ``S``-positions to ``T``-positions, and their weights. Schedules built
    only to count (``topology=False``) keep ``num_edges`` but no edges.
    ``piece`` marks an edge-split job of a hub (its targets are empty but
    for the last piece; the hub is its first source)."""

    targets: Tensor
    sources: Tensor
    edge_index: Tensor | None
    edge_weight: Tensor | None
    num_edges: int = 0
    weighted: bool = False
    piece: Piece | None = None

    @property
    def num_targets(self) -> int:
        return self.targets.numel()

    @property
    def sizes(self) -> tuple[int, int, int]:
        return (self.sources.numel(), self.targets.numel(), self.num_edges)


class ChunkBuilder:
    """Cuts target sets into chunks whose job fits the device workspace.

    Args:
        csr (DstCSR): edges grouped by target (with the conv's weights).
        fits (callable): ``fits(|S|, |T|, |E|) -> bool``.
        estimate (callable, optional): job bytes / workspace, to split
            oversized chunks into enough pieces at once.
        topology (bool, optional): build the local edges (``False``: sizes
            and sources only, for counting). (default: ``True``)
        split_hubs (bool, optional): split a node whose one-node job does
            not fit into edge pieces instead of raising. (default: ``False``)
    """

    def __init__(self, csr: DstCSR, fits: Fits, estimate: Callable | None = None,
                 topology: bool = True, split_hubs: bool = False):
        self.csr = csr
        self.fits = fits
        self.estimate = estimate
        self.topology = topology
        self.split_hubs = split_hubs
        self._mark = torch.zeros(csr.num_nodes, dtype=torch.bool)
        self._halo = torch.zeros(csr.num_nodes, dtype=torch.bool)
        self._loc = torch.zeros(csr.num_nodes, dtype=torch.long)

    def build(self, targets: Tensor) -> Chunk:
        csr = self.csr
        ids, counts = csr.edge_ids(targets)
        src = csr.col[ids]
        if src.numel() * 64 > csr.num_nodes:
            # large chunks: flagging every source, unflagging the targets and
            # one scan of N flags beats masking and sorting the candidates
            # (and also yields sorted ids)
            self._halo[src] = True
            self._halo[targets] = False
            halo = torch.nonzero(self._halo).flatten()
            self._halo[halo] = False
        else:
            self._mark[targets] = True
            halo = torch.unique(src[~self._mark[src]])
            self._mark[targets] = False
        sources = torch.cat([targets, halo])
        weighted = csr.weight is not None
        if not self.topology:
            return Chunk(targets, sources, None, None, ids.numel(), weighted)
        self._loc[sources] = torch.arange(sources.numel())
        dst = torch.repeat_interleave(torch.arange(targets.numel()), counts,
                                      output_size=ids.numel())
        ei = torch.stack([self._loc[src], dst]).to(torch.int32)
        w = csr.weight[ids] if weighted else None
        return Chunk(targets, sources, ei, w, ids.numel(), weighted)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.csr}, topology={self.topology})"

    def split(self, targets: Tensor, max_edges: int | None = None,
              first: Chunk | None = None) -> list[Chunk]:
        """Chunks covering ``targets`` in order, each fitting the budget
        (``first``: ``build(targets)``, when the caller has it already)."""
        out: list[Chunk] = []
        pieces = [targets]
        if max_edges is not None:
            pieces = self._cut(targets, max(1, -(-int(self.csr.in_degree(
                targets).sum()) // max_edges)))
            first = None
        for piece in pieces:
            self._split(piece, out, first)
        return out

    def _cut(self, targets: Tensor, k: int) -> list[Tensor]:
        """Split into ``k`` contiguous pieces of about equal edge count."""
        k = min(k, targets.numel())
        if k <= 1:
            return [targets]
        cum = torch.cumsum(self.csr.in_degree(targets) + 1, 0)
        bounds = torch.searchsorted(cum, cum[-1] * torch.arange(1, k) / k)
        bounds = torch.unique(bounds.clamp(1, targets.numel() - 1))
        return [p for p in torch.tensor_split(targets, bounds) if p.numel()]

    def _split(self, targets: Tensor, out: list[Chunk],
               first: Chunk | None = None) -> None:
        ch = first if first is not None else self.build(targets)
        if self.fits(*ch.sizes):
            out.append(ch)
            return
        if targets.numel() == 1 and self.split_hubs:
            del ch
            out.extend(self.pieces(int(targets[0])))
            return
        if targets.numel() == 1:
            need = "" if self.estimate is None else (
                f" (it needs {self.estimate(*ch.sizes):.2f}x the workspace)")
            raise BudgetError(
                f"device_budget too small: node {int(targets[0])} with "
                f"{ch.sizes[2]} in-edges does not fit the device workspace{need}; "
                "raise device_budget", int(targets[0]), ch.sizes, ch.sizes[2])
        k = 2
        if self.estimate is not None:
            k = max(2, int(np.ceil(self.estimate(*ch.sizes))))
        del ch
        for piece in self._cut(targets, k):
            self._split(piece, out)


    def piece_edges(self, node: int) -> int:
        """Most in-edges of ``node`` one piece may carry (distinct sources
        assumed); ``0`` when not even one in-edge fits."""
        lo, hi = 0, int(self.csr.in_degree(torch.tensor([node]))[0])
        while lo < hi:  # the workspace grows with the edges: bisect
            mid = (lo + hi + 1) // 2
            if self.fits(mid + 1, 1, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def pieces(self, node: int) -> list[Chunk]:
        """``node``'s in-edges as consecutive edge pieces, each fitting.

        Raises:
            BudgetError: not even a one-edge piece fits (the message names
                the node and its in-degree).
        """
        ids, _ = self.csr.edge_ids(torch.tensor([node]))
        deg = ids.numel()
        per = self.piece_edges(node)
        if per == 0:
            need = "" if self.estimate is None else (
                f" (one in-edge needs {self.estimate(2, 1, 1):.2f}x the workspace)")
            raise BudgetError(
                f"device_budget too small: node {node} with {deg} in-edges does "
                f"not fit the device workspace even one in-edge at a time{need}; "
                "raise device_budget", node, (2, 1, 1), deg)
        k = -(-deg // per)
        bounds = torch.linspace(0, deg, k + 1).round().long().tolist()
        v = torch.tensor([node])
        out = []
        for i in range(k):
            pid = ids[bounds[i]:bounds[i + 1]]
            src = self.csr.col[pid]
            halo = torch.unique(src[src != node])
            sources = torch.cat([v, halo])
            targets = v if i == k - 1 else v[:0]
            piece = Piece(node, i, k, deg)
            weighted = self.csr.weight is not None
            if not self.topology:
                out.append(Chunk(targets, sources, None, None, pid.numel(), weighted,
                                 piece))
                continue
            self._loc[sources] = torch.arange(sources.numel())
            ei = torch.stack([self._loc[src], torch.zeros_like(src)]).to(torch.int32)
            w = self.csr.weight[pid] if weighted else None
            out.append(Chunk(targets, sources, ei, w, pid.numel(), weighted, piece))
        return out


def overlap_order(sets: list[Tensor], num_nodes: int) -> list[int]:
    """Visit order of parts maximising the overlap of consecutive ``sets``.

    Greedy maximum-weight path on the ``P x P`` overlap matrix
    ``|S_p & S_q|`` (nearest-neighbour heuristic for the max-TSP path): from
    a start part, always move to the unvisited part sharing the most rows
    with the current one; every start is tried (up to 64 parts) and the path
    with the largest total overlap wins.
    """
    p = len(sets)
    if p <= 2:
        return list(range(p))
    rows = torch.cat(sets).numpy()
    cols = np.repeat(np.arange(p), [s.numel() for s in sets])
    m = sp.csr_matrix((np.ones(rows.size, dtype=np.float64), (rows, cols)),
                      shape=(num_nodes, p))
    ov = (m.T @ m).toarray()
    np.fill_diagonal(ov, -np.inf)
    starts = range(p) if p <= 64 else [int(np.argmax(ov.clip(0).sum(1)))]
    best, best_w = None, -np.inf
    for start in starts:
        order, free = [start], np.ones(p, dtype=bool)
        free[start] = False
        w = 0.0
        while len(order) < p:
            cand = np.where(free, ov[order[-1]], -np.inf)
            nxt = int(np.argmax(cand))
            w += cand[nxt]
            free[nxt] = False
            order.append(nxt)
        if w > best_w:
            best, best_w = order, w
    return best


class ExactSchedule:
    """The exact layer-wise schedule: the same chunks in every sweep.

    Sweep ``k`` visits the chunks in order (even ``k``) or reversed (odd
    ``k``); step ``s = k * C + j`` is the ``j``-th job of sweep ``k``.

    Args:
        csr (DstCSR): edges grouped by target.
        partition (Partition): node parts.
        fits (callable): the workspace test for a job.
        order (str, optional): ``"overlap"`` (see :func:`overlap_order`) or
            ``"natural"`` (part ids). (default: ``"overlap"``)
        estimate (callable, optional): job bytes / workspace (speeds up
            splitting).
        topology (bool, optional): keep the chunks' local edges (``False``
            when the schedule is only replayed to count). (default: ``True``)
        num_layers (int, optional): layers of the model; given, a hub whose
            one-node job does not fit is split into edge pieces (sweeps
            ``k < num_layers`` are forward, the rest backward). (default:
            ``None``: no split, such a hub raises :class:`BudgetError`)
    """

    def __init__(self, csr: DstCSR, partition: Partition, fits: Fits,
                 order: str = "overlap", estimate: Callable | None = None,
                 topology: bool = True, num_layers: int | None = None):
        if order not in ("overlap", "natural"):
            raise ValueError(f"order must be 'overlap' or 'natural', got {order!r}")
        n = csr.num_nodes
        self.topology = topology
        self.num_layers = num_layers
        builder = ChunkBuilder(csr, fits, estimate, topology,
                               split_hubs=num_layers is not None)
        parts = partition.nodes()
        first: list[Chunk | None] = [None] * len(parts)
        if order == "overlap" and len(parts) > 2:
            if topology:
                closure = [torch.unique(torch.cat([v, csr.in_neighbors(v)]))
                           for v in parts]
            else:
                # a part's own job has its closure (the part and its in-halo)
                # as sources, and splitting starts by building that job:
                # build it once for both (a counting schedule keeps no edges,
                # so holding every part's job at once costs little)
                first = [builder.build(v) for v in parts]
                closure = [ch.sources for ch in first]
            self.part_order = overlap_order(closure, n)
            del closure
        else:
            self.part_order = list(range(len(parts)))
        self.chunks: list[Chunk] = []
        self.chunk_part: list[int] = []
        for p in self.part_order:
            ch0, first[p] = first[p], None
            for ch in builder.split(parts[p], first=ch0):
                self.chunks.append(ch)
                self.chunk_part.append(p)
        self.num_chunks = len(self.chunks)
        self.num_nodes = n
        self.num_pieces = sum(ch.piece is not None for ch in self.chunks)
        self._orders()
        # the next-use index serves the ``st`` cache only (a CPU "device"
        # caches nothing): built on first use (0.07-0.2 s at 100k nodes)
        self._indexed = False

    _INDEX = frozenset({"offsets", "count", "next_pos", "prev_pos", "rank",
                        "first_pos", "last_pos", "owner_pos"})

    def __getattr__(self, name: str):
        if name in ExactSchedule._INDEX and not self.__dict__.get("_indexed", True):
            self._indexed = True
            self._index(self.num_nodes, self.num_chunks)
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute "
                             f"{name!r}")

    def _orders(self) -> None:
        """Visit orders and ranks when hubs are split: units (a chunk, or a
        hub's pieces) alternate direction as usual; inside a hub, forward
        runs its pieces in order (owner last), backward in reverse."""
        self._visit: dict[tuple[bool, int], list[int]] = {}
        self._rank: dict[tuple[bool, int], Tensor] = {}
        if not self.num_pieces:
            return
        units, j = [], 0
        while j < self.num_chunks:
            pc = self.chunks[j].piece
            size = 1 if pc is None else pc.count
            units.append(list(range(j, j + size)))
            j += size
        for fwd in (True, False):
            for d in (1, -1):
                seq = []
                for u in (units if d == 1 else units[::-1]):
                    seq.extend(u if fwd else u[::-1])
                rank = torch.empty(self.num_chunks, dtype=torch.long)
                rank[torch.tensor(seq)] = torch.arange(self.num_chunks)
                self._visit[fwd, d], self._rank[fwd, d] = seq, rank

    def _kind(self, k: int) -> tuple[bool, int]:
        return (self.num_layers is None or k < self.num_layers, self.direction(k))

    def _index(self, n: int, c: int) -> None:
        # Every row of every chunk's S as (row, position) in visiting order; a
        # stable sort by row groups each row's positions in increasing order,
        # so "next position with this row" is a neighbour in the sorted list.
        sizes = torch.tensor([ch.sources.numel() for ch in self.chunks])
        self.offsets = torch.zeros(c + 1, dtype=torch.long)
        torch.cumsum(sizes, 0, out=self.offsets[1:])
        rows = torch.cat([ch.sources for ch in self.chunks])
        pos = torch.repeat_interleave(torch.arange(c, dtype=torch.int32), sizes)
        perm = torch.argsort(rows, stable=True)
        r, p = rows[perm], pos[perm]
        same_next = torch.zeros_like(r, dtype=torch.bool)
        same_next[:-1] = r[1:] == r[:-1]
        nxt = torch.full_like(p, -1)
        nxt[:-1] = torch.where(same_next[:-1], p[1:], -1)
        prv = torch.full_like(p, -1)
        prv[1:] = torch.where(same_next[:-1], p[:-1], -1)
        self.count = torch.bincount(r, minlength=n).to(torch.int32)
        start = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(self.count.long(), 0, out=start[1:])
        rank = (torch.arange(r.numel()) - start[r]).to(torch.int32)
        self.next_pos = torch.empty_like(nxt)
        self.prev_pos = torch.empty_like(prv)
        self.rank = torch.empty_like(rank)
        self.next_pos[perm] = nxt
        self.prev_pos[perm] = prv
        self.rank[perm] = rank
        self.first_pos = p[start[:-1].clamp(max=r.numel() - 1)].long()
        self.last_pos = p[(start[1:] - 1).clamp(min=0)].long()
        self.owner_pos = torch.empty(n, dtype=torch.long)
        for j, ch in enumerate(self.chunks):
            self.owner_pos[ch.targets] = j

    @staticmethod
    def direction(k: int) -> int:
        return 1 if k % 2 == 0 else -1

    def visit(self, k: int) -> list[int]:
        c = self.num_chunks
        if self.num_pieces:
            return list(self._visit[self._kind(k)])
        return list(range(c)) if self.direction(k) == 1 else list(range(c - 1, -1, -1))

    def step(self, k: int, pos: Tensor) -> Tensor:
        c = self.num_chunks
        if self.num_pieces:
            return k * c + self._rank[self._kind(k)][pos]
        j = pos if self.direction(k) == 1 else c - 1 - pos
        return k * c + j

    def _first_after(self, accesses, k: int, rows: Tensor) -> tuple[Tensor, int]:
        """Step of the first access after sweep ``k``, and that sweep."""
        for k2, kind in accesses:
            if k2 > k:
                if kind == "T":
                    pos = self.owner_pos[rows]
                elif self.direction(k2) == 1:
                    pos = self.first_pos[rows]
                else:
                    pos = self.last_pos[rows]
                return self.step(k2, pos), k2
        return torch.full_like(rows, INF_STEP), -1

    def next_use(self, accesses, k: int, chunk: int | None,
                 rows: Tensor) -> tuple[Tensor, Tensor]:
        """Next step reading each row, and how many reads remain.

        Args:
            accesses: ``[(sweep, "S" | "T"), ...]`` of the row's array: it is
                read by every job's sources (``"S"``) or by its owner (``"T"``).
            k (int): current sweep.
            chunk (int or None): current chunk when ``rows`` are its sources
                and sweep ``k`` reads the array through ``S``; ``None`` for
                rows the job produced.
            rows (Tensor): row ids.
        """
        later, _ = self._first_after(accesses, k, rows)
        remaining = torch.zeros(rows.numel(), dtype=torch.long)
        cnt = self.count[rows].long()
        for k2, kind in accesses:
            if k2 > k:
                remaining += cnt if kind == "S" else 1
        if chunk is None:
            return later, remaining
        seg = slice(int(self.offsets[chunk]), int(self.offsets[chunk + 1]))
        if self.direction(k) == 1:
            pos = self.next_pos[seg].long()
            remaining += cnt - self.rank[seg].long() - 1
        else:
            pos = self.prev_pos[seg].long()
            remaining += self.rank[seg].long()
        within = torch.where(pos >= 0, self.step(k, pos.clamp(min=0)), INF_STEP)
        if self.num_pieces:
            # inside a hub the visit is not monotone in position: the row's
            # other neighbour in position order may come next instead (an
            # approximation only for rows a hub's pieces share)
            now = self.step(k, torch.tensor(chunk))
            other = (self.prev_pos if self.direction(k) == 1 else self.next_pos)[seg]
            other = other.long()
            alt = torch.where(other >= 0, self.step(k, other.clamp(min=0)), INF_STEP)
            within = torch.where(within > now, within, INF_STEP)
            within = torch.minimum(within, torch.where(alt > now, alt, INF_STEP))
        return torch.minimum(within, later), remaining

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_chunks={self.num_chunks}, "
                f"parts={len(self.part_order)})")


@dataclass
class PartPlan:
    """One partition of the recompute baseline.

    ``sets[li]`` are the (sorted, global) targets of layer ``l``: the
    ``(L-1-li)``-hop in-neighbourhood of the part; ``chunks[li]`` cut them;
    ``input_rows[li][c]`` are chunk ``c``'s sources as rows of layer ``l``'s
    input array (global ids for the features, positions in ``sets[li-1]``
    otherwise) and ``output_rows[li][c]`` its targets as positions in
    ``sets[li]``.
    """

    part: int
    sets: list[Tensor]
    chunks: list[list[Chunk]]
    input_rows: list[list[Tensor]]
    output_rows: list[list[Tensor]]


class RecomputeSchedule:
    """The subgraph-wise baseline: ``L``-hop halos, shared vertices recomputed.

    Args:
        csr (DstCSR): edges grouped by target.
        partition (Partition): node parts.
        num_layers (int): ``L``.
        fits (callable): the workspace test for a job.
        estimate (callable, optional): job bytes / workspace.
        topology (bool, optional): build local edges. (default: ``True``)
    """

    def __init__(self, csr: DstCSR, partition: Partition, num_layers: int,
                 fits: Fits, estimate: Callable | None = None,
                 topology: bool = True):
        self.csr = csr
        self.num_layers = num_layers
        self.topology = topology
        self.parts = partition.nodes()
        self.part_order = list(range(len(self.parts)))
        self.builder = ChunkBuilder(csr, fits, estimate, topology)
        self.max_edges = max(1, csr.num_edges // max(1, len(self.parts)))

    def plan(self, p: int) -> PartPlan:
        """Build partition ``p``'s subgraph jobs (on demand: they are large)."""
        sets = [None] * self.num_layers
        cur = self.parts[p]
        for li in range(self.num_layers - 1, -1, -1):
            sets[li] = cur
            if li:
                cur = torch.unique(torch.cat([cur, self.csr.in_neighbors(cur)]))
        chunks, ins, outs = [], [], []
        loc = self.builder._loc  # scratch: global id -> position in a set
        for li in range(self.num_layers):
            cs = self.builder.split(sets[li], self.max_edges)
            chunks.append(cs)
            if li == 0:
                ins.append([c.sources for c in cs])
            else:
                loc[sets[li - 1]] = torch.arange(sets[li - 1].numel())
                ins.append([loc[c.sources] for c in cs])
            loc[sets[li]] = torch.arange(sets[li].numel())
            outs.append([loc[c.targets] for c in cs])
        return PartPlan(p, sets, chunks, ins, outs)

    def vertex_layers(self) -> int:
        """Vertex-layer computations of one forward pass (no jobs built)."""
        total = 0
        for v in self.parts:
            cur = v
            total += cur.numel()
            for _ in range(self.num_layers - 1):
                cur = torch.unique(torch.cat([cur, self.csr.in_neighbors(cur)]))
                total += cur.numel()
        return total

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(parts={len(self.parts)})"
