"""The planner from Python on a user's own PyG models: estimate vs measured.

    python benchmarks/plan_user.py [--repeat 3]   # results/plan_user.json + section
    python benchmarks/plan_user.py --quick        # 3 rows, 1 process each

Each row builds a model (PyG ``BasicGNN`` models with options our registry
does not use, PyG convs in a ``Sequential``, our deep models) and a graph,
then calls ``leangnn.fit(model, data, strategy=S, memory_budget="16GiB",
epochs=3)`` (``S``: ``full``, or ``prune`` for the ``-core`` rows: DPR's
largest core) in a fresh interpreter (glibc's default heap, one intra-op
thread), ``--repeat`` times. The row compares the plan's run estimate
(``row.estimate.run_bytes``: the step, allocator overhead included) with the
median of the processes' measured peaks (``fit``'s ``memory.peak_bytes``,
the loop's resident growth above the loaded model and graph). ``as own`` is
the estimate the same trace gets as a model without a calibrated family
(the largest heap factor measured, which is what every user model got
before :func:`leangnn.plan.families.calibrated_as`). Estimates use this
machine's calibration. Memory only: no timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _report import merge_rows, results_path, write_json, write_section  # noqa: E402

#: name -> (graph, strategy, model expression; ``i``, ``c`` and ``deg`` in scope)
ROWS = {
    "csbm20k-GCN-3": ("csbm", "full", "GCN(i, 64, 3, c)"),
    "csbm20k-GraphSAGE-2": ("csbm", "full", "GraphSAGE(i, 64, 2, c)"),
    "csbm20k-GAT-2": ("csbm", "full", "GAT(i, 32, 2, c)"),
    "csbm20k-GCN-3-batchnorm": ("csbm", "full", "GCN(i, 64, 3, c, norm='batch_norm')"),
    "csbm20k-GraphSAGE-3-max": ("csbm", "full", "GraphSAGE(i, 64, 3, c, aggr='max')"),
    "csbm20k-GATv2-2-heads4": ("csbm", "full", "GAT(i, 32, 2, c, v2=True, heads=4)"),
    "csbm20k-GAT-2-jkcat": ("csbm", "full", "GAT(i, 32, 2, c, jk='cat')"),
    "csbm20k-ResGNN-8-gcn": ("csbm", "full", "ResGNN(i, 32, c, 8, conv='gcn')"),
    "csbm20k-GSRGNN-16": ("csbm", "reversible", "GSRGNN(i, 32, c, 16, num_groups=2)"),
    "b19-GraphSAGE-3": ("b19", "full", "GraphSAGE(i, 64, 3, c)"),
    "b19-GAT-2-dropout": ("b19", "full", "GAT(i, 32, 2, c, dropout=0.2)"),
    "b19-ResGNN-4-sage": ("b19", "full", "ResGNN(i, 32, c, 4, conv='sage')"),
    # no calibrated family: the largest heap factor, over on purpose
    "csbm20k-GIN-3": ("csbm", "full", "GIN(i, 64, 3, c)"),
    "csbm20k-PNA-2": ("csbm", "full", "PNA(i, 32, 2, c, aggregators=['mean', 'max', "
                      "'std'], scalers=['identity', 'amplification'], deg=deg)"),
    "csbm20k-EdgeCNN-2": ("csbm", "full", "EdgeCNN(i, 32, 2, c)"),
    "csbm20k-Transformer-2": (
        "csbm", "full", "Sequential('x, edge_index', [(TransformerConv(i, 32, "
        "heads=2), 'x, edge_index -> x'), ReLU(), (TransformerConv(64, c), "
        "'x, edge_index -> x')])"),
    # DPR's core (fit(strategy="prune"): the largest core, r = 0.5): the
    # registered class on the core's CSR, the others on the core as an edge
    # list (they cannot take the CSR's int32 indices)
    "csbm20k-GraphSAGE-2-core": ("csbm", "prune", "GraphSAGE(i, 64, 2, c)"),
    "csbm20k-PNA-2-core": ("csbm", "prune", "PNA(i, 32, 2, c, aggregators=['mean', "
                           "'max', 'std'], scalers=['identity', 'amplification'], "
                           "deg=deg)"),
    "csbm20k-EdgeCNN-2-core": ("csbm", "prune", "EdgeCNN(i, 32, 2, c)"),
    "csbm20k-Transformer-2-core": (
        "csbm", "prune", "Sequential('x, edge_index', [(TransformerConv(i, 32, "
        "heads=2), 'x, edge_index -> x'), ReLU(), (TransformerConv(64, c), "
        "'x, edge_index -> x')])"),
    # a user's class wrapping one registered model: its family's factor
    # (:func:`leangnn.plan.families.calibrated_as`); ``as own`` is the largest
    "csbm20k-Head-GCN-3": ("csbm", "full", "Head(GCN(i, 64, 3, 64), 64, c)"),
    "csbm20k-Head-GraphSAGE-3": ("csbm", "full",
                                 "Head(GraphSAGE(i, 64, 3, 64), 64, c)"),
    "csbm20k-Head-GAT-2": ("csbm", "full", "Head(GAT(i, 16, 2, 64, heads=4), 64, c)"),
    "csbm20k-TwoTower-GraphSAGE-2": ("csbm", "full", "TwoTower(i, c)"),
    "csbm20k-Head-GraphSAGE-3-core": ("csbm", "prune",
                                      "Head(GraphSAGE(i, 64, 3, 64), 64, c)"),
    # a user's residual stack of PyG convs of one family's kind: its factor
    "csbm20k-SAGEConv-stack-8": ("csbm", "full",
                                 "ConvStack(lambda w: SAGEConv(w, w), i, 64, c, 8)"),
    "csbm20k-SAGEConv-stack-8-ckpt": (
        "csbm", "full", "ConvStack(lambda w: SAGEConv(w, w), i, 64, c, 8, True)"),
    "csbm20k-GCNConv-stack-4": ("csbm", "full",
                                "ConvStack(lambda w: GCNConv(w, w), i, 64, c, 4)"),
    "csbm20k-GATConv-stack-3": (
        "csbm", "full",
        "ConvStack(lambda w: GATConv(w, w // 4, heads=4), i, 64, c, 3)"),
}
#: the rows of wrapper classes and conv stacks (their own summary line)
WRAPPERS = {n for n in ROWS if "Head-" in n or "TwoTower" in n or "-stack-" in n}
QUICK = ["csbm20k-GAT-2", "csbm20k-GraphSAGE-3-max", "csbm20k-GIN-3"]

_CHILD = r"""
import json, sys
import torch
torch.set_num_threads(1)
from torch.nn import ReLU
from torch_geometric.nn import (GAT, GCN, GIN, PNA, EdgeCNN, GATConv, GCNConv,
                                GraphSAGE, SAGEConv, Sequential, TransformerConv)
