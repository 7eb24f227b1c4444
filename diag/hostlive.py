"""The host view's live column: allocator resident bytes and the top finding
of the processes whose allocator can be read, filled in the background.

The host table is built from /proc alone (``diag.hostscan``: nothing is
stopped).  ``HostLive`` adds, per process, what only the allocator knows --
``resident`` and the top finding of a full snapshot (``diag.snapshot.take``
with ``attach=True``: one borrowed idle thread) -- without ever making the
table wait:

* ``annotate(rows)`` only reads a cache (under a lock held for dict
  operations) and records which processes the table shows; it never stops
  anything and never waits for a stop.
* one daemon thread takes the snapshots: at most one every ``min_gap_s``,
  within ``max_pause_ms_per_minute`` of target stop time in all (a token
  bucket), each process refreshed every ``refresh_s``; a process that could
  not be read is marked "not read" with the reason and tried again only
  after ``retry_s`` (not in a loop).
* entries are keyed by pid and start time, so a recycled pid starts afresh.

Wiring (the host screen, one call): pass each scan's row dicts through
``annotate`` before they become table rows; rows gain ``resident`` (bytes),
``top_finding`` (a snapshot's top finding, else the /proc one, else
"allocator not read: REASON") and ``allocator_read`` ("ok" | "not read: …" |
"pending").

The exporter (diag.exporter) uses the same reader for its live targets: it
reads ``Entry.snapshot`` (kept for "ok" reads) and ``Entry.code`` (one of
REASONS, a bounded metric label), and counts reads and pauses per group
through the ``on_read`` hook.
"""

import os
import threading
import time
from typing import Optional

from collectors import lazylog
from diag.model.records import record
from collectors.proc.stat import start_time
from diag.model.errors import (AccessDenied, AllocdiagError, NoSuchProcess, Quarantined,
                               RemoteCallError, Unsupported)

log = lazylog.getLogger("diag")

# Why a process was "not read", as a fixed list (a metric label must not be
# free text): Entry.code holds one of these, Entry.reason the message.
REASONS = ("vanished", "denied", "quarantined", "remote_failed", "unsupported",
           "no_stats_interface", "error")


@record
class Entry:
    state: str                          # ok | not read
    taken_at: float                     # monotonic
    resident: Optional[int] = None
    finding: Optional[str] = None
    reason: Optional[str] = None
    pause_us: Optional[int] = None
    code: Optional[str] = None          # one of REASONS when not read
    snapshot: Optional[object] = None   # the diag.model.Snapshot of an "ok" read


def reason_code(exc):
    """The REASONS word for an exception raised by a snapshot."""
    for cls, code in ((NoSuchProcess, "vanished"), (AccessDenied, "denied"),
                      (Quarantined, "quarantined"), (RemoteCallError, "remote_failed"),
                      (Unsupported, "unsupported")):
        if isinstance(exc, cls):
            return code
    return "error"


def _remote_code(pid, col, remote):
    """The REASONS word for a remote collector that did not read (the
    snapshot keeps only its message, so the quarantine is asked directly)."""
    from collectors.engine.remote import is_quarantined
    if col.first_denied is not None:
        return "denied"
    if getattr(col, "unsupported", None) is not None:
        return "unsupported"
    if is_quarantined(pid):
        return "quarantined"
    return "remote_failed"


def _default_take(pid, deadline_s):
    from diag import snapshot
    return snapshot.take(pid, attach=True, deadline_s=deadline_s)


def read_one(pid, take=None, deadline_s=0.3):
    """One snapshot of PID turned into an Entry (never raises AllocdiagError)."""
    take = take or _default_take
    now = time.monotonic()
    try:
        snap, col = take(pid, deadline_s)
    except AllocdiagError as exc:
        return Entry("not read", now, reason=str(exc.msg), code=reason_code(exc))
    remote = col.status.get("remote")
    resident = snap.stats.get("resident")
    resident = resident.value if resident is not None else None
    top = max(snap.findings, key=lambda f: f.expected_effect_bytes or 0) if snap.findings \
        else None
    if remote is None:
        return Entry("not read", now, reason="no allocator stats interface found",
                     code="no_stats_interface")
    if not remote.ok:
        return Entry("not read", now, reason=remote.error or "remote read failed",
                     finding=top.title if top else None, code=_remote_code(pid, col, remote))
    return Entry("ok", now, resident=resident, finding=top.title if top else None,
                 pause_us=remote.pause_us, snapshot=snap)


