"""The ``distributed`` strategy: the Trainer on P ranks of torch.distributed.

Launched by ``torchrun --nproc-per-node P -m leangnn train --strategy
distributed ...`` or ``leangnn train --nproc P ...``; every rank runs the same
:class:`~leangnn.train.Trainer` loop with the same seed, and this strategy
makes each optimizer step see the gradient a single process would:

* ``graph`` mode (one big graph, or the Trainer's one-graph steps):
  :class:`~leangnn.distributed.graph_parallel.GraphParallel` on every graph,
  METIS parts per rank, halo exchange per layer. Same trajectory as the
  ``full`` strategy, up to float rounding. With ``device_budget`` every rank
  runs its part through the layer-wise offload engine under that budget
  (:class:`~leangnn.distributed.rank_offload.RankOffload`): a graph larger
  than the sum of the devices still trains, with the same gradients.
* ``data`` mode (many circuits): when the Trainer asks for
  :meth:`DistributedStrategy.epoch_batches` and calls
  :meth:`DistributedStrategy.train_batch`, each step covers ``batch_size``
  graphs (default: one per rank) split over the ranks, equal to one process
  stepping on the mean loss of the same batch.

``auto`` picks ``graph`` for a single training graph, else ``data``. Only
rank 0 should write the run directory (:attr:`DistributedStrategy.is_main`);
every rank must run the hooks, ``predict`` and ``fit_end``, which are
collectives.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from leangnn.distributed.counters import EpochMeter
from leangnn.distributed.data_parallel import DataParallel
from leangnn.distributed.graph_parallel import GraphParallel, part_key
from leangnn.distributed.rank_offload import RankOffload
from leangnn.distributed.runtime import (
    DEFAULT_TIMEOUT,
    DistContext,
    broadcast_parameters,
    current_context,
    init_distributed,
)
from leangnn.strategy import LossFn, Strategy

__all__ = ["DistributedStrategy", "MODES"]

MODES = ("auto", "graph", "data")


class DistributedStrategy(Strategy):
    """Exact multi-process training on torch.distributed (gloo CPU / NCCL GPU).

    Args:
        device (torch.device or str, optional): ``"cpu"`` or ``"cuda"``
            (each rank then uses ``cuda:LOCAL_RANK``). (default: ``"cpu"``)
        mode (str, optional): ``"auto"``, ``"graph"`` or ``"data"``.
            (default: ``"auto"``)
        backend (str, optional): ``"gloo"`` or ``"nccl"``. (default: NCCL on
            CUDA, gloo otherwise)
        timeout (float, optional): seconds a collective waits for a dead or
            stuck peer before failing. (default: ``300``)
        partition_method (str, optional): ``partition_graph`` method.
            (default: ``"auto"``)
        seed (int, optional): METIS seed. (default: ``0``)
        batch_size (int, optional): graphs per step in data mode. (default:
            the number of ranks)
        group (ProcessGroup, optional): run on this group of an initialised
            job instead of joining the default group from the environment.
        device_budget (int or str, optional): each rank's device bytes for
            the layer-wise offload engine (graph mode with PyG ``BasicGNN``
            models: GCN, GraphSAGE, GAT, GIN); ``None`` runs plain autograd.
            (default: ``None``)
    """

    name = "distributed"

    def __init__(self, device: torch.device | str = "cpu", mode: str = "auto",
                 backend: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 partition_method: str = "auto", seed: int = 0,
                 batch_size: int | None = None, group=None,
                 device_budget: int | str | None = None):
        super().__init__(device)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if batch_size is not None and (not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.mode, self.backend, self.timeout = mode, backend, float(timeout)
        self.partition_method, self.seed = partition_method, seed
        self.batch_size, self.group = batch_size, group
        # Validated now (a bad size fails before any process group forms).
        self.offload = None if device_budget is None else RankOffload(device_budget)
        self.ctx: DistContext | None = None
        self.dp: DataParallel | None = None
        self.meter: EpochMeter | None = None
        self._runners: dict[tuple, tuple[Data, GraphParallel]] = {}
        self._explicit_epochs = False
        self._steps = 0
        self._steps_per_epoch = 0
        self._all_records: list[list[dict]] | None = None
        self._all_offload: list[dict] | None = None
        self._gp_allreduce = 0
        self._num_train = 0

    @classmethod
    def from_config(cls, cfg) -> DistributedStrategy:
        """Build from a :class:`~leangnn.config.TrainConfig` (``device``,
        ``seed`` and, when present, ``dist_mode``, ``dist_backend``,
        ``dist_timeout``, ``dist_batch_size``, ``device_budget``)."""
        return cls(device=cfg.device, mode=getattr(cfg, "dist_mode", None) or "auto",
                   backend=getattr(cfg, "dist_backend", None),
                   timeout=getattr(cfg, "dist_timeout", None) or DEFAULT_TIMEOUT,
                   seed=cfg.seed, batch_size=getattr(cfg, "dist_batch_size", None),
                   device_budget=getattr(cfg, "device_budget", None))

    # ------------------------------------------------------------------ #
    @property
    def is_main(self) -> bool:
        """Whether this rank writes the run directory (rank 0)."""
        if self.ctx is not None:
            return self.ctx.rank == 0
        return int(os.environ.get("RANK", "0")) == 0

    @property
    def world_size(self) -> int:
        return self.ctx.world_size if self.ctx else int(os.environ.get("WORLD_SIZE",
                                                                       "1"))

    def setup(self, model: torch.nn.Module, train_graphs: list[Data]) -> None:
        if self.group is not None:
            self.ctx = current_context(self.device, self.group)
        else:
            self.ctx = init_distributed(self.device, self.backend, self.timeout)
        self.device = self.ctx.device
        # The Trainer built the model on cfg.device; a CUDA rank owns its own GPU.
        model.to(self.device)
        broadcast_parameters(model, self.group)
        if self.mode == "auto":
            self.mode = "graph" if len(train_graphs) == 1 else "data"
        if self.offload is not None and self.mode == "data":
            raise ValueError(
                f"device_budget={self.offload.device_budget} bytes: the per-rank "
                "offload engine runs graph parallel; use --dist-mode graph (data "
                f"mode got {len(train_graphs)} training graphs)")
        self.dp = DataParallel(self.group, self.device)
        if self.meter is None:
            self.meter = EpochMeter(self.ctx.rank, self.ctx.world_size, self.device)
        self._num_train = len(train_graphs)

    def _require_setup(self) -> None:
        if self.ctx is None:
            raise RuntimeError("DistributedStrategy: call setup() first")

    def runner(self, data: Data) -> GraphParallel:
        """The graph-parallel runner of ``data``'s graph (built on first use)."""
        self._require_setup()
        key = part_key(data)
        hit = self._runners.get(key)
        if hit is None:
            hit = (data, GraphParallel(data, self.group, self.device,
                                       method=self.partition_method, seed=self.seed,
                                       executor=self.offload))
            self._runners[key] = hit  # data kept alive: its pointers stay unique
        return hit[1]

    # ------------------------------------------------------------------ #
    def _stats(self):
        return [r.stats for _, r in self._runners.values()]

    def _allreduce_bytes(self) -> int:
        return (self.dp.allreduce_bytes if self.dp else 0) + self._gp_allreduce

    def epoch_start(self, epoch: int) -> None:
        """Trainer hook: an epoch's training steps begin (``epoch`` 0-based)."""
        self._require_setup()
        self._explicit_epochs = True
        self.meter.start(epoch + 1, self._stats(), self._allreduce_bytes())

    def epoch_end(self, epoch: int) -> None:
        """Trainer hook: the epoch's training steps (and optimizer steps) ended."""
        if self.meter is not None and self.meter.is_open:
            self.meter.stop(self._stats(), self._allreduce_bytes())

    def _auto_epoch(self, steps_per_epoch: int, before: bool) -> None:
        # Without the Trainer's epoch hooks, an epoch is a full pass of steps.
        if self._explicit_epochs:
            return
        if before and not self.meter.is_open:
            self._steps, self._steps_per_epoch = 0, steps_per_epoch
            self.meter.start(len(self.meter.records) + 1, self._stats(),
                             self._allreduce_bytes())
        elif not before:
            self._steps += 1
            if self._steps >= self._steps_per_epoch:
                self.meter.stop(self._stats(), self._allreduce_bytes())

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn: LossFn) -> float:
        """One graph, graph-parallel over all ranks (the Trainer's default loop)."""
        self._require_setup()
        self._auto_epoch(self._num_train, before=True)
        loss, nbytes = self.runner(data).train_step(model, data, loss_fn)
        self._gp_allreduce += nbytes
        self._auto_epoch(self._num_train, before=False)
        return loss

    def epoch_batches(self, order: list[int]) -> list[list[int]]:
        """Trainer hook: graph indices of each optimizer step of the epoch."""
        self._require_setup()
        if self.mode == "data":
            return self.dp.batches(order, self.batch_size)
        return [[i] for i in order]

    def train_batch(self, model: torch.nn.Module, graphs: list[Data],
                    loss_fn: LossFn) -> float:
        """Trainer hook: one optimizer step's forward/backward over ``graphs``
        (the whole batch, as listed by :meth:`epoch_batches`)."""
        self._require_setup()
        steps = -(-self._num_train // max(len(graphs), 1))
        if self.mode != "data":
            if len(graphs) != 1:
                raise ValueError(f"graph mode steps on one graph, got {len(graphs)}")
            return self.train_step(model, graphs[0], loss_fn)
        self._auto_epoch(steps, before=True)
        loss = self.dp.train_step(model, graphs[self.ctx.rank:: self.ctx.world_size],
                                  loss_fn, len(graphs))
        self._auto_epoch(steps, before=False)
        return loss

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, data: Data) -> Tensor:
        """Every node's prediction, identical on all ranks."""
        self._require_setup()
        if self.mode == "data":
            return self.forward(model, data)  # small graphs: each rank runs all
        return self.runner(data).predict(model)

    def fit_end(self, model: torch.nn.Module, train_graphs: list[Data],
                loss_fn: LossFn) -> None:
        """Gather every rank's epoch records (collective)."""
        self._require_setup()
        self.epoch_end(-1)
        mine = ([r.to_dict() for r in self.meter.records],
                None if self.offload is None else self.offload.summary())
        out: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(out, mine, group=self.group)
        self._all_records = [o[0] for o in out]
        self._all_offload = [o[1] for o in out]

    def summary(self) -> dict[str, Any]:
        """Figures for ``summary.json``: per-rank epoch records and the parts."""
        if self.ctx is None:
            return {"distributed": {}}
        ranks = self._all_records or [[r.to_dict() for r in self.meter.records]]
        parts = {}
        for data, r in self._runners.values():
            name = str(data.get("name", None) or f"graph{len(parts)}")
            parts[name] = {"owned": r.plan.num_owned, "halo": r.plan.num_halo,
                           "local_edges": int(r.plan.edge_ids.numel())}
        out = {"mode": self.mode, "world_size": self.ctx.world_size,
               "backend": self.ctx.backend, "device": str(self.device),
               "records_per_rank": ranks, f"rank{self.ctx.rank}_parts": parts}
        if self.offload is not None:
            # per rank: its budget, chunks and the engine's counters
            out["offload_per_rank"] = (self._all_offload
                                       or [self.offload.summary()])
        return {"distributed": out}

    def close(self) -> None:
        """Leave the process group (when this strategy created it)."""
        if self.group is None and dist.is_initialized():
            dist.destroy_process_group()
        self.ctx = None

    def __repr__(self) -> str:
        where = f"{self.ctx.rank}/{self.ctx.world_size}" if self.ctx else "unset"
        return f"{self.__class__.__name__}(mode={self.mode}, rank={where})"
