"""Per-rank, per-epoch records of a distributed run (merged into ``summary.json``).

Bytes are payload bytes counted where they are sent: halo rows and their
gradients (exact), and the gradient all-reduce, whose on-wire traffic depends
on the backend's algorithm; it is reported as the ring figure
``2 (P - 1) / P`` times the payload, sent and received by every rank.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from leangnn.distributed.halo import HaloStats
from leangnn.profile import peak_rss_bytes, rss_bytes

__all__ = ["RankEpochRecord", "EpochMeter", "peak_memory", "memory_in_use"]


def peak_memory(device: torch.device) -> tuple[int, str]:
    """This process's peak memory so far, and how it was measured.

    Absolute peaks, never reset here, so the trainer's own
    :class:`~leangnn.profile.MemoryMeter` keeps its meaning.
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    return int(peak_rss_bytes()), "cpu_peak_rss_process"


def memory_in_use(device: torch.device) -> int:
    """This process's memory in use now (CPU resident set, CUDA allocated)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return int(rss_bytes())


@dataclass
class RankEpochRecord:
    """What one rank did in one epoch.

    Attributes:
        rank (int): the rank. epoch (int): the epoch (1-based).
        bytes_sent / bytes_received (int): halo payload plus the ring estimate
            of the gradient all-reduce.
        halo_bytes_sent / halo_bytes_received (int): halo rows (forward) and
            their gradients (backward), exact.
        allreduce_payload_bytes (int): gradient bytes all-reduced.
        halo_rows_per_layer (dict[int, int]): halo rows received per layer
            (forward; the input features' halo moves once, in epoch 1).
        peak_bytes (int): process peak memory at the epoch's end.
        run_peak_bytes (int): ``peak_bytes`` above the memory in use when the
            rank's first epoch began (the loaded state, as the Trainer's own
            meter reports rank 0's; what the planner estimates per rank).
        peak_method (str): how ``peak_bytes`` was measured.
        epoch_seconds (float): wall time of the epoch's training steps.
    """

    rank: int
    epoch: int
    bytes_sent: int = 0
    bytes_received: int = 0
    halo_bytes_sent: int = 0
    halo_bytes_received: int = 0
    allreduce_payload_bytes: int = 0
    halo_rows_per_layer: dict[int, int] = field(default_factory=dict)
    peak_bytes: int = 0
    run_peak_bytes: int = 0
    peak_method: str = ""
    epoch_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["halo_rows_per_layer"] = {str(k): v for k, v in
                                    sorted(self.halo_rows_per_layer.items())}
        return d


class EpochMeter:
    """Turns running counters into one :class:`RankEpochRecord` per epoch.

    Args:
        rank (int): this rank. world_size (int): ranks.
        device (torch.device): for the peak-memory figure.
    """

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.records: list[RankEpochRecord] = []
        self._open: tuple[int, float, dict, int] | None = None
        self.baseline: int | None = None

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def start(self, epoch: int, stats: list[HaloStats], allreduce_bytes: int) -> None:
        if self.baseline is None:
            self.baseline = memory_in_use(self.device)
        self._open = (epoch, time.perf_counter(), self._snapshot(stats),
                      allreduce_bytes)

    @staticmethod
    def _snapshot(stats: list[HaloStats]) -> dict:
        rows: dict[int, int] = {}
        for s in stats:
            for k, v in s.rows_per_layer.items():
                rows[k] = rows.get(k, 0) + v
        return {"sent": sum(s.bytes_sent for s in stats),
                "recv": sum(s.bytes_received for s in stats), "rows": rows}

    def stop(self, stats: list[HaloStats], allreduce_bytes: int) -> RankEpochRecord:
        if self._open is None:
            raise RuntimeError("EpochMeter.stop() without start()")
        epoch, t0, before, ar0 = self._open
        self._open = None
        now = self._snapshot(stats)
        ar = allreduce_bytes - ar0
        ring = ar * 2 * (self.world_size - 1) // max(self.world_size, 1)
        peak, method = peak_memory(self.device)
        rows = {k: v - before["rows"].get(k, 0) for k, v in now["rows"].items()}
        rec = RankEpochRecord(
            self.rank, epoch,
            bytes_sent=now["sent"] - before["sent"] + ring,
            bytes_received=now["recv"] - before["recv"] + ring,
            halo_bytes_sent=now["sent"] - before["sent"],
            halo_bytes_received=now["recv"] - before["recv"],
            allreduce_payload_bytes=ar,
            halo_rows_per_layer={k: v for k, v in rows.items() if v},
            peak_bytes=peak, run_peak_bytes=max(0, peak - (self.baseline or 0)),
            peak_method=method,
            epoch_seconds=time.perf_counter() - t0)
        self.records.append(rec)
        return rec
