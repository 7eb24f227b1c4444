#!/usr/bin/env python3
"""What one allocdiag snapshot costs the target, next to gdb and to the same
work done in-process (measured in the same run).

(a) Serving threads: a target with N threads churning malloc/free records
    the longest gap between two iterations of each thread.  The gap is read
    over a quiet window (no snapshot), a window with one allocdiag snapshot,
    and a window with one `gdb -p PID -batch -ex 'call ...'` of the same
    allocator's stats (as a production box has it: no libc debug info).
    allocdiag stops no serving thread, so its window should look like the
    quiet one; gdb stops them all.
(b) The borrowed thread's own stop per full snapshot (pause_us) on an idle
    target and on a saturated one (4 churning threads per core), next to the
    in-process cost of the same calls under the same load (timed by the
    target itself, see pause_target.c).
(c) --stops: the borrowed thread's stop for the stats calls alone, per
    gather path, median and p95, idle and saturated, each next to the
    in-process cost of the same work in the same target:
      now      what a snapshot does (collectors/allocators): glibc one
               malloc_info; jemalloc one malloc_stats_print + 1 mallctl;
               gperftools GetStats (its two knobs read from memory: the
               thread-cache limit, and the decommit switch once a stop
               checked its address)
      repeat   the same with the per-process caches an allocdiag process
               keeps between snapshots (TUI, record): jemalloc prints the
               general section only every 10 s ("Jgdablxeh" between)
      percall  the per-call path: glibc mallinfo2 + malloc_info (two heap
               walks); jemalloc epoch + one mallctl per name; gperftools
               every property + GetStats
    Caches that live for one allocdiag process (jemalloc constants, the
    strcat IFUNC) are cleared before each stop, as a fresh `allocdiag
    inspect` has them.  glibc runs on a fragmented heap (--frag-mib).
    "in-process" is the target timing the work back to back (hot caches);
    "cold" one run after 0.2 s of idling, as a remote stop finds it.

(e) --snapshots: the borrowed thread's stop of a whole snapshot on an idle
    target, from a new allocdiag process each time (`allocdiag inspect
    --json`: nothing cached but what the disk cache holds) and from one
    allocdiag process (the TUI, record, the exporter), taken in turn (so
    each one-process stop comes ~0.3 s after the previous: caches and, on a
    VM, the vCPUs have gone cold, as a recording's have), then the same
    back to back (hot), next to the in-process cost of the same calls and
    to the box's floor: the same requests made from C (bench/floor_tracer.c:
    seize, registers, XSAVE area, masks, the frame, the calls, the text read
    back, all restored, detach; nothing between them), with the same idle
    before each stop and back to back (jemalloc, gperftools, and mimalloc's
    fmemopen/print/fclose path).  Goal (issue 23): median <= 0.3 ms
    for jemalloc, gperftools tcmalloc and mimalloc.

(d) --scratch: the stop of a snapshot whose output buffer is an anonymous
    mapping the borrowed thread makes and removes (Call.buffer on a thread
    without the stack room: one mmap and one munmap call more, and the
    buffer's first-touch page faults), next to the same snapshot with the
    buffer on the borrowed thread's stack (Call.buffer on a thread whose
    measured room holds it: the idle target's main thread), stop by stop in
    turn, on an idle target.

    python bench/pause.py [--allocators glibc,jemalloc,tcmalloc] [--threads 4] [--reps 15]
    python bench/pause.py --stops [--frag-mib 256] [--reps 30]
    python bench/pause.py --scratch [--allocators glibc,jemalloc,tcmalloc,mimalloc] [--reps 200]
    python bench/pause.py --snapshots [--allocators glibc,jemalloc,tcmalloc,mimalloc] [--reps 31]
Goals: (a) serving threads not stopped (>= 10x below gdb); (b) borrowed stop
<= 2 ms median idle and <= 2x in-process on a saturated target (issue 3);
(c) issue 9 item 8: glibc stop <= 1.3 x in-process malloc_info + 0.3 ms;
jemalloc and gperftools idle stop <= 0.5 ms median.
"""

