"""Planning: what a configuration needs (memory, time) before anything runs."""

from leangnn.plan.vertex import full_batch_vertex_bytes, layer_widths

__all__ = ["full_batch_vertex_bytes", "layer_widths"]
