#!/usr/bin/env python3
"""Whole-host `allocdiag ps --json` and the TUI host view's refresh, against
the floor: the time to read the /proc files their columns need.

Starts N idle processes (default 420: a C target under glibc and each
installed allocator preload, plus some python3, so detection sees several
objects), then measures in the same run:

* `allocdiag ps --json`: median wall of --runs runs, and the peak RSS of one
  run (its own and its forked worker's, ru_maxrss from wait4);
* the floor: reading every process's status, stat, smaps_rollup, maps,
  environ and auxv and the exe link, in this (warm) interpreter, median of
  --runs; the goal is ps --json <= 2 x floor + 100 ms of fixed start-up
  (issue 23 item 3);
* start-up alone: `allocdiag --version`;
* the scan alone, serial and with the two forked workers, each in a fresh
  interpreter (the ELF objects parsed anew, as `ps` does);
* the host view (diag.source.HostSource's scanner), in one interpreter: the
  first full scan, a full scan with the ELF objects known, and the
  incremental refresh (only processes whose /proc/PID/stat moved are read
  again).

    python bench/ps_scan.py [-n 420] [--runs 5] [--python 20] [--tree CHECKOUT]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import PRELOADS, build_c  # noqa: E402

# What the ps columns need (diag.hostscan.NEEDS), read the cheapest way: to EOF.
FLOOR_FILES = ("status", "stat", "smaps_rollup", "maps", "environ", "auxv")
FIXED_MS = 100          # the fixed start-up the goal allows
GOAL_FACTOR = 2         # ... and this many times the floor
SETTLE_S = 1.0          # let the targets finish starting before measuring
READ_CHUNK = 1 << 17
KIB = 1024


def start_targets(n, n_python):
    exe = build_c("idle.c")
    libs = [p for p in PRELOADS.values() if p is None or os.path.exists(p)]
    procs = []
    for i in range(n - n_python):
        env = dict(os.environ)
        lib = libs[i % len(libs)]
        if lib:
            env["LD_PRELOAD"] = lib
        procs.append(subprocess.Popen([exe, "1"], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, env=env))
    for _ in range(n_python):
        procs.append(subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                      stdin=subprocess.PIPE))
    time.sleep(SETTLE_S)
    return procs


def run_child(argv, env):
    """(wall seconds, stdout bytes, rusage) of one run of ARGV; the rusage is
    the child's and its waited descendants' (the forked worker)."""
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.execve(argv[0], argv, env)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as out:
        for chunk in iter(lambda: out.read(READ_CHUNK), b""):
            chunks.append(chunk)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed with status {status}")
    return wall, b"".join(chunks), usage


def read_floor():
    """Seconds to read FLOOR_FILES and the exe link of every process once."""
    t0 = time.perf_counter()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        for f in FLOOR_FILES:
            try:
                with open(f"/proc/{name}/{f}", "rb", buffering=0) as fh:
                    while fh.read(READ_CHUNK):
                        pass
            except OSError:
                pass
        try:
            os.readlink(f"/proc/{name}/exe")
        except OSError:
            pass
    return time.perf_counter() - t0


def median_of(runs, fn):
    return statistics.median(fn() for _ in range(runs))


# Run in a fresh interpreter of the tree measured: the host view's scanner
# (diag.source.HostSource), or, in a tree without one, the full scan every
# refresh did before.  Prints JSON: seconds, and the processes read again.
HOST_VIEW = """
import json, statistics, sys, time
from diag import hostscan
runs = int(sys.argv[1])
def timed(fn):
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0
if not hasattr(hostscan, "HostScanner"):
    first = timed(hostscan.scan)
    full = statistics.median(timed(hostscan.scan) for _ in range(runs))
    print(json.dumps(dict(first=first, full=full, refresh=full, reread=None)))
    sys.exit()
def scanner():
    return hostscan.HostScanner(columns=hostscan.HOST_VIEW_COLUMNS, incremental=True)
