"""Measure this machine for the planner: ``python -m leangnn.plan.calibrate``.

Runs small real trainings through the Trainer in fresh processes
(:func:`leangnn.plan.measure.measure_trainer`; each repeated, its peak varies
by +-10% with hash seeds and address layout under glibc's default heap),
estimates the same configurations, and fits a
:class:`~leangnn.plan.calibration.Calibration` from both, stored per machine
kind. Re-measure with ``python -m leangnn.plan.calibrate [--device cuda]
[--quick] [--repeat N] [--reuse]``; the distributed rows' collectives
with ``--collectives P``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from leangnn.heap import heap_env, heap_mode
from leangnn.plan.calibration import (
    HEAVY_HEAP_BYTES,
    PLANNED,
    REFERENCE_DIR,
    SHORT_RUN_EPOCHS,
    Calibration,
    allocator_mode,
    calibration_path,
    family_first_run,
    fit_calibration,
    fit_heap_families,
    fit_long_runs,
    fit_offload,
    fit_setup,
    fit_time,
    heap_families,
    is_planned,
    is_tiny,
    kind_path,
    load_calibration,
    long_run_families,
    machine_kind,
    reference_calibration,
    sample_families,
)
from leangnn.plan.collectives import comm_key, measure_collectives
from leangnn.utils import atomic_write_text, cache_root, format_bytes

__all__ = ["measurements_path", "long_runs_path", "calibrate",
           "calibrate_families", "calibrate_offload", "calibrate_long_runs",
           "CALIBRATION_RUNS", "main"]

_SMALL = "epfl/priority,iscas85/c3540,epfl/cavlc"
#: a mid-size circuit none of the benchmark rows trains on
_SQUARE = dict(dataset="epfl/square", val_dataset="iscas85/c17",
               test_dataset="iscas85/c432")
#: a second mid-size circuit (ISCAS89) none of the benchmark rows trains on
_S38417 = dict(dataset="iscas89/s38417", val_dataset="iscas85/c17",
               test_dataset="iscas85/c432")
#: epochs of a calibration run (the Trainer's peak covers later epochs too)
CALIBRATION_EPOCHS = SHORT_RUN_EPOCHS
#: epochs of a long calibration run (:func:`calibrate_long_runs`): measured,
#: a run's peak stops creeping up by ~13 epochs
LONG_RUN_EPOCHS = 20

#: the tiny run of a plain model (the first calibration run's configuration)
_TINY_PLAIN = dict(strategy="full", model="sage", num_layers=2, hidden_channels=8)
#: tiny runs of the deeper op mixes, for their first-run constants
_TINY = [
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=4,
         num_groups=2, hidden_channels=8),
    dict(strategy="full", model="res", conv="sage", num_layers=8,
         hidden_channels=8),
    dict(strategy="full", model="dag", hidden_channels=8),
    dict(strategy="prune", model="res", conv="sage", num_layers=4,
         hidden_channels=8, budget_ratio=0.3),
]

#: runs for the first-run constants alone (not for long runs)
_FIRST_RUN: list[dict[str, Any]] = [
    # next to no tensors again, one run per deeper op mix (session 38): a
    # GSR, residual, DAG or DPR run pages in more code than SAGE-2 (measured
    # through `leangnn train` on c17: GSR-4 10.1 MiB, SAGE-2 7.9), which
    # left small GSR and DAG runs 12-20% under with one constant for all
    *[dict(**tiny, dataset="iscas85/c17", val_dataset="iscas85/c432",
           test_dataset="iscas85/c499") for tiny in _TINY],
    # the same planned in the process that trains (`--strategy auto`): its
    # dry runs page in much of that code first (measured 3.0-4.2 MiB less);
    # not DPR's, which a plan picks only where nothing exact fits
    *[dict(**tiny, dataset="iscas85/c17", val_dataset="iscas85/c432",
           test_dataset="iscas85/c499", **{PLANNED: True})
      for tiny in [_TINY_PLAIN, *_TINY] if tiny["strategy"] != "prune"],
]

#: small runs measured by :func:`calibrate` (quick: the first four), each
#: through the Trainer (:func:`leangnn.plan.measure.measure_trainer`)
CALIBRATION_RUNS: list[dict[str, Any]] = [
    # next to no tensors: what every run's meter sees besides them (first
    # calls of kernels, validation, checkpoint writing)
    dict(**_TINY_PLAIN, dataset="iscas85/c17", val_dataset="iscas85/c432",
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
    # one run per further op mix (heap_families): glibc's default heap
    # fragments by a factor that depends on it; a circuit beside each csbm
    dict(strategy="full", model="gcn", num_layers=3, hidden_channels=64,
         dataset="csbm:20000"),
    dict(strategy="full", model="res", conv="gat", num_layers=2,
         hidden_channels=32, dataset="csbm:10000"),
    dict(strategy="reversible", model="gsr", conv="gcn", num_layers=4,
         num_groups=2, hidden_channels=32, dataset="csbm:20000"),
    dict(strategy="reversible", model="gsr", conv="gat", num_layers=4,
         num_groups=2, hidden_channels=32, dataset="csbm:10000"),
    dict(strategy="full", model="sage", num_layers=2, hidden_channels=64,
         **_SQUARE),
    dict(strategy="full", model="gcn", num_layers=2, hidden_channels=64,
         **_SQUARE),
    dict(strategy="full", model="gat", num_layers=2, hidden_channels=64,
         **_SQUARE),
    dict(strategy="full", model="res", conv="sage", num_layers=8,
         hidden_channels=32, **_SQUARE),
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=16,
         num_groups=2, hidden_channels=64, **_SQUARE),
    dict(strategy="full", model="res", conv="gcn", num_layers=4,
         hidden_channels=64, **_SQUARE),
    dict(strategy="reversible", model="gsr", conv="gcn", num_layers=16,
         num_groups=2, hidden_channels=64, **_SQUARE),
    dict(strategy="prune", model="res", conv="sage", num_layers=8,
         hidden_channels=64, budget_ratio=0.3, **_SQUARE),
    dict(strategy="offload", model="sage", num_layers=3, hidden_channels=32,
         device_budget="12MiB", num_parts=8, dataset="csbm:20000"),
    # a budget large enough that the device side (pool, workspace) dominates
    dict(strategy="offload", model="gcn", num_layers=2, hidden_channels=32,
         device_budget="96MiB", num_parts=8, dataset="csbm:20000"),
    # a second and third run for the op mixes fitted from one or two runs
    # (offload-gcn, gsr-gat, res-gcn), a circuit beside a csbm graph each
    dict(strategy="offload", model="gcn", num_layers=2, hidden_channels=32,
         device_budget="32MiB", num_parts=8, dataset="csbm:40000"),
    dict(strategy="offload", model="gcn", num_layers=2, hidden_channels=32,
         device_budget="16MiB", num_parts=8, **_SQUARE),
    dict(strategy="offload", model="sage", num_layers=3, hidden_channels=32,
         device_budget="16MiB", num_parts=8, **_SQUARE),
    dict(strategy="reversible", model="gsr", conv="gat", num_layers=8,
         num_groups=2, hidden_channels=32, **_SQUARE),
    dict(strategy="reversible", model="gsr", conv="gat", num_layers=8,
         num_groups=2, hidden_channels=32, **_S38417),
    dict(strategy="full", model="res", conv="gcn", num_layers=8,
         hidden_channels=32, **_S38417),
    dict(strategy="full", model="res", conv="gcn", num_layers=4,
         hidden_channels=32, dataset="csbm:10000"),
    # a large budget with few chunks: a job's blocks are big and the heap
    # fragments in proportion (SAGE-3 on csbm:20000 measured 1.6-2.8x the
    # many-chunk scale at 32-120 MiB), fitted by the device-bytes term
    *(dict(strategy="offload", model="sage", num_layers=3, hidden_channels=32,
           device_budget=b, num_parts=4, dataset="csbm:20000")
      for b in ("32MiB", "60MiB", "120MiB")),
    dict(strategy="offload", model="sage", num_layers=3, hidden_channels=32,
         device_budget="64MiB", num_parts=4, **_SQUARE),
    dict(strategy="offload", model="gcn", num_layers=2, hidden_channels=32,
         device_budget="60MiB", num_parts=4, dataset="csbm:20000"),
    dict(strategy="offload", model="gcn", num_layers=2, hidden_channels=32,
         device_budget="48MiB", num_parts=4, **_S38417),
    # the DAG model (added in session 22, measured alone: --family dag): its
    # level sweeps churn small blocks level after level (not signal_prob:
    # its cut estimate's numpy peak is measured, not fitted)
    dict(strategy="full", model="dag", **_SQUARE),
    dict(strategy="full", model="dag", rounds=2, aggr="sum", **_S38417),
    dict(strategy="full", model="dag", hidden_channels=64, aggr="attention",
         dataset="itc99/b20", val_dataset="iscas85/c17",
         test_dataset="iscas85/c432"),
    # narrow states (critical's default 8 channels, 16): small per-level
    # blocks, which fragment the heap more per byte
    dict(strategy="full", model="dag", task="critical", dataset="epfl/voter",
         val_dataset="iscas85/c17", test_dataset="iscas85/c432"),
    dict(strategy="full", model="dag", hidden_channels=16,
         dataset="iscas89/s38584", val_dataset="iscas85/c17",
         test_dataset="iscas85/c432"),
    # a second circuit for the plain convs: circuits differ among themselves
    # as much as from csbm graphs (GCN x1.4 on epfl/square, x2.0 on s38417,
    # x1.8 on csbm:20000)
    dict(strategy="full", model="gat", num_layers=2, hidden_channels=32,
         **_S38417),
    dict(strategy="full", model="gcn", num_layers=3, hidden_channels=32,
         **_S38417),
    dict(strategy="full", model="sage", num_layers=3, hidden_channels=32,
         **_S38417),
    # deep reversible stacks (session 25, measured alone: --family gsr): a
    # step's per-block objects and the heap its layer after layer churn
    # leaves grow with depth, which the 4-32-layer runs above never showed
    # (GSR-256 on a small circuit was under-estimated by 15-22%)
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=256,
         num_groups=2, hidden_channels=32, dataset="epfl/bar",
         val_dataset="iscas85/c17", test_dataset="iscas85/c432"),
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=64,
         num_groups=2, hidden_channels=64, **_S38417),
    # DPR with plain SAGE on circuits (session 26, measured alone: --family
    # prune-sage): its factor came from csbm:40000 alone (x1.73), and a
    # circuit's core, many small blocks, fragments more (b19's measured
    # 18% over it)
    dict(strategy="prune", model="sage", num_layers=3, hidden_channels=64,
         budget_ratio=0.3, **_SQUARE),
    dict(strategy="prune", model="sage", num_layers=2, hidden_channels=64,
         budget_ratio=0.5, **_S38417),
    # GAT on larger graphs (session 27, measured alone: --family gat): its
    # factor came from runs with 10-35k nodes (x1.37), and the GAT rows on
    # graphs of 43k nodes and more measured 6-11% over it; a deeper, wider
    # stack on a circuit and a larger csbm graph, neither a benchmark's
    dict(strategy="full", model="gat", num_layers=3, hidden_channels=64,
         **_SQUARE),
    dict(strategy="full", model="gat", num_layers=2, hidden_channels=32,
         dataset="csbm:80000"),
    # PyG's GIN (session 34, measured alone: --family gin): a user's GIN
    # planned with the largest factor measured read 32% over its peak
    dict(strategy="full", model="gin", num_layers=3, hidden_channels=64,
         dataset="csbm:20000"),
    dict(strategy="full", model="gin", num_layers=2, hidden_channels=64,
         **_SQUARE),
    dict(strategy="full", model="gin", num_layers=3, hidden_channels=32,
         **_S38417),
    # GSR with 4 groups or more (session 37, measured alone: --family
    # gsr-many): every run above has 2 groups, and `--model gsr` trains 4 by
    # default; its plans read 19-25% under the peaks of 6-layer stacks on
    # circuits of 37k-124k nodes. The calibration's own circuits (no
    # benchmark row trains on them), and a csbm graph for a heap of
    # edge-sized blocks
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=6,
         num_groups=4, hidden_channels=64, **_SQUARE),
    dict(strategy="reversible", model="gsr", conv="gcn", num_layers=8,
         num_groups=4, hidden_channels=64, **_SQUARE),
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=32,
         num_groups=8, hidden_channels=64, **_S38417),
    dict(strategy="reversible", model="gsr", conv="sage", num_layers=8,
         num_groups=4, hidden_channels=64, dataset="csbm:40000"),
    *_FIRST_RUN,
]


def _measure(cfg, device: str, mmap: bool, timeout: float | None,
             planned: bool = False) -> dict[str, Any]:
    from leangnn.plan.measure import measure_fresh, measure_trainer

    if torch.device(device).type == "cpu":
        # What users see: the Trainer's meter over training, validation and
        # checkpoints; one thread, timed by the fastest epoch, so a shared
        # machine's load (other processes, spin-waiting OpenMP threads) stays
        # out of the speed figures
        return measure_trainer(cfg, epochs=CALIBRATION_EPOCHS, threads=1,
                               mmap=mmap, timeout=timeout, planned=planned)
    return measure_fresh(cfg, epochs=2, mmap=mmap, timeout=timeout)


def _what(run: dict[str, Any]) -> str:
    layers = f" L{run['num_layers']}" if "num_layers" in run else ""
    how = " (planned in process)" if run.get(PLANNED) else ""
    return f"{run['strategy']}/{run['model']}{layers} {run['dataset']}{how}"


def _left_out(what: str, e: Exception) -> None:
    print(f"calibrate: {what}: left out ({type(e).__name__}: "
          f"{str(e).splitlines()[0][:160] if str(e) else ''})",
          file=sys.stderr, flush=True)


def _run_key(run: dict[str, Any]) -> str:
    return json.dumps(run, sort_keys=True)


def _sample(run: dict[str, Any], device: str, mmap: bool | None,
            timeout: float | None, measured: list[dict[str, Any]] | None = None,
            repeat: int = 1, keep=None) -> dict[str, Any]:
    """Estimate ``run`` and measure it ``repeat`` times (fresh interpreters;
    ``measured``: earlier measurements of it, reused), the median run."""
    from leangnn.config import TrainConfig
    from leangnn.data import load_graphs
    from leangnn.plan.estimate import estimate_config

    fields = {k: v for k, v in run.items() if k != PLANNED}
    cfg = TrainConfig(**{**fields, "device": device, "epochs": CALIBRATION_EPOCHS})
    est = estimate_config(cfg, load_graphs(cfg, progress=False))
    mmap = allocator_mode(device) == "glibc-mmap" if mmap is None else mmap
    runs = list(measured or [])
    while len(runs) < repeat:
        runs.append(_measure(cfg, device, mmap, timeout, bool(run.get(PLANNED))))
        if keep is not None:
            keep(runs)
    # glibc's default heap differs from process to process of one command
    # (hash seeds, address layout: measured +-10%): the median of repeats
    runs = sorted(runs[:max(repeat, 1)], key=lambda r: r["run_bytes"])
    m = dict(runs[(len(runs) - 1) // 2])
    m["run_bytes"] = float(np.median([r["run_bytes"] for r in runs]))
    step = est.step_bytes
    if est.later is not None and est.method != "offload-accounting":
        step = max(step, est.later[0])
    # CPU time of one thread where measured: the load of a shared machine
    # stays out of it (wall time: the fastest epoch)
    secs = m.get("epoch_cpu_seconds") or m["epoch_seconds"]
    setups = [r["setup_bytes"] for r in runs if r.get("setup_bytes") is not None]
    out = {"config": run, "tensor_bytes": step, "run_bytes": m["run_bytes"],
           "work": est.work, "epoch_seconds": min(secs),
           "estimate_seconds": est.estimate_seconds,
           "families": heap_families(est.strategy, est.knobs),
           "run_bytes_all": [r["run_bytes"] for r in runs]}
    if setups and est.setup_bytes:
        # what the setup kept (the median process) beside its accounting
        out.update(setup_bytes=float(np.median(setups)),
                   estimated_setup_bytes=est.setup_bytes)
    if est.big_bytes or est.heap_bytes:
        big, heap = est.big_bytes, est.heap_bytes
        if est.later is not None:  # the costlier of the first and later epochs
            big, heap = max((big, heap), est.later[1:], key=lambda p: p[0] + 2 * p[1])
        out.update(big_bytes=big, heap_bytes=heap,
                   heap_edge_share=est.heap_edge_share)
    if m.get("reserved_bytes"):
        out["reserved_bytes"] = m["reserved_bytes"]
        out["allocated_bytes"] = m["run_bytes"] + m["baseline_bytes"]
    return out


def _refit_base(device: str) -> Calibration:
    """What a partial calibration (``--time-only``, ``--family``,
    ``--long-runs``, ``--collectives``) fits into: this machine's stored
    calibration, else the shipped reference made this machine's (its kind,
    and where it came from kept in ``refitted``): stored under the
    reference's kind, measured on another machine, the refit was never read
    back on this one."""
    cal = load_calibration(device)
    here = machine_kind(device)
    if cal.reference and cal.kind != here:
        cal.refitted = {**cal.refitted, "reference": cal.reference}
        cal.kind, cal.reference = here, ""
    return cal


def _kind(device: str, mmap: bool | None) -> str:
    kind = machine_kind(device)
    if mmap is not None and torch.device(device).type == "cpu":
        # mmap=False: the runs get this process's heap without the threshold
        # (measure.measure_trainer), default or compact
        other = heap_mode({k: v for k, v in os.environ.items()
                           if k != "MALLOC_MMAP_THRESHOLD_"})
        kind = re.sub(r"glibc-(mmap|default|compact)$",
                      "glibc-mmap" if mmap else f"glibc-{other}", kind)
    return kind


def measurements_path(device: str = "cpu", mmap: bool | None = None) -> Path:
    """Where :func:`calibrate` keeps every run's raw measurement (per machine
    kind), for ``reuse``."""
    return cache_root("calibration") / f"{_kind(device, mmap)}.runs.json"


def _measure_runs(runs: list[dict[str, Any]], device: str, mmap: bool | None,
                  timeout: float | None, repeat: int, reuse: bool,
                  progress: bool) -> list[dict[str, Any]]:
    """The samples of ``runs`` (see :func:`calibrate`); a run that fails is
    left out, said on stderr."""
    if torch.device(device).type != "cpu":
        # what a plan in the training process pages in is host code: a CPU
        # figure (on CUDA the first-run constant is cuBLAS' workspaces), for
        # every calibration that measures runs (--family too)
        runs = [r for r in runs if not r.get(PLANNED)]
    store_path = measurements_path(device, mmap)
    try:
        store = json.loads(store_path.read_text())
        if not isinstance(store, dict):
            raise ValueError(f"a JSON {type(store).__name__}, not an object")
    except FileNotFoundError:
        store = {}
    except (OSError, ValueError) as e:
        # a damaged store (e.g. a run killed before atomic writes) costs
        # only re-measuring; say so rather than reuse nothing silently
        print(f"calibrate: {store_path}: unreadable ({e}); measuring anew",
              file=sys.stderr, flush=True)
        store = {}
    if not reuse:
        store = {_run_key(r): [] for r in runs} | {
            k: v for k, v in store.items() if k not in {_run_key(r) for r in runs}}

    def keep(key):
        def _keep(measured):
            store[key] = measured
            store_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(store_path, json.dumps(store, indent=1) + "\n")
        return _keep

    samples = []
    for run in runs:
        key = _run_key(run)
        what = _what(run)
        try:
            s = _sample(run, device, mmap, timeout, store.get(key), repeat,
                        keep(key))
        except Exception as e:  # noqa: BLE001 - one run must not stop the rest
            _left_out(what, e)
            continue
        samples.append(s)
        if progress:
            print(f"calibrate: {what}: tensors {format_bytes(s['tensor_bytes'])}, "
                  f"measured {format_bytes(s['run_bytes'])} (of "
                  f"{len(s['run_bytes_all'])}), {s['epoch_seconds']:.2f} s/epoch",
                  file=sys.stderr, flush=True)
    return samples


def calibrate(device: str = "cpu", quick: bool = False, mmap: bool | None = None,
              timeout: float | None = 900, save: bool = True,
              progress: bool = True, repeat: int = 1,
              reuse: bool = False) -> Calibration:
    """Measure :data:`CALIBRATION_RUNS` here, fit and (by default) store them.

    Args:
        device (str, optional): ``cpu`` or ``cuda[:i]``. (default: ``"cpu"``)
        quick (bool, optional): the first four runs only. (default: ``False``)
        mmap (bool, optional): measure CPU runs with glibc's fixed mmap
            threshold; default: as this process is set up.
        timeout (float, optional): seconds per run. (default: ``900``)
        save (bool, optional): store it for this machine kind.
        repeat (int, optional): fresh-interpreter runs per configuration,
            the median kept (glibc's default heap varies by +-10% from
            process to process). (default: ``1``)
        reuse (bool, optional): take the runs measured before (kept in
            :func:`measurements_path`) and measure only what is missing; the
            estimates are always made anew. (default: ``False``)

    A run whose estimate or measurement fails is left out (said on stderr).
    """
    runs = CALIBRATION_RUNS[:4] if quick else CALIBRATION_RUNS
    samples = _measure_runs(runs, device, mmap, timeout, repeat, reuse, progress)
    if not samples:
        raise RuntimeError("calibrate: every calibration run failed")
    cal = fit_calibration(samples, device)
    if mmap is not None and torch.device(device).type == "cpu":
        cal.kind = _kind(device, mmap)
        cal.allocator = "glibc-" + cal.kind.rsplit("glibc-", 1)[-1]
    core_share(cal, reference_calibration(device))
    if save:
        cal.save()
    return cal


def core_share(cal: Calibration, ref: Calibration | None) -> None:
    """Set ``cal``'s in-process share of a pick on DPR's core
    (:attr:`~leangnn.plan.calibration.Calibration.in_process_core_bytes`):
    its own exact share times the reference's ratio of the two. Its runs
    cannot measure it: a plan of a tiny run picks full batch, never a core
    (``benchmarks/plan_in_process.py`` measures it on five graphs)."""
    if ref is None or not ref.in_process_bytes or not cal.in_process_bytes or \
            ref.in_process_core_bytes is None:
        return
    cal.in_process_core_bytes = (cal.in_process_bytes * ref.in_process_core_bytes
                                 / ref.in_process_bytes)
    cal.stamp("in process, DPR core (this machine's exact share x the "
              "reference's ratio)")


def calibrate_time(device: str = "cpu", mmap: bool | None = None,
                   timeout: float | None = 900, save: bool = True,
                   progress: bool = True, repeat: int = 1,
                   reuse: bool = False) -> Calibration:
    """Measure :data:`CALIBRATION_RUNS` and fit only the epoch-time terms
    (per op, per byte, per big byte, per FLOP, offload's, the op mixes'
    time scales) into this machine's calibration (the stored one, else the
    shipped reference), keeping its memory fit: a time term added after a
    calibration gets its coefficient without the memory figures moving.
    Arguments as for :func:`calibrate`."""
    samples = _measure_runs(CALIBRATION_RUNS, device, mmap, timeout, repeat, reuse,
                            progress)
    if not samples:
        raise RuntimeError("calibrate: every calibration run failed")
    cal = _refit_base(device)
    cal.time_scales = {}
    fit_time(cal, samples)
    cal.fit_time_scales(samples)
    cal.stamp("time")
    if save:
        cal.save()
    return cal


def _runs_of(families: list[str], runs: list[dict[str, Any]], fams_of
             ) -> list[dict[str, Any]]:
    """The runs of ``families`` (by ``fams_of(strategy, run)``); a
    ``ValueError`` naming the families with runs when one has none."""
    known = sorted({f for r in runs for f in fams_of(r.get("strategy"), r)})
    missing = sorted(set(families) - set(known))
    if missing or not families:
        raise ValueError(f"--family: no calibration run of {missing or families}; "
                         f"the families with runs: {known}")
    return [r for r in runs if set(families) & set(fams_of(r.get("strategy"), r))]


def calibrate_families(families: list[str], device: str = "cpu",
                       mmap: bool | None = None, timeout: float | None = 900,
                       save: bool = True, progress: bool = True, repeat: int = 1,
                       reuse: bool = False) -> Calibration:
    """Measure the :data:`CALIBRATION_RUNS` of the op mixes ``families``
    alone (:func:`~leangnn.plan.calibration.heap_families`, e.g. ``["dag"]``)
    and fit their heap factors into this machine's calibration (the stored
    one, else the shipped reference), keeping everything else: a model added
    after a calibration gets its factor without the other runs measured
    again. Arguments as for :func:`calibrate`.

    The families' epoch-time scales are fitted too where they have one
    (:data:`~leangnn.plan.calibration.TIMED_FAMILIES`).

    Raises:
        ValueError: a family no calibration run has, or a calibration that
            has no heap factors (a CPU one with glibc's default heap).
    """
    if "offload" in families:
        if families != ["offload"]:
            raise ValueError("--family offload: alone, got "
                             f"{', '.join(families)}")
        return calibrate_offload(device, mmap, timeout, save, progress, repeat,
                                 reuse)
    cal = _refit_base(device)
    runs = _runs_of(families, CALIBRATION_RUNS, heap_families)
    if cal.heap_scale is None or not cal.calibrated:
        raise ValueError(f"--family: the calibration of {device} ({cal.kind}) has "
                         "no heap factors to add to; run the whole calibration")
    samples = _measure_runs(runs, device, mmap, timeout, repeat, reuse, progress)
    heavy = [s for s in samples if s.get("heap_bytes") and
             s["heap_bytes"] >= HEAVY_HEAP_BYTES]
    # the families' own first-run constants, where they have tiny runs, before
    # the factors fitted on what those leave
    cal.family_consts = {**cal.family_consts, **{
        f: v for f, v in family_first_run([s for s in samples if is_tiny(s)]).items()
        if any(f == fam or f.startswith(f"{fam}-") for fam in families)}}
    for fam in families:
        mine = [s for s in heavy if fam in s["families"]]
        if not mine:
            raise RuntimeError(f"calibrate: no run of family {fam!r} measured with "
                               f"a heap of at least {format_bytes(HEAVY_HEAP_BYTES)}")
        # and its finer op mixes (dag-narrow, dag-wide)
        finer = sorted({f for s in mine for f in s["families"]
                        if f.startswith(f"{fam}-")})
        cal.stamp(f"heap {fam}")
        scales, edges = fit_heap_families(
            {f: [s for s in mine if f in s["families"]] for f in [fam, *finer]},
            cal.first_run_const)
        for f in [fam, *finer]:
            cal.heap_scales[f] = scales[f]
            if f in edges:
                cal.heap_edge_scales[f] = edges[f]
            else:
                cal.heap_edge_scales.pop(f, None)
    # the families' earlier runs are superseded (a run may have changed)
    cal.samples = [s for s in cal.samples if not set(families) & set(
        sample_families(s))] + samples
    cal.fit_time_scales([s for s in samples if not is_planned(s)])
    if save:
        cal.save()
    return cal


def calibrate_offload(device: str = "cpu", mmap: bool | None = None,
                      timeout: float | None = 900, save: bool = True,
                      progress: bool = True, repeat: int = 1,
                      reuse: bool = False) -> Calibration:
    """Measure the offload runs of :data:`CALIBRATION_RUNS` alone and fit
    the offload memory scales (:func:`~leangnn.plan.calibration.fit_offload`:
    every model together) into this machine's calibration (the stored one,
    else the shipped reference), keeping the rest (``--family offload``).
    Arguments as for :func:`calibrate`."""
    cal = _refit_base(device)
    if not cal.calibrated:
        raise ValueError(f"--family offload: the calibration of {device} "
                         f"({cal.kind}) is not measured; run the whole calibration")
    runs = [r for r in CALIBRATION_RUNS if r.get("strategy") == "offload"]
    samples = _measure_runs(runs, device, mmap, timeout, repeat, reuse, progress)
    if not samples:
        raise RuntimeError("calibrate: every offload run failed")
    fit_offload(cal, samples)
    cal.setup_const = fit_setup(samples)
    cal.stamp("offload")
    cal.samples = [s for s in cal.samples
                   if s.get("config", {}).get("strategy") != "offload"] + samples
    if save:
        cal.save()
    return cal


def calibrate_collectives(nproc: int, device: str = "cpu", quick: bool = False,
                          save: bool = True) -> Calibration:
    """Measure what ``nproc`` local ranks cost beyond their compute
    (:func:`~leangnn.plan.collectives.measure_collectives`) and store it in
    this machine's calibration (the stored one, else the shipped
    reference), keeping everything else: the distributed rows' epoch times
    then include the collectives and the co-running slowdown."""
    cost = measure_collectives(nproc, device, quick=quick)
    cal = _refit_base(device)
    cal.collectives[comm_key(cost.backend, nproc)] = cost.to_dict()
    if save:
        cal.save()
    return cal


def calibrate_long_runs(device: str = "cpu", epochs: int = LONG_RUN_EPOCHS,
                        quick: bool = False, timeout: float | None = 1800,
                        save: bool = True, progress: bool = True,
                        reuse: bool = False,
                        families: list[str] | None = None) -> Calibration:
    """Train :data:`CALIBRATION_RUNS` for ``epochs`` epochs each (once, fresh
    interpreters, through the Trainer) and add their long-run scales
    (:func:`~leangnn.plan.calibration.fit_long_runs`) to this machine's
    calibration (the stored one, else the reference), stored by default
    with the runs themselves (:func:`long_runs_path`).

    With ``reuse`` the stored runs are fitted again, nothing is trained
    (e.g. after the fit changed); an unreadable file is said and measured
    anew. With ``families`` (e.g. ``["dag"]``) only the runs of those op
    mixes are trained, and only their families' scales change (the stored
    runs of the others are kept beside them).

    CPU only: CUDA's caching allocator does not creep the way glibc's heap
    does (its plans use reserved over allocated bytes instead).
    """
    from leangnn.plan.measure import measure_trainer

    if torch.device(device).type != "cpu":
        raise ValueError(f"--long-runs: CPU only, got device {device!r}")
    if epochs <= SHORT_RUN_EPOCHS:
        raise ValueError(f"--long-runs: more than {SHORT_RUN_EPOCHS} epochs, "
                         f"got {epochs}")
    cal = _refit_base(device)
    if not cal.calibrated:
        raise ValueError("--long-runs: no measured calibration to add to; run "
                         "python -m leangnn.plan.calibrate first")
    mmap = cal.allocator == "glibc-mmap"
    path = long_runs_path(device, mmap)
    runs = _read_long_runs(path) if reuse else None
    if runs is not None:
        fit_long_runs(cal, runs, families)
        cal.stamp("long runs")
        if save:
            cal.save()
        return cal
    todo = CALIBRATION_RUNS[:4] if quick else CALIBRATION_RUNS
    # (a tiny run's peak is its first-run constant: nothing to creep)
    todo = [r for r in todo if r not in _FIRST_RUN]
    if families:
        todo = _runs_of(families, todo, long_run_families)
    runs = []
    for run in todo:
        what = _what(run)
        # patience 0: every epoch runs, whatever the validation loss does
        cfg = {**run, "device": device, "patience": 0}
        try:
            m = measure_trainer(cfg, epochs=epochs, threads=1, mmap=mmap,
                                timeout=timeout)
        except Exception as e:  # noqa: BLE001 - one run must not stop the rest
            _left_out(what, e)
            continue
        peaks = m["epoch_peak_bytes"]
        runs.append({"config": run, "epoch_peak_bytes": peaks,
                     "families": long_run_families(run["strategy"], run)})
        short = max(peaks[:SHORT_RUN_EPOCHS], default=None)
        if progress and None not in peaks and short:
            print(f"calibrate: {what}: {format_bytes(short)} after "
                  f"{SHORT_RUN_EPOCHS} epochs, {format_bytes(max(peaks))} after "
                  f"{len(peaks)} (x{max(peaks) / short:.2f})",
                  file=sys.stderr, flush=True)
    fit_long_runs(cal, runs, families)
    cal.stamp("long runs")
    if families:
        runs = [r for r in (_read_long_runs(path, quiet=True) or [])
                if not set(families) & set(r.get("families") or ())] + runs
    if save:
        # the runs themselves too: a refit (reuse) needs no retraining
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(runs, indent=1) + "\n")
        cal.save()
    return cal


def long_runs_path(device: str = "cpu", mmap: bool | None = None) -> Path:
    """Where :func:`calibrate_long_runs` keeps its runs (per machine kind)."""
    return measurements_path(device, mmap).with_suffix(".long.json")


def _read_long_runs(path: Path, quiet: bool = False) -> list[dict[str, Any]] | None:
    try:
        runs = json.loads(path.read_text())
        if not isinstance(runs, list) or not all(
                isinstance(r, dict) and isinstance(r.get("epoch_peak_bytes"), list)
                for r in runs):
            raise ValueError("not a list of runs with their epoch peaks")
        return runs
    except FileNotFoundError:
        if not quiet:
            print(f"calibrate: {path}: no long runs stored; measuring",
                  file=sys.stderr, flush=True)
    except (OSError, ValueError) as e:
        print(f"calibrate: {path}: unreadable ({e}); measuring anew",
              file=sys.stderr, flush=True)
    return None


def save_reference(device: str = "cpu") -> Path:
    """Write this machine's stored calibration, without its samples, as the
    package's reference for its allocator mode (:data:`REFERENCE_DIR`)."""
    path = calibration_path(device)
    try:
        cal = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"--save-reference: no stored calibration at {path} "
                         f"({type(e).__name__}); run python -m "
                         "leangnn.plan.calibrate first") from None
    if not cal.calibrated:
        raise ValueError(f"--save-reference: {path} is not a measured calibration")
    cal.samples, cal.reference = [], cal.origin()
    out = REFERENCE_DIR / f"{cal.allocator}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(cal.to_dict(), indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m leangnn.plan.calibrate",
        description="Measure this machine's allocator overhead and speed for "
                    "the planner (a few short training runs).")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--quick", action="store_true", help="four runs only")
    p.add_argument("--allocator", choices=["default", "compact", "mmap"],
                   default=None,
                   help="CPU: measure with glibc's default heap, the compact "
                        "heap the leangnn command runs in (leangnn.heap) or a "
                        "fixed mmap threshold (default: as this shell is set "
                        "up)")
    # one job per call: a second mode flag was silently dropped (e.g.
    # --time-only beside --collectives measured the collectives alone)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--save-reference", action="store_true",
                      help="copy this machine's stored calibration (without its "
                           "samples) into the package as the reference shipped "
                           "for its allocator mode, and exit (maintainers)")
    mode.add_argument("--show", action="store_true",
                      help="print the stored calibration and exit")
    # three: calibrations of single runs (drawn from five measured per
    # configuration) moved the cli benchmark's median error over 5.4-7.5%
    # and its worst over 19-24%; medians of three 5.1-6.4% and 19-22.5%
    p.add_argument("--repeat", type=int, default=3,
                   help="fresh-interpreter runs per configuration, the median "
                        "kept (default 3; glibc's default heap varies by "
                        "+-10%% from process to process)")
    mode.add_argument("--long-runs", type=int, nargs="?", const=LONG_RUN_EPOCHS,
                      default=None, metavar="EPOCHS",
                      help="CPU: train the calibration runs for EPOCHS epochs "
                           f"(default {LONG_RUN_EPOCHS}) and add how much higher "
                           f"a run peaks than in its first {SHORT_RUN_EPOCHS} to "
                           "the stored calibration (plans for longer runs need it)")
    p.add_argument("--reuse", action="store_true",
                   help="reuse the runs measured before; measure only the "
                        "missing ones (estimates are always made anew; with "
                        "--long-runs: fit the stored long runs again)")
    p.add_argument("--family", action="append", default=None, metavar="NAME",
                   help="measure only the runs of this op mix (e.g. dag; "
                        "repeatable; offload: the offload runs' memory scales) "
                        "and fit its heap factor (with "
                        "--long-runs: its long-run scale) into the stored "
                        "calibration, else the shipped reference, keeping the "
                        "rest")
    mode.add_argument("--time-only", action="store_true",
                      help="measure the calibration runs and fit only the epoch "
                           "time terms into the stored calibration, keeping its "
                           "memory fit")
    mode.add_argument("--collectives", type=int, default=None, metavar="P",
                      help="time P local ranks' collectives (halo all-to-all, "
                           "gradient all-reduce) and how much slower a rank "
                           "computes beside the others; stored for the planner's "
                           "distributed rows (leangnn plan --nproc P)")
    args = p.parse_args(argv)
    if args.allocator in ("default", "compact"):
        # the runs inherit this environment (glibc reads it as each starts)
        # and the stored calibration is named after it
        with mock.patch.dict(os.environ, heap_env(args.allocator), clear=True):
            return _main(p, args)
    return _main(p, args)


