"""The ``leangnn`` command line: ``datasets``, ``train``, ``plan``, ``predict``,
``evaluate``.

Every error a user can cause (an unreadable option, a bad value, a malformed
netlist, a missing run, a run too large for memory) is printed as one
``leangnn: error: ...`` line with exit status 2, never a traceback, and
``train`` finds them before loading any data where it can. Choices
(``--strategy``, ``--model``, ``--conv``, ``--task``, ``--cache``,
``--offload-mode``) come from the registries; defaults live in
:class:`~leangnn.config.TrainConfig` only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

from .config import AUTO, AUTO_MODEL, PLANNED_FIELDS, TrainConfig
from .interrupt import interrupted, raised_by_interrupt

__all__ = ["main", "build_parser", "UsageError"]


def _datasets(args) -> int:
    from tqdm.auto import tqdm

    from .circuits import catalog, circuit_stats

    infos = catalog()
    rows = [circuit_stats(i) for i in tqdm(infos, desc="circuits", unit="ckt",
                                            disable=args.json or None)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ["name", "suite", "nodes", "edges", "depth", "inputs", "outputs"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).rjust(widths[c]) if isinstance(r[c], int)
                        else str(r[c]).ljust(widths[c]) for c in cols))
    print(f"{len(rows)} circuits, {sum(r['nodes'] for r in rows):,} nodes in all")
    return 0


_TRAIN_FLAGS = {  # flag -> config field
    "memory_budget": "memory_budget",
    "dataset": "dataset", "val_dataset": "val_dataset", "test_dataset": "test_dataset",
    "task": "task", "strategy": "strategy", "model": "model", "conv": "conv",
    "layers": "num_layers", "hidden": "hidden_channels", "dropout": "dropout",
    "epochs": "epochs", "lr": "lr", "weight_decay": "weight_decay",
    "clip_norm": "clip_norm", "patience": "patience", "seed": "seed",
    "device": "device", "out": "out", "level_feature": "level_feature",
    "groups": "num_groups", "sparsity": "sparsity",
    "flat_parameters": "flat_parameters", "budget_ratio": "budget_ratio",
    "anchors": "num_anchors", "decoder": "decoder",
    "decoder_min_gain": "decoder_min_gain",
    "device_budget": "device_budget", "parts": "num_parts",
    "cache": "cache", "offload_mode": "offload_mode", "retain": "retain",
    "dist_mode": "dist_mode",
    "dist_timeout": "dist_timeout", "aggr": "aggr", "rounds": "rounds",
    "reverse": "reverse",
}


class UsageError(Exception):
    """A command line argparse cannot read (printed as one error line)."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and ``prog: error:`` itself; leangnn prints
    # every user error as the same one line, so the parser raises instead.
    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _resumed_config(args, given: dict) -> TrainConfig:
    from .rundir import RunDir
    from .train import RESUMABLE

    if not args.out:
        raise ValueError("--resume needs --out DIR (the run to continue)")
    saved = Path(args.out) / RunDir.CONFIG
    if not saved.is_file():
        raise FileNotFoundError(f"--resume: no run at {args.out} "
                                f"({saved} is missing)")
    base = TrainConfig.read(saved)
    if given.get("strategy") == AUTO:
        # the same command line again: the saved run holds what was planned
        if base.get("memory_budget") is None:
            was = base.get("strategy", TrainConfig.strategy)
            raise ValueError(f"--resume: the run at {args.out} was not planned "
                             f"(strategy {was!r}); drop --strategy auto")
        given = {k: v for k, v in given.items() if k not in PLANNED_FIELDS}
    changed = {k: v for k, v in given.items()
               if base.get(k) != v and k not in RESUMABLE}
    if changed:
        may = ", ".join(f"--{k}" for k in RESUMABLE if k != "out")
        raise ValueError(f"--resume: options {sorted(changed)} differ from the "
                         f"saved run; only {may} may change when resuming")
    return TrainConfig.load(saved, **given)


