"""The memory check: exact parameter counts, lower-bound activations, refusals."""

from __future__ import annotations

import pytest
import torch

from leangnn.config import TrainConfig
from leangnn.data import GraphSplits
from leangnn.nn.models import MODELS, build_model
from leangnn.plan import fits
from leangnn.profile import SavedTensorsMeter


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("layers", [1, 2, 3, 5])
def test_parameter_count_equals_the_built_model(name, layers):
    """Counted on the meta device and extrapolated; the reference builds the
    real model."""
    cfg = TrainConfig(model=name, num_layers=layers, hidden_channels=16,
                      num_groups=2, sparsity=None, conv="gcn")
    real = build_model(name, 7, 16, 3, layers, **cfg.model_options())
    assert fits.parameter_count(cfg, 7, 3) == sum(p.numel() for p in
                                                  real.parameters())


def _graph(n=600, e=4800, f=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, f, generator=gen),
            torch.randint(0, n, (2, e), generator=gen))


@pytest.mark.parametrize("model, strategy", [("res", "full"), ("gsr", "reversible"),
                                             ("sage", "full"), ("gcn", "full")])
def test_activation_estimate_is_a_lower_bound_of_what_autograd_saves(model,
                                                                     strategy):
    """Reference: the bytes autograd actually saves for backward."""
    torch.manual_seed(0)
    x, ei = _graph()
    cfg = TrainConfig(model=model, strategy=strategy, num_layers=6,
                      hidden_channels=32, num_groups=4)
    net = build_model(model, 6, 32, 1, 6, **cfg.model_options()).train()
    with SavedTensorsMeter() as m:
        out = net(x, ei).sum()
    del out
    est = fits.estimate(cfg, 600, 4800, 6, 1)
    assert 0 < est.activation_bytes <= m.bytes
    # and not a vacuous bound: within 4x of the measurement
    assert est.activation_bytes * 4 >= m.bytes


def test_estimate_shapes():
    cfg = TrainConfig(num_layers=8, hidden_channels=64)
    base = fits.estimate(cfg)
    assert base.activation_bytes == 0 and base.graph_bytes == 0
    assert base.parameter_bytes == fits.parameter_count(cfg) * 16
    big = fits.estimate(cfg, 1000, 5000)
    deep = fits.estimate(TrainConfig(num_layers=16, hidden_channels=64), 1000, 5000)
    assert deep.activation_bytes * 7 == big.activation_bytes * 15  # L - 1
    rev = [fits.estimate(TrainConfig(strategy="reversible", num_layers=k), 1000, 5000)
           for k in (8, 64)]
    assert rev[0].activation_bytes == rev[1].activation_bytes > 0
    pruned = fits.estimate(TrainConfig(strategy="prune", model="sage",
                                       budget_ratio=0.25), 1000, 5000)
    full = fits.estimate(TrainConfig(model="sage"), 1000, 5000)
    assert pruned.activation_bytes == full.activation_bytes // 4
    off = fits.estimate(TrainConfig(strategy="offload"), 1000, 5000)
    assert off.activation_bytes == 0 and off.host_bytes > full.host_bytes
    unloaded = fits.estimate(cfg, 1000, 5000, loaded=False)
    assert unloaded.host_bytes - big.host_bytes == \
        1000 * fits.PROBE_IN_CHANNELS * 4 + 5000 * 16


def test_available_bytes_reads_this_machine():
    have = fits.available_bytes("cpu")
    total = None
    try:
        with open("/proc/meminfo") as f:
            total = next(int(ln.split()[1]) * 1024 for ln in f
                         if ln.startswith("MemTotal:"))
    except OSError:
        pass
    assert have is None or 0 < have
    if have is not None and total is not None:
        assert have <= total


def _splits(n=2000, e=20000):
    x, ei = _graph(n, e)
    from torch_geometric.data import Data

    g = Data(x=x, edge_index=ei, y=torch.zeros(n))
    return GraphSplits([g], [g], [g], "regression", 1)


def test_check_fits_refuses_with_the_estimate(monkeypatch):
    cfg = TrainConfig(model="res", num_layers=64, hidden_channels=256)
    splits = _splits()
    monkeypatch.setattr(fits, "_host_available", lambda: 64 << 30)
    fits.check_fits(cfg, splits)  # fits in 64 GiB
    fits.check_fits(cfg)
    need = fits.estimate(cfg, 2000, 20000, 6, 1).device_bytes
    monkeypatch.setattr(fits, "_host_available", lambda: need - 1)
    with pytest.raises(ValueError, match=r"num_layers=64, hidden_channels=256, "
                       r"model=res: this run needs ~.* of cpu memory \(estimate: "
                       r"parameters and optimizer state .*, activations .*\), only"):
        fits.check_fits(cfg, splits)
    monkeypatch.setattr(fits, "_host_available", lambda: need)
    fits.check_fits(cfg, splits)
    monkeypatch.setattr(fits, "_host_available", lambda: None)
    fits.check_fits(TrainConfig(num_layers=10**6, hidden_channels=4, num_groups=1))


def test_check_fits_counts_a_csbm_graph_before_it_exists(monkeypatch):
    monkeypatch.setattr(fits, "_host_available", lambda: 1 << 30)
    fits.check_fits(TrainConfig(dataset="csbm:1000"))
    with pytest.raises(ValueError, match=r"csbm:1000000 needs ~1.9 GiB of host "
                       "memory to generate"):
        fits.check_fits(TrainConfig(dataset="csbm:1e6"))
    with pytest.raises(ValueError, match="activations"):
        fits.check_fits(TrainConfig(dataset="csbm:2e5", num_layers=64))


def test_parameter_counts_are_kept_per_registered_model():
    # counts are memoised per configuration; a model registered again under
    # the same name is counted anew
    from torch_geometric.nn.models import GCN

    from leangnn.nn.models import register_model

    def small(i, h, o, n, **kw):
        return GCN(i, h, n, o)

    def wide(i, h, o, n, **kw):
        return GCN(i, 2 * h, n, o)

    register_model("_count_probe", small, layerwise=False)
    try:
        cfg = TrainConfig(model="_count_probe", num_layers=2, hidden_channels=8)
        first = fits.parameter_count(cfg, 5, 3)
        assert fits.parameter_count(cfg, 5, 3) == first == sum(
            p.numel() for p in GCN(5, 8, 2, 3).parameters())
        register_model("_count_probe", wide, replace=True)
        assert fits.parameter_count(cfg, 5, 3) == sum(
            p.numel() for p in GCN(5, 16, 2, 3).parameters())
    finally:
        MODELS.pop("_count_probe", None)
