"""Halo plans and the autograd-aware halo exchange of graph-parallel training.

Graph-parallel full-graph training (as in CAGNET, Tripathy et al., SC 2020;
DistGNN, Md et al., SC 2021; SAR, Mostafa, MLSys 2022) assigns the nodes of
one graph to ranks by a METIS partition. A rank *owns* its nodes and needs,
per layer, the current embeddings of its *halo*: the sources of in-edges of
its owned nodes that other ranks own (PyG's ``source_to_target`` flow). A
:class:`HaloPlan` lists, for one rank, what it receives from and sends to
every other rank; :func:`halo_exchange` moves exactly those rows with one
``all_to_all_single`` (uneven splits) in the forward pass and the rows'
gradients back with the reverse ``all_to_all_single`` in the backward pass.

Local node order: owned nodes first (ascending global id), then halo nodes
grouped by owner rank (ascending global id within an owner), so the rows
received from rank ``p`` land as one contiguous block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["HaloPlan", "HaloStats", "halo_exchange", "halo_counts"]


@dataclass
class HaloStats:
    """What halo exchanges moved on one rank (rows and payload bytes)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    rows_per_layer: dict[int, int] = field(default_factory=dict)
    exchanges: int = 0

    def add(self, layer: int | None, rows: int, sent: int, received: int,
            backward: bool) -> None:
        self.bytes_sent += sent
        self.bytes_received += received
        self.exchanges += 1
        if layer is not None and not backward:
            self.rows_per_layer[layer] = self.rows_per_layer.get(layer, 0) + rows


@dataclass
class HaloPlan:
    """One rank's view of a partitioned graph: owned nodes, halo, exchange lists.

    Build it with :meth:`build`; every rank builds its own from the same
    global graph and partition, and the lists agree across ranks because
    both sides order rows by global id.

    Attributes:
        rank (int): the rank (part) this plan belongs to.
        num_parts (int): ranks ``P``.
        num_nodes (int): global node count ``N``.
        owned (Tensor): ``[n_own]`` global ids of owned nodes, ascending.
        halo (Tensor): ``[n_halo]`` global ids of halo nodes (see module doc).
        send_index (Tensor): ``[n_send]`` positions in ``owned`` of the rows
            sent, grouped by destination rank.
        send_counts (list[int]): rows sent to each rank.
        recv_counts (list[int]): rows received from each rank.
        edge_index (Tensor): ``[2, E_loc]`` in-edges of the owned nodes in
            local ids (sources in ``[0, n_own + n_halo)``, targets in
            ``[0, n_own)``), in global edge order.
        edge_ids (Tensor): ``[E_loc]`` positions of those edges in the global
            ``edge_index`` (to slice edge weights or features).
    """

    rank: int
    num_parts: int
    num_nodes: int
    owned: Tensor
    halo: Tensor
    send_index: Tensor
    send_counts: list[int]
    recv_counts: list[int]
    edge_index: Tensor
    edge_ids: Tensor

    @property
    def num_owned(self) -> int:
        return self.owned.numel()

    @property
    def num_halo(self) -> int:
        return self.halo.numel()

    @property
    def num_local(self) -> int:
        return self.num_owned + self.num_halo

    @classmethod
    def build(cls, edge_index: Tensor, part: Tensor, rank: int,
              num_parts: int | None = None) -> HaloPlan:
        """The plan of ``rank`` for ``edge_index`` partitioned by ``part``.

        Args:
            edge_index (Tensor): ``[2, E]`` global edges ``source -> target``.
            part (Tensor): ``[N]`` int64 part (rank) of every node.
            rank (int): the rank whose plan to build.
            num_parts (int, optional): ranks ``P``. (default: ``part.max() + 1``)
        """
        if part.dim() != 1 or part.dtype != torch.long:
            raise ValueError(f"part must be a 1-D int64 tensor, got {part.dtype} "
                             f"of shape {tuple(part.shape)}")
        n = part.numel()
        num_parts = int(part.max()) + 1 if num_parts is None else num_parts
        if not 0 <= rank < num_parts:
            raise ValueError(f"rank must be in [0, {num_parts}), got {rank!r}")
        if edge_index.numel() and int(edge_index.max()) >= n:
            raise ValueError(f"edge_index refers to node {int(edge_index.max())} but "
                             f"part covers {n} nodes")
        edge_index = edge_index.cpu()
        src, dst = edge_index[0], edge_index[1]
        psrc, pdst = part[src], part[dst]
        owned = torch.nonzero(part == rank).flatten()
        local = torch.full((n,), -1, dtype=torch.long)
        local[owned] = torch.arange(owned.numel())

        # Receive side: remote sources of our in-edges, ordered (owner, id).
        edge_ids = torch.nonzero(pdst == rank).flatten()
        remote = edge_ids[psrc[edge_ids] != rank]
        halo = torch.unique(src[remote])
        halo = halo[torch.argsort(part[halo] * n + halo)]
        recv_counts = torch.bincount(part[halo], minlength=num_parts).tolist()
        local[halo] = owned.numel() + torch.arange(halo.numel())

        # Send side: our nodes that are sources of other ranks' in-edges,
        # ordered (destination rank, id) to match what the receivers expect.
        out = torch.nonzero((psrc == rank) & (pdst != rank)).flatten()
        keys = torch.unique(pdst[out] * n + src[out])
        send_to, send_node = keys // n, keys % n
        send_counts = torch.bincount(send_to, minlength=num_parts).tolist()

        ei = torch.stack([local[src[edge_ids]], local[dst[edge_ids]]])
        return cls(rank, num_parts, n, owned, halo, local[send_node], send_counts,
                   recv_counts, ei, edge_ids)

    def to(self, device: torch.device | str) -> HaloPlan:
        """The plan with its index tensors on ``device``."""
        kw = dict(self.__dict__)
        for k in ("owned", "halo", "send_index", "edge_index", "edge_ids"):
            kw[k] = kw[k].to(device)
        return HaloPlan(**kw)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(rank={self.rank}/{self.num_parts}, "
                f"owned={self.num_owned}, halo={self.num_halo}, "
                f"send={sum(self.send_counts)}, edges={self.edge_ids.numel()})")


