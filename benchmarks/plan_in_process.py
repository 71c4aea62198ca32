"""What a plan made in the training process pays of a DPR core's run (stop 42).

    python benchmarks/plan_in_process.py            # compact heap (leangnn train)
    LEANGNN_HEAP=default python benchmarks/plan_in_process.py --heap default

``leangnn train --strategy auto`` plans in the process that then trains: the
plan's dry runs page in part of the run's code, so the run measures less
than the same configuration trained in a process of its own, and the plan
takes that share (``Calibration.in_process_bytes``, measured on tiny exact
runs) off its estimate. For a pick on DPR's core the share is smaller. Each
case here is a graph where ``--strategy auto`` at its budget picks a core:
one auto run reads the pick, then 3 runs pinned to that core (``--strategy
prune --budget-ratio R``) and 2 more auto runs, alternating, one thread,
3 epochs; the share is the difference of the medians of their measured
peaks. Writes ``benchmarks/results/in_process_core_<heap>.json``; the median
share over the cases is the reference's ``in_process_core_bytes``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

from leangnn.utils import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from plan_fresh import TIGHT, UNSEEN  # noqa: E402  (the command lines)
from plan_speed import train_run  # noqa: E402  (one fresh run)

#: case name (of ``plan_fresh``'s tight or unseen cases) -> a budget at
#: which ``--strategy auto`` picks a core on this machine
BUDGETS = {"banyan64-gsr16": "9.5MiB", "adder-gcn4": "6.7MiB",
           "b20-sage4": "30.2MiB", "max-gsr24": "12.6MiB", "s38417-res6": "20MiB"}
#: (name, command line after ``train``, budget)
CASES = [(name, args, BUDGETS[name]) for name, args in [*TIGHT, *UNSEEN]
         if name in BUDGETS]


def train(args: str) -> dict:
    """``leangnn train ARGS`` for 3 epochs in a fresh interpreter with one
    thread (:func:`plan_speed.train_run`): its ``summary.json``."""
    return train_run(shlex.split(args), None, 3)[1]


def run() -> list[dict]:
    out = []
    for name, args, budget in CASES:
        auto_args = f"{args} --strategy auto --memory-budget {budget}"
        s = train(auto_args)
        plan = s["plan"]
        if plan["strategy"] != "prune":
            print(f"{name}: picked {plan['pick']}, not a core; left out",
                  file=sys.stderr)
            continue
        ratio = plan["config"]["budget_ratio"]
        pinned = f"{args} --strategy prune --budget-ratio {ratio}"
        auto, pin = [s["memory"]["peak_bytes"]], []
        for i in range(3):
            pin.append(train(pinned)["memory"]["peak_bytes"])
            if i < 2:
                auto.append(train(auto_args)["memory"]["peak_bytes"])
        r = {"name": name, "pick": plan["pick"],
             "in_process_bytes": plan["in_process_bytes"],
             "est_run": plan["estimated_run_bytes"], "auto": auto, "pinned": pin,
             "diff": statistics.median(pin) - statistics.median(auto)}
        out.append(r)
        print(f"{name}: {plan['pick']}: pinned - auto {r['diff'] / 2**20:.2f} MiB",
              file=sys.stderr)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heap", choices=("compact", "default"), default="compact",
                    help="names the result (set LEANGNN_HEAP=default for the "
                    "default heap)")
    args = ap.parse_args(argv)
    if (os.environ.get("LEANGNN_HEAP") == "default") != (args.heap == "default"):
        ap.error("--heap default goes with LEANGNN_HEAP=default (and only it)")
    rows = run()
    path = ROOT / "benchmarks" / "results" / f"in_process_core_{args.heap}.json"
    atomic_write_text(path, json.dumps(rows, indent=1) + "\n")
    if rows:
        med = statistics.median(r["diff"] for r in rows)
        print(f"plan_in_process: median share {med / 2**20:.2f} MiB "
              f"({int(med)} bytes); wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
