"""The planner's Python API: ``leangnn.plan(...)`` (a callable module),
``leangnn.fit(...)`` on PyG models and leangnn's deep models, lazily loaded."""

from __future__ import annotations

import copy
import subprocess
import sys
import types

import pytest
import torch
from torch_geometric.nn import GCN

import leangnn
from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.calibration import Calibration
from leangnn.plan.estimate import default_loss
from leangnn.plan.planner import PlanTable

EXACT = Calibration("test", "glibc-mmap", calibrated=True)


@pytest.fixture(scope="module")
def data():
    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=5)
    return with_mask(g, g.train_mask)


def test_import_leangnn_stays_cheap():
    code = ("import sys, leangnn\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('leangnn'))\n"
            "assert loaded == ['leangnn', 'leangnn.plan'], loaded\n"
            "assert callable(leangnn.plan) and callable(leangnn.fit)\n"
            "import leangnn.config, leangnn.data\n"  # they import plan.fits
            "assert 'leangnn.plan.planner' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_is_a_callable_module_with_lazy_names():
    import leangnn.plan.planner as planner

    assert isinstance(leangnn.plan, types.ModuleType)
    assert leangnn.plan.PlanTable is planner.PlanTable
    assert leangnn.plan.choose is planner.choose
    from leangnn.plan import Estimate, plan_config

    assert plan_config is planner.plan_config and Estimate.__name__ == "Estimate"
    assert {"PlanTable", "fit", "plan_config"} <= set(dir(leangnn.plan))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        leangnn.plan.nothing  # noqa: B018


def test_plan_call_returns_the_table(data):
    model = GCN(8, 16, 2, int(data.y.max()) + 1)
    before = [p.detach().clone() for p in model.parameters()]
    table = leangnn.plan(model, data, memory_budget="1GiB", calibration=EXACT,
                         strategies=("full",))
    assert isinstance(table, PlanTable) and table.budget_bytes == 1 << 30
    assert [r.strategy for r in table.rows] == ["full"]
    assert table.pick.strategy == "full" and str(table).endswith(table.pick.label)
    # planning does not touch the model
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _reference_training(model, data, epochs, lr, clip, loss_fn=None,
                        whole=False, **kwargs):
    """Plain PyTorch: Adam on the masked loss (or ``loss_fn(out, data)``),
    gradient clipping (``kwargs``: the model's further forward arguments,
    e.g. ``edge_attr``; ``whole``: call ``model(data)``)."""
    loss_fn = loss_fn or default_loss(data)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        out = model(data) if whole else model(data.x, data.edge_index, **kwargs)
        loss = loss_fn(out, data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def test_fit_auto_trains_a_pyg_gcn_like_plain_pytorch(data):
    torch.manual_seed(1)
    model = GCN(8, 16, 2, int(data.y.max()) + 1)
    ref = GCN(8, 16, 2, int(data.y.max()) + 1)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, data, strategy="auto", memory_budget="1GiB",
                      epochs=15, lr=0.02)
    assert out["row"].strategy == "full" and out["row"].chosen
    assert isinstance(out["plan"], PlanTable)
    losses = _reference_training(ref, data, 15, 0.02, 1.0)
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    assert losses[-1] < losses[0]
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the loop's measured peak and the need it implies, beside the budget
    est, peak = out["row"].estimate, out["memory"]["peak_bytes"]
    fixed = est.peak_bytes - max(est.run_bytes, est.later_run_bytes or 0)
    assert fixed > 0 and peak >= 0 and out["memory"]["method"].startswith("cpu")
    assert out["budget_check"] == {
        "memory_budget_bytes": 1 << 30, "estimated_need_bytes": out["row"].need_bytes,
        "measured_need_bytes": peak + fixed, "within_budget": peak + fixed <= 1 << 30}


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")
def test_fit_warns_of_mkls_thread_buffers_it_did_not_plan(data, monkeypatch):
    monkeypatch.delenv("MKL_DISABLE_FAST_MM", raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with pytest.warns(UserWarning, match="leangnn.fit: MKL keeps per-thread"):
        out = leangnn.fit(GCN(8, 16, 2, int(data.y.max()) + 1), data,
                          memory_budget="1GiB", epochs=1)
    assert "MKL_DISABLE_FAST_MM=1" in out["plan"].caveat


@pytest.mark.slow
@pytest.mark.parametrize("name,strategy", [("res", "full"), ("gsr", "reversible")])
def test_fit_auto_trains_our_deep_models(data, name, strategy):
    torch.manual_seed(2)
    classes = int(data.y.max()) + 1
    model = build_model(name, 8, 8, classes, 3, num_groups=2)
    ref = build_model(name, 8, 8, classes, 3, num_groups=2)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, data, default_loss(data), strategy="auto",
                      memory_budget="1GiB", epochs=5, lr=0.01)
    assert out["row"].strategy == strategy
    losses = _reference_training(ref, data, 5, 0.01, 1.0)
    assert out["losses"] == pytest.approx(losses, rel=1e-4)


def test_fit_budget_below_the_row_is_one_line(data):
    model = GCN(8, 16, 2, int(data.y.max()) + 1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as e:
        leangnn.fit(model, data, strategy="full", memory_budget="1KiB", epochs=1)
    msg = str(e.value)
    assert "\n" not in msg and "full(model=GCN) needs ~" in msg and "1.0 KiB" in msg
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="memory_budget: cannot read '4 parsecs'"):
        leangnn.plan(model, data, memory_budget="4 parsecs")


def test_fit_and_plan_refuse_non_finite_features(data):
    bad = data.clone()
    bad.x = bad.x.clone()
    bad.x[3, 1] = float("nan")
    model = GCN(bad.num_features, 16, 2, int(bad.y.max()) + 1)
    for call in (lambda: leangnn.plan(model, bad, memory_budget="1GiB"),
                 lambda: leangnn.fit(model, bad, epochs=1, memory_budget="1GiB")):
        with pytest.raises(ValueError, match=r"x has 1 non-finite"):
            call()


def test_plan_and_fit_refuse_missing_labels_empty_graphs_and_bad_epochs(data):
    model = GCN(8, 16, 2, int(data.y.max()) + 1)
    unlabelled = data.clone()
    del unlabelled.y
    for call in (lambda: leangnn.plan(model, unlabelled, memory_budget="1GiB"),
                 lambda: leangnn.fit(model, unlabelled, epochs=1,
                                     memory_budget="1GiB")):
        with pytest.raises(ValueError, match=r"data: has no targets \(data.y is "
                           r"None\).*pass loss_fn"):
            call()
    # a loss of the user's own needs no labels
    out = leangnn.fit(model, unlabelled, lambda o, d: o.pow(2).mean(), epochs=2,
                      memory_budget="1GiB", strategy="full")
    assert len(out["losses"]) == 2
    empty = type(data)(x=torch.zeros(0, 8), y=torch.zeros(0, dtype=torch.long),
                       edge_index=torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"data: has no nodes \(num_nodes is 0\)"):
        leangnn.plan(model, empty, memory_budget="1GiB")
    for bad in (0, -3, "3", 2.0, True):
        with pytest.raises(ValueError, match=rf"epochs: expected a positive int, "
                           rf"got {bad!r}"):
            leangnn.fit(model, data, epochs=bad, memory_budget="1GiB")


def test_a_model_failing_its_dry_run_logs_no_torch_traceback(data, caplog):
    import logging

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    model = GCN(5, 16, 2, int(data.y.max()) + 1)  # data.x has 8 features
    with caplog.at_level(logging.DEBUG), pytest.raises(
            ValueError, match=r"leangnn.plan: GCN failed in a dry run.*same "
            r"reduction dim"):
        leangnn.plan(model, data, memory_budget="1GiB")
    noisy = [r for r in caplog.records if r.name.startswith("torch._subclasses")
             and r.levelno >= logging.ERROR]
    assert noisy == []
    assert fake_log.level == level  # restored after the trace


def test_plan_names_the_model_that_fails_on_the_data(data):
    from torch_geometric.nn import GraphSAGE
    from torch_geometric.utils import sort_edge_index

    # PyG renders a conv class's propagate once, from its first instance: an
    # LSTM SAGEConv first would leave every later SAGEConv without its fused
    # sparse path (NotImplementedError in other tests of this process)
    GraphSAGE(8, 16, 2, 3)
    # LSTM aggregation needs edges sorted by destination; a csbm graph's are not
    model = GraphSAGE(8, 16, 2, int(data.y.max()) + 1, aggr="lstm")
    with pytest.raises(ValueError, match=r"leangnn.plan: GraphSAGE failed in a dry "
                       r"run of one training step on the data \(300 nodes, "):
        leangnn.plan(model, data, memory_budget="1GiB")
    good = data.clone()
    good.edge_index = sort_edge_index(good.edge_index, sort_by_row=False)
    table = leangnn.plan(model, good, memory_budget="1GiB", calibration=EXACT)
    offload = [r for r in table.rows if r.strategy == "offload"]
    assert len(offload) == 1 and not offload[0].fits
    assert "aggr='lstm' is not supported" in offload[0].why
    assert table.pick is not None and table.pick.strategy == "full"


def test_plan_and_fit_our_dag_model_on_a_circuit():
    """A DAGNN from Python: its full row is traced on key levels with the
    dag heap family (not the largest factor of an unknown model); offload and
    DPR's core are rows that say why not; fit trains the pick."""
    from leangnn.circuits import load_circuit
    from leangnn.nn.dag import DAGNN
    from leangnn.plan.calibration import load_calibration

    data = load_circuit("iscas85/c880", "arrival")
    torch.manual_seed(0)
    model = DAGNN(data.num_features, 16, 1)
    cal = load_calibration("cpu")
    table = leangnn.plan(model, data, memory_budget="1GiB", calibration=cal,
                         epochs=3)
    full = table.pick
    assert full is not None and full.strategy == "full"
    assert full.knobs["model"] == "DAGNN" and full.knobs["family"] == "dag"
    est = full.estimate
    # (and the DAG model's own first-run constant, where calibrated)
    want = est.big_bytes + cal.heap_factor(["dag-narrow"]) * est.heap_bytes \
        + cal.first_run_const(["dag-narrow", "dag"])
    assert est.run_bytes == pytest.approx(want, abs=1)
    why = {r.strategy: r.why for r in table.rows if r is not full}
    assert "DPR's core keeps no circuit levels" in why["prune"]
    assert "offload supports PyG BasicGNN models" in why["offload"]
    out = leangnn.fit(model, data, memory_budget="1GiB", epochs=2)
    assert out["row"].strategy == "full" and len(out["losses"]) == 2


def _gat_subclass():
    from torch_geometric.nn import GAT

    class MyGAT(GAT):  # a forward of its own may change the op mix
        pass

    return MyGAT


class _Head(torch.nn.Module):
    """A user's wrapper: GNN(s) (summed) under a linear head."""

    def __init__(self, c, *gnns):
        super().__init__()
        self.gnns = torch.nn.ModuleList(gnns)
        self.head = torch.nn.Linear(16, c)

    def forward(self, x, edge_index):
        return self.head(sum(g(x, edge_index) for g in self.gnns).relu())


def _convs(c, *kinds):
    """A ``Sequential`` of PyG convs of ``kinds`` (16 channels), then a head."""
    import torch_geometric.nn as pyg

    layers, width = [], 8
    for k in kinds:
        layers += [(getattr(pyg, k)(width, 16), "x, edge_index -> x"),
                   torch.nn.ReLU()]
        width = 16
    return pyg.Sequential("x, edge_index", [*layers, torch.nn.Linear(16, c)])


def _sage(**kw):
    from torch_geometric.nn import GraphSAGE

    return GraphSAGE(8, 16, 2, 16, **kw)


@pytest.mark.parametrize("make, strategy, families", [
    (lambda c: GCN(8, 16, 2, c), "full", ["gcn"]),
    # wrappers of one family (nested too) plan with its factor; of two, none
    (lambda c: _Head(c, GCN(8, 16, 2, 16)), "full", ["gcn"]),
    (lambda c: _Head(c, _Head(16, _sage()), _sage(aggr="max")), "full", ["sage"]),
    (lambda c: _Head(c, build_model("res", 8, 16, 16, 3, conv="gcn")), "full",
     ["res-gcn", "res"]),
    (lambda c: _Head(c, GCN(8, 16, 2, 16), _sage()), "full", []),
    # a user's own stack of one family's PyG convs plans with its factor;
    # mixed kinds, or a conv of no family, with the largest
    (lambda c: _convs(c, "SAGEConv", "SAGEConv"), "full", ["sage"]),
    (lambda c: _convs(c, "GATConv", "GATv2Conv"), "full", ["gat"]),
    (lambda c: _convs(c, "SAGEConv", "GCNConv"), "full", []),
    (lambda c: _convs(c, "GCNConv", "TransformerConv"), "full", []),
    (lambda c: _Head(c, build_model("res", 8, 16, 16, 3, conv="gcn"),
                     build_model("res", 8, 16, 16, 3, conv="sage")), "full", []),
    (lambda c: __import__("torch_geometric.nn", fromlist=["GraphSAGE"]).GraphSAGE(
        8, 16, 2, c, aggr="max"), "full", ["sage"]),
    (lambda c: __import__("torch_geometric.nn", fromlist=["GAT"]).GAT(
        8, 16, 2, c, jk="cat"), "full", ["gat"]),
    (lambda c: build_model("res", 8, 16, c, 3, conv="gcn"), "full", ["res-gcn", "res"]),
    (lambda c: build_model("gsr", 8, 16, c, 4, conv="gat"), "reversible",
     ["gsr-gat", "gsr"]),
    (lambda c: build_model("gsr", 8, 16, c, 4, num_groups=4), "reversible",
     ["gsr-many", "gsr"]),
    # a subclass (its forward may differ) is a user's stack of GATConvs
    (lambda c: _gat_subclass()(8, 16, 2, c), "full", ["gat"]),
    (lambda c: __import__("torch_geometric.nn", fromlist=["GIN"]).GIN(8, 16, 2, c),
     "full", ["gin"]),
    (lambda c: __import__("torch_geometric.nn", fromlist=["EdgeCNN"]).EdgeCNN(
        8, 16, 2, c), "full", []),
])
def test_a_registered_model_class_plans_with_its_calibrated_heap_factor(
        data, make, strategy, families):
    """A user's PyG GCN / GraphSAGE / GAT (any options) or our deep model is
    the class our registry trains: its rows get that family's heap factor
    (measured: a PyG GAT planned +100% over its peak with the largest factor,
    +1% with gat's), and so does a model wrapping models of one family or a
    stack of one family's convs (a subclass is one); another class, a
    wrapper of two families or a stack of mixed convs keeps the largest
    factor."""
    from leangnn.plan.calibration import heap_families

    cal = Calibration("test", "glibc-default", calibrated=True, const=1000.0,
                      heap_scale=3.0, heap_scales={"gcn": 1.5, "sage": 2.0,
                                                   "gat": 1.25, "gin": 1.8,
                                                   "res": 2.5,
                                                   "res-gcn": 2.25, "gsr": 1.75,
                                                   "gsr-gat": 1.5,
                                                   "gsr-many": 1.625,
                                                   "prune-gcn": 1.1, "prune": 1.2})
    model = make(int(data.y.max()) + 1)
    table = leangnn.plan(model, data, memory_budget="1GiB", calibration=cal,
                         strategies=("full", "prune"), epochs=3)
    full = next(r for r in table.rows if r.strategy == strategy)
    assert full.knobs["model"] == type(model).__name__  # the row names the class
    assert ("family" in full.knobs) == bool(families)
    fams = heap_families(strategy, full.knobs)
    assert fams == (families or [type(model).__name__])
    est = full.estimate
    factor = cal.heap_scales[families[0]] if families else cal.heap_scale
    want = max(est.big_bytes + factor * est.heap_bytes, est.floor_bytes) + cal.const
    assert est.run_bytes == pytest.approx(max(want, 0), abs=1)
    # DPR's core rows train the same class: its prune- family first, or its
    # own where the core is an edge list (EdgeConv cannot take its CSR)
    own = families[0] if families else type(model).__name__
    for row in (r for r in table.rows if r.strategy == "prune" and r.estimate):
        # (EdgeConv and TransformerConv cannot take the core's CSR)
        edge_list = type(model).__name__ == "EdgeCNN" or any(
            type(m).__name__ == "TransformerConv" for m in model.modules())
        assert (row.knobs.get("sparse_adj") is False) == edge_list
        assert heap_families("prune", row.knobs)[0] == (
            own if edge_list else f"prune-{own}")


def test_fit_trims_the_heap_after_every_epoch_as_the_trainer(data, monkeypatch):
    """On CPU fit hands freed heap back before its meter starts and after
    every epoch, as ``leangnn train`` does (the runs the heap factors were
    measured on); the off switch changes no loss."""
    import leangnn.profile as profile

    calls = []
    real = profile.release_free_heap
    monkeypatch.setattr(profile, "release_free_heap",
                        lambda: calls.append(1) or real())
    c = int(data.y.max()) + 1
    torch.manual_seed(3)
    model = GCN(8, 16, 2, c)
    twin = GCN(8, 16, 2, c)
    twin.load_state_dict(model.state_dict())
    kw = dict(strategy="full", memory_budget="1GiB", epochs=3, lr=0.02)
    on = leangnn.fit(model, data, trim_heap=True, **kw)
    # around the setup (before and after), then after each of the 3 epochs
    assert len(calls) == 2 + 3
    off = leangnn.fit(twin, data, trim_heap=False, **kw)
    assert len(calls) == 5  # the off switch
    assert on["losses"] == off["losses"]
    monkeypatch.setenv("LEANGNN_TRIM_HEAP", "off")
    leangnn.fit(GCN(8, 16, 2, c), data, **kw)
    assert len(calls) == 5


def test_fit_trains_with_the_edge_features_the_model_takes(data):
    """A PyG GAT with edge_dim on a graph with edge_attr: the plan traces and
    fit trains the forward a user writes (``edge_attr=``), equal to plain
    PyTorch; offload and DPR's core, which would drop them, are rows that
    say why not."""
    from torch_geometric.nn import GAT

    g = data.clone()
    g.edge_attr = torch.randn(g.num_edges, 3)
    c = int(g.y.max()) + 1
    torch.manual_seed(4)
    model = GAT(8, 16, 2, c, edge_dim=3)
    ref = GAT(8, 16, 2, c, edge_dim=3)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, g, strategy="auto", memory_budget="1GiB", epochs=4,
                      lr=0.02)
    losses = _reference_training(ref, g, 4, 0.02, 1.0, edge_attr=g.edge_attr)
    assert out["row"].strategy == "full"
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    why = {r.strategy: r.why for r in out["plan"].rows if r.need_bytes is None}
    assert "edge features" in why["prune"] and "edge" in why["offload"]


