"""Calibration: the allocator's overhead and the time of work, per machine kind.

A dry run counts tensor bytes; what a run's meter reports is more on CPU
(resident memory: glibc keeps freed heap, code pages, thread stacks; with its
default dynamic mmap threshold about twice the tensor bytes, measured) and
what a CUDA device holds is more too (the caching allocator reserves more
than it hands out). A short calibration measures a few small real runs here
(:func:`leangnn.plan.measure.measure_fresh`) beside their estimates and fits

* memory: on CPU ``measured = big + heap_scale x heap + const``, where the
  dry run splits the step's bytes at glibc's mmap threshold into blocks on
  their own pages (resident exactly while alive) and the heap's high-water
  (freed small blocks stay resident); on CUDA ``measured = tensor bytes +
  const`` and ``reserved / allocated`` for budget checks; offload's
  accounting (an upper bound by design) gets a scale for its device side
  and one for its host store;
* time: ``epoch_seconds = a ops + b bytes_written + c flops`` (non-negative
  least squares over the traced work), and for offload
  ``k x that + per_job x jobs``.

One JSON file per machine kind (CPU model and allocator setting, or GPU name)
under ``cache_root("calibration")``; re-measure with
``python -m leangnn.plan.calibrate [--device cuda] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leangnn.utils import atomic_write_text, cache_root, format_bytes

__all__ = ["Calibration", "machine_kind", "allocator_mode", "calibration_path",
           "load_calibration", "calibrate", "fit_calibration", "CALIBRATION_RUNS",
           "main"]

_SMALL = "epfl/priority,iscas85/c3540,epfl/cavlc"
#: epochs of a calibration run (the Trainer's peak covers later epochs too)
CALIBRATION_EPOCHS = 3

#: small runs measured by :func:`calibrate` (quick: the first four), each
#: through the Trainer (:func:`leangnn.plan.measure.measure_trainer`)
CALIBRATION_RUNS: list[dict[str, Any]] = [
    # next to no tensors: what every run's meter sees besides them (first
    # calls of kernels, validation, checkpoint writing)
    dict(strategy="full", model="sage", num_layers=2, hidden_channels=8,
         dataset="iscas85/c17", val_dataset="iscas85/c432",
         test_dataset="iscas85/c499"),
    dict(strategy="full", model="res", conv="sage", num_layers=4,
         hidden_channels=32, dataset="csbm:20000"),
    # small circuits: many tensors below glibc's mmap threshold (the heap)
    dict(strategy="full", model="res", conv="sage", num_layers=32,
         hidden_channels=32, dataset=_SMALL, test_dataset="iscas85/c17"),
    dict(strategy="full", model="gat", num_layers=2, hidden_channels=32,
         dataset="csbm:10000"),
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=4,
         num_groups=2, hidden_channels=32, dataset="csbm:20000"),
    dict(strategy="reversible", model="gsr", conv="gcn", num_layers=32,
         num_groups=2, hidden_channels=32, dataset=_SMALL,
         test_dataset="iscas85/c17"),
    dict(strategy="full", model="res", conv="gcn", num_layers=4,
         hidden_channels=32, dataset="csbm:20000"),
    dict(strategy="full", model="sage", num_layers=3, hidden_channels=64,
         dataset="csbm:40000"),
    dict(strategy="prune", model="sage", num_layers=3, hidden_channels=64,
         budget_ratio=0.3, dataset="csbm:40000"),
    dict(strategy="offload", model="sage", num_layers=3, hidden_channels=32,
         device_budget="12MiB", num_parts=8, dataset="csbm:20000"),
    # a budget large enough that the device side (pool, workspace) dominates
    dict(strategy="offload", model="gcn", num_layers=2, hidden_channels=32,
         device_budget="96MiB", num_parts=8, dataset="csbm:20000"),
]

#: what an uncalibrated machine assumes (measured on a 2-core x86-64 CPU
#: with glibc 2.36; tensor bytes are exact on CUDA and in mmap mode)
_DEFAULT_SCALE = {"glibc-default": 1.9, "glibc-mmap": 1.0, "cuda-caching": 1.0,
                  "system": 1.0}


def allocator_mode(device: torch.device | str = "cpu") -> str:
    """``cuda-caching``; on CPU ``glibc-mmap`` when ``MALLOC_MMAP_THRESHOLD_``
    is set (resident memory follows live tensors), else ``glibc-default``
    on Linux and ``system`` elsewhere."""
    if torch.device(device).type == "cuda":
        return "cuda-caching"
    if not sys.platform.startswith("linux"):
        return "system"
    return "glibc-mmap" if os.environ.get("MALLOC_MMAP_THRESHOLD_") else \
        "glibc-default"


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
    return cache_root("calibration") / f"{machine_kind(device)}.json"


@dataclass
class Calibration:
    """Allocator overhead and time coefficients of one machine kind.

    Attributes:
        kind (str): :func:`machine_kind`.
        allocator (str): :func:`allocator_mode`.
        scale, const: measured run bytes ``= scale x tensor bytes + const``.
        budget_scale (float): device memory held per byte measured (CUDA's
            reserved over allocated; 1 on CPU).
        per_op, per_byte, per_flop (float): seconds per traced op, byte
            written and FLOP.
        offload_scale, per_job (float): offload epoch ``= offload_scale x``
            the full-batch time of its work ``+ per_job x jobs``.
        offload_bytes_scale (float): measured over estimated bytes of offload
            runs, whose estimate is the engine's budget accounting (an upper
            bound by design: safety margins on every job's workspace), or of
            their device side when ``offload_host_scale`` is set.
        offload_host_scale (float, optional): the same for the host store
            (zero-filled gradient arrays are resident only once written).
        heap_scale (float, optional): CPU: resident bytes per byte of the C
            heap's high-water (freed small blocks stay resident and
            fragment); measured = big bytes + ``heap_scale`` x heap bytes +
            const replaces ``scale`` when set.
        calibrated (bool): measured here (``False``: defaults).
        error (dict): median and worst relative error of the fit.
        samples (list): the measurements fitted.
    """

    kind: str
    allocator: str
    scale: float = 1.0
    const: float = 0.0
    budget_scale: float = 1.0
    per_op: float = 3e-5
    per_byte: float = 1e-9
    per_flop: float = 2e-10
    offload_scale: float = 2.0
    per_job: float = 2e-3
    offload_bytes_scale: float = 1.0
    offload_host_scale: float | None = None
    heap_scale: float | None = None
    calibrated: bool = False
    measured_at: str = ""
    error: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def default(cls, device: torch.device | str = "cpu") -> Calibration:
        mode = allocator_mode(device)
        return cls(machine_kind(device), mode, scale=_DEFAULT_SCALE.get(mode, 1.0))

    # ------------------------------------------------------------ applying
    def overhead(self, tensor_bytes: int, big: int = 0, heap: int = 0) -> int:
        """Allocator bytes on top of ``tensor_bytes`` (never below -it)."""
        # one first-run constant for all: fitted per strategy it overfits
        const = self.const
        if self.heap_scale is not None and (big or heap):
            resident = big + self.heap_scale * heap
        else:
            resident = self.scale * tensor_bytes
        return max(-tensor_bytes, round(resident - tensor_bytes + const))

    def offload_bytes(self, step_bytes: float, work: dict) -> float:
        """Measured bytes of an offload step from its accounting (plus the
        first-run constant every run pays)."""
        if self.offload_host_scale is not None and "host_bytes" in work:
            return (self.offload_bytes_scale * work["device_bytes"]
                    + self.offload_host_scale * work["host_bytes"] + self.const)
        return self.offload_bytes_scale * step_bytes + self.const

    def seconds(self, work: dict[str, float]) -> float | None:
        """Epoch seconds of traced ``work`` (``None`` without any)."""
        if not work or "ops" not in work:
            return None
        t = (self.per_op * work["ops"] + self.per_byte * work["written"]
             + self.per_flop * work["flops"])
        if "jobs" in work:
            t = self.offload_scale * t + self.per_job * work["jobs"]
        return float(t)

    def apply(self, est) -> None:
        """Fill ``est``'s allocator overhead and epoch time in place."""
        if est.method == "offload-accounting":
            est.overhead_bytes = round(self.offload_bytes(est.step_bytes, est.work)
                                       - est.step_bytes)
        else:
            est.overhead_bytes = self.overhead(est.step_bytes, est.big_bytes,
                                               est.heap_bytes)
            if est.later is not None:
                step, big, heap = est.later
                est.later_run_bytes = step + self.overhead(step, big, heap)
        est.epoch_seconds = self.seconds(est.work)
        if not self.calibrated:
            hint = (f"uncalibrated ({self.kind}): run python -m "
                    "leangnn.plan.calibrate")
            est.note = f"{est.note}; {hint}" if est.note else hint

    # ------------------------------------------------------------- storage
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path) if path else cache_root("calibration") / f"{self.kind}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def load_calibration(device: torch.device | str = "cpu") -> Calibration:
    """This machine kind's stored calibration, else :meth:`Calibration.default`
    (a damaged file is ignored)."""
    path = calibration_path(device)
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return Calibration.default(device)


