"""Graph parallel composed with offload: each rank under its own device budget.

Graph parallelism (CAGNET, Tripathy et al., SC 2020) splits one graph over
ranks; the layer-wise offload engine (NeutronJittor, Fundamental Research
2026) trains a graph larger than one device by running every layer chunk by
chunk. :class:`RankOffload` composes the two, so a graph larger than the sum
of the devices still trains exactly: on each rank, layer ``l``

1. takes its input on the owned rows (host), fills the halo rows from their
   owners (:meth:`~leangnn.distributed.graph_parallel.GraphParallel.exchange`,
   differentiable: the backward pass returns the halo gradients), then
2. computes the owned rows chunk by chunk on the device
   (:class:`~leangnn.offload.layerwise.LayerwiseModel`, exact per chunk),
   each chunk's job sized by the offload engine's budget
   (:class:`~leangnn.offload.budget.DeviceBudget`,
   :class:`~leangnn.offload.workspace.WorkspaceModel`,
   :class:`~leangnn.offload.schedule.ChunkBuilder`), and keeps only the
   layer's output on the host (pinned on CUDA);
3. in the backward pass recomputes each chunk from the stored input and
   backpropagates its rows' gradient (``offload.plane.compute_layer``):
   parameter gradients accumulate on the device, input gradients (halo rows
   included) on the host.

The device holds the parameters (with gradients and optimizer state) and one
job at a time; the host holds each layer's input on the rank's owned and
halo rows. Gradients equal PyG full-batch training (tested for GCN, SAGE and
GAT on 2, 3 and 4 ranks).
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from leangnn.blas_workspace import ensure_blas_workspace
from leangnn.graphs.sparse import DstCSR
from leangnn.offload.budget import DeviceBudget
from leangnn.offload.counters import OffloadCounters
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.plane import compute_layer, probe_code, rng_devices
from leangnn.offload.schedule import BudgetError, Chunk, ChunkBuilder
from leangnn.offload.workspace import WorkspaceModel
from leangnn.profile import LiveBytesMeter
from leangnn.utils import parse_bytes

__all__ = ["RankOffload", "RankPlan"]


@dataclass
class RankPlan:
    """One rank's chunks of one model: the budget split and the jobs.

    Attributes:
        lw (LayerwiseModel): the model, layer by layer.
        split (DeviceBudget): the rank's budget (resident + job workspace).
        chunks (list[Chunk]): jobs covering the owned rows (local ids: owned
            rows first, then the halo), the same in every layer.
        device (torch.device): where the jobs run.
        num_owned (int): the rank's owned rows (the chunks' targets).
    """

    lw: LayerwiseModel
    split: DeviceBudget
    chunks: list[Chunk]
    device: torch.device
    num_owned: int

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)


class RankOffload:
    """Executor of :class:`~leangnn.distributed.graph_parallel.GraphParallel`
    that runs a rank's part through the layer-wise offload engine.

    Args:
        device_budget (int or str): this rank's device bytes (``"2GiB"``):
            parameters with gradients and optimizer state, plus one job.
        resident_factor (int, optional): parameter copies charged on the
            device (weights, gradients, two Adam moments). (default: ``4``)
        strict (bool, optional): also measure every job's device bytes (CPU:
            live-bytes meter; CUDA: allocator peak) and assert them under the
            budget. Slow; for tests. (default: ``False``)

    Raises:
        BudgetError: (on first use) the budget does not hold the parameters
            or one node's job; the message names the bytes needed.

    Shapes:
        ``executor(model, runner)`` returns ``[n_own, out_channels]`` on the
        host.
    """

    #: GraphParallel keeps the part's features and plan on the host.
    host_resident = True

    def __init__(self, device_budget: int | str, resident_factor: int = 4,
                 strict: bool = False):
        self.device_budget = parse_bytes(device_budget, "device_budget")
        if isinstance(resident_factor, bool) or not isinstance(resident_factor, int) \
                or resident_factor < 1:
            raise ValueError(f"resident_factor must be an int >= 1, got "
                             f"{resident_factor!r}")
        self.resident_factor, self.strict = resident_factor, strict
        self.counters = OffloadCounters()
        self._plans: dict[tuple, tuple[object, torch.nn.Module, RankPlan]] = {}

    # ------------------------------------------------------------------ plan
    def plan(self, model: torch.nn.Module, runner) -> RankPlan:
        """The chunks of ``runner``'s part for ``model`` (built on first use;
        a collective for GCN, whose halo degrees come from their owners)."""
        key = (id(runner), id(model), next(model.parameters()).dtype)
        hit = self._plans.get(key)
        if hit is not None:
            return hit[2]
        lw = LayerwiseModel(model)
        if runner.edge_attr is not None:
            raise ValueError("graph parallel with device_budget: edge features "
                             "(edge_attr) are not supported by the layer-wise "
                             "offload engine")
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        plan = runner.plan
        conv = model.convs[0]
        if lw.is_gcn and conv.normalize:
            # Global degrees (halo ones from their owners), as gcn_norm on
            # the whole graph: a chunk's own degrees would be wrong.
            ei, w = runner._gcn_topology(conv, runner.edge_weight, dtype)
        else:
            ei, w = plan.edge_index, runner.edge_weight
            if w is not None and "edge_weight" not in inspect.signature(
                    conv.forward).parameters:
                raise ValueError(f"{type(conv).__name__} does not take edge_weight, "
                                 "but the graph has one")
        csr = DstCSR(ei.cpu(), plan.num_local, None if w is None else w.cpu())
        # cuBLAS' workspaces: made before the probes, held for the run
        blas = ensure_blas_workspace(device)
        ws = self._calibrate(model, lw, w is not None, device)
        error = None
        try:
            split = DeviceBudget(self.device_budget,
                                 self.resident_factor * lw.param_bytes(), 0.5,
                                 "none", ws, 0, fixed=blas)
            builder = ChunkBuilder(csr, split.fits, split.ratio)
            try:
                chunks = builder.split(torch.arange(plan.num_owned))
            except BudgetError as e:
                raise split.too_small(e) from None
        except BudgetError as e:
            error = e
        # A rank whose part does not fit must not leave its peers waiting in
        # the first halo exchange: every rank learns who failed.
        failed = torch.tensor([float(error is not None)], device=runner.comm_device)
        dist.all_reduce(failed, group=runner.group)
        if error is not None:
            raise BudgetError(f"rank {runner.rank}: {error}", error.node,
                              error.sizes)
        if float(failed) > 0:
            raise BudgetError(f"rank {runner.rank}: device_budget="
                              f"{self.device_budget} bytes too small on "
                              f"{int(failed)} other rank(s); see their errors")
        out = RankPlan(lw, split, chunks, device, plan.num_owned)
        self._plans[key] = (runner, model, out)  # kept alive: ids stay unique
        return out

    @staticmethod
    def _calibrate(model: torch.nn.Module, lw: LayerwiseModel, weighted: bool,
                   device: torch.device) -> WorkspaceModel:
        # Probe jobs run on a copy: their backward must not touch the
        # model's gradients or its random stream.
        shadow = LayerwiseModel(copy.deepcopy(model).train())

        def run(li, backward, x, ei, w, nt, g):
            return compute_layer(shadow, li, backward, x, ei, w, nt, g)

        with torch.random.fork_rng(devices=rng_devices(device)):
            return WorkspaceModel(run, lw.widths, next(model.parameters()).dtype,
                                  weighted, device,
                                  key=(*(repr(m) for m in model.modules()),
                                       probe_code()))

    # --------------------------------------------------------------- execute
    def __call__(self, model: torch.nn.Module, runner) -> Tensor:
        rp = self.plan(model, runner)
        rp.lw.check()
        seed = (int(torch.randint(0, 2**62, ()).item()) if rp.lw.needs_rng
                else 0)
        params = [p for p in model.parameters() if p.requires_grad]
        h = runner.x
        for li in range(rp.lw.num_layers):
            x_local = runner.local_input(h, li)
            h = _ChunkedLayer.apply(x_local, self, rp, li, seed, *params)
        return h

    # ------------------------------------------------------------------ jobs
    @contextmanager
    def _rng(self, rp: RankPlan, seed: int, key: tuple):
        # Forward and recompute draw the same dropout masks per chunk.
        if not rp.lw.needs_rng:
            yield
            return
        with torch.random.fork_rng(devices=rng_devices(rp.device)):
            torch.manual_seed(hash((seed, *key)) & 0x7FFF_FFFF_FFFF)
            yield

    @contextmanager
    def _measured(self, rp: RankPlan, exclude: list[Tensor]):
        if not self.strict:
            yield
            return
        if rp.device.type == "cuda":
            torch.cuda.synchronize(rp.device)
            torch.cuda.reset_peak_memory_stats(rp.device)
            yield
            torch.cuda.synchronize(rp.device)
            used = torch.cuda.max_memory_allocated(rp.device)
        else:
            params = list(rp.lw.model.parameters())
            grads = [p.grad for p in params if p.grad is not None]
            with LiveBytesMeter(exclude=params + grads + exclude) as meter:
                yield
            used = rp.split.resident + meter.peak
        c = self.counters
        c.peak_device_bytes_measured = max(c.peak_device_bytes_measured, used)
        if used > rp.split.total:
            raise AssertionError(f"rank offload: measured device bytes exceeded "
                                 f"the budget: {used} > {rp.split.total}")

    def _to_dev(self, rp: RankPlan, t: Tensor | None) -> Tensor | None:
        if t is None or t.device == rp.device:
            return t
        if rp.device.type == "cuda":
            t = t.pin_memory()
        return t.to(rp.device, non_blocking=True)

    def run_job(self, rp: RankPlan, li: int, c: int, seed: int, x_local: Tensor,
                grad_out: Tensor | None) -> Tensor | None:
        """One chunk of layer ``li``: forward (``grad_out is None``) returns
        the targets' rows on the device; backward recomputes, accumulates the
        parameter gradients and returns the sources' input gradient."""
        ch = rp.chunks[c]
        backward = grad_out is not None
        c_ = self.counters
        rp.split.charge(li, backward, ch.sizes, 0, c_)
        with self._measured(rp, [x_local] + ([grad_out] if backward else [])):
            x = self._to_dev(rp, x_local.index_select(0, ch.sources))
            g = (self._to_dev(rp, grad_out.index_select(0, ch.targets))
                 if backward else None)
            ei, w = self._to_dev(rp, ch.edge_index), self._to_dev(rp, ch.edge_weight)
            with self._rng(rp, seed, (li, c)):
                out = compute_layer(rp.lw, li, backward, x, ei, w, ch.num_targets, g)
            del x, g, ei, w
        row = x_local.element_size() * x_local.size(1)
        c_.h2d_bytes += ch.sources.numel() * row
        c_.h2d_meta_bytes += ch.edge_index.numel() * ch.edge_index.element_size()
        if backward:
            c_.h2d_bytes += grad_out.element_size() * grad_out.size(1) * \
                ch.num_targets
            c_.vertex_layer_recomputations += ch.num_targets
            if out is not None:
                c_.d2h_bytes += out.numel() * out.element_size()
        else:
            c_.vertex_layer_computations += ch.num_targets
            c_.d2h_bytes += out.numel() * out.element_size()
        return out

    def summary(self) -> dict:
        plans = [p for _, _, p in self._plans.values()]
        return {"device_budget": self.device_budget,
                "num_chunks": [p.num_chunks for p in plans],
                "workspace_bytes": max((p.split.workspace for p in plans), default=0),
                "resident_bytes": max((p.split.resident for p in plans), default=0),
                "counters": self.counters.to_dict()}

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(budget={self.device_budget}"
                f"{', strict' if self.strict else ''})")


