"""Options of the offload engine, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leangnn.offload.cache import POLICIES
from leangnn.utils import parse_bytes

__all__ = ["OffloadOptions", "MODES", "ORDERS"]

MODES = ("exact", "recompute")
ORDERS = ("overlap", "natural")


@dataclass
class OffloadOptions:
    """Everything :class:`~leangnn.offload.engine.OffloadEngine` can be told.

    Positional order is the engine's historical one, so
    ``OffloadEngine(model, data, "2GiB", 8, "st")`` still reads naturally.

    Args:
        device_budget (int or str): device bytes for everything the engine
            puts there (e.g. ``"2GiB"``); parsed to ``int`` bytes.
        num_parts (int, optional): METIS parts. (default: ``8``)
        cache (str, optional): ``"none"``, ``"lru"``, ``"degree"``, ``"st"``
            or ``"auto"``: ``st`` on a CUDA device (``lru`` in recompute
            mode), ``none`` on a CPU "device", where a cached row saves only
            a memcpy (:func:`~leangnn.offload.cache.resolve_policy`).
            (default: ``"auto"``)
        mode (str, optional): ``"exact"`` or ``"recompute"`` (the baseline).
            (default: ``"exact"``)
        device (torch.device or str, optional): the device. (default: the
            model's)
        workspace_fraction (float, optional): share of the budget left after
            the parameters that jobs may use; the rest is the cache (``none``
            gives jobs all of it). (default: ``0.5``)
        partition_method (str, optional): see
            :func:`~leangnn.graphs.partition.partition_graph`. (default: ``"auto"``)
        order (str, optional): ``"overlap"`` or ``"natural"`` part order.
            (default: ``"overlap"``)
        strict (bool, optional): also *measure* every job's device bytes
            (live-bytes meter on CPU, allocator peak on CUDA) and assert them
            under the budget. Slow; for tests. (default: ``False``)
        virtual (bool, optional): counting mode: replay schedule, cache
            decisions and traffic without materialising any data (for graphs
            too large for this host). (default: ``False``)
        resident_factor (int, optional): parameter copies charged on the
            device (weights, gradients, two Adam moments). (default: ``4``)
        seed (int, optional): METIS seed. (default: ``0``)
        cache_dir (str, optional): partition cache folder. (default: ``None``)
        retain (bool, optional): when the budget's workspace holds every
            forward job's autograd graph at once (about what full-batch
            training keeps), keep them and backpropagate through them instead
            of recomputing each layer in backward (each vertex embedding is
            then computed once per layer *and epoch*, as in PyG full batch).
            Budget-checked: smaller budgets fall back to recomputation by
            themselves, and every retained graph is charged to the budget.
            Exact mode only; ``False`` always recomputes. (default: ``True``)
    """

    device_budget: int | str
    num_parts: int = 8
    cache: str = "auto"
    mode: str = "exact"
    device: torch.device | str | None = None
    workspace_fraction: float = 0.5
    partition_method: str = "auto"
    order: str = "overlap"
    strict: bool = False
    virtual: bool = False
    resident_factor: int = 4
    seed: int = 0
    cache_dir: str | None = None
    retain: bool = True

    def __post_init__(self):
        self.device_budget = parse_bytes(self.device_budget, "device_budget")
        if isinstance(self.num_parts, bool) or not isinstance(self.num_parts, int) \
                or self.num_parts < 1:
            raise ValueError(f"num_parts must be a positive int, got "
                             f"{self.num_parts!r}")
        if self.cache not in POLICIES:
            raise ValueError(f"cache must be one of {POLICIES}, got {self.cache!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "recompute" and self.cache == "st":
            raise ValueError("cache='st' needs the exact schedule's next-use "
                             "information; use none|lru|degree with mode='recompute'")
        if not 0.0 < self.workspace_fraction < 1.0:
            raise ValueError(f"workspace_fraction must be in (0, 1), got "
                             f"{self.workspace_fraction!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if not isinstance(self.retain, bool):
            raise ValueError(f"retain must be a bool, got {self.retain!r}")
        if not isinstance(self.resident_factor, int) or self.resident_factor < 1:
            raise ValueError(f"resident_factor must be an int >= 1, got "
                             f"{self.resident_factor!r}")
