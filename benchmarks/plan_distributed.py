"""The planner's distributed rows against the ranks' measured peaks.

Each row is one ``leangnn train --strategy auto --nproc 2`` command (the
launcher plans the job: every rank's step traced on its METIS part; the
ranks train the pick for ``--epochs`` epochs), run ``--repeat`` times in
fresh processes, one intra-op thread per rank. For every rank: the
estimate (``summary.json`` plan ``ranks[r].run_bytes``) against its
measured peak above its loaded state (``records_per_rank[r]``'s largest
``run_peak_bytes``), the median over repeats; the epoch time estimated
(compute x co-running slowdown + collectives) against the measured median;
and what planning cost against one epoch.

    python benchmarks/plan_distributed.py   # results/plan_distributed.json,
                                            # plan-distributed section
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import markdown_path, results_path, write_json, write_section  # noqa: E402

_VAL = "--val-dataset iscas85/c17 --test-dataset iscas85/c432"
#: (name, arguments): graph mode on one big graph, data mode on the default
#: split's 13 circuits; a pinned --dist-mode where the planner's pick is not
#: the mode to check
ROWS = [
    ("csbm20k-sage3", "--dataset csbm:20000 --model sage --layers 3"),
    ("csbm20k-gcn2", "--dataset csbm:20000 --model gcn --layers 2"),
    ("csbm20k-gat2-h32", "--dataset csbm:20000 --model gat --layers 2 --hidden 32"),
    ("csbm100k-sage2", "--dataset csbm:100000 --model sage --layers 2"),
    ("b19-sage2", f"--dataset itc99/b19 {_VAL} --model sage --layers 2"),
    ("mult-gsr16", f"--dataset epfl/multiplier {_VAL} --model gsr --layers 16 "
     "--hidden 32"),
    ("default-res4", "--model res --layers 4"),
    ("default-gsr16", "--model gsr --layers 16"),
    ("default-dag", "--model dag"),
    ("default-gcn3-graph", "--model gcn --layers 3 --dist-mode graph"),
]
QUICK = ["csbm20k-sage3", "default-res4"]


def run_row(args: str, epochs: int, nproc: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="plan-dist-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "leangnn", "train", *shlex.split(args),
               "--strategy", "auto", "--nproc", str(nproc), "--memory-budget",
               "16GiB", "--epochs", str(epochs), "--patience", "0", "--quiet",
               "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(f"{shlex.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        s = json.loads((out / "summary.json").read_text())
    plan, d = s["plan"], s["distributed"]
    ranks = []
    for est, recs in zip(plan["ranks"], d["records_per_rank"]):
        ranks.append({"rank": est["rank"], "estimated": est["run_bytes"],
                      "measured": max(r["run_peak_bytes"] for r in recs),
                      "owned": est.get("owned"), "halo": est.get("halo")})
    return {"pick": plan["pick"], "mode": d["mode"], "ranks": ranks,
            "epoch_estimated": plan["estimated_epoch_seconds"],
            "epoch_measured": s["time"]["epoch_seconds_median"],
            "plan_seconds": plan["plan_seconds"], "wall_seconds": wall}


def summarize(name: str, runs: list[dict]) -> dict:
    first = runs[0]
    ranks = []
    for i, r in enumerate(first["ranks"]):
        meas = statistics.median(run["ranks"][i]["measured"] for run in runs)
        ranks.append({**r, "measured": meas, "runs": [run["ranks"][i]["measured"]
                                                       for run in runs],
                      "error": r["estimated"] / meas - 1 if meas else None})
    epoch = statistics.median(r["epoch_measured"] for r in runs)
    return {"name": name, "pick": first["pick"], "mode": first["mode"],
            "ranks": ranks, "epoch_estimated": first["epoch_estimated"],
            "epoch_measured": epoch,
            "plan_seconds": statistics.median(r["plan_seconds"] for r in runs),
            "repeat": len(runs)}


def markdown(rows: list[dict], epochs: int) -> str:
    mib = 1 << 20
    errs = [abs(r["error"]) for row in rows for r in row["ranks"]
            if r["error"] is not None]
    lines = [
        "`python benchmarks/plan_distributed.py` (2 ranks on one host, gloo, "
        f"{epochs} epochs, one thread per rank, median of {rows[0]['repeat']} "
        "fresh runs): each rank's estimated peak above its loaded state "
        "against its measured `run_peak_bytes` (the largest over epochs).",
        "",
        "| row | pick | rank: owned + halo | estimated | measured | error "
        "| epoch est. / measured | plan / epoch |",
        "|---|---|---|---:|---:|---:|---|---:|"]
    for row in rows:
        for r in row["ranks"]:
            part = "" if r["owned"] is None else f" {r['owned']} + {r['halo']}"
            first = r["rank"] == 0
            lines.append(
                f"| {row['name'] if first else ''} | "
                f"{row['mode'] if first else ''} | {r['rank']}:{part} | "
                f"{r['estimated'] / mib:.1f} MiB | {r['measured'] / mib:.1f} MiB | "
                f"{r['error']:+.1%} | "
                + (f"{row['epoch_estimated']:.3g} / {row['epoch_measured']:.3g} s"
                   f" | {row['plan_seconds'] / row['epoch_measured']:.0%} |"
                   if first else " | |"))
    ratios = [row["epoch_measured"] / row["epoch_estimated"] for row in rows
              if row["epoch_estimated"]]
    lines += ["", f"Over {len(errs)} ranks: error median "
              f"{statistics.median(errs):.1%}, worst {max(errs):.1%}. Epoch "
              "estimates are the busiest rank's compute times the co-running "
              "slowdown plus its collectives (`python -m leangnn.plan.calibrate "
              "--collectives 2`); measured / estimated epoch median "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-"
              f"{max(ratios):.2f}x)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--only", nargs="+", help="these rows alone")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--quick", action="store_true", help=f"rows {QUICK}")
    args = ap.parse_args(argv)
    names = args.only or (QUICK if args.quick else [n for n, _ in ROWS])
    unknown = sorted(set(names) - {n for n, _ in ROWS})
    if unknown:
        ap.error(f"--only: unknown rows {unknown}")
    rows = []
    for name, row_args in ROWS:
        if name not in names:
            continue
        runs = [run_row(row_args, args.epochs, args.nproc, args.timeout)
                for _ in range(args.repeat)]
        row = summarize(name, runs)
        print(f"{name}: {row['mode']}, " + ", ".join(
            f"rank {r['rank']} {r['estimated'] / 2**20:.1f}/"
            f"{r['measured'] / 2**20:.1f} MiB ({r['error']:+.1%})"
            for r in row["ranks"]), flush=True)
        rows.append(row)
    write_json(results_path("plan_distributed.json", args.quick), rows)
    write_section("plan-distributed", markdown(rows, args.epochs),
                  markdown_path("plan_distributed", args.quick))
    errs = [abs(r["error"]) for row in rows for r in row["ranks"]]
    print(f"plan_distributed: {len(rows)} rows, {len(errs)} ranks; error median "
          f"{statistics.median(errs):.1%}, worst {max(errs):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
