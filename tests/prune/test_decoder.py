"""Anchors (truncated absorbing PageRank) and the anchor decoder."""

import networkx as nx
import numpy as np
import pytest
import torch

from leangnn.graphs.sparse import undirected_csr
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.prune.core import build_core
from leangnn.prune.decoder import (
    AnchorDecoder,
    compare_to_average,
    decoder_batches,
    ppr_anchors,
    val_error,
)


def _setup(n=400, deg=4.0, r=0.3, seed=0):
    d = contextual_sbm(n, avg_degree=deg, seed=seed)
    adj = undirected_csr(d.edge_index, n)
    core = build_core(d, r, adj=adj)
    return d, adj, core


def _reference(adj, core_index, sources, steps, alpha, absorb):
    """Dense float64 walk, one source at a time (the obvious, slow way)."""
    a = adj.toarray().astype(np.float64)
    deg = a.sum(1)
    p = np.divide(a, deg[:, None], out=np.zeros_like(a), where=deg[:, None] > 0)
    is_core = np.zeros(a.shape[0], dtype=bool)
    is_core[core_index] = True
    out = np.zeros((len(sources), len(core_index)))
    for i, s in enumerate(sources):
        z = p[s].copy()
        score = z.copy()
        for t in range(1, steps):
            if absorb:
                z = np.where(is_core, 0.0, z)
            z = z @ p
            score += (1 - alpha) ** t * z
        row = score[core_index]
        if is_core[s]:
            row[np.searchsorted(core_index, s)] = 0.0
        out[i] = row
    return out


@pytest.mark.parametrize("absorb", [True, False])
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_anchor_scores_match_dense_reference(absorb, steps):
    d, adj, core = _setup()
    ci = core.index.numpy()
    src = np.concatenate([np.flatnonzero(~core.mask.numpy())[:60], ci[:20]])
    got = ppr_anchors(adj, core.index, torch.from_numpy(src), num_anchors=None,
                      num_steps=steps, alpha=0.2, eps=0.0, absorb=absorb,
                      chunk_size=17)
    ref = _reference(adj, ci, src, steps, 0.2, absorb)
    mass = ref.sum(1)
    ref = np.divide(ref, mass[:, None], out=np.zeros_like(ref),
                    where=mass[:, None] > 0)
    assert np.allclose(got.weight.to_dense().numpy(), ref, atol=1e-5)
    assert np.allclose(got.mass.numpy(), mass, atol=1e-5)
    assert torch.equal(got.nodes, torch.from_numpy(src))


def test_at_most_k_per_row_and_the_k_largest():
    d, adj, core = _setup(600, 8.0)
    ci = core.index.numpy()
    src = np.flatnonzero(~core.mask.numpy())
    k = 3
    got = ppr_anchors(adj, core.index, torch.from_numpy(src), num_anchors=k,
                      num_steps=3, alpha=0.15, eps=0.0)
    nnz = got.nnz_per_row
    assert int(nnz.max()) <= k
    ref = _reference(adj, ci, src, 3, 0.15, True)
    dense = got.weight.to_dense().numpy() * got.mass.numpy()[:, None]
    for i in range(len(src)):
        want = np.sort(ref[i][ref[i] > 0])[::-1][:k]
        have = np.sort(dense[i][dense[i] > 0])[::-1]
        assert np.allclose(have, want, atol=1e-6)
        if nnz[i]:
            assert abs(got.weight.to_dense()[i].sum() - 1.0) < 1e-5


def test_core_sources_never_anchor_on_themselves():
    d, adj, core = _setup()
    got = ppr_anchors(adj, core.index, core.index, num_anchors=8)
    w = got.weight.to_dense()
    assert float(w.diagonal().abs().max()) == 0.0
    assert int(got.nnz_per_row.max()) <= 8


def test_dense_reference_is_all_core_nodes_within_h_hops():
    d, adj, core = _setup(300, 3.0)
    g = nx.from_scipy_sparse_array(adj)
    pos = {int(v): i for i, v in enumerate(core.index)}
    src = torch.nonzero(~core.mask).view(-1)[:50]
    got = ppr_anchors(adj, core.index, src, num_anchors=None, num_steps=2,
                      eps=0.0, absorb=False)
    w = got.weight.to_dense()
    for i, s in enumerate(src.tolist()):
        near = nx.single_source_shortest_path_length(g, s, cutoff=2)
        want = sorted(pos[v] for v in near if v in pos and v != s)
        assert w[i].nonzero().view(-1).tolist() == want


def test_isolated_pruned_node_gets_no_anchor():
    ei = torch.tensor([[0, 1], [1, 0]])
    from leangnn.graphs.sparse import undirected_csr as uc

    adj = uc(ei, 3)
    got = ppr_anchors(adj, torch.tensor([0]), torch.tensor([1, 2]), num_anchors=4)
    assert got.nnz_per_row.tolist() == [1, 0]
    assert got.mass[1] == 0


def test_bad_arguments():
    _, adj, core = _setup(100)
    with pytest.raises(ValueError, match="num_anchors"):
        ppr_anchors(adj, core.index, torch.tensor([0]), num_anchors=0)
    with pytest.raises(ValueError, match="num_steps"):
        ppr_anchors(adj, core.index, torch.tensor([0]), num_steps=0)
    with pytest.raises(ValueError, match="alpha"):
        ppr_anchors(adj, core.index, torch.tensor([0]), alpha=1.0)
    with pytest.raises(ValueError, match="embed_channels == out_channels"):
        AnchorDecoder(4, 3, 2)


