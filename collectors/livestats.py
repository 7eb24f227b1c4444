"""Live allocator stats: the allocator's own functions, called inside the
target on one borrowed thread (collectors.remote), parsed by the per-allocator
modules into ``native`` (the allocator's own names) and ``stats`` (the
normalised layer of diag.fields, each a Value with provenance).

Addresses come from the ELF collector: load bias from maps + ``st_value``
from .dynsym (or .symtab for static and prefixed builds).  Every call below
is a read: nothing here changes allocator behaviour (DESIGN.md rule 7).

What each allocator costs the target, per snapshot (one stop):
- glibc: ``mallinfo2`` (no allocation), then ``malloc_info`` into a
  ``fmemopen`` stream over scratch stack memory, unbuffered.  ``fmemopen``
  mallocs its FILE (about 500 bytes, freed by ``fclose``): reported in
  ``native["side_effects"]``.  ``mallinfo2`` alone with ``glibc_xml=False``.
- jemalloc: ``mallctl("epoch")`` then one ``mallctl`` read per name; no
  allocation.
- gperftools: ``MallocExtension_GetNumericProperty`` per property and
  ``MallocExtension_GetStats`` into scratch; no allocation.
- mimalloc: ``mi_process_info``, ``mi_option_get`` per option, and
  ``mi_stats_print_out(fputs, FILE*)`` through an ``fmemopen`` stream (the
  FILE is malloc'd by mimalloc itself); ``mi_stats_get_json`` where the
  version has it.
"""

import os
import struct
import time
from collections import namedtuple

from collectors import glibc_stats, heapmaps, jemalloc_stats, mimalloc_stats, remote, tcmalloc_stats
from collectors.errors import AllocdiagError, RemoteCallError, Unsupported
from collectors.remote import RemoteProcess
from diag.model import Value

LiveStats = namedtuple("LiveStats", "kind native stats pause_us thread")

SCRATCH_TEXT = 48 * 1024      # bytes of scratch for text/XML outputs
# A stats call that has not returned by then is abandoned: the thread is
# restored and the process quarantined.  Generous on purpose: under arena
# contention glibc's mallinfo2 took up to 1.3 s in-process on a saturated
# 2-core box, and abandoning a call that holds an allocator lock would leave
# it held.  A timeout is for a call that is truly stuck.
CALL_TIMEOUT_S = 5.0
_IONBF = 2                    # stdio.h
LARGE_TEXT = 4 << 20          # malloc_info of hundreds of arenas
_PROT_READ, _PROT_WRITE = 1, 2
_MAP_PRIVATE, _MAP_ANONYMOUS = 0x02, 0x20

# mimalloc 2.0.x option enum (include/mimalloc.h of 2.0.9, Debian's
# libmimalloc-dev); index = mi_option_t value.  2.1+ renamed the purge
# options, so names are only trusted for the version they were read from.
MIMALLOC_OPTIONS_2_0 = (
    "show_errors", "show_stats", "verbose", "eager_commit", "deprecated_eager_region_commit",
    "deprecated_reset_decommits", "large_os_pages", "reserve_huge_os_pages",
    "reserve_huge_os_pages_at", "reserve_os_memory", "deprecated_segment_cache", "page_reset",
    "abandoned_page_decommit", "deprecated_segment_reset", "eager_commit_delay",
    "decommit_delay", "use_numa_nodes", "limit_os_alloc", "os_tag", "max_errors",
    "max_warnings", "max_segment_reclaim", "allow_decommit", "segment_decommit_delay",
    "decommit_extend_delay", "destroy_on_exit",
)


class Resolver:
    """Absolute addresses of functions in the loaded objects of an image."""

    def __init__(self, image):
        self.image = image

    def address(self, obj, name):
        if obj is None or obj.elf is None or obj.bias is None:
            return None
        sym = obj.elf.lookup(name, obj.opener.open)
        if sym is None or not sym.defined:
            return None
        return obj.bias + sym.st_value

    def libc(self, name):
        """NAME from the C library (glibc or musl) mapped in the process."""
        for obj in self.image.objects:
            if obj.elf is not None and obj.elf.defines(name) and (
                    obj.elf.soname or "").startswith(("libc.so", "libc.musl")):
                return obj.bias + obj.elf.dynamic(name).st_value
        # Static executables carry their libc inside.
        return self.address(self.image.exe, name)


