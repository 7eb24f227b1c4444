"""Live allocator stats read by remote calls, against the target's own
numbers at the same quiescent moment (ground truth), for each allocator,
shared and static/prefixed where that exists; and the snapshot/CLI plumbing.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from collectors.allocators.gperftools import reader as gperftools_module
from collectors import livestats
from collectors.detect import detect
from collectors.binary.image import ProcessImage
from diag import snapshot
from targets import build_c, prefixed_jemalloc_archive, start, static_jemalloc_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def truth(lines, tag="TRUTH"):
    out = {}
    for line in lines:
        if line.startswith(tag + " "):
            _, name, value = line.split()
            out[name] = int(value)
    return out


def live(pid, **kw):
    image = ProcessImage(pid)
    det = detect(image)
    return det, livestats.collect(image, det, **kw)


# glibc 2.36 libio/fmemopen.c + iofopncook.c: a calloc'd cookie and a
# malloc'd locked_FILE, 336 bytes of chunks on x86-64.
FMEMOPEN_MAX = 512


def test_glibc_mallinfo2_matches_target():
    exe = build_c("capture_glibc.c", "-lpthread")
    with start([exe, "--serve"]) as t:
        det, ls = live(t.pid)
        assert t.alive()
    m = truth(t.lines)
    assert ls.kind == "glibc"
    # One heap walk: mallinfo2 is derived from malloc_info, which runs while
    # fmemopen's FILE and cookie are live (one stop, no second walk).  So
    # exactly those chunks move from free to in use; nothing else differs.
    got = ls.native["mallinfo2"]
    assert ls.native["mallinfo2_from"] == "malloc_info"
    assert {k: v for k, v in got.items() if k not in ("uordblks", "fordblks")} == \
        {k: m[k] for k in got if k not in ("uordblks", "fordblks")}
    file_bytes = got["uordblks"] - m["uordblks"]
    assert 0 < file_bytes <= FMEMOPEN_MAX and got["fordblks"] == m["fordblks"] - file_bytes
    assert any("fmemopen" in s for s in ls.native["side_effects"])
    assert ls.stats["allocated"].value == m["uordblks"] + m["hblkhd"] + file_bytes
    assert ls.stats["allocated"].provenance == "derived"
    # The per-arena XML agrees with mallinfo2 (same moment, same process).
    tot = ls.native["malloc_info"]["totals"]
    assert tot["system"]["current"] == m["arena"] and tot["mmap"]["size"] == m["hblkhd"]
    assert len(ls.native["malloc_info"]["arenas"]) >= 2
    assert ls.pause_us and all(p > 0 for p in ls.pause_us)


JEMALLOC_KEYS = ("stats.allocated", "stats.active", "stats.metadata", "stats.resident",
                 "stats.mapped", "stats.retained", "stats.arenas.4096.pdirty",
                 "stats.arenas.4096.pmuzzy", "stats.arenas.4096.pactive", "arenas.page",
                 "arenas.narenas")


@pytest.mark.parametrize("linkage", ["preload", "static"])
def test_jemalloc_mallctl_matches_target(linkage):
    if linkage == "preload":
        exe = build_c("capture_jemalloc.c", "-ljemalloc", "-lpthread")
        ctx = start([exe, "--serve"], allocator="jemalloc")
    else:
        exe = build_c("capture_jemalloc.c", *static_jemalloc_flags(), name="capture_jemalloc_static")
        ctx = start([exe, "--serve"])
    with ctx as t:
        det, ls = live(t.pid, per_arena=True)
        assert t.alive()
    m = truth(t.lines, "LIVE")
    assert det.allocator.kind == "jemalloc"
    assert det.allocator.linkage == ("static" if linkage == "static" else "dynamic") or \
        det.allocator.linkage == "preload"
    got = ls.native["mallctl"]
    # malloc_stats_print (one call) holds its 64 KiB output buffer while it
    # reads the stats; allocated, active, pactive and metadata's share are
    # corrected exactly, where the buffer's extent came from (dirty pages, a
    # split needing one more extent header, retained or fresh memory) is not
    # known: those differ from the quiet moment by at most the extent.
    page = m["arenas.page"]
    extent = 65536 + page
    inexact = {"stats.arenas.4096.pdirty": extent // page, "stats.resident": extent,
               "stats.mapped": extent, "stats.retained": extent, "stats.metadata": page}
    diffs = {k: (got[k], m[k]) for k in JEMALLOC_KEYS}
    for key in JEMALLOC_KEYS:
        assert abs(got[key] - m[key]) <= inexact.get(key, 0), str((key, diffs))
    assert "malloc_stats_print" in ls.native["gathered_by"]
    assert ls.stats["allocated"].value == m["stats.allocated"]
    assert ls.stats["allocated"].provenance == "measured"
    assert ls.stats["dirty"].value == got["stats.arenas.4096.pdirty"] * page
    assert got["version"].startswith("5.") and "opt.dirty_decay_ms" in got
    assert len(ls.native["arenas"]) == m["arenas.narenas"]


def test_prefixed_jemalloc_stats_are_the_other_allocator():
    # The serving allocator is glibc; the prefixed _rjem_ jemalloc is an
    # "other".  The live stats describe the serving one.
    exe = build_c("prefixed_je.c", prefixed_jemalloc_archive(), "-lpthread", "-lm", "-ldl",
                  name="prefixed_je")
    with start([exe]) as t:
        det, ls = live(t.pid)
    assert ls.kind == "glibc" and ls.stats["allocated"].value > 0


@pytest.mark.parametrize("allocator,lib", [("tcmalloc", "-ltcmalloc"),
                                           ("tcmalloc_minimal", "-ltcmalloc_minimal")])
def test_tcmalloc_properties_match_target(allocator, lib):
    exe = build_c("capture_tcmalloc.c", lib, "-lpthread", name=f"capture_{allocator}")
    with start([exe, "--serve"], allocator=allocator) as t:
        det, ls = live(t.pid, per_arena=True)
        det, quick = live(t.pid)
        assert t.alive()
    p = truth(t.lines)
    props = ls.native["properties"]
    for key, value in p.items():
        assert props[key] == value, key
    # A plain snapshot: GetStats (the printed properties derived exactly from
    # it) + the two knobs (one read from memory); the cumulative counters are unknown.
    assert quick.native["properties"]["tcmalloc.max_total_thread_cache_bytes"] == \
        p["tcmalloc.max_total_thread_cache_bytes"]
    assert quick.native["properties"]["generic.current_allocated_bytes"] == \
        p["generic.current_allocated_bytes"]
    assert quick.native["properties"]["tcmalloc.pageheap_commit_count"] is None
    assert ls.stats["allocated"].value == p["generic.current_allocated_bytes"]
    assert ls.stats["resident"].value == p["generic.total_physical_bytes"]
    assert ls.native["getstats"]["summary"]["bytes_in_use_by_app"] == p["generic.current_allocated_bytes"]


@pytest.mark.parametrize("limit", [None, 64 << 20])
def test_tcmalloc_thread_cache_limit_is_read_from_memory_and_is_the_getters(limit):
    # GetNumericProperty("tcmalloc.max_total_thread_cache_bytes") returns the
    # exported overall_thread_cache_size_: read from memory, no call for it,
    # and the value is the target's own answer (default and set by env).
    exe = build_c("capture_tcmalloc.c", "-ltcmalloc", "-lpthread", name="capture_tcmalloc")
    env = {"TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES": str(limit)} if limit else None
    gperftools_module.forget_knobs()
    with start([exe, "--serve"], allocator="tcmalloc", env=env) as t:
        det, first = live(t.pid)
        det, again = live(t.pid)
        assert t.alive()
    want = truth(t.lines)["tcmalloc.max_total_thread_cache_bytes"]
    if limit:
        assert want == limit
    for ls in (first, again):
        assert ls.native["properties"]["tcmalloc.max_total_thread_cache_bytes"] == want
        assert "max_total_thread_cache_bytes read from memory" in ls.native["gathered_by"]
        assert "GetNumericProperty for tcmalloc.max_total_thread_cache_bytes" not in \
            ls.native["gathered_by"]


def reads_inside_stops(monkeypatch):
    """The addresses a gather reads from the target inside its stops (Call.read), as a list."""
    from collectors.engine import callframe
    inside = []
    real_read = callframe.Call.read

    def spy(self, addr, n):
        inside.append(addr)
        return real_read(self, addr, n)

    monkeypatch.setattr(callframe.Call, "read", spy)
    return inside


@pytest.fixture
def decommit_fresh(monkeypatch):
    """The gperftools module with nothing known of aggressive_decommit_
    (memory and disk cache off), the test's spy on the reads made inside a stop."""
    monkeypatch.setenv("ALLOCDIAG_NO_CACHE", "1")
    monkeypatch.setattr(gperftools_module.DECOMMIT_AT, "facts", {})
    gperftools_module.forget_knobs()
    return reads_inside_stops(monkeypatch)


