"""Pilot tests of the allocdiag TUI, driven with injected fake sources.

The sources and snapshots come from tests/fakes.py: the allocator layer,
native document and findings of each snapshot are what the real parsers and
rules make of a captured file in tests/fixtures.  Every screen and action is
exercised through key presses and clicks, the way a user would.
"""

import asyncio
import os
import re
import types

import pytest

from diag.model.errors import AccessDenied, NoSuchProcess
from diag.model import CollectorStatus, ProcessMemory, Snapshot, Value
from diag.recording import read_recording
from diag.render import human_bytes
from fakes import (HOST_ROWS, MiB, SNAPSHOTS, FakeHost, FakeProcess, FakeReplay, _stats,
                   glibc_snapshot, jemalloc_snapshot, mimalloc_snapshot, staircase)
from textual.widgets import DataTable, Input, Static


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
            # the first real finding on the captured jemalloc stats (diag.findings):
            # background_thread is off there, so the suggestion is 0
            assert [str(c) for c in row[2:6]] == ["dirty_decay_ms", "10000", "compiled default",
                                                  "0"]
            detail = status_text(app, "#finding-detail")
            assert "press k" in detail
            # evidence with its unit from the one formatter: bytes, binary units, share of RSS
            assert re.search(r"dirty: [\d,]+ B \([\d.]+ MiB\) = [\d.]+% of RSS", detail), detail
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
            # the real shape: diag.actions.release returns Snapshots before/after
            before = src.snaps[0]
            dirty = before.stats["dirty"].value
            resident = before.stats["resident"].value
            assert rows["resident"][1:] == [human_bytes(resident), human_bytes(resident - dirty),
                                            "−" + human_bytes(dirty)]
            assert rows["LazyFree"][3] == "−4.0 MiB"
            await pilot.press("escape")
            assert app.screen.id.startswith("process-")
    run(go())


def test_release_unavailable_is_a_notification():
    from diag.source import ActionUnavailable

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
            assert inp.value == "dirty_decay_ms=0"
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
    from diag.model.records import replace
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
    from collectors.engine import tracee
    from diag import source as source_mod
    held = {101: types.SimpleNamespace(pid=4242), 202: types.SimpleNamespace(pid=999)}
    monkeypatch.setattr(tracee.REGISTRY, "orphans", held)
    stopped = []

    def reap():                     # each held thread has stopped by now
        for tid in [t for t in held]:
            stopped.append(tid)
            held.pop(tid)
        held[202] = types.SimpleNamespace(pid=999)   # not ours: still running
    monkeypatch.setattr(tracee, "reap_orphans", reap)
    assert source_mod.ProcessSource(4242).close() == []
    assert 101 in stopped and 101 not in held
    assert source_mod.ProcessSource(4242, no_attach=True).close() == []


def test_source_actions_need_attach():
    from diag import source as source_mod
    src = source_mod.ProcessSource(os.getpid())
    assert callable(src._action("release")) and callable(src._action("set_knob"))
    noattach = source_mod.ProcessSource(os.getpid(), no_attach=True)
    with pytest.raises(source_mod.ActionUnavailable, match="--no-attach"):
        noattach.release()
    with pytest.raises(source_mod.ActionUnavailable, match="--no-attach"):
        noattach.heap_status()
    replay = source_mod.ReplaySource(snapshots=staircase(2))
    with pytest.raises(source_mod.ActionUnavailable, match="need a live process"):
        replay.heap_dump()


def test_real_process_source_samples_this_process():
    from diag.source import ProcessSource
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
    # mimalloc's stats text has none of these; its committed counter is not
    # resident (measured from the segments' pages only in a live snapshot)
    assert unknown == {"allocated", "active", "resident", "retained"}
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
    from diag.model.records import replace
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