import argparse
import json
import mmap
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from targets import build_c, start  # noqa: E402
from diag import snapshot
from collectors import allocators, livestats
from collectors.allocators import common
from collectors.allocators.jemalloc import reader as je_module
from collectors.allocators.gperftools import reader as tc_module
from collectors.allocators.mimalloc import reader as mi_module
from collectors.detect import detect  # noqa: E402
from collectors.binary.image import ProcessImage  # noqa: E402
from collectors.engine import rehearsal  # noqa: E402

GDB_CALL = {"glibc": "call (void) malloc_stats()",
            "jemalloc": "call (void) malloc_stats_print(0, 0, 0)",
            "tcmalloc": "call (void) tc_malloc_stats()"}


def window(gapmap, nthreads, action, settle=0.3):
    """Max gap (us) over all serving threads while ACTION runs."""
    gapmap[: 8 * nthreads] = b"\0" * (8 * nthreads)
    action()
    time.sleep(settle)
    gaps = struct.unpack(f"<{nthreads}Q", gapmap[: 8 * nthreads])
    return max(gaps) / 1000.0


def inproc_ns(t, reps, mode="now"):
    t.proc.stdin.write(f"time {reps} {mode}\n".encode())
    t.proc.stdin.flush()
    line = t.proc.stdout.readline().decode()
    return int(line.split()[1])


def run(allocator, nthreads, reps, gdb):
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, str(nthreads), gf.name], allocator=allocator, stderr=subprocess.DEVNULL) as t:
            gapmap = mmap.mmap(gf.fileno(), 4096)
            snapshot.take(t.pid)                         # warm caches
            quiet, ours, theirs, pauses = [], [], [], []
            for _ in range(reps):
                quiet.append(window(gapmap, nthreads, lambda: None))
                def snap():
                    s, _ = snapshot.take(t.pid)
                    pauses.append(s.collectors["remote"].pause_us)
                ours.append(window(gapmap, nthreads, snap))
            for _ in range(max(3, reps // 3)) if gdb else ():
                cmd = [gdb, "-p", str(t.pid), "-batch", "-nx", "-iex",
                       "set debug-file-directory /nonexistent", "-ex", GDB_CALL[allocator]]
                theirs.append(window(gapmap, nthreads, lambda: subprocess.run(
                    cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)))
            gapmap.close()
    return quiet, ours, theirs


def saturated(allocator, nthreads, reps):
    """Borrowed-thread stop and in-process cost of the same calls with
    NTHREADS churning threads (more than the cores: the box is saturated)."""
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, str(nthreads), gf.name], allocator=allocator, stderr=subprocess.DEVNULL) as t:
            snapshot.take(t.pid)
            pauses = [snapshot.take(t.pid)[0].collectors["remote"].pause_us for _ in range(reps)]
            inproc = inproc_ns(t, 50) / 1000.0
    return pauses, inproc


def idle_pause(allocator, reps):
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, "0", gf.name], allocator=allocator, stderr=subprocess.DEVNULL) as t:
            snapshot.take(t.pid)
            pauses = [snapshot.take(t.pid)[0].collectors["remote"].pause_us for _ in range(reps)]
            inproc = inproc_ns(t, 200) / 1000.0
    return pauses, inproc


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))] if xs else float("nan")


COLD_REPS, COLD_IDLE_S = 9, 0.2


def inproc_cold_us(t, mode):
    """In-process cost of one snapshot's work after the target idled
    COLD_IDLE_S (cold caches, as a remote stop finds them), median."""
    out = []
    for _ in range(COLD_REPS):
        time.sleep(COLD_IDLE_S)
        out.append(inproc_ns(t, 1, mode) / 1000.0)
    return med(out)