def set_decommit(image, det, value):
    """SetNumericProperty("tcmalloc.aggressive_memory_decommit") in the
    target, as a program may at runtime (allocdiag's own `set` does not
    offer this knob)."""
    from collectors import actions
    from collectors.allocators.gperftools import knobs
    res = livestats.Resolver(image)
    rp = actions._session(image, det, 2.0)
    return knobs.Knobs().set(rp, lambda sym: actions._addr(res, det.serving, sym, "tcmalloc"),
                             None, "aggressive_memory_decommit", str(value))


@pytest.mark.parametrize("env", [None, "true"])
def test_tcmalloc_decommit_switch_is_read_from_memory_once_checked(decommit_fresh, env):
    # GetNumericProperty("tcmalloc.aggressive_memory_decommit") returns
    # PageHeap::aggressive_decommit_, a byte the library does not export:
    # found in the getter's code (decommit.py), checked once against the
    # call in the same stop (two calls: the property and GetStats), then
    # read before the stop (one call, the byte never read inside it).  The
    # value is the target's own answer, at start-up (default and env) and
    # after the program changes it at runtime, which a kept value would miss.
    inside = decommit_fresh
    exe = build_c("capture_tcmalloc.c", "-ltcmalloc", "-lpthread", name="capture_tcmalloc")
    with start([exe, "--serve"], allocator="tcmalloc",
               env={"TCMALLOC_AGGRESSIVE_DECOMMIT": env} if env else None) as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        reader = livestats.LiveReader(image, det)
        addr, _ = reader.addrs["decommit_at"]
        first = reader.collect()
        assert reader.rp.last["calls"] == 2
        assert "checked against GetNumericProperty: the same value" in first.native["gathered_by"]
        inside.clear()
        second = reader.collect()
        assert reader.rp.last["calls"] == 1 and addr not in inside
        assert "aggressive_memory_decommit read from memory before the stop" in \
            second.native["gathered_by"]
        assert "GetNumericProperty for" not in second.native["gathered_by"]
        want = truth(t.lines)["tcmalloc.aggressive_memory_decommit"]
        assert want == (1 if env else 0)
        for ls in (first, second):
            assert ls.native["properties"]["tcmalloc.aggressive_memory_decommit"] == want
        old, new, _ = set_decommit(image, det, 1 - want)
        assert (int(old), int(new)) == (want, 1 - want)
        third = reader.collect()
        assert reader.rp.last["calls"] == 1
        assert third.native["properties"]["tcmalloc.aggressive_memory_decommit"] == 1 - want
        assert t.alive()


