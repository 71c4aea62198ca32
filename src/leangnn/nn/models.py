"""Models: deep GSR and residual GNNs and shallow PyG baselines, built by name.

* ``gsr``: :class:`GSRGNN`, encoder -> :class:`~leangnn.nn.reversible.GSRStack`
  -> head (GSR-GNN, DAC 2026); activation memory independent of depth.
* ``res``: :class:`ResGNN`, the same pre-activation blocks
  (:class:`~leangnn.nn.reversible.GSRBlock`: norm -> group-sparse activation ->
  dropout -> conv) in plain residual form under plain autograd (DeepGCN res+).
* ``gcn`` / ``sage`` / ``gat`` / ``gin``: PyG's shallow
  :class:`~torch_geometric.nn.models.GCN`,
  :class:`~torch_geometric.nn.models.GraphSAGE`,
  :class:`~torch_geometric.nn.models.GAT` and
  :class:`~torch_geometric.nn.models.GIN` (Xu et al., ICLR 2019).

Every model is registered by name in :data:`MODELS` (see
:func:`register_model`); the CLI's ``--model`` choices, the configuration's
checks and :func:`build_model` all read that registry, so a new model is one
``register_model`` line (its target may be a lazy ``"module:Class"`` string).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from leangnn.nn.group_sparse import resolve_k
from leangnn.nn.reversible import CONVS, ConvSpec, GSRBlock, GSRStack, build_conv

__all__ = ["CONVS", "build_conv", "GSRGNN", "ResGNN", "ModelEntry", "MODELS",
           "register_model", "get_model", "model_arguments", "build_model",
           "registered_name",
           "resolve_target"]


def _conv_name(conv: ConvSpec) -> str:
    return conv if isinstance(conv, str) else getattr(conv, "__name__", "custom")


class GSRGNN(torch.nn.Module):
    r"""Grouped-Sparse-Reversible GNN: encoder -> GSRStack -> norm/ReLU -> head.

    From "GSR-GNN: Training Acceleration and Memory-Saving Framework of Deep
    GNNs on Circuit Graph" (Luo et al., DAC 2026), with the grouped reversible
    coupling of RevGNN (Li et al., ICML 2021). Trains hundreds of layers at the
    activation memory of one.

    Args:
        in_channels (int): input feature size.
        hidden_channels (int): width ``C`` (divisible by ``num_groups``).
        out_channels (int): output size.
        num_layers (int): reversible layers ``L``.
        num_groups (int, optional): groups ``G >= 2``. (default: ``2``)
        conv (str or callable, optional): see
            :func:`~leangnn.nn.reversible.build_conv`. (default: ``"sage"``)
        sparsity (int or float, optional): winners per group of ``C / G``
            channels, or kept fraction; ``None`` is ReLU. (default: ``None``)
        dropout (float, optional): shared dropout in the stack and dropout
            before the head. (default: ``0.0``)
        disable (bool, optional): plain autograd through the same parameters
            (the reference; no memory saving). (default: ``False``)
        exact_stream (bool, optional): float64 residual stream for a bit-exact
            reconstruction, see :class:`~leangnn.nn.reversible.GSRStack`.
            (default: ``True``)
        flat_parameters (bool, optional): the stack's parameters in one flat
            tensor (one gradient, one set of optimizer moments), see
            :class:`~leangnn.nn.reversible.GSRStack`. (default: ``True``)
        kernels (bool, optional): group functions of GCN, SAGE (mean) and GAT
            convs run through CSR kernels (:mod:`leangnn.nn.csr`; equal to
            the PyG convs to rounding); ``False`` runs the PyG convs.
            (default: ``True``)
        keep_graph (bool, optional): a step's backward reuses its forward's
            CSR layout (see :class:`~leangnn.nn.reversible.GSRStack`).
            (default: ``True``)
        **conv_kwargs: passed to every conv.

    Shapes:
        **input:** ``x [N, in_channels]``, ``edge_index [2, E]``
        **output:** ``[N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, num_groups: int = 2, conv: ConvSpec = "sage",
                 sparsity: int | float | None = None, dropout: float = 0.0,
                 disable: bool = False, exact_stream: bool = True,
                 flat_parameters: bool = True, kernels: bool = True,
                 keep_graph: bool = True, **conv_kwargs):
        super().__init__()
        self._options = dict(
            in_channels=in_channels, hidden_channels=hidden_channels,
            out_channels=out_channels, num_groups=num_groups, conv=conv,
            sparsity=sparsity, dropout=dropout, disable=disable,
            exact_stream=exact_stream, flat_parameters=flat_parameters,
            kernels=kernels, keep_graph=keep_graph, **conv_kwargs)
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers = out_channels, num_layers
        self.dropout = dropout
        self.encoder = torch.nn.Linear(in_channels, hidden_channels)
        self.stack = GSRStack(hidden_channels, num_layers, num_groups, conv,
                              sparsity, dropout, disable,
                              exact_stream=exact_stream,
                              flat_parameters=flat_parameters, kernels=kernels,
                              keep_graph=keep_graph, **conv_kwargs)
        self.out_norm = torch.nn.LayerNorm(hidden_channels)
        self.head = torch.nn.Linear(hidden_channels, out_channels)

    def with_depth(self, num_layers: int) -> GSRGNN:
        """A model of this class and these options at another depth, fresh
        weights, this one's dtype, device and mode: the planner traces two
        shallow ones to extrapolate a stack too long to trace."""
        return _twin(self, num_layers)

    @property
    def disable(self) -> bool:
        """Whether the stack runs under plain autograd."""
        return self.stack.disable

    @disable.setter
    def disable(self, value: bool) -> None:
        self.stack.disable = bool(value)

    def reset_parameters(self) -> None:
        for m in (self.encoder, self.stack, self.out_norm, self.head):
            m.reset_parameters()

    def forward(self, x: Tensor, edge_index, *args, **kwargs) -> Tensor:
        h = self.stack(self.encoder(x), edge_index, *args, **kwargs)
        h = F.dropout(F.relu(self.out_norm(h)), p=self.dropout,
                      training=self.training)
        return self.head(h)

    def __repr__(self) -> str:
        s = self.stack
        k = "relu" if s.k is None else s.k
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.hidden_channels}, {self.out_channels}, "
                f"num_layers={self.num_layers}, num_groups={s.num_groups}, "
                f"conv={s.conv_name}, k={k})")


