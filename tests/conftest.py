"""Test-wide settings: a private label cache so tests never touch the user's;
the graphs the graph-parallel tests share."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    if "LEANGNN_CACHE" not in os.environ:
        os.environ["LEANGNN_CACHE"] = str(tmp_path_factory.mktemp("leangnn-cache"))
    yield


@pytest.fixture(autouse=True, scope="session")
def _command_environment():
    """The tests call the command's ``main`` in this process, which the
    ``leangnn`` command would have re-executed with MKL's per-thread cache
    off (:data:`leangnn.heap.MKL_ENV`): its plans then leave nothing of it
    out. The tests of that caveat unset it themselves."""
    from leangnn.heap import MKL_ENV

    for k, v in MKL_ENV.items():
        os.environ[k] = os.environ.get(k) or v
    yield


@pytest.fixture(scope="session")
def mallinfo2():
    """glibc's ``mallinfo2`` (the heap's bytes in use: ``uordblks``, and
    ``hblkhd`` in blocks mapped apart), or ``None`` without glibc."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        call = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    call.restype = MallInfo2
    return call


@pytest.fixture(scope="session")
def graphs():
    """The graph-parallel tests' graphs: a directed circuit (regression on a
    random half of the nodes) and an undirected power-law graph
    (classification on its train mask)."""
    import torch
    from torch_geometric.data import Data

    from leangnn.circuits import load_circuit
    from leangnn.graphs.synthetic import contextual_sbm

    c = load_circuit("c880", "arrival")
    mask = torch.rand(c.num_nodes, generator=torch.Generator().manual_seed(1)) < 0.5
    circuit = Data(x=c.x, edge_index=c.edge_index, y=c.y, node_mask=mask,
                   num_nodes=c.num_nodes)
    s = contextual_sbm(300, num_classes=4, avg_degree=6, in_channels=8, seed=3)
    sbm = Data(x=s.x, edge_index=s.edge_index, y=s.y, node_mask=s.train_mask,
               num_nodes=s.num_nodes)
    return {"circuit": circuit, "sbm": sbm}
