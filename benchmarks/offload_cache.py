"""Offload cache policies against the offline optimum (Belady's MIN).

For the exact layer-wise schedule (NeutronJittor, Fundamental Research 2026)
the whole epoch's access sequence is known, so Belady's MIN (evict the row
whose next use is furthest away) over the same trace and the same cache rows
is computable. For each graph and budget this runs the engine's policies
``none``/``lru``/``degree``/``st`` (counting engines, ``virtual=True``),
records the ``st`` engine's trace (the same jobs as ``lru`` and ``degree``:
they share the schedule) and replays it with MIN
(:mod:`leangnn.offload.belady`); it also replays it with LRU and checks that
the replay reproduces the engine's LRU counters exactly (the cost model's
validation). Configuration as ``benchmarks/offload.py``: 3-layer GCN
(hidden 64), 16 METIS parts, budget a fraction of the full-batch need.

    python benchmarks/offload_cache.py                 # 2M nodes + circuits union
    python benchmarks/offload_cache.py --quick         # 100k nodes + circuits union
    python benchmarks/offload_cache.py --nodes 200000 --skip circuits

Writes ``results/offload_cache.json`` (``results/quick/`` with ``--quick``)
after every graph and budget, and prints the markdown table.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

from leangnn.graphs.synthetic import power_law_graph
from leangnn.nn.models import build_model
from leangnn.offload import BudgetError, OffloadEngine
from leangnn.offload.belady import next_uses, record_trace, simulate
from leangnn.plan.vertex import full_batch_vertex_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import results_path, write_json  # noqa: E402
from offload import circuits_union  # noqa: E402

POLICIES = ("st", "lru", "degree", "none")
TARGET = 1.1  # st traffic at most 1.1x MIN's
GiB = float(1 << 30)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def compare(data, model, frac: float, parts: int, cache_dir, check_lru: bool,
            out: dict, save) -> dict:
    """Engine policies and MIN at ``frac`` of the full-batch need, into ``out``
    (``save()`` after every figure: a long run leaves what it has)."""
    need = full_batch_vertex_bytes(model, data.num_nodes)
    budget = int(frac * need)
    out.update({"budget_fraction": frac, "budget_bytes": budget, "need_bytes": need,
                "policies": {}})
    ref, mt = None, None
    for pol in POLICIES:
        t = time.perf_counter()
        try:
            eng = OffloadEngine(model, data, budget, parts, pol, virtual=True,
                                cache_dir=cache_dir, like=ref)
        except BudgetError as e:
            out["policies"][pol] = {"error": str(e)}
            log(f"  {frac:.2%} {pol}: {e}")
            continue
        c = eng.simulate()
        d = out["policies"][pol] = dict(c.to_dict(), num_chunks=eng.num_chunks,
                                        cache_slots=eng.cache.num_slots)
        log(f"  {frac:.2%} {pol:6s} traffic {c.traffic_bytes / GiB:.3f} GiB "
            f"({time.perf_counter() - t:.0f}s)")
        if pol == "st":
            ref = eng
            mt = _min(ref, out, frac, check_lru)
            out["st_within_target"] = bool(c.traffic_bytes <= TARGET * mt)
        else:
            del eng
        if mt:
            d["ratio_to_min"] = d["traffic_bytes"] / mt
        save()
    del ref
    gc.collect()
    if "lru_check" in out and "traffic_bytes" in out["policies"].get("lru", {}):
        eng_lru, lru = out["policies"]["lru"], out.pop("lru_check")
        out["lru_replay_matches_engine"] = (
            (lru.h2d_bytes, lru.d2h_bytes) == (eng_lru["h2d_bytes"],
                                               eng_lru["d2h_bytes"]))
        log(f"  {frac:.2%} LRU replay equals the engine's LRU: "
            f"{out['lru_replay_matches_engine']}")
    out.pop("lru_check", None)
    return out


def _min(ref, out: dict, frac: float, check_lru: bool) -> int:
    t = time.perf_counter()
    trace = record_trace(ref)
    uses = next_uses(trace)
    m = simulate(trace, uses=uses)
    out["min"] = dict(m.to_dict(), num_chunks=ref.num_chunks,
                      cache_slots=trace.num_slots, accesses=trace.num_accesses)
    log(f"  {frac:.2%} MIN    traffic {m.traffic_bytes / GiB:.3f} GiB, lower bound "
        f"{m.lower_bound_bytes / GiB:.3f} GiB ({time.perf_counter() - t:.0f}s)")
    if check_lru:
        out["lru_check"] = simulate(trace, policy="lru", uses=uses)
    del trace, uses
    gc.collect()
    return m.traffic_bytes


def markdown(res: dict) -> str:
    lines = [
        "| graph | budget (of need) | policy | traffic | ratio to MIN | target |",
        "|---|---:|---|---:|---:|---|"]
    for g in res["graphs"]:
        for r in g["budgets"]:
            mib = r["budget_bytes"] / (1 << 20)
            bud = f"{mib:,.0f} MiB ({r['budget_fraction']:.2%})"
            if "min" in r:
                m = r["min"]
                lines.append(
                    f"| {g['name']} | {bud} | **MIN** (Belady; lower bound "
                    f"{m['lower_bound_bytes'] / GiB:.3f} GiB) | "
                    f"{m['traffic_bytes'] / GiB:.3f} GiB | 1.000 | |")
            for pol in ("st", "lru", "degree", "none"):
                d = r["policies"].get(pol)
                if d is None:
                    continue
                if "error" in d:
                    lines.append(f"| {g['name']} | {bud} | {pol} | does not plan | | |")
                    continue
                tgt = ""
                if pol == "st":
                    ok = d.get("ratio_to_min", float("inf")) <= TARGET
                    tgt = f"<= {TARGET}x: {'met' if ok else 'MISSED'}"
                note = " (own schedule)" if pol == "none" else ""
                lines.append(
                    f"| {g['name']} | {bud} | {pol}{note} | "
                    f"{d['traffic_bytes'] / GiB:.3f} GiB | "
                    f"{d.get('ratio_to_min', float('nan')):.3f} | {tgt} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--avg-degree", type=float, default=25.0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.0625])
    ap.add_argument("--skip", nargs="*", default=[], choices=["synthetic", "circuits"])
    ap.add_argument("--check-lru-below", type=int, default=60_000_000,
                    help="replay LRU too (cost-model check) when the trace has "
                         "fewer accesses than this")
    ap.add_argument("--cache-dir", default=None, help="partition cache folder")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n = args.nodes or (100_000 if args.quick else 2_000_000)
    args.out = args.out or str(results_path("offload_cache.json", args.quick))
    res = {"config": {"nodes": n, "avg_degree": args.avg_degree, "model": "gcn",
                      "hidden": args.hidden, "layers": 3, "parts": args.parts,
                      "fractions": args.fractions, "target_st_over_min": TARGET,
                      "command": "python benchmarks/offload_cache.py "
                                 + " ".join(argv if argv is not None
                                            else sys.argv[1:])},
           "graphs": []}
    t0 = time.perf_counter()

    def new_model(in_ch, out_ch):
        torch.manual_seed(0)
        return build_model("gcn", in_ch, args.hidden, out_ch, 3)

    def run_graph(name, data, model):
        g = {"name": name, "nodes": int(data.num_nodes),
             "edges": int(data.num_edges), "budgets": []}
        res["graphs"].append(g)
        for frac in args.fractions:
            # the trace of a graph this size fits; the LRU check is a second replay
            check = data.num_edges * 6 < args.check_lru_below
            row: dict = {}
            g["budgets"].append(row)
            compare(data, model, frac, args.parts, args.cache_dir, check, row, save)
            save()

    def save():
        res["wall_s"] = time.perf_counter() - t0
        # the LRU replay's counters object is only held until the engine's
        # LRU has run
        write_json(args.out, {**res, "graphs": [
            {**x, "budgets": [{k: v for k, v in b.items() if k != "lru_check"}
                              for b in x["budgets"]]} for x in res["graphs"]]})


    if "circuits" not in args.skip:
        log("ITC-99 + EPFL union")
        circ, _ = circuits_union()
        run_graph("ITC-99+EPFL", circ, new_model(circ.x.size(1), 1))
        del circ
        gc.collect()
    if "synthetic" not in args.skip:
        log(f"power-law graph: {n:,} nodes, avg degree {args.avg_degree}")
        data = power_law_graph(n, avg_degree=args.avg_degree, in_channels=64)
        run_graph(f"power-law {n // 1000}k", data, new_model(64, 8))
        del data
    md = markdown(res)
    res["markdown"] = md
    write_json(args.out, res)
    print(md)
    log(f"wrote {args.out} in {(time.perf_counter() - t0) / 60:.1f} min")
    return res


if __name__ == "__main__":
    main()