class ResGNN(torch.nn.Module):
    r"""Deep residual GNN with pre-activation blocks, trained by plain autograd.

    From DeepGCN (Li et al., ICCV 2019) as used by RevGNN: an encoder, ``L``
    blocks :math:`h \leftarrow h + \mathrm{conv}(\mathrm{drop}(\sigma(
    \mathrm{norm}(h))))` at full width ``C``, then a head. The blocks are
    :class:`~leangnn.nn.reversible.GSRBlock`, the same as in :class:`GSRGNN`,
    with :math:`\sigma` the group-sparse activation over groups of
    ``C / num_groups`` channels (ReLU when ``sparsity`` is ``None``) and a
    fresh dropout mask per layer. Activations grow as :math:`O(L N C)`.

    Args:
        in_channels (int): input feature size.
        hidden_channels (int): width of every block.
        out_channels (int): output size.
        num_layers (int): number of residual blocks ``L``.
        conv (str or callable, optional): conv type, see :func:`build_conv`.
            (default: ``"sage"``)
        dropout (float, optional): dropout inside blocks. (default: ``0.0``)
        num_groups (int, optional): activation groups per node. (default: ``1``)
        sparsity (int or float, optional): winners per activation group.
            (default: ``None``)
        **conv_kwargs: passed to every conv.

    Shapes:
        **input:** ``x [N, in_channels]``, ``edge_index [2, E]``
        **output:** ``[N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, conv: ConvSpec = "sage", dropout: float = 0.0,
                 num_groups: int = 1, sparsity: int | float | None = None,
                 **conv_kwargs):
        super().__init__()
        if not isinstance(num_groups, int) or num_groups < 1 or \
                hidden_channels % num_groups:
            raise ValueError(f"num_groups must be a positive divisor of "
                             f"hidden_channels={hidden_channels}, got {num_groups!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self._options = dict(
            in_channels=in_channels, hidden_channels=hidden_channels,
            out_channels=out_channels, conv=conv, dropout=dropout,
            num_groups=num_groups, sparsity=sparsity, **conv_kwargs)
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers = out_channels, num_layers
        self.conv_name, self.dropout = _conv_name(conv), dropout
        group_size = hidden_channels // num_groups
        self.k = resolve_k(sparsity, group_size)
        self.encoder = torch.nn.Linear(in_channels, hidden_channels)
        self.blocks = torch.nn.ModuleList(
            GSRBlock(hidden_channels, conv, self.k, group_size, **conv_kwargs)
            for _ in range(num_layers))
        self.out_norm = torch.nn.LayerNorm(hidden_channels)
        self.head = torch.nn.Linear(hidden_channels, out_channels)

    def with_depth(self, num_layers: int) -> ResGNN:
        """See :meth:`GSRGNN.with_depth`."""
        return _twin(self, num_layers)

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        for m in [*self.blocks, self.out_norm, self.head]:
            m.reset_parameters()

    def forward(self, x: Tensor, edge_index, *args, **kwargs) -> Tensor:
        h = self.encoder(x)
        drop = self.training and self.dropout > 0
        scale = 1.0 / (1.0 - self.dropout) if drop else 1.0
        for block in self.blocks:
            keep = None
            if drop:
                keep = torch.empty(h.shape, dtype=torch.bool, device=h.device)
                keep.bernoulli_(1.0 - self.dropout)
            h = h + block(h, edge_index, *args, keep=keep, scale=scale, **kwargs)
        h = F.dropout(F.relu(self.out_norm(h)), p=self.dropout,
                      training=self.training)
        return self.head(h)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.hidden_channels}, {self.out_channels}, "
                f"num_layers={self.num_layers}, conv={self.conv_name})")


def _twin(model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    first = next(model.parameters(), None)
    twin = type(model)(num_layers=num_layers, **model._options)
    if first is not None:
        twin = twin.to(device=first.device, dtype=first.dtype)
    return twin.train(model.training)


def _shallow(cls):
    # PyG's BasicGNN takes (in, hidden, num_layers, out); the registry's
    # constructors take (in, hidden, out, num_layers), and the signature names
    # only what the baseline uses, so build_model drops the rest.
    def make(in_channels: int, hidden_channels: int, out_channels: int,
             num_layers: int, dropout: float = 0.0) -> torch.nn.Module:
        return cls(in_channels, hidden_channels, num_layers, out_channels,
                   dropout=dropout)
    make.__name__ = make.__qualname__ = cls.__name__
    make.__doc__ = f"PyG's shallow :class:`{cls.__name__}` (no jumping knowledge)."
    make.model_class = cls  # what it builds (registered_name)
    return make


def resolve_target(target: Callable | str, what: str = "target") -> Callable:
    """``target`` itself, or the object a lazy ``"package.module:attr"`` names.

    Lazy targets keep registries cheap to import: the module is imported only
    when the entry is first used.
    """
    if not isinstance(target, str):
        return target
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what}: expected 'package.module:attr', got {target!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class ModelEntry:
    """A registered model: its constructor and what it can do.

    Args:
        name (str): the model's name (``--model``).
        target (callable or str): ``ctor(in_channels, hidden_channels,
            out_channels, num_layers, **options)``, or a lazy
            ``"module:attr"`` naming it.
        capabilities (frozenset of str): what strategies may require, e.g.
            ``"reversible"`` (activation memory independent of depth) or
            ``"layerwise"`` (a PyG ``BasicGNN`` the offload engine runs layer
            by layer).
        description (str): one line for help texts.
        defaults (dict): run settings this model trains best with when the
            user gives none (``num_layers``, ``hidden_channels``, ``epochs``).
    """

    name: str
    target: Callable | str
    capabilities: frozenset[str] = frozenset()
    description: str = ""
    defaults: dict = field(default_factory=dict)

    def resolve(self) -> Callable:
        """The constructor (imports a lazy target once)."""
        if isinstance(self.target, str):
            self.target = resolve_target(self.target, f"model {self.name!r}")
        return self.target

    def options(self) -> dict[str, inspect.Parameter]:
        """The options the constructor names (beyond the four sizes)."""
        params = list(inspect.signature(self.resolve()).parameters.values())
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                  p.KEYWORD_ONLY)]
        return {p.name: p for p in named[4:]}

    @property
    def reversible(self) -> bool:
        return "reversible" in self.capabilities


#: model name -> :class:`ModelEntry`; add entries with :func:`register_model`.
MODELS: dict[str, ModelEntry] = {}


def register_model(name: str, target: Callable | str, *, reversible: bool = False,
                   layerwise: bool = False, capabilities: tuple[str, ...] = (),
                   description: str = "", defaults: dict | None = None,
                   replace: bool = False) -> ModelEntry:
    """Register a model under ``name`` for :func:`build_model` and ``--model``.

    Args:
        name (str): the name.
        target (callable or str): the constructor, called as
            ``target(in_channels, hidden_channels, out_channels, num_layers,
            **options)``, or a lazy ``"module:attr"`` string.
        reversible (bool, optional): activation memory independent of depth
            (what ``--strategy reversible`` requires). (default: ``False``)
        layerwise (bool, optional): a PyG ``BasicGNN`` that the offload engine
            can run layer by layer. (default: ``False``)
        capabilities (tuple of str, optional): further capability names.
        description (str, optional): one line for help texts.
        defaults (dict, optional): ``num_layers`` / ``hidden_channels`` /
            ``epochs`` / ``lr`` a run of this model uses when none is given;
            under ``"tasks"``, per-task overrides of those (e.g.
            ``{"critical": {"lr": 1e-3}}``).
        replace (bool, optional): allow replacing an existing entry.
            (default: ``False``)
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"model name must be an identifier, got {name!r}")
    if name in MODELS and not replace:
        raise ValueError(f"model {name!r} is already registered; pass replace=True")
    caps = set(capabilities) | {c for c, on in (("reversible", reversible),
                                                ("layerwise", layerwise)) if on}
    entry = ModelEntry(name, target, frozenset(caps), description,
                       dict(defaults or {}))
    MODELS[name] = entry
    return entry


