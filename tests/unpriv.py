"""Run allocdiag code as an unprivileged user (uid/gid 65534, "nobody").

The checkout and its virtualenv may live where nobody cannot read them
(a clone under /root, as the README's fresh-machine commands make), so the
tests that drop privileges run from a world-readable copy: allocdiag's own
packages and the third-party packages they import, copied once per test
session into a 0755 directory under /tmp, run by the base interpreter the
virtualenv was made from (/usr/bin/python3 on Debian), which anyone may run.
"""

import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534
OURS = ("collectors", "diag", "tui")
THIRD_PARTY = ("elftools", "psutil")    # what collectors and diag import at module level

_copy = None


def _tree():
    global _copy
    if _copy is None:
        _copy = tempfile.mkdtemp(prefix="allocdiag-nobody-")
        atexit.register(shutil.rmtree, _copy, True)
        os.chmod(_copy, 0o755)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in OURS:
            shutil.copytree(os.path.join(ROOT, name), os.path.join(_copy, name), ignore=ignore)
        for name in THIRD_PARTY:
            src = os.path.dirname(importlib.import_module(name).__file__)
            shutil.copytree(src, os.path.join(_copy, name), ignore=ignore)
        for base, dirs, files in os.walk(_copy):
            for d in dirs:
                os.chmod(os.path.join(base, d), 0o755)
            for f in files:
                os.chmod(os.path.join(base, f), 0o644)
    return _copy


def executable(path):
    """A copy of the executable PATH that nobody may run (the build directory
    of a checkout under /root is not reachable for nobody)."""
    dest = os.path.join(_tree(), "bin")
    os.makedirs(dest, mode=0o755, exist_ok=True)
    os.chmod(dest, 0o755)
    out = os.path.join(dest, os.path.basename(path))
    if not os.path.exists(out):
        shutil.copy2(path, out + ".tmp")
        os.chmod(out + ".tmp", 0o755)
        os.replace(out + ".tmp", out)
    return out


def interpreter():
    """The base interpreter behind this (virtualenv) python: runnable by anyone."""
    return os.path.realpath(sys.executable)


def _drop():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def run(args, timeout=120):
    """Run ``python ARGS...`` as nobody, with allocdiag importable.  ARGS is
    e.g. ``["-c", code]`` or ``["-m", "diag", "inspect", "1"]``."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _tree(),
           "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    return subprocess.run([interpreter(), "-s", *args], capture_output=True,
                          text=True, env=env, cwd="/", timeout=timeout, preexec_fn=_drop)
