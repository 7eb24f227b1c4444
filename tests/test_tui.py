"""Pilot tests of the allocdiag TUI, driven with injected fake sources.

The sources are built from constructed Snapshots with realistic numbers
(one per allocator); every screen and action is exercised through key
presses and clicks, the way a user would.
"""

import asyncio
import os
import types
from types import SimpleNamespace

import pytest

from collectors.errors import AccessDenied, NoSuchProcess
from diag.model import (Allocator, AllocatorRef, CgroupMemory, CollectorStatus, Finding, Knob,
                        Preload, ProcessMemory, Snapshot, Value)
from diag.recording import read_recording
from diag.render import human_bytes
from fakes import real_snapshot
from textual.widgets import DataTable, Input, Static

GiB = 1 << 30
MiB = 1 << 20
T0 = 1_767_225_600.0    # 2026-01-01T00:00:00Z: fixed clock for every snapshot


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


# -- fake sources ------------------------------------------------------------------

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

    def __init__(self, snaps=None, backlog=(), fail=None, pid=4242):
        self.snaps = list(snaps or [jemalloc_snapshot(pid=pid)])
        self._backlog = list(backlog)
        self.fail = fail
        self.pid = pid
        self.label = f"pid {pid}"
        self.samples = 0
        self.knobs = []
        self.releases = 0
        self.closed = False

    def sample(self):
        if self.fail is not None:
            raise self.fail
        snap = self.snaps[min(self.samples, len(self.snaps) - 1)]
        self.samples += 1
        return snap

    def backlog(self):
        return list(self._backlog)

    def release(self):
        self.releases += 1
        return {"before": {"resident": 2150 * MiB, "rss": 4 * GiB, "lazyfree": 800 * MiB},
                "after": {"resident": 1300 * MiB, "rss": 3200 * MiB, "lazyfree": 0},
                "call": "arena.4096.purge"}

    def set_knob(self, name, value):
        self.knobs.append((name, value))
        return ("-1", value)

    def close(self):
        self.closed = True


class FakeReplay(FakeProcess):
    live = False
    no_attach = True

    def __init__(self, snaps):
        super().__init__(snaps, backlog=snaps, pid=snaps[0].pid)
        self.label = "replay test"


def run(coro):
    return asyncio.run(coro)


def make_app(**kw):
    from tui.app import AllocdiagApp
    return AllocdiagApp(**kw)


async def settle(pilot, app):
    """Let workers finish and their messages be handled."""
    for _ in range(3):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


def table_column(app, selector, column=0):
    table = app.screen.query_one(selector, DataTable)
    return [str(table.get_row_at(i)[column]) for i in range(table.row_count)]


def status_text(app, selector):
    return str(app.screen.query_one(selector, Static).render())


# -- host view ---------------------------------------------------------------------

def test_host_table_sorted_by_rss_then_sort_keys():
    async def go():
        app = make_app(host_source=FakeHost(), process_source_factory=lambda pid: None,
                       host_interval=1000)
        async with app.run_test(size=(120, 30)) as pilot:
            await settle(pilot, app)
            # GIVEN the host scan  THEN rows are sorted by RSS, largest first
            assert table_column(app, "#procs") == ["4242", "3131", "5151", "6161", "777", "1"]
            assert "6 of 6 processes" in status_text(app, "#host-status")
            assert "3 unreadable" in status_text(app, "#host-status")
            # unknown LazyFree is shown as unknown, not 0
            row777 = app.screen.query_one("#procs", DataTable).get_row("777")
            assert str(row777[6]) == "-"
            # WHEN s is pressed  THEN the next column sorts (numbers: largest first)
            await pilot.press("s")
            assert app.screen.sort_column == "anon" and app.screen.sort_reverse
            await pilot.press("s", "s", "s", "s", "s")     # held, finding, pid, command
            assert app.screen.sort_column == "comm" and not app.screen.sort_reverse
            assert table_column(app, "#procs", 1) == sorted(r["comm"] for r in HOST_ROWS)
            # S reverses
            await pilot.press("S")
            assert table_column(app, "#procs", 1) == sorted((r["comm"] for r in HOST_ROWS),
                                                            reverse=True)
            # clicking the PID header sorts by pid
            table = app.screen.query_one("#procs", DataTable)
            table.post_message(DataTable.HeaderSelected(table, table.ordered_columns[0].key,
                                                        0, table.ordered_columns[0].label))
            await pilot.pause()
            assert table_column(app, "#procs") == ["1", "777", "3131", "4242", "5151", "6161"]
    run(go())


