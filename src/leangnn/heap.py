"""glibc's heap for CPU training: the compact heap the ``leangnn`` command runs in.

Under glibc's default ``malloc`` a CPU training run's resident memory is
1.2-4x its live tensors, differs from process to process by up to 2x, and
can keep growing from epoch to epoch: a residual GCN stack on csbm:8000
(16 layers, 146 MiB of live tensors) peaked at 498 MiB in its first epoch
and at 841 MiB by its 20th. The tensors are not the cause. Each step frees
``E x C`` blocks of tens of MiB, and the small objects allocated beside the
tensors (tensor, storage and autograd objects, under 1 KiB) land in those
holes. Freed small chunks wait in glibc's per-thread cache (*tcache*),
where they count as used: they keep the holes from merging, and the next
step's large blocks no longer fit in them.

Three of glibc's tunables remove that (``GLIBC_TUNABLES``, measured on the
run above through ``leangnn train``, 3 processes each; ``benchmarks/README.md``,
"The compact heap"):

* ``glibc.malloc.tcache_count=0``: a freed small chunk goes back to the
  heap's free lists and merges with its neighbours at once;
* ``glibc.malloc.mmap_threshold=33554432``: blocks of 32 MiB and more are
  mapped, smaller ones come from the heap. This is glibc's dynamic threshold
  fixed at its ceiling (with a ``E x C`` block freed, the default rises to
  that size anyway); setting any of these tunables stops the dynamic
  adjustment;
* ``glibc.malloc.trim_threshold=4294967296``: the heap's top is not handed
  back during a step. Otherwise the now compact heap is returned and faulted
  in again at every step. The Trainer still releases free pages after every
  epoch (:func:`leangnn.profile.release_free_heap`).

That run then peaked at 184 MiB instead of 713 MiB, at 0.52 s instead of
0.77 s per epoch. glibc reads the tunables when a process starts, so the
``leangnn`` command re-executes itself once with them added
(:func:`ensure_compact_heap`). A Python process that calls
:func:`leangnn.fit` gets them by starting with :func:`compact_heap_env`'s
environment (``export GLIBC_TUNABLES=...``, see the README). The planner
reads which heap its process has (:func:`heap_mode`) and uses that mode's
calibration.

One more setting is not glibc's: ``MKL_DISABLE_FAST_MM=1`` (:data:`MKL_ENV`)
turns off MKL's own per-thread buffer cache. With more than one thread each
MKL worker keeps the buffers its share of a matrix product packed, held
until the process ends (``mkl_serv_mem_stat``: 17 MiB in 4 buffers after a
20000x128 @ 128x128 product at 2 threads, none at 1; the DAG model's
products keep some on one thread too: 2-4 MiB of its peak). Through
``leangnn train``, 3 epochs, 2 threads against 1: csbm:8000 SAGE-3 74.6 MiB
against 61.6 with the cache, 61.0 against 61.1 without; default circuits
GSR-8 at 128 channels 29.7 against 21.6 with the cache, 23.1 against 22.0
(two processes each; ``benchmarks/README.md``,
"Threads"). MKL reads it when the process starts, like glibc its tunables.

Off switch: ``LEANGNN_HEAP=default`` (glibc and MKL as they come). A
``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES`` ``malloc`` setting of the
user's own is left as it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["COMPACT_TUNABLES", "HEAP_MODES", "MMAP_ENV", "MKL_ENV", "heap_mode",
           "mmap_threshold", "heap_threshold", "compact_heap_env",
           "default_heap_env", "heap_env", "ensure_compact_heap",
           "mkl_buffers_cached", "mkl_buffer_bytes"]

#: the tunables of the compact heap, in ``GLIBC_TUNABLES`` syntax
COMPACT_TUNABLES = ("glibc.malloc.tcache_count=0",
                    "glibc.malloc.mmap_threshold=33554432",
                    "glibc.malloc.trim_threshold=4294967296")

#: what :func:`heap_mode` returns
HEAP_MODES = ("default", "compact", "mmap")

#: glibc's mmap threshold pinned at 64 KiB: resident memory follows the live
#: tensors (the ``mmap`` mode; slow, every block above it faulted in afresh)
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

#: MKL's per-thread buffer cache off (any non-empty value turns it off):
#: part of the compact heap's environment
MKL_ENV = {"MKL_DISABLE_FAST_MM": "1"}

#: set in the re-executed process: never re-execute twice
_REEXEC = "LEANGNN_HEAP_REEXEC"


def _tunables(env: Mapping[str, str]) -> list[str]:
    return [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]


def heap_mode(env: Mapping[str, str] | None = None) -> str:
    """The glibc heap a process started with ``env`` (default: this one's)
    has: ``"mmap"`` (``MALLOC_MMAP_THRESHOLD_`` set: every block above it
    mapped), ``"compact"`` (:data:`COMPACT_TUNABLES`'s ``tcache_count=0``)
    or ``"default"``."""
    env = os.environ if env is None else env
    if env.get("MALLOC_MMAP_THRESHOLD_"):
        return "mmap"
    return "compact" if COMPACT_TUNABLES[0] in _tunables(env) else "default"


def mmap_threshold(env: Mapping[str, str] | None = None) -> int | None:
    """The fixed mmap threshold of a process started with ``env`` (default:
    this one's): ``MALLOC_MMAP_THRESHOLD_``, else the
    ``glibc.malloc.mmap_threshold`` tunable, else ``None`` (glibc's dynamic
    threshold)."""
    env = os.environ if env is None else env
    value = env.get("MALLOC_MMAP_THRESHOLD_", "")
    if not value:
        for t in _tunables(env):
            name, _, v = t.partition("=")
            if name == "glibc.malloc.mmap_threshold":
                value = v
    value = value.strip()
    return int(value) if value.isdigit() else None


def heap_threshold(device="cpu", env: Mapping[str, str] | None = None) -> int:
    """Bytes below which a process's CPU tensors come from glibc's heap (on
    ``device``): the fixed threshold when set (:func:`mmap_threshold`, the
    compact heap's tunable), else glibc's dynamic threshold at its 64-bit
    maximum (32 MiB), which it reaches once large blocks have been freed; 0
    (no heap to follow) on CUDA or off Linux."""
    import torch

    if torch.device(device).type != "cpu" or not sys.platform.startswith("linux"):
        return 0
    fixed = mmap_threshold(env)
    return 32 << 20 if fixed is None else fixed


def compact_heap_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with :data:`COMPACT_TUNABLES` added
    to ``GLIBC_TUNABLES`` (a tunable the user set keeps the user's value),
    :data:`MKL_ENV` (unless the user set it) and no
    ``MALLOC_MMAP_THRESHOLD_``."""
    out = dict(os.environ if env is None else env)
    out.pop("MALLOC_MMAP_THRESHOLD_", None)
    have = _tunables(out)
    names = {t.split("=", 1)[0] for t in have}
    add = [t for t in COMPACT_TUNABLES if t.split("=", 1)[0] not in names]
    out["GLIBC_TUNABLES"] = ":".join(have + add)
    for k, v in MKL_ENV.items():
        out[k] = out.get(k) or v
    return out


def default_heap_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` without :data:`COMPACT_TUNABLES`, :data:`MKL_ENV` and
    ``MALLOC_MMAP_THRESHOLD_``: glibc's default heap (and MKL's)."""
    out = dict(os.environ if env is None else env)
    out.pop("MALLOC_MMAP_THRESHOLD_", None)
    for k, v in MKL_ENV.items():
        if out.get(k) == v:
            del out[k]
    rest = [t for t in _tunables(out) if t not in COMPACT_TUNABLES]
    if rest:
        out["GLIBC_TUNABLES"] = ":".join(rest)
    else:
        out.pop("GLIBC_TUNABLES", None)
    return out


def heap_env(mode: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a child process that must run in
    heap ``mode`` (:data:`HEAP_MODES`), whether it is the ``leangnn`` command
    (which re-executes itself into the compact heap unless told not to) or
    any other Python process."""
    if mode not in HEAP_MODES:
        raise ValueError(f"heap mode: expected one of {HEAP_MODES}, got {mode!r}")
    if mode == "compact":
        out = compact_heap_env(env)
        out.pop("LEANGNN_HEAP", None)
        return out
    out = default_heap_env(env)
    out["LEANGNN_HEAP"] = "default"
    if mode == "mmap":
        out.update(MMAP_ENV)
    return out


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def ensure_compact_heap() -> None:
    """Re-execute this process with the compact heap's tunables, once.

    For the ``leangnn`` command's entry point only (it replaces the process):
    on Linux with glibc, unless ``LEANGNN_HEAP=default`` (``compact``, the
    default, or ``default``: any other value is the command's one error
    line, exit status 2), the user set
    ``MALLOC_MMAP_THRESHOLD_`` or a ``tcache_count`` of their own, or this
    process is already the re-executed one. Where the re-execution cannot
    happen the command goes on with the heap it has.
    """
    raw = os.environ.get("LEANGNN_HEAP", "")
    setting = raw.strip().lower() or "compact"
    if setting not in ("compact", "default"):
        # (the command's own error line: nothing else has run yet)
        print(f"leangnn: error: LEANGNN_HEAP must be compact or default, got "
              f"{raw!r}", file=sys.stderr)
        raise SystemExit(2)
    if setting == "default" or not sys.platform.startswith("linux") or \
            os.environ.get(_REEXEC):
        return
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or any(
            t.startswith("glibc.malloc.tcache_count=")
            for t in _tunables(os.environ)):
        return
    argv = getattr(sys, "orig_argv", None)
    if not argv or not sys.executable or not _glibc():
        return
    env = compact_heap_env()
    env[_REEXEC] = "1"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        os.execve(sys.executable, argv, env)
    except OSError:
        return


def mkl_buffers_cached(env: Mapping[str, str] | None = None) -> bool:
    """Whether a process started with ``env`` (default: this one's) keeps
    MKL's per-thread buffers (its torch uses MKL and ``MKL_DISABLE_FAST_MM``
    is unset or empty): then a run on more than one thread holds them beside
    its tensors, which the planner's one-thread calibration does not see."""
    env = os.environ if env is None else env
    if env.get("MKL_DISABLE_FAST_MM"):
        return False
    import torch

    return bool(torch.backends.mkl.is_available())


def mkl_buffer_bytes() -> int | None:
    """Bytes MKL's allocator holds now in this process (``mkl_serv_mem_stat``
    of the MKL linked into torch); ``None`` where torch has no MKL or does
    not export it."""
    import ctypes

    import torch

    if not torch.backends.mkl.is_available():
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        stat = ctypes.CDLL(path).mkl_serv_mem_stat
    except (OSError, AttributeError):
        return None
    stat.argtypes, stat.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int64
    buffers = ctypes.c_int()
    return int(stat(ctypes.byref(buffers)))
