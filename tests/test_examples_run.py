"""Run every example workload briefly and check, straight from /proc, that it
produces the situation it is meant to reproduce.

Small size parameters keep each run to a few seconds and < 100 MiB; every
child is stopped (process group SIGTERM, then SIGKILL) in ``finally``.  The
checks read /proc directly on purpose: allocdiag's own collectors are tested
elsewhere, and these tests must tell "the example is broken" apart from "the
collector is broken".
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from examples import launch
from examples.launch import (ALLOCATORS, WORKLOADS, LaunchError, parse_fields, start,
                             stop, wait_line, wait_ready)

MiB = 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "examples", "launch.py")


def kib_fields(path):
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
    return out


def vmrss(pid):
    return kib_fields(f"/proc/{pid}/status")["VmRSS"]


def maps(pid):
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


@contextlib.contextmanager
def running(workload, allocator="glibc", args=(), env=None, timeout=60):
    """Start WORKLOAD, yield (proc, READY fields); always stopped afterwards."""
    try:
        proc = start(workload, allocator, env=env, args=args)
    except LaunchError as e:
        # name the package (tools/packages.txt) rather than skipping
        pytest.fail(f"{e} (sh tools/bootstrap.sh test installs the packages in "
                    "tools/packages.txt)", pytrace=False)
    try:
        yield proc, parse_fields(wait_ready(proc, timeout))
    finally:
        stop(proc)


# --- the launcher itself -----------------------------------------------------------

def test_registry_lists_every_workload_with_its_source():
    expected = {"alloc_wall", "footprint", "staircase", "lying_rss", "glibc_held",
                "arena_sprawl", "preload_mistakes", "burst_idle"}
    assert expected <= set(WORKLOADS)
    for w in WORKLOADS.values():
        assert os.path.exists(os.path.join(ROOT, "examples", w.source)), w.source
        assert w.language in ("python", "c")
        assert w.description and w.shows and w.ready.startswith("READY")
        assert set(w.as_dict()) >= {"name", "description", "language", "shows"}


def test_missing_allocator_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(ALLOCATORS, "jemalloc", ("/nonexistent/libjemalloc.so.2",
                                                 "libjemalloc2"))
    with pytest.raises(LaunchError, match=r"/nonexistent/libjemalloc.so.2.*not installed"):
        start("glibc_held", "jemalloc")
    with pytest.raises(LaunchError, match="unknown allocator"):
        start("glibc_held", "nosuchalloc")


def test_lying_rss_gets_its_malloc_conf_only_under_jemalloc():
    env = launch.child_env("lying_rss", "glibc")
    assert "MALLOC_CONF" not in env and "LD_PRELOAD" not in env
    if os.path.exists(ALLOCATORS["jemalloc"][0]):
        env = launch.child_env("lying_rss", "jemalloc")
        assert env["MALLOC_CONF"] == launch.LAZY_JEMALLOC_CONF
        assert env["LD_PRELOAD"] == ALLOCATORS["jemalloc"][0]
        env = launch.child_env("lying_rss", "jemalloc", {"MALLOC_CONF": "x:1"})
        assert env["MALLOC_CONF"] == "x:1"


def test_cli_prints_pid_then_ready_and_stops_on_sigint():
    proc = subprocess.Popen([sys.executable, LAUNCH, "glibc_held", "--count", "2000"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline().split()
        assert first[0] == "PID" and first[1].isdigit()
        child = int(first[1])
        ready = proc.stdout.readline().split()
        assert ready[:2] == ["READY", "glibc_held"]
        assert parse_fields(" ".join(ready[2:]))["allocations"] == "2000"
        assert os.path.exists(f"/proc/{child}")
        proc.send_signal(signal.SIGINT)          # forwarded; the child exits 0
        assert proc.wait(10) == 0
        time.sleep(0.1)
        assert not os.path.exists(f"/proc/{child}") or \
            "zombie" in open(f"/proc/{child}/status").read()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- the Python workloads: they start, report, and look like what they claim ------

def test_alloc_wall_reports_throughput_and_percentiles():
    with running("alloc_wall", args=["--seconds", "0.3"]) as (proc, f):
        assert int(f["ops_s"]) > 0 and int(f["pooled_ops_s"]) > 0
        assert 0 < float(f["p50_us"]) <= float(f["p99_us"]) <= float(f["p999_us"])
        results = [l for l in proc.reader.lines if l.startswith("RESULT")]
        assert len(results) == 2


def test_footprint_reports_memory():
    with running("footprint", args=["--records", "3000", "--settle", "0.1"]) as (proc, f):
        assert int(f["records"]) == 3000
        assert int(f["peak_rss"]) >= int(f["rss"]) > 0
        assert int(f["rss"]) == pytest.approx(vmrss(proc.pid), rel=0.25)


def test_staircase_serves_stats_on_localhost_and_holds_more_than_live():
    args = ["--requests", "1500", "--live", "300", "--idle-seconds", "0.5",
            "--phases", "2"]
    with running("staircase", args=args) as (proc, f):
        port = int(f["port"])
        idle = parse_fields(wait_line(proc, "PHASE idle", 30))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
            stats = r.read().decode()
        assert '"live_bytes"' in stats
        # Idle: 10% of the buffers are live, the heap still holds the peak.
        assert int(idle["rss"]) > 2 * int(idle["live_bytes"])
        wait_line(proc, "PHASE load", 30)        # the second load phase starts


# --- the C workloads: the situation, measured from /proc ---------------------------

def assert_lazyfree_majority(pid):
    lazy = kib_fields(f"/proc/{pid}/smaps_rollup").get("LazyFree", 0)
    anon = kib_fields(f"/proc/{pid}/status")["RssAnon"]
    assert lazy > 0.5 * anon, f"LazyFree {lazy / MiB:.1f} MiB of RssAnon {anon / MiB:.1f} MiB"
    return lazy


def test_lying_rss_jemalloc_lazyfree_is_most_of_rss_anon():
    with running("lying_rss", "jemalloc", args=["--mib", "96"]) as (proc, f):
        assert f["mode"] == "allocator"
        lazy = assert_lazyfree_majority(proc.pid)
        assert lazy > 64 * MiB
        assert environ(proc.pid)["MALLOC_CONF"] == launch.LAZY_JEMALLOC_CONF


def test_lying_rss_madvise_mode_works_under_glibc():
    with running("lying_rss", args=["--madvise", "--mib", "64"]) as (proc, f):
        assert f["mode"] == "madvise"
        assert "jemalloc" not in maps(proc.pid)
        assert assert_lazyfree_majority(proc.pid) > 48 * MiB


def test_burst_idle_kept_by_tcmalloc_and_mimalloc_returned_by_glibc():
    """The freed burst (60 of 64 MiB) stays resident under tcmalloc (page
    heap, TCMALLOC_RELEASE_RATE=0 by default here) and mimalloc (committed,
    idle), and leaves at once under glibc (mmapped 512 KiB blocks)."""
    args = ["--mib", "64"]
    with running("burst_idle", "glibc", args=args) as (proc, f):
        assert int(f["freed"]) > 56 * MiB
        assert vmrss(proc.pid) < 24 * MiB
    for alloc in ("tcmalloc", "mimalloc"):
        with running("burst_idle", alloc, args=args) as (proc, f):
            assert vmrss(proc.pid) > 56 * MiB, alloc
            if alloc == "tcmalloc":
                assert environ(proc.pid)["TCMALLOC_RELEASE_RATE"] == "0"


def test_glibc_held_trim_returns_the_held_memory():
    with running("glibc_held", args=["--count", "40000", "--trim"]) as (proc, f):
        held = int(f["held"])
        assert held > 40 * MiB                    # ~65 MiB of free chunks in bins
        assert int(f["keepcost"]) < 4 * MiB       # ... but not at the top
        before = vmrss(proc.pid)
        os.kill(proc.pid, signal.SIGUSR1)
        t = parse_fields(wait_line(proc, "TRIM", 20))
        after = vmrss(proc.pid)
        released = int(t["released"])
        assert released >= 32 * MiB
        # Cross-check the target's own numbers against /proc/PID/status.
        assert before - after >= 32 * MiB
        assert abs((before - after) - released) < 8 * MiB


HEAP_MAX = 64 * MiB
MAP_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\d+)\s*(.*)$")


def glibc_heaps(pid):
    """Non-main glibc arena heaps in /proc/PID/maps.

    A heap is mmapped as a 64 MiB-aligned, 64 MiB reservation (HEAP_MAX_SIZE):
    an anonymous rw-p mapping for the part in use, followed by ---p for the
    rest.  Measure: anonymous rw-p mappings starting on a 64 MiB boundary whose
    contiguous anonymous (rw-p then ---p) run covers >= 64 MiB.  Robust: thread
    stacks, jemalloc/mimalloc regions and the brk heap do not have this shape
    (the brk heap is named [heap]), and it needs no symbols or ptrace.
    """
    heaps = []
    cand = None
    for line in maps(pid).splitlines():
        m = MAP_RE.match(line)
        if not m:
            continue
        s, e, perms, inode, path = (int(m[1], 16), int(m[2], 16), m[3], int(m[4]),
                                    m[5].strip())
        anon = inode == 0 and not path
        if cand and anon and s == cand[1] and perms.startswith("---"):
            cand[1] = e
        else:
            cand = None
        if cand is None and anon and s % HEAP_MAX == 0 and perms.startswith("rw"):
            cand = [s, e]
        if cand and cand[1] - cand[0] >= HEAP_MAX:
            heaps.append(cand[0])
            cand = None
    return heaps


IDLE_SYSCALLS = {0, 35, 230}        # read, nanosleep, clock_nanosleep (x86-64)


def test_arena_sprawl_many_heaps_and_threads_parked_in_idle_waits():
    threads = 32
    with running("arena_sprawl", args=["--threads", str(threads), "--ops", "2000"]) \
            as (proc, f):
        heaps = glibc_heaps(proc.pid)
        cpus = len(os.sched_getaffinity(proc.pid))
        # glibc 2.36 caps arenas at 8 x CPUs (affinity) incl. the main arena.
        expected = min(threads, 8 * cpus - 1)
        assert len(heaps) >= expected
        assert int(f["heaps"]) == len(heaps)
        assert int(f["arenas"]) >= expected
        # Every thread is parked in a restartable idle wait, never futex/epoll
        # (polled briefly: the main thread may still be between READY and
        # its nanosleep).
        tasks = os.listdir(f"/proc/{proc.pid}/task")
        assert len(tasks) == threads + 1
        deadline = time.monotonic() + 5
        while True:
            calls = {tid: task_syscall(proc.pid, tid) for tid in tasks}
            bad = {t: nr for t, nr in calls.items() if nr not in IDLE_SYSCALLS}
            if not bad or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not bad, bad


def task_syscall(pid, tid):
    """Syscall number a task is blocked in, or None ("running")."""
    with open(f"/proc/{pid}/task/{tid}/syscall") as fh:
        nr = fh.read().split()[0]
    return int(nr) if nr.lstrip("-").isdigit() else None


def test_arena_sprawl_arena_max_knob_collapses_the_heaps():
    env = {"MALLOC_ARENA_MAX": "2"}
    with running("arena_sprawl", args=["--threads", "8", "--ops", "500"], env=env) \
            as (proc, f):
        assert len(glibc_heaps(proc.pid)) == 1 == int(f["arenas"])


# --- preload mistakes ------------------------------------------------------------

def preload(scenario, timeout=60):
    return running("preload_mistakes", args=[scenario], timeout=timeout)


def symbols(path, dynamic=False):
    """{name: nm type letter} of PATH's .symtab (or .dynsym); versions dropped."""
    cmd = ["nm", "-D", path] if dynamic else ["nm", path]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            syms[parts[-1].split("@")[0]] = parts[-2]
    return syms


