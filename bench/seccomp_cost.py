#!/usr/bin/env python3
"""What judging a call's syscalls costs under a seccomp filter
(collectors.engine.seccomp), against the same work on the same target
without a filter, measured in the same run:

  per syscall   a borrow makes N calls to libc getpid() (one syscall each);
                under a filter each is resumed with PTRACE_SYSEMU, stopped
                at its entry, judged, and made again (its entry and exit
                stops under PTRACE_SYSCALL): the extra µs per call
  no syscall    a borrow makes N calls to a function that makes no syscall
                (libc labs): what a filter costs a stats call that makes none
                (every allocator's, on an idle heap): nothing expected

Targets: tests/targets/seccomp_filter.c "log" (a filter that logs madvise and
allows everything else) and "none" (no filter), each after the same burst.
Rounds alternate between them so drift on a shared box hits both; figures
are medians over the rounds.

    python bench/seccomp_cost.py [--rounds 9] [--calls 200]
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
from collectors import livestats  # noqa: E402
from collectors.binary.image import ProcessImage  # noqa: E402
from collectors.engine.remote import RemoteProcess  # noqa: E402


def per_call_us(rp, fn, calls):
    """µs per call of FN() over CALLS calls in one borrow."""
    with rp.borrow() as c:
        t0 = time.perf_counter()
        for _ in range(calls):
            c.call(fn, 1)
        return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    exe = build_c("seccomp_filter.c")
    got = {(m, w): [] for m in ("log", "none") for w in ("getpid", "labs")}
    with start([exe, "log"]) as filtered, start([exe, "none"]) as plain:
        ends = {}
        for mode, t in (("log", filtered), ("none", plain)):
            res = livestats.Resolver(ProcessImage(t.pid))
            ends[mode] = (RemoteProcess(t.pid), {w: res.libc(w) for w in ("getpid", "labs")})
        for _ in range(args.rounds):
            for mode in ("log", "none"):
                rp, fns = ends[mode]
                for what, fn in fns.items():
                    got[(mode, what)].append(per_call_us(rp, fn, args.calls))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"median over {args.rounds} rounds of {args.calls} calls in one borrow, µs per call")
    print(f"{'':10s} {'filtered':>9s} {'no filter':>10s} {'extra':>7s} {'ratio':>6s}")
    for what, label in (("getpid", "getpid()"), ("labs", "labs()")):
        f, n = med[("log", what)], med[("none", what)]
        print(f"{label:10s} {f:9.1f} {n:10.1f} {f - n:7.1f} {f / n:6.2f}")
    print("getpid() makes one syscall (judged under the filter: two more stops and the "
          "filter run); labs() makes none")


if __name__ == "__main__":
    main()
