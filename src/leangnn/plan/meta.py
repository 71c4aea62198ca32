"""The dry run on the meta device: :mod:`leangnn.plan.fake`'s counts, cheaper.

``FakeTensorMode`` spends most of a dry run in its own per-op dispatch
(converting real inputs, validating, wrapping outputs: ~85% of a trace). Meta
tensors are PyTorch's own tensors without values: the same shape functions
run on them directly. :class:`MetaTracker` is :class:`~leangnn.plan.fake.
FakeTracker` with meta tensors in place of fake ones, and the same decisions
op by op:

* the model's tensors are meta tensors (:func:`meta_model`); the graph's
  tensors stay real, and so does every integer, boolean or small output of
  an op on real tensors alone (a factory op asked for the meta device makes
  its tensor on the step's device, as a fake tensor reports it; ``.to()``
  between a real and a meta tensor moves nothing: one device under fake
  tensors);
* an op with a meta operand runs on the meta device, its real operands
  replaced by meta twins of the same layout (a view of a twin allocates
  nothing, as a view of fake mode's twin does);
* an op the meta device cannot run (products with a real sparse matrix but
  CSR x dense, value-dependent shapes) runs in fake mode on fake wrappers of
  the same storages, so the result and its error are the fake tracker's own;
* a meta kernel's output depends on its inputs' metadata alone, so fresh
  outputs of functional ops are memoised by the inputs' metadata (many of
  PyTorch's meta kernels are Python reference implementations, ~0.1-0.4 ms
  each, and cost more on their first call in a process; a repeated op costs
  a dictionary look-up). The memo is kept on disk too, one small file per
  traced graph size and PyTorch version (:func:`disk_memo`), so a new
  process planning the same graph skips the kernels as well; so are the
  checks of in-place ops (Adam's step) that left their operand as it was.

Traces equal the fake tracker's (live bytes per phase, heap frontier, work;
tested model by model). CPU steps only: fake tensors report the step's
device to device-dependent code (CUDA kernels' choices), meta ones cannot.
"""

from __future__ import annotations

import contextlib
import copy
import json

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

from leangnn.plan.fake import (
    _SPARSE_CTORS,
    FakeTracker,
    _forget,
    _key,
    _leaves,
    _wants_value,
    _writes,
)
from leangnn.plan.values import fresh, owns_storage

__all__ = ["MetaTracker", "meta_model", "disk_memo"]

aten = torch.ops.aten
_META = torch.device("meta")
_STRIDED = torch.strided

# (func, metadata of the arguments) -> [(shape, stride, dtype)] of the outputs
_MEMO: dict = {}
_MEMO_MAX = 1 << 16
# the on-disk memo of the graph traced now: repr(key) -> [[shape, stride,
# dtype name]] read, and the entries this trace added
_DISK: dict[str, list] = {}
_NEW: dict[str, list] = {}
_DISK_MAX = 1 << 14  # entries per file (a few hundred per model and depth)


@contextlib.contextmanager
def disk_memo(name: str):
    """Use (and extend) the on-disk memo ``name`` (e.g. the traced graph's
    size) for the meta kernels run inside; its file lives under
    ``cache_root("meta")``, one per PyTorch version (the kernels' answers are
    PyTorch's). A damaged or unwritable file only costs the kernels."""
    from leangnn.utils import atomic_write_text, cache_root

    path = cache_root("meta") / f"torch-{torch.__version__}" / f"{name}.json"
    _DISK.clear()
    _NEW.clear()
    _DISK.update(_read(path))
    try:
        yield
    finally:
        if _NEW:
            cur = _read(path)  # another process may have added to it
            if len(cur) + len(_NEW) > _DISK_MAX:
                cur = {}
            cur.update(_NEW)
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, json.dumps(cur, separators=(",", ":")))
        _DISK.clear()
        _NEW.clear()


