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
from dataclasses import dataclass, replace

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

__all__ = ["GraphSplits", "load_graphs", "with_mask", "split_mask", "split_masks",
           "csbm_nodes", "check_datasets", "check_graph", "check_splits",
           "CSBM_MIN_NODES", "CSBM_MAX_NODES"]

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


def split_mask(g: Data, split: str) -> torch.Tensor | None:
    """PyG's ``{split}_mask`` of ``g`` (``train``, ``val``, ``test``) as the
    nodes its losses and metrics cover: where ``g`` has no ``node_mask`` of
    its own and the mask is a bool tensor of one entry per node; else
    ``None``."""
    mask = g.get(f"{split}_mask", None)
    if g.get("node_mask", None) is not None or not (
            isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
            and list(mask.shape) == [g.num_nodes]):
        return None
    return mask


def split_masks(splits: GraphSplits) -> GraphSplits:
    """``splits`` whose graphs without a ``node_mask`` score their split's
    PyG mask (:func:`split_mask`) where they have one: one Planetoid-style
    graph given as every split had been trained on every label and scored on
    the training nodes too, without a word. Other graphs are kept as they
    are (a circuit scores every node)."""
    def masked(g: Data, split: str) -> Data:
        mask = split_mask(g, split)
        return g if mask is None else with_mask(g, mask)

    return replace(splits, **{
        split: [masked(g, split) for g in getattr(splits, split)]
        for split in ("train", "val", "test")})


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


