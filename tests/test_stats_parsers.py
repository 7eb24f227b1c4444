"""Allocator stats parsers: captured fixtures, broken input, and ground truth
from real targets that print their own numbers next to their stats output."""

import json
import os
import re
import struct

import pytest

from diag.model.errors import MalformedData
from collectors.allocators.glibc import stats as glibc_stats
from collectors.allocators.jemalloc import stats as jemalloc_stats
from collectors.allocators import tcmalloc_stats
from collectors.allocators.mimalloc import stats as mimalloc_stats
from diag.fields import STATS_FIELDS
from diag.model import DERIVED, MEASURED, UNKNOWN
import targets

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture(name, mode="r"):
    with open(os.path.join(FIX, name), mode) as f:
        return f.read()


def sidecar(name):
    """name value lines -> {name: int}."""
    out = {}
    for line in fixture(name).splitlines():
        key, val = line.split()
        out[key] = int(val)
    return out


def section(lines, name):
    begin, end = f"=== BEGIN {name}", f"=== END {name}"
    i = lines.index(begin)
    j = lines.index(end, i)
    return "\n".join(lines[i + 1:j]) + "\n"


def truth(lines):
    return {l.split()[1]: int(l.split()[2]) for l in lines if l.startswith("TRUTH ")}


def assert_all_fields(stats):
    assert set(stats) == set(STATS_FIELDS)
    for name, v in stats.items():
        assert v.provenance in (MEASURED, DERIVED, UNKNOWN), name
        assert (v.value is None) == (v.provenance == UNKNOWN), name
        if v.provenance != UNKNOWN:
            assert v.source, name


# ============================================================== glibc

def test_glibc_xml_exact_values():
    d = glibc_stats.parse_malloc_info(fixture("malloc_info-glibc-2.36.xml", "rb"))
    assert d["version"] == "1" and d["has_fast"] is True
    assert [a["nr"] for a in d["arenas"]] == [0, 1]
    main, second = d["arenas"]
    assert main["sizes"][0] == {"from": 17, "to": 32, "total": 1056, "count": 33,
                                "kind": "fast", "flag_bytes": 0}
    assert main["sizes"][1]["kind"] == "bin" and main["sizes"][1]["total"] == 9009
    assert main["unsorted"]["total"] == 2721 and main["unsorted"]["kind"] == "unsorted"
    assert main["fast"] == {"count": 33, "size": 1056}
    assert main["rest"] == {"count": 4, "size": 212963}
    assert main["flag_bytes"] == 3                       # 3 bin chunks with PREV_INUSE
    assert main["system"] == {"current": 319488, "max": 319488}
    assert "subheaps" not in main["aspace"]
    assert second["aspace"]["subheaps"] == 1
    assert second["flag_bytes"] == 9
    t = d["totals"]
    assert t["fast"] == {"count": 33, "size": 1056}
    assert t["rest"] == {"count": 14, "size": 321260}
    assert t["mmap"] == {"count": 2, "size": 4202496}
    assert t["system"] == {"current": 454656, "max": 454656}
    assert t["aspace"] == {"total": 454656, "mprotect": 454656}


def test_glibc_xml_matches_mallinfo2():
    """int_mallinfo and __malloc_info walk the same lists: after removing
    the flag bits __malloc_info adds, the XML reproduces mallinfo2 exactly."""
    d = glibc_stats.parse_malloc_info(fixture("malloc_info-glibc-2.36.xml", "rb"))
    m = sidecar("malloc_info-glibc-2.36.mallinfo2.txt")
    t = d["totals"]
    assert t["system"]["current"] == m["arena"]
    assert t["fast"]["size"] == m["fsmblks"] and t["fast"]["count"] == m["smblks"]
    assert t["rest"]["count"] == m["ordblks"]
    assert t["mmap"]["count"] == m["hblks"] and t["mmap"]["size"] == m["hblkhd"]
    assert sum(a["free_bytes"] for a in d["arenas"]) == m["fordblks"]
    from_xml = glibc_stats.normalise_glibc(d)
    from_mi = glibc_stats.normalise_glibc(None, m)
    assert from_xml["allocated"].value == m["uordblks"] + m["hblkhd"] == 4334848
    for name in STATS_FIELDS:
        assert from_xml[name].value == from_mi[name].value, name
    assert_all_fields(from_xml)
    assert from_mi["allocated"].provenance == DERIVED
    assert "uordblks + hblkhd" in from_mi["allocated"].source
    assert from_xml["active"].value == 4334848 + 1056
    assert from_xml["mapped"].value == 454656 + 4202496
    assert from_xml["resident"].provenance == UNKNOWN