def test_glibc_free_chunk_lists_are_summed_not_dumped_as_json():
    """malloc_info's per-arena <size> lists and <total type=fast> entries show
    as chunk counts and bytes (summed over the ranges), never as raw JSON."""
    from tui import layers
    native = glibc_snapshot().native
    arenas = {t.title: t for t in layers.native_tables(native, kind="glibc")}["malloc_info.arenas"]
    cols = arenas.columns
    for row, arena in zip(arenas.rows, native["malloc_info"]["arenas"]):
        cells = dict(zip(cols, row))
        assert not any("{" in str(c) for c in row), row
        sizes = arena["sizes"]
        chunks = sum(x["count"] for x in sizes)
        assert cells["sizes"].startswith(f"{len(sizes)} size ranges: {chunks:,} chunk")
        assert f"{sum(x['total'] for x in sizes):,}" in cells["sizes"]
        assert cells["fast"].startswith(f"{arena['fast']['count']:,} chunk")


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


def test_inspect_text_and_tui_share_the_native_formatter():
    """allocdiag inspect's "allocator's own numbers" section and the Allocator
    tab format the same native value through diag.render.native_rows."""
    import io

    from diag import render_text
    snap = jemalloc_snapshot()
    pactive = snap.native["mallctl"]["stats.arenas.4096.pactive"]
    want = f"{pactive:,} pages ({human_bytes(pactive * 4096)})"
    line = next(ln for ln in _inspect(snap).splitlines() if "stats.arenas.4096.pactive" in ln)
    assert line.split(None, 1) == ["mallctl.stats.arenas.4096.pactive", want]
    keep = next(ln for ln in _inspect(glibc_snapshot()).splitlines()
                if "mallinfo2.keepcost" in ln)
    assert keep.split(None, 1)[1] == "131,216 (128.1 KiB)"      # bytes, not a bare count
    plain = io.StringIO()
    render_text.print_inspect(snap, out=plain)
    assert "own numbers" not in plain.getvalue()


def _inspect(snap):
    import io

    from diag import render_text
    out = io.StringIO()
    render_text.print_inspect(snap, out=out, native=True)
    return out.getvalue()


# -- one reactive view-model ----------------------------------------------------------

def test_one_assignment_to_the_view_redraws_every_tab():
    """The screen's widgets are bound to its ``view`` reactive: assigning one
    ProcessView (no show(), no per-widget update) redraws every tab."""
    from tui import layers
    from tui.widgets import NativeTables, StackPanel

    async def go():
        app = make_app(process_source=FakeProcess(), interval=1000)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            screen = app.screen
            assert screen.query_one("#cgroup-panel").display       # jemalloc: in a cgroup
            old_native = {t.title for t in layers.native_tables(screen.snapshot.native)}
            # WHEN the view of another process (mimalloc, no cgroup) is assigned once
            snap = mimalloc_snapshot()
            screen.view = layers.process_view(snap, [snap])
            await pilot.pause()
            # THEN every tab shows it
            assert screen.snapshot is snap and "mimalloc" in app.sub_title
            for wid, panel_of in (("#alloc-panel", layers.allocator_panel),
                                  ("#rss-panel", layers.rss_panel)):
                assert screen.query_one(wid, StackPanel).panel == panel_of(snap)
            assert not screen.query_one("#cgroup-panel").display
            assert screen.query_one("#history").series == tuple(layers.history_series([snap]))
            assert "1 sample)" in status_text(app, "#history-legend")
            assert table_column(app, "#stats") == [r[0] for r in layers.stats_rows(snap)]
            native = screen.query_one(NativeTables)
            titles = {str(w.render()) for w in native.query("Label")}
            assert titles == {t.title for t in layers.native_tables(snap.native, kind="mimalloc")}
            assert titles != old_native
            assert table_column(app, "#findings-table") == []    # mimalloc's capture: none
            assert status_text(app, "#finding-detail") == "no findings"
            assert status_text(app, "#process-info").startswith("6161 renderer")
            assert table_column(app, "#collectors") == ["procfs", "mimalloc"]
    run(go())


