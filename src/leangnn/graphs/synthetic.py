"""Large synthetic graphs for scale tests: a contextual SBM with power-law degrees.

A degree-corrected stochastic block model (Karrer & Newman, 2011) whose node
propensities follow a Pareto law, so degrees are heavy-tailed like Reddit or
ogbn-products, combined with class-dependent Gaussian node features as in the
contextual SBM (Deshpande et al., NeurIPS 2018). Generation is vectorized and
chunked: a 2.45M-node graph with average degree 25 takes well under a minute
on two CPU cores and never materialises more than one chunk of candidate
edges next to the result.
"""

from __future__ import annotations

import math

import torch
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, remove_self_loops

__all__ = ["contextual_sbm", "power_law_graph"]


def _check(name: str, value, cond: bool, want: str) -> None:
    if not cond:
        raise ValueError(f"contextual_sbm: {name} must be {want}, got {value!r}")


def contextual_sbm(
    num_nodes: int,
    num_classes: int = 8,
    avg_degree: float = 25.0,
    in_channels: int = 64,
    homophily: float = 0.7,
    exponent: float = 2.5,
    feature_signal: float = 1.0,
    train_ratio: float = 0.5,
    val_ratio: float = 0.1,
    seed: int = 0,
    chunk_edges: int = 1 << 23,
) -> Data:
    r"""Generate a contextual SBM with power-law degree propensities.

    Each node ``i`` gets a class ``y_i`` (uniform) and a propensity
    :math:`\theta_i \sim \mathrm{Pareto}(\gamma - 1)`, capped at
    :math:`\sqrt{N}` so no hub exceeds a few thousand neighbours. Edge
    endpoints are drawn proportionally to :math:`\theta`; with probability
    ``homophily`` the second endpoint comes from the first endpoint's class.
    The graph is made undirected and duplicate edges and self-loops are
    removed. Features are :math:`x_i = \mu_{y_i} + \varepsilon_i` with unit
    Gaussian noise and class means of norm ``feature_signal``.

    Args:
        num_nodes (int): number of nodes :math:`N`.
        num_classes (int, optional): number of blocks/classes. (default: ``8``)
        avg_degree (float, optional): target mean degree (after symmetrisation,
            before de-duplication, which removes a few percent). (default: ``25``)
        in_channels (int, optional): feature dimension. (default: ``64``)
        homophily (float, optional): probability that an edge stays inside a
            class. (default: ``0.7``)
        exponent (float, optional): power-law exponent :math:`\gamma > 2` of
            the degree distribution. (default: ``2.5``)
        feature_signal (float, optional): norm of the class means; smaller is
            harder. (default: ``1.0``)
        train_ratio (float, optional): share of nodes in ``train_mask``.
            (default: ``0.5``)
        val_ratio (float, optional): share of nodes in ``val_mask``; the rest
            is ``test_mask``. (default: ``0.1``)
        seed (int, optional): random seed; same seed, same graph. (default: ``0``)
        chunk_edges (int, optional): edges drawn per chunk (bounds the working
            memory). (default: ``2**23``)

    Returns:
        :class:`torch_geometric.data.Data` with ``x [N, in_channels]``,
        ``edge_index [2, E]`` (undirected, coalesced), ``y [N]`` and boolean
        ``train_mask``, ``val_mask``, ``test_mask`` of shape ``[N]``.
    """
    _check("num_nodes", num_nodes, isinstance(num_nodes, int) and num_nodes >= 2,
           "an int >= 2")
    _check("num_classes", num_classes, 1 <= num_classes <= num_nodes,
           "in [1, num_nodes]")
    _check("avg_degree", avg_degree, 0 < avg_degree < num_nodes, "in (0, num_nodes)")
    _check("homophily", homophily, 0.0 <= homophily <= 1.0, "in [0, 1]")
    _check("exponent", exponent, exponent > 2.0, "> 2")
    _check("train_ratio + val_ratio", train_ratio + val_ratio,
           0 <= train_ratio and 0 <= val_ratio and train_ratio + val_ratio <= 1,
           "within [0, 1]")

    gen = torch.Generator().manual_seed(seed)
    n = num_nodes
    y = torch.randint(num_classes, (n,), generator=gen)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    theta = (1.0 - u).pow(-1.0 / (exponent - 1.0)).clamp_(max=math.sqrt(n))

    # Nodes sorted by class give every class a contiguous slice of one cumsum,
    # so "draw a node of class c proportionally to theta" is one searchsorted.
    order = torch.argsort(y, stable=True)
    cum = torch.cumsum(theta[order], 0)
    counts = torch.bincount(y, minlength=num_classes)
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    cum0 = torch.cat([cum.new_zeros(1), cum])
    lo, hi = cum0[starts], cum0[ends]
    total = float(cum[-1])

    num_pairs = int(round(n * avg_degree / 2))
    chunks = []
    for begin in range(0, num_pairs, chunk_edges):
        m = min(chunk_edges, num_pairs - begin)
        r = torch.rand(m, generator=gen, dtype=torch.float64) * total
        src = order[torch.searchsorted(cum, r, right=True).clamp_(max=n - 1)]
        same = torch.rand(m, generator=gen) < homophily
        r2 = torch.rand(m, generator=gen, dtype=torch.float64)
        c = y[src]
        r2 = torch.where(same, lo[c] + r2 * (hi[c] - lo[c]), r2 * total)
        dst = order[torch.searchsorted(cum, r2, right=True).clamp_(max=n - 1)]
        chunks.append(torch.stack([src, dst]))
    ei = torch.cat(chunks, 1)
    del chunks
    ei = torch.cat([ei, ei.flip(0)], 1)
    ei, _ = remove_self_loops(ei)
    ei = coalesce(ei, num_nodes=n)

    means = torch.randn(num_classes, in_channels, generator=gen)
    means = feature_signal * means / means.norm(dim=1, keepdim=True).clamp_min(1e-12)
    x = torch.randn(n, in_channels, generator=gen)
    x.add_(means[y])

    perm = torch.randperm(n, generator=gen)
    n_train, n_val = int(train_ratio * n), int(val_ratio * n)
    masks = torch.zeros(3, n, dtype=torch.bool)
    masks[0, perm[:n_train]] = True
    masks[1, perm[n_train:n_train + n_val]] = True
    masks[2, perm[n_train + n_val:]] = True
    return Data(x=x, edge_index=ei, y=y, train_mask=masks[0], val_mask=masks[1],
                test_mask=masks[2], num_nodes=n, name=f"csbm-{n}")


