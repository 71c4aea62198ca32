"""A real training step of a user's model on a piece of DPR's core.

The dry run's fake tensors accept what the core's real layout breaks: an
aggregation that scatters (PNA, TransformerConv, SAGEConv's ``std``) reads
the core's CSR int32 indices as its index and fails at the first step of
:func:`leangnn.fit`. :func:`probe_core` runs one step on a few of the core's
edges, at a cost independent of the graph's size, so that the plan's prune
rows say so instead.
"""

from __future__ import annotations

import copy

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_edge_index

from leangnn.graphs.sparse import adj_t_of
from leangnn.plan.user_checks import LossFnError, error_line
from leangnn.strategy import call_model

__all__ = ["PROBE_EDGES", "PROBE_RTOL", "piece_of_core", "probe_core",
           "known_on_csr"]

#: edges of DPR's core a prune row's probe trains on for real
PROBE_EDGES = 64


def piece_of_core(core: Data, edges: int = PROBE_EDGES) -> Data:
    """A few edges of DPR's core (its first ``edges`` entries and their end
    nodes) as a graph of the same layout: a CSR ``adj_t`` with the core's
    index dtype, or an ``edge_index`` for a core kept as an edge list, and
    the node tensors of those nodes."""
    if core.get("adj_t", None) is None:
        return _piece_of_edges(core, edges)
    adj = core.adj_t
    crow, col, val = adj.crow_indices(), adj.col_indices(), adj.values()
    m = min(edges, col.numel())
    row = torch.searchsorted(crow, torch.arange(m, dtype=crow.dtype,
                                                device=crow.device), right=True) - 1
    n = int(core.num_nodes)
    nodes = torch.unique(torch.cat([row.long(), col[:m].long()])) if m else \
        torch.arange(min(n, 2), device=crow.device)
    k = nodes.numel()
    new_row = torch.searchsorted(nodes, row.long())
    counts = torch.bincount(new_row, minlength=k)
    new_crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(crow.dtype)
    new_col = torch.searchsorted(nodes, col[:m].long()).to(col.dtype)
    piece = Data(adj_t=torch.sparse_csr_tensor(new_crow, new_col, val[:m], (k, k)),
                 num_nodes=k)
    return _with_nodes(piece, core, nodes, "adj_t")


def _piece_of_edges(core: Data, edges: int) -> Data:
    n = int(core.num_nodes)
    ei = core.edge_index[:, :edges]
    nodes = torch.unique(ei.reshape(-1)) if ei.numel() else \
        torch.arange(min(n, 2), device=ei.device)
    piece = Data(edge_index=torch.searchsorted(nodes, ei.contiguous()),
                 num_nodes=nodes.numel())
    return _with_nodes(piece, core, nodes, "edge_index")


def _with_nodes(piece: Data, core: Data, nodes: torch.Tensor, layout: str) -> Data:
    """``piece`` with ``core``'s node tensors at ``nodes`` and its other
    entries as they are (``layout``: the core's edges, in the piece already)."""
    n = int(core.num_nodes)
    for key, value in core.items():
        if key in (layout, "num_nodes"):
            continue
        node_level = isinstance(value, torch.Tensor) and value.dim() and \
            value.size(0) == n
        piece[key] = value[nodes.to(value.device)] if node_level else value
    return piece


def known_on_csr(model: torch.nn.Module) -> bool:
    """Whether ``model`` is one of ours (its very class) whose convs run on
    DPR's CSR core through :mod:`leangnn.nn.csr`'s kernels, tested against
    edge lists: no probe needed. The probe's copy of a GSR of 128 layers x
    64 groups took 9.2 s and +395 MiB."""
    from leangnn.nn.models import GSRGNN, ResGNN

    return type(model) in (GSRGNN, ResGNN)


