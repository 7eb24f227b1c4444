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
"""

import importlib

_MODULES = {
    "glibc": "collectors.allocators.glibc",
    "jemalloc": "collectors.allocators.jemalloc",
    "tcmalloc": "collectors.allocators.gperftools",
    "tcmalloc-google": "collectors.allocators.google_tcmalloc",
    "mimalloc": "collectors.allocators.mimalloc",
}


def module(kind):
    """The module for allocator KIND, or None for one without a stats interface."""
    name = _MODULES.get(kind)
    return importlib.import_module(name) if name else None
