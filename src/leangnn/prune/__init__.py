"""DPR: Decoupled Prune-and-Reconstruct (train on a compact core, serve every node).

* :mod:`~leangnn.prune.importance`: pluggable node importance (degree,
  PageRank, k-core, combined);
* :mod:`~leangnn.prune.core`: core selection at a budget, bridging edges,
  DSpar sparsification;
* :mod:`~leangnn.prune.decoder`: sparse PageRank anchors and the decoder;
* :mod:`~leangnn.prune.dpr`: :class:`DPRStrategy`, the trainer strategy
  ``prune``;
* :mod:`~leangnn.prune.serve`: exact serving kernels (``embedding_bag`` row
  products, GraphSAGE aggregating at ``min(in, out)`` width, GCN normalised
  once per graph);
* :mod:`~leangnn.prune.baselines`: the peers DPR is measured against (DSpar
  full-batch, sampled GraphSAGE).
"""

from .baselines import (
    SparseFullBatch,
    UniformNeighborSampler,
    neighbor_batches,
    sampled_inference,
)
from .core import (
    CoreGraph,
    bridge_edges,
    build_core,
    core_size,
    core_size_for_bytes,
    dspar_sparsify,
    select_core,
)
from .decoder import AnchorDecoder, Anchors, ppr_anchors
from .dpr import DPRConfig, DPRStrategy
from .importance import (
    IMPORTANCE,
    combined_importance,
    degree_importance,
    kcore_number,
    node_importance,
    pagerank,
    register_importance,
)
from .serve import ServeGraph, mean_adjacency, rows_mm, servable, serve_forward

__all__ = [
    "IMPORTANCE", "register_importance", "node_importance", "degree_importance",
    "pagerank", "kcore_number", "combined_importance",
    "CoreGraph", "core_size", "core_size_for_bytes", "select_core", "bridge_edges",
    "dspar_sparsify", "build_core",
    "Anchors", "ppr_anchors", "AnchorDecoder",
    "DPRConfig", "DPRStrategy",
    "rows_mm", "mean_adjacency", "ServeGraph", "servable", "serve_forward",
    "SparseFullBatch", "UniformNeighborSampler", "neighbor_batches",
    "sampled_inference",
]
