"""A 256-layer GSR-GNN on epfl/multiplier (43k gates) at the memory of a few layers.

The reversible stack keeps only its output for backward, so the bytes autograd
holds do not grow with depth; the same parameters under plain autograd
(``disable=True``) keep every layer's activations. The 256-layer model then
trains for a few epochs through the leangnn Trainer (one epoch = one Adam step
on the circuit), as ``leangnn train --strategy reversible --model gsr --layers
256 --groups 4 --sparsity 8 --epochs 3 --lr 1e-4 --dataset epfl/multiplier``
would (without the CLI's validation and test circuits).

    python examples/gsr_deep.py

Output on a shared 2-core CPU (1 thread, other jobs running; CPU times):

    GSRGNN L=16   reversible    saved for backward    46.0 MiB
    GSRGNN L=256  reversible    saved for backward    46.0 MiB
    GSRGNN L=16   plain autograd saved for backward   567.0 MiB
    GSRGNN L=64   plain autograd saved for backward  2193.2 MiB
    epoch 1 loss 0.0663 (29.2 s)
    epoch 2 loss 0.0335 (31.3 s)
    epoch 3 loss 0.0244 (39.1 s)
    Trainer: saved for backward 46.3 MiB, training loop peak 175.2 MiB (cpu_peak_rss)

(The peak is process RSS under glibc's default allocator, so it varies from
run to run by tens of MiB; the saved-for-backward bytes do not.)
"""

import tempfile

import torch

from leangnn.circuits import load_circuit
from leangnn.config import TrainConfig
from leangnn.data import GraphSplits
from leangnn.nn import GSRGNN
from leangnn.profile import SavedTensorsMeter
from leangnn.rundir import RunDir
from leangnn.train import Trainer

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

splits = GraphSplits(train=[data], val=[], test=[], task_type="regression",
                     out_channels=1)
# A throw-away run directory: its metrics.jsonl has the per-epoch losses.
with tempfile.TemporaryDirectory() as tmp:
    # lr 1e-4: at 1e-3 the first Adam step through 256 layers overshoots.
    cfg = TrainConfig(task="arrival", strategy="reversible", model="gsr",
                      num_layers=256, hidden_channels=64, num_groups=4, sparsity=8,
                      epochs=3, lr=1e-4, patience=0, out=tmp)
    summary = Trainer(cfg, splits, progress=False).fit()
    for rec in RunDir(tmp).read_metrics():
        print(f"epoch {rec['epoch']} loss {rec['train_loss']:.4f} "
              f"({rec['epoch_seconds']:.1f} s)")
mem = summary["memory"]
print(f"Trainer: saved for backward {mem['saved_for_backward_bytes'] / 2**20:.1f} "
      f"MiB, training loop peak {mem['peak_bytes'] / 2**20:.1f} MiB "
      f"({mem['method']})")
