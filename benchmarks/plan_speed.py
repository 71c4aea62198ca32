"""Planning cost against one real epoch, before/after side by side (issue 11).

Issue 11's target: the estimate takes at most 10% of one real epoch. For each
row (a ``leangnn train`` command line) this script

* times the estimate (``estimate_config`` of the configuration, or the lazy
  ``plan_config`` of ``--strategy auto``, as ``leangnn train`` runs it) in a
  fresh interpreter per round, by the thread's CPU time with one OpenMP
  thread (the load of the shared machine stays out), alternating rounds of
  the code under test and of a reference source tree (``--before SRC``, e.g.
  an export of the last commit), and reports medians;
* reads one real epoch's CPU time from a ``leangnn train`` run of the same
  command line (``metrics.jsonl``'s ``epoch_cpu_seconds``, median over the
  epochs; cached in the JSON, ``--remeasure`` repeats it).

Disk caches (METIS partitions, parsed circuits) are warm in every round, as
they are for a user's second run; in-process caches are cold. Both trees are
byte-compiled first (:data:`PYCACHE`), as an installed package is: until stop
34 the children inherited this machine's ``PYTHONDONTWRITEBYTECODE=1`` and
compiled the dry run's lazily imported module in every estimate.

``--all`` does the first two for every row of ``benchmarks/plan.py``'s cli
section (held-out rows too, no ``--before`` needed) and writes
``results/plan_cost.json`` with a summary: the planning cost against epochs
measured the same day, in the same conditions.

``--cli-wall ROW...`` times what ``--strategy auto`` adds to a run, from the
user's side: the total wall time of ``leangnn train ROW-ARGS`` (the auto
command line) against ``leangnn train`` of its pick (``--strategy <pick>``
and the pick's knobs, read from the auto run's ``summary.json``), each in a
fresh interpreter with one OpenMP thread, alternating (auto, pick, and the
auto command on the ``--before`` tree when given), ``--rounds`` times each,
medians reported (``results/plan_auto_wall.json``).

``--traces ROW...`` instead times the dry runs themselves: every
``trace_step`` call the estimate of each named row of ``benchmarks/plan.py``'s
cli section makes is run on both backends (``fake``: ``FakeTensorMode``;
``meta``: :mod:`leangnn.plan.meta`), alternating, in one process after one
warm-up call (model-level caches, e.g. the DAG model's level schedule, filled),
and the traces are compared field by field.

    python benchmarks/plan_speed.py --before /tmp/before/src   # results/plan_speed.json
    python benchmarks/plan_speed.py --all --rounds 1 --remeasure  # plan_cost.json
    python benchmarks/plan_speed.py --traces b19-full-sage2 mult-gsr16-gat
    python benchmarks/plan_speed.py --before /tmp/before/src --cli-wall \
        csbm100k-auto-sage3 h-csbm50k-auto-gcn3
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

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "plan_speed.json"
TRACES_OUT = ROOT / "benchmarks" / "results" / "plan_trace_speed.json"
COST_OUT = ROOT / "benchmarks" / "results" / "plan_cost.json"
WALL_OUT = ROOT / "benchmarks" / "results" / "plan_auto_wall.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import merge_rows  # noqa: E402
from plan import CLI_ROWS  # noqa: E402  (the cli section's command lines)

# rows of the cli section (offload and auto: the estimate is more than the
# dry run; full and reversible: mostly the dry run) plus the auto case's
# 4-part offload row
ROWS = [r for r in CLI_ROWS if r["name"] in (
    "b19-offload-sage3", "csbm100k-offload-gcn2", "csbm100k-auto-sage3",
    "b19-full-sage2", "b19-gsr16", "mult-full-res8", "csbm20k-full-gat2",
    "h-csbm50k-auto-gcn3", "csbm20k-auto-res16")] + [
    dict(name="s38417-offload-gcn3", args="--dataset iscas89/s38417 --val-dataset "
         "iscas85/c17 --test-dataset iscas85/c432 --strategy offload --model gcn "
         "--layers 3 --hidden 64 --device-budget 26667582 --parts 4"),
]

_CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from leangnn.cli import _TRAIN_FLAGS, build_parser
from leangnn.config import TrainConfig
from leangnn.data import load_graphs
from leangnn.plan.calibration import load_calibration
args = build_parser().parse_args(["train", *json.loads(sys.argv[1])])
cfg = TrainConfig(**{f: getattr(args, a) for a, f in _TRAIN_FLAGS.items()
                     if getattr(args, a) is not None})
splits = load_graphs(cfg, progress=False)
cal = load_calibration(torch.device(cfg.device))
# imported before the clock starts, as the Trainer's modules are before its
# first epoch: a process pays them once (~0.05 s CPU), not per estimate
from leangnn.plan.estimate import estimate_config
from leangnn.plan.planner import choose, plan_config
t = time.thread_time()
if cfg.strategy == "auto":
    table = plan_config(cfg, splits, cfg.memory_budget, calibration=cal, lazy=True)
    row = choose(table)
    est, pick = row.estimate, row.label
else:
    est, pick = estimate_config(cfg, splits, calibration=cal), None
cpu = time.thread_time() - t
print(json.dumps({"cpu": cpu, "pick": pick, "run_bytes": est.run_bytes,
                  "step_bytes": est.step_bytes, "peak_bytes": est.peak_bytes,
                  "epoch_seconds": est.epoch_seconds}))
"""


