"""Circuit models side by side: DAGNN, generic deep GNNs, analytic baselines.

1. **quality**: every learned model trained through the one training loop
   (``leangnn.train.Trainer(TrainConfig(...), record=False)``: the loop and
   the shared loss of ``leangnn train``) on the default split's training
   circuits and tested on circuits it never saw: the default split's test
   circuits (``leangnn.circuits.DEFAULT_SPLIT``) and a second split whose
   test circuits are the ITC-99 ones. Models (:data:`MODELS`): ``dag`` exactly
   as ``leangnn train --task X`` builds it (registry sizes,
   ``DAGNN.TASK_DEFAULTS``), ``dag-pure`` (signal probability without the COP
   input), ResGNN 8 / 64, GSR 128 (reversible), PyG GraphSAGE 4. Per task,
   ``--seeds`` seeds, mean +- std of the pooled test metrics and of each test
   circuit's; for ``signal_prob`` two analytic rows on the same nodes: COP
   (:func:`leangnn.circuits.cop.cop_signal_probability`) and the cut estimate
   (:func:`leangnn.circuits.sigprob.cut_signal_probability`: exact over a
   cut of 8 to 12 leaves of each node's cone, leaves independent; what
   ``dag`` starts from).
2. **deep**: one training step (= one epoch on one circuit: forward, backward,
   Adam) on ``itc99/b19`` (124k nodes, depth 114) and ``epfl/div`` (depth
   8,685) for DAGNN (arrival) and an 8-layer ResGNN of the same width, each in
   a fresh subprocess (:func:`leangnn.profile.measure_in_subprocess`): step
   time, peak RSS above the loaded state, bytes saved for backward; and
   ResGNN's saved bytes per layer, i.e. what a ResGNN as deep as the circuit
   would keep.

    python benchmarks/circuit_models.py                    # everything
    python benchmarks/circuit_models.py --quick            # arrival, 1 seed
    python benchmarks/circuit_models.py --parts quality --tasks critical \\
        --models dag res-8
    python benchmarks/circuit_models.py --parts deep
    # both splits from one training per seed, into a partial file; then
    # add its seeds to the rows of results/circuit_models.json
    python benchmarks/circuit_models.py --parts quality --tasks arrival \
        --splits default itc99 --share-training --models gsr-128 --seeds 1 \
        --no-readme --out results/part.json
    python benchmarks/circuit_models.py --render --add-seeds --merge \
        results/part.json

Writes ``results/circuit_models.json`` (a rerun of some tasks / splits /
models keeps the others' runs) and the ``circuit_models`` section of
``benchmarks/README.md`` (``results/quick/`` with ``--quick``; printed only
with ``--no-readme``).
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
#: The models of the table: name -> (TrainConfig fields, extra DAGNN options
#: beyond what TrainConfig carries, tasks). ``dag`` is exactly ``leangnn train
#: --task X``: the registry's sizes and the task's ``DAGNN.TASK_DEFAULTS``.
#: The generic GNNs use the registry's width (64); the deep ones fewer epochs.
MODELS = {
    "dag": ({"model": "dag"}, {}, None),
    # critical at the size and rate it needs (the CLI's defaults are per model,
    # not per task: `leangnn train --task critical --hidden 8 --lr 1e-3`)
    "dag-h8": ({"model": "dag", "hidden_channels": 8, "lr": 1e-3}, {},
               ("critical",)),
    "dag-pure": ({"model": "dag"}, {"cop_input": False, "product_channels": 0},
                 ("signal_prob",)),
    "res-8": ({"model": "res", "num_layers": 8}, {}, None),
    "res-64": ({"model": "res", "num_layers": 64, "epochs": 20}, {}, None),
    "gsr-128": ({"model": "gsr", "strategy": "reversible", "num_layers": 128,
                 "epochs": 15}, {}, None),
    "sage-4": ({"model": "sage", "num_layers": 4}, {}, None),
}
LABELS = {"dag": "DAGNN (leangnn train default)",
          "dag-h8": "DAGNN, hidden 8, lr 1e-3 (leangnn train --task critical)",
          "dag-pure": "DAGNN pure (no COP input)",
          # runs of the earlier session (COP start, trainable estimate weight,
          # no damping): kept in the results file under their own name
          "dag-cop-prev": "DAGNN from COP (previous default)",
          "dag-h32-prev": "DAGNN, --hidden 32 --lr 3e-3 (previous default)",
          "cop": "COP (analytic)", "cut": "cut estimate (analytic)",
          "res-8": "ResGNN 8",
          "res-64": "ResGNN 64", "gsr-128": "GSR 128 (reversible)",
          "sage-4": "PyG GraphSAGE 4"}
TARGETS = {"arrival": "pearson >= 0.99 and r2 >= 0.97",
           "critical": "accuracy >= 0.90",
           "signal_prob": "beats COP on every test circuit (MAE and pearson), "
                          "mean MAE <= 0.02"}
TASKS = ("arrival", "signal_prob", "critical")


def _splits(split: str, task: str):
    from leangnn.circuits import DEFAULT_SPLIT, TASKS, load_suite
    from leangnn.data import GraphSplits

    names = dict(DEFAULT_SPLIT)
    names.update(SPLITS[split] or {})
    graphs = {k: load_suite(v, task) for k, v in names.items()}
    ttype = TASKS[task]
    return GraphSplits(graphs["train"], graphs["val"], graphs["test"], ttype,
                       4 if ttype == "classification" else 1)


#: the analytic rows of ``signal_prob``: name -> estimator of a Netlist
def _estimators() -> dict:
    from leangnn.circuits.cop import cop_signal_probability
    from leangnn.circuits.sigprob import cut_signal_probability

    return {"cop": cop_signal_probability, "cut": cut_signal_probability}


def _analytic(names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Per estimator, per circuit: the estimate, and its wall seconds."""
    from leangnn.circuits import read_netlist, resolve

    out: dict = {}
    for est, fn in _estimators().items():
        out[est] = {}
        for n in names:
            net = read_netlist(resolve(n)[0].path)
            t0 = time.perf_counter()
            out[est][n] = (fn(net), time.perf_counter() - t0)
    return out


