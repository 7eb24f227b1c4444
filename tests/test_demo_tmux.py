"""End to end in a real terminal: ``allocdiag demo`` shows all four allocators.

Four demo scenes, one per allocator kind (glibc_held under glibc, lying_rss
under jemalloc, burst_idle under tcmalloc and under mimalloc), started by the
real command in a tmux pane (160x40); the host view must list a row of each
kind with the scene's pid, and the background filler (diag.hostlive) must
fill the "allocator resident" column and the top finding of each.  Quitting ends the demo and stops every workload.
The session runs on its own tmux socket and is always killed.
"""

import os
import re
import shutil
import sys
import time
import uuid

import pytest

import tmuxpane

from targets import preload_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

SCENES = ("glibc_held", "lying_rss", "burst_idle:tcmalloc", "burst_idle:mimalloc")
KINDS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")


def _tmux(sock, *args, check=True):
    return tmuxpane.tmux(sock, *args, check=check)


def _wait_for(sock, predicate, timeout):
    return tmuxpane.wait_for(sock, "demo", predicate, timeout)


ROW = re.compile(r"^\s*(\d+)\s+(glibc_held|lying_rss|burst_idle)\S*\s+(\S+)", re.M)
SIZE = re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)\b")


def _rows(screen):
    """{pid: allocator column} of the scene rows on the host view (the
    textual app draws on the terminal through stderr, so the demo's own
    progress lines cannot be captured apart: the pids come from the table)."""
    return {int(m.group(1)): m.group(3) for m in ROW.finditer(screen)}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@needs_tmux
def test_demo_host_view_shows_four_allocators():
    for kind in ("jemalloc", "tcmalloc", "mimalloc"):
        preload_path(kind)
    sock = f"allocdiag-demo-{uuid.uuid4().hex[:8]}"
    only = " ".join(f"--only {s}" for s in SCENES)
    cmd = (f"cd {ROOT} && {sys.executable} -m diag demo {only}; "
           f"echo DEMO-EXITED-$?; sleep 30")
    pids = set()
    try:
        _tmux(sock, "new-session", "-d", "-s", "demo", "-x", "160", "-y", "40",
              # the pane's size, stated: shutil.get_terminal_size (textual) prefers
              # COLUMNS/LINES, which a test runner's environment may carry
              "env", "TERM=xterm-256color", "COLUMNS=160", "LINES=40", "sh", "-c", cmd)
        # THEN the host view lists one row per scene, one of each allocator kind
        screen = _wait_for(sock, lambda s: len(_rows(s)) == 4 and all(
            any(a.startswith(k) for a in _rows(s).values()) for k in KINDS), timeout=120)
        rows = _rows(screen)
        pids = set(rows)
        assert sorted(a.split()[0] for a in rows.values()) == sorted(KINDS), rows
        # AND the background filler (diag.hostlive) fills "allocator resident" and the
        # top finding of every scene row (RSS, anon, LazyFree + resident = 4 sizes)
        screen = _wait_for(sock, lambda s: all(
            len(SIZE.findall(line)) >= 4 for line in s.splitlines() if ROW.match(line))
            and len([line for line in s.splitlines() if ROW.match(line)]) == 4, timeout=60)
        scene_lines = [line for line in screen.splitlines() if ROW.match(line)]
        assert any("page heap" in line for line in scene_lines), scene_lines
        assert any("mimalloc keeps" in line for line in scene_lines), scene_lines
        assert "Traceback" not in screen
        # WHEN q  THEN the demo exits 0 and stops every workload it started
        _tmux(sock, "send-keys", "-t", "demo", "q")
        screen = _wait_for(sock, lambda s: "DEMO-EXITED-" in s, timeout=30)
        assert "DEMO-EXITED-0" in screen, screen
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)]
    finally:
        _tmux(sock, "kill-server", check=False)
        for p in pids:          # only if still one of the scenes (not a recycled pid)
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().startswith(("glibc_held", "lying_rss", "burst_idle")):
                        os.kill(p, 9)
            except (OSError, ProcessLookupError):
                pass


# -- the host view's background filler (diag.hostlive), used by the demo's host view --------

def test_hostlive_fills_resident_and_finding_without_blocking():
    """Two demo scenes (tcmalloc, mimalloc): annotate() never waits for a
    stop; the worker fills resident and the snapshot's top finding."""
    from examples.launch import start, stop, wait_ready
    from diag import hostlive, hostscan
    procs = []
    try:
        for alloc in ("tcmalloc", "mimalloc"):
            preload_path(alloc)
            p = start("burst_idle", alloc)
            procs.append(p)
            wait_ready(p, 30)
        pids = [p.pid for p in procs]
        with hostlive.HostLive(min_gap_s=0.1) as live:
            rows = hostscan.scan(pids=pids).rows
            t0 = time.perf_counter()
            live.annotate(rows)
            # a cache lookup, no stop: nothing read yet when it returns (the
            # bound is loose for a loaded CI; a cold stop with detection is longer)
            assert time.perf_counter() - t0 < 0.5
            assert {r["allocator_read"] for r in rows} == {"pending"}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                rows = live.annotate(hostscan.scan(pids=pids).rows)
                if all(r["allocator_read"] == "ok" for r in rows):
                    break
                time.sleep(0.2)
            by_pid = {r["pid"]: r for r in rows}
            tc, mi = by_pid[procs[0].pid], by_pid[procs[1].pid]
            assert tc["allocator_read"] == mi["allocator_read"] == "ok"
            assert tc["resident"] > 64 << 20 and mi["resident"] > 64 << 20
            assert "page heap" in tc["top_finding"]
            assert "mimalloc keeps" in mi["top_finding"]
            # refreshed at a bounded rate: fresh entries are not read again
            reads = live.reads
            time.sleep(0.5)
            assert live.reads == reads
    finally:
        for p in procs:
            stop(p)


def test_hostlive_step_all_reads_each_due_process_once():
    # A read slower than refresh_s leaves its process due again at once:
    # one-shot modes (the exporter's sync collect) read it once per call,
    # not again and again, and still read every other due process.
    from diag.model.errors import AccessDenied
    from diag import hostlive
    calls = []

    def take(pid, deadline_s):
        calls.append(pid)
        time.sleep(0.03)
        raise AccessDenied(pid, "ptrace refused")

    live = hostlive.HostLive(take=take, refresh_s=0.01, retry_s=0.01)
    live.annotate([{"pid": pid, "_start": 1} for pid in (4242424, 4242425)])
    assert live.step_all() == 2
    assert sorted(calls) == [4242424, 4242425]
    time.sleep(0.02)
    assert live.step_all() == 2 and len(calls) == 4


def test_hostlive_not_read_is_reported_and_not_retried():
    from diag.model.errors import AccessDenied
    from diag import hostlive
    calls = []

    def take(pid, deadline_s):
        calls.append(pid)
        raise AccessDenied(pid, "ptrace refused")

    live = hostlive.HostLive(take=take, retry_s=300)
    rows = [{"pid": 4242424, "_start": 1, "top_finding": None}]
    live.annotate(rows)
    assert live.step() is True
    assert live.step() is False         # not retried before retry_s
    rows = live.annotate([{"pid": 4242424, "_start": 1, "top_finding": None}])
    assert rows[0]["allocator_read"].startswith("not read: ptrace refused")
    assert rows[0]["top_finding"].startswith("allocator not read")
    assert "resident" not in rows[0]
    assert calls == [4242424]
