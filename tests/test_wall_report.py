"""``record --wall``, its wall lines (diag.wallfile) and the report's wall
section (issue 20 item 7), on real captures (tests/targets/capture_wall.py)
and a real process."""

import gzip
import json
import math
import os
import re
import subprocess
import sys

import pytest

from diag.model.errors import MalformedData
from diag import report, wallfile
from diag.recording import read_recording, read_recording_events

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(HERE, "fixtures")
GLIBC_WINDOWS = os.path.join(FIXTURES, "wall-glibc-arena1.json")
WALL_RECORDING = os.path.join(FIXTURES, "recording-wall-jemalloc.jsonl.gz")
PLAIN_RECORDING = os.path.join(FIXTURES, "recording-jemalloc-burst-release.jsonl.gz")
DERIVED = ("per_s", "allocator_s")      # recomputed over the stored duration


def glibc_docs():
    with open(GLIBC_WINDOWS) as f:
        return json.load(f)


def _same(a, b, path=""):
    """A == B, except the figures derived from the duration: within 0.1%."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif path.rsplit(".", 1)[-1].endswith(DERIVED) and a is not None:
        assert math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-6), path
    else:
        assert a == b, path


# keys added to the document after the fixtures were captured: a document
# without them reads back with their empty value
LATER_KEYS = {"window": {"pause_us": []}}


def test_wall_documents_read_back_to_the_same_document():
    docs = glibc_docs()
    assert docs
    for doc in docs:
        back = wallfile.wall_from_json(doc).to_json(stacks=True)
        for section, added in LATER_KEYS.items():
            for k, empty in added.items():
                if k not in doc[section]:
                    assert back[section].pop(k) == empty, (section, k)
        _same(doc, back)
        # and a document with them round-trips them
        again = wallfile.wall_from_json(back | {"window": back["window"] | {"pause_us": [812]}})
        assert again.to_json(stacks=True)["window"]["pause_us"] == [812]


@pytest.mark.parametrize("bad", [None, [], {"kind": "compare"},
                                 {"kind": "wall", "schema_version": 99},
                                 {"kind": "wall", "schema_version": 1, "window": {"pid": "x"}},
                                 {"kind": "wall", "schema_version": 1, "window": {"pid": 1},
                                  "findings": [{"id": "x", "title": "t", "knob": {}}]}])
def test_a_malformed_wall_document_is_malformed_data(bad):
    with pytest.raises(MalformedData):
        wallfile.wall_from_json(bad)


def test_wall_lines_are_events_older_readers_skip():
    snaps, events = read_recording_events(WALL_RECORDING)
    walls = wallfile.walls_of(events)
    assert len(walls) >= 3 and len(read_recording(WALL_RECORDING)) == len(snaps)
    # each window lies between the snapshot before it and the one after it
    times = [s.taken_at for s in snaps]
    for taken_at, w in walls:
        assert w.window.pid == snaps[0].pid
        before = [t for t in times if t <= w.window.start + 1e-3]
        after = [t for t in times if t >= taken_at - 1e-3]
        assert before and after
        assert wallfile.wall_at(walls, taken_at - w.window.duration_s / 2) is w


def test_wall_totals_weigh_windows_by_samples_and_thread_time():
    walls = [wallfile.wall_from_json(d) for d in glibc_docs()]
    docs = glibc_docs()
    tot = report.wall_totals(walls)
    alloc = sum(d["cpu"]["allocator_share"] * d["cpu"]["samples"] for d in docs)
    assert tot["samples"] == sum(d["cpu"]["samples"] for d in docs)
    assert math.isclose(tot["allocator_share"], alloc / tot["samples"], rel_tol=1e-4)
    lock = sum(d["off_cpu"]["allocator_lock_s"] for d in docs)
    assert math.isclose(tot["lock_share"], lock / sum(d["off_cpu"]["thread_s"] for d in docs),
                        rel_tol=1e-4)
    # one arena, four threads: the lock wait is there, and mmap comes from the allocator
    assert tot["lock_share"] > 0.05
    assert tot["syscalls"]["mmap"][1] == 1.0


def test_icicle_tree_sums_callees_into_callers():
    tree = report.charts.icicle_tree([(("main", "a", "malloc"), 3), (("main", "a", "free"), 1),
                                      (("main", "b"), 2)])
    assert tree["main"][0] == 6
    assert tree["main"][1]["a"][0] == 4 and tree["main"][1]["a"][1]["free"][0] == 1


def test_report_draws_the_wall_of_a_wall_recording(tmp_path):
    out = tmp_path / "r.html"
    report.render_file(WALL_RECORDING, str(out))
    page = out.read_text()
    section = page[page.index("<h2>The allocation wall</h2>"):]
    assert 'aria-label="allocator share over time"' in section
    assert 'aria-label="allocator CPU by call stack"' in section
    walls = wallfile.walls_of(read_recording_events(WALL_RECORDING)[1])
    top = report._wall_sites([w for _t, w in walls])[0][0]
    assert f"<td>{top}</td>" in section
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_report_of_a_plain_recording_says_how_to_get_the_wall(tmp_path):
    out = tmp_path / "r.html"
    report.render_file(PLAIN_RECORDING, str(out))
    assert "No wall figures in this recording" in out.read_text()


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def test_record_wall_of_a_real_process(tmp_path):
    from targets import build_c, start
    exe = build_c("wall_ui.c", "-pthread")
    path = tmp_path / "w.jsonl.gz"
    with start([exe, "2"], env={"MALLOC_ARENA_MAX": "1"}) as t:
        res = _cli("record", str(t.pid), "-o", str(path), "--interval", "1",
                   "--duration", "3", "--wall")
    assert res.returncode == 0, res.stderr
    snaps, events = read_recording_events(str(path))
    walls = wallfile.walls_of(events)
    assert len(snaps) >= 3 and len(walls) >= 2
    for _t, w in walls:
        assert w.window.pid == t.pid and w.cpu.samples > 0
        # the interval less the snapshot's own time (longer on a loaded CI)
        assert 0.2 < w.window.duration_s < 1.5
    assert {"parse_request", "build_response", "spill_buffer"} & \
        {s.function for _t, w in walls for s in w.sites}
    with gzip.open(path, "rt") as f:
        assert sum('"event":"wall"' in line for line in f) == len(walls)


def test_record_wall_with_no_attach_is_a_usage_error(tmp_path):
    res = _cli("record", str(os.getpid()), "-o", str(tmp_path / "x.jsonl"), "--wall",
               "--no-attach", "--duration", "1")
    assert res.returncode == 2 and "--no-attach" in res.stderr


def test_ctrl_c_during_a_wall_window_ends_the_recording_with_the_window(tmp_path):
    """The sampler ends a window on Ctrl-C and returns it; record writes it
    and stops, instead of going on with the next snapshot."""
    import signal
    import time
    from targets import build_c, start
    exe = build_c("wall_ui.c", "-pthread")
    path = tmp_path / "w.jsonl"
    with start([exe, "2"]) as t:
        proc = subprocess.Popen([sys.executable, "-m", "diag", "record", str(t.pid), "-o",
                                 str(path), "--interval", "30", "--wall"], cwd=ROOT,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while (not path.exists() or not path.read_text()) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.5)                 # inside the first wall window
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=20)
        finally:
            proc.kill()
    snaps, events = read_recording_events(str(path))
    walls = wallfile.walls_of(events)
    assert len(snaps) == 1 and len(walls) == 1, err
    assert walls[0][1].window.ended == "interrupted"
    assert "Traceback" not in err


def test_report_lists_the_windows_findings_with_their_knob(tmp_path):
    """A recording of the one-arena glibc target: the wall rules' findings
    (arena lock wait, mmap churn) appear once each, with the knob."""
    from diag.recording import Recorder
    from fakes import glibc_snapshot
    docs = glibc_docs()
    path = tmp_path / "w.jsonl"
    with Recorder(path) as rec:         # the captured windows between two snapshots
        rec.write(glibc_snapshot(taken_at=docs[0]["window"]["start"] - 1))
        for d in docs:
            rec.write_event(wallfile.EVENT, wallfile.wall_event(wallfile.wall_from_json(d)))
        rec.write(glibc_snapshot(taken_at=docs[-1]["window"]["start"] + 3))
    out = tmp_path / "r.html"
    report.render_file(str(path), str(out))
    section = out.read_text().split("<h3>Findings of the windows</h3>")[1]
    ids = {f["id"] for d in docs for f in d["findings"]}
    assert "wall-arena-lock" in ids
    for fid in ids:
        assert section.count(f"{fid} · ") == 1
    assert "<dt>knob</dt><dd>arena_max</dd>" in section
    assert f"in {len(docs)} of {len(docs)} windows" in section


def test_wall_text_lists_the_counts_that_moved_before_idle_levels():
    """`allocdiag wall`'s counter table, on a real jemalloc window: the
    counts that moved (malloc requests, the ctl mutex ...) come first,
    fastest first, then the levels that are not 0; 26 mutex maxima at
    0 -> 0 are left out and said so (listed first, they used to fill all
    24 rows)."""
    import io
    from diag import render_wall
    _snaps, events = read_recording_events(WALL_RECORDING)
    _t, w = wallfile.walls_of(events)[1]
    moved = [c for c in w.counters.values() if c.kind == "delta" and c.delta]
    idle_levels = [c for c in w.counters.values()
                   if c.kind == "gauge" and not c.start and not c.end]
    assert len(moved) >= 10 and len(idle_levels) > render_wall.TOP_COUNTERS
    out = io.StringIO()
    render_wall.text(w, out=out)
    table = out.getvalue().split("Allocator counters over the window", 1)[1]
    rows = [line.split()[0] for line in table.splitlines()[2:] if line.startswith("jemalloc.")
            or line.startswith("process.")]
    by_name = {c.name: c for c in moved}
    count_rows = [r for r in rows if r in by_name]
    assert count_rows == rows[:len(count_rows)]                     # counts first
    assert len(count_rows) == min(len(moved), render_wall.TOP_COUNTERS)
    speeds = [by_name[r].per_s for r in count_rows]
    assert speeds == sorted(speeds, reverse=True) and speeds[0] == max(c.per_s for c in moved)
    assert not {c.name for c in idle_levels} & set(rows)
    assert {"jemalloc.narenas", "jemalloc.arenas.nthreads", "process.threads"} <= set(rows)
    assert re.search(r"\(\d+ more not shown: counts that did not move, levels at 0", table)


def test_time_tab_counter_rows_follow_the_text_rule():
    """The TUI's Time tab shows the counters by the text report's rule: the
    same window gives the counts that moved first, fastest first, no
    0 -> 0 level among the rows, and its title says how many were left out
    (before, it listed the idle mutex maxima after the moved counts)."""
    from diag import render_wall
    from tui import wall_tab
    _snaps, events = read_recording_events(WALL_RECORDING)
    _t, w = wallfile.walls_of(events)[1]
    shown = wall_tab.shown_counters(w)
    rows = wall_tab.counter_rows(shown)
    names = [r[0] for r in rows]
    assert names == [c.name for c in render_wall.counters_shown(w, wall_tab.TOP_COUNTERS)]
    moved = sorted((c for c in w.counters.values() if c.kind == "delta" and c.delta),
                   key=lambda c: -c.per_s)
    assert names[:len(moved)] == [c.name for c in moved][:wall_tab.TOP_COUNTERS]
    idle = {c.name for c in w.counters.values() if c.kind == "gauge" and not c.start and not c.end}
    assert idle and not idle & set(names)
    assert len(rows) < len(w.counters)
    title = wall_tab.counters_title(w, shown)
    assert f"({len(w.counters) - len(rows)} more not shown" in title
