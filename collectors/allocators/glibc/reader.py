"""glibc ptmalloc2: plan, gather, parse and normalise; the native fields.

Native document::

    {"malloc_info": {...} | None,   # collectors.allocators.glibc.stats.parse_malloc_info
     "mallinfo2": {10 fields},      # from malloc_info (exact), or called
     "mallinfo2_from": "malloc_info" | "mallinfo2",
     "version": "2.36" | None,
     "error": str | None}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.model import Value

from collectors import lazylog
from collectors.allocators.glibc import stats as glibc_stats
from collectors.allocators import common
from collectors.allocators.native import BYTES, COUNT, FLAG, NativeField, TEXT

log = lazylog.getLogger("collectors.allocators")

_MI = "glibc malloc/malloc.c __malloc_info"
_M2 = "glibc malloc/malloc.c int_mallinfo / __libc_mallinfo2"

# struct mallinfo2 (malloc/malloc.h), in order; meaning per int_mallinfo.
MALLINFO2 = (
    ("arena", BYTES, "non-mmapped space allocated from the system (sum of system_mem)"),
    ("ordblks", COUNT, "free chunks: each arena's top chunk plus chunks in regular bins"),
    ("smblks", COUNT, "free fastbin chunks"),
    ("hblks", COUNT, "mmapped chunks (mp_.n_mmaps)"),
    ("hblkhd", BYTES, "bytes in mmapped chunks (mp_.mmapped_mem)"),
    ("usmblks", BYTES, "always 0"),
    ("fsmblks", BYTES, "bytes in free fastbin chunks"),
    ("uordblks", BYTES, "bytes in chunks in use in the arenas (tcache chunks count as in use)"),
    ("fordblks", BYTES, "free bytes in the arenas (top + bins + fastbins)"),
    ("keepcost", BYTES, "size of the main arena's top chunk (releasable by malloc_trim)"),
)

# The struct's order is the parser's (glibc_stats.MALLINFO2_FIELDS).
assert tuple(n for n, _, _ in MALLINFO2) == glibc_stats.MALLINFO2_FIELDS

_ROW = (("from", BYTES, "smallest chunk size in this bin (regular bins include the PREV_INUSE bit)"),
        ("to", BYTES, "largest chunk size in this bin"),
        ("total", BYTES, "bytes of free chunks in this bin"),
        ("count", COUNT, "free chunks in this bin"),
        ("kind", TEXT, "fast | bin | unsorted (classified by allocdiag)"),
        ("flag_bytes", BYTES, "PREV_INUSE bits counted in total by chunksize_nomask(): removed by allocdiag"))
_COUNT_SIZE = (("count", COUNT, "chunks"), ("size", BYTES, "bytes"))

FIELDS = (
    NativeField("malloc_info.version", TEXT, "malloc_info format version (not glibc's)", _MI),
    NativeField("malloc_info.has_fast", FLAG, "the output has fastbin totals (glibc <= 2.42)", _MI),
    NativeField("malloc_info.arenas.*.nr", COUNT, "arena number (0 = main arena)", _MI),
    NativeField("malloc_info.arenas.*.unsorted", TEXT, "none when the unsorted bin is empty", _MI),
    NativeField("malloc_info.arenas.*.sizes", TEXT, "empty when no bin holds a free chunk", _MI),
    NativeField("malloc_info.arenas.*.fast", TEXT, "none without fastbins", _MI),
    NativeField("malloc_info.arenas.*.flag_bytes", BYTES,
                "PREV_INUSE bits included in this arena's rest.size", "allocdiag"),
    NativeField("malloc_info.arenas.*.free_bytes", BYTES,
                "free bytes in this arena: fast.size + rest.size - flag_bytes (int_mallinfo avail)",
                "allocdiag, from " + _MI),
    NativeField("malloc_info.arenas.*.top_bytes", BYTES,
                "size of this arena's top chunk: rest.size - the regular-bin totals",
                "allocdiag, from " + _MI),
    NativeField("malloc_info.arenas.*.system.current", BYTES,
                "system_mem: bytes obtained from the system", _MI),
    NativeField("malloc_info.arenas.*.system.max", BYTES, "max_system_mem: high-water mark", _MI),
    NativeField("malloc_info.arenas.*.aspace.total", BYTES, "address space of the arena's heaps", _MI),
    NativeField("malloc_info.arenas.*.aspace.mprotect", BYTES,
                "bytes made read-write (mprotect) in the heaps", _MI),
    NativeField("malloc_info.arenas.*.aspace.subheaps", COUNT, "heaps of this non-main arena", _MI),
    NativeField("malloc_info.totals.fast", TEXT, "none without fastbins", _MI),
    NativeField("malloc_info.totals.flag_bytes", BYTES, "PREV_INUSE bits included in rest.size", "allocdiag"),
    NativeField("malloc_info.totals.system.current", BYTES, "sum of system_mem over arenas", _MI),
    NativeField("malloc_info.totals.system.max", BYTES, "sum of max_system_mem over arenas", _MI),
    NativeField("malloc_info.totals.aspace.total", BYTES, "address space of all arenas", _MI),
    NativeField("malloc_info.totals.aspace.mprotect", BYTES, "read-write bytes of all arenas", _MI),
    NativeField("malloc_info", TEXT, "none when malloc_info was not available", _MI),
    NativeField("mallinfo2_from", TEXT, "malloc_info (fields derived exactly from the XML) or "
                "mallinfo2 (called)", "allocdiag"),
    NativeField("version", TEXT, "glibc version (gnu_get_libc_version)", "glibc"),
    NativeField("error", TEXT, "why malloc_info detail is missing", "allocdiag"),
    NativeField("heap_resident.bytes", BYTES, "present pages of [heap] and the arena heaps, "
                "the zero page left out (smaps Rss where pagemap cannot tell it apart: "
                "stats.resident's source says which)", "/proc/PID/pagemap or /proc/PID/smaps"),
    NativeField("heap_resident.arena_heaps", COUNT, "arena heaps found in the mappings",
                "/proc/PID/maps or /proc/PID/smaps"),
    NativeField("heap_resident.mmapped_chunks.count", COUNT, "mmapped chunks found by their "
                "headers (prev_size, size | IS_MMAPPED)", "/proc/PID/mem"),
    NativeField("heap_resident.mmapped_chunks.bytes", BYTES, "bytes of the mmapped chunks found",
                "/proc/PID/mem"),
    NativeField("heap_resident.mmapped_chunks.resident", BYTES, "present pages of the mmapped "
                "chunks found", "/proc/PID/pagemap"),
) + tuple(NativeField(f"malloc_info.arenas.*.{where}.*.{k}" if where == "sizes" else
                      f"malloc_info.arenas.*.{where}.{k}", u, m, _MI)
          for where in ("sizes", "unsorted") for k, u, m in _ROW) + tuple(
    NativeField(f"{where}.{k}", u, f"{what}: {m}", _MI)
    for where, what in (("malloc_info.arenas.*.fast", "free fastbin chunks"),
                        ("malloc_info.arenas.*.rest", "top chunk + free chunks in regular bins"),
                        ("malloc_info.totals.fast", "free fastbin chunks, all arenas"),
                        ("malloc_info.totals.rest", "top chunks + regular bins, all arenas"),
                        ("malloc_info.totals.mmap", "mmapped chunks (mp_.n_mmaps, mp_.mmapped_mem)"))
    for k, u, m in _COUNT_SIZE) + tuple(
    NativeField("mallinfo2." + n, u, m, _M2) for n, u, m in MALLINFO2)


# -- plan, gather, parse, normalise -------------------------------------------------

# Upper bound of malloc_info's output per arena (__malloc_info): a <heap>
# header and footer, and at most one <size> row per fastbin and per regular
# bin (NFASTBINS 10 + NBINS-1 127), each row at most 42 characters of
# markup plus four 20-digit numbers.
MI_ROW_MAX = 42 + 4 * 20
MI_BINS_MAX = 10 + 127
MI_ARENA_MAX = MI_BINS_MAX * MI_ROW_MAX + 512
MI_TOTALS_MAX = 1024
HEAP_MAX_SIZE = 64 << 20      # arena.c: a non-main arena's heaps are aligned to this
# Size of the private mapping used when the bound exceeds SCRATCH_TEXT:
# untouched pages cost nothing, and one fixed size lets tests find leftovers.
LARGE_TEXT = 4 << 20


# Stack the gather's calls use below the engine's frame on the borrowed thread
# (collectors.engine.remote stack_need): the high-water mark measured by
# tests/targets/stack_need.c (pattern-filled 1 MiB stack, the larger of two calls,
# Debian 12 packages; tests/test_stack_bounds.py re-measures and checks it):
#   fmemopen 3,303 B (first call: lazy binding), malloc_info 14,887 B (vfprintf),
#   fclose 512 B, mallinfo2 3,303 B.
STACK_NEED = 20 * 1024


def output_bound(narenas: Any) -> Any:
    return MI_TOTALS_MAX + narenas * MI_ARENA_MAX


def count_arenas(maps: Any) -> Any:
    """Upper bound of the number of arenas: the main arena plus one per
    HEAP_MAX_SIZE-aligned anonymous mapping (every non-main arena has at
    least one heap, and each heap starts so aligned; counting others too
    only makes the bound larger)."""
    heaps = sum(1 for m in maps if m.path is None and m.start % HEAP_MAX_SIZE == 0)
    return 1 + heaps


def plan(res: Any, obj: Any, alloc: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """malloc_info into an fmemopen stream when it can; else mallinfo2.
    One heap walk either way (malloc_info carries every mallinfo2 field)."""
    a = {"malloc_info": res.address(obj, "malloc_info") if opts.get("glibc_xml", True) else None}
    stdio = {n: res.libc(n) for n in ("fmemopen", "setvbuf", "fclose")}
    if a["malloc_info"] and all(stdio.values()):
        a.update(stdio)
        a["bound"] = output_bound(count_arenas(res.maps()))
        log.debug("glibc: malloc_info into fmemopen, bound %d bytes", a["bound"])
    else:
        log.info("glibc: mallinfo2 (malloc_info %s, stdio %s)",
                  "off" if not opts.get("glibc_xml", True) else "found" if a["malloc_info"] else "missing",
                  "complete" if all(stdio.values()) else "missing")
        a["malloc_info"] = None
        a["mallinfo2"] = common.need(res.address(obj, "mallinfo2"), "mallinfo2", "glibc")
    return a


def gather(c: Any, a: Any, opts: Any) -> Any:
    if a["malloc_info"] is None:
        out = c.scratch(glibc_stats.MALLINFO2_SIZE)
        # struct mallinfo2 is returned in memory: the hidden pointer is rdi.
        c.call(a["mallinfo2"], out)
        return {"mallinfo2": c.read(out, glibc_stats.MALLINFO2_SIZE)}
    raw: dict[str, Any] = {}
    # The XML goes into a Call.buffer: below the scratch on the borrowed
    # thread's stack when its room holds it, else an anonymous mapping,
    # unmapped before the thread is released.
    size = common.SCRATCH_TEXT if a["bound"] <= common.SCRATCH_TEXT else \
        max(LARGE_TEXT, a["bound"])
    raw["buffers"] = []
    _malloc_info(c, a, size, raw)
    if raw.get("truncated"):
        # An arena the maps did not show (created meanwhile): once more,
        # into a buffer with room for four times as many.
        _malloc_info(c, a, 4 * max(LARGE_TEXT, a["bound"]), raw)
    return raw


def _malloc_info(c, a, size, raw):
    """malloc_info into a SIZE-byte Call.buffer; where that buffer was
    (mapped or on the stack) is kept for the side effects (parse)."""
    buf = c.buffer(size)
    raw["buffers"].append((size, c.mapped(buf)))
    f = common.fmemopen(c, a, buf, size)
    raw["rc"] = c.call(a["malloc_info"], 0, f) & common.INT_RETURN
    c.call(a["fclose"], f)
    raw["xml"], terminated = common.text_at(c, buf, size, first=common.SCRATCH_TEXT // 3)
    raw["truncated"] = not terminated or len(raw["xml"]) >= size - 1
    raw["size"] = size


def parse(raw: Any, alloc: Any) -> Any:
    native: dict[str, Any] = {"malloc_info": None, "mallinfo2": None, "mallinfo2_from": None,
              "version": getattr(alloc, "version", None), "error": None, "side_effects": []}
    if "mallinfo2" in raw:
        native["mallinfo2"] = glibc_stats.parse_mallinfo2(raw["mallinfo2"])
        native["mallinfo2_from"] = "mallinfo2"
        native["gathered_by"] = "mallinfo2"
        return native
    native["gathered_by"] = "malloc_info"
    native["side_effects"].append("fmemopen: one FILE (~500 bytes) malloc'd and freed in the "
                                  "calling thread's arena")
    for size, mapped in raw.get("buffers", ()):
        if mapped is None:
            continue            # allocdiag's own memory (self mode): no one else's
        native["side_effects"].append(
            f"a {size}-byte anonymous mapping for the XML, unmapped before the thread was "
            "released" if mapped else
            f"the XML written into a {size}-byte buffer on the borrowed thread's own stack, "
            "below its stack pointer (no mapping made; stack pages it reached that the "
            "thread had not used stay resident)")
    if raw["rc"] != 0:
        native["error"] = f"malloc_info returned {raw['rc']}"
    elif raw["truncated"]:
        native["error"] = (f"malloc_info output did not fit {raw['size']} bytes (an arena "
                           "created during the call?); no allocator numbers this time")
    else:
        native["malloc_info"] = glibc_stats.parse_malloc_info(raw["xml"])
        native["mallinfo2"] = glibc_stats.mallinfo2_from_malloc_info(native["malloc_info"])
        native["mallinfo2_from"] = "malloc_info"
    return native


def normalise(native: dict[str, Any]) -> dict[str, Value]:
    if native.get("mallinfo2_from") == "mallinfo2":
        return glibc_stats.normalise_glibc(None, native["mallinfo2"])
    return glibc_stats.normalise_glibc(native.get("malloc_info"))


def parse_file(data: bytes) -> dict[str, Any]:
    """A saved ``malloc_info`` XML document -> the native document."""
    info = glibc_stats.parse_malloc_info(data)
    return {"malloc_info": info, "mallinfo2": glibc_stats.mallinfo2_from_malloc_info(info),
            "mallinfo2_from": "malloc_info", "version": None, "error": None,
            "side_effects": [], "gathered_by": "file: malloc_info XML"}


def complete(image: Any, native: dict[str, Any], stats: dict[str, Value]) -> None:
    """Fill ``resident`` when the calls left it unknown: the heaps' present
    pages plus the present pages of the mmapped chunks (heapmaps.resident)."""
    from collectors.allocators.glibc import heapmaps
    if stats.get("resident") is not None and stats["resident"].value is None:
        heapmaps.resident(image, native, stats)


def looks_like(head: bytes) -> bool:
    """HEAD (the start of a file, leading space stripped) is malloc_info XML."""
    return head.startswith(b"<?xml") or head.startswith(b"<malloc")
