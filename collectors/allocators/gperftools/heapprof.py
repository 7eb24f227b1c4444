"""gperftools' heap profiler (full libtcmalloc.so.4; src/gperftools/heap-profiler.h),
driven by collectors.heapcontrol: HeapProfilerStart / GetHeapProfile /
HeapProfilerStop on one borrowed thread."""

from __future__ import annotations

import os
import re
from typing import Any

from collectors.allocators import common
from collectors.heapcontrol import (GPERF_PREFIX, PROFILE_MAX, profiler_env, restart_recipe,
                                    work_dir)
from diag.model.errors import MalformedData, RemoteCallError, Unsupported


# gperftools 2.10 GetHeapProfile writes into malloc(kProfileBufferSize = 1 MiB)
# and leaves out the smallest buckets when they do not fit (the maps are kept);
# later versions strdup a text of any size.
GPERF_2_10_BUFFER = 1 << 20
BUCKET_LINE_MAX = 4096            # a bucket line with a full stack fits in this

GPERF_CALLS = ("HeapProfilerStart", "IsHeapProfilerRunning", "GetHeapProfile",
               "HeapProfilerStop")
GROWTH_NOTE = ("the gperftools profile sees only allocations made after the start: "
               "it is the growth since attach, not the whole heap")

# what `allocdiag heap start` asks the user to confirm
START = "start gperftools' heap profiler (every later allocation is recorded)"


def _gperf_full(t):
    return all(t.res.address(t.det.serving, n) for n in GPERF_CALLS)


def _gperf_running(t):
    rp = t.session()
    with rp.borrow() as c:
        running = bool(c.call(t.fn("IsHeapProfilerRunning")) & common.INT_RETURN)
    return running, list(rp.pause_us)


def status(t: Any, doc: dict[str, Any]) -> None:
    doc["env"] = profiler_env(t.procfs, t.pid)
    if not _gperf_full(t):
        doc["reason"] = ("gperftools' libtcmalloc_minimal has no heap profiler (no "
                         "HeapProfilerStart/GetHeapProfile) and its sampling is compiled out "
                         "(-DNO_TCMALLOC_SAMPLES)")
        doc["remedy"] = restart_recipe(t)
    else:
        doc["running"], doc["pause_us"] = _gperf_running(t)
        doc["possible"] = True
        doc["how"] = "HeapProfilerStart / GetHeapProfile / HeapProfilerStop (libtcmalloc.so.4)"
        doc["reason"] = ("full gperftools: the heap profiler can be started in the running "
                         "process; it records every allocation after the start (not sampled)")
        doc["notes"].append(GROWTH_NOTE)
        if doc["running"] and "HEAPPROFILE" in doc["env"]:
            doc["notes"].append("the program runs its own profile (HEAPPROFILE): it has "
                                "seen everything since the program started")


def start(t: Any, doc: dict[str, Any]) -> dict[str, Any]:
    if doc["running"]:
        return {"call": "IsHeapProfilerRunning() (already running: nothing started)",
                "was_running": True, "running": True, "notes": [GROWTH_NOTE],
                "work_dir": doc["work_dir"], "pause_us": doc["pause_us"]}
    wd = work_dir(t)
    prefix = os.path.join(wd.inside, GPERF_PREFIX).encode()
    fn_start, fn_running = t.fn("HeapProfilerStart"), t.fn("IsHeapProfilerRunning")
    rp = t.session()
    try:
        with rp.borrow() as c:
            at = c.scratch(len(prefix) + 1)
            c.write(at, prefix + b"\0")
            c.call(fn_start, at)
            running = bool(c.call(fn_running) & common.INT_RETURN)
    except BaseException:
        wd.remove()
        raise
    if not running:
        wd.remove()
        raise RemoteCallError("HeapProfilerStart returned but IsHeapProfilerRunning says 0",
                              pid=t.pid)
    return {"call": f"HeapProfilerStart(\"{prefix.decode()}\")", "was_running": False,
            "running": True, "notes": [GROWTH_NOTE], "work_dir": wd.inside,
            "pause_us": list(rp.pause_us)}


