"""Per-strategy estimates: depth extrapolation against a direct dry run, the
DPR core against a dry run on the core, offload against its engine."""

from __future__ import annotations

import sys

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.data import GraphSplits, with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import (
    EXTRAPOLATE_ABOVE,
    default_loss,
    depth_points,
    estimate_config,
    estimate_model,
    fallback_depths,
)
from leangnn.profile import LiveBytesMeter
from leangnn.prune.dpr import DPRStrategy


@pytest.fixture(scope="module")
def splits():
    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=3)
    c = int(g.y.max()) + 1
    return GraphSplits([with_mask(g, g.train_mask)], [with_mask(g, g.val_mask)],
                       [with_mask(g, g.test_mask)], "classification", c)


def test_depth_points():
    assert depth_points(3) == (3,)
    assert depth_points(EXTRAPOLATE_ABOVE) == (EXTRAPOLATE_ABOVE,)
    deep = depth_points(256)
    assert len(deep) == 2 and max(deep) <= EXTRAPOLATE_ABOVE
    # a stack over the op limit: 2 and 4, for GSR then 1 and 2, below it
    assert fallback_depths(8) == [(2, 4)] and fallback_depths(4) == []
    assert fallback_depths(8, gsr=True) == [(2, 4), (1, 2)]
    assert fallback_depths(3, gsr=True) == [(1, 2)]


@pytest.mark.parametrize("strategy,model,extra", [
    ("full", "res", {"conv": "sage"}),
    pytest.param("reversible", "gsr", {"conv": "gcn", "num_groups": 2,
                                       "dropout": 0.1}, marks=pytest.mark.slow),
    ("full", "gat", {}),
])
def test_extrapolated_depth_equals_direct_dry_run(splits, strategy, model, extra,
                                                  monkeypatch):
    from leangnn.plan import estimate as E

    # traced at depths 2 and 4, extrapolated to 7
    monkeypatch.setattr(E, "EXTRAPOLATE_ABOVE", 4)
    depth = 7
    cfg = TrainConfig(strategy=strategy, model=model, num_layers=depth,
                      hidden_channels=8, **extra)
    est = estimate_config(cfg, splits)
    assert est.method == "fake+extrapolated"
    torch.manual_seed(0)
    direct = build_model(model, splits.in_channels, 8, splits.out_channels, depth,
                         **cfg.model_options())
    trace = trace_step(direct, splits.train[0], default_loss(splits.train[0]),
                       lr=cfg.lr, clip_norm=cfg.clip_norm)
    # exact in what a dispatch mode sees; the plain-run emulation depends on
    # when Python drops tensor objects, which moves a parameter-sized
    # gradient by a few percent of these tiny graphs' steps
    assert est.step_bytes == pytest.approx(trace.peak_bytes, rel=0.05)
    params = sum(p.numel() * p.element_size() for p in direct.parameters())
    assert est.model_bytes == params
    # the loaded state on CPU: the training graph
    g = splits.train[0]
    assert est.graph_bytes == sum(v.untyped_storage().nbytes()
                                  for v in g.to_dict().values()
                                  if isinstance(v, torch.Tensor))
    assert est.peak_bytes == est.model_bytes + est.graph_bytes + est.run_bytes


def test_prune_estimates_the_core(splits):
    cfg = TrainConfig(strategy="prune", model="sage", num_layers=2,
                      hidden_channels=16, budget_ratio=0.4)
    est = estimate_config(cfg, splits)
    dpr = DPRStrategy(budget_ratio=0.4)
    core = dpr.prepare(splits.train[0]).train_data
    assert est.knobs["core_nodes"] == core.num_nodes < splits.train[0].num_nodes
    model = build_model("sage", splits.in_channels, 16, splits.out_channels, 2)

    def dpr_step(m, data, loss_fn):  # DPR's own forward on its core
        loss = loss_fn(dpr.forward(m, data), data)
        loss.backward()
        return 0.0

    ref = trace_step(model, core, default_loss(core), dpr_step, lr=cfg.lr,
                     clip_norm=cfg.clip_norm)
    # (within a gradient's worth: when Python drops tensor objects moves the
    # plain-run emulation by a few KiB on this tiny core)
    assert est.step_bytes == pytest.approx(ref.peak_bytes, rel=0.1)
    if core.get("adj_t", None) is not None:
        # DPR trains through a CSR adjacency: less than message passing over
        # the same edges, which builds [E, C] messages
        dst, src = core.adj_t.to_sparse_coo().coalesce().indices()
        mp = core.clone()
        mp.edge_index = torch.stack([src, dst])
        del mp.adj_t
        upper = trace_step(model, mp, default_loss(mp), lr=cfg.lr,
                           clip_norm=cfg.clip_norm)
        assert est.step_bytes < upper.peak_bytes
    full = estimate_config(TrainConfig(strategy="full", model="sage", num_layers=2,
                                       hidden_channels=16), splits)
    assert est.step_bytes < full.step_bytes


