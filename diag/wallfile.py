"""Wall windows in a recording (``record --wall``): the line written and the
``diag.model.wall.Wall`` read back.

A wall line is an event line of diag.recording (so every older reader skips
it): ``{"event": "wall", "taken_at": ISO-8601 end of the window, "pid",
"wall": Wall.to_json(stacks=True)}``.  ``wall_from_json`` is the inverse of
``Wall.to_json`` up to the document's rounding: counts and shares come back
exactly (the counts it gives only as shares, e.g. ``cpu.allocator_samples``,
as share x samples: exact for the six digits kept), while figures derived
from the window's duration (``per_s``, ``cpu.allocator_s``) are recomputed
over the duration as stored (to the millisecond), so they may differ in
their last digit.

Malformed wall documents raise ``diag.model.errors.MalformedData``.
"""

import datetime

from diag.model.errors import MalformedData
from diag.model import wall as W
from diag.jsondoc import Bad as _Bad, finding as _finding, obj as _obj

EVENT = "wall"      # the event name of a wall line


def _num(v, what, default=None):
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{what} is not a number: {v!r}")
    return v


def _int(v, what, default=None):
    v = _num(v, what, default)
    if v is not None and not isinstance(v, int):
        raise _Bad(f"{what} is not an integer: {v!r}")
    return v


def _list(v, what):
    if v is None:
        return []
    if not isinstance(v, list):
        raise _Bad(f"{what} is not a list")
    return v


def _count(share, total):
    """A count the document gives only as SHARE of TOTAL."""
    return 0 if share is None or not total else int(round(share * total))


def _functions(items, what):
    out = []
    for i, f in enumerate(_list(items, what)):
        f = _obj(f, f"{what}[{i}]")
        out.append(W.FunctionTime(str(f.get("function")), _int(f.get("samples"), what, 0),
                                  _num(f.get("seconds"), what, 0.0),
                                  _num(f.get("share"), what, 0.0)))
    return tuple(out)


def _cpu(doc):
    if doc is None:
        return None
    doc = _obj(doc, "cpu")
    n = _int(doc.get("samples"), "cpu.samples", 0)
    share = {k: _num(doc.get(k), f"cpu.{k}") for k in
             ("allocator_share", "unknown_share", "unwound_share", "kernel_share")}
    return W.Cpu(samples=n, seconds=_num(doc.get("seconds"), "cpu.seconds", 0.0),
                 allocator_samples=_count(share["allocator_share"], n),
                 unknown_samples=_count(share["unknown_share"], n),
                 unwound_samples=_count(share["unwound_share"], n),
                 kernel_samples=_count(share["kernel_share"], n),
                 by_function=_functions(doc.get("by_function"), "cpu.by_function"),
                 by_entry=_functions(doc.get("by_entry"), "cpu.by_entry"))


def _off_cpu(doc):
    if doc is None:
        return None
    doc = _obj(doc, "off_cpu")
    kw = {k: _num(doc.get(k), f"off_cpu.{k}", 0.0)
          for k in ("thread_s", "blocked_s", "preempted_s", "allocator_lock_s")}
    kw.update({k: _int(doc.get(k), f"off_cpu.{k}", 0) for k in
               ("blocked_switches", "preempted_switches", "allocator_lock_switches",
                "switches_sampled")})
    return W.OffCpu(by_function=_functions(doc.get("by_function"), "off_cpu.by_function"), **kw)


def _window(doc):
    doc = _obj(doc, "window")
    pid = doc.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise _Bad(f"window.pid is not an integer: {pid!r}")
    missing = tuple(W.Missing(str(m.get("figure")), str(m.get("reason")), m.get("fix"))
                    for m in (_obj(x, "window.missing[]")
                              for x in _list(doc.get("missing"), "window.missing")))
    ints = {k: _int(doc.get(k), f"window.{k}", 0) for k in
            ("samples", "switch_samples", "lost", "threads_seen", "threads_exited")}
    return W.Window(pid=pid, start=_num(doc.get("start"), "window.start", 0.0),
                    duration_s=_num(doc.get("duration_s"), "window.duration_s", 0.0),
                    requested_s=_num(doc.get("requested_s"), "window.requested_s", 0.0),
                    hz=_int(doc.get("hz"), "window.hz", 0), ended=doc.get("ended", W.COMPLETE),
                    comm=doc.get("comm"), allocator=doc.get("allocator"),
                    reader_cpu_s=_num(doc.get("reader_cpu_s"), "window.reader_cpu_s"),
                    missing=missing, pause_us=tuple(
                        _num(p, "window.pause_us[]")
                        for p in _list(doc.get("pause_us"), "window.pause_us")), **ints)