def _bad_entries(t: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """``(count, index of the first)`` of ``t``'s NaN / Inf entries, or ``None``."""
    if not t.is_floating_point() or t.numel() == 0:
        return None
    # amax / amin propagate NaN and see +-Inf: no [N, F] bool mask (as large
    # as a quarter of x) for the graphs that are fine, which is all of them
    # but the one being refused.
    if torch.isfinite(t.amax()) and torch.isfinite(t.amin()):
        return None
    bad = ~torch.isfinite(t)
    first = tuple(int(i) for i in bad.nonzero()[0])
    return int(bad.sum()), first


def _named(data: Data, where: str) -> str:
    """``where`` and the graph's name, when it has one (error messages)."""
    name = getattr(data, "name", None)
    return f"{where} {name!r}" if isinstance(name, str) else where


def check_graph(data: Data, where: str = "graph", *, in_channels: int | None = None,
                labels: bool = True, num_classes: int | None = None,
                nodes: bool = False) -> None:
    """Refuse a graph a model cannot train on or predict for, before it is used.

    A NaN or Inf in ``x`` (or in ``y`` on the nodes ``node_mask`` scores)
    would otherwise turn every weight into NaN at the first step, silently;
    a bad ``edge_index``, a feature width other than the model's or a class
    id out of range would fail deep inside a model with a bare traceback.

    Args:
        data (Data): the graph.
        where (str, optional): how the message names it, e.g. ``"train graph"``;
            the graph's ``name`` is added when it has one. (default: ``"graph"``)
        in_channels (int, optional): the feature width ``x`` must have.
            (default: ``None``, any)
        labels (bool, optional): check ``y`` too. (default: ``True``)
        num_classes (int, optional): ``y`` must hold class ids in
            ``[0, num_classes)``. (default: ``None``, a regression target)
        nodes (bool, optional): refuse a graph without nodes, or whose
            ``node_mask`` scores none (one trained on). (default: ``False``)

    Raises:
        ValueError: one line naming the graph, the tensor and what is wrong
            (for non-finite values: how many entries and the first of them).
    """
    what = _named(data, where)
    x = getattr(data, "x", None)
    if x is None:
        raise ValueError(f"{what}: has no node features (data.x is None)")
    # (a user's model may embed one categorical id per node, e.g. a gate
    # type: an integer x of shape [num_nodes], as PyG's own examples do)
    ids = x.dim() == 1 and not x.is_floating_point() and in_channels is None
    if x.dim() != 2 and not ids:
        own = (" (or, for a model of your own, integer ids [num_nodes])"
               if in_channels is None else "")
        raise ValueError(f"{what}: x must be [num_nodes, num_features]{own}, got "
                         f"{str(x.dtype).removeprefix('torch.')} shape "
                         f"{list(x.shape)}")
    n = data.num_nodes
    if x.size(0) != n:
        raise ValueError(f"{what}: x has {x.size(0)} rows for {n} nodes")
    if nodes and not n:
        raise ValueError(f"{what}: has no nodes (num_nodes is {n!r})")
    if in_channels is not None and x.size(1) != in_channels:
        raise ValueError(f"{what}: x has {x.size(1)} features per node, the model "
                         f"takes {in_channels}")
    bad = _bad_entries(x)
    if bad is not None:
        raise ValueError(f"{what}: x has {bad[0]} non-finite (NaN or Inf) entries "
                         f"of {x.numel()}, the first at [node, feature] "
                         f"{list(bad[1])}")
    ei = getattr(data, "edge_index", None)
    if ei is not None:
        if ei.dim() != 2 or ei.size(0) != 2 or ei.is_floating_point():
            raise ValueError(f"{what}: edge_index must be an integer [2, num_edges] "
                             f"tensor, got {str(ei.dtype).removeprefix('torch.')} "
                             f"{list(ei.shape)}")
        if ei.dtype != torch.long:
            # PyG's scatter and gather take int64 indices only: the first
            # conv of a real step would fail, a dry run on fake tensors not
            raise ValueError(f"{what}: edge_index must be int64, got "
                             f"{str(ei.dtype).removeprefix('torch.')}; convert it "
                             "with edge_index.long()")
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
            raise ValueError(f"{what}: edge_index holds node ids outside [0, {n}): "
                             f"min {int(ei.min())}, max {int(ei.max())}")
    # edge weights and features go into the model too (a model that takes
    # edge_attr is given it: leangnn.strategy.forward_kwargs)
    num_edges = 0 if ei is None else ei.size(1)
    for key in ("edge_weight", "edge_attr"):
        t = data.get(key, None)
        if not isinstance(t, torch.Tensor):
            continue
        if t.dim() == 0 or t.size(0) != num_edges:
            raise ValueError(f"{what}: {key} has shape {list(t.shape)} for "
                             f"{num_edges} edges")
        bad = _bad_entries(t)
        if bad is not None:
            raise ValueError(f"{what}: {key} has {bad[0]} non-finite (NaN or Inf) "
                             f"entries of {t.numel()}, the first at {list(bad[1])}")
    batch = data.get("batch", None)
    if isinstance(batch, torch.Tensor):
        # the graph of every node (a PyG Batch): a float or short vector
        # would fail inside a pooling op; a negative id would index backwards
        if batch.dtype != torch.long or list(batch.shape) != [n]:
            raise ValueError(f"{what}: batch must be an int64 tensor of shape "
                             f"[{n}] (the graph of every node), got "
                             f"{str(batch.dtype).removeprefix('torch.')} "
                             f"{list(batch.shape)}")
        if batch.numel() and int(batch.min()) < 0:
            raise ValueError(f"{what}: batch holds a negative graph id "
                             f"({int(batch.min())})")
    y = getattr(data, "y", None)
    if not labels or y is None:
        return
    if y.dim() == 0 or y.size(0) != n:
        per_graph = ""
        if isinstance(batch, torch.Tensor) and batch.numel() and \
                y.dim() and y.size(0) == int(batch.max()) + 1:
            per_graph = (" (one target per graph: the default loss scores "
                         "nodes; pass a loss_fn(out, data) for graph targets)")
        raise ValueError(f"{what}: y has shape {list(y.shape)} for {n} "
                         f"nodes{per_graph}")
    mask = getattr(data, "node_mask", None)
    if mask is not None and (not isinstance(mask, torch.Tensor) or
                             mask.dtype != torch.bool or list(mask.shape) != [n]):
        # (an index tensor or another graph's mask: a bare IndexError later)
        got = (f"{str(mask.dtype).removeprefix('torch.')} {list(mask.shape)}"
               if isinstance(mask, torch.Tensor) else type(mask).__name__)
        raise ValueError(f"{what}: node_mask must be a bool tensor of shape [{n}] "
                         f"(one entry per node), got {got}")
    if nodes and mask is not None and not bool(mask.any()):
        # the loss over no node is NaN: training would return NaN silently
        raise ValueError(f"{what}: node_mask selects no node (all "
                         f"{mask.numel()} entries False)")
    scored = y if mask is None else y[mask.to(y.device)]
    bad = _bad_entries(scored)
    if bad is not None:
        at = "" if mask is None else " scored by node_mask"
        raise ValueError(f"{what}: y has {bad[0]} non-finite (NaN or Inf) entries "
                         f"of {scored.numel()}{at}, the first at {list(bad[1])}")
    if num_classes is not None and scored.numel():
        if scored.is_floating_point() or int(scored.min()) < 0 or \
                int(scored.max()) >= num_classes:
            raise ValueError(f"{what}: y must hold class ids in [0, {num_classes}), "
                             f"got {str(scored.dtype).removeprefix('torch.')} values "
                             f"from {scored.min().item()} to {scored.max().item()}")


def check_splits(splits: GraphSplits) -> None:
    """:func:`check_graph` on every graph of ``splits``: finite features and
    scored labels, one feature width, class ids below ``out_channels``, and
    at least one node in each training graph.

    Raises:
        ValueError: naming the split, the graph and the tensor.
    """
    width = splits.in_channels if splits.train else None
    classes = splits.out_channels if splits.task_type == "classification" else None
    for split in ("train", "val", "test"):
        for i, g in enumerate(getattr(splits, split)):
            where = f"{split} graph {i}"
            check_graph(g, where, in_channels=width, num_classes=classes,
                        nodes=split == "train")
