"""Dry runs of DAG models on a few key levels against the dry run over every
level: the same peak, the work extrapolated within a few percent."""

from __future__ import annotations

import math

import pytest
import torch

from leangnn.circuits import load_circuit
from leangnn.nn.dag import DAGNN
from leangnn.nn.levels import level_plan
from leangnn.plan.dag import (
    KEY_MIXES,
    concrete_limit,
    key_levels,
    sliced_plan,
    trace_levels,
)
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import _scale_work, default_loss

pytestmark = pytest.mark.filterwarnings("ignore:index_reduce")


def _sizes(plan):
    depth = len(plan.forward)
    return ([s.size for s in plan.forward], [s.src.numel() for s in plan.forward],
            [plan.reverse[depth - 1 - i].src.numel() for i in range(depth)])


@pytest.mark.parametrize("name", ["iscas85/c6288", "epfl/router", "iscas85/c880"])
def test_key_levels_hold_the_largest_level_of_any_mix(name):
    data = load_circuit(name, "arrival")
    plan = level_plan(data.edge_index, data.num_nodes)
    key = key_levels(plan)
    assert key == sorted(set(key)) and len(key) <= 2 * KEY_MIXES + 2
    assert {0, len(plan.forward) - 1} <= set(key)
    nodes, fan_in, fan_out = _sizes(plan)
    gen = torch.Generator().manual_seed(0)
    for edges in (fan_in, fan_out):
        for a, b in torch.rand(50, 2, generator=gen).tolist() + [[1, 0], [0, 1]]:
            value = [a * n / max(nodes) + b * e / max(edges)
                     for n, e in zip(nodes, edges)]
            # six mixes per quarter circle: at most cos(9 deg) below the top
            assert max(value[i] for i in key) >= math.cos(math.pi / 20) * max(value)


def test_sliced_plan_keeps_the_graph_and_the_sweep_order():
    data = load_circuit("iscas85/c880", "arrival")
    plan = level_plan(data.edge_index, data.num_nodes)
    depth = len(plan.forward)
    cut = sliced_plan(plan, [5, 1, 5, 9])
    assert [s.nodes.tolist() for s in cut.forward] == \
        [plan.forward[i].nodes.tolist() for i in (1, 5, 9)]
    assert [s.nodes.tolist() for s in cut.reverse] == \
        [plan.reverse[depth - 1 - i].nodes.tolist() for i in (9, 5, 1)]
    assert cut.num_nodes == plan.num_nodes and cut.level is plan.level
    assert sliced_plan(plan, []).forward == ()


def _model(data, **kw):
    torch.manual_seed(0)
    return DAGNN(data.num_features, 16, 1, **kw)


@pytest.mark.parametrize("task,kw", [
    ("arrival", {}),
    ("signal_prob", {"task": "signal_prob"}),  # the cut estimate read from x
    ("arrival", {"aggr": "attention", "rounds": 2}),
])
def test_key_level_trace_equals_the_whole_trace(task, kw):
    big = load_circuit("iscas85/c1908", task)
    small = load_circuit("iscas85/c432", task)
    model = _model(big, **kw)

    def run(data):
        return trace_step(model, data, default_loss(data), max_ops=1 << 40,
                          concrete_limit=concrete_limit(data))

    trace, work = trace_levels(lambda: run(big), big)
    whole = run(big)
    # the sweeps free each level's temporaries: the key levels hold the
    # peak; a level's results outlive it into the next level's, and the
    # sliced sweep pairs other levels: within 1% either way
    assert trace.peak_bytes == pytest.approx(whole.peak_bytes, rel=0.01)
    for mine, real in zip(trace.heap_point(), whole.heap_point()):
        assert mine == pytest.approx(real, rel=0.01)
    assert trace.ops < whole.ops / 2
    other = run(small)
    epoch = _scale_work(work, big, [big, small])
    assert epoch["graphs"] == 2
    for k in ("ops", "written", "flops"):
        want = getattr(whole, k) + getattr(other, k)
        assert epoch[k] == pytest.approx(want, rel=0.06), k


