"""CPython's pymalloc read from outside, checked against the target's own
``sys._debugmallocstats()`` on every interpreter this machine has: Debian's
stripped /usr/bin/python3.11 and pyenv's 3.10-3.13 (with .symtab, and with
the symbols ignored to exercise the stripped-binary paths)."""

import glob
import json
import os
import re
import subprocess
import tempfile
import threading
import time

import pytest

import deps
from targets import SOURCES, start

from diag.model.records import replace
from collectors.runtimes import pymalloc
from collectors.binary.image import ProcessImage
from diag import breakdown, findings, snapshot
from diag.fields import RUNTIME_FIELDS
from diag.recording import snapshot_from_json

TARGET = os.path.join(SOURCES, "rt_pyobjects.py")
DEBIAN = "/usr/bin/python3.11"
PYENV = sorted(glob.glob("/root/.pyenv/versions/3.1[0-9].*/bin/python3.1[0-9]"))


def interpreters():
    out = [pytest.param(DEBIAN, id="debian-3.11")]
    for p in PYENV:
        out.append(pytest.param(p, id="pyenv-" + p.split("/")[4]))
    return out


def _need(python):
    if python == DEBIAN:
        deps.need(DEBIAN)
    elif not os.path.exists(python):
        pytest.skip(f"{python} not installed")


def _own_stats(text):
    """The target's _debugmallocstats numbers we compare with."""
    def num(label):
        m = re.search(r"^# %s\s*=\s*([\d,]+)" % re.escape(label), text, re.M)
        return int(m.group(1).replace(",", "")) if m else None
    m = re.search(r"^(\d+) arenas \* (\d+) bytes/arena", text, re.M)
    return {"arenas": num("arenas allocated current"), "highwater": num("arenas highwater mark"),
            "allocated": num("bytes in allocated blocks"),
            "available": num("bytes in available blocks"),
            "arena_size": int(m.group(2)) if m else None}


def _run(python, n=100000, mode="plain", env=None, preload=""):
    err = tempfile.TemporaryFile()
    cm = start([python, TARGET, str(n), mode], preload=preload, env=env, stderr=err)
    return cm, err


def _read_err(err):
    err.seek(0)
    return err.read().decode(errors="replace")


def _close(v, truth, rel=0.001):
    return abs(v - truth) <= rel * truth


@pytest.mark.parametrize("python", interpreters())
@pytest.mark.parametrize("symbols", [True, False], ids=["symbols", "nosymbols"])
def test_walk_matches_debugmallocstats(python, symbols):
    _need(python)
    cm, err = _run(python)
    with cm as t:
        own = _own_stats(_read_err(err))
        rt = pymalloc.collect(ProcessImage(t.pid), prefer_symbols=symbols)
        status = open(f"/proc/{t.pid}/status").read()
    assert rt is not None and rt.kind == "cpython-pymalloc", rt
    assert rt.reason is None, rt.reason
    v = {k: x.value for k, x in rt.values.items()}
    assert v["arenas"] == own["arenas"]
    assert v["arenas_highwater"] == own["highwater"]
    assert _close(v["allocated"], own["allocated"]), (v["allocated"], own["allocated"])
    assert _close(v["free_in_pools"], own["available"]), (v["free_in_pools"], own["available"])
    assert v["mapped"] == own["arenas"] * own["arena_size"]
    # Resident from pagemap: the pages that hold live blocks are resident.
    assert v["allocated"] <= v["resident"] <= v["mapped"]
    assert rt.values["resident"].source.startswith("/proc/PID/pagemap")
    if python == DEBIAN or not symbols:
        assert ".symtab" not in rt.located_by
    assert re.search(r"^TracerPid:\s+0$", status, re.M)


def test_layout_table_and_fields_agree():
    """Every runtime value the collector reports has a meaning in diag.fields."""
    assert set(pymalloc.RUNTIME_VALUE_NAMES) == set(RUNTIME_FIELDS)
    for mm, layout in pymalloc.LAYOUTS.items():
        assert layout.arena_size == 1 << 20 and layout.pool_size == 1 << 14, mm


def test_unknown_version_is_unknown_not_a_number(monkeypatch):
    deps.need(DEBIAN)
    monkeypatch.setattr(pymalloc, "LAYOUTS", {})
    cm, _err = _run(DEBIAN, n=1000)
    with cm as t:
        rt = pymalloc.collect(ProcessImage(t.pid))
    assert rt.kind == "cpython-pymalloc" and "no verified obmalloc layout" in rt.reason
    assert all(x.value is None and x.provenance == "unknown" for x in rt.values.values())


def test_failed_check_is_unknown(monkeypatch):
    """A pool header that fails the checks on every try gives unknown, with
    the reason, never a number."""
    deps.need(DEBIAN)
    monkeypatch.setattr(pymalloc, "NB_SMALL_SIZE_CLASSES", 1)   # every szidx > 0 now fails
    cm, _err = _run(DEBIAN, n=1000)
    with cm as t:
        rt = pymalloc.collect(ProcessImage(t.pid))
    assert rt.values["allocated"].value is None
    assert "fails the checks" in rt.reason or "usedpools" in rt.reason or "walk failed" in rt.reason


def test_pythonmalloc_malloc_says_no_pymalloc():
    deps.need(DEBIAN)
    cm, _err = _run(DEBIAN, n=1000, env={"PYTHONMALLOC": "malloc"})
    with cm as t:
        rt = pymalloc.collect(ProcessImage(t.pid))
    assert rt.kind == "cpython-malloc" and "no pymalloc" in rt.reason and rt.values == {}


