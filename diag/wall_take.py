"""Take allocation-wall windows of a live process: the allocator's counters
(borrowed call), the sampling window (collectors.sampler), the counters
again, findings -> diag.model.wall.Wall.  The entry points for ``allocdiag wall``
(``take``) and for views that sample while they are open -- the TUI tab,
``record --wall``, the exporter (``Live``).

Nothing of the target stops for sampling; each counter read stops one idle
thread for a few ms (DESIGN.md "remote").  What cannot be measured (no
privilege, no tracefs, no allocator stats, the process exits) is listed in
``window.missing`` with the reason and the fix, and the rest is still
returned.
"""

import time

from diag.model.errors import AllocdiagError, NoSuchProcess
from collectors.proc.procfs import ProcFS
from collectors.sampler import counters as counters_mod
from collectors.sampler.session import DEFAULT_HZ, DRAIN_S, Session
from diag import wall_findings
from diag.model import wall as wall_model

ALLOCATOR_ENV = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                 "GLIBC_TUNABLES", "MALLOC_CONF", "LD_PRELOAD")


def _comm(procfs, pid):
    try:
        with open(f"{procfs}/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return None


class Live:
    """One window being sampled.  ``start()``; then ``poll()`` every
    DRAIN_S (False once the process is gone) and ``wall()`` for the figures
    so far (counter deltas up to the start only: no read in between);
    ``stop(ended)`` ends it, reads the counters again and returns the final
    Wall.  A view that samples while it is open calls stop() and starts a
    new Live for each interval it shows."""

    def __init__(self, pid, hz=DEFAULT_HZ, procfs="/proc", counters=True, switches=True,
                 syscalls=wall_model.SYSCALLS, requested_s=None):
        self.pid, self.procfs, self.requested_s = pid, procfs, requested_s
        self.missing = []
        self.reader, self.start_counters = None, {}
        self.want_counters = counters
        self.session = Session(pid, hz=hz, procfs=procfs, switches=switches, syscalls=syscalls)
        self.t0 = None
        self.env = {}
        self.kind = None

    def start(self):
        # a zombie, or a main thread gone with pthread_exit(), said as
        # such: the sampler would take either for "no such process"; a
        # kernel thread has no allocator and no user stacks to sample
        ProcFS(self.procfs).check_user_process(self.pid)
        if self.want_counters:
            try:
                self.reader = counters_mod.Reader(self.pid, self.procfs)
            except NoSuchProcess:
                raise
            except ProcessLookupError:
                raise NoSuchProcess(self.pid) from None
            except (AllocdiagError, OSError) as exc:
                self.missing.append(wall_model.Missing(
                    "counters", f"allocator not read: {exc}", getattr(exc, "remediation", None)))
        if self.reader is not None:
            self.kind = self.reader.kind
            self.env = _env(self.reader)
            self.start_counters, why = counters_mod.timed_read(self.reader)
            if why:
                self.missing.append(wall_model.Missing("counters",
                                                 f"allocator counters not read: {why}"))
                self.reader = None
        self.t0 = time.monotonic()
        self.session.start()
        return self

    def poll(self):
        return self.session.poll()

    def wall(self, ended=wall_model.COMPLETE, end_counters=None):
        duration = time.monotonic() - self.t0
        s = self.session
        cpu, off, faults, sc, sites, stacks = s.parts()
        counters = counters_mod.deltas(self.start_counters, end_counters or {}, duration) \
            if self.start_counters else {}
        requested = self.requested_s if self.requested_s is not None else duration
        win = s.window(requested, ended, comm=_comm(self.procfs, self.pid), allocator=self.kind,
                       extra_missing=self.missing,
                       pause_us=self.reader.pause_us if self.reader is not None else ())
        w = wall_model.Wall(win, cpu=cpu, off_cpu=off, faults=faults, syscalls=sc,
                            counters=counters, sites=sites, stacks=stacks)
        findings = wall_findings.rules(w, self.env)
        return wall_model.Wall(w.window, w.cpu, w.off_cpu, w.faults, w.syscalls, w.counters,
                               w.sites, findings, w.stacks)

    def stop(self, ended=wall_model.COMPLETE):
        self.session.stop()
        end = {}
        if self.reader is not None and ended != wall_model.EXITED:
            end, why = counters_mod.timed_read(self.reader)
            if why:
                self.missing.append(wall_model.Missing("counters", "allocator counters not read at "
                                                             f"the window's end: {why}"))
        elif self.reader is not None:
            self.missing.append(wall_model.Missing("counters", "the process exited during the "
                                                         "window: no end reading"))
        return self.wall(ended, end)


def _env(reader):
    env = getattr(getattr(reader, "image", None), "environ", None) or {}
    out = {}
    for k, v in env.items():
        k = k.decode(errors="replace") if isinstance(k, bytes) else k
        if k in ALLOCATOR_ENV:
            out[k] = v.decode(errors="replace") if isinstance(v, bytes) else v
    return out


def take(pid, duration_s=10.0, hz=DEFAULT_HZ, procfs="/proc", tick=None, counters=True,
         switches=True, syscalls=wall_model.SYSCALLS):
    """One Wall of PID over DURATION_S (Ctrl-C ends the window early: the
    result is still returned, ``window.ended`` says so).  TICK(elapsed_s) is
    called every DRAIN_S.  Raises NoSuchProcess / AccessDenied only when
    nothing at all could be measured."""
    live = Live(pid, hz=hz, procfs=procfs, counters=counters, switches=switches,
                syscalls=syscalls, requested_s=duration_s).start()
    ended = live.session.run_started(duration_s, tick=tick)     # stops the session
    return live.stop(ended)


__all__ = ["Live", "take", "DRAIN_S"]
