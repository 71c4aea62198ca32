"""The fake-tensor dry run against real training steps (plain autograd, the
live-bytes meter of leangnn.profile)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch_geometric.nn import GCNConv

from leangnn.data import with_mask
from leangnn.graphs.synthetic import contextual_sbm
from leangnn.nn.models import build_model
from leangnn.plan.dryrun import trace_step
from leangnn.plan.estimate import default_loss
from leangnn.plan.fake import UnsupportedOpError
from leangnn.profile import LiveBytesMeter
from leangnn.strategy import FullBatch


@pytest.fixture(scope="module")
def graph():
    g = contextual_sbm(3000, avg_degree=8.0, in_channels=12, seed=1)
    return with_mask(g, g.train_mask)  # a masked loss: boolean indexing


def _step(model, data, loss_fn):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        FullBatch("cpu").train_step(model, data, loss_fn)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def real_peak(model, data, loss_fn):
    """Live tensor bytes of one real Trainer step (excluding the loaded state),
    seen by leangnn's live-bytes meter (a dispatch mode itself)."""
    step = _step(model, data, loss_fn)
    loaded = [*model.parameters(), *(v for v in data.to_dict().values()
                                     if isinstance(v, torch.Tensor))]
    with LiveBytesMeter(exclude=loaded) as meter:
        step()
    return meter.peak


def plain_peak(model, data, loss_fn):
    """Tensor bytes of one real step run without any dispatch mode: the
    allocation events PyTorch's profiler records, summed in time order."""
    from torch.profiler import ProfilerActivity, profile

    step = _step(model, data, loss_fn)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in
                    prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def _plain_cases():
    g = contextual_sbm(3000, avg_degree=8.0, in_channels=12, seed=1)
    # (GAT is left out: the profiler's timeline of its plain run varies by one
    # edge-sized buffer from run to run, 17.2 or 20.4 MB here)
    return with_mask(g, g.train_mask), [("res", dict(conv="sage")),
                                        ("res", dict(conv="gcn")), ("sage", {})]


def _plain_run(state) -> dict:
    g, cases = state
    out = {}
    for name, opts in cases:
        torch.manual_seed(0)
        model = build_model(name, g.num_features, 32, 8, 3, **opts)
        out[name + opts.get("conv", "")] = plain_peak(model, g, default_loss(g))
    return out


SLOW = pytest.mark.slow
CASES = [
    ("res", dict(conv="sage")),
    ("res", dict(conv="gcn", dropout=0.2)),
    pytest.param("res", dict(conv="gat"), marks=SLOW),
    ("gsr", dict(conv="sage", num_groups=2)),
    # GAT group functions run leangnn.nn.csr's kernel: a CSR matrix whose
    # values are the (fake) attention weights
    ("gsr", dict(conv="gat", num_groups=2)),
    pytest.param("gsr", dict(conv="gcn", num_groups=2, sparsity=2, dropout=0.1),
                 marks=SLOW),
    pytest.param("sage", {}, marks=SLOW),
    pytest.param("gcn", {}, marks=SLOW),
    ("gat", dict(dropout=0.3)),
]


def _id(case):
    name, opts = case.values if hasattr(case, "values") else case
    return f"{name}-{opts.get('conv', '')}"


@pytest.mark.parametrize("name,opts", CASES, ids=[_id(c) for c in CASES])
def test_fake_peak_matches_real_step(graph, name, opts):
    torch.manual_seed(0)
    depth = 2 if name == "gsr" else 3
    model = build_model(name, graph.num_features, 32, 8, depth, **opts)
    loss_fn = default_loss(graph)
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    moded = trace_step(model, graph, loss_fn, plain=False)
    plain = trace_step(model, graph, loss_fn)  # checked against plain runs below
    # the dry run draws no random numbers and leaves the model alone
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    # under a dispatch mode (the meter's) autograd takes out-of-place paths
    assert moded.peak_bytes == pytest.approx(real_peak(model, graph, loss_fn),
                                             rel=0.02)
    assert set(plain.phases) == {"forward", "backward", "optimizer"}
    assert plain.ops > 0 and plain.flops > 0


