"""The strategy interface: how one model is trained and served on one graph.

The :class:`~leangnn.train.Trainer` owns the loop (epochs, optimizer step,
gradient clipping, early stopping, checkpoints, metrics); a strategy owns what
happens to one graph inside it. ``full`` is plain full-batch autograd; the
memory strategies (``reversible`` through its model, ``prune``, ``offload``)
subclass :class:`Strategy` and override the hooks they need.

Strategies are registered by name in :data:`STRATEGIES` (see
:func:`register_strategy`) with lazy ``"module:Class"`` targets, so reading
the registry (the CLI's ``--strategy`` choices, configuration checks) never
imports the prune or offload packages; :func:`build_strategy` does, for the
one strategy a run uses.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

__all__ = ["Strategy", "FullBatch", "LossFn", "node_mask", "forward_kwargs",
           "takes_data", "call_model", "takes_edge_attr", "uses_edge_attr",
           "edge_attr_refusal", "takes_batch", "uses_batch", "batch_refusal",
           "StrategyEntry", "STRATEGIES", "register_strategy", "get_strategy",
           "option_choices", "build_strategy"]

#: ``loss_fn(out, data) -> scalar``: the trainer's task loss on ``data``'s nodes.
LossFn = Callable[[Tensor, Data], Tensor]


def node_mask(data: Data) -> Tensor | None:
    """The nodes of ``data`` that a loss or metric covers (``None``: all)."""
    return data.get("node_mask", None)


@functools.lru_cache(maxsize=256)
def _forward_params(kind: type) -> frozenset[str]:
    """The parameter names of ``kind.forward`` (none where it has no
    signature)."""
    try:
        return frozenset(inspect.signature(kind.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return frozenset()


def takes_edge_attr(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes edge features: it names an
    ``edge_attr`` parameter (PyG's ``BasicGNN`` models and convs do) and,
    for a ``BasicGNN``, its convs take them (``supports_edge_attr``: GAT, not
    GCN, GraphSAGE or GIN, which ignore them). A forward taking only
    ``**kwargs`` (leangnn's deep models hand those to convs that may not take
    edge features) takes none."""
    return "edge_attr" in _forward_params(type(model)) and bool(
        getattr(model, "supports_edge_attr", True))


def uses_edge_attr(model: torch.nn.Module, data: Data) -> bool:
    """Whether a forward of ``model`` on ``data`` gets ``data.edge_attr``:
    ``data`` has edge features and :func:`takes_edge_attr`."""
    return data.get("edge_attr", None) is not None and takes_edge_attr(model)


def edge_attr_refusal(model: torch.nn.Module, data: Data, who: str,
                      why: str) -> str | None:
    """The one-line refusal of ``who`` (a strategy that cannot carry edge
    features, ``why`` saying what it does instead) for ``model`` on ``data``,
    or ``None`` where the model gets no edge features (:func:`uses_edge_attr`)."""
    if not uses_edge_attr(model, data):
        return None
    return (f"{who}: the graph has edge features (edge_attr "
            f"{tuple(data.edge_attr.shape)}) that {type(model).__name__} takes, "
            f"and {why}")


