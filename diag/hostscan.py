"""Scan every process on the host (``allocdiag ps`` and the TUI host view).

Nothing is stopped.  Each column names the /proc files it needs (``NEEDS``)
and a scan reads only the union for the columns asked for: status (name,
user, RSS split, threads), stat (CPU time, start time, kernel thread flag),
smaps_rollup (LazyFree), and for the allocator and preload columns the
process image (maps, exe, environ, auxv, the ELF objects -- parsed once per
file for the whole scan, see collectors.binary.elf -- and one read of the
executable's malloc GOT slot).

``HostScanner`` keeps what it read between scans when asked to
(``incremental=True``, the TUI host view): a process whose /proc/PID/stat
activity (its comm and collectors.proc.stat.ACTIVITY_FIELDS: state, CPU
time, faults, size, RSS, threads, start time) did not change since the last scan
keeps its row unread, for at most ``MAX_KEEP_S``; vanished processes are
dropped.
"""

import functools
import os
import pwd
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from collectors import lazylog
from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess
from collectors.proc.procfs import ProcFS
from collectors.proc.stat import CLOCK_TICKS, StatLine, boot_time, parse_stat_line

log = lazylog.getLogger("diag")
PsKey = tuple[int, float]       # (pid, create time): a process, not a recycled pid
HOST_PROC = "/proc"

# Every column of a row (``allocdiag ps --json``), and the reads it needs:
# "image" is the process image (maps, exe, environ, auxv, ELF objects, the
# malloc GOT slot), "memory" smaps_rollup; status is read for every process.
NEEDS: dict[str, frozenset[str]] = {
    "comm": frozenset({"status"}), "user": frozenset({"status"}),
    "rss": frozenset({"status"}), "rss_anon": frozenset({"status"}),
    "threads": frozenset({"status"}),
    "cpu_percent": frozenset({"stat"}),
    "exe": frozenset({"exe"}),
    "lazyfree": frozenset({"memory"}),
    "allocator": frozenset({"image"}), "preload": frozenset({"image"}),
    # the findings a /proc-only view can give (LazyFree, preload, two allocators)
    "top_finding": frozenset({"image", "memory"}), "findings": frozenset({"image", "memory"}),
}
PS_COLUMNS = tuple(NEEDS)
# The TUI host table (tui/host_screen.py HOST_COLUMNS): no user, CPU or exe.
HOST_VIEW_COLUMNS = ("comm", "allocator", "preload", "rss", "rss_anon", "lazyfree",
                     "top_finding", "findings")


def unreadable_hint(euid: int | None = None, short: bool = False) -> str:
    """What the count of unreadable processes should say (``ps``; SHORT:
    the host view's status line): as a user, that root sees them; as root,
    that even root was refused, which "run as root" does not help with.
    Root is refused a process holding capabilities it lacks when it has no
    CAP_SYS_PTRACE (security/commoncap.c cap_ptrace_access_check; docker
    drops it by default), and a security module or kernel policy can refuse
    it even with CAP_SYS_PTRACE (the VM this was built on refuses its init)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return "run as root to see them"
    if short:
        return "refused even to root"
    return ("refused even to root: without CAP_SYS_PTRACE (a container's default) root cannot "
            "read a process holding capabilities it lacks, and a security module can refuse "
            "too; `allocdiag inspect PID` names the refusal")


class ScanResult:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.denied = 0
        self.vanished = 0
        self.failed: list[tuple[int, str]] = []   # (pid, message)

    def to_json(self) -> dict[str, Any]:
        # keys starting with "_" are the scanner's own (the start time the
        # host view keys its cache by), not part of the document
        rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in self.rows]
        return {"processes": rows, "total": len(rows), "unreadable": self.denied,
                "vanished": self.vanished,
                "failed": [{"pid": pid, "error": err} for pid, err in self.failed]}


class CpuMeter:
    """CPU% per process.  The first time a process is seen: its average over
    its lifetime (what ps(1) shows); afterwards: over the time since the
    previous scan with the same meter (what top(1) shows).  Keyed by pid and
    create time, so a recycled pid starts afresh."""

    def __init__(self) -> None:
        self._last: dict[PsKey, tuple[float, float]] = {}   # -> (cpu seconds, monotonic time)

    def percent(self, key: PsKey, cpu_s: float, create_time: float) -> float | None:
        now = time.monotonic()
        prev = self._last.get(key)
        self._last[key] = (cpu_s, now)
        if prev is not None and now > prev[1]:
            return 100.0 * (cpu_s - prev[0]) / (now - prev[1])
        age = time.time() - create_time
        return 100.0 * cpu_s / age if age > 0 else None

    def forget_except(self, keys: set[PsKey]) -> None:
        self._last = {k: v for k, v in self._last.items() if k in keys}


@functools.lru_cache(maxsize=1024)
def _user_name(uid: int) -> str:
    """One passwd lookup per uid per run (bounded: a host has few users)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:            # a uid with no passwd entry (containers)
        return str(uid)


