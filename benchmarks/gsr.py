"""GSR benchmark: memory vs depth, speed vs peers, quality vs depth, b19 depth.

Reproduces the claims of issue 3 side by side with the peers, in one run:

1. **memory**: peak training memory (2 steps of forward + backward + Adam) of
   GSRGNN, ResGNN and PyG ``GroupAddRev`` against depth on ``epfl/multiplier``
   (hidden 64, 4 groups), each point in a fresh subprocess
   (:func:`leangnn.profile.measure_in_subprocess`); also the bytes autograd
   saves for backward (:class:`leangnn.profile.SavedTensorsMeter`).
2. **speed**: one training epoch (one step on ``epfl/multiplier``) of GSRGNN,
   ``GroupAddRev`` and ResGNN with the same conv, width, depth and groups,
   alternated round by round in one process; medians and ratios.
3. **quality**: ``arrival`` trained on the default training circuits and
   tested on circuits never seen (``leangnn.circuits.DEFAULT_SPLIT``) through
   the one training loop, :class:`leangnn.train.Trainer` (in memory,
   ``record=False``: no run directory); Pearson, Spearman, Kendall and MAE.
4. **b19**: peak memory of GSRGNN on ``itc99/b19`` at growing depth, and the
   ResGNN per-layer slope, to bound the depth trainable within 8 GiB.

No GPU here: times are CPU times (one thread by default, because the machine
is shared) and only their ratios carry over; memory is CPU peak RSS.

Usage::

    python benchmarks/gsr.py --quick          # ~5 min smoke run
    nice -n 5 python benchmarks/gsr.py        # full run, ~2.5 h on 2 shared cores
    python benchmarks/gsr.py --sections memory,speed
    python benchmarks/gsr.py --sections quality --merge   # add to results/gsr.json

The full run's parts, measured on a shared 2-core CPU: memory ~50 min (the
exact ``mmap`` allocator mode costs a page fault per block), speed ~15 min,
quality ~45 min of CPU (10 models; the 128-layer one is a third of it), b19
~35 min.

Sections 1, 2 and 4 time and measure single training steps (forward,
backward, Adam) of models the Trainer does not build (PyG ``GroupAddRev``)
one step at a time, alternating with the peers: that narrow step is
:func:`train_step` here, with the Trainer's own task loss
(:func:`leangnn.train.make_loss_fn`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch_geometric.nn import GroupAddRev

from leangnn.nn import GSRGNN, GSRBlock, ResGNN
from leangnn.nn.csr import csr_kernels
from leangnn.nn.group_sparse import resolve_k
from leangnn.nn.shared_graph import shared_graph
from leangnn.profile import SavedTensorsMeter, measure_in_subprocess
from leangnn.strategy import FullBatch
from leangnn.train import make_loss_fn

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
#: the Trainer's loss for ``arrival`` (MSE over every node of a circuit); the
#: step is its full-batch one (``--strategy full`` / ``reversible``) on the
#: graph's device
_loss = make_loss_fn("regression")


# --------------------------------------------------------------------------- #
# The peer: PyG GroupAddRev (as in PyG's examples/rev_gnn.py) around the very
# same group function as GSRGNN, so only the reversible machinery differs.
# --------------------------------------------------------------------------- #
class RevBlock(GSRBlock):
    """A :class:`GSRBlock` taking its dropout keep-mask positionally, the way
    ``GroupAddRev`` hands each group its chunk of extra arguments."""

    def __init__(self, channels, conv, k, scale):
        super().__init__(channels, conv, k, channels)
        self.scale = scale

    def forward(self, x, edge_index, keep=None):
        return super().forward(x, edge_index, keep=keep, scale=self.scale)


class GroupAddRevGNN(torch.nn.Module):
    """Encoder -> L x ``torch_geometric.nn.GroupAddRev`` -> norm/ReLU -> head,
    the layout of :class:`~leangnn.nn.GSRGNN` (shared dropout mask as in PyG's
    RevGNN example)."""

    def __init__(self, in_channels, hidden_channels, out_channels, num_layers,
                 num_groups=4, conv="sage", sparsity=None, dropout=0.0):
        super().__init__()
        self.dropout = dropout
        c = hidden_channels // num_groups
        k = resolve_k(sparsity, c)
        scale = 1.0 / (1.0 - dropout)
        self.encoder = torch.nn.Linear(in_channels, hidden_channels)
        self.layers = torch.nn.ModuleList(
            GroupAddRev(torch.nn.ModuleList(RevBlock(c, conv, k, scale)
                                            for _ in range(num_groups)))
            for _ in range(num_layers))
        self.out_norm = torch.nn.LayerNorm(hidden_channels)
        self.head = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        h = self.encoder(x)
        keep = None
        if self.training and self.dropout > 0:
            keep = torch.empty(h.shape, dtype=torch.bool).bernoulli_(1 - self.dropout)
        for layer in self.layers:
            h = layer(h, edge_index, keep) if keep is not None else \
                layer(h, edge_index)
        h = F.dropout(F.relu(self.out_norm(h)), self.dropout, self.training)
        return self.head(h)


class ResCSRGNN(ResGNN):
    """:class:`~leangnn.nn.ResGNN` whose convs run through the CSR kernels of
    :mod:`leangnn.nn.csr` (what GSRGNN's group functions use), not a model of
    the library: it measures what the same kernels would give the plain
    residual peer (``res`` itself stays plain PyG, as users run it)."""

    def forward(self, x, edge_index):
        h = self.encoder(x)
        n, drop = x.size(0), self.training and self.dropout > 0
        scale = 1.0 / (1.0 - self.dropout) if drop else 1.0
        convs = [b.conv for b in self.blocks]
        with shared_graph(convs, edge_index, n, h.dtype) as graph, \
                csr_kernels(convs, graph, n, h.dtype,
                            looped=graph is not edge_index) as kernels:
            for block, kernel in zip(self.blocks, kernels):
                keep = None
                if drop:
                    keep = torch.empty(h.shape, dtype=torch.bool).bernoulli_(
                        1.0 - self.dropout)
                h = h + block(h, graph, keep=keep, scale=scale, kernel=kernel)
        h = F.dropout(F.relu(self.out_norm(h)), p=self.dropout,
                      training=self.training)
        return self.head(h)


LABELS = {"gsr": "GSRGNN", "gsr_narrow": "GSRGNN (fp32 stream)",
          "gsr_unflat": "GSRGNN (per-module parameters)",
          "gsr_unshared": "GSRGNN (per-call graph preprocessing)",
          "gsr_pyg": "GSRGNN (PyG convs, no CSR kernels)",
          "res": "ResGNN", "res_csr": "ResGNN (CSR kernels)",
          "rev": "GroupAddRev"}

#: allocator settings for the memory runs: glibc's default, and a fixed mmap
#: threshold so every block >= 64 KiB is mapped and unmapped on its own and the
#: RSS follows the live bytes (the CPU analogue of CUDA max_memory_allocated)
MALLOC = {"default": {}, "mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


def make_model(kind, in_channels, hidden, layers, groups, conv, sparsity, dropout):
    if kind in ("gsr", "gsr_narrow", "gsr_unflat", "gsr_unshared", "gsr_pyg"):
        model = GSRGNN(in_channels, hidden, 1, layers, num_groups=groups, conv=conv,
                       sparsity=sparsity, dropout=dropout,
                       exact_stream=kind != "gsr_narrow",
                       flat_parameters=kind != "gsr_unflat")
        # the off switch: every conv preprocesses the graph on every call
        model.stack.share_graph = kind != "gsr_unshared"
        # the off switch of the CSR kernels (nn.csr): PyG's convs, shared graph
        model.stack.kernels = kind not in ("gsr_unshared", "gsr_pyg")
        return model
    if kind in ("res", "res_csr"):
        cls = ResGNN if kind == "res" else ResCSRGNN
        return cls(in_channels, hidden, 1, layers, conv=conv, dropout=dropout,
                   num_groups=groups, sparsity=sparsity)
    if kind == "rev":
        return GroupAddRevGNN(in_channels, hidden, 1, layers, groups, conv, sparsity,
                              dropout)
    raise ValueError(f"unknown model kind {kind!r}")


def train_step(model, opt, data) -> float:
    """One step (= one epoch on one circuit) of the Trainer's loop without
    its bookkeeping (the full-batch strategy's forward, loss and backward,
    then Adam): what the memory and speed sections time, alternating models
    step by step, including ``GroupAddRev``, which the Trainer's model
    registry does not build."""
    opt.zero_grad(set_to_none=True)
    loss = FullBatch(data.x.device).train_step(model, data, _loss)
    opt.step()
    return loss


# --------------------------------------------------------------------------- #
# 1. memory vs depth (one fresh subprocess per point)
# --------------------------------------------------------------------------- #
def _mem_setup(kind, circuit, hidden, layers, groups, conv, sparsity, dropout,
               threads, warmup=False, seed=0, device="cpu"):
    from leangnn.circuits import load_circuit

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    data = load_circuit(circuit, task="arrival").to(device)
    model = make_model(kind, data.num_features, hidden, layers, groups, conv,
                       sparsity, dropout).train().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if warmup:  # optimizer state then sits in the baseline: the peak is a step's
        train_step(model, opt, data)
    return {"model": model, "opt": opt, "data": data, "steps": 2}


def _mem_run(state):
    model, opt, data = state["model"], state["opt"], state["data"]
    times, saved = [], 0
    for step in range(state["steps"]):
        t0 = time.perf_counter()
        if step == 0:
            with SavedTensorsMeter() as meter:
                out = FullBatch(data.x.device).forward(model, data)
                loss = _loss(out, data)
            saved = meter.bytes
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del out, loss
        else:
            train_step(model, opt, data)
        times.append(time.perf_counter() - t0)
    return {"saved_bytes": saved, "step_seconds": times,
            "num_parameters": sum(p.numel() for p in model.parameters())}


def measure_point(kind, layers, args, circuit=None, malloc="default", warmup=False):
    kw = dict(kind=kind, circuit=circuit or args.circuit, hidden=args.hidden,
              layers=layers, groups=args.groups, conv=args.conv,
              sparsity=args.sparsity, dropout=args.dropout, threads=args.threads,
              warmup=warmup, device=args.device)
    with mock.patch.dict(os.environ, MALLOC[malloc]):  # read by the child's glibc
        result, mem = measure_in_subprocess(_mem_setup, _mem_run, kw,
                                            device=args.device, timeout=args.timeout)
    return {"model": kind, "layers": layers, "circuit": kw["circuit"],
            "malloc": malloc if args.device == "cpu" else None, "warmup": warmup,
            "peak_bytes": mem["peak_bytes"],
            "method": mem["method"], "baseline_bytes": mem["baseline_bytes"],
            **result}


def bench_memory(args, log):
    rows = []
    # glibc's settings mean nothing to CUDA's allocator: one pass there
    for malloc in args.malloc if args.device == "cpu" else args.malloc[:1]:
        depths = {"gsr": args.gsr_depths, "gsr_unflat": args.unflat_depths,
                  "rev": args.rev_depths,
                  "res": args.res_depths_default if malloc == "default"
                  else args.res_depths}
        for kind, ds in depths.items():
            for layers in ds:
                row = measure_point(kind, layers, args, malloc=malloc)
                rows.append(row)
                log(f"memory [{malloc}] {LABELS[kind]:>12} L={layers:<4} peak "
                    f"{row['peak_bytes'] / MiB:9.1f} MiB  saved "
                    f"{row['saved_bytes'] / MiB:9.1f} MiB  step "
                    f"{statistics.median(row['step_seconds']):.1f} s")
    # Steady-state steps: Adam's state allocated before the baseline, so the
    # peak is activations + gradients + temporaries of one step.
    for kind, layers in ((k, ly) for k in ("gsr", "rev") for ly in args.warmup_depths):
        row = measure_point(kind, layers, args, malloc=args.malloc[0], warmup=True)
        rows.append(row)
        log(f"memory [{args.malloc[0]}, after a warm-up step] {LABELS[kind]:>12} "
            f"L={layers:<4} peak {row['peak_bytes'] / MiB:9.1f} MiB")
    return rows


# --------------------------------------------------------------------------- #
# 2. speed: alternating rounds in one process
# --------------------------------------------------------------------------- #
def bench_speed(args, log):
    from leangnn.circuits import load_circuit

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    data = load_circuit(args.circuit, task="arrival").to(dev)
    out = []
    acts = {"topk": args.sparsity, "relu": None}
    configs = [(conv, acts[a]) for conv in args.speed_convs for a in args.speed_acts
               if a == "relu" or args.sparsity]
    for conv, sparsity in configs:
        kinds = list(args.speed_kinds)
        models, opts = {}, {}
        for kind in kinds:
            torch.manual_seed(0)
            models[kind] = make_model(kind, data.num_features, args.hidden,
                                      args.speed_layers, args.groups, conv,
                                      sparsity, args.dropout).train().to(dev)
            opts[kind] = torch.optim.Adam(models[kind].parameters(), lr=1e-3)
        times = {k: [] for k in kinds}
        wall = {k: [] for k in kinds}
        # CPU time of this process: on a shared machine the wall time of a
        # step is mostly how much of a core the scheduler gave it (at a load
        # of 20 on 2 cores, ~13%), and that share drifts between the models'
        # turns; the CPU time a step takes does not.
        # CUDA: the wall clock after a synchronize (the host's CPU time says
        # nothing of the kernels')
        clock = time.process_time if args.clock == "cpu" and dev.type == "cpu" \
            else time.perf_counter
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" \
            else (lambda: None)
        for r in range(args.rounds + 1):  # round 0 warms up and is dropped
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for kind in order:
                sync()
                t0, w0 = clock(), time.perf_counter()
                train_step(models[kind], opts[kind], data)
                sync()
                if r > 0:
                    times[kind].append(clock() - t0)
                    wall[kind].append(time.perf_counter() - w0)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"conv": conv, "sparsity": sparsity, "layers": args.speed_layers,
               "rounds": args.rounds, "device": args.device,
               "clock": args.clock if dev.type == "cpu" else "wall", "wall_times": wall,
               "times": times, "median_seconds": med,
               "ratio_vs_resgnn": {k: med[k] / med["res"] for k in kinds},
               # per-round ratios too: the spread shows how noisy the machine was
               "round_ratios_vs_resgnn": {
                   k: [a / b for a, b in zip(times[k], times["res"])] for k in kinds}}
        if "rev" in med:  # GroupAddRev is optional (slow, and memory-hungry)
            row["ratio_vs_groupaddrev"] = {k: med[k] / med["rev"] for k in kinds}
            row["round_ratios_vs_groupaddrev"] = {
                k: [a / b for a, b in zip(times[k], times["rev"])] for k in kinds}
        out.append(row)
        log(f"speed {conv} k={sparsity} L={args.speed_layers}: " + "  ".join(
            f"{LABELS[k]} {med[k]:.3f}s ({med[k] / med['res']:.2f}x res)"
            for k in kinds))
        del models, opts
    return out


# --------------------------------------------------------------------------- #
# 3. quality: arrival, split by circuit, through the Trainer
# --------------------------------------------------------------------------- #
def bench_quality(args, log):
    from leangnn.config import TrainConfig
    from leangnn.train import Trainer

    torch.set_num_threads(args.threads)
    rows = []
    for spec in args.quality_models:  # name@layers[:kK][:hH]
        name, rest = spec.split("@")
        layers, *opts = rest.split(":")
        opt = {o[0]: int(o[1:]) for o in opts}
        layers, sparsity, hidden = int(layers), opt.get("k"), opt.get("h", args.hidden)
        strategy = "reversible" if name == "gsr" else "full"
        cfg = TrainConfig(
            dataset=args.train, val_dataset=args.val, test_dataset=args.test,
            task="arrival", strategy=strategy, model=name, conv=args.conv,
            num_layers=layers, hidden_channels=hidden, dropout=args.dropout,
            epochs=args.epochs, lr=args.lr, patience=args.patience, seed=args.seed,
            device=args.device, num_groups=args.groups, sparsity=sparsity)
        # In memory: the summary is all this section reads, and a fixed run
        # directory would refuse the second run of the benchmark.
        trainer = Trainer(cfg, progress=False, record=False)
        t0 = time.perf_counter()
        summary = trainer.fit()
        test = summary["metrics"]["test"]
        row = {"model": name, "layers": layers, "sparsity": sparsity, "hidden": hidden,
               "pearson": test["pearson"], "spearman": test["spearman"],
               "kendall": test["kendall"], "mae": test["mae"],
               "val_pearson": summary["metrics"]["val"]["pearson"],
               "epochs_run": summary["epochs_run"],
               "epoch_seconds": summary["time"]["epoch_seconds_median"],
               "wall_seconds": time.perf_counter() - t0,
               "num_parameters": summary["num_parameters"], "seed": args.seed}
        rows.append(row)
        log(f"quality {spec}: pearson {row['pearson']:.4f} spearman "
            f"{row['spearman']:.4f} kendall {row['kendall']:.4f} mae {row['mae']:.4f}"
            f" ({row['epochs_run']} ep, {row['wall_seconds']:.0f} s)")
    return rows


# --------------------------------------------------------------------------- #
# 4. itc99/b19: how deep within 8 GiB
# --------------------------------------------------------------------------- #
def bench_b19(args, log):
    rows = []
    budget = 8 << 30
    for kind, ds in (("res", args.b19_res_depths), ("gsr", args.b19_gsr_depths)):
        for layers in ds:
            row = measure_point(kind, layers, args, circuit="itc99/b19",
                                malloc=args.b19_malloc)
            rows.append(row)
            log(f"b19 {LABELS[kind]:>8} L={layers:<5} peak "
                f"{row['peak_bytes'] / MiB:9.1f} MiB  step "
                f"{statistics.median(row['step_seconds']):.1f} s")

    def fit(kind):
        pts = sorted((r["layers"], r["peak_bytes"]) for r in rows
                     if r["model"] == kind)
        if len(pts) < 2:
            return None
        (l0, m0), (l1, m1) = pts[0], pts[-1]
        slope = max((m1 - m0) / (l1 - l0), 1.0)
        return {"bytes_per_layer": slope, "intercept_bytes": m0 - slope * l0,
                "max_layers_8gib_extrapolated": int((budget - (m0 - slope * l0))
                                                    / slope)}

    within = [r["layers"] for r in rows if r["model"] == "gsr"
              and r["peak_bytes"] <= budget]
    return {"points": rows, "fit": {"res": fit("res"), "gsr": fit("gsr")},
            "largest_gsr_depth_measured_within_8gib": max(within) if within
            else None}


# --------------------------------------------------------------------------- #
# report
# --------------------------------------------------------------------------- #
def _mib(b):
    return f"{b / MiB:,.1f}"


def checks(res, args):
    out = {}
    warm = {(r["model"], r["layers"]): r["peak_bytes"]
            for r in res.get("memory") or [] if r.get("warmup")}
    for kind in ("gsr", "rev"):
        if (kind, 16) in warm and (kind, 256) in warm:
            out[f"memory_step_{kind}256_over_{kind}16"] = \
                warm[kind, 256] / warm[kind, 16]
    for malloc in MALLOC:
        peak = {(r["model"], r["layers"]): r["peak_bytes"]
                for r in res.get("memory") or [] if r["malloc"] == malloc
                and not r.get("warmup")}
        if ("gsr", 16) in peak and ("gsr", 256) in peak:
            out[f"memory_{malloc}_gsr256_over_gsr16"] = \
                peak["gsr", 256] / peak["gsr", 16]
        if ("gsr_unflat", 16) in peak and ("gsr_unflat", 256) in peak:
            out[f"memory_{malloc}_unflat_gsr256_over_gsr16"] = \
                peak["gsr_unflat", 256] / peak["gsr_unflat", 16]
        if ("gsr", 128) in peak and ("res", 128) in peak:
            out[f"memory_{malloc}_gsr128_over_res128"] = \
                peak["gsr", 128] / peak["res", 128]
    for row in res.get("speed") or []:
        act = "relu" if row.get("sparsity") is None else f"k{row['sparsity']}"
        med = row["median_seconds"]
        if "res_csr" in med:  # against the peer given the same CSR kernels
            out[f"speed_{row['conv']}_{act}_gsr_over_res_csr"] = \
                med["gsr"] / med["res_csr"]
        for kind in ("gsr", "gsr_unshared", "gsr_narrow", "gsr_pyg"):
            if kind in row.get("ratio_vs_groupaddrev", {}):
                out[f"speed_{row['conv']}_{act}_{kind}_over_groupaddrev"] = \
                    row["ratio_vs_groupaddrev"][kind]
            if kind in row["ratio_vs_resgnn"]:
                out[f"speed_{row['conv']}_{act}_{kind}_over_resgnn"] = \
                    row["ratio_vs_resgnn"][kind]
    q = res.get("quality")
    if q:
        seeds: dict[tuple, list[float]] = {}
        for r in q:  # mean over seeds
            seeds.setdefault((r["model"], r["layers"], r.get("sparsity"),
                              r.get("hidden", args.hidden)), []).append(r["pearson"])
        by = {key: statistics.mean(v) for key, v in seeds.items()}
        shallow = max((v for (m, ly, k, h), v in by.items() if ly <= 4),
                      default=None)
        for (m, ly, k, h), v in by.items():
            if m == "gsr" and ly >= 64:
                tag = f"gsr{ly}" + (f"k{k}" if k else "") + \
                    (f"h{h}" if h != args.hidden else "")
                res_same = [v2 for (m2, l2, k2, h2), v2 in by.items()
                            if m2 == "res" and (l2, k2, h2) == (ly, k, h)]
                if res_same:
                    out[f"quality_{tag}_minus_res{ly}"] = v - max(res_same)
                if shallow is not None:
                    out[f"quality_{tag}_minus_best_4layer"] = v - shallow
    return out


def markdown(res, args) -> str:
    lines = ["## GSR: reversible deep GNNs (`benchmarks/gsr.py`)", "",
             f"CPU only ({res['env']['cpu']}, torch {res['env']['torch']}, "
             f"{args.threads} thread(s)); memory is peak RSS above the loaded "
             "model in a fresh subprocess; times are CPU times, compare ratios "
             "only. Commands, in order:", "", "```bash",
             *res["commands"], "```", ""]
    def cfg_of(section):
        a = argparse.Namespace(**res.get(f"{section}_args", vars(args)))
        return a, (f"hidden {a.hidden}, {a.groups} groups, conv {a.conv}, "
                   f"top-{a.sparsity} of {a.hidden // a.groups} per group, "
                   f"dropout {a.dropout}")

    args, cfg = cfg_of("memory")
    for malloc in MALLOC:
        mem = [r for r in res.get("memory") or [] if r["malloc"] == malloc
               and not r.get("warmup")]
        if not mem:
            continue
        peak = {(r["model"], r["layers"]): r for r in mem}
        depths = sorted({r["layers"] for r in mem})
        how = ("glibc malloc defaults" if malloc == "default" else
               "MALLOC_MMAP_THRESHOLD_=65536, RSS follows live bytes")
        lines += [f"### Peak training memory vs depth, {how} ({args.circuit}, "
                  f"{cfg}; 2 steps of forward + backward + Adam)", "",
                  "| layers | GSRGNN MiB | GSRGNN, per-module parameters MiB | "
                  "ResGNN MiB | GroupAddRev MiB | "
                  "GSR / ResGNN | GSR saved-for-backward MiB | "
                  "ResGNN saved-for-backward MiB |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for ly in depths:
            g, u, r, v = (peak.get((k, ly)) for k in ("gsr", "gsr_unflat", "res",
                                                      "rev"))
            cell = lambda x: _mib(x["peak_bytes"]) if x else "-"  # noqa: E731
            ratio = f"{g['peak_bytes'] / r['peak_bytes']:.3f}" if g and r else "-"
            lines.append(f"| {ly} | {cell(g)} | {cell(u)} | {cell(r)} | {cell(v)} | "
                         f"{ratio} | "
                         f"{_mib(g['saved_bytes']) if g else '-'} | "
                         f"{_mib(r['saved_bytes']) if r else '-'} |")
        lines.append("")
    if any(r["model"] == "gsr_unflat" for r in res.get("memory") or []):
        lines += ["GSRGNN keeps its stack's parameters in one flat tensor (the "
                  "default); *per-module parameters* is the same model with "
                  "`flat_parameters=False` (the off switch): its growth with depth "
                  "is the per-tensor overhead of thousands of small gradients and "
                  "Adam moments (5,120 tensors each at 256 layers), not "
                  "activations (saved-for-backward bytes are constant).", ""]
    warm = [r for r in res.get("memory") or [] if r.get("warmup")]
    if warm:
        lines += ["Steady-state step (Adam's state allocated before the baseline; "
                  f"malloc {warm[0]['malloc']}): the peak of one step is "
                  "activations + gradients + temporaries.", "",
                  "| model | layers | peak MiB |", "|---|---:|---:|"]
        lines += [f"| {LABELS[r['model']]} | {r['layers']} | "
                  f"{_mib(r['peak_bytes'])} |" for r in warm]
        lines.append("")
    args, cfg = cfg_of("speed")
    if res.get("speed"):
        clock = res["speed"][0].get("clock", "wall")
        lines += [f"### Epoch time vs peers ({args.circuit}, {cfg}; one step = one "
                  f"epoch; median of {args.rounds} alternating rounds; "
                  f"{'process CPU' if clock == 'cpu' else 'wall'} time)", "",
                  "GSRGNN: default float64 residual stream (bit-exact "
                  "reconstruction); fp32 stream: `exact_stream=False`; "
                  "GroupAddRev: `torch_geometric.nn.GroupAddRev` around the same "
                  "group functions (`GSRBlock`), so only the reversible machinery "
                  "differs; ResGNN: the same blocks at full width, plain autograd; "
                  "per-call graph preprocessing: `GSRStack(share_graph=False)`, "
                  "every conv normalises / adds self-loops to the graph itself; "
                  "GSRGNN's GCN / GAT / SAGE group functions aggregate by CSR "
                  "sparse-dense products (`leangnn.nn.csr`); PyG convs: "
                  "`GSRStack(kernels=False)`, the off switch; ResGNN (CSR "
                  "kernels): ResGNN's convs through the same kernels (a "
                  "measurement only: `res` stays plain PyG). "
                  "Target (issue 12): GSRGNN at most "
                  f"{TARGETS['gsr_over_resgnn'][1]}x ResGNN.", "",
                  "| conv | activation | layers | model | median s/epoch | "
                  "vs GroupAddRev | vs ResGNN | target vs ResGNN | met |",
                  "|---|---|---:|---|---:|---:|---:|---:|---|"]
        op, bound = TARGETS["gsr_over_resgnn"]
        for row in res["speed"]:
            act = "ReLU" if row.get("sparsity") is None else \
                f"top-{row['sparsity']} of {args.hidden // args.groups}"
            for k, t in row["median_seconds"].items():
                ratio = row["ratio_vs_resgnn"][k]
                target = f"{op} {bound}" if k == "gsr" else ""
                met = ("yes" if ratio <= bound else "no") if k == "gsr" else ""
                vs_rev = (f"{row['ratio_vs_groupaddrev'][k]:.3f}"
                          if "ratio_vs_groupaddrev" in row else "-")
                lines.append(f"| {row['conv']} | {act} | {row['layers']} | "
                             f"{LABELS[k]} | {t:.3f} | {vs_rev} | {ratio:.3f} | "
                             f"{target} | {met} |")
        lines.append("")
    args, cfg = cfg_of("quality")
    cfg = cfg.split(", top-")[0] + f", dropout {args.dropout}, lr {args.lr}"
    if res.get("quality"):
        lines += [f"### Quality on `arrival`, unseen test circuits ({cfg}; train "
                  f"{args.train or 'default split'}, test "
                  f"{args.test or 'default split'}; up to {args.epochs} epochs, "
                  f"patience {args.patience})", "",
                  "| model | layers | hidden | activation | seed | pearson | "
                  "spearman | kendall | MAE | epochs | s/epoch |",
                  "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        groups: dict[tuple, list[dict]] = {}
        for r in sorted(res["quality"], key=lambda r: (
                r["layers"], r["model"], r.get("hidden", args.hidden),
                r.get("sparsity") or 0, r.get("seed", 0))):
            act = "ReLU" if not r.get("sparsity") else f"top-{r['sparsity']}"
            if r["model"] not in ("gsr", "res"):
                act = "ReLU (PyG model)"
            hidden = r.get("hidden", args.hidden)
            groups.setdefault((r["model"], r["layers"], hidden, act), []).append(r)
            lines.append(f"| {r['model']} | {r['layers']} | {hidden} | {act} | "
                         f"{r.get('seed', 0)} | {r['pearson']:.4f} | "
                         f"{r['spearman']:.4f} | {r['kendall']:.4f} | {r['mae']:.4f} "
                         f"| {r['epochs_run']} | {r['epoch_seconds']:.2f} |")
        lines.append("")
        multi = {k: v for k, v in groups.items() if len(v) > 1}
        if multi:
            lines += ["Configurations run with several seeds (mean ± sample std "
                      "over seeds; the checks below use the means):", "",
                      "| model | layers | hidden | activation | seeds | pearson | "
                      "spearman | kendall | MAE |", "|---|---:|---:|---|---:|---:|"
                      "---:|---:|---:|"]
            for (m, ly, h, act), rows in multi.items():
                def ms(key, rows=rows):
                    v = [r[key] for r in rows]
                    return f"{statistics.mean(v):.4f} ± {statistics.stdev(v):.4f}"
                lines.append(f"| {m} | {ly} | {h} | {act} | {len(rows)} | "
                             f"{ms('pearson')} | {ms('spearman')} | "
                             f"{ms('kendall')} | {ms('mae')} |")
            lines.append("")
    b19 = res.get("b19")
    if b19:
        lines += ["### itc99/b19: depth within 8 GiB", "",
                  "| model | layers | peak MiB | s/step |", "|---|---:|---:|---:|"]
        for r in b19["points"]:
            lines.append(f"| {LABELS[r['model']]} | {r['layers']} | "
                         f"{_mib(r['peak_bytes'])} | "
                         f"{statistics.median(r['step_seconds']):.1f} |")
        for k, f in b19["fit"].items():
            if f:
                lines.append(f"\n{LABELS[k]}: {_mib(f['bytes_per_layer'])} MiB per "
                             "layer; 8 GiB reached at ~"
                             f"{f['max_layers_8gib_extrapolated']:,} layers "
                             "(linear extrapolation).")
        lines += ["", "Largest GSRGNN depth trained on b19 and measured within 8 GiB: "
                  f"{b19['largest_gsr_depth_measured_within_8gib']}.", ""]
    if res.get("checks"):
        lines += ["### Targets of issue 3", "",
                  "| check | value | target | met |", "|---|---:|---:|---|"]
        for key, value in res["checks"].items():
            target = TARGETS.get(_target_key(key))
            if target is None:
                continue
            op, bound = target
            met = value <= bound if op == "<=" else value >= bound
            lines.append(f"| {key} | {value:.3f} | {op} {bound} | "
                         f"{'yes' if met else 'no'} |")
        lines.append("")
    return "\n".join(lines)


#: issue 3's (and issue 12's speed) thresholds, by the shape of a check's name
TARGETS = {"gsr256_over_gsr16": ("<=", 1.15), "gsr128_over_res128": ("<=", 0.13),
           "gsr_over_resgnn": ("<=", 1.35),
           "gsr_over_groupaddrev": ("<=", 0.8),
           "gsr_narrow_over_groupaddrev": ("<=", 0.8), "minus_res": (">=", -0.01),
           "minus_best_4layer": (">=", 0.05)}


def _target_key(check: str) -> str | None:
    for key in TARGETS:
        if check.endswith(key) or (key.startswith("minus") and key in check):
            return key
    return None


def plot(res, path):
    if not can_plot(path):
        return
    modes = [m for m in MALLOC if any(r["malloc"] == m for r in res["memory"])]
    with figure(path, 1, len(modes), figsize=(6 * len(modes), 4),
                squeeze=False) as (_, axes):
        for ax, malloc in zip(axes[0], modes):
            _plot_memory(ax, res, malloc)


def _plot_memory(ax, res, malloc):
    for kind in ("gsr", "res", "rev"):
        pts = sorted((r["layers"], r["peak_bytes"] / MiB) for r in res["memory"]
                     if r["model"] == kind and r["malloc"] == malloc
                     and not r.get("warmup"))
        if pts:
            ax.plot(*zip(*pts), marker="o", label=LABELS[kind])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("layers")
    ax.set_ylabel("peak training memory (MiB, CPU RSS)")
    ax.set_title(f"{res['args']['circuit']}, hidden {res['args']['hidden']}, "
                 f"{res['args']['groups']} groups; malloc {malloc}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    strs = lambda s: [v for v in s.split(",") if v]  # noqa: E731
    a("--quick", action="store_true", help="small smoke run (~5 min)")
    a("--sections", type=strs, default=["memory", "speed", "quality", "b19"])
    a("--circuit", default="epfl/multiplier")
    a("--hidden", type=int, default=64)
    a("--groups", type=int, default=4)
    a("--conv", default="sage")
    a("--sparsity", type=int, default=8, help="winners per group (of hidden/groups)")
    a("--dropout", type=float, default=0.0)
    a("--threads", type=int, default=1, help="torch intra-op threads (all peers)")
    a("--device", default="cpu")
    a("--timeout", type=float, default=3600)
    a("--malloc", type=strs, default=["mmap", "default"],
      help=f"allocator settings for the memory runs, from {list(MALLOC)}")
    a("--b19-malloc", default="default", choices=list(MALLOC),
      help="mmap mode is exact but ~5x slower (a page fault per block)")
    a("--warmup-depths", type=ints, default=[16, 256],
      help="depths measured again with the optimizer state in the baseline")
    a("--speed-kinds", type=strs,
      default=["gsr", "gsr_unshared", "gsr_narrow", "rev", "res"],
      help=f"models timed side by side, from {list(LABELS)} (needs res)")
    a("--gsr-depths", type=ints, default=[16, 32, 64, 128, 256])
    a("--res-depths", type=ints, default=[16, 32, 64, 128])
    a("--res-depths-default", type=ints, default=[16, 32, 64],
      help="ResGNN depths under glibc's default allocator (fragmentation triples "
      "its RSS: 128 layers would need ~13 GiB)")
    a("--rev-depths", type=ints, default=[16, 64, 256])
    a("--unflat-depths", type=ints, default=[16, 256],
      help="GSRGNN with flat_parameters=False (the off switch)")
    a("--speed-layers", type=int, default=64)
    a("--speed-convs", type=strs, default=["sage", "gcn", "gat"])
    a("--clock", default="cpu", choices=["cpu", "wall"],
      help="speed: time steps by this process's CPU time (robust on a shared "
      "machine) or by wall time")
    a("--speed-acts", type=strs, default=["topk", "relu"],
      help="activations timed: topk (top --sparsity per group) and/or relu")
    a("--rounds", type=int, default=5)
    a("--quality-models", type=strs,
      default=["sage@4", "res@4", "gsr@4", "res@64", "gsr@64", "gsr@64:k8",
               "gsr@64:h128", "res@64:k8", "gsr@64:k8:h128", "gsr@128:h128"],
      help="name@layers[:kK][:hH] (K winners per group, H hidden channels)")
    a("--train", default=None, help="training circuits (default: the default "
      "split's training circuits)")
    a("--val", default="iscas85/c5315")
    a("--test", default="iscas85/c6288,iscas85/c7552,epfl/i2c")
    a("--epochs", type=int, default=60)
    a("--patience", type=int, default=20)
    a("--lr", type=float, default=1e-3)
    a("--seed", type=int, default=0)
    a("--b19-gsr-depths", type=ints, default=[64, 256, 1024])
    a("--b19-res-depths", type=ints, default=[4, 8])
    a("--merge", action="store_true",
      help="keep the other sections of an existing --out file")
    a("--import-json", type=strs, default=[],
      help="take these sections' results from other --out files (comma list)")
    a("--out", default=None, help="default: results/gsr.json "
      "(results/quick/gsr.json with --quick)")
    a("--md", default=None, help="default: the gsr section of benchmarks/README.md "
      "(results/quick/gsr.md with --quick)")
    a("--plot", default=None, help="default: results/gsr_memory.png")
    args = p.parse_args(argv)
    if args.quick:
        args.gsr_depths, args.res_depths, args.rev_depths = [16, 64], [16], [16]
        args.unflat_depths = [64]
        args.res_depths_default = [16]
        args.speed_layers, args.speed_convs, args.rounds = 16, ["sage"], 3
        args.malloc, args.warmup_depths = ["mmap"], [16]
        args.quality_models = ["gsr@4", "gsr@16"]
        args.train = "iscas85/c432,iscas85/c880,epfl/ctrl,epfl/router"
        args.val, args.test = "epfl/int2float", "iscas85/c1908"
        args.epochs, args.patience = 10, 0
        args.sections = [s for s in args.sections if s != "b19"]
    # A quick run never overwrites the full results or the README.
    args.out = args.out or str(results_path("gsr.json", args.quick))
    args.md = args.md or str(markdown_path("gsr", args.quick))
    args.plot = args.plot or str(results_path("gsr_memory.png", args.quick))
    return args


def _row_key(row: dict) -> tuple:
    """What a row measures (its configuration, not its results)."""
    return tuple(row.get(k) for k in ("model", "layers", "circuit", "malloc",
                                      "warmup", "sparsity", "hidden", "conv")) \
        + (row.get("seed", 0),)


def _merge_rows(old: list, new: list) -> list:
    """The earlier run's rows, each replaced by a new row measuring the same
    thing; rows only the new run has are appended."""
    fresh = {_row_key(r): r for r in new}
    kept = [fresh.pop(_row_key(r), r) for r in old]
    return kept + [r for r in new if _row_key(r) in fresh]


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    cmd = "python benchmarks/gsr.py " + shlex.join(sys.argv[1:] if argv is None
                                                   else argv)
    res = {}
    if args.merge and Path(args.out).is_file():  # add sections to an earlier run
        res = json.loads(Path(args.out).read_text())
    res.setdefault("commands", []).append(cmd)
    res.update({
        "command": " && ".join(res["commands"]),
        "args": vars(args),
        "env": {"torch": torch.__version__, "cpu": platform.processor() or
                platform.machine(), "cores": os.cpu_count(),
                "threads": args.threads, "device": args.device}})
    for path in args.import_json:  # sections run separately (e.g. in parallel)
        other = json.loads(Path(path).read_text())
        for section in ("memory", "speed", "quality", "b19"):
            if section in other:
                # with --merge, rows of runs made in parallel (e.g. one per
                # conv) join those already there
                res[section] = _merge_rows(res[section], other[section]) \
                    if args.merge and isinstance(res.get(section), list) \
                    else other[section]
                res[f"{section}_args"] = other.get(f"{section}_args", vars(args))
        # the imported runs came before this one
        res["commands"][-1:-1] = other.get("commands", [])
        res["command"] = " && ".join(res["commands"])
    for section, fn in (("memory", bench_memory), ("speed", bench_speed),
                        ("quality", bench_quality), ("b19", bench_b19)):
        if section in args.sections:
            log(f"== {section}")
            new = fn(args, log)
            if args.merge and isinstance(new, list) and section in res:
                new = _merge_rows(res[section], new)
            res[section] = new
            res[f"{section}_args"] = vars(args)
            res["checks"] = checks(res, args)
            write_json(args.out, res)  # after every section: a crash keeps it
    res["checks"] = checks(res, args)
    write_json(args.out, res)
    write_section("gsr", markdown(res, args), args.md)
    if res.get("memory"):
        plot(res, args.plot)
    log(f"done: {args.out}, {args.md}" + (f", {args.plot}" if res.get("memory")
                                          else "") + " | " + ", ".join(
        f"{k}={v:.3f}" for k, v in res["checks"].items()))


if __name__ == "__main__":
    main()
