"""Per-rank estimates of the ``distributed`` strategy, without a process group.

The planner's row for ``--nproc P`` (:class:`~leangnn.distributed.strategy.
DistributedStrategy`): what each rank will need, before any process starts,
by the same dry run as every other row (:mod:`leangnn.plan.dryrun`):

* ``graph`` mode: the largest training graph is partitioned as the strategy
  partitions it (METIS, its seed; the on-disk partition cache then serves the
  run), and for every rank a :class:`PlannedRank`, the real
  :class:`~leangnn.distributed.graph_parallel.GraphParallel` of that part with
  the halo exchange and the gradient sum replaced by ops that allocate what
  theirs do (the rows received and sent, their gradients, the flat gradient
  buffer) and move nothing, runs the Trainer's step under the dry run. The
  rank's parts (features, local edges, exchange lists of every graph it
  trains or validates on) are built in the run's first steps and kept
  whole: their bytes count once, outside the heap factor. Each rank gets
  its own estimate; the largest is the row's.
* ``data`` mode: every rank runs whole graphs of each batch, one after the
  other, so any rank may get the largest graph: each rank needs the ``full``
  row's step plus the flat gradient buffer of the sum, and its epoch is the
  busiest rank's share of every batch.

Every rank loads every graph (the strategy partitions them itself), so each
needs the loaded graphs as a ``full`` run does. Halo and all-reduce traffic
take time the calibration has not measured: epoch times are the ranks'
compute alone (said in the row's note).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch_geometric.data import Data

from leangnn.distributed.data_parallel import epoch_batches
from leangnn.distributed.graph_parallel import GraphParallel, _part_vector, part_key
from leangnn.distributed.halo import HaloPlan
from leangnn.distributed.runtime import (
    flat_gradients,
    gradient_groups,
    unflatten_gradients,
)
from leangnn.plan.collectives import COMM_KEYS, CollectiveCost, scale_comm
from leangnn.plan.estimate import (
    WORK_KEYS,
    Estimate,
    _knobs,
    _resident_graph_bytes,
    _scale_work,
    _trace_config,
    _with_history,
    before_largest,
    default_loss,
    estimate_config,
    largest_graph,
)
from leangnn.plan.fake import tensor_bytes

__all__ = ["PlannedRank", "planned_all_reduce", "rank_partition",
           "estimate_distributed", "batch_share", "need_of", "PLANNED_MODES"]

#: the distributed modes the planner has rows for
PLANNED_MODES = ("graph", "data")


class _PlannedExchange(torch.autograd.Function):
    """The halo exchange's allocations without its communication: the rows
    sent and the rows received forward; the gradients received and the
    owned rows' gradient backward (:func:`~leangnn.distributed.halo.
    halo_exchange`)."""

    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan, log: dict | None) -> Tensor:
        ctx.plan, ctx.log = plan, log
        send = x.index_select(0, plan.send_index)
        out = send.new_empty((plan.num_halo, *x.shape[1:]))
        _count_exchange(log, plan, x)
        del send
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        plan = ctx.plan
        back = grad.new_empty((plan.send_index.numel(), *grad.shape[1:]))
        _count_exchange(ctx.log, plan, grad)
        gx = grad.new_zeros((plan.num_owned, *grad.shape[1:]))
        gx.index_add_(0, plan.send_index, back)
        return gx, None, None


def _count_exchange(log: dict | None, plan: HaloPlan, rows: Tensor) -> None:
    # one all-to-all; it lasts as long as the larger of what goes and comes
    if log is not None:
        row = rows[:1].numel() * rows.element_size()
        log["a2a_calls"] += 1
        log["a2a_bytes"] += max(plan.num_halo, int(plan.send_index.numel())) * row


def planned_all_reduce(params, log: dict | None = None) -> None:
    """The gradient sum's allocations (one flat buffer per dtype, the
    gradients copied back) without communication; every parameter is taken
    to have a gradient on some rank. ``log`` counts the all-reduces."""
    for ps in gradient_groups(params):
        flat = flat_gradients(ps)
        if log is not None:
            log["ar_calls"] += 1
            log["ar_bytes"] += flat.numel() * flat.element_size()
        unflatten_gradients(flat, ps, [1.0] * len(ps))
        del flat


class PlannedRank(GraphParallel):
    """One rank of :class:`~leangnn.distributed.graph_parallel.GraphParallel`
    for the planner: the same part, hooks and loss, no process group.

    Args:
        data (Data): the global graph.
        part (Tensor): ``[N]`` part (= rank) of every node.
        rank (int): this rank.
        world_size (int): the ranks ``P``.
        device (torch.device or str, optional): the rank's device; the part is
            built on the host and, for another device, copied there inside
            each traced step (as the run builds it in its first step).
            (default: ``"cpu"``)
    """

    def __init__(self, data: Data, part: Tensor, rank: int, world_size: int,
                 device: torch.device | str = "cpu"):
        self.group = None
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = torch.device("cpu")
        self._attach(data, _part_vector(part, int(data.num_nodes), world_size),
                     None, None)
        self._host = (self.x, self.plan, self.edge_weight, self.edge_attr)
        self.device = torch.device(device)
        #: a traced step's collectives (:data:`~leangnn.plan.collectives.
        #: COMM_KEYS`) per model traced, by its parameter count
        self.comm: dict[int, dict[str, int]] = {}
        self._log: dict[str, int] | None = None

    def exchange(self, h: Tensor, layer: int | None = None) -> Tensor:
        return _PlannedExchange.apply(h, self.plan, self._log)

    @contextmanager
    def _once(self, kept: bool = True):
        # what a run exchanges once and keeps (the input features' halo, GCN's
        # degrees): its memory counts in every traced step, its time does not
        log, self._log = self._log, (None if kept else self._log)
        try:
            yield
        finally:
            self._log = log

    def local_input(self, h: Tensor, layer: int | None = None) -> Tensor:
        with self._once(h is self.x and not h.requires_grad):
            return super().local_input(h, layer)

    def _gcn_topology(self, *args, **kwargs):
        with self._once():
            return super()._gcn_topology(*args, **kwargs)

    def traced_comm(self, num_layers: int, extrapolated: bool) -> dict[str, float]:
        """One step's collectives at ``num_layers``: as traced, or, for a
        deep model traced at depths 2 and 4, extrapolated as its work is."""
        keys = sorted(self.comm)
        if not keys:
            return {}
        if not extrapolated or len(keys) < 2:
            return dict(self.comm[keys[-1]])
        lo, hi = self.comm[keys[0]], self.comm[keys[1]]
        return {k: max(0.0, lo[k] + (hi[k] - lo[k]) * (num_layers - 2) / 2)
                for k in lo}

    def part_tensors(self) -> list[Tensor]:
        """The part's tensors a rank keeps (features, local edges, lists)."""
        x, plan, ew, ea = self._host
        out = [x, plan.owned, plan.halo, plan.send_index, plan.edge_index,
               plan.edge_ids, self._owned_cpu, self.part, ew, ea]
        # on the host the plan's owned ids are the very tensor kept for the
        # loss: each storage once
        seen: dict[int, Tensor] = {}
        for t in out:
            if t is not None:
                seen.setdefault(t.untyped_storage().data_ptr(), t)
        return list(seen.values())

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn) -> Tensor:
        """The rank's first training step: a fresh part on the device (the
        input halo and GCN's weights cached in it), forward, its share of the
        loss, backward and the gradient sum."""
        x, plan, ew, ea = self._host
        if self.device.type != "cpu":
            x, plan = x.to(self.device), plan.to(self.device)
            ew = None if ew is None else ew.to(self.device)
            ea = None if ea is None else ea.to(self.device)
        self.x, self.plan, self.edge_weight, self.edge_attr = x, plan, ew, ea
        self._gcn, self._static_halo = {}, None
        self._log = dict.fromkeys(COMM_KEYS, 0)
        loss = self.local_backward(model, data, loss_fn)
        planned_all_reduce(model.parameters(), self._log)
        self._log["ar_calls"] += 1  # the loss
        self._log["ar_bytes"] += loss.element_size()
        # kept when the step completes (a failed meta trace runs it again)
        self.comm[sum(p.numel() for p in model.parameters())] = self._log
        self._log = None
        return loss


