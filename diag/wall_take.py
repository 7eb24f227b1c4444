"""Take one allocation-wall window of a live process: the allocator's
counters (borrowed call), the sampling window (collectors.sampler), the
counters again, findings -> diag.wall.Wall.  The one entry point for
``allocdiag wall``, the TUI tab, ``record --wall`` and the exporter.

Nothing of the target stops for sampling; the two counter reads each stop
one idle thread for a few ms (DESIGN.md "remote").  What cannot be measured
(no privilege, no tracefs, no allocator stats, the process exits) is listed
in ``window.missing`` with the reason and the fix, and the rest is still
returned.
"""

import time

from collectors.errors import AllocdiagError, NoSuchProcess
from collectors.sampler import counters as counters_mod
from collectors.sampler.session import DEFAULT_HZ, Session
from diag import wall, wall_findings

ALLOCATOR_ENV = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                 "GLIBC_TUNABLES", "MALLOC_CONF", "LD_PRELOAD")


def _comm(procfs, pid):
    try:
        with open(f"{procfs}/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return None


def _env(reader):
    env = getattr(getattr(reader, "image", None), "environ", None) or {}
    out = {}
    for k, v in env.items():
        k = k.decode(errors="replace") if isinstance(k, bytes) else k
        if k in ALLOCATOR_ENV:
            out[k] = v.decode(errors="replace") if isinstance(v, bytes) else v
    return out


def take(pid, duration_s=10.0, hz=DEFAULT_HZ, procfs="/proc", tick=None, counters=True,
         switches=True, syscalls=wall.SYSCALLS):
    """One Wall of PID over DURATION_S (Ctrl-C ends the window early: the
    result is still returned, ``window.ended`` says so).  TICK(elapsed_s) is
    called about every 50 ms.  Raises NoSuchProcess / AccessDenied only when
    nothing at all could be measured."""
    missing = []
    reader, start = None, {}
    if counters:
        try:
            reader = counters_mod.Reader(pid, procfs)
        except NoSuchProcess:
            raise
        except AllocdiagError as exc:
            missing.append(wall.Missing("counters", f"allocator not read: {exc}",
                                        exc.remediation))
    kind = reader.kind if reader is not None else None
    if reader is not None:
        start, why = counters_mod.timed_read(reader)
        if why:
            missing.append(wall.Missing("counters", f"allocator counters not read: {why}"))
            reader = None
    t0 = time.monotonic()
    session = Session(pid, hz=hz, procfs=procfs, switches=switches, syscalls=syscalls)
    ended = session.run(duration_s, tick=tick)
    duration = time.monotonic() - t0
    end = {}
    if reader is not None and ended != wall.EXITED:
        end, why = counters_mod.timed_read(reader)
        if why:
            missing.append(wall.Missing("counters", f"allocator counters not read at the "
                                                    f"window's end: {why}"))
    elif reader is not None:
        missing.append(wall.Missing("counters", "the process exited during the window: "
                                                "no end reading"))
    cpu, off, faults, sc, sites, stacks = session.parts()
    w = wall.Wall(session.window(duration_s, ended, comm=_comm(procfs, pid), allocator=kind,
                                 extra_missing=missing),
                  cpu=cpu, off_cpu=off, faults=faults, syscalls=sc,
                  counters=counters_mod.deltas(start, end, duration) if end else
                  counters_mod.deltas(start, {}, duration) if start else {},
                  sites=sites, stacks=stacks)
    findings = wall_findings.rules(w, _env(reader) if reader is not None else {})
    return wall.Wall(w.window, w.cpu, w.off_cpu, w.faults, w.syscalls, w.counters, w.sites,
                     findings, w.stacks)
