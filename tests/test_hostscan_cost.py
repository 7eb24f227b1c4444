"""What a host scan reads (issue 23 item 3): only the files its columns need,
and, refreshed incrementally (the TUI host view), only the processes whose
/proc/PID/stat shows activity since the last scan.  Real processes, counted
reads (ProcFS.reads, HostScanner.rows_read/rows_kept); no timing here (the
times are bench/ps_scan.py's)."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import unpriv

from collectors.proc.stat import ACTIVITY_FIELDS, STAT_STARTTIME_AFTER_COMM, parse_stat_line
from diag import hostscan
from diag.source import HostSource
from targets import build_c, kernel_thread_pid, python_argv, start

IMAGE_FILES = {"maps", "environ", "auxv", "exe"}
BUSY = "print('READY', flush=True)\nwhile True: pass"


SETTLE_S, SETTLE_TIMEOUT_S = 0.05, 10


def settled(target):
    """TARGET once its stat stopped moving: after READY it still runs to its
    blocking read, and that last step must not count as activity."""
    def activity():
        with open(f"/proc/{target.pid}/stat", "rb") as f:
            return parse_stat_line(f.read()).activity
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last = activity()
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        now = activity()
        if now == last:
            return target
        last = now
    raise AssertionError(f"pid {target.pid} never went idle")


@pytest.fixture
def idle():
    with start([build_c("idle.c"), "1"], allocator="jemalloc") as t:
        yield settled(t)


def scan_counts(columns, pid):
    scanner = hostscan.HostScanner(columns=columns)
    result = scanner.scan([pid])
    return dict(scanner.reads), result.rows


def test_memory_columns_read_status_alone(idle):
    reads, rows = scan_counts(("comm", "rss", "rss_anon", "threads", "user"), idle.pid)
    assert reads == {"status": 1}
    assert set(rows[0]) == {"pid", "comm", "rss", "rss_anon", "threads", "user"}
    assert rows[0]["rss"] > 0 and rows[0]["threads"] == 1


def test_each_column_adds_only_its_files(idle):
    reads, rows = scan_counts(("cpu_percent",), idle.pid)
    assert reads == {"stat": 1, "status": 1} and rows[0]["cpu_percent"] is not None
    reads, rows = scan_counts(("lazyfree",), idle.pid)
    assert reads == {"status": 1, "smaps_rollup": 1} and rows[0]["lazyfree"] is not None
    reads, rows = scan_counts(("exe",), idle.pid)
    assert reads == {"status": 1, "exe": 1} and rows[0]["exe"].endswith(
        os.path.basename(build_c("idle.c")))
    reads, rows = scan_counts(("allocator",), idle.pid)
    assert set(reads) == {"status"} | IMAGE_FILES and not {"stat", "smaps_rollup"} & set(reads)
    assert rows[0]["allocator"]["kind"] == "jemalloc"


def test_ps_columns_read_each_file_once(idle):
    reads, rows = scan_counts(hostscan.PS_COLUMNS, idle.pid)
    assert reads == {name: 1 for name in {"stat", "status", "smaps_rollup"} | IMAGE_FILES}
    assert set(rows[0]) - {"_start", "_create"} == {"pid", *hostscan.PS_COLUMNS}


def test_unknown_column_is_refused():
    with pytest.raises(ValueError, match="nosuch"):
        hostscan.HostScanner(columns=("rss", "nosuch"))


def kernel_thread():
    return kernel_thread_pid() or pytest.skip("no kernel thread visible (a PID namespace)")


def test_kernel_thread_is_skipped_on_stat_alone():
    # its stat flags say PF_KTHREAD: nothing else is read
    scanner = hostscan.HostScanner()
    assert scanner.scan([kernel_thread()]).rows == []
    assert dict(scanner.reads) == {"stat": 1}


def test_incremental_rereads_only_processes_whose_stat_changed(idle):
    scanner = hostscan.HostScanner(columns=hostscan.HOST_VIEW_COLUMNS, incremental=True)
    with start(python_argv(BUSY)) as busy:
        first = scanner.scan([idle.pid, busy.pid])
        assert {r["pid"] for r in first.rows} == {idle.pid, busy.pid}
        assert (scanner.rows_read, scanner.rows_kept, scanner.reads["maps"]) == (2, 0, 2)
        time.sleep(0.3)                 # the busy one runs: its utime moves
        second = scanner.scan([idle.pid, busy.pid])
        assert (scanner.rows_read, scanner.rows_kept, scanner.reads["maps"]) == (3, 1, 3)
        kept = {r["pid"]: r for r in second.rows}[idle.pid]
        assert kept == {r["pid"]: r for r in first.rows}[idle.pid]
        # a new process appears (read), the idle one is kept again
        with start([build_c("idle.c"), "1"]) as new:
            settled(new)
            time.sleep(0.3)
            third = scanner.scan([idle.pid, busy.pid, new.pid])
            assert {r["pid"] for r in third.rows} == {idle.pid, busy.pid, new.pid}
            assert (scanner.rows_read, scanner.rows_kept) == (5, 2)
            new_pid = new.pid
        # a killed (and reaped) process disappears, and is forgotten
        fourth = scanner.scan([idle.pid, busy.pid, new_pid])
        assert {r["pid"] for r in fourth.rows} == {idle.pid, busy.pid}
        assert fourth.vanished == 1
        assert new_pid not in scanner._kept
    # the rows handed out are copies: annotating one (diag.hostlive) leaves the kept row
    kept["top_finding"] = "annotated"
    assert scanner.scan([idle.pid]).rows[0].get("top_finding") != "annotated"


def test_incremental_rereads_a_process_that_mapped_memory():
    # The target maps and touches 64 MiB on SIGUSR1: no CPU-time tick needed,
    # its stat's vsize, rss and minflt move, so the row is read again.
    # (os.write, not print: the signal may land while the main thread is
    # still inside print('READY') and a buffered write is not reentrant)
    code = ("import mmap, os, signal, sys\n"
            "held = []\n"
            "def grow(*_):\n"
            "    m = mmap.mmap(-1, 64 << 20); m.write(b'x' * (64 << 20)); held.append(m)\n"
            "    os.write(1, b'GREW\\n')\n"
            "signal.signal(signal.SIGUSR1, grow)\n"
            "print('READY', flush=True)\n"
            "sys.stdin.read()\n")
    scanner = hostscan.HostScanner(columns=hostscan.HOST_VIEW_COLUMNS, incremental=True)
    with start(python_argv(code)) as t:
        before = scanner.scan([t.pid]).rows[0]["rss"]
        os.kill(t.pid, signal.SIGUSR1)
        assert t.proc.stdout.readline().strip() == b"GREW"
        after = scanner.scan([t.pid]).rows[0]["rss"]
    assert scanner.rows_read == 2 and after >= before + (60 << 20)


def test_recycled_pid_is_read_afresh(idle):
    # the same pid with another start time is another process: its kept row
    # must not be reused (the start time is one of the activity fields)
    scanner = hostscan.HostScanner(columns=("comm",), incremental=True)
    scanner.scan([idle.pid])
    prev = scanner._kept[idle.pid]
    forged = list(prev.activity)
    forged[1 + ACTIVITY_FIELDS.index(STAT_STARTTIME_AFTER_COMM)] = b"1"   # [0]: comm
    scanner._kept[idle.pid] = prev._replace(activity=tuple(forged))
    scanner.scan([idle.pid])
    assert scanner.rows_read == 2 and scanner.rows_kept == 0


def test_kept_rows_expire(idle):
    # a row is kept at most max_keep_s, even when stat never moves
    scanner = hostscan.HostScanner(columns=("comm", "lazyfree"), incremental=True,
                                   max_keep_s=0.0)
    for _ in range(3):
        scanner.scan([idle.pid])
    assert scanner.rows_read == 3 and scanner.rows_kept == 0


def test_host_source_refreshes_incrementally(idle):
    source = HostSource(pids=[idle.pid])
    rows = [source.scan().rows for _ in range(3)]
    assert source.scanner.rows_read == 1 and source.scanner.rows_kept == 2
    assert rows[0] == rows[2]
    assert rows[0][0]["allocator"]["kind"] == "jemalloc"
    assert "_start" in rows[0][0]            # diag.hostlive keys its cache by it


def test_json_has_no_scanner_keys(idle):
    doc = hostscan.scan(pids=[idle.pid]).to_json()
    assert doc["total"] == 1
    assert not [k for k in doc["processes"][0] if k.startswith("_")]


def test_forked_workers_match_serial(monkeypatch, idle):
    monkeypatch.setattr(hostscan, "PARALLEL_MIN", 1)
    with start([build_c("idle.c"), "1"], allocator="tcmalloc") as other:
        pids = sorted([idle.pid, other.pid, os.getpid()])
        serial = hostscan.scan(pids=pids, columns=("comm", "allocator"))
        parallel = hostscan.scan(pids=pids, workers=2, columns=("comm", "allocator"))
    assert parallel.rows == serial.rows and len(serial.rows) == 3


def test_shares_are_balanced_by_processes_and_keep_an_executable_together():
    """Workers get about as many processes each, whatever the objects the
    processes map (with the detection cache they cost little next to the
    process), and planning reads no maps: one exe link a process.  Six
    copies of a small C program and three Pythons (each mapping several
    times the objects): the old plan, an object weighed as ten processes,
    gave the Pythons a share of their own, 3 against 6."""
    with contextlib.ExitStack() as stack:
        c = [stack.enter_context(start([build_c("idle.c"), "1"])) for _ in range(6)]
        py = [stack.enter_context(start(python_argv("import sys; print('READY', flush=True); "
                                                    "sys.stdin.read()"))) for _ in range(3)]
        scanner = hostscan.HostScanner(columns=hostscan.PS_COLUMNS)
        shares = hostscan._shares(scanner, [t.pid for t in c + py], workers=2)
    assert sorted(map(len, shares)) == [4, 5]
    assert sum(scanner.reads.values()) == 0
    assert any({t.pid for t in py} <= set(share) for share in shares)


def test_failed_worker_share_is_scanned_by_the_caller(monkeypatch, idle):
    # a worker that dies (here: its scan raises) loses nothing: the caller
    # scans its share
    monkeypatch.setattr(hostscan, "PARALLEL_MIN", 1)
    parent = os.getpid()
    real = hostscan.HostScanner.scan

    def scan_dies_in_child(self, pids=None):
        if os.getpid() != parent:
            raise RuntimeError("worker dies")
        return real(self, pids)

    monkeypatch.setattr(hostscan.HostScanner, "scan", scan_dies_in_child)
    pids = sorted([idle.pid, os.getpid()])
    result = hostscan.scan(pids=pids, workers=2, columns=("comm",))
    assert [r["pid"] for r in result.rows] == pids


def test_ps_json_over_a_real_host_is_whole():
    # the CLI end to end (forked workers when the host has enough processes)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-m", "diag", "ps", "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert '"_' not in r.stdout and "Traceback" not in r.stderr
    # one process a line (compact: json's C encoder), the rest indented
    doc = json.loads(r.stdout)
    rows = [line for line in r.stdout.splitlines() if line.startswith('    {"pid": ')]
    assert [json.loads(line.rstrip(",")) for line in rows] == doc["processes"]
    assert len(doc["processes"]) == doc["total"] > 0
    assert '\n  "total": ' in r.stdout


def test_json_one_item_a_line_is_the_same_document():
    from diag.commands.common import dump_json
    doc = {"processes": [{"pid": 1, "a": {"b": [1, None]}}, {"pid": 2, "c": "d\n"}], "total": 2,
           "failed": [], "nested": {"x": [1, 2]}}
    out = io.StringIO()
    dump_json(doc, out, one_per_line=("processes", "failed"))
    assert json.loads(out.getvalue()) == doc
    assert out.getvalue().splitlines()[2:4] == ['    {"pid": 1, "a": {"b": [1, null]}},',
                                                '    {"pid": 2, "c": "d\\n"}']


def test_captured_tree_without_stat_scans(tmp_path, idle):
    # a procfs tree captured from a real process, stat left out (older
    # captures have none): the row is read, CPU% is unknown, no traceback
    tree = tmp_path / "proc" / str(idle.pid)
    tree.mkdir(parents=True)
    for name in ("status", "smaps_rollup", "maps", "environ", "auxv"):
        with open(f"/proc/{idle.pid}/{name}", "rb") as f:
            (tree / name).write_bytes(f.read())
    columns = ("comm", "user", "cpu_percent", "rss", "lazyfree")
    rows = hostscan.scan(str(tmp_path / "proc"), columns=columns).rows
    assert [r["pid"] for r in rows] == [idle.pid]
    assert rows[0]["cpu_percent"] is None and rows[0]["user"] is None
    assert rows[0]["rss"] > 0 and rows[0]["lazyfree"] is not None
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-m", "diag", "--proc", str(tmp_path / "proc"), "ps"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def test_denied_process_is_not_tried_again_while_idle(idle):
    # as nobody, a root-owned target's maps cannot be read: the refresh
    # counts it unreadable again without trying while its stat is unchanged
    code = ("import json, sys\n"
            "from diag import hostscan\n"
            "s = hostscan.HostScanner(columns=hostscan.HOST_VIEW_COLUMNS, incremental=True)\n"
            "out = []\n"
            "for _ in range(3):\n"
            "    r = s.scan([int(sys.argv[1])])\n"
            "    out.append([r.denied, len(r.rows), s.reads['maps']])\n"
            "print(json.dumps(out))\n")
    r = unpriv.run(["-c", code, str(idle.pid)])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [[1, 0, 1], [1, 0, 1], [1, 0, 1]]
