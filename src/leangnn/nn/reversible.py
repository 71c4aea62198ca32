"""GSRStack: grouped reversible GNN blocks run by one fused autograd function.

The stack of GSR-GNN (Luo et al., DAC 2026) built on the grouped additive
coupling of RevGNN (Li et al., "Training Graph Neural Networks with 1000
Layers", ICML 2021). Channels are split into ``G`` groups; layer ``l`` maps
``x = (x_0, ..., x_{G-1})`` to ``y`` by

.. math::
    u_0 = \\sum_{j \\ge 1} x_j, \\quad y_0 = x_0 + f_{l,0}(u_0), \\quad
    y_i = x_i + f_{l,i}(y_{i-1}) \\;(i \\ge 1),

with each group function ``f`` a :class:`GSRBlock` (norm -> group-sparse
activation -> shared dropout -> PyG conv). The whole stack is one
:class:`torch.autograd.Function`: the forward runs under ``no_grad`` in place
on one ``[G, N, C/G]`` buffer and keeps only the output; the backward walks
the layers in reverse and *fuses inversion with recomputation*: each group
function is evaluated once with grad enabled, and its output both
reconstructs the group's input (``x_i = y_i - f(.)``) and is backpropagated.
A layer thus costs one forward in the forward pass and one forward plus one
backward in the backward pass, where PyG's ``GroupAddRev`` evaluates every
group function three times (forward, inverse, recompute).

By default the residual stream (the buffer) is carried in float64 while every
group function computes in the input dtype, so the reconstruction is exact
and the gradients equal plain autograd's (``exact_stream``); dropout masks are
shared across layers and every group function runs on its own seeded RNG
stream, so stochastic layers replay exactly too. Per-graph preprocessing of
the convs (GCN's normalisation, GAT's self-loops) is done once per pass for
all group functions (:mod:`leangnn.nn.shared_graph`), and GCN, GAT and SAGE
group functions aggregate by CSR sparse-dense products on an adjacency laid
out once per pass (:mod:`leangnn.nn.csr`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, GraphConv, SAGEConv

from leangnn.nn.csr import csr_kernels
from leangnn.nn.flat import FlatParameters
from leangnn.nn.group_sparse import GroupSparseAct, resolve_k, unpacked_masks
from leangnn.nn.shared_graph import shared_graph

__all__ = ["CONVS", "build_conv", "GSRBlock", "GSRStack"]

CONVS = ("gcn", "sage", "gat", "graph")

#: a conv name from :data:`CONVS` or ``factory(in_channels, out_channels)``
ConvSpec = str | Callable[[int, int], torch.nn.Module]


def build_conv(conv: ConvSpec, in_channels: int, out_channels: int, heads: int = 1,
               **kwargs) -> torch.nn.Module:
    """A PyG conv by name (``gcn``, ``sage``, ``gat``, ``graph``) or factory.

    GAT uses ``heads`` heads whose outputs are averaged (``concat=False``) so
    the width stays ``out_channels``.
    """
    if callable(conv):
        return conv(in_channels, out_channels)
    if conv == "gcn":
        return GCNConv(in_channels, out_channels, **kwargs)
    if conv == "sage":
        return SAGEConv(in_channels, out_channels, **kwargs)
    if conv == "gat":
        return GATConv(in_channels, out_channels, heads=heads, concat=False, **kwargs)
    if conv == "graph":
        return GraphConv(in_channels, out_channels, **kwargs)
    raise ValueError(f"unknown conv {conv!r}; expected one of {CONVS} or a callable")


class GSRBlock(torch.nn.Module):
    r"""Pre-activation GNN block: LayerNorm -> GroupSparseAct -> dropout -> conv.

    The group function of GSR-GNN (Luo et al., DAC 2026) and the residual
    branch of the res+ blocks of DeepGCN (Li et al., 2020). Dropout is applied
    through a boolean ``keep`` mask fused into the activation, so a caller can
    share one mask across layers (as reversible stacks must).

    Args:
        channels (int): input and output width.
        conv (str or callable, optional): see :func:`build_conv`.
            (default: ``"sage"``)
        k (int, optional): winners per activation group; ``None`` is ReLU.
            (default: ``None``)
        group_size (int, optional): activation group size; ``None`` is
            ``channels``. (default: ``None``)
        compact (bool, optional): see :class:`GroupSparseAct`. (default: ``True``)
        **conv_kwargs: passed to the conv.

    Shapes:
        **input:** ``x [N, channels]``, ``edge_index [2, E]``,
        ``keep [N, channels]`` bool (optional)
        **output:** ``[N, channels]``
    """

    def __init__(self, channels: int, conv: ConvSpec = "sage", k: int | None = None,
                 group_size: int | None = None, compact: bool = True, **conv_kwargs):
        super().__init__()
        self.norm = torch.nn.LayerNorm(channels)
        self.act = GroupSparseAct(k, group_size or channels, compact)
        self.conv = build_conv(conv, channels, channels, **conv_kwargs)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        self.conv.reset_parameters()

    def forward(self, x: Tensor, edge_index, *args, keep: Tensor | None = None,
                scale: float = 1.0, kernel: Callable[[Tensor], Tensor] | None = None,
                **kwargs) -> Tensor:
        h = self.act(self.norm(x), keep, scale)
        if kernel is not None:  # computes self.conv(h, edge_index), see nn.csr
            return kernel(h)
        return self.conv(h, edge_index, *args, **kwargs)


class _Blocks(torch.nn.ModuleList):
    """A stack's group functions. With flat parameters and no buffers they
    hold no state of their own (their tensors are views of ``flat_weight``),
    so the stack's ``state_dict`` skips them (:attr:`stateless`). Walked,
    PyG's ``Linear`` wrote its views anyway, one entry per view, which the
    stack's hook then deleted: 0.25 s and +18 MiB resident for the 7 entries
    of a 128-layer, 64-group model, at every checkpoint and best-model copy
    of a run (the largest part of its measured peak)."""

    stateless = False

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        if self.stateless and destination is not None:
            return destination  # (called by the stack's own state_dict)
        return super().state_dict(*args, destination=destination, prefix=prefix,
                                  keep_vars=keep_vars)


@dataclass
class _Run:
    """Stochastic state of one forward call, replayed exactly in backward."""

    keep: Tensor | None = None  # shared dropout keep-mask [G, N, C/G]
    scale: float = 1.0
    seed: int | None = None  # base seed of the per-block RNG streams


class GSRStack(torch.nn.Module):
    r"""``L`` grouped reversible GNN layers run by one fused autograd function.

    From GSR-GNN (Luo et al., DAC 2026), on the grouped additive coupling of
    RevGNN (Li et al., ICML 2021); see the module docstring for the coupling
    and the fused backward. Activation memory is independent of ``L``: the
    forward keeps one ``[N, C]`` buffer, the backward two plus one group
    function's graph.

    Stochasticity is replayed exactly: dropout uses one keep-mask shared by all
    layers (drawn once per forward), and every group function runs on its own
    RNG stream seeded from a per-forward base seed, so stochastic convs (e.g.
    GAT attention dropout) recompute identically.

    Args:
        hidden_channels (int): width ``C`` (divisible by ``num_groups``).
        num_layers (int): number of reversible layers ``L``.
        num_groups (int, optional): groups ``G >= 2``. (default: ``2``)
        conv (str or callable, optional): see :func:`build_conv`; any PyG conv
            called as ``conv(x, edge_index, *args, **kwargs)``.
            (default: ``"sage"``)
        sparsity (int or float, optional): winners per group of ``C / G``
            channels (int) or kept fraction (float); ``None`` is ReLU.
            (default: ``None``)
        dropout (float, optional): shared dropout probability. (default: ``0.0``)
        disable (bool, optional): run the same parameters under plain autograd
            (no memory saving; the reference). (default: ``False``)
        preserve_rng_state (bool, optional): give every group function its own
            seeded RNG stream in training, so stochastic convs replay exactly.
            (default: ``True``)
        exact_stream (bool, optional): carry the residual stream (the
            ``[G, N, C/G]`` buffer of the coupling) in a wider dtype
            (float64 for float32/float64, float32 for half types) while every
            group function still computes in the input dtype. Sums of narrow
            values are then (almost always) exact in the wide type, so the
            backward's reconstruction is bit-exact instead of drifting by a
            few ulps per layer; costs one wide ``[N, C]`` buffer. ``False``
            keeps the stream in the input dtype. (default: ``True``)
        flat_parameters (bool, optional): keep all group functions'
            parameters in one flat :obj:`flat_weight` (see
            :class:`~leangnn.nn.flat.FlatParameters`): one gradient and one
            set of optimizer moments instead of thousands of small ones, so
            the memory of a deep stack stays flat with depth. The modules
            keep their attribute names (as views). ``False`` keeps ordinary
            per-module parameters. (default: ``True``)
        share_graph (bool, optional): preprocess the graph once per pass for
            all group functions instead of once per call (GCN's
            normalisation, GAT's self-loops; see
            :mod:`leangnn.nn.shared_graph`); the same values, computed
            ``2 L G`` times fewer. ``False`` lets every conv do its own
            (and turns ``kernels`` off). (default: ``True``)
        kernels (bool, optional): run GCN, GAT (one projection) and SAGE
            (mean) group functions through the CSR kernels of
            :mod:`leangnn.nn.csr` (sparse-dense products on an adjacency laid
            out once per pass) instead of PyG's per-edge gathers and
            scatters; equal to PyG's convs to rounding. Both the reversible
            and the plain-autograd (``disable``) path use them, so those two
            stay exactly comparable; ``False`` runs PyG's convs (needs
            ``share_graph``). (default: ``True``)
        keep_graph (bool, optional): the backward reuses the CSR layout its
            forward built (``kernels``), kept from one pass to the next,
            instead of sorting the graph again: one build per step, not two
            (1.2x on csbm:100000 GSR-4 epochs). ``False`` rebuilds it, and
            frees it between the passes. (default: ``True``)
        **conv_kwargs: passed to every conv.

    Shapes:
        **input:** ``x [N, C]``, ``edge_index [2, E]``; extra ``*args`` and
        ``**kwargs`` go unchanged to every conv
        **output:** ``[N, C]``
    """

    def __init__(self, hidden_channels: int, num_layers: int, num_groups: int = 2,
                 conv: ConvSpec = "sage", sparsity: int | float | None = None,
                 dropout: float = 0.0, disable: bool = False,
                 preserve_rng_state: bool = True, exact_stream: bool = True,
                 flat_parameters: bool = True, share_graph: bool = True,
                 kernels: bool = True, keep_graph: bool = True, **conv_kwargs):
        super().__init__()
        if not isinstance(num_groups, int) or num_groups < 2:
            raise ValueError(f"num_groups must be an int >= 2, got {num_groups!r}")
        if hidden_channels % num_groups:
            raise ValueError(f"hidden_channels={hidden_channels} must be divisible "
                             f"by num_groups={num_groups}")
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an int >= 1, got {num_layers!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.hidden_channels, self.num_layers = hidden_channels, num_layers
        self.num_groups, self.dropout = num_groups, dropout
        self.disable, self.preserve_rng_state = disable, preserve_rng_state
        self.exact_stream, self.share_graph = exact_stream, share_graph
        self.kernels, self.keep_graph = kernels, keep_graph
        self._kernels: list | None = None  # per block, set inside _graph()
        self.conv_name = conv if isinstance(conv, str) else getattr(
            conv, "__name__", type(conv).__name__)
        c = hidden_channels // num_groups
        self.k = resolve_k(sparsity, c)
        self.blocks = _Blocks(
            GSRBlock(c, conv, self.k, c, **conv_kwargs)
            for _ in range(num_layers * num_groups))
        self.flat: FlatParameters | None = None
        if flat_parameters:
            self.flat = FlatParameters(self.blocks)
            self.blocks.stateless = next(self.blocks.buffers(), None) is None
            self.flat_weight = torch.nn.Parameter(self.flat.gather())
            self.flat.bind(self.flat_weight)
            self._register_state_dict_hook(_drop_block_entries)
            self._register_load_state_dict_pre_hook(_flatten_block_entries,
                                                     with_module=True)

    def reset_parameters(self) -> None:
        self._bind(autograd=False)
        with torch.no_grad():
            for block in self.blocks:
                block.reset_parameters()

    def _bind(self, autograd: bool) -> None:
        if self.flat is not None:
            self.flat.bind(self.flat_weight, autograd)

    def __setstate__(self, state):
        # copy.deepcopy and pickle copy flat_weight and the views apart:
        # re-attach the views to this copy's flat tensor
        super().__setstate__(state)
        if self.flat is not None:
            self.flat._key = None
            self._bind(autograd=False)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._bind(autograd=False)  # views of the converted flat tensor
        return out

    def _block_params(self) -> tuple[list[list[Tensor]], list[Tensor]]:
        """Per block, the tensors its backward differentiates; and the
        autograd inputs that stand for them (the flat tensor when flat)."""
        if self.flat is not None:
            per_block = [self.flat.tensors(i) for i in range(len(self.blocks))]
            flat = [self.flat_weight] if self.flat_weight.requires_grad else []
            return (per_block if flat else [[] for _ in per_block]), flat
        per_block = [[p for p in b.parameters() if p.requires_grad]
                     for b in self.blocks]
        return per_block, [p for bp in per_block for p in bp]

    def named_block_tensors(self, flat: Tensor | None = None) -> dict[str, Tensor]:
        """``{"blocks.<i>.<path>": tensor}`` of every group function parameter;
        with flat parameters, views of ``flat`` (default :obj:`flat_weight`;
        pass ``flat_weight.grad`` for per-parameter gradients)."""
        if self.flat is None:
            return {f"blocks.{n}": p for n, p in self.blocks.named_parameters()}
        flat = self.flat_weight if flat is None else flat
        return {f"blocks.{n}": v for n, v in self.flat.named(flat).items()}

    def block(self, layer: int, group: int) -> GSRBlock:
        """The group function ``f_{layer, group}``."""
        return self.blocks[layer * self.num_groups + group]

    # -- layout and stochastic state ------------------------------------------
    def _stream_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if not self.exact_stream:
            return dtype
        return torch.float32 if dtype in (torch.float16, torch.bfloat16) \
            else torch.float64

    def _to_groups(self, x: Tensor, widen: bool = True) -> Tensor:
        n, g = x.size(0), self.num_groups
        # Transpose in the input dtype, then widen: a strided copy that also
        # converts dtypes takes a ~7x slower path on CPU (measured).
        h = x.reshape(n, g, -1).transpose(0, 1).clone(
            memory_format=torch.contiguous_format)
        return h.to(self._stream_dtype(x.dtype)) if widen else h

    @staticmethod
    def _from_groups(h: Tensor, dtype: torch.dtype) -> Tensor:
        return h.to(dtype).transpose(0, 1).reshape(h.size(1), -1)

    def _new_run(self, x: Tensor) -> _Run:
        run = _Run()
        if not self.training:
            return run
        if self.dropout > 0:
            shape = (self.num_groups, x.size(0), x.size(1) // self.num_groups)
            run.keep = torch.empty(shape, dtype=torch.bool, device=x.device)
            run.keep.bernoulli_(1.0 - self.dropout)
            run.scale = 1.0 / (1.0 - self.dropout)
        if self.preserve_rng_state:
            run.seed = int(torch.randint(0, 2**62, (), device="cpu"))
        return run

    @contextlib.contextmanager
    def _graph(self, edge_index, num_nodes: int, dtype: torch.dtype, args, kwargs,
               share: bool = True, layout: dict | None = None):
        """Context in which every group function reuses one preprocessing of
        the graph (see :mod:`leangnn.nn.shared_graph`) and, with ``kernels``,
        runs its conv through a CSR kernel (:mod:`leangnn.nn.csr`); yields the
        ``edge_index`` to pass. ``layout``: the CSR kernels' store, shared by
        a step's forward and backward (``keep_graph``)."""
        plain = getattr(self, "share_graph", True) and not args and not kwargs
        convs = [b.conv for b in self.blocks]
        with shared_graph(convs, edge_index, num_nodes, dtype,
                          plain=plain and share) as graph:
            if not (share and plain and getattr(self, "kernels", True)):
                yield graph
                return
            with csr_kernels(convs, graph, num_nodes, dtype,
                             looped=graph is not edge_index, cache=layout) as kernels:
                old, self._kernels = self._kernels, kernels
                try:
                    yield graph
                finally:
                    self._kernels = old

    def _rng(self, run: _Run, layer: int, group: int, device: torch.device):
        if run.seed is None:
            return contextlib.nullcontext()
        return _seeded(run.seed + layer * self.num_groups + group, device)

    def _call(self, run: _Run, layer: int, group: int, u: Tensor, edge_index,
              args, kwargs, dtype: torch.dtype) -> Tensor:
        u = u.to(dtype)  # the group function computes in the input dtype
        keep = None if run.keep is None else run.keep[group]
        kernels = getattr(self, "_kernels", None)  # absent in old pickles
        kernel = None if kernels is None else kernels[layer * self.num_groups + group]
        with self._rng(run, layer, group, u.device):
            return self.block(layer, group)(u, edge_index, *args, keep=keep,
                                            scale=run.scale, kernel=kernel,
                                            **kwargs)

    # -- the three execution paths --------------------------------------------
    def _forward_inplace(self, h: Tensor, edge_index, args, kwargs, run: _Run,
                         dtype: torch.dtype) -> None:
        """Overwrite ``h [G, N, C/G]`` with the stack's output (no autograd)."""
        u0 = torch.empty_like(h[0])
        for layer in range(self.num_layers):
            _sum_rest(h, u0)
            u = u0
            for i in range(self.num_groups):
                h[i].add_(_wide(self._call(run, layer, i, u, edge_index, args,
                                           kwargs, dtype), h))
                u = h[i]

    def _forward_autograd(self, x: Tensor, edge_index, args, kwargs,
                          run: _Run) -> Tensor:
        xs = list(self._to_groups(x).unbind(0))
        for layer in range(self.num_layers):
            u = xs[1]
            for j in range(2, self.num_groups):
                u = u + xs[j]
            for i in range(self.num_groups):
                xs[i] = xs[i] + self._call(run, layer, i, u, edge_index, args, kwargs,
                                           x.dtype)
                u = xs[i]
        return self._from_groups(torch.stack(xs, 0), x.dtype)

    def forward(self, x: Tensor, edge_index, *args, **kwargs) -> Tensor:
        if x.dim() != 2 or x.size(1) != self.hidden_channels:
            raise ValueError(f"x must have shape [N, {self.hidden_channels}], got "
                             f"{tuple(x.shape)}")
        run = self._new_run(x)
        if self.disable:
            self._bind(autograd=True)
            # The reference runs the same group functions as the reversible
            # path: with kernels on, the same CSR kernels (their preprocessing
            # shared, as theirs); off, PyG's convs preprocessing per call.
            with self._graph(edge_index, x.size(0), x.dtype, args, kwargs,
                             share=getattr(self, "kernels", True)) as graph:
                return self._forward_autograd(x, graph, args, kwargs, run)
        self._bind(autograd=False)
        block_params, params = self._block_params()
        tensors = [x, *(a for a in args if isinstance(a, Tensor))]
        if not torch.is_grad_enabled() or not (
                params or any(t.requires_grad for t in tensors)):
            with torch.no_grad(), self._graph(edge_index, x.size(0), x.dtype, args,
                                              kwargs) as graph:
                h = self._to_groups(x)
                self._forward_inplace(h, graph, args, kwargs, run, x.dtype)
                return self._from_groups(h, x.dtype)
        for key, v in kwargs.items():
            if isinstance(v, Tensor) and v.requires_grad:
                raise ValueError(f"keyword argument {key!r} requires grad; pass it "
                                 "positionally to get its gradient")
        return _GSRFunction.apply(self, (run, kwargs, block_params), len(args), x,
                                  edge_index, *args, *params)

    @torch.no_grad()
    def inverse(self, y: Tensor, edge_index, *args, **kwargs) -> Tensor:
        """Reconstruct the input from the output (deterministic, no dropout)."""
        self._bind(autograd=False)
        h = self._to_groups(y)
        _invert(self, h, edge_index, args, kwargs, _Run(), y.dtype)
        return self._from_groups(h, y.dtype)

    def __repr__(self) -> str:
        k = "relu" if self.k is None else self.k
        return (f"{self.__class__.__name__}({self.hidden_channels}, "
                f"num_layers={self.num_layers}, num_groups={self.num_groups}, "
                f"conv={self.conv_name}, k={k}, disable={self.disable}, "
                f"flat={self.flat is not None})")


