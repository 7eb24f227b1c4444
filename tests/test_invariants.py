"""Resident never exceeds what the kernel says, and every number says how it
was obtained (issue 21, item 3).

The target (tests/targets/untouched.c) mallocs 64 MiB in 1 MiB chunks and
touches none or all of their pages: what an allocator handed out but the
program never wrote is committed/active for the allocator and absent for
the kernel.
"""

import json
import os
import subprocess
import sys

import pytest

from diag.model.records import replace
from diag import breakdown, invariants, snapshot
from diag.model import ADJUSTED, MEASURED, invariant_violations
from targets import build_c, start, zero_page_pfn_or_skip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def untouched(allocator, touch_pct=0, read_rest=False):
    return start([build_c("untouched.c"), "64", "1024", str(touch_pct), str(int(read_rest))],
                 allocator=allocator)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), cwd="/", timeout=120)


def test_mimalloc_resident_is_measured_from_its_segments_pages():
    with untouched("mimalloc") as t:
        snap, _ = snapshot.take(t.pid)
    s = snap.stats
    # mimalloc's own counter: 64 MiB handed out, committed, never touched.
    assert s["committed"].value >= 64 * MiB and s["committed"].provenance == MEASURED
    res = s["resident"]
    assert res.provenance == MEASURED and "pagemap" in res.source, res
    assert res.value <= snap.process.rss_anon < 16 * MiB, (res.value, snap.process.rss_anon)
    assert res.value < s["committed"].value - 48 * MiB
    assert snap.native["mimalloc_walk"]["resident"] == res.value
    assert not invariant_violations(snap)


def test_mimalloc_resident_follows_touched_pages():
    with untouched("mimalloc", 100) as t:
        snap, _ = snapshot.take(t.pid)
    res = snap.stats["resident"].value
    assert 64 * MiB <= res <= snap.process.rss_anon, (res, snap.process.rss_anon)


@pytest.mark.parametrize("allocator,native_name", [("jemalloc", "stats.resident"),
                                                   ("tcmalloc", "total_physical_bytes")])
def test_resident_above_the_kernel_is_adjusted_with_raw_kept(allocator, native_name):
    with untouched(allocator) as t:
        r = run_cli("explain", "--json", str(t.pid))
        x = run_cli("explain", str(t.pid))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    res, anon = doc["stats"]["resident"], doc["process"]["rss_anon"]
    # the allocator counts the untouched 64 MiB as resident; the kernel does not
    assert res["provenance"] == ADJUSTED and res["raw"] >= 64 * MiB, res
    assert res["raw_provenance"] == MEASURED and native_name in res["source"]
    assert res["value"] <= anon < res["raw"]
    assert "never touched" in res["source"]
    # checked against the pages present where the allocator's memory can be:
    # anonymous mappings that are not thread stacks (1 here: the main one)
    assert "outside its 1 thread stacks (/proc/PID/pagemap" in res["source"], res["source"]
    rows = {row["name"]: row for row in doc["breakdown"]}
    assert rows["allocator"]["provenance"] == ADJUSTED and rows["allocator"]["raw"] == res["raw"]
    # allocated (64 MiB) cannot fit in what is resident: said, not hidden
    assert rows["allocated"]["provenance"] == ADJUSTED
    assert rows["allocated"]["raw"] == doc["stats"]["allocated"]["value"]
    assert x.returncode == 0, x.stderr
    assert "adjusted (raw" in x.stdout and "resident adjusted from" in x.stdout, x.stdout


def test_glibc_resident_counts_its_mmapped_chunks():
    with untouched("glibc", 100) as t:
        snap, _ = snapshot.take(t.pid)
        x = run_cli("explain", str(t.pid))
    chunks = snap.native["heap_resident"]["mmapped_chunks"]
    mi = snap.native["mallinfo2"]
    # the chunk headers found are glibc's own count and bytes (malloc_info mmap totals)
    assert (chunks["count"], chunks["bytes"]) == (mi["hblks"], mi["hblkhd"]) == (64, chunks["bytes"])
    assert chunks["resident"] == chunks["bytes"]            # all touched
    res = snap.stats["resident"]
    assert res.value >= 64 * MiB and "mmapped chunks" in res.source
    assert res.value <= snap.process.rss_anon
    assert "memory-outside-malloc" not in {f.id for f in snap.findings}
    assert "not held by glibc" not in x.stdout, x.stdout
    assert not invariant_violations(snap)


