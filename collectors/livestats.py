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

from collectors import glibc_stats, jemalloc_stats, mimalloc_stats, tcmalloc_stats
from collectors.errors import AllocdiagError, RemoteCallError, Unsupported
from collectors.remote import RemoteProcess

LiveStats = namedtuple("LiveStats", "kind native stats pause_us thread")

SCRATCH_TEXT = 48 * 1024      # bytes of scratch for text/XML outputs
_IONBF = 2                    # stdio.h

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


def collect(image, detection, *, deadline_s=2.0, call_timeout_s=1.0, glibc_xml=True,
            per_arena=False, procfs=None):
    """LiveStats for the allocator that serves malloc in IMAGE.

    Raises Unsupported for an allocator with no stats interface (Go runtime,
    musl, unknown), RemoteCallError / Quarantined / AccessDenied /
    NoSuchProcess from the engine.
    """
    kind = detection.allocator.kind
    serving = detection.serving
    fn = _COLLECTORS.get(kind)
    if fn is None:
        raise Unsupported(f"no live stats for a {kind} allocator "
                          f"({'its heap is not malloc' if kind == 'go' else 'no stats interface'})",
                          pid=image.pid)
    res = Resolver(image)
    rp = RemoteProcess(image.pid, forbidden_ranges=forbidden_ranges(image, detection),
                       deadline_s=deadline_s, call_timeout_s=call_timeout_s,
                       procfs=(procfs or image.procfs.root))
    t0 = time.perf_counter()
    with rp.borrow() as c:
        native = fn(c, res, serving, detection.allocator, glibc_xml=glibc_xml, per_arena=per_arena)
        thread = {"tid": c.tid, "kind": c.kind, "syscall": c.syscall}
    native["collect_s"] = round(time.perf_counter() - t0, 6)
    stats = _normalise(kind, native)
    return LiveStats(kind, native, stats, list(rp.pause_us), thread)


def _need(addr, name, kind):
    if addr is None:
        raise Unsupported(f"{kind}: symbol {name} not found (stripped build?)")
    return addr


def _fmemopen(c, res, size):
    """(FILE*, buffer address) of an unbuffered fmemopen stream over SIZE
    bytes of scratch.  Caller must fclose."""
    buf = c.scratch(size)
    mode = c.scratch(16)
    c.write(mode, b"w\0")
    f = c.call(_need(res.libc("fmemopen"), "fmemopen", "libc"), buf, size, mode)
    if f == 0:
        raise RemoteCallError("fmemopen failed in the target")
    c.call(_need(res.libc("setvbuf"), "setvbuf", "libc"), f, 0, _IONBF, 0)
    return f, buf


# -- glibc --------------------------------------------------------------------

def _glibc(c, res, obj, alloc, glibc_xml=True, **_):
    mi_addr = _need(res.address(obj, "mallinfo2"), "mallinfo2", "glibc")
    out = c.scratch(glibc_stats.MALLINFO2_SIZE)
    # struct mallinfo2 is returned in memory: the hidden pointer is rdi.
    c.call(mi_addr, out)
    native = {"mallinfo2": glibc_stats.parse_mallinfo2(c.read(out, glibc_stats.MALLINFO2_SIZE))}
    if glibc_xml:
        f, buf = _fmemopen(c, res, SCRATCH_TEXT)
        rc = c.call(_need(res.address(obj, "malloc_info"), "malloc_info", "glibc"), 0, f)
        c.call(_need(res.libc("fclose"), "fclose", "libc"), f)
        xml = c.cstring(buf, SCRATCH_TEXT)
        native["side_effects"] = ["fmemopen: one FILE (~500 bytes) malloc'd and freed in the "
                                  "borrowed thread's arena"]
        if rc != 0 or len(xml) >= SCRATCH_TEXT - 1:
            native["malloc_info_error"] = (f"malloc_info output did not fit {SCRATCH_TEXT} bytes "
                                           "of scratch (many arenas); per-arena detail omitted"
                                           if rc == 0 else f"malloc_info returned {rc}")
        else:
            native["malloc_info"] = glibc_stats.parse_malloc_info(xml)
    return native