def test_bound_widgets_draw_a_view_set_before_and_after_mount():
    """A bound widget draws the view its parent held before it was mounted
    (the binding starts from the current value) and every later one."""
    from textual.app import App
    from textual.reactive import reactive
    from tui import layers, process_tabs
    from tui.widgets import HistoryLegend, LayerHistory, StackPanel, ViewTable

    class Holder(App):
        view = reactive(None)

        def compose(self):
            yield StackPanel(id="rss", panel_of=layers.rss_panel).data_bind(Holder.view)
            history = LayerHistory(id="history").data_bind(Holder.view)
            yield history
            yield HistoryLegend(history, id="legend").data_bind(Holder.view)
            yield ViewTable(process_tabs.COLLECTORS_COLUMNS, process_tabs.collector_rows,
                            id="collectors").data_bind(Holder.view)

    first = staircase(3)
    second = glibc_snapshot()

    async def go():
        app = Holder()
        app.view = layers.process_view(first[-1], first)      # before mount
        async with app.run_test(size=(80, 20)) as pilot:
            await pilot.pause()
            assert app.query_one("#rss", StackPanel).panel == layers.rss_panel(first[-1])
            assert len(app.query_one("#history", LayerHistory).series[0][2]) == 3
            assert "3 samples" in str(app.query_one("#legend").render())
            assert table_column(app, "#collectors") == list(first[-1].collectors)
            app.view = layers.process_view(second, first + [second], cursor=1)   # after
            await pilot.pause()
            assert app.query_one("#rss", StackPanel).panel == layers.rss_panel(second)
            assert app.query_one("#history", LayerHistory).cursor == 1
            legend = str(app.query_one("#legend").render())
            assert human_bytes(first[1].process.rss) in legend       # the cursor's sample
            assert table_column(app, "#collectors") == list(second.collectors)
    run(go())


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
    from diag.model.records import replace
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
    from diag.source import HostSource
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


# -- Heap tab ------------------------------------------------------------------------
# The fake answers with one real session (tests/targets/capture_heap_session.py): a
# python3 under libtcmalloc.so.4 that, after the start, kept 200 bytearray(100000)
# (100,001 bytes each) and 300 bytes(50000); before the second dump it dropped the
# bytes objects and kept 400 more bytearrays.

BYTEARRAY = 100_001


def heap_app(heap="tcmalloc", src=None):
    from fakes import heap_context_snapshot
    snap = heap_context_snapshot()
    src = src or FakeProcess([snap], pid=snap.pid, heap=heap)
    return src, make_app(process_source=src, interval=1000)


async def keys(pilot, app, *names):
    """Press NAMES and let the workers they start finish."""
    await pilot.press(*names)
    await settle(pilot, app)


def heap_text(app, selector="#heap-state"):
    return str(app.screen.query_one(selector, Static).render())


def test_heap_tab_start_dump_diff_stop():
    from tui.dialogs import ConfirmDialog
    src, app = heap_app()

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            screen = app.screen
            assert not screen.check_action("heap", ())       # only on the Heap tab
            await pilot.press("5")
            await pilot.pause()
            assert screen.check_action("heap", ())
            assert src.heap_calls == []                       # nothing called on opening
            # WHEN s  THEN the status, and the start is asked first (and can be refused)
            await keys(pilot, app, "s")
            assert isinstance(app.screen, ConfirmDialog)
            question = str(app.screen.query_one("#question", Static).render())
            assert "sees only allocations after start" in question
            assert "HeapProfilerStart" in question and "slower" in question
            await keys(pilot, app, "n")
            assert src.heap_calls == ["status"] and src.heap_state == "status_before"
            assert "running now: no" in heap_text(app)
            # WHEN s, Start  THEN started, and the status says it runs
            await keys(pilot, app, "s")
            await pilot.click("#yes")
            await settle(pilot, app)
            assert src.heap_calls == ["status", "status", "start", "status"]
            assert "running now: yes" in heap_text(app)
            # D before two dumps: told, nothing called
            await keys(pilot, app, "D")
            assert any("dump twice" in n.message for n in app._notifications)
            # WHEN d  THEN the top sites: the 200 bytearrays first
            await keys(pilot, app, "d")
            top = screen.query_one("#heap-sites", DataTable).get_row_at(0)
            assert [str(c) for c in top[:3]] == [human_bytes(200 * BYTEARRAY), "200",
                                                 human_bytes(200 * BYTEARRAY)]
            # the caller as the capture machine symbolized it (tests/fakes.py captured_view)
            assert str(top[4]) == "PyByteArray_Resize"
            assert heap_text(app, "#heap-sites-title").startswith("dump 1 ")
            # WHEN d, D  THEN what grew and shrank per site, and the layers beside
            await keys(pilot, app, "d")
            await keys(pilot, app, "D")
            rows = [[str(c) for c in r] for r in
                    (screen.query_one("#heap-diff", DataTable).get_row_at(i) for i in
                     range(screen.query_one("#heap-diff", DataTable).row_count))]
            assert rows[0][:3] == ["grew", "+" + human_bytes(400 * BYTEARRAY), "+400"]
            assert rows[-1][0] == "shrank" and rows[-1][2] == "-300"
            a, b = (src.heap[k]["snapshot"]["stats"]["allocated"]["value"]
                    for k in ("dump_a", "dump_b"))
            layers = {str(r[0]): str(r[3]) for r in (
                screen.query_one("#heap-layers", DataTable).get_row_at(i) for i in range(
                    screen.query_one("#heap-layers", DataTable).row_count))}
            assert layers["allocated"] == "+" + human_bytes(b - a)
            assert "verdict: growth is live objects" in heap_text(app, "#heap-verdict")
            # WHEN x  THEN stopped, and the status says so
            await keys(pilot, app, "x")
            assert src.heap_calls[-2:] == ["stop", "status"]
            assert "running now: no" in heap_text(app)
            assert any("drops the recorded data" in n.message for n in app._notifications)
    run(go())


