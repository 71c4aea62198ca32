"""Planner benchmark: estimated vs measured peak memory over many configurations.

Every configuration (strategy, model, depth, width, graph) is estimated by
the planner (:func:`leangnn.plan.estimate.estimate_config` with this
machine's calibration) and trained for real for one epoch in a fresh
interpreter (:func:`leangnn.plan.measure.measure_fresh`), one after the
other. *Measured* is the direct measurement of that first training epoch the
way the Trainer measures it: ``MemoryMeter``'s peak above the loaded state
(data, model, ``strategy.setup``), i.e. CPU peak RSS (CUDA:
``max_memory_allocated``), over ``zero_grad`` + ``strategy.train_step`` +
clipping + Adam per training graph; validation is not run. CPU runs use
glibc's fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_=65536``), under
which resident memory follows the live tensors; ``--allocators default``
measures glibc's default too (reported separately, with its own
calibration). The calibration is fitted on :data:`CALIBRATION_RUNS` (small
synthetic graphs), never on the rows reported here.

    python benchmarks/plan.py              # all rows (~1 h on 2 busy cores)
    python benchmarks/plan.py --quick      # 4 rows, results/quick/
    python benchmarks/plan.py --device cuda
    python benchmarks/plan.py --section auto   # the 5 ``--strategy auto`` cases

The ``auto`` section plans 5 budget/graph cases (:data:`AUTO_CASES`; in one
of them full batch does not fit), then trains *every* candidate row of each
for real (fresh interpreter, 2 epochs: the first measured for memory, the
second for time) to find the fastest configuration that
fits, and reports the pick's measured need (never above the budget) and its
epoch time over the fastest one's (target: at most 1.2x). Writes
``results/plan_auto.json`` and the ``plan-auto`` section.
``--auto-allocator default`` does the same under glibc's default allocator,
what a plain ``leangnn train`` gets, with its own calibration: every
candidate trains through the Trainer as ``leangnn train`` runs it
(validation and checkpoints included, one OpenMP thread; time: the median
CPU seconds of the epochs after the first), into
``results/plan_auto_default.json`` and the ``plan-auto-default`` section.

Writes ``results/plan.json``, ``results/plan_scatter.png`` and the ``plan``
section of ``benchmarks/README.md``. Measurements already in the JSON for an
unchanged configuration are reused (``--remeasure`` repeats them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import (  # noqa: E402
    can_plot,
    figure,
    markdown_path,
    results_path,
    write_json,
    write_section,
)

MiB = float(1 << 20)

#: graphs: TrainConfig fields (val/test are tiny: measurements never use them)
GRAPHS = {
    "b19": dict(dataset="itc99/b19", val_dataset="iscas85/c17",
                test_dataset="iscas85/c432"),
    "multiplier": dict(dataset="epfl/multiplier", val_dataset="iscas85/c17",
                       test_dataset="iscas85/c432"),
    "sin": dict(dataset="epfl/sin", val_dataset="iscas85/c17",
                test_dataset="iscas85/c432"),
    "default": dict(dataset=None),  # the default split: 10 training circuits
    "csbm100k": dict(dataset="csbm:100000"),
    "csbm20k": dict(dataset="csbm:20000"),
}


def _c(graph, strategy, model, layers, hidden, **kw):
    return {"graph": graph, "strategy": strategy, "model": model,
            "num_layers": layers, "hidden_channels": hidden, **kw}


#: the measured rows: every strategy; gsr/res/sage/gcn/gat; depths 2-256
CONFIGS = [
    _c("b19", "full", "sage", 2, 64),
    _c("b19", "full", "gcn", 3, 32),
    _c("b19", "full", "gat", 2, 32),
    _c("b19", "full", "res", 4, 32, conv="sage"),
    _c("b19", "reversible", "gsr", 16, 32, num_groups=2),
    _c("b19", "reversible", "gsr", 256, 32, num_groups=2),
    _c("b19", "prune", "sage", 3, 64, budget_ratio=0.3),
    _c("b19", "offload", "sage", 2, 32, device_budget="64MiB"),
    _c("multiplier", "full", "res", 8, 64, conv="sage"),
    _c("multiplier", "full", "res", 4, 64, conv="gcn"),
    _c("multiplier", "full", "res", 2, 32, conv="gat"),
    _c("multiplier", "full", "res", 32, 32, conv="sage"),
    _c("multiplier", "reversible", "gsr", 64, 64, num_groups=2),
    _c("multiplier", "reversible", "gsr", 32, 64, num_groups=4, conv="gcn"),
    _c("multiplier", "reversible", "gsr", 16, 32, num_groups=2, conv="gat"),
    _c("multiplier", "full", "sage", 3, 64),
    _c("multiplier", "full", "gcn", 2, 128),
    _c("multiplier", "full", "gat", 3, 64),
    _c("multiplier", "prune", "res", 16, 64, conv="sage", budget_ratio=0.3),
    _c("multiplier", "prune", "sage", 2, 64, budget_ratio=0.5),
    _c("multiplier", "offload", "sage", 3, 64, device_budget="32MiB"),
    _c("multiplier", "offload", "gcn", 4, 64, device_budget="24MiB", num_parts=16),
    _c("csbm100k", "full", "sage", 2, 32),
    _c("csbm100k", "full", "gcn", 2, 32),
    _c("csbm100k", "full", "res", 2, 32, conv="sage"),
    _c("csbm100k", "reversible", "gsr", 4, 32, num_groups=2),
    _c("csbm100k", "prune", "sage", 2, 32, budget_ratio=0.3),
    _c("csbm100k", "offload", "sage", 2, 32, device_budget="256MiB"),
    _c("csbm100k", "full", "gat", 2, 16),
    _c("default", "full", "res", 128, 32, conv="sage"),
    _c("default", "reversible", "gsr", 256, 64, num_groups=4),
    _c("default", "full", "gcn", 2, 64),
    _c("default", "prune", "sage", 3, 64, budget_ratio=0.3),
    _c("sin", "full", "res", 64, 32, conv="gcn"),
    _c("sin", "reversible", "gsr", 128, 32, num_groups=2),
    _c("sin", "full", "sage", 2, 256),
]

QUICK = [
    _c("csbm20k", "full", "res", 4, 32, conv="sage"),
    _c("csbm20k", "reversible", "gsr", 16, 32, num_groups=2),
    _c("csbm20k", "prune", "sage", 2, 32, budget_ratio=0.3),
    _c("sin", "full", "gat", 2, 32),
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def row_id(c: dict) -> str:
    keys = [k for k in c if k not in ("graph", "strategy", "model")]
    return f"{c['graph']}/{c['strategy']}/{c['model']}/" + ",".join(
        f"{k}={c[k]}" for k in keys)


def make_config(c: dict, device: str):
    from leangnn.config import TrainConfig

    fields = {k: v for k, v in c.items() if k != "graph"}
    return TrainConfig(**GRAPHS[c["graph"]], **fields, epochs=1, device=device)


def calibration(device: str, mmap: bool, recalibrate: bool, quick: bool):
    from leangnn.plan.calibrate import calibrate
    from leangnn.plan.calibration import load_calibration
    from leangnn.plan.measure import MMAP_ENV

    for k, v in MMAP_ENV.items():
        if mmap:
            os.environ[k] = v  # selects this allocator's calibration kind
        else:
            os.environ.pop(k, None)
    cal = load_calibration(device)
    if recalibrate or not cal.calibrated:
        log(f"calibrating {cal.kind} (a few short runs) ...")
        cal = calibrate(device, quick=quick, mmap=mmap if device == "cpu" else None)
    return cal


def estimate_rows(configs, device: str, cal, splits_cache: dict) -> dict:
    from leangnn.data import load_graphs
    from leangnn.plan.estimate import estimate_config

    out = {}
    for c in configs:
        cfg = make_config(c, device)
        if c["graph"] not in splits_cache:
            splits_cache.clear()  # one graph in memory at a time
            splits_cache[c["graph"]] = load_graphs(cfg, progress=False)
        try:
            est = estimate_config(cfg, splits_cache[c["graph"]], calibration=cal)
        except (ValueError, RuntimeError) as e:
            log(f"estimate {row_id(c)} failed: {e}")
            continue
        out[row_id(c)] = est
        log(f"estimate {row_id(c)}: {est.run_bytes / MiB:.1f} MiB "
            f"({est.method}, {est.estimate_seconds:.2f} s)")
    return out


def measure_rows(configs, device: str, mmap: bool, old: dict, remeasure: bool,
                 timeout: float, save) -> dict:
    from leangnn.plan.measure import measure_fresh

    out = {}
    for c in configs:
        rid = row_id(c)
        prev = old.get(rid)
        if prev is not None and prev.get("config") == c and not remeasure:
            out[rid] = prev
            continue
        cfg = make_config(c, device)
        log(f"measure {rid} ({'mmap' if mmap else 'default'} allocator) ...")
        try:
            m = measure_fresh(cfg, epochs=1, mmap=mmap, timeout=timeout)
            out[rid] = {"id": rid, "config": c, "run_bytes": m["run_bytes"],
                        "method": m["method"], "epoch_seconds": m["epoch_seconds"][0],
                        "setup_seconds": m["setup_seconds"],
                        "reserved_bytes": m.get("reserved_bytes")}
            log(f"  {m['run_bytes'] / MiB:.1f} MiB, {m['epoch_seconds'][0]:.2f} s")
        except (RuntimeError, TimeoutError) as e:
            out[rid] = {"id": rid, "config": c, "error": str(e).splitlines()[-1]}
            log(f"  failed: {out[rid]['error']}")
        save(out)
    return out


def compare(configs, ests: dict, meas: dict) -> list[dict]:
    rows = []
    for c in configs:
        if row_id(c) not in ests:
            continue
        rid, est, m = row_id(c), ests[row_id(c)], meas.get(row_id(c), {})
        r = {"id": rid, "config": c, "estimate": est.to_dict(),
             "estimated_bytes": est.run_bytes, "tensor_bytes": est.step_bytes,
             "measured_bytes": m.get("run_bytes"), "error": m.get("error"),
             "estimate_seconds": est.estimate_seconds,
             "epoch_seconds": m.get("epoch_seconds"),
             "estimated_epoch_seconds": est.epoch_seconds}
        if r["measured_bytes"]:
            mb = r["measured_bytes"]
            r["rel_error"] = (est.run_bytes - mb) / mb
            r["tensor_rel_error"] = (est.step_bytes - mb) / mb
            r["estimate_share_of_epoch"] = est.estimate_seconds / r["epoch_seconds"]
        rows.append(r)
    return rows


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("rel_error") is not None]
    if not ok:
        return {}
    err = [abs(r["rel_error"]) for r in ok]
    raw = [abs(r["tensor_rel_error"]) for r in ok]
    share = [r["estimate_share_of_epoch"] for r in ok]
    terr = [abs(r["estimated_epoch_seconds"] - r["epoch_seconds"]) / r["epoch_seconds"]
            for r in ok if r.get("estimated_epoch_seconds")]
    sizable = [abs(r["rel_error"]) for r in ok if r["measured_bytes"] >= 32 << 20]
    return {"rows": len(ok), "failed": len(rows) - len(ok),
            "rows_32mib": len(sizable),
            "worst_abs_error_32mib": max(sizable) if sizable else None,
            "median_abs_error": statistics.median(err), "worst_abs_error": max(err),
            "median_abs_error_uncalibrated": statistics.median(raw),
            "worst_abs_error_uncalibrated": max(raw),
            "median_estimate_share": statistics.median(share),
            "worst_estimate_share": max(share),
            "rows_over_10pct_of_epoch": sum(s > 0.1 for s in share),
            "median_abs_epoch_time_error": statistics.median(terr) if terr else None,
            "strategies": sorted({r["config"]["strategy"] for r in ok}),
            "models": sorted({r["config"]["model"] for r in ok}),
            "graphs": sorted({r["config"]["graph"] for r in ok}),
            "depths": [min(r["config"]["num_layers"] for r in ok),
                       max(r["config"]["num_layers"] for r in ok)]}


def markdown(res: dict, md_path: Path, plot_path: Path) -> str:
    s, cal = res["summary"], res["calibration"]
    out = ["## Planner: estimated vs measured peak memory", "",
           f"`python benchmarks/plan.py` on {res['device']} ({cal['kind']}). "
           "Each row: the planner's estimate (fake-tensor dry run of one "
           "training step, depth extrapolation, DPR's real core, offload's own "
           "accounting; plus the calibrated allocator overhead) against one real "
           "training epoch in a fresh interpreter: `MemoryMeter`'s peak above the "
           "loaded state (CPU peak RSS with `MALLOC_MMAP_THRESHOLD_=65536`), the "
           "Trainer's loop without validation, one configuration at a time. "
           f"Calibration ({_calibration_text(cal)}) is fitted on separate small "
           "runs (`python -m leangnn.plan.calibrate`), never on these rows.", ""]
    if s:
        out += [f"**{s['rows']} configurations** ({', '.join(s['strategies'])}; "
                f"{', '.join(s['models'])}; depths {s['depths'][0]}-{s['depths'][1]};"
                f" graphs {', '.join(s['graphs'])}): error median "
                f"**{s['median_abs_error']:.1%}**, worst "
                f"**{s['worst_abs_error']:.1%}** "
                f"(tensor bytes alone: {s['median_abs_error_uncalibrated']:.1%} / "
                f"{s['worst_abs_error_uncalibrated']:.1%}). The {s['rows_32mib']} rows "
                "that measure 32 MiB or more are within "
                f"{s['worst_abs_error_32mib'] or 0:.1%}; below that the ~6 MiB "
                "first-run constant (code pages, thread pools), which varies by "
                "a few MiB from run to run, dominates. The estimate takes "
                f"{s['median_estimate_share']:.1%} of one real epoch at the median, "
                f"{s['worst_estimate_share']:.0%} at worst "
                f"({s['rows_over_10pct_of_epoch']} rows over 10%): the dry run "
                "costs ~1 ms per traced op, 0.3-0.8 s for a shallow model, which "
                "is under 10% of an epoch only where the epoch takes 3-8 s or "
                "more (deep, reversible, offloaded and multi-graph runs here). "
                "Epoch time estimates (traced work x calibrated speed) are off by "
                f"{s['median_abs_epoch_time_error'] or 0:.0%} at the median: the "
                "rows were timed while other jobs loaded this 2-core machine "
                "(up to 4x slower), the calibration later on a quieter one.", ""]
    out += ["| configuration | estimated | measured | error | estimate s | epoch s "
            "| est. epoch s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        meas = "failed" if r["measured_bytes"] is None else \
            f"{r['measured_bytes'] / MiB:.1f} MiB"
        err = "" if r.get("rel_error") is None else f"{r['rel_error']:+.1%}"
        ep = "" if r["epoch_seconds"] is None else f"{r['epoch_seconds']:.2f}"
        eep = "" if r["estimated_epoch_seconds"] is None else \
            f"{r['estimated_epoch_seconds']:.2f}"
        out.append(f"| {r['id']} | {r['estimated_bytes'] / MiB:.1f} MiB | {meas} | "
                   f"{err} | {r['estimate_seconds']:.2f} | {ep} | {eep} |")
    for name, sec in res.get("allocators", {}).items():
        ss, sc = sec["summary"], sec["calibration"]
        if ss:
            rows = ", ".join(f"{r['id']} {r['rel_error']:+.0%}" for r in sec["rows"]
                             if r.get("rel_error") is not None)
            out += ["", f"**glibc's {name} allocator** (no `MALLOC_MMAP_THRESHOLD_`, "
                    f"what a plain `leangnn train` gets; its own calibration: "
                    f"{_calibration_text(sc)}): {ss['rows']} rows, error median "
                    f"{ss['median_abs_error']:.1%}, worst {ss['worst_abs_error']:.1%}"
                    f" ({rows}). With the dynamic mmap threshold every block up to "
                    "32 MiB comes from the heap, whose resident size depends on "
                    "fragmentation that tensor bytes do not determine."]
    rel = os.path.relpath(plot_path, Path(md_path).parent)
    out += ["", f"![estimate vs measurement]({rel})"]
    return "\n".join(out)


def _calibration_text(cal: dict) -> str:
    if cal.get("heap_scale") is not None:
        mem = (f"resident = big blocks + {cal['heap_scale']:.2f} x heap "
               f"high-water {cal['const'] / MiB:+.1f} MiB")
    else:
        mem = f"{cal['scale']:.3f} x tensor bytes {cal['const'] / MiB:+.1f} MiB"
    off = f"offload x{cal['offload_bytes_scale']:.2f}"
    if cal.get("offload_host_scale") is not None:
        off = (f"offload device side x{cal['offload_bytes_scale']:.2f}, host "
               f"store x{cal['offload_host_scale']:.2f}")
    return f"{mem}; {off}"


def plot(res: dict, path: Path) -> None:
    if not can_plot(path):
        return
    rows = [r for r in res["rows"] if r.get("measured_bytes")]
    with figure(path, 1, 1, figsize=(5.5, 5)) as (fig, ax):
        for strat, mark in (("full", "o"), ("reversible", "s"), ("prune", "^"),
                            ("offload", "D")):
            sel = [r for r in rows if r["config"]["strategy"] == strat]
            if sel:
                ax.scatter([r["measured_bytes"] / MiB for r in sel],
                           [r["estimated_bytes"] / MiB for r in sel], marker=mark,
                           label=strat, alpha=0.8)
        lo = min(min(r["measured_bytes"], r["estimated_bytes"]) for r in rows) / MiB
        hi = max(max(r["measured_bytes"], r["estimated_bytes"]) for r in rows) / MiB
        xs = [lo * 0.8, hi * 1.2]
        ax.plot(xs, xs, "k-", lw=0.8, label="exact")
        ax.fill_between(xs, [x * 0.85 for x in xs], [x * 1.15 for x in xs],
                        color="grey", alpha=0.15, label="±15%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured peak above loaded state (MiB)")
        ax.set_ylabel("planner estimate (MiB)")
        ax.set_title(f"planner on {res['device']}: {len(rows)} configurations")
        ax.legend(fontsize=8)


#: ``--strategy auto`` cases: graph, model and the budget as a share of what
#: the planner says full batch needs (below 1: full batch does not fit)
AUTO_CASES = [
    dict(name="csbm8k-sage-roomy", graph="csbm8k", model="sage", num_layers=3,
         hidden_channels=64, share=1.5),
    dict(name="csbm8k-sage-tight", graph="csbm8k", model="sage", num_layers=3,
         hidden_channels=64, share=0.6),
    dict(name="csbm8k-res16-tight", graph="csbm8k", model="res", num_layers=16,
         hidden_channels=32, share=0.5),
    dict(name="s38417-gcn-tight", graph="s38417", model="gcn", num_layers=3,
         hidden_channels=64, share=0.7),
    dict(name="s38417-res8-roomy", graph="s38417", model="res", num_layers=8,
         hidden_channels=32, share=1.3),
]
GRAPHS["csbm8k"] = dict(dataset="csbm:8000")
GRAPHS["s38417"] = dict(dataset="iscas89/s38417", val_dataset="iscas85/c17",
                        test_dataset="iscas85/c432")


def _need(row, measured_run: int, setup: int | None = None) -> int:
    """What a row needs in all, measured, as ``leangnn train``'s
    ``budget_check`` counts it: the run's peak above the loaded state plus
    the model and graph tensors, the setup's resident state as measured
    where it was (``setup``, in place of the estimate's: offload's engine)."""
    from leangnn.plan.planner import budget_check, need_figures

    return budget_check({"memory_budget_bytes": 0, **need_figures(row)},
                        measured_run, setup)["measured_need_bytes"]

#: epochs each candidate of an auto case trains: memory over the first, time
#: the median of the rest
AUTO_EPOCHS = 4


def _auto_json(allocator: str, threads: int = 1) -> str:
    """The auto section's results file; at other than one thread (``0``:
    torch's default) its own (``plan_auto_compact_threads0.json``)."""
    name = {"mmap": "plan_auto.json", "default": "plan_auto_default.json",
            "compact": "plan_auto_compact.json"}[allocator]
    return name if threads == 1 else name.replace(".json", f"_threads{threads}.json")


