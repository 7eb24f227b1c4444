"""tmux helpers for the end-to-end terminal tests: run a command on a private
tmux server (-L SOCK) and wait for what its pane shows."""

import subprocess
import time


def tmux(sock, *args, check=True):
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                          check=check, timeout=10)


def wait_for(sock, session, predicate, timeout, poll_s=0.2):
    """The pane's text once PREDICATE(text) holds; AssertionError with the
    pane (and its size) after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux(sock, "capture-pane", "-p", "-t", session, check=False).stdout
        if predicate(screen):
            return screen
        time.sleep(poll_s)
    size = tmux(sock, "display", "-p", "-t", session, "#{window_width}x#{window_height}",
                check=False).stdout.strip()
    raise AssertionError(f"timed out; the pane ({size}) shows:\n{screen}")