def _read(path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _from_disk(entry) -> list | None:
    try:
        spec = [(tuple(map(int, s)), tuple(map(int, st)), getattr(torch, dt))
                for s, st, dt in entry]
    except (TypeError, ValueError, AttributeError):
        return None
    return spec if all(isinstance(s[2], torch.dtype) for s in spec) else None


def _makes(func) -> bool:
    """Whether ``func`` takes a ``device`` (a factory op)."""
    ok = _MAKES.get(func)
    if ok is None:
        ok = _MAKES[func] = any(a.name == "device" for a in func._schema.arguments)
    return ok


_MAKES: dict = {}


def _sig(x):
    """Hashable metadata of an argument (``TypeError`` if it has none)."""
    if isinstance(x, Tensor):
        if x.layout != _STRIDED or not x.is_meta:
            raise TypeError
        return (tuple(x.shape), x.stride(), x.dtype, x.storage_offset())
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_sig(v) for v in x))
    hash(x)
    return (type(x), x)  # 1, 1.0 and True hash alike and promote differently


def _minimal(shape, stride, dtype) -> Tensor:
    return torch.empty_strided(shape, stride, dtype=dtype, device=_META)


#: the memo's mark of an in-place op whose kernel returned its operand as it was
_SELF = ("self",)


def _kernel(func, args, kwargs):
    """``func`` on meta tensors; a fresh output rebuilt from the memo when the
    same op on the same metadata ran before, and an in-place op's operand
    returned as it is when the same op on the same metadata left it so."""
    if not fresh(func):
        if not args or not _writes(func):  # (not views: ``t_``, ``resize_``)
            return func(*args, **kwargs)
        # An in-place op on meta tensors writes nothing; its kernel only
        # checks the operands (a kernel seen returning another tensor, an
        # ``out=``, or changing its operand's metadata is not memoised).
        # Adam's step is such ops, 5 per parameter: ~40% of a residual
        # stack's dry run went to these checks.
        try:
            key = (func, _sig(args), _sig(tuple(kwargs.items())))
        except TypeError:
            return func(*args, **kwargs)
        seen = _MEMO.get(key)
        if seen is _SELF:
            return args[0]
        skey = None
        if seen is None and _DISK:  # (not looked up yet in this process)
            skey = repr(key)
            if _DISK.get(skey) == "self":
                _MEMO[key] = _SELF
                return args[0]
        before = _sig(args[0])
        out = func(*args, **kwargs)
        if len(_MEMO) >= _MEMO_MAX:
            return out
        if out is args[0] and _sig(out) == before:
            _MEMO[key] = _SELF
            skey = skey or repr(key)
            if " at 0x" not in skey:
                _NEW[skey] = "self"
        else:
            _MEMO[key] = ()  # (): run the kernel, no look-up
        return out
    try:
        # (the default dtype: a factory op's without a dtype argument)
        key = (func, _sig(args), _sig(tuple(kwargs.items())),
               torch.get_default_dtype())
    except TypeError:
        return func(*args, **kwargs)
    spec = _MEMO.get(key)
    skey = None
    if spec is None and _DISK:  # (not looked up yet in this process)
        skey = repr(key)
        spec = _from_disk(_DISK.get(skey, ()))
        if spec:
            _MEMO[key] = spec
    if spec:
        outs = [_minimal(*s) for s in spec]
        return outs[0] if len(outs) == 1 and len(func._schema.returns) == 1 \
            else tuple(outs)
    out = func(*args, **kwargs)
    spec = _spec(out, args, kwargs)
    if len(_MEMO) < _MEMO_MAX:
        _MEMO[key] = spec or ()  # (): run the kernel, no look-up
    if spec:
        skey = skey or repr(key)
        if " at 0x" not in skey:  # (an object without a stable repr)
            _NEW[skey] = [[list(sh), list(st), str(dt).removeprefix("torch.")]
                          for sh, st, dt in spec]
    return out