JEMALLOC_PUBLIC = frozenset((
    "aligned_alloc", "calloc", "dallocx", "free", "mallctl", "mallctlbymib", "mallctlnametomib",
    "malloc", "malloc_stats_print", "malloc_usable_size", "mallocx", "memalign", "nallocx",
    "posix_memalign", "rallocx", "realloc", "sallocx", "sdallocx", "valloc", "xallocx"))


def _is_anchor(kind, prefix, name):
    """Global functions that certainly belong to the allocator's code."""
    if kind == "jemalloc":
        return name.startswith("je_") or (name.startswith(prefix or "") and
                                          name[len(prefix or ""):] in JEMALLOC_PUBLIC)
    if kind == "mimalloc":
        return name.startswith(("mi_", "_mi_"))
    if kind in ("tcmalloc", "tcmalloc-google"):
        return name.startswith(("tc_", "MallocExtension", "TCMalloc")) or "tcmalloc" in name
    return False


def static_allocator_ranges(obj, kind, prefix):
    """Code ranges of an allocator linked into the executable OBJ.

    The linker lays each archive member's code out contiguously, but GCC
    splits it between .text, .text.unlikely (cold blocks) and .text.startup,
    so the allocator's code forms a few clusters.  Walking the functions in
    address order, a cluster is a maximal run that starts and ends with an
    anchor (a global function certainly the allocator's: its public API
    and, for jemalloc, the je_ private namespace) and contains no foreign
    global function (such as main); static functions inside a run are the
    allocator's.  None when .symtab is missing (stripped): the caller then
    forbids the whole text."""
    symtab = obj.elf.symtab(obj.opener.open) if obj.elf is not None else {}
    funcs = sorted((s for s in symtab.values() if s.type in (2, 10) and s.st_value),
                   key=lambda s: s.st_value)
    if obj.bias is None or sum(1 for s in funcs if _is_anchor(kind, prefix, s.name)) < 3:
        return None
    out = []
    start = end = None
    for s in funcs:
        if _is_anchor(kind, prefix, s.name):
            if start is None:
                start = s.st_value
            end = max(end or 0, s.st_value + max(s.st_size, 1))
        elif s.bind != 0 and start is not None:      # a foreign global ends the run
            out.append((obj.bias + start, obj.bias + end, f"{kind} (static)"))
            start = end = None
    if start is not None:
        out.append((obj.bias + start, obj.bias + end, f"{kind} (static)"))
    return out


def forbidden_ranges(image, detection):
    """Executable ranges a borrowed thread must not be inside (PC) nor have
    return addresses in (near its stack top): the C library and the loader
    (glibc's internal malloc code lies outside its exported symbols), and
    the allocator's code.  For an allocator linked into the executable that
    is its own span (static_allocator_ranges), else the executable's whole
    text (then only threads parked in an idle wait from outside the
    executable qualify: conservative)."""
    names = ("libc.so", "libc.musl", "ld-linux", "ld-musl", "libpthread")
    serving = detection.serving
    out = []
    for obj in image.objects:
        base = os.path.basename(obj.path)
        whole = any(n in base for n in names)
        if obj is serving:
            if obj is image.exe:
                alloc = detection.allocator
                spans = static_allocator_ranges(obj, alloc.kind, alloc.prefix)
                if spans is not None:
                    out.extend(spans)
                    continue
            whole = True
        if whole:
            for m in image.maps:
                if m.path == obj.path and "x" in m.perms:
                    out.append((m.start, m.end, base))
    return out


