"""`leangnn train` of this tree against another, side by side: epoch CPU time
and process peak of command lines from ``benchmarks/plan.py``'s cli section.

Each round runs every named row once on each tree (this one, then the
``--before`` source tree, e.g. ``git archive <commit> src | tar -x -C DIR``),
in fresh interpreters with one OpenMP thread; the epoch time is the median
of ``metrics.jsonl``'s ``epoch_cpu_seconds`` over the run's epochs, the peak
``summary.json``'s ``memory.peak_bytes``; medians over rounds are reported.

    python benchmarks/train_before_after.py --before /tmp/before/src \\
        csbm100k-gsr4 b19-gsr16 mult-gsr16-gat h-log2-gsr32
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from plan import CLI_ROWS  # noqa: E402
from plan_speed import train_run  # noqa: E402  (one leangnn train, one thread)

OUT = ROOT / "benchmarks" / "results" / "train_before_after.json"


def run_once(args: str, src: str | None, epochs: int) -> tuple[float, int]:
    """(median epoch CPU seconds, peak bytes) of one ``leangnn train``."""
    rec, summary = train_run(shlex.split(args), src, epochs)
    return (statistics.median(r["epoch_cpu_seconds"] for r in rec),
            int(summary["memory"]["peak_bytes"]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="row names of plan.py's cli section")
    ap.add_argument("--before", required=True, help="the reference's src/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    by_name = {r["name"]: r for r in CLI_ROWS}
    if not (Path(a.before) / "leangnn").is_dir():
        # (a wrong path would silently run the installed tree on both sides)
        ap.error(f"--before {a.before!r} has no leangnn package; give a tree's src/")
    unknown = [n for n in a.rows if n not in by_name]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {sorted(by_name)}")
    results = []
    for name in a.rows:
        runs: dict[str, list] = {"after": [], "before": []}
        for _ in range(a.rounds):
            runs["after"].append(run_once(by_name[name]["args"], None, a.epochs))
            runs["before"].append(run_once(by_name[name]["args"], a.before, a.epochs))
        r = {"name": name, "args": by_name[name]["args"], "epochs": a.epochs}
        for side, xs in runs.items():
            r[side] = {"epoch_cpu_seconds": statistics.median(x[0] for x in xs),
                       "peak_bytes": int(statistics.median(x[1] for x in xs)),
                       "rounds": xs}
        before, after = r["before"], r["after"]
        r["speedup"] = before["epoch_cpu_seconds"] / after["epoch_cpu_seconds"]
        r["peak_ratio"] = r["after"]["peak_bytes"] / r["before"]["peak_bytes"]
        print(f"{name}: epoch CPU {r['before']['epoch_cpu_seconds']:.3f} s -> "
              f"{r['after']['epoch_cpu_seconds']:.3f} s ({r['speedup']:.2f}x), peak "
              f"{r['before']['peak_bytes'] / 2**20:.1f} -> "
              f"{r['after']['peak_bytes'] / 2**20:.1f} MiB", flush=True)
        results.append(r)
    from leangnn.utils import atomic_write_text

    a.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out, json.dumps({"rows": results}, indent=1))
    print(f"{len(results)} rows, median speedup "
          f"{statistics.median(r['speedup'] for r in results):.2f}x -> {a.out}")


if __name__ == "__main__":
    main()
