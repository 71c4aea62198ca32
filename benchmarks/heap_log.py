"""Where a `leangnn train` run's CPU heap goes, logged without moving it.

The planner models glibc's main heap (:mod:`leangnn.plan.heapsim`) from the
tensor blocks a dry run sees. To check that model against glibc itself, one
needs the real heap's layout during a run, and every earlier probe moved it:
``mallinfo2`` from a dispatch mode, like any logger that allocates, adds the
small chunks that decide where glibc puts the next large block (a residual
GCN stack on csbm:8000 peaked at 454 MiB under such a probe, 685 MiB without).

This script runs ``python -m leangnn train ARGS`` with ``heaplog/mlog.c``
preloaded: every malloc/free goes to a static buffer (nothing allocated),
with markers at each backward, optimizer step and the Trainer's
``malloc_trim``. From the log it reports, per training epoch,

* ``resident``: the heap's resident high-water, modelled page by page (a
  block's pages are resident once allocated, a trim releases the pages no
  live block covers and everything above the break), above its value when
  the run's memory meter started, beside the epoch's measured
  ``peak_bytes`` (``metrics.jsonl``; it also counts what is not heap);
* ``extent``: the break's high-water (MiB above the heap's start);
* the same extent when the log is replayed against glibc (``heaplog/replay.c``)
  with every block, and with only the blocks of at least 1 KiB or 64 KiB:
  how much of the growth the small objects (tensor and autograd objects,
  which no tensor tracker sees) cause;
* where those small requests (under 1 KiB) land: how many of the epoch's
  went into pages of a freed block of 1 MiB or more (a hole that a later
  large block could have taken), and how many of those are still alive
  when the epoch's last backward ends.

Needs Linux with glibc and gcc. The run is slowed by the log (24 bytes per
call) and stops logging after 24M calls (reported).

    python benchmarks/heap_log.py --name csbm8k-res16-gcn -- --dataset \
        csbm:8000 --strategy full --model res --conv gcn --layers 16 \
        --hidden 32 --epochs 3          # results/heap_log.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import merge_rows  # noqa: E402

OUT = HERE / "results" / "heap_log.json"
CAP = 24 << 20  # mlog.c's buffer, in records
PAGE = 4096
SMALL, LARGE = 1024, 1 << 20
MARKS = {1: "backward", 2: "backward end", 3: "step", 4: "step end", 7: "trim",
         8: "trim end"}

# the child: markers around backward, Adam's step and the Trainer's trims
_CHILD = r"""
import ctypes, sys, torch
mark = ctypes.CDLL(None).mlog_mark
mark.argtypes = [ctypes.c_uint64]
def wrap(owner, name, a, b):
    f = getattr(owner, name)
    def g(*args, **kw):
        mark(a); r = f(*args, **kw); mark(b); return r
    setattr(owner, name, g)
wrap(torch.Tensor, "backward", 1, 2)
wrap(torch.optim.Adam, "step", 3, 4)
import leangnn.profile as P, leangnn.train as T
wrap(P, "release_free_heap", 7, 8)
T.release_free_heap = P.release_free_heap
from leangnn.cli import main
sys.exit(main(sys.argv[1:]))
"""


def build(tmp: Path) -> tuple[Path, Path]:
    """Compiles the logger and the replayer into ``tmp``."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        sys.exit("heap_log: needs Linux with glibc (the logger calls __libc_malloc)")
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        sys.exit("heap_log: needs a C compiler (gcc or cc on PATH)")
    lib, rep = tmp / "libmlog.so", tmp / "replay"
    for cmd in ([cc, "-O2", "-shared", "-fPIC", "-o", lib, HERE / "heaplog/mlog.c"],
                [cc, "-O2", "-o", rep, HERE / "heaplog/replay.c"]):
        subprocess.run([str(c) for c in cmd], check=True)
    return lib, rep