def _graphs(num_graphs=6, seed=0):
    """A PyG ``Batch`` of small graphs with one class per graph."""
    from torch_geometric.data import Batch

    gs = []
    for i in range(num_graphs):
        g = contextual_sbm(60, avg_degree=4.0, in_channels=8, seed=seed + i)
        gs.append(type(g)(x=g.x, edge_index=g.edge_index, y=torch.tensor([i % 2])))
    return Batch.from_data_list(gs)


class _GraphClassifier(torch.nn.Module):
    """A graph-level model: a GCN with GraphNorm (which reads ``batch``),
    mean-pooled per graph."""

    def __init__(self):
        super().__init__()
        self.gnn = GCN(8, 16, 2, 16, norm="graph_norm")
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x, edge_index, batch):
        from torch_geometric.nn import global_mean_pool

        return self.head(global_mean_pool(self.gnn(x, edge_index, batch=batch),
                                          batch))


def _graph_loss(out, data):
    return torch.nn.functional.cross_entropy(out, data.y)


def test_fit_trains_a_graph_level_model_on_a_batch_like_plain_pytorch():
    """A model whose forward takes ``batch`` on a PyG ``Batch``: plan and fit
    hand it ``data.batch`` (as a PyG loop does), equal to plain PyTorch;
    offload (GraphNorm reads whole graphs) and DPR's core (node outputs) are
    rows that say why not."""
    g = _graphs()
    torch.manual_seed(6)
    model, ref = _GraphClassifier(), _GraphClassifier()
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, g, _graph_loss, strategy="auto", memory_budget="1GiB",
                      epochs=4, lr=0.02)
    losses = _reference_training(ref, g, 4, 0.02, 1.0, _graph_loss, batch=g.batch)
    assert out["row"].strategy == "full"
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    why = {r.strategy: r.why for r in out["plan"].rows if r.need_bytes is None}
    assert "_GraphClassifier reads the graph of every node (data.batch, 6 graphs)" \
        in why["prune"]


