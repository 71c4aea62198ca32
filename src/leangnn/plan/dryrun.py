"""The planner's dry run: one training step traced without allocating.

:func:`trace_step` runs the Trainer's step (zero_grad, forward, loss,
backward, clipping, an Adam step) of a model on a graph whose structure is
real and whose feature-sized tensors are not, and returns its
:class:`~leangnn.plan.fake.StepTrace` (live bytes per phase, heap point,
work). Two backends count the same way: :mod:`leangnn.plan.meta` (meta
tensors, several times cheaper; the default on CPU) and
:mod:`leangnn.plan.fake` (PyTorch's ``FakeTensorMode``; the off switch and
the path on other devices). This module sits above both, so neither imports
the other's caller.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections.abc import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch_geometric.data import Data

from leangnn import heap
from leangnn.plan.fake import (
    MAX_OPS,
    FakeTracker,
    StepTrace,
    UnsupportedOpError,
    _data_bytes,
    _forget,
    _key,
    fake_model,
)

__all__ = ["trace_step"]


def trace_step(model: torch.nn.Module, data: Data, loss_fn: Callable,
               step: Callable | None = None, lr: float = 1e-3,
               weight_decay: float = 0.0, clip_norm: float | None = 1.0,
               device: torch.device | str = "cpu", round_to: int = 1,
               concrete_limit: int | None = None,
               plain: bool = True, kernel_workspace: bool | None = None,
               heap_threshold: int | None = None, max_ops: int = MAX_OPS,
               backend: str = "auto", heap_model: bool = True,
               own_model: bool = False, memo: bool = True) -> StepTrace:
    """One training step of ``model`` on ``data`` under fake tensors.

    The step is the Trainer's: ``zero_grad``, ``step(model, data, loss_fn)``
    (forward, loss, backward; default plain full-batch), gradient clipping
    and an Adam step from a fresh optimizer (so its moments are allocated
    inside the step, as in a run's first epoch).

    Args:
        model (Module): the model (real or meta parameters; not modified).
        data (Data): the graph (real tensors; not modified).
        loss_fn (callable): ``loss_fn(out, data) -> scalar``.
        step (callable, optional): e.g. ``strategy.train_step``.
        lr, weight_decay, clip_norm: the optimizer's settings.
        device: the device the step would run on.
        round_to (int, optional): allocation granularity. (default: ``1``)
        concrete_limit (int, optional): see :class:`FakeTracker`; default
            ``4 (N + E) + 4096`` elements.
        plain, kernel_workspace (bool, optional): see :class:`FakeTracker`.
        heap_threshold (int, optional): see :class:`FakeTracker`; default
            :func:`leangnn.heap.heap_threshold` of ``device``.
        max_ops (int, optional): give up (:class:`UnsupportedOpError`) after
            this many traced ops. (default: :data:`MAX_OPS`)
        backend (str, optional): ``"meta"`` (:mod:`leangnn.plan.meta`: the
            same trace, several times cheaper; CPU steps), ``"fake"`` (this
            module's ``FakeTensorMode`` tracker) or ``"auto"`` (meta on CPU,
            fake elsewhere). (default: ``"auto"``)
        heap_model (bool, optional): record the heap model's floor
            (:attr:`StepTrace.heap_floor`); ``False`` is its off switch.
            (default: ``True``)
        own_model (bool, optional): ``model`` is the caller's to spend: one
            built on the meta device is traced as it is (its parameters get
            gradients) instead of copied first. (default: ``False``)
        memo (bool, optional): compute each op on the graph's real tensors
            once (:class:`~leangnn.plan.values.ValueMemo`; a model's layers
            repeat them); ``False`` is its off switch. (default: ``True``)

    Raises:
        UnsupportedOpError: an op the dry run cannot follow.
    """
    from leangnn.strategy import Strategy

    dev = torch.device(device)
    if backend not in ("auto", "meta", "fake"):
        raise ValueError(f"trace_step: backend must be 'auto', 'meta' or 'fake', "
                         f"got {backend!r}")
    if backend == "meta" and dev.type != "cpu":
        raise ValueError(f"trace_step: backend='meta' traces CPU steps only, got "
                         f"device={dev}")
    meta = backend == "meta" or (backend == "auto" and dev.type == "cpu")
    step = step or Strategy(dev).train_step
    n, e = int(data.num_nodes or 0), int(data.num_edges or 0)
    limit = concrete_limit or 4 * (n + e) + 4096
    # Tensors in reference cycles die when the collector runs; starting from
    # a collected heap makes that moment, and so the trace, repeatable. The
    # objects alive now are frozen first (their garbage waits for the next
    # collection after the trace): a full collection over a process with
    # torch, PyG and scipy loaded costs ~0.3-0.6 s, a tenth of a trace.
    def run(on_meta: bool) -> StepTrace:
        args = (model, data, loss_fn, step, lr, weight_decay, clip_norm, dev,
                round_to, limit, plain, kernel_workspace, heap_threshold, max_ops,
                on_meta, heap_model, own_model)
        # (None: the model wrote memory the value memo shared; again without)
        return _trace(*args, memo) or _trace(*args, False)

    if gc.get_freeze_count():  # the application froze objects: keep them so
        gc.collect()
        return _run_backend(run, meta, backend)
    gc.collect(0)  # young garbage of the caller's own (e.g. a previous trace)
    gc.freeze()
    try:
        return _run_backend(run, meta, backend)
    finally:
        gc.unfreeze()


def _run_backend(run: Callable, meta: bool, backend: str) -> StepTrace:
    """``run`` on the chosen backend; under ``"auto"``, an error of the meta
    path other than the dry run's own (an op of a user's model it handles
    worse than fake mode) costs a second run in fake mode, not the trace."""
    if not meta or backend == "meta":
        return run(meta)
    try:
        return run(True)
    except UnsupportedOpError:
        raise
    except Exception as e:
        _forget(e)
        return run(False)


def _trace(model, data, loss_fn, step, lr, weight_decay, clip_norm, dev, round_to,
           limit, plain, kernel_workspace, heap_threshold, max_ops,
           meta: bool, heap_model: bool = True, own_model: bool = False,
           memo: bool = True) -> StepTrace | None:
    gc.collect()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    # Fake outputs rebuilt from the mode's op cache do not always keep the
    # storage identities a fresh dispatch gives (measured: repeated dry runs
    # then differ by a gradient buffer); ~1.5x slower without it, exact.
    fake_mode.cache_enabled = False
    if heap_threshold is None:
        heap_threshold = heap.heap_threshold(dev)
    # edge-sized heap blocks are told apart by a dimension of the edge count,
    # with self-loops too (GCN, GAT), where it is not also the node count
    n, e = int(data.num_nodes or 0), int(data.num_edges or 0)
    edge_dims = tuple(d for d in (e, e + n) if e and d != n)
    if meta:
        from leangnn.plan.meta import MetaTracker, disk_memo, meta_model

        tracker = MetaTracker(fake_mode, limit, round_to, plain, kernel_workspace,
                              heap_threshold, max_ops, heap_model, edge_dims,
                              memo, device=dev)
    else:
        tracker = FakeTracker(fake_mode, limit, round_to, plain, kernel_workspace,
                              heap_threshold, max_ops, heap_model, edge_dims, memo)
    params = sum(t.untyped_storage().nbytes() for t in
                 {_key(t): t for t in [*model.parameters(), *model.buffers()]}.values())
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), \
            _quiet_fake_mode_log():
        # Layout bookkeeping (e.g. flat parameters) may read a fake tensor's
        # data pointer, which is 0 and harmless here.
        warnings.filterwarnings("ignore", message="Accessing the data pointer")
        if meta and own_model and _on_meta(model):
            fmodel = model  # (a copy costs a tenth of a small model's trace)
        else:
            fmodel = meta_model(model) if meta else fake_model(model, fake_mode,
                                                               dev)
        fmodel.train()
        foreach = True if dev.type == "cuda" else None
        # the meta tracker enters the fake mode itself, for the ops it must;
        # its kernels' answers are kept on disk per graph size
        size = f"n{int(data.num_nodes or 0)}-e{int(data.num_edges or 0)}"
        with disk_memo(size) if meta else fake_mode, tracker:
            tracker.phase("forward")
            opt = torch.optim.Adam(fmodel.parameters(), lr=lr,
                                   weight_decay=weight_decay, foreach=foreach)
            opt.zero_grad(set_to_none=True)
            step(fmodel, data, _marking(loss_fn, tracker))
            tracker.phase("optimizer")
            tracker.adopt([p.grad for p in fmodel.parameters()])
            if clip_norm:
                torch.nn.utils.clip_grad_norm_(fmodel.parameters(), clip_norm,
                                               foreach=foreach)
            opt.step()
            tracker.finish()
            peak = tracker.peak
            del opt
    if tracker.values is not None and tracker.values.conflict:
        return None
    return StepTrace(peak, tracker.phases, params, _data_bytes(data), tracker.ops,
                     tracker.written, tracker.flops, list(tracker.frontier),
                     tracker.big_written, tracker.cold_written, tracker.floor,
                     dict(tracker.cold_blocks), tracker.heap_edge_share,
                     tracker.sparse_flops)


def _on_meta(model: torch.nn.Module) -> bool:
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


@contextlib.contextmanager
def _quiet_fake_mode_log() -> Iterator[None]:
    """Mute the fake mode's own log of a failing op for the trace: it logs
    the whole traceback at ERROR before re-raising, and the caller turns the
    raised error into one line (a model that does not fit its data printed
    ~100 lines of torch internals above ``leangnn.plan``'s message)."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _marking(loss_fn: Callable, tracker: FakeTracker) -> Callable:
    """``loss_fn`` that starts the backward phase once the loss exists."""
    def wrapped(out, data):
        loss = loss_fn(out, data)
        tracker.phase("backward")
        return loss
    return wrapped