class Stopper:
    """Borrowed-thread stops (us) for the stats calls of one gather mode."""

    def __init__(self, pid, mode):
        image = ProcessImage(pid)
        det = detect(image)
        self.alloc, self.mode = det.allocator, mode
        self.mod = allocators.module(det.allocator.kind)
        res = livestats.Resolver(image)
        self.opts = {"glibc_xml": True, "per_arena": False,
                     "jemalloc_per_call": mode == "percall", "tcmalloc_per_call": mode == "percall"}
        self.plans = [self.mod.plan(res, det.serving, det.allocator, self.opts)]
        if det.allocator.kind == "glibc" and mode == "percall":
            # The former snapshot: mallinfo2, then malloc_info (two heap walks).
            self.plans.insert(0, self.mod.plan(res, det.serving, det.allocator,
                                               dict(self.opts, glibc_xml=False)))
        self.rp = livestats.open_remote(image, det, deadline_s=5.0,
                                        call_timeout_s=livestats.CALL_TIMEOUT_S,
                                        stack_need=self.mod.STACK_NEED)

    def once(self):
        if self.mode != "repeat":
            # A fresh `allocdiag inspect` has none of the per-process caches.
            je_module._constant_cache.clear()
            je_module._ifunc_cache.clear()
            forget_kept()
        with self.rp.borrow() as c:
            raws = [self.mod.gather(c, a, self.opts) for a in self.plans]
        for raw in raws:
            self.mod.parse(raw, self.alloc)
        return max(self.rp.pause_us)


def scratch_table(allocator, reps):
    """(d): {way: [stop us]} for 'mapped' and 'stack' buffers, in turn."""
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    out = {"mapped": [], "stack": []}
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, "0", gf.name, "0"], allocator=allocator, stderr=subprocess.DEVNULL,
                   timeout=120) as t:
            st = Stopper(t.pid, "repeat")
            st.once()
            for _ in range(reps):
                for way in out:
                    # the main thread has the room: the engine puts the
                    # buffer on its stack unless told to keep none spare
                    st.rp.STACK_BUFFER_SPARE = 1 << 40 if way == "mapped" else \
                        type(st.rp).STACK_BUFFER_SPARE
                    with st.rp.borrow() as c:
                        for a in st.plans:
                            st.mod.gather(c, a, st.opts)
                    out[way].append(max(st.rp.pause_us))
    return out


def print_scratch(allocators_, reps):
    print(f"== (d) output buffer outside the stack vs on it: idle target, {reps} stops each, in turn")
    for allocator in allocators_:
        us = scratch_table(allocator, reps)
        m, s_ = med(us["mapped"]), med(us["stack"])
        print(f"  {allocator:9} mapped buffer median {m:6.0f} us p95 {p95(us['mapped']):6.0f} us   "
              f"stack buffer median {s_:6.0f} us p95 {p95(us['stack']):6.0f} us   "
              f"ratio {m / max(s_, 1):.2f}  (+{m - s_:.0f} us)")


MODES = ("now", "repeat", "percall")
# pause_target's in-process twin of each mode.
INPROC_MODE = {("jemalloc", "repeat"): "repeat", ("tcmalloc", "repeat"): "repeat"}


def stop_table(allocator, nthreads, reps, frag_mib):
    """(c): per mode, (stop median, p95, in-process median) in us.  The modes
    take turns, stop by stop, so they see the same load on a shared box."""
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    frag = frag_mib if allocator == "glibc" else 0
    rows = {}
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, str(nthreads), gf.name, str(frag)], allocator=allocator,
                   stderr=subprocess.DEVNULL, timeout=120) as t:
            stoppers = {mode: Stopper(t.pid, mode) for mode in MODES}
            stoppers["repeat"].once()                            # fills its caches
            us = {mode: [] for mode in MODES}
            for _ in range(reps):
                for mode in MODES:
                    us[mode].append(stoppers[mode].once())
            for mode in MODES:
                twin = INPROC_MODE.get((allocator, mode), mode)
                rows[mode] = (med(us[mode]), p95(us[mode]), inproc_ns(t, reps, twin) / 1000.0,
                              inproc_cold_us(t, twin))
            if allocator == "glibc":
                rows["walk"] = (None, None, inproc_ns(t, reps, "walk") / 1000.0, None)
    return rows


