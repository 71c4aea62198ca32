"""DAG models on the circuit tasks: DAGNN through the Trainer, COP beside it.

1. **quality**: :class:`leangnn.nn.dag.DAGNN` trained through the one training
   loop (:class:`leangnn.train.Trainer`, ``--strategy full``, in memory) on
   the default split's training circuits and tested on circuits it never saw:
   the default split's test circuits (``leangnn.circuits.DEFAULT_SPLIT``) and
   a second split whose test circuits are the ITC-99 ones. Per task
   (``arrival``, ``signal_prob``, ``critical``), ``--seeds`` seeds, mean +- std
   of the pooled test metrics and of each test circuit's; for ``signal_prob``
   the analytic COP baseline (:func:`leangnn.circuits.cop.cop_signal_probability`)
   on the same nodes.
2. **deep**: one training step (= one epoch on one circuit: forward, backward,
   Adam) on ``itc99/b19`` (124k nodes, depth 114) and ``epfl/div`` (depth
   8,685) for DAGNN and an 8-layer ResGNN of the same width, each in a fresh
   subprocess (:func:`leangnn.profile.measure_in_subprocess`): step time, peak
   RSS above the loaded state, bytes saved for backward; and ResGNN's saved
   bytes per layer, i.e. what a ResGNN as deep as the circuit would keep.

    python benchmarks/circuit_models.py                    # everything
    python benchmarks/circuit_models.py --quick            # arrival, 1 seed
    python benchmarks/circuit_models.py --parts deep

Writes ``results/circuit_models.json`` and the ``circuit_models`` section of
``benchmarks/README.md`` (``results/quick/`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import markdown_path, results_path, write_json, write_section  # noqa: E402

SPLITS = {
    "default": None,  # leangnn.circuits.DEFAULT_SPLIT
    "itc99": {"test": ["itc99/b17", "itc99/b18", "itc99/b19", "itc99/b20",
                       "itc99/b22"]},
}
#: DAGNN options per task (beyond hidden / layers); see the report section.
TASK_OPTIONS = {
    "arrival": {"aggr": "max", "reverse": True, "rounds": 1},
    "signal_prob": {"aggr": "max", "reverse": False, "rounds": 1,
                    "learn_products": False},
    "critical": {"aggr": "max", "reverse": True, "rounds": 1,
                 "quantiles": (0.25, 0.5, 0.75), "product_channels": 0},
}
#: training options per task (hidden, lr) where they differ from the CLI's
TASK_TRAIN = {"critical": {"hidden_channels": 8, "lr": 1e-2, "epochs": 60}}
TARGETS = {"arrival": "pearson >= 0.99 and r2 >= 0.97",
           "critical": "accuracy >= 0.90",
           "signal_prob": "beats COP on every test circuit (MAE and pearson), "
                          "mean MAE <= 0.02"}


def _splits(split: str, task: str):
    from leangnn.circuits import DEFAULT_SPLIT, TASKS, load_suite
    from leangnn.data import GraphSplits

    names = dict(DEFAULT_SPLIT)
    names.update(SPLITS[split] or {})
    graphs = {k: load_suite(v, task) for k, v in names.items()}
    ttype = TASKS[task]
    return GraphSplits(graphs["train"], graphs["val"], graphs["test"], ttype,
                       4 if ttype == "classification" else 1)


def _cop(names: list[str]) -> dict[str, np.ndarray]:
    from leangnn.circuits import read_netlist, resolve
    from leangnn.circuits.cop import cop_signal_probability

    return {n: cop_signal_probability(read_netlist(resolve(n)[0].path))
            for n in names}


def _ensure_registered() -> bool:
    """Register ``dag`` for this process if the registry does not have it yet."""
    from leangnn.nn.models import MODELS, register_model

    if "dag" in MODELS:
        return True
    register_model("dag", "leangnn.nn.dag:DAGNN",
                   description="topological-order DAG model (DAGNN / DeepGate)")
    return False


def train_one(task: str, split: str, seed: int, args, splits, cop) -> dict:
    from leangnn.config import TrainConfig
    from leangnn.metrics import compute_metrics
    from leangnn.nn.dag import DAGNN
    from leangnn.train import Trainer, evaluate_graphs

    hp = {"hidden_channels": args.hidden, "num_layers": args.layers, "lr": args.lr,
          "epochs": args.epochs, **TASK_TRAIN.get(task, {})}
    cfg = TrainConfig(task=task, strategy="full", model="dag", seed=seed,
                      patience=args.patience, device=args.device, **hp)
    trainer = Trainer(cfg, splits=splits, progress=False, record=False)
    # TrainConfig carries no DAG options yet: rebuild the model with the
    # task's options, from the same seed, and its optimizer.
    torch.manual_seed(seed)
    opts = TASK_OPTIONS[task]
    trainer.model = DAGNN(splits.in_channels, cfg.hidden_channels,
                          splits.out_channels, cfg.num_layers, dropout=cfg.dropout,
                          **opts).to(trainer.device)
    trainer.optimizer = torch.optim.Adam(trainer.model.parameters(), lr=cfg.lr,
                                         weight_decay=cfg.weight_decay)
    t0 = time.perf_counter()
    summary = trainer.fit()
    wall = time.perf_counter() - t0
    per = {}
    for g in splits.test:
        m = evaluate_graphs(trainer.model, trainer.strategy, [g], trainer.loss_fn,
                            splits.task_type)
        row = {k: m[k] for k in ("pearson", "r2", "mae", "accuracy") if k in m}
        if task == "signal_prob":
            c = compute_metrics(torch.as_tensor(cop[g.name]), g.y.double(),
                                "regression")
            row.update(cop_mae=c["mae"], cop_pearson=c["pearson"])
        per[g.name] = row
    test = summary["metrics"]["test"]
    return {"task": task, "split": split, "seed": seed, **hp,
            "options": {k: list(v) if isinstance(v, tuple) else v
                        for k, v in opts.items()},
            "epochs_run": summary["epochs_run"],
            "epoch_seconds_median": summary["time"]["epoch_seconds_median"],
            "wall_seconds": wall, "test": {k: test[k] for k in (
                "pearson", "r2", "mae", "accuracy") if test.get(k) is not None},
            "per_circuit": per}


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}


def aggregate(runs: list[dict]) -> list[dict]:
    out = []
    for key in sorted({(r["task"], r["split"]) for r in runs}):
        rs = [r for r in runs if (r["task"], r["split"]) == key]
        agg = {"task": key[0], "split": key[1], "seeds": [r["seed"] for r in rs],
               "test": {k: _mean_std([r["test"][k] for r in rs])
                        for k in rs[0]["test"]},
               "per_circuit": {}, "options": rs[0]["options"],
               "training": {k: rs[0][k] for k in ("hidden_channels", "num_layers",
                                                   "lr", "epochs")},
               "epochs_run": [r["epochs_run"] for r in rs]}
        for c in rs[0]["per_circuit"]:
            agg["per_circuit"][c] = {k: _mean_std([r["per_circuit"][c][k] for r in rs])
                                     for k in rs[0]["per_circuit"][c]}
        agg["epoch_seconds_median"] = statistics.median(
            r["epoch_seconds_median"] for r in rs)
        out.append(agg)
    return out


# ---------------------------------------------------------------- deep part
def _deep_setup(kind, circuit, hidden, layers, threads, seed=0):
    from leangnn.circuits import load_circuit
    from leangnn.nn.dag import DAGNN
    from leangnn.nn.levels import level_plan
    from leangnn.nn.models import ResGNN

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    data = load_circuit(circuit, task="arrival")
    if kind == "dag":
        model = DAGNN(data.num_features, hidden, 1, layers, **TASK_OPTIONS["arrival"])
        t0 = time.perf_counter()
        level_plan(data.edge_index, data.num_nodes)  # once per graph, cached
        plan_s = time.perf_counter() - t0
    else:
        model = ResGNN(data.num_features, hidden, 1, layers)
        plan_s = 0.0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return {"model": model.train(), "opt": opt, "data": data, "plan_s": plan_s}


def _deep_run(state):
    from leangnn.profile import SavedTensorsMeter

    model, opt, data = state["model"], state["opt"], state["data"]
    times, saved = [], 0
    for step in range(2):
        t0 = time.perf_counter()
        with SavedTensorsMeter() as meter:
            out = model(data.x, data.edge_index)
            loss = torch.nn.functional.mse_loss(out.view(-1), data.y)
        if step == 0:
            saved = meter.bytes
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del out, loss
        times.append(time.perf_counter() - t0)
    return {"step_seconds": times, "saved_bytes": saved, "plan_s": state["plan_s"]}


def bench_deep(args, log) -> list[dict]:
    from leangnn.circuits import circuit_stats
    from leangnn.profile import measure_in_subprocess

    rows = []
    for circuit in args.deep_circuits:
        stats = circuit_stats(circuit)
        runs = [("dag", args.layers), ("res", 8), ("res", 4)]
        for kind, layers in runs:
            kw = dict(kind=kind, circuit=circuit, hidden=args.hidden, layers=layers,
                      threads=args.threads)
            result, mem = measure_in_subprocess(_deep_setup, _deep_run, kw,
                                                timeout=args.timeout)
            row = {"circuit": circuit, "nodes": stats["nodes"],
                   "depth": stats["depth"], "model": kind, "layers": layers,
                   "hidden": args.hidden, "peak_bytes": mem["peak_bytes"],
                   "method": mem["method"], **result}
            step = min(result["step_seconds"])
            log(f"deep {circuit} {kind}-{layers}: step {step:.2f} s, peak "
                f"{mem['peak_bytes'] / 2**20:.0f} MiB, saved "
                f"{result['saved_bytes'] / 2**20:.0f} MiB")
            rows.append(row)
        res = {r["layers"]: r for r in rows if r["circuit"] == circuit
               and r["model"] == "res"}
        per_layer = (res[8]["saved_bytes"] - res[4]["saved_bytes"]) / 4
        for r in rows:
            if r["circuit"] == circuit and r["model"] == "dag":
                r["res_saved_per_layer"] = per_layer
                r["res_saved_at_depth"] = res[4]["saved_bytes"] + per_layer * (
                    stats["depth"] - 4)
    return rows


# ----------------------------------------------------------------- report
def _pm(d: dict, digits: int = 3) -> str:
    return f"{d['mean']:.{digits}f} ± {d['std']:.{digits}f}"


def markdown(result: dict) -> str:
    hp = result["hyperparameters"]
    lines = [
        "## DAG models on circuits (`benchmarks/circuit_models.py`)",
        "",
        "DAGNN (`leangnn.nn.dag`, propagation in topological order with max-plus "
        "timing and COP-style product channels) trained through the Trainer "
        f"(`--strategy full`, Adam, early stopping on validation loss with "
        f"patience {hp['patience']}), seeds {hp['seeds']}; mean ± std over seeds; "
        "test circuits never seen in training; one CPU thread. "
        f"`{result['command']}`.",
        "",
        "| task | split | pooled test | target | DAGNN options | training | "
        "s/epoch |",
        "|---|---|---|---|---|---|---:|",
    ]
    for a in result.get("quality", []):
        t = a["test"]
        keys = ["accuracy"] if a["task"] == "critical" else ["pearson", "r2", "mae"]
        opts = ", ".join(f"{k}={v}" for k, v in a["options"].items())
        tr = a["training"]
        lines.append(f"| {a['task']} | {a['split']} | "
                     + ", ".join(f"{k} {_pm(t[k])}" for k in keys if k in t)
                     + f" | {TARGETS[a['task']]} | {opts} | hidden "
                     f"{tr['hidden_channels']}, layers {tr['num_layers']}, lr "
                     f"{tr['lr']}, epochs {tr['epochs']} (ran {a['epochs_run']}) | "
                     f"{a['epoch_seconds_median']:.1f} |")
    for a in result.get("quality", []):
        lines += ["", f"**{a['task']}, {a['split']} split, per test circuit**", ""]
        cols = list(next(iter(a["per_circuit"].values())))
        lines.append("| circuit | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---:|" * len(cols))
        for c, row in a["per_circuit"].items():
            lines.append(f"| {c} | " + " | ".join(_pm(row[k]) for k in cols) + " |")
    deep = result.get("deep") or []
    if deep:
        lines += ["", "**Deep circuits**: one training step (forward, backward, "
                  "Adam; = one epoch on one circuit), fresh subprocess each, "
                  "CPU threads as given; peak RSS above the loaded state; ResGNN "
                  "at the circuit's depth is its measured per-layer saved bytes "
                  "times the depth.", "",
                  "| circuit | nodes | depth | model | step (s) | peak RSS (MiB) | "
                  "saved for backward (MiB) |", "|---|---:|---:|---|---:|---:|---:|"]
        for r in deep:
            name = "DAGNN" if r["model"] == "dag" else f"ResGNN-{r['layers']}"
            lines.append(
                f"| {r['circuit']} | {r['nodes']:,} | {r['depth']:,} | {name} | "
                f"{min(r['step_seconds']):.2f} | {r['peak_bytes'] / 2**20:.0f} | "
                f"{r['saved_bytes'] / 2**20:.0f} |")
            if "res_saved_at_depth" in r:
                lines.append(
                    f"| {r['circuit']} | | | ResGNN-{r['depth']} (extrapolated) | | "
                    f"| {r['res_saved_at_depth'] / 2**20:,.0f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="*", default=["quality", "deep"],
                    choices=["quality", "deep"])
    ap.add_argument("--tasks", nargs="*", default=list(TASK_OPTIONS),
                    choices=list(TASK_OPTIONS))
    ap.add_argument("--splits", nargs="*", default=list(SPLITS), choices=list(SPLITS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--patience", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--deep-circuits", nargs="*", default=["itc99/b19", "epfl/div"])
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--quick", action="store_true",
                    help="arrival on the default split, one seed, 15 epochs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--render", action="store_true",
                    help="only re-render the README section from --out")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.splits, args.seeds = ["arrival"], ["default"], [0]
        args.epochs, args.parts = 15, ["quality"]
    args.out = args.out or str(results_path("circuit_models.json", args.quick))
    md_path = markdown_path("circuit_models", args.quick)
    if args.render:
        result = json.loads(Path(args.out).read_text())
        result["quality"] = aggregate(result.get("runs", []))
        write_section("circuit_models", markdown(result), md_path)
        return result
    torch.set_num_threads(args.threads)
    registered = _ensure_registered()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    prev = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    runs = []
    if "quality" in args.parts:
        for task in args.tasks:
            for split in args.splits:
                splits = _splits(split, task)
                cop = _cop([g.name for g in splits.test]) \
                    if task == "signal_prob" else {}
                for seed in args.seeds:
                    r = train_one(task, split, seed, args, splits, cop)
                    log(f"{task} {split} seed {seed}: {r['test']} "
                        f"({r['epochs_run']} epochs, {r['wall_seconds']:.0f} s)")
                    runs.append(r)
    done = {(r["task"], r["split"]) for r in runs}
    kept = [r for r in prev.get("runs", []) if (r["task"], r["split"]) not in done]
    cmd = "python benchmarks/circuit_models.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    result = {
        "command": cmd.strip(),
        "hyperparameters": {"hidden": args.hidden, "layers": args.layers,
                            "lr": args.lr, "epochs": args.epochs,
                            "patience": args.patience, "seeds": args.seeds,
                            "task_options": {k: {a: list(b) if isinstance(b, tuple)
                                                 else b for a, b in v.items()}
                                             for k, v in TASK_OPTIONS.items()},
                            "task_training": TASK_TRAIN},
        "dag_registered_by_library": registered,
        # a rerun of some tasks / splits keeps the others' earlier results
        "quality": aggregate(kept + runs),
        "runs": kept + runs,
        "deep": bench_deep(args, log) if "deep" in args.parts
        else prev.get("deep", []),
    }
    write_json(args.out, result)
    md = markdown(result)
    write_section("circuit_models", md, md_path)
    print(md)
    return result


if __name__ == "__main__":
    main()
