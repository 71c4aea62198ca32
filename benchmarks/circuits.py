"""Parse and label times: leangnn's reader vs circuitgraph's, side by side.

For each circuit the two parsers run alternately (ours, theirs, ours, ...)
``--repeat`` times in this one process; we report medians and the ratio.
Simulation (signal probability, 2^16 patterns) and static timing are timed
for leangnn alone (circuitgraph has no bit-parallel simulator to compare).

    python benchmarks/circuits.py                 # default set, incl. itc99/b19
    python benchmarks/circuits.py --quick         # small circuits only

Writes ``results/circuits.json`` and the ``circuits`` section of
``benchmarks/README.md`` (``results/quick/`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import (  # noqa: E402
    markdown_path,
    results_path,
    write_json,
    write_section,
)

DEFAULT = ["iscas85/c7552", "iscas89/s38584", "epfl/multiplier", "itc99/b18",
           "itc99/b19"]
QUICK = ["iscas85/c7552", "iscas89/s38584"]


def _time(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--circuits", nargs="*", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="default: results/circuits.json")
    ap.add_argument("--render", action="store_true",
                    help="only re-render the README section from --out")
    args = ap.parse_args(argv)
    args.out = args.out or str(results_path("circuits.json", args.quick))
    md_path = markdown_path("circuits", args.quick)
    if args.render:
        result = json.loads(Path(args.out).read_text())
        write_section("circuits", markdown(result), md_path)
        return result

    import circuitgraph
    from circuitgraph import BlackBox
    from circuitgraph.io import genus_flops
    from tqdm.auto import tqdm

    from leangnn.circuits import (
        levelize,
        read_netlist,
        resolve,
        signal_probability,
        static_timing,
    )

    bbs = [BlackBox("ff", ["CK", "D"], ["Q"])] + genus_flops
    names = args.circuits or (QUICK if args.quick else DEFAULT)
    rows = []
    for info in tqdm(resolve(names), desc="circuits"):
        ours, theirs = [], []
        for _ in range(args.repeat):
            t, net = _time(read_netlist, info.path)
            ours.append(t)
            t, _ = _time(circuitgraph.from_file, info.path, None, None, bbs)
            theirs.append(t)
        lv_t, lv = _time(levelize, net)
        sim = [_time(signal_probability, net, 1 << 16, 0, None, lv)[0]
               for _ in range(args.repeat)]
        sta = [_time(static_timing, net, None, lv)[0] for _ in range(args.repeat)]
        row = {"circuit": info.name, "nodes": net.num_nodes, "edges": net.num_edges,
               "depth": lv.depth, "parse_s": statistics.median(ours),
               "circuitgraph_parse_s": statistics.median(theirs),
               "levelize_s": lv_t, "signal_prob_s": statistics.median(sim),
               "timing_s": statistics.median(sta)}
        row["speedup"] = row["circuitgraph_parse_s"] / row["parse_s"]
        rows.append(row)
    cmd = "python benchmarks/circuits.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    result = {"command": cmd.strip(), "repeat": args.repeat, "patterns": 1 << 16,
              "cpu": platform.processor() or platform.machine(), "rows": rows}
    write_json(args.out, result)
    md = markdown(result)
    write_section("circuits", md, md_path)
    print(md)
    print(f"benchmarks/circuits.py: {len(rows)} circuits, medians of {args.repeat} "
          f"runs -> {args.out}")
    return result


def markdown(result: dict) -> str:
    lines = [
        "## Circuit data: parse, simulate, time (`benchmarks/circuits.py`)",
        "",
        f"leangnn's netlist reader against circuitgraph's own parser, run "
        f"alternately in one process (medians of {result['repeat']}); signal "
        f"probability with {result['patterns']:,} random patterns (bit-parallel), "
        "levelization and static timing are leangnn's alone. One CPU thread, "
        f"`{result.get('command', 'python benchmarks/circuits.py')}`.",
        "",
        "| circuit | nodes | edges | depth | parse (s) | circuitgraph (s) | "
        "speed-up | levelize (s) | signal prob (s) | timing (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['circuit']} | {r['nodes']:,} | {r['edges']:,} | {r['depth']} | "
            f"{r['parse_s']:.2f} | {r['circuitgraph_parse_s']:.2f} | "
            f"{r['speedup']:.1f}x | {r['levelize_s']:.3f} | "
            f"{r['signal_prob_s']:.2f} | {r['timing_s']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
