"""Offload estimates where a job's blocks pass glibc's mmap threshold (stop 44).

On a CPU a block at or above glibc's mmap threshold (32 MiB in the compact
heap, the ceiling of the default heap's dynamic one) is mapped on pages of
its own, while the heap keeps its high-water extent: the two add up. The
offload estimate now counts each job's edge-sized blocks past the threshold
on top of the heap's high-water (``DeviceBudget.charge``,
``OffloadCounters.peak_resident_bytes``). This script checks it where it
matters, few large chunks on big graphs, and where it should change nothing:

* every row is a ``leangnn train`` command line, run in a fresh interpreter
  (the compact heap, one thread, 3 epochs, ``--runs`` processes);
* its estimate (``estimate_config`` under the same heap settings, the
  shipped reference calibration unless this machine has its own) from this
  tree and, with ``--before SRC``, from another tree's ``src`` (e.g. an
  export of the previous commit), each in a fresh interpreter;
* a row's threshold moves glibc's for its runs and estimates (the model
  must follow it either way); ``"default"`` rows run glibc's default heap
  (``LEANGNN_HEAP=default``: what a Python process calling ``leangnn.fit``
  has), with its own calibration.

    python benchmarks/offload_mapped.py --before /tmp/before/src
                                         # results/offload_mapped.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import results_path, write_json  # noqa: E402
from plan import _cli_measure  # noqa: E402  (one way to run a command line)

_S = "--model sage --layers 2 --hidden 32 --strategy offload --parts 4"
#: (name, command line after ``train``, glibc mmap threshold or None: 32 MiB;
#: or ``"default"``: glibc's default heap, its dynamic threshold)
ROWS = [
    ("csbm50k-sage2", f"--dataset csbm:50000 {_S} --device-budget 66MiB", None),
    ("csbm100k-sage2", f"--dataset csbm:100000 {_S} --device-budget 132MiB", None),
    ("csbm120k-sage2", f"--dataset csbm:120000 {_S} --device-budget 158MiB", None),
    ("csbm150k-sage2", f"--dataset csbm:150000 {_S} --device-budget 197.4MiB", None),
    ("csbm200k-sage2", f"--dataset csbm:200000 {_S} --device-budget 264MiB", None),
    ("csbm250k-sage2", f"--dataset csbm:250000 {_S} --device-budget 330MiB", None),
    ("csbm150k-gcn2", "--dataset csbm:150000 --model gcn --layers 2 --hidden 32 "
     "--strategy offload --parts 4 --device-budget 197.4MiB", None),
    ("csbm150k-gat2", "--dataset csbm:150000 --model gat --layers 2 --hidden 32 "
     "--strategy offload --parts 4 --device-budget 300MiB", None),
    ("csbm150k-sage3-h64", "--dataset csbm:150000 --model sage --layers 3 "
     "--hidden 64 --strategy offload --parts 4 --device-budget 400MiB", None),
    ("csbm150k-sage2-8parts", "--dataset csbm:150000 --model sage --layers 2 "
     "--hidden 32 --strategy offload --parts 8 --device-budget 64MiB", None),
    ("csbm150k-sage2-thr64M", f"--dataset csbm:150000 {_S} --device-budget 197.4MiB",
     64 << 20),
    ("csbm100k-sage2-thr16M", f"--dataset csbm:100000 {_S} --device-budget 132MiB",
     16 << 20),
    ("csbm250k-sage2-thr128M", f"--dataset csbm:250000 {_S} --device-budget 330MiB",
     128 << 20),
    ("csbm100k-sage2-default", f"--dataset csbm:100000 {_S} --device-budget 132MiB",
     "default"),
    ("csbm150k-sage2-default", f"--dataset csbm:150000 {_S} --device-budget 197.4MiB",
     "default"),
    ("csbm250k-sage2-default", f"--dataset csbm:250000 {_S} --device-budget 330MiB",
     "default"),
    ("csbm150k-gcn2-default", "--dataset csbm:150000 --model gcn --layers 2 "
     "--hidden 32 --strategy offload --parts 4 --device-budget 197.4MiB", "default"),
]

_CHILD = r"""
import json, shlex, sys, torch
torch.set_num_threads(1)
from leangnn.cli import _TRAIN_FLAGS, build_parser
from leangnn.config import TrainConfig
from leangnn.data import load_graphs
from leangnn.plan.calibration import load_calibration
from leangnn.plan.estimate import estimate_config
a = build_parser().parse_args(["train", *shlex.split(sys.argv[1])])
cfg = TrainConfig(**{f: getattr(a, k) for k, f in _TRAIN_FLAGS.items()
                     if getattr(a, k) is not None})
