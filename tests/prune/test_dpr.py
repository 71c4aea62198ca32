"""DPRStrategy: r = 1 equals plain full-batch training; the saving at r < 1."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from leangnn.config import TrainConfig
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.metrics import accuracy
from leangnn.nn.models import build_model
from leangnn.profile import SavedTensorsMeter
from leangnn.prune import AnchorDecoder, Anchors, DPRConfig, DPRStrategy
from leangnn.train import Trainer, make_loss_fn

LOSS = make_loss_fn("classification")


def _graph(n=1200, seed=0):
    d = contextual_sbm(n, avg_degree=8, seed=seed)
    d.node_mask = d.train_mask
    return d


def _model(d, seed=0, dropout=0.3):
    torch.manual_seed(seed)
    return build_model("sage", d.num_features, 32, int(d.y.max()) + 1, 2,
                       dropout=dropout)


def _in_float64(strat, st, d):
    """The features, the core's operands and the pruned nodes' anchors in
    float64 (anchors computed if needed), so float32 rounding cannot hide a
    wrong term."""
    d.x = d.x.double()
    st.train_data.x = st.train_data.x.double()
    if st.train_data.get("adj_t") is not None:
        st.train_data.adj_t = st.train_data.adj_t.double()
    strat._ensure_anchors(st, d, rows=False)
    st.anchors.weight = st.anchors.weight.double()
    st.anchors.mass = st.anchors.mass.double()


def _plain(d, epochs, seed=0):
    """The reference: a plain full-batch loop, no strategy involved."""
    model = _model(d, seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(d.x, d.edge_index)
        F.cross_entropy(out[d.train_mask], d.y[d.train_mask]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        return model(d.x, d.edge_index)


def _with_strategy(strategy, d, epochs, seed=0):
    """The trainer's hook order: setup, train_step per epoch, fit_end, predict."""
    model = _model(d, seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    strategy.setup(model, [d])
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        strategy.train_step(model, d, LOSS)
        opt.step()
    strategy.fit_end(model, [d], LOSS)
    model.eval()
    return strategy.predict(model, d), model


def test_r1_equals_plain_full_batch_training():
    d = _graph()
    ref = _plain(d, 12)
    out, _ = _with_strategy(DPRStrategy(budget_ratio=1.0, edge_budget="ratio"), d, 12)
    assert torch.equal(out, ref)
    tm = d.test_mask
    assert accuracy(out[tm], d.y[tm]) == accuracy(ref[tm], d.y[tm])


def test_r1_sparse_adjacency_matches_plain():
    d = _graph()
    ref = _plain(d, 8)
    out, _ = _with_strategy(DPRStrategy(budget_ratio=1.0, sparse_adj=True), d, 8)
    assert torch.allclose(out, ref, atol=1e-4)


def test_r1_same_metrics_through_the_trainer(tmp_path):
    common = dict(dataset="csbm:1500", model="sage", num_layers=2,
                  hidden_channels=16, epochs=4, patience=0, seed=3,
                  dropout=0.2, task="critical")
    full = Trainer(TrainConfig(strategy="full", out=str(tmp_path / "f"), **common),
                   progress=False).fit()
    dpr = Trainer(TrainConfig(strategy="prune", budget_ratio=1.0,
                              out=str(tmp_path / "p"), **common),
                  progress=False).fit()
    assert dpr["metrics"]["test"] == full["metrics"]["test"]
    assert dpr["core_size"] == 1500 and dpr["core_ratio"] == 1.0


def test_trainer_summary_records_core_anchors_and_inference_time(tmp_path):
    cfg = TrainConfig(dataset="csbm:1500", strategy="prune", model="sage",
                      num_layers=2, hidden_channels=16, epochs=3, patience=0,
                      budget_ratio=0.3, num_anchors=5, task="critical",
                      out=str(tmp_path))
    s = Trainer(cfg, progress=False).fit()
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in ("core_size", "anchors_per_node", "all_node_inference_s"):
        assert key in on_disk
    assert s["core_size"] == 450
    assert 0 < s["anchors_per_node"] <= 5 and s["max_anchors_per_node"] <= 5
    assert s["decoder_rows"] > 0


def test_saving_at_r03_on_saved_activations():
    """The off switch (r = 1) saves for backward what full-batch saves; the
    core at r = 0.3 saves far less (plain edge_index path, counted exactly)."""
    d = contextual_sbm(3000, avg_degree=10, seed=1)
    d.node_mask = d.train_mask

    def saved(strategy):
        model = _model(d)
        strategy.setup(model, [d])
        with SavedTensorsMeter() as m:
            strategy.train_step(model, d, LOSS)
        return m.bytes

    with SavedTensorsMeter() as m:
        model = _model(d)
        LOSS(model(d.x, d.edge_index), d).backward()
    full = m.bytes
    assert saved(DPRStrategy(budget_ratio=1.0)) == full
    assert saved(DPRStrategy(budget_ratio=0.3, edge_budget="ratio")) < 0.45 * full


def test_decoder_reconstructs_better_than_no_reconstruction():
    d = _graph(2000, seed=2)
    strat = DPRStrategy(budget_ratio=0.3, num_anchors=8, decoder_epochs=60,
                        decoder="learned")
    out, model = _with_strategy(strat, d, 40)
    st = strat.prepare(d)
    pruned_test = d.test_mask & ~st.core.mask
    dpr = accuracy(out[pruned_test], d.y[pruned_test])
    # no reconstruction: pruned nodes get the core's majority class
    maj = torch.bincount(d.y[st.core.index]).max() / st.core.num_core
    assert dpr > float(maj) + 0.3
    # rows of the decoder: every labelled node (core ones masked as pruned)
    assert strat.summary()["decoder_rows"] == int(d.train_mask.sum())
    core_only = DPRStrategy(budget_ratio=0.3, decoder_rows="core", decoder_epochs=2,
                            decoder="learned")
    _with_strategy(core_only, d, 1)
    assert core_only.summary()["decoder_rows"] == int(d.train_mask[st.core.index].sum())


def test_predict_before_fit_end_uses_anchor_average_and_state_roundtrip():
    d = _graph(800)
    # edge_index kept, for the plain PyG reference below
    strat = DPRStrategy(budget_ratio=0.4, decoder_epochs=5, sparse_adj=False)
    model = _model(d)
    strat.setup(model, [d])
    model.eval()
    out = strat.predict(model, d)
    st = strat.prepare(d)
    h = model(st.train_data.x, st.train_data.edge_index)
    assert torch.allclose(out[st.core.index], h)
    avg = st.anchors.weight @ h
    assert torch.allclose(out[st.pruned], avg, atol=1e-6)
    strat.fit_end(model, [d], LOSS)
    model.eval()
    a = strat.predict(model, d)
    other = DPRStrategy()
    other.load_state_dict(strat.state_dict())
    assert other.config == strat.config
    assert torch.allclose(other.predict(model, d), a)


def test_several_graphs_are_cached_by_name():
    g1, g2 = _graph(600, seed=1), _graph(700, seed=2)
    g1.name, g2.name = "a", "b"
    strat = DPRStrategy(budget_ratio=0.5, decoder_epochs=2)
    model = _model(g1)
    strat.setup(model, [g1, g2])
    assert strat.prepare(g1).core.num_core == 300
    assert strat.prepare(g2).core.num_core == 350
    strat.fit_end(model, [g1, g2], LOSS)
    assert strat.predict(model, g2).shape == (700, int(g2.y.max()) + 1)
    assert strat.summary()["core_size"] == 650


def test_from_config_and_bad_config():
    cfg = TrainConfig(strategy="prune", budget_ratio=0.2, num_anchors=3, seed=7)
    s = DPRStrategy.from_config(cfg)
    assert (s.config.budget_ratio, s.config.num_anchors, s.config.seed) == (0.2, 3, 7)
    with pytest.raises(ValueError, match="budget_ratio"):
        DPRConfig(budget_ratio=0.0)
    with pytest.raises(ValueError, match="decoder_rows"):
        DPRConfig(decoder_rows="all")
    with pytest.raises(ValueError, match="edge_budget"):
        DPRConfig(edge_budget="half")
    with pytest.raises(ValueError, match="unknown DPRConfig"):
        DPRStrategy(budget=0.3)


def test_pruned_core_trains_on_a_sparse_adjacency_by_default():
    # No [E, C] message tensor on a pruned graph (the CLI's memory at 2.45M
    # nodes); sparse_adj=False is the off switch; the same model either way.
    d = _graph()
    auto = DPRStrategy(budget_ratio=0.3)
    off = DPRStrategy(budget_ratio=0.3, sparse_adj=False)
    a, b = auto.prepare(d).train_data, off.prepare(d).train_data
    assert "adj_t" in a and "edge_index" not in a
    assert "edge_index" in b and "adj_t" not in b
    assert "edge_index" in DPRStrategy(budget_ratio=1.0).prepare(d).train_data
    model = _model(d, dropout=0.0).eval()
    with torch.no_grad():
        ref = model(b.x, b.edge_index)  # plain PyG on the core's edge list
        assert torch.allclose(auto.forward(model, a), ref, atol=1e-5)


def _scattering_model(kind, d):
    from torch_geometric.nn import PNA, EdgeCNN

    torch.manual_seed(0)
    c = int(d.y.max()) + 1
    if kind == "pna":
        deg = torch.bincount(torch.bincount(d.edge_index[1], minlength=d.num_nodes))
        return PNA(d.num_features, 16, 2, c, aggregators=["mean", "max"],
                   scalers=["identity"], deg=deg)
    return EdgeCNN(d.num_features, 16, 2, c)


@pytest.mark.parametrize("kind", ["pna", "edgecnn"])
def test_a_model_the_csr_core_breaks_trains_on_the_edge_list_as_sparse_adj_false(
        kind):
    # PNA scatters over the CSR's int32 indices (its first step raised);
    # EdgeCNN's max over it gave NaN gradients. By default (sparse_adj=None)
    # setup's probe sends such a model to the edge list: the very run of the
    # off switch, step for step.
    d = _graph(600)
    runs = {}
    for sparse in (None, False):
        strat = DPRStrategy(budget_ratio=0.3, sparse_adj=sparse)
        model = _scattering_model(kind, d)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        strat.setup(model, [d])
        losses = []
        for _ in range(3):
            opt.zero_grad()
            losses.append(strat.train_step(model, d, LOSS))
            opt.step()
        runs[sparse] = losses, strat
    (auto, strat), (off, _) = runs[None], runs[False]
    assert auto == off and all(torch.isfinite(torch.tensor(auto)))
    core = strat.prepare(d).train_data
    assert "edge_index" in core and "adj_t" not in core
    assert strat.summary()["csr_probe"].startswith("edge list (on the core's CSR")


def test_a_model_the_csr_core_serves_keeps_it_and_the_probe_says_so():
    d = _graph(600)
    strat = DPRStrategy(budget_ratio=0.3)
    strat.setup(_model(d), [d])
    assert "adj_t" in strat.prepare(d).train_data
    assert strat.summary()["csr_probe"] == "passed"
    # our deep models need none (their CSR kernels are tested against edge
    # lists; the probe's copy of a 128 x 64 GSR took 9.2 s and +395 MiB)
    s = DPRStrategy(budget_ratio=0.3)
    s.setup(build_model("res", d.num_features, 16, int(d.y.max()) + 1, 2), [d])
    assert s.summary()["csr_probe"].startswith("not needed")
    assert "adj_t" in s.prepare(d).train_data
    # the off switch and an explicit choice run no probe
    for sparse in (True, False):
        s = DPRStrategy(budget_ratio=0.3, sparse_adj=sparse)
        s.setup(_model(d), [d])
        assert "csr_probe" not in s.summary()


def test_fused_serving_equals_unfused_in_float64():
    d = _graph(600)
    strat = DPRStrategy(budget_ratio=0.3, decoder_epochs=3, decoder="learned")
    model = _model(d)
    strat.setup(model, [d])
    strat.fit_end(model, [d], LOSS)
    st = strat.prepare(d)
    model.double().eval()
    strat.decoder.double()
    for p in strat.decoder.parameters():  # zero-init head would hide the MLP
        torch.nn.init.normal_(p)
    _in_float64(strat, st, d)
    fused = strat.predict(model, d, fused=True)
    plain = strat.predict(model, d, fused=False)
    assert fused.dtype == torch.float64 and st.pruned.numel() > 0
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-10)
    assert not torch.allclose(fused[st.pruned], st.anchors.weight @ model(
        st.train_data.x, st.train_data.adj_t))  # the decoder did something


