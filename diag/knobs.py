"""Each allocator knob's current value and where that value came from.

Pure functions of what a snapshot collected: ``native`` (live values read
from the allocator, when attached) and ``native["config"]`` (the
configuration sources read from /proc and memory, each allocator's knobs in its home).
Sources, in words the user will recognise: "compiled default",
"compiled-in conf (config.malloc_conf)", "global malloc_conf",
"/etc/malloc.conf", "env MALLOC_CONF", "changed at runtime".

A knob here is {name: Knob(name, current, source, how)}; findings copy it
and add ``suggested``.
"""

from collectors.allocators.registry import for_kind


def knobs(kind, native):
    """{name: Knob} for allocator KIND from NATIVE (its knob reader lives in
    the allocator's home: collectors/allocators/<name>/knobs.py)."""
    k = for_kind(kind).knobs
    return k.read(native) if k is not None else {}
