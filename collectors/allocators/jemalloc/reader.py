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

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.model import Value

from collectors import lazylog
from collectors.allocators.jemalloc import stats as jemalloc_stats
from collectors.allocators.jemalloc import table as jemalloc_table
from collectors.allocators import common
from diag.model.errors import MalformedData, RemoteCallError
from collectors.allocators.native import BYTES, COUNT, FLAG, MS, NativeField, PAGES, TEXT

log = lazylog.getLogger("collectors.allocators")

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
    ("stats.arenas.4096.pmuzzy", "size_t", PAGES,
     "pages purged lazily (MADV_FREE), still counted in RSS until reclaimed (all arenas)"),
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


def page_size(native: Any) -> Any:
    """Bytes per page of the p* counters: mallctl arenas.page."""
    page = (native.get("mallctl") or {}).get("arenas.page")
    return page if isinstance(page, int) and page > 0 else None


# -- plan, gather, parse, normalise -------------------------------------------------
#
# One call per snapshot: malloc_stats_print(strcat, buf, STATS_OPTS) writes
# the JSON report into zeroed scratch memory.  libc's strcat(char *dest,
# const char *src) has the write callback's signature (void *cbopaque,
# const char *s), so each piece is appended to BUF.  jemalloc writes
# "epoch" itself and buffers its output in a 64 KiB buffer it allocates and
# frees (buf_writer_init in src/jemalloc.c): one allocation, reported.
#
# STATS_OPTS (src/stats.c, STATS_PRINT_OPTIONS of 5.2/5.3): J JSON; d no
# destroyed-arena stats; a no per-arena stats; b no bins; l no large
# classes; x no mutex stats; e no extents; h no HPA stats.  "m" is left out
# so the merged arena (pactive, pdirty, pmuzzy) is printed.
STATS_OPTS = b"Jdablxeh"
# The general section (version, config, opt, arenas: "g" omits it) is most of
# the printing (~85 % of the in-process cost: one mallctl-by-name per option
# and one per size class) and is constant but for arenas.narenas and the
# arenas.*_decay_ms defaults.  It is printed with the first snapshot of a
# target process and again every GENERAL_REFRESH_S; the snapshots between,
# of this allocdiag process (TUI, record, exporter) or of the next CLI runs
# (kept on disk: common.KeptValues), print the stats only and take the
# general values from then.  allocdiag's own `set` forgets them
# (forget_general).
STATS_OPTS_NO_GENERAL = b"Jgdablxeh"
GENERAL_REFRESH_S = 10.0
# A print with the general section, on versions whose table layout
# collectors.allocators.jemalloc.table was checked against, is the same
# options without J: the table leaves out the 232 per-size-class objects
# JSON prints, for the same values (in-process 35-49 us against 77-91 us).
# The table is smaller than the JSON bound below (the same keys, no arrays).
STATS_OPTS_TABLE = STATS_OPTS.replace(b"J", b"")
TABLE_VERSIONS = ("5.3.",)
# what gathered_by says of each print
PRINTED_NOTE = {STATS_OPTS: "",
                STATS_OPTS_TABLE: " (the table: general section without the size-class arrays)",
                STATS_OPTS_NO_GENERAL: " (general section from a print "
                                       f"< {GENERAL_REFRESH_S:g} s ago)"}

# strcat has no bound, so BUF must hold any output these options can
# produce.  With per-arena tables off the output does not grow with the
# number of arenas or the load, only with the build: every value goes
# through emitter.h's 256-byte buffer (strings are cut at 255 bytes), the
# general section prints one object per size class (arenas.bin: 4 numbers,
# arenas.lextent: 1; nbins + nlextents = SC_NSIZES, 232 on x86-64, < 256
# for any page size and quantum), and the rest is a fixed set of about 130
# keys of which at most 16 are strings.  Bound, in bytes:
STATS_SIZE_CLASSES_MAX = 256
STATS_BIN_MAX = 44 + 4 * 20             # {"size":N,"nregs":N,"slab_size":N,"nshards":N},
STATS_KEYS_MAX = 160                    # keys outside the size-class arrays (5.3 prints ~130)
STATS_KEY_MAX = 48                      # "key": and separators
STATS_NUMBER_MAX = 21                   # 20 digits and a sign
STATS_STRINGS_MAX = 24                  # string values (5.3 prints 16)
STATS_STRING_MAX = 255 + 2              # emitter BUF_SIZE - 1, quoted
STATS_BOUND = (STATS_SIZE_CLASSES_MAX * STATS_BIN_MAX + STATS_KEYS_MAX * (STATS_KEY_MAX +
               STATS_NUMBER_MAX) + STATS_STRINGS_MAX * STATS_STRING_MAX)
