"""The DPR building blocks on a real circuit: importance, core, bridges, anchors.

    python examples/dpr_core.py

Result on itc99/b19 (123,955 gates, 2 CPU cores):

    itc99/b19: 123,955 nodes, 212,260 edges
      pagerank core (r = 0.3): 37,187 nodes, 30,664 induced edges + 19,372 bridges
      core graph: 1 component(s); the circuit has 3, 1 of them touching the core
      anchors: 86,768 pruned nodes, 2.64 per node (k = 8), 2.53 % without one
      walk mass captured by the anchors: mean 0.71
"""

import torch
from scipy.sparse.csgraph import connected_components

from leangnn.circuits import load_circuit
from leangnn.graphs import undirected_csr
from leangnn.prune import build_core, ppr_anchors


def main(name: str = "itc99/b19"):
    data = load_circuit(name, task="critical")
    n = data.num_nodes
    print(f"{name}: {n:,} nodes, {data.num_edges:,} edges")
    adj = undirected_csr(data.edge_index, n)
    core = build_core(data, 0.3, importance="pagerank", adj=adj)
    print(f"  pagerank core (r = 0.3): {core.num_core:,} nodes, "
          f"{core.num_induced_edges:,} induced edges + {core.num_bridges:,} bridges")
    k_graph, labels = connected_components(adj, directed=False)
    touching = len(set(labels[core.index.numpy()].tolist()))
    k_core = connected_components(undirected_csr(core.data.edge_index,
                                                 core.num_core), directed=False)[0]
    print(f"  core graph: {k_core} component(s); the circuit has {k_graph}, "
          f"{touching} of them touching the core")
    pruned = (~core.mask).nonzero().view(-1)
    anchors = ppr_anchors(adj, core.index, pruned, num_anchors=8)
    nnz = anchors.nnz_per_row.float()
    print(f"  anchors: {pruned.numel():,} pruned nodes, {nnz.mean():.2f} per node "
          f"(k = 8), {100 * float((nnz == 0).float().mean()):.2f} % without one")
    print(f"  walk mass captured by the anchors: mean "
          f"{float(anchors.mass[nnz > 0].mean()):.2f}")
    assert int(nnz.max()) <= 8 and torch.isfinite(anchors.mass).all()


if __name__ == "__main__":
    main()