def _ensure_registered() -> bool:
    """Register ``dag`` for this process if the registry does not have it yet."""
    from leangnn.nn.models import MODELS as REGISTRY
    from leangnn.nn.models import register_model

    if "dag" in REGISTRY:
        return True
    register_model("dag", "leangnn.nn.dag:DAGNN", capabilities=("dag",),
                   description="topological-order DAG model (DAGNN / DeepGate)",
                   defaults={"num_layers": 2, "hidden_channels": 32, "epochs": 40})
    return False


def _metrics_row(m: dict) -> dict:
    return {k: m[k] for k in ("pearson", "r2", "mae", "accuracy")
            if m.get(k) is not None}


def train_one(task: str, split: str, model: str, seed: int, args, splits,
              also: dict | None = None) -> list[dict]:
    """One row: train through :class:`leangnn.train.Trainer` (``record=False``,
    the loop and loss of ``leangnn train``) and score every test circuit.

    ``also``: other splits (name -> GraphSplits) with the same training and
    validation circuits: the trained model is scored on their test circuits
    too (one record per split; the training is the one a run of that split
    would do, seed for seed)."""
    from leangnn.config import TrainConfig
    from leangnn.nn.models import build_model
    from leangnn.train import Trainer, evaluate_graphs

    fields, extra, _ = MODELS[model]
    fields = dict(fields)
    if args.epochs is not None:
        fields["epochs"] = min(args.epochs, fields.get("epochs", args.epochs))
    cfg = TrainConfig(task=task, seed=seed, patience=args.patience,
                      device=args.device, **fields)
    trainer = Trainer(cfg, splits=splits, progress=False, record=False)
    if extra:  # an option TrainConfig has no field for: same seed, same builder
        torch.manual_seed(seed)
        trainer.model = build_model(cfg.model, splits.in_channels,
                                    cfg.hidden_channels, splits.out_channels,
                                    cfg.num_layers, **cfg.model_options(),
                                    **extra).to(trainer.device)
        trainer.optimizer = torch.optim.Adam(trainer.model.parameters(), lr=cfg.lr,
                                             weight_decay=cfg.weight_decay)
    t0 = time.perf_counter()
    summary = trainer.fit()
    wall = time.perf_counter() - t0
    out = []
    for name, sp in {split: splits, **(also or {})}.items():
        test = (summary["metrics"]["test"] if sp is splits
                else trainer.evaluate(sp.test))
        per = {g.name: _metrics_row(evaluate_graphs(
            trainer.model, trainer.strategy, [g], trainer.loss_fn, sp.task_type))
            for g in sp.test}
        out.append({
            "task": task, "split": name, "model": model, "seed": seed,
            "training": {"hidden_channels": cfg.hidden_channels,
                         "num_layers": cfg.num_layers, "lr": cfg.lr,
                         "epochs": cfg.epochs, "strategy": cfg.strategy},
            "options": extra, "epochs_run": summary["epochs_run"],
            "epoch_seconds_median": summary["time"]["epoch_seconds_median"],
            "wall_seconds": wall, "test": _metrics_row(test), "per_circuit": per,
            **({"trained_with_split": split} if sp is not splits else {})})
    return out