def _spec(out, args, kwargs) -> list | None:
    """``(shape, stride, dtype)`` of each output, where ``empty_strided``
    rebuilds it exactly (a fresh tensor of its own, minimal storage)."""
    outs = [out] if isinstance(out, Tensor) else list(out)
    # a schema without aliases may still return a view (``_unsafe_view``)
    given = {_key(t) for t in _leaves((args, kwargs)) if t.layout == _STRIDED}
    spec = []
    for t in outs:
        if not isinstance(t, Tensor) or not t.is_meta or t.layout != _STRIDED or \
                not owns_storage(t, given):
            return None
        spec.append((tuple(t.shape), t.stride(), t.dtype))
    return spec


def _twin(t: Tensor) -> Tensor:
    """A meta tensor of ``t``'s layout (sizes, strides, offset, storage size)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(n, dtype=t.dtype, device=_META).as_strided(
        t.shape, t.stride(), t.storage_offset())


class MetaTracker(FakeTracker):
    """:class:`~leangnn.plan.fake.FakeTracker` on meta tensors.

    Enter it alone (``with MetaTracker(fake_mode):``); ``fake_mode`` runs
    only the ops the meta device cannot.

    Args:
        fake_mode (FakeTensorMode): for the ops meta tensors cannot run
            (built with ``allow_non_fake_inputs=True``).
        *args, **kwargs: as :class:`~leangnn.plan.fake.FakeTracker`.
        device (torch.device, optional): the device the step runs on (CPU).
            (default: ``"cpu"``)
    """

    def __init__(self, fake_mode: FakeTensorMode, *args, device="cpu", **kwargs):
        super().__init__(fake_mode, *args, **kwargs)
        self.device = torch.device(device)
        self._twins: set[int] = set()
        self._faked = False

    @staticmethod
    def _is_fake(t) -> bool:
        # (fake ones: the operands of an op run in fake mode)
        return isinstance(t, Tensor) and (t.is_meta or isinstance(t, FakeTensor))

    def _real_device(self, t: Tensor) -> torch.device:
        return self.device if t.is_meta else t.device

    def _twin_keys(self, tensors) -> set[int]:
        if self._faked:  # fake mode computed on its own twins
            return super()._twin_keys(tensors)
        return self._twins

    # ------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = _leaves((args, kwargs))
        known = not any(t.is_meta for t in flat)
        tensors = [t for t in flat if t.layout == _STRIDED]
        self._faked = False
        self._twins = set()
        if func is aten._local_scalar_dense.default:
            return self._scalar(tensors[0])
        dev = kwargs.get("device")
        rkwargs = kwargs  # for a run on real tensors
        if dev is not None:
            dev = torch.device(dev)
            if func is aten._to_copy.default and flat and \
                    (dev.type == "meta") != flat[0].is_meta and \
                    dev.type in ("meta", self.device.type):
                # ``x.to(y.device)`` between a real and a meta tensor: one
                # device under fake tensors
                return self._one_device(func, types, args, kwargs, flat[0])
            if dev.type == "meta":
                # made for real on the device a fake tensor reports
                rkwargs = {**kwargs, "device": self.device}
        if not known and func._overloadpacket in _SPARSE_CTORS:
            out = self._sparse_of_fake(func, args, rkwargs)
        elif not known and func is aten.sparse_sampled_addmm.default and \
                not args[0].is_meta:
            return self._sampled(func, args, kwargs, tensors)
        elif func is aten.values.default and args[0] in self._values:
            values = self._values[args[0]]
            out = values.view(values.shape)
        elif known and "sparse" in func.__name__:
            out = self._real(func, args, rkwargs)
        elif known:
            out = self._known(func, args, kwargs, tensors, rkwargs)
        elif func is aten.mm.default and _csr_times_meta(args):
            # CSR x dense, fake mode's result without its conversion of the
            # matrix (measured: a fresh contiguous product either way)
            out = torch.empty(args[0].size(0), args[1].size(1), dtype=args[1].dtype,
                              device=_META)
        elif _csr_reduce(func, args):
            out = _csr_reduce_outputs(func, args)
        else:
            try:
                out = self._meta(func, args, kwargs)
            except Exception as e:
                _forget(e)
                out = self._via_fake(func, args, rkwargs)
        self._note(func, args, kwargs, tensors, out)
        return out

    def _compute(self, func, args, kwargs, rkwargs):
        if _writes(func):  # a write to real tensors: for real, once, as fake's
            return self._real(func, args, rkwargs)
        try:
            out = self._meta(func, args, kwargs)
        except Exception as e:  # fake mode's errors here: run it for real
            _forget(e)
            return self._real(func, args, rkwargs)
        if _wants_value(out, self.limit):
            return self._real(func, args, rkwargs)
        return out

    def _one_device(self, func, types, args, kwargs, t: Tensor):
        """``t.to(device, ...)`` across real and meta, where fake tensors have
        one device: the conversion on ``t``'s own device, or ``t`` itself
        (an alias counted with it, no op) where that is all ``.to`` does."""
        if kwargs.get("dtype") not in (None, t.dtype) or kwargs.get("layout") \
                not in (None, _STRIDED) or kwargs.get("memory_format") not in \
                (None, torch.preserve_format):
            return self.__torch_dispatch__(func, types, args,
                                           {**kwargs, "device": t.device})
        with _disable_current_modes():
            out = aten.alias.default(t)
        key = self._canon(_key(t))
        if key in self._refs:
            self._track(out, key, _key(out))
        return out

    def _meta(self, func, args, kwargs):
        """``func`` on the meta device, real operands as meta twins."""
        # (no closures: a recursive one sits in a reference cycle, which
        # would keep the tensors it saw alive until the collector runs)
        twins = self._twins
        margs = tuple(_map(_to_twin, a, twins) for a in args)
        mkwargs = {k: _map(_to_twin, v, twins) for k, v in kwargs.items()}
        if _makes(func):  # a factory op: on meta too, whatever it was asked
            mkwargs["device"] = _META
        return _kernel(func, margs, mkwargs)

    def _via_fake(self, func, args, kwargs):
        """``func`` in fake mode on fake wrappers of the meta operands (same
        storages), with the fake tracker's handling; outputs back as meta."""
        self._faked = True
        self._twins = set()
        back: dict[int, Tensor] = {}
        ctx = (self.fake_mode, self.device, back)
        fargs = tuple(_map(_to_fake, a, ctx) for a in args)
        fkwargs = {k: _map(_to_fake, v, ctx) for k, v in kwargs.items()}
        with self.fake_mode:
            out = self._run(func, fargs, fkwargs, False)
        out = _map(_from_fake, out, back, all_lists=True)
        back.clear()
        return out