# ------------------------------------------------------------------- fitting
def _relative_lstsq(a: np.ndarray, y: np.ndarray, nonneg: bool) -> np.ndarray:
    w = 1.0 / np.maximum(y, 1e-12)
    aw, yw = a * w[:, None], y * w
    if nonneg:
        from scipy.optimize import nnls

        return nnls(aw, yw)[0]
    return np.linalg.lstsq(aw, yw, rcond=None)[0]


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred - y) / np.maximum(y, 1)
    return {"median": float(np.median(rel)), "worst": float(rel.max())}


def fit_calibration(samples: list[dict[str, Any]], device="cpu") -> Calibration:
    """Fit a :class:`Calibration` to measured ``samples`` (each with
    ``tensor_bytes``, ``run_bytes``, ``work``, ``epoch_seconds`` and, on
    CUDA, ``reserved_bytes`` / ``allocated_bytes``)."""
    cal = Calibration.default(device)
    cal.calibrated, cal.samples = True, samples
    cal.measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
    plain = [s for s in samples if "jobs" not in s.get("work", {})]
    off = [s for s in samples if "jobs" in s.get("work", {})]
    x = np.array([s["tensor_bytes"] for s in plain], dtype=float)
    y = np.array([s["run_bytes"] for s in plain], dtype=float)
    heap = [s for s in plain if s.get("heap_bytes") is not None]
    heavy = [s for s in heap if s["heap_bytes"] >= 8 << 20]
    if cal.allocator == "glibc-default" and heavy:
        # What a run's meter sees with no tensors to speak of (a tiny
        # circuit: first calls of kernels, validation, checkpoint writing;
        # measured ~8 MiB through the Trainer) is a constant of its own ...
        tiny = [s for s in heap if s["big_bytes"] + s["heap_bytes"] < 1 << 20]
        cal.const = float(np.median([s["run_bytes"] - s["big_bytes"]
                                     - s["heap_bytes"] for s in tiny])) if tiny \
            else 0.0
        # ... and every block up to 32 MiB comes from the heap, which
        # fragments by a model-dependent factor (measured x1.1 for GAT, x2.1
        # for residual SAGE stacks): take the largest, so a plan errs towards
        # not fitting.
        cal.heap_scale = max(1.0, max((s["run_bytes"] - s["big_bytes"] - cal.const)
                                      / s["heap_bytes"] for s in heavy))
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
    # Offload runs pay the same first-run constant on top of their store.
    # One scale for the device side and the host store together (fitted
    # apart on a few runs, one of them came out 0), taken from the run with
    # the most accounted bytes: a small budget's run also keeps state the
    # accounting does not follow (measured through the Trainer: ~29 MiB
    # resident after the first epoch at a 12 MiB budget, 2.3x its
    # accounting), which does not grow with it.
    if off:
        top = max(off, key=lambda s: s["tensor_bytes"])
        cal.offload_bytes_scale = max(0.0, top["run_bytes"] - cal.const) / max(
            top["tensor_bytes"], 1)
        cal.offload_host_scale = None
    pred = [s["tensor_bytes"] + cal.overhead(
        int(s["tensor_bytes"]), int(s.get("big_bytes") or 0),
        int(s.get("heap_bytes") or 0))
        if "jobs" not in s["work"] else cal.offload_bytes(s["tensor_bytes"],
                                                          s["work"])
        for s in samples]
    cal.error = _errors(np.array(pred), np.array([s["run_bytes"] for s in samples],
                                                 dtype=float))
    reserved = [s["reserved_bytes"] / s["allocated_bytes"] for s in samples
                if s.get("reserved_bytes") and s.get("allocated_bytes")]
    if reserved:
        cal.budget_scale = float(max(reserved))
    _fit_time(cal, samples)
    return cal


