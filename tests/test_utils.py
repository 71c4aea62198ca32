"""Atomic writes and small helpers."""

from __future__ import annotations

import os

import pytest
import torch

from leangnn import utils
from leangnn.utils import (
    append_jsonl,
    atomic_torch_save,
    atomic_write_text,
    format_bytes,
    get_rng_state,
    parse_bytes,
    seed_everything,
    set_rng_state,
    temp_path,
)


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "summary.json"
    atomic_write_text(p, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(utils.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(p, "new")
    assert p.read_text() == "old"


def test_atomic_torch_save(tmp_path):
    atomic_torch_save({"a": torch.ones(2)}, tmp_path / "sub" / "c.pt")
    assert torch.load(tmp_path / "sub" / "c.pt")["a"].sum() == 2
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["c.pt"]


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 << 20) == "3.0 MiB"
    assert format_bytes(None) == "n/a"
    # past a TiB the unit keeps up instead of printing 976562500000000019418578944.0
    assert format_bytes(3 << 50) == "3.0 PiB"
    assert format_bytes((1 << 63) - 1) == "8.0 EiB"
    assert format_bytes(1e30) == "8.67e+11 EiB"


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 << 30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5k") == 1536
    assert parse_bytes(" 3 mib ") == 3 << 20
    assert parse_bytes(4096) == 4096
    for bad in ("", "12 parsecs", "GiB", 0, -1, True, None):
        with pytest.raises(ValueError, match="device_budget: cannot read"):
            parse_bytes(bad, "device_budget")


def test_parse_bytes_numpy_exponents_petabytes_and_non_finite():
    import numpy as np

    assert parse_bytes(np.int64(1 << 30)) == 1 << 30
    assert parse_bytes(np.float32(4096.0)) == 4096
    assert parse_bytes("1e9") == 10**9 and parse_bytes("2.5e3 KiB") == 2560000
    assert parse_bytes("1PiB") == 1 << 50 and parse_bytes("1PB") == 10**15
    # int() of these raised its own ValueError / OverflowError, naming nothing
    for bad in (float("nan"), float("inf"), -float("inf"), np.float64("nan"),
                "1e999", np.bool_(True)):
        with pytest.raises(ValueError, match=r"^memory_budget: cannot read .* as a "
                           "positive size"):
            parse_bytes(bad, "memory_budget")


def test_parse_bytes_refuses_sizes_of_an_exbibyte_and_more():
    assert parse_bytes("1023PiB") == 1023 << 50 and parse_bytes("1EB") == 10**18
    assert parse_bytes((1 << 60) - 1) == (1 << 60) - 1
    # `leangnn plan --memory-budget 1e30GiB` took it and printed a 27-digit
    # number of TiB; the run's configuration refused it alone
    for bad in ("1e30GiB", "1EiB", 1 << 63, 1e19):
        with pytest.raises(ValueError, match=r"^--memory-budget: expected a size "
                           "below 1 EiB, got "):
            parse_bytes(bad, "--memory-budget")


def _draws():
    import random

    import numpy as np

    return (torch.rand(3).tolist(), np.random.rand(3).tolist(),
            np.random.normal(size=3).tolist(), random.random(), random.gauss(0, 1))


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    import numpy as np

    seed_everything(3)
    np.random.normal()  # leaves a cached Gaussian in NumPy's state
    state = get_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = _draws()
    seed_everything(99)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == expected


def test_bad_rng_state_is_refused_and_changes_nothing():
    seed_everything(5)
    state = get_rng_state()
    expected = _draws()
    set_rng_state(state)
    bad = {**state, "python": [3, [1, 2, 3], None]}  # 3 ints, not 625
    with pytest.raises(ValueError, match="random state: unreadable"):
        set_rng_state(bad)
    with pytest.raises(ValueError, match="random state: unreadable"):
        set_rng_state({"torch": "x"})
    assert _draws() == expected


def test_append_jsonl_writes_standard_json(tmp_path):
    p = tmp_path / "m.jsonl"
    append_jsonl(p, {"a": float("nan"), "b": [float("-inf"), 1.5]})
    append_jsonl(p, {"c": 2})
    assert p.read_text() == '{"a": null, "b": [null, 1.5]}\n{"c": 2}\n'


def test_before_replace_sees_the_complete_temporary_file(tmp_path):
    seen = []

    def check(tmp):
        seen.append(torch.load(tmp, weights_only=True)["x"].tolist())
        assert tmp.name == f".c.pt.{os.getpid()}.tmp" and tmp == temp_path(
            tmp_path / "c.pt")
        assert not (tmp_path / "c.pt").exists()  # not yet replaced

    atomic_torch_save({"x": torch.arange(3)}, tmp_path / "c.pt", before_replace=check)
    assert seen == [[0, 1, 2]] and (tmp_path / "c.pt").exists()

    def fail(tmp):
        raise OSError("no space left")

    with pytest.raises(OSError, match="no space"):
        atomic_torch_save({"x": torch.ones(1)}, tmp_path / "c.pt", before_replace=fail)
    assert torch.load(tmp_path / "c.pt", weights_only=True)["x"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
