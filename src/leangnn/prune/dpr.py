"""DPRStrategy: train the encoder on a compact core, serve every node.

Decoupled Prune-and-Reconstruct ("double-layer sparsification"): one compact
node set bounds both computations. :meth:`DPRStrategy.setup` selects the core
of every training graph (:func:`~leangnn.prune.core.build_core`) and the
sparse anchors of its pruned nodes (:func:`~leangnn.prune.decoder.ppr_anchors`);
:meth:`~DPRStrategy.train_step` runs the encoder full-batch on the core only;
:meth:`~DPRStrategy.fit_end` trains the :class:`~leangnn.prune.decoder.AnchorDecoder`
with the encoder frozen, on core nodes masked as if pruned, and keeps it where
it beats anchor averaging on validation (``DPRConfig.decoder``); and
:meth:`~DPRStrategy.predict` serves all nodes: encoder on the core, decoder (or
anchor averaging) on the pruned nodes. ``budget_ratio=1`` is the off switch:
the core is the whole graph and training is plain full-batch training.

The planner selects the core of its prune rows for real
(:meth:`DPRStrategy.offer`); the training of its pick takes that core over
instead of selecting it again, when the graph is the very same, unchanged
one and the configuration equal (``LEANGNN_PLAN_REUSE=0`` is the off switch,
see :func:`~leangnn.graphs.partition.reuse_enabled`).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from ..graphs.partition import GraphStamp, reuse_enabled
from ..graphs.sparse import adj_t_of, is_canonical, undirected_csr
from ..strategy import (
    LossFn,
    Strategy,
    batch_refusal,
    call_model,
    edge_attr_refusal,
)
from .core import CoreGraph, build_core
from .decoder import (
    DECODER_CHOICES,
    AnchorDecoder,
    Anchors,
    compare_to_average,
    decoder_batches,
    ppr_anchors,
    train_decoder,
)
from .serve import (
    KERNELS,
    ServeGraph,
    anchor_chunks,
    csr_rows,
    servable,
    serve_forward,
    serve_pruned,
)

__all__ = ["DPRConfig", "DPRStrategy", "withdraw_offers", "core_refusal",
           "node_ids_refusal", "cached_refusal", "edge_weight_refusal",
           "features_refusal", "empty_core_refusal", "OFFERS"]

#: why DPR refuses a model that takes edge features (:func:`edge_attr_refusal`)
CORE_HAS_NO_EDGE_ATTR = ("DPR's core adjacency carries none (its bridges are new "
                         "edges); train it full batch")
#: why DPR refuses a model that pools by graph (:func:`batch_refusal`)
CORE_IS_NODE_LEVEL = ("DPR trains on a core of nodes and rebuilds the pruned "
                      "nodes' outputs, not graph outputs; train it full batch")


def node_ids_refusal(data: Data, who: str) -> str | None:
    """The one-line refusal of DPR's core for ``data`` holding node ids
    beside its edges (``edge_label_index`` of a link-prediction task: by
    PyG's convention every key naming an ``index``), or ``None``. The core
    renumbers the nodes it keeps and drops the others, so a loss reading
    those ids on the core's outputs would fail, or, where the ids happen to
    be small, score the wrong nodes without a word."""
    for key, value in data.items():
        if key in ("edge_index", "adj_t") or "index" not in key or not \
                isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        return (f"{who}: data.{key} {list(value.shape)} holds node ids of the "
                "whole graph, which the core renumbers (the nodes it keeps) or "
                "drops (the others); train it full batch or offloaded")
    return None


def edge_weight_refusal(data: Data, who: str) -> str | None:
    """The one-line refusal of DPR's core for a graph with edge weights, or
    ``None``: the core keeps none (its bridges and a capped in-degree make
    new edges), so the model would train on the unweighted core of a
    weighted graph without a word."""
    w = data.get("edge_weight", None)
    if not isinstance(w, torch.Tensor):
        return None
    return (f"{who}: the graph has edge weights (edge_weight "
            f"{list(w.shape)}), and DPR's core keeps none (its bridges are "
            "new edges); train it full batch or offloaded")


def features_refusal(data: Data, who: str) -> str | None:
    """The one-line refusal of DPR for a graph whose ``x`` holds integer ids
    (a categorical feature a model embeds), or ``None``: its decoder rebuilds
    a pruned node from the weighted mean of its anchors' features, which ids
    do not have (it failed at the end of training: "addmv input tensors
    must have the same dtype")."""
    x = data.get("x", None)
    if not isinstance(x, torch.Tensor) or x.is_floating_point():
        return None
    return (f"{who}: x holds integer ids ({str(x.dtype).removeprefix('torch.')} "
            f"{list(x.shape)}), and DPR rebuilds each pruned node from the mean "
            "of its anchors' features; train it full batch, or give DPR float "
            "features (e.g. one-hot)")


def cached_refusal(model: torch.nn.Module, who: str) -> str | None:
    """The one-line refusal of DPR's core for a model with a conv that
    caches its graph's normalisation (PyG's ``cached=True``: GCNConv,
    SGConv, ...), or ``None``. Such a conv keeps the first graph it sees:
    the core after a forward on the whole graph (an IndexError deep in the
    conv), or the core for every later forward on the whole graph."""
    from torch_geometric.nn.conv import MessagePassing

    for m in model.modules():
        if isinstance(m, MessagePassing) and getattr(m, "cached", False) is True:
            return (f"{who}: {type(m).__name__}(cached=True) keeps the "
                    "normalisation of the first graph it sees, and DPR trains on "
                    "its core but serves the whole graph; build it with "
                    "cached=False")
    return None


def core_refusal(model: torch.nn.Module, data: Data, who: str) -> str | None:
    """The first one-line reason DPR's core cannot train ``model`` on
    ``data`` (edge features the model takes, a graph-level task, node ids
    beside the edges, a conv caching one graph's normalisation, edge
    weights, integer ids as features), or ``None``: what
    :meth:`DPRStrategy.setup` and the planner's prune rows refuse before a
    core is built."""
    return (edge_attr_refusal(model, data, who, CORE_HAS_NO_EDGE_ATTR)
            or batch_refusal(model, data, who, CORE_IS_NODE_LEVEL)
            or node_ids_refusal(data, who) or cached_refusal(model, who)
            or edge_weight_refusal(data, who) or features_refusal(data, who))


def empty_core_refusal(core: Data, data: Data, who: str) -> str | None:
    """The one-line refusal of a core that holds none of the nodes
    ``node_mask`` trains on (few labels, none of them among the important
    nodes), or ``None``: its loss over no node is NaN, which read as bad
    labels or a bad learning rate."""
    mask = core.get("node_mask", None)
    if not isinstance(mask, torch.Tensor) or not mask.numel() or bool(mask.any()):
        return None
    scored = data.get("node_mask", None)
    k = int(scored.sum()) if isinstance(scored, torch.Tensor) else "the"
    # (a smaller core is a subset: the top of the same importance ranking)
    return (f"{who}: the core holds none of the {k} nodes node_mask trains on "
            "(nor does a smaller one); raise budget_ratio or train it full batch")


@dataclass
class DPRConfig:
    """Settings of :class:`DPRStrategy` (defaults are the benchmarked ones).

    Args:
        budget_ratio (float): share of nodes in the core, ``floor(r N + 0.5)``.
        budget_bytes (int, optional): byte budget instead of a ratio.
        importance (str): node importance (``degree``, ``pagerank``, ``kcore``,
            ``combined`` or a registered name).
        bridge (str): ``component``, ``two_hop`` or ``none``.
        sparsify (float, optional): DSpar keep ratio for core edges.
        edge_budget (float or str, optional): the core keeps at most this
            share of the graph's edges (uniform per-node cap, see
            :func:`~leangnn.prune.core.cap_in_degree`); ``"ratio"`` (the
            default) uses ``budget_ratio``, so ``r`` bounds nodes and edges
            alike; ``None`` keeps every induced edge.
        num_anchors (int, optional): ``k`` anchors per pruned node; ``None``
            with ``dense=True`` is the dense reference.
        num_steps (int): walk length (hops) of the anchor PageRank.
        alpha (float): stop probability of the anchor walk.
        eps (float): walk entries below this are dropped.
        dense (bool): dense reference decoder: all core nodes within
            ``num_steps`` hops.
        decoder (str): how pruned nodes are reconstructed. ``"learned"``:
            always the trained :class:`~leangnn.prune.decoder.AnchorDecoder`.
            ``"average"``: no decoder, the anchor-weighted average of the core's
            outputs (nothing trained at :meth:`~DPRStrategy.fit_end`; the
            fastest serving). ``"auto"`` (the default): train the decoder,
            keep it only if it lowers the error on its held-out validation
            rows (the last tenth of its rows, no gradient step taken on them)
            by more than ``decoder_min_gain`` against anchor averaging on the
            same rows (:func:`~leangnn.prune.decoder.compare_to_average`, which
            explains the rule; below 20 rows nothing is held out and the
            decoder is kept). ``"auto"`` trades accuracy for serving time: a
            dropped decoder was worth at most ``decoder_min_gain`` of
            validation error, and test error may differ (100k-node CSBM:
            98.19 % -> 97.92 % test accuracy, serving 2.6x faster);
            ``"learned"`` is the override.
        decoder_min_gain (float): least *absolute* reduction of the validation
            error, in ``[0, 1]``, that keeps the decoder under ``"auto"``:
            ``0.01`` is one point of accuracy (classification) or ``0.01`` of
            ``R^2`` (regression); ``0`` keeps it whenever it helps at all.
        decoder_hidden (int): decoder MLP width.
        decoder_layers (int): decoder MLP layers.
        decoder_dropout (float): decoder dropout.
        decoder_epochs (int): decoder epochs at most (best validation epoch
            is kept).
        decoder_patience (int): stop after this many epochs without a better
            validation loss (``0``: never).
        decoder_lr (float): decoder learning rate.
        decoder_batch_size (int): rows per decoder step.
        decoder_rows (str): rows the decoder learns from: ``core`` (labelled
            core nodes masked as if pruned), ``pruned`` (labelled pruned nodes)
            or ``both`` (the union; on the benchmarks the pruned rows add what
            the masked core rows miss: low-degree nodes).
        max_decoder_rows (int): cap on decoder training rows (random sample).
        anchor_features (bool): feed anchor-weighted input features too.
        sparse_adj (bool, optional): run the encoder on a ``torch.sparse_csr``
            adjacency (no ``[E, C]`` message tensor; PyG convs that support
            it). ``None`` (the default) uses it whenever the graph is pruned
            (``budget_ratio < 1`` or a byte budget): on the 2.45M-node CSBM at
            ``r = 0.3`` the message tensor of the core's 18.6M edges is 4.4 GiB
            per layer at 64 channels (through ``leangnn train``, 8.4 GiB of
            process peak before, measured). ``budget_ratio=1`` stays plain
            full-batch training on ``edge_index``, bit for bit. A model that
            cannot train on it (PNA, TransformerConv, EdgeCNN: setup's probe,
            :meth:`DPRStrategy._csr_refused`) trains on the edge list.
            ``False`` is the off switch. Results agree to float rounding (the
            sums run in another order), not bit for bit.
        serve_kernel (str): sparse row products of serving: ``"bag"`` (one
            ``embedding_bag`` call per product, 1.7-2.4x faster than
            ``torch.sparse`` on CPU, see :mod:`~leangnn.prune.serve`) or
            ``"csr"`` (``torch.sparse``, the off switch).
        serve_reassociate (bool): serve a PyG ``GraphSAGE`` (mean) or ``GCN``
            encoder layer by layer, SAGE aggregating at ``min(in, out)``
            width, with the mean weights and GCN's normalisation built once
            per graph (:func:`~leangnn.prune.serve.serve_forward`); ``False``
            calls the model itself (the off switch). Other encoders always
            run as they are. Equal up to float rounding.
        chunk_size (int): rows per decoder training/inference chunk.
        anchor_chunk_size (int): sources per anchor walk product.
        seed (int): seed for sparsification, row sampling and decoder init.
    """

    budget_ratio: float = 0.3
    budget_bytes: int | None = None
    importance: str = "pagerank"
    bridge: str = "component"
    sparsify: float | None = None
    edge_budget: float | str | None = "ratio"
    num_anchors: int | None = 8
    num_steps: int = 2
    alpha: float = 0.15
    eps: float = 1e-4
    dense: bool = False
    decoder: str = "auto"
    decoder_min_gain: float = 0.01
    decoder_hidden: int = 64
    decoder_layers: int = 2
    decoder_dropout: float = 0.0
    decoder_epochs: int = 100
    decoder_patience: int = 10
    decoder_lr: float = 0.01
    decoder_batch_size: int = 16384
    decoder_rows: str = "both"
    max_decoder_rows: int = 500_000
    anchor_features: bool = True
    sparse_adj: bool | None = None
    serve_kernel: str = "bag"
    serve_reassociate: bool = True
    chunk_size: int = 16384
    anchor_chunk_size: int = 1024
    seed: int = 0

    def __post_init__(self):
        if self.decoder not in DECODER_CHOICES:
            raise ValueError(f"decoder must be one of {DECODER_CHOICES}, "
                             f"got {self.decoder!r}")
        g = self.decoder_min_gain
        if (isinstance(g, bool) or not isinstance(g, (int, float))
                or not 0.0 <= g <= 1.0):
            raise ValueError(f"decoder_min_gain must be a number in [0, 1], "
                             f"got {g!r}")
        if self.decoder_rows not in ("core", "pruned", "both"):
            raise ValueError(f"decoder_rows must be 'core', 'pruned' or 'both', "
                             f"got {self.decoder_rows!r}")
        if self.budget_bytes is None and not 0.0 < self.budget_ratio <= 1.0:
            raise ValueError(f"budget_ratio must be in (0, 1], "
                             f"got {self.budget_ratio!r}")
        if self.num_anchors is None and not self.dense:
            raise ValueError("num_anchors=None needs dense=True")
        if self.serve_kernel not in KERNELS:
            raise ValueError(f"serve_kernel must be one of {KERNELS}, "
                             f"got {self.serve_kernel!r}")
        if isinstance(self.edge_budget, str) and self.edge_budget != "ratio":
            raise ValueError(f"edge_budget must be a float in (0, 1], 'ratio' or "
                             f"None, got {self.edge_budget!r}")


@dataclass
class _GraphState:
    core: CoreGraph
    train_data: Data
    pruned: Tensor
    rows: Tensor | None              # the decoder's training rows
    prep_s: float
    num_edges: int
    canonical: bool                  # edge_index is its own symmetric CSR
    anchors: Anchors | None = None   # of the pruned nodes (lazy)
    row_anchors: Anchors | None = None  # of the decoder's rows (lazy)
    anchor_s: float = 0.0
    # graph-only operands of the encoder (mean weights, GCN normalisation),
    # built once for all serving calls
    serve_graph: ServeGraph | None = None
    # (key, per chunk of pruned rows: anchor rows, their node ids, mass and
    # output rows on the device): graph-only, sliced and moved once
    serve_chunks: tuple[tuple, list] | None = None


#: most cores offered at once (:meth:`DPRStrategy.offer`); a plan offers one
#: per prune row it estimates, and the planner withdraws all but its pick's
OFFERS = 4
#: ``(stamp of the graph, configuration key, CPU state)``, oldest first
_OFFERS: list[tuple[GraphStamp, str, _GraphState]] = []


def _config_key(config: DPRConfig) -> str | None:
    """Every setting, as text (``None``: not serialisable, e.g. an importance
    callable, whose identity says nothing about its scores)."""
    try:
        return json.dumps(asdict(config), sort_keys=True)
    except TypeError:
        return None


def _take_offer(config: DPRConfig, data: Data) -> _GraphState | None:
    """The offered state of ``data`` under ``config`` (removed), if any."""
    if not _OFFERS or not reuse_enabled():
        return None
    ck = _config_key(config)
    if ck is None:
        return None
    for i, (stamp, key, st) in enumerate(_OFFERS):
        if key == ck and stamp.matches(data):
            del _OFFERS[i]
            return st
    return None


def withdraw_offers(keep: DPRConfig | None = None,
                    drop: DPRConfig | None = None) -> None:
    """Drop the offered cores (:meth:`DPRStrategy.offer`): all but those
    under ``keep``'s configuration when given (the planner keeps its pick's),
    only those under ``drop``'s when that is given (a row that cannot be the
    pick), and those of graphs that no longer exist."""
    if drop is not None:
        ck = _config_key(drop)
        _OFFERS[:] = [o for o in _OFFERS if o[1] != ck and o[0].alive]
        return
    ck = None if keep is None else _config_key(keep)
    _OFFERS[:] = [o for o in _OFFERS if ck is not None and o[1] == ck
                  and o[0].alive]


def _probe_loss(out, data) -> Tensor:
    out = out[0] if isinstance(out, tuple | list) else out
    return out.float().square().mean()


class DPRStrategy(Strategy):
    """Decoupled Prune-and-Reconstruct as a :class:`~leangnn.strategy.Strategy`.

    Args:
        config (DPRConfig, optional): settings. (default: ``DPRConfig()``)
        device (torch.device or str, optional): where the encoder and decoder
            run. (default: ``"cpu"``)
        **overrides: fields of :class:`DPRConfig` to override.
    """

    name = "prune"
    trains_at_fit_end = True  # the anchor decoder

    def __init__(self, config: DPRConfig | None = None,
                 device: torch.device | str = "cpu", **overrides):
        super().__init__(device)
        cfg = asdict(config) if config is not None else {}
        unknown = set(overrides) - {f.name for f in fields(DPRConfig)}
        if unknown:
            raise ValueError(f"unknown DPRConfig fields {sorted(unknown)}")
        cfg.update(overrides)
        self.config = DPRConfig(**cfg)
        self.decoder: AnchorDecoder | None = None
        self._states: dict[Any, _GraphState] = {}
        self._stats: dict[str, Any] = {}
        # sparse_adj=None: set when the model cannot train on the core's CSR
        # adjacency (setup's probe); its cores are then edge lists
        self._edge_list = False

    @classmethod
    def from_config(cls, cfg) -> DPRStrategy:
        """From a :class:`~leangnn.train.TrainConfig`-like object: reads
        ``budget_ratio``, ``num_anchors``, ``seed``, ``device`` and any
        :class:`DPRConfig` field it has (``None`` values are ignored)."""
        kw = {}
        for f in fields(DPRConfig):
            v = getattr(cfg, f.name, None)
            if v is not None:
                kw[f.name] = v
        return cls(device=getattr(cfg, "device", None) or "cpu", **kw)

    # ----------------------------------------------------------------- setup
    @staticmethod
    def _key(data: Data):
        name = data.get("name", None)
        return (name if isinstance(name, str) else id(data), data.num_nodes,
                data.num_edges)

    def prepare(self, data: Data) -> _GraphState:
        """Core and core training graph of ``data`` (cached by name and size).

        A core that :meth:`offer` built for the same, unchanged graph under
        the same configuration (the planner's row of this strategy) is taken
        over rather than built again: the same core (tested); ``prep_s`` is
        then that build's time and :meth:`summary` says ``core_reused``.
        """
        key = self._key(data)
        if key in self._states:
            return self._states[key]
        st = _take_offer(self.config, data)
        if st is None:
            st = self._build(data)
        else:
            self._stats["core_reused"] = True
        st.train_data = st.train_data.to(self.device)
        self._states[key] = st
        return st

    def offer(self, data: Data, score: Tensor | None = None, adj=None
              ) -> _GraphState:
        """Build ``data``'s core on the CPU and keep it for the next
        :class:`DPRStrategy` with this configuration that prepares the very
        same, unchanged graph: the planner selects the core of its prune rows
        for real, and the training of its pick would otherwise select it
        again.

        Offers are bounded (:data:`OFFERS`, the oldest go first), checked by
        :class:`~leangnn.graphs.partition.GraphStamp` (another graph, or this
        one changed in place or replaced, never takes one), taken once, and
        dropped by :func:`withdraw_offers`. With reuse off
        (``LEANGNN_PLAN_REUSE=0``) or a non-serialisable configuration (an
        importance callable) nothing is kept.

        Args:
            data (Data): the graph.
            score (Tensor, optional): the node importance of ``data`` under
                the configured method, computed already (the plan's rows share
                it); default: computed here.
            adj (scipy.sparse.csr_matrix, optional): ``data``'s
                :func:`~leangnn.graphs.sparse.undirected_csr`, built already.

        Returns:
            The prepared state (on the CPU); its ``train_data`` is the core.
        """
        st = self._build(data, score=score, adj=adj)
        ck = _config_key(self.config)
        if ck is not None and reuse_enabled():
            _OFFERS[:] = [o for o in _OFFERS if o[0].alive][-(OFFERS - 1):]
            _OFFERS.append((GraphStamp(data), ck, st))
        return st

    def _build(self, data: Data, score: Tensor | None = None, adj=None
               ) -> _GraphState:
        """The state of ``data`` built afresh on the CPU (``score`` and
        ``adj``: see :meth:`offer`)."""
        cfg, t0 = self.config, time.perf_counter()
        data = data.cpu()
        if adj is None:
            adj = undirected_csr(data.edge_index, data.num_nodes)
        canonical = is_canonical(adj, data.edge_index)
        eb = cfg.edge_budget
        if eb == "ratio":
            eb = cfg.budget_ratio if cfg.budget_bytes is None else None
        importance = cfg.importance
        if score is not None:
            # the caller's score of this very graph under cfg.importance
            if score.numel() != data.num_nodes:
                raise ValueError(f"score: {score.numel()} values for "
                                 f"{data.num_nodes} nodes")
            importance = lambda edge_index, num_nodes: score  # noqa: E731
        core = build_core(data, cfg.budget_ratio, budget_bytes=cfg.budget_bytes,
                          importance=importance, bridge=cfg.bridge,
                          sparsify=cfg.sparsify, edge_budget=eb, seed=cfg.seed,
                          adj=adj)
        train_data = core.data
        sparse = cfg.sparse_adj
        if sparse is None:
            sparse = not self._edge_list and (cfg.budget_bytes is not None
                                              or cfg.budget_ratio < 1.0)
        if sparse:
            # The CSR adjacency replaces edge_index for training; keeping both
            # would hold the core's edges twice.
            train_data = copy.copy(train_data)
            train_data.adj_t = adj_t_of(train_data.edge_index, core.num_core,
                                        train_data.get("edge_weight", None))
            del train_data.edge_index
            if "edge_weight" in train_data:
                del train_data.edge_weight
            core.data = train_data
        pruned = (~core.mask).nonzero().view(-1)
        rows = self._decoder_rows(data, core, pruned) if pruned.numel() else None
        del adj
        core.score = torch.empty(0)  # not needed any more; frees N floats
        return _GraphState(core, train_data, pruned, rows,
                           time.perf_counter() - t0,
                           int(core.stats["num_core_edges"]), canonical)

    def _ensure_anchors(self, st: _GraphState, data: Data, rows: bool) -> None:
        """Anchors of the pruned nodes (and of the decoder's rows), computed
        on first use: encoder training never holds them."""
        need_rows = rows and st.rows is not None and st.row_anchors is None
        if st.anchors is not None and not need_rows:
            return
        cfg, t0 = self.config, time.perf_counter()
        adj = undirected_csr(data.edge_index.cpu(), data.num_nodes, st.canonical)
        akw = dict(num_anchors=None if cfg.dense else cfg.num_anchors,
                   num_steps=cfg.num_steps, alpha=cfg.alpha,
                   eps=0.0 if cfg.dense else cfg.eps, absorb=not cfg.dense,
                   chunk_size=cfg.anchor_chunk_size)
        # weights in the features' float type (a float64 model's too)
        x = data.get("x", None)
        dtype = x.dtype if isinstance(x, Tensor) and x.is_floating_point() else None
        if st.anchors is None:
            st.anchors = ppr_anchors(adj, st.core.index, st.pruned,
                                     **akw).to("cpu", dtype)
        if need_rows:
            st.row_anchors = ppr_anchors(adj, st.core.index, st.rows,
                                         **akw).to("cpu", dtype)
        st.anchor_s += time.perf_counter() - t0

    def _decoder_rows(self, data: Data, core: CoreGraph, pruned: Tensor
                      ) -> Tensor | None:
        mask = data.get("node_mask", None)
        if mask is None:
            mask = torch.ones(data.num_nodes, dtype=torch.bool)
        cand = []
        if self.config.decoder_rows in ("core", "both"):
            cand.append(core.index[mask[core.index]])
        if self.config.decoder_rows in ("pruned", "both"):
            cand.append(pruned[mask[pruned]])
        rows = torch.cat(cand)
        if rows.numel() == 0:
            return None
        # A seeded shuffle (and cap): contiguous slices become random batches.
        gen = torch.Generator().manual_seed(self.config.seed)
        pick = torch.randperm(rows.numel(), generator=gen)
        return rows[pick[:self.config.max_decoder_rows]]

    def setup(self, model: torch.nn.Module, train_graphs: list[Data]) -> None:
        for data in train_graphs:
            refusal = core_refusal(model, data, "prune")
            if refusal:
                raise ValueError(refusal)
            st = self.prepare(data)
            if self._csr_refused(model, st):
                st = self.prepare(data)
            refusal = empty_core_refusal(st.train_data, data, "prune")
            if refusal:
                raise ValueError(refusal)

    def _csr_refused(self, model: torch.nn.Module, st: _GraphState) -> bool:
        """With ``sparse_adj=None``: whether ``model`` cannot train on the
        core's CSR adjacency, so that every core is built again as an edge
        list (``True``; :meth:`summary` says why).

        PNA and TransformerConv scatter over the CSR's int32 indices and fail
        at their first step; EdgeCNN's max over it gave NaN gradients. One
        step on a few of the core's edges, compared with the same edges as an
        edge list (:func:`~leangnn.plan.core_probe.probe_core`, the check
        :func:`leangnn.fit` runs), tells. The user's loss is not known here:
        the probe's is the outputs' mean square, which sends every output's
        gradient through the step.
        """
        if (self.config.sparse_adj is not None or self._edge_list
                or st.train_data.get("adj_t", None) is None
                or "csr_probe" in self._stats):
            return False
        from leangnn.plan.core_probe import known_on_csr, probe_core

        if known_on_csr(model):
            self._stats["csr_probe"] = "not needed (a GSRGNN or ResGNN)"
            return False

        why = probe_core(model, st.train_data, _probe_loss, self.device)
        if why is None:
            self._stats["csr_probe"] = "passed"
            return False
        self._stats["csr_probe"] = f"edge list (on the core's CSR adjacency: {why})"
        self._edge_list = True
        self._states.clear()
        withdraw_offers(drop=self.config)  # an offered core is a CSR one
        return True

    # -------------------------------------------------------------- training
    def forward(self, model: torch.nn.Module, data: Data) -> Tensor:
        adj_t = data.get("adj_t", None)
        if adj_t is not None:
            return call_model(model, data, data.x.to(self.device),
                              adj_t.to(self.device))
        return super().forward(model, data)

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn: LossFn) -> float:
        core = self.prepare(data).train_data
        out = self.forward(model, core)
        loss = loss_fn(out, core)
        loss.backward()
        return float(loss.detach())

    @torch.no_grad()
    def _embed(self, model: torch.nn.Module, st: _GraphState,
               x: Tensor | None = None, kernel: str = "bag",
               reassociate: bool = False) -> Tensor:
        """The encoder's core outputs in eval mode, on ``x`` (the core's
        features; default: the prepared core's), through
        :func:`~leangnn.prune.serve.serve_forward` when ``reassociate`` and
        the model is :func:`~leangnn.prune.serve.servable`."""
        training = model.training
        model.eval()
        try:
            adj_t = st.train_data.get("adj_t", None)
            if reassociate and adj_t is not None and servable(model):
                if st.serve_graph is None or st.serve_graph.adj_t is not adj_t:
                    st.serve_graph = ServeGraph(adj_t)
                return serve_forward(model, st.train_data.x if x is None else x,
                                     st.serve_graph, kernel)
            core = st.train_data
            if x is not None:
                core = copy.copy(core)
                core.x = x
            return self.forward(model, core)
        finally:
            model.train(training)

    def _inputs(self, st: _GraphState, anchors: Anchors, h: Tensor, a: int, b: int,
                x: Tensor) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        w = csr_rows(anchors.weight, a, b).to(self.device)
        nodes = anchors.nodes[a:b]
        emb = w @ h
        ax = (w @ st.train_data.x.to(self.device)
              if self.config.anchor_features else None)
        return (x[nodes].to(self.device), emb, ax,
                anchors.mass[a:b].to(self.device))

    def fit_end(self, model: torch.nn.Module, train_graphs: list[Data],
                loss_fn: LossFn) -> None:
        """Train the decoder with the encoder frozen (skipped when nothing is
        pruned, e.g. ``budget_ratio=1``, and with ``decoder="average"``), and
        under ``decoder="auto"`` keep it only if it pays off on validation
        (see :class:`DPRConfig`; the decision and both validation figures go
        to :meth:`summary`).

        Decoder inputs are assembled batch by batch from the rows' anchors
        (one small sparse product each), never materialised for all rows.
        """
        if self.config.decoder == "average":
            self.decoder = None
            self._stats["decoder_choice"] = "average"
            return
        states = [(self.prepare(d), d) for d in train_graphs]
        states = [(st, d) for st, d in states if st.pruned.numel() and
                  st.rows is not None]
        if not states:
            return
        t0, cfg = time.perf_counter(), self.config
        graphs = []
        for st, data in states:
            self._ensure_anchors(st, data, rows=True)
            graphs.append((st, st.row_anchors, self._embed(model, st), data.x,
                           data.y[st.row_anchors.nodes]))
            st.row_anchors = None  # only the decoder's training needs them
        st0, anc0, h0, x0, _ = graphs[0]
        xi, emb, ax, _ = self._inputs(st0, anc0, h0, 0, 1, x0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.decoder = AnchorDecoder(
                xi.size(1), emb.size(1), emb.size(1), cfg.decoder_hidden,
                cfg.decoder_layers, cfg.decoder_dropout, cfg.anchor_features,
                residual=True).to(self.device, emb.dtype)
            self._train_decoder(graphs, loss_fn)
        rows = sum(g[4].numel() for g in graphs)
        # "decoder_rows": the rows of the decoder that serves; a dropped
        # one's are kept apart, so the figure always describes what serves
        self._stats["decoder_rows" if self.decoder is not None
                    else "dropped_decoder_rows"] = rows
        self._stats["decoder_train_s"] = time.perf_counter() - t0

    def _train_decoder(self, graphs, loss_fn) -> None:
        """Fit the decoder (its rows' last tenth validates), then compare it
        with anchor averaging on those rows and, under ``"auto"``, keep it
        only if the error falls by more than ``decoder_min_gain``."""
        cfg = self.config
        train, val = decoder_batches([g[4].numel() for g in graphs],
                                     cfg.decoder_batch_size)

        def inputs(g, a, b):
            st, anc, h, x, _ = graphs[g]
            return self._inputs(st, anc, h, a, b, x)

        def target(g, a, b):
            return graphs[g][4][a:b].to(self.device)

        train_decoder(self.decoder, inputs, target, train, val, loss_fn,
                      cfg.decoder_epochs, cfg.decoder_patience, cfg.decoder_lr)
        if not val:  # too few rows to judge: keep what was trained
            self._stats.update(decoder_choice="learned", decoder_gain=None)
            return
        fig = compare_to_average(self.decoder, inputs, target, val, loss_fn)
        keep = cfg.decoder == "learned" or fig["decoder_gain"] > cfg.decoder_min_gain
        if not keep:
            self.decoder = None
        self._stats.update(fig, decoder_choice="learned" if keep else "average")

    # ------------------------------------------------------------- inference
    @torch.no_grad()
    def predict(self, model: torch.nn.Module, data: Data,
                fused: bool | None = None, kernel: str | None = None,
                reassociate: bool | None = None) -> Tensor:
        """All-node predictions: encoder on the core, decoder on pruned nodes.

        Without a decoder (before :meth:`fit_end`, e.g. validation during
        training; with ``decoder="average"``; or when ``"auto"`` dropped it)
        pruned nodes get the anchor-weighted average of core outputs. Everything is
        computed from ``data.x`` on every call (the core's features too); only
        graph-derived operands (core, anchors, mean weights) are reused.

        Args:
            fused (bool, optional): project the core through the decoder's
                first layer once and gather hidden-sized anchor rows
                (:meth:`~leangnn.prune.decoder.AnchorDecoder.project_core`);
                ``False`` assembles each pruned node's full decoder input.
                Same function, equal up to float rounding. ``None`` fuses when
                that does not widen the gathered rows (anchor features at
                least as wide as the decoder's hidden layer). (default: ``None``)
            kernel (str, optional): sparse products, ``"bag"`` or ``"csr"``
                (:func:`~leangnn.prune.serve.rows_mm`). (default: the config's
                ``serve_kernel``)
            reassociate (bool, optional): serve a GraphSAGE or GCN encoder
                by :func:`~leangnn.prune.serve.serve_forward`. (default: the
                config's ``serve_reassociate``)
        """
        cfg = self.config
        kernel = cfg.serve_kernel if kernel is None else kernel
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        reassociate = cfg.serve_reassociate if reassociate is None else reassociate
        x = data.x
        if x is None or x.dim() != 2 or x.size(0) != data.num_nodes:
            raise ValueError(f"predict: data.x must be [num_nodes={data.num_nodes}, "
                             f"F], got {None if x is None else tuple(x.shape)}")
        st = self.prepare(data)
        # the graph's state may come from a cache: its features set the width
        if x.size(1) != st.train_data.x.size(1):
            raise ValueError(f"predict: data.x has {x.size(1)} features per node, "
                             f"the model was prepared on {st.train_data.x.size(1)}")
        self._ensure_anchors(st, data, rows=False)
        t0 = time.perf_counter()
        xc = self.core_features(st, data)
        h = self._embed(model, st, xc, kernel, reassociate)
        out = h.new_zeros(data.num_nodes, h.size(1))
        # index_select / index_copy_ rather than x[i] / out[i] = v: half the
        # time for these row gathers and scatters on CPU (aten::index walks
        # elements, index_select copies rows).
        out.index_copy_(0, st.core.index.to(self.device), h)
        serve_pruned(out, self._anchor_chunks(st), h, xc, x, self.decoder, fused,
                     kernel)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._stats["all_node_inference_s"] = time.perf_counter() - t0
        return out

    def _anchor_chunks(self, st: _GraphState) -> list:
        st.serve_chunks = anchor_chunks(st.anchors, st.pruned, self.config.chunk_size,
                                        self.device, st.serve_chunks)
        return st.serve_chunks[1]

    def core_features(self, st: _GraphState, data: Data) -> Tensor:
        """The core's rows of ``data.x`` on the strategy's device (read on
        every serving call, never kept)."""
        x = data.x
        if st.core.num_core == data.num_nodes:
            return x.to(self.device)
        return x.index_select(0, st.core.index.to(x.device)).to(self.device)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        dec = self.decoder
        return {"config": asdict(self.config),
                "decoder_choice": self._stats.get("decoder_choice"),
                "decoder": None if dec is None else dec.state_dict(),
                "decoder_dims": None if dec is None else
                (dec.in_channels, dec.embed_channels, dec.out_channels)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # states saved before a field existed get its default
        self.config = DPRConfig(**state["config"])
        self.decoder = None
        if state.get("decoder_choice") is not None:
            self._stats["decoder_choice"] = state["decoder_choice"]
        if state.get("decoder") is not None:
            f, c, o = state["decoder_dims"]
            cfg = self.config
            dtype = next(iter(state["decoder"].values())).dtype  # as trained
            self.decoder = AnchorDecoder(
                f, c, o, cfg.decoder_hidden, cfg.decoder_layers, cfg.decoder_dropout,
                cfg.anchor_features, residual=True).to(self.device, dtype)
            self.decoder.load_state_dict(state["decoder"])
            self.decoder.eval()

    def summary(self) -> dict[str, Any]:
        """Core size, anchors per pruned node, all-node inference time, ..."""
        out: dict[str, Any] = {"budget_ratio": self.config.budget_ratio,
                               "importance": self.config.importance,
                               "num_anchors": self.config.num_anchors,
                               "dense_decoder": self.config.dense,
                               "decoder": self.config.decoder,
                               "decoder_min_gain": self.config.decoder_min_gain}
        if self._states:
            sts = list(self._states.values())
            nnz = [s.anchors.nnz_per_row for s in sts if s.anchors is not None]
            nnz = torch.cat(nnz).float() if nnz else torch.zeros(0)
            out.update(
                core_size=sum(s.core.num_core for s in sts),
                num_nodes=sum(s.core.mask.numel() for s in sts),
                core_edges=sum(s.num_edges for s in sts),
                num_bridges=sum(s.core.num_bridges for s in sts),
                anchors_per_node=float(nnz.mean()) if nnz.numel() else 0.0,
                max_anchors_per_node=int(nnz.max()) if nnz.numel() else 0,
                prep_s=sum(s.prep_s for s in sts),
                anchor_s=sum(s.anchor_s for s in sts))
            out["core_ratio"] = out["core_size"] / max(out["num_nodes"], 1)
        out.update(self._stats)
        return out

    def __repr__(self) -> str:
        c = self.config
        return (f"{self.__class__.__name__}(budget_ratio={c.budget_ratio}, "
                f"num_anchors={c.num_anchors}, importance={c.importance}, "
                f"decoder={c.decoder}, "
                f"device={self.device})")