def get_model(name: str) -> ModelEntry:
    """The registry entry of ``name``; ``ValueError`` naming the choices."""
    entry = MODELS.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    return entry


def model_arguments(name: str, **options) -> dict:
    """The ``options`` that model ``name`` takes: names its constructor does
    not list are dropped, and so are ``None`` values (the model's default)."""
    accepted = get_model(name).options()
    return {k: v for k, v in options.items() if k in accepted and v is not None}


register_model("gsr", GSRGNN, reversible=True,
               description="grouped reversible GSR-GNN (depth-independent memory)")
register_model("res", ResGNN, description="deep residual GNN, plain autograd")
register_model("gcn", _shallow(GCN), layerwise=True, description="shallow PyG GCN")
register_model("sage", _shallow(GraphSAGE), layerwise=True,
               description="shallow PyG GraphSAGE")
register_model("gat", _shallow(GAT), layerwise=True, description="shallow PyG GAT")
register_model("gin", _shallow(GIN), layerwise=True, description="shallow PyG GIN")
# Propagates in topological order: needs a DAG (circuits, not csbm graphs).
register_model("dag", "leangnn.nn.dag:DAGNN", capabilities=("dag",),
               description="topological DAG propagation (DAGNN / DeepGate2 / "
               "TimingPredict style), activation memory independent of depth",
               # measured by benchmarks/circuit_models.py: small MLPs suffice
               # (the propagation depth is the circuit's), and train in minutes
               # `critical`: narrow and slow (0.915 vs 0.866 test accuracy at 32
               # and lr 3e-3, benchmarks/circuit_models.py, 3 seeds)
               defaults={"num_layers": 2, "hidden_channels": 32, "epochs": 40,
                         "tasks": {"critical": {"hidden_channels": 8,
                                                "lr": 1e-3}}})


def registered_name(model: torch.nn.Module) -> str | None:
    """The first registered name whose constructor builds ``model``'s very
    class (not a subclass, whose forward may differ), or ``None``."""
    for name, entry in MODELS.items():
        target = entry.resolve()
        if type(model) is getattr(target, "model_class", target):
            return name
    return None


def build_model(name: str, in_channels: int, hidden_channels: int,
                out_channels: int, num_layers: int, **options) -> torch.nn.Module:
    """Build a registered model by name (see :data:`MODELS`).

    ``options`` may carry any model option (``conv``, ``dropout``,
    ``num_groups``, ``sparsity``, ``flat_parameters``, ...): each model gets
    the ones its constructor names, and ``None`` means "model default", so a
    caller can pass every option of a configuration without knowing which
    model takes which. Extra conv keyword arguments need the class itself.
    """
    entry = get_model(name)
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or \
            num_layers < 1:
        raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
    return entry.resolve()(in_channels, hidden_channels, out_channels, num_layers,
                           **model_arguments(name, **options))
