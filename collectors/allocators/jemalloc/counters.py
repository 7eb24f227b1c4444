"""jemalloc's own contention and traffic counters for the allocation wall
(issue 20 item 4): the ``mutexes`` sections and the merged arena's traffic
that the snapshot reader (collectors.allocators.jemalloc.reader, options
"Jdablxeh") leaves out.

One ``malloc_stats_print(strcat, buf, PRINT_OPTS)`` on the borrowed thread
(the same call, stack need and output buffer as the snapshot reader) plus one
``mallctl("arenas.narenas")``.  PRINT_OPTS (src/stats.c, 5.2/5.3): J JSON;
g no general section; d no destroyed arenas; a no per-arena sections (the
merged arena stays: "m" not given); b no bins; l no large classes; e no
extents; h no HPA -- and no "x", so ``stats.mutexes.<m>`` (ctl,
background_thread, prof...) and ``stats.arenas.merged.mutexes.<m>`` (large,
extent_avail, extents_dirty, decay_dirty, base, tcache_list...) are printed:
``num_ops, num_wait, num_spin_acq, num_owner_switch, total_wait_time,
max_wait_time`` (u64, times in ns on a coarse clock: multiples of ~4 ms
measured) and ``max_num_thds`` (u32).  Per-arena mutexes would make the
output grow with the number of arenas; the merged view sums them.

Measured output with these options: 3.7 KiB (jemalloc 5.3.0, Debian).

jemalloc 5.3.0's JSON mutex objects are shifted (src/stats.c
mutex_stats_emit: the column index advances only for non-derived counters
while mutex_stats_read_* stored the derived ``*_ps`` rates in between), so
there the keys hold, in order: num_ops, num_ops_ps, num_wait, num_wait_ps,
num_spin_acq, num_spin_acq_ps, max_num_thds.  Measured: "num_wait" equal to
"num_ops" for a process up less than a second (rate_per_second returns the
value then).  For SHIFTED_VERSIONS the real fields are taken from their
shifted keys and the wait times, which the JSON lost, are read with one
mallctl per mutex (``...mutexes.<m>.total_wait_time`` and ``max_wait_time``)
for the mutexes that were ever waited on: src/mutex.c
malloc_mutex_lock_slow adds to tot_wait_time and raises max_wait_time only
on the path that also counts n_wait_times, and malloc_mutex_prof_merge sums
and maxes them the same way, so a mutex whose num_wait is 0 has both at 0
(its two mallctls would return 0).  Usually a few mutexes of ~20 were waited
on: 2 calls each instead of 40 in the stop.  The version comes from
detection (the .rodata banner); mallctl("version") only without it.
"""

from __future__ import annotations

from typing import Any

import json

from collectors.allocators.jemalloc.reader import mallctl_read, mallctl_scratch, print_stats
from diag.model.errors import MalformedData, RemoteCallError

PRINT_OPTS = b"Jgdableh"
# Bound of the output: every value goes through emitter.h's 256-byte buffer;
# keys: stats (<= 16) + global mutexes (<= 12 x 7) + merged arena (<= 40 plain
# + small/large 2 x 6 + <= 16 mutexes x 7), at most 4 string values (dss).
_KEYS = 16 + 12 * 7 + 40 + 12 + 16 * 7
_BOUND = _KEYS * (48 + 21) + 4 * 257 + 1024
BUF = 32 * 1024
assert BUF > _BOUND

MUTEX_FIELDS = {"num_ops": "count", "num_wait": "count", "num_spin_acq": "count",
                "num_owner_switch": "count", "total_wait_time": "ns", "max_wait_time": "ns",
                "max_num_thds": "count"}
# max_* are high-water marks, not counts: shown as levels
_LEVELS = ("max_wait_time", "max_num_thds")
ARENA_COUNTS = ("dirty_npurge", "dirty_nmadvise", "dirty_purged", "muzzy_npurge",
                "muzzy_nmadvise", "muzzy_purged")
CLASS_COUNTS = ("nmalloc", "ndalloc", "nrequests", "nfills", "nflushes")
PAGES_COUNTS = ("dirty_purged", "muzzy_purged")
_SRC = "malloc_stats_print(\"%s\")" % PRINT_OPTS.decode()


def gather(c: Any, a: Any) -> Any:
    """Run on the borrowed thread C with A from jemalloc.plan: the JSON text
    and arenas.narenas."""
    if not a.get("print") or not a.get("strcat"):
        raise RemoteCallError("jemalloc counters need malloc_stats_print and strcat")
    text = print_stats(c, a, PRINT_OPTS, BUF)
    scratch = mallctl_scratch(c)
    narenas = mallctl_read(c, a["mallctl"], "arenas.narenas", "unsigned", scratch)
    version = a.get("version") or \
        mallctl_read(c, a["mallctl"], "version", "const char*", scratch)
    version = version.decode(errors="replace") if isinstance(version, bytes) else version
    raw = {"json": text, "narenas": narenas, "version": version, "mallctl": {}}
    if (version or "").startswith(SHIFTED_VERSIONS):
        for prefix, waits in _mutex_waits(text):
            for m, num_wait in waits.items():
                for f in _LOST_IN_JSON:
                    name = f"{prefix}.{m}.{f}"
                    # never waited on: its wait times are 0 (see above)
                    raw["mallctl"][name] = mallctl_read(
                        c, a["mallctl"], name, "uint64", scratch) if num_wait != 0 else 0
    return raw


