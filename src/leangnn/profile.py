"""Memory measurement: peak device memory, peak RSS and bytes saved for backward.

Memory in leangnn is measured, never assumed (see ``DESIGN.md``):

* on CUDA, :func:`torch.cuda.reset_peak_memory_stats` and
  :func:`torch.cuda.max_memory_allocated` bracket the measured region;
* on CPU, the peak resident set size (``VmHWM``) of the process is reset after
  data and model are loaded (Linux ``/proc/self/clear_refs``), and the peak
  during the measured region minus the RSS at its start is reported; to keep
  other work out of the figure, :func:`measure_in_subprocess` runs the region
  in a fresh spawned interpreter;
* the bytes autograd keeps for backward are counted with
  :func:`torch.autograd.graph.saved_tensors_hooks` (:class:`SavedTensorsMeter`);
* the bytes of tensor storages alive inside a block (what a caching-free
  allocator would need, on CPU where no allocator statistics exist) are
  counted by a ``TorchDispatchMode`` (:class:`LiveBytesMeter`);
* the phases of one run (preprocessing, training, inference) get their peaks
  on one scale from :class:`PhaseMeter`.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = [
    "MemoryReport",
    "MemoryMeter",
    "resident_growth",
    "trim_heap_enabled",
    "PhaseMeter",
    "SavedTensorsMeter",
    "LiveBytesMeter",
    "sparse_parts",
    "rss_bytes",
    "peak_rss_bytes",
    "reset_peak_rss",
    "measure_in_subprocess",
    "release_free_heap",
    "CommandPeak",
    "run_with_peak_rss",
]


_MIB = float(1 << 20)


def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    """Current resident set size of this process in bytes."""
    v = _proc_status("VmRSS")
    if v is not None:
        return v
    # Portable fallback: ru_maxrss is the only figure getrusage gives.
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size since start or the last :func:`reset_peak_rss`."""
    v = _proc_status("VmHWM")
    if v is not None:
        return v
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux only).

    Returns ``True`` when the reset took effect; elsewhere the peak keeps
    covering everything since process start, which over-reports.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class MemoryReport:
    """A measured peak: ``peak_bytes`` above ``baseline_bytes``, and how."""

    peak_bytes: int
    method: str
    baseline_bytes: int = 0
    saved_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


