"""Record a process's snapshots to a file and read them back (replay).

Format: JSON Lines, one snapshot per line, each line exactly the document of
``Snapshot.to_json()`` (the ``inspect --json`` contract of DESIGN.md).  A
name ending in ``.gz`` is gzip-compressed.  Each line is flushed as it is
written, so a recording cut off by a crash loses at most its last line.

``snapshot_from_json`` is the inverse of ``Snapshot.to_json``: for any
document ``doc`` read from a recording,
``json.dumps(snapshot_from_json(doc).to_json()) == json.dumps(doc)``.
(``taken_at`` is stored as an ISO-8601 string with microseconds, so a
Snapshot whose ``taken_at`` had finer precision comes back rounded to the
microsecond; ``native`` comes back as JSON has it: lists, string keys.)

A file that is not such a recording raises ``diag.model.errors.BadInput`` (a
MalformedData with the usage exit code: the user named the wrong file)
naming the line and what was expected, never a bare JSON or gzip traceback.

Event lines: a recording may also hold lines that are not snapshots but
something that happened to the process while it was recorded -- today only
``{"event": "release", "taken_at", "pid", "call", "return", "pause_us",
"before": <snapshot>, "after": <snapshot>}`` (or ``"error"`` instead of the
figures when the release failed), written by ``record --release-at`` and
``release --record FILE``.  A line is an event when its object has the key
``event`` (a snapshot document never has it).  ``read_recording`` skips
event lines, so replay and every older reader see only the snapshots;
``read_recording_events`` returns both.  Snapshot lines are unchanged.
"""

import contextlib
import datetime
import gzip
import json
import os
import time
import zlib

from diag.model.records import field_names
from diag.model.errors import BadInput, MalformedData, NoSuchProcess
from diag.jsondoc import Bad as _Bad, finding as _finding, int_or_none as _int_or_none, \
    obj as _obj
from diag.model import (SCHEMA_VERSION, Allocator, AllocatorRef, Binding, CgroupMemory,
                        CollectorStatus, Preload, ProcessMemory, Runtime, Snapshot, Value)

__all__ = ["Recorder", "read_recording", "read_recording_events", "snapshot_from_json",
           "record", "RecordInterrupted", "release_event", "append_event", "EVENT_KEY"]

# The key that marks an event line (see the module docstring).
EVENT_KEY = "event"
# What a reader of a recording expects, said in every BadInput about one.
EXPECTED = ("expected a recording made by allocdiag record: one JSON snapshot per line, "
            "gzip-compressed when the name ends in .gz")


