"""The allocator objects (collectors.allocators.registry), for the TUI,
which asks diag and never imports collectors."""

from collectors.allocators.registry import for_kind

__all__ = ["for_kind"]
