"""OffloadEngine: exact full-batch gradients against PyG, budgets, counters."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN

from leangnn.graphs.synthetic import power_law_graph
from leangnn.nn.models import ResGNN, build_model
from leangnn.offload import BudgetError, OffloadEngine, OffloadOptions
from leangnn.plan.vertex import full_batch_vertex_bytes
from leangnn.profile import LiveBytesMeter


def _graph(n=400, dtype=torch.float64, seed=0):
    d = power_law_graph(n, avg_degree=6, in_channels=8, num_classes=4, seed=seed)
    d.x = d.x.to(dtype)
    return d


def loss_fn(out, data):
    return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _model(name, dtype=torch.float64, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return build_model(name, 8, 16, 4, 3, dropout=dropout).to(dtype)


def _reference(model, data):
    """PyG full-batch loss and gradients (the independent reference)."""
    out = model(data.x, data.edge_index)
    loss = loss_fn(out, data)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return float(loss.detach()), grads


def _engine_grads(engine, model, data):
    model.zero_grad(set_to_none=True)
    loss = engine.train_step(loss_fn, data)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss, grads


def _assert_close(loss, grads, ref_loss, ref_grads, tol):
    assert abs(loss - ref_loss) <= tol * abs(ref_loss)
    for g, r in zip(grads, ref_grads):
        err = (g - r).abs().max() / r.abs().max().clamp_min(1e-30)
        assert err <= tol, f"relative gradient error {float(err):.3e} > {tol}"


# budgets as fractions of full-batch vertex data; the tightest forces many
# chunks and evictions on this graph, the largest caches everything.
BUDGETS = (("st", 0.7), ("lru", 1.0), ("degree", 0.8), ("none", 0.5), ("st", 6.0))


@pytest.mark.parametrize("name", ["gcn", "sage", "gat", "gin"])
@pytest.mark.parametrize("num_parts", [1, 2, 7])
def test_exact_float64_matches_pyg(name, num_parts):
    data, model = _graph(), _model(name)
    ref_loss, ref_grads = _reference(model, data)
    need = full_batch_vertex_bytes(model, data.num_nodes)
    for policy, frac in BUDGETS:
        eng = OffloadEngine(model, data, int(frac * need), num_parts, policy)
        loss, grads = _engine_grads(eng, model, data)
        _assert_close(loss, grads, ref_loss, ref_grads, 1e-10)
        c = eng.counters
        assert c.peak_device_bytes <= eng.budget
        assert c.vertex_layer_computations == data.num_nodes * 3
        assert c.vertex_layer_recomputations == data.num_nodes * 3
        if frac < 1 and policy != "none":
            assert eng.num_chunks > num_parts  # the budget really bit
            assert c.writebacks > 0 or c.cache_misses > data.num_nodes


@pytest.mark.parametrize("name", ["gcn", "sage", "gat", "gin"])
def test_exact_float32_matches_pyg(name):
    data, model = _graph(dtype=torch.float32), _model(name, torch.float32)
    ref_loss, ref_grads = _reference(model, data)
    need = full_batch_vertex_bytes(model, data.num_nodes)
    for policy, frac in (("st", 0.7), ("lru", 2.0)):
        eng = OffloadEngine(model, data, int(frac * need), 7, policy)
        loss, grads = _engine_grads(eng, model, data)
        _assert_close(loss, grads, ref_loss, ref_grads, 1e-5)


@pytest.mark.parametrize("name,policy", [("gcn", "lru"), ("sage", "none"),
                                         ("gat", "degree")])
def test_recompute_baseline_is_exact_but_recomputes(name, policy):
    data, model = _graph(), _model(name)
    ref_loss, ref_grads = _reference(model, data)
    need = full_batch_vertex_bytes(model, data.num_nodes)
    base = OffloadEngine(model, data, need, 7, policy, mode="recompute")
    loss, grads = _engine_grads(base, model, data)
    _assert_close(loss, grads, ref_loss, ref_grads, 1e-10)
    exact = OffloadEngine(model, data, need, 7, policy)
    _engine_grads(exact, model, data)
    # the saving the exact engine exists for: no vertex is computed twice
    assert exact.counters.vertex_layer_computations == 3 * data.num_nodes
    assert base.counters.vertex_layer_computations > 1.5 * 3 * data.num_nodes


def test_st_cache_cuts_traffic_and_none_is_the_off_switch():
    data, model = _graph(1200), _model("gcn")
    need = full_batch_vertex_bytes(model, data.num_nodes)
    traffic = {}
    for policy in ("none", "lru", "st"):
        eng = OffloadEngine(model, data, need // 3, 8, policy)
        _engine_grads(eng, model, data)
        traffic[policy] = eng.counters.traffic_bytes
        if policy == "none":
            assert eng.counters.cache_hits == 0 and eng.cache.nbytes == 0
    assert traffic["st"] < traffic["lru"] < traffic["none"]


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_strict_measured_device_bytes_stay_under_budget(name):
    data, model = _graph(300), _model(name)
    budget = int(0.8 * full_batch_vertex_bytes(model, data.num_nodes))
    eng = OffloadEngine(model, data, budget, 4, "st", strict=True)
    _engine_grads(eng, model, data)
    c = eng.counters
    assert 0 < c.peak_device_bytes_measured <= budget
    assert c.peak_device_bytes <= budget


@pytest.mark.parametrize("mode,policy", [("exact", "st"), ("exact", "lru"),
                                         ("recompute", "degree")])
def test_virtual_replay_counts_the_same_as_a_real_epoch(mode, policy):
    data, model = _graph(500), _model("sage")
    budget = full_batch_vertex_bytes(model, data.num_nodes) // 2
    real = OffloadEngine(model, data, budget, 5, policy, mode=mode)
    _engine_grads(real, model, data)
    virt = OffloadEngine(model, data, budget, 5, policy, mode=mode, virtual=True)
    assert virt.simulate().to_dict() == real.counters.to_dict()
    shared = OffloadEngine(model, data, budget, 5, policy, mode=mode, virtual=True,
                           like=real)
    assert shared.sched is real.sched
    assert shared.simulate().to_dict() == real.counters.to_dict()


@pytest.mark.parametrize("mode", ["exact", "recompute"])
def test_predict_matches_full_forward(mode):
    data, model = _graph(), _model("gat", dropout=0.5)
    model.eval()
    ref = model(data.x, data.edge_index)
    eng = OffloadEngine(model, data, full_batch_vertex_bytes(model, 400), 3,
                        "lru", mode=mode)
    out = eng.predict()
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    assert eng.counters.vertex_layer_recomputations == 0


def test_dropout_gradient_is_exact_for_the_sampled_masks():
    """With dropout the engine is a deterministic function of the parameters
    once the RNG is seeded: its gradient must match finite differences."""
    data, model = _graph(60), _model("gat", dropout=0.3)
    model.train()
    # PyG zero-initialises biases; a node whose attention is fully dropped
    # then sits exactly on the ReLU kink, where finite differences disagree
    # with any subgradient. Move the parameters off such ties.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    eng = OffloadEngine(model, data, 4 * full_batch_vertex_bytes(model, 60), 3, "st")

    def loss_at():
        torch.manual_seed(123)
        model.zero_grad(set_to_none=True)
        return eng.train_step(loss_fn, data)

    loss_at()
    grads = [p.grad.clone() for p in model.parameters()]
    assert loss_at() == loss_at()
    eps = 1e-6
    gen = torch.Generator().manual_seed(0)
    for p, g in zip(model.parameters(), grads):
        for _ in range(2):
            i = int(torch.randint(p.numel(), (1,), generator=gen))
            with torch.no_grad():
                p.view(-1)[i] += eps
            up = loss_at()
            with torch.no_grad():
                p.view(-1)[i] -= 2 * eps
            down = loss_at()
            with torch.no_grad():
                p.view(-1)[i] += eps
            fd = (up - down) / (2 * eps)
            assert abs(fd - float(g.view(-1)[i])) <= 1e-6 * max(1.0, abs(fd))


def test_bad_inputs_raise_clear_errors():
    data, model = _graph(100), _model("gcn")
    with pytest.raises(ValueError, match="device_budget"):
        OffloadEngine(model, data, "lots", 2)
    with pytest.raises(ValueError, match="device_budget"):
        OffloadEngine(model, data, -5, 2)
    with pytest.raises(ValueError, match="parameters"):
        OffloadEngine(model, data, 1000, 2)
    with pytest.raises(BudgetError, match="device_budget"):
        OffloadEngine(model, data, 16_000, 2, "st")
    with pytest.raises(ValueError, match="cache"):
        OffloadEngine(model, data, "1MiB", 2, "fifo")
    with pytest.raises(ValueError, match="mode"):
        OffloadEngine(model, data, "1MiB", 2, mode="magic")
    with pytest.raises(ValueError, match="st"):
        OffloadEngine(model, data, "1MiB", 2, "st", mode="recompute")
    with pytest.raises(ValueError, match="BasicGNN"):
        OffloadEngine(ResGNN(8, 16, 4, 2).double(), data, "1MiB", 2)
    with pytest.raises(ValueError, match="num_parts"):
        OffloadEngine(model, data, "1MiB", 0)
    jk = GCN(8, 16, 2, 4, jk="cat").double()
    with pytest.raises(ValueError, match="jumping knowledge"):
        OffloadEngine(jk, data, "1MiB", 2)


def test_batch_norm_is_refused_in_training_only():
    data = _graph(100)
    model = GCN(8, 16, 2, 4, norm="batch_norm").double()
    eng = OffloadEngine(model, data, "1MiB", 2)
    with pytest.raises(ValueError, match="node-wise"):
        eng.train_step(loss_fn, data)
    model.eval()
    assert torch.allclose(eng.predict(), model(data.x, data.edge_index))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_cuda_exact_pinned_and_under_budget(name):
    data, model = _graph(), _model(name)
    ref_loss, ref_grads = _reference(model, data)
    model = model.cuda()
    # the engine holds cuBLAS' workspaces inside the budget (2 x 32 MiB on
    # Hopper: more than this graph's whole need)
    from leangnn.blas_workspace import ensure_blas_workspace

    budget = int(0.7 * full_batch_vertex_bytes(model, data.num_nodes)) + (8 << 20) \
        + ensure_blas_workspace("cuda")
    eng = OffloadEngine(model, data, budget, 7, "st", strict=True)
    assert eng.split.fixed == ensure_blas_workspace("cuda") > 0
    assert eng.host.pin and eng.host["h0"].is_pinned()
    loss, grads = _engine_grads(eng, model, data)
    _assert_close(loss, [g.cpu() for g in grads], ref_loss, ref_grads, 1e-10)
    assert 0 < eng.counters.peak_device_bytes_measured <= budget


def test_huge_budget_on_a_tiny_graph_holds_next_to_nothing():
    data, model = _graph(11), _model("sage")
    ref_loss, ref_grads = _reference(model, data)
    OffloadEngine(model, data, "16GiB", 2)  # calibrates the workspace model once
    with LiveBytesMeter(exclude=[data.x, data.edge_index, *model.parameters()]) as m:
        eng = OffloadEngine(model, data, "16GiB", 2, "st")
    # the cache share is ~8 GiB, but 11 nodes x 5 cacheable arrays is all the
    # graph can ever put there, and nothing is allocated before an epoch
    assert eng.cache.num_slots <= 5 * 11 and eng.cache.pool is None
    assert m.live < 64 << 10, f"engine holds {m.live} bytes after construction"
    loss, grads = _engine_grads(eng, model, data)
    _assert_close(loss, grads, ref_loss, ref_grads, 1e-10)
    # the reported host peak covers every vertex array the store held at the
    # turn of the epoch (features, outputs and gradients of every layer)
    vertex = full_batch_vertex_bytes(model, 11, resident_factor=0)
    c = eng.counters
    assert vertex <= c.peak_host_bytes <= vertex + (64 << 10)
    assert c.peak_device_bytes < 16 << 20
    assert eng.summary()["peak_host_bytes"] == c.peak_host_bytes


def _ring(n=30, dtype=torch.float64):
    """Every node has the same in-edges and halo, so one node's need is all's."""
    gen = torch.Generator().manual_seed(0)
    i = torch.arange(n)
    ei = torch.cat([torch.stack([i, (i + 1) % n]), torch.stack([(i + 1) % n, i])], 1)
    return Data(x=torch.randn(n, 8, generator=gen, dtype=dtype), edge_index=ei,
                y=torch.randint(4, (n,), generator=gen),
                train_mask=torch.ones(n, dtype=torch.bool), num_nodes=n)


@pytest.mark.parametrize("policy", ["st", "none"])
def test_too_small_budget_names_the_need_and_that_budget_trains(policy):
    data, model = _ring(), _model("gcn")
    resident = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    with pytest.raises(BudgetError, match=f"need {resident} bytes") as e:
        OffloadEngine(model, data, resident // 2, 2, policy)
    assert "\n" not in str(e.value) and "device_budget" in str(e.value)
    with pytest.raises(BudgetError, match="bytes of job workspace") as e:
        OffloadEngine(model, data, resident + 4096, 2, policy)
    msg = str(e.value)
    assert "\n" not in msg
    need = int(re.search(r"at least (\d+) bytes", msg).group(1))
    with pytest.raises(BudgetError):
        OffloadEngine(model, data, need - 1, 2, policy)
    eng = OffloadEngine(model, data, need, 2, policy)
    # the floor: one in-edge per job (a node's in-edges are split across jobs)
    assert eng.num_chunks == eng.csr.num_edges
    _assert_close(*_engine_grads(eng, model, data), *_reference(model, data), 1e-10)


def test_options_object_and_counting_engine():
    data, model = _graph(100), _model("gcn")
    opts = OffloadOptions("1MiB", 3, "lru", order="natural")
    a = OffloadEngine(model, data, options=opts)
    b = OffloadEngine(model, data, device_budget=1 << 20, num_parts=3, cache="lru",
                      order="natural")
    assert a.options == b.options and a.budget == 1 << 20
    assert [ch.targets.tolist() for ch in a.sched.chunks] == [
        ch.targets.tolist() for ch in b.sched.chunks]
    with pytest.raises(ValueError, match="order"):
        OffloadOptions("1MiB", order="random")
    counting = OffloadEngine(model, data, options=opts, virtual=True, like=a)
    assert counting.options.virtual and counting.sched is a.sched
    with pytest.raises(RuntimeError, match="only counts"):
        counting.train_step(loss_fn, data)
    with pytest.raises(RuntimeError, match="counting engine"):
        a.simulate()
    _engine_grads(a, model, data)
    assert counting.simulate().to_dict() == a.counters.to_dict()
    assert counting.cache.pool is None and a.cache.pool is not None


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_whole_graph_budget_runs_one_job_per_layer_and_retains(name):
    """At the budget the engine names for the whole graph, every layer is one
    job; with ``retain`` the backward runs through the forward's graphs (no
    recomputation, no layer input read again) and stays exact."""
    data, model = _graph(), _model(name)
    ref_loss, ref_grads = _reference(model, data)
    n = data.num_nodes
    plain = OffloadEngine(model, data, "1MiB", 7, "st", retain=False)
    whole = plain.whole_graph_budget
    assert OffloadEngine(model, data, whole - 1, 7, "st").num_chunks > 1
    one = OffloadEngine(model, data, whole, 7, "st", retain=False)
    assert one.num_chunks == 1 and not one.retain
    _assert_close(*_engine_grads(one, model, data), ref_loss, ref_grads, 1e-10)
    assert one.counters.vertex_layer_recomputations == 3 * n

    keep = OffloadEngine(model, data, "1MiB", 7, "st", retain=True)
    budget = keep.whole_graph_budget
    assert budget >= whole and not keep.retain  # 1 MiB holds no graph here
    for policy in ("st", "none"):
        eng = OffloadEngine(model, data, budget, 7, policy, retain=True, strict=True)
        base = OffloadEngine(model, data, budget, 7, policy, retain=False)
        assert eng.retain and eng.num_chunks == 1
        loss, grads = _engine_grads(eng, model, data)
        _assert_close(loss, grads, ref_loss, ref_grads, 1e-10)
        c = eng.counters
        assert c.vertex_layer_computations == 3 * n
        assert c.vertex_layer_recomputations == 0
        assert c.peak_device_bytes <= budget
        assert 0 < c.peak_device_bytes_measured <= budget
        _engine_grads(base, model, data)
        # backward reads only gradients (the layer inputs are not fetched
        # again, from cache or host) and sends no topology
        b = base.counters
        assert c.h2d_bytes <= b.h2d_bytes
        assert c.cache_hits + c.cache_misses < b.cache_hits + b.cache_misses
        assert c.h2d_meta_bytes < b.h2d_meta_bytes
        virt = OffloadEngine(model, data, budget, 7, policy, retain=True,
                             virtual=True)
        got, want = virt.simulate().to_dict(), c.to_dict()
        got.pop("peak_device_bytes_measured")
        want.pop("peak_device_bytes_measured")
        assert got == want


def test_retain_falls_back_below_its_budget_and_keeps_dropout_masks():
    data, model = _graph(300), _model("gat", dropout=0.3)
    need = full_batch_vertex_bytes(model, data.num_nodes)
    small = OffloadEngine(model, data, need, 4, "st", retain=True)
    assert not small.retain
    ref_loss, ref_grads = _reference(model.eval(), data)
    _assert_close(*_engine_grads(small, model, data), ref_loss, ref_grads, 1e-10)
    assert small.counters.vertex_layer_recomputations == 3 * data.num_nodes
    # training mode (dropout): the retained graph holds the forward's masks,
    # the recomputing engine redraws the same ones from the job's key
    model.train()
    budget = small.whole_graph_budget
    keep = OffloadEngine(model, data, budget, 4, "st", retain=True)
    again = OffloadEngine(model, data, budget, 4, "st", retain=False)
    assert keep.retain and not again.retain
    torch.manual_seed(5)
    a = _engine_grads(keep, model, data)
    torch.manual_seed(5)
    b = _engine_grads(again, model, data)
    _assert_close(*a, *b, 1e-12)
    with pytest.raises(ValueError, match="retain"):
        OffloadOptions("1MiB", retain="yes")


def test_default_engine_is_auto_none_on_cpu_retains_and_stays_exact():
    """The engine as the CLI builds it (no cache or retain argument): on a CPU
    "device" ``auto`` is ``none`` (the whole free budget is the workspace, the
    same decisions and counters as an explicit ``none`` engine), retention
    where the budget holds it, gradients equal to PyG's either way."""
    data, model = _graph(), _model("gcn")
    ref_loss, ref_grads = _reference(model, data)
    n = data.num_nodes
    tight = int(0.7 * full_batch_vertex_bytes(model, n))
    auto = OffloadEngine(model, data, tight, 4)
    assert auto.options.cache == "auto" and auto.options.retain
    assert auto.policy == "none" and auto.cache.num_slots == 0
    assert auto.split.workspace == auto.split.total - auto.split.resident
    assert not auto.retain and auto.num_chunks > 1
    none = OffloadEngine(model, data, tight, 4, "none", like=auto)
    _assert_close(*_engine_grads(auto, model, data), ref_loss, ref_grads, 1e-10)
    _engine_grads(none, model, data)
    assert auto.counters.to_dict() == none.counters.to_dict()
    assert auto.summary()["cache"] == "none"
    assert auto.summary()["cache_option"] == "auto"
    # explicit policies are kept as asked
    st = OffloadEngine(model, data, tight, 4, "st", like=auto)
    assert st.policy == "st" and st.cache.num_slots > 0
    assert "cache=none" in repr(auto) and "cache=st" in repr(st)

    whole = OffloadEngine(model, data, "1MiB", 4).whole_graph_budget
    keep = OffloadEngine(model, data, whole, 4, strict=True)
    assert keep.policy == "none" and keep.retain and keep.num_chunks == 1
    _assert_close(*_engine_grads(keep, model, data), ref_loss, ref_grads, 1e-10)
    c = keep.counters
    assert c.vertex_layer_computations == 3 * n
    assert c.vertex_layer_recomputations == 0
    assert c.peak_device_bytes <= whole and c.peak_device_bytes_measured <= whole
    # retention is budget-checked: one byte less and the default recomputes
    assert not OffloadEngine(model, data, whole - 1, 4).retain
    # the recompute baseline takes ``auto`` too (no next-use information
    # needed on a CPU device, where it is ``none``)
    base = OffloadEngine(model, data, tight, 4, mode="recompute")
    assert base.policy == "none"


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_peak_total_bytes_is_the_live_peak_of_a_real_cpu_epoch(name):
    # the one-memory figure the planner estimates a CPU "device" run with,
    # against the live tensor bytes of the real epoch (measured 0.98-1.01x)
    data, model = _graph(3000, torch.float32), _model(name, torch.float32)
    for frac in (0.5, 3.0):
        budget = int(frac * full_batch_vertex_bytes(model, data.num_nodes))
        eng = OffloadEngine(model, data, budget, 4, "none", retain=False)
        eng._ensure_grads()
        params = list(model.parameters())
        graph = [v for v in data.to_dict().values() if isinstance(v, torch.Tensor)]
        with LiveBytesMeter(exclude=[*params, *[p.grad for p in params],
                                     *graph]) as m:
            _engine_grads(eng, model, data)
        c = eng.last_train
        est = c.peak_total_bytes - data.x.untyped_storage().nbytes() - \
            eng.split.resident
        assert abs(est - m.peak) <= 0.05 * m.peak
        # the sum of the separate peaks counts two moments as one
        assert c.peak_total_bytes <= c.peak_device_bytes + c.peak_host_bytes


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_peak_total_bytes_of_whole_graph_retaining_epochs(name):
    # one job per layer keeping its graph: the output handed over to the
    # store is counted on both sides (measured 1.01-1.08x)
    data, model = _graph(3000, torch.float32), _model(name, torch.float32)
    probe = OffloadEngine(model, data, "1MiB", 4, "none", virtual=True)
    eng = OffloadEngine(model, data, probe.whole_graph_budget, 4, "none")
    assert eng.retain and eng.num_chunks == 1
    eng._ensure_grads()
    params = list(model.parameters())
    graph = [v for v in data.to_dict().values() if isinstance(v, torch.Tensor)]
    with LiveBytesMeter(exclude=[*params, *[p.grad for p in params], *graph]) as m:
        _engine_grads(eng, model, data)
    est = eng.last_train.peak_total_bytes - data.x.untyped_storage().nbytes() - \
        eng.split.resident
    assert m.peak <= est <= 1.15 * m.peak


