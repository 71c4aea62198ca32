"""Device workspace of one chunk job: a model calibrated by measurement.

The offload engine must never exceed its device budget, so before it runs a
chunk it has to know how many bytes the chunk's layer will allocate:
messages per edge, attention coefficients, autograd buffers. Those depend on
the conv, so they are *measured*, not guessed: on CPU with
:class:`~leangnn.profile.LiveBytesMeter` (every storage an op creates and
every one that dies, i.e. what a caching-free allocator would need), on CUDA
with ``torch.cuda.max_memory_allocated``. :class:`WorkspaceModel` runs
every layer on a few random probe chunks under the meter and fits
``bytes = a_S |S| + a_T |T| + a_E |E|`` per layer and phase, with a safety
margin, then adds the engine's own buffers analytically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from leangnn.profile import LiveBytesMeter

__all__ = ["WorkspaceModel"]


def _probe_graph(n_src: int, n_tgt: int, n_edges: int, gen: torch.Generator):
    dst = torch.arange(n_edges) % n_tgt
    src = torch.randint(n_src, (n_edges,), generator=gen)
    return torch.stack([src, dst]).to(torch.int32)


@dataclass
class _Fit:
    coef: np.ndarray  # bytes per source row, target row, edge
    const: float


class WorkspaceModel:
    """Bytes a chunk job allocates on the device, per layer and phase.

    Args:
        run (callable): ``run(layer, backward, x_S, edge_index, edge_weight,
            num_targets)`` executes one job's compute exactly as the engine
            does (for ``backward=True`` including ``autograd.backward``).
        widths (list of int): layer widths ``[in, hidden, ..., out]``.
        dtype (torch.dtype): element type of the embeddings.
        weighted (bool): whether jobs carry edge weights.
        device (torch.device): where the probes run.
        margin (float, optional): multiplicative safety margin on the fit.
            (default: ``1.25``)
    """

    #: probe chunk sizes (|S|, |T|, |E|), chosen to separate the three terms.
    PROBES = ((1024, 256, 4096), (4096, 256, 4096), (1024, 1024, 4096),
              (2048, 512, 16384), (3072, 768, 8192))

    _CACHE: dict[tuple, dict] = {}

    def __init__(self, run: Callable, widths: list[int], dtype: torch.dtype,
                 weighted: bool, device: torch.device, margin: float = 1.25,
                 key: tuple | None = None):
        self.widths = widths
        self.num_layers = len(widths) - 1
        self.elem = torch.empty((), dtype=dtype).element_size()
        self.dtype, self.device, self.weighted = dtype, device, weighted
        self.margin = margin
        # Bytes depend on the layer structure, not on parameter values, so a
        # calibration is reused for every model with the same ``key``.
        full_key = None if key is None else (key, tuple(widths), dtype, str(device),
                                             weighted, margin)
        if full_key is not None and full_key in self._CACHE:
            self.fits = self._CACHE[full_key]
            return
        self.fits: dict[tuple[int, bool], _Fit] = {}
        gen = torch.Generator().manual_seed(0)
        for layer in range(self.num_layers):
            for backward in (False, True):
                self.fits[layer, backward] = self._calibrate(run, layer, backward, gen)
        if full_key is not None:
            self._CACHE[full_key] = self.fits

    def _measure(self, run, layer, backward, n_s, n_t, n_e, gen) -> int:
        ei = _probe_graph(n_s, n_t, n_e, gen).to(self.device)
        w = (torch.rand(n_e, generator=gen).to(self.device, self.dtype)
             if self.weighted else None)
        x = torch.randn(n_s, self.widths[layer], generator=gen).to(
            self.device, self.dtype)
        g = torch.randn(n_t, self.widths[layer + 1], generator=gen).to(
            self.device, self.dtype) if backward else None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            run(layer, backward, x, ei, w, n_t, g)
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - base
        with LiveBytesMeter(exclude=[x, ei, w, g]) as meter:
            run(layer, backward, x, ei, w, n_t, g)
        return meter.peak

    def _calibrate(self, run, layer, backward, gen) -> _Fit:
        rows, ys = [], []
        for n_s, n_t, n_e in self.PROBES:
            rows.append([n_s, n_t, n_e])
            ys.append(self._measure(run, layer, backward, n_s, n_t, n_e, gen))
        a, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
        from scipy.optimize import nnls

        coef, _ = nnls(a, y)
        pred = a @ coef
        # The peak is the max of the forward and backward phases, so not quite
        # linear: scale the fit until it covers every probe (a constant would
        # swamp small jobs), plus a page for scalars and index bookkeeping.
        scale = float(max(1.0, (y / np.maximum(pred, 1.0)).max()))
        return _Fit(coef * scale, 4096.0)

    def conv_bytes(self, layer: int, backward: bool, n_s: int, n_t: int,
                   n_e: int) -> int:
        f = self.fits[layer, backward]
        return int(self.margin * (f.coef @ np.array([n_s, n_t, n_e]) + f.const))

    def buffer_bytes(self, layer: int, backward: bool, n_s: int, n_t: int,
                     n_e: int, slot_width: int) -> int:
        """The engine's own buffers around the conv (upper bound).

        Input block and its assembly temporaries (cache rows are gathered at
        slot width), the candidates copied into the cache, the output (or the
        upstream gradient, the input gradient and its split), the local edges
        (int32 as transferred, int64 as used) and weights.
        """
        w_in, w_out = self.widths[layer], self.widths[layer + 1]
        wide = max(w_in, slot_width)
        rows = n_s * (w_in + wide + w_in) + n_t * w_out * 2
        if backward:
            rows += n_s * w_in * 3 + n_t * w_out * 2
        topo = n_e * (8 + 16) + (n_e * self.elem if self.weighted else 0)
        return rows * self.elem + topo + 8 * (n_s + n_t) * 2

    def __call__(self, layer: int, backward: bool, n_s: int, n_t: int, n_e: int,
                 slot_width: int) -> int:
        return (self.conv_bytes(layer, backward, n_s, n_t, n_e)
                + self.buffer_bytes(layer, backward, n_s, n_t, n_e, slot_width))

    def max_bytes(self, n_s: int, n_t: int, n_e: int, slot_width: int,
                  backward: bool = True) -> int:
        """Largest job bytes over all layers (and both phases)."""
        phases = (False, True) if backward else (False,)
        return max(self(li, b, n_s, n_t, n_e, slot_width)
                   for li in range(self.num_layers) for b in phases)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(layers={self.num_layers}, "
                f"margin={self.margin})")
