"""Vertex data of full-batch training: the reference need budgets are cut from.

Full-batch training of an ``L``-layer GNN keeps, per node, the input features,
every layer's output and the gradient of every layer's output on the device,
beside the parameters with their gradients and optimizer moments. That sum is
the "full-batch need" the offload benchmarks and tests express budgets in
(e.g. 25% of it). It is a lower bound: PyG's real peak also holds per-edge
messages, which depend on the conv and are measured, not estimated here.
"""

from __future__ import annotations

import torch

__all__ = ["layer_widths", "full_batch_vertex_bytes"]


def layer_widths(model: torch.nn.Module) -> list[int]:
    """Per-layer widths ``[in, hidden, ..., hidden, out]`` of a PyG
    ``BasicGNN`` (``GCN``, ``GraphSAGE``, ``GAT``, ``GIN``, ...)."""
    names = ("in_channels", "hidden_channels", "out_channels", "num_layers")
    missing = [n for n in names if getattr(model, n, None) is None]
    if missing:
        raise ValueError(f"model {type(model).__name__} has no {', '.join(missing)}; "
                         "expected a PyG BasicGNN (GCN, GraphSAGE, GAT, GIN)")
    num_layers = int(model.num_layers)
    return ([int(model.in_channels)] + [int(model.hidden_channels)] * (num_layers - 1)
            + [int(model.out_channels)])


def full_batch_vertex_bytes(model: torch.nn.Module, num_nodes: int,
                            resident_factor: int = 4) -> int:
    """Device bytes of full-batch training's vertex data plus the parameters.

    Args:
        model (BasicGNN): the model; its parameters' dtype sets the element size.
        num_nodes (int): nodes of the graph.
        resident_factor (int, optional): parameter copies on the device
            (weights, gradients, two Adam moments). (default: ``4``)

    Returns:
        ``num_nodes * (sum(widths) + sum(widths[1:])) * element_size`` (the
        features, every layer's output and its gradient) plus
        ``resident_factor`` times the parameter bytes.
    """
    widths = layer_widths(model)
    params = list(model.parameters())
    elem = params[0].element_size()
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    rows = sum(widths) + sum(widths[1:])
    return int(num_nodes) * rows * elem + resident_factor * param_bytes
