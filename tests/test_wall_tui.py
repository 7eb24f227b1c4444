"""The Time tab of the process view (issue 20 item 7): the allocation wall
sampled while the tab is open, from real windows the sampler produced
(tests/targets/capture_wall.py), from a real ``record --wall`` recording in
a replay, and from a real process under glibc with one arena."""

import asyncio
import json
import os
import time

import pytest
from textual.widgets import Static

from diag.wallfile import wall_from_json
from fakes import FakeProcess
from test_tui import make_app, settle, table_column
from diag.source import WALL_NO_ATTACH, WALL_NOT_RECORDED, ProcessSource, ReplaySource

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
GLIBC_WINDOWS = os.path.join(FIXTURES, "wall-glibc-arena1.json")
WALL_RECORDING = os.path.join(FIXTURES, "recording-wall-jemalloc.jsonl.gz")
PLAIN_RECORDING = os.path.join(FIXTURES, "recording-jemalloc-burst-release.jsonl.gz")


def captured_walls():
    with open(GLIBC_WINDOWS) as f:
        return [wall_from_json(d) for d in json.load(f)]


class WallProcess(FakeProcess):
    """A live source whose windows are the captured ones, one per call; after
    the last, a call waits until the tab stops it (as a real window would)."""

    def __init__(self, walls, **kw):
        super().__init__(**kw)
        self.walls_left = list(walls)
        self.wall_calls = 0
        self.stopped = False
        self.active = self.most_active = 0      # windows open at the same time

    def wall_unavailable(self):
        return ProcessSource.wall_unavailable(self)

    def wall(self, seconds, stop=None, lock=None):
        self.wall_calls += 1
        if self.walls_left:
            return self.walls_left.pop(0)
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            deadline = time.monotonic() + 30
            while not stop() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)             # a real window takes a moment to close
            self.stopped = stop()
            return captured_walls()[0]
        finally:
            self.active -= 1

    def walls(self):
        return []


def text_of(app, selector):
    return str(app.screen.query_one(selector, Static).render())


