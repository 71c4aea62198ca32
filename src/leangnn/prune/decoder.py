"""The DPR decoder: sparse core anchors per pruned node and a small network.

Decoupled Prune-and-Reconstruct rebuilds every pruned node from a few *core
anchors*. Anchors come from a truncated personalized PageRank (Page et al.,
1999; Andersen et al., FOCS 2006) computed for all sources at once as sparse
matrix products: a walk starts at the pruned node, stops with probability
``alpha`` per step, and is *absorbed* by the first core node it reaches, so
the score of core node ``j`` is the probability that ``j`` is the first core
node hit within ``num_steps`` steps. The ``k`` best scores per row, normalised
to sum to one, form the sparse ``N_pruned x N_core`` weight matrix ``W``. The
dense reference keeps every core node within ``num_steps`` hops (walks pass
through core nodes too), with its PageRank weight.

:class:`AnchorDecoder` maps ``[x_i, (W H)_i, (W X)_i, log mass_i]`` to an
output, with ``H`` the encoder's output on the core. It is trained apart from
the encoder by masking core nodes as if they were pruned (their anchors
exclude themselves), so no pruned label and no encoder gradient is needed.
:func:`compare_to_average` measures, on held-out rows, whether it beats
parameter-free anchor averaging (DPR's ``decoder="auto"`` drops it otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn import MLP

from ..graphs.sparse import csr_tensor_from_scipy

__all__ = ["Anchors", "ppr_anchors", "AnchorDecoder", "DECODER_CHOICES",
           "decoder_batches", "train_decoder", "val_error", "compare_to_average"]

#: :class:`~leangnn.prune.dpr.DPRConfig`'s ``decoder`` values
DECODER_CHOICES = ("auto", "learned", "average")


@dataclass
class Anchors:
    """Anchor weights of a set of source nodes.

    Attributes:
        nodes (Tensor): source node ids ``[S]`` (rows of ``weight``).
        weight (Tensor): ``torch.sparse_csr`` ``[S, N_core]``, rows sum to one
            (or are empty when no core node was reached).
        mass (Tensor): walk probability captured by the kept anchors ``[S]``.
    """

    nodes: Tensor
    weight: Tensor
    mass: Tensor

    @property
    def nnz_per_row(self) -> Tensor:
        return self.weight.crow_indices().diff()

    def to(self, device, dtype: torch.dtype | None = None) -> Anchors:
        """On ``device``, with ``dtype`` weights and mass (the features'
        and embeddings' float type: a float64 model's products need them)."""
        w = self.weight.to(device)
        if dtype is not None and w.dtype != dtype:
            w = torch.sparse_csr_tensor(w.crow_indices(), w.col_indices(),
                                        w.values().to(dtype), w.shape)
        return Anchors(self.nodes.to(device), w, self.mass.to(device, dtype))

    def __repr__(self) -> str:
        nnz = self.nnz_per_row.float()
        return (f"Anchors(rows={self.nodes.numel()}, cols={self.weight.size(1)}, "
                f"mean_per_row={float(nnz.mean()) if nnz.numel() else 0:.2f})")


def _topk_rows(mat: sp.csr_matrix, k: int | None) -> sp.csr_matrix:
    """Keep the ``k`` largest entries of every row (vectorized, no row loop)."""
    mat.sum_duplicates()
    if k is None:
        return mat
    counts = np.diff(mat.indptr)
    if counts.size == 0 or counts.max() <= k:
        return mat
    rows = np.repeat(np.arange(mat.shape[0]), counts)
    order = np.lexsort((-mat.data, rows))
    rank = np.arange(order.size) - mat.indptr[rows[order]]
    keep = order[rank < k]
    keep.sort()  # back to row-major order with sorted columns
    out = sp.csr_matrix((mat.data[keep], mat.indices[keep],
                         np.concatenate([[0], np.cumsum(np.minimum(counts, k))])),
                        shape=mat.shape)
    return out


def ppr_anchors(adj: sp.csr_matrix, core_index: Tensor | np.ndarray,
                sources: Tensor | np.ndarray, num_anchors: int | None = 8,
                num_steps: int = 2, alpha: float = 0.15, eps: float = 1e-4,
                absorb: bool = True, chunk_size: int = 1024) -> Anchors:
    """Anchors of ``sources`` in the core by truncated personalized PageRank.

    Args:
        adj (scipy.sparse.csr_matrix): symmetric adjacency ``[N, N]``
            (:func:`~leangnn.graphs.sparse.undirected_csr`).
        core_index (Tensor): sorted core node ids ``[N_core]``.
        sources (Tensor): node ids to find anchors for ``[S]``; a core node
            among them is treated as pruned (its own column is excluded).
        num_anchors (int, optional): ``k`` anchors per row; ``None`` keeps all
            (the dense reference). (default: ``8``)
        num_steps (int, optional): walk length ``h``. (default: ``2``)
        alpha (float, optional): stop probability per step. (default: ``0.15``)
        eps (float, optional): walk entries below ``eps`` are dropped after
            every step (bounds fill-in); ``0`` keeps everything. (default: ``1e-4``)
        absorb (bool, optional): stop walks at the first core node; ``False``
            lets them pass through core nodes (dense reference). (default: ``True``)
        chunk_size (int, optional): sources per sparse product; bounds the
            walk's working memory. (default: ``1024``)

    Returns:
        :class:`Anchors` with at most ``num_anchors`` entries per row.
    """
    if num_anchors is not None and (not isinstance(num_anchors, int)
                                    or num_anchors < 1):
        raise ValueError(f"num_anchors must be a positive int or None, "
                         f"got {num_anchors!r}")
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
    n = adj.shape[0]
    core_index = np.asarray(torch.as_tensor(core_index).cpu().numpy(), dtype=np.int64)
    src = np.asarray(torch.as_tensor(sources).cpu().numpy(), dtype=np.int64)
    nc = core_index.shape[0]
    pos = np.full(n, -1, dtype=np.int64)
    pos[core_index] = np.arange(nc)
    counts = np.diff(adj.indptr)
    inv = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0).astype(np.float32)
    if absorb:
        # Core rows are left out: mass that lands on a core node stops. Only
        # the pruned rows' entries are copied.
        live = np.ones(n, dtype=bool)
        live[core_index] = False
        kept = np.where(live, counts, 0)
        indptr = np.zeros(n + 1, dtype=adj.indptr.dtype)
        np.cumsum(kept, out=indptr[1:])
        step_mat = sp.csr_matrix((np.repeat(inv[live], counts[live]),
                                  adj.indices[np.repeat(live, counts)], indptr),
                                 shape=adj.shape)
    else:  # shares adj's index arrays; only the values are new
        step_mat = sp.csr_matrix((np.repeat(inv, counts), adj.indices, adj.indptr),
                                 shape=adj.shape)
    select = sp.csr_matrix((np.ones(nc, dtype=np.float32), (core_index, np.arange(nc))),
                           shape=(n, nc))
    # The last step only needs the core columns: multiplying by
    # step_mat @ select there avoids the fill-in over all N columns, the
    # largest intermediate of the walk.
    last = (step_mat @ select).tocsr() if num_steps > 1 else None
    parts, masses = [], []
    for begin in range(0, src.shape[0], chunk_size):
        s = src[begin:begin + chunk_size]
        z = (sp.diags(inv[s]) @ adj[s]).tocsr()  # first step, from any source
        w = z @ select
        decay = 1.0
        for t in range(1, num_steps):
            decay *= 1.0 - alpha
            if t + 1 == num_steps:
                w = w + decay * (z @ last)
                break
            z = z @ step_mat
            if eps > 0:
                z.data[z.data < eps] = 0.0
                z.eliminate_zeros()
            w = w + decay * (z @ select)
        w = w.tocsr()
        # A source in the core must not anchor on itself.
        row_of = np.repeat(pos[s], np.diff(w.indptr))
        w.data[w.indices == row_of] = 0.0
        w.eliminate_zeros()
        w = _topk_rows(w, num_anchors)
        mass = np.asarray(w.sum(axis=1)).ravel()
        norm = np.repeat(np.where(mass > 0, 1.0 / np.maximum(mass, 1e-30), 0.0),
                         np.diff(w.indptr)).astype(np.float32)
        w.data *= norm
        parts.append(w)
        masses.append(mass.astype(np.float32))
    w = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, nc))
    w.sort_indices()
    weight = csr_tensor_from_scipy(w)
    mass = torch.from_numpy(np.concatenate(masses)) if masses else torch.zeros(0)
    return Anchors(torch.from_numpy(src), weight, mass)


class AnchorDecoder(torch.nn.Module):
    r"""Small network that reconstructs a pruned node from its core anchors (DPR).

    Input per node: its own features :math:`x_i`, the anchor-weighted encoder
    outputs :math:`(WH)_i`, optionally the anchor-weighted features
    :math:`(WX)_i`, and :math:`\log` of the captured walk mass. With
    ``residual`` the network predicts a correction to :math:`(WH)_i`, so an
    untrained decoder already equals parameter-free anchor averaging.

    Args:
        in_channels (int): node feature size ``F``.
        embed_channels (int): size of the encoder output ``C`` on the core.
        out_channels (int): output size.
        hidden_channels (int, optional): MLP width. (default: ``64``)
        num_layers (int, optional): MLP layers. (default: ``2``)
        dropout (float, optional): MLP dropout. (default: ``0.0``)
        anchor_features (bool, optional): also feed :math:`(WX)_i`.
            (default: ``True``)
        residual (bool, optional): add :math:`(WH)_i` to the output (needs
            ``embed_channels == out_channels``). (default: ``True``)

    Shapes:
        **input:** ``x [B, F]``, ``anchor_emb [B, C]``, ``anchor_x [B, F]``,
        ``mass [B]``
        **output:** ``[B, out_channels]``
    """

    def __init__(self, in_channels: int, embed_channels: int, out_channels: int,
                 hidden_channels: int = 64, num_layers: int = 2,
                 dropout: float = 0.0, anchor_features: bool = True,
                 residual: bool = True):
        super().__init__()
        if residual and embed_channels != out_channels:
            raise ValueError(f"residual decoder needs embed_channels == out_channels, "
                             f"got {embed_channels} and {out_channels}")
        self.in_channels, self.embed_channels = in_channels, embed_channels
        self.out_channels, self.hidden_channels = out_channels, hidden_channels
        self.anchor_features, self.residual = anchor_features, residual
        width = in_channels * (2 if anchor_features else 1) + embed_channels + 1
        self.mlp = MLP(in_channels=width, hidden_channels=hidden_channels,
                       out_channels=out_channels, num_layers=num_layers,
                       dropout=dropout, norm=None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.mlp.reset_parameters()
        if self.residual:
            # Start exactly at anchor averaging; training learns the correction.
            last = self.mlp.lins[-1]
            torch.nn.init.zeros_(last.weight)
            if last.bias is not None:
                torch.nn.init.zeros_(last.bias)

    def forward(self, x: Tensor, anchor_emb: Tensor, anchor_x: Tensor | None = None,
                mass: Tensor | None = None) -> Tensor:
        if mass is None:
            mass = torch.ones(x.size(0), device=x.device, dtype=x.dtype)
        parts = [x, anchor_emb]
        if self.anchor_features:
            if anchor_x is None:
                raise ValueError("AnchorDecoder(anchor_features=True) needs anchor_x")
            parts.append(anchor_x)
        parts.append(mass.clamp_min(1e-6).log().unsqueeze(-1).to(x.dtype))
        out = self.mlp(torch.cat(parts, dim=-1))
        return out + anchor_emb if self.residual else out

    # ------------------------------------------------------------ serving
    # The first Linear is linear in each input block, so for anchor rows
    # ``W``: lin([x, W H, W X, m]) = x A_x^T + W (H A_h^T + X A_a^T) + m a_m + b.
    # Projecting the core once per call (N_core x (C + F) x hidden) and
    # gathering hidden-sized rows replaces transforming every pruned node's
    # concatenated ``2F + C + 1`` inputs (N_pruned >> N_core at small budgets):
    # the same function, summed in another order (equal up to float rounding).
    def project_core(self, core_emb: Tensor, core_x: Tensor | None = None) -> Tensor:
        """Core rows to gather by anchor weights for :meth:`forward_anchored`.

        Args:
            core_emb (Tensor): encoder outputs on the core ``[N_core, C]``.
            core_x (Tensor, optional): core node features ``[N_core, F]``
                (needed with ``anchor_features``).

        Returns:
            ``[N_core, hidden + C]``: the core's share of the first layer's
            pre-activation, then ``core_emb`` itself (one sparse product
            then yields both anchor-weighted terms).
        """
        f, c = self.in_channels, self.embed_channels
        w = self.mlp.lins[0].weight
        proj = core_emb @ w[:, f:f + c].t()
        if self.anchor_features:
            if core_x is None:
                raise ValueError("AnchorDecoder(anchor_features=True) needs core_x")
            proj.addmm_(core_x, w[:, f + c:2 * f + c].t())
        return torch.cat([proj, core_emb], dim=-1)

    def forward_anchored(self, x: Tensor, anchored: Tensor,
                         mass: Tensor | None = None) -> Tensor:
        """:meth:`forward` from ``W @ project_core(H, X_core)`` rows.

        Args:
            x (Tensor): the nodes' own features ``[B, F]``.
            anchored (Tensor): their anchor rows of :meth:`project_core`'s
                output, ``W @ P`` ``[B, hidden + C]``.
            mass (Tensor, optional): captured walk mass ``[B]``.
        """
        mlp, f = self.mlp, self.in_channels
        first = mlp.lins[0]
        k = first.weight.size(0)
        if mass is None:
            mass = torch.ones(x.size(0), device=x.device, dtype=x.dtype)
        # Log-mass and bias ride along as two extra input columns: one GEMM
        # instead of GEMM + outer product + broadcast add (2.48 ms against
        # 2.59-2.88 ms per 16k CSBM rows, one thread).
        cols = [x, mass.clamp_min(1e-6).log().to(x.dtype).unsqueeze(-1)]
        wcols = [first.weight[:, :f], first.weight[:, -1:]]
        if first.bias is not None:
            cols.append(x.new_ones(x.size(0), 1))
            wcols.append(first.bias.unsqueeze(-1))
        z = torch.addmm(anchored[:, :k], torch.cat(cols, -1), torch.cat(wcols, -1).t())
        return self._mlp_after_first(z, anchored[:, k:] if self.residual else None)

    def _mlp_after_first(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        # torch_geometric.nn.MLP.forward with its first Linear already applied
        # (x is a fresh tensor, so a ReLU may run in place), plus ``residual``.
        mlp = self.mlp
        relu = isinstance(mlp.act, torch.nn.ReLU)

        def act(t: Tensor) -> Tensor:
            return t.relu_() if relu else mlp.act(t)

        for i, (lin, norm) in enumerate(zip(mlp.lins, mlp.norms)):
            if i:
                x = lin(x)
            if mlp.act is not None and mlp.act_first:
                x = act(x)
            x = norm(x)
            if mlp.act is not None and not mlp.act_first:
                x = act(x)
            x = torch.nn.functional.dropout(x, p=mlp.dropout[i],
                                            training=mlp.training)
        if mlp.plain_last:
            if len(mlp.lins) > 1:
                last = mlp.lins[-1]
                if residual is not None and not (mlp.training and mlp.dropout[-1]):
                    out = torch.addmm(residual, x, last.weight.t())
                    return out if last.bias is None else out.add_(last.bias)
                x = last(x)
            x = torch.nn.functional.dropout(x, p=mlp.dropout[-1],
                                            training=mlp.training)
        return x if residual is None else x + residual

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.embed_channels}, "
                f"{self.out_channels}, hidden_channels={self.hidden_channels}, "
                f"anchor_features={self.anchor_features}, residual={self.residual})")


# ------------------------------------------------------------------ training
Batch = tuple[int, int, int]  # (graph, first row, end row)


def decoder_batches(sizes: list[int], batch_size: int
                    ) -> tuple[list[Batch], list[Batch]]:
    """Training and validation batches over graphs with ``sizes`` (shuffled)
    rows each: the last tenth of every graph's rows validates (none below
    20 rows)."""
    train, val = [], []
    for g, n in enumerate(sizes):
        n_val = n // 10 if n >= 20 else 0
        train += [(g, a, min(a + batch_size, n - n_val))
                  for a in range(0, n - n_val, batch_size)]
        val += [(g, a, min(a + batch_size, n)) for a in range(n - n_val, n, batch_size)]
    return train, val


def _rows_data(y: Tensor) -> Data:
    """What ``loss_fn`` sees of a batch of decoder rows: their targets, and
    ``node_mask`` / ``train_mask`` holding every row (each row is a node
    trained on), so a loss of the user's that reads PyG's ``train_mask``
    scores the rows as the encoder's step scores the core's nodes (it had
    failed: "'GlobalStorage' object has no attribute 'train_mask'")."""
    every = torch.ones(y.size(0), dtype=torch.bool, device=y.device)
    return Data(y=y, node_mask=every, train_mask=every)


def _val_loss(decoder, inputs, target, val, loss_fn) -> float:
    parts = [(float(loss_fn(decoder(*inputs(*v)), _rows_data(target(*v)))), v[2] - v[1])
             for v in val]
    return sum(loss * n for loss, n in parts) / sum(n for _, n in parts)


def train_decoder(decoder: AnchorDecoder, inputs: Callable, target: Callable,
                  train: list[Batch], val: list[Batch], loss_fn: Callable,
                  epochs: int = 100, patience: int = 10, lr: float = 0.01) -> float:
    """Adam on ``train`` batches, keeping the epoch of best ``val`` loss.

    Args:
        decoder (AnchorDecoder): trained in place, left in eval mode.
        inputs (callable): ``(g, a, b) ->`` the decoder's inputs of rows
            ``a:b`` of graph ``g``.
        target (callable): ``(g, a, b) ->`` their targets.
        train, val (list): :func:`decoder_batches`.
        loss_fn (callable): ``(out, Data(y=...)) -> loss`` (with every
            row in its ``node_mask`` and ``train_mask``: :func:`_rows_data`).
        epochs (int, optional): at most. (default: ``100``)
        patience (int, optional): stop after this many epochs without a
            better validation loss (``0``: never). (default: ``10``)
        lr (float, optional): learning rate. (default: ``0.01``)

    Returns:
        The best validation loss (``inf`` without validation rows).
    """
    opt = torch.optim.Adam(decoder.parameters(), lr=lr)
    best, best_state, bad = float("inf"), None, 0
    for _ in range(epochs):
        decoder.train()
        for i in torch.randperm(len(train)).tolist():
            opt.zero_grad()
            batch = train[i]
            loss_fn(decoder(*inputs(*batch)), _rows_data(target(*batch))).backward()
            opt.step()
        if val:
            decoder.eval()
            with torch.no_grad():
                v = _val_loss(decoder, inputs, target, val, loss_fn)
            if v < best:
                best, bad = v, 0
                best_state = {k: t.clone() for k, t in decoder.state_dict().items()}
            else:
                bad += 1
                if patience and bad >= patience:
                    break
    if best_state is not None:
        decoder.load_state_dict(best_state)
    decoder.eval()
    return best


def val_error(out: Tensor, y: Tensor) -> float:
    """Error of ``out`` on targets ``y``: the error rate for classification
    (integer ``y``, one output column per class), else ``MSE / var(y)``
    (``1 - R^2``, scale-free; the MSE itself when ``y`` is constant)."""
    from ..metrics import accuracy, r2

    if not y.is_floating_point() and out.dim() == 2 and out.size(1) > 1:
        return 1.0 - accuracy(out, y)
    if y.numel() and float(y.double().var(correction=0)) > 0:
        return 1.0 - r2(out, y)
    return float((out.reshape(-1).double() - y.reshape(-1).double()).square().mean())


@torch.no_grad()
def compare_to_average(decoder: AnchorDecoder, inputs: Callable, target: Callable,
                       val: list[Batch], loss_fn: Callable) -> dict[str, float]:
    """The decoder against parameter-free anchor averaging (``W @ H``, its
    ``anchor_emb`` input) on the same held-out rows.

    DPR's ``decoder="auto"`` keeps the decoder when ``decoder_gain``, the
    *absolute* reduction of :func:`val_error` (the error rate, or
    ``1 - R^2``), exceeds ``decoder_min_gain``: what the decoder's serving
    time buys is measured in points of accuracy. Measured on the benchmark
    graphs (``benchmarks/dpr.py --serving-only``), the absolute gain tells
    them apart (11.7 pp on the circuits union, 0.12 pp on the 100k CSBM)
    where relative figures do not: the relative loss reduction was alike
    (15.8 %, 15.1 %: on the CSBM the decoder sharpens logits without
    changing decisions), the relative error reduction much less apart
    (18 %, 6.5 %) and large for any near-perfect task. The decoder's epoch
    was picked on these rows too (by loss), a slight bias toward keeping it.

    Returns:
        ``decoder_val_loss`` and ``average_val_loss`` (``loss_fn`` over all
        rows), ``decoder_val_error`` and ``average_val_error``
        (:func:`val_error`), ``decoder_gain`` (the error's absolute
        reduction, average minus decoder) and ``decoder_val_rows``.
    """
    decoder.eval()
    outs, avgs, ys = [], [], []
    for v in val:
        args = inputs(*v)
        outs.append(decoder(*args))
        avgs.append(args[1])
        ys.append(target(*v))
    out, avg, y = torch.cat(outs), torch.cat(avgs), torch.cat(ys)
    fig = {"decoder_val_loss": float(loss_fn(out, _rows_data(y))),
           "average_val_loss": float(loss_fn(avg, _rows_data(y))),
           "decoder_val_error": val_error(out, y),
           "average_val_error": val_error(avg, y),
           "decoder_val_rows": int(y.size(0))}
    fig["decoder_gain"] = fig["average_val_error"] - fig["decoder_val_error"]
    return fig