class _GateTypes(torch.nn.Module):
    """Embeds one categorical id per node (a gate type), then GraphSAGE."""

    def __init__(self, types: int, classes: int):
        super().__init__()
        from torch_geometric.nn import GraphSAGE

        self.emb = torch.nn.Embedding(types, 8)
        self.gnn = GraphSAGE(8, 16, 2, classes)

    def forward(self, x, edge_index):
        return self.gnn(self.emb(x), edge_index)


def test_fit_trains_a_model_embedding_integer_node_ids_like_plain_pytorch():
    """``x`` as integer ids ``[N]`` (PyG's examples embed them) trains full
    batch as plain PyTorch does; DPR, whose decoder averages features, says
    why not in one line; a CLI graph still needs ``[N, F]`` features."""
    from leangnn.data import check_graph

    g = contextual_sbm(600, avg_degree=5.0, in_channels=4, seed=2)
    gen = torch.Generator().manual_seed(0)
    g.x = torch.randint(0, 7, (g.num_nodes,), generator=gen)
    classes = int(g.y.max()) + 1
    torch.manual_seed(3)
    model, ref = _GateTypes(7, classes), _GateTypes(7, classes)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, g, strategy="auto", memory_budget="1GiB", epochs=3,
                      lr=0.01)
    # (PyG's split: fit trains on train_mask)
    losses = _reference_training(ref, with_mask(g, g.train_mask), 3, 0.01, 1.0)
    assert out["row"].strategy == "full"
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    with pytest.raises(ValueError, match=r"x holds integer ids \(int64 \[600\]\), "
                       "and DPR rebuilds each pruned node"):
        leangnn.fit(_GateTypes(7, classes), g, strategy="prune", epochs=1)
    with pytest.raises(ValueError, match=r"x must be \[num_nodes, num_features\].*"
                       r"got int64 shape \[600\]"):
        check_graph(g, in_channels=1)
    g.x = g.x.float()  # one float per node is not an id
    with pytest.raises(ValueError, match=r"got float32 shape \[600\]"):
        leangnn.plan(_GateTypes(7, classes), g)


