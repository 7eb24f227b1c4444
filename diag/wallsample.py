"""One wall window of a live process that the caller can end early: the
adapter through which the TUI's Time tab, ``record --wall`` and the
exporter's ``--wall`` reach ``diag.wall_take.take`` (counters, sampling
window, counters, findings).

``take`` ends a window early on Ctrl-C (its session catches
KeyboardInterrupt and still returns what was gathered, ``window.ended`` =
interrupted).  A tab that is left or a recording that is stopped is not a
Ctrl-C, so until ``take`` has a ``stop`` argument of its own, ``sample``
gives it a ``tick`` (called about every 50 ms inside the window) that raises
``Stopped``, a KeyboardInterrupt, when ``stop()`` turns true.  A ``lock``
(the TUI's one-call-into-the-target lock) is passed on where ``take``
accepts one, so its two counter reads never overlap another call.
"""

import inspect

from diag import wall_take

DEFAULT_HZ = wall_take.DEFAULT_HZ


class Stopped(KeyboardInterrupt):
    """The caller asked the window to end (not the user's Ctrl-C)."""


def _ticker(stop, tick):
    def ticked(elapsed):
        if stop():
            raise Stopped()
        if tick is not None:
            tick(elapsed)
    return ticked


def sample(pid, seconds, hz=DEFAULT_HZ, stop=None, counters=True, tick=None, lock=None):
    """The Wall of PID over SECONDS, ended early (INTERRUPTED) once
    ``stop()`` is true.  COUNTERS: read the allocator's own counters at both
    ends (two short stops) and make findings.  Raises what ``take`` raises
    (NoSuchProcess, AccessDenied with the fix) when nothing could be measured."""
    params = inspect.signature(wall_take.take).parameters
    kw = {"hz": hz, "counters": counters, "tick": tick}
    if stop is not None:
        if "stop" in params:
            kw["stop"] = stop
        else:
            kw["tick"] = _ticker(stop, tick)
    if lock is not None and "lock" in params:
        kw["lock"] = lock
    return wall_take.take(pid, seconds, **kw)