async def wait_for(pilot, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


def test_time_tab_samples_while_open_and_stops_when_left():
    walls = captured_walls()
    src = WallProcess(walls[:2])

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            # GIVEN the view open on another tab  THEN nothing is sampled
            assert src.wall_calls == 0
            # WHEN the Time tab is opened
            await pilot.press("6")
            tab = app.screen.query_one("#wall-tab")
            await wait_for(pilot, lambda: tab.windows >= 2)
            # THEN the windows are drawn as they come: the last one is on screen
            assert tab.wall is walls[1]
            cpu = text_of(app, "#wall-cpu")
            assert f"allocator CPU {walls[1].cpu.allocator_share * 100:.1f}%" in cpu
            assert walls[1].cpu.by_function[0].function in cpu
            assert "application" in cpu and "unknown" in cpu and "in kernel" in cpu
            lock = text_of(app, "#wall-lock")
            assert f"({walls[1].off_cpu.allocator_lock_share * 100:.1f}%)" in lock
            assert table_column(app, "#wall-sites")[0] == walls[1].sites[0].function
            rates = dict(zip(table_column(app, "#wall-rates"),
                             table_column(app, "#wall-rates", 1)))
            assert rates["mmap"] == f"{walls[1].syscalls['mmap'].per_s:,.0f}"
            assert "window 2" in text_of(app, "#wall-state")
            # WHEN the view is paused  THEN the window in progress is ended
            await pilot.press("space")
            await wait_for(pilot, lambda: src.stopped)
            assert not tab.sampling
            # WHEN resumed  THEN sampling goes on; WHEN the tab is left  THEN it ends
            src.stopped = False
            await pilot.press("space")
            await wait_for(pilot, lambda: tab.sampling and src.wall_calls >= 4)
            await pilot.press("1")
            await wait_for(pilot, lambda: src.stopped)
            await settle(pilot, app)
            assert not tab.sampling
            calls = src.wall_calls
            await pilot.pause(0.3)
            assert src.wall_calls == calls
    asyncio.run(go())


def test_pause_and_resume_at_once_never_runs_two_windows():
    src = WallProcess([])

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await pilot.press("6")
            await wait_for(pilot, lambda: src.active == 1)
            await pilot.press("space", "space")         # pause, resume at once
            await wait_for(pilot, lambda: src.wall_calls >= 2 and src.active == 1)
            await pilot.press("1")
            await wait_for(pilot, lambda: src.active == 0)
    asyncio.run(go())
    assert src.most_active == 1


def test_windows_go_into_the_recording_the_view_is_making(tmp_path):
    from diag.recording import Recorder, read_recording_events
    from diag.wallfile import walls_of
    walls = captured_walls()
    src = WallProcess(walls[:2])
    path = tmp_path / "rec.jsonl"

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            screen = app.screen
            with screen._rec_lock:      # what the w key's dialog sets up
                screen.recorder = Recorder(path)
                screen.recorder.write(screen.snapshot)
            await pilot.press("6")
            tab = screen.query_one("#wall-tab")
            await wait_for(pilot, lambda: tab.windows >= 2)
            screen._stop_recording(quiet=True)
    asyncio.run(go())
    snaps, events = read_recording_events(str(path))
    got = [w for _t, w in walls_of(events)]
    assert len(snaps) == 1 and [w.to_json() for w in got] == [w.to_json() for w in walls[:2]]


def test_time_tab_in_a_replay_of_a_wall_recording_follows_the_cursor():
    src = ReplaySource(WALL_RECORDING)
    walls = src.walls()
    assert len(walls) >= 3

    async def go():
        app = make_app(process_source=src)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await pilot.press("6")
            await settle(pilot, app)
            tab = app.screen.query_one("#wall-tab")
            # GIVEN the last sample  THEN the window that ended before it is shown
            last = tab.wall
            assert last is walls[-1][1]
            assert "recorded window" in text_of(app, "#wall-state")
            # the counter table's title says how many rows it left out; a
            # window with no findings and nothing missing has no notes lines
            assert "more not shown" in text_of(app, "#wall-counters-title")
            assert not last.findings and not last.window.missing and last.counters
            assert app.screen.query_one("#wall-notes").display is False
            # WHEN stepping back two samples  THEN an earlier window is shown
            await pilot.press("left", "left")
            await settle(pilot, app)
            assert tab.wall is not last and tab.wall in [w for _t, w in walls]
            assert not tab.sampling
    asyncio.run(go())


@pytest.mark.parametrize("case", ["plain recording", "no-attach"])
def test_time_tab_says_why_it_cannot_sample(case):
    if case == "plain recording":
        src, why = ReplaySource(PLAIN_RECORDING), WALL_NOT_RECORDED
    else:
        src, why = WallProcess([]), WALL_NO_ATTACH
        src.no_attach = True

    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await pilot.press("6")
            await settle(pilot, app)
            assert why.split(":")[0] in text_of(app, "#wall-state").replace("\n", " ")
            assert not app.screen.query_one("#wall-tab").sampling
            if case == "no-attach":
                assert src.wall_calls == 0
    asyncio.run(go())


def _first_window(src, pid, check):
    """The process view of SRC (a real process), Time tab, until its first
    window: CHECK(app, wall) on what is shown; leaving the tab stops sampling."""
    async def go():
        app = make_app(process_source=src, interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await pilot.press("6")
            tab = app.screen.query_one("#wall-tab")
            await wait_for(pilot, lambda: tab.wall is not None
                           or "cannot" in text_of(app, "#wall-state"), timeout=30)
            assert tab.wall is not None, text_of(app, "#wall-state")
            assert tab.wall.window.pid == pid
            check(app, tab.wall)
            await pilot.press("1")
            await settle(pilot, app)
            assert not tab.sampling
    asyncio.run(go())


def test_time_tab_on_a_real_process_with_one_glibc_arena():
    """A real window of tests/targets/wall_ui.c (4 threads, MALLOC_ARENA_MAX=1)
    through ProcessSource and the sampler: allocator time and lock waits, with
    the target's own functions as call sites."""
    from targets import build_c, start
    exe = build_c("wall_ui.c", "-pthread")
    env = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}

    def check(app, w):
        assert w.cpu.samples > 0
        assert w.cpu.allocator_share > 0.02
        assert {"parse_request", "build_response", "spill_buffer"} & \
            {s.function for s in w.sites}
        assert w.syscalls["mmap"].per_s > 0
    with start([exe, "4"], env=env) as target:
        _first_window(ProcessSource(target.pid), target.pid, check)


def _time_tab_on_example(workload, env, args, check):
    """The process view of a real running example (examples/launch.py),
    Time tab, until its first window: CHECK(app, wall) on what is shown."""
    import sys
    sys.path.insert(0, os.path.dirname(HERE))
    from examples import launch
    proc = launch.start(workload, "glibc", env=env, args=args)
    try:
        launch.wait_ready(proc, timeout=60)
        _first_window(ProcessSource(proc.pid), proc.pid, check)
    finally:
        launch.stop(proc)


def test_time_tab_shows_the_arena_sprawl_examples_lock_wait_and_finding():
    def check(app, w):
        assert w.off_cpu.allocator_lock_s > 0, w.off_cpu
        lock = text_of(app, "#wall-lock")
        assert f"{w.off_cpu.allocator_lock_share * 100:.1f}%" in lock
        assert "__lll_lock_wait_private" in lock
        notes = text_of(app, "#wall-notes")
        assert "waiting for glibc arena locks" in notes and "knob arena_max" in notes, notes
        assert table_column(app, "#wall-sites")[0] == "replace_one"
    # 8 busy threads on one arena, well above the finding's threshold even on
    # a loaded box (the demo's own scene is tests/test_demo_wall.py)
    _time_tab_on_example("arena_sprawl", {"MALLOC_ARENA_MAX": "1"},
                         ["--threads", "8", "--busy"], check)


def test_time_tab_shows_the_alloc_wall_examples_allocator_share():
    def check(app, w):
        assert w.cpu.allocator_share > 0.05, w.cpu
        cpu = text_of(app, "#wall-cpu")
        assert f"allocator CPU {w.cpu.allocator_share * 100:.1f}%" in cpu
        assert w.cpu.by_function[0].function in cpu
        assert table_column(app, "#wall-sites")
    _time_tab_on_example("alloc_wall", {"PYTHONMALLOC": "malloc"},
                         ["--mode", "perrequest", "--seconds", "0.5", "--then", "busy",
                          "--duty", "30"], check)


# -- SVG baseline (pytest-textual-snapshot; fixed size, UTC, the captured window) -------

def test_time_tab_snapshot(snap_compare, monkeypatch):
    pytest.importorskip("pytest_textual_snapshot")
    from test_tui_snapshots import settled
    from tui.process_screen import ProcessScreen
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("NO_COLOR", raising=False)
    time.tzset()
    original = ProcessScreen.set_interval
    monkeypatch.setattr(ProcessScreen, "set_interval",
                        lambda self, *a, **kw: original(self, *a, **{**kw, "pause": True}))
    from fakes import glibc_snapshot
    walls = captured_walls()
    snap = glibc_snapshot()
    src = WallProcess(walls[2:3], snaps=[snap], pid=snap.pid)
    app = make_app(process_source=src, interval=2.0)

    async def before(pilot):
        await settled(pilot)
        await pilot.press("6")
        tab = app.screen.query_one("#wall-tab")
        await wait_for(pilot, lambda: tab.windows >= 1)
        await pilot.pause()
    try:
        assert snap_compare(app, terminal_size=(120, 40), run_before=before)
    finally:
        src.walls_left.clear()
        monkeypatch.undo()
        time.tzset()
