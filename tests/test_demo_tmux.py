"""End to end in a real terminal: ``allocdiag demo`` shows all four allocators.

Four demo scenes, one per allocator kind (glibc_held under glibc, lying_rss
under jemalloc, burst_idle under tcmalloc and under mimalloc), started by the
real command in a tmux pane (160x40); the host view must list a row of each
kind with the scene's pid.  Quitting ends the demo and stops every workload.
The session runs on its own tmux socket and is always killed.
"""

import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from targets import preload_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

SCENES = ("glibc_held", "lying_rss", "burst_idle:tcmalloc", "burst_idle:mimalloc")
KINDS = ("glibc", "jemalloc", "tcmalloc", "mimalloc")


def _tmux(sock, *args, check=True):
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                          check=check, timeout=10)


def _wait_for(sock, predicate, timeout):
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux(sock, "capture-pane", "-p", "-t", "demo", check=False).stdout
        if predicate(screen):
            return screen
        time.sleep(0.3)
    raise AssertionError(f"timed out; the pane shows:\n{screen}")


ROW = re.compile(r"^\s*(\d+)\s+(glibc_held|lying_rss|burst_idle)\S*\s+(\S+)", re.M)


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
              "env", "TERM=xterm-256color", "sh", "-c", cmd)
        # THEN the host view lists one row per scene, one of each allocator kind
        screen = _wait_for(sock, lambda s: len(_rows(s)) == 4 and all(
            any(a.startswith(k) for a in _rows(s).values()) for k in KINDS), timeout=120)
        rows = _rows(screen)
        pids = set(rows)
        assert sorted(a.split()[0] for a in rows.values()) == sorted(KINDS), rows
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
