"""Graphs for scale: synthetic generators, sparse structures, partitioning."""

from .partition import Partition, halo_sets, partition_graph
from .sparse import (
    DstCSR,
    adj_t_of,
    check_edge_index,
    csr_tensor,
    csr_tensor_from_scipy,
    is_canonical,
    undirected_csr,
)
from .synthetic import contextual_sbm, power_law_graph

__all__ = ["contextual_sbm", "power_law_graph", "partition_graph", "halo_sets",
           "Partition", "DstCSR", "check_edge_index", "undirected_csr",
           "is_canonical", "adj_t_of", "csr_tensor", "csr_tensor_from_scipy"]