# -- jemalloc -------------------------------------------------------------------

_CTYPES = {"size_t": "<Q", "uint64": "<Q", "ssize_t": "<q", "unsigned": "<I", "bool": "<?",
           "const char*": "<Q"}


def _mallctl_read(c, mallctl, name, ctype, scratch):
    fmt = _CTYPES[ctype]
    size = struct.calcsize(fmt)
    name_b = name.encode() + b"\0"
    name_at, old, lenp = scratch
    c.write(name_at, name_b)
    c.write(lenp, struct.pack("<Q", size))
    c.write(old, b"\0" * 8)
    rc = c.call(mallctl, name_at, old, lenp, 0, 0) & 0xFFFFFFFF
    if rc != 0:
        return None          # ENOENT: not in this version/build
    value = struct.unpack(fmt, c.read(old, size))[0]
    if ctype == "const char*":
        return c.cstring(value, 4096).decode(errors="replace") if value else None
    return value


def _jemalloc(c, res, obj, alloc, per_arena=False, **_):
    prefix = alloc.prefix or ""
    mallctl = _need(res.address(obj, prefix + "mallctl"), prefix + "mallctl", "jemalloc")
    scratch = (c.scratch(256), c.scratch(16), c.scratch(16))
    # Refresh the cached stats: write to "epoch".
    epoch_name, epoch_val, lenp = c.scratch(16), c.scratch(16), c.scratch(16)
    c.write(epoch_name, b"epoch\0")
    c.write(epoch_val, struct.pack("<Q", 1))
    c.write(lenp, struct.pack("<Q", 8))
    c.call(mallctl, epoch_name, epoch_val, lenp, epoch_val, 8)
    values = {}
    for name, ctype in jemalloc_stats.STATS_MALLCTLS.items():
        if name == "epoch":
            continue
        v = _mallctl_read(c, mallctl, name, ctype, scratch)
        if v is not None:
            values[name] = v
    for name, ctype in (("opt.tcache", "bool"), ("opt.percpu_arena", "const char*"),
                        ("opt.prof", "bool"), ("config.malloc_conf", "const char*"),
                        ("config.prof", "bool"), ("opt.lg_tcache_max", "size_t"),
                        ("opt.tcache_max", "size_t")):
        v = _mallctl_read(c, mallctl, name, ctype, scratch)
        if v is not None:
            values[name] = v
    native = {"mallctl": values, "prefix": prefix}
    if per_arena and values.get("arenas.narenas"):
        rows = []
        for i in range(int(values["arenas.narenas"])):
            row = {"arena": i}
            for field in ("pactive", "pdirty", "pmuzzy", "dirty_decay_ms", "muzzy_decay_ms",
                          "nthreads"):
                ctype = "unsigned" if field == "nthreads" else \
                    ("ssize_t" if field.endswith("_ms") else "size_t")
                row[field] = _mallctl_read(c, mallctl, f"stats.arenas.{i}.{field}", ctype, scratch)
            rows.append(row)
        native["arenas"] = rows
    return native


# -- tcmalloc ---------------------------------------------------------------------

def _tcmalloc(c, res, obj, alloc, **_):
    get = _need(res.address(obj, "MallocExtension_GetNumericProperty"),
                "MallocExtension_GetNumericProperty", "tcmalloc")
    name_at, value_at = c.scratch(128), c.scratch(16)
    props = {}
    for name in tcmalloc_stats.GPERFTOOLS_PROPERTIES:
        c.write(name_at, name.encode() + b"\0")
        c.write(value_at, b"\0" * 8)
        if c.call(get, name_at, value_at) & 0xFF:
            props[name] = struct.unpack("<Q", c.read(value_at, 8))[0]
    native = {"properties": props}
    stats_fn = res.address(obj, "MallocExtension_GetStats")
    if stats_fn is not None:
        buf = c.scratch(SCRATCH_TEXT)
        c.write(buf, b"\0")
        c.call(stats_fn, buf, SCRATCH_TEXT)
        text = c.cstring(buf, SCRATCH_TEXT).decode(errors="replace")
        try:
            native["getstats"] = tcmalloc_stats.parse_getstats(text)
        except AllocdiagError as exc:
            native["getstats_error"] = str(exc)
    return native