class HostLive:
    """Bounded-rate background reader of allocator stats for the host view."""

    def __init__(self, max_pause_ms_per_minute=120.0, refresh_s=30.0, min_gap_s=1.0,
                 retry_s=300.0, deadline_s=0.3, take=None, exclude=(), on_read=None):
        from diag.compare import PauseBudget
        self.budget = PauseBudget(max_pause_ms_per_minute)
        self.refresh_s, self.min_gap_s, self.retry_s = refresh_s, min_gap_s, retry_s
        self.deadline_s = deadline_s
        self.take = take
        self.exclude = set(exclude) | {os.getpid()}
        self._lock = threading.Lock()
        self._cache = {}            # (pid, start) -> Entry
        self._wanted = []           # [(pid, start)] in table order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self.reads = 0
        # on_read(pid, entry) after every read, outside the lock (the
        # exporter counts pauses and results per group with it)
        self.on_read = on_read

    # -- the table side (never blocks on a stop) ------------------------------------
    def annotate(self, rows):
        """Fill RESIDENT / TOP_FINDING / ALLOCATOR_READ of the row dicts (in
        place; returned too) from the cache; remember which processes are
        shown so the worker reads those."""
        wanted = []
        with self._lock:
            for d in rows:
                pid = d.get("pid")
                if pid is None or pid in self.exclude:
                    continue
                key = (pid, d.get("_start") or start_time(pid))
                wanted.append(key)
                e = self._cache.get(key)
                if e is None:
                    d["allocator_read"] = "pending"
                elif e.state == "ok":
                    d["allocator_read"] = "ok"
                    d["resident"] = e.resident
                    if e.finding:
                        d["top_finding"] = e.finding
                else:
                    d["allocator_read"] = f"not read: {e.reason}"
                    if not d.get("top_finding"):
                        d["top_finding"] = f"allocator not read: {e.reason}"
            self._wanted = wanted
            keep = set(wanted)
            self._cache = {k: v for k, v in self._cache.items() if k in keep}
        self._wake.set()
        return rows

    def entry(self, pid):
        with self._lock:
            for (p, _), e in self._cache.items():
                if p == pid:
                    return e
        return None

    # -- the worker ----------------------------------------------------------------------
    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hostlive", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout=2.0):
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def next_due(self, now=None, skip=()):
        """The shown process to read next (never read first, then the
        stalest), or None when every one is fresh.  SKIP: keys not to give."""
        now = time.monotonic() if now is None else now
        with self._lock:
            best, best_age = None, None
            for key in self._wanted:
                if key in skip:
                    continue
                e = self._cache.get(key)
                if e is None:
                    return key
                period = self.refresh_s if e.state == "ok" else self.retry_s
                age = now - e.taken_at
                if age >= period and (best_age is None or age > best_age):
                    best, best_age = key, age
            return best

    def step_all(self):
        """Read every process due now once, within the budget (one-shot
        modes): a read that outlasts refresh_s does not make its process due
        again in the same call.  The number read."""
        done = set()
        while self.step(done):
            pass
        return len(done)

    def step(self, done=None):
        """Read one due process (not in DONE) if the budget allows; True when
        one was read (its key then added to DONE)."""
        key = self.next_due(skip=done or ())
        if key is None:
            return False
        if not self.budget.allows():
            log.debug("host view: pause budget spent, pid %d waits", key[0])
            return False
        if done is not None:
            done.add(key)
        pid, start = key
        e = read_one(pid, self.take, self.deadline_s)
        log.debug("host view: pid %d read: %s%s, pause %s us", pid, e.state,
                  f" ({e.code}: {e.reason})" if e.reason else "", e.pause_us)
        if e.pause_us:
            self.budget.spend(e.pause_us / 1e6)
        with self._lock:
            if key in self._wanted:
                self._cache[key] = e
        # counted once stored: whoever sees the count sees the entry
        self.reads += 1
        if self.on_read is not None:
            self.on_read(pid, e)
        return True

    def _run(self):
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:       # one bad process must not end the filler
                log.debug("host view: a read failed", exc_info=True)
            self._wake.clear()
            self._stop.wait(self.min_gap_s)