@pytest.mark.parametrize("strategy", ["full", "offload"])
def test_fit_initialises_a_lazy_model_as_pygs_recipe_then_trains_it(strategy):
    """``GraphSAGE(-1, ...)``: plan and fit shape it with one forward (the
    dry run failed on its uninitialised parameters, offload on a width of
    -1); the same losses as plain PyTorch after PyG's recipe (one forward
    on the whole graph under ``no_grad``)."""
    from torch_geometric.nn import GraphSAGE

    g = contextual_sbm(500, avg_degree=5.0, in_channels=6, seed=3)
    classes = int(g.y.max()) + 1
    torch.manual_seed(4)
    model = GraphSAGE(-1, 16, 2, classes)
    out = leangnn.fit(model, g, strategy=strategy, epochs=3, lr=0.01,
                      progress=False)
    torch.manual_seed(4)
    ref = GraphSAGE(-1, 16, 2, classes)
    with torch.no_grad():
        ref(g.x, g.edge_index)
    losses = _reference_training(ref, with_mask(g, g.train_mask), 3, 0.01, 1.0)
    assert out["row"].strategy == strategy
    assert out["losses"] == pytest.approx(losses, rel=1e-5)


def test_fit_offloads_a_compiled_model_as_the_model_it_wraps():
    """``torch.compile(GraphSAGE(...))``: offload had refused it ("supports
    PyG BasicGNN models ..., got OptimizedModule"), so auto fell to DPR's
    approximate core under a budget below full batch. Offload runs the
    wrapped model's convs layer by layer and trains its very parameters:
    the same losses as plain PyTorch on the uncompiled model."""
    from torch_geometric.nn import GraphSAGE

    g = contextual_sbm(500, avg_degree=5.0, in_channels=6, seed=3)
    classes = int(g.y.max()) + 1
    torch.manual_seed(4)
    model = GraphSAGE(6, 16, 2, classes)
    ref = copy.deepcopy(model)
    # (the eager backend: no compiler needed, still an OptimizedModule)
    compiled = torch.compile(model, backend="eager")
    out = leangnn.fit(compiled, g, strategy="offload", epochs=3, lr=0.01,
                      progress=False)
    assert out["row"].strategy == "offload"
    assert out["row"].knobs["model"] == "GraphSAGE (compiled)"
    losses = _reference_training(ref, with_mask(g, g.train_mask), 3, 0.01, 1.0)
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    for a, b in zip(model.parameters(), compiled.parameters(), strict=True):
        assert a is b  # trained in place, as any fit's model


def test_a_lazy_model_whose_shaping_forward_fails_is_one_line():
    from torch_geometric.nn import GraphSAGE

    class NeedsThree(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gnn = GraphSAGE(-1, 8, 2, 3)

        def forward(self, x, edge_index):
            if x.size(0) < 3:
                raise RuntimeError("expected at least 3 nodes")
            return self.gnn(x, edge_index)

    g = contextual_sbm(100, avg_degree=4.0, in_channels=4, seed=1)
    with pytest.raises(ValueError, match=r"NeedsThree is lazily initialised and "
                       r"failed in the forward on two nodes that shapes it "
                       r"\(RuntimeError: expected at least 3 nodes\); run one "
                       "forward yourself first"):
        leangnn.plan(NeedsThree(), g)


class _Intro(torch.nn.Module):
    """PyG's introduction's GCN: ``forward(self, data)``, log-probabilities."""

    def __init__(self, features: int, classes: int):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2 = GCNConv(features, 16), GCNConv(16, classes)

    def forward(self, data):
        x, edge_index = data.x, data.edge_index
        x = torch.nn.functional.relu(self.conv1(x, edge_index))
        return torch.nn.functional.log_softmax(self.conv2(x, edge_index), dim=1)


def _intro_loss(out, data):
    m = data.train_mask
    return torch.nn.functional.nll_loss(out[m], data.y[m])


def test_fit_trains_pygs_introduction_model_that_takes_the_graph():
    """``forward(self, data)`` with a loss reading ``data.train_mask``, as
    PyG's introduction writes them: full batch equals plain PyTorch; DPR
    trains its core and decoder with it and predicts every node (both had
    failed: "forward() takes 2 positional arguments but 3 were given", then
    "no attribute 'train_mask'" in the decoder's loss)."""
    g = contextual_sbm(600, avg_degree=5.0, in_channels=8, seed=6)
    classes = int(g.y.max()) + 1
    torch.manual_seed(2)
    model, ref = _Intro(8, classes), _Intro(8, classes)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, g, _intro_loss, strategy="full", epochs=3, lr=0.01,
                      progress=False)
    losses = _reference_training(ref, g, 3, 0.01, 1.0, _intro_loss, whole=True)
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    torch.manual_seed(2)
    net = _Intro(8, classes)
    pruned = leangnn.fit(net, g, _intro_loss, strategy="prune", epochs=3, lr=0.01,
                         progress=False)
    strat = pruned["strategy"]
    assert strat.summary()["decoder_choice"] in ("learned", "average")
    # the core's CSR adjacency reaches it as data.edge_index: no fallback
    # to an edge list (the dry run had failed on it)
    assert pruned["row"].strategy == "prune"
    assert "sparse_adj" not in pruned["row"].knobs
    assert strat.config.sparse_adj is not False
    pred = strat.predict(net, g)
    assert pred.shape == (600, classes) and bool(torch.isfinite(pred).all())


def test_a_graph_level_loss_on_node_outputs_trains_offload_as_full_batch():
    """A ``BasicGNN`` (node outputs) whose loss pools them per graph:
    offload trains it exactly as full batch does; DPR's core is refused
    (the targets are one per graph), and a model without GraphNorm is given
    no ``batch`` it would not read."""
    from torch_geometric.nn import global_mean_pool

    from leangnn.strategy import forward_kwargs, uses_batch

    g = _graphs(seed=10)

    def loss(out, data):
        return torch.nn.functional.cross_entropy(global_mean_pool(out, data.batch),
                                                 data.y)

    torch.manual_seed(7)
    model = GCN(8, 16, 2, 2)
    assert not uses_batch(model, g) and "batch" not in forward_kwargs(model, g)
    twin = GCN(8, 16, 2, 2)
    twin.load_state_dict(model.state_dict())
    full = leangnn.fit(model, g, loss, strategy="full", memory_budget="1GiB",
                       epochs=3, lr=0.02)
    off = leangnn.fit(twin, g, loss, strategy="offload", memory_budget="1GiB",
                      epochs=3, lr=0.02)
    assert off["row"].strategy == "offload"
    assert off["losses"] == pytest.approx(full["losses"], rel=1e-5)
    table = leangnn.plan(GCN(8, 16, 2, 2), g, "1GiB", loss_fn=loss)
    why = [r.why for r in table.rows if r.strategy == "prune"]
    assert why and all("the targets are one per graph (y [6] for the 6 graphs "
                       "of data.batch)" in w for w in why)