def _real_uid(status: dict[bytes, bytes]) -> int | None:
    """The real uid: the first of status's ``Uid:`` line (real, effective, saved, fs)."""
    try:
        return int(status[b"Uid"].split()[0])
    except (KeyError, IndexError, ValueError):
        return None


class _Kept(NamedTuple):
    """What an incremental scan remembers of one pid: the stat activity it
    was read at, when (monotonic), and its outcome (a row, None, or denied:
    a process of another user stays unreadable until it changes)."""

    activity: tuple[bytes, ...]
    read_at: float
    row: dict[str, Any] | None
    denied: bool = False


# A row is kept at most this long: a process can change what a column shows
# without moving its stat (a short madvise(MADV_FREE) between two clock ticks
# changes LazyFree, not utime or RSS), so every row is read again this often.
MAX_KEEP_S = 60.0


class HostScanner:
    """Scans of one procfs tree for COLUMNS (a subset of PS_COLUMNS).

    ``reads`` counts the files read (``ProcFS.reads``), ``rows_read`` the
    processes read in full and ``rows_kept`` those an incremental scan kept
    because their stat did not change.
    """

    def __init__(self, procfs_root: str = HOST_PROC, columns: Iterable[str] = PS_COLUMNS,
                 incremental: bool = False, max_keep_s: float = MAX_KEEP_S) -> None:
        self.columns = tuple(columns)
        unknown = set(self.columns) - set(NEEDS)
        if unknown:
            raise ValueError(f"unknown host scan columns: {', '.join(sorted(unknown))}")
        self.procfs = ProcFS(procfs_root)
        self.needs = frozenset().union(*(NEEDS[c] for c in self.columns))
        # user and CPU are the host's figures: a captured tree has no passwd
        # or clock of its own to read them against
        self.host = procfs_root == HOST_PROC
        self.incremental = incremental
        self.max_keep_s = max_keep_s
        self.meter = CpuMeter()
        self._boot: float | None = None
        self._kept: dict[int, _Kept] = {}
        self.rows_read = 0
        self.rows_kept = 0

    @property
    def reads(self) -> Counter[str]:
        return self.procfs.reads

    def pids(self) -> list[int]:
        return self.procfs.pids()

    def scan(self, pids: Iterable[int] | None = None) -> ScanResult:
        """Rows of PIDS (default: every process), sorted by pid."""
        pids = self.pids() if pids is None else list(pids)
        result = ScanResult()
        kept: dict[int, _Kept] = {}
        for pid in pids:
            try:
                row = self._row(pid, kept)
            except NoSuchProcess:
                result.vanished += 1
                continue
            except AccessDenied:
                result.denied += 1
                continue
            except AllocdiagError as exc:
                log.debug("host scan: pid %d failed: %s", pid, exc.msg)
                result.failed.append((pid, str(exc.msg)))
                continue
            if row is not None:
                result.rows.append(row)
        if self.incremental:
            self._kept = kept           # vanished pids dropped here
        self.meter.forget_except({(r["pid"], r["_create"]) for r in result.rows
                                  if r.get("_create") is not None})
        log.debug("host scan: %d rows (%d read, %d kept), %d unreadable, %d vanished, "
                  "%d failed", len(result.rows), self.rows_read, self.rows_kept,
                  result.denied, result.vanished, len(result.failed))
        return result

    # -- one process --------------------------------------------------------------

    def _stat(self, pid: int) -> StatLine | None:
        if not (self.incremental or "stat" in self.needs):
            return None
        try:
            return parse_stat_line(self.procfs.read(pid, "stat"))
        except OSError:         # a captured tree without stat: no CPU%, nothing kept
            return None

    def _row(self, pid: int, kept: dict[int, _Kept]) -> dict[str, Any] | None:
        stat = self._stat(pid)
        if stat is not None and stat.kernel_thread:
            return None                 # no user memory, nothing more to read
        now = time.monotonic()
        if self.incremental and stat is not None:
            prev = self._kept.get(pid)
            if prev is not None and prev.activity == stat.activity \
                    and now - prev.read_at < self.max_keep_s:
                kept[pid] = prev
                self.rows_kept += 1
                if prev.denied:
                    raise AccessDenied(pid)
                if prev.row is None:
                    return None
                # a copy: callers annotate rows in place (diag.hostlive)
                return self._with_cpu(dict(prev.row), stat)
        self.rows_read += 1
        try:
            row = self.read_row(pid, stat)
        except AccessDenied:
            if self.incremental and stat is not None:
                kept[pid] = _Kept(stat.activity, now, None, denied=True)
            raise
        if self.incremental and stat is not None:
            kept[pid] = _Kept(stat.activity, now, row)
            if row is not None:
                row = dict(row)
        return row

    def read_row(self, pid: int, stat: StatLine | None = None) -> dict[str, Any] | None:
        """The row of PID read afresh (None for a kernel thread), raising the
        collectors' exceptions."""
        status = self.procfs.status(pid)
        if b"VmRSS" not in status:          # kernel thread: no user memory
            return None
        want = self.columns
        row: dict[str, Any] = {"pid": pid}
        if stat is not None:
            row["_start"] = stat.start_ticks    # diag.hostlive keys its cache by it
        if "comm" in want:
            row["comm"] = status.get(b"Name", b"").decode(errors="replace") or None
        if "user" in want:
            uid = _real_uid(status) if self.host else None
            row["user"] = None if uid is None else _user_name(uid)
        mem = None
        if "memory" in self.needs or {"rss", "rss_anon", "threads"} & set(want):
            mem = self.procfs.memory(pid, status=status, rollup="memory" in self.needs)
            for name in ("rss", "rss_anon", "lazyfree", "threads"):
                if name in want:
                    row[name] = getattr(mem, name)
        if "image" in self.needs:
            self._image_columns(pid, status, mem, row)
        elif "exe" in want:
            row["exe"] = self.procfs.exe(pid)
        if "cpu_percent" in want:
            if stat is None:
                row["cpu_percent"] = None
            else:
                self._with_cpu(row, stat)
        return row

    def _image_columns(self, pid, status, mem, row) -> None:
        # imported here: the process image pulls in the ELF reader and the
        # allocator homes, which a scan without these columns never needs
        from collectors.binary.image import ProcessImage
        from collectors.detect import detect
        from collectors.preload import verdict
        want = self.columns
        image = ProcessImage(pid, self.procfs, status=status)
        det = detect(image)
        pre = verdict(image, det)
        a = det.allocator
        if "exe" in want:
            row["exe"] = image.exe_path
        if "allocator" in want:
            row["allocator"] = {"kind": a.kind, "linkage": a.linkage, "version": a.version,
                                "prefix": a.prefix, "others": [o.kind for o in a.others]}
        if "preload" in want:
            row["preload"] = {"effective": pre.effective, "verdict": pre.verdict}
        if "top_finding" in want or "findings" in want:
            from diag import findings
            from diag.model import Snapshot
            # the same rules as a full snapshot, on what /proc says ("findings"
            # needs "memory", so MEM was read)
            top = findings.evaluate(Snapshot(pid=pid, allocator=a, preload=pre, process=mem))
            if "top_finding" in want:
                row["top_finding"] = top[0].title if top else None
            if "findings" in want:
                row["findings"] = [f.id for f in top]

    def _with_cpu(self, row: dict[str, Any], stat: StatLine) -> dict[str, Any]:
        """ROW with ``cpu_percent`` from STAT (None off the host or without a boot time)."""
        if "cpu_percent" not in self.columns:
            return row
        if self._boot is None and self.host:
            self._boot = boot_time(self.procfs.root)
        if self._boot is None or not self.host:
            row["cpu_percent"] = None
            return row
        create = self._boot + stat.start_ticks / CLOCK_TICKS
        row["_create"] = create
        cpu = self.meter.percent((row["pid"], create), stat.cpu_ticks / CLOCK_TICKS, create)
        row["cpu_percent"] = None if cpu is None else round(cpu, 1)
        return row


