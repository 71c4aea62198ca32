"""Checks of what a user hands :func:`leangnn.plan` and :func:`leangnn.fit`.

Each refuses, in one line naming the argument and the value received, what
the planner's dry run would let through and the first real step (or a later
one) would fail on: a model or graph of another kind, a device this machine
has not got, a parameter on the ``meta`` device, unknown strategy names, a
non-positive epoch count, a NaN clipping norm, features of another float
type than the model's, and a ``loss_fn`` whose return value ``backward``
cannot take; :func:`with_train_mask` makes PyG's ``train_mask`` the nodes
trained on.
"""

from __future__ import annotations

import itertools
import math
import numbers

import torch
from torch_geometric.data import Data

from leangnn.data import split_mask, with_mask
from leangnn.utils import _first_line

__all__ = ["STRATEGIES", "LossFnError", "error_line", "checked_loss", "check_args",
           "num_classes", "check_dtypes", "with_train_mask", "materialize_lazy"]

#: the strategies a user's model is planned with (``strategies=``)
STRATEGIES = ("full", "reversible", "offload", "prune")


def error_line(e: BaseException) -> str:
    """``Type: first line of the message`` (a row's reason, an error's tail)."""
    line = _first_line(e)
    return line if line == type(e).__name__ else f"{type(e).__name__}: {line}"


class LossFnError(ValueError):
    """``loss_fn`` returned no loss to backpropagate (not the model's error)."""


def checked_loss(loss_fn):
    """``loss_fn`` refusing a return value ``backward`` cannot take, in one
    line naming it (a float or ``None`` failed as a bare AttributeError)."""
    if loss_fn is None:
        return None

    def checked(out, data):
        loss = loss_fn(out, data)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = (f"a tensor of shape {list(loss.shape)}"
                   if isinstance(loss, torch.Tensor) else type(loss).__name__)
            raise LossFnError("loss_fn: must return the loss as a one-element "
                               f"tensor to backpropagate, got {got}")
        return loss

    return checked


def check_args(model, data, device, strategies, epochs, clip_norm,
               lr=None) -> None:
    """Refuse arguments :func:`plan` and :func:`fit` cannot use, each in one
    line naming the argument and the value, before anything runs on them."""
    from leangnn.config import _check_device

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got "
                         f"{type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        # (the dry run's backward would fail with "element 0 of tensors does
        # not require grad"; a lazy model's uninitialised parameters count)
        raise ValueError(f"model: {type(model).__name__} has no trainable "
                         "parameters (none with requires_grad=True); nothing to "
                         "train")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, numbers.Real)
                           or not math.isfinite(lr) or lr < 0):
        raise ValueError(f"lr: expected a finite number >= 0, got {lr!r}")
    if not isinstance(data, Data):
        # a list of graphs or a HeteroData has no data.x: say what it is instead
        raise ValueError(f"data: expected one torch_geometric.data.Data graph, got "
                         f"{type(data).__name__}")
    if data.get("edge_index", None) is None and data.get("adj_t", None) is not None:
        raise ValueError("data: has adj_t but no edge_index; leangnn plans and "
                         "trains from data.edge_index (build the Data without "
                         "ToSparseTensor)")
    # the CLI's check: cpu, cuda or cuda:i that exists
    _check_device(device, fallback="device='cpu'")
    if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        raise ValueError("model: its parameters are on the meta device (shapes "
                         "only, no values to train); build it on a real device or "
                         "materialize it (to_empty) and load its weights")
    if strategies is not None:
        if isinstance(strategies, str) or not all(
                isinstance(s, str) for s in strategies):
            raise ValueError(f"strategies: expected a tuple of names from "
                             f"{STRATEGIES}, got {strategies!r}")
        unknown = [s for s in strategies if s not in STRATEGIES]
        if unknown:
            raise ValueError(f"strategies: unknown {unknown!r}; expected names "
                             f"from {STRATEGIES}")
    if epochs is not None and (isinstance(epochs, bool) or
                               not isinstance(epochs, numbers.Integral) or
                               epochs < 1):
        raise ValueError(f"epochs: expected a positive int, got {epochs!r}")
    if clip_norm is not None and (isinstance(clip_norm, bool) or
                                  not isinstance(clip_norm, numbers.Real) or
                                  not math.isfinite(clip_norm) or clip_norm < 0):
        # a NaN norm turns every weight into NaN from the second step on
        raise ValueError(f"clip_norm: expected a finite number >= 0 or None (no "
                         f"clipping), got {clip_norm!r}")