def _resume_note(cfg) -> None:
    """Warn, before a resumed ``--strategy auto`` run trains, when its need
    without the plan in its process (:func:`~leangnn.plan.planner.resumed_plan`)
    is over its budget."""
    from .plan.planner import resumed_plan
    from .rundir import RunDir
    from .utils import format_bytes

    plan = RunDir(cfg.out).read_plan()
    if not plan or not plan.get("in_process_bytes"):
        return
    plan = resumed_plan(plan)
    need, budget = plan.get("estimated_peak_bytes"), plan.get("memory_budget_bytes")
    if need is not None and budget is not None and need > budget:
        print(f"leangnn train: warning: resumed apart from its plan, this run "
              f"needs ~{format_bytes(need)} (its plan was made in the process "
              f"that trained, which had paged in "
              f"{format_bytes(plan['resumed_bytes'])} of it), above "
              f"--memory-budget {format_bytes(budget)}", file=sys.stderr)


def _check_out(out: str | None, force: bool) -> None:
    """Fail now, not after loading data, when ``--out`` cannot be a fresh run
    (:meth:`leangnn.rundir.RunDir.open` checks the same again, under its lock)."""
    from .rundir import RunDir

    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out: {out!r} exists and is not a directory")
    found = [n for n in RunDir.FILES if (path / n).exists()]
    if found and not force:
        raise ValueError(f"--out: {out!r} already holds a run ({', '.join(found)}); "
                         "resume it (--resume), overwrite it (--force) or choose "
                         "another --out")
    _check_writable(path, out)


def _check_writable(path: Path, out: str) -> None:
    """``--out`` ``out`` can be created under ``path`` (its nearest existing
    folder is a writable directory); root passes ``os.access`` everywhere, so
    /proc and /sys are refused by name."""
    parent = path
    while not parent.exists():
        parent = parent.parent
    special = parent.resolve().parts[1:2] in (("proc",), ("sys",))
    if not parent.is_dir() or special or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out: cannot create {out!r}: {str(parent)!r} is not a "
                         "writable directory")


def _train(args) -> int:
    from .data import check_datasets
    from .plan.fits import check_fits

    if args.nproc is not None:
        if args.nproc < 1:
            raise ValueError(f"--nproc: expected a positive number of processes, "
                             f"got {args.nproc}")
        from .distributed.launch import (
            check_local_ranks,
            die_with_launcher,
            relaunch_cli,
        )

        if "RANK" not in os.environ:  # the launcher itself, not one of its ranks
            check_local_ranks(args.nproc, args.device)
            if args.strategy == AUTO:
                return _planned_ranks(args)
            return relaunch_cli(args.argv, args.nproc)
        die_with_launcher()

    given = _given(args)
    if args.resume and args.force:
        raise ValueError("--resume continues the run in --out and --force starts "
                         "it over; pass one of them")
    if args.memory_budget is not None:
        _budget(args.memory_budget)
        if given.get("strategy") != AUTO:
            raise ValueError(f"--memory-budget: only with --strategy auto (the "
                             f"planner's budget), got {args.memory_budget!r}; "
                             "offload's own budget is --device-budget")
    extra = {}
    if os.environ.get(PLAN_FILE_ENV) and "RANK" in os.environ:
        # a rank of `--strategy auto --nproc P`: the launcher planned the job
        extra["plan"] = json.loads(Path(os.environ[PLAN_FILE_ENV]).read_text())
    if args.resume:
        cfg = _resumed_config(args, given)
        _resume_note(cfg)
    else:
        cfg = TrainConfig(**given)
        if int(os.environ.get("RANK", "0") or 0) == 0:
            # Rank 0 alone writes the run: another rank checking --out could
            # see the config.json rank 0 just wrote and refuse an "old run".
            _check_out(cfg.out, args.force)
    # Everything that can fail without loading data fails here, in seconds.
    check_datasets(cfg)
    splits = None
    if cfg.strategy == AUTO:
        cfg, splits, extra = _planned(cfg, args, _pinned(given))
    else:
        check_fits(cfg)

    from .train import Trainer

    trainer = Trainer(cfg, splits=splits, progress=not args.quiet,
                      summary_extra=extra)
    summary = trainer.fit(resume=args.resume, force=args.force)
    if trainer.strategy.is_main:  # one line per job, not one per rank
        print(f"leangnn train: {Trainer.summary_line(summary)}")
        if "plan" in summary:
            print(f"leangnn train: {_plan_line(summary)}")
            over = _over_budget_line(summary)
            if over:
                print(f"leangnn train: warning: {over}", file=sys.stderr)
    return 0


#: the file in which ``train --strategy auto --nproc P`` hands its plan to the
#: ranks (their ``summary.json`` records it)
PLAN_FILE_ENV = "LEANGNN_PLAN_FILE"


