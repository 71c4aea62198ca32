"""``RunDir``: every file of one training run, written so that a crash loses
at most the epoch in flight and a damaged or planted file is refused, not run.

A run directory holds

* ``config.json``: the resolved :class:`~leangnn.config.TrainConfig`;
* ``metrics.jsonl``: one line of standard JSON per epoch, flushed and
  ``fsync``-ed before the epoch's checkpoint is written;
* ``checkpoint.pt`` and ``checkpoint.prev.pt``: the last and the previous
  epoch's state. The new checkpoint is written to a temporary file first; the
  old one is hard-linked to ``checkpoint.prev.pt`` before the new one replaces
  it, so at every instant ``checkpoint.pt`` is a complete checkpoint. Both are
  read with ``torch.load(weights_only=True)`` only, so a checkpoint carrying
  code is refused rather than executed; a damaged one falls back to the
  previous one, saying so, and is kept as ``checkpoint.pt.damaged``;
* ``summary.json``: final metrics, memory, times and the environment;
* ``.lock`` while a run holds the directory (``fcntl.flock``), naming its pid.

:class:`~leangnn.train.Trainer` owns the loop and leaves every file to
:class:`RunDir`; ``RunDir(None)`` keeps nothing, for training in memory.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import platform
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .utils import (
    append_jsonl,
    atomic_torch_save,
    atomic_write_text,
    json_safe,
    remove_stale_tmp,
    temp_path,
)

__all__ = ["RunDir", "RunDirError", "CheckpointError", "UnsafeCheckpointError",
           "environment"]

#: Crash-test hook: ``crash_hook(point, tmp)`` runs at each point where a
#: killed process must still leave a resumable run: ``"checkpoint-written"``
#: (the new checkpoint is complete in the temporary file ``tmp``) and
#: ``"checkpoint-rotated"`` (the old one is also kept as ``checkpoint.prev.pt``,
#: ``checkpoint.pt`` not yet replaced). ``None`` outside tests.
crash_hook: Callable[[str, Path], None] | None = None


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (held by another run, or
    holding an old run that a fresh one would overwrite)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding objects other than tensors and plain data (code,
    arbitrary classes): refused outright, never loaded."""


def _crash_point(point: str, tmp: Path) -> None:
    if crash_hook is not None:
        crash_hook(point, tmp)


def _first_line(e: BaseException) -> str:
    for line in str(e).splitlines():
        if line.strip():
            return line.strip()
    return "empty file" if isinstance(e, EOFError) else type(e).__name__


def environment() -> dict[str, Any]:
    """What a run's numbers depend on beyond its config: library versions,
    platform, the number of CPU threads (the same seed gives the same CPU
    metrics only at the same thread count) and the CPU heap
    (:func:`leangnn.heap.heap_mode`: its resident peak depends on it)."""
    import numpy as np
    import torch_geometric

    from leangnn.heap import heap_mode

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "torch_geometric": torch_geometric.__version__, "numpy": np.__version__,
           "platform": platform.platform(), "num_threads": torch.get_num_threads(),
           "cuda": torch.version.cuda,
           "cuda_devices": [torch.cuda.get_device_name(i) for i in
                            range(torch.cuda.device_count())]
           if torch.cuda.is_available() else [],
           "heap": heap_mode()}
    try:
        from importlib.metadata import version

        env["leangnn"] = version("leangnn")
    except Exception:  # not installed as a distribution (e.g. a source tree)
        env["leangnn"] = None
    return env


