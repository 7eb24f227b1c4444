"""gperftools tcmalloc (full and minimal): plan, gather, parse and
normalise; the native fields.

Native document::

    {"properties": {name: int | None},   # exactly the names of PROPERTIES
     "getstats": {...} | None,           # collectors.tcmalloc_stats.parse_getstats
     "version": str | None,
     "variant": "minimal" | None}
"""

from collectors.schema import BYTES, COUNT, FLAG, NativeField, TEXT

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
) + tuple(NativeField("getstats.summary." + n, u, m, _GS) for n, u, m in SUMMARY_NOT_BYTES)