from torch_geometric.utils import degree
import leangnn
from leangnn.nn.models import GSRGNN, ResGNN
from torch_geometric.nn import MLP


class Head(torch.nn.Module):  # a GNN under a linear head
    def __init__(self, gnn, width, c):
        super().__init__()
        self.gnn, self.head = gnn, torch.nn.Linear(width, c)

    def forward(self, x, edge_index):
        return self.head(self.gnn(x, edge_index).relu())


class ConvStack(torch.nn.Module):  # residual convs, checkpointed or not
    def __init__(self, make, i, w, c, layers, ckpt=False):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(i, w), torch.nn.Linear(w, c)
        self.ckpt = ckpt
        self.convs = torch.nn.ModuleList(make(w) for _ in range(layers))

    def forward(self, x, edge_index):
        from torch.utils.checkpoint import checkpoint

        h = self.inp(x)
        for conv in self.convs:
            f = lambda a, e, conv=conv: conv(a, e).relu()  # noqa: E731
            h = h + (checkpoint(f, h, edge_index, use_reentrant=False) if self.ckpt
                     else f(h, edge_index))
        return self.out(h)


class TwoTower(torch.nn.Module):  # a GNN beside an MLP on the raw features
    def __init__(self, i, c):
        super().__init__()
        self.gnn, self.mlp = GraphSAGE(i, 64, 2, 64), MLP([i, 64, 64])
        self.out = torch.nn.Linear(128, c)

    def forward(self, x, edge_index):
        return self.out(torch.cat([self.gnn(x, edge_index), self.mlp(x)], -1))


from leangnn.plan.calibration import heap_families, load_calibration
graph, strategy, expr = json.loads(sys.argv[1])
if graph == "csbm":
    from leangnn.data import with_mask
    from leangnn.graphs.synthetic import contextual_sbm
    data = contextual_sbm(20000, avg_degree=8.0, in_channels=32, seed=1)
    data = with_mask(data, data.train_mask)
    c = int(data.y.max()) + 1
else:
    from leangnn.circuits import load_circuit
    data = load_circuit("itc99/b19", "arrival")
    c = 1
i = data.num_features
deg = torch.bincount(degree(data.edge_index[1], data.num_nodes, dtype=torch.long))
torch.manual_seed(0)
model = eval(expr)
out = leangnn.fit(model, data, strategy=strategy, memory_budget="16GiB", epochs=3)
est = out["row"].estimate
cal = load_calibration(torch.device("cpu"))
own = est.step_bytes + cal.overhead(est.step_bytes, est.big_bytes, est.heap_bytes, [],
                                    est.floor_bytes, est.heap_edge_share)
