"""Graph-parallel, exact full-graph training of one graph across ranks.

The nodes of one big graph are split by METIS
(:func:`leangnn.graphs.partition.partition_graph`), one part per rank, as in
CAGNET (Tripathy et al., SC 2020) and DistGNN (Md et al., SC 2021). Each rank
runs the *unchanged* model on its owned nodes: every message-passing layer
(any PyG ``MessagePassing`` inside the model, found by module traversal) is
wrapped by forward hooks that

1. fill the halo rows of the layer's input from their owners
   (:func:`~leangnn.distributed.halo.halo_exchange`, whose backward sends the
   rows' gradients back),
2. run the conv on the local subgraph (owned nodes + 1-hop in-halo, only the
   owned nodes' in-edges), as a bipartite ``(local, owned)`` call where the
   conv takes one (GCN computes the halo rows too), and
3. keep the owned rows of its output,

so everything between convs (encoders, activations, node-wise norms,
residuals, heads) runs on owned rows as it is. The result is exact: a
target's output depends only on its in-edges and their sources, all local;
GCN's normalisation uses *global* degrees (owned degrees are local, halo
degrees come from their owners by one exchange); GAT's softmax runs over the
in-edges of a target, all local to the target's owner. The loss is normalised
by the *global* number of labelled nodes and parameter gradients are summed
over ranks, so every rank ends with the full-batch gradient. (Dropout draws
its masks on each rank's rows: the same training in distribution, not bit for
bit.)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

from leangnn.distributed.halo import HaloPlan, HaloStats, halo_exchange
from leangnn.distributed.layers import (
    check_model,
    local_gcn_norm,
    message_passing_layers,
    takes_size,
)
from leangnn.distributed.runtime import all_reduce_gradients, all_reduce_sum
from leangnn.graphs.partition import Partition, partition_graph
from leangnn.nn.reversible import GSRStack
from leangnn.strategy import LossFn, node_mask, takes_edge_attr

__all__ = ["GraphParallel", "Executor", "part_key"]

#: ``executor(model, runner) -> [n_own, out]``: how a rank runs the model on
#: its part. The default is plain autograd with the hooks above; an offload
#: executor (:class:`~leangnn.distributed.rank_offload.RankOffload`, each rank
#: under its own device budget) must call ``runner.exchange(h, layer)`` once
#: per layer, in layer order, like it. An executor whose ``host_resident``
#: attribute is true gets the part's features and plan on the host.
Executor = Callable[[torch.nn.Module, "GraphParallel"], Tensor]


def _part_vector(partition: Partition | Tensor, num_nodes: int, world: int) -> Tensor:
    part = partition.part if isinstance(partition, Partition) else partition
    if not isinstance(part, Tensor) or part.shape != (num_nodes,):
        raise ValueError(f"partition must give one part per node ({num_nodes}), got "
                         f"{getattr(part, 'shape', type(part).__name__)}")
    part = part.long().cpu()
    if num_nodes and (int(part.min()) < 0 or int(part.max()) >= world):
        raise ValueError(f"partition: part ids must be in [0, {world}) for "
                         f"{world} ranks, got [{int(part.min())}, {int(part.max())}]")
    return part


def part_key(data: Data) -> tuple:
    """What identifies ``data``'s graph for its part: train, val and test
    splits of one graph share ``x`` and ``edge_index``, so one part."""
    return (data.x.data_ptr(), data.edge_index.data_ptr(), int(data.num_nodes),
            int(data.num_edges))


class GraphParallel:
    """One graph trained full-batch across the ranks of ``group``, exactly.

    Every rank of ``group`` builds one with the same ``data`` (each keeps only
    its part: owned features, the local subgraph and the exchange lists).
    All methods that run the model are collectives.

    Args:
        data (Data): the global graph (``x``, ``edge_index``, optional ``y``,
            ``edge_weight``, ``edge_attr``).
        group (ProcessGroup, optional): the ranks. (default: all)
        device (torch.device or str, optional): this rank's device.
            (default: ``"cpu"``)
        partition (Partition or Tensor, optional): part (= rank) per node;
            by default METIS on ``data``, computed on rank 0 and broadcast.
        method (str, optional): ``partition_graph`` method. (default: ``"auto"``)
        seed (int, optional): METIS seed. (default: ``0``)
        executor (callable, optional): see :data:`Executor`. (default: plain
            autograd on ``device``)

    Shapes:
        :meth:`forward` returns ``[n_own, out_channels]`` for the owned nodes
        (``plan.owned``); :meth:`predict` returns ``[N, out_channels]``.
    """

    def __init__(self, data: Data, group=None, device: torch.device | str = "cpu",
                 partition: Partition | Tensor | None = None, method: str = "auto",
                 seed: int = 0, executor: Executor | None = None):
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.device = torch.device(device)
        n = int(data.num_nodes)
        if n < self.world_size:
            raise ValueError(f"graph parallel: {n} nodes cannot be split over "
                             f"{self.world_size} ranks")
        if partition is None:
            part = torch.empty(n, dtype=torch.long)
            if self.rank == 0:
                part = partition_graph(data.edge_index.cpu(), n, self.world_size,
                                       method=method, seed=seed).part
            # One partition for all ranks even if METIS were not deterministic.
            comm_dev = self.device if dist.get_backend(group) == "nccl" else "cpu"
            part = part.to(comm_dev)
            root = dist.get_global_rank(group, 0) if group is not None else 0
            dist.broadcast(part, src=root, group=group)
            part = part.cpu()
        comm = self.device if dist.get_backend(group) == "nccl" else None
        self._attach(data, _part_vector(part if partition is None else partition,
                                        n, self.world_size), executor, comm)

    def _attach(self, data: Data, part: Tensor, executor: Executor | None,
                comm_device: torch.device | None) -> None:
        """Keep this rank's part of ``data`` under ``part`` (no collective;
        the planner's :class:`~leangnn.plan.distributed.PlannedRank` builds a
        rank's part through it, without a process group)."""
        self.part, self.num_nodes = part, int(data.num_nodes)
        plan = HaloPlan.build(data.edge_index, self.part, self.rank, self.world_size)
        self._owned_cpu = plan.owned
        self.executor = executor
        # Where the part lives (the host under an offload executor) and where
        # halo rows travel (NCCL moves CUDA tensors only).
        where = (torch.device("cpu") if getattr(executor, "host_resident", False)
                 else self.device)
        self.data_device = where
        self.comm_device = comm_device or torch.device("cpu")
        self.plan = plan.to(where)
        self.x = data.x[plan.owned].to(where)
        ew, ea = data.get("edge_weight", None), data.get("edge_attr", None)
        self.edge_weight = None if ew is None else ew[plan.edge_ids].to(where)
        self.edge_attr = None if ea is None else ea[plan.edge_ids].to(where)
        self.stats = HaloStats()
        self._gcn: dict[tuple, tuple[Tensor, Tensor]] = {}
        self._static_halo: tuple[tuple, Tensor] | None = None
        self._all_owned: list[Tensor] | None = None
        self._hooked_model: torch.nn.Module | None = None

    # ------------------------------------------------------------------ #
    def exchange(self, h: Tensor, layer: int | None = None) -> Tensor:
        """Halo rows of ``h`` (owned rows) from their owners (differentiable)."""
        return halo_exchange(h, self.plan, self.group, self.stats, layer,
                             self.comm_device)

    def local_input(self, h: Tensor, layer: int | None = None) -> Tensor:
        """``[n_own + n_halo, ...]``: owned rows of ``h`` then their halo rows."""
        if h is self.x and not h.requires_grad:
            # The input features never change: their halo moves once.
            key = (h.data_ptr(), h._version, h.dtype)
            if self._static_halo is None or self._static_halo[0] != key:
                self._static_halo = (key, self.exchange(h, layer))
            return torch.cat([h, self._static_halo[1]])
        return torch.cat([h, self.exchange(h, layer)])

    def _gcn_topology(self, conv: GCNConv, weight: Tensor | None, dtype: torch.dtype
                      ) -> tuple[Tensor, Tensor]:
        """Local GCN edges with global symmetric normalisation (as ``gcn_norm``)."""
        key = (conv.improved, conv.add_self_loops, dtype,
               None if weight is None else (weight.data_ptr(), weight._version))
        if key in self._gcn:
            return self._gcn[key]
        self._gcn[key] = local_gcn_norm(
            self.plan.edge_index, weight, self.plan.num_owned, conv.improved,
            conv.add_self_loops, dtype, self.exchange)
        return self._gcn[key]

    @contextmanager
    def hooked(self, model: torch.nn.Module):
        """Within the block, ``model``'s convs run on the local subgraph.

        Re-entrant. Keep it open through ``backward()`` for models that run
        their convs again in the backward pass (reversible GSR stacks).
        """
        if self._hooked_model is not None:
            if self._hooked_model is not model:
                raise RuntimeError("graph parallel: another model is hooked")
            yield
            return
        convs = message_passing_layers(model)
        count = [0]
        gcn_normalize = {id(c): c.normalize for c in convs if isinstance(c, GCNConv)}

        def pre(module, args, kwargs):
            if len(args) != 2 or not isinstance(args[0], Tensor):
                raise ValueError(
                    f"graph parallel: {type(module).__name__} must be called as "
                    "conv(x, edge_index, **kwargs) with a tensor x (edge weights "
                    "and features as keywords)")
            x, ei = args
            layer, count[0] = count[0], count[0] + 1
            xl = self.local_input(x, layer)
            if isinstance(module, GCNConv):  # takes no (source, target) pair
                if gcn_normalize[id(module)]:
                    ei, kwargs["edge_weight"] = self._gcn_topology(
                        module, kwargs.get("edge_weight"), xl.dtype)
                return (xl, ei), kwargs
            # Bipartite call: outputs (and root weights) for owned rows only.
            if takes_size(module):
                kwargs["size"] = (xl.size(0), x.size(0))
            return ((xl, x), ei), kwargs

        def post(module, args, out):
            if not isinstance(out, Tensor):
                raise ValueError(f"graph parallel: {type(module).__name__} returned "
                                 f"{type(out).__name__}, expected a tensor")
            return out[: self.plan.num_owned]

        # A reversible GSR stack's CSR kernels compute its SAGE and GAT group
        # functions without calling the convs, i.e. past these hooks, on the
        # owned rows alone: its PyG path (exact to rounding) runs instead.
        stacks = [(m, m.kernels) for m in model.modules() if isinstance(m, GSRStack)]
        handles = []
        self._hooked_model = model
        try:
            for m, _ in stacks:
                m.kernels = False
            for c in convs:
                handles.append(c.register_forward_pre_hook(pre, with_kwargs=True))
                handles.append(c.register_forward_hook(post))
                if isinstance(c, GCNConv):
                    # Weights arrive globally normalised; the conv's own
                    # (local-degree) normalisation must not run again.
                    c.normalize = False
            yield
        finally:
            self._hooked_model = None
            for m, on in stacks:
                m.kernels = on
            for h in handles:
                h.remove()
            for c in convs:
                if id(c) in gcn_normalize:
                    c.normalize = gcn_normalize[id(c)]

    def _autograd_forward(self, model: torch.nn.Module, runner: GraphParallel
                          ) -> Tensor:
        kwargs = {}
        if self.edge_weight is not None:
            kwargs["edge_weight"] = self.edge_weight
        if self.edge_attr is not None and takes_edge_attr(model):
            # as a full-batch forward (forward_kwargs) would be given them
            kwargs["edge_attr"] = self.edge_attr
        with self.hooked(model):
            return model(self.x, self.plan.edge_index, **kwargs)

    def forward(self, model: torch.nn.Module) -> Tensor:
        """The model's output on the owned nodes, ``[n_own, out]`` (collective)."""
        check_model(model)
        return (self.executor or self._autograd_forward)(model, self)

    # ------------------------------------------------------------------ #
    def local_loss(self, out: Tensor, data: Data, loss_fn: LossFn) -> tuple[Tensor,
                                                                          int]:
        """This rank's share of the global mean loss, and the global count.

        ``loss_fn`` must be a mean over the nodes it covers (as the Trainer's
        is); scaling it by ``n_local / n_global`` makes the sum over ranks the
        global mean, so summing gradients gives the full-batch gradient.
        """
        owned = self._owned_cpu
        mask = node_mask(data)
        local = Data(y=data.y[owned], num_nodes=owned.numel())
        if mask is None:
            n_local, n_global = owned.numel(), self.num_nodes
        else:
            local.node_mask = mask[owned]
            n_local, n_global = int(local.node_mask.sum()), int(mask.sum())
        if n_global == 0:
            raise ValueError("graph parallel: the loss covers no node (empty mask)")
        if n_local == 0:
            # No labelled node here, but the backward must still run: peers
            # wait for this rank's halo gradients.
            return out.sum() * 0.0, n_global
        return loss_fn(out, local) * (n_local / n_global), n_global

    def local_backward(self, model: torch.nn.Module, data: Data, loss_fn: LossFn
                       ) -> Tensor:
        """Forward, this rank's share of the loss and its backward (collective:
        halo exchanges); the gradients are not summed yet."""
        # An executor runs the layers itself: the conv hooks must stay off.
        with self.hooked(model) if self.executor is None else nullcontext():
            out = self.forward(model)
            loss, _ = self.local_loss(out, data, loss_fn)
            loss.backward()
        return loss

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn: LossFn
                   ) -> tuple[float, int]:
        """Forward, global-mean loss, backward and gradient sum (collective).

        Returns:
            The global loss (identical on every rank) and the bytes of the
            gradient all-reduce.
        """
        loss = self.local_backward(model, data, loss_fn)
        nbytes = all_reduce_gradients(model.parameters(), self.group)
        value = loss.detach().reshape(1).to(self.comm_device, copy=True)
        all_reduce_sum(value, self.group)
        return float(value), nbytes

    def gather(self, out: Tensor) -> Tensor:
        """``[N, ...]`` on every rank from each rank's owned rows (collective)."""
        if self._all_owned is None:
            order = torch.argsort(self.part, stable=True)
            sizes = torch.bincount(self.part, minlength=self.world_size).tolist()
            self._all_owned = list(torch.split(order, sizes))
        sizes = [o.numel() for o in self._all_owned]
        # all_gather needs equal shapes (gloo): pad to the largest part.
        pad = out.new_zeros((max(sizes), *out.shape[1:]), device=self.comm_device)
        pad[: out.size(0)] = out
        bufs = [torch.empty_like(pad) for _ in sizes]
        dist.all_gather(bufs, pad, group=self.group)
        full = out.new_empty((self.num_nodes, *out.shape[1:]))
        for idx, buf in zip(self._all_owned, bufs):
            full[idx.to(full.device)] = buf[: idx.numel()].to(full.device)
        return full

    @torch.no_grad()
    def predict(self, model: torch.nn.Module) -> Tensor:
        """The model's output for every node, on every rank (collective)."""
        return self.gather(self.forward(model))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(rank={self.rank}/{self.world_size}, "
                f"owned={self.plan.num_owned}, halo={self.plan.num_halo})")
