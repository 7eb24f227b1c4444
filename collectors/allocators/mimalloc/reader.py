"""mimalloc: plan, gather, parse and normalise; the native fields.

Native document::

    {"stats": {...},                # collectors.allocators.mimalloc.stats: parse_stats_text
                                    # ("format": "text") or parse_stats_json ("json")
     "process_info": {...} | None,  # mi_process_info's eight out-parameters
     "options": {name: int} | None, # mi_option_get, names of the running version
     "stats_main": {...} | None,    # _mi_stats_main.reserved and .committed read
                                    # from memory (statsmain), when that replaced
                                    # mi_process_info
     "version": str | None}         # e.g. "2.0.9" (detection, or mi_version())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.model import Value

import struct

from collectors import lazylog
from collectors.allocators import checked
from collectors.allocators.mimalloc import optiontable, statsmain
from collectors.allocators.mimalloc.optiontable import OPTIONS_2_0
from collectors.allocators.mimalloc import stats as mimalloc_stats
from collectors.allocators import common
from collectors.engine.memory import MemoryReader
from diag.model.errors import AllocdiagError, Unsupported
from collectors.allocators.native import BYTES, COUNT, FLAG, MS, NativeField, RATIO, TEXT

log = lazylog.getLogger("collectors.allocators")

_ST = "mimalloc src/stats.c _mi_stats_print (mi_stats_print_out)"
_JS = "mimalloc src/stats.c mi_stats_get_json"
_PI = "mimalloc src/stats.c mi_process_info"
_WK = "collectors/allocators/mimalloc/segments.py (segment walk from memory)"
_SM = "collectors/allocators/mimalloc/statsmain.py (mimalloc 2.0 src/stats.c _mi_stats_main)"

# Rows of the text report (mimalloc 2.0.9 _mi_stats_print) and counts of
# the JSON one, with their unit: mi_stat_print's unit argument (1 = bytes,
# -1 = count).
STAT_ROWS = (
    ("reserved", BYTES, "address space reserved from the OS"),
    ("committed", BYTES, "bytes committed (upper bound of resident)"),
    ("reset", BYTES, "bytes reset (MADV_FREE/DONTNEED) while staying committed"),
    ("purged", BYTES, "bytes purged (2.1+)"),
    ("touched", BYTES, "bytes touched by the program"),
    ("normal", BYTES, "bytes in normal-size blocks (MI_STAT builds)"),
    ("huge", BYTES, "bytes in huge blocks (MI_STAT builds)"),
    ("large", BYTES, "bytes in large blocks (MI_STAT builds)"),
    ("total", BYTES, "bytes allocated by the program (MI_STAT builds)"),
    ("malloc_normal", BYTES, "bytes in normal-size blocks"),
    ("malloc_huge", BYTES, "bytes in huge blocks"),
    ("malloc_requested", BYTES, "bytes requested by the program"),
    ("page_committed", BYTES, "bytes committed in pages"),
    ("segments", COUNT, "segments"),
    ("segments-abandoned", COUNT, "abandoned segments"),
    ("segments-cached", COUNT, "cached segments"),
    ("pages", COUNT, "pages"),
    ("pages-abandoned", COUNT, "abandoned pages"),
    ("threads", COUNT, "threads"),
)
COUNTERS = (
    ("pages-extended", COUNT, "page extensions"),
    ("pages-noretire", COUNT, "pages not retired"),
    ("mmaps", COUNT, "mmap calls"),
    ("commits", COUNT, "commit calls"),
    ("reset", COUNT, "reset calls"),
    ("purges", COUNT, "purge calls"),
    ("searches", COUNT, "page searches"),
)
PROCESS_INFO = (
    ("elapsed_msecs", MS, "elapsed time"),
    ("user_msecs", MS, "user CPU time"),
    ("system_msecs", MS, "system CPU time"),
    ("current_rss", BYTES, "on Linux the committed-bytes counter, NOT the RSS"),
    ("peak_rss", BYTES, "getrusage ru_maxrss"),
    ("current_commit", BYTES, "bytes committed now"),
    ("peak_commit", BYTES, "peak bytes committed"),
    ("page_faults", COUNT, "major page faults"),
    ("current_rss_is_commit", FLAG, "current_rss is the commit counter (always true on Linux)"),
)
# mi_process_info's out-parameters, in order, are the parser's.
assert tuple(n for n, _, _ in PROCESS_INFO[:-1]) == mimalloc_stats.PROCESS_INFO_FIELDS

_AMOUNT = (("value", "the printed amount, as a number"), ("min", "smallest value the rounded "
           "print allows"), ("max", "largest value the rounded print allows"))

FIELDS = (
    NativeField("stats.format", TEXT, "text (mi_stats_print_out) or json (mi_stats_get_json)", "allocdiag"),
    NativeField("stats.columns.*", TEXT, "column names of the text report's header", _ST),
    NativeField("stats.tracks_allocations", FLAG, "program allocations are counted (MI_STAT builds)", _ST),
    NativeField("stats.searches_avg", RATIO, "average page searches", _ST),
    NativeField("stats.numa_nodes", COUNT, "NUMA nodes", _ST),
    NativeField("stats.elapsed_s", RATIO, "seconds since start", _ST),
    NativeField("stats.process.user_s", RATIO, "user CPU seconds", _ST),
    NativeField("stats.process.system_s", RATIO, "system CPU seconds", _ST),
    NativeField("stats.process.page_faults", COUNT, "major page faults", _ST),
    NativeField("stats.rows.?.?.text", TEXT, "the amount as printed", _ST),
    NativeField("stats.counters.?.text", TEXT, "the amount as printed", _ST),
    NativeField("stats.stat_version", COUNT, "JSON format version", _JS),
    NativeField("stats.mimalloc_version", COUNT, "mimalloc version (MI_MALLOC_VERSION)", _JS),
    NativeField("stats.process.?", COUNT, "process counters of the JSON report", _JS),
    NativeField("stats.counts.?.?", COUNT, "a count statistic", _JS),
    NativeField("stats.counters.?", COUNT, "a counter", _JS),
    NativeField("stats.malloc_bins", TEXT, "per-size-bin statistics (JSON, MI_STAT builds)", _JS),
    NativeField("stats.page_bins", TEXT, "per-size-bin page statistics (JSON)", _JS),
) + tuple(
    NativeField(f"stats.{bins}.*.{k}", u, f"{what}: {m}", _JS)
    for bins, what in (("malloc_bins", "blocks of one size bin"), ("page_bins", "pages of one size bin"))
    for k, u, m in (("total", COUNT, "total"), ("peak", COUNT, "peak"), ("current", COUNT, "current"),
                    ("block_size", BYTES, "block size of the bin"),
                    ("page_size", BYTES, "page size of the bin"))) + (
    NativeField("process_info", TEXT, "none when mi_process_info was not called", _PI),
    NativeField("stats_main", TEXT, "none unless the committed counter was read from memory", _SM),
) + tuple(NativeField(f"stats_main.{c}.{k}", BYTES, f"_mi_stats_main.{c}.{k}", _SM)
          for c in ("reserved", "committed") for k in statsmain.COUNT_FIELDS) + (
    NativeField("stats_main.address", TEXT, "where _mi_stats_main was read", _SM),
    NativeField("stats_main.found_by", TEXT, "the symbol, or the lea in mi_process_info's callee",
                _SM),
    NativeField("options", TEXT, "none when option names are not known for this version", "mi_option_get"),
    NativeField("options.?", COUNT, "an mi_option value (mi_option_get)",
                "mimalloc include/mimalloc.h mi_option_t"),
    NativeField("version", TEXT, "mimalloc version (mi_version() 209 = 2.0.9)", "mimalloc"),
    # Added by diag.snapshot from collectors.allocators.mimalloc.segments (no stop).
    NativeField("mimalloc_walk.ok", FLAG, "the out-of-process segment walk succeeded", _WK),
    NativeField("mimalloc_walk.reason", TEXT, "why there was no walk (build not pinned, ...)", _WK),
    NativeField("mimalloc_walk.build", TEXT, "the pinned mimalloc build walked", _WK),
    NativeField("mimalloc_walk.allocated", BYTES, "live blocks x block size, pending frees "
                "subtracted", _WK),
    NativeField("mimalloc_walk.active", BYTES, "capacity x block size of pages holding live "
                "blocks", _WK),
    NativeField("mimalloc_walk.segments", COUNT, "segments found", _WK),
    NativeField("mimalloc_walk.abandoned", COUNT, "segments without an owning thread", _WK),
    NativeField("mimalloc_walk.huge", COUNT, "huge segments", _WK),
    NativeField("mimalloc_walk.pages", COUNT, "pages walked", _WK),
    NativeField("mimalloc_walk.pending_thread_free", COUNT, "blocks pending on xthread_free", _WK),
    NativeField("mimalloc_walk.pending_delayed", COUNT, "blocks pending on thread_delayed_free",
                _WK),
    NativeField("mimalloc_walk.resident", BYTES, "present pages of the segments walked "
                "(/proc/PID/pagemap)", _WK),
    NativeField("mimalloc_walk.key_checked", FLAG, "segment cookies checked against "
                "_mi_heap_main's", _WK),
    NativeField("stats_error", TEXT, "why the stats text did not parse", "allocdiag"),
) + tuple(NativeField(f"stats.rows.{r}.?.{k}", u, f"{m}: {km}", _ST)
          for r, u, m in STAT_ROWS for k, km in _AMOUNT) + tuple(
    NativeField(f"stats.counters.{r}.{k}", u, f"{m}: {km}", _ST)
    for r, u, m in COUNTERS for k, km in _AMOUNT) + tuple(
    NativeField(f"stats.counts.{r}.{k}", u, f"{m} ({k})", _JS)
    for r, u, m in STAT_ROWS if u == BYTES for k in ("total", "peak", "current")) + tuple(
    NativeField("process_info." + n, u, m, _PI) for n, u, m in PROCESS_INFO) + tuple(
    NativeField(f"stats.process.{n}.{k}", BYTES, f"{m}: {km}", _ST)
    for n, m in (("peak_rss", "peak RSS (getrusage)"), ("peak_commit", "peak bytes committed"))
    for k, km in _AMOUNT) + tuple(
    NativeField(f"stats.process.{n}.text", TEXT, "the amount as printed", _ST)
    for n in ("peak_rss", "peak_commit")) + tuple(
    NativeField("stats.process." + n, BYTES, m, _JS)
    for n, m in (("rss_current", "RSS"), ("rss_peak", "peak RSS"),
                 ("commit_current", "bytes committed"), ("commit_peak", "peak bytes committed")))


# -- plan, gather, parse, normalise -------------------------------------------------



# Stack the gather's calls use below the engine's frame on the borrowed thread
# (collectors.engine.remote stack_need): the high-water mark measured by
# tests/targets/stack_need.c (pattern-filled 1 MiB stack, the larger of two calls,
# Debian 12 packages; tests/test_stack_bounds.py re-measures and checks it):
#   mi_stats_print_out(fputs, buffered fmemopen stream: stdio's malloc at the
#   first write included) 3,359 B, mi_process_info 1,671 B, mi_option_get 1,607 B,
#   fmemopen 3,303 B, fclose writing the buffer out and freeing it 512 B.
STACK_NEED = 6 * 1024
# Bytes of the stats text read first (2.0.9 prints ~3 KiB; later stops read
# what the last one printed, common.text_at).
STATS_READ_FIRST = 8 * 1024


# Where mimalloc's option table is not found (optiontable: another version or
# layout), the options are read with one mi_option_get call each (26 on 2.0),
# again only every OPTIONS_REFRESH_S within one allocdiag process (TUI,
# record, exporter) and across CLI runs; allocdiag's own `set` forgets them.
# A program's own mi_option_set shows within that time.
OPTIONS_REFRESH_S = 10.0
# process key -> [mi_option_get values], in memory and on disk (next CLI run)
_options = common.KeptValues(OPTIONS_REFRESH_S, part="mimalloc-options-1")
KEPT = (_options,)                     # common.before_stop / after_stop


def forget_options() -> None:
    _options.clear()


def option_names(version: Any) -> Any:
    return OPTIONS_2_0 if (version or "").startswith("2.0") else ()


def plan(res: Any, obj: Any, alloc: Any, opts: dict[str, Any]) -> dict[str, Any]:
    a = {n: res.address(obj, n) for n in ("mi_process_info", "mi_option_get", "mi_stats_get_json",
                                          "mi_free", "mi_stats_print_out")}
    if not (a["mi_stats_get_json"] or a["mi_stats_print_out"]):
        raise Unsupported("mimalloc: neither mi_stats_get_json nor mi_stats_print_out found")
    if a["mi_stats_print_out"]:
        a.update(common.libc_stdio(res))
    a["options"] = option_names(getattr(alloc, "version", None))
    a["process_key"] = res.process_key(obj)
    a["option_table"] = _option_table(res, obj, a["options"])
    a["stats_main"] = _stats_main(obj, getattr(alloc, "version", None)) \
        if a["mi_process_info"] else None
    log.debug("mimalloc: stats as %s, %d options%s",
              "JSON (mi_stats_get_json)" if a["mi_stats_get_json"] else "text (mi_stats_print_out)",
              len(a["options"] or ()),
              f", option table at {a['option_table']:#x}" if a["option_table"] else "")
    return a


def _option_table(res: Any, obj: Any, names: Any) -> int | None:
    """Where mimalloc's option table is (optiontable), found before any
    stop in the library's own mappings; None when not found (or not a
    live process: then the options are read with mi_option_get)."""
    image = getattr(res, "image", None)
    if not names or obj is None or image is None or not getattr(obj, "path", None):
        return None
    mappings = [(m.start, m.end, m.perms) for m in image.maps
                if m.path == obj.path and m.inode == obj.inode]
    try:
        with MemoryReader(image.pid, image.procfs.root) as mem:
            return optiontable.locate(mem.read, mappings, names)
    except AllocdiagError as exc:
        log.debug("mimalloc option table not read: %s", exc)
        return None


# Where _mi_stats_main lies, per library file (collectors.allocators.checked:
# in memory and in the detection cache).  The committed counter is read
# from memory only once a snapshot found it equal to what mi_process_info
# returned in the same stop; after STATS_MAIN_DISAGREE_MAX disagreements
# (another layout) the address is not tried again.
STATS_MAIN_PART = "mimalloc-stats-main-1"
STATS_MAIN_DISAGREE_MAX = 3
STATS_MAIN = checked.CheckedAddresses(STATS_MAIN_PART, STATS_MAIN_DISAGREE_MAX)
# what gathered_by says of one check
STATS_MAIN_CHECKED = {checked.SAME: "the same committed bytes (read from memory from now on)",
                      checked.DIFFERENT: "different (not used)",
                      checked.MOVED: "different, but the words moved meanwhile (checked again "
                                     "next time)"}


def _stats_main(obj: Any, version: Any) -> Any:
    """(runtime address of _mi_stats_main, facts key) for the library OBJ,
    or None: layout known for 2.0 only, symbol or code pattern not found,
    or refuted."""
    if not (version or "").startswith("2.0"):
        return None
    return STATS_MAIN.address(obj, _find_stats_main)


def _find_stats_main(obj: Any) -> tuple[int | None, str | None]:
    """(file virtual address of _mi_stats_main, how it was found)."""
    sym = obj.elf.lookup(statsmain.SYMBOL, obj.opener.open)
    if sym is not None and sym.defined:
        return sym.st_value, f"symbol {statsmain.SYMBOL}"
    return checked.find_in_code(
        obj, "mi_process_info",
        lambda code, entry, elf: statsmain.locate(code, entry, checked.in_load(elf, checked.PF_X),
                                                  checked.in_load(elf, checked.PF_W)),
        "lea in the function mi_process_info calls")


def prefetch(image: Any, a: Any) -> dict[str, Any]:
    """What the gather reads before the stop rather than inside it: the
    option table's entries, and _mi_stats_main's reserved and committed
    counts once its address was checked (before it is, the two words the
    check compares).  All of it is mimalloc's memory, which the other
    threads go on using during the stop anyway, so reading it inside bought
    no consistency; the table alone cost two reads and a parse there (~30 us
    of a new allocdiag process's stop, bench/pause.py --snapshots).  What is
    not read here the gather reads or calls for in the stop."""
    table = bool(a.get("option_table") and a["options"])
    committed = STATS_MAIN.checked(a.get("stats_main"))
    checking = bool(a.get("stats_main")) and not committed
    if image is None or not (table or committed or checking):
        return {}
    out: dict[str, Any] = {}
    try:
        with MemoryReader(image.pid, image.procfs.root) as mem:
            if table:
                n = len(a["options"])
                got = mem.read(a["option_table"], n * optiontable.DESC.size)
                if got:
                    out["option_entries"] = optiontable.values(got, n)
            if committed:
                words = statsmain.read_os_counts(mem.read, a["stats_main"][0])
                if words:
                    out["os_counts"] = words
            elif checking:
                # the words to be checked, before the stop too: a check whose
                # words moved meanwhile says nothing against the address
                got = mem.read(a["stats_main"][0] + statsmain.CHECKED_OFFSET,
                               statsmain.CHECKED.size)
                if got:
                    out["stats_main_before"] = statsmain.CHECKED.unpack(got)
    except AllocdiagError as exc:
        log.debug("mimalloc: memory not read before the stop: %s", exc)
    return out


def gather(c: Any, a: Any, opts: Any) -> Any:
    raw: dict[str, Any] = {}
    if a.get("os_counts") is not None and not opts.get("mimalloc_process_info"):
        # the committed counter was read before the stop (prefetch): no call
        raw["os_counts"] = a["os_counts"]
        raw["stats_main_at"] = a["stats_main"]
    elif a["mi_process_info"] and getattr(c, "max_args", 6) >= 8:
        # one zeroed block for the eight out-values: one write and one read
        # inside the stop instead of eight of each
        n = len(mimalloc_stats.PROCESS_INFO_FIELDS)
        block = c.scratch(8 * n)
        c.write(block, b"\0" * (8 * n))
        c.call(a["mi_process_info"], *(block + 8 * i for i in range(n)))
        sm = a.get("stats_main")
        if sm and not STATS_MAIN.checked(sm) and a.get("stats_main_before") is not None:
            # the check: the same two words, right after the call (only
            # where they could be read before the stop: no read inside it
            # that could fail)
            raw["stats_main_check"] = (sm, statsmain.CHECKED.unpack(
                c.read(sm[0] + statsmain.CHECKED_OFFSET, statsmain.CHECKED.size)),
                a.get("stats_main_before"))
        raw["process_info"] = list(struct.unpack(f"<{n}Q", c.read(block, 8 * n)))
    if a.get("option_table") and a["options"]:
        # one read of mimalloc's own table; an entry not yet initialised
        # (never seen in a running process) by its call
        n = len(a["options"])
        table = a.get("option_entries") or \
            optiontable.values(c.read(a["option_table"], n * optiontable.DESC.size), n)
        raw["options"] = [c.call(a["mi_option_get"], i) if init == optiontable.UNINIT
                          and a["mi_option_get"] else value & common.U64
                          for i, (value, init) in enumerate(table)]
        raw["options_from_table"] = True
    elif a["mi_option_get"] and a["options"]:
        raw["options"] = _options.get(a["process_key"])
        raw["options_cached"] = raw["options"] is not None
        if raw["options"] is None:
            raw["options"] = [c.call(a["mi_option_get"], i) for i in range(len(a["options"]))]
            _options.put(a["process_key"], raw["options"])
    if a["mi_stats_get_json"]:
        ptr = c.call(a["mi_stats_get_json"], 0, 0)
        if ptr:
            raw["stats_json"] = c.cstring(ptr, 1 << 20)
            if a["mi_free"]:
                c.call(a["mi_free"], ptr)
            return raw
    buf = c.buffer(common.SCRATCH_TEXT)     # outside the borrowed stack
    # A buffered stream (stdio's BUFSIZ buffer malloc'd by mimalloc, freed
    # by fclose): one call fewer than setvbuf, ~45 us of a new allocdiag
    # process's stop.  The text (~3 KiB on 2.0.9) reaches BUF at fclose.
    f = common.fmemopen(c, a, buf, common.SCRATCH_TEXT, buffered=True)
    c.call(a["mi_stats_print_out"], a["fputs"], f)
    c.call(a["fclose"], f)
    raw["stats_text"] = common.text_at(c, buf, common.SCRATCH_TEXT, first=STATS_READ_FIRST,
                                       seen=(a["process_key"], "mi_stats_print_out"))[0]
    return raw


def parse(raw: Any, alloc: Any) -> Any:
    version = getattr(alloc, "version", None)
    names = option_names(version)
    native: dict[str, Any] = {"stats": None, "process_info": None, "options": None, "version": version,
              "side_effects": [], "stats_main": None}
    check_note = ""
    if "process_info" in raw:
        native["process_info"] = pi = mimalloc_stats.process_info_dict(raw["process_info"])
        if "stats_main_check" in raw:
            (addr, mkey), words, before = raw["stats_main_check"]
            outcome = STATS_MAIN.judge(mkey, words, (pi["peak_commit"], pi["current_commit"]),
                                       before)
            check_note = (f"; _mi_stats_main at {addr:#x} checked against mi_process_info: "
                          + STATS_MAIN_CHECKED[outcome])
    if "os_counts" in raw:
        addr, mkey = raw["stats_main_at"]
        native["stats_main"] = {
            **statsmain.os_counts(raw["os_counts"]),
            "address": f"{addr:#x}",
            "found_by": STATS_MAIN.found_by(mkey)}
    if "options" in raw:
        native["options"] = {n: common.signed(v) for n, v in zip(names, raw["options"])}
    if "stats_json" in raw:
        native["stats"] = mimalloc_stats.parse_stats_json(raw["stats_json"].decode(errors="replace"))
        native["gathered_by"] = "mi_stats_get_json"
        native["side_effects"].append("mi_stats_get_json: mimalloc allocated the JSON text; "
                                      "freed with mi_free")
    elif "stats_text" in raw:
        native["gathered_by"] = "mi_stats_print_out(fputs, fmemopen stream)"
        native["side_effects"].append("fmemopen: one FILE and its stdio buffer (BUFSIZ) "
                                      "malloc'd and freed (by mimalloc)")
        try:
            native["stats"] = mimalloc_stats.parse_stats_text(raw["stats_text"].decode(errors="replace"))
        except AllocdiagError as exc:
            native["stats_error"] = str(exc)
    if native["stats_main"] and native.get("gathered_by"):
        native["gathered_by"] += ("; reserved and committed bytes read from _mi_stats_main "
                                  "before the stop (no mi_process_info call)")
    if native.get("gathered_by"):
        native["gathered_by"] += check_note
    if raw.get("options_from_table") and native.get("gathered_by"):
        native["gathered_by"] += "; options read from mimalloc's option table (no call)"
    if raw.get("options_cached") and native.get("gathered_by"):
        native["gathered_by"] += f"; options (mi_option_get) read < {OPTIONS_REFRESH_S:g} s ago"
    return native


def normalise(native: dict[str, Any]) -> dict[str, Value]:
    return mimalloc_stats.normalise_mimalloc(native.get("stats"), native.get("process_info"),
                                             native.get("stats_main"))


def parse_file(data: bytes) -> dict[str, Any]:
    """Saved ``mi_stats_print`` text (or ``mi_stats_get_json`` JSON) -> the
    native document."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    stats = (mimalloc_stats.parse_stats_json(text) if text.lstrip().startswith("{")
             else mimalloc_stats.parse_stats_text(text))
    return {"stats": stats, "process_info": None, "options": None, "version": None,
            "side_effects": [], "stats_main": None,
            "gathered_by": "file: mimalloc stats " + stats["format"]}


def looks_like(head: bytes) -> bool:
    """HEAD is mimalloc's stats text."""
    low = head.lower()
    return b"committed" in low and (b"reserved" in low or b"heap stats" in low)
