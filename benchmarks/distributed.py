"""Distributed benchmark: halo-exchange graph parallelism vs the alternatives.

Graph-parallel full-graph training (:mod:`leangnn.distributed`) moves, per
layer, only the halo rows each rank needs (forward) and their gradients
(backward). This script reports, on the same METIS partitions:

* **counted** (from the partition alone, so P goes beyond what runs here),
  on the 2M-node power-law graph of ``benchmarks/offload.py`` for P = 2..64,
  the bytes per training epoch of

  - *halo* (leangnn): forward halo rows + backward halo gradients per layer;
  - *replicate*: all-gathering every layer's embeddings to every rank
    (forward only; each rank receives the ``N - N/P`` rows it does not own);
  - *CAGNET-1D* (Tripathy et al., SC 2020): every rank broadcasts its block
    of rows to all others in the forward pass and again for the gradients in
    the backward pass;
  - *SAR* (Mostafa, MLSys 2022): halo rows fetched in the forward pass,
    fetched again to rematerialise in the backward pass, gradients sent back;

  the input features' halo moves once per run (they never change), so
  per-epoch figures count the ``L - 1`` hidden-layer inputs for every method;
  the parameter-gradient all-reduce is the same for all and listed apart;
* **measured** on a smaller graph that runs here, P = 1 (plain PyG
  full-batch), 2 and 4 gloo ranks: per-rank peak memory of training above the
  rank's resident data, autograd's saved bytes, epoch time, and the halo bytes
  the ranks counted (checked equal to the partition count); the target per
  rank is ``(1/P + halo rows of the rank / N)`` of the single-process peak,
  +10%; plus the composed rows (``--budget``): P ranks each running its part
  through the layer-wise offload engine under its own device budget
  (:class:`~leangnn.distributed.RankOffload`; on a CPU the "device" is the
  host, so the RSS is device + host bytes and the engine's accounting gives
  the device share).

Timings on a shared 2-core CPU with P ranks of one thread each are not a
speed-up claim; absolute times only mean something on real hardware.

    python benchmarks/distributed.py            # full: 2M counted, 200k run (~40 min)
    python benchmarks/distributed.py --quick    # 100k counted, 20k run (~3 min)
    python benchmarks/distributed.py --counted-from results/distributed.json
        # reuse the counted rows of an earlier run (same graph), measure only

Writes ``results/distributed.json`` and the ``distributed`` section of
``benchmarks/README.md`` (``--quick``: ``results/quick/``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from leangnn.distributed import GraphParallel, RankOffload, halo_counts, spawn
from leangnn.graphs.partition import partition_graph
from leangnn.graphs.synthetic import power_law_graph
from leangnn.nn.models import build_model
from leangnn.profile import MemoryMeter, SavedTensorsMeter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import README, results_path, write_json, write_section  # noqa: E402

MiB = float(1 << 20)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ counted
def volumes(counts: torch.Tensor, num_nodes: int, layers: int, hidden: int,
            elem: int = 4) -> dict:
    """Bytes per epoch of each exchange scheme from a ``[P, P]`` halo matrix."""
    p = counts.size(0)
    h = int(counts.sum())
    row = hidden * elem
    hidden_layers = layers - 1  # inputs of layers 1..L-1 change every epoch
    return {
        "halo_rows": h,
        "halo_rows_max_rank": int(counts.sum(0).max()),
        "halo_forward": hidden_layers * h * row,
        "halo": 2 * hidden_layers * h * row,
        "replicate": hidden_layers * (p - 1) * num_nodes * row,
        "cagnet_1d": 2 * hidden_layers * (p - 1) * num_nodes * row,
        "sar": 3 * hidden_layers * h * row,
    }


def counted(data: Data, parts: list[int], layers: int, hidden: int,
            cache_dir: str | None) -> list[dict]:
    rows = []
    n = int(data.num_nodes)
    for p in parts:
        t0 = time.perf_counter()
        part = partition_graph(data.edge_index, n, p, cache_dir=cache_dir).part
        t_part = time.perf_counter() - t0
        c = halo_counts(data.edge_index, part, p)
        v = volumes(c, n, layers, hidden)
        v.update(parts=p, partition_s=t_part, input_halo_once=int(c.sum()) * 64 * 4)
        rows.append(v)
        log(f"  P={p}: halo {v['halo_rows']:,} rows ({v['halo_rows'] / n:.2f} N), "
            f"halo {v['halo'] / MiB:,.0f} MiB vs replicate "
            f"{v['replicate'] / MiB:,.0f} MiB per epoch")
    return rows


# ----------------------------------------------------------------- measured
def _model(layers: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("sage", 64, hidden, 8, layers)


def _loss(out, d):
    return F.cross_entropy(out[d.node_mask], d.y[d.node_mask])


def _rank_run(ctx, spec: dict) -> dict:
    torch.set_num_threads(1)
    data = power_law_graph(spec["nodes"], avg_degree=spec["avg_degree"],
                           in_channels=64, seed=spec["seed"])
    data.node_mask = data.train_mask
    model = _model(spec["layers"], spec["hidden"])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    resident = None
    if spec["single"]:
        def step():
            loss = _loss(model(data.x, data.edge_index), data)
            loss.backward()

        def fwd():
            return _loss(model(data.x, data.edge_index), data)
        resident = (data.x.numel() * 4 + data.edge_index.numel() * 8)
    else:
        ex = RankOffload(spec["budget"]) if spec.get("budget") else None
        runner = GraphParallel(data, executor=ex)
        labels = Data(y=data.y, node_mask=data.train_mask, num_nodes=data.num_nodes)
        plan = runner.plan
        resident = (runner.x.numel() * 4 + plan.edge_index.numel() * 8
                    + plan.edge_ids.numel() * 8)
        del data  # a rank keeps its part only
        gc.collect()

        def step():
            runner.train_step(model, labels, _loss)

        def fwd():
            with runner.hooked(model) if ex is None else nullcontext():
                out = runner.forward(model)
                return runner.local_loss(out, labels, _loss)[0]
    meter = MemoryMeter("cpu").start()
    times = []
    for _ in range(spec["epochs"]):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        step()
        opt.step()
        times.append(time.perf_counter() - t0)
    peak = meter.stop()
    halo = None if spec["single"] else {
        "halo_bytes_received": runner.stats.bytes_received,
        "halo_rows_per_layer": dict(runner.stats.rows_per_layer),
        "halo_rows": runner.plan.num_halo}
    with SavedTensorsMeter() as saved:
        loss = fwd()  # no backward: every rank skips the same collectives
    del loss
    out = {"rank": ctx.rank, "epoch_s": times, "peak_bytes": peak.peak_bytes,
           "peak_method": peak.method, "saved_bytes": saved.bytes,
           "resident_bytes": resident}
    out.update(halo or {})
    if not spec["single"] and ex is not None:
        out["offload"] = ex.summary()
    return out


def measured(nodes: int, avg_degree: float, layers: int, hidden: int, epochs: int,
             procs: list[int], budget: str | None = None,
             budget_procs: tuple[int, ...] = ()) -> list[dict]:
    rows = []
    runs = [(p, None) for p in procs] + [(p, budget) for p in budget_procs]
    for p, b in runs:
        spec = {"nodes": nodes, "avg_degree": avg_degree, "layers": layers,
                "hidden": hidden, "epochs": epochs, "seed": 5, "single": p == 1,
                "budget": b}
        log(f"  P={p}: {'PyG full batch, one process' if p == 1 else 'gloo ranks'}"
            f"{f', device budget {b} per rank' if b else ''}")
        res = spawn(_rank_run, p, args=(spec,), start_method="spawn",
                    join_timeout=3600)
        steady = [t for r in res for t in r["epoch_s"][1:]]
        row = {"procs": p, "budget": b, "ranks": res,
               "epoch_s_median": statistics.median(steady),
               "peak_bytes_max_rank": max(r["peak_bytes"] for r in res),
               "saved_bytes_max_rank": max(r["saved_bytes"] for r in res),
               "resident_bytes_max_rank": max(r["resident_bytes"] for r in res)}
        if p > 1:
            row["halo_share_max_rank"] = max(r["halo_rows"] for r in res) / nodes
            # forward rows of every epoch + the input halo once; each hidden
            # row's gradient comes back in the backward pass
            h = sum(r["halo_rows"] for r in res)
            want = (epochs * (layers - 1) * h * hidden * 4 * 2 + h * 64 * 4)
            row["halo_bytes_measured"] = sum(r["halo_bytes_received"] for r in res)
            row["halo_bytes_counted"] = want
        rows.append(row)
        log(f"    median epoch {row['epoch_s_median']:.3f} s, peak "
            f"{row['peak_bytes_max_rank'] / MiB:.0f} MiB, saved "
            f"{row['saved_bytes_max_rank'] / MiB:.0f} MiB (max rank)")
    return rows


# ------------------------------------------------------------------- report
def markdown(res: dict) -> str:
    cfg = res["config"]
    n = res["counted_nodes"]
    cmds = " and ".join(f"`{c.strip()}`" for c in res.get("commands", [])) or (
        "`python benchmarks/distributed.py`")
    lines = [
        "## Distributed: halo exchange vs replication, CAGNET-1D and SAR", "",
        f"{cmds}: "
        f"{cfg['layers']}-layer GraphSAGE, hidden {cfg['hidden']}, float32, METIS "
        "parts. Counted from the partition of the "
        f"{n:,}-node power-law graph (avg degree {cfg['avg_degree']:g}); bytes per "
        "training epoch summed over ranks (the input features' halo moves once "
        "per run and is listed apart). *replicate*: all-gather of every hidden "
        "layer's embeddings (forward only); *CAGNET-1D*: block broadcasts "
        "forward and backward; *SAR*: halo fetched forward, re-fetched to "
        "rematerialise and gradients returned backward.", "",
        "| P | halo rows / N | max rank halo rows | halo forward | replicate "
        "(forward) | halo fwd+bwd (leangnn) | CAGNET-1D | SAR | replicate / halo "
        "forward | CAGNET-1D / halo | input halo once |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["counted"]:
        lines.append(
            f"| {r['parts']} | {r['halo_rows'] / n:.3f} | {r['halo_rows_max_rank']:,}"
            f" | {r['halo_forward'] / MiB:,.0f} MiB | {r['replicate'] / MiB:,.0f} "
            f"MiB | {r['halo'] / MiB:,.0f} MiB | {r['cagnet_1d'] / MiB:,.0f} MiB | "
            f"{r['sar'] / MiB:,.0f} MiB | "
            f"{r['replicate'] / max(r['halo_forward'], 1):.2f}x | "
            f"{r['cagnet_1d'] / max(r['halo'], 1):.2f}x | "
            f"{r['input_halo_once'] / MiB:,.0f} MiB |")
    m = _ordered(res["measured"])
    lines += [
        "", f"Measured on a {res['measured_nodes']:,}-node power-law graph, "
        f"{cfg['epochs']} epochs, one torch thread per rank on a shared "
        f"{cfg['cpus']}-core CPU (epoch times are medians of epochs 2+ over "
        "ranks, not a speed-up claim). Peak: process RSS above the rank's "
        "resident data (its part, or the whole graph at P = 1); saved: bytes "
        "autograd keeps for backward.", "",
        "| P | epoch s | peak / rank | saved / rank | resident data / rank | "
        "halo bytes measured = counted |",
        "|---:|---:|---:|---:|---:|:---|",
    ]
    for r in m:
        check = ("n/a" if r["procs"] == 1 else
                 f"{r['halo_bytes_measured'] / MiB:,.1f} MiB: "
                 f"{r['halo_bytes_measured'] == r['halo_bytes_counted']}")
        label = f"{r['procs']} (budget {r['budget']})" if r.get("budget") else (
            str(r["procs"]))
        lines.append(
            f"| {label} | {r['epoch_s_median']:.3f} | "
            f"{r['peak_bytes_max_rank'] / MiB:,.0f} MiB | "
            f"{r['saved_bytes_max_rank'] / MiB:,.0f} MiB | "
            f"{r['resident_bytes_max_rank'] / MiB:,.1f} MiB | {check} |")
    lines.append("")
    return "\n".join(lines)


def _ordered(rows: list[dict]) -> list[dict]:
    # plain rows by P, then the composed (budget) rows; repeats keep their order
    return sorted(rows, key=lambda r: (r.get("budget") is not None, r["procs"]))


def target_lines(res: dict) -> list[str]:
    """Per-rank peak against ``(1/P + halo share) x single-process peak, +10%``."""
    m = _ordered(res["measured"])
    single = next((r for r in m if r["procs"] == 1), None)
    if single is None:
        return []
    base = single["peak_bytes_max_rank"]
    lines = [
        "", f"Per-rank peak against the target `(1/P + halo share) x P=1 peak "
        f"x 1.1` ({res['measured_nodes']:,} nodes; halo share = the largest "
        "rank's halo rows / N). Composed rows: each rank under the offload engine "
        "with the given device budget (on this CPU the device is the host: "
        "RSS = device + host bytes; *device peak* is the engine's accounting, "
        "parameters x 4 + the largest job).", "",
        "| P | device budget / rank | chunks / rank | peak / rank | target | "
        "met | device peak / rank | epoch s |",
        "|---:|---:|---:|---:|---:|:---|---:|---:|"]
    for r in m:
        if r["procs"] == 1:
            lines.append(f"| 1 | - | - | {base / MiB:,.0f} MiB | - | - | - | "
                         f"{r['epoch_s_median']:.3f} |")
            continue
        target = (1 / r["procs"] + r["halo_share_max_rank"]) * base * 1.1
        peak = r["peak_bytes_max_rank"]
        off = [x.get("offload") for x in r["ranks"]]
        chunks = dev = "-"
        if off[0]:
            chunks = "/".join(str(o["num_chunks"][0]) for o in off)
            dev = f"{max(o['counters']['peak_device_bytes'] for o in off) / MiB:,.1f}"\
                " MiB"
        lines.append(
            f"| {r['procs']} | {r['budget'] or '-'} | {chunks} | {peak / MiB:,.0f} MiB"
            f" | {target / MiB:,.0f} MiB | {'yes' if peak <= target else 'NO'} | "
            f"{dev} | {r['epoch_s_median']:.3f} |")
    lines.append("")
    return lines


def main(argv=None) -> dict:
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int, default=None,
                    help="counted graph (default 2M, quick 100k)")
    ap.add_argument("--run-nodes", type=int, default=None,
                    help="measured graph (default 200k, quick 20k)")
    ap.add_argument("--avg-degree", type=float, default=25.0)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--parts", type=int, nargs="*", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--procs", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--cache-dir", default=None, help="partition cache folder")
    ap.add_argument("--budget", default=None,
                    help="also run P ranks each under the offload engine with "
                    "this device budget (e.g. 16MiB)")
    ap.add_argument("--budget-procs", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the markdown of --out's results, run nothing")
    ap.add_argument("--append", action="store_true",
                    help="keep the measured rows already in --out (same "
                    "measured graph) and add this run's")
    ap.add_argument("--counted-from", default=None,
                    help="reuse the counted rows of this earlier results JSON")
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args(argv)
    quick = args.quick
    args.out = args.out or str(results_path("distributed.json", quick))
    args.markdown = args.markdown or str(results_path("distributed.md", True)
                                         if quick else README)
    if args.report_only:
        import json

        res = json.loads(Path(args.out).read_text())
        md = markdown(res) + "\n".join(target_lines(res))
        write_section("distributed", md, args.markdown)
        print(md)
        return res
    n = args.nodes or (100_000 if quick else 2_000_000)
    nrun = args.run_nodes or (20_000 if quick else 200_000)
    t0 = time.perf_counter()
    res = {"config": {"quick": quick, "avg_degree": args.avg_degree,
                      "layers": args.layers, "hidden": args.hidden,
                      "epochs": args.epochs, "torch": torch.__version__,
                      "cpus": os.cpu_count()},
           "commands": ["python benchmarks/distributed.py " + " ".join(
               sys.argv[1:] if argv is None else argv)],
           "counted_nodes": n, "measured_nodes": nrun}
    if args.counted_from:
        import json

        old = json.loads(Path(args.counted_from).read_text())
        res["counted_nodes"] = n = old["counted_nodes"]
        res["counted_edges"], res["counted"] = old["counted_edges"], old["counted"]
        res["counted_from"] = args.counted_from
        log(f"counted rows of {n:,} nodes reused from {args.counted_from}")
    else:
        log(f"power-law graph: {n:,} nodes, avg degree {args.avg_degree}")
        data = power_law_graph(n, avg_degree=args.avg_degree, in_channels=64)
        res["counted_edges"] = int(data.num_edges)
        res["counted"] = counted(data, args.parts, args.layers, args.hidden,
                                 args.cache_dir)
        del data
        gc.collect()
    log(f"measured runs on {nrun:,} nodes")
    res["measured"] = measured(nrun, args.avg_degree, args.layers, args.hidden,
                               args.epochs, args.procs, args.budget,
                               tuple(args.budget_procs) if args.budget else ())
    if args.append and Path(args.out).exists():
        import json

        old = json.loads(Path(args.out).read_text())
        if old["measured_nodes"] != nrun or old["config"]["epochs"] != args.epochs:
            raise SystemExit(f"--append: {args.out} measured {old['measured_nodes']}"
                             f" nodes, {old['config']['epochs']} epochs; this run "
                             f"{nrun}, {args.epochs}")
        res["measured"] = old["measured"] + res["measured"]
        res["commands"] = old.get("commands", []) + res["commands"]
    res["wall_s"] = time.perf_counter() - t0
    out = write_json(args.out, res)
    md = markdown(res) + "\n".join(target_lines(res))
    write_section("distributed", md, args.markdown)
    print(md)
    log(f"benchmarks/distributed.py: wrote {out} in {res['wall_s'] / 60:.1f} min")
    return res


if __name__ == "__main__":
    main()
