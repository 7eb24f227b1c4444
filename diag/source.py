"""Where the TUI gets its data: the data-source interface the TUI renders
(tui/ imports this and diag's model, never collectors/; the app never reads
/proc or ptrace itself).

Three roles, each a small duck-typed interface (tests inject fakes built
from constructed Snapshots):

``HostSource``
    ``scan() -> ScanResult``-like object: ``.rows`` (dicts as in
    ``diag.hostscan``, the host view's columns), ``.denied``, ``.vanished``.

``ProcessSource``
    ``sample() -> Snapshot`` (raises NoSuchProcess / AccessDenied /
    other AllocdiagError); ``release() -> dict`` (before/after);
    ``set_knob(name, value) -> (old, new)``; ``backlog() -> [Snapshot]``
    (samples taken before the view opened; empty for a live process);
    ``close()`` (detach).  Attributes: ``pid``, ``live`` (True: poll it;
    False: a fixed series to navigate), ``no_attach``, ``label``.
    Heap profiles (the Heap tab; ``diag.actions`` over ``collectors.heapcontrol``):
    ``heap_status() -> dict`` (what is possible and why, or how),
    ``heap_start() -> dict``, ``heap_stop(force=False) -> dict``, ``heap_dump() ->
    dict`` with ``view`` (a ``diag.heapview.ProfileView``), ``snapshot``
    (the process right after the dump: the diff's allocator and kernel
    layers; None when it could not be read), ``call``, ``notes``,
    ``pause_us``.
    The allocation wall (the Time tab; ``diag.wallsample``): ``wall(seconds,
    stop, lock) -> diag.model.wall.Wall``, one window of perf_event_open sampling that
    ends early when ``stop()`` is true (LOCK: held around its calls into the
    process); ``wall_unavailable() -> str or None``
    (why this source cannot sample); ``walls() -> [(taken_at, Wall)]`` (the
    windows recorded with ``record --wall``; empty for a live process).

``ReplaySource``
    A ProcessSource over a recording: ``live`` is False, ``backlog()`` is
    the whole recording, ``sample()`` returns its last snapshot, actions
    raise ActionUnavailable (heap profiles need a live process).

Sources are called from worker threads; they must not touch the UI.
"""

import importlib
import inspect

from diag.model.errors import AllocdiagError
from diag.model.exitcodes import ExitCode


NEEDS_LIVE_PROCESS = "heap profiles need a live process: a recording has none"
WALL_NO_ATTACH = ("the allocation wall is not sampled with --no-attach: it opens "
                  "perf_event_open on the process's threads and reads the allocator's "
                  "counters with two short stops (run without --no-attach, or use "
                  "`allocdiag wall PID`)")
WALL_NOT_RECORDED = ("this recording has no wall figures: record with `allocdiag record PID "
                     "-o FILE --wall` (a recording cannot be sampled)")


class ActionUnavailable(AllocdiagError):
    """An action the source cannot perform (yet, or in this mode)."""

    exit_code = ExitCode.UNSUPPORTED


def _actions_module():
    """``diag.actions``, imported on first use (it pulls in the remote engine)."""
    return importlib.import_module("diag.actions")


class HostSource:
    """Every readable process on this host (``diag.hostscan.HostScanner``),
    refreshed incrementally: a process whose /proc/PID/stat shows no
    activity since the previous scan keeps its row unread."""

    def __init__(self, procfs_root="/proc", pids=None, live=None):
        self.procfs_root = procfs_root
        self.pids = list(pids) if pids is not None else None   # demo: only these
        self.scanner = None     # diag.hostscan.HostScanner, made on the first scan
        # diag.hostlive.HostLive: fills "allocator resident" and the top
        # finding from its cache (read in the background at a bounded rate)
        self.live = live

    def scan(self):
        if self.scanner is None:
            from diag import hostscan
            self.scanner = hostscan.HostScanner(self.procfs_root, hostscan.HOST_VIEW_COLUMNS,
                                                incremental=True)
        result = self.scanner.scan(self.pids)
        if self.live is not None:
            self.live.annotate(result.rows)     # a cache lookup: never waits for a stop
        return result


