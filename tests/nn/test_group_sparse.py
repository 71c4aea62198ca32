"""GroupSparseAct against a dense torch.topk reference, and its compact backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from leangnn.nn.group_sparse import (
    GroupSparseAct,
    group_sparse_act,
    pack_bits,
    resolve_k,
    unpack_bits,
    unpacked_masks,
)
from leangnn.profile import SavedTensorsMeter


def dense_reference(x, k, group_size, keep=None, scale=1.0):
    """Plain-autograd reference: top-k per group by torch.topk, then ReLU."""
    n, c = x.shape
    xv = x.reshape(n, c // group_size, group_size)
    idx = xv.topk(k, dim=-1).indices
    sel = torch.zeros_like(xv, dtype=torch.bool).scatter_(-1, idx, True)
    out = F.relu(x) * sel.view(n, c).to(x.dtype)
    if keep is not None:
        out = out * keep.to(x.dtype) * scale
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("group_size,k", [(4, 1), (4, 3), (6, 2), (8, 5), (16, 1),
                                         (16, 4), (16, 8), (16, 15), (32, 7),
                                         (64, 16), (128, 9)])
def test_matches_topk_reference(group_size, k, dtype):
    gen = torch.Generator().manual_seed(group_size * 100 + k)
    x = torch.randn(300, 2 * group_size, generator=gen, dtype=dtype)
    gout = torch.randn(x.shape, generator=gen, dtype=dtype)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    out = group_sparse_act(xa, k, group_size)
    ref = dense_reference(xb, k, group_size)
    assert torch.equal(out, ref)
    out.backward(gout)
    ref.backward(gout)
    assert torch.equal(xa.grad, xb.grad)
    # Exactly k winners per group wherever the group has >= k positive entries.
    nz = (out != 0).view(300, 2, group_size).sum(-1)
    pos = (x > 0).view(300, 2, group_size).sum(-1)
    assert torch.equal(nz, pos.clamp(max=k))


@pytest.mark.parametrize("k", [None, 8])
def test_relu_mode(k):
    x = torch.randn(100, 16, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    act = GroupSparseAct(k, 8)
    out = act(x)
    ref = F.relu(y)
    assert torch.equal(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    assert torch.equal(x.grad, y.grad)


def test_fused_dropout_matches_reference():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 32, generator=gen, dtype=torch.float64)
    keep = torch.rand(x.shape, generator=gen) > 0.3
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = group_sparse_act(xa, 3, 8, keep=keep, scale=1 / 0.7)
    ref = dense_reference(xb, 3, 8, keep=keep, scale=1 / 0.7)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-15)
    g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=0, atol=1e-15)


def test_compact_backward_saves_bits_not_the_input():
    x = torch.randn(4096, 64)
    dense_bytes = x.numel() * x.element_size()
    results = {}
    for compact in (True, False):
        xi = x.clone().requires_grad_()
        with SavedTensorsMeter() as meter:
            out = GroupSparseAct(4, 16, compact=compact)(xi)
        out.backward(torch.ones_like(out))
        results[compact] = (meter.bytes, xi.grad)
    compact_bytes, dense_saved = results[True][0], results[False][0]
    assert compact_bytes <= x.numel() // 8 + 64  # one bit per entry
    assert dense_saved >= dense_bytes  # the off switch keeps the dense input
    assert compact_bytes * 30 < dense_saved
    assert torch.equal(results[True][1], results[False][1])  # same gradients
    # A naive autograd top-k also keeps the dense input (plus int64 indices).
    xi = x.clone().requires_grad_()
    with SavedTensorsMeter() as meter:
        dense_reference(xi, 4, 16)
    assert meter.bytes >= dense_bytes


def test_unpacked_masks_same_gradient_mask_kept_whole():
    """Inside ``unpacked_masks`` the selection is kept unpacked (what a
    reversible backward's short-lived graph uses) and the gradient is the
    same as the packed one's and the dense reference's."""
    torch.manual_seed(0)
    x = torch.randn(1000, 32)
    keep = torch.rand(1000, 32) > 0.3
    grads, saved = {}, {}
    for unpacked in (False, True):
        xi = x.clone().requires_grad_()
        with SavedTensorsMeter() as meter:
            if unpacked:
                with unpacked_masks():
                    out = group_sparse_act(xi, 5, 16, keep, 2.0)
            else:
                out = group_sparse_act(xi, 5, 16, keep, 2.0)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).view_as(out))
        grads[unpacked], saved[unpacked] = xi.grad, meter.bytes
    assert saved[False] <= x.numel() // 8 + 64
    assert saved[True] >= x.numel()  # one whole entry per value
    assert torch.equal(grads[True], grads[False])
    xr = x.clone().requires_grad_()
    ref = dense_reference(xr, 5, 16, keep, 2.0)
    ref.backward(torch.arange(ref.numel(), dtype=ref.dtype).view_as(ref))
    torch.testing.assert_close(grads[True], xr.grad, rtol=0, atol=0)
    # the setting ends with the block
    xi = x.clone().requires_grad_()
    with SavedTensorsMeter() as meter:
        group_sparse_act(xi, 5, 16, keep, 2.0)
    assert meter.bytes == saved[False]


def test_no_grad_path_matches():
    x = torch.randn(64, 16)
    with torch.no_grad():
        a = group_sparse_act(x, 5, 16)
    b = group_sparse_act(x.clone().requires_grad_(), 5, 16).detach()
    assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (3, 5), (13, 17, 3)])
def test_pack_roundtrip(shape):
    mask = torch.rand(shape) > 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8
    assert packed.numel() == (mask.numel() + 7) // 8
    assert torch.equal(unpack_bits(packed, mask.shape), mask)


def test_resolve_k():
    assert resolve_k(None, 16) is None
    assert resolve_k(4, 16) == 4
    assert resolve_k(16, 16) is None  # k = group size is ReLU
    assert resolve_k(0.25, 16) == 4
    assert resolve_k(1.0, 16) is None
    for bad in (0, 17, -1, 0.0, 1.5, "4", True):
        with pytest.raises(ValueError, match="sparsity"):
            resolve_k(bad, 16)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="group_size=5"):
        group_sparse_act(torch.randn(4, 16), 2, 5)
    with pytest.raises(ValueError, match="keep mask shape"):
        group_sparse_act(torch.randn(4, 16), 2, 8, keep=torch.ones(4, 8, dtype=bool))
    with pytest.raises(ValueError, match="k must be"):
        GroupSparseAct(0, 8)
    with pytest.raises(ValueError, match="exceeds group_size"):
        GroupSparseAct(9, 8)
    assert "k=3" in repr(GroupSparseAct(3, 8))