def takes_batch(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward reads the graph each node belongs to: it
    names a ``batch`` parameter (a graph-level model that pools, e.g. with
    :func:`~torch_geometric.nn.global_mean_pool`) and, for a PyG
    ``BasicGNN``, its norms take it (``supports_norm_batch``: ``GraphNorm``;
    a ``BasicGNN`` reads ``batch`` nowhere else)."""
    return "batch" in _forward_params(type(model)) and bool(
        getattr(model, "supports_norm_batch", True))


def uses_batch(model: torch.nn.Module, data: Data) -> bool:
    """Whether a forward of ``model`` on ``data`` gets ``data.batch``:
    ``data`` holds several graphs (a PyG ``Batch``, or a ``batch`` vector of
    its own) and :func:`takes_batch`."""
    return isinstance(data.get("batch", None), Tensor) and takes_batch(model)


def batch_refusal(model: torch.nn.Module, data: Data, who: str,
                  why: str) -> str | None:
    """The one-line refusal of ``who`` (a strategy that trains node outputs,
    ``why`` saying what it does instead) for a graph-level task, or
    ``None``: ``data`` holds several graphs (``data.batch``) and either
    ``model`` reads them (:func:`takes_batch`; without ``batch`` it would
    pool every node into one graph without a word) or the targets are one
    per graph (``y`` has a row per graph, not per node: the loss pools)."""
    batch = data.get("batch", None)
    if not isinstance(batch, Tensor) or not batch.numel():
        return None
    graphs, y = int(batch.max()) + 1, data.get("y", None)
    if takes_batch(model):
        what = (f"{type(model).__name__} reads the graph of every node "
                f"(data.batch, {graphs} graphs)")
    elif isinstance(y, Tensor) and y.dim() and y.size(0) == graphs and \
            graphs != batch.numel():
        what = (f"the targets are one per graph (y {list(y.shape)} for the "
                f"{graphs} graphs of data.batch)")
    else:
        return None
    return f"{who}: {what}, and {why}"


def forward_kwargs(model: torch.nn.Module, data: Data) -> dict[str, Tensor]:
    """The keyword arguments of a plain forward of ``model`` on ``data``:
    ``edge_weight`` where ``data`` has one, ``edge_attr`` where
    :func:`uses_edge_attr` (a PyG ``GAT(..., edge_dim=D)`` trained without
    them would silently ignore the edge features), ``batch`` where
    :func:`uses_batch` (as a PyG loop over a ``DataLoader`` of graphs passes
    ``data.batch``)."""
    kwargs = {}
    if data.get("edge_weight", None) is not None:
        kwargs["edge_weight"] = data.edge_weight
    if uses_edge_attr(model, data):
        kwargs["edge_attr"] = data.edge_attr
    if uses_batch(model, data):
        kwargs["batch"] = data.batch
    return kwargs


@functools.lru_cache(maxsize=256)
def _takes_data(kind: type) -> bool:
    try:
        params = list(inspect.signature(kind.forward).parameters.values())[1:]
    except (TypeError, ValueError, AttributeError):
        return False
    required = [p for p in params if p.default is p.empty and p.kind in (
        p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1 and required[0].name != "x"


def takes_data(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes the graph itself: one required
    positional parameter besides ``self``, not named ``x`` (PyG's
    introduction writes ``forward(self, data)`` and reads ``data.x``,
    ``data.edge_index`` inside; graph-level examples ``forward(self,
    batch)``)."""
    return _takes_data(type(model))


def call_model(model: torch.nn.Module, data: Data, x: Tensor | None = None,
               adj=None) -> Tensor:
    """A plain forward of ``model`` on ``data``: ``model(data)`` where it
    :func:`takes_data`, else ``model(data.x, data.edge_index, **kwargs)``
    (:func:`forward_kwargs`). Given ``x`` and ``adj`` (DPR's core as a
    sparse matrix, which PyG's convs take in place of ``edge_index``): those
    instead, and no keyword arguments (a shallow copy of ``data`` carries
    them to a model that takes the graph)."""
    if adj is None:
        if takes_data(model):
            return model(data)
        return model(data.x, data.edge_index, **forward_kwargs(model, data))
    if takes_data(model):
        view = copy.copy(data)
        view.x, view.edge_index = x, adj
        return model(view)
    return model(x, adj)


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
    #: whether :meth:`fit_end` trains state of its own (the trainer then
    #: checkpoints that state once more, for predict/evaluate)
    trains_at_fit_end = False
    #: whether this process writes the run directory (rank 0 of a job)
    is_main = True
    #: host bytes of setup state taken over from a plan made in this process
    #: instead of built (resident before :meth:`setup`, so the setup's
    #: measured growth leaves them out; the trainer adds them)
    taken_bytes = 0

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def setup(self, model: torch.nn.Module, train_graphs: list[Data]) -> None:
        """Prepare per-graph state (partitions, cores, ...); default: nothing."""

    def forward(self, model: torch.nn.Module, data: Data) -> Tensor:
        """Plain forward pass of ``model`` on ``data`` (on ``self.device``)."""
        return call_model(model, data.to(self.device))

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn: LossFn) -> float:
        """Forward, loss and backward on one graph; returns the loss value."""
        out = self.forward(model, data)
        loss = loss_fn(out, data.to(self.device))
        loss.backward()
        return float(loss.detach())

    def epoch_start(self, epoch: int) -> None:
        """An epoch's training steps begin (``epoch`` 0-based); default: nothing."""

    def epoch_end(self, epoch: int) -> None:
        """The epoch's training and optimizer steps ended; default: nothing."""

    def epoch_batches(self, order: list[int]) -> list[list[int]]:
        """Training-graph indices of each optimizer step (default: one each)."""
        return [[i] for i in order]

    def train_batch(self, model: torch.nn.Module, graphs: list[Data],
                    loss_fn: LossFn) -> float:
        """Forward, loss and backward of one optimizer step over ``graphs``."""
        if len(graphs) != 1:
            raise ValueError(f"{self.name}: one graph per step, got {len(graphs)}")
        return self.train_step(model, graphs[0], loss_fn)

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