def _fit_time(cal: Calibration, samples: list[dict[str, Any]]) -> None:
    plain = [s for s in samples if s.get("work") and "jobs" not in s["work"]]
    if len(plain) >= 3:
        a = np.array([[s["work"]["ops"], s["work"]["written"], s["work"]["flops"]]
                      for s in plain], dtype=float)
        t = np.array([s["epoch_seconds"] for s in plain], dtype=float)
        coef = _relative_lstsq(a, t, nonneg=True)
        if coef.any():
            cal.per_op, cal.per_byte, cal.per_flop = (float(c) for c in coef)
        cal.error["time_median"] = _errors(a @ coef, t)["median"]
    off = [s for s in samples if s.get("work") and "jobs" in s["work"]]
    if off:
        base = np.array([cal.per_op * s["work"]["ops"] + cal.per_byte
                         * s["work"]["written"] + cal.per_flop * s["work"]["flops"]
                         for s in off])
        jobs = np.array([s["work"]["jobs"] for s in off], dtype=float)
        t = np.array([s["epoch_seconds"] for s in off], dtype=float)
        if len(off) >= 2:
            k, j = _relative_lstsq(np.stack([base, jobs], 1), t, nonneg=True)
        else:  # one run: keep the per-job default, scale the rest
            j = cal.per_job
            k = max(0.0, (t[0] - j * jobs[0]) / max(base[0], 1e-9))
        cal.offload_scale, cal.per_job = float(k), float(j)


