"""The device budget of offloaded training: its split and every job's charge.

The offload engine (NeutronJittor-style, Fundamental Research 2026) must never
exceed its device budget. :class:`DeviceBudget` splits the budget into the
resident parameters (with gradients and optimizer state), the per-job
workspace and the cache share, tells the schedule whether a chunk's job fits,
and charges every job: resident + cache pool + the job's calibrated workspace
(:class:`~leangnn.offload.workspace.WorkspaceModel`), asserted under the
budget.
"""

from __future__ import annotations

import math

from leangnn.offload.counters import OffloadCounters
from leangnn.offload.schedule import BudgetError
from leangnn.offload.workspace import WorkspaceModel

__all__ = ["DeviceBudget"]


class DeviceBudget:
    """Split of ``total`` device bytes and the charge of each job.

    Args:
        total (int): the device budget in bytes.
        resident (int): bytes of the parameters with gradients and optimizer
            moments (on the device for the whole run).
        workspace_fraction (float): share of ``total - resident`` a job may
            use; the rest is the cache share. With ``cache_policy="none"``
            jobs get all of it.
        cache_policy (str): the cache policy.
        ws (WorkspaceModel): calibrated job bytes.
        slot_width (int): width of a cache slot in elements (the engine
            gathers cache rows at slot width).

    Raises:
        BudgetError: when ``total`` does not even hold the parameters.
    """

    def __init__(self, total: int, resident: int, workspace_fraction: float,
                 cache_policy: str, ws: WorkspaceModel, slot_width: int):
        free = total - resident
        if free <= 0:
            raise BudgetError(
                f"device_budget={total} bytes does not even hold the parameters: "
                f"they need {resident} bytes with gradients and optimizer state; "
                "raise device_budget")
        self.total, self.resident = total, resident
        self.workspace_fraction, self.cache_policy = workspace_fraction, cache_policy
        self.workspace = free if cache_policy == "none" else int(
            workspace_fraction * free)
        self.cache_share = free - self.workspace
        self.ws, self.slot_width = ws, slot_width

    def job_bytes(self, n_s: int, n_t: int, n_e: int) -> int:
        """Workspace of the costliest layer and phase of a job of that size."""
        return self.ws.max_bytes(n_s, n_t, n_e, self.slot_width)

    def fits(self, n_s: int, n_t: int, n_e: int) -> bool:
        return self.job_bytes(n_s, n_t, n_e) <= self.workspace

    def ratio(self, n_s: int, n_t: int, n_e: int) -> float:
        return self.job_bytes(n_s, n_t, n_e) / self.workspace

    def min_budget(self, job_bytes: int) -> int:
        """Smallest ``total`` whose workspace holds a job of ``job_bytes``."""
        if self.cache_policy == "none":
            return self.resident + job_bytes  # jobs get all of it
        f = self.workspace_fraction
        free = max(1, math.ceil(job_bytes / f))
        # the split rounds f * free down: step to the exact threshold
        while int(f * free) < job_bytes:
            free += 1
        while free > 1 and int(f * (free - 1)) >= job_bytes:
            free -= 1
        return self.resident + free

    def too_small(self, err: BudgetError) -> BudgetError:
        """``err`` (one node's job does not fit) restated with the bytes."""
        if err.sizes is None:
            return err
        need = self.job_bytes(*err.sizes)
        return BudgetError(
            f"device_budget={self.total} bytes too small: node {err.node} with "
            f"{err.sizes[2]} in-edges needs {need} bytes of job workspace, the "
            f"budget leaves {self.workspace}; raise device_budget to at least "
            f"{self.min_budget(need)} bytes")

    def charge(self, layer: int, backward: bool, sizes: tuple[int, int, int],
               cache_bytes: int, counters: OffloadCounters) -> None:
        """Account one job: update the peak, assert it is under the budget."""
        need = self.resident + cache_bytes + self.ws(layer, backward, *sizes,
                                                     self.slot_width)
        counters.peak_device_bytes = max(counters.peak_device_bytes, need)
        counters.jobs += 1
        if need > self.total:
            raise AssertionError(f"offload accounting exceeded the device budget: "
                                 f"{need} > {self.total} bytes")

    def to_dict(self) -> dict:
        return {"device_budget": self.total, "resident_bytes": self.resident,
                "workspace_bytes": self.workspace,
                "cache_share_bytes": self.cache_share}

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(total={self.total}, "
                f"resident={self.resident}, workspace={self.workspace})")
