"""The calibrated heap family a user's model plans with.

The planner's estimate of a CPU run's peak scales the traced heap bytes by a
factor measured per op mix (:func:`~leangnn.plan.calibration.heap_families`:
``gcn``, ``sage``, ``gat``, ``gin``, ``res-*``, ``gsr-*``, ``dag-*``). A
model our registry trains by name has its family; :func:`calibrated_as`
finds the family of any other model where it has one (a wrapper of one
registered model, a stack of one family's PyG convs), else the largest
factor measured applies.
"""

from __future__ import annotations

from typing import Any

import torch

from leangnn.plan.dag import is_dag_model

__all__ = ["calibrated_as", "model_name", "CONV_FAMILIES"]


def model_name(model: torch.nn.Module) -> str:
    """``model``'s class name as a plan names it: ``GraphSAGE (compiled)``
    for a ``torch.compile`` of a ``GraphSAGE``."""
    from leangnn.offload.layerwise import uncompiled

    inner = uncompiled(model)
    return type(model).__name__ if inner is model else \
        f"{type(inner).__name__} (compiled)"


def calibrated_as(model: torch.nn.Module) -> dict[str, Any]:
    """The knobs of a plan row of ``model``: its class name (``model``), and
    where :mod:`leangnn.nn.models` registers its very class
    (:func:`~leangnn.nn.models.registered_name`: PyG's ``GCN``,
    ``GraphSAGE``, ``GAT`` and ``GIN``, our ``ResGNN`` and ``GSRGNN``; a
    subclass, whose forward may differ, is not) or it is a ``DAGNN`` (its
    levels sweep however it is subclassed), the registry's name as its
    ``family``, with its conv, groups or state width, which select the calibrated
    heap factor (:func:`~leangnn.plan.calibration.heap_families`).

    A model of another class that wraps models of one family (and knobs),
    e.g. a ``GraphSAGE`` under a linear head or a graph pooling, plans with
    that family's factor: the wrapper's own ops are traced as any are; so
    does a stack of PyG convs of one family's kind
    (:data:`CONV_FAMILIES`, e.g. ``SAGEConv`` layers with residuals). A
    model with no family inside, or several, or another conv (PNA, EdgeConv,
    TransformerConv) gets the largest factor
    measured, so its plan errs towards not fitting. Measured through
    :func:`fit` on a 20k-node csbm graph, a PyG ``GAT`` planned +100% over
    its measured peak as a model of its own, and -7% as ``gat``; five
    wrappers (a head on GCN, GraphSAGE or GAT, a GraphSAGE beside an MLP, a
    pooled GraphSAGE on 40 graphs) +28% to +45% over with the largest
    factor, +10% to +29% with their GNN's.
    """
    own: dict[str, Any] = {"model": model_name(model)}
    knobs = _family_knobs(model)
    if knobs is None:
        inner = _wrapped_families(model) or _conv_families(model)
        knobs = inner[0] if len(inner) == 1 else {}
    return {**own, **knobs}


#: PyG convs of the registered ``BasicGNN`` families: a user's own stack of
#: one of them (and no other message passing) plans with that family's
#: heap factor
CONV_FAMILIES = {"GCNConv": "gcn", "SAGEConv": "sage", "GATConv": "gat",
                 "GATv2Conv": "gat", "GINConv": "gin"}


def _conv_families(model: torch.nn.Module) -> list[dict[str, Any]]:
    """``[{"family": f}]`` where every message-passing layer of ``model`` is
    a PyG conv of one family of :data:`CONV_FAMILIES` (its very class: a
    subclass may pass other messages), else ``[]``."""
    from torch_geometric.nn.conv import MessagePassing

    fams = set()
    for m in model.modules():
        if isinstance(m, MessagePassing):
            kind = type(m)
            known = kind.__module__.startswith("torch_geometric.")
            fams.add(CONV_FAMILIES.get(kind.__name__) if known else None)
    if len(fams) != 1 or None in fams:
        return []
    return [{"family": fams.pop()}]


def _family_knobs(model: torch.nn.Module) -> dict[str, Any] | None:
    """``family`` and the knobs that select its heap factor, for a model of
    a class our registry trains (else ``None``)."""
    from leangnn.nn.models import registered_name

    family = "dag" if is_dag_model(model) else registered_name(model)
    if family is None:
        return None
    own: dict[str, Any] = {"family": family}
    if family == "dag":
        own["hidden_channels"] = model.hidden_channels
    elif family == "res":
        own["conv"] = model.conv_name
    elif family == "gsr":
        own["conv"] = model.stack.conv_name
        own["num_groups"] = model.stack.num_groups
    return own


def _wrapped_families(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The distinct :func:`_family_knobs` of the outermost registered models
    inside ``model``."""
    found: list[dict[str, Any]] = []
    for child in model.children():
        knobs = _family_knobs(child)
        for k in [knobs] if knobs is not None else _wrapped_families(child):
            if k not in found:
                found.append(k)
    return found
