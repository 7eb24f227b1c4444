"""Build a Snapshot of one process from the collectors.

Each collector runs under ``_run``, which times it and turns its failure
into a ``CollectorStatus`` (so one failed collector makes the document
partial, not absent).  A vanished process is the exception: NoSuchProcess
propagates, because there is nothing left to describe.

``take`` makes one snapshot.  A ``Session`` makes one snapshot after another
of the same process and keeps what the process's mappings gave (``record``);
``Sessions`` holds a bounded number of them (the exporter's live targets).
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from typing import Any

from diag.model.records import replace
from collectors import giveway, livestats

from collectors.allocators.glibc import heapmaps
from collectors.proc import pagemap


from collectors.runtimes.interpreter import find_python
from collectors import preload as preload_mod
from collectors.detect import detect
from diag.model.errors import (AccessDenied, AllocdiagError, NoSuchProcess, Quarantined,
                               RemoteCallError, Unsupported)
from collectors.binary.image import ProcessImage
from collectors.proc.cgroup import cgroup_memory
from collectors.proc.procfs import ProcFS
from collectors.proc.stat import start_time
from diag.model import (Allocator, CgroupMemory, CollectorStatus, Preload, ProcessMemory,
                        Snapshot, Value)
from collectors.allocators.registry import for_kind
from diag import findings, invariants, knobs
from diag.fields import STATS_FIELDS


class Collected:
    """Mutable scratch while collecting; frozen into a Snapshot at the end."""

    def __init__(self):
        self.status = {}
        self.first_denied = None
        self.unsupported = None     # Unsupported: no stats interface for this allocator

    def run(self, name, fn, default=None):
        t0 = time.perf_counter()
        try:
            value = fn()
        except NoSuchProcess:
            raise
        except AccessDenied as exc:
            self.first_denied = self.first_denied or exc
            self.status[name] = CollectorStatus(False, str(exc.msg), time.perf_counter() - t0)
            return default
        except AllocdiagError as exc:
            self.status[name] = CollectorStatus(False, str(exc.msg), time.perf_counter() - t0)
            return default
        self.status[name] = CollectorStatus(True, None, time.perf_counter() - t0)
        return value

    @property
    def partial(self):
        return any(not s.ok for s in self.status.values())


def _live(col, built, per_arena, deadline_s, maps=None):
    """Run the remote stats collector with BUILT's live reader (made on
    first use); its pause goes into the collector status.  An allocator
    without a stats interface (Go runtime, musl) gives no stats: the
    collector is not ok, says why, and ``col.unsupported`` holds the error
    (``inspect`` exits 5 on it).  A reader whose read failed is not kept
    (the next snapshot starts its remote handle afresh), except when no
    thread was at a safe point (a busy process: it is asked again).
    MAPS: the snapshot's read of /proc/PID/maps, for the borrow's first round
    when the reader was kept (a new one's making reads the process)."""
    t0 = time.perf_counter()
    try:
        if built.reader is None:
            maps = None
            if built.no_reader is not None:
                # its traceback dropped: raised at every snapshot, it would grow
                raise built.no_reader.with_traceback(None)
            try:
                built.reader = livestats.LiveReader(built.image, built.det, per_arena=per_arena,
                                                    deadline_s=deadline_s)
            except Unsupported as exc:
                built.no_reader = exc
                raise
        live = built.reader.collect(deadline_s, maps)
    except NoSuchProcess:
        built.reader = None
        raise
    except Unsupported as exc:
        col.unsupported = exc
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    except AccessDenied as exc:
        built.reader = None
        col.first_denied = col.first_denied or exc
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    except AllocdiagError as exc:
        if not isinstance(exc, RemoteCallError) or isinstance(exc, Quarantined):
            built.reader = None
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    pause = max(live.pause_us) if live.pause_us else None
    if all(v.value is None for v in live.stats.values()):
        # The call ran but brought back no number: not ok (never a remote
        # ok without stats), with the allocator module's reason.
        why = (live.native or {}).get("error") or (live.native or {}).get("stats_error") \
            or "the allocator's stats call gave no numbers"
        col.status["remote"] = CollectorStatus(False, why, time.perf_counter() - t0,
                                               pause_us=pause)
        return live
    col.status["remote"] = CollectorStatus(True, None, time.perf_counter() - t0, pause_us=pause)
    return live


def _parent_environ(procfs, image):
    ppid = image.status.get(b"PPid")
    if not ppid or int(ppid) <= 0:
        return None
    try:
        return procfs.environ(int(ppid))
    except AllocdiagError:
        return None


def take(pid, procfs=None, cgroup_root="/sys/fs/cgroup", expect=None, rollup=True,
         attach=True, per_arena=False, deadline_s=2.0):
    """Snapshot of PID.

    With ``attach`` (default) the allocator's own stats are read by a remote
    call on one borrowed thread (collectors.livestats); without it only /proc
    and the ELF files are read and nothing is stopped.

    Returns (Snapshot, Collected).  Raises NoSuchProcess; AccessDenied only
    when not even /proc/PID/status is readable.  A caller that samples the
    same process again and again keeps a ``Session`` instead.
    """
    return Session(pid, procfs=procfs, cgroup_root=cgroup_root, expect=expect, rollup=rollup,
                   attach=attach, per_arena=per_arena, deadline_s=deadline_s).take()


class Sessions:
    """A Session per process for a reader of several processes (the
    exporter's live targets), at most LIMIT of them: the least recently
    read one is dropped first, so a changing set of targets (or pids that
    went away) holds no more than LIMIT sessions whatever the duration.
    ``take(pid, deadline_s)`` has the signature of diag.hostlive's ``take``.
    Safe to call from several threads (one snapshot at a time)."""

    def __init__(self, limit: int, **options: Any) -> None:
        self.limit = max(1, int(limit))
        self.options = options      # Session's keyword arguments
        # pid -> Session, least recently read first
        self._sessions: collections.OrderedDict[int, Session] = collections.OrderedDict()
        self._lock = threading.Lock()

    def take(self, pid: int, deadline_s: float | None = None) -> tuple[Snapshot, Collected]:
        with self._lock:
            session = self._sessions.pop(pid, None) or Session(pid, **self.options)
            self._sessions[pid] = session
            while len(self._sessions) > self.limit:
                self._sessions.popitem(last=False)
            return session.take(deadline_s)

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, pid: int) -> Session | None:
        """The Session of PID, or None."""
        return self._sessions.get(pid)