def _planned_ranks(args) -> int:
    """``train --strategy auto --nproc P``: plan the job here (the
    distributed rows, each rank's need), print the table, then launch the
    ranks with the pick; nothing launches when nothing fits."""
    import gc
    import tempfile

    from .distributed.launch import relaunch_cli
    from .profile import release_free_heap

    given = _given(args)
    if args.nproc < 2:
        raise ValueError(f"--nproc {args.nproc} with --strategy auto: the planner "
                         "plans one process without --nproc")
    if args.resume:
        raise ValueError("--resume with --strategy auto --nproc: resume the run "
                         "with the strategy it was planned to (see its config.json: "
                         "--strategy distributed --dist-mode ...)")
    if args.memory_budget is not None:
        _budget(args.memory_budget)
    cfg = TrainConfig(**given)
    _check_out(cfg.out, args.force)
    from .data import check_datasets

    check_datasets(cfg)
    cfg, splits, extra = _planned(cfg, args, _pinned(given), nproc=args.nproc)
    mode = cfg.dist_mode
    del splits  # the ranks load their own graphs; this process only waits
    gc.collect()
    release_free_heap()
    with tempfile.TemporaryDirectory(prefix="leangnn-plan-") as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(extra["plan"]))
        return relaunch_cli(args.argv, args.nproc, planned=["--dist-mode", mode],
                            env={PLAN_FILE_ENV: str(path)})


def _budget(value) -> int:
    """``--memory-budget`` read, or a one-line error naming it and the value."""
    from .utils import parse_bytes

    return parse_bytes(value, "--memory-budget")


def _budget_note(cfg, budget) -> None:
    from .utils import format_bytes

    if cfg.memory_budget is None:
        print(f"leangnn: note: no --memory-budget; planning for the free memory "
              f"of {cfg.device} now, {format_bytes(budget)}", file=sys.stderr)


def _planned(cfg, args, pinned: dict, nproc: int | None = None):
    """Plan ``cfg`` (strategy ``auto``; a job of ``nproc`` processes), print
    the table (stderr) and return the pick's configuration, the loaded graphs
    and the summary's plan."""
    import torch

    from .data import load_graphs
    from .plan.planner import (
        choose,
        format_table,
        plan_candidates,
        plan_config,
        plan_summary,
        resolve_budget,
    )
    from .utils import get_rng_state, set_rng_state

    budget = resolve_budget(cfg.memory_budget, torch.device(cfg.device))
    plan_candidates(cfg, budget, None, None, pinned, nproc)  # before loading
    _budget_note(cfg, budget)
    if args.model is None and not str(cfg.dataset or "") \
            .startswith("csbm:"):
        print(f"leangnn: note: --strategy auto plans the generic deep models "
              f"(here {cfg.model!r}); on circuits the default `--strategy full` "
              "trains the DAG model, the best one, in O(N x C) memory at any "
              "depth", file=sys.stderr)
    splits = load_graphs(cfg, progress=not args.quiet)
    rng = get_rng_state()  # planning must not shift the run's seeded streams
    try:
        # lazy: only the rows the pick needs (12 s -> 0.7 s on the default run)
        # (without nproc the pick trains here, after the plan's dry runs)
        table = plan_config(cfg, splits, budget, lazy=True, pinned=pinned,
                            nproc=nproc, in_process=nproc is None,
                            progress=not args.quiet)
    finally:
        set_rng_state(rng)
    if not args.quiet:
        print(format_table(table), file=sys.stderr)
    row = choose(table)
    resolved = row.apply(cfg)
    d = resolved.to_dict()
    d["memory_budget"] = cfg.memory_budget or str(budget)
    return TrainConfig.from_dict(d), splits, {"plan": plan_summary(table)}


def _given(args) -> dict:
    """The configuration fields the command line sets (``leangnn plan`` has
    no flags for some)."""
    return {field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items()
            if getattr(args, flag, None) is not None}


def _pinned(given: dict) -> dict:
    """The fields of ``given`` that pin the planner's grid."""
    from .plan.planner import PINNABLE

    return {k: v for k, v in given.items() if k in PINNABLE}


