"""Deep vs shallow on `arrival`: a 64-layer GSR-GNN against a 4-layer one.

Trains on small ISCAS-85/EPFL circuits and tests on circuits never seen, with
the leangnn Trainer (reversible strategy = plain training of the GSR model).
Equivalent CLI: ``leangnn train --strategy reversible --model gsr --layers 64
--groups 4 --dataset ... --test-dataset ...``.

    python examples/gsr_arrival.py

Output on a shared 2-core CPU (1 thread):

    L=4  test pearson 0.8221 spearman 0.8726 kendall 0.6739 mae 0.1081
    L=64 test pearson 0.8489 spearman 0.9063 kendall 0.7365 mae 0.0947
"""

import torch

from leangnn.config import TrainConfig
from leangnn.train import Trainer

torch.set_num_threads(1)
TRAIN = "iscas85/c432,iscas85/c880,iscas85/c1908,epfl/ctrl,epfl/router,epfl/int2float"
for layers in (4, 64):
    cfg = TrainConfig(dataset=TRAIN, val_dataset="epfl/cavlc",
                      test_dataset="iscas85/c3540,iscas85/c2670",
                      strategy="reversible", model="gsr", num_layers=layers,
                      hidden_channels=64, num_groups=4, epochs=30, patience=0,
                      lr=1e-3)
    # In memory (record=False): the example reads the summary only, and
    # writes no run directory that a second run would have to overwrite.
    t = Trainer(cfg, progress=False, record=False).fit()["metrics"]["test"]
    print(f"L={layers:<2} test pearson {t['pearson']:.4f} spearman "
          f"{t['spearman']:.4f} kendall {t['kendall']:.4f} mae {t['mae']:.4f}")