# Below this many processes a second worker costs more than it saves.
PARALLEL_MIN = 300


def scan(procfs_root: str = HOST_PROC, pids: Iterable[int] | None = None, workers: int = 1,
         meter: CpuMeter | None = None, columns: Iterable[str] = PS_COLUMNS) -> ScanResult:
    """One scan of PIDS (default: every process) for COLUMNS.  METER: CPU%
    since the previous scan with it.  WORKERS > 1 splits a large scan over
    forked processes.  Only for single-threaded callers such as the CLI:
    forking a threaded program (the TUI) is not safe."""
    scanner = HostScanner(procfs_root, columns)
    if meter is not None:
        scanner.meter = meter
    pids = scanner.pids() if pids is None else list(pids)
    parallel = workers > 1 and len(pids) >= PARALLEL_MIN
    log.debug("host scan of %d processes under %s: %s", len(pids), procfs_root,
              f"{workers} forked workers" if parallel else "serial")
    if parallel:
        return _scan_parallel(scanner, pids, workers)
    return scanner.scan(pids)


def _shares(scanner: HostScanner, pids: list[int], workers: int) -> list[list[int]]:
    """PIDS in WORKERS shares of about as many processes each.  A share
    costs what its processes do: ~0.7 ms each on the slow guest, the ELF
    objects they map coming from the detection cache.  Processes running the
    same executable (mostly mapping the same objects) go to one share when
    they fit in it, so that a first scan, which parses each object it meets,
    parses them in one worker.  The executable is its /proc/PID/exe link
    (~10 us); a planner that read every process's maps first (~100 us
    each, before any worker started) and weighed an object as ten processes
    left one worker twice the other's processes once the objects were
    cached: 102 processes taking 176 ms against 384 taking 343 ms, of
    486."""
    groups: dict[str | None, list[int]] = {}
    for pid in pids:
        try:
            exe: str | None = os.readlink(f"{scanner.procfs.root}/{pid}/exe")
        except OSError:
            exe = None          # a kernel thread, gone, or not ours: the worker will see
        groups.setdefault(exe, []).append(pid)
    # Without an exe link (kernel threads, other users' processes) a process
    # costs a read or two: those are dealt round at the end, outside the
    # balance.  The others go largest group first, whole into the lightest
    # share with room for it; a group no share has room for fills the
    # lightest up and goes on (a host of 1,000 copies of one program must
    # still split: its objects are then loaded in two workers).
    unread = groups.pop(None, [])
    room = -(-(len(pids) - len(unread)) // workers)     # processes a share may hold
    shares: list[list[int]] = [[] for _ in range(workers)]
    for group in sorted(groups.values(), key=len, reverse=True):
        while group:
            fits = [share for share in shares if room - len(share) >= len(group)]
            share = min(fits or shares, key=len)
            take = room - len(share)
            share.extend(group[:take])
            group = group[take:]
    for w, share in enumerate(shares):
        share.extend(unread[w::workers])
    return shares


def _scan_parallel(scanner: HostScanner, pids: list[int], workers: int) -> ScanResult:
    """Split PIDS over WORKERS: the caller scans one share, forked children
    the others, each sending its ScanResult back pickled through a pipe (a
    child that failed has its share scanned here)."""
    import pickle
    chunks = _shares(scanner, pids, workers)
    if "image" in scanner.needs:
        # imported once here, not once in every worker after the fork (~60 ms each)
        import importlib
        for name in ("collectors.binary.image", "collectors.detect", "collectors.preload",
                     "diag.findings"):
            importlib.import_module(name)
    children = []
    for chunk in chunks[1:]:
        r, w = os.pipe()
        child = os.fork()
        if child == 0:          # the child: scan, send, leave without cleanup
            code = 0
            try:
                os.close(r)
                with os.fdopen(w, "wb") as out:
                    pickle.dump(scanner.scan(chunk), out, pickle.HIGHEST_PROTOCOL)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(w)
        children.append((child, r))
    result = scanner.scan(chunks[0])
    for (child, r), share in zip(children, chunks[1:]):
        with os.fdopen(r, "rb") as inp:
            try:
                part = pickle.load(inp)
            except (EOFError, pickle.UnpicklingError):
                part = None
        _, code = os.waitpid(child, 0)
        if part is None or code != 0:
            log.debug("host scan: worker %d failed (status %d): its share scanned serially",
                      child, code)
            part = scanner.scan(share)
        result.rows.extend(part.rows)
        result.denied += part.denied
        result.vanished += part.vanished
        result.failed.extend(part.failed)
    result.rows.sort(key=lambda r: r["pid"])
    return result
