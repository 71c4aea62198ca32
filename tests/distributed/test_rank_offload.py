"""Graph parallel with each rank under the offload engine (its own device
budget) equals PyG full-batch training: GCN, GraphSAGE and GAT on 2, 3 and 4
gloo ranks, float64 to 1e-10 and float32 to 1e-5 (relative).

One 4-process job (forked once for the module) runs every check; 2- and
3-rank checks use subgroups. Each rank's budget is cut so its part needs
several chunks per layer, and the 2-rank float64 runs measure every job's
bytes against the budget (``strict``). The reference is plain PyG full-batch
autograd in this process.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn.models import GAT, GCN, GraphSAGE

from leangnn.distributed import DistributedStrategy, GraphParallel, RankOffload, spawn
from leangnn.nn.models import ResGNN
from leangnn.offload import BudgetError, LayerwiseModel

MODELS = ("gcn", "sage", "gat")
DTYPES = {"float64": (torch.float64, 1e-10), "float32": (torch.float32, 1e-5)}
CASES = [(p, m, d) for p in (2, 3, 4) for m in MODELS for d in DTYPES]
LAYERS = 3
EPOCHS = 2


def _graph_of(name: str) -> str:
    return "sbm" if name == "sage" else "circuit"


def _model(name: str, data: Data, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(7)
    f = data.num_features
    out = 1 if data.y.dtype.is_floating_point else int(data.y.max()) + 1
    m = {"gcn": lambda: GCN(f, 16, LAYERS, out),
         "sage": lambda: GraphSAGE(f, 16, LAYERS, out),
         "gat": lambda: GAT(f, 16, LAYERS, out, heads=2)}[name]()
    return m.to(dtype)


def _loss(out: torch.Tensor, data: Data) -> torch.Tensor:
    mask = data.node_mask
    if data.y.dtype.is_floating_point:
        return F.mse_loss(out[mask].reshape(-1), data.y[mask].to(out.dtype))
    return F.cross_entropy(out[mask], data.y[mask])


def _cast(data: Data, dtype: torch.dtype) -> Data:
    d = data.clone()
    d.x = d.x.to(dtype)
    if d.y.dtype.is_floating_point:
        d.y = d.y.to(dtype)
    return d


def _strict(p: int, dname: str) -> bool:
    # Measuring every op of every job costs ~8x: once per model is enough.
    return p == 2 and dname == "float64"


def _budget_for_chunks(model, runner, pieces: int) -> int:
    """A budget whose job workspace holds about 1/pieces of the part."""
    probe = RankOffload("1TiB")
    runner.executor = probe
    rp = probe.plan(model, runner)
    assert rp.num_chunks == 1
    s, t, e = rp.chunks[0].sizes
    return rp.split.min_budget(rp.split.job_bytes(s // pieces, t // pieces,
                                                  e // pieces))


def _worker(ctx, graphs):
    groups = {p: dist.new_group(list(range(p))) for p in (2, 3)}
    groups[4] = None
    out = {}
    for p, name, dname in CASES:
        if ctx.rank >= p:
            continue
        dtype = DTYPES[dname][0]
        data = _cast(graphs[_graph_of(name)], dtype)
        model = _model(name, data, dtype)
        runner = GraphParallel(data, groups[p], executor=RankOffload("1TiB"))
        budget = _budget_for_chunks(model, runner, 3)
        ex = RankOffload(budget, strict=_strict(p, dname))
        runner.executor = ex
        loss, _ = runner.train_step(model, data, _loss)
        grads = {k: v.grad.clone() for k, v in model.named_parameters()}
        model.eval()
        pred = runner.predict(model)
        out[(p, name, dname)] = {
            "loss": loss, "grads": grads, "pred": pred, "budget": budget,
            "chunks": ex.plan(model, runner).num_chunks,
            "counters": ex.counters.to_dict(),
            "owned": runner.plan.num_owned, "halo_rows": runner.plan.num_halo,
            "rows": dict(runner.stats.rows_per_layer)}
    if ctx.rank < 2:  # the strategy, through the Trainer's one-graph steps
        data = _cast(graphs["sbm"], torch.float64)
        budget = torch.tensor([out[(2, "sage", "float64")]["budget"]])
        dist.all_reduce(budget, op=dist.ReduceOp.MAX, group=groups[2])
        model = _model("sage", data, torch.float64)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        strat = DistributedStrategy(group=groups[2], device_budget=int(budget))
        strat.setup(model, [data])
        losses = []
        for _ in range(EPOCHS):
            opt.zero_grad(set_to_none=True)
            losses.append(strat.train_step(model, data, _loss))
            opt.step()
        strat.fit_end(model, [data], _loss)
        out["strategy"] = (losses, {k: v.detach().clone()
                                    for k, v in model.named_parameters()},
                           strat.summary())
    if ctx.rank < 2:  # refusals, on a 2-rank group
        data = graphs["sbm"]
        errors = {}
        runner = GraphParallel(data, groups[2], executor=RankOffload(1000))
        try:
            runner.train_step(_model("sage", data, torch.float32), data, _loss)
        except BudgetError as e:
            errors["small"] = str(e)
        # One rank's budget too small: its peer fails too instead of waiting.
        runner = GraphParallel(data, groups[2], executor=RankOffload(
            1000 if ctx.rank == 0 else "1GiB"))
        try:
            runner.train_step(_model("sage", data, torch.float32), data, _loss)
        except BudgetError as e:
            errors["one_small"] = str(e)
        res = ResGNN(data.num_features, 8, 4, 2, conv="sage", num_groups=2)
        runner = GraphParallel(data, groups[2], executor=RankOffload("1GiB"))
        try:
            runner.train_step(res, data, _loss)
        except ValueError as e:
            errors["model"] = str(e)
        out["errors"] = errors
    return out


@pytest.fixture(scope="module")
def results(graphs):
    # Workspace calibrations are cached per model structure: made once here,
    # the forked ranks inherit them instead of each measuring its own.
    for name in MODELS:
        for dtype, _ in DTYPES.values():
            data = _cast(graphs[_graph_of(name)], dtype)
            model = _model(name, data, dtype)
            lw = LayerwiseModel(model)
            RankOffload._calibrate(model, lw, name == "gcn", torch.device("cpu"))
    return spawn(_worker, 4, args=(graphs,), start_method="fork", join_timeout=300)


@pytest.fixture(scope="module")
def references(graphs):
    """PyG full-batch loss, gradients and eval predictions per (model, dtype)."""
    out = {}
    for name in MODELS:
        for dname, (dtype, _) in DTYPES.items():
            data = _cast(graphs[_graph_of(name)], dtype)
            model = _model(name, data, dtype)
            loss = _loss(model(data.x, data.edge_index), data)
            loss.backward()
            grads = {k: v.grad for k, v in model.named_parameters()}
            model.eval()
            with torch.no_grad():
                pred = model(data.x, data.edge_index)
            out[(name, dname)] = (loss.detach(), grads, pred)
    return out


def _close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> None:
    # Relative to the tensor's scale: single entries may cancel to ~0.
    scale = float(b.abs().max()) if b.numel() else 1.0
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(scale, 1e-30),
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("p,name,dname", CASES, ids=lambda v: str(v))
def test_offloaded_ranks_equal_full_batch(results, references, p, name, dname):
    tol = DTYPES[dname][1]
    loss, grads, pred = references[(name, dname)]
    for rank in range(p):
        got = results[rank][(p, name, dname)]
        _close(torch.tensor(got["loss"], dtype=torch.float64),
               loss.to(torch.float64), tol, f"rank {rank} loss")
        assert got["grads"].keys() == grads.keys()
        for k, g in grads.items():
            _close(got["grads"][k], g, tol, f"rank {rank} grad {k}")
    _close(results[0][(p, name, dname)]["pred"], pred, tol, "predict")


@pytest.mark.parametrize("p", (2, 3, 4))
def test_each_rank_runs_chunks_under_its_budget(results, p):
    for name in MODELS:
        for dname in DTYPES:
            for rank in range(p):
                got = results[rank][(p, name, dname)]
                c = got["counters"]
                # The part did not fit one job: several chunks per layer.
                assert got["chunks"] >= 2
                # Train: L forward + L backward sweeps; predict: L forward.
                assert c["jobs"] == 3 * LAYERS * got["chunks"]
                # Every owned row computed once per layer and pass,
                # recomputed once per layer in backward.
                assert c["vertex_layer_computations"] == 2 * LAYERS * got["owned"]
                assert c["vertex_layer_recomputations"] == LAYERS * got["owned"]
                assert 0 < c["peak_device_bytes"] <= got["budget"]
                if _strict(p, dname):  # measured too
                    assert 0 < c["peak_device_bytes_measured"] <= got["budget"]
                # the halo still moves once per layer and forward
                assert got["rows"].get(1, 0) == 2 * got["halo_rows"]


def test_refusals_name_the_problem(results):
    for rank in range(2):
        errors = results[rank]["errors"]
        assert "does not even hold the parameters" in errors["small"]
        assert errors["small"].startswith(f"rank {rank}: ")
        assert ("does not even hold the parameters" if rank == 0 else
                "too small on 1 other rank(s)") in errors["one_small"]
        assert "offload supports PyG BasicGNN" in errors["model"]


def test_strategy_with_device_budget_follows_full_batch(results, graphs):
    data = _cast(graphs["sbm"], torch.float64)
    model = _model("sage", data, torch.float64)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref = []
    for _ in range(EPOCHS):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model(data.x, data.edge_index), data)
        loss.backward()
        opt.step()
        ref.append(float(loss.detach()))
    for rank in range(2):
        losses, params, summary = results[rank]["strategy"]
        assert losses == pytest.approx(ref, rel=1e-10)
        for k, v in model.named_parameters():
            _close(params[k], v.detach(), 1e-10, f"rank {rank} param {k}")
        d = summary["distributed"]
        assert d["mode"] == "graph"
        per_rank = d["offload_per_rank"]
        assert len(per_rank) == 2
        for r in per_rank:
            assert r["num_chunks"][0] >= 2
            assert r["counters"]["jobs"] == 2 * EPOCHS * LAYERS * r["num_chunks"][0]


def _cuda_worker(ctx, data, backend):
    # NCCL: one GPU per rank (ctx.device); gloo: ranks may share GPU 0.
    device = ctx.device if backend == "nccl" else torch.device("cuda", 0)
    data = _cast(data, torch.float64)
    model = _model("gcn", data, torch.float64).to(device)
    runner = GraphParallel(data, device=device, executor=RankOffload("1TiB"))
    budget = _budget_for_chunks(model, runner, 3)
    ex = RankOffload(budget, strict=True)
    runner.executor = ex
    loss, _ = runner.train_step(model, data, _loss)
    return (loss, {k: v.grad.cpu() for k, v in model.named_parameters()},
            ex.plan(model, runner).num_chunks, ex.counters.to_dict(), budget)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available: "
                    "ranks under the offload engine on GPUs need one")
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_cuda_ranks_under_offload_equal_full_batch(graphs, backend):
    data = graphs["sbm"]
    nproc = min(2, torch.cuda.device_count()) if backend == "nccl" else 2
    res = spawn(_cuda_worker, nproc, args=(data, backend), backend=backend,
                timeout=120, join_timeout=300)
    ref_data = _cast(data, torch.float64)
    model = _model("gcn", ref_data, torch.float64)
    loss = _loss(model(ref_data.x, ref_data.edge_index), ref_data)
    loss.backward()
    for got_loss, grads, chunks, counters, budget in res:
        _close(torch.tensor(got_loss, dtype=torch.float64), loss.detach(), 1e-10,
               "loss")
        for k, v in model.named_parameters():
            _close(grads[k], v.grad, 1e-10, f"grad {k}")
        assert chunks >= 2
        # the CUDA allocator's peak per job, with the parameters resident
        assert 0 < counters["peak_device_bytes_measured"] <= budget
