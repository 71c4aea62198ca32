"""DPR's kept validation state, counted against the strategy's own state."""

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.data import GraphSplits, load_graphs, with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.plan import estimate as E
from leangnn.plan.dpr_state import (
    anchor_bytes,
    state_bytes,
    validation_kept_bytes,
    walk_entries_bound,
)
from leangnn.plan.estimate import _build, _core_graph, estimate_config, largest_graph
from leangnn.prune.dpr import DPRStrategy
from leangnn.prune.serve import anchor_chunks


def _kept(cfg, splits):
    """(estimated, real) bytes DPR keeps of ``splits``' validation graphs: the
    real ones are the storages the strategy holds after one validation pass
    that it did not hold after preparing the training graphs."""
    big = largest_graph(splits.train)
    core, _ = _core_graph(cfg, big, torch.device("cpu"))
    model = _build(cfg, splits.in_channels, splits.out_channels, cfg.num_layers)
    est = validation_kept_bytes(cfg, splits, model, core, big)
    dpr = DPRStrategy.from_config(cfg)
    dpr.setup(model, splits.train)
    for g in splits.train:
        dpr.prepare(g)
    seen: set[int] = set()
    for st in list(dpr._states.values()):
        state_bytes(st, seen)
    for g in splits.val:
        dpr.predict(model, g)
    real = sum(state_bytes(st, seen) for st in list(dpr._states.values()))
    E.forget()
    return est, real


@pytest.mark.parametrize("model", ["sage", "gcn", "res"])
def test_kept_state_of_a_validation_graph_that_is_the_training_graph(model):
    """csbm's validation graph is its training graph (same name and size):
    DPR keeps its anchors and serving operands; the count is their size.
    The anchors' ``k`` per row is an upper bound: a graph dense enough that
    every walk reaches ``k`` core nodes (csbm:100000's reach 7.95 of 8; at
    3000 nodes of degree 8, ~5)."""
    g = contextual_sbm(3000, avg_degree=24.0, in_channels=8, seed=3)
    g.name = "csbm-3000"
    train, val = with_mask(g, g.train_mask), with_mask(g, g.val_mask)
    splits = GraphSplits([train], [val], [val], "classification",
                         int(g.y.max()) + 1)
    cfg = TrainConfig(dataset="csbm:3000", strategy="prune", model=model,
                      num_layers=2, hidden_channels=16, budget_ratio=0.3)
    est, real = _kept(cfg, splits)
    assert real > 0
    assert real <= est <= 1.01 * real


def test_kept_state_of_other_validation_circuits():
    """Validation circuits that are not training graphs: DPR keeps each one's
    core state too (built here as DPR builds it: the same storages)."""
    cfg = TrainConfig(dataset="iscas85/c1908", val_dataset="iscas85/c880,"
                      "iscas85/c1355", test_dataset="iscas85/c17",
                      strategy="prune", model="sage", num_layers=2,
                      hidden_channels=16, budget_ratio=0.3)
    splits = load_graphs(cfg, progress=False)
    est, real = _kept(cfg, splits)
    assert real > 0
    # on small circuits many pruned nodes reach fewer than k core nodes
    assert real <= est <= 2 * real


def test_anchor_bytes_on_a_device_match_the_serving_chunks():
    """On a CUDA device DPR copies each serving chunk there: the formula
    against the chunks ``anchor_chunks`` makes, each part's bytes as a copy
    holds them (on the CPU they are views; a sparse tensor moved to the meta
    device loses its entries, so meta cannot stand in for the device)."""
    g = contextual_sbm(2000, avg_degree=8.0, in_channels=8, seed=1)
    g.name = "csbm-2000"
    cfg = TrainConfig(strategy="prune", model="sage", budget_ratio=0.3)
    dpr = DPRStrategy.from_config(cfg)
    st = dpr.prepare(g)
    dpr._ensure_anchors(st, g, rows=False)
    chunk = 256
    _, chunks = anchor_chunks(st.anchors, st.pruned, chunk, torch.device("cpu"))
    assert len(chunks) > 1
    copied = sum(t.numel() * t.element_size() for w, _, mass, rows in chunks
                 for t in (w.crow_indices(), w.col_indices(), w.values(), mass,
                           rows))
    p, k = st.pruned.numel(), dpr.config.num_anchors
    nnz = st.anchors.weight._nnz()
    exact = anchor_bytes(p, st.core.num_core, k, chunk, on_device=True, nnz=nnz)
    assert exact == copied
    # the bound (k entries a row) where the walk is not known yet
    est = anchor_bytes(p, st.core.num_core, k, chunk, on_device=True)
    assert nnz < p * k and est > copied
    # on the CPU the chunks are views: only their rebased row pointers
    assert anchor_bytes(p, st.core.num_core, k, chunk) < est


