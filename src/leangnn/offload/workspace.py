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

import json
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


#: bump when the probes or the measured code path change (stored fits of an
#: older version are then measured again)
_VERSION = 3


def _disk_path(full_key: tuple | None, device: torch.device):
    """Cache file of a CPU calibration (``None``: not cached: no key, or a
    CUDA device, whose allocator figures depend on the card). The callers'
    ``key`` carries a fingerprint of the code the probes run
    (:func:`leangnn.offload.plane.probe_code`), so an edit measures anew."""
    if full_key is None or torch.device(device).type != "cpu":
        return None
    import hashlib

    from leangnn.utils import cache_root

    text = repr((full_key, torch.__version__, _VERSION, WorkspaceModel.PROBES))
    return cache_root("workspace") / (hashlib.sha1(text.encode()).hexdigest()
                                      + ".json")


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
            self.fits, self.kept_fits, self.edge_blocks = self._CACHE[full_key]
            return
        path = _disk_path(full_key, device)
        if path is not None and self._load(path):
            self._CACHE[full_key] = (self.fits, self.kept_fits, self.edge_blocks)
            return
        self.fits: dict[tuple[int, bool], _Fit] = {}
        #: bytes still alive after a forward job while its result lives (the
        #: autograd graph a retaining job keeps), fitted without any margin
        self.kept_fits: dict[int, _Fit] = {}
        #: per layer and phase, the bytes per edge of each edge-sized block
        #: alive at the job's peak (on a CPU; see :meth:`mapped_bytes`)
        self.edge_blocks: dict[tuple[int, bool], list[float]] = {}
        gen = torch.Generator().manual_seed(0)
        for layer in range(self.num_layers):
            for backward in (False, True):
                self.fits[layer, backward] = self._calibrate(run, layer, backward, gen)
        if full_key is not None:
            self._CACHE[full_key] = (self.fits, self.kept_fits, self.edge_blocks)
        if path is not None:
            self._save(path)

    # A CPU calibration is a pure function of the layer code and torch (bytes
    # of storages, no timing): kept on disk like METIS partitions, it costs a
    # fresh process (each ``leangnn train``, each plan) nothing (measured
    # 0.1-0.3 s of a 0.4-1.5 s offload estimate).
    def _load(self, path) -> bool:
        try:
            d = json.loads(path.read_text())
            fits = {(int(k.split(",")[0]), k.split(",")[1] == "1"):
                    _Fit(np.asarray(v[0], dtype=float), float(v[1]))
                    for k, v in d["fits"].items()}
            kept = {int(k): _Fit(np.asarray(v[0], dtype=float), float(v[1]))
                    for k, v in d["kept"].items()}
            blocks = {(int(k.split(",")[0]), k.split(",")[1] == "1"):
                      [float(b) for b in v] for k, v in d["blocks"].items()}
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return False
        if len(fits) != 2 * self.num_layers or len(kept) != self.num_layers:
            return False
        self.fits, self.kept_fits, self.edge_blocks = fits, kept, blocks
        return True

    def _save(self, path) -> None:
        from leangnn.utils import atomic_write_text

        d = {"fits": {f"{li},{int(b)}": [f.coef.tolist(), f.const]
                      for (li, b), f in self.fits.items()},
             "kept": {str(li): [f.coef.tolist(), f.const]
                      for li, f in self.kept_fits.items()},
             "blocks": {f"{li},{int(b)}": v
                        for (li, b), v in self.edge_blocks.items()}}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(d))
        except OSError:
            pass  # a read-only cache only costs the next process a calibration

    def _measure(self, run, layer, backward, n_s, n_t, n_e, gen
                 ) -> tuple[int, int, list[int]]:
        """Peak bytes of the job, bytes alive after it while its result is
        held, and (on a CPU) the bytes of each ``n_e``-row block alive at the
        peak."""
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
            res = run(layer, backward, x, ei, w, n_t, g)
            torch.cuda.synchronize(self.device)
            kept = torch.cuda.memory_allocated(self.device) - base
            del res
            return torch.cuda.max_memory_allocated(self.device) - base, kept, []
        with LiveBytesMeter(exclude=[x, ei, w, g], rows=n_e) as meter:
            res = run(layer, backward, x, ei, w, n_t, g)
            kept = meter.live
            del res
        return meter.peak, kept, meter.peak_row_blocks

    def _calibrate(self, run, layer, backward, gen) -> _Fit:
        rows, ys, kept = [], [], []
        most = max(p[2] for p in self.PROBES)
        for n_s, n_t, n_e in self.PROBES:
            rows.append([n_s, n_t, n_e])
            peak, k, blocks = self._measure(run, layer, backward, n_s, n_t, n_e, gen)
            ys.append(peak)
            kept.append(k)
            if n_e == most:  # (its edge count is no probe's node count)
                self.edge_blocks[layer, backward] = sorted(
                    (b / n_e for b in blocks), reverse=True)
        a, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
        # imported here: a CPU calibration is kept on disk, so most processes
        # never fit (and never pay scipy.optimize's import)
        from scipy.optimize import nnls

        if not backward:
            self.kept_fits[layer] = _Fit(nnls(a, np.asarray(kept, dtype=float))[0],
                                         0.0)
        coef = nnls(a, y)[0]
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

    def kept_bytes(self, layer: int, n_s: int, n_t: int, n_e: int) -> int:
        """Bytes a forward job's result keeps alive (its autograd graph when
        the job retains it; the calibrated inputs excluded), no margin."""
        return int(self.kept_fits[layer].coef @ np.array([n_s, n_t, n_e]))

    def expected_bytes(self, layer: int, backward: bool, n_s: int, n_t: int,
                       n_e: int) -> int:
        """Bytes the job really allocates (for estimates, not for budget
        checks): the fitted conv bytes without the safety margin, the input
        block, in backward the upstream gradient block, and on a CUDA device
        the copied topology. The engine's other buffers (:meth:`buffer_bytes`,
        an upper bound) are views or die before the conv's peak: measured
        within ~1% of a real CPU epoch's live bytes (s38417, b19, CSBM)."""
        f = self.fits[layer, backward]
        conv = float(f.coef @ np.array([n_s, n_t, n_e]) + f.const)
        rows = n_s * self.widths[layer] + (n_t * self.widths[layer + 1]
                                           if backward else 0)
        topo = 0 if self.device.type == "cpu" else n_e * 8 + (
            n_e * self.elem if self.weighted else 0)
        return int(conv) + rows * self.elem + topo

    def mapped_bytes(self, layer: int, backward: bool, n_e: int,
                     threshold: int | None) -> int:
        """Bytes of a job's edge-sized blocks (alive at its peak) that are
        ``threshold`` bytes or more: glibc maps each such block on pages of
        its own instead of carving it from the heap (its mmap threshold; 0 or
        ``None``: no heap, nothing counted).

        Why it matters (:meth:`~leangnn.offload.budget.DeviceBudget.charge`):
        the heap keeps its high-water extent while a mapped block is alive, so
        the two add up. Measured on csbm:150000, SAGE-2, 24 chunks: 38 MB
        message blocks in the first layer, 19 MB in the second; the process
        peaked at 148 MiB under the compact heap's 32 MiB threshold and at
        113 MiB with the threshold at 64 MiB.
        """
        if not threshold:
            return 0
        return int(sum(b * n_e for b in self.edge_blocks.get((layer, backward), ())
                       if b * n_e >= threshold))

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
