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
        fixed (int, optional): device bytes the process holds outside any
            tensor of the run (cuBLAS' workspaces:
            :func:`~leangnn.blas_workspace.ensure_blas_workspace`), resident
            on top of ``resident``. (default: ``0``)

    Raises:
        BudgetError: when ``total`` does not even hold the parameters.
    """

    def __init__(self, total: int, resident: int, workspace_fraction: float,
                 cache_policy: str, ws: WorkspaceModel, slot_width: int,
                 fixed: int = 0):
        resident += fixed
        free = total - resident
        if free <= 0:
            held = (f"; {fixed} of them cuBLAS' workspaces, which every matrix "
                    "product on this GPU needs") if fixed else ""
            raise BudgetError(
                f"device_budget={total} bytes does not even hold the parameters: "
                f"they need {resident} bytes with gradients and optimizer state"
                f"{held}; raise device_budget")
        self.total, self.resident, self.fixed = total, resident, fixed
        self.workspace_fraction, self.cache_policy = workspace_fraction, cache_policy
        self.workspace = free if cache_policy == "none" else int(
            workspace_fraction * free)
        self.cache_share = free - self.workspace
        self.ws, self.slot_width = ws, slot_width
        #: workspace of forward jobs that keep their autograd graph (set by
        #: the engine when it retains; its forward phase bounds the graph)
        self.retain_ws: WorkspaceModel | None = None
        self._job_ws: dict[tuple, int] = {}
        self._kept: dict[tuple, int] = {}
        self._expected: dict[tuple, int] = {}
        #: nodes of the graph (set by the engine): whole-graph jobs are told
        #: apart in the expected bytes
        self.num_nodes: int | None = None
        #: glibc's mmap threshold on a CPU "device" (set by the engine; see
        #: :meth:`charge`); ``None``: no heap to follow (CUDA)
        self.heap_threshold: int | None = None
        self._heap_high = 0
        self._mapped: dict[tuple, int] = {}

    def retained_bytes(self, layer: int, n_s: int, n_t: int, n_e: int) -> int:
        """Bytes a retaining forward job leaves on the device until its
        backward: its graph (bounded by the forward-with-graph peak) plus the
        input block and edge weights the graph saves (the calibration excludes
        them as inputs)."""
        key = (layer, n_s, n_t, n_e)
        kept = self._kept.get(key)
        if kept is None:
            ws = self.retain_ws
            kept = self._kept[key] = (ws.conv_bytes(layer, False, n_s, n_t, n_e)
                                      + n_s * ws.widths[layer] * ws.elem
                                      + (n_e * ws.elem if ws.weighted else 0))
        return kept

    def kept_expected(self, layer: int, n_s: int, n_t: int, n_e: int) -> int:
        """:meth:`retained_bytes` as the graph really holds them (the fitted
        forward-with-graph bytes without the safety margin)."""
        ws = self.retain_ws
        kept = ws.kept_bytes(layer, n_s, n_t, n_e) + (n_e * ws.elem if ws.weighted
                                                      else 0)
        if self._whole(n_s, n_t):
            # the input block is the store's array itself: not extra (the
            # output, which the store takes over, is still counted on both
            # sides: measured 1.01-1.08x of the live peak, 0.89x without it)
            return kept
        return kept + n_s * ws.widths[layer] * ws.elem

    def _whole(self, n_s: int, n_t: int) -> bool:
        """A whole-graph job on a CPU "device", whose blocks are the host
        store's arrays themselves (:meth:`~leangnn.offload.store.HostStore.
        gather`)."""
        return (self.ws.device.type == "cpu" and self.num_nodes is not None
                and n_s == n_t == self.num_nodes)

    def expected_bytes(self, layer: int, backward: bool, sizes: tuple[int, int, int],
                       retaining: bool = False, through_kept: bool = False) -> int:
        """Device bytes a job really allocates (its workspace without the
        safety margin and the engine's upper bounds; for estimates, see
        :meth:`~leangnn.offload.workspace.WorkspaceModel.expected_bytes`).
        A backward job ``through_kept`` graph recomputes nothing: its graph is
        already counted with the kept ones, so the recomputed forward's
        share of the backward workspace is taken out."""
        key = (layer, backward, retaining, through_kept, sizes)
        exp = self._expected.get(key)
        if exp is None:
            ws = self.retain_ws if retaining and not backward else self.ws
            exp = ws.expected_bytes(layer, backward, *sizes)
            if self._whole(*sizes[:2]):
                n_s, n_t = sizes[:2]
                exp -= (n_s * ws.widths[layer] + (n_t * ws.widths[layer + 1]
                                                  if backward else 0)) * ws.elem
            if through_kept:
                exp = max(exp - self.retain_ws.kept_bytes(layer, *sizes),
                          sizes[1] * ws.widths[layer + 1] * ws.elem)
            self._expected[key] = exp
        return exp

    def retain_need(self, sizes: list[tuple[int, int, int]], num_layers: int) -> int:
        """Workspace an epoch needs to retain every forward job's graph: all
        graphs at once plus the costliest job of either phase. Retention is
        planned only when it fits :attr:`workspace`, so every charge stays
        under resident + cache share + workspace = the budget."""
        kept = sum(self.retained_bytes(li, *sz) for li in range(num_layers)
                   for sz in sizes)
        job = max(max(self.retain_ws(li, False, *sz, self.slot_width),
                      self.ws(li, True, *sz, self.slot_width))
                  for li in range(num_layers) for sz in sizes)
        return kept + job

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
            f"{getattr(err, 'in_degree', None) or err.sizes[2]} in-edges needs "
            f"{need} bytes of job workspace, the "
            f"budget leaves {self.workspace}; raise device_budget to at least "
            f"{self.min_budget(need)} bytes")

    def charge(self, layer: int, backward: bool, sizes: tuple[int, int, int],
               cache_bytes: int, counters: OffloadCounters, retained: int = 0,
               retaining: bool = False, host: int | None = None,
               kept: int = 0, through_kept: bool = False) -> int:
        """Account one job: update the peak, assert it is under the budget;
        returns the job's accounted device bytes.

        ``retained`` bytes of earlier jobs' autograd graphs are still on the
        device; a ``retaining`` forward job builds its own (charged with the
        calibrated forward-with-graph workspace, :attr:`retain_ws`). Given the
        ``host`` bytes held now (and ``kept``, the retained graphs' expected
        bytes), also updates ``peak_total_bytes`` (see
        :class:`~leangnn.offload.counters.OffloadCounters`)."""
        if host is not None:
            # on a CPU "device" the pool is host memory, already in ``host``
            pool = 0 if self.ws.device.type == "cpu" else cache_bytes
            total = (host + pool + self.resident + kept
                     + self.expected_bytes(layer, backward, sizes, retaining,
                                           through_kept))
            counters.peak_total_bytes = max(counters.peak_total_bytes, total)
            # A block past glibc's mmap threshold is mapped on pages of its
            # own while the heap keeps its high-water extent, so a job's
            # mapped blocks add to the heap's high-water, not to this job's
            # heap bytes (measured: see WorkspaceModel.mapped_bytes).
            key = (layer, backward, retaining, sizes[2])
            mapped = self._mapped.get(key)
            if mapped is None:
                ws = self.retain_ws if retaining and not backward else self.ws
                mapped = self._mapped[key] = ws.mapped_bytes(
                    layer, backward, sizes[2], self.heap_threshold)
            mapped = min(total, mapped)
            self._heap_high = max(self._heap_high, total - mapped)
            if self._heap_high + mapped > counters.peak_resident_bytes:
                counters.peak_resident_bytes = self._heap_high + mapped
                counters.peak_resident_mapped_bytes = mapped
        key = (layer, backward, retaining, sizes)
        job = self._job_ws.get(key)
        if job is None:
            # the schedule is static: every epoch charges the same jobs, so
            # the model is evaluated once per job, not once per job and epoch
            ws = self.retain_ws if retaining and not backward else self.ws
            job = self._job_ws[key] = ws(layer, backward, *sizes, self.slot_width)
        need = self.resident + cache_bytes + retained + job
        counters.peak_device_bytes = max(counters.peak_device_bytes, need)
        counters.jobs += 1
        if need > self.total:
            raise AssertionError(f"offload accounting exceeded the device budget: "
                                 f"{need} > {self.total} bytes")
        return need

    def to_dict(self) -> dict:
        return {"device_budget": self.total, "resident_bytes": self.resident,
                "blas_workspace_bytes": self.fixed,
                "workspace_bytes": self.workspace,
                "cache_share_bytes": self.cache_share}

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(total={self.total}, "
                f"resident={self.resident}, workspace={self.workspace})")
