"""Build a Snapshot of one process from the collectors.

Each collector runs under ``_run``, which times it and turns its failure
into a ``CollectorStatus`` (so one failed collector makes the document
partial, not absent).  A vanished process is the exception: NoSuchProcess
propagates, because there is nothing left to describe.
"""

import time

from collectors import preload as preload_mod
from collectors.detect import detect
from collectors.errors import AccessDenied, AllocdiagError, NoSuchProcess
from collectors.image import ProcessImage
from collectors.procfs import ProcFS, cgroup_memory
from diag.model import (Allocator, CgroupMemory, CollectorStatus, Preload, ProcessMemory,
                        Snapshot, Value)
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


def _parent_environ(procfs, image):
    ppid = image.status.get(b"PPid")
    if not ppid or int(ppid) <= 0:
        return None
    try:
        return procfs.environ(int(ppid))
    except AllocdiagError:
        return None


def take(pid, procfs=None, cgroup_root="/sys/fs/cgroup", expect=None, rollup=True):
    """Snapshot of PID from /proc and ELF only (no stop).

    Returns (Snapshot, Collected).  Raises NoSuchProcess; AccessDenied only
    when not even /proc/PID/status is readable.
    """
    procfs = procfs or ProcFS()
    col = Collected()
    taken_at = time.time()
    status = procfs.status(pid)
    process = col.run("procfs", lambda: procfs.memory(pid, status=status, rollup=rollup),
                      ProcessMemory())
    cgroup = col.run("cgroup", lambda: cgroup_memory(procfs.cgroup_paths(pid), cgroup_root),
                     CgroupMemory())
    if cgroup is not None and cgroup.error:
        col.status["cgroup"] = CollectorStatus(True, cgroup.error, col.status["cgroup"].duration_s)
    image = col.run("maps", lambda: ProcessImage(pid, procfs, status=status))
    allocator, preload = Allocator(), Preload()
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
            if any("not readable" in e for e in det.allocator.evidence):
                col.status["detect"] = CollectorStatus(
                    False, "process memory not readable: GOT slots not read",
                    col.status["detect"].duration_s)
    stats = {name: Value() for name in STATS_FIELDS}
    snap = Snapshot(pid=pid, comm=comm, exe=exe, taken_at=taken_at, allocator=allocator,
                    preload=preload, process=process or ProcessMemory(),
                    cgroup=cgroup or CgroupMemory(), stats=stats, native={},
                    findings=(), collectors=dict(col.status))
    return snap, col