@pytest.mark.parametrize("fused,name", [(True, "sage"), (False, "sage"),
                                        (True, "gcn")])
def test_fast_serving_equals_the_model_and_csr_path_in_float64(fused, name):
    # Default serving (reassociated GraphSAGE / GCN normalised once,
    # embedding_bag products) against the model's own forward with
    # torch.sparse products (both off switches).
    d = _graph(600)
    strat = DPRStrategy(budget_ratio=0.3, decoder_epochs=2, chunk_size=70)
    torch.manual_seed(0)
    model = build_model(name, d.num_features, 32, int(d.y.max()) + 1, 2)
    strat.setup(model, [d])
    st = strat.prepare(d)
    model.double().eval()
    _in_float64(strat, st, d)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    # before fit_end: anchor averaging of the encoder's outputs
    ref = strat.predict(model, d, kernel="csr", reassociate=False)
    torch.testing.assert_close(strat.predict(model, d), ref, rtol=0, atol=1e-10)
    with torch.no_grad():
        h = model(d.x[st.core.index], st.train_data.adj_t)
    torch.testing.assert_close(ref[st.pruned], st.anchors.weight @ h, rtol=0,
                               atol=1e-10)
    strat.decoder = AnchorDecoder(d.num_features, h.size(1), h.size(1), 16).double()
    for p in strat.decoder.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ref = strat.predict(model, d, fused=fused, kernel="csr", reassociate=False)
    for kernel in ("bag", "csr"):
        out = strat.predict(model, d, fused=fused, kernel=kernel)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="kernel"):
        strat.predict(model, d, kernel="dense")
    with pytest.raises(ValueError, match="serve_kernel"):
        DPRConfig(serve_kernel="mkl")


