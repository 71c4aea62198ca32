"""A trained run, opened read-only and applied to circuits (``leangnn predict``
and ``leangnn evaluate``).

:func:`open_run` rebuilds a run's model and strategy from its directory
(:class:`~leangnn.rundir.RunDir`: ``config.json`` and ``checkpoint.pt``, read
with ``torch.load(weights_only=True)``, so a checkpoint carrying code is
refused) without taking the run's lock: a run still training can be read.
The weights are the ones the run's ``summary.json`` test metrics were
computed with: the best validation state when the run kept one, else the
last epoch's (what :meth:`leangnn.train.Trainer.fit` restores at the end).
A run without ``summary.json`` (in progress or killed) is read from its
latest checkpoint, the best state so far; :attr:`TrainedRun.finished` says
which.

:func:`netlist_graph` builds the features of any netlist exactly as training
does (:func:`leangnn.circuits.load_circuit`: gate-type one-hot, ``log1p``
fanin and fanout, output flag, optionally level / depth) but computes no
label, so predicting never simulates a circuit. :meth:`TrainedRun.predict`
returns the model's output per net; :meth:`TrainedRun.evaluate` labels
circuits for the run's task and scores them like the trainer does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from .circuits import TASKS, CircuitInfo, levelize, read_netlist, resolve
from .circuits.dataset import (
    NUM_CRITICAL_CLASSES,
    circuit_digest,
    circuit_graph,
    feature_names,
    load_suite,
)
from .config import TrainConfig
from .nn.models import build_model
from .rundir import RunDir
from .strategy import Strategy, build_strategy
from .utils import json_safe

__all__ = ["TrainedRun", "open_run", "netlist_graph", "feature_names", "UNITS",
           "prediction_table", "write_predictions", "format_table", "metrics_line"]

#: What each task's prediction means (the label's units as trained).
UNITS = {
    "arrival": "arrival time divided by the circuit's critical-path delay "
               "(1.0 = the latest output)",
    "signal_prob": "probability that the net is 1 under uniform random inputs",
    "critical": "slack quartile within the circuit (class 0 = least slack), "
                "with the probability of each class",
}


def netlist_graph(info: CircuitInfo | str, level_feature: bool = False
                  ) -> tuple[Data, list[str]]:
    """One netlist as an unlabelled graph and its node (net) names.

    ``x``, ``edge_index``, ``level`` and ``is_output`` are those of
    :func:`~leangnn.circuits.load_circuit` (both call
    :func:`~leangnn.circuits.dataset.circuit_graph`; node ``i`` is net
    ``names[i]`` of :func:`~leangnn.circuits.read_netlist`); there is no ``y``,
    and nothing is simulated or cached.

    Raises:
        NetlistError: the file is missing or does not parse (names file/line).
    """
    if not isinstance(info, CircuitInfo):
        infos = resolve(info)
        if len(infos) != 1:
            raise ValueError(f"{info!r} names {len(infos)} circuits, expected one")
        info = infos[0]
    net = read_netlist(info.path)
    data = circuit_graph(net.types, net.fanin_ptr, net.fanin_idx,
                         np.union1d(net.outputs, net.pseudo_outputs),
                         levelize(net).level, level_feature)
    data.name = info.name
    data.digest = circuit_digest(info)
    return data, list(net.names)


@dataclass
class TrainedRun:
    """A trained run's model and strategy, ready to apply (see :func:`open_run`).

    Attributes:
        path: the run directory.
        config: its :class:`~leangnn.config.TrainConfig` (``device`` as opened).
        model: the model with the run's weights, in eval mode.
        strategy: the run's strategy, its checkpointed state loaded.
        epoch: epochs the checkpoint covers.
        weights: ``"best"`` (best validation loss) or ``"last"`` (no
            validation nodes: the last epoch's).
        finished: the run wrote ``summary.json``.
        summary: ``summary.json`` (``None`` when not finished).
    """

    path: Path
    config: TrainConfig
    model: torch.nn.Module
    strategy: Strategy
    epoch: int
    weights: str
    finished: bool
    summary: dict[str, Any] | None

    @property
    def task(self) -> str:
        return self.config.task

    @property
    def task_type(self) -> str:
        return TASKS[self.config.task]

    @property
    def in_channels(self) -> int:
        return len(feature_names(self.config.level_feature))

    @property
    def out_channels(self) -> int:
        return NUM_CRITICAL_CLASSES if self.task_type == "classification" else 1

    def describe(self) -> str:
        """One line: the run, its task and which weights are used."""
        state = "" if self.finished else ", run not finished"
        return (f"{self.path}: {self.config.strategy}/{self.config.model} "
                f"L{self.config.num_layers}, task {self.task}, {self.weights} "
                f"weights after {self.epoch} epochs{state}")

    @torch.no_grad()
    def predict(self, data: Data) -> Tensor:
        """The model's output on every node of ``data``: ``[N, out_channels]``
        float32 on the CPU (logits for classification).

        Raises:
            ValueError: ``data`` has another feature width than the run was
                trained on, non-finite features or a bad ``edge_index``.
        """
        from .data import check_graph

        check_graph(data, "graph", in_channels=self.in_channels, labels=False)
        self.model.eval()
        return self.strategy.predict(self.model, data).float().cpu()

    def evaluate(self, graphs: list[Data]) -> dict[str, float | None]:
        """Metrics and mean per-graph loss over the (masked) nodes of
        ``graphs``, pooled, as :meth:`leangnn.train.Trainer.evaluate` computes
        them (the same weights and strategy give the same numbers)."""
        from .data import check_graph
        from .train import evaluate_graphs, make_loss_fn

        classes = self.out_channels if self.task_type == "classification" else None
        for i, g in enumerate(graphs):
            check_graph(g, f"graph {i}", in_channels=self.in_channels,
                        num_classes=classes)

        return evaluate_graphs(self.model, self.strategy, graphs,
                               make_loss_fn(self.task_type), self.task_type)

    def load(self, names, progress: bool = False) -> list[Data]:
        """Circuits labelled for the run's task, with its feature options."""
        return load_suite(names, self.task, progress=progress,
                          level_feature=self.config.level_feature)


def open_run(path: str | Path, device: str = "cpu") -> TrainedRun:
    """Open a run directory read-only (no lock) and rebuild its model.

    Args:
        path (str or Path): the run directory (``leangnn train --out``).
        device (str, optional): where the model runs. (default: ``"cpu"``)

    Raises:
        FileNotFoundError: no such directory, or no checkpoint in it yet.
        ValueError: not a run directory; a damaged or unsafe checkpoint
            (:class:`~leangnn.rundir.CheckpointError`); a run on a synthetic
            graph; weights that do not fit this leangnn's feature layout; a
            prune run whose trained decoder is not in its checkpoint.
    """
    from .config import ConfigError, _check_device
    from .train import RESUMABLE

    try:
        _check_device(device)
    except ConfigError as e:  # named as the option, not as the run's config.json
        raise ValueError(f"--{e}") from None
    path = Path(path)
    if not path.is_dir():
        if path.exists():
            raise ValueError(f"--run: {str(path)!r} is not a directory")
        raise FileNotFoundError(f"--run: no run directory at {str(path)!r}")
    if not (path / RunDir.CONFIG).is_file():
        raise ValueError(f"--run: {str(path)!r} is not a leangnn run directory "
                         f"({RunDir.CONFIG} is missing)")
    ckpt_path = path / RunDir.CHECKPOINT
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"--run: {str(path)!r} holds no checkpoint yet "
                                f"({RunDir.CHECKPOINT} is missing)")
    cfg = TrainConfig.load(path / RunDir.CONFIG, device=device)
    if cfg.dataset and cfg.dataset.startswith("csbm:"):
        raise ValueError(f"--run: {str(path)!r} was trained on the synthetic graph "
                         f"{cfg.dataset!r}; only circuit runs apply to netlists")
    # checkpoint.pt is replaced atomically, so it is complete even while the
    # run writes the next one; no fallback to checkpoint.prev.pt, which would
    # hold other weights than those the summary was computed with.
    ckpt = RunDir(path).read_checkpoint(ckpt_path, map_location="cpu")
    saved, now = ckpt["config"], json_safe(cfg.to_dict())
    diff = [k for k in now if k in saved and k not in RESUMABLE and saved[k] != now[k]]
    if diff:
        raise ValueError(f"{ckpt_path}: written for another configuration than "
                         f"{RunDir.CONFIG} ({diff[0]}={saved[diff[0]]!r}, "
                         f"config has {now[diff[0]]!r})")
    summary = None
    if (path / RunDir.SUMMARY).is_file():
        try:
            summary = json.loads((path / RunDir.SUMMARY).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path / RunDir.SUMMARY}: damaged ({e})") from None
        if not isinstance(summary, dict):
            raise ValueError(f"{path / RunDir.SUMMARY}: damaged (not a JSON object)")
    run = TrainedRun(path, cfg, None, build_strategy(cfg), int(ckpt["epoch"]),
                     "last" if ckpt.get("best_state") is None else "best",
                     summary is not None, summary)
    model = build_model(cfg.model, run.in_channels, cfg.hidden_channels,
                        run.out_channels, cfg.num_layers, **cfg.model_options())
    weights = ckpt["best_state"] if run.weights == "best" else ckpt["model"]
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()),
                     str(e))
        raise ValueError(
            f"{ckpt_path}: the run's weights do not fit model {cfg.model!r} on this "
            f"leangnn's {run.in_channels} node features ({first}); it was trained "
            "on another feature layout or model version") from None
    run.model = model.to(device).eval()
    _load_strategy(run, ckpt, ckpt_path)
    if cfg.strategy == "distributed":
        # Serving needs no process group: the distributed forward is exactly
        # the full-batch one (graph or data parallel), which runs here alone.
        from .strategy import FullBatch

        run.strategy = FullBatch(device)
    return run