def test_link_prediction_trains_offload_as_full_batch_and_no_core():
    """A link-prediction loss reading ``data.edge_label_index``: offload
    trains it exactly as full batch; DPR's core, which renumbers and drops
    nodes, is rows that name the attribute (before: an IndexError of the
    user's loss, or, with small ids, the wrong nodes scored)."""
    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=11)
    del g.y, g.train_mask, g.val_mask, g.test_mask
    gen = torch.Generator().manual_seed(0)
    pos = g.edge_index[:, torch.randperm(g.num_edges, generator=gen)[:200]]
    neg = torch.randint(g.num_nodes, (2, 200), generator=gen)
    g.edge_label_index = torch.cat([pos, neg], 1)
    g.edge_label = torch.cat([torch.ones(200), torch.zeros(200)])

    def loss(out, d):
        s = (out[d.edge_label_index[0]] * out[d.edge_label_index[1]]).sum(-1)
        return torch.nn.functional.binary_cross_entropy_with_logits(s, d.edge_label)

    torch.manual_seed(12)
    model, twin = GCN(8, 16, 2, 16), GCN(8, 16, 2, 16)
    twin.load_state_dict(model.state_dict())
    full = leangnn.fit(model, g, loss, strategy="full", memory_budget="1GiB",
                       epochs=3)
    off = leangnn.fit(twin, g, loss, strategy="offload", memory_budget="1GiB",
                      epochs=3)
    assert off["losses"] == pytest.approx(full["losses"], rel=1e-5)
    table = leangnn.plan(GCN(8, 16, 2, 16), g, "1GiB", loss_fn=loss)
    why = [r.why for r in table.rows if r.strategy == "prune"]
    assert why and all("data.edge_label_index [2, 400] holds node ids of the "
                       "whole graph" in w for w in why)
    with pytest.raises(ValueError, match=r"strategy='prune' is not possible .*"
                       r"edge_label_index"):
        leangnn.fit(GCN(8, 16, 2, 16), g, loss, strategy="prune",
                    memory_budget="1GiB", epochs=1)


def test_a_batch_vector_or_targets_a_graph_cannot_hold_are_one_line():
    g = _graphs()
    bad = g.clone()
    bad.batch = bad.batch.float()
    with pytest.raises(ValueError, match=r"batch must be an int64 tensor of shape "
                       r"\[360\] \(the graph of every node\), got float32 \[360\]"):
        leangnn.plan(_GraphClassifier(), bad, "1GiB", loss_fn=_graph_loss)
    bad.batch = g.batch.clone()
    bad.batch[0] = -2
    with pytest.raises(ValueError, match=r"batch holds a negative graph id \(-2\)"):
        leangnn.plan(_GraphClassifier(), bad, "1GiB", loss_fn=_graph_loss)
    # graph targets and the default (node) loss: the message says what to pass
    with pytest.raises(ValueError, match=r"y has shape \[6\] for 360 nodes \(one "
                       r"target per graph: .*pass a loss_fn\(out, data\)"):
        leangnn.plan(GCN(8, 16, 2, 2), g, "1GiB")


def test_the_default_loss_names_float_targets_the_output_does_not_match(data):
    g = data.clone()
    g.y = g.y.float()
    with pytest.raises(ValueError, match=r"default loss: MSE of the model's output "
                       r"\[(\d+), 4\] against float y \[\1\] .*data.y.long\(\)"):
        leangnn.plan(GCN(8, 16, 2, 4), g, "1GiB", strategies=("full",))


class _TwoOutputs(torch.nn.Module):
    """Node outputs and an auxiliary term, as a model with a side loss returns."""

    def __init__(self):
        super().__init__()
        self.gnn = GCN(8, 16, 2, 4)

    def forward(self, x, edge_index):
        h = self.gnn(x, edge_index)
        return h, h.square().mean()


def test_the_default_loss_names_an_output_that_is_no_tensor(data):
    # (it had failed with "TypeError: only integer tensors of a single element
    # can be converted to an index", from indexing the tuple with the mask)
    with pytest.raises(ValueError, match=r"default loss: the model returned a "
                       r"tuple, not one \[N, C\] tensor of node outputs; pass "
                       r"loss_fn\(out, data\)"):
        leangnn.plan(_TwoOutputs(), data, "1GiB", strategies=("full",))
    # with a loss reading it, it plans
    table = leangnn.plan(_TwoOutputs(), data, "1GiB", strategies=("full",),
                         loss_fn=lambda out, d: torch.nn.functional.cross_entropy(
                             out[0], d.y)
                         + out[1])
    assert table.rows[0].fits


def test_one_hot_labels_and_a_num_nodes_beside_x_are_named(data):
    g = data.clone()
    c = int(g.y.max()) + 1
    g.y = torch.nn.functional.one_hot(g.y, c)
    # (cross-entropy had failed with "Expected input batch_size (N) to match
    # target batch_size (C x N)")
    with pytest.raises(ValueError, match=rf"^data: y has shape \[(\d+), {c}\], "
                       r"integer, not one class id per node; .*y.argmax\(1\)"):
        leangnn.plan(GCN(8, 16, 2, c), g, "1GiB", strategies=("full",))
    g.y = data.y.view(-1, 1)  # OGB's [N, 1] class ids are one per node
    assert leangnn.plan(GCN(8, 16, 2, c), g, "1GiB", strategies=("full",)).pick
    g = data.clone()
    g.train_mask = torch.ones(g.num_nodes, dtype=torch.bool)
    g.num_nodes = g.num_nodes + 5
    # (the train_mask's length had been named instead)
    with pytest.raises(ValueError, match=rf"x has {data.num_nodes} rows for "
                       rf"{data.num_nodes + 5} nodes$"):
        leangnn.plan(GCN(8, 16, 2, c), g, "1GiB")


def test_fit_trains_on_pygs_train_mask_not_on_every_label():
    """A graph with PyG's ``train_mask`` and no ``node_mask`` (Planetoid,
    OGB splits): the default loss scores the training nodes only, as a PyG
    loop would; before, every label, the test nodes' too, was trained on.
    An index tensor there is one line; ``node_mask`` still wins."""
    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=8)
    assert "node_mask" not in g and 0 < int(g.train_mask.sum()) < g.num_nodes
    c = int(g.y.max()) + 1
    torch.manual_seed(9)
    model, ref = GCN(8, 16, 2, c), GCN(8, 16, 2, c)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, g, strategy="full", memory_budget="1GiB", epochs=3,
                      lr=0.02)
    assert "node_mask" not in g  # the caller's graph is left alone
    losses = _reference_training(ref, with_mask(g, g.train_mask), 3, 0.02, 1.0)
    assert out["losses"] == pytest.approx(losses, rel=1e-5)
    every = _reference_training(GCN(8, 16, 2, c), g, 1, 0.02, 1.0)
    assert every[0] != pytest.approx(losses[0], rel=1e-3)
    idx = g.clone()
    idx.train_mask = g.train_mask.nonzero().view(-1)
    with pytest.raises(ValueError, match=r"train_mask must be a bool tensor of "
                       r"shape \[300\] \(the nodes the default loss trains on\), "
                       r"got int64 \[\d+\]"):
        leangnn.plan(GCN(8, 16, 2, c), idx, "1GiB")
    # a loss of the user's own reads it as it likes
    leangnn.plan(GCN(8, 16, 2, c), idx, "1GiB", strategies=("full",),
                 loss_fn=lambda o, d: torch.nn.functional.cross_entropy(
                     o[d.train_mask], d.y[d.train_mask]))
    # OGB-style labels: [N, 1], -1 where a node has none (outside train_mask)
    ogb = g.clone()
    ogb.y = torch.where(g.train_mask, g.y, -1).view(-1, 1)
    out = leangnn.fit(GCN(8, 16, 2, c), ogb, strategy="full", memory_budget="1GiB",
                      epochs=1)
    assert len(out["losses"]) == 1
    # a few labels, none in any core: the prune rows say so (the loss over
    # no node was NaN, reported as bad labels or learning rate)
    few = g.clone()
    deg = torch.bincount(g.edge_index[1], minlength=g.num_nodes)
    few.train_mask = torch.zeros_like(g.train_mask)
    few.train_mask[torch.argsort(deg, stable=True)[:3]] = True
    table = leangnn.plan(GCN(8, 16, 2, c), few, "1GiB")
    why = [r.why for r in table.rows if r.strategy == "prune"]
    assert len(why) == 3 and all("the core holds none of the 3 nodes node_mask "
                                 "trains on" in w for w in why)
    none = g.clone()
    none.train_mask = torch.zeros_like(g.train_mask)
    with pytest.raises(ValueError, match=r"train_mask selects no node \(all 300 "):
        leangnn.plan(GCN(8, 16, 2, c), none, "1GiB")


