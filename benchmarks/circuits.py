"""Parse and label times: leangnn's reader vs circuitgraph's, side by side.

For each circuit the two parsers run alternately (ours, theirs, ours, ...)
``--repeat`` times in this one process; we report medians and the ratio.
Simulation (signal probability, 2^16 patterns) and static timing are timed
for leangnn alone (circuitgraph has no bit-parallel simulator to compare).

    python benchmarks/circuits.py                 # default set, incl. itc99/b19
    python benchmarks/circuits.py --quick         # small circuits only

Writes ``results/circuits.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

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
    ap.add_argument("--out", default="results/circuits.json")
    args = ap.parse_args(argv)

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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {"repeat": args.repeat, "patterns": 1 << 16, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| circuit | nodes | edges | depth | parse (s) | circuitgraph (s) | "
          "speed-up | signal prob 2^16 (s) | timing (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['circuit']} | {r['nodes']:,} | {r['edges']:,} | {r['depth']} | "
              f"{r['parse_s']:.3f} | {r['circuitgraph_parse_s']:.2f} | "
              f"{r['speedup']:.1f}x | {r['signal_prob_s']:.2f} | {r['timing_s']:.3f} |")
    print(f"benchmarks/circuits.py: {len(rows)} circuits, medians of {args.repeat} "
          f"runs -> {args.out}")
    return result


if __name__ == "__main__":
    main()