def _measure_auto_row(cfg, allocator: str, device: str, timeout: float,
                      repeat: int = 1, threads: int = 1) -> dict:
    """One candidate trained for real in ``repeat`` fresh processes:
    ``measured_run_bytes`` (the highest peak: the budget is judged by the
    worst process) and ``measured_epoch_seconds`` (the median over processes
    of each one's median epoch after the first). Under glibc's default
    allocator through the Trainer, as ``leangnn train`` runs it, one thread,
    timed by CPU seconds (a shared machine's wall time cannot rank rows 1.2x
    apart); under the pinned threshold, the harness's training loop as
    before. Why several: one process's offload epochs moved by up to 40%
    between measurements (csbm:8000, SAGE-3, a 77 MiB pool in 4 parts:
    0.123, 0.146, 0.146, 0.177 s), as much as the rows being ranked differ.
    At other than one thread (``threads``; ``0``: torch's default, every
    core), the user's setting, epochs are timed by wall seconds: the CPU
    seconds of several threads count their spin-waits (run it on an idle
    machine)."""
    from leangnn.plan.measure import measure_fresh, measure_trainer

    runs = []
    for _ in range(max(1, repeat)):
        if allocator in ("default", "compact") and device == "cpu":
            # (a child gets this process's heap: its environment is set)
            m = measure_trainer(cfg, epochs=AUTO_EPOCHS, threads=threads or None,
                                timeout=timeout)
            times = m["epoch_cpu_seconds"] if threads == 1 else m["epoch_seconds"]
        else:
            m = measure_fresh(cfg, epochs=AUTO_EPOCHS, mmap=device == "cpu",
                              timeout=timeout)
            times = m["epoch_seconds"]
        runs.append((m, times))
    worst = max(runs, key=lambda r: r[0]["run_bytes"])[0]
    out = {"measured_run_bytes": worst["run_bytes"],
           "measured_epoch_seconds": statistics.median(
               statistics.median(t[1:]) for _, t in runs),
           "measured_epochs_seconds": runs[0][1],
           "measured_repeat": len(runs)}
    if len(runs) > 1:
        out["measured_runs"] = [{"run_bytes": m["run_bytes"], "epochs_seconds": t}
                                for m, t in runs]
    if worst.get("setup_bytes") is not None:
        out["measured_setup_bytes"] = worst["setup_bytes"]
    return out


