"""The meta-device dry run against the fake-tensor one (the same trace, op by
op) and against real steps (the live-bytes meter of leangnn.profile)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import default_loss
from leangnn.plan.fake import TooManyOpsError, UnsupportedOpError
from leangnn.profile import LiveBytesMeter
from leangnn.strategy import FullBatch


@pytest.fixture(scope="module")
def graph():
    g = contextual_sbm(1500, avg_degree=8.0, in_channels=12, seed=1)
    return with_mask(g, g.train_mask)  # a masked loss: boolean indexing


def _same(model, data, step=None, **kw):
    loss_fn = default_loss(data)
    fake = trace_step(model, data, loss_fn, step, backend="fake", **kw)
    meta = trace_step(model, data, loss_fn, step, backend="meta", **kw)
    assert dataclasses.asdict(meta) == dataclasses.asdict(fake)
    assert meta.ops > 0 and meta.flops > 0 and meta.peak_bytes > 0
    return meta


SLOW = pytest.mark.slow
MODELS = [
    ("res", dict(conv="sage")),
    ("res", dict(conv="gcn", dropout=0.2)),
    # GSR's GAT kernel: CSR matrices of fake attention weights, sampled
    # products in its backward
    ("gsr", dict(conv="gat", num_groups=2)),
    pytest.param("gsr", dict(conv="gcn", num_groups=2, sparsity=2, dropout=0.1),
                 marks=SLOW),
    pytest.param("res", dict(conv="gat"), marks=SLOW),
    pytest.param("gsr", dict(conv="sage", num_groups=2), marks=SLOW),
    pytest.param("gat", dict(dropout=0.3), marks=SLOW),
]


@pytest.mark.parametrize("plain", [True, False])
@pytest.mark.parametrize("name,opts", MODELS)
def test_meta_trace_equals_fake_trace(graph, name, opts, plain):
    torch.manual_seed(0)
    depth = 2 if name == "gsr" else 3
    model = build_model(name, graph.num_features, 32, 8, depth, **opts)
    _same(model, graph, plain=plain)


@pytest.mark.parametrize("backend", ["fake", "meta"])
def test_in_place_arithmetic_on_real_tensors_applies_once(graph, backend):
    # fake mode's constant propagation runs ``add_`` on a real operand
    # itself; the dry run must not apply it a second time (a CSR build's
    # decoded indices went negative on the fake backend, CUDA's)
    seen = []

    def step(model, data, loss_fn):
        key, _ = torch.sort(data.edge_index[1] * data.num_nodes + data.edge_index[0])
        row = torch.div(key, data.num_nodes, rounding_mode="floor")
        col = key.add_(row, alpha=-data.num_nodes)  # key % num_nodes
        row.mul_(1).sub_(0)
        seen.append((row.clone(), col.clone()))
        out = model(data.x, data.edge_index)
        loss = loss_fn(out[col[: data.num_nodes]], data.y[row[: data.num_nodes]])
        loss.backward()

    torch.manual_seed(0)
    model = GCN(graph.num_features, 16, 2, out_channels=8)
    trace_step(model, graph, torch.nn.functional.cross_entropy, step,
               backend=backend)
    (row, col), = seen
    ei = graph.edge_index
    key = torch.sort(ei[1] * graph.num_nodes + ei[0]).values
    assert torch.equal(row, key // graph.num_nodes)
    assert torch.equal(col, key % graph.num_nodes)


def test_traces_do_not_depend_on_earlier_real_steps(graph):
    # a real step first (its kernels may fill module-level state, e.g. the
    # bit-packing of dropout masks): both backends still trace alike
    from leangnn.nn.group_sparse import pack_bits

    pack_bits(torch.rand(64) > 0.5)
    torch.manual_seed(0)
    model = build_model("res", graph.num_features, 32, 8, 3, conv="gcn", dropout=0.2)
    model(graph.x, graph.edge_index).sum().backward()
    _same(model, graph, plain=True)


@pytest.mark.parametrize("make", [
    lambda: GCN(12, 32, 3, 8),  # self loops through a boolean mask of edges
    lambda: GIN(12, 32, 2, 8),
    pytest.param(lambda: GraphSAGE(12, 32, 3, 8, dropout=0.2), marks=SLOW),
    pytest.param(lambda: GAT(12, 16, 2, 8, heads=2), marks=SLOW),
], ids=["gcn", "gin", "sage", "gat"])
def test_pyg_models_trace_alike(graph, make):
    torch.manual_seed(0)
    # PyG's message passing: gathers and scatters, no sparse products
    assert _same(make(), graph).sparse_flops == 0


@pytest.mark.parametrize("name", ["gcn", "sage", "res"])
def test_dpr_core_through_its_adjacency(graph, name):
    # DPR trains its core through a sparse CSR adjacency (products of a real
    # sparse matrix with meta features: summed for GCN, mean-reduced for
    # SAGE, whose kernel and backward the meta path shapes without a run)
    from leangnn.plan.estimate import _adj_step
    from leangnn.prune.dpr import DPRStrategy

    core = DPRStrategy(budget_ratio=0.4).prepare(graph).train_data
    assert core.get("adj_t", None) is not None
    torch.manual_seed(0)
    step = _adj_step if core.get("edge_index", None) is None else None
    model = build_model(name, 12, 16, 8, 2)
    trace = _same(model, core, step)
    # its aggregations are products with the core's CSR adjacency: the
    # reference counts them in a real step, 2 nnz multiply-adds per column
    from torch.utils._python_dispatch import TorchDispatchMode

    class SparseProducts(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sparse = [a for a in args if isinstance(a, torch.Tensor)
                      and a.layout != torch.strided]
            # a product (mm, or the mean-reduced one and its backward)
            if sparse and "mm" in func.__name__.split(".")[0]:
                first = next(t for t in (out if isinstance(out, (tuple, list))
                                         else (out,)) if t is not None)
                SparseProducts.flops += 2 * sparse[0]._nnz() * first.size(-1)
            return out

    with SparseProducts():
        _adj_step(model, core, default_loss(core))
    assert trace.sparse_flops == SparseProducts.flops > 0


def test_meta_matches_a_real_step(graph):
    # what the live-bytes meter (a dispatch mode) sees of a real Trainer step
    torch.manual_seed(0)
    model = build_model("res", graph.num_features, 32, 8, 3, conv="sage")
    loss_fn = default_loss(graph)
    rng = torch.get_rng_state()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trace = trace_step(model, graph, loss_fn, plain=False, backend="meta")
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loaded = [*model.parameters(), *(v for v in graph.to_dict().values()
                                     if isinstance(v, torch.Tensor))]
    with LiveBytesMeter(exclude=loaded) as meter:
        opt.zero_grad(set_to_none=True)
        FullBatch("cpu").train_step(model, graph, loss_fn)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    assert trace.peak_bytes == pytest.approx(meter.peak, rel=0.02)


_SEEN: list = []


class _DeviceFollower(torch.nn.Module):
    """Moves the graph to the features' device and makes tensors there, as
    models do (``x.device`` is ``meta`` in the dry run, ``cpu`` for real)."""

    def __init__(self, c):
        super().__init__()
        self.lin = torch.nn.Linear(c, 8)

    def forward(self, x, edge_index):
        h = self.lin(x).to("cpu")  # on the CPU already: no op
        edge_index = edge_index.to(h.device)
        col = edge_index[1].to(h.device, torch.int32).long()  # a conversion
        deg = torch.zeros(h.size(0), device=h.device)
        deg.scatter_add_(0, col, torch.ones(edge_index.size(1), device=h.device))
        big = torch.zeros(h.size(0), 64, device=h.device)  # over the real limit
        _SEEN.append((deg.is_meta, big.is_meta))
        return h * deg.clamp(min=1).rsqrt().unsqueeze(1) + big[:, :8]


def test_device_queries_follow_the_step_device(graph):
    # made on the step's device as under fake tensors: the degree is real
    # (graph-sized, from the graph alone), the large zeros are not
    _SEEN.clear()
    trace = _same(_DeviceFollower(graph.num_features), graph,
                  concrete_limit=graph.num_nodes * 8)
    assert trace.peak_bytes > graph.num_nodes * 64 * 4
    assert _SEEN[-1] == (False, True)  # (the meta run's) real degree, meta zeros


class _Cached(torch.nn.Module):
    """Tensors outside parameters and buffers: a plain attribute, and the
    normalised graph a cached GCNConv kept from a real forward."""

    def __init__(self, c):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv = GCNConv(c, 8, cached=True)
        self.scale = torch.full((8,), 0.5)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index) * self.scale


def test_tensors_outside_parameters_are_copied_alike(graph):
    # fake_model makes every tensor of the copy fake, meta_model meta: the
    # cached graph (real in the model) is computed on like a feature tensor
    model = _Cached(graph.num_features)
    model(graph.x, graph.edge_index)  # fills the cache
    trace = _same(model, graph)
    assert model.scale.device.type == "cpu"  # the model itself is untouched
    assert trace.ops < _same(_Cached(graph.num_features), graph).ops


class _FeatureMask(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.lin = torch.nn.Linear(c, 8)

    def forward(self, x, edge_index):
        h = self.lin(x)
        return h[h[:, 0] > 0].sum(0, keepdim=True).expand_as(h)


class _FeatureItem(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.lin = torch.nn.Linear(c, 8)

    def forward(self, x, edge_index):
        h = self.lin(x)
        k = int(h.argmax())  # an integer read from features
        return h * k


def test_feature_dependent_ops_raise_clear_errors(graph):
    loss_fn = default_loss(graph)
    with pytest.raises(UnsupportedOpError, match="value-dependent"):
        trace_step(_FeatureMask(graph.num_features), graph, loss_fn, backend="meta")
    with pytest.raises(UnsupportedOpError, match=r"\.item\(\)"):
        trace_step(_FeatureItem(graph.num_features), graph, loss_fn, backend="meta")


def test_op_budget_and_backend_arguments(graph):
    model = build_model("res", graph.num_features, 8, 8, 3)
    with pytest.raises(TooManyOpsError, match="more than 50 ops"):
        trace_step(model, graph, default_loss(graph), max_ops=50, backend="meta")
    with pytest.raises(ValueError, match="backend"):
        trace_step(model, graph, default_loss(graph), backend="gpu")
    with pytest.raises(ValueError, match="CPU"):
        trace_step(model, graph, default_loss(graph), device="cuda", backend="meta")


def test_memoised_outputs_are_fresh_and_views_stay_views():
    # the memo rebuilds a functional op's output; an op whose schema has no
    # alias but returns a view (``_unsafe_view``) is never rebuilt
    from leangnn.plan.meta import _kernel

    aten = torch.ops.aten
    x = torch.empty(6, 4, device="meta")
    a = _kernel(aten.add.Tensor, (x, x), {})
    b = _kernel(aten.add.Tensor, (x, x), {})
    assert a.shape == b.shape and a.stride() == b.stride()
    assert a.untyped_storage()._cdata != b.untyped_storage()._cdata
    for _ in range(2):
        v = _kernel(aten._unsafe_view.default, (x, [24]), {})
        assert v.untyped_storage()._cdata == x.untyped_storage()._cdata
    # an integer operand promotes unlike a float one of equal value
    i = torch.empty(3, dtype=torch.long, device="meta")
    assert _kernel(aten.add.Tensor, (i, 1), {}).dtype == torch.long
    assert _kernel(aten.add.Tensor, (i, 1.0), {}).dtype == torch.float32



def test_memoised_in_place_ops_return_their_operand_and_still_check():
    # an in-place op's kernel, once seen to leave its operand as it was, is
    # not run again for the same metadata; one that changes the operand's
    # metadata (``t_``, ``unsqueeze_``) runs every time, and one that failed
    # fails again
    from leangnn.plan.meta import _MEMO, _SELF, _kernel

    aten = torch.ops.aten
    x, g = torch.empty(5, 3, device="meta"), torch.empty(5, 3, device="meta")
    for _ in range(2):
        assert _kernel(aten.lerp_.Scalar, (x, g, 0.1), {}) is x
        assert _kernel(aten.addcdiv_.default, (x, g, g), {"value": -0.5}) is x
    assert any(v is _SELF for k, v in _MEMO.items() if k[0] is aten.lerp_.Scalar)
    assert not any(k[0] is aten.t_.default for k in _MEMO)
    y = torch.empty(5, 3, device="meta")
    for shape in ((3, 5), (5, 3)):  # transposed back and forth: never memoised
        assert _kernel(aten.t_.default, (y,), {}) is y
        assert tuple(y.shape) == shape
    z = torch.empty(4, device="meta")
    for _ in range(2):
        _kernel(aten.unsqueeze_.default, (z, 0), {})
    assert tuple(z.shape) == (1, 1, 4)
    small = torch.empty(3, device="meta")
    for _ in range(2):  # broadcasting into a smaller operand: refused each time
        with pytest.raises(RuntimeError):
            _kernel(aten.add_.Tensor, (small, x), {})

def test_a_model_on_the_meta_device_traces_as_the_real_one(graph):
    # trace_step's documented input "real or meta parameters" (the fake path
    # cannot move a meta copy back to the CPU: fake tensors' swap fails)
    torch.manual_seed(0)
    model = build_model("gsr", graph.num_features, 32, 8, 2, conv="gat",
                        num_groups=2)
    real = trace_step(model, graph, default_loss(graph))
    meta = trace_step(model.to("meta"), graph, default_loss(graph))
    assert dataclasses.asdict(meta) == dataclasses.asdict(real)


def test_kernel_answers_kept_on_disk_give_the_same_trace(graph, tmp_path,
                                                        monkeypatch):
    # a new process (empty in-process memo) planning the same graph reads
    # the meta kernels' answers from disk: same trace, no kernel re-run
    from leangnn.plan import meta as M

    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    torch.manual_seed(0)
    model = build_model("res", graph.num_features, 32, 8, 2, conv="gcn")
    loss_fn = default_loss(graph)
    M._MEMO.clear()
    first = trace_step(model, graph, loss_fn, backend="meta")
    files = list((tmp_path / "meta").rglob("*.json"))
    assert len(files) == 1 and f"n{graph.num_nodes}-" in files[0].name
    kept = files[0].read_text()
    M._MEMO.clear()
    hits = []
    monkeypatch.setattr(M, "_from_disk",
                        lambda e, f=M._from_disk: hits.append(e) or f(e))
    again = trace_step(model, graph, loss_fn, backend="meta")
    assert dataclasses.asdict(again) == dataclasses.asdict(first)
    # (ops whose output is a view are never kept: looked up once, missed)
    assert sum(1 for h in hits if h) > 20 and sum(1 for h in hits if not h) < 5
    assert files[0].read_text() == kept  # nothing new to add
    assert '"self"' in kept  # Adam's in-place checks are kept too
    files[0].write_text("{not json")  # a damaged file only costs the kernels
    M._MEMO.clear()
    assert dataclasses.asdict(trace_step(model, graph, loss_fn, backend="meta")) \
        == dataclasses.asdict(first)


class _Spy:
    """An op overload that records its calls (named as the op on disk)."""

    def __init__(self, op, calls):
        self.op, self.calls = op, calls

    def __getattr__(self, name):
        return getattr(self.op, name)

    def __repr__(self):
        return repr(self.op)

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.op(*args, **kwargs)


def test_in_place_checks_kept_on_disk_are_not_run_again(tmp_path, monkeypatch):
    # a new process (empty in-process memo) skips an in-place op's kernel
    # that left the same operands as they were; one that failed still fails
    from leangnn.plan import meta as M

    aten = torch.ops.aten
    monkeypatch.setenv("LEANGNN_CACHE", str(tmp_path))
    x, g = torch.empty(5, 3, device="meta"), torch.empty(5, 3, device="meta")
    small = torch.empty(3, device="meta")
    for fresh_process in (True, False):
        M._MEMO.clear()
        ran = []
        lerp = _Spy(aten.lerp_.Scalar, ran)
        with M.disk_memo("spy"):
            assert M._kernel(lerp, (x, g, 0.1), {}) is x
            with pytest.raises(RuntimeError):
                M._kernel(_Spy(aten.add_.Tensor, ran), (small, x), {})
        assert len(ran) == (2 if fresh_process else 1)  # the failure, again
    assert '"self"' in next((tmp_path / "meta").rglob("spy.json")).read_text()


def test_auto_falls_back_to_fake_mode_on_a_meta_failure(graph, monkeypatch):
    # an op the meta path mishandles (simulated) costs a fake-mode run under
    # backend="auto"; backend="meta" shows the error
    from leangnn.plan import meta as M

    def broken(self, func, types, args=(), kwargs=None):
        raise RuntimeError("simulated meta failure")

    torch.manual_seed(0)
    model = build_model("sage", graph.num_features, 16, 8, 2)
    loss_fn = default_loss(graph)
    fake = trace_step(model, graph, loss_fn, backend="fake")
    monkeypatch.setattr(M.MetaTracker, "__torch_dispatch__", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        trace_step(model, graph, loss_fn, backend="meta")
    auto = trace_step(model, graph, loss_fn)
    assert dataclasses.asdict(auto) == dataclasses.asdict(fake)
    with pytest.raises(UnsupportedOpError, match="value-dependent"):
        trace_step(_FeatureMask(graph.num_features), graph, loss_fn)


@pytest.mark.parametrize("name,opts", [("res", dict(conv="gcn", dropout=0.2)),
                                       ("gsr", dict(conv="gat", num_groups=2)),
                                       ("sage", {})])
def test_a_model_built_on_meta_traces_as_the_real_one(graph, name, opts):
    # the planner builds its models on the meta device and lets the trace
    # spend them (own_model) instead of initialising and copying real ones
    depth = 2 if name == "gsr" else 3
    torch.manual_seed(0)
    real = build_model(name, graph.num_features, 32, 8, depth, **opts)
    with torch.device("meta"):
        meta = build_model(name, graph.num_features, 32, 8, depth, **opts)
    loss_fn = default_loss(graph)
    ref = trace_step(real, graph, loss_fn, backend="meta")
    kept = trace_step(meta, graph, loss_fn, backend="meta")
    spent = trace_step(meta, graph, loss_fn, backend="meta", own_model=True)
    assert dataclasses.asdict(spent) == dataclasses.asdict(ref)
    assert dataclasses.asdict(kept) == dataclasses.asdict(ref)
    # traced as it is: the spent model holds its (meta) gradients; a copy
    # leaves the caller's model untouched, real or meta
    assert all(p.grad is not None and p.grad.is_meta for p in meta.parameters())
    assert all(p.grad is None for p in real.parameters())
    # the fake backend (a CUDA step's) copies a meta model into fake tensors
    fake = trace_step(meta, graph, loss_fn, backend="fake", own_model=True)
    assert dataclasses.asdict(fake) == dataclasses.asdict(ref)