def _load_strategy(run: TrainedRun, ckpt: dict, ckpt_path: Path) -> None:
    # The trainer checkpoints at the end of each epoch, before
    # Strategy.fit_end; DPR trains its decoder there, so a finished prune
    # run's checkpoint lacks the decoder its test metrics were computed with.
    state = ckpt.get("fitted_strategy", ckpt["strategy"])
    try:
        run.strategy.load_state_dict(state)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise ValueError(f"{ckpt_path}: damaged {run.config.strategy!r} strategy "
                         f"state ({type(e).__name__}: {e})") from None
    # a decoder that DPR's decoder="auto" dropped (or "average") is no
    # decoder missing from the checkpoint
    if run.config.strategy == "prune" and run.summary and \
            run.summary.get("decoder_rows") and state.get("decoder") is None and \
            state.get("decoder_choice") != "average":
        raise ValueError(
            f"{ckpt_path}: this prune run's decoder was trained after its last "
            "checkpoint and is not stored in it, so its predictions cannot be "
            "reproduced; predict and evaluate do not apply to finished prune runs")


# ------------------------------------------------------------------ output
def prediction_table(run: TrainedRun, circuit: str, names: list[str],
                     out: Tensor) -> tuple[list[str], list[list]]:
    """Columns and rows (one per net) of one circuit's predictions: ``circuit``,
    ``net`` and the task's value (regression), or ``class`` and ``prob_<c>``
    per class (classification; softmax of the logits)."""
    if out.size(0) != len(names):
        raise RuntimeError(f"{circuit}: {out.size(0)} predictions for "
                           f"{len(names)} nets")
    if run.task_type == "classification":
        prob = torch.softmax(out.float(), dim=-1)
        cols = ["circuit", "net", "class"] + [f"prob_{c}" for c in range(out.size(1))]
        values = [[c] + [_f32(v) for v in p] for c, p in
                  zip(prob.argmax(-1).tolist(), prob.numpy())]
    else:
        cols = ["circuit", "net", run.task]
        values = [[_f32(v)] for v in out.reshape(len(names), -1)[:, 0].numpy()]
    return cols, [[circuit, n, *v] for n, v in zip(names, values)]