def test_serving_reads_the_features_of_every_call():
    # Only graph-derived operands are reused across calls: new features on
    # the same graph (same cache key) give the model's outputs on them.
    d = _graph(500)
    strat = DPRStrategy(budget_ratio=0.4, decoder_epochs=1)
    model = _model(d).eval()
    strat.setup(model, [d])
    strat.fit_end(model, [d], LOSS)
    st = strat.prepare(d)
    first = strat.predict(model, d)
    d2 = d.clone()
    d2.x = d.x * 2 + 1
    second = strat.predict(model, d2)
    assert strat.prepare(d2) is st
    with torch.no_grad():
        h2 = model(d2.x[st.core.index], st.train_data.adj_t)
    torch.testing.assert_close(second[st.core.index], h2, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(first[st.pruned], second[st.pruned], atol=1e-3)


def test_serving_rejects_features_of_the_wrong_shape():
    # one-line errors naming data.x and what was received, not a matmul error
    # (too wide) or a silent run (too few rows)
    d = _graph(300)
    strat = DPRStrategy(budget_ratio=0.4, decoder_epochs=1)
    model = _model(d).eval()
    strat.setup(model, [d])
    strat.predict(model, d)  # the graph's state is cached
    wide = d.clone()
    wide.x = torch.randn(d.num_nodes, d.x.size(1) + 3)
    with pytest.raises(ValueError, match=f"data.x has {d.x.size(1) + 3} features"):
        strat.predict(model, wide)
    short = d.clone()
    short.num_nodes = d.num_nodes
    short.x = d.x[:-1]
    with pytest.raises(ValueError, match=r"data.x must be \[num_nodes=300, F\], "
                       rf"got \({d.num_nodes - 1}, {d.x.size(1)}\)"):
        strat.predict(model, short)


def test_serving_chunks_follow_replaced_anchors():
    # Anchor chunks are sliced once and reused; new anchors must replace them.
    d = _graph(500)
    strat = DPRStrategy(budget_ratio=0.4, chunk_size=64)
    model = _model(d).eval()
    strat.setup(model, [d])
    first = strat.predict(model, d)  # before fit_end: anchor averaging
    st = strat.prepare(d)
    a = st.anchors
    st.anchors = Anchors(a.nodes, a.weight * 0.5, a.mass)
    second = strat.predict(model, d)
    torch.testing.assert_close(second[st.pruned], first[st.pruned] * 0.5)
    torch.testing.assert_close(second[st.core.index], first[st.core.index])


# ------------------------------------------------------------- decoder choice
class _Identity(torch.nn.Module):
    """An encoder whose core outputs are the core's features (no weights)."""

    def forward(self, x, *args):
        return x


def _groups(num_groups=50, size=5, leaves=3, helps=True, seed=0):
    """Cliques of ``size`` nodes, the first one a hub with ``leaves`` pendant
    nodes (so the hub is every group's most important node, always in the
    core, one hop from all its group). Features are one-hot labels. With
    ``helps``, labels are random per node: anchor averaging of the identity
    encoder mixes a group's labels, the decoder can read the node's own
    features. Otherwise the whole group shares a label: averaging is already
    exact, and no decoder can lower the error below zero."""
    gen = torch.Generator().manual_seed(seed)
    per = size + leaves
    edges = []
    for g in range(num_groups):
        base = g * per
        edges += [(base + i, base + j) for i in range(size) for j in range(size)
                  if i != j]
        edges += [e for i in range(size, per) for e in ((base, base + i),
                                                        (base + i, base))]
    n = num_groups * per
    if helps:
        y = torch.randint(0, 4, (n,), generator=gen)
    else:
        y = (torch.arange(n) // per) % 4
    d = Data(x=F.one_hot(y, 4).float(), edge_index=torch.tensor(edges).t(), y=y,
             num_nodes=n)
    d.node_mask = torch.ones(n, dtype=torch.bool)
    return d


def _choice_strategy(**kw):
    # the decoder learns from pruned nodes: all of them anchor on their hub
    return DPRStrategy(**{"budget_ratio": 0.25, "bridge": "none", "decoder_epochs": 10,
                          "decoder_batch_size": 128, "decoder_lr": 0.05,
                          "decoder_rows": "pruned", "decoder_patience": 0, **kw})


@pytest.mark.parametrize("helps", [True, False])
def test_auto_keeps_the_decoder_only_where_it_pays_off(helps):
    d = _groups(helps=helps)
    auto = _choice_strategy()
    model = _Identity()
    auto.setup(model, [d])
    st = auto.prepare(d)
    assert int(st.core.mask.view(-1, 8)[:, 0].sum()) == 50  # every hub is core
    auto.fit_end(model, [d], LOSS)
    s = auto.summary()
    if helps:
        # the decoder reads the label off the node's features
        assert s["decoder_choice"] == "learned" and auto.decoder is not None
        assert s["decoder_val_error"] < 0.05 < 0.4 < s["average_val_error"]
    else:
        # averaging is exact: the decoder can only sharpen the logits (lower
        # loss), never lower the error, so it is dropped
        assert s["decoder_choice"] == "average" and auto.decoder is None
        assert s["average_val_error"] == 0.0 and s["decoder_gain"] <= 0.0
        # `leangnn predict` reads "decoder_rows" as "a decoder serves"
        assert "decoder_rows" not in s and s["dropped_decoder_rows"] > 0
        assert s["decoder_val_loss"] < s["average_val_loss"]
    assert s["decoder_gain"] == pytest.approx(s["average_val_error"]
                                              - s["decoder_val_error"])
    # "learned" trains the same decoder and always keeps it; both serve it alike
    learned = _choice_strategy(decoder="learned")
    learned.setup(model, [d])
    learned.fit_end(model, [d], LOSS)
    assert learned.decoder is not None
    assert learned.summary()["decoder_val_loss"] == s["decoder_val_loss"]
    if helps:
        torch.testing.assert_close(auto.predict(model, d), learned.predict(model, d),
                                   rtol=0, atol=0)
    # a gain threshold above the measured gain drops even a helpful decoder
    strict = _choice_strategy(decoder_min_gain=1.0)
    strict.setup(model, [d])
    strict.fit_end(model, [d], LOSS)
    assert strict.decoder is None and strict.summary()["decoder_choice"] == "average"


def test_auto_decides_on_the_held_out_rows_only(monkeypatch):
    # The decision sees exactly the last tenth of the decoder's (shuffled)
    # rows, none of which the decoder took a gradient step on, and its
    # figures equal an independent computation on those nodes.
    from leangnn.graphs.sparse import undirected_csr
    from leangnn.prune import dpr as dpr_mod
    from leangnn.prune.decoder import ppr_anchors

    seen = {}
    real_train, real_cmp = dpr_mod.train_decoder, dpr_mod.compare_to_average

    def spy_train(dec, inputs, target, train, val, *a):
        seen["train"], seen["val"] = list(train), list(val)
        return real_train(dec, inputs, target, train, val, *a)

    def spy_cmp(dec, inputs, target, val, loss_fn):
        seen["cmp"] = list(val)
        return real_cmp(dec, inputs, target, val, loss_fn)

    monkeypatch.setattr(dpr_mod, "train_decoder", spy_train)
    monkeypatch.setattr(dpr_mod, "compare_to_average", spy_cmp)
    d = _groups(helps=True, seed=1)
    strat = _choice_strategy(decoder="learned")
    model = _Identity()
    strat.setup(model, [d])
    rows = strat.prepare(d).rows
    n = rows.numel()
    strat.fit_end(model, [d], LOSS)
    val_rows = [r for _, a, b in seen["cmp"] for r in range(a, b)]
    train_rows = {r for _, a, b in seen["train"] for r in range(a, b)}
    assert seen["cmp"] == seen["val"]
    assert val_rows == list(range(n - n // 10, n))
    assert not train_rows & set(val_rows) and len(train_rows) == n - n // 10
    nodes = rows[n - n // 10:]
    st = strat.prepare(d)
    anc = ppr_anchors(undirected_csr(d.edge_index, d.num_nodes), st.core.index, nodes)
    avg = anc.weight.to_dense().double() @ d.x[st.core.index].double()
    err = float((avg.argmax(1) != d.y[nodes]).double().mean())
    s = strat.summary()
    assert s["average_val_error"] == pytest.approx(err, abs=1e-12)
    assert s["decoder_val_rows"] == n // 10


def test_average_is_anchor_averaging_in_float64_and_trains_nothing():
    d = _graph(700)
    strat = DPRStrategy(budget_ratio=0.3, decoder="average", sparse_adj=False)
    model = _model(d, dropout=0.0)
    strat.setup(model, [d])
    strat.fit_end(model, [d], LOSS)
    st = strat.prepare(d)
    assert strat.decoder is None and st.row_anchors is None
    s = strat.summary()
    assert s["decoder_choice"] == "average" and "decoder_rows" not in s
    model.double().eval()
    _in_float64(strat, st, d)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    out = strat.predict(model, d)
    # reference: plain PyG on the core's edges, dense anchor weights
    with torch.no_grad():
        h = model(d.x[st.core.index], st.train_data.edge_index)
    w = st.anchors.weight.to_dense()
    assert w.shape == (st.pruned.numel(), st.core.num_core)
    torch.testing.assert_close(out[st.core.index], h, rtol=0, atol=1e-10)
    torch.testing.assert_close(out[st.pruned], w @ h, rtol=0, atol=1e-10)


def test_learned_serves_its_decoder_on_the_anchor_inputs_in_float64():
    d = _groups(helps=False)
    strat = _choice_strategy(decoder="learned", decoder_epochs=5)
    model = _Identity()
    strat.setup(model, [d])
    strat.fit_end(model, [d], LOSS)
    s = strat.summary()
    assert s["decoder_choice"] == "learned" and s["decoder_gain"] <= 0.0
    dec = strat.decoder.double()
    for p in dec.parameters():
        torch.nn.init.normal_(p, std=0.3)
    st = strat.prepare(d)
    _in_float64(strat, st, d)
    w = st.anchors.weight.to_dense()
    xc = d.x[st.core.index]
    with torch.no_grad():
        ref = dec(d.x[st.pruned], w @ xc, w @ xc, st.anchors.mass)
    out = strat.predict(model, d)
    torch.testing.assert_close(out[st.pruned], ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(out[st.core.index], xc, rtol=0, atol=0)


def test_decoder_choice_survives_the_state_roundtrip_and_old_states_load():
    d = _groups(helps=False)
    model = _Identity()
    strat = _choice_strategy()
    strat.setup(model, [d])
    strat.fit_end(model, [d], LOSS)
    assert strat.decoder is None
    state = strat.state_dict()
    other = DPRStrategy()
    other.load_state_dict(state)
    assert other.decoder is None and other.config == strat.config
    assert other.summary()["decoder_choice"] == "average"
    torch.testing.assert_close(other.predict(model, d), strat.predict(model, d))
    # a state saved before the decoder choice existed (no such fields)
    learned = _choice_strategy(decoder="learned", decoder_epochs=3)
    learned.setup(model, [d])
    learned.fit_end(model, [d], LOSS)
    old = learned.state_dict()
    old.pop("decoder_choice")
    for k in ("decoder", "decoder_min_gain"):
        old["config"].pop(k)
    restored = DPRStrategy()
    restored.load_state_dict(old)
    assert restored.decoder is not None and restored.config.decoder == "auto"
    torch.testing.assert_close(restored.predict(model, d), learned.predict(model, d))


@pytest.mark.parametrize("kw,match", [
    ({"decoder": "mlp"}, r"decoder must be one of .*got 'mlp'"),
    ({"decoder": None}, r"decoder must be one of .*got None"),
    ({"decoder_min_gain": -0.1}, r"decoder_min_gain must be a number in \[0, 1\], "
                                 r"got -0.1"),
    ({"decoder_min_gain": 1.5}, r"decoder_min_gain .*got 1.5"),
    ({"decoder_min_gain": "0.1"}, r"decoder_min_gain .*got '0.1'"),
    ({"decoder_min_gain": True}, r"decoder_min_gain .*got True"),
])
def test_bad_decoder_choice_values(kw, match):
    with pytest.raises(ValueError, match=match):
        DPRConfig(**kw)
    with pytest.raises(ValueError, match=match):
        DPRStrategy(**kw)


# ------------------------------------------------- a core offered by the planner
def _assert_same_state(a, b):
    """Two prepared states hold equal tensors (core, training graph, rows)."""
    for key in ("index", "mask"):
        assert torch.equal(getattr(a.core, key), getattr(b.core, key))
    assert torch.equal(a.pruned, b.pruned) and torch.equal(a.rows, b.rows)
    assert (a.num_edges, a.canonical) == (b.num_edges, b.canonical)
    ta, tb = a.train_data, b.train_data
    assert sorted(ta.keys()) == sorted(tb.keys())
    for key in ta.keys():
        va, vb = ta[key], tb[key]
        if isinstance(va, torch.Tensor) and va.layout == torch.sparse_csr:
            for part in ("crow_indices", "col_indices", "values"):
                assert torch.equal(getattr(va, part)(), getattr(vb, part)())
        elif isinstance(va, torch.Tensor):
            assert torch.equal(va, vb), key
        else:
            assert va == vb, key


@pytest.fixture
def no_offers():
    from leangnn.prune import dpr

    dpr.withdraw_offers()
    yield
    dpr.withdraw_offers()


def test_offered_core_is_taken_once_and_equals_a_fresh_one(no_offers, monkeypatch):
    from leangnn.prune import dpr

    d = _graph()
    DPRStrategy(budget_ratio=0.3, seed=5).offer(d)
    taker = DPRStrategy(budget_ratio=0.3, seed=5)
    st = taker.prepare(d)
    assert taker.summary()["core_reused"] is True and not dpr._OFFERS  # taken
    monkeypatch.setenv("LEANGNN_PLAN_REUSE", "0")
    fresh = DPRStrategy(budget_ratio=0.3, seed=5)
    _assert_same_state(st, fresh.prepare(d))
    assert "core_reused" not in fresh.summary()
    # the planner's way: its importance scores and adjacency handed in
    monkeypatch.delenv("LEANGNN_PLAN_REUSE")
    from leangnn.graphs.sparse import undirected_csr
    from leangnn.prune.importance import node_importance

    adj = undirected_csr(d.edge_index, d.num_nodes)
    score = node_importance(d.edge_index, d.num_nodes, "pagerank", adj=adj)
    DPRStrategy(budget_ratio=0.3, seed=5).offer(d, score=score, adj=adj)
    _assert_same_state(DPRStrategy(budget_ratio=0.3, seed=5).prepare(d),
                       fresh.prepare(d))


def test_offered_core_serves_only_the_same_unchanged_graph_and_config(
        no_offers, monkeypatch):
    from leangnn.prune import dpr

    d = _graph()
    DPRStrategy(budget_ratio=0.3).offer(d)
    other = DPRStrategy(budget_ratio=0.5)  # another configuration
    other.prepare(d)
    assert "core_reused" not in other.summary() and len(dpr._OFFERS) == 1
    twin = d.clone()  # equal content, another graph
    t = DPRStrategy(budget_ratio=0.3)
    t.prepare(twin)
    assert "core_reused" not in t.summary()
    d.x[0] += 1.0  # the graph changed in place after the offer
    changed = DPRStrategy(budget_ratio=0.3)
    st = changed.prepare(d)
    assert "core_reused" not in changed.summary()
    assert torch.equal(st.train_data.x, d.x[st.core.index])  # the new features
    # switched off: nothing is kept
    monkeypatch.setenv("LEANGNN_PLAN_REUSE", "0")
    dpr.withdraw_offers()
    DPRStrategy(budget_ratio=0.3).offer(d)
    assert not dpr._OFFERS
    monkeypatch.delenv("LEANGNN_PLAN_REUSE")
    # bounded, and withdraw keeps the one configuration asked for
    for r in (0.1, 0.2, 0.3, 0.4, 0.5):
        DPRStrategy(budget_ratio=r).offer(d)
    assert len(dpr._OFFERS) == dpr.OFFERS
    dpr.withdraw_offers(drop=DPRConfig(budget_ratio=0.2))  # that one only
    assert [json.loads(o[1])["budget_ratio"] for o in dpr._OFFERS] == \
        [0.3, 0.4, 0.5]
    dpr.withdraw_offers(keep=DPRConfig(budget_ratio=0.4))
    assert len(dpr._OFFERS) == 1 and DPRStrategy(budget_ratio=0.4).prepare(d)
    assert not dpr._OFFERS
    # an importance callable names no scores: never offered
    DPRStrategy(budget_ratio=0.3, importance=lambda ei, n: torch.rand(n)).offer(d)
    assert not dpr._OFFERS


def test_setup_refuses_edge_features_the_model_takes():
    """DPR's core adjacency has no edge features (its bridges are new
    edges): a model that takes them is refused at setup, naming them."""
    from torch_geometric.nn import GAT

    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=2)
    g.edge_attr = torch.randn(g.num_edges, 2)
    with pytest.raises(ValueError, match=r"prune: the graph has edge features "
                       r"\(edge_attr \(\d+, 2\)\) that GAT takes"):
        DPRStrategy(budget_ratio=0.3).setup(GAT(8, 16, 2, 4, edge_dim=2), [g])
    # a model that ignores them trains on the core as before
    DPRStrategy(budget_ratio=0.3).setup(build_model("sage", 8, 16, 4, 2), [g])


def test_setup_refuses_a_graph_level_task():
    """DPR trains node outputs of its core: a model that pools by
    ``data.batch``, or targets one per graph, is refused at setup; node
    targets on several graphs train as before."""
    from torch_geometric.data import Batch
    from torch_geometric.nn import GCN

    gs = [contextual_sbm(100, avg_degree=4.0, in_channels=8, seed=i) for i in range(3)]
    nodes = Batch.from_data_list([type(g)(x=g.x, edge_index=g.edge_index, y=g.y)
                                  for g in gs])
    with pytest.raises(ValueError, match=r"prune: GCN reads the graph of every "
                       r"node \(data.batch, 3 graphs\), and DPR trains on a core"):
        DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4, norm="graph_norm"),
                                            [nodes])
    graphs = nodes.clone()
    graphs.y = torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match=r"prune: the targets are one per graph "
                       r"\(y \[3\] for the 3 graphs of data.batch\)"):
        DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [graphs])
    DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [nodes])
    link = contextual_sbm(100, avg_degree=4.0, in_channels=8, seed=5)
    link.edge_label_index = link.edge_index[:, :10]
    with pytest.raises(ValueError, match=r"prune: data.edge_label_index \[2, 10\] "
                       r"holds node ids of the whole graph, which the core "):
        DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [link])