def test_glibc_prefers_mallinfo2_when_given():
    d = glibc_stats.parse_malloc_info(fixture("malloc_info-glibc-2.36.xml", "rb"))
    m = dict(sidecar("malloc_info-glibc-2.36.mallinfo2.txt"), uordblks=1000, hblkhd=24)
    assert glibc_stats.normalise_glibc(d, m)["allocated"].value == 1024


def test_glibc_newer_format_without_fast():
    d = glibc_stats.parse_malloc_info(fixture("malloc_info-glibc-nofast.hand-edited.xml", "rb"))
    assert d["has_fast"] is False
    assert d["totals"]["fast"] is None and all(a["fast"] is None for a in d["arenas"])
    assert all(r["kind"] != "fast" for a in d["arenas"] for r in a["sizes"])
    s = glibc_stats.normalise_glibc(d)
    # no fastbins: allocated == active == system - (rest - flags) + mmap
    assert s["allocated"].value == s["active"].value == 454656 - (321260 - 12) + 4202496
    assert "fast" not in s["allocated"].source


def test_mallinfo2_struct():
    assert glibc_stats.MALLINFO2_SIZE == 80 and len(glibc_stats.MALLINFO2_FIELDS) == 10
    raw = struct.pack("=10Q", *range(1, 11))
    d = glibc_stats.parse_mallinfo2(raw)
    assert d["arena"] == 1 and d["hblkhd"] == 5 and d["uordblks"] == 8 and d["keepcost"] == 10
    with pytest.raises(MalformedData, match="80 bytes"):
        glibc_stats.parse_mallinfo2(raw[:40])
    with pytest.raises(MalformedData):
        glibc_stats.parse_mallinfo2("not bytes")


@pytest.mark.parametrize("name,match", [
    ("malloc_info-glibc-2.36.truncated.xml", "not well-formed"),
    ("malloc_info-bad-number.hand-written.xml", "not an integer"),
])
def test_glibc_malformed_fixtures(name, match):
    with pytest.raises(MalformedData, match=match):
        glibc_stats.parse_malloc_info(fixture(name, "rb"))


@pytest.mark.parametrize("data,match", [
    (b"", "empty"),
    (b"   \n", "empty"),
    (b"garbage <<<", "not well-formed"),
    (b"<jemalloc/>", "expected <malloc>"),
    (b'<malloc version="1"></malloc>', "no <heap>"),
    (b'<malloc version="1"><heap nr="0"><sizes/></heap></malloc>', 'type="rest"'),
    (b'<malloc version="1"><heap><sizes/></heap></malloc>', "nr="),
])
def test_glibc_malformed_inline(data, match):
    with pytest.raises(MalformedData, match=match):
        glibc_stats.parse_malloc_info(data)


def test_glibc_truncated_at_every_point_never_leaks_a_traceback():
    xml = fixture("malloc_info-glibc-2.36.xml", "rb")
    for cut in range(0, len(xml) - 12, 37):
        with pytest.raises(MalformedData):
            glibc_stats.parse_malloc_info(xml[:cut])


@pytest.mark.parametrize("name", ["malloc_info-xxe-attribute.hand-written.xml",
                                  "malloc_info-xxe-text.hand-written.xml"])
def test_glibc_xxe_not_resolved(name):
    secret = open("/etc/hostname").read().strip() if os.path.exists("/etc/hostname") else None
    with pytest.raises(MalformedData) as exc:
        glibc_stats.parse_malloc_info(fixture(name, "rb"))
    if secret:
        assert secret not in str(exc.value)


def test_glibc_internal_entity_not_expanded():
    xml = (b'<?xml version="1.0"?><!DOCTYPE malloc [<!ENTITY big "12345">]>'
           b'<malloc version="1"></malloc>')
    with pytest.raises(MalformedData, match="DOCTYPE"):
        glibc_stats.parse_malloc_info(xml)


# ============================================================== jemalloc