def _pna(data):
    from torch_geometric.nn import PNA
    from torch_geometric.utils import degree

    hist = torch.bincount(degree(data.edge_index[1], data.num_nodes,
                                 dtype=torch.long))
    return PNA(8, 16, 2, int(data.y.max()) + 1, aggregators=["mean", "max"],
               scalers=["identity"], deg=hist)


def test_a_model_that_cannot_take_the_cores_csr_trains_on_it_as_an_edge_list(data):
    """PNA scatters by the index PyG reads off the core's CSR (int32): the
    dry run's fake tensors let it through, a real step does not. Its prune
    rows keep the core as an edge list instead (``sparse_adj=False``, the
    layout its full row runs) and say why; fit(strategy="prune") trains it
    there, step for step as plain PyTorch on that edge list."""
    from leangnn.plan.estimate import core_of

    model = _pna(data)
    table = leangnn.plan(model, data, memory_budget="1GiB", calibration=EXACT)
    prune = [r for r in table.rows if r.strategy == "prune"]
    assert len(prune) == 3 and all(r.need_bytes and r.config["sparse_adj"] is False
                                   and r.knobs["sparse_adj"] is False for r in prune)
    assert all("an edge list: the model cannot take its CSR adjacency (RuntimeError: "
               "expected scalar type Long" in r.estimate.note for r in prune)
    torch.manual_seed(3)
    model, ref = _pna(data), _pna(data)
    ref.load_state_dict(model.state_dict())
    out = leangnn.fit(model, data, strategy="prune", memory_budget="1GiB", epochs=3,
                      lr=0.02)
    ratio = out["row"].config["budget_ratio"]
    assert ratio == max(r.config["budget_ratio"] for r in prune if r.fits)
    core = out["strategy"].prepare(data).train_data
    assert core.get("adj_t", None) is None and core.edge_index.dtype == torch.long
    # reference: the same core built apart, trained by hand
    twin = core_of(data, budget_ratio=ratio, sparse_adj=False)
    assert torch.equal(twin.edge_index, core.edge_index)
    assert out["losses"] == pytest.approx(
        _reference_training(ref, twin, 3, 0.02, 1.0), rel=1e-5)


def _cheb(classes):
    from torch_geometric.nn import ChebConv

    class Cheb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = ChebConv(8, 16, K=2), ChebConv(16, classes, K=2)

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index)

    return Cheb()


@pytest.mark.parametrize("make, dtype, why", [
    (lambda c: __import__("torch_geometric.nn", fromlist=["GraphSAGE"]).GraphSAGE(
        8, 16, 2, c).double(), torch.float64,
     r"RuntimeError: Expected tensor for argument #1 'other' to have scalar type "
     r"Float; but got torch.DoubleTensor"),
    # (GCN's dry run passes: the real step on a piece of the core says why)
    (lambda c: GCN(8, 16, 2, c).double(), torch.float64,
     r"RuntimeError: expected scalar type Double but found Float\)"),
    (_cheb, torch.float32, r"NotImplementedError: "),
])
def test_a_core_the_csr_layout_fails_is_planned_as_an_edge_list(data, make, dtype,
                                                                 why):
    """A float64 model (the core's sparse product is float32 only) or a conv
    with no sparse kernel (ChebConv) fails on the core's CSR: its prune rows
    are planned on the core as an edge list, their note names the first line
    of the error, and their figure is that of the model's own full-batch dry
    run on that core."""
    from leangnn.plan.estimate import core_of, estimate_model

    g = data.clone()
    g.x = g.x.to(dtype)
    model = make(int(g.y.max()) + 1)
    table = leangnn.plan(model, g, memory_budget="1GiB", calibration=EXACT,
                         strategies=("full", "prune"))
    prune = [r for r in table.rows if r.strategy == "prune"]
    assert len(prune) == 3 and all(r.need_bytes and r.config["sparse_adj"] is False
                                   for r in prune)
    import re

    assert all(re.search(rf"cannot take its CSR adjacency \({why}", r.estimate.note)
               and "\n" not in r.estimate.note for r in prune)
    for r in prune:
        core = core_of(g, budget_ratio=r.config["budget_ratio"], sparse_adj=False)
        assert r.estimate.step_bytes == estimate_model(model, core).step_bytes
    assert table.pick.strategy == "full"


@pytest.mark.parametrize("device, expect", [
    ("meta", r"^device: expected cpu, cuda or cuda:i, got 'meta'$"),
    (None, r"^device: expected cpu, cuda or cuda:i, got None$"),
    ("cpu:1", r"^device: expected cpu, cuda or cuda:i, got 'cpu:1'$"),
    pytest.param("cuda", r"^device: 'cuda' requested but CUDA is not available on "
                 r"this machine \(use device='cpu'\)$",
                 marks=pytest.mark.skipif(torch.cuda.is_available(),
                                          reason="CUDA is available")),
])
def test_plan_and_fit_refuse_a_device_that_cannot_train(data, device, expect):
    x = data.x
    model = GCN(8, 16, 2, int(data.y.max()) + 1)
    for call in (lambda: leangnn.plan(model, data, "1GiB", device=device),
                 lambda: leangnn.fit(model, data, memory_budget="1GiB",
                                     device=device, epochs=1)):
        with pytest.raises(ValueError, match=expect):
            call()
    assert data.x is x and data.x.device.type == "cpu"  # the caller's graph


def test_plan_and_fit_leave_the_callers_data_alone(data, monkeypatch):
    """The dry run and the strategies move a graph's tensors with PyG's
    Data.to, which works in place: plan and fit work on a shallow copy."""
    import leangnn.plan.user as user

    real = user.estimate_model

    def moving(model, d, *args, **kwargs):
        d.x = d.x.clone()  # in place, as Data.to(another device) does
        return real(model, d, *args, **kwargs)

    monkeypatch.setattr(user, "estimate_model", moving)
    g = data.clone()
    x, keys = g.x, set(g.keys())
    model = GCN(8, 16, 2, int(g.y.max()) + 1)
    leangnn.plan(model, g, "1GiB", calibration=EXACT, strategies=("full",))
    leangnn.fit(model, g, strategy="full", memory_budget="1GiB", epochs=1)
    assert g.x is x and set(g.keys()) == keys


def _edited(data, key, value):
    g = data.clone()
    del g.name  # the messages name the graph as "data"
    g[key] = value(g)
    return g