def test_setup_refuses_a_conv_that_caches_one_graphs_normalisation():
    """GCNConv(cached=True) keeps the first graph it sees: after a forward on
    the whole graph the core step failed inside the conv (an IndexError),
    and a core-trained conv would serve the whole graph with the core's."""
    from torch_geometric.nn import GCN

    g = contextual_sbm(200, avg_degree=4.0, in_channels=8, seed=6)
    model = GCN(8, 16, 2, 4, cached=True)
    model(g.x, g.edge_index)
    with pytest.raises(ValueError, match=r"prune: GCNConv\(cached=True\) keeps the "
                       r"normalisation of the first graph it sees.*cached=False"):
        DPRStrategy(budget_ratio=0.3).setup(model, [g])
    DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [g])


def test_setup_refuses_a_core_without_a_node_to_train_on():
    """Few labels, none among the important nodes: the core's loss was over
    no node (NaN, which fit reported as bad labels or learning rate)."""
    from torch_geometric.nn import GCN

    from leangnn.data import with_mask

    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=8)
    deg = torch.bincount(g.edge_index[1], minlength=g.num_nodes)
    mask = torch.zeros(g.num_nodes, dtype=torch.bool)
    mask[torch.argsort(deg, stable=True)[:3]] = True  # the least connected
    g = with_mask(g, mask)
    strategy = DPRStrategy(budget_ratio=0.3)
    assert not bool(strategy.prepare(g).train_data.node_mask.any())
    with pytest.raises(ValueError, match=r"prune: the core holds none of the 3 "
                       r"nodes node_mask trains on \(nor does a smaller one\)"):
        DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [g])
    # the whole graph as the core holds them
    DPRStrategy(budget_ratio=1.0).setup(GCN(8, 16, 2, 4), [g])


