"""The native document's schema: every field each allocator reports, once.

``snapshot.native`` holds an allocator's own numbers under its own names
(DESIGN.md "Output contracts").  Each allocator module in
``collectors.allocators`` declares the fields of its document in one table
(``FIELDS``): a tuple of :class:`NativeField` whose ``name`` is the path of
the field inside the native document, written as a dotted string whose
parts are the dict keys in order.  Two wildcards keep the table short:

* ``*`` stands for a list index (``malloc_info.arenas.*.system.current``);
* ``?`` stands for any one dict key whose name is data, not schema
  (mimalloc's stats rows, tcmalloc's GetStats summary slugs).  An exact
  entry always wins over a wildcard one.

Keys that contain dots themselves (jemalloc's mallctl names, tcmalloc's
property names) are written with the owning dict's name and a ``:``:
``mallctl:stats.allocated`` is the path ``("mallctl", "stats.allocated")``.

Views take units from :func:`lookup` (``PAGES`` fields shown as pages and as
bytes with :func:`page_size`; ``BYTES`` fields as bytes) instead of guessing
from key names.
"""


# NativeField and the units live in a leaf module the readers import
from collectors.allocators.native import COUNT, RATIO, TEXT, UNITS, NativeField



def __getattr__(name):
    """``KINDS``: the allocator kinds with a stats reader, from the registry
    (looked up late: the readers import this module for NativeField)."""
    if name == "KINDS":
        from collectors.allocators import registry
        return tuple(a.kind for a in registry.ALL if a.stats() is not None)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Keys every kind's document may carry that describe the collection, not the
# allocator (added by livestats / selfstats / diag.snapshot).
COMMON_FIELDS = (
    NativeField("side_effects", TEXT, "list of side effects; empty when the calls only read",
                "allocdiag"),
    NativeField("side_effects.*", TEXT, "what the stats calls did to the target beyond reading "
                "(an allocation, a mapping), in words", "allocdiag"),
    NativeField("gathered_by", TEXT, "how the numbers were read: the allocator function(s) "
                "called, or the file format parsed", "allocdiag"),
    NativeField("collect_s", RATIO, "seconds the live collection took (stop included)",
                "allocdiag"),
    NativeField("path", TEXT, "the object that serves malloc", "allocdiag (self mode)"),
    NativeField("borrowed_thread.tid", COUNT, "thread stopped for the calls", "allocdiag"),
    NativeField("borrowed_thread.kind", TEXT, "idle (parked in a wait) or running", "allocdiag"),
    NativeField("borrowed_thread.syscall", TEXT, "the wait the thread was parked in", "allocdiag"),
    NativeField("config.?", TEXT, "configuration sources read without stopping the target "
                "(each allocator's home: collectors.allocators)", "allocdiag"),
    NativeField("config.?.?", TEXT, "one configuration source's text", "allocdiag"),
    NativeField("knobs.?.?", TEXT, "a knob's current value, its source and how to change it "
                "(diag.knobs)", "allocdiag"),
)

# Fields of the collection, not of the allocator: left out when comparing
# what live, self and file mode produce (tests/test_livestats.py).
CONTEXT_KEYS = frozenset(("side_effects", "gathered_by", "collect_s", "path", "borrowed_thread",
                          "config", "knobs", "heap_resident", "mimalloc_walk"))


def split(name):
    """A table name -> the path tuple it matches."""
    if ":" in name:
        head, key = name.split(":", 1)
        return tuple(head.split(".")) + (key,) if head else (key,)
    return tuple(name.split("."))


class Table:
    """One allocator's fields, indexed for lookup."""

    def __init__(self, fields):
        self.exact, self.patterns = {}, []
        for f in tuple(fields) + COMMON_FIELDS:
            if f.unit not in UNITS:
                raise ValueError(f"{f.name}: unknown unit {f.unit!r}")
            path = split(f.name)
            if path in self.exact or any(p == path for p, _ in self.patterns):
                raise ValueError(f"{f.name}: declared twice")
            if "?" in path:
                self.patterns.append((path, f))
            else:
                self.exact[path] = f

    def lookup(self, path):
        f = self.exact.get(path)
        if f is not None:
            return f
        best = None
        for pat, f in self.patterns:
            if len(pat) == len(path) and all(p == "?" or p == k for p, k in zip(pat, path)):
                score = sum(p != "?" for p in pat)      # most specific wins
                if best is None or score > best[0]:
                    best = (score, f)
        return best[1] if best else None


_tables: dict[str, Table] = {}


def _module(kind):
    from collectors import allocators
    return allocators.module(kind)


def table(kind):
    if kind not in _tables:
        mod = _module(kind)
        if mod is None:
            return None
        _tables[kind] = Table(mod.FIELDS)
    return _tables[kind]


def lookup(kind, path):
    """The NativeField at PATH (tuple of keys; list indices as "*") of KIND's
    native document, or None when the schema does not declare it."""
    t = table(kind)
    if t is None:
        return None
    return t.lookup(tuple(str(p) for p in path))


def fields(kind):
    """Every NativeField declared for KIND (its own table, then the common keys)."""
    mod = _module(kind)
    return tuple(mod.FIELDS) + COMMON_FIELDS if mod else ()


def page_size(kind, native):
    """Bytes per page for KIND's PAGES fields, read from NATIVE (jemalloc
    ``arenas.page``), or None when the document does not say."""
    mod = _module(kind)
    fn = getattr(mod, "page_size", None) if mod else None
    return fn(native or {}) if fn else None


def paths(value, prefix=()):
    """Every leaf path of a native document (list indices as "*"), for
    checking a document against the schema.  A None or empty container is a
    leaf: the key is present, its value unknown."""
    out = set()
    if isinstance(value, dict) and value:
        for k, v in value.items():
            out |= paths(v, prefix + (str(k),))
    elif isinstance(value, list) and value:
        for v in value:
            out |= paths(v, prefix + ("*",))
    else:
        out.add(prefix)
    return out