def collect(image, detection, *, deadline_s=2.0, call_timeout_s=CALL_TIMEOUT_S, glibc_xml=True,
            per_arena=False, procfs=None):
    """LiveStats for the allocator that serves malloc in IMAGE.

    Three steps, so the target thread is stopped only for the middle one:
    ``plan`` resolves every address from the ELF collector (raises
    Unsupported when a symbol is missing), ``gather`` makes the calls and
    copies raw bytes and integers out, ``parse`` turns them into ``native``
    after the thread runs again.

    Raises Unsupported for an allocator with no stats interface (Go runtime,
    musl, unknown), RemoteCallError / Quarantined / AccessDenied /
    NoSuchProcess from the engine.
    """
    kind = detection.allocator.kind
    impl = _COLLECTORS.get(kind)
    if impl is None:
        raise Unsupported(f"no live stats for a {kind} allocator "
                          f"({'its heap is not malloc' if kind == 'go' else 'no stats interface'})",
                          pid=image.pid)
    plan, gather, parse = impl
    opts = {"glibc_xml": glibc_xml, "per_arena": per_arena}
    addrs = plan(Resolver(image), detection.serving, detection.allocator, opts)
    rp = RemoteProcess(image.pid, forbidden_ranges=forbidden_ranges(image, detection),
                       deadline_s=deadline_s, call_timeout_s=call_timeout_s,
                       procfs=(procfs or image.procfs.root))
    t0 = time.perf_counter()
    with rp.borrow() as c:
        raw = gather(c, addrs, opts)
        thread = {"tid": c.tid, "kind": c.kind, "syscall": c.syscall}
    collect_s = time.perf_counter() - t0
    native = parse(raw, detection.allocator)
    native["collect_s"] = round(collect_s, 6)
    stats = _normalise(kind, native)
    if kind == "glibc" and stats.get("resident", Value()).value is None:
        res, heaps = heapmaps.glibc_heap_resident(image.procfs, image.pid)
        if res is not None:
            native["heap_resident"] = {"bytes": res, "arena_heaps": heaps}
            stats["resident"] = Value.derived(
                res, "smaps Rss of [heap] + the 64 MiB-aligned arena heaps (mmapped chunks "
                     "not attributed: a lower bound)")
    return LiveStats(kind, native, stats, list(rp.pause_us), thread)


def _need(addr, name, kind):
    if addr is None:
        raise Unsupported(f"{kind}: symbol {name} not found (stripped build?)")
    return addr


def _libc_stdio(res):
    return {n: _need(res.libc(n), n, "libc") for n in ("fmemopen", "setvbuf", "fclose", "fputs")}


def _fmemopen(c, addrs, size):
    """(FILE*, buffer address) of an unbuffered fmemopen stream over SIZE
    bytes of scratch.  Caller must fclose."""
    buf = c.scratch(size)
    mode = c.scratch(16)
    c.write(mode, b"w\0")
    f = c.call(addrs["fmemopen"], buf, size, mode)
    if f == 0:
        raise RemoteCallError("fmemopen failed in the target")
    c.call(addrs["setvbuf"], f, 0, _IONBF, 0)
    return f, buf


# -- glibc --------------------------------------------------------------------

def _glibc_plan(res, obj, alloc, opts):
    a = {"mallinfo2": _need(res.address(obj, "mallinfo2"), "mallinfo2", "glibc")}
    if opts["glibc_xml"]:
        a["malloc_info"] = _need(res.address(obj, "malloc_info"), "malloc_info", "glibc")
        a.update(_libc_stdio(res))
        a["mmap"], a["munmap"] = res.libc("mmap"), res.libc("munmap")
    return a


def _glibc_gather(c, a, opts):
    out = c.scratch(glibc_stats.MALLINFO2_SIZE)
    # struct mallinfo2 is returned in memory: the hidden pointer is rdi.
    c.call(a["mallinfo2"], out)
    raw = {"mallinfo2": c.read(out, glibc_stats.MALLINFO2_SIZE)}
    if "malloc_info" in a:
        f, buf = _fmemopen(c, a, SCRATCH_TEXT)
        raw["malloc_info_rc"] = c.call(a["malloc_info"], 0, f) & 0xFFFFFFFF
        c.call(a["fclose"], f)
        raw["malloc_info"] = c.cstring(buf, SCRATCH_TEXT)
        if len(raw["malloc_info"]) >= SCRATCH_TEXT - 1 and a["mmap"] and a["munmap"]:
            # Many arenas: too big for the stack scratch.  Retry into a
            # private anonymous mapping (not malloc: no allocator side
            # effect), unmapped again before the thread is released.
            raw["malloc_info"] = _malloc_info_mmap(c, a, raw)
    return raw