@pytest.mark.parametrize("backend", ["fake", "meta"])
@pytest.mark.parametrize("heads", [1, 2])
def test_attention_spmm_with_fake_weights_matches_real(heads, backend):
    # The GAT kernel's product by a CSR matrix built from the attention
    # weights, and its backward (sampled product, transposed product): the
    # dry run's bytes against the live-bytes meter on real tensors, under
    # either backend's tracker.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from leangnn.nn.csr import CSRGraph, _AttnSpMM
    from leangnn.plan.fake import FakeTracker
    from leangnn.plan.meta import MetaTracker

    n, c = 400, 16
    g = contextual_sbm(n, avg_degree=6.0, in_channels=4, seed=3)
    loops = torch.arange(n).repeat(2, 1)
    graph = CSRGraph(torch.cat([g.edge_index, loops], 1), n)
    e = graph.col.numel()
    a_shape, x_shape = ((e,), (n, c)) if heads == 1 else ((e, heads), (n, heads, c))

    def run(alpha, x):
        out = _AttnSpMM.apply(alpha, x, graph)
        (out * out).sum().backward()

    torch.manual_seed(0)
    alpha = torch.rand(a_shape, requires_grad=True)
    x = torch.randn(x_shape, requires_grad=True)
    with LiveBytesMeter(exclude=[alpha, x]) as meter:
        run(alpha, x)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    if backend == "fake":
        # made outside the tracker, which would compute them for real (no
        # fake inputs, small): the weights must be fake, as features' are
        d_alpha = mode.from_tensor(alpha.detach()).requires_grad_()
        d_x = mode.from_tensor(x.detach()).requires_grad_()
        tracker, ctx = FakeTracker(mode, plain=False), mode
    else:
        d_alpha = torch.empty(a_shape, device="meta", requires_grad=True)
        d_x = torch.empty(x_shape, device="meta", requires_grad=True)
        tracker, ctx = MetaTracker(mode, plain=False), contextlib.nullcontext()
    with ctx, tracker:
        run(d_alpha, d_x)
        assert d_alpha.grad.shape == alpha.grad.shape
        assert d_x.grad.shape == x.grad.shape
    assert tracker.peak == pytest.approx(meter.peak, rel=0.02)
    # per head: the product, its transpose's and the sampled product, each
    # one multiply-add per entry and channel
    assert tracker.flops == heads * 3 * 2 * e * c
    # all of them in products with a sparse matrix, priced apart
    assert tracker.sparse_flops == tracker.flops


def test_data_dependent_shapes_of_the_graph_are_followed():
    # GCNConv adds self loops through a boolean mask of the edges (nonzero):
    # the dry run needs the real edge index, and gets the same bytes.
    g = contextual_sbm(300, avg_degree=6.0, in_channels=8, seed=2)
    g.edge_index = torch.cat([g.edge_index, torch.arange(20).repeat(2, 1)], 1)
    conv = GCNConv(8, 32)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = conv, torch.nn.Linear(32, 8)

        def forward(self, x, edge_index):
            return self.head(self.conv(x, edge_index).relu())

    torch.manual_seed(0)
    model = Net()
    loss_fn = default_loss(g)
    assert trace_step(model, g, loss_fn, plain=False).peak_bytes == \
        pytest.approx(real_peak(model, g, loss_fn), rel=0.02)


def test_plain_dry_run_matches_a_plain_run():
    # The reference runs in a fresh interpreter: PyTorch's profiler records
    # every allocation without a dispatch mode (a test runner's own state can
    # keep tensors alive longer than a plain run does).
    from leangnn.profile import measure_in_subprocess

    real, _ = measure_in_subprocess(_plain_cases, _plain_run, timeout=300)
    g, cases = _plain_cases()
    for name, opts in cases:
        torch.manual_seed(0)
        model = build_model(name, g.num_features, 32, 8, 3, **opts)
        est = trace_step(model, g, default_loss(g), kernel_workspace=False)
        assert est.peak_bytes == pytest.approx(real[name + opts.get("conv", "")],
                                               rel=0.025), name


class _FeatureMask(torch.nn.Module):
    """Selects nodes by a mask computed from features: a shape no dry run knows."""

    def __init__(self, c):
        super().__init__()
        self.lin = torch.nn.Linear(c, 8)

    def forward(self, x, edge_index):
        h = self.lin(x)
        return h[h[:, 0] > 0].sum(0, keepdim=True).expand_as(h)