class _Built:
    """What a snapshot builds from one set of mappings of one process (the
    part a Session keeps): the image, detection, preload verdict,
    configuration sources, the live reader (or why there is none), and the
    collector statuses of the steps that made them."""

    def __init__(self, maps, image, det, preload, config, status):
        self.maps = maps            # the /proc/PID/maps bytes it was built from
        self.image, self.det, self.preload, self.config = image, det, preload, config
        self.status = status        # {collector: CollectorStatus} of the build
        self.python = find_python(image) is not None
        self.reader = None          # livestats.LiveReader, made on the first attached read
        self.no_reader = None       # the Unsupported that making it raised
        self.complete = False       # every step answered: kept for the next snapshot


class Session:
    """Snapshots of one process, one after the other (``record``, the
    exporter's live reads), with nothing re-parsed that did not change.

    A snapshot builds, from the process's mappings, the ProcessImage, the
    allocator detection, the preload verdict, the configuration sources and
    the live reader (resolved addresses, the remote handle with its stack
    judge).  The session keeps them while the process is the same one and
    its mappings are byte for byte the same: each ``take`` reads
    /proc/PID/maps and compares.  A new mapping (dlopen, an arena, an exec)
    builds them again on the next snapshot (the live reader is renewed:
    its remote handle survives when the allocator's code did not move); a
    new start time (the pid reused by another process) starts afresh.
    What must be read every time is: memory figures, cgroup, the
    allocator's stats, the runtime heaps, findings.  ``builds`` counts the
    builds (tests).  Not thread-safe: one caller at a time.
    """

    def __init__(self, pid: int, procfs: ProcFS | None = None,
                 cgroup_root: str = "/sys/fs/cgroup", expect: str | None = None,
                 rollup: bool = True, attach: bool = True, per_arena: bool = False,
                 deadline_s: float = 2.0) -> None:
        self.pid = pid
        self.procfs = procfs or ProcFS()
        self.cgroup_root, self.expect, self.rollup = cgroup_root, expect, rollup
        self.attach, self.per_arena, self.deadline_s = attach, per_arena, deadline_s
        self.builds = 0
        self._start = None          # the start time of the process _built belongs to
        self._built: _Built | None = None

    def take(self, deadline_s: float | None = None) -> tuple[Snapshot, Collected]:
        """(Snapshot, Collected) of the process now.  DEADLINE_S: this read's
        wait for a safe thread (default: the session's).  Raises as ``take``."""
        pid, procfs = self.pid, self.procfs
        giveway.give_way()
        col = Collected()
        taken_at = time.time()
        status = procfs.status(pid)
        procfs.check_user_process(pid, status)     # a zombie or a kernel thread: said as such
        cgroup = col.run("cgroup", lambda: cgroup_memory(procfs.cgroup_paths(pid),
                                                         self.cgroup_root), CgroupMemory())
        if cgroup is not None and cgroup.error:
            col.status["cgroup"] = CollectorStatus(True, cgroup.error,
                                                   col.status["cgroup"].duration_s)
        kept = self._built
        built = self._current(col, status)
        # the mappings just read, when nothing was built from them since (a
        # recording's snapshot after the first): the borrow's round uses them
        fresh_maps = kept.maps if kept is not None and built is kept else None
        giveway.give_way()
        image = built.image if built is not None else None
        det = built.det if built is not None else None
        allocator = det.allocator if det is not None else Allocator()
        walk = for_kind(allocator.kind).memory_walk if image is not None else None
        # With the allocator's own figures, the kernel's view is read after
        # them (_fit_to_kernel: the process cannot have grown in between),
        # once: smaps_rollup walks every page table, ~5 ms of a 570 MiB
        # redis-server, and a second read cost as much again.
        fits = self.attach or walk is not None
        kernel_first = None if fits else self._memory(col, status)
        preload = built.preload if built is not None and built.preload is not None else Preload()
        comm = status.get(b"Name", b"").decode(errors="replace") or None
        exe = procfs.exe(pid)
        stats = {name: Value() for name in STATS_FIELDS}
        native = {}
        if self.attach and det is None:
            # nothing to call into: say why (not "--no-attach", which was not asked)
            failed = next((name for name, st in col.status.items()
                           if name in ("maps", "detect") and not st.ok), None)
            col.status["remote"] = CollectorStatus(
                False, "not collected: the allocator was not detected" +
                (f" ({failed} failed)" if failed else ""), 0.0)
        if self.attach and det is not None:
            live = _live(col, built, self.per_arena,
                         self.deadline_s if deadline_s is None else deadline_s, fresh_maps)
            if live is not None:
                stats.update(live.stats)
                native = live.native
                native["borrowed_thread"] = live.thread
            giveway.give_way()
        # Runtime heaps (CPython's pymalloc) and mimalloc's live bytes are read
        # from memory with no stop, so they run with or without ``attach``.
        runtime = None
        if image is not None and built.python:
            from collectors.runtimes import pymalloc     # only for a Python (~1.5 ms)
            runtime = col.run("runtime", lambda: pymalloc.collect(image))
        if walk is not None:
            walk(col.run, image, stats, native)
        # with the allocator's figures: status read again too (RssAnon is its counter)
        if kernel_first is not None:
            process = kernel_first
        else:
            kernel = self._memory(col)
            giveway.give_way()
            reader = built.reader if built is not None else None
            process = _fit_to_kernel(procfs, pid, allocator.kind, stats, kernel,
                                     reader.stack_pointers if reader is not None else None)
        giveway.give_way()
        table = None            # findings make it when there is no detection
        if det is not None:
            native["config"] = copy.deepcopy(built.config)     # a snapshot's own
            table = knobs.knobs(allocator.kind, native)
            native["knobs"] = {k: v.to_json() for k, v in table.items()}
        snap = Snapshot(pid=pid, comm=comm, exe=exe, taken_at=taken_at, allocator=allocator,
                        preload=preload, process=process,
                        cgroup=cgroup or CgroupMemory(), stats=stats, native=native,
                        findings=(), collectors=dict(col.status), runtime=runtime)
        snap = replace(snap, findings=findings.evaluate(snap, table=table))
        invariants.check(snap)
        return snap, col

    def _memory(self, col: Collected, status: dict[bytes, bytes] | None = None
                ) -> ProcessMemory:
        """The kernel's memory figures (STATUS, or read now; smaps_rollup)."""
        return col.run("procfs", lambda: self.procfs.memory(self.pid, status=status,
                                                            rollup=self.rollup),
                       ProcessMemory()) or ProcessMemory()

    def _current(self, col, status):
        """The _Built of the process's mappings now: kept when the process
        and its maps bytes are the ones it was built from, else built (and
        kept for the next snapshot when every step of it answered).  None
        when the maps cannot be read."""
        pid, procfs = self.pid, self.procfs
        start = start_time(pid, procfs.root)
        if start != self._start:
            self._start, self._built = start, None      # a new process under this pid
        maps = col.run("maps", lambda: procfs.read(pid, "maps"))
        old = self._built
        if maps is None:
            return None
        if old is not None and maps == old.maps:
            for name, st in old.status.items():
                if name != "maps":      # its status is this read's
                    # the step's answer stands; it cost nothing this time
                    col.status[name] = replace(st, duration_s=0.0)
            return old
        built = self._build(col, status, maps)
        if built is not None and old is not None:
            _carry_reader(old, built)
        self._built = built if built is not None and built.complete else None
        return built

    def _build(self, col, status, maps):
        """Image, detection, preload verdict and configuration from the
        process as it is now (MAPS: the bytes read just before)."""
        pid, procfs = self.pid, self.procfs
        self.builds += 1
        image = col.run("maps", lambda: ProcessImage(pid, procfs, status=status))
        if image is None:
            return None
        det = col.run("detect", lambda: detect(image, all_bindings=True))
        preload = config = None
        if det is not None:
            preload = col.run("preload", lambda: preload_mod.verdict(
                image, det, parent_environ=_parent_environ(procfs, image), expect=self.expect))
            # Reading the GOT needs ptrace rights; detection still answered
            # from lookup order, but the snapshot is partial.
            if not det.memory_readable:
                col.status["detect"] = CollectorStatus(
                    False, "process memory not readable: GOT slots not read",
                    col.status["detect"].duration_s)
            config = col.run("config", lambda: _config(image, det), {})
        steps = {name: col.status[name] for name in BUILD_STEPS if name in col.status}
        built = _Built(maps, image, det, preload, config, steps)
        # a step that failed is tried again on the next snapshot (GOT slots
        # that cannot be read stay unreadable: that answer is kept)
        built.complete = det is not None and preload is not None and steps["config"].ok
        return built


