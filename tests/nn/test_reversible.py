"""GSRStack: gradients equal plain autograd, exact reconstruction, O(1) memory."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from leangnn.circuits import load_circuit
from leangnn.nn import GSRGNN, GSRStack
from leangnn.profile import SavedTensorsMeter

CONVS = {
    "sage": lambda i, o: SAGEConv(i, o),
    "gcn": lambda i, o: GCNConv(i, o),
    # attention dropout: a stochastic conv whose RNG must be replayed exactly
    "gat": lambda i, o: GATConv(i, o, heads=2, concat=False, dropout=0.2),
}


@pytest.fixture(scope="module")
def circuit():
    return load_circuit("iscas85/c880", task="arrival")


def grads_of(model, data, disable, seed=1):
    model.disable = disable
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    x = data.x.to(next(model.parameters()).dtype)
    out = model(x, data.edge_index)
    loss = (out.squeeze(-1) - data.y.to(out.dtype)).square().mean()
    loss.backward()
    return out.detach(), named_grads(model)


def named_grads(model) -> dict:
    """Every parameter's gradient by name; a flat stack's gradient is split
    back into its per-parameter pieces, so each one is compared on its own."""
    grads = {n: p.grad.clone() for n, p in model.named_parameters()
             if not n.endswith("flat_weight")}
    stack = getattr(model, "stack", model)
    if stack.flat is not None:
        prefix = "stack." if stack is not model else ""
        grads.update((prefix + n, g) for n, g in stack.named_block_tensors(
            stack.flat_weight.grad.clone()).items())
    return grads


def max_rel_err(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    errs = []
    for name in a:
        denom = b[name].norm().clamp_min(1e-30)
        errs.append(((a[name] - b[name]).norm() / denom).item())
    return max(errs)


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("conv", list(CONVS))
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_gradients_equal_plain_autograd_64_layers(circuit, conv, dtype, tol, flat):
    torch.manual_seed(0)
    model = GSRGNN(circuit.num_features, 32, 1, num_layers=64, num_groups=4,
                   conv=CONVS[conv], sparsity=5, dropout=0.1,
                   flat_parameters=flat).to(dtype).train()
    out_rev, g_rev = grads_of(model, circuit, disable=False)
    out_ref, g_ref = grads_of(model, circuit, disable=True)
    n_params = sum(1 for _ in model.parameters())
    assert len(g_rev) == (n_params - 1 + len(model.stack.flat.slots) if flat
                          else n_params)
    assert all(g.abs().sum() > 0 for g in g_ref.values())  # every grad is live
    torch.testing.assert_close(out_rev, out_ref, rtol=tol, atol=0)
    assert max_rel_err(g_rev, g_ref) <= tol


def test_narrow_stream_drifts_but_stays_close(circuit):
    """``exact_stream=False`` keeps the float32 stream: gradients drift by a few
    ulps per layer through reconstruction (still close); the default wide
    stream reconstructs exactly (bit-exact here), so its gradients match."""
    errs = {}
    for exact in (False, True):
        torch.manual_seed(0)
        model = GSRGNN(circuit.num_features, 32, 1, num_layers=64, num_groups=4,
                       conv="gcn", sparsity=5, dropout=0.1).train()
        model.stack.exact_stream = exact
        _, g_rev = grads_of(model, circuit, disable=False)
        _, g_ref = grads_of(model, circuit, disable=True)
        errs[exact] = max_rel_err(g_rev, g_ref)
    # how far float32 rounding drifts depends on the CPU's kernels: under
    # 1e-3 on the AMD EPYC reference box, 3.4e-3 on an Intel Xeon one
    assert 0 < errs[False] < 1e-2
    assert errs[True] <= 1e-6 and errs[True] < errs[False] / 10


def test_rng_replay_is_what_makes_stochastic_convs_exact(circuit):
    torch.manual_seed(0)
    model = GSRGNN(circuit.num_features, 16, 1, num_layers=4, num_groups=2,
                   conv=CONVS["gat"]).double().train()
    model.stack.preserve_rng_state = False
    _, g_rev = grads_of(model, circuit, disable=False)
    _, g_ref = grads_of(model, circuit, disable=True)
    assert max_rel_err(g_rev, g_ref) > 1e-3  # without replay the recompute differs
    model.stack.preserve_rng_state = True
    _, g_rev = grads_of(model, circuit, disable=False)
    _, g_ref = grads_of(model, circuit, disable=True)
    assert max_rel_err(g_rev, g_ref) < 1e-10


def test_training_does_not_disturb_global_rng(circuit):
    model = GSRGNN(circuit.num_features, 16, 1, num_layers=3, num_groups=2,
                   conv=CONVS["gat"], dropout=0.2).train()
    torch.manual_seed(5)
    model(circuit.x, circuit.edge_index).sum().backward()
    after = torch.rand(3)
    model.disable = True
    torch.manual_seed(5)
    model(circuit.x, circuit.edge_index).sum().backward()
    assert torch.equal(after, torch.rand(3))


@pytest.mark.parametrize("num_groups", [2, 3, 4])
def test_inverse_reconstructs_input(circuit, num_groups):
    torch.manual_seed(0)
    stack = GSRStack(24, 16, num_groups, conv="sage", sparsity=0.5).double().eval()
    x = torch.randn(circuit.num_nodes, 24, dtype=torch.float64)
    y = stack(x, circuit.edge_index)
    assert (y - x).abs().max() > 1e-2  # the stack is not the identity
    torch.testing.assert_close(stack.inverse(y, circuit.edge_index), x,
                               rtol=0, atol=1e-10)


def test_training_mode_reconstruction_replays_dropout_and_rng(circuit):
    from leangnn.nn.reversible import _invert

    torch.manual_seed(0)
    stack = GSRStack(16, 8, 2, conv=CONVS["gat"], dropout=0.3).double().train()
    x = torch.randn(circuit.num_nodes, 16, dtype=torch.float64)
    torch.manual_seed(7)
    with torch.no_grad():
        y = stack(x, circuit.edge_index)
    torch.manual_seed(7)
    run = stack._new_run(x)  # the same draws as that forward
    h = stack._to_groups(y)
    _invert(stack, h, circuit.edge_index, (), {}, run, x.dtype)
    torch.testing.assert_close(stack._from_groups(h, x.dtype), x, rtol=0, atol=1e-10)


def test_each_group_function_runs_once_forward_once_backward(circuit):
    torch.manual_seed(0)
    L, G = 6, 3
    stack = GSRStack(12, L, G, conv="sage").train()
    calls = []
    for idx, block in enumerate(stack.blocks):
        block.register_forward_hook(lambda m, a, o, idx=idx: calls.append(idx))
    x = torch.randn(circuit.num_nodes, 12, requires_grad=True)
    out = stack(x, circuit.edge_index)
    assert len(calls) == L * G  # forward: one evaluation per group function
    out.square().sum().backward()
    # backward: one more (fused inverse + recompute), in reverse order
    assert len(calls) == 2 * L * G
    assert calls[L * G:] == [layer * G + i for layer in reversed(range(L))
                             for i in reversed(range(G))]


def test_saved_memory_independent_of_depth(circuit):
    saved = {}
    for disable in (False, True):
        for layers in (4, 32):
            torch.manual_seed(0)
            model = GSRGNN(circuit.num_features, 32, 1, layers, num_groups=4,
                           sparsity=4, dropout=0.1, disable=disable).train()
            with SavedTensorsMeter() as meter:
                out = model(circuit.x, circuit.edge_index)
            out.sum().backward()
            saved[disable, layers] = meter.bytes
    # Reversible: exactly the same bytes at 4 and 32 layers.
    assert saved[False, 4] == saved[False, 32]
    # Plain autograd grows with depth; at 32 layers it keeps > 8x more.
    assert saved[True, 32] > 4 * saved[True, 4]
    assert saved[True, 32] > 8 * saved[False, 32]


def test_extra_positional_args_get_gradients(circuit):
    torch.manual_seed(0)
    stack = GSRStack(16, 6, 2, conv="gcn").double().train()
    x = torch.randn(circuit.num_nodes, 16, dtype=torch.float64)
    w = torch.rand(circuit.num_edges, dtype=torch.float64)
    grads = []
    for disable in (False, True):
        stack.disable = disable
        stack.zero_grad()
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        stack(xi, circuit.edge_index, wi).square().sum().backward()
        grads.append((xi.grad, wi.grad, [p.grad.clone() for p in stack.parameters()]))
    (xa, wa, pa), (xb, wb, pb) = grads
    torch.testing.assert_close(xa, xb, rtol=1e-10, atol=0)
    torch.testing.assert_close(wa, wb, rtol=1e-10, atol=0)
    for a, b in zip(pa, pb):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def test_no_grad_and_eval_paths_match(circuit):
    torch.manual_seed(0)
    model = GSRGNN(circuit.num_features, 16, 1, 5, num_groups=2, dropout=0.5).eval()
    with torch.no_grad():
        a = model(circuit.x, circuit.edge_index)
    b = model(circuit.x, circuit.edge_index).detach()
    model.disable = True
    c = model(circuit.x, circuit.edge_index).detach()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_second_backward_raises(circuit):
    stack = GSRStack(8, 2, 2)
    out = stack(torch.randn(circuit.num_nodes, 8, requires_grad=True),
                circuit.edge_index)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        out.sum().backward()


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_groups"):
        GSRStack(16, 4, num_groups=1)
    with pytest.raises(ValueError, match="divisible"):
        GSRStack(10, 4, num_groups=4)
    with pytest.raises(ValueError, match="num_layers"):
        GSRStack(16, 0)
    with pytest.raises(ValueError, match="dropout"):
        GSRStack(16, 2, dropout=1.0)
    with pytest.raises(ValueError, match="sparsity"):
        GSRStack(16, 2, num_groups=2, sparsity=9)
    with pytest.raises(ValueError, match=r"shape \[N, 16\]"):
        GSRStack(16, 2)(torch.randn(5, 8), torch.zeros(2, 0, dtype=torch.long))
    assert "num_groups=2" in repr(GSRStack(16, 2))


def test_flat_parameters_equal_per_module_parameters(circuit):
    """The flat layout is a storage change only: same init (same RNG draws),
    same outputs, same per-parameter gradients, same Adam trajectory."""
    models, grads = {}, {}
    for flat in (True, False):
        torch.manual_seed(0)
        models[flat] = GSRGNN(circuit.num_features, 16, 1, 6, num_groups=2,
                              conv="gcn", sparsity=4, dropout=0.2,
                              flat_parameters=flat).double().train()
        opt = torch.optim.Adam(models[flat].parameters(), lr=1e-2)
        for _ in range(3):
            _, grads[flat] = grads_of(models[flat], circuit, disable=False)
            opt.step()
    assert grads[True].keys() == grads[False].keys()
    for name in grads[False]:
        torch.testing.assert_close(grads[True][name], grads[False][name],
                                   rtol=1e-12, atol=1e-15)
    after = {f: dict(models[f].stack.named_block_tensors()) for f in (True, False)}
    for name, value in after[False].items():
        torch.testing.assert_close(after[True][name], value, rtol=1e-12, atol=1e-15)


def test_flat_parameters_save_optimizer_tensors_and_keep_module_api(circuit):
    """The saving: one gradient and one pair of Adam moments for the whole
    stack instead of one per small tensor (the bytes per value are the same;
    what disappears is the per-tensor overhead, measured in benchmarks/gsr.py).
    """
    counts = {}
    for flat in (True, False):
        torch.manual_seed(0)
        model = GSRGNN(circuit.num_features, 16, 1, 32, num_groups=4,
                       flat_parameters=flat).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(circuit.x, circuit.edge_index).sum().backward()
        opt.step()
        state = [t for s in opt.state.values() for t in s.values()
                 if torch.is_tensor(t) and t.dim() > 0]
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        counts[flat] = (len(state) + len(grads),
                        sum(t.numel() for t in state + grads))
    assert counts[True][1] == counts[False][1]  # the same values
    assert counts[False][0] > 30 * counts[True][0]  # in far fewer tensors
    # modules keep their attribute names, as views of the flat tensor
    torch.manual_seed(0)
    model = GSRGNN(circuit.num_features, 16, 1, 4, num_groups=2).double()
    w = model.stack.block(1, 0).conv.lin_l.weight
    assert w.dtype == torch.float64 and w.data_ptr() >= \
        model.stack.flat_weight.data_ptr()
    state = model.state_dict()
    assert "stack.flat_weight" in state
    torch.manual_seed(1)
    other = GSRGNN(circuit.num_features, 16, 1, 4, num_groups=2).double()
    other.load_state_dict(state)
    x = circuit.x.double()
    torch.testing.assert_close(other(x, circuit.edge_index),
                               model(x, circuit.edge_index), rtol=0, atol=0)
    # a deep copy's views follow the copy's own flat tensor
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.stack.flat_weight.zero_()
    assert clone.stack.block(1, 0).conv.lin_l.weight.abs().sum() == 0
    assert model.stack.block(1, 0).conv.lin_l.weight.abs().sum() > 0
    # a per-module checkpoint loads into a flat stack
    torch.manual_seed(0)
    plain = GSRGNN(circuit.num_features, 16, 1, 4, num_groups=2,
                   flat_parameters=False).double()
    other.load_state_dict(plain.state_dict())
    torch.testing.assert_close(other(x, circuit.edge_index),
                               plain(x, circuit.edge_index), rtol=0, atol=0)


def test_a_flat_stacks_state_dict_does_not_walk_its_blocks(circuit, monkeypatch):
    """Its blocks hold no state of their own: walked, PyG's ``Linear`` wrote
    one entry per view for the stack's hook to delete (0.25 s and +18 MiB
    per call at 128 layers x 64 groups, at every checkpoint of a run). The
    entries are the same; a stack with per-module parameters still writes
    its blocks'."""
    from torch_geometric.nn.dense.linear import Linear

    written = []
    save = Linear._save_to_state_dict

    def counted(self, *a, **k):
        written.append(self)
        return save(self, *a, **k)

    monkeypatch.setattr(Linear, "_save_to_state_dict", counted)
    torch.manual_seed(0)
    model = GSRGNN(circuit.num_features, 16, 1, 8, num_groups=4)
    state = model.state_dict()
    assert not written
    assert list(state) == ["encoder.weight", "encoder.bias", "stack.flat_weight",
                           "out_norm.weight", "out_norm.bias", "head.weight",
                           "head.bias"]
    # the blocks alone, asked directly, still answer as any ModuleList
    assert model.stack.blocks.state_dict() and written
    written.clear()
    torch.manual_seed(0)
    plain = GSRGNN(circuit.num_features, 16, 1, 8, num_groups=4,
                   flat_parameters=False)
    keys = list(plain.state_dict())
    assert written and any(".blocks." in k for k in keys)
    other = GSRGNN(circuit.num_features, 16, 1, 8, num_groups=4)
    other.load_state_dict(state)
    assert torch.equal(other.stack.flat_weight, model.stack.flat_weight)


