"""Exact multi-process training on torch.distributed (gloo on CPU, NCCL on GPU).

* :class:`GraphParallel`: one big graph, METIS parts per rank, per-layer halo
  exchange with ``all_to_all_single`` (autograd-aware), gradients equal to
  full-batch training.
* :class:`DataParallel`: many graphs (netlists), shards per rank, one gradient
  all-reduce per step, equal to one process with the same batch.
* :class:`RankOffload`: a rank's part through the layer-wise offload engine
  under its own device budget (graph parallel beyond the sum of the devices).
* :class:`DistributedStrategy`: both inside the :class:`~leangnn.train.Trainer`
  (``--strategy distributed`` under ``torchrun``, or ``--nproc P``).
* :func:`spawn` / :func:`launch_processes`: local launchers whose watchdog
  turns a dead rank into an error instead of a hang.
"""

from leangnn.distributed.counters import EpochMeter, RankEpochRecord
from leangnn.distributed.data_parallel import (
    DataParallel,
    batch_mean_loss,
    epoch_batches,
)
from leangnn.distributed.graph_parallel import GraphParallel
from leangnn.distributed.halo import HaloPlan, HaloStats, halo_counts, halo_exchange
from leangnn.distributed.launch import (
    find_free_port,
    launch_processes,
    rank_threads,
    relaunch_cli,
    spawn,
)
from leangnn.distributed.layers import (
    SUPPORTED_CONVS,
    check_model,
    local_gcn_norm,
    message_passing_layers,
)
from leangnn.distributed.rank_offload import RankOffload, RankPlan
from leangnn.distributed.runtime import (
    DistContext,
    DistributedError,
    all_reduce_gradients,
    broadcast_parameters,
    init_distributed,
)
from leangnn.distributed.strategy import DistributedStrategy

__all__ = [
    "GraphParallel", "SUPPORTED_CONVS", "check_model", "message_passing_layers",
    "local_gcn_norm", "RankOffload", "RankPlan",
    "DataParallel", "batch_mean_loss", "epoch_batches",
    "HaloPlan", "HaloStats", "halo_counts", "halo_exchange",
    "DistributedStrategy", "EpochMeter", "RankEpochRecord",
    "spawn", "launch_processes", "rank_threads", "relaunch_cli", "find_free_port",
    "DistContext", "DistributedError", "init_distributed", "all_reduce_gradients",
    "broadcast_parameters",
]