# --------------------------------------------------------------- measuring
def _sample(run: dict[str, Any], device: str, mmap: bool | None,
            timeout: float | None) -> dict[str, Any]:
    from leangnn.config import TrainConfig
    from leangnn.data import load_graphs
    from leangnn.plan.estimate import estimate_config
    from leangnn.plan.measure import measure_fresh, measure_trainer

    cfg = TrainConfig(**{**run, "device": device, "epochs": CALIBRATION_EPOCHS})
    est = estimate_config(cfg, load_graphs(cfg, progress=False))
    mmap = allocator_mode(device) == "glibc-mmap" if mmap is None else mmap
    if torch.device(device).type == "cpu":
        # What users see: the Trainer's meter over training, validation and
        # checkpoints; one thread, timed by the fastest epoch, so a shared
        # machine's load (other processes, spin-waiting OpenMP threads) stays
        # out of the speed figures
        m = measure_trainer(cfg, epochs=CALIBRATION_EPOCHS, threads=1, mmap=mmap,
                            timeout=timeout)
    else:
        m = measure_fresh(cfg, epochs=2, mmap=mmap, timeout=timeout)
    step = est.step_bytes
    if est.later is not None and est.method != "offload-accounting":
        step = max(step, est.later[0])
    # CPU time of one thread where measured: the load of a shared machine
    # stays out of it (wall time: the fastest epoch)
    secs = m.get("epoch_cpu_seconds") or m["epoch_seconds"]
    out = {"config": run, "tensor_bytes": step, "run_bytes": m["run_bytes"],
           "work": est.work, "epoch_seconds": min(secs),
           "estimate_seconds": est.estimate_seconds}
    if est.big_bytes or est.heap_bytes:
        big, heap = est.big_bytes, est.heap_bytes
        if est.later is not None:  # the costlier of the first and later epochs
            big, heap = max((big, heap), est.later[1:], key=lambda p: p[0] + 2 * p[1])
        out.update(big_bytes=big, heap_bytes=heap)
    if m.get("reserved_bytes"):
        out["reserved_bytes"] = m["reserved_bytes"]
        out["allocated_bytes"] = m["run_bytes"] + m["baseline_bytes"]
    return out


