"""Real training epochs measured the way the Trainer measures them.

What the planner's estimates are calibrated on and checked against: the
Trainer's loop (the seeded graph order, ``zero_grad``, ``strategy.train_batch``
per step, gradient clipping, an Adam step, the strategy's epoch hooks) with
the model, strategy and optimizer built as :class:`~leangnn.train.Trainer`
builds them, after ``strategy.setup``.
Memory is :class:`~leangnn.profile.MemoryMeter`'s peak above the loaded state
(CPU: peak RSS; CUDA: ``max_memory_allocated``, plus ``max_memory_reserved``)
over the first epoch, the one that also allocates the gradients and Adam
moments; time is the second (warm) epoch. :func:`measure_fresh` runs it in a
fresh interpreter, so nothing else is in the figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

# (glibc's threshold pinned at 64 KiB, spelled in leangnn.heap with the others)
from leangnn.heap import MMAP_ENV

__all__ = ["measure", "measure_fresh", "measure_trainer", "MMAP_ENV"]



def _epoch(model, strategy, optimizer, graphs, loss_fn, clip_norm, epoch: int,
           seed: int) -> None:
    # The Trainer's loop (leangnn.train.Trainer._train_epoch): the same seeded
    # graph order, the strategy's epoch hooks and optimizer steps.
    model.train()
    order = torch.randperm(len(graphs), generator=torch.Generator().manual_seed(
        seed * 100003 + epoch)).tolist()
    strategy.epoch_start(epoch)
    for batch in strategy.epoch_batches(order):
        optimizer.zero_grad(set_to_none=True)
        strategy.train_batch(model, [graphs[i] for i in batch], loss_fn)
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
    strategy.epoch_end(epoch)


def measure(cfg, splits=None, epochs: int = 2, live: bool = False) -> dict[str, Any]:
    """Train ``cfg`` for ``epochs`` epochs (no validation, no files) and measure.

    Args:
        cfg (TrainConfig or dict): the run.
        splits (GraphSplits, optional): graphs (default: ``cfg``'s).
        epochs (int, optional): epochs; the first is measured for memory,
            the last for time. (default: ``2``)
        live (bool, optional): also count the first epoch's live tensor bytes
            with :class:`~leangnn.profile.LiveBytesMeter` (slower; CPU).
            (default: ``False``)

    Returns:
        ``{"run_bytes", "method", "baseline_bytes", "reserved_bytes",
        "live_bytes", "epoch_seconds": [...], "setup_seconds"}``.
    """
    from leangnn.config import TrainConfig
    from leangnn.data import load_graphs
    from leangnn.nn.models import build_model
    from leangnn.plan.estimate import default_loss, largest_graph
    from leangnn.profile import LiveBytesMeter, MemoryMeter
    from leangnn.strategy import build_strategy
    from leangnn.utils import seed_everything

    if isinstance(cfg, dict):
        cfg = TrainConfig.from_dict(cfg)
    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    splits = splits or load_graphs(cfg, progress=False)
    device = torch.device(cfg.device)
    model = build_model(cfg.model, splits.in_channels, cfg.hidden_channels,
                        splits.out_channels, cfg.num_layers,
                        **cfg.model_options()).to(device)
    strategy = build_strategy(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr,
                                 weight_decay=cfg.weight_decay)
    loss_fn = default_loss(largest_graph(splits.train))
    strategy.setup(model, splits.train)
    setup_s = time.perf_counter() - t0
    out: dict[str, Any] = {"setup_seconds": setup_s, "epoch_seconds": [],
                           "live_bytes": None, "reserved_bytes": None}
    for epoch in range(epochs):
        meter = MemoryMeter(device).start() if epoch == 0 else None
        lm = None
        if epoch == 0 and live:
            lm = LiveBytesMeter(exclude=[*model.parameters(), *_tensors(splits)])
            lm.__enter__()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        try:
            _epoch(model, strategy, optimizer, splits.train, loss_fn, cfg.clip_norm,
                   epoch, cfg.seed)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        finally:
            if lm is not None:
                lm.__exit__(None, None, None)
        out["epoch_seconds"].append(time.perf_counter() - t)
        if meter is not None:
            report = meter.stop()
            out.update(run_bytes=report.peak_bytes, method=report.method,
                       baseline_bytes=report.baseline_bytes)
            if device.type == "cuda":
                out["reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
        if lm is not None:
            out["live_bytes"] = lm.peak
    return out


def _tensors(splits) -> list:
    return [v for g in splits.train for v in g.to_dict().values()
            if isinstance(v, torch.Tensor)]


def _setup(cfg: dict, epochs: int, live: bool, threads: int | None):
    if threads:
        torch.set_num_threads(threads)
    return cfg, epochs, live


def _run(state) -> dict:
    cfg, epochs, live = state
    return measure(cfg, epochs=epochs, live=live)


def _heap_env(mmap: bool) -> dict[str, str]:
    """This process's environment for a measured child: glibc's fixed mmap
    threshold (:data:`MMAP_ENV`, no compact-heap tunables) with ``mmap``,
    else this process's heap mode (:func:`leangnn.heap.heap_mode`: default
    or compact) without it."""
    from leangnn.heap import heap_env

    if mmap:
        return heap_env("mmap")
    return {k: v for k, v in os.environ.items() if k not in MMAP_ENV}


def measure_fresh(cfg, epochs: int = 2, live: bool = False, mmap: bool = False,
                  threads: int | None = None, timeout: float | None = None
                  ) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter (``spawn``), optionally with
    glibc's fixed mmap threshold (:data:`MMAP_ENV`).

    Raises:
        RuntimeError: the run failed or was killed (e.g. out of memory).
        TimeoutError: it took longer than ``timeout`` seconds.
    """
    from leangnn.profile import measure_in_subprocess

    d = cfg if isinstance(cfg, dict) else cfg.to_dict()
    # (read by the child's glibc when it starts)
    with mock.patch.dict(os.environ, _heap_env(mmap), clear=True):
        result, _ = measure_in_subprocess(
            _setup, _run, {"cfg": d, "epochs": epochs, "live": live,
                           "threads": threads}, device=d.get("device", "cpu"),
            timeout=timeout)
    return result


