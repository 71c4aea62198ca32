"""The planner: rows, the pick, its errors and training through the pick."""

from __future__ import annotations

import json

import pytest
import torch
from torch_geometric.nn import GCN

from leangnn.config import TrainConfig
from leangnn.data import GraphSplits, with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.plan.calibration import Calibration
from leangnn.plan.estimate import default_loss, estimate_config
from leangnn.plan.planner import (
    CPU_DEVICE_SHARES,
    candidates,
    choose,
    format_table,
    offload_budgets,
    plan_config,
)
from leangnn.plan.user import fit, plan

#: tensor bytes as measured (no allocator overhead), so needs are exact sums
EXACT = Calibration("test", "glibc-mmap", calibrated=True)


@pytest.fixture(scope="module")
def splits():
    g = contextual_sbm(400, avg_degree=8.0, in_channels=8, seed=4)
    c = int(g.y.max()) + 1
    return GraphSplits([with_mask(g, g.train_mask)], [with_mask(g, g.val_mask)],
                       [with_mask(g, g.test_mask)], "classification", c)


@pytest.fixture(scope="module")
def res_cfg():
    return TrainConfig(model="res", num_layers=3, hidden_channels=8)


@pytest.fixture(scope="module")
def roomy(res_cfg, splits):
    return plan_config(res_cfg, splits, "1GiB", calibration=EXACT,
                       strategies=("full", "reversible"))


def test_rows_carry_the_estimates(roomy, res_cfg, splits):
    rows = {(r.strategy, r.knobs.get("num_groups")): r for r in roomy.rows}
    assert set(rows) == {("full", None), ("reversible", 2), ("reversible", 4)}
    full = rows["full", None]
    ref = estimate_config(res_cfg, splits, calibration=EXACT)
    assert full.need_bytes == ref.peak_bytes and full.kind == "exact"
    gsr = rows["reversible", 2]
    assert gsr.kind == "model change" and gsr.config["model"] == "gsr"
    # reversible activations do not grow with depth: it needs less
    assert gsr.need_bytes < full.need_bytes


def test_pick_prefers_exact_then_fastest(roomy):
    pick = roomy.pick
    assert pick is not None and pick.strategy == "full" and pick.chosen
    assert choose(roomy) is pick
    assert all(r.why for r in roomy.rows)
    text = format_table(roomy)
    assert text.count("\n") == len(roomy.rows) + 1 and "pick: full(" in text
    d = json.loads(roomy.to_json())
    assert d["pick"] == pick.label and len(d["rows"]) == 3
    assert d["rows"][0]["estimate"]["step_bytes"] > 0


def test_tight_budget_picks_what_fits(roomy, res_cfg):
    needs = {(r.strategy, r.knobs.get("num_groups")): r.need_bytes
             for r in roomy.rows}
    budget = (needs["reversible", 2] + needs["full", None]) // 2
    table = roomy.with_budget(budget)
    assert roomy.pick.strategy == "full"  # the original is untouched
    pick = choose(table)
    assert pick.strategy == "reversible" and pick.need_bytes <= budget
    assert not next(r for r in table.rows if r.strategy == "full").fits
    cfg = pick.apply(res_cfg)
    assert (cfg.strategy, cfg.model) == ("reversible", "gsr")
    assert cfg.num_layers == res_cfg.num_layers


def test_a_pick_that_trains_in_the_planning_process_pays_less_first_run(
        res_cfg, splits):
    # what the plan's dry runs paged in is not the run's to pay again
    # (leangnn train --strategy auto); a plan for another process keeps it
    from dataclasses import replace

    cal = replace(EXACT, const=6e6, family_consts={"res": 9e6},
                  in_process_bytes=4e6)
    apart = plan_config(res_cfg, splits, "1GiB", calibration=cal,
                        strategies=("full",))
    here = plan_config(res_cfg, splits, "1GiB", calibration=cal,
                       strategies=("full",), in_process=True)
    assert apart.pick.label == here.pick.label
    ref = estimate_config(res_cfg, splits, calibration=EXACT)
    assert apart.pick.estimate.run_bytes == ref.run_bytes + 9e6
    assert here.pick.estimate.run_bytes == ref.run_bytes + 5e6
    assert cal.in_process_bytes == 4e6  # the caller's calibration unchanged