def test_leaving_the_view_stops_the_profiler_it_started():
    """gperftools records every allocation while on: quitting the view stops
    the profiler it started (and only that one)."""
    src, app = heap_app()

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await keys(pilot, app, "5", "s")
            await pilot.click("#yes")
            await settle(pilot, app)
            assert src.heap_state == "status_running"
            await pilot.press("q")
            await pilot.pause()
    run(go())
    assert src.heap_calls[-1] == "stop" and src.heap_state == "status_before"
    own, app = heap_app(heap="tcmalloc_own")

    async def leave_alone():
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await keys(pilot, app, "5", "s")
            await pilot.press("q")
            await pilot.pause()
    run(leave_alone())
    assert own.heap_calls == ["status"]


def test_heap_tab_without_a_profiler_says_how():
    """glibc: s shows heapcontrol's "not possible" and its recipe, nothing to
    confirm; d anyway: the refusal, its reason and recipe, in the tab and as a
    notification."""
    src, app = heap_app(heap="glibc")

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await keys(pilot, app, "5", "s")
            text = heap_text(app)
            assert "heap profiling NOT possible" in text
            assert "how: restart it under an allocator with a heap profiler" in text
            assert "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2" in text
            assert app.screen.id.startswith("process-")       # nothing to confirm
            assert src.heap_calls == ["status"]
            await keys(pilot, app, "d")
            text = heap_text(app)
            doc = src.heap["status_before"]
            assert text.startswith(f"heap dump failed: pid {src.pid}: heap profiling is not "
                                   f"possible: {doc['reason']}")
            assert "how: " + doc["remedy"] in text
            assert any(n.title == "heap dump failed" for n in app._notifications)
            assert src.heap_calls == ["status", "dump"]
    run(go())


def test_heap_tab_in_a_replay_needs_a_live_process():
    from tui.heap_tab import HeapTab
    from diag.source import NEEDS_LIVE_PROCESS
    src = FakeReplay(staircase(3))

    async def go():
        app = make_app(process_source=src)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await pilot.press("5")
            await pilot.pause()
            assert heap_text(app) == NEEDS_LIVE_PROCESS
            assert not app.screen.check_action("heap", ())
            app.screen.query_one(HeapTab).request("dump")
            await settle(pilot, app)
            assert src.heap_calls == []
    run(go())


