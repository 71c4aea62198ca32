"""Group-wise sparse activation: keep the ``k`` largest channels of every group.

The nonlinearity of GSR-GNN (Luo et al., "GSR-GNN: Training Acceleration and
Memory-Saving Framework of Deep GNNs on Circuit Graph", DAC 2026): channels
are split into contiguous groups and, per node, only the ``k`` largest positive
activations of each group survive (k-winners-take-all inside a group). With
``k`` equal to the group size it is exactly ReLU.

Its backward needs only *which* entries survived, so it keeps that selection
as a bit-packed mask (1 bit per entry, 1/32 of a float32 input) instead of the
dense input; an optional dropout keep-mask is fused into the same bits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import cache

import torch
from torch import Tensor

__all__ = ["GroupSparseAct", "group_sparse_act", "resolve_k", "pack_bits",
           "unpack_bits", "unpacked_masks"]


def resolve_k(sparsity: int | float | None, group_size: int) -> int | None:
    """Winners per group from a ``sparsity`` setting (``None``: plain ReLU).

    An ``int`` is the number of winners ``k`` (``1 <= k <= group_size``); a
    ``float`` in ``(0, 1]`` is the kept fraction of each group.
    """
    if sparsity is None:
        return None
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)):
        raise ValueError(f"sparsity must be an int, a float or None, got {sparsity!r}")
    if isinstance(sparsity, float):
        if not 0.0 < sparsity <= 1.0:
            raise ValueError(
                f"sparsity as a fraction must be in (0, 1], got {sparsity!r}")
        sparsity = max(1, round(sparsity * group_size))
    if not 1 <= sparsity <= group_size:
        raise ValueError(f"sparsity (winners per group) must be in [1, {group_size}] "
                         f"for groups of {group_size} channels, got {sparsity!r}")
    return None if sparsity == group_size else int(sparsity)


# -- bit packing ---------------------------------------------------------------

def _shifts(device: torch.device) -> Tensor:
    # made per call (8 bytes), not cached per device: a module-level cache
    # filled by an earlier real call made the planner's dry runs differ by
    # whether it had been (fake tensors report the real device, meta ones not)
    return torch.arange(8, dtype=torch.uint8, device=device).view(8, 1)


def pack_bits(mask: Tensor) -> Tensor:
    """Pack a bool (or 0/1) tensor into ``ceil(numel / 8)`` bytes.

    Bit ``j`` of byte ``i`` holds flat entry ``j * B + i`` (``B`` bytes): eight
    contiguous planes, so packing and unpacking are a handful of wide ops
    rather than a reduction over tiny rows (~10x faster on CPU, measured).
    """
    flat = mask.reshape(-1)
    flat = flat.view(torch.uint8) if flat.dtype == torch.bool else \
        flat.to(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    planes = flat.view(8, -1)
    return (planes << _shifts(mask.device)).sum(0, dtype=torch.uint8)


def _unpack_u8(packed: Tensor, shape: torch.Size) -> Tensor:
    bits = (packed.view(1, -1) >> _shifts(packed.device)) & 1
    return bits.view(-1)[: shape.numel()].view(shape)


def unpack_bits(packed: Tensor, shape: torch.Size) -> Tensor:
    """Inverse of :func:`pack_bits`: the bool tensor of ``shape``."""
    return _unpack_u8(packed, shape).view(torch.bool)


# -- k-th largest of small groups ------------------------------------------------

@cache
def _selection_network(n: int, target: int) -> tuple[tuple[int, int, bool, bool], ...]:
    """Comparators of Batcher's odd-even merge sort on ``n`` (a power of two)
    wires, pruned to those that the ascending output ``target`` depends on.

    Each entry is ``(a, b, need_min, need_max)``: after it, wire ``a`` holds
    the minimum and wire ``b`` the maximum (only the needed ones are computed).
    """
    layers, p = [], 1
    while p < n:
        k = p
        while k >= 1:
            layers.append([(i + j, i + j + k)
                           for j in range(k % p, n - k, 2 * k)
                           for i in range(min(k, n - j - k))
                           if (i + j) // (2 * p) == (i + j + k) // (2 * p)])
            k //= 2
        p *= 2
    need, ops = {target}, []
    for layer in reversed(layers):
        for a, b in layer:
            lo, hi = a in need, b in need
            if lo or hi:
                ops.append((a, b, lo, hi))
                need |= {a, b}
    return tuple(reversed(ops))


def _kth_largest(x: Tensor, k: int) -> Tensor:
    """The ``k``-th largest value along the last dim of ``x [M, g]`` -> ``[M, 1]``.

    ``torch.topk`` on many tiny rows is slow on CPU (one partial sort per row);
    a pruned sorting network over the ``g`` columns, each a contiguous vector
    of ``M`` values, costs a few dozen elementwise min/max ops and is ~5x
    faster for ``g = 16`` (measured). CUDA keeps ``topk``.
    """
    g = x.size(-1)
    if x.is_cuda or g > 64:
        return x.topk(k, dim=-1, sorted=True).values[..., k - 1:k]
    n = 1 << (g - 1).bit_length()
    # Strided column views: only the first comparator layer reads them, so a
    # transposed copy of x would cost more than it saves.
    rows = list(x.unbind(1))
    if n > g:  # pad with -inf wires, which sort below every real value
        rows += [rows[0].new_full(rows[0].shape, float("-inf"))] * (n - g)
    target = n - k  # ascending position of the k-th largest
    for a, b, need_min, need_max in _selection_network(n, target):
        ra, rb = rows[a], rows[b]
        if need_min:
            rows[a] = torch.minimum(ra, rb)
        if need_max:
            rows[b] = torch.maximum(ra, rb)
    return rows[target].unsqueeze(-1)


def _winners(x: Tensor, k: int | None, group_size: int) -> Tensor:
    """The surviving entries of ``x [..., C]`` as a 0/1 tensor of ``x``'s dtype.

    Comparisons written into a float tensor are ~5x faster on CPU than into
    a bool one, and multiplying by a float mask avoids a conversion
    (measured), hence the numeric mask.
    """
    mask = torch.empty_like(x, memory_format=torch.contiguous_format)
    if k is None:
        return torch.gt(x, 0, out=mask)
    xv = x.reshape(-1, group_size)
    # Raising the threshold to the smallest positive float folds the ReLU
    # (x > 0) into the same comparison. Ties at the k-th value all survive;
    # for real-valued inputs they have probability zero and the selection is
    # the exact top-k.
    thr = _kth_largest(xv, k).clamp_min_(_min_positive(x.dtype, x.device))
    torch.ge(xv, thr, out=mask.view(-1, group_size))
    return mask


@cache
def _min_positive(dtype: torch.dtype, device: torch.device) -> float:
    zero = torch.zeros((), dtype=dtype, device=device)
    return float(torch.nextafter(zero, torch.ones_like(zero)))


def _apply(x: Tensor, k: int | None, group_size: int, keep: Tensor | None,
           scale: float, need_mask: bool) -> tuple[Tensor, Tensor | None]:
    """``(output, 0/1 mask of the surviving entries or None)``."""
    if k is None and keep is None and not need_mask:
        out = torch.relu(x)
        return (out.mul_(scale) if scale != 1.0 else out), None
    mask = _winners(x, k, group_size)
    if keep is not None:
        mask.mul_(keep.view(torch.uint8))
    out = x * mask
    if scale != 1.0:
        out.mul_(scale)
    return out, mask


_STATE = threading.local()  # .unpacked: see unpacked_masks()


@contextlib.contextmanager
def unpacked_masks() -> Iterator[None]:
    """Within the block, compact activations keep their 0/1 selection mask
    as it is instead of bit-packing it.

    For a graph that is differentiated at once and then freed (the one group
    function a reversible backward recomputes), the packing saves nothing
    and its pack and unpack are ~10% of the activation's cost (measured);
    the gradient is the same.
    """
    old = getattr(_STATE, "unpacked", False)
    _STATE.unpacked = True
    try:
        yield
    finally:
        _STATE.unpacked = old


class _GroupSparseFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k, group_size, keep, scale, compact):
        out, mask = _apply(x, k, group_size, keep, scale, need_mask=compact)
        ctx.scale, ctx.compact, ctx.shape = scale, compact, x.shape
        ctx.k, ctx.group_size = k, group_size
        ctx.packed = compact and not getattr(_STATE, "unpacked", False)
        if compact:
            ctx.save_for_backward(pack_bits(mask) if ctx.packed else mask)
        else:  # reference path: keep the dense input, recompute the selection
            ctx.save_for_backward(x, keep)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.compact:
            (mask,) = ctx.saved_tensors
            if ctx.packed:
                mask = _unpack_u8(mask, ctx.shape)
        else:
            x, keep = ctx.saved_tensors
            mask = _winners(x, ctx.k, ctx.group_size)
            if keep is not None:
                mask.mul_(keep.view(torch.uint8))
        grad_in = grad * mask
        if ctx.scale != 1.0:
            grad_in.mul_(ctx.scale)
        return grad_in, None, None, None, None, None


def group_sparse_act(x: Tensor, k: int | None, group_size: int | None = None,
                     keep: Tensor | None = None, scale: float = 1.0,
                     compact: bool = True) -> Tensor:
    """Functional form of :class:`GroupSparseAct` (see there for arguments)."""
    group_size = x.size(-1) if group_size is None else group_size
    if x.size(-1) % group_size:
        raise ValueError(f"group_size={group_size} must divide the channel "
                         f"dimension {x.size(-1)}")
    if keep is not None and keep.shape != x.shape:
        raise ValueError(f"keep mask shape {tuple(keep.shape)} must match input "
                         f"shape {tuple(x.shape)}")
    if k is not None and k >= group_size:
        k = None
    if not (torch.is_grad_enabled() and x.requires_grad):
        return _apply(x, k, group_size, keep, float(scale), need_mask=False)[0]
    if k is None and keep is None and scale == 1.0:
        # Plain ReLU: torch's backward keeps the output, which the next layer
        # saves anyway, so a separate compact mask would only add bytes.
        return torch.relu(x)
    return _GroupSparseFn.apply(x, k, group_size, keep, float(scale), compact)


class GroupSparseAct(torch.nn.Module):
    r"""Group-wise sparse activation (k-winners per channel group), GSR-GNN.

    From "GSR-GNN: Training Acceleration and Memory-Saving Framework of Deep
    GNNs on Circuit Graph" (Luo et al., DAC 2026). The last dimension is split
    into contiguous groups of ``group_size`` channels; per row, each group
    keeps its ``k`` largest entries if they are positive and zeroes the rest:

    .. math::
        y_{n,j} = x_{n,j}\,[x_{n,j} > 0]\,[x_{n,j} \ge
        \mathrm{kth}_k(x_{n,\mathrm{grp}(j)})]

    ``k = None`` (or ``k >= group_size``) is plain ReLU. An optional boolean
    ``keep`` mask and ``scale`` fuse (shared) dropout into the same op.

    Args:
        k (int, optional): winners per group; ``None`` means ReLU.
            (default: ``None``)
        group_size (int, optional): channels per group; ``None`` means the
            whole last dimension is one group. (default: ``None``)
        compact (bool, optional): save only the bit-packed selection for
            backward (``C / 8`` bytes per row). ``False`` is the off switch: the
            dense input is saved and the selection recomputed in backward.
            Plain ReLU without dropout is ``torch.relu`` either way (its saved
            output is the tensor the next layer keeps anyway).
            (default: ``True``)

    Shapes:
        **input:** ``x [*, C]`` with ``C`` divisible by ``group_size``;
        ``keep [*, C]`` bool (optional)
        **output:** ``[*, C]``
    """

    def __init__(self, k: int | None = None, group_size: int | None = None,
                 compact: bool = True):
        super().__init__()
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive int or None, got {k!r}")
        if group_size is not None and (not isinstance(group_size, int)
                                       or group_size < 1):
            raise ValueError(f"group_size must be a positive int or None, "
                             f"got {group_size!r}")
        if k is not None and group_size is not None and k > group_size:
            raise ValueError(f"k={k} exceeds group_size={group_size}")
        self.k, self.group_size, self.compact = k, group_size, compact

    def forward(self, x: Tensor, keep: Tensor | None = None,
                scale: float = 1.0) -> Tensor:
        return group_sparse_act(x, self.k, self.group_size, keep, scale,
                                self.compact)

    def extra_repr(self) -> str:
        k = "relu" if self.k is None else self.k
        return f"k={k}, group_size={self.group_size}, compact={self.compact}"