def rank_partition(data: Data, nproc: int, seed: int = 0,
                   method: str = "auto") -> Tensor:
    """``[N]`` part per node, as :class:`~leangnn.distributed.graph_parallel.
    GraphParallel` partitions ``data`` over ``nproc`` ranks."""
    from leangnn.graphs.partition import partition_graph

    n = int(data.num_nodes)
    if n < nproc:
        raise ValueError(f"graph parallel: {n} nodes cannot be split over "
                         f"{nproc} ranks")
    return partition_graph(data.edge_index.cpu(), n, nproc, method=method,
                           seed=seed).part


def batch_share(sizes: list[int], nproc: int, batch_size: int | None = None,
                seed: int = 0) -> float:
    """The busiest rank's share of an epoch's work in data mode: the graphs
    (of work ~ ``sizes``) in the Trainer's seeded order, cut into batches of
    ``batch_size`` (default ``nproc``) dealt round robin; each step waits for
    its busiest rank."""

    total = sum(sizes)
    if not total:
        return 1.0
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(
        seed * 100003)).tolist()
    busiest = sum(max(sum(sizes[i] for i in batch[r::nproc]) for r in range(nproc))
                  for batch in epoch_batches(order, batch_size or nproc))
    return busiest / total


def _parts_bytes(graphs: list[Data], big: Data, nproc: int, rank: int,
                 seed: int) -> int:
    """Bytes of ``rank``'s parts of ``graphs`` but ``big``'s: the strategy
    keeps every graph's part it trains or validates on for the whole run."""
    seen, total = {part_key(big)}, 0
    for g in graphs:
        if part_key(g) in seen:
            continue
        seen.add(part_key(g))
        runner = PlannedRank(g, rank_partition(g, nproc, seed), rank, nproc)
        total += sum(tensor_bytes(t) for t in runner.part_tensors())
    return total


