"""Visual regression tests of the TUI (pytest-textual-snapshot).

Fixed terminal sizes (80x24 and 120x40), constructed snapshots with a fixed
clock (every ``taken_at`` is a constant, shown in UTC), no wall-clock text in
the frames.  Baselines live in ``__snapshots__/test_tui_snapshots/``; after a
deliberate change to the UI, regenerate them with
``pytest tests/test_tui_snapshots.py --snapshot-update`` and look at them.
"""

import time

import pytest

from diag import hostscan
from fakes import SNAPSHOTS, FakeHost, FakeProcess, FakeReplay, staircase
from tui import host_screen
from test_tui import make_app

pytest.importorskip("pytest_textual_snapshot")

SIZES = [(80, 24), (120, 40)]


@pytest.fixture(autouse=True)
def no_timed_samples(monkeypatch):
    """The process view samples once on opening and then on a wall-clock timer;
    on a loaded machine that timer fired during a test ("2 samples" instead of
    "1 sample").  Its timer is created paused here: the frames show the
    interval but never depend on how long the test took."""
    from tui.process_screen import ProcessScreen
    original = ProcessScreen.set_interval

    def paused(self, *args, **kwargs):
        return original(self, *args, **{**kwargs, "pause": True})
    monkeypatch.setattr(ProcessScreen, "set_interval", paused)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("NO_COLOR", raising=False)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def settled(pilot):
    app = pilot.app
    for _ in range(3):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


def process_app(kind):
    if kind == "jemalloc":
        series = staircase(30)
        src = FakeProcess([series[-1]], backlog=series[:-1])
    else:
        snap = SNAPSHOTS[kind]()
        src = FakeProcess([snap], pid=snap.pid)
    return make_app(process_source=src, interval=2.0)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_host_view(snap_compare, size, monkeypatch):
    # the unreadable count's hint depends on who runs the scan: pinned to a
    # user's, so the picture is the same for root (CI) and a developer
    monkeypatch.setattr(host_screen, "unreadable_hint",
                        lambda short: hostscan.unreadable_hint(1000, short))
    app = make_app(host_source=FakeHost(), process_source_factory=lambda pid: None,
                   host_interval=1000)
    assert snap_compare(app, terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kind", sorted(SNAPSHOTS))
def test_process_view(snap_compare, kind, size):
    assert snap_compare(process_app(kind), terminal_size=size, run_before=settled)


def test_jemalloc_findings_tab(snap_compare):
    async def before(pilot):
        await settled(pilot)
        await pilot.press("3")
        await pilot.pause()
    assert snap_compare(process_app("jemalloc"), terminal_size=(80, 24), run_before=before)


@pytest.mark.parametrize("kind", ["jemalloc", "glibc"])
def test_allocator_tab(snap_compare, kind):
    async def before(pilot):
        await settled(pilot)
        await pilot.press("2")
        await pilot.pause()
    assert snap_compare(process_app(kind), terminal_size=(120, 40), run_before=before)


def test_replay_stepped_back(snap_compare):
    app = make_app(process_source=FakeReplay(staircase(30)))

    async def before(pilot):
        await settled(pilot)
        await pilot.press(*["left"] * 12)
        await pilot.pause()
    assert snap_compare(app, terminal_size=(80, 24), run_before=before)


def test_help_screen(snap_compare):
    async def before(pilot):
        await settled(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
    assert snap_compare(process_app("jemalloc"), terminal_size=(80, 24), run_before=before)


def test_release_confirmation(snap_compare):
    async def before(pilot):
        await settled(pilot)
        await pilot.press("r")
        await pilot.pause()
    assert snap_compare(process_app("glibc"), terminal_size=(80, 24), run_before=before)


def test_heap_tab(snap_compare):
    """The Heap tab after start, two dumps and their diff, on the captured
    session of a python3 under libtcmalloc.so.4 (tests/fakes.py)."""
    from fakes import heap_context_snapshot
    snap = heap_context_snapshot()
    app = make_app(process_source=FakeProcess([snap], pid=snap.pid), interval=1000)

    async def before(pilot):
        await settled(pilot)
        for key in ("5", "s", "y", "d", "d", "D"):
            await pilot.press(key)
            await settled(pilot)
        pilot.app.clear_notifications()     # toasts time out: not part of the frame
        await pilot.pause()
    assert snap_compare(app, terminal_size=(120, 40), run_before=before)
