"""Shared test doubles for the views (TUI, recording, snapshot baselines).

Every allocator number here comes out of the real parser run on a real
capture in tests/fixtures (through ``diag.filemode``, the ``--from FILE``
path, which yields the same native shape as a live read), and every finding
out of ``diag.findings.evaluate`` on that snapshot: a view test can only see
shapes and finding ids the product really produces.  Only the kernel layer
(process, cgroup) and the identity of the process are set by the test,
because a captured stats file does not carry them.
"""

import json
import os
from types import SimpleNamespace

from diag.model.records import replace
from diag import filemode, findings
from diag.model import (Allocator, AllocatorRef, CgroupMemory, CollectorStatus, Preload,
                        ProcessMemory, Value)

GiB = 1 << 30
MiB = 1 << 20
T0 = 1_767_225_600.0    # 2026-01-01T00:00:00Z: fixed clock for every snapshot

# The captures come from small test programs (MiB, not GiB): the real rules
# run with a floor scaled to them, so their findings fire on these snapshots.
FLOOR = 1 << 20

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# One real capture per allocator (tests/fixtures/README.md says how each was made).
CAPTURES = {
    "glibc": "malloc_info-glibc-2.36.xml",
    "jemalloc": "jemalloc-5.3.0-stats.json",
    "tcmalloc": "tcmalloc-2.10-getstats.txt",
    "mimalloc": "mimalloc-2.0.9-stats.txt",
}


def captured(kind):
    """The Snapshot ``allocdiag inspect --from`` makes of KIND's capture."""
    return filemode.snapshot_from_file(os.path.join(FIXTURES, CAPTURES[kind]))


def real_snapshot(kind, *, allocator=None, findings_from_rules=True, **kernel_and_identity):
    """KIND's captured allocator layer and native document, with the kernel
    layer and identity (pid, comm, exe, taken_at, process, cgroup, preload,
    collectors) given by the test; findings from diag.findings on the result."""
    snap = captured(kind)
    if allocator is not None:
        allocator = replace(allocator, kind=snap.allocator.kind)
        kernel_and_identity["allocator"] = allocator
    snap = replace(snap, **kernel_and_identity)
    if findings_from_rules:
        snap = replace(snap, findings=findings.evaluate(snap, floor=FLOOR))
    return snap


# -- constructed snapshots ----------------------------------------------------------

def _m(v, source):
    return Value.measured(v, source)


def _stats(**values):
    out = {}
    for name in ("allocated", "active", "resident", "mapped", "retained", "metadata",
                 "dirty", "muzzy"):
        v = values.get(name)
        out[name] = v if isinstance(v, Value) else (_m(v, f"test {name}") if v is not None
                                                     else Value())
    return out


def jemalloc_snapshot(i=0, taken_at=None, lazyfree=4 * MiB, pid=4242):
    """The captured jemalloc 5.3 stats (dirty pages held: dirty_decay_ms 10000) in a
    process whose RSS climbs by 4 MiB per step I, with LAZYFREE in RSS."""
    step = i * 4 * MiB
    return real_snapshot(
        "jemalloc",
        pid=pid, comm="cache-server", exe="/usr/local/bin/cache-server",
        taken_at=taken_at if taken_at is not None else T0 + 2 * i,
        allocator=Allocator(kind="jemalloc", version="5.3.0-0-g54eaed1d", linkage="preload",
                            path="/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", prefix="",
                            evidence=("malloc GOT slot of /usr/local/bin/cache-server -> "
                                      "libjemalloc.so.2",),
                            others=(AllocatorRef(kind="glibc", version="2.36", linkage="dynamic",
                                                 path="/usr/lib/x86_64-linux-gnu/libc.so.6"),)),
        preload=Preload(requested=("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",),
                        effective=True,
                        verdict="in effect: malloc binds to /usr/lib/x86_64-linux-gnu/"
                                "libjemalloc.so.2",
                        reasons=("LD_PRELOAD names libjemalloc.so.2",)),
        process=ProcessMemory(rss=40 * MiB + step, rss_anon=34 * MiB + step,
                              rss_file=5 * MiB, rss_shmem=1 * MiB, lazyfree=lazyfree,
                              anon_thp=0, swap=0, pss=40 * MiB, vm_size=900 * MiB, threads=24,
                              source="smaps_rollup"),
        cgroup=CgroupMemory(version=2, path="/system.slice/cache.service",
                            usage=48 * MiB, limit=64 * MiB,
                            inactive_file=10 * MiB, working_set=38 * MiB),
        collectors={"procfs": CollectorStatus(True, None, 0.0012),
                    "cgroup": CollectorStatus(True, None, 0.0003),
                    "jemalloc": CollectorStatus(True, None, 0.0021, pause_us=1400)},
    )