def run(args: list[str], lib: Path, tmp: Path) -> tuple[Path, list[dict]]:
    """``leangnn train ARGS`` under the logger: the log and metrics.jsonl."""
    log, out = tmp / "malloc.log", tmp / "run"
    env = dict(os.environ, LD_PRELOAD=str(lib), MLOG_OUT=str(log),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    p = subprocess.run([sys.executable, "-c", _CHILD, "train", *args, "--out",
                        str(out), "--quiet"], env=env, capture_output=True,
                       text=True)
    if p.returncode:
        sys.exit(f"heap_log: leangnn train {' '.join(args)} failed: "
                 f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
           if x]
    return log, rec


def resident(log: Path) -> tuple[list[tuple], int]:
    """Markers ``(event, code, resident MiB, break MiB, small, in holes,
    alive)``, each preceded by a pseudo-marker of code 0 holding the
    high-waters since the marker before; and the number of events.

    ``small``: requests under 1 KiB so far; ``in holes``: those placed in
    a page of a freed block of 1 MiB or more that no later large block has
    taken; ``alive``: the events that made those still not freed.
    """
    raw = np.fromfile(log, dtype=np.uint64) if log.is_file() else np.zeros(0)
    a = raw[:raw.size // 3 * 3].astype(np.uint64).reshape(-1, 3)  # whole records
    op = (a[:, 0] >> np.uint64(56)).astype(np.int64)
    size = (a[:, 0] & np.uint64((1 << 56) - 1)).astype(np.int64)
    ptr, brk = a[:, 1].astype(np.int64), a[:, 2].astype(np.int64)
    heap = (op != 9) & (op != 2) & (ptr < brk) & (ptr > brk - (4 << 30))
    if not heap.any():
        raise ValueError(f"{log}: no heap allocation in the log (was the logger "
                         "preloaded? LD_PRELOAD needs glibc)")
    start = int(ptr[heap].min()) // PAGE * PAGE
    res = np.zeros(int((brk.max() - start) // PAGE) + 2, bool)
    large = np.zeros(len(res), np.int8)  # 1: a live large block, 2: freed
    live: dict[int, int] = {}
    carved: dict[int, int] = {}  # pointer -> event
    out, n, hw, hw_brk, small, holed = [], 0, 0, 0, 0, 0
    for i in np.flatnonzero(heap | (op == 2) | (op == 9)).tolist():
        o = int(op[i])
        if o == 9:
            counts = (small, holed, sorted(carved.values()))
            out.append((i, 0, hw * PAGE / 2**20, (hw_brk - start) / 2**20,
                        *counts))
            if int(size[i]) == 8:  # after malloc_trim: only covered pages stay
                cover = np.zeros(len(res) + 1, np.int32)
                for p, s in live.items():
                    cover[(p - start) // PAGE] += 1
                    cover[(p + s - 1 - start) // PAGE + 1] -= 1
                res &= np.cumsum(cover[:-1]) > 0
                res[int((brk[i] - start) // PAGE) + 1:] = False
                n = int(res.sum())
            out.append((i, int(size[i]), n * PAGE / 2**20,
                        (int(brk[i]) - start) / 2**20, *counts))
            hw, hw_brk = n, int(brk[i])
        elif o == 2:
            p = int(ptr[i])
            s = live.pop(p, 0)
            carved.pop(p, None)
            if s >= LARGE:
                large[(p - start) // PAGE:(p + s - 1 - start) // PAGE + 1] = 2
        else:
            p, s = int(ptr[i]), max(int(size[i]), 1)
            live[p] = s
            lo, hi = (p - start) // PAGE, (p + s - 1 - start) // PAGE + 1
            if s >= LARGE:
                large[lo:hi] = 1
            elif s < SMALL:
                small += 1
                if large[lo] == 2:
                    holed += 1
                    carved[p] = i
            if hi - lo == 1:
                if not res[lo]:
                    res[lo] = True
                    n += 1
            else:
                n += hi - lo - int(res[lo:hi].sum())
                res[lo:hi] = True
            hw, hw_brk = max(hw, n), max(hw_brk, int(brk[i]))
    return out, len(a)


def epochs(marks: list[tuple]) -> list[tuple[int, int]]:
    """(first, last) marker indices of each training epoch: the markers from
    a trim's end to the next trim, when a backward is among them."""
    ends = [k for k, m in enumerate(marks) if m[1] == 8]
    spans = []
    for a, b in zip(ends, ends[1:]):
        if any(m[1] == 1 for m in marks[a:b]):
            spans.append((a, b))
    return spans


def replay(rep: Path, log: Path, minsize: int) -> list[tuple[int, float, float]]:
    p = subprocess.run([str(rep), str(log), str(minsize)], capture_output=True,
                       text=True, check=True)
    return [(int(e), float(b), float(m)) for _, _, e, b, m in
            (x.split() for x in p.stdout.splitlines())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="the row's name in the JSON")
    ap.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="-- then the arguments after `leangnn train`")
    a = ap.parse_args(argv)
    args = a.train_args[1:] if a.train_args[:1] == ["--"] else a.train_args
    if not args:
        ap.error("give the `leangnn train` arguments after --")
    with tempfile.TemporaryDirectory(prefix="heap-log-") as tmp:
        lib, rep = build(Path(tmp))
        log, rec = run(args, lib, Path(tmp))
        try:
            marks, events = resident(log)
        except ValueError as e:
            sys.exit(f"heap_log: {e}")
        reps = {m: replay(rep, log, m) for m in (0, 1024, 65536)}
    spans = epochs(marks)
    base = marks[spans[0][0]][2] if spans else 0.0
    rows = []
    for k, (lo, hi) in enumerate(spans):
        seg = marks[lo:hi + 1]
        e0, e1 = seg[0][0], seg[-1][0]
        row = {"epoch": k + 1,
               "measured_peak_mib": (rec[k]["peak_bytes"] / 2**20
                                     if k < len(rec) else None),
               "resident_mib": max(m[2] for m in seg) - base,
               "extent_mib": max(m[3] for m in seg)}
        ends = [m for m in seg if m[1] == 2] or seg[-1:]
        row.update(small_requests=ends[-1][4] - seg[0][4],
                   small_in_holes=ends[-1][5] - seg[0][5],
                   small_in_holes_alive=sum(b >= e0 for b in ends[-1][6]))
        for m, r in reps.items():
            row[f"replay_extent_mib_min{m}"] = max(
                [b for e, b, _ in r if e0 <= e <= e1] or [0.0])
        rows.append(row)
    result = {"name": a.name, "args": args, "events": events,
              "log_full": events >= CAP, "epochs": rows}
    merge_rows(OUT, [result])
    print(f"{'epoch':>5} {'measured':>9} {'resident':>9} {'extent':>8} "
          f"{'replay all':>10} {'>=1KiB':>8} {'>=64KiB':>8}   (MiB)   "
          "small requests: in holes, alive after the backward")
    for r in rows:
        meas = r["measured_peak_mib"]
        print(f"{r['epoch']:>5} {meas if meas is None else round(meas, 1):>9} "
              f"{r['resident_mib']:9.1f} {r['extent_mib']:8.1f} "
              f"{r['replay_extent_mib_min0']:10.1f} "
              f"{r['replay_extent_mib_min1024']:8.1f} "
              f"{r['replay_extent_mib_min65536']:8.1f}   {r['small_requests']:>8}: "
              f"{r['small_in_holes']}, {r['small_in_holes_alive']}")
    if events >= CAP:
        print(f"heap_log: the log filled ({CAP} calls); later epochs are missing")
    print(f"heap_log: {events} calls logged, {len(rows)} epochs -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