@pytest.mark.slow  # the engine calibrates its workspace with real probe jobs
def test_offload_uses_the_engines_accounting(splits):
    from leangnn.offload import OffloadEngine, OffloadOptions

    cfg = TrainConfig(strategy="offload", model="sage", num_layers=2,
                      hidden_channels=16, device_budget="2MiB", num_parts=4)
    est = estimate_config(cfg, splits)
    assert est.method == "offload-accounting"
    torch.manual_seed(0)
    model = build_model("sage", splits.in_channels, 16, splits.out_channels, 2)
    g = splits.train[0]
    eng = OffloadEngine(model, g, options=OffloadOptions("2MiB", 4))
    eng._ensure_grads()
    params_ = list(model.parameters())
    with LiveBytesMeter(exclude=[*params_, *[p.grad for p in params_],
                                 *[v for v in g.to_dict().values()
                                   if isinstance(v, torch.Tensor)]]) as meter:
        eng.train_step(default_loss(g), g)
    c = eng.last_train
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    x = g.x.untyped_storage().nbytes()
    resident, pool = eng.split.resident, eng.cache.nbytes
    job = c.peak_device_bytes - resident - pool  # charged with its margin
    device = resident - params + pool + round(job / eng.ws.margin)
    # on a CPU "device", host store and device pool are one memory
    host = c.peak_host_bytes - x - pool
    assert (est.work["device_bytes"], est.work["host_bytes"]) == (device, host)
    # On a CPU "device" the step is the highest simultaneous host + device
    # bytes, against the live tensor bytes of the real epoch (the engine's
    # gradients and moments, resident - params, are outside the meter; on
    # this 250 KB step the fits' per-job constants weigh: 10%)
    live = meter.peak + eng.split.resident - params
    assert abs(est.step_bytes - live) <= 0.1 * live
    assert est.step_bytes < device + host  # the two peaks are not simultaneous
    assert est.work["jobs"] == c.jobs


def test_user_model_and_custom_loss(splits):
    from torch_geometric.nn import GraphSAGE

    g = splits.train[0]
    model = GraphSAGE(g.num_features, 16, 2, 4)

    def loss_fn(out, data):
        return out.pow(2).mean()

    est = estimate_model(model, g, loss_fn)
    ref = trace_step(model, g, loss_fn)
    assert est.step_bytes == ref.peak_bytes and est.method == "fake"
    assert est.to_dict()["peak_bytes"] == est.peak_bytes


def test_unsupported_model_falls_back_to_the_analytic_bound(splits, monkeypatch):
    from leangnn.plan import estimate as E
    from leangnn.plan.fake import UnsupportedOpError

    def fail(*a, **k):
        raise UnsupportedOpError("aten.nonzero: value-dependent")

    monkeypatch.setattr(E, "trace_step", fail)
    cfg = TrainConfig(strategy="full", model="sage", num_layers=2,
                      hidden_channels=16)
    est = estimate_config(cfg, splits)
    assert est.method == "analytic" and "dry run failed" in est.note
    assert est.step_bytes > 0