def test_jemalloc_json_exact_values_merged():
    d = jemalloc_stats.parse_stats_json(fixture("jemalloc-5.3.0-stats.json"))
    assert d["version"] == "5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c"
    assert set(d["arenas_stats"]) == {"merged", "0", "1"}
    assert d["merged_from"] == "stats.arenas.merged"
    assert d["stats"]["allocated"] == 11047488
    assert d["arenas_stats"]["0"]["pdirty"] == 996 and d["arenas_stats"]["1"]["pdirty"] == 258
    mc = d["mallctl"]
    assert mc["stats.arenas.4096.pdirty"] == 1254
    assert mc["arenas.page"] == 4096 and mc["opt.muzzy_decay_ms"] == 0


def test_jemalloc_json_equals_mallctl_truth():
    for name in ("jemalloc-5.3.0-stats", "jemalloc-5.3.0-stats-one-arena"):
        d = jemalloc_stats.parse_stats_json(fixture(name + ".json"))
        t = sidecar(name + ".mallctl.txt")
        for key, val in t.items():
            assert d["mallctl"][key] == val, (name, key)


def test_jemalloc_one_arena_shape_sums_per_arena():
    d = jemalloc_stats.parse_stats_json(fixture("jemalloc-5.3.0-stats-one-arena.json"))
    assert set(d["arenas_stats"]) == {"0"}
    assert "one arena" in d["merged_from"]
    s = jemalloc_stats.normalise_jemalloc(d)
    assert s["dirty"].value == 1004 * 4096
    assert "one arena" in s["dirty"].source


def test_jemalloc_normalise_same_from_json_and_mallctl():
    d = jemalloc_stats.parse_stats_json(fixture("jemalloc-5.3.0-stats.json"))
    from_json = jemalloc_stats.normalise_jemalloc(d)
    from_doc = jemalloc_stats.normalise_jemalloc(json.loads(fixture("jemalloc-5.3.0-stats.json")))
    from_mallctl = jemalloc_stats.normalise_jemalloc(sidecar("jemalloc-5.3.0-stats.mallctl.txt"))
    for name in STATS_FIELDS:
        assert from_json[name].value == from_mallctl[name].value == from_doc[name].value, name
        assert from_json[name].provenance == from_mallctl[name].provenance, name
    assert_all_fields(from_mallctl)
    s = from_mallctl
    assert s["allocated"].value == 11047488 and s["allocated"].provenance == MEASURED
    assert s["dirty"].value == 1254 * 4096 and s["dirty"].provenance == DERIVED
    assert s["muzzy"].value == 0
    assert s["allocated"].value <= s["active"].value <= s["resident"].value


def test_jemalloc_mallctl_table():
    from collectors.allocators.jemalloc import reader as jemalloc
    t = {name: ctype for name, ctype, _, _ in jemalloc.MALLCTLS}
    assert len(t) == len(jemalloc.MALLCTLS)          # each name declared once
    assert t["version"] == "const char*"
    assert t["stats.arenas.4096.pdirty"] == "size_t"
    assert t["opt.dirty_decay_ms"] == "ssize_t" and t["arenas.narenas"] == "unsigned"
    assert t["opt.background_thread"] == "bool"


@pytest.mark.parametrize("text,match", [
    (None, "truncated"),
    ("", "empty"),
    ("[1, 2]", "jemalloc"),
    ('{"tcmalloc": {}}', "jemalloc"),
    ('{"jemalloc": {"version": "5.3.0"}}', "stats"),
    ('{"jemalloc": {"stats": {"allocated": -1}}}', "stats.allocated"),
    ('{"jemalloc": {"stats": {"allocated": "12"}}}', "stats.allocated"),
])
def test_jemalloc_malformed(text, match):
    if text is None:
        text = fixture("jemalloc-5.3.0-stats.truncated.json")
    with pytest.raises(MalformedData, match=match):
        jemalloc_stats.parse_stats_json(text)


def _section(text, name):
    return text.split(f"=== BEGIN {name}\n", 1)[1].split(f"=== END {name}\n", 1)[0]


