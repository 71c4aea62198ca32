"""The engine's counters, and the full-batch need it is compared to."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from leangnn.offload.layerwise import LayerwiseModel

__all__ = ["OffloadCounters", "full_batch_vertex_bytes"]

@dataclass
class OffloadCounters:
    """What one epoch (or prediction) of the engine moved and computed."""

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

    @property
    def traffic_bytes(self) -> int:
        return self.h2d_bytes + self.d2h_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["traffic_bytes"] = self.traffic_bytes
        return d



def full_batch_vertex_bytes(model: torch.nn.Module, num_nodes: int,
                            resident_factor: int = 4) -> int:
    """Device bytes of full-batch training's vertex data: the features, every
    layer's output and its gradient, plus the parameters (with gradients and
    Adam moments). The reference "full-batch need" of the benchmarks; PyG's
    real need is larger (per-edge messages)."""
    lw = LayerwiseModel(model)
    elem = next(model.parameters()).element_size()
    rows = sum(lw.widths) + sum(lw.widths[1:])
    return num_nodes * rows * elem + resident_factor * lw.param_bytes()

