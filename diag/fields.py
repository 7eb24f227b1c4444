"""The one table that describes every number allocdiag shows.

Each field is described once: its JSON key, the layer it belongs to, its
unit, a short label (TUI), a one-line meaning (``--help``, metric HELP text,
docs) and where the number comes from.  JSON keys, TUI labels and Prometheus
help strings are all generated from this table, so the vocabulary of
DESIGN.md has exactly one definition in code.
"""

from collections import namedtuple

Field = namedtuple("Field", "name layer unit label meaning source")

_B = "bytes"

FIELDS = (
    # -- process layer (kernel) ------------------------------------------
    Field("rss", "process", _B, "RSS",
          "resident set size: rss_anon + rss_file + rss_shmem",
          "/proc/PID/status VmRSS"),
    Field("rss_anon", "process", _B, "anon",
          "resident anonymous memory (heap, stacks, allocator arenas); includes lazyfree",
          "/proc/PID/status RssAnon"),
    Field("rss_file", "process", _B, "file",
          "resident file-backed pages (code, mapped files)",
          "/proc/PID/status RssFile"),
    Field("rss_shmem", "process", _B, "shmem",
          "resident shared memory (shm, tmpfs, shared anonymous)",
          "/proc/PID/status RssShmem"),
    Field("lazyfree", "process", _B, "LazyFree",
          "pages freed with MADV_FREE: still counted in RSS, taken back by the kernel "
          "under pressure without swapping",
          "/proc/PID/smaps_rollup LazyFree"),
    Field("anon_thp", "process", _B, "THP",
          "anonymous memory backed by transparent huge pages",
          "/proc/PID/smaps_rollup AnonHugePages"),
    Field("swap", "process", _B, "swap",
          "anonymous memory swapped out", "/proc/PID/smaps_rollup Swap"),
    Field("pss", "process", _B, "PSS",
          "proportional set size: shared pages divided among their users",
          "/proc/PID/smaps_rollup Pss"),
    Field("private", "process", _B, "private",
          "resident pages mapped by this process only (Private_Clean + Private_Dirty)",
          "/proc/PID/smaps_rollup"),
    Field("shared", "process", _B, "shared",
          "resident pages also mapped by other processes (Shared_Clean + Shared_Dirty)",
          "/proc/PID/smaps_rollup"),
    Field("vm_size", "process", _B, "virtual",
          "total virtual address space", "/proc/PID/status VmSize"),
    Field("threads", "process", "count", "threads",
          "number of threads", "/proc/PID/status Threads"),
    # -- cgroup layer ------------------------------------------------------
    Field("usage", "cgroup", _B, "usage",
          "memory charged to the cgroup, page cache included",
          "memory.current (v2) / memory.usage_in_bytes (v1)"),
    Field("limit", "cgroup", _B, "limit",
          "the cgroup's memory limit; null when unlimited",
          "memory.max (v2) / memory.limit_in_bytes (v1)"),
    Field("inactive_file", "cgroup", _B, "inactive file",
          "page cache on the inactive list; lazy-free pages are counted here too",
          "memory.stat inactive_file (v1: total_inactive_file)"),
    Field("working_set", "cgroup", _B, "working set",
          "max(0, usage - inactive_file): what kubectl top and cAdvisor show",
          "derived"),
    # -- allocator layer (normalised) ----------------------------------------
    Field("allocated", "stats", _B, "allocated",
          "live bytes handed to the program by the allocator", "allocator"),
    Field("active", "stats", _B, "active",
          "pages/chunks in use including internal fragmentation and caches", "allocator"),
    Field("resident", "stats", _B, "resident",
          "allocator-held bytes physically resident, never above what the kernel says is "
          "resident (adjusted, raw figure kept, where the allocator's own estimate is higher)",
          "allocator"),
    Field("committed", "stats", _B, "committed",
          "memory the allocator has committed (made usable) from the OS; pages never touched "
          "or reset are committed but not resident (mimalloc's own counter)", "allocator"),
    Field("mapped", "stats", _B, "mapped",
          "address space the allocator maps; not a superset of resident", "allocator"),
    Field("retained", "stats", _B, "retained",
          "virtual memory kept mapped but released to the OS", "allocator"),
    Field("metadata", "stats", _B, "metadata",
          "allocator bookkeeping", "allocator"),
    Field("dirty", "stats", _B, "dirty",
          "free pages the allocator holds resident", "allocator"),
    Field("muzzy", "stats", _B, "muzzy",
          "free pages advised with MADV_FREE (become LazyFree in the kernel's view)",
          "allocator"),
)