def test_host_filter_and_enter_opens_process_view():
    opened = []

    def factory(pid):
        opened.append(pid)
        return FakeProcess(pid=pid, snaps=[glibc_snapshot()])

    async def go():
        app = make_app(host_source=FakeHost(), process_source_factory=factory,
                       host_interval=1000, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            # WHEN / filters by "python"
            await pilot.press("slash")
            assert app.screen.query_one("#filter", Input).display
            await pilot.press(*"python")
            assert table_column(app, "#procs") == ["3131"]
            assert "filter: 'python'" in status_text(app, "#host-status")
            await pilot.press("enter")          # leaves the filter box, keeps the filter
            assert isinstance(app.focused, DataTable)
            # AND Enter opens the process view of the selected row
            await pilot.press("enter")
            await settle(pilot, app)
            assert opened == [3131]
            assert app.screen.id == "process-3131"
            assert "glibc" in app.sub_title
            # escape goes back to the host view, with the filter still applied
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen.id == "host"
            assert table_column(app, "#procs") == ["3131"]
            # escape on the host view clears the filter
            await pilot.press("escape")
            assert len(table_column(app, "#procs")) == 6
    run(go())


def test_host_scan_failure_is_reported_not_raised():
    async def go():
        app = make_app(host_source=FakeHost(fail=PermissionError("no /proc")),
                       host_interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            assert "scan failed" in status_text(app, "#host-status")
            assert app.is_running
    run(go())


# -- process view -------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(SNAPSHOTS))
def test_process_view_renders_each_allocator(kind):
    snap = SNAPSHOTS[kind]()

    async def go():
        app = make_app(process_source=FakeProcess([snap], pid=snap.pid), interval=1000)
        async with app.run_test(size=(100, 40)) as pilot:
            await settle(pilot, app)
            assert kind in app.sub_title
            # stats table: one row per normalised field; unknown shown as unknown
            values = dict(zip(table_column(app, "#stats", 0), table_column(app, "#stats", 1)))
            for name, v in snap.stats.items():
                assert (values[name] == "unknown") == (v.value is None)
            # the native dict is rendered as at least one table
            assert app.screen.query("NativeTables DataTable")
            # every tab opens
            for key, tab in (("2", "allocator"), ("3", "findings"), ("4", "process"),
                             ("1", "overview")):
                await pilot.press(key)
                assert app.screen.query_one("#tabs").active == tab
    run(go())


def test_findings_tab_shows_knob_current_and_source():
    async def go():
        app = make_app(process_source=FakeProcess(), interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await pilot.press("3")
            row = app.screen.query_one("#findings-table", DataTable).get_row_at(0)
            # the first real finding on the captured jemalloc stats (diag.findings)
            assert [str(c) for c in row[2:6]] == ["dirty_decay_ms", "10000", "compiled default",
                                                  "1000"]
            assert "press k" in status_text(app, "#finding-detail")
    run(go())


def test_pause_resume_and_interval_change():
    src = FakeProcess()

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            assert src.samples == 1
            assert "every 1000 s" in status_text(app, "#proc-status")
            # WHEN space  THEN paused, and the footer offers Resume
            await pilot.press("space")
            assert app.screen.paused
            assert "paused" in status_text(app, "#proc-status")
            assert app.screen.check_action("resume", ()) and not app.screen.check_action(
                "pause", ())
            # WHEN space again  THEN resumed, and a sample is taken at once
            await pilot.press("space")
            await settle(pilot, app)
            assert not app.screen.paused
            assert src.samples == 2
            # WHEN i, 0.05 (too short)  THEN refused
            await pilot.press("i")
            inp = app.screen.query_one(Input)
            inp.value = "0.05"
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.interval == 1000
            # WHEN i, 0.3  THEN the timer samples every 0.3 s
            await pilot.press("i")
            app.screen.query_one(Input).value = "0.3"
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.interval == 0.3
            assert "every 0.3 s" in status_text(app, "#proc-status")
            await pilot.pause(1.0)
            await settle(pilot, app)
            assert src.samples >= 4
    run(go())


def test_release_needs_confirmation_and_shows_before_after():
    src = FakeProcess()

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            # WHEN r then "No"  THEN nothing is released
            await pilot.press("r")
            await pilot.pause()
            await pilot.click("#no")
            await settle(pilot, app)
            assert src.releases == 0
            # WHEN r then "Release"  THEN the source releases and the result shows
            await pilot.press("r")
            await pilot.pause()
            await pilot.click("#yes")
            await settle(pilot, app)
            assert src.releases == 1
            table = app.screen.query_one("#result", DataTable)
            rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)]
                    for i in range(table.row_count)}
            assert rows["resident"][1:] == ["2.1 GiB", "1.3 GiB", "−850.0 MiB"]
            assert rows["LazyFree"][3] == "−800.0 MiB"
            await pilot.press("escape")
            assert app.screen.id.startswith("process-")
    run(go())


