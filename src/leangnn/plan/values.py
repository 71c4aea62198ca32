"""The dry run's ops on real tensors, computed once per trace.

A dry run computes for real the ops whose operands are all real: the graph's
tensors and what is made from them alone (PyG's ``gcn_norm``: self-loops,
degrees, edge weights; GAT's removal and addition of self-loops). A model
repeats that work in every layer, as its real step does: the three
``gcn_norm`` calls of a GCN-3 dry run on itc99/b19 are 60% of it. Such an
op's values are a function of its operands' values alone (random ops aside),
so :class:`ValueMemo` names every real tensor by a *value token*: a tensor
the trace did not make (the graph's own) by its identity and version, held
for the trace so no other tensor can take its identity; an op's output by
the op, its other arguments and its operands' tokens. An op seen before on
the same tokens gets a copy of its first outputs: new storages of the same
layout, made outside the tracker, which then counts them as the op's own
outputs (bytes, lifetime, heap block), so nothing else in the trace changes
(tested: traces with and without the memo are equal).

Not memoised: ops that write an operand (they run; the operand written gets
the token of the op on its operands before), random ops, outputs that alias
an input (views run, at no cost, and take the token of their op) and outputs
whose storage is larger than their layout needs. The bytes kept are capped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["ValueMemo", "fresh", "writes", "changes", "owns_storage"]

_STRIDED = torch.strided
# func -> whether its values follow from its arguments (not random, no
# in-place change of an operand's metadata)
_PURE: dict = {}
# func -> whether its outputs are fresh storages (no alias in its schema)
_FRESH: dict = {}
_WRITES: dict = {}  # func -> whether it writes an argument's values
_WRITTEN: dict = {}  # func -> (position, name) of the arguments it changes


def _pure(func) -> bool:
    ok = _PURE.get(func)
    if ok is None:
        tags = func.tags
        ok = _PURE[func] = torch.Tag.nondeterministic_seeded not in tags and \
            torch.Tag.inplace_view not in tags
    return ok


def _changed(func) -> list[tuple[int, str]]:
    """``(position, name)`` of the arguments the aten op changes in place:
    their values, or their metadata alone (``t_``, ``unsqueeze_``)."""
    where = _WRITTEN.get(func)
    if where is None:
        where = _WRITTEN[func] = [
            (i, a.name) for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]
    return where


def changes(func) -> bool:
    """Whether the aten op changes an argument in place (values or
    metadata)."""
    return bool(_changed(func))


def writes(func) -> bool:
    """Whether the aten op writes to an argument (in place, ``out=``); not
    the views that only change metadata (``transpose_``, ``detach_``)."""
    ok = _WRITES.get(func)
    if ok is None:
        ok = _WRITES[func] = torch.Tag.inplace_view not in func.tags and \
            bool(_changed(func))
    return ok


def owns_storage(t: Tensor, given: set[int]) -> bool:
    """Whether ``t`` sits alone on a storage of its own that
    ``empty_strided`` would rebuild: no offset, not a view, not the storage
    of one of ``given`` (storage keys, ``untyped_storage()._cdata``), and
    exactly the bytes its layout needs."""
    st = t.untyped_storage()
    return not (t.storage_offset() or t._is_view() or st._cdata in given) and \
        st.nbytes() == _minimal_bytes(t)


def fresh(func) -> bool:
    """Whether the aten op returns fresh tensors (its schema aliases no
    argument and no output, and every output is one tensor)."""
    ok = _FRESH.get(func)
    if ok is None:
        s = func._schema
        ok = _FRESH[func] = bool(s.returns) and all(
            r.alias_info is None and str(r.type) == "Tensor" for r in s.returns) \
            and not any(a.alias_info is not None for a in s.arguments)
    return ok


class ValueMemo:
    """Outputs of ops on real tensors by their operands' value tokens.

    An output is kept by reference (its storage held, no copy; the tracker
    counts tensor objects, not storages) and a repeat of its op gets a new
    storage on the same memory (``torch.from_numpy``), or a copy where that
    cannot be. Before an op writes a kept storage, the memo takes a private
    copy of it, and that op's later repeats get copies; a write to memory
    already shared with a repeat sets :attr:`conflict` (the caller traces
    again without the memo).

    Args:
        max_bytes (int, optional): bytes of outputs kept; an op past it runs
            again. (default: ``256 MiB``)
        min_numel (int, optional): an op whose tensor operands are all
            smaller and unnamed runs each time, unnamed (its bookkeeping
            would cost more than the op: Adam's step counters; an op on the
            small output of a named op is named). (default: ``4096``)

    Attributes:
        hits (int): ops answered from the memo.
        bytes (int): bytes of the outputs kept.
        conflict (bool): a write reached memory shared with a repeat.
    """

    def __init__(self, max_bytes: int = 256 << 20, min_numel: int = 4096):
        self.max_bytes, self.min_numel = max_bytes, min_numel
        self.bytes = self.hits = 0
        self.conflict = False
        self._tags = WeakIdKeyDictionary()  # tensor -> (token, its version then)
        self._bases: dict[tuple, int] = {}  # identity of a given tensor -> token
        self._held: list[Tensor] = []  # the given tensors named by identity
        self._ops: dict[tuple, int] = {}  # op key -> token of its outputs
        # op key -> [single output, outputs kept, repeats sharing them, private]
        self._values: dict[tuple, list] = {}
        self._kept: dict[int, tuple] = {}  # data pointer of a kept storage -> key

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(ops={len(self._ops)}, hits={self.hits}, "
                f"bytes={self.bytes})")

    def key(self, func, args, kwargs, given: Callable[[Tensor], bool],
            tensors: list[Tensor] = ()) -> tuple | None:
        """The op's key, or ``None`` if it has none (a random op, an
        operand without a token, operands ``tensors`` all unnamed and
        smaller than :attr:`min_numel`). ``given(t)``: whether the real
        tensor ``t`` was not made in the trace (the tracker does not count
        it)."""
        if not _pure(func) or tensors and all(
                t.numel() < self.min_numel and t not in self._tags
                for t in tensors):
            return None
        try:
            return (func, self._sig(args, given),
                    self._sig(tuple(kwargs.items()), given) if kwargs else (),
                    torch.get_default_dtype())  # (factory ops without a dtype)
        except TypeError:
            return None

    def _sig(self, x, given):
        if isinstance(x, Tensor):
            return self._token(x, given)
        if isinstance(x, (list, tuple)):
            return (type(x), tuple(self._sig(v, given) for v in x))
        if isinstance(x, float):
            return (float, repr(x))  # (-0.0 == 0.0, nan != nan)
        hash(x)  # (TypeError: no key)
        return (type(x), x)  # 1, 1.0 and True hash alike, promote differently

    def _token(self, t: Tensor, given) -> int:
        tag = self._tags.get(t)
        if tag is not None:
            if tag[1] is None:  # written by a named op: its version is now
                self._tags[t] = tag = (tag[0], t._version)
            if tag[1] == t._version:
                return tag[0]
        if t.is_meta or t.layout != _STRIDED or not given(t):
            raise TypeError
        ident = ("given", id(t), t._version, t.dtype, t.device, tuple(t.shape),
                 t.stride(), t.storage_offset())
        tok = self._bases.get(ident)
        if tok is None:
            tok = self._bases[ident] = -len(self._bases) - 1
            self._held.append(t)  # (its id cannot be another tensor's)
        return tok

    def get(self, key: tuple):
        """The outputs the op of ``key`` gave first, on new storages, or
        ``None``."""
        ent = self._values.get(key)
        if ent is None:
            return None
        single, kept, _, private = ent
        with _disable_current_modes():
            outs = [_copy(t) if private else _share(t) for t in kept]
        if not private:
            ent[2] += 1
        self._tag(self._ops[key], outs)
        self.hits += 1
        return outs[0] if single else tuple(outs)

    def put(self, key: tuple, func, out, inputs: list[Tensor],
            is_fake: Callable[[Tensor], bool]) -> None:
        """Name the outputs ``out`` of the op of ``key`` (on the tensors
        ``inputs``) and keep fresh ones; nothing where an output has no
        values (``is_fake``)."""
        single = isinstance(out, Tensor)
        outs = [out] if single else list(out) if isinstance(out, (tuple, list)) \
            else None
        if not outs or not all(isinstance(t, Tensor) and not is_fake(t) and
                               t.layout == _STRIDED for t in outs):
            return
        tok = self._ops.get(key)
        if tok is None:
            tok = self._ops[key] = len(self._ops) + 1
        self._tag(tok, outs)
        if key in self._values or not fresh(func):
            return
        given = {t.untyped_storage()._cdata for t in inputs}
        size, ptrs = 0, []
        for t in outs:
            if not owns_storage(t, given):
                return  # (a new storage would not be the output's)
            given.add(t.untyped_storage()._cdata)  # (two outputs, one storage)
            size += t.untyped_storage().nbytes()
            ptrs.append(t.untyped_storage().data_ptr())
        if self.bytes + size > self.max_bytes:
            return
        with _disable_current_modes():
            kept = [torch.ops.aten.alias.default(t) for t in outs]
        self._values[key] = [single, kept, 0, False]
        self._kept.update((p, key) for p in ptrs if p)
        self.bytes += size

    def writing(self, func, args, kwargs) -> None:
        """Before ``func`` writes its operands: a kept output it writes gets
        a private copy first (memory also shared with a repeat: a
        :attr:`conflict`)."""
        if not self._kept:
            return
        for t in _written(func, args, kwargs):
            key = self._kept.pop(t.untyped_storage().data_ptr(), None)
            if key is None:
                continue
            ent = self._values[key]
            if ent[2]:
                self.conflict = True
            with _disable_current_modes():
                ent[1] = [_copy(k) for k in ent[1]]
            ent[3] = True
            for k in ent[1]:  # (the other outputs' pointers)
                self._kept.pop(k.untyped_storage().data_ptr(), None)

    def wrote(self, key: tuple | None, func, args, kwargs) -> None:
        """Name the operands the op of ``key`` has just changed: their values
        are its values on the operands before (``key=None``: unnamed, e.g.
        a metadata-only view such as ``t_``).

        Their version counters move after the op returns (autograd's
        in-place layer sits above the dispatch mode), so the name takes the
        version it finds at its next use; a base whose view was written is
        unnamed (their counter is shared).
        """
        for i, t in _written(func, args, kwargs, with_index=True):
            if not self._tags:
                return
            if t._base is not None:
                self._tags.pop(t._base, None)
            if key is None:
                self._tags.pop(t, None)
            else:
                self._tags[t] = ((("wrote", key), i), None)

    def _tag(self, tok: int, outs: list[Tensor]) -> None:
        for i, t in enumerate(outs):
            self._tags[t] = ((tok, i), t._version)

    def clear(self) -> None:
        """Drop every token and output kept (and the given tensors held);
        :attr:`conflict` stays."""
        self._tags = WeakIdKeyDictionary()
        self._bases.clear()
        self._held.clear()
        self._ops.clear()
        self._values.clear()
        self._kept.clear()
        self.bytes = 0


def _written(func, args, kwargs, with_index: bool = False) -> list:
    out = []
    for i, name in _changed(func):
        t = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(t, Tensor):
            out.append((i, t) if with_index else t)
    return out



def _copy(t: Tensor) -> Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                               device=t.device).copy_(t)


def _share(t: Tensor) -> Tensor:
    """A tensor on a new storage over ``t``'s memory (a copy where numpy
    cannot hold the dtype or device)."""
    try:
        o = torch.from_numpy(t.numpy())
    except (TypeError, RuntimeError):
        return _copy(t)
    if o.stride() != t.stride() or \
            o.untyped_storage().nbytes() != t.untyped_storage().nbytes():
        return _copy(t)
    return o


def _minimal_bytes(t: Tensor) -> int:
    if not t.numel():
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * \
        t.element_size()