STATS_BUF = 56 * 1024                   # > STATS_BOUND (about 47 KiB); Call.buffer, not the stack
STATS_READ_FIRST = 16 * 1024            # > the ~9 KiB printed on 5.3: usually one read
assert STATS_BUF > STATS_BOUND
# Versions whose option letters and JSON layout this was checked against.
STATS_VERSIONS = ("5.2.", "5.3.")

# The one mallctl malloc_stats_print does not print, the runtime
# ``background_thread`` switch, is derived from what it prints: with the
# switch on, stats.background_thread.num_threads counts the running threads
# (>= 1: enabling creates thread 0 synchronously); off, ctl.c zeroes the
# background stats (src/background_thread.c background_threads_enable,
# background_thread_stats_read; src/ctl.c ctl_background_thread_stats_read).
# One call fewer per snapshot.
DERIVED = {"background_thread": "stats.background_thread.num_threads > 0"}

_CTYPES = {"size_t": "<Q", "uint64": "<Q", "ssize_t": "<q", "unsigned": "<I", "bool": "<?",
           "const char*": "<Q"}
# Values fixed once jemalloc initialised: on the per-call path, read once per
# process (keyed by pid and start time), not on every snapshot.
_CONSTANT = ("version", "config.", "opt.", "arenas.page", "arenas.quantum", "arenas.nbins",
             "arenas.nlextents")
# Longest mallctl name written (stats.arenas.4096.bins.N.curslabs and the like
# are < 64; the room is for prefixed builds' names) and longest const char*
# value read back (version, opt.prof_prefix, config.malloc_conf).
MALLCTL_NAME_MAX = 256
MALLCTL_STRING_MAX = 4096
_constant_cache: dict[Any, Any] = {}
_ifunc_cache: dict[Any, Any] = {}
# process key -> ({mallctl: value}, {"opt": ..., "config": ...}) of the last
# general section printed, in memory and on disk (next CLI run)
_general = common.KeptValues(GENERAL_REFRESH_S, part="jemalloc-general-1")
KEPT = (_general,)                     # common.before_stop / after_stop
_print_broken: dict[Any, str] = {}    # process key -> why its malloc_stats_print JSON did not parse
_table_broken: dict[Any, str] = {}    # process key -> why its table print did not parse


# Stack the gather's calls use below the engine's frame on the borrowed thread
# (collectors.engine.remote stack_need): the high-water mark measured by
# tests/targets/stack_need.c (pattern-filled 1 MiB stack, the larger of two calls,
# Debian 12 packages; tests/test_stack_bounds.py re-measures and checks it):
#   malloc_stats_print(strcat, buf, "Jdablxeh") 13,143 B (also with "g", and
#   the table "dablxeh"),
#   mallctl epoch + a read 1,655 B.
STACK_NEED = 18 * 1024


def forget_general() -> None:
    """Drop the kept general values, every process's, in memory and on disk:
    after a write such as `allocdiag set`, the next snapshot prints them
    again."""
    _general.clear()


def print_stats(c: Any, a: Any, print_opts: Any, size: Any, first: Any = None) -> Any:
    """``malloc_stats_print(strcat, buf, PRINT_OPTS)`` on the borrowed thread C
    (A from plan) into a SIZE-byte Call.buffer; its text.  SIZE must bound
    what those options print: an unterminated buffer is RemoteCallError."""
    # BUF is zeroed memory outside the stack: strcat appends at its start.
    buf = c.buffer(size)
    opt_at = c.scratch(len(print_opts) + 1)
    c.write(opt_at, print_opts + b"\0")
    strcat = a["strcat"]
    if a.get("strcat_ifunc"):
        # The symbol is glibc's IFUNC resolver: ask it for this CPU's
        # strcat (x86-64 resolvers take no arguments and only read
        # cpu_features).
        key = a.get("process_key")
        strcat = (_ifunc_cache.get(key) if key is not None else None) or c.call(strcat)
        if key is not None:
            _ifunc_cache[key] = strcat
    c.call(a["print"], strcat, buf, opt_at)
    key = a.get("process_key")
    text, terminated = common.text_at(c, buf, size, first=first,
                                      seen=(key, print_opts) if key is not None else None)
    if not terminated:
        # Cannot happen within the options' bound; if it did, memory past
        # the buffer was written: stop using this process.
        raise RemoteCallError("jemalloc malloc_stats_print wrote past its buffer")
    return text