def test_estimate_of_a_dag_model_traces_key_levels_only(monkeypatch):
    from leangnn.config import TrainConfig
    from leangnn.data import GraphSplits
    from leangnn.plan import dag as D
    from leangnn.plan.estimate import estimate_config, estimate_model

    big = load_circuit("iscas85/c1908", "arrival")
    small = load_circuit("iscas85/c432", "arrival")
    seen = []
    real = D.sliced_plan
    monkeypatch.setattr(D, "sliced_plan", lambda p, lv: seen.append(len(lv))
                        or real(p, lv))
    splits = GraphSplits([big, small], [small], [small], "regression", 1)
    cfg = TrainConfig(strategy="full", model="dag", hidden_channels=16, epochs=1)
    est = estimate_config(cfg, splits)
    assert est.method == "fake" and seen and max(seen) < len(
        level_plan(big.edge_index, big.num_nodes).forward)
    model = _model(big)
    whole = trace_step(model, big, default_loss(big), max_ops=1 << 40,
                       concrete_limit=concrete_limit(big))
    mine = estimate_model(model, big)
    assert mine.step_bytes == pytest.approx(whole.peak_bytes, rel=0.01)
    assert mine.work["ops"] == pytest.approx(whole.ops, rel=0.06)


def test_the_cut_estimate_is_measured_and_needed_before_the_step():
    """signal_prob's DAG model computes an exact cut estimate with numpy in
    its first step: no dry run sees it, so it is measured as it runs (once
    per graph) and the run needs at least it."""
    import tracemalloc

    from leangnn.circuits.sigprob import cut_signal_probability_arrays
    from leangnn.plan.calibration import load_calibration
    from leangnn.plan.dag import host_peak_bytes
    from leangnn.plan.estimate import estimate_model

    data = load_circuit("iscas85/c1908", "signal_prob")
    model = _model(data, task="signal_prob")
    assert model.cop_input and model.estimator == "cut"
    got = host_peak_bytes(model, data)
    assert host_peak_bytes(model, data) == got  # once per graph
    # the reference: the estimate's own arrays, measured apart
    ei = data.edge_index.numpy()
    order = ei[1].argsort(kind="stable")
    ptr = torch.zeros(data.num_nodes + 1, dtype=torch.long)
    ptr[1:] = torch.bincount(data.edge_index[1], minlength=data.num_nodes).cumsum(0)
    tracemalloc.start()
    cut_signal_probability_arrays(data.x[:, :12].argmax(1).numpy(), ptr.numpy(),
                                  ei[0][order], data.level.numpy())
    want = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert want > 1 << 20 and got == pytest.approx(want, rel=0.1)
    assert host_peak_bytes(_model(data), data) == 0  # arrival: no cut estimate
    cal = load_calibration("cpu")
    est = estimate_model(model, data, calibration=cal)
    assert est.precompute_bytes == got
    assert est.run_bytes >= got + cal.const - 1


def test_kept_level_plans_are_counted_as_the_model_builds_them(mallinfo2):
    # The reference: the level plans level_plan really builds (their unique
    # index storages, their tensors) and glibc's in-use bytes they hold.
    import gc

    from leangnn.config import TrainConfig
    from leangnn.data import GraphSplits
    from leangnn.plan.dag import PLAN_VIEW_BYTES, cached_plans_bytes
    from leangnn.plan.estimate import estimate_config

    graphs = [load_circuit(n, "arrival") for n in
              ("iscas85/c432", "iscas85/c880", "iscas85/c1908", "epfl/router")]
    plans = [level_plan(g.edge_index, g.num_nodes, cache=False) for g in graphs]
    storages, views = {}, 0
    for p in plans:
        ts = [p.level, p.in_degree, p.out_degree] + [
            t for s in p.forward + p.reverse for t in (s.nodes, s.src, s.loc)]
        views += len(ts)
        storages.update({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                         for t in ts})
    assert cached_plans_bytes(graphs) == sum(storages.values()) + \
        PLAN_VIEW_BYTES * views
    if mallinfo2 is not None:  # glibc: what they hold in the heap, within 25%
        del plans
        gc.collect()
        before = mallinfo2().uordblks
        plans = [level_plan(g.edge_index, g.num_nodes, cache=False) for g in graphs]
        held = mallinfo2().uordblks - before
        assert cached_plans_bytes(graphs) == pytest.approx(held, rel=0.25)
    # the planner keeps them in a DAG model's run: more graphs, more bytes;
    # a graph trained and validated on has one plan
    from leangnn.plan.estimate import largest_graph

    big, val = largest_graph(graphs), [graphs[0]]
    cfg = TrainConfig(strategy="full", model="dag", hidden_channels=16, epochs=2)
    one = estimate_config(cfg, GraphSplits([big], val, val, "regression", 1))
    four = estimate_config(cfg, GraphSplits(graphs, val, val, "regression", 1))
    assert four.later[0] - one.later[0] == cached_plans_bytes(graphs) - \
        cached_plans_bytes([big] + val)
