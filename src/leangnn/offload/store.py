"""Host store: the full-graph arrays of offloaded training, in host memory.

NeutronJittor (Fundamental Research 2026) keeps every layer's vertex
embeddings and their gradients in host memory and streams rows to the device
on demand. :class:`HostStore` holds those arrays by name (pinned memory when
the device is CUDA, so copies can overlap compute); in *counting* mode it only
records shapes, so a schedule's traffic can be replayed on graphs whose
arrays would not fit this machine.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["HostStore"]


class HostStore:
    """Named ``[rows, width]`` host arrays: features, embeddings, gradients.

    Args:
        pin (bool, optional): allocate pinned (page-locked) memory, for fast
            asynchronous copies to a CUDA device. (default: ``False``)
        virtual (bool, optional): record shapes only, allocate nothing.
            (default: ``False``)
    """

    def __init__(self, pin: bool = False, virtual: bool = False):
        self.pin = pin and torch.cuda.is_available()
        self.virtual = virtual
        self.arrays: dict[str, Tensor | None] = {}
        self.shapes: dict[str, tuple[int, int]] = {}

    def allocate(self, name: str, rows: int, width: int, dtype: torch.dtype,
                 zero: bool = False) -> Tensor | None:
        """Create (or replace) array ``name``."""
        self.shapes[name] = (rows, width)
        if self.virtual:
            self.arrays[name] = None
            return None
        fn = torch.zeros if zero else torch.empty
        t = fn(rows, width, dtype=dtype, pin_memory=self.pin)
        self.arrays[name] = t
        return t

    def put(self, name: str, tensor: Tensor) -> None:
        """Register an existing host tensor (e.g. the input features)."""
        self.shapes[name] = tuple(tensor.shape)
        if self.virtual:
            self.arrays[name] = None
            return
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if self.pin and not t.is_pinned():
            t = t.pin_memory()
        self.arrays[name] = t

    def __getitem__(self, name: str) -> Tensor | None:
        return self.arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def free(self, name: str) -> None:
        self.arrays.pop(name, None)
        self.shapes.pop(name, None)

    def gather(self, name: str, rows: Tensor) -> Tensor:
        """Rows of ``name`` (a host copy, pinned when the store is)."""
        src = self.arrays[name]
        if not self.pin:
            return src.index_select(0, rows)
        out = torch.empty((rows.numel(), src.size(1)), dtype=src.dtype,
                          pin_memory=True)
        return torch.index_select(src, 0, rows, out=out)

    def write(self, name: str, rows: Tensor, values: Tensor) -> None:
        self.arrays[name].index_copy_(0, rows, values.to("cpu"))

    def accumulate(self, name: str, rows: Tensor, values: Tensor) -> None:
        self.arrays[name].index_add_(0, rows, values.to("cpu"))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.arrays.values()
                   if t is not None)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({len(self.shapes)} arrays, "
                f"pin={self.pin}, virtual={self.virtual})")