def plan(res: Any, obj: Any, alloc: Any, opts: dict[str, Any]) -> dict[str, Any]:
    prefix = getattr(alloc, "prefix", None) or ""
    mallctl = common.need(res.address(obj, prefix + "mallctl"), prefix + "mallctl", "jemalloc")
    version = getattr(alloc, "version", None) or ""
    a = {"mallctl": mallctl, "process_key": res.process_key(obj), "print": None,
         "version": version or None}
    if not opts.get("jemalloc_per_call") and version.startswith(STATS_VERSIONS) and \
            a["process_key"] not in _print_broken:
        a["print"] = res.address(obj, prefix + "malloc_stats_print")
        a["strcat"] = res.libc("strcat")
        a["strcat_ifunc"] = bool(a["strcat"]) and res.libc_ifunc("strcat")
        if a["strcat_ifunc"]:
            impl = res.libc_impl("strcat")
            if impl:
                a["strcat"], a["strcat_ifunc"] = impl, False
        if not a["strcat"]:
            a["print"] = None
    log.debug("jemalloc %s (prefix %r): %s", version or "?", prefix,
              "malloc_stats_print JSON" if a["print"] else "one mallctl per value")
    return a


def mallctl_read(c: Any, mallctl: Any, name: Any, ctype: Any, scratch: Any) -> Any:
    """One mallctl read; the value (bytes for strings) or None when the name
    does not exist in this version/build."""
    fmt = _CTYPES[ctype]
    size = struct.calcsize(fmt)
    name_at, old, lenp = scratch
    c.write(name_at, name.encode() + b"\0")
    c.write(lenp, struct.pack("<Q", size))
    c.write(old, b"\0" * 8)
    if c.call(mallctl, name_at, old, lenp, 0, 0) & common.INT_RETURN:
        return None
    value = struct.unpack(fmt, c.read(old, size))[0]
    if ctype == "const char*":
        return c.cstring(value, MALLCTL_STRING_MAX) if value else None
    return value


def mallctl_write_bool(c: Any, mallctl: Any, name: Any, value: Any) -> Any:
    """mallctl(NAME, &old, &len, &VALUE, 1) for a bool mallctl such as
    ``background_thread`` or ``prof.active``: (return code, old value)."""
    name_at, old, oldlen, new = c.scratch(64), c.scratch(16), c.scratch(16), c.scratch(16)
    c.write(name_at, name.encode() + b"\0")
    c.write(oldlen, struct.pack("<Q", 1))
    c.write(new, struct.pack("<?", bool(value)))
    rc = c.call(mallctl, name_at, old, oldlen, new, 1) & common.INT_RETURN
    return rc, struct.unpack("<?", c.read(old, 1))[0]


def mallctl_scratch(c: Any) -> Any:
    """(name, old value, old length) scratch cells for mallctl_read."""
    return (c.scratch(MALLCTL_NAME_MAX), c.scratch(16), c.scratch(16))


def gather(c: Any, a: Any, opts: Any) -> Any:
    raw = {}
    scratch = None          # mallctl's cells, only where a mallctl is called
    if a["print"]:
        key = a.get("process_key")
        cached = _general.get(key) if key and not opts.get("jemalloc_full_print") else None
        if cached:
            print_opts, raw["general"] = STATS_OPTS_NO_GENERAL, cached
        elif (a.get("version") or "").startswith(TABLE_VERSIONS) and key not in _table_broken \
                and not opts.get("jemalloc_json_general"):
            print_opts = STATS_OPTS_TABLE
        else:
            print_opts = STATS_OPTS
        raw["process_key"] = key
        raw["table" if print_opts == STATS_OPTS_TABLE else "json"] = print_stats(
            c, a, print_opts, STATS_BUF, first=STATS_READ_FIRST)
        raw["mallctl"] = {}
    else:
        scratch = mallctl_scratch(c)
        raw["mallctl"] = _per_call(c, a, scratch)
    if opts.get("per_arena"):
        scratch = scratch or mallctl_scratch(c)
        narenas = mallctl_read(c, a["mallctl"], "arenas.narenas", "unsigned", scratch)
        raw["arenas"] = [
            {"arena": i, **{f: mallctl_read(c, a["mallctl"], f"stats.arenas.{i}.{f}", t, scratch)
                            for f, t, _, _ in ARENA_FIELDS}}
            for i in range(int(narenas or 0))]
    return raw


