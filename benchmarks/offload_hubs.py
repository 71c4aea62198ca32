"""Hubs: offload plans for every cache policy on R-MAT graphs with huge in-degrees.

R-MAT graphs (Graph500 parameters a=0.57, b=c=0.19, d=0.05; our own
generator, :func:`leangnn.graphs.synthetic.rmat_graph`) have hubs with tens of
thousands of in-edges. Before edge-split jobs a hub whose one-node job did not
fit the device workspace stopped planning with ``BudgetError``; now its
in-edges are split across jobs whose partial aggregates combine exactly
(:mod:`leangnn.offload.partial`). For each graph and budget (a fraction of the
full-batch need) this plans every policy and replays one training epoch in
counting mode (``virtual=True``: the same schedule and cache decisions as a
real epoch, no data), then runs one real epoch on the check graph and compares
loss and every parameter gradient with PyG full batch.

    python benchmarks/offload_hubs.py                  # 2^18 and 2^20, 25% / 6.25%
    python benchmarks/offload_hubs.py --scales 14 --check-scale 14   # quick

Writes ``benchmarks/results/offload_hubs.json`` and prints the markdown.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from leangnn.graphs.synthetic import rmat_graph
from leangnn.nn.models import build_model
from leangnn.offload import BudgetError, OffloadEngine
from leangnn.plan.vertex import full_batch_vertex_bytes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import results_path, write_json  # noqa: E402

POLICIES = ("none", "lru", "degree", "st")
MiB = float(1 << 20)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ce_loss(out, data):
    return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def new_model(args, dtype=torch.float32):
    torch.manual_seed(0)
    return build_model(args.model, 64, args.hidden, 8, 3).to(dtype)


def plan_rows(data, model, frac, args, replay=True) -> list[dict]:
    need = full_batch_vertex_bytes(model, data.num_nodes)
    budget = int(frac * need)
    rows, like = [], None
    for pol in args.policies:
        row = {"policy": pol, "budget_fraction": frac, "budget_bytes": budget,
               "need_bytes": need}
        t0 = time.perf_counter()
        try:
            eng = OffloadEngine(model, data, budget, args.parts, pol, virtual=True,
                                cache_dir=args.cache_dir, like=like)
        except BudgetError as e:
            row.update(plans=False, error=str(e))
            rows.append(row)
            log(f"  {pol}: {e}")
            continue
        like = like or eng
        t1 = time.perf_counter()
        c = eng.simulate() if replay else None
        t2 = time.perf_counter()
        deg = eng.csr.in_degree()
        hub = int(torch.argmax(deg))
        d = int(deg[hub])
        pieces = [ch.piece for ch in eng.sched.chunks if ch.piece is not None]
        row.update(
            plans=True, num_chunks=eng.num_chunks, num_pieces=len(pieces),
            hubs_split=len({p.node for p in pieces}),
            max_in_degree=d,
            max_hub_pieces=max([p.count for p in pieces if p.node == hub],
                               default=1),
            # the hub's one-node job: before edge splits this raised BudgetError
            hub_job_fits=bool(eng.split.fits(d + 1, 1, d)),
            workspace_bytes=eng.split.workspace, replayed=replay,
            plan_s=round(t1 - t0, 2), simulate_s=round(t2 - t1, 2))
        if replay:
            row.update(jobs=c.jobs, traffic_bytes=c.h2d_bytes + c.d2h_bytes,
                       peak_device_bytes=c.peak_device_bytes,
                       under_budget=c.peak_device_bytes <= budget,
                       vertex_layers=c.vertex_layer_computations)
        log(f"  {pol}: {eng.num_chunks} jobs/sweep, {len(pieces)} pieces of "
            f"{row['hubs_split']} hubs (largest: {d} in-edges in "
            f"{row['max_hub_pieces']} pieces), traffic "
            f"{row.get('traffic_bytes', float('nan')) / MiB:,.0f} MiB, plan "
            f"{row['plan_s']} s, epoch replay {row['simulate_s']} s")
        rows.append(row)
        del eng
    return rows


def real_check(args, frac, policy="st") -> dict:
    """One real epoch against PyG full batch on the check graph (``auto``:
    the engine with its defaults, as the CLI builds it)."""
    data = rmat_graph(args.check_scale, args.edge_factor, in_channels=64,
                      seed=args.seed)
    model = new_model(args)
    t0 = time.perf_counter()
    out = model(data.x, data.edge_index)
    loss = ce_loss(out, data)
    ref = torch.autograd.grad(loss, list(model.parameters()))
    t_pyg = time.perf_counter() - t0
    del out
    need = full_batch_vertex_bytes(model, data.num_nodes)
    kw = {} if policy == "auto" else {"cache": policy}
    eng = OffloadEngine(model, data, int(frac * need), args.parts,
                        cache_dir=args.cache_dir, **kw)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    got = eng.train_step(ce_loss, data)
    t_eng = time.perf_counter() - t0
    err = max(float((p.grad - r).abs().max() / r.abs().max().clamp_min(1e-30))
              for p, r in zip(model.parameters(), ref))
    res = {"scale": args.check_scale, "nodes": data.num_nodes,
           "edges": int(data.edge_index.size(1)), "budget_fraction": frac,
           "cache": policy, "policy": eng.policy, "retain": eng.retain,
           "num_chunks": eng.num_chunks, "num_pieces": eng.sched.num_pieces,
           "loss_rel_err": abs(got - float(loss.detach())) / abs(float(loss.detach())),
           "grad_rel_err": err, "dtype": "float32", "epoch_s": round(t_eng, 1),
           "pyg_s": round(t_pyg, 1),
           "peak_device_bytes": eng.counters.peak_device_bytes,
           "budget_bytes": eng.budget}
    log(f"  real epoch ({policy} = {eng.policy}) at {frac:.2%}: "
        f"{eng.num_chunks} jobs/sweep "
        f"({eng.sched.num_pieces} pieces), loss rel err {res['loss_rel_err']:.1e}, "
        f"max gradient rel err {err:.1e} (float32), {t_eng:.1f} s "
        f"(PyG full batch {t_pyg:.1f} s)")
    return res


def markdown(res: dict) -> str:
    cfg = res["config"]
    lines = [
        f"3-layer {cfg['model'].upper()} (hidden {cfg['hidden']}, float32), "
        f"{cfg['parts']} METIS parts, R-MAT a=0.57 b=c=0.19 (edge factor "
        f"{cfg['edge_factor']}, symmetrised, deduplicated); budget a fraction of "
        "the full-batch need; epochs replayed in counting mode. Target: every "
        "policy plans and its epoch runs (before edge splits, `lru`/`degree`/`st` "
        "stopped with `BudgetError` at 25% on 2^18).", "",
        "| graph | budget (of need) | policy | plans | jobs/sweep | hub pieces "
        "(hubs) | largest hub: in-edges / pieces | one-node hub job fits | "
        "traffic | peak <= budget | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in res["graphs"]:
        name = f"R-MAT 2^{g['scale']} ({g['nodes']:,} n, {g['edges'] / 1e6:.1f}M e)"
        for r in g["rows"]:
            bud = f"{r['budget_bytes'] / MiB:,.1f} MiB ({r['budget_fraction']:.2%})"
            if not r["plans"]:
                lines.append(f"| {name} | {bud} | {r['policy']} | **no** | | | | | "
                             f"| | plans |")
                continue
            lines.append(
                f"| {name} | {bud} | {r['policy']} | yes | {r['num_chunks']} | "
                f"{r['num_pieces']} ({r['hubs_split']}) | {r['max_in_degree']:,} / "
                f"{r['max_hub_pieces']} | {'yes' if r['hub_job_fits'] else 'no'} | "
                + (f"{r['traffic_bytes'] / MiB:,.0f} MiB | "
                   f"{'yes' if r['under_budget'] else 'NO'} | plans |"
                   if r.get("replayed") else "(planned only) | | plans |"))
    for c in res.get("checks", []):
        pol = c.get("cache", "st")
        pol = pol if c.get("policy", pol) == pol else f"{pol} = {c['policy']}"
        lines += ["", f"Real epoch (`{pol}`, R-MAT 2^{c['scale']}, "
                  f"{c['nodes']:,} nodes, "
                  f"{c['edges'] / 1e6:.1f}M edges, {c['budget_fraction']:.2%} of the "
                  f"need, {c['num_chunks']} jobs/sweep with {c['num_pieces']} hub "
                  f"pieces): loss relative error {c['loss_rel_err']:.1e}, largest "
                  f"parameter-gradient relative error {c['grad_rel_err']:.1e} against "
                  f"PyG full batch (float32; target 1e-5); {c['epoch_s']} s "
                  f"(PyG {c['pyg_s']} s)."]
    lines += ["", f"Command: `{res['config']['command']}`"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", type=int, nargs="*", default=[18, 20])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.0625])
    ap.add_argument("--edge-factor", type=float, default=12.0)
    ap.add_argument("--model", default="gcn", choices=["gcn", "sage", "gat"])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES),
                    choices=POLICIES)
    ap.add_argument("--replay", type=int, nargs="*", default=None,
                    help="scales whose epochs are replayed (default: all)")
    ap.add_argument("--check-scale", type=int, default=18,
                    help="graph of the real epoch with gradient check (0: none)")
    ap.add_argument("--check-fractions", type=float, nargs="*", default=[0.25])
    ap.add_argument("--check-policies", nargs="+", default=["st"],
                    choices=["auto", *POLICIES],
                    help="cache policies of the real epochs (auto: the engine's "
                         "defaults)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None,
                    help="default: results/offload_hubs.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or str(results_path("offload_hubs.json"))
    res = {"config": {"model": args.model, "hidden": args.hidden, "parts": args.parts,
                      "edge_factor": args.edge_factor, "seed": args.seed,
                      "threads": args.threads, "torch": torch.__version__,
                      "command": "python benchmarks/offload_hubs.py "
                                 + " ".join(sys.argv[1:] if argv is None else argv)},
           "graphs": [], "checks": []}
    for scale in args.scales:
        t0 = time.perf_counter()
        data = rmat_graph(scale, args.edge_factor, in_channels=64, seed=args.seed)
        g = {"scale": scale, "nodes": data.num_nodes,
             "edges": int(data.edge_index.size(1)),
             "max_in_degree": int(torch.bincount(data.edge_index[1]).max()),
             "generate_s": round(time.perf_counter() - t0, 1), "rows": []}
        log(f"R-MAT 2^{scale}: {g['nodes']:,} nodes, {g['edges']:,} edges, largest "
            f"in-degree {g['max_in_degree']:,} ({g['generate_s']} s)")
        model = new_model(args)
        for frac in args.fractions:
            log(f" budget {frac:.2%} of the need")
            g["rows"] += plan_rows(data, model, frac, args,
                                   args.replay is None or scale in args.replay)
        res["graphs"].append(g)
        write_json(out, res)
        del data
    if args.check_scale:
        for frac in args.check_fractions:
            for pol in args.check_policies:
                res["checks"].append(real_check(args, frac, pol))
                write_json(out, res)
    write_json(out, res)
    md = markdown(res)
    print(md)
    log(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
