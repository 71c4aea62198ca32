"""Data parallelism over graphs: many netlists, one optimizer step per batch.

The circuit case: a training set of many graphs that each fit one device.
Each optimizer step covers a batch of ``B`` graphs (by default one per rank);
rank ``r`` runs graphs ``batch[r::P]``, every graph's loss is divided by
``B`` and the gradients are summed with one all-reduce, so every rank holds
the gradient of the batch's mean loss, the same as one process that averages
the per-graph losses of the batch (PyTorch's ``DistributedDataParallel`` does
the same sum, but divides by the number of ranks, which is wrong for the last,
short batch of an epoch).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from leangnn.distributed.runtime import all_reduce_gradients, all_reduce_sum
from leangnn.strategy import LossFn, call_model

__all__ = ["DataParallel", "epoch_batches", "batch_mean_loss"]


def epoch_batches(order: list[int], batch_size: int) -> list[list[int]]:
    """Consecutive batches of ``order`` (graph indices) of ``batch_size``."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return [list(order[i: i + batch_size]) for i in range(0, len(order), batch_size)]


def _forward(model: torch.nn.Module, data: Data, device: torch.device) -> Tensor:
    return call_model(model, data.to(device))


def batch_mean_loss(model: torch.nn.Module, graphs: list[Data], loss_fn: LossFn,
                    device: torch.device | str = "cpu") -> Tensor:
    """The single-process reference: mean of the per-graph losses of a batch."""
    device = torch.device(device)
    losses = [loss_fn(_forward(model, g, device), g.to(device)) for g in graphs]
    return torch.stack(losses).mean()


class DataParallel:
    """Synchronous data parallelism over whole graphs.

    Args:
        group (ProcessGroup, optional): the ranks. (default: all)
        device (torch.device or str, optional): this rank's device.
            (default: ``"cpu"``)

    Attributes:
        allreduce_bytes (int): gradient payload bytes reduced so far.
    """

    def __init__(self, group=None, device: torch.device | str = "cpu"):
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.device = torch.device(device)
        self.allreduce_bytes = 0

    def batches(self, order: list[int], batch_size: int | None = None
                ) -> list[list[int]]:
        """The epoch's batches (``batch_size`` defaults to the number of ranks)."""
        return epoch_batches(order, batch_size or self.world_size)

    def share(self, batch: list[int]) -> list[int]:
        """The graphs of ``batch`` that this rank runs (round robin)."""
        return list(batch[self.rank:: self.world_size])

    def train_step(self, model: torch.nn.Module, graphs: list[Data], loss_fn: LossFn,
                   batch_size: int) -> float:
        """Forward/backward this rank's ``graphs``, then sum gradients (collective).

        Args:
            model (Module): the model (same parameters on every rank).
            graphs (list[Data]): this rank's graphs of the batch (may be empty).
            loss_fn (LossFn): per-graph loss.
            batch_size (int): graphs in the whole batch, over all ranks.

        Returns:
            The batch's mean loss (identical on every rank).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for g in graphs:
            loss = loss_fn(_forward(model, g, self.device), g.to(self.device))
            (loss / batch_size).backward()
            total += loss.detach().to(torch.float64)
        self.allreduce_bytes += all_reduce_gradients(model.parameters(), self.group)
        all_reduce_sum(total, self.group)
        return float(total) / batch_size

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(rank={self.rank}/{self.world_size})"
