"""The base strategy is plain autograd: its gradients equal a hand-written step."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from leangnn.nn.models import build_model
from leangnn.strategy import FullBatch, node_mask
from leangnn.train import make_loss_fn


def test_full_batch_step_equals_manual_autograd():
    torch.manual_seed(0)
    g = Data(x=torch.randn(30, 5, dtype=torch.float64),
             edge_index=torch.randint(30, (2, 90)),
             y=torch.randn(30, dtype=torch.float64))
    model = build_model("res", 5, 8, 1, 3).double()
    loss_fn = make_loss_fn("regression")
    loss = FullBatch().train_step(model, g, loss_fn)
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = torch.nn.functional.mse_loss(model(g.x, g.edge_index).view(-1), g.y)
    ref.backward()
    assert abs(loss - float(ref.detach())) < 1e-12
    for a, p in zip(ours, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-12, atol=0)
    assert node_mask(g) is None
    out = FullBatch().predict(model, g)
    assert out.shape == (30, 1) and not out.requires_grad
