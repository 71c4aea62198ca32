"""The torch.distributed runtime: process-group set-up and the collectives leangnn uses.

Everything rides on :mod:`torch.distributed` (gloo on CPU, NCCL on GPU); there
is no home-made transport and no parameter server. A rank learns its place
from the environment variables ``torchrun`` (and
:func:`leangnn.distributed.launch.launch_processes`) set: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Every
collective takes a ``group`` so several independent jobs can share one set of
processes (the tests run 2, 3 and 4-rank checks inside one 4-process spawn).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "DistContext",
    "DistributedError",
    "DEFAULT_TIMEOUT",
    "init_distributed",
    "current_context",
    "all_reduce_gradients",
    "all_reduce_sum",
    "gradient_groups",
    "flat_gradients",
    "unflatten_gradients",
    "broadcast_parameters",
    "group_rank",
    "group_size",
]

#: Seconds a collective may wait for a peer before it fails (instead of
#: hanging when a rank died without closing its sockets).
DEFAULT_TIMEOUT = 300.0
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(RuntimeError):
    """A rank failed, timed out or the launch environment is incomplete."""


@dataclass
class DistContext:
    """Where this process stands in a distributed job.

    Attributes:
        rank (int): rank in ``group`` (``0`` writes the run directory).
        world_size (int): ranks in ``group``.
        local_rank (int): rank on this host (selects ``cuda:local_rank``).
        backend (str): ``"gloo"`` or ``"nccl"``.
        device (torch.device): this rank's device.
        group (ProcessGroup, optional): the group (``None``: the default one).
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    group: object | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def group_rank(group=None) -> int:
    return dist.get_rank(group)


def group_size(group=None) -> int:
    return dist.get_world_size(group)


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedError(
            f"environment variable {name}={value!r} is not an integer; launch with "
            "`torchrun --nproc-per-node P -m leangnn train ...` or "
            "`leangnn train --nproc P ...`") from None


def _device_for(device: torch.device | str | None, local_rank: int) -> torch.device:
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {str(device)!r} requested but CUDA is not "
                             "available on this machine")
        # One GPU per rank: ``cuda`` (no index) means this rank's local GPU.
        index = local_rank if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device: rank with LOCAL_RANK={local_rank} needs "
                             f"cuda:{index}, but only {torch.cuda.device_count()} "
                             "GPUs are visible")
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    return device


def init_distributed(device: torch.device | str | None = None,
                     backend: str | None = None,
                     timeout: float = DEFAULT_TIMEOUT) -> DistContext:
    """Join (or reuse) the default process group from ``torchrun``'s environment.

    Args:
        device (torch.device or str, optional): ``"cpu"`` or ``"cuda"``; a
            CUDA rank uses ``cuda:LOCAL_RANK``. (default: ``"cpu"``)
        backend (str, optional): ``"gloo"`` or ``"nccl"``. (default: NCCL for
            CUDA devices, gloo otherwise)
        timeout (float, optional): seconds a collective waits for a peer before
            it raises. (default: :data:`DEFAULT_TIMEOUT`)

    Raises:
        DistributedError: when the launch environment variables are missing.
    """
    if dist.is_initialized():
        return current_context(device)
    missing = [k for k in _ENV if k not in os.environ]
    if missing:
        raise DistributedError(
            f"strategy distributed: environment variables {missing} are not set; "
            "launch with `torchrun --nproc-per-node P -m leangnn train --strategy "
            "distributed ...` or `leangnn train --nproc P ...`")
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    dev = _device_for(device, local_rank)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and dev.type != "cuda":
        raise ValueError("backend: 'nccl' needs a CUDA device, got device "
                         f"{str(dev)!r}")
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout),
                            device_id=dev if backend == "nccl" else None)
    return DistContext(rank, world, local_rank, backend, dev)


def current_context(device: torch.device | str | None = None,
                    group=None) -> DistContext:
    """The :class:`DistContext` of an initialised process group."""
    if not dist.is_initialized():
        raise DistributedError("torch.distributed is not initialised; call "
                               "init_distributed() first")
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    dev = torch.device(device or "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    return DistContext(dist.get_rank(group), dist.get_world_size(group), local_rank,
                       dist.get_backend(group), dev, group)


def all_reduce_sum(t: Tensor, group=None) -> Tensor:
    """In-place sum over the ranks of ``group``; returns ``t``."""
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def all_reduce_gradients(params: Iterable[torch.nn.Parameter], group=None,
                         scale: float | None = None) -> int:
    """Sum the gradients of ``params`` over ``group`` (one flat buffer per dtype).

    A parameter keeps ``grad is None`` when no rank produced a gradient for it,
    exactly as in one process (an optimizer skips such parameters; a zero
    gradient would still move Adam's state). Returns the payload bytes
    reduced.

    Args:
        params (iterable of Parameter): the model's parameters, in the same
            order on every rank.
        group (ProcessGroup, optional): the ranks. (default: all)
        scale (float, optional): multiply the sums by this (e.g. ``1 / B``).
    """
    nbytes = 0
    for ps in gradient_groups(params):
        flat = flat_gradients(ps)
        all_reduce_sum(flat, group)
        nbytes += flat.numel() * flat.element_size()
        if scale is not None:
            flat[: flat.numel() - len(ps)] *= scale
        unflatten_gradients(flat, ps, flat[flat.numel() - len(ps):].tolist())
    return nbytes


def gradient_groups(params: Iterable[torch.nn.Parameter]
                    ) -> list[list[torch.nn.Parameter]]:
    """The trainable ``params`` grouped by dtype and device, in order: one
    flat buffer each (:func:`flat_gradients`)."""
    by_dtype: dict[tuple, list[torch.nn.Parameter]] = {}
    for p in params:
        if p.requires_grad:
            by_dtype.setdefault((p.dtype, p.device), []).append(p)
    return list(by_dtype.values())


def flat_gradients(params: list[torch.nn.Parameter]) -> Tensor:
    """One buffer of the gradients of ``params`` (one dtype and device; zeros
    for a missing one), then one flag per parameter: 1 where it has one."""
    p0 = params[0]
    # The trailing flags count the ranks holding a gradient per parameter.
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
        for p in params] + [torch.tensor([float(p.grad is not None) for p in params],
                                         dtype=p0.dtype, device=p0.device)])


def unflatten_gradients(flat: Tensor, params: list[torch.nn.Parameter],
                        flags: list[float]) -> None:
    """Gradients of ``params`` from ``flat`` (:func:`flat_gradients`' layout)
    where their summed flag is positive; ``None`` stays where no rank had one."""
    offset = 0
    for p, flag in zip(params, flags):
        n = p.numel()
        if flag > 0:
            g = flat[offset: offset + n].view_as(p)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        offset += n


@torch.no_grad()
def broadcast_parameters(module: torch.nn.Module, group=None, src: int = 0) -> None:
    """Copy ``module``'s parameters and buffers from group rank ``src`` to all."""
    root = dist.get_global_rank(group, src) if group is not None else src
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=root, group=group)
