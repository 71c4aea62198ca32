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
  :func:`torch.autograd.graph.saved_tensors_hooks` (:class:`SavedTensorsMeter`).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "MemoryReport",
    "MemoryMeter",
    "SavedTensorsMeter",
    "TransferCounter",
    "rss_bytes",
    "peak_rss_bytes",
    "reset_peak_rss",
    "measure_in_subprocess",
]


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
        return t

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


@dataclass
class TransferCounter:
    """Bytes moved between host and device, counted by the code that moves them."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    h2d_calls: int = 0
    d2h_calls: int = 0

    def to_device(self, t: Tensor, device: torch.device, non_blocking=True) -> Tensor:
        self.h2d_bytes += t.numel() * t.element_size()
        self.h2d_calls += 1
        return t.to(device, non_blocking=non_blocking)

    def to_host(self, t: Tensor, out: Tensor | None = None) -> Tensor:
        self.d2h_bytes += t.numel() * t.element_size()
        self.d2h_calls += 1
        if out is not None:
            out.copy_(t)
            return out
        return t.cpu()

    def reset(self) -> None:
        self.h2d_bytes = self.d2h_bytes = self.h2d_calls = self.d2h_calls = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


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