def _plan_line(summary: dict) -> str:
    from .utils import format_bytes

    p = summary["plan"]
    mem, t = summary["memory"]["peak_bytes"], summary["time"]["epoch_seconds_median"]
    ranks = (summary.get("distributed") or {}).get("records_per_rank")
    if p.get("ranks") and ranks:
        # the estimate is the largest rank's: so is the measurement
        mem = max((r.get("run_peak_bytes", 0) for rec in ranks for r in rec),
                  default=mem)
    est_t = p.get("estimated_epoch_seconds")
    threads = (summary.get("env") or {}).get("num_threads") or 1
    # the time terms are calibrated on one thread (its CPU time); say so where
    # the run had more, whose epochs are shorter
    one = " for one thread" if threads > 1 and est_t is not None and not ranks \
        and str(p.get("device", "cpu")).startswith("cpu") else ""

    def sec(v):
        return "n/a" if v is None else f"{v:.3g} s"

    return (f"planned {p.get('pick')} for {format_bytes(p['memory_budget_bytes'])}: "
            f"estimated peak {format_bytes(p.get('estimated_run_bytes') or 0)}, "
            f"measured {format_bytes(mem or 0)}; epoch estimated {sec(est_t)}{one}, "
            f"measured {sec(t)} on {threads} thread{'s' if threads > 1 else ''}")


def _over_budget_line(summary: dict) -> str | None:
    """One line when the planned run needed more than its budget (the
    planner's estimate of a CPU heap can miss; the run itself finished)."""
    from .utils import format_bytes

    c = summary.get("budget_check")
    if not c or c["within_budget"]:
        return None
    est = c.get("estimated_need_bytes")
    return (f"this run needed ~{format_bytes(c['measured_need_bytes'])} (its peak "
            f"plus the model, the graph and what its setup keeps), above "
            f"--memory-budget "
            f"{format_bytes(c['memory_budget_bytes'])}; the planner estimated "
            f"{format_bytes(est) if est is not None else 'n/a'}. summary.json "
            "records both under budget_check; a lower --memory-budget leaves "
            "the planner more margin")


def _plan(args) -> int:
    import torch

    from .data import check_datasets, load_graphs
    from .plan.planner import (
        choose,
        format_table,
        plan_candidates,
        plan_config,
        resolve_budget,
    )

    budget = None if args.memory_budget is None else _budget(args.memory_budget)
    given = _given(args)
    only = given.pop("strategy", None)
    given.pop("memory_budget", None)
    pinned = _pinned(given)
    # offload's device budget is a row's knob, which the base configuration
    # of a plan (strategy auto) refuses; the other pinned knobs it checks
    given.pop("device_budget", None)
    cfg = TrainConfig(**given, strategy=AUTO)
    check_datasets(cfg)
    strategies = None if only is None else (only,)
    noted = budget is None
    if noted:
        budget = resolve_budget(None, torch.device(cfg.device))
    plan_candidates(cfg, budget, None, strategies, pinned, args.nproc)  # before loading
    if noted:
        _budget_note(cfg, budget)
    splits = load_graphs(cfg, progress=not (args.quiet or args.json))
    table = plan_config(cfg, splits, budget, strategies=strategies, pinned=pinned,
                        nproc=args.nproc, progress=not (args.quiet or args.json))
    print(table.to_json() if args.json else format_table(table))
    choose(table)  # nothing fits: the one-line error, exit 2
    return 0


_PREDICT_SUFFIXES = (".csv", ".json")


def _predict(args) -> int:
    from .predict import (
        UNITS,
        format_table,
        netlist_graph,
        open_run,
        prediction_table,
        write_predictions,
    )

    out = Path(args.out) if args.out else None
    if out is not None:
        if out.suffix.lower() not in _PREDICT_SUFFIXES:
            raise ValueError(f"--out: expected a .csv or .json file, got {args.out!r}")
        if out.is_dir():
            raise ValueError(f"--out: {args.out!r} is a directory")
        _check_writable(out.parent, args.out)  # before the work, not after it
        from .rundir import RunDir

        if out.name in RunDir.FILES and \
                out.resolve().parent == Path(args.run).resolve():
            raise ValueError(f"--out: {args.out!r} is the run's own {out.name}, "
                             "which predictions would overwrite; choose another file")
    infos = _resolve(args.netlists, "NETLIST")
    run = open_run(args.run, args.device)
    if not run.finished:
        print(f"leangnn: note: {run.path} has no summary.json (run in progress or "
              "stopped); using its latest checkpoint", file=sys.stderr)
    cols, rows = None, []
    for info in infos:
        data, names = netlist_graph(info, run.config.level_feature)
        cols, part = prediction_table(run, info.name, names, run.predict(data))
        rows += part
    if out is not None:
        try:
            write_predictions(out, run, cols, rows)
        except OSError as e:  # e.g. a file system that refuses it after all
            raise ValueError(f"--out: cannot write {args.out!r} "
                             f"({e.strerror or e})") from None
        print(f"leangnn predict: {len(rows)} nets of {len(infos)} circuit(s) -> "
              f"{out}", file=sys.stderr)
        return 0
    print(f"# {run.describe()}")
    print(f"# {run.task}: {UNITS.get(run.task, 'the label as trained')}")
    print(format_table(cols, rows))
    return 0


