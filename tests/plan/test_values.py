"""The dry run's value memo: each op on real tensors computed once per trace,
with the trace unchanged (against the same trace without the memo)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_geometric.nn.models import GAT, GCN

from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan import dryrun
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import default_loss
from leangnn.plan.values import ValueMemo

aten = torch.ops.aten


@pytest.fixture(scope="module")
def graph():
    g = contextual_sbm(1200, avg_degree=8.0, in_channels=12, seed=3)
    return with_mask(g, g.train_mask)


def _given(t):
    return True


def _traces(model, data, step=None, backend="meta"):
    loss_fn = default_loss(data)
    on = trace_step(model, data, loss_fn, step, backend=backend)
    off = trace_step(model, data, loss_fn, step, backend=backend, memo=False)
    return on, off


@pytest.mark.parametrize("backend", ["meta", "fake"])
@pytest.mark.parametrize("make", [
    lambda c: GCN(c, 16, 3, out_channels=4),
    lambda c: GAT(c, 8, 2, out_channels=4, heads=2),
    lambda c: build_model("res", c, 16, 4, 4, conv="gcn"),
], ids=["gcn3", "gat2", "res4-gcn"])
def test_trace_with_the_memo_equals_the_trace_without(graph, make, backend):
    torch.manual_seed(0)
    on, off = _traces(make(graph.num_features), graph, backend=backend)
    assert dataclasses.asdict(on) == dataclasses.asdict(off)
    assert on.peak_bytes > 0 and on.ops > 0


def test_the_memo_answers_a_repeated_layer(graph, monkeypatch):
    # GCN-3 repeats gcn_norm's ops on the real edge list in every layer
    memos = []
    init = ValueMemo.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        memos.append(self)

    monkeypatch.setattr(ValueMemo, "__init__", spy)
    hits = {}
    get = ValueMemo.get

    def counted(self, key):
        out = get(self, key)
        if out is not None:
            hits[key[0]] = hits.get(key[0], 0) + 1
        return out

    monkeypatch.setattr(ValueMemo, "get", counted)
    torch.manual_seed(0)
    trace_step(GCN(graph.num_features, 16, 3, out_channels=4), graph,
               default_loss(graph), backend="meta")
    assert len(memos) == 1 and not memos[0].conflict
    # self-loops (cat) and the boolean mask's selection, once per later layer
    assert hits.get(aten.cat.default) == 2
    assert hits.get(aten.index.Tensor, 0) >= 2


def test_a_repeat_is_a_new_storage_with_the_first_values():
    memo = ValueMemo(min_numel=0)
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 2]])
    k1 = memo.key(aten.add.Tensor, (ei, ei), {}, _given)
    out = aten.add.Tensor(ei, ei)
    memo.put(k1, aten.add.Tensor, out, [ei], lambda t: False)
    k2 = memo.key(aten.add.Tensor, (ei, ei), {}, _given)
    assert k2 == k1
    rep = memo.get(k2)
    assert torch.equal(rep, out) and rep.stride() == out.stride()
    assert rep.untyped_storage()._cdata != out.untyped_storage()._cdata
    assert rep.untyped_storage().nbytes() == out.untyped_storage().nbytes()
    # the repeat is named as the first output: an op on it is the same op
    assert memo.key(aten.mul.Tensor, (rep, 2), {}, _given) == \
        memo.key(aten.mul.Tensor, (out, 2), {}, _given)
    assert memo.hits == 1


def test_keys_follow_values_not_objects():
    memo = ValueMemo(min_numel=0)
    a = torch.arange(6)
    k = memo.key(aten.mul.Tensor, (a, 2), {}, _given)
    assert memo.key(aten.mul.Tensor, (a, 2.0), {}, _given) != k  # int vs float
    assert memo.key(aten.mul.Tensor, (a, 0.0), {}, _given) != \
        memo.key(aten.mul.Tensor, (a, -0.0), {}, _given)
    a.add_(1)  # a write moves the version: another value
    assert memo.key(aten.mul.Tensor, (a, 2), {}, _given) != k
    # random ops have no key; neither does a tensor the trace made and counts
    assert memo.key(aten.bernoulli.default, (a.float(),), {}, _given) is None
    assert memo.key(aten.mul.Tensor, (a, 2), {}, lambda t: False) is None
    # operands all smaller than min_numel: not worth the bookkeeping
    small = ValueMemo(min_numel=7)
    assert small.key(aten.mul.Tensor, (a, 2), {}, _given, [a]) is None
    big = torch.arange(7)
    assert small.key(aten.mul.Tensor, (big, 2), {}, _given, [big]) is not None
    assert small.key(aten.arange.default, (7,), {}, _given, []) is not None
    # ... but a small output of a named op is named (self-loops of a small
    # graph: arange, view, repeat)
    r = aten.arange.default(5)
    small.put(small.key(aten.arange.default, (5,), {}, _given, []),
              aten.arange.default, r, [], lambda t: False)
    assert small.key(aten.view.default, (r, [1, 5]), {}, _given, [r]) is not None


def test_a_write_to_a_kept_output_keeps_its_first_values():
    memo = ValueMemo(min_numel=0)
    x = torch.arange(5)
    key = memo.key(aten.new_zeros.default, (x, [5]), {}, _given)
    z = aten.new_zeros.default(x, [5])
    memo.put(key, aten.new_zeros.default, z, [x], lambda t: False)
    memo.writing(aten.add_.Tensor, (z, x), {})  # before the write
    z.add_(x)
    rep = memo.get(key)
    assert torch.equal(rep, torch.zeros(5, dtype=x.dtype)) and not memo.conflict
    memo.writing(aten.add_.Tensor, (rep, x), {})  # a private copy: no conflict
    assert not memo.conflict


def test_a_write_to_memory_shared_with_a_repeat_is_a_conflict():
    memo = ValueMemo(min_numel=0)
    x = torch.arange(5)
    key = memo.key(aten.mul.Tensor, (x, 3), {}, _given)
    y = aten.mul.Tensor(x, 3)
    memo.put(key, aten.mul.Tensor, y, [x], lambda t: False)
    rep = memo.get(key)
    memo.writing(aten.add_.Tensor, (rep, x), {})
    assert memo.conflict


def test_a_conflicting_model_is_traced_again_without_the_memo(graph, monkeypatch):
    # the second layer writes in place into a repeat of the first layer's
    # output, the first did not: the memo's shared memory would be written
    calls = []
    trace = dryrun._trace

    def spy(*a):
        calls.append(a[-1])
        return trace(*a)

    monkeypatch.setattr(dryrun, "_trace", spy)

    class Odd(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.lin = torch.nn.Linear(c, 4)

        def forward(self, x, edge_index):
            first = edge_index[0] * 1
            second = edge_index[0] * 1
            second.add_(1)
            return self.lin(x)[(first + second) % x.size(0)]

    torch.manual_seed(0)
    loss_fn = default_loss(graph)
    on = trace_step(Odd(graph.num_features), graph, loss_fn, backend="meta")
    assert calls == [True, False]
    calls.clear()
    off = trace_step(Odd(graph.num_features), graph, loss_fn, backend="meta",
                     memo=False)
    assert calls == [False]
    assert dataclasses.asdict(on) == dataclasses.asdict(off)


def test_an_in_place_view_unnames_its_operand(graph):
    # ``t_`` changes a named output's layout, not its values: the name (the
    # values in the old layout) must not answer for it any more
    memo = ValueMemo(min_numel=0)
    x = torch.arange(6).view(2, 3)
    key = memo.key(aten.mul.Tensor, (x, 2), {}, _given)
    y = aten.mul.Tensor(x, 2)
    memo.put(key, aten.mul.Tensor, y, [x], lambda t: False)
    assert memo.key(aten.sum.dim_IntList, (y, [0]), {}, lambda t: False)
    memo.wrote(None, aten.t_.default, (y,), {})
    y.t_()
    assert memo.key(aten.sum.dim_IntList, (y, [0]), {}, lambda t: False) is None

    class Transposed(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.lin = torch.nn.Linear(c, 4)

        def forward(self, x, edge_index):
            a = edge_index * 1
            b = edge_index * 1  # a repeat of a
            b.t_()
            n = x.size(0)
            w = a.sum(0)[:n].float() + b.sum(0).float().sum()
            return self.lin(x) * w.unsqueeze(1)

    torch.manual_seed(0)
    on, off = _traces(Transposed(graph.num_features), graph)
    assert dataclasses.asdict(on) == dataclasses.asdict(off)


def test_the_kept_bytes_are_capped():
    memo = ValueMemo(max_bytes=64, min_numel=0)
    x = torch.arange(100)
    key = memo.key(aten.mul.Tensor, (x, 3), {}, _given)
    memo.put(key, aten.mul.Tensor, aten.mul.Tensor(x, 3), [x], lambda t: False)
    assert memo.get(key) is None and memo.bytes == 0
