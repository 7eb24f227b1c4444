"""Findings: pure functions from a snapshot (or a series of them) to advice.

Every rule needs both a ratio and an absolute byte floor (Redis MEMORY
DOCTOR's lesson: no advice about a 3 MiB process).  Each finding carries its
evidence as numbers, the knob (current value and source, from diag.knobs)
with a suggested value and how to apply it, the bytes at stake, and a
confidence.  Rules never read /proc or call into a process.
"""

from collectors.allocators.registry import for_kind
from diag.knobs import knobs as knob_table
from diag.model import Finding, Knob

MiB = 1 << 20
FLOOR = 64 * MiB          # absolute floor for "worth an operator's time"


def _v(snap, name):
    v = snap.stats.get(name)
    return v.value if v is not None else None


def _knob(table, name, suggested, how=None):
    k = table.get(name) or Knob(name=name)
    return Knob(name=k.name, current=k.current, source=k.source, suggested=suggested,
                how=how or k.how)


def _held(snap):
    """What the allocator holds resident, or the stat that bounds it when
    that is unknown (glibc: arena system bytes + mmapped chunks, an upper bound)."""
    held = _v(snap, "resident")
    fallback = for_kind(snap.allocator.kind).vocabulary.held_fallback
    if held is None and fallback is not None:
        held = _v(snap, fallback)
    return held


def _pct(part, whole):
    return round(100.0 * part / whole, 1) if whole else None


def evaluate(snap, floor=FLOOR, table=None):
    """Findings for one snapshot, most bytes at stake first.  TABLE: the
    snapshot's knobs (diag.knobs.knobs), when its maker has them already."""
    kind = snap.allocator.kind
    if table is None:
        table = knob_table(kind, snap.native)
    own = tuple(ALLOCATOR_RULES[r] for r in for_kind(kind).vocabulary.findings if r in ALLOCATOR_RULES)
    out = []
    for rule in RULES_BEFORE + own + RULES_AFTER:
        f = rule(snap, table, floor)
        if f is not None:
            out.append(f)
    out.sort(key=lambda f: -(f.expected_effect_bytes or 0))
    return tuple(out)


# -- kernel layer -----------------------------------------------------------------

def lazyfree_rss(snap, table, floor):
    p, c = snap.process, snap.cgroup
    if not p.lazyfree or not p.rss or p.lazyfree < floor or p.lazyfree < 0.2 * p.rss:
        return None
    knob, cause = None, "an allocator or runtime that frees with MADV_FREE"
    advice = for_kind(snap.allocator.kind).vocabulary.lazyfree
    if advice is not None:
        if advice.knob is not None:
            knob = _knob(table, advice.knob, advice.suggested, advice.how)
        cause = advice.cause.format(current=knob.current if knob else None,
                                    source=knob.source if knob else None)
    ev = {"lazyfree": p.lazyfree, "rss": p.rss, "rss_anon": p.rss_anon,
          "lazyfree_pct_of_rss": _pct(p.lazyfree, p.rss)}
    panel = ""
    if c.usage is not None and c.working_set is not None:
        ev.update(cgroup_usage=c.usage, cgroup_working_set=c.working_set,
                  cgroup_inactive_file=c.inactive_file)
        panel = (f"; a cgroup working-set panel (usage - inactive_file) shows "
                 f"{_mib(c.working_set)} because lazy-free pages sit on the inactive list")
    return Finding(
        id="lazyfree-inflates-rss", severity="warning",
        title=f"{_mib(p.lazyfree)} of RSS is LazyFree: counted in RSS, but the kernel takes it back "
              f"under pressure without swapping{panel}",
        evidence={**ev, "cause": cause}, knob=knob, expected_effect_bytes=p.lazyfree,
        confidence="high")