def print_stops(allocator, frag_mib, reps):
    busy_threads = 4 * (os.cpu_count() or 2)
    heap = f", fragmented {frag_mib} MiB heap" if allocator == "glibc" else ""
    print(f"== {allocator}{heap}: borrowed-thread stop for the stats calls, {reps} stops each")
    for label, n in (("idle", 0), (f"saturated ({busy_threads} churning threads)", busy_threads)):
        rows = stop_table(allocator, n, reps, frag_mib)
        print(f"  {label}")
        for mode in MODES:
            m, p, inproc, cold = rows[mode]
            print(f"    {mode:8} stop median {m / 1000:7.2f} ms  p95 {p / 1000:7.2f} ms   "
                  f"in-process same work {inproc / 1000:7.2f} ms (cold {cold / 1000:.2f} ms)")
        if "walk" in rows:
            walk = rows["walk"][2]
            goal = 1.3 * walk + 300
            print(f"    goal: 1.3 x in-process malloc_info ({walk / 1000:.2f} ms) + 0.3 ms = "
                  f"{goal / 1000:.2f} ms; now {rows['now'][0] / 1000:.2f} ms "
                  f"({'met' if rows['now'][0] <= goal else 'NOT met'})")
        elif n == 0:
            print(f"    goal: idle median <= 0.50 ms; now {rows['now'][0] / 1000:.2f} ms "
                  f"({'met' if rows['now'][0] <= 500 else 'NOT met'})")


STOP_GOAL_US = 300          # issue 23: idle stop median, jemalloc, tcmalloc, mimalloc
RECORD_INTERVAL_S = 1.0     # the idle before a recording's stop (record --interval 1)