def _resolve(names, option: str):
    """The circuits ``names`` give, errors naming ``option``."""
    from .circuits import NetlistError, resolve

    try:
        infos = resolve(names)
    except NetlistError:
        raise  # names its file already
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None
    if not infos:
        raise ValueError(f"{option}: {names!r} names no circuit")
    return infos


def _evaluate(args) -> int:
    from .predict import metrics_line, open_run

    infos = _resolve(args.dataset, "--dataset")
    run = open_run(args.run, args.device)
    if args.task is not None and args.task != run.task:
        raise ValueError(f"--task: the run at {str(run.path)!r} was trained for "
                         f"task {run.task!r}, got {args.task!r}")
    if not run.finished:
        print(f"leangnn: note: {run.path} has no summary.json (run in progress or "
              "stopped); using its latest checkpoint", file=sys.stderr)
    graphs = run.load(infos, progress=not (args.quiet or args.json))
    metrics = run.evaluate(graphs)
    if args.json:
        print(json.dumps(metrics, indent=2))
        return 0
    nodes = sum(g.num_nodes for g in graphs)
    print(f"leangnn evaluate: {metrics_line(metrics)} | {len(graphs)} circuit(s), "
          f"{nodes:,} nodes | {run.describe()}")
    return 0


def _default(field: str) -> str:
    from .config import SIZE_DEFAULTS
    from .nn.models import MODELS

    value = {f.name: f.default for f in fields(TrainConfig)}[field]
    if field in SIZE_DEFAULTS:
        own = ", ".join(
            [f"{m}: {e.defaults[field]}" for m, e in MODELS.items()
             if field in e.defaults]
            + [f"{m} on {t}: {d[field]}" for m, e in MODELS.items()
               for t, d in e.defaults.get("tasks", {}).items() if field in d])
        return f"(default: {SIZE_DEFAULTS[field]}" + (f"; {own})" if own else ")")
    return f"(default: {value})"


