"""`leangnn.fit` with and without training on what its plan built (stop 42).

    python benchmarks/fit_reuse.py [--rounds 3]     # results/fit_reuse.json

``leangnn.fit`` plans, then trains the pick. Since stop 42 the pick trains
on what the plan's rows built: DPR's core, or the offload engine's edges
grouped by target and its partition; and the plan's offload rows share one
grouping. ``LEANGNN_PLAN_REUSE=0`` turns both off. Each case runs ``fit``
(GraphSAGE-3, 64 hidden, 3 epochs) in a fresh interpreter with one OpenMP
thread, alternating reuse on and off, ``--rounds`` times each; the report
has the medians of the whole call's wall time and of the plan's own
seconds, each run's measured need (``budget_check``) and whether the losses
of every run are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import results_path, write_json, write_section  # noqa: E402

#: (name, csbm nodes, strategy, memory budget)
CASES = [("csbm200k-prune", 200_000, "prune", "4GiB"),
         ("csbm50k-offload", 50_000, "offload", "200MiB")]

_CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from torch_geometric.nn import GraphSAGE
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.plan.user import fit
n, strategy, budget = int(sys.argv[1]), sys.argv[2], sys.argv[3]
lazy = sys.argv[4] == "1"
data = contextual_sbm(n, seed=0)
torch.manual_seed(0)
model = GraphSAGE(data.num_features, 64, 3, int(data.y.max()) + 1)
t = time.perf_counter()
out = fit(model, data, strategy=strategy, memory_budget=budget, epochs=3, lazy=lazy)
print(json.dumps({"wall": time.perf_counter() - t, "plan": out["plan"].seconds,
                  "row": out["row"].label, "taken_bytes": out["strategy"].taken_bytes,
                  "losses": out["losses"], "budget_check": out["budget_check"]}))
"""


def once(n: int, strategy: str, budget: str, reuse: bool, lazy: bool = False
         ) -> dict:
    """One ``fit`` in a fresh interpreter (``lazy``: its plan's; the reuse
    figures were measured with every row planned)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               LEANGNN_PLAN_REUSE="1" if reuse else "0")
    p = subprocess.run([sys.executable, "-c", _CHILD, str(n), strategy, budget,
                        "1" if lazy else "0"],
                       env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise RuntimeError((p.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def alternated(rounds: int, one) -> tuple[dict, dict, bool]:
    """``one(True)`` and ``one(False)`` alternated ``rounds`` times: the
    runs of each, the medians of their ``wall`` and ``plan`` seconds, and
    whether every run's losses are equal."""
    runs = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            runs[on].append(one(on))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("wall", "plan")}
           for k, v in runs.items()}
    losses = [r["losses"] for v in runs.values() for r in v]
    return runs, med, all(x == losses[0] for x in losses)


def run(rounds: int) -> dict:
    rows = []
    for name, n, strategy, budget in CASES:
        runs, med, equal = alternated(rounds, partial(once, n, strategy, budget))
        rows.append({
            "name": name, "row": runs[True][0]["row"], "rounds": rounds,
            "wall_on": med[True]["wall"], "wall_off": med[False]["wall"],
            "plan_on": med[True]["plan"], "plan_off": med[False]["plan"],
            "taken_bytes": runs[True][0]["taken_bytes"],
            "needs_on": [r["budget_check"]["measured_need_bytes"] for r in runs[True]],
            "needs_off": [r["budget_check"]["measured_need_bytes"]
                          for r in runs[False]],
            "estimated_need_bytes": runs[True][0]["budget_check"][
                "estimated_need_bytes"],
            "losses_equal": equal})
        print(f"fit_reuse: {name}: wall {med[True]['wall']:.2f} s on, "
              f"{med[False]['wall']:.2f} s off", file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d"), "rows": rows}


def markdown(res: dict) -> str:
    mib = 2.0 ** 20
    out = [f"`python benchmarks/fit_reuse.py --rounds {res['rows'][0]['rounds']}` "
           f"({res['date']}; `leangnn.fit`, GraphSAGE-3 h64, 3 epochs, one thread, "
           "medians; reuse off: `LEANGNN_PLAN_REUSE=0`):", "",
           "| case | pick | fit wall s, on / off | on / off | plan s, on / off "
           "| measured need MiB, on; off | losses equal |",
           "|---|---|---:|---:|---:|---|---|"]
    for r in res["rows"]:
        on = ", ".join(f"{x / mib:.0f}" for x in r["needs_on"])
        off = ", ".join(f"{x / mib:.0f}" for x in r["needs_off"])
        out.append(f"| {r['name']} | {r['row']} | {r['wall_on']:.2f} / "
                   f"{r['wall_off']:.2f} | {r['wall_on'] / r['wall_off']:.2f} | "
                   f"{r['plan_on']:.2f} / {r['plan_off']:.2f} | {on}; {off} | "
                   f"{'yes' if r['losses_equal'] else 'NO'} |")
    return "\n".join(out)


def cli(name: str, doc: str, run, markdown, argv=None) -> None:
    """``--rounds``, then ``results/<name>.json`` and the ``<name>`` section
    of benchmarks/README.md (``name`` with dashes)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    res = run(args.rounds)
    path = write_json(results_path(f"{name}.json"), res)
    section = name.replace("_", "-")
    write_section(section, markdown(res))
    print(f"{name}: wrote {path} and the {section} section of "
          "benchmarks/README.md", file=sys.stderr)


def main(argv=None) -> None:
    cli("fit_reuse", __doc__, run, markdown, argv)


if __name__ == "__main__":
    main()
