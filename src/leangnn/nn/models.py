"""Models: deep residual GNNs and shallow PyG baselines, built by name.

``ResGNN`` is the plain-autograd deep residual GNN of DeepGCN/RevGNN
("pre-activation" res+ blocks: norm -> ReLU -> dropout -> conv, added to the
input). The shallow baselines are PyG's :class:`~torch_geometric.nn.models.GCN`
and :class:`~torch_geometric.nn.models.GraphSAGE`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, GraphConv, LayerNorm, SAGEConv
from torch_geometric.nn.models import GAT, GCN, GraphSAGE

__all__ = ["CONVS", "build_conv", "ResGNN", "build_model", "MODELS"]

CONVS = ("gcn", "sage", "gat", "graph")


def build_conv(conv: str, in_channels: int, out_channels: int, heads: int = 1,
               **kwargs) -> torch.nn.Module:
    """A PyG conv by name: ``gcn``, ``sage``, ``gat`` or ``graph``.

    GAT uses ``heads`` heads whose outputs are averaged (``concat=False``) so
    the width stays ``out_channels``.
    """
    if conv == "gcn":
        return GCNConv(in_channels, out_channels, **kwargs)
    if conv == "sage":
        return SAGEConv(in_channels, out_channels, **kwargs)
    if conv == "gat":
        return GATConv(in_channels, out_channels, heads=heads, concat=False, **kwargs)
    if conv == "graph":
        return GraphConv(in_channels, out_channels, **kwargs)
    raise ValueError(f"unknown conv {conv!r}; expected one of {CONVS}")


class ResGNN(torch.nn.Module):
    r"""Deep residual GNN with pre-activation blocks, trained by plain autograd.

    From DeepGCN (Li et al., ICCV 2019) as used by RevGNN: an encoder, ``L``
    blocks :math:`h \leftarrow h + \mathrm{conv}(\mathrm{drop}(\mathrm{ReLU}(
    \mathrm{norm}(h))))`, then a head. Activations grow as :math:`O(L N C)`.

    Args:
        in_channels (int): input feature size.
        hidden_channels (int): width of every block.
        out_channels (int): output size.
        num_layers (int): number of residual blocks ``L``.
        conv (str, optional): conv type, see :func:`build_conv`. (default: ``"sage"``)
        dropout (float, optional): dropout inside blocks. (default: ``0.0``)

    Shapes:
        **input:** ``x [N, in_channels]``, ``edge_index [2, E]``
        **output:** ``[N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int, conv: str = "sage", dropout: float = 0.0,
                 **conv_kwargs):
        super().__init__()
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers = out_channels, num_layers
        self.conv_name, self.dropout = conv, dropout
        self.encoder = torch.nn.Linear(in_channels, hidden_channels)
        self.norms = torch.nn.ModuleList(
            LayerNorm(hidden_channels, mode="node") for _ in range(num_layers))
        self.convs = torch.nn.ModuleList(
            build_conv(conv, hidden_channels, hidden_channels, **conv_kwargs)
            for _ in range(num_layers))
        self.out_norm = LayerNorm(hidden_channels, mode="node")
        self.head = torch.nn.Linear(hidden_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.encoder.reset_parameters()
        for m in [*self.norms, *self.convs, self.out_norm, self.head]:
            m.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, **kwargs) -> Tensor:
        h = self.encoder(x)
        for norm, conv in zip(self.norms, self.convs):
            z = F.dropout(F.relu(norm(h)), p=self.dropout, training=self.training)
            h = h + conv(z, edge_index, **kwargs)
        return self.head(F.relu(self.out_norm(h)))

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.hidden_channels}, {self.out_channels}, "
                f"num_layers={self.num_layers}, conv={self.conv_name})")


def _shallow(cls):
    def make(in_channels, hidden_channels, out_channels, num_layers, dropout=0.0,
             **_):
        return cls(in_channels, hidden_channels, num_layers, out_channels,
                   dropout=dropout)
    return make


#: model name -> constructor(in_channels, hidden_channels, out_channels,
#: num_layers, **kwargs)
MODELS = {
    "res": ResGNN,
    "gcn": _shallow(GCN),
    "sage": _shallow(GraphSAGE),
    "gat": _shallow(GAT),
}


def build_model(name: str, in_channels: int, hidden_channels: int,
                out_channels: int, num_layers: int, **kwargs) -> torch.nn.Module:
    """Build a model by name (see :data:`MODELS`); unknown kwargs are ignored by
    the shallow baselines."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return MODELS[name](in_channels, hidden_channels, out_channels, num_layers,
                        **kwargs)
