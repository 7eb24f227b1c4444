"""CPython's pymalloc read from outside, checked against the target's own
``sys._debugmallocstats()`` on every interpreter this machine has: Debian's
stripped /usr/bin/python3.11 and pyenv's 3.10-3.13 (with .symtab, and with
the symbols ignored to exercise the stripped-binary paths)."""

import dataclasses
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

from collectors import pymalloc
from collectors.image import ProcessImage
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
    plain = dataclasses.replace(snap, preload=dataclasses.replace(snap.preload, requested=()))
    assert "preload-misses-pymalloc" not in {x.id for x in findings.evaluate(plain, floor=8 << 20)}


def test_target_never_stopped():
    """Reads in a loop for a while: TracerPid stays 0, and a serving
    thread's longest gap is the same as with no reads at all."""
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

        w = threading.Thread(target=watch)
        w.start()
        reads = 0
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            assert pymalloc.collect(image).values["allocated"].value
            reads += 1
        stop.set()
        w.join()
        t.proc.stdin.write(b"\n")
        t.proc.stdin.flush()
        during = float(t.proc.stdout.readline().split()[1])
        time.sleep(1.5)                         # the same length, no reads
        t.proc.stdin.write(b"\n")
        t.proc.stdin.flush()
        base = float(t.proc.stdout.readline().split()[1])
    assert reads >= 10 and tracer and set(tracer) == {0}
    # A 1 ms sleeper's longest gap: scheduling noise on a shared machine is
    # the same with or without reads; a stop would show as the walk's length.
    assert during <= max(2 * base, base + 0.005), (during, base)
