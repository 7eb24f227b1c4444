"""gperftools tcmalloc (full and minimal): plan, gather, parse and
normalise; the native fields.

Native document::

    {"properties": {name: int | None},   # exactly the names of PROPERTIES
     "getstats": {...} | None,           # collectors.allocators.tcmalloc_stats.parse_getstats
     "version": str | None,
     "variant": "minimal" | None}
"""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.model import Value

from collectors import lazylog
from collectors.allocators import tcmalloc_stats
from collectors.allocators import checked, common
from collectors.allocators.gperftools import decommit
from collectors.engine.memory import MemoryReader
from diag.model.errors import AllocdiagError
from collectors.allocators.native import BYTES, COUNT, FLAG, NativeField, TEXT

log = lazylog.getLogger("collectors.allocators")

_TC = "gperftools src/tcmalloc.cc GetNumericProperty"
_GS = "gperftools src/tcmalloc.cc DumpStats (MallocExtension_GetStats)"

# (property, unit, meaning).  Meanings from tcmalloc.cc's GetNumericProperty.
PROPERTIES = (
    ("generic.current_allocated_bytes", BYTES, "bytes in use by the application"),
    ("generic.heap_size", BYTES, "bytes the page heap got from the OS (includes unmapped)"),
    ("generic.total_physical_bytes", BYTES, "heap_size + metadata - unmapped (physical + swap)"),
    ("tcmalloc.pageheap_free_bytes", BYTES, "free, mapped page-heap spans"),
    ("tcmalloc.pageheap_unmapped_bytes", BYTES, "free spans released to the OS (madvise)"),
    ("tcmalloc.central_cache_free_bytes", BYTES, "bytes in the central cache freelists"),
    ("tcmalloc.transfer_cache_free_bytes", BYTES, "bytes in the transfer cache freelists"),
    ("tcmalloc.thread_cache_free_bytes", BYTES, "bytes in the per-thread cache freelists"),
    ("tcmalloc.current_total_thread_cache_bytes", BYTES, "bytes used by all thread caches"),
    ("tcmalloc.max_total_thread_cache_bytes", BYTES, "limit on the total thread cache size"),
    ("tcmalloc.slack_bytes", BYTES, "pageheap free + unmapped"),
    ("tcmalloc.aggressive_memory_decommit", FLAG, "TCMALLOC_AGGRESSIVE_DECOMMIT in effect"),
    ("tcmalloc.heap_limit_mb", COUNT, "heap size limit, MiB (0: none)"),
    ("tcmalloc.pageheap_committed_bytes", BYTES, "committed page-heap bytes"),
    ("tcmalloc.pageheap_scavenge_count", COUNT, "page heap scavenges"),
    ("tcmalloc.pageheap_commit_count", COUNT, "page heap commits"),
    ("tcmalloc.pageheap_total_commit_bytes", BYTES, "bytes committed, cumulative"),
    ("tcmalloc.pageheap_decommit_count", COUNT, "page heap decommits"),
    ("tcmalloc.pageheap_total_decommit_bytes", BYTES, "bytes decommitted, cumulative"),
    ("tcmalloc.pageheap_reserve_count", COUNT, "page heap reservations from the OS"),
    ("tcmalloc.pageheap_total_reserve_bytes", BYTES, "bytes reserved from the OS, cumulative"),
)

# GetStats summary slugs that are not bytes.
SUMMARY_NOT_BYTES = (
    ("spans_in_use", COUNT, "spans in use"),
    ("thread_heaps_in_use", COUNT, "per-thread heaps in use"),
)

