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
           "format_bytes", "parse_bytes", "cache_root", "remove_stale_tmp",
           "json_safe"]

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


def cache_root(sub: str | None = None) -> Path:
    """The one on-disk cache of leangnn (parsed circuits, labels, partitions).

    ``$LEANGNN_CACHE``, else ``$XDG_CACHE_HOME/leangnn``, else
    ``~/.cache/leangnn``; ``sub`` names a folder inside it.
    """
    env = os.environ.get("LEANGNN_CACHE")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        root = Path(base) / "leangnn"
    return root / sub if sub else root


_TMP_SUFFIX = ".tmp"


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{_TMP_SUFFIX}")


def _fsync_dir(folder: Path) -> None:
    # The rename itself must reach the disk, or a power cut can undo it.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic(path: str | Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, ``fsync`` and
    ``os.replace``, so a crash never leaves a half-written file behind."""
    _atomic(path, lambda f: f.write(text.encode()))


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """:func:`torch.save` through a temporary file, ``fsync`` and ``os.replace``."""
    _atomic(path, lambda f: torch.save(obj, f))


def remove_stale_tmp(folder: str | Path) -> list[Path]:
    """Remove temporary files that killed writers left in ``folder``.

    Only files of processes that are no longer alive are removed, so a
    concurrent writer's temporary file survives. Returns the removed paths.
    """
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.glob(f".*{_TMP_SUFFIX}"):
        pid = p.name[: -len(_TMP_SUFFIX)].rsplit(".", 1)[-1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``None``, so that
    ``json.dumps`` writes standard JSON (no ``NaN`` / ``Infinity`` tokens)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.floating):
        return json_safe(float(obj))
    return obj


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
