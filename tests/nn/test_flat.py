"""FlatParameters: one flat tensor behind many modules' parameters."""

from __future__ import annotations

import pytest
import torch

from leangnn.nn import FlatParameters


def _mlps(seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4),
                            torch.nn.Linear(4, 2, bias=False))
        for _ in range(3)).double()


def _loss(mods, x):
    return sum(m(x).square().sum() for m in mods)


def test_autograd_binding_gives_the_same_gradients_as_separate_parameters():
    x = torch.randn(5, 3, dtype=torch.float64)
    ref = _mlps()
    _loss(ref, x).backward()
    mods = _mlps()
    layout = FlatParameters(mods)
    flat = torch.nn.Parameter(layout.gather())
    layout.bind(flat, autograd=True)
    assert list(mods.parameters()) == []  # the modules hold views now
    _loss(mods, x).backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    got = layout.named(flat.grad)
    assert got.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(got[name], g, rtol=0, atol=0)


def test_leaf_binding_shares_storage_and_follows_in_place_updates():
    mods = _mlps()
    before = [p.detach().clone() for p in mods.parameters()]
    layout = FlatParameters(mods)
    flat = torch.nn.Parameter(layout.gather())
    layout.bind(flat)
    tensors = [t for i in range(3) for t in layout.tensors(i)]
    assert all(t.is_leaf and t.requires_grad for t in tensors)
    for t, b in zip(tensors, before):  # same values, same order
        torch.testing.assert_close(t, b, rtol=0, atol=0)
    with torch.no_grad():
        flat.mul_(2)
    for t, b in zip(tensors, before):
        torch.testing.assert_close(t, 2 * b, rtol=0, atol=0)
    g = torch.arange(flat.numel(), dtype=flat.dtype)
    views = [v for i in range(3) for v in layout.views(g, i)]
    assert torch.equal(torch.cat([v.reshape(-1) for v in views]), g)


def test_bad_input_is_named():
    mods = _mlps()
    mods[1][0].weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"1\.0\.weight"):
        FlatParameters(mods)
    layout = FlatParameters(_mlps())
    with pytest.raises(ValueError, match="elements"):
        layout.bind(torch.zeros(3))
    with pytest.raises(ValueError, match="no parameters"):
        FlatParameters([torch.nn.ReLU()]).gather()


def test_attach_puts_stand_ins_under_one_modules_names_and_back():
    """What the GSR backward differentiates a block through: detached
    stand-ins of one module's views, the gradients of separate parameters,
    and the module's own views back afterwards."""
    x = torch.randn(5, 3, dtype=torch.float64)
    ref = _mlps()
    _loss(ref[1:2], x).backward()
    mods = _mlps()
    layout = FlatParameters(mods)
    flat = torch.nn.Parameter(layout.gather())
    layout.bind(flat)
    own = layout.tensors(1)
    stand = [t.detach().requires_grad_() for t in own]
    layout.attach(1, stand)
    assert all(a is b for a, b in zip(layout.tensors(1), stand))
    grads = torch.autograd.grad(_loss(mods[1:2], x), stand)
    for g, p in zip(grads, ref[1].parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=0)
    layout.attach(1, own)
    assert all(a is b for a, b in zip(layout.tensors(1), own))
    assert own[0].data_ptr() == stand[0].data_ptr()  # the same storage
    with pytest.raises(ValueError):
        layout.attach(1, own[:-1])  # one per parameter, in layout order
