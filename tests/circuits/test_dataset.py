"""CircuitDataset: names, features, labels, cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leangnn.circuits import (
    DEFAULT_SPLIT,
    GATE_TYPES,
    CircuitDataset,
    NetlistError,
    catalog,
    circuit_stats,
    load_circuit,
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
