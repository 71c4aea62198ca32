"""Atomic writes and small helpers."""

from __future__ import annotations

import pytest
import torch

from leangnn import utils
from leangnn.utils import (
    atomic_torch_save,
    atomic_write_text,
    format_bytes,
    parse_bytes,
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


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 << 30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5k") == 1536
    assert parse_bytes(" 3 mib ") == 3 << 20
    assert parse_bytes(4096) == 4096
    for bad in ("", "12 parsecs", "GiB", 0, -1, True, None):
        with pytest.raises(ValueError, match="device_budget: cannot read"):
            parse_bytes(bad, "device_budget")
