"""diag.snapshot.Session (issue 23 item 4): snapshots of one process one
after the other re-read only what can have changed.  The image, detection,
preload verdict, configuration and the live reader (resolved addresses, the
remote handle) are kept while the process and its maps are the same; a new
mapping, or a new process under the pid, builds them again.  ``record`` and
the exporter's live targets take their snapshots through sessions."""

import os
import subprocess
import sys
import time
import traceback

import pytest

from collectors import giveway, livestats
from diag import exporter, recording, snapshot
from diag.recording import read_recording
from servers import redis
from targets import PRELOADS, build_c, build_go, require_file, start
from collectors.proc.procfs import ProcFS

SNAPSHOTS = 3
# dlopen()ing jemalloc after start needs room in the static TLS surplus
# (test_detect.py's dlopen test says why).
STATIC_TLS = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=65536"}


class Spy:
    """Counts the calls of a real function (it still runs)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def spies(monkeypatch):
    """Spies on what a snapshot builds from the maps: the ProcessImage, the
    detection and the remote handle."""
    out = {}
    for owner, name in ((snapshot, "ProcessImage"), (snapshot, "detect"),
                        (livestats, "open_remote")):
        out[name] = Spy(getattr(owner, name))
        monkeypatch.setattr(owner, name, out[name])
    return out


def test_a_second_snapshot_rebuilds_nothing_the_maps_gave(spies, monkeypatch):
    from diag import findings, knobs
    # the knobs' table: made once a snapshot, for its JSON and its findings
    table = Spy(knobs.knobs)
    monkeypatch.setattr(knobs, "knobs", table)
    monkeypatch.setattr(findings, "knob_table", table)
    # GIVEN a jemalloc process whose mappings do not change
    with start([build_c("dlopen_later.c", "-ldl")], allocator="jemalloc") as t:
        session = snapshot.Session(t.pid)
        # WHEN it is sampled several times
        snaps = [session.take()[0] for _ in range(SNAPSHOTS)]
        reader = session._built.reader
    # THEN the maps were parsed into an image, detected and given a remote
    # handle once; every snapshot still read the allocator
    assert spies["ProcessImage"].calls == 1 and spies["detect"].calls == 1
    assert spies["open_remote"].calls == 1 and reader.plans == 1 and session.builds == 1
    assert table.calls == SNAPSHOTS
    for s in snaps:
        assert s.allocator.kind == "jemalloc" and s.collectors["remote"].ok, s.collectors
        assert s.stats["allocated"].value and s.collectors["remote"].pause_us is not None
    # and the kept steps are said as answered, at no cost this time
    assert snaps[-1].collectors["detect"].ok and snaps[-1].collectors["detect"].duration_s == 0


def test_record_samples_through_one_session(spies, tmp_path):
    # GIVEN a real process
    with start([build_c("dlopen_later.c", "-ldl")], allocator="jemalloc") as t:
        path = tmp_path / "r.jsonl"
        # WHEN record takes several snapshots of it (its own sampler)
        n = recording.record(t.pid, path, interval=0.0,
                             stop=lambda: len(path.read_text().splitlines()) >= SNAPSHOTS)
    # THEN the maps gave one image and one remote handle for all of them
    assert n == SNAPSHOTS and spies["ProcessImage"].calls == 1
    assert spies["open_remote"].calls == 1
    assert all(s.stats["allocated"].value for s in read_recording(path))


def test_a_mapping_added_is_seen_by_the_next_snapshot(spies):
    require_file(PRELOADS["jemalloc"])
    # GIVEN a glibc process sampled once
    with start([build_c("dlopen_later.c", "-ldl")], env=STATIC_TLS) as t:
        session = snapshot.Session(t.pid)
        first, _ = session.take()
        assert first.allocator.kind == "glibc"
        assert not [o for o in first.allocator.others if o.kind == "jemalloc"]
        # WHEN it maps jemalloc (dlopen) between two snapshots
        t.proc.stdin.write(f"open {PRELOADS['jemalloc']}\n".encode())
        t.proc.stdin.flush()
        assert t.proc.stdout.readline().decode().strip() == "OPENED"
        second, _ = session.take()
        reader = session._built.reader
    # THEN the next snapshot sees it: image and detection built again
    others = [o for o in second.allocator.others if o.kind == "jemalloc"]
    assert others and others[0].linkage == "dlopen", second.allocator.others
    assert session.builds == 2 and spies["ProcessImage"].calls == 2
    # and the live reader resolved its addresses again but kept its remote
    # handle (glibc's code did not move)
    assert reader.plans == 2 and spies["open_remote"].calls == 1
    assert second.collectors["remote"].ok and second.stats["allocated"].value


def _no_aslr(arena_max):
    """idle.c started with address randomisation off (two such processes of
    one binary have byte-identical maps) and MALLOC_ARENA_MAX=ARENA_MAX."""
    exe = build_c("idle.c")
    if subprocess.run(["setarch", "-R", "true"], check=False).returncode:
        pytest.skip("setarch -R (personality ADDR_NO_RANDOMIZE) not allowed here")
    return start(["setarch", "-R", exe], env={"MALLOC_ARENA_MAX": arena_max})


def test_a_reused_pid_starts_afresh(tmp_path):
    # GIVEN a pid, seen through a procfs root whose entry for it points at
    # process A, then at process B: the same program with the same maps
    # (no address randomisation) but another start time and environment
    root = tmp_path / "proc"
    root.mkdir()
    pid = 4242
    link = root / str(pid)
    with _no_aslr("2") as a:
        os.symlink(f"/proc/{a.pid}", link)
        session = snapshot.Session(pid, procfs=ProcFS(str(root)), attach=False)
        before, _ = session.take()
        maps_a = (link / "maps").read_bytes()
        time.sleep(0.05)            # start times count clock ticks
        with _no_aslr("4") as b:
            # WHEN the pid now names B
            link.unlink()
            os.symlink(f"/proc/{b.pid}", link)
            assert (link / "maps").read_bytes() == maps_a, "not the same maps: nothing shown"
            after, _ = session.take()
    # THEN the session described B, not what it had built for A
    assert before.native["config"]["env"] == {"MALLOC_ARENA_MAX": "2"}
    assert after.native["config"]["env"] == {"MALLOC_ARENA_MAX": "4"}
    assert session.builds == 2


def _maps(pid):
    with open(f"/proc/{pid}/maps", "rb") as f:
        return f.read()


def test_exporter_rereads_a_target_through_its_session(spies):
    # GIVEN the exporter with a real server as its live target, read at
    # every scrape
    with redis() as srv:
        col = exporter.AllocdiagCollector(exporter.Options(
            targets=(srv.pid,), refresh_s=0.05, min_gap_s=0.0, max_pause_ms_per_minute=1e6),
            sync=True)
        # WHEN it is scraped several times (the maps read just before each)
        maps = []
        for _ in range(SNAPSHOTS):
            maps.append(_maps(srv.pid))
            col.collect()
            time.sleep(0.06)
        session = col.sessions.get(srv.pid)
    # THEN each scrape read the target, and each set of maps gave one image,
    # one detection (the host scan builds its own images): redis mapped more
    # memory between two scrapes in 1 of 4 runs of this test on a slow machine,
    # which is a new build, as it should be
    changed = sum(a != b for a, b in zip(maps, maps[1:]))
    assert changed < SNAPSHOTS - 1, "the maps changed at every scrape: nothing was kept"
    assert col.live.reads == SNAPSHOTS, col.live.reads
    assert session.builds == 1 + changed, (session.builds, changed)
    assert spies["open_remote"].calls <= 1 + changed
    assert col.live.entry(srv.pid).state == "ok"


def test_no_stats_interface_is_said_at_every_snapshot_and_nothing_grows():
    # GIVEN a Go program (no allocator stats interface) in a session
    with start([build_go("goidle")]) as t:
        session = snapshot.Session(t.pid)
        # WHEN it is sampled several times
        runs = [session.take() for _ in range(SNAPSHOTS)]
    # THEN every snapshot says why the allocator was not read, as inspect does
    for snap, col in runs:
        assert snap.allocator.kind == "go" and not snap.collectors["remote"].ok
        assert col.unsupported is not None
    # and the answer kept for the mappings does not grow with each snapshot
    # (a re-raised exception would pile up traceback entries)
    depth = [len(traceback.extract_tb(col.unsupported.__traceback__)) for _, col in runs]
    assert depth[-1] == depth[1], depth


def test_sessions_are_bounded():
    # GIVEN a store of at most 2 sessions
    store = snapshot.Sessions(2, attach=False)
    with start([build_c("idle.c")]) as a, start([build_c("idle.c")]) as b, \
            start([build_c("idle.c")]) as c:
        # WHEN three processes are read, one after the other
        for t in (a, b, c):
            store.take(t.pid)
        # THEN the least recently read one was dropped
        assert len(store) == 2 and store.get(a.pid) is None
        assert store.get(c.pid) is not None


def _vm_rss_kib():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))


def record_rss(count, path):
    """(VmRSS after snapshot 50, after COUNT) in KiB, of this process while
    it records COUNT snapshots of redis-server back to back into PATH."""
    marks = {}

    def progress(n, _snap):
        if n in (50, count):
            marks[n] = _vm_rss_kib()
    with redis() as srv:
        recording.record(srv.pid, path, interval=0.0, progress_cb=progress,
                         stop=lambda: count in marks)
    return marks[50], marks[count]


# Growth allowed between snapshot 50 and the last: the interpreter's own
# arenas settle within a few MiB; anything kept per snapshot (a few KiB
# each) would pass it within a few thousand snapshots.
RSS_GROWTH_KIB = 8 << 10


def test_record_rss_bounded(tmp_path):
    first, last = record_rss(500, tmp_path / "r.jsonl.gz")
    assert last - first < RSS_GROWTH_KIB, (first, last)


@pytest.mark.soak
def test_record_rss_soak(tmp_path):
    first, last = record_rss(20000, tmp_path / "r.jsonl.gz")
    assert last - first < RSS_GROWTH_KIB, (first, last)


def test_a_snapshot_gives_its_cpu_away_between_steps_never_inside_a_stop(monkeypatch):
    # On a saturated host a snapshot's ~3 ms run delays the requests of the CPU
    # it lands on (bench/record_cost.py section 3): it yields between its
    # steps and between choosing a thread and stopping it, and at none of
    # these is a thread of the target stopped.
    tracers, where = [], []

    def give_way():
        where.append(sys._getframe(1).f_code.co_name)
        for tid in os.listdir(f"/proc/{t.pid}/task"):
            with open(f"/proc/{t.pid}/task/{tid}/status") as f:
                tracers.append(next(line.split()[1] for line in f
                                    if line.startswith("TracerPid:")))

    monkeypatch.setattr(giveway, "give_way", give_way)
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        session = snapshot.Session(t.pid)
        for _ in range(2):
            snap, _col = session.take()
            assert snap.collectors["remote"].ok and snap.collectors["remote"].pause_us
    # the snapshot: at its start, after the build check, after the live stats,
    # after the kernel's view, after the fit; the engine: before preparing the
    # chosen thread and before stopping it
    assert where.count("take") == 2 * 5
    assert where.count("_acquire") >= 2 * 2
    assert set(tracers) == {"0"}
