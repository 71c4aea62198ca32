"""The planner's epoch-time estimate against `leangnn train`, two time models
side by side on the same measurements.

Each of the cli section's rows (``benchmarks/plan.py``, the 2M-node row left
out) runs once as ``python -m leangnn train ARGS --epochs 3`` in a fresh
interpreter with one intra-op thread; its epoch CPU time (median of the
three) is compared with the estimate of what it trained (an ``auto`` row:
its pick) under this machine's stored calibration and under a second one
(``--against``, default: the reference shipped at git ``HEAD``), both
applied to the same traced work: the measurement is shared, only the time
terms differ. Machine speed moves from day to day (the same command lines
took 0.67-2.24x as long on the reference box as in the session that
measured the cli section), so only a calibration measured beside the runs
is compared with them.

    python benchmarks/plan_time.py   # results/plan_time.json, plan-time section
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import markdown_path, results_path, write_json, write_section  # noqa: E402
from plan import CLI_ROWS, _cli_config  # noqa: E402

REF = "src/leangnn/plan/reference/glibc-default.json"


def _other_calibration(spec: str):
    from leangnn.plan.calibration import Calibration

    if spec.startswith("git:"):
        text = subprocess.run(["git", "show", f"{spec[4:]}:{REF}"], check=True,
                              capture_output=True, text=True).stdout
    else:
        text = Path(spec).read_text()
    return Calibration.from_dict(json.loads(text))


def _run(args: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="plan-time-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "leangnn", "train", *shlex.split(args),
               "--epochs", "3", "--out", str(out), "--quiet"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        cpu = [json.loads(line)["epoch_cpu_seconds"] for line in
               (out / "metrics.jsonl").read_text().splitlines() if line]
        s = json.loads((out / "summary.json").read_text())
    return {"cpu": statistics.median(cpu), "config": s.get("plan", {}).get("config")}


def _estimates(args: str, ran: dict, cals: dict, cache: dict) -> dict:
    from leangnn.config import TrainConfig
    from leangnn.data import load_graphs
    from leangnn.plan.estimate import estimate_config

    cfg = _cli_config(shlex.split(args))
    if cfg.strategy == "auto":
        cfg = TrainConfig.from_dict({**cfg.to_dict(), **ran["config"]})
    key = (cfg.dataset, cfg.val_dataset, cfg.test_dataset)
    if key not in cache:
        cache.clear()
        cache[key] = load_graphs(cfg, progress=False)
    est = estimate_config(cfg, cache[key])
    out = {}
    for name, cal in cals.items():
        e = copy.deepcopy(est)
        cal.apply(e)
        out[name] = e.epoch_seconds
    return out


def _stats(ratios: list[float]) -> str:
    within = sum(1 / 1.25 <= r <= 1.25 for r in ratios)
    return (f"measured / estimated median {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}x), within 1.25x: {within} of "
            f"{len(ratios)}")


def main(argv: list[str] | None = None) -> int:
    from leangnn.plan.calibration import calibration_label, load_calibration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="git:HEAD",
                    help="the other calibration: git:REV (its shipped reference) "
                         "or a JSON path (default: git:HEAD)")
    ap.add_argument("--only", nargs="+", help="these rows alone")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    try:
        other = _other_calibration(args.against)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        ap.error(f"--against {args.against}: not a calibration ({e})")
    cals = {"this": load_calibration("cpu"), "other": other}
    rows, cache = [], {}
    for row in CLI_ROWS:
        if row["name"].startswith("csbm2m") or (args.only and row["name"]
                                                not in args.only):
            continue
        ran = _run(row["args"], args.timeout)
        if "error" in ran:
            print(f"{row['name']}: {ran['error']}", file=sys.stderr)
            continue
        est = _estimates(row["args"], ran, cals, cache)
        rows.append({"name": row["name"], "held_out": bool(row.get("holdout")),
                     "measured_cpu": ran["cpu"], **{f"est_{k}": v
                                                    for k, v in est.items()}})
        print(f"{row['name']}: {ran['cpu']:.3f} s, estimated {est['this']:.3f} "
              f"(other {est['other']:.3f})", flush=True)
    write_json(results_path("plan_time.json", False), rows)
    lines = [f"`python benchmarks/plan_time.py --against {args.against}` (one run "
             "per row, 3 epochs, one thread; epoch CPU time, median of the three): "
             f"**this** = {calibration_label(cals['this'])}, measured beside the "
             f"runs; **other** = `{args.against}`.", "",
             "| row | measured | this | ratio | other | ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['measured_cpu']:.3f} s | "
                     f"{r['est_this']:.3f} | {r['measured_cpu'] / r['est_this']:.2f}x"
                     f" | {r['est_other']:.3f} | "
                     f"{r['measured_cpu'] / r['est_other']:.2f}x |")
    for label, keep in (("rows", lambda r: not r["held_out"]),
                        ("held-out rows", lambda r: r["held_out"])):
        sel = [r for r in rows if keep(r)]
        if sel:
            lines += ["", f"{len(sel)} {label}: this "
                      + _stats([r["measured_cpu"] / r["est_this"] for r in sel])
                      + "; other " + _stats([r["measured_cpu"] / r["est_other"]
                                              for r in sel]) + "."]
    write_section("plan-time", "\n".join(lines), markdown_path("plan_time", False))
    print("\n".join(lines[-3:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
