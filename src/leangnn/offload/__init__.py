"""Offload: exact full-graph training beyond device memory (NeutronJittor-style).

Partitioned, layer-wise execution with a host store and a budgeted device
cache; every vertex embedding is computed once per layer and epoch, and the
gradient equals PyG full-batch training.
"""

from leangnn.offload.budget import DeviceBudget
from leangnn.offload.cache import POLICIES, RULES, DeviceCache, resolve_policy, st_keys
from leangnn.offload.counters import OffloadCounters
from leangnn.offload.engine import OffloadEngine
from leangnn.offload.jobs import ArrayLayout, Job, JobRunner
from leangnn.offload.layerwise import SUPPORTED_CONVS, LayerwiseModel
from leangnn.offload.options import MODES, OffloadOptions
from leangnn.offload.plane import CountingPlane, DevicePlane
from leangnn.offload.schedule import (
    BudgetError,
    ExactSchedule,
    RecomputeSchedule,
    overlap_order,
)
from leangnn.offload.store import HostStore, ShapeStore
from leangnn.offload.strategy import OffloadStrategy
from leangnn.offload.workspace import WorkspaceModel

__all__ = [
    "OffloadEngine",
    "OffloadOptions",
    "OffloadCounters",
    "OffloadStrategy",
    "MODES",
    "POLICIES",
    "RULES",
    "resolve_policy",
    "DeviceBudget",
    "DeviceCache",
    "st_keys",
    "HostStore",
    "ShapeStore",
    "ArrayLayout",
    "Job",
    "JobRunner",
    "CountingPlane",
    "DevicePlane",
    "LayerwiseModel",
    "SUPPORTED_CONVS",
    "ExactSchedule",
    "RecomputeSchedule",
    "overlap_order",
    "BudgetError",
    "WorkspaceModel",
]
