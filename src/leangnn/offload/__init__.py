"""Offload: exact full-graph training beyond device memory (NeutronJittor-style).

Partitioned, layer-wise execution with a host store and a budgeted device
cache; every vertex embedding is computed once per layer and epoch, and the
gradient equals PyG full-batch training.
"""

from leangnn.offload.cache import POLICIES, DeviceCache, st_keys
from leangnn.offload.engine import (
    MODES,
    OffloadCounters,
    OffloadEngine,
    full_batch_vertex_bytes,
)
from leangnn.offload.layerwise import SUPPORTED_CONVS, LayerwiseModel
from leangnn.offload.schedule import (
    BudgetError,
    ExactSchedule,
    RecomputeSchedule,
    overlap_order,
)
from leangnn.offload.store import HostStore
from leangnn.offload.strategy import OffloadStrategy
from leangnn.offload.workspace import LiveBytesMeter, WorkspaceModel

__all__ = [
    "OffloadEngine",
    "OffloadCounters",
    "OffloadStrategy",
    "MODES",
    "POLICIES",
    "DeviceCache",
    "st_keys",
    "HostStore",
    "LayerwiseModel",
    "SUPPORTED_CONVS",
    "ExactSchedule",
    "RecomputeSchedule",
    "overlap_order",
    "BudgetError",
    "LiveBytesMeter",
    "WorkspaceModel",
    "full_batch_vertex_bytes",
]