def _csr_times_meta(args) -> bool:
    a, b = args[0], args[1]
    return a.layout == torch.sparse_csr and not a.is_meta and b.is_meta and \
        b.layout == _STRIDED and b.dim() == 2 and a.dtype == b.dtype


#: CSR x dense products reduced by sum or mean (PyG's spmm, e.g. SAGE's
#: mean over DPR's core) and their backward
_CSR_REDUCE = (aten._sparse_mm_reduce_impl.default,
               aten._sparse_mm_reduce_impl_backward.default)


def _csr_reduce(func, args) -> bool:
    """Whether ``func(*args)`` is a sum- or mean-reduced product of a real
    CSR matrix and meta features (the backward: for the features' gradient
    alone), whose outputs :func:`_csr_reduce_outputs` gives without a run.
    Fake mode runs the real kernel on zero-filled copies instead (measured:
    40 of a 130 ms trace, SAGE-3 on itc99/b19's core)."""
    if func not in _CSR_REDUCE or len(args) < 3 or not _csr_times_meta(args):
        return False  # (arguments given by keyword: the general path)
    if func is aten._sparse_mm_reduce_impl.default:
        return args[2] in ("sum", "mean")
    if len(args) < 6:
        return False
    other, mask = args[2], args[5]
    return args[3] in ("sum", "mean") and isinstance(other, Tensor) and \
        other.is_meta and not mask[0] and bool(mask[1])