def fresh_stop_us(pid):
    """The borrowed thread's stop of one `allocdiag inspect --json` run
    (a new allocdiag process, as a user's command line has it)."""
    r = subprocess.run([sys.executable, "-m", "diag", "inspect", "--json", str(pid)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    doc = json.loads(r.stdout)
    return doc["collectors"]["remote"]["pause_us"]


def floor_call(pid):
    """(CALLS, STRING, BUF_BYTES, READ_BYTES) for bench/floor_tracer.c: the
    calls a snapshot of PID makes once its kept values are fresh, as
    [(FUNC, [ARG...])]: jemalloc's malloc_stats_print without the general
    section, gperftools' MallocExtension_GetStats, mimalloc's stats printed
    into an fmemopen stream (fmemopen, mi_stats_print_out, fclose); None
    for the others."""
    image = ProcessImage(pid)
    det = detect(image)
    mod = allocators.module(det.allocator.kind)
    a = mod.plan(livestats.Resolver(image), det.serving, det.allocator, {"per_arena": False})
    if mod is je_module and a.get("print") and a.get("strcat") and not a.get("strcat_ifunc"):
        return ([(a["print"], [hex(a["strcat"]), "B", "S"])],
                je_module.STATS_OPTS_NO_GENERAL.decode(), je_module.STATS_BUF,
                je_module.STATS_READ_FIRST)
    if mod is tc_module and a.get("stats"):
        return ([(a["stats"], ["B", str(tc_module.GETSTATS_BUF)])], "", tc_module.GETSTATS_BUF,
                tc_module.GETSTATS_READ_FIRST)
    if mod is mi_module and not a.get("mi_stats_get_json") and \
            all(a.get(k) for k in ("fmemopen", "mi_stats_print_out", "fputs", "fclose")):
        size = common.SCRATCH_TEXT
        return ([(a["fmemopen"], ["B", str(size), "S"]),
                 (a["mi_stats_print_out"], [hex(a["fputs"]), "R1"]),
                 (a["fclose"], ["R1"])], "w", size, mi_module.STATS_READ_FIRST)
    return None


def floor_stops(exe, pid, call, reps, gap_ms=0):
    """The floor tracer's REPS stops of PID (us), GAP_MS apart."""
    calls, string, buf_bytes, read_bytes = call
    argv = [exe, str(pid), str(reps), str(gap_ms), str(buf_bytes), str(read_bytes), string]
    for i, (func, args) in enumerate(calls):
        argv += (["--"] if i else []) + [hex(func), *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    return [float(x) for x in out.split("CALL")[0].split()]


def snapshot_table(allocator, reps):
    """(e): idle target; stops of whole snapshots from new allocdiag
    processes (the CLI: with nothing kept, then with the values an earlier
    run kept on disk) and from one allocdiag process (TUI, record,
    exporter; with and without the rehearsal), taken in turn, and the
    in-process cost of the same calls."""
    exe = build_c(os.path.join(HERE, "pause_target.c"), "-lpthread", "-ldl", name="pause_target")
    tracer = build_c(os.path.join(HERE, "floor_tracer.c"), name="floor_tracer")
    out = {k: [] for k in ("first", "unwarmed", "kept", "repeat", "unrehearsed", "hot",
                           "floor", "floor_hot")}
    with tempfile.NamedTemporaryFile(prefix="allocdiag-gaps-") as gf:
        gf.write(b"\0" * 4096)
        gf.flush()
        with start([exe, "0", gf.name], allocator=allocator, stderr=subprocess.DEVNULL,
                   timeout=120) as t:
            snapshot.take(t.pid)
            call = floor_call(t.pid)
            for _ in range(reps):
                # the two new-process rows alike: a second's idle, nothing kept
                forget_kept()
                time.sleep(RECORD_INTERVAL_S)
                out["first"].append(fresh_stop_us(t.pid))
                forget_kept()
                time.sleep(RECORD_INTERVAL_S)
                os.environ[rehearsal.ENV_NO_WARM_UP] = "1"
                try:
                    out["unwarmed"].append(fresh_stop_us(t.pid))
                finally:
                    del os.environ[rehearsal.ENV_NO_WARM_UP]
                out["kept"].append(fresh_stop_us(t.pid))
                # the target idles as long as under `record --interval 1`
                # before each of this process's stops (right after the CLI
                # run's stop it was still warm: 221 us there, 268 us in a
                # real recording, 2026-11-27)
                time.sleep(RECORD_INTERVAL_S)
                out["repeat"].append(snapshot.take(t.pid)[0].collectors["remote"].pause_us)
                time.sleep(RECORD_INTERVAL_S)
                os.environ[rehearsal.ENV_OFF] = "1"
                try:
                    out["unrehearsed"].append(
                        snapshot.take(t.pid)[0].collectors["remote"].pause_us)
                finally:
                    del os.environ[rehearsal.ENV_OFF]
                if call:
                    time.sleep(RECORD_INTERVAL_S)
                    out["floor"] += floor_stops(tracer, t.pid, call, 1)
            out["hot"] = [snapshot.take(t.pid)[0].collectors["remote"].pause_us
                          for _ in range(reps)]
            if call:
                out["floor_hot"] = floor_stops(tracer, t.pid, call, reps)
            inproc = {mode: inproc_ns(t, 50, mode) / 1000.0 for mode in ("now", "repeat")}
    return out, inproc


def forget_kept():
    """Forget the values snapshots keep per process, in memory and on disk
    (as `allocdiag set` does): the next run prints and reads everything."""
    je_module.forget_general()
    tc_module.forget_knobs()
    mi_module.forget_options()


def print_snapshots(allocators_, reps):
    print(f"== (e) borrowed-thread stop of a whole snapshot, idle target, {reps} each, in turn")
    for allocator in allocators_:
        s, inproc = snapshot_table(allocator, reps)
        rows = (("first", "new allocdiag process, nothing kept", "now"),
                ("unwarmed", "the same without the warm-up", "now"),
                ("kept", "new process, values kept < 10 s", "repeat"),
                ("repeat", "one allocdiag process (record, 1 s)", "repeat"),
                ("unrehearsed", "the same without the rehearsal", "repeat"),
                ("hot", "the same, back to back (hot)", None),
                ("floor", "floor: the same requests from C (1 s)", None),
                ("floor_hot", "floor: the same, back to back", None))
        for i, (key, label, mode) in enumerate(rows):
            if not s[key]:
                continue
            tail = f"   in-process same calls {inproc[mode]:5.0f} us" if mode else ""
            print(f"  {allocator if i == 0 else '':9} {label:37} median {med(s[key]):5.0f} us "
                  f"p95 {p95(s[key]):5.0f} us{tail}")
        if allocator != "glibc":
            verdict = ", ".join(f"{'met' if med(s[k]) <= STOP_GOAL_US else 'NOT met'} ({k})"
                                for k in ("first", "kept", "repeat"))
            print(f"  {'':9} goal: median <= {STOP_GOAL_US} us: {verdict}")
            # the box's own share: on a shared or nested guest the floor itself
            # moves by a third from one half hour to the next (bench/README.md)
            print(f"  {'':9} first / back-to-back: {med(s['first']) / med(s['hot']):.1f}x "
                  f"(back to back {med(s['hot']):.0f} us this run)")
            if s["floor"]:
                print(f"  {'':9} over the C floor: first {med(s['first']) / med(s['floor']):.1f}x, "
                      f"record {med(s['repeat']) / med(s['floor']):.1f}x, back to back "
                      f"{med(s['hot']) / med(s['floor_hot']):.1f}x; the C floor itself "
                      f"{'meets' if med(s['floor']) <= STOP_GOAL_US else 'misses'} the goal "
                      f"({med(s['floor']):.0f} us)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocators", default="glibc,jemalloc,tcmalloc")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-gdb", action="store_true")
    ap.add_argument("--stops", action="store_true", help="only (c): stops per gather path")
    ap.add_argument("--frag-mib", type=int, default=256)
    ap.add_argument("--snapshots", action="store_true",
                    help="only (e): whole-snapshot stops, new allocdiag process vs one")
    ap.add_argument("--scratch", action="store_true",
                    help="only (d): output buffer mapped vs on the stack")
    args = ap.parse_args()
    if args.scratch:
        print_scratch(args.allocators.split(","), args.reps)
        return
    if args.snapshots:
        print_snapshots(args.allocators.split(","), args.reps)
        return
    if args.stops:
        for allocator in args.allocators.split(","):
            print_stops(allocator, args.frag_mib, args.reps)
        return
    gdb = None if args.no_gdb else shutil.which("gdb")
    for allocator in args.allocators.split(","):
        quiet, ours, theirs = run(allocator, args.threads, args.reps, gdb)
        idle, idle_in = idle_pause(allocator, args.reps)
        busy_threads = 4 * (os.cpu_count() or 2)
        pauses, busy_in = saturated(allocator, busy_threads, args.reps)
        print(f"== {allocator}: {args.threads} serving threads churning malloc/free")
        print("  (a) longest serving-thread gap, median of windows:")
        print(f"      no snapshot        {med(quiet):9.0f} us")
        print(f"      allocdiag snapshot {med(ours):9.0f} us")
        if theirs:
            print(f"      gdb -batch call    {med(theirs):9.0f} us   "
                  f"gdb/allocdiag = {med(theirs) / max(med(ours), 1):.0f}x")
        print("  (b) borrowed thread stop per snapshot (pause_us), median:")
        print(f"      idle target        {med(idle):9.0f} us   in-process same calls {idle_in:7.0f} us")
        print(f"      saturated target   {med(pauses):9.0f} us   in-process same calls {busy_in:7.0f} us   "
              f"ratio {med(pauses) / max(busy_in, 1):.1f}x   ({busy_threads} churning threads)")


if __name__ == "__main__":
    main()
