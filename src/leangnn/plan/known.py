"""The dry run's memo of real ops on the graph: computed once per plan.

A dry run (:mod:`leangnn.plan.fake`, :mod:`leangnn.plan.meta`) computes for
real what depends on the graph alone: GCN's normalisation (self-loops,
degrees), the CSR kernels' sorts, index masks. A model recomputes these per
layer and per pass (PyG's ``GCNConv`` without ``cached`` once per layer, a
reversible stack's CSR graph once in the forward and again in the backward)
and a plan traces the same graph for many candidates and depths: measured,
these repeats were 40-85% of an estimate's time (itc99/b19 GCN-3,
csbm:100000 GSR-4).

:class:`KnownMemo` runs each such op once. An op's key is the op and its
arguments, with each tensor replaced by a token: a tensor the memo made (or
tagged as a view of one) carries the key that made it, any other tensor a
fresh number tied to the object and its version counter (an in-place change
or a new object gets a new token, so a stale result never matches). On a
repeat the memo returns copies of the stored outputs, with their strides:
the tracker then counts a fresh output of the same size as the real op's,
so a trace is the same with the memo on or off (tested model by model; off:
``trace_step(..., reuse_known=False)``).

Not memoised: random ops, ops that mutate or alias (views are tagged so a
chain through them still matches), outputs that are not dense strided
tensors; results beyond ``max_bytes`` are recomputed, not stored.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["KnownMemo", "known_memo", "current_memo", "fresh_op"]

# func -> whether its outputs are fresh tensors (no alias, no mutation)
_FRESH: dict = {}
_ACTIVE: list[KnownMemo] = []


def fresh_op(func) -> bool:
    """Whether every output of the aten op ``func`` is a fresh tensor: no
    argument aliased or mutated, every return a plain ``Tensor``."""
    ok = _FRESH.get(func)
    if ok is None:
        s = func._schema
        ok = bool(s.returns) and all(
            r.alias_info is None and str(r.type) == "Tensor" for r in s.returns) and \
            not any(a.alias_info is not None for a in s.arguments)
        _FRESH[func] = ok
    return ok


def _inplace(func) -> bool:
    # ``self`` changed and returned, nothing else written (``add_``)
    s = func._schema
    w = [a for a in s.arguments if a.alias_info is not None and a.alias_info.is_write]
    return len(s.returns) == 1 and len(w) == 1 and w[0] is s.arguments[0] and \
        s.returns[0].alias_info is not None and str(s.returns[0].type) == "Tensor"


def _aliasing(func) -> bool:
    # a view op: outputs alias an argument that nothing mutates
    s = func._schema
    return any(r.alias_info is not None for r in s.returns) and not any(
        a.alias_info is not None and a.alias_info.is_write for a in s.arguments)


class KnownMemo:
    r"""Outputs of real aten ops on real tensors, by op and arguments.

    Args:
        max_bytes (int, optional): bytes of stored outputs at most; beyond,
            results are computed and not stored. (default: ``256 MiB``)

    Attributes:
        hits (int), misses (int): ops answered from the memo / computed
            (views are computed: they allocate nothing).
        bytes (int): bytes stored.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.hits = self.misses = self.bytes = 0
        self._tokens: dict[int, tuple] = {}  # id -> (ref, version, token)
        # op key -> its number (the token of its outputs: a key holds its
        # operands' tokens, not their keys, so a chain of ops hashes flat)
        self._keys: dict[tuple, int] = {}
        self._outs: dict[int, list[Tensor]] = {}  # number -> stored outputs
        self._count = 0

    @property
    def entries(self) -> int:
        """Ops whose outputs are stored."""
        return len(self._outs)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(entries={self.entries}, "
                f"bytes={self.bytes}, hits={self.hits}, misses={self.misses})")

    def _new(self) -> int:
        self._count += 1
        return self._count

    def _token(self, t: Tensor) -> int | tuple:
        ent = self._tokens.get(id(t))
        if ent is not None and ent[0]() is t and ent[1] == t._version:
            return ent[2]
        tok = self._new()
        self._tag(t, tok)
        return tok

    def _tag(self, t: Tensor, tok, bump: int = 0) -> None:
        if len(self._tokens) >= 1 << 14:  # forget the tensors that died
            self._tokens = {k: v for k, v in self._tokens.items()
                            if v[0]() is not None}
        self._tokens[id(t)] = (weakref.ref(t), t._version + bump, tok)

    def _desc(self, x):
        if isinstance(x, Tensor):
            if x.layout != torch.strided:
                raise TypeError  # (sparse: no storage to version)
            return ("T", self._token(x), tuple(x.shape), x.stride(),
                    x.storage_offset(), x.dtype, x.device)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, *(self._desc(v) for v in x))
        if isinstance(x, float):
            return ("f", repr(x))  # -0.0 and nan are not 0.0 and nan
        hash(x)
        return (type(x).__name__, x)

    def call(self, func, args, kwargs):
        """``func(*args, **kwargs)``, from the memo where it has been run on
        the same tensors and arguments. Call with no dispatch mode active."""
        fresh, inplace = fresh_op(func), _inplace(func)
        if torch.Tag.nondeterministic_seeded in func.tags or \
                not (fresh or inplace or _aliasing(func)):
            # random, or mutating another way (``out=``): run; a changed
            # operand gets a new token
            return func(*args, **kwargs)
        try:
            key = (func, self._desc(args), tuple(
                (k, self._desc(v)) for k, v in sorted(kwargs.items())))
        except TypeError:  # an unhashable argument or a sparse tensor
            return func(*args, **kwargs)
        num = self._keys.get(key)
        stored = self._outs.get(num) if num is not None else None
        if stored is not None:
            self.hits += 1
            if inplace:  # the operand as the op leaves it
                out = args[0].copy_(stored[0])
            else:
                outs = tuple(_copy(s) for s in stored)
                out = outs if len(func._schema.returns) > 1 else outs[0]
        else:
            self.misses += 1
            out = func(*args, **kwargs)
            if num is None:
                num = self._keys[key] = self._new()
            if fresh or inplace:
                self._store(num, out)
        # An in-place op's version counter goes up once more when this call
        # returns (autograd's ADInplaceOrView kernel sits above the modes)
        bump = int(inplace)
        for i, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, Tensor) and t.layout == torch.strided:
                self._tag(t, (num, i), bump)
        return out

    def _store(self, num: int, out) -> None:
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(isinstance(t, Tensor) and t.layout == torch.strided and
                   not t.requires_grad for t in outs):
            return
        size = sum(t.untyped_storage().nbytes() for t in outs)
        if self.bytes + size > self.max_bytes:
            return
        # copies: the caller may change its outputs in place (``deg.pow_``)
        try:
            copies = [_copy(t) for t in outs]
        except RuntimeError:  # overlapping strides (an expanded output)
            return
        if any(c.untyped_storage().nbytes() != t.untyped_storage().nbytes()
               or t.storage_offset() for c, t in zip(copies, outs, strict=True)):
            return  # a copy would not count the bytes the op allocates
        self.bytes += size
        self._outs[num] = copies


def _copy(t: Tensor) -> Tensor:
    """A copy of ``t`` with its strides (``clone`` makes some contiguous)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                               device=t.device).copy_(t)


def current_memo() -> KnownMemo | None:
    """The memo of the innermost :func:`known_memo` block, or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def known_memo(max_bytes: int = 256 << 20) -> Iterator[KnownMemo]:
    """One :class:`KnownMemo` for every dry run inside (a plan's candidates
    and depths); inside another block, that block's memo."""
    if _ACTIVE:
        yield _ACTIVE[-1]
        return
    memo = KnownMemo(max_bytes)
    _ACTIVE.append(memo)
    try:
        yield memo
    finally:
        _ACTIVE.remove(memo)