def test_tcmalloc_decommit_address_that_disagrees_is_not_used(decommit_fresh):
    # A byte that is not aggressive_decommit_ (the one after it, 0 where the
    # switch is 1) fails the check in every stop; after DECOMMIT_DISAGREE_MAX
    # stops it is dropped and every snapshot calls for the property.
    real = gperftools_module._find_decommit

    def the_next_byte(obj):
        vaddr, found_by = real(obj)
        return vaddr + 1, found_by

    exe = build_c("capture_tcmalloc.c", "-ltcmalloc", "-lpthread", name="capture_tcmalloc")
    with start([exe, "--serve"], allocator="tcmalloc",
               env={"TCMALLOC_AGGRESSIVE_DECOMMIT": "true"}) as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        import unittest.mock
        with unittest.mock.patch.object(gperftools_module, "_find_decommit", the_next_byte):
            for _ in range(gperftools_module.DECOMMIT_DISAGREE_MAX):
                gperftools_module.forget_knobs()
                ls = livestats.collect(image, det)
                assert "different (not used)" in ls.native["gathered_by"]
                assert ls.native["properties"]["tcmalloc.aggressive_memory_decommit"] == 1
            gperftools_module.forget_knobs()
            last = livestats.LiveReader(image, det)
            assert last.addrs["decommit_at"] is None
            ls = last.collect()
        assert last.rp.last["calls"] == 2
        assert ls.native["properties"]["tcmalloc.aggressive_memory_decommit"] == 1
        assert "GetNumericProperty for tcmalloc.aggressive_memory_decommit" in \
            ls.native["gathered_by"]
        assert t.alive()


def test_mimalloc_stats_match_target():
    exe = build_c("capture_mimalloc.c", "-lmimalloc", "-lpthread")
    with start([exe, "--serve"], allocator="mimalloc") as t:
        # the call itself (a snapshot may read its committed word from memory instead)
        det, ls = live(t.pid, mimalloc_process_info=True)
        assert t.alive()
    p = truth(t.lines)
    rows = ls.native["stats"]["rows"]
    # mi_stats_print rounds to 0.1 of a unit: the parser keeps the bounds.
    cur = rows["committed"]["current"]
    assert cur["min"] <= p["current_commit"] <= cur["max"]
    assert ls.stats["committed"].provenance == "measured" and ls.stats["resident"].value is None
    assert ls.stats["allocated"].provenance == "unknown"      # release build
    # mi_process_info's 8 out-parameters (two passed on the stack); its
    # current_rss is the commit counter on Linux.
    pi = ls.native["process_info"]
    assert pi["current_rss"] == pi["current_commit"] and pi["current_rss_is_commit"]
    assert pi["peak_rss"] >= 1 << 20
    opts = ls.native["options"]
    assert opts["decommit_delay"] == 25 and opts["allow_decommit"] == 1   # 2.0.9 defaults


def run_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), cwd="/", timeout=120, **kw)


def test_inspect_json_carries_live_stats_and_pause():
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        r = run_cli("inspect", "--json", str(t.pid))
        n = run_cli("inspect", "--json", "--no-attach", str(t.pid))
    doc = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert doc["stats"]["allocated"]["provenance"] == "measured"
    assert doc["stats"]["allocated"]["value"] >= 1 << 20
    assert doc["collectors"]["remote"]["ok"] and doc["collectors"]["remote"]["pause_us"] > 0
    assert doc["native"]["mallctl"]["stats.allocated"] == doc["stats"]["allocated"]["value"]
    nd = json.loads(n.stdout)
    # No remote call: nothing the allocator said, only what /proc and the
    # ELF files give (configuration sources, knob defaults).
    assert "remote" not in nd["collectors"]
    assert set(nd["native"]) <= {"config", "knobs"}
    assert all(v["provenance"] == "unknown" for v in nd["stats"].values())


@pytest.mark.parametrize("fixture,kind", [
    ("malloc_info-glibc-2.36.xml", "glibc"), ("malloc_info-glibc-nofast.hand-edited.xml", "glibc"),
    ("jemalloc-5.3.0-stats.json", "jemalloc"), ("tcmalloc-2.10-getstats.txt", "tcmalloc"),
    ("mimalloc-2.0.9-stats.txt", "mimalloc")])
def test_inspect_from_file(fixture, kind):
    r = run_cli("inspect", "--json", "--from", os.path.join(ROOT, "tests", "fixtures", fixture))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["allocator"]["kind"] == kind
    assert any(v["value"] is not None for v in doc["stats"].values())


@pytest.mark.parametrize("fixture", ["malloc_info-glibc-2.36.truncated.xml",
                                     "jemalloc-5.3.0-stats.truncated.json",
                                     "malloc_info-xxe-text.hand-written.xml"])
def test_inspect_from_malformed_file(fixture):
    r = run_cli("inspect", "--from", os.path.join(ROOT, "tests", "fixtures", fixture))
    # the user named a file that is not a stats file: a usage error saying what was expected
    assert r.returncode == 2 and "Traceback" not in r.stderr and "does not parse" in r.stderr


def test_inspect_from_unknown_or_missing_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello\n")
    r = run_cli("inspect", "--from", str(p))
    assert r.returncode == 2 and "not a recognised stats file" in r.stderr
    assert "expected malloc_info XML" in r.stderr
    # a missing file is the user's to fix: a usage error naming it
    r = run_cli("inspect", "--from", str(tmp_path / "nope"))
    assert r.returncode == 2 and f"{tmp_path / 'nope'}: No such file" in r.stderr


def test_many_arenas_xml_via_mmap_leaves_no_mapping():
    # 16 arenas: malloc_info does not fit the stack scratch; the retry uses a
    # private mapping that must be gone when the thread is released.
    from examples import launch
    p = launch.start("arena_sprawl", "glibc")
    try:
        launch.wait_ready(p, 60)
        with open(f"/proc/{p.pid}/maps") as f:
            before = f.read()
        det, ls = live(p.pid)
        with open(f"/proc/{p.pid}/maps") as f:
            after = f.read()
    finally:
        launch.stop(p)
    assert len(ls.native["malloc_info"]["arenas"]) >= 8
    assert sum("XML" in s for s in ls.native["side_effects"]) == 1     # where its buffer was
    assert before == after


