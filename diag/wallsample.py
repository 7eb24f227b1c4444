"""One wall window of a live process, ended by time or by the caller: the
adapter through which the TUI's Time tab, ``record --wall`` and the
exporter's ``--wall`` reach the sampler (collectors.sampler).

``sample(pid, seconds, stop=...)`` drives a ``collectors.sampler.session.
Session`` (start, poll every DRAIN_S, stop) so a caller can end the window
early (a tab left, a recording stopped) and still get what was gathered, and
returns an immutable ``diag.wall.Wall``.  ``counters=True`` adds the
allocator's own counters and the findings when the sampler offers them
(they cost two short borrowed-call stops; the exporter asks without).
"""

import importlib
import time

from diag import wall as W

DEFAULT_HZ = 99
DRAIN_S = 0.05      # reference/cpu-wall.md: drain every 50 ms


def _session_module():
    return importlib.import_module("collectors.sampler.session")


def _finish(pid, session, requested_s, ended, counters):
    """The Wall of a stopped SESSION; with COUNTERS, the sampler's own
    assembly (counters, findings) where it has one."""
    build = getattr(importlib.import_module("collectors.sampler"), "build_wall", None)
    if counters and build is not None:
        return build(pid, session, requested_s, ended)
    window = session.window(requested_s, ended)
    cpu, off, faults, syscalls, sites, stacks = session.parts()
    return W.Wall(window, cpu=cpu, off_cpu=off, faults=faults, syscalls=syscalls,
                  sites=sites, stacks=stacks)


def sample(pid, seconds, hz=DEFAULT_HZ, stop=None, counters=True, tick=None):
    """The wall of PID over SECONDS (less when ``stop()`` turns true: the
    window then ends INTERRUPTED, or EXITED when the process goes).
    Raises what the sampler raises (NoSuchProcess, AccessDenied with the
    fix) when nothing at all could be opened."""
    session = _session_module().Session(pid, hz=hz)
    session.start()
    ended = W.COMPLETE
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if stop is not None and stop():
                ended = W.INTERRUPTED
                break
            time.sleep(min(DRAIN_S, left))
            if not session.poll():
                ended = W.EXITED
                break
            if tick is not None:
                tick(seconds - max(0.0, deadline - time.monotonic()))
    finally:
        session.stop()
    return _finish(pid, session, seconds, ended, counters)