# ------------------------------------------- graph structures offered by a plan
@pytest.fixture
def no_offers():
    from leangnn.offload import engine

    engine.withdraw_offers()
    yield
    engine.withdraw_offers()


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_offered_graph_structures_are_reused_and_equal_fresh_ones(
        name, no_offers, monkeypatch, tmp_path):
    from leangnn.offload import engine

    data = _graph()
    need = full_batch_vertex_bytes(_model(name), data.num_nodes)
    # the planner's counting engine (its own model instance) offers
    counting = OffloadEngine(_model(name, seed=1), data, int(0.7 * need), 4,
                             virtual=True, cache_dir=tmp_path)
    engine.offer_graph(counting, data)
    model = _model(name)
    eng = OffloadEngine(model, data, int(0.7 * need), 4, cache_dir=tmp_path)
    assert eng.csr is counting.csr and eng.partition is counting.partition
    assert not engine._OFFERS  # taken by the engine that trains
    monkeypatch.setenv("LEANGNN_PLAN_REUSE", "0")
    ref_model = _model(name)
    fresh = OffloadEngine(ref_model, data, int(0.7 * need), 4, cache_dir=tmp_path)
    assert fresh.csr is not counting.csr
    # what it took over is counted as its own setup, byte for byte what a
    # fresh engine builds (a setup's measured growth leaves it out)
    built = [fresh.csr.col, fresh.csr.rowptr, fresh.csr.weight, fresh.degree,
             fresh.partition.part]
    assert eng.taken_bytes == sum(t.untyped_storage().nbytes() for t in built
                                  if t is not None) > 0
    assert fresh.taken_bytes == 0 and counting.taken_bytes == 0
    for key in ("rowptr", "col", "weight"):
        a, b = getattr(eng.csr, key, None), getattr(fresh.csr, key, None)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert torch.equal(eng.degree, fresh.degree)
    assert torch.equal(eng.partition.part, fresh.partition.part)
    assert [c.targets.tolist() for c in eng.sched.chunks] == \
        [c.targets.tolist() for c in fresh.sched.chunks]
    loss, grads = _engine_grads(eng, model, data)
    ref_loss, ref_grads = _engine_grads(fresh, ref_model, data)
    assert loss == ref_loss
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_offered_graph_structures_serve_only_the_same_graph_and_conv(
        no_offers, tmp_path):
    from leangnn.offload import engine

    data = _graph()
    counting = OffloadEngine(_model("gcn"), data, "64MiB", 4, virtual=True,
                             cache_dir=tmp_path)
    engine.offer_graph(counting, data)
    # another conv (no GCN normalisation in the weights): built afresh
    assert OffloadEngine(_model("sage"), data, "64MiB", 4).csr is not counting.csr
    # another part count: the grouping is shared, the partition is not (a
    # counting engine leaves the offer for the engine that trains)
    other = OffloadEngine(_model("gcn"), data, "64MiB", 2, virtual=True,
                          cache_dir=tmp_path)
    assert other.csr is counting.csr and other.partition.num_parts == 2
    assert len(engine._OFFERS) == 1
    # the graph changed in place: nothing is reused
    data.edge_index[0, 0] = data.edge_index[1, 0]
    changed = OffloadEngine(_model("gcn"), data, "64MiB", 4, cache_dir=tmp_path)
    assert changed.csr is not counting.csr
    # withdrawn: all, or all partitions but the kept part count
    engine.offer_graph(changed, data)
    engine.withdraw_offers(keep=SimpleNamespace(num_parts=8))  # a TrainConfig
    assert engine._OFFERS and not any(e[4] for e in engine._OFFERS)
    engine.withdraw_offers()
    assert not engine._OFFERS


def test_edge_features_a_model_takes_are_refused_not_dropped():
    """A GAT (its convs take edge_attr) on a graph with edge features: the
    layer-wise engine would run its convs without them, so it refuses,
    naming them; GCN (which ignores them) offloads as before."""
    from torch_geometric.nn import GAT

    data = _graph()
    data.edge_attr = torch.randn(data.num_edges, 3, dtype=torch.float64)
    opts = OffloadOptions(1 << 20, 2, virtual=True)
    gat = GAT(8, 16, 2, 4).double()
    with pytest.raises(ValueError, match=r"edge features \(edge_attr \(\d+, 3\)\) "
                       r"that GAT takes"):
        OffloadEngine(gat, data, options=opts)
    OffloadEngine(_model("gcn"), data, options=opts)
