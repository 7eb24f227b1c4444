"""The test suite's guard on every snapshot: diag.model.invariant_violations
run on each one diag.snapshot.take makes, when ALLOCDIAG_INVARIANTS names a
file (tests/conftest.py sets it; CLI subprocesses inherit it).  Each
violation is appended to that file as one line naming both numbers; the
test that took the snapshot then fails with them.  Unset, nothing runs."""

import os

from diag.model import invariant_violations

ENV = "ALLOCDIAG_INVARIANTS"


def check(snap):
    path = os.environ.get(ENV)
    if not path:
        return
    found = invariant_violations(snap)
    if not found:
        return
    text = "".join(f"pid {snap.pid} ({snap.comm}): {v}\n" for v in found)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
