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

On large check graphs the reference and each real epoch run in their own
process (each under the machine's per-command limit): ``--ref FILE
--ref-only`` computes PyG full batch once and saves loss and gradients;
``--ref FILE --append`` then loads them for each offload epoch and merges the
check into ``--out``. ``--ref-adj csr`` runs the same PyG model on a
``torch.sparse_csr`` adjacency (PyG's ``adj_t`` path: ``spmm``, no ``[E, C]``
messages), so hidden 64 fits in memory on 24M edges; it equals the
``edge_index`` path to float32 rounding (``--ref-compare`` measures that).

Writes ``benchmarks/results/offload_hubs.json`` and prints the markdown.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from leangnn.graphs.synthetic import rmat_graph
from leangnn.nn.models import build_model
from leangnn.offload import BudgetError, OffloadEngine
from leangnn.plan.vertex import full_batch_vertex_bytes
from leangnn.utils import atomic_torch_save

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


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def check_graph(args):
    return rmat_graph(args.check_scale, args.edge_factor, in_channels=64,
                      seed=args.seed)


def ref_key(args) -> dict:
    return {"scale": args.check_scale, "edge_factor": args.edge_factor,
            "seed": args.seed, "model": args.model, "hidden": args.hidden}


def pyg_reference(args, data, model, adj_mode: str) -> dict:
    """PyG full batch: loss and every parameter gradient of one epoch.

    ``adj_mode="csr"`` hands the same PyG model the transposed adjacency as a
    ``torch.sparse_csr`` tensor (PyG's ``adj_t`` input): GCNConv then
    normalises it in ``gcn_norm`` and aggregates with ``spmm``; no offload
    code is involved either way."""
    if adj_mode == "csr":
        from torch_geometric.utils import to_torch_csr_tensor
        n = data.num_nodes
        t0 = time.perf_counter()
        adj = to_torch_csr_tensor(data.edge_index.flip(0), size=(n, n))
    else:
        adj = data.edge_index
        t0 = time.perf_counter()
    loss = ce_loss(model(data.x, adj), data)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    t = time.perf_counter() - t0
    return {"key": ref_key(args), "adj": adj_mode, "loss": loss.detach(),
            "grads": [g.detach() for g in grads], "pyg_s": round(t, 1),
            "params": [p.detach().clone() for p in model.parameters()],
            "peak_rss_bytes": peak_rss_bytes(), "nodes": data.num_nodes,
            "edges": int(data.edge_index.size(1))}


def rel_errors(grads, ref) -> list[float]:
    return [float((g - r).abs().max() / r.abs().max().clamp_min(1e-30))
            for g, r in zip(grads, ref)]


def load_reference(args, model) -> dict:
    ref = torch.load(args.ref, weights_only=True)
    if ref["key"] != ref_key(args):
        raise ValueError(f"--ref {args.ref}: reference of {ref['key']}, this run "
                         f"checks {ref_key(args)}")
    if not all(torch.equal(p.detach(), q)
               for p, q in zip(model.parameters(), ref["params"])):
        raise ValueError(f"--ref {args.ref}: saved parameters differ from this "
                         "run's initial parameters")
    log(f"  reference loaded from {args.ref} (PyG full batch, adj "
        f"{ref['adj']}, {ref['pyg_s']} s, process peak "
        f"{ref['peak_rss_bytes'] / MiB:,.0f} MiB)")
    return ref


def make_reference(args) -> dict:
    """Compute (``--ref-only``: and save) the PyG reference of the check graph."""
    data = check_graph(args)
    log(f"check graph R-MAT 2^{args.check_scale}: {data.num_nodes:,} nodes, "
        f"{data.edge_index.size(1):,} edges; rss "
        f"{peak_rss_bytes() / MiB:,.0f} MiB before PyG")
    ref = pyg_reference(args, data, new_model(args), args.ref_adj)
    log(f"  PyG full batch ({args.ref_adj}): loss {float(ref['loss']):.6f}, "
        f"{ref['pyg_s']} s, process peak {ref['peak_rss_bytes'] / MiB:,.0f} MiB")
    if args.ref_compare:
        other = "edge_index" if args.ref_adj == "csr" else "csr"
        alt = pyg_reference(args, data, new_model(args), other)
        errs = rel_errors(alt["grads"], ref["grads"])
        ref["compare"] = {
            "adj": other, "pyg_s": alt["pyg_s"],
            "peak_rss_bytes": alt["peak_rss_bytes"],
            "loss_rel_err": float((alt["loss"] - ref["loss"]).abs()
                                  / ref["loss"].abs()),
            "grad_rel_err": max(errs)}
        log(f"  PyG {other} vs {args.ref_adj}: loss rel err "
            f"{ref['compare']['loss_rel_err']:.1e}, max grad rel err "
            f"{max(errs):.1e} ({alt['pyg_s']} s, process peak "
            f"{alt['peak_rss_bytes'] / MiB:,.0f} MiB)")
    if args.ref:
        Path(args.ref).parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(ref, args.ref)
        log(f"  saved {args.ref}")
    return ref


def real_check(args, frac, policy="st", ref=None) -> dict:
    """One real epoch against PyG full batch on the check graph (``auto``:
    the engine with its defaults, as the CLI builds it)."""
    data = check_graph(args)
    model = new_model(args)
    if ref is None:
        ref = (load_reference(args, model) if args.ref
               else pyg_reference(args, data, model, args.ref_adj))
    need = full_batch_vertex_bytes(model, data.num_nodes)
    kw = {} if policy == "auto" else {"cache": policy}
    t0 = time.perf_counter()
    eng = OffloadEngine(model, data, int(frac * need), args.parts,
                        cache_dir=args.cache_dir, **kw)
    t_plan = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    got = eng.train_step(ce_loss, data)
    t_eng = time.perf_counter() - t0
    errs = rel_errors([p.grad for p in model.parameters()], ref["grads"])
    err = max(errs)
    loss = float(ref["loss"])
    pieces = [ch.piece for ch in eng.sched.chunks if ch.piece is not None]
    c = eng.counters
    res = {"scale": args.check_scale, "nodes": data.num_nodes,
           "edges": int(data.edge_index.size(1)), "budget_fraction": frac,
           "need_bytes": need, "hidden": args.hidden,
           "cache": policy, "policy": eng.policy, "retain": eng.retain,
           "num_chunks": eng.num_chunks, "num_pieces": eng.sched.num_pieces,
           "hubs_split": len({p.node for p in pieces}),
           "loss_rel_err": abs(got - loss) / abs(loss),
           "grad_rel_err": err, "grad_rel_errs": errs, "dtype": "float32",
           "epoch_s": round(t_eng, 1), "plan_s": round(t_plan, 1),
           "pyg_s": ref["pyg_s"], "ref_adj": ref["adj"],
           "ref_peak_rss_bytes": ref.get("peak_rss_bytes"),
           "peak_device_bytes": c.peak_device_bytes,
           "traffic_bytes": c.h2d_bytes + c.d2h_bytes,
           "budget_bytes": eng.budget, "peak_rss_bytes": peak_rss_bytes(),
           "threads": torch.get_num_threads()}
    log(f"  real epoch ({policy} = {eng.policy}) at {frac:.2%}: "
        f"{eng.num_chunks} jobs/sweep "
        f"({eng.sched.num_pieces} pieces), loss rel err {res['loss_rel_err']:.1e}, "
        f"max gradient rel err {err:.1e} (float32), {t_eng:.1f} s "
        f"(PyG full batch {ref['pyg_s']} s), device peak "
        f"{c.peak_device_bytes / MiB:,.1f} of {eng.budget / MiB:,.1f} MiB, "
        f"process peak {res['peak_rss_bytes'] / MiB:,.0f} MiB")
    return res


def markdown(res: dict) -> str:
    cfg = res["config"]
    lines = []
    if res["graphs"]:
        lines += [
            f"3-layer {cfg['model'].upper()} (hidden {cfg['hidden']}, float32), "
            f"{cfg['parts']} METIS parts, R-MAT a=0.57 b=c=0.19 (edge factor "
            f"{cfg['edge_factor']}, symmetrised, deduplicated); budget a fraction "
            "of the full-batch need; epochs replayed in counting mode. Target: "
            "every policy plans and its epoch runs (before edge splits, "
            "`lru`/`degree`/`st` stopped with `BudgetError` at 25% on 2^18).", "",
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
    if res.get("checks"):
        adj = {c.get("ref_adj", "edge_index") for c in res["checks"]}
        lines += [
            "" if lines else None,
            f"Real epochs (3-layer {cfg['model'].upper()}, hidden "
            f"{cfg['hidden']}, float32, {cfg['parts']} METIS parts) against PyG "
            "full batch"
            + (" on a `torch.sparse_csr` adjacency (PyG's `adj_t` path)"
               if adj == {"csr"} else "")
            + ": loss and every parameter gradient; error = max |offload - PyG| "
            "/ max |PyG| per tensor, largest over the tensors.", "",
            "| graph | budget (of need) | policy | jobs/sweep | hub pieces (hubs) "
            "| loss rel. error | max grad rel. error | target | epoch | PyG full "
            "batch | device peak / budget |",
            "|---|---|---|---:|---|---:|---:|---|---:|---:|---|"]
        lines = [x for x in lines if x is not None]
    for c in res.get("checks", []):
        pol = c.get("cache", "st")
        pol = pol if c.get("policy", pol) == pol else f"{pol} = {c['policy']}"
        err = c["grad_rel_err"]
        peak = ""
        if "peak_device_bytes" in c:
            under = c["peak_device_bytes"] <= c["budget_bytes"]
            peak = (f"{c['peak_device_bytes'] / MiB:,.1f} / "
                    f"{c['budget_bytes'] / MiB:,.1f} MiB "
                    f"({'under' if under else '**over**'})")
        hubs = c.get("hubs_split")
        lines.append(
            f"| R-MAT 2^{c['scale']} ({c['nodes']:,} n, {c['edges'] / 1e6:.1f}M e) | "
            f"{c['budget_fraction']:.2%} | `{pol}` | {c['num_chunks']} | "
            f"{c['num_pieces']}" + (f" ({hubs})" if hubs is not None else "")
            + f" | {c['loss_rel_err']:.1e} | **{err:.1e}** | <= 1e-5: "
            f"{'met' if err <= 1e-5 and c['loss_rel_err'] <= 1e-5 else 'MISSED'} | "
            f"{c['epoch_s']} s | {c['pyg_s']} s | {peak} |")
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
    ap.add_argument("--ref", default=None,
                    help="file of the PyG reference: written by --ref-only, "
                         "read by the real epochs")
    ap.add_argument("--ref-only", action="store_true",
                    help="compute the check graph's PyG reference, save it to "
                         "--ref, run no offload epoch")
    ap.add_argument("--ref-adj", default="edge_index", choices=["edge_index", "csr"],
                    help="adjacency the PyG reference runs on (csr: "
                         "torch.sparse_csr adj_t, no [E, C] messages)")
    ap.add_argument("--ref-compare", action="store_true",
                    help="with --ref-only: also run the other adjacency and "
                         "report how far the two PyG references differ")
    ap.add_argument("--append", action="store_true",
                    help="merge into --out's existing checks (replacing the same "
                         "scale/fraction/policy) instead of starting afresh")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None,
                    help="default: results/offload_hubs.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or str(results_path("offload_hubs.json"))
    if args.ref_only:
        if not args.ref or not args.check_scale:
            ap.error("--ref-only needs --ref FILE and --check-scale")
        ref = make_reference(args)
        print(json.dumps({"pyg_s": ref["pyg_s"], "adj": ref["adj"],
                          "peak_rss_bytes": ref["peak_rss_bytes"],
                          "compare": ref.get("compare")}))
        return ref
    res = {"config": {"model": args.model, "hidden": args.hidden, "parts": args.parts,
                      "edge_factor": args.edge_factor, "seed": args.seed,
                      "threads": args.threads, "torch": torch.__version__,
                      "command": "python benchmarks/offload_hubs.py "
                                 + " ".join(sys.argv[1:] if argv is None else argv)},
           "graphs": [], "checks": []}
    if args.append and Path(out).is_file():
        old = json.loads(Path(out).read_text())
        res["graphs"] = old.get("graphs", [])
        res["checks"] = old.get("checks", [])
        res["config"]["command"] = (old["config"]["command"] + "; "
                                    + res["config"]["command"])
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
                try:
                    c = real_check(args, frac, pol)
                except (ValueError, FileNotFoundError) as e:
                    ap.exit(2, f"offload_hubs.py: {e}\n")
                res["checks"] = [o for o in res["checks"] if (
                    o["scale"], o["budget_fraction"], o.get("cache")) != (
                    c["scale"], frac, pol)] + [c]
                write_json(out, res)
    write_json(out, res)
    md = markdown(res)
    print(md)
    log(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()