def probe_core(model: torch.nn.Module, core: Data, loss_fn, device: torch.device
                ) -> str | None:
    """``None`` when a real training step of ``model`` on a piece of DPR's
    core runs and, on a CSR core, computes what the same edges as an edge
    list give; else why not, in one line.

    The dry run's fake tensors accept what the core's real layout breaks: an
    aggregation that scatters (PNA, TransformerConv, SAGEConv's ``std``)
    reads the CSR's int32 indices as its index and fails at the first step
    of :func:`fit`. Some do not fail but compute wrong gradients: EdgeCNN's
    max aggregation over a CSR adjacency gave the right outputs and NaN
    gradients (a 100-node core). So the probe also runs the step on the same
    edges as an edge list (the layout of the model's full-batch training):
    the CSR step must have finite gradients where that one does, and equal
    it (in eval mode, on the piece's entries without self-loops, each once:
    there the two layouts mean the same graph to every conv). A few of the
    core's edges, on a copy of the model, cost what a small graph's step
    does, whatever the graph's size.
    """
    twin = copy.deepcopy(model).to(device)  # the user's weights and stats stay
    piece = piece_of_core(core).to(device)
    csr = piece.get("adj_t", None) is not None
    try:
        twin.train()
        got = _step(twin, piece, piece.adj_t if csr else piece.edge_index, loss_fn,
                    device)
        if not csr:
            return None
        # non-finite: the layout's fault only where the edge list's are not
        nan = not _finite(got) and _finite(
            _step(twin, piece, _edge_list(piece.adj_t), loss_fn, device))
        twin.eval()
        simple, edges = _simple(piece.adj_t)
        diff = _difference(_step(twin, piece, simple, loss_fn, device),
                           _step(twin, piece, edges, loss_fn, device))
    except LossFnError:
        raise
    except Exception as e:  # whatever the model raises here, fit would too
        return error_line(e)
    if nan:
        return ("the step on its CSR adjacency gives non-finite gradients (on "
                "the same edges as an edge list it does not)")
    if diff > PROBE_RTOL:
        return ("the step on its CSR adjacency differs from the step on the "
                f"same edges as an edge list (relative difference {diff:.1e})")
    return None


#: how far the probe's CSR step may differ from its edge-list step (float32
#: sums in another order: measured 3e-8 to 7e-6 for the registry's models
#: on two csbm:3000 cores, GAT's softmax the largest)
PROBE_RTOL = 1e-3


def _step(model: torch.nn.Module, piece: Data, adj, loss_fn, device: torch.device
          ) -> list[torch.Tensor]:
    """The loss and the parameters' gradients of one step of ``model`` on
    ``piece`` through ``adj``, from the same random streams each call (the
    caller's stay where they were)."""
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        loss = loss_fn(call_model(model, piece, piece.x, adj), piece)
        loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()
             if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return [loss.detach().reshape(1), *grads]


def _finite(ts: list[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts)


def _difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest relative difference between two steps' figures: ``inf``
    when they differ in kind (non-finite values in ``got`` alone, another
    gradient count), 0 when ``want``'s are not finite (nothing to compare
    with: the model fails on its own layout too, and fit says so)."""
    if len(got) != len(want) or not (_finite(got) and _finite(want)):
        return 0.0 if not _finite(want) else float("inf")
    # A gradient far below the step's largest is measured on that scale:
    # its own is rounding. GATConv's att_dst gets ~1e-10 where every score
    # of a target sits on one side of the LeakyReLU (the softmax is then
    # blind to it), and two summation orders differed 4x there: the probe
    # sent a GAT to the edge list for a draw of its weights.
    scale = max((float(b.abs().max()) for b in want[1:]), default=0.0)
    floor = max(PROBE_SCALE_FLOOR * scale, 1e-12)
    return max((float((a - b).abs().max()) / max(float(b.abs().max()), floor)
                for a, b in zip(got, want)), default=0.0)


#: the share of the step's largest gradient below which a gradient tensor's
#: difference is measured against that share (:func:`_difference`)
PROBE_SCALE_FLOOR = 1e-3


def _edge_list(adj_t: torch.Tensor) -> torch.Tensor:
    """``adj_t``'s entries as ``edge_index`` (sources, targets), each as often
    as its value counts it where the values are counts (the core sums
    duplicate edges into one entry), else once."""
    (row, col), val = to_edge_index(adj_t)  # adj_t's rows are the targets
    times = val.round()
    if not bool(((times == val) & (times >= 1)).all()):
        return torch.stack([col, row])
    times = times.long()
    return torch.stack([col.repeat_interleave(times), row.repeat_interleave(times)])


def _simple(adj_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``adj_t``'s off-diagonal entries with value 1, as a CSR of DPR's core
    (:func:`~leangnn.graphs.sparse.adj_t_of`) and as an edge list."""
    (row, col), _ = to_edge_index(adj_t)
    keep = row != col
    simple = adj_t_of(torch.stack([col[keep], row[keep]]).cpu(), adj_t.size(0))
    (row, col), _ = to_edge_index(simple)
    return simple.to(adj_t.device), torch.stack([col, row]).to(adj_t.device)
