"""Device cache for offloaded training: a byte-budgeted slot pool and its policies.

The cache keeps rows of host arrays (features, embeddings, gradient partial
sums) on the device between the chunk jobs of a layer-wise schedule. Every
cached row has a *keep key*; when a job brings more rows than there are free
slots, the rows with the smallest keys (resident or incoming) lose: resident
ones are evicted (written back when dirty), incoming ones bypass the cache.
The policy is nothing but the key:

* ``none``: no cache at all (every read goes to the host);
* ``lru``: the access clock, so the pool always holds the most recently used
  rows (exact LRU);
* ``degree``: PaGraph's static rule (Lin et al., SoCC 2020): out-degree, with
  rows of arrays that the current sweep does not touch demoted;
* ``st``: NeutronJittor's spatial-temporal priority (Fundamental Research
  2026): the *temporal* distance to the row's next use in the known schedule
  first (Belady's MIN, so the row needed furthest in the future goes), then
  the *structural* priority: remaining jobs that need the row, then degree;
* ``auto`` (the engine's default) picks one of those by the device
  (:func:`resolve_policy`): ``st`` where host and device are two memories
  (CUDA: a cached row saves a PCIe transfer), ``none`` where the "device" is
  the host itself (CPU: a transfer is a memcpy, so a cache would trade its
  bookkeeping and half the budget's workspace for nothing).

Metadata lives in host tensors and every operation is vectorised over the
rows of a job, so a step costs ``O(rows + slots)`` regardless of the policy.
The pool is sized by the smaller of its byte budget and the rows that can
ever be resident at once, and allocated on first use: a cache that only
counts (or a huge budget on a tiny graph) holds next to nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["POLICIES", "RULES", "DeviceCache", "Candidates", "st_keys", "INF_STEP",
           "resolve_policy"]

#: the cache rules a :class:`DeviceCache` runs
RULES = ("none", "lru", "degree", "st")
#: what a user may ask for: a rule, or ``auto`` (chosen by the device)
POLICIES = (*RULES, "auto")
#: "never used again" in schedule steps (far above any real step index)
INF_STEP = (1 << 36) - 1
_CAP = (1 << 13) - 1
#: key of a free slot (no policy's key reaches it)
_FREE_KEY = torch.iinfo(torch.long).max


def resolve_policy(policy: str, device: torch.device | str,
                   exact: bool = True) -> str:
    """The rule that ``policy`` names on ``device`` (``auto`` resolved).

    ``auto`` is ``none`` on a CPU "device": host store and pool are one
    memory, so a hit saves only a memcpy, while the cache costs its
    bookkeeping per job and the share of the budget the jobs would otherwise
    get (benchmarks/offload.py, 50k-node power-law graph at 25% of the need,
    CPU: ``st`` 4.9x PyG full batch with twice the jobs, ``none`` 1.5x). On
    any other device it is ``st`` (within 1.01x of Belady's MIN traffic,
    benchmarks/offload_cache.py), or ``lru`` for the recompute baseline
    (``exact=False``), which has no next-use information.

    Args:
        policy (str): one of :data:`POLICIES`.
        device (torch.device or str): the engine's device.
        exact (bool, optional): the engine runs the exact schedule.
            (default: ``True``)
    """
    if policy not in POLICIES:
        raise ValueError(f"cache policy must be one of {POLICIES}, got {policy!r}")
    if policy != "auto":
        return policy
    if torch.device(device).type == "cpu":
        return "none"
    return "st" if exact else "lru"


def st_keys(next_use: Tensor, remaining: Tensor, degree: Tensor) -> Tensor:
    """Keep keys of the ``st`` policy (larger = keep).

    Temporal priority dominates: a row whose next use is sooner always beats
    one used later (Belady). Among rows next needed by the same job, the one
    more remaining jobs need wins, then the one of higher degree.

    Args:
        next_use (Tensor): next schedule step that reads the row
            (:data:`INF_STEP` when none).
        remaining (Tensor): remaining jobs that need the row.
        degree (Tensor): the node's degree.
    """
    temporal = (INF_STEP - next_use.clamp(max=INF_STEP)) << 26
    structural = remaining.clamp(0, _CAP) << 13
    return temporal | structural | degree.clamp(0, _CAP)


@dataclass
class Candidates:
    """Rows a job offers to the cache: ``rows`` of array ``aid``.

    ``values`` (on the device) are written into the slots the rows win;
    ``dirty`` rows hold data the host does not have yet.
    """

    aid: int
    rows: Tensor
    keys: Tensor
    dirty: bool
    values: Tensor | None = None
    aux: Tensor | None = None


class DeviceCache:
    """A pool of ``num_slots`` rows of ``width`` elements on ``device``.

    The pool tensor is allocated by :meth:`allocate` or on the first write of
    values; until then (and forever when only keys are tracked, as in the
    engine's counting mode) :attr:`pool` is ``None``.

    Args:
        capacity_bytes (int): bytes the pool may occupy.
        width (int): slot width in elements (the widest cached array; narrower
            rows occupy a full slot).
        dtype (torch.dtype): element type.
        device (torch.device or str): where the pool lives.
        policy (str, optional): one of :data:`POLICIES` (``auto`` is resolved
            for ``device``, :func:`resolve_policy`). (default: ``"st"``)
        max_slots (int, optional): rows that can ever be resident at once;
            slots beyond it would never be used, so they are not reserved.
            (default: ``None``, no cap)
    """

    def __init__(self, capacity_bytes: int, width: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", policy: str = "st",
                 max_slots: int | None = None):
        policy = resolve_policy(policy, device)
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.policy = policy
        self.width = width
        self.dtype = dtype
        self.device = torch.device(device)
        self.slot_bytes = width * torch.empty((), dtype=dtype).element_size()
        n = 0 if policy == "none" else int(capacity_bytes // self.slot_bytes)
        if max_slots is not None:
            n = min(n, max(0, int(max_slots)))
        self.num_slots = n
        self.pool: Tensor | None = None
        self.owner = torch.full((n,), -1, dtype=torch.long)
        self.row = torch.zeros(n, dtype=torch.long)
        # free slots hold _FREE_KEY, above every real key: the smallest
        # resident keys are then found without listing the occupied slots
        self.key = torch.full((n,), _FREE_KEY, dtype=torch.long)
        self.aux = torch.zeros(n, dtype=torch.long)
        self.dirty = torch.zeros(n, dtype=torch.bool)
        self.slot_of: dict[int, Tensor] = {}
        self.used = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the pool (reserved once, whatever is resident)."""
        return self.num_slots * self.slot_bytes

    def allocate(self) -> Tensor | None:
        """Allocate the pool now (idempotent; ``None`` when there are no slots)."""
        if self.pool is None and self.num_slots > 0:
            self.pool = torch.empty(self.num_slots, self.width, dtype=self.dtype,
                                    device=self.device)
        return self.pool

    def slot_meta_bytes(self) -> int:
        """Host bytes of the per-slot metadata (grows with the pool)."""
        meta = (self.owner, self.row, self.key, self.aux, self.dirty)
        return sum(t.numel() * t.element_size() for t in meta)

    def meta_bytes(self) -> int:
        """Host bytes of the slot metadata and the per-array row maps."""
        return self.slot_meta_bytes() + sum(
            t.numel() * t.element_size() for t in self.slot_of.values())

    def register(self, aid: int, num_rows: int) -> None:
        self.slot_of[aid] = torch.full((num_rows,), -1, dtype=torch.long)

    def lookup(self, aid: int, rows: Tensor) -> Tensor:
        """Slot of each row (``-1``: not resident)."""
        return self.slot_of[aid][rows]

    def set_keys(self, slots: Tensor, keys: Tensor) -> None:
        self.key[slots] = keys

    def read(self, slots: Tensor) -> Tensor | None:
        if self.pool is None:
            return None
        return self.pool.index_select(0, slots.to(self.device, non_blocking=True))

    def add_(self, slots: Tensor, values: Tensor | None) -> None:
        """Accumulate ``values`` into resident rows (gradient partial sums)."""
        if values is not None:
            self.allocate()
            self.pool[:, : values.size(1)].index_add_(
                0, slots.to(self.device, non_blocking=True), values)
        self.dirty[slots.cpu()] = True

    def resident(self, aid: int | None = None) -> Tensor:
        """Occupied slots (of array ``aid``)."""
        if aid is None:
            return torch.nonzero(self.owner >= 0).flatten()
        return torch.nonzero(self.owner == aid).flatten()

    def drop(self, aid: int, rows: Tensor | None = None) -> None:
        """Forget rows (all of array ``aid`` when ``rows`` is None), no write-back."""
        if aid not in self.slot_of:
            return
        s = self.slot_of[aid] if rows is None else self.slot_of[aid][rows]
        s = s[s >= 0]
        self._free(s, aid)

    def unregister(self, aid: int) -> None:
        self.drop(aid)
        self.slot_of.pop(aid, None)

    def _free(self, slots: Tensor, aid: int | None = None) -> None:
        """Free occupied ``slots`` (all of array ``aid``'s when given)."""
        if slots.numel() == 0:
            return
        rows = self.row[slots]
        if aid is not None:
            self.slot_of[aid][rows] = -1
        else:
            owners = self.owner[slots]
            for a in _present(owners):
                m = owners == a
                self.slot_of[a][rows[m]] = -1
        self.owner[slots] = -1
        self.key[slots] = _FREE_KEY
        self.dirty[slots] = False
        self.used -= slots.numel()

    def rekey(self, fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]) -> None:
        """Recompute the keys of all resident rows: ``fn(owner, row, aux, key)``."""
        s = self.resident()
        if s.numel():
            self.key[s] = fn(self.owner[s], self.row[s], self.aux[s], self.key[s])

    def insert(self, groups: Sequence[Candidates],
               writeback: Callable[[int, Tensor, Tensor], None]) -> list[Tensor]:
        """Offer rows to the cache; evict the lowest keys when it is full.

        Ties go against incoming rows first (no churn for equal keys), then
        against lower slot/candidate positions, so the result is deterministic.

        Args:
            groups: candidate rows per array (no row may already be resident).
            writeback: ``writeback(aid, rows, slots)`` is called for evicted
                dirty rows *before* their slots are reused.

        Returns:
            Per group, a bool mask of the rows that were admitted.
        """
        if self.num_slots == 0 or not any(g.rows.numel() for g in groups):
            return [torch.zeros(g.rows.numel(), dtype=torch.bool) for g in groups]
        keys = (torch.cat([g.keys for g in groups]) if len(groups) > 1
                else groups[0].keys)
        n = keys.numel()
        free_n = self.num_slots - self.used
        admitted = None
        if n > free_n:
            # The rejected rows are the ``need`` smallest (key, position) of
            # candidates then resident slots in slot order. The need-th
            # smallest candidate key bounds them, so only residents at or
            # below it take part (same result; no listing of occupied slots).
            need = n - free_n
            thr = keys.min() if need == 1 else torch.kthvalue(keys, need).values
            low = torch.nonzero(self.key <= thr).flatten()
            if low.numel():
                reject = _smallest(torch.cat([keys, self.key[low]]), need)
                victims = low[reject[reject >= n] - n]
                reject = reject[reject < n]
            else:
                reject, victims = _smallest(keys, need), low
            admitted = torch.ones(n, dtype=torch.bool)
            admitted[reject] = False
            if victims.numel():
                dirty = victims[self.dirty[victims]]
                owners = self.owner[dirty]
                for a in _present(owners):
                    vs = dirty[owners == a]
                    writeback(a, self.row[vs], vs)
                self._free(victims)
        n_in = n if admitted is None else int(admitted.sum())
        if n_in == 0:
            return [admitted[:0].new_zeros(g.rows.numel()) for g in groups]
        free = (torch.arange(n_in) if self.used == 0
                else torch.nonzero(self.owner < 0).flatten()[:n_in])
        masks, off, used = [], 0, 0
        for g in groups:
            r = g.rows.numel()
            if admitted is None:
                m = torch.ones(r, dtype=torch.bool)
                pos = None  # every row of the group
                k = r
            else:
                m = admitted[off: off + r]
                pos = torch.nonzero(m).flatten()
                k = pos.numel()
            off += r
            masks.append(m)
            if k == 0:
                continue
            slots = free[used: used + k]
            used += k
            rows = g.rows if pos is None else g.rows[pos]
            slot_of = self.slot_of[g.aid]
            if (slot_of[rows] >= 0).any():
                raise RuntimeError("DeviceCache.insert: row is already resident")
            slot_of[rows] = slots
            self.owner[slots] = g.aid
            self.row[slots] = rows
            self.key[slots] = g.keys if pos is None else g.keys[pos]
            self.dirty[slots] = g.dirty
            if g.aux is not None:
                self.aux[slots] = g.aux if pos is None else g.aux[pos]
            if g.values is not None:
                self.allocate()
                vals = (g.values if pos is None
                        else g.values.index_select(0, pos.to(g.values.device)))
                dst = (self.pool if vals.size(1) == self.width
                       else self.pool[:, : vals.size(1)])
                dst.index_copy_(0, slots.to(self.device), vals)
        self.used += n_in
        return masks

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(policy={self.policy}, "
                f"num_slots={self.num_slots}, slot_bytes={self.slot_bytes})")


def _present(owners: Tensor) -> list[int]:
    """Distinct array ids among ``owners`` (>= 0), ascending: a count per id
    (a handful of arrays) instead of sorting every slot's owner."""
    if owners.numel() == 0:
        return []
    return torch.nonzero(torch.bincount(owners)).flatten().tolist()


def _smallest(keys: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` smallest keys; ties resolved by lower index."""
    if k >= keys.numel():
        return torch.arange(keys.numel())
    thr = torch.kthvalue(keys, k).values
    less = torch.nonzero(keys < thr).flatten()
    eq = torch.nonzero(keys == thr).flatten()[: k - less.numel()]
    return torch.cat([less, eq])