def _config_options(a, plan: bool = False) -> None:
    """The options naming a run's configuration (dataset, model, sizes,
    strategy knobs), shared by ``train`` and ``plan``; ``a`` is a parser's
    ``add_argument``."""
    from .circuits import TASKS
    from .nn.models import CONVS, MODELS
    from .strategy import STRATEGIES, option_choices

    a("--dataset", help="training circuits: suite/name, suite, path or csbm:N, "
      "comma-separated (default: the bundled default split)")
    a("--val-dataset", help="validation circuits (default: held out from training)")
    a("--test-dataset", help="test circuits, never seen in training")
    a("--task", choices=list(TASKS), help=f"label to learn {_default('task')}")
    if plan:
        from .plan.planner import PLANNED

        a("--strategy", choices=list(PLANNED),
          help="only this strategy's rows (default: every strategy's)")
    else:
        a("--strategy", choices=[*STRATEGIES, AUTO],
          help=f"memory strategy; auto: the planner's pick for --memory-budget "
          f"{_default('strategy')}")
    a("--memory-budget", help="the memory to plan for, e.g. 4GiB (default: the "
      "device's free memory now)" + ("" if plan else "; with --strategy auto"))
    defaults = ", ".join(f"{n}: {e.default_model}" for n, e in STRATEGIES.items())
    defaults += f", auto: {AUTO_MODEL}"
    a("--model", choices=list(MODELS), help=f"model (default per strategy: "
      f"{defaults})")
    a("--conv", choices=list(CONVS),
      help=f"conv inside deep models {_default('conv')}")
    from .nn.dag import AGGRS

    a("--aggr", choices=list(AGGRS), help="dag model: fanin aggregator "
      f"{_default('aggr')}")
    a("--rounds", type=int, help="dag model: forward (+ reverse) passes "
      f"{_default('rounds')}")
    a("--reverse", action=argparse.BooleanOptionalAction, default=None,
      help="dag model: reverse pass over fanouts (default: the task's: on for "
      "arrival and critical, off for signal_prob)")
    a("--layers", type=int, help=f"number of layers {_default('num_layers')}")
    a("--hidden", type=int, help=f"hidden channels {_default('hidden_channels')}")
    a("--dropout", type=float, help=f"dropout {_default('dropout')}")
    a("--epochs", type=int, help=f"epochs {_default('epochs')}")
    a("--lr", type=float, help=f"learning rate {_default('lr')}")
    a("--weight-decay", type=float,
      help=f"Adam weight decay {_default('weight_decay')}")
    a("--clip-norm", type=float, help="gradient clipping norm, 0 disables "
      f"{_default('clip_norm')}")
    a("--patience", type=int, help="early-stopping patience in epochs, 0 disables "
      f"{_default('patience')}")
    a("--seed", type=int, help=f"random seed {_default('seed')}")
    a("--device", help=f"cpu, cuda or cuda:i {_default('device')}")
    a("--level-feature", action="store_true", default=None,
      help="add logic level / depth as a node feature")
    a("--groups", type=int, help="gsr / res models: channel groups "
      f"{_default('num_groups')}")
    a("--sparsity", type=int, help="gsr / res models: activations kept per group "
      "(default: all, i.e. ReLU)")
    a("--no-flat-parameters", dest="flat_parameters", action="store_false",
      default=None, help="reversible: keep per-module parameters instead of one "
      "flat tensor (the off switch; more memory at depth)")
    a("--budget-ratio", type=float, help="prune: share of nodes in the core "
      f"{_default('budget_ratio')}")
    a("--anchors", type=int,
      help=f"prune: anchors per pruned node {_default('num_anchors')}")
    a("--decoder", choices=option_choices("decoder"),
      help="prune: pruned nodes' reconstruction: auto (the trained decoder only "
      "where it lowers the validation error by more than --decoder-min-gain, "
      "else anchor averaging: trades accuracy for serving time), learned, "
      f"average {_default('decoder')}")
    a("--decoder-min-gain", type=float, help="prune, --decoder auto: least "
      "absolute drop of the validation error that keeps the decoder (0.01 = "
      f"one point of accuracy) {_default('decoder_min_gain')}")
    a("--device-budget", help="offload: device memory budget, e.g. 2GiB "
      "(default: the offload strategy's)")
    a("--parts", type=int, help=f"offload: number of partitions "
      f"{_default('num_parts')}")
    a("--cache", choices=option_choices("cache"),
      help=f"offload: device cache policy {_default('cache')}; auto = st on "
      "CUDA, none on a CPU device")
    a("--offload-mode", choices=option_choices("offload_mode"),
      help="offload: exact engine or the subgraph-recompute baseline "
      f"{_default('offload_mode')}")
    a("--retain", action=argparse.BooleanOptionalAction, default=None,
      help="offload: backward through the forward's kept graphs when the budget "
      "holds them all (default: on; falls back to recomputing by itself when "
      "it does not); --no-retain always recomputes")
    a("--dist-mode", choices=option_choices("dist_mode"),
      help=f"distributed: graph parallel (one big graph split over the ranks), "
      f"data parallel (graphs split over the ranks) or auto {_default('dist_mode')}")
    a("--dist-timeout", type=float, help="distributed: seconds a rank waits for a "
      f"dead or stuck peer before the job fails {_default('dist_timeout')}")


