#!/usr/bin/env python3
"""What ``allocdiag wall`` costs (issue 20 item 8).

A target (tests/targets/wall_target.c ``mix N``: N threads alternating a
compute phase and a malloc/free batch, printing its cumulative operation
count every 0.2 s) runs with 2 and with 8 busy threads.  Windows of
--seconds alternate: sampled by ``allocdiag wall`` at the default rate
(a subprocess, as a user runs it: CPU clock, switches, faults, syscalls,
counters), then not sampled; --rounds of each.  Printed per thread count:

- the target's throughput with sampling / without (interleaved windows: the
  VM shares its CPUs with other work, so only the ratio in one run counts);
- allocdiag's own CPU time per second of window while it samples (the
  window's reader_cpu_s), and including its start-up and the two counter
  reads (its rusage as a child);
- allocdiag's peak RSS for a short and for a 4x longer window (bounded:
  the two should be close).

Usage: python bench/wall_cost.py [--rounds 3] [--seconds 3] [--threads 2,8]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import checkout  # noqa: E402
checkout.use()
import targets  # noqa: E402

CLI = os.path.join(os.path.dirname(sys.executable), "allocdiag")


class Ops:
    def __init__(self, proc):
        self.rows = []
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, f):
        for raw in iter(f.readline, b""):
            p = raw.split()
            if p[:1] == [b"T"] and len(p) == 5:
                self.rows.append((int(p[1]) / 1e9, int(p[4])))

    def rate(self, t0, t1):
        inside = [r for r in self.rows if t0 <= r[0] <= t1]
        if len(inside) < 2:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def child_usage():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss


def sampled_window(pid, seconds):
    """(window start, end in CLOCK_MONOTONIC s, allocdiag's CPU per second of
    window while sampling, its CPU incl. start-up and counter reads, peak RSS)."""
    cpu0, _ = child_usage()
    t0 = time.monotonic()
    r = subprocess.run([CLI, "wall", "--duration", str(seconds), "--json", str(pid)],
                       capture_output=True, text=True, check=False)
    t1 = time.monotonic()
    cpu1, maxrss = child_usage()
    win = json.loads(r.stdout)["window"]
    start = win["start"] + (time.monotonic() - time.time())
    end = start + win["duration_s"]
    return start, end, win["reader_cpu_s"] / win["duration_s"], (cpu1 - cpu0) / (t1 - t0), maxrss


def measure(exe, threads, rounds, seconds):
    on, off, cpu, cpu_all = [], [], [], []
    with targets.start([exe, "mix", str(threads)]) as t:
        ops = Ops(t.proc)
        time.sleep(1.0)
        for _ in range(rounds):
            # "off" is measured before "on" so neither follows allocdiag's start-up
            a = time.monotonic()
            time.sleep(seconds)
            b = time.monotonic()
            start, end, frac, frac_all, _ = sampled_window(t.pid, seconds)
            off.append(ops.rate(a, b))
            on.append(ops.rate(start, end))            # the sampling window proper
            cpu.append(frac)
            cpu_all.append(frac_all)
        rss_short = child_usage()[1]
        sampled_window(t.pid, seconds * 4)
        rss_long = child_usage()[1]
    ratios = [x / y for x, y in zip(on, off) if x and y]
    return (statistics.median(ratios), statistics.median(cpu), statistics.median(cpu_all),
            rss_short, rss_long)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", default="2,8")
    args = ap.parse_args()
    exe = targets.build_c("wall_target.c", "-lpthread")
    print(f"{'threads':>7}  {'throughput on/off':>17}  {'allocdiag CPU sampling':>22}  "
          f"{'incl. start-up':>14}  {'peak RSS window / 4x':>20}")
    for n in (int(x) for x in args.threads.split(",")):
        ratio, cpu, cpu_all, short, long_ = measure(exe, n, args.rounds, args.seconds)
        print(f"{n:>7}  {ratio:>16.3f}x  {100 * cpu:>20.1f} %  {100 * cpu_all:>12.1f} %  "
              f"{short / 1024:>9.1f} / {long_ / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