def _to(t: Tensor, device: torch.device | None) -> Tensor:
    # Host-resident rows (a rank under the offload engine) travel through the
    # backend's device: NCCL only moves CUDA tensors.
    return t if device is None else t.to(device, non_blocking=True)


def _all_to_all(rows: Tensor, send_counts: list[int], recv_counts: list[int],
                group) -> Tensor:
    out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv_counts,
                           input_split_sizes=send_counts, group=group)
    return out


class _HaloExchange(torch.autograd.Function):
    """Forward: owned rows -> halo rows; backward: the reverse all-to-all,
    halo-row gradients summed into the owned rows they came from."""

    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan, group, stats: HaloStats | None,
                layer: int | None, comm_device: torch.device | None) -> Tensor:
        ctx.plan, ctx.group, ctx.stats, ctx.layer = plan, group, stats, layer
        ctx.comm_device = comm_device
        send = x.index_select(0, plan.send_index)
        out = _all_to_all(_to(send, comm_device), plan.send_counts, plan.recv_counts,
                          group).to(x.device)
        if stats is not None:
            stats.add(layer, out.size(0), send.numel() * send.element_size(),
                      out.numel() * out.element_size(), backward=False)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        plan = ctx.plan
        back = _all_to_all(_to(grad, ctx.comm_device), plan.recv_counts,
                           plan.send_counts, ctx.group).to(grad.device)
        if ctx.stats is not None:
            ctx.stats.add(ctx.layer, back.size(0), grad.numel() * grad.element_size(),
                          back.numel() * back.element_size(), backward=True)
        gx = grad.new_zeros((plan.num_owned, *grad.shape[1:]))
        gx.index_add_(0, plan.send_index, back)
        return gx, None, None, None, None, None


def halo_exchange(x: Tensor, plan: HaloPlan, group=None,
                  stats: HaloStats | None = None, layer: int | None = None,
                  comm_device: torch.device | str | None = None) -> Tensor:
    """The halo rows of ``x`` from their owners (differentiable).

    A collective: every rank of ``group`` must call it, in the same order,
    and (when gradients flow) run the matching backward.

    Args:
        x (Tensor): ``[n_own, ...]`` rows of the owned nodes.
        plan (HaloPlan): this rank's plan.
        group (ProcessGroup, optional): the ranks. (default: all)
        stats (HaloStats, optional): counters to add rows and bytes to.
        layer (int, optional): layer index recorded in ``stats``.
        comm_device (torch.device or str, optional): where the rows travel
            when it is not ``x``'s device (host rows over NCCL: the CUDA
            device); the result is on ``x``'s device. (default: ``None``)

    Returns:
        ``[n_halo, ...]`` rows in the plan's halo order.
    """
    if x.size(0) != plan.num_owned:
        raise ValueError(f"halo_exchange: x has {x.size(0)} rows but rank "
                         f"{plan.rank} owns {plan.num_owned} nodes")
    if comm_device is not None:
        comm_device = torch.device(comm_device)
        if comm_device == x.device:
            comm_device = None
    return _HaloExchange.apply(x, plan, group, stats, layer, comm_device)


def halo_counts(edge_index: Tensor, part: Tensor, num_parts: int | None = None
                ) -> Tensor:
    """Rows every rank sends every other rank in one halo exchange.

    Counted from the partition alone (no processes), so volumes can be
    reported for more ranks than a machine runs.

    Returns:
        ``[P, P]`` int64 matrix: entry ``[p, q]`` is the number of nodes owned
        by ``p`` with an edge into ``q`` (rows ``p`` sends ``q``).
    """
    num_parts = int(part.max()) + 1 if num_parts is None else num_parts
    n = part.numel()
    src, dst = edge_index[0], edge_index[1]
    pdst = part[dst]
    cut = part[src] != pdst
    keys = torch.unique(pdst[cut] * n + src[cut])
    sender, receiver = part[keys % n], keys // n
    flat = torch.bincount(sender * num_parts + receiver,
                          minlength=num_parts * num_parts)
    return flat.view(num_parts, num_parts)
