#!/usr/bin/env python3
"""Whole-host `allocdiag ps --json` cost per process.

Starts N idle processes (default 500; a mix of C targets under glibc and the
installed allocator preloads, so detection sees several objects), runs
`allocdiag ps --json` with all of them and again with a fifth of them, and
prints the per-process cost (the difference) and the fixed cost (interpreter
start-up, first parse of each library), next to a baseline measured in the
same run: reading /proc/PID/status only (what `ps` itself reads).

    python bench/ps_scan.py [-n 500] [--runs 5]
Goal (issue 2): 1,000 processes in under 1 s on 2 cores.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import PRELOADS, build_c  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=500, help="idle processes to start (default 500)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    exe = build_c("idle.c")
    libs = [p for p in PRELOADS.values() if p is None or os.path.exists(p)]
    procs = []
    try:
        for i in range(args.n):
            env = dict(os.environ)
            lib = libs[i % len(libs)]
            if lib:
                env["LD_PRELOAD"] = lib
            procs.append(subprocess.Popen([exe, "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          env=env))
        time.sleep(1.0)
        env = dict(os.environ, PYTHONPATH=ROOT)

        def measure():
            walls, counts = [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "diag", "ps", "--json"],
                                     capture_output=True, env=env, check=True).stdout
                walls.append(time.perf_counter() - t0)
                counts.append(json.loads(out)["total"])
            return statistics.median(walls), statistics.median(counts)

        def baseline():
            base = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                for pid in os.listdir("/proc"):
                    if pid.isdigit():
                        try:
                            with open(f"/proc/{pid}/status", "rb") as f:
                                f.read()
                        except OSError:
                            pass
                base.append(time.perf_counter() - t0)
            return statistics.median(base)

        wall_big, n_big = measure()
        base_big = baseline()
        # Fewer processes: the difference gives the per-process cost; the
        # rest is fixed (interpreter start-up, first parse of each library).
        for p in procs[len(procs) // 5:]:
            p.kill()
            p.wait()
        time.sleep(0.5)
        wall_small, n_small = measure()
        per = (wall_big - wall_small) / (n_big - n_small)
        fixed = wall_big - per * n_big
        print(f"processes scanned        {n_big:.0f} and {n_small:.0f}")
        print(f"allocdiag ps --json      {wall_big * 1000:.0f} ms and {wall_small * 1000:.0f} ms "
              f"(median of {args.runs} each)")
        print(f"per process              {per * 1e6:.0f} us; fixed cost {fixed * 1000:.0f} ms "
              f"(start-up, first parse of each library)")
        print(f"baseline: read status    {base_big / n_big * 1e6:.1f} us/process "
              f"(ratio {per / (base_big / n_big):.0f}x)")
        print(f"projected 1,000 procs    {(fixed + per * 1000) * 1000:.0f} ms (goal < 1000 ms)")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    main()