class MemoryMeter:
    """Brackets a region and reports its peak memory above the region's start.

    Args:
        device (torch.device or str, optional): ``cuda[:i]`` uses the CUDA
            allocator's peak statistics; anything else measures process RSS.
            (default: ``"cpu"``)

    Example:
        >>> meter = MemoryMeter("cpu").start()
        >>> _ = torch.ones(1 << 20)
        >>> report = meter.stop()  # report.peak_bytes >= 4 MiB
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.baseline = 0
        self._reset_ok = True

    @property
    def method(self) -> str:
        if self.device.type == "cuda":
            return "cuda_max_memory_allocated"
        return "cpu_peak_rss" if self._reset_ok else "cpu_peak_rss_since_start"

    def start(self) -> MemoryMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            self._reset_ok = reset_peak_rss()
            self.baseline = rss_bytes()
        return self

    def peak(self) -> int:
        """Peak bytes above the baseline so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = peak_rss_bytes()
        return max(0, peak - self.baseline)

    def stop(self) -> MemoryReport:
        return MemoryReport(self.peak(), self.method, self.baseline)


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
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def trim_heap_enabled(flag: bool | None = None) -> bool:
    """Whether a CPU training loop hands freed heap back after every epoch
    (:func:`release_free_heap`): ``flag``, or for ``None`` the
    ``LEANGNN_TRIM_HEAP`` environment switch (on unless ``0``, ``false``,
    ``no`` or ``off``)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get("LEANGNN_TRIM_HEAP", "1").strip().lower() not in (
        "0", "false", "no", "off")


@contextmanager
def resident_growth(release: Callable[[], object] | None = None):
    """The process's resident growth over a ``with`` block: what the block
    left allocated (``grown["bytes"]``, set on exit), with freed heap
    returned before and after it (``release``: default
    :func:`release_free_heap`; the Trainer passes its own, which honours
    its off switch).

    Used for a strategy's setup (offload's engine topology, DPR's core),
    which is resident before a run's :class:`MemoryMeter` starts.
    """
    release = release or release_free_heap
    grown = {"bytes": 0}
    release()
    before = rss_bytes()
    yield grown
    release()
    grown["bytes"] = max(0, rss_bytes() - before)


class PhaseMeter:
    """Peak memory and wall time of the named phases of one run.

    Every :meth:`phase` is bracketed by a :class:`MemoryMeter`; its peak is
    reported relative to the memory when the meter was created (e.g. after
    the data is loaded), so phases of one run (preprocessing, training,
    inference) compare on one scale. On CPU, freed heap pages are handed back
    to the OS (glibc ``malloc_trim``) at creation and before every phase, so
    a phase is not charged for what an earlier one freed. Figures are in MiB.

    Args:
        device (torch.device or str, optional): see :class:`MemoryMeter`.
            (default: ``"cpu"``)

    Attributes:
        start_bytes (int): memory at creation (RSS, or CUDA bytes allocated).
        records (dict): phase name -> ``{"peak_mib", "start_mib",
            "seconds"}``: peak and phase-start memory above ``start_bytes``,
            and wall time; a repeated name overwrites its record.
        abs_peak_mib (float): highest absolute memory seen, ``start_bytes``
            included.

    Example:
        >>> meter = PhaseMeter("cpu")
        >>> with meter.phase("train"):
        ...     _ = torch.ones(1 << 20)
        >>> meter.peak("train")  # MiB above the start
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._trim()
        self.start_bytes = (torch.cuda.memory_allocated(self.device)
                            if self.device.type == "cuda" else rss_bytes())
        self.records: dict[str, dict[str, float]] = {}
        self.abs_peak_mib = self.start_bytes / _MIB

    def _trim(self) -> None:
        if self.device.type != "cuda":
            release_free_heap()

    @contextmanager
    def phase(self, name: str):
        """Measure the ``with`` block as phase ``name``."""
        self._trim()
        meter = MemoryMeter(self.device).start()
        t = time.perf_counter()
        yield self
        r = meter.stop()
        top = r.peak_bytes + r.baseline_bytes
        self.abs_peak_mib = max(self.abs_peak_mib, top / _MIB)
        self.records[name] = {"peak_mib": (top - self.start_bytes) / _MIB,
                              "start_mib": (r.baseline_bytes - self.start_bytes)
                              / _MIB,
                              "seconds": time.perf_counter() - t}

    def peak(self, *names: str) -> float:
        """Largest ``peak_mib`` among the recorded phases ``names``."""
        found = [self.records[n]["peak_mib"] for n in names if n in self.records]
        if not found:
            raise ValueError(f"no recorded phase among {names}; recorded: "
                             f"{sorted(self.records)}")
        return max(found)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(device={self.device}, "
                f"phases={list(self.records)})")


def sparse_parts(t: Tensor) -> tuple[Tensor, ...]:
    """The strided tensors holding a sparse tensor's data (``(t,)`` if dense)."""
    if t.layout == torch.sparse_coo:
        return (t._indices(), t._values())
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return (t.crow_indices(), t.col_indices(), t.values())
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return (t.ccol_indices(), t.row_indices(), t.values())
    return (t,)


def _sparse_bytes(t: Tensor) -> int:
    return sum(p.numel() * p.element_size() for p in sparse_parts(t))


