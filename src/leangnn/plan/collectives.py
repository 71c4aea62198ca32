"""What ``P`` ranks cost beyond their compute: collectives and a shared host.

The planner's epoch time of a rank is its traced compute under the
single-process calibration (:mod:`leangnn.plan.calibration`). A job of ``P``
ranks pays two more things, both measured on the machine by one command,
``python -m leangnn.plan.calibrate --collectives P``:

* **collectives**: ``all_to_all_single`` (the halo exchange,
  :mod:`leangnn.distributed.halo`) and ``all_reduce`` (the gradient sum),
  each timed as ``latency + bytes x per_byte`` (the alpha-beta model of
  Hockney, Parallel Computing 1994, which CAGNET's and SAR's cost analyses
  use), fitted over payloads from 4 KiB to 16 MiB;
* **co-running**: one compute step (a two-layer SAGE step) timed on every rank
  at once over the same step on one rank while the others wait. Local ranks
  share the caches, memory bandwidth and, on a CPU host, the cores: on the
  2-core reference machine two ranks each run x1.5 slower than one alone.

A rank's epoch is then ``corun x compute + collectives``: the planner counts
each rank's collectives and their payloads in its traced step
(:class:`~leangnn.plan.distributed.PlannedRank`) and this module prices them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch

__all__ = ["CollectiveCost", "COMM_KEYS", "comm_key", "measure_collectives",
           "scale_comm"]

#: the work counters of a rank's collectives, per step or per epoch
COMM_KEYS = ("a2a_calls", "a2a_bytes", "ar_calls", "ar_bytes")

#: payloads the collectives are timed at (bytes per rank)
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
QUICK_SIZES = (4 << 10, 1 << 20)


def comm_key(backend: str, nproc: int) -> str:
    """The calibration's key of ``nproc`` ranks on ``backend``."""
    return f"{backend}:{int(nproc)}"