def test_jemalloc_table_reads_what_json_says():
    # capture_jemalloc --table: "Jdablxeh" and then "dablxeh" of the same
    # quiet moment, two arenas; the table (a first snapshot's print) gives
    # every value JSON does, under the same names.
    from collectors.allocators.jemalloc import reader as jemalloc
    from collectors.allocators.jemalloc import table
    text = fixture("jemalloc-5.3.0-stats.dablxeh.txt")
    js = jemalloc_stats.parse_stats_json(_section(text, "jemalloc_stats_json_dablxeh"))
    tb = jemalloc_stats.checked(table.parse_stats_table(
        _section(text, "jemalloc_stats_table_dablxeh")), "table")
    names = [n for n, _, _, _ in jemalloc.MALLCTLS]
    assert jemalloc_stats.mallctls(tb, names) == jemalloc_stats.mallctls(js, names)
    assert len(jemalloc_stats.mallctls(tb, names)) >= 55
    for key in ("version", "config", "opt", "arenas", "stats", "merged_from"):
        assert tb[key] == js[key], key
    # between the two prints one more print ran: its 64 KiB output buffer is
    # one more large allocation and free in the cumulative counters
    merged_t, merged_j = tb["arenas_stats"]["merged"], js["arenas_stats"]["merged"]
    assert {k: v for k, v in merged_t.items() if k != "large"} == \
        {k: v for k, v in merged_j.items() if k != "large"}
    assert merged_t["large"] == dict(merged_j["large"], **{
        k: merged_j["large"][k] + 1 for k in ("nmalloc", "ndalloc", "nrequests", "nfills")})
    assert tb["mallctl"]["stats.arenas.4096.pdirty"] > 0 and tb["arenas"]["narenas"] >= 2
    assert tb["opt"]["dirty_decay_ms"] == 10000 and tb["opt"]["dss"] == "secondary"


