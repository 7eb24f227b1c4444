"""``allocdiag compare`` on a short synthetic workload (bounded to ~30 s).

The workload (a Python script) mallocs ~40 MiB of 4-6 KiB buffers, frees
three quarters of them, prints DONE and sleeps (an idle wait the engine can
borrow).  Two real variants (glibc, jemalloc) and a preload with a typo run
through the real command line; the document must record the preload verdict,
peak >= settled, the allocator layers for both real variants, and exclude the
typo with its reason.
"""

import json
import os
import subprocess
import sys

import pytest

from targets import preload_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKLOAD = """\
import sys, time
bufs = [bytearray(4096 + (i % 9) * 256) for i in range(9000)]
time.sleep(0.6)
del bufs[: 3 * len(bufs) // 4]
print("DONE live=%d" % len(bufs), flush=True)
time.sleep(120)
"""

TYPO = "/usr/lib/x86_64-linux-gnu/libjemaloc.so.2"


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    preload_path("jemalloc")
    script = tmp_path_factory.mktemp("compare") / "workload.py"
    script.write_text(WORKLOAD)
    cmd = [sys.executable, "-m", "diag", "compare", "--json",
           "--variants", "glibc,jemalloc", TYPO,
           "--warmup-seconds", "0", "--idle-after", "^DONE", "--idle-seconds", "2",
           "--interval", "0.5", "--timeout", "20", "--isolate",
           "--", "/usr/bin/python3", str(script)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _variant(doc, name):
    return next(v for v in doc["variants"] if v["name"] == name)


def test_preload_verdict_recorded(doc):
    # "glibc,jemalloc" (a comma) is two variants
    assert [v["name"] for v in doc["variants"]] == ["glibc", "jemalloc", TYPO]
    g, j = _variant(doc, "glibc"), _variant(doc, "jemalloc")
    assert g["preload_effective"] is None and g["excluded_reason"] is None
    assert g["allocator_kind"] == "glibc"
    assert j["preload_effective"] is True and j["excluded_reason"] is None
    assert j["allocator_kind"] == "jemalloc"
    assert "in effect" in j["preload_verdict"]


def test_peak_at_least_settled_with_allocator_layers(doc):
    for name in ("glibc", "jemalloc"):
        v = _variant(doc, name)
        run = v["runs"][0]
        assert run["ended_by"] == "idle done" and run["stopped_by_allocdiag"]
        assert any(s["phase"] == "idle" for s in run["samples"])
        for key in ("rss", "rss_anon", "allocated", "resident"):
            assert v["peak"][key] is not None and v["settled"][key] is not None, (name, key)
            assert v["peak"][key] >= v["settled"][key], (name, key)
        # the program freed three quarters of ~40 MiB: the allocator says so
        assert v["peak"]["allocated"] - v["settled"]["allocated"] > 20 << 20, name
        assert v["settled"]["lazyfree"] is not None
        assert run["pause_ms_total"] > 0
        assert any(line.startswith("DONE") for line in run["output"])
    assert _variant(doc, "jemalloc")["settled"]["retained"] is not None


def test_typo_preload_excluded_with_reason(doc):
    t = _variant(doc, TYPO)
    assert t["runs"], "a typo'd preload is still run (the verdict is the evidence)"
    assert t["preload_effective"] is False
    assert "not in effect" in t["excluded_reason"]
    assert "file not found" in t["excluded_reason"]
    assert t["rank"] is None
    ranked = [n for g in doc["ranking"]["groups"] for n in g["names"]]
    assert sorted(ranked) == ["glibc", "jemalloc"]


def test_isolated_in_a_transient_cgroup_that_is_removed(doc):
    for name in ("glibc", "jemalloc"):
        run = _variant(doc, name)["runs"][0]
        if run["isolated"]:
            assert run["cgroup_removed"] is True and not os.path.exists(run["cgroup"])
            assert _variant(doc, name)["settled"]["working_set"] is not None
        else:       # no writable cgroup here: said, not silently ignored
            assert run["isolate_reason"]


def test_ranking_within_noise_is_not_ordered():
    from diag.compare import rank

    def e(name, settled, lo=None, hi=None, excluded=None):
        sp = {"min": lo or settled, "median": settled, "max": hi or settled}
        return {"name": name, "excluded_reason": excluded, "settled": {"rss": settled},
                "spread": {"settled.rss": sp}}
    groups = rank([e("a", 100), e("b", 103), e("c", 120), e("d", 104, 99, 130),
                   e("x", 50, excluded="typo")], noise_pct=5)
    assert groups[0]["names"] == ["a", "b", "d"] and groups[0]["within_noise"]
    assert groups[1] == {"rank": 2, "names": ["c"], "within_noise": False}
    # a chain of small steps does not make one group: 100 -> 104 -> 108 -> 112
    groups = rank([e(str(v), v) for v in (100, 104, 108, 112)], noise_pct=5)
    assert [g["names"] for g in groups] == [["100", "104"], ["108", "112"]]


def test_usage_errors():
    for argv in ([], ["--preset", "footprint", "--", "true"], ["--repeat", "0", "--", "true"],
                 ["--variants", "jemalloc:dirty_decay_ms", "--", "true"]):
        r = subprocess.run([sys.executable, "-m", "diag", "compare", *argv], cwd=ROOT,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (argv, r.stderr)
        assert "Traceback" not in r.stderr


def test_confounds_reported(doc):
    c = doc["confounds"]
    assert c["cpus"] == os.cpu_count()
    assert "thp_enabled" in c and "swap_total" in c and "governor" in c


def test_knob_syntax():
    from diag.compare import knob_env, parse_variant
    assert knob_env("jemalloc", [("dirty_decay_ms", "1000"), ("muzzy_decay_ms", "0")]) == {
        "MALLOC_CONF": "dirty_decay_ms:1000,muzzy_decay_ms:0"}
    assert knob_env("glibc", [("MALLOC_ARENA_MAX", "2")]) == {"MALLOC_ARENA_MAX": "2"}
    assert knob_env("glibc", [("trim_threshold", "131072"), ("arena_max", "2")]) == {
        "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072:glibc.malloc.arena_max=2"}
    assert knob_env("mimalloc", [("purge_delay", "0")]) == {
        "MIMALLOC_PURGE_DELAY": "0", "MIMALLOC_DECOMMIT_DELAY": "0"}
    assert knob_env("tcmalloc_minimal", [("release_rate", "10")]) == {
        "TCMALLOC_RELEASE_RATE": "10"}
    v = parse_variant("jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0")
    assert v.library.endswith("libjemalloc.so.2") and v.expect_kind == "jemalloc"
    assert parse_variant("tcmalloc_minimal").expect_kind == "tcmalloc"