def _graph_rank(cfg, splits, big: Data, runner: PlannedRank, loss_fn: Callable,
                device: torch.device, calibration) -> Estimate:
    runner.comm.clear()
    c, extrapolated = _trace_config(cfg, big, splits.in_channels,
                                    splits.out_channels, loss_fn, device,
                                    step=runner.train_step)
    c["work"].update(runner.traced_comm(cfg.num_layers, extrapolated))
    part_b = 0
    if device.type == "cpu":  # (on a device the step copies its part there)
        part_b = sum(tensor_bytes(t) for t in runner.part_tensors())
        part_b += _parts_bytes([*splits.train, *splits.val], big, runner.world_size,
                               runner.rank, cfg.seed)

    def with_part(fig: tuple[int, int, int]) -> tuple[int, int, int]:
        # the parts are built once and kept, whole: their pages count once,
        # wherever the allocator put them (no heap factor)
        return fig[0] + part_b, fig[1] + part_b, fig[2]

    before = before_largest(cfg, splits.train, big)
    traced: dict[int, int] = {}
    first = with_part(_with_history(c, cfg, splits, before, bool(before), loss_fn,
                                    device, traced, big=big))
    knobs = {**_knobs(cfg), "nproc": runner.world_size, "dist_mode": "graph"}
    est = Estimate("distributed", knobs, str(device), first[0], c["model_bytes"],
                   _resident_graph_bytes(big, device),
                   method="fake+extrapolated" if extrapolated else "fake",
                   work=_scale_work(c["work"], big, splits.train),
                   phases=c["phases"], big_bytes=first[1], heap_bytes=first[2])
    if cfg.epochs > 1:
        others = [g for g in splits.train if g is not big]
        est.later = with_part(_with_history(c, cfg, splits, others, True, loss_fn,
                                            device, traced, best_state=True,
                                            big=big))
    if calibration is not None:
        calibration.apply(est)
    return est