def test_budget_below_every_candidate_is_one_line(roomy, res_cfg, splits):
    smallest = min(r.need_bytes for r in roomy.rows)
    table = roomy.with_budget(smallest - 1)
    assert table.pick is None
    with pytest.raises(ValueError) as e:
        choose(table)
    msg = str(e.value)
    assert "\n" not in msg and "smallest" in msg and "reversible(" in msg
    with pytest.raises(ValueError, match="memory_budget"):
        plan_config(res_cfg, splits, "lots", calibration=EXACT)


def test_prune_rows_shrink_with_the_core(res_cfg, splits):
    table = plan_config(res_cfg.__class__(model="sage", num_layers=2,
                                          hidden_channels=16), splits, "1GiB",
                        calibration=EXACT, strategies=("full", "prune"))
    prune = [r for r in table.rows if r.strategy == "prune"]
    needs = [r.need_bytes for r in sorted(prune, key=lambda r:
                                          -r.knobs["budget_ratio"])]
    assert needs == sorted(needs, reverse=True) and len(needs) == 3
    assert table.pick.strategy == "full"  # exact beats approximate
    assert all(r.kind == "approximate" for r in prune)
    # nothing exact fits: the largest core that does, not the fastest
    half = next(r for r in prune if r.knobs["budget_ratio"] == 0.5)
    tight = table.with_budget(half.need_bytes)
    assert tight.pick.knobs["budget_ratio"] == 0.5
    assert "smaller core" in next(r.why for r in tight.rows
                                  if r.knobs.get("budget_ratio") == 0.1)


def test_plan_and_fit_a_user_model(splits):
    g = splits.train[0]
    torch.manual_seed(0)
    model = GCN(g.num_features, 16, 2, splits.out_channels)
    table = plan(model, g, "1GiB", calibration=EXACT,
                 strategies=("full", "prune"))
    assert [r.strategy for r in table.rows] == ["full", "prune", "prune", "prune"]
    assert table.pick.strategy == "full"
    loss_fn = default_loss(g)
    with torch.no_grad():
        before = float(loss_fn(model(g.x, g.edge_index), g))
    out = fit(model, g, strategy="full", memory_budget="1GiB", epochs=20, lr=0.02)
    assert out["row"].strategy == "full" and len(out["losses"]) == 20
    with torch.no_grad():
        after = float(loss_fn(model(g.x, g.edge_index), g))
    assert after < before
    with pytest.raises(ValueError, match="needs"):
        fit(model, g, strategy="full", memory_budget=1024, epochs=1)
    with pytest.raises(ValueError, match="strategy"):
        fit(model, g, strategy="fastest", epochs=1)


def test_lazy_plan_estimates_only_what_the_pick_needs(roomy, res_cfg, splits):
    # --strategy auto: full batch fits, so nothing else can be picked and
    # nothing else is estimated; the pick is the full table's
    lazy = plan_config(res_cfg, splits, "1GiB", calibration=EXACT,
                       strategies=("full", "reversible"), lazy=True)
    assert lazy.pick.label == roomy.pick.label
    # (a dry run repeated in one process may move by a freed gradient)
    assert lazy.pick.need_bytes == pytest.approx(roomy.pick.need_bytes, rel=0.02)
    rest = [r for r in lazy.rows if not r.chosen]
    assert rest and all(r.need_bytes is None and "not estimated" in r.why
                        for r in rest)
    # below full batch's need the model change is estimated and picked (the
    # full table judged against the same budget picks it too)
    budget = (roomy.pick.need_bytes + min(r.need_bytes for r in roomy.rows)) // 2
    tight = plan_config(res_cfg, splits, budget, calibration=EXACT,
                        strategies=("full", "reversible"), lazy=True)
    assert roomy.with_budget(budget).pick.strategy == "reversible"
    assert tight.pick.strategy == "reversible" and tight.pick.need_bytes <= budget
    assert all(r.need_bytes is not None for r in tight.rows)