def _drop_block_entries(stack, state_dict, prefix, *args):
    # Some modules (PyG's Linear) save their weights whether registered or
    # not; in a flat stack those are views of flat_weight, saved once there.
    for key in [k for k in state_dict if k.startswith(prefix + "blocks.")]:
        del state_dict[key]


def _flatten_block_entries(stack, state_dict, prefix, *args):
    # A checkpoint of a per-module stack loads into a flat one (and the
    # block entries some modules write anyway are dropped).
    names = [prefix + "blocks." + slot[3] for slot in stack.flat.slots]
    if prefix + "flat_weight" not in state_dict and all(n in state_dict
                                                        for n in names):
        state_dict[prefix + "flat_weight"] = torch.cat(
            [state_dict[n].reshape(-1) for n in names])
    _drop_block_entries(stack, state_dict, prefix)


def _sum_rest(h: Tensor, out: Tensor) -> Tensor:
    """``out = h[1] + ... + h[G-1]`` by pairwise adds, in the same order as the
    autograd path (a reduction over dim 0 is ~5x slower on CPU, measured)."""
    if h.size(0) == 2:
        return out.copy_(h[1])
    torch.add(h[1], h[2], out=out)
    for j in range(3, h.size(0)):
        out.add_(h[j])
    return out


def _wide(out: Tensor, h: Tensor) -> Tensor:
    """``out`` in the stream's dtype. Same values as letting ``h.add_(out)``
    promote, but an in-place op on mixed dtypes takes TensorIterator's
    casting loop, ~2x slower on CPU than a conversion then a same-dtype op
    (measured)."""
    return out.to(h.dtype)


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device):
    """Run on a private RNG stream ``seed``; the caller's stream is untouched."""
    cuda = device.type == "cuda"
    index = device.index if device.index is not None else (
        torch.cuda.current_device() if cuda else None)
    with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda"):
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


