"""What `--strategy auto` adds to a run: the same command line planned and
not, whole processes side by side.

The cli section (``benchmarks/plan.py``) times an estimate against one epoch.
Part of a plan's work is the run's own setup, built once and taken over by
the pick (DPR's core, the offload engine's graph structures and partition),
so that ratio overstates what a user waits for. Here each ``--strategy auto``
row of the cli section runs as ``python -m leangnn train ARGS --epochs E``,
and then its pick alone (``--strategy S`` with the knobs the auto run's
``config.json`` resolved), in alternating fresh processes, one intra-op
thread. Figures per row: the medians of each variant's process wall and CPU
seconds (``RUSAGE_CHILDREN``), their difference (what planning added), that
difference in epochs of the pick (its median epoch CPU time), and the plan's
own ``plan_seconds`` from ``summary.json``.

    python benchmarks/plan_overhead.py --rounds 3   # results/plan_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import results_path, write_json  # noqa: E402
from plan import CLI_ROWS  # noqa: E402


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(args: list[str], epochs: int, timeout: float) -> dict:
    """One ``leangnn train`` process: wall and CPU seconds, its summary and
    resolved config."""
    with tempfile.TemporaryDirectory(prefix="plan-overhead-") as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "leangnn", "train", *args,
                "--epochs", str(epochs), "--out", str(out), "--quiet"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        c0, t0 = _children_cpu(), time.perf_counter()
        p = subprocess.run(argv, env=env, capture_output=True, text=True,
                           timeout=timeout)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        if p.returncode != 0:
            raise RuntimeError((p.stderr.strip().splitlines() or ["?"])[-1])
        summary = json.loads((out / "summary.json").read_text())
        config = json.loads((out / "config.json").read_text())
        records = [json.loads(x) for x in
                   (out / "metrics.jsonl").read_text().splitlines() if x]
    return {"wall": wall, "cpu": cpu, "summary": summary, "config": config,
            "epoch_cpu": statistics.median(r["epoch_cpu_seconds"] for r in records)}


def _pick_args(config: dict) -> list[str]:
    """The command line of the pick alone: the options that set the auto
    run's resolved ``config`` (its strategy and knobs), without its budget."""
    from leangnn.plan.measure import _cli_argv

    plain = {k: v for k, v in config.items() if k not in ("out", "memory_budget",
                                                          "epochs")}
    return _cli_argv(plain)


def measure_row(row: dict, epochs: int, rounds: int, timeout: float) -> dict:
    auto_args = shlex.split(row["args"])
    auto, pick, pick_args = [], [], None
    for _ in range(rounds):
        a = _run(auto_args, epochs, timeout)
        auto.append(a)
        if pick_args is None:
            pick_args = _pick_args(a["config"])
        pick.append(_run(pick_args, epochs, timeout))
    med = {k: {v: statistics.median(r[v] for r in runs) for v in ("wall", "cpu")}
           for k, runs in (("auto", auto), ("pick", pick))}
    epoch = statistics.median(r["epoch_cpu"] for r in pick)
    added = med["auto"]["cpu"] - med["pick"]["cpu"]
    return {"name": row["name"], "args": row["args"], "pick": auto[0]["summary"]
            ["plan"]["pick"], "pick_args": " ".join(pick_args),
            "auto": med["auto"], "pick_alone": med["pick"],
            "added_cpu_seconds": added,
            "added_wall_seconds": med["auto"]["wall"] - med["pick"]["wall"],
            "pick_epoch_cpu_seconds": epoch,
            "added_epochs": added / epoch if epoch else None,
            "plan_seconds": statistics.median(
                r["summary"]["plan"]["plan_seconds"] for r in auto),
            "rounds": rounds, "epochs": epochs}


def markdown(rows: list[dict]) -> str:
    lines = ["| row | pick | auto: wall / CPU s | pick alone: wall / CPU s | "
             "planning added (CPU s) | in epochs of the pick | plan_seconds |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, p = r["auto"], r["pick_alone"]
        lines.append(
            f"| {r['name']} | {r['pick']} | {a['wall']:.2f} / {a['cpu']:.2f} | "
            f"{p['wall']:.2f} / {p['cpu']:.2f} | {r['added_cpu_seconds']:+.2f} | "
            f"{r['added_epochs']:.1f} | {r['plan_seconds']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    sel = [r for r in CLI_ROWS if "--strategy auto" in r["args"]
           and (not args.only or any(s in r["name"] for s in args.only))]
    rows = []
    for row in sel:
        print(f"plan-overhead {row['name']}: {row['args']}", file=sys.stderr,
              flush=True)
        rows.append(measure_row(row, args.epochs, args.rounds, args.timeout))
        r = rows[-1]
        print(f"  pick {r['pick']}: planning added {r['added_cpu_seconds']:+.2f} s "
              f"CPU ({r['added_epochs']:.1f} epochs; plan_seconds "
              f"{r['plan_seconds']:.2f})", file=sys.stderr, flush=True)
        write_json(results_path("plan_overhead.json"), {"rows": rows})
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