def _malloc_info_mmap(c, a, raw):
    size = LARGE_TEXT
    mem = c.call(a["mmap"], 0, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS,
                 (1 << 64) - 1, 0)
    if mem >= (1 << 64) - 4096 or mem == 0:        # MAP_FAILED
        return raw["malloc_info"]
    try:
        mode = c.scratch(16)
        c.write(mode, b"w\0")
        f = c.call(a["fmemopen"], mem, size, mode)
        if f == 0:
            return raw["malloc_info"]
        c.call(a["setvbuf"], f, 0, _IONBF, 0)
        raw["malloc_info_rc"] = c.call(a["malloc_info"], 0, f) & 0xFFFFFFFF
        c.call(a["fclose"], f)
        raw["malloc_info_mmap"] = size
        return c.cstring(mem, size)
    finally:
        c.call(a["munmap"], mem, size)


def _glibc_parse(raw, alloc):
    native = {"mallinfo2": glibc_stats.parse_mallinfo2(raw["mallinfo2"])}
    if "malloc_info" in raw:
        xml, rc = raw["malloc_info"], raw["malloc_info_rc"]
        native["side_effects"] = ["fmemopen: one FILE (~500 bytes) malloc'd and freed in the "
                                  "borrowed thread's arena"]
        if "malloc_info_mmap" in raw:
            native["side_effects"].append(f"a {raw['malloc_info_mmap']}-byte anonymous mapping "
                                          "for the XML, unmapped before the thread was released")
        if rc != 0:
            native["malloc_info_error"] = f"malloc_info returned {rc}"
        elif len(xml) >= raw.get("malloc_info_mmap", SCRATCH_TEXT) - 1:
            native["malloc_info_error"] = (f"malloc_info output did not fit "
                                           f"{raw.get('malloc_info_mmap', SCRATCH_TEXT)} bytes; "
                                           "per-arena detail omitted")
        else:
            native["malloc_info"] = glibc_stats.parse_malloc_info(xml)
    return native


# -- jemalloc -------------------------------------------------------------------

_CTYPES = {"size_t": "<Q", "uint64": "<Q", "ssize_t": "<q", "unsigned": "<I", "bool": "<?",
           "const char*": "<Q"}
JEMALLOC_EXTRA = (("opt.tcache", "bool"), ("opt.percpu_arena", "const char*"),
                  ("opt.prof", "bool"), ("config.malloc_conf", "const char*"),
                  ("config.prof", "bool"), ("opt.lg_tcache_max", "size_t"),
                  ("opt.tcache_max", "size_t"))
JEMALLOC_ARENA_FIELDS = (("pactive", "size_t"), ("pdirty", "size_t"), ("pmuzzy", "size_t"),
                         ("dirty_decay_ms", "ssize_t"), ("muzzy_decay_ms", "ssize_t"),
                         ("nthreads", "unsigned"))


def _jemalloc_plan(res, obj, alloc, opts):
    name = (alloc.prefix or "") + "mallctl"
    image = res.image
    # (pid, start time): a key a recycled pid cannot match.
    key = (image.pid, remote._starttime(image.pid, image.procfs.root), obj.path)
    return {"mallctl": _need(res.address(obj, name), name, "jemalloc"), "process_key": key}


def _mallctl_read(c, mallctl, name, ctype, scratch):
    """One mallctl read; returns the raw value (a pointer for strings) or
    None when the name does not exist in this version/build."""
    fmt = _CTYPES[ctype]
    size = struct.calcsize(fmt)
    name_at, old, lenp = scratch
    c.write(name_at, name.encode() + b"\0")
    c.write(lenp, struct.pack("<Q", size))
    c.write(old, b"\0" * 8)
    if c.call(mallctl, name_at, old, lenp, 0, 0) & 0xFFFFFFFF:
        return None
    value = struct.unpack(fmt, c.read(old, size))[0]
    if ctype == "const char*":
        return c.cstring(value, 4096) if value else None
    return value


# mallctls whose value is fixed once jemalloc initialised: read once per
# process (keyed by pid and start time), not on every snapshot.  Fewer calls
# is a shorter stop: each call is one run of the borrowed thread.
_JEMALLOC_CONSTANT = ("version", "config.", "opt.", "arenas.page")
_constant_cache = {}