def _per_call(c, a, scratch):
    """The fallback: "epoch" then one mallctl per name."""
    mallctl = a["mallctl"]
    key = a.get("process_key")
    cache = _constant_cache.setdefault(key, {}) if key else {}
    name_at, val, lenp = scratch
    c.write(name_at, b"epoch\0")
    c.write(val, struct.pack("<Q", 1))
    c.write(lenp, struct.pack("<Q", 8))
    c.call(mallctl, name_at, val, lenp, val, 8)
    values = {k: v for k, v in cache.items() if k != "_complete"}
    for name, ctype, _, _ in MALLCTLS:
        constant = name.startswith(_CONSTANT)
        if constant and cache.get("_complete"):
            continue
        v = mallctl_read(c, mallctl, name, ctype, scratch)
        values[name] = v
        if constant:
            cache[name] = v
    cache["_complete"] = True
    return values


def parse(raw: Any, alloc: Any) -> Any:
    values: dict[str, Any] = {}
    native: dict[str, Any] = {"mallctl": values, "prefix": getattr(alloc, "prefix", None) or "",
              "side_effects": []}
    if "table" in raw:
        try:
            parsed = jemalloc_stats.checked(jemalloc_table.parse_stats_table(raw["table"]),
                                            "table")
        except MalformedData as exc:
            # JSON has the same values: print it from now on, unless a
            # string was cut (JSON is cut there too: one mallctl at a time)
            cut = isinstance(exc, jemalloc_table.CutString)
            if raw.get("process_key"):
                _table_broken[raw["process_key"]] = exc.msg
                if cut:
                    _print_broken[raw["process_key"]] = exc.msg
            log.info("jemalloc: stats table unusable (%s)", exc.msg)
            raise common.Retry(f"malloc_stats_print table unusable ({exc.msg}); " +
                               ("reading mallctls one by one" if cut else "printing JSON"),
                               {"jemalloc_per_call": True} if cut else
                               {"jemalloc_json_general": True}) from None
    if "json" in raw:
        try:
            parsed = jemalloc_stats.parse_stats_json(raw["json"])
        except MalformedData as exc:
            # The emitter cuts every value at 255 bytes, quotes included
            # (emitter.h BUF_SIZE): a longer option string (opt.prof_prefix
            # may be PATH_MAX long) leaves the JSON broken.  Read this
            # process one mallctl at a time from now on.
            if raw.get("process_key"):
                _print_broken[raw["process_key"]] = exc.msg
            log.info("jemalloc: stats JSON unusable (%s): falling back to mallctl", exc.msg)
            raise common.Retry(f"malloc_stats_print JSON unusable ({exc.msg}); reading "
                               "mallctls one by one", {"jemalloc_per_call": True}) from None
    if "json" in raw or "table" in raw:
        if "general" in raw:
            general, sections = raw["general"]
            values.update(general)
            parsed = dict(parsed, **sections)
        values.update(jemalloc_stats.mallctls(parsed, [n for n, _, _, _ in MALLCTLS]))
        if "general" not in raw and raw.get("process_key"):
            _general.put(raw["process_key"], (
                {n: values[n] for n, _, _, _ in MALLCTLS if not n.startswith("stats.") and n in values},
                {"opt": parsed.get("opt") or {}, "config": parsed.get("config") or {}}))
        threads = values.get("stats.background_thread.num_threads")
        if isinstance(threads, int):
            values["background_thread"] = threads > 0
        if values.get("background_thread") is False:
            native["side_effects"].append(DECAY_EVENTS)
        printed = (STATS_OPTS_NO_GENERAL if "general" in raw else
                   STATS_OPTS_TABLE if "table" in raw else STATS_OPTS)
        native["gathered_by"] = ("malloc_stats_print(strcat, buf, \"%s\")%s; background_thread "
                                 "derived: %s" % (printed.decode(), PRINTED_NOTE[printed],
                                                  DERIVED["background_thread"]))
        native["side_effects"].extend(_remove_print_buffer(values, parsed))
    else:
        native["gathered_by"] = "mallctl, one call per name"
    for name, v in raw["mallctl"].items():
        if v is not None:
            values[name] = v.decode(errors="replace") if isinstance(v, bytes) else v
    for name, _, _, _ in MALLCTLS:
        values.setdefault(name, None)
    if "arenas" in raw:
        native["arenas"] = raw["arenas"]
    return native


