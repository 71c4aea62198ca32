"""Real gate-level circuits as PyG graphs: parser, simulator, dataset."""

from .dataset import (
    DEFAULT_SPLIT,
    SUITES,
    TASKS,
    CircuitDataset,
    CircuitInfo,
    cache_dir,
    catalog,
    circuit_stats,
    load_circuit,
    load_suite,
    resolve,
)
from .netlist import (
    GATE_TYPES,
    Netlist,
    NetlistError,
    parse_bench,
    parse_verilog,
    read_netlist,
)
from .simulate import DelayModel, Timing, levelize, signal_probability, static_timing

__all__ = [
    "DEFAULT_SPLIT", "SUITES", "TASKS", "CircuitDataset", "CircuitInfo", "cache_dir",
    "catalog", "circuit_stats", "load_circuit", "load_suite", "resolve",
    "GATE_TYPES", "Netlist", "NetlistError", "parse_bench", "parse_verilog",
    "read_netlist", "DelayModel", "Timing", "levelize", "signal_probability",
    "static_timing",
]