def calibrate(device: str = "cpu", quick: bool = False, mmap: bool | None = None,
              timeout: float | None = 900, save: bool = True,
              progress: bool = True) -> Calibration:
    """Measure :data:`CALIBRATION_RUNS` here, fit and (by default) store them.

    Args:
        device (str, optional): ``cpu`` or ``cuda[:i]``. (default: ``"cpu"``)
        quick (bool, optional): the first three runs only. (default: ``False``)
        mmap (bool, optional): measure CPU runs with glibc's fixed mmap
            threshold; default: as this process is set up.
        timeout (float, optional): seconds per run. (default: ``900``)
        save (bool, optional): store it for this machine kind.
    """
    runs = CALIBRATION_RUNS[:4] if quick else CALIBRATION_RUNS
    samples = []
    for run in runs:
        s = _sample(run, device, mmap, timeout)
        samples.append(s)
        if progress:
            print(f"calibrate: {run['strategy']}/{run['model']} "
                  f"L{run['num_layers']} {run['dataset']}: tensors "
                  f"{format_bytes(s['tensor_bytes'])}, measured "
                  f"{format_bytes(s['run_bytes'])}, {s['epoch_seconds']:.2f} s/epoch",
                  file=sys.stderr, flush=True)
    cal = fit_calibration(samples, device)
    if mmap is not None and torch.device(device).type == "cpu":
        cal.allocator = "glibc-mmap" if mmap else "glibc-default"
        cal.kind = re.sub(r"glibc-(mmap|default)$", cal.allocator, cal.kind)
    if save:
        cal.save()
    return cal


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m leangnn.plan.calibrate",
        description="Measure this machine's allocator overhead and speed for "
                    "the planner (a few short training runs).")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--quick", action="store_true", help="three runs only")
    p.add_argument("--allocator", choices=["default", "mmap"], default=None,
                   help="CPU: measure with glibc's default or a fixed mmap "
                        "threshold (default: as this shell is set up)")
    p.add_argument("--show", action="store_true",
                   help="print the stored calibration and exit")
    args = p.parse_args(argv)
    if args.show:
        print(json.dumps(load_calibration(args.device).to_dict(), indent=1))
        return 0
    mmap = None if args.allocator is None else args.allocator == "mmap"
    cal = calibrate(args.device, args.quick, mmap)
    mem = (f"big blocks + {cal.heap_scale:.2f} x heap high-water"
           if cal.heap_scale is not None else f"{cal.scale:.3f} x tensor bytes")
    print(f"{cal.kind}: run bytes = {mem} {cal.const / 2**20:+.1f} MiB (median "
          f"error {cal.error['median']:.1%}, worst {cal.error['worst']:.1%}); "
          f"stored in {cache_root('calibration') / (cal.kind + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
