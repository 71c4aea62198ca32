"""Training steps under fake tensors: tensor bytes and work, with nothing allocated.

The dry run of the planner. PyTorch's ``FakeTensorMode`` runs every op on
shapes only; :class:`FakeTracker`, a ``TorchDispatchMode`` stacked on it,
counts the bytes of the fake storages alive at every moment (allocated when an
op returns a new storage, released by a ``weakref`` finalizer when the last
tensor object on it dies, each storage once however many views share it), the
peak per phase (forward, backward, optimizer), and the work (ops, bytes
written, matmul FLOPs) the time estimate is fitted on. Buffers that kernels
allocate internally (no mode sees them) are added where they are known and
measured: the index sort of CPU scatter-adds (:func:`_workspace`). The same
meter on real tensors is :class:`leangnn.profile.LiveBytesMeter`; the approach
is that of PyTorch's ``torch.distributed._tools.MemTracker`` under
``FakeTensorMode``.

Fake tensors have no values, so an op whose output *shape* depends on values
(``nonzero``, boolean masks: PyG's ``add_remaining_self_loops`` in
``GCNConv``/``GATConv``, a masked loss) cannot run on them. Graph structure is
cheap, though: the graph's tensors stay real, and so does every integer,
boolean or one-element tensor computed from real tensors alone (edge indices
with self loops, masks, counts, RNG seeds; up to ``concrete_limit`` elements),
so data-dependent shapes of the graph come out exact. Feature-sized
floating-point tensors are fake; an op whose shape depends on *their* values
raises :class:`UnsupportedOpError` (the estimator then falls back to an
analytic bound and says so). A sparse matrix whose values are fake (the
attention weights of :mod:`leangnn.nn.csr`'s GAT kernel) is a real matrix on
placeholder values that keeps the fake ones alive: fake mode cannot build it,
but multiplies it with fake operands.

:func:`leangnn.plan.dryrun.trace_step` runs a step under this tracker
(``backend="fake"``) or, on CPU by default, the same tracker on the meta
device (:mod:`leangnn.plan.meta`: the same trace, ~5x cheaper).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeCopyMode,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary
from torch_geometric.data import Data

from leangnn.plan.heapsim import HeapModel
from leangnn.plan.values import ValueMemo, changes
from leangnn.plan.values import writes as _writes

__all__ = ["FakeTracker", "StepTrace", "UnsupportedOpError", "fake_model",
           "tensor_bytes", "MAX_OPS", "TooManyOpsError",
           "COLD_BYTES"]

aten = torch.ops.aten
#: a step of more ops than this is traced no faster than it runs (~0.1-0.3 ms
#: per op on the meta device, ~1 ms in fake mode): a model that propagates
#: level by level over a deep circuit DAG. (Ops are the kernels: a fake
#: tensor's ``.device`` queries, once counted too, ~20-60% of the count,
#: are not.)
MAX_OPS = 10_000
_DATA_DEPENDENT = (DynamicOutputShapeException, DataDependentOutputException)
_DEVICE = torch.ops.prim.device.default


class UnsupportedOpError(RuntimeError):
    """An op whose output depends on values that the dry run does not have."""


class TooManyOpsError(UnsupportedOpError):
    """A step longer than the dry run's op limit (:data:`MAX_OPS`)."""


def _key(t: Tensor) -> int:
    return t.untyped_storage()._cdata


