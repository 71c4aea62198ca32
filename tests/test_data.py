"""Resolving a config into train/val/test graphs."""

from __future__ import annotations

import pytest
import torch

from leangnn.circuits import catalog
from leangnn.config import TrainConfig
from leangnn.data import check_datasets, csbm_nodes, load_graphs, with_mask


def test_default_split_by_circuit():
    s = load_graphs(TrainConfig(), progress=False)
    names = [{g.name for g in part} for part in (s.train, s.val, s.test)]
    assert not names[0] & names[2] and not names[0] & names[1]
    assert s.task_type == "regression" and s.out_channels == 1


def test_validation_held_out_deterministically():
    cfg = TrainConfig(dataset="iscas85", test_dataset="epfl/ctrl", seed=3)
    a = load_graphs(cfg, progress=False)
    b = load_graphs(cfg, progress=False)
    assert [g.name for g in a.val] == [g.name for g in b.val]
    assert len(a.val) == 2 and len(a.train) == 9
    assert not {g.name for g in a.val} & {g.name for g in a.train}


def test_classification_task_and_masks():
    s = load_graphs(TrainConfig(dataset="c17,c432", test_dataset="epfl/ctrl",
                                task="critical"), progress=False)
    assert s.task_type == "classification" and s.out_channels == 4
    g = s.train[0]
    m = with_mask(g, torch.zeros(g.num_nodes, dtype=torch.bool))
    assert m.node_mask.sum() == 0 and g.get("node_mask") is None
    assert m.x is g.x  # shallow: no copy of the features


def test_synthetic_spec():
    s = load_graphs(TrainConfig(dataset="csbm:300"), progress=False)
    assert s.task_type == "classification"
    g = s.train[0]
    assert torch.equal(s.train[0].node_mask, g.train_mask)
    assert torch.equal(s.test[0].node_mask, g.test_mask)
    with pytest.raises(ValueError, match="expected csbm:NUM_NODES, got 'csbm:many'"):
        load_graphs(TrainConfig(dataset="csbm:many"), progress=False)


def test_check_datasets_resolves_without_loading(monkeypatch):
    import leangnn.data

    def no_load(*a, **k):
        raise AssertionError("loaded")

    monkeypatch.setattr(leangnn.data, "load_suite", no_load)
    got = check_datasets(TrainConfig(dataset="iscas85", test_dataset="epfl/ctrl"))
    assert [i.name for i in got["train"]] == [c.name for c in catalog()
                                              if c.suite == "iscas85"]
    assert got["val"] == [] and [i.name for i in got["test"]] == ["epfl/ctrl"]
    default = check_datasets(TrainConfig())
    assert all(default[k] for k in ("train", "val", "test"))
    assert check_datasets(TrainConfig(dataset="csbm:300")) is None
    with pytest.raises(ValueError, match=r"test_dataset: circuits \['iscas85/c17'\] "
                       "are also in the training set"):
        check_datasets(TrainConfig(dataset="iscas85", test_dataset="c17"))
    with pytest.raises(ValueError, match="val_dataset: unknown circuit or suite"):
        check_datasets(TrainConfig(dataset="c17", val_dataset="nope"))


@pytest.mark.parametrize("spec, n", [("csbm:100", 100), ("csbm:1e5", 100_000),
                                     ("csbm: 2500 ", 2500),
                                     ("csbm:1000000000", 10**9)])
def test_csbm_nodes(spec, n):
    assert csbm_nodes(spec) == n


@pytest.mark.parametrize("spec", ["csbm:99", "csbm:1000000001", "csbm:inf",
                                  "csbm:nan", "csbm:-5", "csbm:2.5", "csbm:",
                                  "csbm", "sbm:100", "csbm:1e12"])
def test_csbm_nodes_rejects(spec):
    with pytest.raises(ValueError, match=f"expected csbm:NUM_NODES, got {spec!r}"):
        csbm_nodes(spec)


def test_synthetic_graph_too_large_is_refused_before_generating(monkeypatch):
    import leangnn.graphs.synthetic
    import leangnn.plan.fits

    def no_generation(*a, **k):
        raise AssertionError("generated")

    monkeypatch.setattr(leangnn.plan.fits, "_host_available", lambda: 1 << 20)
    monkeypatch.setattr(leangnn.graphs.synthetic, "contextual_sbm", no_generation)
    with pytest.raises(ValueError, match=r"dataset: csbm:1000 needs ~2.0 MiB of host "
                       r"memory to generate \(estimate\), only 1.0 MiB available"):
        load_graphs(TrainConfig(dataset="csbm:1000"), progress=False)