first_scanner = scanner()
first = timed(first_scanner.scan)
full = statistics.median(timed(scanner().scan) for _ in range(runs))
refresh = []
for _ in range(runs):
    before = first_scanner.rows_read
    refresh.append(timed(first_scanner.scan))
reread = first_scanner.rows_read - before
print(json.dumps(dict(first=first, full=full, refresh=statistics.median(refresh), reread=reread)))
"""


def host_view(runs, env):
    """{first, full, refresh: seconds; reread: processes the last refresh
    read again (None: every one)} of the host view's scan."""
    _, out, _ = run_child([sys.executable, "-c", HOST_VIEW, str(runs)], env)
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=420, help="idle processes to start (default 420)")
    ap.add_argument("--python", type=int, default=20, help="how many of them are python3")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", default=ROOT,
                    help="the allocdiag source tree to measure (default: this one; another "
                         "checkout gives a before/after in the same run)")
    args = ap.parse_args()
    tree = os.path.abspath(args.tree)
    procs = start_targets(args.n, min(args.python, args.n))
    env = dict(os.environ, PYTHONPATH=tree)
    os.chdir(tree)          # `python -m` and `-c` import from the current directory first
    ps = [sys.executable, "-m", "diag", "ps", "--json"]
    try:
        walls, cpus, rss = [], [], []
        for _ in range(args.runs):
            wall, out, usage = run_child(ps, env)
            walls.append(wall)
            cpus.append(usage.ru_utime + usage.ru_stime)
            rss.append(usage.ru_maxrss)
        doc = json.loads(out)
        floor = median_of(args.runs, read_floor)
        startup = median_of(args.runs, lambda: run_child(
            [sys.executable, "-m", "diag", "--version"], env)[0])
        scan_only = {}
        for workers in (1, 2):
            code = f"from diag import hostscan; hostscan.scan(workers={workers})"
            scan_only[workers] = median_of(args.runs, lambda: run_child(
                [sys.executable, "-c", code], env)[0])
        bare = median_of(args.runs, lambda: run_child([sys.executable, "-c", "pass"], env)[0])
        view = host_view(args.runs, env)
        procps = median_of(args.runs, lambda: run_child(["/bin/ps", "-e", "-o", "pid,rss,comm"],
                                                         env)[0])
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    wall = statistics.median(walls)
    goal = GOAL_FACTOR * floor + FIXED_MS / 1000
    ms = lambda s: f"{s * 1000:.0f} ms"
    print(f"tree                     {tree}")
    print(f"processes                {doc['total']} rows ({doc['unreadable']} unreadable), "
          f"{len(os.listdir('/proc'))} /proc entries; {args.n} started")
    print(f"allocdiag ps --json      {ms(wall)} (median of {args.runs}; "
          f"{wall / doc['total'] * 1e6:.0f} us a row); CPU {ms(statistics.median(cpus))} "
          f"(user + sys, its worker's too)")
    print(f"floor: read the files    {ms(floor)} ({', '.join(FLOOR_FILES)}, exe link)")
    print(f"ratio                    {(wall - FIXED_MS / 1000) / floor:.1f}x the floor after "
          f"{FIXED_MS} ms; goal <= {ms(goal)} ({GOAL_FACTOR}x floor + {FIXED_MS} ms): "
          f"{'met' if wall <= goal else 'NOT met'}")
    print(f"start-up                 allocdiag --version {ms(startup)}; python3 -c pass {ms(bare)}")
    print(f"scan alone (fresh)       serial {ms(scan_only[1] - bare)}, two workers "
          f"{ms(scan_only[2] - bare)} (interpreter start subtracted)")
    again = "every process" if view["reread"] is None else f"{view['reread']} processes"
    print(f"host view refresh        first {ms(view['first'])}, full {ms(view['full'])}, "
          f"refresh {ms(view['refresh'])} ({again} read again)")
    print(f"peak RSS of ps --json    {max(rss) / KIB:.1f} MiB (goal <= 80 MiB)")
    print(f"procps ps -e             {ms(procps)}")
    print(f"this bench's own max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB:.0f} MiB")


if __name__ == "__main__":
    main()