class FakeTracker(TorchDispatchMode):
    """Live bytes, per-phase peaks and work of the ops run inside it.

    Enter it inside ``fake_mode`` (``with fake_mode, FakeTracker(fake_mode):``).
    Tensors whose values are known stay *real*: the graph's tensors, and every
    integer, boolean or one-element output of an op whose inputs are all
    real (up to ``concrete_limit`` elements); the fake mode accepts them
    beside fake ones. So data-dependent shapes of the graph are exact, and a
    module-level cache filled during a dry run (e.g. a constant ``arange``)
    holds a real tensor, not a fake one that would poison later real runs.

    Args:
        fake_mode (FakeTensorMode): the mode the tensors are fake in (built
            with ``allow_non_fake_inputs=True``).
        concrete_limit (int, optional): largest tensor (elements) computed
            for real. (default: ``1 << 24``)
        round_to (int, optional): allocation granularity in bytes (512 for the
            CUDA caching allocator). (default: ``1``)
        plain (bool, optional): predict a run *without* any dispatch mode:
            add the known internal buffers of kernels (:func:`_workspace`) and
            count the backward's scatters into fresh zeros in place (autograd
            takes out-of-place variants whenever a Python mode is active, this
            one included). ``False`` counts exactly what
            :class:`~leangnn.profile.LiveBytesMeter`, itself a mode, sees.
            (default: ``True``)
        kernel_workspace (bool, optional): the kernels' internal buffers
            alone (default: ``plain``); ``plain=True, kernel_workspace=False``
            is what PyTorch's profiler sees of a plain run.
        heap_threshold (int, optional): allocations below this many bytes
            come from the C heap (glibc's mmap threshold), whose resident
            memory does not shrink when they are freed; the tracker records
            the frontier of (bytes on their own pages, heap high-water) that
            :mod:`leangnn.plan.calibration` turns into resident memory.
            (default: ``0``, no heap)
        max_ops (int, optional): raise :class:`UnsupportedOpError` after this
            many ops. (default: no limit)
        edge_dims (tuple, optional): the graph's edge counts (``E``, and
            ``E + N`` for the convs that add self-loops): heap blocks of
            tensors with a dimension of one of these sizes are counted apart
            (``edge_at_hw``). (default: none)
        heap_model (bool, optional): with a heap, also replay its blocks in
            :class:`~leangnn.plan.heapsim.HeapModel` and record the floor it
            gives the resident step (``False``: no floor). (default: ``True``)
        memo (bool, optional): compute an op on real tensors once per trace
            (:class:`~leangnn.plan.values.ValueMemo`: a repeat gets a copy of
            its first outputs; the trace is the same). ``False`` is its off
            switch. (default: ``True``)

    Attributes:
        live (int): bytes of tracked storages alive now.
        peak (int): highest ``live``.
        frontier (list): ``(big, heap)`` byte pairs, see ``heap_threshold``.
        floor (int): highest bytes on their own pages plus the heap model's
            extent (0 without a heap model).
        edge_at_hw (int): heap bytes of edge-sized tensors when the heap's
            high-water was last raised.
        phases (dict): phase name -> ``{"start", "peak", "end"}`` bytes.
        ops (int), written (int), flops (int): the work done.
    """

    def __init__(self, fake_mode: FakeTensorMode, concrete_limit: int = 1 << 24,
                 round_to: int = 1, plain: bool = True,
                 kernel_workspace: bool | None = None, heap_threshold: int = 0,
                 max_ops: int = 1 << 62, heap_model: bool = True,
                 edge_dims: tuple[int, ...] = (), memo: bool = True):
        super().__init__()
        self.values = ValueMemo() if memo else None
        self.heap_threshold, self.max_ops = heap_threshold, max_ops
        self.small_live = self.small_hw = self.floor = 0
        # heap bytes of edge-sized tensors (a dimension in ``edge_dims``),
        # live now and at the heap's high-water
        self.edge_dims = frozenset(d for d in edge_dims if d)
        self.edge_live = self.edge_at_hw = 0
        self.heap = HeapModel() if heap_model and heap_threshold else None
        self.frontier: list[tuple[int, int]] = []
        self.fake_mode, self.limit, self.round_to = fake_mode, concrete_limit, round_to
        self.plain = plain
        self.kernel_workspace = plain if kernel_workspace is None else kernel_workspace
        self.live = self.peak = 0
        self.ops = self.written = self.flops = self.sparse_flops = 0
        self.big_written = 0
        self.cold_written = 0
        # sizes of the storages behind ``cold_written``: an offloaded step
        # writes the same bytes in blocks a chunk count smaller
        self.cold_blocks: dict[int, int] = {}
        self.phases: dict[str, dict[str, int]] = {}
        self._phase: str | None = None
        # storage key -> [tensor objects alive, bytes, phase it was born in]
        self._refs: dict[int, list] = {}
        # an output counted as the in-place result of another storage
        self._alias: dict[int, int] = {}
        self._raw: dict[int, int] = {}  # tensor objects alive per aliased storage
        self._held: dict[int, object] = {}  # storages of aliased entries
        self._zeros: set[int] = set()  # storages born zero-filled
        # entries of the sparse matrices seen, by shape: the backward of a
        # sparse product may get a fake copy, which reports none
        self._nnz: dict[tuple, int] = {}
        # real sparse matrices standing in for ones with fake values (fake
        # mode cannot build those): matrix -> its fake values
        self._values = WeakIdKeyDictionary()
        self._blank: dict[tuple, Tensor] = {}  # real placeholder values

    # -------------------------------------------------------------- phases
    def phase(self, name: str) -> None:
        """Start phase ``name`` (ends the previous one)."""
        self._end_phase()
        self._phase = name
        self.phases[name] = {"start": self.live, "peak": self.live, "end": self.live}

    def _end_phase(self) -> None:
        if self._phase is not None:
            self.phases[self._phase]["end"] = self.live
        self._phase = None

    def finish(self) -> None:
        self._end_phase()

    def __exit__(self, *exc):
        # the memo's tensors go with the trace, a failed one's too
        if self.values is not None:
            self.values.clear()
        return super().__exit__(*exc)

    # ------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:
            # a fake tensor's ``.device`` is an op of its own; no kernel, no
            # op counted (a real or meta tensor answers it without one)
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        flat = _leaves((args, kwargs))
        known = not any(isinstance(t, FakeTensor) for t in flat)
        # Sparse tensors (e.g. a CSR adjacency) have no storage of their own;
        # their index and value tensors are counted where they were made.
        tensors = [t for t in flat if t.layout == torch.strided]
        if func is aten._local_scalar_dense.default:
            return self._scalar(tensors[0])
        if not known and func._overloadpacket in _SPARSE_CTORS:
            out = self._sparse_of_fake(func, args, kwargs)
            self._note(func, args, kwargs, tensors, out)
            return out
        if not known and func is aten.sparse_sampled_addmm.default and \
                not isinstance(args[0], FakeTensor):
            return self._sampled(func, args, kwargs, tensors)
        if func is aten.values.default and args[0] in self._values:
            # a view of the fake values (as the real op returns a view)
            values = self._values[args[0]]
            out = values.view(values.shape)
            self._note(func, args, kwargs, tensors, out)
            return out
        if known and "sparse" in func.__name__:
            # e.g. a CSR adjacency built from the graph: fake mode cannot
            # build sparse compressed tensors (it multiplies real ones fine)
            out = self._real(func, args, kwargs)
            self._note(func, args, kwargs, tensors, out)
            return out
        out = self._known(func, args, kwargs, tensors, kwargs) if known else \
            self._run(func, args, kwargs, False)
        self._note(func, args, kwargs, tensors, out)
        return out

    def _known(self, func, args, kwargs, tensors, rkwargs):
        """An op on real tensors alone (``rkwargs``: its arguments for a run
        on real tensors): a copy of its earlier output on the same values
        (:attr:`values`) or :meth:`_compute`."""
        memo = self.values
        if memo is None:
            return self._compute(func, args, kwargs, rkwargs)
        key = memo.key(func, args, kwargs, self._given, tensors)
        if changes(func):  # (for real, once; a metadata-only view unnames)
            if _writes(func):
                memo.writing(func, args, kwargs)
            out = self._compute(func, args, kwargs, rkwargs)
            memo.wrote(key, func, args, kwargs)
            return out
        if key is None:
            return self._compute(func, args, kwargs, rkwargs)
        out = memo.get(key)
        if out is None:
            out = self._compute(func, args, kwargs, rkwargs)
            memo.put(key, func, out, tensors, self._is_fake)
        return out

    def _given(self, t: Tensor) -> bool:
        """Whether the real tensor ``t`` was not made in the trace."""
        return not self._is_fake(t) and self._canon(_key(t)) not in self._refs

    def _compute(self, func, args, kwargs, rkwargs):
        return self._run(func, args, kwargs, True)

    def _run(self, func, args, kwargs, known: bool):
        """``func`` in the fake mode below; for real (``known``) inputs, for
        real where the output is small or fake mode cannot run it."""
        if known and _writes(func):
            # An op changing real tensors changes them for real, once. Run on
            # fake twins alone, foreach Adam's step counts (CUDA's default:
            # one in-place add, then .item()) stayed 0 and lr / (1 - beta1 **
            # 0) divided by zero; run in fake mode and then for real, an
            # arithmetic one was applied twice (fake mode's constant
            # propagation already runs ``add_`` on a real operand).
            return self._real(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except _DATA_DEPENDENT as e:
            _forget(e)
            out = self._data_dependent(func, args, kwargs, known)
        except AssertionError as e:
            _forget(e)
            # fake mode's copy of a real view of a sparse tensor's values
            # fails its own metadata check: give it a real copy instead
            out = self._real(func, args, kwargs) if known else \
                func(*_unviewed(args), **_unviewed(kwargs))
        except (RuntimeError, NotImplementedError) as e:
            if not known:
                raise
            _forget(e)
            out = self._real(func, args, kwargs)  # cheap: graph-sized
        else:
            if known and _wants_value(out, self.limit):
                out = self._real(func, args, kwargs)
        return out

    # ---------------------------------------------- what "fake" means here
    @staticmethod
    def _is_fake(t) -> bool:
        """Whether ``t`` has no values (a fake tensor here; a meta tensor in
        :class:`~leangnn.plan.meta.MetaTracker`)."""
        return isinstance(t, FakeTensor)

    def _real_device(self, t: Tensor) -> torch.device:
        """The device a real tensor standing in for ``t`` lives on."""
        return t.device

    def _twin_keys(self, tensors) -> set[int]:
        """Storages of the fake twins the op computed on in place of its
        real inputs (a view of one allocates nothing)."""
        with _disable_current_modes():
            return {_key(self.fake_mode.from_tensor(t)) for t in tensors
                    if not isinstance(t, FakeTensor)}

    # ------------------------------------------------- sparse, fake values
    def _placeholder(self, like: Tensor) -> Tensor:
        """Real zeros shaped like ``like`` (fake), shared by every matrix
        of that shape: values nothing reads (products with it are fake)."""
        dev = self._real_device(like)
        k = (tuple(like.shape), like.dtype, dev)
        if k not in self._blank:
            with _disable_current_modes():
                self._blank[k] = torch.zeros(like.shape, dtype=like.dtype,
                                             device=dev)
        return self._blank[k]

    def _sparse_of_fake(self, func, args, kwargs) -> Tensor:
        """A sparse compressed matrix from real indices and fake values (the
        attention weights of :mod:`leangnn.nn.csr`'s GAT kernel).

        The real constructor allocates nothing (the matrix holds its three
        inputs); here it is a real matrix on placeholder values, which fake
        mode multiplies with fake dense operands into fake outputs, and
        which keeps the fake values alive (and counted) as long as it lives.
        """
        comp, plain, values = args[0], args[1], args[2]
        if self._is_fake(comp) or self._is_fake(plain) or \
                not self._is_fake(values):
            raise UnsupportedOpError(
                f"{func} builds a sparse matrix from indices computed from "
                "features; a dry run cannot")
        args = (comp, plain, self._placeholder(values), *args[3:])
        out = self._real(func, args, kwargs)
        self._values[out] = values
        return out

    def _sampled(self, func, args, kwargs, tensors) -> Tensor:
        """``sampled_addmm`` of a real sparse pattern with fake dense
        operands: fake mode answers with a matrix of no values. The real op
        returns copies of the pattern's indices and fresh values; so does
        this, the values fake (counted while the result lives)."""
        pattern, mat1 = args[0], args[1]
        if pattern.layout != torch.sparse_csr:
            raise UnsupportedOpError(
                f"{func} on a {pattern.layout} pattern; a dry run cannot")
        dtype = torch.promote_types(pattern.dtype, mat1.dtype)
        with _disable_current_modes():
            crow = pattern.crow_indices().clone()
            col = pattern.col_indices().clone()
            shape = pattern.values().shape
        values = torch.empty(shape, dtype=dtype,
                             device=mat1.device)  # fake: the fake mode is below
        with _disable_current_modes():
            out = torch.sparse_csr_tensor(crow, col, self._placeholder(values),
                                          pattern.shape)
        self._values[out] = values
        for part in (crow, col):  # freed with the matrix
            self._track(part, _key(part), owner=out)
        self._track(values, _key(values))
        self._note(func, args, kwargs, tensors, out)
        return out

    def _scalar(self, t: Tensor):
        if not self._is_fake(t):
            with _disable_current_modes():
                return t.item()
        if t.dtype.is_floating_point or t.dtype.is_complex:
            # A logged loss value (``float(loss)``): any number will do.
            return 0.0
        raise UnsupportedOpError(
            "the model reads an integer value computed from features "
            "(.item()/int() of a feature-dependent tensor); a dry run cannot")

    @staticmethod
    def _real(func, args, kwargs):
        with _disable_current_modes():
            return func(*args, **kwargs)

    def _data_dependent(self, func, args, kwargs, known: bool):
        if known:
            return self._real(func, args, kwargs)
        # A boolean mask index (``out[mask]``) with a known mask: the same
        # op with the mask's integer indices has a static shape.
        if func in (aten.index.Tensor, aten.index_put.default,
                    aten.index_put_.default):
            idx = list(args[1])
            masks = [i for i, m in enumerate(idx) if isinstance(m, Tensor)
                     and m.dtype == torch.bool]
            if masks and all(not self._is_fake(idx[i]) and idx[i].dim() == 1
                             for i in masks):
                with _disable_current_modes():
                    for i in masks:
                        idx[i] = idx[i].nonzero(as_tuple=True)[0]
                return func(args[0], idx, *args[2:], **kwargs)
        raise UnsupportedOpError(
            f"{func} has a value-dependent output shape on tensors computed from "
            "features; a dry run cannot run it")

    def _canon(self, key: int) -> int:
        return self._alias.get(key, key)

    def _note(self, func, args, kwargs, tensors, out) -> None:
        self.ops += 1
        if self.ops > self.max_ops:
            raise TooManyOpsError(
                f"more than {self.max_ops} ops in one step (e.g. level-by-level "
                "propagation); a dry run that long is no cheaper than a real step")
        inputs = {self._canon(_key(t)) for t in tensors}
        outs = [t for t in _leaves(out) if t.layout == torch.strided]
        if any(self._is_fake(t) for t in outs):
            # The fake mode computes on a memoised fake twin of each real
            # input; a view of that twin allocates nothing either.
            inputs |= self._twin_keys(tensors)
        if func in _ZEROS and outs:
            self._zeros.add(_key(outs[0]))
        for t in outs:
            raw = _key(t)
            key = self._canon(raw)
            if key in inputs and key not in self._refs:
                continue  # a view of (or in-place op on) an untracked tensor
            if key not in self._refs and self._in_place_in_plain_run(func, args, t):
                continue
            self._track(t, key, raw)
        ws = _workspace(func, args, kwargs, self._nnz, self._is_fake,
                        self._real_device) if self.kernel_workspace else 0
        if ws:
            self._spike(ws)
        sparse = [a for a in args if isinstance(a, Tensor)
                  and a.layout != torch.strided]
        if sparse and "mm" not in func._overloadpacket.__name__:
            # a view of a matrix's parts, its transpose, a conversion: no
            # FLOPs (the formula below would count nnz x the part's length:
            # 0.5 TFLOP of accessors in DPR's GCN step on csbm:50000, priced
            # at 2 s once FLOPs had a cost); only products (``*mm``) do any
            return
        if sparse:
            # a sparse product: 2 nnz multiply-adds per output column (the
            # dense formula would count the matrix's N x N entries)
            with _disable_current_modes():
                nnz = sum(a._nnz() for a in sparse if not self._is_fake(a))
            cols = outs[0].size(-1) if outs and outs[0].dim() else 1
            if func is aten.sparse_sampled_addmm.default:
                cols = args[1].size(-1)  # a dot product of that length per entry
            self.flops += 2 * nnz * cols
            self.sparse_flops += 2 * nnz * cols
            return
        fn = flop_registry.get(func._overloadpacket)
        if fn is not None:
            self.flops += int(fn(*args, **kwargs, out_val=out))

    def _in_place_in_plain_run(self, func, args, out: Tensor) -> bool:
        """Count ``out`` as written into its first argument's storage when a
        run without modes would have done so: the backward's scatters into a
        fresh zeros tensor (``index_select``/``gather``/indexing backward).
        (Gradient accumulation, which a plain run also does in place, changed
        no measured peak and made repeated dry runs differ; it is not
        emulated.)"""
        if not self.plain or self._phase != "backward" or not args or \
                not isinstance(args[0], Tensor):
            return False
        if func not in _FUNCTIONAL_BACKWARD or _key(args[0]) not in self._zeros:
            return False
        arg = args[0]
        base = self._canon(_key(arg))
        ent = self._refs.get(base)
        if ent is None or ent[0] != 1 or ent[2] != "backward" or \
                ent[1] != out.untyped_storage().nbytes() or \
                arg.shape != out.shape or arg.dtype != out.dtype:
            return False  # not a fresh zeros tensor of its own
        self._alias[_key(out)] = base
        # The zeros tensor may die before its in-place result: its storage is
        # kept until the entry goes, else a new storage at its address would
        # be taken for the result (counted as no bytes: an undercount that
        # depended on the allocator's address reuse)
        self._held[base] = arg.untyped_storage()
        self._track(out, base, _key(out))
        return True

    def _track(self, t: Tensor, key: int, raw: int | None = None,
               owner: Tensor | None = None) -> None:
        if raw is not None and raw != key:
            self._raw[raw] = self._raw.get(raw, 0) + 1
        ent = self._refs.get(key)
        if ent is None:
            nbytes = t.untyped_storage().nbytes()
            r = self.round_to
            nbytes = -(-nbytes // r) * r
            edge = not self.edge_dims.isdisjoint(t.shape)
            self._refs[key] = [1, nbytes, self._phase, edge]
            self.live += nbytes
            self.written += nbytes
            if nbytes >= COLD_BYTES:
                self.cold_written += nbytes
                self.cold_blocks[nbytes] = self.cold_blocks.get(nbytes, 0) + 1
            if nbytes < self.heap_threshold:
                self.small_live += nbytes
                if edge:
                    self.edge_live += nbytes
                if self.small_live > self.small_hw:
                    self.small_hw, self.edge_at_hw = self.small_live, self.edge_live
                if self.heap is not None:
                    self.heap.malloc(key, nbytes)
            else:
                self.big_written += nbytes
            if self.live > self.peak:
                self.peak = self.live
            if self._phase is not None:
                ph = self.phases[self._phase]
                ph["peak"] = max(ph["peak"], self.live)
            self._point(0)
        else:
            ent[0] += 1
        # ``owner``: the tensor whose death frees ``t``'s storage (a sparse
        # matrix holding it)
        weakref.finalize(t if owner is None else owner, self._release, key, raw)

    def adopt(self, tensors) -> None:
        """Count ``tensors`` whose storages are alive but untracked: e.g. a
        gradient whose Python object died when autograd stored it in
        ``.grad`` (its finalizer ran; the storage lives on)."""
        for t in tensors:
            if t is not None and self._canon(_key(t)) not in self._refs and \
                    self._is_fake(t):
                self._track(t, self._canon(_key(t)), _key(t))

    def _spike(self, nbytes: int) -> None:
        """A kernel's internal buffer: ``nbytes`` above ``live``, freed when
        the kernel returns."""
        top = self.live + nbytes
        self.peak = max(self.peak, top)
        if self._phase is not None:
            ph = self.phases[self._phase]
            ph["peak"] = max(ph["peak"], top)
        self._point(nbytes)

    @property
    def heap_edge_share(self) -> float:
        """The share of the heap's high-water in edge-sized tensors."""
        return self.edge_at_hw / self.small_hw if self.small_hw else 0.0

    def _point(self, extra: int) -> None:
        """Record (bytes on their own pages, heap high-water) now, keeping the
        points no other point beats in both (the heap's high-water only
        grows, so a new point beats every earlier one with fewer big bytes)."""
        big, small = self.live - self.small_live + extra, self.small_hw
        if self.heap is not None:
            self.floor = max(self.floor, big + self.heap.extent)
        f = self.frontier
        while f and f[-1][0] <= big:
            f.pop()
        if not f or f[-1][1] < small:
            f.append((big, small))

    def _release(self, key: int, raw: int | None = None) -> None:
        if raw is not None and raw != key and raw in self._raw:
            # the last tensor on an aliased storage: its address may be reused
            self._raw[raw] -= 1
            if self._raw[raw] == 0:
                del self._raw[raw]
                self._alias.pop(raw, None)
        ent = self._refs.get(key)
        if ent is None:
            return
        ent[0] -= 1
        if ent[0] == 0:
            del self._refs[key]
            self._zeros.discard(key)
            self._held.pop(key, None)
            self.live -= ent[1]
            if ent[1] < self.heap_threshold:
                self.small_live -= ent[1]
                if ent[3]:
                    self.edge_live -= ent[1]
                if self.heap is not None:
                    self.heap.free(key)


#: constructors of sparse compressed tensors (values are their third argument)
_SPARSE_CTORS = {aten.sparse_compressed_tensor, aten._sparse_compressed_tensor_unsafe,
                 aten.sparse_csr_tensor, aten._sparse_csr_tensor_unsafe,
                 aten.sparse_csc_tensor, aten._sparse_csc_tensor_unsafe,
                 aten.sparse_bsr_tensor, aten.sparse_bsc_tensor}
_ZEROS = {aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default}

#: functional ops autograd's backward uses under a Python mode where a plain
#: run writes into a fresh zeros tensor in place (``index_select``,
#: ``gather``, indexing, ``select``/``slice`` backward)
_FUNCTIONAL_BACKWARD = {aten.index_add.default, aten.scatter_add.default,
                        aten.index_put.default, aten.select_scatter.default,
                        aten.slice_scatter.default, aten.masked_scatter.default,
                        aten.diagonal_scatter.default,
                        aten.as_strided_scatter.default}
_SORTED_SCATTER = {aten.scatter_add_.default, aten.scatter_add.default,
                   aten.scatter_reduce_.two, aten.scatter_reduce.two}
_SORTED_INDEX_ADD = {aten.index_add_.default, aten.index_add.default}
_SPARSE_MM = {aten.mm.default, aten._sparse_mm_reduce_impl.default,
              aten._sparse_mm_reduce_impl_backward.default}


def _workspace(func, args, kwargs, nnz: dict | None = None,
               is_fake: Callable = FakeTracker._is_fake,
               device: Callable = lambda t: t.device) -> int:
    """Bytes a CPU kernel allocates inside itself, out of sight of any
    dispatch mode.

    Scatter-adds and reductions along dim 0 with an expanded index (PyG's
    message aggregation) and ``index_add`` of rows (the backward of
    ``index_select``, PyG's gather) radix-sort the index first: keys and
    values of ``E`` int64 entries, double-buffered, ``32 E`` bytes (measured:
    15.5 MiB hidden at ``E = 500k`` for each of these ops, none for 1-D or
    non-expanded scatters). CUDA uses atomics instead.
    """
    if func in _SORTED_SCATTER:
        self_, dim, index = args[0], args[1], args[2]
        if device(self_).type != "cpu" or dim != 0 or index.dim() < 2:
            return 0
        if any(index.stride(d) != 0 for d in range(1, index.dim())):
            return 0
        return 32 * index.size(0)
    if func in _SPARSE_MM and args and isinstance(args[0], Tensor) and \
            args[0].layout != torch.strided and device(args[0]).type == "cpu":
        # Products with a sparse adjacency (PyG convs given ``adj_t``, DPR's
        # core) lay out a converted copy inside the kernel (measured through
        # peak RSS at nnz = 0.74M and 1.48M: ~40 bytes per entry for a CSC
        # (the backward's transpose), ~32 for the mean-reduce backward, a
        # dense output's worth for a CSR product)
        a = args[0]
        with _disable_current_modes():  # else fake mode answers for a copy
            entries = a._nnz() if not is_fake(a) else 0
        if nnz is not None:
            shape = tuple(a.shape) if a.layout != torch.sparse_csc else \
                tuple(a.shape)[::-1]
            if entries:
                nnz[shape] = entries
            else:
                entries = nnz.get(shape, 0)
        if func is aten._sparse_mm_reduce_impl_backward.default:
            return 32 * entries
        if a.layout == torch.sparse_csc:
            return 40 * entries
        if func is aten.mm.default and len(args) > 1:
            return a.size(0) * args[1].size(-1) * args[1].element_size()
        return 0
    if func in _SORTED_INDEX_ADD:
        self_, dim, index, src = args[0], args[1], args[2], args[3]
        if device(self_).type != "cpu" or dim != 0 or src.dim() < 2:
            return 0
        return 32 * index.numel()
    return 0


def _forget(exc: BaseException) -> None:
    """Drop the locals of the finished frames ``exc``'s traceback holds.

    A caught exception's frames often sit in a reference cycle (a frame
    holding the exception), which keeps the tensors of their locals alive
    until the collector runs; a real run's op raised nothing, so neither may
    the dry run keep them."""
    import traceback

    traceback.clear_frames(exc.__traceback__)


def _leaves(tree) -> list[Tensor]:
    """The tensors in an op's arguments or outputs (tensors, lists and
    tuples of them, dicts of keyword arguments): ``tree_flatten`` without its
    generality, which costs more than the dry run's own bookkeeping."""
    out: list[Tensor] = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
    return out


def _unviewed(tree):
    """``tree`` with every real view copied (outside any mode)."""
    from torch.utils._pytree import tree_map

    def copy(t):
        if isinstance(t, Tensor) and not isinstance(t, FakeTensor) and \
                (t.layout != torch.strided or t._is_view()):
            with _disable_current_modes():
                return t.clone()
        return t

    return tree_map(copy, tree)


def _wants_value(out, limit: int) -> bool:
    # Values decide shapes only through integers and booleans (indices,
    # masks, counts) and scalars (``.item()``). Graph-sized floats computed
    # from the graph alone (GCN's edge norms, mean weights) are computed too:
    # cheap, and a sparse adjacency built from them must be real (fake mode
    # cannot build sparse compressed tensors; it multiplies real ones fine).
    ts = _leaves(out)
    return bool(ts) and all(t.layout != torch.strided or t.numel() <= limit
                            for t in ts)




# ------------------------------------------------------------------ a step
@dataclass
class StepTrace:
    """What one dry-run training step allocated and did.

    Attributes:
        peak_bytes (int): peak of the step's own tensors (gradients, optimizer
            state, activations, temporaries) above the loaded state.
        phases (dict): ``{"forward"|"backward"|"optimizer": {"start", "peak",
            "end"}}`` bytes.
        param_bytes (int): the model's parameters (and buffers).
        data_bytes (int): the graph's tensors.
        ops (int), written (int), flops (int): work of the step.
        sparse_flops (int): the share of ``flops`` in products with a sparse
            matrix (gathers from rows spread over memory, priced apart).
        frontier (list): see :class:`FakeTracker`.
        big_written (int): bytes of the new storages at or above the heap
            threshold (pages of their own, faulted in as they are written).
        cold_written (int): bytes of the new storages of at least
            :data:`COLD_BYTES` (written past the core's caches).
        heap_floor (int): the least resident bytes of the step's tracked
            blocks under glibc's heap (:attr:`FakeTracker.floor`; 0 without).
        cold_blocks (dict): ``{bytes: count}`` of the new storages behind
            ``cold_written`` (see :func:`~leangnn.plan.estimate.chunked_work`).
        heap_edge_share (float): the share of the heap's high-water in
            edge-sized tensors (a dimension of the graph's edge count).
    """

    peak_bytes: int
    phases: dict[str, dict[str, int]] = field(default_factory=dict)
    param_bytes: int = 0
    data_bytes: int = 0
    ops: int = 0
    written: int = 0
    flops: int = 0
    frontier: list[tuple[int, int]] = field(default_factory=list)
    big_written: int = 0
    cold_written: int = 0
    heap_floor: int = 0
    cold_blocks: dict[int, int] = field(default_factory=dict)
    heap_edge_share: float = 0.0
    sparse_flops: int = 0

    def heap_point(self, scale: float = 2.0) -> tuple[int, int]:
        """The frontier point with the most resident memory when the heap
        holds ``scale`` bytes per byte of its high-water."""
        if not self.frontier:
            return (self.peak_bytes, 0)
        return max(self.frontier, key=lambda p: p[0] + scale * p[1])


class _FakeCopyTo(FakeCopyMode):
    """:class:`FakeCopyMode` whose copies are fake tensors on ``device``.

    ``Module.to`` cannot move a model of fake tensors: torch swaps each fake
    parameter for its converted one (``swap_tensors``, forced for fake
    tensors), which refuses a tensor the fake mode's converter holds a weak
    reference to ("Cannot swap t1 because it has weakref"). So the copy is
    made on the device. Views are copied apart, as ``Module.to`` would copy
    them (a model that keeps views of a flat tensor rebinds them when it is
    copied, as ``GSRStack`` does).
    """

    def __init__(self, fake_mode: FakeTensorMode, device: torch.device):
        super().__init__(fake_mode)
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs)
        if func in (torch._C.TensorBase.clone, Tensor.__deepcopy__) and \
                out.device != self.device:
            moved = out.to(self.device)
            if func is Tensor.__deepcopy__:
                args[1][id(args[0])] = moved
            return moved
        return out


def fake_model(model: torch.nn.Module, fake_mode: FakeTensorMode,
               device: torch.device | str | None = None) -> torch.nn.Module:
    """A copy of ``model`` whose parameters and buffers are fake tensors (on
    ``device`` when given, else where ``model``'s are)."""
    mode = FakeCopyMode(fake_mode) if device is None else \
        _FakeCopyTo(fake_mode, torch.device(device))
    with torch.random.fork_rng(devices=[]), mode:
        return copy.deepcopy(model)


#: a new storage of this many bytes or more is written past the core's own
#: caches (1 MiB: the reference box's L2 per core)
COLD_BYTES = 1 << 20


def tensor_bytes(t: Tensor) -> int:
    """Bytes of ``t``'s storage; a sparse tensor's index and value storages
    (it has none of its own)."""
    from leangnn.profile import sparse_parts

    return sum(x.untyped_storage().nbytes() for x in sparse_parts(t))


def _data_bytes(data: Data) -> int:
    return sum(tensor_bytes(v) for v in data.to_dict().values()
               if isinstance(v, Tensor))
