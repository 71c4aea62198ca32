"""``TrainConfig``: every knob of a training run, resolved and saved with it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .utils import parse_bytes

__all__ = ["TrainConfig", "STRATEGIES", "DEFAULT_MODEL"]

STRATEGIES = ("full", "reversible", "prune", "offload")
#: The model a strategy uses when ``--model`` is not given.
DEFAULT_MODEL = {"full": "res", "reversible": "gsr", "prune": "sage",
                 "offload": "sage"}

@dataclass
class TrainConfig:
    """A training run's configuration; ``None`` fields are resolved by the trainer.

    Args:
        dataset: training circuits/suites/paths (comma-separated), or
            ``csbm:N`` for a synthetic contextual SBM with node splits.
            (default: the bundled default split)
        val_dataset / test_dataset: validation and test circuits (default:
            the default split's; for ``csbm:N`` the node masks).
        task: ``arrival``, ``signal_prob`` or ``critical``. (default: ``arrival``)
        strategy: ``full``, ``reversible``, ``prune`` or ``offload``.
        model: ``res``, ``gsr``, ``sage``, ``gcn``, ``gat`` (default per strategy).
        conv: conv inside deep models (``sage``, ``gcn``, ``gat``, ``graph``).
        num_layers, hidden_channels, dropout: model shape.
        epochs, lr, weight_decay, clip_norm, patience: optimisation; ``patience``
            epochs without validation improvement stop the run (0 disables).
        seed: seeds Python, NumPy and torch; same seed, same CPU metrics.
        device: ``cpu``, ``cuda`` or ``cuda:i``.
        out: run directory (default ``runs/<time>-<strategy>-<model>``).
        num_groups, sparsity, flat_parameters: reversible (GSR) options
            (``flat_parameters=False`` is the off switch of the flat
            parameter layout, see :class:`leangnn.nn.GSRStack`).
        budget_ratio, num_anchors: prune (DPR) options.
        device_budget, num_parts, cache, offload_mode: offload options
            (``offload_mode="recompute"`` runs the subgraph-recompute baseline).
    """

    dataset: str | None = None
    val_dataset: str | None = None
    test_dataset: str | None = None
    task: str = "arrival"
    strategy: str = "full"
    model: str | None = None
    conv: str = "sage"
    num_layers: int = 8
    hidden_channels: int = 64
    dropout: float = 0.0
    epochs: int = 60
    lr: float = 3e-3
    weight_decay: float = 0.0
    clip_norm: float | None = 1.0
    patience: int = 20
    seed: int = 0
    device: str = "cpu"
    out: str | None = None
    level_feature: bool = False
    num_groups: int = 4
    sparsity: int | None = None
    flat_parameters: bool = True
    budget_ratio: float = 0.3
    num_anchors: int = 8
    device_budget: str | None = None
    num_parts: int = 8
    cache: str = "st"
    offload_mode: str = "exact"

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        def bad(name, value, want):
            raise ValueError(f"{name}: expected {want}, got {value!r}")

        if self.strategy not in STRATEGIES:
            bad("strategy", self.strategy, f"one of {STRATEGIES}")
        if self.task not in ("arrival", "signal_prob", "critical"):
            bad("task", self.task, "arrival, signal_prob or critical")
        for name in ("num_layers", "hidden_channels", "epochs", "num_groups",
                     "num_parts", "num_anchors"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                bad(name, v, "a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            bad("dropout", self.dropout, "a value in [0, 1)")
        if not self.lr > 0:
            bad("lr", self.lr, "a positive learning rate")
        if not 0.0 < self.budget_ratio <= 1.0:
            bad("budget_ratio", self.budget_ratio, "a ratio in (0, 1]")
        if self.patience < 0:
            bad("patience", self.patience, "an integer >= 0")
        if self.sparsity is not None and self.sparsity < 1:
            bad("sparsity", self.sparsity, "an integer >= 1 (or omitted)")
        if self.device_budget is not None:
            parse_bytes(self.device_budget, "device_budget")
        if self.offload_mode not in ("exact", "recompute"):
            bad("offload_mode", self.offload_mode, "exact or recompute")
        if self.model is None:
            self.model = DEFAULT_MODEL[self.strategy]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        from .utils import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
