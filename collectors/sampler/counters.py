"""The allocator's own counters at the two ends of a wall window (issue 20
item 4), read with the borrowed call (collectors.engine.remote: one thread stopped
for a few ms, never a sampling stop) and returned as diag.model.wall.Counter
deltas with provenance.

- jemalloc: collectors.allocators.jemalloc.counters (mutexes, purges,
  fills/flushes, nmalloc/ndalloc, arenas vs threads);
- glibc: no counters exist; the arena count from the malloc_info walk
  (collectors.livestats) against the thread count is the hint;
- gperftools: GetStats' layers (page heap, central, transfer, thread caches,
  spans, thread heaps) -- levels, it has no lock or traffic counter;
- mimalloc: the numbers of its stats output (process_info and the stats
  rows/counters when the build keeps them).
"""

import time

from collectors import livestats
from collectors.allocators import jemalloc
from collectors.allocators.jemalloc import counters as jemalloc_counters
from diag.model.errors import AllocdiagError, Unsupported
from collectors.binary.image import ProcessImage
from collectors.proc.procfs import ProcFS
from diag.model import wall

DEADLINE_S = 2.0


class Reader:
    """Reads one process's counters; ``read()`` -> {name: (value, unit,
    kind, source)} or raises AllocdiagError."""

    def __init__(self, pid, procfs="/proc"):
        from collectors.detect import detect
        self.pid = pid
        self.procfs = ProcFS(procfs)
        self.image = ProcessImage(pid, self.procfs)
        self.det = detect(self.image, all_bindings=True)
        self.kind = self.det.allocator.kind
        self.pause_us = []

    def read(self):
        out = {}
        threads = self._threads()
        if threads is not None:
            out["process.threads"] = (threads, "count", "gauge", "/proc/PID/status Threads")
        if self.kind == "jemalloc":
            out.update(self._jemalloc())
            return out
        live = livestats.collect(self.image, self.det, deadline_s=DEADLINE_S)
        self.pause_us.extend(live.pause_us or [])
        native = live.native
        if self.kind == "glibc":
            arenas = ((native.get("malloc_info") or {}).get("arenas"))
            if isinstance(arenas, list):
                out["glibc.arenas"] = (len(arenas), "count", "gauge", "malloc_info <heap nr=...>")
        elif self.kind in ("tcmalloc", "tcmalloc-google"):
            summary = ((native.get("getstats") or {}).get("summary")) or {}
            for k, v in summary.items():
                if isinstance(v, int) and not isinstance(v, bool):
                    unit = "count" if k in ("spans_in_use", "thread_heaps_in_use") else "bytes"
                    out[f"tcmalloc.{k}"] = (v, unit, "gauge", f"MallocExtension::GetStats {k}")
            for k, v in (native.get("properties") or {}).items():
                if isinstance(v, int) and k.endswith("_count"):
                    out[f"tcmalloc.{k}"] = (v, "count", "delta", f"GetNumericProperty {k}")
        elif self.kind == "mimalloc":
            for k, v in (native.get("process_info") or {}).items():
                if isinstance(v, int) and not isinstance(v, bool):
                    kind = "delta" if k in ("page_faults", "user_msecs", "system_msecs") \
                        else "gauge"
                    out[f"mimalloc.process_info.{k}"] = (v, "count", kind,
                                                         f"mi_process_info {k}")
            _flatten(out, "mimalloc.stats", (native.get("stats") or {}).get("counters"),
                     "delta", "mi_stats_print counters")
        return out

    def _threads(self):
        try:
            return int(self.procfs.status(self.pid).get(b"Threads", b"").strip() or 0) or None
        except (AllocdiagError, OSError, ValueError):
            return None

    def _jemalloc(self):
        res = livestats.Resolver(self.image)
        a = jemalloc.plan(res, self.det.serving, self.det.allocator, {})
        if not a.get("print"):
            raise Unsupported("this jemalloc build has no usable malloc_stats_print "
                              "(version other than 5.2/5.3)", pid=self.pid)
        # the same print call as the snapshot reader: its measured stack need,
        # the output buffer from Call.buffer (never the borrowed stack)
        rp = livestats.open_remote(self.image, self.det, stack_need=jemalloc.STACK_NEED,
                                   deadline_s=DEADLINE_S,
                                   call_timeout_s=livestats.CALL_TIMEOUT_S)
        with rp.borrow() as c:
            raw = jemalloc_counters.gather(c, a)
        self.pause_us.extend(rp.pause_us)
        return jemalloc_counters.parse(raw)


def _flatten(out, prefix, node, kind, source, depth=0):
    if not isinstance(node, dict) or depth > 3:
        return
    for k, v in node.items():
        if isinstance(v, dict):
            _flatten(out, f"{prefix}.{k}", v, kind, source, depth + 1)
        elif isinstance(v, int) and not isinstance(v, bool):
            out[f"{prefix}.{k}"] = (v, "count", kind, source)


def deltas(start, end, duration_s):
    """{name: diag.model.wall.Counter} from two reads (a name missing at one end
    has that end None)."""
    out = {}
    for name in sorted(set(start) | set(end)):
        s, e = start.get(name), end.get(name)
        ref = e or s
        out[name] = wall.Counter(name, s[0] if s else None, e[0] if e else None, duration_s,
                                 unit=ref[1], kind=ref[2], provenance="measured", source=ref[3])
    return out


def timed_read(reader):
    """(counters, None) or ({}, reason)."""
    t0 = time.monotonic()
    try:
        return reader.read(), None
    except (AllocdiagError, OSError) as exc:      # OSError: the process vanished mid-read
        return {}, f"{exc} ({time.monotonic() - t0:.2f} s)"