def num_classes(model: torch.nn.Module, data: Data, loss_fn) -> int | None:
    """The class count the default loss's ``y`` must stay below: the model's
    ``out_channels`` (PyG's models and ours have it), else ``None``."""
    y = data.get("y", None)
    if loss_fn is not None or not isinstance(y, torch.Tensor) or \
            y.is_floating_point():
        return None  # a regression target, or a loss of the user's own
    classes = getattr(model, "out_channels", None)
    return classes if isinstance(classes, int) and not isinstance(classes, bool) \
        else None


def check_dtypes(model: torch.nn.Module, data: Data) -> None:
    """Refuse features of another float type than the model's parameters: the
    dry run's fake tensors let them through, the first real step fails."""
    x = data.x
    own = next((p for p in model.parameters() if p.is_floating_point()), None)
    if own is not None and x.is_floating_point() and x.dtype != own.dtype:
        dt = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
        raise ValueError(f"data: x is {dt(x)}, the model's parameters are "
                         f"{dt(own)}; convert one to the other (e.g. "
                         f"data.x = data.x.to(torch.{dt(own)}))")


def with_train_mask(data: Data, loss_fn) -> Data:
    """``data`` (a shallow copy where it changes) whose ``node_mask``, the
    nodes the default loss and DPR's decoder learn from, is PyG's
    ``train_mask`` where the graph has one and no ``node_mask``: a Planetoid
    or OGB-style graph otherwise trained on every label, its test nodes'
    included, without a word.

    Raises:
        ValueError: the default loss (``loss_fn`` ``None``) would take a
            ``train_mask`` that is no bool tensor of one entry per node (an
            index tensor: make it a mask, or set ``node_mask``), or one
            that selects no node.
    """
    mask = data.get("train_mask", None)
    if mask is None or data.get("node_mask", None) is not None:
        return data
    n = data.num_nodes
    x = data.get("x", None)
    if isinstance(x, torch.Tensor) and x.dim() and x.size(0) != n:
        return data  # check_graph names the graph's own mismatch first
    if split_mask(data, "train") is None:
        if loss_fn is not None:
            return data  # the user's loss reads it as it likes
        got = (f"{str(mask.dtype).removeprefix('torch.')} {list(mask.shape)}"
               if isinstance(mask, torch.Tensor) else type(mask).__name__)
        raise ValueError(f"data: train_mask must be a bool tensor of shape [{n}] "
                         f"(the nodes the default loss trains on), got {got}; set "
                         "data.node_mask, or pass loss_fn(out, data)")
    if n and not bool(mask.any()):
        if loss_fn is not None:
            return data
        # (check_graph would name the node_mask the user never set)
        raise ValueError(f"data: train_mask selects no node (all {n} entries "
                         "False); the loss over no node is NaN")
    return with_mask(data, mask)


def materialize_lazy(model: torch.nn.Module, data: Data) -> bool:
    """Initialise the parameters of a lazily built ``model`` (PyG's
    ``in_channels=-1``, torch's ``Lazy*`` modules) by one forward without
    gradients, in eval mode, on two nodes of ``data``: PyG's recipe is one
    such forward on the whole graph, but the shapes need only the features'
    width. Returns whether there was anything to initialise.

    Why: an uninitialised parameter has no shape, so the dry run failed
    ("Attempted to use an uninitialized parameter") and every row with it.
    """
    from torch.nn.parameter import is_lazy

    from leangnn.strategy import call_model

    if not any(is_lazy(p) for p in model.parameters()):
        return False
    small = data.subgraph(torch.arange(min(2, int(data.num_nodes))))
    training = model.training
    model.eval()  # (no dropout draw, no batch statistics of two nodes)
    try:
        with torch.no_grad():
            call_model(model, small)
    except Exception as e:  # noqa: BLE001 - said in one line, with the fix
        raise ValueError(f"leangnn.plan: {type(model).__name__} is lazily "
                         "initialised and failed in the forward on two nodes that "
                         f"shapes it ({error_line(e)}); run one forward yourself "
                         "first (PyG's recipe: with torch.no_grad(): "
                         "model(data.x, data.edge_index))") from e
    finally:
        model.train(training)
    return True
