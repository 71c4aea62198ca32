"""Planning: what a configuration needs (memory, time) before anything runs.

``leangnn.plan`` is callable: ``leangnn.plan(model, data,
memory_budget="4GiB")`` plans a user's PyG model (:func:`leangnn.plan.user.plan`)
and returns the :class:`~leangnn.plan.planner.PlanTable`. The names of
:data:`__all__` load on first use (see :class:`leangnn._PlanModule`): the
planner needs the configuration and data layers, which import this
package's quick fit check (:mod:`leangnn.plan.fits`), so nothing here may
import the planner when the package loads. Nor torch: ``import leangnn``
stays light, so the ``leangnn`` command re-executes itself in the compact
heap (:mod:`leangnn.heap`) before it has paid for torch.
"""

__all__ = ["plan_model", "fit", "PlanRow", "PlanTable", "plan_config", "choose",
           "format_table", "candidates", "resolve_budget", "plan_summary",
           "Estimate", "estimate_config", "estimate_model", "Calibration",
           "load_calibration", "check_fits", "available_bytes",
           "full_batch_vertex_bytes", "layer_widths"]
