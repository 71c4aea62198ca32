"""Small shared helpers: atomic file writes, seeding and RNG state, sizes."""

from __future__ import annotations

import json
import math
import numbers
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["atomic_write_text", "atomic_torch_save", "append_jsonl", "seed_everything",
           "get_rng_state", "set_rng_state", "format_bytes", "parse_bytes", "MAX_BYTES",
           "cache_root", "remove_stale_tmp", "temp_path", "json_safe"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000**2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40, "p": 1 << 50, "pb": 1000**5,
          "pib": 1 << 50, "eb": 1000**6, "eib": 1 << 60}


#: sizes start below this (1 EiB): a byte count stays an int64 with room for
#: the sums a plan makes of it
MAX_BYTES = 1 << 60


def parse_bytes(value: str | int | float, name: str = "size") -> int:
    """``"2GiB"``, ``"512MB"``, ``"1.5g"``, ``"1e9"`` or a positive number of
    bytes (a numpy scalar too) -> ``int``.

    Raises:
        ValueError: naming ``name`` and the value when it is not a positive,
            finite size below :data:`MAX_BYTES` (1 EiB).
    """
    out = 0
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        # int() of NaN or Inf raises its own error, which names no argument
        out = int(value) if math.isfinite(value) else 0
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*",
                         value)
        if m and m.group(2).lower() in _UNITS:
            size = float(m.group(1)) * _UNITS[m.group(2).lower()]
            out = int(size) if math.isfinite(size) else 0
    if out <= 0:
        raise ValueError(f"{name}: cannot read {value!r} as a positive size; use "
                         "e.g. 2GiB, 512MB or a number of bytes")
    if out >= MAX_BYTES:
        raise ValueError(f"{name}: expected a size below 1 EiB, got {value!r}")
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


def temp_path(path: str | Path) -> Path:
    """This process's temporary file for an atomic write of ``path``
    (``.NAME.PID.tmp`` beside it; :func:`remove_stale_tmp` knows the pattern)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}{_TMP_SUFFIX}")


_tmp = temp_path


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


def _atomic(path: str | Path, write, before_replace=None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, ``fsync`` and
    ``os.replace``, so a crash never leaves a half-written file behind."""
    _atomic(path, lambda f: f.write(text.encode()))


def atomic_torch_save(obj: Any, path: str | Path,
                      before_replace: Callable[[Path], None] | None = None) -> None:
    """:func:`torch.save` through a temporary file, ``fsync`` and ``os.replace``.

    Args:
        before_replace (callable, optional): called with the temporary file's
            path once it is complete on disk, just before it replaces ``path``
            (e.g. to keep the file being replaced). (default: ``None``)
    """
    _atomic(path, lambda f: torch.save(obj, f), before_replace)


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
    """Append ``record`` as one line of standard JSON (non-finite floats become
    ``null``) and ``fsync`` it, so the line survives a crash right after."""
    line = json.dumps(json_safe(record), allow_nan=False) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    """The Python, NumPy, torch (and CUDA) random states as tensors, ints and
    lists only, so a checkpoint holding them loads with
    ``torch.load(weights_only=True)``; :func:`set_rng_state` restores them
    exactly."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind),
                  "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "python": [int(version), [int(v) for v in internal], gauss_next],
        "cuda": list(torch.cuda.get_rng_state_all())
        if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned.

    Raises:
        ValueError: when ``state`` does not have that layout.
    """
    try:
        np_state = state["numpy"]
        keys = np_state["keys"]
        if not isinstance(keys, torch.Tensor) or keys.numel() != 624:
            raise ValueError("numpy keys must be a tensor of 624 ints")
        version, internal, gauss_next = state["python"]
        np_tuple = (np_state["kind"], keys.cpu().numpy().astype(np.uint32),
                    int(np_state["pos"]), int(np_state["has_gauss"]),
                    float(np_state["cached_gaussian"]))
        py_tuple = (int(version), tuple(int(v) for v in internal), gauss_next)
        torch_state = state["torch"]
        cuda = state.get("cuda") or []
        if not all(isinstance(t, torch.Tensor) for t in [torch_state, *cuda]):
            raise ValueError("torch and CUDA states must be tensors")
        # All or nothing: a state that fails half-way leaves the old one in place.
        previous = torch.get_rng_state(), np.random.get_state(), random.getstate()
        try:
            torch.set_rng_state(torch_state.cpu())  # takes a CPU ByteTensor only
            np.random.set_state(np_tuple)
            random.setstate(py_tuple)
        except BaseException:
            torch.set_rng_state(previous[0])
            np.random.set_state(previous[1])
            random.setstate(previous[2])
            raise
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError,
            AttributeError) as e:
        raise ValueError(f"random state: unreadable ({type(e).__name__}: "
                         f"{_first_line(e)})") from None
    if cuda and torch.cuda.is_available():
        # A run resumed on a machine with fewer GPUs restores the ones it has.
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def format_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB" if abs(n) < 1024 else f"{n:.3g} EiB"