@torch.no_grad()
def _invert(stack: GSRStack, h: Tensor, edge_index, args, kwargs, run: _Run,
            dtype: torch.dtype) -> None:
    """In-place inverse of :meth:`GSRStack._forward_inplace` (in the same
    graph context: the same shared preprocessing and kernels)."""
    with stack._graph(edge_index, h.size(1), dtype, args, kwargs) as graph:
        _invert_layers(stack, h, graph, args, kwargs, run, dtype)


def _invert_layers(stack: GSRStack, h: Tensor, edge_index, args, kwargs, run: _Run,
                   dtype: torch.dtype) -> None:
    u0 = torch.empty_like(h[0])
    for layer in reversed(range(stack.num_layers)):
        for i in range(stack.num_groups - 1, 0, -1):
            h[i].sub_(_wide(stack._call(run, layer, i, h[i - 1], edge_index, args,
                                        kwargs, dtype), h))
        _sum_rest(h, u0)
        h[0].sub_(_wide(stack._call(run, layer, 0, u0, edge_index, args, kwargs,
                                    dtype), h))


class _GSRFunction(torch.autograd.Function):
    """The whole stack as one autograd node (see the module docstring)."""

    @staticmethod
    def forward(ctx, stack, state, num_args, x, edge_index, *rest):
        run, kwargs, ctx.block_params = state
        args = rest[:num_args]  # the parameters follow; autograd needs them as inputs
        ctx.num_params = len(rest) - num_args
        h = stack._to_groups(x)
        # the CSR layout the forward builds, for the backward (keep_graph)
        ctx.layout = {} if getattr(stack, "keep_graph", True) else None
        with stack._graph(edge_index, x.size(0), x.dtype, args, kwargs,
                          layout=ctx.layout) as graph:
            stack._forward_inplace(h, graph, args, kwargs, run, x.dtype)
        ctx.stack, ctx.run, ctx.kwargs, ctx.num_args = stack, run, kwargs, num_args
        ctx.dtype = x.dtype
        # Non-tensor extras (e.g. a SparseTensor adjacency) ride on ctx.
        extras = (edge_index, *args)
        ctx.is_tensor = [isinstance(a, Tensor) for a in extras]
        ctx.objects = [None if t else a for a, t in zip(extras, ctx.is_tensor)]
        ctx.save_for_backward(
            h, run.keep, *(a if t else None for a, t in zip(extras, ctx.is_tensor)))
        ctx.done = False
        return stack._from_groups(h, x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.done:
            raise RuntimeError("GSRStack: backward through the same forward twice "
                               "is not supported (its buffers are reused in place)")
        ctx.done = True
        stack, kwargs = ctx.stack, ctx.kwargs
        h, _keep, *saved = ctx.saved_tensors
        extras = [s if t else o for s, t, o in zip(saved, ctx.is_tensor, ctx.objects)]
        edge_index, args = extras[0], list(extras[1:])
        arg_req = [i for i, a in enumerate(args)
                   if isinstance(a, Tensor) and ctx.needs_input_grad[5 + i]]
        for i in arg_req:
            args[i] = args[i].detach().requires_grad_()
        arg_grads: list[Tensor | None] = [None] * len(args)

        # Parameter gradients live until the optimizer step. Allocating them all
        # up front keeps these small long-lived tensors from landing in the
        # holes freed by each block's temporaries; interleaved, they fragment
        # the CPU heap so that its RSS grows with depth (measured: +27 MiB per
        # layer on epfl/multiplier with glibc malloc).
        if stack.flat is not None and ctx.num_params and ctx.needs_input_grad[-1]:
            # Written slice by slice; zeros where a parameter got no gradient.
            flat_grad = torch.zeros_like(stack.flat_weight)
            # each block's views of it are made as the walk reaches the block:
            # all of them at once were L x G x params tensor objects alive
            # through the backward (5,120 at 256 layers and 4 groups, ~4 MiB
            # of heap no dry run sees)
            block_grads = None
        else:
            flat_grad = None
            block_grads = [[torch.empty_like(p) for p in bp]
                           for bp in ctx.block_params]
        dtype = ctx.dtype
        # Gradients flow in the compute dtype, as under plain autograd; only
        # the activations need the wide stream (for exact reconstruction).
        g = stack._to_groups(grad_out.to(dtype), widen=False)
        # each recomputed graph is differentiated at once: no bit-packed masks
        layout, ctx.layout = ctx.layout, None  # freed with the backward
        with stack._graph(edge_index, h.size(1), dtype, args, kwargs,
                          layout=layout) as graph, unpacked_masks():
            _fused_backward(ctx, stack, h, g, graph, args, arg_req, arg_grads,
                            block_grads, flat_grad)
        del layout
        if stack.flat is not None:
            pgrads = [flat_grad] * ctx.num_params
        else:
            pgrads = [gr for grads in block_grads for gr in grads]
        gx = stack._from_groups(g, dtype) if ctx.needs_input_grad[3] else None
        return (None, None, None, gx, None, *arg_grads, *pgrads)


def _fused_backward(ctx, stack: GSRStack, h: Tensor, g: Tensor, edge_index,
                    args: list, arg_req: list[int], arg_grads: list,
                    block_grads: list, flat_grad: Tensor | None) -> None:
    """The backward's walk over the layers in reverse: per group function,
    one forward with grad enabled that both reconstructs the input in
    ``h`` and backpropagates ``g`` (both updated in place)."""
    run, kwargs, dtype, G = ctx.run, ctx.kwargs, ctx.dtype, stack.num_groups
    u0 = torch.empty_like(h[0])
    for layer in reversed(range(stack.num_layers)):
        for i in range(G - 1, -1, -1):
            if i > 0:
                src = h[i - 1]  # y_{i-1}: still the layer's output
            else:
                _sum_rest(h, u0)  # sum of reconstructed x_1..x_{G-1}
                src = u0
            # A fresh leaf in the compute dtype (a copy when the stream is
            # wider, else a detached view of the buffer).
            u = src.detach().to(dtype).requires_grad_()
            bparams = ctx.block_params[layer * G + i]
            bound = None
            if flat_grad is not None and bparams:
                # Differentiated, a leaf tensor keeps its autograd
                # accumulator's memory (~0.5 KiB, torch 2.13) while it lives:
                # the model's views, which live as long as the model, held
                # 19 MiB more heap after the first backward at 128 layers x
                # 64 groups. The block runs on stand-ins that die with it.
                bound, bparams = bparams, [p.detach().requires_grad_()
                                           for p in bparams]
                stack.flat.attach(layer * G + i, bparams)
            with torch.enable_grad():
                out = stack._call(run, layer, i, u, edge_index, args, kwargs,
                                  dtype)
            inputs = [u, *bparams, *(args[j] for j in arg_req)]
            grads = torch.autograd.grad(out, inputs, g[i], allow_unused=True)
            if bound is not None:
                stack.flat.attach(layer * G + i, bound)
            h[i].sub_(_wide(out.detach(), h))  # x_i = y_i - f(.)
            du = grads[0]
            if du is not None:
                if i > 0:
                    g[i - 1].add_(du)
                else:
                    g[1:].add_(du)
            bgrads = stack.flat.views(flat_grad, layer * G + i) \
                if block_grads is None else block_grads[layer * G + i]
            for j, gr in enumerate(grads[1:1 + len(bparams)]):
                if gr is not None:
                    bgrads[j].copy_(gr)
                elif flat_grad is None:
                    bgrads[j] = None
            for j, gj in zip(arg_req, grads[1 + len(bparams):]):
                if gj is not None:
                    arg_grads[j] = gj if arg_grads[j] is None else arg_grads[j] + gj
            # nothing of this block outlives it: a small object (a gradient
            # view, the last gradient) kept through the next block's
            # temporaries sits among them and grows the heap (+25 MiB at 64
            # layers on epfl/multiplier when the views were kept, measured)
            del out, grads, u
            bgrads = gr = du = bparams = bound = None
