"""A pessimistic model of where glibc's main heap puts a step's blocks.

Under glibc's default allocator a CPU tensor below the dynamic mmap threshold
comes from the main heap, whose resident size is its extent: a hole left by a
freed block stays resident until a later block fits in it. The planner's heap
factors (:mod:`leangnn.plan.calibration`) scale the live high-water of those
blocks by what calibration runs measured, 1.2-2.9x. One shape of step they
cannot follow: a deep stack whose per-layer transients are much larger than
what each layer keeps (a GNN's ``E x C`` messages against its ``N x C``
activations on a graph of high degree). Measured on csbm:8000, 16 residual
SAGE layers (``mallinfo2`` after every op): each freed 22.6 MiB message hole
is split by the next layer's kept 1 MiB activations, the next message no
longer fits, and the heap grows by one message every other layer: 232 MiB
of heap for 75 MiB of live blocks, ~5x, where the factor says 2.3x.

:class:`HeapModel` replays the tracked heap blocks with two rules that make
that happen:

* a request is carved from the most recently freed hole when it fits there
  (glibc serves requests from its unsorted bin and last remainder, freshest
  chunks first), else from the best-fitting hole, else from the top;
* every block taken from the top is followed by a small block that stays
  (glibc's own and C++ objects allocated beside a tensor, which the tracker
  cannot see), so a freed block at the top leaves a hole instead of giving
  the top back.

The planner raises the calibrated figure to the extent this model reaches
(plus the bytes on their own pages), where that is higher. Measured through
``leangnn train`` (``benchmarks/plan.py --section cli``): on the 48 rows
before it the measured heap was 1.02-2.7x this extent, so no estimate
there moved; on six held-out deep full-batch stacks on csbm graphs of
degree ~23 the errors went from -35..-61% to -36..+20% (4 of 6 within 10%;
a residual GCN stack stays 36% under). It is not a bound: on a 2000-node
graph of degree 40, 8 SAGE layers, the extent is 15-35% above the measured
heap. The rules are inferred from the measured growth, not read from
glibc: a replay of the tracked blocks against the real glibc in a forked
process did not reproduce the growth (the objects it misses are missing
there too).
"""
from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["HeapModel"]

_PAGE = 4096


class HeapModel:
    """Address-ordered heap: freshest-hole first, then best fit, with
    coalescing, pinned top blocks and top trimming.

    Args:
        trim_threshold (int, optional): a free top chunk of this many bytes or
            more is returned to the system (glibc: twice the dynamic mmap
            threshold, at most 64 MiB). (default: ``64 MiB``)
        top_pad (int, optional): bytes kept above the top after a trim.
            (default: ``128 KiB``)
        pin (int, optional): bytes of the object left above each block taken
            from the top. (default: ``64``)
        align (int, optional): chunk sizes are rounded up to this (torch's
            CPU allocator asks for 64-byte alignment). (default: ``64``)

    Attributes:
        extent (int): the highest address reached since the last trim (the
            heap's resident size).
    """

    def __init__(self, trim_threshold: int = 64 << 20, top_pad: int = 128 << 10,
                 pin: int = 64, align: int = 64):
        self.trim_threshold, self.top_pad = trim_threshold, top_pad
        self.pin, self.align = pin, align
        self.top = 0  # the top chunk starts here
        self.extent = 0
        self._addrs: list[int] = []  # free chunk starts, ascending
        self._size: dict[int, int] = {}  # free chunk start -> size
        self._by_size: list[tuple[int, int]] = []  # (size, start), ascending
        self._blocks: dict[int, tuple[int, int]] = {}  # key -> (start, size)
        self._recent: int | None = None  # start of the freshest free chunk

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(extent={self.extent}, "
                f"blocks={len(self._blocks)}, holes={len(self._addrs)})")

    def _chunk(self, nbytes: int) -> int:
        a = self.align
        return -(-(nbytes + 16) // a) * a

    def _take(self, start: int) -> int:
        size = self._size.pop(start)
        del self._addrs[bisect_left(self._addrs, start)]
        del self._by_size[bisect_left(self._by_size, (size, start))]
        if start == self._recent:
            self._recent = None
        return size

    def _put(self, start: int, size: int) -> None:
        self._size[start] = size
        insort(self._addrs, start)
        insort(self._by_size, (size, start))

    def malloc(self, key: int, nbytes: int) -> None:
        """Place a block of ``nbytes`` under ``key``."""
        size = self._chunk(nbytes)
        start = self._recent
        if start is None or self._size[start] < size:
            i = bisect_left(self._by_size, (size, -1))
            start = self._by_size[i][1] if i < len(self._by_size) else None
        if start is not None:
            recent = start == self._recent
            have = self._take(start)
            if have > size:
                self._put(start + size, have - size)
                if recent:
                    self._recent = start + size
        else:
            start = self.top
            self.top += size + self.pin
            self.extent = max(self.extent, self.top)
        self._blocks[key] = (start, size)

    def free(self, key: int) -> None:
        """Free ``key``'s block (unknown keys are ignored)."""
        hit = self._blocks.pop(key, None)
        if hit is None:
            return
        start, size = hit
        i = bisect_left(self._addrs, start)
        if i > 0:
            prev = self._addrs[i - 1]
            if prev + self._size[prev] == start:
                size += self._take(prev)
                start = prev
        if start + size in self._size:
            size += self._take(start + size)
        if start + size == self.top:
            self.top = start
            if self.extent - self.top >= self.trim_threshold:
                end = self.top + self.top_pad
                self.extent = min(self.extent, -(-end // _PAGE) * _PAGE)
        else:
            self._put(start, size)
            self._recent = start
