"""allocdiag: which allocator serves malloc in a running process, what it
holds, and which knob would give memory back."""

__version__ = "0.1.0"