def _csr_reduce_outputs(func, args) -> tuple:
    """The kernel's outputs, as its CPU implementation makes them: forward a
    fresh contiguous ``[M, C]`` and an empty ``arg_out`` of the matrix's
    index dtype (filled for amax / amin only); backward no matrix gradient
    and a fresh contiguous gradient of the features' shape."""
    a = args[0]
    if func is aten._sparse_mm_reduce_impl.default:
        return (torch.empty(a.size(0), args[1].size(1), dtype=args[1].dtype,
                            device=_META),
                torch.empty(0, dtype=a.col_indices().dtype, device=_META))
    other = args[2]
    return None, torch.empty(tuple(other.shape), dtype=other.dtype, device=_META)


def _map(fn, x, ctx, all_lists: bool = False):
    """``fn(tensor, ctx)`` on a tensor or the tensors of a list or tuple."""
    if isinstance(x, Tensor):
        return fn(x, ctx)
    if isinstance(x, (list, tuple)) and (all_lists or any(
            isinstance(v, Tensor) for v in x)):
        vals = [_map(fn, v, ctx, all_lists) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else type(x)(vals)
    return x


def _to_twin(t: Tensor, twins: set) -> Tensor:
    if t.is_meta or t.layout != _STRIDED:
        return t
    tw = _twin(t)
    twins.add(_key(tw))
    return tw


def _to_fake(t: Tensor, ctx) -> Tensor:
    mode, device, back = ctx
    if not t.is_meta or t.layout != _STRIDED:
        return t
    f = FakeTensor(mode, t, device)
    back[id(f)] = t
    return f


def _from_fake(t: Tensor, back: dict) -> Tensor:
    if not isinstance(t, FakeTensor):
        return t
    if id(t) in back:  # an in-place op's own operand
        return back[id(t)]
    with _disable_current_modes():
        m = torch.empty(0, dtype=t.dtype, device=_META)
        return m.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


class _MetaCopyMode(TorchFunctionMode):
    """``copy.deepcopy`` with every tensor copied as a meta tensor of its
    layout: :class:`~torch._subclasses.fake_tensor.FakeCopyMode` for meta."""

    def __init__(self):
        super().__init__()
        self.bases: dict[int, Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._C.TensorBase.clone:  # a Parameter's deepcopy
            return func(self._meta(args[0]), **kwargs)
        if func is Tensor.__deepcopy__:
            tensor, memo = args
            if id(tensor) not in memo:
                memo[id(tensor)] = self._meta(tensor)
            return memo[id(tensor)]
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def _meta(self, t: Tensor) -> Tensor:
        if t.layout != _STRIDED:
            return t  # (a sparse tensor stays shared: nothing mutates one)
        m = _minimal(tuple(t.shape), t.stride(), t.dtype)
        if t.storage_offset() or \
                m.untyped_storage().nbytes() != t.untyped_storage().nbytes():
            # a view into a larger storage: views of one meta storage
            base = self.bases.setdefault(_key(t), torch.empty(
                t.untyped_storage().nbytes(), dtype=torch.uint8, device=_META))
            m = base.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
        if t.requires_grad and t.is_leaf:
            m.requires_grad_()
        return m


def meta_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` whose tensors (parameters, buffers, others) are
    meta tensors of the same layouts, as :func:`~leangnn.plan.fake.fake_model`
    copies them as fake ones."""
    with torch.random.fork_rng(devices=[]), _MetaCopyMode():
        return copy.deepcopy(model)