def test_flat_backward_holds_one_blocks_gradient_views_at_a_time(circuit,
                                                                 monkeypatch):
    """The backward writes each block's gradient through views of the flat
    gradient made as it reaches the block: views of every block at once were
    L x G x params tensor objects alive through the backward (heap no dry run
    sees: 4.5 MiB of a 256-layer, 4-group step on ``epfl/sin``)."""
    import weakref

    from leangnn.nn.flat import FlatParameters

    alive, most = weakref.WeakSet(), [0]
    view = FlatParameters._view

    def counted(flat, slot):
        v = view(flat, slot)
        # (not the parameters' own views: the model's, alive throughout)
        if flat.data_ptr() != model.stack.flat_weight.data_ptr():
            alive.add(v)
            most[0] = max(most[0], len(alive))
        return v

    torch.manual_seed(0)
    model = GSRGNN(circuit.num_features, 8, 1, 16, num_groups=4).train()
    per_block = len(model.stack.flat.slots) // (16 * 4)
    monkeypatch.setattr(FlatParameters, "_view", staticmethod(counted))
    model(circuit.x, circuit.edge_index).sum().backward()
    assert 0 < most[0] <= 2 * per_block, (most[0], per_block)
    # the gradients themselves: test_gradients_equal_plain_autograd_64_layers