@pytest.mark.parametrize("backend", ["fake", "meta"])
def test_feature_dependent_shape_raises_clear_error(graph, backend):
    with pytest.raises(UnsupportedOpError, match="value-dependent"):
        trace_step(_FeatureMask(graph.num_features), graph, default_loss(graph),
                   backend=backend)


def test_kernel_workspace_of_sorted_scatters():
    # CPU scatter-adds along dim 0 with an expanded index radix-sort it:
    # 32 bytes per index entry that no dispatch mode sees (measured as RSS).
    from torch._subclasses.fake_tensor import FakeTensorMode

    from leangnn.plan.fake import FakeTracker

    e, n, c = 1000, 50, 8
    index = torch.randint(0, n, (e,))
    for workspace, extra in ((True, 32 * e), (False, 0)):
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tracker = FakeTracker(mode, kernel_workspace=workspace)
        with mode, tracker:
            src, out = torch.empty(e, c), torch.zeros(n, c)
            live = tracker.live
            out.scatter_add_(0, index.view(-1, 1).expand(e, c), src)
            assert tracker.peak == live + extra
            # a materialised index takes the plain path: its copy, no sort
            out.scatter_add_(0, index.view(-1, 1).expand(e, c).contiguous(), src)
            assert tracker.peak == live + max(extra, e * c * 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,opts", [("res", dict(conv="sage")),
                                       ("gsr", dict(conv="gcn", num_groups=2))])