def test_later_epochs_carry_the_kept_state(monkeypatch):
    """The estimate of a run of more than one epoch adds the kept state to
    its later epochs (one to one: allocated once, not churned), not to the
    first, which no validation pass precedes."""
    g = contextual_sbm(2000, avg_degree=8.0, in_channels=8, seed=2)
    g.name = "csbm-2000"
    train, val = with_mask(g, g.train_mask), with_mask(g, g.val_mask)
    splits = GraphSplits([train], [val], [val], "classification",
                         int(g.y.max()) + 1)
    cfg = TrainConfig(dataset="csbm:2000", strategy="prune", model="sage",
                      num_layers=2, hidden_channels=16, budget_ratio=0.3, epochs=3)
    kept = 123_456
    with_state = estimate_config(cfg, splits)
    monkeypatch.setattr(E, "validation_kept_bytes", lambda *a, **k: kept)
    fixed = estimate_config(cfg, splits)
    monkeypatch.setattr(E, "validation_kept_bytes", lambda *a, **k: 0)
    none = estimate_config(cfg, splits)
    E.forget()
    assert fixed.later[0] - none.later[0] == kept
    assert fixed.later[1] - none.later[1] == kept
    assert fixed.later[2] == none.later[2]
    assert fixed.step_bytes == none.step_bytes
    assert with_state.later[0] > none.later[0]


def test_no_validation_graph_keeps_nothing():
    g = contextual_sbm(500, avg_degree=4.0, in_channels=8, seed=0)
    splits = GraphSplits([g], [], [], "classification", int(g.y.max()) + 1)
    cfg = TrainConfig(strategy="prune", model="sage", budget_ratio=0.3)
    model = _build(cfg, splits.in_channels, splits.out_channels, cfg.num_layers)
    core, _ = _core_graph(cfg, g, torch.device("cpu"))
    assert validation_kept_bytes(cfg, splits, model, core, g) == 0
    assert anchor_bytes(0, 10, 8, 16) == 0
    E.forget()


def test_walk_entries_bound_counts_the_walks():
    """The bound is the number of walks of 1..t hops over the edges both
    ways, summed over the start nodes (dense matrix powers as reference)."""
    ei = torch.tensor([[0, 1, 2, 2, 4], [1, 2, 0, 3, 4]])
    a = torch.zeros(5, 5, dtype=torch.float64)
    for s, d in ei.t().tolist():
        a[s, d] += 1
        a[d, s] += 1
    one = torch.ones(5, dtype=torch.float64)
    for t in (1, 2, 3):
        ref = sum(float(one @ torch.linalg.matrix_power(a, h) @ one)
                  for h in range(1, t + 1))
        assert walk_entries_bound(ei, 5, t) == int(ref)
    assert walk_entries_bound(torch.empty(2, 0, dtype=torch.long), 5, 2) == 0


def test_huge_anchor_counts_are_bounded_by_the_walks():
    """``--anchors`` far above what a 2-hop walk reaches on a circuit: the
    count is the walks' bound, still above what DPR holds, not every core
    node a row (which would refuse a plan that fits)."""
    cfg = TrainConfig(dataset="iscas85/c1908", val_dataset="iscas85/c880,"
                      "iscas85/c1355", test_dataset="iscas85/c17",
                      strategy="prune", model="res", num_layers=2,
                      hidden_channels=16, budget_ratio=0.3, num_anchors=100_000)
    splits = load_graphs(cfg, progress=False)
    est, real = _kept(cfg, splits)
    rows = sum(anchor_bytes(int(g.num_nodes) - round(0.3 * int(g.num_nodes)),
                            round(0.3 * int(g.num_nodes)), 100_000, 16384)
               for g in splits.val)
    assert real <= est < rows / 2
