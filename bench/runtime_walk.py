#!/usr/bin/env python3
"""Cost of the out-of-process runtime walks, and what they cost the target.

(a) pymalloc: `collectors.runtimes.pymalloc.collect` (locate the obmalloc state, walk
    every arena and pool header, pagemap for resident) on a target holding
    about 40 MiB of arenas, for every CPython on the machine; the walk alone
    (state already located) is reported too.
(b) mimalloc 2.0.9: `collectors.allocators.mimalloc.segments.collect` (maps scan,
    cookie-validated headers, slices, pending free lists) on the
    rt_mimalloc target (two normal segments, one abandoned, one huge).
(c) the target's serving thread (a 1 ms sleeper in the Python target):
    its longest gap during 1.5 s of back-to-back walks vs 1.5 s without.

    python bench/runtime_walk.py [--runs 20]
Goal (issue 14): <= 50 ms per walk for 40 MiB of arenas / segments; the
serving thread's longest gap the same as with no reads.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import SOURCES, build_c, start  # noqa: E402
from collectors.allocators.mimalloc import segments as mimalloc_segments
from collectors.runtimes import pymalloc
from collectors.binary.image import ProcessImage  # noqa: E402
from collectors.engine.memory import MemoryReader  # noqa: E402

PY_TARGET = os.path.join(SOURCES, "rt_pyobjects.py")
# rt_pyobjects N=115000 holds ~40 arenas of 1 MiB on 3.10-3.13.
PY_N = "115000"


def _ms(xs):
    return f"{statistics.median(xs) * 1e3:6.1f} ms median, {max(xs) * 1e3:6.1f} max"


def bench_pymalloc(python, runs):
    with start([python, PY_TARGET, PY_N], stderr=subprocess.DEVNULL) as t:
        image = ProcessImage(t.pid)
        rt = pymalloc.collect(image)
        full = []
        for _ in range(runs):
            t0 = time.perf_counter()
            rt = pymalloc.collect(image)
            full.append(time.perf_counter() - t0)
        obj, mm, _v, _ft = pymalloc.find_python(image)
        layout = pymalloc.LAYOUTS[mm]
        walk = []
        with MemoryReader(t.pid) as mem:
            anchors = pymalloc.locate(obj, mm, mem.read, layout)
            for _ in range(runs):
                t0 = time.perf_counter()
                pymalloc.walk(mem.read, anchors, layout)
                walk.append(time.perf_counter() - t0)
    arenas = rt.values["arenas"].value
    print(f"  {rt.version:8} {arenas:3d} arenas ({arenas} MiB) located by {rt.located_by}")
    print(f"           collect {_ms(full)}; walk only {_ms(walk)}")


def bench_mimalloc(runs):
    with start([build_c("rt_mimalloc.c", "-lpthread")], allocator="mimalloc") as t:
        image = ProcessImage(t.pid)
        with MemoryReader(t.pid) as mem:
            _key, heads = mimalloc_segments.find_segments(mem.read, image.procfs.maps(t.pid))
        seg_bytes = sum(h[1] * mimalloc_segments.MI_SEGMENT_SLICE_SIZE for _a, h in heads)
        costs = []
        for _ in range(runs):
            t0 = time.perf_counter()
            w, _desc = mimalloc_segments.collect(image)
            costs.append(time.perf_counter() - t0)
    print(f"  {w.segments} segments ({seg_bytes >> 20} MiB; {w.abandoned} abandoned, {w.huge} huge), "
          f"{w.pages} pages, {w.pending_thread_free} pending thread frees")
    print(f"           collect {_ms(costs)}")


def bench_gap(python, seconds=1.5):
    with start([python, PY_TARGET, PY_N, "serve"], stderr=subprocess.DEVNULL) as t:
        image = ProcessImage(t.pid)
        n, t_end = 0, time.monotonic() + seconds
        while time.monotonic() < t_end:
            pymalloc.collect(image)
            n += 1
        t.proc.stdin.write(b"\n")
        t.proc.stdin.flush()
        during = float(t.proc.stdout.readline().split()[1])
        time.sleep(seconds)
        t.proc.stdin.write(b"\n")
        t.proc.stdin.flush()
        base = float(t.proc.stdout.readline().split()[1])
    print(f"  {n} walks in {seconds} s: longest gap of the 1 ms sleeper {during * 1e3:.2f} ms; "
          f"no reads {base * 1e3:.2f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    pythons = ["/usr/bin/python3.11"] + sorted(glob.glob("/root/.pyenv/versions/3.1[0-9].*/bin/python3.1[0-9]"))
    print("(a) pymalloc walk")
    for py in pythons:
        if os.path.exists(py):
            bench_pymalloc(py, args.runs)
    print("(b) mimalloc segment walk")
    bench_mimalloc(args.runs)
    print("(c) serving thread during walks (Debian python3.11)")
    bench_gap("/usr/bin/python3.11")


if __name__ == "__main__":
    main()