def test_flat_backward_leaves_no_autograd_state_on_the_parameter_views(circuit,
                                                                       mallinfo2):
    """A leaf tensor ``torch.autograd.grad`` has differentiated keeps its
    accumulator's memory (~0.5 KiB) while it lives; the model's parameter views lived as
    long as the model, so its first backward left every group function that
    much more heap (19 MiB at 128 layers, 64 groups; the planner's dry run
    sees tensors only and read 4.6x under). The backward now differentiates
    each block through stand-ins of its views that die with the block. (Its
    gradients are plain autograd's: test_gradients_equal_plain_autograd_64_layers.)"""
    import gc

    if mallinfo2 is None:
        pytest.skip("needs glibc's mallinfo2")

    def in_use():
        gc.collect()
        m = mallinfo2()
        return m.uordblks + m.hblkhd

    def model():
        torch.manual_seed(0)
        return GSRGNN(circuit.num_features, 64, 1, 16, num_groups=32,
                      dropout=0.0).train()

    def first_step(m):
        m(circuit.x, circuit.edge_index).sum().backward()
        m.zero_grad(set_to_none=True)

    first_step(model())  # the process's one-time allocations (kernels, caches)
    m = model()
    views = [t for b in range(len(m.stack.blocks)) for t in m.stack.flat.tensors(b)]
    before = in_use()
    first_step(m)
    grown = in_use() - before
    # differentiated, the views held ~0.5 KiB each after the step (1.2 MiB
    # here); the block runs on stand-ins that die with it
    assert grown < 256 << 10, grown
    now = [t for b in range(len(m.stack.blocks)) for t in m.stack.flat.tensors(b)]
    assert len(now) == len(views) >= 5 * 512
    assert all(a is b for a, b in zip(views, now))  # the model's own, back