def outside_allocator(snap, table, floor):
    """Anonymous memory the allocator does not account for: runtime heaps
    (pymalloc arenas, Go, JVM, V8), stacks, other mmaps."""
    p = snap.process
    held = _held(snap)
    if held is None or not p.rss_anon:
        return None
    # pymalloc arenas read by the runtime layer are accounted for: they have
    # their own rules (pymalloc-arena-fragmentation, preload-misses-pymalloc).
    py = _runtime_v(snap, "resident") or 0
    outside = p.rss_anon - (p.lazyfree or 0) - held - py
    if outside < floor or outside < 0.5 * p.rss_anon:
        return None
    return Finding(
        id="memory-outside-malloc", severity="info",
        title=f"{_mib(outside)} of anonymous RSS is not held by {snap.allocator.kind}: tuning malloc "
              "will not reduce it (runtime heaps such as pymalloc arenas, the JVM or V8 heap, "
              "thread stacks, direct mmaps)",
        evidence={"rss_anon": p.rss_anon, "allocator_resident": held, "lazyfree": p.lazyfree,
                  "pymalloc_resident": py or None, "outside": outside, "outside_pct_of_anon": _pct(outside, p.rss_anon)},
        expected_effect_bytes=0, confidence="medium")


# -- jemalloc -------------------------------------------------------------------------

def jemalloc_dirty(snap, table, floor):
    dirty, resident = _v(snap, "dirty"), _v(snap, "resident")
    if dirty is None or not resident or dirty < floor or dirty < 0.2 * resident:
        return None
    bg = table.get("background_thread")
    idle_note = ""
    # A finite decay returns pages only when decay runs: with background_thread
    # off that is on allocator activity, so an idle process keeps them
    # whatever dirty_decay_ms is (measured: 1000 returned nothing from an idle
    # burst, 0 all of it; with background_thread:true, 1000 did within 3 s --
    # tests/test_knob_effects.py).
    suggested, how = "1000", None
    if bg is not None and bg.current == "false":
        idle_note = (" With background_thread off, decay only runs when the program allocates: "
                     "an idle process never gives these pages back.")
        suggested = "0"
        how = ("dirty_decay_ms:0 at start (pages go back as freed), or background_thread:true "
               "with dirty_decay_ms:1000; `allocdiag release PID` now")
    return Finding(
        id="jemalloc-dirty-pages", severity="warning",
        title=f"jemalloc holds {_mib(dirty)} of dirty pages (free, still resident): "
              f"{_pct(dirty, resident)}% of its resident memory.{idle_note}",
        evidence={"dirty": dirty, "resident": resident, "active": _v(snap, "active"),
                  "dirty_pct_of_resident": _pct(dirty, resident),
                  "background_thread": bg.current if bg else None},
        knob=_knob(table, "dirty_decay_ms", suggested, how),
        expected_effect_bytes=dirty, confidence="high")


def jemalloc_background_thread(snap, table, floor):
    bg = table.get("background_thread")
    dirty, muzzy = _v(snap, "dirty") or 0, _v(snap, "muzzy") or 0
    if bg is None or bg.current != "false" or dirty + muzzy < floor:
        return None
    resident = _v(snap, "resident") or 0
    if dirty + muzzy < 0.1 * resident:
        return None
    return Finding(
        id="jemalloc-background-thread-off", severity="warning",
        title="jemalloc's background_thread is off: unused pages are only purged when the program "
              "calls into the allocator, so memory freed before an idle period stays resident",
        evidence={"dirty": dirty, "muzzy": muzzy, "resident": resident},
        knob=_knob(table, "background_thread", "true"),
        expected_effect_bytes=dirty + muzzy, confidence="high")


def jemalloc_muzzy(snap, table, floor):
    muzzy, resident = _v(snap, "muzzy"), _v(snap, "resident")
    if not muzzy or muzzy < floor or muzzy < 0.1 * (resident or 1):
        return None
    return Finding(
        id="jemalloc-muzzy-pages", severity="info",
        title=f"jemalloc has {_mib(muzzy)} of muzzy pages (MADV_FREE'd): they stay in RSS as "
              "LazyFree until the kernel needs memory",
        evidence={"muzzy": muzzy, "resident": resident, "lazyfree": snap.process.lazyfree},
        knob=_knob(table, "muzzy_decay_ms", "0"), expected_effect_bytes=muzzy, confidence="high")