#: compiled modules for every tree timed (a user's install has its .pyc; a
#: shell with PYTHONDONTWRITEBYTECODE=1, as the project's CI machine has,
#: compiled leangnn.plan.meta inside every estimate: ~3 ms of ~40)
PYCACHE = Path(tempfile.gettempdir()) / "leangnn-plan-speed-pycache"


def _env(src: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPYCACHEPREFIX=str(PYCACHE))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def compile_tree(src: str | None) -> None:
    """Byte-compile ``src`` (default: this tree's ``src/``) into
    :data:`PYCACHE` before any round, so no round compiles a module."""
    tree = src or str(ROOT / "src")
    subprocess.run([sys.executable, "-m", "compileall", "-q", tree], env=_env(src),
                   check=True, capture_output=True)


def estimate_once(row: dict, src: str | None) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD,
                        json.dumps(shlex.split(row["args"]))], env=_env(src),
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def train_run(args: list[str], src: str | None, epochs: int
              ) -> tuple[list[dict], dict]:
    """One ``leangnn train ARGS --epochs E`` in a fresh interpreter with one
    OpenMP thread (``src``: another tree's ``src/`` first on the path): its
    ``metrics.jsonl`` records and its ``summary.json``."""
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as tmp:
        out = Path(tmp) / "run"
        p = subprocess.run([sys.executable, "-m", "leangnn", "train", *args,
                            "--epochs", str(epochs), "--out", str(out), "--quiet"],
                           env=_env(src), capture_output=True, text=True,
                           timeout=1800, cwd=ROOT)
        if p.returncode:
            raise RuntimeError(f"leangnn train {shlex.join(args)}: "
                               f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
        rec = [json.loads(x) for x in (out / "metrics.jsonl").read_text().split("\n")
               if x]
        return rec, json.loads((out / "summary.json").read_text())


def epoch_cpu(row: dict, epochs: int = 2) -> float:
    rec, _ = train_run(shlex.split(row["args"]), None, epochs)
    return statistics.median(r["epoch_cpu_seconds"] for r in rec)


_TRACES_CHILD = r"""
import dataclasses, json, statistics, sys, time
import torch
torch.set_num_threads(1)
from leangnn.cli import _TRAIN_FLAGS, build_parser
from leangnn.config import TrainConfig
from leangnn.data import load_graphs
from leangnn.plan import estimate as E
from leangnn.plan.dryrun import trace_step
rounds = int(sys.argv[2])
args = build_parser().parse_args(["train", *json.loads(sys.argv[1])])
cfg = TrainConfig(**{f: getattr(args, a) for a, f in _TRAIN_FLAGS.items()
                     if getattr(args, a) is not None})
splits = load_graphs(cfg, progress=False)
calls = []

def timed(*a, **k):
    trace_step(*a, **k)  # warm-up: the model's own caches filled
    times, traces = {"fake": [], "meta": []}, {}
    for _ in range(rounds):
        for be in ("fake", "meta"):
            t = time.thread_time()
            tr = trace_step(*a, **k, backend=be)
            times[be].append(time.thread_time() - t)
            traces[be] = dataclasses.asdict(tr)
    calls.append({"fake": statistics.median(times["fake"]),
                  "meta": statistics.median(times["meta"]),
                  "equal": traces["fake"] == traces["meta"],
                  "ops": traces["meta"]["ops"],
                  "peak_bytes": traces["meta"]["peak_bytes"]})
    return tr

E.trace_step = timed
try:
    if cfg.strategy == "auto":
        from leangnn.plan.planner import plan_config
        plan_config(cfg, splits, cfg.memory_budget, lazy=True)
    else:
        E.estimate_config(cfg, splits)
except Exception as e:  # e.g. a dry run the model cannot have
    print(json.dumps({"error": f"{type(e).__name__}: {e}", "calls": calls}))
    raise SystemExit(0)
print(json.dumps({"calls": calls}))
"""


def traces(names: list[str], rounds: int) -> None:
    from plan import CLI_ROWS as ALL

    rows = []
    for name in names:
        row = next((r for r in ALL if r["name"] == name), None)
        if row is None:
            raise SystemExit(f"--traces: no cli row {name!r}")
        p = subprocess.run([sys.executable, "-c", _TRACES_CHILD,
                            json.dumps(shlex.split(row["args"])), str(rounds)],
                           env=_env(None), capture_output=True, text=True,
                           timeout=1800, cwd=ROOT)
        if p.returncode:
            raise RuntimeError(p.stderr.strip().splitlines()[-1])
        res = json.loads(p.stdout.strip().splitlines()[-1])
        calls = res["calls"]
        fake = sum(c["fake"] for c in calls)
        meta = sum(c["meta"] for c in calls)
        r = {"name": name, "args": row["args"], "traces": len(calls),
             "fake_cpu_seconds": fake, "meta_cpu_seconds": meta,
             "speedup": fake / meta if meta else None,
             "equal": all(c["equal"] for c in calls), "calls": calls,
             "error": res.get("error")}
        print(json.dumps(r), flush=True)
        rows.append(r)
    keep = merge_rows(TRACES_OUT, rows)
    lines = ["| row | traces | dry runs CPU s, fake | meta | speed-up (target >= 5x) "
             "| traces equal |", "|---|---:|---:|---:|---:|---|"]
    for r in keep + rows:
        sp = f"{r['speedup']:.1f}x" if r["speedup"] else ""
        lines.append(f"| {r['name']} | {r['traces']} | {r['fake_cpu_seconds']:.3f} | "
                     f"{r['meta_cpu_seconds']:.3f} | {sp} | "
                     f"{'yes' if r['equal'] else '**no**'} |")
    print("\n".join(lines))


def _train_wall(args: list[str], src: str | None, epochs: int
                ) -> tuple[float, float, dict]:
    """Wall and CPU (user + system) seconds of one ``leangnn train`` process,
    and its summary. With one thread the CPU seconds are what an idle
    machine's wall time would be (a shared machine's wall time is not)."""
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    _, summary = train_run(args, src, epochs)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu, summary


def _pick_args(args: list[str], plan: dict) -> list[str]:
    """The auto command line with ``--strategy auto --memory-budget B``
    replaced by the pick's strategy and knobs."""
    from leangnn.cli import _TRAIN_FLAGS

    flag = {field: "--" + f.replace("_", "-") for f, field in _TRAIN_FLAGS.items()}
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--strategy", "--memory-budget"):
            skip = True
            continue
        out.append(a)
    for field, value in plan["config"].items():
        out += [flag[field], str(value)]
    return out


def cli_wall(names: list[str], rounds: int, before: str | None, epochs: int,
             out: Path = WALL_OUT) -> None:
    from plan import CLI_ROWS as ALL

    rows = []
    for name in names:
        row = next((r for r in ALL if r["name"] == name), None)
        if row is None or "--strategy auto" not in row["args"]:
            raise SystemExit(f"--cli-wall: no auto cli row {name!r}")
        auto = shlex.split(row["args"])
        sides = ("auto", "pick", "auto_before")
        walls: dict[str, list] = {k: [] for k in sides}
        cpus: dict[str, list] = {k: [] for k in sides}
        plans: dict[str, list] = {"auto": [], "auto_before": []}
        pick = None
        for _ in range(rounds):
            for side in sides:
                if side == "auto_before" and not before:
                    continue
                # the pick's command line: from the first auto run's summary
                w, c, s = _train_wall(pick if side == "pick" else auto,
                                      before if side == "auto_before" else None,
                                      epochs)
                walls[side].append(w)
                cpus[side].append(c)
                if side != "pick":
                    plans[side].append(s["plan"]["plan_seconds"])
                if side == "auto" and pick is None:
                    pick = _pick_args(auto, s["plan"])

        def med(d):
            return {k: statistics.median(v) for k, v in d.items() if v}

        wm, cm = med(walls), med(cpus)
        r = {"name": name, "auto_args": row["args"], "pick_args": shlex.join(pick),
             "epochs": epochs, "rounds": rounds,
             "wall_seconds": wm, "cpu_seconds": cm, "walls": walls, "cpus": cpus,
             "plan_seconds": med(plans),
             "auto_adds_wall_seconds": wm["auto"] - wm["pick"],
             "auto_adds_cpu_seconds": cm["auto"] - cm["pick"],
             "auto_adds_wall_seconds_before": (wm["auto_before"] - wm["pick"]
                                               if "auto_before" in wm else None),
             "auto_adds_cpu_seconds_before": (cm["auto_before"] - cm["pick"]
                                              if "auto_before" in cm else None)}
        print(json.dumps(r), flush=True)
        rows.append(r)
    keep = merge_rows(out, rows)
    lines = ["| row | pick | process CPU s (wall s), pick | auto | auto before "
             "| auto adds | before |", "|---|---|---:|---:|---:|---:|---:|"]

    def both(r, k):
        c, w = r["cpu_seconds"].get(k), r["wall_seconds"].get(k)
        return "" if c is None else f"{c:.2f} ({w:.2f})"

    for r in keep + rows:
        ab, wb = r.get("auto_adds_cpu_seconds_before"), \
            r.get("auto_adds_wall_seconds_before")
        lines.append(f"| {r['name']} | `{r['pick_args']}` | {both(r, 'pick')} | "
                     f"{both(r, 'auto')} | {both(r, 'auto_before')} | "
                     f"{r['auto_adds_cpu_seconds']:.2f} "
                     f"({r['auto_adds_wall_seconds']:.2f}) | "
                     f"{'' if ab is None else f'{ab:.2f} ({wb:.2f})'} |")
    print("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="source tree (its src/) of the reference")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--all", action="store_true",
                    help="every row of the cli section (held-out rows too), "
                    "into results/plan_cost.json with a summary")
    ap.add_argument("--remeasure", action="store_true")
    ap.add_argument("--traces", nargs="+", metavar="ROW",
                    help="time the dry runs of these cli rows on both backends")
    ap.add_argument("--cli-wall", nargs="+", metavar="ROW",
                    help="wall time of these auto cli rows against their pick")
    ap.add_argument("--epochs", type=int, default=3,
                    help="epochs of each --cli-wall run (default: 3)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the JSON to update (default: results/plan_speed.json, "
                    "with --cli-wall results/plan_auto_wall.json)")
    args = ap.parse_args(argv)
    for tree in (None, args.before) if args.before else (None,):
        compile_tree(tree)
    if args.cli_wall:
        cli_wall(args.cli_wall, args.rounds, args.before, args.epochs,
                 args.out or WALL_OUT)
        return
    if args.traces:
        traces(args.traces, args.rounds)
        return
    out = args.out or (COST_OUT if args.all else OUT)
    old = json.loads(out.read_text()) if out.is_file() else {}
    prev = {r["name"]: r for r in old.get("rows", [])}
    rows = []
    for row in (CLI_ROWS if args.all else ROWS):
        if args.only and not any(s in row["name"] for s in args.only):
            continue
        p = prev.get(row["name"], {})
        ep = p.get("epoch_cpu_seconds") if p.get("args") == row["args"] else None
        if ep is None or args.remeasure:
            ep = epoch_cpu(row)
        runs: dict[str, list] = {"after": [], "before": []}
        for _ in range(args.rounds):
            runs["after"].append(estimate_once(row, None))
            if args.before:
                runs["before"].append(estimate_once(row, args.before))
        r = {"name": row["name"], "args": row["args"], "epoch_cpu_seconds": ep,
             "holdout": bool(row.get("holdout"))}
        for side, res in runs.items():
            if not res:
                continue
            cpu = statistics.median(x["cpu"] for x in res)
            r[side] = {"estimate_cpu_seconds": cpu, "share_of_epoch": cpu / ep,
                       "pick": res[-1]["pick"],
                       "step_bytes": res[-1]["step_bytes"],
                       "run_bytes": res[-1]["run_bytes"],
                       "epoch_seconds": res[-1]["epoch_seconds"],
                       "rounds": [x["cpu"] for x in res]}
        print(json.dumps(r), flush=True)
        rows.append(r)
    done = {r["name"] for r in rows}
    keep = [x for x in old.get("rows", []) if x["name"] not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    from leangnn.utils import atomic_write_text

    res = {"rows": keep + rows}
    if args.all:
        # (rows kept from an older file may lack the flag)
        res["summary"] = summary([r for r in res["rows"] if not r.get("holdout")])
        res["holdout_summary"] = summary([r for r in res["rows"]
                                          if r.get("holdout")])
        print(json.dumps({k: res[k] for k in ("summary", "holdout_summary")}))
    atomic_write_text(out, json.dumps(res, indent=1))
    print(markdown(keep + rows))


def summary(rows: list[dict]) -> dict:
    """Median share of an epoch and rows within issue 11's 10%, per side."""
    out = {"rows": len(rows)}
    for side in ("before", "after"):
        share = [r[side]["share_of_epoch"] for r in rows if side in r]
        if share:
            out[side] = {"median_share": statistics.median(share),
                         "worst_share": max(share),
                         "within_10": sum(s <= 0.10 for s in share)}
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| row | epoch CPU s | estimate CPU s before | after | share of epoch "
             "before | after (target <= 10%) |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        b, a = r.get("before", {}), r.get("after", {})

        def f(d, k, pct=False):
            v = d.get(k)
            return "" if v is None else (f"{v:.0%}" if pct else f"{v:.2f}")
        lines.append(f"| {r['name']} | {r['epoch_cpu_seconds']:.2f} | "
                     f"{f(b, 'estimate_cpu_seconds')} | {f(a, 'estimate_cpu_seconds')}"
                     f" | {f(b, 'share_of_epoch', True)} | "
                     f"{f(a, 'share_of_epoch', True)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