def _tcmalloc_google(c, res, obj, alloc, **_):
    get = _need(res.address(obj, "MallocExtension_Internal_GetNumericProperty"),
                "MallocExtension_Internal_GetNumericProperty", "tcmalloc-google")
    name_at, value_at = c.scratch(128), c.scratch(16)
    props = {}
    for name in tcmalloc_stats.GOOGLE_TCMALLOC_PROPERTIES:
        raw = name.encode()
        c.write(name_at, raw + b"\0")
        c.write(value_at, b"\0" * 8)
        # Note the length argument (name_data, name_size, value).
        if c.call(get, name_at, len(raw), value_at) & 0xFF:
            props[name] = struct.unpack("<Q", c.read(value_at, 8))[0]
    native = {"properties": props}
    stats_fn = res.address(obj, "TCMalloc_Internal_GetStats")
    if stats_fn is not None:
        buf = c.scratch(SCRATCH_TEXT)
        c.write(buf, b"\0")
        c.call(stats_fn, buf, SCRATCH_TEXT)
        native["getstats_text"] = c.cstring(buf, SCRATCH_TEXT).decode(errors="replace")
    return native


# -- mimalloc ------------------------------------------------------------------------

def _mimalloc(c, res, obj, alloc, **_):
    native = {}
    info = res.address(obj, "mi_process_info")
    if info is not None and getattr(c, "max_args", 6) >= 8:
        outs = [c.scratch(8) for _ in mimalloc_stats.PROCESS_INFO_FIELDS]
        for o in outs:
            c.write(o, b"\0" * 8)
        c.call(info, *outs)
        native["process_info"] = mimalloc_stats.process_info_dict(
            [struct.unpack("<Q", c.read(o, 8))[0] for o in outs])
    opt_get = res.address(obj, "mi_option_get")
    version = alloc.version or ""
    if opt_get is not None and version.startswith("2.0"):
        native["options"] = {name: _signed(c.call(opt_get, i))
                             for i, name in enumerate(MIMALLOC_OPTIONS_2_0)}
    json_fn = res.address(obj, "mi_stats_get_json")
    if json_fn is not None:
        ptr = c.call(json_fn, 0, 0)
        if ptr:
            text = c.cstring(ptr, 1 << 20).decode(errors="replace")
            free_fn = res.address(obj, "mi_free")
            if free_fn:
                c.call(free_fn, ptr)
            native["stats_json"] = mimalloc_stats.parse_stats_json(text)
            return native
    printer = res.address(obj, "mi_stats_print_out")
    if printer is not None:
        f, buf = _fmemopen(c, res, SCRATCH_TEXT)
        c.call(printer, _need(res.libc("fputs"), "fputs", "libc"), f)
        c.call(_need(res.libc("fclose"), "fclose", "libc"), f)
        text = c.cstring(buf, SCRATCH_TEXT).decode(errors="replace")
        native["side_effects"] = ["fmemopen: one FILE malloc'd and freed (by mimalloc)"]
        try:
            native["stats_text"] = mimalloc_stats.parse_stats_text(text)
        except AllocdiagError as exc:
            native["stats_text_error"] = str(exc)
    return native


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


_COLLECTORS = {"glibc": _glibc, "jemalloc": _jemalloc, "tcmalloc": _tcmalloc,
               "tcmalloc-google": _tcmalloc_google, "mimalloc": _mimalloc}


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
