"""Distributed tests run their tiny kernels on one thread: OpenMP threads on a
shared two-core machine spin for milliseconds per op (ranks use one each)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
