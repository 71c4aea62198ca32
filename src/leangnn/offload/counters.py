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
    cache's slot metadata. On a CPU "device" the process needs about the sum
    of the two.
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
