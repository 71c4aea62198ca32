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
* ``name`` (unique within one :func:`resolve`), ``digest`` (content hash of
  the netlist file: the circuit's identity, see :func:`circuit_overlap`),
  ``level``, ``is_output``.

:class:`CircuitDataset` is a PyG ``InMemoryDataset`` of such graphs. Parsing
and labelling results are cached on disk under
``leangnn.utils.cache_root()`` (``$LEANGNN_CACHE``, default
``~/.cache/leangnn``), keyed by the file's content hash; processed datasets
under ``cache_root("datasets")``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset

from ..utils import atomic_torch_save, cache_root
from .netlist import GATE_TYPES, NETLIST_SUFFIXES, Netlist, NetlistError, read_netlist
from .simulate import DelayModel, levelize, signal_probability, static_timing

__all__ = [
    "TASKS",
    "SUITES",
    "CircuitInfo",
    "catalog",
    "resolve",
    "circuit_digest",
    "circuit_overlap",
    "cache_dir",
    "load_circuit",
    "load_suite",
    "circuit_stats",
    "CircuitDataset",
    "DEFAULT_SPLIT",
    "circuit_graph",
    "feature_names",
]

#: task -> task type
TASKS = {"signal_prob": "regression", "arrival": "regression",
         "critical": "classification"}
NUM_CRITICAL_CLASSES = 4
_CACHE_VERSION = 1
_DATASET_VERSION = 1  # layout of a processed CircuitDataset file

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


def _is_file(path: str | os.PathLike) -> bool:
    # Path.is_file raises on names the OS refuses (too long, NUL byte).
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def _split_commas(spec: str) -> list[str]:
    """Comma-separated items, where an existing file's path may hold commas.

    The whole string is tried as a file first; otherwise, from each piece on,
    the longest run of pieces that joins (with its commas) into an existing
    file is one item, and a piece that starts no such run is an item alone.
    """
    whole = spec.strip()
    if "," not in whole or _is_file(whole):
        return [whole] if whole else []
    pieces = spec.split(",")
    out, i = [], 0
    while i < len(pieces):
        j = i + 1
        for end in range(len(pieces), i + 1, -1):
            if _is_file(",".join(pieces[i:end]).strip()):
                j = end
                break
        item = ",".join(pieces[i:j]).strip()
        if item:
            out.append(item)
        i = j
    return out


def _user_names(paths: list[Path]) -> list[str]:
    """``user/<stem>``, with parent folders added where two files share a stem."""
    names = [f"user/{p.stem}" for p in paths]
    groups: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        groups.setdefault(name, []).append(k)
    for group in groups.values():
        if len(group) == 1:
            continue
        rel = [paths[k].relative_to(paths[k].anchor) for k in group]
        depth = max(len(r.parts) for r in rel)
        # Fewest parent folders that tell the files apart; then the same with
        # the suffix (top.v beside top.bench); distinct paths always differ.
        options = [["/".join(r.parent.parts[-d:] + (r.stem,)) for r in rel]
                   for d in range(1, depth)]
        options += [["/".join(r.parts[-1 - d:]) for r in rel] for d in range(depth)]
        pick = next((o for o in options if len(set(o)) == len(o)),
                    [r.as_posix() for r in rel])
        for k, name in zip(group, pick):
            names[k] = f"user/{name}"
    return names


def resolve(names: str | os.PathLike | Iterable) -> list[CircuitInfo]:
    """Turn names into circuits.

    Accepts ``suite/circuit`` (``itc99/b19``), a bare circuit name when unique
    (``c7552``), a whole suite (``epfl``), ``all``, a path to a netlist file
    (``.v``, ``.bench``, ``.aag``/``.aig``, ``.blif``), a
    :class:`CircuitInfo`, or a list of these. A string may list several,
    comma-separated; a path that itself contains commas is recognised when the
    file exists (the whole string, or the longest run of comma-separated
    pieces that names an existing file, is taken as one path), and a list
    element that is an existing path is never split.

    User files are named ``user/<stem>``; files that share a stem get the
    parent folders that tell them apart (``a/top.v``, ``b/top.v`` ->
    ``user/a/top``, ``user/b/top``). A file given twice (the same resolved
    path) appears once. Names are unique within one call; to compare circuits
    across calls (a train/test overlap) use :func:`circuit_overlap`, which
    compares content.

    Raises:
        ValueError: for an unknown name; :class:`NetlistError` for a path to
            a file that does not exist.
    """
    if isinstance(names, str | os.PathLike | CircuitInfo):
        names = [names]
    items: list = []
    for n in names:
        if isinstance(n, CircuitInfo):
            items.append((n, None))
        elif isinstance(n, os.PathLike):
            items.append((os.fspath(n), None))
        elif _is_file(str(n).strip()):
            items.append((str(n).strip(), None))
        else:
            items.extend((item, str(n).strip()) for item in _split_commas(str(n)))
    cat = catalog()
    by_name = {c.name: c for c in cat}
    by_short: dict[str, list[CircuitInfo]] = {}
    for c in cat:
        by_short.setdefault(c.name.split("/", 1)[1], []).append(c)
    out: list[CircuitInfo | Path] = []
    for item, spec in items:
        if isinstance(item, CircuitInfo):
            out.append(item)
        elif item == "all":
            out.extend(cat)
        elif item in SUITES:
            out.extend(c for c in cat if c.suite == item)
        elif item in by_name:
            out.append(by_name[item])
        elif len(by_short.get(item, [])) == 1:
            out.append(by_short[item][0])
        elif Path(item).suffix.lower() in NETLIST_SUFFIXES or _is_file(item):
            if _is_dir(item):
                raise NetlistError("no such netlist file: this is a directory; name "
                                   "the netlist files in it", item)
            if not _is_file(item):
                raise NetlistError("no such netlist file", item)
            out.append(Path(item).resolve())
        elif spec and spec != item and ("/" in item or os.sep in item) and \
                Path(spec).suffix.lower() in NETLIST_SUFFIXES:
            # A missing file whose path has commas: the pieces mean nothing.
            raise NetlistError("no such netlist file (nor is each comma-separated "
                               "piece of it a circuit)", spec)
        else:
            hint = sorted(SUITES) + ["all"]
            folder = (" (a directory: name the netlist files in it)"
                      if _is_dir(item) else "")
            raise ValueError(f"unknown circuit or suite {item!r}{folder}; use "
                             f"suite/name (see `leangnn datasets`), one of {hint}, "
                             "or a path to a netlist file")
    seen: set[str] = set()
    uniq: list[CircuitInfo | Path] = []
    for c in out:
        key = str(c) if isinstance(c, Path) else str(Path(c.path).resolve())
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    users = [c for c in uniq if isinstance(c, Path)]
    user_info = {p: CircuitInfo(name, "user", str(p))
                 for p, name in zip(users, _user_names(users))}
    return [user_info[c] if isinstance(c, Path) else c for c in uniq]


def _digest_bytes(raw: bytes) -> str:
    return hashlib.sha1(raw).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return _digest_bytes(Path(path).read_bytes())


def circuit_digest(info: CircuitInfo) -> str:
    """Content hash of a circuit's netlist file (the identity of a circuit).

    Raises:
        NetlistError: naming the file when it cannot be read.
    """
    try:
        st = os.stat(info.path)
        return _file_digest(info.path, st.st_mtime_ns, st.st_size)
    except FileNotFoundError as e:
        raise NetlistError("no such netlist file", info.path) from e
    except OSError as e:
        raise NetlistError(f"cannot read netlist ({e.strerror or e})", info.path) from e


def circuit_overlap(a: Iterable, b: Iterable) -> list[str]:
    """Names of the circuits of ``a`` that are also in ``b``, by content.

    Items are :class:`CircuitInfo` or graphs from :func:`load_circuit`. Two
    circuits are the same when their netlist files have the same content hash,
    whatever their names or paths (``a/top.v`` and ``b/top.v`` with different
    contents do not overlap; a copy of ``c17.v`` under another name does).
    Graphs without a ``digest`` attribute are compared by name.
    """
    def key(item):
        if isinstance(item, CircuitInfo):
            return circuit_digest(item) if _is_file(item.path) else item.name
        return getattr(item, "digest", None) or item.name

    theirs = {key(x) for x in b}
    return sorted({x.name for x in a if key(x) in theirs})


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
    try:
        raw = Path(info.path).read_bytes()
    except OSError as e:
        raise NetlistError(f"cannot read netlist ({e.strerror or e})", info.path) from e
    key = _digest_bytes(raw)
    fname = f"{Path(info.path).stem}-{key}-v{_CACHE_VERSION}-p{num_patterns}-s{seed}.pt"
    path = cache_dir() / "circuits" / fname
    if use_cache and path.is_file():
        try:
            rec = torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a corrupt cache entry is recomputed
            rec = None
        if _valid_record(rec):
            rec["digest"] = key
            return rec
    rec = _compute(read_netlist(info.path), num_patterns, seed)
    if use_cache:
        try:
            atomic_torch_save(rec, path)
        except OSError as e:
            # The cache only saves time: an unusable $LEANGNN_CACHE (read-only,
            # a file, /proc) must not end a run whose labels are computed.
            warnings.warn(f"cannot write the label cache {str(path.parent)!r} "
                          f"({e.strerror or e}); labels are computed without it "
                          "(set LEANGNN_CACHE to a writable folder)", RuntimeWarning,
                          stacklevel=2)
    rec["digest"] = key
    return rec


_RECORD_TENSORS = ("types", "fanin_ptr", "fanin_idx", "outputs", "level",
                   "signal_prob", "arrival", "slack")


def _valid_record(rec) -> bool:
    """Whether a cache entry read back is whole: every field, one entry per
    node, finite labels. A file that loads but was damaged or edited (a NaN
    label would train a NaN model without a word) is recomputed instead."""
    if not isinstance(rec, dict) or not all(
            isinstance(rec.get(k), torch.Tensor) for k in _RECORD_TENSORS):
        return False
    n = rec["types"].numel()
    period = rec.get("period")
    return (isinstance(period, int | float) and np.isfinite(period)
            and all(isinstance(rec.get(k), int) for k in ("num_inputs",
                                                          "num_outputs"))
            and rec["fanin_ptr"].numel() == n + 1
            and all(rec[k].numel() == n for k in ("level", "signal_prob", "arrival",
                                                  "slack"))
            and all(bool(torch.isfinite(rec[k]).all())
                    for k in ("signal_prob", "arrival", "slack")))


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
    data = circuit_graph(rec["types"], rec["fanin_ptr"], rec["fanin_idx"],
                         rec["outputs"], rec["level"], level_feature)
    data.y = _labels(rec, task)
    data.name = info.name
    data.digest = rec["digest"]
    return data


def feature_names(level_feature: bool = False) -> list[str]:
    """The node-feature layout of :func:`circuit_graph`, one name per column
    of ``x``."""
    names = [f"type={t}" for t in GATE_TYPES]
    names += ["log1p_fanin", "log1p_fanout", "is_output"]
    return names + (["level/depth"] if level_feature else [])


def circuit_graph(types, fanin_ptr, fanin_idx, outputs, level,
                  level_feature: bool = False) -> Data:
    """A netlist's structure as an unlabelled PyG graph: the one feature
    builder of training, ``predict`` and ``evaluate``.

    Args:
        types: ``[N]`` gate-type ids (:data:`GATE_TYPES`).
        fanin_ptr, fanin_idx: CSR of each node's fanins (``[N + 1]``, ``[E]``).
        outputs: ids of primary and pseudo outputs.
        level: ``[N]`` logic levels.
        level_feature (bool, optional): append level / depth to ``x``.
            (default: ``False``)

    Returns:
        :class:`~torch_geometric.data.Data` with ``x [N, F]`` (columns named by
        :func:`feature_names`), ``edge_index [2, E]`` (fanin -> gate),
        ``level [N]`` and ``is_output [N]``.
    """
    as_long = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long)  # noqa: E731
    types, ptr, idx = as_long(types), as_long(fanin_ptr), as_long(fanin_idx)
    level = as_long(level)
    n = types.numel()
    fanin = ptr.diff()
    dst = torch.repeat_interleave(torch.arange(n), fanin)
    fanout = torch.bincount(idx, minlength=n)
    is_output = torch.zeros(n, dtype=torch.bool)
    is_output[as_long(outputs)] = True
    cols = [torch.nn.functional.one_hot(types, len(GATE_TYPES)).float(),
            torch.log1p(fanin.float())[:, None], torch.log1p(fanout.float())[:, None],
            is_output.float()[:, None]]
    if level_feature:
        cols.append((level.float() / max(int(level.max()), 1))[:, None])
    data = Data(x=torch.cat(cols, 1), edge_index=torch.stack([idx, dst]), num_nodes=n)
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


