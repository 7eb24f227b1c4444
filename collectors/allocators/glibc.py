"""glibc ptmalloc2: plan, gather, parse and normalise; the native fields.

Native document::

    {"malloc_info": {...} | None,   # collectors.glibc_stats.parse_malloc_info
     "mallinfo2": {10 fields},      # from malloc_info (exact), or called
     "mallinfo2_from": "malloc_info" | "mallinfo2",
     "version": "2.36" | None,
     "error": str | None}
"""

from collectors.schema import BYTES, COUNT, FLAG, NativeField, TEXT

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
    NativeField("malloc_info.arenas.*.fast", TEXT, "none without fastbins", _MI),
    NativeField("malloc_info.arenas.*.flag_bytes", BYTES,
                "PREV_INUSE bits included in this arena's rest.size", "allocdiag"),
    NativeField("malloc_info.arenas.*.free_bytes", BYTES,
                "free bytes in this arena: fast.size + rest.size - flag_bytes (int_mallinfo avail)",
                "allocdiag, from " + _MI),
    NativeField("malloc_info.arenas.*.top_bytes", BYTES,
                "size of this arena's top chunk: rest.size - the regular-bin totals", "allocdiag, from " + _MI),
    NativeField("malloc_info.arenas.*.system.current", BYTES, "system_mem: bytes obtained from the system", _MI),
    NativeField("malloc_info.arenas.*.system.max", BYTES, "max_system_mem: high-water mark", _MI),
    NativeField("malloc_info.arenas.*.aspace.total", BYTES, "address space of the arena's heaps", _MI),
    NativeField("malloc_info.arenas.*.aspace.mprotect", BYTES, "bytes made read-write (mprotect) in the heaps", _MI),
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
    NativeField("heap_resident.bytes", BYTES, "smaps Rss of [heap] and the arena heaps", "/proc/PID/smaps"),
    NativeField("heap_resident.arena_heaps", COUNT, "arena heaps found in smaps", "/proc/PID/smaps"),
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