def test_a_step_over_the_op_limit_is_extrapolated_from_short_traces(splits,
                                                                   monkeypatch):
    # GSR with GAT group functions at a shallow depth passes the op limit; the
    # estimate then traces depths 2 and 4 and extrapolates, equal to a direct
    # dry run without the limit
    from leangnn.plan import estimate as E
    from leangnn.plan.fake import TooManyOpsError

    depth = 6
    cfg = TrainConfig(strategy="reversible", model="gsr", conv="gat",
                      num_layers=depth, hidden_channels=8, num_groups=2)
    torch.manual_seed(0)
    direct = build_model("gsr", splits.in_channels, 8, splits.out_channels, depth,
                         **cfg.model_options())
    g = splits.train[0]
    full = trace_step(direct, g, default_loss(g), lr=cfg.lr, clip_norm=cfg.clip_norm)
    limit = full.ops - 1  # the full depth does not fit, depth 4 does
    monkeypatch.setattr(E, "trace_step",
                        lambda *a, **k: trace_step(*a, **{**k, "max_ops": limit}))
    with pytest.raises(TooManyOpsError):
        E.trace_step(direct, g, default_loss(g))
    est = estimate_config(cfg, splits)
    assert est.method == "fake+extrapolated"
    assert est.step_bytes == pytest.approx(full.peak_bytes, rel=0.05)
    # over the limit at every depth: the analytic fallback, as before
    monkeypatch.setattr(E, "trace_step",
                        lambda *a, **k: trace_step(*a, **{**k, "max_ops": 100}))
    assert estimate_config(cfg, splits).method == "analytic"


def test_gsr_over_the_limit_at_4_layers_is_extrapolated_from_1_and_2(splits,
                                                                     monkeypatch):
    """GSR at 64 groups passes the op limit at 4 layers already (8 x 64 had
    planned only a lower bound); GSR repeats from its first layer on, so
    depths 1 and 2 extrapolate it, equal to a direct trace."""
    from leangnn.plan import estimate as E

    cfg = TrainConfig(strategy="reversible", model="gsr", conv="gcn",
                      num_layers=6, hidden_channels=8, num_groups=2)
    g = splits.train[0]
    torch.manual_seed(0)
    model = build_model("gsr", splits.in_channels, 8, splits.out_channels, 6,
                        **cfg.model_options())
    full = trace_step(model, g, default_loss(g), lr=cfg.lr, clip_norm=cfg.clip_norm)
    seen = []
    real = E._trace_depths

    def at(*a):
        seen.append(a[6])
        return real(*a)

    monkeypatch.setattr(E, "_trace_depths", at)
    four = real(cfg, g, splits.in_channels, splits.out_channels, default_loss(g),
                torch.device("cpu"), (4,))[0]
    limit = round(four["work"]["ops"]) - 1  # depth 4 is over, depth 2 is not
    monkeypatch.setattr(E, "op_limit", lambda num_layers, depth: limit)
    est = estimate_config(cfg, splits)
    assert seen == [(6,), (2, 4), (1, 2)]
    assert est.method == "fake+extrapolated"
    assert est.step_bytes == pytest.approx(full.peak_bytes, rel=0.05)
    # another model keeps (2, 4) as its last try
    seen.clear()
    res = TrainConfig(strategy="full", model="res", num_layers=6, hidden_channels=8)
    monkeypatch.setattr(E, "op_limit", lambda num_layers, depth: 10)
    assert estimate_config(res, splits).method == "analytic"
    assert seen == [(6,), (2, 4)]


def test_a_shallow_trace_of_a_deep_stack_may_run_a_quarter_of_its_ops(
        splits, monkeypatch):
    """GSR-128 with 64 groups had stopped at its 4-layer trace (over the op
    limit meant for a trace as long as the real step) and planned a lower
    bound alone. A trace that extrapolates a deep stack may run a quarter of
    the deep step's ops: the same estimate as without any limit."""
    from leangnn.plan import estimate as E

    assert E.op_limit(4, 4) == E.op_limit(128, 32) == E.MAX_OPS
    assert E.op_limit(128, 4) == 8 * E.MAX_OPS
    cfg = TrainConfig(strategy="reversible", model="gsr", num_layers=32,
                      hidden_channels=8, num_groups=4)
    free = estimate_config(cfg, splits)
    assert free.method == "fake+extrapolated"
    ops = {}
    real = E.trace_step

    def counted(*a, **k):
        t = real(*a, **k)
        ops[a[0].stack.num_layers if hasattr(a[0], "stack") else len(ops)] = t.ops
        return t

    monkeypatch.setattr(E, "trace_step", counted)
    estimate_config(cfg, splits)
    deepest = max(ops.values())
    # the old rule (MAX_OPS whatever the trace stands for) stops this one
    monkeypatch.setattr(E, "MAX_OPS", deepest - 1)
    assert E.op_limit(cfg.num_layers, 4) >= deepest
    est = estimate_config(cfg, splits)
    assert est.method == "fake+extrapolated"
    assert est.step_bytes == free.step_bytes
    # over the limit at every depth: the analytic lower bound
    monkeypatch.setattr(E, "op_limit", lambda num_layers, depth: 10)
    assert estimate_config(cfg, splits).method == "analytic"


