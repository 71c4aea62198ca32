"""Calibration: the allocator's overhead and the time of work, per machine kind.

A dry run counts tensor bytes; what a run's meter reports is more on CPU
(resident memory: glibc keeps freed heap, code pages, thread stacks; with its
default dynamic mmap threshold about twice the tensor bytes, measured) and
what a CUDA device holds is more too (the caching allocator reserves more
than it hands out). :class:`Calibration` holds what a short calibration
(:mod:`leangnn.plan.calibrate`) fits from small real runs beside their
estimates:

* memory: on CPU ``measured = big + heap_scale x heap + const``, where the
  dry run splits the step's bytes at glibc's mmap threshold into blocks on
  their own pages (resident exactly while alive) and the heap's high-water
  (freed small blocks stay resident); under glibc's default allocator the
  heap factor is fitted per op mix (:func:`heap_families`: GAT's heap
  fragments less than a residual SAGE stack's); on CUDA ``measured = tensor
  bytes + const`` and ``reserved / allocated`` for budget checks; offload's
  accounting gets a scale per model;
* time: ``epoch_seconds = a ops + b bytes_written + b' bytes written into
  storages of 1 MiB or more (past the core's caches) + b'' bytes written
  into storages at or above the heap threshold (fresh pages, faulted in) +
  c flops`` (non-negative least squares of least relative error over the
  traced work), and for offload ``k x that + per_job x jobs``, its work in
  chunk-sized blocks (:func:`~leangnn.plan.estimate.chunked_work`); the DAG
  model's runs get a scale of their own on top.

One JSON file per machine kind (CPU model and allocator setting, or GPU name)
under ``cache_root("calibration")``. A machine without one uses the
*reference* calibration shipped in ``leangnn/plan/reference/`` for its CPU
allocator mode (:func:`reference_calibration`): the heap factors are glibc's
and the models', so they carry over to other glibc machines far better than
the uncalibrated default (over the 31 rows of ``benchmarks/plan.py --section
cli``: -56% .. +75% uncalibrated); its epoch times are the reference
machine's (used to rank candidates only). Estimates made with it say so.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leangnn.plan.collectives import CollectiveCost
from leangnn.utils import atomic_write_text, cache_root

__all__ = ["Calibration", "heap_families", "machine_kind", "allocator_mode",
           "calibration_path", "kind_path", "load_calibration", "fit_calibration",
           "reference_calibration", "calibration_label", "REFERENCE_DIR",
           "long_run_families", "fit_long_runs", "SHORT_RUN_EPOCHS",
           "family_heap_factor", "family_heap_factors", "fit_heap_families",
           "HEAVY_HEAP_BYTES", "TIMED_FAMILIES",
           "DAG_NARROW", "GSR_MANY_GROUPS", "sample_families", "fit_time",
           "fit_offload", "fit_setup", "fit_first_run", "family_first_run",
           "is_tiny", "PLANNED", "is_planned", "csr_core"]

#: the calibrations shipped with the package, one per CPU allocator mode
#: (``glibc-default.json``, ...; written by ``python -m leangnn.plan.calibrate
#: --save-reference`` on the reference machine)
REFERENCE_DIR = Path(__file__).with_name("reference")

#: what an uncalibrated machine assumes (measured on a 2-core x86-64 CPU
#: with glibc 2.36; tensor bytes are exact on CUDA and in mmap mode)
_DEFAULT_SCALE = {"glibc-default": 1.9, "glibc-mmap": 1.0, "glibc-compact": 1.1,
                  "cuda-caching": 1.0, "system": 1.0}


def allocator_mode(device: torch.device | str = "cpu") -> str:
    """``cuda-caching``; on Linux's CPU ``glibc-`` and the heap this process
    has (:func:`leangnn.heap.heap_mode`): ``glibc-mmap`` when
    ``MALLOC_MMAP_THRESHOLD_`` is set (resident memory follows live
    tensors), ``glibc-compact`` (the ``leangnn`` command's) or
    ``glibc-default``; ``system`` elsewhere."""
    from leangnn.heap import heap_mode

    if torch.device(device).type == "cuda":
        return "cuda-caching"
    if not sys.platform.startswith("linux"):
        return "system"
    return f"glibc-{heap_mode()}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_kind(device: torch.device | str = "cpu") -> str:
    """What a calibration is valid for: the GPU's name, or the CPU's model
    and the allocator setting."""
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev) if torch.cuda.is_available() \
            else "unknown-gpu"
    else:
        name = f"{platform.machine()} {_cpu_name()}"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-").lower()
    return f"{dev.type}-{slug}-{allocator_mode(dev)}"


def calibration_path(device: torch.device | str = "cpu") -> Path:
    return kind_path(machine_kind(device))


def kind_path(kind: str) -> Path:
    """The stored calibration of machine kind ``kind``."""
    return cache_root("calibration") / f"{kind}.json"


#: the widest DAG state (hidden channels) of the ``dag-narrow`` heap family
DAG_NARROW = 16

#: the fewest groups of the ``gsr-many`` heap family
GSR_MANY_GROUPS = 4


def heap_families(strategy: str | None, knobs: dict[str, Any] | None
                  ) -> list[str]:
    """The op mixes whose heap factor applies to a run, most specific first.

    Under glibc's default allocator the C heap's resident size over its
    high-water depends on the order and sizes of a step's blocks, i.e. on
    the model: measured through the Trainer x1.4 for GAT, x1.6 for GCN, x2.0
    for GSR, x2.2 for residual SAGE, x2.4 for plain SAGE and x2.5 for residual
    GCN stacks. Keys: the model
    (``sage``, ``gcn``, ``gat``, ...), for the deep models with their conv
    (``res-sage``, ``gsr-gcn``, then ``res``; GSR with
    :data:`GSR_MANY_GROUPS` groups or more ``gsr-many``, then ``gsr``), for
    the DAG model its state
    width (``dag-narrow`` up to :data:`DAG_NARROW` channels, else
    ``dag-wide``; then ``dag``), and ``prune-`` before each for
    DPR's core (trained through a sparse adjacency: another op mix), then
    ``prune`` (a core kept as an edge list, ``sparse_adj=False``, has the
    model's own). A user's model is of our registry's ``family`` where it is
    one of its classes (:func:`~leangnn.plan.families.calibrated_as`); empty for
    a model of its own (its ``model`` is no registered name).
    """
    knobs = knobs or {}
    model = knobs.get("family") or knobs.get("model")
    if not model:
        return []
    fams = [model]
    if model == "gsr" and int(knobs.get("num_groups") or 2) >= GSR_MANY_GROUPS:
        # Each layer's state is split and concatenated group by group: many
        # more blocks of several sizes, which the compact heap fragments
        # more per byte (measured through `leangnn train`, 6 layers, 64
        # channels, five circuits of 37k-124k nodes: with 4 groups 19-25%
        # over what the 2-group runs' factor gave, with 8 groups 18%, with
        # 2 groups of the same width 0-7%). Fitted on runs of its own
        # (compact heap x1.59 where 2 groups have x1.24)
        fams.insert(0, "gsr-many")
    elif model in ("res", "gsr"):
        fams.insert(0, f"{model}-{knobs.get('conv') or 'sage'}")
    if model == "dag":
        # its per-level blocks are level width x channels: narrow states
        # fragment the heap more per byte (measured x1.54-1.72 at 8-16
        # channels, x1.29-1.40 at 32-64)
        narrow = int(knobs.get("hidden_channels") or 32) <= DAG_NARROW
        fams.insert(0, "dag-narrow" if narrow else "dag-wide")
    if csr_core(strategy, knobs):
        # (a core kept as an edge list runs the model's full-batch op mix)
        fams = [f"prune-{f}" for f in fams] + ["prune"]
    return fams


def csr_core(strategy: str | None, knobs: dict[str, Any]) -> bool:
    """Whether a row of ``strategy`` with ``knobs`` trains on DPR's core
    through its CSR adjacency (the ``prune`` op mixes; a core kept as an
    edge list, ``sparse_adj=False``, runs the model's full-batch ones)."""
    return strategy == "prune" and knobs.get("sparse_adj") is not False


#: epochs of the calibration runs: a plan for a longer run adds the
#: long-run scale (:meth:`Calibration.long_run_scale`)
SHORT_RUN_EPOCHS = 3

#: the heap model's floor is named in a plan row's detail
#: (``Estimate.floor_decided``) when it raised the need by at least this
#: share and this many bytes
FLOOR_DETAIL_SHARE = 0.05
FLOOR_DETAIL_BYTES = 1 << 20


@dataclass
class Calibration:
    """Allocator overhead and time coefficients of one machine kind.

    Attributes:
        kind (str): :func:`machine_kind`.
        allocator (str): :func:`allocator_mode`.
        scale, const: measured run bytes ``= scale x tensor bytes + const``.
        family_consts (dict): CPU: the first-run constant (``const``: code
            paged in, one-time buffers) of the op mixes that have a tiny
            calibration run of their own (:func:`heap_families`: ``"gsr"``,
            ``"res"``, ``"dag"``, ``"prune"``, ...), the most specific
            applying; ``const`` (a plain model's) for the rest. Measured
            through ``leangnn train`` on iscas85/c17 (3 processes each):
            SAGE-2 7.9 MiB, GSR-4 10.1, the DAG model 9.6, ResGNN-8 9.0,
            its DPR core 8.5; one constant left small GSR and DAG runs
            12-20% under.
        in_process_bytes (float): CPU: what a plan made in the process that
            then trains (``leangnn train --strategy auto``,
            :func:`~leangnn.plan.user.fit`) has already paid of the run's
            first-run constant (its dry runs page in much of the same code);
            :meth:`in_process` takes it off. Measured 3.0-4.2 MiB on tiny
            runs of four models, the same run planned in process and not
            (median 3.4 MiB).
        in_process_core_bytes (float, optional): the same for a pick that
            trains on DPR's core (``prune`` op mixes), whose dry runs page
            in less of what that training runs (the core's sparse products
            and DPR's serving are not run for real in a dry run); ``None``:
            :attr:`in_process_bytes`. Measured through ``leangnn train``,
            five graphs where ``--strategy auto`` picks a core (GSR, GCN,
            SAGE, ResGNN), 3 processes each against the same core pinned
            (``benchmarks/plan_in_process.py``): median 2.7 MiB in the
            compact heap, 2.5 MiB in the default one, where the exact
            picks' 3.4 MiB left those picks 6-17% under (stop 42). A
            machine's own calibration scales its exact share by the
            reference's ratio (:func:`~leangnn.plan.calibrate.core_share`).
        setup_const (float): CPU: what offload's setup keeps beyond the
            engine's own accounting of it
            (:func:`~leangnn.plan.estimate.engine_setup_bytes`), the median
            over the offload calibration runs: measured 3.0-4.9 MiB on
            eleven of them (circuits and csbm graphs, 4-8 parts; median
            3.5), the three processes of each within 0.1 MiB; a constant,
            not a share.
        budget_scale (float): what a plan's need is of its estimate, when
            it is compared with the budget: on CUDA the device memory held
            per byte measured (reserved over allocated); on a CPU the margin
            for process-to-process spread and the estimate's own error
            (:func:`_spread_margin`: highest process over estimate; 1 when
            the calibration ran each configuration once).
        per_op, per_byte, per_flop (float): seconds per traced op, byte
            written and FLOP.
        per_cold_byte (float): seconds per byte written into a new storage
            of :data:`~leangnn.plan.fake.COLD_BYTES` or more, on top of
            ``per_byte`` (``work["cold_written"]``: past the core's caches).
        per_big_byte (float): seconds per byte written into a new storage at
            or above the heap threshold (``work["big_written"]``), on top of
            ``per_byte``: such a block is fresh pages from the kernel, each
            faulted in as it is first written (~0.55 ns/B more than a write
            into resident memory on the reference box's VM: csbm:100000's
            message tensors, not the small graphs' heap blocks).
        per_sparse_flop (float): seconds per FLOP of a product with a sparse
            matrix, on top of ``per_flop`` (``work["sparse_flops"]``): GSR's
            CSR kernels and DPR's core adjacency gather rows spread over
            memory, a dense product's FLOPs do not.
        offload_scale, per_job (float): offload epoch ``= offload_scale x``
            the full-batch time of its work ``+ per_job x jobs``, the work's
            large blocks a chunk in size
            (:func:`~leangnn.plan.estimate.chunked_work`).
        offload_bytes_scale (float): measured over estimated bytes of offload
            runs, whose estimate is the engine's budget accounting (an upper
            bound by design: safety margins on every job's workspace), or of
            their device side when ``offload_host_scale`` is set.
        offload_host_scale (float, optional): the same for the host store
            (zero-filled gradient arrays are resident only once written).
        offload_scales (dict, optional): ``offload_bytes_scale`` per model
            (``"offload-sage"``, ...: :func:`heap_families` of the run), the
            least-relative-error scale over its calibration runs (with
            :attr:`offload_edge_scales` beside it where a model has four
            runs: x1.20 for SAGE, x1.31 for GCN); ``"offload"``: all runs
            pooled, for a model without runs of its own.
        offload_device_scales (dict, optional): per model as
            ``offload_scales``, a second coefficient on the step's device
            bytes (``work["device_bytes"]``: the job workspace and pool):
            measured = ``offload_scales`` x step + this x device bytes +
            ``const``. On a CPU under glibc's default heap a job's blocks
            come from the heap and fragment in proportion to their size: a
            large budget with few chunks (csbm:20000, SAGE-3 at 60 MiB: 8
            chunks) measured 1.6-2.8x the one-scale estimate, many chunks
            1.0-1.1x. Fitted where a model has four runs or more.
        heap_edge_scales (dict, optional): per op mix as ``heap_scales``, the
            factor of the heap's edge-sized share (``Estimate.heap_edge_share``:
            ``E x C`` messages); ``heap_scales`` is then the node-sized
            share's (:func:`family_heap_factors`; measured on GSR: x2.18 and
            x1.42).
        offload_edge_scales (dict, optional): per model as
            ``offload_scales``, a coefficient on a job's edge-sized bytes
            (``work["edge_job_bytes"]``, :func:`~leangnn.plan.estimate.
            job_edge_bytes`) in place of the device bytes: a job's ``E_c x
            C`` blocks are freed job by job and the next job's kept rows
            split their holes, so the heap grows by a few of them (the
            mechanism of :mod:`~leangnn.plan.heapsim`). It is what set the
            dense csbm graphs (~24 edges per node: GCN measured 2.1-3.1x its
            accounting) apart from circuits (~1.5: 1.2-1.4x), which one
            scale per model could not serve both.
        heap_scale (float, optional): CPU: resident bytes per byte of the C
            heap's high-water (freed small blocks stay resident and
            fragment); measured = big bytes + ``heap_scale`` x heap bytes +
            const replaces ``scale`` when set.
        heap_scales (dict, optional): the same per op mix
            (:func:`heap_families`: ``"gat"``, ``"res-sage"``,
            ``"prune-sage"``, ...), measured under glibc's default allocator,
            whose fragmentation depends on the model (x1.4 for GAT to x2.5
            for residual GCN stacks), each the factor of least relative error
            over its calibration runs; ``heap_scale`` for the rest.
        long_run_epochs (int): epochs of the long calibration runs that
            measured :attr:`long_run_scales` (``0``: not measured). The
            scales apply to runs over :data:`SHORT_RUN_EPOCHS` epochs, those
            of the calibration runs the other figures come from.
        long_run_scales (dict): CPU: a long run's peak over the peak of its
            first :data:`SHORT_RUN_EPOCHS` epochs, per run family
            (:func:`long_run_families`; ``"*"``: all runs), the median
            ratio of its calibration runs. Under glibc's default
            heap a run's peak creeps up for ~10 epochs (itc99/b22, GSR-16:
            33 MiB after 3 epochs, 43 MiB from epoch 13 on, measured through
            the Trainer); a plan for a longer run multiplies its need by it.
        time_scales (dict): measured over estimated epoch time of the op
            mixes in :data:`TIMED_FAMILIES`, the median over their runs: the
            DAG model's level loop runs Python between its ops (x1.4-2.1 on
            its calibration runs), which per-op, per-byte and per-FLOP costs
            fitted on the other models do not see.
        collectives (dict): per ``"backend:P"``
            (:func:`~leangnn.plan.collectives.comm_key`), what ``P`` local
            ranks pay beyond their compute
            (:class:`~leangnn.plan.collectives.CollectiveCost`: collective
            latency and per-byte cost, the co-running slowdown), measured by
            ``python -m leangnn.plan.calibrate --collectives P``.
        calibrated (bool): measured (``False``: defaults).
        reference (str): for a shipped reference calibration, the machine it
            was measured on; empty when measured on this machine.
        measured_at (str): when the whole calibration was measured.
        refitted (dict): what a partial calibration (``--time-only``,
            ``--family``, ``--long-runs``) fitted again since, and when.
        error (dict): median and worst relative error of the fit.
        samples (list): the measurements fitted.
    """

    kind: str
    allocator: str
    scale: float = 1.0
    const: float = 0.0
    family_consts: dict[str, float] = field(default_factory=dict)
    in_process_bytes: float = 0.0
    in_process_core_bytes: float | None = None
    setup_const: float = 0.0
    budget_scale: float = 1.0
    per_op: float = 3e-5
    per_byte: float = 1e-9
    per_flop: float = 2e-10
    per_cold_byte: float = 0.0
    per_big_byte: float = 0.0
    per_sparse_flop: float = 0.0
    offload_scale: float = 2.0
    per_job: float = 2e-3
    offload_bytes_scale: float = 1.0
    offload_host_scale: float | None = None
    heap_scale: float | None = None
    heap_scales: dict[str, float] = field(default_factory=dict)
    heap_edge_scales: dict[str, float] = field(default_factory=dict)
    offload_scales: dict[str, float] = field(default_factory=dict)
    offload_device_scales: dict[str, float] = field(default_factory=dict)
    offload_edge_scales: dict[str, float] = field(default_factory=dict)
    long_run_epochs: int = 0
    long_run_scales: dict[str, float] = field(default_factory=dict)
    time_scales: dict[str, float] = field(default_factory=dict)
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)
    calibrated: bool = False
    reference: str = ""
    measured_at: str = ""
    refitted: dict[str, str] = field(default_factory=dict)
    error: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def default(cls, device: torch.device | str = "cpu") -> Calibration:
        """Uncalibrated: the allocator mode's default scale; on CUDA the
        first-run constant is cuBLAS' workspaces by PyTorch's rule (a
        calibration measures it with the rest)."""
        from leangnn.blas_workspace import blas_workspace_bytes

        mode = allocator_mode(device)
        return cls(machine_kind(device), mode, scale=_DEFAULT_SCALE.get(mode, 1.0),
                   const=float(blas_workspace_bytes(device)))

    # ------------------------------------------------------------ applying
    def first_run_const(self, families: list[str] | tuple[str, ...] = ()) -> float:
        """The first-run constant of a run of op mixes ``families`` (most
        specific first): the first of them in :attr:`family_consts`, else
        :attr:`const`."""
        for fam in families:
            if fam in self.family_consts:
                return float(self.family_consts[fam])
        return self.const

    def in_process_share(self, strategy: str | None = None) -> float:
        """What a plan made in the training process has paid of a run of
        ``strategy``'s first-run constant: :attr:`in_process_core_bytes` for
        ``prune`` where measured, else :attr:`in_process_bytes`."""
        if strategy == "prune" and self.in_process_core_bytes is not None:
            return self.in_process_core_bytes
        return self.in_process_bytes

    def in_process(self) -> Calibration:
        """This calibration for a run that trains in the process that
        planned it: every first-run constant less :attr:`in_process_bytes`,
        DPR's core's (``prune`` op mixes) less :meth:`in_process_share`
        of ``prune`` (never below zero); itself when both are zero."""
        cut, core = self.in_process_bytes, self.in_process_share("prune")
        if not cut and not core:
            return self

        def less(fam: str, v: float) -> float:
            mine = core if fam == "prune" or fam.startswith("prune-") else cut
            return max(0.0, v - mine)

        return replace(self, const=max(0.0, self.const - cut),
                       family_consts={k: less(k, v)
                                      for k, v in self.family_consts.items()},
                       in_process_bytes=0.0, in_process_core_bytes=0.0)

    def heap_factor(self, families: list[str] | tuple[str, ...] = (),
                    edge_share: float = 0.0) -> float | None:
        """The heap factor of the most specific of ``families`` calibrated
        (:func:`heap_families`), else :attr:`heap_scale`; where that family
        has an edge factor (:attr:`heap_edge_scales`), the mean of the two
        weighted by ``edge_share``, the share of the heap's high-water in
        edge-sized tensors."""
        for fam in families:
            if fam in self.heap_scales:
                edge = self.heap_edge_scales.get(fam)
                if edge is None:
                    return self.heap_scales[fam]
                s = min(1.0, max(0.0, float(edge_share)))
                return (1.0 - s) * self.heap_scales[fam] + s * edge
        return self.heap_scale

    def overhead(self, tensor_bytes: int, big: int = 0, heap: int = 0,
                 families: list[str] | tuple[str, ...] = (), floor: int = 0,
                 edge_share: float = 0.0) -> int:
        """Allocator bytes on top of ``tensor_bytes`` (never below -it);
        ``families`` (:func:`heap_families`) select the heap factor, and the
        resident step is at least ``floor`` (the heap model's,
        :class:`~leangnn.plan.heapsim.HeapModel`)."""
        const = self.first_run_const(families)
        factor = self.heap_factor(families, edge_share)
        if factor is not None and (big or heap):
            resident = big + factor * heap
            if self.allocator == "glibc-default":
                # the model follows glibc's dynamic threshold; with a fixed
                # one the heap holds small blocks only and the factor is ~1
                resident = max(resident, floor)
        else:
            resident = self.scale * tensor_bytes
        return max(-tensor_bytes, round(resident - tensor_bytes + const))

    def offload_bytes(self, step_bytes: float, work: dict,
                      families: list[str] | tuple[str, ...] = ()) -> float:
        """Measured bytes of an offload step from its accounting (plus the
        first-run constant every run pays); ``families`` select a per-model
        scale (:attr:`offload_scales`). The step's blocks glibc maps apart
        (``work["mapped_bytes"]``) are resident as they are: no heap factor
        scales them."""
        if self.offload_host_scale is not None and "host_bytes" in work:
            return (self.offload_bytes_scale * work["device_bytes"]
                    + self.offload_host_scale * work["host_bytes"] + self.const)
        mapped = min(float(work.get("mapped_bytes", 0)), float(step_bytes))
        heap = step_bytes - mapped
        fam = next((f"offload-{f}" for f in families
                    if f"offload-{f}" in self.offload_scales), None)
        if fam is None and "offload" in self.offload_scales:
            fam = "offload"  # the runs of every model, pooled
        if fam is None:
            return self.offload_bytes_scale * heap + mapped + self.const
        device = self.offload_device_scales.get(fam, 0.0) * work.get(
            "device_bytes", 0)
        edges = self.offload_edge_scales.get(fam, 0.0) * work.get("edge_job_bytes", 0)
        return self.offload_scales[fam] * heap + mapped + device + edges + self.const

    def seconds(self, work: dict[str, float],
                families: list[str] | tuple[str, ...] = ()) -> float | None:
        """Epoch seconds of traced ``work`` (``None`` without any), times the
        time scale of the first of ``families`` that has one."""
        if not work or "ops" not in work:
            return None
        t = self.compute_seconds(work)
        if "jobs" in work:
            t = self.offload_scale * t + self.per_job * work["jobs"]
        scale = next((self.time_scales[f] for f in families
                      if f in self.time_scales), 1.0)
        return float(t * scale)

    def compute_seconds(self, work: dict[str, float]) -> float:
        """The full-batch time terms of ``work`` (:data:`_TIME_TERMS`), before
        offload's and the op mixes' scales."""
        return sum(getattr(self, name) * work.get(k, 0) for k, name in _TIME_TERMS)

    def fit_time_scales(self, samples: list[dict[str, Any]]) -> None:
        """:attr:`time_scales` of the :data:`TIMED_FAMILIES` with runs among
        ``samples`` (with their ``work`` and ``epoch_seconds``)."""
        for fam in TIMED_FAMILIES:
            ratios = [s["epoch_seconds"] / t for s in samples
                      if fam in sample_families(s)
                      and (t := self.seconds(s["work"])) and s.get("epoch_seconds")]
            if ratios:
                self.time_scales[fam] = float(np.median(ratios))

    def collective_cost(self, backend: str, nproc: int) -> CollectiveCost | None:
        """What ``nproc`` ranks on ``backend`` cost beyond compute: measured
        at ``nproc``, else at the nearest ``P`` measured on that backend
        (its ``nproc`` says which), else ``None``."""
        measured = []
        for d in self.collectives.values():
            try:  # a damaged entry is left out, as a damaged file is
                measured.append(CollectiveCost.from_dict(d))
            except ValueError:
                continue
        measured = [c for c in measured if c.backend == backend]
        if not measured:
            return None
        return min(measured, key=lambda c: (abs(c.nproc - nproc), -c.nproc))

    def long_run_scale(self, families: list[str] | tuple[str, ...] = (),
                       epochs: int | None = None) -> float:
        """What a run of ``epochs`` epochs (``None``: unknown, taken as long)
        peaks at over its first :data:`SHORT_RUN_EPOCHS`: the most specific
        of ``families`` measured (:func:`long_run_families`), else ``"*"``;
        1 for a short run or without long calibration runs."""
        if not self.long_run_scales or (
                epochs is not None and epochs <= SHORT_RUN_EPOCHS):
            return 1.0
        for fam in [*families, "*"]:
            if fam in self.long_run_scales:
                return max(1.0, float(self.long_run_scales[fam]))
        return 1.0

    def apply(self, est) -> None:
        """Fill ``est``'s allocator overhead and epoch time in place."""
        fams = heap_families(est.strategy, est.knobs)
        if est.method == "offload-accounting":
            est.overhead_bytes = round(self.offload_bytes(
                est.step_bytes, est.work, fams) - est.step_bytes)
            est.setup_overhead_bytes = round(self.setup_const) \
                if est.setup_bytes else 0
        else:
            floor, share = est.floor_bytes, est.heap_edge_share
            est.overhead_bytes = self.overhead(est.step_bytes, est.big_bytes,
                                               est.heap_bytes, fams, floor, share)
            without = self.overhead(est.step_bytes, est.big_bytes, est.heap_bytes,
                                    fams, 0, share)
            # (said only where it moved the need by a share worth naming: on a
            # tiny graph it decides by a few KiB of a need made of the
            # constant, and the plan's detail then misled)
            raised = est.overhead_bytes - without
            est.floor_decided = bool(floor) and raised >= max(
                FLOOR_DETAIL_BYTES, FLOOR_DETAIL_SHARE * (est.step_bytes + without))
            # a precomputation outside torch (numpy) peaks before the step's
            # tensors do; its large arrays are pages of their own
            if est.precompute_bytes:
                est.overhead_bytes = max(est.overhead_bytes, round(
                    est.precompute_bytes + self.first_run_const(fams))
                    - est.step_bytes)
            if est.later is not None:
                step, big, heap = est.later
                later_floor = floor and floor + max(0, big - est.big_bytes)
                est.later_run_bytes = step + self.overhead(step, big, heap, fams,
                                                           later_floor, share)
        est.epoch_seconds = self.seconds(est.work, fams)
        hint = ""
        if not self.calibrated:
            hint = (f"uncalibrated ({self.kind}): run python -m "
                    "leangnn.plan.calibrate")
        elif self.reference:
            hint = (f"reference calibration ({self.reference}): run python -m "
                    "leangnn.plan.calibrate to measure this machine")
        if hint:
            est.note = f"{est.note}; {hint}" if est.note else hint

    # ------------------------------------------------------------- storage
    def origin(self) -> str:
        """Where and when it was measured (and what was fitted again since):
        a shipped reference's ``reference``."""
        again = "; ".join(f"{what} {when}" for what, when in sorted(
            self.refitted.items()))
        return f"{self.kind}, {self.measured_at}" + (f" (refitted: {again})"
                                                     if again else "")

    def stamp(self, what: str) -> None:
        """Record that ``what`` (e.g. ``"time"``, ``"heap gsr"``) was fitted
        again now, the rest kept."""
        self.refitted[what] = time.strftime("%Y-%m-%d %H:%M:%S")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        """The calibration stored as ``d`` (unknown keys ignored, missing
        ones at their defaults).

        Raises:
            ValueError: a field of the wrong kind (e.g. a string where a
                number belongs, a non-finite coefficient), naming it.
        """
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        return cls(**{f.name: _checked_field(f.name, d[f.name]) for f in fields(cls)
                      if f.name in d})

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path) if path else kind_path(self.kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def _checked_field(name: str, value: Any) -> Any:
    """``value`` as the type of :class:`Calibration`'s field ``name`` (a
    stored file's damage found when it is read, not as a bare ``TypeError``
    in the middle of a plan): its scalars checked as a configuration's are,
    its records as JSON objects or arrays.

    Raises:
        ValueError: naming the field, what was expected and ``value``.
    """
    from leangnn.config import checked_scalar

    hint = _field_hints()[name]
    label = f"field {name!r}"
    want = {dict: "a JSON object", list: "a JSON array"}.get(typing.get_origin(hint))
    if want is None:
        value = checked_scalar(label, value, hint)
        if name.endswith("_bytes") and value is not None and value < 0:
            # (a negative share would raise every in-process estimate)
            raise ValueError(f"{label}: expected a number of bytes >= 0, got "
                             f"{value!r}")
        return value
    if not isinstance(value, typing.get_origin(hint)):
        raise ValueError(f"{label}: expected {want}, got {value!r}")
    return value


@functools.cache
def _field_hints() -> dict[str, Any]:
    return typing.get_type_hints(Calibration)


def load_calibration(device: torch.device | str = "cpu",
                     reference: bool = True) -> Calibration:
    """This machine kind's stored calibration, else (``reference``) the
    shipped one of its allocator mode (:func:`reference_calibration`), else
    :meth:`Calibration.default` (a damaged file is ignored)."""
    path = calibration_path(device)
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError) as e:
        import warnings

        warnings.warn(f"{path}: damaged calibration ignored ({e}); run python -m "
                      "leangnn.plan.calibrate to measure this machine again",
                      stacklevel=2)
    ref = reference_calibration(device) if reference else None
    return ref or Calibration.default(device)


def calibration_label(cal: Calibration) -> str:
    """What a plan says it was calibrated with."""
    if not cal.calibrated:
        return "uncalibrated"
    label = f"reference {cal.kind}" if cal.reference else cal.kind
    if cal.budget_scale != 1.0:
        label += f"; need = estimate x{cal.budget_scale:.2f}"
    if cal.long_run_scales:
        scales = [max(1.0, v) for v in cal.long_run_scales.values()]
        label += (f", x{min(scales):.2f}-{max(scales):.2f} more for runs over "
                  f"{SHORT_RUN_EPOCHS} epochs")
    return label


def long_run_families(strategy: str | None, knobs: dict[str, Any] | None
                      ) -> list[str]:
    """The families whose long-run scale applies to a run, most specific
    first: :func:`heap_families`, with ``offload-`` before each for offload
    (its blocks are the engine's, not a full-batch step's)."""
    fams = heap_families(strategy, knobs)
    return [f"offload-{f}" for f in fams] if strategy == "offload" else fams


def reference_calibration(device: torch.device | str = "cpu") -> Calibration | None:
    """The calibration shipped for this device's allocator mode, measured on
    the reference machine (``reference`` names it), or ``None`` (CUDA, other
    allocators: nothing shipped)."""
    path = REFERENCE_DIR / f"{allocator_mode(device)}.json"
    try:
        cal = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not cal.calibrated:
        return None
    cal.reference = cal.reference or cal.origin()
    return cal


# ------------------------------------------------------------------- fitting
#: a heap factor below 1 means the run reused heap the estimate counts as
#: new (freed before the meter started); not less than half of it
_MIN_HEAP_FACTOR = 0.5


#: offload runs a model needs before its edge-sized job bytes (or, in older
#: samples, its device bytes) get a coefficient of their own
#: (:attr:`Calibration.offload_edge_scales`)
_MIN_OFFLOAD_PAIR = 4


def sample_families(s: dict[str, Any]) -> list[str]:
    """The heap families of a calibration sample: as stored, else its
    configuration's."""
    if "families" in s:
        return list(s["families"])
    c = s.get("config") or {}
    return heap_families(c.get("strategy"), c)


def _relative_lstsq(a: np.ndarray, y: np.ndarray, nonneg: bool,
                    measured: np.ndarray | None = None) -> np.ndarray:
    # errors relative to ``measured`` (default ``y``): a prediction's error
    # as a share of what was measured, however much of it ``y`` leaves out
    w = 1.0 / np.maximum(y if measured is None else measured, 1e-12)
    aw, yw = a * w[:, None], y * w
    if nonneg:
        from scipy.optimize import nnls

        return nnls(aw, yw)[0]
    return np.linalg.lstsq(aw, yw, rcond=None)[0]


def _relative_factor(x: list[float], y: list[float], measured: list[float]
                     ) -> float:
    """The ``f`` of least relative error ``sum(((f x - y) / measured)^2)``
    (``y``: a run's measured bytes less what ``f x`` does not cover, so the
    residual is the prediction's error): each run's own ``y / x`` weighted
    by ``(x / measured)^2``, the share of the measurement ``x`` stands for."""
    x_, y_ = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    w = 1.0 / np.maximum(np.asarray(measured, dtype=float), 1.0) ** 2
    den = float(np.sum(w * x_ * x_))
    return float(np.sum(w * x_ * y_) / den) if den > 0 else 0.0


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred - y) / np.maximum(y, 1)
    return {"median": float(np.median(rel)), "worst": float(rel.max())}