def baseline_rows(task: str, split: str, splits) -> list[dict]:
    """The analytic rows: COP and the cut estimate for ``signal_prob`` (no
    training, one "seed"; ``wall_seconds``: computing it on the test circuits);
    for ``arrival`` / ``critical`` the label's own recursion (static timing),
    which scores perfectly by construction: a model's gap to it is 1 - its
    pearson / accuracy."""
    from leangnn.metrics import compute_metrics

    if task != "signal_prob":
        return []
    rows = []
    for est, res in _analytic([g.name for g in splits.test]).items():
        per = {g.name: _metrics_row(compute_metrics(
            torch.as_tensor(res[g.name][0]), g.y.double(), "regression"))
            for g in splits.test}
        pooled = _metrics_row(compute_metrics(
            torch.as_tensor(np.concatenate([res[g.name][0] for g in splits.test])),
            torch.cat([g.y.double() for g in splits.test]), "regression"))
        rows.append({"task": task, "split": split, "model": est, "seed": 0,
                     "training": None, "options": {}, "epochs_run": 0,
                     "epoch_seconds_median": 0.0,
                     "wall_seconds": sum(t for _, t in res.values()),
                     "seconds_per_circuit": {n: t for n, (_, t) in res.items()},
                     "test": pooled, "per_circuit": per})
    return rows


def _upgrade(run: dict) -> dict | None:
    """A run of the earlier layout (DAGNN only, no ``model`` key): arrival runs
    used today's ``dag`` settings and are kept; the others are dropped."""
    if "model" in run:
        tr = run.get("training") or {}
        if (run["model"], run["task"], tr.get("hidden_channels")) == (
                "dag", "critical", 32):
            # trained before the registry gave `dag` its per-task critical
            # sizes (hidden 8, lr 1e-3, = `dag-h8`): no longer what
            # `leangnn train --task critical` builds
            return {**run, "model": "dag-h32-prev"}
        return run
    if run["task"] != "arrival":
        return None
    keys = ("hidden_channels", "num_layers", "lr", "epochs")
    return {**{k: v for k, v in run.items() if k not in keys}, "model": "dag",
            "options": {}, "training": {**{k: run[k] for k in keys},
                                        "strategy": "full"}}


def _run_key(r: dict) -> tuple:
    return (r["task"], r["split"], r.get("model", "dag"), r["seed"])


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}


