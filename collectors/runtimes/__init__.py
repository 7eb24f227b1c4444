"""Language runtimes' own allocator layers, read out of a live process."""