#: op mixes whose epoch time gets a scale of its own (:attr:`Calibration.
#: time_scales`): the DAG model's Python level loop
TIMED_FAMILIES = ("dag",)

#: a calibration run's heap high-water from which its heap factor is fitted
#: (below, the first-run constant and the spread between processes hide it)
HEAVY_HEAP_BYTES = 8 << 20


#: a first-run constant: bytes, or a sample's families -> bytes
#: (:meth:`Calibration.first_run_const`)
FirstRunConst = float | Callable[[list[str]], float]


def _const_of(const: FirstRunConst, s: dict[str, Any]) -> float:
    return const(sample_families(s)) if callable(const) else const


def family_heap_factor(samples: list[dict[str, Any]], const: FirstRunConst
                       ) -> float:
    """The heap factor of one op mix's calibration ``samples`` (each with
    ``run_bytes``, ``big_bytes`` and ``heap_bytes``) under the first-run
    constant ``const``: the one of least relative error over them."""
    return max(_MIN_HEAP_FACTOR, _relative_factor(
        [s["heap_bytes"] for s in samples],
        [s["run_bytes"] - s["big_bytes"] - _const_of(const, s) for s in samples],
        [s["run_bytes"] for s in samples]))


#: runs an op mix needs, their edge shares at least this far apart, before
#: its heap factor is split into a node- and an edge-sized part
_MIN_EDGE_RUNS, _MIN_EDGE_SPREAD = 4, 0.3


