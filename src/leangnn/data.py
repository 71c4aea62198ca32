"""Resolve a :class:`~leangnn.config.TrainConfig` into train/val/test graphs.

Circuits are split by circuit (a test circuit is never seen in training).
``csbm:N`` builds one synthetic contextual SBM (see
:mod:`leangnn.graphs.synthetic`) and splits its nodes with masks; each split is
then the same graph carrying a ``node_mask``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch_geometric.data import Data

from .circuits import DEFAULT_SPLIT, TASKS, load_suite

__all__ = ["GraphSplits", "load_graphs", "with_mask"]


@dataclass
class GraphSplits:
    """Graphs of each split, plus what the model must output."""

    train: list[Data]
    val: list[Data]
    test: list[Data]
    task_type: str
    out_channels: int

    @property
    def in_channels(self) -> int:
        return int(self.train[0].num_features)


def with_mask(data: Data, mask: torch.Tensor) -> Data:
    """A shallow copy of ``data`` whose losses and metrics cover ``mask`` only."""
    out = copy.copy(data)
    out.node_mask = mask
    return out


def _synthetic(spec: str, seed: int) -> GraphSplits:
    from .graphs.synthetic import contextual_sbm

    try:
        n = int(float(spec.split(":", 1)[1]))
    except (IndexError, ValueError) as e:
        raise ValueError(f"dataset: expected csbm:NUM_NODES, got {spec!r}") from e
    g = contextual_sbm(n, seed=seed)
    c = int(g.y.max()) + 1
    return GraphSplits([with_mask(g, g.train_mask)], [with_mask(g, g.val_mask)],
                       [with_mask(g, g.test_mask)], "classification", c)


def load_graphs(cfg, progress: bool = True) -> GraphSplits:
    """Load the graphs ``cfg`` names (see :class:`~leangnn.config.TrainConfig`)."""
    if cfg.dataset and cfg.dataset.startswith("csbm:"):
        return _synthetic(cfg.dataset, cfg.seed)
    train_names = cfg.dataset or DEFAULT_SPLIT["train"]
    test_names = cfg.test_dataset or DEFAULT_SPLIT["test"]
    kw = {"level_feature": cfg.level_feature, "progress": progress}
    train = load_suite(train_names, cfg.task, **kw)
    if cfg.val_dataset:
        val = load_suite(cfg.val_dataset, cfg.task, **kw)
    elif cfg.dataset is None:
        val = load_suite(DEFAULT_SPLIT["val"], cfg.task, **kw)
    elif len(train) >= 3:
        # Hold out every fifth training circuit (at least one) for validation,
        # chosen by a seeded permutation so a run is reproducible.
        perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(
            cfg.seed)).tolist()
        k = max(1, len(train) // 5)
        val = [train[i] for i in perm[:k]]
        train = [train[i] for i in sorted(perm[k:])]
    else:
        val = list(train)
    test = load_suite(test_names, cfg.task, **kw)
    overlap = {g.name for g in train} & {g.name for g in test}
    if overlap:
        raise ValueError(f"test_dataset: circuits {sorted(overlap)} are also in the "
                         "training set; a split by circuit needs them disjoint")
    task_type = TASKS[cfg.task]
    return GraphSplits(train, val, test, task_type,
                       4 if task_type == "classification" else 1)