FIELDS = tuple(NativeField("properties:" + n, u, m, _TC) for n, u, m in PROPERTIES) + (
    NativeField("getstats", TEXT, "none when MallocExtension_GetStats is not available", _GS),
    NativeField("getstats.flavor", TEXT, "gperftools | google (from the text)", "allocdiag"),
    NativeField("getstats.summary.?", BYTES, "a 'MALLOC:' line of the summary, by label", _GS),
    NativeField("getstats.labels.?", TEXT, "the label of a summary line as printed", _GS),
    NativeField("getstats.order.*", TEXT, "summary lines in printed order", _GS),
    NativeField("getstats.size_classes.*.class", COUNT, "size class number", _GS),
    NativeField("getstats.size_classes.*.size", BYTES, "object size of the class", _GS),
    NativeField("getstats.size_classes.*.objects", COUNT, "free objects in caches", _GS),
    NativeField("getstats.size_classes.*.bytes", BYTES, "objects x size", "allocdiag"),
    NativeField("getstats.pageheap", TEXT, "none when the level-2 page heap section is absent", _GS),
    NativeField("getstats.pageheap.sizes", COUNT, "span sizes with free spans", _GS),
    NativeField("getstats.pageheap.free_bytes", BYTES, "free page-heap bytes (printed in MiB, "
                "0.1 MiB resolution)", _GS),
    NativeField("getstats.pageheap.unmapped_bytes", BYTES, "unmapped page-heap bytes (printed in "
                "MiB, 0.1 MiB resolution)", _GS),
    NativeField("getstats.pageheap.spans.*.pages", TEXT, "span length in pages ('>255' for large)", _GS),
    NativeField("getstats.pageheap.spans.*.spans", COUNT, "free spans of that length", _GS),
    NativeField("getstats.pageheap.spans.*.bytes", BYTES, "their bytes (0.1 MiB resolution)", _GS),
    NativeField("getstats.pageheap.spans.*.unmapped_bytes", BYTES, "unmapped part (0.1 MiB "
                "resolution)", _GS),
    NativeField("version", TEXT, "tc_version()", "gperftools"),
    NativeField("variant", TEXT, "minimal for libtcmalloc_minimal", "library name"),
    NativeField("getstats_error", TEXT, "why the GetStats text did not parse", "allocdiag"),
) + tuple(NativeField("getstats.summary." + n, u, m, _GS) for n, u, m in SUMMARY_NOT_BYTES)


# -- plan, gather, parse, normalise -------------------------------------------------
#
# One MallocExtension_GetStats call per snapshot, plus a call per property
# GetStats does not print.  The printed ones are derived from its summary:
# DumpStats and GetNumericProperty read the same ExtractStats() numbers
# (gperftools 2.10 src/tcmalloc.cc), so the derivations are exact.
FROM_GETSTATS = {
    "generic.current_allocated_bytes": ("bytes_in_use_by_app",),
    "generic.heap_size": ("virtual_address_space_used", "-bytes_in_malloc_metadata"),
    "generic.total_physical_bytes": ("actual_memory_used",),
    "tcmalloc.pageheap_free_bytes": ("bytes_in_page_heap_freelist",),
    "tcmalloc.pageheap_unmapped_bytes": ("bytes_released_to_os",),
    "tcmalloc.central_cache_free_bytes": ("bytes_in_central_cache_freelist",),
    "tcmalloc.transfer_cache_free_bytes": ("bytes_in_transfer_cache_freelist",),
    "tcmalloc.thread_cache_free_bytes": ("bytes_in_thread_cache_freelists",),
    "tcmalloc.current_total_thread_cache_bytes": ("bytes_in_thread_cache_freelists",),
    "tcmalloc.slack_bytes": ("bytes_in_page_heap_freelist", "bytes_released_to_os"),
}
NOT_PRINTED = tuple(n for n, _, _ in PROPERTIES if n not in FROM_GETSTATS)
# Of those, the knobs (diag.knobs, diag.findings) are read on every snapshot;
# the cumulative page-heap counters and the heap limit only on request
# (opts["per_arena"], the CLI's --arenas "more detail" switch): each is one
# more call, ~0.1 ms of stop.  Not read, they are None (unknown).
EVERY_SNAPSHOT = ("tcmalloc.max_total_thread_cache_bytes", "tcmalloc.aggressive_memory_decommit")
# The first of them is a variable the library exports: GetNumericProperty
# answers tcmalloc::ThreadCache::overall_thread_cache_size() (src/tcmalloc.cc),
# which returns the static size_t overall_thread_cache_size_
# (src/thread_cache.h), in .dynsym of Debian's libtcmalloc.so.4 and
# libtcmalloc_minimal.so.4.  Read from memory inside the stop (one aligned
# 8-byte read: what the locked getter would return), it spares a call; a
# build that does not export it (static, hidden) is asked by the call.
THREAD_CACHE_LIMIT = "tcmalloc.max_total_thread_cache_bytes"
THREAD_CACHE_LIMIT_SYMBOL = "_ZN8tcmalloc11ThreadCache26overall_thread_cache_size_E"
SIZE_T = struct.Struct("<Q")
# The second is PageHeap::aggressive_decommit_, a bool the library does not
# export: its address is found in GetNumericProperty's code (decommit.py),
# checked once against the call in the same stop, and kept per library file
# (collectors.allocators.checked); from then on the byte is read before the
# stop, no call.  After DECOMMIT_DISAGREE_MAX disagreements it is dropped.
DECOMMIT = "tcmalloc.aggressive_memory_decommit"
DECOMMIT_PART = "gperftools-decommit-1"
DECOMMIT_DISAGREE_MAX = 3
DECOMMIT_AT = checked.CheckedAddresses(DECOMMIT_PART, DECOMMIT_DISAGREE_MAX)
DECOMMIT_FIELD = "PageHeap::aggressive_decommit_"
GETSTATS_BUF = common.SCRATCH_TEXT     # >= 10000: DumpStats level 2 (size classes, spans); Call.buffer
GETSTATS_READ_FIRST = 16 * 1024        # read first; later stops read what the last one printed


