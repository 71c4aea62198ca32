"""One intra-op thread for the nn tests.

These tests run many small ops; on a shared 2-core machine OpenMP barriers
under oversubscription made them ~20x slower (measured: 237 s vs 12 s), so
they run single-threaded and restore the setting afterwards.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
