"""Offload tests run their many tiny kernels on one thread: two OpenMP threads
on a shared two-core machine spin for milliseconds per op."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
