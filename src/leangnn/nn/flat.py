"""One contiguous parameter behind the parameters of many small modules.

A reversible stack of ``L`` layers and ``G`` groups has ``L x G`` group
functions of a few small tensors each (5,120 tensors at 256 layers, 4 groups,
SAGEConv). Every one of them carries a gradient and two Adam moments as
separate tensors, and at that count the per-tensor overhead (allocator
headers, tensor objects, optimizer bookkeeping) outweighs the values
themselves: 17.0 MiB of gradient and Adam state at 256 layers on
``epfl/multiplier`` against 6.2 MiB for the same values in one tensor
(measured, ``MALLOC_MMAP_THRESHOLD_=65536``). The same idea as the flat
parameters of PyTorch FSDP and apex's fused optimizers.

:class:`FlatParameters` moves the modules' parameters into one
:class:`~torch.nn.Parameter` and re-attaches each original name as a view of
it, so the modules' code is unchanged; the optimizer, gradient clipping and
``state_dict`` see the single tensor.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["FlatParameters"]


class FlatParameters:
    """Layout of the parameters of ``modules`` inside one flat tensor.

    Args:
        modules (sequence of Module): the modules whose parameters are
            flattened, in order (e.g. the blocks of a stack).

    Example::

        layout = FlatParameters(blocks)
        owner.flat_weight = torch.nn.Parameter(layout.gather())
        layout.bind(owner.flat_weight)  # modules now read views of it
    """

    def __init__(self, modules: Sequence[torch.nn.Module]):
        # (module index, owning submodule, attribute, qualified name, offset, shape)
        self.slots: list[tuple[int, torch.nn.Module, str, str, int, torch.Size]] = []
        self._values: list[Tensor] = []
        offset = 0
        for i, module in enumerate(modules):
            for prefix, sub in module.named_modules():
                for name, p in list(sub._parameters.items()):
                    if p is None:
                        continue
                    if not p.requires_grad:
                        raise ValueError(f"cannot flatten frozen parameter {i}."
                                         f"{prefix}.{name}: every flattened "
                                         "parameter must require grad")
                    qual = ".".join(s for s in (str(i), prefix, name) if s)
                    self.slots.append((i, sub, name, qual, offset, p.shape))
                    self._values.append(p.detach())
                    offset += p.numel()
        self.numel = offset
        self.num_modules = len(modules)
        self._by_module: list[list[int]] = [[] for _ in modules]
        for s, slot in enumerate(self.slots):
            self._by_module[slot[0]].append(s)
        self._key = None

    def gather(self) -> Tensor:
        """The current parameter values, concatenated (call once, then bind)."""
        if not self._values:
            raise ValueError("no parameters to flatten")
        flat = torch.cat([v.reshape(-1) for v in self._values])
        self._values = []
        return flat

    def bind(self, flat: Tensor, autograd: bool = False) -> None:
        """Attach views of ``flat`` under the original parameter names.

        ``autograd=False`` attaches leaf views that share ``flat``'s storage
        (for code that computes their gradients itself, as the fused backward
        of :class:`~leangnn.nn.GSRStack` does); ``autograd=True`` attaches
        differentiable views (one split node), so plain autograd accumulates
        into ``flat.grad``. Cheap when nothing changed since the last call.
        """
        key = (autograd, flat.data_ptr(), flat.dtype, flat.device, flat.numel())
        if key == self._key and not (autograd and torch.is_grad_enabled()):
            return
        if flat.numel() != self.numel:
            raise ValueError(f"flat tensor has {flat.numel()} elements, the layout "
                             f"{self.numel}")
        if autograd:
            views = [piece.view(slot[5]) for piece, slot in zip(
                flat.split([shape.numel() for *_, shape in self.slots]), self.slots)]
        else:
            base = flat.detach()
            views = [self._view(base, slot).requires_grad_(flat.requires_grad)
                     for slot in self.slots]
        for (_, sub, name, *_), view in zip(self.slots, views):
            sub._parameters.pop(name, None)  # a plain attribute from now on
            setattr(sub, name, view)
        self._key = key

    def attach(self, module: int, tensors: Sequence[Tensor]) -> None:
        """Attach ``tensors`` (e.g. stand-ins of :meth:`tensors`' for one
        differentiation) under module ``module``'s parameter names, in
        layout order."""
        for s, t in zip(self._by_module[module], tensors, strict=True):
            slot = self.slots[s]
            # where bind's setattr put them (plain attributes), without
            # Module.__setattr__'s checks: 0.1 us a tensor instead of 1.2,
            # twice per tensor per block of every backward
            vars(slot[1])[slot[2]] = t

    def tensors(self, module: int) -> list[Tensor]:
        """The tensors bound for module ``module``, in layout order."""
        return [getattr(self.slots[s][1], self.slots[s][2])
                for s in self._by_module[module]]

    def views(self, flat: Tensor, module: int) -> list[Tensor]:
        """Views of a flat-shaped ``flat`` (e.g. a gradient) for one module."""
        return [self._view(flat, self.slots[s]) for s in self._by_module[module]]

    def named(self, flat: Tensor) -> OrderedDict[str, Tensor]:
        """``{"<module>.<path>": view}`` over a flat-shaped tensor."""
        return OrderedDict((slot[3], self._view(flat, slot)) for slot in self.slots)

    @staticmethod
    def _view(flat: Tensor, slot: tuple) -> Tensor:
        offset, shape = slot[4], slot[5]
        return flat[offset:offset + shape.numel()].view(shape)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({len(self.slots)} tensors in "
                f"{self.num_modules} modules, numel={self.numel})")
