"""GSR flat in depth as the user measures it: ``leangnn train --strategy
reversible`` at 16, 64 and 256 layers, one epoch with validation, peak memory
taken from the Trainer's own figure and from outside the process.

``benchmarks/gsr.py`` measures the reversible stack's training steps in a
harness; this script runs the command a user types (circuit loading, the
Trainer's epoch, validation, checkpoint and run directory, the default glibc
allocator) in a fresh process per depth and reports

* the Trainer's figure (``summary.json`` ``memory.peak_bytes``: peak RSS of
  the epoch and its validation above the RSS once data and model are loaded,
  what ``leangnn train`` prints);
* the kernel's peak RSS of the whole process (``ru_maxrss`` via ``wait4``,
  measured from outside, see :func:`leangnn.profile.run_with_peak_rss`), and
  that peak above the Trainer's baseline.

Depths run in alternating rounds; figures are medians over rounds.

Usage::

    python benchmarks/gsr_cli.py                       # 16, 64, 256 layers
    python benchmarks/gsr_cli.py --depths 16,256 --rounds 2
    python benchmarks/gsr_cli.py -- --no-flat-parameters  # extra train options

Writes ``results/gsr_cli.json`` and prints its markdown (merged into
``benchmarks/README.md`` by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _report import results_path, write_json

from leangnn.profile import run_with_peak_rss

MIB = float(1 << 20)
TARGET = 1.15  # peak at the deepest over the shallowest depth


def command(layers: int, out: str, args) -> list[str]:
    return [sys.executable, "-m", "leangnn", "train", "--strategy", "reversible",
            "--dataset", args.dataset, "--test-dataset", args.test_dataset,
            "--hidden", "64", "--groups", "4", "--layers", str(layers),
            "--epochs", "1", "--seed", str(args.seed), "--out", out, "--force",
            "--quiet", *args.extra]


def run_one(layers: int, args, arenas: str | None = None) -> dict:
    env = None
    if arenas is not None:  # glibc's arena cap; "0": glibc's default
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        if arenas != "0":
            env["MALLOC_ARENA_MAX"] = arenas
    with tempfile.TemporaryDirectory(prefix="gsr_cli") as tmp:
        out = str(Path(tmp) / "run")
        cmd = command(layers, out, args)
        r = run_with_peak_rss(cmd, timeout=args.timeout, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n"
                               f"{r.stderr[-3000:]}")
        s = json.loads((Path(out) / "summary.json").read_text())
    mem = s["memory"]
    return {"layers": layers, "arenas": arenas,
            "trainer_peak_mib": mem["peak_bytes"] / MIB,
            "baseline_mib": mem["baseline_bytes"] / MIB,
            "process_peak_mib": r.peak_bytes / MIB,
            "process_above_baseline_mib": (r.peak_bytes - mem["baseline_bytes"])
            / MIB,
            "wall_s": r.seconds, "test": s["metrics"]["test"],
            "val": s["metrics"]["val"],
            "epoch_s": s["time"]["epoch_seconds_median"]}


def summarise(runs: list[dict], depths: list[int]) -> dict:
    keys = ("trainer_peak_mib", "process_peak_mib", "process_above_baseline_mib",
            "baseline_mib", "epoch_s")
    med = {d: {k: statistics.median(r[k] for r in runs if r["layers"] == d)
               for k in keys} for d in depths}
    lo, hi = min(depths), max(depths)
    ratios = {k: med[hi][k] / med[lo][k] for k in keys[:3]}
    return {"median": med, "ratios": ratios, "shallow": lo, "deep": hi}


def markdown(res: dict) -> str:
    s, a = res["summary"], res["args"]
    lo, hi = s["shallow"], s["deep"]
    lines = [f"`leangnn train --strategy reversible --dataset {a['dataset']} "
             f"--test-dataset {a['test_dataset']} --hidden 64 --groups 4 "
             f"--layers L --epochs 1 {' '.join(a['extra'])}`".replace(" `", "`"),
             f"(median of {a['rounds']} alternating rounds)", "",
             "| layers | Trainer peak MiB | process peak MiB | process peak above "
             "the Trainer's baseline MiB |", "|---:|---:|---:|---:|"]
    for d in sorted(s["median"], key=int):
        m = s["median"][d]
        lines.append(f"| {d} | {m['trainer_peak_mib']:.1f} | "
                     f"{m['process_peak_mib']:.1f} | "
                     f"{m['process_above_baseline_mib']:.1f} |")
    r = s["ratios"]
    lines += ["", "| check | value | target | met |", "|---|---:|---:|---|"]
    for key, label in (("trainer_peak_mib", "Trainer peak"),
                       ("process_above_baseline_mib",
                        "process peak above baseline"),
                       ("process_peak_mib", "process peak (whole process)")):
        v = r[key]
        lines.append(f"| {label}, {hi} / {lo} layers | {v:.3f} | <= {TARGET} | "
                     f"{'yes' if v <= TARGET else 'no'} |")
    if "by_arenas" in res:
        lines += ["", "| MALLOC_ARENA_MAX | Trainer peak "
                  f"{lo} / {hi} layers MiB | ratio | s/epoch {lo} / {hi} | target |",
                  "|---|---:|---:|---:|---|"]
        for k, v in res["by_arenas"].items():
            m, ratio = v["median"], v["ratios"]["trainer_peak_mib"]
            lines.append(f"| {k} | {m[lo]['trainer_peak_mib']:.1f} / "
                         f"{m[hi]['trainer_peak_mib']:.1f} | {ratio:.3f} | "
                         f"{m[lo]['epoch_s']:.1f} / {m[hi]['epoch_s']:.1f} | "
                         f"<= {TARGET} {'met' if ratio <= TARGET else 'missed'} |")
    lines += ["", "Reproduce: `python benchmarks/gsr_cli.py`."]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="16,64,256")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dataset", default="epfl/multiplier")
    ap.add_argument("--test-dataset", default="iscas85/c17",
                    help="a small circuit: the test pass runs after the "
                         "Trainer's meter, and a large one would only add time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arenas", default=None,
                    help="comma-separated MALLOC_ARENA_MAX values run side by "
                         "side (e.g. 0,1: glibc's default and one arena); the "
                         "summary is the first's")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--out", default=None, help="default: results/gsr_cli.json")
    ap.add_argument("extra", nargs="*", help="more `leangnn train` options "
                    "(after --)")
    args = ap.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    settings = args.arenas.split(",") if args.arenas else [None]
    runs = []
    for rnd in range(args.rounds):
        for d in (depths if rnd % 2 == 0 else depths[::-1]):
            for a in (settings if rnd % 2 == 0 else settings[::-1]):
                runs.append(run_one(d, args, a))
                print(f"round {rnd} layers {d} arenas {a}: trainer "
                      f"{runs[-1]['trainer_peak_mib']:.1f} MiB, process "
                      f"{runs[-1]['process_peak_mib']:.1f} MiB, "
                      f"{runs[-1]['epoch_s']:.1f} s/epoch", file=sys.stderr)
    res = {"args": {**vars(args), "depths": depths}, "runs": runs,
           "summary": summarise([r for r in runs if r["arenas"] == settings[0]],
                                depths)}
    if len(settings) > 1:
        res["by_arenas"] = {a: summarise([r for r in runs if r["arenas"] == a],
                                         depths) for a in settings}
    res["target"] = TARGET
    out = Path(args.out) if args.out else results_path("gsr_cli.json")
    write_json(out, res)
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