def _jemalloc_gather(c, a, opts):
    mallctl = a["mallctl"]
    cache = _constant_cache.setdefault(a["process_key"], {}) if a.get("process_key") else {}
    scratch = (c.scratch(256), c.scratch(16), c.scratch(16))
    # Refresh the cached stats: write to "epoch".
    name_at, val, lenp = scratch
    c.write(name_at, b"epoch\0")
    c.write(val, struct.pack("<Q", 1))
    c.write(lenp, struct.pack("<Q", 8))
    c.call(mallctl, name_at, val, lenp, val, 8)
    values = dict(cache)
    wanted = [(n, t) for n, t in jemalloc_stats.STATS_MALLCTLS.items() if n != "epoch"]
    for name, ctype in wanted + list(JEMALLOC_EXTRA):
        constant = name.startswith(_JEMALLOC_CONSTANT)
        if constant and cache.get("_complete"):
            continue
        v = _mallctl_read(c, mallctl, name, ctype, scratch)
        if v is not None:
            values[name] = v
            if constant:
                cache[name] = v
    cache["_complete"] = True
    values.pop("_complete", None)
    raw = {"mallctl": values}
    if opts["per_arena"] and values.get("arenas.narenas"):
        raw["arenas"] = [
            {"arena": i, **{f: _mallctl_read(c, mallctl, f"stats.arenas.{i}.{f}", t, scratch)
                            for f, t in JEMALLOC_ARENA_FIELDS}}
            for i in range(int(values["arenas.narenas"]))]
    return raw


def _jemalloc_parse(raw, alloc):
    values = {k: (v.decode(errors="replace") if isinstance(v, bytes) else v)
              for k, v in raw["mallctl"].items()}
    native = {"mallctl": values, "prefix": alloc.prefix or ""}
    if "arenas" in raw:
        native["arenas"] = raw["arenas"]
    return native


# -- tcmalloc ---------------------------------------------------------------------

# Both tcmalloc flavours: (numeric-property getter, stats-text function,
# property names, whether the getter takes the name's length).
_TC_FLAVOURS = {
    "tcmalloc": ("MallocExtension_GetNumericProperty", "MallocExtension_GetStats",
                 tcmalloc_stats.GPERFTOOLS_PROPERTIES, False),
    "tcmalloc-google": ("MallocExtension_Internal_GetNumericProperty", "TCMalloc_Internal_GetStats",
                        tcmalloc_stats.GOOGLE_TCMALLOC_PROPERTIES, True),
}


def _tcmalloc_plan(res, obj, alloc, opts):
    get, stats, props, with_length = _TC_FLAVOURS[alloc.kind]
    return {"get": _need(res.address(obj, get), get, alloc.kind), "stats": res.address(obj, stats),
            "props": props, "with_length": with_length}


def _properties(c, get, names, with_length):
    name_at, value_at = c.scratch(128), c.scratch(16)
    props = {}
    for name in names:
        raw = name.encode()
        c.write(name_at, raw + b"\0")
        c.write(value_at, b"\0" * 8)
        # google/tcmalloc's entry point takes the name's length too.
        ok = c.call(get, name_at, len(raw), value_at) if with_length else c.call(get, name_at, value_at)
        if ok & 0xFF:
            props[name] = struct.unpack("<Q", c.read(value_at, 8))[0]
    return props


def _stats_text(c, fn):
    buf = c.scratch(SCRATCH_TEXT)
    c.write(buf, b"\0")
    c.call(fn, buf, SCRATCH_TEXT)
    return c.cstring(buf, SCRATCH_TEXT)


def _tcmalloc_gather(c, a, opts):
    raw = {"properties": _properties(c, a["get"], a["props"], a["with_length"])}
    if a["stats"]:
        raw["getstats"] = _stats_text(c, a["stats"])
    return raw


def _tcmalloc_parse(raw, alloc):
    native = {"properties": raw["properties"]}
    if "getstats" in raw:
        text = raw["getstats"].decode(errors="replace")
        if alloc.kind == "tcmalloc-google":
            native["getstats_text"] = text      # its own format; kept verbatim
            return native
        try:
            native["getstats"] = tcmalloc_stats.parse_getstats(text)
        except AllocdiagError as exc:
            native["getstats_error"] = str(exc)
    return native