# -- runtime layer (CPython pymalloc; the "runtime" object, main interpreter) ----
# Same JSON keys as some allocator fields, inside their own object, so they are
# looked up with RUNTIME_BY_NAME, never BY_NAME.  The TUI's glossary
# (tui/dialogs.py HelpScreen) lists FIELDS + RUNTIME_FIELD_ROWS.
RUNTIME_FIELD_ROWS = (
    Field("arenas", "runtime", "count", "py arenas",
          "pymalloc arenas in use (1 MiB each on 3.10+)", "obmalloc arenas[]"),
    Field("arenas_highwater", "runtime", "count", "py arenas max",
          "most pymalloc arenas ever in use at once", "obmalloc narenas_highwater"),
    Field("mapped", "runtime", _B, "py mapped",
          "address space of the arenas: arenas x ARENA_SIZE (pymalloc mmaps them itself, "
          "outside malloc)", "derived"),
    Field("resident", "runtime", _B, "py resident",
          "resident pages of the arenas", "/proc/PID/pagemap"),
    Field("allocated", "runtime", _B, "py allocated",
          "live bytes in Python's small objects (<= 512 B): blocks in use x block size",
          "pool headers"),
    Field("free_in_pools", "runtime", _B, "py free in pools",
          "free blocks inside pools that hold live blocks: reusable by Python only, "
          "for objects of the same size class", "pool headers"),
    Field("unused_pools", "runtime", _B, "py unused pools",
          "pools of live arenas holding no block; an arena goes back to the OS only "
          "when all its pools are unused", "obmalloc arena_object.nfreepools"),
    Field("pools", "runtime", "count", "py pools", "pools holding live blocks", "pool headers"),
    Field("blocks", "runtime", "count", "py blocks", "live pymalloc blocks", "pool headers"),
)

BY_NAME = {f.name: f for f in FIELDS}
RUNTIME_BY_NAME = {f.name: f for f in RUNTIME_FIELD_ROWS}


def layer(name):
    """The fields of one layer, in table order."""
    return tuple(f for f in FIELDS + RUNTIME_FIELD_ROWS if f.layer == name)


PROCESS_FIELDS = tuple(f.name for f in layer("process"))
CGROUP_FIELDS = tuple(f.name for f in layer("cgroup"))
STATS_FIELDS = tuple(f.name for f in layer("stats"))
RUNTIME_FIELDS = tuple(f.name for f in layer("runtime"))

# -- exporter layer (``allocdiag exporter``: quantities that exist only as metrics) ----
# Looked up with EXPORTER_BY_NAME; diag.metrics takes every HELP string from
# here, from FIELDS or from RUNTIME_FIELD_ROWS, never from a literal of its own.
EXPORTER_FIELD_ROWS = (
    Field("processes", "exporter", "count", "processes",
          "processes in the group that the /proc scan could read", "/proc"),
    Field("memory_class", "exporter", _B, "memory class",
          "RSS of the live targets split into disjoint classes that add up to "
          "allocdiag_target_rss_bytes: live (allocated), allocator_free (held resident but "
          "free: fragmentation, caches, dirty pages), allocator_metadata, allocator_held "
          "(allocator share not split: allocated unknown), lazyfree, python_arenas (pymalloc "
          "arenas, carved from other_anon), other_anon, file, shmem; allocator numbers are "
          "clamped to the kernel's (held <= rss_anon - lazyfree, live <= held, metadata <= "
          "held - live)",
          "derived: diag.metrics.memory_classes"),
    Field("target_rss", "exporter", _B, "target RSS",
          "RSS of the live targets when their allocator was read: the total the classes "
          "of allocdiag_memory_bytes add up to", "/proc/PID/status VmRSS"),
    Field("target_info", "exporter", "info", "target",
          "one live target (value 1): pid, comm, group, allocator and whether its allocator "
          "was read (state ok|not read|pending; reason from a fixed list)", "exporter"),
    Field("target_pause", "exporter", "seconds", "pause",
          "time a borrowed thread of the group's live targets was stopped for allocator "
          "reads (other threads never stop)", "remote call pause_us"),
    Field("target_reads", "exporter", "count", "reads",
          "allocator reads of the group's live targets, by result (ok | not read)",
          "exporter"),
    Field("scrape_duration", "exporter", "seconds", "scrape",
          "time this collection took: the /proc scan and cache lookups (a scrape never "
          "waits for a stop)", "exporter"),
    Field("collector_success", "exporter", "bool", "success",
          "1 when the collector worked in this collection: procfs = the /proc scan ran, "
          "live = no live target is in state not read", "exporter"),
    Field("scan_skipped", "exporter", "count", "skipped",
          "processes the /proc scan skipped, by reason (denied | vanished | failed)",
          "/proc"),
)