# --------------------------------------------------------------- registry
@dataclass
class StrategyEntry:
    """A registered strategy.

    Args:
        name (str): the strategy's name (``--strategy``).
        target (type or callable or str): a :class:`Strategy` subclass (built
            with ``from_config(cfg)`` when it has one, else ``cls(cfg.device)``),
            a factory ``target(cfg)``, or a lazy ``"module:attr"`` naming one.
        default_model (str): the model a run uses when none is given.
        requires (frozenset of str): model capabilities it needs (see
            :func:`leangnn.nn.models.register_model`).
        choices (dict): configuration field -> its allowed values, or a lazy
            ``"module:attr"`` naming them (e.g. offload's cache policies).
        description (str): one line for help texts.
    """

    name: str
    target: type | Callable | str
    default_model: str
    requires: frozenset[str] = frozenset()
    choices: dict[str, tuple | str] = field(default_factory=dict)
    description: str = ""

    def resolve(self) -> Callable:
        """The class or factory (imports a lazy target once)."""
        if isinstance(self.target, str):
            from leangnn.nn.models import resolve_target

            self.target = resolve_target(self.target, f"strategy {self.name!r}")
        return self.target

    def choices_of(self, option: str) -> tuple | None:
        """Allowed values of configuration field ``option`` (``None``: not
        constrained by this strategy)."""
        spec = self.choices.get(option)
        if isinstance(spec, str):
            from leangnn.nn.models import resolve_target

            spec = self.choices[option] = tuple(resolve_target(
                spec, f"strategy {self.name!r} option {option!r}"))
        return spec


#: strategy name -> :class:`StrategyEntry`; add entries with
#: :func:`register_strategy`.
STRATEGIES: dict[str, StrategyEntry] = {}


def register_strategy(name: str, target: type | Callable | str, *,
                      default_model: str, requires: tuple[str, ...] = (),
                      choices: dict[str, tuple | str] | None = None,
                      description: str = "", replace: bool = False
                      ) -> StrategyEntry:
    """Register a strategy under ``name`` for :func:`build_strategy` and
    ``--strategy`` (see :class:`StrategyEntry` for the arguments).

    ``replace=True`` allows replacing an existing entry.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"strategy name must be an identifier, got {name!r}")
    if name in STRATEGIES and not replace:
        raise ValueError(f"strategy {name!r} is already registered; pass "
                         "replace=True")
    entry = StrategyEntry(name, target, default_model, frozenset(requires),
                          dict(choices or {}), description)
    STRATEGIES[name] = entry
    return entry


def get_strategy(name: str) -> StrategyEntry:
    """The registry entry of ``name``; ``ValueError`` naming the choices."""
    entry = STRATEGIES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"strategy: expected one of {sorted(STRATEGIES)}, "
                         f"got {name!r}")
    return entry


def option_choices(option: str) -> tuple | None:
    """Allowed values of configuration field ``option`` over all registered
    strategies (``None`` when no strategy constrains it)."""
    out: list = []
    for entry in STRATEGIES.values():
        for value in entry.choices_of(option) or ():
            if value not in out:
                out.append(value)
    return tuple(out) or None


def build_strategy(cfg) -> Strategy:
    """The :class:`Strategy` that ``cfg.strategy`` names, built from ``cfg``
    (a :class:`~leangnn.config.TrainConfig`)."""
    target = get_strategy(cfg.strategy).resolve()
    if hasattr(target, "from_config"):
        return target.from_config(cfg)
    if isinstance(target, type) and issubclass(target, Strategy):
        return target(cfg.device)
    return target(cfg)


# Reversibility lives in the model (GSRGNN's fused autograd Function); the
# loop itself is plain full-batch training.
register_strategy("full", FullBatch, default_model="dag",
                  description="full-batch training with plain autograd")
register_strategy("reversible", FullBatch, default_model="gsr",
                  requires=("reversible",),
                  description="full-batch training of a reversible model (GSR)")
register_strategy("prune", "leangnn.prune.dpr:DPRStrategy", default_model="sage",
                  choices={"decoder": "leangnn.prune.decoder:DECODER_CHOICES"},
                  description="train on a pruned core, reconstruct the rest (DPR)")
# The offload engine runs PyG BasicGNNs layer by layer (see
# leangnn.offload.layerwise.LayerwiseModel).
register_strategy("offload", "leangnn.offload:OffloadStrategy", default_model="sage",
                  requires=("layerwise",),
                  choices={"cache": "leangnn.offload.cache:POLICIES",
                           "offload_mode": "leangnn.offload.engine:MODES"},
                  description="exact partitioned training beyond device memory")
register_strategy("distributed", "leangnn.distributed.strategy:DistributedStrategy",
                  default_model="res",
                  choices={"dist_mode": ("auto", "graph", "data")},
                  description="exact multi-process training on torch.distributed")
