"""Quality metrics for node regression and classification.

The correlation family (Pearson, Spearman, Kendall) is the one the GSR-GNN
paper reports for circuit tasks; MAE and R² complete the regression picture and
accuracy serves the classification task. Rank statistics come from
:mod:`scipy.stats` so ties are handled the standard way.

Every metric of an empty set (no node to score, e.g. a validation split whose
mask selects nothing) is ``None``: it has no value, and ``None`` is what JSON
can hold. Degenerate but non-empty inputs (constant vectors) give ``0.0``.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

__all__ = [
    "pearson",
    "spearman",
    "kendall",
    "mae",
    "r2",
    "accuracy",
    "regression_metrics",
    "classification_metrics",
    "compute_metrics",
    "load_backends",
]


def load_backends() -> None:
    """Import what the rank metrics need, ahead of time.

    :mod:`scipy.stats` adds about 60 MiB of resident memory when first
    imported (measured): imported inside the first validation pass, a
    training run's peak meter counted it as the model's memory.
    """
    import scipy.stats  # noqa: F401


def _np(x: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _finite(v: float) -> float:
    # Correlations of a constant vector are undefined; report 0 rather than NaN
    # so JSON stays valid and early stopping still compares numbers.
    return float(v) if math.isfinite(v) else 0.0


def pearson(pred, target) -> float | None:
    """Pearson linear correlation coefficient."""
    p, t = _np(pred), _np(target)
    if not p.size:
        return None
    if p.size < 2 or p.std() == 0 or t.std() == 0:
        return 0.0
    return _finite(np.corrcoef(p, t)[0, 1])


def spearman(pred, target) -> float | None:
    """Spearman rank correlation (:func:`scipy.stats.spearmanr`)."""
    from scipy.stats import spearmanr

    p, t = _np(pred), _np(target)
    if not p.size:
        return None
    if p.size < 2 or p.std() == 0 or t.std() == 0:
        return 0.0
    return _finite(spearmanr(p, t).statistic)


def kendall(pred, target) -> float | None:
    """Kendall tau-b rank correlation (:func:`scipy.stats.kendalltau`)."""
    from scipy.stats import kendalltau

    p, t = _np(pred), _np(target)
    if not p.size:
        return None
    if p.size < 2 or p.std() == 0 or t.std() == 0:
        return 0.0
    return _finite(kendalltau(p, t).statistic)


def mae(pred, target) -> float | None:
    """Mean absolute error."""
    p, t = _np(pred), _np(target)
    return float(np.abs(p - t).mean()) if p.size else None


def r2(pred, target) -> float | None:
    """Coefficient of determination R² = 1 - SS_res / SS_tot."""
    p, t = _np(pred), _np(target)
    if not t.size:
        return None
    ss_tot = float(((t - t.mean()) ** 2).sum())
    if ss_tot == 0.0:
        return 0.0
    return 1.0 - float(((t - p) ** 2).sum()) / ss_tot


def accuracy(pred, target) -> float | None:
    """Classification accuracy; ``pred`` holds logits ``[N, C]`` or labels ``[N]``."""
    if isinstance(pred, Tensor) and pred.dim() == 2:
        pred = pred.argmax(dim=-1)
    p = _np(pred).round().astype(np.int64)
    t = _np(target).round().astype(np.int64)
    return float((p == t).mean()) if p.size else None


def regression_metrics(pred, target) -> dict[str, float | None]:
    """All regression metrics as a dict (pearson, spearman, kendall, mae, r2)."""
    return {
        "pearson": pearson(pred, target),
        "spearman": spearman(pred, target),
        "kendall": kendall(pred, target),
        "mae": mae(pred, target),
        "r2": r2(pred, target),
    }


def classification_metrics(logits: Tensor,
                           target: Tensor) -> dict[str, float | None]:
    """Accuracy plus the correlation family on the predicted class index."""
    labels = logits.argmax(dim=-1) if logits.dim() == 2 else logits
    out = {"accuracy": accuracy(labels, target)}
    out.update(regression_metrics(labels, target))
    return out


def compute_metrics(pred: Tensor, target: Tensor,
                    task_type: str) -> dict[str, float | None]:
    """Metrics for ``task_type`` in ``{"regression", "classification"}``."""
    if task_type == "classification":
        return classification_metrics(pred, target)
    if task_type == "regression":
        return regression_metrics(pred.reshape(-1), target.reshape(-1))
    raise ValueError(f"task_type must be 'regression' or 'classification', "
                     f"got {task_type!r}")
