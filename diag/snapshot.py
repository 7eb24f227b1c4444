"""Build a Snapshot of one process from the collectors.

Each collector runs under ``_run``, which times it and turns its failure
into a ``CollectorStatus`` (so one failed collector makes the document
partial, not absent).  A vanished process is the exception: NoSuchProcess
propagates, because there is nothing left to describe.
"""

import dataclasses
import time

from collectors import livestats

from collectors.allocators.glibc import heapmaps


from collectors.runtimes import pymalloc
from collectors import preload as preload_mod
from collectors.detect import detect
from diag.model.errors import AccessDenied, AllocdiagError, NoSuchProcess, Unsupported
from collectors.binary.image import ProcessImage
from collectors.proc.cgroup import cgroup_memory
from collectors.proc.procfs import ProcFS
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


def _live(col, image, det, per_arena, deadline_s):
    """Run the remote stats collector; its pause goes into the collector
    status.  An allocator without a stats interface (Go runtime, musl)
    gives no stats: the collector is not ok, says why, and
    ``col.unsupported`` holds the error (``inspect`` exits 5 on it)."""
    t0 = time.perf_counter()
    try:
        live = livestats.collect(image, det, per_arena=per_arena, deadline_s=deadline_s)
    except NoSuchProcess:
        raise
    except Unsupported as exc:
        col.unsupported = exc
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    except AccessDenied as exc:
        col.first_denied = col.first_denied or exc
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    except AllocdiagError as exc:
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
    when not even /proc/PID/status is readable.
    """
    procfs = procfs or ProcFS()
    col = Collected()
    taken_at = time.time()
    status = procfs.status(pid)
    procfs.check_user_process(pid, status)     # a zombie or a kernel thread: said as such
    process = col.run("procfs", lambda: procfs.memory(pid, status=status, rollup=rollup),
                      ProcessMemory())
    cgroup = col.run("cgroup", lambda: cgroup_memory(procfs.cgroup_paths(pid), cgroup_root),
                     CgroupMemory())
    if cgroup is not None and cgroup.error:
        col.status["cgroup"] = CollectorStatus(True, cgroup.error, col.status["cgroup"].duration_s)
    image = col.run("maps", lambda: ProcessImage(pid, procfs, status=status))
    allocator, preload, det = Allocator(), Preload(), None
    comm = status.get(b"Name", b"").decode(errors="replace") or None
    exe = procfs.exe(pid)
    if image is not None:
        det = col.run("detect", lambda: detect(image, all_bindings=True))
        if det is not None:
            allocator = det.allocator
            preload = col.run("preload", lambda: preload_mod.verdict(
                image, det, parent_environ=_parent_environ(procfs, image), expect=expect), Preload())
            # Reading the GOT needs ptrace rights; detection still answered
            # from lookup order, but the snapshot is partial.
            if not det.memory_readable:
                col.status["detect"] = CollectorStatus(
                    False, "process memory not readable: GOT slots not read",
                    col.status["detect"].duration_s)
    stats = {name: Value() for name in STATS_FIELDS}
    native = {}
    if attach and image is not None and det is not None:
        live = _live(col, image, det, per_arena, deadline_s)
        if live is not None:
            stats.update(live.stats)
            native = live.native
            native["borrowed_thread"] = live.thread
    # Runtime heaps (CPython's pymalloc) and mimalloc's live bytes are read
    # from memory with no stop, so they run with or without ``attach``.
    runtime = None
    if image is not None and pymalloc.find_python(image) is not None:
        runtime = col.run("runtime", lambda: pymalloc.collect(image))
    walk = for_kind(allocator.kind).memory_walk
    if image is not None and walk is not None:
        walk(col.run, image, stats, native)
    process = process or ProcessMemory()
    if attach or walk is not None:
        process = _fit_to_kernel(col, procfs, pid, allocator.kind, stats, process, rollup)
    if image is not None and det is not None:
        native["config"] = col.run("config", lambda: _config(image, det), {})
        native["knobs"] = {k: v.to_json() for k, v in
                           knobs.knobs(allocator.kind, native).items()}
    snap = Snapshot(pid=pid, comm=comm, exe=exe, taken_at=taken_at, allocator=allocator,
                    preload=preload, process=process,
                    cgroup=cgroup or CgroupMemory(), stats=stats, native=native,
                    findings=(), collectors=dict(col.status), runtime=runtime)
    snap = dataclasses.replace(snap, findings=findings.evaluate(snap))
    invariants.check(snap)
    return snap, col


def _fit_to_kernel(col, procfs, pid, kind, stats, process, rollup):
    """An allocator's resident never exceeds what the kernel says is
    resident anonymous memory.  When its figure is higher, the kernel view
    is read again (the allocator was read after it, the process may have
    grown); if it is still higher, ``resident`` becomes the kernel's figure,
    labelled adjusted, with the allocator's kept as ``raw``.  Returns the
    process memory the snapshot keeps."""
    res = stats.get("resident")
    if res is None or res.value is None or process.rss_anon is None or \
            res.value <= process.rss_anon:
        return process
    fresh = col.run("procfs", lambda: procfs.memory(pid, rollup=rollup))
    if fresh is not None and fresh.rss_anon is not None:
        process = fresh
    anon = process.rss_anon
    if res.value > anon:
        # why its own figure can be above the kernel's (from the allocator's source or docs)
        why = for_kind(kind).vocabulary.resident_caveat or "the allocator's figure is an estimate"
        kernel = (f"the kernel's resident anonymous memory of the whole process (RssAnon "
                  f"{anon}, {process.source or 'status'})")
        # Tighter: the pages present where the allocator's memory can be,
        # i.e. anonymous mappings that are not thread stacks.
        outside = heapmaps.anon_present_outside_stacks(procfs, pid)
        if outside is not None and outside[0] < anon:
            anon = outside[0]
            kernel = (f"the pages present in the process's anonymous mappings outside its "
                      f"{outside[1]} thread stacks (/proc/PID/pagemap: {anon})")
        stats["resident"] = Value.adjusted(
            anon, res, f"lowered to {kernel}, {res.value - anon} below the allocator's "
                       f"{res.source}: {why}")
    return process


def _config(image, det):
    """Allocator configuration sources (no stop): the allocator variables
    of the initial environment and, for jemalloc, its conf strings."""
    out = {"env": dict(image.environ or {})}
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