def auto_cases(args, cal) -> dict:
    from leangnn.config import TrainConfig
    from leangnn.data import load_graphs
    from leangnn.plan.planner import choose, plan_config, plan_summary

    allocator = args.auto_allocator
    out_path = results_path(_auto_json(allocator, args.threads), args.quick)
    old = json.loads(out_path.read_text()) if out_path.is_file() else {}
    cases = []
    for case in AUTO_CASES:
        if args.only and not any(x in case["name"] for x in args.only):
            continue
        # under the default heap the planner plans for the epochs run (a
        # CPU run's peak creeps up over its first epochs)
        base = TrainConfig(**GRAPHS[case["graph"]], strategy="auto",
                           model=case["model"], num_layers=case["num_layers"],
                           hidden_channels=case["hidden_channels"],
                           epochs=3 if allocator == "mmap" else AUTO_EPOCHS,
                           device=args.device)
        splits = load_graphs(base, progress=False)
        probe = plan_config(base, splits, "1TiB", calibration=cal,
                            strategies=("full",))
        budget = int(probe.rows[0].need_bytes * case["share"])
        t0 = time.perf_counter()
        table = plan_config(base, splits, budget, calibration=cal)
        plan_s = time.perf_counter() - t0
        pick = choose(table)
        log(f"auto {case['name']}: budget {budget / MiB:.1f} MiB, pick {pick.label}"
            f" ({plan_s:.1f} s to plan)")
        prev = {r["label"]: r for r in old.get(case["name"], {}).get("rows", [])}
        rows = []
        for row in table.rows:
            r = {"label": row.label, "kind": row.kind, "chosen": row.chosen,
                 "need_bytes": row.need_bytes, "fits": row.fits,
                 "estimated_epoch_seconds": row.epoch_seconds, "why": row.why}
            if row.estimate is None:
                rows.append(r)
                continue
            cfg = row.apply(base)
            p = prev.get(row.label)
            if p and p.get("config") == cfg.to_dict() and not args.remeasure and \
                    "measured_run_bytes" in p and \
                    p.get("measured_repeat", 1) >= args.auto_repeat:
                r.update({k: p[k] for k in p if k.startswith("measured")})
            else:
                log(f"  measure {row.label} ...")
                try:
                    # time: the median of the epochs after the first (one
                    # epoch's wall time on a shared machine is not enough to
                    # rank rows 1.2x apart)
                    r.update(_measure_auto_row(cfg, allocator, args.device,
                                               args.timeout, args.auto_repeat,
                                               args.threads))
                except (RuntimeError, TimeoutError,
                        subprocess.TimeoutExpired) as e:
                    r["measured_error"] = str(e).splitlines()[-1]
            r["config"] = cfg.to_dict()
            if "measured_run_bytes" in r:
                r["measured_need_bytes"] = _need(row, r["measured_run_bytes"],
                                                 r.get("measured_setup_bytes"))
                r["measured_fits"] = r["measured_need_bytes"] <= budget
                log(f"    need {r['measured_need_bytes'] / MiB:.1f} MiB (est. "
                    f"{row.need_bytes / MiB:.1f}), "
                    f"{r['measured_epoch_seconds']:.2f} s/epoch (est. "
                    f"{row.epoch_seconds or 0:.2f})")
            rows.append(r)
        res = _judge({"name": case["name"], "case": case, "budget_bytes": budget,
                      "plan_seconds": plan_s, "plan": plan_summary(table),
                      "rows": rows})
        old[case["name"]] = res
        write_json(out_path, old)
        cases.append(res)
        need = (res["pick_measured_need_bytes"] or 0) / MiB
        log(f"  pick {res['pick']}: need {need:.1f} MiB of {budget / MiB:.1f}; "
            "ratio to fastest fitting "
            f"{res.get('ratio_to_fastest', float('nan')):.2f} "
            f"({res.get('fastest')})")
    return {"device": args.device, "calibration": cal.kind, "cases": cases,
            "allocator": allocator, "threads": args.threads}


def _judge(res: dict) -> dict:
    """The pick against the fastest measured row that fits: of all rows, and
    of the rows that train the model exactly (``exact``, or its reversible
    twin: not DPR's approximate core)."""
    rows = res["rows"]
    ok = [r for r in rows if r.get("measured_fits")]
    same = [r for r in ok if r["kind"] != "approximate"]
    chosen = next(r for r in rows if r["chosen"])
    res.update(pick=chosen["label"],
               pick_measured_need_bytes=chosen.get("measured_need_bytes"),
               pick_within_budget=chosen.get("measured_fits"),
               pick_epoch_seconds=chosen.get("measured_epoch_seconds"))
    for key, pool in (("fastest", ok), ("fastest_exact", same)):
        if pool and chosen.get("measured_epoch_seconds"):
            best = min(pool, key=lambda r: r["measured_epoch_seconds"])
            res[key] = best["label"]
            res[f"ratio_to_{key}"] = (chosen["measured_epoch_seconds"]
                                      / best["measured_epoch_seconds"])
    full = next((r for r in rows if r["label"].startswith("full(")), None)
    res["full_fits"] = None if full is None else full.get("measured_fits")
    return res


