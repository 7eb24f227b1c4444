"""Parser tests on real captured profiles (tests/fixtures/README.md): the
gperftools unsampled heap profiler, gperftools GetHeapSample (heap_v2, with
and without sampling: %warn lines), jemalloc threaded heap_v2 (one thread;
named threads with prof_accum).  The scaling is checked against google/pprof
itself (`go tool pprof -raw`) and the writer against the captured bytes.
A bounded fuzz mutates the captures: only MalformedData or a profile that
round-trips through the writer is allowed."""
import json
import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from diag.model.errors import MalformedData
from collectors.heapprofile import JEMALLOC, parse, unparse
from diag import heapview

import deps

FIX = Path(__file__).parent / "fixtures"
JE_ONE = "heap-jemalloc-python.heap"
JE_THREADS = "heap-jemalloc-threads-accum-python.heap"
TC_UNSAMPLED = "heap-tcmalloc-python.heap"
TC_SAMPLED = "heap-tcmalloc-sampled.heap"
TC_OFF = "heap-tcmalloc-sampling-off.heap"
FILES = [JE_ONE, JE_THREADS, TC_UNSAMPLED, TC_SAMPLED, TC_OFF]


def load(name):
    return (FIX / name).read_bytes()


@pytest.mark.parametrize("name", FILES)
def test_writer_gives_back_the_captured_bytes(name):
    data = load(name)
    p = parse(data)
    assert unparse(p) == data.decode()
    assert parse(unparse(p)) == p
    assert p.mappings and all(m.start < m.end for m in p.mappings)


def test_unsampled_heapprofile_is_not_scaled():
    p = parse(load(TC_UNSAMPLED))
    assert (p.format, p.rate) == ("heapprofile", 1)
    # every allocation counted: the rows sum exactly to the header
    assert sum(s.inuse_bytes for s in p.samples) == p.totals.inuse_bytes
    assert sum(s.alloc_objects for s in p.samples) == p.totals.alloc_objects
    assert all(s.scaled == s.raw for s in p.samples)


def test_unsampled_profile_with_nothing_freed_still_counts_allocations():
    """A gperftools heapprofile of a program that freed nothing since the
    start has equal in-use and allocated pairs: still allocation data (pprof's
    hasAlloc heuristic is for the sampled format)."""
    head, rest = load(TC_UNSAMPLED).split(b"\n", 1)
    m = re.match(rb"heap profile: *(\d+): *(\d+) *\[", head)
    equal = b"heap profile: %s: %s [%s: %s] @ heapprofile" % (m.group(1), m.group(2),
                                                               m.group(1), m.group(2))
    p = parse(equal + b"\n" + rest)
    assert p.has_alloc
    assert "allocated since start" in heapview.render_top(heapview.view_of(p))


def test_jemalloc_threaded_rows():
    p = parse(load(JE_THREADS))
    assert (p.format, p.period, p.has_alloc) == (JEMALLOC, 65536, True)
    names = {tid: name for tid, (_c, name) in p.thread_totals.items()}
    assert names == {0: None, 1: "worker0", 2: "worker1", 3: "worker2"}
    # each worker's header row is the sum of its rows under the stacks
    # (jemalloc's t0 and t* rows do not add up in this capture: its
    # unbiasing of main-thread counts; the workers' do)
    for tid in (1, 2, 3):
        rows = [s.threads[tid] for s in p.samples if tid in s.threads]
        assert rows
        assert tuple(map(sum, zip(*rows))) == tuple(p.thread_totals[tid][0])
    s = p.samples[0]
    # jeprof AdjustSamples: scale = 1/(1-exp(-(size/count)/period)), floats
    c = s.raw
    if c.inuse_objects:
        k = 1 / (1 - math.exp(-(c.inuse_bytes / c.inuse_objects) / p.period))
        assert s.inuse_bytes == pytest.approx(c.inuse_bytes * k, rel=1e-12)
    one = parse(load(JE_ONE))
    assert not one.has_alloc and set(one.thread_totals) == {0}


def test_sampling_off_warnings():
    p = parse(load(TC_OFF))
    assert p.format == "heap_v2" and p.period == 0 and not p.samples
    assert any("TCMALLOC_SAMPLE_PARAMETER" in w for w in p.warnings)


