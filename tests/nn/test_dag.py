"""DAGNN and level plans against networkx, static timing, finite differences."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch
from torch.func import functional_call

from leangnn.circuits import (
    GATE_TYPES,
    DelayModel,
    load_circuit,
    read_netlist,
    static_timing,
)
from leangnn.circuits.dataset import resolve
from leangnn.nn.dag import AGGRS, DAGNN
from leangnn.nn.levels import level_plan, max_plus, plan_in_use
from leangnn.profile import SavedTensorsMeter

pytestmark = pytest.mark.filterwarnings("ignore:index_reduce")

CIRCUITS = ["iscas85/c432", "iscas85/c6288", "epfl/router"]


def _nx(edge_index: torch.Tensor, n: int) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edge_index.t().tolist())
    return g


@pytest.mark.parametrize("name", CIRCUITS)
def test_level_plan_matches_networkx(name):
    data = load_circuit(name, "arrival")
    n = data.num_nodes
    g = _nx(data.edge_index, n)
    gens = [sorted(gen) for gen in nx.topological_generations(g)]
    plan = level_plan(data.edge_index, n, cache=False)
    assert plan.depth == len(gens) - 1
    want_level = np.empty(n, dtype=np.int64)
    for lvl, gen in enumerate(gens):
        want_level[gen] = lvl
    np.testing.assert_array_equal(plan.level.numpy(), want_level)
    assert torch.equal(plan.level, data.level)
    for lvl, (fwd, rev) in enumerate(zip(plan.forward, reversed(plan.reverse))):
        assert fwd.nodes.tolist() == gens[lvl] == rev.nodes.tolist()
        assert torch.all(fwd.loc[1:] >= fwd.loc[:-1])  # grouped by destination
        got = sorted(zip(fwd.src.tolist(), fwd.nodes[fwd.loc].tolist()))
        assert got == sorted((u, v) for v in gens[lvl] for u in g.predecessors(v))
        got = sorted(zip(rev.nodes[rev.loc].tolist(), rev.src.tolist()))
        assert got == sorted((v, w) for v in gens[lvl] for w in g.successors(v))
    assert torch.equal(plan.in_degree, torch.tensor([g.in_degree(v) for v in range(n)]))
    # a given levelling is checked and used as is
    given = level_plan(data.edge_index, n, level=data.level, cache=False)
    assert torch.equal(given.level, plan.level)


def test_level_plan_is_cached_per_edge_index():
    data = load_circuit("iscas85/c432", "arrival")
    ei = data.edge_index.clone()
    first = level_plan(ei, data.num_nodes)
    assert level_plan(ei, data.num_nodes) is first
    assert level_plan(ei.clone(), data.num_nodes) is not first
    ei[0, 0] = ei[0, 0]  # an in-place write bumps the version: rebuilt
    assert level_plan(ei, data.num_nodes) is not first


def test_plan_in_use_answers_for_its_tensor_alone():
    data = load_circuit("iscas85/c432", "arrival")
    ei, other = data.edge_index.clone(), data.edge_index.clone()
    real = level_plan(ei, data.num_nodes)
    few = level_plan(torch.tensor([[0], [1]]), 2, cache=False)
    with plan_in_use(ei, few):
        assert level_plan(ei, data.num_nodes) is few
        assert level_plan(ei, data.num_nodes, level=data.level) is few
        assert level_plan(other, data.num_nodes) is not few
        with plan_in_use(ei, real):  # nested: the inner one, then back
            assert level_plan(ei, data.num_nodes) is real
        assert level_plan(ei, data.num_nodes) is few
    assert level_plan(ei, data.num_nodes) is real


def test_cycles_and_bad_levels_are_named():
    # 0 -> 1 -> 2 -> 0 is a cycle; 3 hangs below it
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 3]])
    with pytest.raises(ValueError, match="3 nodes lie on directed cycles"):
        level_plan(ei, 4, cache=False)
    with pytest.raises(ValueError, match="not a DAG"):
        DAGNN(4, 4, 1, gate_types=0)(torch.zeros(4, 4), ei)
    dag = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="not a topological levelling"):
        level_plan(dag, 3, level=torch.tensor([0, 1, 1]), cache=False)
    with pytest.raises(ValueError, match="outside"):
        level_plan(dag, 2, cache=False)


def _set_delay_model(model: DAGNN, dm: DelayModel) -> None:
    """Timing channel 0 := the DelayModel; head := arrival / longest path."""
    with torch.no_grad():
        model.delay_type.weight.zero_()
        model.delay_type.bias.zero_()
        for name, d in dm.intrinsic.items():
            model.delay_type.weight[0, GATE_TYPES.index(name)] = d
        model.delay_deg.zero_()
        model.delay_deg[1, 0] = dm.fanout_coeff  # row 0: fanin, row 1: fanout
        model.skip.weight.zero_()
        model.skip.bias.zero_()
        model.skip.weight[0, model.kp] = 1.0  # first timing feature: arrival / P


@pytest.mark.parametrize("name", ["iscas85/c432", "iscas85/c6288", "iscas89/s27"])
def test_timing_channel_reproduces_static_timing_exactly(name):
    data = load_circuit(name, "arrival")
    net = read_netlist(resolve(name)[0].path)
    timing = static_timing(net, DelayModel())
    model = DAGNN(data.num_features, 8, 1, reverse=True).double()
    _set_delay_model(model, DelayModel())
    x = data.x.double()
    with torch.no_grad():
        arrival, to_sink, delay = model.timing(x, data.edge_index)
    assert torch.equal(arrival[:, 0], torch.as_tensor(timing.arrival))
    # longest path through a node = period - slack (the reverse channel)
    path = (arrival + to_sink - delay)[:, 0].numpy()
    np.testing.assert_allclose(path, timing.period - timing.slack, rtol=0, atol=1e-9)
    with torch.no_grad():
        out = model(x, data.edge_index).view(-1)
    torch.testing.assert_close(out, torch.as_tensor(timing.arrival / timing.period),
                               rtol=1e-12, atol=1e-12)
    # ... which is exactly the dataset's arrival label (up to its float32 cast)
    torch.testing.assert_close(out.float(), data.y, rtol=0, atol=1e-6)


def _random_dag(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src, dst = [], []
    for v in range(3, n):
        k = int(torch.randint(1, 3, (1,), generator=g))
        for u in torch.randperm(v, generator=g)[:k].tolist():
            src.append(u)
            dst.append(v)
    types = torch.cat([torch.zeros(3, dtype=torch.long),
                       torch.randint(4, 12, (n - 3,), generator=g)])
    x = torch.cat([torch.nn.functional.one_hot(types, 12).double(),
                   torch.randn(n, 3, generator=g, dtype=torch.double)], 1)
    return x, torch.tensor([src, dst])


@pytest.mark.parametrize("aggr", AGGRS)
def test_gradients_match_finite_differences(aggr):
    torch.manual_seed(0)
    x, ei = _random_dag(9, seed=1)
    model = DAGNN(15, 4, 2, aggr=aggr, rounds=2, timing_channels=2,
                  product_channels=2,
                  quantiles=(0.25, 0.75) if aggr == "max" else ()).double()
    names = [k for k, _ in model.named_parameters()]
    # random parameters: the unit-delay start ties every max (not differentiable)
    params = [(p.detach() + 0.3 * torch.randn_like(p)).requires_grad_()
              for p in model.parameters()]
    feats = x[:, 12:].clone().requires_grad_()

    def f(feats, *ps):
        return functional_call(model, dict(zip(names, ps)),
                               (torch.cat([x[:, :12], feats], 1), ei))

    assert torch.autograd.gradcheck(f, (feats, *params), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


@pytest.mark.parametrize("aggr", AGGRS)
def test_hand_written_backward_matches_autograd(aggr, monkeypatch):
    from leangnn.nn import dag

    torch.manual_seed(0)
    x, ei = _random_dag(30, seed=2)
    model = DAGNN(15, 8, 2, aggr=aggr, rounds=2).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    grads = []
    for manual in (True, False):  # False: each level recomputed under autograd
        monkeypatch.setattr(dag._GRUCell, "manual_backward", manual)
        model.zero_grad()
        (model(x, ei) ** 2).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("circuit", ["iscas85/c432", "epfl/router"])
def test_typed_update_grouped_by_gate_type_equals_the_dense_product(
        circuit, monkeypatch):
    """The per-type GRU input weights run as one product per gate type present
    (one-hot rows); the dense one-hot expansion is the reference (float64,
    outputs and every gradient, manual backward)."""
    from leangnn.circuits import load_circuit
    from leangnn.nn import dag

    data = load_circuit(circuit, task="arrival")
    x = data.x.double()
    monkeypatch.setattr(dag, "GROUP_MIN_ROWS", 1)  # every level, however small
    calls, real = [], dag._typed_mm
    monkeypatch.setattr(dag, "_typed_mm", lambda *a, **k: calls.append(1) or
                        real(*a, **k))
    results = []
    for grouped in (True, False):
        if not grouped:
            monkeypatch.setattr(dag, "_type_groups", lambda onehot: None)
        torch.manual_seed(0)
        model = DAGNN(x.size(1), 8, 1, task="arrival").double()
        out = model(x, data.edge_index)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()
                                       if p.grad is not None]))
        if grouped:
            assert calls, "the grouped product was not used"
            n = len(calls)
    assert len(calls) == n  # the dense run did not group
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert len(ga) == len(gb)
    for p, q in zip(ga, gb):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-11)


def test_type_groups_refuse_rows_that_are_not_one_hot(monkeypatch):
    from leangnn.nn import dag
    from leangnn.nn.dag import _type_groups

    onehot = torch.eye(4)[[2, 0, 2, 3, 0]]
    assert _type_groups(onehot) is None  # below GROUP_MIN_ROWS: dense
    monkeypatch.setattr(dag, "GROUP_MIN_ROWS", 1)
    order, sizes = _type_groups(onehot)
    assert sizes == [2, 0, 2, 1] and order.tolist() == [1, 4, 0, 2, 3]
    assert _type_groups(torch.cat([onehot, torch.zeros(1, 4)])) is None
    assert _type_groups(onehot * 0.5) is None
    assert _type_groups(onehot[:0]) is None


def test_max_plus_gradient_shares_ties():
    # node 2 = max(node 0, node 1) + d; equal arrivals split the gradient
    plan = level_plan(torch.tensor([[0, 1], [2, 2]]), 3, cache=False)
    d = torch.tensor([[1.0], [1.0], [2.0]], requires_grad=True)
    t = max_plus(d, plan.reverse)  # reverse: t_0 = t_2 + d_0, t_1 = t_2 + d_1
    t.sum().backward()
    assert d.grad.view(-1).tolist() == [1.0, 1.0, 3.0]
    d.grad = None
    t = max_plus(d, plan.forward)  # forward: t_2 = max(t_0, t_1) + d_2
    assert t.view(-1).tolist() == [1.0, 1.0, 3.0]
    t[2].sum().backward()
    assert d.grad.view(-1).tolist() == [0.5, 0.5, 1.0]


def _chains(n: int, k: int) -> torch.Tensor:
    """``k`` disjoint chains over ``n`` nodes (depth ``n / k - 1``)."""
    length = n // k
    src = [c * length + i for c in range(k) for i in range(length - 1)]
    return torch.tensor([src, [s + 1 for s in src]])


def test_saved_memory_does_not_grow_with_depth():
    n, c = 600, 16
    x = torch.randn(n, 15)
    model = DAGNN(15, c, 1, rounds=2, reverse=True)
    saved = {}
    for k in (1, 30):  # depth 599 vs 19, same nodes, almost the same edges
        with SavedTensorsMeter() as meter:
            out = model(x, _chains(n, k))
        saved[k] = meter.bytes
        out.sum().backward()
    assert saved[1] <= 1.02 * saved[30]
    # O(rounds x N x C): a few dozen floats per node and channel, not depth x
    assert saved[1] < 64 * n * c * 4


def test_batched_graphs_are_normalised_per_graph():
    torch.manual_seed(0)
    a = load_circuit("iscas85/c432", "arrival")
    b = load_circuit("epfl/ctrl", "arrival")
    model = DAGNN(a.num_features, 8, 1).eval()
    x = torch.cat([a.x, b.x])
    ei = torch.cat([a.edge_index, b.edge_index + a.num_nodes], 1)
    batch = torch.cat([torch.zeros(a.num_nodes, dtype=torch.long),
                       torch.ones(b.num_nodes, dtype=torch.long)])
    with torch.no_grad():
        joint = model(x, ei, batch=batch)
        apart = torch.cat([model(a.x, a.edge_index), model(b.x, b.edge_index)])
    torch.testing.assert_close(joint, apart, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="aggr"):
        DAGNN(15, 8, 1, aggr="min")
    with pytest.raises(ValueError, match="rounds"):
        DAGNN(15, 8, 1, rounds=0)
    with pytest.raises(ValueError, match="gate_types"):
        DAGNN(4, 8, 1, gate_types=12)
    assert DAGNN(4, 8, 1).gate_cols == []  # untyped when x has no gate one-hot
    with pytest.raises(ValueError, match="product_init"):
        DAGNN(15, 8, 1, gate_types=3, product_init="cop")
    assert "aggr=max" in repr(DAGNN(15, 8, 1))


@pytest.mark.parametrize("name", ["iscas85/c432", "iscas85/c6288", "epfl/router"])
def test_cop_input_starts_as_cop(name):
    from leangnn.circuits.cop import cop_parameters, cop_signal_probability

    data = load_circuit(name, "signal_prob")
    cop = torch.as_tensor(cop_signal_probability(read_netlist(resolve(name)[0].path)))
    model = DAGNN(data.num_features, 8, 1, task="signal_prob",
                  estimator="cop").double()
    assert model.cop_input  # the task's default: the hybrid
    with torch.no_grad():
        out = model(data.x.double(), data.edge_index).view(-1)
    torch.testing.assert_close(out, cop, rtol=0, atol=1e-12)
    # the COP channel stays exact while the other channels and the head learn
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    (model(data.x.double(), data.edge_index).view(-1) - data.y.double()).pow(
        2).mean().backward()
    opt.step()
    x = data.x.double()
    with torch.no_grad():
        used = torch.stack(model._params("fwd")[5:])  # (a, b, c, e) per type
        assert torch.equal(used[:, :, 0], torch.as_tensor(
            cop_parameters(), dtype=used.dtype))
        assert not torch.equal(model(x, data.edge_index).view(-1), out)
    # off switch: no COP channel, the output is not COP
    off = DAGNN(data.num_features, 8, 1, task="signal_prob", cop_input=False,
                product_channels=0).double()
    assert off.cop_start is None and "cop_start" not in off.state_dict()
    with torch.no_grad():
        assert (off(x, data.edge_index).view(-1) - cop).abs().max() > 0.05
    with pytest.raises(ValueError, match="cop_input"):
        DAGNN(data.num_features, 8, 1, cop_input=True, product_channels=0)


@pytest.mark.parametrize("name", ["iscas85/c880", "iscas85/c6288", "epfl/max"])
def test_quantile_head_starts_as_unit_delay_slack_classes(name):
    from leangnn.circuits.dataset import NUM_CRITICAL_CLASSES

    data = load_circuit(name, "critical")
    net = read_netlist(resolve(name)[0].path)
    unit = DelayModel(intrinsic=dict.fromkeys(DelayModel().intrinsic, 1.0),
                      fanout_coeff=0.0)
    t = static_timing(net, unit)
    slack = np.clip(t.slack / t.period, 0, None)
    cuts = np.quantile(slack, [0.25, 0.5, 0.75])
    want = np.minimum(np.searchsorted(cuts, slack, side="left"),
                      NUM_CRITICAL_CLASSES - 1)
    model = DAGNN(data.num_features, 8, 4, task="critical").double()
    assert model.quantile_head
    with torch.no_grad():
        got = model(data.x.double(), data.edge_index).argmax(1).numpy()
    assert np.mean(got == want) >= 0.995  # float ties at a cut may differ
    off = DAGNN(data.num_features, 8, 4, task="critical",
                quantile_head=False).double()
    with torch.no_grad():
        off_got = off(data.x.double(), data.edge_index).argmax(1).numpy()
    assert np.mean(off_got == want) < 0.9
    with pytest.raises(ValueError, match="quantile_head"):
        DAGNN(data.num_features, 8, 3, task="critical", quantile_head=True)


def test_task_default_starts_apply_where_they_fit():
    # e.g. the planner's probe builds every model with 8 outputs
    assert DAGNN(15, 8, 4, task="critical").quantile_head
    assert not DAGNN(15, 8, 8, task="critical").quantile_head
    assert DAGNN(15, 8, 1, task="signal_prob").cop_input
    assert not DAGNN(15, 8, 8, task="signal_prob").cop_input
    assert not DAGNN(15, 8, 1, task="arrival").cop_input
    with pytest.raises(ValueError, match="cop_input"):
        DAGNN(15, 8, 8, cop_input=True)


@pytest.mark.parametrize("name", ["iscas85/c6288", "epfl/router"])
def test_cut_input_starts_as_the_cut_estimate(name, monkeypatch):
    from leangnn.circuits import sigprob
    from leangnn.nn import dag
    from leangnn.nn.levels import EdgeIndexCache

    monkeypatch.setattr(dag, "_ESTIMATES", EdgeIndexCache())  # count from empty

    data = load_circuit(name, "signal_prob")
    want = torch.as_tensor(sigprob.cut_signal_probability(
        read_netlist(resolve(name)[0].path)))
    calls = []
    real = sigprob.cut_signal_probability_arrays
    monkeypatch.setattr(sigprob, "cut_signal_probability_arrays",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model = DAGNN(data.num_features, 8, 1, task="signal_prob").double()
    assert model.cop_input and model.estimator == "cut"  # the task's default
    x = data.x.double()
    with torch.no_grad():
        out = model(x, data.edge_index).view(-1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # training moves the output, not the estimate it reads; computed once
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    (model(x, data.edge_index).view(-1) - data.y.double()).pow(2).mean().backward()
    opt.step()
    with torch.no_grad():
        assert not torch.equal(model(x, data.edge_index).view(-1), out)
        plan = model._plan(x, data.edge_index, None, None)
        torch.testing.assert_close(
            model.cut_estimate(x, data.edge_index, plan).view(-1),
            want, rtol=0, atol=1e-12)
    assert len(calls) == 1
    # the output is the estimate plus correction_gain times the correction
    half = DAGNN(data.num_features, 8, 1, task="signal_prob",
                 correction_gain=0.5 * model.correction_gain).double()
    half.load_state_dict(model.state_dict())
    with torch.no_grad():
        full_out = model(x, data.edge_index).view(-1)
        half_out = half(x, data.edge_index).view(-1)
    torch.testing.assert_close(full_out - want, 2 * (half_out - want), rtol=1e-9,
                               atol=1e-12)
    with pytest.raises(ValueError, match="estimator"):
        DAGNN(data.num_features, 8, 1, estimator="exact")
    with pytest.raises(ValueError, match="correction_gain"):
        DAGNN(data.num_features, 8, 1, task="signal_prob", correction_gain=-1.0)


@pytest.mark.parametrize("learn", [True, False])
def test_hand_written_backward_with_a_fixed_estimate(learn, monkeypatch):
    from leangnn.nn import dag

    torch.manual_seed(0)
    x, ei = _random_dag(30, seed=3)
    model = DAGNN(15, 8, 1, task="signal_prob", learn_products=learn,
                  reverse=True).double()
    assert model.estimator == "cut"
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    grads = []
    for manual in (True, False):
        monkeypatch.setattr(dag._GRUCell, "manual_backward", manual)
        model.zero_grad()
        (model(x, ei) ** 2).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()
                      if p.requires_grad])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_edge_index_cache_stamps_evicts_and_forgets_dead_tensors():
    from leangnn.nn.levels import EdgeIndexCache

    cache = EdgeIndexCache(size=2)
    a, b, c = (torch.zeros(2, i + 1, dtype=torch.long) for i in range(3))
    cache.put(a, 1, "plan a")
    assert cache.get(a, 1) == "plan a" and cache.get(a, 2) is None
    assert cache.get(b, 1) is None  # another tensor
    cache.put(b, 1, "plan b")
    cache.put(c, 1, "plan c")  # over size: the least recently used (a) goes
    assert len(cache) == 2 and cache.get(a, 1) is None
    del b  # its entry dies with it (reference counting, no collector)
    assert len(cache) == 1 and cache.get(c, 1) == "plan c"


def test_edgeless_circuit_gives_sane_outputs():
    # No gate has a fanin, so no timing channel is delayed anywhere: those
    # channels must be zero, not the inputs' delays divided by the 1e-6 floor
    # (outputs of -1e5 before). A circuit with timing is unchanged.
    torch.manual_seed(0)
    c17 = load_circuit("iscas85/c17", "arrival")
    model = DAGNN(c17.num_features, 8, 1, reverse=True).double().eval()
    x = c17.x.double()
    with torch.no_grad():
        arrival, _, _ = model.timing(x, c17.edge_index)
        assert (arrival.max(0).values > 1e-6).all()  # every channel is live here
        ref = model(x, c17.edge_index)
        lone = x[:5]  # five primary inputs, no edges
        out = model(lone, torch.zeros(2, 0, dtype=torch.long))
    assert torch.isfinite(out).all() and out.abs().max() < 10
    torch.testing.assert_close(model(x, c17.edge_index).detach(), ref,
                               rtol=0, atol=0)