@pytest.mark.parametrize("edit, expect", [
    (lambda d: _edited(d, "x", lambda g: g.x.double()),
     r"^data: x is float64, the model's parameters are float32; convert one"),
    (lambda d: _edited(d, "edge_index", lambda g: g.edge_index.int()),
     r"^data: edge_index must be int64, got int32; convert it with "
     r"edge_index.long\(\)$"),
    (lambda d: _edited(d, "y", lambda g: torch.full_like(g.y, 99)),
     r"^data: y must hold class ids in \[0, C\), got int64 values from 99 to 99$"),
    (lambda d: _edited(d, "y", lambda g: torch.full_like(g.y, -1)),
     r"^data: y must hold class ids in \[0, C\), got int64 values from -1 to -1$"),
    (lambda d: _edited(d, "node_mask", lambda g: torch.zeros_like(g.node_mask)),
     r"^data: node_mask selects no node \(all 300 entries False\)$"),
])
def test_plan_and_fit_refuse_what_the_first_real_step_fails_on(data, edit, expect):
    """Fake tensors accept these and the plan said "fits"; the first real
    step then failed with a bare torch error (or trained on NaN losses, for
    a mask that scores no node)."""
    g = edit(data)
    classes = int(data.y.max()) + 1
    expect = expect.replace("C", str(classes))
    for call in (lambda: leangnn.plan(GCN(8, 16, 2, classes), g, "1GiB",
                                      strategies=("full",)),
                 lambda: leangnn.fit(GCN(8, 16, 2, classes), g, strategy="full",
                                     memory_budget="1GiB", epochs=1)):
        with pytest.raises(ValueError, match=expect):
            call()


def test_fit_refuses_a_nan_clip_norm_and_stops_at_a_nan_loss(data):
    classes = int(data.y.max()) + 1
    model = GCN(8, 16, 2, classes)
    with pytest.raises(ValueError, match=r"^clip_norm: expected a finite number "
                       r">= 0 or None \(no clipping\), got nan$"):
        leangnn.fit(model, data, memory_budget="1GiB", epochs=2,
                    clip_norm=float("nan"))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"^leangnn.fit: the loss is nan at epoch "
                       r"1 of 5 \(the weights are the initial ones\); check"):
        leangnn.fit(model, data, lambda out, d: out.sum() * float("nan"),
                    strategy="full", memory_budget="1GiB", epochs=5)
    # stopped before the optimizer wrote NaN into the weights
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_fit_shows_progress_and_ends_with_a_summary_line(data, capsys):
    classes = int(data.y.max()) + 1
    out = leangnn.fit(GCN(8, 16, 2, classes), data, memory_budget="1GiB",
                      epochs=3, strategy="full", progress=True)
    err = capsys.readouterr().err
    assert "fit full(model=GCN)" in err and "3/3" in err
    last = err.strip().splitlines()[-1]
    check = out["budget_check"]
    from leangnn.utils import format_bytes

    secs = out["epoch_seconds"]
    assert len(secs) == 3 and all(t > 0 for t in secs)
    assert last == (
        f"leangnn.fit: full(model=GCN), 3 epochs: loss {out['losses'][0]:.4f} -> "
        f"{out['losses'][-1]:.4f}; epoch {sorted(secs)[1]:.3g} s median "
        f"({out['row'].epoch_seconds:.3g} s estimated); "
        f"need {format_bytes(check['measured_need_bytes'])} "
        f"measured, {format_bytes(check['estimated_need_bytes'])} estimated; "
        "budget 1.0 GiB")
    leangnn.fit(GCN(8, 16, 2, classes), data, memory_budget="1GiB", epochs=2,
                strategy="full", progress=False)
    assert "leangnn.fit" not in capsys.readouterr().err


def test_fit_prune_trains_the_largest_core_that_fits(data):
    table = leangnn.plan(GCN(8, 16, 2, int(data.y.max()) + 1), data, "1GiB",
                         calibration=EXACT, strategies=("prune",))
    fitting = [r.config["budget_ratio"] for r in table.rows if r.fits]
    assert len(fitting) == 3  # every core fits: the smallest was trained
    out = leangnn.fit(GCN(8, 16, 2, int(data.y.max()) + 1), data, strategy="prune",
                      memory_budget="1GiB", epochs=1)
    assert out["row"].config["budget_ratio"] == max(fitting)
    assert out["row"].chosen


def test_fit_reversible_on_another_model_says_why(data):
    with pytest.raises(ValueError, match=r"^strategy='reversible' is not possible "
                       r"for this model: reversible training needs a GSRGNN, GCN "
                       r"is not one"):
        leangnn.fit(GCN(8, 16, 2, int(data.y.max()) + 1), data, strategy="reversible",
                    memory_budget="1GiB", epochs=1)


def test_plan_refuses_wrong_kinds_of_arguments_in_one_line(data):
    import numpy as np
    from torch_geometric.data import HeteroData
    from torch_geometric.transforms import ToSparseTensor

    classes = int(data.y.max()) + 1
    model = GCN(8, 16, 2, classes)
    with torch.device("meta"):
        meta = GCN(8, 16, 2, classes)
    cases = [
        (dict(model=None), r"^model: expected a torch.nn.Module, got NoneType$"),
        (dict(model=lambda x, ei: x),
         r"^model: expected a torch.nn.Module, got function$"),
        (dict(model=meta), r"^model: its parameters are on the meta device"),
        (dict(data=[data, data]),
         r"^data: expected one torch_geometric.data.Data graph, got list$"),
        (dict(data=HeteroData()), r"got HeteroData$"),
        (dict(data={"x": data.x}), r"got dict$"),
        (dict(data=None), r"got NoneType$"),
        (dict(data=ToSparseTensor()(data.clone())),
         r"^data: has adj_t but no edge_index"),
        (dict(memory_budget=float("nan")), r"^memory_budget: cannot read nan as a "),
        (dict(memory_budget=float("inf")), r"^memory_budget: cannot read inf as a "),
        (dict(strategies="full"), r"^strategies: expected a tuple of names from "
         r"\('full', 'reversible', 'offload', 'prune'\), got 'full'$"),
        (dict(strategies=("full", "bogus")), r"^strategies: unknown \['bogus'\]"),
        (dict(epochs=0), r"^epochs: expected a positive int, got 0$"),
        (dict(epochs=1.5), r"^epochs: expected a positive int, got 1.5$"),
        (dict(device=3), r"^device: expected cpu, cuda or cuda:i, got 3$"),
    ]
    for kwargs, expect in cases:
        kw = dict(model=model, data=data, memory_budget="1GiB") | kwargs
        with pytest.raises(ValueError, match=expect):
            leangnn.plan(**kw)
    table = leangnn.plan(model, data, memory_budget=np.int64(1 << 30),
                         strategies=("full",), calibration=EXACT)
    assert table.budget_bytes == 1 << 30


@pytest.mark.parametrize("returns", [1.0, None])
def test_a_loss_fn_returning_no_tensor_is_refused_in_one_line(data, returns):
    name = type(returns).__name__
    for call in (lambda: leangnn.plan(GCN(8, 16, 2, 3), data, "1GiB",
                                      loss_fn=lambda o, d: returns),
                 lambda: leangnn.fit(GCN(8, 16, 2, 3), data, lambda o, d: returns,
                                     memory_budget="1GiB", epochs=1)):
        with pytest.raises(ValueError, match=rf"^loss_fn: must return the loss as a "
                           rf"one-element tensor to backpropagate, got {name}$"):
            call()