@pytest.mark.parametrize("room", ["stack", "none"])
def test_glibc_side_effects_say_where_the_xml_buffer_was(room, monkeypatch):
    """malloc_info's buffer goes on the borrowed thread's stack when its
    room holds it, else into a mapping made and unmapped in the stop: the
    side effects say which, never a mapping that was not made."""
    from collectors.engine import callframe
    if room == "none":      # no stack has that much to spare
        monkeypatch.setattr(callframe.Caller, "STACK_BUFFER_SPARE", 1 << 40)
    mmaps = []
    real_map = callframe.Caller.map_buffer
    monkeypatch.setattr(callframe.Caller, "map_buffer",
                        lambda self, th, n: mmaps.append(n) or real_map(self, th, n))
    exe = build_c("capture_glibc.c", "-lpthread")
    with start([exe, "--serve"]) as t:
        det, ls = live(t.pid)
    said = [s for s in ls.native["side_effects"] if "XML" in s]
    assert len(said) == 1
    if room == "stack":
        assert mmaps == [] and said[0].startswith("the XML written into a ") and \
            "-byte buffer on the borrowed thread's own stack" in said[0]
    else:
        assert len(mmaps) == 1 and said[0] == (f"a {mmaps[0]}-byte anonymous mapping for the "
                                               "XML, unmapped before the thread was released")


def test_google_tcmalloc_entry_points_called():
    # The stand-in executable exports google/tcmalloc's C ABI (no Debian
    # package exists): the property getter takes (name, length, value*) and
    # the stats text is copied out of TCMalloc_Internal_GetStats's buffer.
    exe = build_c("fake_google_tcmalloc.c", name="fake_google_tcmalloc")
    with start([exe]) as t:
        det, ls = live(t.pid)
        assert t.alive()
    assert ls.kind == "tcmalloc-google"
    assert ls.native["properties"] and set(ls.native["properties"].values()) == {0}
    assert ls.native["getstats_text"].startswith("MALLOC:")


def test_glibc_resident_attributed_from_the_heaps_pages(monkeypatch):
    from examples import launch
    from collectors.allocators.glibc import heapmaps
    from collectors.proc.procfs import ProcFS
    p = launch.start("arena_sprawl", "glibc", args=("--live", "600"))
    try:
        launch.wait_ready(p, 60)
        snap, _ = snapshot.take(p.pid)
        # the heaps' pages by pagemap are smaps' Rss of the same mappings,
        # read while the process is stopped (its pages cannot change)
        os.kill(p.pid, signal.SIGSTOP)
        try:
            by_pagemap = heapmaps.heap_resident_by_pagemap(ProcFS(), p.pid)
            by_smaps = heapmaps.glibc_heap_resident(ProcFS(), p.pid)
        finally:
            os.kill(p.pid, signal.SIGCONT)
        # where pagemap cannot tell the zero page apart, smaps is read
        monkeypatch.setattr(heapmaps, "present_caveat", lambda: "; a caveat")
        fallback, _ = snapshot.take(p.pid)
    finally:
        launch.stop(p)
    assert by_pagemap[0] == by_smaps[0] and by_pagemap[1] == by_smaps[1] >= 8
    assert [(m.start, m.end) for m in by_pagemap[2]] == [(m.start, m.end) for m in by_smaps[2]]
    assert fallback.stats["resident"].source.startswith("smaps Rss of [heap]")
    res = snap.stats["resident"]
    assert res.provenance == "derived" and "mmapped chunks" in res.source
    assert res.source.startswith("pagemap present pages of [heap]")
    assert "lower bound" not in res.source          # every mmapped chunk glibc counts was found
    assert snap.native["heap_resident"]["arena_heaps"] >= 8
    # Nearly all of this process's anonymous memory is glibc heaps.
    assert 0.8 * snap.process.rss_anon <= res.value <= snap.process.rss_anon


# -- one native shape per allocator: live, self and file ----------------------------

from collectors import schema

SELF_CODE = """
import json
from collectors.selfstats import snapshot_self
kind, native, stats = snapshot_self()
print(json.dumps({"kind": kind, "native": native}, default=str))
"""

# allocator -> (kind, live target, its link flags, a captured file of the same version)
SHAPES = {
    "glibc": ("glibc", "capture_glibc.c", ("-lpthread",), "malloc_info-glibc-2.36.xml"),
    "jemalloc": ("jemalloc", "capture_jemalloc.c", ("-ljemalloc", "-lpthread"),
                 "jemalloc-5.3.0-stats.json"),
    "tcmalloc": ("tcmalloc", "capture_tcmalloc.c", ("-ltcmalloc", "-lpthread"),
                 "tcmalloc-2.10-getstats.txt"),
    "mimalloc": ("mimalloc", "capture_mimalloc.c", ("-lmimalloc", "-lpthread"),
                 "mimalloc-2.0.9-stats.txt"),
}
# What a saved stats file cannot carry: None there, the same key present.
NOT_IN_FILE = {"mimalloc": {"process_info", "options"}}


def self_native(allocator):
    from targets import preload_path
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    lib = preload_path(allocator)
    if lib:
        env["LD_PRELOAD"] = lib
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SELF_CODE], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def shape(native, depth):
    """Keys of NATIVE down to DEPTH levels (dicts only), collection context
    left out."""
    out = set()

    def walk(node, prefix):
        if len(prefix) == depth or not isinstance(node, dict):
            return
        for k, v in node.items():
            if not prefix and k in schema.CONTEXT_KEYS:
                continue
            out.add(prefix + (k,))
            walk(v, prefix + (k,))
    walk(native, ())
    return out


def undeclared(kind, native):
    """Leaf paths of NATIVE the schema does not declare."""
    return sorted(p for p in schema.paths(native) if schema.lookup(kind, p) is None)


