#!/usr/bin/env python3
"""`allocdiag inspect` (no stop) on a process with many mappings.

Starts a target with N mappings (default 20,000), then times the in-process
snapshot (diag.snapshot.take: status, smaps_rollup, maps, ELF, GOT read,
cgroup) and, as a baseline measured in the same run, a plain read of the
target's /proc/PID/maps and smaps_rollup (the kernel's share of the cost).

    python bench/inspect_maps.py [-n 20000] [--runs 20]
Goal (issue 2): under 150 ms for 20k mappings.
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import build_c, start  # noqa: E402
from diag import snapshot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with start([build_c("many_maps.c"), str(args.n)], allocator="jemalloc") as t:
        with open(f"/proc/{t.pid}/maps") as f:
            nmaps = sum(1 for _ in f)
        snapshot.take(t.pid)                      # warm the ELF cache
        times, base = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            snap, _ = snapshot.take(t.pid)
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for name in ("maps", "smaps_rollup"):
                with open(f"/proc/{t.pid}/{name}", "rb") as f:
                    f.read()
            base.append(time.perf_counter() - t0)
        assert snap.allocator.kind == "jemalloc"
    med, b = statistics.median(times), statistics.median(base)
    print(f"mappings                 {nmaps}")
    print(f"inspect (no stop)        {med * 1000:.1f} ms median of {args.runs} (goal < 150 ms)")
    print(f"baseline: read maps+rollup {b * 1000:.1f} ms")
    print(f"ratio inspect/baseline   {med / b:.1f}x")


if __name__ == "__main__":
    main()