# -- mimalloc ------------------------------------------------------------------------

def _mimalloc_plan(res, obj, alloc, opts):
    a = {n: res.address(obj, n) for n in ("mi_process_info", "mi_option_get", "mi_stats_get_json",
                                          "mi_free", "mi_stats_print_out")}
    if not (a["mi_stats_get_json"] or a["mi_stats_print_out"]):
        raise Unsupported("mimalloc: neither mi_stats_get_json nor mi_stats_print_out found")
    if a["mi_stats_print_out"]:
        a.update(_libc_stdio(res))
    a["options"] = MIMALLOC_OPTIONS_2_0 if (alloc.version or "").startswith("2.0") else ()
    return a


def _mimalloc_gather(c, a, opts):
    raw = {}
    if a["mi_process_info"] and getattr(c, "max_args", 6) >= 8:
        outs = [c.scratch(8) for _ in mimalloc_stats.PROCESS_INFO_FIELDS]
        for o in outs:
            c.write(o, b"\0" * 8)
        c.call(a["mi_process_info"], *outs)
        raw["process_info"] = [struct.unpack("<Q", c.read(o, 8))[0] for o in outs]
    if a["mi_option_get"] and a["options"]:
        raw["options"] = [c.call(a["mi_option_get"], i) for i in range(len(a["options"]))]
    if a["mi_stats_get_json"]:
        ptr = c.call(a["mi_stats_get_json"], 0, 0)
        if ptr:
            raw["stats_json"] = c.cstring(ptr, 1 << 20)
            if a["mi_free"]:
                c.call(a["mi_free"], ptr)
            return raw
    f, buf = _fmemopen(c, a, SCRATCH_TEXT)
    c.call(a["mi_stats_print_out"], a["fputs"], f)
    c.call(a["fclose"], f)
    raw["stats_text"] = c.cstring(buf, SCRATCH_TEXT)
    return raw


def _mimalloc_parse(raw, alloc):
    native = {}
    if "process_info" in raw:
        native["process_info"] = mimalloc_stats.process_info_dict(raw["process_info"])
    if "options" in raw:
        native["options"] = {name: _signed(v) for name, v in zip(MIMALLOC_OPTIONS_2_0, raw["options"])}
    if "stats_json" in raw:
        native["stats_json"] = mimalloc_stats.parse_stats_json(raw["stats_json"].decode(errors="replace"))
    if "stats_text" in raw:
        native["side_effects"] = ["fmemopen: one FILE malloc'd and freed (by mimalloc)"]
        try:
            native["stats_text"] = mimalloc_stats.parse_stats_text(raw["stats_text"].decode(errors="replace"))
        except AllocdiagError as exc:
            native["stats_text_error"] = str(exc)
    return native


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


_COLLECTORS = {
    "glibc": (_glibc_plan, _glibc_gather, _glibc_parse),
    "jemalloc": (_jemalloc_plan, _jemalloc_gather, _jemalloc_parse),
    "tcmalloc": (_tcmalloc_plan, _tcmalloc_gather, _tcmalloc_parse),
    "tcmalloc-google": (_tcmalloc_plan, _tcmalloc_gather, _tcmalloc_parse),
    "mimalloc": (_mimalloc_plan, _mimalloc_gather, _mimalloc_parse),
}


def _normalise(kind, native):
    if kind == "glibc":
        return glibc_stats.normalise_glibc(native.get("malloc_info"), native.get("mallinfo2"))
    if kind == "jemalloc":
        return jemalloc_stats.normalise_jemalloc(native["mallctl"])
    if kind in ("tcmalloc", "tcmalloc-google"):
        return tcmalloc_stats.normalise_tcmalloc(native.get("properties"), native.get("getstats"),
                                                 flavor="google" if kind == "tcmalloc-google"
                                                 else "gperftools")
    if kind == "mimalloc":
        return mimalloc_stats.normalise_mimalloc(native.get("stats_json") or native.get("stats_text"),
                                                 native.get("process_info"))
    return {}