class SavedTensorsMeter:
    """Counts the bytes autograd saves for backward inside a ``with`` block.

    Storages are de-duplicated, so a tensor saved by several nodes (or views
    of one storage) is counted once: the figure is what the graph pins in
    memory until backward runs.

    Attributes:
        bytes (int): unique bytes saved so far.
        count (int): number of tensors packed (with duplicates).
    """

    def __init__(self):
        self.bytes = 0
        self.count = 0
        self._seen: set[tuple[int, int]] = set()
        self._ctx = None

    def _pack(self, t: Tensor) -> Tensor:
        self.count += 1
        if t.layout != torch.strided:
            # sparse: what it holds is its index and value tensors, not N x M
            key, nbytes = (id(t), _sparse_bytes(t)), _sparse_bytes(t)
        else:
            try:
                storage = t.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                nbytes = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                key = (id(t), t.numel() * t.element_size())
                nbytes = key[1]
        if key not in self._seen:
            self._seen.add(key)
            self.bytes += nbytes
        # Not ``t`` itself: a saved output would then hold its own grad_fn, a
        # reference cycle that keeps activations alive after a forward
        # without backward (the trainer's measuring pass).
        return t.detach()

    @staticmethod
    def _unpack(t: Tensor) -> Tensor:
        return t

    def __enter__(self) -> SavedTensorsMeter:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)
        self._ctx = None


