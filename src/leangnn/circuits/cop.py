r"""COP signal probabilities: the analytic baseline of the ``signal_prob`` task.

COP (Controllability/Observability Program; Brglez, "On testability analysis
of combinational networks", ISCAS 1984; Parker and McCluskey, "Probabilistic
treatment of general combinational networks", IEEE TC 1975) propagates the
probability that a net is 1 from the inputs in topological order, assuming
the fanins of every gate are independent:

* ``and``: :math:`\prod p_i`, ``nand``: :math:`1 - \prod p_i`;
* ``or``: :math:`1 - \prod (1 - p_i)`, ``nor``: :math:`\prod (1 - p_i)`;
* ``xor``: :math:`(1 - \prod (1 - 2 p_i)) / 2`, ``xnor``: :math:`(1 + \prod
  (1 - 2 p_i)) / 2`;
* ``buf``: :math:`p`, ``not``: :math:`1 - p`; constants 0 and 1; primary and
  pseudo-primary inputs 0.5.

The result is exact on fanout-free (tree) circuits and drifts where
reconvergent fanout correlates a gate's inputs; that drift is what learned
models (DeepGate) are measured against. One gather and one
:func:`numpy.multiply.reduceat` per logic level, no per-node Python.
"""

from __future__ import annotations

import numpy as np

from .netlist import GATE_TYPES, TYPE_ID, Netlist
from .simulate import Levels, levelize

__all__ = ["cop_signal_probability", "cop_parameters"]

# Per gate type: how a fanin probability p enters the product (0: p,
# 1: 1 - p, 2: 1 - 2p), and how the product P becomes the output
# probability, as out = a + b * P.
_EDGE_MAP = np.zeros(len(GATE_TYPES), dtype=np.int64)
_OUT_A = np.zeros(len(GATE_TYPES))
_OUT_B = np.ones(len(GATE_TYPES))
for _name, (_edge, _a, _b) in {
    "buf": (0, 0.0, 1.0), "not": (0, 1.0, -1.0),
    "and": (0, 0.0, 1.0), "nand": (0, 1.0, -1.0),
    "or": (1, 1.0, -1.0), "nor": (1, 0.0, 1.0),
    "xor": (2, 0.5, -0.5), "xnor": (2, 0.5, 0.5),
}.items():
    _EDGE_MAP[TYPE_ID[_name]], _OUT_A[TYPE_ID[_name]] = _edge, _a
    _OUT_B[TYPE_ID[_name]] = _b


def cop_parameters() -> np.ndarray:
    """COP as ``p = a + b * prod(c + e * p_fanin)``: ``float64 [4, len(GATE_TYPES)]``
    rows ``a, b, c, e`` per gate type (sources: ``a`` is the probability)."""
    c = np.where(_EDGE_MAP == 0, 0.0, 1.0)
    e = np.choose(_EDGE_MAP, [1.0, -1.0, -2.0])
    a, b = _OUT_A.copy(), _OUT_B.copy()
    for name, value in (("input", 0.5), ("ppi", 0.5), ("const0", 0.0),
                        ("const1", 1.0)):
        a[TYPE_ID[name]], b[TYPE_ID[name]] = value, 0.0
    return np.stack([a, b, c, e])


def cop_signal_probability(net: Netlist, levels: Levels | None = None,
                           input_probability: float = 0.5) -> np.ndarray:
    """Probability that each node is 1, assuming independent gate inputs (COP).

    Args:
        net: the netlist; flip-flop outputs are inputs like primary inputs.
        levels (Levels, optional): reuse a
            :func:`~leangnn.circuits.simulate.levelize` result.
        input_probability (float, optional): probability of a 1 at primary
            and pseudo-primary inputs. (default: ``0.5``)

    Returns:
        ``float64 [N]`` probabilities. Gates without fanins evaluate to 0, as
        in :func:`~leangnn.circuits.simulate.signal_probability`.
    """
    if not 0.0 <= input_probability <= 1.0:
        raise ValueError(f"input_probability must be in [0, 1], got "
                         f"{input_probability!r}")
    lv = levels or levelize(net)
    types = net.types.astype(np.int64)
    prob = np.zeros(net.num_nodes)
    prob[np.isin(types, (TYPE_ID["input"], TYPE_ID["ppi"]))] = input_probability
    prob[types == TYPE_ID["const1"]] = 1.0
    if lv.ptr.size <= 2:
        return prob
    # Fanin lists of all gates above level 0, regrouped level by level
    # (nodes in ``lv.order``), built once with array ops.
    order = lv.order[lv.ptr[1]:]
    counts = net.fanin_ptr[order + 1] - net.fanin_ptr[order]
    starts = np.repeat(net.fanin_ptr[order] - np.cumsum(counts) + counts, counts)
    flat = net.fanin_idx[starts + np.arange(int(counts.sum()))]
    edge_map = np.repeat(_EDGE_MAP[types[order]], counts)
    node_ptr = lv.ptr[1:] - lv.ptr[1]
    edge_ptr = np.concatenate([[0], np.cumsum(counts)])[node_ptr]
    local = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for lvl in range(node_ptr.size - 1):
        n0, n1 = node_ptr[lvl], node_ptr[lvl + 1]
        e0, e1 = edge_ptr[lvl], edge_ptr[lvl + 1]
        p = prob[flat[e0:e1]]
        m = edge_map[e0:e1]
        vals = np.where(m == 0, p, np.where(m == 1, 1.0 - p, 1.0 - 2.0 * p))
        prod = np.multiply.reduceat(vals, local[n0:n1] - local[n0])
        nodes = order[n0:n1]
        t = types[nodes]
        prob[nodes] = _OUT_A[t] + _OUT_B[t] * prod
    return prob