est = estimate_config(cfg, load_graphs(cfg, progress=False),
                      calibration=load_calibration(torch.device("cpu")))
print(json.dumps({"run_bytes": est.costliest_run_bytes, "step_bytes": est.step_bytes,
                  "chunks": est.knobs.get("chunks"),
                  "edge_job_bytes": est.work.get("edge_job_bytes")}))
"""


def _env(threshold: int | str | None, src: str | None = None) -> dict:
    from leangnn.heap import COMPACT_TUNABLES, MKL_ENV, default_heap_env

    if threshold == "default":
        env = dict(default_heap_env(), LEANGNN_HEAP="default", OMP_NUM_THREADS="1")
    else:
        tun = [t for t in COMPACT_TUNABLES if "mmap_threshold" not in t]
        tun.append(f"glibc.malloc.mmap_threshold={threshold or 32 << 20}")
        env = dict(os.environ, GLIBC_TUNABLES=":".join(tun), OMP_NUM_THREADS="1",
                   **MKL_ENV)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def estimate(args: str, threshold, src: str | None) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD, args],
                       env=_env(threshold, src), capture_output=True, text=True,
                       timeout=1800, cwd=ROOT)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(args: str, threshold, runs: int) -> list[int]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_env(threshold))
    try:
        out = [_cli_measure({"args": args}, 3, 1, 1800) for _ in range(runs)]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    bad = [m["error"] for m in out if "error" in m]
    if bad:
        raise RuntimeError(bad[0])
    return [m["peak_bytes"] for m in out]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--before", default=None, help="another tree's src/")
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    rows = []
    for name, line, thr in ROWS:
        if args.only and name not in args.only:
            continue
        peaks = measure(line, thr, args.runs)
        m = statistics.median(peaks)
        row = {"name": name, "args": line,
               "mmap_threshold": "dynamic" if thr == "default" else thr or 32 << 20,
               "heap": "default" if thr == "default" else "compact",
               "measured_peaks": peaks, "after": estimate(line, thr, None)}
        if args.before:
            row["before"] = estimate(line, thr, args.before)
        for side in ("before", "after"):
            if side in row:
                row[side]["error"] = row[side]["run_bytes"] / m - 1
        rows.append(row)
        print(f"{name:24s} measured {m / 2**20:7.1f} MiB  "
              + "  ".join(f"{s} {row[s]['run_bytes'] / 2**20:7.1f} "
                          f"({row[s]['error']:+.1%})"
                          for s in ("before", "after") if s in row), flush=True)
    errs = [abs(r["after"]["error"]) for r in rows]
    summary = {"rows": len(rows), "median_abs_error": statistics.median(errs),
               "worst_abs_error": max(errs)}
    if args.before:
        was = [abs(r["before"]["error"]) for r in rows]
        summary["before"] = {"median_abs_error": statistics.median(was),
                             "worst_abs_error": max(was)}
    write_json(results_path("offload_mapped.json"), {"rows": rows,
                                                     "summary": summary})
    print(f"offload_mapped: {len(rows)} rows, |error| median "
          f"{summary['median_abs_error']:.1%}, worst {summary['worst_abs_error']:.1%}")


if __name__ == "__main__":
    main()
