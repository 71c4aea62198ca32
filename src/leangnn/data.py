"""Resolve a :class:`~leangnn.config.TrainConfig` into train/val/test graphs.

Circuits are split by circuit (a test circuit is never seen in training).
``csbm:N`` builds one synthetic contextual SBM (see
:mod:`leangnn.graphs.synthetic`) and splits its nodes with masks; each split is
then the same graph carrying a ``node_mask``. :func:`check_datasets` resolves
every name (and checks the split) before anything is loaded, so a typo fails
at once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch_geometric.data import Data

from .circuits import (
    DEFAULT_SPLIT,
    TASKS,
    CircuitInfo,
    NetlistError,
    circuit_overlap,
    load_suite,
    resolve,
)
from .graphs.synthetic import CSBM_MAX_NODES, CSBM_MIN_NODES, csbm_nodes

__all__ = ["GraphSplits", "load_graphs", "with_mask", "csbm_nodes",
           "check_datasets", "CSBM_MIN_NODES", "CSBM_MAX_NODES"]

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
    from .plan.fits import check_graph_fits

    n = csbm_nodes(spec)
    check_graph_fits(n)  # before generating it
    g = contextual_sbm(n, seed=seed)
    c = int(g.y.max()) + 1
    return GraphSplits([with_mask(g, g.train_mask)], [with_mask(g, g.val_mask)],
                       [with_mask(g, g.test_mask)], "classification", c)


def check_datasets(cfg) -> dict[str, list[CircuitInfo]] | None:
    """Resolve the circuits ``cfg`` names, without loading them.

    Returns ``{"train", "val", "test"}`` -> circuits (``val`` is empty when it
    is held out of ``train`` at load time), or ``None`` for ``csbm:N``.

    Raises:
        ValueError: (``NetlistError`` for files) naming the option and the
            unknown name, missing file, empty selection or a test circuit
            that is also a training circuit.
    """
    if cfg.dataset and cfg.dataset.startswith("csbm:"):
        csbm_nodes(cfg.dataset)
        return None
    out = {}
    for key, option, default in (
            ("train", "dataset", DEFAULT_SPLIT["train"]),
            ("val", "val_dataset",
             DEFAULT_SPLIT["val"] if cfg.dataset is None else None),
            ("test", "test_dataset", DEFAULT_SPLIT["test"])):
        names = getattr(cfg, option) or default
        try:
            infos = resolve(names) if names else []
        except NetlistError:
            raise  # names its file already
        except ValueError as e:
            raise ValueError(f"{option}: {e}") from None
        if names and not infos:
            raise ValueError(f"{option}: {names!r} names no circuit")
        out[key] = infos
    overlap = circuit_overlap(out["train"], out["test"])
    if overlap:
        raise ValueError(f"test_dataset: circuits {sorted(overlap)} are also in the "
                         "training set; a split by circuit needs them disjoint")
    return out


def load_graphs(cfg, progress: bool = True) -> GraphSplits:
    """Load the graphs ``cfg`` names (see :class:`~leangnn.config.TrainConfig`)."""
    infos = check_datasets(cfg)
    if infos is None:
        return _synthetic(cfg.dataset, cfg.seed)
    kw = {"level_feature": cfg.level_feature, "progress": progress}
    train = load_suite(infos["train"], cfg.task, **kw)
    if infos["val"]:
        val = load_suite(infos["val"], cfg.task, **kw)
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
    test = load_suite(infos["test"], cfg.task, **kw)
    task_type = TASKS[cfg.task]
    return GraphSplits(train, val, test, task_type,
                       4 if task_type == "classification" else 1)