class LiveBytesMeter(TorchDispatchMode):
    """Peak bytes of tensor storages created inside a ``with`` block.

    Storages are counted once however many views share them and released
    when the last tensor using them dies (autograd keeps saved tensors alive,
    so they stay counted until backward frees them). Used by the offload
    engine on CPU, where no allocator statistics exist, to measure a job's
    device bytes; on CUDA use :class:`MemoryMeter`.

    Args:
        exclude (iterable of Tensor, optional): tensors whose storages are not
            counted (inputs allocated outside, parameters). (default: ``()``)
        rows (int, optional): also record, at the peak, the sizes of the
            storages alive then whose tensor has ``rows`` rows (a job's
            edge-sized blocks, given its edge count). (default: ``None``)

    Attributes:
        live (int): bytes alive now. peak (int): highest ``live`` seen.
        peak_row_blocks (list of int): with ``rows``, the bytes of each
            ``rows``-row storage alive at the peak.
    """

    def __init__(self, exclude: Iterable[Tensor] = (), rows: int | None = None):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.rows = rows
        self.peak_row_blocks: list[int] = []
        self._row_keys: set[int] = set()
        self._refs: dict[int, list[int]] = {}
        self._excl = {t.untyped_storage().data_ptr() for t in exclude
                      if t is not None}
        self._paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self._paused:
            # Outputs aliasing an input that predates the meter (in-place ops,
            # views of host arrays or of the cache pool) allocate nothing.
            # (a sparse tensor has no storage: its index and value tensors do)
            inputs = {p.untyped_storage().data_ptr()
                      for t in tree_flatten((args, kwargs))[0]
                      if isinstance(t, Tensor) for p in sparse_parts(t)}
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    for p in sparse_parts(t):
                        key = p.untyped_storage().data_ptr()
                        if key in inputs and key not in self._refs:
                            continue
                        self._track(p, owner=t)
        return out

    @contextmanager
    def paused(self):
        """Do not count tensors created inside (host-side bookkeeping)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def exclude(self, *tensors: Tensor) -> None:
        for t in tensors:
            if t is not None:
                self._excl.add(t.untyped_storage().data_ptr())

    def _track(self, t: Tensor, owner: Tensor | None = None) -> None:
        # ``owner``: the tensor whose death frees ``t``'s storage (a sparse
        # tensor's index and value tensors are fresh aliases on every access)
        st = t.untyped_storage()
        key = st.data_ptr()
        if key == 0 or key in self._excl:
            return
        ent = self._refs.get(key)
        if ent is None:
            self._refs[key] = [1, st.nbytes()]
            self.live += st.nbytes()
            shaped = t if owner is None else owner
            if self.rows is not None and shaped.dim() and shaped.shape[0] == self.rows:
                self._row_keys.add(key)
            if self.live > self.peak:
                self.peak = self.live
                if self.rows is not None:
                    self.peak_row_blocks = [self._refs[k][1] for k in self._row_keys]
        else:
            ent[0] += 1
        weakref.finalize(t if owner is None else owner, self._release, key)

    def _release(self, key: int) -> None:
        ent = self._refs.get(key)
        if ent is None:
            return
        ent[0] -= 1
        if ent[0] == 0:
            del self._refs[key]
            self._row_keys.discard(key)
            self.live -= ent[1]

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(live={self.live}, peak={self.peak})"


def _child(conn, setup, run, kwargs, device):
    try:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        state = setup(**kwargs)
        meter = MemoryMeter(device).start()
        result = run(state) or {}
        report = meter.stop()
        conn.send(("ok", result, report.to_dict()))
    except BaseException:  # noqa: BLE001 - forwarded to the parent verbatim
        conn.send(("error", traceback.format_exc(), None))
    finally:
        conn.close()


def measure_in_subprocess(
    setup: Callable[..., Any],
    run: Callable[[Any], dict | None],
    kwargs: dict | None = None,
    device: torch.device | str = "cpu",
    timeout: float | None = None,
) -> tuple[dict, dict]:
    """Run ``run(setup(**kwargs))`` in a fresh interpreter and measure ``run``.

    ``setup`` loads data and builds the model; the meter starts after it
    returns, so the report is the peak of ``run`` above the loaded state.
    Both callables must be importable (module-level functions).

    Returns:
        ``(result, memory)``: what ``run`` returned and the
        :class:`MemoryReport` as a dict.
    """
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child, args=(child, setup, run, kwargs or {}, str(device))
    )
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            proc.kill()
            raise TimeoutError(f"measured run did not finish within {timeout} s")
        status, payload, report = parent.recv()
    except EOFError as e:
        proc.join()
        raise RuntimeError(
            f"measured subprocess died with exit code {proc.exitcode} "
            "(out of memory?)"
        ) from e
    proc.join()
    if status != "ok":
        raise RuntimeError(f"measured subprocess failed:\n{payload}")
    return payload, report



@dataclass
class CommandPeak:
    """Peak resident memory of a command, measured from outside its process.

    Attributes:
        peak_bytes (int): the child's peak RSS (``ru_maxrss`` from ``wait4``,
            the kernel's own high-water mark of that process).
        sampled_peak_bytes (int): highest ``VmRSS`` seen by polling
            ``/proc/<pid>/status`` (0 where ``/proc`` is missing).
        seconds (float): wall time. returncode (int): exit status.
        stdout (str), stderr (str): what the command printed.
    """

    peak_bytes: int
    sampled_peak_bytes: int
    seconds: float
    returncode: int
    stdout: str
    stderr: str

    @property
    def max_bytes(self) -> int:
        """The larger of the two figures: on the machine this was written on,
        a 2.45M-node run's ``ru_maxrss`` (3,949 MiB) came out below a polled
        ``VmRSS`` (4,921 MiB), so a figure held against a limit takes both."""
        return max(self.peak_bytes, self.sampled_peak_bytes)


def run_with_peak_rss(cmd: list[str], interval: float = 0.05,
                      timeout: float | None = None,
                      env: dict[str, str] | None = None) -> CommandPeak:
    """Run ``cmd`` and measure its peak RSS from outside the process.

    What a user sees in ``top`` or a cgroup limit: the whole process, import
    and data loading included, not a region inside it. The peak is the
    kernel's ``ru_maxrss`` of exactly this child (``os.wait4``), so nothing
    between two polls is missed; ``VmRSS`` is also polled as a cross-check.

    Args:
        cmd (list of str): the command line.
        interval (float, optional): polling period in seconds. (default: ``0.05``)
        timeout (float, optional): kill the command after this many seconds.
        env (dict, optional): the child's environment. (default: inherited)

    Raises:
        TimeoutError: the command ran past ``timeout`` (it is killed).
    """
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        sampled, status = 0, f"/proc/{proc.pid}/status"
        while True:
            pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            try:
                with open(status) as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            sampled = max(sampled, int(line.split()[1]) * 1024)
                            break
            except OSError:
                pass
            if timeout is not None and time.perf_counter() - t0 > timeout:
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise TimeoutError(f"{cmd[:3]}...: still running after {timeout} s")
            time.sleep(interval)
        proc.returncode = os.waitstatus_to_exitcode(code)
        scale = 1 if sys.platform == "darwin" else 1024
        out.seek(0)
        err.seek(0)
        return CommandPeak(usage.ru_maxrss * scale, sampled,
                           time.perf_counter() - t0, proc.returncode,
                           out.read(), err.read())
