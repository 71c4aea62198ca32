"""The device memory cuBLAS takes on the first matrix product of a process.

PyTorch gives cuBLAS (and cuBLASLt, which shares it by default) a workspace
from the CUDA caching allocator, one per (handle, stream) pair, the first
time a thread runs a matrix product on a stream, and keeps it for the life of
the process (``aten/src/ATen/cuda/CublasHandlePool.cpp``). Handles are per
thread, and autograd runs a CUDA backward on a thread of its own, so a
training step holds two: 2 x 32 MiB on Hopper and Blackwell, 2 x 8.125 MiB
on older GPUs. That is device memory no tensor of the model accounts for: a
64 MiB budget on an H200 has 0 MiB left for the run before it starts.

:func:`blas_workspace_bytes` says how much by PyTorch's own rule (no GPU
work: the planner's prior before a CUDA calibration has measured it);
:func:`ensure_blas_workspace` makes the workspaces now and measures them
(the offload engine, whose device budget must hold them).
"""

from __future__ import annotations

import os
import re

import torch

__all__ = ["blas_workspace_bytes", "ensure_blas_workspace"]

#: threads that run matrix products in a training step: the caller's
#: (forward) and autograd's device thread (backward)
STEP_THREADS = 2

_MiB = 1 << 20


def _config_bytes(value: str) -> int | None:
    """``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs, SIZE in KiB) in
    bytes, or ``None`` where PyTorch would not parse it either."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", value)
    return sum(int(s) * 1024 * int(c) for s, c in pairs) if pairs else None


def blas_workspace_bytes(device: torch.device | str = "cuda",
                         threads: int = STEP_THREADS,
                         capability: tuple[int, int] | None = None) -> int:
    """Bytes of cuBLAS workspace ``threads`` threads hold on ``device``.

    PyTorch's rule: ``CUBLAS_WORKSPACE_CONFIG``'s ``:SIZE:COUNT`` pairs
    summed, else 32 MiB on compute capability 9.x, 10.x and 12.x and
    ``:4096:2:16:8`` (8.125 MiB) on the others; with
    ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0`` cuBLASLt takes its own
    (``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1 MiB) beside it.

    Args:
        device (torch.device or str, optional): a CPU device holds none.
            (default: ``"cuda"``)
        threads (int, optional): threads running matrix products.
            (default: :data:`STEP_THREADS`)
        capability (tuple, optional): the GPU's compute capability (default:
            ``device``'s, or a pre-Hopper GPU's where CUDA is absent).

    Returns:
        int: bytes (0 on CPU).
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return 0
    if capability is None:
        try:
            capability = torch.cuda.get_device_capability(dev)
        except (AssertionError, RuntimeError):  # no CUDA here: the plain rule
            capability = (8, 0)
    default = 32 * _MiB if capability[0] in (9, 10, 12) else \
        _config_bytes(":4096:2:16:8")
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    size = _config_bytes(env) if env else None
    size = default if size is None else size
    if os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().lower() in (
            "0", "false", "off", "no"):
        try:
            lt = int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
        except ValueError:
            lt = _MiB
        size += max(lt, 0)  # a negative size is no workspace, not a credit
    return threads * size


def ensure_blas_workspace(device: torch.device | str) -> int:
    """Make this process's cuBLAS workspaces for a training step on
    ``device`` now (a tiny product forward and backward) and return the
    device bytes they hold: measured where this call made them, else (made
    earlier) :func:`blas_workspace_bytes`. 0 on CPU.

    Made up front, they are neither counted against a job (the offload
    engine's workspace probes) nor a surprise under a budget later.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return 0
    torch.cuda.synchronize(dev)
    a = torch.ones(8, 8, device=dev, requires_grad=True)
    before = torch.cuda.memory_allocated(dev)
    (a @ a).sum().backward()
    del a
    torch.cuda.synchronize(dev)
    # the product, the sum and a's gradient are freed with a: what stays
    # allocated beyond ``before`` (less a's 512-byte block) is the workspaces
    # (were some made earlier, e.g. the forward thread's alone, the rule's
    # answer stands in for all)
    made = torch.cuda.memory_allocated(dev) - before + 512
    return made if made > _MiB else blas_workspace_bytes(dev)
