"""The DAG model's dry run on key levels against the dry run over every level.

For each circuit, one training step of the default DAG model (the task's
settings) is traced twice in one process, alternating, ``--rounds`` times:
over every level (the reference, the op limit lifted) and as the planner
does it (:func:`leangnn.plan.dag.trace_levels`: the key levels, those and a
few narrow ones, and none). Reported: CPU seconds of each (medians), the
peak and heap point of both, and the work the planner extrapolates (ops,
bytes written, FLOPs) against the whole trace's. One thread; the meta
kernels' memo warm after a first call of each.

    python benchmarks/plan_dag.py   # results/plan_dag.json, plan-dag section
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import markdown_path, results_path, write_json, write_section  # noqa: E402

CIRCUITS = [("iscas85/c1908", "arrival"), ("epfl/priority", "arrival"),
            ("epfl/sin", "signal_prob"), ("epfl/arbiter", "arrival"),
            ("itc99/b17", "critical")]


def measure(name: str, task: str, rounds: int) -> dict:
    from leangnn.circuits import load_circuit
    from leangnn.nn.dag import DAGNN
    from leangnn.nn.levels import level_plan
    from leangnn.plan.dag import concrete_limit, key_levels, trace_levels
    from leangnn.plan.dryrun import trace_step
    from leangnn.plan.estimate import default_loss

    data = load_circuit(name, task)
    torch.manual_seed(0)
    hidden = 8 if task == "critical" else 32
    model = DAGNN(data.num_features, hidden, 1, task=task)

    def run():
        return trace_step(model, data, default_loss(data), max_ops=1 << 40,
                          concrete_limit=concrete_limit(data))

    plan = level_plan(data.edge_index, data.num_nodes)
    run(), trace_levels(run, data)  # warm: memo, cut estimate, level plan
    whole_s, keys_s = [], []
    for _ in range(rounds):
        t = time.process_time()
        whole = run()
        whole_s.append(time.process_time() - t)
        t = time.process_time()
        keyed, work = trace_levels(run, data)
        keys_s.append(time.process_time() - t)
    from leangnn.plan.estimate import _scale_work

    ext = _scale_work(work, data, [data])
    return {"circuit": name, "task": task, "hidden": hidden,
            "nodes": int(data.num_nodes), "levels": len(plan.forward),
            "key_levels": len(key_levels(plan)),
            "whole_seconds": statistics.median(whole_s),
            "keys_seconds": statistics.median(keys_s),
            "whole_peak": whole.peak_bytes, "keys_peak": keyed.peak_bytes,
            "whole_heap": list(whole.heap_point()),
            "keys_heap": list(keyed.heap_point()),
            **{f"{k}_ratio": ext[k] / max(1e-9, getattr(whole, k))
               for k in ("ops", "written", "flops")}}


def markdown(rows: list[dict], rounds: int) -> str:
    out = ["### The DAG model's dry run on key levels (`benchmarks/plan_dag.py`)",
           "", "    python benchmarks/plan_dag.py   # results/plan_dag.json", "",
           "One training step of the default DAG model traced over every level "
           "(op limit lifted) and as the planner traces it (key levels, those "
           f"and four narrow ones, none), alternating, {rounds} rounds, medians "
           "of CPU seconds, one thread, meta memo warm. Work: the planner's "
           "extrapolation over the whole trace's.", "",
           "| circuit | task | nodes | levels | key levels | whole trace s | "
           "planner's s | speed-up | peak whole -> keys | ops | written | FLOPs |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        peak = (f"{r['whole_peak'] / 2**20:.2f} -> {r['keys_peak'] / 2**20:.2f} MiB "
                f"({r['keys_peak'] / r['whole_peak'] - 1:+.2%})")
        out.append(f"| {r['circuit']} | {r['task']} | {r['nodes']} | {r['levels']} | "
                   f"{r['key_levels']} | {r['whole_seconds']:.2f} | "
                   f"{r['keys_seconds']:.2f} | "
                   f"{r['whole_seconds'] / r['keys_seconds']:.1f}x | {peak} | "
                   f"{r['ops_ratio']:.3f} | {r['written_ratio']:.3f} | "
                   f"{r['flops_ratio']:.3f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two small circuits")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    todo = CIRCUITS[:1] if args.quick else CIRCUITS
    rows = []
    for name, task in todo:
        r = measure(name, task, args.rounds)
        print(f"{name} ({task}): whole {r['whole_seconds']:.2f} s, planner "
              f"{r['keys_seconds']:.2f} s; peak {r['whole_peak']} -> "
              f"{r['keys_peak']}; ops x{r['ops_ratio']:.3f}", flush=True)
        rows.append(r)
    write_json(results_path("plan_dag.json", args.quick), rows)
    write_section("plan-dag", markdown(rows, args.rounds),
                  markdown_path("plan_dag", args.quick))
    speed = statistics.median(r["whole_seconds"] / r["keys_seconds"] for r in rows)
    print(f"plan_dag: {len(rows)} circuits; speed-up median {speed:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
