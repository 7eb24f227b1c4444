"""One module per allocator: plan, gather, parse and normalise, and the
table of every native field it reports (collectors.schema).

Each module exposes ``KINDS`` (allocator kinds it serves), ``FIELDS`` (its
native fields, collectors.schema.NativeField) and the four steps:

``plan(resolver, obj, allocator, opts) -> addrs``
    Resolve every address before any thread is stopped (raises Unsupported).
``gather(call, addrs, opts) -> raw``
    Make the calls; ``call`` is a remote ``Call`` from
    ``RemoteProcess.borrow()`` or an in-process ``collectors.engine.inproc.InProcess``
    (same interface: ``.call(addr, *args)``, ``.read``, ``.write``,
    ``.scratch(n)``, ``.cstring``).  Copies raw bytes/integers out only.
``parse(raw, allocator) -> native``
    Runs after the thread is released.
``normalise(native) -> {field: Value}``
    The normalised layer of diag.fields.

and ``parse_file(data) -> native`` for ``allocdiag inspect --from FILE``.

The rest of what the code knows about an allocator (detection, release,
knobs, heap profiler, counters, the findings' words) is its object in
``collectors.allocators.registry`` (interface: collectors.allocators.interface).
"""

from __future__ import annotations

from types import ModuleType


def module(kind: str | None) -> ModuleType | None:
    """The stats reader module for allocator KIND, or None for one without a stats interface."""
    from collectors.allocators.registry import for_kind
    return for_kind(kind).stats()