@pytest.mark.parametrize("allocator", sorted(SHAPES))
def test_live_self_and_file_have_the_same_native_keys(allocator):
    from diag import filemode
    kind, source, flags, fixture = SHAPES[allocator]
    exe = build_c(source, *flags)
    with start([exe, "--serve"], allocator=allocator) as t:
        # (mimalloc: with mi_process_info, as in-process; stats_main is None there)
        det, ls = live(t.pid, mimalloc_process_info=True)
        assert t.alive()
    live_doc = json.loads(json.dumps(ls.native, default=str))
    own = self_native(allocator)
    assert own["kind"] == kind == ls.kind
    snap = filemode.snapshot_from_file(os.path.join(ROOT, "tests", "fixtures", fixture))
    file_doc = json.loads(json.dumps(snap.native, default=str))
    # Three levels cover every fixed key (mallinfo2, mallctl and property
    # names, malloc_info/GetStats/mimalloc report sections and rows).
    depth = 3
    assert shape(live_doc, depth) == shape(own["native"], depth)
    missing = NOT_IN_FILE.get(allocator, set())
    for key in missing:
        assert file_doc[key] is None and live_doc[key] is not None
    assert {p for p in shape(file_doc, depth) if p[0] not in missing} == \
        {p for p in shape(live_doc, depth) if p[0] not in missing}
    # Every field of every document is declared once in the schema.
    for doc in (live_doc, own["native"], file_doc):
        assert undeclared(kind, doc) == []


def _stats_print_bytes(pid):
    """Lengths of what a first snapshot's malloc_stats_print writes: JSON
    with the general section, and the table."""
    from collectors import allocators
    image = ProcessImage(pid)
    det = detect(image)
    mod = allocators.module("jemalloc")
    sizes = []
    for form, opts in (("json", {"per_arena": False, "jemalloc_json_general": True}),
                       ("table", {"per_arena": False})):
        mod.forget_general()
        a = mod.plan(livestats.Resolver(image), det.serving, det.allocator, opts)
        rp = livestats.open_remote(image, det, stack_need=mod.STACK_NEED)
        with rp.borrow() as c:
            raw = mod.gather(c, a, opts)
        sizes.append(len(raw[form]))
    return tuple(sizes)


def test_jemalloc_stats_print_output_is_bounded():
    # strcat has no bound: the buffer must hold any output of these options.
    # Per-arena tables are off, so 64 initialised arenas print what 2 do, and
    # the longest strings (prof_prefix up to PATH_MAX, cut at 255 by the
    # emitter) stay inside the bound.
    from collectors.allocators.jemalloc import reader as je
    exe = build_c("many_arenas_je.c", "-lpthread", name="many_arenas_je")
    sizes = {}
    for n, conf in ((2, "narenas:2"), (64, "narenas:64,percpu_arena:disabled"),
                    (65, "narenas:64,percpu_arena:disabled,prof_prefix:/" + "p" * 4000)):
        with start([exe, str(n)], allocator="jemalloc", env={"MALLOC_CONF": conf}) as t:
            sizes[n] = _stats_print_bytes(t.pid)
            det, ls = live(t.pid)
            assert t.alive()
        assert ls.native["mallctl"]["arenas.narenas"] >= min(n, 64)     # + the huge arena
        assert ls.stats["allocated"].value > 0
        # A string the emitter cut leaves the JSON broken: that process is
        # read one mallctl at a time instead (one more stop, this once).
        assert ("malloc_stats_print" in ls.native["gathered_by"]) == (n != 65)
    # the table (a first snapshot's print) is the smaller
    assert all(table < json_ for json_, table in sizes.values())
    sizes = {n: json_ for n, (json_, _) in sizes.items()}
    assert max(sizes.values()) < je.STATS_BOUND < je.STATS_BUF
    # The arena count does not change the size (numbers may get a digit or
    # two; a long string adds at most its 255 printed bytes).
    assert abs(sizes[64] - sizes[2]) < 256 and abs(sizes[65] - sizes[2]) < 2 * je.STATS_STRING_MAX
    print(f"malloc_stats_print {je.STATS_OPTS.decode()}: {sizes[2]} bytes (2 arenas), "
          f"{sizes[64]} (64 arenas), {sizes[65]} (64 arenas, 4 KiB prof_prefix); "
          f"bound {je.STATS_BOUND}")


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc", "tcmalloc", "mimalloc"])
def test_snapshot_native_is_declared_in_the_schema(allocator):
    # What views render (snapshot.native, with config, knobs, the borrowed
    # thread and walks added by diag.snapshot) has a unit for every field.
    with start([build_c("idle.c"), "1"], allocator=allocator) as t:
        snap, col = snapshot.take(t.pid)
    assert col.status["remote"].ok
    doc = json.loads(json.dumps(snap.native, default=str))
    assert undeclared(snap.allocator.kind, doc) == []


def test_jemalloc_first_snapshot_prints_the_table_and_it_says_what_json_says():
    # A first snapshot of a process prints the general section; as a table
    # (no per-size-class arrays) it is the cheaper print of the same values.
    # The snapshots after it print JSON without the general section.
    from collectors.allocators.jemalloc import reader as je
    exe = build_c("capture_jemalloc.c", "-ljemalloc", "-lpthread")
    with start([exe, "--serve"], allocator="jemalloc") as t:
        je.forget_general()
        det, first = live(t.pid)
        det, kept = live(t.pid)
        det, json_ = live(t.pid, jemalloc_full_print=True, jemalloc_json_general=True)
        assert t.alive()
    m = truth(t.lines, "LIVE")
    assert '"dablxeh") (the table' in first.native["gathered_by"]
    assert '"Jgdablxeh") (general section from a print' in kept.native["gathered_by"]
    assert '"Jdablxeh");' in json_.native["gathered_by"]
    assert len(first.pause_us) == len(kept.pause_us) == len(json_.pause_us) == 1
    general = {k: v for k, v in json_.native["mallctl"].items() if not k.startswith("stats.")}
    assert sum(v is not None for v in general.values()) >= 25     # opt.lg_tcache_max: 5.2 only
    assert {k: first.native["mallctl"][k] for k in general} == general
    assert {k: kept.native["mallctl"][k] for k in general} == general
    # the stats of a quiet process: the table's are JSON's, and the target's own
    for name in ("stats.allocated", "stats.active", "stats.arenas.4096.pactive",
                 "stats.arenas.4096.pdirty", "stats.mapped", "stats.retained"):
        assert first.native["mallctl"][name] == json_.native["mallctl"][name], name
    assert first.native["mallctl"]["stats.allocated"] == m["stats.allocated"]
    assert first.native["side_effects"] == json_.native["side_effects"] != []