def test_preload_typo_not_mapped_and_typo_in_environ():
    with preload("typo") as (proc, f):
        assert f["jemalloc_mapped"] == "0"
        assert "jemalloc" not in maps(proc.pid)
        assert environ(proc.pid)["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libjemaloc.so.2"
        assert f["malloc_from"].endswith("libc.so.6")


@pytest.mark.skipif(os.geteuid() != 0, reason="setuid scenario needs root (chown + "
                    "a real uid that differs from the file owner)")
def test_preload_setuid_secure_exec_drops_the_preload():
    with preload("setuid") as (proc, f):
        assert "jemalloc" not in maps(proc.pid)
        assert environ(proc.pid)["LD_PRELOAD"].endswith("/libjemalloc.so.2")
        uids = kib_line(proc.pid, "Uid")
        assert uids[0] == "0" and uids[1] == "65534"     # real root, effective nobody
        assert f["preload"] == "-"                       # ld.so scrubbed it


def kib_line(pid, key):
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return line.split()[1:]
    return []


def test_preload_dlopen_maps_jemalloc_but_malloc_stays_glibc():
    with preload("dlopen") as (proc, f):
        assert "libjemalloc.so.2" in maps(proc.pid)
        assert f["malloc_from"].endswith("libc.so.6")
        assert "LD_PRELOAD" not in environ(proc.pid)


def exe_of(pid):
    return os.readlink(f"/proc/{pid}/exe")


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils (nm) not installed")
def test_preload_static_mallctl_in_executable():
    with preload("static") as (proc, f):
        syms = symbols(exe_of(proc.pid))
        assert syms.get("mallctl") == "T" and syms.get("malloc") == "T"
        assert f["malloc_from"] == "exe"
        assert "jemalloc" not in maps(proc.pid)
        dyn = symbols(exe_of(proc.pid), dynamic=True)
        assert dyn.get("malloc") == "T"           # exported: libc.so binds to it


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils (nm) not installed")
def test_preload_prefixed_rjem_symbols_only():
    with preload("prefixed") as (proc, f):
        syms = symbols(exe_of(proc.pid))
        assert syms.get("_rjem_mallctl") == "T" and syms.get("_rjem_malloc") == "T"
        assert "mallctl" not in syms
        assert syms.get("malloc") == "U"          # the C code's malloc is glibc's
        assert f["malloc_from"].endswith("libc.so.6")
        assert int(f["rjem_allocated"]) >= 256 * 16384


@pytest.mark.needs_go
def test_preload_go_binary_ignores_preload():
    import deps
    deps.go()
    with preload("go", timeout=120) as (proc, f):
        exe = exe_of(proc.pid)
        with open(exe, "rb") as fh:
            blob = fh.read()
        assert b"Go BuildID" in blob or b"\xff Go buildinf:" in blob
        assert "jemalloc" not in maps(proc.pid)
        assert environ(proc.pid)["LD_PRELOAD"].endswith("libjemalloc.so.2")
        assert int(f["heap_alloc"]) > 16 * MiB