class CircuitDataset(InMemoryDataset):
    """Real circuits as a PyG :class:`~torch_geometric.data.InMemoryDataset`.

    One graph per circuit (see :func:`load_circuit` for ``x``, ``y`` and the
    per-graph ``name`` and ``digest`` and per-node ``level`` and
    ``is_output``), labelled for one task, split by circuit. The graphs are
    collated once and saved under ``root`` (one folder per selection of
    circuits, task and label options, keyed by the netlists' content hashes,
    so an edited file is processed again); later constructions load that
    file. Works with PyG's :class:`~torch_geometric.loader.DataLoader`.

    Args:
        names (str or list): circuits, suites or paths (see :func:`resolve`).
        task (str, optional): ``arrival``, ``signal_prob`` or ``critical``.
            (default: ``"arrival"``)
        root (str, optional): dataset folder. (default:
            ``leangnn.utils.cache_root("datasets")``)
        transform (callable, optional): applied to each graph on access.
            (default: ``None``)
        pre_transform (callable, optional): applied to each graph before it
            is saved. (default: ``None``)
        pre_filter (callable, optional): keeps a graph when it returns
            ``True``. (default: ``None``)
        progress (bool, optional): show progress while processing.
            (default: ``False``)
        force_reload (bool, optional): process again even if saved.
            (default: ``False``)
        level_feature, num_patterns, seed: see :func:`load_circuit`.
        cache (bool, optional): read and write the on-disk caches (labels and
            the processed dataset); ``False`` builds everything in memory.
            (default: ``True``)

    Example:
        >>> ds = CircuitDataset("iscas85", task="arrival")
        >>> ds[0]  # Data(x=[11, 15], edge_index=[2, 12], y=[11], name='iscas85/c17')
        >>> next(iter(DataLoader(ds, batch_size=4)))  # a Batch of 4 circuits
    """

    def __init__(self, names: str | os.PathLike | Iterable, task: str = "arrival",
                 root: str | os.PathLike | None = None,
                 transform: Callable | None = None,
                 pre_transform: Callable | None = None,
                 pre_filter: Callable | None = None, *, progress: bool = False,
                 force_reload: bool = False, level_feature: bool = False,
                 num_patterns: int = 1 << 16, seed: int = 0, cache: bool = True):
        if task not in TASKS:
            raise ValueError(f"task: unknown task {task!r}; expected one of "
                             f"{sorted(TASKS)}")
        self.task = task
        self.infos = list(names) if _is_infos(names) else resolve(names)
        if not self.infos:
            raise ValueError(f"names: {names!r} names no circuit")
        self.progress = progress
        self.options = {"level_feature": level_feature, "num_patterns": num_patterns,
                        "seed": seed}
        self.cache = cache
        self.digests = [circuit_digest(i) for i in self.infos]
        root = cache_root("datasets") if root is None else root
        super().__init__(os.fspath(root), transform, pre_transform, pre_filter,
                         log=progress, force_reload=force_reload)
        if cache:
            try:
                self.load(self.processed_paths[0])
            except Exception:  # noqa: BLE001 - a corrupt file is processed again
                self.process()
                self.load(self.processed_paths[0])
        else:
            self.data, self.slices = self.collate(self._graphs())

    # -- PyG dataset protocol ----------------------------------------------- #
    @property
    def raw_file_names(self) -> list[str]:
        return []  # the netlists live where resolve() found them

    @property
    def processed_dir(self) -> str:
        spec = {"version": (_CACHE_VERSION, _DATASET_VERSION), "task": self.task,
                **self.options,
                "circuits": [[i.name, d] for i, d in zip(self.infos, self.digests)]}
        key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()
        return os.path.join(self.root, f"{self.task}-{len(self.infos)}-{key[:16]}")

    @property
    def processed_file_names(self) -> str:
        return "data.pt"

    def _process(self) -> None:
        if self.cache:  # without the cache nothing is written to root
            super()._process()

    def process(self) -> None:
        data, slices = self.collate(self._graphs())
        # PyG's save() format, written atomically so a killed run leaves none.
        atomic_torch_save((data.to_dict(), slices, data.__class__),
                          self.processed_paths[0])

    def _graphs(self) -> list[Data]:
        graphs = load_suite(self.infos, self.task, progress=self.progress,
                            cache=self.cache, **self.options)
        if self.pre_filter is not None:
            graphs = [g for g in graphs if self.pre_filter(g)]
        if self.pre_transform is not None:
            graphs = [self.pre_transform(g) for g in graphs]
        if not graphs:
            raise ValueError("pre_filter: no circuit left of "
                             f"{[i.name for i in self.infos]}")
        return graphs

    # -- leangnn's names ----------------------------------------------------- #
    @property
    def task_type(self) -> str:
        return TASKS[self.task]

    @property
    def num_classes(self) -> int:
        return NUM_CRITICAL_CLASSES if self.task_type == "classification" else 1

    @property
    def names(self) -> list[str]:
        """Circuit names in dataset order (after ``pre_filter``, subsets)."""
        stored = self._data.name
        stored = [stored] if isinstance(stored, str) else list(stored)
        return [stored[i] for i in self.indices()]

    @property
    def graphs(self) -> list[Data]:
        """The graphs as a list (each transformed, if there is a transform)."""
        return [self[i] for i in range(len(self))]

    def info(self) -> list[dict]:
        """Name, suite and file of each circuit, in dataset order."""
        by_name = {i.name: i for i in self.infos}
        return [asdict(by_name[n]) for n in self.names]

    def __repr__(self) -> str:
        return f"CircuitDataset({len(self)} circuits, task={self.task!r})"


def _is_infos(names) -> bool:
    return isinstance(names, list) and all(isinstance(n, CircuitInfo) for n in names)


def _maybe_tqdm(items, progress):
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="circuits", unit="ckt")