def auto_markdown(res: dict) -> str:
    alloc = res.get("allocator", "mmap")
    default = alloc in ("default", "compact")
    heap = {"default": "glibc's default allocator, what `leangnn train` "
            "gets with `LEANGNN_HEAP=default` and a Python process without the "
            "tunables", "compact": "the compact glibc heap `leangnn train` runs "
            "in, `leangnn.heap`"}.get(alloc, "")
    if default:
        threads = res.get("threads", 1)
        timed = ("one OpenMP thread: memory over the whole run, time the median "
                 "CPU seconds" if threads == 1 else
                 (f"`OMP_NUM_THREADS={threads}`" if threads else "torch's default "
                  "threads (every core; the planner's times are still one "
                  "thread's)") + ": memory over the whole run, time the median "
                 "wall seconds")
        how = (f"`python benchmarks/plan.py --section auto --auto-allocator "
               f"{alloc}" + (f" --threads {threads}" if threads != 1 else "")
               + f"` on {res['device']} ({res['calibration']}: {heap}). "
               "Budget: a "
               "share of what the planner says full batch needs, planned for a "
               f"{AUTO_EPOCHS}-epoch run. Every candidate row was then trained "
               "for real through the Trainer as `leangnn train` runs it (fresh "
               f"interpreter, {AUTO_EPOCHS} epochs with validation and "
               f"checkpoints, {timed} of the epochs after the first; with "
               "`--auto-repeat N`, N processes per row: the highest peak, the "
               "median of their times)")
    else:
        how = (f"`python benchmarks/plan.py --section auto` on {res['device']} "
               f"({res['calibration']}, `MALLOC_MMAP_THRESHOLD_=65536`). Budget: a "
               "share of what the planner says full batch needs. Every candidate "
               f"row was then trained for real (fresh interpreter, {AUTO_EPOCHS} "
               "epochs: memory over the first, time the median of the others)")
    out = ["## Planner: `--strategy auto` on 5 budget/graph cases"
           + {"default": " (glibc's default allocator)",
              "compact": " (the compact heap)"}.get(alloc, ""), "",
           how + "; *need* is the "
           "measured peak above the loaded state plus the model and graph "
           "tensors, what the planner's need counts. Targets: the pick's need "
           "never above the budget; its epoch time within 1.2x of the fastest "
           "row that fits (measured).", "",
           "*Fastest exact*: the fastest row that fits among those training "
           "the model itself or its reversible twin (not DPR's approximate "
           "core, which the planner takes only when nothing exact fits); "
           "*fastest*: among all rows that fit, DPR's cores included.", "",
           "| case | budget | pick | pick need (est.) | pick s/epoch (est.) | "
           "fastest that fits | ratio | fastest exact | ratio | full fits |",
           "|---|---:|---|---:|---:|---|---:|---|---:|---|"]
    for c in res["cases"]:
        pick = next(r for r in c["rows"] if r["chosen"])
        need = c.get("pick_measured_need_bytes")
        out.append(
            f"| {c['name']} | {c['budget_bytes'] / MiB:.1f} MiB | {c['pick']} | "
            + (f"{need / MiB:.1f} ({pick['need_bytes'] / MiB:.1f}) MiB" if need
               else "failed")
            + f" | {pick.get('measured_epoch_seconds') or float('nan'):.2f} "
            f"({pick.get('estimated_epoch_seconds') or float('nan'):.2f}) | "
            f"{c.get('fastest', '-')} | {c.get('ratio_to_fastest', float('nan')):.2f}"
            f" | {c.get('fastest_exact', '-')} | "
            f"{c.get('ratio_to_fastest_exact', float('nan')):.2f} | "
            f"{'yes' if c.get('full_fits') else 'no'} |")
    within = [c for c in res["cases"] if c.get("pick_within_budget")]
    ratios = [c["ratio_to_fastest"] for c in res["cases"] if "ratio_to_fastest" in c]
    exact = [c["ratio_to_fastest_exact"] for c in res["cases"]
             if "ratio_to_fastest_exact" in c]
    if ratios:
        out += ["", f"Pick within budget in {len(within)}/{len(res['cases'])} cases; "
                f"pick / fastest exact row that fits: worst {max(exact):.2f}x, "
                f"median {statistics.median(exact):.2f}x (target <= 1.2x); pick / "
                f"fastest of all rows that fit: worst {max(ratios):.2f}x, median "
                f"{statistics.median(ratios):.2f}x."]
    out += ["", "Every row of every case (measured need and s/epoch beside the "
            "estimates) is in `results/"
            f"{_auto_json(alloc, res.get('threads', 1))}`."]
    return "\n".join(out)



# ------------------------------------------------------------- the CLI rows
#: ``leangnn train`` command lines (after ``train``) the ``cli`` section runs
#: in fresh interpreters: every strategy, gsr/res/sage/gcn/gat, the default
#: circuit split, itc99/b19 and a csbm graph; ``--strategy auto`` rows too
_B19 = "--dataset itc99/b19 --val-dataset iscas85/c17 --test-dataset iscas85/c432"
_MULT = ("--dataset epfl/multiplier --val-dataset iscas85/c17 "
         "--test-dataset iscas85/c432")
_SIN = "--dataset epfl/sin --val-dataset iscas85/c17 --test-dataset iscas85/c432"
CLI_ROWS = [
    dict(name="default-auto-2GiB", args="--strategy auto --memory-budget 2GiB"),
    dict(name="default-auto-20MiB", args="--strategy auto --memory-budget 20MiB"),
    dict(name="default-gsr32-g4", args="--strategy reversible --model gsr "
         "--layers 32 --groups 4"),
    dict(name="default-prune-res", args="--strategy prune --model res "
         "--budget-ratio 0.3"),
    dict(name="b19-full-sage2", args=f"{_B19} --strategy full --model sage "
         "--layers 2 --hidden 64"),
    dict(name="b19-gsr16", args=f"{_B19} --strategy reversible --model gsr "
         "--layers 16 --hidden 32 --groups 2"),
    dict(name="b19-offload-sage3", args=f"{_B19} --strategy offload --model sage "
         "--layers 3 --hidden 32 --device-budget 32MiB --parts 8"),
    dict(name="csbm100k-full-gcn3", args="--dataset csbm:100000 --strategy full "
         "--model gcn --layers 3 --hidden 64"),
    dict(name="csbm20k-full-gat2", args="--dataset csbm:20000 --strategy full "
         "--model gat --layers 2 --hidden 32"),
    dict(name="csbm100k-prune-sage3", args="--dataset csbm:100000 --strategy "
         "prune --model sage --layers 3 --hidden 64 --budget-ratio 0.3"),
    dict(name="csbm100k-offload-gcn2", args="--dataset csbm:100000 --strategy "
         "offload --model gcn --layers 2 --hidden 32 --device-budget 64MiB "
         "--parts 8"),
    dict(name="csbm100k-auto-sage3", args="--dataset csbm:100000 --strategy auto "
         "--model sage --layers 3 --hidden 64 --memory-budget 160MiB"),
    # more models, depths and graphs (issue 11: >= 30 configurations)
    dict(name="b19-full-gcn3", args=f"{_B19} --strategy full --model gcn "
         "--layers 3 --hidden 32"),
    dict(name="b19-full-gat2", args=f"{_B19} --strategy full --model gat "
         "--layers 2 --hidden 32"),
    dict(name="b19-full-res4", args=f"{_B19} --strategy full --model res "
         "--conv sage --layers 4 --hidden 32"),
    dict(name="b19-prune-sage3", args=f"{_B19} --strategy prune --model sage "
         "--layers 3 --hidden 64 --budget-ratio 0.3"),
    dict(name="mult-full-res8", args=f"{_MULT} --strategy full --model res "
         "--conv sage --layers 8 --hidden 64"),
    dict(name="mult-full-res4-gcn", args=f"{_MULT} --strategy full --model res "
         "--conv gcn --layers 4 --hidden 64"),
    dict(name="mult-full-gat3", args=f"{_MULT} --strategy full --model gat "
         "--layers 3 --hidden 64"),
    dict(name="mult-full-gcn2", args=f"{_MULT} --strategy full --model gcn "
         "--layers 2 --hidden 128"),
    dict(name="mult-gsr64", args=f"{_MULT} --strategy reversible --model gsr "
         "--layers 64 --hidden 64 --groups 2"),
    dict(name="mult-gsr16-gat", args=f"{_MULT} --strategy reversible --model gsr "
         "--conv gat --layers 16 --hidden 32 --groups 2"),
    dict(name="mult-offload-sage3", args=f"{_MULT} --strategy offload --model sage "
         "--layers 3 --hidden 64 --device-budget 32MiB --parts 8"),
    dict(name="mult-prune-res16", args=f"{_MULT} --strategy prune --model res "
         "--conv sage --layers 16 --hidden 64 --budget-ratio 0.3"),
    dict(name="sin-gsr256", args=f"{_SIN} --strategy reversible --model gsr "
         "--layers 256 --hidden 32 --groups 2"),
    dict(name="sin-full-res64-gcn", args=f"{_SIN} --strategy full --model res "
         "--conv gcn --layers 64 --hidden 32"),
    dict(name="csbm100k-full-sage2", args="--dataset csbm:100000 --strategy full "
         "--model sage --layers 2 --hidden 32"),
    dict(name="csbm100k-gsr4", args="--dataset csbm:100000 --strategy reversible "
         "--model gsr --layers 4 --hidden 32 --groups 2"),
    dict(name="csbm100k-full-gat2", args="--dataset csbm:100000 --strategy full "
         "--model gat --layers 2 --hidden 16"),
    dict(name="default-full-res128", args="--strategy full --model res --conv sage "
         "--layers 128 --hidden 32"),
    dict(name="csbm20k-auto-res16", args="--dataset csbm:20000 --strategy auto "
         "--model res --layers 16 --hidden 32 --memory-budget 96MiB"),
    # the ~2M-node synthetic graph (graph ~2 GiB loaded; DPR's core trains)
    dict(name="csbm2m-prune-sage2", args="--dataset csbm:2000000 --strategy prune "
         "--model sage --layers 2 --hidden 32 --budget-ratio 0.3", max_runs=1),
]