@pytest.mark.parametrize("cut,error,match", [
    (lambda t: t[:len(t) // 2], "MalformedData", "begin or end"),
    (lambda t: t.replace("Page size: 4096", "Page size: four"), "MalformedData", "Page size"),
    (lambda t: t.replace("Arenas:", "Arenae:"), "MalformedData", "Arenae"),
    (lambda t: t.replace("dirty:   N/A", "dirty:"), "MalformedData", "dirty"),
    (lambda t: t.replace('opt.dss: "secondary"', 'opt.dss: "second'), "CutString", "cut at 255"),
    (lambda t: re.sub(r"^active:(\s+)(\d+)$", lambda m: f"active:{m[1]}{int(m[2]) + 1}", t,
                      flags=re.M), "MalformedData", "whole number"),
])
def test_jemalloc_table_malformed(cut, error, match):
    from collectors.allocators.jemalloc import table
    text = cut(_section(fixture("jemalloc-5.3.0-stats.dablxeh.txt"),
                        "jemalloc_stats_table_dablxeh"))
    with pytest.raises(MalformedData, match=match) as info:
        jemalloc_stats.checked(table.parse_stats_table(text), "table")
    assert type(info.value).__name__ == error


def test_jemalloc_missing_values_are_unknown():
    s = jemalloc_stats.normalise_jemalloc({"stats.allocated": 10})
    assert s["allocated"].value == 10
    assert s["dirty"].provenance == UNKNOWN and s["mapped"].provenance == UNKNOWN


# ============================================================== tcmalloc

def test_tcmalloc_getstats_exact_values():
    s = tcmalloc_stats.parse_getstats(fixture("tcmalloc-2.10-getstats.txt"))
    assert s["flavor"] == "gperftools"
    sm = s["summary"]
    assert sm["bytes_in_use_by_app"] == 5638536
    assert sm["bytes_in_page_heap_freelist"] == 5242880
    assert sm["bytes_in_central_cache_freelist"] == 212472
    assert sm["bytes_in_transfer_cache_freelist"] == 0
    assert sm["bytes_in_thread_cache_freelists"] == 39040
    assert sm["bytes_in_malloc_metadata"] == 2621440
    assert sm["actual_memory_used"] == 13754368
    assert sm["bytes_released_to_os"] == 401408
    assert sm["virtual_address_space_used"] == 14155776
    assert sm["spans_in_use"] == 83 and sm["tcmalloc_page_size"] == 8192
    assert s["size_classes"][0] == {"class": 1, "size": 8, "objects": 1013, "bytes": 8104}
    assert len(s["size_classes"]) == 31
    assert s["pageheap"]["sizes"] == 2 and s["pageheap"]["spans"][1]["spans"] == 5


def test_tcmalloc_properties_match_getstats():
    """Relations from gperftools tcmalloc.cc, checked on the real 2.10."""
    s = tcmalloc_stats.parse_getstats(fixture("tcmalloc-2.10-getstats.txt"))["summary"]
    p = sidecar("tcmalloc-2.10-properties.txt")
    assert p["generic.current_allocated_bytes"] == s["bytes_in_use_by_app"]
    assert p["generic.total_physical_bytes"] == s["actual_memory_used"]
    assert p["tcmalloc.pageheap_unmapped_bytes"] == s["bytes_released_to_os"]
    assert p["tcmalloc.pageheap_free_bytes"] == s["bytes_in_page_heap_freelist"]
    # heap_size INCLUDES unmapped bytes and excludes metadata:
    assert p["generic.heap_size"] == s["virtual_address_space_used"] - s["bytes_in_malloc_metadata"]


def test_tcmalloc_normalise():
    stats = tcmalloc_stats.parse_getstats(fixture("tcmalloc-2.10-getstats.txt"))
    props = sidecar("tcmalloc-2.10-properties.txt")
    both = tcmalloc_stats.normalise_tcmalloc(props, stats)
    only_props = tcmalloc_stats.normalise_tcmalloc(props)
    only_stats = tcmalloc_stats.normalise_tcmalloc(None, stats)
    for name in STATS_FIELDS:
        assert both[name].value == only_props[name].value == only_stats[name].value, name
    assert_all_fields(both)
    assert both["allocated"].value == 5638536 and both["allocated"].provenance == MEASURED
    assert both["active"].value == 5638536 + 212472 + 0 + 39040
    assert both["resident"].value == 13754368
    assert both["mapped"].value == 11534336 - 401408 + 2621440
    assert both["retained"].value == 401408
    assert both["metadata"].value == 2621440
    assert only_props["metadata"].provenance == DERIVED
    assert both["dirty"].value == 5242880
    assert both["muzzy"].provenance == UNKNOWN


def test_tcmalloc_google_flavor():
    props = {"generic.current_allocated_bytes": 1000, "generic.heap_size": 5000,
             "generic.physical_memory_used": 7000, "tcmalloc.metadata_bytes": 900,
             "tcmalloc.pageheap_free_bytes": 800, "tcmalloc.pageheap_unmapped_bytes": 4000}
    s = tcmalloc_stats.normalise_tcmalloc(props)
    assert s["active"].value == 4200          # heap_size already excludes unmapped
    assert s["resident"].value == s["mapped"].value == 7000
    assert s["metadata"].value == 900 and s["retained"].value == 4000
    google_text = fixture("tcmalloc-2.10-getstats.txt").replace(
        "MALLOC: +            0 (    0.0 MiB) Bytes in transfer cache freelist",
        "MALLOC: +            0 (    0.0 MiB) Bytes in per-CPU cache freelist\n"
        "MALLOC: +            0 (    0.0 MiB) Bytes in transfer cache freelist")
    assert tcmalloc_stats.parse_getstats(google_text)["flavor"] == "google"


@pytest.mark.parametrize("edit,match", [
    (lambda t: fixture("tcmalloc-2.10-getstats.truncated.txt"), "truncated"),
    (lambda t: "", "Bytes in use by application"),
    (lambda t: "hello\nworld\n", "Bytes in use by application"),
    (lambda t: t.replace("5638536", "5638537", 1), "sum"),
    (lambda t: t.replace("MALLOC: +       212472", "MALLOC: + 21x2472", 1), "cannot parse"),
])
def test_tcmalloc_malformed(edit, match):
    text = edit(fixture("tcmalloc-2.10-getstats.txt"))
    with pytest.raises(MalformedData, match=match):
        tcmalloc_stats.parse_getstats(text)


def test_tcmalloc_bad_property_value():
    with pytest.raises(MalformedData):
        tcmalloc_stats.normalise_tcmalloc({"generic.heap_size": -3})


# ============================================================== mimalloc

def test_mimalloc_text_exact_values():
    d = mimalloc_stats.parse_stats_text(fixture("mimalloc-2.0.9-stats.txt"))
    assert d["columns"] == ["peak", "total", "freed", "current", "unit", "count"]
    c = d["rows"]["committed"]["current"]
    assert c["text"] == "34.0 MiB"
    assert (c["min"], c["max"]) == (340 * 104857, 341 * 104857 - 1)
    assert d["rows"]["committed"]["freed"]["text"] == "64.2 KiB"
    assert d["rows"]["committed"]["freed"]["min"] == 642 * 102
    assert d["rows"]["reserved"]["current"]["text"] == "64.0 MiB"
    assert d["rows"]["touched"]["current"]["text"] == "-5.9 MiB"      # release builds!
    assert d["rows"]["touched"]["current"]["max"] < 0
    assert d["rows"]["segments"]["current"]["value"] == 1
    assert d["rows"]["pages-abandoned"]["peak"]["value"] == 0       # qualified name
    assert d["counters"]["commits"]["value"] == 3
    assert d["numa_nodes"] == 1 and d["elapsed_s"] == 0.011
    assert d["process"]["system_s"] == 0.012 and d["process"]["peak_rss"]["text"] == "20.6 MiB"
    assert d["tracks_allocations"] is False


def test_mimalloc_text_bounds_contain_process_info_truth():
    d = mimalloc_stats.parse_stats_text(fixture("mimalloc-2.0.9-stats.txt"))
    t = sidecar("mimalloc-2.0.9-process_info.txt")
    cur = d["rows"]["committed"]["current"]
    assert cur["min"] <= t["current_commit"] <= cur["max"]
    pk = d["process"]["peak_commit"]
    assert pk["min"] <= t["peak_commit"] <= pk["max"]
    rss = d["process"]["peak_rss"]
    assert rss["min"] <= t["peak_rss"] <= rss["max"]
    assert t["current_rss"] == t["current_commit"]      # the Linux gotcha


def test_mimalloc_normalise_text_and_process_info():
    d = mimalloc_stats.parse_stats_text(fixture("mimalloc-2.0.9-stats.txt"))
    t = sidecar("mimalloc-2.0.9-process_info.txt")
    pi = mimalloc_stats.process_info_dict([0, 0, 0, t["current_rss"], t["peak_rss"],
                                           t["current_commit"], t["peak_commit"], 0])
    s = mimalloc_stats.normalise_mimalloc(d, pi)
    assert_all_fields(s)
    assert s["allocated"].provenance == UNKNOWN          # release build
    # committed is its own field; resident is measured from the segments'
    # pages (diag.snapshot), never the committed counter.
    assert s["committed"].value == t["current_commit"] == 35659776
    assert "current_commit" in s["committed"].source and "current_rss" in s["committed"].source
    assert s["resident"].value is None
    assert s["mapped"].value == 640 * 104857
    text_only = mimalloc_stats.normalise_mimalloc(d)
    assert text_only["committed"].value == 340 * 104857
    assert "34.0 MiB" in text_only["committed"].source and text_only["resident"].value is None


def test_mimalloc_json_synthetic_shape():
    d = mimalloc_stats.parse_stats_json(fixture("mimalloc-2.4-stats.SYNTHETIC.json"))
    assert d["stat_version"] == 4 and d["mimalloc_version"] == 20401
    assert d["counts"]["committed"] == {"total": 35725312, "peak": 35725312, "current": 35659776}
    assert d["counters"]["purged"] == 65536 and len(d["malloc_bins"]) == 74
    assert d["tracks_allocations"] is True
    s = mimalloc_stats.normalise_mimalloc(d)
    assert s["allocated"].value == 1638400 + 12582912
    assert s["mapped"].value == 67108864 and s["committed"].value == 35659776
    assert s["resident"].value is None
    # an older printer used "version" instead of "stat_version"
    doc = json.loads(fixture("mimalloc-2.4-stats.SYNTHETIC.json"))
    doc["version"] = doc.pop("stat_version")
    for k in ("malloc_normal", "malloc_huge"):
        doc[k] = {"total": 0, "peak": 0, "current": 0}
    doc["malloc_bins"] = [{"total": 0, "peak": 0, "current": 0}]
    d2 = mimalloc_stats.parse_stats_json(json.dumps(doc))
    assert d2["stat_version"] == 4 and d2["tracks_allocations"] is False
    assert mimalloc_stats.normalise_mimalloc(d2)["allocated"].provenance == UNKNOWN


@pytest.mark.parametrize("text,match", [
    (None, "truncated"),
    ("", "header"),
    ("hello world\n", "header"),
    ("  reserved:   64.0 MiB   64.0 MiB      0       64.0 MiB\n", "header"),
])
def test_mimalloc_text_malformed(text, match):
    if text is None:
        text = fixture("mimalloc-2.0.9-stats.truncated.txt")
    with pytest.raises(MalformedData, match=match):
        mimalloc_stats.parse_stats_text(text)


@pytest.mark.parametrize("text,match", [
    ("", "empty"), ('{"version": 4', "truncated"), ("[]", "mimalloc_version"),
    ('{"mimalloc_version": 1, "process": {}}', "reserved"),
])
def test_mimalloc_json_malformed(text, match):
    with pytest.raises(MalformedData, match=match):
        mimalloc_stats.parse_stats_json(text)


# ============================================================== ground truth

LIB = {"jemalloc": "-ljemalloc", "tcmalloc": "-ltcmalloc", "tcmalloc_minimal": "-ltcmalloc_minimal",
       "mimalloc": "-lmimalloc"}


def test_ground_truth_glibc():
    exe = targets.build_c("capture_glibc.c", "-lpthread")
    with targets.start([exe, "--serve"], allocator="glibc") as t:
        xml = section(t.lines, "malloc_info").encode()
        m = truth(t.lines)
    d = glibc_stats.parse_malloc_info(xml)
    tot = d["totals"]
    assert tot["system"]["current"] == m["arena"]
    assert tot["fast"]["size"] == m["fsmblks"] and tot["fast"]["count"] == m["smblks"]
    assert tot["rest"]["count"] == m["ordblks"]
    assert tot["mmap"] == {"count": m["hblks"], "size": m["hblkhd"]}
    assert sum(a["free_bytes"] for a in d["arenas"]) == m["fordblks"]
    s = glibc_stats.normalise_glibc(d)
    assert s["allocated"].value == m["uordblks"] + m["hblkhd"]
    assert s["active"].value == m["uordblks"] + m["fsmblks"] + m["hblkhd"]
    assert s["mapped"].value == m["arena"] + m["hblkhd"]
    assert s["dirty"].value == m["fordblks"] - m["fsmblks"]
    assert m["hblkhd"] >= 4 << 20 and len(d["arenas"]) >= 2 and tot["fast"]["count"] > 0


def test_ground_truth_jemalloc():
    exe = targets.build_c("capture_jemalloc.c", LIB["jemalloc"], "-lpthread")
    with targets.start([exe, "--serve"], allocator="jemalloc") as t:
        text = section(t.lines, "jemalloc_stats_json")
        m = truth(t.lines)
    d = jemalloc_stats.parse_stats_json(text)
    for key, val in m.items():
        assert d["mallctl"][key] == val, key
    s = jemalloc_stats.normalise_jemalloc(d)
    assert s["allocated"].value == m["stats.allocated"] > 5 << 20
    assert s["dirty"].value == m["stats.arenas.4096.pdirty"] * m["arenas.page"]


@pytest.mark.parametrize("allocator", ["tcmalloc", "tcmalloc_minimal"])
def test_ground_truth_tcmalloc(allocator):
    exe = targets.build_c("capture_tcmalloc.c", LIB[allocator], "-lpthread",
                          name=f"capture_{allocator}")
    with targets.start([exe, "--serve"], allocator=allocator) as t:
        text = section(t.lines, "tcmalloc_getstats")
        p = truth(t.lines)
    st = tcmalloc_stats.parse_getstats(text)
    sm = st["summary"]
    assert sm["bytes_in_use_by_app"] == p["generic.current_allocated_bytes"]
    assert sm["actual_memory_used"] == p["generic.total_physical_bytes"]
    assert sm["bytes_released_to_os"] == p["tcmalloc.pageheap_unmapped_bytes"]
    assert sm["bytes_in_page_heap_freelist"] == p["tcmalloc.pageheap_free_bytes"]
    assert sm["bytes_in_central_cache_freelist"] == p["tcmalloc.central_cache_free_bytes"]
    assert sm["bytes_in_transfer_cache_freelist"] == p["tcmalloc.transfer_cache_free_bytes"]
    assert sm["bytes_in_thread_cache_freelists"] == p["tcmalloc.thread_cache_free_bytes"]
    assert p["generic.heap_size"] == sm["virtual_address_space_used"] - sm["bytes_in_malloc_metadata"]
    a = tcmalloc_stats.normalise_tcmalloc(p)
    b = tcmalloc_stats.normalise_tcmalloc(None, st)
    for name in STATS_FIELDS:
        assert a[name].value == b[name].value, name


def test_ground_truth_mimalloc():
    exe = targets.build_c("capture_mimalloc.c", LIB["mimalloc"], "-lpthread")
    with targets.start([exe, "--serve"], allocator="mimalloc") as t:
        text = section(t.lines, "mimalloc_stats")
        p = truth(t.lines)
    d = mimalloc_stats.parse_stats_text(text)
    cur = d["rows"]["committed"]["current"]
    assert cur["min"] <= p["current_commit"] <= cur["max"]
    pk = d["process"]["peak_commit"]
    assert pk["min"] <= p["peak_commit"] <= pk["max"]
    assert d["process"]["peak_rss"]["min"] <= p["peak_rss"] <= d["process"]["peak_rss"]["max"]
    assert p["current_rss"] == p["current_commit"]
    pi = mimalloc_stats.process_info_dict([0, 0, 0, p["current_rss"], p["peak_rss"],
                                           p["current_commit"], p["peak_commit"], 0])
    s = mimalloc_stats.normalise_mimalloc(d, pi)
    assert s["committed"].value == p["current_commit"] >= 12 << 20 and s["resident"].value is None


# -- the native schema --------------------------------------------------------------

def test_schema_units_where_views_need_them():
    from collectors import schema
    from collectors.allocators import native
    assert schema.lookup("jemalloc", ("mallctl", "stats.arenas.4096.pactive")).unit == native.PAGES
    assert schema.lookup("jemalloc", ("mallctl", "stats.allocated")).unit == native.BYTES
    assert schema.lookup("jemalloc", ("mallctl", "opt.dirty_decay_ms")).unit == native.MS
    assert schema.lookup("glibc", ("mallinfo2", "keepcost")).unit == native.BYTES
    assert schema.lookup("glibc", ("mallinfo2", "hblkhd")).unit == native.BYTES
    assert schema.lookup("glibc", ("mallinfo2", "ordblks")).unit == native.COUNT
    assert schema.lookup("glibc", ("malloc_info", "arenas", "*", "sizes", "*", "count")).unit == \
        native.COUNT
    assert schema.lookup("tcmalloc", ("getstats", "summary", "spans_in_use")).unit == native.COUNT
    assert schema.lookup("tcmalloc", ("getstats", "summary", "bytes_in_use_by_app")).unit == \
        native.BYTES
    assert schema.lookup("mimalloc", ("stats", "rows", "committed", "peak", "value")).unit == \
        native.BYTES
    assert schema.lookup("mimalloc", ("stats", "rows", "threads", "peak", "value")).unit == \
        native.COUNT
    assert schema.lookup("jemalloc", ("no", "such")) is None
    assert schema.lookup("go", ("anything",)) is None
    assert schema.page_size("jemalloc", {"mallctl": {"arenas.page": 4096}}) == 4096
    assert schema.page_size("jemalloc", {"mallctl": {"arenas.page": None}}) is None
    assert schema.page_size("glibc", {}) is None
    for kind in schema.KINDS:
        names = [f.name for f in schema.fields(kind)]
        assert len(names) == len(set(names)), kind          # each field declared once
        assert all(f.unit in native.UNITS for f in schema.fields(kind))


@pytest.mark.parametrize("name,kind", [
    ("malloc_info-glibc-2.36.xml", "glibc"), ("jemalloc-5.3.0-stats.json", "jemalloc"),
    ("jemalloc-5.3.0-stats-one-arena.json", "jemalloc"), ("tcmalloc-2.10-getstats.txt", "tcmalloc"),
    ("mimalloc-2.0.9-stats.txt", "mimalloc"), ("mimalloc-2.4-stats.SYNTHETIC.json", "mimalloc")])
def test_file_documents_are_declared_in_the_schema(name, kind):
    from collectors import allocators, schema
    native = allocators.module(kind).parse_file(fixture(name, "rb"))
    assert [p for p in schema.paths(native) if schema.lookup(kind, p) is None] == []


def test_glibc_mallinfo2_derived_from_malloc_info_exactly():
    # Captured together (same moment) by tests/targets/capture_glibc.c.
    d = glibc_stats.parse_malloc_info(fixture("malloc_info-glibc-2.36.xml", "rb"))
    assert glibc_stats.mallinfo2_from_malloc_info(d) == sidecar("malloc_info-glibc-2.36.mallinfo2.txt")