def _graph(n=6, width=3, name="mine"):
    from torch_geometric.data import Data

    g = Data(x=torch.rand(n, width), edge_index=torch.tensor([[0, 1], [1, 2]]),
             y=torch.rand(n), num_nodes=n)
    g.name = name
    return g


@pytest.mark.parametrize("tensor, value, count", [
    ("x", float("nan"), 1), ("x", float("inf"), 3), ("x", -float("inf"), 2),
    ("y", float("nan"), 4), ("y", float("inf"), 1)])
def test_check_graph_counts_non_finite_entries(tensor, value, count):
    from leangnn.data import check_graph

    g = _graph()
    t = getattr(g, tensor).view(-1)
    idx = torch.randperm(t.numel(), generator=torch.Generator().manual_seed(count))
    t[idx[:count]] = value
    want = int((~torch.isfinite(getattr(g, tensor))).sum())  # the reference count
    assert want == count
    with pytest.raises(ValueError, match=rf"^val graph 'mine': {tensor} has {count} "
                       r"non-finite \(NaN or Inf\) entries of "
                       rf"{getattr(g, tensor).numel()}"):
        check_graph(g, "val graph")
    if tensor == "y":
        check_graph(g, labels=False)  # predicting needs no labels


@pytest.mark.parametrize("key, value, expect", [
    ("edge_attr", torch.rand(3, 4), r"edge_attr has shape \[3, 4\] for 2 edges"),
    ("edge_weight", torch.rand(()), r"edge_weight has shape \[\] for 2 edges"),
    ("edge_attr", torch.tensor([[0.0, float("nan")], [1.0, 2.0]]),
     r"edge_attr has 1 non-finite \(NaN or Inf\) entries of 4, the first at "
     r"\[0, 1\]"),
    ("edge_weight", torch.tensor([1.0, float("inf")]),
     r"edge_weight has 1 non-finite .* the first at \[1\]")])
def test_check_graph_refuses_bad_edge_weights_and_features(key, value, expect):
    """Edge weights and features reach the model (a model that takes
    edge_attr is given it): the wrong length or a NaN is one line."""
    from leangnn.data import check_graph

    g = _graph()
    g[key] = value
    with pytest.raises(ValueError, match=rf"^graph 'mine': {expect}"):
        check_graph(g)
    g[key] = torch.ones(2, 4) if key == "edge_attr" else torch.ones(2)
    check_graph(g)
    g[key] = torch.ones(2, dtype=torch.long)  # integer edge types: no NaN
    check_graph(g)


def test_check_graph_scores_labels_under_the_mask_only():
    from leangnn.data import check_graph

    g = _graph()
    g.y[4:] = float("nan")  # unlabelled nodes, outside the mask: fine
    check_graph(with_mask(g, torch.arange(6) < 4))
    with pytest.raises(ValueError, match="y has 2 non-finite .* of 6 scored by "
                       "node_mask"):
        check_graph(with_mask(g, torch.ones(6, dtype=torch.bool)))


@pytest.mark.parametrize("edit, expect", [
    (lambda g: setattr(g, "edge_index", torch.tensor([[0, 6], [1, 2]])),
     r"edge_index holds node ids outside \[0, 6\): min 0, max 6"),
    (lambda g: setattr(g, "edge_index", torch.tensor([[0, -1], [1, 2]])),
     r"edge_index holds node ids outside \[0, 6\): min -1"),
    (lambda g: setattr(g, "edge_index", torch.zeros(3, 2, dtype=torch.long)),
     r"edge_index must be an integer \[2, num_edges\] tensor, got int64 \[3, 2\]"),
    (lambda g: setattr(g, "edge_index", torch.zeros(2, 2)),
     r"edge_index must be an integer \[2, num_edges\] tensor, got float32 \[2, 2\]"),
    (lambda g: setattr(g, "edge_index", torch.tensor([[0, 1], [1, 2]],
                                                     dtype=torch.int32)),
     r"edge_index must be int64, got int32; convert it with edge_index.long\(\)$"),
    (lambda g: setattr(g, "x", torch.rand(6)), r"x must be \[num_nodes, num_feat"),
    (lambda g: setattr(g, "x", None), r"has no node features"),
    (lambda g: setattr(g, "y", torch.rand(5)), r"y has shape \[5\] for 6 nodes"),
])
def test_check_graph_names_malformed_tensors(edit, expect):
    from leangnn.data import check_graph

    g = _graph()
    edit(g)
    with pytest.raises(ValueError, match=rf"^graph 'mine': {expect}"):
        check_graph(g)