def _json_object(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _not_ours(path: Path, name: str) -> str | None:
    """Why ``path`` (one of :attr:`RunDir.FILES`, no config beside it) is not
    a leangnn run's file; ``None`` when it is."""
    import zipfile

    if name == RunDir.METRICS:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            ok = all(isinstance(r := json.loads(x), dict) and "epoch" in r
                     for x in lines if x.strip())
        except (OSError, ValueError):
            ok = False
        return None if ok else "not JSON lines with an 'epoch' each"
    if name in (RunDir.SUMMARY, RunDir.PLAN):
        d = _json_object(path)
        key = "memory" if name == RunDir.SUMMARY else "rows"
        return None if d is not None and key in d else \
            f"not a JSON object with {key!r}"
    if name == RunDir.DAMAGED:
        return None  # only leangnn names a file so
    # a checkpoint: torch's zip whose pickle holds the Trainer's state keys
    # (read as bytes, never unpickled: the file may be anyone's)
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next((n for n in z.namelist() if n.endswith("/data.pkl")), None)
            data = z.read(pkl) if pkl else b""
    except (OSError, zipfile.BadZipFile):
        data = b""
    return None if all(k in data for k in (b"format", b"best_state",
                                           b"bad_epochs")) else \
        "not a checkpoint of the Trainer's"


class RunDir:
    """The files of one training run: lock, config, metrics, checkpoints, summary.

    Args:
        path (str or Path, optional): the directory; ``None`` disables every
            file (training in memory; :meth:`load_checkpoint` then fails).

    Use as ``with RunDir(path).open(resume=..., force=...) as run: ...``; the
    lock is held until the block ends.
    """

    CONFIG = "config.json"
    METRICS = "metrics.jsonl"
    CHECKPOINT = "checkpoint.pt"
    PREVIOUS = "checkpoint.prev.pt"
    SUMMARY = "summary.json"
    PLAN = "plan.json"
    DAMAGED = "checkpoint.pt.damaged"
    LOCK = ".lock"
    #: Files that make a directory hold a run (a fresh run refuses to overwrite).
    FILES = (CONFIG, METRICS, CHECKPOINT, PREVIOUS, SUMMARY, PLAN, DAMAGED)
    #: Checkpoint layout version: tensors, numbers, strings and lists only.
    FORMAT = 2

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self._lock_fd: int | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({str(self.path) if self.path else None})"

    # ------------------------------------------------------------ lifecycle
    def open(self, resume: bool = False, force: bool = False) -> RunDir:
        """Create (or reopen, with ``resume``) the directory and lock it.

        Leftover temporary files of killed writers are removed. A fresh run
        into a directory that already holds one is refused unless ``force``,
        which deletes the old run's files first.

        Raises:
            RunDirError: another process holds the directory (its pid is
                named), it holds an old run and neither ``resume`` nor
                ``force`` is given, or it cannot be created.
            FileNotFoundError: ``resume`` and the directory does not exist.
        """
        if self.path is None:
            return self
        if self._lock_fd is not None:
            raise RuntimeError(f"{self!r} is already open")
        if resume and not self.path.is_dir():
            raise FileNotFoundError(f"resume: no run directory at {self.path}")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a read-only or special file system (/proc)
            raise RunDirError(f"out: cannot create the run directory "
                              f"{str(self.path)!r} ({e.strerror or e})") from None
        self._lock()
        try:
            remove_stale_tmp(self.path)
            if not resume:
                found = [n for n in self.FILES if (self.path / n).exists()]
                if found and not force:
                    raise RunDirError(
                        f"out: {self.path} already holds a run ({', '.join(found)}); "
                        "resume it (--resume), overwrite it (--force) or choose "
                        "another --out")
                foreign = self._foreign(found)
                if foreign:
                    # --force replaces a leangnn run, never a user's own files
                    # that happen to share a name (a project's config.json)
                    raise RunDirError(
                        f"out: {self.path / foreign[0]} was not written by a "
                        f"leangnn run ({foreign[1]}); --force only replaces "
                        "leangnn runs: choose another --out")
                for name in found:
                    (self.path / name).unlink()
                atomic_write_text(self.path / self.METRICS, "")
        except BaseException:
            self.close()
            raise
        return self

    def _foreign(self, found: list[str]) -> tuple[str, str] | None:
        """The first of ``found`` that is not a leangnn run's file, with why.

        A run's ``config.json`` vouches for the rest of the directory; without
        one, each file must show it is ours by its content (checkpoints by
        the keys of the Trainer's state in their pickle)."""
        if self.CONFIG in found:
            d = _json_object(self.path / self.CONFIG)
            if d is None or not {"strategy", "model"} <= d.keys():
                return self.CONFIG, "not a JSON object with 'strategy' and 'model'"
            return None
        for name in found:
            why = _not_ours(self.path / name, name)
            if why:
                return name, why
        return None

    def close(self) -> None:
        """Release the lock (and remove the lock file)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        try:
            # Unlinked while still locked: a waiter that opened this file sees
            # it is gone (inode check in _lock) and locks a fresh one.
            (self.path / self.LOCK).unlink(missing_ok=True)
        finally:
            os.close(fd)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock on this platform: runs are not guarded
            return
        path = self.path / self.LOCK
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise RunDirError(
                        f"out: {self.path} is in use by another leangnn run (pid "
                        f"{holder or 'unknown'}); wait for it to end or choose "
                        "another --out") from None
                warnings.warn(f"{path}: cannot lock ({e}); two runs on this "
                              "directory would not be stopped", RuntimeWarning,
                              stacklevel=3)
                return
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder we waited for removed it; lock anew
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    # ---------------------------------------------------------------- files
    def write_config(self, config: Any) -> None:
        """Write ``config`` (a dict or an object with ``to_dict()``)."""
        if self.path is None:
            return
        d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        atomic_write_text(self.path / self.CONFIG,
                          json.dumps(json_safe(d), indent=2, allow_nan=False) + "\n")

    def write_plan(self, plan: dict[str, Any]) -> None:
        """Write ``plan.json``: the planner's table and pick of a
        ``--strategy auto`` run, read back by :meth:`read_plan` on resume."""
        if self.path is not None:
            atomic_write_text(self.path / self.PLAN, json.dumps(
                json_safe(plan), indent=1, allow_nan=False) + "\n")

    def read_plan(self) -> dict[str, Any] | None:
        """The saved plan (``None``: the run was not planned).

        Raises:
            RunDirError: the file is not JSON (named, with the parser's reason).
        """
        path = None if self.path is None else self.path / self.PLAN
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise RunDirError(f"{path}: not a JSON plan: {e}") from None

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one epoch's record to ``metrics.jsonl`` (fsync-ed)."""
        if self.path is not None:
            append_jsonl(self.path / self.METRICS, record)

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl``; a line cut short by a crash is skipped."""
        if self.path is None or not (self.path / self.METRICS).is_file():
            return []
        out = []
        for line in (self.path / self.METRICS).read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def truncate_metrics(self, epochs: int) -> None:
        """Keep the records of epochs ``1..epochs`` (those the checkpoint has)."""
        if self.path is None:
            return
        keep = [r for r in self.read_metrics()
                if isinstance(r.get("epoch"), int) and r["epoch"] <= epochs]
        atomic_write_text(self.path / self.METRICS, "".join(
            json.dumps(r, allow_nan=False) + "\n" for r in keep))

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (standard JSON: non-finite floats -> null)."""
        if self.path is not None:
            atomic_write_text(self.path / self.SUMMARY, json.dumps(
                json_safe(summary), indent=2, allow_nan=False) + "\n")

    # ---------------------------------------------------------- checkpoints
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ``state`` as ``checkpoint.pt``, keeping the one it replaces as
        ``checkpoint.prev.pt``. ``state`` must hold only tensors, numbers,
        strings, ``None`` and lists/tuples/dicts of them."""
        if self.path is None:
            return
        ckpt, prev = self.path / self.CHECKPOINT, self.path / self.PREVIOUS

        def keep_previous(tmp: Path) -> None:
            _crash_point("checkpoint-written", tmp)
            if ckpt.exists():
                _link_or_copy(ckpt, prev)
            _crash_point("checkpoint-rotated", tmp)

        atomic_torch_save({"format": self.FORMAT, **state}, ckpt,
                          before_replace=keep_previous)

    def load_checkpoint(self, apply: Callable[[dict[str, Any]], None] | None = None,
                        map_location: Any = "cpu", read_only: bool = False
                        ) -> dict[str, Any]:
        """The latest usable checkpoint, applied with ``apply(state)``.

        ``checkpoint.pt`` is tried first; when it is damaged, or ``apply``
        rejects it (``ValueError``, ``RuntimeError``, ``KeyError``,
        ``TypeError``), ``checkpoint.prev.pt`` is tried, with a
        :class:`RuntimeWarning` saying so, and becomes ``checkpoint.pt``
        again unless ``read_only`` (a rank of a multi-process job other than
        the one that writes the run).

        Raises:
            FileNotFoundError: neither file exists.
            UnsafeCheckpointError: a checkpoint holds code or other objects
                beyond tensors and plain data (never loaded, no fallback).
            CheckpointError: no checkpoint is usable; one line naming each file.
        """
        if self.path is None:
            raise ValueError("resume: this trainer keeps no run directory "
                             "(training in memory)")
        ckpt, prev = self.path / self.CHECKPOINT, self.path / self.PREVIOUS
        if not ckpt.is_file() and not prev.is_file():
            raise FileNotFoundError(f"resume: no checkpoint in {self.path} "
                                    f"({ckpt.name} is missing); --force starts "
                                    "the run over")
        failures: list[str] = []
        for path in (ckpt, prev):
            if not path.is_file():
                failures.append(f"{path}: missing")
                continue
            try:
                state = self.read_checkpoint(path, map_location)
            except UnsafeCheckpointError:
                raise
            except CheckpointError as e:
                failures.append(str(e))
                continue
            if apply is not None:
                try:
                    apply(state)
                except (ValueError, RuntimeError, KeyError, TypeError,
                        IndexError) as e:
                    failures.append(f"{path}: does not fit this run "
                                    f"({_first_line(e)})")
                    continue
            if failures:
                kept = "" if read_only else self._reinstate(path)
                warnings.warn(f"{'; '.join(failures)}; resuming from {path} "
                              f"(epoch {state['epoch']}) instead{kept}",
                              RuntimeWarning, stacklevel=2)
            return state
        raise CheckpointError("; ".join(failures))

    def _reinstate(self, prev: Path) -> str:
        # The good previous checkpoint becomes checkpoint.pt again, so the
        # next rotation keeps it (not the damaged file) as the previous one.
        ckpt, damaged = self.path / self.CHECKPOINT, self.path / self.DAMAGED
        note = ""
        if ckpt.exists():
            os.replace(ckpt, damaged)
            note = f"; the damaged file is kept as {damaged.name}"
        _link_or_copy(prev, ckpt)
        return note

    def read_checkpoint(self, path: str | Path,
                        map_location: Any = "cpu") -> dict[str, Any]:
        """Load one checkpoint file with ``weights_only=True`` and check its layout.

        Raises:
            UnsafeCheckpointError: the file holds code or arbitrary objects.
            CheckpointError: the file is damaged or not a leangnn checkpoint.
        """
        path = Path(path)
        try:
            state = torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
            if found:
                hint = (" (checkpoints of leangnn before format 2 stored NumPy "
                        "objects: start a fresh run with --force)"
                        if found.group(1).startswith("numpy") else "")
                raise UnsafeCheckpointError(
                    f"{path}: refused: it holds {found.group(1)}, which is not a "
                    "tensor or plain data; leangnn loads checkpoints with "
                    f"torch.load(weights_only=True) and never runs code from one"
                    f"{hint}") from None
            raise CheckpointError(f"{path}: unreadable ({_unpickling_reason(e)})"
                                  ) from None
        except Exception as e:  # torch.load raises many kinds on damaged files
            raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: "
                                  f"{_first_line(e)})") from None
        problem = _check_layout(state)
        if problem is not None:
            raise CheckpointError(f"{path}: {problem}")
        return state


def _link_or_copy(src: Path, dst: Path) -> None:
    """Atomically make ``dst`` a copy of ``src``: a hard link (O(1), and
    ``src`` never goes missing), or a copied file where links are not
    supported."""
    tmp = temp_path(dst)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(tmp, dst)


def _unpickling_reason(e: BaseException) -> str:
    found = re.search(r"(Unsupported operand \S+|WeightsUnpickler error: \S.*)",
                      str(e))
    return f"not a checkpoint: {found.group(1)}" if found else _first_line(e)


_REQUIRED = {"epoch": int, "best": (int, float), "bad_epochs": int,
             "epoch_times": list, "model": dict, "optimizer": dict,
             "strategy": dict, "rng": dict, "config": dict}


def _check_layout(state: Any) -> str | None:
    """What is wrong with a loaded checkpoint's layout (``None``: nothing)."""
    if not isinstance(state, dict):
        return f"not a leangnn checkpoint (holds a {type(state).__name__})"
    if state.get("format") != RunDir.FORMAT:
        return (f"not a leangnn checkpoint of format {RunDir.FORMAT} (format "
                f"{state.get('format')!r})")
    for key, kind in _REQUIRED.items():
        if key not in state:
            return f"damaged: no {key!r} entry"
        value = state[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            return (f"damaged: {key!r} is a {type(value).__name__}, expected "
                    f"{getattr(kind, '__name__', 'a number')}")
    if state["epoch"] < 0 or state["bad_epochs"] < 0:
        return "damaged: negative epoch counters"
    if not all(isinstance(t, int | float) for t in state["epoch_times"]):
        return "damaged: 'epoch_times' holds non-numbers"
    if len(state["epoch_times"]) != state["epoch"]:
        return (f"damaged: {len(state['epoch_times'])} epoch times for epoch "
                f"{state['epoch']}")
    for key in ("model", "best_state"):
        d = state.get(key)
        if d is not None and (not isinstance(d, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor)
                for k, v in d.items())):
            return f"damaged: {key!r} is not a mapping of names to tensors"
    return None