def build_parser() -> argparse.ArgumentParser:
    """The ``leangnn`` parser; choices come from the registries at call time,
    so strategies and models registered before it are offered."""
    from .circuits import TASKS

    p = _Parser(
        prog="leangnn",
        description="Train GNNs that are too deep or too large for the memory at "
                    "hand, on real circuit graphs or your own netlists.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("datasets", help="list the bundled circuits with their figures")
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    d.set_defaults(func=_datasets)

    t = sub.add_parser("train", help="train a model and write a run directory")
    a = t.add_argument
    _config_options(a)
    a("--out", help="run directory (default: runs/<time>-<strategy>-<model>-L<L>)")
    a("--resume", action="store_true", help="continue the run in --out from its "
      "checkpoint")
    a("--force", action="store_true", help="start a fresh run in an --out that "
      "holds an old run (which is overwritten)")
    a("--nproc", type=int, help="run --strategy distributed on this many local "
      "processes (or launch with torchrun --nproc-per-node P -m leangnn train "
      "--strategy distributed ...)")
    a("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=_train)

    pl = sub.add_parser("plan", help="will it fit? every strategy's estimated "
                        "memory and epoch time for a budget, and the pick")
    a = pl.add_argument
    _config_options(a, plan=True)
    a("--json", action="store_true", help="print the table as JSON")
    a("--nproc", type=int, help="plan a job of this many local processes "
      "(--strategy distributed): each rank's need, summed on a CPU")
    a("--quiet", action="store_true", help="no progress bars")
    pl.set_defaults(func=_plan)

    pr = sub.add_parser("predict", help="apply a trained run to netlists (no labels "
                        "needed): one row per net")
    pr.add_argument("--run", required=True, help="the run directory (train --out)")
    pr.add_argument("netlists", nargs="+", metavar="NETLIST",
                    help="suite/name, suite or netlist file (.v, .bench, .aag, "
                    ".aig, .blif)")
    pr.add_argument("--out", help="write predictions to FILE.csv or FILE.json "
                    "(default: a table on stdout)")
    pr.add_argument("--device", default="cpu", help="cpu, cuda or cuda:i "
                    "(default: cpu)")
    pr.set_defaults(func=_predict)

    e = sub.add_parser("evaluate", help="score a trained run on other circuits")
    e.add_argument("--run", required=True, help="the run directory (train --out)")
    e.add_argument("--dataset", required=True, help="circuits to score: suite/name, "
                   "suite or path, comma-separated")
    e.add_argument("--task", choices=list(TASKS), help="refuse unless the run was "
                   "trained for this task (default: the run's task)")
    e.add_argument("--json", action="store_true", help="print the metrics as JSON")
    e.add_argument("--device", default="cpu", help="cpu, cuda or cuda:i "
                   "(default: cpu)")
    e.add_argument("--quiet", action="store_true", help="no progress bars")
    e.set_defaults(func=_evaluate)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user can cause: bad values (``ValueError``, which
    ``NetlistError``, ``ConfigError`` and JSON errors are), files
    (``OSError``) and runs too large for memory. Anything else is a bug and
    keeps its traceback."""
    import torch

    from .distributed.runtime import DistributedError

    return (ValueError, OSError, MemoryError, torch.OutOfMemoryError,
            DistributedError)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        text = f"out of memory: {text}"
    return text


def _stdout_gone() -> bool:
    """Whether stdout's reader has left; if so stdout is pointed at devnull,
    so that the interpreter's last flush does not fail once more."""
    import select

    try:
        # the write end of a pipe without readers polls as an error
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        if not any(ev & select.POLLERR for _, ev in poller.poll(0)):
            return False
    except (AttributeError, OSError, ValueError):  # no poll, no real stdout
        return False
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return True


#: options whose value is a size: a value after them that starts with a
#: single ``-`` (``-1GiB``, ``-nan``) is theirs (every other option of ours
#: starts with ``--``, or is ``-h``), so the size check names it, not
#: argparse's "expected one argument"
_SIZE_OPTIONS = ("--memory-budget", "--device-budget")


def _attach_sizes(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if argv[i] in _SIZE_OPTIONS and nxt.startswith("-") and \
                not nxt.startswith("--") and nxt != "-h":
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the ``leangnn`` command line; returns the exit status (2: an
    error the user can fix, printed as one ``leangnn: error: ...`` line)."""
    errors = _user_errors()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(_attach_sizes(argv))
        args.argv = argv
        return args.func(args)
    except KeyboardInterrupt:
        return interrupted()
    except Exception as e:
        if raised_by_interrupt(e):  # e.g. one wrapped by a class's creation
            return interrupted()
        if isinstance(e, BrokenPipeError):
            if not _stdout_gone():  # a pipe of its own (e.g. a peer's socket)
                print(f"leangnn: error: {_one_line(e)}", file=sys.stderr)
                return 2
            # `leangnn predict ... | head`: the reader left; stop quietly as
            # Unix tools do (128 + SIGPIPE), not with "error: [Errno 32]
            # Broken pipe"
            return 141
        if isinstance(e, (UsageError, *errors)):
            print(f"leangnn: error: {_one_line(e)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
