#!/usr/bin/env python3
"""What ``allocdiag record`` and the exporter cost a busy host (issue 23 items 4-5).

A saturated 2-core box running redis-server under redis-benchmark pays for
every millisecond allocdiag spends per snapshot: its burst delays the
server's requests.  Printed:

1. CPU per snapshot of ``record`` (the sampler ``record`` uses, and writing
   the line), measured in this process with getrusage (user + system)
   around each snapshot, snapshots 0.2 s apart: the first, and the median
   of snapshots 2..N, for redis-server idle and under redis-benchmark,
   attached and --no-attach, for a 2-thread malloc/free churn target
   under glibc, jemalloc and gperftools tcmalloc, and for a pool of 200
   idle threads under jemalloc; and the command itself
   (``record --interval 0.2``, its CPU from /proc).  Goal: <= 5 ms after
   the first.
2. CPU of one exporter scrape of a procfs holding redis-server alone, with
   and without it as live target, and the difference: what a live target
   adds per scrape (re-read at every scrape here; the real exporter
   re-reads it every --refresh seconds).  Goal: <= 5 ms after the first.
3. redis-benchmark's p99.9 latency (GET and SET on 127.0.0.1, a bounded
   number of requests) with and without ``allocdiag record --interval 1``
   running (started before, so its start-up is outside the run), with the
   anchor: the least any observer of the kernel's view does, one `cat` of
   the server's smaps_rollup a second, and with the null observer: one
   `cat` of /proc/self/status a second, a process woken on the saturated
   host that touches nothing of the server.  Alternated --runs times:
   whether the median with record lies within the spread of the runs
   without it, within the null observer's and within the anchor's, and
   whether the null observer's own median lies within the spread without.
4. The peak RSS (VmHWM) of a process that records --long snapshots of
   redis-server back to back (``diag.recording.record`` with no pause: an
   hour of ``--interval 1`` is 3,600), read after snapshot 50, half-way and
   at the end.  Goal: <= 80 MiB, and not growing with the count.

It measures the checkout it is in (PYTHONPATH set to it, for the commands
it starts too); compare two versions by running it with PYTHONPATH set to
each checkout.

Usage: python bench/record_cost.py [--snapshots 40] [--runs 4] [--requests 200000]
                                    [--long 3600] [--sections 1234]
"""

import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import checkout  # noqa: E402
checkout.use()
import servers  # noqa: E402
import targets  # noqa: E402

CLI = os.path.join(os.path.dirname(sys.executable), "allocdiag")
GOAL_MS = 5.0
RSS_GOAL_MIB = 80
# redis-benchmark: parallel clients of the load, and the p99.9 line it prints
CLIENTS = 50
P999 = re.compile(r"^\s*(99\.9\d*)% <= ([\d.]+) milliseconds", re.M)
CHURN_THREADS = 2
CHURN_ALLOCATORS = ("glibc", "jemalloc", "tcmalloc")
POOL_THREADS = 200      # tests/targets/small_stacks.c: 8 in read(), the rest in condition waits
# the command measured as a user runs it: its shortest interval
COMMAND_INTERVAL_S = 0.2
# between two snapshots measured in this process (as a recording sleeps)
GAP_S = COMMAND_INTERVAL_S
STAT_UTIME, STAT_STIME = 11, 12        # proc(5) fields 14 and 15, counted after "(comm)"
# exporter: how soon a live target is due again (longer than one read takes)
REFRESH_S = 0.1


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_snapshot_ms(pid, count, no_attach):
    """[CPU ms] of COUNT snapshots as ``record`` takes and writes them, GAP_S
    apart (back to back, with every cache of the CPU warm, one costs ~40 %
    less: not what a recording pays)."""
    from diag import recording
    sample = recording._default_sampler(no_attach)
    out = []
    with tempfile.TemporaryDirectory() as tmp, \
            recording.Recorder(os.path.join(tmp, "r.jsonl")) as rec:
        for _ in range(count):
            t0 = cpu_s()
            rec.write(sample(pid))
            out.append((cpu_s() - t0) * 1e3)
            time.sleep(GAP_S)
    return out


def line(label, ms):
    later = statistics.median(ms[1:])
    flag = "ok" if later <= GOAL_MS else "OVER"
    print(f"  {label:34s} first {ms[0]:6.1f} ms   2..N median {later:5.2f} ms  "
          f"p90 {sorted(ms[1:])[int(0.9 * (len(ms) - 2))]:5.2f} ms   [{flag}]", flush=True)