def glibc_snapshot(taken_at=T0):
    return real_snapshot(
        "glibc", pid=3131, comm="python3", exe="/usr/bin/python3.11", taken_at=taken_at,
        allocator=Allocator(kind="glibc", version="2.36", linkage="dynamic",
                            path="/usr/lib/x86_64-linux-gnu/libc.so.6",
                            evidence=("malloc binds to libc.so.6",)),
        preload=Preload(),
        process=ProcessMemory(rss=16 * MiB, rss_anon=7 * MiB, rss_file=9 * MiB,
                              rss_shmem=0, lazyfree=0, anon_thp=0, swap=0, threads=9,
                              source="smaps_rollup"),
        cgroup=CgroupMemory(version=2, path="/user.slice", usage=20 * MiB, limit=None,
                            inactive_file=3 * MiB, working_set=17 * MiB),
        collectors={"procfs": CollectorStatus(True, None, 0.001),
                    "glibc": CollectorStatus(True, None, 0.003, pause_us=1800)},
    )


def tcmalloc_snapshot(taken_at=T0):
    return real_snapshot(
        "tcmalloc", pid=5151, comm="ingest", exe="/opt/ingest/bin/ingest", taken_at=taken_at,
        allocator=Allocator(kind="tcmalloc", version="2.10", linkage="dynamic",
                            path="/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"),
        preload=Preload(),
        process=ProcessMemory(rss=22 * MiB, rss_anon=15 * MiB, rss_file=7 * MiB,
                              rss_shmem=0, lazyfree=0, threads=16),
        cgroup=CgroupMemory(version=2, path="/kubepods/pod1/ingest", usage=24 * MiB,
                            limit=64 * MiB, inactive_file=2 * MiB, working_set=22 * MiB),
        collectors={"procfs": CollectorStatus(True, None, 0.001),
                    "tcmalloc": CollectorStatus(True, None, 0.002, pause_us=900)},
    )


def mimalloc_snapshot(taken_at=T0):
    return real_snapshot(
        "mimalloc", pid=6161, comm="renderer", exe="/usr/bin/renderer", taken_at=taken_at,
        allocator=Allocator(kind="mimalloc", version="2.0.9", linkage="preload",
                            path="/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"),
        preload=Preload(requested=("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",),
                        effective=True, verdict="in effect"),
        process=ProcessMemory(rss=44 * MiB, rss_anon=38 * MiB, rss_file=6 * MiB,
                              rss_shmem=0, lazyfree=0, threads=6),
        cgroup=CgroupMemory(),
        collectors={"procfs": CollectorStatus(True, None, 0.001),
                    "mimalloc": CollectorStatus(True, None, 0.002, pause_us=700)},
    )


SNAPSHOTS = {"jemalloc": jemalloc_snapshot, "glibc": glibc_snapshot,
             "tcmalloc": tcmalloc_snapshot, "mimalloc": mimalloc_snapshot}