def _f32(v) -> float:
    # The shortest decimal that reads back as the same float32 (0.3, not
    # 0.30000001192092896): exact, and compact in CSV and JSON.
    return float(str(np.float32(v)))


def write_predictions(path: str | Path, run: TrainedRun, cols: list[str],
                      rows: list[list]) -> None:
    """Write predictions atomically as ``.csv`` (a header row, then one row per
    net) or ``.json`` (the run, task, unit, weights and one object per net)."""
    import csv
    import io

    from .utils import atomic_write_text

    path = Path(path)
    if path.suffix.lower() == ".json":
        doc = {"run": str(run.path), "task": run.task, "task_type": run.task_type,
               "unit": UNITS.get(run.task, "the label's units as trained"),
               "weights": run.weights, "epochs": run.epoch, "finished": run.finished,
               "columns": cols, "rows": [dict(zip(cols, r)) for r in rows]}
        atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")
        return
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def format_table(cols: list[str], rows: list[list]) -> str:
    """Rows as an aligned text table (floats to 4 decimals)."""
    def cell(v):
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    text = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    for r, raw in zip(text, rows):
        lines.append("  ".join(s.rjust(w) if isinstance(v, int | float) else s.ljust(w)
                               for s, w, v in zip(r, widths, raw)).rstrip())
    return "\n".join(lines)


def metrics_line(m: dict[str, float | None]) -> str:
    """Metrics as ``leangnn train`` prints its test metrics."""
    keys = ["accuracy"] if "accuracy" in m else []
    keys += ["pearson", "spearman", "kendall", "mae", "r2", "loss"]
    return " ".join(f"{k}={'n/a' if m[k] is None else format(m[k], '.4f')}"
                    for k in keys if k in m)