@dataclass
class CollectiveCost:
    """Measured cost of ``nproc`` local ranks on ``backend``.

    Args:
        backend (str): ``"gloo"`` or ``"nccl"``.
        nproc (int): the ranks it was measured with.
        all_to_all, all_reduce (list[float]): ``[latency s, s per byte]``.
        corun (float): a rank's compute time with every rank busy over alone.
        threads (int): intra-op threads per rank during the measurement.
        measured_at (str): when.
    """

    backend: str
    nproc: int
    all_to_all: list[float]
    all_reduce: list[float]
    corun: float = 1.0
    threads: int = 1
    measured_at: str = ""

    def seconds(self, work: dict[str, float]) -> float:
        """Seconds of the collectives counted in ``work`` (:data:`COMM_KEYS`)."""
        a, r = self.all_to_all, self.all_reduce
        return (a[0] * work.get("a2a_calls", 0) + a[1] * work.get("a2a_bytes", 0)
                + r[0] * work.get("ar_calls", 0) + r[1] * work.get("ar_bytes", 0))

    def epoch_seconds(self, compute: float | None, work: dict[str, float]
                      ) -> float | None:
        """A rank's epoch: its compute slowed by co-running, plus collectives."""
        if compute is None:
            return None
        return self.corun * compute + self.seconds(work)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectiveCost:
        """The cost stored as ``d``.

        Raises:
            ValueError: ``d`` is not one (a damaged calibration file): the
                fields missing, mistyped, or not finite and non-negative.
        """
        try:
            cost = cls(str(d["backend"]), int(d["nproc"]),
                       [float(x) for x in d["all_to_all"]],
                       [float(x) for x in d["all_reduce"]],
                       float(d.get("corun", 1.0)), int(d.get("threads", 1)),
                       str(d.get("measured_at", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a collective cost ({type(e).__name__}: {e}): "
                             f"{d!r:.200}") from None
        numbers = [*cost.all_to_all, *cost.all_reduce, cost.corun]
        if len(cost.all_to_all) != 2 or len(cost.all_reduce) != 2 or not all(
                math.isfinite(x) and x >= 0 for x in numbers):
            raise ValueError(f"not a collective cost (two finite, non-negative "
                             f"terms per collective expected): {d!r:.200}")
        return cost


def scale_comm(per_step: dict[str, float], steps: float, share: float
               ) -> dict[str, float]:
    """An epoch's collectives from one step's: calls repeat per step, payloads
    scale with the epoch's work over the step's (``share``)."""
    return {k: v * (steps if k.endswith("_calls") else share)
            for k, v in per_step.items() if k in COMM_KEYS}


def _fit(sizes: list[int], times: list[float]) -> list[float]:
    """``[latency, per_byte]``, both non-negative, of least relative error
    over the payloads (plain least squares would let the 16 MiB payload
    decide the latency that the many small calls of a step pay)."""
    import numpy as np
    from scipy.optimize import nnls

    t = np.asarray(times, float)
    a = np.stack([np.ones_like(t), np.asarray(sizes, float)], 1) / t[:, None]
    coef, _ = nnls(a, np.ones_like(t))
    return [float(coef[0]), float(coef[1])]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compute_step(device: torch.device, nodes: int):
    """One SAGE-2 training step on a fixed random graph: the gathers,
    scatters and dense products of a rank's step."""
    from torch_geometric.nn import SAGEConv

    g = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, 64, generator=g).to(device)
    ei = torch.randint(0, nodes, (2, 10 * nodes), generator=g).to(device)
    c1, c2 = SAGEConv(64, 64).to(device), SAGEConv(64, 16).to(device)

    def step() -> float:
        t0 = time.perf_counter()
        c2(c1(x, ei).relu(), ei).square().mean().backward()
        _sync(device)
        return time.perf_counter() - t0
    return step


def _timed(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(fn() for _ in range(reps))


def _rank_figures(ctx, sizes: tuple[int, ...], reps: int, nodes: int
                  ) -> dict[str, Any]:
    """Run on every rank (:func:`~leangnn.distributed.launch.spawn`): the
    rank's alone and together step times and its collective medians."""
    import torch.distributed as dist

    dev, p = ctx.device, ctx.world_size
    step = _compute_step(dev, nodes)
    alone = None
    for turn in range(p):  # each rank alone, the others parked at a barrier
        dist.barrier()
        if ctx.rank == turn:
            alone = _timed(step, reps)
        dist.barrier()

    def together() -> float:
        dist.barrier()
        return step()
    both = _timed(together, reps)

    def collective(call) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        call()
        _sync(dev)
        return time.perf_counter() - t0

    a2a, ar, sent = [], [], []
    for size in sizes:
        # as many rows to every peer, none to itself (as a halo plan)
        per_peer = max(1, size // 4 // (p - 1))
        splits = [0 if r == ctx.rank else per_peer for r in range(p)]
        buf = torch.ones(per_peer * (p - 1), device=dev)
        out = torch.empty_like(buf)
        sent.append(buf.numel() * buf.element_size())
        ar.append(_timed(partial(collective, partial(dist.all_reduce, buf)), reps))
        a2a.append(_timed(partial(collective, partial(
            dist.all_to_all_single, out, buf, output_split_sizes=splits,
            input_split_sizes=splits)), reps))
    return {"alone": alone, "together": both, "a2a": a2a, "ar": ar, "bytes": sent,
            "threads": torch.get_num_threads()}


def measure_collectives(nproc: int, device: str = "cpu", quick: bool = False,
                        reps: int | None = None, nodes: int = 20000,
                        timeout: float = 600.0) -> CollectiveCost:
    """Measure :class:`CollectiveCost` of ``nproc`` local ranks on ``device``
    (gloo on a CPU, NCCL with one GPU per rank), each with its share of the
    cores (:func:`~leangnn.distributed.launch.rank_threads`), as ``leangnn
    train --nproc`` starts them.

    Args:
        nproc (int): ranks, at least 2.
        device (str, optional): ``"cpu"`` or ``"cuda"``. (default: ``"cpu"``)
        quick (bool, optional): two payloads, few repetitions (tests).
        reps (int, optional): timed repetitions per figure (median).
            (default: 3 quick, else 9)
        nodes (int, optional): nodes of the compute step's graph (10 edges
            per node). (default: ``20000``)
        timeout (float, optional): seconds the measurement may take.
    """
    from datetime import datetime, timezone

    from leangnn.distributed.launch import rank_threads, spawn

    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"--collectives: expected at least 2 ranks, got {nproc!r}")
    cores = rank_threads(1)
    if nproc > 8 * cores:
        # each rank is an interpreter with torch (~0.4 GiB): a typo's 10000
        # ranks would exhaust the host before a figure comes back
        raise ValueError(f"--collectives {nproc}: more than 8 ranks per core on "
                         f"this machine's {cores} cores; measure at most "
                         f"{8 * cores}")
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.device_count() < nproc:
        raise ValueError(f"--collectives {nproc} on cuda: {torch.cuda.device_count()} "
                         "GPU(s) visible, one per rank needed")
    backend = "nccl" if dev.type == "cuda" else "gloo"
    reps = reps or (3 if quick else 9)
    sizes = QUICK_SIZES if quick else SIZES
    threads = rank_threads(nproc) if dev.type == "cpu" else None
    figs = spawn(_rank_figures, nproc, args=(sizes, reps, nodes), backend=backend,
                 join_timeout=timeout, threads=threads)
    corun = statistics.mean(f["together"] / f["alone"] for f in figs)
    # a collective ends when its slowest rank's does
    slowest = {k: [max(f[k][i] for f in figs) for i in range(len(sizes))]
               for k in ("a2a", "ar")}
    return CollectiveCost(backend, nproc, _fit(figs[0]["bytes"], slowest["a2a"]),
                          _fit(figs[0]["bytes"], slowest["ar"]),
                          corun=max(1.0, float(corun)),
                          threads=int(figs[0]["threads"]),
                          measured_at=datetime.now(timezone.utc).isoformat(
                              timespec="seconds"))