def staircase(n=12, pid=4242):
    """jemalloc samples whose RSS climbs in steps (the classic staircase)."""
    return [jemalloc_snapshot(i // 3, taken_at=T0 + 2 * i, pid=pid) for i in range(n)]


HOST_ROWS = [
    {"pid": 4242, "comm": "cache-server",
     "allocator": {"kind": "jemalloc", "linkage": "preload", "version": "5.3.0", "prefix": "",
                   "others": ["glibc"]},
     "preload": {"effective": True, "verdict": "in effect"},
     "rss": 4 * GiB, "rss_anon": 3824 * MiB, "lazyfree": 800 * MiB, "threads": 24,
     "stats": {"resident": {"value": 2150 * MiB}},
     "findings": [{"title": "800 MiB of LazyFree never purged"}]},
    {"pid": 3131, "comm": "python3",
     "allocator": {"kind": "glibc", "linkage": "dynamic", "version": "2.36", "prefix": "",
                   "others": []},
     "preload": {"effective": None, "verdict": "none requested"},
     "rss": 1600 * MiB, "rss_anon": 1510 * MiB, "lazyfree": 0, "threads": 9},
    {"pid": 5151, "comm": "ingest",
     "allocator": {"kind": "tcmalloc", "linkage": "dynamic", "version": "2.10", "prefix": "",
                   "others": []},
     "preload": {"effective": None, "verdict": "none requested"},
     "rss": 1100 * MiB, "rss_anon": 1000 * MiB, "lazyfree": 0, "threads": 16},
    {"pid": 6161, "comm": "renderer",
     "allocator": {"kind": "mimalloc", "linkage": "preload", "version": "2.0.9", "prefix": "",
                   "others": ["glibc"]},
     "preload": {"effective": True, "verdict": "in effect"},
     "rss": 700 * MiB, "rss_anon": 640 * MiB, "lazyfree": 0, "threads": 6},
    {"pid": 777, "comm": "legacy-app",
     "allocator": {"kind": "glibc", "linkage": "dynamic", "version": "2.36", "prefix": "",
                   "others": []},
     "preload": {"effective": False, "verdict": "not in effect: requested preload not loaded"},
     "rss": 90 * MiB, "rss_anon": 70 * MiB, "lazyfree": None, "threads": 1},
    {"pid": 1, "comm": "systemd",
     "allocator": {"kind": "glibc", "linkage": "dynamic", "version": "2.36", "prefix": "",
                   "others": []},
     "preload": {"effective": None, "verdict": "none requested"},
     "rss": 12 * MiB, "rss_anon": 4 * MiB, "lazyfree": 0, "threads": 1},
]


def purged(snap):
    """SNAP after a purge: the allocator's dirty pages and the LazyFree pages
    leave resident memory and RSS (what ``arena.<i>.purge`` does)."""
    dirty = snap.stats["dirty"].value or 0
    lazy = snap.process.lazyfree or 0
    stats = dict(snap.stats,
                 resident=Value.measured(snap.stats["resident"].value - dirty, "after purge"),
                 dirty=Value.measured(0, "after purge"))
    process = replace(snap.process, lazyfree=0,
                                  rss=(snap.process.rss or 0) - dirty - lazy,
                                  rss_anon=(snap.process.rss_anon or 0) - dirty - lazy)
    return replace(snap, stats=stats, process=process)


# -- heap profiles: one real session (tests/targets/capture_heap_session.py) ----------

HEAP_SESSION = os.path.join(FIXTURES, "heap-tui-session.json")


def heap_session():
    """The captured heapcontrol results: {"tcmalloc": {status_before, start,
    status_running, dump_a, dump_b, stop}, "tcmalloc_minimal": {status_before},
    "glibc": {status_before}, "tcmalloc_own" (the program's own HEAPPROFILE):
    {status_before, stop_refused, stop (forced), status_stopped},
    "build_ids": {object: build-id at capture}, "frames": {hex address: [object,
    function, vaddr, text] as the capture machine resolved it}}."""
    with open(HEAP_SESSION) as f:
        return json.load(f)


def heap_dump_result(dump):
    """ProcessSource.heap_dump's shape from one captured dump: the profile
    loaded through diag.heapview.load (path dropped, as a live dump has none),
    the snapshot taken right after it, and heapcontrol's info."""
    from diag.recording import snapshot_from_json
    view = captured_view(dump["file"])
    return dict(dump["info"], view=view, snapshot=snapshot_from_json(dump["snapshot"]))


def captured_view(name):
    """The dump NAME as diag.heapview shows it, with the frames the capture
    machine resolved (heap-tui-session.json "frames"): the same on any
    machine, whatever build of python3.11 and libc it has."""
    from collectors import heapprofile
    from collectors.binary.symbolize import Frame, drop_allocator_frames
    from diag.heapview import ProfileView
    with open(os.path.join(FIXTURES, name), "rb") as f:
        prof = heapprofile.parse(f.read())
    frames = heap_session()["frames"]
    stacks = [(drop_allocator_frames([Frame(a, *frames[f"{a:#x}"]) for a in s.stack]), s)
              for s in prof.samples]
    return ProfileView(None, prof, stacks, [])


def heap_context_snapshot():
    """The captured tcmalloc python3 process as the Heap tab's screen shows it
    (its inspect snapshot right after the first dump)."""
    from diag.recording import snapshot_from_json
    return snapshot_from_json(heap_session()["tcmalloc"]["dump_a"]["snapshot"])


# -- fake sources: the interfaces of diag/source.py (HostSource, ProcessSource,
# ReplaySource) -------------------------------------------------------------------

class FakeHost:
    def __init__(self, rows=None, denied=3, fail=None):
        self.rows = list(HOST_ROWS if rows is None else rows)
        self.denied = denied
        self.fail = fail
        self.calls = 0

    def scan(self):
        self.calls += 1
        if self.fail:
            raise self.fail
        return SimpleNamespace(rows=list(self.rows), denied=self.denied, vanished=0)


class FakeProcess:
    live = True
    no_attach = False

    def __init__(self, snaps=None, backlog=(), fail=None, pid=4242, heap="tcmalloc"):
        self.snaps = list(snaps or [jemalloc_snapshot(pid=pid)])
        self._backlog = list(backlog)
        self.fail = fail
        self.pid = pid
        self.label = f"pid {pid}"
        self.samples = 0
        self.knobs = []
        self.releases = 0
        self.closed = False
        self.heap = heap_session()[heap]     # the captured session of this allocator
        self.heap_calls = []
        self.heap_state = "status_before"    # the captured status the process is in now
        self.heap_dumps = 0

    def sample(self):
        if self.fail is not None:
            raise self.fail
        snap = self.snaps[min(self.samples, len(self.snaps) - 1)]
        self.samples += 1
        return snap

    def backlog(self):
        return list(self._backlog)

    def release(self):
        """The shape diag.actions.release returns: Snapshots before/after, the
        call made, its return value and the pauses."""
        self.releases += 1
        before = self.snaps[max(0, min(self.samples, len(self.snaps)) - 1)]
        return {"call": "arena.4096.purge", "return": 0, "pause_us": [300, 140],
                "before": before, "after": purged(before)}

    def set_knob(self, name, value):
        """(old, new), as ProcessSource.set_knob returns."""
        self.knobs.append((name, value))
        return ("-1", value)

    # heap profiles: what collectors.heapcontrol answered in the captured session
    def heap_status(self):
        self.heap_calls.append("status")
        return self.heap[self.heap_state]

    def _heap_possible(self):
        """What heapcontrol raises for an allocator without a heap profiler
        (its _unsupported, from the captured status)."""
        from diag.model.errors import Unsupported
        doc = self.heap["status_before"]
        if not doc["possible"]:
            raise Unsupported(f"heap profiling is not possible: {doc['reason']}", pid=self.pid,
                              remediation=doc["remedy"])

    def heap_start(self):
        self.heap_calls.append("start")
        self._heap_possible()
        self.heap_state = "status_running"
        return self.heap["start"]

    def heap_dump(self):
        self.heap_calls.append("dump")
        self._heap_possible()
        self.heap_dumps += 1
        return heap_dump_result(self.heap["dump_a" if self.heap_dumps == 1 else "dump_b"])

    def heap_stop(self, force=False):
        """The program's own profile (tcmalloc_own) is refused without FORCE,
        with heapcontrol's captured message."""
        from diag.model.errors import Unsupported
        self.heap_calls.append("stop(force)" if force else "stop")
        self._heap_possible()
        refused = self.heap.get("stop_refused")
        if refused and not force:
            raise Unsupported(refused["msg"], pid=self.pid, remediation=refused["remediation"])
        self.heap_state = "status_stopped" if "status_stopped" in self.heap else "status_before"
        return self.heap["stop"]

    def close(self):
        self.closed = True


class FakeReplay(FakeProcess):
    live = False
    no_attach = True

    def __init__(self, snaps):
        super().__init__(snaps, backlog=snaps, pid=snaps[0].pid)
        self.label = "replay test"

    def _no_heap(self, *args, **kwargs):
        from diag.source import NEEDS_LIVE_PROCESS, ActionUnavailable
        raise ActionUnavailable(NEEDS_LIVE_PROCESS)

    heap_status = heap_start = heap_dump = heap_stop = _no_heap
