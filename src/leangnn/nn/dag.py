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
  is one setting of them, and they feed the GRU at each level. For signal
  probability (``cop_input``) channel 0 is held at an analytic estimate, COP
  or the reconvergence-aware cut estimate of :mod:`leangnn.circuits.sigprob`
  (computed once per graph), and the output is that estimate plus a learned
  correction.

Activation memory is ``O(rounds x N x C)`` whatever the depth (see
:mod:`leangnn.nn.levels`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import MLP

from .levels import (
    EdgeIndexCache,
    LevelPlan,
    cell_sweep,
    level_plan,
    max_plus,
    one_intraop_thread,
)

__all__ = ["DAGNN", "AGGRS", "ESTIMATORS", "TASK_DEFAULTS"]

_DEFAULTS = {"reverse": True, "product_channels": 4, "quantiles": (),
             "learn_products": True, "cop_input": False, "quantile_head": False,
             "estimator": "cop", "correction_gain": 1.0, "center_correction": False}
#: per task, the options measured best by ``benchmarks/circuit_models.py``:
#: slack needs the reverse pass and quartile offsets (its classes are
#: per-circuit quartiles), and starts from the unit-delay slack classes
#: (``quantile_head``); signal probability is the hybrid: an analytic estimate
#: as a fixed channel and the output's start (``cop_input``), plus a learned
#: correction (learned product channels did not carry to unseen circuits). The
#: estimate is the reconvergence-aware cut estimate (``estimator="cut"``,
#: :mod:`leangnn.circuits.sigprob`), closer to the label than COP on every
#: measured circuit. Corrections learned on the 13 small training circuits
#: move unseen ones away from it (test MAE +0.002 to +0.005 undamped), least
#: when damped (``correction_gain=0.1``) and kept from shifting a circuit's
#: mean (``center_correction``): +0.0004 (default split) / +0.0012 (ITC-99).
TASK_DEFAULTS = {
    "arrival": {"reverse": True},
    "critical": {"reverse": True, "quantiles": (0.25, 0.5, 0.75),
                 "product_channels": 0, "quantile_head": True},
    "signal_prob": {"reverse": False, "learn_products": False, "cop_input": True,
                    "estimator": "cut", "correction_gain": 0.1,
                    "center_correction": True},
}

AGGRS = ("max", "sum", "mean", "attention")
ESTIMATORS = ("cop", "cut")
_NUM_GATE_TYPES = 12  # len(leangnn.circuits.GATE_TYPES), without importing circuits
# The product channels' per-type scalars must travel O(1) (e.g. b from 1 to -1
# for an inverter) while Adam moves a parameter about ``lr`` per step; storing
# them divided by a gain lets them get there in tens, not thousands, of steps.
_GAIN = 10.0
# Logit slope of the quantile head's start per unit of offset: sharp enough
# that the start classifies like its thresholds, soft enough to train.
_QUANTILE_GAIN = 10.0


def _quantile_offsets(f: Tensor, q: Tensor) -> Tensor:
    """``(f - quantile_q(f)) / spread`` per column and quantile, where the spread
    is the range between the outer quantiles: scale-free, so a class boundary
    at a quantile is at 0 with O(1) slopes whatever the circuit's spread. The
    floor keeps a degenerate spread (most nodes on one level, e.g. a decoder)
    from turning offsets of [0, 1] features into thousands."""
    qs = torch.quantile(f, q, dim=0)  # [Q, F]
    spread = (qs[-1] - qs[0]).clamp_min(0.05) if q.numel() > 1 else 1.0
    return torch.cat([(f - v) / spread for v in qs], 1)


# edge_index -> (gate types digest, cut estimate); like the level plans, an
# entry dies with its edge_index tensor, so a graph pays for it once per run.
_ESTIMATES = EdgeIndexCache(64)


def _cut_estimate(onehot: Tensor, edge_index: Tensor, plan: LevelPlan) -> Tensor:
    """``float64 [N, 1]`` :func:`~leangnn.circuits.sigprob.cut_signal_probability`
    of the graph, gate types read from the one-hot, cached per ``edge_index``."""
    from ..circuits.sigprob import cut_signal_probability_arrays

    types = onehot.detach().argmax(1).to(torch.int8).cpu().numpy()
    stamp = (edge_index._version, tuple(edge_index.shape),
             hashlib.blake2b(types.tobytes(), digest_size=16).digest())
    est = _ESTIMATES.get(edge_index, stamp)
    if est is not None:
        return est
    ei = edge_index.detach().cpu().numpy().astype(np.int64, copy=False)
    by_dst = np.argsort(ei[1], kind="stable")
    ptr = np.zeros(types.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(ei[1], minlength=types.size), out=ptr[1:])
    prob = cut_signal_probability_arrays(types, ptr, ei[0][by_dst],
                                         plan.level.cpu().numpy())
    est = torch.as_tensor(prob, device=edge_index.device)[:, None]
    _ESTIMATES.put(edge_index, stamp, est)
    return est


def _segment_sum(v: Tensor, loc: Tensor, size: int) -> Tensor:
    return v.new_zeros((size,) + v.shape[1:]).index_add_(0, loc, v)


#: levels with fewer nodes run the dense one-hot product: grouping costs a
#: fixed ~10 small ops per level, measured 1.3-1.5x slower steps on circuits
#: of small levels (epfl/max, c6288) and 0.63-0.73x on itc99/b17, b19
GROUP_MIN_ROWS = 256


def _type_groups(onehot: Tensor) -> tuple[Tensor, list[int]] | None:
    """Rows ordered by gate type and the count of each type, when the level is
    large enough (:data:`GROUP_MIN_ROWS`) and every row of ``onehot`` is
    exactly one-hot (else ``None``: the dense product)."""
    if onehot.size(0) < max(1, GROUP_MIN_ROWS) or not bool(
            ((onehot == 0) | (onehot == 1)).all()) or not bool(
            (onehot.sum(1) == 1).all()):
        return None
    t = onehot.argmax(1)
    return torch.argsort(t, stable=True), torch.bincount(
        t, minlength=onehot.size(1)).tolist()


def _typed_mm(m: Tensor, w: Tensor, groups, transpose: bool = False) -> Tensor:
    """``(onehot (x) m) @ w`` (or ``@ w.T`` per type block, ``transpose``) with
    one product per gate type present: measured 1.6x faster per step on
    itc99/b19 than the dense one-hot expansion, which multiplies
    ``num_types`` times more zeros than values."""
    order, sizes = groups
    g = len(sizes)
    if transpose:  # w [g*c, k]: row block j is type j's; here m is [size, k]
        blocks = w.view(g, -1, w.size(1)).transpose(1, 2)
    else:
        blocks = w.view(g, m.size(1), -1)
    parts = [mk @ blocks[k] for k, mk in
             zip(range(g), m.index_select(0, order).split(sizes)) if sizes[k]]
    out = torch.cat(parts)
    return out.new_empty(out.shape).index_copy(0, order, out)


def _typed_grad(m: Tensor, d: Tensor, groups, num_rows: int) -> Tensor:
    """``(onehot (x) m).T @ d`` grouped by type: ``[g * c, k]``."""
    order, sizes = groups
    ms, ds = m.index_select(0, order).split(sizes), d.index_select(0, order).split(
        sizes)
    out = m.new_zeros(len(sizes), m.size(1), d.size(1))
    for k, (mk, dk) in enumerate(zip(ms, ds)):
        if sizes[k]:
            out[k] = mk.t() @ dk
    return out.view(num_rows, d.size(1))


class _GRUCell:
    """Per-level update: aggregate neighbour states, product channels, GRU.

    :meth:`step_backward` is the hand-written backward of :meth:`step`; the
    sweep calls it instead of running autograd on every level, which costs
    about 1 ms of engine overhead per level (8,685 levels on ``epfl/div``).
    """

    manual_backward = True

    def __init__(self, channels: int, aggr: str, typed: bool, num_types: int,
                 num_products: int):
        self.c, self.aggr, self.typed = channels, aggr, typed
        self.g, self.kp = num_types, num_products

    def state_shapes(self) -> list[int]:
        return [self.c] + ([self.kp] if self.kp else [])

    def _parts(self, gathered, node_inputs, loc, size, params) -> dict:
        s_g = gathered[0]
        h, x, onehot, deg = node_inputs[:4]
        w_m, w_hh, b_hh, att, w_p, pa, pb, pc, pe = params
        f: dict = {}
        if self.aggr == "max":
            m = s_g.new_zeros(size, self.c).index_reduce(
                0, loc, s_g, "amax", include_self=False)
        elif self.aggr == "attention":
            pre = s_g @ att[0] + (h @ att[1]).index_select(0, loc)
            score = F.leaky_relu(pre, 0.2)
            top = score.detach().new_full((size,), -torch.inf).index_reduce(
                0, loc, score.detach(), "amax")
            w = (score - top.index_select(0, loc)).exp()
            w = w / _segment_sum(w, loc, size).index_select(0, loc)
            m = _segment_sum(s_g * w[:, None], loc, size)
            f.update(pre=pre, w=w)
        else:
            m = _segment_sum(s_g, loc, size)
            if self.aggr == "mean":
                m = m / deg
        f["m"] = m
        groups = _type_groups(onehot) if self.typed else None
        f["groups"] = groups
        if groups is not None:
            gi = _typed_mm(m, w_m, groups) + x
        else:
            if self.typed:
                m = (onehot[:, :, None] * m[:, None, :]).reshape(size, -1)
            f["mt"] = m
            gi = m @ w_m + x
        if self.kp:
            oh_e = onehot.index_select(0, loc)
            ee = oh_e @ pe
            vals = oh_e @ pc + ee * gathered[1]
            prod = vals.new_ones(size, self.kp).index_reduce(0, loc, vals, "prod")
            b = onehot @ pb
            pre_p = onehot @ pa + b * prod
            # COP values lie in [0, 1]; the clamp keeps deep sweeps from
            # compounding stray values into overflow.
            p = pre_p.clamp(0.0, 1.0)
            if len(node_inputs) > 4:  # channel 0 held at a given estimate
                p = torch.cat([node_inputs[4], p[:, 1:]], 1)
            gi = gi + p @ w_p
            f.update(oh_e=oh_e, ee=ee, vals=vals, prod=prod, b=b, pre_p=pre_p, p=p)
        gh = h @ w_hh + b_hh
        i_r, i_z, i_n = gi.chunk(3, 1)
        h_r, h_z, h_n = gh.chunk(3, 1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        f.update(r=r, z=z, n=n, h_n=h_n, out=n + z * (h - n))
        return f

    def step(self, gathered, node_inputs, loc, size, params):
        f = self._parts(gathered, node_inputs, loc, size, params)
        return [f["out"]] + ([f["p"]] if self.kp else [])

    def step_backward(self, gathered, node_inputs, loc, size, params, grads):
        """Gradients of :meth:`step` for ``grads`` of its outputs: lists for
        ``gathered``, ``node_inputs`` and ``params`` (``None`` where unused)."""
        f = self._parts(gathered, node_inputs, loc, size, params)
        s_g = gathered[0]
        h, _, onehot, deg = node_inputs[:4]
        w_m, w_hh, _, att, w_p, *_ = params
        g_out = grads[0]
        r, z, n = f["r"], f["z"], f["n"]
        d_n = g_out * (1 - z) * (1 - n * n)
        d_r = d_n * f["h_n"] * r * (1 - r)
        d_z = g_out * (h - n) * z * (1 - z)
        d_gi = torch.cat([d_r, d_z, d_n], 1)
        d_gh = torch.cat([d_r, d_z, d_n * r], 1)
        g_h = g_out * z + d_gh @ w_hh.t()
        g_par: list = [None] * 9
        groups = f["groups"]
        if groups is not None:
            g_par[0] = _typed_grad(f["m"], d_gi, groups, w_m.size(0))
            d_m = _typed_mm(d_gi, w_m, groups, transpose=True)
        else:
            g_par[0] = f["mt"].t() @ d_gi
            d_m = d_gi @ w_m.t()
            if self.typed:
                d_m = (d_m.view(size, self.g, self.c) * onehot[:, :, None]).sum(1)
        g_par[1] = h.t() @ d_gh
        g_par[2] = d_gh.sum(0)
        g_gath: list = [None] * len(gathered)
        if self.kp:
            g_par[4] = f["p"].t() @ d_gi
            pre_p = f["pre_p"]
            d_pre = (grads[1] + d_gi @ w_p.t()) * ((pre_p >= 0) & (pre_p <= 1))
            if len(node_inputs) > 4:  # a constant: nothing flows to channel 0
                d_pre = torch.cat([torch.zeros_like(d_pre[:, :1]), d_pre[:, 1:]], 1)
            prod, vals = f["prod"], f["vals"]
            g_par[5] = onehot.t() @ d_pre
            g_par[6] = onehot.t() @ (d_pre * prod)
            d_vals = (d_pre * f["b"]).index_select(0, loc) * _excluding(
                vals, prod, loc, size)
            g_par[7] = f["oh_e"].t() @ d_vals
            g_par[8] = f["oh_e"].t() @ (d_vals * gathered[1])
            g_gath[1] = d_vals * f["ee"]
        d_me = d_m.index_select(0, loc)
        if self.aggr == "max":
            hit = (s_g == f["m"].index_select(0, loc)).to(s_g.dtype)
            count = _segment_sum(hit, loc, size).index_select(0, loc)
            g_gath[0] = hit * d_me / count
        elif self.aggr == "attention":
            w = f["w"]
            d_w = (d_me * s_g).sum(1)
            d_score = w * (d_w - _segment_sum(w * d_w, loc, size).index_select(0, loc))
            d_pre_a = d_score * torch.where(f["pre"] > 0, 1.0, 0.2).to(s_g.dtype)
            g_gath[0] = w[:, None] * d_me + d_pre_a[:, None] * att[0]
            d_node = _segment_sum(d_pre_a, loc, size)
            g_h = g_h + d_node[:, None] * att[1]
            g_par[3] = torch.stack([s_g.t() @ d_pre_a, h.t() @ d_node])
        elif self.aggr == "mean":
            g_gath[0] = (d_m / deg).index_select(0, loc)
        else:
            g_gath[0] = d_me
        return g_gath, [g_h, d_gi] + [None] * (len(node_inputs) - 2), g_par


def _excluding(vals: Tensor, prod: Tensor, loc: Tensor, size: int) -> Tensor:
    """Per edge, the product of the other values of its segment (zeros exact)."""
    zero = vals == 0
    safe = torch.where(zero, torch.ones_like(vals), vals)
    nonzero_prod = vals.new_ones(size, vals.size(1)).index_reduce(
        0, loc, safe, "prod").index_select(0, loc)
    zeros = _segment_sum(zero.to(vals.dtype), loc, size).index_select(0, loc)
    return torch.where(zero, torch.where(zeros == 1, nonzero_prod, 0.0),
                       torch.where(zeros == 0, nonzero_prod / safe, 0.0))


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
            (default: the task's, else ``True``)
        rounds (int, optional): forward (+ reverse) passes. (default: ``1``)
        dropout (float, optional): dropout on the encoding and head input.
            (default: ``0.0``)
        gate_types (int or sequence of int, optional): columns of ``x``
            holding the gate-type one-hot: the first ``k`` columns, or the
            listed ones; ``0`` for untyped graphs. (default: ``12``, the
            circuits' :data:`~leangnn.circuits.GATE_TYPES`, when
            ``in_channels >= 12``, else ``0``)
        typed (bool, optional): per-gate-type GRU input weights for the
            aggregated message. (default: ``True``)
        timing_channels (int, optional): max-plus channels ``K``. (default: ``4``)
        product_channels (int, optional): product channels. (default: the
            task's, else ``4``)
        quantiles (sequence of float, optional): per-graph quantiles of the
            timing features the head also sees as offsets, e.g.
            ``(0.25, 0.5, 0.75)`` for slack quartile classes; empty to disable.
            (default: the task's, else ``()``)
        product_init (str, optional): start of the product channels: ``"cop"``
            (the COP formula of every gate type of
            :data:`~leangnn.circuits.GATE_TYPES`, then learned) or ``"and"``.
            (default: ``"cop"`` when ``gate_types`` has 12 columns, else
            ``"and"``)
        learn_products (bool, optional): train the product channels' per-type
            scalars; ``False`` keeps them at ``product_init`` (with
            ``"cop"``: exact COP probabilities as a fixed channel).
            (default: the task's, else ``True``)
        cop_input (bool, optional): the hybrid signal-probability model:
            product channel 0 is held at an analytic probability estimate
            computed from the structure (``estimator``; not the label's
            simulation), feeds the GRU, and the output starts as that
            channel, so training learns a correction to it (needs the COP
            start and a product channel). ``False`` is the off switch.
            (default: the task's, else ``False``)
        estimator (str, optional): the estimate ``cop_input`` holds:
            ``"cop"`` (COP, computed by the product channel itself) or
            ``"cut"`` (exact over an 8-leaf cut of each node's cone, leaves
            independent: :func:`leangnn.circuits.sigprob.cut_signal_probability`;
            computed once per graph with numpy and cached on ``edge_index``).
            (default: the task's, else ``"cop"``)
        correction_gain (float, optional): with ``cop_input``, the output is
            ``estimate + correction_gain * correction``; the estimate's own
            weight stays 1. A small gain damps Adam's steps on the correction
            (it is measured, not assumed, to transfer poorly to unseen
            circuits). (default: the task's, else ``1.0``)
        center_correction (bool, optional): with ``cop_input``, subtract each
            graph's mean correction, so training cannot shift a whole
            circuit (the failure seen on the ITC-99 circuits).
            (default: the task's, else ``False``)
        quantile_head (bool, optional): the classification head starts as the
            ordinal classes of timing channel 0's longest path through each
            node cut at its per-graph ``quantiles`` (class 0: longest path,
            least slack), so training starts from unit-delay slack classes and
            refines the delays (needs ``reverse``, a timing channel and
            ``out_channels = len(quantiles) + 1``). (default: the task's,
            else ``False``)
        task (str, optional): ``arrival``, ``critical`` or ``signal_prob``:
            options left ``None`` take that task's measured best setting
            (:data:`TASK_DEFAULTS`, from ``benchmarks/circuit_models.py``).
            (default: ``None``)

    Shapes:
        **input:** ``x [N, in_channels]``, ``edge_index [2, E]`` (fanin ->
        gate), optional ``level [N]``, ``batch [N]``, ``plan``
        **output:** ``[N, out_channels]``
    """

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 2, aggr: str = "max", reverse: bool | None = None,
                 rounds: int = 1, dropout: float = 0.0,
                 gate_types: int | Sequence[int] | None = None,
                 typed: bool = True, timing_channels: int = 4,
                 product_channels: int | None = None,
                 quantiles: Sequence[float] | None = None,
                 product_init: str | None = None, learn_products: bool | None = None,
                 cop_input: bool | None = None, quantile_head: bool | None = None,
                 estimator: str | None = None, correction_gain: float | None = None,
                 center_correction: bool | None = None, task: str | None = None):
        super().__init__()
        if task is not None and task not in TASK_DEFAULTS:
            raise ValueError(f"task must be one of {sorted(TASK_DEFAULTS)} (or None), "
                             f"got {task!r}")
        given = {"reverse": reverse, "product_channels": product_channels,
                 "quantiles": quantiles, "learn_products": learn_products,
                 "cop_input": cop_input, "quantile_head": quantile_head,
                 "estimator": estimator, "correction_gain": correction_gain,
                 "center_correction": center_correction}
        opts = {**_DEFAULTS, **TASK_DEFAULTS.get(task, {}),
                **{k: v for k, v in given.items() if v is not None}}
        reverse, product_channels = opts["reverse"], opts["product_channels"]
        quantiles, learn_products = opts["quantiles"], opts["learn_products"]
        cop_input = bool(opts["cop_input"])
        quantile_head = bool(opts["quantile_head"])
        estimator = opts["estimator"]
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got "
                             f"{estimator!r}")
        self.task = task
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
        if gate_types is None:  # circuits' features start with the one-hot
            gate_types = _NUM_GATE_TYPES if in_channels >= _NUM_GATE_TYPES else 0
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
        if product_init is None:
            product_init = "cop" if len(cols) == _NUM_GATE_TYPES else "and"
        if product_init not in ("cop", "and") or (
                product_init == "cop" and len(cols) != _NUM_GATE_TYPES):
            raise ValueError(f"product_init must be 'and', or 'cop' with the "
                             f"{_NUM_GATE_TYPES} gate-type columns of GATE_TYPES; "
                             f"got {product_init!r} with {len(cols)} columns")
        self.product_init = product_init
        cop_fits = product_init == "cop" and product_channels >= 1 \
            and out_channels == 1
        if cop_input and not cop_fits and given["cop_input"] is None:
            cop_input = False  # a task default applies where it fits the shapes
        if cop_input and not cop_fits:
            raise ValueError("cop_input needs product_init='cop', product_channels "
                             f">= 1 and out_channels 1; got {product_init!r}, "
                             f"{product_channels}, {out_channels}")
        self.cop_input = cop_input
        self.estimator = estimator
        self.correction_gain = float(opts["correction_gain"])
        if not 0.0 <= self.correction_gain < float("inf"):
            raise ValueError(f"correction_gain must be a finite number >= 0, got "
                             f"{opts['correction_gain']!r}")
        self.center_correction = bool(opts["center_correction"])
        q_fits = reverse and timing_channels >= 1 and \
            out_channels == len(quantiles) + 1
        if quantile_head and not q_fits and given["quantile_head"] is None:
            quantile_head = False
        if quantile_head and not q_fits:
            raise ValueError("quantile_head needs reverse=True, timing_channels >= 1 "
                             "and out_channels = len(quantiles) + 1; got "
                             f"{reverse}, {timing_channels}, {out_channels} with "
                             f"{len(quantiles)} quantiles")
        self.quantile_head = quantile_head
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
            {d: torch.nn.Parameter(torch.empty(2, c)) for d in dirs}
            if aggr == "attention" else {})
        # product channels: p = a + b * prod(c + e * p_u), per gate type
        self.prod = torch.nn.Parameter(torch.empty(4, g, kp),
                                       requires_grad=learn_products)
        self.learn_products = learn_products
        # cop_input: channel 0 reads this fixed copy, whatever the others learn
        self.register_buffer("cop_start", torch.empty(4, g, 1) if cop_input else None)
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
        mask = torch.ones_like(self.skip.weight)
        mask[:, 0] = 0.0
        self.register_buffer("skip_mask", mask if cop_input else None,
                             persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        c = self.hidden_channels
        for m in (self.encoder, self.init, *self.x_proj.values(), self.head,
                  self.skip, *([self.delay_mlp] if self.delay_mlp else [])):
            m.reset_parameters()
        bound = 1.0 / c ** 0.5
        for p in (*self.w_m.values(), *self.w_hh.values(), *self.b_hh.values(),
                  *self.att.values()):
            torch.nn.init.uniform_(p, -bound, bound)
        torch.nn.init.uniform_(self.w_p, -bound, bound)
        with torch.no_grad():
            # a + b * prod(c + e p), jittered per channel so the channels can
            # specialise. A deep product recursion started far from a useful
            # gate function saturates (vanishing gradients), hence the COP start.
            # Channel 0 starts exactly at product_init, the others jittered.
            self.prod.copy_(self._product_start()[:, :, None])
            self.prod[:, :, 1:].add_(0.05 * torch.randn_like(self.prod[:, :, 1:]))
            self.prod.div_(_GAIN)
            if self.cop_input:
                self.cop_start.copy_(self._product_start()[:, :, None])
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
            if self.cop_input:  # the output starts as the COP channel
                self.skip.weight.zero_()
                self.skip.bias.zero_()
                self.skip.weight[0, 0] = 1.0
            if self.quantile_head:
                self._quantile_start()

    def _quantile_start(self) -> None:
        """Skip weights whose logits are ordinal classes of the path channel.

        With offsets ``o_j = (path - q_j) / spread`` at ascending quantiles,
        ``logit_k = -M (o_Q + ... + o_{Q-k+1})``: consecutive logits differ
        by ``-M o_j``, which falls as ``j`` falls, so the argmax is the class
        whose quantile interval holds the path (longest paths: class 0).
        """
        k, nq = self.k, len(self.quantiles)
        nt = 3 * k  # arrival, to-sink, path: K each
        w = self.skip.weight
        w.zero_()
        self.skip.bias.zero_()
        for cls in range(1, nq + 1):
            for j in range(nq - cls, nq):  # quantiles j = Q-1 .. Q-cls
                # offsets block j, path channel 0
                w[cls, self.kp + nt + j * nt + 2 * k] = -_QUANTILE_GAIN

    def _product_start(self) -> Tensor:
        """``[4, G]`` start values of ``(a, b, c, e)`` per gate type."""
        g = self.prod.size(1)
        if self.product_init == "and":
            return torch.tensor([0.0, 1.0, 0.0, 1.0])[:, None].repeat(1, g)
        from ..circuits.cop import cop_parameters

        return torch.as_tensor(cop_parameters(), dtype=torch.float32)

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
        # Non-negative delays keep every channel within [0, its graph maximum],
        # so the normalised features stay in [0, 1] whatever the training does
        # to the delay weights (a negative delay could make the maximum tiny).
        d = d.clamp_min(0.0)
        has_fanin = (plan.in_degree > 0).to(d.dtype)[:, None]
        arrival = max_plus(d * has_fanin, plan.forward)
        to_sink = max_plus(d, plan.reverse) if self.reverse else None
        return arrival, to_sink, d

    def _graph_mean(self, t: Tensor, batch: Tensor | None) -> Tensor:
        if batch is None:
            return t.mean(0, keepdim=True)
        size = int(batch.max()) + 1 if batch.numel() else 0
        total = _segment_sum(t, batch, size)
        count = _segment_sum(torch.ones_like(t[:, :1]), batch, size)
        return (total / count.clamp_min(1)).index_select(0, batch)

    def _graph_max(self, t: Tensor, batch: Tensor | None) -> Tensor:
        if batch is None:
            return t.amax(0, keepdim=True)
        size = int(batch.max()) + 1 if batch.numel() else 0
        mx = t.new_full((size, t.size(1)), -torch.inf).index_reduce(
            0, batch, t, "amax")
        return mx.index_select(0, batch)

    def _timing_features(self, arrival, to_sink, d, batch) -> Tensor:
        mx = self._graph_max(arrival, batch)
        # A channel that no gate of the graph delays (no gate has a fanin, or
        # the learnt delays vanish) carries no timing: zero it rather than
        # divide the inputs' own delays (to_sink) by the 1e-6 floor, which gave
        # outputs of -1e5 on edgeless circuits.
        live = (mx > 1e-6).to(arrival.dtype)
        arrival, d = arrival * live, d * live
        to_sink = None if to_sink is None else to_sink * live
        scale = mx.clamp_min(1e-6)
        feats = [arrival / scale]
        if to_sink is not None:
            feats += [to_sink / scale, (arrival + to_sink - d) / scale]
        f = torch.cat(feats, 1)
        if not self.quantiles:
            return f
        q = torch.tensor(self.quantiles, dtype=f.dtype, device=f.device)
        if batch is None:
            return torch.cat([f, _quantile_offsets(f, q)], 1)
        offs = torch.empty(f.size(0), f.size(1) * q.numel(), dtype=f.dtype,
                           device=f.device)
        for b in torch.unique(batch).tolist():
            sel = (batch == b).nonzero().view(-1)
            offs.index_copy_(0, sel, _quantile_offsets(f.index_select(0, sel), q))
        return torch.cat([f, offs], 1)

    def cut_estimate(self, x: Tensor, edge_index: Tensor,
                     plan: LevelPlan | None = None) -> Tensor:
        """``[N, 1]`` cut estimate of the graph (``estimator="cut"``), gate
        types read from ``x``'s one-hot columns, in ``x``'s dtype; computed
        with numpy once per graph and cached."""
        plan = self._plan(x, edge_index, None, plan)
        return _cut_estimate(self._onehot(x), edge_index, plan).to(x)

    def _params(self, d: str) -> list[Tensor]:
        empty = self.w_p.new_zeros(0)
        prod = [empty] * 4
        if d == "fwd" and self.kp:
            scaled = self.prod * _GAIN
            if self.cop_input:
                scaled = torch.cat([self.cop_start.to(scaled.dtype), scaled[:, :, 1:]],
                                   2)
            prod = list(scaled)
        return [self.w_m[d], self.w_hh[d], self.b_hh[d],
                self.att[d] if d in self.att else empty,
                self.w_p if d == "fwd" and self.kp else empty, *prod]

    def forward(self, x: Tensor, edge_index: Tensor, level: Tensor | None = None,
                batch: Tensor | None = None, plan: LevelPlan | None = None,
                **kwargs) -> Tensor:
        # All of it on one intra-op thread: besides the level sweeps, the
        # per-graph MLPs are [N, C] with small C, where OpenMP's fork/join
        # costs more than it saves (0.08 s vs 0.7 s per step on c7552 with
        # the other core busy).
        with one_intraop_thread():
            return self._forward(x, edge_index, level, batch, plan)

    def _forward(self, x, edge_index, level, batch, plan) -> Tensor:
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
            # from x itself, whose values a dry run keeps (the encoder's
            # dtype would hand it a tensor without values)
            fixed = [self.cut_estimate(x, edge_index, plan).to(onehot)] \
                if self.cop_input and self.estimator != "cop" else []
            out = cell_sweep(self.cells["fwd"], plan.forward,
                             [s, self.x_proj["fwd"](inp), onehot, deg_in, *fixed],
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
        if self.cop_input:
            # the estimate plus a learned correction; the estimate's own
            # weight stays 1 (a trainable one drifted to fit the training
            # circuits' errors and shifted every unseen circuit)
            w = self.skip.weight * self.skip_mask
            corr = out + F.linear(torch.cat(skip, 1), w, self.skip.bias)
            if self.center_correction:
                corr = corr - self._graph_mean(corr, batch)
            return prob[:, :1] + self.correction_gain * corr
        if skip:
            out = out + self.skip(torch.cat(skip, 1))
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, "
                f"{self.hidden_channels}, {self.out_channels}, "
                f"num_layers={self.num_layers}, aggr={self.aggr}, "
                f"reverse={self.reverse}, rounds={self.rounds})")
