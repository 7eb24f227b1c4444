"""Go, honestly (issue 21, item 4): a pure Go binary's heap is the Go
runtime's, which allocdiag does not read: no ``remote.ok: true`` without
stats, exit 5 for inspect's live part.  A dynamically linked cgo binary's C
side allocates through malloc like any program: that allocator is detected
and read, and the Go heap is named as a second allocator."""

import json
import os
import subprocess
import sys

import pytest

from collectors.livestats import GO_HEAP
from diag import snapshot
from diag.model.exitcodes import ExitCode
from targets import build_go, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20

pytestmark = pytest.mark.needs_go


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), cwd="/", timeout=120)


def test_pure_go_inspect_exits_5_without_remote_ok():
    exe = build_go("goidle")
    with start([exe]) as t:
        j = run_cli("inspect", "--json", str(t.pid))
        x = run_cli("inspect", str(t.pid))
        e = run_cli("explain", str(t.pid))
    assert j.returncode == ExitCode.UNSUPPORTED, j.stderr
    doc = json.loads(j.stdout)
    assert doc["allocator"]["kind"] == "go" and doc["allocator"]["linkage"] == "static"
    remote = doc["collectors"]["remote"]
    assert remote["ok"] is False and remote["error"] == GO_HEAP
    assert all(v["value"] is None for v in doc["stats"].values())
    assert doc["process"]["rss_anon"] > 0          # the kernel's part is still there
    assert "the Go runtime manages this heap; allocdiag reads no Go runtime statistics yet" \
        in j.stderr
    assert x.returncode == ExitCode.UNSUPPORTED
    assert "allocator stats" in x.stdout and GO_HEAP in x.stdout
    # explain's headline: no "malloc is served by go"
    assert e.returncode == ExitCode.UNSUPPORTED, e.stderr
    assert "malloc is served by" not in e.stdout
    assert "the Go runtime manages this heap" in e.stdout.splitlines()[0]


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_cgo_binary_c_side_allocator_is_read_and_go_heap_named(allocator):
    exe = build_go("gocgo", cgo=True)
    with start([exe], allocator=allocator) as t:
        snap, col = snapshot.take(t.pid)
        r = run_cli("inspect", "--json", str(t.pid))
    a = snap.allocator
    assert a.kind == allocator
    assert a.linkage == ("preload" if allocator == "jemalloc" else "dynamic")
    assert any("malloc GOT slot" in e for e in a.evidence), a.evidence
    go = [o for o in a.others if o.kind == "go"]
    assert len(go) == 1 and go[0].path == exe and go[0].version.startswith("go1.")
    assert any("reads no Go runtime statistics" in e for e in go[0].evidence)
    # the C side's 64 x 64 KiB chunks are in the allocator's own numbers
    assert col.status["remote"].ok and col.status["remote"].error is None
    assert snap.stats["allocated"].value >= 4 * MiB
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["allocator"]["kind"] == allocator
    assert [o["kind"] for o in doc["allocator"]["others"]].count("go") == 1