def _main(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    clash = [f for f, on in (("--collectives", args.collectives is not None),
                             ("--save-reference", args.save_reference),
                             ("--show", args.show), ("--time-only", args.time_only))
             if on]
    if args.family and clash:
        p.error(f"--family: only with a calibration run or --long-runs, got it "
                f"with {clash[0]}")
    if args.quick and (args.time_only or args.family) and args.long_runs is None:
        # (they measure their own runs; --quick was silently ignored)
        p.error("--quick: only with the whole calibration, --long-runs or "
                f"--collectives, got it with "
                f"{'--time-only' if args.time_only else '--family'}")
    if args.collectives is not None:
        try:
            cal = calibrate_collectives(args.collectives, args.device, args.quick)
        except ValueError as e:
            p.error(str(e))
        c = cal.collective_cost("nccl" if args.device.startswith("cuda")
                                else "gloo", args.collectives)
        print(f"{cal.kind}: {c.nproc} {c.backend} ranks: compute x{c.corun:.2f} "
              f"at once; all-to-all {c.all_to_all[0] * 1e3:.2f} ms + "
              f"{1 / max(c.all_to_all[1], 1e-15) / 2**30:.2f} GiB/s, all-reduce "
              f"{c.all_reduce[0] * 1e3:.2f} ms + "
              f"{1 / max(c.all_reduce[1], 1e-15) / 2**30:.2f} GiB/s; stored in "
              f"{kind_path(cal.kind)}")
        return 0
    if args.save_reference:
        try:
            path = save_reference(args.device)
        except ValueError as e:
            p.error(str(e))
        print(f"reference calibration written to {path}")
        return 0
    if args.show:
        print(json.dumps(load_calibration(args.device).to_dict(), indent=1))
        return 0
    if args.long_runs is not None:
        try:
            cal = calibrate_long_runs(args.device, args.long_runs,
                                      quick=args.quick, reuse=args.reuse,
                                      families=args.family)
        except ValueError as e:
            p.error(str(e))
        scales = ", ".join(f"{k} x{v:.2f}" for k, v in
                           sorted(cal.long_run_scales.items()))
        print(f"{cal.kind}: long-run scales ({cal.long_run_epochs} epochs): "
              f"{scales}; stored in {kind_path(cal.kind)}")
        return 0
    # (default and compact: this process's environment, set above, decides)
    mmap = True if args.allocator == "mmap" else None
    if args.repeat < 1:
        p.error(f"--repeat: at least 1, got {args.repeat}")
    if args.time_only:
        try:
            cal = calibrate_time(args.device, mmap, repeat=args.repeat,
                                 reuse=args.reuse)
        except (ValueError, RuntimeError) as e:
            p.error(str(e))
        print(f"{cal.kind}: epoch = {cal.per_op * 1e6:.2f} us/op + "
              f"{cal.per_byte * 1e9:.3f} ns/B written + "
              f"{cal.per_cold_byte * 1e9:.3f} ns/B more past the caches + "
              f"{cal.per_big_byte * 1e9:.3f} ns/B more in fresh pages + "
              f"{cal.per_flop * 1e12:.3f} ns/kFLOP + "
              f"{cal.per_sparse_flop * 1e12:.3f} ns/kFLOP more in sparse "
              "products (median error "
              f"{cal.error.get('time_median', 0):.1%}); stored in "
              f"{kind_path(cal.kind)}")
        return 0
    if args.family:
        try:
            cal = calibrate_families(args.family, args.device, mmap,
                                     repeat=args.repeat, reuse=args.reuse)
        except (ValueError, RuntimeError) as e:
            p.error(str(e))
        if args.family == ["offload"]:
            factors = ", ".join(
                f"{k} x{v:.2f} step + x{cal.offload_edge_scales.get(k, 0):.2f} "
                f"job edge bytes" for k, v in sorted(cal.offload_scales.items()))
            print(f"{cal.kind}: offload scales {factors}; stored in "
                  f"{kind_path(cal.kind)}")
            return 0
        factors = ", ".join(
            f"{f} x{cal.heap_scales[f]:.2f}" + (
                f" (edge-sized x{cal.heap_edge_scales[f]:.2f})"
                if f in cal.heap_edge_scales else "") for f in args.family)
        print(f"{cal.kind}: heap factors {factors}; stored in {kind_path(cal.kind)}")
        return 0
    cal = calibrate(args.device, args.quick, mmap, repeat=args.repeat,
                    reuse=args.reuse)
    mem = (f"big blocks + {cal.heap_scale:.2f} x heap high-water"
           if cal.heap_scale is not None else f"{cal.scale:.3f} x tensor bytes")
    print(f"{cal.kind}: run bytes = {mem} {cal.const / 2**20:+.1f} MiB (median "
          f"error {cal.error['median']:.1%}, worst {cal.error['worst']:.1%}); "
          f"stored in {kind_path(cal.kind)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
