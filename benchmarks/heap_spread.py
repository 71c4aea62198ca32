"""How far one `leangnn train` command's CPU peak moves from process to process.

Under glibc's default allocator a CPU run's resident peak is not a function
of the command alone. The same command line, in fresh processes, peaks at
values up to 2x apart (csbm:8000, 6 SAGE layers: 75-161 MiB). The tensors are
not the cause: their allocations and frees come in the same order, with the
same sizes, in every process (a dispatch-mode log of both, compared between
hash seeds). What differs is a few hundred bytes of small objects that
Python and PyTorch allocate beside them (``mallinfo2``: 0.4-3.4 KB apart at
the step's first op). Those small blocks decide whether a later block of
tens of MiB fits a hole in the heap or extends it, and from there the two
heaps diverge (47 MiB apart 200 ops later, under that probe). Their
sizes follow Python's hash seed and the address-space layout: with both fixed
(``PYTHONHASHSEED=0`` under ``setarch -R``) the same command peaks at the
same byte every time, and another seed gives another, equally fixed, value.

This script measures that spread for one command: ``--runs`` fresh
processes in each mode, the peak each reports (``summary.json``'s
``memory.peak_bytes``, the Trainer's meter: the kernel's resident
high-water above the loaded state):

* ``default``: glibc's default heap (``LEANGNN_HEAP=default``), random hash
  seed and layout;
* ``pinned``: the same with ``PYTHONHASHSEED=0`` under ``setarch -R``
  (layout fixed), every process alike;
* ``seeds``: the same with ``PYTHONHASHSEED=k`` under ``setarch -R`` for
  ``k = 1..runs``;
* ``compact``: the compact heap the ``leangnn`` command runs in
  (:mod:`leangnn.heap`), random hash seed and layout.

A planner cannot predict which of these heaps a process gets. The figure to
compare its estimate with is the spread's middle, and the spread is the
least error a resident-memory estimate can have on that command.

    python benchmarks/heap_spread.py --runs 6 --name csbm8k-sage6 -- \
        --dataset csbm:8000 --strategy full --model sage --layers 6 \
        --hidden 32 --epochs 2           # results/heap_spread.json

Needs Linux with glibc; ``pinned`` and ``seeds`` need ``setarch``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import merge_rows  # noqa: E402

from leangnn.heap import heap_env  # noqa: E402

OUT = HERE / "results" / "heap_spread.json"
MIB = 2**20


def peak_of(train_args: list[str], env: dict, wrap: list[str]) -> int:
    """``leangnn train`` in a fresh process; the peak its summary reports."""
    with tempfile.TemporaryDirectory(prefix="heap-spread-") as tmp:
        out = Path(tmp) / "run"
        cmd = [*wrap, sys.executable, "-m", "leangnn", "train", *train_args,
               "--out", str(out), "--quiet"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=1800)
        if p.returncode:
            tail = (p.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"{' '.join(cmd)}: {tail}")
        return json.loads((out / "summary.json").read_text())["memory"]["peak_bytes"]


def spread(peaks: list[int]) -> dict:
    mid = statistics.median(peaks)
    return {"peaks_mib": [round(p / MIB, 1) for p in peaks],
            "min_mib": round(min(peaks) / MIB, 1),
            "median_mib": round(mid / MIB, 1),
            "max_mib": round(max(peaks) / MIB, 1),
            "range_over_median": round((max(peaks) - min(peaks)) / mid, 3),
            # (a page or two apart is the same heap: the meter's own objects)
            "distinct_mib": len({round(p / MIB) for p in peaks})}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="the row's name in the JSON")
    ap.add_argument("--runs", type=int, default=6, help="processes per mode")
    ap.add_argument("--modes", default="default,pinned,seeds,compact",
                    help="comma-separated: default, pinned, seeds, compact")
    ap.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="-- then the arguments of `leangnn train`")
    a = ap.parse_args(argv)
    args = a.train_args[1:] if a.train_args[:1] == ["--"] else a.train_args
    if not args:
        ap.error("give the `leangnn train` arguments after --")
    if a.runs < 2:
        ap.error(f"--runs must be at least 2, got {a.runs}")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("default", "pinned", "seeds", "compact")]
    if bad:
        ap.error(f"--modes: unknown mode(s) {bad}")
    setarch = shutil.which("setarch")
    if setarch is None and set(modes) & {"pinned", "seeds"}:
        ap.error("pinned and seeds need `setarch` (util-linux)")
    base = dict(heap_env("default"), OMP_NUM_THREADS="1")
    base.pop("PYTHONHASHSEED", None)
    row = {"name": a.name, "args": args, "runs": a.runs}
    for mode in modes:
        peaks = []
        for k in range(1, a.runs + 1):
            env, wrap = dict(base), []
            if mode == "compact":
                env = heap_env("compact", base)
            elif mode != "default":
                env["PYTHONHASHSEED"] = "0" if mode == "pinned" else str(k)
                wrap = [setarch, "-R"]
            peaks.append(peak_of(args, env, wrap))
        row[mode] = spread(peaks)
        s = row[mode]
        print(f"{a.name} {mode:8s} {s['min_mib']:.1f} .. {s['median_mib']:.1f} .. "
              f"{s['max_mib']:.1f} MiB (range {100 * s['range_over_median']:.0f}% "
              f"of the median, {s['distinct_mib']} distinct MiB of {a.runs} runs)",
              flush=True)
    # modes measured before for this row and not now are kept
    old = json.loads(OUT.read_text()).get("rows", []) if OUT.is_file() else []
    before = next((r for r in old if r.get("name") == a.name), {})
    merge_rows(OUT, [{**before, **row}])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
