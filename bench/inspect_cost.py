#!/usr/bin/env python3
"""`allocdiag inspect PID` end to end (a new Python process each time, as a
user types it) on a real redis-server: with an empty detection cache, with
the cache warm, and with the cache bypassed (ALLOCDIAG_NO_CACHE=1: today's
cost without the cache's writes), against the floor measured in the same run:
a Python start-up that reads the target's /proc/PID/maps.

    python bench/inspect_cost.py [--runs 15] [--no-attach]

Each round runs the four commands one after the other (interleaved, so a
busy neighbour slows all of them alike); the figures are medians.  Python
writes and reuses bytecode caches as an installed allocdiag does
(PYTHONDONTWRITEBYTECODE is removed from the environment).
Goal (issue 23 item 2): warm <= 150 ms.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import checkout  # noqa: E402
checkout.use()

import servers  # noqa: E402

GOAL_MS = 150
ALLOCDIAG = [sys.executable, "-m", "diag"]


def timed(argv, env):
    """(wall, CPU user+sys) seconds of one run of ARGV.  The CPU time moves
    less than the wall time when neighbours load the machine."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 6):          # 6: partial, still a full run
        raise SystemExit(f"{argv} failed ({proc.returncode}): {err.decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--no-attach", action="store_true", help="inspect --no-attach (no stop)")
    args = ap.parse_args()
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONDONTWRITEBYTECODE", "ALLOCDIAG_NO_CACHE")}
    store = tempfile.mkdtemp(prefix="inspect_cost")
    warm_env = dict(base_env, XDG_CACHE_HOME=os.path.join(store, "warm"))
    off_env = dict(base_env, ALLOCDIAG_NO_CACHE="1")
    times = {"floor": [], "cold": [], "warm": [], "off": []}
    try:
        with servers.redis() as srv:
            pid = srv.pid
            inspect = ALLOCDIAG + ["inspect", str(pid)] + (["--no-attach"] if args.no_attach else [])
            floor = [sys.executable, "-c", f"open('/proc/{pid}/maps', 'rb').read()"]
            timed(inspect, warm_env)             # bytecode written, the warm store filled
            for i in range(args.runs):
                cold_env = dict(base_env, XDG_CACHE_HOME=os.path.join(store, f"cold{i}"))
                times["floor"].append(timed(floor, base_env))
                times["cold"].append(timed(inspect, cold_env))
                times["warm"].append(timed(inspect, warm_env))
                times["off"].append(timed(inspect, off_env))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    med = {k: statistics.median(w for w, _c in v) * 1000 for k, v in times.items()}
    cpu = {k: statistics.median(c for _w, c in v) * 1000 for k, v in times.items()}
    what = "inspect --no-attach" if args.no_attach else "inspect"
    print(f"target                   redis-server ({what}), median of {args.runs} rounds")
    print("                         wall      CPU")
    for key, label in (("floor", "floor: python + maps"), ("cold", "cold cache (first run)"),
                       ("off", "cache off (--no-cache)"), ("warm", "warm cache")):
        print(f"{label:<24} {med[key]:4.0f} ms  {cpu[key]:4.0f} ms")
    print(f"goal                     warm <= {GOAL_MS} ms wall")
    print(f"ratio warm/cold          {med['warm'] / med['cold']:.2f} wall, "
          f"{cpu['warm'] / cpu['cold']:.2f} CPU")
    print(f"ratio warm/floor         {med['warm'] / med['floor']:.1f}x wall")


if __name__ == "__main__":
    main()