# The collectors whose answers a Session keeps with the mappings they came from.
BUILD_STEPS = ("maps", "detect", "preload", "config")


def _carry_reader(old, new):
    """The live reader of OLD, renewed for NEW's image, when it reads the
    same allocator (same kind, same serving object)."""
    reader = old.reader
    if reader is None or reader.kind != new.det.allocator.kind or \
            _serving_path(old.det) != _serving_path(new.det):
        return
    try:
        reader.renew(new.image, new.det)
    except AllocdiagError:
        return          # made afresh (and its failure said) on the next read
    new.reader = reader


def _serving_path(det):
    return det.serving.path if det.serving is not None else None


def _fit_to_kernel(procfs, pid, kind, stats, process, known_sps=None):
    """An allocator's resident never exceeds what the kernel says is
    resident anonymous memory (PROCESS, read after the allocator's
    figures).  When its figure is higher, ``resident`` becomes the kernel's
    figure, labelled adjusted, with the allocator's kept as ``raw``.
    KNOWN_SPS: the live reader's stack_pointers (heapmaps.anon_present_outside_stacks).
    Returns the process memory the snapshot keeps."""
    res = stats.get("resident")
    if res is None or res.value is None or process.rss_anon is None or \
            res.value <= process.rss_anon:
        return process
    anon = process.rss_anon
    # why its own figure can be above the kernel's (from the allocator's source or docs)
    why = for_kind(kind).vocabulary.resident_caveat or "the allocator's figure is an estimate"
    kernel = (f"the kernel's resident anonymous memory of the whole process (RssAnon "
              f"{anon}, {process.source or 'status'})")
    # Tighter: the pages present where the allocator's memory can be,
    # i.e. anonymous mappings that are not thread stacks.
    outside = heapmaps.anon_present_outside_stacks(procfs, pid, known_sps)
    if outside is not None and outside[0] < anon:
        anon = outside[0]
        kernel = (f"the pages present in the process's anonymous mappings outside its "
                  f"{outside[1]} thread stacks (/proc/PID/pagemap: {anon}"
                  f"{pagemap.present_caveat()})")
    stats["resident"] = Value.adjusted(
        anon, res, f"lowered to {kernel}, {res.value - anon} below the allocator's "
                   f"{res.source}: {why}")
    return process


def _config(image, det):
    """Allocator configuration sources (no stop): the allocator variables
    of the initial environment and, for jemalloc, its conf strings."""
    out = {"env": dict(image.environ or {})}
    if image.environ is None:
        # the knobs' sources must not call a value the default when an
        # environment variable may have set it
        out["env_unreadable"] = image.environ_why
    a = det.allocator
    # the allocator that reads conf strings from the process (jemalloc): the
    # serving one, else the first other one
    knobs_of = for_kind(a.kind).knobs
    obj, prefix = (det.serving, a.prefix) if knobs_of is not None and knobs_of.conf_strings \
        else (None, None)
    if obj is None:
        for o in a.others:
            knobs_of = for_kind(o.kind).knobs
            if knobs_of is not None and knobs_of.conf_strings:
                obj = next((x for x in image.objects if x.path == o.path), None)
                prefix = o.prefix
                break
    if obj is not None:
        out.update(knobs_of.conf_sources(image, obj, prefix))
    return out