def test_setup_refuses_a_weighted_graph_whose_core_drops_the_weights():
    """The core keeps no edge weights (its bridges are new edges): a GCN
    trained on it ignored the weights of the user's graph without a word."""
    from torch_geometric.nn import GCN

    from leangnn.prune.dpr import build_core

    g = contextual_sbm(200, avg_degree=4.0, in_channels=8, seed=7)
    g.edge_weight = torch.rand(g.num_edges) + 0.5
    assert "edge_weight" not in build_core(g, 0.3).data  # what it refuses
    with pytest.raises(ValueError, match=r"prune: the graph has edge weights "
                       r"\(edge_weight \[\d+\]\), and DPR's core keeps none"):
        DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [g])


def test_setup_refuses_integer_ids_as_features_its_decoder_would_average():
    """An integer ``x`` (ids a model embeds) has no mean for the decoder to
    rebuild a pruned node from: it failed at the end of training."""
    from torch_geometric.nn import GCN

    g = contextual_sbm(200, avg_degree=4.0, in_channels=8, seed=7)
    g.x = torch.randint(0, 5, (g.num_nodes, 2))
    with pytest.raises(ValueError, match=r"prune: x holds integer ids \(int64 "
                       r"\[200, 2\]\), and DPR rebuilds each pruned node"):
        DPRStrategy(budget_ratio=0.3).setup(GCN(8, 16, 2, 4), [g])