def test_pages_only_read_are_not_resident():
    """glibc's 64 mmapped chunks, one page of each written and every other page
    read: the reads map the kernel's shared zero page, which pagemap shows
    present but smaps' Rss and RssAnon do not count.  Their resident is the
    written pages, as smaps says, not the 64 MiB read (it was, before)."""
    from collectors.proc import pagemap
    zero_page_pfn_or_skip()
    with untouched("glibc", 0, read_rest=True) as t:
        snap, _ = snapshot.take(t.pid)
    chunks = snap.native["heap_resident"]["mmapped_chunks"]
    assert chunks["count"] == 64 and chunks["bytes"] >= 64 * MiB
    # each chunk's first page (its header and the byte written), nothing read
    assert chunks["resident"] == 64 * pagemap.PAGE_SIZE, chunks
    assert snap.stats["resident"].value <= snap.process.rss_anon < 16 * MiB
    assert not invariant_violations(snap)


def test_glibc_untouched_chunks_allocated_above_resident_is_labelled():
    with untouched("glibc", 0) as t:
        snap, _ = snapshot.take(t.pid)
    chunks = snap.native["heap_resident"]["mmapped_chunks"]
    assert chunks["count"] == 64 and chunks["resident"] < 4 * MiB
    # the bytes in its provenance are what is mapped, said as such (not present)
    assert f"64 mmapped chunks found by their headers ({chunks['bytes']} bytes mapped)" in \
        snap.stats["resident"].source
    layers = {x.name: x for x in breakdown.layers(snap)}
    assert layers["allocated"].note == ADJUSTED
    assert layers["allocated"].raw == snap.stats["allocated"].value >= 64 * MiB
    assert layers["allocated"].bytes == layers["allocator"].bytes


def test_adjusted_value_round_trips_through_a_recording():
    from diag.recording import snapshot_from_json
    with untouched("jemalloc") as t:
        snap, _ = snapshot.take(t.pid)
    doc = json.loads(json.dumps(snap.to_json()))
    back = snapshot_from_json(doc)
    assert back.stats["resident"] == snap.stats["resident"]
    assert back.stats["resident"].raw == doc["stats"]["resident"]["raw"] > back.stats[
        "resident"].value
    # unadjusted values keep the document's old shape (no raw keys)
    assert set(doc["stats"]["allocated"]) == {"value", "provenance", "source"}


def test_violation_names_both_numbers_and_is_recorded(tmp_path, monkeypatch):
    """The hook conftest installs: a resident above RssAnon (jemalloc's raw
    figure put back) is written to the file the suite checks after every
    test, naming both numbers."""
    with untouched("jemalloc") as t:
        snap, _ = snapshot.take(t.pid)
    res = snap.stats["resident"]
    raw = replace(res, value=res.raw, provenance=MEASURED, raw=None,
                              raw_provenance=None)
    bad = replace(snap, stats={**snap.stats, "resident": raw})
    found = invariant_violations(bad)
    assert found == [f"jemalloc: resident {res.raw} > RSS anon {snap.process.rss_anon} "
                     f"(kernel, {snap.process.source}) + its file-backed share 0"]
    log = tmp_path / "violations"
    monkeypatch.setenv(invariants.ENV, str(log))
    invariants.check(snap)
    assert not log.exists()
    invariants.check(bad)
    assert str(res.raw) in log.read_text() and str(snap.process.rss_anon) in log.read_text()


def test_jemalloc_orderings_are_its_own():
    """jemalloc's mapped and resident are not nested (DESIGN.md): a mapped
    below resident is no violation, an active above resident is."""
    with untouched("jemalloc", 100) as t:
        snap, _ = snapshot.take(t.pid)
    s = snap.stats
    assert not invariant_violations(snap)
    swapped = {**s, "mapped": replace(s["mapped"], value=s["resident"].value - 1)}
    assert not invariant_violations(replace(snap, stats=swapped))
    # compared by the allocator's own figure (raw, when adjusted to the kernel)
    own = s["resident"].raw if s["resident"].raw is not None else s["resident"].value
    over = {**s, "active": replace(s["active"], value=own + 1)}
    assert invariant_violations(replace(snap, stats=over)) == [
        f"jemalloc: active {own + 1} > resident {own}"]