def test_cuda_dry_run_matches_max_memory_allocated(name, opts):
    # On CUDA the dry run runs on fake CUDA tensors (the step copies the graph
    # there, as the Trainer's does) and rounds every block to 512 bytes; the
    # reference is the caching allocator's own peak. cuBLAS' workspace and
    # CUB's sort buffers come on top, hence the absolute slack.
    g = contextual_sbm(20000, avg_degree=10.0, in_channels=32, seed=5)
    g = with_mask(g, g.train_mask)
    torch.manual_seed(0)
    model = build_model(name, g.num_features, 64, 8, 4, **opts).cuda()
    loss_fn = default_loss(g)
    trace = trace_step(model, g, loss_fn, device="cuda", round_to=512)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # cuBLAS' workspaces (2 x 32 MiB on Hopper) are no tensor of the step:
    # made before the measurement (the planner adds them as a constant)
    from leangnn.blas_workspace import ensure_blas_workspace

    ensure_blas_workspace("cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    opt.zero_grad(set_to_none=True)
    FullBatch("cuda").train_step(model, g, loss_fn)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    torch.cuda.synchronize()
    real = torch.cuda.max_memory_allocated() - base
    assert trace.peak_bytes == pytest.approx(real, rel=0.05, abs=16 << 20)


def test_heap_frontier_splits_at_the_mmap_threshold():
    # Below glibc's mmap threshold blocks come from the heap, whose resident
    # memory keeps its high-water; above it each block has its own pages.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from leangnn.plan.fake import COLD_BYTES, FakeTracker, StepTrace

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    tracker = FakeTracker(mode, heap_threshold=1000)
    with mode, tracker:
        small = torch.empty(100)        # 400 B on the heap
        del small
        big = torch.empty(1000)         # 4000 B on its own pages
        assert (tracker.live, tracker.small_live, tracker.small_hw) == (4000, 0, 400)
        del big
        torch.empty(200)                # 800 B: the heap grows
    trace = StepTrace(tracker.peak, frontier=tracker.frontier)
    assert tracker.peak == 4000
    # fresh pages are written once per new block at or above the threshold
    assert (tracker.written, tracker.big_written) == (5200, 4000)
    assert tracker.cold_written == 0  # every block fits the core's caches
    tracker = FakeTracker(mode, heap_threshold=1000)
    with mode, tracker:
        torch.empty(COLD_BYTES // 4)  # one block past them
        torch.empty(COLD_BYTES // 4 - 1)
    assert tracker.cold_written == COLD_BYTES
    assert trace.heap_point(2.0) == (4000, 400)   # 4800 > 0 + 2 x 800
    assert trace.heap_point(20.0) == (0, 800)     # 16000 > 4000 + 20 x 400


@pytest.mark.parametrize("backend", ["fake", "meta"])
def test_op_budget_stops_a_long_dry_run(graph, backend):
    model = build_model("res", graph.num_features, 8, 8, 3)
    with pytest.raises(UnsupportedOpError, match="more than 50 ops"):
        trace_step(model, graph, default_loss(graph), max_ops=50, backend=backend)


# (GSR's flat layout reads the copy's data pointers, 0 and harmless, as in
# the dry run, which filters the same warning)
@pytest.mark.filterwarnings("ignore:Accessing the data pointer")
@pytest.mark.parametrize("name,opts", [("res", dict(conv="sage")),
                                       ("gsr", dict(conv="gcn", num_groups=2))])
def test_fake_model_copies_onto_another_device(name, opts):
    # Module.to cannot move fake parameters (torch swaps them, and refuses a
    # tensor the fake mode holds a weak reference to): the dry run of a CPU
    # model for CUDA copies it onto the device instead. "meta" stands in for
    # CUDA on a machine without one; ties and GSR's flat views must survive.
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from leangnn.plan.fake import fake_model

    model = build_model(name, 8, 16, 3, 4, **opts)
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    with pytest.raises(RuntimeError, match="swap"):  # why the copy is needed
        with fm:
            fake_model(model, fm).to(torch.float64)
    fmodel = fake_model(model, fm, "meta")
    params = list(fmodel.parameters())
    assert len(params) == len(list(model.parameters()))
    assert all(isinstance(p, FakeTensor) and p.device.type == "meta"
               and isinstance(p, torch.nn.Parameter) for p in params)
    assert all(p.device.type == "cpu" for p in model.parameters())  # untouched
    if name == "gsr":
        stack = next(m for m in fmodel.modules() if hasattr(m, "flat_weight"))
        views = stack.flat.tensors(0)
        assert views and all(
            v.device.type == "meta" and v.untyped_storage()._cdata
            == stack.flat_weight.untyped_storage()._cdata for v in views)


def test_foreach_adam_step_runs_in_the_tracker():
    # CUDA's default Adam is the foreach one: it adds 1 to every step count
    # in place (a foreach op, no tensor output) and reads the counts back with
    # .item(). The counts are real (small, computed from real tensors) and must
    # change, else the read gives 0 and Adam divides by zero (the first GPU run
    # failed every CUDA dry run so). The reference: Adam's state after one real
    # step, and the live bytes of a real foreach step measured by LiveBytesMeter.
    from torch._subclasses.fake_tensor import FakeTensorMode

    from leangnn.plan.fake import FakeTracker, fake_model

    def step(model, fake=None):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        return opt

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 3))
    with LiveBytesMeter() as meter:
        real = step(copy.deepcopy(model))
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    fmodel = fake_model(model, fm)
    with fm, FakeTracker(fm, plain=False) as tracker:
        opt = step(fmodel)
    steps = [s["step"] for s in opt.state.values()]
    assert [float(s) for s in steps] == [float(s["step"]) for s in
                                         real.state.values()] == [1.0] * 4
    assert tracker.peak == meter.peak


def test_heap_edge_share_follows_the_graphs_density():
    # SAGE's [E, C] messages are most of a dense graph's heap high-water and
    # little of a sparse one's; a graph whose edge count is its node count
    # has no dimension to tell them apart by
    from leangnn.graphs.synthetic import contextual_sbm
    from leangnn.nn.models import build_model
    from leangnn.plan.dryrun import trace_step
    from leangnn.plan.estimate import default_loss

    def share(g):
        torch.manual_seed(0)
        model = build_model("sage", g.num_features, 16, int(g.y.max()) + 1, 2)
        return trace_step(model, g, default_loss(g), heap_threshold=32 << 20
                          ).heap_edge_share

    dense = contextual_sbm(3000, avg_degree=30.0, in_channels=8, seed=1)
    sparse = contextual_sbm(3000, avg_degree=1.5, in_channels=8, seed=1)
    assert share(dense) > 0.3 > share(sparse) >= 0.0
    ring = dense.clone()
    n = ring.num_nodes
    ring.edge_index = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    assert share(ring) == 0.0