def test_decoder_starts_at_anchor_average_and_learns():
    torch.manual_seed(0)
    dec = AnchorDecoder(5, 3, 3, hidden_channels=16)
    x, emb, ax = torch.randn(50, 5), torch.randn(50, 3), torch.randn(50, 5)
    mass = torch.rand(50)
    assert torch.equal(dec(x, emb, ax, mass), emb)  # residual, zero-init head
    target = emb + x[:, :3]
    opt = torch.optim.Adam(dec.parameters(), lr=0.02)
    first = None
    for _ in range(120):
        opt.zero_grad()
        loss = ((dec(x, emb, ax, mass) - target) ** 2).mean()
        first = first if first is not None else float(loss.detach())
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.2 * first
    plain = AnchorDecoder(5, 3, 2, anchor_features=False, residual=False)
    assert plain(x, emb).shape == (50, 2)
    with pytest.raises(ValueError, match="anchor_x"):
        dec(x, emb)


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("anchor_features,residual,act",
                         [(True, True, None), (False, True, None),
                          (True, False, None), (True, True, "tanh")])
def test_anchored_serving_equals_concatenated_inputs(layers, anchor_features,
                                                     residual, act):
    # forward() on the concatenated inputs is the reference; the serving path
    # reassociates the first Linear, so only float64 rounding may differ.
    torch.manual_seed(0)
    f, c, n_core, b = 6, 3, 40, 25
    dec = AnchorDecoder(f, c, 3 if residual else 2, hidden_channels=16,
                        num_layers=layers, anchor_features=anchor_features,
                        residual=residual).double().eval()
    if act == "tanh":  # not a ReLU: the serving path must not run it in place
        dec.mlp.act = torch.nn.Tanh()
    for p in dec.parameters():  # the zero-init head would hide the MLP
        torch.nn.init.normal_(p)
    h, xc = torch.randn(n_core, c).double(), torch.randn(n_core, f).double()
    w = torch.rand(b, n_core).double() * (torch.rand(b, n_core) < 0.2)
    w[0] = 0.0  # a node without anchors
    x, mass = torch.randn(b, f).double(), torch.rand(b).double()
    mass[1] = 0.0
    ref = dec(x, w @ h, w @ xc if anchor_features else None, mass)
    ws = w.to_sparse_csr()
    got = dec.forward_anchored(x, ws @ dec.project_core(
        h, xc if anchor_features else None), mass)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    if anchor_features:
        with pytest.raises(ValueError, match="core_x"):
            dec.project_core(h)


def test_val_error_is_the_error_rate_or_one_minus_r2():
    out = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 3.0], [0.0, 5.0, 1.0],
                        [1.0, 0.0, 0.0]])
    y = torch.tensor([0, 1, 1, 2])
    assert val_error(out, y) == 0.5  # rows 1 and 3 wrong
    # regression: MSE / population variance, from numpy
    rng = np.random.default_rng(0)
    yr = rng.normal(size=40)
    pred = yr + rng.normal(scale=0.5, size=40)
    ref = np.mean((pred - yr) ** 2) / np.var(yr)
    got = val_error(torch.tensor(pred).view(-1, 1), torch.tensor(yr))
    assert got == pytest.approx(ref, rel=1e-12)
    # a constant target has no variance: the MSE itself
    assert val_error(torch.ones(3, 1), torch.zeros(3)) == 1.0


def test_decoder_batches_hold_out_the_last_tenth_of_every_graph():
    train, val = decoder_batches([95, 10, 40], batch_size=16)
    rows = {g: [] for g in range(3)}
    for g, a, b in train:
        rows[g] += [("t", r) for r in range(a, b)]
    for g, a, b in val:
        assert b - a <= 16
        rows[g] += [("v", r) for r in range(a, b)]
    for g, n, n_val in ((0, 95, 9), (1, 10, 0), (2, 40, 4)):
        assert sorted(r for _, r in rows[g]) == list(range(n))  # each row once
        assert [r for k, r in rows[g] if k == "v"] == list(range(n - n_val, n))


def test_compare_to_average_against_a_direct_computation():
    torch.manual_seed(0)
    dec = AnchorDecoder(4, 3, 3, hidden_channels=8)
    for p in dec.parameters():  # a head that is not zero: a real decoder
        torch.nn.init.normal_(p)
    x, emb, ax, mass = torch.randn(30, 4), torch.randn(30, 3), torch.randn(30, 4), \
        torch.rand(30)
    y = torch.randint(0, 3, (30,))
    val = [(0, 10, 20), (0, 20, 30)]  # rows 0..9 must not count

    def inputs(g, a, b):
        return x[a:b], emb[a:b], ax[a:b], mass[a:b]

    def target(g, a, b):
        return y[a:b]

    def loss_fn(out, data):
        return torch.nn.functional.cross_entropy(out, data.y)

    fig = compare_to_average(dec, inputs, target, val, loss_fn)
    with torch.no_grad():
        out = dec(x[10:], emb[10:], ax[10:], mass[10:])
    ce = torch.nn.functional.cross_entropy
    assert fig["decoder_val_loss"] == pytest.approx(float(ce(out, y[10:])))
    assert fig["average_val_loss"] == pytest.approx(float(ce(emb[10:], y[10:])))
    err_d = float((out.argmax(1) != y[10:]).float().mean())
    err_a = float((emb[10:].argmax(1) != y[10:]).float().mean())
    assert fig["decoder_val_error"] == pytest.approx(err_d)
    assert fig["average_val_error"] == pytest.approx(err_a)
    assert fig["decoder_gain"] == pytest.approx(err_a - err_d)
    assert fig["decoder_val_rows"] == 20