def estimate_distributed(cfg, splits, nproc: int, mode: str = "graph",
                         device: torch.device | str | None = None,
                         calibration=None, loss_fn: Callable | None = None
                         ) -> Estimate:
    """Estimate ``cfg`` trained by ``--strategy distributed`` on ``nproc``
    ranks in ``mode`` (``graph`` or ``data``).

    Returns:
        Estimate: the rank that needs the most (its ``ranks`` lists every
        rank: part sizes, run bytes, need, epoch seconds).
    """
    import time

    t0 = time.perf_counter()
    if mode not in PLANNED_MODES:
        raise ValueError(f"mode must be one of {PLANNED_MODES}, got {mode!r}")
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"nproc: expected at least 2 ranks, got {nproc!r}")
    dev = torch.device(device or cfg.device)
    big = largest_graph(splits.train)
    loss_fn = loss_fn or default_loss(big)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    cost = None if calibration is None else calibration.collective_cost(backend,
                                                                        nproc)
    if mode == "data":
        est = _data_mode(cfg, splits, nproc, dev, calibration, loss_fn, cost)
    else:
        part = rank_partition(big, nproc, cfg.seed)
        ranks = []
        for rank in range(nproc):
            runner = PlannedRank(big, part, rank, nproc, dev)
            r = _graph_rank(cfg, splits, big, runner, loss_fn, dev, calibration)
            if cost is not None:
                r.epoch_seconds = cost.epoch_seconds(r.epoch_seconds, r.work)
            r.ranks = [{"rank": rank, "owned": runner.plan.num_owned,
                        "halo": runner.plan.num_halo,
                        "local_edges": int(runner.plan.edge_ids.numel()),
                        "run_bytes": r.costliest_run_bytes,
                        "peak_bytes": r.peak_bytes,
                        "epoch_seconds": r.epoch_seconds}]
            ranks.append(r)
        est = max(ranks, key=lambda r: r.peak_bytes)
        est.ranks = [r.ranks[0] for r in ranks]
        times = [r.epoch_seconds for r in ranks if r.epoch_seconds is not None]
        est.epoch_seconds = max(times) if times else None
    est.note = "; ".join(x for x in (_time_note(cost, backend, nproc, mode),
                                     est.note) if x)
    est.estimate_seconds = time.perf_counter() - t0
    return est


def _time_note(cost: CollectiveCost | None, backend: str, nproc: int,
               mode: str) -> str:
    if cost is None:
        comm = "halo exchange and gradient sum" if mode == "graph" else "gradient sum"
        return (f"epoch: ranks' compute, {comm} not timed (python -m "
                f"leangnn.plan.calibrate --collectives {nproc})")
    at = "" if cost.nproc == nproc else f", measured with {cost.nproc} ranks"
    return (f"epoch: compute x{cost.corun:.2f} ({backend} ranks at once{at}) "
            "+ collectives")


def _data_mode(cfg, splits, nproc: int, device: torch.device, calibration,
               loss_fn: Callable, cost: CollectiveCost | None) -> Estimate:
    est = estimate_config(replace(cfg, strategy="full"), splits, device, None,
                          loss_fn)
    # the sum's flat buffer lives beside the gradients after the backward
    # (and, after the first epoch, beside Adam's moments and the best state)
    model = est.model_bytes
    est.step_bytes = max(est.step_bytes, 2 * model)  # gradients + flat buffer
    if est.later is not None:
        # + both moments and the best state
        step, big_b, heap_b = est.later
        est.later = (max(step, 5 * model), big_b, heap_b)
    share = batch_share([int(g.num_nodes) + int(g.num_edges) for g in splits.train],
                        nproc, getattr(cfg, "dist_batch_size", None), cfg.seed)
    est.work = {k: (v * share if k in WORK_KEYS else v)
                for k, v in est.work.items()}
    # every step sums the gradients (one buffer per dtype; the model's dtype
    # here) and the batch's loss, on every rank, busy or not
    steps = len(epoch_batches(list(range(len(splits.train))),
                              getattr(cfg, "dist_batch_size", None) or nproc))
    est.work.update(scale_comm({"ar_calls": 2, "ar_bytes": model + 8}, steps, steps))
    est.strategy = "distributed"
    est.knobs = {**est.knobs, "nproc": nproc, "dist_mode": "data"}
    if calibration is not None:
        calibration.apply(est)
    if cost is not None:
        est.epoch_seconds = cost.epoch_seconds(est.epoch_seconds, est.work)
    est.ranks = [{"rank": r, "run_bytes": est.costliest_run_bytes,
                  "peak_bytes": est.peak_bytes, "epoch_seconds": est.epoch_seconds}
                 for r in range(nproc)]
    return est


def need_of(est: Estimate, scales: tuple[float, ...],
            device: torch.device | str) -> int:
    """A distributed row's need: every rank's (its peak times ``scales``)
    summed on a CPU, where the local ranks share the host's memory, and the
    largest on CUDA (one device per rank)."""
    needs = [math.ceil(math.prod((r["peak_bytes"], *scales))) for r in est.ranks]
    return sum(needs) if torch.device(device).type == "cpu" else max(needs)
