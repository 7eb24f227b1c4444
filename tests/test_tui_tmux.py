"""End to end in a real terminal: the TUI watching a real jemalloc process.

tmux gives the app a real pty (100x30); capture-pane reads what a user
would see.  The session runs on its own tmux socket and is always killed.
"""

import os
import shutil
import sys
import uuid

import pytest

import tmuxpane

from targets import build_c, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(sock, *args, check=True):
    return tmuxpane.tmux(sock, *args, check=check)


def _wait_for(sock, predicate, timeout):
    return tmuxpane.wait_for(sock, "tui", predicate, timeout)


def test_watch_real_jemalloc_process_in_tmux():
    exe = build_c("idle.c")
    with start([exe, "1"], allocator="jemalloc") as target:
        sock = f"allocdiag-test-{uuid.uuid4().hex[:8]}"
        # The real command line: `allocdiag watch` (python -m diag is the
        # same entry point as the console script).
        cmd = (f"cd {ROOT} && {sys.executable} -m diag watch {target.pid} --interval 1; "
               f"echo TUI-EXITED-$?; sleep 30")
        try:
            _tmux(sock, "new-session", "-d", "-s", "tui", "-x", "100", "-y", "30",
                  "env", "TERM=xterm-256color", "sh", "-c", cmd)
            # THEN the process view shows the allocator and the RSS split
            # (waits for the whole frame: a capture can land mid-paint)
            screen = _wait_for(sock, lambda s: all(w in s for w in (
                "jemalloc", "RSS", "LazyFree", str(target.pid), "every 1 s", "Quit")),
                timeout=20)
            assert "resident" in screen
            # WHEN q  THEN the app exits cleanly (exit status 0) and the target lives on
            _tmux(sock, "send-keys", "-t", "tui", "q")
            screen = _wait_for(sock, lambda s: "TUI-EXITED-" in s, timeout=10)
            assert "TUI-EXITED-0" in screen
            assert "Traceback" not in screen
            assert target.alive()
        finally:
            _tmux(sock, "kill-server", check=False)
