"""Independent references for the circuit tests: circuitgraph's own parser."""

from __future__ import annotations

import os
from functools import cache

import pytest


@cache
def cg_circuit(path: str):
    """The circuit as circuitgraph parses it (flip-flops as blackboxes)."""
    import circuitgraph
    from circuitgraph import BlackBox
    from circuitgraph.io import genus_flops

    bbs = [BlackBox("ff", ["CK", "D"], ["Q"])] + genus_flops
    return circuitgraph.from_file(path, blackboxes=bbs)


@pytest.fixture(scope="session")
def netlist_dir() -> str:
    import circuitgraph

    return os.path.join(os.path.dirname(circuitgraph.__file__), "netlists")


@pytest.fixture(scope="session")
def cg():
    return cg_circuit