# Stack the gather's calls use below the engine's frame on the borrowed thread
# (collectors.engine.remote stack_need): the high-water mark measured by
# tests/targets/stack_need.c (pattern-filled 1 MiB stack, the larger of two calls,
# Debian 12 packages; tests/test_stack_bounds.py re-measures and checks it):
#   MallocExtension_GetStats(buf, 48 KiB) 6,887 B, GetNumericProperty 3,431 B.
STACK_NEED = 10 * 1024


# Within one allocdiag process (TUI, record) the knob properties are read
# again only every KNOBS_REFRESH_S; allocdiag's own `set` forgets them.
KNOBS_REFRESH_S = 10.0
# process key -> {property: value}, in memory and on disk (next CLI run)
_knobs = common.KeptValues(KNOBS_REFRESH_S, part="gperftools-knobs-1")
KEPT = (_knobs,)                     # common.before_stop / after_stop


def forget_knobs() -> Any:
    _knobs.clear()


def plan(res: Any, obj: Any, alloc: Any, opts: dict[str, Any]) -> dict[str, Any]:
    get = "MallocExtension_GetNumericProperty"
    a = {"get": common.need(res.address(obj, get), get, "tcmalloc"),
         "stats": res.address(obj, "MallocExtension_GetStats"),
         "limit_at": res.address(obj, THREAD_CACHE_LIMIT_SYMBOL),
         "process_key": res.process_key(obj)}
    if not a["stats"] or opts.get("tcmalloc_per_call"):
        a["props"] = tuple(n for n, _, _ in PROPERTIES)
    else:
        a["props"] = NOT_PRINTED if opts.get("per_arena") else EVERY_SNAPSHOT
    a["decommit_at"] = DECOMMIT_AT.address(obj, _find_decommit) if DECOMMIT in a["props"] \
        else None
    log.debug("gperftools: GetStats %s, %d numeric properties",
              "found" if a["stats"] else "missing", len(a["props"]))
    return a


def _find_decommit(obj: Any) -> tuple[int | None, str | None]:
    """(file virtual address of PageHeap::aggressive_decommit_, how it was found)."""
    return checked.find_in_code(
        obj, decommit.ENTRY,
        lambda code, entry, elf: decommit.locate(code, entry, checked.in_load(elf, checked.PF_W)),
        "movzbl in GetNumericProperty's aggressive_memory_decommit branch")


