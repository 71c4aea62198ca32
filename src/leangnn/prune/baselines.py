"""The peers DPR is measured against: DSpar full-batch and sampled GraphSAGE.

* :class:`SparseFullBatch`: full-batch training on a ``torch.sparse_csr``
  adjacency, either the whole graph (no pruning) or a DSpar-sparsified one
  (Liu et al., TMLR 2023; :func:`~leangnn.prune.core.dspar_sparsify`);
* :class:`UniformNeighborSampler`, :func:`neighbor_batches` and
  :func:`sampled_inference`: GraphSAGE-style uniform neighbour sampling
  (Hamilton et al., NeurIPS 2017) for mini-batch training and all-node
  serving; PyG's ``NeighborLoader`` when a sampler backend (``pyg-lib`` or
  ``torch-sparse``) is installed, else a vectorised pure-torch sampler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from ..graphs.sparse import DstCSR, adj_t_of
from ..strategy import Strategy
from .core import dspar_sparsify

__all__ = [
    "SparseFullBatch",
    "UniformNeighborSampler",
    "has_pyg_sampler",
    "neighbor_batches",
    "sampled_inference",
]


class SparseFullBatch(Strategy):
    """Full-batch training of one graph on a ``torch.sparse_csr`` adjacency.

    Convs aggregate by sparse products (no ``[E, C]`` message tensor), so
    memory is compared at its best. With ``keep_ratio`` the adjacency is the
    DSpar sample of the graph instead; edge weights are rescaled by
    ``k_i / d_i`` (kept over original in-degree) so that a *mean* aggregation
    (GraphSAGE), which divides by the kept count ``k_i``, is the unbiased
    estimate ``(1/d_i) sum_j w_ij x_j`` of the full mean.

    Args:
        keep_ratio (float, optional): DSpar draws as a share of the
            undirected edges; ``None`` keeps the whole graph. (default: ``None``)
        seed (int, optional): DSpar sampling seed. (default: ``0``)
        device (torch.device or str, optional): where the model runs.
            (default: ``"cpu"``)

    Attributes:
        adj (Tensor): ``[N, N]`` transposed adjacency, set by :meth:`setup`
            and used for every forward (training and prediction alike).
        num_edges (int): edges the model trains on.
    """

    name = "full"

    def __init__(self, keep_ratio: float | None = None, seed: int = 0,
                 device: torch.device | str = "cpu"):
        super().__init__(device)
        self.keep_ratio, self.seed = keep_ratio, seed
        self.adj: Tensor | None = None
        self.num_edges = 0

    def setup(self, model: torch.nn.Module, train_graphs: list[Data]) -> None:
        if len(train_graphs) != 1:
            raise ValueError(f"SparseFullBatch trains on one graph, "
                             f"got {len(train_graphs)}")
        g = train_graphs[0]
        if self.keep_ratio is None:
            self.adj = adj_t_of(g.edge_index, g.num_nodes).to(self.device)
            self.num_edges = g.num_edges
            return
        ei, w = dspar_sparsify(g.edge_index, g.num_nodes, self.keep_ratio, self.seed)
        d = torch.bincount(g.edge_index[1], minlength=g.num_nodes).clamp_min(1)
        k = torch.bincount(ei[1], minlength=g.num_nodes).clamp_min(1)
        w = w * (k[ei[1]] / d[ei[1]]).float()
        self.adj = adj_t_of(ei, g.num_nodes, w).to(self.device)
        self.num_edges = int(ei.size(1))

    def forward(self, model: torch.nn.Module, data: Data) -> Tensor:
        if self.adj is None:
            raise RuntimeError("SparseFullBatch.forward before setup()")
        return model(data.x.to(self.device), self.adj)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(keep_ratio={self.keep_ratio}, "
                f"device={self.device})")


def has_pyg_sampler() -> bool:
    """Whether PyG's NeighborLoader has a sampler backend (pyg-lib/torch-sparse)."""
    import torch_geometric.typing as t

    return bool(t.WITH_PYG_LIB or t.WITH_TORCH_SPARSE)


