"""Full snapshots, back to back, of an 8-thread target churning malloc/free
of 16 B - 256 KiB under each allocator: no crash, no hang, the target keeps
progressing, and nothing of allocdiag's is left in its address space.

CI runs 200 consecutive snapshots per allocator; the soak variant (marked
``soak``) runs 2,000.  The engine-level properties (signals held and
re-delivered, a thread blocked in read() still gets its data, every-thread-
busy refusal, Ctrl-C mid-call, vanished pid mid-call, permission denied)
are tested call by call in test_remote_engine.py; here the whole snapshot
path (detection, symbol resolution, forbidden ranges, every stats call and
its scratch/mmap buffers) runs under load.
"""

import os
import time

import pytest

from collectors import ptrace
from collectors.livestats import LARGE_TEXT
from diag import snapshot
from targets import build_c, start

THREADS = 8


def ops(pid, addr):
    return sum(int.from_bytes(ptrace.read_memory(pid, addr + 8 * i, 8), "little")
               for i in range(1, THREADS + 1))


def large_text_mappings(pid):
    """Start addresses of anonymous mappings exactly as big as livestats'
    malloc_info buffer.  The allocator may map and unmap such sizes itself
    (jemalloc's 4 MiB extents), so what counts is that none appears."""
    out = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if len(parts) == 5 and end - start == LARGE_TEXT:
                out.add(start)
    return out


def run_snapshots(allocator, count):
    exe = build_c("remote_churn.c", "-pthread", "-ldl")
    with start([exe, str(THREADS), "1"], allocator=allocator) as t:
        addr = int(t.ready.split("ops=")[1].split()[0], 16)
        before_maps = large_text_mappings(t.pid)
        pauses, kinds, last_ops = [], {}, ops(t.pid, addr)
        deadline = time.monotonic() + 600
        for i in range(count):
            snap, col = snapshot.take(t.pid)
            remote = col.status["remote"]
            assert remote.ok, f"snapshot {i}: {remote.error}"
            assert snap.stats["resident"].value is not None or snap.stats["mapped"].value is not None
            pauses.append(remote.pause_us)
            kind = snap.native["borrowed_thread"]["kind"]
            kinds[kind] = kinds.get(kind, 0) + 1
            assert t.alive(), f"target died after snapshot {i}"
            assert time.monotonic() < deadline, f"only {i} snapshots in 600 s"
        # Still progressing after the run, and nothing left behind.
        time.sleep(0.2)
        assert ops(t.pid, addr) > last_ops
        with open(f"/proc/{t.pid}/status") as f:
            status = f.read()
        assert "TracerPid:\t0" in status and "State:\tS" in status or "State:\tR" in status
        assert not large_text_mappings(t.pid) - before_maps
    pauses.sort()
    return pauses, kinds


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc", "tcmalloc", "mimalloc"])
def test_200_snapshots_under_churn(allocator):
    pauses, kinds = run_snapshots(allocator, 200)
    assert len(pauses) == 200
    print(f"{allocator}: pause median {pauses[100]} us, max {pauses[-1]} us, threads {kinds}")


@pytest.mark.soak
@pytest.mark.parametrize("allocator", ["glibc", "jemalloc", "tcmalloc", "mimalloc"])
def test_2000_snapshots_under_churn(allocator):
    pauses, _ = run_snapshots(allocator, 2000)
    assert len(pauses) == 2000
