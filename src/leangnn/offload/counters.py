"""What the offload engine moved, computed and held, per epoch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

__all__ = ["OffloadCounters"]


@dataclass
class OffloadCounters:
    """What one epoch (or prediction) of the engine moved and computed.

    ``peak_*`` fields are maxima, every other field is a sum (see
    :meth:`merge`). ``peak_device_bytes`` is the engine's accounting
    (resident parameters + cache pool + the job's calibrated workspace);
    ``peak_host_bytes`` is host memory outside the device budget that the
    engine holds: the host store's arrays (the features included) and the
    cache's slot metadata. ``peak_total_bytes`` is the one-memory figure of a
    CPU "device": the host bytes held at each job plus the device bytes that
    job really uses (resident state, cache pool, retained graphs, its fitted
    workspace *without* the safety margin, its input and upstream-gradient
    blocks; :meth:`~leangnn.offload.budget.DeviceBudget.expected_bytes`), the
    highest over the epoch. The two peaks above come at different moments, so
    their sum over-counts (measured: 24 vs 16 MiB on s38417); this one is
    within ~1% of the live tensor bytes of a real epoch on the graphs tried.
    ``peak_resident_bytes`` is ``peak_total_bytes`` as a CPU process holds
    it: the blocks glibc maps on pages of their own (past its mmap
    threshold) on top of the heap's high-water so far
    (:meth:`~leangnn.offload.budget.DeviceBudget.charge`); equal to
    ``peak_total_bytes`` where no job has such a block.
    ``peak_resident_mapped_bytes`` is the mapped part of that peak.
    """

    h2d_bytes: int = 0           # vertex rows host -> device
    d2h_bytes: int = 0           # vertex rows device -> host
    h2d_meta_bytes: int = 0      # chunk topology and slot indices
    vertex_layer_computations: int = 0    # embeddings computed (forward)
    vertex_layer_recomputations: int = 0  # recomputed in backward
    cache_hits: int = 0          # rows read from the device cache
    cache_misses: int = 0        # rows read from the host
    writebacks: int = 0          # evicted dirty rows written to the host
    jobs: int = 0
    peak_device_bytes: int = 0   # engine accounting: resident + job workspace
    peak_device_bytes_measured: int = 0  # CUDA allocator / strict CPU meter
    peak_host_bytes: int = 0     # host store arrays + cache metadata
    peak_total_bytes: int = 0    # host + the job's expected device bytes
    peak_resident_bytes: int = 0  # the above with mapped blocks apart
    peak_resident_mapped_bytes: int = 0  # the mapped blocks at that peak

    @property
    def traffic_bytes(self) -> int:
        return self.h2d_bytes + self.d2h_bytes

    def merge(self, other: OffloadCounters) -> None:
        """Add ``other`` in place (maxima for the ``peak_*`` fields)."""
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(a, b) if f.name.startswith("peak") else a + b)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["traffic_bytes"] = self.traffic_bytes
        return d
