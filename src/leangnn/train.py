"""``Trainer``: the one training loop every memory strategy plugs into.

Full-batch training over a list of graphs (one optimizer step per graph and
epoch), validation-based early stopping, gradient clipping, seeding (same seed,
same CPU metrics), tqdm progress and a run directory holding

* ``config.json``: the resolved :class:`~leangnn.config.TrainConfig`;
* ``metrics.jsonl``: one line per epoch;
* ``checkpoint.pt``: model, optimizer, RNG and early-stopping state, written
  atomically after every epoch, from which ``resume=True`` continues exactly;
* ``summary.json``: final metrics, measured peak memory and epoch times.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data

from .config import TrainConfig
from .data import GraphSplits, load_graphs
from .metrics import compute_metrics
from .nn.models import build_model
from .profile import MemoryMeter, SavedTensorsMeter
from .strategy import FullBatch, Strategy, node_mask
from .utils import (
    append_jsonl,
    atomic_torch_save,
    atomic_write_text,
    format_bytes,
    seed_everything,
)

__all__ = ["Trainer", "build_strategy", "make_loss_fn"]


def build_strategy(cfg: TrainConfig) -> Strategy:
    """The :class:`~leangnn.strategy.Strategy` named by ``cfg.strategy``."""
    if cfg.strategy in ("full", "reversible"):
        # Reversibility lives in the model (GSRGNN's fused autograd Function);
        # the loop itself is plain full-batch training.
        return FullBatch(cfg.device)
    if cfg.strategy == "prune":
        from .prune.dpr import DPRStrategy

        return DPRStrategy.from_config(cfg)
    if cfg.strategy == "offload":
        from .offload import OffloadStrategy

        return OffloadStrategy.from_config(cfg)
    raise ValueError(f"strategy: unknown {cfg.strategy!r}")


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


class Trainer:
    """Train, validate, test and record one run.

    Args:
        config (TrainConfig): the run's configuration.
        splits (GraphSplits, optional): graphs to use instead of loading the
            ones ``config`` names.
        progress (bool, optional): show tqdm bars. (default: ``True``)
    """

    def __init__(self, config: TrainConfig, splits: GraphSplits | None = None,
                 progress: bool = True):
        self.cfg = config
        self.progress = progress
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {config.device!r} requested but CUDA is not "
                             "available on this machine")
        seed_everything(config.seed)
        self.splits = splits or load_graphs(config, progress=progress)
        if not self.splits.train:
            raise ValueError("dataset: no training graphs")
        self.loss_fn = make_loss_fn(self.splits.task_type)
        self.model = build_model(
            config.model, self.splits.in_channels, config.hidden_channels,
            self.splits.out_channels, config.num_layers,
            **self._model_kwargs(config)).to(self.device)
        self.strategy = build_strategy(config)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr,
                                          weight_decay=config.weight_decay)
        self.out = Path(config.out or self._default_out())

    @staticmethod
    def _model_kwargs(cfg: TrainConfig) -> dict[str, Any]:
        kw: dict[str, Any] = {"dropout": cfg.dropout}
        if cfg.model in ("res", "gsr"):
            kw["conv"] = cfg.conv
        if cfg.model == "gsr":
            kw.update(num_groups=cfg.num_groups, sparsity=cfg.sparsity,
                      flat_parameters=cfg.flat_parameters)
        elif cfg.model == "res" and cfg.sparsity is not None:
            # ResGNN runs the same blocks; groups only matter for the top-k
            kw.update(num_groups=cfg.num_groups, sparsity=cfg.sparsity)
        return kw

    def _default_out(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = self.cfg
        return f"runs/{stamp}-{cfg.strategy}-{cfg.model}-L{cfg.num_layers}"

    # ------------------------------------------------------------------ #
    def evaluate(self, graphs: list[Data]) -> dict[str, float]:
        """Metrics over all (masked) nodes of ``graphs``, pooled."""
        self.model.eval()
        preds, ys, losses = [], [], []
        with torch.no_grad():
            for g in graphs:
                out = self.strategy.predict(self.model, g).float().cpu()
                losses.append(float(self.loss_fn(out, g)))
                mask = node_mask(g)
                y = g.y if mask is None else g.y[mask]
                preds.append(out if mask is None else out[mask])
                ys.append(y)
        m = compute_metrics(torch.cat(preds), torch.cat(ys), self.splits.task_type)
        m["loss"] = float(np.mean(losses))
        return m

    def _state(self, epoch, best, best_state, bad, times) -> dict[str, Any]:
        return {
            "epoch": epoch, "best": best, "best_state": best_state, "bad_epochs": bad,
            "epoch_times": times, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "strategy": self.strategy.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all()
                    if torch.cuda.is_available() else None},
        }

    def _restore(self, ckpt: dict[str, Any]) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.strategy.load_state_dict(ckpt["strategy"])
        rng = ckpt["rng"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Run training to the end (or resume it) and return the summary."""
        from tqdm.auto import tqdm

        cfg, out = self.cfg, self.out
        out.mkdir(parents=True, exist_ok=True)
        ckpt_path, metrics_path = out / "checkpoint.pt", out / "metrics.jsonl"
        start, best, best_state, bad, times = 0, float("inf"), None, 0, []
        if resume:
            if not ckpt_path.is_file():
                raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_path}")
            ckpt = torch.load(ckpt_path, weights_only=False, map_location=self.device)
            self._restore(ckpt)
            start, best, best_state = ckpt["epoch"], ckpt["best"], ckpt["best_state"]
            bad, times = ckpt["bad_epochs"], ckpt["epoch_times"]
            self._truncate_metrics(metrics_path, start)
        else:
            metrics_path.write_text("")
        cfg.save(out / "config.json")

        self.strategy.setup(self.model, self.splits.train)
        meter = MemoryMeter(self.device).start()
        bar = tqdm(range(start, cfg.epochs), desc=f"train {cfg.strategy}/{cfg.model}",
                   unit="ep", initial=start, total=cfg.epochs,
                   disable=not self.progress, mininterval=1.0)
        stopped = start < cfg.epochs and cfg.patience and bad >= cfg.patience
        for epoch in bar:
            if stopped:
                break
            t0 = time.perf_counter()
            train_loss = self._train_epoch(epoch)
            times.append(time.perf_counter() - t0)
            val = self.evaluate(self.splits.val)
            improved = val["loss"] < best - 1e-12
            if improved:
                best, bad = val["loss"], 0
                best_state = {k: v.detach().clone() for k, v in
                              self.model.state_dict().items()}
            else:
                bad += 1
            append_jsonl(metrics_path, {"epoch": epoch + 1, "train_loss": train_loss,
                                        "val": val, "epoch_seconds": times[-1]})
            atomic_torch_save(self._state(epoch + 1, best, best_state, bad, times),
                              ckpt_path)
            bar.set_postfix(loss=f"{train_loss:.4f}", val=f"{val['loss']:.4f}")
            if cfg.patience and bad >= cfg.patience:
                stopped = True
                break
        bar.close()
        peak = meter.stop()
        saved = self._saved_bytes()
        if best_state is not None:
            self.model.load_state_dict(best_state)
        self.strategy.fit_end(self.model, self.splits.train, self.loss_fn)
        summary = self._summary(peak, saved, times, stopped)
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary

    def _train_epoch(self, epoch: int) -> float:
        self.model.train()
        order = torch.randperm(len(self.splits.train), generator=torch.Generator()
                               .manual_seed(self.cfg.seed * 100003 + epoch)).tolist()
        losses = []
        for i in order:
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(self.strategy.train_step(self.model, self.splits.train[i],
                                                   self.loss_fn))
            if self.cfg.clip_norm:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                               self.cfg.clip_norm)
            self.optimizer.step()
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

    @staticmethod
    def _truncate_metrics(path: Path, epochs: int) -> None:
        if not path.is_file():
            return
        keep = [ln for ln in path.read_text().splitlines()
                if ln.strip() and json.loads(ln)["epoch"] <= epochs]
        atomic_write_text(path, "".join(ln + "\n" for ln in keep))

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
                       "saved_for_backward_bytes": saved},
            "time": {"epoch_seconds_median": statistics.median(times) if times
                     else None, "epoch_seconds_total": float(sum(times))},
            "data": {"train": [g.name for g in self.splits.train],
                     "val": [g.name for g in self.splits.val],
                     "test": [g.name for g in self.splits.test]},
            "run_dir": str(self.out),
        }
        summary.update(self.strategy.summary())
        return summary

    @staticmethod
    def summary_line(summary: dict[str, Any]) -> str:
        """The one-line result ``leangnn train`` prints."""
        t = summary["metrics"]["test"]
        keys = ["accuracy"] if "accuracy" in t else []
        keys += ["pearson", "spearman", "kendall", "mae", "r2"]
        mets = " ".join(f"{k}={t[k]:.4f}" for k in keys if k in t)
        mem = summary["memory"]
        ep = summary["time"]["epoch_seconds_median"]
        return (f"test {mets} | peak {format_bytes(mem['peak_bytes'])} "
                f"({mem['method']}) | {ep:.3f} s/epoch median over "
                f"{summary['epochs_run']} epochs | {summary['run_dir']}")