def open_text(path, mode="r"):
    """A recording (or any allocdiag text file) opened as text; gzip when the
    name ends in .gz."""
    if str(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


class Recorder:
    """Append snapshots to PATH, one JSON document per line.

    Use as a context manager or call ``close()``.  ``count`` is the number of
    snapshots written so far.
    """

    def __init__(self, path, append=False):
        self.path = str(path)
        self.count = 0
        self.events = 0
        self._append = append
        self._f = None
        self._closed = False
        self._kept = {}     # Snapshot.json_text's texts of what the snapshots share
        # An unwritable path fails here, before any process is stopped; the
        # file is truncated only when the first line is written.  A recording
        # whose first snapshot fails (no such process, a kernel thread) leaves
        # a file that was there as it was, and no empty file where none was.
        self._created = not os.path.exists(self.path)
        with open(self.path, "ab"):
            pass

    def write(self, snapshot):
        self._text(snapshot.json_text(self._kept))
        self.count += 1

    def write_event(self, kind, doc):
        """One event line: ``{"event": KIND, **DOC}`` (not counted in ``count``)."""
        self._line({EVENT_KEY: kind, **doc})
        self.events += 1

    def _line(self, doc):
        self._text(json.dumps(doc, separators=(",", ":")))

    def _text(self, text):
        if self._f is None:
            if self._closed:
                raise ValueError(f"{self.path}: the recording is closed")
            # gzip in append mode adds a member; readers see one stream.
            self._f = open_text(self.path, "a" if self._append else "w")
        self._f.write(text + "\n")
        self._f.flush()

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None
        elif not self._closed and self._created:
            with contextlib.suppress(OSError):      # nothing was written: none made
                os.unlink(self.path)
        self._closed = True

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- JSON -> model ---------------------------------------------------------

def _str_or_none(v, what):
    if v is None or isinstance(v, str):
        return v
    raise _Bad(f"{what} is not a string: {v!r}")


def _tuple(v, what):
    if v is None:
        return ()
    if not isinstance(v, list):
        raise _Bad(f"{what} is not a list")
    return tuple(v)


def _ints(cls, doc, what, text=("path", "error", "source")):
    """A record of optional ints (plus a few text fields) from DOC."""
    doc = _obj(doc, what)
    kwargs = {}
    for name in field_names(cls):
        if name not in doc:
            continue
        v = doc[name]
        kwargs[name] = (_str_or_none(v, f"{what}.{name}") if name in text
                        else _int_or_none(v, f"{what}.{name}"))
    return cls(**kwargs)


def _allocator_ref(doc, what, cls=AllocatorRef):
    doc = _obj(doc, what)
    kwargs = {k: _str_or_none(doc.get(k), f"{what}.{k}")
              for k in ("version", "linkage", "path", "prefix", "variant")}
    kwargs["kind"] = _str_or_none(doc.get("kind", "unknown"), f"{what}.kind") or "unknown"
    kwargs["evidence"] = _tuple(doc.get("evidence"), f"{what}.evidence")
    if cls is Allocator:
        kwargs["others"] = tuple(_allocator_ref(o, f"{what}.others[{i}]")
                                 for i, o in enumerate(_tuple(doc.get("others"),
                                                              f"{what}.others")))
    return cls(**kwargs)


def _preload(doc):
    doc = _obj(doc, "preload")
    bindings = []
    for i, b in enumerate(_tuple(doc.get("bindings"), "preload.bindings")):
        b = _obj(b, f"preload.bindings[{i}]")
        try:
            bindings.append(Binding(**{k: b[k] for k in field_names(Binding) if k in b}))
        except TypeError as exc:
            raise _Bad(f"preload.bindings[{i}]: {exc}") from None
    eff = doc.get("effective")
    if eff is not None and not isinstance(eff, bool):
        raise _Bad(f"preload.effective is not true/false/null: {eff!r}")
    return Preload(requested=_tuple(doc.get("requested"), "preload.requested"),
                   effective=eff,
                   verdict=_str_or_none(doc.get("verdict", "none requested"), "preload.verdict"),
                   reasons=_tuple(doc.get("reasons"), "preload.reasons"),
                   notes=_tuple(doc.get("notes"), "preload.notes"),
                   bindings=tuple(bindings))


def _value(doc, what):
    doc = _obj(doc, what)
    return Value(value=_int_or_none(doc.get("value"), f"{what}.value"),
                 provenance=_str_or_none(doc.get("provenance", "unknown"),
                                         f"{what}.provenance"),
                 source=_str_or_none(doc.get("source"), f"{what}.source"),
                 raw=_int_or_none(doc.get("raw"), f"{what}.raw"),
                 raw_provenance=_str_or_none(doc.get("raw_provenance"), f"{what}.raw_provenance"))


_RUNTIME_KEYS = ("kind", "version", "path", "located_by", "reason", "missed")


def _runtime(doc):
    """The ``runtime`` object: its fixed keys, every other key a Value."""
    if doc is None:
        return None
    doc = _obj(doc, "runtime")
    values = {k: _value(v, f"runtime.{k}") for k, v in doc.items() if k not in _RUNTIME_KEYS}
    return Runtime(kind=_str_or_none(doc.get("kind", "unknown"), "runtime.kind"),
                   version=_str_or_none(doc.get("version"), "runtime.version"),
                   path=_str_or_none(doc.get("path"), "runtime.path"), values=values,
                   located_by=_str_or_none(doc.get("located_by"), "runtime.located_by"),
                   reason=_str_or_none(doc.get("reason"), "runtime.reason"),
                   missed=_tuple(doc.get("missed"), "runtime.missed"))


def _collector(doc, what):
    doc = _obj(doc, what)
    dur = doc.get("duration_s", 0.0)
    if not isinstance(dur, (int, float)) or isinstance(dur, bool):
        raise _Bad(f"{what}.duration_s is not a number")
    return CollectorStatus(ok=bool(doc.get("ok", True)),
                           error=_str_or_none(doc.get("error"), f"{what}.error"),
                           duration_s=dur,
                           pause_us=_int_or_none(doc.get("pause_us"), f"{what}.pause_us"))


def _taken_at(text):
    if text is None:
        return None
    if not isinstance(text, str):
        raise _Bad(f"taken_at is not an ISO-8601 string: {text!r}")
    try:
        dt = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise _Bad(f"taken_at is not an ISO-8601 time: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


def snapshot_from_json(doc):
    """The Snapshot whose ``to_json()`` is DOC.  Raises MalformedData."""
    try:
        return _snapshot(doc)
    except _Bad as exc:
        raise MalformedData(f"not an allocdiag snapshot: {exc}") from None


def _snapshot(doc):
    doc = _obj(doc, "snapshot")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _Bad(f"schema_version {version!r} (this allocdiag reads {SCHEMA_VERSION})")
    pid = doc.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise _Bad(f"pid is not an integer: {pid!r}")
    stats = {k: _value(v, f"stats.{k}") for k, v in _obj(doc.get("stats"), "stats").items()}
    collectors = {k: _collector(v, f"collectors.{k}")
                  for k, v in _obj(doc.get("collectors"), "collectors").items()}
    return Snapshot(
        pid=pid, comm=_str_or_none(doc.get("comm"), "comm"),
        exe=_str_or_none(doc.get("exe"), "exe"),
        taken_at=_taken_at(doc.get("taken_at")),
        allocator=_allocator_ref(doc.get("allocator"), "allocator", Allocator),
        preload=_preload(doc.get("preload")),
        process=_ints(ProcessMemory, doc.get("process"), "process"),
        cgroup=_ints(CgroupMemory, doc.get("cgroup"), "cgroup"),
        stats=stats, native=_obj(doc.get("native"), "native"),
        findings=tuple(_finding(f, f"findings[{i}]")
                       for i, f in enumerate(_tuple(doc.get("findings"), "findings"))),
        collectors=collectors, schema_version=version, runtime=_runtime(doc.get("runtime")))


def read_recording(path):
    """All snapshots of the recording at PATH, in order (event lines skipped).

    Raises BadInput (with the line number) for a file that is not a
    recording, a truncated line, or an empty file; OSError when it cannot be
    opened at all.
    """
    return read_recording_events(path)[0]


def _event(doc, what):
    """An event line as a dict; its ``before``/``after`` snapshots as Snapshots."""
    kind = doc.get(EVENT_KEY)
    if not isinstance(kind, str):
        raise MalformedData(f"{what}: event is not a name: {kind!r}")
    out = dict(doc)
    out["taken_at"] = _taken_at_or_bad(doc.get("taken_at"), what)
    for key in ("before", "after"):
        if doc.get(key) is not None:
            try:
                out[key] = snapshot_from_json(doc[key])
            except MalformedData as exc:
                raise MalformedData(f"{what}: {kind} {key}: {exc.msg}") from None
    return out


def _taken_at_or_bad(text, what):
    try:
        return _taken_at(text)
    except _Bad as exc:
        raise MalformedData(f"{what}: {exc}") from None


def read_recording_events(path):
    """(snapshots, events) of the recording at PATH, each in file order.

    Events are dicts as written (see the module docstring) with ``taken_at``
    as unix seconds and ``before``/``after`` as Snapshots.  Errors as
    ``read_recording``.
    """
    out = []
    events = []
    lineno = 0
    try:
        with open_text(path, "r") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                truncated = not line.endswith("\n")
                try:
                    doc = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    what = "truncated (the recording was cut off?)" if truncated else \
                        f"not JSON ({exc})"
                    if lineno == 1 and not truncated:
                        raise BadInput(f"{path}: not a recording ({EXPECTED}; line 1 is "
                                       "not JSON)") from None
                    raise BadInput(f"{path}: line {lineno}: {what}") from None
                try:
                    if isinstance(doc, dict) and EVENT_KEY in doc:
                        events.append(_event(doc, f"{path}: line {lineno}"))
                    else:
                        out.append(snapshot_from_json(doc))
                except MalformedData as exc:
                    where = "" if exc.msg.startswith(f"{path}: ") else f"{path}: line {lineno}: "
                    # nothing read yet: the file is not a recording at all
                    hint = "" if out or events else f" ({EXPECTED})"
                    raise BadInput(where + exc.msg + hint) from None
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: after line {lineno}: not a readable recording ({EXPECTED}; "
                       f"{exc.__class__.__name__}: {exc})") from None
    if not out:
        raise BadInput(f"{path}: no snapshots in the recording ({EXPECTED})")
    return out, events


def release_event(result):
    """The event document of one ``diag.actions.release`` RESULT (a dict with
    before/after Snapshots, call, return, pause_us), for ``write_event``."""
    after = result["after"]
    return {"taken_at": after.to_json()["taken_at"], "pid": after.pid,
            "call": result.get("call"), "return": result.get("return"),
            "pause_us": result.get("pause_us"),
            "skipped_syscalls": result.get("skipped_syscalls") or [],
            "before": result["before"].to_json(), "after": after.to_json()}


def returned_words(value):
    """How a release call's return VALUE reads ("returned 1"; "done" for a
    void call, whose JSON "return" is null)."""
    return "done" if value is None else f"returned {value}"


def append_event(path, kind, doc):
    """Append one event line to the recording at PATH (created if missing)."""
    with Recorder(path, append=True) as rec:
        rec.write_event(kind, doc)


def _default_sampler(no_attach):
    """``sampler(pid) -> Snapshot`` of ``record``: one diag.snapshot.Session
    for the recorded process, so each snapshot after the first re-reads only
    what can have changed (a recording's CPU per snapshot is what a busy host
    pays for it)."""
    from diag import snapshot as snapshot_mod
    sessions = {}

    def sample(pid):
        session = sessions.get(pid)
        if session is None:
            sessions.clear()        # record samples one process: keep one session
            session = sessions[pid] = snapshot_mod.Session(pid, attach=not no_attach)
        return session.take()[0]
    return sample


def _record_wall(rec, wall, pid, seconds, stop):
    """One wall window of SECONDS written as a wall line; a process that
    exits during it ends the window (the next snapshot ends the recording).
    The sampler ends a window on Ctrl-C and returns it (``interrupted``):
    it is written, then the interrupt goes on to end the recording."""
    from diag import wallfile
    from diag.model import wall as wall_model
    try:
        w = wall(pid, seconds, stop)
    except NoSuchProcess:
        return
    if w is not None:
        rec.write_event(wallfile.EVENT, wallfile.wall_event(w))
        if w.window.ended == wall_model.INTERRUPTED and not (stop is not None and stop()):
            raise KeyboardInterrupt


def record(pid, path, interval=2.0, duration=None, progress_cb=None, no_attach=False,
           sampler=None, stop=None, events=(), interrupt=None, wall=None):
    """Sample PID every INTERVAL seconds into the recording PATH.

    Stops after DURATION seconds (None: until interrupted or the process
    exits), or when ``stop()`` returns true.  ``progress_cb(count, snapshot)``
    is called after each written sample.  A process that exits after the
    first sample ends the recording normally; one that does not exist at the
    start raises NoSuchProcess.  Returns the number of snapshots written.
    ``sampler(pid) -> Snapshot`` replaces ``diag.snapshot.take`` (tests,
    library use).  EVENTS: ``(at_s, fn)`` pairs; after the first sample at
    or past AT_S seconds into the recording, ``fn(pid)`` is called once and
    the ``(kind, doc)`` it returns is written as an event line (e.g. a
    release: ``lambda pid: ("release", release_event(actions.release(pid)))``).
    INTERRUPT: a ``threading.Event`` a signal handler sets (``record`` on
    SIGTERM/SIGINT/SIGHUP): the sample being taken is finished and written,
    the wait for the next one ends at once, and the count is returned.
    A KeyboardInterrupt (a second Ctrl-C) leaves the file closed with whole
    lines; the count it holds is then ``RecordInterrupted.count``.
    WALL (``record --wall``): ``wall(pid, seconds, stop) -> diag.model.wall.Wall``
    samples the process's allocation wall; it is called instead of sleeping
    between two samples, so the windows cover the recording, and each is
    written as a wall line (diag.wallfile) after the snapshot it follows.
    """
    sampler = sampler or _default_sampler(no_attach)
    pending = sorted(events, key=lambda e: e[0])
    with Recorder(path) as rec:
        try:
            _record_loop(rec, pid, sampler, interval, duration, progress_cb, stop, pending,
                         interrupt, wall)
        except KeyboardInterrupt:
            raise RecordInterrupted(rec.count) from None
        return rec.count


class RecordInterrupted(KeyboardInterrupt):
    """Ctrl-C inside ``record``: ``count`` snapshots are in the (closed) file."""

    def __init__(self, count):
        super().__init__(count)
        self.count = count


def _record_loop(rec, pid, sampler, interval, duration, progress_cb, stop, pending, interrupt,
                 wall):
    start = next_at = time.monotonic()

    def stopped():
        # a wall window ends early on the caller's stop or a stop signal
        return bool((stop is not None and stop()) or (interrupt is not None and interrupt.is_set()))
    while interrupt is None or not interrupt.is_set():
        try:
            snap = sampler(pid)
        except NoSuchProcess:
            if rec.count == 0:
                raise
            break
        rec.write(snap)
        if progress_cb is not None:
            progress_cb(rec.count, snap)
        while pending and time.monotonic() - start >= pending[0][0]:
            _at, fn = pending.pop(0)
            rec.write_event(*fn(pid))
        next_at += interval
        now = time.monotonic()
        if duration is not None and next_at - start > duration + 1e-9:
            break
        if stop is not None and stop():
            break
        if wall is not None and next_at > now:
            _record_wall(rec, wall, pid, next_at - now, stopped)
            now = time.monotonic()
        if next_at > now:
            if interrupt is not None:
                interrupt.wait(next_at - now)
            else:
                time.sleep(next_at - now)
        else:
            next_at = now   # sampling is slower than the interval: don't burst