def stop(t: Any, doc: dict[str, Any], wd: Any, ours: bool, force: bool) -> dict[str, Any]:
    if not doc["running"]:
        wd.remove()
        return {"call": None, "was_running": False, "running": False,
                "removed": wd.inside if ours else None,
                "notes": ["the profiler was not running"], "pause_us": doc["pause_us"]}
    if not ours and not force:
        raise Unsupported("the heap profiler was not started by allocdiag (the program's own "
                          "HEAPPROFILE or HeapProfilerStart): left running", pid=t.pid,
                          remediation="use --force to stop it anyway (its data is dropped)")
    fn_stop, fn_running = t.fn("HeapProfilerStop"), t.fn("IsHeapProfilerRunning")
    rp = t.session()
    with rp.borrow() as c:
        c.call(fn_stop)
        running = bool(c.call(fn_running) & common.INT_RETURN)
    wd.remove()
    return {"call": "HeapProfilerStop()", "was_running": True, "running": running,
            "removed": wd.inside if ours else None,
            "notes": ["HeapProfilerStop drops the recorded data"],
            "pause_us": list(rp.pause_us)}


def dump(t: Any, doc: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    if not doc["running"]:
        raise Unsupported("the gperftools heap profiler is not running: nothing to dump",
                          pid=t.pid, remediation=f"allocdiag heap start {t.pid}  (then let the "
                          f"program run; the profile sees only what is allocated after it)")
    get, free = t.fn("GetHeapProfile"), t.fn("free")
    rp = t.session()
    with rp.borrow() as c:
        p = c.call(get)
        if not p:
            raise RemoteCallError("GetHeapProfile returned NULL", pid=t.pid)
        try:
            data = c.cstring(p, PROFILE_MAX)
        finally:
            c.call(free, p)
    if len(data) >= PROFILE_MAX:
        raise MalformedData(f"profile text longer than {PROFILE_MAX} bytes: not copied",
                            pid=t.pid)
    if not data:
        raise MalformedData("GetHeapProfile returned an empty profile (profiler stopped?)",
                            pid=t.pid)
    notes = [GROWTH_NOTE]
    if len(data) > GPERF_2_10_BUFFER - BUCKET_LINE_MAX:
        notes.append("the profile filled GetHeapProfile's 1 MiB buffer (gperftools 2.10): "
                     "the smallest sites may be left out; the biggest are all there")
    data = drop_remote_frames(data)
    return data, {"call": "GetHeapProfile() + free()", "notes": notes,
                  "pause_us": list(rp.pause_us)}


def restart(t: Any, arm: str, exe: str) -> str | None:
    return None


_BUCKET = re.compile(rb"^ *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] *@(.*)$")
_HEADER = re.compile(rb"^(heap profile:) *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] *@ *"
                     rb"(heapprofile.*)$")


def drop_remote_frames(text: Any) -> Any:
    """The legacy gperftools profile TEXT without the buckets allocated by
    allocdiag's own calls, and the header totals without them.  Their stacks
    hold the return address 0 the remote engine pushes (the trap that ends a
    call): GetHeapProfile's own 1 MiB buffer (gperftools 2.10 mallocs it
    before taking the profile, so the profiler records it) would otherwise
    show as a site in every dump.  The line layout is heap-profile-table.cc
    UnparseBucket's ("%6d: %8d [%6d: %8d] @")."""
    lines = text.split(b"\n")
    if not lines or not _HEADER.match(lines[0]):
        return text
    removed = [0, 0, 0, 0]
    keep = [lines[0]]
    for i, line in enumerate(lines[1:], 1):
        if line.startswith(b"MAPPED_LIBRARIES:"):
            keep.extend(lines[i:])
            break
        m = _BUCKET.match(line)
        if m and 0 in (int(a, 16) for a in m.group(5).split()):
            removed = [r + int(v) for r, v in zip(removed, m.groups()[:4])]
            continue
        keep.append(line)
    if not any(removed):
        return text
    h = _HEADER.match(lines[0])
    assert h is not None        # matched above
    totals = [int(v) - r for v, r in zip(h.groups()[1:5], removed)]
    keep[0] = b"heap profile: %6d: %8d [%6d: %8d] @ " % tuple(totals) + h.group(6)
    return b"\n".join(keep)