def test_a_float64_model_trains_and_serves_as_the_float32_one_does():
    """Anchor weights and the decoder follow the features' float type: a
    float64 model stopped at the decoder ("expected scalar type Float but
    found Double"). The float32 run is the reference; its state round-trips
    with the decoder's type."""
    from torch_geometric.nn import GraphSAGE

    import leangnn

    g = contextual_sbm(800, avg_degree=5.0, in_channels=8, seed=4)
    g.node_mask = g.train_mask
    classes = int(g.y.max()) + 1
    out = {}
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        model = GraphSAGE(8, 16, 2, classes).to(dtype)
        h = g.clone()
        h.x = h.x.to(dtype)
        r = leangnn.fit(model, h, strategy="prune", epochs=3, lr=0.01,
                        progress=False)
        strat = r["strategy"]
        assert strat.decoder is not None
        assert next(strat.decoder.parameters()).dtype == dtype
        out[dtype] = strat.predict(model, h)
        again = DPRStrategy(budget_ratio=strat.config.budget_ratio)
        again.load_state_dict(strat.state_dict())
        assert next(again.decoder.parameters()).dtype == dtype
        torch.testing.assert_close(again.predict(model, h), out[dtype])
    assert out[torch.float64].dtype == torch.float64
    torch.testing.assert_close(out[torch.float64].float(), out[torch.float32],
                               atol=1e-3, rtol=1e-3)