def load(port, requests=10 ** 9):
    return subprocess.Popen(["redis-benchmark", "-p", str(port), "-c", str(CLIENTS), "-q",
                             "-n", str(requests), "-t", "set,get"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def record_cpu(srv, count):
    print(f"1. record: CPU per snapshot ({count} snapshots; getrusage, user + system)")
    for loaded in (False, True):
        bench = load(srv.port) if loaded else None
        try:
            if bench:
                time.sleep(1)
            for no_attach in (False, True):
                label = (f"redis {'under load' if loaded else 'idle':10s} "
                         f"{'--no-attach' if no_attach else 'attached'}")
                line(label, per_snapshot_ms(srv.pid, count, no_attach))
        finally:
            if bench:
                stop(bench)
    command_cpu(srv, count)
    exe = targets.build_c("remote_churn.c", "-pthread", "-ldl")
    for allocator in CHURN_ALLOCATORS:
        with targets.start([exe, str(CHURN_THREADS), "1"], allocator=allocator) as t:
            line(f"churn x{CHURN_THREADS} {allocator} attached",
                 per_snapshot_ms(t.pid, count, False))
    # a thread pool: nothing a snapshot does after the first may grow with the threads
    pool = targets.build_c("small_stacks.c", "-pthread")
    with targets.start([pool, str(POOL_THREADS), "8", "64"], allocator="jemalloc",
                       timeout=30) as t:
        line(f"pool x{POOL_THREADS} jemalloc attached", per_snapshot_ms(t.pid, count, False))


def child_cpu_s(pid):
    """utime + stime of PID from /proc/PID/stat (clock ticks: 10 ms steps)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[STAT_UTIME]) + int(fields[STAT_STIME])) / os.sysconf("SC_CLK_TCK")


def command_cpu(srv, count):
    """The command itself: ``allocdiag record --interval 0.2`` (redis idle),
    its CPU from snapshot 2 to COUNT over the snapshots in between (a mean:
    the kernel counts CPU in clock ticks)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.jsonl")
        rec = subprocess.Popen([CLI, "record", str(srv.pid), "-o", path, "--interval",
                                str(COMMAND_INTERVAL_S)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            marks = {}
            deadline = time.monotonic() + count * COMMAND_INTERVAL_S * 4 + 30
            while len(marks) < 2 and time.monotonic() < deadline and rec.poll() is None:
                n = written(path)
                for mark in (2, count):
                    if n >= mark and mark not in marks:
                        marks[mark] = (n, child_cpu_s(rec.pid))
                time.sleep(COMMAND_INTERVAL_S / 4)
        finally:
            stop(rec)
    if len(marks) < 2:
        print("  allocdiag record (the command): did not get to snapshot", count)
        return
    (n0, c0), (n1, c1) = marks[2], marks[count]
    print(f"  {'allocdiag record (command), idle':34s} mean of snapshots 2..{n1}: "
          f"{(c1 - c0) / (n1 - n0) * 1e3:5.2f} ms", flush=True)


def scrape_cpu(srv, count):
    """The exporter's scrape of a host whose procfs holds redis-server alone
    (a directory with /proc/PID linked in: the whole-host scan of the other
    processes is diag.hostscan's cost, the same with or without a target)."""
    from diag import exporter
    print(f"2. exporter: CPU of one scrape of a procfs holding redis alone ({count} scrapes; "
          "the target re-read at every scrape)")
    # the target is due again by the next scrape, not within one (a one-shot
    # scrape reads every due target)
    every = {"refresh_s": REFRESH_S, "min_gap_s": 0.0, "max_pause_ms_per_minute": 1e9}
    runs = {}
    with tempfile.TemporaryDirectory() as root:
        os.symlink(f"/proc/{srv.pid}", os.path.join(root, str(srv.pid)))
        for name, live in (("/proc only", ()), ("redis as live target", (srv.pid,))):
            col = exporter.AllocdiagCollector(
                exporter.Options(proc=root, targets=live, **every), sync=True)
            ms = []
            for _ in range(count):
                t0 = cpu_s()
                col.collect()
                ms.append((cpu_s() - t0) * 1e3)
                time.sleep(REFRESH_S)
            runs[name] = ms
            line(name, ms)
    added = [a - b for a, b in zip(runs["redis as live target"], runs["/proc only"])]
    line("what the live target adds", added)


def p999(port, requests):
    """{test: p99.9 ms} of one bounded redis-benchmark run."""
    r = subprocess.run(["redis-benchmark", "-p", str(port), "-c", str(CLIENTS), "-n",
                        str(requests), "-t", "set,get", "--precision", "3"],
                       capture_output=True, text=True, check=False)
    out = {}
    for block in r.stdout.split("====== ")[1:]:
        name = block.split(" ", 1)[0]
        m = P999.search(block)
        if m:
            out[name] = float(m.group(2))
    return out


def written(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


# The anchors of section 3, each once a second: the least any observer of
# the kernel's view of the server does (one `cat` of its smaps_rollup), and
# the least any observer at all does (one `cat` of a file of its own, that
# touches nothing of the server: a process woken on a saturated host).
ANCHORS = {
    "anchor": "while :; do cat /proc/{pid}/smaps_rollup > /dev/null; sleep 1; done",
    "null": "while :; do cat /proc/self/status > /dev/null; sleep 1; done",
}


def latency(srv, runs, requests):
    print(f"3. redis-benchmark p99.9 ({requests} requests per test, {CLIENTS} clients), "
          f"without / with `allocdiag record --interval 1` / with the anchor (a `cat` of "
          f"its smaps_rollup once a second) / with the null observer (a `cat` of "
          f"/proc/self/status once a second), alternated")
    modes = ("without", "with", "anchor", "null")
    got = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            for mode in modes:
                rec = None
                if mode == "with":
                    path = os.path.join(tmp, f"r{i}.jsonl")
                    rec = subprocess.Popen([CLI, "record", str(srv.pid), "-o", path,
                                            "--interval", "1"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    deadline = time.monotonic() + 30
                    while written(path) < 2 and time.monotonic() < deadline:
                        time.sleep(0.1)     # its start-up and first snapshot are over
                elif mode in ANCHORS:
                    rec = subprocess.Popen(["sh", "-c", ANCHORS[mode].format(pid=srv.pid)],
                                           start_new_session=True)
                    time.sleep(0.5)
                try:
                    res = p999(srv.port, requests)
                finally:
                    if rec and mode in ANCHORS:
                        os.killpg(rec.pid, signal.SIGKILL)      # the shell and its sleep
                        rec.wait()
                    elif rec:
                        stop(rec)
                got[mode].append(res)
                print(f"  run {i + 1} {mode:7s} " +
                      "  ".join(f"{k} {v:.3f} ms" for k, v in sorted(res.items())), flush=True)
    for test in sorted({k for r in got["without"] for k in r}):
        off, on, anchor, null = ([r[test] for r in got[m] if test in r] for m in modes)
        if not off or not on:
            continue
        with_ = statistics.median(on)

        def spread(xs):
            return (f"median {statistics.median(xs):.3f} ms ({min(xs):.3f}..{max(xs):.3f})"
                    if xs else "not measured")

        def verdict(xs, inside, above):
            return (inside if xs and with_ <= max(xs) else above) if xs else "-"
        print(f"  {test}: without {spread(off)}; with record {spread(on)}  "
              f"[{verdict(off, 'within the spread', 'ABOVE')}]")
        print(f"  {test}: null observer {spread(null)}  "
              f"[{'itself ABOVE the spread without' if null and statistics.median(null) > max(off) else 'within the spread without'}; "
              f"{verdict(null, 'record within it', 'record ABOVE it')}]; anchor {spread(anchor)}  "
              f"[{verdict(anchor, 'record within it', 'record ABOVE it')}]")


# The long recording, in a process of its own (its RSS is the figure).
LONG_CHILD = """
import sys
from diag import recording
pid, path, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
marks, done = {50, n // 2, n}, [0]


def hwm_kib():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM:"))


def progress(count, snap):
    done[0] = count
    if count in marks:
        print(count, hwm_kib(), flush=True)


recording.record(pid, path, interval=0.0, progress_cb=progress, stop=lambda: done[0] >= n)
"""


def long_rss(srv, count):
    print(f"4. peak RSS of a recording of {count} snapshots of redis (back to back, attached)")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-c", LONG_CHILD, str(srv.pid),
                            os.path.join(tmp, "long.jsonl.gz"), str(count)],
                           capture_output=True, text=True, check=False)
    marks = [tuple(int(x) for x in ln.split()) for ln in r.stdout.splitlines() if ln.strip()]
    if r.returncode or not marks:
        print("  failed:", r.stderr.strip().splitlines()[-1:] or r.returncode)
        return
    for n, kib in marks:
        print(f"  after snapshot {n:5d}: VmHWM {kib / 1024:6.1f} MiB")
    peak = marks[-1][1] / 1024
    grew = (marks[-1][1] - marks[0][1]) / 1024
    print(f"  peak {peak:.1f} MiB (goal <= {RSS_GOAL_MIB}), {grew:+.1f} MiB from snapshot "
          f"{marks[0][0]} to {marks[-1][0]}  [{'ok' if peak <= RSS_GOAL_MIB else 'OVER'}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--snapshots", type=int, default=40)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200000)
    ap.add_argument("--long", type=int, default=3600)
    ap.add_argument("--sections", default="1234", metavar="DIGITS",
                    help="which of the four measurements to run (default 1234)")
    args = ap.parse_args()
    with servers.redis() as srv:
        if "1" in args.sections:
            record_cpu(srv, args.snapshots)
        if "2" in args.sections:
            scrape_cpu(srv, args.snapshots)
        if "3" in args.sections:
            latency(srv, args.runs, args.requests)
        if "4" in args.sections:
            long_rss(srv, args.long)


if __name__ == "__main__":
    main()