def _wall(doc):
    doc = _obj(doc, "wall")
    if doc.get("kind") != "wall":
        raise _Bad(f"kind is {doc.get('kind')!r}, not 'wall'")
    if doc.get("schema_version") != W.SCHEMA_VERSION:
        raise _Bad(f"schema_version {doc.get('schema_version')!r} "
                   f"(this allocdiag reads {W.SCHEMA_VERSION})")
    window = _window(doc.get("window"))
    d = window.duration_s
    faults = doc.get("faults")
    if faults is not None:
        faults = _obj(faults, "faults")
        faults = W.Faults(_int(faults.get("minor"), "faults.minor"),
                          _int(faults.get("major"), "faults.major"), d)
    syscalls = {}
    for name, s in _obj(doc.get("syscalls"), "syscalls").items():
        s = _obj(s, f"syscalls.{name}")
        syscalls[name] = W.SyscallRate(name, _int(s.get("count"), f"syscalls.{name}.count"), d,
                                       *(_int(s.get(k), f"syscalls.{name}.{k}", 0)
                                         for k in ("sampled", "from_allocator", "unknown")))
    counters = {}
    for name, c in _obj(doc.get("counters"), "counters").items():
        c = _obj(c, f"counters.{name}")
        counters[name] = W.Counter(name, _int(c.get("start"), f"counters.{name}.start"),
                                   _int(c.get("end"), f"counters.{name}.end"), d,
                                   unit=c.get("unit", "count"), kind=c.get("kind", "delta"),
                                   provenance=c.get("provenance", "measured"),
                                   source=c.get("source"))
    sites = tuple(W.Site(str(s.get("function")), tuple(_list(s.get("frames"), "sites.frames")),
                         s.get("entry"), _int(s.get("allocator_samples"), "sites", 0),
                         _num(s.get("allocator_cpu_s"), "sites", 0.0),
                         _num(s.get("lock_wait_s"), "sites", 0.0),
                         _int(s.get("lock_switches"), "sites", 0))
                  for s in (_obj(x, "sites[]") for x in _list(doc.get("sites"), "sites")))
    stacks = tuple(W.Stack(tuple(_list(s.get("frames"), "stacks.frames")),
                           _int(s.get("weight"), "stacks.weight", 0), s.get("kind", "cpu"),
                           bool(s.get("allocator")))
                   for s in (_obj(x, "stacks[]") for x in _list(doc.get("stacks"), "stacks")))
    return W.Wall(window, cpu=_cpu(doc.get("cpu")), off_cpu=_off_cpu(doc.get("off_cpu")),
                  faults=faults, syscalls=syscalls, counters=counters, sites=sites,
                  findings=tuple(_finding(f, f"findings[{i}]")
                                 for i, f in enumerate(_list(doc.get("findings"), "findings"))),
                  stacks=stacks)


def wall_from_json(doc):
    """The Wall whose ``to_json(stacks=True)`` is DOC.  Raises MalformedData."""
    try:
        return _wall(doc)
    except _Bad as exc:
        raise MalformedData(f"not an allocdiag wall document: {exc}") from None


def wall_event(wall):
    """The event document of one window (for ``Recorder.write_event(EVENT, ...)``)."""
    end = wall.window.start + wall.window.duration_s
    return {"taken_at": datetime.datetime.fromtimestamp(
                end, datetime.timezone.utc).isoformat(timespec="microseconds"),
            "pid": wall.window.pid, "wall": wall.to_json(stacks=True)}


def walls_of(events):
    """[(taken_at, Wall)] of the wall lines among a recording's EVENTS
    (diag.recording.read_recording_events), in file order."""
    out = []
    for e in events:
        if e.get("event") != EVENT:
            continue
        try:
            out.append((e.get("taken_at"), wall_from_json(e.get("wall"))))
        except MalformedData as exc:
            raise MalformedData(f"wall line at {e.get('taken_at')}: {exc.msg}") from None
    return out


def wall_at(walls, t):
    """The window of WALLS ([(taken_at, Wall)]) that covers time T (unix
    seconds), else the last one ending before T, else None."""
    best = None
    for taken_at, w in walls:
        start = w.window.start
        if start <= t <= (taken_at if taken_at is not None else start + w.window.duration_s):
            return w
        if taken_at is not None and taken_at <= t:
            best = w
    return best