def jemalloc_fragmentation(snap, table, floor):
    alloc, active = _v(snap, "allocated"), _v(snap, "active")
    if not alloc or not active or active - alloc < floor or active < 1.4 * alloc:
        return None
    return Finding(
        id="jemalloc-fragmentation", severity="warning",
        title=f"jemalloc fragmentation: {_mib(active - alloc)} of active pages hold no live data "
              f"(active/allocated = {active / alloc:.2f})",
        evidence={"allocated": alloc, "active": active, "ratio": round(active / alloc, 2)},
        # No value: no knob gives back pages that live objects pin (a
        # single-threaded program fragments the same with one arena).
        knob=_knob(table, "narenas", None,
                   "no setting returns pages pinned by live objects: allocate long-lived "
                   "objects together, or copy them out (Redis's activedefrag); fewer arenas "
                   "help only when threads spread one lifetime over many arenas"),
        expected_effect_bytes=active - alloc, confidence="medium")


def jemalloc_arenas(snap, table, floor):
    n = snap.native.get("mallctl", {}).get("arenas.narenas")
    threads = snap.process.threads
    held = (_v(snap, "dirty") or 0) + ((_v(snap, "active") or 0) - (_v(snap, "allocated") or 0))
    if not n or not threads or n <= 4 * threads or n < 16 or held < floor:
        return None
    return Finding(
        id="jemalloc-too-many-arenas", severity="info",
        title=f"{n} jemalloc arenas for {threads} threads: each arena keeps its own free pages",
        evidence={"narenas": n, "threads": threads, "held_free": held},
        knob=_knob(table, "narenas", str(max(1, 2 * threads))),
        expected_effect_bytes=None, confidence="low")


# -- glibc -----------------------------------------------------------------------------

def _glibc_arenas(snap):
    return (snap.native.get("malloc_info") or {}).get("arenas") or []


def glibc_trimmable(snap, table, floor):
    free, mapped, alloc = _v(snap, "dirty"), _v(snap, "mapped"), _v(snap, "allocated")
    if free is None or not mapped or free < floor or free < 0.25 * mapped:
        return None
    # glibc's free-chunk bookkeeping does not change when malloc_trim
    # madvises pages away (JDK-8286198 notes the same): only what is still
    # resident can be given back, i.e. at most rss_anon - allocated.
    anon = snap.process.rss_anon
    resident_free = min(free, max(0, anon - (alloc or 0))) if anon is not None else free
    if resident_free < floor:
        return None
    return Finding(
        id="glibc-free-held", severity="warning",
        title=f"glibc holds {_mib(free)} of free memory in its arenas ({_pct(free, mapped)}% of "
              f"what it maps), up to {_mib(resident_free)} of it resident; malloc_trim(0) returns "
              "the free pages inside the heap, not only the top",
        evidence={"free_in_arenas": free, "mapped": mapped, "allocated": alloc,
                  "rss_anon": anon, "resident_free_upper_bound": resident_free,
                  "arenas": len(_glibc_arenas(snap)) or None},
        # No value: trim_threshold only trims the top, and this memory is in
        # the bins; malloc_trim(0) returns it (tests/test_findings.py
        # test_glibc_held_memory_and_release measures it).
        knob=_knob(table, "trim_threshold", None,
                   "malloc_trim(0), now or periodically: `allocdiag release PID` calls it and "
                   "prints RSS before/after; the trim threshold only gives back the top of "
                   "the heap, not free chunks inside it"),
        expected_effect_bytes=resident_free, confidence="medium")