def power_law_graph(num_nodes: int, avg_degree: float = 25.0, in_channels: int = 64,
                    num_classes: int = 8, seed: int = 0, **kwargs) -> Data:
    """A power-law graph for memory/traffic benchmarks (:func:`contextual_sbm`)."""
    return contextual_sbm(num_nodes, num_classes=num_classes, avg_degree=avg_degree,
                          in_channels=in_channels, seed=seed, **kwargs)


#: node counts a ``csbm:N`` spec accepts (below 100 a split has too few
#: nodes per class; above 10**9 the graph is terabytes)
CSBM_MIN_NODES, CSBM_MAX_NODES = 100, 10**9


def csbm_nodes(spec: str) -> int:
    """The node count of a ``csbm:N`` spec (``N`` may read ``1e5``).

    Raises:
        ValueError: naming the spec unless ``N`` is an integer in
            [``CSBM_MIN_NODES``, ``CSBM_MAX_NODES``].
    """
    head, _, num = spec.partition(":")
    try:
        value = float(num.strip())
    except ValueError:
        value = math.nan
    if head != "csbm" or not math.isfinite(value) or value != int(value) or \
            not CSBM_MIN_NODES <= value <= CSBM_MAX_NODES:
        raise ValueError(f"dataset: expected csbm:NUM_NODES, got {spec!r} "
                         f"(NUM_NODES an integer in [{CSBM_MIN_NODES}, "
                         f"{CSBM_MAX_NODES:.0e}])")
    return int(value)