def test_lazy_plan_stops_at_the_largest_core_that_fits(res_cfg, splits):
    # nothing exact fits: DPR's largest fitting core is the pick, so smaller
    # cores are not estimated; the full table judged the same picks it too
    full = plan_config(res_cfg, splits, "1GiB", calibration=EXACT,
                       strategies=("prune",))
    needs = {r.knobs["budget_ratio"]: r.need_bytes for r in full.rows}
    assert needs[0.5] > needs[0.3] > needs[0.1]
    budget = (needs[0.5] + needs[0.3]) // 2
    lazy = plan_config(res_cfg, splits, budget, calibration=EXACT,
                       strategies=("prune",), lazy=True)
    assert lazy.pick.label == full.with_budget(budget).pick.label
    assert lazy.pick.knobs["budget_ratio"] == 0.3
    skipped = [r for r in lazy.rows if r.knobs["budget_ratio"] == 0.1]
    assert skipped and skipped[0].need_bytes is None
    assert "not estimated" in skipped[0].why
    # of the cores the plan selected, the pick's alone is kept for training
    from leangnn.prune import dpr

    assert [json.loads(o[1])["budget_ratio"] for o in dpr._OFFERS
            if o[0].matches(splits.train[0])] == [0.3]
    dpr.withdraw_offers()


@pytest.mark.parametrize("want", ["prune", "offload"])
def test_auto_run_trains_what_the_pick_alone_trains(want, tmp_path, monkeypatch):
    """`leangnn train --strategy auto` takes over what planning built for its
    pick (DPR's core, the offload engine's graph structures) and trains
    exactly what `--strategy <pick>` trains with the same seed."""
    from leangnn.cli import main
    from leangnn.data import load_graphs
    from leangnn.offload import engine
    from leangnn.prune import dpr
    from leangnn.train import Trainer

    # (wide enough that an offload row needs less than full batch in
    # either heap: at 16 channels the compact heap's full batch needs less)
    args = ["--dataset", "csbm:3000", "--model", "gcn", "--layers", "3",
            "--hidden", "64", "--epochs", "3", "--seed", "3", "--quiet"]
    cfg = TrainConfig(dataset="csbm:3000", strategy="auto", model="gcn",
                      num_layers=3, hidden_channels=64, epochs=3, seed=3)
    splits = load_graphs(cfg, progress=False)
    # a budget whose pick is `want` under this machine's calibration: one of
    # that strategy's rows' own needs (a fixed list of budgets missed every
    # offload pick once the need margin grew)
    # (planned as the command plans: in the process that trains)
    table = plan_config(cfg, splits, "1GiB", in_process=True)
    needs = sorted({r.need_bytes for r in table.rows
                    if r.strategy == want and r.need_bytes})
    budget = None
    for need in needs:
        pick = plan_config(cfg, splits, need, lazy=True, in_process=True).pick
        if pick is not None and pick.strategy == want:
            budget = str(need)
            break
    assert budget is not None, f"no row's need picks {want}: {needs}"
    dpr.withdraw_offers()  # (offered for these splits, not the run's)
    engine.withdraw_offers()
    taken, hits = [], []
    for mod in (dpr, engine):
        real = mod._take_offer if mod is dpr else mod._offered

        def spy(*a, _real=real, **k):
            hit = _real(*a, **k)
            taken.append(hit is not None)
            hits.append(hit)
            return hit

        monkeypatch.setattr(mod, "_take_offer" if mod is dpr else "_offered", spy)
    import contextlib

    import leangnn.train

    @contextlib.contextmanager
    def no_growth(release):  # the setup's measured growth, held at zero
        yield {"bytes": 0}

    monkeypatch.setattr(leangnn.train, "resident_growth", no_growth)
    auto = tmp_path / "auto"
    assert main(["train", *args, "--strategy", "auto", "--memory-budget", budget,
                 "--out", str(auto)]) == 0
    assert any(taken)  # the pick took what its row built
    resolved = json.loads((auto / "config.json").read_text())
    assert resolved["strategy"] == want
    # the pick alone, in the same process, with nothing offered
    dpr.withdraw_offers()
    engine.withdraw_offers()
    taken.clear()
    resolved.update(out=str(tmp_path / "pick"), memory_budget=None)
    Trainer(TrainConfig.from_dict(resolved), progress=False).fit()
    assert not any(taken)

    def metrics(run):
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text()
                .splitlines()
                if x]

    a, p = metrics(auto), metrics(tmp_path / "pick")
    assert [(m["train_loss"], m["val"]) for m in a] == \
        [(m["train_loss"], m["val"]) for m in p]
    sa = json.loads((auto / "summary.json").read_text())
    sp = json.loads((tmp_path / "pick" / "summary.json").read_text())
    assert sa["metrics"] == sp["metrics"]  # test and validation
    assert sa.get("core_reused") is (True if want == "prune" else None)
    if want == "offload":
        # the structures the plan built are counted in the run's setup (its
        # measured growth left them out): budget_check sees them
        _, _, csr, degree, parts = next(h for h in hits if h is not None)
        built = sum(t.untyped_storage().nbytes() for t in
                    (csr.col, csr.rowptr, csr.weight, degree,
                     *(p.part for p in parts.values())) if t is not None)
        assert sa["memory"]["setup_bytes"] == built > 0
        assert sa["budget_check"]["measured_setup_bytes"] == \
            sa["memory"]["setup_bytes"]