@pytest.mark.parametrize("conf,said", [(None, True), ("background_thread:true", False)])
def test_jemalloc_snapshot_says_its_print_is_a_decay_event(conf, said):
    # Without the background thread the print's buffer (a malloc and a free)
    # drives jemalloc's decay: the snapshot says so, with it on it does not.
    from collectors.allocators.jemalloc import reader as je
    env = {"MALLOC_CONF": conf} if conf else {}
    with start([build_c("idle.c"), "1"], allocator="jemalloc", env=env) as t:
        det, ls = live(t.pid)
        assert t.alive()
    assert ls.native["mallctl"]["background_thread"] is (not said)
    assert (je.DECAY_EVENTS in ls.native["side_effects"]) is said


def test_jemalloc_table_it_cannot_read_is_printed_again_as_json(monkeypatch):
    # A table this version prints differently: one more stop, JSON, and JSON
    # from then on for that process; the snapshot is whole.
    from collectors.allocators.jemalloc import reader as je
    from collectors.allocators.jemalloc import table
    from diag.model.errors import MalformedData
    seen = []

    def unreadable(text):
        seen.append(text)
        raise MalformedData("jemalloc stats table: line 3 not understood: 'a layout of 5.4'")

    monkeypatch.setattr(table, "parse_stats_table", unreadable)
    exe = build_c("capture_jemalloc.c", "-ljemalloc", "-lpthread")
    with start([exe, "--serve"], allocator="jemalloc") as t:
        je.forget_general()
        det, ls = live(t.pid)
        je.forget_general()
        det, again = live(t.pid)
        assert t.alive()
    assert len(seen) == 1 and b"Begin jemalloc statistics" in seen[0]
    assert len(ls.pause_us) == 2 and len(again.pause_us) == 1
    for doc in (ls, again):
        assert '"Jdablxeh");' in doc.native["gathered_by"]
        assert doc.native["mallctl"]["stats.allocated"] == truth(t.lines, "LIVE")["stats.allocated"]


def test_jemalloc_per_call_fallback_gives_the_same_document():
    # The per-call path (no malloc_stats_print, an unknown version, or JSON
    # the emitter broke) reads the same declared mallctls one by one.
    exe = build_c("capture_jemalloc.c", "-ljemalloc", "-lpthread")
    with start([exe, "--serve"], allocator="jemalloc") as t:
        det, fast = live(t.pid)
        det, slow = live(t.pid, jemalloc_per_call=True)
        assert t.alive()
    m = truth(t.lines, "LIVE")
    assert set(fast.native["mallctl"]) == set(slow.native["mallctl"])
    assert "one call per name" in slow.native["gathered_by"]
    for key in ("stats.allocated", "stats.active", "arenas.page", "arenas.narenas", "version",
                "opt.dirty_decay_ms", "background_thread"):
        assert fast.native["mallctl"][key] == slow.native["mallctl"][key], key
    assert slow.native["mallctl"]["stats.allocated"] == m["stats.allocated"]
    assert slow.native["side_effects"] == []


def test_mimalloc_options_are_read_from_its_option_table_without_calls():
    # 26 mi_option_get calls a snapshot on 2.0 are replaced by one read of
    # mimalloc's own option table (optiontable): the values equal the
    # calls' (the oracle: the same gather with the table not found), every
    # snapshot sees allocdiag's own set at once, and no call is made for
    # them.  Without the table the calls are kept per OPTIONS_REFRESH_S.
    from collectors import allocators
    from diag import cli
    mi = allocators.module("mimalloc")
    mi.forget_options()
    exe = build_c("capture_mimalloc.c", "-lmimalloc", "-lpthread")
    with start([exe, "--serve"], allocator="mimalloc",
               env={"MIMALLOC_EAGER_COMMIT_DELAY": "3"}) as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        rp = livestats.open_remote(image, det, stack_need=mi.STACK_NEED)

        def gather(table=True):
            a = mi.plan(livestats.Resolver(image), det.serving, det.allocator, {})
            if not table:
                a["option_table"] = None
            with rp.borrow() as c:
                raw = mi.gather(c, a, {})
            native = mi.parse(raw, det.allocator)
            return native["options"], rp.last["calls"], native["gathered_by"], a

        by_table, calls_table, how_table, a = gather()
        assert a["option_table"] is not None
        # another version's names (2.1 renamed options) find no table: calls then
        from collectors.allocators.mimalloc import optiontable
        from collectors.engine.memory import MemoryReader
        lib = det.serving
        maps = [(m.start, m.end, m.perms) for m in image.maps if m.path == lib.path]
        with MemoryReader(t.pid) as mem:
            assert optiontable.locate(mem.read, maps, mi.OPTIONS_2_0) == a["option_table"]
            renamed = ("show_errors", "show_stats", "verbose", "eager_commit", "arena_eager_commit")
            assert optiontable.locate(mem.read, maps, renamed) is None
        by_call, calls_call, how_call, _ = gather(table=False)
        assert by_table == by_call and by_table["eager_commit_delay"] == 3
        assert "option table (no call)" in how_table and "option table" not in how_call
        assert calls_call - calls_table == len(mi.OPTIONS_2_0)
        # without the table the calls are kept for their refresh time
        again, calls_again, how_again, _ = gather(table=False)
        assert again == by_call and "options (mi_option_get) read < 10 s ago" in how_again
        assert calls_call - calls_again == len(mi.OPTIONS_2_0)
        assert cli.main(["set", "--yes", str(t.pid),
                         f"decommit_delay={by_table['decommit_delay'] + 7}"]) == 0
        after, calls_after, _, _ = gather()
        assert calls_after == calls_table
        assert after["decommit_delay"] == by_table["decommit_delay"] + 7
        assert t.alive()


