"""One chunk job of the offload engine: its data plane and its cache decisions.

A job reads its layer input rows (from the device cache or the host store),
runs the layer (or recomputes it and backpropagates), writes or accumulates
its outputs, and offers rows to the cache with the policy's keys. Every byte
it moves is counted and every job is charged against the device budget.
:class:`JobRunner` holds these steps; :class:`~leangnn.offload.engine.
OffloadEngine` owns the state they use and the sweeps that call them.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from leangnn.offload.cache import Candidates, st_keys
from leangnn.offload.layerwise import LayerwiseModel
from leangnn.offload.workspace import LiveBytesMeter

__all__ = ["JobRunner"]


class JobRunner:
    """Mixin with the per-job steps of :class:`~leangnn.offload.engine.OffloadEngine`.

    Array ids: ``h_l`` (layer ``l``'s input, ``l = 0..L``) is ``l``; its
    gradient ``g_l`` is ``L + 1 + l``.
    """

    # ------------------------------------------------------------- data plane
    @staticmethod
    def _compute(lw: LayerwiseModel, li: int, backward: bool, x: Tensor, ei: Tensor,
                 w: Tensor | None, nt: int, g: Tensor | None) -> Tensor | None:
        """One job's compute: layer ``li`` forward, or recompute + backward
        (returns the input gradient, ``None`` for the first layer)."""
        ei = ei.long()
        if not backward:
            with torch.no_grad():
                return lw.layer(li, x, ei, nt, w)
        x = x.detach().requires_grad_(li > 0)
        with torch.enable_grad():
            out = lw.layer(li, x, ei, nt, w)
            torch.autograd.backward(out, g)
        return x.grad

    @contextmanager
    def _rng(self, key):
        if not self.lw.needs_rng:
            yield
            return
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.manual_seed(hash((self._rng_key, key)) & 0x7FFF_FFFF_FFFF)
            yield

    def _bookkeeping(self):
        return self._meter.paused() if self._meter is not None else nullcontext()

    def _width(self, aid: int) -> int:
        return self.widths[aid] if aid <= self.L else self.widths[aid - self.L - 1]

    def _name(self, aid: int) -> str:
        return f"h{aid}" if aid <= self.L else f"g{aid - self.L - 1}"

    def _is_grad(self, aid: int) -> bool:
        return aid > self.L

    def _rowbytes(self, aid: int) -> int:
        return self._width(aid) * self.elem

    def _to_dev(self, t: Tensor) -> Tensor:
        return t.to(self.device, non_blocking=True)

    def _assemble(self, aid: int, rows: Tensor, slots: Tensor, hit: Tensor):
        c = self.counters
        with self._bookkeeping():
            hit_pos = torch.nonzero(hit).flatten()
            miss_pos = torch.nonzero(~hit).flatten()
        c.cache_hits += hit_pos.numel()
        c.cache_misses += miss_pos.numel()
        c.h2d_bytes += miss_pos.numel() * self._rowbytes(aid)
        c.h2d_meta_bytes += 8 * hit_pos.numel()
        if self.virtual:
            return None
        w = self._width(aid)
        block = torch.empty(rows.numel(), w, dtype=self.dtype, device=self.device)
        if hit_pos.numel():
            vals = self.cache.read(self._to_dev(slots[hit_pos]))[:, :w]
            block.index_copy_(0, self._to_dev(hit_pos), vals)
            del vals
        if miss_pos.numel():
            vals = self._to_dev(self.host.gather(self._name(aid), rows[miss_pos]))
            block.index_copy_(0, self._to_dev(miss_pos), vals)
        return block

    def _topology(self, ch):
        n_e = ch.num_edges
        self.counters.h2d_meta_bytes += n_e * 8 + (n_e * self.elem if ch.weighted
                                                   else 0)
        if self.virtual:
            return None, None
        w = None if ch.edge_weight is None else self._to_dev(ch.edge_weight)
        return self._to_dev(ch.edge_index), w

    def _write_host(self, aid: int, rows: Tensor, vals: Tensor | None) -> None:
        self.counters.d2h_bytes += rows.numel() * self._rowbytes(aid)
        if self._is_grad(aid) and aid in self._partial:
            self._partial[aid][rows] = True
        if self.virtual or rows.numel() == 0:
            return
        if self._is_grad(aid):
            self.host.accumulate(self._name(aid), rows, vals)
        else:
            self.host.write(self._name(aid), rows, vals)

    def _writeback(self, aid: int, rows: Tensor, slots: Tensor) -> None:
        self.counters.writebacks += rows.numel()
        vals = None if self.virtual else self.cache.read(
            self._to_dev(slots))[:, : self._width(aid)]
        self._write_host(aid, rows, vals)

    # ------------------------------------------------------------ cache keys
    def _keys(self, aid: int, rows: Tensor, gids: Tensor, k: int,
              chunk: int | None) -> Tensor:
        if self.policy == "lru":
            keys = torch.arange(self._clock, self._clock + rows.numel())
            self._clock += rows.numel()
            return keys
        if self.policy == "degree":
            return self.degree[gids]
        nu, rem = self.sched.next_use(self._acc[aid], k, chunk, rows)
        return st_keys(nu, rem, self.degree[gids])

    def _begin_sweep(self, active: set[int]) -> None:
        if self.policy == "degree":
            act = torch.zeros(2 * self.L + 2, dtype=torch.bool)
            act[list(active)] = True
            self.cache.rekey(lambda owner, row, aux, key: torch.where(
                act[owner], aux, -1))

    # ------------------------------------------------------------------ jobs
    def _account(self, li: int, backward: bool, ch) -> None:
        need = self.resident + self.cache.nbytes + self.ws(
            li, backward, *ch.sizes, self.slot_width)
        c = self.counters
        c.peak_device_bytes = max(c.peak_device_bytes, need)
        c.jobs += 1
        if need > self.budget:
            raise AssertionError(f"offload accounting exceeded the device budget: "
                                 f"{need} > {self.budget} bytes")

    @contextmanager
    def _measured(self):
        if not self.strict or self.virtual or self.device.type == "cuda":
            yield
            return
        params = [p for p in self.model.parameters()]
        grads = [p.grad for p in params if p.grad is not None]
        meter = LiveBytesMeter(exclude=params + grads + (
            [self.cache.pool] if self.cache.pool is not None else []))
        self._meter = meter
        try:
            with meter:
                yield
        finally:
            self._meter = None
        used = self.resident + self.cache.nbytes + meter.peak
        c = self.counters
        c.peak_device_bytes_measured = max(c.peak_device_bytes_measured, used)
        if used > self.budget:
            raise AssertionError(f"measured device bytes exceeded the budget: "
                                 f"{used} > {self.budget}")

    def _job(self, k: int, li: int, ch, backward: bool, in_aid: int, in_rows: Tensor,
             in_gids: Tensor, out_aid: int, out_rows: Tensor, out_gids: Tensor,
             chunk: int | None, out_to_host: bool, gx_aid: int | None, rng_key):
        """Forward job (writes ``out_aid`` rows) or backward job (reads the
        upstream gradient ``out_aid`` rows, accumulates into ``gx_aid``)."""
        self._account(li, backward, ch)
        cache, c = self.cache, self.counters
        caching = cache.num_slots > 0
        with self._measured():
            with self._bookkeeping():
                slots = cache.lookup(in_aid, in_rows)
                hit = slots >= 0
            x = self._assemble(in_aid, in_rows, slots, hit)
            g_up = self._read_grad(out_aid, out_rows, out_to_host) if backward else None
            ei, w = self._topology(ch)
            nt = ch.num_targets
            out = None
            if not self.virtual:
                with self._rng(rng_key):
                    out = self._compute(self.lw, li, backward, x, ei, w, nt, g_up)
            del g_up, ei, w
            if backward:
                c.vertex_layer_recomputations += nt
            else:
                c.vertex_layer_computations += nt
            groups = []
            with self._bookkeeping():
                if caching:
                    keys = self._keys(in_aid, in_rows, in_gids, k, chunk)
                    cache.set_keys(slots[hit], keys[hit])
                    miss = ~hit
                    groups.append(Candidates(
                        in_aid, in_rows[miss], keys[miss], False,
                        None if x is None else x[self._to_dev(miss)],
                        self.degree[in_gids[miss]]))
            del x
            if backward and gx_aid is not None:
                self._accumulate(gx_aid, in_rows, in_gids, out, k, chunk, groups)
            elif not backward:
                if out_to_host or not caching:
                    self._write_host(out_aid, out_rows, out)
                else:
                    with self._bookkeeping():
                        keys = self._keys(out_aid, out_rows, out_gids, k, None)
                    groups.append(Candidates(out_aid, out_rows, keys, True, out,
                                             self.degree[out_gids]))
            if groups:
                masks = cache.insert(groups, self._writeback)
                last = groups[-1]
                if last.dirty:
                    m = ~masks[-1]
                    self._write_host(last.aid, last.rows[m], None if last.values is None
                                     else last.values[self._to_dev(m)])

    def _accumulate(self, aid, rows, gids, gx, k, chunk, groups) -> None:
        cache = self.cache
        if cache.num_slots == 0:
            self._write_host(aid, rows, gx)
            return
        with self._bookkeeping():
            slots = cache.lookup(aid, rows)
            res = slots >= 0
            keys = self._keys(aid, rows, gids, k, chunk)
            cache.set_keys(slots[res], keys[res])
            miss = ~res
        if res.any():
            cache.add_(slots[res], None if gx is None else gx[self._to_dev(res)])
        groups.append(Candidates(aid, rows[miss], keys[miss], True,
                                 None if gx is None else gx[self._to_dev(miss)],
                                 self.degree[gids[miss]]))

    def _read_grad(self, aid: int, rows: Tensor, host_only: bool):
        c, w = self.counters, self._width(aid)
        if host_only or self.cache.num_slots == 0:
            c.cache_misses += rows.numel()
            c.h2d_bytes += rows.numel() * self._rowbytes(aid)
            if self.virtual:
                return None
            return self._to_dev(self.host.gather(self._name(aid), rows))
        with self._bookkeeping():
            slots = self.cache.lookup(aid, rows)
            hit = slots >= 0
            from_host = ~hit | self._partial[aid][rows]
            hit_pos = torch.nonzero(hit).flatten()
            host_pos = torch.nonzero(from_host).flatten()
        c.cache_hits += hit_pos.numel()
        c.cache_misses += rows.numel() - hit_pos.numel()
        c.h2d_bytes += host_pos.numel() * self._rowbytes(aid)
        vals = None
        if not self.virtual:
            vals = torch.zeros(rows.numel(), w, dtype=self.dtype, device=self.device)
            if hit_pos.numel():
                vals.index_copy_(0, self._to_dev(hit_pos), self.cache.read(
                    self._to_dev(slots[hit_pos]))[:, :w])
            if host_pos.numel():
                vals.index_add_(0, self._to_dev(host_pos), self._to_dev(
                    self.host.gather(self._name(aid), rows[host_pos])))
        with self._bookkeeping():
            self.cache.drop(aid, rows)
        return vals

