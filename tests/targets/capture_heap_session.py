"""Capture the fixtures of the TUI's Heap tab (tests/fakes.py FakeProcess.heap_*):
one real heap-profiling session through collectors.heapcontrol, the calls the
tab makes, in order.

A python3 under Debian's libtcmalloc.so.4 (full gperftools) waits on stdin.
status -> start -> [keep 300 bytes objects of 50,000 and 200 bytearrays of
100,000 bytes] -> dump A (+ the inspect snapshot right after) -> [drop the
bytes objects, add 400 bytearrays] -> dump B (+ snapshot) -> stop.  The
status of a libtcmalloc_minimal and of a glibc python3 (heap profiling not
possible: the reason and the recipe) is captured too, and a python3 that
runs its own profile (HEAPPROFILE): its status, the refused plain stop and
the forced one.

Writes tests/fixtures/heap-tui-tcmalloc-a.heap, heap-tui-tcmalloc-b.heap and
heap-tui-session.json, with every frame of the dumps as this machine resolved
it (the fakes show those, so the tests do not depend on the machine's builds)
and the build-ids of the objects they are in.  Run as root from the
repository root:
    .venv/bin/python tests/targets/capture_heap_session.py
"""

import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, os.path.dirname(TESTS)]

from collectors import heapcontrol, heapprofile
from diag.model.errors import Unsupported  # noqa: E402
from collectors.binary.symbolize import Symbolizer, _build_id_of  # noqa: E402  (what it keys on)
from diag import heapview, snapshot
from targets import python_argv, start  # noqa: E402

FIXTURES = os.path.join(TESTS, "fixtures")


def captured_frames(names):
    """Every frame of the dumps NAMES as this machine's symbolizer resolved it
    ({hex address: [object, function, vaddr, text]}): the fakes show these, so
    the Heap tab's tests and baseline do not depend on this machine's builds."""
    frames = {}
    for name in names:
        with open(os.path.join(FIXTURES, name), "rb") as f:
            prof = heapprofile.parse(f.read())
        sym = Symbolizer(prof.mappings)
        for sample in prof.samples:
            for fr in sym.stack(sample.stack):
                frames[f"{fr.addr:#x}"] = [fr.object, fr.function, fr.vaddr, fr.text]
    return frames
PROGRAM = r"""
import sys
kept_bytes, kept_arrays = [], []
print("READY", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "bytes":
        kept_bytes.extend(bytes(int(cmd[2])) for _ in range(int(cmd[1])))
    elif cmd[0] == "arrays":
        kept_arrays.extend(bytearray(int(cmd[2])) for _ in range(int(cmd[1])))
    elif cmd[0] == "drop":
        kept_bytes.clear()
    print("OK", flush=True)
"""


def command(t, line):
    t.proc.stdin.write((line + "\n").encode())
    t.proc.stdin.flush()
    answer = t.proc.stdout.readline().decode().strip()
    assert answer == "OK", answer


def dump(pid, name):
    data, info = heapcontrol.dump(pid)
    snap, _ = snapshot.take(pid)
    with open(os.path.join(FIXTURES, name), "wb") as f:
        f.write(data)
    return {"file": name, "info": info, "snapshot": snap.to_json()}


def main():
    session = {}
    with start(python_argv(PROGRAM), allocator="tcmalloc") as t:
        s = session["tcmalloc"] = {"status_before": heapcontrol.status(t.pid)}
        s["start"] = heapcontrol.start(t.pid)
        s["status_running"] = heapcontrol.status(t.pid)
        command(t, "bytes 300 50000")
        command(t, "arrays 200 100000")
        s["dump_a"] = dump(t.pid, "heap-tui-tcmalloc-a.heap")
        command(t, "drop")
        command(t, "arrays 400 100000")
        s["dump_b"] = dump(t.pid, "heap-tui-tcmalloc-b.heap")
        s["stop"] = heapcontrol.stop(t.pid)
    objects = {f.object for name in ("heap-tui-tcmalloc-a.heap", "heap-tui-tcmalloc-b.heap")
               for frames, _ in heapview.load(os.path.join(FIXTURES, name)).stacks
               for f in frames if f.object}
    session["build_ids"] = {path: _build_id_of(path) for path in sorted(objects)}
    session["frames"] = captured_frames(("heap-tui-tcmalloc-a.heap", "heap-tui-tcmalloc-b.heap"))
    for allocator in ("tcmalloc_minimal", "glibc"):
        with start(python_argv(PROGRAM), allocator=allocator) as t:
            session[allocator] = {"status_before": heapcontrol.status(t.pid)}
    own = tempfile.mkdtemp(prefix="allocdiag-capture-")
    try:
        with start(python_argv(PROGRAM), allocator="tcmalloc",
                   env={"HEAPPROFILE": os.path.join(own, "own")}) as t:
            s = session["tcmalloc_own"] = {"status_before": heapcontrol.status(t.pid)}
            try:
                heapcontrol.stop(t.pid)
                raise AssertionError("heapcontrol.stop stopped the program's own profile")
            except Unsupported as exc:
                s["stop_refused"] = {"msg": exc.msg, "remediation": exc.remediation}
            s["stop"] = heapcontrol.stop(t.pid, force=True)
            s["status_stopped"] = heapcontrol.status(t.pid)
    finally:
        shutil.rmtree(own)
    with open(os.path.join(FIXTURES, "heap-tui-session.json"), "w") as f:
        json.dump(session, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