def prefetch(image: Any, a: Any) -> dict[str, Any]:
    """PageHeap::aggressive_decommit_, read before the stop once its address
    was checked ("decommit"), or before the check's stop ("decommit_before":
    a check whose byte moved meanwhile says nothing against the address).
    A knob changed only by SetNumericProperty: reading it inside the stop
    would buy no consistency."""
    ref = a.get("decommit_at")
    if image is None or not ref:
        return {}
    try:
        with MemoryReader(image.pid, image.procfs.root) as mem:
            got = mem.read(ref[0], 1)
    except AllocdiagError as exc:
        log.debug("gperftools: %s not read before the stop: %s", DECOMMIT_FIELD, exc)
        return {}
    return prefetched_decommit(DECOMMIT_AT.checked(ref), got[0]) if got else {}


# a C++ bool holds 0 or 1: any other byte is not aggressive_decommit_
BOOL_VALUES = (0, 1)


def prefetched_decommit(checked_address: bool, value: int) -> dict[str, int]:
    """What prefetch hands the gather for the byte VALUE read before the
    stop: the knob's value when its address was checked and it is a bool;
    else the byte to compare with the call ("decommit_before"), so the stop
    calls for the property and checks again (a byte that is no bool then
    counts against the address)."""
    return {"decommit" if checked_address and value in BOOL_VALUES else "decommit_before": value}


def properties(c: Any, get: Any, names: Any, with_length: Any = False) -> Any:
    """{name: value} of the numeric properties the getter answers."""
    name_at, value_at = c.scratch(128), c.scratch(16)
    props = {}
    for name in names:
        raw = name.encode()
        c.write(name_at, raw + b"\0")
        c.write(value_at, b"\0" * 8)
        # google/tcmalloc's entry point takes the name's length too.
        ok = c.call(get, name_at, len(raw), value_at) if with_length else c.call(get, name_at, value_at)
        if ok & common.BOOL_RETURN:
            props[name] = struct.unpack("<Q", c.read(value_at, 8))[0]
    return props


def stats_text(c: Any, fn: Any, size: Any = GETSTATS_BUF, process_key: Any = None) -> Any:
    buf = c.buffer(size)              # zeroed, outside the borrowed stack
    c.call(fn, buf, size)
    seen = (process_key, "GetStats") if process_key is not None else None
    return common.text_at(c, buf, size, first=GETSTATS_READ_FIRST, seen=seen)[0]


def gather(c: Any, a: Any, opts: Any) -> Any:
    names = a["props"]
    cached = _knobs.get(a.get("process_key"))
    raw: dict[str, Any] = {}
    limit_at = a.get("limit_at") if THREAD_CACHE_LIMIT in names else None
    read_before = {DECOMMIT: a["decommit"]} if DECOMMIT in names and \
        a.get("decommit") is not None else {}
    to_call = [n for n in names if not (limit_at and n == THREAD_CACHE_LIMIT)
               and n not in read_before]
    if names == EVERY_SNAPSHOT and cached and to_call:
        raw["properties"], raw["knobs_cached"] = dict(cached), True
    else:
        raw["properties"] = properties(c, a["get"], to_call)
        ref = a.get("decommit_at")
        if ref and DECOMMIT in raw["properties"] and a.get("decommit_before") is not None:
            # the check: the byte, right after the call (only where it could
            # be read before the stop: no read inside it that could fail)
            raw["decommit_check"] = (ref, c.read(ref[0], 1)[0], a["decommit_before"])
    if read_before:
        raw["properties"].update(read_before)
        raw["decommit_read"] = a["decommit_at"]
    if limit_at:
        # every snapshot: one read, fresher than the kept value
        raw["properties"][THREAD_CACHE_LIMIT] = SIZE_T.unpack(c.read(limit_at, SIZE_T.size))[0]
        raw["limit_read"] = True
    # kept when a knob was called for (one read from memory needs no keeping)
    if not raw.get("knobs_cached") and a.get("process_key") and \
            any(n in to_call for n in EVERY_SNAPSHOT) and \
            all(n in raw["properties"] for n in EVERY_SNAPSHOT):
        _knobs.put(a["process_key"], {n: raw["properties"][n] for n in EVERY_SNAPSHOT})
    if a["stats"]:
        raw["getstats"] = stats_text(c, a["stats"], process_key=a.get("process_key"))
    return raw


