"""The ``offload`` strategy: exact full-graph training beyond device memory.

Plugs :class:`~leangnn.offload.engine.OffloadEngine` (NeutronJittor-style
partitioned layer-wise execution with a spatial-temporal device cache,
Fundamental Research 2026) into the :class:`~leangnn.train.Trainer`: one
engine per graph, built on first use; every ``train_step`` is one exact
full-batch forward/backward, so the trainer's single optimizer step per
graph and epoch sees exactly PyG's full-batch gradient.

Under ``--strategy auto`` an engine takes over the graph structures the
planner's row of it built (edges grouped by target, partition; see
:func:`~leangnn.offload.engine.offer_graph`; ``LEANGNN_PLAN_REUSE=0`` is the
off switch).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from leangnn.offload.engine import OffloadEngine
from leangnn.offload.options import OffloadOptions
from leangnn.strategy import LossFn, Strategy

__all__ = ["OffloadStrategy"]

DEFAULT_BUDGET = "2GiB"


class OffloadStrategy(Strategy):
    """Exact offloaded full-graph training under a device byte budget.

    Args:
        device (torch.device or str, optional): the device. (default: ``"cpu"``)
        device_budget (int or str, optional): device bytes for parameters,
            cache and job workspace, e.g. ``"2GiB"``. (default: ``"2GiB"``)
        num_parts (int, optional): METIS parts per graph (clamped to the
            graph's node count). (default: ``8``)
        cache (str, optional): ``"none"``, ``"lru"``, ``"degree"``, ``"st"``
            or ``"auto"`` (``st`` on CUDA, ``none`` on a CPU "device").
            (default: ``"auto"``)
        mode (str, optional): ``"exact"`` or the ``"recompute"`` baseline.
            (default: ``"exact"``)
        **engine_kwargs: further :class:`~leangnn.offload.options.OffloadOptions`
            fields (``workspace_fraction``, ``partition_method``, ``order``,
            ``strict``, ...), validated here.
    """

    name = "offload"

    def __init__(self, device: torch.device | str = "cpu",
                 device_budget: int | str = DEFAULT_BUDGET, num_parts: int = 8,
                 cache: str = OffloadOptions.cache, mode: str = OffloadOptions.mode,
                 **engine_kwargs):
        super().__init__(device)
        self.options = OffloadOptions(device_budget, num_parts, cache, mode,
                                      device=self.device, **engine_kwargs)
        self.device_budget = self.options.device_budget
        self.num_parts, self.cache, self.mode = num_parts, cache, mode
        self._engines: dict[int, tuple[Data, torch.nn.Module, OffloadEngine]] = {}

    @classmethod
    def from_config(cls, cfg) -> OffloadStrategy:
        """Build from a :class:`~leangnn.config.TrainConfig` (``device``,
        ``device_budget``, ``num_parts``, ``cache``, ``offload_mode``,
        ``retain``; a field the config leaves ``None`` takes the engine's
        default)."""
        retain = getattr(cfg, "retain", None)
        return cls(device=cfg.device,
                   device_budget=cfg.device_budget or DEFAULT_BUDGET,
                   num_parts=cfg.num_parts, cache=cfg.cache or OffloadOptions.cache,
                   mode=getattr(cfg, "offload_mode", None) or OffloadOptions.mode,
                   retain=OffloadOptions.retain if retain is None else bool(retain))

    @staticmethod
    def _key(model: torch.nn.Module, data: Data) -> tuple:
        # Train/val/test splits of one graph are different Data objects that
        # share x and edge_index (only the node mask differs): one engine.
        return (id(model), data.x.data_ptr(), data.edge_index.data_ptr(),
                int(data.num_nodes), int(data.num_edges))

    def engine(self, model: torch.nn.Module, data: Data) -> OffloadEngine:
        """The engine of ``data``'s graph (built on first use)."""
        key = self._key(model, data)
        hit = self._engines.get(key)
        if hit is not None:
            return hit[2]
        opts = replace(self.options,
                       num_parts=min(self.num_parts, int(data.num_nodes)))
        eng = OffloadEngine(model, data, options=opts)
        # keep data and model alive so their ids and pointers stay unique
        self._engines[key] = (data, model, eng)
        return eng

    def setup(self, model: torch.nn.Module, train_graphs: list[Data]) -> None:
        for g in train_graphs:
            self.engine(model, g)

    @property
    def taken_bytes(self) -> int:  # (see Strategy.taken_bytes)
        """The engines' :attr:`OffloadEngine.taken_bytes`."""
        return sum(eng.taken_bytes for _, _, eng in self._engines.values())

    def train_step(self, model: torch.nn.Module, data: Data, loss_fn: LossFn) -> float:
        return self.engine(model, data).train_step(loss_fn, data)

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, data: Data) -> Tensor:
        return self.engine(model, data).predict()

    def summary(self) -> dict[str, Any]:
        graphs = {}
        total: dict[str, int] = {}
        for data, _, eng in self._engines.values():
            s = eng.summary()
            name = str(data.get("name", None) or f"graph{len(graphs)}")
            graphs[name if name not in graphs else f"{name}#{len(graphs)}"] = s
            for k, v in s["total"].items():
                total[k] = max(total.get(k, 0), v) if k.startswith("peak") else (
                    total.get(k, 0) + v)
        policies = sorted({eng.policy for _, _, eng in self._engines.values()})
        return {"offload": {"device_budget": self.device_budget, "cache": self.cache,
                            "cache_policies": policies,
                            "mode": self.mode, "num_parts": self.num_parts,
                            "counters": total, "graphs": graphs}}

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(budget={self.device_budget}, "
                f"parts={self.num_parts}, cache={self.cache}, mode={self.mode})")
