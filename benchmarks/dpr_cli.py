"""DPR at scale as the user runs it: ``leangnn train --strategy prune`` on a CSBM
graph, peak process RSS measured from outside the process.

The harness of ``benchmarks/dpr.py --big`` trains through the Trainer too, but
in a process that loads a saved graph and skips validation and testing; this
script runs the command a user types (graph generated in the process,
validation every epoch, test evaluation, run directory and checkpoints) and
reports the kernel's peak RSS of that process (``ru_maxrss`` via ``wait4``,
see :func:`leangnn.profile.run_with_peak_rss`), beside the harness's figure
from ``results/dpr.json`` (not re-run here: the 2.45M-node harness run takes
~8 minutes) and the target.

Usage::

    python benchmarks/dpr_cli.py                  # csbm:2450000, 3 epochs
    python benchmarks/dpr_cli.py --nodes 500000   # a smaller graph

Writes ``results/dpr_cli.json`` and prints its markdown (merged into
``benchmarks/README.md`` by hand).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _report import results_path, write_json

from leangnn.profile import run_with_peak_rss

MIB = float(1 << 20)
TARGET_GIB = 6.0


def command(nodes: int, epochs: int, out: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "leangnn", "train", "--strategy", "prune",
            "--dataset", f"csbm:{nodes}", "--task", "critical", "--budget-ratio",
            "0.3", "--model", "sage", "--layers", "2", "--epochs", str(epochs),
            "--out", out, "--force", "--quiet", *extra]


def run(nodes: int, epochs: int, extra: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="dpr_cli") as tmp:
        out = str(Path(tmp) / "run")
        cmd = command(nodes, epochs, out, extra)
        r = run_with_peak_rss(cmd, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n"
                               f"{r.stderr[-3000:]}")
        summary = json.loads((Path(out) / "summary.json").read_text())
    test = summary["metrics"]["test"]
    cmd_text = " ".join(["leangnn", *cmd[3:]]).replace(f" --out {out}", "")
    return {"command": cmd_text, "nodes": nodes, "epochs": epochs,
            "process_peak_mib": r.max_bytes / MIB,  # see CommandPeak.max_bytes
            "ru_maxrss_mib": r.peak_bytes / MIB,
            "sampled_peak_mib": r.sampled_peak_bytes / MIB,
            "trainer_peak_mib": summary["memory"]["peak_bytes"] / MIB,
            "trainer_baseline_mib": summary["memory"]["baseline_bytes"] / MIB,
            "test_accuracy": test.get("accuracy"), "wall_s": r.seconds,
            "core_size": summary.get("core_size"),
            "all_node_inference_s": summary.get("all_node_inference_s"),
            # which reconstruction served (DPRConfig.decoder="auto" decides on
            # validation) and the validation error gain behind the choice
            "decoder_choice": summary.get("decoder_choice"),
            "decoder_gain": summary.get("decoder_gain")}


def harness_peak(nodes: int) -> float | None:
    path = results_path("dpr.json")
    if not path.exists():
        return None
    big = json.loads(path.read_text()).get("big")
    if not big or big.get("num_nodes") != nodes:
        return None
    return float(big["abs_peak_mib"])


def markdown(res: dict) -> str:
    h = res["harness_abs_peak_mib"]
    peak = res["process_peak_mib"]
    ok = peak <= TARGET_GIB * 1024
    acc = "n/a" if res["test_accuracy"] is None else f"{res['test_accuracy']:.4f}"
    lines = [
        "| run | process peak MiB | harness peak MiB | target | met |",
        "|---|---:|---:|---:|---|",
        f"| `{res['command']}` | {peak:,.0f} | "
        f"{'-' if h is None else f'{h:,.0f}'} | < {TARGET_GIB * 1024:,.0f} | "
        f"{'yes' if ok else 'no'} |",
        "",
        f"Process peak: the larger of the `leangnn train` process's "
        f"`ru_maxrss` (via `wait4`, from outside: "
        f"{res.get('ru_maxrss_mib', peak):,.0f} MiB) and its VmRSS polled every "
        f"50 ms ({res['sampled_peak_mib']:,.0f} MiB), graph generation, "
        f"validation every epoch and the test evaluation included; the "
        f"Trainer's own meter: {res['trainer_peak_mib']:,.0f} MiB above "
        f"{res['trainer_baseline_mib']:,.0f} MiB. Test accuracy "
        f"{acc}"
        + (f" (pruned nodes served by the {res['decoder_choice']} decoder choice, "
           f"validation error gain {res['decoder_gain'] or 0:+.4f})"
           if res.get("decoder_choice") else "")
        + ". Harness: `benchmarks/dpr.py --big` "
        "(`abs_peak_mib` in `results/dpr.json`, a graph loaded from disk, no "
        "validation or test pass). `python benchmarks/dpr_cli.py`.",
    ]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2_450_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--out", default=None,
                    help="default: results/dpr_cli.json (results/quick/... "
                         "for graphs other than the 2.45M-node one)")
    ap.add_argument("extra", nargs="*", help="more `leangnn train` options "
                    "(after --)")
    args = ap.parse_args(argv)
    res = run(args.nodes, args.epochs, args.extra, args.timeout)
    res["harness_abs_peak_mib"] = harness_peak(args.nodes)
    res["target_mib"] = TARGET_GIB * 1024
    res["met"] = res["process_peak_mib"] <= res["target_mib"]
    out = Path(args.out) if args.out else results_path(
        "dpr_cli.json", quick=args.nodes != 2_450_000)
    write_json(out, res)
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
