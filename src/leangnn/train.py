"""``Trainer``: the one training loop every memory strategy plugs into.

Full-batch training over a list of graphs (one optimizer step per graph and
epoch), validation-based early stopping, gradient clipping, seeding (same seed,
same CPU metrics at the same thread count), evaluation and measurement (peak
memory, bytes saved for backward, epoch times). Every file of a run (config,
metrics, checkpoints, summary, lock) belongs to :class:`~leangnn.rundir.RunDir`;
``Trainer(..., record=False)`` runs the same loop in memory, with no files.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data

from .config import TrainConfig
from .data import GraphSplits, check_splits, load_graphs, split_masks
from .metrics import compute_metrics, load_backends
from .nn.models import build_model
from .plan.fits import check_fits
from .profile import (
    MemoryMeter,
    SavedTensorsMeter,
    release_free_heap,
    resident_growth,
    trim_heap_enabled,
)
from .rundir import RunDir, environment
from .strategy import Strategy, build_strategy, node_mask
from .utils import (
    format_bytes,
    get_rng_state,
    json_safe,
    seed_everything,
    set_rng_state,
)

__all__ = ["Trainer", "build_strategy", "evaluate_graphs", "make_loss_fn", "RESUMABLE"]

#: Config fields a resumed run may change; the others must match its checkpoint.
RESUMABLE = ("epochs", "patience", "device", "out")


def make_loss_fn(task_type: str):
    """Task loss on the nodes of ``data.node_mask`` (all nodes when absent)."""

    def loss_fn(out: Tensor, data: Data) -> Tensor:
        y = data.y.to(out.device)
        mask = node_mask(data)
        if mask is not None:
            mask = mask.to(out.device)
            out, y = out[mask], y[mask]
        if task_type == "classification":
            return F.cross_entropy(out, y)
        return F.mse_loss(out.reshape(-1), y.reshape(-1).to(out.dtype))

    return loss_fn


def _check_fits(cfg: TrainConfig, splits: GraphSplits | None) -> None:
    # The estimate must not shift the seeded streams the model is drawn from.
    rng = get_rng_state()
    try:
        check_fits(cfg, splits)
    finally:
        set_rng_state(rng)


def _scored(g: Data) -> bool:
    mask = node_mask(g)
    return g.num_nodes > 0 and (mask is None or bool(mask.any()))


def evaluate_graphs(model: torch.nn.Module, strategy: Strategy, graphs: list[Data],
                    loss_fn, task_type: str) -> dict[str, float | None]:
    """Metrics and mean per-graph loss of ``model`` served by ``strategy`` over
    the (masked) nodes of ``graphs``, pooled; every value is ``None`` when the
    graphs hold no node to score. The one evaluation of training, ``predict``
    and ``evaluate``."""
    model.eval()
    preds, ys, losses = [], [], []
    with torch.no_grad():
        for g in filter(_scored, graphs):
            out = strategy.predict(model, g).float().cpu()
            losses.append(float(loss_fn(out, g)))
            mask = node_mask(g)
            preds.append(out if mask is None else out[mask])
            ys.append(g.y if mask is None else g.y[mask])
    if not ys:
        empty = torch.empty(0)
        return {**compute_metrics(empty, empty, task_type), "loss": None}
    m = compute_metrics(torch.cat(preds), torch.cat(ys), task_type)
    m["loss"] = float(np.mean(losses))
    return m


class Trainer:
    """Train, validate, test and record one run.

    Args:
        config (TrainConfig): the run's configuration.
        splits (GraphSplits, optional): graphs to use instead of loading the
            ones ``config`` names.
        progress (bool, optional): show tqdm bars. (default: ``True``)
        record (bool, optional): keep a run directory at ``config.out`` (or
            ``runs/<time>-...``); ``False`` trains in memory through the same
            loop and writes nothing. (default: ``True``)
        strategy (Strategy, optional): a strategy object to train with instead
            of the one ``config.strategy`` names (e.g. a benchmark's baseline
            with options the config has no field for).
        summary_extra (dict, optional): extra top-level entries written into
            ``summary.json`` (e.g. the planner's estimate beside the measured
            figures). (default: ``None``)
        trim_heap (bool, optional): on CPU, hand the C heap's free pages
            back to the OS (:func:`~leangnn.profile.release_free_heap`) after
            every training epoch and validation pass, so validation does not
            stack its peak on the pages the epoch freed but glibc kept (which
            grow with depth for deep reversible stacks). Results are
            unchanged. ``None`` reads ``LEANGNN_TRIM_HEAP`` (``0`` switches
            it off); ``False`` is the off switch. (default: ``None``, i.e. on)
    """

    def __init__(self, config: TrainConfig, splits: GraphSplits | None = None,
                 progress: bool = True, record: bool = True,
                 strategy: Strategy | None = None,
                 summary_extra: dict[str, Any] | None = None,
                 trim_heap: bool | None = None):
        self.cfg = config
        self.trim_heap = trim_heap_enabled(trim_heap)
        self.summary_extra = dict(summary_extra or {})
        self._meter, self._prev_peak = None, 0
        self.progress = progress
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {config.device!r} requested but CUDA is not "
                             "available on this machine")
        seed_everything(config.seed)
        if splits is None:
            _check_fits(config, None)  # e.g. a csbm:N graph that cannot be built
        # given graphs score their split's PyG mask where they have no node_mask
        self.splits = split_masks(splits) if splits is not None else \
            load_graphs(config, progress=progress)
        if not self.splits.train:
            raise ValueError("dataset: no training graphs")
        # NaN / Inf features or labels would train a NaN model without a word
        check_splits(self.splits)
        self.loss_fn = make_loss_fn(self.splits.task_type)
        _check_fits(config, self.splits)
        self.model = build_model(
            config.model, self.splits.in_channels, config.hidden_channels,
            self.splits.out_channels, config.num_layers, **config.model_options(),
        ).to(self.device)
        self.strategy = strategy if strategy is not None else build_strategy(config)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr,
                                          weight_decay=config.weight_decay)
        # In a multi-process job only rank 0 writes and shows progress; every
        # rank still runs the loop, evaluation and summary (they are collective).
        main = bool(getattr(self.strategy, "is_main", True))
        self.progress = progress and main
        self.run = RunDir((config.out or self._default_out())
                          if record and main else None)
        self.out = self.run.path
        # another rank writes the run; this one resumes from its checkpoint
        self._peer_out = None if main or not record else config.out

    def _default_out(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = self.cfg
        return f"runs/{stamp}-{cfg.strategy}-{cfg.model}-L{cfg.num_layers}"

    # ------------------------------------------------------------------ #
    def evaluate(self, graphs: list[Data]) -> dict[str, float | None]:
        """Metrics over all (masked) nodes of ``graphs``, pooled; every value
        is ``None`` when ``graphs`` hold no node to score."""
        return evaluate_graphs(self.model, self.strategy, graphs, self.loss_fn,
                               self.splits.task_type)

    def _state(self, epoch, best, best_state, bad, times) -> dict[str, Any]:
        # Tensors, numbers, strings and lists only: loadable with weights_only.
        return {
            "epoch": epoch, "best": best, "best_state": best_state, "bad_epochs": bad,
            "epoch_times": list(times), "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "strategy": self.strategy.state_dict(), "rng": get_rng_state(),
            "config": json_safe(self.cfg.to_dict()),
            # a resumed run's peak is the largest of its segments'
            "peak_bytes": max(self._prev_peak,
                              self._meter.peak() if self._meter else 0),
        }

    def _restore(self, ckpt: dict[str, Any]) -> None:
        """Load a checkpoint's state; raises (so RunDir falls back) when it
        does not fit this run."""
        saved, now = ckpt.get("config"), self.cfg.to_dict()
        if isinstance(saved, dict):
            diff = [k for k in now if k in saved and k not in RESUMABLE
                    and saved[k] != json_safe(now[k])]
            if diff:
                raise ValueError("written for another configuration (" + ", ".join(
                    f"{k}={saved[k]!r}, now {now[k]!r}" for k in diff[:3]) + ")")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.strategy.load_state_dict(ckpt["strategy"])
        # Applying it checks it; fit() applies it again after strategy.setup.
        set_rng_state(ckpt["rng"])

    def fit(self, resume: bool = False, force: bool = False) -> dict[str, Any]:
        """Run training to the end (or resume it) and return the summary.

        Args:
            resume (bool, optional): continue from the run directory's
                checkpoint (the previous one when the last is damaged).
                (default: ``False``)
            force (bool, optional): a fresh run may overwrite a run directory
                that already holds a run. (default: ``False``)

        Raises:
            leangnn.rundir.RunDirError: the directory is held by another run,
                or holds an old run and neither ``resume`` nor ``force``.
            leangnn.rundir.CheckpointError: ``resume`` finds no usable
                checkpoint (one line naming the files).
        """
        with self.run.open(resume=resume, force=force) as run:
            return self._fit(run, resume)

    def _fit(self, run: RunDir, resume: bool) -> dict[str, Any]:
        from tqdm.auto import tqdm

        cfg = self.cfg
        start, best, best_state, bad, times, rng = 0, float("inf"), None, 0, [], None
        if resume:
            # On the CPU: RNG states must stay there; load_state_dict moves the rest.
            if run.path is None and self._peer_out:
                ckpt = RunDir(self._peer_out).load_checkpoint(
                    self._restore, map_location="cpu", read_only=True)
            else:
                ckpt = run.load_checkpoint(self._restore, map_location="cpu")
            start, best, best_state = ckpt["epoch"], ckpt["best"], ckpt["best_state"]
            bad, times, rng = ckpt["bad_epochs"], list(ckpt["epoch_times"]), ckpt["rng"]
            self._prev_peak = int(ckpt.get("peak_bytes", 0))
            run.truncate_metrics(start)
            saved_plan = run.read_plan()
            if saved_plan is not None and "plan" not in self.summary_extra:
                from leangnn.plan.planner import resumed_plan

                # this process did not plan: it pays what the plan's dry runs
                # had paid in the process that planned
                self.summary_extra["plan"] = resumed_plan(saved_plan)
        run.write_config(cfg)
        if not resume and "plan" in self.summary_extra:
            run.write_plan(self.summary_extra["plan"])

        load_backends()  # its imports are not the run's memory
        # What the setup keeps (offload's engine topology, DPR's core) is
        # resident before the meter starts: measured apart for budget_check.
        # The meter starts from the pages really in use: heap that setup (or
        # a planner in the same process) freed would otherwise be reused
        # unmetered.
        with resident_growth(self._release_heap) as grown:
            self.strategy.setup(self.model, self.splits.train)
            self.device = self.strategy.device  # a rank measures its own device
            if rng is not None:
                # After setup, as in an uninterrupted run, where setup came
                # before the epochs whose random streams the checkpoint
                # continues.
                set_rng_state(rng)
        self._setup_bytes = grown["bytes"] + self.strategy.taken_bytes
        meter = self._meter = MemoryMeter(self.device).start()
        so_far = self._prev_peak
        bar = tqdm(range(start, cfg.epochs), desc=f"train {cfg.strategy}/{cfg.model}",
                   unit="ep", initial=start, total=cfg.epochs,
                   disable=not self.progress, mininterval=1.0)
        stopped = start < cfg.epochs and cfg.patience and bad >= cfg.patience
        for epoch in bar:
            if stopped:
                break
            t0, c0 = time.perf_counter(), time.thread_time()
            train_loss = self._train_epoch(epoch)
            times.append(time.perf_counter() - t0)
            # this thread's CPU seconds: with one intra-op thread the epoch's
            # compute, steady where a shared machine's wall time is not
            cpu = time.thread_time() - c0
            self._check_diverged(epoch, train_loss)
            self._release_heap()
            val = self.evaluate(self.splits.val)
            self._release_heap()
            # Without validation nodes there is nothing to stop on: the last
            # model is kept.
            if val["loss"] is not None:
                if val["loss"] < best - 1e-12:
                    best, bad = val["loss"], 0
                    best_state = {k: v.detach().clone() for k, v in
                                  self.model.state_dict().items()}
                else:
                    bad += 1
            # the run's peak so far (training and validation; a checkpoint's
            # lands in the next epoch's): how a long run's peak creeps up. A
            # running maximum: the kernel's RSS counters lag by a few pages.
            so_far = max(so_far, meter.peak())
            run.append_metrics({"epoch": epoch + 1, "train_loss": train_loss,
                                "val": val, "epoch_seconds": times[-1],
                                "epoch_cpu_seconds": cpu, "peak_bytes": so_far})
            if run.enabled:
                run.save_checkpoint(self._state(epoch + 1, best, best_state, bad,
                                                times))
            bar.set_postfix(loss=f"{train_loss:.4f}", val=f"{val['loss'] or 0:.4f}")
            if cfg.patience and bad >= cfg.patience:
                stopped = True
                break
        bar.close()
        peak = meter.stop()
        peak.peak_bytes = self._prev_peak = max(peak.peak_bytes, so_far)
        self._meter = None
        saved = self._saved_bytes()
        self._release_heap()  # the test pass below would land on top otherwise
        final = None
        if run.enabled and times and self.strategy.trains_at_fit_end:
            # What --resume continues from: the last epoch's weights, before
            # the best ones are loaded below (state_dict tensors alias them).
            # (one entry of ``times`` per epoch run, resumed ones included)
            final = self._state(len(times), best, best_state, bad, times)
            final["model"] = {k: v.detach().clone() for k, v in final["model"].items()}
        if best_state is not None:
            self.model.load_state_dict(best_state)
        self.strategy.fit_end(self.model, self.splits.train, self.loss_fn)
        if final is not None:
            # fit_end may train more (DPR's decoder): predict/evaluate need that
            # state, which the per-epoch checkpoints were written before.
            final["fitted_strategy"] = self.strategy.state_dict()
            run.save_checkpoint(final)
        summary = json_safe(self._summary(peak, saved, times, stopped))
        run.write_summary(summary)
        return summary

    def _check_diverged(self, epoch: int, train_loss: float) -> None:
        """Stop before a model whose weights went NaN / Inf is validated,
        checkpointed or served: every later number would be garbage (a
        diverged run used to finish with null metrics and exit 0)."""
        params = [(n, p.detach()) for n, p in self.model.named_parameters()
                  if p.numel()]
        if not params:
            return
        # amax / amin see NaN and +-Inf; one device sync for all of them
        ok = torch.stack([torch.isfinite(p.amax()) & torch.isfinite(p.amin())
                          for _, p in params])
        if bool(ok.all()):
            return
        name = params[int((~ok).nonzero()[0])][0]
        kept = (f"; {self.run.path} keeps epoch {epoch}'s checkpoint"
                if self.run.enabled and epoch else "")
        raise ValueError(
            f"training diverged in epoch {epoch + 1}: parameter {name!r} is no "
            f"longer finite (train loss {train_loss:.4g}); lower --lr (now "
            f"{self.cfg.lr:g}) or --clip-norm (now {self.cfg.clip_norm or 0:g}){kept}")

    def _release_heap(self) -> None:
        # Measured through `leangnn train` on epfl/multiplier (GSR, hidden 64,
        # 4 groups): without it, validation's peak lands on top of the freed
        # but still resident heap of the epoch, and that grows with depth.
        if self.trim_heap and self.device.type != "cuda":
            release_free_heap()

    def _train_epoch(self, epoch: int) -> float:
        self.model.train()
        order = torch.randperm(len(self.splits.train), generator=torch.Generator()
                               .manual_seed(self.cfg.seed * 100003 + epoch)).tolist()
        losses = []
        self.strategy.epoch_start(epoch)
        for batch in self.strategy.epoch_batches(order):
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(self.strategy.train_batch(
                self.model, [self.splits.train[i] for i in batch], self.loss_fn))
            if self.cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                               self.cfg.clip_norm)
            self.optimizer.step()
        self.strategy.epoch_end(epoch)
        return float(np.mean(losses))

    def _saved_bytes(self) -> int | None:
        """Bytes autograd saves for one training step on the largest graph."""
        if self.cfg.strategy != "full" and self.cfg.strategy != "reversible":
            return None  # the other strategies report their own figures
        g = max(self.splits.train, key=lambda d: d.num_nodes)
        rng = torch.get_rng_state()
        self.model.train()
        with SavedTensorsMeter() as m:
            out = self.strategy.forward(self.model, g)
            loss = self.loss_fn(out, g.to(self.device))
        del out, loss
        torch.set_rng_state(rng)
        return m.bytes

    def _summary(self, peak, saved, times, stopped) -> dict[str, Any]:
        cfg = self.cfg
        test = self.evaluate(self.splits.test)
        summary = {
            "strategy": cfg.strategy, "task": cfg.task, "model": cfg.model,
            "conv": cfg.conv, "num_layers": cfg.num_layers,
            "hidden_channels": cfg.hidden_channels,
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "epochs_run": len(times), "early_stopped": bool(stopped),
            "metrics": {"test": test, "val": self.evaluate(self.splits.val)},
            "memory": {"peak_bytes": peak.peak_bytes, "method": peak.method,
                       "baseline_bytes": peak.baseline_bytes,
                       "setup_bytes": self._setup_bytes,
                       "saved_for_backward_bytes": saved},
            "time": {"epoch_seconds_median": statistics.median(times) if times
                     else None, "epoch_seconds_total": float(sum(times))},
            "data": {"train": [g.name for g in self.splits.train],
                     "val": [g.name for g in self.splits.val],
                     "test": [g.name for g in self.splits.test]},
            "env": environment(),
            "run_dir": None if self.out is None else str(self.out),
        }
        summary.update(self.strategy.summary())
        summary.update(self.summary_extra)
        if "plan" in summary:
            from leangnn.plan.planner import budget_check

            check = budget_check(summary["plan"], peak.peak_bytes, self._setup_bytes)
            if check is not None:
                summary["budget_check"] = check
        return summary

    @staticmethod
    def summary_line(summary: dict[str, Any]) -> str:
        """The one-line result ``leangnn train`` prints."""
        def num(v, fmt):
            return "n/a" if v is None else format(v, fmt)

        t = summary["metrics"]["test"]
        keys = ["accuracy"] if "accuracy" in t else []
        keys += ["pearson", "spearman", "kendall", "mae", "r2"]
        mets = " ".join(f"{k}={num(t[k], '.4f')}" for k in keys if k in t)
        mem = summary["memory"]
        ep = num(summary["time"]["epoch_seconds_median"], ".3f")
        where = f" | {summary['run_dir']}" if summary.get("run_dir") else ""
        return (f"test {mets} | peak {format_bytes(mem['peak_bytes'])} "
                f"({mem['method']}) | {ep} s/epoch median over "
                f"{summary['epochs_run']} epochs{where}")
