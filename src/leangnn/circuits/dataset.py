"""``CircuitDataset``: real gate-level netlists as PyG graphs with computed labels.

The benchmark netlists come from the ``circuitgraph`` package (ISCAS-85,
ISCAS-89, ITC-99, EPFL); users can add their own ``.v`` / ``.bench`` files by
path. Every circuit becomes a :class:`~torch_geometric.data.Data` with

* ``x``: gate-type one-hot (:data:`~leangnn.circuits.netlist.GATE_TYPES`),
  ``log1p`` fanin, ``log1p`` fanout, a primary/pseudo output flag and,
  optionally, the logic level divided by the depth;
* ``edge_index``: directed fanin -> gate edges;
* ``y``: the task label: ``signal_prob`` (bit-parallel simulation),
  ``arrival`` (arrival time / critical-path delay) or ``critical`` (slack
  quartile, class 0 = least slack);
* ``name``, ``level``, ``is_output``.

Parsing and labelling results are cached on disk under ``$LEANGNN_CACHE``
(default ``~/.cache/leangnn``), keyed by the file's content hash.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from ..utils import atomic_torch_save, cache_root
from .netlist import GATE_TYPES, Netlist, NetlistError, read_netlist
from .simulate import DelayModel, levelize, signal_probability, static_timing

__all__ = [
    "TASKS",
    "SUITES",
    "CircuitInfo",
    "catalog",
    "resolve",
    "cache_dir",
    "load_circuit",
    "load_suite",
    "circuit_stats",
    "CircuitDataset",
    "DEFAULT_SPLIT",
]

#: task -> task type
TASKS = {"signal_prob": "regression", "arrival": "regression",
         "critical": "classification"}
NUM_CRITICAL_CLASSES = 4
_CACHE_VERSION = 1

_ISCAS85 = ["c17", "c432", "c499", "c880", "c1355", "c1908", "c2670", "c3540",
            "c5315", "c6288", "c7552"]
_EPFL = ["adder", "arbiter", "bar", "cavlc", "ctrl", "dec", "div", "i2c",
         "int2float", "log2", "max", "memctrl", "multiplier", "priority", "router",
         "sin", "sqrt", "square", "voter"]
#: suite -> [(circuit name, file name in circuitgraph/netlists)]
SUITES: dict[str, list[tuple[str, str]]] = {
    "iscas85": [(c, f"{c}.v") for c in _ISCAS85],
    "iscas85g": [(f"{c}g", f"{c}g.v") for c in _ISCAS85],
    "iscas89": [(s, f"{s}.v") for s in ("s27", "s13207", "s38417", "s38584")],
    "itc99": [(b, f"{b}_Cg.v") for b in ("b17", "b18", "b19", "b20", "b22")],
    "itc99-bench": [(f"{b}_C", f"{b}_C.bench") for b in ("b17", "b20", "b22")],
    "epfl": [(e, "priority_ckt.v" if e == "priority" else f"{e}.v") for e in _EPFL],
    "misc": [(m, f"{m}.v") for m in (
        "banyan_8", "banyan_16", "banyan_32", "banyan_64", "banyan_128",
        "banyan_256", "c17_assign", "c17_gates", "mux_2", "mux_4", "switch",
        "s27_unrolled_4")],
}

#: Default split of ``leangnn train``: by circuit, test circuits never seen.
DEFAULT_SPLIT = {
    "train": ["iscas85/c432", "iscas85/c499", "iscas85/c880", "iscas85/c1355",
              "iscas85/c1908", "iscas85/c2670", "iscas85/c3540", "epfl/ctrl",
              "epfl/cavlc", "epfl/dec", "epfl/int2float", "epfl/router",
              "epfl/priority"],
    "val": ["iscas85/c5315", "epfl/i2c"],
    "test": ["iscas85/c6288", "iscas85/c7552", "epfl/max", "epfl/sin"],
}


@dataclass(frozen=True)
class CircuitInfo:
    """Where a circuit comes from: ``name`` (``suite/circuit``) and its file."""

    name: str
    suite: str
    path: str


def _netlist_dir() -> Path:
    import circuitgraph

    return Path(circuitgraph.__file__).parent / "netlists"


def catalog() -> list[CircuitInfo]:
    """Every bundled circuit, suite by suite."""
    root = _netlist_dir()
    return [CircuitInfo(f"{suite}/{name}", suite, str(root / fname))
            for suite, members in SUITES.items() for name, fname in members
            if (root / fname).is_file()]


def resolve(names: str | Iterable[str]) -> list[CircuitInfo]:
    """Turn names into circuits.

    Accepts ``suite/circuit`` (``itc99/b19``), a bare circuit name when unique
    (``c7552``), a whole suite (``epfl``), ``all``, a path to a ``.v`` or
    ``.bench`` file, or a comma-separated mix of these.
    """
    if isinstance(names, str):
        names = [names]
    items = [p.strip() for n in names for p in str(n).split(",") if p.strip()]
    cat = catalog()
    by_name = {c.name: c for c in cat}
    by_short: dict[str, list[CircuitInfo]] = {}
    for c in cat:
        by_short.setdefault(c.name.split("/", 1)[1], []).append(c)
    out: list[CircuitInfo] = []
    for item in items:
        if item == "all":
            out.extend(cat)
        elif item in SUITES:
            out.extend(c for c in cat if c.suite == item)
        elif item in by_name:
            out.append(by_name[item])
        elif len(by_short.get(item, [])) == 1:
            out.append(by_short[item][0])
        elif Path(item).suffix.lower() in (".v", ".bench", ".vg", ".sv") or \
                os.sep in item and Path(item).exists():
            p = Path(item)
            if not p.is_file():
                raise NetlistError("no such netlist file", item)
            out.append(CircuitInfo(f"user/{p.stem}", "user", str(p.resolve())))
        else:
            hint = sorted(SUITES) + ["all"]
            raise ValueError(f"unknown circuit or suite {item!r}; use suite/name "
                             f"(see `leangnn datasets`), one of {hint}, or a path "
                             "to a .v/.bench file")
    seen, uniq = set(), []
    for c in out:
        if c.name not in seen:
            seen.add(c.name)
            uniq.append(c)
    return uniq


def cache_dir() -> Path:
    """``$LEANGNN_CACHE``, else ``$XDG_CACHE_HOME/leangnn`` or ``~/.cache/leangnn``."""
    return cache_root()


def _compute(net: Netlist, num_patterns: int, seed: int) -> dict:
    lv = levelize(net)
    timing = static_timing(net, DelayModel(), lv)
    prob = signal_probability(net, num_patterns=num_patterns, seed=seed, levels=lv)
    t = lambda a, dt=torch.float64: torch.as_tensor(np.ascontiguousarray(a), dtype=dt)  # noqa: E731
    return {
        "module": net.name,
        "types": t(net.types, torch.int8),
        "fanin_ptr": t(net.fanin_ptr, torch.int64),
        "fanin_idx": t(net.fanin_idx, torch.int64),
        "outputs": t(np.union1d(net.outputs, net.pseudo_outputs), torch.int64),
        "num_inputs": int(net.inputs.size + net.pseudo_inputs.size),
        "num_outputs": int(net.outputs.size + net.pseudo_outputs.size),
        "level": t(lv.level, torch.int64),
        "signal_prob": t(prob),
        "arrival": t(timing.arrival),
        "slack": t(timing.slack),
        "period": timing.period,
    }


def _record(info: CircuitInfo, num_patterns: int, seed: int, use_cache: bool) -> dict:
    raw = Path(info.path).read_bytes()
    key = hashlib.sha1(raw).hexdigest()[:16]
    fname = f"{Path(info.path).stem}-{key}-v{_CACHE_VERSION}-p{num_patterns}-s{seed}.pt"
    path = cache_dir() / "circuits" / fname
    if use_cache and path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a corrupt cache entry is recomputed
            pass
    rec = _compute(read_netlist(info.path), num_patterns, seed)
    if use_cache:
        atomic_torch_save(rec, path)
    return rec


def _labels(rec: dict, task: str) -> torch.Tensor:
    if task == "signal_prob":
        return rec["signal_prob"].float()
    period = max(rec["period"], 1e-12)
    if task == "arrival":
        return (rec["arrival"] / period).float()
    if task == "critical":
        slack = (rec["slack"] / period).clamp_min(0).numpy()
        cuts = np.quantile(slack, [0.25, 0.5, 0.75])
        return torch.as_tensor(np.searchsorted(cuts, slack, side="left"),
                               dtype=torch.long).clamp_(max=NUM_CRITICAL_CLASSES - 1)
    raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")


def load_circuit(name: str | CircuitInfo, task: str = "arrival", *,
                 level_feature: bool = False, num_patterns: int = 1 << 16,
                 seed: int = 0, cache: bool = True) -> Data:
    """One circuit as a PyG graph (see the module docstring for the fields).

    Args:
        name (str or CircuitInfo): ``suite/circuit``, a bare unique name, or a
            netlist path.
        task (str, optional): ``arrival``, ``signal_prob`` or ``critical``.
            (default: ``"arrival"``)
        level_feature (bool, optional): append level / depth to ``x``; off by
            default because it leaks much of ``arrival``. (default: ``False``)
        num_patterns (int, optional): simulation patterns when the circuit has
            more than 16 sources. (default: ``2**16``)
        seed (int, optional): simulation seed. (default: ``0``)
        cache (bool, optional): read and write the on-disk cache. (default: ``True``)
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
    if isinstance(name, CircuitInfo):
        info = name
    else:
        infos = resolve(name)
        if len(infos) != 1:
            raise ValueError(f"{name!r} names {len(infos)} circuits; "
                             "use load_suite for several")
        info = infos[0]
    rec = _record(info, num_patterns, seed, cache)
    types = rec["types"].long()
    n = types.numel()
    ptr, idx = rec["fanin_ptr"], rec["fanin_idx"]
    fanin = ptr.diff()
    dst = torch.repeat_interleave(torch.arange(n), fanin)
    fanout = torch.bincount(idx, minlength=n)
    is_output = torch.zeros(n, dtype=torch.bool)
    is_output[rec["outputs"]] = True
    cols = [torch.nn.functional.one_hot(types, len(GATE_TYPES)).float(),
            torch.log1p(fanin.float())[:, None], torch.log1p(fanout.float())[:, None],
            is_output.float()[:, None]]
    level = rec["level"]
    if level_feature:
        cols.append((level.float() / max(int(level.max()), 1))[:, None])
    data = Data(x=torch.cat(cols, 1), edge_index=torch.stack([idx, dst]),
                y=_labels(rec, task), num_nodes=n)
    data.name = info.name
    data.level = level
    data.is_output = is_output
    return data


