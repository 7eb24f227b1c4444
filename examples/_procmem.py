"""Tiny helpers shared by the Python workloads: read our own memory numbers
from /proc and speak the launcher's line protocol (``READY ...``, ``PHASE ...``).

Kept deliberately independent of allocdiag's collectors: the examples must run
(and prove their point) on a machine where allocdiag is not installed.
"""

import os
import signal
import sys

MiB = 1024 * 1024


def _kib_file(path, wanted=None):
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    if wanted is None or key in wanted:
                        out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def status(pid="self"):
    """/proc/PID/status byte-valued fields (VmRSS, RssAnon, RssFile, ...)."""
    return _kib_file(f"/proc/{pid}/status")


def smaps_rollup(pid="self"):
    """/proc/PID/smaps_rollup byte-valued fields (Rss, Anonymous, LazyFree, ...)."""
    return _kib_file(f"/proc/{pid}/smaps_rollup")


def memory(pid="self"):
    """The handful of numbers the workloads report, in bytes."""
    st = status(pid)
    sr = smaps_rollup(pid)
    return {
        "rss": st.get("VmRSS", 0),
        "rss_anon": st.get("RssAnon", 0),
        "lazyfree": sr.get("LazyFree", 0),
    }


def mib(n):
    return f"{n / MiB:.1f}"


def fields(**kv):
    """Format key=value pairs for a protocol line; floats get 3 decimals."""
    parts = []
    for k, v in kv.items():
        if isinstance(v, float):
            v = f"{v:.3f}"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def say(word, **kv):
    """Print one protocol line (``READY k=v ...``, ``PHASE load ...``) and flush."""
    line = word + (" " + fields(**kv) if kv else "")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def exit_on_signals():
    """SIGTERM/SIGINT end the workload with status 0, whatever it is doing."""
    def _bye(signum, frame):
        try:
            sys.stdout.flush()
        finally:
            os._exit(0)
    signal.signal(signal.SIGTERM, _bye)
    signal.signal(signal.SIGINT, _bye)
