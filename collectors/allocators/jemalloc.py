"""jemalloc: plan, gather, parse and normalise; the native fields.

Native document::

    {"mallctl": {mallctl name: value},     # exactly the names of MALLCTLS
     "prefix": "" | "je_" | "_rjem_" ...,
     "arenas": [{"arena", <ARENA_FIELDS>}]  # only with per_arena (live)
    }

Names and meanings are jemalloc 5.3's (doc/jemalloc.xml.in, src/ctl.c,
src/stats.c).  ``malloc_stats_print`` JSON paths are the mallctl names with
"merged" for arena index 4096 (MALLCTL_ARENAS_ALL), so both sources land
on the same keys.
"""

from collectors.schema import BYTES, COUNT, FLAG, MS, NativeField, PAGES, TEXT

# (mallctl name, C type, unit, meaning).  The one list of the mallctls
# allocdiag reports: the JSON is filtered to it, the per-call path reads it.
MALLCTLS = (
    ("version", "const char*", TEXT, "jemalloc version string"),
    ("config.debug", "bool", FLAG, "built with --enable-debug"),
    ("config.fill", "bool", FLAG, "built with junk/zero fill support"),
    ("config.malloc_conf", "const char*", TEXT, "options compiled in with --with-malloc-conf"),
    ("config.prof", "bool", FLAG, "built with heap profiling support"),
    ("config.stats", "bool", FLAG, "built with statistics (stats.* are 0 without)"),
    ("opt.retain", "bool", FLAG, "virtual memory is retained (decommitted/purged) instead of unmapped"),
    ("opt.dss", "const char*", TEXT, "sbrk(2) precedence relative to mmap(2)"),
    ("opt.narenas", "unsigned", COUNT, "maximum number of arenas for automatic multiplexing"),
    ("opt.percpu_arena", "const char*", TEXT, "per-CPU arena mode"),
    ("opt.oversize_threshold", "size_t", BYTES, "allocations at least this large go to a dedicated arena"),
    ("opt.metadata_thp", "const char*", TEXT, "transparent huge pages for metadata"),
    ("opt.background_thread", "bool", FLAG, "background purging threads enabled at start"),
    ("opt.dirty_decay_ms", "ssize_t", MS, "time for unused dirty pages to be purged, as configured at start"),
    ("opt.muzzy_decay_ms", "ssize_t", MS, "time for muzzy (MADV_FREE'd) pages to be purged, as configured"),
    ("opt.tcache", "bool", FLAG, "thread-specific caching enabled"),
    ("opt.tcache_max", "size_t", BYTES, "largest size class cached in the thread caches (5.3)"),
    ("opt.lg_tcache_max", "size_t", COUNT, "log2 of the largest cached size class (5.2 and older)"),
    ("opt.thp", "const char*", TEXT, "transparent huge page mode"),
    ("opt.prof", "bool", FLAG, "heap profiling enabled at start"),
    ("opt.lg_prof_sample", "size_t", COUNT, "log2 of the mean bytes between profile samples"),
    ("opt.zero_realloc", "const char*", TEXT, "what realloc(p, 0) does"),
    ("background_thread", "bool", FLAG, "background purging threads enabled now (changeable at runtime)"),
    ("arenas.narenas", "unsigned", COUNT, "current limit on the number of arenas"),
    ("arenas.page", "size_t", BYTES, "page size: bytes per page of the p* counters"),
    ("arenas.quantum", "size_t", BYTES, "quantum size"),
    ("arenas.tcache_max", "size_t", BYTES, "largest size class cached in the thread caches"),
    ("arenas.dirty_decay_ms", "ssize_t", MS, "dirty decay time that newly created arenas get"),
    ("arenas.muzzy_decay_ms", "ssize_t", MS, "muzzy decay time that newly created arenas get"),
    ("arenas.nbins", "unsigned", COUNT, "number of small size classes (bins)"),
    ("arenas.nlextents", "unsigned", COUNT, "number of large size classes"),
    ("stats.allocated", "size_t", BYTES, "bytes allocated by the application"),
    ("stats.active", "size_t", BYTES, "bytes in active pages (a page multiple >= allocated)"),
    ("stats.metadata", "size_t", BYTES, "bytes dedicated to metadata (base + internal allocations)"),
    ("stats.metadata_thp", "size_t", BYTES, "metadata bytes backed by transparent huge pages"),
    ("stats.resident", "size_t", BYTES, "maximum bytes in physically resident data pages (upper bound)"),
    ("stats.mapped", "size_t", BYTES, "bytes in active extents mapped by the allocator (excludes retained)"),
    ("stats.retained", "size_t", BYTES, "bytes in virtual memory retained instead of unmapped (not RSS)"),
    ("stats.zero_reallocs", "size_t", COUNT, "realloc(p, 0) calls"),
    ("stats.background_thread.num_threads", "size_t", COUNT, "background threads running"),
    ("stats.background_thread.num_runs", "uint64", COUNT, "total background thread runs"),
    ("stats.background_thread.run_interval", "uint64", COUNT, "average background run interval, ns"),
    ("stats.arenas.4096.nthreads", "unsigned", COUNT, "threads assigned to arenas (all arenas merged)"),
    ("stats.arenas.4096.pactive", "size_t", PAGES, "pages in active extents (all arenas)"),
    ("stats.arenas.4096.pdirty", "size_t", PAGES, "unused dirty pages not yet purged (all arenas)"),
    ("stats.arenas.4096.pmuzzy", "size_t", PAGES, "pages purged lazily (MADV_FREE), still counted in RSS until reclaimed (all arenas)"),
    ("stats.arenas.4096.dirty_npurge", "uint64", COUNT, "dirty page purge sweeps"),
    ("stats.arenas.4096.dirty_nmadvise", "uint64", COUNT, "madvise() calls made to purge dirty pages"),
    ("stats.arenas.4096.dirty_purged", "uint64", PAGES, "dirty pages purged"),
    ("stats.arenas.4096.muzzy_npurge", "uint64", COUNT, "muzzy page purge sweeps"),
    ("stats.arenas.4096.muzzy_nmadvise", "uint64", COUNT, "madvise() calls made to purge muzzy pages"),
    ("stats.arenas.4096.muzzy_purged", "uint64", PAGES, "muzzy pages purged"),
    ("stats.arenas.4096.small.allocated", "size_t", BYTES, "bytes allocated in small size classes"),
    ("stats.arenas.4096.large.allocated", "size_t", BYTES, "bytes allocated in large size classes"),
    ("stats.arenas.4096.mapped", "size_t", BYTES, "mapped bytes (all arenas)"),
    ("stats.arenas.4096.retained", "size_t", BYTES, "retained bytes (all arenas)"),
    ("stats.arenas.4096.base", "size_t", BYTES, "bytes of base allocator metadata"),
    ("stats.arenas.4096.internal", "size_t", BYTES, "bytes of internal allocations (metadata)"),
    ("stats.arenas.4096.tcache_bytes", "size_t", BYTES, "bytes cached in thread caches"),
    ("stats.arenas.4096.resident", "size_t", BYTES, "maximum resident bytes (all arenas)"),
    ("stats.arenas.4096.abandoned_vm", "size_t", BYTES, "bytes leaked to failed purges (abandoned)"),
)