EXPORTER_BY_NAME = {f.name: f for f in EXPORTER_FIELD_ROWS}


# -- the allocation wall (``allocdiag wall``; diag.model.wall) ---------------------------------
# Names are the dotted paths of the wall JSON document; looked up with WALL_BY_NAME.
# ``syscalls.NAME.*`` rows stand for each of diag.model.wall.SYSCALLS; ``counters.NAME`` for
# every allocator counter (its own name and source are in the document).
_SAMPLING = "perf_event_open"
WALL_FIELD_ROWS = (
    Field("window.duration_s", "wall", "seconds", "window",
          "how long the process was sampled (shorter than asked when ended early)",
          "allocdiag's clock"),
    Field("window.hz", "wall", "hertz", "rate",
          "CPU-clock samples per second of each thread's CPU time", "--hz"),
    Field("window.samples", "wall", "count", "samples",
          "CPU samples decoded", _SAMPLING + " PERF_COUNT_SW_CPU_CLOCK"),
    Field("window.lost", "wall", "count", "lost",
          "records the kernel dropped because a ring was full", "PERF_RECORD_LOST"),
    Field("window.threads_seen", "wall", "count", "threads",
          "threads sampled at some point of the window (new ones found by a rescan of "
          "/proc/PID/task)", "/proc/PID/task"),
    Field("window.pause_us", "wall", "microseconds", "pause",
          "each stop of one borrowed thread to read the allocator's counters (window start "
          "and end); sampling itself stops no thread", "remote call pause_us"),
    Field("window.missing", "wall", "text", "missing",
          "figures that could not be measured, with the reason and the fix", "allocdiag"),
    Field("cpu.allocator_share", "wall", "ratio", "allocator CPU",
          "share of on-CPU samples whose user stack holds an allocator entry point or "
          "allocator library frame", _SAMPLING + " user stack + .eh_frame unwind"),
    Field("cpu.application_share", "wall", "ratio", "application CPU",
          "share of on-CPU samples outside the allocator (walk complete or reached the "
          "program's own code)", "derived"),
    Field("cpu.unknown_share", "wall", "ratio", "unknown CPU",
          "share of on-CPU samples whose stack walk stopped before it could tell: counted "
          "neither as allocator nor as application", "derived"),
    Field("cpu.unwound_share", "wall", "ratio", "unwound",
          "share of on-CPU samples whose stack walk reached the thread's first frame",
          ".eh_frame unwind"),
    Field("cpu.kernel_share", "wall", "ratio", "in kernel",
          "share of on-CPU samples taken in kernel mode (charged to the user stack at "
          "kernel entry, so a madvise inside free counts as allocator time)",
          "PERF_RECORD_MISC_KERNEL"),
    Field("cpu.allocator_s", "wall", "seconds", "allocator CPU s",
          "CPU seconds inside the allocator: samples x period x allocator share", "derived"),
    Field("cpu.by_function", "wall", "ratio", "by function",
          "allocator CPU by the innermost allocator function a symbol names ('glibc malloc "
          "(internal)' when stripped glibc has no name for it)", "symbols, debug files"),
    Field("cpu.by_entry", "wall", "ratio", "by entry",
          "allocator CPU by the outermost allocator entry point (malloc, free, operator new...)",
          "symbols"),
    Field("off_cpu.thread_s", "wall", "seconds", "thread time",
          "sum over threads of the time each was observed in the window", "allocdiag's clock"),
    Field("off_cpu.blocked_s", "wall", "seconds", "blocked",
          "time threads were switched out voluntarily (futex, I/O, sleep), switch-out to "
          "switch-in, run-queue wait after the wake-up included",
          _SAMPLING + " PERF_RECORD_SWITCH"),
    Field("off_cpu.preempted_s", "wall", "seconds", "preempted",
          "time threads were switched out while still runnable (CPU contention, not waiting)",
          "PERF_RECORD_MISC_SWITCH_OUT_PREEMPT"),
    Field("off_cpu.allocator_lock_s", "wall", "seconds", "allocator lock wait",
          "blocked time whose stack at switch-out holds an allocator frame (arena/mutex "
          "waits such as __lll_lock_wait_private under malloc)",
          _SAMPLING + " PERF_COUNT_SW_CONTEXT_SWITCHES user stack"),
    Field("off_cpu.allocator_lock_share", "wall", "ratio", "allocator lock wait",
          "allocator_lock_s / thread_s", "derived"),
    Field("faults.minor_per_s", "wall", "per second", "minor faults/s",
          "minor page faults per second, all sampled threads", "PERF_COUNT_SW_PAGE_FAULTS_MIN"),
    Field("faults.major_per_s", "wall", "per second", "major faults/s",
          "major page faults (disk read) per second", "PERF_COUNT_SW_PAGE_FAULTS_MAJ"),
    Field("syscalls.NAME.per_s", "wall", "per second", "calls/s",
          "calls of the syscall per second, all sampled threads",
          "tracepoint syscalls:sys_enter_NAME"),
    Field("syscalls.NAME.from_allocator_share", "wall", "ratio", "from allocator",
          "share of the sampled calls whose user stack holds an allocator frame",
          "tracepoint samples + .eh_frame unwind"),
    Field("counters.NAME", "wall", "count", "counter",
          "one of the allocator's own counters: start, end, delta and per_s over the window",
          "borrowed call (collectors.livestats)"),
    Field("sites.allocator_cpu_s", "wall", "seconds", "allocator CPU",
          "allocator CPU seconds charged to the call site (first frame outside the allocator)",
          "derived"),
    Field("sites.lock_wait_s", "wall", "seconds", "lock wait",
          "allocator lock wait charged to the call site", "derived"),
)

