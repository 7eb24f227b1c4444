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


from diag.model.records import replace
from collectors.allocators.registry import for_kind

DEFAULT = "compiled default"
# what a default is called when the process's environment cannot be read
# (native["config"]["env_unreadable"]): a variable there would not show
DEFAULT_ENV_UNREADABLE = "compiled default, unless set in the environment (not readable)"


def knobs(kind, native):
    """{name: Knob} for allocator KIND from NATIVE (its knob reader lives in
    the allocator's home: collectors/allocators/<name>/knobs.py)."""
    k = for_kind(kind).knobs
    out = k.read(native) if k is not None else {}
    if ((native or {}).get("config") or {}).get("env_unreadable"):
        out = {name: replace(knob, source=DEFAULT_ENV_UNREADABLE)
               if knob.source == DEFAULT else knob for name, knob in out.items()}
    return out
