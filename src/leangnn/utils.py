"""Small shared helpers: atomic file writes, seeding, human-readable sizes."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["atomic_write_text", "atomic_torch_save", "append_jsonl", "seed_everything",
           "format_bytes", "parse_bytes"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000**2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


def parse_bytes(value: str | int | float, name: str = "size") -> int:
    """``"2GiB"``, ``"512MB"``, ``"1.5g"`` or a positive number of bytes -> ``int``.

    Raises:
        ValueError: naming ``name`` and the value when it is not a positive size.
    """
    out = 0
    if isinstance(value, int | float) and not isinstance(value, bool):
        out = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            out = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if out <= 0:
        raise ValueError(f"{name}: cannot read {value!r} as a positive size; use "
                         "e.g. 2GiB, 512MB or a number of bytes")
    return out


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace``, so a
    crash never leaves a half-written file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """:func:`torch.save` through a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    torch.save(obj, tmp)
    os.replace(tmp, path)


def append_jsonl(path: str | Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def format_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
