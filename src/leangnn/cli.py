"""The ``leangnn`` command line: ``datasets`` and ``train``.

Every error a user can cause (a bad option value, a malformed netlist, a
missing checkpoint) is printed as one ``leangnn: error: ...`` line with exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from .config import STRATEGIES, TrainConfig

__all__ = ["main", "build_parser"]


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
    "dataset": "dataset", "val_dataset": "val_dataset", "test_dataset": "test_dataset",
    "task": "task", "strategy": "strategy", "model": "model", "conv": "conv",
    "layers": "num_layers", "hidden": "hidden_channels", "dropout": "dropout",
    "epochs": "epochs", "lr": "lr", "weight_decay": "weight_decay",
    "clip_norm": "clip_norm", "patience": "patience", "seed": "seed",
    "device": "device", "out": "out", "level_feature": "level_feature",
    "groups": "num_groups", "sparsity": "sparsity",
    "flat_parameters": "flat_parameters", "budget_ratio": "budget_ratio",
    "anchors": "num_anchors", "device_budget": "device_budget", "parts": "num_parts",
    "cache": "cache", "offload_mode": "offload_mode",
}


def _train(args) -> int:
    from .train import Trainer

    given = {field: getattr(args, flag) for flag, field in _TRAIN_FLAGS.items()
             if getattr(args, flag) is not None}
    if args.resume:
        if not args.out:
            raise ValueError("--resume needs --out DIR (the run to continue)")
        saved = Path(args.out) / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"--resume: no run at {args.out} "
                                    f"({saved} is missing)")
        base = TrainConfig.load(saved).to_dict()
        changed = {k: v for k, v in given.items() if base.get(k) != v and k not in
                   ("epochs", "patience", "device", "out")}
        if changed:
            raise ValueError(f"--resume: options {sorted(changed)} differ from the "
                             "saved run; only --epochs, --patience and --device may "
                             "change when resuming")
        base.update(given)
        cfg = TrainConfig.from_dict(base)
    else:
        cfg = TrainConfig(**given)
    trainer = Trainer(cfg, progress=not args.quiet)
    summary = trainer.fit(resume=args.resume)
    print(f"leangnn train: {Trainer.summary_line(summary)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="leangnn",
        description="Train GNNs that are too deep or too large for the memory at "
                    "hand, on real circuit graphs or your own netlists.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("datasets", help="list the bundled circuits with their figures")
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    d.set_defaults(func=_datasets)

    defaults = {f.name: f.default for f in fields(TrainConfig)}
    t = sub.add_parser("train", help="train a model and write a run directory",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = t.add_argument
    a("--dataset", help="training circuits: suite/name, suite, path or csbm:N, "
      "comma-separated (default: the bundled default split)")
    a("--val-dataset", help="validation circuits (default: held out from training)")
    a("--test-dataset", help="test circuits, never seen in training")
    a("--task", choices=["arrival", "signal_prob", "critical"],
      help=f"label to learn (default {defaults['task']})")
    a("--strategy", choices=STRATEGIES, help="memory strategy (default full)")
    a("--model", choices=["res", "gsr", "sage", "gcn", "gat"],
      help="model (default: res for full, gsr for reversible, sage otherwise)")
    a("--conv", choices=["sage", "gcn", "gat", "graph"],
      help=f"conv inside deep models (default {defaults['conv']})")
    a("--layers", type=int, help=f"number of layers (default {defaults['num_layers']})")
    a("--hidden", type=int, help=f"hidden channels (default "
      f"{defaults['hidden_channels']})")
    a("--dropout", type=float, help="dropout (default 0)")
    a("--epochs", type=int, help=f"epochs (default {defaults['epochs']})")
    a("--lr", type=float, help=f"learning rate (default {defaults['lr']})")
    a("--weight-decay", type=float, help="Adam weight decay (default 0)")
    a("--clip-norm", type=float, help="gradient clipping norm, 0 disables (default 1)")
    a("--patience", type=int, help="early-stopping patience in epochs, 0 disables "
      f"(default {defaults['patience']})")
    a("--seed", type=int, help="random seed (default 0)")
    a("--device", help="cpu, cuda or cuda:i (default cpu)")
    a("--out", help="run directory (default runs/<time>-<strategy>-<model>-L<L>)")
    a("--resume", action="store_true", help="continue the run in --out from its "
      "checkpoint")
    a("--level-feature", action="store_true", default=None,
      help="add logic level / depth as a node feature")
    a("--groups", type=int, help="reversible: channel groups (default 4)")
    a("--sparsity", type=int, help="gsr / res models: activations kept per group "
      "(default: all, i.e. ReLU)")
    a("--no-flat-parameters", dest="flat_parameters", action="store_false",
      default=None, help="reversible: keep per-module parameters instead of one "
      "flat tensor (the off switch; more memory at depth)")
    a("--budget-ratio", type=float, help="prune: share of nodes in the core "
      "(default 0.3)")
    a("--anchors", type=int, help="prune: anchors per pruned node (default 8)")
    a("--device-budget", help="offload: device memory budget, e.g. 2GiB")
    a("--parts", type=int, help="offload: number of partitions (default 8)")
    a("--cache", choices=["none", "lru", "degree", "st"],
      help="offload: device cache policy (default st)")
    a("--offload-mode", choices=["exact", "recompute"],
      help="offload: exact engine or the subgraph-recompute baseline (default exact)")
    a("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=_train)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("leangnn: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, OSError) as e:
        # NetlistError is a ValueError and already names file and line.
        print(f"leangnn: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
