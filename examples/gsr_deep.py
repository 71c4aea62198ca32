"""A 256-layer GSR-GNN on epfl/multiplier (43k gates) at the memory of a few layers.

The reversible stack keeps only its output for backward, so the bytes autograd
holds do not grow with depth; the same parameters under plain autograd
(``disable=True``) keep every layer's activations. A few Adam steps then run
on the 256-layer model.

    python examples/gsr_deep.py

Output on a shared 2-core CPU (1 thread, other jobs running; CPU times):

    GSRGNN L=16   reversible    saved for backward    46.0 MiB
    GSRGNN L=256  reversible    saved for backward    46.0 MiB
    GSRGNN L=16   plain autograd saved for backward   567.0 MiB
    GSRGNN L=64   plain autograd saved for backward  2193.2 MiB
    step 1 loss 0.4603 (59.5 s)
    step 2 loss 0.1367 (58.9 s)
    step 3 loss 0.0356 (56.9 s)
"""

import time

import torch
import torch.nn.functional as F

from leangnn.circuits import load_circuit
from leangnn.nn import GSRGNN
from leangnn.profile import SavedTensorsMeter

torch.set_num_threads(1)
torch.manual_seed(0)
data = load_circuit("epfl/multiplier", task="arrival")


def saved_bytes(model):
    with SavedTensorsMeter() as meter:
        out = model(data.x, data.edge_index)
    del out
    return meter.bytes


for layers, disable in [(16, False), (256, False), (16, True), (64, True)]:
    model = GSRGNN(data.num_features, 64, 1, layers, num_groups=4, sparsity=8,
                   disable=disable).train()
    how = "plain autograd" if disable else "reversible   "
    print(f"GSRGNN L={layers:<4} {how} saved for backward "
          f"{saved_bytes(model) / 2**20:7.1f} MiB")

model = GSRGNN(data.num_features, 64, 1, 256, num_groups=4, sparsity=8).train()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(1, 4):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = F.mse_loss(model(data.x, data.edge_index).view(-1), data.y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f} ({time.perf_counter() - t0:.1f} s)")