def _variant(alloc):
    variant = getattr(alloc, "variant", None)
    if variant is None and "minimal" in os.path.basename(getattr(alloc, "path", None) or ""):
        variant = "minimal"
    return variant


def _document(props, stats, alloc):
    out = {name: props.get(name) for name, _, _ in PROPERTIES}
    summary = (stats or {}).get("summary") or {}
    for name, terms in FROM_GETSTATS.items():
        if out[name] is not None:
            continue
        keys = [t.lstrip("-") for t in terms]
        if all(isinstance(summary.get(k), int) for k in keys):
            out[name] = sum(-summary[t[1:]] if t.startswith("-") else summary[t] for t in terms)
    return {"properties": out, "getstats": stats, "version": getattr(alloc, "version", None),
            "variant": _variant(alloc), "side_effects": []}


def parse(raw: Any, alloc: Any) -> Any:
    stats, error = None, None
    if "getstats" in raw:
        try:
            stats = tcmalloc_stats.parse_getstats(raw["getstats"].decode(errors="replace"))
        except AllocdiagError as exc:
            error = str(exc)
    native = _document(raw["properties"], stats, alloc)
    called = sorted(n for n in raw["properties"]
                    if not (raw.get("limit_read") and n == THREAD_CACHE_LIMIT)
                    and not (raw.get("decommit_read") and n == DECOMMIT))
    asked = (f" + GetNumericProperty for {', '.join(called)} (not printed"
             + (f"; read < {KNOBS_REFRESH_S:g} s ago" if raw.get("knobs_cached") else "")
             + ")") if called else ""
    native["gathered_by"] = (f"MallocExtension_GetStats{asked}; the printed properties "
                             "derived from GetStats"
                             if stats is not None and len(raw["properties"]) < len(PROPERTIES)
                             else "MallocExtension_GetNumericProperty, one call per property")
    if raw.get("limit_read"):
        native["gathered_by"] += (f"; {THREAD_CACHE_LIMIT} read from memory "
                                  "(tcmalloc::ThreadCache::overall_thread_cache_size_)")
    if raw.get("decommit_read"):
        addr, mkey = raw["decommit_read"]
        native["gathered_by"] += (f"; {DECOMMIT} read from memory before the stop "
                                  f"({DECOMMIT_FIELD} at {addr:#x}, found by "
                                  f"{DECOMMIT_AT.found_by(mkey)})")
    if "decommit_check" in raw:
        native["gathered_by"] += _decommit_verdict(raw["decommit_check"],
                                                   raw["properties"][DECOMMIT])
    if error:
        native["getstats_error"] = error
    return native


# what gathered_by says of one check of the decommit byte
DECOMMIT_CHECKED = {checked.SAME: "the same value (the byte is used from now on)",
                    checked.DIFFERENT: "different (not used)",
                    checked.MOVED: "different, but the byte moved meanwhile (checked again "
                                   "next time)"}


def _decommit_verdict(check: Any, called: int) -> str:
    """Judge one check of the decommit byte against what the call returned
    in the same stop; what gathered_by says of it."""
    (addr, mkey), byte, before = check
    return (f"; {DECOMMIT_FIELD} at {addr:#x} checked against GetNumericProperty: "
            + DECOMMIT_CHECKED[DECOMMIT_AT.judge(mkey, byte, called, before)])


def normalise(native: dict[str, Any]) -> dict[str, Value]:
    props = {k: v for k, v in native["properties"].items() if v is not None}
    return tcmalloc_stats.normalise_tcmalloc(props, native.get("getstats"), flavor="gperftools")


def parse_file(data: bytes) -> dict[str, Any]:
    """Saved ``MallocExtension_GetStats`` text -> the native document."""
    stats = tcmalloc_stats.parse_getstats(data.decode("utf-8", "replace")
                                          if isinstance(data, (bytes, bytearray)) else data)
    native = _document({}, stats, None)
    native["gathered_by"] = "file: MallocExtension_GetStats text"
    return native


def looks_like(head: bytes) -> bool:
    """HEAD is MallocExtension_GetStats text."""
    return b"MALLOC:" in head
