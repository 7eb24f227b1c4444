"""``allocdiag exporter``: a prometheus_client Collector over the host scan
(diag.hostscan, /proc only, nothing stopped) and the live targets' cached
allocator reads (diag.hostlive.HostLive: one background thread, a token
bucket of stop time, a cache that a scrape only reads).

One ``AllocdiagCollector`` on its own ``CollectorRegistry`` (not the
default one: no process/platform/GC metrics of the exporter itself), served
three ways by diag.commands.exporter: HTTP (``start_http_server``), a
node_exporter textfile (``write_to_textfile``, atomic rename), or printed
once.  Metric names, labels and HELP strings: diag.metrics.
"""

import errno
import os
import re
import threading
import time
from collections import defaultdict
from typing import Optional

from diag.model.records import record
from diag.model.errors import AccessDenied, AllocdiagError, MissingExtra
from diag.model.exitcodes import ExitCode
from diag import hostlive, hostscan, metrics as M, snapshot, walllive
from diag.model.wall import SYSCALLS
from diag.exporter_options import MAX_TARGETS_DEFAULT
from collectors.proc.procfs import ProcFS

try:        # an optional extra: the command names the install line when it is missing
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import CollectorRegistry
except ImportError:
    prometheus_client = None  # type: ignore[assignment]  # the command says how to install it


TEXTFILE_NAME = "allocdiag.prom"
# What the process metrics, the grouping and the target selection read from
# a host scan row (no CPU%, no findings: nothing exported needs them).
EXPORTER_COLUMNS = ("comm", "user", "exe", "rss", "rss_anon", "lazyfree", "threads",
                    "allocator", "preload")
UNKNOWN = "unknown"


@record
class Options:
    group_by: str = "comm"
    groups: tuple = ()                  # ((compiled regex, name), ...): first match wins
    targets: tuple = ()                 # explicit pids
    match: Optional[re.Pattern] = None  # comm or cmdline
    top: int = 0                        # the N largest by RSS
    max_targets: int = MAX_TARGETS_DEFAULT
    max_pause_ms_per_minute: float = 50.0
    refresh_s: float = 30.0
    retry_s: float = 300.0
    min_gap_s: float = 1.0
    deadline_s: float = 0.5
    proc: str = "/proc"
    wall: bool = False                  # the live targets' allocation wall (diag.walllive)
    wall_window_s: float = walllive.WINDOW_S
    wall_every_s: float = walllive.EVERY_S


def _read(path, default=""):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return default


def _exe_name(row):
    """The executable's file name, from the host scan's row."""
    return os.path.basename(row["exe"]) if row.get("exe") else None


def _cmdline(proc, pid):
    return _read(f"{proc}/{pid}/cmdline", b"").replace(b"\0", b" ").strip().decode(errors="replace")


def preload_label(preload):
    """true | false | none (no preload requested) | unknown (the environment
    could not be read): from the host row's preload verdict."""
    effective = preload.get("effective")
    if effective is not None:
        return "true" if effective else "false"
    return "none" if (preload.get("verdict") or "").startswith("none requested") else UNKNOWN