# Without the background thread, jemalloc purges dirty pages on its own
# allocation events (arena_decay_ticks; 5.3's ticker_geom fires after a random
# number of them, 1,000 on average), and the print's output buffer is two.
# Once, 48 snapshots 0.5 s apart of an idle process purged a third of its dirty
# pages (tests/test_knob_effects.py).
DECAY_EVENTS = ("background_thread is off: jemalloc purges dirty pages on its own allocation "
                "events, and the print buffer's malloc and free are two of them (the decay "
                "ticker fires after ~1,000 on average): frequent snapshots of an idle process "
                "may purge its dirty pages sooner than it would alone")

# jemalloc >= 5.3 je_malloc_stats_print (src/jemalloc.c, src/buf_writer.c)
# allocates a STATS_PRINT_BUFSIZE output buffer from arena 0 as an internal
# allocation *before* stats_print refreshes the epoch, so the numbers it
# prints count that buffer: in large.allocated (so stats.allocated), in
# internal (so stats.metadata), and its extent of usize + sz_large_pad
# bytes in pactive (so stats.active).  Subtracted exactly here, so the
# document describes the program, not allocdiag's visit.
STATS_PRINT_BUFSIZE = 65536
BUFFERED_VERSIONS = ("5.3.",)


def _remove_print_buffer(values, parsed):
    version = values.get("version") or ""
    if not version.startswith(BUFFERED_VERSIONS):
        return []
    page = values.get("arenas.page")
    opt = parsed.get("opt") or {}
    oblivious = opt.get("cache_oblivious", (parsed.get("config") or {}).get("cache_oblivious"))
    if not page or oblivious is None:
        return ["malloc_stats_print held a 64 KiB output buffer while it read the stats; "
                "not subtracted (page size or cache_oblivious unknown)"]
    extent = STATS_PRINT_BUFSIZE + (page if oblivious else 0)      # sz_large_pad
    for name, amount in (("stats.allocated", STATS_PRINT_BUFSIZE),
                         ("stats.metadata", STATS_PRINT_BUFSIZE),
                         ("stats.active", extent),
                         ("stats.arenas.4096.pactive", extent // page),
                         ("stats.arenas.4096.large.allocated", STATS_PRINT_BUFSIZE),
                         ("stats.arenas.4096.internal", STATS_PRINT_BUFSIZE)):
        if isinstance(values.get(name), int) and values[name] >= amount:
            values[name] -= amount
    return [f"malloc_stats_print allocated a {STATS_PRINT_BUFSIZE}-byte output buffer in arena 0 "
            "and freed it; its bytes are subtracted from stats.allocated, stats.active, "
            "stats.metadata and pactive (exact); pdirty, resident and mapped may differ by up to "
            f"{extent} bytes from a moment without it"]


def normalise(native: dict[str, Any]) -> dict[str, Value]:
    return jemalloc_stats.normalise_jemalloc(
        {k: v for k, v in native["mallctl"].items() if v is not None})


def parse_file(data: bytes) -> dict[str, Any]:
    """A saved ``malloc_stats_print`` JSON report -> the native document."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    parsed = jemalloc_stats.parse_stats_json(text)
    values = jemalloc_stats.mallctls(parsed, [n for n, _, _, _ in MALLCTLS])
    threads = values.get("stats.background_thread.num_threads")
    if isinstance(threads, int):
        values["background_thread"] = threads > 0
    for name, _, _, _ in MALLCTLS:
        values.setdefault(name, None)
    return {"mallctl": values, "prefix": None, "side_effects": [],
            "gathered_by": "file: malloc_stats_print JSON"}


def looks_like(head: bytes) -> bool:
    """HEAD is jemalloc's stats JSON (malloc_stats_print opts 'J')."""
    return head.startswith(b"{") and b'"jemalloc"' in head
