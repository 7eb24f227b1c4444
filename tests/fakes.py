"""Shared test doubles for the views (TUI, recording, snapshot baselines).

Every allocator number here comes out of the real parser run on a real
capture in tests/fixtures (through ``diag.filemode``, the ``--from FILE``
path, which yields the same native shape as a live read), and every finding
out of ``diag.findings.evaluate`` on that snapshot: a view test can only see
shapes and finding ids the product really produces.  Only the kernel layer
(process, cgroup) and the identity of the process are set by the test,
because a captured stats file does not carry them.
"""

import dataclasses
import os

from diag import filemode, findings

# The captures come from small test programs (MiB, not GiB): the real rules
# run with a floor scaled to them, so their findings fire on these snapshots.
FLOOR = 1 << 20

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

# One real capture per allocator (tests/fixtures/README.md says how each was made).
CAPTURES = {
    "glibc": "malloc_info-glibc-2.36.xml",
    "jemalloc": "jemalloc-5.3.0-stats.json",
    "tcmalloc": "tcmalloc-2.10-getstats.txt",
    "mimalloc": "mimalloc-2.0.9-stats.txt",
}


def captured(kind):
    """The Snapshot ``allocdiag inspect --from`` makes of KIND's capture."""
    return filemode.snapshot_from_file(os.path.join(FIXTURES, CAPTURES[kind]))


def real_snapshot(kind, *, allocator=None, findings_from_rules=True, **kernel_and_identity):
    """KIND's captured allocator layer and native document, with the kernel
    layer and identity (pid, comm, exe, taken_at, process, cgroup, preload,
    collectors) given by the test; findings from diag.findings on the result."""
    snap = captured(kind)
    if allocator is not None:
        allocator = dataclasses.replace(allocator, kind=snap.allocator.kind)
        kernel_and_identity["allocator"] = allocator
    snap = dataclasses.replace(snap, **kernel_and_identity)
    if findings_from_rules:
        snap = dataclasses.replace(snap, findings=findings.evaluate(snap, floor=FLOOR))
    return snap