def test_offload_rows_try_shares_of_the_budget_on_a_cpu_only():
    # one memory on a CPU: the pool may take part of the budget; on CUDA the
    # host store is elsewhere and the pool is the whole budget
    assert offload_budgets(1000, "cpu") == [int(1000 * f) for f in CPU_DEVICE_SHARES]
    assert offload_budgets(1000, "cuda") == [1000]
    cfg = TrainConfig(dataset="csbm:2000", model="sage", num_layers=2)
    rows = [f for s, f, _ in candidates(cfg, 4096, "cpu") if s == "offload"]
    assert sorted({int(f["device_budget"]) for f in rows}) == [1024, 2048, 4096]
    rows = [f for s, f, _ in candidates(cfg, 4096, "cuda") if s == "offload"]
    assert {f["device_budget"] for f in rows} == {"4096"}


def test_pinned_knobs_take_one_value_and_are_checked():
    cfg = TrainConfig(dataset="csbm:2000", model="res", num_layers=2,
                      hidden_channels=8)
    rows = candidates(cfg, 4096, "cpu", pinned={"num_groups": 4, "num_parts": 8,
                                                "budget_ratio": 0.2,
                                                "device_budget": "1KiB"})
    assert [f["num_groups"] for s, f, _ in rows if s == "reversible"] == [4]
    assert [f["budget_ratio"] for s, f, _ in rows if s == "prune"] == [0.2]
    sage = TrainConfig(dataset="csbm:2000", model="sage", num_layers=2)
    rows = candidates(sage, 4096, "cpu", pinned={"num_parts": 8,
                                                 "device_budget": "1KiB"})
    assert [(f["device_budget"], f["num_parts"]) for s, f, _ in rows
            if s == "offload"] == [("1024", 8)]
    with pytest.raises(ValueError, match="num_groups must be a positive divisor "
                                         "of hidden_channels=8, got 3"):
        candidates(cfg, 4096, "cpu", pinned={"num_groups": 3})
    with pytest.raises(ValueError, match="budget_ratio: expected a ratio"):
        candidates(cfg, 4096, "cpu", pinned={"budget_ratio": 2.0})
    # a group count matters only where a reversible row is tried
    assert candidates(TrainConfig(model="sage", hidden_channels=32), 4096, "cpu",
                      pinned={"num_groups": 3})
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['lr'\]"):
        candidates(cfg, 4096, "cpu", pinned={"lr": 0.1})