_TRAINER = """
import json, sys
from leangnn.config import TrainConfig
from leangnn.train import Trainer
Trainer(TrainConfig.from_dict(json.loads(sys.argv[1])), progress=False).fit()
"""


def _cli_argv(d: dict[str, Any]) -> list[str]:
    """``leangnn train`` options that set configuration ``d``'s fields: each
    field with an option of its own and a value other than its default,
    spelled as the command's parser spells it (``--layers``, ``--no-retain``)."""
    import argparse

    from leangnn.cli import _TRAIN_FLAGS, build_parser
    from leangnn.config import TrainConfig

    train = next(a for a in build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["train"]
    options = {a.dest: a for a in train._actions if a.option_strings}
    # the defaults of this model, task and dataset: the sizes are the model's
    # own (SAGE 8 layers and 64 channels, the DAG model 2 and 32), so a value
    # at another model's default must still be spelled out
    given = ("model", "task", "dataset")  # named even at their defaults
    default = TrainConfig(**{k: d[k] for k in given
                             if d.get(k) is not None}).to_dict()
    argv = []
    for dest, name in _TRAIN_FLAGS.items():
        value, action = d.get(name), options[dest]
        if value is None or value == default.get(name) and name not in given:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(action.option_strings[0 if value else 1])  # --x / --no-x
        elif isinstance(value, bool):
            # store_true / store_false: off its default, the option sets it
            argv.append(action.option_strings[0])
        else:
            argv += [action.option_strings[0], str(value)]
    return argv


def measure_trainer(cfg, epochs: int = 3, threads: int | None = 1,
                    mmap: bool = False, timeout: float | None = None,
                    planned: bool = False) -> dict[str, Any]:
    """Train ``cfg`` with :class:`~leangnn.train.Trainer` in a fresh
    interpreter, as ``leangnn train`` does (run directory, validation,
    checkpoints), and read its ``summary.json``.

    What the planner's estimates are calibrated on: the figures a user sees
    (the Trainer's meter over training, validation and checkpoints), not a
    harness's. ``threads`` pins ``OMP_NUM_THREADS`` (default 1): on a shared
    machine a second OpenMP thread spin-waits for a busy core and an epoch's
    wall time varies tenfold; one thread's is its CPU time.

    ``planned`` trains it as ``leangnn train --strategy auto`` does: planned
    in the process that trains (the pick must be ``cfg``'s strategy and
    model), for :attr:`~leangnn.plan.calibration.Calibration.in_process_bytes`.

    Returns:
        ``{"run_bytes", "method", "baseline_bytes", "epoch_seconds": [...],
        "epoch_cpu_seconds": [...], "epoch_peak_bytes": [...]}`` (every
        epoch's wall and CPU seconds and the run's peak after it,
        in order; with one thread the CPU time is what an idle machine's
        wall time would be).

    Raises:
        RuntimeError: the run failed (its last error line).
        subprocess.TimeoutExpired: it took longer than ``timeout`` seconds.
    """
    from leangnn.heap import heap_env, heap_mode

    d = cfg if isinstance(cfg, dict) else cfg.to_dict()
    # (the command re-executes itself into the compact heap unless told not to)
    env = heap_env(heap_mode()) if planned and not mmap else _heap_env(mmap)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="leangnn-measure-") as tmp:
        out = Path(tmp) / "run"
        run = {**d, "epochs": epochs, "out": str(out)}
        argv = [sys.executable, "-c", _TRAINER, json.dumps(run)]
        if planned:
            argv = [sys.executable, "-m", "leangnn", "train", *_cli_argv(
                {**run, "strategy": "auto"}), "--quiet"]
        p = subprocess.run(argv, env=env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            lines = p.stderr.strip().splitlines() or [f"exit {p.returncode}"]
            raise RuntimeError(f"training {d.get('strategy')}/{d.get('model')} "
                               f"failed: {lines[-1]}")
        summary = json.loads((out / "summary.json").read_text())
        if planned and (summary.get("strategy"), summary.get("model")) != (
                d.get("strategy"), d.get("model")):
            raise RuntimeError(
                f"planned {d.get('strategy')}/{d.get('model')}: the plan picked "
                f"{summary.get('strategy')}/{summary.get('model')} instead")
        records = [json.loads(line) for line in
                   (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [r["epoch_seconds"] for r in records]
    cpu = [r["epoch_cpu_seconds"] for r in records]
    mem = summary["memory"]
    return {"run_bytes": mem["peak_bytes"], "method": mem["method"],
            "baseline_bytes": mem["baseline_bytes"],
            "setup_bytes": mem.get("setup_bytes"), "epoch_seconds": times,
            "epoch_cpu_seconds": cpu,
            "epoch_peak_bytes": [r.get("peak_bytes") for r in records]}
