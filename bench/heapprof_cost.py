#!/usr/bin/env python3
"""What a running heap profile costs the target (issue 10 item 5), measured
in the same run on the same churn target (bench/heapprof_churn.c: one
thread, one malloc + one free per op, 16..4111 bytes, a few frames deep):

  gperftools  libtcmalloc.so.4, ops/s with the heap profiler off and after
              `allocdiag heap start` (it records EVERY allocation: hooks,
              a stack capture and a hash-table insert per malloc)
  jemalloc    MALLOC_CONF=prof:true,prof_active:false (default
              lg_prof_sample 19): prof.active off vs on; and, in a second
              process, jemalloc with no prof option at all, to show what
              arming costs while inactive

Rounds alternate off/on in the same process (start/stop through
collectors.heapcontrol, i.e. the engine) so drift on a shared box hits both;
the figure is the median of the per-round ratios.

    python bench/heapprof_cost.py [--rounds 5] [--seconds 1.0]
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import build_c, start  # noqa: E402
from collectors import heapcontrol

JE_ARMED = "prof:true,prof_active:false"


def rate(t, seconds):
    t.proc.stdin.write(f"rate {seconds}\n".encode())
    t.proc.stdin.flush()
    answer = t.proc.stdout.readline().decode().split()
    assert answer[0] == "OK", answer
    return float(answer[1])


def alternate(exe, allocator, env, rounds, seconds):
    """[(off ops/s, on ops/s)] per round, profiler switched by heapcontrol."""
    out = []
    with start([exe], allocator=allocator, env=env) as t:
        rate(t, seconds / 2)                    # warm-up
        for _ in range(rounds):
            off = rate(t, seconds)
            heapcontrol.start(t.pid)
            on = rate(t, seconds)
            heapcontrol.stop(t.pid)
            out.append((off, on))
    return out


def plain(exe, allocator, env, rounds, seconds):
    with start([exe], allocator=allocator, env=env) as t:
        rate(t, seconds / 2)
        return [rate(t, seconds) for _ in range(rounds)]


def report(name, pairs):
    off = statistics.median(p[0] for p in pairs)
    on = statistics.median(p[1] for p in pairs)
    ratios = [p[1] / p[0] for p in pairs]
    added_us = statistics.median(1e6 / p[1] - 1e6 / p[0] for p in pairs)
    print(f"{name}\n  off {off / 1e6:7.3f} M ops/s   on {on / 1e6:7.3f} M ops/s   "
          f"on/off {statistics.median(ratios):.4f}x (median of {len(pairs)} rounds, range "
          f"{min(ratios):.4f}-{max(ratios):.4f}); added per op {added_us:.3f} us")
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = ap.parse_args()
    exe = build_c(os.path.join(HERE, "heapprof_churn.c"), "-lpthread", name="heapprof_churn")
    report("gperftools heap profiler", alternate(exe, "tcmalloc", None, args.rounds, args.seconds))
    armed_off = report(f"jemalloc prof.active ({JE_ARMED})",
                       alternate(exe, "jemalloc", {"MALLOC_CONF": JE_ARMED}, args.rounds,
                                 args.seconds))
    bare = statistics.median(plain(exe, "jemalloc", None, args.rounds, args.seconds))
    print(f"jemalloc without any prof option (another process)\n  {bare / 1e6:7.3f} M ops/s   "
          f"armed-but-inactive / without: {armed_off / bare:.2f}x")


if __name__ == "__main__":
    main()
