"""Planning and training a user's own PyG model and ``Data``.

The planner of :mod:`leangnn.plan.planner` for any model, from Python: the
rows are the model's own full-batch training (a
:class:`~leangnn.nn.models.GSRGNN` trains reversibly), offload for PyG
``BasicGNN`` models under the budget, and DPR's core at a few ratios;
:func:`fit` then trains the model through the pick with the Trainer's step
(``zero_grad``, ``strategy.train_step``, clipping, Adam).

Example::

    from torch_geometric.nn import GraphSAGE
    from leangnn.plan.user import fit, plan

    print(plan(GraphSAGE(64, 128, 3, 8), data, memory_budget="2GiB"))
    out = fit(model, data, memory_budget="2GiB", epochs=200)
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
import time
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from torch_geometric.data import Data

from leangnn.data import check_graph
from leangnn.graphs.partition import reuse_enabled
from leangnn.plan.calibration import Calibration, calibration_label, load_calibration
from leangnn.plan.core_probe import known_on_csr, probe_core
from leangnn.plan.estimate import (
    Estimate,
    core_of,
    default_loss,
    estimate_model,
    forget,
    offload_estimate,
    plan_scope,
    planning,
    withdraw,
)
from leangnn.plan.fake import UnsupportedOpError
from leangnn.plan.families import calibrated_as, model_name
from leangnn.plan.planner import (
    CORE_RATIOS,
    LAZY_WHY,
    OFFLOAD_PARTS,
    PlanRow,
    PlanTable,
    budget_check,
    choose,
    estimate_row,
    in_process_share,
    mark_table,
    need_figures,
    offload_budgets,
    plan_caveat,
    resolve_budget,
    row_fits,
    unavailable_row,
)
from leangnn.plan.user_checks import (
    STRATEGIES,
    LossFnError,
    check_args,
    check_dtypes,
    checked_loss,
    error_line,
    materialize_lazy,
    num_classes,
    with_train_mask,
)
from leangnn.prune.dpr import core_refusal, empty_core_refusal
from leangnn.utils import format_bytes

__all__ = ["plan", "fit", "calibrated_as"]

def _is_layerwise(model: torch.nn.Module) -> str | None:
    """Why offload cannot train ``model`` (``None``: it can): its layers, and
    its norms in training mode (a ``BatchNorm``'s batch statistics are not
    computed chunk by chunk; the model may sit in eval mode while planned)."""
    try:
        from leangnn.offload import LayerwiseModel

        LayerwiseModel(model).check(training=True)
    except ValueError as e:
        return str(e)
    return None


def plan(model: torch.nn.Module, data: Data, memory_budget=None, loss_fn=None,
         device="cpu", lr: float = 1e-3, clip_norm: float | None = 1.0,
         calibration: Calibration | None = None,
         strategies: tuple[str, ...] | None = None,
         epochs: int | None = None, in_process: bool = False,
         lazy: bool = False) -> PlanTable:
    """Plan training ``model`` on ``data`` (any PyG model) under a budget.

    Rows: full batch; offload (PyG ``BasicGNN`` models) under the budget; the
    DPR core at :data:`CORE_RATIOS`. A :class:`~leangnn.nn.models.GSRGNN`'s
    full-batch row is its reversible training. A model that takes the
    graph's edge features (:func:`~leangnn.strategy.uses_edge_attr`) is
    traced with them; offload and the core cannot carry them, and their rows
    say so. The heap factor is the model's family's where its class is one
    leangnn trains (:func:`calibrated_as`). A lazily built model (PyG's
    ``in_channels=-1``) is first shaped in place by one forward without
    gradients on two nodes of ``data``
    (:func:`~leangnn.plan.user_checks.materialize_lazy`), as PyG's recipe
    does on the whole graph.

    Args:
        model (Module): the model; not modified (a lazily built one is
            shaped, as said above).
        data (Data): the graph (``x``, ``edge_index``, ``y``, optional
            ``node_mask``: the nodes trained on; without it PyG's
            ``train_mask`` where the graph has one, else every node).
        memory_budget (int or str, optional): e.g. ``"4GiB"``; ``None``: the
            device's free memory now. (default: ``None``)
        loss_fn (callable, optional): ``loss_fn(out, data)``; default
            cross-entropy (integer ``y``) or MSE.
        device (str, optional): the training device. (default: ``"cpu"``)
        lr, clip_norm: Adam's learning rate and the clipping norm.
        calibration (Calibration, optional): default: this machine's.
        strategies (tuple of str, optional): only these strategies' rows
            (``full`` stands for the model's own full-batch training).
        epochs (int, optional): the run's epochs; ``None`` (unknown) plans
            for a long run (a CPU run's peak creeps up over its first ~10
            epochs: :meth:`~leangnn.plan.calibration.Calibration.long_run_scale`).
        in_process (bool, optional): the run trains in this process after
            the plan (as :func:`fit`'s does): the plan's own dry runs have
            paid part of its first-run constant
            (:meth:`~leangnn.plan.calibration.Calibration.in_process`), and
            what the pick trains on (DPR's core, the offload engine's graph
            structures) is kept for its strategy to take over
            (``LEANGNN_PLAN_REUSE=0``: nothing is kept). (default: ``False``)
        lazy (bool, optional): estimate only what the pick needs, as
            ``leangnn train --strategy auto`` plans: DPR's cores only where
            no exact row fits, and of them the largest that fits (on CUDA,
            no offload row where full batch fits; on a CPU offload can be
            the faster, so its rows are estimated); the others are rows
            "not estimated". (default: ``False``: every row)

    Raises:
        ValueError: one line naming the argument or tensor and the value: a
            ``model`` that is no Module, has no trainable parameter or lives
            on the meta device, ``data``
            that is no ``Data`` (a list, a ``HeteroData``), a ``device`` that
            cannot train (:func:`~leangnn.config._check_device`), a
            ``memory_budget``, ``strategies``, ``epochs``, ``lr`` or
            ``clip_norm`` out of range, a graph
            :func:`~leangnn.data.check_graph` refuses (class ids checked
            against the model's ``out_channels``), features of
            another dtype than the parameters, a ``loss_fn`` returning no
            tensor, or the full row's dry run failing. A prune row whose core
            the model cannot train on is "not possible" with the reason.

    Example:
        >>> table = plan(GraphSAGE(64, 128, 3, 8), data, "2GiB")
        >>> print(table)          # rows, needs, fits, epoch times, the pick
    """
    t0 = time.perf_counter()
    check_args(model, data, device, strategies, epochs, clip_norm, lr)
    # the dry run moves the graph's tensors (PyG's Data.to works in place):
    # the caller's Data keeps its own
    data = with_train_mask(copy.copy(data), loss_fn)
    # a NaN feature would plan fine and then train a NaN model silently; fake
    # tensors check no class id, a real step's cross-entropy does
    check_graph(data, "data", labels=loss_fn is None, nodes=True,
                num_classes=num_classes(model, data, loss_fn))
    materialize_lazy(model, data)
    check_dtypes(model, data)
    dev = torch.device(device)
    budget = resolve_budget(memory_budget, dev)
    cal = calibration or load_calibration(dev)
    planned_cal = cal
    if in_process:
        cal = cal.in_process()
    loss_fn = checked_loss(loss_fn) or default_loss(data)
    rows_of = (model, data, loss_fn, dev, cal, budget, strategies, epochs, lr,
               clip_norm, lazy)
    if not in_process:
        from leangnn.graphs.partition import reuse_hashes

        # the offload rows, one partition each, hash the graph once
        with reuse_hashes():
            rows = _rows(*rows_of)
    else:
        # fit trains the pick next, in this process: what the rows build for
        # training (DPR's core, the offload engine's graph structures) is
        # offered to it instead of built again (``LEANGNN_PLAN_REUSE=0``: off)
        with plan_scope():
            rows = _rows(*rows_of)
    table = PlanTable(rows, budget, str(dev), calibration_label(cal),
                      caveat=plan_caveat(budget, dev))
    mark_table(table)
    if in_process:
        table.in_process_bytes = in_process_share(planned_cal, table.pick)
        forget(keep=None if table.pick is None else _as_config(table.pick.config))
    table.seconds = time.perf_counter() - t0
    return table


def _as_config(config: dict[str, Any]) -> SimpleNamespace:
    """A row's configuration (strategy and knobs) as attributes, as
    :func:`~leangnn.plan.estimate.forget` and
    :func:`~leangnn.plan.estimate.withdraw` read a ``TrainConfig``."""
    return SimpleNamespace(**config)


def _rows(model, data, loss_fn, dev, cal, budget, strategies, epochs, lr,
          clip_norm, lazy: bool = False) -> list[PlanRow]:
    """The rows of :func:`plan` (its arguments, checked)."""
    name = model_name(model)
    reversible = hasattr(model, "stack") and hasattr(model.stack, "num_groups")
    strategy = "reversible" if reversible else "full"
    wanted = set(strategies or STRATEGIES)
    rows = []
    own = calibrated_as(model)
    if strategy in wanted or "full" in wanted:
        try:
            est = estimate_model(model, data, loss_fn, dev, strategy, lr=lr,
                                 clip_norm=clip_norm, calibration=cal, knobs=own)
        except (UnsupportedOpError, LossFnError):
            raise
        except (ValueError, RuntimeError, TypeError, IndexError) as e:
            # the model's own error on this data: training would raise it too
            raise ValueError(
                f"leangnn.plan: {name} failed in a dry run of one training step "
                f"on the data ({int(data.num_nodes or 0)} nodes, "
                f"{int(data.num_edges or 0)} edges): {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            ) from e
        rows.append(estimate_row(strategy, est, cal, "exact",
                                 {"strategy": strategy}, epochs))
    elif "reversible" in wanted:
        rows.append(unavailable_row("reversible", own, "not possible: reversible "
                                    f"training needs a GSRGNN, {name} is not one "
                                    "(plan strategy 'full' for its own training)"))
    why = _is_layerwise(model) if "offload" in wanted else "not requested"
    # on CUDA nothing exact is faster than full batch where it fits; on a
    # CPU offload can be (the CLI's planner: CPU_TIME_MARGIN)
    skip = lazy and dev.type != "cpu" and any(row_fits(r, budget) for r in rows)
    full = eng = None
    tries = [(b, p) for b in offload_budgets(budget, dev) for p in OFFLOAD_PARTS]
    for dev_budget, parts in tries if "offload" in wanted else ():
        knobs = {**own, "device_budget": dev_budget, "num_parts": parts}
        if skip and why is None:
            rows.append(unavailable_row("offload", knobs, LAZY_WHY))
            continue
        if why is not None:
            rows.append(unavailable_row("offload", knobs, f"not possible: {why}"))
            break
        try:
            if full is None:
                full = estimate_model(model, data, loss_fn, dev)
            est, eng = _offload_model(model, data, dev, dev_budget, cal, knobs,
                                      full, like=eng if reuse_enabled() else None)
            rows.append(estimate_row("offload", est, cal, "exact",
                                     {"strategy": "offload",
                                      "device_budget": dev_budget,
                                      "num_parts": parts}, epochs))
        except LossFnError:
            raise
        except (ValueError, RuntimeError) as e:
            rows.append(unavailable_row("offload", knobs, "not possible: "
                                        + str(e).splitlines()[0]))
    rows += _prune_rows(model, data, loss_fn, dev, cal, own, epochs, lr, clip_norm,
                        budget, levels=own.get("family") == "dag", lazy=lazy,
                        exact_fits=any(row_fits(r, budget) for r in rows)) \
        if "prune" in wanted else []
    return rows


def _prune_rows(model, data, loss_fn, dev, cal, own, epochs, lr, clip_norm,
                budget: int, levels: bool, lazy: bool = False,
                exact_fits: bool = False) -> list[PlanRow]:
    """DPR's core rows at :data:`CORE_RATIOS` (``lazy``: none estimated where
    an exact row fits (``exact_fits``), and none smaller than the largest
    core that fits: they cannot be the pick).

    The core is trained through its CSR adjacency (sparse products, no
    ``[E, C]`` messages). A model that cannot take it trains on the core as
    an edge list instead, the layout its full-batch row runs, and the rows
    say why: its dry run or a real step on a piece of the core raises (a
    scatter over the CSR's int32 indices: PNA, TransformerConv; a float64
    model; a conv without a sparse kernel), or that step's gradients are not
    finite or not those of the same edges as an edge list (EdgeCNN:
    :func:`~leangnn.plan.core_probe.probe_core`). A core the model cannot train
    on either way is a row that says why, as an offload row does, so that
    the plan still picks."""
    rows, why = [], None
    if levels:
        # DPR's core is an adjacency without the circuit's levels
        why = "DPR's core keeps no circuit levels for a DAG model to sweep"
    else:
        why = core_refusal(model, data, "DPR's core")
    sparse, probed, csr_why = True, None, None
    skip = lazy and exact_fits
    for ratio in CORE_RATIOS:
        args = (model, data, ratio, loss_fn, dev, cal, lr, clip_norm, own)
        if skip and not why:
            rows.append(unavailable_row("prune", {**own, "budget_ratio": ratio},
                                        LAZY_WHY, "approximate"))
            continue
        if not why:
            # one core's layout is every ratio's: a real step probes it once
            est, note, why = _core_estimate(*args, sparse, probed != sparse)
            probed = sparse
            if why and sparse and not why.startswith("DPR's core"):
                # the CSR layout failed: the core as an edge list, the
                # layout the model's full-batch row runs
                csr_why, sparse, probed = why, False, False
                est, note, why = _core_estimate(*args, False, True)
        knobs = {**own, "budget_ratio": ratio, **_layout(sparse)}
        if why:
            why = why if why.startswith("DPR's core") else f"DPR's core: {why}"
            rows.append(unavailable_row("prune", knobs, f"not possible: {why}",
                                        "approximate"))
            continue
        if csr_why:
            note += f"; an edge list: the model cannot take its CSR adjacency " \
                    f"({csr_why})"
        est.note = note
        row = estimate_row("prune", est, cal, "approximate",
                           {"strategy": "prune", "budget_ratio": ratio,
                            **_layout(sparse)}, epochs)
        if row.need_bytes is not None and row.need_bytes > budget:
            withdraw(_as_config(row.config))  # cannot be the pick
        # the largest core that fits is the pick: a smaller one cannot be
        skip = skip or (lazy and row_fits(row, budget))
        rows.append(row)
    return rows


def _layout(sparse: bool) -> dict[str, Any]:
    """The knob of a core row kept as an edge list (none for the CSR's)."""
    return {} if sparse else {"sparse_adj": False}


def _core_estimate(model, data, ratio, loss_fn, dev, cal, lr, clip_norm, own,
                   sparse: bool, probe: bool
                   ) -> tuple[Estimate | None, str, str | None]:
    """``(estimate, note, None)`` of training ``model`` on ``data``'s core at
    ``ratio`` (``sparse``: through its CSR adjacency, else as an edge list;
    ``probe``: and a real step on a piece of it), or ``(None, "", why)``
    with the first line of the error."""
    core, note = _core(data, ratio, sparse)
    knobs = {**own, "budget_ratio": ratio, **_layout(sparse),
             "core_nodes": int(core.num_nodes)}
    empty = empty_core_refusal(core, data, "DPR's core")
    if empty:  # (no layout trains on it: a smaller core keeps none either)
        withdraw(_as_config({"strategy": "prune", "budget_ratio": ratio,
                             **_layout(sparse)}))
        return None, "", empty
    try:
        est = estimate_model(model, core, loss_fn, dev, "prune", lr=lr,
                             clip_norm=clip_norm, calibration=cal, knobs=knobs)
        why = probe_core(model, core, loss_fn, dev) \
            if probe and not known_on_csr(model) else None
    except LossFnError:
        raise
    except (ValueError, RuntimeError, TypeError, IndexError) as e:
        # e.g. a float64 model (the core's sparse product is float32 only)
        # or a conv with no sparse kernel
        why = error_line(e)
    if why:
        # what the scope's core_of offered for training: of no use
        withdraw(_as_config({"strategy": "prune", "budget_ratio": ratio,
                             **_layout(sparse)}))
        return None, "", why
    return est, note, None


def _core(data: Data, ratio: float, sparse: bool = True) -> tuple[Data, str]:
    core = core_of(data, budget_ratio=ratio, sparse_adj=None if sparse else False)
    return core, f"core: {int(core.num_nodes)} nodes, {int(core.num_edges)} edges"


def _offload_model(model, data, device, budget, cal, knobs, full: Estimate,
                   like=None):
    """``(estimate, counting engine)`` of an offload row; ``like``: the
    previous row's engine, whose graph grouped by target (and partition, at
    the same part count) this one takes over instead of building."""
    from leangnn.offload import OffloadEngine, OffloadOptions
    from leangnn.offload.engine import offer_graph

    t0 = time.perf_counter()
    opts = OffloadOptions(budget, min(knobs["num_parts"], int(data.num_nodes)),
                          device=device, virtual=True)
    with torch.random.fork_rng(devices=[]):
        eng = OffloadEngine(model, data, options=opts, like=like)
        counters = eng.simulate(train=True)
    if planning():
        offer_graph(eng, data)  # to fit's training of this row
    est = offload_estimate(eng, counters, data, [data], full.model_bytes, full.work,
                           dict(knobs), device)
    cal.apply(est)
    est.estimate_seconds = time.perf_counter() - t0
    return est, eng


def fit(model: torch.nn.Module, data: Data, loss_fn=None, strategy: str = "auto",
        memory_budget=None, epochs: int = 100, lr: float = 1e-3,
        clip_norm: float | None = 1.0, device="cpu",
        weight_decay: float = 0.0, trim_heap: bool | None = None,
        progress: bool | None = None, lazy: bool = True) -> dict[str, Any]:
    """Train ``model`` on ``data`` through the strategy the planner picks.

    Args:
        model (Module): the model, trained in place.
        data (Data): the graph.
        loss_fn (callable, optional): ``loss_fn(out, data)``.
        strategy (str, optional): ``auto`` (the pick of :func:`plan`) or a
            row's strategy (``full``, ``reversible``, ``offload``, ``prune``;
            its first row). (default: ``"auto"``)
        memory_budget, device, lr, clip_norm: see :func:`plan`.
        epochs (int, optional): epochs (one step each). (default: ``100``)
        trim_heap (bool, optional): on CPU, hand freed heap back after every
            epoch as ``leangnn train`` does (the runs the planner's heap
            factors were measured on; without it a deep residual stack
            peaked 17-26% above its estimate). ``None`` reads
            ``LEANGNN_TRIM_HEAP``; ``False`` is the off switch.
            (default: ``None``, i.e. on)
        progress (bool, optional): a tqdm bar over the epochs (the loss as
            its postfix) and a summary line on stderr; ``None``: where
            stderr is a terminal. (default: ``None``)
        lazy (bool, optional): plan only the rows the pick needs (see
            :func:`plan`); ``False`` estimates every row of the returned
            table. (default: ``True``)

    Returns:
        ``{"plan": PlanTable, "row": the row used, "strategy": the Strategy,
        "losses": [...], "epoch_seconds": [...] (each epoch's wall time: step,
        clipping and optimizer), "memory": {"peak_bytes", "method"}, "budget_check":
        {...}}``: the training loop's measured peak above the loaded model and
        graph (as ``leangnn train``'s ``summary.json``), and the need it
        implies beside the budget (:func:`~leangnn.plan.planner.budget_check`).

    Raises:
        ValueError: nothing fits the budget (one line naming the smallest
            candidate), ``strategy`` has no available row, an argument
            :func:`plan` refuses, or the loss turns NaN or Inf (naming the
            epoch; the weights are those of the epoch before).
    """
    known = ("auto", *STRATEGIES)
    if not isinstance(strategy, str) or strategy not in known:
        raise ValueError(f"strategy: expected one of {known}, got {strategy!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs: expected a positive int, got {epochs!r}")
    table = plan(model, data, memory_budget, loss_fn, device, lr, clip_norm,
                 strategies=None if strategy == "auto" else (strategy,),
                 epochs=epochs, in_process=True, lazy=lazy)
    if table.caveat:
        warnings.warn(f"leangnn.fit: {table.caveat}", stacklevel=3)
    if strategy == "auto":
        row = choose(table)
    else:
        sized = [r for r in table.rows if r.need_bytes is not None]
        if not sized:
            why = table.rows[0].why if table.rows else "it has no row"
            why = why.removeprefix("not possible: ")
            raise ValueError(f"strategy={strategy!r} is not possible for this "
                             f"model: {why}")
        # the strategy's pick, as auto's: for prune the largest core that fits
        row = table.pick or min(sized, key=lambda r: r.need_bytes)
        if not row.fits:
            raise ValueError(
                f"strategy={strategy!r}: {row.label} needs "
                f"~{format_bytes(row.need_bytes)}, memory_budget is "
                f"{format_bytes(table.budget_bytes)}")
    strat = _strategy(row, device)
    # the strategies move the graph's tensors in place (PyG's Data.to)
    data = with_train_mask(copy.copy(data), loss_fn)
    loss_fn = checked_loss(loss_fn) or default_loss(data)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    from leangnn.profile import (
        MemoryMeter,
        release_free_heap,
        resident_growth,
        trim_heap_enabled,
    )

    trim = trim_heap_enabled(trim_heap) and torch.device(device).type != "cuda"
    release = release_free_heap if trim else (lambda: None)
    with resident_growth(release) as grown:
        strat.setup(model, [data])
    setup = grown["bytes"] + strat.taken_bytes
    meter = MemoryMeter(device).start()
    losses = []
    model.train()
    from tqdm.auto import tqdm

    bar = tqdm(range(1, epochs + 1), desc=f"fit {row.label}", unit="ep",
               disable=None if progress is None else not progress, mininterval=1.0)
    shown = not bar.disable  # (a finished or closed bar disables itself)
    seconds = []
    for epoch in bar:
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = strat.train_step(model, data, loss_fn)
        if not math.isfinite(loss):
            # stop before the step writes NaN into every weight
            kept = ("the initial ones" if epoch == 1
                    else f"those after epoch {epoch - 1}")
            bar.close()  # the error line below the bar, not inside it
            raise ValueError(f"leangnn.fit: the loss is {loss} at epoch {epoch} of "
                             f"{epochs} (the weights are {kept}); check data.y, "
                             "loss_fn and lr")
        losses.append(loss)
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        seconds.append(time.perf_counter() - t0)  # (the heap's release apart)
        release()
    report = meter.stop()
    strat.fit_end(model, [data], loss_fn)
    check = budget_check({"memory_budget_bytes": table.budget_bytes,
                          **need_figures(row)}, report.peak_bytes, setup)
    if shown:
        need = "" if check is None else (
            f"; need {format_bytes(check['measured_need_bytes'])} measured, "
            f"{format_bytes(check['estimated_need_bytes'])} estimated")
        est = "" if row.epoch_seconds is None else \
            f" ({row.epoch_seconds:.3g} s estimated)"
        print(f"leangnn.fit: {row.label}, {epochs} epochs: loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}; epoch {statistics.median(seconds):.3g} s median"
              f"{est}{need}; budget {format_bytes(table.budget_bytes)}",
              file=sys.stderr)
    return {"plan": table, "row": row, "strategy": strat, "losses": losses,
            "epoch_seconds": seconds,
            "memory": {"peak_bytes": report.peak_bytes, "method": report.method,
                       "setup_bytes": setup},
            "budget_check": check}


def _strategy(row: PlanRow, device):
    if row.strategy == "offload":
        from leangnn.offload import OffloadStrategy

        return OffloadStrategy(device, row.config["device_budget"],
                               row.config["num_parts"])
    if row.strategy == "prune":
        from leangnn.prune.dpr import DPRStrategy

        return DPRStrategy(budget_ratio=row.config["budget_ratio"], device=device,
                           sparse_adj=row.config.get("sparse_adj"))
    from leangnn.strategy import FullBatch

    return FullBatch(device)
