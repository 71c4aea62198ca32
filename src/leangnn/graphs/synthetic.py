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

__all__ = ["rmat_edges", "rmat_graph", "contextual_sbm", "power_law_graph"]


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


def rmat_edges(scale: int, num_edges: int, a: float = 0.57, b: float = 0.19,
               c: float = 0.19, noise: float = 0.0, permute: bool = True,
               seed: int = 0, chunk_edges: int = 1 << 22) -> torch.Tensor:
    r"""Directed R-MAT edges (Chakrabarti et al., SDM 2004; Graph500 kernel 1).

    Every edge picks one quadrant of the adjacency matrix per bit level with
    probabilities ``a, b, c, d = 1 - a - b - c`` (Graph500: 0.57, 0.19, 0.19,
    0.05), so degrees are heavily skewed: a few hubs take a large share of the
    edges. With ``noise > 0`` each level perturbs ``a..d`` by a factor in
    ``1 +- noise`` and renormalises (the Graph500 reference's smoothing);
    ``permute`` relabels nodes at random as Graph500 does, so hubs are not the
    low ids. All levels of a chunk are drawn at once (vectorised; one chunk of
    random numbers next to the result).

    Args:
        scale (int): ``log2`` of the node count.
        num_edges (int): edges drawn (duplicates and self-loops included).
        a, b, c (float, optional): quadrant probabilities. (default: Graph500)
        noise (float, optional): per-level noise in ``[0, 1)``. (default: ``0``)
        permute (bool, optional): random node relabelling. (default: ``True``)
        seed (int, optional): random seed. (default: ``0``)
        chunk_edges (int, optional): edges per chunk. (default: ``2**22``)

    Returns:
        ``edge_index [2, num_edges]`` (int64).
    """
    d = 1.0 - a - b - c
    _rcheck("scale", scale, isinstance(scale, int) and 1 <= scale <= 40,
            "an int in [1, 40]")
    _rcheck("num_edges", num_edges, isinstance(num_edges, int) and num_edges >= 0,
            "an int >= 0")
    _rcheck("a, b, c", (a, b, c), min(a, b, c) >= 0 and d >= 0, "probabilities "
            "with a + b + c <= 1")
    _rcheck("noise", noise, 0.0 <= noise < 1.0, "in [0, 1)")
    gen = torch.Generator().manual_seed(seed)
    probs = torch.tensor([a, b, c, d], dtype=torch.float64).repeat(scale, 1)
    if noise > 0:
        probs *= 1 + noise * (2 * torch.rand(scale, 4, generator=gen,
                                             dtype=torch.float64) - 1)
        probs /= probs.sum(1, keepdim=True)
    # P(row bit) and P(col bit | row bit) per level, as in Graph500's generator
    p_row = probs[:, 2] + probs[:, 3]
    p_col0 = probs[:, 1] / (probs[:, 0] + probs[:, 1]).clamp_min(1e-300)
    p_col1 = probs[:, 3] / (probs[:, 2] + probs[:, 3]).clamp_min(1e-300)
    weights = 2 ** torch.arange(scale - 1, -1, -1, dtype=torch.long)
    out = torch.empty(2, num_edges, dtype=torch.long)
    for begin in range(0, num_edges, chunk_edges):
        m = min(chunk_edges, num_edges - begin)
        row = torch.rand(m, scale, generator=gen, dtype=torch.float64) < p_row
        pc = torch.where(row, p_col1, p_col0)
        col = torch.rand(m, scale, generator=gen, dtype=torch.float64) < pc
        out[0, begin:begin + m] = row.long() @ weights
        out[1, begin:begin + m] = col.long() @ weights
        del row, col, pc
    if permute:
        perm = torch.randperm(2**scale, generator=gen)
        out = perm[out]
    return out


def _rcheck(name: str, value, cond: bool, want: str) -> None:
    if not cond:
        raise ValueError(f"rmat: {name} must be {want}, got {value!r}")


def rmat_graph(scale: int, edge_factor: float = 16.0, a: float = 0.57,
               b: float = 0.19, c: float = 0.19, noise: float = 0.0,
               undirected: bool = True, dedup: bool = True,
               self_loops: bool = False, in_channels: int = 64,
               num_classes: int = 8, train_ratio: float = 0.5, seed: int = 0,
               permute: bool = True) -> Data:
    r"""An R-MAT graph with hubs of many in-edges (see :func:`rmat_edges`).

    Draws ``edge_factor * 2**scale`` directed R-MAT edges (Graph500's edge
    count), optionally symmetrises them, removes self-loops and duplicates,
    and adds random labels and features (class means plus unit noise) so it
    trains like the other synthetic graphs.

    Args:
        scale (int): ``log2`` of the node count :math:`N`.
        edge_factor (float, optional): edges drawn per node. (default: ``16``)
        a, b, c (float, optional): R-MAT quadrant probabilities.
            (default: Graph500's ``0.57, 0.19, 0.19``)
        noise (float, optional): Graph500 per-level noise. (default: ``0``)
        undirected (bool, optional): add every edge's reverse. (default: ``True``)
        dedup (bool, optional): coalesce duplicate edges. (default: ``True``)
        self_loops (bool, optional): keep self-loops. (default: ``False``)
        in_channels (int, optional): feature width. (default: ``64``)
        num_classes (int, optional): label classes. (default: ``8``)
        train_ratio (float, optional): share of nodes in ``train_mask``.
            (default: ``0.5``)
        seed (int, optional): random seed; same seed, same graph. (default: ``0``)
        permute (bool, optional): random node relabelling. (default: ``True``)

    Returns:
        :class:`torch_geometric.data.Data` with ``x [N, in_channels]``,
        ``edge_index [2, E]``, ``y [N]``, ``train_mask [N]``.
    """
    _rcheck("edge_factor", edge_factor, edge_factor > 0, "> 0")
    _rcheck("train_ratio", train_ratio, 0 <= train_ratio <= 1, "in [0, 1]")
    n = 2**scale if isinstance(scale, int) else scale
    ei = rmat_edges(scale, int(round(edge_factor * n)), a, b, c, noise, permute, seed)
    if undirected:
        ei = torch.cat([ei, ei.flip(0)], 1)
    if not self_loops:
        ei, _ = remove_self_loops(ei)
    if dedup:
        ei = coalesce(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(seed + 1)
    y = torch.randint(num_classes, (n,), generator=gen)
    means = torch.randn(num_classes, in_channels, generator=gen)
    x = torch.randn(n, in_channels, generator=gen).add_(means[y])
    train = torch.zeros(n, dtype=torch.bool)
    train[torch.randperm(n, generator=gen)[: int(train_ratio * n)]] = True
    return Data(x=x, edge_index=ei, y=y, train_mask=train, num_nodes=n,
                name=f"rmat-{scale}")
