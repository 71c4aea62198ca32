"""``TrainConfig``: every knob of a training run, validated and saved with it.

Validation checks every field's type and range and reads names from the
registries (strategies: :data:`leangnn.strategy.STRATEGIES`, models:
:data:`leangnn.nn.models.MODELS`, convs, tasks, offload's cache policies and
modes), so a bad value fails at once with one line naming the field and the
value, before any data is loaded. It is machine-independent except for the
device (which must exist here); whether a run fits in this machine's memory
is :func:`leangnn.plan.fits.check_fits`.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from .utils import parse_bytes

__all__ = ["TrainConfig", "ConfigError", "MODEL_OPTIONS", "MAX_PARAMETERS",
           "SIZE_DEFAULTS", "AUTO", "AUTO_MODEL", "PLANNED_FIELDS"]

#: the fields every model gets through :func:`leangnn.nn.models.build_model`
#: (each model takes the ones its constructor names)
MODEL_OPTIONS = ("dropout", "conv", "num_groups", "sparsity", "flat_parameters",
                 "aggr", "rounds", "reverse", "task")
#: more parameters than this is a typo on any machine (16 TB of state)
MAX_PARAMETERS = 10**12
#: sizes of a run whose model registered none (see ``register_model(defaults=)``)
SIZE_DEFAULTS = {"num_layers": 8, "hidden_channels": 64, "epochs": 60, "lr": 3e-3}
#: ``strategy="auto"``: the planner (:mod:`leangnn.plan`) picks the strategy
#: and its knobs for ``memory_budget`` before the run starts
AUTO = "auto"
#: the model ``auto`` plans when none is given: the generic deep GNN, whose
#: rows are full batch, its reversible twin (``gsr``) and DPR's core (the
#: circuits' default ``dag`` model cannot be dry-run, so it cannot be planned)
AUTO_MODEL = "res"
#: the fields the planner sets; a resumed planned run keeps the saved ones
PLANNED_FIELDS = ("strategy", "model", "num_groups", "budget_ratio",
                  "device_budget", "num_parts")
_MAX_SEED = 2**32
#: float32's largest value: the optimizer's step size is cast to the
#: parameters' dtype, so a larger learning rate (1e308, inf) stopped Adam with
#: a bare "cannot be converted to type float without overflow"
_MAX_LR = 3.4028234663852886e38


class ConfigError(ValueError):
    """A configuration value that is wrong: names the field and the value."""


@dataclass
class TrainConfig:
    """A training run's configuration; ``None`` fields are resolved by the trainer.

    Args:
        dataset: training circuits/suites/paths (comma-separated), or
            ``csbm:N`` for a synthetic contextual SBM with node splits.
            (default: the bundled default split)
        val_dataset / test_dataset: validation and test circuits (default:
            the default split's; for ``csbm:N`` the node masks).
        task: a task of :data:`leangnn.circuits.TASKS` (``arrival``,
            ``signal_prob``, ``critical``). (default: ``arrival``)
        strategy: a registered strategy (``full``, ``reversible``, ``prune``,
            ``offload``; see :func:`leangnn.strategy.register_strategy`), or
            ``auto``: the planner picks one (and its knobs) for
            ``memory_budget``; a run records the strategy it resolved to.
        memory_budget: the memory ``auto`` plans for, e.g. ``"4GiB"``
            (default: the device's free memory when planning); kept in a
            planned run's saved configuration.
        model: a registered model (``res``, ``gsr``, ``sage``, ``gcn``,
            ``gat``; default per strategy; see
            :func:`leangnn.nn.models.register_model`).
        conv: conv inside deep models (``sage``, ``gcn``, ``gat``, ``graph``).
        aggr, rounds, reverse: DAG model (``dag``) options: fanin aggregator
            (``max``, ``sum``, ``mean``, ``attention``), forward(+reverse)
            rounds, reverse pass over fanouts (default: the task's).
        num_layers, hidden_channels, dropout: model shape.
        epochs, lr, weight_decay, clip_norm, patience: optimisation; ``clip_norm``
            ``0`` or ``None`` disables clipping; ``patience`` epochs without
            validation improvement stop the run (0 disables).
        seed: seeds Python, NumPy and torch; same seed, same CPU metrics.
        device: ``cpu``, ``cuda`` or ``cuda:i`` (must exist on this machine).
        out: run directory (default ``runs/<time>-<strategy>-<model>``).
        num_groups, sparsity, flat_parameters: reversible (GSR) options
            (``flat_parameters=False`` is the off switch of the flat
            parameter layout, see :class:`leangnn.nn.GSRStack`); ``res``
            takes ``num_groups`` and ``sparsity`` too.
        budget_ratio, num_anchors, decoder, decoder_min_gain: prune (DPR)
            options (``decoder``: ``auto`` keeps the trained anchor decoder
            only where it lowers the validation error by more than
            ``decoder_min_gain``, else anchor averaging, trading accuracy for
            serving time; ``learned`` always; ``average`` never; see
            :class:`leangnn.prune.DPRConfig`).
        device_budget, num_parts, cache, offload_mode: offload options
            (``cache="auto"``: ``st`` on CUDA, where it saves transfers,
            ``none`` on a CPU device, where a hit saves only a memcpy;
            ``offload_mode="recompute"`` runs the subgraph-recompute baseline;
            ``retain=True``, the default, keeps each forward job's autograd
            graph for the backward when the budget holds them all, instead of
            recomputing; ``retain=False`` always recomputes).
        dist_mode, dist_backend, dist_timeout, dist_batch_size: distributed
            options (``auto``/``graph``/``data`` parallel; gloo or nccl,
            default by device; seconds a collective waits for a dead peer;
            graphs per step in data mode, default the number of ranks).
    """

    dataset: str | None = None
    val_dataset: str | None = None
    test_dataset: str | None = None
    task: str = "arrival"
    strategy: str = "full"
    model: str | None = None
    conv: str = "sage"
    aggr: str = "max"
    rounds: int = 1
    reverse: bool | None = None
    num_layers: int | None = None
    hidden_channels: int | None = None
    dropout: float = 0.0
    epochs: int | None = None
    lr: float | None = None
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
    decoder: str = "auto"
    decoder_min_gain: float = 0.01
    device_budget: str | None = None
    num_parts: int = 8
    cache: str = "auto"
    offload_mode: str = "exact"
    retain: bool = True
    dist_mode: str = "auto"
    dist_backend: str | None = None
    dist_timeout: float = 300.0
    dist_batch_size: int | None = None
    memory_budget: str | None = None

    def __post_init__(self):
        self.validate()

    def model_options(self) -> dict[str, Any]:
        """The model options of this run (see :data:`MODEL_OPTIONS`), for
        ``build_model(cfg.model, in, hidden, out, cfg.num_layers,
        **cfg.model_options())``."""
        return {name: getattr(self, name) for name in MODEL_OPTIONS}

    # ------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check every field; resolve ``model`` from the strategy when unset.

        Raises:
            ConfigError: naming the first bad field and its value.
        """
        for f in fields(self):
            _check_type(self, f.name, _hints()[f.name])
        self._resolve_sizes()
        self._check_ranges()
        self._check_names()
        self._check_model()

    def _default_model(self) -> str | None:
        """The strategy's default model; ``res`` instead of a DAG model for a
        ``csbm:N`` graph, which is not acyclic (``None``: unknown strategy)."""
        from .nn.models import MODELS
        from .strategy import STRATEGIES

        if self.strategy == AUTO:
            return AUTO_MODEL
        if self.strategy not in STRATEGIES:
            return None
        model = STRATEGIES[self.strategy].default_model
        if self.dataset and self.dataset.startswith("csbm:") and \
                "dag" in MODELS[model].capabilities:
            return "res"  # the best model for circuits needs a DAG
        return model

    def _resolve_sizes(self) -> None:
        """Unset ``num_layers`` / ``hidden_channels`` / ``epochs``: the
        model's registered defaults, else :data:`SIZE_DEFAULTS`."""
        from .nn.models import MODELS

        model = self.model if self.model is not None else self._default_model()
        entry = MODELS.get(model) if isinstance(model, str) else None
        own = dict(entry.defaults) if entry else {}
        # a model may tune per task (e.g. the DAG model's `critical` head
        # trains best narrow and slow): the task's entry wins over the model's
        per_task = own.pop("tasks", {}).get(self.task, {})
        for name, value in SIZE_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, per_task.get(name, own.get(name, value)))

    def _check_ranges(self) -> None:
        for name in ("num_layers", "hidden_channels", "epochs", "num_groups",
                     "num_parts", "num_anchors", "rounds"):
            if getattr(self, name) < 1:
                _bad(name, getattr(self, name), "a positive integer")
        if self.patience < 0:
            _bad("patience", self.patience, "an integer >= 0")
        if not 0 <= self.seed < _MAX_SEED:
            _bad("seed", self.seed, "an integer in [0, 2**32)")
        if self.sparsity is not None and self.sparsity < 1:
            _bad("sparsity", self.sparsity, "an integer >= 1 (or omitted)")
        if not 0.0 <= self.dropout < 1.0:
            _bad("dropout", self.dropout, "a value in [0, 1)")
        if not self.lr > 0:
            _bad("lr", self.lr, "a positive learning rate")
        if self.lr > _MAX_LR:
            _bad("lr", self.lr, f"a learning rate up to {_MAX_LR:.4g} (float32's "
                 "largest value)")
        if self.weight_decay < 0:
            _bad("weight_decay", self.weight_decay, "a value >= 0")
        if self.clip_norm is not None and self.clip_norm < 0:
            _bad("clip_norm", self.clip_norm, "a norm >= 0 (0 disables clipping)")
        if not self.dist_timeout > 0:
            _bad("dist_timeout", self.dist_timeout, "seconds > 0")
        if self.dist_batch_size is not None and self.dist_batch_size < 1:
            _bad("dist_batch_size", self.dist_batch_size,
                 "a positive integer (or omitted)")
        if self.dist_backend not in (None, "gloo", "nccl"):
            _bad("dist_backend", self.dist_backend, "gloo or nccl (or omitted)")
        if not 0.0 < self.budget_ratio <= 1.0:
            _bad("budget_ratio", self.budget_ratio, "a ratio in (0, 1]")
        if not 0.0 <= self.decoder_min_gain <= 1.0:
            _bad("decoder_min_gain", self.decoder_min_gain, "a number in [0, 1]")
        for name in ("device_budget", "memory_budget"):
            if getattr(self, name) is not None:  # (parse_bytes: below 1 EiB)
                _checked(parse_bytes, getattr(self, name), name)
        for name in ("dataset", "val_dataset", "test_dataset", "out"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                _bad(name, value, "a non-empty value (or omitted)")
        if self.dataset is not None and self.dataset.startswith("csbm:"):
            from .data import csbm_nodes

            _checked(csbm_nodes, self.dataset)
            for name in ("val_dataset", "test_dataset"):
                if getattr(self, name) is not None:
                    _bad(name, getattr(self, name), f"no value with dataset="
                         f"{self.dataset!r} (its splits are node masks)")
        for name in ("val_dataset", "test_dataset"):
            value = getattr(self, name)
            if value is not None and value.startswith("csbm:"):
                _bad(name, value, "circuits (csbm:N is a dataset of its own, "
                     "pass it as dataset)")
        _check_device(self.device)

    def _check_names(self) -> None:
        from .circuits import TASKS
        from .nn.models import CONVS, MODELS
        from .strategy import STRATEGIES, option_choices

        _choose("strategy", self.strategy, [*STRATEGIES, AUTO])
        if self.strategy == AUTO and self.device_budget is not None:
            raise ConfigError(f"device_budget: strategy 'auto' sets it from "
                              f"memory_budget, got {self.device_budget!r}")
        csbm = bool(self.dataset and self.dataset.startswith("csbm:"))
        if self.model is None:
            self.model = self._default_model()
        _choose("model", self.model, MODELS)
        if csbm and "dag" in MODELS[self.model].capabilities:
            raise ConfigError(f"model: {self.model!r} propagates in topological "
                              f"order and needs acyclic graphs (circuits); "
                              f"dataset {self.dataset!r} is an undirected graph")
        _choose("task", self.task, TASKS)
        _choose("conv", self.conv, CONVS)
        from .nn.dag import AGGRS

        _choose("aggr", self.aggr, AGGRS)
        # fields whose values a strategy registered (offload: cache, offload_mode)
        constrained = {k for e in STRATEGIES.values() for k in e.choices}
        for name in sorted(constrained & {f.name for f in fields(self)}):
            _choose(name, getattr(self, name), option_choices(name) or ())
        if self.strategy == AUTO:
            return
        if self.strategy == "prune" and "dag" in MODELS[self.model].capabilities:
            # DPR hands the model its core's sparse adjacency, not the fanin
            # edges a DAG model levelizes: it crashed in the first step
            raise ConfigError(
                f"model: strategy 'prune' cannot train {self.model!r} (it "
                "propagates over a circuit's levels, which DPR's pruned core "
                "does not keep); choose another model (default 'sage')")
        needs = STRATEGIES[self.strategy].requires
        missing = sorted(needs - MODELS[self.model].capabilities)
        if missing:
            able = sorted(n for n, m in MODELS.items() if needs <= m.capabilities)
            raise ConfigError(
                f"model: strategy {self.strategy!r} needs a {' and '.join(missing)} "
                f"model (one of {able}), got {self.model!r}")

    def _check_model(self) -> None:
        """Build the model on the meta device (no memory), so what only the
        model knows (e.g. groups dividing the width) fails now, not after
        loading data; and refuse parameter counts no machine holds."""
        from .plan.fits import parameter_count

        try:
            params = parameter_count(self)
        except ValueError as e:
            raise ConfigError(f"model {self.model!r}: {e}") from None
        if params > MAX_PARAMETERS:
            raise ConfigError(
                f"num_layers={self.num_layers}, hidden_channels="
                f"{self.hidden_channels}: model {self.model!r} would have "
                f"~{params:.2e} parameters (at most {MAX_PARAMETERS:.0e})")

    # ------------------------------------------------------------- storage
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"expected a JSON object of config fields, got "
                              f"{type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        from .utils import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @staticmethod
    def read(path: str | Path) -> dict[str, Any]:
        """The JSON object saved at ``path``, unvalidated; errors name ``path``."""
        text = Path(path).read_text(errors="replace")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not a JSON config: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a JSON object of config fields, "
                              f"got {type(d).__name__}")
        return d

    @classmethod
    def load(cls, path: str | Path, **overrides) -> TrainConfig:
        """Read a saved configuration, with ``overrides`` applied before it is
        validated (e.g. ``device="cpu"`` for a run saved on a GPU machine);
        every error names ``path``."""
        d = {**cls.read(path), **overrides}
        try:
            return cls.from_dict(d)
        except ValueError as e:
            raise ConfigError(f"{path}: {e}") from None


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _checked(fn, *args):
    """``fn(*args)``, its ``ValueError`` as a :class:`ConfigError`."""
    try:
        return fn(*args)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _bad(name: str, value: Any, want: str) -> None:
    raise ConfigError(f"{name}: expected {want}, got {value!r}")


_WANT = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _check_type(cfg: TrainConfig, name: str, hint: Any) -> None:
    """The value of ``name`` must be one of the annotated types (see
    :func:`checked_scalar`)."""
    setattr(cfg, name, checked_scalar(name, getattr(cfg, name), hint))


def checked_scalar(name: str, value: Any, hint: Any) -> Any:
    """``value`` as one of the scalar types of ``hint`` (``int``, ``float``,
    ``str``, ``bool``, optionally ``None``): ``bool`` is no integer, an
    integer is a float, NumPy scalars count as Python ones, and floats are
    finite. Also for stored records (a calibration's fields).

    Raises:
        ConfigError: naming ``name``, what was expected and ``value``.
    """
    types = typing.get_args(hint) or (hint,)
    if value is None:
        if type(None) not in types:
            _bad(name, value, _WANT[types[0]])
        return None
    if isinstance(value, bool | np.bool_):
        ok, value = bool in types, bool(value)
    elif isinstance(value, numbers.Integral):
        ok, value = int in types or float in types, int(value)
        if int not in types:
            value = float(value)
    elif isinstance(value, numbers.Real):
        ok, value = float in types, float(value)
    else:
        ok = isinstance(value, str) and str in types
    if not ok:
        want = " or ".join(_WANT[t] for t in types if t in _WANT)
        _bad(name, value, want + (" (or omitted)" if type(None) in types else ""))
    if isinstance(value, float) and not math.isfinite(value):
        _bad(name, value, "a finite number")
    return value


def _one_of(choices) -> str:
    names = [str(c) for c in choices]
    if len(names) <= 1:
        return "".join(names) or "(nothing registered)"
    return ", ".join(names[:-1]) + " or " + names[-1]


def _choose(name: str, value: str, choices) -> None:
    if value not in choices:
        _bad(name, value, _one_of(choices))


def _check_device(device: str, fallback: str = "--device cpu") -> None:
    """Refuse a device this machine has not got; ``fallback`` is what the
    message suggests instead (the caller's spelling: a flag or an argument)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda") or \
            (dev.type == "cpu" and dev.index not in (None, 0)):
        _bad("device", device, "cpu, cuda or cuda:i")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {device!r} requested but CUDA is not "
                              f"available on this machine (use {fallback})")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device: {device!r} requested but this machine has "
                              f"{count} CUDA device(s) (cuda:0..cuda:{count - 1})")