def load_suite(names: str | Iterable[str], task: str = "arrival", progress=False,
               **kwargs) -> list[Data]:
    """Several circuits (suites, names, paths) as a list of graphs."""
    infos = names if _is_infos(names) else resolve(names)
    return [load_circuit(i, task, **kwargs) for i in _maybe_tqdm(infos, progress)]


def circuit_stats(name: str | CircuitInfo, cache: bool = True) -> dict:
    """Figures for ``leangnn datasets``: nodes, edges, depth, inputs, outputs."""
    info = name if isinstance(name, CircuitInfo) else resolve(name)[0]
    rec = _record(info, 1 << 16, 0, cache)
    return {"name": info.name, "suite": info.suite,
            "nodes": int(rec["types"].numel()), "edges": int(rec["fanin_idx"].numel()),
            "depth": int(rec["level"].max()) if rec["level"].numel() else 0,
            "inputs": rec["num_inputs"], "outputs": rec["num_outputs"]}


class CircuitDataset(Sequence):
    """A list of circuit graphs for one task, split by circuit.

    Args:
        names (str or list[str]): circuits, suites or paths (see :func:`resolve`).
        task (str, optional): ``arrival``, ``signal_prob`` or ``critical``.
            (default: ``"arrival"``)
        **kwargs: forwarded to :func:`load_circuit`.

    Example:
        >>> ds = CircuitDataset("iscas85", task="arrival")
        >>> ds[0]  # Data(x=[11, 15], edge_index=[2, 12], y=[11], name='iscas85/c17')
    """

    def __init__(self, names: str | Iterable[str], task: str = "arrival",
                 progress: bool = False, **kwargs):
        self.task = task
        self.infos = resolve(names)
        self.graphs = load_suite(self.infos, task, progress=progress, **kwargs)

    @property
    def task_type(self) -> str:
        return TASKS[self.task]

    @property
    def num_features(self) -> int:
        return int(self.graphs[0].num_features) if self.graphs else 0

    @property
    def num_classes(self) -> int:
        return NUM_CRITICAL_CLASSES if self.task_type == "classification" else 1

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.infos]

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, i):
        return self.graphs[i]

    def __repr__(self) -> str:
        return f"CircuitDataset({len(self)} circuits, task={self.task!r})"

    def info(self) -> list[dict]:
        return [asdict(i) for i in self.infos]


def _is_infos(names) -> bool:
    return isinstance(names, list) and all(isinstance(n, CircuitInfo) for n in names)


def _maybe_tqdm(items, progress):
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="circuits", unit="ckt")
