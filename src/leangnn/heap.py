"""glibc heap controls: release free pages, cap the number of malloc arenas.

PyTorch's CPU tensors come straight from the C library's ``malloc`` (there is
no caching allocator on CPU), so on Linux/glibc the resident memory of a run
is the tensors plus whatever glibc keeps mapped. Two glibc behaviours make
that "whatever" grow with the work done rather than with the bytes in use:

* freed heap memory stays mapped (in holes between live blocks that the heap
  top cannot give back) until ``malloc_trim`` releases its pages;
* every thread that allocates gets an arena of its own (up to eight per core),
  and memory freed in one thread's arena is not reused by another thread's
  allocations; PyTorch's intra-op worker threads allocate temporaries, so the
  free memory spread over the arenas grows with the steps taken (with depth,
  for a reversible network that frees and re-allocates per layer).

Both are process-wide and change no value: only where free memory lives.
Elsewhere than glibc every function here returns ``False`` and does nothing.
"""

from __future__ import annotations

import ctypes
import os
import re
import tempfile

__all__ = ["release_free_heap", "limit_malloc_arenas", "malloc_arena_count",
           "ARENAS_ENV"]

# glibc's mallopt parameter number for the arena cap (<malloc.h>: M_ARENA_MAX)
_M_ARENA_MAX = -8
ARENAS_ENV = "LEANGNN_MALLOC_ARENAS"


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Hand the free pages of the C heap back to the OS (glibc ``malloc_trim``).

    glibc keeps freed heap memory mapped, and after a step whose temporaries
    were interleaved with long-lived tensors the free memory is scattered in
    holes that neither shrink the heap nor fit the next step's blocks, so RSS
    keeps the old peak and the next phase (validation) adds its own on top.
    ``malloc_trim(0)`` releases every free page of every arena, not just the
    heap's top, so the next phase starts from the bytes really in use. Values
    are untouched (only free pages go); cost: one walk over the heap
    (milliseconds at hundreds of MiB).

    Returns ``True`` when it ran (glibc), ``False`` elsewhere.
    """
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def limit_malloc_arenas(max_arenas: int | None = None) -> bool:
    """Cap the number of glibc malloc arenas (``mallopt(M_ARENA_MAX, n)``).

    With one arena, memory that a worker thread frees is reused by the next
    allocation of any thread, so a run's resident peak follows its live bytes
    instead of growing with the number of steps (measured: GSR at 256 layers
    over 16 layers through ``leangnn train``, see ``benchmarks/README.md``).
    The cap binds arenas created after the call; call it before the first
    parallel work (the command line does, first thing). The environment wins:
    when ``MALLOC_ARENA_MAX`` is set glibc already applied it and this does
    nothing.

    Args:
        max_arenas (int, optional): the cap; ``None`` reads
            ``LEANGNN_MALLOC_ARENAS`` (default ``1``; ``0`` is the off switch,
            glibc's own default of eight arenas per core).

    Returns:
        ``True`` when the cap was set, ``False`` when switched off, overridden
        by ``MALLOC_ARENA_MAX`` or not on glibc.
    """
    if max_arenas is None:
        raw = os.environ.get(ARENAS_ENV, "1").strip() or "1"
        try:
            max_arenas = int(raw)
        except ValueError:
            raise ValueError(f"{ARENAS_ENV} must be a whole number >= 0 (0: "
                             f"glibc's default), got {raw!r}") from None
    if max_arenas < 0:
        raise ValueError(f"limit_malloc_arenas: max_arenas must be >= 0, "
                         f"got {max_arenas}")
    if max_arenas == 0 or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, int(max_arenas)))


def malloc_arena_count() -> int | None:
    """The number of malloc arenas the process has now (glibc's
    ``malloc_info``), ``None`` where it cannot be read."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_info"):
        return None
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as f:
        fp = libc.fopen(f.name.encode(), b"w")
        if not fp:
            return None
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        text = f.read()
    return len(re.findall(r"<heap nr=", text)) or None