#: held-out check: graphs and configurations that neither the calibration nor
#: the rows above were looked at with (added after the planner was fitted),
#: summarised on their own
_VAL = "--val-dataset iscas85/c17 --test-dataset iscas85/c432"
HOLDOUT_ROWS = [
    dict(name="h-b18-full-sage3", args=f"--dataset itc99/b18 {_VAL} --strategy "
         "full --model sage --layers 3 --hidden 32"),
    dict(name="h-s38584-full-gcn2", args=f"--dataset iscas89/s38584 {_VAL} "
         "--strategy full --model gcn --layers 2 --hidden 64"),
    dict(name="h-log2-gsr32", args=f"--dataset epfl/log2 {_VAL} --strategy "
         "reversible --model gsr --layers 32 --hidden 32 --groups 2"),
    dict(name="h-voter-res8-gat", args=f"--dataset epfl/voter {_VAL} --strategy "
         "full --model res --conv gat --layers 8 --hidden 16"),
    dict(name="h-div-full-gat2", args=f"--dataset epfl/div {_VAL} --strategy "
         "full --model gat --layers 2 --hidden 32"),
    dict(name="h-b17-prune-gcn2", args=f"--dataset itc99/b17 {_VAL} --strategy "
         "prune --model gcn --layers 2 --hidden 64 --budget-ratio 0.3"),
    dict(name="h-csbm50k-offload-sage2", args="--dataset csbm:50000 --strategy "
         "offload --model sage --layers 2 --hidden 32 --device-budget 24MiB "
         "--parts 8"),
    dict(name="h-csbm50k-auto-gcn3", args="--dataset csbm:50000 --strategy auto "
         "--model gcn --layers 3 --hidden 64 --memory-budget 100MiB"),
    # a device budget large for the graph: few, large jobs (the regime the
    # one-scale offload fit underestimated by up to 2x)
    dict(name="h-csbm30k-offload-sage2-roomy", args="--dataset csbm:30000 "
         "--strategy offload --model sage --layers 2 --hidden 32 "
         "--device-budget 64MiB --parts 4"),
    dict(name="h-csbm30k-auto-sage2", args="--dataset csbm:30000 --strategy auto "
         "--model sage --layers 2 --hidden 32 --memory-budget 64MiB"),
    # the DAG model (planned from session 22 on, from a few key levels; its
    # heap factor from epfl/square, iscas89/s38417 and itc99/b20 runs)
    dict(name="h-default-dag", args="--strategy full --model dag"),
    dict(name="h-arbiter-dag", args=f"--dataset epfl/arbiter {_VAL} --strategy "
         "full --model dag"),
    dict(name="h-b17-dag-critical", args=f"--dataset itc99/b17 {_VAL} --task "
         "critical --strategy full --model dag"),
    dict(name="h-sin-dag-sigprob", args=f"--dataset epfl/sin {_VAL} --task "
         "signal_prob --strategy full --model dag"),
    dict(name="h-b18-dag-attention", args=f"--dataset itc99/b18 {_VAL} --strategy "
         "full --model dag --aggr attention --hidden 16"),
    dict(name="h-b22-auto-dag", args=f"--dataset itc99/b22 {_VAL} --strategy auto "
         "--model dag --memory-budget 256MiB"),
    # found by the auto section under glibc's default heap (session 29): a
    # deep residual stack whose 22.6 MiB message blocks leave heap holes the
    # next layer's activations split (resident ~4x the live tensors)
    dict(name="h-csbm8k-full-res16", args="--dataset csbm:8000 --strategy full "
         "--model res --conv sage --layers 16 --hidden 32"),
    # the same shape around it (added with the heap model's floor, which
    # they were not fitted on): deep full-batch stacks on graphs of degree ~23
    dict(name="h-csbm8k-full-res8", args="--dataset csbm:8000 --strategy full "
         "--model res --conv sage --layers 8 --hidden 32"),
    dict(name="h-csbm8k-full-res16-gcn", args="--dataset csbm:8000 --strategy "
         "full --model res --conv gcn --layers 16 --hidden 32"),
    dict(name="h-csbm20k-full-res12", args="--dataset csbm:20000 --strategy full "
         "--model res --conv sage --layers 12 --hidden 16"),
    dict(name="h-csbm4k-full-res24", args="--dataset csbm:4000 --strategy full "
         "--model res --conv sage --layers 24 --hidden 32"),
    dict(name="h-csbm8k-full-sage6", args="--dataset csbm:8000 --strategy full "
         "--model sage --layers 6 --hidden 32"),
    # GSR with 4 groups, `--model gsr`'s default (session 37's gsr-many heap
    # family, fitted on its own calibration runs): the first two were found
    # 23% and 22% under their peaks before it; the other two were never
    # looked at before
    dict(name="h-b18-gsr6-g4", args=f"--dataset itc99/b18 {_VAL} --strategy "
         "reversible --model gsr --layers 6 --groups 4 --hidden 64"),
    dict(name="h-memctrl-gsr6-g4", args=f"--dataset epfl/memctrl {_VAL} "
         "--strategy reversible --model gsr --layers 6 --groups 4 --hidden 64"),
    dict(name="h-div-gsr8-g4", args=f"--dataset epfl/div {_VAL} --strategy "
         "reversible --model gsr --layers 8 --groups 4 --hidden 32"),
    dict(name="h-b22-gsr12-g4-gcn", args=f"--dataset itc99/b22 {_VAL} --strategy "
         "reversible --model gsr --conv gcn --layers 12 --groups 4 --hidden 64"),
]
for _r in HOLDOUT_ROWS:
    _r["holdout"] = True
CLI_ROWS += HOLDOUT_ROWS


def _cli_config(argv: list[str]):
    """The TrainConfig ``leangnn train argv`` builds (before planning)."""
    from leangnn.cli import _TRAIN_FLAGS, build_parser
    from leangnn.config import TrainConfig

    args = build_parser().parse_args(["train", *argv])
    given = {field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items()
             if getattr(args, flag) is not None}
    return TrainConfig(**given)


def _cli_measure(row: dict, epochs: int, threads: int | None, timeout: float,
                 mmap: bool = False) -> dict:
    """Run ``python -m leangnn train`` for ``row`` in a fresh interpreter and
    read its summary.json."""
    import shlex
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="plan-cli-") as tmp:
        out = Path(tmp) / "run"
        # the real command line; metrics.jsonl has every epoch's CPU time
        # beside its wall time (one thread: what an idle machine's wall time
        # would be; this one is shared)
        argv = [sys.executable, "-m", "leangnn", "train", *shlex.split(row["args"]),
                "--epochs", str(epochs), "--out", str(out), "--quiet"]
        env = dict(os.environ)
        env.pop("MALLOC_MMAP_THRESHOLD_", None)  # what a plain `leangnn train` gets
        if mmap:  # what the Trainer would get with glibc's threshold pinned
            env["MALLOC_MMAP_THRESHOLD_"] = "65536"
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, capture_output=True, text=True,
                           timeout=timeout)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        s = json.loads((out / "summary.json").read_text())
        records = [json.loads(line) for line in
                   (out / "metrics.jsonl").read_text().splitlines() if line]
    epochs_s = [r["epoch_seconds"] for r in records]
    cpu = [r["epoch_cpu_seconds"] for r in records]
    m = {"peak_bytes": s["memory"]["peak_bytes"],
         "epoch_seconds_median": s["time"]["epoch_seconds_median"],
         "epoch_seconds": epochs_s, "wall_seconds": wall,
         "epoch_cpu_seconds": cpu, "epoch_cpu_seconds_median": statistics.median(cpu),
         "epoch_peak_bytes": [r["peak_bytes"] for r in records],
         "strategy": s["strategy"], "model": s["model"],
         "num_layers": s["num_layers"], "threads": threads,
         "setup_bytes": s["memory"].get("setup_bytes")}
    if s.get("budget_check"):
        m["budget_check"] = s["budget_check"]
    if "plan" in s:
        p_ = s["plan"]
        m["plan"] = {k: p_.get(k) for k in (
            "pick", "estimated_run_bytes", "estimated_epoch_seconds",
            "plan_seconds", "config", "method")}
    return m


