"""CircuitDataset: names, features, labels, cache."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from leangnn.circuits import (
    DEFAULT_SPLIT,
    GATE_TYPES,
    CircuitDataset,
    NetlistError,
    catalog,
    circuit_overlap,
    circuit_stats,
    load_circuit,
    load_suite,
    read_netlist,
    resolve,
    signal_probability,
    static_timing,
)
from leangnn.circuits import dataset as ds_mod


def test_resolve_forms(tmp_path):
    assert [c.name for c in resolve("itc99/b19")] == ["itc99/b19"]
    assert [c.name for c in resolve("c7552")] == ["iscas85/c7552"]
    epfl = resolve("epfl")
    assert len(epfl) == 19 and all(c.suite == "epfl" for c in epfl)
    assert len(resolve("all")) == len(catalog())
    assert [c.name for c in resolve("c17,epfl/dec,c17")] == ["iscas85/c17", "epfl/dec"]
    p = tmp_path / "mine.bench"
    p.write_text("INPUT(a)\nINPUT(b)\nOUTPUT(y)\ny = AND(a, b)\n")
    (info,) = resolve(str(p))
    assert info.name == "user/mine" and info.suite == "user"
    with pytest.raises(ValueError, match="unknown circuit or suite 'nope'"):
        resolve("nope")
    with pytest.raises(NetlistError, match="no such netlist file"):
        resolve(str(tmp_path / "missing.v"))


def test_default_split_is_disjoint_and_resolves():
    names = {k: {c.name for c in resolve(v)} for k, v in DEFAULT_SPLIT.items()}
    assert not names["train"] & names["test"]
    assert not names["train"] & names["val"] and not names["val"] & names["test"]


def test_features_and_labels_follow_the_netlist():
    info = resolve("iscas85/c880")[0]
    net = read_netlist(info.path)
    d = load_circuit(info, "arrival")
    n = net.num_nodes
    assert d.num_nodes == n and d.x.shape == (n, len(GATE_TYPES) + 3)
    onehot = d.x[:, :len(GATE_TYPES)]
    assert torch.equal(onehot.argmax(1), torch.as_tensor(net.types, dtype=torch.long))
    assert torch.equal(onehot.sum(1), torch.ones(n))
    fanin = torch.as_tensor(np.diff(net.fanin_ptr), dtype=torch.float)
    assert torch.allclose(d.x[:, len(GATE_TYPES)], torch.log1p(fanin))
    assert torch.equal(d.edge_index, torch.as_tensor(net.edge_index()))
    t = static_timing(net)
    assert torch.allclose(d.y.double(), torch.as_tensor(t.arrival / t.period),
                          atol=1e-6)
    assert d.y.max() == 1.0 and d.y.min() == 0.0
    sp = load_circuit(info, "signal_prob")
    assert torch.allclose(sp.y.double(), torch.as_tensor(signal_probability(net)),
                          atol=1e-7)
    crit = load_circuit(info, "critical")
    assert crit.y.dtype == torch.long and set(crit.y.unique().tolist()) <= {0, 1, 2, 3}
    # Class 0 holds the least slack: its mean slack is below class 3's.
    slack = torch.as_tensor(t.slack)
    assert slack[crit.y == 0].mean() < slack[crit.y == 3].mean()
    lvl = load_circuit(info, "arrival", level_feature=True)
    assert lvl.x.shape[1] == d.x.shape[1] + 1 and lvl.x[:, -1].max() == 1.0


def test_cache_is_written_atomically_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    a = load_circuit("iscas85/c432", "signal_prob")
    files = list((tmp_path / "circuits").glob("*.pt"))
    assert len(files) == 1 and not list((tmp_path / "circuits").glob(".*tmp"))

    def boom(*_a, **_k):
        raise AssertionError("cache miss: netlist was parsed again")

    monkeypatch.setattr(ds_mod, "read_netlist", boom)
    b = load_circuit("iscas85/c432", "signal_prob")
    assert torch.equal(a.y, b.y) and torch.equal(a.x, b.x)
    # A corrupt entry is recomputed, not fatal.
    monkeypatch.undo()
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    files[0].write_bytes(b"garbage")
    c = load_circuit("iscas85/c432", "signal_prob")
    assert torch.equal(a.y, c.y)


def test_dataset_and_stats():
    ds = CircuitDataset(["iscas85/c17", "epfl/ctrl"], task="critical")
    assert len(ds) == 2 and ds.names == ["iscas85/c17", "epfl/ctrl"]
    assert ds.task_type == "classification" and ds.num_classes == 4
    assert ds.num_features == len(GATE_TYPES) + 3
    assert ds[1].name == "epfl/ctrl"
    s = circuit_stats("iscas85/c17")
    assert s == {"name": "iscas85/c17", "suite": "iscas85", "nodes": 11, "edges": 12,
                 "depth": 3, "inputs": 5, "outputs": 2}
    with pytest.raises(ValueError, match="unknown task 'delay'"):
        load_circuit("c17", "delay")


# --------------------------------------------------------------------------- #
# Names and identities of user files (issue 8)
_AND = "INPUT(a)\nINPUT(b)\nOUTPUT(y)\ny = AND(a, b)\n"
_NOR3 = "INPUT(a)\nINPUT(b)\nINPUT(c)\nOUTPUT(y)\ny = NOR(a, b, c)\n"


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_same_file_name_in_two_folders_stays_two_circuits(tmp_path):
    a = _write(tmp_path / "a" / "top.bench", _AND)
    b = _write(tmp_path / "b" / "top.bench", _NOR3)
    infos = resolve(f"{a},{b}")
    assert [i.name for i in infos] == ["user/a/top", "user/b/top"]
    assert [i.path for i in infos] == [str(a.resolve()), str(b.resolve())]
    graphs = load_suite(infos, "signal_prob", cache=False)
    assert [g.num_nodes for g in graphs] == [read_netlist(a).num_nodes,
                                            read_netlist(b).num_nodes] == [3, 4]
    # The same file twice (another spelling of its path) is one circuit.
    again = resolve([str(a), str(tmp_path / "b" / ".." / "a" / "top.bench")])
    assert [i.name for i in again] == ["user/top"]
    # Same stem and folder, other format: told apart by the suffix.
    v = _write(tmp_path / "a" / "top.v", "module top(a, y);\n input a;\n output y;\n"
               " not g (y, a);\nendmodule\n")
    assert [i.name for i in resolve([a, v])] == ["user/top.bench", "user/top.v"]


def test_overlap_compares_content_not_names(tmp_path, netlist_dir):
    a = _write(tmp_path / "a" / "top.bench", _AND)
    b = _write(tmp_path / "b" / "top.bench", _NOR3)
    copy = _write(tmp_path / "c" / "renamed.bench", _AND)
    train, test = resolve(str(a)), resolve(str(b))
    assert train[0].name == test[0].name == "user/top"  # separate calls
    assert circuit_overlap(train, test) == []
    assert circuit_overlap(train, resolve(str(copy))) == ["user/top"]
    g_train = load_suite(train, "arrival", cache=False)
    assert circuit_overlap(g_train, load_suite(test, "arrival", cache=False)) == []
    assert circuit_overlap(g_train, load_suite(str(copy), "arrival",
                                               cache=False)) == ["user/top"]
    # A user copy of a bundled netlist is the bundled circuit.
    c17 = tmp_path / "mine.v"
    c17.write_bytes(open(os.path.join(netlist_dir, "c17.v"), "rb").read())
    assert circuit_overlap(resolve("iscas85/c17"), resolve(str(c17))) == ["iscas85/c17"]


def test_paths_with_commas(tmp_path):
    p = _write(tmp_path / "x,y" / "my,net.bench", _AND)
    q = _write(tmp_path / "plain.bench", _NOR3)
    assert [i.path for i in resolve(str(p))] == [str(p.resolve())]
    assert [i.path for i in resolve([str(p)])] == [str(p.resolve())]
    assert [i.path for i in resolve(p)] == [str(p.resolve())]
    mixed = resolve(f"c17, {p},{q} ,epfl/dec")
    assert [i.name for i in mixed] == ["iscas85/c17", "user/my,net", "user/plain",
                                       "epfl/dec"]
    assert mixed[1].path == str(p.resolve())
    # Pieces that do not join into an existing file stay separate items.
    with pytest.raises(ValueError, match="unknown circuit or suite 'nope'"):
        resolve(f"nope,{p}")
    with pytest.raises(NetlistError, match="no such netlist file"):
        resolve(str(tmp_path / "x,y" / "missing.bench"))


def test_byte_order_mark_bench_loads_like_plain(tmp_path):
    plain = _write(tmp_path / "plain.bench", _NOR3)
    bom = tmp_path / "bom.bench"
    bom.write_bytes(b"\xef\xbb\xbf" + _NOR3.encode())
    x = load_circuit(str(plain), "signal_prob", cache=False)
    y = load_circuit(str(bom), "signal_prob", cache=False)
    assert torch.equal(x.x, y.x) and torch.equal(x.y, y.y)
    assert torch.equal(x.edge_index, y.edge_index)


# --------------------------------------------------------------------------- #
# CircuitDataset as a PyG InMemoryDataset (issue 9)
_THREE = ["iscas85/c17", "iscas89/s27", "epfl/ctrl"]


def test_dataset_is_an_in_memory_dataset_saved_under_root(tmp_path, monkeypatch):
    from torch_geometric.data import InMemoryDataset

    ds = CircuitDataset(_THREE, task="signal_prob", root=tmp_path / "ds")
    assert isinstance(ds, InMemoryDataset)
    assert len(ds) == 3 and ds.names == _THREE and ds.num_classes == 1
    assert [d["name"] for d in ds.info()] == _THREE
    saved = list((tmp_path / "ds").glob("*/data.pt"))
    assert len(saved) == 1 and not list((tmp_path / "ds").glob("*/.*tmp"))
    for g, name in zip(ds, _THREE):
        ref = load_circuit(name, "signal_prob")
        for key in ("x", "edge_index", "y", "level", "is_output"):
            assert torch.equal(g[key], ref[key]), (name, key)
        assert g.name == name and g.digest == ref.digest
    # A second construction loads the saved file and parses nothing.
    monkeypatch.setattr(ds_mod, "load_suite", _boom)
    again = CircuitDataset(_THREE, task="signal_prob", root=tmp_path / "ds")
    assert again.names == _THREE and torch.equal(again[2].y, ds[2].y)
    # A corrupt saved file is processed again, not fatal.
    monkeypatch.undo()
    saved[0].write_bytes(b"garbage")
    fixed = CircuitDataset(_THREE, task="signal_prob", root=tmp_path / "ds")
    assert torch.equal(fixed[1].x, ds[1].x)


def _boom(*_a, **_k):
    raise AssertionError("dataset was processed again")


def test_dataset_default_root_and_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    ds = CircuitDataset("c17", task="arrival")
    assert len(ds) == 1 and ds[0].name == "iscas85/c17"
    assert list((tmp_path / "datasets").glob("arrival-1-*/data.pt"))
    mem = CircuitDataset("c17", task="critical", root=tmp_path / "none", cache=False)
    assert ds_mod.TASKS[mem.task] == "classification" and mem.num_classes == 4
    assert not (tmp_path / "none").exists()


def test_dataloader_batches_whole_circuits(tmp_path):
    from torch_geometric.loader import DataLoader

    ds = CircuitDataset(_THREE, task="critical", root=tmp_path)
    graphs = [load_circuit(n, "critical") for n in _THREE]
    batch = next(iter(DataLoader(ds, batch_size=2, shuffle=False)))
    g0, g1 = graphs[:2]
    assert batch.num_graphs == 2 and batch.name == _THREE[:2]
    assert batch.num_nodes == g0.num_nodes + g1.num_nodes
    assert batch.edge_index.size(1) == g0.num_edges + g1.num_edges
    # Hand-made reference: the second circuit's edges shifted by the first's nodes.
    want = torch.cat([g0.edge_index, g1.edge_index + g0.num_nodes], 1)
    assert torch.equal(batch.edge_index, want)
    assert torch.equal(batch.y, torch.cat([g0.y, g1.y]))
    assert torch.equal(batch.is_output, torch.cat([g0.is_output, g1.is_output]))
    assert torch.equal(batch.batch, torch.repeat_interleave(
        torch.arange(2), torch.tensor([g0.num_nodes, g1.num_nodes])))
    assert [len(b.name) for b in DataLoader(ds, batch_size=2)] == [2, 1]


def test_transform_pre_transform_and_pre_filter(tmp_path):
    import torch_geometric.transforms as T

    undirected = T.ToUndirected()
    ds = CircuitDataset(_THREE, task="arrival", root=tmp_path, transform=undirected)
    for g, name in zip(ds, _THREE):
        ref = undirected(load_circuit(name, "arrival"))
        assert torch.equal(g.edge_index, ref.edge_index) and g.name == name
    assert torch.equal(ds._data.edge_index[:, :12], load_circuit("c17").edge_index)

    def mark(g):
        g.big = torch.tensor([g.num_nodes > 100])
        return g

    kept = CircuitDataset(_THREE, task="arrival", root=tmp_path / "f",
                          pre_filter=lambda g: g.num_nodes > 100, pre_transform=mark)
    assert kept.names == ["epfl/ctrl"] and kept[0].big.item()
    assert [d["name"] for d in kept.info()] == ["epfl/ctrl"]


def test_edited_netlist_is_processed_again(tmp_path):
    p = _write(tmp_path / "c.bench", _AND)
    first = CircuitDataset(str(p), task="signal_prob", root=tmp_path / "ds")
    assert first[0].num_nodes == 3
    p.write_text(_NOR3)
    second = CircuitDataset(str(p), task="signal_prob", root=tmp_path / "ds")
    net = read_netlist(p)
    assert second[0].num_nodes == net.num_nodes == 4
    assert torch.allclose(second[0].y.double(), torch.as_tensor(
        signal_probability(net)), atol=1e-7)
    assert len(list((tmp_path / "ds").glob("*/data.pt"))) == 2


def test_a_directory_is_named_as_one(tmp_path, monkeypatch):
    """A folder given as a netlist was only 'no such netlist file' (``x.bench``)
    or 'unknown circuit or suite' (no suffix): it exists, it is a folder."""
    d = tmp_path / "top.bench"
    d.mkdir()
    with pytest.raises(NetlistError, match=rf"^{d}: no such netlist file: this is a "
                       "directory; name the netlist files in it$"):
        resolve(str(d))
    d = tmp_path / "designs"
    d.mkdir()
    with pytest.raises(ValueError, match=rf"^unknown circuit or suite '{d}' \(a "
                       r"directory: name the netlist files in it\); use suite/name"):
        resolve(str(d))
    # a suite name wins over a folder of the same name in the working directory
    monkeypatch.chdir(tmp_path)
    (tmp_path / "epfl").mkdir()
    assert resolve("epfl") == [c for c in catalog() if c.suite == "epfl"]


@pytest.mark.parametrize("damage", ["nan_label", "inf_arrival", "missing_key",
                                    "short_level", "not_a_dict"])
def test_damaged_cache_entry_is_recomputed(damage, tmp_path, monkeypatch):
    """A cache file that loads but was damaged or edited was used as is: a
    NaN label trained a NaN model silently, a missing field was a bare
    KeyError. It is recomputed like an unreadable one."""
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    want = load_circuit("iscas85/c432", "signal_prob", cache=False)
    load_circuit("iscas85/c432", "signal_prob")  # writes the entry
    (entry,) = (tmp_path / "circuits").glob("c432-*.pt")
    rec = torch.load(entry, weights_only=True)
    if damage == "nan_label":
        rec["signal_prob"][3] = float("nan")
    elif damage == "inf_arrival":
        rec["arrival"][0] = float("inf")
    elif damage == "missing_key":
        del rec["slack"]
    elif damage == "short_level":
        rec["level"] = rec["level"][:-1]
    else:
        rec = [rec]
    torch.save(rec, entry)
    for task in ("signal_prob", "arrival", "critical"):
        got = load_circuit("iscas85/c432", task)
        ref = want if task == "signal_prob" else load_circuit("iscas85/c432", task,
                                                              cache=False)
        assert torch.equal(got.y, ref.y) and torch.equal(got.x, ref.x), task
    assert circuit_stats("iscas85/c432")["nodes"] == want.num_nodes
    assert _valid(torch.load(entry, weights_only=True))  # rewritten whole


def _valid(rec) -> bool:
    return ds_mod._valid_record(rec) and bool(torch.isfinite(rec["signal_prob"]).all())


@pytest.mark.parametrize("suffix", [".v", ".bench", ".aag", ".aig", ".blif"])
def test_unreadable_netlist_is_one_netlist_error(suffix, tmp_path, monkeypatch,
                                                 netlist_dir):
    """A file without read permission: AIGER raised a bare PermissionError
    ('[Errno 13] ...'), unlike the text formats. Root reads any file, so the
    refusal is simulated; the message must name the file and the reason."""
    import pathlib

    data = os.path.join(os.path.dirname(__file__), "data")
    src = {".v": os.path.join(netlist_dir, "c17.v"),
           ".bench": os.path.join(netlist_dir, "b17_C.bench"),
           ".aag": os.path.join(data, "s27.aag"), ".aig": os.path.join(data, "s27.aig"),
           ".blif": os.path.join(data, "s27.blif")}[suffix]
    p = tmp_path / f"locked{suffix}"
    p.write_bytes(open(src, "rb").read())
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self.name.startswith("locked"):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    with pytest.raises(NetlistError, match=rf"^{p}: cannot read (file|netlist) "
                       r"\(Permission denied\)$"):
        read_netlist(p)
    with pytest.raises(NetlistError, match=rf"^{p}: cannot read .*Permission denied"):
        load_circuit(str(p), "arrival", cache=False)


def test_an_unusable_cache_folder_is_warned_about_not_fatal(tmp_path, monkeypatch):
    """LEANGNN_CACHE pointing at a file (or /proc, or a read-only folder) ended
    `leangnn train` with a bare '[Errno 20] Not a directory'; the cache only
    saves time, so the labels are computed without it, with one warning."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("LEANGNN_CACHE", str(blocker))
    with pytest.warns(RuntimeWarning, match=rf"cannot write the label cache "
                      rf"'{blocker / 'circuits'}' \(Not a directory\); labels are "
                      "computed without it"):
        got = load_circuit("iscas85/c17", "arrival")
    want = load_circuit("iscas85/c17", "arrival", cache=False)
    assert torch.equal(got.y, want.y) and torch.equal(got.x, want.x)
    assert blocker.read_text() == "x"
