#!/usr/bin/env python3
"""What one allocdiag snapshot costs the target, next to gdb (measured in the same run).

(a) Serving threads: a target with N threads churning malloc/free records
    the longest gap between two iterations of each thread.  The gap is read
    over a quiet window (no snapshot), a window with one allocdiag snapshot,
    and a window with one `gdb -p PID -batch -ex 'call ...'` of the same
    allocator's stats (as a production box has it: no libc debug info).
    allocdiag stops no serving thread, so its window should look like the
    quiet one; gdb stops them all.
(b) The borrowed thread's own stop per full snapshot (pause_us) on an idle
    target and on a saturated one (4 churning threads per core), next to the
    in-process cost of the same calls under the same load (timed by the
    target itself, see pause_target.c).

    python bench/pause.py [--allocators glibc,jemalloc,tcmalloc] [--threads 4] [--reps 15]
Goals (issue 3): serving threads not stopped (>= 10x below gdb); borrowed
stop <= 2 ms median idle and <= 2x in-process on a saturated target.
"""

import argparse
import mmap
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import build_c, start  # noqa: E402
from diag import snapshot  # noqa: E402

GDB_CALL = {"glibc": "call (void) malloc_stats()",
            "jemalloc": "call (void) malloc_stats_print(0, 0, 0)",
            "tcmalloc": "call (void) tc_malloc_stats()"}


def window(gapmap, nthreads, action, settle=0.3):
    """Max gap (us) over all serving threads while ACTION runs."""
    gapmap[: 8 * nthreads] = b"\0" * (8 * nthreads)
    action()
    time.sleep(settle)
    gaps = struct.unpack(f"<{nthreads}Q", gapmap[: 8 * nthreads])
    return max(gaps) / 1000.0


def inproc_ns(t, reps):
    t.proc.stdin.write(f"time {reps}\n".encode())
    t.proc.stdin.flush()
    line = t.proc.stdout.readline().decode()
    return int(line.split()[1])


def run(allocator, nthreads, reps, gdb):
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, str(nthreads), gf.name], allocator=allocator, stderr=subprocess.DEVNULL) as t:
            gapmap = mmap.mmap(gf.fileno(), 4096)
            snapshot.take(t.pid)                         # warm caches
            quiet, ours, theirs, pauses = [], [], [], []
            for _ in range(reps):
                quiet.append(window(gapmap, nthreads, lambda: None))
                def snap():
                    s, _ = snapshot.take(t.pid)
                    pauses.append(s.collectors["remote"].pause_us)
                ours.append(window(gapmap, nthreads, snap))
            for _ in range(max(3, reps // 3)) if gdb else ():
                cmd = [gdb, "-p", str(t.pid), "-batch", "-nx", "-iex",
                       "set debug-file-directory /nonexistent", "-ex", GDB_CALL[allocator]]
                theirs.append(window(gapmap, nthreads, lambda: subprocess.run(
                    cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)))
            gapmap.close()
    return quiet, ours, theirs


def saturated(allocator, nthreads, reps):
    """Borrowed-thread stop and in-process cost of the same calls with
    NTHREADS churning threads (more than the cores: the box is saturated)."""
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, str(nthreads), gf.name], allocator=allocator, stderr=subprocess.DEVNULL) as t:
            snapshot.take(t.pid)
            pauses = [snapshot.take(t.pid)[0].collectors["remote"].pause_us for _ in range(reps)]
            inproc = inproc_ns(t, 50) / 1000.0
    return pauses, inproc


def idle_pause(allocator, reps):
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, "0", gf.name], allocator=allocator, stderr=subprocess.DEVNULL) as t:
            snapshot.take(t.pid)
            pauses = [snapshot.take(t.pid)[0].collectors["remote"].pause_us for _ in range(reps)]
            inproc = inproc_ns(t, 200) / 1000.0
    return pauses, inproc


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocators", default="glibc,jemalloc,tcmalloc")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-gdb", action="store_true")
    args = ap.parse_args()
    gdb = None if args.no_gdb else shutil.which("gdb")
    for allocator in args.allocators.split(","):
        quiet, ours, theirs = run(allocator, args.threads, args.reps, gdb)
        idle, idle_in = idle_pause(allocator, args.reps)
        busy_threads = 4 * (os.cpu_count() or 2)
        pauses, busy_in = saturated(allocator, busy_threads, args.reps)
        print(f"== {allocator}: {args.threads} serving threads churning malloc/free")
        print(f"  (a) longest serving-thread gap, median of windows:")
        print(f"      no snapshot        {med(quiet):9.0f} us")
        print(f"      allocdiag snapshot {med(ours):9.0f} us")
        if theirs:
            print(f"      gdb -batch call    {med(theirs):9.0f} us   "
                  f"gdb/allocdiag = {med(theirs) / max(med(ours), 1):.0f}x")
        print(f"  (b) borrowed thread stop per snapshot (pause_us), median:")
        print(f"      idle target        {med(idle):9.0f} us   in-process same calls {idle_in:7.0f} us")
        print(f"      saturated target   {med(pauses):9.0f} us   in-process same calls {busy_in:7.0f} us   "
              f"ratio {med(pauses) / max(busy_in, 1):.1f}x   ({busy_threads} churning threads)")


if __name__ == "__main__":
    main()