def family_heap_factors(samples: list[dict[str, Any]], const: FirstRunConst,
                        parent: tuple[float, float] | None = None
                        ) -> tuple[float, float | None]:
    """``(factor, edge factor)`` of one op mix's calibration ``samples``: the
    edge factor (``None``: one factor) applies to the share of the heap's
    high-water in edge-sized tensors (``heap_edge_share``).

    Why: a GSR step whose heap is mostly ``E x C`` messages (dense csbm
    graphs, shares 0.5-0.8) measured x1.5-1.8 of it, one mostly of node-sized
    blocks (circuits, 0.03-0.2) x1.9-2.8: one factor was 25% over on
    csbm:100000 and 5-15% under on the circuits. Fitted where the runs span
    shares :data:`_MIN_EDGE_SPREAD` apart; a finer op mix with fewer runs
    takes its ``parent``'s split, scaled to its runs.
    """
    shares = [s.get("heap_edge_share") for s in samples]
    heap = [s["heap_bytes"] for s in samples]
    y = [s["run_bytes"] - s["big_bytes"] - _const_of(const, s) for s in samples]
    m = [s["run_bytes"] for s in samples]
    if any(x is None for x in shares):
        return family_heap_factor(samples, const), None
    if len(samples) >= _MIN_EDGE_RUNS and max(shares) - min(shares) >= _MIN_EDGE_SPREAD:
        a = np.array([[h * (1 - x), h * x] for h, x in zip(heap, shares)], dtype=float)
        node, edge = _relative_lstsq(a, np.asarray(y, dtype=float), True,
                                     np.asarray(m, dtype=float))
        if node > 0 and edge > 0:
            return (max(_MIN_HEAP_FACTOR, float(node)),
                    max(_MIN_HEAP_FACTOR, float(edge)))
    if parent is not None:
        node, edge = parent
        k = _relative_factor([h * ((1 - x) * node + x * edge)
                              for h, x in zip(heap, shares)], y, m)
        return max(_MIN_HEAP_FACTOR, k * node), max(_MIN_HEAP_FACTOR, k * edge)
    return family_heap_factor(samples, const), None