def test_snapshot_json_breakdown_and_recording_round_trip():
    deps.need(DEBIAN)
    cm, err = _run(DEBIAN, n=200000)
    with cm as t:
        own = _own_stats(_read_err(err))
        snap, _col = snapshot.take(t.pid, attach=False)
    doc = snap.to_json()
    rt = doc["runtime"]
    assert rt["kind"] == "cpython-pymalloc" and rt["version"] == "3.11.2"
    assert rt["arenas"]["value"] == own["arenas"] and rt["arenas"]["provenance"] == "measured"
    assert _close(rt["allocated"]["value"], own["allocated"])
    assert rt["allocated"]["provenance"] == "derived" and rt["missed"]
    assert doc["collectors"]["runtime"]["ok"]
    # The Python arenas are carved out of "other anonymous".
    names = {l.name: l for l in breakdown.layers(snap)}
    assert "python_arenas" in names and "python_allocated" in names
    assert names["python_arenas"].bytes >= names["python_allocated"].bytes > 0.9 * own["allocated"]
    assert sum(l.bytes for l in breakdown.layers(snap) if l.depth == 0) <= snap.process.rss
    # record/replay carries it unchanged
    text = json.dumps(doc)
    assert json.dumps(snapshot_from_json(json.loads(text)).to_json()) == text


def test_fragmentation_finding():
    deps.need(DEBIAN)
    cm, err = _run(DEBIAN, n=300000, mode="frag")
    with cm as t:
        snap, _col = snapshot.take(t.pid, attach=False)
    rt = snap.runtime.values
    assert rt["resident"].value > 3 * rt["allocated"].value
    got = {f.id: f for f in findings.evaluate(snap, floor=8 << 20)}
    f = got["pymalloc-arena-fragmentation"]
    assert f.expected_effect_bytes == rt["resident"].value - rt["allocated"].value
    assert f.evidence["arenas"] == rt["arenas"].value and f.knob.name == "PYTHONMALLOC"
    # the generic "outside malloc" rule no longer claims the arenas
    assert "memory-outside-malloc" not in got


def test_preload_misses_pymalloc_finding():
    deps.need(DEBIAN)
    je = deps.need("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    cm, _err = _run(DEBIAN, n=300000, preload=je)
    with cm as t:
        snap, _col = snapshot.take(t.pid, attach=False)
    got = {f.id: f for f in findings.evaluate(snap, floor=8 << 20)}
    f = got["preload-misses-pymalloc"]
    assert "jemalloc" in f.title and f.knob.suggested == "malloc"
    assert f.evidence["pymalloc_resident"] == snap.runtime.values["resident"].value
    # Without the preload there is nothing to say.
    plain = replace(snap, preload=replace(snap.preload, requested=()))
    assert "preload-misses-pymalloc" not in {x.id for x in findings.evaluate(plain, floor=8 << 20)}


def test_target_never_stopped():
    """Reads at a watch-like pace: TracerPid stays 0, and a serving thread's
    longest gap is the same as with no reads at all (median over alternating
    windows with and without reads: the machine is shared, so one window's
    maximum is scheduling noise)."""
    deps.need(DEBIAN)
    with start([DEBIAN, TARGET, "100000", "serve"], stderr=subprocess.DEVNULL) as t:
        image = ProcessImage(t.pid)
        tracer = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                m = re.search(r"^TracerPid:\s+(\d+)", open(f"/proc/{t.pid}/status").read(), re.M)
                tracer.append(int(m.group(1)))
                time.sleep(0.002)

        def end_phase():
            t.proc.stdin.write(b"\n")
            t.proc.stdin.flush()
            return float(t.proc.stdout.readline().split()[1])

        w = threading.Thread(target=watch)
        w.start()
        during, base, reads = [], [], 0
        end_phase()                             # start clean
        # Our own CPU use must not be what delays the target on 2 shared
        # cores: read at the lowest priority, as a watcher would.
        prio = os.getpriority(os.PRIO_PROCESS, 0)
        try:
            for _ in range(5):
                os.setpriority(os.PRIO_PROCESS, 0, 19)
                t_end = time.monotonic() + 0.5
                while time.monotonic() < t_end:
                    assert pymalloc.collect(image).values["allocated"].value
                    reads += 1
                    time.sleep(0.02)
                os.setpriority(os.PRIO_PROCESS, 0, prio)
                during.append(end_phase())
                time.sleep(0.5)
                base.append(end_phase())
        finally:
            os.setpriority(os.PRIO_PROCESS, 0, prio)
            stop.set()
            w.join()
    assert reads >= 50 and tracer and set(tracer) == {0}
    d, b = sorted(during)[2], sorted(base)[2]
    # the target's longest gap with reads against without (medians of 5):
    # a stop would add its length; the 0.1 s allows a loaded CI's noise
    assert d <= max(2 * b, b + 0.1), (during, base)


@pytest.mark.parametrize("python", [DEBIAN] + [p for p in PYENV if "3.13" in p or "3.12" in p])
def test_churning_target_gives_checked_numbers_or_unknown(python):
    """While the target allocates and frees arenas, every walk either passes
    its checks (numbers consistent with each other) or says unknown with a
    reason; never a number from a torn read."""
    _need(python)
    cm, _err = _run(python, n=20000, mode="churn")
    with cm as t:
        image = ProcessImage(t.pid)
        results = [pymalloc.collect(image) for _ in range(30)]
    ok = 0
    for rt in results:
        v = {k: x.value for k, x in rt.values.items()}
        if rt.reason is not None:
            assert all(x is None for x in v.values()), rt.reason
            continue
        ok += 1
        assert 0 < v["arenas"] <= v["arenas_highwater"]
        assert 0 < v["allocated"] + v["free_in_pools"] + v["unused_pools"] <= v["mapped"]
    assert ok >= 20, [r.reason for r in results if r.reason]
