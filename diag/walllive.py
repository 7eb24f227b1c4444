"""The exporter's opt-in wall figures (``allocdiag exporter --wall``): one
background thread samples the live targets' allocation wall, one target at
a time, a window of ``window_s`` every ``every_s`` per target, and keeps the
last Wall of each in a cache that a scrape only reads.

The windows are taken without the allocator's counters (diag.wallsample
``counters=False``): perf_event_open sampling stops no thread, so the wall
costs the targets none of the exporter's pause budget (``--max-pause-ms-per-
minute`` stays for the allocator reads of diag.hostlive).  It costs CPU:
the sampler's own (``window.reader_cpu_s``) and up to ~2% of a target's
throughput while its window runs (reference/cpu-wall.md "Target overhead"),
for window_s out of every every_s seconds.
"""

import threading
import time
from typing import Optional

from diag.model.records import record
from diag.model.errors import AllocdiagError, NoSuchProcess

WINDOW_S = 5.0          # reference/cpu-wall.md: 5-10 s windows at 99 Hz
EVERY_S = 60.0          # a target's window starts at most this often


@record
class WallEntry:
    """The last window of one target: ``wall`` (diag.model.wall.Wall) or ``error``."""

    pid: int
    at: float                       # monotonic time the window ended
    wall: object = None
    error: Optional[str] = None


def _default_sample(pid, seconds, stop):
    from diag import wallsample
    return wallsample.sample(pid, seconds, stop=stop, counters=False)


class WallLive:
    """Walls of the pids given to ``annotate``; ``start()`` runs the thread,
    ``step()`` takes the next due window in the caller's thread (one-shot
    modes), ``entry(pid)`` reads the cache."""

    def __init__(self, window_s=WINDOW_S, every_s=EVERY_S, sample=None):
        self.window_s, self.every_s = float(window_s), float(every_s)
        self.sample = sample or _default_sample
        self._lock = threading.Lock()
        self._pids = []
        self._cache = {}                    # pid -> WallEntry
        self._stop = threading.Event()
        self._thread = None

    def annotate(self, pids):
        """The targets now (the exporter's selection); forget the others."""
        with self._lock:
            self._pids = list(pids)
            for pid in list(self._cache):
                if pid not in self._pids:
                    del self._cache[pid]

    def entry(self, pid):
        with self._lock:
            return self._cache.get(pid)

    def next_due(self, now=None):
        """The target whose window is due the longest (never sampled first), or None."""
        now = time.monotonic() if now is None else now
        with self._lock:
            due = [(self._cache[p].at if p in self._cache else float("-inf"), p)
                   for p in self._pids
                   if p not in self._cache or now - self._cache[p].at >= self.every_s]
        return min(due)[1] if due else None

    def step(self):
        """Take the next due window.  Returns the pid sampled, or None."""
        pid = self.next_due()
        if pid is None:
            return None
        try:
            e = WallEntry(pid, 0.0, wall=self.sample(pid, self.window_s, self._stop.is_set))
        except NoSuchProcess as exc:
            e = WallEntry(pid, 0.0, error=f"vanished: {exc}")
        except AllocdiagError as exc:
            e = WallEntry(pid, 0.0, error=str(exc))
        e.at = time.monotonic()
        with self._lock:
            if pid in self._pids:
                self._cache[pid] = e
        return pid

    def step_all(self):
        """Every due target once (one-shot modes)."""
        seen = set()
        while True:
            pid = self.next_due()
            if pid is None or pid in seen or self._stop.is_set():
                return
            seen.add(pid)
            self.step()

    def start(self):
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="allocdiag-wall",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout=WINDOW_S + 2.0):
        """End the window in progress and the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self):
        while not self._stop.is_set():
            if self.step() is None:
                self._stop.wait(0.5)