@pytest.fixture
def mimalloc_fresh(monkeypatch):
    """The mimalloc module with nothing known of _mi_stats_main (memory and
    disk cache off), the test's spy on the reads made inside a stop."""
    from collectors import allocators
    mi = allocators.module("mimalloc")
    monkeypatch.setenv("ALLOCDIAG_NO_CACHE", "1")
    monkeypatch.setattr(mi.STATS_MAIN, "facts", {})
    return mi, reads_inside_stops(monkeypatch)


def test_mimalloc_snapshot_reads_committed_from_memory_once_checked(mimalloc_fresh):
    # mi_process_info is called only for _mi_stats_main.committed: its
    # address is found in the library's code (statsmain), checked once
    # against the call in the same stop, and from then on the two words are
    # read before the stop.  So: the first stop is four calls (the check:
    # mi_process_info, fmemopen, the print, fclose), the next ones three; the
    # committed bytes equal the target's own mi_process_info (idle target);
    # the option table and the committed word are never read inside a stop;
    # the stream keeps stdio's buffer (no setvbuf).  A wall window's reader
    # still calls mi_process_info (its page faults and CPU are deltas).
    from collectors.allocators.mimalloc import optiontable
    from collectors.engine.memory import MemoryReader
    mi, inside = mimalloc_fresh
    exe = build_c("capture_mimalloc.c", "-lmimalloc", "-lpthread")
    with start([exe, "--serve"], allocator="mimalloc",
               env={"MIMALLOC_EAGER_COMMIT_DELAY": "3"}) as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        reader = livestats.LiveReader(image, det)
        addr, _ = reader.addrs["stats_main"]
        first = reader.collect()
        assert reader.rp.last["calls"] == 4 and first.native["stats_main"] is None
        assert "checked against mi_process_info: the same committed bytes" in \
            first.native["gathered_by"]
        inside.clear()
        second = reader.collect()
        assert reader.rp.last["calls"] == 3 and second.native["process_info"] is None
        table = reader.addrs["option_table"]
        assert inside and table not in inside and \
            not any(addr <= a < addr + 128 for a in inside)     # the print's text only
        want = truth(t.lines)["current_commit"]
        assert first.native["process_info"]["current_commit"] == want
        sm = second.native["stats_main"]
        assert sm["committed"]["current"] == want == second.stats["committed"].value
        assert sm["committed"]["allocated"] - sm["committed"]["freed"] == want
        assert "_mi_stats_main.committed.current" in second.stats["committed"].source
        assert "no mi_process_info call" in second.native["gathered_by"]
        cur = second.native["stats"]["rows"]["committed"]["current"]
        assert cur["min"] <= want <= cur["max"]
        # reserved, the count before it, exact where the text rounds it
        reserved = second.native["stats"]["rows"]["reserved"]["current"]
        assert reserved["min"] <= sm["reserved"]["current"] <= reserved["max"]
        assert sm["reserved"]["allocated"] - sm["reserved"]["freed"] == sm["reserved"]["current"]
        assert second.stats["mapped"].value == sm["reserved"]["current"] >= want
        assert second.stats["mapped"].provenance == "measured"
        # never above the kernel's: the private anonymous mappings of the process
        from collectors.proc.maps import parse_maps
        with open(f"/proc/{t.pid}/maps", "rb") as f:
            anon = sum(m.end - m.start for m in parse_maps(f.read())
                       if m.perms.endswith("p") and not m.inode and m.path is None)
        assert sm["reserved"]["current"] <= anon
        with MemoryReader(t.pid) as mem:
            entries = optiontable.values(
                mem.read(table, len(mi.OPTIONS_2_0) * optiontable.DESC.size),
                len(mi.OPTIONS_2_0))
        assert list(second.native["options"].values()) == [v for v, _ in entries]
        assert second.native["options"]["eager_commit_delay"] == 3
        assert any("stdio buffer" in e for e in second.native["side_effects"])
        walled = livestats.collect(image, det, mimalloc_process_info=True)
        assert walled.native["process_info"]["current_commit"] == want
        assert walled.native["stats_main"] is None
        assert t.alive()


def test_mimalloc_committed_address_that_disagrees_is_not_used(mimalloc_fresh):
    # An address that is not _mi_stats_main's committed counter (here:
    # the counter before it, as a wrong layout would give) fails the check
    # in every stop; after
    # STATS_MAIN_DISAGREE_MAX stops it is dropped, and every snapshot calls
    # mi_process_info, whose value is the one shown.
    from collectors.allocators.mimalloc import statsmain
    mi, _ = mimalloc_fresh
    exe = build_c("capture_mimalloc.c", "-lmimalloc", "-lpthread")
    real = mi._find_stats_main

    def another_counter(obj):
        # the counter before committed in mi_stats_t (reserved): a wrong layout
        vaddr, found_by = real(obj)
        return vaddr - statsmain.COUNT.size, found_by

    with start([exe, "--serve"], allocator="mimalloc") as t:
        image = ProcessImage(t.pid)
        det = detect(image)
        want = truth(t.lines)["current_commit"]
        import unittest.mock
        with unittest.mock.patch.object(mi, "_find_stats_main", another_counter):
            for i in range(mi.STATS_MAIN_DISAGREE_MAX):
                ls = livestats.collect(image, det)
                assert "different (not used)" in ls.native["gathered_by"]
                assert ls.native["stats_main"] is None
            last = livestats.LiveReader(image, det)
            assert last.addrs["stats_main"] is None
            ls = last.collect()
        assert last.rp.last["calls"] == 4 and ls.native["stats_main"] is None
        assert ls.stats["committed"].value == want
        assert "mi_process_info" in ls.stats["committed"].source
        assert t.alive()