class UniformNeighborSampler:
    """Vectorized uniform neighbour sampling without replacement (pure torch).

    For every target, ``min(deg, fanout)`` distinct in-neighbours per hop;
    targets with ``deg > fanout`` draw their offsets with Floyd's algorithm,
    run for all of them at once (``fanout`` vectorized steps, no per-node
    loop). Like NeighborLoader, the sampled subgraph lists the seeds first and
    carries ``batch_size``; later hops expand only newly reached nodes.

    Args:
        edge_index (Tensor): ``[2, E]``, messages flow ``src -> dst``.
        num_nodes (int): ``N``.
        fanouts (list[int]): neighbours per target and hop.
        seed (int, optional): sampling seed. (default: ``0``)
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, fanouts: Sequence[int],
                 seed: int = 0):
        csr = DstCSR(edge_index, num_nodes)
        self.col, self.rowptr = csr.col, csr.rowptr
        self.fanouts = list(fanouts)
        self.gen = torch.Generator().manual_seed(seed)
        self._assoc = torch.full((num_nodes,), -1, dtype=torch.long)

    def _offsets(self, deg: Tensor, k: int) -> tuple[Tensor, Tensor]:
        small = deg <= k
        ts = small.nonzero().view(-1)
        ds = deg[ts]
        rep = torch.repeat_interleave(ts, ds)
        off = torch.arange(rep.numel()) - torch.repeat_interleave(
            torch.cumsum(ds, 0) - ds, ds)
        tb = (~small).nonzero().view(-1)
        if tb.numel():
            d = deg[tb]
            s = torch.empty(tb.numel(), k, dtype=torch.long)
            for i in range(k):  # Floyd: j = d-k+i, t ~ U[0, j], t taken -> j
                j = d - k + i
                t = torch.minimum((torch.rand(tb.numel(), generator=self.gen)
                                   * (j + 1)).long(), j)
                if i:
                    t = torch.where((s[:, :i] == t.unsqueeze(1)).any(1), j, t)
                s[:, i] = t
            rep = torch.cat([rep, tb.repeat_interleave(k)])
            off = torch.cat([off, s.view(-1)])
        return rep, off

    def sample(self, seeds: Tensor) -> Data:
        """The sampled subgraph of ``seeds``: ``n_id`` (seeds first),
        local ``edge_index``, ``num_nodes`` and ``batch_size``."""
        assoc = self._assoc
        assoc[seeds] = torch.arange(seeds.numel())
        n_id, frontier, rows, cols, count = [seeds], seeds, [], [], seeds.numel()
        for k in self.fanouts:
            deg = self.rowptr[frontier + 1] - self.rowptr[frontier]
            tpos, off = self._offsets(deg, k)
            nbr = self.col[self.rowptr[frontier[tpos]] + off]
            new = nbr[assoc[nbr] < 0].unique()
            assoc[new] = torch.arange(count, count + new.numel())
            count += new.numel()
            rows.append(assoc[nbr])
            cols.append(assoc[frontier[tpos]])
            n_id.append(new)
            frontier = new
        n_id = torch.cat(n_id)
        assoc[n_id] = -1
        return Data(n_id=n_id, edge_index=torch.stack([torch.cat(rows),
                                                       torch.cat(cols)]),
                    num_nodes=n_id.numel(), batch_size=seeds.numel())

    def loader(self, nodes: Tensor, batch_size: int, shuffle: bool = False
               ) -> Iterator[Data]:
        """Sampled subgraphs of ``nodes`` in batches of ``batch_size`` seeds."""
        if shuffle:
            nodes = nodes[torch.randperm(nodes.numel(), generator=self.gen)]
        for a in range(0, nodes.numel(), batch_size):
            yield self.sample(nodes[a:a + batch_size])

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(num_nodes={self.rowptr.numel() - 1}, "
                f"fanouts={self.fanouts})")


def neighbor_batches(data: Data, nodes: Tensor, fanouts: Sequence[int],
                     batch_size: int, shuffle: bool = False, seed: int = 0
                     ) -> Iterator[Data]:
    """Sampled mini-batches of ``nodes``: PyG ``NeighborLoader`` when it has a
    backend, else :class:`UniformNeighborSampler`.

    The pure-torch sampler is built once per graph and kept on ``data`` (as
    ``data._sampler``), so later calls continue its random stream instead of
    repeating the first epoch's draws.

    Args:
        data (Data): the graph (``edge_index``, ``num_nodes``).
        nodes (Tensor): seed nodes.
        fanouts (list[int]): neighbours per target and hop.
        batch_size (int): seeds per batch.
        shuffle (bool, optional): shuffle the seeds. (default: ``False``)
        seed (int, optional): the pure-torch sampler's seed. (default: ``0``)

    Yields:
        ``Data`` with ``n_id`` (seeds first), ``edge_index`` and ``batch_size``.
    """
    if has_pyg_sampler():
        from torch_geometric.loader import NeighborLoader

        yield from NeighborLoader(Data(edge_index=data.edge_index,
                                       num_nodes=data.num_nodes),
                                  num_neighbors=list(fanouts), input_nodes=nodes,
                                  batch_size=batch_size, shuffle=shuffle)
        return
    sampler = data.get("_sampler", None)
    if sampler is None:
        sampler = UniformNeighborSampler(data.edge_index, data.num_nodes, fanouts, seed)
        data._sampler = sampler
    yield from sampler.loader(nodes, batch_size, shuffle)


@torch.no_grad()
def sampled_inference(model: torch.nn.Module, data: Data, fanouts: Sequence[int],
                      batch_size: int = 4096, seed: int = 0,
                      device: torch.device | str | None = None) -> Tensor:
    """All-node serving of a sampled GraphSAGE: every node is a seed once.

    Args:
        model (torch.nn.Module): ``model(x, edge_index) -> [n, C]``.
        data (Data): the graph with ``x``.
        fanouts (list[int]): neighbours per target and hop; fanouts at least
            the largest in-degree make it exact full-neighbour inference.
        batch_size (int, optional): seeds per batch. (default: ``4096``)
        seed (int, optional): sampling seed. (default: ``0``)
        device (torch.device or str, optional): where the model runs.
            (default: the device of the model's parameters)

    Returns:
        ``Tensor [N, C]`` on ``device``.
    """
    if device is None:
        p = next(model.parameters(), None)
        device = p.device if p is not None else torch.device("cpu")
    model.eval()
    out = None
    for b in neighbor_batches(data, torch.arange(data.num_nodes), fanouts,
                              batch_size, False, seed):
        o = model(data.x[b.n_id].to(device), b.edge_index.to(device))[:b.batch_size]
        if out is None:
            out = o.new_empty(data.num_nodes, o.size(1))
        out[b.n_id[:b.batch_size].to(device)] = o
    return out
