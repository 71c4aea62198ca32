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


@pytest.fixture(scope="module")
def graph():
    """c432's ``edge_index`` plus a few self-loops (GCN keeps them, GAT removes
    and re-adds them: shared and CSR paths must do exactly the same) and its
    node count; its primary inputs are nodes without in-edges."""
    from leangnn.circuits import load_circuit

    data = load_circuit("iscas85/c432", task="arrival")
    loops = torch.arange(0, data.num_nodes, 7).repeat(2, 1)
    return torch.cat([data.edge_index, loops], 1), data.num_nodes