@pytest.mark.parametrize("kind", ["gsr", "res"])
def test_a_users_deep_model_past_the_op_limit_is_extrapolated_from_twins(
        splits, kind, monkeypatch):
    """``leangnn.plan(GSRGNN(64 layers, 32 groups))`` raised the dry run's
    op-limit error (110,000 ops). Our deep models repeat their layer: two
    shallow twins (``with_depth``) extrapolate the step, within 5% of the
    direct trace; a subclass (its forward may differ) still raises."""
    from leangnn.nn.models import GSRGNN, ResGNN
    from leangnn.plan import estimate as E
    from leangnn.plan.fake import TooManyOpsError

    g = splits.train[0]
    torch.manual_seed(0)
    model = GSRGNN(g.num_features, 16, 4, 12, num_groups=4) if kind == "gsr" \
        else ResGNN(g.num_features, 16, 4, 12, conv="gcn")
    direct = estimate_model(model, g)
    assert direct.method == "fake"
    ops = trace_step(model, g, default_loss(g)).ops
    monkeypatch.setattr(E, "MAX_OPS", ops - 1)  # the model's own step is over
    est = estimate_model(model, g)
    assert est.method == "fake+extrapolated"
    assert est.step_bytes == pytest.approx(direct.step_bytes, rel=0.05)
    assert est.model_bytes == direct.model_bytes  # parameters: linear in depth
    twin = model.with_depth(4)
    assert type(twin) is type(model) and twin.num_layers == 4
    assert repr(twin) == repr(model).replace("num_layers=12", "num_layers=4")

    class Mine(type(model)):
        pass

    mine = Mine(g.num_features, 16, 4, 12, **({"num_groups": 4} if kind == "gsr"
                                              else {"conv": "gcn"}))
    with pytest.raises(TooManyOpsError):
        estimate_model(mine, g)


def test_planned_core_is_a_fresh_core_and_offered_to_the_pick_alone(splits,
                                                                    monkeypatch):
    """The prune rows of a plan share the graph's adjacency and scores and
    offer their cores; forget() keeps the pick's alone, which a DPRStrategy
    of the same configuration takes instead of selecting it again."""
    from leangnn.plan import estimate as E
    from leangnn.prune import dpr

    big = splits.train[0]
    E.forget()
    dpr.withdraw_offers()
    cores = {r: E.core_of(big, planned=True, budget_ratio=r) for r in (0.5, 0.3)}
    entry = E._graph_entry(big)
    assert entry[1] is not None and "pagerank" in entry[2]  # shared by the rows
    assert len(dpr._OFFERS) == 2
    E.forget(keep=TrainConfig(strategy="prune", model="sage", budget_ratio=0.3))
    assert entry[1] is None and len(dpr._OFFERS) == 1  # the adjacency is dropped
    taker = DPRStrategy(budget_ratio=0.3)
    st = taker.prepare(big)
    assert taker.summary()["core_reused"] is True and st.train_data is cores[0.3]
    monkeypatch.setenv("LEANGNN_PLAN_REUSE", "0")
    for r, core in cores.items():
        fresh = DPRStrategy(budget_ratio=r).prepare(big).train_data
        assert torch.equal(core.x, fresh.x) and torch.equal(core.y, fresh.y)
        for part in ("crow_indices", "col_indices", "values"):
            assert torch.equal(getattr(core.adj_t, part)(),
                               getattr(fresh.adj_t, part)())
    E.forget()
    assert not dpr._OFFERS


def test_estimate_outside_a_plan_keeps_no_core_or_adjacency(splits):
    from leangnn.plan import estimate as E
    from leangnn.prune import dpr

    E.forget()
    dpr.withdraw_offers()
    cfg = TrainConfig(strategy="prune", model="sage", num_layers=2,
                      hidden_channels=8, budget_ratio=0.3)
    estimate_config(cfg, splits)
    assert not dpr._OFFERS and all(e[1] is None for e in E._GRAPHS)
    with E.plan_scope():
        estimate_config(cfg, splits)
    assert len(dpr._OFFERS) == 1
    assert any(e[1] is not None for e in E._GRAPHS)
    E.forget()
    assert not dpr._OFFERS and all(e[1] is None for e in E._GRAPHS)
    # a plan that fails keeps nothing of what its rows built
    with pytest.raises(KeyboardInterrupt), E.plan_scope():
        estimate_config(cfg, splits)
        assert len(dpr._OFFERS) == 1
        raise KeyboardInterrupt
    assert not dpr._OFFERS and all(e[1] is None for e in E._GRAPHS)
    assert not E.planning()


