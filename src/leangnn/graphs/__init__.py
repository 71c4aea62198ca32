"""Graphs for scale: synthetic generators and partitioning."""

from .partition import DstCSR, halo_sets, partition_graph
from .synthetic import contextual_sbm, power_law_graph

__all__ = ["contextual_sbm", "power_law_graph", "partition_graph", "halo_sets",
           "DstCSR"]
