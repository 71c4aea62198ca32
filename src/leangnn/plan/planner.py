"""The planner: "will it fit?" answered before training, and the pick.

Users otherwise try, run out of memory, halve something and try again. For a
memory budget the planner estimates every way leangnn can train a model
(:mod:`leangnn.plan.estimate`: full batch, the reversible GSR stack at a few
group counts, DPR's core at a few ratios, offload under the budget), adds the
allocator overhead calibrated on this machine (:mod:`leangnn.plan.calibrate`)
and picks: the fastest *exact* strategy that fits (full batch, offload,
reversible), a model change (``res`` -> its reversible twin ``gsr``) next,
and the approximate DPR core, the largest that fits, only when nothing exact
fits. In the spirit of
Checkmate and PyTorch's ``activation_memory_budget`` (a budget in, a plan
out), at the granularity of leangnn's strategies.

Entry points: :func:`plan_config` (a :class:`~leangnn.config.TrainConfig`,
for ``leangnn plan`` and ``--strategy auto``), :func:`choose`,
:func:`format_table`; for any PyG model and ``Data``,
:func:`leangnn.plan.user.plan` and :func:`leangnn.plan.user.fit`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from leangnn.plan.calibration import (
    Calibration,
    calibration_label,
    csr_core,
    load_calibration,
    long_run_families,
)
from leangnn.plan.estimate import (
    Estimate,
    estimate_config,
    forget,
    plan_scope,
    withdraw,
)
from leangnn.utils import MAX_BYTES, format_bytes, json_safe, parse_bytes

__all__ = ["PlanRow", "PlanTable", "plan_config", "choose", "format_table",
           "candidates", "plan_candidates", "resolve_budget", "plan_summary",
           "PLANNED", "GROUPS", "CORE_RATIOS", "OFFLOAD_PARTS", "CPU_DEVICE_SHARES",
           "in_process_share", "LAZY_WHY", "row_fits",
           "PINNABLE", "offload_budgets", "budget_check", "need_figures",
           "resumed_plan", "thread_caveat", "budget_caveat", "plan_caveat",
           "CPU_TIME_MARGIN"]

#: why a row with an analytic estimate is never chosen
LOWER_BOUND = "only a lower bound (the dry run cannot follow it)"

#: the strategies the planner has rows for
PLANNED = ("full", "reversible", "offload", "prune", "distributed")
GROUPS = (2, 4)               #: reversible group counts tried
CORE_RATIOS = (0.5, 0.3, 0.1)  #: DPR core ratios tried
OFFLOAD_PARTS = (4, 8, 16)    #: offload METIS part counts tried
#: shares of the memory budget tried as offload's device budget on a CPU
#: "device": there the host store and the pool share one memory, and a pool
#: as large as the whole budget runs few, large jobs whose blocks fragment
#: glibc's heap (csbm:20000, SAGE-3: 60 MiB of device budget measured 72-99
#: MiB in all, 16 MiB of it 43 MiB); on CUDA the pool is the whole budget
CPU_DEVICE_SHARES = (1.0, 0.5, 0.25)
#: knobs a user can pin (``--groups 4`` with ``leangnn plan`` or ``--strategy
#: auto``): their rows use that value instead of the grid above
PINNABLE = ("num_groups", "device_budget", "num_parts", "budget_ratio", "dist_mode")

#: preference among fitting rows, then speed: exact, model change, approximate
_CLASS = {"exact": 0, "model change": 1, "approximate": 2}
#: among exact rows that fit, full batch first: it computes each layer once
#: with nothing recomputed or copied, and was the fastest row that fits in
#: every case of ``benchmarks/plan.py`` (reversible recomputes the forward in
#: the backward, offload moves every embedding through the host store); the
#: calibrated time estimate ranks the rows within a strategy (groups, parts),
#: where it only has to order similar work, not compare unlike kernels
#: (but see :data:`CPU_TIME_MARGIN`)
_SPEED_RANK = {"full": 0, "reversible": 1, "offload": 2}
#: on a CPU an exact row of a slower rank is picked over the first one when
#: its epoch is estimated at most this share of it: there the offload
#: "device" is the same memory (no copies over a bus), and its chunk-sized
#: blocks come from the heap where full batch's ``E x C`` messages are fresh
#: pages faulted in on every step. Measured through the Trainer under glibc's
#: default allocator (csbm:8000, SAGE-3, hidden 64): full batch 0.177 s per
#: epoch, offload 0.122-0.145 s. On CUDA offload copies over the bus and its
#: time is not calibrated: full batch stays first there.
CPU_TIME_MARGIN = 0.9
#: offload rows estimated within this factor of the fastest one are a tie the
#: time model cannot break: the pick is the one that needs least (smaller
#: chunks). What the model leaves out favours it too: a job's edge-sized
#: blocks shrink with the chunks, and so does its working set against the
#: shared last-level cache. Measured through the Trainer in the compact heap
#: (csbm:8000, SAGE-3, hidden 64, 3 processes each): 4 chunks estimated
#: 0.128 s and 49.8 MiB, measured 0.120-0.127 s; 8 chunks estimated 0.139 s
#: and 40.0 MiB, measured 0.103-0.109 s. CPU only (as :data:`CPU_TIME_MARGIN`).
OFFLOAD_TIME_TIE = 1.10
#: distributed rows: the mode that moves less first, as the strategy's own
#: ``auto`` does (data parallel for several training graphs: one gradient sum
#: per step of a few graphs; graph parallel for one: halo rows per layer).
#: Their epoch estimates are the ranks' compute alone (the collectives are
#: not calibrated), so they do not rank the modes: measured, 2 ranks on one
#: host, the default split's 13 circuits with res L4 trained in 0.144 s per
#: epoch in data mode, 0.383 s graph parallel (estimates 0.053 and 0.062 s);
#: csbm:20000, SAGE-3, 0.64 s graph parallel and 1.00 s in data mode
def _mode_first(r: PlanRow) -> bool:
    graphs = r.estimate.work.get("graphs", 1) if r.estimate is not None else 1
    return r.knobs.get("dist_mode") == ("data" if graphs > 1 else "graph")


@dataclass
class PlanRow:
    """One candidate: a strategy with its knobs and its estimate.

    Attributes:
        strategy (str): the strategy.
        knobs (dict): its settings (and the model's).
        kind (str): ``exact``, ``model change`` or ``approximate``.
        need_bytes (int | None): memory the run needs in all (``None``: the
            row is not available, see ``why``).
        fits (bool): ``need_bytes`` within the budget.
        epoch_seconds (float | None): estimated epoch time.
        why (str): why it was (not) chosen.
        chosen (bool): the pick.
        config (dict): the configuration fields this row sets.
        estimate (Estimate | None): the estimate behind it.
        host_short (str): why host memory cannot hold what the row keeps
            there (offload's host store on a GPU run); empty when it can.
        detail (str): what the need is made of (a distributed row's ranks).
        need_over (int | None): a row left out because it needs more than
            this (offload's floor, :func:`offload_floor`), above the budget.
    """

    strategy: str
    knobs: dict[str, Any]
    kind: str = "exact"
    need_bytes: int | None = None
    fits: bool = False
    epoch_seconds: float | None = None
    why: str = ""
    chosen: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    estimate: Estimate | None = None
    host_short: str = ""
    detail: str = ""
    need_over: int | None = None

    @property
    def label(self) -> str:
        keys = [k for k in ("model", "num_layers", "num_groups", "budget_ratio",
                            "device_budget", "num_parts", "nproc", "dist_mode")
                if k in self.knobs]
        return f"{self.strategy}(" + ", ".join(
            f"{k}={_knob(k, self.knobs[k])}" for k in keys) + ")"

    def apply(self, cfg):
        """``cfg`` (a TrainConfig) with this row's strategy and knobs."""
        from leangnn.config import TrainConfig

        d = cfg.to_dict()
        d.update(self.config)
        return TrainConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["estimate"] = None if self.estimate is None else self.estimate.to_dict()
        d["label"] = self.label
        return d


@dataclass
class PlanTable:
    """The planner's answer: every candidate row and the pick.

    Attributes:
        rows (list of PlanRow): the candidates, in the order tried.
        budget_bytes (int): the memory budget.
        device (str): the training device.
        calibration (str): the machine kind whose calibration was used
            (``uncalibrated`` when none is stored or shipped, ``reference
            KIND`` for the shipped reference calibration).
        seconds (float): what planning took.
        in_process_bytes (int): what the estimates took off the pick's
            first-run constant, for a pick that trains in the planning
            process (:func:`in_process_share`; ``0``: planned for a process
            of its own).
        caveat (str): what the estimates leave out in this process
            (:func:`thread_caveat`) and a budget above what the device has
            free (:func:`budget_caveat`), printed above the pick's line;
            empty when nothing.
    """

    rows: list[PlanRow]
    budget_bytes: int
    device: str
    calibration: str = ""
    seconds: float = 0.0
    in_process_bytes: int = 0
    caveat: str = ""

    @property
    def pick(self) -> PlanRow | None:
        return next((r for r in self.rows if r.chosen), None)

    def with_budget(self, memory_budget) -> PlanTable:
        """The same rows judged against another budget (no re-estimation)."""
        import copy

        table = copy.deepcopy(self)
        table.budget_bytes = parse_bytes(memory_budget, "memory_budget")
        table.caveat = plan_caveat(table.budget_bytes, table.device)
        for r in table.rows:
            r.chosen, r.why = False, r.why if r.need_bytes is None else ""
        return mark_table(table)

    def to_dict(self) -> dict[str, Any]:
        pick = self.pick
        return json_safe({"budget_bytes": self.budget_bytes, "device": self.device,
                          "calibration": self.calibration, "seconds": self.seconds,
                          "caveat": self.caveat,
                          "pick": None if pick is None else pick.label,
                          "rows": [r.to_dict() for r in self.rows]})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        return format_table(self)


# ---------------------------------------------------------------- choosing
#: why a lazy plan (``--strategy auto``, :func:`leangnn.fit`) left a row
#: without an estimate
LAZY_WHY = "not estimated: a preferred row fits (planned lazily)"


def row_fits(row: PlanRow, budget: int) -> bool:
    """Whether ``row`` was estimated, needs at most ``budget`` and can be
    chosen (no ``host_short``)."""
    return row.need_bytes is not None and row.need_bytes <= budget and \
        not row.host_short


def mark_table(table: PlanTable) -> PlanTable:
    """Fill ``fits`` / ``why`` / ``chosen`` of every row."""
    for r in table.rows:
        r.chosen = False
        if r.need_bytes is not None:
            r.fits = row_fits(r, table.budget_bytes)
    ok = [r for r in table.rows if r.fits]
    if not ok:
        for r in table.rows:
            if r.need_bytes is None:
                continue
            if _held(r, table.budget_bytes):
                r.why = r.host_short
            else:
                r.why = (f"needs {format_bytes(r.need_bytes)} > budget "
                         f"{format_bytes(table.budget_bytes)}")
        return table
    fastest = _faster_on_cpu(min(ok, key=_preference), ok, table.device)
    best = _roomier_offload(fastest, ok, table.device)
    best.chosen = True
    for r in table.rows:
        if r is best and r.strategy == "distributed":
            r.why = ("chosen: the mode that fits and communicates the least"
                     if _mode_first(r) else "chosen: the mode that fits")
        elif r is best and r is not fastest:
            r.why = ("chosen: the exact strategy that fits and needs least among "
                     "the fastest (a tie)")
        elif r is best:
            r.why = {"exact": "chosen: the fastest exact strategy that fits",
                     "model change": "chosen: nothing exact fits; the model's "
                                     "reversible twin does",
                     "approximate": "chosen: nothing exact fits; the largest "
                                    "core that does"}[r.kind]
        elif r.need_bytes is None:
            continue
        elif r.host_short:
            r.why = r.host_short
        elif not r.fits:
            r.why = (f"needs {format_bytes(r.need_bytes)} > budget "
                     f"{format_bytes(table.budget_bytes)}")
        elif _CLASS[r.kind] > _CLASS[best.kind]:
            r.why = f"fits, but {r.kind} (an exact strategy fits)" \
                if best.kind == "exact" else f"fits, but {r.kind}"
        elif r.kind == "approximate":
            r.why = "fits, but a smaller core"
        elif r.strategy == "distributed" and best.strategy == "distributed":
            r.why = "fits, but communicates more"
        elif r.strategy != best.strategy and \
                _SPEED_RANK.get(r.strategy, 3) > _SPEED_RANK.get(best.strategy, 3):
            r.why = f"fits, but {best.strategy} fits too (no recompute, no copies)"
        elif r.strategy == best.strategy == "offload" and \
                r.epoch_seconds is not None and best.epoch_seconds is not None \
                and r.epoch_seconds < best.epoch_seconds:
            r.why = (f"fits, but needs more (estimated within "
                     f"{OFFLOAD_TIME_TIE:.2f}x of the pick's epoch: a tie)")
        else:
            r.why = "fits, but slower"
    return table


def _faster_on_cpu(best: PlanRow, ok: list[PlanRow], device: str) -> PlanRow:
    """``best``, or on a CPU the fastest exact row that fits estimated at
    most :data:`CPU_TIME_MARGIN` of its epoch."""
    if best.kind != "exact" or best.epoch_seconds is None or \
            torch.device(device).type != "cpu":
        return best
    rivals = [r for r in ok if r.kind == "exact" and r.strategy != "distributed"
              and r.epoch_seconds is not None
              and r.epoch_seconds <= CPU_TIME_MARGIN * best.epoch_seconds]
    return min(rivals, key=lambda r: (r.epoch_seconds, r.need_bytes), default=best)


def _held(r: PlanRow, budget: int) -> bool:
    """Whether ``r`` needs no more than ``budget`` but cannot be chosen (a
    lower bound only, a host store over the host's free memory)."""
    return bool(r.host_short) and r.need_bytes is not None and \
        r.need_bytes <= budget


def _roomier_offload(best: PlanRow, ok: list[PlanRow], device: str) -> PlanRow:
    """``best``, or when it is an offload row on a CPU the one that needs
    least among the offload rows that fit estimated within
    :data:`OFFLOAD_TIME_TIE` of its epoch (on CUDA, where offload's time is
    not calibrated and smaller chunks mean more copies, ``best``)."""
    if best.strategy != "offload" or best.epoch_seconds is None or \
            torch.device(device).type != "cpu":
        return best
    ties = [r for r in ok if r.strategy == "offload" and r.kind == best.kind
            and r.epoch_seconds is not None
            and r.epoch_seconds <= OFFLOAD_TIME_TIE * best.epoch_seconds]
    return min(ties, key=lambda r: (r.need_bytes, r.epoch_seconds), default=best)


def _preference(r: PlanRow) -> tuple:
    """Exact before a model change before approximate; among approximate
    rows the largest core (the least pruned), then the fastest."""
    time_ = r.epoch_seconds if r.epoch_seconds is not None else math.inf
    speed = _SPEED_RANK.get(r.strategy, 3)
    if r.strategy == "distributed":
        speed += 0 if _mode_first(r) else 1
    return (_CLASS[r.kind], -float(r.knobs.get("budget_ratio", 1.0)), speed, time_,
            r.need_bytes)


def choose(table: PlanTable) -> PlanRow:
    """The pick of ``table``.

    Raises:
        ValueError: one line naming the smallest candidate and its need when
            no candidate fits the budget; where candidates under the budget
            cannot be chosen (``host_short``), one line naming them and why.
    """
    pick = table.pick or mark_table(table).pick
    if pick is not None:
        return pick
    sized = [r for r in table.rows if r.need_bytes is not None]
    if not sized:
        raise ValueError("memory_budget: no strategy could be estimated ("
                         + "; ".join(f"{r.label}: {r.why}" for r in table.rows) + ")")
    # Rows under the budget that cannot be chosen (a lower bound only, a host
    # store larger than the host's free memory): the budget is not the
    # reason, and saying "below every candidate" sent users to raise it
    held = [r for r in sized if _held(r, table.budget_bytes)]
    if held:
        by_why: dict[str, list[PlanRow]] = {}
        for r in sorted(held, key=lambda r: r.need_bytes):
            by_why.setdefault(r.host_short.removeprefix("not chosen: "), []).append(r)
        parts = [f"{why}: {rows[0].label} (~{format_bytes(rows[0].need_bytes)})"
                 + (f" and {len(rows) - 1} more" if len(rows) > 1 else "")
                 for why, rows in by_why.items()]
        hint = ("; a pinned strategy trains without a plan"
                if any(why == LOWER_BOUND for why in by_why) else "")
        raise ValueError(
            f"memory_budget={format_bytes(table.budget_bytes)}: no candidate on "
            f"{table.device} can be chosen: " + "; ".join(parts) + hint)
    low = min(sized, key=lambda r: r.need_bytes)
    over = [r.need_over for r in table.rows if r.need_over is not None]
    # (rows left out at a floor below the smallest need may need less)
    unsized = (f"; {len(over)} rows not estimated need over "
               f"{format_bytes(min(over))}" if over and min(over) < low.need_bytes
               else "")
    # a job of P processes plans the distributed modes alone: one process's
    # rows (offload, DPR's core) may still fit
    alone = ("; one process's rows (offload, DPR's core): plan without --nproc"
             if all(r.strategy == "distributed" for r in table.rows) else "")
    raise ValueError(
        f"memory_budget={format_bytes(table.budget_bytes)} is below every "
        f"candidate on {table.device}: the smallest, {low.label}, needs "
        f"~{format_bytes(low.need_bytes)}{unsized}{alone}")


def format_table(table: PlanTable) -> str:
    """The table as text: one row per candidate, then the pick."""
    head = ["strategy", "knobs", "need", "fits", "epoch", "why"]
    rows = []
    for r in table.rows:
        knobs = ", ".join(f"{k}={_knob(k, v)}" for k, v in r.knobs.items()
                          if k not in ("hidden_channels",))
        rows.append([("* " if r.chosen else "  ") + r.strategy, knobs,
                     "n/a" if r.need_bytes is None else format_bytes(r.need_bytes),
                     "?" if r.need_bytes is None else "yes" if r.fits else "no",
                     "n/a" if r.epoch_seconds is None else f"{r.epoch_seconds:.3g} s",
                     f"{r.why} ({r.detail})" if r.detail else r.why])
    widths = [max([len(h)] + [len(x[i]) for x in rows]) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
    pick = table.pick
    if table.caveat:
        lines.append(f"note: {table.caveat}")
    lines.append(f"budget {format_bytes(table.budget_bytes)} on {table.device} "
                 f"({table.calibration}); planned in {table.seconds:.1f} s; pick: "
                 + (pick.label if pick else "none fits"))
    return "\n".join(lines)


def thread_caveat(device: torch.device | str = "cpu") -> str:
    """What a plan for ``device`` in this process leaves out of MKL's
    per-thread buffer cache (:func:`leangnn.heap.mkl_buffers_cached`; empty
    when nothing): on a CPU with more than one thread each MKL worker keeps
    the buffers of its share of a matrix product, which the calibration's
    one-thread runs never hold (measured +1..+22% through ``leangnn train``
    at 2 threads; ``benchmarks/README.md``, "Threads"); on one thread in the
    compact heap, whose calibration ran with the cache off, the DAG model's
    products still keep some (2-4 MiB of its peak)."""
    from leangnn.heap import heap_mode, mkl_buffers_cached

    if torch.device(device).type != "cpu" or not mkl_buffers_cached():
        return ""
    fix = ("start with MKL_DISABLE_FAST_MM=1 (the leangnn command sets it "
           "where it starts its compact heap)")
    threads = torch.get_num_threads()
    if threads > 1:
        return (f"MKL keeps per-thread buffers on these {threads} threads, which "
                f"the estimates leave out (measured up to +22%); {fix}, or with "
                "OMP_NUM_THREADS=1")
    if heap_mode() == "compact":
        return ("MKL keeps buffers in this process, which the compact heap's "
                "calibration ran without (the DAG model's products: 2-4 MiB); "
                f"{fix}")
    return ""


def budget_caveat(budget_bytes: int, device: torch.device | str = "cpu") -> str:
    """A note when ``budget_bytes`` is above what this process could hold on
    ``device`` now (:func:`~leangnn.plan.fits.free_to_process`; empty when
    it is not, or when that is unknown): the plan may be for a larger
    machine, which is fine, but on this one a row the budget fits can run
    out of memory. (A plan
    without a budget, made for the free memory, never gets it: the figure
    counts what the plan itself took since.)"""
    from leangnn.plan.fits import free_to_process

    have = free_to_process(device)
    if have is None or budget_bytes <= have:
        return ""
    return (f"the budget is above the {format_bytes(have)} of {torch.device(device)} "
            "memory this process could use now: a row that fits the budget may "
            "not fit here")


def plan_caveat(budget_bytes: int, device: torch.device | str = "cpu") -> str:
    """:attr:`PlanTable.caveat` of a plan for ``device`` under ``budget_bytes``
    made in this process: :func:`thread_caveat` and :func:`budget_caveat`."""
    return "; ".join(c for c in (thread_caveat(device),
                                 budget_caveat(budget_bytes, device)) if c)


def _knob(key: str, value) -> str:
    if key == "device_budget" and value is not None:
        try:
            return format_bytes(parse_bytes(value, key)).replace(" ", "")
        except ValueError:
            pass
    return str(value)


def in_process_share(cal: Calibration, row: PlanRow | None) -> int:
    """What a plan made in the process that trains ``row`` took off its
    first-run constant (:meth:`~leangnn.plan.calibration.Calibration.
    in_process_share`: DPR's core trained through its CSR has its own)."""
    core = row is not None and csr_core(row.strategy, row.config)
    return round(cal.in_process_share("prune" if core else None))


def plan_summary(table: PlanTable) -> dict[str, Any]:
    """The ``plan`` entry of a planned run's ``summary.json``: the budget,
    the pick with its knobs and estimates (``estimated_run_bytes`` is what
    ``memory.peak_bytes`` measures: the peak above the loaded state;
    ``estimated_epoch_seconds`` what ``time.epoch_seconds_median`` does),
    and every row in brief."""
    pick = table.pick
    out: dict[str, Any] = {
        "memory_budget_bytes": table.budget_bytes, "device": table.device,
        "calibration": table.calibration, "plan_seconds": table.seconds,
        "in_process_bytes": table.in_process_bytes, "caveat": table.caveat,
        "pick": None if pick is None else pick.label}
    if pick is not None:
        est = pick.estimate
        out.update(strategy=pick.strategy, kind=pick.kind, knobs=dict(pick.knobs),
                   config=dict(pick.config),
                   **need_figures(pick),
                   estimated_run_bytes=None if est is None else est.costliest_run_bytes,
                   estimated_epoch_seconds=pick.epoch_seconds,
                   method=None if est is None else est.method)
        if est is not None and est.ranks:
            # per rank: ``run_bytes`` is what its ``run_peak_bytes`` measures
            out["ranks"] = [dict(r) for r in est.ranks]
    out["rows"] = [{"label": r.label, "kind": r.kind, "need_bytes": r.need_bytes,
                    "fits": r.fits, "epoch_seconds": r.epoch_seconds, "why": r.why}
                   for r in table.rows]
    return json_safe(out)


def resumed_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """A saved plan (:func:`plan_summary`) as it holds for a run resumed in a
    process of its own: where the plan was made in the process that then
    trained (``in_process_bytes``), its dry runs had paged in part of the
    run's first-run constant, which the resumed process pays within its run
    (measured: a 20 MiB auto run of GSR-8 needed 21.0 MiB resumed). The
    estimated need and run peak get that share back; ``resumed_bytes``
    records it. Unchanged where the plan was made apart.

    Raises:
        ValueError: one of those figures is not a number of bytes (a
            plan.json edited by hand), naming it and the value.
    """
    share = _plan_bytes(plan, "in_process_bytes")
    if not share:
        return plan
    out = dict(plan, in_process_bytes=0, resumed_bytes=share)
    for key in ("estimated_peak_bytes", "estimated_run_bytes"):
        if out.get(key) is not None:
            out[key] = _plan_bytes(plan, key) + share
    return out


def _plan_bytes(plan: dict[str, Any], key: str) -> int:
    value = plan.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not 0 <= value < MAX_BYTES:
        raise ValueError(f"plan.json: {key}: expected a number of bytes, got "
                         f"{value!r}")
    return int(value)


def need_figures(row: PlanRow) -> dict[str, Any]:
    """What :func:`budget_check` reads of a row: its estimated need, the
    fixed part of it, and the setup part it counts (``None`` where none)."""
    est = row.estimate
    return {"estimated_peak_bytes": row.need_bytes,
            "estimated_fixed_bytes": None if est is None else est.fixed_bytes,
            "estimated_setup_bytes": None if est is None
            else est.counted_setup_bytes or None}


def budget_check(plan: dict[str, Any], peak_bytes: int | None,
                 setup_bytes: int | None = None) -> dict[str, Any] | None:
    """A planned run's measured need against the budget it was planned for.

    The need is counted as the planner counts it: the measured peak above the
    loaded state (``memory.peak_bytes``) plus what the plan says was loaded
    before it (:func:`plan_summary`'s ``estimated_fixed_bytes``). ``None``
    for a plan without those figures or of several ranks (each rank's peak
    is in its own record). Where the plan counted a setup's resident state
    apart (``estimated_setup_bytes``: offload's engine topology) and
    ``setup_bytes`` was measured (the process's growth over the strategy's
    setup), the measured one takes its place.

    Returns:
        ``{"memory_budget_bytes", "estimated_need_bytes",
        "measured_need_bytes", "within_budget"}``, with
        ``estimated_setup_bytes`` and ``measured_setup_bytes`` where both are
        known.
    """
    fixed, budget = plan.get("estimated_fixed_bytes"), plan.get("memory_budget_bytes")
    if fixed is None or budget is None or peak_bytes is None or plan.get("ranks"):
        return None
    need = int(peak_bytes) + int(fixed)
    extra: dict[str, Any] = {}
    est_setup = plan.get("estimated_setup_bytes")
    if est_setup and setup_bytes is not None:
        need += int(setup_bytes) - int(est_setup)
        extra = {"estimated_setup_bytes": int(est_setup),
                 "measured_setup_bytes": int(setup_bytes)}
    return {"memory_budget_bytes": int(budget),
            "estimated_need_bytes": plan.get("estimated_peak_bytes"),
            "measured_need_bytes": need, "within_budget": need <= int(budget),
            **extra}


# ---------------------------------------------------------------- budgets
def resolve_budget(memory_budget, device: torch.device) -> int:
    if memory_budget is not None:
        return parse_bytes(memory_budget, "memory_budget")
    from leangnn.plan.fits import available_bytes

    have = available_bytes(device)
    if have is None:
        raise ValueError(f"memory_budget: free memory of {device} is unknown; "
                         "pass a budget, e.g. memory_budget='4GiB'")
    return have


def estimate_row(strategy: str, est: Estimate, cal: Calibration, kind: str,
                 config: dict, epochs: int | None = None) -> PlanRow:
    """The row of ``est`` for a run of ``epochs`` epochs (``None``: unknown,
    planned as long): a run longer than the calibration's peaks higher
    (:meth:`~leangnn.plan.calibration.Calibration.long_run_scale`)."""
    scales = (cal.budget_scale, cal.long_run_scale(
        long_run_families(est.strategy, est.knobs), epochs))
    need = math.ceil(est.peak_bytes * scales[0] * scales[1])
    detail = ""
    if est.ranks:
        from leangnn.plan.distributed import need_of

        # every local rank is a process of its own, each with this need
        need = need_of(est, scales, est.device)
        per = need_of(est, scales, "cuda")  # (the largest rank's)
        detail = (f"{len(est.ranks)} ranks, each <= {format_bytes(per)}"
                  + (" on one host" if torch.device(est.device).type == "cpu"
                     else " per device"))
    if not detail and est.floor_decided:
        # a need far above the live tensors: say where it comes from
        detail = "heap model: large blocks freed layer by layer fragment the heap"
    short = ""
    if est.method == "analytic":
        # a lower bound only (measured ~8x under for the dag model): a pick
        # on it could run out of the very budget it was chosen for
        short = f"not chosen: {LOWER_BOUND}"
    if est.host_bytes:
        from leangnn.plan.fits import available_bytes

        host = available_bytes("cpu")
        if host is not None and est.host_bytes > host and not short:
            short = (f"host store needs {format_bytes(est.host_bytes)} > "
                     f"{format_bytes(host)} free host memory")
    return PlanRow(strategy, dict(est.knobs), kind, need, False, est.epoch_seconds,
                   est.note, config=config, estimate=est, host_short=short,
                   detail=detail)


def unavailable_row(strategy: str, knobs: dict, why: str,
                    kind: str = "exact") -> PlanRow:
    return PlanRow(strategy, knobs, kind, None, False, None, why)


# ------------------------------------------------------------ configurations
def offload_budgets(budget_bytes: int, device: torch.device | str | None = None
                    ) -> list[int]:
    """The device budgets offload rows try under a memory budget on
    ``device`` (:data:`CPU_DEVICE_SHARES` of it on a CPU, all of it on CUDA)."""
    if device is not None and torch.device(device).type != "cpu":
        return [int(budget_bytes)]
    return [int(budget_bytes * f) for f in CPU_DEVICE_SHARES]


def candidates(cfg, budget_bytes: int, device: torch.device | str | None = None,
               pinned: dict | None = None, nproc: int | None = None
               ) -> list[tuple[str, dict, str]]:
    """``(strategy, config fields, kind)`` of every row tried for ``cfg`` on
    ``device`` (default ``cfg.device``); the knobs in ``pinned``
    (:data:`PINNABLE`, e.g. ``{"num_groups": 4}``) take that value alone.
    With ``nproc`` above 1, the rows of a job of that many processes: the
    ``distributed`` strategy in each of its modes
    (:mod:`leangnn.plan.distributed`)."""
    from leangnn.nn.models import get_model

    pinned = dict(pinned or {})
    unknown = sorted(set(pinned) - set(PINNABLE))
    if unknown:
        raise ValueError(f"pinned: unknown knob(s) {unknown}; expected some of "
                         f"{list(PINNABLE)}")
    # the configuration's own checks (a group count that splits a reversible
    # model's hidden size, a ratio in (0, 1], ...); the device budget is
    # read below, as the rows carry it
    replace(cfg, **{k: v for k, v in pinned.items() if k != "device_budget"})
    groups = (pinned["num_groups"],) if "num_groups" in pinned else GROUPS
    parts_grid = (pinned["num_parts"],) if "num_parts" in pinned else OFFLOAD_PARTS
    ratios = (pinned["budget_ratio"],) if "budget_ratio" in pinned else CORE_RATIOS
    dev_budgets = ([parse_bytes(pinned["device_budget"], "--device-budget")]
                   if "device_budget" in pinned
                   else offload_budgets(budget_bytes, device or cfg.device))
    if nproc is not None and (not isinstance(nproc, int) or nproc < 1):
        raise ValueError(f"--nproc: expected a positive number of processes, got "
                         f"{nproc!r}")
    if nproc is not None and nproc > 1:
        from leangnn.plan.distributed import PLANNED_MODES

        fixed = {k: v for k, v in pinned.items() if k == "num_groups"}
        mode = pinned.get("dist_mode", "auto")
        return [("distributed", {"strategy": "distributed", "model": cfg.model,
                                 "dist_mode": m, **fixed}, "exact")
                for m in (PLANNED_MODES if mode == "auto" else (mode,))]
    entry = get_model(cfg.model)
    out: list[tuple[str, dict, str]] = []
    if entry.reversible:
        for g in groups:
            if cfg.hidden_channels % g == 0:
                out.append(("reversible", {"strategy": "reversible",
                                           "model": cfg.model, "num_groups": g},
                            "exact"))
    else:
        out.append(("full", {"strategy": "full", "model": cfg.model}, "exact"))
        if cfg.model == "res":
            for g in groups:
                if cfg.hidden_channels % g == 0:
                    out.append(("reversible", {"strategy": "reversible",
                                               "model": "gsr", "num_groups": g},
                                "model change"))
    if "layerwise" in entry.capabilities:
        for dev_budget in dev_budgets:
            for parts in parts_grid:
                out.append(("offload", {"strategy": "offload", "model": cfg.model,
                                        "device_budget": str(dev_budget),
                                        "num_parts": parts}, "exact"))
    if "dag" not in entry.capabilities:
        # DPR's core keeps no circuit levels to sweep (see TrainConfig)
        for ratio in ratios:
            out.append(("prune", {"strategy": "prune", "model": cfg.model,
                                  "budget_ratio": ratio}, "approximate"))
    return out


def plan_candidates(cfg, budget_bytes: int, device=None,
                    strategies: tuple[str, ...] | None = None,
                    pinned: dict | None = None, nproc: int | None = None
                    ) -> list[tuple[str, dict, str]]:
    """:func:`candidates` of ``strategies`` alone; a ``ValueError`` naming
    the strategy and the model when none is left (before any graph loads)."""
    todo = [c for c in candidates(cfg, budget_bytes, device, pinned, nproc)
            if strategies is None or c[0] in strategies]
    if not todo and "distributed" in (strategies or ()):
        raise ValueError("--strategy distributed: plan it with --nproc P (the "
                         f"job's processes), got --nproc {nproc}")
    if not todo:
        rows = sorted({c[0] for c in candidates(cfg, budget_bytes, device,
                                                nproc=nproc)})
        raise ValueError(f"--strategy {','.join(strategies or ())}: no "
                         f"configuration of model {cfg.model!r} to plan with it "
                         f"(the planner's rows for {cfg.model!r}: {rows})")
    return todo


def plan_config(cfg, splits, memory_budget=None, device=None,
                calibration: Calibration | None = None,
                strategies: tuple[str, ...] | None = None,
                lazy: bool = False, pinned: dict | None = None,
                nproc: int | None = None, in_process: bool = False,
                progress: bool = False) -> PlanTable:
    """Plan ``cfg``'s model (its ``model``, ``num_layers``, ``hidden_channels``
    and options; its ``strategy`` is ignored) on ``splits``' training graphs.

    Args:
        cfg (TrainConfig): the base configuration.
        splits (GraphSplits): the loaded graphs.
        memory_budget (int or str, optional): e.g. ``"4GiB"``; default: the
            device's free memory now.
        device (str, optional): default ``cfg.device``.
        calibration (Calibration, optional): default: this machine's.
        strategies (tuple of str, optional): only these strategies' rows.
        lazy (bool, optional): estimate only what the pick needs (for
            ``--strategy auto``): exact rows first, and no further once full
            batch fits; a model change only when no exact row fits; DPR's
            cores only when nothing else does. Rows left out say so.
            (default: ``False``, every row: the table ``leangnn plan`` prints)
        pinned (dict, optional): knobs the user fixed (:data:`PINNABLE`:
            ``--groups``, ``--device-budget``, ``--parts``, ``--budget-ratio``),
            tried at that value alone. (default: ``None``, the whole grid)
        nproc (int, optional): plan a job of this many local processes: the
            ``distributed`` rows, each rank's need estimated (summed on a
            CPU, whose memory the ranks share). (default: ``None``, one
            process)
        in_process (bool, optional): the pick trains in this process next
            (``leangnn train --strategy auto``): the plan's dry runs have
            paid part of its first-run constant
            (:meth:`~leangnn.plan.calibration.Calibration.in_process`).
            (default: ``False``)
        progress (bool, optional): a tqdm bar over the rows on stderr (a
            large graph's DPR cores and partitions take minutes).
            (default: ``False``)

    Returns:
        PlanTable: rows marked, the pick ``chosen`` (none when nothing fits;
        :func:`choose` then raises).
    """
    t0 = time.perf_counter()
    dev = torch.device(device or cfg.device)
    budget = resolve_budget(memory_budget, dev)
    cal = calibration or load_calibration(dev)
    planned_cal = cal
    if in_process:
        cal = cal.in_process()
    todo = plan_candidates(cfg, budget, dev, strategies, pinned, nproc)
    if len(splits.train) > 1:
        # the preferred mode first (:func:`_mode_first`): planned lazily, the
        # other is left out once it fits
        todo.sort(key=lambda c: c[1].get("dist_mode") == "graph")
    # the rows share the graph's hash and adjacency, and offer what they
    # build for training to the pick
    with plan_scope():
        rows = _estimate_rows(cfg, todo, budget, dev, splits, cal, lazy, nproc,
                              progress)
    table = PlanTable([r for r in rows if r is not None], budget, str(dev),
                      calibration_label(cal), caveat=plan_caveat(budget, dev))
    mark_table(table)
    if in_process:
        table.in_process_bytes = in_process_share(planned_cal, table.pick)
    # what the rows share is dropped; what they built for training (DPR's
    # core, the offload engine's graph) is kept for the pick alone, which
    # ``--strategy auto`` trains next
    keep = None
    if table.pick is not None:
        try:
            keep = table.pick.apply(replace(cfg, device=str(dev)))
        except (TypeError, ValueError):  # not a TrainConfig: nothing trains next
            keep = None
    forget(keep=keep)
    table.seconds = time.perf_counter() - t0
    return table


def _estimate_rows(cfg, todo: list, budget: int, dev: torch.device, splits,
                   cal: Calibration, lazy: bool, nproc: int | None = None,
                   progress: bool = False) -> list[PlanRow | None]:
    """The rows of ``todo`` (:func:`candidates`), lazily or all."""
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), desc="plan", unit="row", disable=not progress,
              leave=False) as bar:
        return _rows(cfg, todo, budget, dev, splits, cal, lazy, nproc, bar)


def _rows(cfg, todo: list, budget: int, dev: torch.device, splits,
          cal: Calibration, lazy: bool, nproc: int | None, bar
          ) -> list[PlanRow | None]:
    rows: list[PlanRow | None] = [None] * len(todo)
    done = False
    core_fits: float | None = None  # the largest core ratio found to fit
    # what every offload row of a device budget up to [1] needs at least (CPU)
    floor: tuple[int, int] | None = None
    for cls in sorted({_CLASS[k] for _, _, k in todo}):
        for i, (strategy, fields, kind) in enumerate(todo):
            if _CLASS[kind] != cls:
                continue
            if done or (lazy and kind == "approximate" and core_fits is not None
                        and fields.get("budget_ratio", 0.0) < core_fits):
                # (approximate rows: the largest core that fits is the pick,
                # so no smaller one needs an estimate)
                knobs = {k: v for k, v in fields.items() if k != "strategy"}
                rows[i] = unavailable_row(strategy, knobs, LAZY_WHY, kind)
                bar.update()
                continue
            if (strategy == "offload" and floor is not None and floor[0] > budget
                    and _pool(fields) <= floor[1]):
                knobs = {k: v for k, v in fields.items() if k != "strategy"}
                rows[i] = unavailable_row(
                    strategy, knobs, "not estimated: needs over "
                    f"{format_bytes(floor[0])} > budget {format_bytes(budget)} (the "
                    "graph and host store every offload row of this device "
                    "budget or less holds)", kind)
                rows[i].need_over = floor[0]
                bar.update()
                continue
            bar.set_postfix_str(strategy)
            rows[i] = _row(cfg, strategy, fields, kind, dev, splits, cal, nproc)
            bar.update()
            r = rows[i]
            if strategy == "offload" and dev.type == "cpu" and floor is None:
                low = offload_floor(r.estimate, cal)
                floor = None if low is None else (low, _pool(fields))
            fits = row_fits(r, budget)
            if not fits and strategy == "prune" and r.estimate is not None:
                # never the pick: its core need not wait for training
                withdraw(replace(cfg, **fields))
            if lazy and fits and (_SPEED_RANK.get(strategy) == 0 and dev.type != "cpu"
                                  or strategy == "distributed" and _mode_first(r)):
                # full batch fits: nothing exact is faster (on a CPU an
                # offload row can be, CPU_TIME_MARGIN: the exact rows are
                # all estimated); the distributed mode that communicates
                # least fits: none is preferred
                done = True
            if fits and kind == "approximate":
                ratio = float(fields.get("budget_ratio", 0.0))
                core_fits = max(core_fits or 0.0, ratio)
        if lazy and any(r is not None and row_fits(r, budget) for r in rows):
            done = True
    return rows


def _pool(fields: dict) -> int:
    """A row's device budget in bytes (the offload strategy's default without
    one, as its estimate takes it)."""
    from leangnn.offload.strategy import DEFAULT_BUDGET

    return parse_bytes(fields.get("device_budget") or DEFAULT_BUDGET,
                       "device_budget")


def offload_floor(est, cal: Calibration) -> int | None:
    """A lower bound on the need of the offload rows of ``est``'s graph and
    model on a CPU with a device budget up to ``est``'s, whatever their part
    count: ``est``'s need with the step cut to what every such row's holds
    at its peak, the host store
    (:func:`~leangnn.plan.estimate.host_floor_bytes`: the same for every
    part count, and no smaller for a smaller device budget, whose pool holds
    fewer rows), and no device pool, job or setup bytes (the calibrated need
    grows with each). A budget below it skips the rows whose schedules a
    tiny device budget makes slow to build (csbm:50000 GAT-2 under 1 MiB:
    34k chunks, a minute)."""
    if est is None or "host_floor_bytes" not in (est.work or {}):
        return None
    host = est.work["host_floor_bytes"]
    low = replace(est, step_bytes=max(0, host - est.model_bytes),
                  setup_bytes=est.work.get("setup_floor_bytes", 0),
                  later_run_bytes=None, later=None,
                  work={**est.work, "device_bytes": 0, "edge_job_bytes": 0,
                        "host_bytes": host})
    cal.apply(low)
    return math.floor(low.peak_bytes * cal.budget_scale)


def _row(cfg, strategy: str, fields: dict, kind: str, dev: torch.device, splits,
         cal: Calibration, nproc: int | None = None) -> PlanRow:
    try:
        c = replace(cfg, **fields, device=str(dev))
    except ValueError as e:
        return unavailable_row(strategy, fields, str(e), kind)
    try:
        if strategy == "distributed":
            from leangnn.plan.distributed import estimate_distributed

            est = estimate_distributed(c, splits, nproc, fields["dist_mode"], dev,
                                       cal)
        else:
            est = estimate_config(c, splits, dev, cal)
    except (ValueError, RuntimeError) as e:  # e.g. budget below one job
        knobs = {k: v for k, v in fields.items() if k != "strategy"}
        if strategy == "distributed":
            knobs["nproc"] = nproc
        return unavailable_row(strategy, knobs,
                               f"not possible: {str(e).splitlines()[0]}", kind)
    return estimate_row(strategy, est, cal, kind, fields, cfg.epochs)