# Per-arena fields read with per_arena (mallctl stats.arenas.<i>.<name>).
ARENA_FIELDS = (
    ("pactive", "size_t", PAGES, "pages in active extents"),
    ("pdirty", "size_t", PAGES, "unused dirty pages"),
    ("pmuzzy", "size_t", PAGES, "muzzy (MADV_FREE'd) pages"),
    ("dirty_decay_ms", "ssize_t", MS, "this arena's dirty decay time"),
    ("muzzy_decay_ms", "ssize_t", MS, "this arena's muzzy decay time"),
    ("nthreads", "unsigned", COUNT, "threads assigned to this arena"),
)

_SRC = "mallctl / malloc_stats_print (jemalloc src/ctl.c, src/stats.c)"
FIELDS = tuple(NativeField("mallctl:" + n, u, m, _SRC) for n, _, u, m in MALLCTLS) + (
    NativeField("prefix", TEXT, "symbol prefix of this jemalloc build (je_, _rjem_, ...)", "ELF symbols"),
    NativeField("arenas.*.arena", COUNT, "arena index", "mallctl stats.arenas.<i>"),
) + tuple(NativeField("arenas.*." + n, u, m, "mallctl stats.arenas.<i>." + n)
          for n, _, u, m in ARENA_FIELDS)


def page_size(native):
    """Bytes per page of the p* counters: mallctl arenas.page."""
    page = (native.get("mallctl") or {}).get("arenas.page")
    return page if isinstance(page, int) and page > 0 else None