class AllocdiagCollector:
    """The collector: ``collect()`` scans /proc, groups, selects the live
    targets, and reads their allocator numbers from the HostLive cache.

    ``sync=True`` (one-shot modes): the due targets are read inside
    ``collect`` (still within the pause budget); otherwise the HostLive
    thread reads them and ``collect`` never waits on a stop.
    """

    def __init__(self, options=None, live=None, sync=False):
        self.o = options or Options()
        self.sync = sync
        # one snapshot.Session per live target: a refresh re-reads only what
        # can have changed (see diag.snapshot.Session)
        self.sessions = snapshot.Sessions(self.o.max_targets)
        # the host's rows between scrapes: a process whose stat did not move
        # keeps its row (diag.hostscan.HostScanner, incremental; every row is
        # read again at least every hostscan.MAX_KEEP_S)
        self.scanner = hostscan.HostScanner(self.o.proc, EXPORTER_COLUMNS, incremental=True)
        self.live = live or hostlive.HostLive(
            max_pause_ms_per_minute=self.o.max_pause_ms_per_minute, refresh_s=self.o.refresh_s,
            min_gap_s=self.o.min_gap_s, retry_s=self.o.retry_s, deadline_s=self.o.deadline_s,
            take=self.sessions.take)
        self.live.on_read = self._count_read
        self.wall_live = (walllive.WallLive(self.o.wall_window_s, self.o.wall_every_s)
                          if self.o.wall else None)
        self._lock = threading.Lock()           # one collection at a time
        self._counter_lock = threading.Lock()   # the counters (HostLive's thread adds)
        self._group_of_pid = {}
        self.last_live_ok = True            # the last collection read every live target
        self.last_wall_ok = True            # no live target's last wall window failed
        self._pause_s = defaultdict(float)  # group -> seconds
        self._reads = defaultdict(int)      # (group, state) -> reads

    # -- counters fed by HostLive's worker ---------------------------------------------
    def _count_read(self, pid, entry):
        group = self._group_of_pid.get(pid, UNKNOWN)
        with self._counter_lock:
            self._reads[(group, entry.state)] += 1
            if entry.pause_us:
                self._pause_s[group] += entry.pause_us / 1e6

    # -- grouping and target selection -----------------------------------------------------
    def group_of(self, row):
        comm = row.get("comm") or UNKNOWN
        if self.o.groups:
            exe = _exe_name(row) or ""
            cmd = _cmdline(self.o.proc, row["pid"])
            for rx, name in self.o.groups:
                if rx.search(comm) or rx.search(exe) or rx.search(cmd):
                    return name
        if self.o.group_by == "exe":
            return _exe_name(row) or comm
        if self.o.group_by == "user":
            return row.get("user") or UNKNOWN
        return comm

    def select_targets(self, rows):
        """([pid] of the live targets, {pid: row} of the scan): explicit
        pids, then --match, then --top by RSS; at most max_targets."""
        me = os.getpid()
        by_pid = {r["pid"]: r for r in rows if r["pid"] != me}
        chosen = [p for p in self.o.targets]
        if self.o.match is not None:
            chosen += [p for p, r in by_pid.items()
                       if self.o.match.search(r.get("comm") or "")
                       or self.o.match.search(_cmdline(self.o.proc, p))]
        if self.o.top:
            chosen += [r["pid"] for r in sorted(by_pid.values(), key=lambda r: -(r["rss"] or 0))
                       [:self.o.top]]
        seen, out = set(), []
        for p in chosen:
            if p not in seen:
                seen.add(p)
                out.append(p)
        return out[:self.o.max_targets], by_pid

    # -- prometheus_client Collector protocol ----------------------------------------------
    def metrics(self):
        return M.ALL + (M.WALL if self.wall_live is not None else ())

    def start(self):
        """The background readers (HTTP and --interval modes)."""
        self.live.start()
        if self.wall_live is not None:
            self.wall_live.start()

    def stop(self):
        self.live.stop()
        if self.wall_live is not None:
            self.wall_live.stop()

    def describe(self):
        """The families without samples, so the registry knows the names."""
        return [_family(m) for m in self.metrics()]

    def collect(self):
        with self._lock:
            return self._collect()

    def _collect(self):
        t0 = time.perf_counter()
        fams = {m.name: _family(m) for m in self.metrics()}
        procfs_ok = True
        try:
            scan = self.scanner.scan()
        except AllocdiagError:
            scan, procfs_ok = hostscan.ScanResult(), False
        groups = {r["pid"]: self.group_of(r) for r in scan.rows}
        self._proc_metrics(scan, groups, fams)
        live_ok, pending = self._live_metrics(scan.rows, groups, fams)
        # one-shot modes: a target left unread (budget spent) is not "ok" either
        self.last_live_ok = live_ok and not (self.sync and pending)
        fams[M.COLLECTOR_SUCCESS.name].add_metric(["procfs"], 1 if procfs_ok else 0)
        fams[M.COLLECTOR_SUCCESS.name].add_metric(["live"], 1 if live_ok else 0)
        if self.wall_live is not None:
            fams[M.COLLECTOR_SUCCESS.name].add_metric(["wall"], 1 if self.last_wall_ok else 0)
        with self._counter_lock:
            for group, s in sorted(self._pause_s.items()):
                fams[M.TARGET_PAUSE.name].add_metric([group], s)
            for (group, state), n in sorted(self._reads.items()):
                fams[M.TARGET_READS.name].add_metric([group, state], n)
        fams[M.SCRAPE_DURATION.name].add_metric([], time.perf_counter() - t0)
        return [f for f in fams.values() if f.samples]

    def _proc_metrics(self, scan, groups, fams):
        sums = defaultdict(lambda: defaultdict(int))
        seen = defaultdict(set)         # which sums had at least one known value
        for r in scan.rows:
            key = (groups[r["pid"]], r["allocator"]["kind"] or UNKNOWN,
                   preload_label(r["preload"]))
            sums[key]["processes"] += 1
            for name, _ in M.PROC_ROW_FIELDS:
                if r.get(name) is not None:
                    sums[key][name] += r[name]
                    seen[key].add(name)
        for key, s in sorted(sums.items()):
            fams[M.PROCESSES.name].add_metric(list(key), s["processes"])
            for name in seen[key]:
                fams[M.PROC_METRICS[name].name].add_metric(list(key), s[name])
        for reason, n in (("denied", scan.denied), ("vanished", scan.vanished),
                          ("failed", len(scan.failed))):
            fams[M.SCAN_SKIPPED.name].add_metric([reason], n)

    def _live_metrics(self, rows, groups, fams):
        """Target info and the cached allocator numbers.  Returns (ok, pending):
        ok is False when a target is in state "not read"."""
        pids, by_pid = self.select_targets(rows)
        self._group_of_pid = {p: groups[p] for p in pids if p in by_pid}
        self.live.annotate([{"pid": p} for p in self._group_of_pid])
        if self.wall_live is not None:
            self.wall_live.annotate(list(self._group_of_pid))
        if self.sync:
            self.live.step_all()
            if self.wall_live is not None:
                self.wall_live.step_all()
        ok, pending, wall_ok = True, False, True
        sums = defaultdict(lambda: defaultdict(int))
        walls = defaultdict(list)       # (group, allocator) -> the targets' last Walls
        cgroups = {}
        for pid in pids:
            row = by_pid.get(pid)
            if row is None:
                ok = False
                reason = _missing_reason(self.o.proc, pid)
                fams[M.TARGET_INFO.name].add_metric(
                    [UNKNOWN, str(pid), UNKNOWN, UNKNOWN, "not read", reason], 1)
                continue
            group, kind = self._group_of_pid[pid], row["allocator"]["kind"] or UNKNOWN
            e = self.live.entry(pid)
            state = "pending" if e is None else e.state
            reason = (e.code or "error") if e is not None and e.state != "ok" else ""
            ok = ok and state != "not read"
            pending = pending or state == "pending"
            fams[M.TARGET_INFO.name].add_metric(
                [group, str(pid), row.get("comm") or UNKNOWN, kind, state, reason], 1)
            if state == "ok" and e.snapshot is not None:
                _add_snapshot(sums[(group, kind)], cgroups, (group, kind), e.snapshot)
            w = self.wall_live.entry(pid) if self.wall_live is not None else None
            if w is not None and w.wall is not None:
                walls[(group, kind)].append(w.wall)
            wall_ok = wall_ok and (w is None or w.error is None)
        self.last_wall_ok = wall_ok
        _emit_live(sums, cgroups, fams)
        _emit_walls(walls, fams)
        return ok, pending


