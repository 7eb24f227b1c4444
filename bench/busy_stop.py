#!/usr/bin/env python3
"""A running thread's stop: `allocdiag -v inspect --json` of a CPU-bound
Python (one thread, never in a wait: every borrow is of a running thread,
judged by a stack walk in the stop), against the same interpreter idle in
a read(2) in the same run (a wait judged by its syscall: the anchor).

Each run is a new allocdiag process, as a user's `inspect` is; the detection
cache starts empty for each tree measured and fills as the runs go, so the
first runs show what is decoded for the first time and the later ones the
steady state.  Per run it reads the snapshot's longest stop
(collectors.remote.pause_us) and the stops refused after they were made
(-v: "stopped N us, no call made"); printed: the median and range of the
longest stop, and the refused stops' count and sum, per tree.  With --tree
another checkout is measured too, the runs alternated.

    python bench/busy_stop.py [--runs 12] [--python /usr/bin/python3] [--tree CHECKOUT]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSY = "d = {}\ni = 0\nwhile True:\n    i += 1\n    d[i % 1000] = str(i) * 3\n"
IDLE = "import sys; sys.stdin.read()"
REFUSED = re.compile(r"stopped (\d+) us, no call made")
SETTLE_S = 1.0


def one_run(tree, cache, pid):
    """(longest stop us or None, [refused stops' us]) of one inspect."""
    env = dict(os.environ, PYTHONPATH=tree, XDG_CACHE_HOME=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    p = subprocess.run([sys.executable, "-m", "diag", "-v", "inspect", "--json", str(pid)],
                       cwd=tree, env=env, capture_output=True, text=True)
    try:
        pause = json.loads(p.stdout)["collectors"]["remote"]["pause_us"]
    except (ValueError, KeyError):
        pause = None
    return pause, [int(us) for us in REFUSED.findall(p.stderr)]


def summary(name, runs):
    stops = [s for s, _ in runs if s is not None]
    refused = [us for _, r in runs for us in r]
    failed = len(runs) - len(stops)
    text = (f"{name:28s} longest stop median {statistics.median(stops) / 1000:.2f} ms "
            f"({min(stops) / 1000:.2f}-{max(stops) / 1000:.2f})" if stops else
            f"{name:28s} no snapshot borrowed a thread")
    return (text + f"; refused after the stop: {len(refused)} stops, "
            f"{sum(refused) / 1000:.1f} ms in all" + (f"; {failed} runs failed" if failed else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the interpreter of the targets (default /usr/bin/python3)")
    ap.add_argument("--tree", help="another checkout to measure in the same run")
    args = ap.parse_args()
    trees = [ROOT] + ([os.path.abspath(args.tree)] if args.tree else [])
    busy = subprocess.Popen([args.python, "-c", BUSY])
    idle = subprocess.Popen([args.python, "-c", IDLE], stdin=subprocess.PIPE)
    caches = {t: tempfile.mkdtemp(prefix="busy-stop-") for t in trees}
    results = {t: [] for t in trees}
    anchor = []
    try:
        time.sleep(SETTLE_S)
        for _ in range(args.runs):
            for t in trees:
                results[t].append(one_run(t, caches[t], busy.pid))
            anchor.append(one_run(ROOT, caches[ROOT], idle.pid))
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
        for c in caches.values():
            shutil.rmtree(c, ignore_errors=True)
    print(f"target: {args.python}, {args.runs} runs per tree, alternated, "
          f"each tree with its own cache (empty at the start)")
    for t in trees:
        print(summary(f"busy, {os.path.basename(t) or t}", results[t]))
        print("  per run (longest stop us, refused stops):",
              ", ".join(f"{s}/{len(r)}" for s, r in results[t]))
    print(summary("idle in read(2) (anchor)", anchor))


if __name__ == "__main__":
    main()