WALL_BY_NAME = {f.name: f for f in WALL_FIELD_ROWS}


# -- findings' evidence -------------------------------------------------------------------
# Evidence keys are field names (units above) or the derived quantities below,
# declared here once so every view shows them in their unit.  Keys whose values
# are words (a cause, a path, a list of reasons) are listed as text.  A rule in
# diag.findings that adds a key declares it here (tests/test_findings.py checks).
_PCT = "percent"
EVIDENCE_UNITS = {
    # the allocator's or runtime's bytes under another name
    "allocator_resident": _B, "pymalloc_resident": _B, "committed": _B,
    "cgroup_usage": _B, "cgroup_working_set": _B, "cgroup_inactive_file": _B,
    # a series' first, last and peak value (trend rules)
    "allocated_first": _B, "allocated_last": _B, "allocated_peak": _B,
    "resident_first": _B, "resident_last": _B, "resident_peak": _B,
    # derived byte counts of the rules
    "free_in_arenas": _B, "held_free": _B, "keepcost": _B, "non_main_system": _B,
    "non_main_free": _B, "pageheap_free": _B, "thread_cache_free": _B,
    "max_total_thread_cache_bytes": _B, "resident_free_upper_bound": _B, "outside": _B,
    # shares, ratios, counts, durations
    "dirty_pct_of_resident": _PCT, "idle_pct_of_resident": _PCT, "lazyfree_pct_of_rss": _PCT,
    "outside_pct_of_anon": _PCT, "ratio": "ratio", "narenas": "count", "samples": "count",
    "steps_up": "count", "seconds": "seconds",
    # the allocation wall's rules (diag.wall_findings)
    "allocator_lock_share": "ratio", "allocator_lock_s": "seconds", "arenas": "count",
    "allocator_share": "ratio", "sites_share": "ratio", "mmap_munmap_per_s": "per second",
    "madvise_per_s": "per second", "faults_per_s": "per second",
    "dirty_purged_per_s": "per second",
}
EVIDENCE_TEXT = frozenset(("background_thread", "cause", "kind", "linkage", "others", "path",
                           "prefix", "reasons", "requested", "serving", "sites"))


def evidence_unit(key):
    """The unit of an evidence KEY ("bytes", "count", "percent", "ratio",
    "seconds"), or None for the text keys."""
    f = BY_NAME.get(key) or RUNTIME_BY_NAME.get(key)
    return f.unit if f is not None else EVIDENCE_UNITS.get(key)
