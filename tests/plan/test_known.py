"""The dry run's memo of real ops on the graph (leangnn.plan.known)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_geometric.nn.models import GCN

from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import default_loss
from leangnn.plan.known import KnownMemo, known_memo

aten = torch.ops.aten


@pytest.fixture(scope="module")
def graph():
    g = contextual_sbm(1200, avg_degree=8.0, in_channels=12, seed=3)
    return with_mask(g, g.train_mask)


def _models(data):
    torch.manual_seed(0)
    f = data.num_features
    return {
        # PyG's GCN: the normalisation (self-loops, degrees, in-place pow_ and
        # masked_fill_) once per layer
        "gcn": GCN(f, 32, 3, out_channels=8),
        # GSR's CSR kernels: the graph sorted in the forward and again in the
        # backward
        "gsr-sage": build_model("gsr", f, 32, 8, 4, conv="sage", num_groups=2),
        "gsr-gat": build_model("gsr", f, 32, 8, 2, conv="gat", num_groups=2),
    }


@pytest.mark.parametrize("backend", ["meta", "fake"])
@pytest.mark.parametrize("name", ["gcn", "gsr-sage", "gsr-gat"])
def test_trace_is_the_same_with_the_memo_on_or_off(graph, name, backend):
    model = _models(graph)[name]
    loss_fn = default_loss(graph)
    off = trace_step(model, graph, loss_fn, backend=backend, reuse_known=False)
    with known_memo() as memo:
        on = trace_step(model, graph, loss_fn, backend=backend)
        assert memo.hits > 0  # the repeats were answered
        hits, stored = memo.hits, memo.bytes
        again = trace_step(model, graph, loss_fn, backend=backend)
        # a second plan of the same model stores nothing graph-sized (only
        # what starts from fresh constants: Adam's one-element step counts)
        assert memo.bytes - stored < 4096 < stored and memo.hits >= 2 * hits
    assert dataclasses.asdict(on) == dataclasses.asdict(off)
    assert dataclasses.asdict(again) == dataclasses.asdict(off)


def test_a_repeat_is_a_fresh_copy_with_the_op_s_strides():
    memo = KnownMemo()
    xt = torch.arange(12).reshape(3, 4).t()  # clone keeps its strides
    first = memo.call(aten.clone.default, (xt,), {})
    second = memo.call(aten.clone.default, (xt,), {})
    assert (memo.hits, memo.misses) == (1, 1)
    assert second.stride() == first.stride() == xt.stride() == (1, 4)
    assert torch.equal(second, xt)
    assert second.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
    second.zero_()  # a caller's in-place change does not reach the memo
    assert torch.equal(memo.call(aten.clone.default, (xt,), {}), xt)


def test_a_changed_or_new_operand_is_computed_again():
    memo = KnownMemo()
    x = torch.arange(6)
    assert torch.equal(memo.call(aten.mul.Tensor, (x, x), {}), x * x)
    x.add_(1)  # a new version: the stored product is stale
    assert torch.equal(memo.call(aten.mul.Tensor, (x, x), {}), x * x)
    y = x.clone()  # equal values, another tensor: computed, not assumed
    assert torch.equal(memo.call(aten.mul.Tensor, (y, y), {}), y * y)
    assert memo.hits == 0 and memo.misses == 3


def test_scalars_are_told_apart_by_type_and_sign():
    memo = KnownMemo()
    x = torch.tensor([1.0, -2.0])
    a = memo.call(aten.mul.Scalar, (x, 0.0), {})
    b = memo.call(aten.mul.Scalar, (x, -0.0), {})
    assert torch.equal(torch.signbit(a), torch.signbit(x * 0.0))
    assert torch.equal(torch.signbit(b), torch.signbit(x * -0.0))
    i = torch.tensor([3])
    assert memo.call(aten.add.Tensor, (i, True), {}).dtype == \
        (i + True).dtype
    assert memo.call(aten.add.Tensor, (i, 1.0), {}).dtype == torch.float32
    assert memo.hits == 0


def test_random_ops_and_over_budget_results_are_never_stored():
    memo = KnownMemo(max_bytes=64)
    p = torch.full((1000,), 0.5)
    a = memo.call(aten.bernoulli.default, (p,), {})
    b = memo.call(aten.bernoulli.default, (p,), {})
    assert not torch.equal(a, b)  # two draws
    big = torch.arange(100)
    for _ in range(2):
        assert torch.equal(memo.call(aten.mul.Tensor, (big, big), {}), big * big)
    assert memo.hits == 0 and memo.bytes == 0 and "hits=0" in repr(memo)


def test_known_memo_blocks_nest_into_one():
    with known_memo() as outer, known_memo() as inner:
        assert inner is outer
    with known_memo() as later:
        assert later is not outer