def _inspect(pid, *extra):
    r = subprocess.run([sys.executable, "-m", "diag", "-v", "inspect", "--json", *extra, str(pid)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    calls = [int(line.split(" for ")[1].split()[0]) for line in r.stderr.splitlines()
             if "borrowed: stopped" in line]
    return doc, calls


def test_mimalloc_check_of_its_committed_word_is_kept_on_disk_for_the_next_cli_run(tmp_path):
    # The first `allocdiag inspect` of a mimalloc process checks where
    # _mi_stats_main lies (four calls); the detection cache keeps the
    # verdict with the library's file identity, so the next run reads the
    # committed word from memory (three calls) and shows the same bytes;
    # --no-cache checks again.
    exe = build_c("capture_mimalloc.c", "-lmimalloc", "-lpthread")
    old = os.environ.get("XDG_CACHE_HOME")
    no_cache = os.environ.pop("ALLOCDIAG_NO_CACHE", None)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path)
    try:
        with start([exe, "--serve"], allocator="mimalloc") as t:
            first, calls_first = _inspect(t.pid)
            again, calls_again = _inspect(t.pid)
            os.environ["ALLOCDIAG_NO_CACHE"] = "1"         # what --no-cache sets
            nocache, calls_nocache = _inspect(t.pid)
            want = truth(t.lines)["current_commit"]
    finally:
        os.environ.pop("ALLOCDIAG_NO_CACHE", None)
        if no_cache is not None:
            os.environ["ALLOCDIAG_NO_CACHE"] = no_cache
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old
    assert calls_first == [4] and calls_again == [3] and calls_nocache == [4]
    assert "checked against mi_process_info: the same" in first["native"]["gathered_by"]
    assert "no mi_process_info call" in again["native"]["gathered_by"]
    assert "checked against" in nocache["native"]["gathered_by"]
    for doc in (first, again, nocache):
        assert doc["stats"]["committed"]["value"] == want
    assert again["native"]["stats_main"]["committed"]["current"] == want


@pytest.mark.parametrize("allocator, kept_note, calls_saved", [
    ("jemalloc", "general section from a print < 10 s ago", 0),
    # (both knobs are read from memory: the first run checks where the
    # decommit switch lies, one call, and the detection cache keeps that)
    ("tcmalloc", "aggressive_memory_decommit read from memory", 1),
])
def test_the_next_cli_run_reuses_values_kept_on_disk_until_a_set(allocator, kept_note, calls_saved,
                                                                   tmp_path):
    # A second `allocdiag inspect` within the values' lifetime takes them
    # from the disk entry the first run left (one call: its stop is a
    # recording's), says so in gathered_by, and reads the same values; after
    # allocdiag's own `set` the next run reads them again.
    env_cache = {"XDG_CACHE_HOME": str(tmp_path)}
    old = {k: os.environ.get(k) for k in env_cache}
    os.environ.update(env_cache)
    try:
        with start([build_c("idle.c"), "1"], allocator=allocator) as t:
            first, calls_first = _inspect(t.pid)
            again, calls_again = _inspect(t.pid)
            native_first = first["native"]
            native_again = again["native"]
            assert kept_note not in native_first["gathered_by"]
            assert kept_note in native_again["gathered_by"]
            assert calls_first[0] - calls_again[0] == calls_saved
            assert any(n.startswith("proc-") for n in os.listdir(tmp_path / "allocdiag"))
            if allocator == "jemalloc":
                for k in ("opt.dirty_decay_ms", "arenas.page", "version", "opt.narenas"):
                    assert native_again["mallctl"][k] == native_first["mallctl"][k], k
                r = subprocess.run([sys.executable, "-m", "diag", "set", "--yes", str(t.pid),
                                    "dirty_decay_ms=4321"], capture_output=True, text=True,
                                   timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
                assert r.returncode == 0, r.stderr
                after, _ = _inspect(t.pid)
                assert kept_note not in after["native"]["gathered_by"]
                assert after["native"]["mallctl"]["arenas.dirty_decay_ms"] == 4321
            else:
                assert native_again["properties"] == native_first["properties"]
                r = subprocess.run([sys.executable, "-m", "diag", "--no-cache", "inspect",
                                    "--json", str(t.pid)], capture_output=True, text=True,
                                   timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
                assert kept_note not in json.loads(r.stdout)["native"]["gathered_by"]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_kept_values_touch_the_disk_only_outside_the_stop(monkeypatch, tmp_path):
    # Files are read before the borrow and written after it, never while
    # the target's thread is stopped.
    from collectors.binary import diskcache
    from collectors.engine import callframe, tracee
    from collectors.allocators.jemalloc import reader as je
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    diskcache.reset()
    je.forget_general()
    stopped, seen = [], []
    orig_stop, orig_release = tracee.Tracer.stop, callframe.Caller.release

    def stop(self, *a, **k):
        th = orig_stop(self, *a, **k)
        stopped.append(th.tid)
        return th

    def release(self, th):
        try:
            return orig_release(self, th)
        finally:
            stopped.remove(th.tid)

    for name in ("load_process", "store_process"):
        orig = getattr(diskcache, name)
        monkeypatch.setattr(diskcache, name, lambda *a, _o=orig, _n=name: (
            seen.append((_n, tuple(stopped))), _o(*a))[1])
    monkeypatch.setattr(tracee.Tracer, "stop", stop)
    monkeypatch.setattr(callframe.Caller, "release", release)
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        live(t.pid)
        je._general.clear()
        live(t.pid)
    assert ("store_process", ()) in seen and ("load_process", ()) in seen
    assert all(during == () for _, during in seen), seen
    diskcache.reset()