def test_heap_call_runs_in_a_worker_not_the_ui():
    """A slow dump (GetHeapProfile walks every bucket) leaves the UI working."""
    import threading
    gate = threading.Event()

    class SlowDump(FakeProcess):
        def heap_dump(self):
            assert threading.current_thread() is not threading.main_thread()
            gate.wait(10)
            return super().heap_dump()

    from fakes import heap_context_snapshot
    snap = heap_context_snapshot()
    src, app = heap_app(src=SlowDump([snap], pid=snap.pid))

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, app)
            await pilot.press("5", "d")
            await pilot.pause()
            assert "taking a profile" in heap_text(app)
            await pilot.press("1")                 # the UI answers while the dump waits
            await pilot.pause()
            assert app.screen.query_one("#tabs").active == "overview"
            gate.set()
            await settle(pilot, app)
            assert app.screen.query_one("#heap-sites", DataTable).row_count
    run(go())


def test_heap_tab_on_a_real_tcmalloc_process():
    """The Heap tab over the real source: gperftools' profiler started in a
    running process (libtcmalloc.so.4), 50 blocks allocated after the start
    from a uniquely named function, dumped: that function is the top site;
    the view closed: the profiler is off and nothing is left in the target's
    /tmp."""
    import glob
    from collectors import heapcontrol
    from targets import build_c, start
    from diag.source import ProcessSource
    site, n, size = "allocdiag_heapctl_grow_site", 50, 100_000

    with start([build_c("heap_grow.c")], allocator="tcmalloc") as t:
        app = make_app(process_source=ProcessSource(t.pid), interval=1000)

        async def go():
            async with app.run_test(size=(120, 40)) as pilot:
                await settle(pilot, app)
                await keys(pilot, app, "5", "s")
                await pilot.click("#yes")
                await settle(pilot, app)
                assert "running now: yes" in heap_text(app)
                t.proc.stdin.write(f"grow {n} {size}\n".encode())
                t.proc.stdin.flush()
                assert t.proc.stdout.readline().startswith(b"OK")
                await keys(pilot, app, "d")
                top = [str(c) for c in
                       app.screen.query_one("#heap-sites", DataTable).get_row_at(0)]
                assert top[3] == site and top[1] == str(n)
                # nothing freed since the start: allocated equals in use, and is shown
                assert top[0] == top[2] == human_bytes(n * size)
                await pilot.press("q")          # leaving the view stops the profiler
                await pilot.pause()
        run(go())
        assert t.alive()
        assert not heapcontrol.status(t.pid)["running"]
        assert not glob.glob(f"/proc/{t.pid}/root/tmp/allocdiag-heap-{t.pid}-*")


def test_heap_tab_stops_the_programs_own_profile_only_when_confirmed():
    """A python3 started with HEAPPROFILE (captured): x asks the process
    first, and since heapcontrol leaves a profile it did not start alone, asks
    the user; No leaves it running, Stop it forces the stop."""
    from tui.dialogs import ConfirmDialog
    src, app = heap_app(heap="tcmalloc_own")

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            await keys(pilot, app, "5", "x")
            assert isinstance(app.screen, ConfirmDialog)
            assert "not started by allocdiag" in str(app.screen.query_one("#question",
                                                                          Static).render())
            await keys(pilot, app, "n")
            assert src.heap_calls == ["status"]
            assert "running now: yes" in heap_text(app)
            assert "runs its own profile (HEAPPROFILE)" in heap_text(app)
            await keys(pilot, app, "x")
            await pilot.click("#yes")
            await settle(pilot, app)
            assert src.heap_calls == ["status", "status", "stop(force)", "status"]
            assert "running now: no" in heap_text(app)
    run(go())


def test_heap_sites_show_allocations_only_when_counted():
    """jemalloc without prof_accum writes zero allocation counts: '-', never
    0 B; a gperftools profile always counts them."""
    from diag import heapview
    from fakes import FIXTURES
    from tui.heap_tab import site_rows
    for name, counted in (("heap-jemalloc-python.heap", False),
                          ("heap-tcmalloc-python.heap", True)):
        view = heapview.load(os.path.join(FIXTURES, name))
        rows = site_rows(view, heapview.sites(view))
        assert all((r[2] != "-") == counted for r in rows), name