def test_prune_epoch_work_covers_every_training_graphs_core():
    """DPR trains each training graph's core: an epoch over three graphs is
    three traced core steps, their bytes scaled by the graphs' sizes (the
    single-graph estimate is the reference)."""
    gs = [contextual_sbm(n, avg_degree=4.0, in_channels=8, seed=n)
          for n in (600, 300, 200)]
    train = [with_mask(g, g.train_mask) for g in gs]
    cfg = TrainConfig(dataset="csbm:600", model="sage", num_layers=2, epochs=1,
                      strategy="prune", budget_ratio=0.5)

    def splits(graphs):
        return GraphSplits(graphs, train[:1], train[:1], "classification",
                           int(gs[0].y.max()) + 1)

    one = estimate_config(cfg, splits(train[:1]))
    three = estimate_config(cfg, splits(train))
    assert three.work["ops"] == pytest.approx(3 * one.work["ops"])
    size = [int(g.num_nodes) + int(g.num_edges) for g in train]
    assert three.work["written"] == pytest.approx(
        one.work["written"] * sum(size) / size[0])


def _work_of(trace) -> dict:
    return {"cold_written": trace.cold_written, "big_written": trace.big_written,
            "cold_blocks": sorted(trace.cold_blocks.items())}


@pytest.mark.parametrize("threshold", [32 << 20, 0])
def test_chunked_work_matches_a_trace_a_chunk_in_size(threshold):
    # an offload job of one chunk in four: a quarter of the nodes and edges;
    # the full step's [E, 64] messages (~80 MB) are past the heap threshold,
    # a quarter of them (~20 MB) is not, but still past the caches
    from leangnn.plan.estimate import chunked_work

    def trace(n):
        g = contextual_sbm(n, avg_degree=40.0, in_channels=8, seed=5)
        torch.manual_seed(0)
        model = build_model("sage", 8, 64, int(g.y.max()) + 1, 2)
        return trace_step(model, g, default_loss(g), heap_threshold=threshold)

    full, quarter = trace(8000), trace(2000)
    work = chunked_work(_work_of(full), 4, threshold)
    if threshold:
        assert full.big_written > 0 and quarter.big_written == 0
        assert work["big_written"] == 0
    else:  # no heap (CUDA): every block is fresh in any size
        assert work["big_written"] == full.big_written
    assert quarter.cold_written > 0
    assert work["cold_written"] < full.cold_written
    assert work["cold_written"] == pytest.approx(4 * quarter.cold_written, rel=0.1)
    # one chunk, or work traced without block sizes: unchanged
    assert chunked_work(_work_of(full), 1, threshold) == _work_of(full)
    old = {"cold_written": 5.0, "big_written": 3.0}
    assert chunked_work(old, 8, threshold) == old


def test_cold_blocks_are_extrapolated_with_depth(splits, monkeypatch):
    from leangnn.plan import estimate as E

    monkeypatch.setattr(E, "EXTRAPOLATE_ABOVE", 4)
    big = contextual_sbm(3000, avg_degree=30.0, in_channels=8, seed=2)
    c = int(big.y.max()) + 1
    s = GraphSplits([big], [big], [big], "classification", c)
    cfg = TrainConfig(strategy="full", model="res", conv="sage", num_layers=7,
                      hidden_channels=16)
    est = estimate_config(cfg, s)
    assert est.method == "fake+extrapolated"
    torch.manual_seed(0)
    direct = trace_step(build_model("res", 8, 16, c, 7, **cfg.model_options()),
                        big, default_loss(big), lr=cfg.lr, clip_norm=cfg.clip_norm)
    got = dict((int(b), n) for b, n in est.work["cold_blocks"])
    assert got.keys() == direct.cold_blocks.keys()
    for b, n in direct.cold_blocks.items():
        assert got[b] == pytest.approx(n, abs=1)
    assert sum(b * n for b, n in got.items()) == pytest.approx(
        est.work["cold_written"], rel=1e-6)