def aggregate(runs: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["task"], r["split"], r.get("model", "dag")) for r in runs})
    for key in keys:
        rs = [r for r in runs if (r["task"], r["split"], r.get("model", "dag")) == key]
        agg = {"task": key[0], "split": key[1], "model": key[2],
               "seeds": [r["seed"] for r in rs],
               "test": {k: _mean_std([r["test"][k] for r in rs])
                        for k in rs[0]["test"]},
               "per_circuit": {}, "options": rs[0]["options"],
               "training": rs[0]["training"],
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
        model = DAGNN(data.num_features, hidden, 1, layers, task="arrival")
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


_KEYS = {"arrival": ["pearson", "r2"], "critical": ["accuracy"],
         "signal_prob": ["mae", "pearson"]}
# signal_prob: the learned model and its analytic start differ in the 4th digit
_DIGITS = {"signal_prob": 4}


def _cell(a: dict | None, task: str) -> str:
    if a is None:
        return "not run"
    t, n = a["test"], len(a["seeds"])
    dg = _DIGITS.get(task, 3)
    fmt = (lambda d: _pm(d, dg)) if n > 1 else (lambda d: f"{d['mean']:.{dg}f}")
    return ", ".join(f"{k} {fmt(t[k])}" for k in _KEYS[task] if k in t) + \
        (f" (n={n})" if n != 3 and a["training"] is not None else "")


def markdown(result: dict) -> str:
    hp = result["hyperparameters"]
    quality = result.get("quality", [])
    lines = [
        "## Circuit models (`benchmarks/circuit_models.py`)",
        "",
        "Every learned row trained through `leangnn.train.Trainer(TrainConfig(...), "
        "record=False)` (the loop and loss of `leangnn train`; Adam, early "
        f"stopping on validation loss, patience {hp['patience']}), mean ± std "
        "over 3 seeds (n= where fewer ran) of the pooled test metrics; test "
        "circuits never seen in training (default split: c6288, c7552, epfl/max, "
        "epfl/sin; itc99 split: b17-b22); one CPU thread per run. `DAGNN` is "
        "`leangnn train --task X` with no other argument. Generic GNNs at the "
        "registry width (64); ResGNN 64 and GSR 128 trained for fewer epochs "
        "(column 'epochs'). COP and the cut estimate: analytic, no training "
        "and no simulation (the cut estimate is exact over a cut of up to k "
        "leaves of each node's fanin cone, k = 8..12 by circuit size, with the "
        "leaves taken as independent: analytic propagation, where a cut whose "
        "leaves are primary inputs gives the exact local probability). For "
        "arrival / critical "
        "the label's own recursion (static timing) scores 1 by construction: "
        "the gap is 1 - the model's figure. The two splits share their "
        "training and validation circuits (only the test circuits differ), so "
        "seed s trains the same model for both columns (bit for bit; "
        "`--share-training` trains it once and scores both). "
        f"`{result['command']}`.",
        "",
        "| task | model | default split | itc99 split | epochs (ran) | "
        "s/epoch | target |",
        "|---|---|---|---|---|---:|---|",
    ]
    by = {(a["task"], a["split"], a["model"]): a for a in quality}
    for task in TASKS:
        extra = ["dag-h32-prev", "dag-cop-prev", "cut", "cop"]
        models = [m for m in list(MODELS) + extra
                  if any((task, s, m) in by for s in SPLITS)]
        for m in models:
            cells = [_cell(by.get((task, s, m)), task) for s in SPLITS]
            ref = next(by[(task, s, m)] for s in SPLITS if (task, s, m) in by)
            tr = ref["training"]
            ep = "-" if tr is None else f"{tr['epochs']} ({ref['epochs_run']})"
            sec = "-" if tr is None else f"{ref['epoch_seconds_median']:.1f}"
            lines.append(f"| {task} | {LABELS[m]} | " + " | ".join(cells)
                         + f" | {ep} | {sec} | {TARGETS[task]} |")
    for (task, split, m), a in by.items():
        if m not in ("dag", "dag-h8") or task == "arrival":
            continue
        cop = by.get((task, split, "cop"))
        # the other rows of this task beside the default, learned then analytic
        others = [(o, by[(task, split, o)]) for o in ("dag-cop-prev", "dag-pure",
                                                        "cut", "cop")
                  if (task, split, o) in by]
        short = {"dag-cop-prev": "from COP", "dag-pure": "pure", "cut": "cut",
                 "cop": "COP"}
        lines += ["", f"**{task}, {split} split, per test circuit ({LABELS[m]}"
                  + "".join(f", {LABELS[o]}" for o, _ in others) + ")**", ""]
        keys = _KEYS[task]
        head = [f"DAGNN {k}" for k in keys]
        for o, _ in others:
            head += [f"{short[o]} {k}" for k in keys]
        if cop:
            head += ["beats COP"]
        cut = by.get((task, split, "cut"))
        if cut:
            head += ["beats cut"]
        lines.append("| circuit | " + " | ".join(head) + " |")
        lines.append("|---|" + "---:|" * len(head))
        dg = _DIGITS.get(task, 3)
        for c, row in a["per_circuit"].items():
            vals = [_pm(row[k], dg) for k in keys]
            for _, oa in others:
                r = oa["per_circuit"][c]
                vals += [_pm(r[k], dg) if oa["training"] is not None
                         else f"{r[k]['mean']:.{dg}f}" for k in keys]
            if cop:
                cr = cop["per_circuit"][c]
                beats = (row["mae"]["mean"] < cr["mae"]["mean"]
                         and row["pearson"]["mean"] > cr["pearson"]["mean"])
                vals.append("yes" if beats else "**no**")
            if cut:
                kr = cut["per_circuit"][c]
                beats = (row["mae"]["mean"] < kr["mae"]["mean"]
                         and row["pearson"]["mean"] > kr["pearson"]["mean"])
                vals.append("yes" if beats else "no")
            lines.append(f"| {c} | " + " | ".join(vals) + " |")
    deep = result.get("deep") or []
    if deep:
        lines += ["", "**Cost on deep circuits** (arrival model): one training step "
                  "(forward, backward, Adam; = one epoch on one circuit), fresh "
                  "subprocess each, CPU threads as given; peak RSS above the loaded "
                  "state; ResGNN at the circuit's depth is its measured per-layer "
                  "saved bytes times the depth.", "",
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


def cost_ab(circuit: str = "itc99/b19", rounds: int = 5, hidden: int = 32,
            layers: int = 2) -> dict:
    """DAGNN vs ResGNN-8 step cost side by side in one process (one thread,
    process CPU time, alternating rounds after a warm-up): the issue's cost
    ratio, with the same models as :func:`bench_deep`."""
    import statistics

    def step(state):
        m, o, d = state["model"], state["opt"], state["data"]
        t0 = time.process_time()
        out = m(d.x, d.edge_index)
        loss = torch.nn.functional.mse_loss(out.view(-1), d.y)
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()
        return time.process_time() - t0

    dag = _deep_setup("dag", circuit, hidden, layers, 1)
    res = _deep_setup("res", circuit, hidden, 8, 1)
    step(dag), step(res)
    td, tr = [], []
    for _ in range(rounds):
        td.append(step(dag))
        tr.append(step(res))
    ratios = [a / b for a, b in zip(td, tr)]
    out = {"circuit": circuit, "dag_s": statistics.median(td),
           "res8_s": statistics.median(tr), "ratio": statistics.median(ratios),
           "ratios": ratios, "target": 3.0}
    print(f"{circuit}: DAGNN {out['dag_s']:.2f} s, ResGNN-8 {out['res8_s']:.2f} s "
          f"per step; ratio {out['ratio']:.2f} (target <= 3)")
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="*", default=["quality", "deep"],
                    choices=["quality", "deep"])
    ap.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--splits", nargs="*", default=list(SPLITS), choices=list(SPLITS))
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=None,
                    help="cap every row's epochs (default: each model's own)")
    ap.add_argument("--patience", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=32, help="deep part's width")
    ap.add_argument("--layers", type=int, default=2, help="deep part's DAGNN MLPs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--deep-circuits", nargs="*", default=["itc99/b19", "epfl/div"])
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--quick", action="store_true",
                    help="arrival on the default split, DAGNN, one seed, 15 epochs")
    ap.add_argument("--no-readme", action="store_true",
                    help="print the markdown; leave benchmarks/README.md alone")
    ap.add_argument("--out", default=None)
    ap.add_argument("--render", action="store_true",
                    help="only re-render the README section from --out")
    ap.add_argument("--merge", nargs="*", default=[],
                    help="with --render: first merge these results files' runs "
                         "(and their commands) into --out (runs in --out of the "
                         "same task, split and model are replaced)")
    ap.add_argument("--share-training", action="store_true",
                    help="train once per task, model and seed and score the "
                         "model on every --splits' test circuits (the splits "
                         "share training and validation circuits)")
    ap.add_argument("--add-seeds", action="store_true",
                    help="with --merge: a merged run replaces only the run of the "
                         "same task, split, model and seed in --out (add seeds to "
                         "a row instead of replacing the row)")
    ap.add_argument("--cost-ab", type=int, metavar="ROUNDS", default=0,
                    help="only the DAGNN / ResGNN-8 step-cost A/B on the first "
                         "--deep-circuits circuit, ROUNDS alternating rounds")
    args = ap.parse_args(argv)
    if args.cost_ab:
        return cost_ab(args.deep_circuits[0], args.cost_ab, args.hidden, args.layers)
    if args.quick:
        args.tasks, args.splits, args.seeds = ["arrival"], ["default"], [0]
        args.models, args.epochs, args.parts = ["dag"], 15, ["quality"]
    args.out = args.out or str(results_path("circuit_models.json", args.quick))
    md_path = markdown_path("circuit_models", args.quick)
    if args.render:
        result = json.loads(Path(args.out).read_text())
        runs = [r for r in map(_upgrade, result.get("runs", [])) if r is not None]
        cmds = [result.get("command", "")]
        merged = []
        for other in args.merge:
            extra = json.loads(Path(other).read_text())
            merged += extra.get("runs") or extra.get("runs_in_progress", [])
            cmds.append(extra.get("command", f"(partial run into {other})"))
        seen: set = set()  # e.g. the COP row every signal_prob file carries
        merged = [r for r in merged if not ((r["task"], r["split"], r["model"],
                                             r["seed"]) in seen or seen.add(
            (r["task"], r["split"], r["model"], r["seed"])))]
        # --add-seeds: a merged run replaces only its own seed, so seeds run
        # later (in other files) join the row's earlier seeds
        width = 4 if args.add_seeds else 3
        keys = {_run_key(r)[:width] for r in merged}
        runs = [r for r in runs if _run_key(r)[:width] not in keys] + merged
        if args.merge:
            result["runs"] = runs
            if isinstance(result.get("commands"), list):
                # the file keeps a list of every command that fed it
                result["commands"] += [c for c in cmds[1:] if c]
            else:
                result["command"] = " && ".join(c for c in cmds if c)
            result["hyperparameters"] = {
                **result.get("hyperparameters", {}), "patience": args.patience,
                "seeds": sorted({r["seed"] for r in runs})}
            write_json(args.out, result)
        result["quality"] = aggregate(runs)
        md = markdown(result)
        if not args.no_readme:
            write_section("circuit_models", md, md_path)
        print(md)
        return result
    torch.set_num_threads(args.threads)
    registered = _ensure_registered()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    prev = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    runs = []
    if "quality" in args.parts:
        for task in args.tasks:
            # --share-training: the splits differ only in their test circuits
            # (SPLITS override "test" only), so one training per seed serves
            # them all
            groups = ([args.splits] if args.share_training
                      else [[s] for s in args.splits])
            for group in groups:
                by_split = {s: _splits(s, task) for s in group}
                for split, splits in by_split.items():
                    runs += baseline_rows(task, split, splits)
                split, splits = group[0], by_split[group[0]]
                also = {s: by_split[s] for s in group[1:]}
                for model in args.models:
                    if MODELS[model][2] and task not in MODELS[model][2]:
                        continue
                    for seed in args.seeds:
                        for r in train_one(task, split, model, seed, args, splits,
                                           also):
                            log(f"{task} {r['split']} {model} seed {seed}: "
                                f"{r['test']} ({r['epochs_run']} epochs, "
                                f"{r['wall_seconds']:.0f} s)")
                            runs.append(r)
                        # partial results survive an interrupted run
                        write_json(args.out, {**prev, "runs_in_progress": runs})
    done = {(r["task"], r["split"], r["model"]) for r in runs}
    kept = [r for r in map(_upgrade, prev.get("runs", [])) if r is not None
            and (r["task"], r["split"], r["model"]) not in done]
    cmd = "python benchmarks/circuit_models.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    result = {
        "command": cmd.strip(),
        "hyperparameters": {"patience": args.patience, "seeds": args.seeds,
                            "epochs_cap": args.epochs,
                            "models": {k: {"config": v[0], "options": v[1]}
                                       for k, v in MODELS.items()}},
        "dag_registered_by_library": registered,
        # a rerun of some tasks / splits / models keeps the others' results
        "quality": aggregate(kept + runs),
        "runs": kept + runs,
        "deep": bench_deep(args, log) if "deep" in args.parts
        else prev.get("deep", []),
    }
    write_json(args.out, result)
    md = markdown(result)
    if not args.no_readme:
        write_section("circuit_models", md, md_path)
    print(md)
    return result


if __name__ == "__main__":
    main()