def test_budget_check_counts_the_need_as_the_planner_does():
    from leangnn.plan.planner import budget_check

    plan = {"memory_budget_bytes": 100, "estimated_peak_bytes": 90,
            "estimated_fixed_bytes": 30}
    assert budget_check(plan, 70) == {
        "memory_budget_bytes": 100, "estimated_need_bytes": 90,
        "measured_need_bytes": 100, "within_budget": True}
    assert budget_check(plan, 71)["within_budget"] is False
    # nothing to judge: a plan of several ranks, an old plan, no measurement
    assert budget_check({**plan, "ranks": [{}]}, 70) is None
    assert budget_check({"memory_budget_bytes": 100}, 70) is None
    assert budget_check(plan, None) is None
    # a setup the plan counted apart (offload's engine): the measured one
    # takes its place; without an estimate of it, the measured growth is not
    # added again (DPR's core is in the fixed bytes already)
    off = {**plan, "estimated_setup_bytes": 10}
    check = budget_check(off, 70, setup_bytes=15)
    assert check["measured_need_bytes"] == 105 and not check["within_budget"]
    assert check["estimated_setup_bytes"] == 10
    assert check["measured_setup_bytes"] == 15
    assert budget_check(plan, 70, setup_bytes=15)["measured_need_bytes"] == 100


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL")
def test_a_plan_says_when_mkl_keeps_thread_buffers_it_leaves_out(monkeypatch, splits):
    from leangnn.heap import compact_heap_env
    from leangnn.plan.planner import plan_summary, thread_caveat

    monkeypatch.delenv("MKL_DISABLE_FAST_MM", raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    said = thread_caveat("cpu")
    assert "MKL_DISABLE_FAST_MM=1" in said and "2 threads" in said
    assert thread_caveat("cuda") == ""
    cfg = TrainConfig(model="sage", num_layers=2, hidden_channels=8)
    table = plan_config(cfg, splits, "1GiB", strategies=("full",), lazy=True)
    lines = format_table(table).splitlines()
    assert table.caveat == said and lines[-2] == f"note: {said}"
    assert lines[-1].endswith(f"pick: {table.pick.label}")  # the pick stays last
    assert plan_summary(table)["caveat"] == said
    # the command's environment, or one thread: nothing left out
    monkeypatch.setenv("MKL_DISABLE_FAST_MM", "1")
    assert thread_caveat("cpu") == ""
    monkeypatch.delenv("MKL_DISABLE_FAST_MM")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert thread_caveat("cpu") == ""  # the default heap's calibration kept it too
    # the compact heap's calibration ran with the cache off
    monkeypatch.setenv("GLIBC_TUNABLES", compact_heap_env({})["GLIBC_TUNABLES"])
    assert "ran without" in thread_caveat("cpu")
    monkeypatch.delenv("GLIBC_TUNABLES")
    table = plan_config(cfg, splits, "1GiB", strategies=("full",), lazy=True)
    assert table.caveat == "" and "note:" not in format_table(table)


def test_a_plan_says_when_its_budget_is_above_what_the_device_has_free(
        monkeypatch, splits):
    import leangnn.plan.fits as fits
    import leangnn.profile as profile
    from leangnn.plan.fits import free_to_process
    from leangnn.plan.planner import budget_caveat, plan_summary, resolve_budget

    monkeypatch.setenv("MKL_DISABLE_FAST_MM", "1")  # (no thread caveat beside it)
    monkeypatch.setattr(fits, "available_bytes", lambda device: 3 << 30)
    monkeypatch.setattr(profile, "rss_bytes", lambda: 1 << 30)
    assert free_to_process("cpu") == 4 << 30  # free, and what this process holds
    assert budget_caveat(4 << 30, "cpu") == ""
    said = budget_caveat((4 << 30) + 1, "cpu")
    assert said == ("the budget is above the 4.0 GiB of cpu memory this process "
                    "could use now: a row that fits the budget may not fit here")
    cfg = TrainConfig(model="sage", num_layers=2, hidden_channels=8)
    table = plan_config(cfg, splits, "1TiB", strategies=("full",), lazy=True)
    lines = format_table(table).splitlines()
    assert table.caveat == said and lines[-2] == f"note: {said}"
    assert plan_summary(table)["caveat"] == said
    # a plan for a larger machine is still made, and its pick is the same
    small = plan_config(cfg, splits, "1GiB", strategies=("full",), lazy=True)
    assert small.caveat == "" and small.pick.label == table.pick.label
    assert table.with_budget("1GiB").caveat == ""
    assert small.with_budget("1TiB").caveat == said
    # a plan for the free memory: what it loads and builds meanwhile is its
    # own, so free memory falling by as much says nothing
    budget = resolve_budget(None, torch.device("cpu"))
    monkeypatch.setattr(fits, "available_bytes", lambda device: budget - (200 << 20))
    monkeypatch.setattr(profile, "rss_bytes", lambda: 200 << 20)
    assert plan_config(cfg, splits, budget, strategies=("full",)).caveat == ""
    # unknown free memory: nothing to say
    monkeypatch.setattr(fits, "available_bytes", lambda device: None)
    assert budget_caveat(1 << 50, "cpu") == ""


def test_a_resumed_run_pays_what_its_plan_in_process_had_paid():
    from leangnn.plan.planner import budget_check, resumed_plan

    plan = {"memory_budget_bytes": 100, "estimated_peak_bytes": 90,
            "estimated_fixed_bytes": 30, "estimated_run_bytes": 60,
            "in_process_bytes": 0}
    assert resumed_plan(plan) is plan  # planned apart: nothing changes
    again = resumed_plan({**plan, "in_process_bytes": 12})
    assert (again["estimated_peak_bytes"], again["estimated_run_bytes"]) == (102, 72)
    assert (again["in_process_bytes"], again["resumed_bytes"]) == (0, 12)
    assert resumed_plan(again) == again  # its share is counted once
    assert budget_check(again, 70)["estimated_need_bytes"] == 102
    # a plan written before the share was recorded
    old = {k: v for k, v in plan.items() if k != "in_process_bytes"}
    assert resumed_plan(old) is old
    # a plan.json edited by hand: one error naming the figure and the value
    for bad in ("x", float("nan"), -5, 1e300, True):
        with pytest.raises(ValueError, match=r"plan.json: in_process_bytes: "
                                             r"expected a number of bytes, got"):
            resumed_plan({**plan, "in_process_bytes": bad})
    with pytest.raises(ValueError, match="estimated_run_bytes: expected"):
        resumed_plan({**plan, "in_process_bytes": 12, "estimated_run_bytes": "7"})


def test_offload_need_counts_the_engines_setup(splits):
    # the engine's topology (edges by target, chunks, partition) is built
    # before the meter starts and stays: part of the need on a CPU, the
    # real engine's distinct storages
    from leangnn.nn.models import build_model
    from leangnn.offload import OffloadEngine, OffloadOptions

    cfg = TrainConfig(strategy="offload", model="gcn", num_layers=2,
                      hidden_channels=8, device_budget="1MiB", num_parts=4)
    est = estimate_config(cfg, splits, calibration=EXACT)
    g = splits.train[0]
    eng = OffloadEngine(build_model("gcn", splits.in_channels, 8,
                                    splits.out_channels, 2), g,
                        options=OffloadOptions("1MiB", 4))
    seen, real = set(), 0
    tensors = [eng.csr.col, eng.csr.rowptr, eng.csr.weight, eng.degree,
               eng.partition.part]
    for c in eng.sched.chunks:
        tensors += [c.edge_index, c.edge_weight, c.sources, c.targets]
    for t in tensors:
        if t is not None and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            real += t.untyped_storage().nbytes()
    assert est.setup_bytes == real > 0
    assert est.fixed_bytes == est.model_bytes + est.graph_bytes + real


@pytest.mark.parametrize("device,offload_s,picked", [
    ("cpu", 0.8, "offload"),  # clearly faster on a CPU: the one memory
    ("cpu", 0.95, "full"),  # within the margin: full batch, nothing recomputed
    ("cuda", 0.5, "full"),  # copies over the bus, time not calibrated there
])
def test_a_cpu_pick_is_the_clearly_faster_exact_row(device, offload_s, picked):
    from leangnn.plan.planner import CPU_TIME_MARGIN, PlanRow, PlanTable, mark_table

    assert 0 < CPU_TIME_MARGIN < 1
    rows = [PlanRow("full", {"model": "sage"}, need_bytes=90, epoch_seconds=1.0),
            PlanRow("offload", {"model": "sage", "num_parts": 4}, need_bytes=60,
                    epoch_seconds=offload_s),
            # (slower than a tie: see the next test)
            PlanRow("offload", {"model": "sage", "num_parts": 8}, need_bytes=50,
                    epoch_seconds=offload_s + 0.1),
            # faster still, but approximate: never over an exact row that fits
            PlanRow("prune", {"model": "sage", "budget_ratio": 0.3},
                    kind="approximate", need_bytes=10, epoch_seconds=0.01),
            # faster, but over the budget
            PlanRow("offload", {"model": "sage", "num_parts": 2}, need_bytes=200,
                    epoch_seconds=0.1)]
    table = mark_table(PlanTable(rows, 100, device))
    pick = choose(table)
    assert pick.strategy == picked
    if picked == "offload":
        assert pick is rows[1] and pick.why.startswith("chosen: the fastest exact")
        assert rows[0].why == "fits, but slower"
    else:
        assert pick is rows[0] and "no recompute" in rows[1].why


def test_candidates_under_the_budget_that_cannot_be_chosen_are_named():
    """A row under the budget that cannot be chosen (a lower bound only, a
    host store over the host's free memory) is not a budget problem: the
    error names it and why (it used to say the budget was below every
    candidate, e.g. GSR with 64 groups, whose dry run is too long)."""
    from leangnn.plan.planner import LOWER_BOUND, PlanRow, PlanTable, mark_table

    lower = f"not chosen: {LOWER_BOUND}"
    host = "host store needs 30.0 GiB > 20.0 GiB free host memory"
    rows = [PlanRow("prune", {"model": "gsr", "budget_ratio": 0.5},
                    kind="approximate", need_bytes=12 << 20, epoch_seconds=0.5,
                    host_short=lower),
            PlanRow("reversible", {"model": "gsr", "num_groups": 64},
                    need_bytes=10 << 20, epoch_seconds=1.0, host_short=lower),
            PlanRow("offload", {"model": "gsr", "num_parts": 8},
                    need_bytes=20 << 20, epoch_seconds=1.0, host_short=host),
            PlanRow("full", {"model": "gsr"}, need_bytes=5 << 30,
                    epoch_seconds=0.5)]
    table = mark_table(PlanTable(rows, 1 << 30, "cpu"))
    assert rows[1].why == lower and rows[2].why == host
    assert rows[3].why.startswith("needs 5.0 GiB > budget")
    with pytest.raises(ValueError) as e:
        choose(table)
    msg = str(e.value)
    assert "\n" not in msg and "below every candidate" not in msg
    # one clause per reason, the smallest row named, the others counted
    assert msg == (
        "memory_budget=1.0 GiB: no candidate on cpu can be chosen: "
        f"{LOWER_BOUND}: reversible(model=gsr, num_groups=64) (~10.0 MiB) and 1 "
        f"more; {host}: offload(model=gsr, num_parts=8) (~20.0 MiB); a pinned "
        "strategy trains without a plan")
    # under a budget below them all, the usual line
    table = mark_table(PlanTable(rows, 1 << 20, "cpu"))
    with pytest.raises(ValueError, match="below every candidate on cpu: the "
                       "smallest, reversible"):
        choose(table)
    assert rows[1].why.startswith("needs 10.0 MiB > budget")
    # a host store alone gets no hint to pin a strategy (it would not fit)
    table = mark_table(PlanTable([rows[2]], 1 << 30, "cpu"))
    with pytest.raises(ValueError) as e:
        choose(table)
    assert str(e.value).endswith("(~20.0 MiB)")


def test_a_job_of_several_processes_that_fits_nowhere_points_to_one_process():
    """With --nproc P the plan holds the distributed modes alone; when none
    fits, the error says that one process's rows were not planned."""
    from leangnn.plan.planner import PlanRow, PlanTable, mark_table

    dist = [PlanRow("distributed", {"model": "sage", "nproc": 2, "dist_mode": m},
                    need_bytes=(300 + i) << 20, epoch_seconds=0.2)
            for i, m in enumerate(("graph", "data"))]
    with pytest.raises(ValueError) as e:
        choose(mark_table(PlanTable(dist, 80 << 20, "cpu")))
    assert str(e.value) == (
        "memory_budget=80.0 MiB is below every candidate on cpu: the smallest, "
        "distributed(model=sage, nproc=2, dist_mode=graph), needs ~300.0 MiB; one "
        "process's rows (offload, DPR's core): plan without --nproc")
    one = [PlanRow("full", {"model": "sage"}, need_bytes=200 << 20,
                   epoch_seconds=0.1), *dist]
    with pytest.raises(ValueError) as e:
        choose(mark_table(PlanTable(one, 80 << 20, "cpu")))
    assert str(e.value).endswith("needs ~200.0 MiB")


def test_a_lazy_cpu_plan_estimates_offload_beside_a_fitting_full_batch(splits):
    # on a CPU an offload row can be the pick though full batch fits
    # (CPU_TIME_MARGIN): lazy planning still estimates it, and picks as the
    # whole table does
    cfg = TrainConfig(model="sage", num_layers=2, hidden_channels=8)
    whole = plan_config(cfg, splits, "1GiB", calibration=EXACT,
                        strategies=("full", "offload"))
    lazy = plan_config(cfg, splits, "1GiB", calibration=EXACT,
                       strategies=("full", "offload"), lazy=True)
    assert [r.strategy for r in lazy.rows].count("offload") > 0
    assert all(r.need_bytes is not None for r in lazy.rows)
    assert lazy.pick.label == whole.pick.label


def _reference(name: str) -> Calibration:
    from leangnn.plan.calibration import REFERENCE_DIR

    return Calibration.from_dict(json.loads((REFERENCE_DIR / f"{name}.json")
                                            .read_text()))


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
@pytest.mark.parametrize("cal", ["exact", "glibc-compact", "glibc-default"])
def test_the_offload_floor_is_below_every_offload_rows_need(model, cal, splits):
    # the planner takes the floor from its first offload row (the largest
    # device budget) and skips the rows of that budget or less
    from leangnn.plan.planner import offload_floor

    cal = EXACT if cal == "exact" else _reference(cal)
    cfg = TrainConfig(model=model, num_layers=2, hidden_channels=16)
    rows = []
    # from a pool that holds the whole graph (one job) down to 100+ jobs
    for pool in ("4MiB", "512KiB", "128KiB", "32KiB"):
        for parts in (4, 8):
            table = plan_config(cfg, splits, "1GiB", calibration=cal,
                                strategies=("offload",),
                                pinned={"num_parts": parts, "device_budget": pool})
            rows += table.rows
    assert all(r.need_bytes is not None for r in rows)
    floors = [offload_floor(r.estimate, cal) for r in rows]
    assert floors[0] > 0
    for i, r in enumerate(rows):
        assert floors[i] <= r.need_bytes
        assert rows[0].estimate.work["setup_floor_bytes"] <= r.estimate.setup_bytes
        # a smaller device budget holds fewer rows in its pool: more on the host
        assert floors[0] <= floors[i]
    assert rows[0].estimate.knobs["chunks"] == 1 < rows[-1].estimate.knobs["chunks"]


def test_a_budget_below_the_offload_floor_skips_the_other_offload_rows(splits):
    from leangnn.plan.planner import offload_floor

    cfg = TrainConfig(model="sage", num_layers=2, hidden_channels=16)
    table = plan_config(cfg, splits, "16KiB", calibration=EXACT,
                        strategies=("offload",))
    rows = [r for r in table.rows if r.strategy == "offload"]
    assert len(rows) == len(CPU_DEVICE_SHARES) * 3
    done = [r for r in rows if r.need_bytes is not None]
    skipped = [r for r in rows if r.need_bytes is None]
    assert len(done) == 1 and done[0] is rows[0]
    floor = offload_floor(done[0].estimate, EXACT)
    assert 16 * 1024 < floor <= done[0].need_bytes
    for r in skipped:
        assert r.why.startswith("not estimated: needs over") and "16.0 KiB" in r.why
        assert r.need_over == floor
    with pytest.raises(ValueError, match="the smallest, offload.* needs ~[^;]*; "
                       f"{len(skipped)} rows not estimated need over "):
        choose(table)
    # a budget between the floor and the needs: every row estimated
    mid = plan_config(cfg, splits, floor + 1, calibration=EXACT,
                      strategies=("offload",))
    assert all(r.need_bytes is not None for r in mid.rows)


@pytest.mark.parametrize("slower,device,picked", [(1.05, "cpu", 1), (1.2, "cpu", 0),
                                                 (1.05, "cuda", 0)])
def test_offload_rows_in_a_time_tie_pick_the_smaller_need(slower, device, picked):
    from leangnn.plan.planner import OFFLOAD_TIME_TIE, PlanRow, PlanTable, mark_table

    assert 1 < 1.05 < OFFLOAD_TIME_TIE < 1.2
    rows = [PlanRow("offload", {"model": "sage", "num_parts": 4}, need_bytes=60,
                    epoch_seconds=1.0),
            PlanRow("offload", {"model": "sage", "num_parts": 8}, need_bytes=40,
                    epoch_seconds=slower),
            # less still, but over the tie
            PlanRow("offload", {"model": "sage", "num_parts": 16}, need_bytes=30,
                    epoch_seconds=1.5),
            # less still, but not offload: full batch's own rule decides it
            PlanRow("full", {"model": "sage"}, need_bytes=50, epoch_seconds=2.0)]
    if device == "cuda":
        rows.pop()  # (full batch is first there whatever its time)
    table = mark_table(PlanTable(rows, 100, device))
    assert choose(table) is rows[picked]
    if picked == 1:
        assert rows[1].why == ("chosen: the exact strategy that fits and needs "
                               "least among the fastest (a tie)")
        assert rows[0].why.startswith("fits, but needs more")
    else:
        assert rows[0].why == "chosen: the fastest exact strategy that fits"
        assert rows[1].why == "fits, but slower"
    assert rows[2].why == "fits, but slower"