def test_job_edge_bytes_is_one_chunks_edges_at_the_largest_per_edge_cost():
    from types import SimpleNamespace

    import numpy as np

    from leangnn.plan.estimate import job_edge_bytes

    fit = lambda e: SimpleNamespace(coef=np.array([4.0, 8.0, e]))  # noqa: E731
    # (a backward block of 250 bytes per edge, mapped apart past ``thr``)
    ws = SimpleNamespace(fits={(0, False): fit(100.0), (0, True): fit(300.0)},
                         mapped_bytes=lambda li, bw, n_e, thr: 250 * n_e if (
                             bw and thr and 250 * n_e >= thr) else 0)
    none = SimpleNamespace(heap_threshold=None)  # no heap (CUDA)

    def engine(chunks, w=ws, split=none):
        return SimpleNamespace(num_chunks=chunks, ws=w, split=split)

    assert job_edge_bytes(engine(8), 8000) == 300 * 1000
    assert job_edge_bytes(engine(4), 8000) == 300 * 2000
    # one chunk: each job is the whole layer, reusing the last one's blocks
    assert job_edge_bytes(engine(1), 8000) == 0
    assert job_edge_bytes(engine(8, SimpleNamespace()), 8000) == 0
    # the mapped block leaves no hole in the heap: the forward's 100 per
    # edge is then the most the heap holds
    eng = engine(8, split=SimpleNamespace(heap_threshold=200_000))
    assert job_edge_bytes(eng, 8000) == 100 * 1000
    eng.split.heap_threshold = 1 << 30  # no block that large: as before
    assert job_edge_bytes(eng, 8000) == 300 * 1000


def _offload_peak(tmp_path, args: list[str], tunables: str) -> int:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                        "LEANGNN_HEAP_REEXEC", "LEANGNN_HEAP")}
    env.update(GLIBC_TUNABLES=tunables, OMP_NUM_THREADS="1")
    out = tmp_path / tunables.rsplit("=", 1)[-1]
    subprocess.run([sys.executable, "-m", "leangnn", "train", *args, "--epochs",
                    "2", "--out", str(out), "--quiet"], env=env, check=True,
                   capture_output=True, timeout=600)
    return json.loads((out / "summary.json").read_text())["memory"]["peak_bytes"]


def test_offload_blocks_past_the_mmap_threshold_add_to_the_heaps_high_water(
        tmp_path, monkeypatch):
    """glibc maps a block past its mmap threshold on pages of its own while
    the heap keeps its high-water: with the threshold at 4 MiB, SAGE-2's
    first-layer messages (E_c x 64 floats) are mapped and the second
    layer's (E_c x 32) come from the heap, and the process holds both. The
    estimate counts them (the old one, what the 64 MiB threshold gives now,
    read 19% under this run; csbm:150000 at the compact heap's own 32 MiB
    threshold 22% under)."""
    from leangnn import heap
    from leangnn.data import load_graphs
    from leangnn.plan.calibration import load_calibration

    if not sys.platform.startswith("linux") or not heap._glibc():
        pytest.skip("glibc's mmap threshold (Linux)")
    args = ["--dataset", "csbm:20000", "--model", "sage", "--layers", "2",
            "--hidden", "32", "--strategy", "offload", "--device-budget", "40MiB",
            "--parts", "4"]
    cfg = TrainConfig(dataset="csbm:20000", model="sage", num_layers=2,
                      hidden_channels=32, strategy="offload",
                      device_budget="40MiB", num_parts=4)
    splits = load_graphs(cfg, progress=False)
    estimated = {}
    for thr in (4 << 20, 64 << 20):  # 4 MiB: between the two layers' blocks
        tunables = ":".join([*heap.COMPACT_TUNABLES[::2],
                             f"glibc.malloc.mmap_threshold={thr}"])
        monkeypatch.setenv("GLIBC_TUNABLES", tunables)
        estimated[thr] = estimate_config(cfg, splits, calibration=load_calibration(
            torch.device("cpu"))).costliest_run_bytes
    # (measured only at 4 MiB: with every block in the heap a process
    # peaks at 24.7 or at 31.3-31.9 MiB, by chance; at 4 MiB at 30.4-30.9)
    measured = _offload_peak(tmp_path, args, tunables.replace(
        f"={64 << 20}", f"={4 << 20}"))
    # estimated here: 32.0 MiB at 4 MiB, 24.6 at 64 MiB
    assert abs(estimated[4 << 20] / measured - 1) <= 0.15
    assert estimated[4 << 20] - estimated[64 << 20] >= 0.15 * measured