def test_release_unavailable_is_a_notification():
    from tui.source import ActionUnavailable

    class NoRelease(FakeProcess):
        def release(self):
            raise ActionUnavailable("release is not available yet in this allocdiag")

    async def go():
        app = make_app(process_source=NoRelease(), interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await pilot.press("r", "y")
            await settle(pilot, app)
            assert any("not available yet" in n.message for n in app._notifications)
            assert app.is_running
    run(go())


def test_set_knob_prefilled_from_finding_and_confirmed():
    src = FakeProcess()

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await pilot.press("k")
            await pilot.pause()
            inp = app.screen.query_one(Input)
            assert inp.value == "dirty_decay_ms=1000"
            inp.value = "dirty_decay_ms=5000"
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("y")
            await settle(pilot, app)
            assert src.knobs == [("dirty_decay_ms", "5000")]
            assert any("-1 → 5000" in n.message for n in app._notifications)
            # a malformed entry is refused with a hint
            await pilot.press("k")
            await pilot.pause()
            app.screen.query_one(Input).value = "nonsense"
            await pilot.press("enter")
            await pilot.pause()
            assert src.knobs == [("dirty_decay_ms", "5000")]
            assert any("name=value" in n.message for n in app._notifications)
    run(go())


def test_recording_start_stop_writes_a_real_file(tmp_path):
    path = tmp_path / "rec.jsonl.gz"
    src = FakeProcess(staircase(6))

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await pilot.press("w")
            await pilot.pause()
            app.screen.query_one(Input).value = str(path)
            await pilot.press("enter")
            await pilot.pause()
            assert "REC" in status_text(app, "#proc-status")
            for _ in range(2):            # two more samples while recording
                app.screen.take_sample()
                await settle(pilot, app)
            await pilot.press("w")        # stop
            await pilot.pause()
            assert app.screen.recorder is None
            assert any("recorded 3 samples" in n.message for n in app._notifications)
    run(go())
    snaps = read_recording(path)
    assert [s.process.rss for s in snaps] == [s.process.rss for s in staircase(6)[:3]]


def test_replay_navigation():
    snaps = staircase(9)

    async def go():
        app = make_app(process_source=FakeReplay(snaps))
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            screen = app.screen
            assert screen.cursor == 8
            assert "replay 9/9" in status_text(app, "#proc-status")
            assert "+16.0 s" in status_text(app, "#proc-status")
            await pilot.press("left", "left")
            assert screen.cursor == 6 and screen.snapshot is snaps[6]
            await pilot.press("home")
            assert screen.cursor == 0 and screen.snapshot is snaps[0]
            await pilot.press("left")
            assert screen.cursor == 0
            await pilot.press("right")
            assert "replay 2/9" in status_text(app, "#proc-status")
            await pilot.press("end")
            assert screen.cursor == 8
            # live-only actions are off in a replay
            assert not screen.check_action("release", ())
            assert not screen.check_action("pause", ())
            assert src_samples(screen) == 0
    run(go())


def src_samples(screen):
    return screen.source.samples


def test_vanished_process_is_a_notification_and_keeps_last_sample():
    src = FakeProcess()

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            src.fail = NoSuchProcess(4242)
            app.screen.take_sample()
            await settle(pilot, app)
            assert "process 4242 exited" in status_text(app, "#proc-status")
            assert any("exited" in n.message for n in app._notifications)
            assert app.screen.snapshot is not None     # last sample still shown
            assert not app.screen.check_action("release", ())
            assert app.is_running
    run(go())


def test_permission_denied_is_a_notification_with_remediation():
    src = FakeProcess(fail=AccessDenied(4242, "ptrace: Operation not permitted"))

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            assert "permission denied" in status_text(app, "#proc-status")
            note = [n for n in app._notifications if n.title == "permission denied"]
            assert note and "root" in note[0].message
            assert app.is_running
    run(go())


def test_failed_collector_is_reported_as_partial():
    snap = jemalloc_snapshot()
    cols = dict(snap.collectors)
    cols["jemalloc"] = CollectorStatus(False, "quarantined: an earlier call timed out; "
                                              "detached", 0.0)
    from dataclasses import replace
    src = FakeProcess([replace(snap, collectors=cols)])

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            assert "partial: jemalloc" in status_text(app, "#proc-status")
            assert any("detached" in n.message for n in app._notifications)
    run(go())


def test_help_screen_and_quit():
    src = FakeProcess()

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            await pilot.press("question_mark")
            await pilot.pause()
            assert app.screen.__class__.__name__ == "HelpScreen"
            keys = dict((d, k) for k, d in app.screen.bindings_list)
            assert keys["Release"] == "r" and keys["Pause"] == "space" and "q" in keys["Quit"]
            assert "Prev" not in keys          # replay keys are not offered live
            text = " ".join(str(s.render()) for s in app.screen.query(Static))
            assert "never as 0" in text
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen.id == "process-4242"
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0
        assert src.closed          # detached on the way out
    run(go())


def test_source_close_detaches_held_threads(monkeypatch):
    """close() restores and detaches the threads of its process that the
    remote engine still holds (orphans that did not stop in time); other
    processes' orphans stay for their own source.  Before the fix close()
    looked for a diag.actions.detach that does not exist and did nothing."""
    from collectors import remote
    from tui import source as source_mod
    held = {101: types.SimpleNamespace(pid=4242), 202: types.SimpleNamespace(pid=999)}
    monkeypatch.setattr(remote, "_orphans", held)
    stopped = []

    def reap():                     # each held thread has stopped by now
        for tid in [t for t in held]:
            stopped.append(tid)
            held.pop(tid)
        held[202] = types.SimpleNamespace(pid=999)   # not ours: still running
    monkeypatch.setattr(remote, "_reap_orphans", reap)
    assert source_mod.ProcessSource(4242).close() == []
    assert 101 in stopped and 101 not in held
    assert source_mod.ProcessSource(4242, no_attach=True).close() == []


def test_source_actions_need_attach():
    from tui import source as source_mod
    src = source_mod.ProcessSource(os.getpid())
    assert callable(src._action("release")) and callable(src._action("set_knob"))
    noattach = source_mod.ProcessSource(os.getpid(), no_attach=True)
    with pytest.raises(source_mod.ActionUnavailable, match="--no-attach"):
        noattach.release()


def test_real_process_source_samples_this_process():
    from tui.source import ProcessSource
    src = ProcessSource(os.getpid(), no_attach=True)
    snap = src.sample()
    assert snap.pid == os.getpid() and snap.process.rss
    # --no-attach reached diag.snapshot.take: no remote collector ran
    assert not any(s.pause_us for s in snap.collectors.values())


# -- view-model rules ---------------------------------------------------------------

def test_mapped_is_never_inside_the_resident_stack():
    from tui import layers
    snap = jemalloc_snapshot()
    panel = layers.allocator_panel(snap)
    held = panel.bars[0]
    assert [s.role for s in held.segments] == ["allocated", "active", "resident"]
    assert held.total == snap.stats["resident"].value
    assert [b.name for b in panel.bars[1:]] == ["mapped", "retained"]
    assert any("not nested" in n for n in panel.notes)


def test_out_of_order_layers_are_drawn_as_separate_bars():
    from tui import layers
    snap = Snapshot(pid=1, stats=_stats(allocated=500, active=400, resident=300))
    panel = layers.allocator_panel(snap)
    assert [len(b.segments) for b in panel.bars] == [1, 1, 1]
    assert any("does not hold" in n for n in panel.notes)


def test_unknown_values_are_listed_not_drawn():
    from tui import layers
    panel = layers.allocator_panel(mimalloc_snapshot())
    unknown = {i.role for i in panel.legend if i.value is None}
    assert unknown == {"allocated", "active", "retained"}   # mimalloc's stats text has none
    drawn = {s.role for b in panel.bars for s in b.segments}
    assert not drawn & unknown
    rss = layers.rss_panel(Snapshot(pid=1, process=ProcessMemory(rss=100, rss_anon=80,
                                                                  rss_file=20, rss_shmem=0)))
    assert [i.value for i in rss.legend if i.role in ("held", "lazyfree")] == [None, None]


def test_rss_split_adds_up():
    from tui import layers
    snap = jemalloc_snapshot()
    bar = layers.rss_panel(snap).bars[0]
    assert sum(s.value for s in bar.segments) == snap.process.rss
    assert [s.role for s in bar.segments] == ["held", "lazyfree", "anon", "file", "shmem"]


def test_rss_bar_draws_every_layer_diag_breakdown_knows():
    """A layer diag.breakdown adds (CPython's pymalloc arenas) appears in the RSS
    bar without a TUI change, carved out of the other anonymous memory."""
    from dataclasses import replace
    from diag import breakdown
    from diag.model import Runtime
    from tui import layers
    snap = replace(glibc_snapshot(), runtime=Runtime(
        kind="cpython-pymalloc", values={"resident": Value.measured(2 * MiB, "arenas"),
                                         "allocated": Value.measured(MiB, "pools")}))
    bar = layers.rss_panel(snap).bars[0]
    py = [s for s in bar.segments if s.label.startswith("Python arenas")]
    assert [s.value for s in py] == [2 * MiB]
    assert sum(s.value for s in bar.segments) == snap.process.rss
    names = {la.label for la in breakdown.layers(snap) if la.depth == 0}
    assert {s.label for s in bar.segments if s.role == "extra"} <= names


def test_native_tables_generic():
    from tui import layers
    tables = {t.title: t for t in layers.native_tables(jemalloc_snapshot().native)}
    assert tables["summary"].rows[0][0] == "prefix"
    assert "stats.arenas.4096.pactive" in dict(tables["mallctl"].rows)
    glibc = {t.title: t for t in layers.native_tables(glibc_snapshot().native)}
    assert len(glibc["malloc_info.arenas"].rows) == 2       # the capture had two arenas
    mi = {t.title: t for t in layers.native_tables(mimalloc_snapshot().native)}
    assert mi["stats.rows"].rows[0][:2] == ("reserved", "64.0 MiB")


def test_native_units_come_from_the_schema():
    """pactive is a page count: pages and bytes (the document's arenas.page);
    byte fields as bytes, decay times as ms; without a kind no unit is guessed."""
    from tui import layers
    native = jemalloc_snapshot().native
    rows = dict(layers.native_tables(native, kind="jemalloc")[1].rows)
    pactive = native["mallctl"]["stats.arenas.4096.pactive"]
    assert rows["stats.arenas.4096.pactive"] == f"{pactive:,} pages ({human_bytes(pactive * 4096)})"
    assert rows["stats.allocated"].endswith(f"({human_bytes(native['mallctl']['stats.allocated'])})")
    assert rows["opt.dirty_decay_ms"] == "10,000 ms"
    bare = dict(layers.native_tables(native)[1].rows)
    assert bare["stats.arenas.4096.pactive"] == f"{pactive:,}"
    glibc = {t.title: dict(t.rows) for t in layers.native_tables(glibc_snapshot().native,
                                                                 kind="glibc")
             if t.columns == ("key", "value")}
    assert glibc["malloc_info.totals.system"]["current"] == "454,656 (444.0 KiB)"


def test_history_widget_draws_a_staircase():
    from tui import layers
    from tui.widgets import LayerHistory

    async def go():
        from textual.app import App

        class One(App):
            def compose(self):
                yield LayerHistory()

        app = One()
        async with app.run_test(size=(20, 5)) as pilot:
            w = app.query_one(LayerHistory)
            w.styles.height = 4
            w.series = tuple(layers.history_series(staircase(12)))
            await pilot.pause()
            rows = ["".join(seg.text for seg in w.render_line(y)) for y in range(4)]
            # the top row is full only for the later, higher samples
            assert rows[0][11] == "█" and rows[0][0] != "█"
            # every sample has something at the bottom
            assert " " not in rows[-1][:12]
    run(go())


def test_release_rows_from_snapshots():
    # diag.actions.release returns Snapshots before/after
    from dataclasses import replace
    from tui import layers
    before = jemalloc_snapshot()
    after = replace(before, process=replace(before.process, lazyfree=0),
                    stats=dict(before.stats, muzzy=Value()))
    rows = {r[0]: r for r in layers.release_rows({"before": before, "after": after,
                                                  "call": "arena.4096.purge",
                                                  "pause_us": [300, 140]})}
    assert rows["LazyFree"][1:] == ("4.0 MiB", "0 B", "−4.0 MiB")
    assert rows["muzzy"][1:] == ("0 B", "unknown", "")
    assert rows["pause_us"][1] == "440 µs (2 stops)"


def test_no_color_is_respected(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")

    async def go():
        app = make_app(process_source=FakeProcess(), interval=1000)
        assert app.no_color            # textual's monochrome filter
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app)
            # the bar roles stay distinguishable by glyph alone
            from tui import layers
            roles = [s.role for s in layers.allocator_panel(app.screen.snapshot).bars[0].segments]
            assert len({layers.GLYPHS[r] for r in roles}) == len(roles)
    run(go())


def test_plain_host_source_fills_allocator_resident_in_the_background():
    # `allocdiag` / `allocdiag top`: the host source annotates each scan from
    # diag.hostlive's cache (never waiting for a stop); after the worker read
    # the target, its row carries the allocator's resident bytes.
    import time as _time
    from diag.hostlive import HostLive
    from targets import build_c, start as start_target
    from tui.source import HostSource
    with start_target([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        with HostLive(min_gap_s=0.1, refresh_s=5.0) as live:
            source = HostSource(pids=[t.pid], live=live)
            first = source.scan().rows[0]
            assert first["allocator_read"] == "pending"
            deadline = _time.monotonic() + 20
            while _time.monotonic() < deadline:
                row = source.scan().rows[0]
                if row["allocator_read"] != "pending":
                    break
                _time.sleep(0.2)
    assert row["allocator_read"] == "ok", row
    assert row["resident"] and row["resident"] > 0