def _emit_live(sums, cgroups, fams):
    """The per-(group, allocator) sums of the live targets into FAMS."""
    for key, s in sorted(sums.items()):
        for name, m in M.STATS_METRICS.items():
            if name in s:
                fams[m.name].add_metric(list(key), s[name])
        for cls in M.CLASSES:
            if "class:" + cls in s:
                fams[M.MEMORY.name].add_metric(list(key) + [cls], s["class:" + cls])
        if "rss" in s:
            fams[M.TARGET_RSS.name].add_metric(list(key), s["rss"])
    for key, by_path in sorted(cgroups.items()):
        for name, m in M.CGROUP_METRICS.items():
            vals = [c[name] for c in by_path.values() if c.get(name) is not None]
            if vals:
                fams[m.name].add_metric(list(key), sum(vals))


def _ratio(part, whole):
    return part / whole if whole else None


def wall_sums(walls):
    """{metric name: value} of the last WALLS of one group's targets, which
    ran side by side: rates add up; shares are weighted by CPU samples,
    thread time or stacks looked at; unknown figures are left out."""
    out = {}
    cpu = [w.cpu for w in walls if w.cpu is not None and w.cpu.samples]
    if cpu:
        n = sum(c.samples for c in cpu)
        out[M.WALL_CPU_RATIO.name] = sum(c.allocator_samples for c in cpu) / n
        out[M.WALL_UNKNOWN_RATIO.name] = sum(c.unknown_samples for c in cpu) / n
    off = [w.off_cpu for w in walls if w.off_cpu is not None]
    if off:
        out[M.WALL_LOCK_SECONDS.name] = sum(o.allocator_lock_s for o in off)
        lock = _ratio(sum(o.allocator_lock_s for o in off), sum(o.thread_s for o in off))
        if lock is not None:
            out[M.WALL_LOCK_RATIO.name] = lock
    for metric, attr in ((M.WALL_MINOR_FAULTS, "minor_per_s"),
                         (M.WALL_MAJOR_FAULTS, "major_per_s")):
        rates = [getattr(w.faults, attr) for w in walls if w.faults is not None]
        if any(r is not None for r in rates):
            out[metric.name] = sum(r for r in rates if r is not None)
    for name in SYSCALLS:
        rates = [w.syscalls[name] for w in walls if name in w.syscalls]
        known = [r.per_s for r in rates if r.per_s is not None]
        if known:
            out[(M.WALL_SYSCALLS.name, name)] = sum(known)
        share = _ratio(sum(r.from_allocator for r in rates),
                       sum(r.sampled - r.unknown for r in rates))
        if share is not None:
            out[(M.WALL_SYSCALLS_ALLOCATOR.name, name)] = share
    if walls:
        out[M.WALL_WINDOW.name] = max(w.window.duration_s for w in walls)
    return out


