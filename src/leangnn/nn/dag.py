"""``DAGNN``: propagation in topological order over the logic levels of a DAG.

The model follows the recursion that defines circuit labels instead of
stacking message-passing layers: every level's nodes read the final states of
their fanins (lower levels), the way DAGNN (Thost and Chen, ICLR 2021) and
DeepGate / DeepGate2 (Li et al., DAC 2022; Shi et al., ICCAD 2023) propagate,
optionally followed by a reverse pass over fanouts, for several rounds. Beside
the learned GRU states it carries two kinds of structured channels:

* timing channels, ``t_v = max_{fanin} t_u + d_v`` with a learned delay
  ``d_v`` that is linear in the gate-type one-hot and the fanin / fanout
  counts plus an MLP correction (TimingPredict, Guo et al., DAC 2022;
  PreRoutGNN, Zhong et al., AAAI 2024); in reverse, the longest path to a sink;
  normalised per graph by the longest path, so the model can represent
  "arrival = max over fanins + delay(type, fanout)" exactly;
* product channels, ``p_v = a_g + b_g prod_{fanin} (c_g + e_g p_u)`` with
  per-gate-type scalars ``a, b, c, e``: every COP signal-probability formula
  is one setting of them, and they feed the GRU at each level.

Activation memory is ``O(rounds x N x C)`` whatever the depth (see
:mod:`leangnn.nn.levels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import MLP

from .levels import LevelPlan, cell_sweep, level_plan, max_plus

__all__ = ["DAGNN", "AGGRS"]

AGGRS = ("max", "sum", "mean", "attention")
_NUM_GATE_TYPES = 12  # len(leangnn.circuits.GATE_TYPES), without importing circuits


class _GRUCell:
    """Per-level update: aggregate neighbour states, product channels, GRU."""

    def __init__(self, channels: int, aggr: str, typed: bool, num_types: int,
                 num_products: int):
        self.c, self.aggr, self.typed = channels, aggr, typed
        self.g, self.kp = num_types, num_products

    def state_shapes(self) -> list[int]:
        return [self.c] + ([self.kp] if self.kp else [])

    def step(self, gathered, node_inputs, loc, size, params):
        s_g = gathered[0]
        h, x, onehot, deg = node_inputs
        w_m, w_hh, b_hh, att, w_p, pa, pb, pc, pe = params
        if self.aggr == "max":
            m = s_g.new_zeros(size, self.c).index_reduce(
                0, loc, s_g, "amax", include_self=False)
        elif self.aggr == "attention":
            score = F.leaky_relu(s_g @ att[0] + (h @ att[1]).index_select(0, loc), 0.2)
            top = score.detach().new_full((size,), -torch.inf).index_reduce(
                0, loc, score.detach(), "amax")
            w = (score - top.index_select(0, loc)).exp()
            den = w.new_zeros(size).index_add(0, loc, w)
            w = w / den.index_select(0, loc)
            m = s_g.new_zeros(size, self.c).index_add(0, loc, s_g * w[:, None])
        else:
            m = s_g.new_zeros(size, self.c).index_add(0, loc, s_g)
            if self.aggr == "mean":
                m = m / deg
        if self.typed:
            m = (onehot[:, :, None] * m[:, None, :]).reshape(size, -1)
        gi = m @ w_m + x
        out = []
        if self.kp:
            oh_e = onehot.index_select(0, loc)
            vals = oh_e @ pc + (oh_e @ pe) * gathered[1]
            prod = vals.new_ones(size, self.kp).index_reduce(0, loc, vals, "prod")
            # COP values lie in [0, 1]; the clamp keeps deep sweeps from
            # compounding stray values into overflow.
            p = (onehot @ pa + (onehot @ pb) * prod).clamp(0.0, 1.0)
            gi = gi + p @ w_p
            out.append(p)
        gh = h @ w_hh + b_hh
        i_r, i_z, i_n = gi.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return [n + z * (h - n)] + out


class DAGNN(torch.nn.Module):
    r"""Topological-order GNN for DAGs (circuits): GRU states, timing and product
    channels propagated level by level.

    From "Directed Acyclic Graph Neural Networks" (Thost and Chen, ICLR 2021)
    and DeepGate2 (Shi et al., ICCAD 2023): per level, a node aggregates the
    already-final states of its fanins (``max``, ``sum``, ``mean`` or
    ``attention``) and updates its state with a GRU cell whose input weights
    can depend on the gate type; an optional reverse pass does the same over
    fanouts; ``rounds`` repeat both, each starting from the previous states.
    Timing channels (TimingPredict, DAC 2022; PreRoutGNN, AAAI 2024) and
    COP-style product channels are described in :mod:`leangnn.nn.dag`.
    The head reads ``[forward state, reverse state, product channels,
    normalised timing channels (and their per-graph quantile offsets)]``
    through an MLP plus a linear skip.

    The level plan is computed from ``edge_index`` once and cached (see
    :func:`~leangnn.nn.levels.level_plan`); the graph must be a DAG.

    Args:
        in_channels (int): input feature size.
        hidden_channels (int): GRU state width ``C``.
        out_channels (int): output size.
        num_layers (int, optional): depth of the encoder and head MLPs (not
            the propagation depth, which is the DAG's). (default: ``2``)
        aggr (str, optional): ``max``, ``sum``, ``mean`` or ``attention``.
            (default: ``"max"``)
        reverse (bool, optional): add a reverse pass over fanouts and the
            reverse timing channels (needed for required time / slack).
            (default: ``True``)
        rounds (int, optional): forward (+ reverse) passes. (default: ``1``)
        dropout (float, optional): dropout on the encoding and head input.
            (default: ``0.0``)
        gate_types (int or sequence of int, optional): columns of ``x``
            holding the gate-type one-hot: the first ``k`` columns, or the
            listed ones; ``0`` for untyped graphs. (default: ``12``, the
            circuits' :data:`~leangnn.circuits.GATE_TYPES`)
        typed (bool, optional): per-gate-type GRU input weights for the
            aggregated message. (default: ``True``)
        timing_channels (int, optional): max-plus channels ``K``. (default: ``4``)
        product_channels (int, optional): product channels. (default: ``4``)
        quantiles (sequence of float, optional): per-graph quantiles of the
            timing features the head also sees as offsets; empty to disable.
            (default: ``(0.25, 0.5, 0.75)``)

    Shapes:
        **input:** ``x [N, in_channels]``, ``edge_index [2, E]`` (fanin ->
        gate), optional ``level [N]``, ``batch [N]``, ``plan``
        **output:** ``[N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, aggr: str = "max", reverse: bool = True,
                 rounds: int = 1, dropout: float = 0.0,
                 gate_types: int | Sequence[int] = _NUM_GATE_TYPES,
                 typed: bool = True, timing_channels: int = 4,
                 product_channels: int = 4,
                 quantiles: Sequence[float] = (0.25, 0.5, 0.75)):
        super().__init__()
        if aggr not in AGGRS:
            raise ValueError(f"aggr must be one of {AGGRS}, got {aggr!r}")
        for name, v, lo in (("num_layers", num_layers, 1), ("rounds", rounds, 1),
                            ("hidden_channels", hidden_channels, 1),
                            ("timing_channels", timing_channels, 0),
                            ("product_channels", product_channels, 0)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        cols = list(range(gate_types)) if isinstance(gate_types, int) \
            else [int(c) for c in gate_types]
        if any(c < 0 or c >= in_channels for c in cols):
            raise ValueError(f"gate_types: columns {cols} outside the "
                             f"{in_channels} input channels")
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers = out_channels, num_layers
        self.aggr, self.reverse, self.rounds = aggr, reverse, rounds
        self.dropout, self.typed = dropout, typed
        self.gate_cols = cols
        self.quantiles = tuple(float(q) for q in quantiles)
        g = max(len(cols), 1)
        c, k, kp = hidden_channels, timing_channels, product_channels
        self.k, self.kp = k, kp
        self.encoder = MLP([in_channels] + [c] * num_layers, act="relu",
                           norm=None, plain_last=False)
        self.init = torch.nn.Linear(c, c)
        dirs = ["fwd"] + (["rev"] if reverse else [])
        self.cells = {d: _GRUCell(c, aggr, typed, g, kp if d == "fwd" else 0)
                      for d in dirs}
        self.x_proj = torch.nn.ModuleDict({
            d: torch.nn.Linear(c * (2 if reverse else 1) if d == "fwd" else 2 * c,
                               3 * c) for d in dirs})
        gm = g if typed else 1
        self.w_m = torch.nn.ParameterDict(
            {d: torch.nn.Parameter(torch.empty(gm * c, 3 * c)) for d in dirs})
        self.w_hh = torch.nn.ParameterDict(
            {d: torch.nn.Parameter(torch.empty(c, 3 * c)) for d in dirs})
        self.b_hh = torch.nn.ParameterDict(
            {d: torch.nn.Parameter(torch.empty(3 * c)) for d in dirs})
        self.att = torch.nn.ParameterDict(
            {d: torch.nn.Parameter(torch.empty(2, c)) for d in dirs})
        # product channels: p = a + b * prod(c + e * p_u), per gate type
        self.prod = torch.nn.Parameter(torch.empty(4, g, kp))
        self.w_p = torch.nn.Parameter(torch.empty(kp, 3 * c))
        # delay = type one-hot @ W + fanin * w_fi + fanout * w_fo + b + MLP(h)
        self.delay_type = torch.nn.Linear(g, k)
        self.delay_deg = torch.nn.Parameter(torch.empty(2, k))
        self.delay_mlp = MLP([c, c, k], act="relu", norm=None) if k else None
        nt = k * (3 if reverse else 1)
        self.num_timing_features = nt * (1 + len(self.quantiles))
        z = c * len(dirs) + kp + self.num_timing_features
        self.head = MLP([z] + [c] * (num_layers - 1) + [out_channels], act="relu",
                        norm=None, dropout=dropout) if num_layers > 1 else \
            torch.nn.Linear(z, out_channels)
        self.skip = torch.nn.Linear(kp + self.num_timing_features, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        c = self.hidden_channels
        for m in (self.encoder, self.init, *self.x_proj.values(), self.head,
                  self.skip, *([self.delay_mlp] if self.delay_mlp else [])):
            m.reset_parameters()
        bound = 1.0 / c ** 0.5
        for d in self.w_m:
            for p in (self.w_m[d], self.w_hh[d], self.b_hh[d], self.att[d]):
                torch.nn.init.uniform_(p, -bound, bound)
        torch.nn.init.uniform_(self.w_p, -bound, bound)
        with torch.no_grad():
            # a + b * prod(c + e p): start near AND (a=0, b=1, c=0, e=1), jittered
            # per channel so the channels can specialise.
            self.prod.copy_(torch.tensor([0.0, 1.0, 0.0, 1.0])[:, None, None])
            self.prod.add_(0.1 * torch.randn_like(self.prod))
            # unit delay per gate: timing channels start as logic levels
            self.delay_type.weight.zero_()
            self.delay_type.bias.fill_(1.0)
            self.delay_deg.zero_()
            # The MLP corrections start at zero, so training starts from the
            # structured channels (the linear skip) and adds what they miss.
            for mlp in (self.delay_mlp, self.head):
                if mlp is not None:
                    last = mlp.lins[-1] if isinstance(mlp, MLP) else mlp
                    last.weight.zero_()
                    last.bias.zero_()

    # ------------------------------------------------------------------ #
    def _onehot(self, x: Tensor) -> Tensor:
        if not self.gate_cols:
            return x.new_ones(x.size(0), 1)
        if self.gate_cols == list(range(len(self.gate_cols))):
            return x[:, :len(self.gate_cols)]
        return x[:, self.gate_cols]

    def _plan(self, x, edge_index, level, plan) -> LevelPlan:
        if plan is None:
            plan = level_plan(edge_index, x.size(0), level)
        if plan.num_nodes != x.size(0):
            raise ValueError(f"plan has {plan.num_nodes} nodes, x has {x.size(0)}")
        return plan

    def timing(self, x: Tensor, edge_index: Tensor, level: Tensor | None = None,
               plan: LevelPlan | None = None, h: Tensor | None = None):
        """Raw timing channels: ``(arrival [N, K], to_sink [N, K] or None,
        delay [N, K])``; ``to_sink`` includes the node's own delay."""
        plan = self._plan(x, edge_index, level, plan)
        onehot = self._onehot(x)
        if h is None:
            h = self.encoder(x)
        deg = torch.stack([plan.in_degree, plan.out_degree], 1).to(x.dtype)
        d = self.delay_type(onehot) + deg @ self.delay_deg
        if self.delay_mlp is not None:
            d = d + self.delay_mlp(h)
        has_fanin = (plan.in_degree > 0).to(d.dtype)[:, None]
        arrival = max_plus(d * has_fanin, plan.forward)
        to_sink = max_plus(d, plan.reverse) if self.reverse else None
        return arrival, to_sink, d

    def _graph_max(self, t: Tensor, batch: Tensor | None) -> Tensor:
        if batch is None:
            return t.amax(0, keepdim=True)
        size = int(batch.max()) + 1 if batch.numel() else 0
        mx = t.new_full((size, t.size(1)), -torch.inf).index_reduce(
            0, batch, t, "amax")
        return mx.index_select(0, batch)

    def _timing_features(self, arrival, to_sink, d, batch) -> Tensor:
        scale = self._graph_max(arrival, batch).clamp_min(1e-6)
        feats = [arrival / scale]
        if to_sink is not None:
            feats += [to_sink / scale, (arrival + to_sink - d) / scale]
        f = torch.cat(feats, 1)
        if not self.quantiles:
            return f
        q = torch.tensor(self.quantiles, dtype=f.dtype, device=f.device)
        if batch is None:
            offs = [f - qs for qs in torch.quantile(f, q, dim=0)]
        else:
            offs = [torch.empty_like(f) for _ in self.quantiles]
            for b in torch.unique(batch).tolist():
                sel = (batch == b).nonzero().view(-1)
                fb = f.index_select(0, sel)
                for o, qs in zip(offs, torch.quantile(fb, q, dim=0)):
                    o.index_copy_(0, sel, fb - qs)
        return torch.cat([f] + offs, 1)

    def _params(self, d: str) -> list[Tensor]:
        empty = self.w_p.new_zeros(0)
        prod = list(self.prod) if d == "fwd" and self.kp else [empty] * 4
        return [self.w_m[d], self.w_hh[d], self.b_hh[d], self.att[d],
                self.w_p if d == "fwd" and self.kp else empty, *prod]

    def forward(self, x: Tensor, edge_index: Tensor, level: Tensor | None = None,
                batch: Tensor | None = None, plan: LevelPlan | None = None,
                **kwargs) -> Tensor:
        plan = self._plan(x, edge_index, level, plan)
        h = self.encoder(x)
        h = F.dropout(h, self.dropout, self.training)
        onehot = self._onehot(x).to(h.dtype)
        deg_in = plan.in_degree.clamp_min(1).to(h.dtype)[:, None]
        deg_out = plan.out_degree.clamp_min(1).to(h.dtype)[:, None]
        s = torch.tanh(self.init(h))
        r = s if self.reverse else None
        prob = None
        for _ in range(self.rounds):
            inp = torch.cat([h, r], 1) if self.reverse else h
            out = cell_sweep(self.cells["fwd"], plan.forward,
                             [s, self.x_proj["fwd"](inp), onehot, deg_in],
                             self._params("fwd"))
            s = out[0]
            prob = out[1] if self.kp else None
            if self.reverse:
                r = cell_sweep(self.cells["rev"], plan.reverse,
                               [r, self.x_proj["rev"](torch.cat([h, s], 1)), onehot,
                                deg_out], self._params("rev"))[0]
        parts = [s] + ([r] if self.reverse else [])
        skip = [] if prob is None else [prob]
        if self.k:
            skip.append(self._timing_features(*self.timing(x, edge_index, plan=plan,
                                                           h=h), batch))
        z = torch.cat(parts + skip, 1)
        z = F.dropout(z, self.dropout, self.training)
        out = self.head(z)
        if skip:
            out = out + self.skip(torch.cat(skip, 1))
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.hidden_channels}, {self.out_channels}, "
                f"num_layers={self.num_layers}, aggr={self.aggr}, "
                f"reverse={self.reverse}, rounds={self.rounds})")
