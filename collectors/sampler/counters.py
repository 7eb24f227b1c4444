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
from collectors.allocators.registry import for_kind
from diag.model.errors import AllocdiagError
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
        self.deadline_s = DEADLINE_S
        self.pause_us = []

    def read(self):
        out = {}
        threads = self._threads()
        if threads is not None:
            out["process.threads"] = (threads, "count", "gauge", "/proc/PID/status Threads")
        # the allocator's own counters (its home: collectors/allocators/<name>/home.py)
        out.update(for_kind(self.kind).counters(self))
        return out

    def native(self):
        """The allocator's native document, read once per read() with the
        snapshot reader (collectors.livestats)."""
        # mimalloc: its mi_process_info figures (page faults, CPU time) are
        # deltas of a window, so the call is made even where a snapshot
        # reads the committed counter from memory instead
        live = livestats.collect(self.image, self.det, deadline_s=self.deadline_s,
                                 mimalloc_process_info=True)
        self.pause_us.extend(live.pause_us or [])
        return live.native

    def resolver(self):
        """The symbol resolver the snapshot reader uses (collectors.livestats)."""
        return livestats.Resolver(self.image)

    def session(self, stack_need):
        """A borrowed-call session with the snapshot reader's timeouts."""
        return livestats.open_remote(self.image, self.det, stack_need=stack_need,
                                     deadline_s=self.deadline_s,
                                     call_timeout_s=livestats.CALL_TIMEOUT_S)

    def _threads(self):
        try:
            return int(self.procfs.status(self.pid).get(b"Threads", b"").strip() or 0) or None
        except (AllocdiagError, OSError, ValueError):
            return None


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