def _emit_walls(walls, fams):
    for key, ws in sorted(walls.items()):
        for name, v in wall_sums(ws).items():
            if isinstance(name, tuple):
                name, syscall = name
                fams[name].add_metric(list(key) + [syscall], v)
            else:
                fams[name].add_metric(list(key), v)


def _add_snapshot(s, cgroups, key, snap):
    """Add SNAP's numbers into the sums S of its (group, allocator)."""
    for name in M.STATS_METRICS:
        v = snap.stats.get(name)
        if v is not None and v.value is not None:
            s[name] += v.value
    classes = M.memory_classes(snap)
    if classes is not None:
        s["rss"] += snap.process.rss
        for cls, b in classes.items():
            s["class:" + cls] += b
    # processes sharing a cgroup count it once
    cg = snap.cgroup
    if cg.path is not None:
        cgroups.setdefault(key, {})[cg.path] = {"working_set": cg.working_set, "usage": cg.usage}


def _missing_reason(proc, pid):
    """Why an explicit target is absent from the scan (a hostlive.REASONS
    word): gone or a zombie, a kernel thread (no allocator: the scan skips
    them), else unreadable."""
    try:
        ProcFS(proc).check_user_process(pid)
    except AllocdiagError as exc:
        return hostlive.reason_code(exc)
    return "denied"


def _family(m):
    cls = CounterMetricFamily if m.type == "counter" else GaugeMetricFamily
    return cls(m.name, M.help_text(m), labels=list(m.labels))


class TextfileError(AllocdiagError):
    """The textfile directory cannot take the file (not a permission problem)."""

    exit_code = ExitCode.USAGE


def require_client():
    """Raise MissingExtra (exit 2) naming the install line when
    prometheus_client is missing."""
    if prometheus_client is None:
        raise MissingExtra("the exporter", "prometheus_client", "exporter")


def write_textfile(path, reg):
    """PATH (ending in .prom) written atomically: prometheus_client writes
    PATH.<pid>.<thread> in the same directory and renames it over PATH, so
    node_exporter never reads half a file (and skips the temporary, which
    does not end in .prom)."""
    try:
        prometheus_client.write_to_textfile(path, reg)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise AccessDenied(None, f"cannot write {path}: {exc.strerror}",
                               remediation=None) from None
        raise TextfileError(f"cannot write {path}: {exc.strerror or exc}") from None


def registry(collector):
    """A CollectorRegistry of its own holding only COLLECTOR."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg
