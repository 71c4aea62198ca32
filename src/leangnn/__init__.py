"""leangnn: train graph neural networks that are too deep or too large for memory.

The planner's Python API is here, importing nothing until it is called::

    import leangnn

    print(leangnn.plan(model, data, memory_budget="4GiB"))   # the table
    leangnn.fit(model, data, loss_fn, strategy="auto", memory_budget="4GiB",
                epochs=100)                                 # trains the pick

``leangnn.plan`` is the planning subpackage and callable at once (its
module class is :class:`_PlanModule`): calling it is
:func:`leangnn.plan.user.plan`, and its attributes (``plan_config``,
``choose``, ``PlanTable``, ...) load on first use. The class lives here, in
the root package, because the root is imported before any submodule: the
planner imports the configuration and data layers, which import the quick
fit check of ``leangnn.plan.fits``, so ``leangnn.plan`` itself must not
import the planner (that would be an import cycle).
"""

from __future__ import annotations

import importlib
import types

__version__ = "0.1.0"
__all__ = ["plan", "fit", "__version__"]

#: public name -> submodule of ``leangnn.plan`` defining it (loaded on use)
_PLAN_EXPORTS = {
    "plan_model": "user", "fit": "user",
    "PlanRow": "planner", "PlanTable": "planner", "plan_config": "planner",
    "choose": "planner", "format_table": "planner", "candidates": "planner",
    "resolve_budget": "planner", "plan_summary": "planner",
    "Estimate": "estimate", "estimate_config": "estimate",
    "estimate_model": "estimate",
    "Calibration": "calibration", "load_calibration": "calibration",
    "check_fits": "fits", "available_bytes": "fits",
    "full_batch_vertex_bytes": "vertex", "layer_widths": "vertex",
}


class _PlanModule(types.ModuleType):
    """``leangnn.plan``: a module that is also :func:`leangnn.plan.user.plan`."""

    def __call__(self, model, data, memory_budget=None, **kwargs):
        """Plan training ``model`` on ``data`` under ``memory_budget``; see
        :func:`leangnn.plan.user.plan`. Returns the :class:`PlanTable`."""
        from leangnn.plan.user import plan

        return plan(model, data, memory_budget, **kwargs)

    def __getattr__(self, name: str):
        sub = _PLAN_EXPORTS.get(name)
        if sub is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute "
                                 f"{name!r}")
        attr = "plan" if name == "plan_model" else name
        value = getattr(importlib.import_module(f"leangnn.plan.{sub}"), attr)
        setattr(self, name, value)
        return value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_PLAN_EXPORTS))


def fit(model, data, loss_fn=None, strategy: str = "auto", memory_budget=None,
        epochs: int = 100, **kwargs):
    """Train ``model`` on ``data`` through the strategy the planner picks for
    ``memory_budget`` (default: the device's free memory); see
    :func:`leangnn.plan.user.fit`. Returns ``{"plan", "row", "strategy",
    "losses"}``."""
    from leangnn.plan.user import fit as _fit

    return _fit(model, data, loss_fn, strategy=strategy,
                memory_budget=memory_budget, epochs=epochs, **kwargs)


from leangnn import plan  # noqa: E402  (the subpackage, made callable below)

plan.__class__ = _PlanModule