SHIFTED_VERSIONS = ("5.3.0",)
# the shifted JSON's key -> the counter it really holds (5.3.0)
_SHIFT = {"num_ops": "num_ops", "num_spin_acq": "num_wait", "total_wait_time": "num_spin_acq",
          "max_num_thds": "max_num_thds"}
_LOST_IN_JSON = ("total_wait_time", "max_wait_time")


_NUM_WAIT_KEY = next(key for key, real in _SHIFT.items() if real == "num_wait")


def _mutex_waits(text):
    """[(mallctl prefix, {mutex name: its real num_wait, None if unreadable})]
    of the printed (shifted) JSON."""
    try:
        doc = json.loads(text)["jemalloc"]
    except (ValueError, KeyError, TypeError):
        return []
    merged = (doc.get("stats.arenas") or {}).get("merged") or {}

    def waits(mutexes):
        return {m: (f.get(_NUM_WAIT_KEY) if isinstance(f, dict) and
                    isinstance(f.get(_NUM_WAIT_KEY), int) else None)
                for m, f in (mutexes or {}).items()}
    return [("stats.mutexes", waits((doc.get("stats") or {}).get("mutexes"))),
            ("stats.arenas.4096.mutexes", waits(merged.get("mutexes")))]


def parse(raw: Any) -> Any:
    """{counter name: (value, unit, kind, source)} from gather's output.
    Names: ``jemalloc.mutexes.<m>.<field>``, ``jemalloc.arenas.mutexes.<m>.<field>``
    (all arenas merged), ``jemalloc.arenas.<counter>``,
    ``jemalloc.arenas.{small,large}.<counter>``, ``jemalloc.nmalloc`` /
    ``jemalloc.ndalloc`` (small + large), ``jemalloc.narenas``,
    ``jemalloc.arenas.nthreads``."""
    text = raw["json"]
    try:
        doc = json.loads(text)["jemalloc"]
    except (ValueError, KeyError, TypeError) as exc:
        raise MalformedData(f"jemalloc counters: malloc_stats_print JSON unusable ({exc})") \
            from None
    out: dict[str, Any] = {}
    stats = doc.get("stats") or {}
    shifted = (raw.get("version") or "").startswith(SHIFTED_VERSIONS)
    merged = (doc.get("stats.arenas") or {}).get("merged") or {}
    for name, source, mutexes in (("jemalloc.mutexes", "stats.mutexes", stats.get("mutexes")),
                                  ("jemalloc.arenas.mutexes", "stats.arenas.4096.mutexes",
                                   merged.get("mutexes"))):
        for m, fields in (mutexes or {}).items():
            if shifted and isinstance(fields, dict):
                fields = {real: fields.get(key) for key, real in _SHIFT.items()}
                for f in _LOST_IN_JSON:
                    fields[f] = raw.get("mallctl", {}).get(f"{source}.{m}.{f}")
            _mutex(out, f"{name}.{m}", f"{source}.{m}", fields)
    for k in ARENA_COUNTS:
        if isinstance(merged.get(k), int):
            out[f"jemalloc.arenas.{k}"] = (merged[k], "pages" if k in PAGES_COUNTS else "count",
                                           "delta", f"stats.arenas.4096.{k}")
    total: dict[str, Any] = {}
    for cls in ("small", "large"):
        for k in CLASS_COUNTS:
            v = (merged.get(cls) or {}).get(k)
            if isinstance(v, int):
                out[f"jemalloc.arenas.{cls}.{k}"] = (v, "count", "delta",
                                                     f"stats.arenas.4096.{cls}.{k}")
                total[k] = total.get(k, 0) + v
    for k in ("nmalloc", "ndalloc"):
        if k in total:
            out[f"jemalloc.{k}"] = (total[k], "count", "delta",
                                    f"stats.arenas.4096.small.{k} + large.{k}")
    if isinstance(merged.get("nthreads"), int):
        out["jemalloc.arenas.nthreads"] = (merged["nthreads"], "count", "gauge",
                                           "stats.arenas.4096.nthreads")
    if isinstance(raw.get("narenas"), int):
        out["jemalloc.narenas"] = (raw["narenas"], "count", "gauge", "arenas.narenas")
    return out


def _mutex(out, name, source, fields):
    for f, unit in MUTEX_FIELDS.items():
        v = fields.get(f) if isinstance(fields, dict) else None
        if isinstance(v, int):
            out[f"{name}.{f}"] = (v, unit, "gauge" if f in _LEVELS else "delta", f"{source}.{f}")
