"""GSR with many group functions through ``leangnn train --strategy auto`` (stop 45).

A GSR stack of ``L`` layers and ``G`` groups runs ``L x G`` group functions.
Where each is small (the default circuits, a few hundred nodes), per-object
costs that no tensor tracker sees decide the run's peak:

* a leaf tensor that ``torch.autograd.grad`` has differentiated keeps its
  gradient accumulator's memory while it lives; the stack's parameter views
  live as long as the model (now: each block is differentiated through
  stand-ins that die with it);
* a ``state_dict`` walked every block, and PyG's ``Linear`` wrote one entry
  per view for the stack's hook to delete, at every checkpoint and best-model
  copy (now: a flat stack's blocks are skipped);
* the dry run gave up past its op limit at 64 groups and the plan held a lower
  bound alone (now: :func:`leangnn.plan.estimate.op_limit`).

Every row is ``leangnn train --model gsr --layers L --groups G --strategy auto
--memory-budget 4GiB --epochs 2`` in a fresh interpreter (the compact heap
the command sets up, one OpenMP thread), on this tree and, with ``--before
SRC``, on another tree's ``src`` (e.g. ``git archive <commit> src``),
alternating. Reported from each run's ``summary.json``: the plan's estimated
need, the measured need (the run's peak with the budget check's margins),
each epoch's peak and CPU seconds, the estimated epoch time.

    python benchmarks/gsr_groups.py --before /tmp/before/src
                                    # results/gsr_groups.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import results_path, write_json  # noqa: E402
from plan import _cli_measure  # noqa: E402  (one way to run a command line)

#: (layers, groups)
ROWS = [(8, 8), (32, 8), (128, 2), (128, 8), (32, 64), (128, 64)]


def run(layers: int, groups: int, src: str | None, timeout: float) -> dict:
    """One ``leangnn train`` of the row (:func:`plan._cli_measure`, with
    ``src`` first on the path), its summary's figures."""
    saved = dict(os.environ)
    if src:
        os.environ["PYTHONPATH"] = src + os.pathsep + os.environ.get("PYTHONPATH", "")
    try:
        m = _cli_measure({"args": f"--model gsr --layers {layers} --groups {groups} "
                                  "--strategy auto --memory-budget 4GiB"},
                         2, 1, timeout)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if "error" in m:
        return m
    b, plan = m["budget_check"], m["plan"]
    return {"estimated_need_bytes": b["estimated_need_bytes"],
            "measured_need_bytes": b["measured_need_bytes"],
            "error": b["estimated_need_bytes"] / b["measured_need_bytes"] - 1,
            "epoch_peak_bytes": m["epoch_peak_bytes"],
            "epoch_cpu_seconds": m["epoch_cpu_seconds"],
            "estimated_epoch_seconds": plan.get("estimated_epoch_seconds"),
            "plan_seconds": plan.get("plan_seconds"), "method": plan.get("method")}


def _line(side: str, m: dict) -> str:
    if "error" in m and isinstance(m["error"], str):
        return f"{side}: {m['error']}"
    mib = 2 ** 20
    return (f"{side}: need {m['estimated_need_bytes'] / mib:.1f} MiB estimated, "
            f"{m['measured_need_bytes'] / mib:.1f} measured ({m['error']:+.1%}); "
            f"epoch CPU {statistics.median(m['epoch_cpu_seconds']):.2f} s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=None, help="another tree's src/")
    ap.add_argument("--only", nargs="*", default=None, help="rows as LxG, e.g. 128x64")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    rows = []
    for layers, groups in ROWS:
        name = f"{layers}x{groups}"
        if args.only and name not in args.only:
            continue
        row = {"name": name, "layers": layers, "groups": groups}
        if args.before:
            row["before"] = run(layers, groups, args.before, args.timeout)
        row["after"] = run(layers, groups, None, args.timeout)
        rows.append(row)
        print(f"{name:8s} " + " | ".join(_line(s, row[s]) for s in ("before", "after")
                                          if s in row), flush=True)
    path = write_json(results_path("gsr_groups.json"), {"rows": rows})
    print(f"gsr_groups: {len(rows)} rows -> {path}")


if __name__ == "__main__":
    main()
