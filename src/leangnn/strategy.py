"""The strategy interface: how one model is trained and served on one graph.

The :class:`~leangnn.train.Trainer` owns the loop (epochs, optimizer step,
gradient clipping, early stopping, checkpoints, metrics); a strategy owns what
happens to one graph inside it. ``full`` is plain full-batch autograd; the
memory strategies (``reversible`` through its model, ``prune``, ``offload``)
subclass :class:`Strategy` and override the hooks they need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

__all__ = ["Strategy", "FullBatch", "LossFn", "node_mask"]

#: ``loss_fn(out, data) -> scalar``: the trainer's task loss on ``data``'s nodes.
LossFn = Callable[[Tensor, Data], Tensor]


def node_mask(data: Data) -> Tensor | None:
    """The nodes of ``data`` that a loss or metric covers (``None``: all)."""
    return data.get("node_mask", None)


class Strategy:
    """Base class: full-batch training with plain autograd.

    Hooks, in the order the trainer calls them:

    * :meth:`setup` once, with the training graphs, before the first epoch
      (and again when a run resumes);
    * :meth:`train_step` once per training graph and epoch: forward, loss,
      ``backward()``; the trainer clips and steps afterwards;
    * :meth:`fit_end` once after the last epoch (e.g. DPR trains its decoder);
    * :meth:`predict` for evaluation, on every node of the graph;
    * :meth:`summary` for the strategy's own figures in ``summary.json``.
    """

    name = "full"

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def setup(self, model: torch.nn.Module, train_graphs: list[Data]) -> None:
        """Prepare per-graph state (partitions, cores, ...); default: nothing."""

    def forward(self, model: torch.nn.Module, data: Data) -> Tensor:
        """Plain forward pass of ``model`` on ``data`` (on ``self.device``)."""
        data = data.to(self.device)
        kwargs = {}
        if data.get("edge_weight", None) is not None:
            kwargs["edge_weight"] = data.edge_weight
        return model(data.x, data.edge_index, **kwargs)

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn: LossFn) -> float:
        """Forward, loss and backward on one graph; returns the loss value."""
        out = self.forward(model, data)
        loss = loss_fn(out, data.to(self.device))
        loss.backward()
        return float(loss.detach())

    def fit_end(self, model: torch.nn.Module, train_graphs: list[Data],
                loss_fn: LossFn) -> None:
        """Called once after training; default: nothing."""

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, data: Data) -> Tensor:
        """Predictions for every node of ``data``."""
        return self.forward(model, data)

    def state_dict(self) -> dict[str, Any]:
        """Strategy state that a checkpoint must carry (default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def summary(self) -> dict[str, Any]:
        """Strategy-specific figures merged into ``summary.json``."""
        return {}

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(device={self.device})"


class FullBatch(Strategy):
    """Full-batch training with plain autograd (the ``full`` strategy)."""

    name = "full"