def _in_order(rows: list[dict]) -> list[dict]:
    """Rows in :data:`CLI_ROWS`' order (rows no longer there last)."""
    order = {r["name"]: i for i, r in enumerate(CLI_ROWS)}
    return sorted(rows, key=lambda r: order.get(r["name"], len(order)))


def _median_run(runs: list[dict]) -> dict:
    """The run with the median peak (the lower middle one of an even count),
    all runs kept under ``runs``: glibc's default heap differs from process
    to process of one command line (hash seeds, address layout)."""
    order = sorted(runs, key=lambda m: m["peak_bytes"])
    m = dict(order[(len(order) - 1) // 2])
    m["runs"] = runs
    m["peaks"] = [r["peak_bytes"] for r in runs]
    m["peak_bytes"] = statistics.median(m["peaks"])
    return m


def _cli_estimate(row: dict, splits_cache: dict, cal, ran: dict | None = None
                  ) -> dict:
    """This code's estimate of what ``row`` trains: the planner's pick for an
    ``auto`` row (planned here again; where the run picked another row,
    ``ran`` (its summary's plan), that row's estimate: the figure compared is
    the estimate of what was trained), else the configuration itself."""
    import shlex

    from leangnn.data import load_graphs
    from leangnn.plan.estimate import estimate_config
    from leangnn.plan.planner import choose, plan_config

    cfg = _cli_config(shlex.split(row["args"]))
    key = (cfg.dataset, cfg.val_dataset, cfg.test_dataset)
    if key not in splits_cache:
        splits_cache.clear()
        splits_cache[key] = load_graphs(cfg, progress=False)
    splits = splits_cache[key]
    c0, w0 = time.process_time(), time.perf_counter()
    replanned = None
    if cfg.strategy == "auto":
        # as the command plans it: the pick trains in the planning process
        table = plan_config(cfg, splits, cfg.memory_budget, calibration=cal,
                            lazy=True, in_process=True)
        pick = choose(table)
        est, label = pick.estimate, pick.label
        base, cfg = cfg, pick.apply(cfg)
    else:
        est, label = estimate_config(cfg, splits, calibration=cal), None
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    if label is not None and ran and ran.get("config") and ran.get("pick") != label:
        from leangnn.config import TrainConfig

        replanned = label
        cfg = TrainConfig.from_dict({**base.to_dict(), **ran["config"]})
        est, label = estimate_config(cfg, splits, calibration=cal.in_process()), \
            ran["pick"]
    return {"pick": label, "replanned_pick": replanned,
            "strategy": cfg.strategy, "model": cfg.model,
            "num_layers": cfg.num_layers,
            "estimated_run_bytes": est.costliest_run_bytes,
            "tensor_bytes": est.step_bytes, "big_bytes": est.big_bytes,
            "heap_bytes": est.heap_bytes, "later": est.later,
            "estimated_epoch_seconds": est.epoch_seconds,
            "estimate_cpu_seconds": cpu, "estimate_wall_seconds": wall,
            "method": est.method}


def _use_heap(mode: str) -> None:
    """This process's environment for heap ``mode`` (:data:`leangnn.heap.HEAP_MODES`):
    the runs inherit it (`leangnn` re-executes itself into the compact heap
    unless told not to) and the estimates here read their calibration from
    it."""
    from leangnn.heap import heap_env

    env = heap_env(mode)
    os.environ.clear()
    os.environ.update(env)


#: the cli section's results per heap its runs get
_CLI_JSON = {"compact": "plan_cli_compact.json", "default": "plan_cli.json",
             "mmap": "plan_cli_mmap.json"}


def cli_rows(args, cal) -> dict:
    import torch

    mmap = args.cli_allocator == "mmap"
    if args.threads > 0:
        # the estimates are timed on the runs' threads: on torch's default
        # (every core) a shared machine's spin-waiting threads multiplied
        # their CPU time (up to 35x on the offload and DPR rows, round 35)
        torch.set_num_threads(args.threads)
    out_path = results_path(_CLI_JSON[args.cli_allocator], args.quick)
    old = json.loads(out_path.read_text()) if out_path.is_file() else {}
    prev = {r["name"]: r for r in old.get("rows", [])}
    rows, splits = [], {}
    sel = [r for r in CLI_ROWS if not args.only or any(s in r["name"]
                                                       for s in args.only)]
    keep = [r for r in old.get("rows", []) if r["name"] not in
            {x["name"] for x in sel}]
    for row in sel:
        p = prev.get(row["name"])
        ok = p and p.get("args") == row["args"] and p.get("measured") and \
            "error" not in p["measured"] and p.get("epochs") == args.cli_epochs \
            and p["measured"].get("threads") == args.threads
        runs = [] if not ok or args.remeasure else p["measured"].get(
            "runs", [{k: v for k, v in p["measured"].items() if k != "runs"}])
        meas, other = None, []
        # a row may cap its runs (the 2M-node graph: minutes each)
        repeat = min(args.repeat, row.get("max_runs", args.repeat))
        while len(runs) < repeat:
            log(f"cli {row['name']}: leangnn train {row['args']} "
                f"(run {len(runs) + 1} of {repeat}) ...")
            try:
                m = _cli_measure(row, args.cli_epochs, args.threads, args.timeout,
                                 mmap)
            except Exception as e:  # noqa: BLE001 - one row must not stop the rest
                m = {"error": f"{type(e).__name__}: {e}"}
            if "error" in m:
                meas = m
                break
            runs.append(m)
            # only runs of what this code picks now count (the latest run's)
            runs, dropped = _one_pick(runs, m)
            other = sorted(set(other) | set(dropped))
        if meas is None:
            meas = _median_run(runs)
        try:
            est = _cli_estimate(row, splits, cal, meas.get("plan"))
        except Exception as e:  # noqa: BLE001 - e.g. an op the dry run cannot follow
            log(f"  estimate failed: {type(e).__name__}: {e}")
            rows.append({"name": row["name"], "args": row["args"],
                         "epochs": args.cli_epochs, "measured": meas,
                         "estimate_error": f"{type(e).__name__}: "
                                           f"{str(e).splitlines()[0][:200]}"})
            write_json(out_path, {"calibration": cal.kind, "rows": keep + rows})
            continue
        r = _score({"name": row["name"], "args": row["args"],
                    "epochs": args.cli_epochs, "measured": meas, "estimate": est,
                    "holdout": bool(row.get("holdout"))})
        if other:
            r["other_picks"] = other
        if "error" not in meas:
            mb, eb = meas["peak_bytes"], est["estimated_run_bytes"]
            log(f"  measured {mb / MiB:.1f} MiB, estimated {eb / MiB:.1f} "
                f"({r['rel_error']:+.1%}); epoch {meas['epoch_seconds_median']:.3f}"
                f" s, estimated {est['estimated_epoch_seconds'] or 0:.3f} s; "
                f"estimate took {est['estimate_cpu_seconds']:.2f} s CPU")
        else:
            log(f"  failed: {meas['error']}")
        rows.append(r)
        write_json(out_path, {"calibration": cal.kind, "rows": keep + rows})
    res = {"calibration": cal.kind, "threads": args.threads,
           "allocator": mmap or args.cli_allocator,
           "epochs": args.cli_epochs, "rows": _in_order(keep + rows)}
    _summaries(res)
    write_json(out_path, res)
    return res


def _score(r: dict) -> dict:
    """``r`` with its errors: memory (estimate over the measured median
    peak), epoch time (over wall and CPU seconds)."""
    meas, est = r["measured"], r.get("estimate")
    if est is None or "error" in meas:
        return r
    for k in ("rel_error", "time_ratio", "time_ratio_cpu", "estimate_share_of_epoch",
              "note"):
        r.pop(k, None)
    mb, eb = meas["peak_bytes"], est["estimated_run_bytes"]
    r["rel_error"] = (eb - mb) / mb
    if est.get("replanned_pick"):
        r["note"] = (f"planned here again: {est['replanned_pick']}; the "
                     f"run picked {est['pick']}, whose estimate is shown")
    if est["estimated_epoch_seconds"] and meas["epoch_seconds_median"]:
        r["time_ratio"] = (est["estimated_epoch_seconds"]
                           / meas["epoch_seconds_median"])
        if meas.get("epoch_cpu_seconds_median"):
            r["time_ratio_cpu"] = (est["estimated_epoch_seconds"]
                                   / meas["epoch_cpu_seconds_median"])
        r["estimate_share_of_epoch"] = (est["estimate_cpu_seconds"]
                                        / meas["epoch_seconds_median"])
    return r


def _one_pick(runs: list[dict], like: dict) -> tuple[list[dict], list[str]]:
    """The runs that trained ``like``'s pick, and the other picks: a
    ``--strategy auto`` run planned with another calibration or planner may
    train another configuration, which is another row's measurement."""
    pick = (like.get("plan") or {}).get("pick")
    same = [x for x in runs if (x.get("plan") or {}).get("pick") == pick]
    return same, sorted({x["plan"]["pick"] for x in runs if x not in same})


def merge_runs(res: dict, extra: dict[str, list[dict]]) -> int:
    """Add runs measured elsewhere (``{row name: [measurement, ...]}``, as
    :func:`_cli_measure` returns them) to the rows of ``res``; the rows'
    medians and errors anew. Returns how many runs were added."""
    added = 0
    for r in res["rows"]:
        m = r["measured"]
        new = extra.get(r["name"], [])
        if "error" in m or not new:
            continue
        old = list(m.get("runs", [{k: v for k, v in m.items() if k != "runs"}]))
        seen = {(x["peak_bytes"], x["wall_seconds"]) for x in old}
        runs = old + [x for x in new
                      if (x["peak_bytes"], x["wall_seconds"]) not in seen]
        runs, other = _one_pick(runs, runs[0])
        if other:
            r["other_picks"] = other
        added += len(runs) - len(old)
        r["measured"] = _median_run(runs)
        _score(r)
    return added


def _cpu_share(r: dict) -> float | None:
    """The estimate's CPU time over one measured epoch's CPU time (one
    thread each: the load of a shared machine stays out of both)."""
    cpu = r["measured"].get("epoch_cpu_seconds_median")
    if not cpu:
        return None
    return r["estimate"]["estimate_cpu_seconds"] / cpu


def _summaries(res: dict) -> None:
    """The headline summary (the rows the planner was developed on) and the
    held-out rows' own (:data:`HOLDOUT_ROWS`)."""
    res["summary"] = _cli_summary([r for r in res["rows"] if not r.get("holdout")])
    res["holdout_summary"] = _cli_summary([r for r in res["rows"]
                                           if r.get("holdout")])


def _cli_summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("rel_error") is not None]
    if not ok:
        return {}
    # process-to-process spread of the measurement itself (rows run twice
    # or more): (max - min) / median
    spread = [(max(r["measured"]["peaks"]) - min(r["measured"]["peaks"]))
              / r["measured"]["peak_bytes"] for r in ok
              if len(r["measured"].get("peaks", [])) > 1]
    err = [abs(r["rel_error"]) for r in ok]
    # epoch time against the runs' CPU time only: wall time on a shared
    # machine is the load's, not the estimate's
    tr = [r["time_ratio_cpu"] for r in ok if r.get("time_ratio_cpu")]
    share = [x for x in map(_cpu_share, ok) if x is not None]
    return {"rows": len(ok), "failed": len(rows) - len(ok),
            "median_abs_error": statistics.median(err), "worst_abs_error": max(err),
            "within_5": sum(e <= 0.05 for e in err),
            "within_15": sum(e <= 0.15 for e in err),
            "time_rows": len(tr),
            "time_ratio_median": statistics.median(tr) if tr else None,
            "time_ratio_min": min(tr) if tr else None,
            "time_ratio_max": max(tr) if tr else None,
            "median_estimate_share": statistics.median(share) if share else None,
            "worst_estimate_share": max(share) if share else None,
            "share_within_10": sum(x <= 0.10 for x in share),
            "share_rows": len(share), "failed_estimates": sum(
                "estimate_error" in r for r in rows),
            "spread_rows": len(spread),
            "spread_median": statistics.median(spread) if spread else None,
            "spread_max": max(spread) if spread else None}


def cli_plot(res: dict, path: Path) -> None:
    """Estimate against measurement of the cli rows, one marker per strategy
    (of the pick for ``--strategy auto``)."""
    if not can_plot(path):
        return
    rows = [r for r in res["rows"] if r.get("rel_error") is not None]
    if not rows:
        return
    with figure(path, 1, 1, figsize=(5.5, 5)) as (fig, ax):
        for strat, mark in (("full", "o"), ("reversible", "s"), ("prune", "^"),
                            ("offload", "D")):
            for auto in (False, True):
                sel = [r for r in rows if r["estimate"]["strategy"] == strat and
                       ("--strategy auto" in r["args"]) == auto]
                if sel:
                    ax.scatter([r["measured"]["peak_bytes"] / MiB for r in sel],
                               [r["estimate"]["estimated_run_bytes"] / MiB
                                for r in sel], marker=mark, alpha=0.8,
                               facecolors="none" if auto else None,
                               edgecolors="C3" if auto else None,
                               label=f"{strat} (auto pick)" if auto else strat)
        vals = [v for r in rows for v in (r["measured"]["peak_bytes"],
                                          r["estimate"]["estimated_run_bytes"])]
        xs = [min(vals) / MiB * 0.8, max(vals) / MiB * 1.2]
        ax.plot(xs, xs, "k-", lw=0.8, label="exact")
        ax.fill_between(xs, [x * 0.85 for x in xs], [x * 1.15 for x in xs],
                        color="grey", alpha=0.15, label="±15%")
        ax.fill_between(xs, [x * 0.95 for x in xs], [x * 1.05 for x in xs],
                        color="grey", alpha=0.25, label="±5%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured: summary.json memory.peak_bytes (MiB)")
        ax.set_ylabel("planner estimate (MiB)")
        alloc = _HEAP_WORDS[_heap_of(res)][0]
        ax.set_title(f"`leangnn train`, {alloc}: {len(rows)} command lines",
                     fontsize=10)
        ax.legend(fontsize=7)


#: the cli section's heap: (plot title, what the runs got)
_HEAP_WORDS = {"mmap": ("mmap 64 KiB", "`MALLOC_MMAP_THRESHOLD_=65536`, "),
               "default": ("glibc default", "glibc's default allocator, "
                           "`LEANGNN_HEAP=default`, "),
               "compact": ("compact heap", "the compact glibc heap the command "
                           "runs in, `leangnn.heap`, ")}


def _heap_of(res: dict) -> str:
    # (results before the compact heap: True for mmap, False for default)
    a = res.get("allocator")
    return a if a in _HEAP_WORDS else "mmap" if a else "default"


def cli_markdown(res: dict) -> str:
    s = res.get("summary") or {}
    out = ["## Planner through `leangnn train`: estimate vs summary.json", "",
           "`python benchmarks/plan.py --section cli` runs each command line "
           "below as `python -m leangnn train ARGS --epochs "
           f"{res['epochs']} --out TMP --quiet` in a fresh interpreter ("
           + _HEAP_WORDS[_heap_of(res)][1]
           + (f"`OMP_NUM_THREADS={res['threads']}`" if res.get("threads")
              else "torch's default threads")
           + ") and compares summary.json's `memory.peak_bytes` (the Trainer's "
           "meter: peak RSS above the loaded state over training, validation and "
           "checkpoints) and `time.epoch_seconds_median` with the planner's "
           "estimate of that configuration (for `--strategy auto`: of its pick). "
           f"Calibration: `{res['calibration']}`. Targets: memory error median "
           "<= 5%, worst <= 15%; epoch time within 2x.", ""]
    if s:
        out += [f"**{s['rows']} rows**: memory error median "
                f"**{s['median_abs_error']:.1%}**, worst "
                f"**{s['worst_abs_error']:.1%}**; estimated / measured epoch "
                f"CPU time ({s.get('time_rows', 0)} rows with it recorded) median "
                f"{s['time_ratio_median'] or 0:.2f}x (range "
                f"{s['time_ratio_min'] or 0:.2f}-{s['time_ratio_max'] or 0:.2f}x); "
                "estimate CPU time / one measured epoch's CPU time median "
                f"{s['median_estimate_share'] or 0:.0%}, worst "
                f"{s.get('worst_estimate_share') or 0:.0%} ("
                f"{s.get('share_within_10', 0)} of {s.get('share_rows', 0)} rows "
                "within the issue's 10%); "
                f"{s.get('within_5', 0)} rows within 5%, "
                f"{s.get('within_15', 0)} within 15%."
                + (f" The same command line's peak differs from process to "
                   f"process: (max - min) / median "
                   f"{s['spread_median']:.1%} at the median, "
                   f"{s['spread_max']:.1%} at worst over the "
                   f"{s['spread_rows']} rows run more than once."
                   if s.get("spread_rows") else "")
                + (f" {s['failed_estimates']} rows have no estimate (the dry "
                   "run failed)." if s.get("failed_estimates") else ""), ""]
    h = res.get("holdout_summary") or {}
    if h:
        out += [f"**Held out** ({h['rows']} rows marked `h-`, on graphs and "
                "configurations added after the planner and its calibration "
                "were fitted; not in the figures above): memory error median "
                f"**{h['median_abs_error']:.1%}**, worst "
                f"**{h['worst_abs_error']:.1%}**; {h.get('within_5', 0)} within "
                f"5%, {h.get('within_15', 0)} within 15%; estimate / epoch CPU "
                f"median {h['median_estimate_share'] or 0:.0%}.", ""]
    out += ["| row | trains | estimated | measured | error | est. epoch s | "
            "epoch s (wall) | epoch CPU s | ratio | estimate CPU s | "
            "estimate / epoch |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        m, e = r["measured"], r.get("estimate")
        if e is None:
            got = "" if "error" in m else f"{m['peak_bytes'] / MiB:.1f} MiB"
            out.append(f"| {r['name']} | | estimate failed: "
                       f"{r.get('estimate_error', '?')[:80]} | {got} | | | | | | | |")
            continue
        trains = f"{e['strategy']} {e['model']} L{e['num_layers']}"
        if "error" in m:
            out.append(f"| {r['name']} | {trains} | "
                       f"{e['estimated_run_bytes'] / MiB:.1f} MiB | failed: "
                       f"{m['error'][:60]} | | | | | | | |")
            continue
        ratio = r.get("time_ratio_cpu") or r.get("time_ratio")
        cpu = m.get("epoch_cpu_seconds_median")
        peaks = m.get("peaks", [])
        meas = f"{m['peak_bytes'] / MiB:.1f} MiB" + (
            f" ({min(peaks) / MiB:.0f}-{max(peaks) / MiB:.0f}, {len(peaks)} runs)"
            if len(peaks) > 1 else "")
        out.append(
            f"| {r['name']} | {trains} | {e['estimated_run_bytes'] / MiB:.1f} MiB "
            f"| {meas} | {r['rel_error']:+.1%} | "
            f"{e['estimated_epoch_seconds'] or 0:.3f} | "
            f"{m['epoch_seconds_median']:.3f} | "
            + ("" if cpu is None else f"{cpu:.3f}") + " | "
            + ("" if ratio is None else f"{ratio:.2f}x")
            + f" | {e['estimate_cpu_seconds']:.2f} | "
            + ("" if _cpu_share(r) is None else f"{_cpu_share(r):.0%}") + " |")
    notes = [f"- `{r['name']}`: {r['note']}" for r in res["rows"] if r.get("note")]
    notes += [f"- `{r['name']}`: a run planned with a later calibration picked "
              f"{', '.join(r['other_picks'])} (not counted: another configuration)"
              for r in res["rows"] if r.get("other_picks")]
    if notes:
        out += ["", "Notes:", "", *notes]
    out += ["", "Command lines:", ""]
    out += [f"- `{r['name']}`: `leangnn train {r['args']}`" for r in res["rows"]]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 small rows")
    ap.add_argument("--section", choices=["estimate", "auto", "cli", "all"],
                    default="all",
                    help="estimate vs measured rows, the auto cases, the "
                         "`leangnn train` rows (cli; not in all), or all")
    ap.add_argument("--report", action="store_true", help="auto section: only "
                    "rewrite its markdown from results/plan_auto.json (or "
                    "plan_auto_default.json, --auto-allocator default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--auto-allocator", choices=["compact", "default", "mmap"],
                    default="compact",
                    help="auto section on CPU: the compact heap `leangnn train` "
                    "runs in, through the Trainer (results/plan_auto_compact.json; "
                    "default), glibc's default allocator through the Trainer "
                    "(results/plan_auto_default.json) or its pinned mmap "
                    "threshold (results/plan_auto.json)")
    ap.add_argument("--only", nargs="*", default=None,
                    help="row ids (or substrings) to run")
    ap.add_argument("--allocators", nargs="+", default=["mmap"],
                    choices=["mmap", "default"],
                    help="CPU allocator settings to measure (first: the headline)")
    ap.add_argument("--default-rows", nargs="*", default=None,
                    help="substrings selecting the rows measured with glibc's "
                         "default allocator (default: all)")
    ap.add_argument("--remeasure", action="store_true")
    ap.add_argument("--auto-repeat", type=int, default=1,
                    help="auto section: fresh processes per candidate row (the "
                         "median epoch time, the highest peak; default 1)")
    ap.add_argument("--threads", type=int, default=1,
                    help="cli and auto sections: OMP_NUM_THREADS of the runs "
                         "(0: torch's default; on a shared machine more threads "
                         "spin-wait; auto then times wall seconds and writes "
                         "results/plan_auto_<heap>_threads<N>.json)")
    ap.add_argument("--cli-epochs", type=int, default=3)
    ap.add_argument("--merge-runs", default=None, metavar="JSON",
                    help="cli section with --report: add the runs in JSON "
                         "({row name: [measurement, ...]}) to the rows")
    ap.add_argument("--repeat", type=int, default=1,
                    help="cli section: runs per command line (fresh "
                         "interpreters; the median peak is compared)")
    ap.add_argument("--cli-allocator", choices=list(_CLI_JSON),
                    default="compact", help="cli section: the compact glibc heap "
                    "(what `leangnn train` runs in, leangnn.heap; "
                    "results/plan_cli_compact.*), glibc's default heap "
                    "(LEANGNN_HEAP=default; results/plan_cli.*) or its mmap "
                    "threshold pinned at 64 KiB (results/plan_cli_mmap.*)")
    ap.add_argument("--recalibrate", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default=None, help="default: results/plan.json "
                    "(results/quick/plan.json with --quick)")
    ap.add_argument("--md", default=None, help="default: the plan section of "
                    "benchmarks/README.md (results/quick/plan.md with --quick)")
    ap.add_argument("--plot", default=None, help="default: "
                    "results/plan_scatter.png (results/quick/ with --quick)")
    args = ap.parse_args(argv)
    if args.auto_repeat < 1:
        ap.error(f"--auto-repeat: at least 1, got {args.auto_repeat}")

    if args.section == "cli":
        from leangnn.plan.calibration import load_calibration

        _use_heap(args.cli_allocator)
        name = _CLI_JSON[args.cli_allocator]
        if args.report:  # the markdown again from the JSON, no runs
            path = results_path(name, args.quick)
            res_cli = json.loads(path.read_text())
            res_cli.setdefault("epochs", args.cli_epochs)
            res_cli.setdefault("threads", args.threads)
            if args.merge_runs:  # runs measured by another process, added
                added = merge_runs(res_cli, json.loads(
                    Path(args.merge_runs).read_text()))
                log(f"{added:+d} runs from {args.merge_runs} (after leaving out "
                    "runs of another pick)")
            res_cli["rows"] = [_score(r) for r in _in_order(res_cli["rows"])]
            _summaries(res_cli)
            write_json(path, res_cli)
        else:
            res_cli = cli_rows(args, load_calibration(args.device))
        name = name.replace(".json", ".md")
        md = Path(args.md) if args.md else results_path(name, args.quick)
        write_section("plan-cli", cli_markdown(res_cli), md)
        png = Path(args.plot) if args.plot else results_path(
            name.replace(".md", "_scatter.png"), args.quick)
        cli_plot(res_cli, png)
        print(cli_markdown(res_cli))
        return 0
    if args.section in ("auto", "all"):
        alloc = args.auto_allocator
        if args.report:
            saved = json.loads(results_path(_auto_json(alloc, args.threads),
                                            args.quick).read_text())
            cases = [_judge(c) for c in saved.values() if isinstance(c, dict)
                     and "rows" in c]
            kind = cases[0]["plan"]["calibration"] if cases else ""
            res_auto = {"device": args.device, "calibration": kind, "cases": cases,
                        "allocator": alloc, "threads": args.threads}
        else:
            if alloc == "compact":
                _use_heap(alloc)
            cal = calibration(args.device, args.device == "cpu" and alloc == "mmap",
                              False, args.quick)
            res_auto = auto_cases(args, cal)
        md = Path(args.md) if args.md else markdown_path("plan", args.quick)
        name = {"mmap": "plan-auto", "default": "plan-auto-default",
                "compact": "plan-auto-compact"}[alloc]
        if args.threads != 1 and not args.md:
            # (the README's section is the one-thread table; this one is
            # written beside its JSON)
            md = results_path(_auto_json(alloc, args.threads), args.quick
                              ).with_suffix(".md")
        write_section(name, auto_markdown(res_auto),
                      md.with_name(name.replace("-", "_") + ".md") if args.md
                      else md)
        if args.section == "auto":
            return 0
    configs = QUICK if args.quick else CONFIGS
    if args.only:
        configs = [c for c in configs if any(s in row_id(c) for s in args.only)]
    out = Path(args.out) if args.out else results_path("plan.json", args.quick)
    old = json.loads(out.read_text()) if out.is_file() else {}
    cpu = args.device == "cpu"
    allocators = args.allocators if cpu else ["cuda"]
    res = {"device": args.device, "allocators": {}}
    splits: dict = {}
    for i, alloc in enumerate(allocators):
        mmap = alloc == "mmap"
        sel = configs if i == 0 or args.default_rows is None else [
            c for c in configs if any(s in row_id(c) for s in args.default_rows)]
        cal = calibration(args.device, mmap, args.recalibrate, args.quick)
        key = f"measured_{alloc}"
        prev = {r["id"]: r for r in old.get(key, [])}

        def save(part, key=key, prev=prev):
            old[key] = list({**prev, **part}.values())
            write_json(out, old)

        meas = measure_rows(sel, args.device, mmap, prev, args.remeasure,
                            args.timeout, save)
        ests = estimate_rows(sel, args.device, cal, splits)
        rows = compare(sel, ests, meas)
        section = {"calibration": cal.to_dict(), "rows": rows,
                   "summary": summarize(rows)}
        if i == 0:
            res.update(section)
        else:
            res["allocators"][alloc] = section
    res.update({key: old[key] for key in old if key.startswith("measured_")})
    write_json(out, res)
    s = res["summary"]
    if s:
        log(f"{s['rows']} rows: median error {s['median_abs_error']:.1%}, worst "
            f"{s['worst_abs_error']:.1%}; estimate/epoch median "
            f"{s['median_estimate_share']:.1%}")
    md = Path(args.md) if args.md else markdown_path("plan", args.quick)
    png = Path(args.plot) if args.plot else results_path("plan_scatter.png",
                                                         args.quick)
    write_section("plan", markdown(res, md, png), md)
    plot(res, png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