class _ChunkedLayer(torch.autograd.Function):
    """Layer ``li`` on the owned rows from its input on owned + halo rows,
    chunk by chunk on the device; the backward pass recomputes each chunk.

    Only the input (host) is saved; the parameters are inputs so autograd
    calls the backward even for the first layer, whose input (the features)
    needs no gradient, but their gradients are accumulated in ``.grad`` by
    the jobs themselves (as the offload engine does)."""

    @staticmethod
    def forward(ctx, x_local: Tensor, ex: RankOffload, rp: RankPlan, li: int,
                seed: int, *params: Tensor) -> Tensor:
        ctx.ex, ctx.rp, ctx.li, ctx.seed = ex, rp, li, seed
        out = torch.empty((rp.num_owned, rp.lw.widths[li + 1]),
                          dtype=x_local.dtype, pin_memory=rp.device.type == "cuda")
        for c, ch in enumerate(rp.chunks):
            y = ex.run_job(rp, li, c, seed, x_local, None)
            out[ch.targets] = y.to("cpu")
            del y
        ctx.save_for_backward(x_local)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        (x_local,) = ctx.saved_tensors
        ex, rp, li = ctx.ex, ctx.rp, ctx.li
        for p in rp.lw.model.parameters():
            # Allocated before the first job: they are part of the resident
            # charge, not of a job's workspace.
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        # compute_layer gives no input gradient for the first layer (the
        # features); its parameters still get theirs.
        need_x = ctx.needs_input_grad[0] and li > 0
        gx = torch.zeros_like(x_local) if need_x else None
        grad_out = grad_out.contiguous()
        for c in range(len(rp.chunks) - 1, -1, -1):
            gs = ex.run_job(rp, li, c, ctx.seed, x_local, grad_out)
            if gx is not None and gs is not None:
                gx.index_add_(0, rp.chunks[c].sources, gs.to("cpu"))
            del gs
        n_params = len(ctx.needs_input_grad) - 5
        return (gx, None, None, None, None, *([None] * n_params))