def _pprof_raw_values(path):
    go = deps.go()
    out = subprocess.run([go, "tool", "pprof", "-raw", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # after "Samples:" and the sample-type line: "  VALUES...: LOCATION IDS"
    body = out.stdout.split("Samples:", 1)[1].split("Locations", 1)[0]
    return sorted(tuple(int(v) for v in m.group(1).split())
                  for m in re.finditer(r"^((?:\s+-?\d+)+):", body, re.M))


def _as_pprof_prints(p, theirs):
    """Our scaled (objects, bytes) per sample, sorted -- or, when this pprof
    merged samples with the same stack before printing (go 1.19's does, newer
    ones do not), summed per stack: pprof scales each sample, then merges."""
    each = sorted((s.inuse_objects, s.inuse_bytes) for s in p.samples)
    if len(theirs) == len(each):
        return each
    merged = {}
    for s in p.samples:
        o, b = merged.get(tuple(s.stack), (0, 0))
        merged[tuple(s.stack)] = (o + s.inuse_objects, b + s.inuse_bytes)
    return sorted(merged.values())


def test_scaling_matches_pprof(tmp_path):
    """heap_v2/524288: pprof's scaleHeapSample (truncated to int64) on every
    sample equals ours; `go tool pprof -raw` prints one line per sample."""
    p = parse(load(TC_SAMPLED))
    assert (p.rate, p.has_alloc) == (524288, False)
    theirs = _pprof_raw_values(FIX / TC_SAMPLED)
    assert theirs and theirs == _as_pprof_prints(p, theirs)
    # and an 8 KiB sample at rate 512 KiB is scaled about 64x, not left alone
    assert p.samples[0].inuse_objects == 64
    # the writer's output is read by pprof the same way
    out = tmp_path / "w.heap"
    out.write_text(unparse(p))
    assert _pprof_raw_values(out) == theirs


@pytest.mark.parametrize("label, rate", [("heap/1048576", 524288), ("heapz_v2/65536", 65536),
                                         ("heapprofile", 1)])
def test_other_labels_scale_like_pprof(label, rate, tmp_path):
    """The sampled capture relabelled: old ``heap`` (period/2), ``heapz_v2``
    and ``heapprofile`` (no scaling), each checked against pprof itself."""
    text = load(TC_SAMPLED).decode().replace("@ heap_v2/524288", f"@ {label}", 1)
    path = tmp_path / "relabelled.heap"
    path.write_text(text)
    p = parse(text)
    assert p.rate == rate
    theirs = _pprof_raw_values(path)
    assert theirs == _as_pprof_prints(p, theirs)
    first = p.samples[0]
    assert ((first.inuse_objects, first.inuse_bytes) == (1, 8192)) == (rate == 1)


@pytest.mark.parametrize("name, index", [(JE_ONE, "--inuse_space"), (JE_THREADS, "--inuse_space"),
                                         (JE_THREADS, "--alloc_space")])
def test_jemalloc_scaling_matches_jeprof(name, index):
    """jeprof's own total (AdjustSamples, Perl floats) against ours; we
    keep floats too, so only jeprof's printing (%d) separates them."""
    jeprof = deps.need("jeprof")
    prog = shutil.which("python3") or deps.need("python3")
    out = subprocess.run([jeprof, "--text", "--show_bytes", index, prog, str(FIX / name)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    total = int(re.search(r"^Total: (\d+) B$", out.stdout, re.M).group(1))
    p = parse(load(name))
    key = "inuse_bytes" if index == "--inuse_space" else "alloc_bytes"
    assert abs(sum(getattr(s, key) for s in p.samples) - total) < 1


@pytest.mark.parametrize("text, what", [
    ("", "no header"),
    ("heap profile: 1: 2 [3: 4] @ growthz\n", "unknown header"),
    ("hello\n", "unknown header"),
    ("heap profile: 1: 2 [1: 2] @ heapprofile\n 1: 2 [1: 2] @ 0xzz\n", "not a sample"),
    ("heap profile: 1: 2 [1: 2] @ heapprofile\n 0: 2 [1: 2] @ 0x1\n", "count 0 but 2 bytes"),
    ("heap profile: 1: 2 [1: 2] @ heap_v2/99999999999999999999999\n", "int64"),
    ("heap profile: 1: 2 [1: 2] @ heapprofile\n 1: 2 [1: 2] @\n", "empty stack"),
    ("heap_v2/1\n  t*: 1: 2 [0: 0]\n@ 0x1\n  t1: 1: 2 [0: 0]\n", "thread row before t*"),
    ("heap_v2/1\n@ 0x1\n  t*: 1: 2 [0: 0]\n", "no t* totals"),
    ("heap_v2/1\n  t*: 1: 2 [0: 0]\n@ 0x1\n@ 0x2\n  t*: 1: 2 [0: 0]\n", "without a t* row"),
    ("heap_v2/1\n  t*: 1: 2 [0: 0]\n@ 0x1\n  t*: 1: 2 [0: 0]\n  t*: 1: 2 [0: 0]\n", "two t*"),
    ("heap_v2/1\n  t*: 1: 2 [0: 0]\n@ 0x1\n", "no t* row"),
    (b"heap_v2/1\0", "NUL"),
    ("heap_v2/1\n  t*: 1: 2 [0: 0]\n  t" + "1" * 5000 + ": 1: 2 [0: 0]\n", "int64"),
])
def test_malformed_named(text, what):
    with pytest.raises(MalformedData, match=re.escape(what)):
        parse(text)


# -- fuzz -------------------------------------------------------------------------

HUGE = [b"99999999999999999999", b"18446744073709551616", b"-1", b"0",
        b"9223372036854775807", b"1" * 5000, b"0x" + b"f" * 40]
JUNK = [b"garbage", b"@", b"  t*: 1: 1 [0: 0]", b"%warn x", b"MAPPED_LIBRARIES:",
        b"heap profile: 1: 1 [1: 1] @ heap_v2/1", b"  t7: 5: 10 [0: 0] name",
        b"\xff\xfe", b"# comment", b"@ 0x1 0x2", b"   1: 1 [ 1: 1] @ 0x10"]
CASES_PER_FILE = 1200
VIEW_EVERY = 10            # every tenth profile that parses is symbolized and rendered
FUZZ_BODY_LINES = 60       # bigger captures are cut to this many lines + their maps


def _fuzz_base(data):
    """The capture with its body cut to FUZZ_BODY_LINES lines (the maps kept):
    thousands of cases stay within seconds, every part of the format is still there."""
    head, sep, maps = data.partition(b"\nMAPPED_LIBRARIES:\n")
    return b"\n".join(head.split(b"\n")[:FUZZ_BODY_LINES]) + sep + maps


def _mutate(rng, data):
    op = rng.randrange(6)
    if op == 0:                                   # truncation
        return data[:rng.randrange(len(data) + 1)]
    if op == 1:                                   # byte flips
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if op == 2:                                   # a number replaced by a huge one
        nums = list(re.finditer(rb"-?\d+", data[:20000]))
        if not nums:
            return data + rng.choice(HUGE)
        m = rng.choice(nums)
        return data[:m.start()] + rng.choice(HUGE) + data[m.end():]
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    if op == 3:                                   # junk line inserted
        lines.insert(i, rng.choice(JUNK))
    elif op == 4:                                 # line dropped
        del lines[i]
    else:                                         # line duplicated
        lines.insert(i, lines[rng.randrange(len(lines))])
    return b"\n".join(lines)


@pytest.mark.parametrize("name", FILES)
def test_fuzz(name):
    """Thousands of mutations of each capture: MalformedData, or a profile the
    writer turns back into an equal profile and the views render.  Never
    another exception."""
    base = _fuzz_base(load(name))
    rng = random.Random(f"heap-fuzz-{name}")
    outcomes = {"ok": 0, "malformed": 0}
    for _ in range(CASES_PER_FILE):
        data = _mutate(rng, base)
        if rng.random() < 0.3:
            data = _mutate(rng, data)
        try:
            p = parse(data)
        except MalformedData:
            outcomes["malformed"] += 1
            continue
        outcomes["ok"] += 1
        assert parse(unparse(p)) == p
        if outcomes["ok"] % VIEW_EVERY == 0:       # and the views take it too
            view = heapview.view_of(p)
            for render in (heapview.render_top, heapview.render_tree, heapview.render_collapsed):
                assert isinstance(render(view), str)
            json.dumps(view.to_json())
    # both paths were exercised
    assert outcomes["ok"] > 50 and outcomes["malformed"] > 50, outcomes