print(json.dumps({"run_bytes": est.run_bytes, "as_own_bytes": own,
                  "measured_bytes": out["memory"]["peak_bytes"],
                  "family": est.knobs.get("family"),
                  "families": heap_families(est.strategy, est.knobs),
                  "factor": cal.heap_factor(heap_families(est.strategy, est.knobs),
                                            est.heap_edge_share),
                  "step_bytes": est.step_bytes, "label": out["row"].label}))
"""


def run_row(name: str, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(ROWS[name])],
                           capture_output=True, text=True, timeout=900, cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            last = (p.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"{name}: {last}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    meas = statistics.median(r["measured_bytes"] for r in runs)
    first = runs[0]
    return {"name": name, "model": ROWS[name][2], "strategy": ROWS[name][1],
            "family": first["family"], "factor": first["factor"],
            "run_bytes": first["run_bytes"], "as_own_bytes": first["as_own_bytes"],
            "measured_bytes": meas,
            "measured_all": [r["measured_bytes"] for r in runs],
            "rel_error": (first["run_bytes"] - meas) / meas,
            "as_own_rel_error": (first["as_own_bytes"] - meas) / meas}


def markdown(rows: list[dict], repeat: int) -> str:
    mib = 1 << 20
    out = [f"Command: `python benchmarks/plan_user.py --repeat {repeat}` (medians of "
           f"{repeat} fresh processes; `leangnn.fit(..., epochs=3)`, one thread).", "",
           "| row | family | estimate | measured | error | as own model |",
           "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['name']} | {r['family'] or '-'} | "
                   f"{r['run_bytes'] / mib:.1f} MiB | "
                   f"{r['measured_bytes'] / mib:.1f} MiB "
                   f"| {r['rel_error']:+.1%} | {r['as_own_rel_error']:+.1%} |")
    fam = [abs(r["rel_error"]) for r in rows
           if r["family"] and r["name"] not in WRAPPERS]
    own = [abs(r["rel_error"]) for r in rows if not r["family"]]
    wrap = [r for r in rows if r["name"] in WRAPPERS]
    if fam:
        was = statistics.median(abs(r["as_own_rel_error"]) for r in rows
                                if r["family"] and r["name"] not in WRAPPERS)
        out += ["", f"Registered classes ({len(fam)} rows): median |error| "
                f"{statistics.median(fam):.1%}, worst {max(fam):.1%} (as own models: "
                f"median {was:.1%})."]
    if wrap:
        out += [f"Wrappers of one registered model and conv stacks of one family "
                f"({len(wrap)} rows, the family's "
                f"factor): error {min(r['rel_error'] for r in wrap):+.1%} to "
                f"{max(r['rel_error'] for r in wrap):+.1%} (with the largest factor "
                f"{min(r['as_own_rel_error'] for r in wrap):+.1%} to "
                f"{max(r['as_own_rel_error'] for r in wrap):+.1%})."]
    if own:
        out += [f"Other classes ({len(own)} rows, the largest factor on purpose): "
                f"median {statistics.median(own):.1%}, worst {max(own):.1%}."]
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", nargs="*", default=None, choices=sorted(ROWS))
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat: expected >= 1, got {args.repeat}")
    names = args.rows or (QUICK if args.quick else list(ROWS))
    repeat = 1 if args.quick else args.repeat
    rows = []
    for n in names:
        rows.append(run_row(n, repeat))
        r = rows[-1]
        print(f"{n}: estimate {r['run_bytes'] / 2**20:.1f} MiB, measured "
              f"{r['measured_bytes'] / 2**20:.1f} MiB ({r['rel_error']:+.1%}; as own "
              f"{r['as_own_rel_error']:+.1%})", flush=True)
    path = results_path("plan_user.json", args.quick)
    if args.rows:  # the other rows as stored, in ROWS' order
        kept = {r["name"]: r for r in merge_rows(path, rows) + rows}
        rows = [kept[n] for n in ROWS if n in kept]
    write_json(path, {"rows": rows})
    md = markdown(rows, repeat)
    if args.quick:
        results_path("plan_user.md", True).write_text(md)
    else:
        write_section("plan-user", md)
    fam = [abs(r["rel_error"]) for r in rows if r["family"]]
    print(f"{len(rows)} rows; registered classes median |error| "
          f"{statistics.median(fam) if fam else float('nan'):.1%}")


if __name__ == "__main__":
    main()