@pytest.mark.parametrize("train_mode", [True, False])
def test_offload_rows_of_a_batchnorm_model_say_why_and_auto_trains_another(
        data, train_mode):
    """Offload runs a layer chunk by chunk: a BatchNorm's batch statistics
    would be of each chunk. Its rows say so (the model planned in eval mode
    too: it trains in training mode), and a budget below full batch picks a
    row that trains; before, offload was picked and the first step raised."""
    c = int(data.y.max()) + 1
    model = GCN(8, 16, 2, c, norm="batch_norm").train(train_mode)
    table = leangnn.plan(model, data, memory_budget="1GiB", calibration=EXACT)
    off = [r for r in table.rows if r.strategy == "offload"]
    assert len(off) == 1 and off[0].need_bytes is None and off[0].why == (
        "not possible: offload needs node-wise norms, got BatchNorm in training "
        "mode: batch or graph statistics are not computed chunk by chunk")
    assert model.training == train_mode  # the plan left its mode alone
    # fit plans with this machine's calibration, in process; on a graph whose
    # tensors outweigh the first-run constants (a core run pages in more
    # code than a full one: on 300 nodes no core needs less than full batch)
    big = contextual_sbm(6000, avg_degree=6.0, in_channels=64, seed=5)
    big = with_mask(big, big.train_mask)
    model = GCN(64, 64, 2, int(big.y.max()) + 1, norm="batch_norm").train(train_mode)
    mine = leangnn.plan(model, big, memory_budget="1GiB", epochs=2, in_process=True)
    full = next(r for r in mine.rows if r.strategy == "full")
    cores = [r.need_bytes for r in mine.rows if r.strategy == "prune"]
    assert min(cores) < full.need_bytes
    out = leangnn.fit(model, big, memory_budget=full.need_bytes - 1, epochs=2)
    assert out["row"].strategy == "prune" and len(out["losses"]) == 2


def _fit_counting_cores(data, monkeypatch, strategy, model, reuse):
    import leangnn.prune.dpr as dpr

    builds = []
    real = dpr.build_core
    monkeypatch.setattr(dpr, "build_core",
                        lambda *a, **k: builds.append(1) or real(*a, **k))
    monkeypatch.setenv("LEANGNN_PLAN_REUSE", "1" if reuse else "0")
    torch.manual_seed(0)
    out = leangnn.fit(model(), data, strategy=strategy, memory_budget="1GiB",
                      epochs=3)
    return out, len(builds)


def test_fit_trains_on_the_core_and_offload_graph_its_plan_built(data, monkeypatch):
    import leangnn.offload.engine as engine
    import leangnn.prune.dpr as dpr

    classes = int(data.y.max()) + 1
    model = lambda: GCN(8, 16, 2, classes)  # noqa: E731
    out, builds = _fit_counting_cores(data, monkeypatch, "prune", model, True)
    # the lazy plan's one core (the largest fits), none again for training
    assert builds == 1 and out["strategy"].summary()["core_reused"] is True
    assert not dpr._OFFERS and not engine._OFFERS  # the rest was dropped
    off, builds = _fit_counting_cores(data, monkeypatch, "prune", model, False)
    assert builds == 2 and "core_reused" not in off["strategy"].summary()
    assert out["losses"] == off["losses"]  # the same core, bit for bit

    out, _ = _fit_counting_cores(data, monkeypatch, "offload", model, True)
    assert out["strategy"].taken_bytes > 0  # the plan's graph structures
    assert not dpr._OFFERS and not engine._OFFERS
    off, _ = _fit_counting_cores(data, monkeypatch, "offload", model, False)
    assert off["strategy"].taken_bytes == 0
    assert out["losses"] == off["losses"]


def test_fit_plans_lazily_what_its_pick_needs(data, monkeypatch):
    """fit plans as ``leangnn train --strategy auto`` does: where an exact
    row fits, no DPR core is built or estimated (on a CPU the offload rows
    are, as they can be faster); for ``strategy="prune"`` only the largest
    core that fits. The pick is the full plan's (``lazy=False``)."""
    classes = int(data.y.max()) + 1
    model = lambda: GCN(8, 16, 2, classes)  # noqa: E731
    lazy, builds = _fit_counting_cores(data, monkeypatch, "auto", model, True)
    assert builds == 0
    table = lazy["plan"]
    prune = [r for r in table.rows if r.strategy == "prune"]
    assert len(prune) == 3 and all(r.need_bytes is None and r.why ==
                                   "not estimated: a preferred row fits (planned "
                                   "lazily)" for r in prune)
    assert all(r.need_bytes is not None for r in table.rows
               if r.strategy == "offload")
    torch.manual_seed(0)
    every = leangnn.fit(model(), data, memory_budget="1GiB", epochs=3, lazy=False)
    assert all(r.need_bytes is not None for r in every["plan"].rows)
    assert every["row"].label == lazy["row"].label
    assert every["losses"] == lazy["losses"]
    # a core that fits: no smaller one is estimated
    table = leangnn.fit(model(), data, memory_budget="1GiB", epochs=1,
                        strategy="prune")["plan"]
    assert [r.need_bytes is not None for r in table.rows] == [True, False, False]


def test_a_plan_hashes_its_graph_once_for_every_offload_row(data, monkeypatch):
    """Each offload row partitions the graph (cached by a hash of its edges):
    a plan hashes them once, not once a row (0.43 of 5.3 s at csbm:100000)."""
    import leangnn.graphs.partition as partition

    hashed = []
    real = partition.hashlib.blake2b
    monkeypatch.setattr(partition.hashlib, "blake2b",
                        lambda **k: hashed.append(1) or real(**k))
    table = leangnn.plan(GCN(8, 16, 2, int(data.y.max()) + 1), data, "1GiB",
                         strategies=("offload",))
    rows = [r for r in table.rows if r.need_bytes is not None]
    assert len(rows) > 1 and len(hashed) == 1


def test_a_lazy_plan_on_cuda_estimates_no_offload_row_where_full_batch_fits(
        data, monkeypatch):
    """On CUDA nothing exact is faster than full batch where it fits (the
    CLI planner's rule): a lazy plan's offload and core rows are "not
    estimated"; where full batch does not fit, the offload row is. (The
    rows run on this CPU's estimates: what is checked is which are made.)"""
    import leangnn.plan.user as user

    real = user.estimate_model
    monkeypatch.setattr(user, "estimate_model",
                        lambda m, d, f, dev, *a, **k: real(m, d, f, "cpu", *a, **k))
    offload = []
    monkeypatch.setattr(user, "_offload_model",
                        lambda *a, **k: offload.append(a[3]) or (_ for _ in ()).throw(
                            ValueError("an offload row was estimated")))
    model = GCN(8, 16, 2, int(data.y.max()) + 1)
    loss = default_loss(data)
    cuda = torch.device("cuda")
    rows = user._rows(model, data, loss, cuda, EXACT, 1 << 30, None, 3, 1e-3, 1.0,
                      lazy=True)
    # one device budget on CUDA (the whole budget), three part counts
    assert [r.strategy for r in rows] == ["full"] + ["offload"] * 3 + ["prune"] * 3
    assert rows[0].need_bytes <= 1 << 30 and offload == []
    assert all(r.why == "not estimated: a preferred row fits (planned lazily)"
               for r in rows[1:])
    # full batch over the budget: the offload row (the whole budget on CUDA)
    rows = user._rows(model, data, loss, cuda, EXACT, 1 << 10, ("full", "offload"),
                      3, 1e-3, 1.0, lazy=True)
    assert offload == [1 << 10] * 3 and rows[1].why.endswith(
        "an offload row was estimated")


def test_a_plan_alone_keeps_nothing_for_training(data):
    import leangnn.offload.engine as engine
    import leangnn.prune.dpr as dpr

    leangnn.plan(GCN(8, 16, 2, int(data.y.max()) + 1), data, "1GiB")
    assert not dpr._OFFERS and not engine._OFFERS
