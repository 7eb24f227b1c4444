"""Build a Snapshot of one process from the collectors.

Each collector runs under ``_run``, which times it and turns its failure
into a ``CollectorStatus`` (so one failed collector makes the document
partial, not absent).  A vanished process is the exception: NoSuchProcess
propagates, because there is nothing left to describe.
"""

import dataclasses
import time

from collectors import config, livestats, mimalloc_segments, pymalloc
from collectors import preload as preload_mod
from collectors.detect import detect
from collectors.errors import AccessDenied, AllocdiagError, NoSuchProcess, Unsupported
from collectors.image import ProcessImage
from collectors.procfs import ProcFS, cgroup_memory
from diag.model import (Allocator, CgroupMemory, CollectorStatus, Preload, ProcessMemory,
                        Snapshot, Value)
from diag import findings, knobs
from diag.fields import STATS_FIELDS


class Collected:
    """Mutable scratch while collecting; frozen into a Snapshot at the end."""

    def __init__(self):
        self.status = {}
        self.first_denied = None

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
    status.  An allocator without a stats interface (Go runtime, musl) is
    not a failure: the collector is marked skipped."""
    t0 = time.perf_counter()
    try:
        live = livestats.collect(image, det, per_arena=per_arena, deadline_s=deadline_s)
    except NoSuchProcess:
        raise
    except Unsupported as exc:
        col.status["remote"] = CollectorStatus(True, f"skipped: {exc.msg}", time.perf_counter() - t0)
        return None
    except AccessDenied as exc:
        col.first_denied = col.first_denied or exc
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    except AllocdiagError as exc:
        col.status["remote"] = CollectorStatus(False, exc.msg, time.perf_counter() - t0)
        return None
    col.status["remote"] = CollectorStatus(True, None, time.perf_counter() - t0,
                                           pause_us=max(live.pause_us) if live.pause_us else None)
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
    if image is not None and allocator.kind == "mimalloc":
        _mimalloc_walk(col, image, stats, native)
    if image is not None and det is not None:
        native["config"] = col.run("config", lambda: _config(image, det), {})
        native["knobs"] = {k: v.to_json() for k, v in
                           knobs.knobs(allocator.kind, native).items()}
    snap = Snapshot(pid=pid, comm=comm, exe=exe, taken_at=taken_at, allocator=allocator,
                    preload=preload, process=process or ProcessMemory(),
                    cgroup=cgroup or CgroupMemory(), stats=stats, native=native,
                    findings=(), collectors=dict(col.status), runtime=runtime)
    snap = dataclasses.replace(snap, findings=findings.evaluate(snap))
    return snap, col


def _mimalloc_walk(col, image, stats, native):
    """A release mimalloc counts no allocated bytes: walk its segments
    (collectors.mimalloc_segments, no stop) and, for a pinned build, make
    ``allocated`` a real number."""
    res = col.run("mimalloc_walk", lambda: mimalloc_segments.collect(image))
    if res is None:
        return
    w, desc = res
    if w is None:
        native["mimalloc_walk"] = {"ok": False, "reason": desc}
        return
    stats["allocated"] = Value.derived(
        w.allocated, f"segment walk of mimalloc {desc}: sum over pages of (used - blocks "
                     f"pending on xthread_free and thread_delayed_free) x block size")
    if stats.get("active") is None or stats["active"].value is None:
        stats["active"] = Value.derived(
            w.active, "segment walk: sum over pages holding live blocks of capacity x block size")
    native["mimalloc_walk"] = {"ok": True, "build": desc, **w._asdict()}


def _config(image, det):
    """Allocator configuration sources (no stop): the allocator variables
    of the initial environment and, for jemalloc, its conf strings."""
    out = {"env": dict(image.environ or {})}
    a = det.allocator
    je = det.serving if a.kind == "jemalloc" else None
    prefix = a.prefix if je is not None else None
    if je is None:
        for o in a.others:
            if o.kind == "jemalloc":
                je = next((x for x in image.objects if x.path == o.path), None)
                prefix = o.prefix
                break
    if je is not None:
        out["jemalloc"] = config.jemalloc_sources(image, je, prefix)
        out["prefix"] = prefix or ""
    return out
