"""Data parallel over circuits and the ``distributed`` strategy on 2 gloo ranks
equal single-process training (same batches, same optimizer, float64).

One 2-process job (forked once for the module) runs every check; the
references are plain single-process PyTorch training loops run here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn.models import GraphSAGE

from leangnn.circuits import load_circuit
from leangnn.distributed import (
    DataParallel,
    DistributedStrategy,
    batch_mean_loss,
    epoch_batches,
    spawn,
)
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import ResGNN

CIRCUITS = ("c432", "c499", "c880", "c1355", "c1908")  # 5 graphs: last batch short
EPOCHS = 2


def _loss(out: torch.Tensor, data: Data) -> torch.Tensor:
    mask = data.get("node_mask", None)
    y = data.y
    if mask is not None:
        out, y = out[mask], y[mask]
    if y.dtype.is_floating_point:
        return F.mse_loss(out.reshape(-1), y.to(out.dtype))
    return F.cross_entropy(out, y)


def _circuits() -> list[Data]:
    out = []
    for name in CIRCUITS:
        c = load_circuit(name, "signal_prob")
        out.append(Data(x=c.x.double(), edge_index=c.edge_index, y=c.y.double(),
                        num_nodes=c.num_nodes, name=c.name))
    return out


def _sbm() -> Data:
    s = contextual_sbm(200, num_classes=3, avg_degree=5, in_channels=6, seed=4)
    return Data(x=s.x.double(), edge_index=s.edge_index, y=s.y,
                node_mask=s.train_mask, num_nodes=s.num_nodes, name="sbm")


def _sage(in_channels: int) -> torch.nn.Module:
    torch.manual_seed(3)
    return GraphSAGE(in_channels, 16, 3, 1).double()


def _res(in_channels: int, out_channels: int) -> torch.nn.Module:
    torch.manual_seed(5)
    return ResGNN(in_channels, 16, out_channels, 3, conv="gcn").double()


def _order(epoch: int, n: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _worker(ctx, circuits, sbm):
    out = {}
    # 1. DataParallel in a hand-written loop.
    model = _sage(circuits[0].num_features)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    dp = DataParallel()
    losses = []
    for epoch in range(EPOCHS):
        for batch in dp.batches(_order(epoch, len(circuits))):
            opt.zero_grad(set_to_none=True)
            mine = [circuits[i] for i in dp.share(batch)]
            losses.append(dp.train_step(model, mine, _loss, len(batch)))
            opt.step()
    out["dp"] = (losses, _params(model))

    # 2. The strategy in data mode, driven through the Trainer's batch hooks.
    model = _res(circuits[0].num_features, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    strat = DistributedStrategy(mode="data")
    strat.setup(model, circuits)
    losses = []
    for epoch in range(EPOCHS):
        strat.epoch_start(epoch)
        for batch in strat.epoch_batches(_order(epoch, len(circuits))):
            opt.zero_grad(set_to_none=True)
            losses.append(strat.train_batch(model, [circuits[i] for i in batch],
                                            _loss))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        strat.epoch_end(epoch)
    preds = [strat.predict(model, g) for g in circuits[:2]]
    strat.fit_end(model, circuits, _loss)
    out["strategy_data"] = (losses, _params(model), preds, strat.summary())

    # 3. The strategy in graph mode through the Trainer's plain one-graph
    #    steps (no epoch hooks: epochs are counted from the steps).
    model = _res(sbm.num_features, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    strat = DistributedStrategy()
    strat.setup(model, [sbm])
    losses = []
    for _ in range(EPOCHS):
        opt.zero_grad(set_to_none=True)
        losses.append(strat.train_step(model, sbm, _loss))
        opt.step()
    model.eval()
    pred = strat.predict(model, sbm)
    strat.fit_end(model, [sbm], _loss)
    out["strategy_graph"] = (losses, _params(model), pred, strat.summary(),
                             strat.is_main)
    return out


@pytest.fixture(scope="module")
def circuits():
    return _circuits()


@pytest.fixture(scope="module")
def sbm():
    return _sbm()


@pytest.fixture(scope="module")
def results(circuits, sbm):
    return spawn(_worker, 2, args=(circuits, sbm), start_method="fork",
                 join_timeout=300)


def _close(a, b, what, tol=1e-10):
    scale = float(b.abs().max()) if b.numel() else 1.0
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(scale, 1e-30),
                               msg=lambda m: f"{what}: {m}")


def _check(got_losses, got_params, ref_losses, model, tag):
    assert len(got_losses) == len(ref_losses)
    _close(torch.tensor(got_losses), torch.tensor(ref_losses), f"{tag} losses")
    for k, v in model.named_parameters():
        _close(got_params[k], v.detach(), f"{tag} parameter {k}")


def test_data_parallel_equals_single_process_batches(results, circuits):
    model = _sage(circuits[0].num_features)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref = []
    for epoch in range(EPOCHS):
        for batch in epoch_batches(_order(epoch, len(circuits)), 2):
            opt.zero_grad(set_to_none=True)
            loss = batch_mean_loss(model, [circuits[i] for i in batch], _loss)
            loss.backward()
            opt.step()
            ref.append(float(loss.detach()))
    assert len(ref) == EPOCHS * 3  # batches of 2, 2 and 1 graphs
    for rank in range(2):
        _check(*results[rank]["dp"], ref, model, f"rank {rank}")


def test_strategy_data_mode_equals_single_process(results, circuits):
    model = _res(circuits[0].num_features, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref = []
    for epoch in range(EPOCHS):
        for batch in epoch_batches(_order(epoch, len(circuits)), 2):
            opt.zero_grad(set_to_none=True)
            loss = batch_mean_loss(model, [circuits[i] for i in batch], _loss)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            ref.append(float(loss.detach()))
    for rank in range(2):
        losses, params, preds, summary = results[rank]["strategy_data"]
        _check(losses, params, ref, model, f"rank {rank}")
        with torch.no_grad():
            for g, p in zip(circuits, preds):
                _close(p, model(g.x, g.edge_index), "predict")
        recs = summary["distributed"]["records_per_rank"]
        assert summary["distributed"]["mode"] == "data"
        assert [len(r) for r in recs] == [EPOCHS, EPOCHS]
        n_param = sum(p.numel() for p in model.parameters())
        n_tensors = len(list(model.parameters()))
        for r in recs:
            for e in r:
                assert e["halo_bytes_sent"] == 0
                # one flat float64 all-reduce (+ a flag per parameter) per step
                assert e["allreduce_payload_bytes"] == 3 * 8 * (n_param + n_tensors)


def test_strategy_graph_mode_equals_full_batch(results, sbm):
    model = _res(sbm.num_features, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    ref = []
    for _ in range(EPOCHS):
        opt.zero_grad(set_to_none=True)
        loss = _loss(model(sbm.x, sbm.edge_index), sbm)
        loss.backward()
        opt.step()
        ref.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        pred = model(sbm.x, sbm.edge_index)
    mains = []
    for rank in range(2):
        losses, params, got_pred, summary, is_main = results[rank]["strategy_graph"]
        mains.append(is_main)
        _check(losses, params, ref, model, f"rank {rank}")
        _close(got_pred, pred, "predict")
        d = summary["distributed"]
        assert d["mode"] == "graph" and d["world_size"] == 2
        for r in d["records_per_rank"]:
            assert [e["epoch"] for e in r] == list(range(1, EPOCHS + 1))
            assert all(e["halo_bytes_received"] > 0 for e in r)
    assert mains == [True, False]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        DistributedStrategy(mode="model")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        epoch_batches([0, 1], 0)
