"""Real gate-level circuits as PyG graphs: parser, simulator, dataset."""

from . import yosys as _yosys  # noqa: F401  (installs its hooks in .netlist)
from .aiger import parse_aiger, read_aiger
from .blif import parse_blif, read_blif
from .cop import cop_signal_probability
from .dataset import (
    DEFAULT_SPLIT,
    SUITES,
    TASKS,
    CircuitDataset,
    CircuitInfo,
    cache_dir,
    catalog,
    circuit_digest,
    circuit_overlap,
    circuit_stats,
    load_circuit,
    load_suite,
    resolve,
)
from .netlist import (
    GATE_TYPES,
    MAX_BUS_BITS,
    NETLIST_SUFFIXES,
    Netlist,
    NetlistError,
    parse_bench,
    parse_verilog,
    read_netlist,
    read_text,
)
from .sigprob import cut_signal_probability
from .simulate import DelayModel, Timing, levelize, signal_probability, static_timing

__all__ = [
    "DEFAULT_SPLIT", "SUITES", "TASKS", "CircuitDataset", "CircuitInfo", "cache_dir",
    "catalog", "circuit_digest", "circuit_overlap", "circuit_stats", "load_circuit",
    "load_suite", "resolve",
    "GATE_TYPES", "MAX_BUS_BITS", "NETLIST_SUFFIXES", "Netlist", "NetlistError",
    "parse_bench", "parse_verilog", "read_netlist", "read_text",
    "DelayModel", "Timing", "levelize", "signal_probability", "static_timing",
    "parse_aiger", "read_aiger", "parse_blif", "read_blif", "cop_signal_probability",
    "cut_signal_probability",
]