class ProcessSource:
    """One live process, sampled with ``diag.snapshot.take``."""

    live = True

    def __init__(self, pid, no_attach=False):
        self.pid = int(pid)
        self.no_attach = bool(no_attach)
        self.label = f"pid {self.pid}" + (" (--no-attach)" if self.no_attach else "")
        self._take_kwargs = None

    def _kwargs(self, take):
        # diag.snapshot.take grows its remote-stats switch separately; pass
        # --no-attach under whichever name it has, or not at all (procfs only).
        if self._take_kwargs is None:
            params = inspect.signature(take).parameters
            if "no_attach" in params:
                self._take_kwargs = {"no_attach": self.no_attach}
            elif "attach" in params:
                self._take_kwargs = {"attach": not self.no_attach}
            else:
                self._take_kwargs = {}
        return self._take_kwargs

    def sample(self):
        from diag import snapshot
        snap, _collected = snapshot.take(self.pid, **self._kwargs(snapshot.take))
        return snap

    def backlog(self):
        return []

    def _action(self, name):
        if self.no_attach:
            raise ActionUnavailable(f"{name} needs to call into the process; "
                                    "started with --no-attach", pid=self.pid)
        return getattr(_actions_module(), name)

    def release(self):
        """``diag.actions.release``: a dict with ``before``/``after`` (Snapshots or
        dicts of numbers), ``call`` and the pause."""
        return self._action("release")(self.pid)

    def set_knob(self, name, value):
        """``diag.actions.set_knob`` -> (old, new)."""
        result = self._action("set_knob")(self.pid, name, value)
        if isinstance(result, dict):
            return result.get("old"), result.get("new")
        return tuple(result)

    # heap profiles: the allocator's own profiler, on an explicit user action
    def _heap_action(self, what):
        if self.no_attach:
            raise ActionUnavailable(f"heap {what} needs to call into the process; "
                                    "started with --no-attach", pid=self.pid)
        return getattr(_actions_module(), f"heap_{what}")

    def heap_status(self):
        return self._heap_action("status")(self.pid)

    def heap_start(self):
        return self._heap_action("start")(self.pid)

    def heap_stop(self, force=False):
        """FORCE: also a gperftools profile the program started itself."""
        return self._heap_action("stop")(self.pid, force=force)

    def heap_dump(self):
        """The profile now, parsed and symbolized through the process's own
        root (containers), and the process right after it."""
        view, info = self._heap_action("dump")(self.pid)
        try:
            snap = self.sample()
        except AllocdiagError as exc:
            snap = None
            info = dict(info, notes=list(info.get("notes") or ())
                        + [f"no snapshot after the dump: {exc}"])
        return dict(info, view=view, snapshot=snap)

    # the allocation wall: perf_event_open sampling, no thread stopped
    def wall_unavailable(self):
        return WALL_NO_ATTACH if self.no_attach else None

    def wall(self, seconds, stop=None, lock=None):
        if self.no_attach:
            raise ActionUnavailable(WALL_NO_ATTACH, pid=self.pid)
        from diag import wallsample
        return wallsample.sample(self.pid, seconds, stop=stop, lock=lock)

    def walls(self):
        return []

    def close(self):
        """Leave nothing attached: every snapshot detaches after its calls, but a
        thread that did not stop in time is held as an orphan until it does
        (collectors.engine.remote); restore and detach this process's orphans now.
        Returns the tids still held (the at-exit reaper retries them)."""
        if self.no_attach:
            return []
        return _actions_module().detach_orphans(self.pid)


class ReplaySource:
    """A recording (``diag.recording``) seen through the ProcessSource interface."""

    live = False
    no_attach = True

    def __init__(self, path=None, snapshots=None, walls=None):
        if snapshots is None:
            from diag.recording import read_recording_events
            from diag.wallfile import walls_of
            snapshots, events = read_recording_events(path)   # MalformedData on a bad file
            walls = walls_of(events) if walls is None else walls
        self.path = path
        self.snapshots = list(snapshots)
        self._walls = list(walls or ())
        first = self.snapshots[0]
        self.pid = first.pid
        self.label = f"replay {path}" if path else "replay"

    def sample(self):
        return self.snapshots[-1]

    def backlog(self):
        return list(self.snapshots)

    def release(self):
        raise ActionUnavailable("a recording cannot release memory")

    def set_knob(self, name, value):
        raise ActionUnavailable("a recording has no knobs to set")

    def _no_heap(self, *args, **kwargs):
        raise ActionUnavailable(NEEDS_LIVE_PROCESS)

    heap_status = heap_start = heap_dump = heap_stop = _no_heap

    def wall_unavailable(self):
        return None if self._walls else WALL_NOT_RECORDED

    def wall(self, seconds, stop=None, lock=None):
        raise ActionUnavailable(self.wall_unavailable() or "a recording cannot be sampled")

    def walls(self):
        return list(self._walls)

    def close(self):
        pass