@pytest.mark.parametrize("conv", ["sage", "gcn", "gat"])
def test_kept_graph_layout_builds_once_per_step_same_gradients(circuit, conv,
                                                                monkeypatch):
    """keep_graph: the backward reuses the forward's CSR layout (one sort of
    the graph per step instead of two) and frees it; off: rebuilt per pass.
    Outputs and gradients are the same bits either way."""
    import weakref

    from leangnn.nn import csr

    builds, alive = [], []
    init = csr.CSRGraph.__init__

    def counting(self, *a, **k):
        init(self, *a, **k)
        builds.append(1)
        alive.append(weakref.ref(self))

    monkeypatch.setattr(csr.CSRGraph, "__init__", counting)
    res = {}
    for keep in (True, False):
        torch.manual_seed(0)
        model = GSRGNN(circuit.num_features, 16, 1, 4, num_groups=2, conv=conv,
                       dropout=0.1, keep_graph=keep).double().train()
        builds.clear()
        res[keep] = grads_of(model, circuit, disable=False)
        res[keep, "builds"] = len(builds)
    # GCN sorts its normalised graph too: one layout per pass either way
    assert res[True, "builds"] * 2 == res[False, "builds"] > 0
    assert torch.equal(res[True][0], res[False][0])
    for name, g in res[False][1].items():
        assert torch.equal(res[True][1][name], g), name
    import gc

    gc.collect()
    assert all(r() is None for r in alive)  # nothing kept after the step