def glibc_arena_sprawl(snap, table, floor):
    arenas = _glibc_arenas(snap)
    if len(arenas) < 8:
        return None
    non_main = [a for a in arenas[1:]]
    held = sum((a.get("system") or {}).get("current", 0) for a in non_main)
    free = sum(a.get("free_bytes", 0) for a in non_main)
    if held < floor:
        return None
    return Finding(
        id="glibc-arena-sprawl", severity="warning",
        title=f"{len(arenas)} glibc arenas hold {_mib(held)} outside the main arena "
              f"({_mib(free)} of it free): each thread-contended arena keeps its own heap",
        evidence={"arenas": len(arenas), "non_main_system": held, "non_main_free": free,
                  "threads": snap.process.threads},
        # Measured (arena_sprawl, 32 threads, 2 CPUs): arena_max=2 took the
        # free bytes in arenas from 28 to 12 MiB (tests/test_knob_effects.py).
        # Sharing arenas lets threads reuse each other's free chunks, but the
        # arenas left keep free chunks of their own: measured, 49-64% of the
        # non-main free bytes came back, so half of them is what is at stake.
        knob=_knob(table, "arena_max", "2",
                   "GLIBC_TUNABLES=glibc.malloc.arena_max=2 (or MALLOC_ARENA_MAX=2) at start; "
                   "raise it towards 4 x CPUs if threads then contend on malloc's locks"),
        expected_effect_bytes=free // 2, confidence="medium")


def glibc_top_not_trimmed(snap, table, floor):
    keep = (snap.native.get("mallinfo2") or {}).get("keepcost")
    if not keep or keep < floor:
        return None
    tt = table.get("trim_threshold")
    why = (f"trim_threshold is {tt.current} ({tt.source})" if tt is not None and
           tt.source != "compiled default" else
           "glibc's dynamic trim threshold rose after large mmapped chunks were freed "
           "(it becomes 2 x mmap_threshold)")
    return Finding(
        id="glibc-top-chunk", severity="info",
        title=f"{_mib(keep)} at the top of the main heap is free but not trimmed: {why}",
        evidence={"keepcost": keep},
        knob=_knob(table, "trim_threshold", "16777216",
                   "GLIBC_TUNABLES=glibc.malloc.trim_threshold=16777216 at start: free's "
                   "systrim then gives back a top above 16 MiB (fixes both thresholds: the mmap "
                   "threshold then stays at its default unless set too); `allocdiag release "
                   "PID` (malloc_trim) gives it back now"),
        expected_effect_bytes=keep, confidence="medium")


# -- tcmalloc ----------------------------------------------------------------------------

def tcmalloc_pageheap(snap, table, floor):
    free, resident = _v(snap, "dirty"), _v(snap, "resident")
    if free is None or not resident or free < floor or free < 0.2 * resident:
        return None
    return Finding(
        id="tcmalloc-pageheap-free", severity="warning",
        title=f"tcmalloc's page heap holds {_mib(free)} free and still mapped "
              f"({_pct(free, resident)}% of its resident memory)",
        evidence={"pageheap_free": free, "resident": resident, "retained": _v(snap, "retained")},
        # Not TCMALLOC_RELEASE_RATE: gperftools paces releases by it only
        # while spans are being freed (page_heap.cc IncrementalScavenge, run
        # from PageHeap::Delete), so an idle process returns nothing whatever
        # the rate.  Aggressive decommit releases each span as it is freed
        # (MergeIntoFreeList -> DecommitSpan): measured with burst.c, 248 MiB
        # of page-heap free became 0 (tests/test_knob_effects.py).
        knob=_knob(table, "TCMALLOC_AGGRESSIVE_DECOMMIT", "true",
                   "TCMALLOC_AGGRESSIVE_DECOMMIT=true at start: freed spans go back to the OS "
                   "as they are freed, so an idle process keeps none (more page faults when it "
                   "allocates again); `allocdiag set PID aggressive_memory_decommit=1` does the "
                   "same for frees from then on; `allocdiag release PID` "
                   "(MallocExtension_ReleaseFreeMemory) returns what is free now"),
        expected_effect_bytes=free, confidence="high")


def tcmalloc_thread_caches(snap, table, floor):
    props = snap.native.get("properties") or {}
    tc = props.get("tcmalloc.thread_cache_free_bytes")
    resident = _v(snap, "resident")
    if not tc or not resident or tc < floor or tc < 0.1 * resident:
        return None
    limit = max(tc // 4, 16 * MiB)
    return Finding(
        id="tcmalloc-thread-caches", severity="info",
        title=f"{_mib(tc)} sits in tcmalloc's per-thread caches",
        evidence={"thread_cache_free": tc, "resident": resident,
                  "max_total_thread_cache_bytes": props.get("tcmalloc.max_total_thread_cache_bytes")},
        knob=_knob(table, "TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES", str(limit)),
        # Half of what is above the limit: caches do not shrink exactly to
        # it (per-thread minimums), and part of what leaves them stays in
        # the central cache (measured, 32 threads: thread caches 78 -> 43
        # MiB, active -29 MiB, RSS -24 MiB for 59 MiB above the limit).
        expected_effect_bytes=(tc - limit) // 2, confidence="medium")


# -- mimalloc ------------------------------------------------------------------------------

def mimalloc_held(snap, table, floor):
    committed = _v(snap, "committed")
    anon = snap.process.rss_anon
    if not committed or not anon or committed < floor or committed < 0.5 * anon:
        return None
    dd = table.get("decommit_delay")
    if dd is None or dd.current in (None, "0"):
        return None
    live = _v(snap, "allocated")
    live_text = ("a release build cannot say how much of it is live (`allocdiag release` runs "
                 "mi_collect(true) to find out)") if live is None else \
        f"{_mib(live)} of it is live (segment walk)"
    return Finding(
        id="mimalloc-decommit-delay", severity="info",
        title=f"mimalloc keeps {_mib(committed)} committed. It decommits freed memory only after "
              f"decommit_delay={dd.current} ms ({dd.source}) and only when the program calls into "
              f"mimalloc again, so an idle process keeps what it freed; {live_text}",
        evidence={"committed": committed, "rss_anon": anon, "allocated": live},
        knob=_knob(table, "decommit_delay", "0"), expected_effect_bytes=None, confidence="low")


# -- CPython pymalloc (the runtime layer) ------------------------------------------------------

def _runtime_v(snap, name):
    rt = snap.runtime
    if rt is None or rt.kind != "cpython-pymalloc":
        return None
    v = rt.values.get(name)
    return v.value if v is not None else None


def _pythonmalloc_knob(snap, suggested, how):
    env = ((snap.native or {}).get("config") or {}).get("env") or {}
    cur = env.get("PYTHONMALLOC")
    return Knob(name="PYTHONMALLOC", current=cur, source="env PYTHONMALLOC" if cur else "default (pymalloc)",
                suggested=suggested, how=how)


def pymalloc_fragmentation(snap, table, floor):
    """pymalloc gives an arena back to the OS only when every pool in it is
    empty: a few long-lived objects pin whole 1 MiB arenas."""
    res = _runtime_v(snap, "resident")
    alloc = _runtime_v(snap, "allocated")
    if res is None or alloc is None:
        return None
    idle = res - alloc
    if idle < floor or idle < 0.5 * res:
        return None
    ev = {"arenas": _runtime_v(snap, "arenas"), "arenas_highwater": _runtime_v(snap, "arenas_highwater"),
          "resident": res, "allocated": alloc, "free_in_pools": _runtime_v(snap, "free_in_pools"),
          "unused_pools": _runtime_v(snap, "unused_pools"), "idle_pct_of_resident": _pct(idle, res)}
    return Finding(
        id="pymalloc-arena-fragmentation", severity="warning",
        title=f"Python's arenas hold {_mib(res)} resident but only {_mib(alloc)} of live small objects: "
              f"pymalloc returns an arena to the OS only when all its pools are empty, so a few "
              f"long-lived objects keep whole arenas; no malloc knob reaches this memory",
        evidence=ev,
        knob=_pythonmalloc_knob(
            snap, None, "allocate long-lived objects early or together (gc.freeze() after start-up), "
                        "recycle workers (max_requests), or run with PYTHONMALLOC=malloc so small "
                        "objects go to the malloc you can tune"),
        expected_effect_bytes=idle, confidence="high")


def preload_misses_pymalloc(snap, table, floor):
    """LD_PRELOAD swaps malloc, but CPython's small objects never reach it."""
    if not snap.preload.requested or snap.preload.effective is False:
        return None
    res = _runtime_v(snap, "resident")
    if res is None or res < floor:
        return None
    held = _held(snap)
    base = held if held is not None else (snap.process.rss_anon or 0) - res
    if res <= base:
        return None
    return Finding(
        id="preload-misses-pymalloc", severity="warning",
        title=f"the allocator you preloaded ({snap.allocator.kind}) does not serve most of this "
              f"process's memory: {_mib(res)} is in Python's own pymalloc arenas, mmapped by the "
              f"interpreter, against {_mib(base)} held by {snap.allocator.kind}",
        evidence={"pymalloc_resident": res, "allocator_resident": held,
                  "rss_anon": snap.process.rss_anon, "requested": list(snap.preload.requested)},
        knob=_pythonmalloc_knob(
            snap, "malloc", "PYTHONMALLOC=malloc sends objects <= 512 B to malloc too (slower "
                            "small allocations; measure before and after)"),
        expected_effect_bytes=None, confidence="high")


# -- configuration ---------------------------------------------------------------------------

def preload_not_in_effect(snap, table, floor):
    p = snap.preload
    if p.effective is not False:
        return None
    return Finding(
        id="preload-not-in-effect", severity="critical" if p.requested else "warning",
        title=f"LD_PRELOAD {p.verdict}",
        evidence={"requested": list(p.requested), "reasons": list(p.reasons),
                  "serving": snap.allocator.kind},
        knob=Knob(name="LD_PRELOAD", current=":".join(p.requested) or None,
                  source="env LD_PRELOAD" if p.requested else None,
                  how="fix what the reasons name, restart the process, and re-run `allocdiag "
                      "preload PID`"),
        confidence="high")


def two_allocators(snap, table, floor):
    others = [o for o in snap.allocator.others
              if not for_kind(o.kind).vocabulary.always_loaded or o.prefix]
    # a prefixed build (jemalloc's) serves only its own callers
    interesting = [o for o in snap.allocator.others if o.prefix or o.linkage == "dlopen"]
    if not interesting:
        return None
    o = interesting[0]
    return Finding(
        id="two-allocators", severity="info",
        title=f"two allocators serve this process: malloc goes to {snap.allocator.kind}, while "
              f"{o.kind}{' (prefix ' + o.prefix + ')' if o.prefix else ''} serves "
              f"{'its own callers' if o.prefix else 'nothing (loaded by dlopen)'}",
        evidence={"serving": snap.allocator.kind,
                  "others": [{"kind": x.kind, "prefix": x.prefix, "linkage": x.linkage, "path": x.path}
                             for x in others or interesting]},
        knob=_knob(table, "MALLOC_CONF", None,
                   f"configure the prefixed one with {(o.prefix or '').upper()}MALLOC_CONF") if o.prefix else None,
        confidence="high")


RULES_BEFORE = (lazyfree_rss, outside_allocator)
# The rules of one allocator, by the id of the finding each gives: the
# allocator's vocabulary (collectors/allocators/<name>/home.py) lists the
# ones that apply to it, in the order they run.
ALLOCATOR_RULES = {
    "jemalloc-dirty-pages": jemalloc_dirty,
    "jemalloc-background-thread-off": jemalloc_background_thread,
    "jemalloc-muzzy-pages": jemalloc_muzzy,
    "jemalloc-fragmentation": jemalloc_fragmentation,
    "jemalloc-too-many-arenas": jemalloc_arenas,
    "glibc-free-held": glibc_trimmable,
    "glibc-arena-sprawl": glibc_arena_sprawl,
    "glibc-top-chunk": glibc_top_not_trimmed,
    "tcmalloc-pageheap-free": tcmalloc_pageheap,
    "tcmalloc-thread-caches": tcmalloc_thread_caches,
    "mimalloc-decommit-delay": mimalloc_held,
}
RULES_AFTER = (pymalloc_fragmentation, preload_misses_pymalloc, preload_not_in_effect,
               two_allocators)
RULES = RULES_BEFORE + tuple(ALLOCATOR_RULES.values()) + RULES_AFTER


# -- trends over a series of snapshots --------------------------------------------------------

def trends(series, floor=FLOOR, min_samples=5):
    """Findings over a watch window (snapshots of one process, oldest first):
    steady growth of allocated (leak suspect), resident ratcheting while
    allocated is flat (fragmentation staircase), resident held near its
    peak after allocated fell (peak retention)."""
    pts = [(s.taken_at, _v(s, "allocated"), _v(s, "resident") or s.process.rss_anon)
           for s in series if _v(s, "allocated") is not None]
    if len(pts) < min_samples:
        return ()
    out = []
    allocs = [a for _, a, _ in pts]
    res = [r for _, _, r in pts if r is not None]
    span = pts[-1][0] - pts[0][0] if pts[-1][0] and pts[0][0] else None
    grew = allocs[-1] - allocs[0]
    rises = sum(1 for a, b in zip(allocs, allocs[1:]) if b > a)
    if grew >= floor and grew >= 0.2 * max(allocs[0], 1) and rises >= 0.8 * (len(allocs) - 1):
        out.append(Finding(
            id="trend-leak-suspect", severity="warning",
            title=f"allocated grew by {_mib(grew)} over {len(pts)} samples and rose in "
                  f"{rises} of {len(pts) - 1} intervals: a leak suspect",
            evidence={"allocated_first": allocs[0], "allocated_last": allocs[-1], "samples": len(pts),
                      "seconds": span},
            expected_effect_bytes=grew, confidence="medium"))
    if len(res) == len(pts):
        r_grew = res[-1] - res[0]
        ratchets = sum(1 for a, b in zip(res, res[1:]) if b > a)
        falls = sum(1 for a, b in zip(res, res[1:]) if b < a)
        flat = abs(grew) < 0.1 * max(allocs[0], 1) + floor / 4
        if r_grew >= floor and flat and ratchets >= 2 and falls <= ratchets // 3:
            out.append(Finding(
                id="trend-fragmentation-staircase", severity="warning",
                title=f"resident rose by {_mib(r_grew)} in steps while allocated stayed flat: "
                      "a fragmentation staircase",
                evidence={"resident_first": res[0], "resident_last": res[-1],
                          "allocated_first": allocs[0], "allocated_last": allocs[-1],
                          "steps_up": ratchets, "samples": len(pts)},
                expected_effect_bytes=r_grew, confidence="medium"))
        peak_a = max(allocs)
        if peak_a - allocs[-1] >= floor and res[-1] >= 0.9 * max(res) and \
                allocs[-1] < 0.6 * peak_a:
            out.append(Finding(
                id="trend-peak-retention", severity="info",
                title=f"allocated fell {_mib(peak_a - allocs[-1])} from its peak but resident "
                      "stays near its peak: memory freed after the peak was not returned",
                evidence={"allocated_peak": peak_a, "allocated_last": allocs[-1],
                          "resident_peak": max(res), "resident_last": res[-1]},
                expected_effect_bytes=res[-1] - allocs[-1], confidence="medium"))
    return tuple(out)


def _mib(n):
    return f"{n / MiB:.1f} MiB"
