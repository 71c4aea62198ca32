"""Host store: the full-graph arrays of offloaded training, in host memory.

NeutronJittor (Fundamental Research 2026) keeps every layer's vertex
embeddings and their gradients in host memory and streams rows to the device
on demand. :class:`HostStore` holds those arrays by name (pinned memory when
the device is CUDA, so copies can overlap compute). :class:`ShapeStore` is
the store of the engine's counting mode: it records names, shapes and dtypes
only, so a schedule's traffic (and the host bytes a real epoch would hold)
can be replayed on graphs whose arrays would not fit this machine.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ShapeStore", "HostStore", "is_all_rows"]


def is_all_rows(rows: Tensor, n: int) -> bool:
    """Whether ``rows`` is ``0, 1, ..., n - 1`` (O(n) check, no copy)."""
    if rows.numel() != n or n == 0:
        return False
    return int(rows[0]) == 0 and bool((rows.diff() == 1).all())


class ShapeStore:
    """Names, shapes and dtypes of ``[rows, width]`` host arrays; no data."""

    def __init__(self):
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}

    def allocate(self, name: str, rows: int, width: int, dtype: torch.dtype,
                 zero: bool = False) -> Tensor | None:
        """Create (or replace) array ``name``."""
        self.shapes[name] = (rows, width)
        self.dtypes[name] = dtype
        return None

    def put(self, name: str, tensor: Tensor) -> None:
        """Register an existing host tensor (e.g. the input features)."""
        self.shapes[name] = tuple(tensor.shape)
        self.dtypes[name] = tensor.dtype

    def __getitem__(self, name: str) -> Tensor | None:
        if name not in self.shapes:
            raise KeyError(name)
        return None

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def names(self) -> list[str]:
        return list(self.shapes)

    def free(self, name: str) -> None:
        self.shapes.pop(name, None)
        self.dtypes.pop(name, None)

    def nbytes(self) -> int:
        """Bytes held (none: only shapes are recorded)."""
        return 0

    def array_bytes(self) -> int:
        """Bytes the recorded arrays take when materialised."""
        total = 0
        for name, shape in self.shapes.items():
            n = 1
            for s in shape:
                n *= int(s)
            total += n * torch.empty((), dtype=self.dtypes[name]).element_size()
        return total

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({len(self.shapes)} arrays)"


class HostStore(ShapeStore):
    """Named ``[rows, width]`` host arrays: features, embeddings, gradients.

    Args:
        pin (bool, optional): allocate pinned (page-locked) memory, for fast
            asynchronous copies to a CUDA device. (default: ``False``)
    """

    def __init__(self, pin: bool = False):
        super().__init__()
        self.pin = pin and torch.cuda.is_available()
        self.arrays: dict[str, Tensor] = {}

    def allocate(self, name: str, rows: int, width: int, dtype: torch.dtype,
                 zero: bool = False) -> Tensor:
        """Create (or replace) array ``name``."""
        super().allocate(name, rows, width, dtype)
        fn = torch.zeros if zero else torch.empty
        t = fn(rows, width, dtype=dtype, pin_memory=self.pin)
        self.arrays[name] = t
        return t

    def put(self, name: str, tensor: Tensor) -> None:
        """Register an existing host tensor (e.g. the input features)."""
        super().put(name, tensor)
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if self.pin and not t.is_pinned():
            t = t.pin_memory()
        self.arrays[name] = t

    def __getitem__(self, name: str) -> Tensor:
        return self.arrays[name]

    def free(self, name: str) -> None:
        super().free(name)
        self.arrays.pop(name, None)

    def gather(self, name: str, rows: Tensor) -> Tensor:
        """Rows of ``name``: a host copy (pinned when the store is), or the
        array itself when ``rows`` is every row in order (a whole-graph job;
        callers only read it, and a copy of every row would be pure cost)."""
        src = self.arrays[name]
        if is_all_rows(rows, src.size(0)):
            return src
        if not self.pin:
            return src.index_select(0, rows)
        out = torch.empty((rows.numel(), src.size(1)), dtype=src.dtype,
                          pin_memory=True)
        return torch.index_select(src, 0, rows, out=out)

    def write(self, name: str, rows: Tensor, values: Tensor) -> None:
        """``name[rows] = values``. A whole-graph job's output (every row in
        order) is a plain copy, or, when it already is a host tensor of the
        array's layout and the store needs no pinned memory, the array itself
        (callers hand over a fresh tensor: no copy of every row, and one
        buffer instead of two while a retained graph holds it)."""
        dst = self.arrays[name]
        if is_all_rows(rows, dst.size(0)):
            if (not self.pin and values.device.type == "cpu"
                    and values.dtype == dst.dtype and values.shape == dst.shape
                    and values.is_contiguous()):
                self.arrays[name] = values
            else:
                dst.copy_(values)
            return
        dst.index_copy_(0, rows, values.to("cpu"))

    def accumulate(self, name: str, rows: Tensor, values: Tensor) -> None:
        """``name[rows] += values`` (rows are distinct)."""
        dst = self.arrays[name]
        if is_all_rows(rows, dst.size(0)):
            dst.add_(values.to("cpu"))  # index_add_ of every row, as a plain add
            return
        dst.index_add_(0, rows, values.to("cpu"))

    def nbytes(self) -> int:
        """Bytes of the arrays held (the features included when put here)."""
        return sum(t.numel() * t.element_size() for t in self.arrays.values())

    def array_bytes(self) -> int:
        return self.nbytes()

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({len(self.shapes)} arrays, "
                f"pin={self.pin})")