def fit_heap_families(by_fam: dict[str, list[dict[str, Any]]],
                      const: FirstRunConst
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """:attr:`Calibration.heap_scales` and :attr:`~Calibration.heap_edge_scales`
    of the op mixes ``by_fam`` (name -> samples), each coarse one (``gsr``)
    before its finer ones (``gsr-sage``), which take its split where they
    cannot fit their own."""
    scales: dict[str, float] = {}
    edges: dict[str, float] = {}
    for fam in sorted(by_fam, key=lambda f: (f.count("-"), f)):
        up = fam.rsplit("-", 1)[0] if "-" in fam else None
        parent = (scales[up], edges[up]) if up in edges else None
        scales[fam], edge = family_heap_factors(by_fam[fam], const, parent)
        if edge is not None:
            edges[fam] = edge
    return scales, edges


#: a calibration run's key (beside its configuration) that has it trained
#: through ``leangnn train --strategy auto``, planned in the process that
#: trains (:attr:`Calibration.in_process_bytes`)
PLANNED = "planned_in_process"


def is_planned(s: dict[str, Any]) -> bool:
    """Whether calibration sample ``s`` was planned in its own process."""
    return bool((s.get("config") or {}).get(PLANNED))


def _without_planned(s: dict[str, Any]) -> str:
    c = {k: v for k, v in (s.get("config") or {}).items() if k != PLANNED}
    return json.dumps(c, sort_keys=True)


def _first_run_rest(s: dict[str, Any]) -> float:
    return s["run_bytes"] - s["big_bytes"] - s["heap_bytes"]


def is_tiny(s: dict[str, Any]) -> bool:
    """Whether calibration sample ``s`` has next to no tensors (under 1 MiB
    of big blocks and heap): what it measured is its first-run constant."""
    return s.get("heap_bytes") is not None and \
        s.get("big_bytes", 0) + s["heap_bytes"] < 1 << 20


def family_first_run(tiny: list[dict[str, Any]]) -> dict[str, float]:
    """:attr:`Calibration.family_consts` from ``tiny`` runs: every op mix of
    the runs of more than one (``["gsr-sage", "gsr"]``), the median of
    its runs' first-run constants."""
    by_fam: dict[str, list[float]] = {}
    for s in tiny:
        fams = sample_families(s)
        if len(fams) > 1 and not is_planned(s):
            for fam in fams:
                by_fam.setdefault(fam, []).append(_first_run_rest(s))
    return {f: float(np.median(v)) for f, v in sorted(by_fam.items())}


def fit_first_run(cal: Calibration, tiny: list[dict[str, Any]],
                  planned: list[dict[str, Any]] = ()) -> None:
    """Set ``cal``'s first-run constants from its ``tiny`` runs (next to no
    tensors: what is left of a run is code paged in and one-time buffers)
    and its ``planned`` ones (:data:`PLANNED`).

    :attr:`~Calibration.const` is the median of the plain models' tiny runs
    (one op mix: ``["sage"]``; all tiny runs where none is plain);
    :attr:`~Calibration.family_consts` every op mix of the deeper ones
    (``["gsr-sage", "gsr"]``), the median of its runs: a GSR run pages in
    more code than a SAGE-2 run (2-3 MiB measured, a share that decides
    small runs). :attr:`~Calibration.in_process_bytes` is the median, over
    the planned runs, of how much less they measured than the same
    configuration trained without a plan in its process.
    """
    if not tiny:
        cal.const, cal.family_consts, cal.in_process_bytes = 0.0, {}, 0.0
        return
    plain = [s for s in tiny if len(sample_families(s)) <= 1] or tiny
    cal.const = float(np.median([_first_run_rest(s) for s in plain]))
    cal.family_consts = family_first_run(tiny)
    direct = {_without_planned(s): s for s in tiny}
    cuts = [direct[_without_planned(s)]["run_bytes"] - s["run_bytes"]
            for s in planned if _without_planned(s) in direct]
    cal.in_process_bytes = max(0.0, float(np.median(cuts))) if cuts else 0.0


def fit_calibration(samples: list[dict[str, Any]], device="cpu") -> Calibration:
    """Fit a :class:`Calibration` to measured ``samples`` (each with
    ``tensor_bytes``, ``run_bytes``, ``work``, ``epoch_seconds`` and, on
    CUDA, ``reserved_bytes`` / ``allocated_bytes``)."""
    cal = Calibration.default(device)
    cal.calibrated, cal.samples = True, samples
    cal.measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
    cal.refitted = {}
    # runs planned in their own process price that alone (fit_first_run)
    planned = [s for s in samples if is_planned(s)]
    samples = [s for s in samples if not is_planned(s)]
    plain = [s for s in samples if "jobs" not in s.get("work", {})]
    off = [s for s in samples if "jobs" in s.get("work", {})]
    x = np.array([s["tensor_bytes"] for s in plain], dtype=float)
    y = np.array([s["run_bytes"] for s in plain], dtype=float)
    heap = [s for s in plain if s.get("heap_bytes") is not None]
    heavy = [s for s in heap if s["heap_bytes"] >= HEAVY_HEAP_BYTES]
    # (the compact heap holds every block below 32 MiB too, fragmenting far
    # less: fitted per op mix the same way, x1.15-1.62 against x1.4-3.3)
    if cal.allocator in ("glibc-default", "glibc-compact") and heavy:
        # What a run's meter sees with no tensors to speak of (a tiny
        # circuit: first calls of kernels, validation, checkpoint writing;
        # measured ~8 MiB through the Trainer) is a constant of its own ...
        fit_first_run(cal, [s for s in heap if is_tiny(s)], planned)
        # ... and every block up to 32 MiB comes from the heap, which
        # fragments by a model-dependent factor (measured x1.4 for GAT, x2.5
        # for residual GCN stacks): for a model without runs, the largest, so
        # a plan errs towards not fitting.
        factors = [(s["run_bytes"] - s["big_bytes"]
                    - cal.first_run_const(sample_families(s))) / s["heap_bytes"]
                   for s in heavy]
        cal.heap_scale = max(1.0, max(factors))
        # Per op mix (the model and its conv), for every level of
        # heap_families (``res`` gets all residual runs): the factor that
        # predicts its runs with the least relative error (what a plan is
        # judged by). A run whose heap is a small share of what it measured
        # (big blocks or the constant dominate: a small circuit, a csbm
        # graph's edge-sized blocks) weighs by that share squared; the
        # median of a few runs let one such run's factor, which its
        # process-to-process spread moves most, decide (GCN: x2.0 from a
        # 34 MiB circuit run, x1.4 and x1.8 from larger ones; the median x1.8,
        # fitted x1.6).
        by_fam: dict[str, list[dict[str, Any]]] = {}
        for s in heavy:
            for fam in sample_families(s):
                by_fam.setdefault(fam, []).append(s)
        cal.heap_scales, cal.heap_edge_scales = fit_heap_families(
            by_fam, cal.first_run_const)
    elif cal.allocator.startswith("glibc") and len(heap) >= 2 and \
            len(heap) == len(plain):
        # resident = big blocks + heap_scale x heap high-water + const; the
        # scale is fitted only where the heap is large enough to show it
        # (else 1: the high-water itself)
        b = np.array([s["big_bytes"] for s in plain], dtype=float)
        h = np.array([s["heap_bytes"] for s in plain], dtype=float)
        cal.heap_scale = 1.0
        if len(heavy) >= 2:
            hb = np.array([s["big_bytes"] for s in heavy], dtype=float)
            hh = np.array([s["heap_bytes"] for s in heavy], dtype=float)
            hy = np.array([s["run_bytes"] for s in heavy], dtype=float)
            coef = _relative_lstsq(np.stack([hh, np.ones_like(hh)], 1), hy - hb,
                                   nonneg=False)
            cal.heap_scale = max(1.0, float(coef[0]))
        cal.const = float(np.median(y - b - cal.heap_scale * h))
    elif cal.allocator in ("glibc-mmap", "cuda-caching") and plain:
        # Memory follows the tensors one to one by construction; what is left
        # is a first-run constant (lazily loaded code, thread pools).
        cal.scale, cal.const = 1.0, float(np.median(y - x))
    elif len(plain) >= 2:
        cal.scale, cal.const = (float(v) for v in _relative_lstsq(
            np.stack([x, np.ones_like(x)], 1), y, nonneg=False))
    elif plain:
        cal.scale, cal.const = float(y[0] / max(x[0], 1)), 0.0
    if off:
        fit_offload(cal, off)
        cal.setup_const = fit_setup(off)
    pred = [s["tensor_bytes"] + cal.overhead(
        int(s["tensor_bytes"]), int(s.get("big_bytes") or 0),
        int(s.get("heap_bytes") or 0), sample_families(s))
        if "jobs" not in s["work"] else cal.offload_bytes(
            s["tensor_bytes"], s["work"], sample_families(s))
        for s in samples]
    cal.error = _errors(np.array(pred), np.array([s["run_bytes"] for s in samples],
                                                 dtype=float))
    reserved = [s["reserved_bytes"] / s["allocated_bytes"] for s in samples
                if s.get("reserved_bytes") and s.get("allocated_bytes")]
    if reserved:
        cal.budget_scale = float(max(reserved))
    elif torch.device(device).type == "cpu":
        cal.budget_scale = _spread_margin(samples, pred)
    fit_time(cal, samples)
    cal.fit_time_scales(samples)
    return cal


#: the share of calibration runs whose highest process a plan's need covers
SPREAD_QUANTILE = 0.9


def fit_long_runs(cal: Calibration, runs: list[dict[str, Any]],
                  families: list[str] | None = None) -> dict[str, float]:
    """Set ``cal``'s long-run scales from long runs ``runs`` (each
    ``{"families": long_run_families(...), "epoch_peak_bytes": [...]}``, the
    run's peak after each epoch) and return them; with ``families``, only
    the scales of those op mixes (and their finer ones) from their runs, the
    others' kept.

    A run's ratio is its peak over the peak of its first
    :data:`SHORT_RUN_EPOCHS` epochs; a family's scale is the median ratio of
    the runs in it, ``"*"`` the median over all runs. The median, as the
    estimate is of the median process: the plan's margin for the spread
    between processes (:attr:`Calibration.budget_scale`) is applied once, on
    top. (The largest ratio per family stacked a second margin on it: at 20
    epochs three of twelve ``--strategy auto`` cases then gave up an exact
    pick that fits with 7-44% to spare for DPR's approximate core.)
    """
    if families:
        runs = [r for r in runs if set(families) & set(r.get("families") or ())]
    ratios: list[tuple[list[str], float]] = []
    epochs = 0
    for r in runs:
        peaks = list(r.get("epoch_peak_bytes") or ())
        # an epoch's peak can be missing (None: an older run directory)
        short = max((p for p in peaks[:SHORT_RUN_EPOCHS] if p is not None),
                    default=0)
        if len(peaks) <= SHORT_RUN_EPOCHS or short <= 0:
            continue
        ratios.append((list(r.get("families") or ()),
                       max(p for p in peaks if p is not None) / short))
        epochs = max(epochs, len(peaks))
    if not ratios:
        raise ValueError("fit_long_runs: no run longer than "
                         f"{SHORT_RUN_EPOCHS} epochs with its peaks recorded")
    per: dict[str, list[float]] = {}
    for fams, ratio in ratios:
        for fam in fams:
            per.setdefault(fam, []).append(ratio)
    scales = {fam: max(1.0, float(np.median(v))) for fam, v in per.items()}
    if families:
        cal.long_run_scales.update(scales)
        return scales
    scales["*"] = max(1.0, float(np.median([r for _, r in ratios])))
    cal.long_run_scales, cal.long_run_epochs = scales, epochs
    return scales


def _spread_margin(samples: list[dict[str, Any]],
                   pred: list[float] | None = None) -> float:
    """What a CPU plan's need adds to the estimate: the
    :data:`SPREAD_QUANTILE` quantile of the highest process's peak over the
    estimate (``pred``, in ``samples``' order; default: the median process's
    peak, the spread alone) among the calibration runs measured in three
    processes or more; 1 without repeated runs. Under glibc's default heap
    one command line peaks up to ~25% apart from process to process (hash
    seed, address layout), so a budget met by the median is missed by some
    runs; and the estimate misses the median by its own error, which a
    margin for the spread alone left uncovered (`--strategy auto` on
    s38417, GCN-3 under a 29.1 MiB budget: 29.4 MiB needed, its estimate
    3% under the median process and a spread margin of x1.09 on it)."""
    pred = pred or [s["run_bytes"] for s in samples]
    ratios = [max(s["run_bytes_all"]) / p for s, p in zip(samples, pred)
              if len(s.get("run_bytes_all") or ()) >= 3 and p > 0]
    if not ratios:
        return 1.0
    return max(1.0, float(np.quantile(ratios, SPREAD_QUANTILE)))


def fit_setup(off: list[dict[str, Any]]) -> float:
    """:attr:`Calibration.setup_const` from offload calibration samples
    ``off`` (those with ``setup_bytes`` measured and
    ``estimated_setup_bytes``): the median of what each setup kept beyond
    its accounting; 0 without any."""
    extra = [s["setup_bytes"] - s["estimated_setup_bytes"] for s in off
             if s.get("setup_bytes") is not None
             and s.get("estimated_setup_bytes") is not None]
    return max(0.0, float(np.median(extra))) if extra else 0.0


def fit_offload(cal: Calibration, off: list[dict[str, Any]]) -> None:
    """The offload memory scales of ``cal`` from offload runs ``off`` (after
    ``cal.const``, which they pay too)."""
    # Offload runs pay the same first-run constant on top of their store.
    # One scale for the device side and the host store together (fitted
    # apart on a few runs, one of them came out 0), taken from the run with
    # the most accounted bytes: a small budget's run also keeps state the
    # accounting does not follow (measured through the Trainer: ~29 MiB
    # resident after the first epoch at a 12 MiB budget, 2.3x its
    # accounting), which does not grow with it.
    # (a step's blocks mapped apart are resident as they are: the scales
    # are those of the rest, as Calibration.offload_bytes applies them)
    def mapped(s):
        return min(float(s["work"].get("mapped_bytes", 0)), float(s["tensor_bytes"]))

    top = max(off, key=lambda s: s["tensor_bytes"])
    cal.offload_bytes_scale = max(0.0, top["run_bytes"] - cal.const - mapped(top)) \
        / max(top["tensor_bytes"] - mapped(top), 1)
    cal.offload_host_scale = None
    # per model: what the Trainer keeps beside the engine's accounting
    # depends on the conv and on the graph's density (a job's edge-sized
    # blocks fragment the heap); the scales of least relative error over
    # its runs, as for heap factors
    off_fam: dict[str, list[dict[str, Any]]] = {}
    for s in off:
        for fam in sample_families(s):
            off_fam.setdefault(f"offload-{fam}", []).append(s)
    if all("edge_job_bytes" in s["work"] for s in off):
        # a model without runs of its own (GAT, a user's module): all runs
        # pooled, its edge-sized job bytes counted as theirs are
        off_fam["offload"] = list(off)
    cal.offload_scales, cal.offload_device_scales = {}, {}
    cal.offload_edge_scales = {}
    for k, runs in sorted(off_fam.items()):
        y = [s["run_bytes"] - cal.const - mapped(s) for s in runs]
        m = [s["run_bytes"] for s in runs]
        # the second term: a job's edge-sized bytes where the runs carry them
        # (Calibration.offload_edge_scales), else (older samples) its device
        # bytes
        second = "edge_job_bytes" if all("edge_job_bytes" in s["work"]
                                         for s in runs) else "device_bytes"
        if len(runs) >= _MIN_OFFLOAD_PAIR and all(
                second in s["work"] for s in runs):
            # step and the second term, each a nonnegative coefficient of
            # least relative error (two on three runs would fit noise)
            a = np.array([[s["tensor_bytes"] - mapped(s), s["work"][second]]
                          for s in runs], dtype=float)
            step, two = _relative_lstsq(a, np.asarray(y, dtype=float), True,
                                        np.asarray(m, dtype=float))
            cal.offload_scales[k] = float(step)
            if two > 0:
                (cal.offload_edge_scales if second == "edge_job_bytes"
                 else cal.offload_device_scales)[k] = float(two)
        else:
            cal.offload_scales[k] = max(0.0, _relative_factor(
                [s["tensor_bytes"] - mapped(s) for s in runs], y, m))


#: the traced work the time fit prices, in :class:`Calibration`'s order
_TIME_TERMS = (("ops", "per_op"), ("written", "per_byte"),
               ("cold_written", "per_cold_byte"), ("big_written", "per_big_byte"),
               ("flops", "per_flop"), ("sparse_flops", "per_sparse_flop"))


def _time_terms(samples: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The time terms ``samples`` can fit: ops, bytes and FLOPs always; the
    cold and fresh-page bytes where they are counted apart from the bytes
    before them (on CUDA, without a heap threshold, every byte is "fresh")
    and there are samples enough for them (a quick calibration's four)."""
    base = [t for t in _TIME_TERMS if t[0] in ("ops", "written", "flops")]
    cols = {k: np.array([s["work"].get(k, 0) for s in samples], dtype=float)
            for k, _ in _TIME_TERMS}
    terms, seen = [], []
    for k, name in _TIME_TERMS:
        col = cols[k]
        if (k, name) in base or (col.any() and not any(
                np.allclose(col, cols[j]) for j in seen)):
            terms.append((k, name))
        seen.append(k)
    return terms if len(samples) >= len(terms) else base


def fit_time(cal: Calibration, samples: list[dict[str, Any]]) -> None:
    """Fit ``cal``'s epoch-time terms in place from ``samples`` (their traced
    ``work`` and measured ``epoch_seconds``): the full-batch terms of least
    relative error, non-negative, then offload's scale and per-job cost."""
    # the op mixes with a time scale of their own (the DAG model's Python
    # level loop between its ops) would bend the per-op cost of the rest:
    # they are priced by it afterwards (:meth:`Calibration.fit_time_scales`)
    plain = [s for s in samples if s.get("work") and "jobs" not in s["work"]
             and not set(TIMED_FAMILIES) & set(sample_families(s))]
    terms = _time_terms(plain)
    if len(plain) >= max(3, len(terms)):
        a = np.array([[s["work"].get(k, 0) for k, _ in terms] for s in plain],
                     dtype=float)
        t = np.array([s["epoch_seconds"] for s in plain], dtype=float)
        coef = _relative_lstsq(a, t, nonneg=True)
        if coef.any():
            for _, name in _TIME_TERMS:
                setattr(cal, name, 0.0)
            for (_, name), c in zip(terms, coef):
                setattr(cal, name, float(c))
        cal.error["time_median"] = _errors(a @ coef, t)["median"]
    off = [s for s in samples if s.get("work") and "jobs" in s["work"]]
    if off:
        base = np.array([cal.compute_seconds(s["work"]) for s in off])
        jobs = np.array([s["work"]["jobs"] for s in off], dtype=float)
        t = np.array([s["epoch_seconds"] for s in off], dtype=float)
        if len(off) >= 2:
            k, j = _relative_lstsq(np.stack([base, jobs], 1), t, nonneg=True)
        else:  # one run: keep the per-job default, scale the rest
            j = cal.per_job
            k = max(0.0, (t[0] - j * jobs[0]) / max(base[0], 1e-9))
        cal.offload_scale, cal.per_job = float(k), float(j)


# --------------------------------------------------------------- measuring
