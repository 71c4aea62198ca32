"""Plan and train your own PyG models with ``leangnn.plan`` / ``leangnn.fit``.

    python examples/plan_fit_pyg.py

Three tasks a PyG user brings, each planned under a memory budget and
trained through the pick:

1. node classification on a Planetoid-style graph (``train_mask``: the
   default loss trains on those nodes only);
2. graph regression on a ``Batch`` of real ISCAS-85/89 netlists: a pooled
   GraphSAGE predicts each circuit's logic depth (its forward takes
   ``batch``; DPR's core, which trains node outputs, says why not);
3. link prediction on PyG's ``RandomLinkSplit`` (a loss reading
   ``data.edge_label_index``: full batch or offloaded, exactly alike).

Output on a 2-core Xeon (CPU, torch 2.13, ``OMP_NUM_THREADS=1``, 58 s;
figures vary with the machine)::

    node classification: full(model=GraphSAGE), test accuracy 0.972;
      need 210.6 MiB measured, 229.1 MiB estimated
    graph regression on 15 circuits: full(model=DepthRegressor),
      training MSE 22.446 -> 0.012
      prune: not possible: DPR's core: DepthRegressor reads the graph of
      every node (data.batch, 15 graphs), and ...
    link prediction: offload(model=GCN, device_budget=512.0MiB,
      num_parts=4) equals full batch: True

(lines wrapped here).
"""

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch_geometric.data import Batch
from torch_geometric.nn import GCN, GraphSAGE, global_mean_pool

import leangnn
from leangnn.circuits import catalog, load_circuit
from leangnn.graphs.synthetic import contextual_sbm


def node_classification() -> None:
    data = contextual_sbm(20_000, seed=0)  # x, y, train/val/test masks
    torch.manual_seed(0)
    model = GraphSAGE(data.num_features, 64, 2, int(data.y.max()) + 1)
    out = leangnn.fit(model, data, memory_budget="2GiB", epochs=50, lr=0.01)
    model.eval()
    with torch.no_grad():
        pred = out["strategy"].forward(model, data).argmax(-1)
    acc = (pred == data.y)[data.test_mask].float().mean()
    check = out["budget_check"]
    print(f"node classification: {out['row'].label}, test accuracy {acc:.3f}; "
          f"need {check['measured_need_bytes'] / 2**20:.1f} MiB measured, "
          f"{check['estimated_need_bytes'] / 2**20:.1f} MiB estimated")


class DepthRegressor(torch.nn.Module):
    """A GraphSAGE, mean-pooled per circuit, then a linear head."""

    def __init__(self, in_channels: int):
        super().__init__()
        self.gnn = GraphSAGE(in_channels, 64, 3, 64)
        self.head = torch.nn.Linear(64, 1)

    def forward(self, x, edge_index, batch):
        return self.head(global_mean_pool(self.gnn(x, edge_index), batch)).view(-1)


def graph_regression() -> None:
    graphs = []
    for info in catalog():
        if info.suite not in ("iscas85", "iscas89"):
            continue
        g = load_circuit(info, "arrival")
        # the target, one per circuit: log2 of its logic depth
        graphs.append(type(g)(x=g.x, edge_index=g.edge_index,
                              y=torch.log2(g.level.max().float() + 1).view(1)))
    batch = Batch.from_data_list(graphs)

    def loss_fn(out, data):
        return F.mse_loss(out, data.y)

    torch.manual_seed(0)
    model = DepthRegressor(batch.num_features)
    out = leangnn.fit(model, batch, loss_fn, memory_budget="2GiB", epochs=200,
                      lr=0.01)
    print(f"graph regression on {batch.num_graphs} circuits: {out['row'].label}, "
          f"training MSE {out['losses'][0]:.3f} -> {out['losses'][-1]:.3f}")
    table = leangnn.plan(model, batch, "2GiB", loss_fn=loss_fn)
    why = next(r.why for r in table.rows if r.strategy == "prune")
    print(f"  prune: {why[:100]}...")


def link_prediction() -> None:
    torch.manual_seed(0)
    graph = contextual_sbm(20_000, seed=1)
    # PyG's own split: held-out edges leave the training graph, and the
    # training edges come with as many sampled negatives (edge_label 0)
    data, _, _ = T.RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True,
                                   add_negative_train_samples=True)(graph)

    def loss_fn(out, d):
        src, dst = d.edge_label_index
        return F.binary_cross_entropy_with_logits((out[src] * out[dst]).sum(-1),
                                                  d.edge_label)

    losses = {}
    for strategy in ("full", "offload"):
        torch.manual_seed(0)
        model = GCN(data.num_features, 64, 2, 32)
        out = leangnn.fit(model, data, loss_fn, strategy=strategy,
                          memory_budget="2GiB", epochs=5)
        losses[strategy] = (out["row"].label, out["losses"])
    same = torch.allclose(torch.tensor(losses["full"][1]),
                          torch.tensor(losses["offload"][1]), rtol=1e-5)
    print(f"link prediction: {losses['offload'][0]} equals full batch: {same}")


if __name__ == "__main__":
    node_classification()
    graph_regression()
    link_prediction()
