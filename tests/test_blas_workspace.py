"""cuBLAS' workspaces: PyTorch's rule (aten/src/ATen/cuda/CublasHandlePool.cpp)
on any machine; on a GPU, the rule against what the first product of a fresh
process really holds (torch.cuda.memory_allocated)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from leangnn.blas_workspace import blas_workspace_bytes, ensure_blas_workspace
from leangnn.offload.budget import DeviceBudget
from leangnn.offload.schedule import BudgetError
from leangnn.plan.calibration import Calibration

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("CUBLAS_WORKSPACE_CONFIG", "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
                "CUBLASLT_WORKSPACE_SIZE"):
        monkeypatch.delenv(var, raising=False)


def test_cpu_holds_none():
    assert blas_workspace_bytes("cpu") == 0
    assert ensure_blas_workspace("cpu") == 0
    assert Calibration.default("cpu").const == 0


@pytest.mark.parametrize("capability,per_thread", [
    ((9, 0), 32 * MiB), ((10, 0), 32 * MiB), ((12, 0), 32 * MiB),
    ((8, 0), 4096 * 1024 * 2 + 16 * 1024 * 8), ((7, 5), 8320 * 1024)])
def test_default_sizes_per_gpu_generation(capability, per_thread):
    # a forward thread and autograd's backward thread: one workspace each
    assert blas_workspace_bytes("cuda", capability=capability) == 2 * per_thread
    assert blas_workspace_bytes("cuda", 1, capability) == per_thread


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert blas_workspace_bytes("cuda", 1, (8, 0)) == 32 * MiB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8:4096:2")
    assert blas_workspace_bytes("cuda", 1, (9, 0)) == (128 + 8192) * 1024
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "garbage")  # PyTorch: default
    assert blas_workspace_bytes("cuda", 1, (9, 0)) == 32 * MiB
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    # cuBLASLt apart from cuBLAS: its own workspace beside it
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")
    assert blas_workspace_bytes("cuda", 1, (9, 0)) == 33 * MiB
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "4096")
    assert blas_workspace_bytes("cuda", 1, (9, 0)) == 36 * MiB
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "-5")  # none, not a credit
    assert blas_workspace_bytes("cuda", 1, (9, 0)) == 32 * MiB
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "nan")  # unreadable: 1 MiB
    assert blas_workspace_bytes("cuda", 1, (9, 0)) == 33 * MiB


def test_uncalibrated_cuda_plans_count_the_workspaces():
    assert Calibration.default("cuda").const == blas_workspace_bytes("cuda") > 0


def test_a_budget_below_the_workspaces_says_so():
    with pytest.raises(BudgetError, match="64 MiB|67108864 of them cuBLAS"):
        DeviceBudget(60 * MiB, 4096, 0.5, "none", None, 0, fixed=64 * MiB)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_workspaces_measured_in_a_fresh_process_match_the_rule():
    code = ("from leangnn.blas_workspace import *; "
            "print(ensure_blas_workspace('cuda'), blas_workspace_bytes('cuda'), "
            "ensure_blas_workspace('cuda'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    made, rule, again = (int(v) for v in out)
    assert made == rule  # measured by the allocator == PyTorch's rule
    assert again == rule  # made already: the rule answers
