"""The sampler: the allocation wall of a live process from perf_event_open
(DESIGN.md "sampling"; reference/cpu-wall.md), in pure Python over ctypes.

- ``perf``: perf_event_attr, the syscall, ioctls, the mmapped ring and its drain;
- ``records``: the decoder of ring records (SAMPLE, SWITCH, LOST);
- ``attribution``: "inside the allocator" for an unwound stack, call sites, names;
- ``session``: per-thread events, the drain loop, aggregation into diag.model.wall;
- ``counters``: the allocator's own counters at the window's ends, as deltas.

No ptrace stop for sampling, no BPF, no perf binary.  Logger: ``collectors.sampler``
(the window's start and end, events opened or refused and why, lost records).
"""