def test_check_graph_refuses_a_trained_graph_whose_mask_scores_no_node():
    from leangnn.data import check_graph

    g = with_mask(_graph(), torch.zeros(6, dtype=torch.bool))
    check_graph(g)  # a graph only predicted for or evaluated may score none
    check_graph(g, nodes=True, labels=False)  # a loss of its own: not data.y's
    with pytest.raises(ValueError, match=r"^graph 'mine': node_mask selects no "
                       r"node \(all 6 entries False\)$"):
        check_graph(g, nodes=True)
    check_graph(with_mask(_graph(), torch.arange(6) == 2), nodes=True)


def test_check_splits_width_classes_and_empty_training_graph():
    from leangnn.data import GraphSplits, check_splits

    ok = _graph()
    check_splits(GraphSplits([ok], [ok], [ok], "regression", 1))
    with pytest.raises(ValueError, match=r"^test graph 1 'wide': x has 5 features "
                       "per node, the model takes 3"):
        check_splits(GraphSplits([ok], [], [ok, _graph(width=5, name="wide")],
                                 "regression", 1))
    cls = _graph()
    cls.y = torch.tensor([0, 1, 2, 3, 4, 0])
    with pytest.raises(ValueError, match=r"y must hold class ids in \[0, 4\), got "
                       "int64 values from 0 to 4"):
        check_splits(GraphSplits([cls], [], [], "classification", 4))
    empty = _graph(n=0)
    empty.edge_index = torch.zeros(2, 0, dtype=torch.long)
    empty.y = torch.zeros(0)
    check_splits(GraphSplits([ok], [empty], [empty], "regression", 1))
    with pytest.raises(ValueError, match=r"^train graph 1 'mine': has no nodes"):
        check_splits(GraphSplits([ok, empty], [], [], "regression", 1))


def test_split_masks_scores_each_splits_pyg_mask_where_no_node_mask_is_set():
    """One Planetoid-style graph given as every split: each split scores its
    own PyG mask (before: every label trained on and scored everywhere); a
    node_mask, a mask of another kind and a graph without one stay as they
    are; the caller's graphs are not changed."""
    from leangnn.data import GraphSplits, split_masks
    from leangnn.graphs.synthetic import contextual_sbm

    g = contextual_sbm(300, avg_degree=4.0, in_channels=4, seed=1)
    assert "node_mask" not in g
    out = split_masks(GraphSplits([g], [g], [g], "classification", 8))
    assert out.train[0].node_mask is g.train_mask
    assert out.val[0].node_mask is g.val_mask and out.test[0].node_mask is g.test_mask
    assert "node_mask" not in g  # shallow copies
    own = with_mask(g, g.val_mask)
    idx = g.clone()
    idx.train_mask = g.train_mask.nonzero().view(-1)
    plain = _graph()
    out = split_masks(GraphSplits([own, idx, plain], [], [], "classification", 8))
    assert out.train[0] is own and out.train[1] is idx and out.train[2] is plain


@pytest.mark.parametrize("mask", [torch.zeros(3, dtype=torch.bool), torch.arange(4),
                                  [True] * 5])
def test_check_graph_names_a_node_mask_of_another_shape_or_kind(mask):
    from torch_geometric.data import Data

    from leangnn.data import check_graph

    d = Data(x=torch.randn(5, 2), edge_index=torch.tensor([[0, 1], [1, 2]]),
             y=torch.zeros(5), node_mask=mask)
    with pytest.raises(ValueError, match=r"g: node_mask must be a bool tensor of "
                       r"shape \[5\] \(one entry per node\), got "):
        check_graph(d, "g")
