"""Capture the wall fixtures of the Time tab, the report and the exporter:
real ``diag.model.wall.Wall`` documents sampled by collectors.sampler from
tests/targets/wall_ui.c.

- ``wall-glibc-arena1.json``: a list of WINDOWS windows of WINDOW_S s
  (``Wall.to_json(stacks=True)``) of ``wall_ui 4`` under glibc with
  ``MALLOC_ARENA_MAX=1`` and ``MALLOC_MMAP_THRESHOLD_=131072`` (allocator
  CPU, arena lock waits, mmap/munmap and faults from ``free``/``malloc``);
- ``recording-wall-jemalloc.jsonl.gz``: ``allocdiag record PID -o ...
  --interval 2 --duration 8 --wall`` of ``wall_ui 4`` under
  ``LD_PRELOAD=libjemalloc.so.2`` (snapshot lines and wall lines).

Run as root from the repository root:
    .venv/bin/python tests/targets/capture_wall.py
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
sys.path[:0] = [TESTS, ROOT]

from diag import wallsample
from targets import build_c, start  # noqa: E402

FIXTURES = os.path.join(TESTS, "fixtures")
WINDOWS, WINDOW_S = 3, 2.0
ARENA1 = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}


def glibc_windows(exe):
    with start([exe, "4"], allocator="glibc", env=ARENA1) as t:
        walls = [wallsample.sample(t.pid, WINDOW_S) for _ in range(WINDOWS)]
    path = os.path.join(FIXTURES, "wall-glibc-arena1.json")
    with open(path, "w") as f:
        json.dump([w.to_json(stacks=True) for w in walls], f, indent=1)
        f.write("\n")
    for w in walls:
        print(f"{path}: allocator {w.cpu.allocator_share if w.cpu else None}, "
              f"lock {w.off_cpu.allocator_lock_share if w.off_cpu else None}, "
              f"{len(w.counters)} counters, missing {[m.figure for m in w.window.missing]}")


def jemalloc_recording(exe):
    path = os.path.join(FIXTURES, "recording-wall-jemalloc.jsonl.gz")
    with start([exe, "4"], allocator="jemalloc") as t:
        subprocess.run([sys.executable, "-m", "diag", "record", str(t.pid), "-o", path,
                        "--interval", "2", "--duration", "8", "--wall"], check=True, cwd=ROOT)
    print(path)


def main():
    exe = build_c("wall_ui.c", "-pthread")
    glibc_windows(exe)
    jemalloc_recording(exe)


if __name__ == "__main__":
    main()
