"""Planning: what a configuration needs (memory, time) before anything runs."""

__all__: list[str] = []
